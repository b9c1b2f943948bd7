//! The end of a run in the state machine: a run's exit and what follows it (a retry, a
//! continuation, a cleanup), a due retry's fresh issue, and a workspace's removal.

use super::*;

/// Takes an ended run out of the running ones; what it did not deliver waits for the issue's
/// next run (here, or until the issue is over), ahead of newer messages.
pub(super) fn take_ended(state: &mut State, now: Millis, key: &Key) -> Running {
    let mut run = state.running.remove(key).expect("found above");
    let undelivered = std::mem::take(&mut run.steering_pending);
    let dropped = state.steering.requeue(&run.slot.issue.id, undelivered);
    let why_dropped = format!("more than {} messages waited", steering::QUEUE_MAX);
    report_dropped(state, now, dropped, &why_dropped);
    run
}

pub(super) fn on_exit(
    state: &mut State,
    now: Millis,
    key: Key,
    run: Running,
    end: RunEnd,
    fx: &mut Vec<Effect>,
) {
    let settings = Arc::clone(&state.settings);
    let identifier = run.slot.issue.identifier.clone();
    let shown = slot_name(&identifier, run.slot.slot_index, run.slot.ensemble_size);
    // A limit met, however the run came to end (said by the bridge, or two silent turns).
    let limit = match (&run.stopping, &end) {
        (Some(StopReason::RateLimited(l)), _) | (_, RunEnd::RateLimited(l)) => Some(l.clone()),
        _ => None,
    };
    if let Some(l) = &limit {
        super::limits::note_limit(state, now, &run.agent_kind, l);
    }
    let (outcome, failure, retry) = match (&run.stopping, &limit) {
        // Stopped for good (the daemon's end, the operator, a budget, the issue left): the
        // limit is noted, nothing is retried.
        (
            Some(
                reason @ (StopReason::Shutdown
                | StopReason::Canceled
                | StopReason::Budget(_)
                | StopReason::Terminal
                | StopReason::Inactive(_)),
            ),
            Some(_),
        ) => (Outcome::RateLimited, Some(reason.to_string()), None),
        (_, Some(l)) => (
            Outcome::RateLimited,
            Some(format!("agent_rate_limited: {}", l.reason)),
            Some(RetryKind::RateLimited),
        ),
        _ => match (&run.stopping, &end) {
            (Some(StopReason::Stalled(_)), _) => (
                Outcome::Stalled,
                Some(run.stopping.clone().unwrap().to_string()),
                Some(RetryKind::Failure),
            ),
            // A run that finished cleanly while the daemon was stopping still succeeded.
            (Some(StopReason::Shutdown), RunEnd::Clean) => (Outcome::Success, None, None),
            // Stopped by the daemon's end or the operator, and not retried. The spec's `canceled`
            // outcome is never recorded: an operator's cancel is a failure whose error says so.
            (
                Some(reason @ (StopReason::Shutdown | StopReason::Canceled)),
                RunEnd::Failed(_)
                | RunEnd::HeldElsewhere(_)
                | RunEnd::Superseded(_)
                | RunEnd::BudgetRefused(_),
            ) => (Outcome::Failed, Some(reason.to_string()), None),
            // Past a budget: failed however it ended, never retried.
            (Some(reason @ StopReason::Budget(_)), _) => {
                (Outcome::Failed, Some(reason.to_string()), None)
            }
            // Ending after its turn (the day's budget): a clean end is a success with no
            // continuation; a failure is one, retried once the day's budget allows.
            (Some(StopReason::DailyBudget), RunEnd::Clean) => (Outcome::Success, None, None),
            (
                Some(StopReason::DailyBudget),
                RunEnd::Failed(e)
                | RunEnd::HeldElsewhere(e)
                | RunEnd::Superseded(e)
                | RunEnd::BudgetRefused(e),
            ) => (Outcome::Failed, Some(e.clone()), Some(RetryKind::Failure)),
            (Some(_), _) => (Outcome::Success, None, None),
            (None, RunEnd::Clean) => (Outcome::Success, None, Some(RetryKind::Continuation)),
            (
                None,
                RunEnd::Failed(e)
                | RunEnd::HeldElsewhere(e)
                | RunEnd::Superseded(e)
                | RunEnd::BudgetRefused(e),
            ) => (Outcome::Failed, Some(e.clone()), Some(RetryKind::Failure)),
            (None, RunEnd::RateLimited(_)) => unreachable!("a limit is handled above"),
        },
    };
    let seconds = now.saturating_sub(run.started_at) as f64 / 1000.0;
    *state
        .counters
        .runs_by_outcome
        .entry(outcome.as_str())
        .or_default() += 1;
    state.finished_tokens.add(run.tokens);
    if let Some(usd) = run.cost_usd {
        match state.counters.finished_cost_usd.get_mut(&run.agent_kind) {
            Some(sum) => *sum += usd,
            None => {
                state
                    .counters
                    .finished_cost_usd
                    .insert(run.agent_kind.clone(), usd);
            }
        }
    }
    state.finished_seconds += seconds;
    match (outcome, &failure) {
        (Outcome::Success, _) => state.event(
            now,
            "run_succeeded",
            format!("{shown} run ended"),
            Some(&identifier),
        ),
        (_, Some(f)) => state.event(
            now,
            &if run.stopping == Some(StopReason::Canceled) {
                "run_canceled".to_string()
            } else {
                format!("run_{}", outcome.as_str())
            },
            format!("{shown}: {f}"),
            Some(&identifier),
        ),
        _ => {}
    }
    let slot = run.slot.clone();
    let attempt = run.attempt.unwrap_or(0);
    let limited_kind = run.agent_kind.clone();
    let (worker_id, worker_host) = (run.worker_id.clone(), run.worker_host.clone());
    let ssh = run.ssh.clone();
    let claim_token = run.claim_token;
    if run.stopping == Some(StopReason::Terminal) {
        remove_workspace(
            state,
            &key,
            &slot.issue,
            slot.workspace_path.clone(),
            ssh.clone(),
            fx,
        );
    }
    state.history.push_front(RunRecord {
        run,
        outcome,
        failure_reason: failure.clone(),
        ended_at: now,
    });
    state.history.truncate(HISTORY_LIMIT);
    if state.mode.once && outcome != Outcome::Success {
        state.exit_code = 1;
    }
    if state.shutting_down || state.mode.once {
        return;
    }
    let mut previous = None;
    let (attempt, due_at, error, kind) = match retry {
        // Not a failed attempt: the same attempt again, at once on a fallback kind, else when
        // the limit resets; never an exponential backoff.
        Some(RetryKind::RateLimited) => {
            let reason = failure.clone().unwrap_or_default();
            previous = Some(super::super::protocol::PreviousAttempt {
                kind: limited_kind.clone(),
                reason: limit.map(|l| l.reason).unwrap_or_default(),
                at: now,
            });
            let routed = dispatch::route(&slot.issue, &settings).unwrap_or(limited_kind);
            let (due_at, said) =
                match super::limits::pick_kind(state, &settings, &slot.issue, routed, now) {
                    Ok(other) => (now, format!("{shown} retry on {other} at once")),
                    Err(w) => (
                        w.until,
                        format!(
                            "{shown} waits for {}'s cooldown to end at {}",
                            w.kind,
                            crate::time::rfc3339(w.until)
                        ),
                    ),
                };
            state.event(now, "retry_scheduled", said, Some(&identifier));
            (attempt, due_at, Some(reason), RetryKind::RateLimited)
        }
        Some(RetryKind::Continuation) => (
            0,
            now + CONTINUATION_DELAY_MS,
            None,
            RetryKind::Continuation,
        ),
        Some(RetryKind::Failure) => {
            let next = attempt.saturating_add(1);
            let delay = backoff_ms(next, settings.agent.max_retry_backoff_ms);
            *state.restart_counts.entry(key.clone()).or_default() += 1;
            state.counters.retries_scheduled += 1;
            state.event(
                now,
                "retry_scheduled",
                format!("{shown} retry {next} in {delay} ms"),
                Some(&identifier),
            );
            (next, now + delay, failure, RetryKind::Failure)
        }
        None => return,
    };
    state.retries.insert(
        key,
        Retry {
            slot,
            attempt,
            due_at,
            error,
            kind,
            fetching: false,
            worker_id,
            worker_host,
            ssh,
            claim_token,
            previous,
        },
    );
}

