//! Dependencies with a fake clock: an issue of the unstarted type waits while one of its
//! blockers is not terminal; started and running issues never wait; cycles hold every member
//! and are reported once per episode.

use super::*;
use crate::orchestrator::protocol::*;
use crate::orchestrator::testutil::{issue, settings};
use crate::tracker::Blocker;

const T0: Millis = 1_000_000;

fn state(yaml: &str) -> State {
    State::new(Arc::new(settings(yaml)), T0)
}

fn blocked(identifier: &str, state: &str, by: &[(&str, &str)]) -> Issue {
    let mut i = issue(identifier, state, &[]);
    i.blocked_by = by
        .iter()
        .map(|(b, s)| Blocker {
            id: format!("id-{b}"),
            identifier: b.to_string(),
            state: s.to_string(),
        })
        .collect();
    i
}

/// Polls (the first tick, or the next poll when due) and answers with `candidates`.
fn poll(st: &mut State, now: Millis, candidates: Vec<Issue>, refreshed: Vec<Issue>) -> Vec<Effect> {
    let now = now.max(st.next_poll_at);
    let fx = handle(st, now, Event::Tick);
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Poll { .. })),
        "{fx:?}"
    );
    let requested = refreshed.iter().map(|i| i.id.clone()).collect();
    handle(
        st,
        now,
        Event::PollDone(PollReport {
            candidates: Ok(candidates),
            refreshed: Ok(refreshed),
            requested,
            terminal: None,
            rate_limits: None,
            duration_ms: 0,
            read_at: 0,
        }),
    )
}

fn starts(fx: &[Effect]) -> Vec<String> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::StartRun(s) => Some(s.slot.issue.identifier.clone()),
            _ => None,
        })
        .collect()
}

fn cancels(fx: &[Effect]) -> usize {
    fx.iter()
        .filter(|e| matches!(e, Effect::CancelRun { .. }))
        .count()
}

/// Waiting issues with their open blockers as `ID (State)`, and whether they are in a cycle.
fn waiting(st: &State) -> Vec<(String, Vec<String>, bool)> {
    st.waiting
        .iter()
        .map(|w| {
            (
                w.issue.identifier.clone(),
                w.blockers
                    .iter()
                    .map(|b| format!("{} ({})", b.identifier, b.state))
                    .collect(),
                w.cycle,
            )
        })
        .collect()
}

fn cycle_events(st: &State) -> Vec<String> {
    st.events
        .iter()
        .filter(|e| e.event == "blocker_cycle")
        .map(|e| e.message.clone())
        .collect()
}

#[test]
fn an_unstarted_issue_waits_until_its_last_blocker_is_terminal() {
    let mut st = state("tracker:\n  kind: memory\npolling:\n  interval_ms: 1000");
    // A-2 is reported Todo with A-1, but as a candidate of this poll it is In Progress.
    let fx = poll(
        &mut st,
        T0,
        vec![
            blocked(
                "A-1",
                "Todo",
                &[("X-9", "In Progress"), ("A-2", "Todo"), ("X-8", "Done")],
            ),
            issue("A-2", "In Progress", &[]),
        ],
        vec![],
    );
    assert_eq!(starts(&fx), ["A-2"]);
    assert_eq!(
        waiting(&st),
        [(
            "A-1".into(),
            vec!["X-9 (In Progress)".into(), "A-2 (In Progress)".into()],
            false
        )],
        "only the open blockers, each in its current state"
    );
    assert!(st.blocked.is_empty(), "waiting is not a capacity block");
    // The candidate's current state wins over the one reported with the dependent issue.
    let fx = poll(
        &mut st,
        T0 + 1000,
        vec![
            blocked("B-1", "Todo", &[("B-2", "Done")]),
            issue("B-2", "Todo", &[]),
            blocked("A-1", "Todo", &[("X-9", "Done"), ("A-2", "In Progress")]),
            issue("A-2", "In Progress", &[]),
        ],
        vec![],
    );
    assert_eq!(starts(&fx), ["B-2"]);
    let w = waiting(&st);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w.contains(&("B-1".into(), vec!["B-2 (Todo)".into()], false)));
    // The last blockers turn terminal: both start at this poll.
    let fx = poll(
        &mut st,
        T0 + 2000,
        vec![
            blocked("B-1", "Todo", &[("B-2", "Done")]),
            blocked("A-1", "Todo", &[("X-9", "Done"), ("A-2", "Cancelled")]),
        ],
        vec![],
    );
    assert_eq!(starts(&fx), ["A-1", "B-1"]);
    assert!(st.waiting.is_empty());
}

