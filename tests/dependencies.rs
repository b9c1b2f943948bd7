//! Dependencies end to end with the real binary, the board and memory trackers and the demo
//! agent: an issue waits for the issues that block it (`blocked_by` of a board file, `blockedBy`
//! of a memory record) until they are done, then runs; a started issue is not stopped by a new
//! blocker; a cycle of blockers holds its members and is reported once; the dry run says what
//! an issue waits for. (tracker-a relations and tracker-b links: tests/tracker_a.rs and
//! tests/tracker_b.rs.)

mod common;

use common::*;
use serde_json::{Value, json};
use std::fs;

/// A board workflow whose `before_run` hook appends `<identifier> <state lines of the board>`
/// to `order.log`: what every file said when each run started.
fn board_workflow(dir: &TestDir) -> std::path::PathBuf {
    fs::create_dir_all(dir.join("board")).unwrap();
    workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: demo\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\nhooks:\n  before_run: echo $SVC_ISSUE_IDENTIFIER $(cd {} && grep '^state:' BOARD-*.md) >> {}\n",
            dir.join("board").display(),
            dir.join("order.log").display()
        ),
    )
}

fn board_file(dir: &TestDir, id: &str, front: &str, body: &str) {
    fs::write(
        dir.join("board").join(format!("{id}.md")),
        format!("---\ntitle: Issue {id}\n{front}---\n{body}\n"),
    )
    .unwrap();
}

fn daemon(dir: &TestDir, wf: &std::path::Path) -> Daemon {
    let mut cmd = svc(dir);
    cmd.arg("--no-tui").arg(wf);
    Daemon::start(cmd)
}

