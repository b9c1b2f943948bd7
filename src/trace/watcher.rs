//! The trace watcher: one thread that polls the trace directory every 500 ms, reads each
//! `trace.jsonl` from where it left off (never the whole file again), parses new lines into the
//! shared timelines and reports which tickets changed from which index.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crossbeam_channel::Sender;
use serde_json::Value;

use super::display::Timeline;

pub const POLL: Duration = Duration::from_millis(500);
/// Bytes read from one file per poll; a huge backlog is read over several polls.
const READ_BUDGET: u64 = 8 << 20;

/// Every ticket's timeline, by issue id.
#[derive(Default)]
pub struct TraceIndex {
    pub tickets: HashMap<String, Timeline>,
}

pub type SharedIndex = Arc<RwLock<TraceIndex>>;

/// A ticket whose timeline changed, from `from_index` on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub issue_id: String,
    pub from_index: usize,
}

#[derive(Default)]
struct FileState {
    offset: u64,
    partial: Vec<u8>,
}

pub struct Watcher {
    dir: PathBuf,
    files: HashMap<String, FileState>,
    index: SharedIndex,
}

impl Watcher {
    pub fn new(dir: PathBuf, index: SharedIndex) -> Watcher {
        Watcher {
            dir,
            files: HashMap::new(),
            index,
        }
    }

    /// One pass over the directory.
    pub fn poll(&mut self) -> Vec<Change> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut changes = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(issue_id) = percent_encoding::percent_decode_str(name).decode_utf8() else {
                continue;
            };
            let issue_id = issue_id.into_owned();
            let path = entry.path().join("trace.jsonl");
            if let Some(from) = self.read_new(&issue_id, &path) {
                changes.push(Change {
                    issue_id,
                    from_index: from,
                });
            }
        }
        changes
    }

    /// Reads and applies what was appended to `path`; returns the first changed index.
    fn read_new(&mut self, issue_id: &str, path: &Path) -> Option<usize> {
        let len = std::fs::metadata(path).ok()?.len();
        let state = self.files.entry(issue_id.to_string()).or_default();
        if len < state.offset {
            // Truncated or replaced: start over.
            *state = FileState::default();
            self.index
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .tickets
                .remove(issue_id);
        }
        let state = self.files.get_mut(issue_id)?;
        if len == state.offset {
            return None;
        }
        let mut file = File::open(path).ok()?;
        file.seek(SeekFrom::Start(state.offset)).ok()?;
        let mut buf = Vec::new();
        let n = file.take(READ_BUDGET).read_to_end(&mut buf).ok()? as u64;
        state.offset += n;
        let mut data = std::mem::take(&mut state.partial);
        data.extend_from_slice(&buf);
        // Keep an unterminated last line for the next poll.
        let complete = match data.iter().rposition(|b| *b == b'\n') {
            Some(i) => i + 1,
            None => {
                state.partial = data;
                return None;
            }
        };
        state.partial = data[complete..].to_vec();
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        let timeline = index.tickets.entry(issue_id.to_string()).or_default();
        let mut first: Option<usize> = None;
        for line in data[..complete].split(|b| *b == b'\n') {
            if line.is_empty() {
                continue;
            }
            let Ok(value) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            if let Some(i) = timeline.apply(&value) {
                first = Some(first.map_or(i, |f| f.min(i)));
            }
        }
        first
    }
}

/// Starts the watcher thread; each poll's changes go to `changes` (when any).
pub fn start(dir: PathBuf, index: SharedIndex, changes: Sender<Vec<Change>>) {
    let _ = std::thread::Builder::new()
        .name("trace-watcher".into())
        .spawn(move || {
            let mut w = Watcher::new(dir, index);
            loop {
                let c = w.poll();
                if !c.is_empty() && changes.send(c).is_err() {
                    return;
                }
                std::thread::sleep(POLL);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_incrementally_keeps_partial_lines_and_restarts_on_truncation() {
        let dir = std::env::temp_dir().join(format!("svc-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("id%2F1")).unwrap();
        let path = dir.join("id%2F1/trace.jsonl");
        let index: SharedIndex = Arc::default();
        let mut w = Watcher::new(dir.clone(), Arc::clone(&index));
        assert!(w.poll().is_empty());
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        writeln!(f, r#"{{"type":"agent_message_chunk","at":"t","runId":"r","update":{{"content":{{"text":"a"}}}}}}"#).unwrap();
        write!(
            f,
            r#"{{"type":"agent_message_chunk","at":"t","runId":"r","upd"#
        )
        .unwrap();
        assert_eq!(
            w.poll(),
            vec![Change {
                issue_id: "id/1".into(),
                from_index: 0
            }]
        );
        writeln!(f, r#"ate":{{"content":{{"text":"b"}}}}}}"#).unwrap();
        writeln!(f, "not json").unwrap();
        writeln!(
            f,
            r#"{{"type":"hook","at":"t","hook":"before_run","ok":true}}"#
        )
        .unwrap();
        assert_eq!(
            w.poll(),
            vec![Change {
                issue_id: "id/1".into(),
                from_index: 0
            }]
        );
        {
            let idx = index.read().unwrap();
            let t = &idx.tickets["id/1"];
            assert_eq!(t.events.len(), 2);
            assert_eq!(t.events[0]["text"], "ab");
        }
        assert!(w.poll().is_empty(), "nothing new");
        std::fs::write(
            &path,
            "{\"type\":\"turn_failed\",\"at\":\"t\",\"error\":\"x\"}\n",
        )
        .unwrap();
        assert_eq!(
            w.poll(),
            vec![Change {
                issue_id: "id/1".into(),
                from_index: 0
            }]
        );
        assert_eq!(index.read().unwrap().tickets["id/1"].events.len(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
