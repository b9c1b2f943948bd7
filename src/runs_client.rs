//! `svc runs`: a blocking client of a running daemon's `GET /api/v1/runs`, rendering the list,
//! run, cost and retries views as tables (or the raw JSON with `--json`). It holds no state.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::config::{self, SecretResolver};
use crate::env::Env;

/// `svc runs`: what to show, and where the daemon is (parsed by `cli::args`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RunsArgs {
    pub issue: Option<String>,
    pub failed: bool,
    pub cost: bool,
    /// `--spend`: issues by what the ledger holds for them (beyond the spec).
    pub spend: bool,
    pub retries: bool,
    pub id: Option<String>,
    pub limit: Option<u32>,
    pub url: Option<String>,
    pub port: Option<u16>,
    pub json: bool,
    /// `--workflow NAME`: only that workflow's runs, in a daemon serving several.
    pub workflow_name: Option<String>,
    pub workflow: Option<PathBuf>,
}

pub const NO_PORT: &str =
    "No observability server port configured. Pass --port/--url or set server.port in WORKFLOW.md.";

/// The daemon's base URL, first match wins: `--url`, `--port` (> 0) on `server.host`, then
/// `server.port` (> 0) of the workflow.
pub fn base_url(a: &RunsArgs, workflow: &Path, env: &Env) -> Result<String, String> {
    if let Some(url) = &a.url {
        return Ok(url.trim_end_matches('/').to_string());
    }
    let settings = config::load(
        workflow,
        env,
        &mut SecretResolver::new(crate::process::run_program),
    )
    .ok()
    .map(|l| l.settings);
    let host = settings
        .as_ref()
        .map_or_else(|| "127.0.0.1".to_string(), |s| s.server.host.clone());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    if let Some(port) = a.port.filter(|p| *p > 0) {
        return Ok(format!("http://{host}:{port}"));
    }
    match settings.map(|s| s.server.port).filter(|p| *p > 0) {
        Some(port) => Ok(format!("http://{host}:{port}")),
        None => Err(NO_PORT.to_string()),
    }
}

/// The request path and query for the flags.
pub fn request_path(a: &RunsArgs) -> String {
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let mut q = Vec::new();
    if let Some(i) = &a.issue {
        q.push(format!("issue={}", enc(i)));
    }
    if a.failed {
        q.push("failed=true".into());
    }
    if a.spend {
        q.push("spend=true".into());
    }
    if a.cost {
        q.push("cost=true".into());
    }
    if a.retries {
        q.push("retries=true".into());
    }
    if let Some(id) = &a.id {
        q.push(format!("id={}", enc(id)));
    }
    if let Some(l) = a.limit {
        q.push(format!("limit={l}"));
    }
    if let Some(w) = &a.workflow_name {
        q.push(format!("workflow={}", enc(w)));
    }
    if q.is_empty() {
        "/api/v1/runs".into()
    } else {
        format!("/api/v1/runs?{}", q.join("&"))
    }
}

/// Fetches and renders; `Err` is the message to print (exit status 1).
pub fn run(a: &RunsArgs, workflow: &Path, env: &Env) -> Result<String, String> {
    let base = base_url(a, workflow, env)?;
    let url = format!("{base}{}", request_path(a));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent
        .get(&url)
        .call()
        .map_err(|e| format!("cannot reach the daemon at {base}: {e}"))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("cannot read the response: {e}"))?;
    match status {
        200 => {}
        404 => return Err(not_found(a, &text)),
        503 => return Err("Observability API unavailable".into()),
        other => return Err(format!("Unexpected response status {other}")),
    }
    if a.json {
        return Ok(format!("{text}\n"));
    }
    let body: Value = serde_json::from_str(&text)
        .map_err(|e| format!("the daemon answered invalid JSON: {e}"))?;
    Ok(match body["view"].as_str() {
        Some("cost") => render_cost(&body),
        Some("spend") => render_spend(&body),
        Some("retries") => render_retries(&body),
        Some("run") => render_run(&body),
        _ => render_list(&body),
    })
}

