//! Helpers for tests that run the real `svc` binary.
#![allow(dead_code)]

/// A TCP proxy to PostgreSQL that freezes, cuts or loses the answers to COMMITs.
pub mod faulty;
/// A proxy that loses the answers to requests a fake applied.
pub mod losing;
/// A real PostgreSQL server in a temporary directory, on a private port.
pub mod pg;
/// A real OpenSSH server on 127.0.0.1 with an ssh client config for it.
pub mod sshd;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A temporary directory removed on drop.
pub struct TestDir {
    pub path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("svc-test-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TestDir { path }
    }

    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

pub fn svc_bin() -> &'static str {
    env!("CARGO_BIN_EXE_svc")
}

/// `svc` with a clean environment: HOME and the working directory in `dir`, a PATH without
/// any agent tools, and none of the caller's tracker variables.
pub fn svc(dir: &TestDir) -> Command {
    let mut cmd = Command::new(svc_bin());
    cmd.env_clear()
        .env("HOME", dir.join("home"))
        .env("PATH", "/usr/bin:/bin")
        .env("TMPDIR", dir.join("tmp"))
        .current_dir(&dir.path);
    std::fs::create_dir_all(dir.join("home")).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    cmd
}

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

pub fn run(cmd: &mut Command) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("svc runs");
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into(),
        stderr: String::from_utf8_lossy(&stderr).into(),
    }
}

/// The repository's shipped WORKFLOW.md.
pub fn shipped_workflow() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("WORKFLOW.md")
}

/// A workflow file with the given front matter and a one-line prompt.
pub fn workflow(dir: &TestDir, front_matter: &str) -> PathBuf {
    dir.write(
        "WORKFLOW.md",
        &format!(
            "---\n{front_matter}\n---\nWork on {{{{ issue.identifier }}}}: {{{{ issue.title }}}}\n"
        ),
    )
}

