//! The ACP client side of one bridge process: JSON-RPC 2.0, one compact JSON object per line on
//! the bridge's stdio. The bridge reader (`super::pipes`, one thread for every bridge, the layer
//! below this one) turns stdout and stderr lines into [`Incoming`] messages on a bounded channel
//! (back-pressure on a flooding bridge); a connection registers its bridge's pipes there with the
//! run's [`Handler`]. The run thread writes requests, notifications and responses.

use std::borrow::Cow;
use std::io::{self, Write};
use std::process::ChildStdin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, bounded};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::pipes::{self, Handler, Incoming};
use crate::process::{self, Piped};

/// The update of a line that is a `session/update` notification (a `method` of that name and
/// no `id`), as JSON text borrowed from the line where it can be: `None` when the line is not
/// such a notification, `Some(None)` when it is one without `params.update`. The common shape
/// is read without building a JSON tree; anything else (duplicate keys, odd types) is parsed
/// whole with the same outcome.
pub fn session_update(line: &str) -> Option<Option<Cow<'_, RawValue>>> {
    /// Whether a field is present at all, `null` included.
    #[derive(Default)]
    struct Present(bool);
    impl<'de> Deserialize<'de> for Present {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
        }
    }
    #[derive(Deserialize)]
    struct Notification<'a> {
        #[serde(borrow)]
        method: Cow<'a, str>,
        #[serde(default)]
        id: Present,
        #[serde(borrow)]
        params: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(borrow)]
        update: Option<&'a RawValue>,
    }
    let trimmed = line.trim();
    if trimmed.starts_with('{')
        && let Ok(n) = serde_json::from_str::<Notification>(trimmed)
        // An object (serde would read a struct from an array too).
        && let Some(params) = n.params.filter(|p| p.get().starts_with('{'))
        && let Ok(Params {
            update: Some(update),
        }) = serde_json::from_str::<Params>(params.get())
    {
        return (n.method == "session/update" && !n.id.0).then_some(Some(Cow::Borrowed(update)));
    }
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(trimmed) else {
        return None;
    };
    if m.get("method").and_then(Value::as_str) != Some("session/update") || m.contains_key("id") {
        return None;
    }
    Some(
        m.get("params")
            .and_then(|p| p.get("update"))
            .and_then(|u| serde_json::value::to_raw_value(u).ok())
            .map(Cow::Owned),
    )
}

/// A running bridge.
pub struct Connection {
    proc: Piped,
    stdin: Option<ChildStdin>,
    pub incoming: Receiver<Incoming>,
    next_id: u64,
    /// Tells the bridge reader to close this bridge's pipes.
    dropped: Arc<AtomicBool>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Release);
        pipes::wake();
    }
}

impl Connection {
    pub fn spawn(spec: &process::Spec, handler: Option<Handler>) -> io::Result<Connection> {
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
        // updates are handled by the reader and never pass through it).
        let (tx, rx) = bounded(16);
        let dropped = Arc::new(AtomicBool::new(false));
        pipes::register(pipes::Registration {
            stdout,
            stderr,
            handler,
            tx,
            dropped: Arc::clone(&dropped),
        })?;
        Ok(Connection {
            proc,
            stdin,
            incoming: rx,
            next_id: 0,
            dropped,
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

/// Whether a message is a request or notification (has a method), as opposed to a response.
/// Ids of the two directions overlap, so routing is by `method`, never by id.
pub fn is_call(msg: &Value) -> bool {
    msg.get("method").is_some_and(Value::is_string)
}
