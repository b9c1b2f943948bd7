//! The spend ledger and budgets, end to end: the real daemon with the demo agent (which reports
//! what its session cost), read back as a user would: the board file's comments, the API, `svc
//! runs --spend`, the claim store on disk.

mod common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

fn issue(title: &str, description: &str) -> String {
    format!("---\ntitle: {title}\nstate: Todo\n---\n{description}\n")
}

/// The front matter over `board/` with the demo agent and `agent_extra` under `agent:`.
fn front_matter(agent_extra: &str) -> String {
    format!(
        "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\nworkspace:\n  root: ws\nserver:\n  port: 0\npolling:\n  interval_ms: 200\nagent:\n  kind: demo\n  max_turns: 1\n  max_concurrent_agents: 1\n{agent_extra}agents:\n  demo:\n    bridge_command: svc demo-agent\n    pricing:\n      input: 3\n      output: 15\n"
    )
}

fn start(dir: &TestDir, wf: &Path) -> Daemon {
    let mut cmd = svc(dir);
    cmd.arg("--no-tui").arg(wf);
    Daemon::start(cmd)
}

fn get(d: &Daemon, path: &str) -> Value {
    let (_, _, body) = http("GET", &format!("{}{path}", base_url(d)), &[], None);
    serde_json::from_str(&body).unwrap_or(Value::Null)
}

fn runs_of(d: &Daemon, identifier: &str) -> Vec<Value> {
    get(d, "/api/v1/runs?limit=200")["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r["issue_identifier"] == identifier)
        .collect()
}

fn comments_with(dir: &TestDir, file: &str, needle: &str) -> usize {
    fs::read_to_string(dir.join("board").join(file))
        .unwrap_or_default()
        .matches(needle)
        .count()
}

#[test]
fn an_issue_budget_cancels_a_run_mid_turn_comments_once_and_holds_the_issue_until_raised() {
    let dir = TestDir::new("budget-issue");
    fs::create_dir_all(dir.join("board")).unwrap();
    // $1 spent evenly over 10 s of one turn: the $0.10 budget trips within the first second.
    fs::write(
        dir.join("board/BOARD-1.md"),
        issue("Runaway", "demo: burn 1 10000"),
    )
    .unwrap();
    let wf = workflow_with_description(&dir, &front_matter("  max_cost_usd_per_issue: 0.1\n"));
    let d = start(&dir, &wf);
    wait_until(30, "the run failed past its budget", || {
        runs_of(&d, "BOARD-1").iter().any(|r| {
            r["outcome"] == "failed"
                && r["failure_reason"]
                    .as_str()
                    .is_some_and(|f| f.starts_with("budget_exceeded"))
        })
    });
    // Cancelled mid-turn: far less than the turn's $1 was spent.
    let spend = &get(&d, "/api/v1/runs?spend=1")["issues"][0];
    assert_eq!(spend["issue_identifier"], "BOARD-1", "{spend}");
    let usd = spend["cost_usd"].as_f64().unwrap();
    assert!((0.1..0.6).contains(&usd), "{spend}");
    // One comment on the issue, saying what was spent against which budget.
    wait_until(20, "the budget comment", || {
        comments_with(&dir, "BOARD-1.md", "past its budget") == 1
    });
    let text = fs::read_to_string(dir.join("board/BOARD-1.md")).unwrap();
    assert!(text.contains("agent.max_cost_usd_per_issue"), "{text}");
    let s = d.latest().unwrap();
    assert!(
        s["recent_events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event"] == "budget_exceeded"),
        "{}",
        s["recent_events"]
    );
    // Held: polls come and go, no second run, the issue stays Todo, no second comment.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(runs_of(&d, "BOARD-1").len(), 1);
    assert_eq!(board_state(&dir, "BOARD-1.md"), "Todo");
    assert_eq!(comments_with(&dir, "BOARD-1.md", "past its budget"), 1);
    // `svc runs --spend` lists it with its dollars.
    let out = run(svc(&dir)
        .args(["runs", "--spend", "--url", &base_url(&d)])
        .arg(&wf));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("ISSUE") && out.stdout.contains("BOARD-1"),
        "{}",
        out.stdout
    );
    // The issue route has the same spend.
    let detail = get(&d, "/api/v1/runs?spend=1&issue=BOARD-1");
    assert_eq!(detail["issues"][0]["runs"], 1, "{detail}");
    // A reload that raises the budget lets it go.
    workflow_with_description(&dir, &front_matter("  max_cost_usd_per_issue: 5\n"));
    wait_until(40, "a second run after the raise", || {
        runs_of(&d, "BOARD-1")
            .iter()
            .any(|r| r["outcome"] == "success")
    });
    assert_eq!(board_state(&dir, "BOARD-1.md"), "Done");
    assert_eq!(comments_with(&dir, "BOARD-1.md", "past its budget"), 1);
}

