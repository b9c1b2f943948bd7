//! Dispatch eligibility and order: route labels, `accept_unrouted`, `only_routes`, agent
//! selection by route, the candidate sort (priority, then oldest, then identifier), and what
//! holds an issue back: blockers not done yet, and cycles of them. Pure.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::config::Settings;
use crate::tracker::{Blocker, Issue, StateNames};

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

/// Whether a route label of `issue` names the agent kind `kind`: such a route pins its kind
/// (no fallback while it cools down, unless its record allows `route_fallback`).
pub fn route_names(issue: &Issue, settings: &Settings, kind: &str) -> bool {
    routes(issue, &settings.tracker.dispatch.route_label_prefix)
        .iter()
        .any(|r| r.eq_ignore_ascii_case(kind))
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

/// Whether an issue's state is of the unstarted type (`Todo` by default): the type the tracker
/// reported with it, else the one its name has among the configured states.
pub fn is_unstarted(issue: &Issue, settings: &Settings) -> bool {
    match issue.state_type.as_deref() {
        Some(t) => t == "unstarted",
        None => {
            StateNames::from_settings(&settings.tracker).state_type(&issue.state) == "unstarted"
        }
    }
}

/// The blockers of one poll's candidates: each blocker that is a candidate itself has the state
/// it has among them; any other the state the tracker reported with the dependent issue.
pub struct Blockers<'a> {
    candidates: &'a [Issue],
    /// Candidates by id; empty when no candidate has a blocker.
    by_id: HashMap<&'a str, usize>,
}

impl<'a> Blockers<'a> {
    pub fn new(candidates: &'a [Issue]) -> Blockers<'a> {
        let by_id = if candidates.iter().any(|i| !i.blocked_by.is_empty()) {
            candidates
                .iter()
                .enumerate()
                .map(|(n, i)| (i.id.as_str(), n))
                .collect()
        } else {
            HashMap::new()
        };
        Blockers { candidates, by_id }
    }

    /// `issue`'s blockers that are not in a terminal state, each in its current state.
    pub fn open(&self, issue: &Issue, settings: &Settings) -> Vec<Blocker> {
        issue
            .blocked_by
            .iter()
            .map(|b| match self.by_id.get(b.id.as_str()) {
                Some(&n) => Blocker {
                    state: self.candidates[n].state.clone(),
                    ..b.clone()
                },
                None => b.clone(),
            })
            .filter(|b| !settings.tracker.is_terminal(&b.state))
            .collect()
    }

    /// What holds `issue` back from a first run: its open blockers when its state is of the
    /// unstarted type; nothing for an issue already started.
    pub fn holding(&self, issue: &Issue, settings: &Settings) -> Vec<Blocker> {
        if issue.blocked_by.is_empty() || !is_unstarted(issue, settings) {
            return Vec::new();
        }
        self.open(issue, settings)
    }

    /// The cycles of blockers among the candidates `held` keeps waiting: each a list of
    /// candidate indices, in candidate order, whose members wait for one another.
    pub fn cycles(&self, settings: &Settings, held: impl Fn(&Issue) -> bool) -> Vec<Vec<usize>> {
        if self.by_id.is_empty() {
            return Vec::new();
        }
        let edges: Vec<Vec<usize>> = self
            .candidates
            .iter()
            .map(|i| {
                let holding = self.holding(i, settings);
                if holding.is_empty() || !held(i) {
                    return Vec::new();
                }
                holding
                    .iter()
                    .filter_map(|b| self.by_id.get(b.id.as_str()).copied())
                    .collect()
            })
            .collect();
        cycles(&edges)
    }
}

/// The strongly connected parts of a graph that hold a cycle (more than one node, or a node
/// with an edge to itself), each sorted; Tarjan's algorithm without recursion.
pub fn cycles(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = edges.len();
    let (mut index, mut low) = (vec![UNSEEN; n], vec![0; n]);
    let mut on_stack = vec![false; n];
    let (mut stack, mut out) = (Vec::new(), Vec::new());
    let mut next = 0;
    for root in 0..n {
        if index[root] != UNSEEN {
            continue;
        }
        // (node, how many of its edges were followed)
        let mut calls = vec![(root, 0)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&(v, followed)) = calls.last() {
            if let Some(&w) = edges[v].get(followed) {
                calls.last_mut().expect("not empty").1 += 1;
                if index[w] == UNSEEN {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    calls.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(parent, _)) = calls.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut part = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    part.push(w);
                    if w == v {
                        break;
                    }
                }
                if part.len() > 1 || edges[v].contains(&v) {
                    part.sort_unstable();
                    out.push(part);
                }
            }
        }
    }
    out.sort();
    out
}

fn created_ms(ts: &str) -> u64 {
    crate::time::parse_ms(ts).unwrap_or(u64::MAX)
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
    fn cycles_are_the_strongly_connected_parts_with_a_loop() {
        // 0 -> 1 -> 2 -> 0, 3 -> 0, 4 -> 4, 5 -> 6 -> 5 -> 7, 7 alone.
        let edges = vec![
            vec![1],
            vec![2],
            vec![0],
            vec![0],
            vec![4],
            vec![6],
            vec![5, 7],
            vec![],
        ];
        assert_eq!(cycles(&edges), [vec![0, 1, 2], vec![4], vec![5, 6]]);
        assert!(cycles(&[vec![1], vec![2], vec![]]).is_empty());
        // A long chain closed into one loop is one cycle, found without deep recursion.
        let n = 100_000;
        let chain: Vec<Vec<usize>> = (0..n).map(|i| vec![(i + 1) % n]).collect();
        assert_eq!(cycles(&chain).len(), 1);
        assert_eq!(cycles(&chain)[0].len(), n);
    }

    #[test]
    fn unstarted_is_the_reported_type_else_the_first_active_state() {
        let s = settings("tracker:\n  kind: memory");
        let mut i = issue("A-1", "Todo", &[]);
        assert!(is_unstarted(&i, &s));
        i.state = "In Progress".into();
        assert!(!is_unstarted(&i, &s));
        i.state_type = Some("unstarted".into());
        assert!(is_unstarted(&i, &s), "the tracker's own type wins");
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
