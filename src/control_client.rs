//! The operator's commands that act on a running daemon (`svc status`, `svc refresh`, `svc stop`,
//! `svc open`, `svc steer`): finding the daemon of a workflow and its control token, then
//! blocking requests. It holds no state.
//!
//! A daemon records where it serves in its lock file (`url`, beside `pid` and `owner_id`) and
//! writes its control token beside it (`<lock>.token`, mode 0600) unless `SVC_CONTROL_TOKEN`
//! set it. Daemons sharing a claim store hold numbered sibling lock files; each one that is held
//! is asked in turn.
//!
//! Failures carry their exit status: [`NO_DAEMON`], [`TOKEN_REFUSED`], [`NO_ANSWER`], else 1.
//! The token never appears in a message: only the file it was read from is named.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::env::Env;
use crate::lockfile;
use crate::runs_client::{issue_slot, na};
use crate::time::human;

/// `svc steer <ISSUE> <MESSAGE|-> [WORKFLOW.md]`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SteerArgs {
    pub issue: String,
    /// The message; `-` reads it from standard input.
    pub message: String,
    pub author: Option<String>,
    pub url: Option<String>,
    pub port: Option<u16>,
    pub workflow: Option<PathBuf>,
}

/// `svc status [--json] [--open] [WORKFLOW.md]`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StatusArgs {
    pub json: bool,
    /// Also print the dashboard's loopback URL carrying the control token in its fragment.
    pub open: bool,
    pub url: Option<String>,
    pub port: Option<u16>,
    pub workflow: Option<PathBuf>,
}

/// What `svc refresh`, `svc stop` and `svc open` do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Action {
    /// `POST /api/v1/refresh`.
    #[default]
    Refresh,
    /// `POST /api/v1/stop`.
    Stop,
    /// Print the dashboard's URL with the control token in its fragment.
    Open,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Refresh => "svc refresh",
            Action::Stop => "svc stop",
            Action::Open => "svc open",
        }
    }
}

/// `svc refresh|stop|open [--url URL] [--port PORT] [WORKFLOW.md]`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ControlArgs {
    pub action: Action,
    pub url: Option<String>,
    pub port: Option<u16>,
    pub workflow: Option<PathBuf>,
}

/// Exit status when no daemon runs for the workflow.
pub const NO_DAEMON: u8 = 3;
/// Exit status when the control token is refused or cannot be read.
pub const TOKEN_REFUSED: u8 = 4;
/// Exit status when the daemon does not answer (or its heartbeat is stale).
pub const NO_ANSWER: u8 = 5;

/// Why a command failed, and the exit status that says so.
#[derive(Debug, PartialEq, Eq)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::new(1, message)
    }
}

/// A live daemon of the workflow: where it serves and its control token.
#[derive(Debug)]
pub struct Found {
    pub url: String,
    pub token: String,
    pub lock: PathBuf,
}

/// A live daemon of the workflow: where it serves, and its lock file (empty when only the
/// flags named it).
#[derive(Clone, Debug)]
pub struct Target {
    pub url: String,
    pub lock: PathBuf,
}

/// The held lock files of `workflow` (the first, then its numbered siblings).
fn held_locks(env: &Env, workflow: &Path) -> Vec<PathBuf> {
    let base = lockfile::lock_path(&lockfile::daemon_dir(env), workflow);
    lockfile::siblings(&base)
        .filter(|p| lockfile::held(p))
        .collect()
}

/// Every live daemon of `workflow` and where it serves. `url` and `port` (the flags)
/// override the address its lock file records.
pub fn locate(
    env: &Env,
    workflow: &Path,
    url: Option<&str>,
    port: Option<u16>,
) -> Result<Vec<Target>, Failure> {
    let locks = held_locks(env, workflow);
    let fixed = url
        .map(str::to_string)
        .or_else(|| port.map(|p| format!("http://127.0.0.1:{p}")));
    let recorded: Vec<(PathBuf, Option<String>)> = locks
        .into_iter()
        .map(|lock| {
            let url = lockfile::recorded_url(&lock);
            (lock, url)
        })
        .collect();
    // An address given names one daemon: the one whose lock recorded it, else one svc cannot
    // tie to a lock (its end is then seen on `/health`).
    if let Some(url) = fixed {
        let lock = recorded
            .into_iter()
            .find(|(_, u)| u.as_deref() == Some(url.as_str()))
            .map(|(lock, _)| lock)
            .unwrap_or_default();
        return Ok(vec![Target { url, lock }]);
    }
    if recorded.is_empty() {
        return Err(Failure::new(
            NO_DAEMON,
            format!(
                "no svc daemon is running for {} (no held lock file); start one, or pass --url",
                workflow.display()
            ),
        ));
    }
    let found: Vec<Target> = recorded
        .into_iter()
        .filter_map(|(lock, url)| Some(Target { url: url?, lock }))
        .collect();
    if found.is_empty() {
        return Err(Failure::new(
            NO_ANSWER,
            "the daemon serves no HTTP API (started with --no-dashboard?); nothing to send to",
        ));
    }
    Ok(found)
}

