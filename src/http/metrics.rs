//! `GET /metrics`: what the snapshot says, and the daemon's running totals, in the Prometheus
//! text exposition format (0.0.4). Rendered from the current snapshot at scrape time; the only
//! state of its own is the HTTP request count.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use crate::orchestrator::protocol::BlockedReason;
use crate::orchestrator::snapshot::{CooldownPayload, OpsStatePayload, Snapshot};

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Requests answered, by route and status.
#[derive(Default)]
pub struct Requests {
    counts: Mutex<BTreeMap<(&'static str, u16), u64>>,
}

impl Requests {
    pub fn record(&self, route: &'static str, status: u16) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry((route, status)).or_default() += 1;
    }

    fn counts(&self) -> BTreeMap<(&'static str, u16), u64> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// What the scrape needs besides the snapshot.
pub struct Extra<'a> {
    /// `tracker.kind`.
    pub tracker: &'a str,
    pub requests: &'a Requests,
    pub ws_clients: usize,
    pub now: u64,
    /// What the webhook listener answered; `None` without `server.webhook_port`.
    pub webhooks: Option<&'a crate::webhook::Stats>,
}

/// One metric family: its help and type lines, then its samples.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn head(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }
}

/// A label value as the format wants it: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Every numeric field of a rate-limit report whose name says `remaining`, by its path.
fn remaining(value: &serde_json::Value, path: &str, out: &mut Vec<(String, f64)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match v.as_f64() {
                    Some(n) if k.to_ascii_lowercase().contains("remaining") => out.push((p, n)),
                    _ => remaining(v, &p, out),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                remaining(v, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// A cooldown's labels: its agent kind, and its workflow in a daemon serving several (where
/// each workflow keeps its own, so one kind may cool down in two).
fn cooldown_labels(c: &CooldownPayload) -> Vec<(&'static str, &str)> {
    let mut labels = vec![("agent_kind", c.agent_kind.as_str())];
    if let Some(w) = &c.workflow {
        labels.push(("workflow", w.as_str()));
    }
    labels
}

/// The agent kinds cooling down after a rate limit: a sample per cooldown, none when no kind
/// cools down (the families' help and type lines are always written).
fn cooldowns(f: &mut Family, s: &OpsStatePayload) {
    f.head(
        "svc_agent_rate_limited",
        "gauge",
        "1 for each agent kind cooling down after a rate limit (no run starts on it).",
    );
    for c in &s.cooldowns {
        f.sample("svc_agent_rate_limited", &cooldown_labels(c), 1.0);
    }
    f.head(
        "svc_agent_cooldown_until_seconds",
        "gauge",
        "When each cooling agent kind's limit resets, in seconds since the epoch.",
    );
    for c in &s.cooldowns {
        if let Some(until) = crate::time::parse_ms(&c.until) {
            let seconds = until as f64 / 1000.0;
            f.sample(
                "svc_agent_cooldown_until_seconds",
                &cooldown_labels(c),
                seconds,
            );
        }
    }
}

pub fn render(snap: &Snapshot, extra: &Extra) -> String {
    let s = &snap.state;
    let c = &snap.counters;
    let mut out = String::with_capacity(4096);
    let mut f = Family { out: &mut out };
    let tracker = [("tracker", extra.tracker)];
    f.head(
        "svc_running",
        "gauge",
        "Runs in flight (reserving ones included).",
    )
    .sample("svc_running", &[], s.counts.running as f64);
    f.head("svc_retrying", "gauge", "Retries waiting.").sample(
        "svc_retrying",
        &[],
        s.counts.retrying as f64,
    );
    f.head("svc_reserving", "gauge", "Runs acquiring a worker slot.")
        .sample("svc_reserving", &[], s.reserving as f64);
    f.head("svc_blocked", "gauge", "Candidates held back, by reason.");
    for reason in [
        BlockedReason::GlobalConcurrencyCap,
        BlockedReason::LocalConcurrencyCap,
        BlockedReason::WorkerHostCapacity,
        BlockedReason::AgentRateLimited,
    ] {
        let n = s.blocked_by_reason.get(reason.code()).copied().unwrap_or(0);
        f.sample("svc_blocked", &[("reason", reason.code())], n as f64);
    }
    // A daemon serving several workflows: each one's figures, labelled with its name.
    if let Some(workflows) = &s.workflows {
        let per = [
            ("svc_workflow_running", "Runs in flight, per workflow."),
            ("svc_workflow_retrying", "Retries waiting, per workflow."),
            (
                "svc_workflow_blocked",
                "Candidates held back, per workflow.",
            ),
            (
                "svc_workflow_up",
                "1 while the workflow's last load and poll worked, 0 while failing or removed.",
            ),
        ];
        for (name, help) in per {
            f.head(name, "gauge", help);
            for w in workflows {
                let value = match name {
                    "svc_workflow_running" => w.running as f64,
                    "svc_workflow_retrying" => w.retrying as f64,
                    "svc_workflow_blocked" => w.blocked as f64,
                    _ => f64::from(u8::from(w.status == "ok")),
                };
                f.sample(name, &[("workflow", &w.name)], value);
            }
        }
    }
    f.head(
        "svc_runs_total",
        "counter",
        "Finished runs since the start, by outcome.",
    );
    for outcome in ["success", "failed", "stalled", "rate_limited"] {
        let n = c.runs_by_outcome.get(outcome).copied().unwrap_or(0);
        f.sample("svc_runs_total", &[("outcome", outcome)], n as f64);
    }
    f.head(
        "svc_retries_total",
        "counter",
        "Retries scheduled after failed or stalled runs.",
    )
    .sample("svc_retries_total", &[], c.retries_scheduled as f64);
    f.head(
        "svc_tokens_total",
        "counter",
        "Agent tokens since the start, live runs included.",
    )
    .sample(
        "svc_tokens_total",
        &[("direction", "input")],
        s.usage_totals.input_tokens as f64,
    )
    .sample(
        "svc_tokens_total",
        &[("direction", "output")],
        s.usage_totals.output_tokens as f64,
    );
    // Like the token counters: finished runs' dollars plus what live runs cost so far. A run
    // whose cost is unknown or in another currency adds nothing.
    f.head(
        "svc_cost_usd_total",
        "counter",
        "US dollars agents cost since the start, by agent kind, live runs included.",
    );
    let mut cost_by_kind: BTreeMap<&str, f64> = c
        .finished_cost_usd
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    for r in snap.runs.iter().filter(|r| r.outcome == "running") {
        if let Some(usd) = r.cost.estimated_cost_usd {
            *cost_by_kind.entry(r.agent_kind.as_str()).or_default() += usd;
        }
    }
    for (kind, usd) in cost_by_kind {
        f.sample(
            "svc_cost_usd_total",
            &[("agent_kind", kind)],
            crate::orchestrator::protocol::round_usd(usd),
        );
    }
    f.head(
        "svc_agent_seconds_total",
        "counter",
        "Seconds agents ran, live runs included.",
    )
    .sample(
        "svc_agent_seconds_total",
        &[],
        s.usage_totals.seconds_running,
    );
    f.head("svc_polls_total", "counter", "Tracker polls.")
        .sample("svc_polls_total", &tracker, c.polls as f64);
    f.head(
        "svc_poll_failures_total",
        "counter",
        "Tracker polls that failed.",
    )
    .sample("svc_poll_failures_total", &tracker, c.poll_failures as f64);
    f.head(
        "svc_poll_duration_seconds",
        "gauge",
        "How long the last poll's tracker requests took.",
    )
    .sample(
        "svc_poll_duration_seconds",
        &tracker,
        c.last_poll_ms as f64 / 1000.0,
    );
    let mut limits = Vec::new();
    if let Some(r) = &s.rate_limits {
        remaining(r, "", &mut limits);
    }
    f.head(
        "svc_tracker_rate_limit_remaining",
        "gauge",
        "Requests the tracker still allows, as it last reported them.",
    );
    for (limit, n) in &limits {
        f.sample(
            "svc_tracker_rate_limit_remaining",
            &[("tracker", extra.tracker), ("limit", limit)],
            *n,
        );
    }
    cooldowns(&mut f, s);
    if let Some(p) = &s.worker_pool {
        f.head(
            "svc_worker_machines",
            "gauge",
            "Worker pool machines, by state.",
        )
        .sample("svc_worker_machines", &[("state", "live")], p.live as f64)
        .sample("svc_worker_machines", &[("state", "idle")], p.idle as f64)
        .sample(
            "svc_worker_machines",
            &[("state", "leased")],
            p.leased as f64,
        )
        .sample(
            "svc_worker_machines",
            &[("state", "provisioning")],
            p.provisioning as f64,
        );
        f.head(
            "svc_worker_spend_seconds_total",
            "counter",
            "Worker-seconds the pool used (kept across restarts).",
        )
        .sample(
            "svc_worker_spend_seconds_total",
            &[],
            p.spend.worker_seconds as f64,
        );
        f.head(
            "svc_worker_spend_today_seconds",
            "gauge",
            "Worker-seconds the pool used today (UTC).",
        )
        .sample(
            "svc_worker_spend_today_seconds",
            &[],
            p.spend.worker_seconds_today as f64,
        );
    }
    let event = |name: &str| c.events.get(name).copied().unwrap_or(0) as f64;
    f.head(
        "svc_trace_write_failures_total",
        "counter",
        "Trace files that could not be written (each failure episode once).",
    )
    .sample(
        "svc_trace_write_failures_total",
        &[],
        event("trace_write_failed"),
    );
    f.head(
        "svc_store_write_failures_total",
        "counter",
        "Store writes that failed (each failure episode once).",
    )
    .sample(
        "svc_store_write_failures_total",
        &[("store", "claims")],
        event("claim_store_write_failed"),
    )
    .sample(
        "svc_store_write_failures_total",
        &[("store", "issues")],
        event("issue_store_write_failed"),
    );
    f.head(
        "svc_http_requests_total",
        "counter",
        "HTTP requests answered, by route and status.",
    );
    for ((route, status), n) in extra.requests.counts() {
        f.sample(
            "svc_http_requests_total",
            &[("route", route), ("status", &status.to_string())],
            n as f64,
        );
    }
    if let Some(webhooks) = extra.webhooks {
        f.head(
            "svc_webhook_deliveries_total",
            "counter",
            "Webhook deliveries, by route and verdict (woke, ignored and duplicate were accepted; the others refused).",
        );
        for source in crate::webhook::Source::ALL {
            for verdict in crate::webhook::Verdict::ALL {
                f.sample(
                    "svc_webhook_deliveries_total",
                    &[("route", source.route()), ("verdict", verdict.label())],
                    webhooks.count(source, verdict) as f64,
                );
            }
        }
    }
    f.head("svc_ws_clients", "gauge", "WebSocket clients connected.")
        .sample("svc_ws_clients", &[], extra.ws_clients as f64);
    f.head(
        "svc_heartbeat_age_seconds",
        "gauge",
        "Age of the state thread's last snapshot.",
    )
    .sample(
        "svc_heartbeat_age_seconds",
        &[],
        extra.now.saturating_sub(snap.built_at) as f64 / 1000.0,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_remaining_fields_found_anywhere() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        let mut found = Vec::new();
        remaining(
            &serde_json::json!({"requests": {"remaining": 12, "limit": 50}, "complexityRemaining": 7, "tiers": [{"remaining": 1}]}),
            "",
            &mut found,
        );
        found.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            found,
            [
                ("complexityRemaining".to_string(), 7.0),
                ("requests.remaining".to_string(), 12.0),
                ("tiers[0].remaining".to_string(), 1.0)
            ]
        );
    }

    #[test]
    fn cost_in_dollars_by_agent_kind_adds_live_runs_to_finished_ones() {
        let mut snap = crate::http::api::tests::snapshot_with_costs();
        snap.counters
            .finished_cost_usd
            .insert("agent_a".into(), 1.0);
        snap.counters
            .finished_cost_usd
            .insert("agent_c".into(), 0.5);
        let text = scrape(&snap);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("svc_cost_usd_total"))
            .collect();
        assert_eq!(
            lines,
            [
                "svc_cost_usd_total{agent_kind=\"agent_a\"} 1.323456",
                "svc_cost_usd_total{agent_kind=\"agent_c\"} 0.5",
            ],
            "agent_b's live run has no known cost; the euros count nowhere"
        );
        assert!(text.contains("# TYPE svc_cost_usd_total counter"));
    }

    fn scrape(snap: &Snapshot) -> String {
        let requests = Requests::default();
        render(
            snap,
            &Extra {
                tracker: "memory",
                requests: &requests,
                ws_clients: 0,
                now: snap.built_at,
                webhooks: None,
            },
        )
    }

    /// Each cooling kind: 1 in `svc_agent_rate_limited`, its reset in epoch seconds, a
    /// `workflow` label when the cooldown carries one; rate-limited runs and blocks counted.
    #[test]
    fn cooling_agent_kinds_show_their_reset_and_rate_limited_runs_and_blocks_count() {
        let mut snap = crate::http::api::tests::snapshot_with_costs();
        let quiet = scrape(&snap);
        assert!(
            quiet.contains("# TYPE svc_agent_rate_limited gauge"),
            "{quiet}"
        );
        assert!(!quiet.contains("svc_agent_rate_limited{"), "{quiet}");
        assert!(quiet.contains("svc_blocked{reason=\"agent_rate_limited\"} 0"));
        let cooldown = |kind: &str, workflow: Option<&str>, until: &str| CooldownPayload {
            workflow: workflow.map(str::to_string),
            agent_kind: kind.into(),
            until: until.into(),
            since: "2026-11-28T08:00:00Z".into(),
            reason: "429".into(),
            scope: "fleet".into(),
        };
        snap.state.cooldowns = vec![
            cooldown("agent_a", None, "2026-11-28T08:30:00.500Z"),
            cooldown("agent_b", Some("be\"ta"), "2026-11-28T09:00:00Z"),
        ];
        snap.state.blocked_by_reason.insert("agent_rate_limited", 2);
        snap.counters.runs_by_outcome.insert("rate_limited", 3);
        let text = scrape(&snap);
        let lines = |prefix: &str| -> Vec<&str> {
            text.lines().filter(|l| l.starts_with(prefix)).collect()
        };
        assert_eq!(
            lines("svc_agent_rate_limited{"),
            [
                "svc_agent_rate_limited{agent_kind=\"agent_a\"} 1",
                "svc_agent_rate_limited{agent_kind=\"agent_b\",workflow=\"be\\\"ta\"} 1",
            ]
        );
        assert_eq!(
            lines("svc_agent_cooldown_until_seconds{"),
            [
                "svc_agent_cooldown_until_seconds{agent_kind=\"agent_a\"} 1795854600.5",
                "svc_agent_cooldown_until_seconds{agent_kind=\"agent_b\",workflow=\"be\\\"ta\"} 1795856400",
            ]
        );
        assert!(text.contains("# HELP svc_agent_cooldown_until_seconds When each"));
        assert!(
            text.contains("svc_blocked{reason=\"agent_rate_limited\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("svc_runs_total{outcome=\"rate_limited\"} 3"),
            "{text}"
        );
    }
}
