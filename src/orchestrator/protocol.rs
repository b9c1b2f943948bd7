//! The orchestrator's protocol: the words the state thread and the threads around it speak.
//! Events in ([`Event`], a run's [`RunMsg`], a control route's [`Ask`], a poll's
//! [`PollReport`], a claim-store sweep's [`Swept`]), effects out ([`Effect`], a run's
//! [`RunSpec`]), and the records they carry ([`Running`], [`Retry`], [`RunRecord`], [`Key`]).
//!
//! Run threads, the claim store, the HTTP routes and the views depend on this module, not on
//! the state machine (`state`) that decides on these words. It holds data and the small
//! helpers that belong to it; no decisions.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crossbeam_channel::Sender;

use crate::config::Settings;
use crate::steering::Message;
use crate::time::Millis;
use crate::tracker::Issue;
use crate::workers::PoolView;

pub type IssueId = String;

/// What one claim holds: a slot of an issue (slot 0; ensemble mode adds slots 1..N-1). Every
/// slot runs, retries and is cleaned up on its own.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Key {
    pub issue_id: IssueId,
    pub slot: u32,
}

impl Key {
    pub fn new(issue_id: impl Into<IssueId>, slot: u32) -> Key {
        Key {
            issue_id: issue_id.into(),
            slot,
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} slot {}", self.issue_id, self.slot)
    }
}

fn one() -> u32 {
    1
}

/// How the error of a retry that replaces a dead daemon's run begins.
pub const TAKEN_OVER: &str = "taken over: its run";

/// Token counts of a run or of the daemon.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub total: u64,
}

impl Tokens {
    /// Adds `other`; counts a bridge reports are outside input, so the sums saturate.
    pub fn add(&mut self, other: Tokens) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.total = self.total.saturating_add(other.total);
    }
}

/// A cost a bridge reported in a currency other than US dollars: kept as it came, and left
/// out of every USD sum.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OtherCost {
    pub amount: f64,
    pub currency: String,
}

/// What a run used so far, as its run thread reports it with each usage event: its token
/// totals and what they cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub tokens: Tokens,
    /// The run's cost in US dollars: the bridge's own figure when it reports one in USD, else
    /// its tokens at the agent's prices; `None` when neither is known.
    pub cost_usd: Option<f64>,
    /// The bridge's figure when it reports another currency (`cost_usd` is then `None`).
    pub cost_other: Option<OtherCost>,
}

/// Dollars as svc shows them: to 6 decimal places.
pub fn round_usd(usd: f64) -> f64 {
    (usd * 1_000_000.0).round() / 1_000_000.0
}

/// Why the orchestrator stopped a run.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StopReason {
    /// No update for longer than the stall timeout.
    Stalled(Millis),
    /// The issue reached a terminal state: stop and clean up.
    Terminal,
    /// The issue left the active states or is no longer routable: stop, keep the workspace.
    Inactive(String),
    /// The daemon is shutting down.
    Shutdown,
    /// The operator canceled it (`POST /api/v1/<issue>/cancel`): no retry, and the issue is
    /// not dispatched again while its tracker state stays what it was.
    Canceled,
    /// The run took its issue past a budget (what was spent against which): no retry, and the
    /// issue is held back like a canceled one unless the budget is raised.
    Budget(String),
    /// The UTC day's budget is reached: the run ends after its current turn.
    DailyBudget,
    /// The agent's account met a limit (two silent turns in a row on its kind): the run ends
    /// `rate_limited`, and its retry waits for the reset or goes to a fallback kind.
    RateLimited(Limit),
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Stalled(ms) => write!(f, "stalled: no agent activity for {ms} ms"),
            StopReason::Terminal => f.write_str("issue reached a terminal state"),
            StopReason::Inactive(why) => write!(f, "issue is no longer dispatchable: {why}"),
            StopReason::Shutdown => f.write_str("daemon shutting down"),
            StopReason::Canceled => f.write_str("canceled by the operator"),
            StopReason::Budget(why) => write!(f, "budget_exceeded: {why}"),
            StopReason::DailyBudget => f.write_str("daily budget reached"),
            StopReason::RateLimited(limit) => write!(f, "agent_rate_limited: {}", limit.reason),
        }
    }
}

