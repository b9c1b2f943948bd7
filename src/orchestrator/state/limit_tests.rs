//! Rate limits in the state machine, with a fake clock: a limited run's end, cooldowns,
//! fallback kinds, routes that pin their kind, silent turns, and what the fleet recorded.

use super::tests::{T0, dispatch, exit, k, run_id, state};
use super::*;
use crate::orchestrator::protocol::*;
use crate::orchestrator::testutil::issue;

const TWO_KINDS: &str = "tracker:\n  kind: memory\nagent:\n  kind: agent_a\nagents:\n  agent_a:\n    bridge_command: a-acp\n    fallback: [agent_b]\n  agent_b:\n    bridge_command: b-acp\n";
const ONE_KIND: &str = "tracker:\n  kind: memory\nagent:\n  kind: agent_a\n  max_concurrent_agents: 1\nagents:\n  agent_a:\n    bridge_command: a-acp\n    cooldown_ms: 60000\n";

fn limit(reset_at: Option<Millis>) -> Limit {
    Limit {
        reason: "You've hit your limit".into(),
        reset_at,
    }
}

fn started(fx: &[Effect]) -> Vec<&RunSpec> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::StartRun(s) => Some(&**s),
            _ => None,
        })
        .collect()
}

/// agent_a cooling down since T0 until `until`, shared by `scope`.
fn cooldown(scope: &str, until: Millis) -> Cooldown {
    Cooldown {
        kind: "agent_a".into(),
        until,
        since: T0,
        reason: "limit".into(),
        scope: scope.into(),
    }
}

fn events(st: &State, name: &str) -> usize {
    st.events.iter().filter(|e| e.event == name).count()
}

#[test]
fn a_limited_run_ends_rate_limited_keeps_its_attempt_and_its_retry_waits_for_the_reset() {
    let mut st = state(ONE_KIND);
    let fx = dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    assert_eq!(started(&fx)[0].agent_kind, "agent_a");
    let reset = T0 + 7_200_000;
    exit(
        &mut st,
        T0 + 100,
        "A-1",
        RunEnd::RateLimited(limit(Some(reset))),
    );
    let run = &st.history[0];
    assert_eq!(run.outcome, Outcome::RateLimited);
    assert_eq!(run.outcome.as_str(), "rate_limited");
    let retry = &st.retries[&k("id-A-1")];
    assert_eq!(retry.kind, RetryKind::RateLimited);
    assert_eq!(retry.attempt, 0, "the attempt is not counted");
    assert_eq!(retry.due_at, reset, "no backoff: the reset");
    assert_eq!(st.restart_counts.get(&k("id-A-1")), None);
    assert_eq!(st.cooldowns["agent_a"].until, reset);
    assert_eq!(st.cooldowns["agent_a"].scope, "fleet");
    assert_eq!(events(&st, "agent_rate_limited"), 1);
    assert!(st.next_deadline().is_some_and(|d| d <= reset));
}

#[test]
fn a_limit_with_no_reset_lasts_the_kinds_cooldown_ms() {
    let mut st = state(ONE_KIND);
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    exit(&mut st, T0 + 100, "A-1", RunEnd::RateLimited(limit(None)));
    assert_eq!(st.cooldowns["agent_a"].until, T0 + 100 + 60_000);
    assert_eq!(st.retries[&k("id-A-1")].due_at, T0 + 100 + 60_000);
}

#[test]
fn while_the_only_kind_cools_down_issues_are_blocked_and_dispatch_resumes_at_its_end() {
    let mut st = state(ONE_KIND);
    dispatch(
        &mut st,
        T0,
        vec![issue("A-1", "Todo", &[]), issue("A-2", "Todo", &[])],
    );
    let reset = T0 + 5_000;
    let fx = exit(
        &mut st,
        T0 + 100,
        "A-1",
        RunEnd::RateLimited(limit(Some(reset))),
    );
    // A-2 had waited for the one slot: now it waits for the limit, and nothing starts.
    assert!(started(&fx).is_empty(), "{fx:?}");
    assert_eq!(st.blocked.len(), 1);
    let b = &st.blocked[0];
    assert_eq!(b.issue.identifier, "A-2");
    assert_eq!(b.reason, BlockedReason::AgentRateLimited);
    assert_eq!(b.agent_kind.as_deref(), Some("agent_a"));
    assert_eq!(b.until, Some(reset));
    // A retry coming due early (it cannot: it is due at the reset) or a fetch in the cooldown
    // puts it back to wait, attempt kept.
    let fx = handle(
        &mut st,
        T0 + 200,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Todo", &[]))),
        },
    );
    assert!(started(&fx).is_empty());
    let retry = &st.retries[&k("id-A-1")];
    assert_eq!((retry.attempt, retry.due_at), (0, reset));
    assert!(
        retry
            .error
            .as_deref()
            .unwrap()
            .starts_with("agent_rate_limited: agent_a until ")
    );
    // At the reset: the cooldown ends, said once, and the blocked issue goes.
    let fx = handle(&mut st, reset, Event::Tick);
    assert_eq!(events(&st, "agent_cooldown_ended"), 1);
    assert!(st.cooldowns.is_empty());
    let names: Vec<&str> = started(&fx)
        .iter()
        .map(|s| s.slot.issue.identifier.as_str())
        .collect();
    assert_eq!(names, ["A-2"], "{fx:?}");
}

