//! `svc-bench`: the benchmarks of svc (not tests: it prints figures and asserts nothing).
//! `scripts/bench-orchestrator` builds it in release mode and runs it.
//!
//! * `svc-bench dispatch`: one poll-and-dispatch decision pass over 10,000 memory issues, 1,000
//!   of them active (median and spread of many passes).
//! * `svc-bench pool-acquire`: acquiring and releasing a warm slot of a worker pool with the
//!   `fake` driver, through the pool thread as a run does (median and spread).
//! * `svc-bench claims`: one claim-store transaction (a retry written), and reading back 10,000
//!   stored retries (the recovery at start).
//! * `svc-bench claims-pg <postgres URI>`: the same claim transaction on the `postgres` store
//!   (scripts/bench-fleet starts the server): 2,000 slots claimed one after the other, and the
//!   idle sweep (one statement).
//! * `svc-bench daemon <path to svc>`: the real daemon and demo agent: idle RSS, the time from
//!   the poll that sees an issue to its bridge process running, and 200 concurrent runs (errors,
//!   RSS growth per running run, children excluded).
//! * `svc-bench load <path to svc> <seconds>`: 200 concurrent scripted runs with every hook, for
//!   a long time (scripts/load): RSS, open file descriptors and threads over time, and errors.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use svc::config::{self, SecretResolver};
use svc::env::Env;
use svc::orchestrator::protocol::{Event, PollReport, Slot};
use svc::orchestrator::state::{self, State};
use svc::tracker::memory::MemoryTracker;
use svc::tracker::{StateNames, Tracker};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("dispatch") => dispatch(),
        Some("pool-acquire") => pool_acquire(),
        Some("claims") => claims(),
        Some("claims-pg") => match args.get(1) {
            Some(uri) => claims_pg(uri),
            None => {
                eprintln!("usage: svc-bench claims-pg <postgres://... URI>");
                std::process::exit(2);
            }
        },
        Some("daemon") => daemon(&svc_path(&args)),
        Some("startup") => startup(&svc_path(&args)),
        Some("tui") => tui_frame(),
        Some("trace-ingest") => trace_ingest(),
        Some("ws-delay") => ws_delay(&svc_path(&args)),
        Some("local-query") => local_query(&svc_path(&args)),
        Some("load") => load(
            &svc_path(&args),
            args.get(2).and_then(|n| n.parse().ok()).unwrap_or(600),
        ),
        Some("serve") => serve(
            &svc_path(&args),
            args.get(2).and_then(|n| n.parse().ok()).unwrap_or(0),
        ),
        _ => {
            eprintln!(
                "usage: svc-bench dispatch | pool-acquire | claims | claims-pg <uri> | daemon <svc> | startup <svc> | local-query <svc> | serve <svc> <running entries> | load <svc> <seconds>"
            );
            std::process::exit(2);
        }
    }
}

fn svc_path(args: &[String]) -> PathBuf {
    PathBuf::from(args.get(1).map_or("target/release/svc", String::as_str))
}