/// A remote worker reached over SSH: its host and the driver's ssh options for it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SshPlace {
    pub host: String,
    pub options: Vec<String>,
}

/// The issue slot a run, a retry or a run's start is about, and where its workspace is: the
/// block [`RunSpec`], [`Running`] and [`Retry`] share (flattened into the records the claim
/// store keeps, so their fields stand where they always stood).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Slot {
    pub issue: Issue,
    /// The ensemble slot (0..ensemble_size) and the ensemble's size (1 outside ensemble mode).
    #[serde(default)]
    pub slot_index: u32,
    #[serde(default = "one")]
    pub ensemble_size: u32,
    pub workspace_path: PathBuf,
}

impl Slot {
    /// How the slot is named where people read it ([`slot_name`]).
    pub fn name(&self) -> String {
        slot_name(&self.issue.identifier, self.slot_index, self.ensemble_size)
    }
}

/// Everything a run thread needs to start.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub run_id: String,
    pub slot: Slot,
    /// `None` on a first run, else the retry attempt (1, 2, ...).
    pub attempt: Option<u32>,
    pub agent_kind: String,
    pub settings: Arc<Settings>,
    /// The worker machine the issue's previous run had (a retry may re-land on it).
    pub affinity: Option<String>,
    /// Steering messages that waited for this run: its first turn carries them.
    pub steering: Vec<Message>,
    /// When the tracker data this run was chosen from was read: a slot another daemon let go
    /// after that is not claimed (the issue may be done).
    pub seen_at: Millis,
    /// The run before this one met a rate limit (the prompt template's `previous_attempt`):
    /// this run takes over its workspace, on this kind or a fallback.
    pub previous_attempt: Option<PreviousAttempt>,
}

/// A limit an agent's account met: why (the words that said so) and when it resets, when the
/// bridge said (else the kind's `cooldown_ms` applies).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limit {
    pub reason: String,
    pub reset_at: Option<Millis>,
}

/// An agent kind cooling down after a limit: no run starts on it before `until`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cooldown {
    pub kind: String,
    /// When the limit resets: the time the agent said, else `since` + `cooldown_ms`.
    pub until: Millis,
    /// When the limit was met.
    pub since: Millis,
    /// What said so (the error or the agent's message, cut short).
    pub reason: String,
    /// Who shares it: `fleet` (every daemon of the claim store) or `host` (this host's
    /// daemons only: `agents.<kind>.cooldown_scope: host`; the store keys it by hostname).
    pub scope: String,
}

/// The rate-limited run a retry follows (the prompt's `previous_attempt`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreviousAttempt {
    pub kind: String,
    pub reason: String,
    /// When it met the limit.
    pub at: Millis,
}

#[derive(Clone, Debug)]
pub enum Effect {
    /// Ask the poller for a poll: reload the workflow, fetch candidates and refresh `ids`.
    Poll {
        ids: Vec<IssueId>,
        include_terminal: bool,
    },
    StartRun(Box<RunSpec>),
    /// Hand steering messages to a running run (its next turn).
    Steer {
        run_id: String,
        messages: Vec<Message>,
    },
    /// Ask a run to end after its current turn (the day's budget is reached).
    LastTurn {
        run_id: String,
    },
    /// Tell a run its ended turn was held against the budgets (the answer to
    /// [`RunMsg::TurnEnded`]).
    TurnChecked {
        run_id: String,
        turn: u32,
    },
    /// Post, once, a comment on an issue a budget stopped (best effort; `mark` is what keeps
    /// it from being posted twice).
    BudgetComment {
        issue: Box<Issue>,
        mark: String,
        body: String,
    },
    CancelRun {
        run_id: String,
        reason: StopReason,
    },
    /// Ask the poller for the current record of an issue whose retry (of slot `key.slot`) is due.
    FetchForRetry {
        key: Key,
    },
    /// Run `before_remove` and delete the workspace; answered by `WorkspaceRemoved`.
    RemoveWorkspace {
        key: Key,
        issue: Box<Issue>,
        path: PathBuf,
        settings: Arc<Settings>,
        /// The worker the workspace is on, when it is a remote one (SSH).
        ssh: Option<SshPlace>,
    },
    /// Remove leftover workspaces of these terminal issues, where they exist (first poll).
    CleanupTerminal {
        issues: Vec<Issue>,
        settings: Arc<Settings>,
    },
    /// Every run has ended after a shutdown: the daemon may exit.
    Exit,
    /// `--dry-run`: what this poll would dispatch, candidate by candidate (printed when it
    /// differs from the last report).
    DryRun(Vec<Decision>),
}

