//! State-machine tests with a fake clock: every transition, no sleeps.

use super::*;
use crate::orchestrator::protocol::*;
use crate::orchestrator::testutil::{issue, settings};

pub(super) const T0: Millis = 1_000_000;

/// The key of an issue's first (or only) slot.
pub(super) fn k(id: &str) -> Key {
    Key::new(id, 0)
}

pub(super) fn state(yaml: &str) -> State {
    State::new(Arc::new(settings(yaml)), T0)
}

pub(super) fn poll_report(
    candidates: Vec<Issue>,
    refreshed: Vec<Issue>,
    requested: &[&str],
) -> PollReport {
    PollReport {
        candidates: Ok(candidates),
        refreshed: Ok(refreshed),
        requested: requested.iter().map(|s| s.to_string()).collect(),
        terminal: None,
        rate_limits: None,
        duration_ms: 0,
        read_at: 0,
    }
}

pub(super) fn starts(fx: &[Effect]) -> Vec<(String, Option<u32>)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::StartRun(s) => Some((s.slot.issue.identifier.clone(), s.attempt)),
            _ => None,
        })
        .collect()
}

pub(super) fn run_id(st: &State, identifier: &str) -> String {
    st.running
        .values()
        .find(|r| r.slot.issue.identifier == identifier)
        .unwrap()
        .run_id
        .clone()
}

pub(super) fn exit(st: &mut State, now: Millis, identifier: &str, end: RunEnd) -> Vec<Effect> {
    let run_id = run_id(st, identifier);
    handle(
        st,
        now,
        Event::Run {
            run_id,
            msg: RunMsg::Exited(end),
        },
    )
}

/// Starts the first poll and answers it with `candidates`.
pub(super) fn dispatch(st: &mut State, now: Millis, candidates: Vec<Issue>) -> Vec<Effect> {
    let fx = handle(st, now, Event::Tick);
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Poll { .. })),
        "{fx:?}"
    );
    handle(
        st,
        now,
        Event::PollDone(poll_report(candidates, vec![], &[])),
    )
}

#[test]
fn backoff_doubles_from_ten_seconds_up_to_the_ceiling() {
    assert_eq!(backoff_ms(1, 300_000), 10_000);
    assert_eq!(backoff_ms(2, 300_000), 20_000);
    assert_eq!(backoff_ms(3, 300_000), 40_000);
    assert_eq!(backoff_ms(5, 300_000), 160_000);
    assert_eq!(backoff_ms(6, 300_000), 300_000);
    assert_eq!(backoff_ms(60, 300_000), 300_000);
    assert_eq!(backoff_ms(2, 15_000), 15_000);
}

#[test]
fn first_tick_polls_with_terminal_cleanup_then_waits_the_interval() {
    let mut st = state("tracker:\n  kind: memory\npolling:\n  interval_ms: 5000");
    let fx = handle(&mut st, T0, Event::Tick);
    assert!(
        matches!(
            &fx[..],
            [Effect::Poll {
                include_terminal: true,
                ..
            }]
        ),
        "{fx:?}"
    );
    assert!(
        handle(&mut st, T0 + 10, Event::Tick).is_empty(),
        "one poll in flight at a time"
    );
    let mut report = poll_report(vec![], vec![], &[]);
    report.terminal = Some(vec![issue("D-1", "Done", &[])]);
    let fx = handle(&mut st, T0 + 20, Event::PollDone(report));
    assert!(
        matches!(&fx[..], [Effect::CleanupTerminal { issues, .. }] if issues.len() == 1),
        "{fx:?}"
    );
    assert_eq!(st.next_deadline(), Some(T0 + 20 + 5000));
    let fx = handle(&mut st, T0 + 5020, Event::Tick);
    assert!(
        matches!(
            &fx[..],
            [Effect::Poll {
                include_terminal: false,
                ..
            }]
        ),
        "{fx:?}"
    );
}

#[test]
fn dispatch_starts_in_priority_order_up_to_the_global_cap() {
    let mut st = state("tracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 2");
    let mut a = issue("A-1", "Todo", &["x"]);
    a.priority = Some(3);
    let mut b = issue("B-1", "Todo", &[]);
    b.priority = Some(1);
    let c = issue("C-1", "In Progress", &[]);
    let done = issue("D-1", "Done", &[]);
    let fx = dispatch(&mut st, T0, vec![a, b, c, done]);
    assert_eq!(starts(&fx), [("B-1".into(), None), ("A-1".into(), None)]);
    assert_eq!(st.blocked.len(), 1);
    assert_eq!(st.blocked[0].issue.identifier, "C-1");
    assert_eq!(st.blocked[0].reason.code(), "global_concurrency_cap");
    assert_eq!(st.blocked[0].reason.label(), "global concurrency cap");
    // A slot frees: the blocked issue starts at once, without waiting for the next poll.
    let fx = exit(&mut st, T0 + 100, "B-1", RunEnd::Clean);
    assert_eq!(starts(&fx), [("C-1".into(), None)]);
    assert!(st.blocked.is_empty());
}

