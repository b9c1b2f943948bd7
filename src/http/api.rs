//! The `/api/v1` views built from a snapshot: runs (list, run, cost, retries) and issue detail.
//! Pure functions of the snapshot and the query, so they are tested without a server.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::orchestrator::protocol::round_usd;
use crate::orchestrator::snapshot::{RunPayload, Snapshot};

/// `true`, `1`, `yes`, `on` (any case) are true.
pub fn truthy(v: Option<&str>) -> bool {
    v.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "true" | "1" | "yes" | "on"
        )
    })
}

/// The runs views. `Err((status, code, message))` for errors.
pub fn runs(
    snapshot: &Snapshot,
    query: &BTreeMap<String, String>,
    generated_at: &str,
) -> Result<Value, (u16, &'static str, &'static str)> {
    let get = |k: &str| query.get(k).map(String::as_str);
    let mut runs: Vec<&RunPayload> = snapshot.runs.iter().collect();
    if let Some(issue) = get("issue").filter(|s| !s.is_empty()) {
        runs.retain(|r| r.issue_identifier == issue || r.issue_id == issue);
    }
    if truthy(get("failed")) {
        runs.retain(|r| r.outcome == "failed" || r.outcome == "stalled");
    }
    if truthy(get("spend")) {
        let mut issues = spend_view(snapshot);
        if let Some(issue) = get("issue").filter(|s| !s.is_empty()) {
            issues.retain(|i| i["issue_identifier"] == issue);
        }
        return Ok(json!({
            "generated_at": generated_at, "view": "spend", "day": snapshot.state.ledger.day,
            "today": snapshot.state.ledger.today, "daily_budget_usd": snapshot.state.ledger.daily_budget_usd,
            "issues": issues,
        }));
    }
    if truthy(get("cost")) {
        return Ok(
            json!({"generated_at": generated_at, "view": "cost", "summary": cost_summary(&runs)}),
        );
    }
    if truthy(get("retries")) {
        return Ok(
            json!({"generated_at": generated_at, "view": "retries", "issues": retries(&runs)}),
        );
    }
    if let Some(id) = get("id").filter(|s| !s.is_empty()) {
        let Some(run) = runs.iter().find(|r| r.id == id) else {
            return Err((404, "run_not_found", "Run not found"));
        };
        let related: Vec<&&RunPayload> = runs
            .iter()
            .filter(|r| r.issue_id == run.issue_id && r.id != run.id)
            .take(10)
            .collect();
        return Ok(
            json!({"generated_at": generated_at, "view": "run", "run": run, "related_runs": related}),
        );
    }
    let limit = get("limit")
        .and_then(|l| l.trim().parse::<i64>().ok())
        .map_or(20, |l| l.clamp(1, 200)) as usize;
    let count = |o: &str| runs.iter().filter(|r| r.outcome == o).count();
    // `rate_limited` (beyond the spec's outcomes): runs whose agent met a rate limit.
    let summary = json!({
        "total": runs.len(), "running": count("running"), "success": count("success"),
        "failed": count("failed"), "stalled": count("stalled"), "canceled": count("canceled"),
        "rate_limited": count("rate_limited"),
    });
    let page: Vec<&&RunPayload> = runs.iter().take(limit).collect();
    Ok(json!({"generated_at": generated_at, "view": "runs", "summary": summary, "runs": page}))
}

