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
/// Longest unterminated line kept between polls (a bridge line is at most 16 MiB before it is
/// dropped, and a trace line wraps one).
const MAX_PARTIAL: usize = 32 << 20;
/// Bytes read from one file per poll; a huge backlog is read over several polls.
const READ_BUDGET: u64 = 8 << 20;

/// Display events held in memory over all tickets; past this, the timelines that changed least
/// recently drop theirs (keeping their facts), so memory stays flat however long the daemon
/// runs. An evicted timeline is rebuilt from its file when it is subscribed to or changes.
pub const RESIDENT_EVENTS: usize = 10_000;
/// Overrides [`RESIDENT_EVENTS`] (a positive number): a smaller cache for hosts short of
/// memory, and for the memory-bound test, whose cache must fill during its warm-up.
pub const RESIDENT_EVENTS_VAR: &str = "SVC_TRACE_RESIDENT_EVENTS";
/// How much of a trace file's end is read to rebuild an evicted timeline, at most: less when
/// the resident budget is smaller, since a rebuild never needs more lines than the budget holds
/// (about [`LINE_BYTES`] each); else a small budget would make every rebuild parse megabytes
/// only to evict most of them again.
const REBUILD_BYTES: u64 = 4 << 20;
/// A trace line's size, generously, for sizing a rebuild's window to the resident budget.
const LINE_BYTES: u64 = 1024;

/// Every ticket's timeline, by issue id.
#[derive(Default)]
pub struct TraceIndex {
    pub tickets: HashMap<String, Timeline>,
    /// The trace directory (to rebuild evicted timelines).
    pub dir: PathBuf,
    clock: u64,
    /// How much of a file's end a rebuild reads (0: [`REBUILD_BYTES`]).
    window: u64,
}

impl TraceIndex {
    /// A ticket's display events, read again from its file if they were evicted.
    pub fn events_of(&self, issue_id: &str) -> Vec<Value> {
        match self.tickets.get(issue_id) {
            Some(t) if t.evicted => rebuild(&self.dir, issue_id, u64::MAX, self.window).events,
            Some(t) => t.events.clone(),
            None => Vec::new(),
        }
    }

    /// Evicts the least recently changed timelines until the resident events fit `budget`.
    pub fn evict_over(&mut self, budget: usize) {
        let mut resident: usize = self.tickets.values().map(|t| t.events.len()).sum();
        if resident <= budget {
            return;
        }
        let mut by_age: Vec<(u64, String)> = self
            .tickets
            .iter()
            .filter(|(_, t)| !t.events.is_empty())
            .map(|(id, t)| (t.touched, id.clone()))
            .collect();
        by_age.sort();
        for (_, id) in by_age {
            if resident <= budget {
                break;
            }
            if let Some(t) = self.tickets.get_mut(&id) {
                resident -= t.events.len();
                t.evict();
            }
        }
    }
}

/// A ticket's timeline built from the end of its trace file, up to byte `end`: at most
/// `window` bytes (0: [`REBUILD_BYTES`]), starting at a line boundary.
pub fn rebuild(dir: &Path, issue_id: &str, end: u64, window: u64) -> Timeline {
    let mut timeline = Timeline::default();
    let path = dir.join(super::encode_id(issue_id)).join("trace.jsonl");
    let Ok(mut file) = File::open(&path) else {
        return timeline;
    };
    let end = file.metadata().map_or(0, |m| m.len()).min(end);
    let window = if window == 0 { REBUILD_BYTES } else { window };
    let start = end.saturating_sub(window);
    let mut buf = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err()
        || file.take(end - start).read_to_end(&mut buf).is_err()
    {
        return timeline;
    }
    let mut data = &buf[..];
    if start > 0 {
        // Skip the partial line the window starts in.
        match data.iter().position(|b| *b == b'\n') {
            Some(i) => data = &data[i + 1..],
            None => return timeline,
        }
    }
    // Only whole lines: a line still being written is applied when it is complete.
    let whole = data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    apply_lines(&mut timeline, &data[..whole]);
    timeline
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
    /// The cap on resident display events ([`RESIDENT_EVENTS`] or its variable).
    resident: usize,
}

