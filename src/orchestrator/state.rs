//! The orchestration state machine: a plain function of (state, event, now) that returns
//! effects. It does no I/O, spawns nothing and reads no clock, so every transition is tested with
//! a fake clock. The state thread (`orchestrator::runtime`) feeds it events and executes effects.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use super::dispatch;
use super::inbox::Inbox;
use super::protocol::Spent;
use super::protocol::{
    BlockedReason, Counters, Decision, Effect, Event, Holder, IssueId, Key, Member, Mode, Outcome,
    PollReport, Relay, Relayed, Retry, RetryKind, Routed, RunEnd, RunMsg, RunRecord, RunSpec,
    Running, Slot, SshPlace, SteeringView, StopReason, Swept, TAKEN_OVER, Tokens, round_usd,
    slot_name,
};
use crate::config::{Isolation, Settings};
use crate::steering::{self, Message};
use crate::time::Millis;
use crate::tracker::{Blocker, Issue};
use crate::workers::PoolView;
use crate::workspace;

mod budget;
mod exit;
mod fleet;
pub mod limits;
mod steer;

use budget::{check_budgets, held_over_budget};
pub use budget::{daily_budget_reached, over_issue_budget};
use exit::{on_exit, on_retry_fetched, take_ended};
use fleet::on_claims;
pub use limits::adopt as adopt_cooldowns;
use steer::{on_steer, report_dropped};

pub const HISTORY_LIMIT: usize = 50;
pub const EVENTS_LIMIT: usize = 20;
pub const CONTINUATION_DELAY_MS: Millis = 1000;
pub const BASE_BACKOFF_MS: Millis = 10_000;
pub const NO_SLOTS: &str = "no available orchestrator slots";

#[derive(Clone, Debug)]
pub struct Blocked {
    pub issue: Issue,
    pub reason: BlockedReason,
    /// `agent_rate_limited`: the kind the issue waits for, and when its cooldown ends.
    pub agent_kind: Option<String>,
    pub until: Option<Millis>,
}

/// An issue held back from its first run until its blockers are done (not a capacity block).
#[derive(Clone, Debug)]
pub struct Waiting {
    pub issue: Issue,
    /// Its blockers not in a terminal state, each in its current state.
    pub blockers: Vec<Blocker>,
    /// It is a member of a cycle of blockers.
    pub cycle: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecentEvent {
    pub at: Millis,
    pub event: String,
    pub message: String,
    pub issue_identifier: Option<String>,
}

/// The claim store's figures (the snapshot's `claim_store`, with the kind the daemon names):
/// when the state got what it held, and the batches its store thread wrote since.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreView {
    pub hydrated_at: Millis,
    pub transactions_applied: u64,
    pub last_operation: Option<String>,
    pub last_checkpoint_at: Option<Millis>,
}

/// All orchestration state. Owned by the state thread; nothing else mutates it.
#[derive(Debug)]
pub struct State {
    pub settings: Arc<Settings>,
    /// Live runs, by issue slot. Invariant: a key is in at most one of `running`, `retries`
    /// and `removing`.
    pub running: BTreeMap<Key, Running>,
    pub retries: BTreeMap<Key, Retry>,
    /// Slots whose workspace is being removed.
    pub removing: BTreeSet<Key>,
    /// Slots another daemon sharing the claim store holds (running or retrying): never
    /// dispatched here; a run of ours among them was taken over and is stopped.
    pub foreign: BTreeMap<Key, Holder>,
    /// The daemons sharing the claim store (the snapshot's `fleet`); empty until a sweep.
    pub fleet: Vec<Member>,
    /// Operator requests for issues another daemon holds, for the claim store to relay.
    pub relay_out: Vec<Relay>,
    /// Runs of the history that other daemons of the fleet ran (not written again).
    pub fleet_runs: BTreeSet<String>,
    /// Slots another daemon ran and let go after the last candidates were read: not
    /// dispatched again from them (cleared by the next poll).
    pub superseded: BTreeSet<Key>,
    /// When the last candidates were read from the tracker (the poll's start).
    pub candidates_read_at: Millis,
    /// Rebuilt on every dispatch pass.
    pub blocked: Vec<Blocked>,
    /// Issues waiting for their blockers; rebuilt on every dispatch pass.
    pub waiting: Vec<Waiting>,
    /// The cycles of blockers of the last poll, each its members' ids (reported once each).
    pub blocker_cycles: BTreeSet<Vec<IssueId>>,
    /// Newest first, at most [`HISTORY_LIMIT`].
    pub history: VecDeque<RunRecord>,
    /// Newest first, at most [`EVENTS_LIMIT`].
    pub events: VecDeque<RecentEvent>,
    /// Tokens and seconds of finished runs.
    pub finished_tokens: Tokens,
    pub finished_seconds: f64,
    pub restart_counts: BTreeMap<Key, u32>,
    pub poll_in_flight: bool,
    /// A live feed woke the daemon while a poll was under way: poll again when it is done.
    pub wake_pending: bool,
    /// When a webhook delivery last brought a poll forward: another within a polling interval
    /// of it is left to the next poll, due within that interval ([`Event::WebhookWake`]).
    pub webhook_polled_at: Option<Millis>,
    pub next_poll_at: Millis,
    pub first_poll_done: bool,
    pub shutting_down: bool,
    pub exited: bool,
    /// The tracker's last reported rate limits (`rate_limits` in the snapshot).
    pub rate_limits: Option<serde_json::Value>,
    /// The worker pool's last reported figures (dispatch respects its room).
    pub pool: Option<PoolView>,
    pub mode: Mode,
    /// The claim store's figures (set by the state thread's loop).
    pub claim_store: StoreView,
    /// `--once`: the one dispatch pass happened.
    pub once_dispatched: bool,
    pub counters: Counters,
    /// The exit code the daemon ends with (`--once`: 1 when a run failed or the poll did).
    pub exit_code: u8,
    run_seq: u64,
    /// The last candidate list, for re-dispatching when a slot frees.
    last_candidates: Vec<Issue>,
    /// Steering: messages waiting for an issue's next run, keys taken and ignored, the
    /// sources' cursors, and the version the state thread persists by.
    pub steering: Inbox,
    /// Issues the operator canceled, with the tracker state they had then: not dispatched
    /// again while a poll reports them in that state (in memory only).
    pub canceled: BTreeMap<IssueId, String>,
    /// What was spent per issue and per UTC day, the fleet's (see [`super::ledger`]).
    pub ledger: super::ledger::Ledger,
    /// The time of the event being handled (the day the ledger counts for capacity checks).
    pub now: Millis,
    /// The workflow's name when the daemon serves several (`None`: the only one; nothing
    /// it shows or writes changes then).
    pub workflow: Option<Arc<str>>,
    /// What the daemon-wide limits leave this workflow, set by the state thread before each
    /// event (see [`Shared`]).
    pub shared: Shared,
    /// The workflow's file left the daemon's directory: no dispatch pass starts anything.
    pub retired: bool,
    /// Agent kinds cooling down after a rate limit, by kind (one ended is dropped, said
    /// `agent_cooldown_ended`); persisted in the claim store and shared by its scope.
    pub cooldowns: BTreeMap<String, super::protocol::Cooldown>,
    /// Silent turns in a row, by kind (two are a limit).
    pub silent_turns: BTreeMap<String, u32>,
}

