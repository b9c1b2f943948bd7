//! Trace lines (discriminated by `type`) to display events (discriminated by `kind`), the
//! timeline the trace viewer shows. Parsing is incremental: each line updates the timeline and
//! says from which index it changed, so the watcher can send only the changed tail.
//!
//! Display event kinds (fields are camelCase; every event has `kind` and `at`):
//!
//! | kind | fields | from |
//! |---|---|---|
//! | `message` | `text`, `runId` | consecutive `agent_message_chunk`s, coalesced |
//! | `thought` | `text`, `runId` | consecutive `agent_thought_chunk`s, coalesced |
//! | `user_message` | `text` | consecutive `user_message_chunk`s |
//! | `tool_call` | `toolCallId`, `title`, `toolKind`, `status`, `startedAt`, `endedAt`, `durationMs`, `error`, `locations` | `tool_call`, completed by its `tool_call_update`s |
//! | `plan` | `entries` | `plan` (a plan right after a plan replaces it) |
//! | `permission` | `title`, `decision` | `permission_request` |
//! | `turn_started` | `turn`, `runId` | `turn_started` |
//! | `turn_completed` | `turn`, `stopReason`, `usage`, `cost` | `turn_completed` |
//! | `turn_failed` | `turn`, `error` | `turn_failed` |
//! | `hook` | `hook`, `ok`, `error` | `hook` |
//! | `notice` | `text` | `max_turns_reached` |
//! | `event` | `type` | any other type |
//!
//! Dropped from the timeline: `rate_limit`, `session_started`, `process_exit`, `stderr`,
//! `fs_write`, `process_started`, `usage_update`, `available_commands_update`,
//! `current_mode_update`, `config_option_update`, `session_info_update`.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::{Map, Value, json};

use crate::time::parse_ms;

const DROPPED: &[&str] = &[
    "rate_limit",
    "session_started",
    "process_exit",
    "stderr",
    "fs_write",
    "process_started",
    "usage_update",
    "available_commands_update",
    "current_mode_update",
    "config_option_update",
    "session_info_update",
];

/// Facts about a ticket gathered from all of its lines, dropped ones included.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Facts {
    pub identifier: Option<String>,
    pub agent_kind: Option<String>,
    pub started_at: Option<String>,
    pub turn_count: u64,
    /// `completed` or `failed` once the latest run ended one way or the other.
    pub last_status: Option<&'static str>,
    pub lines: u64,
    /// Display events dropped from the front to keep the timeline bounded.
    pub dropped_events: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub events: Vec<Value>,
    pub facts: Facts,
    tools: HashMap<String, usize>,
    /// The events were dropped from memory to keep the index within its budget (the facts
    /// stay); they are rebuilt from the trace file when needed.
    pub evicted: bool,
    /// When the timeline last changed, on the index's clock (for eviction, oldest first).
    pub touched: u64,
}

fn text_of(update: &Value) -> &str {
    update
        .get("content")
        .and_then(|c| c.get("text"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The display kind of a chunk's trace type.
fn chunk_display(kind: &str) -> Option<&'static str> {
    match kind {
        "agent_message_chunk" => Some("message"),
        "agent_thought_chunk" => Some("thought"),
        "user_message_chunk" => Some("user_message"),
        _ => None,
    }
}

/// How the trace writer starts a chunk's line (`Updates::trace_update` puts `type` first).
const CHUNK_PREFIXES: [&[u8]; 3] = [
    b"{\"type\":\"agent_message_chunk\",",
    b"{\"type\":\"agent_thought_chunk\",",
    b"{\"type\":\"user_message_chunk\",",
];

/// The fields of a chunk's trace line that the timeline uses, borrowed from the line where
/// it has no escapes. Other fields are skipped unread.
#[derive(serde::Deserialize)]
struct ChunkLine<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    at: Option<Cow<'a, str>>,
    #[serde(rename = "runId", borrow)]
    run_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    identifier: Option<Cow<'a, str>>,
    #[serde(borrow)]
    update: Option<ChunkUpdate<'a>>,
}

#[derive(serde::Deserialize)]
struct ChunkUpdate<'a> {
    #[serde(borrow)]
    content: Option<ChunkContent<'a>>,
}

