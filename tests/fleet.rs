//! The fleet: daemons with homes of their own (as on separate hosts) sharing one claim store.
//! Each scenario runs on a shared SQLite file and, where PostgreSQL is installed (always in
//! CI), on a real PostgreSQL server started for the tests: control relayed to the daemon that
//! holds an issue, exactly once, and `svc status` listing the fleet.

mod common;

use common::*;
use common::{faulty, pg};
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
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 300\nworkspace:\n  root: ~/ws\nagent:\n  kind: demo\n  max_turns: 20\n  max_concurrent_agents: {cap}\nagents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\nserver:\n  port: 0\n",
            prompts.display(),
            svc_bin()
        ),
    );
    (wf, prompts)
}

/// A daemon of the fleet: a home of its own, the shared `store`, a 2 s claim TTL.
fn member(dir: &TestDir, wf: &Path, store: &str, name: &str) -> Daemon {
    member_with_ttl(dir, wf, store, name, 2000)
}

/// [`member`] with a claim TTL of `ttl_ms`.
fn member_with_ttl(dir: &TestDir, wf: &Path, store: &str, name: &str, ttl_ms: u64) -> Daemon {
    let home = dir.join(name);
    fs::create_dir_all(&home).unwrap();
    let mut cmd = svc(dir);
    cmd.arg("--no-tui")
        .arg(wf)
        .env("HOME", &home)
        .env("SVC_CLAIM_STORE", store)
        .env("SVC_CLAIM_TTL_MS", ttl_ms.to_string())
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
    holder.wait_for(20, "the run holding its claim", |s| {
        s["running"][0]["claimed"] == true
    });
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

/// A database of its own on the tests' PostgreSQL server (None, after a line, where
/// PostgreSQL is not installed and the run is not strict).
fn pg_store(name: &str) -> Option<String> {
    Some(pg::PgServer::shared()?.new_database(name))
}

#[test]
fn postgres_control_is_relayed_to_the_daemon_that_holds_the_issue() {
    let Some(store) = pg_store("relay") else {
        return;
    };
    let dir = TestDir::new("fleet-relay-pg");
    relayed_control(&store, &dir);
}

/// Issue identifiers each run started on, from the `before_run` hook's log.
fn starts(dir: &TestDir) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for line in fs::read_to_string(dir.join("starts.log"))
        .unwrap_or_default()
        .lines()
    {
        *out.entry(line.trim().to_string()).or_default() += 1;
    }
    out
}

/// A board of `n` issues whose runs log their start (the `before_run` hook).
fn counted_workflow(dir: &TestDir, n: usize, body: &str, cap: u32) -> PathBuf {
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    for i in 1..=n {
        fs::write(
            board.join(format!("BOARD-{i}.md")),
            format!("---\ntitle: Fleet {i}\nstate: Todo\n---\n{body}\n"),
        )
        .unwrap();
    }
    workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 300\nworkspace:\n  root: ~/ws\nagent:\n  kind: demo\n  max_concurrent_agents: {cap}\n  max_retry_backoff_ms: 1000\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\nhooks:\n  before_run: echo $SVC_ISSUE_IDENTIFIER >> {}\n",
            dir.join("starts.log").display()
        ),
    )
}

#[test]
fn three_daemons_on_postgres_work_thirty_issues_and_start_none_twice() {
    let Some(store) = pg_store("thirty") else {
        return;
    };
    let dir = TestDir::new("fleet-thirty");
    let wf = counted_workflow(&dir, 30, "demo: slow 200", 4);
    let fleet: Vec<Daemon> = ["h1", "h2", "h3"]
        .iter()
        .map(|h| member(&dir, &wf, &store, h))
        .collect();
    wait_until(120, "every issue done", || {
        (1..=30).all(|i| board_state(&dir, &format!("BOARD-{i}.md")) == "Done")
    });
    let starts = starts(&dir);
    assert_eq!(starts.len(), 30, "{starts:?}");
    assert!(
        starts.values().all(|n| *n == 1),
        "an issue started twice: {starts:?}"
    );
    // Any daemon lists the fleet's runs, and the snapshot says postgres.
    let d = &fleet[0];
    let s = d.wait_for(20, "postgres in the snapshot", |s| {
        s["claim_store"]["kind"] == "postgres"
    });
    assert_eq!(s["daemon"]["leadership_store_kind"], "postgres", "{s}");
    let caps = &s["claim_store"]["capabilities"];
    assert!(
        caps["crash_recovery"] == true
            && caps["shared_across_processes"] == true
            && caps["retry_durability"] == true,
        "{s}"
    );
    wait_until(20, "the fleet's runs on one daemon", || {
        let runs = http(
            "GET",
            &format!("{}/api/v1/runs?limit=50", base_url(d)),
            &[],
            None,
        )
        .2;
        serde_json::from_str::<Value>(&runs)
            .ok()
            .and_then(|v| v["runs"].as_array().map(Vec::len))
            .is_some_and(|n| n >= 30)
    });
}