/// The daemon-wide limits as they stand for one workflow: the state thread sets them before
/// each event it hands this workflow's state, from every workflow's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shared {
    /// Runs of the daemon's other workflows (a worker pool's room counts them too).
    pub others_running: usize,
    /// How many more runs this workflow may start now under `daemon.max_concurrent_agents`
    /// (its fair share of what is free); `None`: no daemon-wide cap.
    pub room: Option<usize>,
    /// `daemon.daily_budget_usd` is spent for the UTC day, by every workflow together.
    pub budget_reached: bool,
}

impl State {
    pub fn new(settings: Arc<Settings>, now: Millis) -> State {
        State {
            settings,
            running: BTreeMap::new(),
            retries: BTreeMap::new(),
            removing: BTreeSet::new(),
            foreign: BTreeMap::new(),
            fleet: Vec::new(),
            relay_out: Vec::new(),
            fleet_runs: BTreeSet::new(),
            superseded: BTreeSet::new(),
            candidates_read_at: 0,
            blocked: Vec::new(),
            waiting: Vec::new(),
            blocker_cycles: BTreeSet::new(),
            history: VecDeque::new(),
            events: VecDeque::new(),
            finished_tokens: Tokens::default(),
            finished_seconds: 0.0,
            restart_counts: BTreeMap::new(),
            poll_in_flight: false,
            wake_pending: false,
            webhook_polled_at: None,
            next_poll_at: now,
            first_poll_done: false,
            shutting_down: false,
            exited: false,
            rate_limits: None,
            pool: None,
            mode: Mode::default(),
            claim_store: StoreView {
                hydrated_at: now,
                ..StoreView::default()
            },
            once_dispatched: false,
            counters: Counters::default(),
            exit_code: 0,
            run_seq: 0,
            last_candidates: Vec::new(),
            steering: Inbox::default(),
            canceled: BTreeMap::new(),
            ledger: super::ledger::Ledger::default(),
            now,
            workflow: None,
            shared: Shared::default(),
            retired: false,
            cooldowns: BTreeMap::new(),
            silent_turns: BTreeMap::new(),
        }
    }

    /// Where an operator's steering `message` for `identifier` goes, and the event it becomes
    /// (`None`: nowhere, nothing to do). The state thread sends the answer before it handles
    /// the event, so the answer says what the state was when the request arrived.
    pub fn route_steer(
        &self,
        identifier: &str,
        mut message: Message,
    ) -> (Option<Routed>, Option<Event>) {
        let Some((issue_id, delivery)) = self.steer_target(identifier) else {
            let relay = self.relay_target(identifier, |issue_id| {
                message.issue_id = issue_id.to_string();
                Relayed::Steer(message)
            });
            return (relay.as_ref().map(Relay::routed), relay.map(Event::Relay));
        };
        message.issue_id = issue_id;
        (
            Some(Routed::here(delivery)),
            Some(Event::steer(vec![message])),
        )
    }

    /// What an operator's cancel of `identifier` stops, and the event it becomes (`None`:
    /// nothing runs or retries under that identifier here or elsewhere).
    pub fn route_cancel(&self, identifier: &str) -> (Option<Routed>, Option<Event>) {
        let Some((issue_id, what)) = self.cancel_target(identifier) else {
            let relay = self.relay_target(identifier, |_| Relayed::Cancel);
            return (relay.as_ref().map(Relay::routed), relay.map(Event::Relay));
        };
        (Some(Routed::here(what)), Some(Event::Cancel { issue_id }))
    }

    /// A request for `identifier` passed on to the daemon that holds it (running or
    /// retrying), when another daemon sharing the claim store does.
    fn relay_target(&self, identifier: &str, what: impl FnOnce(&str) -> Relayed) -> Option<Relay> {
        let (key, holder) = self
            .foreign
            .iter()
            .find(|(_, h)| h.identifier == identifier && !h.owner.is_empty())?;
        Some(Relay {
            to_owner: holder.owner.clone(),
            issue_id: key.issue_id.clone(),
            identifier: identifier.to_string(),
            what: what(&key.issue_id),
        })
    }

    /// The id of `identifier` when it runs here.
    fn running_id(&self, identifier: &str) -> Option<IssueId> {
        self.running
            .values()
            .find(|r| r.slot.issue.identifier == identifier)
            .map(|r| r.slot.issue.id.clone())
    }

    /// Where an operator's message for `identifier` goes: its running agent (`running`), or
    /// its next run while it retries or waits for a slot (`next_run`).
    pub fn steer_target(&self, identifier: &str) -> Option<(IssueId, &'static str)> {
        let waiting = || {
            self.retries
                .values()
                .map(|r| &r.slot.issue)
                .chain(self.blocked.iter().map(|b| &b.issue))
                .find(|i| i.identifier == identifier)
                .map(|i| (i.id.clone(), "next_run"))
        };
        self.running_id(identifier)
            .map(|id| (id, "running"))
            .or_else(waiting)
    }

