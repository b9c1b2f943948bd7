//! The state thread, the only owner of [`State`]: it takes events from every other thread over
//! one channel, answers control requests, feeds the rest to the machine, executes the effects
//! (spawning run threads, asking the poller, removing workspaces), hands the claim store what
//! changed and publishes a snapshot. It never blocks on I/O itself.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};

use super::panic_text;
use super::poller::{Loaded, PollJob, Poller, current_tracker};
use super::protocol;
use super::protocol::{Effect, Event, Key};
use super::snapshot::{self, DaemonInfo, SnapshotHub};
use super::state::{self, State};
use super::store;
use crate::agent::run::{self, Control, McpEndpoint, RunContext};
use crate::config::Settings;
use crate::env::Env;
use crate::hooks::{self, Hook, HookRun};
use crate::time::Millis;
use crate::time::unix_ms;
use crate::trace::TraceSink;
use crate::tracker::{self, Tracker};
use crate::workers::service::PoolHandle;
use crate::workspace;

/// Fewest milliseconds between two snapshot publications under a burst of events.
const PUBLISH_EVERY_MS: Millis = 100;
/// Fewest milliseconds between two publications when only agents' activity changed (their
/// last event, message tail and tokens): the terminal dashboard refreshes at this pace, and
/// building a snapshot for each activity report was most of this thread's work while agents
/// stream.
const PUBLISH_ACTIVITY_EVERY_MS: Millis = 250;
/// How long the state thread gathers activity reports after the first of a burst.
const GATHER: Duration = Duration::from_millis(20);
/// How long a graceful stop may take: every child gets SIGTERM when it begins and SIGKILL after
/// [`crate::process::KILL_GRACE`]; a second more lets the run threads report their ends. Past
/// this the state thread exits whatever is left.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(6);
/// Least time between two returns of freed heap memory to the system ([`trim_heap`]).
const TRIM_EVERY: Duration = Duration::from_secs(5);

/// Hands each run the MCP endpoint and a token (the server provides it once it exists).
pub type McpProvider = Arc<dyn Fn(&Settings, &str) -> Option<McpEndpoint> + Send + Sync>;

/// The state thread.
pub struct Runtime {
    /// The workflows served, the first on the daemon's own inbox; never empty.
    units: Vec<Unit>,
    /// The daemon's inbox: daemon-wide events (signals, control requests, timers, the pool,
    /// webhooks) and the first workflow's.
    pub events_tx: Sender<Event>,
    events_rx: Receiver<Event>,
    /// Live runs of every workflow (run ids are unique in the daemon).
    runs: HashMap<String, Sender<Control>>,
    trace: TraceSink,
    env: Arc<Env>,
    hub: Arc<SnapshotHub>,
    daemon: DaemonInfo,
    mcp: Option<McpProvider>,
    seen_issues: Option<Sender<tracker::Issue>>,
    pool: Option<PoolHandle>,
    remote_mcp: Option<run::RemoteMcp>,
    webhooks: Option<Arc<crate::webhook::Stats>>,
    mode: protocol::Mode,
    /// Runs started so far, daemon-wide: the clock fair sharing orders workflows by.
    starts: u64,
    /// The daemon-wide limits over every workflow (the `daemon` section).
    limits: DaemonLimits,
    /// Workflows that could not start: name, file, why.
    failed: Vec<(Arc<str>, PathBuf, String)>,
    /// Looks for workflow files added to or removed from a directory given.
    rescan: Option<Rescan>,
    last_rescan: Instant,
    /// The workflows as the HTTP server knows them.
    served: Option<Served>,
    shutdown_started: Option<Instant>,
    /// When freed heap memory was last returned to the system; `None` until a run ends.
    trimmed: Option<Instant>,
    /// A run ended since then.
    trim_due: bool,
}

/// One workflow the state thread serves: its state machine, its poller, its claim store and
/// what was handed to the store of it.
struct Unit {
    name: Arc<str>,
    path: PathBuf,
    state: State,
    /// Where this workflow's threads (poller, runs, store, removals) report.
    tx: Sender<Event>,
    /// Its own inbox; `None` for the first workflow, which reports on the daemon's.
    rx: Option<Receiver<Event>>,
    poll_tx: Sender<PollJob>,
    loaded: Arc<Mutex<Loaded>>,
    persisted: Persisted,
    /// Where its runs claim their slot.
    gate: Arc<store::Gate>,
    /// Where its runs trace.
    trace: TraceSink,
    /// The last `--dry-run` report printed (a poll that decides the same prints nothing).
    last_dry_run: Option<Vec<protocol::Decision>>,
    /// `Runtime::starts` at its last run start (0: none yet): fair sharing's tie-break.
    last_start: u64,
    /// When its last poll ended, and why it failed.
    last_poll_at: Option<Millis>,
    poll_error: Option<String>,
    /// Why its file's last reload failed (it runs on its last good settings).
    reload_error: Option<String>,
    /// The cooldowns in force its claim store held at start, handed to its state as a sweep's
    /// before any other event ([`Runtime::take_held_cooldowns`]).
    held_cooldowns: Vec<protocol::Cooldown>,
    /// What it holds while it is served (its lock file), dropped with it.
    _holds: Option<Box<dyn std::any::Any>>,
}

impl Unit {
    /// Its file is gone and its last run ended: it leaves the views.
    fn gone(&self) -> bool {
        self.state.retired && self.state.running.is_empty() && self.state.removing.is_empty()
    }

    /// It waits for daemon-wide room: its last dispatch held candidates back for it.
    fn waits_for_room(&self) -> bool {
        self.state
            .blocked
            .iter()
            .any(|b| b.reason == protocol::BlockedReason::DaemonConcurrencyCap)
    }
}

pub struct RuntimeParts {
    pub loaded: Arc<Mutex<Loaded>>,
    pub trace: TraceSink,
    pub env: Arc<Env>,
    pub daemon: DaemonInfo,
    pub mcp: Option<McpProvider>,
    /// Issues that runs start on go to the issue store's writer.
    pub seen_issues: Option<Sender<tracker::Issue>>,
    /// The state thread's inbox; the daemon makes it first so other parts can report into it.
    pub events: (Sender<Event>, Receiver<Event>),
    /// The worker pool runs acquire their slots from.
    pub pool: Option<PoolHandle>,
    /// The MCP endpoint of runs on remote workers (claims, tunnels).
    pub remote_mcp: Option<run::RemoteMcp>,
    /// `--once` / `--dry-run`.
    pub mode: protocol::Mode,
    /// The claim store (of whichever kind).
    pub store: StoreParts,
    /// What the webhook listener answered (`None`: no `server.webhook_port`), read into each
    /// snapshot; the listener counts into it without waiting for this thread.
    pub webhooks: Option<Arc<crate::webhook::Stats>>,
    /// The first workflow's name and file.
    pub name: Arc<str>,
    pub path: PathBuf,
    /// The daemon-wide limits over every workflow.
    pub limits: DaemonLimits,
}

