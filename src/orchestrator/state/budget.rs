//! The budgets as the state machine holds them: what an issue's or the day's spend is past,
//! which candidates that holds back, and what happens to a run whose usage crosses one.

use super::*;

/// What an issue's spend is past, if any: the first budget it exceeds, said with what was
/// spent against it.
pub fn over_issue_budget(budgets: &crate::config::Budgets, spent: &Spent) -> Option<String> {
    if let Some(max) = budgets.max_tokens_per_issue
        && spent.total_tokens > max
    {
        return Some(format!(
            "{} tokens spent on the issue, over agent.max_tokens_per_issue ({max})",
            spent.total_tokens
        ));
    }
    if let Some(max) = budgets.max_cost_usd_per_issue
        && spent.cost_usd > max
    {
        return Some(format!(
            "${:.6} spent on the issue, over agent.max_cost_usd_per_issue (${max})",
            round_usd(spent.cost_usd)
        ));
    }
    None
}

/// Whether the UTC day of `now` has spent `agent.daily_budget_usd` (the fleet's, with a shared
/// store), or every workflow together `daemon.daily_budget_usd`.
pub fn daily_budget_reached(state: &State, settings: &Settings, now: Millis) -> bool {
    state.shared.budget_reached
        || settings.agent.budgets.daily_budget_usd.is_some_and(|max| {
            state
                .ledger
                .line(&crate::orchestrator::ledger::day_line(now))
                .cost_usd
                >= max
        })
}

/// An issue whose spend (every run, retry and daemon of the fleet, as the ledger holds it) is
/// past a per-issue budget: held back, whatever its state (a run would be stopped at its first
/// usage report), until a reload raises the budget above what it spent.
pub(super) fn held_over_budget(state: &State, settings: &Settings, issue: &Issue) -> bool {
    over_issue_budget(
        &settings.agent.budgets,
        &state
            .ledger
            .line(&crate::orchestrator::ledger::issue_line(&issue.identifier)),
    )
    .is_some()
}

/// Holds what was spent against the budgets as a run's usage arrives: an issue past its budget
/// has every run cancelled (failed, `budget_exceeded: ...`, not retried), its retries dropped,
/// one comment posted, and is held back; with the day's budget reached, running runs end after
/// their current turn.
pub(super) fn check_budgets(state: &mut State, now: Millis, key: &Key, fx: &mut Vec<Effect>) {
    let settings = Arc::clone(&state.settings);
    let budgets = settings.agent.budgets;
    // No budget: nothing to hold against (the common case, on the hot path of usage reports).
    if budgets == crate::config::Budgets::default() {
        return;
    }
    let Some(run) = state.running.get(key) else {
        return;
    };
    let per_issue =
        budgets.max_tokens_per_issue.is_some() || budgets.max_cost_usd_per_issue.is_some();
    let spent = if per_issue && run.may_stop() {
        state.ledger.line(&crate::orchestrator::ledger::issue_line(
            &run.slot.issue.identifier,
        ))
    } else {
        Spent::default()
    };
    if let Some(why) = over_issue_budget(&budgets, &spent) {
        let issue = run.slot.issue.clone();
        let reason = StopReason::Budget(why.clone());
        for r in state
            .running
            .values_mut()
            .filter(|r| r.slot.issue.id == issue.id)
            .filter(|r| matches!(r.stopping, None | Some(StopReason::DailyBudget)))
        {
            r.stopping = Some(reason.clone());
            fx.push(Effect::CancelRun {
                run_id: r.run_id.clone(),
                reason: reason.clone(),
            });
        }
        state.retries.retain(|k, _| k.issue_id != issue.id);
        state.event(
            now,
            "budget_exceeded",
            format!(
                "{}: {why}; the run is cancelled and the issue not dispatched again unless the budget is raised",
                issue.identifier
            ),
            Some(&issue.identifier),
        );
        let which = if why.contains("max_tokens_per_issue") {
            "max_tokens_per_issue"
        } else {
            "max_cost_usd_per_issue"
        };
        fx.push(Effect::BudgetComment {
            mark: format!("{} {which}", issue.id),
            body: format!(
                "svc stopped work on this issue: {} input, {} output and {} total tokens{} over {} runs were spent on it, past its budget ({why}). It is not dispatched again unless the budget is raised.",
                spent.input_tokens,
                spent.output_tokens,
                spent.total_tokens,
                if spent.cost_usd > 0.0 {
                    format!(" (${:.6})", round_usd(spent.cost_usd))
                } else {
                    String::new()
                },
                spent.runs
            ),
            issue: Box::new(issue),
        });
        return;
    }
    if daily_budget_reached(state, &settings, now) {
        let mut told = false;
        for r in state.running.values_mut().filter(|r| r.stopping.is_none()) {
            r.stopping = Some(StopReason::DailyBudget);
            fx.push(Effect::LastTurn {
                run_id: r.run_id.clone(),
            });
            told = true;
        }
        if told {
            let day = crate::orchestrator::ledger::day_of(now);
            let spent = state.ledger.day(now);
            state.event(
                now,
                "daily_budget_reached",
                format!(
                    "${:.6} spent on {day} (UTC), agent.daily_budget_usd is ${}: running runs end after their current turn, and no new run starts until 00:00 UTC or a raise",
                    round_usd(spent.cost_usd),
                    budgets.daily_budget_usd.unwrap_or_default()
                ),
                None,
            );
        }
    }
}
