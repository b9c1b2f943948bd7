//! Rate limits and fallback, end to end: the real binary over a local board, with the scripted
//! demo agent answering like a limited account (`SVC_DEMO_AGENT_LIMIT`: a 429, the known
//! bridges' errors and messages, silent turns), read back as a user would: the prompts each
//! agent got, the board's files, the API's answers.

mod common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

/// One agent kind's record: the demo agent recording its prompts in `prompts-<kind>.jsonl`,
/// limited as `limit` says (`(how, words)`) while the file `limited-<kind>` exists, with
/// `more` record keys (indented four spaces).
fn kind(dir: &TestDir, name: &str, limit: Option<(&str, &str)>, more: &str) -> String {
    let mut env = format!(
        "      SVC_DEMO_AGENT_PROMPTS: {}\n",
        dir.join(&format!("prompts-{name}.jsonl")).display()
    );
    if let Some((how, words)) = limit {
        env.push_str(&format!(
            "      SVC_DEMO_AGENT_LIMIT: {how}\n      SVC_DEMO_AGENT_LIMIT_TEXT: {}\n      SVC_DEMO_AGENT_LIMIT_WHILE: {}\n",
            serde_json::to_string(words).unwrap(),
            dir.join(&format!("limited-{name}")).display()
        ));
        fs::write(dir.join(&format!("limited-{name}")), "").unwrap();
    }
    format!(
        "  {name}:\n    bridge_command: {} demo-agent\n    env:\n{env}{more}",
        svc_bin()
    )
}

/// A workflow over `board/` holding `issues` (file, description) in Todo, running `agent.kind`
/// `first` with the records `kinds`; its prompt says the previous attempt when there is one.
fn workflow(
    dir: &TestDir,
    issues: &[(&str, &str)],
    first: &str,
    agent: &str,
    kinds: &[String],
) -> PathBuf {
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    for (file, description) in issues {
        fs::write(
            board.join(file),
            format!("---\ntitle: {file}\nstate: Todo\n---\n{description}\n"),
        )
        .unwrap();
    }
    dir.write(
        "WORKFLOW.md",
        &format!(
            "---\ntracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: {first}\n{agent}agents:\n{}server:\n  port: 0\n  trace_dir: traces\n---\nWork on {{{{ issue.identifier }}}}.{{% if attempt %}} Retry {{{{ attempt }}}}.{{% endif %}}\n{{% if previous_attempt %}}Your predecessor {{{{ previous_attempt.kind }}}} met a limit at {{{{ previous_attempt.at }}}} ({{{{ previous_attempt.reason }}}}); its work is in the workspace.{{% endif %}}\n{{{{ issue.description }}}}\n",
            kinds.concat()
        ),
    )
}

/// The daemon, in UTC (a reset given with no zone is the host's).
fn start(dir: &TestDir, wf: &Path) -> Daemon {
    let mut cmd = svc(dir);
    cmd.arg("--no-tui").arg(wf).env("TZ", "UTC");
    Daemon::start(cmd)
}

fn get(d: &Daemon, path: &str) -> Value {
    let (_, _, body) = http("GET", &format!("{}{path}", base_url(d)), &[], None);
    serde_json::from_str(&body).unwrap_or(Value::Null)
}