/// A dry run's verdict on one candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub identifier: String,
    pub state: String,
    /// `dispatch -> <agent>`, `skip: <why>` or `blocked: <reason> (<label>)`.
    pub verdict: String,
}

/// How the daemon runs: for ever (the default), `--once`, `--dry-run`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mode {
    /// One poll and dispatch; no retries or continuations; exit when those runs end.
    pub once: bool,
    /// Decide, print, start nothing, remove nothing.
    pub dry_run: bool,
}

/// What a poll found.
#[derive(Clone, Debug)]
pub struct PollReport {
    pub candidates: Result<Vec<Issue>, String>,
    /// Current records of the ids the poll was asked to refresh (missing ids are absent).
    pub refreshed: Result<Vec<Issue>, String>,
    pub requested: Vec<IssueId>,
    /// Issues in terminal states (first poll only), for cleaning leftover workspaces.
    pub terminal: Option<Vec<Issue>>,
    /// Rate-limit information the tracker reported, if any.
    pub rate_limits: Option<serde_json::Value>,
    /// How long the poll's tracker requests took.
    pub duration_ms: u64,
    /// When the candidates were read (this host's clock; 0: unknown, `now - duration_ms`).
    pub read_at: Millis,
}

/// Running totals since the daemon started (`GET /metrics`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    /// Finished runs by outcome (`success`, `failed`, `stalled`).
    pub runs_by_outcome: BTreeMap<&'static str, u64>,
    /// Retries scheduled after a failed or stalled run.
    pub retries_scheduled: u64,
    pub polls: u64,
    /// Polls whose candidate fetch or refresh failed.
    pub poll_failures: u64,
    /// The last poll's duration.
    pub last_poll_ms: u64,
    /// Recent-event names and how often each happened (write failures among them).
    pub events: BTreeMap<String, u64>,
    /// Steering turns delivered to agents.
    pub steering_turns: u64,
    /// US dollars finished runs cost, by agent kind (runs of unknown or non-USD cost add
    /// nothing).
    pub finished_cost_usd: BTreeMap<String, f64>,
}

impl Counters {
    /// Adds another workflow's counts (`last_poll_ms`: the longer).
    pub fn add(&mut self, other: &Counters) {
        for (outcome, n) in &other.runs_by_outcome {
            *self.runs_by_outcome.entry(outcome).or_default() += n;
        }
        self.retries_scheduled += other.retries_scheduled;
        self.polls += other.polls;
        self.poll_failures += other.poll_failures;
        self.last_poll_ms = self.last_poll_ms.max(other.last_poll_ms);
        for (event, n) in &other.events {
            *self.events.entry(event.clone()).or_default() += n;
        }
        self.steering_turns += other.steering_turns;
        for (kind, usd) in &other.finished_cost_usd {
            *self.finished_cost_usd.entry(kind.clone()).or_default() += usd;
        }
    }
}

/// How a run thread ended on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// The turn loop finished: the issue left its active state or the turn limit was reached.
    Clean,
    Failed(String),
    /// The shared claim store gave the slot to another daemon: the run never started.
    HeldElsewhere(String),
    /// Another daemon ran the slot and let it go after the tracker read this run was chosen
    /// from: the run never started, and the slot waits for the next poll's word.
    Superseded(String),
    /// The day's budget (the fleet's, as the store had it) was reached when the run came to
    /// claim its slot: it never started; a retry keeps its attempt.
    BudgetRefused(String),
    /// The agent's account met a limit (an error that says so, or a final message matching
    /// the kind's `rate_limit_patterns`): the run ends `rate_limited`, its workspace kept.
    RateLimited(Limit),
}

