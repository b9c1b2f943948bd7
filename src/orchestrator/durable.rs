//! The durable claim store: SQLite (bundled, WAL) beside the daemon's lock file
//! (`~/.svc/daemon/<workflow>-<hash>.claims.db`), on by default. It keeps what a crash must not
//! lose: the runs in flight (claims: issue slot, run, owner), the pending retries (attempt, due
//! time, error, worker host) and the finished runs (the last 50 are the API's history).
//!
//! Several daemons may share one store (two on one workflow, or several hosts on one local file
//! system): every daemon is an owner with a heartbeat; a run starts only after its slot is
//! claimed in one exclusive transaction ([`Store::acquire`], from the run's own thread); each
//! daemon's store thread heartbeats every second and sweeps: the claims and retries of an owner
//! whose heartbeat expired (or whose process is gone on this host) are taken over as retries,
//! and the slots other live owners hold are reported so they are never dispatched twice.
//!
//! The state thread never waits on it: after each batch of events it diffs the state against
//! what it last persisted and hands the changes, as one transaction, to the store thread.
//! `SVC_CLAIM_STORE` names another file, or `memory` for the in-memory store;
//! `SVC_CLAIM_TTL_MS` sets how long a silent owner keeps its claims (default 10 s).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, unbounded};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::state::{Key, Millis, Retry, RetryKind, RunRecord, Running};
use crate::steering::Message;

/// How long an owner may stay silent before others take its claims over.
pub const DEFAULT_TTL_MS: Millis = 10_000;
/// How often the store thread heartbeats and sweeps.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A run taken over from a dead owner is retried this soon (the first poll reconciles first).
pub const TAKEOVER_DELAY_MS: Millis = 2000;
/// The latest a taken-over retry may come due, from now (longer than any backoff).
const MAX_TAKEN_DUE_MS: Millis = 24 * 60 * 60 * 1000;

/// One change, applied in a transaction with the others of its batch. Claims and retries are
/// written only where this daemon owns them (or nobody does).
#[derive(Debug)]
pub enum Op {
    PutRun(Box<RunRecord>),
    PutRetry(Key, Box<Retry>),
    DeleteRetry(Key),
    PutClaim(Key, Box<Running>),
    DeleteClaim(Key),
    /// A steering message not yet delivered.
    PutSteer(Box<Message>),
    /// A steering message delivered (or dropped), by its unique key.
    DeleteSteer(String),
    /// Keys of accepted steering messages (never taken twice).
    PutSeen(Vec<String>),
    /// A steering source's cursor.
    PutCursor(String, String),
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::PutRun(_) => "put_run",
            Op::PutRetry(..) => "put_retry",
            Op::DeleteRetry(_) => "delete_retry",
            Op::PutClaim(..) => "put_claim",
            Op::DeleteClaim(_) => "delete_claim",
            Op::PutSteer(_) => "put_steering",
            Op::DeleteSteer(_) => "delete_steering",
            Op::PutSeen(_) => "put_steering_seen",
            Op::PutCursor(..) => "put_steering_cursor",
        }
    }
}

/// Who this daemon is in the store.
#[derive(Clone, Debug)]
pub struct Owner {
    pub id: String,
    pub hostname: String,
    pub pid: u32,
    /// How long a silent owner keeps its claims.
    pub ttl_ms: Millis,
}

/// What a sweep found: the slots other live owners hold, and what this daemon took over.
#[derive(Debug, Default)]
pub struct Sweep {
    pub foreign: BTreeSet<Key>,
    /// Retries of dead owners (same attempt and due time) and their runs in flight, as retries.
    pub taken_over: Vec<(Key, Retry)>,
}

