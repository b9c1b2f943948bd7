//! The one HTTP request loop of the trackers ([`Rest::exchange`]): a request with a profile's
//! headers (and a provider's token), an optional conditional GET (the shared
//! [`ConditionalCache`]), retries with a doubling backoff (or the wait the service named), and
//! rate-limit pauses decided by the one policy trait, [`RatePolicy`]. What an answer means is
//! the caller's: a handler turns each attempt (an answer, or a transport error) into the result
//! or another attempt.
//!
//! Two kinds of client are built on it:
//!
//! * [`Rest`] with a provider's [`Profile`] (GitHub, GitLab): JSON reads and writes, 404 and
//!   the provider's errors worded, pages followed. Reads are retried on transport errors and
//!   5xx; writes that must not be applied twice (comments, notes, new issues) never are.
//! * [`HttpClient`], the raw profile (tracker-a, tracker-b, tracker-b-mcp, chat-a, chat-b):
//!   full URLs and the caller's own headers, [`RAW_ATTEMPTS`] attempts, sent again on 429, 5xx
//!   and transport errors after `Retry-After` (or a 429 body's `retry_after`) or the backoff,
//!   and the reply given back as it is; [`Resend::IfNotApplied`] for writes that must not land
//!   twice.
//!
//! The policies ([`PerResource`] for GitHub, [`Budget`] for GitLab, [`Reported`] for the raw
//! profile) live in [`super::rate`].
//!
//! While paused, requests fail at once without touching the network, so a poll fails fast and
//! running work is left alone. Credentials never appear in an error.

use std::time::Duration;

use serde_json::Value;

use crate::config::Secret;
use crate::tracker::TrackerError;
use crate::tracker::http::{self, ConditionalCache, RestErrors, header};
use crate::tracker::rate::{RatePolicy, Reported};

/// Attempts of a read (the first and the retries) on transport errors and 5xx.
pub const READ_ATTEMPTS: u32 = 3;
/// The resource REST requests spend (a [`PerResource`] policy keeps others, such as GraphQL's).
pub const CORE: &str = "core";
/// Redirects within the endpoint's origin followed at most (with [`Profile::same_origin`]).
const REDIRECTS: usize = 3;

/// How one provider's REST API is spoken.
pub struct Profile {
    /// How its errors read (its name among them).
    pub errors: RestErrors,
    /// The `Accept` header.
    pub accept: &'static str,
    /// Headers every request carries besides `Accept`, `User-Agent` and `Authorization`.
    pub headers: &'static [(&'static str, &'static str)],
    /// Reads are conditional (`If-None-Match` with the last `ETag`, a 304 answered from the
    /// kept body).
    pub conditional: bool,
    /// The token goes to the endpoint's origin only: no redirect is followed by the HTTP
    /// agent, one within the origin is followed here, one to another origin is refused.
    pub same_origin: bool,
    /// A list's next page may come as `X-Next-Page` (a page number) when there is no `Link`.
    pub x_next_page: bool,
    /// Requests carry svc's `User-Agent` (the raw profile's never did: the HTTP agent's goes).
    pub user_agent: bool,
}

/// One request: what it spends, and what it sends.
pub struct Request<'a> {
    /// Who asks, as its errors name it (`github`, `chat-a`).
    pub what: &'a str,
    /// The rate-limit resource it spends ([`CORE`] for REST).
    pub resource: &'a str,
    pub method: &'a str,
    pub url: &'a str,
    /// JSON, for methods that take one.
    pub body: Option<&'a str>,
    /// Sent as `If-None-Match`.
    pub etag: Option<&'a str>,
    /// Headers of this request besides the profile's (a raw client's own credentials).
    pub headers: &'a [(&'a str, &'a str)],
}

/// An answer that no rate limit refused.
pub struct Answer {
    pub status: u16,
    pub body: String,
    /// Names lowercase.
    pub headers: Vec<(String, String)>,
    /// The next page's URL, if the answer names one.
    pub next: Option<String>,
}

