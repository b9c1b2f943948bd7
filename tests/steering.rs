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
    steering_daemon_polling(dir, issues, max_turns, agent, 200)
}

/// [`steering_daemon`] polling every `interval_ms`.
fn steering_daemon_polling(
    dir: &TestDir,
    issues: &[(&str, &str)],
    max_turns: u32,
    agent: &str,
    interval_ms: u64,
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
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: {interval_ms}\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: {max_turns}\nagents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\n{agent}server:\n  port: 0\n  trace_dir: traces\n",
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
    // (`demo: keep-open` keeps the demo agent from completing the issue in that turn, and
    // `demo: slow 1500` keeps the steering turn running long enough to be seen.)
    let ok = json!({"message": "Please use tabs, not spaces.\ndemo: keep-open\ndemo: slow 1500", "author": "alice"})
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
    // The trace viewer's timeline shows it with its author.
    let issue_id = run["issue_id"].as_str().unwrap().to_string();
    let timeline_has_it = || {
        let (status, _, text) = http(
            "GET",
            &format!("{}/api/v1/tickets/{issue_id}/events", base_url(&d)),
            &[],
            None,
        );
        status == 200
            && serde_json::from_str::<Value>(&text).is_ok_and(|v| {
                v["events"].as_array().is_some_and(|e| {
                    e.iter()
                        .any(|e| e["kind"] == "user_message" && e["author"] == "alice")
                })
            })
    };
    wait_until(15, "the user message in the timeline", timeline_has_it);
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

/// Rewrites a board file (Todo) with these comments (author, body).
fn write_board(dir: &TestDir, file: &str, body: &str, comments: &[(&str, &str)]) {
    let mut text = "---\ntitle: Steer me\nstate: Todo\n".to_string();
    if !comments.is_empty() {
        text.push_str("comments:\n");
        for (n, (author, c)) in comments.iter().enumerate() {
            text.push_str(&format!(
                "  - author: {author}\n    at: 2026-11-25T10:00:{n:02}Z\n    body: {}\n",
                serde_json::to_string(c).unwrap()
            ));
        }
    }
    text.push_str(&format!("---\n{body}\n"));
    fs::write(dir.join("board").join(file), text).unwrap();
}

fn count_prompts_with(path: &PathBuf, needle: &str) -> usize {
    prompts(path)
        .iter()
        .filter(|p| p["text"].as_str().unwrap_or_default().contains(needle))
        .count()
}

/// A comment a person adds to the board file steers the running agent; svc's own comments and
/// `!aside` notes do not; a comment written while svc was killed arrives once after the restart,
/// and nothing is delivered twice.
#[test]
fn board_comments_steer_and_one_written_while_svc_was_down_arrives_once() {
    let dir = TestDir::new("steer-board");
    let body = "demo: slow 1500\ndemo: keep-open";
    let (mut d, prompts_file) = steering_daemon(&dir, &[("BOARD-1.md", body)], 50, "");
    d.wait_for(30, "BOARD-1 in its first turn", |s| {
        running_entry(s, "BOARD-1").is_some_and(|r| r["turn_count"] == 1)
    });
    let mut comments = vec![
        ("agent", "A comment svc's agent wrote"),
        ("carol", "!aside just between us humans"),
        ("carol", "Carol says: mind the migration"),
    ];
    write_board(&dir, "BOARD-1.md", body, &comments);
    wait_until(30, "carol's comment delivered", || {
        count_prompts_with(&prompts_file, "--- from carol (via local") == 1
    });
    let delivered = prompts(&prompts_file);
    let all: String = delivered
        .iter()
        .map(|p| p["text"].as_str().unwrap())
        .collect();
    assert!(all.contains("Carol says: mind the migration"), "{all}");
    assert!(!all.contains("A comment svc's agent wrote"), "{all}");
    assert!(!all.contains("just between us humans"), "{all}");
    // Killed; a comment comes while svc is down; the next daemon delivers it once.
    d.signal(libc::SIGKILL);
    d.wait_exit(10);
    comments.push(("dave", "Dave wrote this while svc was down"));
    write_board(&dir, "BOARD-1.md", body, &comments);
    let wf = dir.join("WORKFLOW.md");
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf).env("SVC_CONTROL_TOKEN", TOKEN);
    let d = Daemon::start(cmd);
    wait_until(60, "dave's comment delivered", || {
        count_prompts_with(&prompts_file, "--- from dave (via local") == 1
    });
    // Dave's turn let the demo agent finish the issue; a few polls later, still once each.
    wait_until(30, "BOARD-1 done", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(
        count_prompts_with(&prompts_file, "--- from carol (via local"),
        1,
        "{}\n{}",
        fs::read_to_string(&prompts_file).unwrap_or_default(),
        d.stderr()
    );
    assert_eq!(
        count_prompts_with(&prompts_file, "--- from dave (via local"),
        1
    );
    drop(d);
}

/// Waits, a millisecond at a time, until the demo agent has received its first prompt.
fn wait_first_prompt(path: &PathBuf) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while prompts(path).is_empty() {
        assert!(std::time::Instant::now() < deadline, "no first prompt");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A comment a person writes on the board 100 ms after the agent's first prompt, with a 5 s
/// poll interval, is delivered exactly once: the issue's steering window starts at the poll
/// that dispatched it, not at the first read that names it (a poll later).
#[test]
fn a_board_comment_written_early_in_the_first_turn_is_delivered_once() {
    let dir = TestDir::new("steer-early");
    let body = "demo: slow 7000\ndemo: keep-open";
    let (d, prompts_file) = steering_daemon_polling(&dir, &[("BOARD-1.md", body)], 3, "", 5000);
    wait_first_prompt(&prompts_file);
    std::thread::sleep(std::time::Duration::from_millis(100));
    write_board(
        &dir,
        "BOARD-1.md",
        body,
        &[("carol", "Carol, early: mind the migration")],
    );
    wait_until(60, "carol's early comment delivered", || {
        count_prompts_with(&prompts_file, "Carol, early: mind the migration") >= 1
    });
    // Her turn let the demo agent finish; the polls after it deliver nothing again.
    wait_until(60, "BOARD-1 done", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
    std::thread::sleep(std::time::Duration::from_millis(5500));
    assert_eq!(
        count_prompts_with(&prompts_file, "Carol, early: mind the migration"),
        1
    );
    drop(d);
}

/// The control routes decide from the state thread, not from the published snapshot (up to
/// 100 ms old): a steer and a cancel sent within 10 ms of the agent's first prompt are accepted
/// for the running agent, and each does what it said.
#[test]
fn steer_and_cancel_right_after_the_first_prompt_are_accepted() {
    let body = "demo: slow 3000\ndemo: keep-open";
    let auth = format!("Bearer {TOKEN}");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];

    let dir = TestDir::new("steer-at-once");
    let (d, prompts_file) = steering_daemon(&dir, &[("BOARD-1.md", body)], 3, "");
    let base = base_url(&d);
    wait_first_prompt(&prompts_file);
    let message = json!({"message": "Right away: mind the migration", "author": "ann"}).to_string();
    let (status, _, text) = http(
        "POST",
        &format!("{base}/api/v1/BOARD-1/steer"),
        &headers,
        Some(&message),
    );
    assert_eq!(status, 202, "{text}");
    assert!(text.contains("\"delivery\":\"running\""), "{text}");
    wait_until(30, "ann's message delivered", || {
        count_prompts_with(&prompts_file, "Right away: mind the migration") == 1
    });
    drop(d);

    let dir = TestDir::new("cancel-at-once");
    let (d, prompts_file) = steering_daemon(&dir, &[("BOARD-1.md", body)], 3, "");
    let base = base_url(&d);
    wait_first_prompt(&prompts_file);
    let (status, _, text) = http(
        "POST",
        &format!("{base}/api/v1/BOARD-1/cancel"),
        &headers,
        None,
    );
    assert_eq!(status, 202, "{text}");
    assert!(text.contains("\"canceled\":\"running\""), "{text}");
    d.wait_for(30, "the run canceled", |s| {
        s["running"].as_array().is_some_and(|r| r.is_empty())
            && s.to_string().contains("canceled by the operator")
    });
    drop(d);
}

/// `svc steer` finds the daemon of the workflow from its lock file (the URL it recorded, the
/// token file beside it), reads `-` from standard input, and says clearly when there is no
/// daemon or no such issue.
#[test]
fn svc_steer_finds_the_daemon_and_its_token() {
    let dir = TestDir::new("steer-cli");
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 3\nagents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\nserver:\n  port: 0\n",
            dir.join("prompts.jsonl").display(),
            svc_bin()
        ),
    );
    // No daemon yet.
    let r = run(svc(&dir).args(["steer", "BOARD-1", "hello"]).arg(&wf));
    assert_eq!(r.code, Some(3), "no daemon: {}", r.all());
    assert!(
        r.stderr.contains("no svc daemon is running for"),
        "{}",
        r.all()
    );
    write_board(&dir, "BOARD-1.md", "demo: slow 2000\ndemo: keep-open", &[]);
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    d.wait_for(30, "BOARD-1 running", |s| {
        running_entry(s, "BOARD-1").is_some_and(|r| r["turn_count"] == 1)
    });
    let r = run(svc(&dir).args(["steer", "NOPE-1", "hello"]).arg(&wf));
    assert_eq!(r.code, Some(1), "{}", r.all());
    assert!(
        r.stderr.contains("NOPE-1 is neither running nor waiting"),
        "{}",
        r.all()
    );
    // The message from standard input.
    let mut child = svc(&dir)
        .args(["steer", "--author", "erin", "BOARD-1", "-"])
        .arg(&wf)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Erin, from stdin: check the logs\ndemo: keep-open\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("sent to the running agent of BOARD-1"),
        "{stdout}"
    );
    let prompts_file = dir.join("prompts.jsonl");
    wait_until(30, "erin's message delivered", || {
        count_prompts_with(&prompts_file, "--- from erin (via api") == 1
    });
    assert!(count_prompts_with(&prompts_file, "Erin, from stdin: check the logs") == 1);
    // A wrong token in the environment is refused with a hint.
    let r = run(svc(&dir)
        .env("SVC_CONTROL_TOKEN", "wrong")
        .args(["steer", "BOARD-1", "hi"])
        .arg(&wf));
    assert_eq!(r.code, Some(4), "a refused token: {}", r.all());
    assert!(
        r.stderr.contains("refused the control token"),
        "{}",
        r.all()
    );
    drop(d);
}