#[test]
fn waiting_issues_take_no_slot_and_the_state_type_decides_who_waits() {
    let mut st = state("tracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 1");
    let mut started_type = blocked("S-1", "Todo", &[("X-1", "Todo")]);
    started_type.state_type = Some("started".into());
    let mut first = blocked("W-1", "Todo", &[("X-1", "Todo")]);
    first.priority = Some(1);
    let fx = poll(
        &mut st,
        T0,
        vec![
            first,
            // In Progress is of the started type: its blockers do not hold it.
            blocked("P-1", "In Progress", &[("X-1", "Todo")]),
            started_type,
            issue("Q-1", "Todo", &[]),
        ],
        vec![],
    );
    assert_eq!(starts(&fx), ["P-1"], "the waiting W-1 took no slot");
    let blocked: Vec<&str> = st
        .blocked
        .iter()
        .map(|b| b.issue.identifier.as_str())
        .collect();
    assert_eq!(
        blocked,
        ["Q-1", "S-1"],
        "a tracker's started type is not held either"
    );
    assert_eq!(waiting(&st).len(), 1);
    assert_eq!(waiting(&st)[0].0, "W-1");
}

#[test]
fn running_issues_are_not_stopped_by_a_new_blocker_and_svc_continues_them() {
    let mut st = state("tracker:\n  kind: memory\npolling:\n  interval_ms: 1000");
    let fx = poll(&mut st, T0, vec![issue("R-1", "Todo", &[])], vec![]);
    assert_eq!(starts(&fx), ["R-1"]);
    let now_blocked = blocked("R-1", "Todo", &[("X-1", "In Progress")]);
    let fx = poll(
        &mut st,
        T0 + 1000,
        vec![now_blocked.clone()],
        vec![now_blocked.clone()],
    );
    assert_eq!(cancels(&fx), 0, "{fx:?}");
    assert!(st.waiting.is_empty(), "a running issue does not wait");
    // Its run ends cleanly: the continuation svc owes it runs despite the blocker.
    let run_id = st.running.values().next().unwrap().run_id.clone();
    handle(
        &mut st,
        T0 + 1100,
        Event::Run {
            run_id,
            msg: RunMsg::Exited(RunEnd::Clean),
        },
    );
    let key = Key::new("id-R-1", 0);
    assert!(st.retries.contains_key(&key));
    let fx = handle(&mut st, T0 + 1100 + CONTINUATION_DELAY_MS, Event::Tick);
    assert!(fx.iter().any(|e| matches!(e, Effect::FetchForRetry { .. })));
    let fx = handle(
        &mut st,
        T0 + 1100 + CONTINUATION_DELAY_MS,
        Event::RetryFetched {
            key,
            result: Ok(Some(now_blocked)),
        },
    );
    assert_eq!(starts(&fx), ["R-1"]);
}