/// The control token of the daemon holding `lock`: `SVC_CONTROL_TOKEN`, else the token file
/// beside the lock.
pub fn token(env: &Env, lock: &Path) -> Result<String, Failure> {
    if let Some(t) = env.non_empty(crate::process::CONTROL_TOKEN_VAR) {
        return Ok(t.to_string());
    }
    if lock.as_os_str().is_empty() {
        return Err(Failure::new(
            TOKEN_REFUSED,
            "no daemon lock file here to read its control token from; set SVC_CONTROL_TOKEN",
        ));
    }
    let path = lock.with_extension("token");
    let mut text = String::new();
    fs::File::open(&path)
        .and_then(|mut f| f.read_to_string(&mut text))
        .map_err(|e| {
            Failure::new(
                TOKEN_REFUSED,
                format!(
                    "cannot read the control token {} ({e}); set SVC_CONTROL_TOKEN to the daemon's token",
                    path.display()
                ),
            )
        })?;
    Ok(text.trim().to_string())
}

/// Every live daemon of `workflow`, with the URL and token to reach it. `url` and `port` (the
/// flags) override where it serves; `SVC_CONTROL_TOKEN` overrides the token file.
pub fn find(
    env: &Env,
    workflow: &Path,
    url: Option<&str>,
    port: Option<u16>,
) -> Result<Vec<Found>, Failure> {
    locate(env, workflow, url, port)?
        .iter()
        .map(|t| found(env, t))
        .collect()
}

