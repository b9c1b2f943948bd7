//! The claim store: what a crash must not lose, behind one interface ([`ClaimStore`]), with one
//! file per kind. It keeps the runs in flight (claims: issue slot, run, owner), the pending
//! retries (attempt, due time, error, worker host), the finished runs (the last 50 are the
//! API's history) and steering (undelivered messages, taken keys, the sources' cursors).
//!
//! - `memory` ([`memory`]): held in this process only; nothing survives it, and no other daemon
//!   shares it (`SVC_CLAIM_STORE=memory`, a dry run, or a store that could not be opened).
//! - `sqlite` ([`sqlite`]): a file (WAL) beside the daemon's lock file
//!   (`~/.svc/daemon/<workflow>-<hash>.claims.db`), the default; `SVC_CLAIM_STORE` names
//!   another file.
//!
//! Several daemons may share a store whose kind says so (`shared_across_processes`): every
//! daemon is an owner with a heartbeat; a run starts only after its slot is claimed in one
//! transaction ([`Gate::acquire`], from the run's own thread); each daemon's store thread
//! ([`start_writer`]) heartbeats every second and sweeps: the claims and retries of an owner
//! whose heartbeat expired (or whose process is gone on this host) are taken over as retries,
//! and the slots other live owners hold are reported so they are never dispatched twice.
//!
//! The state thread never waits on it and knows nothing of it but [`Op`]s and [`Hydrated`]:
//! after each batch of events it diffs the state against what it last handed over and sends
//! the changes, as one transaction, to the store thread. `SVC_CLAIM_TTL_MS` sets how long a
//! silent owner keeps its claims (default 10 s).
//!
//! Every kind keeps the same tables: claims per issue slot with fencing tokens, pending
//! retries, run history, owners with heartbeats (the fleet view), steering messages and cursors
//! per owner, relayed requests, revoked tokens and released slots, durable tallies and marks,
//! the spend ledger, and agent kinds' cooldowns (per scope: the fleet's, or one host's; every
//! sweep reads back those in force this daemon shares). What a sweep decides (who is alive,
//! what a dead owner's rows become, what was relayed to this daemon) is written once
//! ([`sweep`]); a kind answers its queries.
//! A failed call is a [`StoreError`]: its [`Failure`] tells the store thread whether to send
//! the batch again (failed), report the store unavailable, or set the batch's writes aside one
//! by one (a write no retry can cure, [`Written::SetAside`]).
//!
//! A new kind is a new file: a type implementing [`ClaimStore`], its [`Kind`], and a
//! [`Config`] variant that `SVC_CLAIM_STORE` selects.

pub mod copy;
pub mod memory;
pub mod postgres;
pub mod sqlite;
mod sweep;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, unbounded};

pub use super::protocol::{Claim, Failure, Slot, StoreError};
use super::protocol::{
    ClaimGate, Holder, Key, Member, Relay, Retry, RetryKind, RunRecord, Running,
};

use super::protocol::{Cooldown, LedgerRow, Spent};

use crate::env::Env;
use crate::steering::Message;
use crate::time::Millis;

/// How long an owner may stay silent before others take its claims over.
pub const DEFAULT_TTL_MS: Millis = 10_000;
/// How often the store thread heartbeats and sweeps.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// The shortest claim TTL a daemon accepts: two heartbeats.
pub const MIN_TTL_MS: Millis = 2000;
/// A run taken over from a dead owner is retried this soon (the first poll reconciles first).
pub const TAKEOVER_DELAY_MS: Millis = 2000;
/// The latest a taken-over retry may come due, from now (longer than any backoff): a record is
/// outside input (another daemon's, a damaged file), and a due time past any backoff would park
/// the issue for ever.
pub const MAX_TAKEN_DUE_MS: Millis = 24 * 60 * 60 * 1000;
/// How many finished runs a store keeps (the newest).
pub const HISTORY_KEPT: usize = 1000;

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
    /// The rest of the batch is written only while this claim's fencing token stands (a run
    /// thread's writes: once another daemon took the claim over, nothing more of the run lands).
    Fence(u64),
    /// An operator's request for another daemon's issue, for that daemon to deliver.
    Relay(Box<Relay>),
    /// Adds to this daemon's line of the ledger `name` (never fenced: what was spent, was).
    Spend(String, Spent),
    /// An agent kind cools down until its reset (one row per scope and kind; a later one
    /// replaces it). Never fenced: the limit was met whoever holds the run now.
    PutCooldown(Box<Cooldown>),
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
            Op::Fence(_) => "fence",
            Op::Relay(_) => "relay",
            Op::Spend(..) => "spend",
            Op::PutCooldown(_) => "put_cooldown",
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
    /// What the fleet view shows of it: its workflow file, its HTTP API's URL, its start.
    pub workflow: String,
    pub url: Option<String>,
    pub started_at: Millis,
}

impl Owner {
    /// No daemon: the owner `svc store copy` opens stores as (it never sweeps or claims).
    pub fn nobody() -> Owner {
        Owner {
            id: String::new(),
            hostname: String::new(),
            pid: 0,
            ttl_ms: DEFAULT_TTL_MS,
            workflow: String::new(),
            url: None,
            started_at: 0,
        }
    }

    /// Its row in the fleet view.
    pub fn member(&self, running: u32, stale: bool) -> Member {
        Member {
            owner_id: self.id.clone(),
            hostname: self.hostname.clone(),
            pid: self.pid,
            workflow: self.workflow.clone(),
            url: self.url.clone(),
            started_at: self.started_at,
            running,
            stale,
        }
    }
}

/// How long a cooldown's row stays after its reset (then a later put deletes it).
pub const COOLDOWN_KEPT_MS: Millis = 24 * 60 * 60 * 1000;

/// One cooldown's row: one per scope key and kind. The scope key is `fleet` (every daemon of
/// the store shares it) or `host:<hostname>` (a kind whose account is each host's,
/// `cooldown_scope: host`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CooldownRow {
    pub scope_key: String,
    pub kind: String,
    pub until: Millis,
    pub since: Millis,
    pub reason: String,
}

impl CooldownRow {
    /// The row `c` is kept as, written by a daemon on `hostname`.
    pub fn of(c: &Cooldown, hostname: &str) -> CooldownRow {
        CooldownRow {
            scope_key: match c.scope.as_str() {
                "host" => format!("host:{hostname}"),
                _ => "fleet".into(),
            },
            kind: c.kind.clone(),
            until: c.until,
            since: c.since,
            reason: c.reason.clone(),
        }
    }

    /// The cooldown as a daemon on `hostname` shares it: scope `fleet`, or `host` for its own
    /// host's row; `None` for another host's.
    pub fn shared(&self, hostname: &str) -> Option<Cooldown> {
        let scope = match self.scope_key.strip_prefix("host:") {
            None if self.scope_key == "fleet" => "fleet",
            Some(host) if host == hostname => "host",
            _ => return None,
        };
        Some(Cooldown {
            kind: self.kind.clone(),
            until: self.until,
            since: self.since,
            reason: self.reason.clone(),
            scope: scope.into(),
        })
    }
}

/// What a sweep found: the slots other live owners hold, what this daemon took over, what
/// was relayed to it, and the fleet.
pub use super::protocol::Swept as Sweep;

/// How long a dead owner stays in the fleet view (flagged stale) after its heartbeat expired,
/// at least; what it held is taken over at once.
pub const STALE_SHOWN_MS: Millis = 60_000;