#[test]
fn a_cycle_holds_every_member_and_is_reported_once_per_episode() {
    let mut st = state("tracker:\n  kind: memory\npolling:\n  interval_ms: 1000");
    let cycle = || {
        vec![
            blocked("C-1", "Todo", &[("C-2", "Todo")]),
            blocked("C-2", "Todo", &[("C-3", "Todo")]),
            blocked("C-3", "Todo", &[("C-1", "Todo")]),
            blocked("D-1", "Todo", &[("C-1", "Todo")]),
            blocked("E-1", "Todo", &[("E-1", "Todo")]),
        ]
    };
    let fx = poll(&mut st, T0, cycle(), vec![]);
    assert!(starts(&fx).is_empty(), "{fx:?}");
    let w = waiting(&st);
    let in_cycle: Vec<&str> = w.iter().filter(|w| w.2).map(|w| w.0.as_str()).collect();
    assert_eq!(in_cycle, ["C-1", "C-2", "C-3", "E-1"], "{w:?}");
    assert!(
        w.iter().any(|w| w.0 == "D-1" && !w.2),
        "D-1 waits on the cycle, outside it"
    );
    let events = cycle_events(&st);
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events.iter().any(|m| m.contains("C-1, C-2, C-3")),
        "{events:?}"
    );
    assert!(events.iter().any(|m| m.contains("E-1")), "{events:?}");
    for n in 1..4 {
        poll(&mut st, T0 + n * 1000, cycle(), vec![]);
    }
    assert_eq!(
        cycle_events(&st).len(),
        2,
        "reported once, not at every poll"
    );
    // Someone removes a relation: the cycle opens and C-3 runs; C-1 waits for C-2 now.
    let mut open = cycle();
    open[2].blocked_by.clear();
    let fx = poll(&mut st, T0 + 5000, open, vec![]);
    assert_eq!(starts(&fx), ["C-3"]);
    assert_eq!(cycle_events(&st).len(), 2);
    assert!(waiting(&st).iter().all(|w| w.0 == "E-1" || !w.2));
    // A cycle that forms again is a new episode.
    let fx = poll(&mut st, T0 + 6000, cycle()[..2].to_vec(), vec![]);
    assert!(starts(&fx).is_empty());
    let mut again = cycle()[..2].to_vec();
    again[1].blocked_by[0].identifier = "C-1".into();
    again[1].blocked_by[0].id = "id-C-1".into();
    poll(&mut st, T0 + 7000, again, vec![]);
    assert_eq!(cycle_events(&st).len(), 3, "{:?}", cycle_events(&st));
}

#[test]
fn a_dry_run_says_what_an_issue_waits_for() {
    let mut st = state("tracker:\n  kind: memory");
    st.mode.dry_run = true;
    let fx = poll(
        &mut st,
        T0,
        vec![
            blocked(
                "W-1",
                "Todo",
                &[("ENG-2", "In Progress"), ("ENG-3", "Done")],
            ),
            blocked(
                "W-2",
                "Todo",
                &[("ENG-2", "In Progress"), ("ENG-4", "Todo")],
            ),
            blocked("C-1", "Todo", &[("C-1", "Todo")]),
            issue("F-1", "Todo", &[]),
        ],
        vec![],
    );
    let verdicts: Vec<(String, String)> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::DryRun(d) => Some(d.clone()),
            _ => None,
        })
        .flatten()
        .map(|d| (d.identifier, d.verdict))
        .collect();
    assert_eq!(
        verdicts,
        [
            (
                "C-1".into(),
                "skip: blocked by C-1 (Todo); a cycle of blockers".into()
            ),
            ("F-1".into(), "dispatch -> agent_a".into()),
            ("W-1".into(), "skip: blocked by ENG-2 (In Progress)".into()),
            (
                "W-2".into(),
                "skip: blocked by ENG-2 (In Progress), ENG-4 (Todo)".into()
            ),
        ]
    );
    assert!(starts(&fx).is_empty());
}

#[test]
fn shutdown_forgets_waiting_issues() {
    let mut st = state("tracker:\n  kind: memory");
    poll(
        &mut st,
        T0,
        vec![blocked("W-1", "Todo", &[("X-1", "Todo")])],
        vec![],
    );
    assert_eq!(st.waiting.len(), 1);
    handle(&mut st, T0 + 1, Event::Shutdown);
    assert!(st.waiting.is_empty());
}
