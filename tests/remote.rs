//! Remote execution against a real OpenSSH server on 127.0.0.1 (tests/common/sshd.rs): runs on
//! `worker.ssh_hosts` and `static-ssh` hosts whose workspace, hooks and agent provably execute
//! over SSH, the per-host cap, a hung remote command, an unreachable host, the reverse tunnel
//! (shared, killed and restored) and per-run claims on `server.mcp_port`.

mod common;

use common::sshd::Sshd;
use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn issue(title: &str, body: &str) -> String {
    format!("---\ntitle: {title}\nstate: Todo\n---\n{body}\n")
}

/// A board, a workflow running the demo agent on remote workers (`worker` is the worker
/// section), and a daemon whose ssh uses the harness's config.
fn remote_daemon(
    dir: &TestDir,
    sshd: &Sshd,
    worker: &str,
    extra: &str,
    issues: &[(&str, &str)],
) -> (Daemon, PathBuf, u16) {
    let bridge = format!(
        "env SVC_DEMO_AGENT_RECORD={} {} demo-agent",
        dir.join("sessions.jsonl").display(),
        svc_bin()
    );
    remote_daemon_with(dir, sshd, worker, extra, issues, &bridge)
}

/// [`remote_daemon`] with a bridge command of the test's own.
fn remote_daemon_with(
    dir: &TestDir,
    sshd: &Sshd,
    worker: &str,
    extra: &str,
    issues: &[(&str, &str)],
    bridge: &str,
) -> (Daemon, PathBuf, u16) {
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    for (file, text) in issues {
        fs::write(board.join(file), text).unwrap();
    }
    let mcp_port = free_port();
    let wf = workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: {root}\nagent:\n  kind: demo\n  max_turns: 2\nagents:\n  demo:\n    bridge_command: {bridge}\nserver:\n  port: 0\n  mcp_port: {mcp_port}\n  trace_dir: traces\n{worker}{extra}",
            root = dir.join("remote-ws").display(),
        ),
    );
    let mut cmd = svc(dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_SSH_CONFIG", &sshd.config);
    (Daemon::start(cmd), wf, mcp_port)
}

