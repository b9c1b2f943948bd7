//! The `sqlite` kind of claim store: SQLite (bundled, WAL) beside the daemon's lock file
//! (`~/.svc/daemon/<workflow>-<hash>.claims.db`), on by default; `SVC_CLAIM_STORE` names
//! another file. Daemons that share the file (two on one workflow, or several hosts on one
//! local file system) are kept apart by its exclusive transactions (see the module above).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::sweep::{self, Taken};
use super::{
    Capabilities, Claim, ClaimStore, CooldownRow, HISTORY_KEPT, Hydrated, Kind, Op, Owner,
    STALE_SHOWN_MS, StoreError, Sweep,
};
use crate::orchestrator::protocol::{
    Holder, Key, LedgerRow, Relay, Retry, RunRecord, Running, Spent,
};
use crate::steering::Message;
use crate::time::Millis;

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
    /// The newest finished run written that this daemon has seen (by rowid, the order rows
    /// were written, not by when runs ended): a sweep brings the fleet's runs written since.
    last_run_seq: i64,
    /// The newest change of the ledger seen (other daemons' lines changed since come with the
    /// next sweep; writes are serialized, so numbers are committed in order).
    ledger_seen: i64,
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
     CREATE TABLE IF NOT EXISTS owner_cursors (owner_id TEXT NOT NULL, source TEXT NOT NULL, cursor TEXT NOT NULL, PRIMARY KEY (owner_id, source));
     CREATE TABLE IF NOT EXISTS relay (id INTEGER PRIMARY KEY AUTOINCREMENT, to_owner TEXT NOT NULL, record TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS revoked (token INTEGER PRIMARY KEY);
     CREATE TABLE IF NOT EXISTS released (issue_id TEXT NOT NULL, slot INTEGER NOT NULL, owner_id TEXT NOT NULL, released_at INTEGER NOT NULL, PRIMARY KEY (issue_id, slot));
     CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
     INSERT OR IGNORE INTO counters (name, value) VALUES ('fence', 0);
     CREATE TABLE IF NOT EXISTS tallies (name TEXT PRIMARY KEY, value REAL NOT NULL);
     CREATE TABLE IF NOT EXISTS marks (scope TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (scope, key));
     CREATE TABLE IF NOT EXISTS ledger (name TEXT NOT NULL, owner_id TEXT NOT NULL, input INTEGER NOT NULL DEFAULT 0, output INTEGER NOT NULL DEFAULT 0, total INTEGER NOT NULL DEFAULT 0, cost REAL NOT NULL DEFAULT 0, runs INTEGER NOT NULL DEFAULT 0, seq INTEGER NOT NULL, PRIMARY KEY (name, owner_id));
     CREATE INDEX IF NOT EXISTS ledger_by_seq ON ledger (seq);
     INSERT OR IGNORE INTO counters (name, value) VALUES ('ledger', 0);
     CREATE TABLE IF NOT EXISTS cooldowns (scope TEXT NOT NULL, kind TEXT NOT NULL, until_ms INTEGER NOT NULL, since_ms INTEGER NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (scope, kind));";

/// Columns added to tables of earlier stores (table, column, definition).
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("owners", "workflow", "TEXT NOT NULL DEFAULT ''"),
    ("owners", "url", "TEXT"),
    ("owners", "started_at", "INTEGER NOT NULL DEFAULT 0"),
    ("owners", "running", "INTEGER NOT NULL DEFAULT 0"),
    ("slot_claims", "token", "INTEGER NOT NULL DEFAULT 0"),
    ("slot_retries", "token", "INTEGER"),
    // Who holds a waiting message: the daemon that holds its issue ('' = nobody, taken over
    // by the next sweep).
    ("steering", "owner_id", "TEXT NOT NULL DEFAULT ''"),
];

/// How long a slot's release is remembered (longer than any poll interval).
const RELEASED_KEPT_MS: i64 = 60 * 60 * 1000;