    /// What an operator's cancel of `identifier` stops: its runs (`running`), else its retry
    /// (`retrying`).
    pub fn cancel_target(&self, identifier: &str) -> Option<(IssueId, &'static str)> {
        let retrying = || {
            self.retries
                .values()
                .find(|r| r.slot.issue.identifier == identifier)
                .map(|r| (r.slot.issue.id.clone(), "retrying"))
        };
        self.running_id(identifier)
            .map(|id| (id, "running"))
            .or_else(retrying)
    }

    /// Every steering message not yet delivered: queued ones and those handed to runs.
    pub fn undelivered_steering(&self) -> impl Iterator<Item = &Message> {
        self.steering
            .queued()
            .chain(self.running.values().flat_map(|r| &r.steering_pending))
    }

    fn event(&mut self, now: Millis, event: &str, message: impl Into<String>, issue: Option<&str>) {
        match self.counters.events.get_mut(event) {
            Some(n) => *n += 1,
            None => {
                self.counters.events.insert(event.to_string(), 1);
            }
        }
        self.events.push_front(RecentEvent {
            at: now,
            event: event.to_string(),
            message: message.into(),
            issue_identifier: issue.map(str::to_string),
        });
        self.events.truncate(EVENTS_LIMIT);
    }

    /// Whether this slot is taken: here (running, retrying, being cleaned up) or elsewhere.
    fn is_claimed(&self, key: &Key) -> bool {
        self.running.contains_key(key)
            || self.retries.contains_key(key)
            || self.removing.contains(key)
            || self.foreign.contains_key(key)
            || self.superseded.contains(key)
    }

    /// Whether any slot of the issue is taken here or elsewhere.
    fn issue_claimed(&self, id: &str) -> bool {
        let of = |k: &Key| k.issue_id == id;
        self.running.keys().any(of)
            || self.retries.keys().any(of)
            || self.removing.iter().any(of)
            || self.foreign.keys().any(of)
    }

    /// When the state thread should wake next, if nothing else happens first.
    pub fn next_deadline(&self) -> Option<Millis> {
        if self.exited {
            return None;
        }
        let mut next = (!self.shutting_down && !self.poll_in_flight).then_some(self.next_poll_at);
        let mut consider = |t: Millis| next = Some(next.map_or(t, |n: Millis| n.min(t)));
        for r in self.retries.values().filter(|r| !r.fetching) {
            consider(r.due_at);
        }
        for c in self.cooldowns.values() {
            consider(c.until);
        }
        for r in self
            .running
            .values()
            .filter(|r| r.stall_timeout_ms > 0 && r.may_stop())
        {
            consider(r.last_event_at + r.stall_timeout_ms);
        }
        next
    }
}

/// Backoff before retry `attempt` (1-based): `min(10000 * 2^(attempt-1), max)`.
pub fn backoff_ms(attempt: u32, max_backoff_ms: u64) -> Millis {
    let exp = attempt.saturating_sub(1).min(40);
    BASE_BACKOFF_MS
        .saturating_mul(1u64 << exp)
        .min(max_backoff_ms)
}

