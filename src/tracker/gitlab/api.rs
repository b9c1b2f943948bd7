//! GitLab's REST API v4 as the `gitlab` tracker and pack use it:
//!
//! * The token goes as `Authorization: Bearer` to the configured endpoint's origin only. No
//!   redirect is followed by the HTTP agent: a redirect within the origin is followed here,
//!   one to another origin is refused (the token would go with it, openai/symphony #124).
//! * GitLab's `RateLimit-*` headers are kept for the snapshot's `rate_limits`; a 429 pauses
//!   every request for its `Retry-After` (or a doubling default), a spent budget
//!   (`RateLimit-Remaining: 0`) until its `RateLimit-Reset`, and requests fail at once
//!   meanwhile, so a poll fails fast and running work is left alone
//!   ([`crate::tracker::http::RateLimits`], shared).
//! * Lists follow keyset pagination (`Link: rel="next"`) or `X-Next-Page`.
//!
//! Reads are retried on transport errors and 5xx; writes that must not be applied twice
//! (notes, new issues) never are. The token never appears in an error.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::config::Secret;
use crate::tracker::TrackerError;
use crate::tracker::http::{self, RateLimitPolicy, RateLimits};

/// Attempts of a read (the first and the retries) on transport errors and 5xx.
const READ_ATTEMPTS: u32 = 3;
/// Redirects within the endpoint's origin followed at most.
const REDIRECTS: usize = 3;
/// GitLab's rate-limit headers, and the pause of a 429 that says no `Retry-After`.
const POLICY: RateLimitPolicy = RateLimitPolicy {
    header_prefix: "ratelimit-",
    default_pause: Duration::from_secs(60),
};

/// A read's answer: the JSON body and the next page, if any.
pub struct Got {
    pub value: Value,
    pub next: Option<String>,
}

/// A list read page by page: its items, and whether the last page was reached.
pub struct Listed {
    pub items: Vec<Value>,
    pub complete: bool,
}

pub struct Api {
    agent: ureq::Agent,
    base: String,
    origin: Option<String>,
    token: Secret,
    limits: Mutex<RateLimits>,
    /// Base delay between attempts of a read (tests make it small).
    pub backoff: Duration,
}

struct Answer {
    status: u16,
    body: String,
    next: Option<String>,
}

enum Failure {
    /// The request may not have reached GitLab (a read can be sent again).
    Transport(String),
    Final(TrackerError),
}

impl Api {
    pub fn new(endpoint: &str, token: Secret) -> Api {
        let base = endpoint.trim_end_matches('/').to_string();
        Api {
            agent: http::agent_without_redirects(Duration::from_secs(30)),
            origin: http::origin(&base),
            base,
            token,
            limits: Mutex::default(),
            backoff: Duration::from_millis(500),
        }
    }