/// The daemon-wide limits over every workflow it serves (the `daemon` section).
#[derive(Clone, Copy, Debug, Default)]
pub struct DaemonLimits {
    /// `daemon.max_concurrent_agents`.
    pub max_concurrent_agents: Option<usize>,
    /// `daemon.daily_budget_usd`.
    pub daily_budget_usd: Option<f64>,
}

/// Another workflow of the daemon: what [`Runtime::add_workflow`] takes.
pub struct WorkflowParts {
    pub name: Arc<str>,
    pub path: PathBuf,
    pub poller: Poller,
    pub loaded: Arc<Mutex<Loaded>>,
    /// Its inbox, made before its claim store so the store thread can report into it.
    pub events: (Sender<Event>, Receiver<Event>),
    pub store: StoreParts,
    /// What it holds while it is served (its lock file).
    pub holds: Box<dyn std::any::Any>,
}

/// What a look at the command line's workflow files found: workflows to serve from now on
/// (none of the names it was given), the names the files have now (a served workflow not among
/// them is retired, a retired one among them served again), and the files that do not load,
/// with why.
pub struct Rescanned {
    pub added: Vec<WorkflowParts>,
    pub present: std::collections::BTreeSet<String>,
    pub failed: Vec<(Arc<str>, PathBuf, String)>,
}

/// Looks at the workflow files again, given the names served now (see [`Rescanned`]).
pub type Rescan = Box<dyn FnMut(&[Arc<str>]) -> Rescanned>;

pub use super::poller::Served;

/// How often the workflow files are looked at again for added and removed ones.
const RESCAN_EVERY: Duration = Duration::from_secs(1);

/// The claim store as the runtime uses it: all the state thread knows of it are the
/// operations it sends and what the store held at start.
pub struct StoreParts {
    /// The store thread's inbox.
    pub tx: Sender<Vec<store::Op>>,
    /// What it held at start.
    pub hydrated: store::Hydrated,
    /// Where runs claim their slot before they start.
    pub gate: Arc<store::Gate>,
}

/// What the state thread last handed the claim store, to write only what changed.
struct Persisted {
    tx: Sender<Vec<store::Op>>,
    retries: std::collections::BTreeMap<Key, (u32, Millis, Option<String>)>,
    /// The claims written, with the run holding each.
    claims: std::collections::BTreeMap<Key, String>,
    /// The newest run of the history already written.
    last_run: Option<String>,
    /// Undelivered steering messages written (unique keys).
    steering: std::collections::BTreeSet<String>,
    /// The newest accepted steering key written.
    last_seen: Option<String>,
    /// Steering cursors written.
    cursors: std::collections::BTreeMap<String, String>,
    /// `Inbox::version` when steering was last written.
    steering_version: u64,
    /// The cooldowns written (kind -> its reset): one whose reset moved is written again.
    cooldowns: std::collections::BTreeMap<String, Millis>,
}

impl Persisted {
    /// What the store holds at start, as the state read it back: only what changes from here
    /// on is written.
    fn read_back(state: &State, tx: Sender<Vec<store::Op>>) -> Persisted {
        // The first sweep made the taken-over retries this daemon's in the store.
        let retries = state
            .retries
            .iter()
            .map(|(k, r)| (k.clone(), (r.attempt, r.due_at, r.error.clone())))
            .collect();
        Persisted {
            tx,
            retries,
            claims: Default::default(),
            last_run: state.history.front().map(|r| r.run.run_id.clone()),
            steering: state
                .undelivered_steering()
                .map(|m| m.unique_key())
                .collect(),
            last_seen: state.steering.last_taken().cloned(),
            cursors: state.steering.cursors().clone(),
            steering_version: state.steering.version(),
            // Those taken from the store are written back once, which changes nothing there
            // (the store keeps the later reset).
            cooldowns: Default::default(),
        }
    }
}

/// Where a batch's event came from: the daemon's inbox, or a workflow's own.
#[derive(Clone, Copy)]
enum From {
    Daemon,
    Workflow(usize),
}

/// What a unit is made of ([`WorkflowParts`], its inbox optional: the first workflow's is the
/// daemon's).
struct UnitParts {
    name: Arc<str>,
    path: PathBuf,
    poller: Poller,
    loaded: Arc<Mutex<Loaded>>,
    events: (Sender<Event>, Option<Receiver<Event>>),
    store: StoreParts,
}

/// Starts a workflow's poller thread and its state with what its claim store held.
fn unit(parts: UnitParts, mode: protocol::Mode, trace: TraceSink) -> Unit {
    let UnitParts {
        name,
        path,
        poller,
        loaded,
        events,
        store,
    } = parts;
    let (poll_tx, poll_rx) = unbounded();
    let poll_events = events.0.clone();
    std::thread::Builder::new()
        .name(if events.1.is_some() {
            format!("poller-{name}")
        } else {
            "poller".into()
        })
        .spawn(move || poller.run(poll_rx, poll_events))
        .expect("spawning the poller");
    let settings = Arc::clone(&loaded.lock().unwrap_or_else(|p| p.into_inner()).settings);
    let now = unix_ms();
    let mut state = State::new(settings, now);
    state.mode = mode;
    // What the store holds now: the retries read back (unchanged until they change) and
    // the claims of the last daemon (taken over as retries, so the first diff writes those
    // retries and deletes the claims).
    let StoreParts { tx, hydrated, gate } = store;
    let held_cooldowns = hydrate(&mut state, hydrated, now);
    // Before the first poll job: the sources carry on where they were.
    let _ = poll_tx.send(PollJob::SteeringCursors(state.steering.cursors().clone()));
    let persisted = Persisted::read_back(&state, tx);
    Unit {
        name,
        path,
        state,
        tx: events.0,
        rx: events.1,
        poll_tx,
        loaded,
        persisted,
        gate,
        trace,
        last_dry_run: None,
        last_start: 0,
        last_poll_at: None,
        poll_error: None,
        reload_error: None,
        held_cooldowns,
        _holds: None,
    }
}

impl Runtime {
    /// Wires the state thread to the first workflow's poller thread. Returns the runtime and
    /// the snapshot hub.
    pub fn new(parts: RuntimeParts, poller: Poller) -> (Runtime, Arc<SnapshotHub>) {
        let (events_tx, events_rx) = parts.events;
        let first = unit(
            UnitParts {
                name: parts.name,
                path: parts.path,
                poller,
                loaded: parts.loaded,
                events: (events_tx.clone(), None),
                store: parts.store,
            },
            parts.mode,
            parts.trace.clone(),
        );
        let hub = Arc::new(SnapshotHub::new(snapshot::build(
            &first.state,
            &parts.daemon,
            unix_ms(),
            None,
        )));
        let rt = Runtime {
            units: vec![first],
            events_tx,
            events_rx,
            runs: HashMap::new(),
            trace: parts.trace,
            env: parts.env,
            hub: Arc::clone(&hub),
            daemon: parts.daemon,
            mcp: parts.mcp,
            seen_issues: parts.seen_issues,
            pool: parts.pool,
            remote_mcp: parts.remote_mcp,
            webhooks: parts.webhooks,
            mode: parts.mode,
            starts: 0,
            limits: parts.limits,
            failed: Vec::new(),
            rescan: None,
            // The first look comes at once: it starts the workflows after the first.
            last_rescan: Instant::now() - RESCAN_EVERY,
            served: None,
            shutdown_started: None,
            trimmed: None,
            trim_due: false,
        };
        (rt, hub)
    }

