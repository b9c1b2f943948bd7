//! One thread reads every bridge's stdout and stderr. Agents stream updates many times a second,
//! and a reader thread per pipe cost each bridge a wake-up per line (or per pause) and two thread
//! stacks. Here one `poll(2)` wakes for every ready pipe at once; while agents stream handled
//! updates, the thread pauses between rounds, so one wake-up reads several lines of every
//! streaming bridge.
//!
//! Per bridge, stdout lines become [`Incoming`] messages on the run's bounded channel, except the
//! notifications its handler takes on the spot. A full channel stops reads of that stdout until
//! there is room again, so a flooding bridge blocks on its own pipe (back-pressure), never the
//! others. stderr lines are offered to the same channel and dropped when it is full: a bridge
//! that logs faster than we keep up loses stderr lines, not time.
//!
//! The reader is the lower layer of a bridge's connection: it defines what it hands on
//! ([`Incoming`], lines parsed by [`parse_line`]) and what it calls ([`Handler`]), and knows
//! nothing of the protocol above it. The ACP client registers a bridge ([`register`]) and plugs
//! its handler in.
//!
//! **Architecture Invariant:** the reader thread never blocks on a run: it only `try_send`s, and
//! a handler only takes short locks.

use std::borrow::Cow;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{ChildStderr, ChildStdout};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError, unbounded};
use serde_json::Value;

/// The bridge reader only parses lines, but a hostile line nests JSON up to serde_json's limit
/// (128 levels), which overflowed a former 128 KiB stack (`tests/hostile_input.rs`, issue 7).
/// Only the pages a thread touches are committed. Crate-visible so
/// the fuzz entry points (`crate::fuzzing`) parse on a stack of the same size.
pub(crate) const READER_STACK: usize = 1024 * 1024;

/// Longest line accepted from a bridge; longer ones are dropped as garbage.
pub(crate) const MAX_LINE: usize = 16 << 20;

/// What the reader hands a run on its channel.
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

/// Looks at each stdout line on the bridge reader thread before it is parsed as a message;
/// `true` when it handled the line there (it is then not passed on). Agents stream updates many
/// times a second: handling them where they are read spares a thread hop, a wake-up and a JSON
/// tree for each (the run plugs in a handler that finds updates with the ACP client's
/// `session_update`).
pub type Handler = Box<dyn FnMut(&str) -> bool + Send>;
/// How long the reader pauses between rounds while agents stream handled updates: the pipes
/// gather the next lines meanwhile. A request or response that arrives during a pause is seen
/// up to this much later.
pub(crate) const STREAM_GATHER: Duration = Duration::from_millis(100);

/// Bytes read from one pipe per round. A read that fills it means more is waiting, and the
/// next round comes without a pause.
const READ_CHUNK: usize = 64 * 1024;

/// How often a bridge whose channel is full is offered its message again.
const RETRY_FULL: libc::c_int = 10;

/// A bridge's pipes and where its lines go; handed to the reader thread by [`register`].
pub(super) struct Registration {
    pub stdout: ChildStdout,
    pub stderr: ChildStderr,
    pub handler: Option<Handler>,
    pub tx: Sender<Incoming>,
    /// Set when the connection is dropped: the reader closes the bridge's pipes at its next
    /// round (the connection wakes it).
    pub dropped: Arc<AtomicBool>,
}

struct Reader {
    registrations: Sender<Registration>,
    /// The write end of the pipe that wakes the reader's `poll`.
    wake: OwnedFd,
}

static READER: OnceLock<Result<Reader, String>> = OnceLock::new();

fn reader() -> std::io::Result<&'static Reader> {
    READER
        .get_or_init(|| start().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| std::io::Error::other(format!("cannot start the bridge reader: {e}")))
}

fn start() -> std::io::Result<Reader> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
    let (wake_rx, wake_tx) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let (tx, rx) = unbounded();
    std::thread::Builder::new()
        .name("bridge-reader".into())
        // Handlers parse lines, and a hostile line nests JSON up to serde_json's limit.
        .stack_size(READER_STACK)
        .spawn(move || read_all(&rx, &wake_rx))?;
    Ok(Reader {
        registrations: tx,
        wake: wake_tx,
    })
}

