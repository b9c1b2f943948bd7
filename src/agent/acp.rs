//! The ACP client side of one bridge process: JSON-RPC 2.0, one compact JSON object per line on
//! the bridge's stdio. Reader threads turn stdout and stderr lines into [`Incoming`] messages on
//! a bounded channel (back-pressure on a flooding bridge); the run thread writes requests,
//! notifications and responses.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::process::ChildStdin;
use std::time::Duration;

use crossbeam_channel::{Receiver, bounded};
use serde_json::{Value, json};

use crate::process::{self, Piped};

/// Reader threads only parse lines, but a hostile line nests JSON up to serde_json's limit (128
/// levels), which overflowed the former 128 KiB (`tests/hostile_input.rs`, issue 7). Only
/// the pages a thread touches are committed, so hundreds of runs stay cheap. Crate-visible so
/// the fuzz entry points (`crate::fuzzing`) parse on a stack of the same size.
pub(crate) const READER_STACK: usize = 1024 * 1024;

/// Longest line accepted from a bridge; longer ones are dropped as garbage.
pub(crate) const MAX_LINE: usize = 16 << 20;

#[derive(Debug)]
pub enum Incoming {
    /// A parsed JSON-RPC message (request, notification or response).
    Message(Value),
    /// A stdout line that is not JSON.
    Garbage(String),
    Stderr(String),
    /// stdout closed: the bridge exited or closed its end.
    Closed,
}

/// Handles a notification on the stdout reader thread as it arrives; `true` when it was
/// handled there (it is then not passed on). Agents stream updates many times a second: handling
/// them where they are read spares a thread hop and a wake-up for each.
pub type Handler = Box<dyn FnMut(&Value) -> bool + Send>;

/// How long the stdout reader pauses between reads while an agent streams updates.
const STREAM_GATHER: Duration = Duration::from_millis(200);

/// When the stdout reader may pause: only while what it reads is a stream of updates handled
/// on the spot, arriving faster than the pause. A request or response (a permission question,
/// the end of a turn) is passed on at once, and the reader does not pause before the next read.
#[derive(Default)]
struct Streaming {
    last_update: Option<std::time::Instant>,
    /// Updates handled in a row, each within two [`STREAM_GATHER`]s of the one before (a
    /// pause itself spaces them out by one).
    run: u32,
}

impl Streaming {
    fn handled(&mut self) {
        let now = std::time::Instant::now();
        let close = self
            .last_update
            .is_some_and(|t| now.duration_since(t) < 2 * STREAM_GATHER);
        self.run = if close { self.run.saturating_add(1) } else { 0 };
        self.last_update = Some(now);
    }

    fn passed_on(&mut self) {
        self.run = 0;
        self.last_update = None;
    }

    fn should_pause(&self) -> bool {
        self.run >= 3
    }
}

/// A running bridge.
pub struct Connection {
    proc: Piped,
    stdin: Option<ChildStdin>,
    pub incoming: Receiver<Incoming>,
    next_id: u64,
}

