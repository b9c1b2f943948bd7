//! Traces and the issue store. Trace capture: every agent update of a run, appended as one JSON line to
//! `<trace_dir>/<percent-encoded issue id>/trace.jsonl` by one writer thread (so writes to a file
//! are serialized) fed through a bounded channel that never blocks a run.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, unbounded};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

pub mod display;
pub mod store;
pub mod watcher;

/// Lines waiting for the writer before new ones are dropped (and counted).
const QUEUE: usize = 16_384;
/// Trace files kept open at once.
const OPEN_FILES: usize = 64;

/// Everything but letters, digits, `-` and `_` is encoded, so an id can never name `.`, `..` or
/// a path with a separator.
const ID_SET: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_');

/// The directory name of an issue id under the trace dir.
pub fn encode_id(issue_id: &str) -> String {
    utf8_percent_encode(issue_id, ID_SET).to_string()
}

/// The trace file of an issue; `None` for an empty id.
pub fn trace_path(dir: &Path, issue_id: &str) -> Option<PathBuf> {
    (!issue_id.is_empty()).then(|| dir.join(encode_id(issue_id)).join("trace.jsonl"))
}

/// A cheap handle that run threads use to append trace lines.
#[derive(Clone)]
pub struct TraceSink {
    tx: Option<Sender<(String, String)>>,
    dropped: Arc<AtomicU64>,
    /// A workflow's name, in a daemon serving several: its issues' traces are kept under
    /// `<workflow>:<issue id>`, apart from another workflow's issue of the same id.
    workflow: Option<Arc<str>>,
}

impl TraceSink {
    /// A sink that discards everything.
    pub fn disabled() -> TraceSink {
        TraceSink {
            tx: None,
            dropped: Arc::new(AtomicU64::new(0)),
            workflow: None,
        }
    }

    /// This sink for workflow `name`'s runs, in a daemon serving several.
    pub fn within(&self, name: &Arc<str>) -> TraceSink {
        TraceSink {
            workflow: Some(Arc::clone(name)),
            ..self.clone()
        }
    }