/// `target` with its control token.
fn found(env: &Env, target: &Target) -> Result<Found, Failure> {
    Ok(Found {
        token: token(env, &target.lock)?,
        url: target.url.clone(),
        lock: target.lock.clone(),
    })
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// One answer of a daemon: its status and its body as JSON (null when it is not JSON), and the
/// error message of a `{"error": {...}}` body (or the body's text).
struct Answer {
    status: u16,
    body: Value,
    why: String,
}

/// Sends one request (`token` as Bearer when given); a transport failure is [`NO_ANSWER`].
fn request(
    method: &str,
    base: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Result<Answer, Failure> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let mut req = ureq::http::Request::builder().method(method).uri(&url);
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    if body.is_some() {
        req = req.header("Content-Type", "application/json");
    }
    let req = req
        .body(body.unwrap_or("").to_string())
        .map_err(|e| Failure::new(1, format!("bad request to {base}: {e}")))?;
    let mut resp = agent().run(req).map_err(|e| {
        Failure::new(
            NO_ANSWER,
            format!("the daemon at {base} does not answer ({e})"),
        )
    })?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let why = body
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or(text.trim())
        .to_string();
    Ok(Answer { status, body, why })
}

/// The failure of a 401: the token was refused; the hint names where it came from.
fn refused(env: &Env, target: &Found, why: &str) -> Failure {
    let from = if env.non_empty(crate::process::CONTROL_TOKEN_VAR).is_some() {
        "SVC_CONTROL_TOKEN".to_string()
    } else {
        target.lock.with_extension("token").display().to_string()
    };
    Failure::new(
        TOKEN_REFUSED,
        format!(
            "the daemon at {} refused the control token ({why}); check {from}",
            target.url
        ),
    )
}

/// Whether the daemon takes the token, asked with a request that can change nothing: a steer
/// whose body is empty is refused (401) before it is read, or else invalid (400).
fn check_token(env: &Env, daemon: &Found) -> Result<(), Failure> {
    let answer = request(
        "POST",
        &daemon.url,
        "/api/v1/-/steer",
        Some(&daemon.token),
        None,
    )?;
    match answer.status {
        401 => Err(refused(env, daemon, &answer.why)),
        // Past the token check: the empty message is invalid, or no issue is named `-`.
        400 | 404 => Ok(()),
        status => Err(Failure::new(
            NO_ANSWER,
            format!(
                "the daemon at {} answered HTTP {status} when the token was checked: {}",
                daemon.url, answer.why
            ),
        )),
    }
}

/// The dashboard's URL with the token for `daemon` (`svc open`, `svc status --open`), once the
/// daemon has taken the token, so a URL that would only be refused is never printed; a warning
/// when the address is not a loopback one.
fn open_line(env: &Env, daemon: &Found) -> Result<String, Failure> {
    check_token(env, daemon)?;
    if !is_loopback(&daemon.url) {
        eprintln!(
            "svc: warning: {} is not a loopback address; the token would travel over plain HTTP",
            daemon.url
        );
    }
    Ok(open_url(&daemon.url, &daemon.token))
}

/// A control request's answer when the daemon accepted it (202); a refused token or any other
/// answer is the failure to report.
fn accepted(env: &Env, daemon: &Found, answer: Answer) -> Result<Answer, Failure> {
    match answer.status {
        202 => Ok(answer),
        401 => Err(refused(env, daemon, &answer.why)),
        status => Err(Failure::new(
            1,
            format!(
                "the daemon at {} answered HTTP {status}: {}",
                daemon.url, answer.why
            ),
        )),
    }
}

/// `svc steer`: posts the message to each live daemon of the workflow until one knows the
/// issue; the line to print says where it went.
pub fn steer(a: &SteerArgs, workflow: &Path, env: &Env) -> Result<String, Failure> {
    let message = if a.message == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read the message from standard input: {e}"))?;
        text
    } else {
        a.message.clone()
    };
    if message.trim().is_empty() {
        return Err(Failure::new(1, "the message is empty"));
    }
    let author = a
        .author
        .clone()
        .or_else(|| env.non_empty("USER").map(str::to_string))
        .unwrap_or_else(|| "operator".into());
    let path = format!(
        "/api/v1/{}/steer",
        percent_encoding::utf8_percent_encode(&a.issue, percent_encoding::NON_ALPHANUMERIC)
    );
    let body = json!({"message": message, "author": author}).to_string();
    let mut last = Failure::new(1, String::new());
    for daemon in find(env, workflow, a.url.as_deref(), a.port)? {
        let answer = request("POST", &daemon.url, &path, Some(&daemon.token), Some(&body))?;
        match answer.status {
            202 => {
                return Ok(match answer.body["delivery"].as_str() {
                    Some("running") => format!(
                        "sent to the running agent of {}: it is its next turn",
                        a.issue
                    ),
                    _ => format!(
                        "{} is not running now: the message waits for its next run",
                        a.issue
                    ),
                });
            }
            404 => {
                last = Failure::new(
                    1,
                    format!("{} is neither running nor waiting in this daemon", a.issue),
                )
            }
            401 => return Err(refused(env, &daemon, &answer.why)),
            status => {
                return Err(Failure::new(
                    1,
                    format!("the daemon answered HTTP {status}: {}", answer.why),
                ));
            }
        }
    }
    Err(last)
}

/// The dashboard's URL for `base` with the control token in its fragment: browsers never send
/// a fragment to a server, and the page moves it to the tab's session storage at once.
pub fn open_url(base: &str, token: &str) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
    /// What a fragment keeps as written: the characters of unreserved URLs (RFC 3986).
    const KEEP: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    format!(
        "{}/#token={}",
        base.trim_end_matches('/'),
        percent_encoding::utf8_percent_encode(token, KEEP)
    )
}