/// Feeds one event to the machine.
pub fn handle(state: &mut State, now: Millis, event: Event) -> Vec<Effect> {
    state.now = now;
    let mut fx = Vec::new();
    match event {
        Event::Tick => {}
        Event::Room => {
            if may_redispatch(state) {
                dispatch_pass(state, now, &mut fx);
            }
        }
        Event::Reloaded(settings) => {
            // Listeners, the store and the trace watcher were set up at start: say so when a
            // reload changes what only a restart applies.
            let (old, new) = (&state.settings.server, &settings.server);
            let restart_only = [
                ("server.host", old.host.clone(), new.host.clone()),
                ("server.port", old.port.to_string(), new.port.to_string()),
                (
                    "server.mcp_port",
                    format!("{:?}", old.mcp_port),
                    format!("{:?}", new.mcp_port),
                ),
                (
                    "server.webhook_port",
                    format!("{:?}", old.webhook_port),
                    format!("{:?}", new.webhook_port),
                ),
                (
                    "server.webhook_host",
                    old.webhook_host.clone(),
                    new.webhook_host.clone(),
                ),
                (
                    "server.issue_store_path",
                    old.issue_store_path.display().to_string(),
                    new.issue_store_path.display().to_string(),
                ),
                (
                    "server.trace_dir",
                    old.trace_dir.display().to_string(),
                    new.trace_dir.display().to_string(),
                ),
            ];
            for (key, before, after) in restart_only {
                if before != after {
                    state.event(
                        now,
                        "settings_need_restart",
                        format!("{key} changed ({before} -> {after}); restart svc to apply it"),
                        None,
                    );
                }
            }
            // Another tracker: what its predecessor's sources queued is not for these issues.
            // The operator's own (API, TUI) stay.
            if state.settings.tracker.kind != settings.tracker.kind {
                let dropped = state.steering.retain(|m| m.source.is_operator());
                report_dropped(state, now, dropped, "the tracker changed");
            }
            state.settings = settings;
        }
        Event::ReloadFailed(msg) => state.event(
            now,
            "workflow_reload_failed",
            format!("{msg}; keeping the last good settings"),
            None,
        ),
        Event::Notice { event, message } => state.event(now, &event, message, None),
        Event::Persisted { ops, last, at } => {
            let d = &mut state.claim_store;
            d.transactions_applied += 1;
            d.last_operation = Some(format!("{last} ({ops} change(s))"));
            d.last_checkpoint_at = Some(at);
        }
        Event::Pool(view) => {
            let had_room = pool_room(state);
            state.pool = Some(view);
            // Room opened (a machine came up, a cap lifted): blocked candidates may go now.
            if !had_room && pool_room(state) && may_redispatch(state) {
                dispatch_pass(state, now, &mut fx);
            }
        }
        Event::PollDone(report) => on_poll(state, now, report, &mut fx),
        Event::Steer {
            messages,
            cursor,
            ignored,
            held,
        } => {
            for why in ignored {
                state.event(
                    now,
                    "steering_ignored",
                    format!("not delivered: {why}"),
                    None,
                );
            }
            on_steer(state, now, messages, held, cursor, &mut fx)
        }
        Event::Run { run_id, msg } => on_run(state, now, &run_id, msg, &mut fx),
        Event::RetryFetched { key, result } => on_retry_fetched(state, now, key, result, &mut fx),
        Event::Swept(swept) => on_claims(state, now, *swept, &mut fx),
        Event::WorkspaceRemoved { key, result } => {
            // Leftover workspaces of terminal issues were never claimed; removing is a no-op.
            state.removing.remove(&key);
            // The issue is over: nothing waits for its next run any more.
            let dropped = state.steering.release(&key.issue_id);
            report_dropped(state, now, dropped, "the issue is over");
            match result {
                Ok(()) => state.event(
                    now,
                    "workspace_removed",
                    format!("workspace of {} removed", key.issue_id),
                    None,
                ),
                Err(e) => state.event(now, "workspace_remove_failed", e, None),
            }
        }
        Event::Refresh => {
            if !state.poll_in_flight && !state.shutting_down {
                state.next_poll_at = now;
            }
        }
        Event::Wake => wake(state, now),
        Event::WebhookWake => {
            let interval = state.settings.polling.interval_ms;
            let recent = state
                .webhook_polled_at
                .is_some_and(|at| now < at.saturating_add(interval));
            if !recent && !state.shutting_down {
                state.webhook_polled_at = Some(now);
                wake(state, now);
            }
        }
        Event::Cancel { issue_id } => on_cancel(state, now, issue_id, &mut fx),
        Event::Relay(relay) => {
            let what = match &relay.what {
                Relayed::Steer(_) => "a steering message",
                Relayed::Cancel => "a cancel",
            };
            state.event(
                now,
                "control_relayed",
                format!(
                    "{what} relayed to daemon {}, which holds the issue",
                    relay.to_owner
                ),
                Some(&relay.identifier.clone()),
            );
            state.relay_out.push(relay);
        }
        // Answered by the state thread's loop (`route_steer`, `route_cancel`) before it gets here.
        Event::Asked(_) | Event::WebhookWakeOf(_) => {}
        Event::Shutdown => {
            if !state.shutting_down {
                state.shutting_down = true;
                state.retries.clear();
                state.blocked.clear();
                state.waiting.clear();
                state.event(now, "shutdown", "stopping runs", None);
                for r in state.running.values_mut() {
                    if r.may_stop() {
                        r.stopping = Some(StopReason::Shutdown);
                        fx.push(Effect::CancelRun {
                            run_id: r.run_id.clone(),
                            reason: StopReason::Shutdown,
                        });
                    }
                }
            }
        }
    }
    on_timers(state, now, &mut fx);
    let once_over = state.mode.once && state.once_dispatched && state.running.is_empty();
    if (state.shutting_down || once_over)
        && state.running.is_empty()
        && state.removing.is_empty()
        && !state.exited
    {
        state.exited = true;
        fx.push(Effect::Exit);
    }
    fx
}

/// The operator's cancel: every run of the issue is stopped (outcome `failed` with the error
/// "canceled by the operator", no retry),
/// its retries are dropped, and it is held back from dispatch while its state stays the same.
fn on_cancel(state: &mut State, now: Millis, issue_id: IssueId, fx: &mut Vec<Effect>) {
    if state.shutting_down {
        return;
    }
    let mut seen: Option<(String, String)> = None;
    for r in state
        .running
        .values_mut()
        .filter(|r| r.slot.issue.id == issue_id)
    {
        seen = Some((r.slot.issue.identifier.clone(), r.slot.issue.state.clone()));
        if r.may_stop() {
            r.stopping = Some(StopReason::Canceled);
            fx.push(Effect::CancelRun {
                run_id: r.run_id.clone(),
                reason: StopReason::Canceled,
            });
        }
    }
    let keys: Vec<Key> = state
        .retries
        .keys()
        .filter(|k| k.issue_id == issue_id)
        .cloned()
        .collect();
    for key in keys {
        if let Some(retry) = state.retries.remove(&key) {
            seen.get_or_insert((
                retry.slot.issue.identifier.clone(),
                retry.slot.issue.state.clone(),
            ));
        }
    }
    let Some((identifier, issue_state)) = seen else {
        return;
    };
    state.canceled.insert(issue_id, issue_state.clone());
    state.event(
        now,
        "operator_canceled",
        format!(
            "{identifier} canceled by the operator: not dispatched again while it stays {issue_state}"
        ),
        Some(&identifier),
    );
}

/// Work that depends only on the clock: stalls, due retries, the next poll.
fn on_timers(state: &mut State, now: Millis, fx: &mut Vec<Effect>) {
    if state.shutting_down {
        return;
    }
    // A cooldown that ended lets the issues that waited for it go.
    if limits::end_due(state, now) && may_redispatch(state) {
        dispatch_pass(state, now, fx);
    }
    for r in state.running.values_mut() {
        if r.may_stop() && r.stall_timeout_ms > 0 && now >= r.last_event_at + r.stall_timeout_ms {
            let reason = StopReason::Stalled(now - r.last_event_at);
            r.stopping = Some(reason.clone());
            fx.push(Effect::CancelRun {
                run_id: r.run_id.clone(),
                reason,
            });
        }
    }
    for (key, r) in state.retries.iter_mut() {
        if !r.fetching && now >= r.due_at {
            r.fetching = true;
            fx.push(Effect::FetchForRetry { key: key.clone() });
        }
    }
    if !state.poll_in_flight && now >= state.next_poll_at {
        state.poll_in_flight = true;
        // Running issues are refreshed, and so are those with steering waiting for their next
        // run (so a closed one lets its messages go instead of keeping them for ever).
        let ids: BTreeSet<&IssueId> = state
            .running
            .keys()
            .map(|k| &k.issue_id)
            .chain(state.steering.waiting_issues())
            .collect();
        let ids = ids.into_iter().cloned().collect();
        fx.push(Effect::Poll {
            ids,
            include_terminal: !state.first_poll_done,
        });
    }
}