#[test]
fn per_state_caps_come_from_status_overrides() {
    let mut st = state(
        "tracker:\n  kind: memory\nstatus_overrides:\n  In Progress:\n    agent:\n      max_concurrent_agents: 1",
    );
    let fx = dispatch(
        &mut st,
        T0,
        vec![
            issue("A-1", "In Progress", &[]),
            issue("A-2", "In Progress", &[]),
            issue("A-3", "Todo", &[]),
        ],
    );
    assert_eq!(starts(&fx), [("A-1".into(), None), ("A-3".into(), None)]);
    assert_eq!(st.blocked[0].reason, BlockedReason::LocalConcurrencyCap);
    assert_eq!(st.blocked[0].issue.identifier, "A-2");
}

#[test]
fn routing_filters_and_selects_the_agent() {
    let mut st = state(
        "tracker:\n  kind: memory\n  dispatch:\n    accept_unrouted: false\n    only_routes: [backend, agent_b]",
    );
    let fx = dispatch(
        &mut st,
        T0,
        vec![
            issue("U-1", "Todo", &[]),
            issue("F-1", "Todo", &["Svc:frontend"]),
            issue("B-1", "Todo", &["Svc:Backend"]),
            issue("K-1", "Todo", &["Svc:agent_b"]),
        ],
    );
    assert_eq!(starts(&fx), [("B-1".into(), None), ("K-1".into(), None)]);
    let kinds: Vec<&str> = fx
        .iter()
        .filter_map(|e| {
            if let Effect::StartRun(s) = e {
                Some(s.agent_kind.as_str())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(kinds, ["agent_a", "agent_b"]);
    assert!(
        st.blocked.is_empty(),
        "unroutable issues are not blocked, just not eligible"
    );
}

#[test]
fn claimed_issues_are_not_dispatched_twice() {
    let mut st = state("tracker:\n  kind: memory");
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    let fx = handle(&mut st, T0 + 30_000, Event::Tick);
    assert!(
        matches!(&fx[..], [Effect::Poll { ids, .. }] if ids == &["id-A-1".to_string()]),
        "{fx:?}"
    );
    let fx = handle(
        &mut st,
        T0 + 30_000,
        Event::PollDone(poll_report(
            vec![issue("A-1", "Todo", &[])],
            vec![issue("A-1", "Todo", &[])],
            &["id-A-1"],
        )),
    );
    assert!(starts(&fx).is_empty());
    assert_eq!(st.running.len(), 1);
}

#[test]
fn clean_exit_schedules_a_continuation_after_one_second() {
    let mut st = state("tracker:\n  kind: memory");
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    exit(&mut st, T0 + 5000, "A-1", RunEnd::Clean);
    let retry = &st.retries[&k("id-A-1")];
    assert_eq!(
        (retry.kind, retry.attempt, retry.due_at),
        (RetryKind::Continuation, 0, T0 + 6000)
    );
    assert_eq!(st.history[0].outcome, Outcome::Success);
    assert!(
        handle(&mut st, T0 + 5999, Event::Tick)
            .iter()
            .all(|e| !matches!(e, Effect::FetchForRetry { .. }))
    );
    let fx = handle(&mut st, T0 + 6000, Event::Tick);
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::FetchForRetry { key } if key.issue_id == "id-A-1")),
        "{fx:?}"
    );
    let fx = handle(
        &mut st,
        T0 + 6001,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "In Progress", &[]))),
        },
    );
    assert_eq!(
        starts(&fx),
        [("A-1".into(), None)],
        "a continuation is not a retry attempt"
    );
}

#[test]
fn failures_retry_with_exponential_backoff_and_count_attempts() {
    let mut st = state("tracker:\n  kind: memory\nagent:\n  max_retry_backoff_ms: 25000");
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    exit(
        &mut st,
        T0 + 100,
        "A-1",
        RunEnd::Failed("bridge crashed".into()),
    );
    let r = &st.retries[&k("id-A-1")];
    assert_eq!(
        (r.kind, r.attempt, r.due_at, r.error.as_deref()),
        (RetryKind::Failure, 1, T0 + 10_100, Some("bridge crashed"))
    );
    assert_eq!(st.history[0].outcome, Outcome::Failed);
    assert_eq!(
        st.history[0].failure_reason.as_deref(),
        Some("bridge crashed")
    );
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
    exit(&mut st, T0 + 10_200, "A-1", RunEnd::Failed("again".into()));
    assert_eq!(
        (
            st.retries[&k("id-A-1")].attempt,
            st.retries[&k("id-A-1")].due_at
        ),
        (2, T0 + 30_200)
    );
    handle(&mut st, T0 + 30_200, Event::Tick);
    handle(
        &mut st,
        T0 + 30_200,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Todo", &[]))),
        },
    );
    exit(&mut st, T0 + 30_300, "A-1", RunEnd::Failed("third".into()));
    assert_eq!(
        st.retries[&k("id-A-1")].due_at,
        T0 + 30_300 + 25_000,
        "capped at max_retry_backoff_ms"
    );
    assert_eq!(st.restart_counts[&k("id-A-1")], 3);
}