/// Hands a bridge's pipes to the reader thread (started by the first bridge).
pub(super) fn register(registration: Registration) -> std::io::Result<()> {
    let reader = reader()?;
    reader
        .registrations
        .send(registration)
        .map_err(|_| std::io::Error::other("the bridge reader has stopped"))?;
    wake();
    Ok(())
}

/// Wakes the reader thread (a bridge came or went).
pub(super) fn wake() {
    if let Some(Ok(reader)) = READER.get() {
        // A full wake pipe already wakes the reader: a failed write is fine.
        // SAFETY: writes one byte from a live buffer to a descriptor the reader owns.
        let _ = unsafe { libc::write(reader.wake.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }
}

/// Splits a byte stream into `\n`-terminated lines of at most `max` bytes; longer lines are
/// dropped whole. Pure, so the fuzz target (`crate::fuzzing::acp_reader`) drives it directly.
pub struct LineBuf {
    buf: Vec<u8>,
    /// Where the next line starts.
    start: usize,
    /// Bytes before this offset (from `start`) hold no newline.
    scanned: usize,
    /// Inside a line longer than `max`: bytes are dropped up to its newline.
    discarding: bool,
    /// The stream ended: an unterminated last line is a line.
    ended: bool,
    max: usize,
}

impl LineBuf {
    pub fn new(max: usize) -> LineBuf {
        LineBuf {
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            discarding: false,
            ended: false,
            max,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, mut data: &[u8]) {
        if self.discarding {
            match data.iter().position(|b| *b == b'\n') {
                Some(i) => {
                    self.discarding = false;
                    data = &data[i + 1..];
                }
                None => return,
            }
        }
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
        // Give back what one huge line made the buffer grow to.
        if self.buf.capacity() > 4 * READ_CHUNK && self.buf.len() + data.len() < READ_CHUNK {
            self.buf.shrink_to(READ_CHUNK);
        }
        self.buf.extend_from_slice(data);
    }

    /// Marks the end of the stream.
    pub fn end(&mut self) {
        self.ended = true;
    }

    /// The next complete line (without its newline), as a range of [`LineBuf::bytes`].
    pub fn next_line(&mut self) -> Option<Range<usize>> {
        loop {
            let from = self.scanned.max(self.start);
            match self.buf[from..].iter().position(|b| *b == b'\n') {
                Some(i) => {
                    let line = self.start..from + i;
                    self.start = from + i + 1;
                    self.scanned = self.start;
                    if line.len() > self.max {
                        continue;
                    }
                    return Some(line);
                }
                None => {
                    self.scanned = self.buf.len();
                    let partial = self.start..self.buf.len();
                    if partial.len() > self.max {
                        self.discarding = !self.ended;
                        self.buf.clear();
                        (self.start, self.scanned) = (0, 0);
                        return None;
                    }
                    if self.ended && !partial.is_empty() {
                        self.start = self.buf.len();
                        return Some(partial);
                    }
                    return None;
                }
            }
        }
    }

    pub fn bytes(&self, line: Range<usize>) -> &[u8] {
        &self.buf[line]
    }
}

/// The text of a line: UTF-8, with invalid bytes replaced (so they still reach the parser).
fn text(line: &[u8]) -> Cow<'_, str> {
    // The strict check is the fast one; lossy decoding only for a line that needs it.
    match std::str::from_utf8(line) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(line),
    }
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

/// When the reader may pause: only while what a bridge sends is a stream of updates handled on
/// the spot, arriving faster than the pause. A request or response (a permission question, the
/// end of a turn) ends the stream, and the round after it comes without a pause.
#[derive(Default)]
pub(super) struct Streaming {
    last_update: Option<Instant>,
    /// Updates handled in a row, each within two [`STREAM_GATHER`]s of the one before (a
    /// pause itself spaces them out by one).
    run: u32,
}

impl Streaming {
    pub(super) fn handled(&mut self, now: Instant) {
        let close = self
            .last_update
            .is_some_and(|t| now.duration_since(t) < 2 * STREAM_GATHER);
        self.run = if close { self.run.saturating_add(1) } else { 0 };
        self.last_update = Some(now);
    }

    pub(super) fn passed_on(&mut self) {
        self.run = 0;
        self.last_update = None;
    }

    pub(super) fn should_pause(&self) -> bool {
        self.run >= 3
    }
}

/// One pipe of a bridge.
struct Pipe<T> {
    /// `None` once it ended.
    file: Option<T>,
    lines: LineBuf,
}

impl<T: AsRawFd> Pipe<T> {
    fn new(file: T) -> Pipe<T> {
        // Reads must never block the thread that reads every bridge.
        // SAFETY: fcntl on a descriptor this pipe owns.
        unsafe {
            let fd = file.as_raw_fd();
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        Pipe {
            file: Some(file),
            lines: LineBuf::new(MAX_LINE),
        }
    }

    fn fd(&self) -> Option<RawFd> {
        self.file.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// One read into the line buffer; `true` when it filled `scratch` (more is waiting).
    fn read(&mut self, scratch: &mut [u8]) -> bool {
        let Some(fd) = self.fd() else { return false };
        // SAFETY: reads into a live buffer of `scratch.len()` bytes.
        let n = unsafe { libc::read(fd, scratch.as_mut_ptr().cast(), scratch.len()) };
        if n > 0 {
            self.lines.push(&scratch[..n as usize]);
            return n as usize == scratch.len();
        }
        let interrupted = n < 0
            && matches!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EAGAIN | libc::EINTR)
            );
        if !interrupted {
            // End of file, or an error that ends this pipe.
            self.file = None;
            self.lines.end();
        }
        false
    }
}

/// What a round saw, to decide whether the next one may wait a pause.
#[derive(Default)]
struct Round {
    handled: bool,
    /// A line was passed on to a run, or a bridge that sent lines is not streaming.
    busy: bool,
}

struct Bridge {
    stdout: Pipe<ChildStdout>,
    stderr: Pipe<ChildStderr>,
    handler: Option<Handler>,
    tx: Sender<Incoming>,
    /// A message waiting for room in the run's channel; stdout is not read meanwhile.
    pending: Option<Incoming>,
    /// `Incoming::Closed` was queued (stdout ended).
    closed: bool,
    /// The run's end of the channel is gone.
    gone: bool,
    dropped: Arc<AtomicBool>,
    streaming: Streaming,
}

impl Bridge {
    fn new(r: Registration) -> Bridge {
        Bridge {
            stdout: Pipe::new(r.stdout),
            stderr: Pipe::new(r.stderr),
            handler: r.handler,
            tx: r.tx,
            pending: None,
            closed: false,
            gone: false,
            dropped: r.dropped,
            streaming: Streaming::default(),
        }
    }

    fn finished(&self) -> bool {
        self.gone
            || self.dropped.load(Ordering::Acquire)
            || (self.closed && self.pending.is_none() && self.stderr.file.is_none())
    }

    /// Whether stdout is to be polled: only when every line read so far was taken.
    fn wants_stdout(&self) -> Option<RawFd> {
        if self.pending.is_some() {
            return None;
        }
        self.stdout.fd()
    }

    /// Delivers the waiting message, then handles buffered stdout lines until one waits for room.
    fn drain(&mut self, round: &mut Round) {
        loop {
            if let Some(msg) = self.pending.take() {
                match self.tx.try_send(msg) {
                    Ok(()) => {}
                    Err(TrySendError::Full(msg)) => {
                        self.pending = Some(msg);
                        return;
                    }
                    Err(TrySendError::Disconnected(_)) => {
                        self.gone = true;
                        return;
                    }
                }
            }
            match self.stdout.lines.next_line() {
                Some(line) => self.on_stdout(line, round),
                None if self.stdout.file.is_none() && !self.closed => {
                    self.closed = true;
                    self.pending = Some(Incoming::Closed);
                }
                None => return,
            }
        }
    }

    fn on_stdout(&mut self, line: Range<usize>, round: &mut Round) {
        let line = text(self.stdout.lines.bytes(line));
        if let Some(handle) = self.handler.as_mut() {
            let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(&line)));
            match handled {
                Ok(true) => {
                    self.streaming.handled(Instant::now());
                    round.handled = true;
                    return;
                }
                Ok(false) => {}
                Err(_) => {
                    log::error!("handling an agent notification panicked; it was dropped");
                    return;
                }
            }
        }
        let Some(msg) = parse_line(&line) else {
            return;
        };
        self.streaming.passed_on();
        round.busy = true;
        self.pending = Some(msg);
    }

    fn drain_stderr(&mut self) {
        while let Some(line) = self.stderr.lines.next_line() {
            let line = text(self.stderr.lines.bytes(line));
            match self.tx.try_send(Incoming::Stderr(
                line.trim_end().chars().take(2000).collect(),
            )) {
                Ok(()) | Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => self.gone = true,
            }
        }
    }
}

