//! The `postgres` kind of claim store: a PostgreSQL database that daemons on any number of
//! hosts share (`SVC_CLAIM_STORE=postgres://...`), reached through libpq ([`crate::pq`]).
//!
//! - Its tables live in a schema of their own (`svc`, or the URI's `schema` parameter), with a
//!   schema version; a database written by a newer svc is refused.
//! - Owners heartbeat by the **database's clock** (`now()`), so hosts' clocks need not agree.
//! - A run's claim carries a fencing token from a sequence; a claim taken over revokes its
//!   token, and every later write about that run is conditional on it.
//! - The common sweep is one statement (heartbeat, the fleet, what others hold, dead holders,
//!   requests relayed here); taking over and taking relayed requests follow in a transaction
//!   only when there is something to take.
//! - `NOTIFY` tells the other daemons at once when a claim or retry is let go, work changes
//!   hands, a request is relayed, or an agent kind cools down; each daemon's listener
//!   connection wakes its sweep. The sweep every second stays the backstop.
//! - The connection is re-made with backoff when it breaks; for one TTL after a reconnection
//!   nothing is taken over (after an outage every heartbeat looks old).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::sweep::{self, Taken};
use super::{
    Capabilities, Claim, ClaimStore, CooldownRow, Failure, HISTORY_KEPT, Hydrated, Kind, Op, Owner,
    STALE_SHOWN_MS, StoreError, Sweep,
};
use crate::orchestrator::protocol::{
    Holder, Key, LedgerRow, Relay, Retry, RunRecord, Running, Spent,
};
use crate::pq::{Conn, Rows};
use crate::steering::Message;
use crate::time::Millis;

mod dump;
mod schema;
mod target;

pub use dump::{export, import};
pub use schema::SCHEMA_VERSION;
use schema::{COMPACT, prepare};
pub use target::{Bounds, Target};

/// Survives the daemon, shared by daemons on any host, and it decides who runs what.
pub static KIND: Kind = Kind {
    name: "postgres",
    capabilities: Capabilities {
        crash_recovery: true,
        shared_across_processes: true,
        retry_durability: true,
    },
    leadership: "postgres",
};

/// The owner of the ledger's line of the daemons gone.
pub const GONE_OWNER: &str = "*";

/// How often a daemon compacts the ledger ([`COMPACT`]).
const COMPACT_EVERY: Duration = Duration::from_secs(3600);

/// How long the first wait after a failed connection is; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How many revoked fencing tokens are remembered (the newest).
const REVOKED_KEPT: i64 = 10_000;

/// One connection to the store, as one owner.
pub struct Postgres {
    target: Arc<Target>,
    owner: Owner,
    bounds: Bounds,
    conn: Option<Conn>,
    /// [`Target::losses`] when the connection was made: once it moved, the connection is
    /// re-made before its next use.
    made_at_loss: u64,
    /// When the connection was last made, the first one too: nothing is taken over within
    /// one TTL of it (every other heartbeat looks old after an outage, and a daemon that has
    /// just started saw none renewed), but from owners proven dead on this host.
    reconnected_at: Option<Instant>,
    /// When this owner's heartbeat was last written, shared with the listener, which writes
    /// it on its own connection when the store thread has not (a sweep held up by a lock or a
    /// slow server never lets the heartbeat lapse).
    beat: Arc<std::sync::atomic::AtomicU64>,
    /// When the next connection attempt may be made, and the wait after that one fails.
    next_try: Instant,
    backoff: Duration,
    /// The last failure to reach the server (the store is unavailable while it is set).
    down: Option<String>,
    /// Set while this handle's listener thread should run ([`ClaimStore::listen`]).
    listening: Option<Arc<AtomicBool>>,
    /// The newest finished run written that this daemon has seen (by the order rows were
    /// written, not by when runs ended: a run may reach the store after a later one): a sweep
    /// brings the fleet's runs written since.
    last_run_seq: i64,
    /// Where the next sweep reads the ledger from: the oldest transaction still in progress
    /// when the last sweep read it (`pg_snapshot_xmin`), so a line written by a transaction
    /// that committed after that read, however long after it began, is read the next time;
    /// `None`: the whole ledger (the first sweep). A line read again replaces itself.
    ledger_cursor: Option<String>,
    /// Calls numbered so far (tallies and marks: see [`ClaimStore::add_tallies`]).
    calls: u64,
    /// When this daemon last compacted the ledger.
    compacted_at: Option<Instant>,
    /// Records found malformed (said once each).
    malformed: BTreeSet<String>,
}

impl Postgres {
    /// Connects as `owner`, creating the tables when missing; a server that cannot be reached
    /// or refuses the login, or tables of a newer svc, are an error naming the store (never
    /// its password).
    pub fn open(target: &Target, owner: Owner) -> Result<Postgres, String> {
        let bounds = Bounds::of(owner.ttl_ms);
        let made_at_loss = target.losses();
        let mut conn = target.connect_bounded(bounds)?;
        prepare(&mut conn, target)?;
        Ok(Postgres {
            target: Arc::new(target.clone()),
            owner,
            bounds,
            conn: Some(conn),
            made_at_loss,
            reconnected_at: Some(Instant::now()),
            beat: Arc::default(),
            next_try: Instant::now(),
            backoff: BACKOFF_FIRST,
            down: None,
            listening: None,
            last_run_seq: 0,
            ledger_cursor: None,
            calls: 0,
            compacted_at: None,
            malformed: BTreeSet::new(),
        })
    }

    /// `e` as the store's error: one a retry cannot cure is a value out of range or a
    /// constraint (SQLSTATE classes 22 and 23); rows locked past the lock bound are
    /// `lock_not_available` (55P03).
    fn fail(&self, e: crate::pq::Error) -> StoreError {
        let kind = match e.sqlstate.as_deref().unwrap_or("") {
            "55P03" => Failure::Locked,
            s if s.starts_with("22") || s.starts_with("23") => Failure::ForGood,
            _ => Failure::Failed,
        };
        StoreError::new(kind, format!("claim store {}: {e}", self.target.shown()))
    }

    /// The connection, re-made (with backoff) when it broke, and at once when another handle
    /// of this daemon found the server gone since it was made.
    fn conn(&mut self) -> Result<&mut Conn, StoreError> {
        self.connected()
            .map_err(|e| StoreError::new(Failure::Unavailable, e))
    }

