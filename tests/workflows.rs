//! Many workflows in one daemon, end to end: the real binary given a directory of workflow
//! files, each over its own local board with the demo agent (which records the prompts it
//! gets), read back as a user would: the agents' prompts, the workspaces and traces on disk, the
//! API's answers.

mod common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

const TOKEN: &str = "workflows-control-token-01";

/// Writes workflow `name` into `wf/` over the board `boards/<name>/` holding `issues` (file,
/// description) in Todo; its demo agent records its prompts in `prompts-<name>.jsonl`.
/// `extra` is more front matter (at least `agent:` lines after `agent:\n  kind: demo\n`).
fn workflow(dir: &TestDir, name: &str, issues: &[(&str, &str)], extra: &str) -> PathBuf {
    let board = dir.join(&format!("boards/{name}"));
    fs::create_dir_all(&board).unwrap();
    for (file, description) in issues {
        fs::write(
            board.join(file),
            format!("---\ntitle: {name} {file}\nstate: Todo\n---\n{description}\n"),
        )
        .unwrap();
    }
    let prompts = dir.join(&format!("prompts-{name}.jsonl"));
    dir.write(
        &format!("wf/{name}.md"),
        &format!(
            "---\ntracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: {}\npolling:\n  interval_ms: 200\nworkspace:\n  root: {}\nagent:\n  kind: demo\n{extra}agents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\nserver:\n  port: 0\n  trace_dir: {}\n---\nWork on {{{{ issue.identifier }}}}.\n{{{{ issue.description }}}}\n",
            board.display(),
            dir.join(&format!("ws/{name}")).display(),
            prompts.display(),
            svc_bin(),
            dir.join("traces").display(),
        ),
    )
}

fn start(dir: &TestDir, args: &[&Path]) -> Daemon {
    let mut cmd = svc(dir);
    cmd.arg("--no-tui")
        .args(args)
        .env("SVC_CONTROL_TOKEN", TOKEN);
    Daemon::start(cmd)
}

fn get(d: &Daemon, path: &str) -> (u16, Value) {
    let (status, _, body) = http("GET", &format!("{}{path}", base_url(d)), &[], None);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn steer(d: &Daemon, issue: &str, message: &str) -> (u16, Value) {
    let auth = format!("Bearer {TOKEN}");
    let body = serde_json::json!({"message": message}).to_string();
    let (status, _, answer) = http(
        "POST",
        &format!("{}/api/v1/{issue}/steer", base_url(d)),
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        Some(&body),
    );
    (status, serde_json::from_str(&answer).unwrap_or(Value::Null))
}

fn prompts(dir: &TestDir, name: &str) -> Vec<String> {
    prompt_texts(&dir.join(&format!("prompts-{name}.jsonl")))
}

fn workflow_of<'a>(s: &'a Value, name: &str) -> &'a Value {
    s["workflows"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["name"] == name))
        .unwrap_or(&Value::Null)
}

