//! The Slack Web API over the shared HTTP client: read methods with their arguments in the
//! query string, write methods with JSON bodies, the bot token as Bearer, `{ok: false, error}`
//! answers as [`SlackFailure::Api`], cursor pagination. The token never appears in an error.

use std::time::Duration;

use serde_json::{Value, json};

use crate::config::Secret;
use crate::tracker::http::enc;
use crate::tracker::rest::{HttpClient, Reply, Request, Resend};
use crate::tracker::{TrackerError, TrackerErrorKind};

/// A Web API failure: Slack's own `error` code, or the transport's.
#[derive(Debug)]
pub enum SlackFailure {
    Api {
        method: String,
        code: String,
        needed: Option<String>,
    },
    Transport(TrackerError),
}

impl SlackFailure {
    /// Slack's error code, when Slack answered.
    pub fn code(&self) -> Option<&str> {
        match self {
            SlackFailure::Api { code, .. } => Some(code),
            SlackFailure::Transport(_) => None,
        }
    }
}

impl From<SlackFailure> for TrackerError {
    fn from(f: SlackFailure) -> TrackerError {
        match f {
            SlackFailure::Transport(e) => e,
            SlackFailure::Api {
                method,
                code,
                needed,
            } => {
                let hint = match code.as_str() {
                    "not_authed" | "invalid_auth" | "account_inactive" | "token_revoked"
                    | "token_expired" => " (check tracker.api_key or CHAT_A_BOT_TOKEN)".to_string(),
                    "missing_scope" => format!(
                        " (add the {} scope to the Slack app)",
                        needed.as_deref().unwrap_or("missing")
                    ),
                    "not_in_channel" | "channel_not_found" => {
                        " (invite the bot to the channel: /invite @bot)".to_string()
                    }
                    _ => String::new(),
                };
                let kind = match code.as_str() {
                    "thread_not_found" | "message_not_found" | "user_not_found" => {
                        TrackerErrorKind::NotFound
                    }
                    _ => TrackerErrorKind::Unavailable,
                };
                TrackerError {
                    kind,
                    message: format!("chat-a {method} failed: {code}{hint}"),
                }
            }
        }
    }
}

/// The Slack Web API over the shared HTTP client.
pub struct SlackApi {
    http: HttpClient,
    endpoint: String,
    token: Secret,
}

/// A query-string or form value, percent-encoded.
impl SlackApi {
    pub fn new(endpoint: &str, token: Secret) -> SlackApi {
        SlackApi {
            http: HttpClient::new(Duration::from_secs(30)),
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
        }
    }

    fn finish(&self, method: &str, reply: Reply) -> Result<Value, SlackFailure> {
        let parsed: Option<Value> = serde_json::from_str(&reply.body).ok();
        let Some(body) = parsed.filter(Value::is_object) else {
            return Err(SlackFailure::Transport(TrackerError::unavailable(format!(
                "chat-a {method} answered HTTP {} without a JSON body",
                reply.status
            ))));
        };
        if body["ok"] == true {
            return Ok(body);
        }
        let code = body["error"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("HTTP {}", reply.status));
        Err(SlackFailure::Api {
            method: method.to_string(),
            code,
            needed: body["needed"].as_str().map(str::to_string),
        })
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        if self.token.is_empty() {
            Vec::new()
        } else {
            vec![("Authorization", format!("Bearer {}", self.token.expose()))]
        }
    }

    /// A read method: arguments in the query string.
    pub fn get(&self, method: &str, params: &[(&str, &str)]) -> Result<Value, SlackFailure> {
        let query: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", enc(v)))
            .collect();
        let url = if query.is_empty() {
            format!("{}/{method}", self.endpoint)
        } else {
            format!("{}/{method}?{}", self.endpoint, query.join("&"))
        };
        let headers = self.headers();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let reply = self
            .http
            .request("chat-a", "GET", &url, &headers, None, |r| {
                r.body.contains("\"ratelimited\"")
            })
            .map_err(SlackFailure::Transport)?;
        self.finish(method, reply)
    }