    /// [`Postgres::conn`], its error the reason the store is unavailable.
    fn connected(&mut self) -> Result<&mut Conn, String> {
        if self.conn.as_ref().is_some_and(|c| !c.is_ok()) {
            self.conn = None;
        }
        if self.conn.is_some() && self.target.losses() != self.made_at_loss {
            self.conn = None;
            self.next_try = Instant::now();
        }
        if self.conn.is_none() {
            if Instant::now() < self.next_try {
                return Err(self.down.clone().unwrap_or_else(|| {
                    format!("claim store {}: not connected", self.target.shown())
                }));
            }
            let losses = self.target.losses();
            match self.target.connect_bounded(self.bounds) {
                Ok(c) => {
                    self.conn = Some(c);
                    self.made_at_loss = losses;
                    self.reconnected_at = Some(Instant::now());
                    self.backoff = BACKOFF_FIRST;
                    if let Some(was) = self.down.take() {
                        log::info!(
                            "claim store {}: connected again (after: {was})",
                            self.target.shown()
                        );
                    }
                }
                Err(e) => {
                    let e = format!("{e}; connecting again in {} ms", self.backoff.as_millis());
                    self.next_try = Instant::now() + self.backoff;
                    self.backoff = (self.backoff * 2).min(backoff_max(self.owner.ttl_ms));
                    self.down = Some(e.clone());
                    return Err(e);
                }
            }
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// Runs `work` on the connection; an open transaction is rolled back on failure. A
    /// connection that broke under it is dropped, every other handle told, and `work` tried
    /// once more at once on a new one (the server may be back already; a write is safe to
    /// send again: see [`Postgres::apply`]); a second failure is the error.
    fn with<T>(
        &mut self,
        mut work: impl FnMut(&mut Conn, &Owner) -> Result<T, crate::pq::Error>,
    ) -> Result<T, StoreError> {
        let owner = self.owner.clone();
        let mut tries = 0;
        loop {
            tries += 1;
            let conn = self.conn()?;
            match work(conn, &owner) {
                Ok(v) => return Ok(v),
                Err(e) => {
                    if e.connection_lost || !conn.is_ok() {
                        self.conn = None;
                        self.next_try = Instant::now();
                        self.target.lose();
                        let message = self.fail(e).message;
                        self.down = Some(message.clone());
                        if tries < 2 {
                            continue;
                        }
                        return Err(StoreError::new(Failure::Unavailable, message));
                    }
                    if conn.in_transaction() {
                        let _ = conn.execute("ROLLBACK");
                    }
                    return Err(self.fail(e));
                }
            }
        }
    }

    /// Applies `ops` in one transaction; a numbered `batch` is recorded in it (`applied`) and
    /// one found there already is not applied again: sent again after its COMMIT's answer was
    /// lost, a batch's additive writes (spend, relayed requests) land once. A failure a retry
    /// cannot cure is [`Failure::ForGood`] ([`Postgres::fail`]).
    fn apply_batch(&mut self, batch: Option<u64>, ops: &[Op]) -> Result<(), StoreError> {
        let channel = self.target.channel();
        let batch = batch.map(|b| b.to_string());
        self.with(|c, me| {
            c.execute("BEGIN")?;
            if let Some(batch) = &batch {
                let new = c.query(
                    "INSERT INTO applied (owner_id, batch) VALUES ($1, $2::bigint) ON CONFLICT DO NOTHING",
                    &[Some(&me.id), Some(batch)],
                )?;
                if new.affected == 0 {
                    c.execute("ROLLBACK")?;
                    return Ok(());
                }
                // This daemon's older numbers, and those of daemons long gone.
                if batch.ends_with("00") {
                    c.query(
                        "DELETE FROM applied WHERE (owner_id = $1 AND batch < $2::bigint - 1000)
                           OR at < now() - interval '1 day'",
                        &[Some(&me.id), Some(batch)],
                    )?;
                }
            }
            let mut notify = false;
            let mut runs = false;
            for op in ops {
                let fenced = |c: &mut Conn, token: Option<u64>| -> Result<bool, crate::pq::Error> {
                    let Some(token) = token else {
                        return Ok(false);
                    };
                    let t = token.to_string();
                    let rows = c.query("SELECT 1 FROM revoked WHERE token = $1::bigint", &[Some(&t)])?;
                    Ok(!rows.is_empty())
                };
                match op {
                    Op::PutCooldown(cooldown) => {
                        // A new or later reset: the fleet stops starting runs on the kind at once.
                        notify |= put_cooldown(c, &CooldownRow::of(cooldown, &me.hostname))?;
                    }
                    Op::Fence(token) => {
                        if fenced(c, Some(*token))? {
                            break;
                        }
                    }
                    Op::PutRun(r) => {
                        if fenced(c, r.run.claim_token)? {
                            continue;
                        }
                        runs = true;
                        let ended = r.ended_at.to_string();
                        c.query(
                            "INSERT INTO runs (run_id, ended_at, record) VALUES ($1, $2::bigint, $3)
                             ON CONFLICT (run_id) DO UPDATE SET ended_at = EXCLUDED.ended_at, record = EXCLUDED.record",
                            &[Some(&r.run.run_id), Some(&ended), Some(&json(r.as_ref()))],
                        )?;
                    }
                    Op::PutRetry(k, r) => {
                        if fenced(c, r.claim_token)? {
                            continue;
                        }
                        let slot = k.slot.to_string();
                        let token = r.claim_token.map(|t| t.to_string());
                        // Never on a slot another daemon runs: a run of ours that could not
                        // claim it (the store away) leaves no retry that would stop theirs.
                        c.query(
                            "INSERT INTO retries (issue_id, slot, owner_id, record, token)
                             SELECT $1::text, $2::integer, $3::text, $4::text, $5::bigint
                              WHERE NOT EXISTS (SELECT 1 FROM claims WHERE issue_id = $1::text AND slot = $2::integer AND owner_id <> $3::text)
                             ON CONFLICT (issue_id, slot) DO UPDATE SET record = EXCLUDED.record, token = EXCLUDED.token
                             WHERE retries.owner_id = EXCLUDED.owner_id",
                            &[Some(&k.issue_id), Some(&slot), Some(&me.id), Some(&json(r.as_ref())), token.as_deref()],
                        )?;
                    }
                    Op::DeleteRetry(k) => {
                        let slot = k.slot.to_string();
                        let gone = c.query(
                            "DELETE FROM retries WHERE issue_id = $1 AND slot = $2::integer AND owner_id = $3",
                            &[Some(&k.issue_id), Some(&slot), Some(&me.id)],
                        )?;
                        notify |= gone.affected > 0;
                    }
                    Op::PutClaim(k, r) => {
                        if fenced(c, r.claim_token)? {
                            continue;
                        }
                        let slot = k.slot.to_string();
                        c.query(
                            "INSERT INTO claims (issue_id, slot, owner_id, run_id, record) VALUES ($1, $2::integer, $3, $4, $5)
                             ON CONFLICT (issue_id, slot) DO UPDATE SET run_id = EXCLUDED.run_id, record = EXCLUDED.record
                             WHERE claims.owner_id = EXCLUDED.owner_id",
                            &[Some(&k.issue_id), Some(&slot), Some(&me.id), Some(&r.run_id), Some(&json(r.as_ref()))],
                        )?;
                    }
                    Op::DeleteClaim(k) => {
                        let slot = k.slot.to_string();
                        let gone = c.query(
                            "DELETE FROM claims WHERE issue_id = $1 AND slot = $2::integer AND owner_id = $3",
                            &[Some(&k.issue_id), Some(&slot), Some(&me.id)],
                        )?;
                        if gone.affected > 0 {
                            notify = true;
                            // When it was let go (the database's clock), so a daemon that read
                            // the issue before then does not run it again.
                            c.query(
                                "INSERT INTO released (issue_id, slot, owner_id, released_at)
                                 VALUES ($1, $2::integer, $3, (extract(epoch from clock_timestamp()) * 1000)::bigint)
                                 ON CONFLICT (issue_id, slot) DO UPDATE SET owner_id = EXCLUDED.owner_id, released_at = EXCLUDED.released_at",
                                &[Some(&k.issue_id), Some(&slot), Some(&me.id)],
                            )?;
                            c.execute("DELETE FROM released WHERE released_at < (extract(epoch from clock_timestamp()) * 1000)::bigint - 3600000")?;
                        }
                    }
                    Op::PutSteer(m) => put_steer(c, &me.id, m)?,
                    Op::DeleteSteer(key) => {
                        c.query(
                            "DELETE FROM steering WHERE key = $1 AND owner_id = $2",
                            &[Some(key), Some(&me.id)],
                        )?;
                    }
                    Op::PutSeen(keys) => {
                        for key in keys {
                            c.query(
                                "INSERT INTO steering_seen (key) VALUES ($1) ON CONFLICT DO NOTHING",
                                &[Some(key)],
                            )?;
                        }
                        let max = crate::steering::SEEN_MAX.to_string();
                        c.query(
                            "DELETE FROM steering_seen WHERE seq <= (SELECT max(seq) FROM steering_seen) - $1::bigint",
                            &[Some(&max)],
                        )?;
                    }
                    Op::PutCursor(source, cursor) => {
                        c.query(
                            "INSERT INTO cursors (owner_id, source, cursor) VALUES ($1, $2, $3)
                             ON CONFLICT (owner_id, source) DO UPDATE SET cursor = EXCLUDED.cursor",
                            &[Some(&me.id), Some(source), Some(cursor)],
                        )?;
                    }
                    Op::Spend(name, spent) => add_spend(c, name, &me.id, spent, true)?,
                    Op::Relay(relay) => {
                        c.query(
                            "INSERT INTO relay (to_owner, record) VALUES ($1, $2)",
                            &[Some(&relay.to_owner), Some(&json(relay.as_ref()))],
                        )?;
                        notify = true;
                    }
                }
            }
            if runs {
                let kept = HISTORY_KEPT.to_string();
                c.query(
                    "DELETE FROM runs WHERE ended_at < (SELECT min(ended_at) FROM (SELECT ended_at FROM runs ORDER BY ended_at DESC LIMIT $1::bigint) newest)",
                    &[Some(&kept)],
                )?;
            }
            if notify {
                c.query("SELECT pg_notify($1, $2)", &[Some(&channel), Some(&me.id)])?;
            }
            c.execute("COMMIT")?;
            Ok(())
        })
    }

    /// Whether dead owners may be taken over now: not within one TTL of a reconnection.
    fn may_take_over(&self) -> bool {
        self.reconnected_at
            .is_none_or(|at| at.elapsed() >= Duration::from_millis(self.owner.ttl_ms))
    }
}

/// Adds `spent` to `owner`'s line `name` of the ledger, stamped with the database's clock;
/// `add` false keeps a line that is there already (a copy). No lock across daemons: sweeps
/// read the lines changed since their last read by transaction ids ([`Postgres::ledger_cursor`]),
/// and a line read again replaces itself.
fn add_spend(
    c: &mut Conn,
    name: &str,
    owner: &str,
    spent: &Spent,
    add: bool,
) -> Result<(), crate::pq::Error> {
    let v = [
        spent.input_tokens.to_string(),
        spent.output_tokens.to_string(),
        spent.total_tokens.to_string(),
        spent.cost_usd.to_string(),
        spent.runs.to_string(),
    ];
    let on_conflict = if add {
        "ON CONFLICT (name, owner_id) DO UPDATE SET input = ledger.input + EXCLUDED.input,
           output = ledger.output + EXCLUDED.output, total = ledger.total + EXCLUDED.total,
           cost = ledger.cost + EXCLUDED.cost, runs = ledger.runs + EXCLUDED.runs, at = now()"
    } else {
        "ON CONFLICT DO NOTHING"
    };
    c.query(
        &format!(
            "INSERT INTO ledger (name, owner_id, input, output, total, cost, runs, at)
             VALUES ($1, $2, $3::bigint, $4::bigint, $5::bigint, $6::double precision, $7::bigint, now())
             {on_conflict}"
        ),
        &[
            Some(name),
            Some(owner),
            Some(&v[0]),
            Some(&v[1]),
            Some(&v[2]),
            Some(&v[3]),
            Some(&v[4]),
        ],
    )?;
    Ok(())
}

/// Writes a cooldown's row unless its scope and kind have one that ends no earlier (of two
/// daemons' cooldowns the later reset stands, in whichever order they commit); rows a day past
/// their reset are let go. Returns whether the row was written.
fn put_cooldown(c: &mut Conn, row: &CooldownRow) -> Result<bool, crate::pq::Error> {
    let (until, since) = (row.until.to_string(), row.since.to_string());
    let written = c.query(
        "INSERT INTO cooldowns (scope, kind, until_ms, since_ms, reason) VALUES ($1, $2, $3::bigint, $4::bigint, $5)
         ON CONFLICT (scope, kind) DO UPDATE SET until_ms = EXCLUDED.until_ms, since_ms = EXCLUDED.since_ms,
           reason = EXCLUDED.reason
         WHERE EXCLUDED.until_ms > cooldowns.until_ms",
        &[Some(&row.scope_key), Some(&row.kind), Some(&until), Some(&since), Some(&row.reason)],
    )?;
    let gone = crate::time::unix_ms()
        .saturating_sub(super::COOLDOWN_KEPT_MS)
        .to_string();
    c.query(
        "DELETE FROM cooldowns WHERE until_ms < $1::bigint",
        &[Some(&gone)],
    )?;
    Ok(written.affected > 0)
}

/// A cooldown row whose columns `a`..`e` are scope key, kind, until, since and reason.
fn cooldown_row(rows: &Rows, i: usize) -> CooldownRow {
    CooldownRow {
        scope_key: text(rows, i, "a").to_string(),
        kind: text(rows, i, "b").to_string(),
        until: text(rows, i, "c").parse().unwrap_or(0),
        since: text(rows, i, "d").parse().unwrap_or(0),
        reason: text(rows, i, "e").to_string(),
    }
}

/// A ledger row whose columns `a`..`g` are name, owner, input, output, total, cost and runs.
fn ledger_row(rows: &Rows, i: usize) -> LedgerRow {
    let n = |col: &str| text(rows, i, col).parse::<u64>().unwrap_or(0);
    LedgerRow {
        name: text(rows, i, "a").to_string(),
        owner: text(rows, i, "b").to_string(),
        spent: Spent {
            input_tokens: n("c"),
            output_tokens: n("d"),
            total_tokens: n("e"),
            cost_usd: text(rows, i, "f").parse().unwrap_or(0.0),
            runs: n("g"),
        },
    }
}

/// The longest wait between connection attempts: [`BACKOFF_MAX`], and at most a quarter of the
/// claim TTL, so that a daemon is back well within the TTL the others give it after they
/// reconnect themselves (a slower one would find its claims taken over and its runs started
/// twice).
fn backoff_max(ttl_ms: Millis) -> Duration {
    BACKOFF_MAX
        .min(Duration::from_millis(ttl_ms / 4))
        .max(BACKOFF_FIRST)
}

/// The TTL as a PostgreSQL interval in seconds (text).
fn seconds(ms: Millis) -> String {
    format!("{:.3}", ms as f64 / 1000.0)
}

/// A value of a row.
fn text<'a>(rows: &'a Rows, row: usize, col: &str) -> &'a str {
    rows.get(row, col).unwrap_or_default()
}