/// The message of a 404: no workflow of the `--workflow` name (error code
/// `workflow_not_found`), else no such run.
fn not_found(a: &RunsArgs, body: &str) -> String {
    let code = serde_json::from_str::<Value>(body).ok().and_then(|b| {
        b.pointer("/error/code")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    match (&a.workflow_name, code.as_deref()) {
        (Some(name), Some("workflow_not_found")) => {
            format!("The daemon serves no workflow named {name:?} (svc status lists its workflows)")
        }
        _ => "Run not found".into(),
    }
}

pub(crate) fn na(v: &Value) -> String {
    match v {
        Value::Null => "n/a".into(),
        Value::String(s) if s.is_empty() => "n/a".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Milliseconds as `850ms` below one second, else seconds (`12.3s`); `n/a` when unknown.
pub fn duration(ms: &Value) -> String {
    match ms.as_u64() {
        Some(ms) if ms >= 1000 => format!("{:.1}s", ms as f64 / 1000.0),
        Some(ms) => format!("{ms}ms"),
        None => "n/a".into(),
    }
}

/// Session ids longer than 14 characters become the first 6, `...`, the last 5.
pub fn compact_session(s: &Value) -> String {
    match s.as_str() {
        Some(s) if s.chars().count() > 14 => {
            let chars: Vec<char> = s.chars().collect();
            format!(
                "{}...{}",
                chars[..6].iter().collect::<String>(),
                chars[chars.len() - 5..].iter().collect::<String>()
            )
        }
        Some(s) if !s.is_empty() => s.to_string(),
        _ => "n/a".into(),
    }
}

/// Left-aligned columns separated by two spaces.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let text: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect(), &mut out);
    for row in rows {
        line(row.clone(), &mut out);
    }
    out
}

/// A run's issue, with its ensemble slot when it has one (`ABC-1[1/3]`).
pub(crate) fn issue_slot(r: &Value) -> String {
    match (r["slot_index"].as_u64(), r["ensemble_size"].as_u64()) {
        (Some(slot), Some(size)) if size > 1 => crate::orchestrator::protocol::slot_name(
            &na(&r["issue_identifier"]),
            slot as u32,
            size as u32,
        ),
        _ => na(&r["issue_identifier"]),
    }
}

fn run_row(r: &Value) -> Vec<String> {
    vec![
        na(&r["id"]),
        issue_slot(r),
        na(&r["agent_kind"]),
        na(&r["outcome"]),
        na(&r["retry_attempt"]),
        na(&r["turn_count"]),
        na(&r["tokens"]["total_tokens"]),
        duration(&r["duration_ms"]),
        compact_session(&r["session_id"]),
    ]
}

const RUN_HEADERS: [&str; 9] = [
    "ID", "ISSUE", "AGENT", "OUTCOME", "ATTEMPT", "TURNS", "TOKENS", "DURATION", "SESSION",
];

/// The table of the runs in the JSON array `runs`; a WORKFLOW column after ID when they carry
/// their workflow (a daemon serving several).
fn runs_table(runs: &Value) -> String {
    let runs = runs.as_array().map(Vec::as_slice).unwrap_or_default();
    let labelled = runs.iter().any(|r| r["workflow"].is_string());
    let mut headers = RUN_HEADERS.to_vec();
    if labelled {
        headers.insert(1, "WORKFLOW");
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let mut row = run_row(r);
            if labelled {
                row.insert(1, na(&r["workflow"]));
            }
            row
        })
        .collect();
    table(&headers, &rows)
}

fn render_list(body: &Value) -> String {
    let s = &body["summary"];
    let mut out = format!(
        "total {}  running {}  success {}  failed {}  stalled {}  canceled {}\n",
        na(&s["total"]),
        na(&s["running"]),
        na(&s["success"]),
        na(&s["failed"]),
        na(&s["stalled"]),
        na(&s["canceled"])
    );
    // Beyond the spec's six: said only when some run met a rate limit, so the line is the
    // spec's otherwise.
    if let Some(n) = s["rate_limited"].as_u64().filter(|n| *n > 0) {
        out.insert_str(out.len() - 1, &format!("  rate_limited {n}"));
    }
    out.push_str(&runs_table(&body["runs"]));
    out
}

fn render_run(body: &Value) -> String {
    let r = &body["run"];
    let mut out = String::new();
    if r["workflow"].is_string() {
        let _ = writeln!(out, "{:<13}{}", "workflow", na(&r["workflow"]));
    }
    for (label, value) in [
        ("run", na(&r["id"])),
        (
            "issue",
            format!("{} ({})", na(&r["issue_identifier"]), na(&r["issue_title"])),
        ),
        ("agent", na(&r["agent_kind"])),
        ("outcome", na(&r["outcome"])),
        ("attempt", na(&r["retry_attempt"])),
        ("turns", na(&r["turn_count"])),
        (
            "tokens",
            format!(
                "{} in, {} out, {} total",
                na(&r["tokens"]["input_tokens"]),
                na(&r["tokens"]["output_tokens"]),
                na(&r["tokens"]["total_tokens"])
            ),
        ),
        ("started", na(&r["started_at"])),
        ("ended", na(&r["ended_at"])),
        ("duration", duration(&r["duration_ms"])),
        ("session", na(&r["session_id"])),
        ("workspace", na(&r["workspace_path"])),
        ("last event", na(&r["last_event"])),
        ("last message", na(&r["last_message"])),
        ("failure", na(&r["failure_reason"])),
    ] {
        let _ = writeln!(out, "{label:<13}{value}");
    }
    if body["related_runs"]
        .as_array()
        .is_some_and(|r| !r.is_empty())
    {
        out.push_str("\nrelated attempts\n");
        out.push_str(&runs_table(&body["related_runs"]));
    }
    out
}

/// A table's rows: `cells` of each entry of the JSON array `list` (none when it is no array).
fn rows_of(list: &Value, cells: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    list.as_array()
        .map(|a| a.iter().map(&cells).collect())
        .unwrap_or_default()
}

/// `--spend`: today's spend, then every issue by what it spent (`ISSUE RUNS INPUT OUTPUT TOTAL
/// USD`, `n/a` where no dollars are known).
fn render_spend(body: &Value) -> String {
    let dollars = |v: &Value| match v.as_f64() {
        Some(usd) if usd > 0.0 => format!("{usd:.6}"),
        _ => "n/a".into(),
    };
    let today = &body["today"];
    let budget = body["daily_budget_usd"].as_f64().map_or_else(
        || "no daily budget".to_string(),
        |b| format!("daily budget ${b}"),
    );
    let mut out = format!(
        "today ({} UTC): {} runs, {} tokens, USD {} ({budget})\n\n",
        na(&body["day"]),
        na(&today["runs"]),
        na(&today["total_tokens"]),
        dollars(&today["cost_usd"]),
    );
    let rows = rows_of(&body["issues"], |r| {
        vec![
            na(&r["issue_identifier"]),
            na(&r["runs"]),
            na(&r["input_tokens"]),
            na(&r["output_tokens"]),
            na(&r["total_tokens"]),
            dollars(&r["cost_usd"]),
        ]
    });
    out.push_str(&table(
        &["ISSUE", "RUNS", "INPUT", "OUTPUT", "TOTAL", "USD"],
        &rows,
    ));
    out
}

fn render_cost(body: &Value) -> String {
    let s = &body["summary"];
    let rows: Vec<Vec<String>> = s["agents"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    vec![
                        na(&r["agent_kind"]),
                        na(&r["runs"]),
                        na(&r["done"]),
                        na(&r["input_tokens"]),
                        na(&r["output_tokens"]),
                        na(&r["total_tokens"]),
                        r["avg_tokens_per_run"]
                            .as_f64()
                            .map_or("n/a".into(), |v| format!("{v:.0}")),
                        usd(&r["estimated_cost_usd"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = table(
        &[
            "AGENT", "RUNS", "DONE", "INPUT", "OUTPUT", "TOTAL", "AVG/RUN", "USD",
        ],
        &rows,
    );
    // What bridges reported in other currencies: in a table of its own, so that each column
    // of the spec's table holds one value (its USD column dollars or `n/a`).
    let others: Vec<Vec<String>> = s["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| {
            let kind = na(&r["agent_kind"]);
            r["other_currencies"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(c, a)| !c.is_empty() && a.is_number())
                .map(move |(c, a)| vec![kind.clone(), usd(a), c.clone()])
        })
        .collect();
    if !others.is_empty() {
        out.push_str("\nother currencies (not in USD)\n");
        out.push_str(&table(&["AGENT", "AMOUNT", "CURRENCY"], &others));
    }
    let top: Vec<Vec<String>> = s["top_runs"]
        .as_array()
        .map(|r| {
            r.iter()
                .take(10)
                .map(|r| {
                    vec![
                        na(&r["id"]),
                        na(&r["issue_identifier"]),
                        na(&r["agent_kind"]),
                        na(&r["tokens"]["total_tokens"]),
                        usd(&r["cost"]["estimated_cost_usd"]),
                        na(&r["outcome"]),
                        other_amount(&r["cost"]["other_currency"]),
                        other_currency(&r["cost"]["other_currency"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    out.push_str("\ntop runs\n");
    out.push_str(&table(
        &[
            "ID", "ISSUE", "AGENT", "TOKENS", "USD", "OUTCOME", "OTHER", "CURRENCY",
        ],
        &top,
    ));
    out
}

/// Dollars to 6 decimal places without trailing zeros (at least 2 places); `n/a` when
/// unknown.
fn usd(v: &Value) -> String {
    match v.as_f64() {
        Some(x) => {
            let text = format!("{x:.6}");
            let trimmed = text.trim_end_matches('0');
            let decimals = trimmed.len() - trimmed.find('.').map_or(trimmed.len(), |i| i + 1);
            if decimals < 2 {
                format!("{x:.2}")
            } else {
                trimmed.to_string()
            }
        }
        None => "n/a".into(),
    }
}

/// The amount of a run's cost in another currency (`{"amount": 1.5, "currency": "EUR"}`):
/// `1.50`, `-` for none.
fn other_amount(v: &Value) -> String {
    match (v["amount"].is_number(), v["currency"].as_str()) {
        (true, Some(c)) if !c.is_empty() => usd(&v["amount"]),
        _ => "-".into(),
    }
}

/// The currency of a run's cost in another currency, `-` for none.
fn other_currency(v: &Value) -> String {
    match (v["amount"].is_number(), v["currency"].as_str()) {
        (true, Some(c)) if !c.is_empty() => c.to_string(),
        _ => "-".into(),
    }
}

fn render_retries(body: &Value) -> String {
    let rows = rows_of(&body["issues"], |r| {
        vec![
            na(&r["issue_identifier"]),
            na(&r["attempts"]),
            na(&r["latest_outcome"]),
            na(&r["total_tokens"]),
            na(&r["run_id"]),
            na(&r["failure_reason"]),
        ]
    });
    table(
        &["ISSUE", "ATTEMPTS", "OUTCOME", "TOKENS", "RUN", "FAILURE"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn durations_sessions_and_na() {
        assert_eq!(duration(&json!(999)), "999ms");
        assert_eq!(duration(&json!(1000)), "1.0s");
        assert_eq!(duration(&json!(12345)), "12.3s");
        assert_eq!(duration(&json!(null)), "n/a");
        assert_eq!(compact_session(&json!("abcdefghijklmn")), "abcdefghijklmn");
        assert_eq!(compact_session(&json!("abcdefghijklmno")), "abcdef...klmno");
        assert_eq!(compact_session(&json!(null)), "n/a");
        assert_eq!(na(&json!(null)), "n/a");
        assert_eq!(na(&json!(3)), "3");
    }

    #[test]
    fn the_cost_table_shows_dollars_where_known_and_na_where_not() {
        let body = json!({"view": "cost", "summary": {
            "agents": [
                {"agent_kind": "demo", "runs": 3, "done": 2, "input_tokens": 3000, "output_tokens": 600, "total_tokens": 3600,
                 "avg_tokens_per_run": 1200.0, "estimated_cost_usd": 0.018, "priced_runs": 3, "other_currencies": {}},
                {"agent_kind": "eu", "runs": 1, "done": 1, "input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                 "avg_tokens_per_run": 0.0, "estimated_cost_usd": null, "priced_runs": 0, "other_currencies": {"EUR": 1.5}},
                {"agent_kind": "free", "runs": 1, "done": 1, "input_tokens": 10, "output_tokens": 0, "total_tokens": 10,
                 "avg_tokens_per_run": 10.0, "estimated_cost_usd": null, "priced_runs": 0, "other_currencies": {}}],
            "top_runs": [
                {"id": "run-1", "issue_identifier": "A-1", "agent_kind": "demo", "outcome": "success",
                 "tokens": {"total_tokens": 1200}, "cost": {"estimated_cost_usd": 12.5}},
                {"id": "run-2", "issue_identifier": "A-2", "agent_kind": "eu", "outcome": "success",
                 "tokens": {"total_tokens": 0}, "cost": {"estimated_cost_usd": null, "other_currency": {"amount": 1.5, "currency": "EUR"}}},
                {"id": "run-3", "issue_identifier": "A-3", "agent_kind": "free", "outcome": "running",
                 "tokens": {"total_tokens": 10}, "cost": {"estimated_cost_usd": null}}]}});
        let out = render_cost(&body);
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[0].last(), Some(&"USD"));
        assert_eq!(lines[1].last(), Some(&"0.018"), "{out}");
        // Each row has the spec's eight columns, its USD cell one value.
        assert!(lines[1..4].iter().all(|l| l.len() == 8), "{out}");
        assert_eq!(lines[2][7], "n/a", "{out}");
        assert_eq!(lines[3].last(), Some(&"n/a"), "{out}");
        assert_eq!(lines[5], ["other", "currencies", "(not", "in", "USD)"]);
        assert_eq!(lines[6], ["AGENT", "AMOUNT", "CURRENCY"]);
        assert_eq!(lines[7], ["eu", "1.50", "EUR"], "{out}");
        assert_eq!(
            lines[10],
            [
                "ID", "ISSUE", "AGENT", "TOKENS", "USD", "OUTCOME", "OTHER", "CURRENCY"
            ]
        );
        assert_eq!(lines[11][4..], ["12.50", "success", "-", "-"], "{out}");
        assert_eq!(lines[12][4..], ["n/a", "success", "1.50", "EUR"], "{out}");
        assert_eq!(lines[13][4], "n/a", "{out}");
        assert_eq!(usd(&json!(0.000001)), "0.000001");
        assert_eq!(usd(&json!(0)), "0.00");
    }

    /// Runs whose agent met a rate limit: counted on the summary line (only when there are
    /// some), and their outcome and failure shown as the run recorded them.
    #[test]
    fn rate_limited_runs_are_counted_and_shown() {
        let body = json!({"view": "runs", "summary": {"total": 2, "running": 0, "success": 1, "failed": 0, "stalled": 0, "canceled": 0, "rate_limited": 1},
            "runs": [{"id": "run-2", "issue_identifier": "A-1", "agent_kind": "agent_b", "outcome": "success", "retry_attempt": 0, "turn_count": 1,
                      "tokens": {"total_tokens": 10}, "duration_ms": 900, "session_id": "s2"},
                     {"id": "run-1", "issue_identifier": "A-1", "agent_kind": "agent_a", "outcome": "rate_limited", "retry_attempt": 0, "turn_count": 1,
                      "tokens": {"total_tokens": 0}, "duration_ms": 400, "session_id": "s1"}]});
        let out = render_list(&body);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "total 2  running 0  success 1  failed 0  stalled 0  canceled 0  rate_limited 1"
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>()[..4],
            ["run-1", "A-1", "agent_a", "rate_limited"],
            "{out}"
        );
        let none = json!({"view": "runs", "summary": {"total": 0, "running": 0, "success": 0, "failed": 0, "stalled": 0, "canceled": 0, "rate_limited": 0}, "runs": []});
        assert_eq!(
            render_list(&none).lines().next(),
            Some("total 0  running 0  success 0  failed 0  stalled 0  canceled 0")
        );
        let run = json!({"view": "run", "run": {"id": "run-1", "outcome": "rate_limited",
            "failure_reason": "agent_rate_limited: You've hit your limit · resets 8:30am"}});
        let card = render_run(&run);
        assert!(card.contains("outcome      rate_limited\n"), "{card}");
        assert!(
            card.contains(
                "failure      agent_rate_limited: You've hit your limit · resets 8:30am\n"
            ),
            "{card}"
        );
    }

    #[test]
    fn list_view_renders_summary_and_table() {
        let body = json!({"view": "runs", "summary": {"total": 1, "running": 0, "success": 1, "failed": 0, "stalled": 0, "canceled": 0},
            "runs": [{"id": "run-1", "issue_identifier": "A-1", "agent_kind": "demo", "outcome": "success", "retry_attempt": 0, "turn_count": 2,
                      "tokens": {"total_tokens": 2400}, "duration_ms": 1500, "session_id": "demo-12345-1-2"}]});
        let out = render_list(&body);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "total 1  running 0  success 1  failed 0  stalled 0  canceled 0"
        );
        assert_eq!(
            lines[1],
            "ID     ISSUE  AGENT  OUTCOME  ATTEMPT  TURNS  TOKENS  DURATION  SESSION"
        );
        assert_eq!(
            lines[2],
            "run-1  A-1    demo   success  0        2      2400    1.5s      demo-12345-1-2"
        );
    }

    #[test]
    fn request_paths_carry_every_flag() {
        let a = RunsArgs {
            issue: Some("A 1".into()),
            failed: true,
            limit: Some(5),
            ..Default::default()
        };
        assert_eq!(
            request_path(&a),
            "/api/v1/runs?issue=A%201&failed=true&limit=5"
        );
        assert_eq!(request_path(&RunsArgs::default()), "/api/v1/runs");
        let a = RunsArgs {
            workflow_name: Some("team a".into()),
            ..Default::default()
        };
        assert_eq!(request_path(&a), "/api/v1/runs?workflow=team%20a");
    }

    /// Runs of a daemon serving several workflows carry theirs: a WORKFLOW column after ID
    /// (and a line of the run view); runs without one keep the table of one workflow.
    #[test]
    fn runs_with_a_workflow_get_a_workflow_column() {
        let run = |id: &str, wf: &str| {
            json!({"id": id, "workflow": wf, "issue_identifier": "A-1", "agent_kind": "demo", "outcome": "success",
                   "retry_attempt": 0, "turn_count": 1, "tokens": {"total_tokens": 10}, "duration_ms": 5, "session_id": "s"})
        };
        let body = json!({"view": "runs", "summary": {}, "runs": [run("run-1", "alpha"), run("run-2", "beta")]});
        let out = render_list(&body);
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[1][..3], ["ID", "WORKFLOW", "ISSUE"], "{out}");
        assert_eq!(lines[2][..3], ["run-1", "alpha", "A-1"], "{out}");
        assert_eq!(lines[3][..3], ["run-2", "beta", "A-1"], "{out}");
        let detail = render_run(&json!({"view": "run", "run": run("run-1", "alpha"),
            "related_runs": [run("run-0", "alpha")]}));
        assert!(detail.contains("workflow     alpha\n"), "{detail}");
        assert!(detail.contains("ID     WORKFLOW  ISSUE"), "{detail}");
        let mut one = run("run-1", "alpha");
        one.as_object_mut().unwrap().remove("workflow");
        let out = render_list(&json!({"view": "runs", "summary": {}, "runs": [one]}));
        assert!(!out.contains("WORKFLOW"), "{out}");
    }

    #[test]
    fn a_404_names_the_unknown_workflow() {
        let a = RunsArgs {
            workflow_name: Some("gamma".into()),
            ..Default::default()
        };
        let body =
            r#"{"error": {"code": "workflow_not_found", "message": "No workflow of that name"}}"#;
        assert_eq!(
            not_found(&a, body),
            "The daemon serves no workflow named \"gamma\" (svc status lists its workflows)"
        );
        let run_body = r#"{"error": {"code": "run_not_found", "message": "Run not found"}}"#;
        assert_eq!(not_found(&a, run_body), "Run not found");
        assert_eq!(not_found(&RunsArgs::default(), body), "Run not found");
    }
}