#[test]
fn due_retries_are_released_or_requeued_by_what_the_tracker_says() {
    let setup = |yaml: &str| {
        let mut st = state(yaml);
        dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
        exit(&mut st, T0, "A-1", RunEnd::Failed("x".into()));
        handle(&mut st, T0 + 10_000, Event::Tick);
        st
    };
    // missing: released
    let mut st = setup("tracker:\n  kind: memory");
    let fx = handle(
        &mut st,
        T0 + 10_000,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(None),
        },
    );
    assert!(fx.is_empty() && st.retries.is_empty(), "{fx:?}");
    // terminal: released and cleaned
    let mut st = setup("tracker:\n  kind: memory");
    let fx = handle(
        &mut st,
        T0 + 10_000,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Done", &[]))),
        },
    );
    assert!(
        matches!(&fx[..], [Effect::RemoveWorkspace { .. }]),
        "{fx:?}"
    );
    assert!(st.retries.is_empty() && st.removing.contains(&k("id-A-1")));
    // not routable any more: released without cleanup
    let mut st = setup("tracker:\n  kind: memory\n  dispatch:\n    only_routes: [backend]");
    let fx = handle(
        &mut st,
        T0 + 10_000,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Todo", &["Svc:frontend"]))),
        },
    );
    assert!(fx.is_empty() && st.retries.is_empty(), "{fx:?}");
    // no slot: requeued with the spec's error
    let mut st = setup("tracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 1");
    handle(
        &mut st,
        T0 + 10_000,
        Event::PollDone(poll_report(vec![issue("B-1", "Todo", &[])], vec![], &[])),
    );
    assert_eq!(st.running.len(), 1);
    let fx = handle(
        &mut st,
        T0 + 10_001,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Todo", &[]))),
        },
    );
    assert!(starts(&fx).is_empty());
    assert_eq!(st.retries[&k("id-A-1")].error.as_deref(), Some(NO_SLOTS));
    assert_eq!(st.retries[&k("id-A-1")].attempt, 1);
    // tracker down: tried again later, keeping the attempt
    let mut st = setup("tracker:\n  kind: memory");
    handle(
        &mut st,
        T0 + 10_000,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Err("timeout".into()),
        },
    );
    assert!(
        st.retries[&k("id-A-1")]
            .error
            .as_deref()
            .unwrap()
            .contains("timeout")
    );
    assert!(st.retries[&k("id-A-1")].due_at > T0 + 10_000);
}

#[test]
fn reconciliation_stops_terminal_and_inactive_runs() {
    let mut st = state("tracker:\n  kind: memory\n  dispatch:\n    only_routes: [backend]");
    dispatch(
        &mut st,
        T0,
        vec![
            issue("A-1", "Todo", &[]),
            issue("B-1", "Todo", &[]),
            issue("C-1", "Todo", &[]),
            issue("D-1", "Todo", &[]),
        ],
    );
    assert_eq!(st.running.len(), 4);
    handle(&mut st, T0 + 30_000, Event::Tick);
    let refreshed = vec![
        issue("A-1", "Done", &[]),
        issue("B-1", "Backlog", &[]),
        issue("C-1", "Todo", &["Svc:frontend"]),
    ];
    let fx = handle(
        &mut st,
        T0 + 30_000,
        Event::PollDone(poll_report(
            vec![],
            refreshed,
            &["id-A-1", "id-B-1", "id-C-1", "id-D-1"],
        )),
    );
    let cancels: Vec<(String, StopReason)> = fx
        .iter()
        .filter_map(|e| {
            if let Effect::CancelRun { run_id, reason } = e {
                Some((run_id.clone(), reason.clone()))
            } else {
                None
            }
        })
        .collect();
    assert_eq!(cancels.len(), 4, "{fx:?}");
    assert_eq!(cancels[0].1, StopReason::Terminal);
    assert!(matches!(&cancels[1].1, StopReason::Inactive(m) if m.contains("Backlog")));
    assert!(matches!(&cancels[2].1, StopReason::Inactive(m) if m.contains("only_routes")));
    assert!(matches!(&cancels[3].1, StopReason::Inactive(m) if m.contains("no longer exists")));
    let fx = exit(
        &mut st,
        T0 + 30_100,
        "A-1",
        RunEnd::Failed("cancelled".into()),
    );
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::RemoveWorkspace { .. })),
        "terminal issues are cleaned"
    );
    assert_eq!(st.history[0].outcome, Outcome::Success);
    let fx = exit(
        &mut st,
        T0 + 30_100,
        "B-1",
        RunEnd::Failed("cancelled".into()),
    );
    assert!(
        fx.iter()
            .all(|e| !matches!(e, Effect::RemoveWorkspace { .. })),
        "inactive issues keep their workspace"
    );
    assert!(st.retries.is_empty(), "stopped runs are not retried");
}