#[test]
fn the_daily_budget_blocks_dispatch_until_it_is_raised() {
    let dir = TestDir::new("budget-daily");
    fs::create_dir_all(dir.join("board")).unwrap();
    for n in 1..=3 {
        // Each run costs the demo's $0.006.
        fs::write(
            dir.join(&format!("board/BOARD-{n}.md")),
            issue(&format!("Task {n}"), ""),
        )
        .unwrap();
    }
    let wf = workflow_with_description(&dir, &front_matter("  daily_budget_usd: 0.01\n"));
    let d = start(&dir, &wf);
    let s = d.wait_for(60, "the third issue blocked by the daily budget", |s| {
        s["blocked"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["reason"] == "daily_budget_reached"))
    });
    let blocked = s["blocked"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["reason"] == "daily_budget_reached")
        .unwrap()
        .clone();
    assert_eq!(blocked["label"], "daily budget reached", "{blocked}");
    assert!(
        s["ledger"]["today"]["cost_usd"].as_f64().unwrap() >= 0.01,
        "{}",
        s["ledger"]
    );
    assert_eq!(s["ledger"]["daily_budget_reached"], true);
    let done = |d: &Daemon| {
        (1..=3)
            .filter(|n| {
                runs_of(d, &format!("BOARD-{n}"))
                    .iter()
                    .any(|r| r["outcome"] == "success")
            })
            .count()
    };
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(done(&d), 2, "no third run while the budget is reached");
    let status = run(svc(&dir).args(["status"]).arg(&wf));
    assert!(status.stdout.contains("REACHED"), "{}", status.stdout);
    // Raised by a reload: dispatch resumes.
    workflow_with_description(&dir, &front_matter("  daily_budget_usd: 1\n"));
    wait_until(30, "the third run after the raise", || done(&d) == 3);
}

/// The claim store file of a daemon whose home is `home`.
fn claims_db(home: &Path) -> PathBuf {
    fs::read_dir(home.join(".svc/daemon"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".claims.db"))
        .expect("a claim store")
}

#[test]
fn the_ledger_survives_sigkill_and_restart() {
    let dir = TestDir::new("budget-kill");
    fs::create_dir_all(dir.join("board")).unwrap();
    fs::write(dir.join("board/BOARD-1.md"), issue("Once", "")).unwrap();
    let wf = workflow_with_description(&dir, &front_matter(""));
    let d = start(&dir, &wf);
    wait_until(30, "the run done", || {
        runs_of(&d, "BOARD-1")
            .iter()
            .any(|r| r["outcome"] == "success")
    });
    let before = get(&d, "/api/v1/runs?spend=1")["issues"][0].clone();
    assert_eq!(before["issue_identifier"], "BOARD-1", "{before}");
    assert!(before["cost_usd"].as_f64().unwrap() > 0.0, "{before}");
    // What the store holds on disk is what the API said.
    let db = claims_db(&dir.join("home"));
    wait_until(10, "the ledger on disk", || {
        rusqlite::Connection::open(&db)
            .and_then(|c| {
                c.query_row(
                    "SELECT sum(total) FROM ledger WHERE name = 'issue:BOARD-1'",
                    [],
                    |r| r.get::<_, Option<i64>>(0),
                )
            })
            .ok()
            .flatten()
            .and_then(|t| u64::try_from(t).ok())
            == before["total_tokens"].as_u64()
    });
    let mut d = d;
    d.signal(libc::SIGKILL);
    d.wait_exit(10);
    let d = start(&dir, &wf);
    wait_until(20, "the same spend after the restart", || {
        let after = &get(&d, "/api/v1/runs?spend=1")["issues"][0];
        after["total_tokens"] == before["total_tokens"]
            && after["cost_usd"] == before["cost_usd"]
            && after["runs"] == before["runs"]
    });
}

