//! The HTTP server and the MCP endpoint against the real binary: every route, the error codes,
//! control tokens, token rotation, a real MCP client (the official Python SDK), and `svc runs`.

mod common;

use common::*;
use serde_json::{Value, json};
use std::fs;

fn board_daemon(
    dir: &TestDir,
    extra: &str,
    issues: &[(&str, &str)],
) -> (Daemon, std::path::PathBuf) {
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    for (file, text) in issues {
        fs::write(board.join(file), text).unwrap();
    }
    let wf = workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 2\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n{extra}"
        ),
    );
    let mut cmd = svc(dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_DEMO_AGENT_RECORD", dir.join("sessions.jsonl"))
        .env("SVC_CONTROL_TOKEN", "control-secret-1");
    (Daemon::start(cmd), wf)
}

fn recorded_sessions(dir: &TestDir) -> Vec<Value> {
    fs::read_to_string(dir.join("sessions.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn error_of(body: &str) -> (String, String) {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    (
        v["error"]["code"].as_str().unwrap().to_string(),
        v["error"]["message"].as_str().unwrap().to_string(),
    )
}

#[test]
fn routes_status_codes_bodies_and_errors() {
    let dir = TestDir::new("routes");
    let (d, _) = board_daemon(
        &dir,
        "",
        &[(
            "BOARD-1.md",
            "---\ntitle: Slow one\nstate: Todo\n---\ndemo: slow 60000\n",
        )],
    );
    let base = base_url(&d);
    let (status, ct, body) = http("GET", &format!("{base}/health"), &[], None);
    assert_eq!(
        (status, ct.as_str()),
        (200, "application/json; charset=utf-8")
    );
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"status": "ok"})
    );
    d.wait_for(20, "a run", |s| s["counts"]["running"] == 1);
    let (status, _, body) = http("GET", &format!("{base}/api/v1/state"), &[], None);
    let state: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200);
    for key in [
        "generated_at",
        "counts",
        "blocked_by_reason",
        "running",
        "retrying",
        "blocked",
        "usage_totals",
        "rate_limits",
        "claim_store",
        "daemon",
    ] {
        assert!(state.get(key).is_some(), "state lacks {key}");
    }
    let entry = &state["running"][0];
    for key in [
        "issue_id",
        "issue_identifier",
        "issue_url",
        "state",
        "slot_index",
        "ensemble_size",
        "worker_host",
        "workspace_path",
        "session_id",
        "turn_count",
        "agent_kind",
        "executor_pid",
        "usage_totals",
        "last_event",
        "last_message",
        "started_at",
        "last_event_at",
        "tokens",
    ] {
        assert!(entry.get(key).is_some(), "running entry lacks {key}");
    }
    // The durable store is on by default, and daemons may share it.
    assert_eq!(state["claim_store"]["kind"], "sqlite");
    assert_eq!(
        state["claim_store"]["capabilities"],
        json!({"crash_recovery": true, "shared_across_processes": true, "retry_durability": true})
    );
    assert!(state["claim_store"]["hydrated_at"].is_string());

    let (status, _, body) = http("GET", &format!("{base}/api/v1/daemon"), &[], None);
    let daemon: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200);
    for key in [
        "owner_id",
        "pid",
        "hostname",
        "started_at",
        "workflow_path",
        "workspace_root",
        "lock_path",
        "endpoint",
        "heartbeat_at",
        "heartbeat_age_ms",
        "stale",
        "leadership_store_kind",
    ] {
        assert!(daemon.get(key).is_some(), "daemon lacks {key}");
    }
    assert_eq!(daemon["pid"], d.child.id());

    let (status, _, body) = http("GET", &format!("{base}/api/v1/BOARD-1"), &[], None);
    let detail: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (detail["status"].as_str(), detail["issue_id"].as_str()),
        (Some("running"), Some("BOARD-1"))
    );
    assert_eq!(detail["logs"], json!({"codex_session_logs": []}));
    assert_eq!(detail["tracked"], json!({}));
    assert_eq!(detail["workspace"]["host"], Value::Null);

    let cases: &[(&str, &str, u16, &str, &str)] = &[
        (
            "GET",
            "/api/v1/NOPE-9",
            404,
            "issue_not_found",
            "Issue not found",
        ),
        (
            "GET",
            "/api/v1/bad%zzid",
            400,
            "invalid_path_parameter",
            "Malformed percent encoding in path parameter",
        ),
        ("GET", "/no/such/route", 404, "not_found", "Route not found"),
        ("POST", "/health", 405, "method_not_allowed", ""),
        ("DELETE", "/api/v1/state", 405, "method_not_allowed", ""),
        ("GET", "/api/v1/refresh", 405, "method_not_allowed", ""),
        ("GET", "/mcp", 405, "method_not_allowed", ""),
        ("PUT", "/mcp", 405, "method_not_allowed", ""),
        ("POST", "/api/v1/refresh", 401, "unauthorized", ""),
        ("POST", "/api/v1/stop", 401, "unauthorized", ""),
        (
            "GET",
            "/api/v1/runs?id=run-missing",
            404,
            "run_not_found",
            "Run not found",
        ),
    ];
    for (method, path, status, code, message) in cases {
        let (got, ct, body) = http(method, &format!("{base}{path}"), &[], None);
        assert_eq!(got, *status, "{method} {path}: {body}");
        assert_eq!(ct, "application/json; charset=utf-8", "{method} {path}");
        let (c, m) = error_of(&body);
        assert_eq!(c, *code, "{method} {path}");
        if !message.is_empty() {
            assert_eq!(m, *message, "{method} {path}");
        }
    }
    let (status, _, body) = http(
        "POST",
        &format!("{base}/api/v1/refresh"),
        &[("Authorization", "Bearer wrong")],
        None,
    );
    assert_eq!((status, error_of(&body).0.as_str()), (401, "unauthorized"));
    let (status, _, body) = http(
        "POST",
        &format!("{base}/api/v1/refresh"),
        &[("Authorization", "Bearer control-secret-1")],
        None,
    );
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 202);
    assert_eq!(r["operations"], json!(["poll", "reconcile"]));
    assert!(
        r["queued"].is_boolean() && r["coalesced"].is_boolean() && r["requested_at"].is_string()
    );
    assert_ne!(r["queued"], r["coalesced"]);

    let (status, ct, body) = http("GET", &format!("{base}/"), &[], None);
    assert_eq!((status, ct.as_str()), (200, "text/html; charset=utf-8"));
    assert!(body.contains("<html"));
    assert_eq!(
        http("GET", &format!("{base}/assets/index.html"), &[], None).0,
        200
    );
    assert_eq!(
        http("GET", &format!("{base}/assets/../Cargo.toml"), &[], None).0,
        404
    );
    let big = "x".repeat(2 << 20);
    let (status, _, body) = http(
        "POST",
        &format!("{base}/mcp"),
        &[("Authorization", "Bearer x")],
        Some(&big),
    );
    assert_eq!(
        (status, error_of(&body).0.as_str()),
        (413, "payload_too_large")
    );
}

