//! The snapshot every view reads: wire payloads built from the state after each batch of events,
//! serialized once, and published through a [`SnapshotHub`] that readers clone cheaply. These are
//! the only types that derive `Serialize` for the runtime payloads; names are the spec's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender, bounded};
use serde::Serialize;

use super::ledger::Ledger;
use super::protocol::Spent;
use super::protocol::{OtherCost, RunRecord, Running, Tokens, round_usd};
use super::state::State;
use super::store::{Capabilities, Kind};
use crate::time::Millis;

use crate::time::rfc3339;

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct TokensPayload {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
}

impl From<Tokens> for TokensPayload {
    fn from(t: Tokens) -> Self {
        TokensPayload {
            input_tokens: t.input,
            output_tokens: t.output,
            total_tokens: t.total,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct UsageTotals {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    pub seconds_running: f64,
}

fn usage(t: Tokens, seconds: f64) -> UsageTotals {
    UsageTotals {
        input_tokens: t.input,
        output_tokens: t.output,
        total_tokens: t.total,
        seconds_running: (seconds * 1000.0).round() / 1000.0,
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Counts {
    pub running: usize,
    pub retrying: usize,
    pub blocked: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunningEntryPayload {
    /// The workflow, when the daemon serves several (beyond the spec; absent with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    pub issue_id: String,
    pub issue_identifier: String,
    pub issue_url: Option<String>,
    pub state: String,
    pub slot_index: u32,
    pub ensemble_size: u32,
    pub worker_host: Option<String>,
    pub workspace_path: String,
    pub session_id: Option<String>,
    pub turn_count: u32,
    pub agent_kind: String,
    pub executor_pid: Option<u32>,
    pub usage_totals: UsageTotals,
    pub last_event: Option<String>,
    pub last_message: Option<String>,
    pub started_at: String,
    pub last_event_at: String,
    pub tokens: TokensPayload,
    /// The run id (not a spec field of this payload; the runs view and TUI use it).
    pub run_id: String,
    pub attempt: Option<u32>,
    pub issue_title: String,
    /// Acquiring a slot on the worker pool (the TUI's lane `rsv`; not a spec field).
    pub reserving: bool,
    /// Steering turns delivered to the agent (beyond the spec: human steering).
    pub steering_turns: u32,
    /// The last steering message delivered: author, source, when written, its first 200
    /// characters.
    pub last_steering: Option<crate::orchestrator::protocol::SteeringView>,
    /// Steering messages handed to the run and not yet delivered.
    pub steering_pending: usize,
    /// The run holds its slot's claim in the claim store (beyond the spec). A run is listed
    /// from its dispatch: until its claim is granted it may still lose the slot to another
    /// daemon of the fleet, and then ends without starting.
    pub claimed: bool,
    /// What was spent on the issue so far, every run and daemon (beyond the spec).
    pub spend: Spent,
}

#[derive(Clone, Debug, Serialize)]
pub struct RetryEntryPayload {
    /// The workflow, when the daemon serves several (beyond the spec; absent with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    pub issue_id: String,
    pub issue_identifier: String,
    pub issue_url: Option<String>,
    pub attempt: u32,
    pub due_at: String,
    pub error: Option<String>,
    pub worker_host: Option<String>,
    pub workspace_path: String,
    /// The ensemble slot this retry is for (beyond the spec's fields, as in running entries).
    pub slot_index: u32,
    pub ensemble_size: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct BlockedEntryPayload {
    /// The workflow, when the daemon serves several (beyond the spec; absent with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    pub issue_id: String,
    pub issue_identifier: String,
    pub issue_url: Option<String>,
    pub state: String,
    pub reason: &'static str,
    pub label: &'static str,
    pub worker_host: Option<String>,
    /// `agent_rate_limited`: the agent kind the issue waits for (beyond the spec; absent for
    /// the other reasons).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_kind: Option<String>,
    /// `agent_rate_limited`: when the earliest cooldown among the kinds the issue may use ends
    /// (beyond the spec; absent for the other reasons).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reset_at: Option<String>,
}

/// An agent kind cooling down after its account met a rate limit (not a spec payload): no run
/// starts on it before `until`, and its runs go to a fallback kind meanwhile. There is no
/// "seconds left": it would move with the clock alone, and views compute it from `until`.
#[derive(Clone, Debug, Serialize)]
pub struct CooldownPayload {
    /// The workflow, when the daemon serves several (absent with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    pub agent_kind: String,
    /// When the limit resets: the time the agent said, else when it was met plus the kind's
    /// `cooldown_ms`.
    pub until: String,
    /// When the limit was met.
    pub since: String,
    /// What said so (the bridge's error or the agent's message, cut short).
    pub reason: String,
    /// `fleet` (shared by every daemon of the claim store) or `host` (this host's daemons).
    pub scope: String,
}

/// An issue waiting for its blockers (`waiting_on_blockers`; not a spec payload).
#[derive(Clone, Debug, Serialize)]
pub struct WaitingEntryPayload {
    /// The workflow, when the daemon serves several (beyond the spec; absent with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    pub issue_id: String,
    pub issue_identifier: String,
    pub issue_url: Option<String>,
    pub state: String,
    /// Its blockers not in a terminal state yet, each with its current state.
    pub blockers: Vec<crate::tracker::Blocker>,
    /// It is a member of a cycle of blockers (they wait for one another).
    pub cycle: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClaimStorePayload {
    pub kind: &'static str,
    pub owner_id: String,
    pub capabilities: Capabilities,
    pub hydrated_at: String,
    pub transactions_applied: u64,
    pub last_operation: Option<String>,
    pub last_checkpoint_at: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Endpoint {
    pub kind: String,
    pub address: Option<String>,
}

/// Facts about this daemon process that the state machine does not own.
#[derive(Clone, Debug, Serialize)]
pub struct DaemonStatus {
    pub owner_id: String,
    pub pid: u32,
    pub hostname: String,
    pub started_at: String,
    pub workflow_path: String,
    pub workspace_root: String,
    pub lock_path: String,
    pub endpoint: Endpoint,
    pub heartbeat_at: String,
    pub heartbeat_age_ms: u64,
    pub stale: bool,
    pub leadership_store_kind: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct RecentEventPayload {
    /// The workflow, when the daemon serves several (beyond the spec; absent with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    pub at: String,
    pub event: String,
    pub message: String,
    pub issue_identifier: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct OpsStatePayload {
    pub generated_at: String,
    pub counts: Counts,
    pub blocked_by_reason: std::collections::BTreeMap<&'static str, usize>,
    pub running: Vec<RunningEntryPayload>,
    pub retrying: Vec<RetryEntryPayload>,
    pub blocked: Vec<BlockedEntryPayload>,
    /// Issues held back until their blockers are done (apart from `blocked`, which is about
    /// capacity; not a spec field).
    pub waiting_on_blockers: Vec<WaitingEntryPayload>,
    /// Agent kinds cooling down after a rate limit, by kind (not a spec field; empty when none).
    pub cooldowns: Vec<CooldownPayload>,
    pub usage_totals: UsageTotals,
    pub rate_limits: Option<serde_json::Value>,
    pub claim_store: ClaimStorePayload,
    pub daemon: Option<DaemonStatus>,
    pub recent_events: Vec<RecentEventPayload>,
    pub reserving: usize,
    /// The worker pool's figures; null without a `worker.worker_pool` block or `worker.kind`
    /// (not a spec field).
    pub worker_pool: Option<WorkerPoolPayload>,
    /// When the next poll is due (not a spec field; it moves with every poll, so it is no
    /// content of the fingerprint).
    pub polling: PollingPayload,
    /// What the `server.webhook_port` listener answered, per route; null without that
    /// listener (not a spec field).
    pub webhooks: Option<WebhooksPayload>,
    /// Every daemon sharing the claim store, this one included (not a spec field): a store
    /// only this daemon uses lists this daemon alone.
    pub fleet: Vec<FleetMemberPayload>,
    /// The spend ledger (not a spec field): the UTC day's spend against
    /// `agent.daily_budget_usd`, and the issues that spent the most.
    pub ledger: LedgerPayload,
    /// The workflows when the daemon serves several (not a spec field; absent with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflows: Option<Vec<WorkflowPayload>>,
}

/// One workflow of a daemon that serves several.
#[derive(Clone, Debug, Serialize)]
pub struct WorkflowPayload {
    pub name: String,
    pub path: String,
    pub tracker_kind: String,
    pub running: usize,
    pub retrying: usize,
    pub blocked: usize,
    /// When its last poll ended (null before the first).
    pub last_poll_at: Option<String>,
    /// Why its last poll or reload failed, or why it cannot start (null when it is well).
    pub last_error: Option<String>,
    /// `ok`, `failing` (its last poll or load failed) or `removed` (its file is gone: its
    /// runs finish, nothing new starts).
    pub status: &'static str,
}

/// What the ledger shows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LedgerPayload {
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    pub today: Spent,
    pub daily_budget_usd: Option<f64>,
    pub daily_budget_reached: bool,
    /// The issues that spent the most (dollars, then tokens), at most [`LEDGER_ISSUES_SHOWN`].
    pub issues: Vec<IssueSpend>,
}

/// How many issues the ledger payload lists.
pub const LEDGER_ISSUES_SHOWN: usize = 20;

/// One issue's line of the ledger.
#[derive(Clone, Debug, Serialize)]
pub struct IssueSpend {
    /// The workflow, when the daemon serves several (absent with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    pub issue_identifier: String,
    #[serde(flatten)]
    pub spent: Spent,
}

/// One daemon of the fleet.
#[derive(Clone, Debug, Serialize)]
pub struct FleetMemberPayload {
    pub owner_id: String,
    pub hostname: String,
    pub pid: u32,
    pub workflow_path: String,
    /// Its HTTP API (null without `server.port`).
    pub url: Option<String>,
    pub started_at: String,
    pub running: u32,
    /// Its heartbeat in the store is older than the claim TTL: dead, or cut off from the store.
    pub stale: bool,
    /// This daemon.
    pub this: bool,
    /// The workflows it serves that share this claim store (a daemon serving several; absent
    /// with one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workflows: Vec<String>,
}

/// Per webhook route (`/webhooks/github`, ...): deliveries accepted (verified and answered 202:
/// woke the poller, an event that wakes nothing, a repeated GitHub delivery) and refused
/// (401, 400, 413, 405), and when the last one arrived.
pub type WebhooksPayload = std::collections::BTreeMap<&'static str, WebhookRoutePayload>;

#[derive(Clone, Debug, Serialize)]
pub struct WebhookRoutePayload {
    pub accepted: u64,
    pub refused: u64,
    pub last_delivery_at: Option<String>,
}

/// The webhook listener's figures as the snapshot shows them.
pub fn webhooks_payload(stats: &crate::webhook::Stats) -> WebhooksPayload {
    crate::webhook::Source::ALL
        .into_iter()
        .map(|source| {
            let f = stats.figures(source);
            (
                source.route(),
                WebhookRoutePayload {
                    accepted: f.accepted,
                    refused: f.refused,
                    last_delivery_at: f.last_at.map(rfc3339),
                },
            )
        })
        .collect()
}

/// The poll schedule: a poll under way, or when the next one is due.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PollingPayload {
    pub in_flight: bool,
    /// Null while a poll is under way.
    pub next_poll_at: Option<String>,
    pub interval_ms: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct WorkerPoolPayload {
    pub driver: String,
    /// Machines that exist (provisioning, ready or being destroyed).
    pub live: u64,
    pub idle: u64,
    pub provisioning: u64,
    pub leased: u64,
    pub waiting: u64,
    /// Leases the pool can hold now, counting machines it may still create; null: unlimited.
    pub slots: Option<u64>,
    /// Why the pool takes no new runs (a spend cap), or null.
    pub capped: Option<String>,
    pub spend: SpendPayload,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SpendPayload {
    /// Worker-seconds used for the pool's life (kept in the spend file across restarts).
    pub worker_seconds: u64,
    /// Worker-seconds used today (UTC).
    pub worker_seconds_today: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LogHints {
    pub svc_log_file: Option<String>,
    pub workspace_path: String,
    pub session_id: Option<String>,
    pub issue_identifier: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Cost {
    /// The run's cost so far in US dollars, to 6 decimal places: the bridge's figure, else its
    /// tokens at the agent's prices; null when neither is known.
    pub estimated_cost_usd: Option<f64>,
    /// The bridge's figure when it reports a currency other than USD (beyond the spec): left
    /// out of every USD sum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_currency: Option<OtherCost>,
}

/// One run, live or finished.
#[derive(Clone, Debug, Serialize)]
pub struct RunPayload {
    /// The workflow, when the daemon serves several (beyond the spec; absent with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    pub id: String,
    pub issue_id: String,
    pub issue_identifier: String,
    pub issue_title: String,
    pub state: String,
    pub slot_index: u32,
    pub ensemble_size: u32,
    pub agent_kind: String,
    pub outcome: &'static str,
    pub retry_attempt: u32,
    pub worker_host: Option<String>,
    pub workspace_path: String,
    pub session_id: Option<String>,
    pub executor_pid: Option<u32>,
    pub usage_totals: UsageTotals,
    pub turn_count: u32,
    pub failure_reason: Option<String>,
    pub last_event: Option<String>,
    pub last_message: Option<String>,
    pub last_event_at: Option<String>,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub duration_ms: Option<u64>,
    pub cost: Cost,
    pub tokens: TokensPayload,
    pub log_hints: LogHints,
    /// Steering turns the run delivered (beyond the spec: human steering).
    pub steering_turns: u32,
}

/// What the daemon knows about itself, for the snapshot.
#[derive(Clone, Debug)]
pub struct DaemonInfo {
    pub owner_id: String,
    pub pid: u32,
    pub hostname: String,
    pub started_at: Millis,
    pub workflow_path: String,
    pub lock_path: String,
    pub endpoint: Endpoint,
    pub log_file: Option<String>,
    /// The kind of claim store this daemon opened (its name and capabilities).
    pub claim_store: &'static Kind,
}

/// An immutable view of the daemon at one moment.
#[derive(Debug)]
pub struct Snapshot {
    pub state: OpsStatePayload,
    /// `state` serialized once, for every reader.
    pub state_json: String,
    /// Live runs first, then history, newest first.
    pub runs: Vec<RunPayload>,
    pub restart_counts: std::collections::BTreeMap<String, u32>,
    /// A hash of what the snapshot says, leaving out what only the clock changes
    /// ([`content_fingerprint`]): equal fingerprints mean nothing happened in between.
    pub fingerprint: u64,
    /// When the state thread built it: the heartbeat (it publishes at least every second).
    pub built_at: Millis,
    /// Running totals since the start (`GET /metrics`).
    pub counters: super::protocol::Counters,
    /// Every issue's line of the ledger, the largest spend first (the issue route's `spend`,
    /// `svc runs --spend`).
    pub spend_by_issue: Vec<(String, Spent)>,
}

/// A ledger line as views show it: dollars to 6 decimal places.
fn shown(mut spent: Spent) -> Spent {
    spent.cost_usd = round_usd(spent.cost_usd);
    spent
}

fn ledger_payload(state: &State, now: Millis, by_issue: &[(String, Spent)]) -> LedgerPayload {
    let issues = &by_issue[..by_issue.len().min(LEDGER_ISSUES_SHOWN)];
    LedgerPayload {
        day: super::ledger::day_of(now),
        today: shown(state.ledger.day(now)),
        daily_budget_usd: state.settings.agent.budgets.daily_budget_usd,
        daily_budget_reached: super::state::daily_budget_reached(state, &state.settings, now),
        issues: issues
            .iter()
            .map(|(issue_identifier, spent)| IssueSpend {
                workflow: state.workflow.as_deref().map(str::to_owned),
                issue_identifier: issue_identifier.clone(),
                spent: shown(*spent),
            })
            .collect(),
    }
}

/// A heartbeat older than this means the state thread is stuck: `stale` in the daemon status.
pub const HEARTBEAT_STALE_MS: Millis = 10_000;

impl Snapshot {
    /// The workflows of a daemon serving several that have an issue of `identifier`
    /// (running, retrying, blocked, waiting for blockers, or among the runs); empty with one.
    pub fn workflows_of(&self, identifier: &str) -> Vec<String> {
        let s = &self.state;
        let entries = (s.running.iter().map(|r| (&r.issue_identifier, &r.workflow)))
            .chain(
                s.retrying
                    .iter()
                    .map(|r| (&r.issue_identifier, &r.workflow)),
            )
            .chain(s.blocked.iter().map(|r| (&r.issue_identifier, &r.workflow)))
            .chain((s.waiting_on_blockers.iter()).map(|r| (&r.issue_identifier, &r.workflow)))
            .chain(self.runs.iter().map(|r| (&r.issue_identifier, &r.workflow)));
        let mut found: Vec<String> = entries
            .filter(|(id, _)| *id == identifier)
            .filter_map(|(_, w)| w.clone())
            .collect();
        found.sort();
        found.dedup();
        found
    }

    /// Whether the daemon serves a workflow of that name (never with one workflow).
    pub fn has_workflow(&self, name: &str) -> bool {
        self.state
            .workflows
            .as_ref()
            .is_some_and(|w| w.iter().any(|w| w.name == name))
    }

    /// The snapshot as one workflow's alone (`?workflow=NAME`, a qualified identifier): its
    /// entries, runs and events, the counts recomputed; daemon-wide figures stay whole.
    pub fn only(&self, workflow: &str) -> Snapshot {
        let mine = |w: &Option<String>| w.as_deref() == Some(workflow);
        let mut state = self.state.clone();
        state.running.retain(|r| mine(&r.workflow));
        state.retrying.retain(|r| mine(&r.workflow));
        state.blocked.retain(|r| mine(&r.workflow));
        state.waiting_on_blockers.retain(|r| mine(&r.workflow));
        state.cooldowns.retain(|c| mine(&c.workflow));
        state.recent_events.retain(|r| mine(&r.workflow));
        state.counts = Counts {
            running: state.running.len(),
            retrying: state.retrying.len(),
            blocked: state.blocked.len(),
        };
        state.blocked_by_reason.clear();
        for b in &state.blocked {
            *state.blocked_by_reason.entry(b.reason).or_insert(0) += 1;
        }
        state.reserving = state.running.iter().filter(|r| r.reserving).count();
        if let Some(list) = &mut state.workflows {
            list.retain(|w| w.name == workflow);
        }
        let state_json = serde_json::to_string(&state).unwrap_or_else(|_| "{}".into());
        Snapshot {
            state,
            state_json,
            runs: self
                .runs
                .iter()
                .filter(|r| mine(&r.workflow))
                .cloned()
                .collect(),
            restart_counts: self.restart_counts.clone(),
            fingerprint: self.fingerprint,
            built_at: self.built_at,
            counters: self.counters.clone(),
            spend_by_issue: self.spend_by_issue.clone(),
        }
    }

    /// The daemon status as of `now`: the heartbeat's age and staleness computed at read time,
    /// so a reader sees a wedged state thread even though nothing new is published.
    pub fn daemon_status_at(&self, now: Millis) -> Option<DaemonStatus> {
        let mut status = self.state.daemon.clone()?;
        let age = now.saturating_sub(self.built_at);
        status.heartbeat_age_ms = age;
        status.stale = age > HEARTBEAT_STALE_MS;
        Some(status)
    }
}

/// Hashes the state payload with the fields that move with the clock alone held still:
/// `generated_at`, the heartbeat, seconds running (totals and per entry), the pool's
/// worker-seconds and the claim store's
/// transaction count (its last operation and checkpoint say what a write changed). Everything
/// else, entries, their last events and messages, tokens, retries, blocked entries, events,
/// rate limits and agent cooldowns (their times are fixed when a limit is met, so only a limit
/// or its end moves them), counts as content.
fn content_fingerprint(payload: &mut OpsStatePayload) -> u64 {
    use std::hash::Hasher;
    // Hold the clock-driven fields still, hash, and put them back (no clone of the payload).
    let generated_at = std::mem::take(&mut payload.generated_at);
    let transactions = std::mem::take(&mut payload.claim_store.transactions_applied);
    let seconds = std::mem::take(&mut payload.usage_totals.seconds_running);
    let entry_seconds: Vec<f64> = payload
        .running
        .iter_mut()
        .map(|r| std::mem::take(&mut r.usage_totals.seconds_running))
        .collect();
    let heartbeat = payload
        .daemon
        .as_mut()
        .map(|d| std::mem::take(&mut d.heartbeat_at));
    let spend = payload
        .worker_pool
        .as_mut()
        .map(|p| std::mem::take(&mut p.spend));
    let polling = std::mem::take(&mut payload.polling);
    // Serialized whole, then hashed in one call: the hasher's cost is per call, and the
    // serializer writes token by token.
    let mut json = Vec::with_capacity(16 * 1024);
    let _ = serde_json::to_writer(&mut json, &*payload);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    hasher.write(&json);
    payload.generated_at = generated_at;
    payload.claim_store.transactions_applied = transactions;
    payload.usage_totals.seconds_running = seconds;
    for (r, s) in payload.running.iter_mut().zip(entry_seconds) {
        r.usage_totals.seconds_running = s;
    }
    if let (Some(d), Some(h)) = (payload.daemon.as_mut(), heartbeat) {
        d.heartbeat_at = h;
    }
    if let (Some(p), Some(s)) = (payload.worker_pool.as_mut(), spend) {
        p.spend = s;
    }
    payload.polling = polling;
    hasher.finish()
}

fn running_payload(r: &Running, now: Millis, ledger: &Ledger) -> RunningEntryPayload {
    let seconds = now.saturating_sub(r.started_at) as f64 / 1000.0;
    RunningEntryPayload {
        workflow: None,
        issue_id: r.slot.issue.id.clone(),
        issue_identifier: r.slot.issue.identifier.clone(),
        issue_url: r.slot.issue.url.clone(),
        state: r.slot.issue.state.clone(),
        slot_index: r.slot.slot_index,
        ensemble_size: r.slot.ensemble_size,
        worker_host: r.worker_host.clone(),
        workspace_path: r.slot.workspace_path.display().to_string(),
        session_id: r.session_id.clone(),
        turn_count: r.turn_count,
        agent_kind: r.agent_kind.clone(),
        executor_pid: r.pid,
        usage_totals: usage(r.tokens, seconds),
        last_event: r.last_event.clone(),
        last_message: r.last_message.clone(),
        started_at: rfc3339(r.started_at),
        last_event_at: rfc3339(r.last_event_at),
        tokens: r.tokens.into(),
        run_id: r.run_id.clone(),
        attempt: r.attempt,
        issue_title: r.slot.issue.title.clone(),
        reserving: r.reserving,
        steering_turns: r.steering_turns,
        last_steering: r.last_steering.clone(),
        steering_pending: r.steering_pending.len(),
        claimed: r.claim_token.is_some(),
        spend: shown(ledger.line(&super::ledger::issue_line(&r.slot.issue.identifier))),
    }
}

fn run_payload(
    r: &Running,
    outcome: &'static str,
    failure: Option<String>,
    ended: Option<Millis>,
    now: Millis,
    log_file: &Option<String>,
) -> RunPayload {
    let end = ended.unwrap_or(now);
    let duration = end.saturating_sub(r.started_at);
    RunPayload {
        workflow: None,
        id: r.run_id.clone(),
        issue_id: r.slot.issue.id.clone(),
        issue_identifier: r.slot.issue.identifier.clone(),
        issue_title: r.slot.issue.title.clone(),
        state: r.slot.issue.state.clone(),
        slot_index: r.slot.slot_index,
        ensemble_size: r.slot.ensemble_size,
        agent_kind: r.agent_kind.clone(),
        outcome,
        retry_attempt: r.attempt.unwrap_or(0),
        worker_host: r.worker_host.clone(),
        workspace_path: r.slot.workspace_path.display().to_string(),
        session_id: r.session_id.clone(),
        executor_pid: r.pid,
        usage_totals: usage(r.tokens, duration as f64 / 1000.0),
        turn_count: r.turn_count,
        failure_reason: failure,
        last_event: r.last_event.clone(),
        last_message: r.last_message.clone(),
        last_event_at: Some(rfc3339(r.last_event_at)),
        started_at: rfc3339(r.started_at),
        ended_at: ended.map(rfc3339),
        duration_ms: Some(duration),
        cost: Cost {
            estimated_cost_usd: r.cost_usd.map(round_usd),
            other_currency: r.cost_other.clone(),
        },
        tokens: r.tokens.into(),
        log_hints: LogHints {
            svc_log_file: log_file.clone(),
            workspace_path: r.slot.workspace_path.display().to_string(),
            session_id: r.session_id.clone(),
            issue_identifier: r.slot.issue.identifier.clone(),
        },
        steering_turns: r.steering_turns,
    }
}

/// Builds the snapshot of `state` at `now`.
pub fn build(
    state: &State,
    daemon: &DaemonInfo,
    now: Millis,
    spend: Option<SpendPayload>,
) -> Snapshot {
    build_with(state, daemon, now, spend, None, false)
}

/// [`build`], told whether the content certainly changed since the last snapshot (agents'
/// activity moved: their last event times always do). Its fingerprint is then a fresh value
/// instead of a hash over the whole content, which spares one of the two serializations.
pub fn build_with(
    state: &State,
    daemon: &DaemonInfo,
    now: Millis,
    spend: Option<SpendPayload>,
    webhooks: Option<WebhooksPayload>,
    changed: bool,
) -> Snapshot {
    build_many(&[state], None, daemon, now, spend, webhooks, changed)
}

/// One workflow's part of a snapshot, before the parts are put together.
struct Part {
    payload: OpsStatePayload,
    live: Vec<RunPayload>,
    history: Vec<RunPayload>,
    restart_counts: std::collections::BTreeMap<String, u32>,
    counters: super::protocol::Counters,
    spend_by_issue: Vec<(String, Spent)>,
}

/// The snapshot of a daemon serving the workflows whose states are `states` (`workflows`
/// lists them when there are several): every entry carries its workflow, counts and totals
/// are the sums, events and runs interleave by time. One state builds what [`build_with`]
/// always built.
pub fn build_many(
    states: &[&State],
    workflows: Option<Vec<WorkflowPayload>>,
    daemon: &DaemonInfo,
    now: Millis,
    spend: Option<SpendPayload>,
    webhooks: Option<WebhooksPayload>,
    changed: bool,
) -> Snapshot {
    let mut parts = states
        .iter()
        .map(|state| part(state, daemon, now, spend, webhooks.clone()));
    let mut whole = parts.next().expect("a daemon serves at least one workflow");
    for p in parts {
        merge(&mut whole, p);
    }
    if states.len() > 1 {
        whole.live.sort_by(|a, b| b.started_at.cmp(&a.started_at));
        whole.history.sort_by(|a, b| b.ended_at.cmp(&a.ended_at));
        let p = &mut whole.payload;
        p.recent_events.sort_by(|a, b| b.at.cmp(&a.at));
        p.recent_events.truncate(super::state::EVENTS_LIMIT);
        p.cooldowns.sort_by(|a, b| {
            (a.agent_kind.as_str(), &a.workflow).cmp(&(b.agent_kind.as_str(), &b.workflow))
        });
        p.ledger.issues.sort_by(|a, b| {
            b.spent
                .cost_usd
                .total_cmp(&a.spent.cost_usd)
                .then(b.spent.total_tokens.cmp(&a.spent.total_tokens))
        });
        p.ledger.issues.truncate(LEDGER_ISSUES_SHOWN);
    }
    whole.payload.workflows = workflows;
    let Part {
        mut payload,
        mut live,
        history,
        restart_counts,
        counters,
        spend_by_issue,
    } = whole;
    let fingerprint = if changed {
        static FRESH: AtomicU64 = AtomicU64::new(0);
        // The top bit set: far from where hashes of real content are likely to repeat.
        FRESH.fetch_add(1, Ordering::Relaxed) | 1 << 63
    } else {
        content_fingerprint(&mut payload)
    };
    let state_json = serde_json::to_string(&payload).unwrap_or_else(|_| "{}".into());
    live.extend(history);
    Snapshot {
        state: payload,
        state_json,
        runs: live,
        restart_counts,
        fingerprint,
        built_at: now,
        counters,
        spend_by_issue,
    }
}

/// Puts `other`'s workflow into `whole`.
fn merge(whole: &mut Part, other: Part) {
    let (p, o) = (&mut whole.payload, other.payload);
    p.counts.running += o.counts.running;
    p.counts.retrying += o.counts.retrying;
    p.counts.blocked += o.counts.blocked;
    for (reason, n) in o.blocked_by_reason {
        *p.blocked_by_reason.entry(reason).or_insert(0) += n;
    }
    p.running.extend(o.running);
    p.retrying.extend(o.retrying);
    p.blocked.extend(o.blocked);
    p.waiting_on_blockers.extend(o.waiting_on_blockers);
    p.cooldowns.extend(o.cooldowns);
    p.usage_totals.input_tokens += o.usage_totals.input_tokens;
    p.usage_totals.output_tokens += o.usage_totals.output_tokens;
    p.usage_totals.total_tokens += o.usage_totals.total_tokens;
    p.usage_totals.seconds_running += o.usage_totals.seconds_running;
    if p.rate_limits.is_none() {
        p.rate_limits = o.rate_limits;
    }
    p.recent_events.extend(o.recent_events);
    p.reserving += o.reserving;
    if o.polling.in_flight {
        p.polling.in_flight = true;
    }
    p.polling.next_poll_at = match (p.polling.next_poll_at.take(), o.polling.next_poll_at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    p.ledger.today.add(&o.ledger.today);
    p.ledger.daily_budget_reached |= o.ledger.daily_budget_reached;
    p.ledger.issues.extend(o.ledger.issues);
    // One entry a daemon, listing the workflows it shares a store part with this one in.
    for member in o.fleet {
        match p.fleet.iter_mut().find(|m| m.owner_id == member.owner_id) {
            Some(m) => {
                m.workflows.extend(member.workflows);
                m.running += member.running;
            }
            None => p.fleet.push(member),
        }
    }
    whole.live.extend(other.live);
    whole.history.extend(other.history);
    for (issue, n) in other.restart_counts {
        *whole.restart_counts.entry(issue).or_default() += n;
    }
    whole.counters.add(&other.counters);
    whole.spend_by_issue.extend(other.spend_by_issue);
}

/// One workflow's payloads.
fn part(
    state: &State,
    daemon: &DaemonInfo,
    now: Millis,
    spend: Option<SpendPayload>,
    webhooks: Option<WebhooksPayload>,
) -> Part {
    let workflow: &Option<String> = &state.workflow.as_deref().map(str::to_owned);
    let running: Vec<RunningEntryPayload> = state
        .running
        .values()
        .map(|r| RunningEntryPayload {
            workflow: workflow.clone(),
            ..running_payload(r, now, &state.ledger)
        })
        .collect();
    let spend_by_issue = state.ledger.issues();
    let retrying: Vec<RetryEntryPayload> = state
        .retries
        .values()
        .map(|r| RetryEntryPayload {
            workflow: workflow.clone(),
            issue_id: r.slot.issue.id.clone(),
            issue_identifier: r.slot.issue.identifier.clone(),
            issue_url: r.slot.issue.url.clone(),
            attempt: r.attempt,
            due_at: rfc3339(r.due_at),
            error: r.error.clone(),
            worker_host: r.worker_host.clone(),
            workspace_path: r.slot.workspace_path.display().to_string(),
            slot_index: r.slot.slot_index,
            ensemble_size: r.slot.ensemble_size,
        })
        .collect();
    let blocked: Vec<BlockedEntryPayload> = state
        .blocked
        .iter()
        .map(|b| BlockedEntryPayload {
            workflow: workflow.clone(),
            issue_id: b.issue.id.clone(),
            issue_identifier: b.issue.identifier.clone(),
            issue_url: b.issue.url.clone(),
            state: b.issue.state.clone(),
            reason: b.reason.code(),
            label: b.reason.label(),
            worker_host: None,
            agent_kind: b.agent_kind.clone(),
            reset_at: b.until.map(rfc3339),
        })
        .collect();
    let mut blocked_by_reason = std::collections::BTreeMap::new();
    for b in &state.blocked {
        *blocked_by_reason.entry(b.reason.code()).or_insert(0) += 1;
    }
    let mut tokens = state.finished_tokens;
    let mut seconds = state.finished_seconds;
    for r in state.running.values() {
        tokens.add(r.tokens);
        seconds += now.saturating_sub(r.started_at) as f64 / 1000.0;
    }
    let started = rfc3339(daemon.started_at);
    let payload = OpsStatePayload {
        generated_at: rfc3339(now),
        counts: Counts {
            running: running.len(),
            retrying: retrying.len(),
            blocked: blocked.len(),
        },
        blocked_by_reason,
        running,
        retrying,
        blocked,
        waiting_on_blockers: state
            .waiting
            .iter()
            .map(|w| WaitingEntryPayload {
                workflow: workflow.clone(),
                issue_id: w.issue.id.clone(),
                issue_identifier: w.issue.identifier.clone(),
                issue_url: w.issue.url.clone(),
                state: w.issue.state.clone(),
                blockers: w.blockers.clone(),
                cycle: w.cycle,
            })
            .collect(),
        cooldowns: state
            .cooldowns
            .values()
            .map(|c| CooldownPayload {
                workflow: workflow.clone(),
                agent_kind: c.kind.clone(),
                until: rfc3339(c.until),
                since: rfc3339(c.since),
                reason: c.reason.clone(),
                scope: c.scope.clone(),
            })
            .collect(),
        usage_totals: usage(tokens, seconds),
        rate_limits: state.rate_limits.clone(),
        fleet: fleet(state, daemon),
        ledger: ledger_payload(state, now, &spend_by_issue),
        claim_store: ClaimStorePayload {
            kind: daemon.claim_store.name,
            owner_id: daemon.owner_id.clone(),
            capabilities: daemon.claim_store.capabilities,
            hydrated_at: rfc3339(state.claim_store.hydrated_at),
            transactions_applied: state.claim_store.transactions_applied,
            last_operation: state.claim_store.last_operation.clone(),
            last_checkpoint_at: state.claim_store.last_checkpoint_at.map(rfc3339),
        },
        daemon: Some(DaemonStatus {
            owner_id: daemon.owner_id.clone(),
            pid: daemon.pid,
            hostname: daemon.hostname.clone(),
            started_at: started,
            workflow_path: daemon.workflow_path.clone(),
            workspace_root: state.settings.workspace.root.display().to_string(),
            lock_path: daemon.lock_path.clone(),
            endpoint: daemon.endpoint.clone(),
            heartbeat_at: rfc3339(now),
            heartbeat_age_ms: 0,
            stale: false,
            leadership_store_kind: daemon.claim_store.leadership,
        }),
        recent_events: state
            .events
            .iter()
            .map(|e| RecentEventPayload {
                workflow: workflow.clone(),
                at: rfc3339(e.at),
                event: e.event.clone(),
                message: e.message.clone(),
                issue_identifier: e.issue_identifier.clone(),
            })
            .collect(),
        reserving: state.running.values().filter(|r| r.reserving).count(),
        worker_pool: state
            .pool
            .as_ref()
            .filter(|p| p.configured)
            .map(|p| WorkerPoolPayload {
                driver: p.driver.clone(),
                live: p.status.live,
                idle: p.status.idle,
                provisioning: p.status.provisioning,
                leased: p.status.leased,
                waiting: p.status.waiting,
                slots: p.status.slots,
                capped: p.status.capped.clone(),
                spend: spend.unwrap_or_default(),
            }),
        polling: PollingPayload {
            in_flight: state.poll_in_flight,
            next_poll_at: (!state.poll_in_flight).then(|| rfc3339(state.next_poll_at)),
            interval_ms: state.settings.polling.interval_ms,
        },
        webhooks,
        workflows: None,
    };
    let tag = |run: RunPayload| RunPayload {
        workflow: workflow.clone(),
        ..run
    };
    let mut live: Vec<RunPayload> = state
        .running
        .values()
        .map(|r| tag(run_payload(r, "running", None, None, now, &daemon.log_file)))
        .collect();
    live.sort_by(|a, b| b.started_at.cmp(&a.started_at));
    let history = state.history.iter().map(|h: &RunRecord| {
        let outcome = h.outcome.as_str();
        tag(run_payload(
            &h.run,
            outcome,
            h.failure_reason.clone(),
            Some(h.ended_at),
            now,
            &daemon.log_file,
        ))
    });
    Part {
        payload,
        live,
        history: history.collect(),
        // Per issue: the restarts of all its slots.
        restart_counts: state.restart_counts.iter().fold(
            std::collections::BTreeMap::new(),
            |mut by_issue, (key, n)| {
                *by_issue.entry(key.issue_id.clone()).or_default() += n;
                by_issue
            },
        ),
        counters: state.counters.clone(),
        spend_by_issue,
    }
}

/// Where the state thread publishes snapshots. Readers take the current one (an `Arc` clone
/// under a lock held for nanoseconds) or subscribe to be told of each new one.
pub struct SnapshotHub {
    current: Mutex<Arc<Snapshot>>,
    version: AtomicU64,
    watchers: Mutex<Vec<Sender<()>>>,
}

impl SnapshotHub {
    pub fn new(initial: Snapshot) -> SnapshotHub {
        SnapshotHub {
            current: Mutex::new(Arc::new(initial)),
            version: AtomicU64::new(0),
            watchers: Mutex::new(Vec::new()),
        }
    }

    pub fn current(&self) -> Arc<Snapshot> {
        Arc::clone(&self.current.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Makes `snapshot` the current one. Readers of [`SnapshotHub::current`] always get the
    /// newest (a fresh `generated_at` and heartbeat); the version moves and subscribers are
    /// woken only when its content changed, so an idle daemon sends nobody anything. Returns
    /// whether it changed.
    pub fn publish(&self, snapshot: Snapshot) -> bool {
        let fingerprint = snapshot.fingerprint;
        let previous = std::mem::replace(
            &mut *self.current.lock().unwrap_or_else(|p| p.into_inner()),
            Arc::new(snapshot),
        );
        if previous.fingerprint == fingerprint && self.version() > 0 {
            return false;
        }
        self.version.fetch_add(1, Ordering::AcqRel);
        let mut watchers = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
        // A full channel already holds a wake-up; a closed one belongs to a gone reader.
        watchers.retain(|w| {
            !matches!(
                w.try_send(()),
                Err(crossbeam_channel::TrySendError::Disconnected(_))
            )
        });
        true
    }

    /// Disconnects every subscriber (after the last publication).
    pub fn close(&self) {
        self.watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// A channel that receives a wake-up after each publish (coalesced while unread).
    pub fn subscribe(&self) -> Receiver<()> {
        let (tx, rx) = bounded(1);
        self.watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        rx
    }
}

/// The fleet as the claim store's last sweep saw it; this daemon alone before the first sweep
/// (or with a store only it uses).
fn fleet(state: &State, daemon: &DaemonInfo) -> Vec<FleetMemberPayload> {
    let me = crate::orchestrator::protocol::Member {
        owner_id: daemon.owner_id.clone(),
        hostname: daemon.hostname.clone(),
        pid: daemon.pid,
        workflow: daemon.workflow_path.clone(),
        url: daemon.endpoint.address.clone(),
        started_at: daemon.started_at,
        running: u32::try_from(state.running.len()).unwrap_or(u32::MAX),
        stale: false,
    };
    let members: Vec<&crate::orchestrator::protocol::Member> =
        if state.fleet.iter().any(|m| m.owner_id == daemon.owner_id) {
            state.fleet.iter().collect()
        } else {
            std::iter::once(&me).chain(&state.fleet).collect()
        };
    members
        .into_iter()
        .map(|m| {
            let this = m.owner_id == daemon.owner_id;
            FleetMemberPayload {
                owner_id: m.owner_id.clone(),
                hostname: m.hostname.clone(),
                pid: m.pid,
                workflow_path: m.workflow.clone(),
                url: m.url.clone(),
                started_at: rfc3339(m.started_at),
                // This daemon's own count is live; the others' are as of the last sweep.
                running: if this { me.running } else { m.running },
                stale: m.stale && !this,
                this,
                workflows: state.workflow.iter().map(|w| w.to_string()).collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