    /// Serves another workflow (before [`Runtime::run`]): its poller thread starts now. With
    /// more than one, every workflow's state carries its name.
    pub fn add_workflow(&mut self, parts: WorkflowParts) {
        let (tx, rx) = parts.events;
        let mut added = unit(
            UnitParts {
                name: parts.name,
                path: parts.path,
                poller: parts.poller,
                loaded: parts.loaded,
                events: (tx, Some(rx)),
                store: parts.store,
            },
            self.mode,
            self.trace.clone(),
        );
        added._holds = Some(parts.holds);
        if let Some(served) = &self.served {
            served
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .push((Arc::clone(&added.name), Arc::clone(&added.loaded)));
        }
        self.units.push(added);
        for u in &mut self.units {
            u.state.workflow = Some(Arc::clone(&u.name));
            u.trace = self.trace.within(&u.name);
        }
    }

    /// Looks at the workflow files again every second with `rescan`: added files are served,
    /// removed ones retired; `served` is kept current for the HTTP server.
    pub fn watch(&mut self, rescan: Rescan, served: Served) {
        self.rescan = Some(rescan);
        self.served = Some(served);
    }

    /// Serves what was added since the last look and retires what was removed; a retired
    /// workflow whose last run ended is dropped (the first stays, hidden: its threads report
    /// on the daemon's inbox).
    fn look_again(&mut self) -> bool {
        let mut changed = false;
        if self.last_rescan.elapsed() >= RESCAN_EVERY
            && self.shutdown_started.is_none()
            && let Some(rescan) = &mut self.rescan
        {
            self.last_rescan = Instant::now();
            let served: Vec<Arc<str>> = self.units.iter().map(|u| Arc::clone(&u.name)).collect();
            let found = rescan(&served);
            changed |= found.failed != self.failed;
            self.failed = found.failed;
            for parts in found.added {
                log::info!("workflow {} ({}) added", parts.name, parts.path.display());
                self.add_workflow(parts);
                changed = true;
            }
            for u in &mut self.units {
                if u.state.retired && found.present.contains(&*u.name) {
                    // Its file is back before it left: served again as it was.
                    log::info!("workflow {} is back ({})", u.name, u.path.display());
                    u.state.retired = false;
                    changed = true;
                }
                if !u.state.retired && !found.present.contains(&*u.name) {
                    log::info!(
                        "workflow {} removed ({} gone): its {} run(s) finish, nothing new starts",
                        u.name,
                        u.path.display(),
                        u.state.running.len()
                    );
                    u.state.retired = true;
                    // Its retries stay in the claim store for a later start.
                    u.state.retries.clear();
                    u.persisted.retries.clear();
                    u.state.blocked.clear();
                    u.state.waiting.clear();
                    changed = true;
                }
            }
        }
        for u in &mut self.units {
            if u.state.retired {
                // A run that ended leaves no retry behind.
                u.state.retries.clear();
                u.persisted.retries.clear();
            }
        }
        let before = self.units.len();
        let mut i = 1;
        while i < self.units.len() {
            if self.units[i].gone() {
                let u = self.units.remove(i);
                log::info!("workflow {} left the daemon", u.name);
                if let Some(served) = &self.served {
                    served
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .retain(|(name, _)| *name != u.name);
                }
            } else {
                i += 1;
            }
        }
        changed || self.units.len() != before
    }

    /// The exit code: the worst of the workflows'.
    fn exit_code(&self) -> u8 {
        self.units
            .iter()
            .map(|u| u.state.exit_code)
            .max()
            .unwrap_or(0)
    }

    /// Waits up to `timeout` for the next event on any inbox, then takes what else is
    /// queued (at most 512 events). `None`: the daemon's inbox closed.
    fn next_batch(&self, timeout: Duration) -> Option<Vec<(From, Event)>> {
        let mut select = crossbeam_channel::Select::new();
        select.recv(&self.events_rx);
        let inboxes: Vec<(usize, &Receiver<Event>)> = self
            .units
            .iter()
            .enumerate()
            .filter_map(|(i, u)| u.rx.as_ref().map(|rx| (i, rx)))
            .collect();
        for (_, rx) in &inboxes {
            select.recv(rx);
        }
        let first = match select.select_timeout(timeout) {
            Err(_) => (From::Daemon, Event::Tick),
            Ok(op) if op.index() == 0 => match op.recv(&self.events_rx) {
                Ok(e) => (From::Daemon, e),
                Err(_) => return None,
            },
            Ok(op) => {
                let (i, rx) = inboxes[op.index() - 1];
                match op.recv(rx) {
                    Ok(e) => (From::Workflow(i), e),
                    Err(_) => (From::Daemon, Event::Tick),
                }
            }
        };
        // Agents' activity reports come all the time and change only what views show:
        // gathering them for a moment wakes this thread far less often. Anything else is
        // handled at once.
        if let Event::Run {
            msg: protocol::RunMsg::Activity { .. } | protocol::RunMsg::Usage(_),
            ..
        } = &first.1
        {
            std::thread::sleep(GATHER);
        }
        // Handle a burst of queued events before publishing once.
        let mut batch = vec![first];
        while batch.len() < 512 {
            match self.events_rx.try_recv() {
                Ok(e) => batch.push((From::Daemon, e)),
                Err(_) => break,
            }
        }
        for (i, rx) in inboxes {
            while batch.len() < 512 {
                match rx.try_recv() {
                    Ok(e) => batch.push((From::Workflow(i), e)),
                    Err(_) => break,
                }
            }
        }
        Some(batch)
    }