/// A poll now, or right after the one under way (which may have read before the event).
fn wake(state: &mut State, now: Millis) {
    if state.poll_in_flight {
        state.wake_pending = true;
    } else if !state.shutting_down {
        state.next_poll_at = now;
    }
}

fn on_poll(state: &mut State, now: Millis, report: PollReport, fx: &mut Vec<Effect>) {
    state.poll_in_flight = false;
    state.next_poll_at = if std::mem::take(&mut state.wake_pending) {
        now
    } else {
        now + state.settings.polling.interval_ms
    };
    state.counters.polls += 1;
    state.counters.last_poll_ms = report.duration_ms;
    if report.candidates.is_err() || report.refreshed.is_err() {
        state.counters.poll_failures += 1;
    }
    if report.rate_limits.is_some() {
        state.rate_limits = report.rate_limits.clone();
    }
    if state.shutting_down {
        return;
    }
    // Reconcile running work first; a failed refresh leaves runs alone.
    match &report.refreshed {
        Ok(records) => {
            let settings = Arc::clone(&state.settings);
            for run in state.running.values_mut() {
                let id = &run.slot.issue.id;
                if !run.may_stop() || !report.requested.contains(id) {
                    continue;
                }
                let reason = match records.iter().find(|i| &i.id == id) {
                    None => Some(StopReason::Inactive("the issue no longer exists".into())),
                    Some(issue) if settings.tracker.is_terminal(&issue.state) => {
                        Some(StopReason::Terminal)
                    }
                    Some(issue) if !settings.tracker.is_active(&issue.state) => {
                        Some(StopReason::Inactive(format!("state is {}", issue.state)))
                    }
                    Some(issue) => match dispatch::route(issue, &settings) {
                        Err(why) => Some(StopReason::Inactive(why.to_string())),
                        Ok(_) => {
                            run.slot.issue = issue.clone();
                            None
                        }
                    },
                };
                if let Some(reason) = reason {
                    run.stopping = Some(reason.clone());
                    fx.push(Effect::CancelRun {
                        run_id: run.run_id.clone(),
                        reason,
                    });
                }
            }
        }
        Err(e) => state.event(
            now,
            "tracker_refresh_failed",
            format!("{e}; running work left alone"),
            None,
        ),
    }
    // Messages waiting for an issue that is over (closed, deleted) are let go, each said.
    if let Ok(records) = &report.refreshed {
        let settings = Arc::clone(&state.settings);
        let over: Vec<(IssueId, String)> = state
            .steering
            .waiting_issues()
            .filter(|id| report.requested.contains(id) && !state.issue_claimed(id))
            .filter_map(|id| match records.iter().find(|i| &i.id == id) {
                None => Some((id.clone(), "the issue no longer exists".to_string())),
                Some(i) if settings.tracker.is_terminal(&i.state) => {
                    Some((id.clone(), format!("{} is {}", i.identifier, i.state)))
                }
                Some(_) => None,
            })
            .collect();
        for (id, why) in over {
            let dropped = state.steering.release(&id);
            report_dropped(state, now, dropped, &why);
        }
    }
    if let Some(terminal) = &report.terminal {
        state.first_poll_done = true;
        let issues: Vec<Issue> = terminal
            .iter()
            .filter(|i| !state.issue_claimed(&i.id))
            .cloned()
            .collect();
        if !issues.is_empty()
            && state.settings.workspace.isolation == Isolation::PerAgent
            && !state.mode.dry_run
        {
            fx.push(Effect::CleanupTerminal {
                issues,
                settings: Arc::clone(&state.settings),
            });
        }
    }
    match report.candidates {
        Ok(mut candidates) => {
            candidates.sort_by(dispatch::compare);
            // A canceled issue is released once its state moved (or it left the candidates).
            state.canceled.retain(|id, held| {
                candidates
                    .iter()
                    .any(|c| &c.id == id && c.state.eq_ignore_ascii_case(held))
            });
            state.last_candidates = candidates;
            // The read's start, not its report's arrival: steering reads and a busy state
            // thread come between, and a slot let go in between must count as after the read.
            state.candidates_read_at = match report.read_at {
                0 => now.saturating_sub(report.duration_ms),
                at => at.min(now),
            };
            state.superseded.clear();
            note_blocker_cycles(state, now);
            if state.mode.dry_run {
                fx.push(Effect::DryRun(dry_run_pass(state)));
                state.once_dispatched = true;
            } else if !(state.mode.once && state.once_dispatched) {
                dispatch_pass(state, now, fx);
                state.once_dispatched = true;
            }
        }
        Err(e) => {
            if state.mode.once && !state.once_dispatched {
                // `--once` cannot do what it was asked: nothing to wait for, exit 1.
                state.exit_code = 1;
                state.once_dispatched = true;
            }
            state.event(now, "tracker_poll_failed", e, None)
        }
    }
}

/// `--dry-run`: each candidate's verdict, as a dispatch pass would decide, counting the runs it
/// would start against the caps; nothing is started.
fn dry_run_pass(state: &State) -> Vec<Decision> {
    let settings = Arc::clone(&state.settings);
    let mut decisions = Vec::new();
    let mut planned: Vec<Issue> = Vec::new();
    let blockers = dispatch::Blockers::new(&state.last_candidates);
    for issue in &state.last_candidates {
        let holding = blockers.holding(issue, &settings);
        let size = ensemble_size(&settings, &issue.state);
        for slot in 0..size {
            let verdict = if state.is_claimed(&Key::new(issue.id.clone(), slot)) {
                "skip: already claimed (running, retrying, being cleaned up, or by another daemon)"
                    .to_string()
            } else if !settings.tracker.is_active(&issue.state) {
                format!("skip: state {} is not active", issue.state)
            } else {
                match dispatch::route(issue, &settings) {
                    Err(why) => format!("skip: {why}"),
                    Ok(_) if !holding.is_empty() && !state.issue_claimed(&issue.id) => {
                        waits_for(state, &issue.id, &holding)
                    }
                    Ok(agent) => match slot_block_after(state, &settings, &issue.state, &planned) {
                        Some(reason) => format!("blocked: {} ({})", reason.code(), reason.label()),
                        None => {
                            match limits::pick_kind(state, &settings, issue, agent, state.now) {
                                Err(w) => format!(
                                    "blocked: agent_rate_limited ({} until {})",
                                    w.kind,
                                    crate::time::rfc3339(w.until)
                                ),
                                Ok(agent) => {
                                    planned.push(issue.clone());
                                    format!("dispatch -> {agent}")
                                }
                            }
                        }
                    },
                }
            };
            decisions.push(Decision {
                identifier: slot_name(&issue.identifier, slot, size),
                state: issue.state.clone(),
                verdict,
            });
        }
    }
    decisions
}