/// A running `svc --no-tui` whose JSON snapshot lines are collected; killed on drop.
pub struct Daemon {
    pub child: std::process::Child,
    snapshots: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Daemon {
    pub fn start(mut cmd: Command) -> Daemon {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("svc starts");
        let snapshots = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let out = child.stdout.take().unwrap();
        let snaps = snapshots.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str(&line) {
                    snaps.lock().unwrap().push(v);
                }
            }
        });
        let err = child.stderr.take().unwrap();
        let errs = stderr.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let mut e = errs.lock().unwrap();
                e.push_str(&line);
                e.push('\n');
            }
        });
        Daemon {
            child,
            snapshots,
            stderr,
        }
    }

    pub fn latest(&self) -> Option<serde_json::Value> {
        self.snapshots.lock().unwrap().last().cloned()
    }

    /// How many snapshot lines the daemon has printed so far.
    pub fn snapshot_count(&self) -> usize {
        self.snapshots.lock().unwrap().len()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until a snapshot satisfies `pred`; panics with the last snapshot and log after
    /// `secs`.
    pub fn wait_for(
        &self,
        secs: u64,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            if let Some(s) = self
                .snapshots
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find(|s| pred(s))
                .cloned()
            {
                return s;
            }
            if std::time::Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}\nlast snapshot: {:#}\nstderr:\n{}",
                    self.latest().unwrap_or_default(),
                    self.stderr()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Waits until the latest snapshot satisfies `pred` (unlike [`Daemon::wait_for`], which
    /// takes any snapshot seen so far); panics like it after `secs`.
    pub fn wait_latest(
        &self,
        secs: u64,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            if let Some(s) = self.latest().filter(|s| pred(s)) {
                return s;
            }
            if std::time::Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}\nlast snapshot: {:#}\nstderr:\n{}",
                    self.latest().unwrap_or_default(),
                    self.stderr()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Waits until the log contains `text`.
    pub fn wait_log(&self, secs: u64, text: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while !self.stderr().contains(text) {
            if std::time::Instant::now() > deadline {
                panic!(
                    "timed out waiting for log {text:?}\nstderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill has no memory effects.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// Waits for the daemon to exit; returns its exit code.
    pub fn wait_exit(&mut self, secs: u64) -> Option<i32> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if std::time::Instant::now() > deadline {
                panic!("svc did not exit in {secs} s\nstderr:\n{}", self.stderr());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.signal(libc::SIGTERM);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while self.child.try_wait().ok().flatten().is_none()
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Whether process `pid` is gone within 5 s: a killed process may take a moment to be
/// scheduled and die on a loaded machine (one that was never killed stays alive).
pub fn dead_soon(pid: i64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while alive(pid) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

/// Front matter for a fast test daemon on the memory tracker with the demo agent.
pub fn demo_memory(extra: &str) -> String {
    format!(
        "tracker:\n  kind: memory\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 1\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n{extra}"
    )
}

/// A workflow whose prompt carries the issue description (where demo directives live).
pub fn workflow_with_description(dir: &TestDir, front_matter: &str) -> PathBuf {
    dir.write(
        "WORKFLOW.md",
        &format!("---\n{front_matter}\n---\nWork on {{{{ issue.identifier }}}}.\n{{{{ issue.description }}}}\n"),
    )
}

/// A local board (`board/`) holding `issues` (file name, whole text), and a workflow over it
/// (through [`workflow_with_description`]) for the demo agent, with a free port and traces in
/// `traces/`; `more` is the rest of the front matter, at least `polling` and `agent`.
pub fn board_workflow(dir: &TestDir, issues: &[(&str, &str)], more: &str) -> PathBuf {
    let board = dir.join("board");
    std::fs::create_dir_all(&board).unwrap();
    for (file, text) in issues {
        std::fs::write(board.join(file), text).unwrap();
    }
    workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\nworkspace:\n  root: ws\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n{more}"
        ),
    )
}

/// A directory `wf/` of workflows for one daemon, one per `(name, identifiers)`: each over a
/// local board `boards/<name>/` whose issues (`BOARD-1`, ...) are in Todo and held open by the
/// demo agent, with a workspace root of its own, all sharing the daemon-wide keys (a free port,
/// `traces/`).
pub fn held_workflows(dir: &TestDir, workflows: &[(&str, &[&str])]) -> PathBuf {
    for (name, identifiers) in workflows {
        let board = dir.join(&format!("boards/{name}"));
        std::fs::create_dir_all(&board).unwrap();
        for id in *identifiers {
            std::fs::write(
                board.join(format!("{id}.md")),
                "---\ntitle: Held open\nstate: Todo\n---\ndemo: keep-open\ndemo: slow 60000\n",
            )
            .unwrap();
        }
        dir.write(
            &format!("wf/{name}.md"),
            &format!(
                "---\ntracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: {}\npolling:\n  interval_ms: 300\nworkspace:\n  root: {}\nagent:\n  kind: demo\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: {}\n---\nWork on {{{{ issue.identifier }}}}.\n{{{{ issue.description }}}}\n",
                board.display(),
                dir.join(&format!("ws/{name}")).display(),
                dir.join("traces").display(),
            ),
        );
    }
    dir.join("wf")
}

pub fn issues_json(issues: &[(&str, &str, &[&str], &str)]) -> String {
    let list: Vec<serde_json::Value> = issues
        .iter()
        .map(|(id, state, labels, desc)| {
            serde_json::json!({"id": format!("id-{id}"), "identifier": id, "title": format!("Issue {id}"), "state": state, "labels": labels, "description": desc})
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

pub fn running_ids(s: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = s["running"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["issue_identifier"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

pub fn events(s: &serde_json::Value) -> Vec<String> {
    s["recent_events"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| e["event"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A minimal HTTP call: (status, content type, body).
pub fn http(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(20)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = match (method, body) {
        ("GET", _) => {
            let mut r = agent.get(url);
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.call()
        }
        (m, b) => {
            let mut r = ureq::http::Request::builder().method(m).uri(url);
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            let req = r.body(b.unwrap_or("").to_string()).unwrap();
            agent.run(req)
        }
    }
    .expect("the request is answered");
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    (status, ct, text)
}

/// The daemon's HTTP base URL from its snapshot.
pub fn base_url(d: &Daemon) -> String {
    let s = d.wait_for(20, "a snapshot with an endpoint", |s| {
        s["daemon"]["endpoint"]["address"].is_string()
    });
    s["daemon"]["endpoint"]["address"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The `state:` of a local board file (`board/<file>` in `dir`), or "" when it has none.
pub fn board_state(dir: &TestDir, file: &str) -> String {
    std::fs::read_to_string(dir.join("board").join(file))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("state:"))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// Polls `ok` until it holds, failing the test after `secs` seconds.
pub fn wait_until(secs: u64, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The MCP URL and bearer header the first run received (the demo agent records its session
/// in `sessions.jsonl` of `dir` when `SVC_DEMO_AGENT_RECORD` points there).
pub fn mcp_of(dir: &TestDir) -> (String, String) {
    wait_until(30, "a recorded session", || {
        dir.join("sessions.jsonl").exists()
    });
    let session: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(dir.join("sessions.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let server = &session["params"]["mcpServers"][0];
    (
        server["url"].as_str().unwrap().to_string(),
        server["headers"][0]["value"].as_str().unwrap().to_string(),
    )
}

/// Calls the tool `name` through /mcp: whether it failed (`isError`), and its JSON result.
pub fn tool(
    mcp: &(String, String),
    name: &str,
    args: serde_json::Value,
) -> (bool, serde_json::Value) {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}}).to_string();
    let (status, _, text) = http("POST", &mcp.0, &[("Authorization", &mcp.1)], Some(&body));
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    (
        v["result"]["isError"] == true,
        serde_json::from_str(v["result"]["content"][0]["text"].as_str().unwrap()).unwrap(),
    )
}

/// The message of a tool call that must have failed.
pub fn error_of(r: (bool, serde_json::Value)) -> String {
    assert!(r.0, "expected a failure: {}", r.1);
    r.1["error"]["message"].as_str().unwrap().to_string()
}

/// A daemon on the memory tracker whose one issue keeps its run open, with the chat pack
/// `pack` mounted from its `tools.<pack>` slice (`slice`: its keys, indented under it) and
/// `env` set; the MCP URL and bearer header of the run. With the pack's bot user id variable
/// set empty in `env`, every tool of the pack fails closed.
pub fn chat_pack_daemon(
    dir: &TestDir,
    pack: &str,
    slice: &str,
    env: &[(&str, &str)],
) -> (Daemon, (String, String)) {
    let wf = workflow_with_description(dir, &demo_memory(&format!("tools:\n  {pack}:\n{slice}")));
    let mut cmd = svc(dir);
    cmd.arg("--no-tui").arg(&wf).envs(env.iter().copied());
    cmd.env(
        "SVC_MEMORY_TRACKER_ISSUES_JSON",
        issues_json(&[("MEM-1", "Todo", &[], "demo: keep-open")]),
    )
    .env("SVC_DEMO_AGENT_RECORD", dir.join("sessions.jsonl"));
    let d = Daemon::start(cmd);
    let mcp = mcp_of(dir);
    (d, mcp)
}

/// The six tools every chat pack (`chat_a`, `chat_b`) declares, with arguments for
/// `issue_id` and `user_id`.
pub fn chat_tool_calls(
    pack: &str,
    issue_id: &str,
    user_id: &str,
) -> Vec<(String, serde_json::Value)> {
    use serde_json::json;
    vec![
        (
            format!("{pack}_update_status"),
            json!({"issueId": issue_id, "status": "Done"}),
        ),
        (
            format!("{pack}_comment"),
            json!({"issueId": issue_id, "body": "x"}),
        ),
        (format!("{pack}_read_thread"), json!({"issueId": issue_id})),
        (format!("{pack}_query"), json!({})),
        (format!("{pack}_user_info"), json!({"userId": user_id})),
        (
            format!("{pack}_channel_context"),
            json!({"issueId": issue_id}),
        ),
    ]
}

/// Every call fails with the chat pack's fail-closed message (no bot user id: neither
/// `tracker.bot_user_id` nor `bot_user_var`).
pub fn assert_fail_closed(
    mcp: &(String, String),
    pack: &str,
    bot_user_var: &str,
    calls: Vec<(String, serde_json::Value)>,
) {
    let expected = format!(
        "{pack} tools are unavailable because tracker.bot_user_id (or {bot_user_var}) is not configured"
    );
    for (name, args) in calls {
        assert_eq!(error_of(tool(mcp, &name, args)), expected, "{name}");
    }
}

/// Each per-issue chat tool of `names` (called with `args` of an issue id) refuses the
/// `untracked` issue ids of a watched channel and the `unwatched` one.
pub fn assert_refused(
    mcp: &(String, String),
    names: &[&str],
    args: impl Fn(&str) -> serde_json::Value,
    untracked: &[String],
    unwatched: &str,
) {
    for name in names {
        for id in untracked {
            let e = error_of(tool(mcp, name, args(id)));
            assert!(e.contains("not a tracked message"), "{name}: {e}");
        }
        let e = error_of(tool(mcp, name, args(unwatched)));
        assert!(e.contains("not watched"), "{name}: {e}");
    }
}

/// `<pack>_query` reads the watched channels only. Over `channels` (watched or not) it answers
/// the `expected` issues in the default projection; filtered on Done with `select` and both
/// expansions, `done` rows of `channel`; over `unwatched` channels alone, nothing.
pub fn assert_query_reads_watched(
    mcp: &(String, String),
    pack: &str,
    channels: &[&str],
    mut expected: Vec<String>,
    (select, done, channel): (&[&str], usize, &str),
    unwatched: &[&str],
) {
    use serde_json::json;
    let query = format!("{pack}_query");
    let (err, v) = tool(
        mcp,
        &query,
        json!({"channels": channels, "order_by": [{"field": "issueId"}]}),
    );
    assert!(!err, "{v}");
    let rows = v["rows"].as_array().unwrap();
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r["issueId"].as_str().unwrap())
        .collect();
    expected.sort();
    assert_eq!(ids, expected);
    assert_eq!(v["total"], expected.len());
    let keys: Vec<&String> = rows[0].as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["issueId", "labels", "state", "title"],
        "the default projection"
    );
    let (_, v) = tool(
        mcp,
        &query,
        json!({"where": {"field": "state", "op": "eq", "value": "Done"}, "select": select, "expand": ["reactions", "thread"]}),
    );
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), done, "{v}");
    for r in rows {
        assert_eq!(r["channel"], channel);
        assert_eq!(r["stateType"], "completed");
        assert!(r["reactions"].is_array() && r["thread"].is_array() && r["url"].is_string());
    }
    let none = error_of(tool(mcp, &query, json!({"channels": unwatched})));
    assert!(
        none.contains("none of the requested channels is watched"),
        "{none}"
    );
    let bad = error_of(tool(mcp, &query, json!({"expand": ["everything"]})));
    assert!(bad.contains("expand"), "{bad}");
}

/// `<pack>_channel_context` around `issue_id` (its message `anchor`; `key` a message's id
/// field): 500 before and 2 after are capped at 50, then the anchor, then the two messages of
/// `following`; by default 10 before and the `after` messages that follow.
pub fn assert_channel_context(
    mcp: &(String, String),
    pack: &str,
    issue_id: &str,
    (key, anchor): (&str, &str),
    following: [&str; 2],
    after: usize,
) {
    use serde_json::json;
    let name = format!("{pack}_channel_context");
    let (err, v) = tool(
        mcp,
        &name,
        json!({"issueId": issue_id, "before": 500, "after": 2}),
    );
    assert!(!err, "{v}");
    assert_eq!(v["anchor"][key], anchor);
    let messages = v["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 50 + 1 + 2, "{v}");
    assert_eq!(messages[50][key], anchor);
    assert_eq!(messages[51][key], following[0]);
    assert_eq!(messages[52][key], following[1]);
    let (_, v) = tool(mcp, &name, json!({"issueId": issue_id}));
    let n = v["messages"].as_array().unwrap().len();
    assert_eq!(
        n,
        10 + 1 + after,
        "default 10 before; only {after} follow: {v}"
    );
}

/// `svc doctor --online <wf>` with `env` set.
pub fn doctor_online(dir: &TestDir, wf: &Path, env: &[(&str, &str)]) -> Run {
    run(svc(dir)
        .args(["doctor", "--online"])
        .arg(wf)
        .envs(env.iter().copied()))
}

/// The `Content-Length` of an HTTP message head (0 without one).
pub fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0)
}

/// The issues waiting on blockers in a snapshot: identifier, its open blockers as `ID (State)`,
/// and whether it is part of a cycle.
pub fn waiting_on_blockers(s: &serde_json::Value) -> Vec<(String, Vec<String>, bool)> {
    s["waiting_on_blockers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            (
                w["issue_identifier"].as_str().unwrap().to_string(),
                w["blockers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| {
                        format!(
                            "{} ({})",
                            b["identifier"].as_str().unwrap(),
                            b["state"].as_str().unwrap()
                        )
                    })
                    .collect(),
                w["cycle"] == true,
            )
        })
        .collect()
}

/// The texts of the prompts the demo agents received (`SVC_DEMO_AGENT_PROMPTS`), in order.
pub fn prompt_texts(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|p| p["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The running entry of the issue with this id, if it runs.
pub fn running_by_id(s: &serde_json::Value, id: &str) -> Option<serde_json::Value> {
    s["running"]
        .as_array()?
        .iter()
        .find(|r| r["issue_id"] == id)
        .cloned()
}

/// A loopback port free a moment ago (bound, then released), for `server.webhook_port`.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The hex HMAC-SHA256 of `body` under `secret`, as GitHub (`sha256=` prefixed), Linear and
/// Jira (`sha256=` prefixed) sign their webhook deliveries.
pub fn hmac_hex(secret: &str, body: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `POST http://127.0.0.1:<port><path>`: (status, error code or the `status` of a 2xx answer).
pub fn post_hook(port: u16, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let (status, _, text) = http(
        "POST",
        &format!("http://127.0.0.1:{port}{path}"),
        headers,
        Some(body),
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let code = v["error"]["code"]
        .as_str()
        .or(v["status"].as_str())
        .unwrap_or("")
        .to_string();
    (status, code)
}

/// What every webhook route refuses, and the separation of the listeners: `sign` gives the
/// headers of a correctly signed delivery of a body; `body` is a valid delivery (answered 202).
/// The dashboard (`base`) serves no webhook route, and the webhook listener nothing else.
pub fn assert_webhook_refusals(
    port: u16,
    path: &str,
    base: &str,
    sign: &dyn Fn(&str) -> Vec<(String, String)>,
    body: &str,
) {
    let with = |headers: &[(String, String)], body: &str| {
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        post_hook(port, path, &h, body)
    };
    assert_eq!(with(&sign(body), body).0, 202, "a signed delivery");
    assert_eq!(
        with(&[], body),
        (401, "unauthorized".into()),
        "no signature"
    );
    let forged = sign(body)
        .into_iter()
        .map(|(k, v)| {
            if v.len() >= 64 {
                // Same shape, another secret.
                let fake = hmac_hex("not-the-secret", body);
                (k, format!("{}{fake}", &v[..v.len() - 64]))
            } else {
                (k, v)
            }
        })
        .collect::<Vec<_>>();
    assert_eq!(
        with(&forged, body),
        (401, "unauthorized".into()),
        "bad signature"
    );
    // The signature of another body.
    assert_eq!(
        with(&sign(body), &format!("{body} ")),
        (401, "unauthorized".into()),
        "a body changed after signing"
    );
    assert_eq!(
        with(&sign("not json"), "not json"),
        (400, "invalid_request".into()),
        "signed, but not JSON"
    );
    let huge = format!("{{\"pad\":\"{}\"}}", "x".repeat(1 << 20));
    assert_eq!(
        with(&sign(&huge), &huge),
        (413, "payload_too_large".into()),
        "over 1 MiB"
    );
    let (status, _, _) = http("GET", &format!("http://127.0.0.1:{port}{path}"), &[], None);
    assert_eq!(status, 405, "another method");
    let (status, _, _) = http(
        "PUT",
        &format!("http://127.0.0.1:{port}{path}"),
        &[],
        Some(body),
    );
    assert_eq!(status, 405, "another method");
    // The webhook listener serves nothing else, whatever the method.
    for (method, p) in [
        ("GET", "/api/v1/state"),
        ("GET", "/health"),
        ("GET", "/metrics"),
        ("GET", "/"),
        ("POST", "/mcp"),
        ("POST", "/api/v1/refresh"),
        ("GET", "/ws"),
        ("POST", "/webhooks/other"),
    ] {
        let (status, _, text) = http(
            method,
            &format!("http://127.0.0.1:{port}{p}"),
            &[],
            Some("{}"),
        );
        assert_eq!(status, 404, "{method} {p} on the webhook listener: {text}");
        assert!(text.contains("not_found"), "{text}");
    }
    // The dashboard serves no webhook route, whatever the method.
    for method in ["POST", "GET"] {
        let (status, _, text) = http(method, &format!("{base}{path}"), &[], Some(body));
        assert_eq!(status, 404, "{method} {path} on the dashboard: {text}");
    }
}

/// Claude Code's words for a session limit that resets at the top of an hour two to three hours
/// from now (UTC), and that hour: the reset lies far beyond any test, so the kind stays cooling
/// down while the views are read.
pub fn limit_hours_off() -> (String, u64) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let hour = (secs / 3600 + 3) % 24;
    let (h12, half) = match hour {
        0 => (12, "am"),
        h if h < 12 => (h, "am"),
        12 => (12, "pm"),
        h => (h - 12, "pm"),
    };
    (
        format!("You've hit your session limit · resets {h12}{half} (UTC)"),
        hour,
    )
}

/// A workflow over the local board `board/` (empty: the test adds issues with
/// [`add_board_issue`]) whose one agent kind, `agent_a`, is the demo agent answering every
/// prompt as an account past its limit, with `words`, and has no fallback. The agent is started
/// by the binary's path, so the workflow runs under a bare PATH too (the TUI tests' `env -i`).
pub fn limited_workflow(dir: &TestDir, words: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("board")).unwrap();
    workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: agent_a\nagents:\n  agent_a:\n    bridge_command: {} demo-agent\n    env:\n      SVC_DEMO_AGENT_LIMIT: message\n      SVC_DEMO_AGENT_LIMIT_TEXT: {}\nserver:\n  port: 0\n  trace_dir: traces\n",
            svc_bin(),
            serde_json::to_string(words).unwrap()
        ),
    )
}

/// Writes issue `identifier` in Todo to the board of [`limited_workflow`].
pub fn add_board_issue(dir: &TestDir, identifier: &str) {
    std::fs::write(
        dir.join(&format!("board/{identifier}.md")),
        format!("---\ntitle: {identifier}\nstate: Todo\n---\nFix it.\n"),
    )
    .unwrap();
}

/// Whether snapshot `s` has kind `agent_a` cooling down (its one cooldown) and `identifier`
/// waiting for it (blocked `agent_rate_limited`).
pub fn cooling_and_blocked(s: &serde_json::Value, identifier: &str) -> bool {
    s["cooldowns"]
        .as_array()
        .is_some_and(|c| c.len() == 1 && c[0]["agent_kind"] == "agent_a")
        && s["blocked"].as_array().is_some_and(|b| {
            b.iter()
                .any(|e| e["reason"] == "agent_rate_limited" && e["issue_identifier"] == identifier)
        })
}