    /// Runs until every run has ended after a shutdown (or, with `--once`, after the runs of
    /// the one dispatch); returns the exit code.
    pub fn run(mut self) -> u8 {
        let mut last_publish: Millis = 0;
        // Something changed that is to be published within PUBLISH_EVERY_MS.
        let mut dirty = true;
        // Only agents' activity changed since the last publication.
        let mut active = false;
        loop {
            let now = unix_ms();
            let mut wake = self
                .units
                .iter()
                .filter_map(|u| u.state.next_deadline())
                .min()
                .unwrap_or(now + 1000)
                .min(now + 1000);
            if dirty {
                wake = wake.min(last_publish + PUBLISH_EVERY_MS);
            } else if active {
                wake = wake.min(last_publish + PUBLISH_ACTIVITY_EVERY_MS);
            }
            if let Some(started) = self.shutdown_started {
                let left = SHUTDOWN_DEADLINE.saturating_sub(started.elapsed());
                wake = wake.min(now + left.as_millis() as Millis + 1);
            }
            let timeout = Duration::from_millis(wake.saturating_sub(now));
            let Some(mut batch) = self.next_batch(timeout) else {
                return self.exit_code();
            };
            // Before anything from their inboxes (their first poll's report among it).
            batch.splice(0..0, self.take_held_cooldowns());
            let mut exit = false;
            for (from, event) in batch {
                if matches!(event, Event::Shutdown) && self.shutdown_started.is_none() {
                    self.shutdown_started = Some(Instant::now());
                    crate::notify::stopping();
                    // Every hook and bridge ends within the grace; none starts anew.
                    crate::process::stop_all();
                }
                if let Event::Run {
                    run_id,
                    msg: protocol::RunMsg::Exited(_),
                } = &event
                {
                    self.runs.remove(run_id);
                    self.trim_due = true;
                }
                // A control route's request is answered from this state, now.
                let (to, event) = match (from, event) {
                    (From::Daemon, Event::Asked(ask)) => match self.answer(ask) {
                        Some(routed) => routed,
                        None => continue,
                    },
                    (From::Daemon, Event::WebhookWakeOf(names)) => {
                        for i in 0..self.units.len() {
                            if names.iter().any(|n| **n == *self.units[i].name) {
                                let (changed, _, quit) = self.hand(i, Event::WebhookWake);
                                dirty |= changed;
                                exit |= quit;
                            }
                        }
                        continue;
                    }
                    (From::Workflow(i), event) => (Some(i), event),
                    (From::Daemon, event) if daemon_wide(&event) => (None, event),
                    (From::Daemon, event) => (Some(0), event),
                };
                if let (Some(0), Event::Reloaded(settings), Some(pool)) = (to, &event, &self.pool) {
                    pool.reload(Arc::clone(settings));
                }
                let targets = match to {
                    Some(i) => i..i + 1,
                    None => 0..self.units.len(),
                };
                for i in targets {
                    let (changed, activity, quit) = self.hand(i, event.clone());
                    exit |= quit;
                    if changed {
                        if activity {
                            active = true;
                        } else {
                            dirty = true;
                        }
                    }
                }
            }
            if self.look_again() {
                dirty = true;
            }
            if self.share_room() {
                dirty = true;
            }
            for i in 0..self.units.len() {
                self.persist(i);
            }
            if self.trim_due && self.trimmed.is_none_or(|t| t.elapsed() >= TRIM_EVERY) {
                trim_heap();
                self.trimmed = Some(Instant::now());
                self.trim_due = false;
            }
            if let Some(started) = self.shutdown_started
                && started.elapsed() > SHUTDOWN_DEADLINE
            {
                log::error!(
                    "stopping took longer than {} s; killing every child and exiting",
                    SHUTDOWN_DEADLINE.as_secs()
                );
                crate::process::kill_work();
                exit = true;
            }
            let now = unix_ms();
            if exit
                || (dirty && now >= last_publish + PUBLISH_EVERY_MS)
                || (active && now >= last_publish + PUBLISH_ACTIVITY_EVERY_MS)
                || now >= last_publish + 1000
            {
                self.publish(now, active && !dirty);
                last_publish = now;
                dirty = false;
                active = false;
            }
            if exit {
                return self.exit_code();
            }
        }
    }

    /// The cooldowns each new workflow's claim store held at start, as events for its state to
    /// take before any from its inbox: no run starts on a kind that cools down.
    fn take_held_cooldowns(&mut self) -> Vec<(From, Event)> {
        let mut events = Vec::new();
        for (i, u) in self.units.iter_mut().enumerate() {
            let held = std::mem::take(&mut u.held_cooldowns);
            if !held.is_empty() {
                events.push((From::Workflow(i), held_cooldowns(&u.state, held)));
            }
        }
        events
    }

    /// Hands `event` to workflow `i`'s state under the daemon-wide limits as they stand, and
    /// executes what it decides. Returns whether something changed, whether only agents'
    /// activity did, and whether the daemon is to exit (every workflow is done).
    fn hand(&mut self, i: usize, event: Event) -> (bool, bool, bool) {
        let is_tick = matches!(event, Event::Tick);
        let is_activity = matches!(
            event,
            Event::Run {
                msg: protocol::RunMsg::Activity { .. } | protocol::RunMsg::Usage(_),
                ..
            }
        );
        let now = unix_ms();
        match &event {
            Event::PollDone(report) => {
                let u = &mut self.units[i];
                u.last_poll_at = Some(now);
                u.poll_error = report
                    .candidates
                    .as_ref()
                    .err()
                    .or(report.refreshed.as_ref().err())
                    .cloned();
            }
            Event::ReloadFailed(why) => self.units[i].reload_error = Some(why.clone()),
            Event::Reloaded(_) => self.units[i].reload_error = None,
            _ => {}
        }
        let shared = self.shared_for(i, now);
        let several = self.units.len() > 1;
        let state = &mut self.units[i].state;
        state.shared = shared;
        let cooling_before = several.then(|| cooling_mark(state));
        let effects = state::handle(state, now, event);
        // A kind's account is the daemon's: a limit one workflow met holds for the others.
        if several && Some(cooling_mark(&self.units[i].state)) != cooling_before {
            let found: Vec<protocol::Cooldown> =
                self.units[i].state.cooldowns.values().cloned().collect();
            for (j, other) in self.units.iter_mut().enumerate() {
                if j != i {
                    state::adopt_cooldowns(&mut other.state, now, found.clone());
                }
            }
        }
        let changed = !is_tick || !effects.is_empty();
        let activity = is_activity && effects.is_empty();
        let mut exit = false;
        for effect in effects {
            exit |= self.execute(i, effect);
        }
        (changed, activity, exit)
    }

    /// The daemon-wide limits for workflow `i` now: the other workflows' runs, its fair share
    /// of the free room under `daemon.max_concurrent_agents`, and whether
    /// `daemon.daily_budget_usd` is spent.
    fn shared_for(&self, i: usize, now: Millis) -> state::Shared {
        let daemon = &self.limits;
        let running: usize = self.units.iter().map(|u| u.state.running.len()).sum();
        let me = &self.units[i];
        let room = daemon.max_concurrent_agents.map(|cap| {
            let free = cap.saturating_sub(running);
            // Each workflow waiting for room that is owed a turn before this one (fewer
            // runs, or as many and its last start longer ago) keeps one free slot for it.
            let owed = self
                .units
                .iter()
                .enumerate()
                .filter(|&(j, u)| j != i && u.waits_for_room() && ahead(u, me))
                .count();
            free.saturating_sub(owed)
        });
        let budget_reached = daemon.daily_budget_usd.is_some_and(|max| {
            let line = super::ledger::day_line(now);
            let spent: f64 = self
                .units
                .iter()
                .map(|u| u.state.ledger.line(&line).cost_usd)
                .sum();
            spent >= max
        });
        state::Shared {
            others_running: running - me.state.running.len(),
            room,
            budget_reached,
        }
    }