fn cost_summary(runs: &[&RunPayload]) -> Value {
    #[derive(Default)]
    struct Agent<'a> {
        runs: u64,
        done: u64,
        input: u64,
        output: u64,
        total: u64,
        /// Runs whose cost in US dollars is known, and their sum.
        priced: u64,
        usd: f64,
        /// Costs reported in other currencies, summed per currency.
        other: BTreeMap<&'a str, f64>,
    }
    let mut agents: BTreeMap<&str, Agent> = BTreeMap::new();
    for r in runs {
        let e = agents.entry(r.agent_kind.as_str()).or_default();
        e.runs += 1;
        e.done += u64::from(r.outcome != "running");
        e.input = e.input.saturating_add(r.tokens.input_tokens);
        e.output = e.output.saturating_add(r.tokens.output_tokens);
        e.total = e.total.saturating_add(r.tokens.total_tokens);
        if let Some(usd) = r.cost.estimated_cost_usd {
            e.priced += 1;
            e.usd += usd;
        }
        if let Some(other) = &r.cost.other_currency {
            *e.other.entry(other.currency.as_str()).or_default() += other.amount;
        }
    }
    let per_agent: Vec<Value> = agents
        .iter()
        .map(|(kind, a)| {
            let other: BTreeMap<&str, f64> =
                a.other.iter().map(|(c, v)| (*c, round_usd(*v))).collect();
            json!({
                "agent_kind": kind, "runs": a.runs, "done": a.done, "input_tokens": a.input, "output_tokens": a.output,
                "total_tokens": a.total, "avg_tokens_per_run": if a.runs > 0 { a.total as f64 / a.runs as f64 } else { 0.0 },
                // Dollars of the runs whose cost is known (`priced_runs` of them); null when none is.
                "estimated_cost_usd": (a.priced > 0).then(|| round_usd(a.usd)),
                "priced_runs": a.priced,
                "other_currencies": other,
            })
        })
        .collect();
    let mut top: Vec<&&RunPayload> = runs.iter().collect();
    top.sort_by_key(|r| std::cmp::Reverse(r.tokens.total_tokens));
    top.truncate(10);
    json!({"agents": per_agent, "top_runs": top})
}

fn retries(runs: &[&RunPayload]) -> Vec<Value> {
    // Runs are newest first, so the first run seen of an issue is its latest.
    let mut by_issue: BTreeMap<&str, Vec<&RunPayload>> = BTreeMap::new();
    for r in runs {
        by_issue.entry(r.issue_id.as_str()).or_default().push(r);
    }
    let mut rows: Vec<Value> = by_issue
        .values()
        .filter(|list| list.iter().any(|r| r.retry_attempt > 0))
        .map(|list| {
            let latest = list[0];
            let attempts = list.iter().map(|r| r.retry_attempt).max().unwrap_or(0);
            let tokens: u64 = list
                .iter()
                .map(|r| r.tokens.total_tokens)
                .fold(0, u64::saturating_add);
            json!({
                "issue_id": latest.issue_id, "issue_identifier": latest.issue_identifier, "attempts": attempts,
                "latest_outcome": latest.outcome, "total_tokens": tokens, "run_id": latest.id,
                "failure_reason": list.iter().find_map(|r| r.failure_reason.clone()),
            })
        })
        .collect();
    rows.sort_by(|a, b| {
        b["attempts"]
            .as_u64()
            .cmp(&a["attempts"].as_u64())
            .then(b["total_tokens"].as_u64().cmp(&a["total_tokens"].as_u64()))
            .then(
                a["issue_identifier"]
                    .as_str()
                    .cmp(&b["issue_identifier"].as_str()),
            )
    });
    rows
}

/// `GET /api/v1/:issue_identifier`.
pub fn issue_detail(snapshot: &Snapshot, identifier: &str) -> Option<Value> {
    let state = &snapshot.state;
    let running = state
        .running
        .iter()
        .find(|r| r.issue_identifier == identifier);
    let retry = state
        .retrying
        .iter()
        .find(|r| r.issue_identifier == identifier);
    let (issue_id, workspace, host) = match (running, retry) {
        (Some(r), _) => (
            r.issue_id.clone(),
            r.workspace_path.clone(),
            r.worker_host.clone(),
        ),
        (None, Some(r)) => (
            r.issue_id.clone(),
            r.workspace_path.clone(),
            r.worker_host.clone(),
        ),
        (None, None) => return waiting_detail(snapshot, identifier),
    };
    let restart_count = snapshot.restart_counts.get(&issue_id).copied().unwrap_or(0);
    let events: Vec<Value> = state
        .recent_events
        .iter()
        .filter(|e| e.issue_identifier.as_deref() == Some(identifier))
        .map(|e| json!({"at": e.at, "event": e.event, "message": e.message}))
        .collect();
    let last_error = retry.and_then(|r| r.error.clone()).or_else(|| {
        snapshot
            .runs
            .iter()
            .find(|r| r.issue_id == issue_id && r.failure_reason.is_some())
            .and_then(|r| r.failure_reason.clone())
    });
    Some(json!({
        "issue_identifier": identifier,
        "issue_id": issue_id,
        "status": if running.is_some() { "running" } else { "retrying" },
        "workspace": {"path": workspace, "host": host},
        "attempts": {"restart_count": restart_count, "current_retry_attempt": running.and_then(|r| r.attempt).or(retry.map(|r| r.attempt)).unwrap_or(0)},
        "running": running,
        "retry": retry,
        "logs": {"codex_session_logs": []},
        "recent_events": events,
        "last_error": last_error,
        "tracked": {},
        "spend": spend_of(snapshot, identifier),
    }))
}