#[derive(Clone, Debug)]
pub enum RunMsg {
    Started {
        pid: Option<u32>,
    },
    Session {
        session_id: String,
    },
    /// Any agent update (resets the stall clock).
    Activity {
        event: String,
        message: Option<String>,
    },
    TurnStarted {
        turn: u32,
    },
    /// The turn ended and its usage was sent: the run waits for [`Effect::TurnChecked`] (the
    /// usage held against the budgets, a `LastTurn` or cancel sent first) before another.
    TurnEnded {
        turn: u32,
        /// The turn ended with no output at all (no message, thought or tool call): twice in
        /// a row on one kind is a rate limit.
        silent: bool,
    },
    /// The run's token totals and cost so far (sent at each turn's end, and during a turn
    /// whenever the bridge reports a new cost or context size, at most every 500 ms).
    Usage(Usage),
    /// An operational event worth showing in the recent events.
    Notice {
        event: String,
        message: String,
    },
    /// The run is acquiring a slot on the worker pool.
    Reserving,
    /// The run holds a slot on `worker_id` (`host` is `None` for this host; `ssh` (with the
    /// driver's ssh options) when the run executes there over SSH).
    Leased {
        worker_id: String,
        host: Option<String>,
        ssh: Option<Vec<String>>,
    },
    /// Where the run's workspace is (a remote one is only known once the worker's home is).
    Workspace(PathBuf),
    /// Steering messages (their [`Message::unique_key`]s) go to the agent as one turn (said
    /// as the prompt is written, so a crash right after cannot deliver them again).
    Steered {
        keys: Vec<String>,
    },
    /// The run claimed its slot in the claim store with this fencing token.
    Claimed {
        token: u64,
    },
    /// The prompt of a turn [`RunMsg::Steered`] announced could not be written: its messages
    /// were not delivered, and wait again (for this run's next turn, or the issue's next run).
    Unsteered {
        messages: Vec<Message>,
    },
    Exited(RunEnd),
}

#[derive(Clone, Debug)]
pub enum Event {
    PollDone(PollReport),
    Reloaded(Arc<Settings>),
    ReloadFailed(String),
    Run {
        run_id: String,
        msg: RunMsg,
    },
    RetryFetched {
        key: Key,
        result: Result<Option<Issue>, String>,
    },
    WorkspaceRemoved {
        key: Key,
        result: Result<(), String>,
    },
    /// A daemon-level notice for the recent events (a trace or store failure, say).
    Notice {
        event: String,
        message: String,
    },
    /// The worker pool's figures changed.
    Pool(PoolView),
    /// The claim store's thread wrote a batch.
    Persisted {
        ops: usize,
        last: &'static str,
        at: Millis,
    },
    /// The shared claim store's view of other daemons: the slots they hold, what this daemon
    /// took over from one that died (its runs are retried here, not lost), control relayed to
    /// it, and the fleet.
    Swept(Box<Swept>),
    /// Steering messages from a source (a poll's comments or replies, the operator's API),
    /// with the source's new cursor (`(source id, cursor)`), stored with them.
    Steer {
        messages: Vec<Message>,
        cursor: Option<(String, String)>,
        /// What the source did not take, each said in a line (`steering_ignored`).
        ignored: Vec<String>,
        /// Messages for the next run of issues the source just sent back to work.
        held: Vec<Message>,
    },
    /// An operator's request for an issue another daemon holds: relayed through the claim
    /// store.
    Relay(Relay),
    /// `POST /api/v1/refresh`.
    Refresh,
    /// A tracker's live feed saw something worth a poll (chat-a's Socket Mode, chat-b's
    /// Gateway). Unlike a refresh it is not coalesced into a poll under way, which may have
    /// read before the event: another poll follows it.
    Wake,
    /// A verified webhook delivery of an event that matters: like [`Event::Wake`], but at most
    /// one a polling interval brings a poll forward; the others within it are left to the next
    /// poll, which comes within the interval anyway. So a flood of deliveries, replayed or not,
    /// costs at most one poll more an interval.
    WebhookWake,
    /// [`Event::WebhookWake`] for these workflows only, in a daemon serving several: those
    /// that watch the repository or project of the verified delivery. The state thread hands
    /// each a `WebhookWake`; `handle` never sees one.
    WebhookWakeOf(Vec<String>),
    /// `POST /api/v1/<issue>/cancel`: stop the issue's runs and drop its retries; it is not
    /// dispatched again until its tracker state changes.
    Cancel {
        issue_id: IssueId,
    },
    /// A control route's request, answered from the state (the published snapshot lags it):
    /// the state thread's loop sends the state's answer (`State::route_steer`,
    /// `State::route_cancel`) and hands on the event it becomes; `handle` never sees one.
    Asked(Ask),
    Shutdown,
    /// A timer wake-up (retries due, stall checks, next poll).
    Tick,
    /// Daemon-wide room opened for this workflow (another workflow's run ended): blocked
    /// candidates may go now.
    Room,
}