#[test]
fn two_daemons_on_one_store_share_one_daily_budget() {
    let dir = TestDir::new("budget-fleet");
    fs::create_dir_all(dir.join("board")).unwrap();
    for n in 1..=4 {
        fs::write(
            dir.join(&format!("board/BOARD-{n}.md")),
            issue(&format!("Task {n}"), "demo: slow 300"),
        )
        .unwrap();
    }
    let wf = workflow_with_description(&dir, &front_matter("  daily_budget_usd: 0.01\n"));
    let store = dir.join("shared.claims.db");
    let member = |name: &str| {
        let home = dir.join(name);
        fs::create_dir_all(&home).unwrap();
        let mut cmd = svc(&dir);
        cmd.arg("--no-tui")
            .arg(&wf)
            .env("HOME", &home)
            .env("SVC_CLAIM_STORE", &store);
        Daemon::start(cmd)
    };
    let a = member("a");
    let b = member("b");
    let reached = |d: &Daemon| {
        d.latest()
            .is_some_and(|s| s["ledger"]["daily_budget_reached"] == true)
    };
    wait_until(60, "both daemons seeing the day's budget reached", || {
        reached(&a) && reached(&b)
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // Each daemon's view of the day is the fleet's: the same dollars on both.
    let today = |d: &Daemon| d.latest().unwrap()["ledger"]["today"].clone();
    let (ta, tb) = (today(&a), today(&b));
    assert_eq!(ta["cost_usd"], tb["cost_usd"], "{ta} {tb}");
    assert_eq!(ta["runs"], tb["runs"], "{ta} {tb}");
    // Two runs (one each, or two on one) reach $0.012; at most one more may have started
    // before the other daemon's spend arrived, never all four.
    let runs = ta["runs"].as_u64().unwrap();
    assert!((2..=3).contains(&runs), "{ta}");
    let started: usize = (1..=4)
        .filter(|n| {
            let id = format!("BOARD-{n}");
            !runs_of(&a, &id).is_empty() || !runs_of(&b, &id).is_empty()
        })
        .count();
    assert_eq!(started as u64, runs, "{ta}");
}

/// The run of BOARD-1 that ended with `failure_reason` starting `budget_exceeded`, once the
/// issue's one budget comment is on the board.
fn wait_budget_stop(dir: &TestDir, d: &Daemon, budget: &str) {
    wait_until(30, "the budget comment", || {
        comments_with(dir, "BOARD-1.md", "past its budget") == 1
    });
    let text = fs::read_to_string(dir.join("board/BOARD-1.md")).unwrap();
    assert!(text.contains(budget), "{text}");
    wait_until(20, "the run failed past its budget", || {
        runs_of(d, "BOARD-1").iter().any(|r| {
            r["outcome"] == "failed"
                && r["failure_reason"]
                    .as_str()
                    .is_some_and(|f| f.starts_with("budget_exceeded"))
        })
    });
}

/// A cost the bridge reports within 500 ms of its previous report, before two minutes of
/// silence, stops the run once that interval is up, not at the turn's end.
#[test]
fn a_cost_reported_right_after_another_stops_a_turn_that_then_falls_silent() {
    let dir = TestDir::new("budget-held-cost");
    fs::create_dir_all(dir.join("board")).unwrap();
    // $0.50, then $1 at once, then 120 s of silence: the second report passes the budget.
    fs::write(
        dir.join("board/BOARD-1.md"),
        issue("Quiet spender", "demo: report 1 - 120000"),
    )
    .unwrap();
    let wf = workflow_with_description(&dir, &front_matter("  max_cost_usd_per_issue: 0.6\n"));
    let d = start(&dir, &wf);
    wait_budget_stop(&dir, &d, "agent.max_cost_usd_per_issue");
    let spend = &get(&d, "/api/v1/runs?spend=1")["issues"][0];
    assert_eq!(spend["cost_usd"].as_f64(), Some(1.0), "{spend}");
}

/// Tokens in the context (`usage_update.used`) count against `max_tokens_per_issue` as they are
/// reported: a long turn of a bridge that reports no cost is stopped mid-turn.
#[test]
fn a_token_budget_stops_a_run_mid_turn_on_its_context_size() {
    let dir = TestDir::new("budget-context-tokens");
    fs::create_dir_all(dir.join("board")).unwrap();
    // 3,000 then 6,000 tokens in the context, no cost, then 120 s of silence.
    fs::write(
        dir.join("board/BOARD-1.md"),
        issue("Long reader", "demo: report - 6000 120000"),
    )
    .unwrap();
    let wf = workflow_with_description(&dir, &front_matter("  max_tokens_per_issue: 5000\n"));
    let d = start(&dir, &wf);
    wait_budget_stop(&dir, &d, "agent.max_tokens_per_issue");
    let spend = &get(&d, "/api/v1/runs?spend=1")["issues"][0];
    assert_eq!(spend["total_tokens"].as_u64(), Some(6000), "{spend}");
}

/// The turn that takes the day past `daily_budget_usd` is the run's last: with turns left
/// and the issue still active, the agent gets no second prompt.
#[test]
fn the_turn_that_crosses_the_daily_budget_is_the_last() {
    let dir = TestDir::new("budget-daily-last-turn");
    fs::create_dir_all(dir.join("board")).unwrap();
    // No cost from the bridge: the turn's 1,000 input and 200 output tokens at the prices,
    // $0.006, known only when the turn's answer comes.
    fs::write(
        dir.join("board/BOARD-1.md"),
        issue("Open ended", "demo: cost none\ndemo: keep-open"),
    )
    .unwrap();
    let wf = workflow_with_description(
        &dir,
        &front_matter("  daily_budget_usd: 0.005\n").replace("max_turns: 1", "max_turns: 3"),
    );
    let d = start(&dir, &wf);
    wait_until(30, "the run ended", || {
        runs_of(&d, "BOARD-1")
            .iter()
            .any(|r| r["outcome"] != "running")
    });
    let turns = fs::read_to_string(dir.join("ws/BOARD-1/DEMO.md")).unwrap_or_default();
    assert_eq!(turns, "turn 1 of BOARD-1\n", "one turn, then no prompt");
    let runs = runs_of(&d, "BOARD-1");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["outcome"], "success", "{runs:?}");
}