/// The reader thread: rounds of `poll` over every bridge's pipes until the process exits.
fn read_all(registrations: &Receiver<Registration>, wake: &OwnedFd) {
    let mut bridges: Vec<Bridge> = Vec::new();
    let mut scratch = vec![0u8; READ_CHUNK];
    let mut fds: Vec<libc::pollfd> = Vec::new();
    // Per polled descriptor after the wake pipe: its bridge, and whether it is stdout.
    let mut polled: Vec<(usize, bool)> = Vec::new();
    let mut pause = false;
    loop {
        if pause {
            std::thread::sleep(STREAM_GATHER);
        }
        bridges.extend(registrations.try_iter().map(Bridge::new));
        let mut round = Round::default();
        for b in &mut bridges {
            b.drain(&mut round);
        }
        bridges.retain(|b| !b.finished());
        fds.clear();
        polled.clear();
        let pollfd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        fds.push(pollfd(wake.as_raw_fd()));
        let mut blocked = false;
        for (i, b) in bridges.iter().enumerate() {
            blocked |= b.pending.is_some();
            if let Some(fd) = b.wants_stdout() {
                fds.push(pollfd(fd));
                polled.push((i, true));
            }
            if let Some(fd) = b.stderr.fd() {
                fds.push(pollfd(fd));
                polled.push((i, false));
            }
        }
        let timeout = if blocked { RETRY_FULL } else { -1 };
        // SAFETY: `fds` is a live array of `fds.len()` pollfd records.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            pause = false;
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                std::thread::sleep(Duration::from_millis(RETRY_FULL as u64));
            }
            continue;
        }
        if fds[0].revents != 0 {
            let mut sink = [0u8; 64];
            // SAFETY: reads into a live 64-byte buffer from the wake pipe this thread owns.
            while unsafe { libc::read(wake.as_raw_fd(), sink.as_mut_ptr().cast(), sink.len()) } > 0
            {
            }
        }
        let mut more = false;
        for (pfd, &(i, is_stdout)) in fds[1..].iter().zip(&polled) {
            if pfd.revents == 0 {
                continue;
            }
            let b = &mut bridges[i];
            if is_stdout {
                more |= b.stdout.read(&mut scratch);
                let mut this = Round::default();
                b.drain(&mut this);
                round.handled |= this.handled;
                round.busy |= this.busy || (this.handled && !b.streaming.should_pause());
            } else {
                more |= b.stderr.read(&mut scratch);
                b.drain_stderr();
            }
        }
        pause = round.handled && !round.busy && !more;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(buf: &mut LineBuf) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(l) = buf.next_line() {
            out.push(String::from_utf8_lossy(buf.bytes(l)).into_owned());
        }
        out
    }

    #[test]
    fn lines_are_split_across_reads_and_oversized_ones_dropped() {
        let mut b = LineBuf::new(8);
        b.push(b"one\ntw");
        assert_eq!(lines(&mut b), ["one"]);
        b.push(b"o\n123456789");
        assert_eq!(lines(&mut b), ["two"], "the long partial line is dropped");
        b.push(b"abc\nthree\n");
        assert_eq!(lines(&mut b), ["three"], "up to its newline");
        b.push(b"123456789\nfour\nfive");
        assert_eq!(lines(&mut b), ["four"]);
        b.end();
        assert_eq!(
            lines(&mut b),
            ["five"],
            "the unterminated last line counts at the end"
        );
        assert!(b.next_line().is_none());
    }

    #[test]
    fn the_reader_pauses_only_inside_a_fast_stream_of_handled_updates() {
        let now = Instant::now();
        let mut s = Streaming::default();
        assert!(!s.should_pause());
        for _ in 0..3 {
            s.handled(now);
            assert!(!s.should_pause(), "not before a run of updates");
        }
        s.handled(now);
        assert!(s.should_pause());
        // A request or response ends the stream: the next read is at once.
        s.passed_on();
        assert!(!s.should_pause());
        // Updates far apart never make a stream.
        let mut slow = Streaming::default();
        for n in 0..5 {
            slow.handled(now + n * (2 * STREAM_GATHER + Duration::from_millis(1)));
        }
        assert!(!slow.should_pause());
    }
}