#[test]
fn a_killed_daemon_on_postgres_hands_its_runs_over_within_the_ttl() {
    let Some(store) = pg_store("killed") else {
        return;
    };
    let dir = TestDir::new("fleet-kill");
    let wf = counted_workflow(&dir, 2, "demo: slow 60000", 2);
    let mut a = member(&dir, &wf, &store, "h1");
    a.wait_for(30, "both running on the first daemon", |s| {
        s["counts"]["running"] == 2
    });
    let b = member(&dir, &wf, &store, "h2");
    b.wait_for(20, "the second daemon sees the first's slots", |s| {
        s["fleet"].as_array().is_some_and(|f| f.len() == 2)
    });
    a.signal(libc::SIGKILL);
    a.wait_exit(10);
    // Taken over as retries, and run again on the second daemon.
    let s = b.wait_for(20, "the dead daemon's runs taken over", |s| {
        events(s).contains(&"claim_taken_over".to_string())
    });
    assert!(s.to_string().contains("taken over"), "{s}");
    wait_until(30, "both started again on the second daemon", || {
        starts(&dir).values().all(|n| *n == 2) && starts(&dir).len() == 2
    });
}

#[test]
fn a_daemon_paused_past_the_ttl_stops_its_runs_and_its_late_writes_are_refused() {
    let Some(store) = pg_store("paused") else {
        return;
    };
    let dir = TestDir::new("fleet-pause");
    let wf = counted_workflow(&dir, 1, "demo: slow 60000", 1);
    let a = member(&dir, &wf, &store, "h1");
    let s = a.wait_for(30, "running on the first daemon", |s| {
        s["counts"]["running"] == 1
    });
    let run_id = s["running"][0]["session_id"].clone();
    let _ = run_id;
    let b = member(&dir, &wf, &store, "h2");
    b.wait_for(20, "the second daemon sees the first", |s| {
        s["fleet"].as_array().is_some_and(|f| f.len() == 2)
    });
    a.signal(libc::SIGSTOP);
    // Past the TTL (2 s), the second daemon takes the run over and starts it again.
    wait_until(30, "the run started again elsewhere", || {
        starts(&dir).get("BOARD-1") == Some(&2)
    });
    a.signal(libc::SIGCONT);
    // The first daemon finds its claim gone and stops its run.
    let s = a.wait_latest(30, "the paused daemon's run stopped", |s| {
        s["counts"]["running"] == 0
    });
    assert!(events(&s).contains(&"claim_lost".to_string()), "{s}");
    // Its late writes were refused: the history in the store has no run of the first
    // daemon's (its run's end was fenced), and the issue runs on the second only.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let server = pg::PgServer::shared().unwrap();
    let db = store.rsplit('/').next().unwrap();
    let rows = server.psql(db, "SELECT count(*) FROM svc.runs");
    assert_eq!(rows.trim(), "0", "a late write landed");
    let claims = server.psql(db, "SELECT count(*) FROM svc.claims");
    assert_eq!(claims.trim(), "1");
    assert_eq!(starts(&dir).get("BOARD-1"), Some(&2));
    assert_eq!(b.latest().unwrap()["counts"]["running"], 1);
}

#[test]
fn a_newer_schema_and_a_wrong_password_are_refused_clearly_without_the_secret() {
    let Some(server) = pg::PgServer::shared() else {
        return;
    };
    let dir = TestDir::new("fleet-refused");
    let wf = counted_workflow(&dir, 1, "demo: slow 100", 1);
    // A wrong password: a clear error at start, the password nowhere.
    let wrong = "Wr0ngPassw0rd-svc-fleet";
    let uri = format!(
        "postgres://svc_test:{wrong}@127.0.0.1:{}/postgres",
        server.port()
    );
    let out = run(svc(&dir)
        .arg("--no-tui")
        .arg(&wf)
        .env("SVC_CLAIM_STORE", &uri));
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("password authentication failed"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("svc_test:***@"), "{}", out.stderr);
    assert!(
        !out.stderr.contains(wrong) && !out.stdout.contains(wrong),
        "{}",
        out.stderr
    );
    // A schema written by a newer svc: refused, naming both versions.
    let store = server.new_database("newer");
    let db = store.rsplit('/').next().unwrap().to_string();
    server.psql(&db, "CREATE SCHEMA svc; CREATE TABLE svc.meta (key text PRIMARY KEY, value text NOT NULL); INSERT INTO svc.meta VALUES ('schema_version', '99'); ALTER SCHEMA svc OWNER TO svc_test; ALTER TABLE svc.meta OWNER TO svc_test;");
    let out = run(svc(&dir)
        .arg("--no-tui")
        .arg(&wf)
        .env("SVC_CLAIM_STORE", &store));
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("schema version 99")
            && out.stderr.contains(&format!(
                "knows version {}",
                svc::orchestrator::store::postgres::SCHEMA_VERSION
            )),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains(server.password()), "{}", out.stderr);
}