/// The one statement of the common sweep: this owner's heartbeat (and its running count),
/// owners gone long enough forgotten, then (as of the statement's start) the fleet with each
/// owner's liveness by the database's clock, the slots others hold, the owners that hold
/// something and are dead, whether requests wait for this owner, and the cooldowns in force it
/// shares (the fleet's and its host's, by the daemons' clock: `$16` is this one's now).
const SWEEP: &str = "
WITH beat AS (
  INSERT INTO owners (owner_id, hostname, pid, heartbeat_at, workflow, url, started_at, running, ttl_ms, boot_id, pidns)
  VALUES ($1, $2, $3::integer, now(), $4, $5, $6::bigint, (SELECT count(*) FROM claims WHERE owner_id = $1),
          ($7::double precision * 1000)::bigint, $13, $14)
  ON CONFLICT (owner_id) DO UPDATE SET heartbeat_at = now(), running = EXCLUDED.running, url = EXCLUDED.url,
    ttl_ms = EXCLUDED.ttl_ms, boot_id = EXCLUDED.boot_id, pidns = EXCLUDED.pidns
  RETURNING owner_id
), gone AS (
  DELETE FROM owners WHERE $12::boolean AND owner_id <> $1
    AND heartbeat_at < now() - make_interval(secs => greatest($8::double precision, coalesce(ttl_ms / 1000.0, 0)))
  RETURNING owner_id
), live AS (
  SELECT owner_id FROM owners
   WHERE heartbeat_at >= now() - make_interval(secs => coalesce(ttl_ms / 1000.0, $7::double precision))
)
SELECT 'owner' AS kind, owner_id AS a, hostname AS b, pid::text AS c, workflow AS d, url AS e,
       started_at::text AS f, running::text AS g,
       (heartbeat_at < now() - make_interval(secs => coalesce(ttl_ms / 1000.0, $7::double precision)))::text AS h,
       boot_id AS boot, pidns
  FROM owners