fn issues_json(total: usize, active: usize, description: &str) -> String {
    let list: Vec<serde_json::Value> = (0..total)
        .map(|n| {
            serde_json::json!({
                "id": format!("id-{n}"), "identifier": format!("B-{n}"), "title": format!("Issue {n}"),
                "state": if n < active { "Todo" } else { "Done" }, "labels": ["bench"],
                "priority": (n % 4) as i64, "createdAt": format!("2026-01-01T00:{:02}:{:02}Z", (n / 60) % 60, n % 60),
                "description": description,
            })
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn dispatch() {
    let file = config::workflow::parse(
        Path::new("/bench/WORKFLOW.md"),
        "---\ntracker:\n  kind: memory\n---\nx\n",
    )
    .unwrap();
    let env = Env::from_pairs([("HOME", "/tmp")], Path::new("/tmp"));
    let settings = Arc::new(
        config::from_workflow(&file, &env, &mut SecretResolver::default())
            .unwrap()
            .settings,
    );
    let json = issues_json(10_000, 1_000, "");
    let names = StateNames::from_settings(&settings.tracker);
    let tracker = MemoryTracker::from_json("SVC_MEMORY_TRACKER_ISSUES_JSON", &json, names).unwrap();
    let mut fetch = Vec::new();
    let mut decide = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let candidates = tracker.fetch_candidates().unwrap();
        fetch.push(t.elapsed().as_secs_f64() * 1000.0);
        let mut st = State::new(Arc::clone(&settings), 1_000_000);
        state::handle(&mut st, 1_000_000, Event::Tick);
        let report = PollReport {
            candidates: Ok(candidates),
            refreshed: Ok(Vec::new()),
            requested: Vec::new(),
            terminal: None,
            rate_limits: None,
            duration_ms: 0,
            read_at: 0,
        };
        let t = Instant::now();
        let fx = state::handle(&mut st, 1_000_001, Event::PollDone(report));
        decide.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(fx.len(), 10);
    }
    fetch.sort_by(f64::total_cmp);
    decide.sort_by(f64::total_cmp);
    println!(
        "dispatch_decision_pass_ms\tmedian {:.3}\tp10 {:.3}\tp90 {:.3}\t(1,000 active of 10,000; 10 started, 990 blocked; goal < 5)",
        percentile(&decide, 0.5),
        percentile(&decide, 0.1),
        percentile(&decide, 0.9)
    );
    println!(
        "memory_fetch_candidates_ms\tmedian {:.3}\tp10 {:.3}\tp90 {:.3}",
        percentile(&fetch, 0.5),
        percentile(&fetch, 0.1),
        percentile(&fetch, 0.9)
    );
}

fn claims() {
    use svc::orchestrator::protocol::{Key, Retry, RetryKind, RunSpec, Running};
    use svc::orchestrator::store::sqlite::Sqlite;
    use svc::orchestrator::store::{ClaimStore, Op, Owner};
    let dir = std::env::temp_dir().join(format!("svc-bench-claims-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let owner = |id: &str| Owner {
        id: id.into(),
        hostname: "bench".into(),
        pid: std::process::id(),
        ttl_ms: 10_000,
        workflow: "bench.md".into(),
        url: None,
        started_at: 0,
    };
    let issue = |n: usize| svc::tracker::Issue {
        id: format!("id-{n}"),
        identifier: format!("B-{n}"),
        title: format!("Issue {n}"),
        description: None,
        state: "Todo".into(),
        state_type: None,
        labels: vec!["bench".into()],
        url: None,
        created_at: None,
        updated_at: None,
        priority: Some(2),
        blocked_by: Vec::new(),
    };
    let retry = |n: usize| Retry {
        slot: Slot {
            issue: issue(n),
            slot_index: 0,
            ensemble_size: 1,
            workspace_path: PathBuf::from(format!("/w/B-{n}")),
        },
        attempt: 2,
        due_at: 1_000_000 + n as u64,
        error: Some("bench".into()),
        kind: RetryKind::Failure,
        fetching: false,
        worker_id: None,
        worker_host: None,
        ssh: None,
        claim_token: None,
        previous: None,
    };
    let settings = Arc::new(
        config::from_workflow(
            &config::workflow::parse(
                Path::new("/b/WORKFLOW.md"),
                "---\ntracker:\n  kind: memory\n---\nx\n",
            )
            .unwrap(),
            &Env::from_pairs([("HOME", "/tmp")], &dir),
            &mut SecretResolver::default(),
        )
        .unwrap()
        .settings,
    );
    let mut store = Sqlite::open(&dir.join("claims.db"), owner("bench")).unwrap();
    store.sweep(1).unwrap();
    let mut times = Vec::new();
    for n in 0..2000 {
        let spec = RunSpec {
            run_id: format!("run-{n}"),
            slot: Slot {
                issue: issue(n),
                slot_index: 0,
                ensemble_size: 1,
                workspace_path: PathBuf::from(format!("/w/B-{n}")),
            },
            attempt: None,
            agent_kind: "demo".into(),
            settings: Arc::clone(&settings),
            affinity: None,
            steering: Vec::new(),
            seen_at: 0,
            previous_attempt: None,
        };
        let run = Running::new(&spec, 0, 1);
        let t = Instant::now();
        store
            .acquire(&Key::new(format!("id-{n}"), 0), &run, 2, 0)
            .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "claim_transaction_ms\tmedian {:.3}\tp10 {:.3}\tp90 {:.3}\t(one slot claimed in its own exclusive WAL transaction, synchronous=NORMAL; goal < 1)",
        percentile(&times, 0.5),
        percentile(&times, 0.1),
        percentile(&times, 0.9)
    );
    let ops: Vec<Op> = (0..10_000)
        .map(|n| Op::PutRetry(Key::new(format!("id-{n}"), 0), Box::new(retry(n))))
        .collect();
    store.apply(&ops).unwrap();
    store.unregister().unwrap();
    drop(store);
    let mut loads = Vec::new();
    for round in 0..5 {
        let t = Instant::now();
        let mut store = Sqlite::open(&dir.join("claims.db"), owner(&format!("r{round}"))).unwrap();
        let h = store.hydrate(50, 3).unwrap();
        assert_eq!(h.sweep.taken_over.len(), 10_000);
        loads.push(t.elapsed().as_secs_f64() * 1000.0);
        // A clean stop: the next round takes the retries over again.
        store.unregister().unwrap();
    }
    loads.sort_by(f64::total_cmp);
    println!(
        "claims_recovery_10000_retries_ms\tmedian {:.1}\tmin {:.1}\tmax {:.1}\t(open, read back and take over 10,000 stored retries)",
        percentile(&loads, 0.5),
        loads[0],
        loads[loads.len() - 1]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `claims` on PostgreSQL: one slot claimed per transaction ([`ClaimStore::acquire`]: advisory
/// lock, superseded check, holders read, claim written with a new fencing token), 2,000 slots
/// one after the other, on a database of its own; then the idle sweep, the statement every
/// daemon sends each second.
fn claims_pg(uri: &str) {
    use svc::orchestrator::protocol::{Key, RunSpec, Running};
    use svc::orchestrator::store::postgres::{Postgres, Target};
    use svc::orchestrator::store::{ClaimStore, Owner};
    let dir = std::env::temp_dir().join(format!("svc-bench-claims-pg-{}", std::process::id()));
    let target = Target::parse(uri).unwrap_or_else(|e| panic!("{e}"));
    let owner = Owner {
        id: format!("bench-{}", std::process::id()),
        hostname: "bench".into(),
        pid: std::process::id(),
        ttl_ms: 10_000,
        workflow: "bench.md".into(),
        url: None,
        started_at: 0,
    };
    let issue = |n: usize| svc::tracker::Issue {
        id: format!("id-{n}"),
        identifier: format!("B-{n}"),
        title: format!("Issue {n}"),
        description: None,
        state: "Todo".into(),
        state_type: None,
        labels: vec!["bench".into()],
        url: None,
        created_at: None,
        updated_at: None,
        priority: Some(2),
        blocked_by: Vec::new(),
    };
    let settings = Arc::new(
        config::from_workflow(
            &config::workflow::parse(
                Path::new("/b/WORKFLOW.md"),
                "---\ntracker:\n  kind: memory\n---\nx\n",
            )
            .unwrap(),
            &Env::from_pairs([("HOME", "/tmp")], &dir),
            &mut SecretResolver::default(),
        )
        .unwrap()
        .settings,
    );
    let mut store = Postgres::open(&target, owner).unwrap_or_else(|e| panic!("{e}"));
    store.sweep(svc::time::unix_ms()).unwrap();
    let mut times = Vec::new();
    for n in 0..2000 {
        let spec = RunSpec {
            run_id: format!("run-{n}"),
            slot: Slot {
                issue: issue(n),
                slot_index: 0,
                ensemble_size: 1,
                workspace_path: PathBuf::from(format!("/w/B-{n}")),
            },
            attempt: None,
            agent_kind: "demo".into(),
            settings: Arc::clone(&settings),
            affinity: None,
            steering: Vec::new(),
            seen_at: 0,
            previous_attempt: None,
        };
        let run = Running::new(&spec, 0, 1);
        let now = svc::time::unix_ms();
        let t = Instant::now();
        store
            .acquire(&Key::new(format!("id-{n}"), 0), &run, now, now)
            .unwrap_or_else(|e| panic!("slot {n} not claimed: {e:?}"));
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "claim_transaction_pg_ms\tmedian {:.3}\tp90 {:.3}\tmax {:.3}\t(2,000 slots, one transaction each, over TCP to 127.0.0.1; goal: median <= 2)",
        percentile(&times, 0.5),
        percentile(&times, 0.9),
        times[times.len() - 1]
    );
    let mut sweeps = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        store.sweep(svc::time::unix_ms()).unwrap();
        sweeps.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    sweeps.sort_by(f64::total_cmp);
    println!(
        "sweep_pg_ms\tmedian {:.3}\tp90 {:.3}\tmax {:.3}\t(the one-statement sweep each daemon sends every second, this owner holding the 2,000 claims)",
        percentile(&sweeps, 0.5),
        percentile(&sweeps, 0.9),
        sweeps[sweeps.len() - 1]
    );
    store.unregister().unwrap();
}

fn pool_acquire() {
    use svc::workers::service;
    let file = config::workflow::parse(
        Path::new("/bench/WORKFLOW.md"),
        "---\ntracker:\n  kind: memory\nworker:\n  worker_pool:\n    driver: fake\n    max: 1\n    warm: 1\n---\nx\n",
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("svc-bench-pool-{}", std::process::id()));
    let env = Arc::new(Env::from_pairs([("HOME", "/tmp")], &dir));
    let settings = Arc::new(
        config::from_workflow(&file, &env, &mut SecretResolver::default())
            .unwrap()
            .settings,
    );
    let pool = service::start(
        &settings,
        env,
        service::PoolPaths::beside_lock(&dir.join("bench.lock")),
        None,
        Box::new(|_| {}),
    )
    .expect("the fake driver loads");
    let (_keep, never) = crossbeam_channel::bounded::<()>(1);
    // The warm machine is provisioned and probed once before timing.
    drop(pool.acquire("id-1", None, &never).expect("a warm slot"));
    let mut times = Vec::new();
    for _ in 0..5000 {
        let t = Instant::now();
        let lease = pool.acquire("id-1", None, &never).expect("a warm slot");
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        drop(lease);
    }
    pool.drain(Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&dir);
    times.sort_by(f64::total_cmp);
    println!(
        "pool_acquire_warm_slot_ms\tmedian {:.4}\tp10 {:.4}\tp90 {:.4}\t(fake driver, probe before hand-out, 5,000 acquires; goal < 1)",
        percentile(&times, 0.5),
        percentile(&times, 0.1),
        percentile(&times, 0.9)
    );
}

thread_local! {
    /// A file the demo agent records its `session/new` parameters in (local-query bench).
    static RECORD: std::cell::RefCell<Option<PathBuf>> = const { std::cell::RefCell::new(None) };
}

struct Daemon {
    child: std::process::Child,
    latest: Arc<Mutex<Option<serde_json::Value>>>,
    dir: PathBuf,
}

impl Daemon {
    fn start(svc: &Path, name: &str, front_matter: &str, issues: &str) -> Daemon {
        let dir = std::env::temp_dir().join(format!("svc-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("home")).unwrap();
        std::fs::write(dir.join("WORKFLOW.md"), format!("---\n{front_matter}\n---\nWork on {{{{ issue.identifier }}}}.\n{{{{ issue.description }}}}\n")).unwrap();
        let mut cmd = Command::new(svc);
        if let Some(record) = RECORD.with(|r| r.borrow().clone()) {
            cmd.env("SVC_DEMO_AGENT_RECORD", record);
        }
        let mut child = cmd
            .arg("--no-tui")
            .arg("WORKFLOW.md")
            .current_dir(&dir)
            .env("HOME", dir.join("home"))
            .env("SVC_MEMORY_TRACKER_ISSUES_JSON", issues)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting svc");
        let latest = Arc::new(Mutex::new(None));
        let out = child.stdout.take().unwrap();
        let l = Arc::clone(&latest);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    *l.lock().unwrap() = Some(v);
                }
            }
        });
        Daemon { child, latest, dir }
    }

    fn wait(
        &self,
        secs: u64,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Some(s) = self.latest.lock().unwrap().clone()
                && pred(&s)
            {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map_or(0, |d| d.count())
    }

    fn threads(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill has no memory effects.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn front_matter(max: usize) -> String {
    format!(
        "tracker:\n  kind: memory\npolling:\n  interval_ms: 1000\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 1\n  max_concurrent_agents: {max}\nagents:\n  demo:\n    bridge_command: svc demo-agent\n    stall_timeout_ms: 0\nserver:\n  trace_dir: traces\nlogging:\n  log_file: svc.log\n"
    )
}

fn ms_of(ts: &str) -> f64 {
    humantime::parse_rfc3339_weak(ts)
        .map(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64()
                * 1000.0
        })
        .unwrap_or(f64::NAN)
}

fn daemon(svc: &Path) {
    // Idle: no issues at all.
    let idle = Daemon::start(svc, "idle", &front_matter(10), "[]");
    idle.wait(10, |_| true).expect("a first snapshot");
    std::thread::sleep(Duration::from_secs(2));
    let mut samples: Vec<u64> = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(200));
            idle.rss_kib()
        })
        .collect();
    samples.sort();
    let idle_rss = samples[2];
    println!(
        "daemon_idle_rss_kib\t{idle_rss}\t(min {} max {}; {} threads; goal < 8192)",
        samples[0],
        samples[4],
        idle.threads()
    );
    drop(idle);

    // Dispatch latency: the poll's dispatch time (running entry started_at) to the bridge
    // process existing (trace process_started), one new issue at a time.
    let mut lat = Vec::new();
    for trial in 0..8 {
        let d = Daemon::start(
            svc,
            &format!("latency-{trial}"),
            &front_matter(10),
            &issues_json(1, 1, "demo: slow 60000"),
        );
        let s = d
            .wait(30, |s| {
                s["running"]
                    .as_array()
                    .is_some_and(|r| r.len() == 1 && r[0]["executor_pid"].is_u64())
            })
            .expect("a run");
        std::thread::sleep(Duration::from_millis(200));
        let r = &s["running"][0];
        let started = ms_of(r["started_at"].as_str().unwrap());
        let trace =
            std::fs::read_to_string(d.dir.join("traces/id-0/trace.jsonl")).unwrap_or_default();
        if let Some(at) = trace
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["type"] == "process_started")
            .and_then(|v| v["at"].as_str().map(ms_of))
        {
            lat.push(at - started);
        }
    }
    lat.sort_by(f64::total_cmp);
    println!(
        "dispatch_to_bridge_running_ms\tmedian {:.1}\tmin {:.1}\tmax {:.1}\t({} trials, one new issue each, no hooks; goal < 20)",
        percentile(&lat, 0.5),
        lat[0],
        lat[lat.len() - 1],
        lat.len()
    );

    // 200 concurrent runs.
    let n = 200;
    let d = Daemon::start(
        svc,
        "concurrent",
        &front_matter(n),
        &issues_json(n, n, "demo: slow 120000"),
    );
    let started = Instant::now();
    let s = d.wait(120, |s| {
        s["running"]
            .as_array()
            .is_some_and(|r| r.len() == n && r.iter().all(|e| e["last_event"].is_string()))
    });
    match s {
        Some(s) => {
            std::thread::sleep(Duration::from_secs(2));
            let rss = d.rss_kib();
            let s = d.latest.lock().unwrap().clone().unwrap_or(s);
            let failures = s["recent_events"].as_array().map_or(0, |e| {
                e.iter().filter(|e| e["event"] == "run_failed").count()
            });
            println!(
                "concurrent_runs\t{}\t(all running with a live session after {:.1} s; retrying {}, failed events {failures}; goal 200 with no errors)",
                s["counts"]["running"],
                started.elapsed().as_secs_f64(),
                s["counts"]["retrying"]
            );
            println!(
                "daemon_rss_with_200_runs_kib\t{rss}\t({} threads)",
                d.threads()
            );
            println!(
                "rss_growth_per_run_kib\t{:.1}\t(children excluded; goal < 128)",
                (rss.saturating_sub(idle_rss)) as f64 / n as f64
            );
        }
        None => println!(
            "concurrent_runs\tFAILED\t(not all {n} runs were running within 120 s: {:?})",
            d.latest
                .lock()
                .unwrap()
                .as_ref()
                .map(|s| s["counts"].clone())
        ),
    }
}

fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start-up to the first `/health` 200, several runs.
fn startup(svc: &Path) {
    let mut times = Vec::new();
    for trial in 0..10 {
        let dir =
            std::env::temp_dir().join(format!("svc-bench-startup-{}-{trial}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("home")).unwrap();
        std::fs::write(
            dir.join("WORKFLOW.md"),
            format!("---\n{}---\nx\n", front_matter(10)),
        )
        .unwrap();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let started = Instant::now();
        let mut child = Command::new(svc)
            .args(["--no-tui", "--port", &port.to_string(), "WORKFLOW.md"])
            .current_dir(&dir)
            .env("HOME", dir.join("home"))
            .env("SVC_MEMORY_TRACKER_ISSUES_JSON", "[]")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut elapsed = None;
        while started.elapsed() < Duration::from_secs(10) {
            if let Some((200, _)) = http_get(&addr, "/health") {
                elapsed = Some(started.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        times.extend(elapsed);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "startup_to_first_health_ms\tmedian {:.1}\tmin {:.1}\tmax {:.1}\t({} runs, spawn to first 200; goal < 10)",
        percentile(&times, 0.5),
        times[0],
        times[times.len() - 1],
        times.len()
    );
}

/// A daemon on a free port with `running` stalled runs, for a load generator; prints the base
/// URL and waits for stdin to close.
fn serve(svc: &Path, running: usize) {
    let port = free_port();
    let fm =
        front_matter(running.max(1)).replace("server:\n", &format!("server:\n  port: {port}\n"));
    let d = Daemon::start(
        svc,
        &format!("serve-{running}"),
        &fm,
        &issues_json(running, running, "demo: keep-open\ndemo: slow 600000"),
    );
    d.wait(120, |s| {
        s["counts"]["running"].as_u64() == Some(running as u64)
    })
    .expect("the running entries");
    println!("http://127.0.0.1:{port}");
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

/// `local_query` over a 10,000-issue board through `/mcp`.
fn local_query(svc: &Path) {
    let dir = std::env::temp_dir().join(format!("svc-bench-board-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let board = dir.join("board");
    std::fs::create_dir_all(&board).unwrap();
    for n in 1..=10_000 {
        let state = if n == 1 {
            "Todo"
        } else if n % 3 == 0 {
            "Done"
        } else {
            "Backlog"
        };
        let desc = if n == 1 {
            "demo: keep-open\ndemo: slow 600000"
        } else {
            "Some description of the work."
        };
        std::fs::write(board.join(format!("BOARD-{n}.md")), format!("---\ntitle: Issue number {n}\nstate: {state}\nlabels: [bench, area-{}]\n---\n{desc}\n", n % 7)).unwrap();
    }
    let port = free_port();
    let fm = format!(
        "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: {}\npolling:\n  interval_ms: 600000\nworkspace:\n  root: ws\nagent:\n  kind: demo\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: {port}\n  trace_dir: traces\nlogging:\n  log_file: svc.log\n",
        board.display()
    );
    let record = dir.join("sessions.jsonl");
    RECORD.with(|r| *r.borrow_mut() = Some(record.clone()));
    let d = Daemon::start(svc, "local-query", &fm, "[]");
    d.wait(120, |s| s["counts"]["running"] == 1)
        .expect("the one run");
    let deadline = Instant::now() + Duration::from_secs(20);
    let session = loop {
        if let Some(line) = std::fs::read_to_string(&record)
            .ok()
            .and_then(|t| t.lines().next().map(str::to_string))
        {
            break serde_json::from_str::<serde_json::Value>(&line).unwrap();
        }
        assert!(Instant::now() < deadline, "no session recorded");
        std::thread::sleep(Duration::from_millis(50));
    };
    let server = &session["params"]["mcpServers"][0];
    let url = server["url"].as_str().unwrap().to_string();
    let auth = server["headers"][0]["value"].as_str().unwrap().to_string();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "local_query", "arguments": {
        "where": {"and": [{"field": "state", "op": "eq", "value": "Backlog"}, {"field": "labels", "op": "contains", "value": "area-3"}]},
        "order_by": [{"field": "title", "dir": "desc"}], "limit": 50}}})
    .to_string();
    let mut times = Vec::new();
    let mut total = 0;
    for _ in 0..15 {
        let t = Instant::now();
        let mut resp = agent
            .post(&url)
            .header("Authorization", &auth)
            .header("Content-Type", "application/json")
            .send(body.as_str())
            .unwrap();
        let text = resp.body_mut().read_to_string().unwrap();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let payload: serde_json::Value =
            serde_json::from_str(v["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        total = payload["total"].as_u64().unwrap_or(0);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "local_query_10k_board_ms\tmedian {:.1}\tmin {:.1}\tmax {:.1}\t(15 calls through /mcp, {total} matches; goal < 100)",
        percentile(&times, 0.5),
        times[0],
        times[times.len() - 1]
    );
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// TUI frame render time with 100 running entries.
fn tui_frame() {
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    let file = config::workflow::parse(
        Path::new("/bench/WORKFLOW.md"),
        "---\ntracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 100\n---\nx\n",
    )
    .unwrap();
    let env = Env::from_pairs([("HOME", "/tmp")], Path::new("/tmp"));
    let settings = Arc::new(
        config::from_workflow(&file, &env, &mut SecretResolver::default())
            .unwrap()
            .settings,
    );
    let tracker = MemoryTracker::from_json(
        "X",
        &issues_json(120, 120, ""),
        StateNames::from_settings(&settings.tracker),
    )
    .unwrap();
    let mut st = State::new(Arc::clone(&settings), 1_000_000);
    state::handle(&mut st, 1_000_000, Event::Tick);
    let report = PollReport {
        candidates: Ok(tracker.fetch_candidates().unwrap()),
        refreshed: Ok(Vec::new()),
        requested: Vec::new(),
        terminal: None,
        rate_limits: None,
        duration_ms: 0,
        read_at: 0,
    };
    state::handle(&mut st, 1_000_001, Event::PollDone(report));
    let daemon = svc::orchestrator::snapshot::DaemonInfo {
        owner_id: "bench".into(),
        pid: 1,
        hostname: "bench".into(),
        started_at: 1_000_000,
        workflow_path: "/bench/WORKFLOW.md".into(),
        lock_path: "/bench/lock".into(),
        endpoint: svc::orchestrator::snapshot::Endpoint {
            kind: "none".into(),
            address: None,
        },
        log_file: None,
        claim_store: &svc::orchestrator::store::memory::KIND,
    };
    let snap = svc::orchestrator::snapshot::build(&st, &daemon, 1_002_000, None);
    assert_eq!(snap.state.running.len(), 100);
    let mut terminal = Terminal::new(TestBackend::new(160, 50)).unwrap();
    let view = svc::tui::View::default();
    let mut times = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        terminal
            .draw(|f| svc::tui::render(f.area(), f.buffer_mut(), &snap.state, &view, 12.0))
            .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "tui_frame_render_ms\tmedian {:.3}\tp10 {:.3}\tp90 {:.3}\t(100 running + 20 blocked entries, 160x50, into a test backend; goal < 2)",
        percentile(&times, 0.5),
        percentile(&times, 0.1),
        percentile(&times, 0.9)
    );
}

/// Lines per second the trace watcher parses.
fn trace_ingest() {
    use svc::trace::watcher::{SharedIndex, Watcher};
    let dir = std::env::temp_dir().join(format!("svc-bench-ingest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let n = 200_000;
    let mut text = String::new();
    for i in 0..n {
        let line = match i % 4 {
            0 => format!(r#"{{"type":"agent_message_chunk","at":"2026-11-21T10:00:00.000Z","runId":"r1","issueId":"i","identifier":"B-1","sessionId":"s","turn":1,"update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"chunk {i} of the answer "}}}}}}"#),
            1 => format!(r#"{{"type":"tool_call","at":"2026-11-21T10:00:00.000Z","runId":"r1","issueId":"i","update":{{"sessionUpdate":"tool_call","toolCallId":"c{i}","title":"Read file","kind":"read","status":"pending"}}}}"#),
            2 => format!(r#"{{"type":"tool_call_update","at":"2026-11-21T10:00:00.250Z","runId":"r1","issueId":"i","update":{{"sessionUpdate":"tool_call_update","toolCallId":"c{}","status":"completed"}}}}"#, i - 1),
            _ => r#"{"type":"usage_update","at":"2026-11-21T10:00:00.300Z","runId":"r1","issueId":"i","update":{"sessionUpdate":"usage_update","used":1200,"size":200000}}"#.to_string(),
        };
        text.push_str(&line);
        text.push('\n');
    }
    let mut rates = Vec::new();
    for trial in 0..3 {
        let sub = dir.join(format!("t{trial}")).join("B-1");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("trace.jsonl"), &text).unwrap();
        let index: SharedIndex = Arc::default();
        let mut w = Watcher::new(dir.join(format!("t{trial}")), Arc::clone(&index));
        let t = Instant::now();
        while !w.poll().is_empty() {}
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(index.read().unwrap().tickets["B-1"].facts.lines, n as u64);
        rates.push(n as f64 / secs);
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "trace_ingest_lines_per_s\tmedian {:.0}\tmin {:.0}\tmax {:.0}\t({n} lines, {} MB, 3 runs; goal >= 100,000)",
        rates[1],
        rates[0],
        rates[2],
        text.len() / 1_000_000
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Delay from an append to a trace file to the `events_append` a WebSocket client receives.
fn ws_delay(svc: &Path) {
    let port = free_port();
    let fm = front_matter(1).replace("server:\n", &format!("server:\n  port: {port}\n"));
    let d = Daemon::start(
        svc,
        "ws-delay",
        &fm,
        &issues_json(1, 1, "demo: keep-open\ndemo: slow 600000"),
    );
    d.wait(60, |s| s["counts"]["running"] == 1).expect("a run");
    std::thread::sleep(Duration::from_millis(1500));
    let addr = format!("127.0.0.1:{port}");
    let stream = std::net::TcpStream::connect(&addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let (mut ws, _) = tungstenite::client(format!("ws://{addr}/ws"), stream).unwrap();
    ws.send(tungstenite::Message::text(
        r#"{"type":"subscribe","issueId":"id-0"}"#,
    ))
    .unwrap();
    let trace = d.dir.join("traces/id-0/trace.jsonl");
    let mut delays = Vec::new();
    for n in 0..12 {
        let marker = format!("bench_marker_{n}");
        let t = Instant::now();
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&trace)
                .unwrap();
            writeln!(
                f,
                r#"{{"type":"{marker}","at":"2026-11-21T10:00:00.000Z"}}"#
            )
            .unwrap();
        }
        loop {
            match ws.read() {
                Ok(tungstenite::Message::Text(text))
                    if text.as_str().contains("events_append")
                        && text.as_str().contains(&marker) =>
                {
                    delays.push(t.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
                Ok(_) => {}
                Err(e) => panic!("websocket: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(137));
    }
    delays.sort_by(f64::total_cmp);
    println!(
        "ws_append_delay_ms\tmedian {:.0}\tmin {:.0}\tmax {:.0}\t({} appends; the watcher polls every 500 ms; goal < 600)",
        percentile(&delays, 0.5),
        delays[0],
        delays[delays.len() - 1],
        delays.len()
    );
}

/// 200 concurrent runs for `seconds`: each run has every hook, works for a few seconds, ends
/// cleanly and comes back as a continuation, so runs, bridges and hooks churn the whole time.
fn load(svc: &Path, seconds: u64) {
    let n = 200;
    let front = front_matter(n).replace(
        "workspace:\n  root: ws\n",
        "workspace:\n  root: ws\nhooks:\n  after_create: echo created > CREATED\n  before_run: date >> RUNS\n  after_run: tail -n 1 RUNS > /dev/null\n  before_remove: rm -f RUNS\n",
    );
    let d = Daemon::start(
        svc,
        "load",
        &front,
        &issues_json(n, n, "demo: slow 8000\ndemo: keep-open"),
    );
    // Runs come and go; most are running at any moment.
    d.wait(120, |s| {
        s["counts"]["running"].as_u64() >= Some(n as u64 * 3 / 4)
    })
    .unwrap_or_else(|| {
        panic!(
            "most of the 200 runs were not running after 120 s: {:?}\n{}",
            d.latest
                .lock()
                .unwrap()
                .as_ref()
                .map(|s| (s["counts"].clone(), s["recent_events"].clone())),
            std::fs::read_to_string(d.dir.join("svc.log"))
                .unwrap_or_default()
                .lines()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    let started = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    let every = Duration::from_secs(10);
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(
            every.min(Duration::from_secs(seconds).saturating_sub(started.elapsed())),
        );
        let sample = Sample {
            at: started.elapsed().as_secs(),
            rss: d.rss_kib() as i64,
            fds: d.fds() as i64,
            threads: d.threads() as i64,
        };
        eprintln!(
            "load: {:>4} s  rss {} KiB  fds {}  threads {}  running {}",
            sample.at,
            sample.rss,
            sample.fds,
            sample.threads,
            d.latest
                .lock()
                .unwrap()
                .as_ref()
                .map_or(0, |s| s["counts"]["running"].as_u64().unwrap_or(0))
        );
        samples.push(sample);
    }
    let s = d.latest.lock().unwrap().clone().unwrap_or_default();
    // Runs started, from the traces; failures, from the log.
    let mut runs = 0;
    if let Ok(dirs) = std::fs::read_dir(d.dir.join("traces")) {
        for entry in dirs.flatten() {
            let text =
                std::fs::read_to_string(entry.path().join("trace.jsonl")).unwrap_or_default();
            runs += text.matches("\"type\":\"process_started\"").count();
        }
    }
    let log = std::fs::read_to_string(d.dir.join("svc.log")).unwrap_or_default();
    let failed = log.lines().filter(|l| l.contains(" failed: ")).count();
    let errors = log.lines().filter(|l| l.contains("ERROR")).count();
    // Growth: the median of the last minute against the median of the minute after warm-up
    // (the first minute fills allocator pools and thread-stack caches). Single samples swing
    // with the number of hooks and bridges in flight at that instant.
    let end = samples.last().map_or(0, |s| s.at);
    let window = |from: u64, to: u64| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|s| s.at > from && s.at <= to)
            .collect()
    };
    let early = window(60, 120);
    let early = if early.is_empty() {
        samples.iter().collect()
    } else {
        early
    };
    let late = window(end.saturating_sub(60), end);
    println!(
        "load_duration_s\t{end}\t({n} concurrent runs, every hook, {runs} runs started; goal 600)"
    );
    let metrics: [(&str, Pick, &str); 3] = [
        ("load_rss_growth_kib", |s| s.rss, "KiB"),
        ("load_fd_growth", |s| s.fds, "fds"),
        ("load_thread_growth", |s| s.threads, "threads"),
    ];
    for (metric, pick, unit) in metrics {
        let all: Vec<i64> = samples.iter().map(pick).collect();
        let (lo, hi) = (
            all.iter().min().copied().unwrap_or(0),
            all.iter().max().copied().unwrap_or(0),
        );
        let (a, b) = (median(&early, pick), median(&late, pick));
        println!(
            "{metric}\t{}\t(median {a} {unit} in the minute after warm-up, {b} in the last minute; range {lo}-{hi}; goal: flat)",
            b - a
        );
    }
    println!(
        "load_errors\t{}\t(failed runs {failed}, ERROR log lines {errors}, retrying {}; goal 0)",
        failed + errors,
        s["counts"]["retrying"]
    );
}

/// One sample of the load run: seconds since the start, RSS in KiB, open fds, threads.
struct Sample {
    at: u64,
    rss: i64,
    fds: i64,
    threads: i64,
}

type Pick = fn(&Sample) -> i64;

fn median(window: &[&Sample], pick: Pick) -> i64 {
    let mut v: Vec<i64> = window.iter().map(|s| pick(s)).collect();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or(0)
}