impl Answer {
    /// The first value of a header (`name` lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

/// What an answer means to [`Rest::exchange`].
pub enum Step<T> {
    Done(Result<T, TrackerError>),
    /// Try again (if attempts are left), for this reason.
    Again(String),
    /// Try again after `wait` when the service said how long (else the backoff), for `why`;
    /// when no attempt is left, the result is `last` (the raw client gives back its reply).
    Retry {
        why: String,
        wait: Option<Duration>,
        last: T,
    },
}

/// What one attempt came to: an answer, or the transport error of a request that may not have
/// reached the service.
pub type Sent = Result<Answer, String>;

/// How [`Rest::exchange`] failed.
pub enum Failed {
    Error(TrackerError),
    /// Every attempt was used; the last reason.
    Exhausted(String),
}

impl Failed {
    /// The error, an exhausted exchange's built from its last reason.
    pub fn or_else(self, message: impl FnOnce(String) -> String) -> TrackerError {
        match self {
            Failed::Error(e) => e,
            Failed::Exhausted(last) => TrackerError::unavailable(message(last)),
        }
    }
}

enum Failure {
    /// The request may not have reached the service (a read can be sent again).
    Transport(String),
    Final(TrackerError),
}

/// A REST read's answer: the JSON body (from the cache on a 304) and the next page, if any.
#[derive(Debug)]
pub struct Got {
    pub value: Value,
    pub next: Option<String>,
    /// Whether the service answered 304 (the body came from the cache).
    pub not_modified: bool,
    /// The answer's headers, names lowercase.
    pub headers: Vec<(String, String)>,
}

impl Got {
    /// The first value of a header (`name` lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

/// A list read page by page: its items, and whether the last page was reached.
pub struct Listed {
    pub items: Vec<Value>,
    /// False when `max_pages` pages were read and the service named another.
    pub complete: bool,
    /// The last page read (`path`, or the next-page URL an answer named), where a later read
    /// of a list that only grows at its end can go on from.
    pub last_page: String,
}

/// A provider's REST client.
pub struct Rest<P> {
    profile: &'static Profile,
    agent: ureq::Agent,
    base: String,
    /// The endpoint's origin (where the token may go, with [`Profile::same_origin`]).
    origin: Option<String>,
    /// Sent as `Authorization: Bearer` (the raw profile's callers send their own headers).
    token: Option<Secret>,
    cache: Option<ConditionalCache>,
    /// The rate-limit policy and its state.
    pub limits: P,
    /// Base delay between attempts (tests make it small).
    pub backoff: Duration,
}

impl<P: RatePolicy> Rest<P> {
    /// A client of the API at `endpoint`.
    pub fn new(profile: &'static Profile, endpoint: &str, token: Secret, limits: P) -> Rest<P> {
        let mut rest = Rest::raw(profile, Duration::from_secs(30), limits);
        rest.base = endpoint.trim_end_matches('/').to_string();
        rest.origin = http::origin(&rest.base);
        rest.token = Some(token);
        rest
    }

    /// A client of full URLs whose callers bring their own credentials, its requests timing
    /// out after `timeout` (see [`http::agent`]).
    pub fn raw(profile: &'static Profile, timeout: Duration, limits: P) -> Rest<P> {
        Rest {
            profile,
            agent: http::agent(timeout, !profile.same_origin),
            base: String::new(),
            origin: None,
            token: None,
            cache: profile.conditional.then(ConditionalCache::default),
            limits,
            backoff: Duration::from_millis(500),
        }
    }

    fn provider(&self) -> &'static str {
        self.profile.errors.provider
    }

    /// How this provider's errors read.
    pub fn errors(&self) -> &'static RestErrors {
        &self.profile.errors
    }