    /// Gives freed daemon-wide room to the workflows waiting for it, the one owed most first
    /// (fewest runs, then the longest since its last start). Returns whether one started.
    fn share_room(&mut self) -> bool {
        if self.limits.max_concurrent_agents.is_none() || self.units.len() < 2 {
            return false;
        }
        let mut any = false;
        loop {
            let mut waiting: Vec<usize> = (0..self.units.len())
                .filter(|&i| self.units[i].waits_for_room())
                .collect();
            waiting.sort_by_key(|&i| (self.units[i].state.running.len(), self.units[i].last_start));
            let Some(&first) = waiting.first() else {
                return any;
            };
            let before = self.starts;
            if self.shared_for(first, unix_ms()).room == Some(0) {
                return any;
            }
            self.hand(first, Event::Room);
            if self.starts == before {
                return any;
            }
            any = true;
        }
    }
}

/// Whether workflow `u` is owed daemon-wide room before `me`: it runs fewer, or as many and
/// started its last run longer ago.
fn ahead(u: &Unit, me: &Unit) -> bool {
    (u.state.running.len(), u.last_start) < (me.state.running.len(), me.last_start)
}

/// Events on the daemon's inbox that every workflow takes.
fn daemon_wide(event: &Event) -> bool {
    matches!(
        event,
        Event::Shutdown | Event::Tick | Event::WebhookWake | Event::Pool(_) | Event::Refresh
    )
}

impl Runtime {
    /// Hands workflow `i`'s claim store what changed since the last call: new finished runs,
    /// retries added, changed or gone, runs started or ended. A stop keeps the pending
    /// retries.
    fn persist(&mut self, i: usize) {
        let unit = &mut self.units[i];
        let relays = std::mem::take(&mut unit.state.relay_out);
        let spends = unit.state.ledger.take_unsent();
        let p = &mut unit.persisted;
        let state = &unit.state;
        let mut ops = Vec::new();
        let new_runs: Vec<&protocol::RunRecord> = state
            .history
            .iter()
            .take_while(|r| Some(&r.run.run_id) != p.last_run.as_ref())
            .collect();
        for r in new_runs.into_iter().rev() {
            // Another daemon's run, seen in the store: it is there already.
            if !state.fleet_runs.contains(&r.run.run_id) {
                ops.push(store::Op::PutRun(Box::new(r.clone())));
            }
        }
        p.last_run = state.history.front().map(|r| r.run.run_id.clone());
        for (id, r) in &state.retries {
            let key = (r.attempt, r.due_at, r.error.clone());
            if p.retries.get(id) != Some(&key) {
                ops.push(store::Op::PutRetry(id.clone(), Box::new(r.clone())));
                p.retries.insert(id.clone(), key);
            }
        }
        if !state.shutting_down {
            let gone: Vec<Key> = p
                .retries
                .keys()
                .filter(|id| !state.retries.contains_key(*id))
                .cloned()
                .collect();
            for id in gone {
                p.retries.remove(&id);
                ops.push(store::Op::DeleteRetry(id));
            }
        }
        for (key, r) in &state.running {
            if p.claims.get(key) != Some(&r.run_id) {
                p.claims.insert(key.clone(), r.run_id.clone());
                ops.push(store::Op::PutClaim(key.clone(), Box::new(r.clone())));
            }
        }
        let ended: Vec<Key> = p
            .claims
            .keys()
            .filter(|key| !state.running.contains_key(*key))
            .cloned()
            .collect();
        for id in ended {
            p.claims.remove(&id);
            ops.push(store::Op::DeleteClaim(id));
        }
        // Steering: what was accepted (its keys, with the sources' cursors, in this same
        // transaction: a restart neither loses nor repeats a message), and what waits.
        if p.steering_version != state.steering.version() {
            p.steering_version = state.steering.version();
            persist_steering(state, p, &mut ops);
        }
        persist_cooldowns(state, p, &mut ops);
        ops.extend(relays.into_iter().map(|r| store::Op::Relay(Box::new(r))));
        ops.extend(
            spends
                .into_iter()
                .map(|(line, spent)| store::Op::Spend(line, spent)),
        );
        if !ops.is_empty() {
            let _ = p.tx.send(ops);
        }
    }

    /// Publishes a snapshot; `changed`: only agents' activity moved, so it certainly changed.
    fn publish(&self, now: Millis, changed: bool) {
        let spend = self.pool.as_ref().map(|p| snapshot::SpendPayload {
            worker_seconds: p
                .spend
                .lifetime_seconds
                .load(std::sync::atomic::Ordering::Relaxed),
            worker_seconds_today: p
                .spend
                .day_seconds
                .load(std::sync::atomic::Ordering::Relaxed),
        });
        let webhooks = self
            .webhooks
            .as_ref()
            .map(|w| snapshot::webhooks_payload(w));
        let mut states: Vec<&State> = self
            .units
            .iter()
            .filter(|u| !u.gone())
            .map(|u| &u.state)
            .collect();
        if states.is_empty() {
            states.push(&self.units[0].state);
        }
        let several = self.units.len() + self.failed.len() > 1;
        let workflows = several.then(|| self.workflows_payload());
        self.hub.publish(snapshot::build_many(
            &states,
            workflows,
            &self.daemon,
            now,
            spend,
            webhooks,
            changed,
        ));
    }

    /// The `workflows` list of a daemon serving several.
    fn workflows_payload(&self) -> Vec<snapshot::WorkflowPayload> {
        self.units
            .iter()
            .filter(|u| !u.gone())
            .map(|u| snapshot::WorkflowPayload {
                name: u.name.to_string(),
                path: u.path.display().to_string(),
                tracker_kind: u.state.settings.tracker.kind.clone(),
                running: u.state.running.len(),
                retrying: u.state.retries.len(),
                blocked: u.state.blocked.len(),
                last_poll_at: u.last_poll_at.map(crate::time::rfc3339),
                last_error: u.reload_error.clone().or_else(|| u.poll_error.clone()),
                status: if u.state.retired {
                    "removed"
                } else if u.reload_error.is_some() || u.poll_error.is_some() {
                    "failing"
                } else {
                    "ok"
                },
            })
            .chain(
                self.failed
                    .iter()
                    .map(|(name, path, why)| snapshot::WorkflowPayload {
                        name: name.to_string(),
                        path: path.display().to_string(),
                        tracker_kind: String::new(),
                        running: 0,
                        retrying: 0,
                        blocked: 0,
                        last_poll_at: None,
                        last_error: Some(why.clone()),
                        status: "failing",
                    }),
            )
            .collect()
    }

