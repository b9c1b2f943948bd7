//! The snapshot's payloads beyond the spec: agent cooldowns and the blocked entries that wait
//! for one.

use std::sync::Arc;

use super::*;
use crate::orchestrator::protocol::{Cooldown, Event as E};
use crate::orchestrator::state::handle;
use crate::orchestrator::testutil::{daemon_info, issue, poll_done, settings};

const RESET: Millis = crate::orchestrator::testutil::RATE_LIMIT_RESET;

fn limited() -> State {
    crate::orchestrator::testutil::rate_limited("You've hit your limit · resets 8:30am")
}

#[test]
fn a_cooling_kind_is_listed_and_the_issues_waiting_for_it_name_it_and_its_reset() {
    let st = limited();
    let snap = build(&st, &daemon_info(), 1_002_000, None);
    let v: serde_json::Value = serde_json::from_str(&snap.state_json).unwrap();
    assert_eq!(
        v["cooldowns"],
        serde_json::json!([{
            "agent_kind": "agent_a",
            "until": rfc3339(RESET),
            "since": rfc3339(1_000_500),
            "reason": "You've hit your limit · resets 8:30am",
            "scope": "fleet",
        }]),
        "{v:#}"
    );
    let blocked = &v["blocked"][0];
    assert_eq!(blocked["issue_identifier"], "T-1", "{v:#}");
    assert_eq!(blocked["reason"], "agent_rate_limited");
    assert_eq!(blocked["label"], "agent rate limited");
    assert_eq!(blocked["agent_kind"], "agent_a");
    assert_eq!(blocked["reset_at"], rfc3339(RESET));
    assert_eq!(v["blocked_by_reason"]["agent_rate_limited"], 1);
    assert_eq!(v["retrying"][0]["issue_identifier"], "T-0");
    let ended = snap
        .runs
        .iter()
        .find(|r| r.issue_identifier == "T-0")
        .unwrap();
    assert_eq!(ended.outcome, "rate_limited");
}

/// A capacity block carries neither field: payloads without limits are as they were.
#[test]
fn other_blocked_entries_have_no_agent_kind_or_reset() {
    let mut st = State::new(
        Arc::new(settings(
            "tracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 1",
        )),
        1_000_000,
    );
    handle(&mut st, 1_000_000, E::Tick);
    handle(
        &mut st,
        1_000_001,
        poll_done(vec![issue("T-0", "Todo", &[]), issue("T-1", "Todo", &[])]),
    );
    let snap = build(&st, &daemon_info(), 1_002_000, None);
    let v: serde_json::Value = serde_json::from_str(&snap.state_json).unwrap();
    let blocked = v["blocked"][0].as_object().expect("T-1 is blocked");
    assert_eq!(blocked["reason"], "global_concurrency_cap");
    assert!(!blocked.contains_key("agent_kind"), "{blocked:?}");
    assert!(!blocked.contains_key("reset_at"), "{blocked:?}");
    assert_eq!(v["cooldowns"], serde_json::json!([]));
}

/// A cooldown is content: listed once it begins, but the clock alone does not move the
/// fingerprint while it lasts (its times are fixed), and its end does.
#[test]
fn a_cooldown_changes_the_fingerprint_when_it_begins_and_ends_not_as_it_runs() {
    let mut st = limited();
    let at = |st: &State, now| build(st, &daemon_info(), now, None).fingerprint;
    assert_eq!(at(&st, 1_002_000), at(&st, 1_500_000));
    let cooling = at(&st, 1_500_000);
    st.cooldowns.clear();
    assert_ne!(at(&st, 1_500_000), cooling);
}

/// Several workflows: each cooldown names its workflow, the list is sorted by kind then
/// workflow, and one workflow's view keeps its own.
#[test]
fn cooldowns_of_several_workflows_carry_their_workflow() {
    let cooldown = |kind: &str, until| Cooldown {
        kind: kind.into(),
        until,
        since: 1_000_000,
        reason: "429".into(),
        scope: "host".into(),
    };
    let mut alpha = State::new(Arc::new(settings("tracker:\n  kind: memory")), 1_000_000);
    alpha.workflow = Some("alpha".into());
    alpha.cooldowns.insert("y".into(), cooldown("y", 1_500_000));
    let mut beta = State::new(Arc::new(settings("tracker:\n  kind: memory")), 1_000_000);
    beta.workflow = Some("beta".into());
    beta.cooldowns.insert("x".into(), cooldown("x", 1_600_000));
    beta.cooldowns.insert("y".into(), cooldown("y", 1_700_000));
    let snap = build_many(
        &[&beta, &alpha],
        None,
        &daemon_info(),
        1_002_000,
        None,
        None,
        false,
    );
    let listed: Vec<(&str, Option<&str>, &str)> = snap
        .state
        .cooldowns
        .iter()
        .map(|c| {
            (
                c.agent_kind.as_str(),
                c.workflow.as_deref(),
                c.scope.as_str(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("x", Some("beta"), "host"),
            ("y", Some("alpha"), "host"),
            ("y", Some("beta"), "host")
        ]
    );
    let alpha_only = snap.only("alpha");
    assert_eq!(alpha_only.state.cooldowns.len(), 1);
    assert_eq!(alpha_only.state.cooldowns[0].until, rfc3339(1_500_000));
}