/// Which of two cursors of one steering source a daemon keeps when it takes over a dead one's:
/// the earlier of two times (what the dead daemon had not read yet is read again, and the
/// taken keys keep it from being delivered twice), else its own.
pub fn merge_cursor(mine: &str, theirs: &str) -> String {
    match (crate::time::parse_ms(mine), crate::time::parse_ms(theirs)) {
        (Some(a), Some(b)) if b < a => theirs.to_string(),
        _ => mine.to_string(),
    }
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

/// What a kind of store promises (the snapshot's `claim_store.capabilities`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Capabilities {
    /// What it held survives the daemon.
    pub crash_recovery: bool,
    /// Daemons may share it (runs claim their slot in one transaction).
    pub shared_across_processes: bool,
    /// Pending retries survive the daemon.
    pub retry_durability: bool,
}

/// A kind of store, as the snapshot names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    /// `claim_store.kind`.
    pub name: &'static str,
    pub capabilities: Capabilities,
    /// `daemon.leadership_store_kind`: what decides which daemon leads a workflow.
    pub leadership: &'static str,
}

/// The operations of a claim store, one connection (or handle) each. The store thread owns
/// one ([`start_writer`]); the run threads share another ([`Gate`]).
pub trait ClaimStore: Send {
    /// What kind of store this is.
    fn kind(&self) -> &'static Kind;

    /// Where it is, for messages (`claim store <where>: ...`).
    fn location(&self) -> String;

    /// Another handle on the same store, as the same owner (the run threads' [`Gate`]).
    fn reopen(&self) -> Result<Box<dyn ClaimStore>, StoreError>;

    /// Reads back what the store holds: the last `limit` finished runs, steering, and a first
    /// sweep (which registers this daemon as an owner).
    fn hydrate(&mut self, limit: usize, now: Millis) -> Result<Hydrated, StoreError>;

    /// The last `limit` finished runs, newest first.
    fn history(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError>;

    /// Heartbeats, takes over what dead owners held, and lists what live ones hold: one
    /// transaction.
    fn sweep(&mut self, now: Millis) -> Result<Sweep, StoreError>;

    /// Claims `key` for run `run` in one transaction: granted, with a new fencing token (larger
    /// than any before it), unless another live daemon holds the slot (running or retrying);
    /// what a dead one held is dropped and its token revoked.
    /// `seen_at` is when the tracker data the run was chosen from was read (this host's
    /// clock): a slot another daemon let go after that is [`Claim::Superseded`].
    fn acquire(
        &mut self,
        key: &Key,
        run: &Running,
        now: Millis,
        seen_at: Millis,
    ) -> Result<u64, Claim>;

    /// Applies a batch in one transaction; the history keeps its last [`HISTORY_KEPT`] runs.
    /// A run's record, a retry that carries a revoked claim token, and whatever follows an
    /// [`Op::Fence`] with a revoked token, are not written.
    fn apply(&mut self, ops: &[Op]) -> Result<(), StoreError>;

    /// [`ClaimStore::apply`] of this owner's batch number `batch` (never reused): a store whose
    /// COMMIT's answer can be lost (a server) applies a batch it applied already no second
    /// time, so it may be sent again whole after any failure. A local file applies it.
    fn apply_once(&mut self, batch: u64, ops: &[Op]) -> Result<(), StoreError> {
        let _ = batch;
        self.apply(ops)
    }

    /// A clean stop: this daemon is no owner any more, so the next sweep of any daemon (or the
    /// next start) takes its retries over at once.
    fn unregister(&mut self) -> Result<(), StoreError>;

    /// Hears of other daemons' changes as they happen and wakes the store thread (`wake`);
    /// a store without such news is swept every second only.
    fn listen(&mut self, _wake: Sender<()>) {}

    /// Adds each delta to its tally in one transaction; the new totals, in order (see
    /// [`crate::facts::Facts::add`]).
    fn add_tallies(&mut self, deltas: &[(String, f64)]) -> Result<Vec<f64>, StoreError>;

    /// The tallies whose names start with `prefix`.
    fn tallies(&mut self, prefix: &str) -> Result<Vec<(String, f64)>, StoreError>;

    /// Remembers `key` under `scope`, keeping the scope's newest `keep`; true when new.
    fn mark(&mut self, scope: &str, key: &str, keep: usize) -> Result<bool, StoreError>;

    /// The dollars of a ledger line, every daemon's (as committed now).
    fn line_cost(&mut self, line: &str) -> Result<f64, StoreError>;
}

/// The durable facts of [`crate::facts`] go through the runs' handle ([`Gate::facts`]): each
/// is one short transaction, like a claim, and a connection of their own cost every daemon
/// about 100 KiB and a database connection for nothing.
impl crate::facts::Facts for Gate {
    fn add(&self, deltas: &[(String, f64)]) -> Result<Vec<f64>, String> {
        self.store().add_tallies(deltas).map_err(|e| e.message)
    }

    fn tallies(&self, prefix: &str) -> Result<Vec<(String, f64)>, String> {
        self.store().tallies(prefix).map_err(|e| e.message)
    }

    fn mark(&self, scope: &str, key: &str, keep: usize) -> Result<bool, String> {
        self.store().mark(scope, key, keep).map_err(|e| e.message)
    }
}

/// The store `SVC_CLAIM_STORE` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Config {
    /// `memory`.
    Memory,
    /// A file: the variable's path, or beside the workflow's first lock file by default.
    Sqlite(PathBuf),
    /// A PostgreSQL connection URI (`postgres://` or `postgresql://`).
    Postgres(postgres::Target),
}

impl Config {
    /// `SVC_CLAIM_STORE`: `memory`, a path, or (unset) `<lock file>.claims.db` beside
    /// `base_lock`.
    pub fn from_env(env: &Env, base_lock: &Path) -> Result<Config, String> {
        Ok(match env.non_empty("SVC_CLAIM_STORE") {
            Some("memory") => Config::Memory,
            Some(uri) if crate::pq::is_uri(uri) => Config::Postgres(postgres::Target::parse(uri)?),
            Some(p) => Config::Sqlite(env.resolve_path(p)),
            None => Config::Sqlite(base_lock.with_extension("claims.db")),
        })
    }

    /// The part of the store `SVC_CLAIM_STORE` names that keeps workflow `name`'s records,
    /// in a daemon serving several workflows after the first: a SQLite file beside the named
    /// one (`claims.db` → `claims.<name>.db`), a PostgreSQL schema of its own
    /// (`<schema>_<name>`, lower-cased, other characters `_`).
    pub fn for_workflow(&self, name: &str) -> Config {
        match self {
            Config::Memory => Config::Memory,
            Config::Sqlite(path) => {
                let stem = path
                    .file_stem()
                    .map_or_else(|| "claims".into(), |s| s.to_string_lossy().into_owned());
                let file = match path.extension() {
                    Some(ext) => format!("{stem}.{name}.{}", ext.to_string_lossy()),
                    None => format!("{stem}.{name}"),
                };
                Config::Sqlite(path.with_file_name(file))
            }
            Config::Postgres(target) => {
                let mut target = target.clone();
                let suffix: String = name
                    .chars()
                    .map(|c| match c.to_ascii_lowercase() {
                        c @ ('a'..='z' | '0'..='9' | '_') => c,
                        _ => '_',
                    })
                    .collect();
                target.schema = format!("{}_{suffix}", target.schema);
                target.schema.truncate(63);
                Config::Postgres(target)
            }
        }
    }