#[test]
fn two_workflows_run_their_own_issue_of_one_identifier_apart_and_a_bare_identifier_is_ambiguous() {
    let dir = TestDir::new("workflows-apart");
    // Each run holds its session open a while, so both run at once and can be steered.
    let hold = "demo: hold 1500";
    workflow(&dir, "alpha", &[("BOARD-1.md", hold)], "  max_turns: 20\n");
    workflow(&dir, "beta", &[("BOARD-1.md", hold)], "  max_turns: 20\n");
    let d = start(&dir, &[&dir.join("wf")]);
    wait_until(60, "both agents' first prompts", || {
        !prompts(&dir, "alpha").is_empty() && !prompts(&dir, "beta").is_empty()
    });
    // Both run at once, each in its own workspace, each listed with its workflow.
    let s = d.wait_for(30, "both running", |s| {
        s["running"].as_array().is_some_and(|r| r.len() == 2)
    });
    let mut running: Vec<(String, String)> = s["running"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["issue_identifier"], "BOARD-1", "{r}");
            (
                r["workflow"].as_str().unwrap().to_string(),
                r["workspace_path"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    running.sort();
    assert_eq!(running[0].0, "alpha");
    assert_eq!(running[1].0, "beta");
    assert_ne!(running[0].1, running[1].1);
    assert!(Path::new(&running[0].1).starts_with(dir.join("ws/alpha")));
    assert!(Path::new(&running[1].1).starts_with(dir.join("ws/beta")));
    assert!(Path::new(&running[0].1).is_dir() && Path::new(&running[1].1).is_dir());
    assert_eq!(workflow_of(&s, "alpha")["running"], 1, "{}", s["workflows"]);
    assert_eq!(workflow_of(&s, "beta")["tracker_kind"], "work");
    assert_eq!(workflow_of(&s, "beta")["status"], "ok");
    // The fleet's entry of this daemon lists its workflows; `/metrics` has each one's series.
    let me: Vec<&Value> = s["fleet"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["this"] == true)
        .collect();
    assert_eq!(me.len(), 1, "{}", s["fleet"]);
    assert_eq!(me[0]["workflows"], serde_json::json!(["alpha", "beta"]));
    assert_eq!(me[0]["running"], 2);
    let (_, _, metrics) = http("GET", &format!("{}/metrics", base_url(&d)), &[], None);
    for w in ["alpha", "beta"] {
        assert!(
            metrics.contains(&format!("svc_workflow_running{{workflow=\"{w}\"}} 1")),
            "{metrics}"
        );
        assert!(
            metrics.contains(&format!("svc_workflow_up{{workflow=\"{w}\"}} 1")),
            "{metrics}"
        );
    }
    // A bare identifier both have is ambiguous, everywhere an operator names an issue.
    let (status, body) = steer(&d, "BOARD-1", "which one?");
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "ambiguous_issue");
    assert_eq!(body["workflows"], serde_json::json!(["alpha", "beta"]));
    let (status, body) = get(&d, "/api/v1/BOARD-1");
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "ambiguous_issue");
    // The qualified form names one: the issue route, and steering the right agent.
    let (status, body) = get(&d, "/api/v1/alpha:BOARD-1");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["running"]["workflow"], "alpha", "{body}");
    let (status, body) = steer(&d, "beta:BOARD-1", "only for beta");
    assert_eq!(status, 202, "{body}");
    wait_until(60, "beta's agent got the message", || {
        prompts(&dir, "beta")
            .iter()
            .any(|p| p.contains("only for beta"))
    });
    assert!(
        !prompts(&dir, "alpha")
            .iter()
            .any(|p| p.contains("only for beta")),
        "alpha's agent never sees beta's message"
    );
    // `?workflow=` narrows the state and runs views; an unknown one is a 404.
    let (status, body) = get(&d, "/api/v1/state?workflow=alpha");
    assert_eq!(status, 200);
    let listed: Vec<&Value> = body["running"].as_array().unwrap().iter().collect();
    assert!(listed.iter().all(|r| r["workflow"] == "alpha"), "{body}");
    assert_eq!(body["counts"]["running"], listed.len());
    let (status, body) = get(&d, "/api/v1/runs?workflow=beta");
    assert_eq!(status, 200);
    assert!(
        body["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["workflow"] == "beta"),
        "{body}"
    );
    assert_eq!(get(&d, "/api/v1/state?workflow=gamma").0, 404);
    assert_eq!(get(&d, "/api/v1/runs?issue=BOARD-1").0, 409);
    let (status, body) = get(&d, "/api/v1/runs?issue=alpha:BOARD-1");
    assert_eq!(status, 200, "{body}");
    let runs = body["runs"].as_array().unwrap();
    assert!(
        !runs.is_empty() && runs.iter().all(|r| r["workflow"] == "alpha"),
        "{body}"
    );
    // Traced apart: one trace per workflow's issue.
    wait_until(30, "a trace for each", || {
        let names: Vec<String> = fs::read_dir(dir.join("traces"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.iter().any(|n| n.starts_with("alpha%3A"))
            && names.iter().any(|n| n.starts_with("beta%3A"))
    });
}

#[test]
fn the_daemon_wide_cap_is_shared_fairly_between_busy_workflows() {
    let dir = TestDir::new("workflows-fair");
    let issues = [("BOARD-1.md", ""), ("BOARD-2.md", ""), ("BOARD-3.md", "")];
    workflow(&dir, "alpha", &issues, "  max_turns: 1\n");
    // Only one file sets the daemon-wide cap: every workflow is under it.
    workflow(
        &dir,
        "beta",
        &issues,
        "  max_turns: 1\ndaemon:\n  max_concurrent_agents: 1\n",
    );
    let d = start(&dir, &[&dir.join("wf")]);
    wait_until(120, "every issue of both boards done", || {
        ["alpha", "beta"].iter().all(|w| {
            (1..=3).all(|n| {
                fs::read_to_string(dir.join(&format!("boards/{w}/BOARD-{n}.md")))
                    .unwrap_or_default()
                    .contains("state: Done")
            })
        })
    });
    // The runs as the API lists them once all six have ended (a board file says Done while
    // its agent's turn is still ending).
    let mut body = Value::Null;
    wait_until(60, "six finished runs listed", || {
        body = get(&d, "/api/v1/runs?limit=200").1;
        body["runs"]
            .as_array()
            .is_some_and(|r| r.len() == 6 && r.iter().all(|r| r["outcome"] == "success"))
    });
    let mut runs: Vec<&Value> = body["runs"].as_array().unwrap().iter().collect();
    runs.sort_by(|a, b| a["started_at"].as_str().cmp(&b["started_at"].as_str()));
    let order: Vec<&str> = runs
        .iter()
        .map(|r| r["workflow"].as_str().unwrap())
        .collect();
    assert_eq!(order.len(), 6, "{body}");
    // One at a time: each run started after the one before ended.
    for pair in runs.windows(2) {
        assert!(
            pair[1]["started_at"].as_str() >= pair[0]["ended_at"].as_str(),
            "{pair:?}"
        );
    }
    // They alternate: no workflow took two slots in a row while the other waited.
    for pair in order.windows(2) {
        assert_ne!(pair[0], pair[1], "{order:?}");
    }
}

#[test]
fn conflicting_daemon_wide_keys_are_refused_naming_both_files() {
    let dir = TestDir::new("workflows-conflict");
    let a = workflow(
        &dir,
        "alpha",
        &[],
        "  max_turns: 1\nobservability:\n  dashboard_enabled: true\n",
    );
    let b = workflow(
        &dir,
        "beta",
        &[],
        "  max_turns: 1\nobservability:\n  dashboard_enabled: false\n",
    );
    let out = run(svc(&dir).arg("--no-tui").arg(dir.join("wf")));
    assert_eq!(out.code, Some(1), "{}", out.all());
    let text = out.all();
    assert!(text.contains(&a.display().to_string()), "{text}");
    assert!(text.contains(&b.display().to_string()), "{text}");
    assert!(text.contains("observability.dashboard_enabled"), "{text}");
}

#[test]
fn a_broken_reload_of_one_workflow_leaves_the_others_untouched() {
    let dir = TestDir::new("workflows-reload");
    let alpha = workflow(&dir, "alpha", &[], "  max_turns: 1\n");
    workflow(&dir, "beta", &[], "  max_turns: 1\n");
    let d = start(&dir, &[&dir.join("wf")]);
    d.wait_for(30, "both polled", |s| {
        ["alpha", "beta"]
            .iter()
            .all(|w| !workflow_of(s, w)["last_poll_at"].is_null())
    });
    // Alpha's file breaks: alpha is shown failing, with why; beta is not.
    fs::write(&alpha, "---\ntracker: [\n---\nbroken\n").unwrap();
    let s = d.wait_for(30, "alpha failing", |s| {
        workflow_of(s, "alpha")["status"] == "failing"
    });
    assert!(
        workflow_of(&s, "alpha")["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("alpha.md")),
        "{}",
        s["workflows"]
    );
    assert_eq!(
        workflow_of(&s, "beta")["status"],
        "ok",
        "{}",
        s["workflows"]
    );
    // Both still work: alpha on its last good settings, beta as before.
    for w in ["alpha", "beta"] {
        fs::write(
            dir.join(&format!("boards/{w}/BOARD-7.md")),
            "---\ntitle: new\nstate: Todo\n---\nnew work\n",
        )
        .unwrap();
    }
    wait_until(60, "both new issues worked", || {
        !prompts(&dir, "alpha").is_empty() && !prompts(&dir, "beta").is_empty()
    });
    assert!(!d.stderr().contains("panicked"), "{}", d.stderr());
}

#[test]
fn the_daemon_wide_daily_budget_stops_dispatch_in_every_workflow() {
    let dir = TestDir::new("workflows-budget");
    let issues = [("BOARD-1.md", ""), ("BOARD-2.md", ""), ("BOARD-3.md", "")];
    // The demo agent's turn costs $0.006: the second run reaches $0.01.
    workflow(
        &dir,
        "alpha",
        &issues,
        "  max_turns: 1\n  max_concurrent_agents: 1\ndaemon:\n  daily_budget_usd: 0.01\n  max_concurrent_agents: 1\n",
    );
    workflow(
        &dir,
        "beta",
        &issues,
        "  max_turns: 1\n  max_concurrent_agents: 1\n",
    );
    let d = start(&dir, &[&dir.join("wf")]);
    let s = d.wait_for(120, "both workflows held by the daemon's budget", |s| {
        ["alpha", "beta"].iter().all(|w| {
            s["blocked"].as_array().is_some_and(|b| {
                b.iter()
                    .any(|b| b["workflow"] == *w && b["reason"] == "daily_budget_reached")
            })
        })
    });
    assert!(s["running"].as_array().unwrap().is_empty(), "{s}");
    // Nothing more starts.
    let done = prompts(&dir, "alpha").len() + prompts(&dir, "beta").len();
    assert_eq!(done, 2, "two runs reach the budget");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(
        prompts(&dir, "alpha").len() + prompts(&dir, "beta").len(),
        done
    );
}

#[test]
fn a_hanging_tracker_delays_only_its_own_workflow() {
    let dir = TestDir::new("workflows-hang");
    // A GraphQL endpoint that takes every connection and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}/graphql", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    dir.write(
        "wf/stuck.md",
        &format!(
            "---\ntracker:\n  kind: linear\ntrackers:\n  linear:\n    provider: tracker-a\n    endpoint: {endpoint}\n    api_key: $LINEAR_KEY\n    project_slugs: [core]\npolling:\n  interval_ms: 200\nworkspace:\n  root: {}\nagent:\n  kind: demo\n  max_turns: 1\nagents:\n  demo:\n    bridge_command: svc demo-agent\n---\nWork on {{{{ issue.identifier }}}}.\n",
            dir.join("ws/stuck").display()
        ),
    );
    workflow(&dir, "alpha", &[("BOARD-1.md", "")], "  max_turns: 1\n");
    workflow(&dir, "beta", &[("BOARD-1.md", "")], "  max_turns: 1\n");
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(dir.join("wf"))
        .env("SVC_CONTROL_TOKEN", TOKEN)
        .env("LINEAR_KEY", "lin_api_test");
    let d = Daemon::start(cmd);
    // The others dispatch and finish on time while the stuck tracker's poll hangs.
    wait_until(60, "alpha's and beta's issues worked", || {
        !prompts(&dir, "alpha").is_empty() && !prompts(&dir, "beta").is_empty()
    });
    let (status, body) = get(&d, "/health");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ok");
    let s = d.wait_for(30, "alpha and beta polled", |s| {
        s["workflows"].as_array().is_some_and(|w| w.len() == 3)
            && !workflow_of(s, "alpha")["last_poll_at"].is_null()
            && !workflow_of(s, "beta")["last_poll_at"].is_null()
    });
    assert_eq!(workflow_of(&s, "stuck")["tracker_kind"], "linear");
    let latest = d.latest().unwrap();
    assert!(
        workflow_of(&latest, "stuck")["last_poll_at"].is_null(),
        "the stuck tracker never answered: {}",
        latest["workflows"]
    );
}

#[test]
fn a_workflow_file_added_to_and_removed_from_the_directory_at_run_time() {
    let dir = TestDir::new("workflows-watch");
    // Alpha's run holds its session for three turns of 1.5 s.
    let alpha = workflow(
        &dir,
        "alpha",
        &[("BOARD-1.md", "demo: hold 1500")],
        "  max_turns: 3\n",
    );
    let d = start(&dir, &[&dir.join("wf")]);
    wait_until(60, "alpha's agent prompted", || {
        !prompts(&dir, "alpha").is_empty()
    });
    // A file added to the directory is served: its issue's agent gets its prompt.
    workflow(&dir, "beta", &[("BOARD-1.md", "")], "  max_turns: 1\n");
    wait_until(60, "beta's agent prompted", || {
        !prompts(&dir, "beta").is_empty()
    });
    let s = d.wait_for(30, "beta listed", |s| {
        workflow_of(s, "beta")["status"] == "ok"
    });
    assert_eq!(
        s["workflows"].as_array().unwrap().len(),
        2,
        "{}",
        s["workflows"]
    );
    // Alpha's file removed while its run goes on: shown removed, its run finishes, and a
    // new issue on its board never starts.
    fs::remove_file(&alpha).unwrap();
    let s = d.wait_for(30, "alpha removed", |s| {
        workflow_of(s, "alpha")["status"] == "removed"
    });
    assert!(
        s["running"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["workflow"] == "alpha"),
        "alpha's run goes on: {s}"
    );
    fs::write(
        dir.join("boards/alpha/BOARD-2.md"),
        "---\ntitle: late\nstate: Todo\n---\nlate\n",
    )
    .unwrap();
    d.wait_for(60, "alpha gone from the views", |s| {
        s["workflows"]
            .as_array()
            .is_some_and(|w| w.iter().all(|w| w["name"] != "alpha"))
    });
    assert!(
        !prompts(&dir, "alpha").iter().any(|p| p.contains("BOARD-2")),
        "nothing new started for the removed workflow"
    );
    // Beta goes on: a new issue there is worked.
    fs::write(
        dir.join("boards/beta/BOARD-2.md"),
        "---\ntitle: more\nstate: Todo\n---\nmore\n",
    )
    .unwrap();
    wait_until(60, "beta's second issue worked", || {
        prompts(&dir, "beta").iter().any(|p| p.contains("BOARD-2"))
    });
}

/// The operator's views of a daemon serving two workflows: `svc runs --workflow NAME` lists
/// only that workflow's runs, in a WORKFLOW column; a name the daemon does not serve is a
/// clear error; `svc status` on the directory has a line per workflow.
#[test]
fn svc_runs_takes_a_workflow_and_svc_status_has_a_line_per_workflow() {
    let dir = TestDir::new("workflows-views");
    workflow(&dir, "alpha", &[("BOARD-1.md", "")], "  max_turns: 1\n");
    workflow(&dir, "beta", &[("BOARD-2.md", "")], "  max_turns: 1\n");
    let d = start(&dir, &[&dir.join("wf")]);
    wait_until(60, "a finished run of each workflow", || {
        let (_, body) = get(&d, "/api/v1/runs");
        let runs = body["runs"].as_array().cloned().unwrap_or_default();
        ["alpha", "beta"].iter().all(|w| {
            runs.iter()
                .any(|r| r["workflow"] == *w && r["outcome"] != "running")
        })
    });
    let base = base_url(&d);
    let r = run(svc(&dir).args(["runs", "--url", &base, "--workflow", "beta"]));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let lines: Vec<Vec<&str>> = r
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[1][..3], ["ID", "WORKFLOW", "ISSUE"], "{}", r.stdout);
    assert!(lines.len() > 2, "{}", r.stdout);
    for row in &lines[2..] {
        assert_eq!(row[1..3], ["beta", "BOARD-2"], "{}", r.stdout);
    }
    let r = run(svc(&dir).args(["runs", "--url", &base, "--workflow", "gamma"]));
    assert_eq!(r.code, Some(1), "{}", r.all());
    assert_eq!(
        r.stderr.trim(),
        "svc runs: The daemon serves no workflow named \"gamma\" (svc status lists its workflows)"
    );
    let r = run(svc(&dir).arg("status").arg(dir.join("wf")));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let section = r
        .stdout
        .split("\nworkflows (2)\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no workflows section: {}", r.stdout));
    let names: Vec<(&str, &str)> = section
        .lines()
        .take(2)
        .map(|l| {
            let mut words = l.split_whitespace();
            (words.next().unwrap(), words.next().unwrap())
        })
        .collect();
    assert_eq!(names, [("alpha", "ok"), ("beta", "ok")], "{}", r.stdout);
    assert!(
        section
            .lines()
            .take(2)
            .all(|l| l.contains("last poll ") && !l.contains("last poll never")),
        "{}",
        r.stdout
    );
}