#[test]
fn a_server_restart_under_load_and_killed_connections_lose_nothing_and_run_nothing_twice() {
    // A server of its own: this test restarts it and ends its sessions.
    let Some(server) = pg::PgServer::start() else {
        return;
    };
    let store = server.new_database("faults");
    let db = store.rsplit('/').next().unwrap().to_string();
    let dir = TestDir::new("fleet-faults");
    let wf = counted_workflow(&dir, 12, "demo: slow 1500", 3);
    let a = member(&dir, &wf, &store, "h1");
    let b = member(&dir, &wf, &store, "h2");
    wait_until(30, "runs under way", || starts(&dir).len() >= 3);
    // The server restarts under them.
    server.restart();
    wait_until(30, "more runs after the restart", || {
        starts(&dir).len() >= 6
    });
    // Every svc session ended from the server side, once the daemons are connected again.
    let sessions = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' AND application_name = 'svc'"
    );
    wait_until(30, "svc connected again", || {
        server
            .psql("postgres", &sessions)
            .parse::<u32>()
            .unwrap_or(0)
            >= 2
    });
    assert!(server.terminate_connections(&db) > 0);
    wait_until(120, "every issue done", || {
        (1..=12).all(|i| board_state(&dir, &format!("BOARD-{i}.md")) == "Done")
    });
    let starts = starts(&dir);
    assert_eq!(starts.len(), 12, "{starts:?}");
    assert!(
        starts.values().all(|n| *n == 1),
        "an issue started twice: {starts:?}\nfirst daemon:\n{}\nsecond daemon:\n{}",
        a.stderr(),
        b.stderr()
    );
    // Nothing lost: every issue's successful run is in the store's history (besides runs that
    // could not claim their slot while the server was away), and nothing is left claimed.
    wait_until(30, "every run in the store", || {
        server.psql(
            &db,
            "SELECT count(DISTINCT record::json->'run'->'issue'->>'identifier') FROM svc.runs WHERE record::json->>'outcome' = 'Success'",
        ) == "12"
            && server.psql(&db, "SELECT count(*) FROM svc.claims") == "0"
    });
    // Each outage was said at most once by each daemon, and its end once (a daemon whose
    // write or claim found the server back at once, on a new connection, saw none).
    for d in [&a, &b] {
        let log = d.stderr();
        let down = log
            .matches("nothing new is claimed until it is back")
            .count();
        let up = log.matches("reached and written again").count();
        assert!(
            down <= 2 && up == down,
            "{down} outages, {up} recoveries:\n{log}"
        );
    }
}

/// Runs `svc store copy FROM TO`.
fn store_copy(dir: &TestDir, from: &str, to: &str) -> Run {
    run(svc(dir).args(["store", "copy", from, to]))
}