#[test]
fn runs_views_and_the_svc_runs_command() {
    let dir = TestDir::new("runs-views");
    let (d, wf) = board_daemon(
        &dir,
        "",
        &[
            (
                "BOARD-1.md",
                "---\ntitle: Quick\nstate: Todo\n---\nJust do it.\n",
            ),
            (
                "BOARD-2.md",
                "---\ntitle: Crashy\nstate: Todo\n---\ndemo: crash\n",
            ),
        ],
    );
    let base = base_url(&d);
    d.wait_for(30, "a success and a failure", |s| {
        let e = events(s);
        e.contains(&"run_failed".to_string()) && e.contains(&"run_succeeded".to_string())
    });
    let (status, _, body) = http("GET", &format!("{base}/api/v1/runs"), &[], None);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, v["view"].as_str()), (200, Some("runs")));
    assert!(
        v["summary"]["failed"].as_u64().unwrap() >= 1
            && v["summary"]["success"].as_u64().unwrap() >= 1,
        "{v}"
    );
    for key in [
        "id",
        "issue_id",
        "issue_identifier",
        "issue_title",
        "state",
        "slot_index",
        "ensemble_size",
        "agent_kind",
        "outcome",
        "retry_attempt",
        "worker_host",
        "workspace_path",
        "session_id",
        "executor_pid",
        "usage_totals",
        "turn_count",
        "failure_reason",
        "last_event",
        "last_message",
        "last_event_at",
        "started_at",
        "ended_at",
        "duration_ms",
        "cost",
        "tokens",
        "log_hints",
    ] {
        assert!(v["runs"][0].get(key).is_some(), "run lacks {key}");
    }
    // The demo agent reports $0.006 a turn; a run that crashed before any usage has no cost.
    let cost_of = |identifier: &str, outcome: &str| {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["issue_identifier"] == identifier && r["outcome"] == outcome)
            .map(|r| r["cost"].clone())
    };
    assert_eq!(
        cost_of("BOARD-1", "success"),
        Some(json!({"estimated_cost_usd": 0.006}))
    );
    assert_eq!(
        cost_of("BOARD-2", "failed"),
        Some(json!({"estimated_cost_usd": null}))
    );
    let failed: Value = serde_json::from_str(
        &http(
            "GET",
            &format!("{base}/api/v1/runs?failed=yes&limit=1"),
            &[],
            None,
        )
        .2,
    )
    .unwrap();
    assert_eq!(failed["runs"].as_array().unwrap().len(), 1);
    assert_eq!(failed["runs"][0]["outcome"], "failed");
    let one: Value = serde_json::from_str(
        &http(
            "GET",
            &format!("{base}/api/v1/runs?issue=BOARD-1"),
            &[],
            None,
        )
        .2,
    )
    .unwrap();
    assert!(
        one["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["issue_identifier"] == "BOARD-1")
    );
    let id = one["runs"][0]["id"].as_str().unwrap();
    let last = one["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["outcome"] == "success")
        .unwrap()["last_message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        last.ends_with("Done."),
        "the last message is current at the end of a turn: {last:?}"
    );
    let run_view: Value = serde_json::from_str(
        &http(
            "GET",
            &format!("{base}/api/v1/runs?id={id}&cost=0"),
            &[],
            None,
        )
        .2,
    )
    .unwrap();
    assert_eq!(
        (run_view["view"].as_str(), run_view["run"]["id"].as_str()),
        (Some("run"), Some(id))
    );
    assert!(run_view["related_runs"].is_array());
    let cost: Value = serde_json::from_str(
        &http(
            "GET",
            &format!("{base}/api/v1/runs?cost=on&retries=1&id={id}"),
            &[],
            None,
        )
        .2,
    )
    .unwrap();
    assert_eq!(cost["view"], "cost", "cost wins over retries and id");
    assert!(cost["summary"]["top_runs"].as_array().unwrap().len() <= 10);
    let retries: Value = serde_json::from_str(
        &http(
            "GET",
            &format!("{base}/api/v1/runs?retries=true"),
            &[],
            None,
        )
        .2,
    )
    .unwrap();
    assert_eq!(retries["view"], "retries");

    // Wait until the crash was retried, so the retries view has a row.
    d.wait_for(40, "a retried run", |s| {
        s["running"]
            .as_array()
            .is_some_and(|r| r.iter().any(|e| e["attempt"] == 1))
            || s["retrying"]
                .as_array()
                .is_some_and(|r| r.iter().any(|e| e["attempt"].as_u64() >= Some(2)))
    });
    let port = base.rsplit(':').next().unwrap();
    let r = run(svc(&dir).args(["runs", "--port", port]).arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(r.stdout.starts_with("total "), "{}", r.stdout);
    assert!(
        r.stdout.contains("ID") && r.stdout.contains("SESSION") && r.stdout.contains("BOARD-2"),
        "{}",
        r.stdout
    );
    let r = run(svc(&dir).args(["runs", "--url", &format!("{base}/"), "--json", "--failed"]));
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["view"], "runs");
    let r = run(svc(&dir).args(["runs", "--url", &base, "--cost"]));
    assert!(
        r.stdout
            .starts_with("AGENT  RUNS  DONE  INPUT  OUTPUT  TOTAL  AVG/RUN  USD"),
        "{}",
        r.stdout
    );
    let r = run(svc(&dir).args(["runs", "--url", &base, "--retries"]));
    assert!(
        r.stdout.starts_with("ISSUE") && r.stdout.contains("BOARD-2"),
        "{}",
        r.stdout
    );
    let r = run(svc(&dir).args(["runs", "--url", &base, "--id", "run-nope"]));
    assert_eq!(r.code, Some(1));
    assert_eq!(r.stderr.trim(), "svc runs: Run not found");
    let r = run(svc(&dir).args(["runs", "--url", "http://127.0.0.1:9"]));
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr
            .contains("cannot reach the daemon at http://127.0.0.1:9"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_real_mcp_client_uses_the_token_a_run_received() {
    let dir = TestDir::new("mcp-client");
    let (d, wf) = board_daemon(
        &dir,
        "",
        &[(
            "BOARD-1.md",
            "---\ntitle: Keep open\nstate: Todo\n---\ndemo: keep-open\ndemo: slow 60000\n",
        )],
    );
    d.wait_for(20, "a run", |s| s["counts"]["running"] == 1);
    let sessions = {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let s = recorded_sessions(&dir);
            if !s.is_empty() || std::time::Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let server = &sessions[0]["params"]["mcpServers"][0];
    assert_eq!(server["type"], "http");
    assert_eq!(server["name"], "svc_demo");
    let url = server["url"].as_str().unwrap().to_string();
    let header = server["headers"][0]["value"].as_str().unwrap().to_string();
    let token = header.strip_prefix("Bearer ").unwrap().to_string();
    assert_eq!(
        sessions[0]["params"]["cwd"].as_str().unwrap(),
        dir.join("ws/BOARD-1").display().to_string()
    );

    let out = std::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py"))
        .arg(&url)
        .arg(&token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Python MCP client failed (scripts/test installs it with `pip install mcp`):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["serverName"], "mcp");
    assert_eq!(
        seen["tools"],
        json!([
            "local_update_status",
            "local_comment",
            "local_create_issue",
            "local_read_issue",
            "local_query"
        ])
    );
    assert_eq!(seen["schemasAreObjects"], true);
    assert_eq!(seen["created"]["identifier"], "BOARD-2");
    assert_eq!(seen["query"]["total"], 1);
    assert_eq!(
        seen["query"]["rows"][0],
        json!({"id": "BOARD-2", "title": "Filed by the MCP client", "state": "Todo"})
    );
    assert_eq!(seen["missingIsError"], true);
    assert_eq!(seen["missing"]["error"]["message"], "'issueId' is required");
    assert!(dir.join("board/BOARD-2.md").exists());

    // A settings change rotates the scope: the old token stops working.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#;
    assert_eq!(
        http("POST", &url, &[("Authorization", &header)], Some(init)).0,
        200
    );
    let text = fs::read_to_string(&wf).unwrap();
    fs::write(
        &wf,
        text.replace(
            "    path: board\n",
            "    path: board\n    id_prefix: BOARD-\n",
        ),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, _, body) = http("POST", &url, &[("Authorization", &header)], Some(init));
        if status == 401 {
            assert_eq!(error_of(&body).0, "unauthorized");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the old token still works after a tracker change"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn the_demo_loop_completes_issues_end_to_end() {
    let dir = TestDir::new("demo-loop");
    let removed = dir.join("removed.log");
    let (d, _) = board_daemon(
        &dir,
        &format!(
            "hooks:\n  before_remove: echo $SVC_ISSUE_IDENTIFIER >> {}\n",
            removed.display()
        ),
        &[(
            "BOARD-1.md",
            "---\ntitle: Greet\nstate: Todo\n---\nSay hello.\n",
        )],
    );
    d.wait_for(30, "the workspace removed", |s| {
        events(s).contains(&"workspace_removed".to_string())
    });
    let text = fs::read_to_string(dir.join("board/BOARD-1.md")).unwrap();
    assert!(text.contains("state: Done"), "{text}");
    assert!(text.contains("author: agent"), "{text}");
    assert_eq!(fs::read_to_string(&removed).unwrap(), "BOARD-1\n");
    assert!(!dir.join("ws/BOARD-1").exists());
}

#[test]
fn stop_route_shuts_the_daemon_down() {
    let dir = TestDir::new("stop-route");
    let (mut d, _) = board_daemon(&dir, "", &[]);
    let base = base_url(&d);
    let (status, _, body) = http(
        "POST",
        &format!("{base}/api/v1/stop"),
        &[("Authorization", "Bearer control-secret-1")],
        None,
    );
    assert_eq!(status, 202);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["stopping"],
        true
    );
    assert_eq!(d.wait_exit(20), Some(0));
}

#[test]
fn a_random_control_token_is_written_beside_the_lock_file() {
    let dir = TestDir::new("control-token");
    let wf = workflow_with_description(&dir, &demo_memory(""));
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let mut d = Daemon::start(cmd);
    let s = d.wait_for(20, "a snapshot", |s| s["daemon"]["lock_path"].is_string());
    let lock = std::path::PathBuf::from(s["daemon"]["lock_path"].as_str().unwrap());
    let token_file = lock.with_extension("token");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let token = fs::read_to_string(&token_file).unwrap();
    let base = base_url(&d);
    let (status, _, _) = http(
        "POST",
        &format!("{base}/api/v1/stop"),
        &[("Authorization", &format!("Bearer {token}"))],
        None,
    );
    assert_eq!(status, 202);
    assert_eq!(d.wait_exit(20), Some(0));
}

#[test]
fn a_missing_static_dir_index_is_dashboard_not_built() {
    let dir = TestDir::new("static-dir");
    fs::create_dir_all(dir.join("static")).unwrap();
    let (d, _) = board_daemon(&dir, "", &[]);
    // Turn static_dir on through a hot reload; the dashboard files are read per request.
    let wf = dir.join("WORKFLOW.md");
    let text = fs::read_to_string(&wf).unwrap().replace(
        "  trace_dir: traces\n",
        "  trace_dir: traces\n  static_dir: static\n",
    );
    fs::write(&wf, text).unwrap();
    let base = base_url(&d);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (status, body) = loop {
        let (status, _, body) = http("GET", &format!("{base}/"), &[], None);
        if status == 503 || std::time::Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let (code, message) = error_of(&body);
    assert_eq!((status, code.as_str()), (503, "dashboard_not_built"));
    assert!(
        message.starts_with("Dashboard assets not found. Run: "),
        "{message}"
    );
    fs::write(dir.join("static/index.html"), "<html>custom</html>").unwrap();
    assert_eq!(
        http("GET", &format!("{base}/"), &[], None).2,
        "<html>custom</html>"
    );
}

#[test]
fn a_static_dir_serves_its_index_and_its_assets() {
    let dir = TestDir::new("static-assets");
    fs::create_dir_all(dir.join("static/assets/fonts")).unwrap();
    fs::write(dir.join("static/index.html"), "<html>own</html>").unwrap();
    fs::write(dir.join("static/assets/app.js"), "console.log('own')").unwrap();
    fs::write(dir.join("static/assets/style.css"), "body{}").unwrap();
    fs::write(dir.join("static/assets/fonts/a.woff2"), "wOF2").unwrap();
    fs::write(dir.join("secret.txt"), "outside").unwrap();
    std::os::unix::fs::symlink(dir.join("secret.txt"), dir.join("static/assets/escape.txt"))
        .unwrap();
    let (d, _) = board_daemon(&dir, "  static_dir: static\n", &[]);
    let base = base_url(&d);
    let get = |path: &str| http("GET", &format!("{base}{path}"), &[], None);
    assert_eq!(get("/").2, "<html>own</html>");
    let (status, content_type, body) = get("/assets/app.js");
    assert_eq!((status, body.as_str()), (200, "console.log('own')"));
    assert!(
        content_type.starts_with("text/javascript"),
        "{content_type}"
    );
    let (status, content_type, _) = get("/assets/style.css");
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/css"), "{content_type}");
    let (status, content_type, _) = get("/assets/fonts/a.woff2");
    assert_eq!((status, content_type.as_str()), (200, "font/woff2"));
    // Files that are not there, and every way out of the directory, are 404.
    for path in [
        "/assets/missing.js",
        "/assets/escape.txt",
        "/assets/../secret.txt",
        "/assets/%2e%2e/secret.txt",
        "/assets/fonts/%2e%2e/%2e%2e/index.html",
        "/assets/",
    ] {
        let (status, _, body) = get(path);
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(error_of(&body).0, "not_found", "{path}");
    }
}

#[test]
fn the_issue_store_answers_after_a_restart_and_after_sigkill() {
    let dir = TestDir::new("store");
    let (mut d, wf) = board_daemon(
        &dir,
        "",
        &[
            (
                "BOARD-1.md",
                "---\ntitle: Fix the login button\nstate: Todo\n---\nx\n",
            ),
            (
                "BOARD-2.md",
                "---\ntitle: Write release notes\nstate: Todo\n---\nx\n",
            ),
        ],
    );
    let base = base_url(&d);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let body: Value = serde_json::from_str(
            &http(
                "GET",
                &format!("{base}/api/v1/issues/recent?limit=10"),
                &[],
                None,
            )
            .2,
        )
        .unwrap();
        if body["issues"].as_array().is_some_and(|a| a.len() == 2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "issues never reached the store: {body}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    d.signal(libc::SIGKILL);
    let _ = d.wait_exit(10);
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    let base = base_url(&d);
    let recent: Value =
        serde_json::from_str(&http("GET", &format!("{base}/api/v1/issues/recent"), &[], None).2)
            .unwrap();
    let ids: Vec<&str> = recent["issues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["identifier"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{recent}");
    let found: Value = serde_json::from_str(
        &http(
            "GET",
            &format!("{base}/api/v1/issues/search?q=login&limit=500"),
            &[],
            None,
        )
        .2,
    )
    .unwrap();
    assert_eq!(found["issues"].as_array().unwrap().len(), 1);
    assert_eq!(found["issues"][0]["title"], "Fix the login button");
    let one: Value = serde_json::from_str(
        &http(
            "GET",
            &format!("{base}/api/v1/issues/recent?limit=0"),
            &[],
            None,
        )
        .2,
    )
    .unwrap();
    assert_eq!(
        one["issues"].as_array().unwrap().len(),
        1,
        "limit is clamped to 1..100"
    );
}

#[test]
fn a_corrupt_issue_store_is_reported_and_the_daemon_runs_on() {
    let dir = TestDir::new("store-corrupt");
    fs::create_dir_all(dir.join("home/.svc")).unwrap();
    fs::write(dir.join("home/.svc/issues.db"), vec![b'x'; 8192]).unwrap();
    let (d, _) = board_daemon(&dir, "", &[]);
    let base = base_url(&d);
    d.wait_log(10, "is not a valid SQLite database");
    let (status, _, body) = http("GET", &format!("{base}/api/v1/issues/recent"), &[], None);
    assert_eq!((status, error_of(&body).0.as_str()), (404, "not_found"));
    assert_eq!(http("GET", &format!("{base}/health"), &[], None).0, 200);
}

fn ws_connect(base: &str) -> tungstenite::WebSocket<std::net::TcpStream> {
    let addr = base.trim_start_matches("http://");
    let stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(15)))
        .unwrap();
    let (ws, _) =
        tungstenite::client(format!("ws://{addr}/ws"), stream).expect("the upgrade succeeds");
    ws
}

fn ws_next(ws: &mut tungstenite::WebSocket<std::net::TcpStream>, kind: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        assert!(std::time::Instant::now() < deadline, "no {kind} message");
        match ws.read().expect("a message") {
            tungstenite::Message::Text(t) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                if v["type"] == kind {
                    return v;
                }
            }
            _ => continue,
        }
    }
}

#[test]
fn an_idle_daemon_publishes_nothing_until_something_changes() {
    let dir = TestDir::new("quiet");
    let (d, _) = board_daemon(&dir, "", &[]);
    let base = base_url(&d);
    let mut ws = ws_connect(&base);
    ws_next(&mut ws, "ops_state");
    // Let the start settle (the first polls), then count over a few seconds of idling: at
    // 200 ms polls the old daemon sent about ten ops_state messages a second, and printed
    // as many snapshot lines.
    std::thread::sleep(std::time::Duration::from_secs(1));
    ws.get_mut()
        .set_read_timeout(Some(std::time::Duration::from_millis(100)))
        .unwrap();
    while ws.read().is_ok() {}
    let printed_before = d.snapshot_count();
    let window = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut ops_states = 0;
    while std::time::Instant::now() < window {
        match ws.read() {
            Ok(tungstenite::Message::Text(t)) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                if v["type"] == "ops_state" {
                    ops_states += 1;
                }
            }
            Ok(_) => {}
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("websocket: {e}"),
        }
    }
    let printed = d.snapshot_count() - printed_before;
    assert_eq!(ops_states, 0, "ops_state messages while idle");
    assert_eq!(printed, 0, "snapshot lines printed while idle");
    // The heartbeat stays visible where it is shown: the daemon route computes its age.
    let daemon = |base: &str| -> Value {
        serde_json::from_str(&http("GET", &format!("{base}/api/v1/daemon"), &[], None).2).unwrap()
    };
    let first = daemon(&base);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let second = daemon(&base);
    assert_ne!(
        first["heartbeat_at"], second["heartbeat_at"],
        "the heartbeat moves"
    );
    assert!(
        second["heartbeat_age_ms"].as_u64().unwrap() < 5000,
        "{second}"
    );
    assert_eq!(second["stale"], false);
    // A real change is still pushed at once: a new board issue starts a run.
    fs::write(
        dir.join("board/BOARD-1.md"),
        "---\ntitle: Wake up\nstate: Todo\n---\ndemo: slow 2000\n",
    )
    .unwrap();
    ws.get_mut()
        .set_read_timeout(Some(std::time::Duration::from_secs(15)))
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let v = ws_next(&mut ws, "ops_state");
        if v["state"]["counts"]["running"] == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run was never pushed"
        );
    }
}

