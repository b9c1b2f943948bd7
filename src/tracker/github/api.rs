//! GitHub's REST v3 and GraphQL APIs as the `github` tracker and pack use them, kept far inside
//! GitHub's rate limits:
//!
//! * Every REST read is conditional: the last `ETag` of each URL is kept with its body (the
//!   shared [`ConditionalCache`]), and GitHub answers an unchanged resource `304 Not Modified`,
//!   which costs no rate limit.
//! * The `x-ratelimit-*` headers of each answer are kept per resource (`core`, `graphql`) for
//!   the snapshot's `rate_limits`.
//! * A primary limit (403 or 429 with `x-ratelimit-remaining: 0`, or GraphQL's `RATE_LIMITED`)
//!   pauses that resource until `x-ratelimit-reset`; a secondary limit (403 or 429 with
//!   `retry-after`, or GitHub's "secondary rate limit" message) pauses every request for
//!   `retry-after`, or a minute doubling with each strike. While paused, requests fail at once
//!   without touching the network, so a poll fails fast and running work is left alone.
//!
//! Reads are retried on transport errors and 5xx; writes that must not be applied twice
//! (comments, new issues) never are. The token never appears in an error.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::config::Secret;
use crate::tracker::TrackerError;
use crate::tracker::http::{self, ConditionalCache};

/// Attempts of a read (the first and the retries) on transport errors and 5xx.
const READ_ATTEMPTS: u32 = 3;
/// The longest pause a secondary limit without `retry-after` grows to.
const MAX_SECONDARY: Duration = Duration::from_secs(15 * 60);

/// A REST read's answer: the JSON body (from the cache on a 304) and the next page, if any.
pub struct Got {
    pub value: Value,
    pub next: Option<String>,
    /// Whether GitHub answered 304 (the body came from the cache).
    pub not_modified: bool,
    /// The `x-oauth-scopes` header (classic tokens only), for `svc doctor`.
    pub scopes: Option<String>,
}

/// A list read page by page: its items, and whether the last page was reached.
pub struct Listed {
    pub items: Vec<Value>,
    /// False when `max_pages` pages were read and GitHub named another.
    pub complete: bool,
}

#[derive(Default)]
struct Limits {
    /// The last `x-ratelimit-*` values per resource.
    resources: serde_json::Map<String, Value>,
    /// Requests of a resource wait until then (primary limits).
    paused: HashMap<String, Instant>,
    /// Every request waits until then (secondary limits).
    paused_all: Option<Instant>,
    /// Secondary limits met in a row (each doubles the pause).
    strikes: u32,
    /// The cost of the last GraphQL query, as `rateLimit` reported it.
    last_cost: Option<i64>,
}

pub struct Api {
    agent: ureq::Agent,
    rest: String,
    graphql: String,
    token: Secret,
    cache: ConditionalCache,
    limits: Mutex<Limits>,
    /// Base delay between read attempts (tests make it small).
    pub backoff: Duration,
}

/// Which budget a request spends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Resource {
    Core,
    Graphql,
}

impl Resource {
    fn name(self) -> &'static str {
        match self {
            Resource::Core => "core",
            Resource::Graphql => "graphql",
        }
    }
}

struct Answer {
    status: u16,
    body: String,
    etag: Option<String>,
    next: Option<String>,
    scopes: Option<String>,
}

impl Api {
    pub fn new(rest: &str, graphql: &str, token: Secret) -> Api {
        Api {
            agent: crate::tracker::http::agent(Duration::from_secs(30)),
            rest: rest.trim_end_matches('/').to_string(),
            graphql: graphql.to_string(),
            token,
            cache: ConditionalCache::default(),
            limits: Mutex::default(),
            backoff: Duration::from_millis(500),
        }
    }