    /// A write method: a JSON body.
    pub fn post(&self, method: &str, body: &Value) -> Result<Value, SlackFailure> {
        let url = format!("{}/{method}", self.endpoint);
        let headers = self.headers();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let reply = self
            .http
            .post_json("chat-a", &url, &headers, &body.to_string(), |r| {
                r.body.contains("\"ratelimited\"")
            })
            .map_err(SlackFailure::Transport)?;
        self.finish(method, reply)
    }

    /// A write that must not land twice (`chat.postMessage`): sent again only when Slack said
    /// it was not applied (HTTP 429, `ratelimited`). After an ambiguous failure (a 5xx, a lost
    /// answer) `landed` looks for the write first: `Ok(true)` ends it as done (answered as
    /// `{"ok": true, "found": true}`), `Ok(false)` sends it again, and an error ends it with
    /// the failure, since sending again without knowing could post twice.
    pub fn post_once(
        &self,
        method: &str,
        body: &Value,
        landed: impl Fn() -> Result<bool, SlackFailure>,
    ) -> Result<Value, SlackFailure> {
        let url = format!("{}/{method}", self.endpoint);
        let headers = self.headers();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let body = body.to_string();
        let mut failure = None;
        for attempt in 0..crate::tracker::rest::RAW_ATTEMPTS {
            if let Some(f) = failure.take() {
                std::thread::sleep(self.http.backoff() * 2u32.pow(attempt - 1));
                match landed() {
                    Ok(true) => return Ok(json!({"ok": true, "found": true})),
                    Ok(false) => {}
                    Err(e) => {
                        log::warn!(
                            "chat-a {method}: cannot tell whether the failed write landed: {}",
                            TrackerError::from(e).message
                        );
                        return Err(f);
                    }
                }
            }
            let request = Request::raw("chat-a", "POST", &url, &headers, Some(&body));
            let reply = self.http.send(&request, Resend::IfNotApplied, |r| {
                r.body.contains("\"ratelimited\"")
            });
            failure = Some(match reply {
                Ok(r) if r.status >= 500 => {
                    SlackFailure::Transport(TrackerError::unavailable(format!(
                        "chat-a {method} answered HTTP {} (it may have been applied)",
                        r.status
                    )))
                }
                Ok(r) => return self.finish(method, r),
                Err(e) => SlackFailure::Transport(e),
            });
        }
        Err(failure.expect("at least one attempt"))
    }

    /// A cursor-paginated read method: the `key` arrays of up to `max_pages` pages.
    pub fn paged(
        &self,
        method: &str,
        params: &[(&str, &str)],
        key: &str,
        max_pages: usize,
    ) -> Result<Vec<Value>, SlackFailure> {
        self.paged_until(method, params, key, max_pages, usize::MAX)
    }

    /// Like [`paged`](Self::paged), stopping once `want` items arrived (Slack may answer with
    /// fewer items than the `limit` asked for before the end).
    pub fn paged_until(
        &self,
        method: &str,
        params: &[(&str, &str)],
        key: &str,
        max_pages: usize,
        want: usize,
    ) -> Result<Vec<Value>, SlackFailure> {
        let mut out = Vec::new();
        let mut cursor = String::new();
        for _ in 0..max_pages {
            if out.len() >= want {
                break;
            }
            let mut p: Vec<(&str, &str)> = params.to_vec();
            if !cursor.is_empty() {
                p.push(("cursor", &cursor));
            }
            let page = self.get(method, &p)?;
            out.extend(page[key].as_array().cloned().unwrap_or_default());
            match page
                .pointer("/response_metadata/next_cursor")
                .and_then(Value::as_str)
            {
                Some(next) if !next.is_empty() => cursor = next.to_string(),
                _ => break,
            }
        }
        Ok(out)
    }

    pub fn rate_limits(&self) -> Option<Value> {
        self.http.last_rate_limits()
    }
}