    /// The kind it opens.
    pub fn kind(&self) -> &'static Kind {
        match self {
            Config::Memory => &memory::KIND,
            Config::Sqlite(_) => &sqlite::KIND,
            Config::Postgres(_) => &postgres::KIND,
        }
    }

    /// Opens the store as `owner`, reads back what it holds (`limit` finished runs at most),
    /// and opens the run threads' handle on it.
    pub fn open_and_hydrate(
        &self,
        owner: Owner,
        limit: usize,
        now: Millis,
    ) -> Result<Opened, StoreError> {
        let mut store = self.open(owner)?;
        let hydrated = store.hydrate(limit, now)?;
        let gate = Gate::new(store.reopen()?);
        Ok(Opened {
            store,
            gate,
            hydrated,
        })
    }

    /// Opens the store as `owner`; one that cannot be opened is an error naming it.
    pub fn open(&self, owner: Owner) -> Result<Box<dyn ClaimStore>, StoreError> {
        Ok(match self {
            Config::Memory => Box::new(memory::Memory::open(owner)),
            Config::Sqlite(path) => Box::new(sqlite::Sqlite::open(path, owner)?),
            Config::Postgres(target) => Box::new(postgres::Postgres::open(target, owner)?),
        })
    }
}

/// A store opened and read back.
pub struct Opened {
    /// The store thread's handle ([`start_writer`]).
    pub store: Box<dyn ClaimStore>,
    /// The run threads' handle.
    pub gate: Gate,
    /// What it held.
    pub hydrated: Hydrated,
}

/// What `svc store copy` moves between stores ([`copy`]).
/// One slot's row (a claim or a retry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRow {
    pub issue_id: String,
    pub slot: i64,
    pub owner_id: String,
    pub record: String,
    pub token: Option<i64>,
}

/// What a store holds that a move must not lose.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dump {
    pub claims: Vec<SlotRow>,
    pub retries: Vec<SlotRow>,
    /// Finished runs: id, end, record.
    pub runs: Vec<(String, i64, String)>,
    /// Waiting steering messages: key, owner, issue id, record (oldest first).
    pub steering: Vec<(String, String, String, String)>,
    /// Keys of steering messages taken (oldest first).
    pub seen: Vec<String>,
    /// Steering cursors: owner, source, cursor.
    pub cursors: Vec<(String, String, String)>,
    /// Durable tallies: name, value.
    pub tallies: Vec<(String, f64)>,
    /// Durable marks: scope, key (oldest first).
    pub marks: Vec<(String, String)>,
    /// The spend ledger: each daemon's lines.
    pub ledger: Vec<LedgerRow>,
    /// Agent kinds' cooldowns (those past their reset too: they do no harm).
    pub cooldowns: Vec<CooldownRow>,
}

impl Dump {
    /// The largest fencing token in it (the target's tokens go on above it).
    pub fn max_token(&self) -> i64 {
        self.claims
            .iter()
            .chain(&self.retries)
            .filter_map(|r| r.token)
            .max()
            .unwrap_or(0)
    }
}

/// Whether a process with this id exists on this host.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// The retry that replaces a run whose daemon died: the next attempt, soon.
pub fn retry_of_dead_run(run: &Running, owner: &str, now: Millis) -> Retry {
    let owner = if owner.is_empty() {
        "an earlier svc"
    } else {
        owner
    };
    Retry {
        slot: run.slot.clone(),
        attempt: run.attempt.unwrap_or(0).saturating_add(1),
        due_at: now + TAKEOVER_DELAY_MS,
        error: Some(format!(
            "{} {} ended with daemon {owner}",
            super::protocol::TAKEN_OVER,
            run.run_id
        )),
        kind: RetryKind::Failure,
        fetching: false,
        worker_id: run.worker_id.clone(),
        worker_host: run.worker_host.clone(),
        ssh: run.ssh.clone(),
        claim_token: None,
        previous: None,
    }
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
    /// The store cannot be reached (a server store's connection is down and re-made with
    /// backoff): nothing new is claimed until it is back.
    Unavailable(String),
    /// A write or sweep succeeded after a failure.
    Recovered,
    /// A write that failed for a reason a retry cannot cure was set aside (never blocking the
    /// writes behind it): which, and why.
    SetAside {
        op: &'static str,
        error: String,
    },
    /// A sweep found other owners' slots changed, took something over, was relayed a
    /// request, or saw the fleet change.
    Swept(Box<Sweep>),
}

impl Written {
    /// What a failed write or sweep reports.
    fn of(e: StoreError) -> Written {
        match e.kind {
            Failure::Unavailable => Written::Unavailable(e.message),
            Failure::Failed | Failure::ForGood | Failure::Locked => Written::Failed(e.message),
        }
    }
}

/// The run threads' side of the store ([`ClaimGate`]): a handle of their own, one claim at a
/// time.
pub struct Gate {
    store: std::sync::Mutex<Box<dyn ClaimStore>>,
}