#[test]
fn with_a_fallback_the_retry_starts_at_once_on_it_with_the_previous_attempt() {
    let mut st = state(TWO_KINDS);
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    let fx = exit(
        &mut st,
        T0 + 100,
        "A-1",
        RunEnd::RateLimited(limit(Some(T0 + 3_600_000))),
    );
    let retry = &st.retries[&k("id-A-1")];
    assert_eq!(retry.due_at, T0 + 100, "at once");
    assert!(
        fx.iter().any(|e| matches!(e, Effect::FetchForRetry { .. })),
        "{fx:?}"
    );
    let fx = handle(
        &mut st,
        T0 + 150,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Todo", &[]))),
        },
    );
    let spec = started(&fx)[0];
    assert_eq!(spec.agent_kind, "agent_b");
    assert_eq!(spec.attempt, None, "still not counted");
    let previous = spec.previous_attempt.as_ref().unwrap();
    assert_eq!(previous.kind, "agent_a");
    assert_eq!(previous.at, T0 + 100);
    assert_eq!(previous.reason, "You've hit your limit");
    // New issues go to the fallback too while agent_a cools down.
    let fx = handle(
        &mut st,
        T0 + 200,
        Event::PollDone(super::tests::poll_report(
            vec![issue("A-1", "Todo", &[]), issue("A-3", "Todo", &[])],
            vec![issue("A-1", "Todo", &[])],
            &["id-A-1"],
        )),
    );
    let s = started(&fx);
    assert_eq!(s.len(), 1);
    assert_eq!(
        (
            s[0].slot.issue.identifier.as_str(),
            s[0].agent_kind.as_str()
        ),
        ("A-3", "agent_b")
    );
    assert!(s[0].previous_attempt.is_none());
}

#[test]
fn a_route_keeps_its_kind_unless_the_kind_allows_route_fallback() {
    let routed = || issue("A-1", "Todo", &["Svc:agent_a"]);
    let mut st = state(TWO_KINDS);
    st.cooldowns
        .insert("agent_a".into(), cooldown("fleet", T0 + 60_000));
    let fx = dispatch(&mut st, T0, vec![routed(), issue("A-2", "Todo", &[])]);
    let s = started(&fx);
    assert_eq!(s.len(), 1);
    assert_eq!(
        (
            s[0].slot.issue.identifier.as_str(),
            s[0].agent_kind.as_str()
        ),
        ("A-2", "agent_b")
    );
    assert_eq!(st.blocked[0].issue.identifier, "A-1");
    assert_eq!(st.blocked[0].reason, BlockedReason::AgentRateLimited);

    let allowing = TWO_KINDS.replace(
        "    fallback: [agent_b]\n",
        "    fallback: [agent_b]\n    route_fallback: true\n",
    );
    let mut st = state(&allowing);
    st.cooldowns
        .insert("agent_a".into(), cooldown("fleet", T0 + 60_000));
    let fx = dispatch(&mut st, T0, vec![routed()]);
    assert_eq!(started(&fx)[0].agent_kind, "agent_b");
}