/// Walks the last candidates in order and starts runs while slots allow.
fn dispatch_pass(state: &mut State, now: Millis, fx: &mut Vec<Effect>) {
    state.blocked.clear();
    if state.retired {
        // Its file is gone: what runs finishes, nothing new starts.
        state.waiting.clear();
        return;
    }
    let settings = Arc::clone(&state.settings);
    let candidates = std::mem::take(&mut state.last_candidates);
    state.waiting.clear();
    let blockers = dispatch::Blockers::new(&candidates);
    for issue in &candidates {
        if !settings.tracker.is_active(&issue.state) {
            continue;
        }
        let Ok(agent_kind) = dispatch::route(issue, &settings) else {
            continue;
        };
        if state.canceled.contains_key(&issue.id) || held_over_budget(state, &settings, issue) {
            continue;
        }
        // Blockers hold back a first run only: work svc started goes on.
        let holding = blockers.holding(issue, &settings);
        if !holding.is_empty() && !state.issue_claimed(&issue.id) {
            state.waiting.push(Waiting {
                cycle: in_cycle(state, &issue.id),
                issue: issue.clone(),
                blockers: holding,
            });
            continue;
        }
        let size = ensemble_size(&settings, &issue.state);
        for slot in 0..size {
            let key = Key::new(issue.id.clone(), slot);
            if state.is_claimed(&key) {
                continue;
            }
            if let Some(reason) = slot_block(state, &settings, &issue.state) {
                // One blocked entry per issue: its free slots wait together.
                state.blocked.push(Blocked {
                    issue: issue.clone(),
                    reason,
                    agent_kind: None,
                    until: None,
                });
                break;
            }
            let kind = match limits::pick_kind(state, &settings, issue, agent_kind.clone(), now) {
                Ok(kind) => kind,
                Err(w) => {
                    state.blocked.push(Blocked {
                        issue: issue.clone(),
                        reason: BlockedReason::AgentRateLimited,
                        agent_kind: Some(w.kind),
                        until: Some(w.until),
                    });
                    break;
                }
            };
            start_run(
                state,
                now,
                &settings,
                issue.clone(),
                kind,
                Resume {
                    slot,
                    ..Resume::default()
                },
                fx,
            );
        }
    }
    state.last_candidates = candidates;
}

/// Finds the cycles of blockers among the last candidates (the members that wait for one
/// another) and reports each new one once; one that opens and forms again is new again.
fn note_blocker_cycles(state: &mut State, now: Millis) {
    let settings = Arc::clone(&state.settings);
    let candidates = &state.last_candidates;
    let found =
        dispatch::Blockers::new(candidates).cycles(&settings, |i| !state.issue_claimed(&i.id));
    let mut cycles = BTreeSet::new();
    let mut new = Vec::new();
    for members in found {
        let ids: Vec<IssueId> = members.iter().map(|&n| candidates[n].id.clone()).collect();
        if !state.blocker_cycles.contains(&ids) {
            let names: Vec<&str> = members
                .iter()
                .map(|&n| candidates[n].identifier.as_str())
                .collect();
            new.push(match names.as_slice() {
                [one] => format!("{one} is blocked by itself: it waits until that is removed"),
                _ => format!(
                    "{} block each other in a cycle: they wait until one of those blocking relations is removed",
                    names.join(", ")
                ),
            });
        }
        cycles.insert(ids);
    }
    state.blocker_cycles = cycles;
    for message in new {
        state.event(now, "blocker_cycle", message, None);
    }
}

fn in_cycle(state: &State, id: &str) -> bool {
    state
        .blocker_cycles
        .iter()
        .any(|c| c.iter().any(|m| m == id))
}

/// A dry run's verdict on an issue that waits: `skip: blocked by ENG-2 (In Progress), ...`.
fn waits_for(state: &State, id: &str, open: &[Blocker]) -> String {
    let list: Vec<String> = open
        .iter()
        .map(|b| format!("{} ({})", b.identifier, b.state))
        .collect();
    let cycle = if in_cycle(state, id) {
        "; a cycle of blockers"
    } else {
        ""
    };
    format!("skip: blocked by {}{cycle}", list.join(", "))
}

/// The ensemble size for an issue in `issue_state` (`agent.ensemble_size`, or its status
/// override's): how many slots run it in parallel.
pub fn ensemble_size(settings: &Settings, issue_state: &str) -> u32 {
    let (agent, _) = settings.agent_for_state(issue_state);
    agent.ensemble_size.clamp(1, u64::from(u32::MAX)) as u32
}

/// Whether a freed slot may start blocked candidates now: not while stopping, never in a dry
/// run, and with `--once` only within its one dispatch.
fn may_redispatch(state: &State) -> bool {
    !state.shutting_down && !state.mode.dry_run && !state.mode.once
}

/// Whether the worker pool can take one more run (always, before it reported).
fn pool_room(state: &State) -> bool {
    pool_room_for(state, state.running.len())
}

/// Whether the pool can take one more run when `runs` are running.
fn pool_room_for(state: &State, runs: usize) -> bool {
    let Some(view) = &state.pool else {
        return true;
    };
    if view.status.capped.is_some() {
        return false;
    }
    let runs = runs + state.shared.others_running;
    view.status.slots.is_none_or(|slots| (runs as u64) < slots)
}