#[test]
fn trace_routes_and_the_websocket_push_channel() {
    let dir = TestDir::new("ws");
    let (d, _) = board_daemon(
        &dir,
        "",
        &[(
            "BOARD-1.md",
            "---\ntitle: Traced issue\nstate: Todo\n---\ndemo: keep-open\ndemo: slow 2500\n",
        )],
    );
    let base = base_url(&d);
    d.wait_for(20, "a run", |s| s["counts"]["running"] == 1);
    let mut ws = ws_connect(&base);
    let first = match ws.read().unwrap() {
        tungstenite::Message::Text(t) => serde_json::from_str::<Value>(t.as_str()).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(first["type"], "init", "init comes first");
    assert!(first["tickets"].is_array());
    let state = ws_next(&mut ws, "ops_state");
    assert!(state["state"]["counts"].is_object());
    ws.send(tungstenite::Message::text("this is not json"))
        .unwrap();
    ws.send(tungstenite::Message::text(
        r#"{"type":"subscribe","issueId":5}"#,
    ))
    .unwrap();
    ws.send(tungstenite::Message::text(
        r#"{"type":"subscribe","issueId":"BOARD-1"}"#,
    ))
    .unwrap();
    let events = ws_next(&mut ws, "events");
    assert_eq!(events["issueId"], "BOARD-1");
    // The run goes on: new trace lines arrive as events_append, and tickets as update.
    let append = ws_next(&mut ws, "events_append");
    assert_eq!(append["issueId"], "BOARD-1");
    assert!(append["fromIndex"].is_u64() && append["events"].is_array());
    let update = ws_next(&mut ws, "update");
    assert!(
        update["tickets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["issueId"] == "BOARD-1")
    );

    // The same timeline over HTTP.
    let tickets: Value =
        serde_json::from_str(&http("GET", &format!("{base}/api/v1/tickets"), &[], None).2).unwrap();
    let t = tickets["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["issueId"] == "BOARD-1")
        .expect("the ticket")
        .clone();
    assert_eq!(
        (
            t["identifier"].as_str(),
            t["title"].as_str(),
            t["agentKind"].as_str()
        ),
        (Some("BOARD-1"), Some("Traced issue"), Some("demo"))
    );
    assert!(
        ["running", "completed", "idle"].contains(&t["status"].as_str().unwrap()),
        "{t}"
    );
    assert!(t["url"].as_str().unwrap().starts_with("file://"));
    let exists: Value = serde_json::from_str(
        &http(
            "GET",
            &format!("{base}/api/v1/tickets/BOARD-1/exists"),
            &[],
            None,
        )
        .2,
    )
    .unwrap();
    assert_eq!(exists, json!({"exists": true}));
    let hostile: Value = serde_json::from_str(
        &http(
            "GET",
            &format!("{base}/api/v1/tickets/..%2F..%2Fetc%2Fpasswd/exists"),
            &[],
            None,
        )
        .2,
    )
    .unwrap();
    assert_eq!(hostile, json!({"exists": false}));
    assert_eq!(
        http(
            "GET",
            &format!("{base}/api/v1/tickets/%E0%A4/exists"),
            &[],
            None
        )
        .0,
        400
    );
    assert_eq!(
        http(
            "GET",
            &format!("{base}/api/v1/tickets/BOARD-1/other"),
            &[],
            None
        )
        .0,
        404
    );
    let events: Value = serde_json::from_str(
        &http(
            "GET",
            &format!("{base}/api/v1/tickets/BOARD-1/events"),
            &[],
            None,
        )
        .2,
    )
    .unwrap();
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(events["identifier"], "BOARD-1");
    for k in [
        "turn_started",
        "thought",
        "message",
        "tool_call",
        "permission",
        "plan",
    ] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    let tool = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "tool_call")
        .unwrap();
    assert_eq!(tool["status"], "completed");
    assert!(tool["durationMs"].is_u64());
    assert_eq!(
        http("GET", &format!("{base}/ws"), &[], None).0,
        400,
        "a plain GET is not an upgrade"
    );
}

/// Parses a `/metrics` body with the official Prometheus Python client's text parser; returns
/// `name{label="v",...}` (labels sorted) to value.
fn parse_metrics(text: &str) -> std::collections::BTreeMap<String, f64> {
    let script = "import json, sys\nfrom prometheus_client.parser import text_string_to_metric_families\nout = {}\nfor fam in text_string_to_metric_families(sys.stdin.read()):\n    for s in fam.samples:\n        labels = ','.join(f'{k}=\"{v}\"' for k, v in sorted(s.labels.items()))\n        out[s.name + ('{' + labels + '}' if labels else '')] = s.value\nprint(json.dumps(out))\n";
    let mut child = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
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
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn metrics_are_scrapeable_and_match_the_snapshot() {
    let dir = TestDir::new("metrics");
    let (d, _) = board_daemon(
        &dir,
        "",
        &[
            (
                "BOARD-1.md",
                "---\ntitle: Crash\nstate: Todo\n---\ndemo: crash\n",
            ),
            (
                "BOARD-2.md",
                "---\ntitle: Long\nstate: Todo\n---\ndemo: slow 60000\ndemo: keep-open\n",
            ),
        ],
    );
    // Quiet for the next 10 s: one run failed and waits for its retry, one runs on.
    d.wait_for(30, "a failure retrying and a run", |s| {
        s["counts"]["retrying"] == 1 && s["counts"]["running"] == 1
    });
    std::thread::sleep(std::time::Duration::from_millis(400));
    let base = base_url(&d);
    let (status, _, state) = http("GET", &format!("{base}/api/v1/state"), &[], None);
    assert_eq!(status, 200);
    let state: Value = serde_json::from_str(&state).unwrap();
    let (status, headers, body) = http("GET", &format!("{base}/metrics"), &[], None);
    assert_eq!(status, 200);
    assert!(
        headers.to_lowercase().contains("text/plain; version=0.0.4"),
        "{headers}"
    );
    let m = parse_metrics(&body);
    assert_eq!(m["svc_running"], 1.0, "{body}");
    assert_eq!(m["svc_retrying"], 1.0);
    assert_eq!(m["svc_reserving"], 0.0);
    assert_eq!(m["svc_blocked{reason=\"global_concurrency_cap\"}"], 0.0);
    assert_eq!(m["svc_runs_total{outcome=\"failed\"}"], 1.0);
    assert_eq!(m["svc_runs_total{outcome=\"success\"}"], 0.0);
    assert_eq!(m["svc_retries_total"], 1.0);
    assert_eq!(
        m["svc_tokens_total{direction=\"input\"}"],
        state["usage_totals"]["input_tokens"].as_f64().unwrap()
    );
    assert_eq!(
        m["svc_tokens_total{direction=\"output\"}"],
        state["usage_totals"]["output_tokens"].as_f64().unwrap()
    );
    assert!(m["svc_polls_total{tracker=\"work\"}"] >= 1.0);
    assert_eq!(m["svc_poll_failures_total{tracker=\"work\"}"], 0.0);
    assert!(m["svc_agent_seconds_total"] > 0.0);
    assert_eq!(m["svc_trace_write_failures_total"], 0.0);
    assert_eq!(m["svc_store_write_failures_total{store=\"claims\"}"], 0.0);
    assert_eq!(m["svc_ws_clients"], 0.0);
    assert!(m["svc_http_requests_total{route=\"/api/v1/state\",status=\"200\"}"] >= 1.0);
    // A 404 is counted under its own status; the next scrape sees both.
    http("GET", &format!("{base}/nowhere"), &[], None);
    let (_, _, body) = http("GET", &format!("{base}/metrics"), &[], None);
    let m = parse_metrics(&body);
    assert_eq!(
        m["svc_http_requests_total{route=\"unmatched\",status=\"404\"}"],
        1.0
    );
    assert!(m["svc_http_requests_total{route=\"/metrics\",status=\"200\"}"] >= 1.0);
}