#[test]
fn a_failing_refresh_leaves_runs_alone() {
    let mut st = state("tracker:\n  kind: memory");
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    handle(&mut st, T0 + 30_000, Event::Tick);
    let report = PollReport {
        candidates: Err("503".into()),
        refreshed: Err("503".into()),
        requested: vec!["id-A-1".into()],
        terminal: None,
        rate_limits: None,
        duration_ms: 0,
        read_at: 0,
    };
    let fx = handle(&mut st, T0 + 30_000, Event::PollDone(report));
    assert!(fx.is_empty(), "{fx:?}");
    assert_eq!(st.running.len(), 1);
    let names: Vec<&str> = st.events.iter().map(|e| e.event.as_str()).collect();
    assert!(
        names.contains(&"tracker_refresh_failed") && names.contains(&"tracker_poll_failed"),
        "{names:?}"
    );
}

#[test]
fn stalled_runs_are_stopped_and_retried_and_activity_resets_the_clock() {
    let mut st = state("tracker:\n  kind: memory\nagents:\n  stall_timeout_ms: 1000");
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    let id = run_id(&st, "A-1");
    assert_eq!(st.next_deadline(), Some(T0 + 1000));
    handle(
        &mut st,
        T0 + 900,
        Event::Run {
            run_id: id.clone(),
            msg: RunMsg::Activity {
                event: "agent_message_chunk".into(),
                message: Some("hi".into()),
            },
        },
    );
    assert!(handle(&mut st, T0 + 1500, Event::Tick).is_empty());
    let fx = handle(&mut st, T0 + 1900, Event::Tick);
    assert!(
        matches!(
            &fx[..],
            [Effect::CancelRun {
                reason: StopReason::Stalled(1000),
                ..
            }]
        ),
        "{fx:?}"
    );
    assert!(
        handle(&mut st, T0 + 2500, Event::Tick).is_empty(),
        "cancelled once"
    );
    exit(
        &mut st,
        T0 + 2600,
        "A-1",
        RunEnd::Failed("cancelled".into()),
    );
    assert_eq!(st.history[0].outcome, Outcome::Stalled);
    assert_eq!(st.retries[&k("id-A-1")].attempt, 1);
}

#[test]
fn a_zero_stall_timeout_disables_stall_detection() {
    let mut st = state("tracker:\n  kind: memory\nagents:\n  stall_timeout_ms: 0");
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    let fx = handle(&mut st, T0 + 10_000_000, Event::Tick);
    assert!(fx.iter().all(|e| !matches!(e, Effect::CancelRun { .. })));
}

#[test]
fn run_messages_update_the_entry_and_usage_totals() {
    let mut st = state("tracker:\n  kind: memory");
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    let id = run_id(&st, "A-1");
    for msg in [
        RunMsg::Started { pid: Some(42) },
        RunMsg::Session {
            session_id: "s1-1".into(),
        },
        RunMsg::TurnStarted { turn: 1 },
        RunMsg::Usage(Usage {
            tokens: Tokens {
                input: 10,
                output: 5,
                total: 15,
            },
            cost_usd: Some(0.25),
            cost_other: None,
        }),
        RunMsg::Notice {
            event: "approval_auto_approved".into(),
            message: "Write NOTES.md".into(),
        },
    ] {
        handle(
            &mut st,
            T0 + 1,
            Event::Run {
                run_id: id.clone(),
                msg,
            },
        );
    }
    let r = &st.running[&k("id-A-1")];
    assert_eq!(
        (r.pid, r.session_id.as_deref(), r.turn_count, r.tokens.total),
        (Some(42), Some("s1-1"), 1, 15)
    );
    assert_eq!(r.cost_usd, Some(0.25), "the cost is known as usage arrives");
    assert_eq!(st.events[0].event, "approval_auto_approved");
    exit(&mut st, T0 + 2000, "A-1", RunEnd::Clean);
    assert_eq!(st.finished_tokens.total, 15);
    assert!((st.finished_seconds - 2.0).abs() < 1e-9);
    assert_eq!(st.history[0].run.cost_usd, Some(0.25));
    assert_eq!(st.counters.finished_cost_usd["agent_a"], 0.25);
}

