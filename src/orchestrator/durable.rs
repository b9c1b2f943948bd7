//! The durable claim store: SQLite (bundled, WAL) beside the daemon's lock file
//! (`~/.svc/daemon/<workflow>-<hash>.claims.db`), on by default. It keeps what a crash must not
//! lose: the runs in flight (claims: issue, run, attempt, owner), the pending retries (attempt,
//! due time, error, worker host) and the finished runs (the last 50 are the API's history).
//!
//! The state thread never waits on it: after each batch of events it diffs the state against
//! what it last persisted and hands the changes, as one transaction, to a writer thread. At
//! start the store is read back: history and retries as they were, and the claims of a daemon
//! that died become retries (its runs are gone; the issues are retried, not lost).
//! `SVC_CLAIM_STORE` names another file, or `memory` for the in-memory store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, unbounded};
use rusqlite::{Connection, params};

use super::state::{IssueId, Millis, Retry, RunRecord, Running};

/// One change, applied in a transaction with the others of its batch.
#[derive(Debug)]
pub enum Op {
    PutRun(Box<RunRecord>),
    PutRetry(IssueId, Box<Retry>),
    DeleteRetry(IssueId),
    PutClaim(IssueId, Box<Running>),
    DeleteClaim(IssueId),
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::PutRun(_) => "put_run",
            Op::PutRetry(..) => "put_retry",
            Op::DeleteRetry(_) => "delete_retry",
            Op::PutClaim(..) => "put_claim",
            Op::DeleteClaim(_) => "delete_claim",
        }
    }
}

/// What the store held at start.
#[derive(Debug, Default)]
pub struct Hydrated {
    /// Newest first, at most `limit`.
    pub history: Vec<RunRecord>,
    pub retries: BTreeMap<IssueId, Retry>,
    /// Runs in flight when the last daemon ended (with the owner that held them).
    pub claims: Vec<(String, Running)>,
}

pub struct Store {
    conn: Connection,
    pub path: PathBuf,
}