/// Whether `base` (`http://host:port`) names a loopback address.
fn is_loopback(base: &str) -> bool {
    let host = base
        .split_once("://")
        .map_or(base, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or("");
    let host = host
        .rsplit_once(':')
        .map_or(host, |(h, _)| h)
        .trim_matches(['[', ']']);
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `svc refresh`, `svc stop` and `svc open`, for every live daemon of the workflow; the text
/// to print.
pub fn control(a: &ControlArgs, workflow: &Path, env: &Env) -> Result<String, Failure> {
    let mut out = String::new();
    for daemon in find(env, workflow, a.url.as_deref(), a.port)? {
        match a.action {
            Action::Open => {
                out.push_str(&open_line(env, &daemon)?);
                out.push('\n');
            }
            Action::Refresh => {
                let answer = request(
                    "POST",
                    &daemon.url,
                    "/api/v1/refresh",
                    Some(&daemon.token),
                    None,
                )?;
                if accepted(env, &daemon, answer)?.body["coalesced"] == true {
                    out.push_str(&format!(
                        "{}: a poll is already under way; the refresh is coalesced into it\n",
                        daemon.url
                    ));
                } else {
                    out.push_str(&format!("{}: poll and reconcile queued\n", daemon.url));
                }
            }
            Action::Stop => {
                let pid = request("GET", &daemon.url, "/api/v1/daemon", None, None)
                    .ok()
                    .and_then(|a| a.body["pid"].as_u64());
                let answer = request(
                    "POST",
                    &daemon.url,
                    "/api/v1/stop",
                    Some(&daemon.token),
                    None,
                )?;
                accepted(env, &daemon, answer)?;
                let who = pid.map_or_else(
                    || daemon.url.clone(),
                    |p| format!("pid {p} at {}", daemon.url),
                );
                if wait_gone(&daemon, STOP_WAIT) {
                    out.push_str(&format!("stopped the daemon ({who})\n"));
                } else {
                    return Err(Failure::new(
                        NO_ANSWER,
                        format!(
                            "asked the daemon ({who}) to stop, but it has not exited after {} s",
                            STOP_WAIT.as_secs()
                        ),
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// How long `svc stop` waits for the daemon to exit (it stops within 6 s of the request).
const STOP_WAIT: Duration = Duration::from_secs(15);

/// Waits until the daemon has released its lock (the last thing it does), or, named by the
/// flags alone, until it no longer answers.
fn wait_gone(daemon: &Found, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let gone = if daemon.lock.as_os_str().is_empty() {
            request("GET", &daemon.url, "/health", None, None).is_err()
        } else {
            !lockfile::held(&daemon.lock)
        };
        if gone {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What `svc status` read from one daemon.
struct Read1 {
    url: String,
    daemon: Value,
    state: Value,
}

/// `svc status`: one screen (or `--json`) per live daemon of the workflow. A stale heartbeat
/// is a failure ([`NO_ANSWER`]) after the screen is printed.
pub fn status(a: &StatusArgs, workflow: &Path, env: &Env) -> Result<String, Failure> {
    let targets = locate(env, workflow, a.url.as_deref(), a.port)?;
    let mut reads = Vec::new();
    for t in &targets {
        let state = request("GET", &t.url, "/api/v1/state", None, None)?;
        if state.status != 200 || !state.body.is_object() {
            return Err(Failure::new(
                NO_ANSWER,
                format!(
                    "the daemon at {} answered HTTP {} to /api/v1/state: {}",
                    t.url, state.status, state.why
                ),
            ));
        }
        let daemon = request("GET", &t.url, "/api/v1/daemon", None, None)?;
        reads.push(Read1 {
            url: t.url.clone(),
            daemon: if daemon.status == 200 {
                daemon.body
            } else {
                state.body["daemon"].clone()
            },
            state: state.body,
        });
    }
    let mut out = if a.json {
        let daemons: Vec<Value> = reads
            .iter()
            .map(|r| json!({"url": r.url, "daemon": r.daemon, "state": r.state}))
            .collect();
        format!("{:#}\n", json!({"daemons": daemons}))
    } else {
        let now = crate::time::unix_ms();
        reads
            .iter()
            .map(|r| render_status(&r.url, &r.daemon, &r.state, now))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if a.open {
        for t in &targets {
            out.push_str(&format!("\nopen {}\n", open_line(env, &found(env, t)?)?));
        }
    }
    if let Some(r) = reads.iter().find(|r| r.daemon["stale"] == true) {
        print!("{out}");
        return Err(Failure::new(
            NO_ANSWER,
            format!(
                "the daemon at {} is stale: its state thread has not published for {} ms",
                r.url, r.daemon["heartbeat_age_ms"]
            ),
        ));
    }
    Ok(out)
}

/// Milliseconds since the epoch of an RFC 3339 time.
fn ms_of(v: &Value) -> Option<u64> {
    crate::time::parse_ms(v.as_str()?)
}

/// An entry's issue (with its slot), qualified by its workflow when it carries one
/// (`alpha:ENG-1`, the form every command takes).
fn qualified(entry: &Value) -> String {
    match entry["workflow"].as_str() {
        Some(w) => format!("{w}:{}", issue_slot(entry)),
        None => issue_slot(entry),
    }
}

/// The status screen of one daemon: a pure function of what it answered and the time.
pub fn render_status(url: &str, daemon: &Value, state: &Value, now: u64) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| out.push_str(&format!("{label:<12}{value}\n"));
    line(
        "daemon",
        format!(
            "pid {} on {} · {}",
            na(&daemon["pid"]),
            na(&daemon["hostname"]),
            na(&daemon["workflow_path"])
        ),
    );
    line("url", url.to_string());
    let up = ms_of(&daemon["started_at"]).map(|t| human(now.saturating_sub(t)));
    line(
        "started",
        format!(
            "{} (up {})",
            na(&daemon["started_at"]),
            up.unwrap_or_else(|| "n/a".into())
        ),
    );
    let age = daemon["heartbeat_age_ms"].as_u64().unwrap_or(0);
    line(
        "heartbeat",
        if daemon["stale"] == true {
            format!("STALE: {} ago", human(age))
        } else {
            format!("{:.1} s ago", age as f64 / 1000.0)
        },
    );
    // How far off a time is: `in 5 min`, `now` once it passed.
    let until = |v: &Value| match ms_of(v) {
        Some(t) if t > now => format!("in {}", human(t - now)),
        Some(_) => "now".to_string(),
        None => "n/a".to_string(),
    };
    let polling = &state["polling"];
    let next = if polling["in_flight"] == true {
        "polling now".to_string()
    } else {
        match ms_of(&polling["next_poll_at"]) {
            Some(t) if t > now => format!("in {}", human(t - now)),
            Some(_) => "due now".into(),
            None => "n/a".into(),
        }
    };
    line(
        "next poll",
        match polling["interval_ms"].as_u64() {
            Some(i) => format!("{next} (every {})", human(i)),
            None => next,
        },
    );
    let waiting = state["waiting_on_blockers"].as_array().map_or(0, Vec::len);
    let c = &state["counts"];
    line(
        "counts",
        format!(
            "running {} · retrying {} · blocked {} · waiting {}",
            na(&c["running"]),
            na(&c["retrying"]),
            na(&c["blocked"]),
            waiting
        ),
    );
    let u = &state["usage_totals"];
    line(
        "tokens",
        format!(
            "{} in · {} out · {} total · agent time {}",
            na(&u["input_tokens"]),
            na(&u["output_tokens"]),
            na(&u["total_tokens"]),
            human((u["seconds_running"].as_f64().unwrap_or(0.0) * 1000.0) as u64)
        ),
    );
    let p = &state["worker_pool"];
    line(
        "pool",
        if p.is_object() {
            format!(
                "{}: {} live, {} idle, {} leased, {} waiting · {} worker-s{}",
                na(&p["driver"]),
                na(&p["live"]),
                na(&p["idle"]),
                na(&p["leased"]),
                na(&p["waiting"]),
                na(&p["spend"]["worker_seconds"]),
                p["capped"]
                    .as_str()
                    .map_or(String::new(), |c| format!(" · CAPPED: {c}"))
            )
        } else {
            "none (runs execute on this host)".into()
        },
    );
    let l = &state["ledger"];
    let dollars = |v: &Value| match v.as_f64() {
        Some(usd) if usd > 0.0 => format!("${usd:.6}"),
        _ => "$n/a".into(),
    };
    line(
        "spend today",
        format!(
            "{} ({} UTC) · {} runs · {} tokens · {}",
            dollars(&l["today"]["cost_usd"]),
            na(&l["day"]),
            na(&l["today"]["runs"]),
            na(&l["today"]["total_tokens"]),
            match l["daily_budget_usd"].as_f64() {
                Some(b) if l["daily_budget_reached"] == true => {
                    format!("daily budget ${b} REACHED: no new run until 00:00 UTC")
                }
                Some(b) => format!("daily budget ${b}"),
                None => "no daily budget".into(),
            }
        ),
    );
    let cs = &state["claim_store"];
    line(
        "claim store",
        format!(
            "{} · owner {} · {} transactions · last {}",
            na(&cs["kind"]),
            na(&cs["owner_id"]),
            na(&cs["transactions_applied"]),
            na(&cs["last_operation"])
        ),
    );
    // One titled list of the state's `key`, a line per entry.
    let section = |out: &mut String, title: &str, key: &str, row: &dyn Fn(&Value) -> String| {
        let entries = state[key].as_array().map(Vec::as_slice).unwrap_or_default();
        out.push_str(&format!("\n{title} ({})\n", entries.len()));
        if entries.is_empty() {
            out.push_str("  none\n");
        }
        for e in entries {
            out.push_str(&format!("  {}\n", row(e)));
        }
    };
    // The workflows of a daemon serving several: each one's health and counts.
    if state["workflows"].is_array() {
        section(&mut out, "workflows", "workflows", &|w| {
            let polled = ms_of(&w["last_poll_at"]).map_or_else(
                || "never".into(),
                |t| format!("{} ago", human(now.saturating_sub(t))),
            );
            let mut row = format!(
                "{:<16} {:<8} running {} · retrying {} · blocked {} · last poll {polled}",
                na(&w["name"]),
                na(&w["status"]),
                na(&w["running"]),
                na(&w["retrying"]),
                na(&w["blocked"])
            );
            if let Some(e) = w["last_error"].as_str().filter(|e| !e.is_empty()) {
                row.push_str(&format!(" · error: {e}"));
            }
            row
        });
    }
    // The fleet: every daemon sharing the claim store (this one alone with a store of its own).
    if state["fleet"].as_array().is_some_and(|f| f.len() > 1) {
        section(&mut out, "fleet", "fleet", &|m| {
            format!(
                "{:<16} {}:{} · {} running · {} · {}{}{}",
                na(&m["owner_id"]),
                na(&m["hostname"]),
                na(&m["pid"]),
                na(&m["running"]),
                na(&m["workflow_path"]),
                m["url"].as_str().unwrap_or("no HTTP API"),
                if m["this"] == true {
                    " · this daemon"
                } else {
                    ""
                },
                if m["stale"] == true {
                    " · STALE: no heartbeat within the claim TTL"
                } else {
                    ""
                }
            )
        });
    }
    // Agent kinds cooling down after a rate limit: no run starts on them until their reset.
    if state["cooldowns"].as_array().is_some_and(|c| !c.is_empty()) {
        section(&mut out, "cooldowns", "cooldowns", &|c| {
            let kind = match c["workflow"].as_str() {
                Some(w) => format!("{w}:{}", na(&c["agent_kind"])),
                None => na(&c["agent_kind"]),
            };
            format!(
                "{kind} rate limited until {}, {} ({}){}",
                na(&c["until"]),
                until(&c["until"]),
                na(&c["reason"]),
                if c["scope"] == "host" {
                    " · this host's account only"
                } else {
                    ""
                }
            )
        });
    }
    section(&mut out, "running", "running", &|r| {
        let mut row = format!(
            "{:<14} {:<12} {:<10} turn {} · {} tok · up {} · {}",
            qualified(r),
            na(&r["state"]),
            na(&r["agent_kind"]),
            na(&r["turn_count"]),
            na(&r["tokens"]["total_tokens"]),
            ms_of(&r["started_at"]).map_or_else(|| "n/a".into(), |t| human(now.saturating_sub(t))),
            na(&r["last_event"])
        );
        if r["claimed"] == false {
            row.push_str(" · claiming its slot");
        }
        if r["reserving"] == true {
            row.push_str(" · acquiring a worker slot");
        }
        if let Some(h) = r["worker_host"].as_str() {
            row.push_str(&format!(" · on {h}"));
        }
        if r["steering_turns"].as_u64().unwrap_or(0) > 0
            || r["steering_pending"].as_u64().unwrap_or(0) > 0
        {
            row.push_str(&format!(
                " · steering {} turn(s), {} waiting",
                na(&r["steering_turns"]),
                na(&r["steering_pending"])
            ));
        }
        if r["spend"].is_object() {
            row.push_str(&format!(
                " · issue spent {} tok {} in {} run(s)",
                na(&r["spend"]["total_tokens"]),
                dollars(&r["spend"]["cost_usd"]),
                na(&r["spend"]["runs"])
            ));
        }
        row
    });
    section(&mut out, "retrying", "retrying", &|r| {
        let due = match ms_of(&r["due_at"]) {
            Some(t) if t > now => format!("in {}", human(t - now)),
            Some(_) => "now".into(),
            None => "n/a".into(),
        };
        format!(
            "{:<14} attempt {} · due {due} · {}",
            qualified(r),
            na(&r["attempt"]),
            na(&r["error"])
        )
    });
    section(&mut out, "blocked", "blocked", &|b| {
        let mut row = format!(
            "{:<14} {:<12} {}",
            qualified(b),
            na(&b["state"]),
            na(&b["label"])
        );
        if let Some(kind) = b["agent_kind"].as_str() {
            row.push_str(&format!(
                ": {kind} until {}, {}",
                na(&b["reset_at"]),
                until(&b["reset_at"])
            ));
        }
        row
    });
    section(&mut out, "waiting", "waiting_on_blockers", &|w| {
        let blockers: Vec<String> = w["blockers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| format!("{} ({})", na(&b["identifier"]), na(&b["state"])))
            .collect();
        format!(
            "{:<14} {:<12} blocked by {}{}",
            qualified(w),
            na(&w["state"]),
            blockers.join(", "),
            if w["cycle"] == true {
                " · a cycle of blockers"
            } else {
                ""
            }
        )
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_url_carries_the_token_in_its_fragment_only() {
        assert_eq!(
            open_url("http://127.0.0.1:4040/", "a+b/c_d-e"),
            "http://127.0.0.1:4040/#token=a%2Bb%2Fc_d-e"
        );
        assert!(is_loopback("http://127.0.0.1:4040"));
        assert!(is_loopback("http://[::1]:4040"));
        assert!(is_loopback("http://localhost:1"));
        assert!(!is_loopback("http://10.0.0.5:4040"));
    }

    #[test]
    fn durations_read_like_people_write_them() {}

    #[test]
    fn the_status_screen_names_every_part() {
        let daemon = json!({"pid": 7, "hostname": "h", "workflow_path": "/w/WORKFLOW.md",
            "started_at": "2026-01-01T00:00:00Z", "heartbeat_age_ms": 300, "stale": false});
        let state = json!({
            "polling": {"in_flight": false, "next_poll_at": "2026-01-01T01:00:12Z", "interval_ms": 30000},
            "counts": {"running": 1, "retrying": 1, "blocked": 0},
            "usage_totals": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15, "seconds_running": 61.0},
            "worker_pool": null,
            "claim_store": {"kind": "sqlite", "owner_id": "o1", "transactions_applied": 4, "last_operation": "claim"},
            "running": [{"issue_identifier": "ENG-1", "state": "Todo", "agent_kind": "demo", "turn_count": 2,
                "tokens": {"total_tokens": 15}, "started_at": "2026-01-01T00:59:00Z", "last_event": "turn_completed",
                "ensemble_size": 1, "steering_turns": 1, "steering_pending": 0,
                "spend": {"total_tokens": 4015, "cost_usd": 0.25, "runs": 3}}],
            "ledger": {"day": "2026-01-01", "today": {"cost_usd": 1.5, "runs": 4, "total_tokens": 9000},
                "daily_budget_usd": 2.0, "daily_budget_reached": false},
            "retrying": [{"issue_identifier": "ENG-2", "attempt": 2, "due_at": "2026-01-01T01:00:30Z", "error": "boom", "ensemble_size": 2, "slot_index": 1}],
            "blocked": [],
            "waiting_on_blockers": [{"issue_identifier": "ENG-3", "state": "Todo", "blockers": [{"identifier": "ENG-1", "state": "Todo"}], "cycle": false}]
        });
        let now = ms_of(&json!("2026-01-01T01:00:00Z")).unwrap();
        let screen = render_status("http://127.0.0.1:4040", &daemon, &state, now);
        for part in [
            "daemon      pid 7 on h · /w/WORKFLOW.md",
            "(up 1 h 0 min)",
            "heartbeat   0.3 s ago",
            "next poll   in 12 s (every 30 s)",
            "running 1 · retrying 1 · blocked 0 · waiting 1",
            "agent time 1 min 1 s",
            "none (runs execute on this host)",
            "sqlite · owner o1 · 4 transactions · last claim",
            "running (1)\n  ENG-1",
            "turn 2 · 15 tok · up 1 min 0 s · turn_completed · steering 1 turn(s), 0 waiting · issue spent 4015 tok $0.250000 in 3 run(s)",
            "spend today $1.500000 (2026-01-01 UTC) · 4 runs · 9000 tokens · daily budget $2",
            "ENG-2[1/2]     attempt 2 · due in 30 s · boom",
            "blocked (0)\n  none",
            "ENG-3          Todo         blocked by ENG-1 (Todo)",
        ] {
            assert!(screen.contains(part), "{part:?} missing from:\n{screen}");
        }
        assert!(!screen.contains("workflows ("), "{screen}");
        assert!(!screen.contains("cooldowns ("), "{screen}");
    }

    /// Agent kinds cooling down after a rate limit: a line each with the reset, how far off it
    /// is, and why; a blocked issue waiting for one names the kind and its reset.
    #[test]
    fn the_status_screen_lists_cooling_agent_kinds() {
        let daemon = json!({"pid": 7, "hostname": "h", "workflow_path": "/w/WORKFLOW.md",
            "started_at": "2026-01-01T00:00:00Z", "heartbeat_age_ms": 300, "stale": false});
        let state = json!({
            "counts": {"running": 0, "retrying": 0, "blocked": 1},
            "cooldowns": [
                {"agent_kind": "agent_a", "until": "2026-01-01T01:30:00Z", "since": "2026-01-01T00:55:00Z",
                 "reason": "You've hit your limit · resets 1:30am (UTC)", "scope": "fleet"},
                {"workflow": "beta", "agent_kind": "agent_b", "until": "2026-01-01T00:59:00Z", "since": "2026-01-01T00:44:00Z",
                 "reason": "429", "scope": "host"}],
            "running": [], "retrying": [], "waiting_on_blockers": [],
            "blocked": [{"issue_identifier": "ENG-4", "state": "Todo", "reason": "agent_rate_limited",
                "label": "agent rate limited", "agent_kind": "agent_a", "reset_at": "2026-01-01T01:30:00Z"}]
        });
        let now = ms_of(&json!("2026-01-01T01:00:00Z")).unwrap();
        let screen = render_status("http://127.0.0.1:4040", &daemon, &state, now);
        for part in [
            "\ncooldowns (2)\n",
            "  agent_a rate limited until 2026-01-01T01:30:00Z, in 30 min 0 s (You've hit your limit · resets 1:30am (UTC))\n",
            "  beta:agent_b rate limited until 2026-01-01T00:59:00Z, now (429) · this host's account only\n",
            "ENG-4          Todo         agent rate limited: agent_a until 2026-01-01T01:30:00Z, in 30 min 0 s\n",
        ] {
            assert!(screen.contains(part), "{part:?} missing from:\n{screen}");
        }
    }

    /// A daemon serving several workflows: a line per workflow (its health, counts, last poll
    /// and error), and each entry's issue qualified by its workflow.
    #[test]
    fn the_status_screen_has_a_line_per_workflow() {
        let daemon = json!({"pid": 7, "hostname": "h", "workflow_path": "/w/wf/alpha.md",
            "started_at": "2026-01-01T00:00:00Z", "heartbeat_age_ms": 300, "stale": false});
        let state = json!({
            "counts": {"running": 1, "retrying": 0, "blocked": 0},
            "workflows": [
                {"name": "alpha", "path": "/w/wf/alpha.md", "tracker_kind": "work", "running": 1, "retrying": 0,
                 "blocked": 0, "last_poll_at": "2026-01-01T00:59:55Z", "last_error": null, "status": "ok"},
                {"name": "beta", "path": "/w/wf/beta.md", "tracker_kind": "work", "running": 0, "retrying": 0,
                 "blocked": 2, "last_poll_at": null, "last_error": "board missing", "status": "failing"}],
            "running": [{"workflow": "alpha", "issue_identifier": "ENG-1", "state": "Todo", "agent_kind": "demo",
                "turn_count": 1, "tokens": {"total_tokens": 1}, "started_at": "2026-01-01T00:59:00Z", "ensemble_size": 1}],
            "retrying": [], "blocked": [], "waiting_on_blockers": []
        });
        let now = ms_of(&json!("2026-01-01T01:00:00Z")).unwrap();
        let screen = render_status("http://127.0.0.1:4040", &daemon, &state, now);
        for part in [
            "\nworkflows (2)\n",
            "  alpha            ok       running 1 · retrying 0 · blocked 0 · last poll 5 s ago\n",
            "  beta             failing  running 0 · retrying 0 · blocked 2 · last poll never · error: board missing\n",
            "running (1)\n  alpha:ENG-1    Todo",
        ] {
            assert!(screen.contains(part), "{part:?} missing from:\n{screen}");
        }
    }
}