    /// `path` (starting with `/`) under the API base, or a full URL (a `Link` header's) as is.
    pub fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            path.to_string()
        } else {
            format!("{}{path}", self.base)
        }
    }

    /// The rate limits the service last reported, and a pause under way.
    pub fn rate_limits(&self) -> Option<Value> {
        self.limits.snapshot()
    }

    /// A GET of `path`, conditional with [`Profile::conditional`] (a 304 gives back the kept
    /// body). 404 is [`TrackerError::not_found`]; any other failure names the status and the
    /// service's message.
    pub fn get(&self, path: &str) -> Result<Got, TrackerError> {
        let url = self.url(path);
        let cache = self.cache.as_ref();
        let etag = cache.and_then(|c| c.etag(&url));
        let request = Request {
            what: self.provider(),
            resource: CORE,
            method: "GET",
            url: &url,
            body: None,
            etag: etag.as_deref(),
            headers: &[],
        };
        let result = self.exchange(READ_ATTEMPTS, &request, |sent| {
            let answer = match sent {
                Ok(answer) => answer,
                Err(e) => return Step::Again(e),
            };
            match (answer.status, cache) {
                (304, Some(cache)) => match cache.kept(&url) {
                    Some((body, next)) => Step::Done(self.errors().parse(&body).map(|value| Got {
                        value,
                        next,
                        not_modified: true,
                        headers: answer.headers,
                    })),
                    None => Step::Again("HTTP 304 for a URL it has no copy of".into()),
                },
                (200..=299, _) => Step::Done(self.errors().parse(&answer.body).map(|value| {
                    if let (Some(cache), Some(etag)) = (cache, answer.header("etag")) {
                        cache.remember(
                            url.clone(),
                            etag.to_string(),
                            answer.body,
                            answer.next.clone(),
                        );
                    }
                    Got {
                        value,
                        next: answer.next,
                        not_modified: false,
                        headers: answer.headers,
                    }
                })),
                (s, _) if s >= 500 => Step::Again(format!("HTTP {s}")),
                (s, _) => Step::Done(Err(self.errors().status("GET", path, s, &answer.body))),
            }
        });
        result.map_err(|f| {
            f.or_else(|last| {
                format!(
                    "{} GET {} failed after {READ_ATTEMPTS} attempts: {last}",
                    self.provider(),
                    http::path_shown(path)
                )
            })
        })
    }

    /// The items of a paginated list (following the next page each answer names), at most
    /// `max_pages` pages; each page is a read of its own. [`Listed::complete`] says whether the
    /// list ended there.
    pub fn get_list(&self, path: &str, max_pages: usize) -> Result<Listed, TrackerError> {
        let mut items = Vec::new();
        let mut next = Some(path.to_string());
        let mut last_page = path.to_string();
        for _ in 0..max_pages {
            let Some(p) = next.take() else { break };
            let got = self.get(&p)?;
            match got.value {
                Value::Array(list) => items.extend(list),
                other => {
                    return Err(TrackerError::unavailable(format!(
                        "{} GET {} answered {} where a list was expected",
                        self.provider(),
                        http::path_shown(&p),
                        kind_of(&other)
                    )));
                }
            }
            next = got.next;
            last_page = p;
        }
        Ok(Listed {
            items,
            complete: next.is_none(),
            last_page,
        })
    }

    /// Every item of a paginated list; more than `max_pages` pages is an error (a list svc
    /// must read whole, or not use).
    pub fn get_all(&self, path: &str, max_pages: usize) -> Result<Vec<Value>, TrackerError> {
        let listed = self.get_list(path, max_pages)?;
        if !listed.complete {
            return Err(TrackerError::unavailable(format!(
                "{} GET {} has more than {max_pages} pages: svc reads at most that many",
                self.provider(),
                http::path_shown(path)
            )));
        }
        Ok(listed.items)
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
        let request = Request {
            what: self.provider(),
            resource: CORE,
            method,
            url: &url,
            body: text.as_deref(),
            etag: None,
            headers: &[],
        };
        let result = self.exchange(attempts, &request, |sent| match sent {
            Err(e) => Step::Again(e),
            Ok(a) if (200..=299).contains(&a.status) && a.body.trim().is_empty() => {
                Step::Done(Ok(Value::Null))
            }
            Ok(a) if (200..=299).contains(&a.status) => Step::Done(self.errors().parse(&a.body)),
            Ok(a) if a.status >= 500 && idempotent => Step::Again(format!("HTTP {}", a.status)),
            Ok(a) => Step::Done(Err(self.errors().status(method, path, a.status, &a.body))),
        });
        result.map_err(|f| {
            f.or_else(|last| {
                format!(
                    "{} {method} {} failed{}: {last}",
                    self.provider(),
                    http::path_shown(path),
                    if idempotent {
                        " after retries"
                    } else {
                        " (it may have been applied)"
                    }
                )
            })
        })
    }

    /// The one request loop: sends a request up to `attempts` times, the backoff doubling
    /// between (or the wait a [`Step::Retry`] names, never past [`http::MAX_WAIT`]). `handle`
    /// turns what an attempt came to (an answer, or a transport error) into the result, or asks
    /// for another attempt (saying why). A pause or a rate-limit refusal ends it at once.
    pub fn exchange<T>(
        &self,
        attempts: u32,
        request: &Request,
        mut handle: impl FnMut(Sent) -> Step<T>,
    ) -> Result<T, Failed> {
        let mut last = String::new();
        let mut wait = None;
        for attempt in 0..attempts {
            if attempt > 0 {
                let backoff = self.backoff * 2u32.pow(attempt - 1);
                std::thread::sleep(wait.take().unwrap_or(backoff).min(http::MAX_WAIT));
            }
            let sent = match self.send(request) {
                Err(Failure::Transport(e)) => Err(e),
                Err(Failure::Final(e)) => return Err(Failed::Error(e)),
                Ok(answer) => Ok(answer),
            };
            match handle(sent) {
                Step::Done(result) => return result.map_err(Failed::Error),
                Step::Again(why) => last = why,
                Step::Retry { last: value, .. } if attempt + 1 == attempts => return Ok(value),
                Step::Retry { why, wait: w, .. } => (last, wait) = (why, w),
            }
        }
        Err(Failed::Exhausted(last))
    }

    /// One request (following redirects within the endpoint's origin with
    /// [`Profile::same_origin`]), its answer shown to the rate-limit policy.
    fn send(&self, request: &Request) -> Result<Answer, Failure> {
        let provider = request.what;
        let method = request.method;
        if let Some(wait) = self.limits.paused_for(request.resource) {
            return Err(Failure::Final(TrackerError::unavailable(format!(
                "{provider} rate limit: requests are paused for {}s more",
                wait.as_secs().max(1)
            ))));
        }
        let mut url = request.url.to_string();
        for _ in 0..=REDIRECTS {
            // The token goes to the endpoint's origin and nowhere else.
            if self.profile.same_origin
                && (self.origin.is_none() || http::origin(&url) != self.origin)
            {
                return Err(Failure::Final(TrackerError::unavailable(format!(
                    "{provider}: {} is not on the endpoint's origin: svc does not send the token there",
                    http::path_shown(&url)
                ))));
            }
            let mut builder = ureq::http::Request::builder()
                .method(method)
                .uri(&url)
                .header("Accept", self.profile.accept);
            if self.profile.user_agent {
                builder = builder.header("User-Agent", concat!("svc/", env!("CARGO_PKG_VERSION")));
            }
            if let Some(token) = &self.token {
                builder = builder.header("Authorization", format!("Bearer {}", token.expose()));
            }
            for (name, value) in self.profile.headers.iter().chain(request.headers) {
                builder = builder.header(*name, *value);
            }
            if let Some(tag) = request.etag {
                builder = builder.header("If-None-Match", tag);
            }
            let sent = match request.body {
                Some(b) => builder
                    .header("Content-Type", "application/json")
                    .body(b.to_string())
                    .map(|r| self.agent.run(r)),
                None => builder.body(()).map(|r| self.agent.run(r)),
            };
            let mut resp = match sent {
                Err(e) => {
                    return Err(Failure::Final(TrackerError::invalid(format!(
                        "{provider}: bad request: {e}"
                    ))));
                }
                Ok(Err(e)) => return Err(Failure::Transport(e.to_string())),
                Ok(Ok(r)) => r,
            };
            let status = resp.status().as_u16();
            let headers: Vec<(String, String)> = resp
                .headers()
                .iter()
                .filter_map(|(n, v)| {
                    Some((
                        n.as_str().to_ascii_lowercase(),
                        v.to_str().ok()?.to_string(),
                    ))
                })
                .collect();
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            if self.profile.same_origin && matches!(status, 301 | 302 | 303 | 307 | 308) {
                let Some(location) = header(&headers, "location") else {
                    return Ok(Answer {
                        status,
                        body: text,
                        headers,
                        next: None,
                    });
                };
                let target = resolve(&url, location);
                if http::origin(&target) != self.origin {
                    return Err(Failure::Final(TrackerError::unavailable(format!(
                        "{provider} {method} {} answered a redirect to another origin ({}): svc does not follow it with the token; set the endpoint to the API's own address",
                        http::path_shown(&url),
                        http::origin(&target).unwrap_or_else(|| "an unknown place".into())
                    ))));
                }
                // Only a GET can be repeated as it is after these.
                if method != "GET" && (301..=303).contains(&status) {
                    return Err(Failure::Final(TrackerError::unavailable(format!(
                        "{provider} {method} {} answered HTTP {status} (a redirect svc does not repeat a write for)",
                        http::path_shown(&url)
                    ))));
                }
                url = target;
                continue;
            }
            if let Some(refusal) = self
                .limits
                .answered(request.resource, status, &headers, &text)
            {
                return Err(Failure::Final(refusal.error(provider, status)));
            }
            let next = header(&headers, "link")
                .and_then(http::next_link)
                .or_else(|| {
                    header(&headers, "x-next-page")
                        .filter(|_| self.profile.x_next_page)
                        .map(str::trim)
                        .filter(|p| !p.is_empty())
                        .map(|p| with_page(&url, p))
                });
            return Ok(Answer {
                status,
                body: text,
                headers,
                next,
            });
        }
        Err(Failure::Final(TrackerError::unavailable(format!(
            "{provider} {method} {}: more than {REDIRECTS} redirects",
            http::path_shown(&url)
        ))))
    }
}