impl Store {
    /// Opens (or creates) the store; a file that is not a claim store, or is locked, is an
    /// error naming it.
    pub fn open(path: &Path) -> Result<Store, String> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let fail = |e: rusqlite::Error| format!("claim store {}: {e}", path.display());
        let conn = Connection::open(path).map_err(fail)?;
        conn.busy_timeout(Duration::from_secs(2)).map_err(fail)?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, ended_at INTEGER NOT NULL, record TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS runs_by_end ON runs (ended_at);
             CREATE TABLE IF NOT EXISTS retries (issue_id TEXT PRIMARY KEY, record TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS claims (issue_id TEXT PRIMARY KEY, owner_id TEXT NOT NULL, record TEXT NOT NULL);",
        )
        .map_err(fail)?;
        Ok(Store {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// Reads back the last `limit` runs, the retries and the claims.
    pub fn load(&self, limit: usize) -> Result<Hydrated, String> {
        let fail = |e: rusqlite::Error| format!("claim store {}: {e}", self.path.display());
        let mut out = Hydrated::default();
        let mut q = self
            .conn
            .prepare("SELECT record FROM runs ORDER BY ended_at DESC, run_id DESC LIMIT ?1")
            .map_err(fail)?;
        for row in q
            .query_map(params![limit as i64], |r| r.get::<_, String>(0))
            .map_err(fail)?
        {
            if let Ok(record) = serde_json::from_str::<RunRecord>(&row.map_err(fail)?) {
                out.history.push(record);
            }
        }
        let mut q = self
            .conn
            .prepare("SELECT issue_id, record FROM retries")
            .map_err(fail)?;
        for row in q
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(fail)?
        {
            let (id, json) = row.map_err(fail)?;
            if let Ok(mut retry) = serde_json::from_str::<Retry>(&json) {
                retry.fetching = false;
                out.retries.insert(id, retry);
            }
        }
        let mut q = self
            .conn
            .prepare("SELECT owner_id, record FROM claims")
            .map_err(fail)?;
        for row in q
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(fail)?
        {
            let (owner, json) = row.map_err(fail)?;
            if let Ok(run) = serde_json::from_str::<Running>(&json) {
                out.claims.push((owner, run));
            }
        }
        Ok(out)
    }

    /// Applies a batch in one transaction; the history keeps its last 1,000 runs.
    pub fn apply(&mut self, owner: &str, ops: &[Op]) -> Result<(), String> {
        let path = self.path.display().to_string();
        let fail = |e: rusqlite::Error| format!("claim store {path}: {e}");
        let tx = self.conn.transaction().map_err(fail)?;
        for op in ops {
            match op {
                Op::PutRun(r) => tx.execute(
                    "INSERT OR REPLACE INTO runs (run_id, ended_at, record) VALUES (?1, ?2, ?3)",
                    params![r.run.run_id, r.ended_at as i64, to_json(r.as_ref())],
                ),
                Op::PutRetry(id, r) => tx.execute(
                    "INSERT OR REPLACE INTO retries (issue_id, record) VALUES (?1, ?2)",
                    params![id, to_json(r.as_ref())],
                ),
                Op::DeleteRetry(id) => tx.execute("DELETE FROM retries WHERE issue_id = ?1", params![id]),
                Op::PutClaim(id, r) => tx.execute(
                    "INSERT OR REPLACE INTO claims (issue_id, owner_id, record) VALUES (?1, ?2, ?3)",
                    params![id, owner, to_json(r.as_ref())],
                ),
                Op::DeleteClaim(id) => tx.execute("DELETE FROM claims WHERE issue_id = ?1", params![id]),
            }
            .map_err(fail)?;
        }
        if ops.iter().any(|o| matches!(o, Op::PutRun(_))) {
            tx.execute(
                "DELETE FROM runs WHERE run_id NOT IN (SELECT run_id FROM runs ORDER BY ended_at DESC LIMIT 1000)",
                [],
            )
            .map_err(fail)?;
        }
        tx.commit().map_err(fail)
    }
}

/// A persisted record as one JSON line.
fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// What the writer reports after each batch.
#[derive(Debug)]
pub enum Written {
    Ok {
        ops: usize,
        last: &'static str,
        at: Millis,
    },
    Failed(String),
}

/// Starts the writer thread: batches in, one transaction each; results back through `report`.
pub fn start_writer(
    mut store: Store,
    owner: String,
    report: impl Fn(Written) + Send + 'static,
) -> Sender<Vec<Op>> {
    let (tx, rx): (Sender<Vec<Op>>, Receiver<Vec<Op>>) = unbounded();
    let _ = std::thread::Builder::new()
        .name("claim-store".into())
        .spawn(move || {
            let mut pending: Vec<Op> = Vec::new();
            loop {
                // Wait for work; while a write is failing, try again every second.
                let next = if pending.is_empty() {
                    rx.recv().ok()
                } else {
                    match rx.recv_timeout(Duration::from_secs(1)) {
                        Ok(batch) => Some(batch),
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => Some(Vec::new()),
                        Err(_) => None,
                    }
                };
                let Some(batch) = next else {
                    if !pending.is_empty() {
                        let _ = store.apply(&owner, &pending);
                    }
                    return;
                };
                pending.extend(batch);
                while let Ok(more) = rx.try_recv() {
                    pending.extend(more);
                }
                if pending.is_empty() {
                    continue;
                }
                match store.apply(&owner, &pending) {
                    Ok(()) => {
                        let last = pending.last().map_or("none", Op::name);
                        report(Written::Ok {
                            ops: pending.len(),
                            last,
                            at: super::snapshot::unix_ms(),
                        });
                        pending.clear();
                    }
                    // Kept and tried again: nothing is dropped while the file is locked.
                    Err(e) => report(Written::Failed(e)),
                }
            }
        });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::state::{Outcome, RetryKind, Tokens};
    use crate::orchestrator::testutil::issue;

    fn running(id: &str) -> Running {
        Running {
            run_id: format!("run-{id}"),
            issue: issue(id, "Todo", &[]),
            attempt: Some(2),
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
        }
    }

    #[test]
    fn what_is_written_is_read_back_after_a_reopen() {
        let dir = std::env::temp_dir().join(format!("svc-claims-{}", std::process::id()));
        let path = dir.join("c.db");
        let mut s = Store::open(&path).unwrap();
        let retry = Retry {
            issue: issue("A-1", "Todo", &[]),
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
        s.apply(
            "owner-1",
            &[
                Op::PutRetry("id-A-1".into(), Box::new(retry)),
                Op::PutClaim("id-B-1".into(), Box::new(running("B-1"))),
                Op::PutRun(Box::new(RunRecord {
                    run: running("C-1"),
                    outcome: Outcome::Failed,
                    failure_reason: Some("x".into()),
                    ended_at: 9,
                })),
            ],
        )
        .unwrap();
        drop(s);
        let s = Store::open(&path).unwrap();
        let h = s.load(50).unwrap();
        let r = &h.retries["id-A-1"];
        assert_eq!(
            (r.attempt, r.due_at, r.error.as_deref()),
            (3, 123_456, Some("boom"))
        );
        assert!(!r.fetching, "a fetch in flight is not one after a restart");
        assert_eq!(h.claims[0].0, "owner-1");
        assert_eq!(h.claims[0].1.issue.identifier, "B-1");
        assert_eq!(h.history[0].run.issue.identifier, "C-1");
        std::fs::write(
            dir.join("bad.db"),
            "this is not a database at all, not even close",
        )
        .unwrap();
        assert!(
            Store::open(&dir.join("bad.db"))
                .and_then(|s| s.load(1))
                .is_err()
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
