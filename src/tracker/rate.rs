//! The request loop's one policy trait, [`RatePolicy`]: how a service's rate limits are read
//! and kept to, and its three policies.
//!
//! * [`PerResource`] (GitHub): the `x-ratelimit-*` headers kept per resource (`core`,
//!   `graphql`); a primary limit (403 or 429 with `x-ratelimit-remaining: 0`) pauses that
//!   resource until `x-ratelimit-reset`, a secondary one (403 or 429 with `retry-after`, or the
//!   "secondary rate limit" message) every request for `retry-after`, or a minute doubling
//!   with each strike.
//! * [`Budget`] (GitLab): the headers of one prefix ([`BudgetHeaders`], `RateLimit-*`) kept as
//!   the shared [`RateLimits`]; a 429 pauses every request for its `Retry-After` (or a doubling
//!   default), a spent budget (`remaining: 0`) until its `reset`.
//! * [`Reported`] (the raw profile): the last rate-limit headers for the snapshot, no pause.
//!
//! While paused, requests fail at once without touching the network (the loop asks
//! [`RatePolicy::paused_for`] first), so a poll fails fast and running work is left alone.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::tracker::TrackerError;
use crate::tracker::http::{self, BudgetHeaders, RateLimits, header};

/// Why a rate limit refused an answer, and the pause it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A resource's budget is spent: its requests wait until the reset.
    Spent { resource: String, wait: Duration },
    /// A secondary limit: every request waits.
    Secondary { wait: Duration },
    /// Too many requests: every request waits.
    TooMany { wait: Duration },
}

impl Refusal {
    /// The error the request fails with.
    pub fn error(&self, provider: &str, status: u16) -> TrackerError {
        TrackerError::unavailable(match self {
            Refusal::Spent { resource, wait } => format!(
                "{provider} rate limit reached (HTTP {status}): {resource} requests wait {}s for the limit to reset",
                wait.as_secs()
            ),
            Refusal::Secondary { wait } => format!(
                "{provider} secondary rate limit (HTTP {status}): every request waits {}s",
                wait.as_secs()
            ),
            Refusal::TooMany { wait } => format!(
                "{provider} rate limit (HTTP {status}): every request waits {}s",
                wait.as_secs().max(1)
            ),
        })
    }
}

/// An answer's headers, names lowercase.
pub type Headers = [(String, String)];

/// How a service's rate limits are read and kept to: the one policy trait of the request loop.
pub trait RatePolicy: Send + Sync {
    /// How long requests spending `resource` must still wait, if they must.
    fn paused_for(&self, resource: &str) -> Option<Duration>;
    /// Notes an answer's headers; a refusal when it was a rate limit (the request then fails
    /// and is not sent again).
    fn answered(
        &self,
        resource: &str,
        status: u16,
        headers: &Headers,
        body: &str,
    ) -> Option<Refusal>;
    /// For the snapshot's `rate_limits`.
    fn snapshot(&self) -> Option<Value>;
}

/// The epoch seconds now.
pub fn epoch_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// The longest pause a secondary limit without `retry-after` grows to (and the longest a
/// `retry-after` is taken for).
pub const MAX_SECONDARY: Duration = http::LONGEST_PAUSE;

#[derive(Default)]
struct ResourceState {
    /// The last `x-ratelimit-*` values per resource.
    resources: serde_json::Map<String, Value>,
    /// Requests of a resource wait until then (primary limits).
    paused: HashMap<String, Instant>,
    /// Every request waits until then (secondary limits).
    paused_all: Option<Instant>,
    /// Secondary limits met in a row (each doubles the pause).
    strikes: u32,
}

/// GitHub's rate limits: `x-ratelimit-*` per resource, primary and secondary limits.
#[derive(Default)]
pub struct PerResource {
    state: Mutex<ResourceState>,
}

impl PerResource {
    fn lock(&self) -> std::sync::MutexGuard<'_, ResourceState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pauses `resource` until its reset (epoch seconds; the last reported one when `None`,
    /// a minute when none was), an hour at most. Returns the pause.
    pub fn pause_primary(&self, resource: &str, reset: Option<u64>) -> Duration {
        let mut l = self.lock();
        let reset = reset.or_else(|| {
            l.resources
                .get(resource)
                .and_then(|r| r.get("reset"))
                .and_then(Value::as_u64)
        });
        let now = epoch_now();
        let wait = Duration::from_secs(
            reset
                .map_or(60, |r| r.saturating_sub(now).saturating_add(1))
                .min(3600),
        );
        l.paused.insert(resource.to_string(), Instant::now() + wait);
        wait
    }

