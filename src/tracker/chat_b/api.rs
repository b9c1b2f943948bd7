//! The Discord REST API v10 over the shared HTTP client: `Authorization: Bot <token>`, JSON
//! bodies, error bodies `{code, message}` as [`DiscordFailure::Api`], and per-route rate-limit
//! buckets: a route whose `X-RateLimit-Remaining` reached 0 waits for its
//! `X-RateLimit-Reset-After` before the next request, and a 429 waits for the body's
//! `retry_after` (the shared client retries it). The token never appears in an error.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::Secret;
use crate::tracker::http::MAX_WAIT;
use crate::tracker::rest::{HttpClient, Reply};
use crate::tracker::{TrackerError, TrackerErrorKind};

/// Discord's JSON error codes svc reacts to.
pub const UNKNOWN_CHANNEL: i64 = 10003;
pub const UNKNOWN_MESSAGE: i64 = 10008;
pub const UNKNOWN_USER: i64 = 10013;
pub const MISSING_ACCESS: i64 = 50001;
pub const MISSING_PERMISSIONS: i64 = 50013;
/// "A thread has already been created for this message".
pub const THREAD_EXISTS: i64 = 160004;

/// A REST failure: Discord's answer (HTTP status, JSON `code` and `message`), or the
/// transport's.
#[derive(Debug)]
pub enum DiscordFailure {
    Api {
        route: String,
        status: u16,
        code: i64,
        message: String,
    },
    Transport(TrackerError),
}

impl DiscordFailure {
    /// Discord's JSON error code, when Discord answered with one.
    pub fn code(&self) -> Option<i64> {
        match self {
            DiscordFailure::Api { code, .. } => Some(*code),
            DiscordFailure::Transport(_) => None,
        }
    }

    /// HTTP 404 or one of the unknown-object codes.
    pub fn is_not_found(&self) -> bool {
        matches!(self, DiscordFailure::Api { status: 404, .. })
            || matches!(
                self.code(),
                Some(UNKNOWN_CHANNEL | UNKNOWN_MESSAGE | UNKNOWN_USER)
            )
    }
}

impl From<DiscordFailure> for TrackerError {
    fn from(f: DiscordFailure) -> TrackerError {
        match f {
            DiscordFailure::Transport(e) => e,
            DiscordFailure::Api {
                route,
                status,
                code,
                message,
            } => {
                let hint = match (status, code) {
                    (401, _) => " (check tracker.api_key or CHAT_B_BOT_TOKEN: the bot token)",
                    (_, MISSING_ACCESS) => {
                        " (the bot cannot see this channel: add it to the server and give it View Channel and Read Message History)"
                    }
                    (_, MISSING_PERMISSIONS) => {
                        " (grant the bot Send Messages, Send Messages in Threads, Create Public Threads, Add Reactions and Read Message History)"
                    }
                    _ => "",
                };
                let kind = if status == 404 || matches!(code, UNKNOWN_MESSAGE | UNKNOWN_USER) {
                    TrackerErrorKind::NotFound
                } else {
                    TrackerErrorKind::Unavailable
                };
                let what = if message.is_empty() {
                    format!("HTTP {status}")
                } else {
                    format!("HTTP {status} {message} (code {code})")
                };
                TrackerError {
                    kind,
                    message: format!("chat-b {route} failed: {what}{hint}"),
                }
            }
        }
    }
}

/// A route's bucket: when it may be used again.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    remaining: u64,
    reset_at: Instant,
}

/// The Discord REST API over the shared HTTP client.
pub struct DiscordApi {
    http: HttpClient,
    endpoint: String,
    token: Secret,
    /// Buckets by route (method and path with ids other than the major parameter masked).
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// A path segment, percent-encoded (reaction emoji are Unicode).
pub use crate::tracker::http::enc;

/// The rate-limit route of a request: the major parameter (the id after `channels`, `guilds`
/// or `webhooks`) kept, every other id masked, the query dropped; reaction routes share one
/// bucket per channel like Discord's.
pub fn route_key(method: &str, path: &str) -> String {
    let path = path.split('?').next().unwrap_or_default();
    let mut out = Vec::new();
    let mut prev = "";
    let mut prev2 = "";
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        let is_id = seg.bytes().all(|b| b.is_ascii_digit()) && !seg.is_empty();
        let major = matches!(prev, "channels" | "guilds" | "webhooks");
        if prev2 == "interactions" || prev2 == "webhooks" {
            // An interaction's (or webhook's) token: a secret, never part of a name.
            out.push(":token");
        } else if prev == "reactions" {
            out.push(":emoji");
        } else if is_id && !major {
            out.push(":id");
        } else {
            out.push(seg);
        }
        prev2 = prev;
        prev = seg;
    }
    format!("{method} /{}", out.join("/"))
}