#[test]
fn two_silent_turns_in_a_row_on_a_kind_stop_its_run_rate_limited() {
    let mut st = state(ONE_KIND);
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    let id = run_id(&st, "A-1");
    let turn = |st: &mut State, at, turn, silent| {
        handle(
            st,
            at,
            Event::Run {
                run_id: id.clone(),
                msg: RunMsg::TurnEnded { turn, silent },
            },
        )
    };
    // A turn with output between two silent ones: no limit.
    let fx = turn(&mut st, T0 + 10, 1, true);
    assert!(!fx.iter().any(|e| matches!(e, Effect::CancelRun { .. })));
    turn(&mut st, T0 + 20, 2, false);
    let fx = turn(&mut st, T0 + 30, 3, true);
    assert!(!fx.iter().any(|e| matches!(e, Effect::CancelRun { .. })));
    let fx = turn(&mut st, T0 + 40, 4, true);
    assert!(
        fx.iter().any(|e| matches!(
            e,
            Effect::CancelRun {
                reason: StopReason::RateLimited(_),
                ..
            }
        )),
        "{fx:?}"
    );
    assert!(st.cooldowns.contains_key("agent_a"));
    exit(
        &mut st,
        T0 + 50,
        "A-1",
        RunEnd::Failed("canceled: agent_rate_limited".into()),
    );
    assert_eq!(st.history[0].outcome, Outcome::RateLimited);
    assert_eq!(st.retries[&k("id-A-1")].kind, RetryKind::RateLimited);
}

#[test]
fn an_operator_cancel_of_a_limited_run_is_not_retried() {
    let mut st = state(ONE_KIND);
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    handle(
        &mut st,
        T0 + 10,
        Event::Cancel {
            issue_id: "id-A-1".into(),
        },
    );
    exit(&mut st, T0 + 20, "A-1", RunEnd::RateLimited(limit(None)));
    assert_eq!(st.history[0].outcome, Outcome::RateLimited);
    assert!(st.retries.is_empty());
    assert!(
        st.cooldowns.contains_key("agent_a"),
        "the limit was met all the same"
    );
}

#[test]
fn cooldowns_the_store_holds_are_taken_by_their_scope() {
    let host = ONE_KIND.replace(
        "    cooldown_ms: 60000\n",
        "    cooldown_ms: 60000\n    cooldown_scope: host\n",
    );
    let mut st = state(ONE_KIND);
    let swept = |c: Vec<Cooldown>| {
        Event::Swept(Box::new(Swept {
            cooldowns: c,
            ..Swept::default()
        }))
    };
    handle(&mut st, T0, swept(vec![cooldown("host", T0 + 9_000)]));
    assert!(
        st.cooldowns.is_empty(),
        "a fleet-scoped kind ignores a host's cooldown"
    );
    handle(
        &mut st,
        T0,
        swept(vec![
            cooldown("fleet", T0 + 9_000),
            cooldown("fleet", T0 - 1),
        ]),
    );
    assert_eq!(st.cooldowns["agent_a"].until, T0 + 9_000);
    assert_eq!(events(&st, "agent_rate_limited"), 1);
    // Read again at the next sweep: nothing new said.
    handle(&mut st, T0 + 10, swept(vec![cooldown("fleet", T0 + 9_000)]));
    assert_eq!(events(&st, "agent_rate_limited"), 1);
    let mut st = state(&host);
    handle(&mut st, T0, swept(vec![cooldown("fleet", T0 + 9_000)]));
    assert!(st.cooldowns.is_empty());
    handle(&mut st, T0, swept(vec![cooldown("host", T0 + 9_000)]));
    assert_eq!(st.cooldowns["agent_a"].scope, "host");
}

#[test]
fn a_steering_message_a_limited_run_did_not_deliver_waits_for_the_next_run() {
    let mut st = state(TWO_KINDS);
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    let message = crate::steering::Message {
        issue_id: "id-A-1".into(),
        source: crate::steering::Source::Github,
        author: "alice".into(),
        text: "also fix the docs".into(),
        at: "2026-11-28T10:00:00Z".into(),
        key: "c-1".into(),
    };
    // The message went to the running run (its next turn), which met a limit first.
    let fx = handle(
        &mut st,
        T0 + 10,
        Event::Steer {
            messages: vec![message],
            cursor: None,
            ignored: Vec::new(),
            held: Vec::new(),
        },
    );
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Steer { .. })),
        "{fx:?}"
    );
    exit(&mut st, T0 + 20, "A-1", RunEnd::RateLimited(limit(None)));
    assert_eq!(st.steering.waiting_for("id-A-1"), 1);
    // The retry on the fallback carries it in its first prompt.
    let fx = handle(
        &mut st,
        T0 + 30,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Todo", &[]))),
        },
    );
    let spec = started(&fx)[0];
    assert_eq!(spec.agent_kind, "agent_b");
    assert_eq!(spec.steering.len(), 1);
    assert_eq!(spec.steering[0].text, "also fix the docs");
}