/// The processes whose command line contains every one of `parts`.
fn processes_with(parts: &[&str]) -> Vec<i64> {
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i64>() else {
            continue;
        };
        let Ok(raw) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if parts.iter().all(|p| cmdline.contains(p)) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// The live processes whose environment carries `SVC_TEST_MARK=<mark>`: on the worker (this
/// machine's sshd), whatever a remote command started, however it left its group.
fn marked(mark: &str) -> Vec<i64> {
    let needle = format!("SVC_TEST_MARK={mark}");
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i64>() else {
            continue;
        };
        let Ok(raw) = fs::read(entry.path().join("environ")) else {
            continue;
        };
        if raw.split(|b| *b == 0).any(|v| v == needle.as_bytes()) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// A bridge command whose processes carry `SVC_TEST_MARK=<mark>`: a script that leaves a
/// `sleep` of its own running (it does not read stdin, so only a kill ends it), then execs the
/// demo agent.
fn marked_bridge(dir: &TestDir, mark: &str) -> String {
    let script = dir.write(
        &format!("bridge-{mark}.sh"),
        &format!("#!/bin/sh\nsleep 1000 &\nexec {} demo-agent\n", svc_bin()),
    );
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    format!("env SVC_TEST_MARK={mark} {}", script.display())
}

fn wait_unmarked(mark: &str, what: &str) {
    // The lifeline's SIGTERM ends these at once; 12 s also covers the SIGKILL after the grace.
    wait_until(12, what, || marked(mark).is_empty());
}

fn recorded_sessions(dir: &TestDir) -> Vec<Value> {
    fs::read_to_string(dir.join("sessions.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn mcp_call(url: &str, token: &str) -> u16 {
    http(
        "POST",
        url,
        &[
            ("Authorization", &format!("Bearer {token}")),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ],
        Some(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
    )
    .0
}

#[test]
fn runs_on_ssh_hosts_execute_there_with_a_per_host_cap_and_reach_mcp_through_the_tunnel() {
    let dir = TestDir::new("remote-static");
    let Some(sshd) = Sshd::start_or_skip(&dir.join("sshd"), &["w1", "w2"]) else {
        return;
    };
    let hooks = "hooks:\n  after_create: echo \"$SSH_CONNECTION\" > ../created-$SVC_ISSUE_IDENTIFIER.txt\n  before_run: echo \"$SSH_CONNECTION|$SVC_WORKSPACE|$(pwd)\" > ../run-$SVC_ISSUE_IDENTIFIER.txt\n";
    let (d, _, mcp_port) = remote_daemon(
        &dir,
        &sshd,
        "worker:\n  ssh_hosts: [w1, w2]\n  max_concurrent_agents_per_host: 1\n",
        hooks,
        &[
            ("BOARD-1.md", &issue("One", "demo: slow 2500")),
            ("BOARD-2.md", &issue("Two", "demo: slow 2500")),
            ("BOARD-3.md", &issue("Three", "demo: slow 500")),
        ],
    );
    // Two hosts, one run each: the third issue waits for a host.
    let s = d.wait_for(30, "a run on each host and one blocked", |s| {
        let hosts: Vec<&str> = s["running"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["worker_host"].as_str())
            .collect();
        hosts.contains(&"w1")
            && hosts.contains(&"w2")
            && s["blocked"][0]["reason"] == "worker_host_capacity"
            && s["running"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["executor_pid"].is_u64())
    });
    // The bridge is an ssh process: the agent runs on the worker.
    for r in s["running"].as_array().unwrap() {
        let pid = r["executor_pid"].as_i64().unwrap();
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(cmdline.starts_with("ssh "), "{cmdline}");
        assert!(
            r["workspace_path"]
                .as_str()
                .unwrap()
                .starts_with(&dir.join("remote-ws").display().to_string())
        );
    }
    // One reverse tunnel per host towards mcp_port.
    let forward = format!("127.0.0.1:{mcp_port}");
    wait_until(10, "a tunnel per host", || {
        processes_with(&["ssh", "-N", &forward]).len() == 2
    });
    wait_until(90, "every issue done through MCP", || {
        ["BOARD-1.md", "BOARD-2.md", "BOARD-3.md"]
            .iter()
            .all(|f| board_state(&dir, f) == "Done")
    });
    // Workspace and hooks ran over SSH.
    let created = fs::read_to_string(dir.join("remote-ws/created-BOARD-1.txt")).unwrap();
    assert!(
        created.starts_with("127.0.0.1 "),
        "SSH_CONNECTION: {created:?}"
    );
    let ran = fs::read_to_string(dir.join("remote-ws/run-BOARD-1.txt")).unwrap();
    let fields: Vec<&str> = ran.trim().split('|').collect();
    assert!(fields[0].contains(&format!(" {}", sshd.port)), "{ran}");
    assert_eq!(
        fields[1], fields[2],
        "SVC_WORKSPACE is the remote cwd: {ran}"
    );
    // Done issues lose their workspace on the worker (removed over SSH).
    wait_until(20, "the remote workspaces removed", || {
        ["BOARD-1", "BOARD-2", "BOARD-3"]
            .iter()
            .all(|i| !dir.join("remote-ws").join(i).exists())
    });
    // Every agent got a per-run claim on the tunnel, never the settings-scoped token.
    let sessions = recorded_sessions(&dir);
    assert!(sessions.len() >= 3, "{sessions:?}");
    let mut tokens = std::collections::BTreeSet::new();
    for s in &sessions {
        let server = &s["params"]["mcpServers"][0];
        assert!(
            server["url"]
                .as_str()
                .unwrap()
                .starts_with("http://127.0.0.1:"),
            "{server}"
        );
        assert_ne!(
            server["url"].as_str().unwrap(),
            format!("http://127.0.0.1:{mcp_port}/mcp")
        );
        tokens.insert(server["headers"][0]["value"].as_str().unwrap().to_string());
    }
    assert_eq!(tokens.len(), sessions.len(), "distinct claims");
    // Settled runs' claims are refused on mcp_port; the tunnels went with the last runs.
    let claim = sessions[0]["params"]["mcpServers"][0]["headers"][0]["value"]
        .as_str()
        .unwrap()
        .trim_start_matches("Bearer ")
        .to_string();
    let url = format!("http://127.0.0.1:{mcp_port}/mcp");
    wait_until(10, "the first run settled", || {
        mcp_call(&url, &claim) == 401
    });
    wait_until(10, "the tunnels down", || {
        processes_with(&["ssh", "-N", &forward]).is_empty()
    });
    drop(d);
    drop(sshd);
}

#[test]
fn co_resident_runs_share_one_tunnel_with_distinct_claims_and_survive_its_death() {
    let dir = TestDir::new("remote-coresident");
    let Some(sshd) = Sshd::start_or_skip(&dir.join("sshd"), &["w1"]) else {
        return;
    };
    let (d, _, mcp_port) = remote_daemon(
        &dir,
        &sshd,
        "worker:\n  kind: box\n  worker_pool:\n    max: 1\n    max_in_flight: 2\n    co_residence: true\nworkers:\n  box:\n    driver: static-ssh\n    ssh_hosts: [w1]\n",
        "",
        &[
            ("BOARD-1.md", &issue("One", "demo: slow 4000")),
            ("BOARD-2.md", &issue("Two", "demo: slow 4000")),
        ],
    );
    d.wait_for(30, "two runs on one host", |s| {
        s["running"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["worker_host"] == "w1" && r["executor_pid"].is_u64())
            .count()
            == 2
    });
    let forward = format!("127.0.0.1:{mcp_port}");
    wait_until(10, "one shared tunnel", || {
        processes_with(&["ssh", "-N", &forward]).len() == 1
    });
    wait_until(10, "both sessions recorded", || {
        recorded_sessions(&dir).len() == 2
    });
    let sessions = recorded_sessions(&dir);
    let token = |i: usize| sessions[i]["params"]["mcpServers"][0]["headers"][0]["value"].clone();
    assert!(token(0).is_string(), "{sessions:?}\n{}", d.stderr());
    assert_ne!(token(0), token(1), "distinct claims");
    assert_eq!(
        sessions[0]["params"]["mcpServers"][0]["url"],
        sessions[1]["params"]["mcpServers"][0]["url"],
        "one tunnel, one port"
    );
    // Kill the tunnel mid-run: it comes back on the same port and both agents still finish
    // through it.
    for pid in processes_with(&["ssh", "-N", &forward]) {
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    d.wait_log(20, "restored on port");
    wait_until(60, "both issues done", || {
        board_state(&dir, "BOARD-1.md") == "Done" && board_state(&dir, "BOARD-2.md") == "Done"
    });
    drop(d);
    drop(sshd);
}

#[test]
fn a_hung_remote_command_is_killed_and_an_unreachable_host_is_reported() {
    let dir = TestDir::new("remote-failures");
    let Some(sshd) = Sshd::start_or_skip(&dir.join("sshd"), &["w1"]) else {
        return;
    };
    // A host whose connection never completes: the remote command hangs until
    // ssh_timeout_ms, then its whole process group (ssh and its proxy) is killed.
    let config = fs::read_to_string(&sshd.config).unwrap();
    let hung_marker = dir.join("hung.pid");
    let with_hung = format!(
        "{config}\nHost hung\n  HostName 127.0.0.1\n  ProxyCommand sh -c 'echo $$ >> {}; exec sleep 600'\n  BatchMode yes\n",
        hung_marker.display()
    );
    let hung_config = dir.write("hung_config", &with_hung);
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    fs::write(board.join("BOARD-1.md"), issue("Hung", "")).unwrap();
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: {}\nagent:\n  kind: demo\nagents:\n  demo:\n    bridge_command: {} demo-agent\nserver:\n  port: 0\nworker:\n  ssh_hosts: [hung, unreachable]\n  ssh_timeout_ms: 800\n  worker_pool:\n    acquire_timeout_ms: 3000\n",
            dir.join("remote-ws").display(),
            svc_bin()
        ),
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_SSH_CONFIG", &hung_config);
    let d = Daemon::start(cmd);
    // The unreachable host's probe fails with ssh's own words; the hung one's times out.
    let probe_failed = |needle: &str| {
        d.stderr()
            .lines()
            .any(|l| l.contains("worker_pool_probe_failed") && l.contains(needle))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(probe_failed("Connection refused") && probe_failed("no answer within 800 ms")) {
        assert!(
            Instant::now() < deadline,
            "both probe failures reported\n{}",
            d.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The run only reserves: no host could take it.
    let s = d.latest().unwrap();
    assert!(
        s["running"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["reserving"] == true && r["executor_pid"].is_null()),
        "{s}"
    );
    // A host that keeps failing is not churned: provisioning backs off.
    assert!(d.stderr().contains("next machine in"), "{}", d.stderr());
    // Nothing of the hung connection is left: ssh_timeout_ms killed the group.
    wait_until(15, "the hung proxies killed", || {
        fs::read_to_string(&hung_marker)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<i64>().ok())
            .all(|p| !alive(p))
    });
    // The run waiting for a host fails at the acquire timeout and is retried.
    let s = d.wait_for(30, "the run retried", |s| s["counts"]["retrying"] == 1);
    assert!(
        s["retrying"][0]["error"]
            .as_str()
            .unwrap()
            .contains("no worker slot"),
        "{s}"
    );
    drop(d);
    drop(sshd);
}

#[test]
fn remote_workspace_roots_expand_against_the_workers_home() {
    let dir = TestDir::new("remote-home");
    let Some(sshd) = Sshd::start_or_skip(&dir.join("sshd"), &["w1"]) else {
        return;
    };
    let home = String::from_utf8(sshd.ssh("w1", "printf %s \"$HOME\"").stdout).unwrap();
    let unique = format!("svc-test-ws-{}", std::process::id());
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    fs::write(board.join("BOARD-1.md"), issue("Home", "demo: keep-open")).unwrap();
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: ~/{unique}\nagent:\n  kind: demo\n  max_turns: 1\nagents:\n  demo:\n    bridge_command: {} demo-agent\nserver:\n  port: 0\nworker:\n  ssh_hosts: [w1]\n",
            svc_bin()
        ),
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_SSH_CONFIG", &sshd.config);
    let d = Daemon::start(cmd);
    let expected = Path::new(&home).join(&unique).join("BOARD-1");
    let s = d.wait_for(30, "a remote run", |s| {
        s["running"][0]["worker_host"] == "w1" && s["running"][0]["executor_pid"].is_u64()
    });
    assert_eq!(
        s["running"][0]["workspace_path"],
        expected.display().to_string()
    );
    wait_until(30, "the workspace on the worker", || {
        expected.join("DEMO.md").exists()
    });
    // The local HOME of svc (the test's) holds no workspace.
    assert!(!dir.join("home").join(&unique).exists());
    drop(d);
    let _ = fs::remove_dir_all(Path::new(&home).join(&unique));
    drop(sshd);
}

#[test]
fn doctor_checks_ssh_and_each_static_host() {
    let dir = TestDir::new("remote-doctor");
    let Some(sshd) = Sshd::start_or_skip(&dir.join("sshd"), &["w1"]) else {
        return;
    };
    let wf = workflow(
        &dir,
        "tracker:\n  kind: memory\nworker:\n  ssh_hosts: [w1, unreachable]\n  ssh_timeout_ms: 5000\n",
    );
    let r = run(svc(&dir)
        .args(["doctor", "--online"])
        .arg(&wf)
        .env("SVC_SSH_CONFIG", &sshd.config));
    assert!(r.stdout.contains("OpenSSH client at"), "{}", r.all());
    assert!(r.stdout.contains("is readable"), "{}", r.all());
    assert!(r.stdout.contains("w1 answers over SSH"), "{}", r.all());
    assert!(r.stdout.contains("Connection refused"), "{}", r.all());
    assert_ne!(r.code, Some(0));
    drop(sshd);
}

#[test]
fn the_settings_scoped_token_is_refused_on_mcp_port() {
    // A local run gets the settings-scoped token (Token A): good on the dashboard's /mcp, never
    // on the claims-only listener.
    let dir = TestDir::new("remote-token-a");
    let mcp_port = free_port();
    let record = dir.join("sessions.jsonl");
    // demo_memory ends with the server section: mcp_port goes under it.
    let wf = workflow_with_description(&dir, &demo_memory(&format!("  mcp_port: {mcp_port}\n")));
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_DEMO_AGENT_RECORD", &record)
        .env(
            "SVC_MEMORY_TRACKER_ISSUES_JSON",
            issues_json(&[("L-1", "Todo", &[], "demo: slow 3000")]),
        );
    let d = Daemon::start(cmd);
    wait_until(20, "a recorded session", || {
        !recorded_sessions(&dir).is_empty()
    });
    let server = recorded_sessions(&dir)[0]["params"]["mcpServers"][0].clone();
    let token = server["headers"][0]["value"]
        .as_str()
        .unwrap()
        .trim_start_matches("Bearer ")
        .to_string();
    let dashboard = server["url"].as_str().unwrap().to_string();
    assert_eq!(
        mcp_call(&dashboard, &token),
        200,
        "Token A on the dashboard"
    );
    assert_eq!(
        mcp_call(&format!("http://127.0.0.1:{mcp_port}/mcp"), &token),
        401,
        "Token A on mcp_port"
    );
    // The claims listener serves nothing else.
    let (status, _, _) = http(
        "GET",
        &format!("http://127.0.0.1:{mcp_port}/api/v1/state"),
        &[],
        None,
    );
    assert_eq!(status, 404);
    drop(d);
}

/// A hook past its timeout and the bridge of a cancelled run end on the worker, not only their
/// local `ssh`: their remote process groups (including children that ignore stdin) are gone.
#[test]
fn a_timed_out_hook_and_a_cancelled_runs_bridge_leave_nothing_on_the_worker() {
    let dir = TestDir::new("remote-leftovers");
    let Some(sshd) = Sshd::start_or_skip(&dir.join("sshd"), &["w1"]) else {
        return;
    };
    // BOARD-1's first before_run hangs with a background child; later attempts pass. (Its 3 s
    // are the window in which the test must see it on the worker, which a loaded machine needs.)
    let hooks = "hooks:\n  timeout_ms: 3000\n  before_run: if [ \"$SVC_ISSUE_IDENTIFIER\" = BOARD-1 ] && [ ! -e ../hooked ]; then touch ../hooked; export SVC_TEST_MARK=hook; echo $$ >> ../hook-pids; sleep 1000 & sleep 1000; fi\n";
    let (d, _, _) = remote_daemon_with(
        &dir,
        &sshd,
        "worker:\n  ssh_hosts: [w1]\n",
        hooks,
        &[
            ("BOARD-1.md", &issue("Hook", "")),
            ("BOARD-2.md", &issue("Stalls", "demo: stall")),
        ],
        &marked_bridge(&dir, "bridge"),
    );
    wait_until(30, "the hook started on the worker", || {
        !marked("hook").is_empty()
    });
    d.wait_log(20, "hook before_run timed out after 3000 ms on w1");
    wait_unmarked(
        "hook",
        "the timed-out hook's processes gone from the worker",
    );

    // BOARD-2's agent stalls; its bridge (and the bridge's own child) run on the worker.
    d.wait_for(30, "BOARD-2 running", |s| {
        s["running"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["issue_identifier"] == "BOARD-2" && r["executor_pid"].is_u64())
    });
    wait_until(20, "the bridge and its child on the worker", || {
        marked("bridge").len() >= 2
    });
    let board = dir.join("board/BOARD-2.md");
    let text = fs::read_to_string(&board).unwrap();
    fs::write(
        &board,
        text.replace("state: Todo", "state: Done")
            .replace("state: In Progress", "state: Done"),
    )
    .unwrap();
    d.wait_for(30, "BOARD-2 cancelled", |s| {
        !running_ids(s).iter().any(|i| i == "BOARD-2")
    });
    wait_unmarked("bridge", "the cancelled run's bridge gone from the worker");
    drop(d);
    drop(sshd);
}

/// The daemon's stop (SIGTERM) and its death (SIGKILL) end a remote run's processes on the
/// worker: the first through the stop's group kill, the second because the local `ssh` dies
/// with the daemon and the worker's guard ends the group when the connection drops.
#[test]
fn a_stopped_or_killed_daemon_leaves_nothing_on_the_worker() {
    let dir = TestDir::new("remote-daemon-end");
    let Some(sshd) = Sshd::start_or_skip(&dir.join("sshd"), &["w1"]) else {
        return;
    };
    for (sig, mark) in [(libc::SIGTERM, "term"), (libc::SIGKILL, "kill")] {
        let (mut d, _, _) = remote_daemon_with(
            &dir,
            &sshd,
            "worker:\n  ssh_hosts: [w1]\n",
            "",
            &[("BOARD-1.md", &issue("Stalls", "demo: stall"))],
            &marked_bridge(&dir, mark),
        );
        wait_until(30, "the bridge and its child on the worker", || {
            marked(mark).len() >= 2
        });
        d.signal(sig);
        d.wait_exit(15);
        wait_unmarked(mark, "the run's processes gone from the worker");
    }
    drop(sshd);
}

/// A reload that swaps the local driver for `worker.ssh_hosts` while a run holds the local
/// machine: the next issue gets a machine of the new driver at once, and the old run goes on.
#[test]
fn a_reload_that_swaps_the_driver_dispatches_the_next_run_at_once() {
    let dir = TestDir::new("remote-swap");
    let Some(sshd) = Sshd::start_or_skip(&dir.join("sshd"), &["w1"]) else {
        return;
    };
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    for f in ["BOARD-1.md", "BOARD-2.md"] {
        fs::write(board.join(f), issue("Slow", "demo: slow 60000")).unwrap();
    }
    let front = |agents: u32, worker: &str| {
        format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: {}\nagent:\n  kind: demo\n  max_concurrent_agents: {agents}\nagents:\n  demo:\n    bridge_command: {} demo-agent\nserver:\n  port: 0\n{worker}",
            dir.join("ws").display(),
            svc_bin()
        )
    };
    let wf = workflow_with_description(&dir, &front(1, ""));
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_SSH_CONFIG", &sshd.config);
    let d = Daemon::start(cmd);
    let on = |s: &Value, id: &str| {
        s["running"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["issue_identifier"] == id)
            .cloned()
    };
    let s = d.wait_for(30, "one run on the local machine", |s| {
        s["running"].as_array().unwrap().len() == 1 && s["running"][0]["executor_pid"].is_u64()
    });
    let first = s["running"][0]["issue_identifier"]
        .as_str()
        .unwrap()
        .to_string();
    let second = if first == "BOARD-1" {
        "BOARD-2"
    } else {
        "BOARD-1"
    };
    fs::write(
        &wf,
        fs::read_to_string(&wf)
            .unwrap()
            .replace(&front(1, ""), &front(2, "worker:\n  ssh_hosts: [w1]\n")),
    )
    .unwrap();
    d.wait_log(30, "worker_pool_driver_replaced");
    let s = d.wait_for(30, "the second issue running on w1 beside the first", |s| {
        on(s, second).is_some_and(|r| r["worker_host"] == "w1" && r["executor_pid"].is_u64())
            && on(s, &first).is_some_and(|r| r["executor_pid"].is_u64())
    });
    assert_eq!(s["worker_pool"]["waiting"], 0, "{s}");
    drop(d);
    drop(sshd);
}