#[derive(serde::Deserialize)]
struct ChunkContent<'a> {
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
}

/// Applies a chunk of `display` kind: appended to the last event when that is of the same kind
/// and run, else a new event (its `at` made only then). Returns the index it changed.
fn coalesce(
    events: &mut Vec<Value>,
    display: &str,
    run_id: &Value,
    text: &str,
    at: impl FnOnce() -> Value,
) -> Option<usize> {
    if let Some(last) = events.last_mut()
        && last["kind"] == display
        && last["runId"] == *run_id
    {
        match &mut last["text"] {
            Value::String(joined) => append_capped(joined, text),
            other => *other = Value::String(text.to_string()),
        }
        return Some(events.len() - 1);
    }
    events.push(
        json!({"kind": display, "at": at(), "text": capped(text.to_string()), "runId": run_id}),
    );
    Some(events.len() - 1)
}

/// Appends a chunk's text to a coalesced message, up to [`MAX_TEXT`].
fn append_capped(joined: &mut String, text: &str) {
    if joined.len() < MAX_TEXT {
        let room = MAX_TEXT - joined.len();
        let mut cut = room.min(text.len());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        joined.push_str(&text[..cut]);
        if cut < text.len() {
            joined.push_str(" [cut]");
        }
    }
}

/// Display events kept per ticket: past this, the oldest are dropped down to [`KEEP_EVENTS`], so
/// a long-lived daemon's memory does not grow with its trace history (the file keeps it all).
pub const MAX_EVENTS: usize = 2000;
pub const KEEP_EVENTS: usize = 1000;
/// Longest text of one coalesced message or thought; the rest of a runaway message is cut.
pub const MAX_TEXT: usize = 32 * 1024;

fn capped(mut text: String) -> String {
    if text.len() > MAX_TEXT {
        let mut cut = MAX_TEXT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(" [cut]");
    }
    text
}

impl Timeline {
    /// Applies one trace line; returns the lowest event index it changed or added. After the
    /// oldest events were dropped it returns 0: every index moved, the whole timeline changed.
    pub fn apply(&mut self, line: &Value) -> Option<usize> {
        let changed = self.apply_line(line);
        self.bounded(changed)
    }

    /// Applies one trace line given as JSON text; `None` also for a line that is not JSON.
    /// Message, thought and user-message chunks, the bulk of every trace, are read without
    /// building a JSON tree when the line starts the way the trace writer writes them; any
    /// other line (or a chunk whose fields are not of the usual types) is parsed whole and
    /// goes through [`Timeline::apply`], with the same result.
    pub fn apply_json(&mut self, line: &[u8]) -> Option<usize> {
        if CHUNK_PREFIXES.iter().any(|p| line.starts_with(p))
            && let Ok(chunk) = serde_json::from_slice::<ChunkLine>(line)
            && let Some(display) = chunk_display(&chunk.kind)
        {
            let changed = self.apply_chunk(display, &chunk);
            return self.bounded(changed);
        }
        let value = serde_json::from_slice::<Value>(line).ok()?;
        self.apply(&value)
    }

    fn apply_chunk(&mut self, display: &str, chunk: &ChunkLine) -> Option<usize> {
        let f = &mut self.facts;
        f.lines += 1;
        if f.identifier.is_none() {
            f.identifier = chunk.identifier.as_deref().map(str::to_string);
        }
        if f.started_at.is_none() {
            f.started_at = chunk.at.as_deref().map(str::to_string);
        }
        let text = chunk
            .update
            .as_ref()
            .and_then(|u| u.content.as_ref())
            .and_then(|c| c.text.as_deref())
            .unwrap_or_default();
        let run_id = chunk.run_id.as_deref().map_or(Value::Null, Value::from);
        coalesce(&mut self.events, display, &run_id, text, || {
            chunk.at.as_deref().map_or(Value::Null, Value::from)
        })
    }