/// The agent's bridge does not inherit svc's secrets: neither the control token nor a
/// variable svc read a credential from (a tool's `api_key: $NAME`, a provider's fallback
/// variable); `agents.<kind>.env` hands one over on purpose, and other variables pass. Hooks
/// keep the daemon's environment, less the control token.
#[test]
fn the_bridge_gets_none_of_svcs_secrets_unless_handed_over() {
    let dir = TestDir::new("agent-env");
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    fs::write(
        board.join("BOARD-1.md"),
        "---\ntitle: Env\nstate: Todo\n---\ndemo: done\n",
    )
    .unwrap();
    let dump = dir.join("bridge.env");
    let script = dir.write(
        "bridge.sh",
        &format!(
            "#!/bin/sh\nenv > {}\nexec {} demo-agent\n",
            dump.display(),
            svc_bin()
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let hook_dump = dir.join("hook.env");
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\ntools:\n  tracker_a:\n    api_key: $TOOL_KEY\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nhooks:\n  before_run: env > {}\nagent:\n  kind: demo\n  max_turns: 1\nagents:\n  demo:\n    bridge_command: {}\n    env:\n      HANDED_KEY: $HANDED_SOURCE\n      PLAIN: value\nserver:\n  port: 0\n",
            hook_dump.display(),
            script.display()
        ),
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_CONTROL_TOKEN", TOKEN)
        .env("TOOL_KEY", "tool-key-never-for-agents")
        .env("HANDED_SOURCE", "handed-over-on-purpose")
        .env("UNRELATED", "passes");
    let d = Daemon::start(cmd);
    wait_until(60, "the bridge started", || {
        fs::read_to_string(&dump).is_ok_and(|t| t.contains("PATH="))
    });
    let env = fs::read_to_string(&dump).unwrap();
    assert!(
        !env.contains(TOKEN),
        "the control token reached the agent: {env}"
    );
    assert!(!env.contains("tool-key-never-for-agents"), "{env}");
    assert!(env.contains("HANDED_KEY=handed-over-on-purpose"), "{env}");
    assert!(env.contains("PLAIN=value"), "{env}");
    assert!(env.contains("UNRELATED=passes"), "{env}");
    wait_until(30, "the hook ran", || {
        fs::read_to_string(&hook_dump).is_ok_and(|t| t.contains("PATH="))
    });
    let hook_env = fs::read_to_string(&hook_dump).unwrap();
    assert!(
        !hook_env.contains(TOKEN),
        "the control token reached a hook: {hook_env}"
    );
    assert!(hook_env.contains("UNRELATED=passes"), "{hook_env}");
    drop(d);
}