/// The runs of `identifier`, oldest first.
fn runs_of(d: &Daemon, identifier: &str) -> Vec<Value> {
    let mut runs: Vec<Value> = get(d, "/api/v1/runs?limit=200")["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r["issue_identifier"] == identifier)
        .collect();
    runs.reverse();
    runs
}

/// The prompts kind `name`'s agent got: (when, text).
fn prompts(dir: &TestDir, name: &str) -> Vec<(u64, String)> {
    fs::read_to_string(dir.join(&format!("prompts-{name}.jsonl")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|p| {
            (
                p["atMs"].as_u64().unwrap_or_default(),
                p["text"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn lift(dir: &TestDir, name: &str) {
    fs::remove_file(dir.join(&format!("limited-{name}"))).unwrap();
}

fn has_event(s: &Value, name: &str) -> bool {
    events(s).iter().any(|e| e == name)
}

#[test]
fn a_429_ends_the_run_rate_limited_uncounted_and_its_retry_waits_for_the_reset() {
    let dir = TestDir::new("limit-429");
    let a = kind(&dir, "agent_a", Some(("error429", "Too Many Requests")), "");
    let wf = workflow(&dir, &[("BOARD-1.md", "Fix it.")], "agent_a", "", &[a]);
    let d = start(&dir, &wf);
    wait_until(60, "a limited run", || {
        runs_of(&d, "BOARD-1")
            .iter()
            .any(|r| r["outcome"] == "rate_limited")
    });
    // The account is back; the retry comes at the reset the 429 gave (3 s), not before.
    lift(&dir, "agent_a");
    wait_until(60, "the issue done", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
    let runs = runs_of(&d, "BOARD-1");
    let limited = &runs[0];
    assert_eq!(limited["outcome"], "rate_limited", "{runs:#?}");
    assert_eq!(limited["agent_kind"], "agent_a");
    let reason = limited["failure_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("agent_rate_limited: Too Many Requests"),
        "{reason}"
    );
    let sent = prompts(&dir, "agent_a");
    assert!(sent.len() >= 2, "{sent:?}");
    // Not a failed attempt: no prompt is a retry's, and no backoff beyond the reset.
    assert!(
        sent.iter().all(|(_, text)| !text.contains("Retry ")),
        "{sent:?}"
    );
    for pair in sent.windows(2) {
        assert!(
            pair[1].0 >= pair[0].0 + 3_000,
            "a prompt came before the reset: {sent:?}"
        );
    }
    let s = d.latest().unwrap();
    assert!(
        has_event(&s, "agent_rate_limited") || has_event(&s, "agent_cooldown_ended"),
        "{s:#}"
    );
}

#[test]
fn with_a_fallback_the_retry_runs_on_the_other_kind_told_of_its_predecessor() {
    let dir = TestDir::new("limit-fallback");
    let words = "You've hit your session limit · resets 4pm (Europe/Berlin)";
    let a = kind(
        &dir,
        "agent_a",
        Some(("message", words)),
        "    fallback: [agent_b]\n",
    );
    let b = kind(&dir, "agent_b", None, "");
    let wf = workflow(&dir, &[("BOARD-1.md", "Fix it.")], "agent_a", "", &[a, b]);
    let d = start(&dir, &wf);
    wait_until(60, "the issue done", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
    let on_b = prompts(&dir, "agent_b");
    assert_eq!(on_b.len(), 1, "{on_b:?}");
    let text = &on_b[0].1;
    assert!(
        text.contains("Your predecessor agent_a met a limit at 20")
            && text.contains(&format!("({words})")),
        "{text}"
    );
    assert!(!text.contains("Retry "), "not a failed attempt: {text}");
    // The board says Done while the agent's turn is still ending: wait for the run's end.
    wait_until(30, "both runs ended", || {
        let runs = runs_of(&d, "BOARD-1");
        runs.len() == 2 && runs[1]["outcome"] != "running"
    });
    let runs = runs_of(&d, "BOARD-1");
    assert_eq!(runs[0]["outcome"], "rate_limited");
    assert_eq!(runs[0]["agent_kind"], "agent_a");
    assert_eq!(runs[1]["outcome"], "success");
    assert_eq!(runs[1]["agent_kind"], "agent_b");
    // The same workspace: the fallback takes over its predecessor's work.
    assert_eq!(runs[0]["workspace_path"], runs[1]["workspace_path"]);
    // agent_a cools down: a new issue goes straight to agent_b, and agent_a is not asked.
    fs::write(
        dir.join("board/BOARD-2.md"),
        "---\ntitle: BOARD-2\nstate: Todo\n---\nMore.\n",
    )
    .unwrap();
    wait_until(60, "BOARD-2 done", || {
        board_state(&dir, "BOARD-2.md") == "Done"
    });
    assert_eq!(prompts(&dir, "agent_a").len(), 1);
    assert_eq!(prompts(&dir, "agent_b").len(), 2);
}

#[test]
fn with_every_kind_limited_issues_wait_blocked_and_dispatch_resumes_at_the_reset() {
    let dir = TestDir::new("limit-all");
    let a = kind(&dir, "agent_a", Some(("error429", "Too Many Requests")), "");
    let wf = workflow(
        &dir,
        &[("BOARD-1.md", "First."), ("BOARD-2.md", "Second.")],
        "agent_a",
        "  max_concurrent_agents: 1\n",
        &[a],
    );
    let d = start(&dir, &wf);
    // One limited run, then the other issue waits for the limit, not for a slot.
    let s = d.wait_for(60, "an issue blocked by the limit", |s| {
        s["blocked"]
            .as_array()
            .is_some_and(|b| b.iter().any(|e| e["reason"] == "agent_rate_limited"))
    });
    let blocked = s["blocked"].as_array().unwrap();
    assert_eq!(blocked[0]["label"], "agent rate limited", "{s:#}");
    assert!(has_event(&s, "agent_rate_limited"), "{s:#}");
    // No agent is started against the cooling kind meanwhile.
    assert_eq!(prompts(&dir, "agent_a").len(), 1);
    lift(&dir, "agent_a");
    let s = d.wait_for(60, "the cooldown's end", |s| {
        has_event(s, "agent_cooldown_ended")
    });
    assert!(
        !s.to_string().contains("\"reason\":\"agent_rate_limited\""),
        "{s:#}"
    );
    wait_until(60, "both issues done", || {
        board_state(&dir, "BOARD-1.md") == "Done" && board_state(&dir, "BOARD-2.md") == "Done"
    });
}

#[test]
fn two_silent_turns_in_a_row_are_a_limit() {
    let dir = TestDir::new("limit-silent");
    let a = kind(
        &dir,
        "agent_a",
        Some(("silent", "")),
        "    cooldown_ms: 2000\n",
    );
    let wf = workflow(
        &dir,
        &[("BOARD-1.md", "Fix it.")],
        "agent_a",
        "  max_turns: 5\n",
        &[a],
    );
    let d = start(&dir, &wf);
    wait_until(60, "a limited run", || {
        runs_of(&d, "BOARD-1")
            .iter()
            .any(|r| r["outcome"] == "rate_limited")
    });
    let runs = runs_of(&d, "BOARD-1");
    let reason = runs[0]["failure_reason"].as_str().unwrap();
    assert!(reason.contains("no output"), "{reason}");
    // Its two silent turns, then nothing until the cooldown (2 s) ends.
    let sent = prompts(&dir, "agent_a");
    assert_eq!(sent.len(), 2, "{sent:?}");
    lift(&dir, "agent_a");
    wait_until(60, "the issue done", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
    let sent = prompts(&dir, "agent_a");
    assert!(sent[2].0 >= sent[1].0 + 2_000, "{sent:?}");
}

#[test]
fn the_known_bridges_errors_are_limits_with_their_reset() {
    // Each with the reset its words give, as the event says it (the daemon runs in UTC, so
    // Codex's time, which names no zone, is UTC's): never the 15-minute default.
    let codex = "You've hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit https://chatgpt.com/codex/settings/usage to purchase more credits or try again at 2:57 PM.";
    for (n, (how, words, reset)) in [
        (
            "claude-error",
            "You've hit your session limit · resets 4pm (Europe/Berlin)",
            "T15:00:00",
        ),
        ("codex-error", codex, "T14:57:00"),
        // Older bridges handed the same words over as the turn's last message.
        ("message", codex, "T14:57:00"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = TestDir::new(&format!("limit-{how}-{n}"));
        let a = kind(
            &dir,
            "agent_a",
            Some((how, words)),
            "    fallback: [agent_b]\n",
        );
        let b = kind(&dir, "agent_b", None, "");
        let wf = workflow(&dir, &[("BOARD-1.md", "Fix it.")], "agent_a", "", &[a, b]);
        let d = start(&dir, &wf);
        wait_until(60, "the issue done on the fallback", || {
            board_state(&dir, "BOARD-1.md") == "Done"
        });
        let s = d.wait_for(30, "the limit said", |s| has_event(s, "agent_rate_limited"));
        let said = s["recent_events"]
            .as_array()
            .map(|e| {
                e.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        assert!(said.contains("agent_a is rate limited until 20"), "{said}");
        assert!(said.contains(reset), "{how}: {said}");
        assert_eq!(prompts(&dir, "agent_b").len(), 1, "{how}");
    }
}

#[test]
fn a_limit_one_workflow_meets_holds_for_the_daemons_other_workflows() {
    let dir = TestDir::new("limit-workflows");
    let words = "Rate limit reached for demo-model in organization org-test on requests per min (RPM). Please try again in 8s.";
    let a = kind(&dir, "agent_a", Some(("message", words)), "");
    for (name, issues) in [("alpha", vec!["BOARD-1.md"]), ("beta", vec![])] {
        let board = dir.join(&format!("boards/{name}"));
        fs::create_dir_all(&board).unwrap();
        for file in issues {
            fs::write(
                board.join(file),
                "---\ntitle: first\nstate: Todo\n---\nFix it.\n",
            )
            .unwrap();
        }
        dir.write(
            &format!("wf/{name}.md"),
            &format!(
                "---\ntracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: {}\npolling:\n  interval_ms: 200\nworkspace:\n  root: {}\nagent:\n  kind: agent_a\nagents:\n{a}server:\n  port: 0\n  trace_dir: {}\n---\nWork on {{{{ issue.identifier }}}}.\n",
                board.display(),
                dir.join(&format!("ws/{name}")).display(),
                dir.join("traces").display(),
            ),
        );
    }
    let d = start(&dir, &dir.join("wf"));
    d.wait_for(60, "alpha's limit", |s| has_event(s, "agent_rate_limited"));
    let before = prompts(&dir, "agent_a").len();
    // beta's first issue arrives while agent_a cools down: it waits, blocked by the limit.
    fs::write(
        dir.join("boards/beta/BOARD-7.md"),
        "---\ntitle: second\nstate: Todo\n---\nFix it too.\n",
    )
    .unwrap();
    let s = d.wait_for(30, "beta's issue blocked by the limit", |s| {
        s["blocked"].as_array().is_some_and(|b| {
            b.iter()
                .any(|e| e["reason"] == "agent_rate_limited" && e["workflow"] == "beta")
        })
    });
    assert!(
        !prompts(&dir, "agent_a")
            .iter()
            .skip(before)
            .any(|(_, text)| text.contains("BOARD-7")),
        "{s:#}"
    );
    lift(&dir, "agent_a");
    wait_until(60, "both issues done", || {
        fs::read_to_string(dir.join("boards/alpha/BOARD-1.md"))
            .unwrap()
            .contains("state: Done")
            && fs::read_to_string(dir.join("boards/beta/BOARD-7.md"))
                .unwrap()
                .contains("state: Done")
    });
}

/// Claude Code's words for a limit that resets three hours from now (UTC).
fn resets_in_three_hours() -> String {
    limit_hours_off().0
}

/// A daemon of a fleet sharing the SQLite claim store `claims.db`: a home of its own and the
/// host name `host`.
fn member(dir: &TestDir, wf: &Path, host: &str) -> Daemon {
    let home = dir.join(&format!("home-{host}"));
    fs::create_dir_all(&home).unwrap();
    let mut cmd = svc(dir);
    cmd.arg("--no-tui")
        .arg(wf)
        .env("HOME", &home)
        .env("SVC_CLAIM_STORE", dir.join("claims.db"))
        .env("SVC_HOSTNAME", host);
    Daemon::start(cmd)
}

fn blocked_by_limit(s: &Value, identifier: &str) -> bool {
    s["blocked"].as_array().is_some_and(|b| {
        b.iter()
            .any(|e| e["reason"] == "agent_rate_limited" && e["issue_identifier"] == identifier)
    })
}

fn add_issue(dir: &TestDir, file: &str) {
    fs::write(
        dir.join(&format!("board/{file}")),
        "---\ntitle: later\nstate: Todo\n---\nMore.\n",
    )
    .unwrap();
}

#[test]
fn a_restart_keeps_the_cooldown() {
    let dir = TestDir::new("limit-restart");
    let a = kind(
        &dir,
        "agent_a",
        Some(("message", &resets_in_three_hours())),
        "",
    );
    let wf = workflow(&dir, &[("BOARD-1.md", "Fix it.")], "agent_a", "", &[a]);
    let mut d = member(&dir, &wf, "host-1");
    d.wait_for(60, "the limit", |s| has_event(s, "agent_rate_limited"));
    d.signal(libc::SIGTERM);
    assert_eq!(d.wait_exit(30), Some(0));
    add_issue(&dir, "BOARD-2.md");
    let d = member(&dir, &wf, "host-1");
    // The new daemon knows the limit from the store: BOARD-2 waits, and no agent starts.
    d.wait_for(60, "BOARD-2 blocked by the limit", |s| {
        blocked_by_limit(s, "BOARD-2")
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(
        prompts(&dir, "agent_a").len(),
        1,
        "{:#}",
        d.latest().unwrap()
    );
}

#[test]
fn two_daemons_on_one_store_share_a_cooldown_unless_its_scope_is_the_host() {
    for scope in ["fleet", "host"] {
        let dir = TestDir::new(&format!("limit-fleet-{scope}"));
        let more = format!("    cooldown_scope: {scope}\n");
        let a = kind(
            &dir,
            "agent_a",
            Some(("message", &resets_in_three_hours())),
            &more,
        );
        let wf = workflow(&dir, &[("BOARD-1.md", "Fix it.")], "agent_a", "", &[a]);
        let first = member(&dir, &wf, "host-1");
        first.wait_for(60, "the limit", |s| has_event(s, "agent_rate_limited"));
        add_issue(&dir, "BOARD-2.md");
        first.wait_for(60, "BOARD-2 blocked on the first", |s| {
            blocked_by_limit(s, "BOARD-2")
        });
        let second = member(&dir, &wf, "host-2");
        if scope == "fleet" {
            // The other host's daemon shares the account: it waits too, starting nothing.
            second.wait_for(60, "BOARD-2 blocked on the second", |s| {
                blocked_by_limit(s, "BOARD-2")
            });
            std::thread::sleep(std::time::Duration::from_secs(1));
            let sent = prompts(&dir, "agent_a");
            assert_eq!(sent.len(), 1, "{sent:?}");
        } else {
            // Each host has its own account: the second daemon runs BOARD-2.
            wait_until(60, "BOARD-2's prompt from the second daemon", || {
                prompts(&dir, "agent_a")
                    .iter()
                    .any(|(_, text)| text.contains("BOARD-2"))
            });
        }
    }
}