    /// Keeps the timeline within [`MAX_EVENTS`]; `changed` is what the line changed.
    fn bounded(&mut self, changed: Option<usize>) -> Option<usize> {
        if self.events.len() <= MAX_EVENTS {
            return changed;
        }
        let dropped = self.events.len() - KEEP_EVENTS;
        self.events.drain(..dropped);
        self.facts.dropped_events += dropped as u64;
        self.tools.retain(|_, idx| {
            if *idx < dropped {
                false
            } else {
                *idx -= dropped;
                true
            }
        });
        Some(0)
    }

    /// Drops the events from memory; the facts stay.
    pub fn evict(&mut self) {
        self.events = Vec::new();
        self.tools = HashMap::new();
        self.evicted = true;
    }

    /// Takes the events of `rebuilt` (the same ticket, read again from its file).
    pub fn restore(&mut self, rebuilt: Timeline) {
        self.events = rebuilt.events;
        self.tools = rebuilt.tools;
        self.evicted = false;
    }

    fn apply_line(&mut self, line: &Value) -> Option<usize> {
        let kind = line.get("type").and_then(Value::as_str)?;
        let at = line.get("at").cloned().unwrap_or(Value::Null);
        let f = &mut self.facts;
        f.lines += 1;
        if f.identifier.is_none() {
            f.identifier = line
                .get("identifier")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        if f.started_at.is_none() {
            f.started_at = at.as_str().map(str::to_string);
        }
        match kind {
            "session_started" => {
                f.agent_kind = line
                    .get("agentKind")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            }
            "turn_started" => {
                f.turn_count += 1;
                f.last_status = None;
            }
            "turn_completed" | "max_turns_reached" => f.last_status = Some("completed"),
            "turn_failed" => f.last_status = Some("failed"),
            _ => {}
        }
        if DROPPED.contains(&kind) {
            return None;
        }
        let update = line.get("update").unwrap_or(&Value::Null);
        let run_id = line.get("runId").unwrap_or(&Value::Null);
        match kind {
            "agent_message_chunk" | "agent_thought_chunk" | "user_message_chunk" => coalesce(
                &mut self.events,
                chunk_display(kind).unwrap_or_default(),
                run_id,
                text_of(update),
                || at.clone(),
            ),
            "tool_call" => {
                let id = update
                    .get("toolCallId")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                self.events.push(json!({
                    "kind": "tool_call", "at": at, "toolCallId": id, "title": update.get("title").cloned().unwrap_or(Value::Null),
                    "toolKind": update.get("kind").cloned().unwrap_or(Value::Null),
                    "status": update.get("status").cloned().unwrap_or_else(|| "pending".into()),
                    "startedAt": at, "endedAt": null, "durationMs": null, "error": false,
                    "locations": update.get("locations").cloned().unwrap_or(Value::Null),
                }));
                let idx = self.events.len() - 1;
                self.tools.insert(id, idx);
                Some(idx)
            }
            "tool_call_update" => {
                let id = update
                    .get("toolCallId")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let idx = *self.tools.get(id)?;
                let ev = self.events.get_mut(idx)?.as_object_mut()?;
                if let Some(title) = update.get("title").filter(|t| !t.is_null()) {
                    ev.insert("title".into(), title.clone());
                }
                if let Some(status) = update.get("status").and_then(Value::as_str) {
                    ev.insert("status".into(), status.into());
                    if status == "completed" || status == "failed" {
                        ev.insert("endedAt".into(), at.clone());
                        ev.insert("error".into(), (status == "failed").into());
                        let start = ev
                            .get("startedAt")
                            .and_then(Value::as_str)
                            .and_then(parse_ms);
                        let end = at.as_str().and_then(parse_ms);
                        if let (Some(s), Some(e)) = (start, end) {
                            ev.insert("durationMs".into(), e.saturating_sub(s).into());
                        }
                    }
                }
                Some(idx)
            }
            "plan" => {
                let entries = update.get("entries").cloned().unwrap_or(Value::Null);
                if let Some(last) = self.events.last_mut()
                    && last["kind"] == "plan"
                {
                    last["entries"] = entries;
                    last["at"] = at;
                    return Some(self.events.len() - 1);
                }
                self.events
                    .push(json!({"kind": "plan", "at": at, "entries": entries}));
                Some(self.events.len() - 1)
            }
            other => {
                let mut ev = Map::new();
                ev.insert("at".into(), at);
                match other {
                    "permission_request" => {
                        ev.insert("kind".into(), "permission".into());
                        ev.insert(
                            "title".into(),
                            line.get("title").cloned().unwrap_or(Value::Null),
                        );
                        ev.insert(
                            "decision".into(),
                            line.get("decision").cloned().unwrap_or(Value::Null),
                        );
                    }
                    "turn_started" | "turn_completed" | "turn_failed" => {
                        ev.insert("kind".into(), other.into());
                        ev.insert(
                            "turn".into(),
                            line.get("turn").cloned().unwrap_or(Value::Null),
                        );
                        ev.insert("runId".into(), run_id.clone());
                        if other == "turn_completed" {
                            ev.insert(
                                "stopReason".into(),
                                line.get("stopReason").cloned().unwrap_or(Value::Null),
                            );
                            ev.insert(
                                "usage".into(),
                                line.get("usage").cloned().unwrap_or(Value::Null),
                            );
                            ev.insert(
                                "cost".into(),
                                line.get("cost").cloned().unwrap_or(Value::Null),
                            );
                        }
                        if other == "turn_failed" {
                            ev.insert(
                                "error".into(),
                                line.get("error").cloned().unwrap_or(Value::Null),
                            );
                        }
                    }
                    "hook" => {
                        ev.insert("kind".into(), "hook".into());
                        for k in ["hook", "ok", "error"] {
                            ev.insert(k.into(), line.get(k).cloned().unwrap_or(Value::Null));
                        }
                    }
                    "user_message" => {
                        // A person's steering message, delivered to the agent.
                        ev.insert("kind".into(), "user_message".into());
                        for k in ["author", "source", "text", "writtenAt", "steeringTurn"] {
                            ev.insert(k.into(), line.get(k).cloned().unwrap_or(Value::Null));
                        }
                        ev.insert("runId".into(), run_id.clone());
                    }
                    "max_turns_reached" => {
                        ev.insert("kind".into(), "notice".into());
                        let max = line.get("maxTurns").and_then(Value::as_u64).unwrap_or(0);
                        ev.insert("text".into(), format!("turn limit reached ({max})").into());
                    }
                    _ => {
                        ev.insert("kind".into(), "event".into());
                        ev.insert("type".into(), other.into());
                    }
                }
                self.events.push(Value::Object(ev));
                Some(self.events.len() - 1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn timelines_stay_bounded() {
        let mut t = Timeline::default();
        let line = |kind: &str, text: &str| {
            json!({"type": kind, "at": "2026-11-01T00:00:00Z", "runId": "r1",
                   "update": {"toolCallId": "t1", "content": {"type": "text", "text": text}}})
        };
        assert_eq!(t.apply(&line("tool_call", "")), Some(0));
        for n in 0..5000 {
            let kind = if n % 2 == 0 {
                "agent_message_chunk"
            } else {
                "agent_thought_chunk"
            };
            let changed = t.apply(&line(kind, "x")).unwrap();
            assert!(changed < t.events.len());
        }
        assert!(t.events.len() <= MAX_EVENTS && t.events.len() >= KEEP_EVENTS);
        assert_eq!(t.facts.dropped_events as usize + t.events.len(), 5001);
        // The dropped tool call's update finds nothing, and nothing breaks.
        assert_eq!(t.apply(&line("tool_call_update", "")), None);
        // One message's text is capped, however many chunks it gets.
        let big = "y".repeat(10_000);
        for _ in 0..10 {
            t.apply(&line("agent_message_chunk", &big));
        }
        let text = t.events.last().unwrap()["text"].as_str().unwrap();
        assert!(
            text.len() <= MAX_TEXT + 10 && text.ends_with(" [cut]"),
            "{}",
            text.len()
        );
    }

    use super::*;

    fn line(v: Value) -> Value {
        v
    }

    #[test]
    fn chunks_coalesce_tools_pair_and_noise_is_dropped() {
        let mut t = Timeline::default();
        let lines = [
            json!({"type": "process_started", "at": "2026-11-21T10:00:00.000Z", "identifier": "A-1"}),
            json!({"type": "session_started", "at": "2026-11-21T10:00:00.010Z", "agentKind": "demo"}),
            json!({"type": "turn_started", "at": "2026-11-21T10:00:00.020Z", "turn": 1, "runId": "r1"}),
            json!({"type": "agent_thought_chunk", "at": "2026-11-21T10:00:00.030Z", "runId": "r1", "update": {"content": {"text": "Think"}}}),
            json!({"type": "agent_message_chunk", "at": "2026-11-21T10:00:00.040Z", "runId": "r1", "update": {"content": {"text": "Hel"}}}),
            json!({"type": "agent_message_chunk", "at": "2026-11-21T10:00:00.050Z", "runId": "r1", "update": {"content": {"text": "lo"}}}),
            json!({"type": "tool_call", "at": "2026-11-21T10:00:01.000Z", "update": {"toolCallId": "c1", "title": "Edit", "kind": "edit", "status": "pending"}}),
            json!({"type": "stderr", "at": "2026-11-21T10:00:01.100Z", "line": "noise"}),
            json!({"type": "usage_update", "at": "2026-11-21T10:00:01.200Z", "update": {"used": 5}}),
            json!({"type": "permission_request", "at": "2026-11-21T10:00:01.300Z", "title": "Edit", "decision": "approval_auto_approved"}),
            json!({"type": "tool_call_update", "at": "2026-11-21T10:00:01.750Z", "update": {"toolCallId": "c1", "status": "failed"}}),
            json!({"type": "plan", "at": "2026-11-21T10:00:02.000Z", "update": {"entries": [1]}}),
            json!({"type": "plan", "at": "2026-11-21T10:00:02.100Z", "update": {"entries": [1, 2]}}),
            json!({"type": "agent_message_chunk", "at": "2026-11-21T10:00:03.000Z", "runId": "r1", "update": {"content": {"text": "Bye"}}}),
            json!({"type": "turn_completed", "at": "2026-11-21T10:00:04.000Z", "turn": 1, "stopReason": "end_turn", "usage": {"totalTokens": 9}}),
            json!({"type": "process_exit", "at": "2026-11-21T10:00:05.000Z", "status": "exit code 0"}),
        ];
        let changed: Vec<Option<usize>> = lines.iter().map(|l| t.apply(&line(l.clone()))).collect();
        let kinds: Vec<&str> = t
            .events
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "turn_started",
                "thought",
                "message",
                "tool_call",
                "permission",
                "plan",
                "message",
                "turn_completed"
            ]
        );
        assert_eq!(t.events[2]["text"], "Hello");
        assert_eq!(
            changed[5],
            Some(2),
            "the second chunk changes the message in place"
        );
        assert_eq!(
            changed[10],
            Some(3),
            "the update changes the earlier tool call"
        );
        assert_eq!(changed[7], None, "stderr is dropped");
        assert_eq!(t.events[3]["durationMs"], 750);
        assert_eq!(t.events[3]["error"], true);
        assert_eq!(t.events[5]["entries"], json!([1, 2]));
        assert_eq!(t.facts.identifier.as_deref(), Some("A-1"));
        assert_eq!(t.facts.agent_kind.as_deref(), Some("demo"));
        assert_eq!(t.facts.turn_count, 1);
        assert_eq!(t.facts.last_status, Some("completed"));
        assert_eq!(t.facts.lines, 16);
    }

    #[test]
    fn hostile_lines_do_not_break_parsing() {
        let mut t = Timeline::default();
        assert_eq!(t.apply(&json!({"no": "type"})), None);
        assert_eq!(t.apply(&json!({"type": 5})), None);
        assert_eq!(
            t.apply(&json!({"type": "tool_call_update", "update": {"toolCallId": "never"}})),
            None
        );
        assert_eq!(
            t.apply(&json!({"type": "agent_message_chunk", "update": "not an object"})),
            Some(0)
        );
        assert_eq!(t.apply(&json!({"type": "surprise"})), Some(1));
        assert_eq!(t.events[1]["kind"], "event");
        assert_eq!(
            t.apply(&json!({"type": "turn_failed", "error": "boom"})),
            Some(2)
        );
        assert_eq!(t.facts.last_status, Some("failed"));
    }
}
