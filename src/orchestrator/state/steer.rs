//! Steering in the state machine: where each message goes (a running run's next turn, or the
//! issue's next run), and what is said of one let go.

use super::*;

/// Says each steering message let go, and why (`steering_ignored`): none goes silently.
pub(super) fn report_dropped(state: &mut State, now: Millis, dropped: Vec<Message>, why: &str) {
    for m in dropped {
        state.event(
            now,
            "steering_ignored",
            format!(
                "a message from {} (via {}) for {} was not delivered: {why}",
                m.author, m.source, m.issue_id
            ),
            None,
        );
    }
}

/// Steering messages arrive: each goes to the issue's running runs (their next turn), or waits
/// for its next run when it is retrying, waiting for a slot or a candidate, or its run ended
/// after the last candidate read began; otherwise it is ignored. A key seen before is not taken
/// again.
pub(super) fn on_steer(
    state: &mut State,
    now: Millis,
    messages: Vec<Message>,
    held: Vec<Message>,
    cursor: Option<(String, String)>,
    fx: &mut Vec<Effect>,
) {
    if let Some((source, at)) = cursor {
        state.steering.set_cursor(source, at);
    }
    let all = messages
        .into_iter()
        .map(|m| (m, false))
        .chain(held.into_iter().map(|m| (m, true)));
    for (message, held) in all {
        // Only a message taken (delivered or waiting) is remembered: one ignored now (its
        // issue's run was stopping, say) may be read again and taken later.
        let key = message.unique_key();
        if state.steering.was_taken(&key) {
            continue;
        }
        let issue_id = message.issue_id.clone();
        let runs: Vec<(String, String)> = state
            .running
            .values()
            .filter(|r| r.slot.issue.id == issue_id && r.stopping.is_none())
            .map(|r| (r.run_id.clone(), r.slot.issue.identifier.clone()))
            .collect();
        let identifier = runs.first().map(|(_, i)| i.clone()).or_else(|| {
            state
                .retries
                .values()
                .map(|r| &r.slot.issue)
                .chain(state.blocked.iter().map(|b| &b.issue))
                .chain(state.last_candidates.iter())
                .find(|i| i.id == issue_id)
                .map(|i| i.identifier.clone())
        });
        // A held message waits for the issue's next run even when svc does not know it yet.
        let identifier = identifier.or_else(|| held.then(|| issue_id.clone()));
        // So does one for an issue whose run ended since the last candidate read began: that
        // read may have seen it at work, and the next one decides whether it is parked (its
        // feedback then sends it back, with `rework_state`) or over (the message is let go).
        let identifier = identifier.or_else(|| {
            state
                .history
                .iter()
                .find(|r| r.run.slot.issue.id == issue_id && r.ended_at >= state.candidates_read_at)
                .map(|r| r.run.slot.issue.identifier.clone())
        });
        let Some(identifier) = identifier else {
            if !state.steering.note_ignored(key) {
                continue;
            }
            state.event(
                now,
                "steering_ignored",
                format!(
                    "a message from {} (via {}) for an issue that is neither running nor waiting: not delivered",
                    message.author, message.source
                ),
                None,
            );
            continue;
        };
        state.steering.take_key(key);
        if runs.is_empty() {
            state.event(
                now,
                "steering_deferred",
                format!(
                    "a message from {} (via {}) waits for the next run of {identifier}",
                    message.author, message.source
                ),
                Some(&identifier),
            );
            let dropped = state.steering.queue(message);
            report_dropped(
                state,
                now,
                dropped,
                &format!(
                    "more than {} messages waited for {identifier}",
                    steering::QUEUE_MAX
                ),
            );
            continue;
        }
        state.event(
            now,
            "steering_accepted",
            format!(
                "a message from {} (via {}) goes to the running agent of {identifier}",
                message.author, message.source
            ),
            Some(&identifier),
        );
        for (run_id, _) in runs {
            if let Some(run) = state.running.values_mut().find(|r| r.run_id == run_id) {
                run.steering_pending.push(message.clone());
            }
            fx.push(Effect::Steer {
                run_id,
                messages: vec![message.clone()],
            });
        }
    }
}