/// Two daemons sharing a claim store, each serving the same two workflows: the one that holds
/// nothing relays a steering message for a qualified identifier to the holder, whose agent of
/// that workflow gets it; a bare identifier both workflows have is ambiguous there too.
#[test]
fn a_qualified_identifier_is_relayed_to_the_daemon_of_the_fleet_that_holds_it() {
    let dir = TestDir::new("workflows-fleet");
    let hold = "demo: hold 1000";
    workflow(&dir, "alpha", &[("BOARD-1.md", hold)], "  max_turns: 20\n");
    workflow(&dir, "beta", &[("BOARD-1.md", hold)], "  max_turns: 20\n");
    let store = dir.join("shared.claims.db");
    let member = |home: &str| {
        let home = dir.join(home);
        fs::create_dir_all(&home).unwrap();
        let mut cmd = svc(&dir);
        cmd.arg("--no-tui")
            .arg(dir.join("wf"))
            .env("HOME", &home)
            .env("SVC_CLAIM_STORE", &store)
            .env("SVC_CLAIM_TTL_MS", "2000")
            .env("SVC_CONTROL_TOKEN", TOKEN);
        Daemon::start(cmd)
    };
    let holder = member("home-a");
    holder.wait_for(30, "both issues held", |s| {
        s["running"]
            .as_array()
            .is_some_and(|r| r.len() == 2 && r.iter().all(|r| r["claimed"] == true))
    });
    let other = member("home-b");
    let s = other.wait_for(30, "the other daemon sees the fleet", |s| {
        s["fleet"].as_array().is_some_and(|f| f.len() == 2)
    });
    assert!(s["running"].as_array().unwrap().is_empty(), "{s}");
    let (status, body) = steer(&other, "BOARD-1", "which one?");
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "ambiguous_issue");
    let (status, body) = steer(&other, "beta:BOARD-1", "relayed to beta");
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["delivery"], "relayed", "{body}");
    wait_until(60, "the holder's beta agent got the message", || {
        prompts(&dir, "beta")
            .iter()
            .any(|p| p.contains("relayed to beta"))
    });
    assert!(
        !prompts(&dir, "alpha")
            .iter()
            .any(|p| p.contains("relayed to beta")),
        "alpha's agent never sees it"
    );
}
