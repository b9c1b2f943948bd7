//! The worker pool end to end: the real binary with the `fake` driver (and its injected
//! faults) and with the example out-of-tree driver of driver SDK v1
//! (`scripts/example-worker-driver`): worker hosts in every view, capacity and spend caps,
//! acquire timeouts, driver loading, pinning, crashes, reloads, and the ledger's adoption of
//! machines a SIGKILLed daemon left behind.

mod common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

const TOKEN: &str = "pool-control-token";

/// A local board with `issues` (file name, body) and a workflow whose extra front matter is
/// `extra`; the demo agent completes each issue through the board's tools.
fn board_workflow(dir: &TestDir, extra: &str, issues: &[(&str, &str)]) -> PathBuf {
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    for (file, text) in issues {
        fs::write(board.join(file), text).unwrap();
    }
    workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 2\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n{extra}"
        ),
    )
}

fn issue(title: &str, body: &str) -> String {
    format!("---\ntitle: {title}\nstate: Todo\n---\n{body}\n")
}

fn start(dir: &TestDir, wf: &Path) -> Daemon {
    let mut cmd = svc(dir);
    cmd.arg("--no-tui").arg(wf).env("SVC_CONTROL_TOKEN", TOKEN);
    Daemon::start(cmd)
}

fn get(d: &Daemon, path: &str) -> Value {
    let (status, _, body) = http("GET", &format!("{}{path}", base_url(d)), &[], None);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn events_of(s: &Value) -> Vec<(String, String)> {
    s["recent_events"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["event"].as_str().unwrap_or("").to_string(),
                        e["message"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every event the daemon's stderr log names (recent events hold only the last 20).
fn logged(d: &Daemon, event: &str) -> bool {
    d.stderr().contains(&format!("worker pool: {event}:"))
}

#[test]
fn the_fake_pool_runs_the_demo_with_the_worker_host_everywhere() {
    let dir = TestDir::new("pool-fake");
    let wf = board_workflow(
        &dir,
        "worker:\n  worker_pool:\n    driver: fake\n    max: 1\n    warm: 1\n",
        &[
            ("BOARD-1.md", &issue("First", "demo: slow 1500")),
            ("BOARD-2.md", &issue("Second", "demo: slow 1500")),
        ],
    );
    let d = start(&dir, &wf);
    // One machine, two issues: one runs on it, the other waits for capacity.
    let s = d.wait_for(30, "a run on a fake worker and one blocked", |s| {
        s["counts"]["running"] == 1
            && s["running"][0]["worker_host"] == "fake://worker-w-1"
            && s["blocked"][0]["reason"] == "worker_host_capacity"
    });
    assert_eq!(s["blocked"][0]["label"], "worker host capacity");
    assert_eq!(s["worker_pool"]["driver"], "fake");
    assert_eq!(s["worker_pool"]["live"], 1);
    assert_eq!(s["worker_pool"]["leased"], 1);
    let running = s["running"][0]["issue_identifier"]
        .as_str()
        .unwrap()
        .to_string();
    let detail = get(&d, &format!("/api/v1/{running}"));
    assert_eq!(detail["workspace"]["host"], "fake://worker-w-1");
    wait_until(60, "both issues done", || {
        board_state(&dir, "BOARD-1.md") == "Done" && board_state(&dir, "BOARD-2.md") == "Done"
    });
    let runs = get(&d, "/api/v1/runs");
    let hosts: Vec<&str> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["worker_host"].as_str().unwrap_or("none"))
        .collect();
    assert!(
        !hosts.is_empty() && hosts.iter().all(|h| *h == "fake://worker-w-1"),
        "{hosts:?}"
    );
    // `svc runs` reads the same.
    let r = run(svc(&dir)
        .args(["runs", "--json", "--url", &base_url(&d)])
        .arg("--limit")
        .arg("5"));
    assert!(r.stdout.contains("fake://worker-w-1"), "{}", r.all());
}

#[test]
fn injected_driver_faults_are_reported_and_the_pool_recovers() {
    let dir = TestDir::new("pool-faults");
    let wf = board_workflow(
        &dir,
        "worker:\n  kind: flaky\n  worker_pool:\n    reap_interval_ms: 300\n    warm: 0\nworkers:\n  flaky:\n    driver: fake\n    fail_provision: 1\n    fail_probe: 1\n    fail_destroy: 1\n",
        &[("BOARD-1.md", &issue("Flaky", ""))],
    );
    let d = start(&dir, &wf);
    wait_until(60, "the issue done despite the faults", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
    // A provision failed (then backed off), a probe failed (that machine was retired and its
    // destroy failed once, then succeeded at a later reap).
    wait_until(20, "every fault reported", || {
        logged(&d, "worker_pool_provision_failed")
            && logged(&d, "worker_pool_probe_failed")
            && logged(&d, "worker_pool_destroy_failed")
            && d.stderr().matches("worker_pool_worker_destroyed").count() >= 1
    });
    let s = d.latest().unwrap();
    assert_eq!(s["worker_pool"]["driver"], "fake");
}

#[test]
fn an_acquire_that_waits_too_long_fails_the_run_and_it_is_retried() {
    let dir = TestDir::new("pool-timeout");
    let wf = board_workflow(
        &dir,
        "worker:\n  kind: slow\n  worker_pool:\n    acquire_timeout_ms: 300\n    warm: 0\nworkers:\n  slow:\n    driver: fake\n    provision_delay_ms: 3000\n",
        &[("BOARD-1.md", &issue("Slow machines", "demo: keep-open"))],
    );
    let d = start(&dir, &wf);
    // Reserving while the machine is provisioned...
    let s = d.wait_for(20, "a run reserving a slot", |s| s["reserving"] == 1);
    assert_eq!(s["running"][0]["reserving"], true);
    // ... then failed by the timeout and retried with backoff.
    let s = d.wait_for(20, "a retry after the acquire timeout", |s| {
        s["counts"]["retrying"] == 1
    });
    let error = s["retrying"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("no worker became available within acquire_timeout_ms (300 ms)"),
        "{error}"
    );
}

#[test]
fn a_spend_cap_blocks_new_work_and_survives_a_restart() {
    let dir = TestDir::new("pool-spend");
    let wf = board_workflow(
        &dir,
        "worker:\n  worker_pool:\n    driver: fake\n    warm: 1\n    reap_interval_ms: 200\n    spend:\n      max_worker_seconds: 1\n",
        &[],
    );
    let mut d = start(&dir, &wf);
    // The warm machine alone spends the one worker-second.
    let s = d.wait_for(20, "the pool capped", |s| {
        s["worker_pool"]["capped"].is_string()
    });
    assert!(
        s["worker_pool"]["capped"]
            .as_str()
            .unwrap()
            .contains("spend.max_worker_seconds reached"),
        "{s}"
    );
    assert!(
        events_of(&s)
            .iter()
            .any(|(e, _)| e == "worker_pool_spend_capped")
    );
    // New work is blocked with a clear reason, never started.
    fs::write(dir.join("board/BOARD-1.md"), issue("Capped", "")).unwrap();
    let s = d.wait_for(20, "the issue blocked", |s| {
        s["blocked"][0]["reason"] == "worker_host_capacity"
    });
    assert_eq!(s["counts"]["running"], 0);
    // The claim store holds the figure (no spend file beside it); a restarted daemon is still
    // capped.
    d.signal(libc::SIGTERM);
    assert_eq!(d.wait_exit(20), Some(0));
    let files: Vec<PathBuf> = fs::read_dir(dir.join("home/.svc/daemon"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        !files
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".spend.json")),
        "{files:?}"
    );
    let store = files
        .iter()
        .find(|p| p.to_string_lossy().ends_with(".claims.db"))
        .expect("the claim store");
    let db = rusqlite::Connection::open(store).unwrap();
    let lifetime_ms: f64 = db
        .query_row(
            "SELECT value FROM tallies WHERE name = 'workers/lifetime_ms'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(lifetime_ms >= 1000.0, "{lifetime_ms}");
    drop(db);
    let d = start(&dir, &wf);
    let s = d.wait_for(20, "still capped after the restart", |s| {
        s["worker_pool"]["capped"].is_string()
            && s["blocked"][0]["reason"] == "worker_host_capacity"
    });
    assert_eq!(s["counts"]["running"], 0);
    assert_eq!(board_state(&dir, "BOARD-1.md"), "Todo");
}

/// The example driver copied into the test's directory (so tests may edit or move it).
fn example_driver(dir: &TestDir, name: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/example-worker-driver");
    let target = dir.join(name);
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    fs::copy(&source, &target).unwrap();
    target
}

fn sdk_extra(driver: &str, state: &Path, options: &str) -> String {
    format!(
        "worker:\n  kind: ext\n  worker_pool:\n    max: 2\n    warm: 1\n    reap_interval_ms: 300\nworkers:\n  ext:\n    driver: {driver}\n    state_dir: {}\n{options}",
        state.display()
    )
}

fn machines(state: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(state.join("machines"))
        .map(|d| {
            d.flatten()
                .map(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .trim_end_matches(".json")
                        .to_string()
                })
                .filter(|n| !n.starts_with('.') && !n.contains(".tmp"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn driver_pids(state: &Path) -> Vec<i64> {
    let mut pids: Vec<i64> = fs::read_to_string(state.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    pids.sort();
    pids.dedup();
    pids
}

#[test]
fn an_out_of_tree_driver_loads_pins_runs_the_demo_and_leaves_nothing_behind() {
    let dir = TestDir::new("pool-sdk");
    let driver = example_driver(&dir, "drivers/example");
    let state = dir.join("driver-state");
    let wf = board_workflow(
        &dir,
        &sdk_extra("./drivers/example#demo", &state, ""),
        &[("BOARD-1.md", &issue("Remote", "demo: slow 1500"))],
    );
    let mut d = start(&dir, &wf);
    let s = d.wait_for(30, "a run on the example driver", |s| {
        s["running"][0]["worker_host"]
            .as_str()
            .is_some_and(|h| h.starts_with("example://w-"))
    });
    assert_eq!(s["worker_pool"]["driver"], "./drivers/example#demo");
    let events = events_of(&s);
    let loaded = events
        .iter()
        .find(|(e, _)| e == "worker_pool_driver_loaded")
        .expect("loaded event");
    assert!(loaded.1.contains("kind example:demo"), "{loaded:?}");
    assert!(loaded.1.contains("usesLedger true"), "{loaded:?}");
    let pinned = events
        .iter()
        .find(|(e, _)| e == "worker_pool_driver_module_pinned")
        .expect("pinned event");
    assert!(pinned.1.contains("sha256"), "{pinned:?}");
    wait_until(60, "the issue done", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
    // Editing the original changes nothing: the pinned copy runs.
    fs::write(&driver, "#!/bin/sh\nexit 9\n").unwrap();
    fs::write(dir.join("board/BOARD-2.md"), issue("Second", "")).unwrap();
    wait_until(60, "the second issue done by the pinned driver", || {
        board_state(&dir, "BOARD-2.md") == "Done"
    });
    assert!(!machines(&state).is_empty());
    let pids = driver_pids(&state);
    d.signal(libc::SIGTERM);
    assert_eq!(d.wait_exit(30), Some(0));
    // Drained: every machine destroyed, the driver process gone.
    assert_eq!(machines(&state), Vec::<String>::new());
    for pid in pids {
        assert!(dead_soon(pid), "driver process {pid} outlived the daemon");
    }
}

#[test]
fn bad_specifiers_and_sdk_mismatches_are_refused_with_their_events() {
    let dir = TestDir::new("pool-sdk-bad");
    example_driver(&dir, "drivers/example");
    let state = dir.join("driver-state");
    // A cache-busting query string: refused at start.
    let wf = board_workflow(&dir, &sdk_extra("./drivers/example?v=2", &state, ""), &[]);
    let r = run(svc(&dir).arg("--no-tui").arg(&wf));
    assert_eq!(r.code, Some(1), "{}", r.all());
    assert!(
        r.stderr.contains("worker_pool_driver_invalid_specifier"),
        "{}",
        r.all()
    );
    // An SDK major other than 1: refused at start.
    let wf = board_workflow(
        &dir,
        &sdk_extra("./drivers/example", &state, "    sdk: 2\n"),
        &[],
    );
    let r = run(svc(&dir).arg("--no-tui").arg(&wf));
    assert_eq!(r.code, Some(1), "{}", r.all());
    assert!(
        r.stderr.contains("worker_pool_driver_sdk_mismatch"),
        "{}",
        r.all()
    );
    assert!(r.stderr.contains("speaks SDK 2"), "{}", r.all());
    // An exact built-in kind wins over a same-named executable on PATH.
    example_driver(&dir, "bin/fake");
    let wf = board_workflow(
        &dir,
        "worker:\n  worker_pool:\n    driver: fake\n",
        &[("BOARD-1.md", &issue("Built-in", "demo: slow 1500"))],
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf).env(
        "PATH",
        format!("{}:/usr/bin:/bin", dir.join("bin").display()),
    );
    let d = Daemon::start(cmd);
    d.wait_for(30, "a run on the built-in fake driver", |s| {
        s["running"][0]["worker_host"] == "fake://worker-w-1"
    });
}

#[test]
fn a_crashing_driver_is_restarted_and_a_reload_swaps_the_specifier() {
    let dir = TestDir::new("pool-sdk-crash");
    example_driver(&dir, "drivers/example");
    example_driver(&dir, "drivers/other");
    let state = dir.join("driver-state");
    let wf = board_workflow(
        &dir,
        &sdk_extra("./drivers/example", &state, "    crash_on: provision\n"),
        &[("BOARD-1.md", &issue("Crash", ""))],
    );
    let d = start(&dir, &wf);
    // The first provision crashes the driver; it is restarted and the issue still gets done.
    wait_until(60, "the issue done after the crash", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
    assert!(d.stderr().contains("exited"), "{}", d.stderr());
    assert!(driver_pids(&state).len() >= 2, "a second driver process");
    // A reload to a `?` specifier is refused and the driver kept.
    let text = fs::read_to_string(&wf).unwrap();
    fs::write(
        &wf,
        text.replace("./drivers/example", "./drivers/example?x=1"),
    )
    .unwrap();
    let s = d.wait_for(20, "the invalid specifier refused", |s| {
        events_of(s)
            .iter()
            .any(|(e, _)| e == "worker_pool_driver_invalid_specifier")
    });
    assert_eq!(s["worker_pool"]["driver"], "./drivers/example");
    // A reload to another specifier loads it and retires the old machines.
    fs::write(&wf, text.replace("./drivers/example", "./drivers/other")).unwrap();
    let s = d.wait_for(20, "the driver replaced", |s| {
        s["worker_pool"]["driver"] == "./drivers/other"
    });
    let events = events_of(&s);
    assert!(
        events
            .iter()
            .any(|(e, _)| e == "worker_pool_driver_replaced"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(e, m)| e == "worker_pool_driver_loaded" && m.contains("./drivers/other"))
    );
    fs::write(dir.join("board/BOARD-2.md"), issue("After the swap", "")).unwrap();
    wait_until(60, "an issue done on the new driver", || {
        board_state(&dir, "BOARD-2.md") == "Done"
    });
}

#[test]
fn machines_left_by_a_killed_daemon_are_adopted_or_destroyed() {
    let dir = TestDir::new("pool-ledger");
    example_driver(&dir, "drivers/example");
    let state = dir.join("driver-state");
    let extra = sdk_extra("./drivers/example", &state, "").replace("max: 2", "max: 1");
    let wf = board_workflow(&dir, &extra, &[]);
    let mut d = start(&dir, &wf);
    wait_until(30, "a warm machine", || machines(&state) == ["w-1"]);
    let ledger = fs::read_dir(dir.join("home/.svc/daemon"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".ledger.json"))
        .expect("a ledger beside the lock");
    assert!(fs::read_to_string(&ledger).unwrap().contains("w-1"));
    // SIGKILL: the machine survives (the driver process does not: it dies with the daemon);
    // so does a stray one of this pool never in the ledger.
    let pids = driver_pids(&state);
    d.signal(libc::SIGKILL);
    d.wait_exit(10);
    wait_until(10, "the driver process gone with the daemon", || {
        pids.iter().all(|p| !alive(*p))
    });
    let record: Value =
        serde_json::from_str(&fs::read_to_string(state.join("machines/w-1.json")).unwrap())
            .unwrap();
    let mut stray = record.clone();
    stray["workerId"] = "w-9".into();
    stray["workerHost"] = "example://w-9".into();
    fs::write(state.join("machines/w-9.json"), stray.to_string()).unwrap();
    // Another pool's machine is none of ours: left alone.
    let mut foreign = record.clone();
    foreign["workerId"] = "other-1".into();
    foreign["labels"]["svc-pool"] = "someone-else".into();
    fs::write(state.join("machines/other-1.json"), foreign.to_string()).unwrap();
    let d = start(&dir, &wf);
    // max 1: one survivor adopted (and probed), the other destroyed; the foreign one kept.
    wait_until(30, "adoption settled", || machines(&state).len() == 2);
    let left = machines(&state);
    assert!(left.contains(&"other-1".to_string()), "{left:?}");
    let s = d.wait_for(20, "the adopted machine counted", |s| {
        s["worker_pool"]["live"] == 1
    });
    assert!(
        events_of(&s)
            .iter()
            .any(|(e, _)| e == "worker_pool_worker_adopted"),
        "{:?}",
        events_of(&s)
    );
    // It serves runs.
    fs::write(dir.join("board/BOARD-1.md"), issue("On a survivor", "")).unwrap();
    wait_until(60, "the issue done on the adopted machine", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
}

#[test]
fn a_reload_changes_the_pool_settings_without_dropping_running_leases() {
    let dir = TestDir::new("pool-reload");
    let wf = board_workflow(
        &dir,
        "worker:\n  worker_pool:\n    driver: fake\n    max: 1\n",
        &[
            ("BOARD-1.md", &issue("Long", "demo: slow 4000")),
            ("BOARD-2.md", &issue("Waiting", "demo: slow 1000")),
        ],
    );
    let d = start(&dir, &wf);
    // The run holds its machine (its lease granted) before the pool grows.
    let s = d.wait_for(30, "one run on its machine and one blocked", |s| {
        s["counts"]["running"] == 1
            && s["counts"]["blocked"] == 1
            && s["running"][0]["worker_host"].is_string()
    });
    let first = s["running"][0]["issue_identifier"].clone();
    let host = s["running"][0]["worker_host"].clone();
    // Room for a second machine: the blocked issue starts; the running one keeps its lease.
    let text = fs::read_to_string(&wf).unwrap();
    fs::write(&wf, text.replace("max: 1", "max: 2")).unwrap();
    let s = d.wait_for(20, "both running", |s| s["counts"]["running"] == 2);
    let kept = s["running"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["issue_identifier"] == first)
        .expect("the first run still runs");
    assert_eq!(kept["worker_host"], host);
    assert_eq!(s["worker_pool"]["live"], 2);
    wait_until(60, "both done", || {
        board_state(&dir, "BOARD-1.md") == "Done" && board_state(&dir, "BOARD-2.md") == "Done"
    });
}

#[test]
fn doctor_explains_the_pool_and_checks_a_driver_online() {
    let dir = TestDir::new("pool-doctor");
    example_driver(&dir, "drivers/example");
    let state = dir.join("driver-state");
    let wf = board_workflow(&dir, &sdk_extra("./drivers/example", &state, ""), &[]);
    let r = run(svc(&dir).args(["doctor", "--online"]).arg(&wf));
    assert!(
        r.stdout
            .contains("driver ./drivers/example: min 0, max 2, warm 1"),
        "{}",
        r.all()
    );
    assert!(r.stdout.contains("loads: kind example"), "{}", r.all());
    assert!(r.stdout.contains("probed and destroyed it"), "{}", r.all());
    assert_eq!(
        machines(&state),
        Vec::<String>::new(),
        "the doctor's machine is gone"
    );
    // A driver that cannot load, and a wrong setting, are explained.
    let wf = board_workflow(&dir, &sdk_extra("./drivers/missing", &state, ""), &[]);
    let r = run(svc(&dir).arg("doctor").arg(&wf));
    assert_ne!(r.code, Some(0));
    assert!(
        r.stdout.contains("worker_pool_driver_load_failed"),
        "{}",
        r.all()
    );
    let wf = board_workflow(
        &dir,
        "worker:\n  worker_pool:\n    min: 3\n    max: 2\n",
        &[],
    );
    let r = run(svc(&dir).arg("doctor").arg(&wf));
    assert!(
        r.stdout
            .contains("worker.worker_pool.max must be >= worker.worker_pool.min"),
        "{}",
        r.all()
    );
}
