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

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
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
}

impl TraceSink {
    /// A sink that discards everything.
    pub fn disabled() -> TraceSink {
        TraceSink {
            tx: None,
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Queues one line for `issue_id`; never blocks.
    pub fn record(&self, issue_id: &str, line: &serde_json::Value) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send((issue_id.to_string(), line.to_string())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Starts the writer thread for `dir`. It ends when every sink is dropped.
pub fn start(dir: PathBuf) -> (TraceSink, JoinHandle<()>) {
    let (tx, rx) = bounded(QUEUE);
    let handle = std::thread::Builder::new()
        .name("trace-writer".into())
        .spawn(move || writer(dir, rx))
        .expect("spawning the trace writer");
    (
        TraceSink {
            tx: Some(tx),
            dropped: Arc::new(AtomicU64::new(0)),
        },
        handle,
    )
}

fn writer(dir: PathBuf, rx: Receiver<(String, String)>) {
    let mut files: HashMap<String, File> = HashMap::new();
    let mut failed_once = false;
    for (issue_id, line) in rx {
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
                .and_then(|()| OpenOptions::new().create(true).append(true).open(&path));
            match opened {
                Ok(f) => {
                    files.insert(issue_id.clone(), f);
                }
                Err(e) => {
                    if !failed_once {
                        log::warn!(
                            "trace: cannot open {}: {e}; traces are not written until it can be",
                            path.display()
                        );
                        failed_once = true;
                    }
                    continue;
                }
            }
        }
        let file = files.get_mut(&issue_id).expect("inserted above");
        // One write call per line: O_APPEND keeps concurrent appenders from interleaving.
        let mut buf = line.into_bytes();
        buf.push(b'\n');
        if let Err(e) = file.write_all(&buf) {
            log::warn!("trace: write for {issue_id} failed: {e}");
            files.remove(&issue_id);
        }
    }
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
    fn lines_are_appended_per_issue() {
        let dir = std::env::temp_dir().join(format!("svc-trace-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (sink, handle) = start(dir.clone());
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