/// A control request the state thread answers on `reply` (the caller waits for it with a
/// timeout), so a route decides from the truth, not from a snapshot up to 100 ms old.
#[derive(Clone, Debug)]
pub enum Ask {
    /// `POST /api/v1/refresh`: answered whether the poll was coalesced with one under way.
    Refresh { reply: Sender<bool> },
    /// `POST /api/v1/<identifier>/steer`: the operator's `message` (its `issue_id` filled in
    /// here), answered where it goes (`running`, `next_run`), `None` when the issue is neither
    /// running nor waiting.
    Steer {
        identifier: String,
        message: Message,
        reply: Sender<Option<Routed>>,
    },
    /// `POST /api/v1/<identifier>/cancel`: answered what was canceled (`running`, `retrying`),
    /// `None` when neither.
    Cancel {
        identifier: String,
        reply: Sender<Option<Routed>>,
    },
}

/// Where an operator's request went: `what` (`running`, `next_run`, `retrying`, or `relayed`
/// with the `holder`, the owner id of the daemon that holds the issue).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routed {
    pub what: &'static str,
    pub holder: Option<String>,
    /// `ambiguous`: the workflows that each have an issue of that identifier.
    pub among: Vec<String>,
}

impl Routed {
    pub fn here(what: &'static str) -> Routed {
        Routed {
            what,
            holder: None,
            among: Vec::new(),
        }
    }

    /// A bare identifier that several workflows have: the operator is to qualify it.
    pub fn ambiguous(among: Vec<String>) -> Routed {
        Routed {
            what: "ambiguous",
            holder: None,
            among,
        }
    }
}

impl Event {
    /// Messages an operator sent (the API, the TUI): no cursor, nothing ignored or held.
    pub fn steer(messages: Vec<Message>) -> Event {
        Event::Steer {
            messages,
            cursor: None,
            ignored: Vec::new(),
            held: Vec::new(),
        }
    }
}

/// A live run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Running {
    pub run_id: String,
    #[serde(flatten)]
    pub slot: Slot,
    pub attempt: Option<u32>,
    pub agent_kind: String,
    pub started_at: Millis,
    pub last_event_at: Millis,
    pub last_event: Option<String>,
    pub last_message: Option<String>,
    pub session_id: Option<String>,
    pub turn_count: u32,
    pub pid: Option<u32>,
    pub tokens: Tokens,
    /// The run's cumulative cost in US dollars, updated with each usage report (see
    /// [`Usage::cost_usd`]); `None` while unknown. Persisted with the finished run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// The run's cost as its bridge reported it in another currency (out of USD sums).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_other: Option<OtherCost>,
    pub stall_timeout_ms: u64,
    /// Set once the orchestrator asked the run to stop.
    pub stopping: Option<StopReason>,
    /// Acquiring a slot on the worker pool (lane `rsv`).
    pub reserving: bool,
    /// The machine it runs on: the pool's id and its host (`None` for this host).
    pub worker_id: Option<String>,
    pub worker_host: Option<String>,
    /// The host its workspace lives on, when that is a remote one reached over SSH.
    pub ssh: Option<SshPlace>,
    /// Steering turns delivered to the agent.
    #[serde(default)]
    pub steering_turns: u32,
    /// The last steering message delivered.
    #[serde(default)]
    pub last_steering: Option<SteeringView>,
    /// Messages handed to the run and not yet delivered (back to the queue if it ends).
    #[serde(default)]
    pub steering_pending: Vec<Message>,
    /// The fencing token of its claim in the claim store (known once the run claimed its
    /// slot): a write about the run is refused once another daemon took the claim over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_token: Option<u64>,
    /// What of the run is in the spend ledger already (its tokens and dollars so far).
    #[serde(default, skip_serializing)]
    pub ledgered: Spent,
}