    fn pause_secondary(&self, retry_after: Option<Duration>) -> Duration {
        let mut l = self.lock();
        let wait = retry_after.unwrap_or_else(|| {
            (Duration::from_secs(60) * 2u32.pow(l.strikes.min(4))).min(MAX_SECONDARY)
        });
        l.strikes += 1;
        l.paused_all = Some(Instant::now() + wait);
        wait
    }

    /// Keeps the `x-ratelimit-*` headers under the resource they name (else `resource`).
    fn note(&self, resource: &str, headers: &[(String, String)]) {
        let mut found = serde_json::Map::new();
        let mut name = resource.to_string();
        for (k, v) in headers {
            let Some(field) = k.strip_prefix("x-ratelimit-") else {
                continue;
            };
            if field == "resource" {
                name = v.to_string();
            } else if let Ok(n) = v.parse::<i64>() {
                found.insert(field.to_string(), json!(n));
            }
        }
        if !found.is_empty() {
            self.lock().resources.insert(name, Value::Object(found));
        }
    }
}

impl RatePolicy for PerResource {
    fn paused_for(&self, resource: &str) -> Option<Duration> {
        let l = self.lock();
        let now = Instant::now();
        l.paused_all
            .iter()
            .chain(l.paused.get(resource))
            .filter(|t| **t > now)
            .max()
            .map(|t| t.duration_since(now))
    }

    fn answered(&self, res: &str, status: u16, headers: &Headers, body: &str) -> Option<Refusal> {
        let number = |name: &str| header(headers, name).and_then(|v| v.trim().parse::<u64>().ok());
        let remaining = number("x-ratelimit-remaining");
        let reset = number("x-ratelimit-reset");
        // A wait past the longest pause is taken as the longest (and cannot overflow a clock).
        let retry_after =
            number("retry-after").map(|s| Duration::from_secs(s.min(MAX_SECONDARY.as_secs())));
        self.note(res, headers);
        if status == 403 || status == 429 {
            let secondary = retry_after.is_some() || body.contains("secondary rate limit");
            if remaining == Some(0) && !secondary {
                let wait = self.pause_primary(res, reset);
                return Some(Refusal::Spent {
                    resource: res.to_string(),
                    wait,
                });
            }
            if secondary || status == 429 {
                let wait = self.pause_secondary(retry_after);
                return Some(Refusal::Secondary { wait });
            }
        } else if status < 400 {
            self.lock().strikes = 0;
        }
        None
    }

    /// The last limits per resource, and `paused_for_s` while a pause is under way.
    fn snapshot(&self) -> Option<Value> {
        let l = self.lock();
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
        Some(Value::Object(out))
    }
}

/// GitLab's rate limits: one budget in the headers of a prefix, 429 with `Retry-After`.
pub struct Budget {
    /// Who it is, for the log.
    provider: &'static str,
    policy: BudgetHeaders,
    state: Mutex<RateLimits>,
}