/// What the ledger holds for an issue (every run, retry and daemon): tokens, dollars, runs.
fn spend_of(snapshot: &Snapshot, identifier: &str) -> Value {
    let spent = snapshot
        .spend_by_issue
        .iter()
        .find(|(id, _)| id == identifier)
        .map(|(_, s)| *s)
        .unwrap_or_default();
    json!({
        "input_tokens": spent.input_tokens, "output_tokens": spent.output_tokens,
        "total_tokens": spent.total_tokens, "cost_usd": round_usd(spent.cost_usd), "runs": spent.runs,
    })
}

/// The spend view (`spend=1`, beyond the spec): every issue of the ledger, the largest spend
/// first.
fn spend_view(snapshot: &Snapshot) -> Vec<Value> {
    snapshot
        .spend_by_issue
        .iter()
        .map(|(id, s)| {
            json!({
                "issue_identifier": id, "runs": s.runs, "input_tokens": s.input_tokens,
                "output_tokens": s.output_tokens, "total_tokens": s.total_tokens,
                "cost_usd": round_usd(s.cost_usd),
            })
        })
        .collect()
}

/// The detail of an issue waiting for its blockers (status `waiting`): the blockers it waits
/// for in `waiting_on`, with the detail's other fields as for an issue with no run yet.
fn waiting_detail(snapshot: &Snapshot, identifier: &str) -> Option<Value> {
    let w = snapshot
        .state
        .waiting_on_blockers
        .iter()
        .find(|w| w.issue_identifier == identifier)?;
    let events: Vec<Value> = snapshot
        .state
        .recent_events
        .iter()
        .filter(|e| e.issue_identifier.as_deref() == Some(identifier))
        .map(|e| json!({"at": e.at, "event": e.event, "message": e.message}))
        .collect();
    let restart_count = snapshot
        .restart_counts
        .get(&w.issue_id)
        .copied()
        .unwrap_or(0);
    Some(json!({
        "issue_identifier": identifier,
        "issue_id": w.issue_id,
        "status": "waiting",
        "waiting_on": {"blockers": w.blockers, "cycle": w.cycle},
        "workspace": {"path": null, "host": null},
        "attempts": {"restart_count": restart_count, "current_retry_attempt": 0},
        "running": null,
        "retry": null,
        "logs": {"codex_session_logs": []},
        "recent_events": events,
        "last_error": null,
        "tracked": {},
        "spend": spend_of(snapshot, identifier),
    }))
}

/// One trace ticket as `TicketInfo` (camelCase), enriched from the issue store.
pub fn ticket_info(
    issue_id: &str,
    t: &crate::trace::display::Timeline,
    snapshot: &Snapshot,
    store: &crate::trace::store::IssueStore,
) -> Value {
    let running = snapshot
        .state
        .running
        .iter()
        .find(|r| r.issue_id == issue_id);
    let stored = store.get(issue_id).ok().flatten();
    let status = if running.is_some() {
        "running"
    } else {
        t.facts.last_status.unwrap_or("idle")
    };
    let mut info = json!({
        "issueId": issue_id,
        "identifier": t.facts.identifier.clone().or_else(|| stored.as_ref().map(|s| s.identifier.clone())).unwrap_or_else(|| issue_id.to_string()),
        "agentKind": running.map(|r| r.agent_kind.clone()).or_else(|| t.facts.agent_kind.clone()),
        "startedAt": t.facts.started_at,
        "turnCount": t.facts.turn_count,
        "status": status,
    });
    if let Some(s) = stored {
        info["title"] = s.title.into();
        if let Some(url) = s.url {
            info["url"] = url.into();
        }
    }
    info
}