UNION ALL
SELECT 'held', issue_id, slot::text, owner_id, identifier_of(record), NULL, NULL, NULL, NULL, NULL, NULL
  FROM claims WHERE owner_id <> $1
UNION ALL
SELECT 'held', issue_id, slot::text, owner_id, identifier_of(record), NULL, NULL, NULL, NULL, NULL, NULL
  FROM retries WHERE owner_id <> $1
UNION ALL
SELECT 'dead', h.owner_id, (h.owner_id NOT IN (SELECT owner_id FROM owners))::text, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM (
  SELECT owner_id FROM claims UNION SELECT owner_id FROM retries UNION SELECT owner_id FROM steering
  UNION SELECT owner_id FROM cursors UNION SELECT to_owner FROM relay) h
  WHERE h.owner_id <> $1 AND h.owner_id NOT IN (SELECT owner_id FROM live)
UNION ALL
SELECT 'relay', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE EXISTS (SELECT 1 FROM relay WHERE to_owner = $1)
UNION ALL
SELECT 'run', run_id, seq::text, record, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM (
  SELECT run_id, seq, record FROM runs WHERE seq > $9::bigint OR ended_at > $15::bigint
   ORDER BY seq DESC LIMIT 50) newest
UNION ALL
SELECT 'spend', name, owner_id, input::text, output::text, total::text, cost::text, runs::text, NULL, NULL, NULL
  FROM ledger WHERE owner_id <> $1 AND ($10::boolean OR xid >= $11::xid8)
UNION ALL
SELECT 'cursor', pg_snapshot_xmin(pg_current_snapshot())::text, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
UNION ALL
SELECT 'cooldown', scope, kind, until_ms::text, since_ms::text, reason, NULL, NULL, NULL, NULL, NULL
  FROM cooldowns WHERE until_ms > $16::bigint AND (scope = 'fleet' OR scope = 'host:' || $2)
";

/// How long after its end a run of another daemon is read again by each sweep (see
/// `Postgres::sweep`): longer than any write transaction may stay open (`Bounds::answer_ms`
/// caps a statement at 5 s).
const RUNS_READ_AGAIN_MS: Millis = 30_000;

impl ClaimStore for Postgres {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn location(&self) -> String {
        self.target.shown()
    }

    fn reopen(&self) -> Result<Box<dyn ClaimStore>, StoreError> {
        Ok(Box::new(Postgres::open(&self.target, self.owner.clone())?))
    }

    fn hydrate(&mut self, limit: usize, now: Millis) -> Result<Hydrated, StoreError> {
        let mut sweep = self.sweep(now)?;
        // What the sweep took over is read back below with the rest of this daemon's.
        sweep.steering.clear();
        sweep.cursors.clear();
        sweep.runs.clear();
        let history = self.history(limit)?;
        self.last_run_seq = self.with(|c, _| {
            let rows = c.query("SELECT coalesce(max(seq), 0)::text AS seq FROM runs", &[])?;
            Ok(text(&rows, 0, "seq").parse().unwrap_or(0))
        })?;
        let (steering, seen, cursors) = self.with(|c, me| {
            let steering = c.query(
                "SELECT record FROM steering WHERE owner_id = $1 ORDER BY seq",
                &[Some(&me.id)],
            )?;
            let seen = c.query("SELECT key FROM steering_seen ORDER BY seq", &[])?;
            let cursors = c.query(
                "SELECT source, cursor FROM cursors WHERE owner_id = $1",
                &[Some(&me.id)],
            )?;
            Ok((steering, seen, cursors))
        })?;
        {
            Ok(Hydrated {
                history,
                sweep,
                steering: (0..steering.len())
                    .filter_map(|i| serde_json::from_str(text(&steering, i, "record")).ok())
                    .collect(),
                steering_seen: (0..seen.len())
                    .map(|i| text(&seen, i, "key").to_string())
                    .collect(),
                steering_cursors: (0..cursors.len())
                    .map(|i| {
                        (
                            text(&cursors, i, "source").to_string(),
                            text(&cursors, i, "cursor").to_string(),
                        )
                    })
                    .collect(),
            })
        }
    }

    fn history(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        // `history` takes `&self`: a connection of its own for this read.
        let mut conn = self.target.connect_bounded(self.bounds)?;
        let limit = limit.min(i64::MAX as usize).to_string();
        let rows = conn
            .query(
                "SELECT record FROM runs ORDER BY ended_at DESC, run_id DESC LIMIT $1::bigint",
                &[Some(&limit)],
            )
            .map_err(|e| self.fail(e))?;
        Ok((0..rows.len())
            .filter_map(|i| serde_json::from_str(text(&rows, i, "record")).ok())
            .collect())
    }

