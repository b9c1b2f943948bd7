//! GitHub's REST v3 and GraphQL APIs as the `github` tracker and pack use them, spoken through
//! the shared REST loop ([`crate::tracker::rest`]) and kept far inside GitHub's rate limits:
//!
//! * Every REST read is conditional: the last `ETag` of each URL is kept with its body (the
//!   shared [`crate::tracker::http::ConditionalCache`]), and GitHub answers an unchanged
//!   resource `304 Not Modified`, which costs no rate limit.
//! * The `x-ratelimit-*` headers of each answer are kept per resource (`core`, `graphql`) for
//!   the snapshot's `rate_limits` (the shared [`PerResource`] policy).
//! * A primary limit (403 or 429 with `x-ratelimit-remaining: 0`, or GraphQL's `RATE_LIMITED`)
//!   pauses that resource until `x-ratelimit-reset`; a secondary limit (403 or 429 with
//!   `retry-after`, or GitHub's "secondary rate limit" message) pauses every request for
//!   `retry-after`, or a minute doubling with each strike. While paused, requests fail at once
//!   without touching the network, so a poll fails fast and running work is left alone.
//!
//! Reads are retried on transport errors and 5xx; writes that must not be applied twice
//! (comments, new issues) never are. The token never appears in an error.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::Secret;
use crate::tracker::TrackerError;
use crate::tracker::http::RestErrors;
use crate::tracker::rate::PerResource;
use crate::tracker::rest::{self, Profile, Request, Rest, Step};

pub use crate::tracker::rest::{Got, Listed};

/// The resource GraphQL requests spend.
const GRAPHQL: &str = "graphql";

/// How GitHub's REST API is spoken, and how its errors read.
static GITHUB: Profile = Profile {
    errors: RestErrors {
        provider: "github",
        unauthorized: "check the github api_key or GITHUB_TOKEN",
        forbidden: "the token lacks a permission this needs",
        invalid: &[422],
    },
    accept: "application/vnd.github+json",
    headers: &[("X-GitHub-Api-Version", "2022-11-28")],
    conditional: true,
    same_origin: true,
    x_next_page: false,
    user_agent: true,
};

/// GitHub's API client: its REST reads and writes are the shared loop's ([`Rest`], which it
/// derefs to: conditional GETs, `Link` pages, writes sent again only when idempotent), beside
/// GraphQL and the rate limits with the last query's cost.
pub struct Api {
    rest: Rest<PerResource>,
    graphql: String,
    /// The cost of the last GraphQL query, as `rateLimit` reported it.
    last_cost: Mutex<Option<i64>>,
}

impl std::ops::Deref for Api {
    type Target = Rest<PerResource>;

    fn deref(&self) -> &Rest<PerResource> {
        &self.rest
    }
}

impl Api {
    pub fn new(rest: &str, graphql: &str, token: Secret) -> Api {
        Api {
            rest: Rest::new(&GITHUB, rest, token, PerResource::default()),
            graphql: graphql.to_string(),
            last_cost: Mutex::default(),
        }
    }

    /// Base delay between attempts (tests make it small).
    pub fn set_backoff(&mut self, backoff: Duration) {
        self.rest.backoff = backoff;
    }

    /// The rate limits GitHub last reported, per resource, a pause under way, and the cost
    /// of the last GraphQL query.
    pub fn rate_limits(&self) -> Option<Value> {
        let mut out = self.rest.rate_limits()?;
        let cost = *self.last_cost.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some(cost), Some(map)) = (cost, out.as_object_mut()) {
            map.insert("graphql_last_cost".into(), json!(cost));
        }
        Some(out)
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
        let attempts = if mutation { 1 } else { rest::READ_ATTEMPTS };
        let request = Request {
            what: "github",
            resource: GRAPHQL,
            method: "POST",
            url: &self.graphql,
            body: Some(&body),
            etag: None,
            headers: &[],
        };
        let errors = self.rest.errors();
        let result = self.rest.exchange(attempts, &request, |sent| {
            let answer = match sent {
                Ok(answer) => answer,
                Err(e) => return Step::Again(e),
            };
            if answer.status >= 500 {
                return Step::Again(format!("HTTP {}", answer.status));
            }
            if !(200..300).contains(&answer.status) {
                return Step::Done(Err(errors.status(
                    "POST",
                    "/graphql",
                    answer.status,
                    &answer.body,
                )));
            }
            Step::Done(
                errors
                    .parse(&answer.body)
                    .and_then(|parsed| self.data(parsed, partial)),
            )
        });
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
            *self.last_cost.lock().unwrap_or_else(|p| p.into_inner()) = Some(cost);
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
            let wait = self.rest.limits.pause_primary(GRAPHQL, None);
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
        assert!(
            paused <= crate::tracker::rate::MAX_SECONDARY.as_secs() && paused > 60,
            "{paused}"
        );
    }

    #[test]
    fn the_next_page_comes_from_the_link_header() {
        let link = r#"<https://api.github.com/repositories/1/issues?page=2>; rel="next", <https://api.github.com/repositories/1/issues?page=5>; rel="last""#;
        assert_eq!(
            crate::tracker::http::next_link(link).as_deref(),
            Some("https://api.github.com/repositories/1/issues?page=2")
        );
        assert_eq!(
            crate::tracker::http::next_link(
                r#"<https://x/?page=1>; rel="prev", <https://x/?page=1>; rel="first""#
            ),
            None
        );
    }

    #[test]
    fn errors_show_githubs_message_and_never_the_query() {
        let e = GITHUB.errors.status(
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
            GITHUB.errors.status("GET", "/x", 404, "").kind,
            crate::tracker::TrackerErrorKind::NotFound
        );
    }
}
