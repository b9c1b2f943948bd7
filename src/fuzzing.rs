//! Entry points for the fuzz targets (`tests/fuzz`, run by `scripts/fuzz`) and for the regression
//! replay in `tests/hostile_input.rs`: one function per target, taking arbitrary bytes and
//! feeding them through the daemon's real parsing code for input it does not control.
//!
//! Every function must return normally for every input; a panic (or a stack overflow, which
//! aborts the process) is a bug in the daemon. Each runs the parsing on a thread with the stack
//! size of the daemon thread that parses that input in production, so deep recursion that would
//! overflow there overflows here too.
//!
//! Nothing here touches the real environment, the network or the file system, and nothing spawns
//! a process: the workflow target hands in an [`Env`] without `PATH`, so an `op://` reference
//! finds no 1Password CLI and becomes a configuration error.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value, json};

use crate::agent::{acp, pipes};
use crate::config::{self, SecretResolver};
use crate::env::Env;
use crate::http;
use crate::mcp::query;
use crate::orchestrator::protocol::{Event, PollReport};
use crate::orchestrator::snapshot::{self, Snapshot};
use crate::orchestrator::state::{self, State};
use crate::trace::display::Timeline;
use crate::trace::watcher;
use crate::tracker::Issue;

/// The stack of a thread spawned with the standard library's default size: the poller (which
/// re-reads `WORKFLOW.md`), the HTTP and MCP handler threads and the trace watcher.
const DEFAULT_THREAD_STACK: usize = 2 << 20;

/// Runs `f` on a new thread with a `stack`-byte stack and re-raises its panic, if any, here.
fn on_stack(stack: usize, f: impl FnOnce() + Send) {
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("fuzz-input".into())
            .stack_size(stack)
            .spawn_scoped(scope, f)
            .expect("spawning a thread for one fuzz input");
        if let Err(panic) = handle.join() {
            std::panic::resume_unwind(panic);
        }
    });
}

/// The text of a file or request as the daemon would hold it: UTF-8, with invalid bytes replaced
/// (so invalid input still reaches the parsers instead of being dropped early).
fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// `WORKFLOW.md` text: front matter split, YAML, every section's validation, secret references
/// and the prompt template, as the poller does on each reload.
pub fn workflow(data: &[u8]) {
    on_stack(DEFAULT_THREAD_STACK, || {
        let text = text(data);
        let path = Path::new("/fuzz/WORKFLOW.md");
        let Ok(file) = config::workflow::parse(path, &text) else {
            return;
        };
        // No PATH: `op` cannot be found, so no process is ever spawned.
        let env = Env::from_pairs(
            [
                ("HOME", "/home/fuzz"),
                ("FUZZ_TOKEN", "fuzz-secret"),
                ("TRACKER_A_API_KEY", "fuzz-a-key"),
                ("TRACKER_B_BASE_URL", "https://tracker-b.invalid"),
                ("TRACKER_B_EMAIL", "fuzz@example.invalid"),
                ("TRACKER_B_API_KEY", "fuzz-b-key"),
                ("EMPTY", ""),
            ],
            Path::new("/fuzz"),
        );
        let mut secrets = SecretResolver::default();
        match config::from_workflow(&file, &env, &mut secrets) {
            Ok(loaded) => {
                let settings = &loaded.settings;
                let _ = settings.agent_for_state("Todo");
                let _ = settings.tracker.is_active(" todo ");
                let _ = format!("{settings:?}");
            }
            Err(err) => {
                let _ = err.to_string();
            }
        }
    });
}