    /// Executes one effect of workflow `i`; returns true when the daemon should exit (every
    /// workflow is done).
    fn execute(&mut self, i: usize, effect: Effect) -> bool {
        let unit = &mut self.units[i];
        match effect {
            Effect::Poll {
                ids,
                include_terminal,
            } => {
                let state = &unit.state;
                let steer = state
                    .running
                    .keys()
                    .chain(state.retries.keys())
                    .map(|k| k.issue_id.clone())
                    .chain(state.blocked.iter().map(|b| b.issue.id.clone()))
                    .collect();
                let waiting = state
                    .steering
                    .queued()
                    .filter(|m| !m.source.is_operator())
                    .cloned()
                    .collect();
                let _ = unit.poll_tx.send(PollJob::Poll {
                    ids,
                    include_terminal,
                    steer,
                    waiting,
                });
            }
            Effect::Steer { run_id, messages } => {
                // A run that already ended reports its exit next; the state thread then puts
                // what it did not deliver back in the queue.
                if let Some(tx) = self.runs.get(&run_id) {
                    let _ = tx.send(Control::Steer(messages));
                }
            }
            Effect::FetchForRetry { key } => {
                let _ = unit.poll_tx.send(PollJob::Fetch(key));
            }
            Effect::StartRun(spec) => {
                if let Some(tx) = &self.seen_issues {
                    let _ = tx.try_send(spec.slot.issue.clone());
                }
                let (control_tx, control_rx) = unbounded();
                self.starts += 1;
                unit.last_start = self.starts;
                let tracker = current_tracker(&unit.loaded);
                if spec.attempt.is_none() {
                    tracker.picked_up(&spec.slot.issue);
                }
                let mcp = self
                    .mcp
                    .as_ref()
                    .and_then(|m| m(&spec.settings, &spec.run_id));
                let ctx = RunContext {
                    events: unit.tx.clone(),
                    control: control_rx,
                    tracker,
                    trace: unit.trace.clone(),
                    mcp,
                    env: Arc::clone(&self.env),
                    pool: self.pool.clone(),
                    remote_mcp: self.remote_mcp.clone(),
                    gate: Arc::clone(&unit.gate) as Arc<dyn protocol::ClaimGate>,
                    dispatchable: super::dispatch::is_dispatchable,
                };
                let run_id = spec.run_id.clone();
                let name = format!("run-{}", spec.slot.issue.identifier);
                let events = unit.tx.clone();
                let id = run_id.clone();
                // A panic in a run (outside input it did not expect) ends that run as failed and
                // frees its slot; the daemon runs on. What the run held (its lease, its claim,
                // its children's groups) is released as the thread unwinds.
                let spawned = std::thread::Builder::new().name(name).spawn(move || {
                    let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run::run(*spec, ctx)
                    }));
                    if let Err(panic) = ended {
                        let why = panic_text(panic.as_ref());
                        log::error!("run {id}: its thread panicked ({why}); the run failed");
                        let _ = events.send(Event::Run {
                            run_id: id,
                            msg: protocol::RunMsg::Exited(protocol::RunEnd::Failed(format!(
                                "the run's thread panicked ({why})"
                            ))),
                        });
                    }
                });
                match spawned {
                    Ok(_) => {
                        self.runs.insert(run_id, control_tx);
                    }
                    Err(e) => {
                        let _ = self.units[i].tx.send(Event::Run {
                            run_id,
                            msg: protocol::RunMsg::Exited(protocol::RunEnd::Failed(format!(
                                "cannot start a run thread: {e}"
                            ))),
                        });
                    }
                }
            }
            Effect::LastTurn { run_id } => {
                if let Some(tx) = self.runs.get(&run_id) {
                    let _ = tx.send(Control::LastTurn);
                }
            }
            Effect::TurnChecked { run_id, turn } => {
                if let Some(tx) = self.runs.get(&run_id) {
                    let _ = tx.send(Control::TurnChecked(turn));
                }
            }
            Effect::BudgetComment { issue, mark, body } => {
                let tracker = current_tracker(&unit.loaded);
                let facts = unit.gate.facts();
                let _ = std::thread::Builder::new()
                    .name(format!("budget-{}", issue.identifier))
                    .spawn(move || {
                        post_budget_comment(&*tracker, facts.as_deref(), &issue, &mark, &body);
                    });
            }
            Effect::CancelRun { run_id, reason } => {
                if let Some(tx) = self.runs.get(&run_id) {
                    let _ = tx.send(Control::Cancel(reason));
                }
            }
            Effect::RemoveWorkspace {
                key,
                issue,
                path,
                settings,
                ssh,
            } => {
                let events = unit.tx.clone();
                let _ = std::thread::Builder::new()
                    .name(format!("remove-{}", issue.identifier))
                    .spawn(move || {
                        let result = match ssh {
                            Some(place) => {
                                remove_remote_workspace(&settings, &issue, &place, &path)
                            }
                            None => remove_workspace(&settings, &issue, &path),
                        };
                        let _ = events.send(Event::WorkspaceRemoved { key, result });
                    });
            }
            Effect::CleanupTerminal { issues, settings } => {
                let _ = std::thread::Builder::new()
                    .name("cleanup-terminal".into())
                    .spawn(move || {
                        for issue in issues {
                            for path in leftover_workspaces(&settings, &issue.identifier) {
                                match remove_workspace(&settings, &issue, &path) {
                                    Ok(()) => log::info!(
                                        "[{}] removed the workspace of a terminal issue",
                                        issue.identifier
                                    ),
                                    Err(e) => log::warn!("[{}] {e}", issue.identifier),
                                }
                            }
                        }
                    });
            }
            Effect::Exit => return self.units.iter().all(|u| u.state.exited),
            Effect::DryRun(decisions) => {
                if unit.last_dry_run.as_ref() != Some(&decisions) {
                    print_decisions(&decisions);
                    unit.last_dry_run = Some(decisions);
                }
            }
        }
        false
    }
}

/// Posts the comment of a budget that stopped `issue`, once: a durable claim store (`facts`)
/// remembers it (`mark`) across restarts and daemons; best effort, a failure is logged.
fn post_budget_comment(
    tracker: &dyn Tracker,
    facts: Option<&dyn crate::facts::Facts>,
    issue: &tracker::Issue,
    mark: &str,
    body: &str,
) {
    if let Some(facts) = facts {
        match facts.mark("budget comment", mark, 100_000) {
            Ok(false) => return,
            Ok(true) => {}
            Err(e) => log::warn!(
                "[{}] budget comment: {e}; posting it anyway",
                issue.identifier
            ),
        }
    }
    match tracker.post_comment(issue, body) {
        Ok(()) => log::info!("[{}] budget comment posted", issue.identifier),
        Err(e) => log::warn!("[{}] budget comment not posted: {e}", issue.identifier),
    }
}