impl Budget {
    pub fn new(provider: &'static str, policy: BudgetHeaders) -> Budget {
        Budget {
            provider,
            policy,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RateLimits> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl RatePolicy for Budget {
    fn paused_for(&self, _resource: &str) -> Option<Duration> {
        self.lock().paused_for()
    }

    fn answered(&self, _: &str, status: u16, headers: &Headers, _: &str) -> Option<Refusal> {
        let retry_after =
            header(headers, "retry-after").and_then(|v| http::seconds(v, http::LONGEST_PAUSE));
        let mut limits = self.lock();
        limits.note(&self.policy, headers);
        if status == 429 {
            let wait = limits.refused(&self.policy, retry_after);
            return Some(Refusal::TooMany { wait });
        }
        if status < 400 {
            limits.ok();
            // The last request the budget allowed: the next ones wait for its reset.
            if let Some(wait) = limits.pause_if_spent(epoch_now()) {
                log::warn!(
                    "{} rate limit spent ({}: 0): requests wait {}s for its reset",
                    self.provider,
                    self.policy.remaining_shown,
                    wait.as_secs()
                );
            }
        }
        None
    }

    fn snapshot(&self) -> Option<Value> {
        self.lock().snapshot()
    }
}

/// The raw profile's rate limits ([`HttpClient`]): the last rate-limit headers a service sent
/// (`x-ratelimit-*`, `ratelimit-*`, `retry-after`), kept for the snapshot. It never pauses nor
/// refuses: the raw client waits and sends again after a 429 itself.
#[derive(Default)]
pub struct Reported {
    last: Mutex<Option<Value>>,
}

impl RatePolicy for Reported {
    fn paused_for(&self, _: &str) -> Option<Duration> {
        None
    }

    fn answered(&self, _: &str, _: u16, headers: &Headers, _: &str) -> Option<Refusal> {
        let mut found = serde_json::Map::new();
        for (n, v) in headers {
            if n.starts_with("x-ratelimit-") || n.starts_with("ratelimit-") || n == "retry-after" {
                found.insert(
                    n.clone(),
                    v.parse::<i64>()
                        .map_or_else(|_| Value::String(v.to_string()), Value::from),
                );
            }
        }
        if !found.is_empty() {
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Value::Object(found));
        }
        None
    }

    fn snapshot(&self) -> Option<Value> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// GitHub's resources, as tests name them.
    const CORE: &str = "core";

    /// A budget of GitLab's headers, a minute's default pause (the loop's tests use it too).
    pub(crate) fn budget() -> Budget {
        Budget::new(
            "test",
            BudgetHeaders {
                header_prefix: "ratelimit-",
                default_pause: Duration::from_secs(60),
                remaining_shown: "RateLimit-Remaining",
            },
        )
    }

    #[test]
    fn per_resource_secondary_limits_pause_everything_and_strikes_double() {
        let limits = PerResource::default();
        let headers = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let secondary = "You have exceeded a secondary rate limit.";
        assert_eq!(
            limits.answered(CORE, 403, &[], secondary),
            Some(Refusal::Secondary {
                wait: Duration::from_secs(60)
            })
        );
        assert!(
            limits.paused_for("graphql").is_some(),
            "every request waits"
        );
        assert_eq!(
            limits.answered(CORE, 403, &[], secondary),
            Some(Refusal::Secondary {
                wait: Duration::from_secs(120)
            })
        );
        // A good answer ends the strikes.
        assert_eq!(limits.answered(CORE, 200, &[], ""), None);
        assert_eq!(
            limits.answered(CORE, 429, &[], ""),
            Some(Refusal::Secondary {
                wait: Duration::from_secs(60)
            })
        );
        // `retry-after` is taken as it is (and marks a secondary limit even with remaining 0).
        assert_eq!(
            limits.answered(
                CORE,
                403,
                &headers(&[("retry-after", "7"), ("x-ratelimit-remaining", "0")]),
                ""
            ),
            Some(Refusal::Secondary {
                wait: Duration::from_secs(7)
            })
        );
        // A 403 that is no rate limit is the caller's (a permission).
        assert_eq!(limits.answered(CORE, 403, &[], "Must have admin"), None);
        // A primary limit without a reset pauses its resource a minute.
        assert_eq!(
            limits.answered(
                GRAPHQL_FOR_TEST,
                429,
                &headers(&[("x-ratelimit-remaining", "0")]),
                ""
            ),
            Some(Refusal::Spent {
                resource: GRAPHQL_FOR_TEST.into(),
                wait: Duration::from_secs(60)
            })
        );
        // The headers are kept under the resource they name.
        limits.answered(
            CORE,
            200,
            &headers(&[
                ("x-ratelimit-resource", "search"),
                ("x-ratelimit-used", "3"),
            ]),
            "",
        );
        assert_eq!(limits.snapshot().unwrap()["search"]["used"], 3);
    }

    const GRAPHQL_FOR_TEST: &str = "graphql";

    #[test]
    fn a_budget_pauses_on_429_and_when_spent() {
        let limits = budget();
        let headers = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        // Only 429 is a refusal: a 403 is a permission.
        assert_eq!(
            limits.answered(CORE, 403, &[], "secondary rate limit"),
            None
        );
        assert_eq!(limits.paused_for(CORE), None);
        assert_eq!(
            limits.answered(CORE, 429, &headers(&[("retry-after", "2.5")]), ""),
            Some(Refusal::TooMany {
                wait: Duration::from_millis(2500)
            })
        );
        assert!(limits.paused_for("anything").is_some());
        assert_eq!(
            limits.answered(CORE, 429, &[], ""),
            Some(Refusal::TooMany {
                wait: Duration::from_secs(120)
            })
        );
        // The error rounds a short pause up to a second.
        assert_eq!(
            Refusal::TooMany {
                wait: Duration::from_millis(300)
            }
            .error("test", 429)
            .message,
            "test rate limit (HTTP 429): every request waits 1s"
        );
        // A spent budget pauses until its reset, though the answer itself went through.
        let spent = budget();
        let reset = (epoch_now() + 50).to_string();
        assert_eq!(
            spent.answered(
                CORE,
                200,
                &headers(&[("ratelimit-remaining", "0"), ("ratelimit-reset", &reset)]),
                ""
            ),
            None
        );
        assert!(spent.paused_for(CORE).unwrap() > Duration::from_secs(45));
        assert_eq!(spent.snapshot().unwrap()["remaining"], 0);
    }
}