/// Attempts per request of the raw profile (the first try and the retries).
pub const RAW_ATTEMPTS: u32 = 4;

/// The raw profile: full URLs, the caller's own headers, no `User-Agent` of svc's, redirects
/// followed by the HTTP agent. Its name in errors is each request's.
static RAW: Profile = Profile {
    errors: RestErrors {
        provider: "http",
        unauthorized: "check the credentials",
        forbidden: "the credentials lack a permission this needs",
        invalid: &[],
    },
    accept: "application/json",
    headers: &[],
    conditional: false,
    same_origin: false,
    x_next_page: false,
    user_agent: false,
};

/// A raw client's reply, as the service sent it.
pub struct Reply {
    pub status: u16,
    pub body: String,
    /// `Retry-After` (or a 429 body's `retry_after`), at most [`http::MAX_WAIT`].
    pub retry_after: Option<Duration>,
    /// An MCP server's `Mcp-Session-Id`, if it sent one.
    pub session_id: Option<String>,
    /// The `X-RateLimit-*` headers, names lowercased (chat-b keeps per-route buckets).
    pub ratelimit: Vec<(String, String)>,
}

impl Reply {
    fn of(answer: Answer) -> Reply {
        let mut retry_after = answer
            .header("retry-after")
            .and_then(|v| http::seconds(v, http::MAX_WAIT));
        if answer.status == 429 {
            // A 429 body's `retry_after` (seconds, as Discord sends it) is more precise than
            // the header's whole seconds.
            if let Some(secs) = serde_json::from_str::<Value>(&answer.body)
                .ok()
                .and_then(|v| v["retry_after"].as_f64())
                .and_then(|s| http::seconds_f64(s, http::MAX_WAIT))
            {
                retry_after = Some(secs);
            }
        }
        Reply {
            status: answer.status,
            session_id: answer.header("mcp-session-id").map(str::to_string),
            ratelimit: (answer.headers.iter())
                .filter(|(n, _)| n.starts_with("x-ratelimit-") || n.starts_with("ratelimit-"))
                .cloned()
                .collect(),
            body: answer.body,
            retry_after,
        }
    }
}