/// Every ticket, most recently started first.
pub fn tickets(
    index: &crate::trace::watcher::TraceIndex,
    snapshot: &Snapshot,
    store: &crate::trace::store::IssueStore,
) -> Vec<Value> {
    let mut list: Vec<Value> = index
        .tickets
        .iter()
        .map(|(id, t)| ticket_info(id, t, snapshot, store))
        .collect();
    list.sort_by(|a, b| {
        b["startedAt"]
            .as_str()
            .cmp(&a["startedAt"].as_str())
            .then(a["issueId"].as_str().cmp(&b["issueId"].as_str()))
    });
    list
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn truthy_forms() {
        for t in ["true", "1", "yes", "on", "TRUE", " On "] {
            assert!(truthy(Some(t)), "{t}");
        }
        for f in ["false", "0", "no", "off", "", "y"] {
            assert!(!truthy(Some(f)), "{f}");
        }
        assert!(!truthy(None));
    }

    /// Three live runs of agent_a: two whose cost in dollars is known, one billed in euros;
    /// and one of agent_b with no known cost.
    pub(in crate::http) fn snapshot_with_costs() -> Snapshot {
        use crate::orchestrator::protocol::{Event, OtherCost};
        use crate::orchestrator::snapshot;
        use crate::orchestrator::state::{State, handle};
        use crate::orchestrator::testutil::{issue, settings};
        let mut st = State::new(
            std::sync::Arc::new(settings(
                "tracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 5\nagents:\n  agent_b:\n    bridge_command: b",
            )),
            1_000_000,
        );
        handle(&mut st, 1_000_000, Event::Tick);
        let issues = vec![
            issue("T-1", "Todo", &[]),
            issue("T-2", "Todo", &[]),
            issue("T-3", "Todo", &[]),
            issue("T-4", "Todo", &["svc:agent_b"]),
        ];
        handle(
            &mut st,
            1_000_001,
            crate::orchestrator::testutil::poll_done(issues),
        );
        for r in st.running.values_mut() {
            match r.slot.issue.identifier.as_str() {
                "T-1" => r.cost_usd = Some(0.1234564),
                "T-2" => r.cost_usd = Some(0.2),
                "T-3" => {
                    r.cost_other = Some(OtherCost {
                        amount: 1.5,
                        currency: "EUR".into(),
                    })
                }
                _ => {}
            }
        }
        let daemon = crate::orchestrator::testutil::daemon_info();
        snapshot::build(&st, &daemon, 1_002_000, None)
    }

    #[test]
    fn the_cost_view_sums_known_dollars_per_agent_and_keeps_other_currencies_apart() {
        let snap = snapshot_with_costs();
        let by_id = |identifier: &str| {
            snap.runs
                .iter()
                .find(|r| r.issue_identifier == identifier)
                .unwrap()
        };
        assert_eq!(by_id("T-1").cost.estimated_cost_usd, Some(0.123456));
        assert_eq!(by_id("T-3").cost.estimated_cost_usd, None);
        let run = serde_json::to_value(by_id("T-4")).unwrap();
        assert_eq!(run["cost"], json!({"estimated_cost_usd": null}));
        let run = serde_json::to_value(by_id("T-3")).unwrap();
        assert_eq!(
            run["cost"],
            json!({"estimated_cost_usd": null, "other_currency": {"amount": 1.5, "currency": "EUR"}})
        );
        let query = BTreeMap::from([("cost".to_string(), "1".to_string())]);
        let v = runs(&snap, &query, "now").unwrap();
        let agents = v["summary"]["agents"].as_array().unwrap();
        assert_eq!(agents.len(), 2, "{agents:?}");
        let a = &agents[0];
        assert_eq!(a["agent_kind"], "agent_a");
        assert_eq!(a["estimated_cost_usd"], json!(0.323456));
        assert_eq!(a["priced_runs"], 3 - 1);
        assert_eq!(a["other_currencies"], json!({"EUR": 1.5}));
        assert_eq!(agents[1]["estimated_cost_usd"], Value::Null);
        let top = v["summary"]["top_runs"].as_array().unwrap();
        assert!(
            top.iter()
                .any(|r| r["cost"]["estimated_cost_usd"] == json!(0.2))
        );
    }

    /// The runs summary counts runs that met a rate limit apart (beyond the spec's outcomes).
    #[test]
    fn the_runs_summary_counts_rate_limited_runs() {
        let mut snap = snapshot_with_costs();
        snap.runs[0].outcome = "rate_limited";
        let v = runs(&snap, &BTreeMap::new(), "now").unwrap();
        assert_eq!(v["summary"]["rate_limited"], 1, "{v:#}");
        assert_eq!(v["summary"]["running"], 3, "{v:#}");
        assert_eq!(v["summary"]["total"], 4, "{v:#}");
    }
}
