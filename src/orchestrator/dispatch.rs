//! Dispatch eligibility and order: route labels, `accept_unrouted`, `only_routes`, agent
//! selection by route, and the candidate sort (priority, then oldest, then identifier). Pure.

use std::cmp::Ordering;

use crate::config::Settings;
use crate::tracker::Issue;

/// The routes of an issue: each label that starts with the route prefix (compared without case),
/// minus the prefix, trimmed and lowercased.
pub fn routes(issue: &Issue, prefix: &str) -> Vec<String> {
    let prefix_len = prefix.len();
    issue
        .labels
        .iter()
        .filter(|l| {
            l.len() > prefix_len
                && l.is_char_boundary(prefix_len)
                && l[..prefix_len].eq_ignore_ascii_case(prefix)
        })
        .map(|l| l[prefix_len..].trim().to_lowercase())
        .filter(|r| !r.is_empty())
        .collect()
}

/// Why an active issue is not dispatched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotRoutable {
    Unrouted,
    OutsideOnlyRoutes(Vec<String>),
}

impl std::fmt::Display for NotRoutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotRoutable::Unrouted => {
                f.write_str("no route label and tracker.dispatch.accept_unrouted is false")
            }
            NotRoutable::OutsideOnlyRoutes(r) => write!(
                f,
                "routes {} are not in tracker.dispatch.only_routes",
                r.join(", ")
            ),
        }
    }
}

/// Routing: an unrouted issue is eligible when `accept_unrouted`; a routed one when
/// `only_routes` is unset or holds one of its routes. Returns the agent kind that runs it: a
/// route naming an `agents.<kind>` record, else the state's override, else `agent.kind`.
pub fn route(issue: &Issue, settings: &Settings) -> Result<String, NotRoutable> {
    let dispatch = &settings.tracker.dispatch;
    let routes = routes(issue, &dispatch.route_label_prefix);
    if routes.is_empty() {
        if !dispatch.accept_unrouted {
            return Err(NotRoutable::Unrouted);
        }
    } else if let Some(only) = &dispatch.only_routes
        && !routes
            .iter()
            .any(|r| only.iter().any(|o| o.trim().eq_ignore_ascii_case(r)))
    {
        return Err(NotRoutable::OutsideOnlyRoutes(routes));
    }
    let (agent, agents) = settings.agent_for_state(&issue.state);
    let by_route = routes
        .iter()
        .find_map(|r| agents.kinds.keys().find(|k| k.eq_ignore_ascii_case(r)));
    Ok(by_route.cloned().unwrap_or_else(|| agent.kind.clone()))
}

/// Whether an issue should (still) be worked: active and routable.
pub fn is_dispatchable(issue: &Issue, settings: &Settings) -> bool {
    settings.tracker.is_active(&issue.state) && route(issue, settings).is_ok()
}

/// Dispatch order: priority ascending (none last), then oldest creation, then identifier.
pub fn compare(a: &Issue, b: &Issue) -> Ordering {
    let prio = |i: &Issue| i.priority.unwrap_or(i64::MAX);
    prio(a)
        .cmp(&prio(b))
        .then_with(|| match (&a.created_at, &b.created_at) {
            (Some(x), Some(y)) => created_ms(x).cmp(&created_ms(y)),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then_with(|| a.identifier.cmp(&b.identifier))
}

fn created_ms(ts: &str) -> u128 {
    humantime::parse_rfc3339_weak(ts)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(u128::MAX, |d| d.as_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::testutil::{issue, settings};

    #[test]
    fn route_labels_use_the_prefix_case_insensitively() {
        let i = issue(
            "A-1",
            "Todo",
            &["svc:Backend", "bug", "Svc:", "Svc: Front "],
        );
        assert_eq!(routes(&i, "Svc:"), ["backend", "front"]);
    }

    #[test]
    fn routing_rows() {
        // (yaml, labels, expected agent or None when not routable)
        let rows: &[(&str, &[&str], Option<&str>)] = &[
            ("tracker:\n  kind: memory", &[], Some("agent_a")),
            (
                "tracker:\n  kind: memory\n  dispatch:\n    accept_unrouted: false",
                &[],
                None,
            ),
            (
                "tracker:\n  kind: memory\n  dispatch:\n    accept_unrouted: false",
                &["Svc:backend"],
                Some("agent_a"),
            ),
            (
                "tracker:\n  kind: memory\n  dispatch:\n    only_routes: [backend]",
                &["Svc:Backend"],
                Some("agent_a"),
            ),
            (
                "tracker:\n  kind: memory\n  dispatch:\n    only_routes: [backend]",
                &["Svc:frontend"],
                None,
            ),
            (
                "tracker:\n  kind: memory\n  dispatch:\n    only_routes: [backend]",
                &[],
                Some("agent_a"),
            ),
            (
                "tracker:\n  kind: memory",
                &["Svc:agent_b"],
                Some("agent_b"),
            ),
            (
                "tracker:\n  kind: memory\n  dispatch:\n    only_routes: [backend]",
                &["Svc:agent_b"],
                None,
            ),
            (
                "tracker:\n  kind: memory\n  dispatch:\n    route_label_prefix: 'route-'",
                &["route-agent_b"],
                Some("agent_b"),
            ),
            (
                "tracker:\n  kind: memory\nstatus_overrides:\n  todo:\n    agent:\n      kind: agent_b",
                &[],
                Some("agent_b"),
            ),
        ];
        for (yaml, labels, expected) in rows {
            let s = settings(yaml);
            let got = route(&issue("A-1", "Todo", labels), &s).ok();
            assert_eq!(got.as_deref(), *expected, "{yaml} {labels:?}");
        }
    }

    #[test]
    fn candidates_sort_by_priority_then_age_then_identifier() {
        let mut a = issue("B-2", "Todo", &[]);
        a.priority = Some(2);
        let mut b = issue("B-1", "Todo", &[]);
        b.priority = Some(1);
        let mut c = issue("A-9", "Todo", &[]);
        c.priority = Some(2);
        c.created_at = Some("2026-01-02T00:00:00Z".into());
        let mut d = issue("A-8", "Todo", &[]);
        d.priority = Some(2);
        d.created_at = Some("2026-01-01T00:00:00Z".into());
        let e = issue("A-1", "Todo", &[]);
        let mut list = [e, a, c, b, d];
        list.sort_by(compare);
        let ids: Vec<&str> = list.iter().map(|i| i.identifier.as_str()).collect();
        assert_eq!(ids, ["B-1", "A-8", "A-9", "B-2", "A-1"]);
    }
}
