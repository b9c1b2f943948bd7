//! Fault tests against the real binary: agent bridges that crash at each ACP step, hang, flood or
//! talk garbage (tests/fault_bridge.py); a tracker API that is down, slow or answers garbage;
//! WORKFLOW.md deleted, truncated or unreadable while running; trace files that cannot be
//! written; an issue store locked by another process; and SIGKILL of the daemon. In every case
//! the daemon reports what happened, retries as the spec says, loses nothing and stays up.

mod common;

use common::*;
use serde_json::{Value, json};
use std::fs;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The python3 of the test's own PATH (the daemon's PATH is minimal).
fn python() -> String {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("python3"))
                .find(|p| p.is_file())
        })
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "/usr/bin/python3".into())
}

fn fault_bridge(mode: &str) -> String {
    format!(
        "{} {}/tests/fault_bridge.py {mode}",
        python(),
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A daemon on the memory tracker whose one issue runs the fault bridge in `mode`.
fn bridge_daemon(dir: &TestDir, mode: &str, agent_extra: &str) -> Daemon {
    let front = demo_memory("").replace(
        "bridge_command: svc demo-agent\n",
        &format!("bridge_command: {}\n{agent_extra}", fault_bridge(mode)),
    );
    let wf = workflow_with_description(dir, &front);
    let mut cmd = svc(dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env(
            "SVC_MEMORY_TRACKER_ISSUES_JSON",
            issues_json(&[("F-1", "Todo", &[], "")]),
        )
        .env("FAULT_BRIDGE_PIDS", dir.join("pids"));
    Daemon::start(cmd)
}

fn bridge_pids(dir: &TestDir) -> Vec<i64> {
    fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Waits until no bridge the test started is alive.
fn assert_no_bridge_survives(dir: &TestDir) {
    let pids = bridge_pids(dir);
    assert!(!pids.is_empty(), "the fault bridge ran");
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&p| alive(p)) {
        assert!(
            Instant::now() < deadline,
            "a bridge outlived its run: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn health_ok(d: &Daemon) {
    let (status, _, body) = http("GET", &format!("{}/health", base_url(d)), &[], None);
    assert_eq!(status, 200, "{body}");
}

/// The run failed with an error containing `needle`, a retry is scheduled with backoff, the
/// issue is kept, the bridge is gone and the daemon still serves.
fn assert_failed_and_retried(dir: &TestDir, d: &Daemon, needle: &str) {
    let s = d.wait_for(40, "a retry entry", |s| s["counts"]["retrying"] == 1);
    let r = &s["retrying"][0];
    assert_eq!(r["attempt"], 1, "{r}");
    assert_eq!(r["issue_identifier"], "F-1", "{r}");
    let error = r["error"].as_str().unwrap_or_default();
    assert!(error.contains(needle), "error {error:?} lacks {needle:?}");
    let ev = events(&s);
    assert!(
        ev.contains(&"run_failed".to_string()) || ev.contains(&"run_stalled".to_string()),
        "{ev:?}"
    );
    assert!(ev.contains(&"retry_scheduled".to_string()), "{ev:?}");
    assert_no_bridge_survives(dir);
    health_ok(d);
}

#[test]
fn a_bridge_that_crashes_at_initialize_is_retried() {
    let dir = TestDir::new("fault-crash-init");
    let d = bridge_daemon(&dir, "crash-init", "");
    assert_failed_and_retried(
        &dir,
        &d,
        "agent bridge exited during initialize (exit code 7)",
    );
}

#[test]
fn a_bridge_that_refuses_initialize_is_retried() {
    let dir = TestDir::new("fault-error-init");
    let d = bridge_daemon(&dir, "error-init", "");
    assert_failed_and_retried(
        &dir,
        &d,
        "initialize failed: bridge is misconfigured (code -32000)",
    );
}

#[test]
fn a_bridge_that_never_answers_initialize_stalls_and_is_retried() {
    let dir = TestDir::new("fault-hang-init");
    let d = bridge_daemon(&dir, "hang-init", "    stall_timeout_ms: 800\n");
    assert_failed_and_retried(&dir, &d, "stalled: no agent activity");
}

#[test]
fn a_bridge_that_crashes_at_session_new_is_retried() {
    let dir = TestDir::new("fault-crash-session");
    let d = bridge_daemon(&dir, "crash-session", "");
    assert_failed_and_retried(
        &dir,
        &d,
        "agent bridge exited during session/new (exit code 8)",
    );
}

#[test]
fn a_bridge_that_crashes_mid_turn_is_retried_and_its_output_is_traced() {
    let dir = TestDir::new("fault-crash-turn");
    let d = bridge_daemon(&dir, "crash-mid-turn", "");
    assert_failed_and_retried(
        &dir,
        &d,
        "agent bridge exited during session/prompt (exit code 9)",
    );
    // The trace writer batches: the crashed turn's output reaches the file shortly.
    let trace = || fs::read_to_string(dir.join("traces/id-F-1/trace.jsonl")).unwrap_or_default();
    wait_until(20, "the crashed turn's output in the trace", || {
        trace().contains("chunk 2")
    });
}

#[test]
fn a_bridge_that_closes_stdout_but_lives_is_killed_and_retried() {
    let dir = TestDir::new("fault-close-stdout");
    let d = bridge_daemon(&dir, "close-stdout", "");
    assert_failed_and_retried(&dir, &d, "agent bridge exited during session/prompt");
}

#[test]
fn garbage_between_messages_is_traced_and_the_run_succeeds() {
    let dir = TestDir::new("fault-garbage");
    let d = bridge_daemon(&dir, "garbage", "");
    let s = d.wait_for(60, "the run succeeding", |s| {
        events(s).contains(&"run_succeeded".to_string())
    });
    assert!(
        !events(&s).contains(&"run_failed".to_string()),
        "{:?}",
        events(&s)
    );
    let trace = fs::read_to_string(dir.join("traces/id-F-1/trace.jsonl")).unwrap();
    assert!(trace.contains("this is not json"), "garbage is traced");
    // Every trace line is JSON, whatever the bridge sent.
    for line in trace.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line:.200}"));
    }
    assert_no_bridge_survives(&dir);
    health_ok(&d);
}

#[test]
fn a_flooding_bridge_does_not_stop_the_daemon_serving() {
    let dir = TestDir::new("fault-flood");
    let d = bridge_daemon(&dir, "flood", "");
    let base = base_url(&d);
    // Serve while the flood is on.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (status, _, _) = http("GET", &format!("{base}/api/v1/state"), &[], None);
        assert_eq!(status, 200);
        if d.latest()
            .is_some_and(|s| events(&s).contains(&"run_succeeded".to_string()))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the flooded run never ended\n{}",
            d.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_no_bridge_survives(&dir);
}

// ---- tracker API faults ----

const GOOD: u8 = 0;
const GARBAGE: u8 = 1;
const SLOW: u8 = 2;
const DROP: u8 = 3;

/// A minimal tracker-a GraphQL endpoint (Linear's answer shape) with a switchable fault.
struct FakeTracker {
    url: String,
    mode: Arc<AtomicU8>,
    state: Arc<Mutex<String>>,
}

impl FakeTracker {
    fn start() -> FakeTracker {
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = server.server_addr().to_ip().unwrap().port();
        let fake = FakeTracker {
            url: format!("http://127.0.0.1:{port}/graphql"),
            mode: Arc::default(),
            state: Arc::new(Mutex::new("Todo".into())),
        };
        let (mode, state) = (Arc::clone(&fake.mode), Arc::clone(&fake.state));
        let server = Arc::new(server);
        // A few threads, so a slow answer does not hold up the next request.
        for _ in 0..4 {
            let (server, mode, state) =
                (Arc::clone(&server), Arc::clone(&mode), Arc::clone(&state));
            std::thread::spawn(move || {
                while let Ok(mut req) = server.recv() {
                    let mut body = String::new();
                    let _ = req.as_reader().read_to_string(&mut body);
                    match mode.load(Ordering::SeqCst) {
                        GARBAGE => {
                            let _ = req.respond(tiny_http::Response::from_string(
                                "<html><body>502 Bad Gateway</body></html>",
                            ));
                            continue;
                        }
                        SLOW => {
                            std::thread::sleep(Duration::from_millis(1500));
                        }
                        DROP => {
                            // Close the connection without an answer.
                            drop(req.into_writer());
                            continue;
                        }
                        _ => {}
                    }
                    let v: Value = serde_json::from_str(&body).unwrap_or_default();
                    let vars = &v["variables"];
                    let state = state.lock().unwrap().clone();
                    let node = json!({"id": "uuid-T-1", "identifier": "T-1", "title": "Issue T-1",
                        "description": "demo: slow 600000\ndemo: keep-open", "priority": 1, "url": "https://tracker.example/T-1",
                        "createdAt": "2026-11-01T00:00:00.000Z", "updatedAt": "2026-11-01T00:00:00.000Z",
                        "state": {"name": state, "type": "unstarted"}, "labels": {"nodes": []}});
                    let wanted = vars
                        .pointer("/filter/state/name/in")
                        .and_then(Value::as_array)
                        .is_none_or(|names| names.iter().any(|n| n == &json!(state)));
                    let nodes = if wanted { vec![node] } else { vec![] };
                    let answer = json!({"data": {"issues": {"nodes": nodes, "pageInfo": {"hasNextPage": false, "endCursor": null}}}});
                    let _ = req.respond(tiny_http::Response::from_string(answer.to_string()));
                }
            });
        }
        fake
    }
}

fn poll_failures(s: &Value) -> Vec<String> {
    s["recent_events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "tracker_poll_failed")
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_tracker_that_is_down_slow_or_talks_garbage_is_ridden_out() {
    let dir = TestDir::new("fault-tracker");
    let fake = FakeTracker::start();
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: t\ntrackers:\n  t:\n    provider: tracker-a\n    endpoint: {}\n    api_key: $T_KEY\n    project_slugs: [core]\npolling:\n  interval_ms: 300\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 1\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n",
            fake.url
        ),
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("T_KEY", "t-key-1")
        .env("SVC_TRACKER_TIMEOUT_MS", "400");
    let d = Daemon::start(cmd);
    let s = d.wait_for(30, "T-1 running", |s| running_ids(s) == ["T-1"]);
    let run_id = s["running"][0]["run_id"].clone();
    let mut seen = 0;
    for (mode, needle) in [
        (GARBAGE, "tracker-a"),
        (SLOW, "tracker-a"),
        (DROP, "tracker-a"),
    ] {
        fake.mode.store(mode, Ordering::SeqCst);
        let s = d.wait_for(60, "a failed poll", |s| poll_failures(s).len() > seen);
        let failures = poll_failures(&s);
        seen = failures.len();
        assert!(
            failures.iter().all(|m| m.contains(needle)),
            "poll failures name the tracker: {failures:?}"
        );
        // The run is left alone and the daemon answers.
        assert_eq!(running_ids(&s), ["T-1"]);
        assert_eq!(
            s["running"][0]["run_id"], run_id,
            "the run was not restarted"
        );
        health_ok(&d);
    }
    let s = d.latest().unwrap();
    let all = poll_failures(&s).join("\n");
    assert!(
        all.contains("timed out") || all.contains("imeout"),
        "a slow tracker is reported as a timeout: {all}"
    );
    // Back to good: the daemon sees the issue finish and stops its run.
    fake.mode.store(GOOD, Ordering::SeqCst);
    *fake.state.lock().unwrap() = "Done".into();
    d.wait_for(60, "the run stopped after recovery", |s| {
        s["counts"]["running"] == 0
    });
    health_ok(&d);
}

// ---- WORKFLOW.md faults ----

#[test]
fn a_workflow_deleted_truncated_or_unreadable_keeps_the_last_good_settings() {
    let dir = TestDir::new("fault-workflow");
    let good = format!(
        "---\n{}\n---\nWork on {{{{ issue.identifier }}}}.\n{{{{ issue.description }}}}\n",
        demo_memory("")
    );
    let wf = dir.write("WORKFLOW.md", &good);
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf).env(
        "SVC_MEMORY_TRACKER_ISSUES_JSON",
        issues_json(&[("W-1", "Todo", &[], "demo: slow 600000")]),
    );
    let d = Daemon::start(cmd);
    let s = d.wait_for(30, "W-1 running", |s| running_ids(s) == ["W-1"]);
    let run_id = s["running"][0]["run_id"].clone();
    let reload_failures = |s: &Value| -> Vec<String> {
        s["recent_events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["event"] == "workflow_reload_failed")
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let seen = std::cell::Cell::new(0);
    let check = |what: &str, needle: &str| {
        let s = d.wait_for(30, what, |s| reload_failures(s).len() > seen.get());
        let failures = reload_failures(&s);
        seen.set(failures.len());
        assert!(
            failures[0].contains(needle) && failures[0].contains("keeping the last good settings"),
            "{what}: {failures:?}"
        );
        assert_eq!(running_ids(&s), ["W-1"], "{what}: the run goes on");
        assert_eq!(s["running"][0]["run_id"], run_id, "{what}");
        health_ok(&d);
    };
    fs::remove_file(&wf).unwrap();
    check("deleted", "cannot read workflow file");
    // Reported once, not at every poll.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        reload_failures(&d.latest().unwrap()).len(),
        seen.get(),
        "reported once"
    );
    fs::write(&wf, &good[..good.len() / 3]).unwrap();
    check("truncated", "WORKFLOW.md");
    fs::write(&wf, b"---\ntracker:\n  kind: memory\n\xff\xfe\n---\n").unwrap();
    check("not UTF-8", "cannot read workflow file");
    fs::remove_file(&wf).unwrap();
    fs::create_dir(&wf).unwrap();
    check("a directory", "cannot read workflow file");
    fs::remove_dir(&wf).unwrap();
    // SAFETY: geteuid has no effects.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        fs::write(&wf, &good).unwrap();
        fs::set_permissions(&wf, fs::Permissions::from_mode(0o000)).unwrap();
        check("unreadable", "Permission denied");
        fs::set_permissions(&wf, fs::Permissions::from_mode(0o644)).unwrap();
    }
    // A good file again (with a change) is applied, and the run still goes on.
    fs::write(&wf, good.replace("interval_ms: 200", "interval_ms: 250")).unwrap();
    d.wait_log(30, "reloaded");
    let s = d.latest().unwrap();
    assert_eq!(running_ids(&s), ["W-1"]);
    assert_eq!(s["running"][0]["run_id"], run_id);
}

// ---- trace files that cannot be written ----

#[test]
fn an_unwritable_trace_file_is_reported_and_runs_go_on() {
    let dir = TestDir::new("fault-trace");
    // The issue's trace directory is a regular file: the writer cannot create trace.jsonl,
    // whoever runs the test (root ignores permission bits, not this).
    fs::create_dir_all(dir.join("traces")).unwrap();
    fs::write(dir.join("traces/id-R-1"), "in the way").unwrap();
    let wf = workflow_with_description(&dir, &demo_memory(""));
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf).env(
        "SVC_MEMORY_TRACKER_ISSUES_JSON",
        issues_json(&[("R-1", "Todo", &[], "")]),
    );
    let d = Daemon::start(cmd);
    let s = d.wait_for(30, "a trace failure and a finished run", |s| {
        let ev = events(s);
        ev.contains(&"trace_write_failed".to_string()) && ev.contains(&"run_succeeded".to_string())
    });
    let notice = s["recent_events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "trace_write_failed")
        .unwrap();
    assert!(
        notice["message"]
            .as_str()
            .unwrap()
            .contains("traces/id-R-1/trace.jsonl"),
        "{notice}"
    );
    health_ok(&d);
    // Once the path is free, the next run's trace is written (continuations keep running).
    fs::remove_file(dir.join("traces/id-R-1")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dir.join("traces/id-R-1/trace.jsonl").is_file() {
        assert!(Instant::now() < deadline, "traces never resumed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---- the issue store locked by another process ----

/// A python process holding a write lock on an SQLite file until its stdin closes.
fn lock_sqlite(path: &std::path::Path) -> std::process::Child {
    use std::io::BufRead;
    let script = "import sqlite3, sys\n\
        con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n\
        con.execute('CREATE TABLE IF NOT EXISTS held (x)')\n\
        con.execute('BEGIN EXCLUSIVE')\n\
        con.execute('INSERT INTO held VALUES (1)')\n\
        print('locked', flush=True)\n\
        sys.stdin.read()\n\
        con.execute('ROLLBACK')\n";
    let mut child = std::process::Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    child
}

fn store_daemon(dir: &TestDir) -> (Daemon, std::path::PathBuf) {
    fs::create_dir_all(dir.join("board")).unwrap();
    let wf = workflow_with_description(
        dir,
        "tracker:\n  kind: local\n  path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 1\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n  issue_store_path: store/issues.db\n",
    );
    let mut cmd = svc(dir);
    cmd.arg("--no-tui").arg(&wf);
    (Daemon::start(cmd), wf)
}

fn recent_identifiers(base: &str) -> Vec<String> {
    let body: Value =
        serde_json::from_str(&http("GET", &format!("{base}/api/v1/issues/recent"), &[], None).2)
            .unwrap_or_default();
    body["issues"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| i["identifier"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_store_locked_at_start_is_reported_and_the_daemon_runs_on() {
    let dir = TestDir::new("fault-store-start");
    fs::create_dir_all(dir.join("store")).unwrap();
    let mut locker = lock_sqlite(&dir.join("store/issues.db"));
    let (d, _) = store_daemon(&dir);
    let s = d.wait_for(30, "the store reported", |s| {
        events(s).contains(&"issue_store_unavailable".to_string())
    });
    let message = s["recent_events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "issue_store_unavailable")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("is locked by another process"),
        "{message}"
    );
    health_ok(&d);
    // Work goes on without the store.
    fs::write(
        dir.join("board/BOARD-1.md"),
        "---\ntitle: Locked store\nstate: Todo\n---\nx\n",
    )
    .unwrap();
    d.wait_for(30, "the issue done", |s| {
        events(s).contains(&"run_succeeded".to_string())
    });
    drop(locker.stdin.take());
    let _ = locker.wait();
}

#[test]
fn a_store_locked_while_running_loses_nothing() {
    let dir = TestDir::new("fault-store-run");
    let (d, _) = store_daemon(&dir);
    let base = base_url(&d);
    // The store exists (WAL) and answers; now another process takes its write lock.
    assert!(recent_identifiers(&base).is_empty());
    let mut locker = lock_sqlite(&dir.join("store/issues.db"));
    fs::write(
        dir.join("board/BOARD-1.md"),
        "---\ntitle: Held back\nstate: Todo\n---\nx\n",
    )
    .unwrap();
    d.wait_for(30, "a failed store write", |s| {
        events(s).contains(&"issue_store_write_failed".to_string())
    });
    assert!(recent_identifiers(&base).is_empty());
    health_ok(&d);
    // The lock goes away: the held issue is written.
    drop(locker.stdin.take());
    let _ = locker.wait();
    d.wait_for(30, "the store recovered", |s| {
        events(s).contains(&"issue_store_recovered".to_string())
    });
    assert_eq!(recent_identifiers(&base), ["BOARD-1"]);
}

// ---- SIGKILL ----

fn pids_in(path: &std::path::Path) -> Vec<i64> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
fn after_sigkill_nothing_lives_on_and_the_next_start_finds_every_file_sound() {
    let dir = TestDir::new("fault-sigkill");
    fs::create_dir_all(dir.join("board")).unwrap();
    // Half the issues cycle for ever (continuations), half are completed by the agent through
    // MCP, so board files are being rewritten while the daemon is killed.
    for n in 1..=12 {
        let keep = if n % 2 == 0 { "demo: keep-open\n" } else { "" };
        fs::write(
            dir.join(&format!("board/BOARD-{n}.md")),
            format!(
                "---\ntitle: Issue {n}\nstate: Todo\n---\ndemo: flood 300\ndemo: slow {}\n{keep}",
                100 * n
            ),
        )
        .unwrap();
    }
    let hook_pids = dir.join("hook-pids");
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: local\n  path: board\npolling:\n  interval_ms: 100\nworkspace:\n  root: ws\nhooks:\n  before_run: \"sleep 300 & echo $! >> {}; sleep 0.5\"\nagent:\n  kind: demo\n  max_turns: 2\n  max_concurrent_agents: 4\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n  issue_store_path: store/issues.db\n",
            hook_pids.display()
        ),
    );
    let start = || {
        let mut cmd = svc(&dir);
        cmd.arg("--no-tui").arg(&wf);
        Daemon::start(cmd)
    };
    let mut escaped = Vec::new();
    // Kill it three times, each time while bridges run and a hook is in the middle of its work.
    for round in 1..=3 {
        let mut d = start();
        let deadline = Instant::now() + Duration::from_secs(40);
        let (bridges, hook_children) = loop {
            let bridges: Vec<i64> = d
                .latest()
                .map(|s| {
                    s["running"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter_map(|r| r["executor_pid"].as_i64())
                        .collect()
                })
                .unwrap_or_default();
            let hook_children: Vec<i64> = pids_in(&hook_pids)
                .into_iter()
                .filter(|&p| alive(p))
                .collect();
            if !bridges.is_empty() && !hook_children.is_empty() {
                break (bridges, hook_children);
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: never saw bridges and a hook at once\n{}",
                d.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            !d.stderr().contains("already running"),
            "round {round}: the lock of the killed daemon is taken over\n{}",
            d.stderr()
        );
        d.signal(libc::SIGKILL);
        let _ = d.wait_exit(10);
        std::thread::sleep(Duration::from_millis(300));
        for pid in &bridges {
            assert!(
                !alive(*pid),
                "round {round}: bridge {pid} died with the daemon"
            );
        }
        escaped.extend(hook_children.into_iter().filter(|&p| alive(p)));
    }
    // A hook's own children are beyond the parent-death signal; the next start reaps them.
    assert!(!escaped.is_empty(), "a hook child outlived a killed daemon");
    let d = start();
    let deadline = Instant::now() + Duration::from_secs(10);
    while escaped.iter().any(|&p| alive(p)) {
        assert!(
            Instant::now() < deadline,
            "hook children of killed daemons live on: {escaped:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    d.wait_log(10, "orphaned process(es) of an earlier daemon");
    let base = base_url(&d);
    // The store opens and answers.
    let (status, _, body) = http(
        "GET",
        &format!("{base}/api/v1/issues/recent?limit=20"),
        &[],
        None,
    );
    assert_eq!(status, 200, "{body}");
    assert!(!d.stderr().contains("issue store"), "{}", d.stderr());
    drop(d);
    // Board: every file parses (doctor skips none) and no temp file is left.
    let doctor = run(svc(&dir).arg("doctor").arg("--json").arg(&wf));
    assert!(
        !doctor.stdout.contains("tracker_board_file"),
        "{}",
        doctor.stdout
    );
    for entry in fs::read_dir(dir.join("board")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        assert!(
            name.ends_with(".md") || name == ".board.lock",
            "a leftover file on the board: {name}"
        );
    }
    // Traces: every line of every file is a whole JSON object.
    let mut lines = 0;
    for entry in fs::read_dir(dir.join("traces")).unwrap() {
        let file = entry.unwrap().path().join("trace.jsonl");
        for line in fs::read_to_string(&file).unwrap_or_default().lines() {
            serde_json::from_str::<Value>(line)
                .unwrap_or_else(|e| panic!("{}: {e}: {line:.200}", file.display()));
            lines += 1;
        }
    }
    assert!(lines > 0);
}

// ---- hooks ----

#[test]
fn a_hook_that_hangs_ignores_sigterm_and_forks_is_killed_with_its_whole_tree() {
    let dir = TestDir::new("fault-hook");
    let pids = dir.join("hook-pids");
    // SIGTERM is ignored by the hook and, inherited through exec, by every process it forks,
    // two levels deep: only the SIGKILL after the grace period ends them.
    let script = format!(
        "trap '' TERM; (sleep 120 & echo $! >> {p}; (sleep 120 & echo $! >> {p}; wait) & wait) & echo $$ >> {p}; wait",
        p = pids.display()
    );
    let wf = workflow_with_description(
        &dir,
        &demo_memory(&format!(
            "hooks:\n  timeout_ms: 300\n  before_run: \"{script}\"\n"
        )),
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf).env(
        "SVC_MEMORY_TRACKER_ISSUES_JSON",
        issues_json(&[("H-1", "Todo", &[], "")]),
    );
    let d = Daemon::start(cmd);
    let s = d.wait_for(40, "a retry after the hook timeout", |s| {
        s["counts"]["retrying"] == 1
    });
    let r = &s["retrying"][0];
    assert_eq!(r["attempt"], 1, "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("hook before_run timed out after 300 ms"),
        "{r}"
    );
    assert!(
        events(&s).contains(&"hook_failed".to_string()),
        "{:?}",
        events(&s)
    );
    let tree = pids_in(&pids);
    assert!(tree.len() >= 3, "the hook forked: {tree:?}");
    for pid in tree {
        assert!(dead_soon(pid), "process {pid} of the hook's tree survived");
    }
    health_ok(&d);
}

/// A steering message is reported delivered only once the prompt that carries it was written:
/// when the bridge no longer reads (its stdin closed after the first turn), the steering turn
/// cannot be sent, the run fails, and the message goes with the next run's first prompt.
#[test]
fn a_steering_message_whose_prompt_cannot_be_written_waits_for_the_next_run() {
    let dir = TestDir::new("fault-steer-unsent");
    let front = demo_memory("")
        .replace("max_turns: 1", "max_turns: 3")
        .replace(
            "bridge_command: svc demo-agent\n",
            &format!(
                "bridge_command: {}\n",
                fault_bridge("close-stdin-after-turn")
            ),
        );
    let wf = workflow_with_description(&dir, &front);
    let prompts = dir.join("prompts.jsonl");
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env(
            "SVC_MEMORY_TRACKER_ISSUES_JSON",
            issues_json(&[("F-1", "Todo", &[], "")]),
        )
        .env("FAULT_BRIDGE_PIDS", dir.join("pids"))
        .env("FAULT_BRIDGE_PROMPTS", &prompts)
        .env("SVC_CONTROL_TOKEN", "fault-steer-token");
    let d = Daemon::start(cmd);
    let base = base_url(&d);
    let read = || fs::read_to_string(&prompts).unwrap_or_default();
    wait_until(30, "the first prompt", || !read().is_empty());
    let (status, _, body) = http(
        "POST",
        &format!("{base}/api/v1/F-1/steer"),
        &[
            ("Authorization", "Bearer fault-steer-token"),
            ("Content-Type", "application/json"),
        ],
        Some(r#"{"message": "Sent while the pipe breaks", "author": "ann"}"#),
    );
    assert_eq!(status, 202, "{body}");
    wait_until(60, "the message in a later prompt", || {
        read().contains("Sent while the pipe breaks")
    });
    drop(d);
}