/// Why no slot is free for an issue in `issue_state`, if none is.
fn slot_block(state: &State, settings: &Settings, issue_state: &str) -> Option<BlockedReason> {
    slot_block_after(state, settings, issue_state, &[])
}

/// [`slot_block`] as if the runs of `planned` (a dry run's would-be starts) were running too.
fn slot_block_after(
    state: &State,
    settings: &Settings,
    issue_state: &str,
    planned: &[Issue],
) -> Option<BlockedReason> {
    if daily_budget_reached(state, settings, state.now) {
        return Some(BlockedReason::DailyBudgetReached);
    }
    let runs = state.running.len() + planned.len();
    if runs as u64 >= settings.agent.max_concurrent_agents {
        return Some(BlockedReason::GlobalConcurrencyCap);
    }
    if state.shared.room.is_some_and(|room| room <= planned.len()) {
        return Some(BlockedReason::DaemonConcurrencyCap);
    }
    let key = issue_state.trim().to_lowercase();
    if let Some(cap) = settings
        .status_overrides
        .get(&key)
        .and_then(|o| o.max_concurrent_agents)
    {
        let in_state = state
            .running
            .values()
            .map(|r| &r.slot.issue)
            .chain(planned)
            .filter(|i| i.state.trim().to_lowercase() == key)
            .count() as u64;
        if in_state >= cap {
            return Some(BlockedReason::LocalConcurrencyCap);
        }
    }
    if !pool_room_for(state, runs) {
        return Some(BlockedReason::WorkerHostCapacity);
    }
    None
}

/// What a retry carries into its next run.
#[derive(Default)]
struct Resume {
    /// The ensemble slot.
    slot: u32,
    /// `None` on a first run.
    attempt: Option<u32>,
    /// The machine the previous run had.
    affinity: Option<String>,
    /// When the issue's data was read (0: the last candidates').
    seen_at: Millis,
    /// The run before met a rate limit (the prompt's `previous_attempt`).
    previous: Option<super::protocol::PreviousAttempt>,
}

fn start_run(
    state: &mut State,
    now: Millis,
    settings: &Arc<Settings>,
    issue: Issue,
    agent_kind: String,
    resume: Resume,
    fx: &mut Vec<Effect>,
) {
    let Resume {
        slot,
        attempt,
        affinity,
        seen_at,
        previous,
    } = resume;
    let seen_at = if seen_at == 0 {
        state.candidates_read_at
    } else {
        seen_at
    };
    state.run_seq += 1;
    // Run ids are unique in the daemon: workflows count their runs apart.
    let run_id = match &state.workflow {
        None => format!("run-{}-{}", now, state.run_seq),
        Some(w) => format!("run-{}-{}-{w}", now, state.run_seq),
    };
    if let Some(room) = &mut state.shared.room {
        *room = room.saturating_sub(1);
    }
    let size = ensemble_size(settings, &issue.state);
    let workspace_path = workspace::slot_path(
        &settings.workspace.root,
        settings.workspace.isolation,
        &issue.identifier,
        slot,
        size,
    );
    let shown = slot_name(&issue.identifier, slot, size);
    let (_, agents) = settings.agent_for_state(&issue.state);
    let stall_timeout_ms = agents
        .kinds
        .get(&agent_kind)
        .map_or(agents.stall_timeout_ms, |r| r.stall_timeout_ms);
    state.event(
        now,
        "run_started",
        match attempt {
            Some(a) => format!("{shown} dispatched to {agent_kind} (retry {a})"),
            None => format!("{shown} dispatched to {agent_kind}"),
        },
        Some(&issue.identifier),
    );
    // Messages that waited for this issue's next run go with its first slot's run.
    let steering = if slot == 0 {
        state.steering.take_for_run(&issue.id)
    } else {
        Vec::new()
    };
    let spec = RunSpec {
        run_id,
        slot: Slot {
            issue,
            slot_index: slot,
            ensemble_size: size,
            workspace_path,
        },
        attempt,
        agent_kind,
        settings: Arc::clone(settings),
        affinity,
        steering,
        seen_at,
        previous_attempt: previous,
    };
    state.running.insert(
        Key::new(spec.slot.issue.id.clone(), slot),
        Running::new(&spec, stall_timeout_ms, now),
    );
    fx.push(Effect::StartRun(Box::new(spec)));
}