    /// Queues one line for `issue_id`; never blocks.
    pub fn record(&self, issue_id: &str, line: &impl serde::Serialize) {
        let Some(tx) = &self.tx else { return };
        let line = serde_json::to_string(line).unwrap_or_default();
        // The queue is unbounded underneath and capped here: a bounded channel would allocate
        // (and touch) all of its slots up front, about 1 MiB that an idle daemon never uses.
        let id = match &self.workflow {
            Some(w) => format!("{w}:{issue_id}"),
            None => issue_id.to_string(),
        };
        if tx.len() >= QUEUE || tx.send((id, line)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Starts the writer thread for `dir`. It ends when every sink is dropped. `notify` hears of a
/// failure to write (once until writing works again), so operators see it beside the log.
pub fn start(
    dir: PathBuf,
    notify: impl Fn(String) + Send + 'static,
) -> (TraceSink, JoinHandle<()>) {
    let (tx, rx) = unbounded();
    let handle = std::thread::Builder::new()
        .name("trace-writer".into())
        .spawn(move || writer(dir, rx, notify))
        .expect("spawning the trace writer");
    (
        TraceSink {
            tx: Some(tx),
            dropped: Arc::new(AtomicU64::new(0)),
            workflow: None,
        },
        handle,
    )
}

/// How long the writer gathers lines after the first of a burst: agents stream updates many
/// times a second, and one wake-up and one write per file per batch cost far less than one per
/// line. Longer than the bridge reader's pause (`agent::pipes::STREAM_GATHER`), so a batch
/// holds a streaming agent's lines of more than one of its rounds. Well within the time views
/// allow (the watcher reads every 500 ms).
const GATHER: std::time::Duration = std::time::Duration::from_millis(150);

fn writer(dir: PathBuf, rx: Receiver<(String, String)>, notify: impl Fn(String)) {
    let mut files: HashMap<String, File> = HashMap::new();
    // Whether the last attempt failed: a failure is reported once, until a write succeeds.
    let mut failing = false;
    let fail = |failing: &mut bool, message: String| {
        if !*failing {
            log::warn!("{message}");
            notify(message);
            *failing = true;
        }
    };
    // Lines of one batch by file, in the order they came (order matters only within a file).
    let mut batch: HashMap<String, Vec<u8>> = HashMap::new();
    while let Ok(first) = rx.recv() {
        std::thread::sleep(GATHER);
        for (issue_id, line) in std::iter::once(first).chain(rx.try_iter()) {
            let buf = batch.entry(issue_id).or_default();
            buf.extend_from_slice(line.as_bytes());
            buf.push(b'\n');
        }
        for (issue_id, buf) in batch.drain() {
            if !files.contains_key(&issue_id) {
                if files.len() >= OPEN_FILES {
                    files.clear();
                }
                let Some(path) = trace_path(&dir, &issue_id) else {
                    continue;
                };
                let opened = path
                    .parent()
                    .map_or(Ok(()), fs::create_dir_all)
                    .and_then(|()| {
                        OpenOptions::new()
                            .read(true)
                            .create(true)
                            .append(true)
                            .open(&path)
                    })
                    .and_then(|f| repair_tail(&f, &path).map(|()| f));
                match opened {
                    Ok(f) => {
                        files.insert(issue_id.clone(), f);
                    }
                    Err(e) => {
                        fail(
                            &mut failing,
                            format!(
                                "cannot write trace file {}: {e}; trace lines are dropped until it can be written (check server.trace_dir)",
                                path.display()
                            ),
                        );
                        continue;
                    }
                }
            }
            let file = files.get_mut(&issue_id).expect("inserted above");
            // One write call per file and batch, of whole lines: O_APPEND keeps concurrent
            // appenders from interleaving.
            match file.write_all(&buf) {
                Ok(()) => failing = false,
                Err(e) => {
                    fail(
                        &mut failing,
                        format!(
                            "trace write for issue {issue_id} failed: {e}; trace lines are dropped until it can be written"
                        ),
                    );
                    files.remove(&issue_id);
                }
            }
        }
    }
}

/// Cuts a partial last line off a trace file: a daemon killed in the middle of a long write
/// can leave one, and the next line appended would be glued to it.
fn repair_tail(f: &File, path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = f.metadata()?.len();
    let mut end = len;
    let mut buf = [0u8; 8192];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        f.read_exact_at(chunk, start)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            end = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    if end < len {
        log::warn!(
            "trace {}: dropped a partial last line of {} bytes (an earlier daemon was killed mid-write)",
            path.display(),
            len - end
        );
        f.set_len(end)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_encoded_so_they_cannot_traverse() {
        assert_eq!(encode_id("abc-1_2"), "abc-1_2");
        assert_eq!(encode_id(".."), "%2E%2E");
        assert_eq!(encode_id("../etc"), "%2E%2E%2Fetc");
        assert_eq!(encode_id("C1:17.5"), "C1%3A17%2E5");
        let p = trace_path(Path::new("/t"), "a/b").unwrap();
        assert_eq!(p, Path::new("/t/a%2Fb/trace.jsonl"));
        assert!(trace_path(Path::new("/t"), "").is_none());
    }

    #[test]
    fn a_partial_last_line_is_cut_before_appending() {
        let dir = std::env::temp_dir().join(format!("svc-trace-tail-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let file = trace_path(&dir, "id-1").unwrap();
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        let partial = format!(
            "{{\"type\":\"a\"}}\n{{\"type\":\"b\", \"text\":\"{}",
            "x".repeat(20_000)
        );
        fs::write(&file, partial).unwrap();
        let (sink, handle) = start(dir.clone(), |_| {});
        sink.record("id-1", &serde_json::json!({"type": "c"}));
        drop(sink);
        handle.join().unwrap();
        let text = fs::read_to_string(&file).unwrap();
        assert_eq!(text, "{\"type\":\"a\"}\n{\"type\":\"c\"}\n");
        // A file that is only a partial line is emptied.
        fs::write(&file, "{\"type\":").unwrap();
        let (sink, handle) = start(dir.clone(), |_| {});
        sink.record("id-1", &serde_json::json!({"type": "d"}));
        drop(sink);
        handle.join().unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "{\"type\":\"d\"}\n");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn lines_are_appended_per_issue() {
        let dir = std::env::temp_dir().join(format!("svc-trace-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (sink, handle) = start(dir.clone(), |_| {});
        for n in 0..100 {
            sink.record(
                if n % 2 == 0 { "id-1" } else { "id/2" },
                &serde_json::json!({"type": "agent_message_chunk", "n": n}),
            );
        }
        drop(sink);
        handle.join().unwrap();
        let text = fs::read_to_string(dir.join("id-1/trace.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 50);
        assert_eq!(lines[49]["n"], 98);
        assert_eq!(
            fs::read_to_string(dir.join("id%2F2/trace.jsonl"))
                .unwrap()
                .lines()
                .count(),
            50
        );
        fs::remove_dir_all(dir).unwrap();
    }
}