/// What the store held at start.
#[derive(Debug, Default)]
pub struct Hydrated {
    /// Newest first, at most `limit`.
    pub history: Vec<RunRecord>,
    /// The first sweep: what the daemons before this one left, and what others hold.
    pub sweep: Sweep,
    /// Steering messages not yet delivered, oldest first.
    pub steering: Vec<Message>,
    /// Keys of accepted steering messages, oldest first.
    pub steering_seen: Vec<String>,
    /// Each steering source's cursor.
    pub steering_cursors: BTreeMap<String, String>,
}

pub struct Store {
    conn: Connection,
    pub path: PathBuf,
    owner: Owner,
}

/// The store's tables (created when missing).
const SCHEMA: &str = "PRAGMA journal_mode=WAL;
     PRAGMA synchronous=NORMAL;
     CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, ended_at INTEGER NOT NULL, record TEXT NOT NULL);
     CREATE INDEX IF NOT EXISTS runs_by_end ON runs (ended_at);
     CREATE TABLE IF NOT EXISTS owners (owner_id TEXT PRIMARY KEY, hostname TEXT NOT NULL, pid INTEGER NOT NULL, heartbeat_at INTEGER NOT NULL);
     CREATE TABLE IF NOT EXISTS slot_claims (issue_id TEXT NOT NULL, slot INTEGER NOT NULL, owner_id TEXT NOT NULL, run_id TEXT NOT NULL, record TEXT NOT NULL, PRIMARY KEY (issue_id, slot));
     CREATE TABLE IF NOT EXISTS slot_retries (issue_id TEXT NOT NULL, slot INTEGER NOT NULL, owner_id TEXT NOT NULL, record TEXT NOT NULL, PRIMARY KEY (issue_id, slot));
     CREATE INDEX IF NOT EXISTS slot_claims_by_owner ON slot_claims (owner_id);
     CREATE INDEX IF NOT EXISTS slot_retries_by_owner ON slot_retries (owner_id);
     CREATE TABLE IF NOT EXISTS steering (key TEXT PRIMARY KEY, issue_id TEXT NOT NULL, record TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS steering_seen (key TEXT PRIMARY KEY);
     CREATE TABLE IF NOT EXISTS steering_cursors (source TEXT PRIMARY KEY, cursor TEXT NOT NULL);";

fn fail(path: &Path) -> impl Fn(rusqlite::Error) -> String + '_ {
    move |e| format!("claim store {}: {e}", path.display())
}

/// Whether a process with this id exists on this host.
fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