/// How many revoked fencing tokens are remembered (the newest).
const REVOKED_KEPT: i64 = 10_000;

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
            last_run_seq: 0,
            ledger_seen: 0,
        };
        store.migrate()?;
        Ok(store)
    }

    /// Moves the rows of the first store layout (one claim per issue) into the slot tables,
    /// owned by nobody, so the next sweep takes them over.
    fn migrate(&mut self) -> Result<(), String> {
        for (table, column, definition) in ADDED_COLUMNS {
            let has: i64 = self
                .conn
                .query_row(
                    &format!("SELECT count(*) FROM pragma_table_info('{table}') WHERE name = ?1"),
                    params![column],
                    |r| r.get(0),
                )
                .map_err(fail(&self.path))?;
            if has == 0 {
                let added = self.conn.execute_batch(&format!(
                    "ALTER TABLE {table} ADD COLUMN {column} {definition}"
                ));
                // Another daemon opening the same store may have added it first.
                if let Err(e) = added
                    && !e.to_string().contains("duplicate column")
                {
                    return Err(fail(&self.path)(e));
                }
            }
        }
        // The cursors of the store layout before owners held them: nobody's now, so the next
        // sweep hands them to a live daemon.
        let cursors: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'steering_cursors'",
                [],
                |r| r.get(0),
            )
            .map_err(fail(&self.path))?;
        if cursors == 1 {
            self.conn
                .execute_batch(
                    "BEGIN IMMEDIATE;
                     INSERT OR IGNORE INTO owner_cursors (owner_id, source, cursor) SELECT '', source, cursor FROM steering_cursors;
                     DROP TABLE steering_cursors;
                     COMMIT;",
                )
                .map_err(fail(&self.path))?;
        }
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
                 INSERT OR IGNORE INTO slot_claims (issue_id, slot, owner_id, run_id, record) SELECT issue_id, 0, '', '', record FROM claims;
                 INSERT OR IGNORE INTO slot_retries (issue_id, slot, owner_id, record) SELECT issue_id, 0, '', record FROM retries;
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

    fn reopen(&self) -> Result<Box<dyn ClaimStore>, StoreError> {
        Ok(Box::new(Sqlite::open(&self.path, self.owner.clone())?))
    }

    /// Reads back the last `limit` finished runs, newest first.
    fn history(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
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

    /// Opens the store, makes the first sweep (which registers this daemon as an owner and
    /// takes over what dead ones left) and reads back the history and this daemon's steering.
    fn hydrate(&mut self, limit: usize, now: Millis) -> Result<Hydrated, StoreError> {
        let mut sweep = self.sweep(now)?;
        // What the sweep took over is read back below with the rest of this daemon's.
        sweep.steering.clear();
        sweep.cursors.clear();
        sweep.runs.clear();
        let path = self.path.clone();
        let fail = fail(&path);
        let me = self.owner.id.clone();
        let column = |sql: &str| -> Result<Vec<(String, String)>, StoreError> {
            let mut q = self.conn.prepare(sql).map_err(&fail)?;
            let rows = q
                .query_map(params![me], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(&fail)?;
            Ok(rows.collect::<Result<Vec<_>, _>>().map_err(&fail)?)
        };
        let steering =
            column("SELECT key, record FROM steering WHERE owner_id = ?1 ORDER BY rowid")?
                .into_iter()
                .filter_map(|(_, record)| serde_json::from_str(&record).ok())
                .collect();
        // Taken keys are the fleet's (every daemon's, so none delivers one twice).
        let steering_seen: Vec<String> = self
            .conn
            .prepare("SELECT key FROM steering_seen ORDER BY rowid")
            .and_then(|mut q| q.query_map([], |r| r.get(0))?.collect())
            .map_err(&fail)?;
        let steering_cursors =
            column("SELECT source, cursor FROM owner_cursors WHERE owner_id = ?1")?
                .into_iter()
                .collect();
        let history = self.history(limit)?;
        self.last_run_seq = self
            .conn
            .query_row("SELECT coalesce(max(rowid), 0) FROM runs", [], |r| r.get(0))
            .map_err(&fail)?;
        Ok(Hydrated {
            history,
            sweep,
            steering,
            steering_seen,
            steering_cursors,
        })
    }

    /// Heartbeats, takes over what dead owners held (claims and retries, waiting steering,
    /// cursors, requests relayed to them), takes the requests relayed to this daemon, and
    /// lists what live owners hold and the fleet: one exclusive transaction.
    fn sweep(&mut self, now: Millis) -> Result<Sweep, StoreError> {
        let path = self.path.clone();
        let fail = fail(&path);
        let me = self.owner.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&fail)?;
        tx.execute(
            "INSERT INTO owners (owner_id, hostname, pid, heartbeat_at, workflow, url, started_at, running)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, (SELECT count(*) FROM slot_claims WHERE owner_id = ?1))
             ON CONFLICT(owner_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, running = excluded.running",
            params![me.id, me.hostname, me.pid, now as i64, me.workflow, me.url, me.started_at as i64],
        )
        .map_err(&fail)?;
        let live = live_owners(&tx, &me, now).map_err(&fail)?;
        let holders: Vec<String> = tx
            .prepare_cached(
                "SELECT owner_id FROM slot_claims UNION SELECT owner_id FROM slot_retries
                 UNION SELECT owner_id FROM steering UNION SELECT owner_id FROM owner_cursors
                 UNION SELECT to_owner FROM relay",
            )
            .and_then(|mut q| q.query_map([], |r| r.get(0))?.collect())
            .map_err(&fail)?;
        let mut out = Sweep::default();
        let mut rows = Rows { tx: &tx, me: &me };
        for dead in holders.iter().filter(|o| !live.contains(*o)) {
            sweep::take_over(&mut rows, dead, now, &mut out).map_err(&fail)?;
        }
        sweep::take_relayed(&mut rows, &mut out).map_err(&fail)?;
        // What other live owners hold now.
        for table in ["slot_claims", "slot_retries"] {
            let mut q = tx
                .prepare_cached(&format!(
                    "SELECT issue_id, slot, owner_id, coalesce(json_extract(record, '$.issue.identifier'), '')
                     FROM {table} WHERE owner_id != ?1"
                ))
                .map_err(&fail)?;
            let rows = q
                .query_map(params![me.id], |r| {
                    Ok((
                        Key::new(r.get::<_, String>(0)?, r.get(1)?),
                        Holder {
                            owner: r.get(2)?,
                            identifier: r.get(3)?,
                        },
                    ))
                })
                .map_err(&fail)?;
            for row in rows {
                let (key, holder) = row.map_err(&fail)?;
                out.foreign.insert(key, holder);
            }
        }
        // The dead are shown stale for a while, then forgotten; their rows are this daemon's.
        let mut fleet = Vec::new();
        {
            let mut q = tx
                .prepare_cached(
                    "SELECT owner_id, hostname, pid, workflow, url, started_at, running, heartbeat_at FROM owners ORDER BY started_at, owner_id",
                )
                .map_err(&fail)?;
            let rows = q
                .query_map([], |r| {
                    let member = Owner {
                        id: r.get(0)?,
                        hostname: r.get(1)?,
                        pid: r.get(2)?,
                        ttl_ms: 0,
                        workflow: r.get(3)?,
                        url: r.get(4)?,
                        started_at: r.get::<_, i64>(5)?.max(0) as Millis,
                    };
                    Ok((member, r.get::<_, i64>(6)?, r.get::<_, i64>(7)?))
                })
                .map_err(&fail)?;
            for row in rows {
                let (member, running, beat) = row.map_err(&fail)?;
                let stale = !live.contains(&member.id);
                let forgotten =
                    (beat.max(0) as Millis).saturating_add(me.ttl_ms.max(STALE_SHOWN_MS)) < now;
                if !forgotten {
                    fleet.push(member.member(u32::try_from(running).unwrap_or(0), stale));
                }
            }
        }
        out.fleet = Some(fleet);
        // The fleet's runs written since the last sweep (newest first).
        let mut newest_seq = self.last_run_seq;
        {
            let mut q = tx
                .prepare_cached(
                    "SELECT record, rowid FROM runs WHERE rowid > ?1 ORDER BY rowid DESC LIMIT 50",
                )
                .map_err(&fail)?;
            let rows = q
                .query_map(params![self.last_run_seq], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
                })
                .map_err(&fail)?;
            for row in rows {
                let (record, seq) = row.map_err(&fail)?;
                newest_seq = newest_seq.max(seq);
                if let Ok(r) = serde_json::from_str::<RunRecord>(&record) {
                    out.runs.push(r);
                }
            }
        }
        // Other daemons' ledger lines changed since the last sweep.
        let mut newest_spend = self.ledger_seen;
        {
            let mut q = tx
                .prepare_cached(
                    "SELECT name, owner_id, input, output, total, cost, runs, seq FROM ledger
                     WHERE seq > ?1 AND owner_id != ?2",
                )
                .map_err(&fail)?;
            let rows = q
                .query_map(params![self.ledger_seen, me.id], |r| {
                    Ok((ledger_row(r)?, r.get::<_, i64>(7)?))
                })
                .map_err(&fail)?;
            for row in rows {
                let (line, seq) = row.map_err(&fail)?;
                newest_spend = newest_spend.max(seq);
                out.ledger.push(line);
            }
        }
        // The cooldowns in force this daemon shares: the fleet's, and its own host's.
        {
            let mut q = tx
                .prepare_cached(
                    "SELECT scope, kind, until_ms, since_ms, reason FROM cooldowns
                     WHERE until_ms > ?1 AND (scope = 'fleet' OR scope = 'host:' || ?2)
                     ORDER BY kind, scope",
                )
                .map_err(&fail)?;
            let rows = q
                .query_map(params![now as i64, me.hostname], cooldown_row)
                .map_err(&fail)?;
            for row in rows {
                out.cooldowns
                    .extend(row.map_err(&fail)?.shared(&me.hostname));
            }
        }
        tx.execute(
            "DELETE FROM owners WHERE heartbeat_at < ?1",
            params![now.saturating_sub(me.ttl_ms.max(STALE_SHOWN_MS)) as i64],
        )
        .map_err(&fail)?;
        tx.commit().map_err(&fail)?;
        self.last_run_seq = newest_seq;
        self.ledger_seen = newest_spend;
        Ok(out)
    }

    /// Claims `key` for run `run` in one exclusive transaction: granted with a new fencing
    /// token unless another live daemon holds the slot (running or retrying); what a dead one
    /// held is dropped and its token revoked.
    fn acquire(
        &mut self,
        key: &Key,
        run: &Running,
        now: Millis,
        seen_at: Millis,
    ) -> Result<u64, Claim> {
        let path = self.path.clone();
        let fail = |e: rusqlite::Error| {
            Claim::Failed(format!("claim store {}: {e}", path.display()).into())
        };
        let me = self.owner.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        let live = live_owners(&tx, &me, now).map_err(fail)?;
        let superseded: Option<String> = tx
            .query_row(
                "SELECT owner_id FROM released WHERE issue_id = ?1 AND slot = ?2 AND owner_id != ?3 AND released_at > ?4",
                params![key.issue_id, key.slot, me.id, seen_at as i64],
                |r| r.get(0),
            )
            .optional()
            .map_err(fail)?;
        if let Some(owner) = superseded {
            return Err(Claim::Superseded(owner));
        }
        for table in ["slot_claims", "slot_retries"] {
            let holder: Option<(String, Option<i64>)> = tx
                .query_row(
                    &format!(
                        "SELECT owner_id, token FROM {table} WHERE issue_id = ?1 AND slot = ?2"
                    ),
                    params![key.issue_id, key.slot],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(fail)?;
            match holder {
                Some((owner, _)) if owner != me.id && live.contains(&owner) => {
                    return Err(Claim::Held(owner));
                }
                Some((owner, token)) if owner != me.id => {
                    revoke(&tx, token).map_err(fail)?;
                    tx.execute(
                        &format!("DELETE FROM {table} WHERE issue_id = ?1 AND slot = ?2"),
                        params![key.issue_id, key.slot],
                    )
                    .map_err(fail)?;
                }
                _ => {}
            }
        }
        let token: i64 = tx
            .query_row(
                "UPDATE counters SET value = value + 1 WHERE name = 'fence' RETURNING value",
                [],
                |r| r.get(0),
            )
            .map_err(fail)?;
        tx.execute(
            "INSERT OR REPLACE INTO slot_claims (issue_id, slot, owner_id, run_id, record, token) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![key.issue_id, key.slot, me.id, run.run_id, to_json(run), token],
        )
        .map_err(fail)?;
        tx.commit().map_err(fail)?;
        Ok(u64::try_from(token).unwrap_or(0))
    }

    /// Applies a batch in one transaction; the history keeps its last 1,000 runs.
    fn apply(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        let path = self.path.clone();
        let fail = fail(&path);
        let me = &self.owner.id;
        let tx = self.conn.transaction().map_err(&fail)?;
        for op in ops {
            match op {
                Op::PutCooldown(c) => {
                    put_cooldown(&tx, &CooldownRow::of(c, &self.owner.hostname))
                }
                Op::Fence(token) => {
                    if revoked(&tx, Some(*token)).map_err(&fail)? {
                        break;
                    }
                    Ok(0)
                }
                Op::PutRun(r) => {
                    if revoked(&tx, r.run.claim_token).map_err(&fail)? {
                        continue;
                    }
                    tx.execute(
                        "INSERT OR REPLACE INTO runs (run_id, ended_at, record) VALUES (?1, ?2, ?3)",
                        params![r.run.run_id, r.ended_at as i64, to_json(r.as_ref())],
                    )
                }
                Op::PutRetry(k, r) => {
                    if revoked(&tx, r.claim_token).map_err(&fail)? {
                        continue;
                    }
                    // Never on a slot another daemon runs (see the PostgreSQL store).
                    tx.execute(
                        "INSERT INTO slot_retries (issue_id, slot, owner_id, record, token)
                         SELECT ?1, ?2, ?3, ?4, ?5
                          WHERE NOT EXISTS (SELECT 1 FROM slot_claims WHERE issue_id = ?1 AND slot = ?2 AND owner_id <> ?3)
                         ON CONFLICT(issue_id, slot) DO UPDATE SET record = excluded.record, token = excluded.token
                         WHERE slot_retries.owner_id = excluded.owner_id",
                        params![k.issue_id, k.slot, me, to_json(r.as_ref()), r.claim_token.map(|t| t as i64)],
                    )
                }
                Op::DeleteRetry(k) => tx.execute(
                    "DELETE FROM slot_retries WHERE issue_id = ?1 AND slot = ?2 AND owner_id = ?3",
                    params![k.issue_id, k.slot, me],
                ),
                Op::PutClaim(k, r) => {
                    if revoked(&tx, r.claim_token).map_err(&fail)? {
                        continue;
                    }
                    tx.execute(
                        "INSERT INTO slot_claims (issue_id, slot, owner_id, run_id, record) VALUES (?1, ?2, ?3, ?4, ?5)
                         ON CONFLICT(issue_id, slot) DO UPDATE SET run_id = excluded.run_id, record = excluded.record
                         WHERE slot_claims.owner_id = excluded.owner_id",
                        params![k.issue_id, k.slot, me, r.run_id, to_json(r.as_ref())],
                    )
                }
                Op::DeleteClaim(k) => {
                    let gone = tx
                        .execute(
                            "DELETE FROM slot_claims WHERE issue_id = ?1 AND slot = ?2 AND owner_id = ?3",
                            params![k.issue_id, k.slot, me],
                        )
                        .map_err(&fail)?;
                    if gone == 0 {
                        continue;
                    }
                    // When it was let go, so a daemon that read the issue before then does
                    // not run it again.
                    let now = crate::time::unix_ms() as i64;
                    tx.execute(
                        "INSERT OR REPLACE INTO released (issue_id, slot, owner_id, released_at) VALUES (?1, ?2, ?3, ?4)",
                        params![k.issue_id, k.slot, me, now],
                    )
                    .map_err(&fail)?;
                    tx.execute(
                        "DELETE FROM released WHERE released_at < ?1",
                        params![now - RELEASED_KEPT_MS],
                    )
                }
                Op::PutSteer(m) => put_steer(&tx, me, m),
                Op::DeleteSteer(key) => tx.execute(
                    "DELETE FROM steering WHERE key = ?1 AND owner_id = ?2",
                    params![key, me],
                ),
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
                    "INSERT OR REPLACE INTO owner_cursors (owner_id, source, cursor) VALUES (?1, ?2, ?3)",
                    params![me, source, cursor],
                ),
                Op::Spend(name, spent) => add_spend(&tx, name, me, spent, true),
                Op::Relay(relay) => tx.execute(
                    "INSERT INTO relay (to_owner, record) VALUES (?1, ?2)",
                    params![relay.to_owner, to_json(relay.as_ref())],
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
        Ok(tx.commit().map_err(&fail)?)
    }

    /// A clean stop: this daemon is no owner any more, so the next sweep of any daemon (or the
    /// next start) takes its retries over at once.
    fn unregister(&mut self) -> Result<(), StoreError> {
        self.conn
            .execute(
                "DELETE FROM owners WHERE owner_id = ?1",
                params![self.owner.id],
            )
            .map(drop)
            .map_err(|e| fail(&self.path)(e).into())
    }

    fn add_tallies(&mut self, deltas: &[(String, f64)]) -> Result<Vec<f64>, StoreError> {
        let path = self.path.clone();
        let fail = fail(&path);
        let tx = self.conn.transaction().map_err(&fail)?;
        let mut totals = Vec::with_capacity(deltas.len());
        for (name, delta) in deltas {
            totals.push(
                tx.query_row(
                    "INSERT INTO tallies (name, value) VALUES (?1, ?2)
                     ON CONFLICT (name) DO UPDATE SET value = value + excluded.value
                     RETURNING value",
                    params![name, delta],
                    |row| row.get(0),
                )
                .map_err(&fail)?,
            );
        }
        tx.commit().map_err(&fail)?;
        Ok(totals)
    }

    fn tallies(&mut self, prefix: &str) -> Result<Vec<(String, f64)>, StoreError> {
        let fail = fail(&self.path);
        let mut q = self
            .conn
            .prepare_cached(
                "SELECT name, value FROM tallies WHERE substr(name, 1, ?2) = ?1 ORDER BY name",
            )
            .map_err(&fail)?;
        let rows = q
            .query_map(params![prefix, prefix.chars().count() as i64], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .map_err(&fail)?;
        Ok(rows.collect::<Result<_, _>>().map_err(&fail)?)
    }

    fn line_cost(&mut self, line: &str) -> Result<f64, StoreError> {
        self.conn
            .query_row(
                "SELECT coalesce(sum(cost), 0) FROM ledger WHERE name = ?1",
                params![line],
                |r| r.get(0),
            )
            .map_err(|e| fail(&self.path)(e).into())
    }

    fn mark(&mut self, scope: &str, key: &str, keep: usize) -> Result<bool, StoreError> {
        let path = self.path.clone();
        let fail = fail(&path);
        let tx = self.conn.transaction().map_err(&fail)?;
        let new = tx
            .execute(
                "INSERT OR IGNORE INTO marks (scope, key) VALUES (?1, ?2)",
                params![scope, key],
            )
            .map_err(&fail)?
            == 1;
        if new {
            // The newest `keep` stay (rowids grow with each insert).
            tx.execute(
                "DELETE FROM marks WHERE scope = ?1 AND rowid NOT IN
                 (SELECT rowid FROM marks WHERE scope = ?1 ORDER BY rowid DESC LIMIT ?2)",
                params![scope, keep as i64],
            )
            .map_err(&fail)?;
        }
        tx.commit().map_err(&fail)?;
        Ok(new)
    }
}

/// Writes a cooldown's row unless its scope and kind have one that ends no earlier (of two
/// daemons' cooldowns the later reset stands); rows a day past their reset are let go.
fn put_cooldown(tx: &rusqlite::Transaction, row: &CooldownRow) -> rusqlite::Result<usize> {
    tx.execute(
        "INSERT INTO cooldowns (scope, kind, until_ms, since_ms, reason) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(scope, kind) DO UPDATE SET until_ms = excluded.until_ms, since_ms = excluded.since_ms,
           reason = excluded.reason
         WHERE excluded.until_ms > cooldowns.until_ms",
        params![row.scope_key, row.kind, row.until as i64, row.since as i64, row.reason],
    )?;
    let gone = crate::time::unix_ms().saturating_sub(super::COOLDOWN_KEPT_MS);
    tx.execute(
        "DELETE FROM cooldowns WHERE until_ms < ?1",
        params![gone as i64],
    )
}

/// A cooldown's row from `scope, kind, until_ms, since_ms, reason`.
fn cooldown_row(r: &rusqlite::Row) -> rusqlite::Result<CooldownRow> {
    Ok(CooldownRow {
        scope_key: r.get(0)?,
        kind: r.get(1)?,
        until: r.get::<_, i64>(2)?.max(0) as Millis,
        since: r.get::<_, i64>(3)?.max(0) as Millis,
        reason: r.get(4)?,
    })
}

/// Adds `spent` to `owner`'s line `name` of the ledger, numbered as the newest change; `add`
/// false keeps a line that is there already (a copy).
fn add_spend(
    tx: &rusqlite::Transaction,
    name: &str,
    owner: &str,
    spent: &Spent,
    add: bool,
) -> rusqlite::Result<usize> {
    let on_conflict = if add {
        "ON CONFLICT (name, owner_id) DO UPDATE SET input = input + excluded.input,
           output = output + excluded.output, total = total + excluded.total,
           cost = cost + excluded.cost, runs = runs + excluded.runs, seq = excluded.seq"
    } else {
        "ON CONFLICT DO NOTHING"
    };
    tx.execute(
        &format!(
            "INSERT INTO ledger (name, owner_id, input, output, total, cost, runs, seq)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, (SELECT value + 1 FROM counters WHERE name = 'ledger'))
             {on_conflict}"
        ),
        params![
            name,
            owner,
            spent.input_tokens as i64,
            spent.output_tokens as i64,
            spent.total_tokens as i64,
            spent.cost_usd,
            spent.runs as i64
        ],
    )?;
    tx.execute(
        "UPDATE counters SET value = value + 1 WHERE name = 'ledger'",
        [],
    )
}

/// A ledger row of `SELECT name, owner_id, input, output, total, cost, runs ...`.
fn ledger_row(r: &rusqlite::Row) -> rusqlite::Result<LedgerRow> {
    let n = |i: usize| -> rusqlite::Result<u64> { Ok(r.get::<_, i64>(i)?.max(0) as u64) };
    Ok(LedgerRow {
        name: r.get(0)?,
        owner: r.get(1)?,
        spent: Spent {
            input_tokens: n(2)?,
            output_tokens: n(3)?,
            total_tokens: n(4)?,
            cost_usd: r.get(5)?,
            runs: n(6)?,
        },
    })
}

/// The rows of one transaction as this daemon's sweep queries them ([`sweep::Rows`]).
struct Rows<'a> {
    tx: &'a rusqlite::Transaction<'a>,
    me: &'a Owner,
}

impl sweep::Rows for Rows<'_> {
    type Error = rusqlite::Error;

    fn move_retries(&mut self, dead: &str) -> rusqlite::Result<Vec<Taken<Retry>>> {
        let rows = rows_of(self.tx, "slot_retries", dead)?;
        self.tx.execute(
            "UPDATE slot_retries SET owner_id = ?1, token = NULL WHERE owner_id = ?2",
            params![self.me.id, dead],
        )?;
        Ok(rows
            .into_iter()
            .map(|(key, record, _)| {
                let retry = serde_json::from_str::<Retry>(&record).ok();
                let token = retry.as_ref().and_then(|r| r.claim_token);
                (key, retry, token)
            })
            .collect())
    }

    fn delete_claims(&mut self, dead: &str) -> rusqlite::Result<Vec<Taken<Running>>> {
        let rows = rows_of(self.tx, "slot_claims", dead)?;
        self.tx
            .execute("DELETE FROM slot_claims WHERE owner_id = ?1", params![dead])?;
        Ok(rows
            .into_iter()
            .map(|(key, record, token)| {
                let token = token.and_then(|t| u64::try_from(t).ok());
                (key, serde_json::from_str(&record).ok(), token)
            })
            .collect())
    }

    fn revoke(&mut self, token: Option<u64>) -> rusqlite::Result<()> {
        revoke(self.tx, token.map(|t| t as i64))
    }

    fn insert_retry(&mut self, key: &Key, retry: &Retry) -> rusqlite::Result<bool> {
        let inserted = self.tx.execute(
            "INSERT OR IGNORE INTO slot_retries (issue_id, slot, owner_id, record) VALUES (?1, ?2, ?3, ?4)",
            params![key.issue_id, key.slot, self.me.id, to_json(retry)],
        )?;
        Ok(inserted == 1)
    }

    fn move_steering(&mut self, dead: &str) -> rusqlite::Result<Vec<Message>> {
        let steering: Vec<String> = self
            .tx
            .prepare_cached(
                "UPDATE steering SET owner_id = ?1 WHERE owner_id = ?2 RETURNING record",
            )?
            .query_map(params![self.me.id, dead], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(steering
            .iter()
            .filter_map(|r| serde_json::from_str::<Message>(r).ok())
            .collect())
    }

    fn delete_cursors(&mut self, dead: &str) -> rusqlite::Result<Vec<(String, String)>> {
        self.tx
            .prepare_cached(
                "DELETE FROM owner_cursors WHERE owner_id = ?1 RETURNING source, cursor",
            )?
            .query_map(params![dead], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
    }

    fn cursor(&mut self, source: &str) -> rusqlite::Result<Option<String>> {
        self.tx
            .query_row(
                "SELECT cursor FROM owner_cursors WHERE owner_id = ?1 AND source = ?2",
                params![self.me.id, source],
                |r| r.get(0),
            )
            .optional()
    }

    fn put_cursor(&mut self, source: &str, cursor: &str) -> rusqlite::Result<()> {
        self.tx.execute(
            "INSERT OR REPLACE INTO owner_cursors (owner_id, source, cursor) VALUES (?1, ?2, ?3)",
            params![self.me.id, source, cursor],
        )?;
        Ok(())
    }

    fn move_relays(&mut self, dead: &str) -> rusqlite::Result<()> {
        self.tx.execute(
            "UPDATE relay SET to_owner = ?1 WHERE to_owner = ?2",
            params![self.me.id, dead],
        )?;
        Ok(())
    }

    fn take_relays(&mut self) -> rusqlite::Result<Vec<Relay>> {
        let relayed: Vec<String> = self
            .tx
            .prepare_cached("DELETE FROM relay WHERE to_owner = ?1 RETURNING record")?
            .query_map(params![self.me.id], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(relayed
            .iter()
            .filter_map(|record| serde_json::from_str::<Relay>(record).ok())
            .collect())
    }

    fn put_steer(&mut self, m: &Message) -> rusqlite::Result<()> {
        put_steer(self.tx, &self.me.id, m).map(drop)
    }
}

/// A waiting steering message, held by `owner`.
fn put_steer(tx: &rusqlite::Transaction<'_>, owner: &str, m: &Message) -> rusqlite::Result<usize> {
    tx.execute(
        "INSERT OR REPLACE INTO steering (key, issue_id, record, owner_id) VALUES (?1, ?2, ?3, ?4)",
        params![m.unique_key(), m.issue_id, to_json(m), owner],
    )
}

/// Revokes a fencing token: no write that carries it lands any more.
fn revoke(tx: &rusqlite::Transaction<'_>, token: Option<i64>) -> rusqlite::Result<()> {
    if let Some(token) = token.filter(|t| *t > 0) {
        tx.execute(
            "INSERT OR IGNORE INTO revoked (token) VALUES (?1)",
            params![token],
        )?;
        tx.execute(
            "DELETE FROM revoked WHERE token <= (SELECT max(token) FROM revoked) - ?1",
            params![REVOKED_KEPT],
        )?;
    }
    Ok(())
}

/// Whether a write carrying this token must not land.
fn revoked(tx: &rusqlite::Transaction<'_>, token: Option<u64>) -> rusqlite::Result<bool> {
    let Some(token) = token else {
        return Ok(false);
    };
    tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM revoked WHERE token = ?1)",
        params![token as i64],
        |r| r.get(0),
    )
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
        if sweep::alive(me, &host, pid, beat.max(0) as Millis, now) {
            live.insert(id);
        }
    }
    Ok(live)
}

/// The rows one owner holds in a slot table: key, record and fencing token.
fn rows_of(
    tx: &rusqlite::Transaction<'_>,
    table: &str,
    owner: &str,
) -> rusqlite::Result<Vec<(Key, String, Option<i64>)>> {
    let mut q = tx.prepare_cached(&format!(
        "SELECT issue_id, slot, record, token FROM {table} WHERE owner_id = ?1"
    ))?;
    let rows = q.query_map(params![owner], |r| {
        Ok((
            Key::new(r.get::<_, String>(0)?, r.get(1)?),
            r.get(2)?,
            r.get(3)?,
        ))
    })?;
    rows.collect()
}

/// A persisted record as one JSON line.
fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// Refuses a store a daemon uses now (a heartbeat within the default TTL).
fn refuse_if_used(conn: &Connection, path: &Path) -> Result<(), String> {
    let since = crate::time::unix_ms().saturating_sub(super::DEFAULT_TTL_MS) as i64;
    let users: Vec<String> = conn
        .prepare("SELECT owner_id || ' (' || hostname || ', pid ' || pid || ')' FROM owners WHERE heartbeat_at >= ?1")
        .and_then(|mut q| q.query_map(params![since], |r| r.get(0))?.collect())
        .map_err(fail(path))?;
    if users.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "claim store {}: daemon {} uses it; stop every daemon on it first",
            path.display(),
            users.join(", ")
        ))
    }
}