/// When a raw client's failed request is sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resend {
    /// On 429, 5xx and transport errors.
    Always,
    /// Only when the service said it did not apply it (HTTP 429, or the caller's
    /// `retry_on`, such as Slack's `ratelimited`): for a write that must not be applied twice
    /// (a chat post). A 5xx reply is returned as it is and a transport error as `Err`: either
    /// way the write may have landed, and the caller finds out before it tries again.
    IfNotApplied,
}

impl<'a> Request<'a> {
    /// A raw client's request: a full URL, the caller's headers, `body` (JSON) only for
    /// methods that take one.
    pub fn raw(
        what: &'a str,
        method: &'a str,
        url: &'a str,
        headers: &'a [(&'a str, &'a str)],
        body: Option<&'a str>,
    ) -> Request<'a> {
        Request {
            what,
            resource: CORE,
            method,
            url,
            body,
            etag: None,
            headers,
        }
    }
}

/// The request loop with the raw profile, for the trackers that speak their own protocols over
/// HTTP (tracker-a, tracker-b, tracker-b-mcp, chat-a, chat-b): [`RAW_ATTEMPTS`] attempts, sent
/// again on 429, 5xx and transport errors after `Retry-After` or the backoff, and the reply
/// given back as it is (the last one when every attempt was transient). The rate-limit
/// headers a service reports are kept for the snapshot ([`Reported`]). Credentials never
/// appear in its errors.
pub struct HttpClient {
    rest: Rest<Reported>,
}

impl HttpClient {
    /// A client whose requests time out after `default`, or after `SVC_TRACKER_TIMEOUT_MS`
    /// milliseconds when that variable is set (an operator's knob for slow networks).
    pub fn new(default: Duration) -> HttpClient {
        HttpClient {
            rest: Rest::raw(&RAW, default, Reported::default()),
        }
    }

    /// The rate-limit information the service last reported, for the snapshot.
    pub fn last_rate_limits(&self) -> Option<Value> {
        self.rest.rate_limits()
    }

    /// Base delay of the exponential backoff.
    pub fn backoff(&self) -> Duration {
        self.rest.backoff
    }

    /// Sets the base delay of the exponential backoff (tests make it small).
    pub fn set_backoff(&mut self, backoff: Duration) {
        self.rest.backoff = backoff;
    }

    /// POSTs `body` as JSON with the given headers, retrying transient failures. `what` names
    /// the service in errors (never the credentials).
    pub fn post_json(
        &self,
        what: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
        retry_on: impl Fn(&Reply) -> bool,
    ) -> Result<Reply, TrackerError> {
        self.request(what, "POST", url, headers, Some(body), retry_on)
    }

    /// Any method; `body` (JSON) only for methods that take one. Sent again on 429, 5xx and
    /// transport errors: for reads and writes that are idempotent (or carry their own
    /// idempotency key, such as chat-b's `nonce`).
    pub fn request(
        &self,
        what: &str,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
        retry_on: impl Fn(&Reply) -> bool,
    ) -> Result<Reply, TrackerError> {
        let request = Request::raw(what, method, url, headers, body);
        self.send(&request, Resend::Always, retry_on)
    }