    fn sweep(&mut self, now: Millis) -> Result<Sweep, StoreError> {
        let ttl = seconds(self.owner.ttl_ms);
        let keep = seconds(self.owner.ttl_ms.max(STALE_SHOWN_MS));
        // Connected (again) first: a reconnection starts the grace below.
        self.conn()?;
        let may_take = self.may_take_over();
        let channel = self.target.channel();
        let sweep_lock = self.target.lock_key("sweep");
        let last_run_seq = self.last_run_seq.to_string();
        // Sequence numbers are taken at insert and become visible at commit, so a run whose
        // transaction commits after a later one was read is below the cursor: the runs that
        // ended in the last RUNS_READ_AGAIN_MS are read again (the state keeps each run once).
        let recent_runs = now.saturating_sub(RUNS_READ_AGAIN_MS).to_string();
        let now_text = now.to_string();
        let mut newest_seq = self.last_run_seq;
        let all_lines = self.ledger_cursor.is_none().to_string();
        let ledger_from = self.ledger_cursor.clone().unwrap_or_else(|| "0".into());
        let mut ledger_next = None;
        let mut malformed: Vec<String> = Vec::new();
        let (boot_id, pidns) = local_identity();
        let result = self.with(|c, me| {
            let pid = me.pid.to_string();
            let started = me.started_at.to_string();
            let rows = c.query(
                SWEEP,
                &[
                    Some(&me.id),
                    Some(&me.hostname),
                    Some(&pid),
                    Some(&me.workflow),
                    me.url.as_deref(),
                    Some(&started),
                    Some(&ttl),
                    Some(&keep),
                    Some(&last_run_seq),
                    Some(&all_lines),
                    Some(&ledger_from),
                    Some(if may_take { "true" } else { "false" }),
                    boot_id.as_deref(),
                    pidns.as_deref(),
                    Some(&recent_runs),
                    Some(&now_text),
                ],
            )?;
            let mut out = Sweep::default();
            let mut fleet = Vec::new();
            let mut dead: BTreeSet<String> = BTreeSet::new();
            // Dead by proof (a process gone from this host), not by a stale heartbeat.
            let mut proven: BTreeSet<String> = BTreeSet::new();
            let mut live: BTreeSet<String> = BTreeSet::from([me.id.clone()]);
            let mut relays = false;
            let mut held = Vec::new();
            for i in 0..rows.len() {
                match text(&rows, i, "kind") {
                    "owner" => {
                        let member = Owner {
                            id: text(&rows, i, "a").to_string(),
                            hostname: text(&rows, i, "b").to_string(),
                            pid: text(&rows, i, "c").parse().unwrap_or(0),
                            ttl_ms: 0,
                            workflow: text(&rows, i, "d").to_string(),
                            url: rows.get(i, "e").map(str::to_string),
                            started_at: text(&rows, i, "f").parse().unwrap_or(0),
                        };
                        let this = member.id == me.id;
                        // A process gone from this host is dead at once, when its pid means
                        // the same here: same boot, same PID namespace (containers may share a
                        // host name and not their pids); else its TTL tells.
                        let gone = member.hostname == me.hostname
                            && !this
                            && rows.get(i, "boot") == boot_id.as_deref()
                            && rows.get(i, "pidns") == pidns.as_deref()
                            && boot_id.is_some()
                            && pidns.is_some()
                            && !super::pid_alive(member.pid);
                        let stale = !this && (text(&rows, i, "h") == "true" || gone);
                        if gone {
                            proven.insert(member.id.clone());
                        }
                        if !stale {
                            live.insert(member.id.clone());
                        } else {
                            dead.insert(member.id.clone());
                        }
                        let running = text(&rows, i, "g").parse().unwrap_or(0);
                        fleet.push(member.member(running, stale));
                    }
                    "held" => {
                        let key = Key::new(
                            text(&rows, i, "a"),
                            text(&rows, i, "b").parse().unwrap_or(0),
                        );
                        // A record that is no JSON (brought in by hand or a copy): the slot
                        // stays held, and it is said once.
                        if rows.get(i, "d").is_none() {
                            malformed.push(format!(
                                "the record of issue {} slot {} held by daemon {}",
                                key.issue_id,
                                key.slot,
                                text(&rows, i, "c")
                            ));
                        }
                        held.push((
                            key,
                            Holder {
                                owner: text(&rows, i, "c").to_string(),
                                identifier: text(&rows, i, "d").to_string(),
                            },
                        ))
                    }
                    "cursor" => ledger_next = Some(text(&rows, i, "a").to_string()),
                    "dead" => {
                        let owner = text(&rows, i, "a").to_string();
                        // No heartbeat row at all: it unregistered, or a daemon that could
                        // see it renewed judged it gone.
                        if text(&rows, i, "b") == "true" {
                            proven.insert(owner.clone());
                        }
                        dead.insert(owner);
                    }
                    "relay" => relays = true,
                    "run" => {
                        let seq = text(&rows, i, "b").parse().unwrap_or(0);
                        newest_seq = newest_seq.max(seq);
                        if let Ok(r) = serde_json::from_str::<RunRecord>(text(&rows, i, "c")) {
                            out.runs.push(r);
                        }
                    }
                    "spend" => {
                        out.ledger.push(ledger_row(&rows, i));
                    }
                    "cooldown" => {
                        out.cooldowns
                            .extend(cooldown_row(&rows, i).shared(&me.hostname));
                    }
                    _ => {}
                }
            }
            fleet.sort_by(|a, b| (a.started_at, &a.owner_id).cmp(&(b.started_at, &b.owner_id)));
            out.cooldowns
                .sort_by(|a, b| (&a.kind, &a.scope).cmp(&(&b.kind, &b.scope)));
            out.fleet = Some(fleet);
            // Within a TTL of a (re)connection every other owner counts as live but those
            // proven dead: after an outage their heartbeats look old until they reach the
            // store again, and a daemon just started has seen none of them renewed.
            if !may_take {
                live.extend(
                    held.iter()
                        .map(|(_, h)| h.owner.clone())
                        .filter(|o| !proven.contains(o)),
                );
                live.extend(dead.iter().filter(|o| !proven.contains(*o)).cloned());
                dead.retain(|o| proven.contains(o));
            }
            let to_take: Vec<String> = dead
                .iter()
                .filter(|d| !live.contains(*d))
                .cloned()
                .collect();
            if !to_take.is_empty() || relays {
                c.execute("BEGIN")?;
                // One taker at a time: a dead owner's rows are taken over once. Never waited
                // for: another daemon taking over now (or frozen while it does) leaves it to
                // them, or to a later sweep; and a row a frozen daemon still locks ends the
                // attempt at once (its session is ended by the server's idle timeout, and a
                // later sweep takes its rows), so no sweep, and no heartbeat, ever waits here.
                let locked = c.query(
                    &format!("SELECT pg_try_advisory_xact_lock({sweep_lock})::text AS got"),
                    &[],
                )?;
                let mut took = false;
                if text(&locked, 0, "got") == "true" {
                    c.execute("SET LOCAL lock_timeout = 100")?;
                    for d in &to_take {
                        c.execute("SAVEPOINT take")?;
                        let mut taken = Sweep::default();
                        match take_over(c, me, d, now, &ttl, &mut taken) {
                            Ok(t) => {
                                c.execute("RELEASE SAVEPOINT take")?;
                                took |= t;
                                out.taken_over.append(&mut taken.taken_over);
                                out.steering.append(&mut taken.steering);
                                out.cursors.append(&mut taken.cursors);
                            }
                            // Its rows are still locked by the session it left behind.
                            Err(e) if e.sqlstate.as_deref() == Some("55P03") => {
                                c.execute("ROLLBACK TO SAVEPOINT take")?;
                                log::info!(
                                    "claim store: daemon {d}'s rows are still locked by its session; taken over at a later sweep"
                                );
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
                if relays {
                    sweep::take_relayed(&mut SweepTx { c, me }, &mut out)?;
                }
                if took {
                    c.query("SELECT pg_notify($1, $2)", &[Some(&channel), Some(&me.id)])?;
                }
                c.execute("COMMIT")?;
            }
            let taken: BTreeSet<&Key> = out.taken_over.iter().map(|(k, _)| k).collect();
            out.foreign = held
                .iter()
                .filter(|(k, h)| live.contains(&h.owner) && !taken.contains(k))
                .cloned()
                .collect();
            Ok(out)
        });
        for what in malformed {
            if self.malformed.insert(what.clone()) {
                log::warn!(
                    "claim store {}: {what} is not valid JSON; it is skipped by every sweep (delete the row, or copy a good store over it)",
                    self.target.shown()
                );
            }
        }
        if result.is_ok()
            && may_take
            && self
                .compacted_at
                .is_none_or(|at| at.elapsed() >= COMPACT_EVERY)
        {
            self.compacted_at = Some(Instant::now());
            if let Err(e) = self.with(|c, _| c.execute(COMPACT)) {
                log::warn!("claim store: the ledger was not compacted: {e}");
            }
        }
        if result.is_ok() {
            self.last_run_seq = newest_seq;
            if ledger_next.is_some() {
                self.ledger_cursor = ledger_next;
            }
            self.beat.store(crate::time::unix_ms(), Ordering::Release);
        }
        result
    }

    fn acquire(
        &mut self,
        key: &Key,
        run: &Running,
        _now: Millis,
        seen_at: Millis,
    ) -> Result<u64, Claim> {
        let ttl = seconds(self.owner.ttl_ms);
        // Within a TTL of a reconnection every other holder counts as live (see `sweep`).
        if let Err(e) = self.conn() {
            return Err(Claim::Failed(e));
        }
        let grace = !self.may_take_over();
        let record = serde_json::to_string(run).unwrap_or_default();
        let slot = key.slot.to_string();
        let schema = self.target.schema.clone();
        let result = self.with(|c, me| {
            c.execute("BEGIN")?;
            let lock = c.query(
                "SELECT pg_advisory_xact_lock(hashtextextended('svc ' || $3 || ' ' || $1 || '/' || $2, 0))",
                &[Some(&key.issue_id), Some(&slot), Some(&schema)],
            );
            lock?;
            // Let go by another daemon after this host read the issue (the two clocks bridged
            // by the database's now against this host's, read together).
            let seen = seen_at.to_string();
            let here = crate::time::unix_ms().to_string();
            let superseded = c.query(
                "SELECT owner_id FROM released WHERE issue_id = $1 AND slot = $2::integer AND owner_id <> $3
                   AND released_at > $4::bigint + ((extract(epoch from clock_timestamp()) * 1000)::bigint - $5::bigint)",
                &[Some(&key.issue_id), Some(&slot), Some(&me.id), Some(&seen), Some(&here)],
            )?;
            if let Some(owner) = superseded.get(0, "owner_id") {
                let owner = owner.to_string();
                c.execute("ROLLBACK")?;
                return Ok(Err(Claim::Superseded(owner)));
            }
            for table in ["claims", "retries"] {
                let rows = c.query(
                    &format!(
                        "SELECT t.owner_id, t.token::text AS token,
                                (o.owner_id IS NOT NULL AND o.heartbeat_at >= now()
                                   - make_interval(secs => coalesce(o.ttl_ms / 1000.0, $3::double precision))) AS live,
                                (o.owner_id IS NOT NULL) AS present,
                                o.hostname, o.pid::text AS pid, o.boot_id, o.pidns
                           FROM {table} t LEFT JOIN owners o ON o.owner_id = t.owner_id
                          WHERE t.issue_id = $1 AND t.slot = $2::integer FOR UPDATE OF t"
                    ),
                    &[Some(&key.issue_id), Some(&slot), Some(&ttl)],
                )?;
                if rows.is_empty() {
                    continue;
                }
                let holder = text(&rows, 0, "owner_id").to_string();
                if holder == me.id {
                    continue;
                }
                let gone = gone_from_here(&rows, me);
                // Within the grace only an owner proven gone (no heartbeat row, or its process
                // gone from this host) gives its slot up.
                let present = text(&rows, 0, "present") == "t";
                if (text(&rows, 0, "live") == "t" || (grace && present)) && !gone {
                    c.execute("ROLLBACK")?;
                    return Ok(Err(Claim::Held(holder)));
                }
                revoke(c, rows.get(0, "token"))?;
                c.query(
                    &format!("DELETE FROM {table} WHERE issue_id = $1 AND slot = $2::integer"),
                    &[Some(&key.issue_id), Some(&slot)],
                )?;
            }
            let rows = c.query(
                "INSERT INTO claims (issue_id, slot, owner_id, run_id, token, record)
                 VALUES ($1, $2::integer, $3, $4, nextval('fence'), $5)
                 ON CONFLICT (issue_id, slot) DO UPDATE SET owner_id = EXCLUDED.owner_id,
                   run_id = EXCLUDED.run_id, token = EXCLUDED.token, record = EXCLUDED.record
                 RETURNING token::text AS token",
                &[
                    Some(&key.issue_id),
                    Some(&slot),
                    Some(&me.id),
                    Some(&run.run_id),
                    Some(&record),
                ],
            )?;
            c.execute("COMMIT")?;
            Ok(Ok(text(&rows, 0, "token").parse::<u64>().unwrap_or(0)))
        });
        match result {
            Ok(Ok(token)) => Ok(token),
            Ok(Err(refused)) => Err(refused),
            // Its row is locked past the lock bound: another daemon is claiming the slot or
            // taking it over now. Held, not failed: the next poll sees who has it.
            Err(e) if e.kind == Failure::Locked => Err(Claim::Held("unknown".into())),
            Err(e) => Err(Claim::Failed(e)),
        }
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        self.apply_batch(None, ops)
    }

    fn apply_once(&mut self, batch: u64, ops: &[Op]) -> Result<(), StoreError> {
        self.apply_batch(Some(batch), ops)
    }

    fn unregister(&mut self) -> Result<(), StoreError> {
        let channel = self.target.channel();
        self.with(|c, me| {
            c.query("DELETE FROM owners WHERE owner_id = $1", &[Some(&me.id)])?;
            c.query("SELECT pg_notify($1, $2)", &[Some(&channel), Some(&me.id)])?;
            Ok(())
        })
    }
    fn add_tallies(&mut self, deltas: &[(String, f64)]) -> Result<Vec<f64>, StoreError> {
        // Numbered below zero (the store thread's batches count up from one): sent again after
        // a lost answer, the same number adds nothing twice. One statement (the worker pool
        // saves its worker-seconds every reap, even on an idle daemon).
        self.calls += 1;
        let batch = (-(self.calls as i64)).to_string();
        let list = serde_json::to_string(deltas).unwrap_or_else(|_| "[]".into());
        self.with(|c, me| {
            let rows = c.query(
                "WITH d AS (
                   SELECT e->>0 AS name, sum((e->>1)::double precision) AS delta, min(ord) AS ord
                     FROM json_array_elements($3::json) WITH ORDINALITY AS t(e, ord) GROUP BY e->>0
                 ), fresh AS (
                   INSERT INTO applied (owner_id, batch) VALUES ($1, $2::bigint) ON CONFLICT DO NOTHING RETURNING 1
                 ), added AS (
                   INSERT INTO tallies (name, value) SELECT name, delta FROM d WHERE EXISTS (SELECT 1 FROM fresh)
                   ON CONFLICT (name) DO UPDATE SET value = tallies.value + EXCLUDED.value RETURNING name, value
                 )
                 SELECT d.name, coalesce(a.value, t.value, 0)::text AS value
                   FROM d LEFT JOIN added a ON a.name = d.name LEFT JOIN tallies t ON t.name = d.name",
                &[Some(&me.id), Some(&batch), Some(&list)],
            )?;
            Ok(deltas
                .iter()
                .map(|(name, _)| {
                    (0..rows.len())
                        .find(|&i| text(&rows, i, "name") == name)
                        .map_or(0.0, |i| text(&rows, i, "value").parse().unwrap_or(0.0))
                })
                .collect())
        })
    }

    fn tallies(&mut self, prefix: &str) -> Result<Vec<(String, f64)>, StoreError> {
        self.with(|c, _| {
            let rows = c.query(
                "SELECT name, value::text AS value FROM tallies
                 WHERE left(name, length($1)) = $1 ORDER BY name",
                &[Some(prefix)],
            )?;
            Ok((0..rows.len())
                .map(|i| {
                    let value = text(&rows, i, "value").parse().unwrap_or(0.0);
                    (text(&rows, i, "name").to_string(), value)
                })
                .collect())
        })
    }

    fn line_cost(&mut self, line: &str) -> Result<f64, StoreError> {
        self.with(|c, _| {
            let rows = c.query(
                "SELECT coalesce(sum(cost), 0)::text AS cost FROM ledger WHERE name = $1",
                &[Some(line)],
            )?;
            Ok(text(&rows, 0, "cost").parse().unwrap_or(0.0))
        })
    }

    fn mark(&mut self, scope: &str, key: &str, keep: usize) -> Result<bool, StoreError> {
        let keep = keep.to_string();
        // Which call made the mark: sent again after a lost answer, it is still this call's.
        self.calls += 1;
        let nonce = format!("{} {}", self.owner.id, self.calls);
        self.with(|c, _| {
            let rows = c.query(
                "INSERT INTO marks (scope, key, nonce) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING seq",
                &[Some(scope), Some(key), Some(&nonce)],
            )?;
            let new = !rows.is_empty() || {
                let had = c.query(
                    "SELECT nonce FROM marks WHERE scope = $1 AND key = $2",
                    &[Some(scope), Some(key)],
                )?;
                had.get(0, "nonce") == Some(nonce.as_str())
            };
            if new {
                // The newest `keep` stay.
                c.query(
                    "DELETE FROM marks WHERE scope = $1 AND seq <= (SELECT seq FROM marks
                     WHERE scope = $1 ORDER BY seq DESC OFFSET $2::bigint LIMIT 1)",
                    &[Some(scope), Some(&keep)],
                )?;
            }
            Ok(new)
        })
    }

    fn listen(&mut self, wake: Sender<()>) {
        let listener = Listener {
            target: Arc::clone(&self.target),
            me: self.owner.id.clone(),
            bounds: self.bounds,
            backoff_max: backoff_max(self.owner.ttl_ms),
            beat: Arc::clone(&self.beat),
        };
        let on = Arc::new(AtomicBool::new(true));
        self.listening = Some(Arc::clone(&on));
        let _ = std::thread::Builder::new()
            .name("claim-store-listen".into())
            .spawn(move || listener.run(&wake, &on));
    }
}

impl Drop for Postgres {
    /// The listener ends with the store thread's handle.
    fn drop(&mut self) {
        if let Some(on) = &self.listening {
            on.store(false, Ordering::Relaxed);
        }
    }
}

/// The listener and the heartbeat's second voice, on a connection of its own.
struct Listener {
    target: Arc<Target>,
    me: String,
    bounds: Bounds,
    backoff_max: Duration,
    /// When the heartbeat was last written (Unix ms), by the store thread's sweep or here.
    beat: Arc<std::sync::atomic::AtomicU64>,
}

impl Listener {
    /// `LISTEN`s on the store's channel and wakes the store thread for every other daemon's
    /// notification; and writes this owner's heartbeat whenever the store thread's sweep has
    /// not for a heartbeat period (a sweep held up by a lock or a slow statement never lets the
    /// heartbeat lapse, and it is this connection's only statement while sweeps go well, so
    /// an idle daemon still sends one statement a second). Re-made with backoff when it
    /// breaks; ends when the store thread is gone.
    fn run(&self, wake: &Sender<()>, on: &AtomicBool) {
        let mut backoff = BACKOFF_FIRST;
        let period = super::HEARTBEAT.as_millis() as u64;
        while on.load(Ordering::Relaxed) {
            let conn = self.target.connect_bounded(self.bounds).and_then(|mut c| {
                c.execute(&format!("LISTEN {}", self.target.channel()))
                    .map(|_| c)
                    .map_err(|e| e.to_string())
            });
            let Ok(mut conn) = conn else {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(self.backoff_max);
                continue;
            };
            backoff = BACKOFF_FIRST;
            // Whatever happened while it was not listening: a sweep now.
            let _ = wake.try_send(());
            while on.load(Ordering::Relaxed) {
                // Notifications that came with a statement's answer are queued already.
                match conn.notifications() {
                    Ok(notes) => {
                        if notes.iter().any(|n| n.payload != self.me) {
                            let _ = wake.try_send(());
                        }
                    }
                    Err(_) => break,
                }
                let last = self.beat.load(Ordering::Acquire);
                let now = crate::time::unix_ms();
                if last > 0 && now.saturating_sub(last) > period + period / 2 {
                    let beat = conn.query(
                        "UPDATE owners SET heartbeat_at = now() WHERE owner_id = $1",
                        &[Some(&self.me)],
                    );
                    match beat {
                        Ok(_) => self.beat.store(now, Ordering::Release),
                        Err(e) if e.connection_lost => break,
                        Err(e) => log::warn!("claim store: heartbeat not written: {e}"),
                    }
                }
                conn.wait(Duration::from_millis(period / 2));
                if !conn.is_ok() {
                    break;
                }
            }
            // Found lost: every other handle re-makes its connection before its next use.
            if on.load(Ordering::Relaxed) {
                self.target.lose();
            }
        }
    }
}

/// Takes over what the dead owner `dead` held, for `me` ([`sweep::take_over`]), unless it has
/// become live again since the sweep's read. Whether anything was taken.
fn take_over(
    c: &mut Conn,
    me: &Owner,
    dead: &str,
    now: Millis,
    ttl: &str,
    out: &mut Sweep,
) -> Result<bool, crate::pq::Error> {
    let alive = c.query(
        "SELECT 1 FROM owners WHERE owner_id = $1
           AND heartbeat_at >= now() - make_interval(secs => coalesce(ttl_ms / 1000.0, $2::double precision))",
        &[Some(dead), Some(ttl)],
    )?;
    let here = c.query(
        "SELECT hostname, pid::text AS pid, boot_id, pidns FROM owners WHERE owner_id = $1",
        &[Some(dead)],
    )?;
    let gone_here = !here.is_empty() && gone_from_here(&here, me);
    if !alive.is_empty() && !gone_here {
        return Ok(false);
    }
    sweep::take_over(&mut SweepTx { c, me }, dead, now, out)?;
    Ok(true)
}

/// A connection in a sweep's transaction, as this daemon's sweep queries it ([`sweep::Rows`]).
struct SweepTx<'a> {
    c: &'a mut Conn,
    me: &'a Owner,
}

/// The slot, record and token of each row of `rows` (`issue_id`, `slot`, `record`, `token`).
fn slots<T: serde::de::DeserializeOwned>(rows: &Rows) -> Vec<Taken<T>> {
    (0..rows.len())
        .map(|i| {
            let key = Key::new(
                text(rows, i, "issue_id"),
                text(rows, i, "slot").parse().unwrap_or(0),
            );
            let record = serde_json::from_str(text(rows, i, "record")).ok();
            let token = rows.get(i, "token").and_then(|t| t.parse().ok());
            (key, record, token)
        })
        .collect()
}

/// The records of `rows` (`record`, and `order` to sort them by), oldest first; those that
/// are no JSON are skipped.
fn in_order<T: serde::de::DeserializeOwned>(rows: &Rows, order: &str) -> Vec<T> {
    let mut records: Vec<(i64, T)> = (0..rows.len())
        .filter_map(|i| {
            let record = serde_json::from_str(text(rows, i, "record")).ok()?;
            Some((text(rows, i, order).parse().unwrap_or(0), record))
        })
        .collect();
    records.sort_by_key(|(n, _)| *n);
    records.into_iter().map(|(_, r)| r).collect()
}

impl sweep::Rows for SweepTx<'_> {
    type Error = crate::pq::Error;