/// What views show of a delivered steering message.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SteeringView {
    pub author: String,
    pub source: String,
    pub at: String,
    /// The first 200 characters.
    pub text: String,
}

impl Running {
    /// Whether the orchestrator may still stop it: it is not stopping, or only after its
    /// current turn (the day's budget), which any harder stop overrides.
    pub fn may_stop(&self) -> bool {
        matches!(self.stopping, None | Some(StopReason::DailyBudget))
    }

    /// A run as it starts.
    pub fn new(spec: &RunSpec, stall_timeout_ms: u64, now: Millis) -> Running {
        Running {
            run_id: spec.run_id.clone(),
            slot: spec.slot.clone(),
            attempt: spec.attempt,
            agent_kind: spec.agent_kind.clone(),
            started_at: now,
            last_event_at: now,
            last_event: None,
            last_message: None,
            session_id: None,
            turn_count: 0,
            pid: None,
            tokens: Tokens::default(),
            // A run whose prices are known costs nothing until its first usage report.
            cost_usd: {
                let (_, agents) = spec.settings.agent_for_state(&spec.slot.issue.state);
                agents
                    .kinds
                    .get(&spec.agent_kind)
                    .and_then(|r| r.pricing)
                    .map(|_| 0.0)
            },
            cost_other: None,
            stall_timeout_ms,
            stopping: None,
            reserving: false,
            worker_id: None,
            worker_host: None,
            ssh: None,
            steering_turns: 0,
            last_steering: None,
            steering_pending: spec.steering.clone(),
            claim_token: None,
            ledgered: Spent::default(),
        }
    }

