//! State-machine tests of steering: messages held, waiting, let go and said.

use super::tests::*;
use super::*;
use crate::orchestrator::protocol::*;
use crate::orchestrator::testutil::{issue, settings};

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

pub(super) fn steer_msg(
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
pub(super) fn hold(st: &mut State, now: Millis, held: Vec<crate::steering::Message>) {
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

pub(super) fn ignored_events(st: &State) -> Vec<String> {
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