    fn move_retries(&mut self, dead: &str) -> Result<Vec<Taken<Retry>>, Self::Error> {
        let rows = self.c.query(
            "UPDATE retries SET owner_id = $1, token = NULL WHERE owner_id = $2
             RETURNING issue_id, slot::text AS slot, record, token::text AS token",
            &[Some(&self.me.id), Some(dead)],
        )?;
        Ok(slots(&rows))
    }

    fn delete_claims(&mut self, dead: &str) -> Result<Vec<Taken<Running>>, Self::Error> {
        let rows = self.c.query(
            "DELETE FROM claims WHERE owner_id = $1 RETURNING issue_id, slot::text AS slot, record, token::text AS token",
            &[Some(dead)],
        )?;
        Ok(slots(&rows))
    }

    fn revoke(&mut self, token: Option<u64>) -> Result<(), Self::Error> {
        revoke(self.c, token.map(|t| t.to_string()).as_deref())
    }

    fn insert_retry(&mut self, key: &Key, retry: &Retry) -> Result<bool, Self::Error> {
        let slot = key.slot.to_string();
        let inserted = self.c.query(
            "INSERT INTO retries (issue_id, slot, owner_id, record) VALUES ($1, $2::integer, $3, $4) ON CONFLICT DO NOTHING",
            &[Some(&key.issue_id), Some(&slot), Some(&self.me.id), Some(&json(retry))],
        )?;
        Ok(inserted.affected == 1)
    }

