//! The `sqlite` kind of claim store: SQLite (bundled, WAL) beside the daemon's lock file
//! (`~/.svc/daemon/<workflow>-<hash>.claims.db`), on by default; `SVC_CLAIM_STORE` names
//! another file. Daemons that share the file (two on one workflow, or several hosts on one
//! local file system) are kept apart by its exclusive transactions (see the module above).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::{
    Capabilities, Claim, ClaimStore, HISTORY_KEPT, Hydrated, Kind, MAX_TAKEN_DUE_MS, Op, Owner,
    Sweep, pid_alive, retry_of_dead_run,
};
use crate::orchestrator::state::{Key, Millis, Retry, RunRecord, Running};

/// Survives the daemon, and daemons may share it.
pub static KIND: Kind = Kind {
    name: "sqlite",
    capabilities: Capabilities {
        crash_recovery: true,
        // Runs claim their slot in one exclusive transaction (`Gate`).
        shared_across_processes: true,
        retry_durability: true,
    },
    leadership: "lock_file",
};

/// One connection to the file, as one owner.
pub struct Sqlite {
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

impl Sqlite {
    /// Opens (or creates) the store as `owner`; a file that is not a claim store, or is locked,
    /// is an error naming it.
    pub fn open(path: &Path, owner: Owner) -> Result<Sqlite, String> {
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
        let mut store = Sqlite {
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
}

impl ClaimStore for Sqlite {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn reopen(&self) -> Result<Box<dyn ClaimStore>, String> {
        Ok(Box::new(Sqlite::open(&self.path, self.owner.clone())?))
    }

    /// Reads back the last `limit` finished runs, newest first.
    fn history(&self, limit: usize) -> Result<Vec<RunRecord>, String> {
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
    fn hydrate(&mut self, limit: usize, now: Millis) -> Result<Hydrated, String> {
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
    fn sweep(&mut self, now: Millis) -> Result<Sweep, String> {
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
    fn acquire(&mut self, key: &Key, run: &Running, now: Millis) -> Result<(), Claim> {
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
    fn apply(&mut self, ops: &[Op]) -> Result<(), String> {
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
                "DELETE FROM runs WHERE run_id NOT IN (SELECT run_id FROM runs ORDER BY ended_at DESC LIMIT ?1)",
                params![HISTORY_KEPT as i64],
            )
            .map_err(&fail)?;
        }
        tx.commit().map_err(&fail)
    }

    /// A clean stop: this daemon is no owner any more, so the next sweep of any daemon (or the
    /// next start) takes its retries over at once.
    fn unregister(&mut self) -> Result<(), String> {
        self.conn
            .execute(
                "DELETE FROM owners WHERE owner_id = ?1",
                params![self.owner.id],
            )
            .map(drop)
            .map_err(fail(&self.path))
    }
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

/// A persisted record as one JSON line.
fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::store::tests::{key, owner, running};

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("svc-claims-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_file_that_is_no_claim_store_is_an_error() {
        let dir = temp("bad");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("bad.db"),
            "this is not a database at all, not even close",
        )
        .unwrap();
        assert!(
            Sqlite::open(&dir.join("bad.db"), owner("x"))
                .and_then(|mut s| s.hydrate(1, 1))
                .is_err()
        );
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
                            let mut s = Sqlite::open(&path, owner(&format!("o{n}")))?;
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
        let mut s = Sqlite::open(&path, owner("new")).unwrap();
        let h = s.hydrate(50, 10).unwrap();
        assert_eq!(h.sweep.taken_over[0].0, key("id-Z"));
        assert_eq!(h.sweep.taken_over[0].1.attempt, 3);
        let _ = std::fs::remove_dir_all(dir);
    }
}