impl Store {
    /// Opens (or creates) the store as `owner`; a file that is not a claim store, or is locked,
    /// is an error naming it.
    pub fn open(path: &Path, owner: Owner) -> Result<Store, String> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let conn = Connection::open(path).map_err(fail(path))?;
        conn.busy_timeout(Duration::from_secs(2))
            .map_err(fail(path))?;
        // Switching a new file to WAL takes a lock SQLite's busy handler does not wait for: two
        // daemons starting at once retry for a while instead of failing.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while let Err(e) = conn.execute_batch(SCHEMA) {
            let busy = matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            );
            if !busy || std::time::Instant::now() >= deadline {
                return Err(fail(path)(e));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut store = Store {
            conn,
            path: path.to_path_buf(),
            owner,
        };
        store.migrate()?;
        Ok(store)
    }

    /// Moves the rows of the first store layout (one claim per issue) into the slot tables,
    /// owned by nobody, so the next sweep takes them over.
    fn migrate(&mut self) -> Result<(), String> {
        let old: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('claims', 'retries')",
                [],
                |r| r.get(0),
            )
            .map_err(fail(&self.path))?;
        if old == 0 {
            return Ok(());
        }
        self.conn
            .execute_batch(
                "BEGIN IMMEDIATE;
                 CREATE TABLE IF NOT EXISTS claims (issue_id TEXT PRIMARY KEY, owner_id TEXT NOT NULL, record TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS retries (issue_id TEXT PRIMARY KEY, record TEXT NOT NULL);
                 INSERT OR IGNORE INTO slot_claims SELECT issue_id, 0, '', '', record FROM claims;
                 INSERT OR IGNORE INTO slot_retries SELECT issue_id, 0, '', record FROM retries;
                 DROP TABLE claims;
                 DROP TABLE retries;
                 COMMIT;",
            )
            .map_err(fail(&self.path))
    }

    /// Reads back the last `limit` finished runs, newest first.
    pub fn history(&self, limit: usize) -> Result<Vec<RunRecord>, String> {
        let fail = fail(&self.path);
        let mut q = self
            .conn
            .prepare("SELECT record FROM runs ORDER BY ended_at DESC, run_id DESC LIMIT ?1")
            .map_err(&fail)?;
        let rows = q
            .query_map(params![limit as i64], |r| r.get::<_, String>(0))
            .map_err(&fail)?;
        let mut out = Vec::new();
        for row in rows {
            if let Ok(record) = serde_json::from_str::<RunRecord>(&row.map_err(&fail)?) {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// Opens the store, reads the history and makes the first sweep (which registers this
    /// daemon as an owner).
    pub fn hydrate(&mut self, limit: usize, now: Millis) -> Result<Hydrated, String> {
        let path = self.path.clone();
        let fail = fail(&path);
        let column = |sql: &str| -> Result<Vec<(String, String)>, String> {
            let mut q = self.conn.prepare(sql).map_err(&fail)?;
            let rows = q
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
                .map_err(&fail)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(&fail)
        };
        let steering = column("SELECT key, record FROM steering ORDER BY rowid")?
            .into_iter()
            .filter_map(|(_, record)| serde_json::from_str(&record).ok())
            .collect();
        let steering_seen = column("SELECT key, key FROM steering_seen ORDER BY rowid")?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let steering_cursors = column("SELECT source, cursor FROM steering_cursors")?
            .into_iter()
            .collect();
        Ok(Hydrated {
            history: self.history(limit)?,
            sweep: self.sweep(now)?,
            steering,
            steering_seen,
            steering_cursors,
        })
    }

    /// Heartbeats, takes over what dead owners held, and lists what live ones hold: one
    /// exclusive transaction.
    pub fn sweep(&mut self, now: Millis) -> Result<Sweep, String> {
        let path = self.path.clone();
        let fail = fail(&path);
        let me = self.owner.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&fail)?;
        tx.execute(
            "INSERT INTO owners (owner_id, hostname, pid, heartbeat_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(owner_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
            params![me.id, me.hostname, me.pid, now as i64],
        )
        .map_err(&fail)?;
        let live = live_owners(&tx, &me, now).map_err(&fail)?;
        let holders: Vec<String> = tx
            .prepare_cached(
                "SELECT owner_id FROM slot_claims UNION SELECT owner_id FROM slot_retries",
            )
            .and_then(|mut q| q.query_map([], |r| r.get(0))?.collect())
            .map_err(&fail)?;
        let mut out = Sweep::default();
        for dead in holders.iter().filter(|o| !live.contains(*o)) {
            // Its retries first (same attempt and due time), then its runs as retries.
            let mut taken: BTreeSet<Key> = BTreeSet::new();
            for (key, record) in rows_of(&tx, "slot_retries", dead).map_err(&fail)? {
                taken.insert(key.clone());
                if let Ok(mut retry) = serde_json::from_str::<Retry>(&record) {
                    retry.fetching = false;
                    // A row is outside input (another daemon's, a damaged file): a due time
                    // past any backoff would park the issue for ever.
                    retry.due_at = retry.due_at.min(now.saturating_add(MAX_TAKEN_DUE_MS));
                    out.taken_over.push((key, retry));
                }
            }
            tx.execute(
                "UPDATE slot_retries SET owner_id = ?1 WHERE owner_id = ?2",
                params![me.id, dead],
            )
            .map_err(&fail)?;
            for (key, record) in rows_of(&tx, "slot_claims", dead).map_err(&fail)? {
                let Ok(run) = serde_json::from_str::<Running>(&record) else {
                    continue;
                };
                if taken.contains(&key) {
                    continue;
                }
                let retry = retry_of_dead_run(&run, dead, now);
                // A retry someone else holds for the slot stays theirs.
                let inserted = tx
                    .execute(
                        "INSERT OR IGNORE INTO slot_retries (issue_id, slot, owner_id, record) VALUES (?1, ?2, ?3, ?4)",
                        params![key.issue_id, key.slot, me.id, to_json(&retry)],
                    )
                    .map_err(&fail)?;
                if inserted == 1 {
                    out.taken_over.push((key, retry));
                }
            }
            tx.execute("DELETE FROM slot_claims WHERE owner_id = ?1", params![dead])
                .map_err(&fail)?;
        }
        // What other live owners hold now.
        for table in ["slot_claims", "slot_retries"] {
            let mut q = tx
                .prepare_cached(&format!(
                    "SELECT issue_id, slot FROM {table} WHERE owner_id != ?1"
                ))
                .map_err(&fail)?;
            let keys = q
                .query_map(params![me.id], |r| {
                    Ok(Key::new(r.get::<_, String>(0)?, r.get(1)?))
                })
                .map_err(&fail)?;
            for key in keys {
                out.foreign.insert(key.map_err(&fail)?);
            }
        }
        // The dead are gone now; their rows are this daemon's.
        tx.execute(
            "DELETE FROM owners WHERE owner_id NOT IN (SELECT value FROM json_each(?1))",
            params![serde_json::to_string(&live).unwrap_or_default()],
        )
        .map_err(&fail)?;
        tx.commit().map_err(&fail)?;
        Ok(out)
    }

    /// Claims `key` for run `run` in one exclusive transaction: granted unless another live
    /// daemon holds the slot (running or retrying); what a dead one held is dropped.
    pub fn acquire(&mut self, key: &Key, run: &Running, now: Millis) -> Result<(), Claim> {
        let path = self.path.clone();
        let fail =
            |e: rusqlite::Error| Claim::Failed(format!("claim store {}: {e}", path.display()));
        let me = self.owner.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        let live = live_owners(&tx, &me, now).map_err(fail)?;
        for table in ["slot_claims", "slot_retries"] {
            let holder: Option<String> = tx
                .query_row(
                    &format!("SELECT owner_id FROM {table} WHERE issue_id = ?1 AND slot = ?2"),
                    params![key.issue_id, key.slot],
                    |r| r.get(0),
                )
                .optional()
                .map_err(fail)?;
            match holder {
                Some(owner) if owner != me.id && live.contains(&owner) => {
                    return Err(Claim::Held(owner));
                }
                Some(owner) if owner != me.id => {
                    tx.execute(
                        &format!("DELETE FROM {table} WHERE issue_id = ?1 AND slot = ?2"),
                        params![key.issue_id, key.slot],
                    )
                    .map_err(fail)?;
                }
                _ => {}
            }
        }
        tx.execute(
            "INSERT OR REPLACE INTO slot_claims (issue_id, slot, owner_id, run_id, record) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![key.issue_id, key.slot, me.id, run.run_id, to_json(run)],
        )
        .map_err(fail)?;
        tx.commit().map_err(fail)
    }

    /// Applies a batch in one transaction; the history keeps its last 1,000 runs.
    pub fn apply(&mut self, ops: &[Op]) -> Result<(), String> {
        let path = self.path.clone();
        let fail = fail(&path);
        let me = &self.owner.id;
        let tx = self.conn.transaction().map_err(&fail)?;
        for op in ops {
            match op {
                Op::PutRun(r) => tx.execute(
                    "INSERT OR REPLACE INTO runs (run_id, ended_at, record) VALUES (?1, ?2, ?3)",
                    params![r.run.run_id, r.ended_at as i64, to_json(r.as_ref())],
                ),
                Op::PutRetry(k, r) => tx.execute(
                    "INSERT INTO slot_retries (issue_id, slot, owner_id, record) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT(issue_id, slot) DO UPDATE SET record = excluded.record
                     WHERE slot_retries.owner_id = excluded.owner_id",
                    params![k.issue_id, k.slot, me, to_json(r.as_ref())],
                ),
                Op::DeleteRetry(k) => tx.execute(
                    "DELETE FROM slot_retries WHERE issue_id = ?1 AND slot = ?2 AND owner_id = ?3",
                    params![k.issue_id, k.slot, me],
                ),
                Op::PutClaim(k, r) => tx.execute(
                    "INSERT INTO slot_claims (issue_id, slot, owner_id, run_id, record) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT(issue_id, slot) DO UPDATE SET run_id = excluded.run_id, record = excluded.record
                     WHERE slot_claims.owner_id = excluded.owner_id",
                    params![k.issue_id, k.slot, me, r.run_id, to_json(r.as_ref())],
                ),
                Op::DeleteClaim(k) => tx.execute(
                    "DELETE FROM slot_claims WHERE issue_id = ?1 AND slot = ?2 AND owner_id = ?3",
                    params![k.issue_id, k.slot, me],
                ),
                Op::PutSteer(m) => tx.execute(
                    "INSERT OR REPLACE INTO steering (key, issue_id, record) VALUES (?1, ?2, ?3)",
                    params![m.unique_key(), m.issue_id, to_json(m.as_ref())],
                ),
                Op::DeleteSteer(key) => {
                    tx.execute("DELETE FROM steering WHERE key = ?1", params![key])
                }
                Op::PutSeen(keys) => {
                    for key in keys {
                        tx.execute(
                            "INSERT OR IGNORE INTO steering_seen (key) VALUES (?1)",
                            params![key],
                        )
                        .map_err(&fail)?;
                    }
                    tx.execute(
                        "DELETE FROM steering_seen WHERE rowid NOT IN (SELECT rowid FROM steering_seen ORDER BY rowid DESC LIMIT ?1)",
                        params![crate::steering::SEEN_MAX as i64],
                    )
                }
                Op::PutCursor(source, cursor) => tx.execute(
                    "INSERT OR REPLACE INTO steering_cursors (source, cursor) VALUES (?1, ?2)",
                    params![source, cursor],
                ),
            }
            .map_err(&fail)?;
        }
        if ops.iter().any(|o| matches!(o, Op::PutRun(_))) {
            tx.execute(
                "DELETE FROM runs WHERE run_id NOT IN (SELECT run_id FROM runs ORDER BY ended_at DESC LIMIT 1000)",
                [],
            )
            .map_err(&fail)?;
        }
        tx.commit().map_err(&fail)
    }

    /// A clean stop: this daemon is no owner any more, so the next sweep of any daemon (or the
    /// next start) takes its retries over at once.
    pub fn unregister(&mut self) -> Result<(), String> {
        self.conn
            .execute(
                "DELETE FROM owners WHERE owner_id = ?1",
                params![self.owner.id],
            )
            .map(drop)
            .map_err(fail(&self.path))
    }
}

/// Why a claim was not granted.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// Another live daemon (this owner id) holds the slot.
    Held(String),
    /// The store could not be read or written.
    Failed(String),
}

