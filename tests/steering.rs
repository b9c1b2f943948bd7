//! Human steering end to end: the real binary, the local board and the demo agent (which
//! records every `session/prompt` it receives, and when). A person's message reaches the running
//! agent as its next turn, with the author in the text; the budget of steering turns holds;
//! what waits is delivered at the next run; the operator's API and `svc steer`.

mod common;

use common::*;
use serde_json::{Value, json};
use std::fs;
use std::path::PathBuf;

const TOKEN: &str = "steer-control-token-0001";

/// A board with the given issues (file, body) in Todo, a workflow whose demo agent records its
/// prompts, and the daemon. `agent` is extra keys of `agents.demo`, `max_turns` the budget.
fn steering_daemon(
    dir: &TestDir,
    issues: &[(&str, &str)],
    max_turns: u32,
    agent: &str,
) -> (Daemon, PathBuf) {
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    for (file, body) in issues {
        fs::write(
            board.join(file),
            format!("---\ntitle: Steer me\nstate: Todo\n---\n{body}\n"),
        )
        .unwrap();
    }
    let prompts = dir.join("prompts.jsonl");
    let wf = workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: {max_turns}\nagents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\n{agent}server:\n  port: 0\n  trace_dir: traces\n",
            prompts.display(),
            svc_bin()
        ),
    );
    let mut cmd = svc(dir);
    cmd.arg("--no-tui").arg(&wf).env("SVC_CONTROL_TOKEN", TOKEN);
    (Daemon::start(cmd), prompts)
}

/// The prompts the demo agents received, in order.
fn prompts(path: &PathBuf) -> Vec<Value> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn wait_prompts(path: &PathBuf, n: usize, what: &str) -> Vec<Value> {
    wait_until(60, what, || prompts(path).len() >= n);
    prompts(path)
}

fn steer(d: &Daemon, issue: &str, token: &str, body: &str) -> (u16, Value) {
    let (status, _, text) = http(
        "POST",
        &format!("{}/api/v1/{issue}/steer", base_url(d)),
        &[
            ("Authorization", &format!("Bearer {token}")),
            ("Content-Type", "application/json"),
        ],
        Some(body),
    );
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn running_entry(s: &Value, identifier: &str) -> Option<Value> {
    s["running"]
        .as_array()?
        .iter()
        .find(|r| r["issue_identifier"] == identifier)
        .cloned()
}

/// Every trace line of every issue, parsed.
fn trace_lines(dir: &TestDir) -> Vec<Value> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir.join("traces"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let text = fs::read_to_string(entry.path().join("trace.jsonl")).unwrap_or_default();
        out.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok()),
        );
    }
    out
}

#[test]
fn an_api_message_is_the_running_agents_next_turn_with_its_author() {
    let dir = TestDir::new("steer-api");
    let (d, prompts_file) = steering_daemon(
        &dir,
        &[("BOARD-1.md", "demo: slow 2500\ndemo: keep-open")],
        2,
        "",
    );
    d.wait_for(30, "BOARD-1 in its first turn", |s| {
        running_entry(s, "BOARD-1").is_some_and(|r| r["turn_count"] == 1)
    });
    // The route's refusals: the token, the body, an unknown issue.
    // (`demo: keep-open` keeps the demo agent from completing the issue in that turn.)
    let ok = json!({"message": "Please use tabs, not spaces.\ndemo: keep-open", "author": "alice"})
        .to_string();
    assert_eq!(steer(&d, "BOARD-1", "wrong", &ok).0, 401);
    let (status, body) = steer(&d, "BOARD-1", TOKEN, r#"{"message": "   "}"#);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    assert_eq!(steer(&d, "BOARD-1", TOKEN, "not json").0, 400);
    let huge = json!({"message": "x".repeat(70 * 1024)}).to_string();
    assert_eq!(steer(&d, "BOARD-1", TOKEN, &huge).0, 400);
    let (status, body) = steer(&d, "NOPE-9", TOKEN, &ok);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("issue_not_found"))
    );
    // Accepted: it goes to the running agent.
    let (status, body) = steer(&d, "BOARD-1", TOKEN, &ok);
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["delivery"], "running");
    // The agent's next prompt is the message, not the continuation prompt.
    let p = wait_prompts(&prompts_file, 2, "the second prompt");
    let text = p[1]["text"].as_str().unwrap();
    assert!(text.contains("--- from alice (via api,"), "{text}");
    assert!(text.contains("Please use tabs, not spaces."), "{text}");
    assert!(!text.starts_with("Continue working"), "{text}");
    let s = d.wait_for(20, "the steering turn counted", |s| {
        running_entry(s, "BOARD-1").is_some_and(|r| r["steering_turns"] == 1)
    });
    let run = running_entry(&s, "BOARD-1").unwrap();
    assert_eq!(run["last_steering"]["author"], "alice", "{run}");
    assert_eq!(run["last_steering"]["source"], "api", "{run}");
    assert!(events(&s).iter().any(|e| e == "steering_accepted"), "{s}");
    // Traced as a user message, once.
    let user_messages = || -> Vec<Value> {
        trace_lines(&dir)
            .into_iter()
            .filter(|l| l["type"] == "user_message")
            .collect()
    };
    wait_until(10, "the user message traced", || {
        !user_messages().is_empty()
    });
    let delivered = user_messages();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0]["author"], "alice");
    assert_eq!(delivered[0]["source"], "api");
    // Steering turns are counted apart: two autonomous turns still follow the first.
    let p = wait_prompts(&prompts_file, 3, "the continuation after the steering turn");
    assert!(
        p[2]["text"]
            .as_str()
            .unwrap()
            .starts_with("Continue working"),
        "{:?}",
        p[2]
    );
}