    pub fn key(&self) -> Key {
        Key::new(self.slot.issue.id.clone(), self.slot.slot_index)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RetryKind {
    /// A clean exit: check again shortly whether the issue still needs work.
    Continuation,
    /// A failed run: try again with backoff.
    Failure,
    /// A run that met a rate limit: the attempt is not counted; the retry waits for the
    /// limit's reset, or starts at once on a fallback kind.
    RateLimited,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Retry {
    #[serde(flatten)]
    pub slot: Slot,
    /// 0 for a continuation of a first run; else the attempt the next run will be.
    pub attempt: u32,
    pub due_at: Millis,
    pub error: Option<String>,
    pub kind: RetryKind,
    /// A fetch of the issue is under way.
    pub fetching: bool,
    /// The machine the failed or finished run had (the retry prefers it).
    pub worker_id: Option<String>,
    pub worker_host: Option<String>,
    /// The remote host its workspace is on (SSH), if any.
    pub ssh: Option<SshPlace>,
    /// The fencing token of the run it follows (see [`Running::claim_token`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_token: Option<u64>,
    /// The run it follows met a rate limit on this kind (a [`RetryKind::RateLimited`] retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<PreviousAttempt>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BlockedReason {
    GlobalConcurrencyCap,
    LocalConcurrencyCap,
    /// The worker pool has no room: every slot it may create is taken, or a spend cap holds.
    WorkerHostCapacity,
    /// `agent.daily_budget_usd` is reached for the UTC day (beyond the spec's three).
    DailyBudgetReached,
    /// `daemon.max_concurrent_agents` binds: every workflow's runs together fill it, or this
    /// workflow waits for its fair turn (beyond the spec's three).
    DaemonConcurrencyCap,
    /// Every agent kind the issue may use is cooling down after a rate limit (beyond the
    /// spec's three).
    AgentRateLimited,
}

impl BlockedReason {
    pub fn code(self) -> &'static str {
        match self {
            BlockedReason::GlobalConcurrencyCap => "global_concurrency_cap",
            BlockedReason::LocalConcurrencyCap => "local_concurrency_cap",
            BlockedReason::WorkerHostCapacity => "worker_host_capacity",
            BlockedReason::DailyBudgetReached => "daily_budget_reached",
            BlockedReason::DaemonConcurrencyCap => "daemon_concurrency_cap",
            BlockedReason::AgentRateLimited => "agent_rate_limited",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            BlockedReason::GlobalConcurrencyCap => "global concurrency cap",
            BlockedReason::LocalConcurrencyCap => "local state concurrency cap",
            BlockedReason::WorkerHostCapacity => "worker host capacity",
            BlockedReason::DailyBudgetReached => "daily budget reached",
            BlockedReason::DaemonConcurrencyCap => "daemon-wide concurrency cap",
            BlockedReason::AgentRateLimited => "agent rate limited",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    Success,
    Failed,
    Stalled,
    /// The agent's account met a limit (beyond the spec's outcomes): not a failed attempt.
    RateLimited,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failed => "failed",
            Outcome::Stalled => "stalled",
            Outcome::RateLimited => "rate_limited",
        }
    }
}

/// A finished run, kept in the history.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    pub run: Running,
    pub outcome: Outcome,
    pub failure_reason: Option<String>,
    pub ended_at: Millis,
}

/// How a slot is named where people read it: the identifier alone outside ensemble mode,
/// else `<identifier>[<slot>/<size>]`.
pub fn slot_name(identifier: &str, slot: u32, size: u32) -> String {
    if size > 1 {
        format!("{identifier}[{slot}/{size}]")
    } else {
        identifier.to_string()
    }
}

/// Who holds a slot this daemon does not: the owner id of that daemon, and the issue's
/// identifier (to relay an operator's request by it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    pub owner: String,
    pub identifier: String,
}

/// One daemon of the fleet sharing a claim store (the snapshot's `fleet`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    pub owner_id: String,
    pub hostname: String,
    pub pid: u32,
    pub workflow: String,
    /// Where its HTTP API answers (`None` without `server.port`).
    pub url: Option<String>,
    pub started_at: Millis,
    /// Slots it runs now.
    pub running: u32,
    /// Its heartbeat is older than the claim TTL (it is dead, or cut off from the store).
    pub stale: bool,
}

/// An operator's request for an issue another daemon holds, passed on through the claim store
/// and delivered by that daemon exactly once.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Relay {
    /// The holder's owner id.
    pub to_owner: String,
    pub issue_id: IssueId,
    pub identifier: String,
    pub what: Relayed,
}