pub(super) fn on_retry_fetched(
    state: &mut State,
    now: Millis,
    key: Key,
    result: Result<Option<Issue>, String>,
    fx: &mut Vec<Effect>,
) {
    let Some(mut retry) = state.retries.remove(&key) else {
        return;
    };
    if state.shutting_down {
        return;
    }
    retry.fetching = false;
    let settings = Arc::clone(&state.settings);
    let issue = match result {
        Err(e) => {
            // The tracker is unavailable: try again after the same backoff.
            retry.due_at =
                now + backoff_ms(retry.attempt.max(1), settings.agent.max_retry_backoff_ms);
            retry.error = Some(format!("tracker unavailable: {e}"));
            state.retries.insert(key, retry);
            return;
        }
        Ok(None) => {
            state.event(
                now,
                "retry_released",
                format!("{} no longer exists", retry.slot.issue.identifier),
                Some(&retry.slot.issue.identifier),
            );
            return;
        }
        Ok(Some(issue)) => issue,
    };
    if settings.tracker.is_terminal(&issue.state) {
        state.event(
            now,
            "retry_released",
            format!("{} is {}", issue.identifier, issue.state),
            Some(&issue.identifier),
        );
        let place = retry.ssh.clone();
        remove_workspace(
            state,
            &key,
            &issue,
            retry.slot.workspace_path.clone(),
            place,
            fx,
        );
        return;
    }
    if key.slot >= ensemble_size(&settings, &issue.state) {
        state.event(
            now,
            "retry_released",
            format!(
                "{} slot {} is beyond the ensemble size now",
                issue.identifier, key.slot
            ),
            Some(&issue.identifier),
        );
        return;
    }
    let routed = match dispatch::route(&issue, &settings) {
        Ok(kind) if settings.tracker.is_active(&issue.state) => kind,
        _ => {
            state.event(
                now,
                "retry_released",
                format!("{} is no longer dispatchable", issue.identifier),
                Some(&issue.identifier),
            );
            return;
        }
    };
    if held_over_budget(state, &settings, &issue) {
        state.event(
            now,
            "retry_released",
            format!("{} is past its budget", issue.identifier),
            Some(&issue.identifier),
        );
        return;
    }
    if slot_block(state, &settings, &issue.state).is_some() {
        retry.slot.issue = issue;
        retry.error = Some(NO_SLOTS.to_string());
        retry.due_at = now + settings.polling.interval_ms.min(BASE_BACKOFF_MS);
        state.retries.insert(key, retry);
        return;
    }
    // Every kind it may use cools down: it waits for the earliest reset, its attempt kept.
    let agent_kind = match super::limits::pick_kind(state, &settings, &issue, routed, now) {
        Ok(kind) => kind,
        Err(w) => {
            retry.slot.issue = issue;
            retry.error = Some(super::limits::waiting_error(&w));
            retry.due_at = w.until;
            state.retries.insert(key, retry);
            return;
        }
    };
    let attempt = (retry.attempt > 0).then_some(retry.attempt);
    start_run(
        state,
        now,
        &settings,
        issue,
        agent_kind,
        Resume {
            slot: key.slot,
            attempt,
            affinity: retry.worker_id,
            // The issue was fetched just now.
            seen_at: now,
            previous: retry.previous,
        },
        fx,
    );
}

pub(super) fn remove_workspace(
    state: &mut State,
    key: &Key,
    issue: &Issue,
    path: PathBuf,
    ssh: Option<SshPlace>,
    fx: &mut Vec<Effect>,
) {
    if state.settings.workspace.isolation == Isolation::None {
        return;
    }
    state.removing.insert(key.clone());
    fx.push(Effect::RemoveWorkspace {
        key: key.clone(),
        issue: Box::new(issue.clone()),
        path,
        settings: Arc::clone(&state.settings),
        ssh,
    });
}