fn on_run(state: &mut State, now: Millis, run_id: &str, msg: RunMsg, fx: &mut Vec<Effect>) {
    let Some(key) = state
        .running
        .iter()
        .find(|(_, r)| r.run_id == run_id)
        .map(|(key, _)| key.clone())
    else {
        return;
    };
    let run = state.running.get_mut(&key).expect("found above");
    match msg {
        RunMsg::Started { pid } => {
            run.pid = pid;
            run.last_event_at = now;
        }
        RunMsg::Session { session_id } => {
            run.session_id = Some(session_id);
            run.last_event_at = now;
        }
        RunMsg::TurnStarted { turn } => {
            run.turn_count = turn;
            run.last_event_at = now;
        }
        RunMsg::TurnEnded { turn, silent } => {
            run.last_event_at = now;
            let (run_id, kind) = (run.run_id.clone(), run.agent_kind.clone());
            let may_stop = run.may_stop();
            // The second silent turn in a row on the kind is a limit: the run stops before
            // it is told to go on.
            if let Some(reason) = limits::on_turn(state, now, &kind, silent)
                && may_stop
            {
                let run = state.running.get_mut(&key).expect("found above");
                run.stopping = Some(reason.clone());
                fx.push(Effect::CancelRun {
                    run_id: run_id.clone(),
                    reason,
                });
            }
            fx.push(Effect::TurnChecked { run_id, turn });
        }
        RunMsg::Activity { event, message } => {
            run.last_event = Some(event);
            if message.is_some() {
                run.last_message = message;
            }
            run.last_event_at = now;
        }
        RunMsg::Usage(usage) => {
            run.tokens = usage.tokens;
            run.cost_usd = usage.cost_usd;
            run.cost_other = usage.cost_other;
            // What the run spent since its last report goes into the ledger (totals only
            // grow there: a report that shrank is no refund).
            let now_spent = Spent {
                input_tokens: run.tokens.input,
                output_tokens: run.tokens.output,
                total_tokens: run.tokens.total,
                cost_usd: run.cost_usd.unwrap_or(0.0),
                runs: 0,
            };
            let before = run.ledgered;
            let delta = Spent {
                input_tokens: now_spent.input_tokens.saturating_sub(before.input_tokens),
                output_tokens: now_spent.output_tokens.saturating_sub(before.output_tokens),
                total_tokens: now_spent.total_tokens.saturating_sub(before.total_tokens),
                cost_usd: (now_spent.cost_usd - before.cost_usd).max(0.0),
                runs: 0,
            };
            run.ledgered = Spent {
                input_tokens: before.input_tokens.max(now_spent.input_tokens),
                output_tokens: before.output_tokens.max(now_spent.output_tokens),
                total_tokens: before.total_tokens.max(now_spent.total_tokens),
                cost_usd: before.cost_usd.max(now_spent.cost_usd),
                runs: 0,
            };
            state
                .ledger
                .add_for_issue(&run.slot.issue.identifier, now, &delta);
            check_budgets(state, now, &key, fx);
        }
        RunMsg::Reserving => {
            run.reserving = true;
            run.last_event_at = now;
        }
        RunMsg::Leased {
            worker_id,
            host,
            ssh,
        } => {
            run.reserving = false;
            run.worker_id = Some(worker_id);
            run.ssh = match (ssh, &host) {
                (Some(options), Some(h)) => Some(SshPlace {
                    host: h.clone(),
                    options,
                }),
                _ => None,
            };
            run.worker_host = host;
            run.last_event_at = now;
        }
        RunMsg::Workspace(path) => run.slot.workspace_path = path,
        RunMsg::Claimed { token } => {
            run.claim_token = Some(token);
            // A run counts once it holds its slot (one that never started is no run).
            let one_run = Spent {
                runs: 1,
                ..Spent::default()
            };
            state
                .ledger
                .add_for_issue(&run.slot.issue.identifier, now, &one_run);
        }
        RunMsg::Steered { keys } => {
            state.steering.touch();
            let (delivered, pending): (Vec<Message>, Vec<Message>) =
                std::mem::take(&mut run.steering_pending)
                    .into_iter()
                    .partition(|m| keys.contains(&m.unique_key()));
            run.steering_pending = pending;
            if let Some(last) = delivered.last() {
                run.steering_turns += 1;
                run.last_steering = Some(SteeringView {
                    author: last.author.clone(),
                    source: last.source.to_string(),
                    at: last.at.clone(),
                    text: last.preview(),
                });
                run.last_event_at = now;
                state.counters.steering_turns += 1;
            }
        }
        RunMsg::Unsteered { mut messages } => {
            state.steering.touch();
            run.steering_turns = run.steering_turns.saturating_sub(1);
            state.counters.steering_turns = state.counters.steering_turns.saturating_sub(1);
            messages.append(&mut run.steering_pending);
            run.steering_pending = messages;
        }
        RunMsg::Notice { event, message } => {
            let identifier = run.slot.issue.identifier.clone();
            state.event(now, &event, message, Some(&identifier));
        }
        RunMsg::Exited(RunEnd::Superseded(why)) => {
            // Never started: what the issue is now is for the next poll to say.
            let run = take_ended(state, now, &key);
            let shown = run.slot.name();
            state.event(
                now,
                "claim_superseded",
                format!("{shown}: {why}; the next poll decides"),
                Some(&run.slot.issue.identifier),
            );
            state.superseded.insert(key);
        }
        RunMsg::Exited(RunEnd::BudgetRefused(why)) => {
            // Never started, and no attempt spent: a retry stays the retry it was, due again
            // after its own backoff (dispatch is held until the budget allows).
            let run = take_ended(state, now, &key);
            let shown = run.slot.name();
            let kept = run.attempt.filter(|n| *n > 0);
            state.event(
                now,
                "daily_budget_reached",
                match kept {
                    Some(n) => format!("{shown}: {why}; not started, retry {n} kept"),
                    None => format!("{shown}: {why}; not started"),
                },
                Some(&run.slot.issue.identifier),
            );
            if let Some(attempt) = kept
                && !state.shutting_down
            {
                let delay = backoff_ms(attempt, state.settings.agent.max_retry_backoff_ms);
                state.retries.insert(
                    key,
                    Retry {
                        slot: run.slot,
                        attempt,
                        due_at: now + delay,
                        error: Some(why),
                        kind: RetryKind::Failure,
                        fetching: false,
                        worker_id: run.worker_id,
                        worker_host: run.worker_host,
                        ssh: run.ssh,
                        claim_token: None,
                        previous: None,
                    },
                );
            }
        }
        RunMsg::Exited(RunEnd::HeldElsewhere(why)) => {
            // Never started: no history, no retry; the slot is another daemon's.
            let run = take_ended(state, now, &key);
            let shown = run.slot.name();
            state.event(
                now,
                "claim_held_elsewhere",
                format!("{shown}: {why}"),
                Some(&run.slot.issue.identifier),
            );
            let holder = why
                .strip_prefix("daemon ")
                .and_then(|w| w.split_whitespace().next())
                .unwrap_or_default()
                .to_string();
            let identifier = run.slot.issue.identifier.clone();
            state.foreign.insert(
                key,
                Holder {
                    owner: holder,
                    identifier,
                },
            );
        }
        RunMsg::Exited(end) => {
            let run = take_ended(state, now, &key);
            on_exit(state, now, key, run, end, fx);
            if may_redispatch(state) {
                dispatch_pass(state, now, fx);
            }
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod blocker_tests;

#[cfg(test)]
mod steering_tests;

#[cfg(test)]
mod budget_tests;

#[cfg(test)]
mod limit_tests;
