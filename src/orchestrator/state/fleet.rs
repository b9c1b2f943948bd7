//! The fleet in the state machine: what a sweep of the shared claim store reports (other
//! daemons' slots, takeovers, relayed requests, the fleet's runs).

use super::*;

/// What the shared claim store reported: the slots other daemons hold now, what this daemon
/// took over from one that died (retries, waiting steering, cursors), control relayed to it,
/// and the fleet. A run of ours whose slot another daemon holds lost its claim (our heartbeat
/// expired while it ran): it is stopped, and a retry of ours another holds now is dropped, so no
/// slot runs twice.
pub(super) fn on_claims(state: &mut State, now: Millis, swept: Swept, fx: &mut Vec<Effect>) {
    let Swept {
        foreign,
        taken_over,
        steering: taken_steering,
        cursors,
        relayed,
        fleet,
        runs,
        ledger,
        cooldowns,
    } = swept;
    import_runs(state, runs);
    state.ledger.merge(ledger);
    super::limits::adopt(state, now, cooldowns);
    let mut lost_runs = Vec::new();
    // A run that holds its claim and finds its slot another's has lost it; one still on its way
    // to claim it is left to the claim, which refuses it (`claim_held_elsewhere`) or, when the
    // report is older than the claim, grants it.
    for (key, run) in state.running.iter_mut() {
        if run.may_stop() && run.claim_token.is_some() && foreign.contains_key(key) {
            let reason = StopReason::Inactive("another daemon holds its claim now".into());
            run.stopping = Some(reason.clone());
            fx.push(Effect::CancelRun {
                run_id: run.run_id.clone(),
                reason,
            });
            let shown = slot_name(&run.slot.issue.identifier, key.slot, run.slot.ensemble_size);
            lost_runs.push((shown, run.slot.issue.identifier.clone()));
        }
    }
    for (shown, identifier) in lost_runs {
        state.event(
            now,
            "claim_lost",
            format!("{shown}: another daemon holds its claim now; the run is stopped and nothing more of it is written"),
            Some(&identifier),
        );
    }
    let lost: Vec<Key> = state
        .retries
        .keys()
        .filter(|k| foreign.contains_key(*k))
        .cloned()
        .collect();
    for key in lost {
        if let Some(retry) = state.retries.remove(&key) {
            let shown = slot_name(
                &retry.slot.issue.identifier,
                key.slot,
                retry.slot.ensemble_size,
            );
            state.event(
                now,
                "claim_lost",
                format!("{shown}: another daemon took its retry over"),
                Some(&retry.slot.issue.identifier),
            );
        }
    }
    let freed = state.foreign.keys().any(|k| !foreign.contains_key(k));
    state.foreign = foreign;
    if let Some(fleet) = fleet {
        state.fleet = fleet;
    }
    let mut took = false;
    for (key, mut retry) in taken_over {
        // A live daemon took a dead one's run over: its retry fetches the issue first, so it
        // may go at once (the delay is for a daemon's own start, whose first poll reconciles).
        if retry
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with(TAKEN_OVER))
        {
            retry.due_at = retry.due_at.min(now);
        }
        if state.shutting_down
            || state.running.contains_key(&key)
            || state.retries.contains_key(&key)
        {
            continue;
        }
        let shown = slot_name(
            &retry.slot.issue.identifier,
            key.slot,
            retry.slot.ensemble_size,
        );
        state.event(
            now,
            "claim_taken_over",
            format!(
                "{shown}: {}; retry {} due",
                retry.error.as_deref().unwrap_or("its daemon stopped"),
                retry.attempt
            ),
            Some(&retry.slot.issue.identifier.clone()),
        );
        state.retries.insert(key, retry);
        took = true;
    }
    if !taken_steering.is_empty() || !cursors.is_empty() {
        let dropped = state.steering.adopt(taken_steering, cursors);
        let why = format!("more than {} messages waited", steering::QUEUE_MAX);
        report_dropped(state, now, dropped, &why);
    }
    for relay in relayed {
        match relay.what {
            Relayed::Steer(message) => {
                state.event(
                    now,
                    "steering_relayed",
                    format!(
                        "a message from {} relayed by another daemon",
                        message.author
                    ),
                    Some(&relay.identifier),
                );
                on_steer(state, now, vec![message], Vec::new(), None, fx);
            }
            Relayed::Cancel => {
                state.event(
                    now,
                    "cancel_relayed",
                    "a cancel relayed by another daemon",
                    Some(&relay.identifier),
                );
                on_cancel(state, now, relay.issue_id, fx);
            }
        }
    }
    if (freed || took) && may_redispatch(state) {
        dispatch_pass(state, now, fx);
    }
}

/// Adds the fleet's runs to the history (the API's and `svc runs`' view is the fleet's), newest
/// first; they are another daemon's to keep in the store, so they are not written again.
pub(super) fn import_runs(state: &mut State, runs: Vec<RunRecord>) {
    let mut added = false;
    for record in runs {
        if state
            .history
            .iter()
            .any(|r| r.run.run_id == record.run.run_id)
        {
            continue;
        }
        state.fleet_runs.insert(record.run.run_id.clone());
        state.history.push_back(record);
        added = true;
    }
    if added {
        state
            .history
            .make_contiguous()
            .sort_by_key(|r| std::cmp::Reverse(r.ended_at));
        state.history.truncate(HISTORY_LIMIT);
        let kept: BTreeSet<&String> = state.history.iter().map(|r| &r.run.run_id).collect();
        state.fleet_runs.retain(|id| kept.contains(id));
    }
}