#[test]
fn with_queued_prompts_a_message_reaches_the_bridge_during_the_turn() {
    let dir = TestDir::new("steer-queued");
    let (d, prompts_file) = steering_daemon(
        &dir,
        &[("BOARD-1.md", "demo: slow 5000\ndemo: keep-open")],
        1,
        "    queue_prompts: true\n",
    );
    d.wait_for(30, "BOARD-1 in its first turn", |s| {
        running_entry(s, "BOARD-1").is_some_and(|r| r["turn_count"] == 1)
    });
    let (status, _) = steer(
        &d,
        "BOARD-1",
        TOKEN,
        &json!({"message": "stop and write tests first", "author": "bob"}).to_string(),
    );
    assert_eq!(status, 202);
    let p = wait_prompts(&prompts_file, 2, "the queued prompt at the bridge");
    assert!(
        p[1]["text"]
            .as_str()
            .unwrap()
            .contains("--- from bob (via api,")
    );
    // It arrived while the first turn still ran (the run has not started another turn).
    let s = d.latest().unwrap();
    assert_eq!(
        running_entry(&s, "BOARD-1").unwrap()["turn_count"],
        1,
        "{s}"
    );
    // The queued prompt is the next turn: the run waits for its answer, then ends (one
    // autonomous turn, one steering turn).
    let s = d.wait_for(30, "the run over", |s| {
        s["runs"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["issue_identifier"] == "BOARD-1"))
            || s["history"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["issue_identifier"] == "BOARD-1"))
            || running_entry(s, "BOARD-1").is_none()
    });
    drop(s);
    assert_eq!(
        prompts(&prompts_file)
            .iter()
            .filter(|p| p["text"].as_str().unwrap().contains("from bob"))
            .count(),
        1,
        "delivered once"
    );
}

#[test]
fn past_the_budget_a_message_waits_for_the_next_run() {
    let dir = TestDir::new("steer-budget");
    let (d, prompts_file) = steering_daemon(
        &dir,
        &[("BOARD-1.md", "demo: slow 2500\ndemo: keep-open")],
        1,
        "",
    );
    d.wait_for(30, "BOARD-1 in its first turn", |s| {
        running_entry(s, "BOARD-1").is_some_and(|r| r["turn_count"] == 1)
    });
    // The first message is the run's one steering turn (and keeps the agent busy a while).
    let first =
        json!({"message": "demo: slow 2500\ndemo: keep-open\nfirst note", "author": "alice"});
    assert_eq!(steer(&d, "BOARD-1", TOKEN, &first.to_string()).0, 202);
    d.wait_for(30, "the steering turn", |s| {
        running_entry(s, "BOARD-1").is_some_and(|r| r["steering_turns"] == 1)
    });
    let second = json!({"message": "second note", "author": "bob"});
    let (status, body) = steer(&d, "BOARD-1", TOKEN, &second.to_string());
    assert_eq!(status, 202, "{body}");
    // The run has had its one steering turn: bob waits for the next run's first prompt.
    let p = wait_prompts(&prompts_file, 3, "the next run's first prompt");
    assert!(p[1]["text"].as_str().unwrap().contains("from alice"));
    assert!(!p[1]["text"].as_str().unwrap().contains("from bob"));
    let next = p[2]["text"].as_str().unwrap();
    assert!(next.starts_with("Work on BOARD-1."), "{next}");
    assert!(next.contains("--- from bob (via api,"), "{next}");
    let s = d.latest().unwrap();
    let all = format!("{}", s["recent_events"]);
    assert!(all.contains("steering_deferred"), "{s}");
    assert_eq!(
        prompts(&prompts_file)
            .iter()
            .filter(|p| p["text"].as_str().unwrap().contains("from bob"))
            .count(),
        1
    );
}