/// Everything the store at `path` holds that a move must not lose (`svc store copy`).
pub fn export(path: &Path) -> Result<super::Dump, String> {
    use super::{Dump, SlotRow};
    let store = Sqlite::open(path, Owner::nobody())?;
    let conn = &store.conn;
    refuse_if_used(conn, path)?;
    let fail = fail(path);
    let slots = |table: &str| -> Result<Vec<SlotRow>, String> {
        conn.prepare(&format!(
            "SELECT issue_id, slot, owner_id, record, token FROM {table} ORDER BY issue_id, slot"
        ))
        .and_then(|mut q| {
            q.query_map([], |r| {
                Ok(SlotRow {
                    issue_id: r.get(0)?,
                    slot: r.get(1)?,
                    owner_id: r.get(2)?,
                    record: r.get(3)?,
                    token: r.get(4)?,
                })
            })?
            .collect()
        })
        .map_err(&fail)
    };
    Ok(Dump {
        claims: slots("slot_claims")?,
        retries: slots("slot_retries")?,
        runs: conn
            .prepare("SELECT run_id, ended_at, record FROM runs ORDER BY ended_at")
            .and_then(|mut q| {
                q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect()
            })
            .map_err(&fail)?,
        steering: conn
            .prepare("SELECT key, owner_id, issue_id, record FROM steering ORDER BY rowid")
            .and_then(|mut q| {
                q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect()
            })
            .map_err(&fail)?,
        seen: conn
            .prepare("SELECT key FROM steering_seen ORDER BY rowid")
            .and_then(|mut q| q.query_map([], |r| r.get(0))?.collect())
            .map_err(&fail)?,
        cursors: conn
            .prepare("SELECT owner_id, source, cursor FROM owner_cursors")
            .and_then(|mut q| {
                q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect()
            })
            .map_err(&fail)?,
        tallies: conn
            .prepare("SELECT name, value FROM tallies ORDER BY name")
            .and_then(|mut q| q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .map_err(&fail)?,
        marks: conn
            .prepare("SELECT scope, key FROM marks ORDER BY rowid")
            .and_then(|mut q| q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .map_err(&fail)?,
        ledger: conn
            .prepare(
                "SELECT name, owner_id, input, output, total, cost, runs FROM ledger ORDER BY seq",
            )
            .and_then(|mut q| q.query_map([], ledger_row)?.collect())
            .map_err(&fail)?,
        cooldowns: conn
            .prepare("SELECT scope, kind, until_ms, since_ms, reason FROM cooldowns ORDER BY scope, kind")
            .and_then(|mut q| q.query_map([], cooldown_row)?.collect())
            .map_err(&fail)?,
    })
}

/// Writes `dump` into the store at `path` (created when missing), in one transaction; rows it
/// has already are kept.
pub fn import(path: &Path, dump: &super::Dump) -> Result<(), String> {
    let mut store = Sqlite::open(path, Owner::nobody())?;
    refuse_if_used(&store.conn, path)?;
    let fail = fail(path);
    let tx = store.conn.transaction().map_err(&fail)?;
    for (table, rows) in [
        ("slot_claims", &dump.claims),
        ("slot_retries", &dump.retries),
    ] {
        for r in rows {
            let run_id = serde_json::from_str::<serde_json::Value>(&r.record)
                .ok()
                .and_then(|v| v["run_id"].as_str().map(str::to_string))
                .unwrap_or_default();
            let sql = if table == "slot_claims" {
                "INSERT OR IGNORE INTO slot_claims (issue_id, slot, owner_id, run_id, record, token) VALUES (?1, ?2, ?3, ?6, ?4, coalesce(?5, 0))"
            } else {
                "INSERT OR IGNORE INTO slot_retries (issue_id, slot, owner_id, record, token) VALUES (?1, ?2, ?3, ?4, ?5)"
            };
            if table == "slot_claims" {
                tx.execute(
                    sql,
                    params![r.issue_id, r.slot, r.owner_id, r.record, r.token, run_id],
                )
            } else {
                tx.execute(
                    sql,
                    params![r.issue_id, r.slot, r.owner_id, r.record, r.token],
                )
            }
            .map_err(&fail)?;
        }
    }
    for (id, end, record) in &dump.runs {
        tx.execute(
            "INSERT OR IGNORE INTO runs (run_id, ended_at, record) VALUES (?1, ?2, ?3)",
            params![id, end, record],
        )
        .map_err(&fail)?;
    }
    for (key, owner, issue, record) in &dump.steering {
        tx.execute(
            "INSERT OR IGNORE INTO steering (key, owner_id, issue_id, record) VALUES (?1, ?2, ?3, ?4)",
            params![key, owner, issue, record],
        )
        .map_err(&fail)?;
    }
    for key in &dump.seen {
        tx.execute(
            "INSERT OR IGNORE INTO steering_seen (key) VALUES (?1)",
            params![key],
        )
        .map_err(&fail)?;
    }
    for (name, value) in &dump.tallies {
        tx.execute(
            "INSERT OR IGNORE INTO tallies (name, value) VALUES (?1, ?2)",
            params![name, value],
        )
        .map_err(&fail)?;
    }
    for (scope, key) in &dump.marks {
        tx.execute(
            "INSERT OR IGNORE INTO marks (scope, key) VALUES (?1, ?2)",
            params![scope, key],
        )
        .map_err(&fail)?;
    }
    for line in &dump.ledger {
        add_spend(&tx, &line.name, &line.owner, &line.spent, false).map_err(&fail)?;
    }
    for row in &dump.cooldowns {
        put_cooldown(&tx, row).map_err(&fail)?;
    }
    for (owner, source, cursor) in &dump.cursors {
        tx.execute(
            "INSERT OR IGNORE INTO owner_cursors (owner_id, source, cursor) VALUES (?1, ?2, ?3)",
            params![owner, source, cursor],
        )
        .map_err(&fail)?;
    }
    tx.execute(
        "UPDATE counters SET value = max(value, ?1) WHERE name = 'fence'",
        params![dump.max_token()],
    )
    .map_err(&fail)?;
    tx.commit().map_err(&fail)
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
                .and_then(|mut s| s.hydrate(1, 1).map_err(|e| e.message))
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
                            s.hydrate(50, 1).map(drop).map_err(|e| e.message)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(opened.iter().all(Result::is_ok), "{opened:?}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A store written before cooldowns were kept opens and gains their table.
    #[test]
    fn a_store_without_the_cooldowns_table_gains_it() {
        use crate::orchestrator::store::tests::cooldown;
        let dir = temp("no-cooldowns");
        let path = dir.join("c.db");
        drop(Sqlite::open(&path, owner("old")).unwrap());
        Connection::open(&path)
            .unwrap()
            .execute_batch("DROP TABLE cooldowns")
            .unwrap();
        let mut s = Sqlite::open(&path, owner("new")).unwrap();
        let t0 = crate::time::unix_ms();
        s.apply(&[Op::PutCooldown(Box::new(cooldown(
            "claude",
            "fleet",
            t0,
            t0 + 1000,
        )))])
        .unwrap();
        assert_eq!(
            s.sweep(t0).unwrap().cooldowns,
            [cooldown("claude", "fleet", t0, t0 + 1000)]
        );
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