#[test]
fn a_cost_in_another_currency_is_kept_on_the_run_and_left_out_of_usd_sums() {
    let mut st = state("tracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 5");
    dispatch(
        &mut st,
        T0,
        vec![issue("A-1", "Todo", &[]), issue("A-2", "Todo", &[])],
    );
    let eur = Usage {
        tokens: Tokens::default(),
        cost_usd: None,
        cost_other: Some(OtherCost {
            amount: 2.5,
            currency: "EUR".into(),
        }),
    };
    let usd = Usage {
        cost_usd: Some(0.1),
        ..Usage::default()
    };
    for (identifier, usage) in [("A-1", eur), ("A-2", usd)] {
        let run_id = run_id(&st, identifier);
        handle(
            &mut st,
            T0 + 1,
            Event::Run {
                run_id,
                msg: RunMsg::Usage(usage),
            },
        );
    }
    let r = &st.running[&k("id-A-1")];
    assert_eq!(r.cost_usd, None);
    assert_eq!(r.cost_other.as_ref().unwrap().currency, "EUR");
    exit(&mut st, T0 + 10, "A-1", RunEnd::Clean);
    exit(&mut st, T0 + 10, "A-2", RunEnd::Clean);
    assert_eq!(st.counters.finished_cost_usd.get("agent_a"), Some(&0.1));
    let record = st
        .history
        .iter()
        .find(|h| h.run.slot.issue.identifier == "A-1")
        .unwrap();
    assert_eq!(record.run.cost_other.as_ref().unwrap().amount, 2.5);
    // The record survives the claim store's JSON, and an old row without a cost reads back.
    let json = serde_json::to_string(record).unwrap();
    let back: RunRecord = serde_json::from_str(&json).unwrap();
    assert_eq!(back.run.cost_other, record.run.cost_other);
    let mut old: serde_json::Value = serde_json::from_str(&json).unwrap();
    old["run"].as_object_mut().unwrap().remove("cost_other");
    let old: RunRecord = serde_json::from_value(old).unwrap();
    assert_eq!((old.run.cost_usd, old.run.cost_other), (None, None));
}

#[test]
fn history_and_events_are_bounded_newest_first() {
    let mut st = state("tracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 100");
    let issues: Vec<Issue> = (0..60)
        .map(|n| issue(&format!("A-{n:02}"), "Todo", &[]))
        .collect();
    dispatch(&mut st, T0, issues);
    for n in 0..60 {
        exit(
            &mut st,
            T0 + n,
            &format!("A-{n:02}"),
            RunEnd::Failed("x".into()),
        );
    }
    assert_eq!(st.history.len(), HISTORY_LIMIT);
    assert_eq!(st.history[0].run.slot.issue.identifier, "A-59");
    assert_eq!(st.events.len(), EVENTS_LIMIT);
    assert_eq!(st.events[0].at, T0 + 59);
}

#[test]
fn reload_failures_are_recorded_and_settings_kept() {
    let mut st = state("tracker:\n  kind: memory\npolling:\n  interval_ms: 1234");
    handle(
        &mut st,
        T0,
        Event::ReloadFailed("W.md: polling.x is not supported".into()),
    );
    assert_eq!(st.events[0].event, "workflow_reload_failed");
    assert_eq!(st.settings.polling.interval_ms, 1234);
    handle(
        &mut st,
        T0,
        Event::Reloaded(Arc::new(settings(
            "tracker:\n  kind: memory\npolling:\n  interval_ms: 99",
        ))),
    );
    assert_eq!(st.settings.polling.interval_ms, 99);
}

#[test]
fn refresh_polls_now_unless_a_poll_is_in_flight() {
    let mut st = state("tracker:\n  kind: memory");
    dispatch(&mut st, T0, vec![]);
    let fx = handle(&mut st, T0 + 10, Event::Refresh);
    assert!(matches!(&fx[..], [Effect::Poll { .. }]), "{fx:?}");
    assert!(
        handle(&mut st, T0 + 11, Event::Refresh).is_empty(),
        "coalesced into the poll in flight"
    );
}

/// A live feed's wake during a poll is not lost: that poll may have read before the event, so
/// another follows it at once.
#[test]
fn a_wake_during_a_poll_polls_again_after_it() {
    let mut st = state("tracker:\n  kind: memory");
    dispatch(&mut st, T0, vec![]);
    let fx = handle(&mut st, T0 + 10, Event::Wake);
    assert!(matches!(&fx[..], [Effect::Poll { .. }]), "{fx:?}");
    assert!(handle(&mut st, T0 + 11, Event::Wake).is_empty());
    let fx = handle(
        &mut st,
        T0 + 12,
        Event::PollDone(poll_report(vec![], vec![], &[])),
    );
    let fx: Vec<Effect> = fx
        .into_iter()
        .chain(handle(&mut st, T0 + 13, Event::Tick))
        .collect();
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Poll { .. })),
        "the next poll at once: {fx:?}"
    );
}