impl Watcher {
    pub fn new(dir: PathBuf, index: SharedIndex) -> Watcher {
        let resident = std::env::var(RESIDENT_EVENTS_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(RESIDENT_EVENTS);
        {
            let mut index = index.write().unwrap_or_else(|p| p.into_inner());
            index.dir = dir.clone();
            index.window = REBUILD_BYTES.min(resident as u64 * LINE_BYTES);
        }
        Watcher {
            dir,
            files: HashMap::new(),
            index,
            resident,
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
        if !changes.is_empty() {
            // Once per poll, not per file: it sums the resident events of every ticket.
            self.index
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .evict_over(self.resident);
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
        // Sized to what is new, so it is read in one call (not grown from small reads).
        let mut buf = Vec::with_capacity((len - state.offset).min(READ_BUDGET) as usize + 1);
        let n = file.take(READ_BUDGET).read_to_end(&mut buf).ok()? as u64;
        // Where the lines applied so far end (the partial line is not applied yet).
        let applied_end = state.offset - state.partial.len() as u64;
        state.offset += n;
        let data = complete_lines(&mut state.partial, &buf)?;
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        index.clock += 1;
        let clock = index.clock;
        let dir = index.dir.clone();
        let window = index.window;
        let timeline = index.tickets.entry(issue_id.to_string()).or_default();
        timeline.touched = clock;
        let restored = timeline.evicted;
        if restored {
            timeline.restore(rebuild(&dir, issue_id, applied_end, window));
        }
        let changed = apply_lines(timeline, &data);
        // A restored timeline changed as a whole.
        if restored { Some(0) } else { changed }
    }
}

/// Appends `chunk` to `partial` (the unterminated last line of earlier reads) and returns every
/// complete line, up to and including the last `\n`; the unterminated rest stays in `partial`
/// for the next poll. `None` while no line is complete. Pure, so the fuzz target
/// (`crate::fuzzing::trace_line`) drives it without files.
pub fn complete_lines(partial: &mut Vec<u8>, chunk: &[u8]) -> Option<Vec<u8>> {
    let mut data = std::mem::take(partial);
    data.extend_from_slice(chunk);
    let Some(last) = data.iter().rposition(|b| *b == b'\n') else {
        // A line longer than any the writer makes is not kept growing: its start is dropped
        // and the rest, when its newline comes, is skipped as a line that is not JSON.
        if data.len() <= MAX_PARTIAL {
            *partial = data;
        }
        return None;
    };
    *partial = data.split_off(last + 1);
    Some(data)
}

/// Applies each JSON line of `data` to `timeline` (blank and non-JSON lines are skipped);
/// returns the lowest event index that changed.
pub fn apply_lines(timeline: &mut Timeline, data: &[u8]) -> Option<usize> {
    let mut first: Option<usize> = None;
    for line in data.split(|b| *b == b'\n') {
        if line.is_empty() {
            continue;
        }
        if let Some(i) = timeline.apply_json(line) {
            first = Some(first.map_or(i, |f| f.min(i)));
        }
    }
    first
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
    use serde_json::json;

    #[test]
    fn an_endless_line_is_not_kept_growing() {
        let mut partial = Vec::new();
        assert!(complete_lines(&mut partial, &vec![b'x'; MAX_PARTIAL + 1]).is_none());
        assert!(partial.is_empty());
        let mut t = Timeline::default();
        let data = complete_lines(
            &mut partial,
            b"xxx\n{\"type\":\"turn_started\",\"turn\":1}\n",
        )
        .unwrap();
        assert_eq!(apply_lines(&mut t, &data), Some(0));
        assert_eq!(t.events.len(), 1);
    }

    #[test]
    fn evicted_timelines_are_rebuilt_from_their_files() {
        let dir = std::env::temp_dir().join(format!("svc-evict-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let line = |n: usize, kind: &str| {
            format!(
                "{}\n",
                json!({"type": kind, "at": "2026-11-01T00:00:00Z", "runId": "r", "identifier": "T",
                       "update": {"content": {"type": "text", "text": format!("m{n}")}}})
            )
        };
        let write = |id: &str, from: usize, to: usize| {
            std::fs::create_dir_all(dir.join(id)).unwrap();
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(id).join("trace.jsonl"))
                .unwrap();
            for n in from..to {
                let kind = if n % 2 == 0 {
                    "agent_message_chunk"
                } else {
                    "agent_thought_chunk"
                };
                f.write_all(line(n, kind).as_bytes()).unwrap();
            }
        };
        write("a", 0, 10);
        write("b", 0, 10);
        let index: SharedIndex = Arc::default();
        let mut w = Watcher::new(dir.clone(), Arc::clone(&index));
        w.poll();
        let before = index.read().unwrap().events_of("a");
        assert_eq!(before.len(), 10);
        // Over budget: the least recently changed timeline goes first.
        index.write().unwrap().tickets.get_mut("b").unwrap().touched = u64::MAX;
        index.write().unwrap().evict_over(15);
        {
            let i = index.read().unwrap();
            assert!(i.tickets["a"].evicted && i.tickets["a"].events.is_empty());
            assert!(!i.tickets["b"].evicted);
            assert_eq!(i.tickets["a"].facts.lines, 10, "facts stay");
            assert_eq!(i.events_of("a"), before, "rebuilt from the file");
        }
        // New lines restore the whole timeline, reported as changed from 0.
        write("a", 10, 12);
        let changes = w.poll();
        assert_eq!(
            changes,
            vec![Change {
                issue_id: "a".into(),
                from_index: 0
            }]
        );
        let i = index.read().unwrap();
        assert!(!i.tickets["a"].evicted);
        assert_eq!(i.tickets["a"].events.len(), 12);
        assert_eq!(i.tickets["a"].events[..10], before[..]);
        assert_eq!(i.tickets["a"].facts.lines, 12);
        drop(i);
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