/// The cooldowns part of [`Runtime::persist`]'s diff: each kind's cooldown that is new or
/// whose reset moved (the store keeps the later of two resets; an ended one is left there, and
/// no sweep returns it).
fn persist_cooldowns(state: &State, p: &mut Persisted, ops: &mut Vec<store::Op>) {
    for (kind, c) in &state.cooldowns {
        if p.cooldowns.get(kind) != Some(&c.until) {
            p.cooldowns.insert(kind.clone(), c.until);
            ops.push(store::Op::PutCooldown(Box::new(c.clone())));
        }
    }
    p.cooldowns
        .retain(|kind, _| state.cooldowns.contains_key(kind));
}

/// The steering part of [`Runtime::persist`]'s diff.
fn persist_steering(state: &State, p: &mut Persisted, ops: &mut Vec<store::Op>) {
    let new_seen: Vec<String> = state
        .steering
        .taken()
        .rev()
        .take_while(|k| Some(*k) != p.last_seen.as_ref())
        .cloned()
        .collect();
    if !new_seen.is_empty() {
        p.last_seen = state.steering.last_taken().cloned();
        ops.push(store::Op::PutSeen(new_seen.into_iter().rev().collect()));
    }
    for (source, cursor) in state.steering.cursors() {
        if p.cursors.get(source) != Some(cursor) {
            p.cursors.insert(source.clone(), cursor.clone());
            ops.push(store::Op::PutCursor(source.clone(), cursor.clone()));
        }
    }
    let mut waiting = std::collections::BTreeSet::new();
    for m in state.undelivered_steering() {
        let key = m.unique_key();
        if !p.steering.contains(&key) {
            ops.push(store::Op::PutSteer(Box::new(m.clone())));
        }
        waiting.insert(key);
    }
    for gone in p.steering.difference(&waiting) {
        ops.push(store::Op::DeleteSteer(gone.clone()));
    }
    p.steering = waiting;
}

/// What changes when a workflow's cooldowns do: each kind's reset.
fn cooling_mark(state: &State) -> Vec<(String, Millis)> {
    state
        .cooldowns
        .values()
        .map(|c| (c.kind.clone(), c.until))
        .collect()
}

/// Puts what the claim store held back into a fresh state: the history, the retries of the
/// daemons before this one (same attempt and due time) and their runs that never ended (as
/// retries due soon), and the slots other live daemons hold. Returns the cooldowns in force it
/// held (this daemon's before a restart, or the fleet's), for the state to take as a sweep's
/// ([`held_cooldowns`]): handed in here, the state's first event would start its first poll
/// with nobody to run it.
fn hydrate(state: &mut State, hydrated: store::Hydrated, now: Millis) -> Vec<protocol::Cooldown> {
    state.history = hydrated.history.into_iter().collect();
    for (key, retry) in hydrated.sweep.taken_over {
        log::warn!(
            "[{}] {}: retry {} due at {}",
            retry.slot.issue.identifier,
            retry.error.as_deref().unwrap_or("pending retry"),
            retry.attempt,
            crate::time::rfc3339(retry.due_at)
        );
        state.retries.insert(key, retry);
    }
    state.foreign = hydrated.sweep.foreign;
    state.ledger.merge(hydrated.sweep.ledger);
    state.steering.restore(
        hydrated.steering_seen,
        hydrated.steering,
        hydrated.steering_cursors,
    );
    state.claim_store.hydrated_at = now;
    hydrated.sweep.cooldowns
}

/// The cooldowns the claim store held at start, as the sweep the state takes them from (the
/// kind's scope decides which it keeps); the slots others hold stay as read.
fn held_cooldowns(state: &State, cooldowns: Vec<protocol::Cooldown>) -> Event {
    Event::Swept(Box::new(protocol::Swept {
        foreign: state.foreign.clone(),
        cooldowns,
        ..protocol::Swept::default()
    }))
}

/// The leftover workspaces of a terminal issue: its own directory and its ensemble slots'.
fn leftover_workspaces(settings: &Settings, identifier: &str) -> Vec<PathBuf> {
    let root = &settings.workspace.root;
    let path = workspace::path_for(root, settings.workspace.isolation, identifier);
    if settings.workspace.isolation == crate::config::Isolation::None {
        return path.is_dir().then_some(path).into_iter().collect();
    }
    let slot_prefix = format!("{}+", workspace::dir_name(identifier));
    let mut found: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(&slot_prefix)
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    if path.is_dir() {
        found.insert(0, path);
    }
    found
}

impl Runtime {
    /// Answers a control route's request on its reply channel, from the workflows' states
    /// now, and returns the event it becomes with the workflow it goes to (`None`: every
    /// workflow; nothing: nothing to do). A caller that gave up waiting loses nothing.
    fn answer(&self, ask: protocol::Ask) -> Option<(Option<usize>, Event)> {
        use protocol::Ask;
        let (reply, i, (routed, event)) = match ask {
            Ask::Refresh { reply } => {
                let _ = reply.try_send(self.units.iter().any(|u| u.state.poll_in_flight));
                return Some((None, Event::Refresh));
            }
            Ask::Steer {
                identifier,
                message,
                reply,
            } => match self.find(&identifier, |s, id| s.steer_target(id).is_some()) {
                Ok((i, id)) => (reply, i, self.units[i].state.route_steer(id, message)),
                Err(among) => {
                    let _ = reply.try_send(Some(protocol::Routed::ambiguous(among)));
                    return None;
                }
            },
            Ask::Cancel { identifier, reply } => {
                match self.find(&identifier, |s, id| s.cancel_target(id).is_some()) {
                    Ok((i, id)) => (reply, i, self.units[i].state.route_cancel(id)),
                    Err(among) => {
                        let _ = reply.try_send(Some(protocol::Routed::ambiguous(among)));
                        return None;
                    }
                }
            }
        };
        let _ = reply.try_send(routed);
        event.map(|e| (Some(i), e))
    }

    /// The workflow an operator's `identifier` names, and the issue's own identifier:
    /// `<workflow>:<identifier>` names its workflow; a bare identifier, the one workflow
    /// where `here` finds it or another daemon of its fleet holds it (the first workflow
    /// when none does). `Err`: the workflows that each have it.
    fn find<'a>(
        &self,
        identifier: &'a str,
        here: impl Fn(&State, &str) -> bool,
    ) -> Result<(usize, &'a str), Vec<String>> {
        if self.units.len() == 1 {
            return Ok((0, identifier));
        }
        if let Some((workflow, rest)) = identifier.split_once(':')
            && let Some(i) = self.units.iter().position(|u| &*u.name == workflow)
        {
            return Ok((i, rest));
        }
        let having: Vec<usize> = (0..self.units.len())
            .filter(|&i| {
                let state = &self.units[i].state;
                here(state, identifier)
                    || state.foreign.values().any(|h| h.identifier == identifier)
            })
            .collect();
        match having.as_slice() {
            [] => Ok((0, identifier)),
            [one] => Ok((*one, identifier)),
            many => Err(many
                .iter()
                .map(|&i| self.units[i].name.to_string())
                .collect()),
        }
    }
}