/// Webhook deliveries bring at most one poll forward a polling interval: the others within it
/// are left to the next poll, due within the interval anyway (issue 40).
#[test]
fn webhook_wakes_bring_at_most_one_poll_forward_an_interval() {
    let mut st = state("tracker:\n  kind: memory\npolling:\n  interval_ms: 60000");
    dispatch(&mut st, T0, vec![]);
    let fx = handle(&mut st, T0 + 10, Event::WebhookWake);
    assert!(matches!(&fx[..], [Effect::Poll { .. }]), "{fx:?}");
    // During the poll, and after it, within the interval: nothing more.
    assert!(handle(&mut st, T0 + 11, Event::WebhookWake).is_empty());
    handle(
        &mut st,
        T0 + 12,
        Event::PollDone(poll_report(vec![], vec![], &[])),
    );
    for t in [T0 + 13, T0 + 30_000, T0 + 60_009] {
        let fx: Vec<Effect> = handle(&mut st, t, Event::WebhookWake)
            .into_iter()
            .chain(handle(&mut st, t, Event::Tick))
            .collect();
        assert!(
            !fx.iter().any(|e| matches!(e, Effect::Poll { .. })),
            "at {t}: {fx:?}"
        );
    }
    assert_eq!(st.next_poll_at, T0 + 12 + 60_000, "the interval's own poll");
    // A chat feed's wake is not rate-limited.
    let fx = handle(&mut st, T0 + 60_010, Event::Wake);
    assert!(matches!(&fx[..], [Effect::Poll { .. }]), "{fx:?}");
    handle(
        &mut st,
        T0 + 60_011,
        Event::PollDone(poll_report(vec![], vec![], &[])),
    );
    // An interval after the last one it brought forward, a delivery brings one forward again.
    let fx = handle(&mut st, T0 + 60_012, Event::WebhookWake);
    assert!(matches!(&fx[..], [Effect::Poll { .. }]), "{fx:?}");
}

#[test]
fn shutdown_cancels_every_run_and_exits_when_they_end() {
    let mut st = state("tracker:\n  kind: memory");
    dispatch(
        &mut st,
        T0,
        vec![issue("A-1", "Todo", &[]), issue("B-1", "Todo", &[])],
    );
    let fx = handle(&mut st, T0 + 5, Event::Shutdown);
    assert_eq!(
        fx.iter()
            .filter(|e| matches!(
                e,
                Effect::CancelRun {
                    reason: StopReason::Shutdown,
                    ..
                }
            ))
            .count(),
        2
    );
    assert!(exit(&mut st, T0 + 6, "A-1", RunEnd::Failed("cancelled".into())).is_empty());
    let fx = exit(&mut st, T0 + 7, "B-1", RunEnd::Clean);
    assert!(matches!(&fx[..], [Effect::Exit]), "{fx:?}");
    assert_eq!(
        st.history[0].outcome,
        Outcome::Success,
        "a clean end during shutdown is a success"
    );
    assert_eq!(st.history[1].outcome, Outcome::Failed);
    assert!(st.retries.is_empty(), "nothing is retried after shutdown");
    assert!(
        handle(&mut st, T0 + 100_000, Event::Tick).is_empty(),
        "no polls after shutdown"
    );
    let mut idle = state("tracker:\n  kind: memory");
    assert!(matches!(
        &handle(&mut idle, T0, Event::Shutdown)[..],
        [Effect::Exit]
    ));
}

pub(super) fn pool_view(slots: Option<u64>, capped: Option<&str>) -> Event {
    Event::Pool(PoolView {
        driver: "fake".into(),
        configured: true,
        status: crate::workers::pool::Status {
            slots,
            capped: capped.map(str::to_string),
            ..Default::default()
        },
    })
}

