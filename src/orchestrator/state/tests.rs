//! State-machine tests with a fake clock: every transition, no sleeps.

use super::*;
use crate::orchestrator::protocol::*;
use crate::orchestrator::testutil::{issue, settings};

const T0: Millis = 1_000_000;

/// The key of an issue's first (or only) slot.
fn k(id: &str) -> Key {
    Key::new(id, 0)
}

fn state(yaml: &str) -> State {
    State::new(Arc::new(settings(yaml)), T0)
}

fn poll_report(candidates: Vec<Issue>, refreshed: Vec<Issue>, requested: &[&str]) -> PollReport {
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

fn starts(fx: &[Effect]) -> Vec<(String, Option<u32>)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::StartRun(s) => Some((s.issue.identifier.clone(), s.attempt)),
            _ => None,
        })
        .collect()
}

fn run_id(st: &State, identifier: &str) -> String {
    st.running
        .values()
        .find(|r| r.issue.identifier == identifier)
        .unwrap()
        .run_id
        .clone()
}

fn exit(st: &mut State, now: Millis, identifier: &str, end: RunEnd) -> Vec<Effect> {
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
fn dispatch(st: &mut State, now: Millis, candidates: Vec<Issue>) -> Vec<Effect> {
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
        .find(|h| h.run.issue.identifier == "A-1")
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
    assert_eq!(st.history[0].run.issue.identifier, "A-59");
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

fn pool_view(slots: Option<u64>, capped: Option<&str>) -> Event {
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

fn slots(fx: &[Effect]) -> Vec<(String, u32, u32, String)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::StartRun(s) => Some((
                s.issue.identifier.clone(),
                s.slot_index,
                s.ensemble_size,
                s.workspace_path
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
    assert_eq!(st.retries[&Key::new("id-A-1", 1)].slot_index, 1);
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
fn held(keys: &[Key]) -> BTreeMap<Key, Holder> {
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
        Event::Claims(Box::new(Swept {
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
        issue: issue("C-1", "Todo", &[]),
        slot_index: 0,
        ensemble_size: 1,
        attempt: 2,
        due_at: T0 + 2_000,
        error: Some("taken over".into()),
        kind: RetryKind::Failure,
        workspace_path: "/w/C-1".into(),
        fetching: false,
        worker_id: None,
        worker_host: None,
        ssh: None,
        claim_token: None,
    };
    let fx = handle(
        &mut st,
        T0 + 2,
        Event::Claims(Box::new(Swept {
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
            Event::Claims(Box::new(Swept {
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
        Event::Claims(Box::new(Swept {
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

/// A held message (a source sent the issue back to work, GitHub's rework) waits for an issue
/// svc does not know yet, and the run that picks the issue up has it in its first prompt; an
/// ordinary message for an unknown issue is ignored, and taken when it comes again held.
#[test]
fn a_held_message_waits_for_the_next_run_of_an_issue_not_yet_known() {
    let mut st = state("tracker:\n  kind: memory\n");
    dispatch(&mut st, T0, vec![]);
    let msg = |key: &str| crate::steering::Message {
        issue_id: "id-R-1".into(),
        source: crate::steering::Source::Github,
        author: "alice".into(),
        text: format!("fix it ({key})"),
        at: "2026-11-25T10:00:00Z".into(),
        key: key.into(),
    };
    handle(
        &mut st,
        T0,
        Event::Steer {
            messages: vec![msg("plain")],
            cursor: None,
            ignored: Vec::new(),
            held: vec![msg("review-1")],
        },
    );
    assert_eq!(st.steering.waiting_for("id-R-1"), 1);
    // Offered again while it is in its source's window, it is said ignored once.
    handle(
        &mut st,
        T0,
        Event::Steer {
            messages: vec![msg("plain")],
            cursor: None,
            ignored: Vec::new(),
            held: Vec::new(),
        },
    );
    let ignored = st
        .events
        .iter()
        .filter(|e| e.event == "steering_ignored")
        .count();
    assert_eq!(ignored, 1);
    // The ignored message was not taken, so it is taken when a later read holds it (its run
    // was stopping when it was first read); the held one is not taken twice.
    handle(
        &mut st,
        T0 + 1,
        Event::Steer {
            messages: Vec::new(),
            cursor: None,
            ignored: Vec::new(),
            held: vec![msg("plain"), msg("review-1")],
        },
    );
    assert_eq!(st.steering.waiting_for("id-R-1"), 2);
    let fx = dispatch(&mut st, T0 + 120_000, vec![issue("R-1", "Todo", &[])]);
    let spec = fx
        .iter()
        .find_map(|e| match e {
            Effect::StartRun(s) => Some(s),
            _ => None,
        })
        .expect("R-1 starts");
    let keys: Vec<&str> = spec.steering.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(keys, ["review-1", "plain"]);
}

#[test]
fn a_canceled_issue_stops_is_not_retried_and_waits_for_its_state_to_change() {
    let mut st = state("tracker:\n  kind: memory");
    let a = issue("A-1", "Todo", &[]);
    let b = issue("B-1", "Todo", &[]);
    dispatch(&mut st, T0, vec![a.clone(), b.clone()]);
    // B-1 fails and waits for its retry.
    exit(&mut st, T0 + 5, "B-1", RunEnd::Failed("boom".into()));
    assert!(st.retries.contains_key(&k("id-B-1")));
    let fx = handle(
        &mut st,
        T0 + 10,
        Event::Cancel {
            issue_id: "id-A-1".into(),
        },
    );
    assert!(
        matches!(
            &fx[..],
            [Effect::CancelRun {
                reason: StopReason::Canceled,
                ..
            }]
        ),
        "{fx:?}"
    );
    handle(
        &mut st,
        T0 + 11,
        Event::Cancel {
            issue_id: "id-B-1".into(),
        },
    );
    assert!(st.retries.is_empty(), "the retry is dropped");
    // The run ends as the cancel makes it end: canceled, no retry, no new run.
    let fx = exit(&mut st, T0 + 20, "A-1", RunEnd::Failed("canceled".into()));
    assert!(starts(&fx).is_empty(), "{fx:?}");
    // The spec's `canceled` outcome is never recorded: a failure saying so.
    assert_eq!(st.history[0].outcome, Outcome::Failed);
    assert_eq!(
        st.history[0].failure_reason.as_deref(),
        Some("canceled by the operator")
    );
    assert!(st.retries.is_empty());
    // Still Todo at the next poll: held back.
    st.next_poll_at = T0 + 30;
    handle(&mut st, T0 + 30, Event::Tick);
    let fx = handle(
        &mut st,
        T0 + 31,
        Event::PollDone(poll_report(vec![a.clone(), b.clone()], vec![], &[])),
    );
    assert!(starts(&fx).is_empty(), "{fx:?}");
    // A-1 moved (In Progress): dispatched again; B-1 stays held.
    st.next_poll_at = T0 + 40;
    handle(&mut st, T0 + 40, Event::Tick);
    let moved = issue("A-1", "In Progress", &[]);
    let fx = handle(
        &mut st,
        T0 + 41,
        Event::PollDone(poll_report(vec![moved, b], vec![], &[])),
    );
    assert_eq!(starts(&fx), vec![("A-1".to_string(), None)]);
    assert_eq!(st.canceled.len(), 1);
    assert!(st.events.iter().any(|e| e.event == "operator_canceled"));
    assert!(st.events.iter().any(|e| e.event == "run_canceled"));
}

fn steer_msg(
    issue_id: &str,
    source: crate::steering::Source,
    key: &str,
) -> crate::steering::Message {
    crate::steering::Message {
        issue_id: issue_id.into(),
        source,
        author: "alice".into(),
        text: format!("note {key}"),
        at: "2026-11-25T10:00:00Z".into(),
        key: key.into(),
    }
}

/// Messages a source holds for the next run of their issue.
fn hold(st: &mut State, now: Millis, held: Vec<crate::steering::Message>) {
    handle(
        st,
        now,
        Event::Steer {
            messages: Vec::new(),
            cursor: None,
            ignored: Vec::new(),
            held,
        },
    );
}

fn ignored_events(st: &State) -> Vec<String> {
    st.events
        .iter()
        .filter(|e| e.event == "steering_ignored")
        .map(|e| e.message.clone())
        .collect()
}

/// Feedback held for a parked issue is not kept for ever: the next poll refreshes the issue,
/// and once it is closed (or gone) its messages are let go, each said ignored with why.
#[test]
fn messages_waiting_for_a_closed_issue_are_let_go_and_said() {
    let mut st = state("tracker:\n  kind: memory\n");
    dispatch(&mut st, T0, vec![]);
    let held = vec![steer_msg("id-P-1", crate::steering::Source::Github, "r1")];
    hold(&mut st, T0, held);
    assert_eq!(st.steering.waiting_for("id-P-1"), 1);
    let version = st.steering.version();
    // The next poll asks for the parked issue; it is still parked: the message stays.
    let fx = handle(&mut st, T0 + 60_000, Event::Tick);
    let ids = fx
        .iter()
        .find_map(|e| match e {
            Effect::Poll { ids, .. } => Some(ids.clone()),
            _ => None,
        })
        .expect("a poll");
    assert_eq!(ids, ["id-P-1".to_string()]);
    let parked = issue("P-1", "Human Review", &[]);
    handle(
        &mut st,
        T0 + 60_000,
        Event::PollDone(poll_report(vec![], vec![parked], &["id-P-1"])),
    );
    assert_eq!(st.steering.waiting_for("id-P-1"), 1);
    // Closed: let go, said, and persisted (the version moved).
    handle(&mut st, T0 + 120_000, Event::Tick);
    let done = issue("P-1", "Done", &[]);
    handle(
        &mut st,
        T0 + 120_000,
        Event::PollDone(poll_report(vec![], vec![done], &["id-P-1"])),
    );
    assert_eq!(st.steering.waiting_for("id-P-1"), 0);
    assert!(st.steering.version() > version);
    let said = ignored_events(&st);
    assert!(said.iter().any(|m| m.contains("P-1 is Done")), "{said:?}");
}

/// Feedback read by a steering read whose candidate read saw its issue at work, arriving after
/// the issue's run ended and its continuation was let go, waits for the issue's next run: the
/// next poll decides (here the issue is done: let go, and said). Once a candidate read began
/// after the run ended, a message for the issue is for no run.
#[test]
fn feedback_for_an_issue_whose_run_just_ended_waits_for_the_next_read() {
    let mut st = state("tracker:\n  kind: memory\n");
    dispatch(&mut st, T0, vec![issue("A-1", "Todo", &[])]);
    // The next poll's candidate read no longer lists it (its agent moved it to review).
    handle(&mut st, T0 + 30_000, Event::Tick);
    handle(
        &mut st,
        T0 + 30_000,
        Event::PollDone(poll_report(vec![], vec![], &[])),
    );
    exit(&mut st, T0 + 31_000, "A-1", RunEnd::Clean);
    handle(&mut st, T0 + 32_000, Event::Tick);
    handle(
        &mut st,
        T0 + 32_000,
        Event::RetryFetched {
            key: k("id-A-1"),
            result: Ok(Some(issue("A-1", "Human Review", &[]))),
        },
    );
    assert!(st.retries.is_empty());
    let steer = |st: &mut State, now: Millis, key: &str| {
        handle(
            st,
            now,
            Event::Steer {
                messages: vec![steer_msg("id-A-1", crate::steering::Source::Gitlab, key)],
                cursor: None,
                ignored: Vec::new(),
                held: Vec::new(),
            },
        );
    };
    steer(&mut st, T0 + 33_000, "r1");
    assert_eq!(
        st.steering.waiting_for("id-A-1"),
        1,
        "{:?}",
        ignored_events(&st)
    );
    assert!(ignored_events(&st).is_empty());
    // The next poll refreshes it: done, so the message is let go, said with why.
    let fx = handle(&mut st, T0 + 60_000, Event::Tick);
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Poll { ids, .. } if ids.contains(&"id-A-1".to_string()))),
        "{fx:?}"
    );
    handle(
        &mut st,
        T0 + 60_000,
        Event::PollDone(poll_report(
            vec![],
            vec![issue("A-1", "Done", &[])],
            &["id-A-1"],
        )),
    );
    assert_eq!(st.steering.waiting_for("id-A-1"), 0);
    let said = ignored_events(&st);
    assert!(said.iter().any(|m| m.contains("A-1 is Done")), "{said:?}");
    // A read that began after the run ended decided: a later message is for no run.
    steer(&mut st, T0 + 61_000, "r2");
    assert_eq!(st.steering.waiting_for("id-A-1"), 0);
    assert!(
        ignored_events(&st)
            .iter()
            .any(|m| m.contains("neither running nor waiting")),
        "{:?}",
        ignored_events(&st)
    );
}

/// A run that loses the claim race hands back what waited for it; a full queue says what it
/// lets go; a change of tracker keeps the operator's messages (API and TUI alike).
#[test]
fn waiting_messages_survive_a_lost_claim_and_none_goes_unsaid() {
    use crate::steering::{QUEUE_MAX, Source};
    let mut st = state("tracker:\n  kind: memory\n");
    dispatch(&mut st, T0, vec![]);
    let mut batch = vec![steer_msg("id-R-1", Source::Tui, "tui-1")];
    batch.extend((0..QUEUE_MAX).map(|n| steer_msg("id-R-1", Source::Local, &format!("b{n}"))));
    hold(&mut st, T0, batch);
    assert_eq!(st.steering.waiting_for("id-R-1"), QUEUE_MAX);
    let said = ignored_events(&st);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("more than 64 messages waited"), "{said:?}");
    // The run that takes them loses the claim: they wait again.
    dispatch(&mut st, T0 + 60_000, vec![issue("R-1", "Todo", &[])]);
    assert_eq!(st.steering.waiting_for("id-R-1"), 0);
    exit(
        &mut st,
        T0 + 60_001,
        "R-1",
        RunEnd::HeldElsewhere("another daemon holds it".into()),
    );
    assert_eq!(st.steering.waiting_for("id-R-1"), QUEUE_MAX);
    // A change of tracker keeps the operator's own messages, whichever way they came.
    let mut st = state("tracker:\n  kind: memory\n");
    dispatch(&mut st, T0, vec![]);
    let held = vec![
        steer_msg("id-R-2", Source::Tui, "t"),
        steer_msg("id-R-2", Source::Api, "a"),
        steer_msg("id-R-2", Source::Local, "l"),
    ];
    hold(&mut st, T0, held);
    handle(
        &mut st,
        T0,
        Event::Reloaded(Arc::new(settings("tracker:\n  kind: local\n  path: /b\n"))),
    );
    assert_eq!(st.steering.waiting_for("id-R-2"), 2);
    let said = ignored_events(&st);
    assert!(
        said.iter().any(|m| m.contains("the tracker changed")),
        "{said:?}"
    );
}

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