    /// Sends `request` ([`Request::raw`]), again as `resend` says, and on any reply
    /// `retry_on` asks for.
    pub fn send(
        &self,
        request: &Request,
        resend: Resend,
        retry_on: impl Fn(&Reply) -> bool,
    ) -> Result<Reply, TrackerError> {
        let what = request.what;
        let result = self.rest.exchange(RAW_ATTEMPTS, request, |sent| {
            let reply = match sent {
                Ok(answer) => Reply::of(answer),
                Err(e) if resend == Resend::IfNotApplied => {
                    return Step::Done(Err(TrackerError::unavailable(format!(
                        "{what} request failed (it may have been applied): {e}"
                    ))));
                }
                Err(e) => return Step::Again(e),
            };
            let transient = reply.status == 429
                || (reply.status >= 500 && resend == Resend::Always)
                || retry_on(&reply);
            if !transient {
                return Step::Done(Ok(reply));
            }
            Step::Retry {
                why: format!("HTTP {}", reply.status),
                wait: reply.retry_after,
                last: reply,
            }
        });
        result.map_err(|f| {
            f.or_else(|last| format!("{what} request failed after {RAW_ATTEMPTS} attempts: {last}"))
        })
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

/// A `Location` against the URL it answered.
fn resolve(url: &str, location: &str) -> String {
    if location.starts_with("http://") || location.starts_with("https://") {
        return location.to_string();
    }
    match http::origin(url) {
        Some(origin) if location.starts_with('/') => format!("{origin}{location}"),
        _ => location.to_string(),
    }
}

/// `url` with its `page` parameter set to `page`.
fn with_page(url: &str, page: &str) -> String {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let mut parts: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("page="))
        .map(str::to_string)
        .collect();
    parts.push(format!("page={}", http::enc(page)));
    format!("{path}?{}", parts.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracker::rate::tests::budget;
    use crate::tracker::rate::{PerResource, epoch_now};
    use serde_json::json;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn profile(conditional: bool, same_origin: bool) -> &'static Profile {
        Box::leak(Box::new(Profile {
            errors: RestErrors {
                provider: "test",
                unauthorized: "check the test token",
                forbidden: "the token lacks a permission",
                invalid: &[422],
            },
            accept: "application/json",
            headers: &[("X-Test", "1")],
            conditional,
            same_origin,
            x_next_page: true,
            user_agent: true,
        }))
    }

    /// A raw HTTP answer that closes its connection.
    fn reply(status: &str, headers: &[(&str, &str)], body: &str) -> String {
        let mut out = format!("HTTP/1.1 {status}\r\n");
        for (k, v) in headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str(&format!(
            "content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ));
        out
    }

    /// A server that answers each connection with the next scripted answer (past the script,
    /// `599`), and keeps the request heads it read.
    struct Server {
        base: String,
        stop: Arc<AtomicBool>,
        thread: std::thread::JoinHandle<Vec<String>>,
    }

    impl Server {
        fn start(script: Vec<String>) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.set_nonblocking(true).unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            let stop = Arc::new(AtomicBool::new(false));
            let stopping = stop.clone();
            let thread = std::thread::spawn(move || {
                let mut heads = Vec::new();
                let mut script = script.into_iter();
                while !stopping.load(Ordering::SeqCst) {
                    let Ok((mut conn, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    conn.set_nonblocking(false).unwrap();
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    heads.push(String::from_utf8_lossy(&seen).to_ascii_lowercase());
                    let answer = script
                        .next()
                        .unwrap_or_else(|| reply("599 Unexpected", &[], ""));
                    let _ = conn.write_all(answer.as_bytes());
                }
                heads
            });
            Server { base, stop, thread }
        }

        /// The request heads it read (lowercase).
        fn finish(self) -> Vec<String> {
            self.stop.store(true, Ordering::SeqCst);
            self.thread.join().unwrap()
        }
    }

    fn starts(e: &TrackerError, prefix: &str) {
        assert!(e.message.starts_with(prefix), "{}", e.message);
    }

    fn client<P: RatePolicy>(profile: &'static Profile, base: &str, limits: P) -> Rest<P> {
        let mut rest = Rest::new(profile, base, Secret::new("sekrit"), limits);
        rest.backoff = Duration::from_millis(1);
        rest
    }

    #[test]
    fn reads_are_sent_again_after_5xx_until_the_attempts_are_used() {
        let server = Server::start(vec![
            reply("500 Oops", &[], ""),
            reply("502 Bad Gateway", &[], ""),
            reply("200 OK", &[], "[1]"),
        ]);
        let rest = client(profile(false, false), &server.base, PerResource::default());
        let got = rest.get("/x").unwrap();
        assert_eq!(got.value, json!([1]));
        let heads = server.finish();
        assert_eq!(heads.len(), 3);
        assert!(heads[0].starts_with("get /x "), "{}", heads[0]);
        assert!(heads[0].contains("authorization: bearer sekrit"));
        assert!(heads[0].contains("x-test: 1"));

        let server = Server::start(vec![reply("503 Busy", &[], ""); 3]);
        let rest = client(profile(false, false), &server.base, PerResource::default());
        let Err(e) = rest.get("/x?token=q") else {
            panic!("three 5xx fail the read")
        };
        assert_eq!(e.message, "test GET /x failed after 3 attempts: HTTP 503");
        assert_eq!(server.finish().len(), READ_ATTEMPTS as usize);
    }

    #[test]
    fn a_write_that_may_have_landed_is_never_sent_again() {
        let server = Server::start(vec![
            reply("500 Oops", &[], r#"{"message":"boom"}"#),
            reply("503 Busy", &[], ""),
            reply("200 OK", &[], ""),
        ]);
        let rest = client(profile(false, false), &server.base, budget());
        // Not idempotent: a 5xx is the answer, not sent again.
        let e = rest
            .write("POST", "/notes", &json!({"body": "hi"}), false)
            .unwrap_err();
        assert_eq!(e.message, "test POST /notes answered HTTP 500: boom");
        // Idempotent: sent again, and an empty body is null.
        let v = rest.write("PUT", "/labels", &json!({}), true).unwrap();
        assert_eq!(v, Value::Null);
        let heads = server.finish();
        assert_eq!(heads.len(), 3);
        assert!(heads[0].contains("content-type: application/json"));

        // A transport error: a write not idempotent is tried once and may have landed.
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let rest = client(profile(false, false), &base, budget());
        let e = rest.write("POST", "/notes", &json!({}), false).unwrap_err();
        starts(&e, "test POST /notes failed (it may have been applied): ");
        let e = rest.write("PUT", "/labels", &json!({}), true).unwrap_err();
        starts(&e, "test PUT /labels failed after retries: ");
        assert!(!e.message.contains("sekrit"));
    }

    #[test]
    fn a_304_gives_back_the_kept_body_and_next_page() {
        let link = "<http://elsewhere/x?page=2>; rel=\"next\"";
        let server = Server::start(vec![
            reply("200 OK", &[("etag", "\"e1\""), ("link", link)], "[1,2]"),
            reply("304 Not Modified", &[("x-oauth-scopes", "repo")], ""),
        ]);
        let rest = client(profile(true, false), &server.base, PerResource::default());
        let first = rest.get("/x").unwrap();
        assert!(!first.not_modified);
        let second = rest.get("/x").unwrap();
        assert!(second.not_modified);
        assert_eq!(second.value, json!([1, 2]));
        assert_eq!(second.next.as_deref(), Some("http://elsewhere/x?page=2"));
        assert_eq!(second.header("x-oauth-scopes"), Some("repo"));
        let heads = server.finish();
        assert!(!heads[0].contains("if-none-match"), "{}", heads[0]);
        assert!(heads[1].contains("if-none-match: \"e1\""), "{}", heads[1]);

        // A 304 for a URL it has no copy of is asked again.
        let server = Server::start(vec![
            reply("304 Not Modified", &[], ""),
            reply("200 OK", &[], "{}"),
        ]);
        let rest = client(profile(true, false), &server.base, PerResource::default());
        assert_eq!(rest.get("/y").unwrap().value, json!({}));
        assert_eq!(server.finish().len(), 2);

        // Without a cache a 304 is an unexpected status, and nothing is kept.
        let server = Server::start(vec![
            reply("200 OK", &[("etag", "\"e1\"")], "[]"),
            reply("304 Not Modified", &[], ""),
        ]);
        let rest = client(profile(false, false), &server.base, budget());
        rest.get("/z").unwrap();
        let e = rest.get("/z").unwrap_err();
        assert_eq!(e.message, "test GET /z answered HTTP 304: ");
        assert!(!server.finish()[1].contains("if-none-match"));
    }

    #[test]
    fn a_primary_limit_pauses_its_resource_and_no_request_leaves_meanwhile() {
        let reset = (epoch_now() + 100).to_string();
        let server = Server::start(vec![reply(
            "403 Forbidden",
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &reset),
                ("x-ratelimit-limit", "5000"),
            ],
            r#"{"message":"API rate limit exceeded"}"#,
        )]);
        let rest = client(profile(true, false), &server.base, PerResource::default());
        let e = rest.get("/x").unwrap_err();
        starts(
            &e,
            "test rate limit reached (HTTP 403): core requests wait 10",
        );
        let e = rest.write("PUT", "/y", &json!({}), true).unwrap_err();
        starts(&e, "test rate limit: requests are paused for ");
        assert_eq!(server.finish().len(), 1, "a paused request never left");
        // Another resource is not paused by it.
        assert!(rest.limits.paused_for(CORE).is_some());
        assert_eq!(rest.limits.paused_for("graphql"), None);
        let snapshot = rest.rate_limits().unwrap();
        assert_eq!(snapshot["core"]["limit"], 5000);
        assert!(snapshot["paused_for_s"].as_u64().unwrap() >= 99);
    }

    #[test]
    fn the_token_stays_on_the_endpoints_origin() {
        let other = Server::start(vec![]);
        let server = Server::start(vec![
            reply("301 Moved", &[("location", "/api/moved")], ""),
            reply("200 OK", &[("x-next-page", "3")], "[]"),
            reply(
                "302 Found",
                &[("location", &format!("{}/x", other.base))],
                "",
            ),
            reply("301 Moved", &[("location", "/api/w")], ""),
        ]);
        let rest = client(
            profile(false, true),
            &format!("{}/api", server.base),
            budget(),
        );
        let got = rest.get("/x?per_page=2&page=2").unwrap();
        assert_eq!(
            got.next,
            Some(format!("{}/api/moved?page=3", server.base)),
            "X-Next-Page against the URL that answered"
        );
        let e = rest.get("/y").unwrap_err();
        assert!(
            e.message.contains("a redirect to another origin"),
            "{}",
            e.message
        );
        let e = rest.write("PUT", "/w", &json!({}), true).unwrap_err();
        assert!(
            e.message
                .contains("(a redirect svc does not repeat a write for)"),
            "{}",
            e.message
        );
        let e = rest.get(&format!("{}/z", other.base)).unwrap_err();
        assert!(
            e.message.contains("is not on the endpoint's origin"),
            "{}",
            e.message
        );
        assert_eq!(server.finish().len(), 4);
        assert!(
            other.finish().is_empty(),
            "the other origin never heard of it"
        );
    }

    #[test]
    fn the_raw_profile_sends_again_on_429_and_5xx_and_gives_back_the_reply() {
        let server = Server::start(vec![
            reply(
                "429 Too Many Requests",
                &[("retry-after", "0"), ("x-ratelimit-remaining", "0")],
                r#"{"retry_after": 0.001}"#,
            ),
            reply("503 Busy", &[], ""),
            reply("200 OK", &[("mcp-session-id", "s1")], "{}"),
        ]);
        let mut http = HttpClient::new(Duration::from_secs(5));
        http.set_backoff(Duration::from_millis(1));
        let url = format!("{}/x", server.base);
        let auth = [("Authorization", "Bearer sekrit")];
        let r = http
            .request("test", "GET", &url, &auth, None, |_| false)
            .unwrap();
        assert_eq!((r.status, r.session_id.as_deref()), (200, Some("s1")));
        assert_eq!(http.last_rate_limits().unwrap()["x-ratelimit-remaining"], 0);
        let heads = server.finish();
        assert_eq!(heads.len(), 3);
        assert!(heads[0].contains("authorization: bearer sekrit"));
        assert!(!heads[0].contains("user-agent: svc/"), "{}", heads[0]);

        // Every attempt transient: the last reply, as it is.
        let server = Server::start(vec![reply("429 Slow Down", &[], ""); 4]);
        let url = format!("{}/x", server.base);
        let r = http.request("test", "GET", &url, &[], None, |_| false);
        assert_eq!(r.unwrap().status, 429);
        assert_eq!(server.finish().len(), RAW_ATTEMPTS as usize);

        // A write that must not land twice: a 5xx is its answer, a transport error its error.
        let server = Server::start(vec![reply("500 Oops", &[], "")]);
        let url = format!("{}/x", server.base);
        let once = Request::raw("test", "POST", &url, &auth, Some("{}"));
        let r = http.send(&once, Resend::IfNotApplied, |_| false);
        assert_eq!(r.unwrap().status, 500);
        assert_eq!(server.finish().len(), 1);
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/x", closed.local_addr().unwrap());
        drop(closed);
        let once = Request::raw("test", "POST", &url, &auth, Some("{}"));
        let Err(e) = http.send(&once, Resend::IfNotApplied, |_| false) else {
            panic!("a lost write is an error")
        };
        starts(&e, "test request failed (it may have been applied): ");
        let Err(e) = http.request("test", "GET", &url, &auth, None, |_| false) else {
            panic!("four transport errors fail the request")
        };
        starts(&e, "test request failed after 4 attempts: ");
        assert!(!e.message.contains("sekrit"));
    }

    #[test]
    fn next_pages_and_redirect_targets() {
        assert_eq!(
            with_page(
                "http://h/api/v4/projects/a%2Fb/issues?per_page=100&page=1",
                "2"
            ),
            "http://h/api/v4/projects/a%2Fb/issues?per_page=100&page=2"
        );
        assert_eq!(
            http::next_link(r#"<https://gitlab.com/api/v4/projects/1/issues?id_after=5&pagination=keyset>; rel="next""#)
                .as_deref(),
            Some("https://gitlab.com/api/v4/projects/1/issues?id_after=5&pagination=keyset")
        );
        assert_eq!(
            resolve("http://h:1/api/v4/x", "/api/v4/y"),
            "http://h:1/api/v4/y"
        );
    }
}