#[test]
fn svc_store_copy_moves_retries_history_and_cursors_to_postgres_and_back() {
    let Some(server) = pg::PgServer::shared() else {
        return;
    };
    let dir = TestDir::new("fleet-copy");
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    fs::write(
        board.join("BOARD-1.md"),
        "---\ntitle: Done soon\nstate: Todo\n---\ndemo: slow 100\n",
    )
    .unwrap();
    fs::write(
        board.join("BOARD-2.md"),
        "---\ntitle: Crashes\nstate: Todo\n---\ndemo: crash\n",
    )
    .unwrap();
    let wf = workflow_with_description(
        &dir,
        "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 300\nworkspace:\n  root: ~/ws\nagent:\n  kind: demo\n  max_retry_backoff_ms: 3600000\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n",
    );
    let sqlite = dir.join("team.claims.db");
    let sqlite = sqlite.to_str().unwrap();
    // A daemon on the SQLite file: one run done, one retry pending.
    let mut d = member(&dir, &wf, sqlite, "h1");
    // (BOARD-1's run over, and its continuation check too: the crash's retry alone waits.)
    d.wait_for(60, "one run done and one retry pending", |s| {
        s["counts"]["retrying"] == 1
            && s["counts"]["running"] == 0
            && s["retrying"][0]["issue_identifier"] == "BOARD-2"
            && board_state(&dir, "BOARD-1.md") == "Done"
    });
    // Refused while a daemon uses it.
    let pg = server.new_database("copy");
    let out = store_copy(&dir, sqlite, &pg);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    assert!(
        out.stderr.contains("stop every daemon on it first"),
        "{}",
        out.stderr
    );
    d.signal(libc::SIGTERM);
    d.wait_exit(20);
    // The durable facts (the pool's worker-seconds, review feedback remembered) move too.
    let db = rusqlite::Connection::open(sqlite).unwrap();
    db.execute_batch("INSERT INTO tallies VALUES ('test/tally', 4242); INSERT INTO marks VALUES ('rework github:x', '7 k')")
        .unwrap();
    let spent_on_board_1 = |db: &rusqlite::Connection| -> i64 {
        db.query_row(
            "SELECT coalesce(sum(total), 0) FROM ledger WHERE name = 'issue:BOARD-1'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let spent = spent_on_board_1(&db);
    assert!(spent > 0, "the runs' spend is in the ledger");
    drop(db);
    // Into PostgreSQL: the counts said, the password not.
    let out = store_copy(&dir, sqlite, &pg);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("copied 1 pending retries"),
        "{}\nthe daemon said:\n{}",
        out.stdout,
        d.stderr()
    );
    assert!(!out.stdout.contains(server.password()), "{}", out.stdout);
    assert!(
        out.stdout.contains(" tallies, 1 marks and "),
        "{}",
        out.stdout
    );
    let runs_copied = |text: &str| -> usize {
        text.split(" finished runs")
            .next()
            .and_then(|t| t.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert!(runs_copied(&out.stdout) >= 2, "{}", out.stdout);
    // A daemon on PostgreSQL takes the retry over (same attempt) and lists the history.
    let mut p = member(&dir, &wf, &pg, "h2");
    let s = p.wait_for(30, "the retry taken over", |s| s["counts"]["retrying"] == 1);
    assert!(s["retrying"][0]["issue_identifier"] == "BOARD-2", "{s}");
    let history = http(
        "GET",
        &format!("{}/api/v1/runs?limit=50", base_url(&p)),
        &[],
        None,
    )
    .2;
    assert!(history.contains("BOARD-1"), "{history}");
    p.signal(libc::SIGTERM);
    p.wait_exit(20);
    // And back into a new SQLite file.
    let back = dir.join("back.claims.db");
    let out = store_copy(&dir, &pg, back.to_str().unwrap());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("copied 1 pending retries"),
        "{}",
        out.stdout
    );
    assert!(runs_copied(&out.stdout) >= 2, "{}", out.stdout);
    assert!(
        out.stdout.contains(" tallies, 1 marks and "),
        "{}",
        out.stdout
    );
    let db = rusqlite::Connection::open(&back).unwrap();
    let tally: f64 = db
        .query_row(
            "SELECT value FROM tallies WHERE name = 'test/tally'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tally, 4242.0);
    assert_eq!(spent_on_board_1(&db), spent, "the ledger moved both ways");
    drop(db);
    let d = member(&dir, &wf, back.to_str().unwrap(), "h3");
    d.wait_for(30, "the retry taken over again", |s| {
        s["counts"]["retrying"] == 1
    });
    // Bad arguments are usage errors.
    let out = run(svc(&dir).args(["store", "copy", "only-one"]));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
}

// ---- The fleet under faults -------------------------------------------------------------------

/// This daemon's owner id in the claim store.
fn owner_of(d: &Daemon) -> String {
    let s = d.wait_for(20, "the daemon's owner id", |s| {
        s["daemon"]["owner_id"].is_string()
    });
    s["daemon"]["owner_id"].as_str().unwrap().to_string()
}

/// Whether `d`'s fleet view lists `owner` as live (listed, not stale).
fn sees_live(d: &Daemon, owner: &str) -> bool {
    d.latest().is_some_and(|s| {
        s["fleet"].as_array().is_some_and(|f| {
            f.iter()
                .any(|m| m["owner_id"] == owner && m["stale"] == false)
        })
    })
}

fn running_count(d: &Daemon) -> u64 {
    d.latest()
        .and_then(|s| s["counts"]["running"].as_u64())
        .unwrap_or(0)
}

/// Writes the board issue `BOARD-<n>.md` (Todo) with `body`.
fn add_issue(dir: &TestDir, n: usize, body: &str) {
    fs::write(
        dir.join(&format!("board/BOARD-{n}.md")),
        format!("---\ntitle: Fleet {n}\nstate: Todo\n---\n{body}\n"),
    )
    .unwrap();
}

/// A daemon frozen inside a write transaction (its backend idle in transaction, holding the
/// rows of its claims; every byte to and from it held by a proxy) stalls nobody: the two live
/// daemons keep their runs and see each other live throughout, and take the frozen daemon's run
/// over within its TTL, the server's idle-in-transaction bound and a sweep (2 s + 1 s + 1 s;
/// 20 s allowed here for a loaded machine).
#[test]
fn a_daemon_frozen_inside_a_write_transaction_stalls_nobody() {
    let Some(server) = pg::PgServer::shared() else {
        return;
    };
    let store = server.new_database("frozen");
    let proxy = faulty::Proxy::start(server.port());
    let dir = TestDir::new("fleet-frozen");
    // A takes the first two issues: one ends after 12 s (its end is the write A freezes in),
    // one runs on.
    // Room for one more on either live daemon, whichever takes A's run over (the taker runs
    // its retry), however the four split between them.
    let wf = counted_workflow(&dir, 0, "", 5);
    add_issue(&dir, 1, "demo: slow 12000");
    add_issue(&dir, 2, "demo: slow 120000\ndemo: keep-open");
    // A takes no more than those two.
    let wf_a = dir.join("WORKFLOW-a.md");
    fs::write(
        &wf_a,
        fs::read_to_string(&wf)
            .unwrap()
            .replace("max_concurrent_agents: 5", "max_concurrent_agents: 2"),
    )
    .unwrap();
    let a = member(&dir, &wf_a, &proxy.uri(&store, server.port()), "h1");
    wait_until(30, "A runs both", || running_count(&a) == 2);
    let b = member(&dir, &wf, &store, "h2");
    let c = member(&dir, &wf, &store, "h3");
    for n in 3..=6 {
        add_issue(&dir, n, "demo: slow 120000\ndemo: keep-open");
    }
    wait_until(30, "B and C run the other four", || {
        running_count(&b) + running_count(&c) == 4
    });
    let (owner_b, owner_c) = (owner_of(&b), owner_of(&c));
    // Runs lost from here on count (two daemons starting together may each dispatch what
    // the other claimed first, and lose it before it starts).
    let since = |d: &Daemon| {
        d.latest().unwrap()["generated_at"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (since_b, since_c) = (since(&b), since(&c));
    proxy.freeze_in_next_transaction();
    wait_until(40, "A frozen inside a transaction", || proxy.is_frozen());
    // A's long run moves to B or C; meanwhile B and C never lose a run, never stop seeing
    // each other live.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        assert!(
            sees_live(&b, &owner_c) && sees_live(&c, &owner_b),
            "B and C stopped seeing each other live:\n{}\n{}",
            b.stderr(),
            c.stderr()
        );
        if starts(&dir).get("BOARD-2") == Some(&2) {
            break;
        }
        if std::time::Instant::now() >= deadline {
            let db = store.rsplit('/').next().unwrap().to_string();
            let look = |sql: &str| server.psql(&db, sql);
            panic!(
                "A's run did not move within 20 s of the freeze: {:?}\nowners: {}\nclaims: {}\nretries: {}\nsessions: {}\nB: {}\nC: {}\n{}\n{}",
                starts(&dir),
                look("SELECT owner_id, now() - heartbeat_at, ttl_ms FROM svc.owners"),
                look("SELECT issue_id, owner_id FROM svc.claims"),
                look("SELECT issue_id, owner_id FROM svc.retries"),
                look(
                    "SELECT pid, state, now() - state_change, left(query, 50) FROM pg_stat_activity WHERE datname = current_database()"
                ),
                b.latest().unwrap()["recent_events"],
                c.latest().unwrap()["recent_events"],
                b.stderr(),
                c.stderr()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for (d, from) in [(&b, &since_b), (&c, &since_c)] {
        let s = d.latest().unwrap();
        let lost = s["recent_events"].as_array().unwrap().iter().any(|e| {
            e["event"] == "claim_lost" && e["at"].as_str().is_some_and(|at| at > from.as_str())
        });
        assert!(!lost, "a live daemon lost a run: {s}");
    }
    wait_until(10, "B and C run theirs and A's", || {
        running_count(&b) + running_count(&c) == 5
    });
    for n in 3..=6 {
        assert_eq!(
            starts(&dir).get(&format!("BOARD-{n}")),
            Some(&1),
            "{:?}",
            starts(&dir)
        );
    }
    proxy.thaw();
}

/// A daemon restarted during an outage of the server, which reaches it first when it is back,
/// takes over no live daemon's runs: it sees none of their heartbeats renewed yet, and waits
/// one TTL before it judges them.
#[test]
fn a_daemon_restarted_during_an_outage_takes_over_no_live_run() {
    // A server of its own: this test stops it.
    let Some(server) = pg::PgServer::start() else {
        return;
    };
    let store = server.new_database("outage");
    let proxy = faulty::Proxy::start(server.port());
    let dir = TestDir::new("fleet-outage");
    let wf = counted_workflow(&dir, 2, "demo: slow 120000\ndemo: keep-open", 2);
    let a = member_with_ttl(&dir, &wf, &proxy.uri(&store, server.port()), "h1", 4000);
    wait_until(30, "A runs both", || running_count(&a) == 2);
    let mut b = member_with_ttl(&dir, &wf, &store, "h2", 4000);
    wait_until(20, "B sees A", || sees_live(&b, &owner_of(&a)));
    // The outage: A cut off, the server down past the TTL, B restarted meanwhile.
    proxy.block();
    server.stop();
    b.signal(libc::SIGKILL);
    b.wait_exit(10);
    std::thread::sleep(std::time::Duration::from_secs(5));
    server.start_again();
    let b2 = member_with_ttl(&dir, &wf, &store, "h2", 4000);
    b2.wait_for(20, "the restarted daemon serves", |s| {
        s["daemon"]["owner_id"].is_string()
    });
    // A reaches the server only now, after B2.
    proxy.unblock();
    std::thread::sleep(std::time::Duration::from_secs(8));
    let s = a.latest().unwrap();
    assert!(
        !events(&s).contains(&"claim_lost".to_string()),
        "the restarted daemon took a live daemon's runs: {s}\n{}",
        b2.stderr()
    );
    assert_eq!(running_count(&a), 2, "{}", a.stderr());
    assert!(
        starts(&dir).values().all(|n| *n == 1),
        "a run started twice: {:?}",
        starts(&dir)
    );
}

/// The spend of issue `identifier` as daemon `d` shows it (`svc runs --spend`'s JSON).
fn spend_of(d: &Daemon, identifier: &str) -> Option<f64> {
    let (_, _, body) = http(
        "GET",
        &format!("{}/api/v1/runs?spend=1", base_url(d)),
        &[],
        None,
    );
    let v: Value = serde_json::from_str(&body).ok()?;
    v["issues"]
        .as_array()?
        .iter()
        .find(|i| i["issue_identifier"] == identifier)?["cost_usd"]
        .as_f64()
}

/// COMMITs whose answers are lost (the server committed; the daemon never heard) are sent
/// again and land once: the run's $0.45 is counted once, in the store and after a restart.
#[test]
fn lost_commit_answers_leave_the_spend_counted_once() {
    let Some(server) = pg::PgServer::shared() else {
        return;
    };
    let store = server.new_database("lostcommit");
    let db = store.rsplit('/').next().unwrap().to_string();
    let proxy = faulty::Proxy::start(server.port());
    let through = proxy.uri(&store, server.port());
    let dir = TestDir::new("fleet-lost-commit");
    let wf = counted_workflow(&dir, 1, "demo: report 0.45 - 1500\ndemo: cost 0", 1);
    let mut a = member(&dir, &wf, &through, "h1");
    wait_until(30, "the run started", || {
        starts(&dir).contains_key("BOARD-1")
    });
    // Every COMMIT answer is lost while the run spends and ends.
    proxy.lose_commit_answers(1000);
    wait_until(30, "the issue done", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
    std::thread::sleep(std::time::Duration::from_secs(2));
    proxy.lose_commit_answers(0);
    assert!(proxy.lost_commits() >= 1, "no COMMIT answer was lost");
    let in_store = || {
        server.psql(
            &db,
            "SELECT coalesce(sum(cost), 0)::text FROM svc.ledger WHERE name = 'issue:BOARD-1'",
        )
    };
    wait_until(20, "the spend in the store", || in_store() != "0");
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(in_store(), "0.45", "lost {} answers", proxy.lost_commits());
    assert_eq!(spend_of(&a, "BOARD-1"), Some(0.45));
    // And after a restart.
    a.signal(libc::SIGKILL);
    a.wait_exit(10);
    let a2 = member(&dir, &wf, &through, "h1");
    wait_until(20, "the restarted daemon's spend", || {
        spend_of(&a2, "BOARD-1").is_some()
    });
    assert_eq!(spend_of(&a2, "BOARD-1"), Some(0.45));
}

/// A daemon cut off from the store for longer than any overlap sees what the others spent
/// meanwhile within seconds of coming back.
#[test]
fn a_daemon_cut_off_for_long_sees_the_others_spend_when_back() {
    let Some(server) = pg::PgServer::shared() else {
        return;
    };
    let store = server.new_database("cutoff");
    let proxy = faulty::Proxy::start(server.port());
    let dir = TestDir::new("fleet-cutoff");
    let wf = counted_workflow(&dir, 0, "", 1);
    let a = member(&dir, &wf, &proxy.uri(&store, server.port()), "h1");
    let b = member(&dir, &wf, &store, "h2");
    wait_until(20, "A sees B", || sees_live(&a, &owner_of(&b)));
    proxy.block();
    // B alone claims and runs the issue while A is away.
    add_issue(&dir, 1, "demo: cost 0.45");
    wait_until(30, "B's spend", || spend_of(&b, "BOARD-1") == Some(0.45));
    std::thread::sleep(std::time::Duration::from_secs(40));
    proxy.unblock();
    wait_until(15, "A sees B's spend", || {
        spend_of(&a, "BOARD-1") == Some(0.45)
    });
}

/// A bridge that reports 18446744073709551615 tokens and a cost of 1e308 neither jams the
/// store writer nor records nonsense: later runs are recorded, claims released, and the
/// history survives SIGKILL.
fn absurd_usage(store: &str, dir: &TestDir, server: Option<(&pg::PgServer, &str)>) {
    let wf = counted_workflow(dir, 0, "", 1);
    add_issue(
        dir,
        1,
        "demo: usage 18446744073709551615 18446744073709551615\ndemo: report 1e308 18446744073709551615 0",
    );
    let mut a = member(dir, &wf, store, "h1");
    wait_until(30, "the first issue done", || {
        board_state(dir, "BOARD-1.md") == "Done"
    });
    add_issue(dir, 2, "demo: cost 0.01");
    wait_until(30, "the second issue done", || {
        board_state(dir, "BOARD-2.md") == "Done"
    });
    let s = a.wait_for(20, "the absurd figures said", |s| {
        events(s).contains(&"usage_out_of_range".to_string())
    });
    assert!(
        !events(&s).contains(&"claim_store_write_failed".to_string()),
        "{s}"
    );
    if let Some((server, db)) = server {
        wait_until(20, "no claim left", || {
            server.psql(db, "SELECT count(*) FROM svc.claims") == "0"
                && server.psql(db, "SELECT count(*) FROM svc.runs") == "2"
        });
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    a.signal(libc::SIGKILL);
    a.wait_exit(10);
    let a2 = member(dir, &wf, store, "h1");
    let runs = || -> Vec<Value> {
        let (_, _, body) = http(
            "GET",
            &format!("{}/api/v1/runs?limit=50", base_url(&a2)),
            &[],
            None,
        );
        serde_json::from_str::<Value>(&body).unwrap_or(Value::Null)["runs"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    wait_until(20, "both runs in the history after a restart", || {
        runs().len() == 2
    });
    for r in runs() {
        let total = r["tokens"]["total_tokens"].as_u64();
        assert!(total.is_some_and(|t| t <= 1 << 42), "{r}");
        let usd = r["cost"]["estimated_cost_usd"].as_f64();
        assert!(usd.is_none_or(|c| c.is_finite() && c <= 1e9), "{r}");
    }
}

#[test]
fn absurd_usage_on_sqlite_is_capped_and_jams_nothing() {
    let dir = TestDir::new("fleet-absurd-sqlite");
    let store = dir.join("claims.db").display().to_string();
    absurd_usage(&store, &dir, None);
}

#[test]
fn absurd_usage_on_postgres_is_capped_and_jams_nothing() {
    let Some(server) = pg::PgServer::shared() else {
        return;
    };
    let store = server.new_database("absurd");
    let db = store.rsplit('/').next().unwrap().to_string();
    let dir = TestDir::new("fleet-absurd-pg");
    absurd_usage(&store, &dir, Some((server, &db)));
}

/// Two live daemons with different TTLs never take each other over: each is judged by its own.
#[test]
fn daemons_with_different_ttls_do_not_take_each_other_over() {
    let Some(store) = pg_store("ttls") else {
        return;
    };
    let dir = TestDir::new("fleet-ttls");
    let wf = counted_workflow(&dir, 2, "demo: slow 120000\ndemo: keep-open", 1);
    let a = member_with_ttl(&dir, &wf, &store, "h1", 30000);
    wait_until(30, "A runs one", || running_count(&a) == 1);
    let b = member_with_ttl(&dir, &wf, &store, "h2", 2000);
    wait_until(30, "B runs the other", || running_count(&b) == 1);
    // A's heartbeat may lag B's TTL (a slow sweep); B judges it by A's 30 s.
    a.signal(libc::SIGSTOP);
    std::thread::sleep(std::time::Duration::from_secs(6));
    a.signal(libc::SIGCONT);
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_none_taken_over(&[&a, &b], &dir);
}

/// No daemon of `fleet` took another's run over or lost one, and no issue started twice.
fn assert_none_taken_over(fleet: &[&Daemon], dir: &TestDir) {
    for d in fleet {
        let s = d.latest().unwrap();
        let seen = events(&s);
        assert!(
            !seen.contains(&"claim_lost".to_string())
                && !seen.contains(&"claim_taken_over".to_string()),
            "{s}"
        );
    }
    assert!(starts(dir).values().all(|n| *n == 1), "{:?}", starts(dir));
}

/// `svc` started in a PID namespace of its own (`unshare --pid --fork`), as in a container,
/// as a child of the namespace's first process, with the pid `skip` + 2 or so there (what pids
/// the other namespace has, this one does not).
fn member_in_pid_namespace(dir: &TestDir, wf: &Path, store: &str, name: &str, skip: u32) -> Daemon {
    let home = dir.join(name);
    fs::create_dir_all(&home).unwrap();
    fs::create_dir_all(dir.join("tmp")).unwrap();
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child", "sh", "-c"])
        .arg(format!(
            "i=0; while [ $i -lt {skip} ]; do /bin/true; i=$((i+1)); done; \"$0\" \"$@\""
        ))
        .arg(svc_bin())
        .arg("--no-tui")
        .arg(wf)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .env("TMPDIR", dir.join("tmp"))
        .env("SVC_CLAIM_STORE", store)
        .env("SVC_CLAIM_TTL_MS", "2000")
        .current_dir(&dir.path);
    Daemon::start(cmd)
}

/// Two daemons with one host name in separate PID namespaces never take each other for dead
/// by a pid that means nothing in the other's namespace.
#[test]
fn daemons_in_separate_pid_namespaces_do_not_take_each_other_over() {
    let unshare = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status();
    if !unshare.is_ok_and(|s| s.success()) {
        eprintln!("skipping: unshare --pid needs root here");
        return;
    }
    let Some(store) = pg_store("pidns") else {
        return;
    };
    let dir = TestDir::new("fleet-pidns");
    let wf = counted_workflow(&dir, 2, "demo: slow 120000\ndemo: keep-open", 1);
    let a = member_in_pid_namespace(&dir, &wf, &store, "h1", 40);
    wait_until(30, "A runs one", || running_count(&a) == 1);
    let b = member_in_pid_namespace(&dir, &wf, &store, "h2", 300);
    wait_until(30, "B runs the other", || running_count(&b) == 1);
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_none_taken_over(&[&a, &b], &dir);
}

/// A TTL below two heartbeats is refused at start, with what to set instead.
#[test]
fn a_ttl_below_the_floor_is_refused_clearly() {
    let dir = TestDir::new("fleet-ttl-floor");
    let wf = counted_workflow(&dir, 0, "", 1);
    let out = run(svc(&dir)
        .arg("--no-tui")
        .arg(&wf)
        .env("SVC_CLAIM_STORE", dir.join("claims.db"))
        .env("SVC_CLAIM_TTL_MS", "500"));
    assert_eq!(out.code, Some(1), "{}", out.all());
    assert!(
        out.stderr.contains("SVC_CLAIM_TTL_MS=500") && out.stderr.contains("at least 2000"),
        "{}",
        out.stderr
    );
}

/// After a server restart, and after every svc session was ended (`pg_terminate_backend`),
/// raising `max_concurrent_agents` dispatches the waiting issues within seconds: no claim
/// fails on a connection that died meanwhile (each handle re-made at once).
#[test]
fn after_a_restart_or_killed_sessions_a_raised_cap_dispatches_at_once() {
    // A server of its own: this test restarts it and ends its sessions.
    let Some(server) = pg::PgServer::start() else {
        return;
    };
    let store = server.new_database("comeback");
    let db = store.rsplit('/').next().unwrap().to_string();
    let dir = TestDir::new("fleet-comeback");
    let wf = counted_workflow(&dir, 6, "demo: slow 120000\ndemo: keep-open", 1);
    let a = member(&dir, &wf, &store, "h1");
    let b = member(&dir, &wf, &store, "h2");
    wait_until(30, "one run each", || {
        running_count(&a) == 1 && running_count(&b) == 1
    });
    let raise = |cap: u32| {
        let text = fs::read_to_string(&wf).unwrap();
        let text = text
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("max_concurrent_agents:") {
                    format!("  max_concurrent_agents: {cap}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        fs::write(&wf, text + "\n").unwrap();
    };
    let sessions = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' AND application_name = 'svc'"
    );
    let connected = || {
        server
            .psql("postgres", &sessions)
            .parse::<u32>()
            .unwrap_or(0)
            >= 4
    };
    server.restart();
    wait_until(30, "both daemons connected again", connected);
    std::thread::sleep(std::time::Duration::from_secs(1));
    raise(2);
    wait_until(
        15,
        "the two waiting issues dispatched after the restart",
        || starts(&dir).len() == 4,
    );
    wait_until(30, "both daemons connected", connected);
    assert!(server.terminate_connections(&db) > 0);
    std::thread::sleep(std::time::Duration::from_secs(1));
    raise(3);
    wait_until(
        15,
        "the last two dispatched after the sessions ended",
        || starts(&dir).len() == 6,
    );
    for d in [&a, &b] {
        let log = d.stderr();
        assert!(
            !log.contains("not started: Failed"),
            "a claim failed on a dead connection:\n{log}"
        );
    }
    assert!(starts(&dir).values().all(|n| *n == 1), "{:?}", starts(&dir));
}