impl Relay {
    pub fn routed(&self) -> Routed {
        Routed {
            among: Vec::new(),
            what: "relayed",
            holder: Some(self.to_owner.clone()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Relayed {
    Steer(Message),
    Cancel,
}

/// What a sweep of the shared claim store found (`store::Sweep`).
#[derive(Clone, Debug, Default)]
pub struct Swept {
    /// The slots other live owners hold.
    pub foreign: BTreeMap<Key, Holder>,
    /// Retries of dead owners (same attempt and due time) and their runs in flight, as retries.
    pub taken_over: Vec<(Key, Retry)>,
    /// Dead owners' waiting steering messages, this daemon's now.
    pub steering: Vec<Message>,
    /// Steering cursors adopted from dead owners (source -> cursor).
    pub cursors: BTreeMap<String, String>,
    /// Requests other daemons relayed to this one.
    pub relayed: Vec<Relay>,
    /// The fleet, when it changed.
    pub fleet: Option<Vec<Member>>,
    /// Runs that ended since the last sweep, on any daemon of the fleet (newest first).
    pub runs: Vec<RunRecord>,
    /// Other daemons' ledger lines that changed lately (every one, at the first), with their
    /// whole figures: one read again replaces itself.
    pub ledger: Vec<LedgerRow>,
    /// The cooldowns in force this daemon shares (scope `fleet`, or its own host's), read
    /// whole at every sweep.
    pub cooldowns: Vec<Cooldown>,
}

/// What was spent on one line of the ledger (an issue, or a UTC day): tokens, dollars where a
/// price or the bridge said them, and how many runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Spent {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    pub cost_usd: f64,
    pub runs: u64,
}

impl Spent {
    pub fn add(&mut self, other: &Spent) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.total_tokens = self.total_tokens.saturating_add(other.total_tokens);
        self.cost_usd += other.cost_usd;
        self.runs = self.runs.saturating_add(other.runs);
    }

    pub fn sub(&mut self, other: &Spent) {
        self.input_tokens = self.input_tokens.saturating_sub(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_sub(other.output_tokens);
        self.total_tokens = self.total_tokens.saturating_sub(other.total_tokens);
        self.cost_usd = (self.cost_usd - other.cost_usd).max(0.0);
        self.runs = self.runs.saturating_sub(other.runs);
    }

    pub fn is_empty(&self) -> bool {
        *self == Spent::default()
    }
}

/// One daemon's line of the ledger as the store holds it: what `owner` added to `name`
/// (`issue:<identifier>` or `day:<YYYY-MM-DD>`), in all.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerRow {
    pub name: String,
    pub owner: String,
    pub spent: Spent,
}

/// Why a store call failed, which decides what the store thread does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError {
    pub kind: Failure,
    /// What went wrong, naming the store (never its password).
    pub message: String,
}

/// The kinds of [`StoreError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The call failed; the same call may succeed when tried again.
    Failed,
    /// The store cannot be reached now (a server store's connection is down and re-made with
    /// backoff): reported as `claim_store_unavailable`.
    Unavailable,
    /// A write failed for a reason a retry cannot cure (a value out of range, a constraint):
    /// the store thread sets its writes aside one by one.
    ForGood,
    /// The rows were locked past the store's lock bound: another daemon is working on them now.
    Locked,
}

impl StoreError {
    pub fn new(kind: Failure, message: impl Into<String>) -> StoreError {
        StoreError {
            kind,
            message: message.into(),
        }
    }
}

impl From<String> for StoreError {
    fn from(message: String) -> StoreError {
        StoreError::new(Failure::Failed, message)
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreError {}

/// Why a claim was not granted.
#[derive(Debug, PartialEq)]
pub enum Claim {
    /// Another live daemon (this owner id) holds the slot.
    Held(String),
    /// Another daemon (this owner id) ran the slot and let it go after the run's tracker data
    /// was read: the issue may be done.
    Superseded(String),
    /// The day's budget is reached (what was spent against it).
    Budget(DayReached),
    /// The store could not be read or written.
    Failed(StoreError),
}

/// A day whose spend reached its budget (`agent.daily_budget_usd`): the dollars spent on it,
/// every daemon's, and the budget. The run that was refused words it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DayReached {
    pub spent: f64,
    pub budget: f64,
}

/// The claim store as a run thread uses it (the store's `Gate`, a handle of the run threads'
/// own): a run claims its slot here before anything starts, and marks its steering messages
/// delivered as it writes the prompt carrying them.
pub trait ClaimGate: Send + Sync {
    /// Claims `key` for `run` (read from the tracker at `seen_at`); the fencing token. With a
    /// daily budget (`daily_usd`), a day whose spend reached it grants nothing.
    fn acquire(
        &self,
        key: &Key,
        run: &Running,
        seen_at: Millis,
        daily_usd: Option<f64>,
    ) -> Result<u64, Claim>;

    /// Marks steering messages (their keys) delivered, fenced by the run's `token`.
    fn delivered(&self, keys: &[String], token: Option<u64>);

    /// Takes back [`ClaimGate::delivered`]: the prompt was not written, the messages wait.
    fn undelivered(&self, messages: &[Message], token: Option<u64>);
}