/// Fixed records the query target filters, sorts and pages.
fn query_records() -> Vec<Map<String, Value>> {
    [
        json!({"id": "A-1", "title": "Login bug", "state": "Todo", "priority": 2, "labels": ["bug", "UI"], "done": false}),
        json!({"id": "A-2", "title": "Ünïcödé ✅", "state": "Done", "priority": 1.5, "labels": [], "done": true}),
        json!({"id": "A-3", "title": "", "state": "todo", "estimate": null, "priority": -9_223_372_036_854_775_808_i64}),
        json!({"id": "A-4", "title": "big", "priority": 18_446_744_073_709_551_615_u64, "labels": "bug", "nested": {"a": [1, {"b": 2}]}}),
        json!({"id": 5, "state": ["x"], "priority": "high"}),
        json!({}),
    ]
    .into_iter()
    .filter_map(|v| v.as_object().cloned())
    .collect()
}

/// The `*_query` tools' language: the input is the tool arguments as JSON; an optional
/// `records` array of objects in it is queried along with fixed records.
pub fn query(data: &[u8]) {
    on_stack(DEFAULT_THREAD_STACK, || {
        let Ok(args) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        let Ok(q) = query::parse(&args) else {
            return;
        };
        let mut records = query_records();
        if let Some(extra) = args.get("records").and_then(Value::as_array) {
            records.extend(extra.iter().filter_map(|r| r.as_object().cloned()));
        }
        if let Some(filter) = &q.filter {
            for r in &records {
                let _ = query::matches(filter, r);
            }
        }
        let total = records.len();
        let (rows, matched) = query::run(records, &q, &["id", "title"]);
        assert!(matched <= total, "more matches than records");
        assert!(rows.len() <= q.limit, "a page longer than the limit");
    });
}

/// A snapshot with a few running issues, some with awkward identifiers.
fn routing_snapshot() -> &'static Snapshot {
    static SNAPSHOT: OnceLock<Snapshot> = OnceLock::new();
    SNAPSHOT.get_or_init(|| {
        let text = "---\ntracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 4\n---\nx\n";
        let file = config::workflow::parse(Path::new("/fuzz/WORKFLOW.md"), text)
            .expect("the routing workflow splits");
        let env = Env::from_pairs([("HOME", "/home/fuzz")], Path::new("/fuzz"));
        let settings = config::from_workflow(&file, &env, &mut SecretResolver::default())
            .expect("the routing workflow is valid")
            .settings;
        let now = 1_000_000;
        let mut st = State::new(Arc::new(settings), now);
        state::handle(&mut st, now, Event::Tick);
        let issues = ["A-1", "a b", "id/1", "✅", "%41"]
            .iter()
            .enumerate()
            .map(|(i, identifier)| Issue {
                id: format!("id-{i}"),
                identifier: identifier.to_string(),
                title: format!("Issue {i}"),
                description: None,
                state: "Todo".into(),
                state_type: None,
                labels: Vec::new(),
                url: None,
                created_at: None,
                updated_at: None,
                priority: Some(i as i64),
                blocked_by: Vec::new(),
            })
            .collect();
        state::handle(
            &mut st,
            now + 1,
            Event::PollDone(PollReport {
                candidates: Ok(issues),
                refreshed: Ok(Vec::new()),
                requested: Vec::new(),
                terminal: None,
                rate_limits: None,
                duration_ms: 0,
                read_at: 0,
            }),
        );
        let daemon = snapshot::DaemonInfo {
            owner_id: "fuzz".into(),
            pid: 1,
            hostname: "fuzz".into(),
            started_at: now,
            workflow_path: "/fuzz/WORKFLOW.md".into(),
            lock_path: "/fuzz/lock".into(),
            endpoint: snapshot::Endpoint {
                kind: "none".into(),
                address: None,
            },
            log_file: None,
            claim_store: &crate::orchestrator::store::memory::KIND,
        };
        snapshot::build(&st, &daemon, now + 2_000, None)
    })
}