impl DiscordApi {
    pub fn new(endpoint: &str, token: Secret) -> DiscordApi {
        DiscordApi {
            http: HttpClient::new(Duration::from_secs(30)),
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bot token (for the Gateway's IDENTIFY; never logged).
    pub fn token(&self) -> &Secret {
        &self.token
    }

    /// How long the route's bucket stays empty (`None` when it has requests left or reset).
    fn bucket_wait(&self, key: &str) -> Option<Duration> {
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        buckets.get(key).and_then(|b| {
            (b.remaining == 0)
                .then(|| b.reset_at.saturating_duration_since(Instant::now()))
                .filter(|d| !d.is_zero())
                .map(|d| d.min(MAX_WAIT))
        })
    }

    /// Waits while the route's bucket is empty.
    fn wait_for_bucket(&self, key: &str) {
        if let Some(d) = self.bucket_wait(key) {
            std::thread::sleep(d);
        }
    }

    fn note_bucket(&self, key: &str, reply: &Reply) {
        let get = |name: &str| {
            reply
                .ratelimit
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.trim().to_string())
        };
        let remaining = get("x-ratelimit-remaining").and_then(|v| v.parse::<u64>().ok());
        let reset_after = get("x-ratelimit-reset-after")
            .and_then(|v| crate::tracker::http::seconds(&v, crate::tracker::http::LONGEST_PAUSE));
        if let (Some(remaining), Some(after)) = (remaining, reset_after) {
            self.buckets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    key.to_string(),
                    Bucket {
                        remaining,
                        reset_at: Instant::now() + after,
                    },
                );
        }
    }

    /// One request: `path` below the endpoint (with its query), a JSON body for writes.
    /// Answers `Value::Null` for 204 No Content.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, DiscordFailure> {
        let key = route_key(method, path);
        self.wait_for_bucket(&key);
        let url = format!("{}{path}", self.endpoint);
        let auth = format!("Bot {}", self.token.expose());
        let mut headers: Vec<(&str, &str)> = vec![("User-Agent", USER_AGENT)];
        if !self.token.is_empty() {
            headers.push(("Authorization", &auth));
        }
        let body_text = body.map(Value::to_string);
        let reply = self
            .http
            .request(
                "chat-b",
                method,
                &url,
                &headers,
                body_text.as_deref(),
                |_| false,
            )
            .map_err(DiscordFailure::Transport)?;
        self.note_bucket(&key, &reply);
        let parsed: Option<Value> = serde_json::from_str(&reply.body).ok();
        if (200..300).contains(&reply.status) {
            return Ok(parsed.unwrap_or(Value::Null));
        }
        let v = parsed.unwrap_or(Value::Null);
        Err(DiscordFailure::Api {
            route: key,
            status: reply.status,
            code: v["code"].as_i64().unwrap_or(0),
            message: v["message"].as_str().unwrap_or_default().to_string(),
        })
    }

    pub fn get(&self, path: &str) -> Result<Value, DiscordFailure> {
        self.call("GET", path, None)
    }

    pub fn rate_limits(&self) -> Option<Value> {
        self.http.last_rate_limits()
    }
}

/// Discord asks bots for a `DiscordBot (url, version)` user agent.
const USER_AGENT: &str = concat!(
    "DiscordBot (https://github.com/svc, ",
    env!("CARGO_PKG_VERSION"),
    ")"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_keep_the_major_parameter_and_mask_the_rest() {
        assert_eq!(
            route_key("GET", "/channels/123/messages/456?limit=100"),
            "GET /channels/123/messages/:id"
        );
        assert_eq!(
            route_key("PUT", "/channels/1/messages/2/reactions/%F0%9F%91%80/@me"),
            "PUT /channels/1/messages/:id/reactions/:emoji/@me"
        );
        assert_eq!(route_key("GET", "/users/99"), "GET /users/:id");
        assert_eq!(route_key("GET", "/guilds/7/roles"), "GET /guilds/7/roles");
        assert_eq!(
            route_key("POST", "/interactions/5/aW50ZXJhY3Rpb24/callback"),
            "POST /interactions/:id/:token/callback"
        );
    }

    #[test]
    fn an_empty_bucket_holds_its_route_until_it_resets() {
        let api = DiscordApi::new("http://127.0.0.1:9", Secret::new(""));
        let reply = |remaining: &str, after: &str| Reply {
            status: 200,
            body: String::new(),
            retry_after: None,
            session_id: None,
            ratelimit: vec![
                ("x-ratelimit-remaining".into(), remaining.into()),
                ("x-ratelimit-reset-after".into(), after.into()),
            ],
        };
        let key = route_key("PUT", "/channels/1/messages/2/reactions/x/@me");
        api.note_bucket(&key, &reply("3", "1.5"));
        assert_eq!(api.bucket_wait(&key), None, "requests left");
        api.note_bucket(&key, &reply("0", "1.5"));
        let wait = api.bucket_wait(&key).expect("an empty bucket waits");
        assert!(wait <= Duration::from_millis(1500));
        assert_eq!(
            api.bucket_wait("GET /users/@me"),
            None,
            "other routes are free"
        );
        api.note_bucket(&key, &reply("0", "9999"));
        assert!(api.bucket_wait(&key).unwrap() <= MAX_WAIT, "capped");
    }

    #[test]
    fn failures_name_the_route_and_never_the_token() {
        let e: TrackerError = DiscordFailure::Api {
            route: "GET /users/@me".into(),
            status: 401,
            code: 0,
            message: "401: Unauthorized".into(),
        }
        .into();
        assert!(e.message.contains("CHAT_B_BOT_TOKEN"), "{e}");
        let nf = DiscordFailure::Api {
            route: "GET /channels/1/messages/:id".into(),
            status: 404,
            code: UNKNOWN_MESSAGE,
            message: "Unknown Message".into(),
        };
        assert!(nf.is_not_found());
        assert_eq!(TrackerError::from(nf).kind, TrackerErrorKind::NotFound);
    }
}