impl Gate {
    pub fn new(store: Box<dyn ClaimStore>) -> Gate {
        Gate {
            store: std::sync::Mutex::new(store),
        }
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Box<dyn ClaimStore>> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The durable facts, through this handle, where the store outlives the daemon (the pool's
    /// worker-seconds, the marks of feedback and budget comments); `None` for one that does
    /// not, so each part keeps to its own memory.
    pub fn facts(self: &std::sync::Arc<Self>) -> Option<std::sync::Arc<dyn crate::facts::Facts>> {
        let durable = self.store().kind().capabilities.crash_recovery;
        durable.then(|| std::sync::Arc::clone(self) as std::sync::Arc<dyn crate::facts::Facts>)
    }

    fn apply(&self, ops: &[Op]) {
        let mut store = self.store();
        if let Err(e) = store.apply(ops) {
            // The state thread's record of the same follows through the store thread.
            log::warn!("claim store: a run's steering mark not written now: {e}");
        }
    }
}

impl ClaimGate for Gate {
    /// Claims a slot for a run about to start (see [`ClaimStore::acquire`]); the fencing token.
    /// With a daily budget (`daily_usd`), the budget may refuse first
    /// ([`super::ledger::day_refuses`]).
    fn acquire(
        &self,
        key: &Key,
        run: &Running,
        seen_at: Millis,
        daily_usd: Option<f64>,
    ) -> Result<u64, Claim> {
        let now = crate::time::unix_ms();
        let mut store = self.store();
        let refused = super::ledger::day_refuses(daily_usd, now, |line| store.line_cost(line));
        if let Some(reached) = refused {
            return Err(Claim::Budget(reached));
        }
        store.acquire(key, run, now, seen_at)
    }

    /// Marks steering messages delivered in the store now, from the run thread, before the
    /// prompt carrying them is written: a crash once the agent has them cannot bring them back
    /// for the next run (the state thread's own record of it follows, and agrees).
    fn delivered(&self, keys: &[String], token: Option<u64>) {
        let ops: Vec<Op> = token
            .map(Op::Fence)
            .into_iter()
            .chain(keys.iter().cloned().map(Op::DeleteSteer))
            .collect();
        self.apply(&ops);
    }

    /// Takes back [`Gate::delivered`]: the prompt could not be written, so the messages wait
    /// again.
    fn undelivered(&self, messages: &[crate::steering::Message], token: Option<u64>) {
        let ops: Vec<Op> = token
            .map(Op::Fence)
            .into_iter()
            .chain(messages.iter().map(|m| Op::PutSteer(Box::new(m.clone()))))
            .collect();
        self.apply(&ops);
    }
}

/// Starts the store thread: batches in, one transaction each; a heartbeat and sweep every
/// second; results back through `report`. Closing the sender ends it (after the last batch,
/// and unregistering this owner).
pub fn start_writer(
    mut store: Box<dyn ClaimStore>,
    mut foreign: BTreeMap<Key, Holder>,
    report: impl Fn(Written) + Send + 'static,
) -> Sender<Vec<Op>> {
    let (tx, rx): (Sender<Vec<Op>>, Receiver<Vec<Op>>) = unbounded();
    // A store that hears of other daemons' changes (PostgreSQL's LISTEN) wakes the sweep.
    let (wake_tx, mut wake_rx) = crossbeam_channel::bounded::<()>(1);
    store.listen(wake_tx);
    let _ = std::thread::Builder::new()
        .name("claim-store".into())
        .spawn(move || {
            // The batch being written: numbered, and sent again whole, as it is, until it is
            // written (a store applies a number once), while what comes meanwhile queues.
            let mut sending: Option<(u64, Vec<Op>)> = None;
            let mut queued: Vec<Op> = Vec::new();
            let mut numbers = 0u64;
            let mut last_sweep = std::time::Instant::now();
            let mut fleet: Vec<Member> = Vec::new();
            // The cooldowns the last sweep reported (each sweep reads them whole).
            let mut cooldowns: Vec<Cooldown> = Vec::new();
            // A write or sweep failed since the last that succeeded.
            let mut failed = false;
            loop {
                let wait = HEARTBEAT.saturating_sub(last_sweep.elapsed());
                let mut wake = false;
                let next = crossbeam_channel::select! {
                    recv(rx) -> batch => batch.ok(),
                    recv(wake_rx) -> woken => {
                        match woken {
                            Ok(()) => wake = true,
                            // No listener (any more): the timer alone.
                            Err(_) => wake_rx = crossbeam_channel::never(),
                        }
                        Some(Vec::new())
                    }
                    default(wait) => Some(Vec::new()),
                };
                let Some(batch) = next else {
                    if let Some((number, ops)) = sending.take() {
                        let _ = store.apply_once(number, &ops);
                    }
                    if !queued.is_empty() {
                        numbers += 1;
                        let _ = store.apply_once(numbers, &queued);
                    }
                    let _ = store.unregister();
                    return;
                };
                queued.extend(batch);
                while let Ok(more) = rx.try_recv() {
                    queued.extend(more);
                }
                loop {
                    if sending.is_none() && !queued.is_empty() {
                        numbers += 1;
                        sending = Some((numbers, std::mem::take(&mut queued)));
                    }
                    let Some((number, ops)) = &sending else {
                        break;
                    };
                    match store.apply_once(*number, ops) {
                        Ok(()) => {
                            if std::mem::take(&mut failed) {
                                report(Written::Recovered);
                            }
                            let last = ops.last().map_or("none", Op::name);
                            report(Written::Ok {
                                ops: ops.len(),
                                last,
                                at: crate::time::unix_ms(),
                            });
                            sending = None;
                        }
                        // Never cured by a retry: each write alone, and those that fail so
                        // are set aside and reported; nothing behind them waits.
                        Err(e) if e.kind == Failure::ForGood => {
                            let (_, ops) = sending.take().expect("matched above");
                            let mut ops = ops.into_iter();
                            while let Some(op) = ops.next() {
                                numbers += 1;
                                let one = std::slice::from_ref(&op);
                                match store.apply_once(numbers, one) {
                                    Ok(()) => {}
                                    Err(error) if error.kind == Failure::ForGood => {
                                        report(Written::SetAside {
                                            op: op.name(),
                                            error: error.message,
                                        });
                                    }
                                    // Another failure meanwhile: this write and those after it
                                    // go first next time, in their order.
                                    Err(_) => {
                                        let mut rest: Vec<Op> =
                                            std::iter::once(op).chain(ops).collect();
                                        rest.append(&mut queued);
                                        queued = rest;
                                        break;
                                    }
                                }
                            }
                        }
                        // Kept and sent again: nothing is dropped while the store is away.
                        Err(e) => {
                            failed = true;
                            report(Written::of(e));
                            break;
                        }
                    }
                }
                if wake || last_sweep.elapsed() >= HEARTBEAT {
                    last_sweep = std::time::Instant::now();
                    match store.sweep(crate::time::unix_ms()) {
                        Ok(mut sweep) => {
                            if std::mem::take(&mut failed) {
                                report(Written::Recovered);
                            }
                            if sweep.fleet.as_ref() == Some(&fleet) {
                                sweep.fleet = None;
                            } else if let Some(f) = &sweep.fleet {
                                fleet.clone_from(f);
                            }
                            let news = sweep.foreign != foreign
                                || !sweep.taken_over.is_empty()
                                || !sweep.steering.is_empty()
                                || !sweep.cursors.is_empty()
                                || !sweep.relayed.is_empty()
                                || !sweep.runs.is_empty()
                                || !sweep.ledger.is_empty()
                                || sweep.fleet.is_some()
                                || sweep.cooldowns != cooldowns;
                            if news {
                                foreign.clone_from(&sweep.foreign);
                                cooldowns.clone_from(&sweep.cooldowns);
                                report(Written::Swept(Box::new(sweep)));
                            }
                        }
                        Err(e) => {
                            failed = true;
                            report(Written::of(e));
                        }
                    }
                }
            }
        });
    tx
}

#[cfg(test)]
mod tests {
    //! What every kind promises, checked against each.

    use super::*;
    use crate::orchestrator::protocol::{Outcome, Tokens};
    use crate::orchestrator::testutil::issue;
    use crate::steering::Message;

    pub(super) fn running(id: &str) -> Running {
        Running {
            run_id: format!("run-{id}"),
            slot: Slot {
                issue: issue(id, "Todo", &[]),
                slot_index: 0,
                ensemble_size: 1,
                workspace_path: PathBuf::from("/w").join(id),
            },
            attempt: Some(2),
            agent_kind: "demo".into(),
            started_at: 5,
            last_event_at: 6,
            last_event: None,
            last_message: None,
            session_id: None,
            turn_count: 1,
            pid: None,
            tokens: Tokens::default(),
            cost_usd: Some(0.5),
            cost_other: None,
            stall_timeout_ms: 0,
            stopping: None,
            reserving: false,
            worker_id: Some("w-1".into()),
            worker_host: None,
            ssh: None,
            steering_turns: 0,
            last_steering: None,
            steering_pending: Vec::new(),
            claim_token: None,
            ledgered: Spent::default(),
        }
    }

    pub(super) fn owner(id: &str) -> Owner {
        Owner {
            id: id.into(),
            hostname: "test-host".into(),
            pid: std::process::id(),
            ttl_ms: 1000,
            workflow: "W.md".into(),
            url: None,
            started_at: 1,
        }
    }

    pub(super) fn key(id: &str) -> Key {
        Key::new(id, 0)
    }

    type Open = Box<dyn Fn(&str) -> Box<dyn ClaimStore>>;
    type OpenAs = Box<dyn Fn(Owner) -> Box<dyn ClaimStore>>;

    /// Each kind, as a way to open one store of it as a given owner id (`name` names its file).
    fn kinds(name: &str) -> Vec<(&'static str, Open)> {
        kinds_as(name)
            .into_iter()
            .map(|(kind, open)| {
                let open: Open = Box::new(move |id: &str| open(owner(id)));
                (kind, open)
            })
            .collect()
    }

    /// [`kinds`], each opened as a given owner (another host's, say).
    fn kinds_as(name: &str) -> Vec<(&'static str, OpenAs)> {
        let first = memory::Memory::open(owner("first"));
        let dir = std::env::temp_dir().join(format!("svc-claims-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("c.db");
        let mut kinds: Vec<(&'static str, OpenAs)> = vec![
            (
                "memory",
                Box::new(move |o: Owner| -> Box<dyn ClaimStore> { Box::new(first.beside(o)) }),
            ),
            (
                "sqlite",
                Box::new(move |o: Owner| -> Box<dyn ClaimStore> {
                    Box::new(sqlite::Sqlite::open(&path, o).unwrap())
                }),
            ),
        ];
        if let Some(server) = crate::pg_server::PgServer::shared() {
            let uri = server.new_database(name);
            let target = postgres::Target::parse(&uri).unwrap();
            kinds.push((
                "postgres",
                Box::new(move |o: Owner| -> Box<dyn ClaimStore> {
                    Box::new(postgres::Postgres::open(&target, o).unwrap())
                }),
            ));
        }
        kinds
    }

    pub(super) fn cooldown(kind: &str, scope: &str, since: Millis, until: Millis) -> Cooldown {
        Cooldown {
            kind: kind.into(),
            until,
            since,
            reason: format!("HTTP 429 on {kind}"),
            scope: scope.into(),
        }
    }

    /// What a sweep shares of the cooldowns: (kind, scope, until), by kind.
    fn shared(s: &mut Box<dyn ClaimStore>, now: Millis) -> Vec<(String, String, Millis)> {
        s.sweep(now)
            .unwrap()
            .cooldowns
            .iter()
            .map(|c| (c.kind.clone(), c.scope.clone(), c.until))
            .collect()
    }

    fn row(kind: &str, scope: &str, until: Millis) -> (String, String, Millis) {
        (kind.into(), scope.into(), until)
    }

    /// A cooldown of scope `fleet` reaches every daemon of the store; one of scope `host` the
    /// daemons of its host only (each host its own row); the later of two resets stands; a
    /// cooldown past its reset is no sweep's; and a daemon started later reads them back.
    #[test]
    fn cooldowns_are_shared_by_the_fleet_or_by_one_host_until_their_reset() {
        let t0 = crate::time::unix_ms();
        for (kind, open) in kinds_as("cooldowns") {
            let elsewhere = |id: &str| Owner {
                hostname: "other-host".into(),
                ..owner(id)
            };
            let mut a = open(owner("a"));
            let mut b = open(owner("b"));
            let mut c = open(elsewhere("c"));
            let put = |s: &mut Box<dyn ClaimStore>, c: Cooldown| {
                s.apply(&[Op::PutCooldown(Box::new(c))]).unwrap()
            };
            put(&mut a, cooldown("claude", "fleet", t0, t0 + 60_000));
            put(&mut a, cooldown("codex", "host", t0, t0 + 60_000));
            put(&mut a, cooldown("brief", "fleet", t0, t0 + 50));
            let both = [
                row("claude", "fleet", t0 + 60_000),
                row("codex", "host", t0 + 60_000),
            ];
            assert_eq!(shared(&mut a, t0 + 100), both, "{kind}: its own");
            assert_eq!(shared(&mut b, t0 + 100), both, "{kind}: same host");
            assert_eq!(
                shared(&mut c, t0 + 100),
                [row("claude", "fleet", t0 + 60_000)],
                "{kind}: another host shares the fleet's only"
            );
            let whole = b.sweep(t0 + 100).unwrap().cooldowns;
            assert_eq!(
                whole[0],
                cooldown("claude", "fleet", t0, t0 + 60_000),
                "{kind}: since and reason come back"
            );
            // Of two daemons' resets the later stands, whichever writes last.
            put(&mut b, cooldown("claude", "fleet", t0 + 10, t0 + 120_000));
            put(&mut c, cooldown("claude", "fleet", t0 + 20, t0 + 90_000));
            // Another host's cooldown of a host-scoped kind is a row of its own.
            put(&mut c, cooldown("codex", "host", t0 + 20, t0 + 30_000));
            assert_eq!(
                shared(&mut a, t0 + 200),
                [
                    row("claude", "fleet", t0 + 120_000),
                    row("codex", "host", t0 + 60_000)
                ],
                "{kind}"
            );
            assert_eq!(
                shared(&mut c, t0 + 200),
                [
                    row("claude", "fleet", t0 + 120_000),
                    row("codex", "host", t0 + 30_000)
                ],
                "{kind}"
            );
            // Read back by a daemon started later (a restart): its first sweep brings them.
            drop((a, b));
            let h = open(owner("a-again")).hydrate(10, t0 + 300).unwrap();
            let back: Vec<_> = h
                .sweep
                .cooldowns
                .iter()
                .map(|c| (c.kind.clone(), c.scope.clone(), c.until))
                .collect();
            assert_eq!(
                back,
                [
                    row("claude", "fleet", t0 + 120_000),
                    row("codex", "host", t0 + 60_000)
                ],
                "{kind}"
            );
            // Past its reset, a cooldown is no sweep's.
            assert_eq!(
                shared(&mut c, t0 + 60_000),
                [row("claude", "fleet", t0 + 120_000)],
                "{kind}"
            );
            assert!(shared(&mut c, t0 + 120_000).is_empty(), "{kind}");
        }
    }

    /// A write the server can never take (a value out of range) is set aside and reported,
    /// and the writes of its batch and those behind it land: nothing jams the store thread.
    #[test]
    fn a_write_that_can_never_succeed_is_set_aside_and_blocks_nothing() {
        let Some(server) = crate::pg_server::PgServer::shared() else {
            return;
        };
        let target = postgres::Target::parse(&server.new_database("aside")).unwrap();
        let store = postgres::Postgres::open(&target, owner("w")).unwrap();
        let (tx, rx) = unbounded();
        let writer = start_writer(Box::new(store), BTreeMap::new(), move |w| {
            let _ = tx.send(w);
        });
        let record = |id: &str| {
            Op::PutRun(Box::new(RunRecord {
                run: running(id),
                outcome: Outcome::Success,
                failure_reason: None,
                ended_at: 7,
            }))
        };
        let huge = Spent {
            input_tokens: u64::MAX,
            ..Spent::default()
        };
        writer
            .send(vec![
                record("A-1"),
                Op::Spend("issue:A-1".into(), huge),
                record("A-2"),
            ])
            .unwrap();
        writer.send(vec![record("A-3")]).unwrap();
        let mut aside = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut reader = postgres::Postgres::open(&target, owner("r")).unwrap();
        loop {
            while let Ok(w) = rx.try_recv() {
                if let Written::SetAside { op, error } = w {
                    aside.push((op, error));
                }
            }
            if reader.history(10).unwrap().len() == 3 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the runs did not land"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        while let Ok(w) = rx.try_recv() {
            if let Written::SetAside { op, error } = w {
                aside.push((op, error));
            }
        }
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert_eq!(aside[0].0, "spend");
        assert!(aside[0].1.contains("SQLSTATE 22003"), "{aside:?}");
        assert_eq!(reader.line_cost("issue:A-1").unwrap(), 0.0);
        drop(writer);
    }

    /// Lets `ms` pass where the store judges heartbeats by its own clock (PostgreSQL's); the
    /// others take the `now` each call is given.
    fn pass(kind: &str, ms: u64) {
        if kind == "postgres" {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }

    #[test]
    fn what_a_stopped_daemon_left_is_taken_over_by_the_next() {
        for (kind, open) in kinds("reopen") {
            let mut s = open("one");
            s.sweep(100).unwrap();
            let retry = Retry {
                slot: Slot {
                    issue: issue("A-1", "Todo", &[]),
                    slot_index: 0,
                    ensemble_size: 1,
                    workspace_path: "/w/A-1".into(),
                },
                attempt: 3,
                due_at: 123_456,
                error: Some("boom".into()),
                kind: RetryKind::Failure,
                fetching: true,
                worker_id: Some("w-2".into()),
                worker_host: Some("h".into()),
                ssh: None,
                claim_token: None,
                previous: None,
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
            let mut s = open("two");
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
            assert_eq!(h.history[0].run.slot.issue.identifier, "C-1");
            assert!(h.sweep.foreign.is_empty());
            // Taken over once: the retries are this owner's now, and a third sees them as foreign.
            assert!(s.sweep(300).unwrap().taken_over.is_empty());
            let mut third = open("three");
            let seen = third.sweep(300).unwrap();
            assert!(seen.taken_over.is_empty());
            assert_eq!(seen.foreign.len(), 2, "{kind}");
        }
    }

    /// `svc store copy` takes the cooldowns along, rows of every host, and a copy keeps the
    /// later of two resets.
    #[test]
    fn a_store_copy_keeps_the_cooldowns() {
        let t0 = crate::time::unix_ms();
        let dir = std::env::temp_dir().join(format!("svc-claims-copy-cd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (from, to) = (dir.join("from.db"), dir.join("to.db"));
        let elsewhere = Owner {
            hostname: "other-host".into(),
            ..owner("c")
        };
        let mut here = sqlite::Sqlite::open(&from, owner("a")).unwrap();
        let mut there = sqlite::Sqlite::open(&from, elsewhere.clone()).unwrap();
        here.apply(&[
            Op::PutCooldown(Box::new(cooldown("claude", "fleet", t0, t0 + 60_000))),
            Op::PutCooldown(Box::new(cooldown("codex", "host", t0, t0 + 60_000))),
        ])
        .unwrap();
        there
            .apply(&[Op::PutCooldown(Box::new(cooldown(
                "codex",
                "host",
                t0,
                t0 + 30_000,
            )))])
            .unwrap();
        let mut old = sqlite::Sqlite::open(&to, owner("b")).unwrap();
        old.apply(&[Op::PutCooldown(Box::new(cooldown(
            "claude",
            "fleet",
            t0,
            t0 + 90_000,
        )))])
        .unwrap();
        drop((here, there, old));
        let mut targets = vec![to.display().to_string()];
        if let Some(server) = crate::pg_server::PgServer::shared() {
            targets.push(server.new_database("copy_cooldowns"));
        }
        let env = Env::from_pairs(vec![("HOME", "/h")], &dir);
        for target in targets {
            let said = copy::run(&from.display().to_string(), &target, &env).unwrap();
            assert!(said.contains(" 3 agent cooldowns"), "{said}");
            let config = Config::from_env(
                &Env::from_pairs(vec![("SVC_CLAIM_STORE", target.as_str())], &dir),
                Path::new("/x.lock"),
            )
            .unwrap();
            let mut s = config.open(owner("d")).unwrap();
            let mut other = config.open(elsewhere.clone()).unwrap();
            let claude = if target.ends_with(".db") {
                t0 + 90_000
            } else {
                t0 + 60_000
            };
            assert_eq!(
                shared(&mut s, t0 + 100),
                [
                    row("claude", "fleet", claude),
                    row("codex", "host", t0 + 60_000)
                ],
                "{target}"
            );
            assert_eq!(
                shared(&mut other, t0 + 100),
                [
                    row("claude", "fleet", claude),
                    row("codex", "host", t0 + 30_000)
                ],
                "{target}"
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn tallies_and_marks_are_shared_by_every_daemon_on_the_store_and_outlive_them() {
        for (kind, open) in kinds("facts") {
            let a = Gate::new(open("a"));
            let b = Gate::new(open("b"));
            use crate::facts::Facts;
            let add = |f: &Gate, n: &str, v: f64| f.add(&[(n.to_string(), v)]).unwrap()[0];
            assert_eq!(add(&a, "workers/lifetime_ms", 1500.0), 1500.0, "{kind}");
            assert_eq!(add(&b, "workers/lifetime_ms", 250.5), 1750.5, "{kind}");
            let both = a
                .add(&[("workers/day/9/ms".into(), 7.0), ("other".into(), 1.0)])
                .unwrap();
            assert_eq!(both, [7.0, 1.0], "{kind}");
            assert_eq!(
                b.tallies("workers/").unwrap(),
                [
                    ("workers/day/9/ms".to_string(), 7.0),
                    ("workers/lifetime_ms".to_string(), 1750.5)
                ],
                "{kind}: only the prefix, by name"
            );
            // A mark is new once, whichever daemon makes it; each scope keeps its newest.
            assert!(a.mark("rework github:x", "1 k1", 2).unwrap(), "{kind}");
            assert!(!b.mark("rework github:x", "1 k1", 2).unwrap(), "{kind}");
            assert!(b.mark("rework gitlab:y", "1 k1", 2).unwrap(), "{kind}");
            assert!(a.mark("rework github:x", "1 k2", 2).unwrap(), "{kind}");
            assert!(a.mark("rework github:x", "1 k3", 2).unwrap(), "{kind}");
            assert!(
                a.mark("rework github:x", "1 k1", 2).unwrap(),
                "{kind}: the oldest of the scope was let go"
            );
            assert!(!a.mark("rework github:x", "1 k3", 2).unwrap(), "{kind}");
            drop((a, b));
            if kind != "memory" {
                let c = Gate::new(open("c"));
                assert_eq!(add(&c, "workers/lifetime_ms", 0.0), 1750.5, "{kind}");
                assert!(!c.mark("rework gitlab:y", "1 k1", 2).unwrap(), "{kind}");
            }
        }
    }

    #[test]
    fn each_daemon_adds_to_its_own_ledger_lines_and_sweeps_bring_the_others_whole() {
        for (kind, open) in kinds("ledger") {
            let mut a = open("a");
            let mut b = open("b");
            a.sweep(1000).unwrap();
            b.sweep(1000).unwrap();
            let usd = |cost_usd: f64, runs: u64| Spent {
                total_tokens: 10,
                cost_usd,
                runs,
                ..Spent::default()
            };
            a.apply(&[Op::Spend("day:2026-11-26".into(), usd(0.25, 1))])
                .unwrap();
            a.apply(&[Op::Spend("day:2026-11-26".into(), usd(0.5, 0))])
                .unwrap();
            b.apply(&[Op::Spend("day:2026-11-26".into(), usd(1.0, 1))])
                .unwrap();
            let seen = b.sweep(1100).unwrap().ledger;
            assert_eq!(seen.len(), 1, "{kind}: only the others' lines");
            assert_eq!(
                (seen[0].owner.as_str(), seen[0].spent),
                (
                    "a",
                    Spent {
                        total_tokens: 20,
                        cost_usd: 0.75,
                        runs: 1,
                        ..Spent::default()
                    }
                ),
                "{kind}: whole"
            );
            // A line read again (PostgreSQL reads the recent ones with an overlap) is the same
            // whole line: taking it in again replaces it, never adds.
            let again = b.sweep(1200).unwrap().ledger;
            assert!(again.iter().all(|l| seen.contains(l)), "{kind}: {again:?}");
            a.apply(&[Op::Spend("issue:A-1".into(), usd(2.0, 1))])
                .unwrap();
            let again = b.sweep(1300).unwrap().ledger;
            let changed: Vec<&LedgerRow> = again.iter().filter(|l| !seen.contains(l)).collect();
            assert_eq!(changed.len(), 1, "{kind}: the changed line: {again:?}");
            assert_eq!(changed[0].name, "issue:A-1");
            assert_eq!(b.line_cost("day:2026-11-26").unwrap(), 1.75, "{kind}");
            // A daemon starting later sees every line at its first sweep.
            let mut c = open("c");
            assert_eq!(c.sweep(1400).unwrap().ledger.len(), 3, "{kind}");
        }
    }

    #[test]
    fn a_slot_held_by_a_live_owner_is_refused_and_one_of_an_expired_owner_is_granted() {
        for (kind, open) in kinds("acquire") {
            let mut a = open("a");
            let mut b = open("b");
            a.sweep(1000).unwrap();
            b.sweep(1000).unwrap();
            a.acquire(&key("id-X"), &running("X"), 1000, 0).unwrap();
            assert_eq!(
                b.acquire(&key("id-X"), &running("X"), 1001, 0),
                Err(Claim::Held("a".into()))
            );
            // Another slot of the same issue is free.
            b.acquire(&Key::new("id-X", 1), &running("X"), 1001, 0)
                .unwrap();
            assert!(b.sweep(1002).unwrap().foreign.contains_key(&key("id-X")));
            // Once a's heartbeat is older than the ttl, b takes its run over as a retry.
            pass(kind, 1300);
            let swept = b.sweep(2500).unwrap();
            assert!(swept.foreign.is_empty(), "{kind}: {swept:?}");
            assert_eq!(swept.taken_over.len(), 1);
            assert_eq!(swept.taken_over[0].0, key("id-X"));
            // a, back from its pause, finds the slot another's.
            assert!(a.sweep(2600).unwrap().foreign.contains_key(&key("id-X")));
            // A claim of a dead owner does not stop a run: it is dropped.
            let mut c = open("c");
            c.acquire(&key("id-Y"), &running("Y"), 3000, 0).unwrap();
            c.unregister().unwrap();
            a.acquire(&key("id-Y"), &running("Y"), 3001, 0).unwrap();
            assert_eq!(a.kind().name, kind);
        }
    }

    /// A run that could not claim its slot (the store away) becomes a retry in its daemon's
    /// state; written once the store is back, it must not land on the slot another daemon
    /// runs, whose sweep would take it for a takeover and stop a live run.
    #[test]
    fn a_retry_never_lands_on_a_slot_another_daemon_runs() {
        for (kind, open) in kinds("retry-on-claim") {
            let mut a = open("a");
            let mut b = open("b");
            a.sweep(1000).unwrap();
            b.sweep(1000).unwrap();
            b.acquire(&key("id-X"), &running("X"), 1000, 0).unwrap();
            a.apply(&[Op::PutRetry(
                key("id-X"),
                Box::new(retry_of_dead_run(&running("X"), "", 1000)),
            )])
            .unwrap();
            assert!(
                !b.sweep(1001).unwrap().foreign.contains_key(&key("id-X")),
                "{kind}"
            );
            // a sees the slot b's, and so drops its retry; its own slot's retry is written.
            assert_eq!(
                a.sweep(1001).unwrap().foreign[&key("id-X")].owner,
                "b",
                "{kind}"
            );
            a.apply(&[Op::PutRetry(
                key("id-Y"),
                Box::new(retry_of_dead_run(&running("Y"), "", 1000)),
            )])
            .unwrap();
            assert!(
                b.sweep(1002).unwrap().foreign.contains_key(&key("id-Y")),
                "{kind}"
            );
        }
    }

    #[test]
    fn steering_and_history_are_read_back_in_order_and_within_their_caps() {
        for (kind, open) in kinds("steering") {
            let mut s = open("one");
            let message = |n: usize| Message {
                issue_id: "id-A".into(),
                source: crate::steering::Source::Api,
                author: "op".into(),
                text: format!("text {n}"),
                at: "2025-01-01T00:00:00Z".into(),
                key: format!("m{n}"),
            };
            let mut ops: Vec<Op> = (0..3).map(|n| Op::PutSteer(Box::new(message(n)))).collect();
            ops.push(Op::DeleteSteer(message(1).unique_key()));
            ops.push(Op::PutSeen(vec!["k1".into(), "k2".into()]));
            ops.push(Op::PutSeen(vec!["k2".into(), "k3".into()]));
            ops.push(Op::PutCursor("board".into(), "c1".into()));
            ops.push(Op::PutCursor("board".into(), "c2".into()));
            for n in 0..(HISTORY_KEPT + 5) {
                ops.push(Op::PutRun(Box::new(RunRecord {
                    run: running(&format!("R-{n}")),
                    outcome: Outcome::Success,
                    failure_reason: None,
                    ended_at: 10 + n as Millis,
                })));
            }
            s.apply(&ops).unwrap();
            let h = open("two").hydrate(3, 50).unwrap();
            let keys: Vec<String> = h.steering.iter().map(Message::unique_key).collect();
            assert_eq!(
                keys,
                [message(0).unique_key(), message(2).unique_key()],
                "{kind}"
            );
            assert_eq!(h.steering_seen, ["k1", "k2", "k3"], "{kind}");
            assert_eq!(h.steering_cursors["board"], "c2", "{kind}");
            let ids: Vec<&str> = h
                .history
                .iter()
                .map(|r| r.run.slot.issue.identifier.as_str())
                .collect();
            let newest = HISTORY_KEPT + 4;
            assert_eq!(
                ids,
                [newest, newest - 1, newest - 2].map(|n| format!("R-{n}")),
                "{kind}"
            );
            assert_eq!(
                h.history[0].run.cost_usd,
                Some(0.5),
                "{kind}: the cost survives"
            );
            assert_eq!(s.history(usize::MAX).unwrap().len(), HISTORY_KEPT, "{kind}");
        }
    }

    fn message(owner: &str, n: usize) -> Message {
        Message {
            issue_id: format!("id-{owner}"),
            source: crate::steering::Source::Api,
            author: "op".into(),
            text: format!("text {n}"),
            at: "2025-01-01T00:00:00Z".into(),
            key: format!("{owner}-m{n}"),
        }
    }

    #[test]
    fn a_claim_taken_over_fences_every_later_write_of_its_run() {
        for (kind, open) in kinds("fence") {
            let mut a = open("a");
            let mut b = open("b");
            a.sweep(1000).unwrap();
            b.sweep(1000).unwrap();
            let first = a.acquire(&key("id-F"), &running("F"), 1000, 0).unwrap();
            let second = a.acquire(&key("id-G"), &running("G"), 1000, 0).unwrap();
            assert!(second > first, "{kind}: tokens only grow");
            // a is silent past the ttl: b takes its runs over.
            pass(kind, 1300);
            let swept = b.sweep(2500).unwrap();
            assert_eq!(swept.taken_over.len(), 2, "{kind}");
            // a comes back: its run's end, its retry and its steering marks are refused.
            let mut run = running("F");
            run.claim_token = Some(first);
            let mut retry = retry_of_dead_run(&run, "a", 2600);
            retry.claim_token = Some(first);
            a.apply(&[
                Op::PutRun(Box::new(RunRecord {
                    run: run.clone(),
                    outcome: crate::orchestrator::protocol::Outcome::Failed,
                    failure_reason: None,
                    ended_at: 2600,
                })),
                Op::PutRetry(Key::new("id-Z", 0), Box::new(retry)),
                Op::Fence(first),
                Op::PutSteer(Box::new(message("late", 1))),
            ])
            .unwrap();
            assert!(a.history(10).unwrap().is_empty(), "{kind}");
            let h = open("a").hydrate(10, 2700).unwrap();
            assert!(h.steering.is_empty(), "{kind}: {:?}", h.steering);
            let seen = b.sweep(2700).unwrap();
            assert!(
                !seen.foreign.contains_key(&Key::new("id-Z", 0)),
                "{kind}: the late retry landed"
            );
            // A token that stands writes as before.
            let third = b.acquire(&key("id-H"), &running("H"), 2700, 0).unwrap();
            assert!(third > second, "{kind}");
            b.apply(&[Op::Fence(third), Op::PutSteer(Box::new(message("b", 1)))])
                .unwrap();
        }
    }

    #[test]
    fn steering_belongs_to_its_daemon_until_that_daemon_dies() {
        for (kind, open) in kinds("owned-steering") {
            let mut a = open("a");
            let mut b = open("b");
            a.sweep(1000).unwrap();
            b.sweep(1000).unwrap();
            a.apply(&[
                Op::PutSteer(Box::new(message("a", 1))),
                Op::PutCursor("github:x".into(), "2025-01-01T00:00:10Z".into()),
            ])
            .unwrap();
            b.apply(&[
                Op::PutSteer(Box::new(message("b", 1))),
                Op::PutCursor("github:x".into(), "2025-01-01T00:00:20Z".into()),
                Op::PutCursor("board".into(), "b-board".into()),
            ])
            .unwrap();
            // Each daemon reads back its own messages and cursors only.
            let mut b2 = open("b");
            let h = b2.hydrate(1, 1001).unwrap();
            let keys: Vec<String> = h.steering.iter().map(|m| m.key.clone()).collect();
            assert_eq!(keys, ["b-m1"], "{kind}");
            assert_eq!(
                h.steering_cursors["github:x"], "2025-01-01T00:00:20Z",
                "{kind}"
            );
            // a dies: b takes its message over, and keeps the earlier of the two time cursors.
            pass(kind, 1300);
            let swept = b.sweep(2500).unwrap();
            let keys: Vec<String> = swept.steering.iter().map(|m| m.key.clone()).collect();
            assert_eq!(keys, ["a-m1"], "{kind}");
            assert_eq!(swept.cursors["github:x"], "2025-01-01T00:00:10Z", "{kind}");
            let h = open("b").hydrate(1, 2501).unwrap();
            assert_eq!(h.steering.len(), 2, "{kind}");
            assert_eq!(h.steering_cursors["board"], "b-board", "{kind}");
        }
    }

    #[test]
    fn a_relayed_request_is_delivered_once_by_the_holder_and_the_fleet_is_listed() {
        use crate::orchestrator::protocol::{Relay, Relayed};
        for (kind, open) in kinds("relay") {
            let mut a = open("a");
            let mut b = open("b");
            a.sweep(1000).unwrap();
            b.sweep(1000).unwrap();
            b.acquire(&key("id-R"), &running("R"), 1000, 0).unwrap();
            let seen = a.sweep(1001).unwrap();
            assert_eq!(seen.foreign[&key("id-R")].owner, "b", "{kind}");
            assert_eq!(seen.foreign[&key("id-R")].identifier, "R", "{kind}");
            let fleet = seen.fleet.unwrap();
            let running_of = |id: &str| {
                fleet
                    .iter()
                    .find(|m| m.owner_id == id)
                    .map(|m| (m.running, m.stale))
            };
            assert_eq!(running_of("a"), Some((0, false)), "{kind}: {fleet:?}");
            assert_eq!(fleet.len(), 2, "{kind}");
            let relay = |what| Relay {
                to_owner: "b".into(),
                issue_id: "id-R".into(),
                identifier: "R".into(),
                what,
            };
            a.apply(&[
                Op::Relay(Box::new(relay(Relayed::Steer(message("R", 1))))),
                Op::Relay(Box::new(relay(Relayed::Cancel))),
            ])
            .unwrap();
            let got = b.sweep(1002).unwrap().relayed;
            assert_eq!(got.len(), 2, "{kind}");
            assert!(
                b.sweep(1003).unwrap().relayed.is_empty(),
                "{kind}: delivered once"
            );
            // The relayed message waits in the store as b's until b delivers it.
            let h = open("b").hydrate(1, 1004).unwrap();
            assert_eq!(h.steering.len(), 1, "{kind}");
            // b dies: the fleet shows it stale while what it held is taken over.
            pass(kind, 1300);
            let fleet = a.sweep(2500).unwrap().fleet.unwrap();
            let b_row = fleet.iter().find(|m| m.owner_id == "b").unwrap();
            assert!(b_row.stale, "{kind}: {fleet:?}");
        }
    }

    #[test]
    fn the_configured_store_follows_svc_claim_store() {
        let base = Path::new("/d/W-abc.lock");
        let env = |v: Option<&str>| {
            let mut pairs = vec![("HOME", "/h")];
            pairs.extend(v.map(|v| ("SVC_CLAIM_STORE", v)));
            Env::from_pairs(pairs, Path::new("/cwd"))
        };
        assert_eq!(
            Config::from_env(&env(Some("memory")), base),
            Ok(Config::Memory)
        );
        assert_eq!(
            Config::from_env(&env(None), base),
            Ok(Config::Sqlite("/d/W-abc.claims.db".into()))
        );
        assert_eq!(
            Config::from_env(&env(Some("rel/c.db")), base),
            Ok(Config::Sqlite("/cwd/rel/c.db".into()))
        );
        let pg = Config::from_env(
            &env(Some(
                "postgresql://u:pw@db:5433/x?sslmode=require&schema=team_a",
            )),
            base,
        )
        .unwrap();
        assert_eq!(pg.kind().name, "postgres");
        let Config::Postgres(target) = pg else {
            unreachable!()
        };
        assert_eq!(target.schema, "team_a");
        assert_eq!(
            target.shown(),
            "postgresql://u:***@db:5433/x?sslmode=require (schema team_a)"
        );
        let bad = Config::from_env(&env(Some("postgres://u:pw@db/x?schema=Robert;drop")), base);
        assert!(
            bad.as_ref()
                .is_err_and(|e| e.contains("schema") && !e.contains("pw")),
            "{bad:?}"
        );
        assert_eq!(Config::Memory.kind().name, "memory");
        assert!(!Config::Memory.kind().capabilities.shared_across_processes);
        assert!(
            Config::Sqlite("/x".into())
                .kind()
                .capabilities
                .shared_across_processes
        );
    }
}