impl Connection {
    pub fn spawn(spec: &process::Spec, mut handler: Option<Handler>) -> io::Result<Connection> {
        let mut proc = process::spawn_piped(spec)?;
        let stdin = proc.child.stdin.take();
        let stdout = proc
            .child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("no stdout"))?;
        let stderr = proc
            .child
            .stderr
            .take()
            .ok_or_else(|| io::Error::other("no stderr"))?;
        // Small: a bounded channel preallocates its slots, and there is one per run (agent
        // updates are handled on the reader and never pass through it).
        let (tx, rx) = bounded(16);
        let out_tx = tx.clone();
        std::thread::Builder::new()
            .name("acp-stdout".into())
            .stack_size(READER_STACK)
            .spawn(move || {
                let mut reader = BufReader::new(stdout);
                // While an agent streams, reading each line as it comes costs a wake-up per
                // line; pausing briefly once the buffered lines are handled lets the pipe gather
                // the next ones for one read (see [`STREAM_GATHER`]).
                let mut streaming = Streaming::default();
                loop {
                    if reader.buffer().is_empty() && streaming.should_pause() {
                        std::thread::sleep(STREAM_GATHER);
                    }
                    match read_line(&mut reader) {
                        Ok(Some(line)) => {
                            let Some(msg) = parse_line(&line) else {
                                continue;
                            };
                            if let (Incoming::Message(m), Some(handle)) = (&msg, handler.as_mut())
                                && m.get("id").is_none()
                                && handle(m)
                            {
                                streaming.handled();
                                continue;
                            }
                            streaming.passed_on();
                            if out_tx.send(msg).is_err() {
                                return;
                            }
                        }
                        Ok(None) | Err(_) => {
                            let _ = out_tx.send(Incoming::Closed);
                            return;
                        }
                    }
                }
            })?;
        std::thread::Builder::new()
            .name("acp-stderr".into())
            .stack_size(READER_STACK)
            .spawn(move || {
                // Log lines are short; a small buffer keeps this thread cheap per run.
                let mut reader = BufReader::with_capacity(1024, stderr);
                while let Ok(Some(line)) = read_line(&mut reader) {
                    // A bridge that logs more than we can keep up with loses stderr lines, not time.
                    let _ = tx.try_send(Incoming::Stderr(
                        line.trim_end().chars().take(2000).collect(),
                    ));
                }
            })?;
        Ok(Connection {
            proc,
            stdin,
            incoming: rx,
            next_id: 0,
        })
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    fn write(&mut self, msg: &Value) -> io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "stdin closed"))?;
        let mut line = serde_json::to_vec(msg)?;
        line.push(b'\n');
        stdin.write_all(&line)?;
        stdin.flush()
    }

    /// Sends a request; returns its id.
    pub fn request(&mut self, method: &str, params: Value) -> io::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        Ok(id)
    }

    pub fn notify(&mut self, method: &str, params: Value) -> io::Result<()> {
        self.write(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    pub fn respond(&mut self, id: &Value, result: Value) -> io::Result<()> {
        self.write(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
    }

    pub fn respond_error(&mut self, id: &Value, code: i64, message: &str) -> io::Result<()> {
        self.write(
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
        )
    }

    /// Closes stdin, gives the bridge `grace` to exit, then ends its whole process group.
    /// Returns a description of how it exited.
    pub fn shut_down(&mut self, grace: Duration) -> String {
        self.stdin = None;
        let status = self
            .proc
            .wait_for(grace)
            .or_else(|| self.proc.terminate(Duration::from_millis(2000)));
        describe(status)
    }

    /// Ends the process group now (SIGTERM, SIGKILL after a short grace).
    pub fn kill(&mut self) -> String {
        self.stdin = None;
        describe(self.proc.terminate(Duration::from_millis(2000)))
    }
}

fn describe(status: Option<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(sig)) => format!("signal {sig}"),
            _ => "unknown".into(),
        },
        None => "already reaped".into(),
    }
}

/// Reads one `\n`-terminated line of at most [`MAX_LINE`] bytes; longer lines are skipped.
fn read_line(reader: &mut impl BufRead) -> io::Result<Option<String>> {
    read_line_limited(reader, MAX_LINE)
}

/// [`read_line`] with the longest accepted line as a parameter: public so the fuzz target
/// (`crate::fuzzing::acp_reader`) can drive the real reader with a small limit.
pub fn read_line_limited(reader: &mut impl BufRead, max_line: usize) -> io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = reader
        .by_ref()
        .take(max_line as u64 + 1)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.len() > max_line && !buf.ends_with(b"\n") {
        // Drain the rest of the oversized line.
        let mut sink = Vec::new();
        loop {
            sink.clear();
            let m = reader
                .by_ref()
                .take(max_line as u64)
                .read_until(b'\n', &mut sink)?;
            if m == 0 || sink.ends_with(b"\n") {
                break;
            }
        }
        return Ok(Some(String::new()));
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// One stdout line as a message: `None` for a blank line, a JSON object as a message, anything
/// else as garbage (cut to 500 characters).
pub fn parse_line(line: &str) -> Option<Incoming> {
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return None;
    }
    Some(match serde_json::from_str::<Value>(trimmed) {
        Ok(v) if v.is_object() => Incoming::Message(v),
        _ => Incoming::Garbage(trimmed.chars().take(500).collect()),
    })
}

/// Whether a message is a request or notification (has a method), as opposed to a response.
/// Ids of the two directions overlap, so routing is by `method`, never by id.
pub fn is_call(msg: &Value) -> bool {
    msg.get("method").is_some_and(Value::is_string)
}

#[cfg(test)]
mod tests {
    use super::Streaming;

    #[test]
    fn the_reader_pauses_only_inside_a_fast_stream_of_handled_updates() {
        let mut s = Streaming::default();
        assert!(!s.should_pause());
        for _ in 0..3 {
            s.handled();
            assert!(!s.should_pause(), "not before a run of updates");
        }
        s.handled();
        assert!(s.should_pause());
        // A request or response ends the stream: the next read is at once.
        s.passed_on();
        assert!(!s.should_pause());
        // Updates far apart never make a stream.
        let mut slow = Streaming::default();
        for _ in 0..5 {
            slow.handled();
            slow.last_update = slow
                .last_update
                .map(|t| t - 2 * super::STREAM_GATHER - std::time::Duration::from_millis(1));
        }
        assert!(!slow.should_pause());
    }
}