/// The owners that are alive: this one, and each other whose heartbeat is fresh and, when it
/// runs on this host, whose process still exists.
fn live_owners(
    tx: &rusqlite::Transaction<'_>,
    me: &Owner,
    now: Millis,
) -> rusqlite::Result<BTreeSet<String>> {
    let mut q = tx.prepare("SELECT owner_id, hostname, pid, heartbeat_at FROM owners")?;
    let rows = q.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, u32>(2)?,
            r.get::<_, i64>(3)?,
        ))
    })?;
    let mut live = BTreeSet::new();
    live.insert(me.id.clone());
    for row in rows {
        let (id, host, pid, beat) = row?;
        let fresh = (beat.max(0) as Millis).saturating_add(me.ttl_ms) >= now;
        let gone = host == me.hostname && !pid_alive(pid);
        if fresh && !gone {
            live.insert(id);
        }
    }
    Ok(live)
}

/// The rows one owner holds in a slot table: key and record.
fn rows_of(
    tx: &rusqlite::Transaction<'_>,
    table: &str,
    owner: &str,
) -> rusqlite::Result<Vec<(Key, String)>> {
    let mut q = tx.prepare_cached(&format!(
        "SELECT issue_id, slot, record FROM {table} WHERE owner_id = ?1"
    ))?;
    let rows = q.query_map(params![owner], |r| {
        Ok((Key::new(r.get::<_, String>(0)?, r.get(1)?), r.get(2)?))
    })?;
    rows.collect()
}