/// A request target (`path?query`): the router with its strict percent decoding, the query
/// string parser, and the views that take the decoded parameters.
pub fn routing(data: &[u8]) {
    let snapshot = routing_snapshot();
    on_stack(DEFAULT_THREAD_STACK, || {
        let url = text(data);
        let (path, query) = url.split_once('?').unwrap_or((&url, ""));
        let _ = http::routes::percent_decode_strict(path);
        let params = http::routes::parse_query(query);
        let _ = http::api::truthy(params.get("failed").map(String::as_str));
        let _ = http::api::runs(snapshot, &params, "2026-01-01T00:00:00.000Z");
        match http::routes::route(path) {
            Ok((http::routes::Route::Asset(name), methods)) => {
                assert_eq!(methods, ["GET"]);
                let _ = crate::assets::get(&name);
            }
            Ok((http::routes::Route::Issue(id), _)) => {
                let _ = http::api::issue_detail(snapshot, &id);
            }
            Ok((
                http::routes::Route::TicketExists(id) | http::routes::Route::TicketEvents(id),
                _,
            )) => {
                assert!(!id.is_empty(), "an empty ticket id was routed");
            }
            Ok(_) => {}
            Err((status, code, message)) => {
                assert!(matches!(status, 400 | 404), "unexpected status {status}");
                assert!(!code.is_empty() && !message.is_empty());
            }
        }
    });
}

/// The longest ACP line the fuzz target accepts: small, so oversized lines (skipped and
/// drained by the reader) are reached quickly.
const FUZZ_MAX_LINE: usize = 64;

/// A bridge's stdout: the first byte picks the longest accepted line (1 to 64 bytes, or the
/// daemon's own limit when it is 0); the rest goes through the line reader, each line through
/// the message parser and `is_call`, on a stack the size of the bridge reader's..
pub fn acp_reader(data: &[u8]) {
    let (max_line, stream) = match data.split_first() {
        Some((0, rest)) => (None, rest),
        Some((b, rest)) => (Some(usize::from(*b) % FUZZ_MAX_LINE + 1), rest),
        None => (None, data),
    };
    on_stack(pipes::READER_STACK, || {
        let max = max_line.unwrap_or(pipes::MAX_LINE);
        let mut lines = pipes::LineBuf::new(max);
        // Fed in reads of varied sizes, as pipes deliver them.
        let mut rest = stream;
        let mut size = 1;
        loop {
            let (read, tail) = rest.split_at(size.min(rest.len()));
            rest = tail;
            if read.is_empty() {
                lines.end();
            } else {
                lines.push(read);
            }
            while let Some(line) = lines.next_line() {
                let line = lines.bytes(line);
                assert!(line.len() <= max, "an oversized line got through");
                assert!(!line.contains(&b'\n'));
                let text = String::from_utf8_lossy(line);
                // The update fast path must find what the parsed message says.
                let reference = match serde_json::from_str::<Value>(text.trim()) {
                    Ok(Value::Object(m))
                        if m.get("method").and_then(Value::as_str) == Some("session/update")
                            && !m.contains_key("id") =>
                    {
                        Some(m.get("params").and_then(|p| p.get("update")).cloned())
                    }
                    _ => None,
                };
                let found = acp::session_update(&text).map(|update| {
                    update.map(|raw| serde_json::from_str::<Value>(raw.get()).expect("raw JSON"))
                });
                assert_eq!(
                    found, reference,
                    "session_update disagrees with the parsed line"
                );
                match pipes::parse_line(&text) {
                    Some(pipes::Incoming::Message(msg)) => {
                        assert!(msg.is_object());
                        let _ = acp::is_call(&msg);
                    }
                    Some(pipes::Incoming::Garbage(g)) => {
                        assert!(g.chars().count() <= 500);
                    }
                    Some(_) | None => {}
                }
            }
            if read.is_empty() {
                return;
            }
            size = size % 7 + 1;
        }
    });
}