    /// `path` (starting with `/`) under the REST base, or a full URL (a `Link` header's) as is.
    pub fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            path.to_string()
        } else {
            format!("{}{path}", self.rest)
        }
    }

    /// The rate limits GitHub last reported, per resource, and a pause under way.
    pub fn rate_limits(&self) -> Option<Value> {
        let l = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        if l.resources.is_empty() && l.paused_all.is_none() && l.paused.is_empty() {
            return None;
        }
        let mut out = l.resources.clone();
        let now = Instant::now();
        let paused = l
            .paused
            .values()
            .chain(l.paused_all.iter())
            .filter(|t| **t > now)
            .max()
            .map(|t| t.duration_since(now).as_secs());
        if let Some(secs) = paused {
            out.insert("paused_for_s".into(), json!(secs));
        }
        if let Some(cost) = l.last_cost {
            out.insert("graphql_last_cost".into(), json!(cost));
        }
        Some(Value::Object(out))
    }

    /// A conditional GET of `path`: GitHub's 304 gives back the cached body. 404 is
    /// [`TrackerError::not_found`]; any other failure names the status and GitHub's message.
    pub fn get(&self, path: &str) -> Result<Got, TrackerError> {
        let url = self.url(path);
        let etag = self.cache.etag(&url);
        let result = self.exchange(
            READ_ATTEMPTS,
            Resource::Core,
            "GET",
            &url,
            None,
            etag.as_deref(),
            |answer| match answer.status {
                304 => match self.cache.kept(&url) {
                    Some((body, next)) => Step::Done(parse(&body).map(|value| Got {
                        value,
                        next,
                        not_modified: true,
                        scopes: answer.scopes,
                    })),
                    None => Step::Again("HTTP 304 for a URL it has no copy of".into()),
                },
                200..=299 => Step::Done(parse(&answer.body).map(|value| {
                    if let Some(etag) = answer.etag {
                        self.cache
                            .remember(url.clone(), etag, answer.body, answer.next.clone());
                    }
                    Got {
                        value,
                        next: answer.next,
                        not_modified: false,
                        scopes: answer.scopes,
                    }
                })),
                s if s >= 500 => Step::Again(format!("HTTP {s}")),
                s => Step::Done(Err(status_error("GET", path, s, &answer.body))),
            },
        );
        result.map_err(|f| {
            f.or_else(|last| {
                format!(
                    "github GET {} failed after {READ_ATTEMPTS} attempts: {last}",
                    shown(path)
                )
            })
        })
    }

    /// Every item of a paginated list (following `Link: rel="next"` to the end); more than
    /// `max_pages` pages is an error (a list svc must read whole, or not use).
    pub fn get_all(&self, path: &str, max_pages: usize) -> Result<Vec<Value>, TrackerError> {
        let listed = self.get_list(path, max_pages)?;
        if !listed.complete {
            return Err(TrackerError::unavailable(format!(
                "github GET {} has more than {max_pages} pages: svc reads at most that many",
                shown(path)
            )));
        }
        Ok(listed.items)
    }

    /// The items of a paginated list (following `Link: rel="next"`), at most `max_pages`
    /// pages; each page is a conditional read of its own. [`Listed::complete`] says whether the
    /// list ended there.
    pub fn get_list(&self, path: &str, max_pages: usize) -> Result<Listed, TrackerError> {
        let mut items = Vec::new();
        let mut next = Some(path.to_string());
        for _ in 0..max_pages {
            let Some(p) = next.take() else { break };
            let got = self.get(&p)?;
            match got.value {
                Value::Array(list) => items.extend(list),
                other => {
                    return Err(TrackerError::unavailable(format!(
                        "github GET {} answered {} where a list was expected",
                        shown(&p),
                        kind_of(&other)
                    )));
                }
            }
            next = got.next;
        }
        Ok(Listed {
            items,
            complete: next.is_none(),
        })
    }

    /// A write (`PATCH`, `POST`, `PUT`, `DELETE`). `idempotent` writes (a label set, a state)
    /// are sent again after a transport error or 5xx; others (a comment, a new issue) never,
    /// since the first may have landed.
    pub fn write(
        &self,
        method: &str,
        path: &str,
        body: &Value,
        idempotent: bool,
    ) -> Result<Value, TrackerError> {
        let url = self.url(path);
        let text = (!body.is_null()).then(|| body.to_string());
        let attempts = if idempotent { READ_ATTEMPTS } else { 1 };
        let result = self.exchange(
            attempts,
            Resource::Core,
            method,
            &url,
            text.as_deref(),
            None,
            |answer| match answer.status {
                200..=299 if answer.body.trim().is_empty() => Step::Done(Ok(Value::Null)),
                200..=299 => Step::Done(parse(&answer.body)),
                s if s >= 500 && idempotent => Step::Again(format!("HTTP {s}")),
                s => Step::Done(Err(status_error(method, path, s, &answer.body))),
            },
        );
        result.map_err(|f| {
            f.or_else(|last| {
                format!(
                    "github {method} {} failed{}: {last}",
                    shown(path),
                    if idempotent {
                        " after retries"
                    } else {
                        " (it may have been applied)"
                    }
                )
            })
        })
    }

    /// A GraphQL document; returns `data`. `errors` fail it, except that with `partial` the
    /// `NOT_FOUND` and `FORBIDDEN` ones (a node gone, a field the token may not read) are left
    /// for the caller (the `data` then has `null` where they were).
    pub fn graphql(
        &self,
        query: &str,
        variables: Value,
        partial: bool,
    ) -> Result<Value, TrackerError> {
        let mutation = query.trim_start().starts_with("mutation");
        let body = json!({"query": query, "variables": variables}).to_string();
        let attempts = if mutation { 1 } else { READ_ATTEMPTS };
        let result = self.exchange(
            attempts,
            Resource::Graphql,
            "POST",
            &self.graphql,
            Some(&body),
            None,
            |answer| {
                if answer.status >= 500 {
                    return Step::Again(format!("HTTP {}", answer.status));
                }
                if !(200..300).contains(&answer.status) {
                    return Step::Done(Err(status_error(
                        "POST",
                        "/graphql",
                        answer.status,
                        &answer.body,
                    )));
                }
                Step::Done(parse(&answer.body).and_then(|parsed| self.data(parsed, partial)))
            },
        );
        result.map_err(|f| {
            f.or_else(|last| {
                format!(
                    "github GraphQL request failed{}: {last}",
                    if mutation {
                        " (it may have been applied)"
                    } else {
                        " after retries"
                    }
                )
            })
        })
    }

    /// The `data` of a GraphQL answer, noting its cost; its `errors` as the error.
    fn data(&self, parsed: Value, partial: bool) -> Result<Value, TrackerError> {
        if let Some(cost) = parsed
            .pointer("/data/rateLimit/cost")
            .and_then(Value::as_i64)
        {
            self.limits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .last_cost = Some(cost);
        }
        let errors: Vec<&Value> = parsed
            .get("errors")
            .and_then(Value::as_array)
            .map(|e| e.iter().collect())
            .unwrap_or_default();
        fn kind<'v>(e: &&'v Value) -> &'v str {
            e.get("type").and_then(Value::as_str).unwrap_or("")
        }
        if errors.iter().any(|e| kind(e) == "RATE_LIMITED") {
            let wait = self.pause_primary(Resource::Graphql, None);
            return Err(TrackerError::unavailable(format!(
                "github GraphQL rate limit reached: GraphQL requests wait {}s for the limit to reset",
                wait.as_secs()
            )));
        }
        let fatal: Vec<&&Value> = errors
            .iter()
            .filter(|e| !(partial && matches!(kind(e), "NOT_FOUND" | "FORBIDDEN")))
            .collect();
        if !fatal.is_empty() {
            let msg = fatal
                .iter()
                .filter_map(|e| e.get("message").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("; ");
            let not_found = fatal.iter().all(|e| kind(e) == "NOT_FOUND");
            let message = format!("github GraphQL error: {msg}");
            return Err(if not_found {
                TrackerError::not_found(message)
            } else {
                TrackerError::unavailable(message)
            });
        }
        Ok(parsed.get("data").cloned().unwrap_or(Value::Null))
    }

    /// Sends a request up to `attempts` times, the backoff doubling between: `handle` turns
    /// an answer into the result, or asks for another attempt (saying why); a transport error
    /// is tried again too.
    #[allow(clippy::too_many_arguments)]
    fn exchange<T>(
        &self,
        attempts: u32,
        resource: Resource,
        method: &str,
        url: &str,
        body: Option<&str>,
        etag: Option<&str>,
        mut handle: impl FnMut(Answer) -> Step<T>,
    ) -> Result<T, Failed> {
        let mut last = String::new();
        for attempt in 0..attempts {
            if attempt > 0 {
                std::thread::sleep(self.backoff * 2u32.pow(attempt - 1));
            }
            match self.send(resource, method, url, body, etag) {
                Err(Failure::Transport(e)) => last = e,
                Err(Failure::Final(e)) => return Err(Failed::Error(e)),
                Ok(answer) => match handle(answer) {
                    Step::Done(result) => return result.map_err(Failed::Error),
                    Step::Again(why) => last = why,
                },
            }
        }
        Err(Failed::Exhausted(last))
    }

    /// How long requests of `resource` must still wait, if they must.
    fn paused(&self, resource: Resource) -> Option<Duration> {
        let l = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        l.paused_all
            .iter()
            .chain(l.paused.get(resource.name()))
            .filter(|t| **t > now)
            .max()
            .map(|t| t.duration_since(now))
    }

    /// Pauses `resource` until its reset (epoch seconds; the last reported one when `None`).
    fn pause_primary(&self, resource: Resource, reset: Option<u64>) -> Duration {
        let mut l = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        let reset = reset.or_else(|| {
            l.resources
                .get(resource.name())
                .and_then(|r| r.get("reset"))
                .and_then(Value::as_u64)
        });
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let wait = Duration::from_secs(
            reset
                .map_or(60, |r| r.saturating_sub(now).saturating_add(1))
                .min(3600),
        );
        l.paused
            .insert(resource.name().to_string(), Instant::now() + wait);
        wait
    }

    fn pause_secondary(&self, retry_after: Option<Duration>) -> Duration {
        let mut l = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        let wait = retry_after.unwrap_or_else(|| {
            (Duration::from_secs(60) * 2u32.pow(l.strikes.min(4))).min(MAX_SECONDARY)
        });
        l.strikes += 1;
        l.paused_all = Some(Instant::now() + wait);
        wait
    }

    fn send(
        &self,
        resource: Resource,
        method: &str,
        url: &str,
        body: Option<&str>,
        etag: Option<&str>,
    ) -> Result<Answer, Failure> {
        if let Some(wait) = self.paused(resource) {
            return Err(Failure::Final(TrackerError::unavailable(format!(
                "github rate limit: requests are paused for {}s more",
                wait.as_secs().max(1)
            ))));
        }
        let auth = format!("Bearer {}", self.token.expose());
        let mut builder = ureq::http::Request::builder()
            .method(method)
            .uri(url)
            .header("Accept", "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28")
            .header("User-Agent", concat!("svc/", env!("CARGO_PKG_VERSION")))
            .header("Authorization", &auth);
        if let Some(tag) = etag {
            builder = builder.header("If-None-Match", tag);
        }
        let sent = match body {
            Some(b) => builder
                .header("Content-Type", "application/json")
                .body(b.to_string())
                .map(|r| self.agent.run(r)),
            None => builder.body(()).map(|r| self.agent.run(r)),
        };
        let mut resp = match sent {
            Err(e) => {
                return Err(Failure::Final(TrackerError::invalid(format!(
                    "github: bad request: {e}"
                ))));
            }
            Ok(Err(e)) => return Err(Failure::Transport(e.to_string())),
            Ok(Ok(r)) => r,
        };
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let number = |name: &str| header(name).and_then(|v| v.trim().parse::<u64>().ok());
        let remaining = number("x-ratelimit-remaining");
        let reset = number("x-ratelimit-reset");
        // A wait past the longest pause is taken as the longest (and cannot overflow a clock).
        let retry_after =
            number("retry-after").map(|s| Duration::from_secs(s.min(MAX_SECONDARY.as_secs())));
        let etag = header("etag");
        let scopes = header("x-oauth-scopes");
        let next = header("link").and_then(|l| http::next_link(&l));
        self.note(&resp, resource);
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        if status == 403 || status == 429 {
            let secondary = retry_after.is_some() || text.contains("secondary rate limit");
            if remaining == Some(0) && !secondary {
                let wait = self.pause_primary(resource, reset);
                return Err(Failure::Final(TrackerError::unavailable(format!(
                    "github rate limit reached (HTTP {status}): {} requests wait {}s for the limit to reset",
                    resource.name(),
                    wait.as_secs()
                ))));
            }
            if secondary || status == 429 {
                let wait = self.pause_secondary(retry_after);
                return Err(Failure::Final(TrackerError::unavailable(format!(
                    "github secondary rate limit (HTTP {status}): every request waits {}s",
                    wait.as_secs()
                ))));
            }
        } else if status < 400 {
            self.limits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .strikes = 0;
        }
        Ok(Answer {
            status,
            body: text,
            etag,
            next,
            scopes,
        })
    }

    /// Keeps the `x-ratelimit-*` headers under the resource GitHub names (else `resource`).
    fn note(&self, resp: &ureq::http::Response<ureq::Body>, resource: Resource) {
        let mut found = serde_json::Map::new();
        let mut name = resource.name().to_string();
        for (k, v) in resp.headers() {
            let Some(field) = k.as_str().strip_prefix("x-ratelimit-") else {
                continue;
            };
            let Ok(v) = v.to_str() else { continue };
            if field == "resource" {
                name = v.to_string();
            } else if let Ok(n) = v.parse::<i64>() {
                found.insert(field.to_string(), json!(n));
            }
        }
        if !found.is_empty() {
            self.limits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .resources
                .insert(name, Value::Object(found));
        }
    }
}