    /// `path` (starting with `/`) under the API base, or a full URL (a `Link` header's) as is.
    pub fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            path.to_string()
        } else {
            format!("{}{path}", self.base)
        }
    }

    /// The rate limits GitLab last reported, and a pause under way.
    pub fn rate_limits(&self) -> Option<Value> {
        self.limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .snapshot()
    }

    /// A GET of `path`. 404 is [`TrackerError::not_found`]; any other failure names the
    /// status and GitLab's message.
    pub fn get(&self, path: &str) -> Result<Got, TrackerError> {
        let url = self.url(path);
        let mut last = String::new();
        for attempt in 0..READ_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(self.backoff * 2u32.pow(attempt - 1));
            }
            match self.send("GET", &url, None) {
                Err(Failure::Transport(e)) => last = e,
                Err(Failure::Final(e)) => return Err(e),
                Ok(a) if a.status >= 500 => last = format!("HTTP {}", a.status),
                Ok(a) if (200..300).contains(&a.status) => {
                    return Ok(Got {
                        value: parse(&a.body)?,
                        next: a.next,
                    });
                }
                Ok(a) => return Err(status_error("GET", path, a.status, &a.body)),
            }
        }
        Err(TrackerError::unavailable(format!(
            "gitlab GET {} failed after {READ_ATTEMPTS} attempts: {last}",
            shown(path)
        )))
    }

    /// The items of a paginated list, at most `max_pages` pages.
    pub fn get_list(&self, path: &str, max_pages: usize) -> Result<Listed, TrackerError> {
        let mut items = Vec::new();
        let mut next = Some(path.to_string());
        for _ in 0..max_pages {
            let Some(p) = next.take() else { break };
            let got = self.get(&p)?;
            match got.value {
                Value::Array(list) => items.extend(list),
                _ => {
                    return Err(TrackerError::unavailable(format!(
                        "gitlab GET {} answered something other than a list",
                        shown(&p)
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

    /// Every item of a list; more than `max_pages` pages is an error.
    pub fn get_all(&self, path: &str, max_pages: usize) -> Result<Vec<Value>, TrackerError> {
        let listed = self.get_list(path, max_pages)?;
        if !listed.complete {
            return Err(TrackerError::unavailable(format!(
                "gitlab GET {} has more than {max_pages} pages: svc reads at most that many",
                shown(path)
            )));
        }
        Ok(listed.items)
    }

    /// A write (`PUT`, `POST`, `DELETE`). `idempotent` writes (labels, a state) are sent again
    /// after a transport error or 5xx; others (a note, a new issue) never.
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
        let mut last = String::new();
        for attempt in 0..attempts {
            if attempt > 0 {
                std::thread::sleep(self.backoff * 2u32.pow(attempt - 1));
            }
            match self.send(method, &url, text.as_deref()) {
                Err(Failure::Transport(e)) => last = e,
                Err(Failure::Final(e)) => return Err(e),
                Ok(a) if a.status >= 500 && idempotent => last = format!("HTTP {}", a.status),
                Ok(a) if (200..300).contains(&a.status) => {
                    return if a.body.trim().is_empty() {
                        Ok(Value::Null)
                    } else {
                        parse(&a.body)
                    };
                }
                Ok(a) => return Err(status_error(method, path, a.status, &a.body)),
            }
        }
        Err(TrackerError::unavailable(format!(
            "gitlab {method} {} failed{}: {last}",
            shown(path),
            if idempotent {
                " after retries"
            } else {
                " (it may have been applied)"
            }
        )))
    }

    /// One request, following redirects within the endpoint's origin.
    fn send(&self, method: &str, url: &str, body: Option<&str>) -> Result<Answer, Failure> {
        if let Some(wait) = self
            .limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .paused_for()
        {
            return Err(Failure::Final(TrackerError::unavailable(format!(
                "gitlab rate limit: requests are paused for {}s more",
                wait.as_secs().max(1)
            ))));
        }
        let mut url = url.to_string();
        for _ in 0..=REDIRECTS {
            // The token goes to the endpoint's origin and nowhere else.
            if self.origin.is_none() || http::origin(&url) != self.origin {
                return Err(Failure::Final(TrackerError::unavailable(format!(
                    "gitlab: {} is not on the endpoint's origin: svc does not send the token there",
                    shown(&url)
                ))));
            }
            let auth = format!("Bearer {}", self.token.expose());
            let builder = ureq::http::Request::builder()
                .method(method)
                .uri(&url)
                .header("Accept", "application/json")
                .header("User-Agent", concat!("svc/", env!("CARGO_PKG_VERSION")))
                .header("Authorization", &auth);
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
                        "gitlab: bad request: {e}"
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
            let header = |name: &str| {
                headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                let Some(location) = header("location") else {
                    return Ok(Answer {
                        status,
                        body: text,
                        next: None,
                    });
                };
                let target = resolve(&url, &location);
                if http::origin(&target) != self.origin {
                    return Err(Failure::Final(TrackerError::unavailable(format!(
                        "gitlab {method} {} answered a redirect to another origin ({}): svc does not follow it with the token; set the endpoint to the API's own address",
                        shown(&url),
                        http::origin(&target).unwrap_or_else(|| "an unknown place".into())
                    ))));
                }
                if status == 303 || (method != "GET" && matches!(status, 301 | 302)) {
                    // Only a GET can be repeated as it is after these.
                    if method != "GET" {
                        return Err(Failure::Final(TrackerError::unavailable(format!(
                            "gitlab {method} {} answered HTTP {status} (a redirect svc does not repeat a write for)",
                            shown(&url)
                        ))));
                    }
                }
                url = target;
                continue;
            }
            let retry_after =
                header("retry-after").and_then(|v| http::seconds(&v, http::LONGEST_PAUSE));
            let mut limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
            limits.note(&POLICY, &headers);
            if status == 429 {
                let wait = limits.refused(&POLICY, retry_after);
                return Err(Failure::Final(TrackerError::unavailable(format!(
                    "gitlab rate limit (HTTP 429): every request waits {}s",
                    wait.as_secs().max(1)
                ))));
            }
            if status < 400 {
                limits.ok();
                // The last request the budget allowed: the next ones wait for its reset.
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs();
                if let Some(wait) = limits.pause_if_spent(now) {
                    log::warn!(
                        "gitlab rate limit spent (RateLimit-Remaining: 0): requests wait {}s for its reset",
                        wait.as_secs()
                    );
                }
            }
            drop(limits);
            let next = header("link")
                .and_then(|l| http::next_link(&l))
                .or_else(|| {
                    header("x-next-page")
                        .map(|p| p.trim().to_string())
                        .filter(|p| !p.is_empty())
                        .map(|p| with_page(&url, &p))
                });
            return Ok(Answer {
                status,
                body: text,
                next,
            });
        }
        Err(Failure::Final(TrackerError::unavailable(format!(
            "gitlab {method} {}: more than {REDIRECTS} redirects",
            shown(&url)
        ))))
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

/// How gitlab's errors read (the shared REST pieces in `tracker::http`).
const ERRORS: http::RestErrors = http::RestErrors {
    provider: "gitlab",
    unauthorized: "check the gitlab api_key or GITLAB_TOKEN",
    forbidden: "the token lacks a scope or role this needs",
    invalid: &[400, 409, 422],
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

    #[test]
    fn the_next_page_is_the_link_or_x_next_page() {
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

    #[test]
    fn errors_show_gitlabs_message_and_never_the_query() {
        let e = status_error(
            "GET",
            "/projects/a%2Fb/issues?labels=x",
            401,
            r#"{"message":"401 Unauthorized"}"#,
        );
        assert_eq!(
            e.message,
            "gitlab GET /projects/a%2Fb/issues answered HTTP 401: 401 Unauthorized (check the gitlab api_key or GITLAB_TOKEN)"
        );
        assert_eq!(
            status_error("GET", "/x", 404, "").kind,
            crate::tracker::TrackerErrorKind::NotFound
        );
    }
}