/// A `trace.jsonl` file: the first byte seeds the chunk sizes the watcher reads it in; each
/// chunk goes through the watcher's partial-line logic and the timeline. The result must equal
/// applying the complete lines in one go.
pub fn trace_line(data: &[u8]) {
    let (seed, file) = match data.split_first() {
        Some((b, rest)) => (u32::from(*b), rest),
        None => (0, data),
    };
    on_stack(DEFAULT_THREAD_STACK, || {
        let mut chunked = Timeline::default();
        let mut partial = Vec::new();
        let mut rng = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        let mut rest = file;
        // At most about 64 chunks, so long lines do not make this quadratic.
        let min_chunk = file.len() / 64;
        while !rest.is_empty() {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            let size = (rng as usize % 97 + 1).max(min_chunk).min(rest.len());
            let (chunk, tail) = rest.split_at(size);
            rest = tail;
            if let Some(lines) = watcher::complete_lines(&mut partial, chunk) {
                assert!(lines.ends_with(b"\n"));
                let _ = watcher::apply_lines(&mut chunked, &lines);
            }
        }
        let complete = file.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        assert_eq!(
            partial,
            &file[complete..],
            "the unterminated tail was not kept"
        );
        let mut whole = Timeline::default();
        let _ = watcher::apply_lines(&mut whole, &file[..complete]);
        let same = |a: &Timeline, how: &str| {
            assert_eq!(a.facts, whole.facts, "{how} changed the facts");
            assert_eq!(a.events, whole.events, "{how} changed the timeline");
        };
        same(&chunked, "chunked reads");
        // The chunk fast path must agree with applying every line as a parsed JSON tree.
        let mut tree = Timeline::default();
        for line in file[..complete].split(|b| *b == b'\n') {
            if let Ok(value) = serde_json::from_slice::<Value>(line) {
                let _ = tree.apply(&value);
            }
        }
        same(&tree, "the chunk fast path");
    });
}

/// A webhook delivery: the first byte picks the route's service, the bytes up to the first
/// newline are the signature header's value (and the event header's), the rest the body. It is
/// judged as sent (a forged signature is never accepted), then signed with the route's secret and
/// judged again, which reaches the JSON and event paths: a signed body is never refused as
/// unsigned. On the HTTP front threads' stack size.
pub fn webhook(data: &[u8]) {
    use crate::webhook::{self, Route, Source, Verdict};
    on_stack(DEFAULT_THREAD_STACK, || {
        let Some((&pick, rest)) = data.split_first() else {
            return;
        };
        let source = Source::ALL[usize::from(pick) % Source::ALL.len()];
        let (head, body) = match rest.iter().position(|&b| b == b'\n') {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (&rest[..0], rest),
        };
        let head = text(head).into_owned();
        let route = Route {
            secret: config::Secret::new("fuzz-secret"),
            scope: vec!["acme/app".into(), "ENG".into()],
        };
        let now = 1_800_000_000_000;
        let forged = |_: &str| Some(head.clone());
        let verdict = webhook::judge(source, &route, &forged, body, now);
        let expected = webhook::sign_hex(b"fuzz-secret", body);
        if verdict != Verdict::Unauthorized {
            // GitLab signs nothing: its header carries the secret itself.
            let made = if source == Source::Gitlab {
                head == "fuzz-secret"
            } else {
                head.contains(&expected)
            };
            assert!(made, "{source:?} accepted a signature it did not make");
        }
        let signed = |name: &str| {
            Some(match name {
                "X-Gitlab-Token" => "fuzz-secret".to_string(),
                "Linear-Signature" => expected.clone(),
                "X-Hub-Signature-256" | "X-Hub-Signature" => format!("sha256={expected}"),
                _ => head.clone(),
            })
        };
        let verdict = webhook::judge(source, &route, &signed, body, now);
        assert_ne!(verdict, Verdict::Unauthorized, "a signed body was refused");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_takes_empty_and_simple_input() {
        for f in [workflow, query, routing, acp_reader, trace_line] {
            f(b"");
            f(b"\n");
            f(b"{}");
        }
        workflow(b"---\ntracker:\n  kind: memory\n---\nHi {{ issue.title }}\n");
        routing(b"/api/v1/A-1?limit=2");
        acp_reader(b"\x05{\"method\":\"x\"}\nlonger than five\n");
        trace_line(b"\x07{\"type\":\"hook\"}\n{\"type\":");
    }
}