#[test]
fn the_worker_pool_room_bounds_dispatch_and_retries_keep_their_machine() {
    let mut st = state("tracker:\n  kind: memory");
    // The pool's first figures arrive with the first tick's poll under way.
    let fx = handle(&mut st, T0, pool_view(Some(1), None));
    assert!(fx.iter().any(|e| matches!(e, Effect::Poll { .. })));
    let fx = handle(
        &mut st,
        T0,
        Event::PollDone(poll_report(
            vec![issue("A-1", "Todo", &[]), issue("B-1", "Todo", &[])],
            vec![],
            &[],
        )),
    );
    assert_eq!(starts(&fx), [("A-1".into(), None)]);
    assert_eq!(st.blocked[0].reason.code(), "worker_host_capacity");
    assert_eq!(st.blocked[0].reason.label(), "worker host capacity");
    // The run reserves, then leases a machine; its retry carries the machine as affinity.
    let id = run_id(&st, "A-1");
    handle(
        &mut st,
        T0 + 1,
        Event::Run {
            run_id: id.clone(),
            msg: RunMsg::Reserving,
        },
    );
    assert!(st.running[&k("id-A-1")].reserving);
    handle(
        &mut st,
        T0 + 2,
        Event::Run {
            run_id: id,
            msg: RunMsg::Leased {
                worker_id: "w-3".into(),
                host: Some("fake://worker-w-3".into()),
                ssh: None,
            },
        },
    );
    let r = &st.running[&k("id-A-1")];
    assert!(!r.reserving && r.worker_host.as_deref() == Some("fake://worker-w-3"));
    // The pool grows (more room): the blocked issue starts without waiting for a poll.
    let fx = handle(&mut st, T0 + 3, pool_view(Some(2), None));
    assert_eq!(starts(&fx), [("B-1".into(), None)]);
    exit(&mut st, T0 + 4, "A-1", RunEnd::Failed("boom".into()));
    assert_eq!(
        st.retries[&k("id-A-1")].worker_host.as_deref(),
        Some("fake://worker-w-3")
    );
    // A capped pool blocks everything new, whatever its slots.
    handle(
        &mut st,
        T0 + 5,
        pool_view(Some(9), Some("spend.daily_worker_seconds reached")),
    );
    let fx = handle(
        &mut st,
        T0 + 20_000,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Todo", &[]))),
        },
    );
    assert!(starts(&fx).is_empty(), "{fx:?}");
    assert_eq!(st.retries[&k("id-A-1")].error.as_deref(), Some(NO_SLOTS));
    // Uncapped: the retry's run asks for its previous machine.
    handle(&mut st, T0 + 30_000, pool_view(Some(9), None));
    let fx = handle(
        &mut st,
        T0 + 40_000,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Todo", &[]))),
        },
    );
    let spec = fx
        .iter()
        .find_map(|e| match e {
            Effect::StartRun(s) => Some(s),
            _ => None,
        })
        .expect("the retry starts");
    assert_eq!(spec.affinity.as_deref(), Some("w-3"));
}

#[test]
fn a_reload_that_changes_a_restart_only_setting_says_so() {
    let mut st = state("tracker:\n  kind: memory\nserver:\n  mcp_port: 4041");
    let new = Arc::new(settings(
        "tracker:\n  kind: memory\nserver:\n  mcp_port: 4042",
    ));
    handle(&mut st, T0, Event::Reloaded(new));
    let e = &st.events[0];
    assert_eq!(e.event, "settings_need_restart");
    assert!(
        e.message.contains("server.mcp_port changed"),
        "{}",
        e.message
    );
    assert_eq!(st.settings.server.mcp_port, Some(4042));
    // The webhook listener's port and host are bound at start too.
    let new = Arc::new(settings(
        "tracker:\n  kind: memory\nserver:\n  mcp_port: 4042\n  webhook_port: 8089\n  webhook_host: 0.0.0.0",
    ));
    handle(&mut st, T0, Event::Reloaded(new));
    let said: Vec<&str> = st.events.iter().map(|e| e.message.as_str()).collect();
    for key in [
        "server.webhook_port changed (None -> Some(8089))",
        "server.webhook_host changed (127.0.0.1 -> 0.0.0.0)",
    ] {
        assert!(said.iter().any(|m| m.contains(key)), "{key}: {said:?}");
    }
}