/// Prints a `--dry-run` report: one line per candidate.
fn print_decisions(decisions: &[protocol::Decision]) {
    use std::io::Write;
    let mut out = String::new();
    if decisions.is_empty() {
        out.push_str("dry run: no candidates\n");
    }
    for d in decisions {
        out.push_str(&format!(
            "{:<16} {:<14} {}\n",
            d.identifier, d.state, d.verdict
        ));
    }
    let mut stdout = std::io::stdout();
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush());
}

/// On a remote worker: `before_remove` there (best effort), then delete the workspace there.
fn remove_remote_workspace(
    settings: &Settings,
    issue: &tracker::Issue,
    place: &protocol::SshPlace,
    path: &std::path::Path,
) -> Result<(), String> {
    let host = &place.host;
    use crate::workers::ssh;
    if crate::process::stopping() {
        return Err(format!(
            "svc is stopping: the workspace of {} on {host} is kept (before_remove not started)",
            issue.identifier
        ));
    }
    let target = ssh::Target {
        host: host.to_string(),
        config: settings.worker.ssh_config.clone(),
        timeout: Duration::from_millis(settings.worker.ssh_timeout_ms),
        options: place.options.clone(),
    };
    let root = ssh::remote_root(&target, settings.workspace.root_setting.as_deref())?;
    // The run's own directory (an ensemble slot's carries its suffix).
    let name = path.file_name().map_or_else(
        || workspace::dir_name(&issue.identifier),
        |n| n.to_string_lossy().into_owned(),
    );
    if let Some(script) = &settings.hooks.before_remove {
        let env = [
            ("SVC_ISSUE_ID".to_string(), issue.id.clone()),
            ("SVC_ISSUE_IDENTIFIER".to_string(), issue.identifier.clone()),
            ("SVC_WORKSPACE".to_string(), format!("{root}/{name}")),
        ];
        let _ = hooks::run_remote(
            Hook::BeforeRemove,
            script,
            &target,
            &root,
            &name,
            Duration::from_millis(settings.hooks.timeout_ms),
            &env,
        );
    }
    ssh::remove_workspace(&target, &root, &name)
}

/// `before_remove` (best effort), then delete the workspace.
fn remove_workspace(
    settings: &Settings,
    issue: &tracker::Issue,
    path: &std::path::Path,
) -> Result<(), String> {
    if !path.exists() {
        return Ok(());
    }
    // A stopping daemon starts no before_remove, and removing a workspace without its hook
    // could lose work the hook would have saved: keep it; the next start cleans it up.
    if crate::process::stopping() {
        return Err(format!(
            "svc is stopping: {} kept (before_remove not started); the next start removes it",
            path.display()
        ));
    }
    if let Some(script) = &settings.hooks.before_remove {
        let env = vec![
            ("SVC_ISSUE_ID".to_string(), issue.id.clone()),
            ("SVC_ISSUE_IDENTIFIER".to_string(), issue.identifier.clone()),
            ("SVC_WORKSPACE".to_string(), path.display().to_string()),
        ];
        let _ = hooks::run(&HookRun {
            hook: Hook::BeforeRemove,
            script,
            workspace_root: &settings.workspace.root,
            workspace: path,
            timeout: Duration::from_millis(settings.hooks.timeout_ms),
            env: &env,
        });
    }
    workspace::remove(&settings.workspace.root, path).map_err(|e| e.to_string())
}

/// Returns the heap's free pages to the system. glibc keeps freed memory for reuse, and what a
/// run freed when it ended (its bridge buffers, its trace batches, its thread's allocations)
/// sits as free pages between live allocations, resident until reused. Measured over hundreds
/// of runs (tests/daemon.rs, `memory_stays_bounded_over_hundreds_of_runs`), the live heap stays
/// flat while RSS creeps up with the heap's fragmentation; trimming takes back what is free
/// now. At most every [`TRIM_EVERY`], after a run ended; well under a millisecond for a heap
/// of this size.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory the allocator owns.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::protocol::Cooldown;
    use crate::orchestrator::testutil::settings;

    const NOW: Millis = 1_000_000;

    fn cooldown(kind: &str, scope: &str, until: Millis) -> Cooldown {
        Cooldown {
            kind: kind.into(),
            until,
            since: NOW - 1000,
            reason: "HTTP 429".into(),
            scope: scope.into(),
        }
    }

    /// The cooldowns the store held at start reach the state as a sweep's (those of the scope
    /// each kind's settings give it); a cooldown new to the store thread, or one whose reset
    /// moved, is written once.
    #[test]
    fn cooldowns_the_store_held_reach_the_state_as_a_sweep_and_changes_are_written_once() {
        let yaml = "tracker:\n  kind: memory\nagents:\n  agent_b:\n    cooldown_scope: host";
        let mut state = State::new(Arc::new(settings(yaml)), NOW);
        let hydrated = store::Hydrated {
            sweep: protocol::Swept {
                cooldowns: vec![
                    cooldown("agent_a", "fleet", NOW + 60_000),
                    // agent_b's account is each host's: the fleet's row is not its.
                    cooldown("agent_b", "fleet", NOW + 60_000),
                ],
                ..protocol::Swept::default()
            },
            ..store::Hydrated::default()
        };
        let held = hydrate(&mut state, hydrated, NOW);
        let (tx, _rx) = unbounded();
        let mut p = Persisted::read_back(&state, tx);
        assert!(state.cooldowns.is_empty(), "not before the first event");
        let event = held_cooldowns(&state, held);
        state::handle(&mut state, NOW, event);
        let kinds: Vec<&String> = state.cooldowns.keys().collect();
        assert_eq!(kinds, ["agent_a"]);
        let written = |state: &State, p: &mut Persisted| {
            let mut ops = Vec::new();
            persist_cooldowns(state, p, &mut ops);
            ops.into_iter()
                .map(|op| match op {
                    store::Op::PutCooldown(c) => (c.kind, c.until),
                    other => panic!("not a cooldown: {other:?}"),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            written(&state, &mut p),
            [("agent_a".to_string(), NOW + 60_000)],
            "written back once (the store keeps the later reset: nothing changes there)"
        );
        assert!(written(&state, &mut p).is_empty());
        state.cooldowns.get_mut("agent_a").unwrap().until = NOW + 90_000;
        state
            .cooldowns
            .insert("agent_b".into(), cooldown("agent_b", "host", NOW + 30_000));
        assert_eq!(
            written(&state, &mut p),
            [
                ("agent_a".to_string(), NOW + 90_000),
                ("agent_b".to_string(), NOW + 30_000)
            ]
        );
        assert!(written(&state, &mut p).is_empty(), "written once");
    }
}