    fn move_steering(&mut self, dead: &str) -> Result<Vec<Message>, Self::Error> {
        let rows = self.c.query(
            "UPDATE steering SET owner_id = $1 WHERE owner_id = $2 RETURNING record, seq",
            &[Some(&self.me.id), Some(dead)],
        )?;
        Ok(in_order(&rows, "seq"))
    }

    fn delete_cursors(&mut self, dead: &str) -> Result<Vec<(String, String)>, Self::Error> {
        let rows = self.c.query(
            "DELETE FROM cursors WHERE owner_id = $1 RETURNING source, cursor",
            &[Some(dead)],
        )?;
        Ok((0..rows.len())
            .map(|i| {
                let (source, cursor) = (text(&rows, i, "source"), text(&rows, i, "cursor"));
                (source.to_string(), cursor.to_string())
            })
            .collect())
    }

    fn cursor(&mut self, source: &str) -> Result<Option<String>, Self::Error> {
        let mine = self.c.query(
            "SELECT cursor FROM cursors WHERE owner_id = $1 AND source = $2",
            &[Some(&self.me.id), Some(source)],
        )?;
        Ok(mine.get(0, "cursor").map(str::to_string))
    }

    fn put_cursor(&mut self, source: &str, cursor: &str) -> Result<(), Self::Error> {
        self.c.query(
            "INSERT INTO cursors (owner_id, source, cursor) VALUES ($1, $2, $3)
             ON CONFLICT (owner_id, source) DO UPDATE SET cursor = EXCLUDED.cursor",
            &[Some(&self.me.id), Some(source), Some(cursor)],
        )?;
        Ok(())
    }

