//! The fleet: daemons with homes of their own (as on separate hosts) sharing one claim store.
//! Each scenario runs on a shared SQLite file and, where PostgreSQL is installed (always in
//! CI), on a real PostgreSQL server started for the tests: control relayed to the daemon that
//! holds an issue, exactly once, and `svc status` listing the fleet.

mod common;

use common::*;
use serde_json::{Value, json};
use std::fs;
use std::path::{Path, PathBuf};

const TOKEN: &str = "fleet-control-token-0001";

/// A board of `issues` (file, body) in Todo and a workflow whose demo agents record their
/// prompts in `prompts.jsonl`.
fn fleet_workflow(dir: &TestDir, issues: &[(&str, &str)], cap: u32) -> (PathBuf, PathBuf) {
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    for (file, body) in issues {
        fs::write(
            board.join(file),
            format!("---\ntitle: Fleet work\nstate: Todo\n---\n{body}\n"),
        )
        .unwrap();
    }
    let prompts = dir.join("prompts.jsonl");
    let wf = workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 300\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 20\n  max_concurrent_agents: {cap}\nagents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\nserver:\n  port: 0\n",
            prompts.display(),
            svc_bin()
        ),
    );
    (wf, prompts)
}

/// A daemon of the fleet: a home of its own, the shared `store`, a 2 s claim TTL.
fn member(dir: &TestDir, wf: &Path, store: &str, name: &str) -> Daemon {
    let home = dir.join(name);
    fs::create_dir_all(&home).unwrap();
    let mut cmd = svc(dir);
    cmd.arg("--no-tui")
        .arg(wf)
        .env("HOME", &home)
        .env("SVC_CLAIM_STORE", store)
        .env("SVC_CLAIM_TTL_MS", "2000")
        .env("SVC_CONTROL_TOKEN", TOKEN);
    Daemon::start(cmd)
}

fn post(d: &Daemon, path: &str, body: Option<&str>) -> (u16, Value) {
    let auth = format!("Bearer {TOKEN}");
    let (status, _, text) = http(
        "POST",
        &format!("{}{path}", base_url(d)),
        &[
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
        ],
        body,
    );
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn count_prompts_with(path: &Path, needle: &str) -> usize {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|p| p["text"].as_str().is_some_and(|t| t.contains(needle)))
        .count()
}

/// Steer and cancel sent to a daemon that does not hold the issue are relayed through the
/// store to the one that does, and delivered there once; `svc status` on either lists both.
fn relayed_control(store: &str, dir: &TestDir) {
    let (wf, prompts) = fleet_workflow(dir, &[("BOARD-1.md", "demo: hold 1000")], 1);
    let holder = member(dir, &wf, store, "home-a");
    let s = holder.wait_for(30, "BOARD-1 running on the first daemon", |s| {
        s["counts"]["running"] == 1
    });
    let holder_id = s["daemon"]["owner_id"].as_str().unwrap().to_string();
    let other = member(dir, &wf, store, "home-b");
    other.wait_for(
        20,
        "the other daemon sees the fleet and the held issue",
        |s| s["fleet"].as_array().is_some_and(|f| f.len() == 2),
    );
    // Accepted where the issue is not: relayed to the holder, named in the answer.
    let message = json!({"message": "Relayed: mind the schema", "author": "rita"}).to_string();
    let (status, body) = post(&other, "/api/v1/BOARD-1/steer", Some(&message));
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["delivery"], "relayed", "{body}");
    assert_eq!(body["relayed"], true, "{body}");
    assert_eq!(body["holder"], holder_id.as_str(), "{body}");
    // The holder's agent gets it as a turn, once.
    wait_until(30, "the relayed message reaches the agent", || {
        count_prompts_with(&prompts, "Relayed: mind the schema") == 1
    });
    // svc status on the other daemon lists the fleet, each line with its URL.
    let out = run(svc(dir).args(["status", "--url", &base_url(&other)]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("fleet (2)"), "{}", out.stdout);
    assert!(out.stdout.contains(&base_url(&holder)), "{}", out.stdout);
    assert!(out.stdout.contains("this daemon"), "{}", out.stdout);
    // A cancel through the other daemon stops the holder's run.
    let (status, body) = post(&other, "/api/v1/BOARD-1/cancel", None);
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["canceled"], "relayed", "{body}");
    holder.wait_for(30, "the run canceled on the holder", |s| {
        s["counts"]["running"] == 0 && s.to_string().contains("canceled by the operator")
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(
        count_prompts_with(&prompts, "Relayed: mind the schema"),
        1,
        "delivered exactly once"
    );
}

#[test]
fn sqlite_control_is_relayed_to_the_daemon_that_holds_the_issue() {
    let dir = TestDir::new("fleet-relay-sqlite");
    let store = dir.join("shared.claims.db");
    relayed_control(store.to_str().unwrap(), &dir);
}