pub(super) fn slots(fx: &[Effect]) -> Vec<(String, u32, u32, String)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::StartRun(s) => Some((
                s.slot.issue.identifier.clone(),
                s.slot.slot_index,
                s.slot.ensemble_size,
                s.slot
                    .workspace_path
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn an_ensemble_starts_a_run_per_slot_and_status_overrides_change_its_size() {
    let mut st = state(
        "tracker:\n  kind: memory\n  active_states: [Todo, Review]\nagent:\n  ensemble_size: 3\n  max_concurrent_agents: 4\nstatus_overrides:\n  Review:\n    agent:\n      ensemble_size: 1",
    );
    let fx = dispatch(
        &mut st,
        T0,
        vec![
            issue("A-1", "Todo", &[]),
            issue("B-1", "Review", &[]),
            issue("C-1", "Todo", &[]),
        ],
    );
    assert_eq!(
        slots(&fx),
        [
            ("A-1".into(), 0, 3, "A-1+0".into()),
            ("A-1".into(), 1, 3, "A-1+1".into()),
            ("A-1".into(), 2, 3, "A-1+2".into()),
            ("B-1".into(), 0, 1, "B-1".into()),
        ]
    );
    // Every slot counts against the caps: C-1 waits, once.
    assert_eq!(st.blocked.len(), 1);
    assert_eq!(st.blocked[0].issue.identifier, "C-1");
    // One slot fails: it alone is retried; the others run on.
    let run = st.running[&Key::new("id-A-1", 1)].run_id.clone();
    let fx = handle(
        &mut st,
        T0 + 5,
        Event::Run {
            run_id: run,
            msg: RunMsg::Exited(RunEnd::Failed("boom".into())),
        },
    );
    assert_eq!(st.retries[&Key::new("id-A-1", 1)].attempt, 1);
    assert_eq!(st.retries[&Key::new("id-A-1", 1)].slot.slot_index, 1);
    assert!(st.running.contains_key(&Key::new("id-A-1", 0)));
    // The freed slot goes to the next candidate's first slot (C-1), not to A-1 again.
    assert_eq!(slots(&fx), [("C-1".into(), 0, 3, "C-1+0".into())]);
    // The issue is done: every slot of it stops.
    handle(&mut st, T0 + 30_000, Event::Tick);
    let fx = handle(
        &mut st,
        T0 + 30_000,
        Event::PollDone(poll_report(
            vec![],
            vec![
                issue("A-1", "Done", &[]),
                issue("B-1", "Review", &[]),
                issue("C-1", "Todo", &[]),
            ],
            &["id-A-1", "id-B-1", "id-C-1"],
        )),
    );
    let cancels = fx
        .iter()
        .filter(|e| {
            matches!(
                e,
                Effect::CancelRun {
                    reason: StopReason::Terminal,
                    ..
                }
            )
        })
        .count();
    assert_eq!(cancels, 2, "{fx:?}");
}

/// Slots another daemon (`other`) holds.
pub(super) fn held(keys: &[Key]) -> BTreeMap<Key, Holder> {
    keys.iter()
        .map(|k| {
            let holder = Holder {
                owner: "other".into(),
                identifier: k.issue_id.trim_start_matches("id-").into(),
            };
            (k.clone(), holder)
        })
        .collect()
}

#[test]
fn slots_another_daemon_holds_are_never_dispatched_and_a_run_whose_claim_went_elsewhere_stops() {
    let mut st = state("tracker:\n  kind: memory");
    handle(
        &mut st,
        T0,
        Event::Swept(Box::new(Swept {
            foreign: held(&[k("id-A-1")]),
            taken_over: vec![],
            ..Swept::default()
        })),
    );
    // That first event also started the first poll; its answer is dispatched.
    let fx = handle(
        &mut st,
        T0,
        Event::PollDone(poll_report(
            vec![issue("A-1", "Todo", &[]), issue("B-1", "Todo", &[])],
            vec![],
            &[],
        )),
    );
    assert_eq!(starts(&fx), [("B-1".to_string(), None)]);
    // B-1's run is refused by the store: no history, no retry, the slot is another's.
    let run = run_id(&st, "B-1");
    handle(
        &mut st,
        T0 + 1,
        Event::Run {
            run_id: run,
            msg: RunMsg::Exited(RunEnd::HeldElsewhere("daemon x holds this slot".into())),
        },
    );
    assert!(st.running.is_empty() && st.retries.is_empty() && st.history.is_empty());
    assert!(st.foreign.contains_key(&k("id-B-1")));
    assert_eq!(st.foreign[&k("id-B-1")].owner, "x");
    // The other daemon let A-1 go and died holding C-1's run: taken over as a retry, and A-1
    // is dispatched at once.
    let retry = Retry {
        slot: Slot {
            issue: issue("C-1", "Todo", &[]),
            slot_index: 0,
            ensemble_size: 1,
            workspace_path: "/w/C-1".into(),
        },
        attempt: 2,
        due_at: T0 + 2_000,
        error: Some("taken over".into()),
        kind: RetryKind::Failure,
        fetching: false,
        worker_id: None,
        worker_host: None,
        ssh: None,
        claim_token: None,
        previous: None,
    };
    let fx = handle(
        &mut st,
        T0 + 2,
        Event::Swept(Box::new(Swept {
            foreign: held(&[k("id-B-1")]),
            taken_over: vec![(k("id-C-1"), retry)],
            ..Swept::default()
        })),
    );
    assert_eq!(starts(&fx), [("A-1".to_string(), None)]);
    assert_eq!(st.retries[&k("id-C-1")].attempt, 2);
    // A sweep that finds A-1 another's before its run claimed the slot leaves it to the claim.
    let swept = |st: &mut State, at: Millis| {
        handle(
            st,
            at,
            Event::Swept(Box::new(Swept {
                foreign: held(&[k("id-A-1"), k("id-B-1")]),
                taken_over: vec![],
                ..Swept::default()
            })),
        )
    };
    let fx = swept(&mut st, T0 + 3);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::CancelRun { .. })),
        "{fx:?}"
    );
    // Once it holds its claim, a sweep that finds the slot another's (ours expired) stops it.
    let run_id = run_id(&st, "A-1");
    handle(
        &mut st,
        T0 + 3,
        Event::Run {
            run_id,
            msg: RunMsg::Claimed { token: 7 },
        },
    );
    let fx = handle(
        &mut st,
        T0 + 3,
        Event::Swept(Box::new(Swept {
            foreign: held(&[k("id-A-1"), k("id-B-1")]),
            taken_over: vec![],
            ..Swept::default()
        })),
    );
    assert!(
        matches!(
            &fx[..],
            [Effect::CancelRun {
                reason: StopReason::Inactive(_),
                ..
            }]
        ),
        "{fx:?}"
    );
}