    fn move_relays(&mut self, dead: &str) -> Result<(), Self::Error> {
        self.c.query(
            "UPDATE relay SET to_owner = $1 WHERE to_owner = $2",
            &[Some(&self.me.id), Some(dead)],
        )?;
        Ok(())
    }

    fn take_relays(&mut self) -> Result<Vec<Relay>, Self::Error> {
        let rows = self.c.query(
            "DELETE FROM relay WHERE to_owner = $1 RETURNING id, record",
            &[Some(&self.me.id)],
        )?;
        Ok(in_order(&rows, "id"))
    }

    fn put_steer(&mut self, m: &Message) -> Result<(), Self::Error> {
        put_steer(self.c, &self.me.id, m)
    }
}

/// Whether the owner of the first row of `rows` (`hostname`, `pid`, `boot_id`, `pidns`) is a
/// process of this host, boot and PID namespace that is gone.
fn gone_from_here(rows: &Rows, me: &Owner) -> bool {
    let (boot, ns) = local_identity();
    boot.is_some()
        && ns.is_some()
        && text(rows, 0, "hostname") == me.hostname
        && rows.get(0, "boot_id") == boot.as_deref()
        && rows.get(0, "pidns") == ns.as_deref()
        && text(rows, 0, "pid")
            .parse()
            .is_ok_and(|p| !super::pid_alive(p))
}

/// A waiting steering message, held by `owner`.
fn put_steer(c: &mut Conn, owner: &str, m: &Message) -> Result<(), crate::pq::Error> {
    c.query(
        "INSERT INTO steering (key, owner_id, issue_id, record) VALUES ($1, $2, $3, $4)
         ON CONFLICT (key) DO UPDATE SET owner_id = EXCLUDED.owner_id, record = EXCLUDED.record",
        &[
            Some(&m.unique_key()),
            Some(owner),
            Some(&m.issue_id),
            Some(&json(m)),
        ],
    )?;
    Ok(())
}

/// Revokes a fencing token (text from a row): no write that carries it lands any more.
fn revoke(c: &mut Conn, token: Option<&str>) -> Result<(), crate::pq::Error> {
    let Some(token) = token.filter(|t| t.parse::<i64>().is_ok_and(|t| t > 0)) else {
        return Ok(());
    };
    c.query(
        "INSERT INTO revoked (token) VALUES ($1::bigint) ON CONFLICT DO NOTHING",
        &[Some(token)],
    )?;
    let kept = REVOKED_KEPT.to_string();
    c.query(
        "DELETE FROM revoked WHERE token <= (SELECT max(token) FROM revoked) - $1::bigint",
        &[Some(&kept)],
    )?;
    Ok(())
}

/// This host's boot (`/proc/sys/kernel/random/boot_id`) and this process's PID namespace
/// (`/proc/self/ns/pid`): a pid recorded by another owner means a process here only when both
/// agree. `None` where either cannot be read.
fn local_identity() -> (Option<String>, Option<String>) {
    static IDENTITY: std::sync::OnceLock<(Option<String>, Option<String>)> =
        std::sync::OnceLock::new();
    IDENTITY
        .get_or_init(|| {
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|b| b.trim().to_string())
                .filter(|b| !b.is_empty());
            let ns = std::fs::read_link("/proc/self/ns/pid")
                .ok()
                .map(|l| l.display().to_string());
            (boot, ns)
        })
        .clone()
}

/// A record as one JSON text.
fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests;