fn order(dir: &TestDir) -> Vec<String> {
    fs::read_to_string(dir.join("order.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The waiting issues of a snapshot: identifier -> (its open blockers as `ID (State)`, cycle).
fn waiting(s: &Value) -> Vec<(String, Vec<String>, bool)> {
    waiting_on_blockers(s)
}

#[test]
fn a_board_blocked_by_holds_the_dependent_issue_until_its_blocker_is_done() {
    let dir = TestDir::new("deps-board");
    let wf = board_workflow(&dir);
    board_file(&dir, "BOARD-1", "state: Todo\n", "demo: slow 1500");
    board_file(&dir, "BOARD-2", "state: Todo\nblocked_by: [BOARD-1]\n", "");
    // A blocker that is not on the board does not hold anything; doctor reports it.
    board_file(&dir, "BOARD-3", "state: Todo\nblocked_by: [BOARD-9]\n", "");
    let r = run(svc(&dir).arg("doctor").arg(&wf));
    assert!(
        r.stdout
            .contains("BOARD-3 is blocked by BOARD-9, which is not on the board"),
        "{}",
        r.stdout
    );
    let d = daemon(&dir, &wf);
    let s = d.wait_for(20, "BOARD-2 waiting while BOARD-1 runs", |s| {
        running_ids(s).contains(&"BOARD-1".to_string()) && !waiting(s).is_empty()
    });
    assert_eq!(
        waiting(&s),
        [("BOARD-2".into(), vec!["BOARD-1 (Todo)".into()], false)]
    );
    wait_until(60, "every issue done", || {
        (1..=3).all(|n| board_state(&dir, &format!("BOARD-{n}.md")) == "Done")
    });
    // BOARD-2 started only once BOARD-1's file said Done; the others at once.
    let order = order(&dir);
    let line = |id: &str| {
        order
            .iter()
            .find(|l| l.starts_with(&format!("{id} ")))
            .cloned()
            .unwrap_or_else(|| panic!("no run of {id}: {order:?}"))
    };
    assert!(
        line("BOARD-2").contains("BOARD-1.md:state: Done"),
        "{order:?}"
    );
    assert!(
        line("BOARD-3").contains("BOARD-1.md:state: Todo"),
        "BOARD-3 did not wait: {order:?}"
    );
    d.wait_latest(10, "nothing waiting", |s| waiting(s).is_empty());
}

#[test]
fn a_started_issue_is_not_stopped_by_a_new_blocker() {
    let dir = TestDir::new("deps-started");
    let wf = board_workflow(&dir);
    let open = "demo: keep-open\ndemo: slow 60000";
    board_file(&dir, "BOARD-1", "state: Todo\n", open);
    let d = daemon(&dir, &wf);
    let s = d.wait_for(20, "BOARD-1 running", |s| running_ids(s) == ["BOARD-1"]);
    let run_id = s["running"][0]["run_id"].as_str().unwrap().to_string();
    // BOARD-1 gains a blocker that is not done; BOARD-3, written after it, waits for the same
    // one: once BOARD-3 waits, a poll has seen BOARD-1's new blocker too.
    board_file(&dir, "BOARD-2", "state: Backlog\n", "");
    board_file(
        &dir,
        "BOARD-1",
        "state: Todo\nblocked_by: [BOARD-2]\n",
        open,
    );
    board_file(&dir, "BOARD-3", "state: Todo\nblocked_by: [BOARD-2]\n", "");
    let s = d.wait_for(20, "BOARD-3 waiting", |s| !waiting(s).is_empty());
    assert_eq!(
        waiting(&s),
        [("BOARD-3".into(), vec!["BOARD-2 (Backlog)".into()], false)],
        "a running issue never waits"
    );
    // BOARD-2 is done: BOARD-3 runs to its end, over more polls than a stop would take.
    board_file(&dir, "BOARD-2", "state: Done\n", "");
    wait_until(30, "BOARD-3 done", || {
        board_state(&dir, "BOARD-3.md") == "Done"
    });
    let s = d.wait_latest(10, "BOARD-1 still running", |s| {
        running_ids(s).contains(&"BOARD-1".to_string())
    });
    let still = s["running"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["issue_identifier"] == "BOARD-1")
        .unwrap();
    assert_eq!(
        still["run_id"],
        run_id.as_str(),
        "the same run, never stopped"
    );
    let runs = http(
        "GET",
        &format!("{}/api/v1/runs?issue=BOARD-1", base_url(&d)),
        &[],
        None,
    )
    .2;
    let runs: Value = serde_json::from_str(&runs).unwrap();
    assert_eq!(runs["summary"]["total"], 1, "{runs}");
    assert_eq!(runs["runs"][0]["outcome"], "running", "{runs}");
}

/// The `svc_polls_total` figure of `/metrics`.
fn polls(base: &str) -> u64 {
    let text = http("GET", &format!("{base}/metrics"), &[], None).2;
    text.lines()
        .find(|l| l.starts_with("svc_polls_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no svc_polls_total in {text}")) as u64
}

#[test]
fn a_cycle_of_blockers_holds_its_members_and_is_reported_once() {
    let dir = TestDir::new("deps-cycle");
    let wf = board_workflow(&dir);
    board_file(&dir, "BOARD-1", "state: Todo\nblocked_by: [BOARD-2]\n", "");
    board_file(&dir, "BOARD-2", "state: Todo\nblocked_by: [BOARD-1]\n", "");
    let d = daemon(&dir, &wf);
    let base = base_url(&d);
    let s = d.wait_for(20, "the cycle waiting", |s| waiting(s).len() == 2);
    assert_eq!(
        waiting(&s),
        [
            ("BOARD-1".into(), vec!["BOARD-2 (Todo)".into()], true),
            ("BOARD-2".into(), vec!["BOARD-1 (Todo)".into()], true)
        ]
    );
    let cycle_events = |s: &Value| -> Vec<String> {
        s["recent_events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["event"] == "blocker_cycle")
            .map(|e| e["message"].as_str().unwrap().to_string())
            .collect()
    };
    let s = d.wait_for(10, "the cycle reported", |s| !cycle_events(s).is_empty());
    let reported = cycle_events(&s);
    assert!(reported[0].contains("BOARD-1, BOARD-2"), "{reported:?}");
    // Three more polls: still held, still reported once.
    let seen = polls(&base);
    wait_until(30, "three more polls", || polls(&base) >= seen + 3);
    let s = d.latest().unwrap();
    assert_eq!(cycle_events(&s).len(), 1, "{}", s["recent_events"]);
    assert_eq!(waiting(&s).len(), 2);
    assert!(order(&dir).is_empty(), "nothing ran: {:?}", order(&dir));
    // Someone breaks the cycle: BOARD-2 runs and is done, then BOARD-1.
    board_file(&dir, "BOARD-2", "state: Todo\n", "");
    wait_until(60, "both done", || {
        board_state(&dir, "BOARD-1.md") == "Done" && board_state(&dir, "BOARD-2.md") == "Done"
    });
    let order = order(&dir);
    assert_eq!(order.len(), 2, "{order:?}");
    assert!(
        order[0].starts_with("BOARD-2 ") && order[1].starts_with("BOARD-1 "),
        "{order:?}"
    );
    assert!(
        order[1].contains("BOARD-2.md:state: Done"),
        "BOARD-1 ran once BOARD-2 was done: {order:?}"
    );
    d.wait_latest(20, "nothing waiting, running or retrying", |s| {
        waiting(s).is_empty() && s["counts"]["running"] == 0 && s["counts"]["retrying"] == 0
    });
    let detail = http("GET", &format!("{base}/api/v1/BOARD-1"), &[], None);
    assert_eq!(detail.0, 404, "nothing waits any more: {}", detail.2);
}

/// Memory records: MEM-1 free, MEM-2 blocked by ENG-2 (not a record; its state given) and
/// MEM-3 by the record MEM-1.
fn memory_issues(eng2: &str) -> String {
    json!([
        {"id": "id-MEM-1", "identifier": "MEM-1", "title": "free", "state": "In Progress", "description": "demo: keep-open\ndemo: slow 60000"},
        {"id": "id-MEM-2", "identifier": "MEM-2", "title": "blocked", "state": "Todo", "description": "demo: keep-open\ndemo: slow 60000",
         "blockedBy": [{"id": "id-ENG-2", "identifier": "ENG-2", "state": eng2}]},
        {"id": "id-MEM-3", "identifier": "MEM-3", "title": "behind MEM-1", "state": "Todo", "blockedBy": ["MEM-1"]}
    ])
    .to_string()
}

#[test]
fn memory_records_wait_for_their_blockers_and_the_dry_run_says_so() {
    let dir = TestDir::new("deps-memory");
    let wf = workflow_with_description(&dir, &demo_memory(""));
    let r = run(svc(&dir).args(["--once", "--dry-run"]).arg(&wf).env(
        "SVC_MEMORY_TRACKER_ISSUES_JSON",
        memory_issues("In Progress"),
    ));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let line = |id: &str| {
        r.stdout
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("no line for {id}: {}", r.stdout))
            .to_string()
    };
    assert!(line("MEM-1").contains("dispatch -> demo"), "{}", r.stdout);
    assert!(
        line("MEM-2").ends_with("skip: blocked by ENG-2 (In Progress)"),
        "{}",
        r.stdout
    );
    assert!(
        line("MEM-3").ends_with("skip: blocked by MEM-1 (In Progress)"),
        "{}",
        r.stdout
    );

    // The daemon holds them back alike.
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf).env(
        "SVC_MEMORY_TRACKER_ISSUES_JSON",
        memory_issues("In Progress"),
    );
    let d = Daemon::start(cmd);
    let s = d.wait_for(20, "MEM-2 and MEM-3 waiting", |s| {
        running_ids(s) == ["MEM-1"] && waiting(s).len() == 2
    });
    assert_eq!(
        waiting(&s),
        [
            ("MEM-2".into(), vec!["ENG-2 (In Progress)".into()], false),
            ("MEM-3".into(), vec!["MEM-1 (In Progress)".into()], false)
        ]
    );
    drop(d);

    // Its records say ENG-2 is done now: MEM-2 runs.
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_MEMORY_TRACKER_ISSUES_JSON", memory_issues("Done"));
    let d = Daemon::start(cmd);
    let s = d.wait_for(20, "MEM-2 running", |s| {
        running_ids(s) == ["MEM-1", "MEM-2"]
    });
    assert_eq!(waiting(&s).len(), 1, "MEM-3 still waits for MEM-1");
}
