//! State-machine tests of the budgets: an issue's, and the day's.

use super::tests::*;
use super::*;
use crate::orchestrator::protocol::*;
use crate::orchestrator::testutil::{issue, settings};

fn usage(st: &mut State, now: Millis, identifier: &str, total: u64, usd: f64) -> Vec<Effect> {
    let run_id = run_id(st, identifier);
    handle(
        st,
        now,
        Event::Run {
            run_id,
            msg: RunMsg::Usage(Usage {
                tokens: Tokens {
                    input: total,
                    output: 0,
                    total,
                },
                cost_usd: Some(usd),
                cost_other: None,
            }),
        },
    )
}

#[test]
fn an_issue_past_its_budget_is_cancelled_not_retried_commented_once_and_held() {
    let mut st = state("tracker:\n  kind: memory\nagent:\n  max_tokens_per_issue: 1000");
    let a = issue("A-1", "Todo", &[]);
    dispatch(&mut st, T0, vec![a.clone()]);
    // Cumulative reports: the ledger takes what each adds.
    assert!(usage(&mut st, T0 + 1, "A-1", 600, 0.1).is_empty());
    assert_eq!(st.ledger.line("issue:A-1").total_tokens, 600);
    let fx = usage(&mut st, T0 + 2, "A-1", 1001, 0.2);
    assert!(
        fx.iter().any(|e| matches!(
            e,
            Effect::CancelRun {
                reason: StopReason::Budget(_),
                ..
            }
        )),
        "{fx:?}"
    );
    let comments: Vec<&Effect> = fx
        .iter()
        .filter(|e| matches!(e, Effect::BudgetComment { .. }))
        .collect();
    assert_eq!(comments.len(), 1, "{fx:?}");
    assert_eq!(
        st.ledger.line("issue:A-1").total_tokens,
        1001,
        "not counted twice"
    );
    // A later report of the same run changes nothing more.
    let fx = usage(&mut st, T0 + 3, "A-1", 1100, 0.2);
    assert!(fx.is_empty(), "{fx:?}");
    exit(&mut st, T0 + 4, "A-1", RunEnd::Failed("canceled".into()));
    let r = &st.history[0];
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(
        r.failure_reason
            .as_deref()
            .unwrap()
            .starts_with("budget_exceeded: 1001 tokens"),
        "{:?}",
        r.failure_reason
    );
    assert!(st.retries.is_empty(), "not retried");
    assert!(st.events.iter().any(|e| e.event == "budget_exceeded"));
    // Held at the next poll while Todo and over the budget...
    st.next_poll_at = T0 + 30;
    handle(&mut st, T0 + 30, Event::Tick);
    let fx = handle(
        &mut st,
        T0 + 31,
        Event::PollDone(poll_report(vec![a.clone()], vec![], &[])),
    );
    assert!(starts(&fx).is_empty(), "{fx:?}");
    // ... and let go by a reload that raises the budget.
    let raised = Arc::new(settings(
        "tracker:\n  kind: memory\nagent:\n  max_tokens_per_issue: 5000",
    ));
    st.settings = raised;
    st.next_poll_at = T0 + 40;
    handle(&mut st, T0 + 40, Event::Tick);
    let fx = handle(
        &mut st,
        T0 + 41,
        Event::PollDone(poll_report(vec![a], vec![], &[])),
    );
    assert_eq!(starts(&fx), vec![("A-1".to_string(), None)]);
}

#[test]
fn the_day_s_budget_ends_running_runs_after_their_turn_and_blocks_new_ones() {
    let mut st = state(
        "tracker:\n  kind: memory\nagent:\n  daily_budget_usd: 1\n  max_concurrent_agents: 2",
    );
    let (a, b, c) = (
        issue("A-1", "Todo", &[]),
        issue("B-1", "Todo", &[]),
        issue("C-1", "Todo", &[]),
    );
    dispatch(&mut st, T0, vec![a, b, c.clone()]);
    assert!(usage(&mut st, T0 + 1, "A-1", 10, 0.6).is_empty());
    let fx = usage(&mut st, T0 + 2, "B-1", 10, 0.5);
    let last: Vec<&Effect> = fx
        .iter()
        .filter(|e| matches!(e, Effect::LastTurn { .. }))
        .collect();
    assert_eq!(last.len(), 2, "every running run: {fx:?}");
    assert!(st.events.iter().any(|e| e.event == "daily_budget_reached"));
    // Their turn over, they end as a success, with no continuation retry.
    exit(&mut st, T0 + 3, "A-1", RunEnd::Clean);
    exit(&mut st, T0 + 3, "B-1", RunEnd::Clean);
    assert!(st.retries.is_empty(), "{:?}", st.retries);
    st.next_poll_at = T0 + 10;
    handle(&mut st, T0 + 10, Event::Tick);
    let fx = handle(
        &mut st,
        T0 + 11,
        Event::PollDone(poll_report(vec![c], vec![], &[])),
    );
    assert!(starts(&fx).is_empty(), "{fx:?}");
    assert_eq!(st.blocked[0].reason, BlockedReason::DailyBudgetReached);
    // 00:00 UTC: a new day, a new budget.
    let midnight = (T0 / 86_400_000 + 1) * 86_400_000;
    st.next_poll_at = midnight;
    handle(&mut st, midnight, Event::Tick);
    let fx = handle(
        &mut st,
        midnight + 1,
        Event::PollDone(poll_report(vec![issue("C-1", "Todo", &[])], vec![], &[])),
    );
    assert_eq!(starts(&fx), vec![("C-1".to_string(), None)]);
}

#[test]
fn a_retry_refused_at_its_claim_by_the_days_budget_keeps_its_attempt() {
    let mut st = state("tracker:\n  kind: memory\nagent:\n  max_retry_backoff_ms: 25000");
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    exit(&mut st, T0 + 100, "A-1", RunEnd::Failed("boom".into()));
    handle(&mut st, T0 + 10_100, Event::Tick);
    let fx = handle(
        &mut st,
        T0 + 10_100,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Todo", &[]))),
        },
    );
    assert_eq!(starts(&fx), [("A-1".into(), Some(1))]);
    // The store refuses its claim: the day's budget is reached.
    exit(
        &mut st,
        T0 + 10_200,
        "A-1",
        RunEnd::BudgetRefused("the day's budget is reached".into()),
    );
    let r = &st.retries[&k("id-A-1")];
    assert_eq!((r.attempt, r.kind), (1, RetryKind::Failure), "{r:?}");
    assert!(r.due_at > T0 + 10_200);
    let e = &st.events[0];
    assert_eq!(e.event, "daily_budget_reached", "{e:?}");
    assert!(e.message.contains("retry 1 kept"), "{e:?}");
    assert!(
        st.events.iter().all(|e| e.event != "claim_superseded"),
        "{:?}",
        st.events
    );
    assert!(
        st.history.iter().all(|h| h.run.attempt != Some(1)),
        "a run that never started is no history"
    );
}