enum Failure {
    /// The request may not have reached GitHub (a read can be sent again).
    Transport(String),
    Final(TrackerError),
}

/// What an answer means to [`Api::exchange`].
enum Step<T> {
    Done(Result<T, TrackerError>),
    /// Try again (if attempts are left), for this reason.
    Again(String),
}

/// How [`Api::exchange`] failed.
enum Failed {
    Error(TrackerError),
    /// Every attempt was used; the last reason.
    Exhausted(String),
}

impl Failed {
    /// The error, an exhausted exchange's built from its last reason.
    fn or_else(self, message: impl FnOnce(String) -> String) -> TrackerError {
        match self {
            Failed::Error(e) => e,
            Failed::Exhausted(last) => TrackerError::unavailable(message(last)),
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// How github's errors read (the shared REST pieces in `tracker::http`).
const ERRORS: http::RestErrors = http::RestErrors {
    provider: "github",
    unauthorized: "check the github api_key or GITHUB_TOKEN",
    forbidden: "the token lacks a permission this needs",
    invalid: &[422],
};

fn parse(body: &str) -> Result<Value, TrackerError> {
    ERRORS.parse(body)
}

fn shown(path: &str) -> &str {
    http::path_shown(path)
}

fn status_error(method: &str, path: &str, status: u16, body: &str) -> TrackerError {
    ERRORS.status(method, path, status, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's `retry-after` is untrusted: the largest number there is pauses for the
    /// longest pause, not past a clock's end.
    #[test]
    fn a_huge_retry_after_pauses_for_the_longest_pause() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let body = r#"{"message":"You have exceeded a secondary rate limit."}"#;
            let _ = write!(
                conn,
                "HTTP/1.1 403 Forbidden\r\nretry-after: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                u64::MAX,
                body.len()
            );
        });
        let api = Api::new(&base, &format!("{base}/graphql"), Secret::new("t"));
        let Err(e) = api.get("/repos/acme/app") else {
            panic!("a 403 is an error")
        };
        server.join().unwrap();
        assert!(e.to_string().contains("secondary"), "{e}");
        let paused = api.rate_limits().unwrap()["paused_for_s"].as_u64().unwrap();
        assert!(paused <= MAX_SECONDARY.as_secs() && paused > 60, "{paused}");
    }

    #[test]
    fn the_next_page_comes_from_the_link_header() {
        let link = r#"<https://api.github.com/repositories/1/issues?page=2>; rel="next", <https://api.github.com/repositories/1/issues?page=5>; rel="last""#;
        assert_eq!(
            http::next_link(link).as_deref(),
            Some("https://api.github.com/repositories/1/issues?page=2")
        );
        assert_eq!(
            http::next_link(r#"<https://x/?page=1>; rel="prev", <https://x/?page=1>; rel="first""#),
            None
        );
    }

    #[test]
    fn errors_show_githubs_message_and_never_the_query() {
        let e = status_error(
            "GET",
            "/repos/a/b/issues?labels=x",
            401,
            r#"{"message":"Bad credentials"}"#,
        );
        assert_eq!(
            e.message,
            "github GET /repos/a/b/issues answered HTTP 401: Bad credentials (check the github api_key or GITHUB_TOKEN)"
        );
        assert_eq!(
            status_error("GET", "/x", 404, "").kind,
            crate::tracker::TrackerErrorKind::NotFound
        );
    }
}
