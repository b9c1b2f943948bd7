//! What runs cost, end to end: the real daemon with the demo agent and a price table, read
//! back through the API, `svc runs --cost`, `/metrics` and the trace.

mod common;

use common::*;
use serde_json::{Value, json};

/// Every trace line of type `turn_completed` under `traces/`.
fn turns_completed(dir: &TestDir) -> Vec<Value> {
    fn walk(path: &std::path::Path, out: &mut Vec<Value>) {
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.file_name().is_some_and(|n| n == "trace.jsonl") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                out.extend(
                    text.lines()
                        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                        .filter(|v| v["type"] == "turn_completed"),
                );
            }
        }
    }
    let mut out = Vec::new();
    walk(&dir.join("traces"), &mut out);
    out
}

#[test]
fn runs_show_dollars_from_prices_or_the_bridge_and_na_where_unknown() {
    let dir = TestDir::new("cost");
    let issue = |labels: &str, description: &str| {
        format!("---\ntitle: Costly\nstate: Todo\nlabels: [{labels}]\n---\n{description}\n")
    };
    let board = dir.join("board");
    std::fs::create_dir_all(&board).unwrap();
    for (file, text) in [
        // Priced: 1,000 input and 200 output tokens at $2 and $10 per million.
        ("BOARD-1.md", issue("", "demo: cost none")),
        // The bridge's own $0.006 wins over the prices.
        ("BOARD-2.md", issue("", "")),
        // Euros: kept as such, out of the dollar sums.
        ("BOARD-3.md", issue("", "demo: cost 1.5 EUR")),
        // An agent kind with no prices, and a bridge that reports no cost.
        ("BOARD-4.md", issue("Svc:free", "demo: cost none")),
    ] {
        std::fs::write(board.join(file), text).unwrap();
    }
    let wf = workflow_with_description(
        &dir,
        "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\nworkspace:\n  root: ws\nserver:\n  port: 0\n  trace_dir: traces\npolling:\n  interval_ms: 200\nagent:\n  kind: demo\n  max_turns: 1\n  max_concurrent_agents: 4\nagents:\n  demo:\n    bridge_command: svc demo-agent\n    pricing:\n      input: 2\n      output: 10\n      cached_input: 0.2\n  free:\n    bridge_command: svc demo-agent\n",
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    let base = base_url(&d);
    let runs = || -> Vec<Value> {
        let (_, _, body) = http("GET", &format!("{base}/api/v1/runs?limit=50"), &[], None);
        serde_json::from_str::<Value>(&body).unwrap()["runs"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    wait_until(60, "four finished runs", || {
        let runs = runs();
        ["BOARD-1", "BOARD-2", "BOARD-3", "BOARD-4"]
            .iter()
            .all(|id| {
                runs.iter()
                    .any(|r| r["issue_identifier"] == *id && r["outcome"] == "success")
            })
    });
    let runs = runs();
    let cost_of = |id: &str| {
        runs.iter()
            .find(|r| r["issue_identifier"] == id && r["outcome"] == "success")
            .unwrap()["cost"]
            .clone()
    };
    assert_eq!(cost_of("BOARD-1"), json!({"estimated_cost_usd": 0.004}));
    assert_eq!(cost_of("BOARD-2"), json!({"estimated_cost_usd": 0.006}));
    assert_eq!(
        cost_of("BOARD-3"),
        json!({"estimated_cost_usd": null, "other_currency": {"amount": 1.5, "currency": "EUR"}})
    );
    assert_eq!(cost_of("BOARD-4"), json!({"estimated_cost_usd": null}));

    let (_, _, body) = http("GET", &format!("{base}/api/v1/runs?cost=1"), &[], None);
    let cost: Value = serde_json::from_str(&body).unwrap();
    let agents = cost["summary"]["agents"].as_array().unwrap();
    let agent = |kind: &str| agents.iter().find(|a| a["agent_kind"] == kind).unwrap();
    assert_eq!(agent("demo")["estimated_cost_usd"], json!(0.01), "{cost:#}");
    assert_eq!(agent("demo")["priced_runs"], 2);
    assert_eq!(agent("demo")["other_currencies"], json!({"EUR": 1.5}));
    assert_eq!(agent("free")["estimated_cost_usd"], Value::Null);

    let r = run(svc(&dir).args(["runs", "--url", &base, "--cost"]));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let row = |first: &str| -> Vec<String> {
        r.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no row {first}: {}", r.stdout))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    // The spec's columns hold one value each; euros are shown in a table of their own.
    assert_eq!(row("demo")[7..], ["0.01"], "{}", r.stdout);
    assert_eq!(row("free")[7..], ["n/a"], "{}", r.stdout);
    let euros: Vec<&str> = r
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("other currencies"))
        .nth(2)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(euros, ["demo", "1.50", "EUR"], "{}", r.stdout);
    let top_run = |identifier: &str| -> Vec<String> {
        r.stdout
            .lines()
            .skip_while(|l| !l.starts_with("top runs"))
            .find(|l| l.split_whitespace().nth(1) == Some(identifier))
            .unwrap_or_else(|| panic!("no top run {identifier}: {}", r.stdout))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(top_run("BOARD-1")[4], "0.004", "{}", r.stdout);
    assert_eq!(top_run("BOARD-2")[4], "0.006", "{}", r.stdout);
    assert_eq!(top_run("BOARD-4")[4], "n/a", "{}", r.stdout);
    assert_eq!(
        top_run("BOARD-3")[4..],
        ["n/a", "success", "1.50", "EUR"],
        "{}",
        r.stdout
    );

    let (_, _, metrics) = http("GET", &format!("{base}/metrics"), &[], None);
    assert!(
        metrics.contains("svc_cost_usd_total{agent_kind=\"demo\"} 0.01\n"),
        "{metrics}"
    );

    // The trace writer writes in batches of its own.
    wait_until(20, "the four runs' turns traced", || {
        turns_completed(&dir).len() >= 4
    });
    let turns = turns_completed(&dir);
    let traced = |id: &str| {
        turns
            .iter()
            .find(|t| t["identifier"] == id)
            .unwrap_or_else(|| panic!("no turn of {id}: {turns:?}"))["cost"]
            .clone()
    };
    assert_eq!(
        traced("BOARD-1"),
        json!({"amount": 0.004, "currency": "USD", "run": 0.004, "source": "prices"})
    );
    assert_eq!(
        traced("BOARD-2"),
        json!({"amount": 0.006, "currency": "USD", "run": 0.006, "source": "bridge"})
    );
    assert_eq!(traced("BOARD-3")["currency"], "EUR");
    assert_eq!(traced("BOARD-4"), Value::Null);
}

/// A running run whose agent's prices are known costs `0` until its first usage report; one
/// whose price is unknown shows `null`.
#[test]
fn a_priced_run_shows_zero_dollars_before_its_first_usage_report() {
    let dir = TestDir::new("cost-running");
    let board = dir.join("board");
    std::fs::create_dir_all(&board).unwrap();
    for (file, labels) in [("BOARD-1.md", ""), ("BOARD-2.md", "Svc:free")] {
        std::fs::write(
            board.join(file),
            format!("---\ntitle: Slow\nstate: Todo\nlabels: [{labels}]\n---\ndemo: slow 60000\n"),
        )
        .unwrap();
    }
    let wf = workflow_with_description(
        &dir,
        "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\nworkspace:\n  root: ws\nserver:\n  port: 0\npolling:\n  interval_ms: 200\nagent:\n  kind: demo\n  max_turns: 1\n  max_concurrent_agents: 2\nagents:\n  demo:\n    bridge_command: svc demo-agent\n    pricing:\n      input: 2\n      output: 10\n  free:\n    bridge_command: svc demo-agent\n",
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    let base = base_url(&d);
    let running = || -> Vec<Value> {
        let (_, _, body) = http("GET", &format!("{base}/api/v1/runs?limit=50"), &[], None);
        serde_json::from_str::<Value>(&body).unwrap()["runs"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r["outcome"] == "running")
            .collect()
    };
    // The demo agent answers its first turn after a minute: no usage report before.
    wait_until(30, "both runs running with a session", || {
        running()
            .iter()
            .filter(|r| !r["session_id"].is_null())
            .count()
            == 2
    });
    let runs = running();
    let cost_of =
        |id: &str| runs.iter().find(|r| r["issue_identifier"] == id).unwrap()["cost"].clone();
    assert_eq!(
        cost_of("BOARD-1"),
        json!({"estimated_cost_usd": 0.0}),
        "{runs:?}"
    );
    assert_eq!(
        cost_of("BOARD-2"),
        json!({"estimated_cost_usd": null}),
        "{runs:?}"
    );
}