/// The retry that replaces a run whose daemon died: the next attempt, soon.
fn retry_of_dead_run(run: &Running, owner: &str, now: Millis) -> Retry {
    let owner = if owner.is_empty() {
        "an earlier svc"
    } else {
        owner
    };
    Retry {
        issue: run.issue.clone(),
        slot_index: run.slot_index,
        ensemble_size: run.ensemble_size,
        attempt: run.attempt.unwrap_or(0).saturating_add(1),
        due_at: now + TAKEOVER_DELAY_MS,
        error: Some(format!(
            "taken over: its run {} ended with daemon {owner}",
            run.run_id
        )),
        kind: RetryKind::Failure,
        workspace_path: run.workspace_path.clone(),
        fetching: false,
        worker_id: run.worker_id.clone(),
        worker_host: run.worker_host.clone(),
        ssh: run.ssh.clone(),
    }
}

/// A persisted record as one JSON line.
fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// What the store thread reports.
#[derive(Debug)]
pub enum Written {
    Ok {
        ops: usize,
        last: &'static str,
        at: Millis,
    },
    Failed(String),
    /// A sweep found other owners' slots changed, or took something over.
    Swept(Sweep),
}

/// The run threads' side of the store: their own connection, one claim at a time.
pub struct Gate {
    store: std::sync::Mutex<Store>,
}

impl Gate {
    pub fn open(path: &Path, owner: Owner) -> Result<Gate, String> {
        Ok(Gate {
            store: std::sync::Mutex::new(Store::open(path, owner)?),
        })
    }

    /// Claims a slot for a run about to start (see [`Store::acquire`]).
    pub fn acquire(&self, key: &Key, run: &Running) -> Result<(), Claim> {
        let now = crate::time::unix_ms();
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .acquire(key, run, now)
    }
}

/// Starts the store thread: batches in, one transaction each; a heartbeat and sweep every
/// second; results back through `report`. Closing the sender ends it (after the last batch,
/// and unregistering this owner).
pub fn start_writer(
    mut store: Store,
    mut foreign: BTreeSet<Key>,
    report: impl Fn(Written) + Send + 'static,
) -> Sender<Vec<Op>> {
    let (tx, rx): (Sender<Vec<Op>>, Receiver<Vec<Op>>) = unbounded();
    let _ = std::thread::Builder::new()
        .name("claim-store".into())
        .spawn(move || {
            let mut pending: Vec<Op> = Vec::new();
            let mut last_sweep = std::time::Instant::now();
            loop {
                let wait = HEARTBEAT.saturating_sub(last_sweep.elapsed());
                let next = match rx.recv_timeout(wait) {
                    Ok(batch) => Some(batch),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => Some(Vec::new()),
                    Err(_) => None,
                };
                let Some(batch) = next else {
                    if !pending.is_empty() {
                        let _ = store.apply(&pending);
                    }
                    let _ = store.unregister();
                    return;
                };
                pending.extend(batch);
                while let Ok(more) = rx.try_recv() {
                    pending.extend(more);
                }
                if !pending.is_empty() {
                    match store.apply(&pending) {
                        Ok(()) => {
                            let last = pending.last().map_or("none", Op::name);
                            report(Written::Ok {
                                ops: pending.len(),
                                last,
                                at: crate::time::unix_ms(),
                            });
                            pending.clear();
                        }
                        // Kept and tried again: nothing is dropped while the file is locked.
                        Err(e) => report(Written::Failed(e)),
                    }
                }
                if last_sweep.elapsed() >= HEARTBEAT {
                    last_sweep = std::time::Instant::now();
                    match store.sweep(crate::time::unix_ms()) {
                        Ok(sweep) => {
                            if sweep.foreign != foreign || !sweep.taken_over.is_empty() {
                                foreign.clone_from(&sweep.foreign);
                                report(Written::Swept(sweep));
                            }
                        }
                        Err(e) => report(Written::Failed(e)),
                    }
                }
            }
        });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::state::{Outcome, Tokens};
    use crate::orchestrator::testutil::issue;
    use std::collections::BTreeMap;

    fn running(id: &str) -> Running {
        Running {
            run_id: format!("run-{id}"),
            issue: issue(id, "Todo", &[]),
            attempt: Some(2),
            slot_index: 0,
            ensemble_size: 1,
            agent_kind: "demo".into(),
            workspace_path: PathBuf::from("/w").join(id),
            started_at: 5,
            last_event_at: 6,
            last_event: None,
            last_message: None,
            session_id: None,
            turn_count: 1,
            pid: None,
            tokens: Tokens::default(),
            stall_timeout_ms: 0,
            stopping: None,
            reserving: false,
            worker_id: Some("w-1".into()),
            worker_host: None,
            ssh: None,
            steering_turns: 0,
            last_steering: None,
            steering_pending: Vec::new(),
        }
    }

    fn owner(id: &str) -> Owner {
        Owner {
            id: id.into(),
            hostname: "test-host".into(),
            pid: std::process::id(),
            ttl_ms: 1000,
        }
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("svc-claims-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn key(id: &str) -> Key {
        Key::new(id, 0)
    }

    #[test]
    fn what_a_stopped_daemon_left_is_taken_over_by_the_next() {
        let dir = temp("reopen");
        let path = dir.join("c.db");
        let mut s = Store::open(&path, owner("one")).unwrap();
        s.sweep(100).unwrap();
        let retry = Retry {
            issue: issue("A-1", "Todo", &[]),
            slot_index: 0,
            ensemble_size: 1,
            attempt: 3,
            due_at: 123_456,
            error: Some("boom".into()),
            kind: RetryKind::Failure,
            workspace_path: "/w/A-1".into(),
            fetching: true,
            worker_id: Some("w-2".into()),
            worker_host: Some("h".into()),
            ssh: None,
        };
        s.apply(&[
            Op::PutRetry(key("id-A-1"), Box::new(retry)),
            Op::PutClaim(key("id-B-1"), Box::new(running("B-1"))),
            Op::PutRun(Box::new(RunRecord {
                run: running("C-1"),
                outcome: Outcome::Failed,
                failure_reason: Some("x".into()),
                ended_at: 9,
            })),
        ])
        .unwrap();
        s.unregister().unwrap();
        drop(s);
        let mut s = Store::open(&path, owner("two")).unwrap();
        let h = s.hydrate(50, 200).unwrap();
        let taken: BTreeMap<Key, Retry> = h.sweep.taken_over.into_iter().collect();
        let r = &taken[&key("id-A-1")];
        assert_eq!(
            (r.attempt, r.due_at, r.error.as_deref()),
            (3, 123_456, Some("boom"))
        );
        assert!(!r.fetching, "a fetch in flight is not one after a restart");
        let b = &taken[&key("id-B-1")];
        assert_eq!((b.attempt, b.due_at), (3, 200 + TAKEOVER_DELAY_MS));
        assert!(
            b.error
                .as_deref()
                .unwrap()
                .contains("run-B-1 ended with daemon one")
        );
        assert_eq!(h.history[0].run.issue.identifier, "C-1");
        assert!(h.sweep.foreign.is_empty());
        // Taken over once: the retries are this owner's now, and a third sees them as foreign.
        assert!(s.sweep(300).unwrap().taken_over.is_empty());
        let mut third = Store::open(&path, owner("three")).unwrap();
        let seen = third.sweep(300).unwrap();
        assert!(seen.taken_over.is_empty());
        assert_eq!(seen.foreign.len(), 2);
        std::fs::write(
            dir.join("bad.db"),
            "this is not a database at all, not even close",
        )
        .unwrap();
        assert!(
            Store::open(&dir.join("bad.db"), owner("x"))
                .and_then(|mut s| s.hydrate(1, 1))
                .is_err()
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_slot_held_by_a_live_owner_is_refused_and_one_of_an_expired_owner_is_granted() {
        let dir = temp("acquire");
        let path = dir.join("c.db");
        let mut a = Store::open(&path, owner("a")).unwrap();
        let mut b = Store::open(&path, owner("b")).unwrap();
        a.sweep(1000).unwrap();
        b.sweep(1000).unwrap();
        a.acquire(&key("id-X"), &running("X"), 1000).unwrap();
        assert_eq!(
            b.acquire(&key("id-X"), &running("X"), 1001),
            Err(Claim::Held("a".into()))
        );
        // Another slot of the same issue is free.
        b.acquire(&Key::new("id-X", 1), &running("X"), 1001)
            .unwrap();
        assert!(b.sweep(1002).unwrap().foreign.contains(&key("id-X")));
        // Once a's heartbeat is older than the ttl, b takes its run over as a retry.
        let swept = b.sweep(2500).unwrap();
        assert!(swept.foreign.is_empty(), "{swept:?}");
        assert_eq!(swept.taken_over.len(), 1);
        assert_eq!(swept.taken_over[0].0, key("id-X"));
        // a, back from its pause, finds the slot another's.
        assert!(a.sweep(2600).unwrap().foreign.contains(&key("id-X")));
        // A claim of a dead owner does not stop a run: it is dropped.
        let mut c = Store::open(&path, owner("c")).unwrap();
        c.acquire(&key("id-Y"), &running("Y"), 3000).unwrap();
        c.unregister().unwrap();
        a.acquire(&key("id-Y"), &running("Y"), 3001).unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn daemons_opening_a_new_store_at_the_same_moment_all_get_it() {
        let dir = temp("race");
        for round in 0..10 {
            let path = dir.join(format!("c{round}.db"));
            let opened: Vec<Result<(), String>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..4)
                    .map(|n| {
                        let path = path.clone();
                        scope.spawn(move || {
                            let mut s = Store::open(&path, owner(&format!("o{n}")))?;
                            s.hydrate(50, 1).map(drop)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(opened.iter().all(Result::is_ok), "{opened:?}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn rows_of_the_first_layout_are_migrated_and_taken_over() {
        let dir = temp("migrate");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE claims (issue_id TEXT PRIMARY KEY, owner_id TEXT NOT NULL, record TEXT NOT NULL);
             CREATE TABLE retries (issue_id TEXT PRIMARY KEY, record TEXT NOT NULL);",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO claims VALUES ('id-Z', 'old', ?1)",
            params![to_json(&running("Z"))],
        )
        .unwrap();
        drop(conn);
        let mut s = Store::open(&path, owner("new")).unwrap();
        let h = s.hydrate(50, 10).unwrap();
        assert_eq!(h.sweep.taken_over[0].0, key("id-Z"));
        assert_eq!(h.sweep.taken_over[0].1.attempt, 3);
        let _ = std::fs::remove_dir_all(dir);
    }
}
