//! The pieces the one request loop (`tracker::rest`) is made of, with no loop of their own: the
//! HTTP agent and its timeouts, a conditional-GET cache, a rate-limit budget's state, the
//! origin rule for credentials, the seconds a server asks to wait, REST errors and next-page
//! links.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use super::TrackerError;

/// Longest wait between attempts, whatever `Retry-After` asks.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// The longest pause any server's word can ask for (a rate limit's reset, say).
pub const LONGEST_PAUSE: Duration = Duration::from_secs(15 * 60);

/// A number of seconds a server sent (`Retry-After`, a reset-after header, a 429 body's
/// `retry_after`) as a duration no longer than `cap`: `None` for text that is not a finite,
/// non-negative number. Untrusted input never panics here (`Duration::from_secs_f64` does on a
/// negative, infinite, NaN or huge value).
pub fn seconds(text: &str, cap: Duration) -> Option<Duration> {
    let secs: f64 = text.trim().parse().ok()?;
    seconds_f64(secs, cap)
}

/// [`seconds`] for a number already read.
pub fn seconds_f64(secs: f64, cap: Duration) -> Option<Duration> {
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(cap.as_secs_f64())))
}

/// The first value of a header (names lowercase).
pub fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Overrides every tracker request timeout, in milliseconds.
pub const TIMEOUT_VAR: &str = "SVC_TRACKER_TIMEOUT_MS";

/// An HTTP agent whose requests time out after `default`, or after `SVC_TRACKER_TIMEOUT_MS`
/// milliseconds when that variable is set; a status is an answer, not an error. Without
/// `follow_redirects` the caller sees each 3xx and decides whether the next request may carry
/// its credentials (only to the same origin).
pub fn agent(default: Duration, follow_redirects: bool) -> ureq::Agent {
    let timeout = std::env::var(TIMEOUT_VAR)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(default, Duration::from_millis);
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false);
    let config = if follow_redirects {
        config
    } else {
        config.max_redirects(0)
    };
    config.build().into()
}

/// The origin (`scheme://host[:port]`, lowercased) of an absolute URL, `None` for anything
/// else: credentials go only where their origin is.
pub fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    // Userinfo is never part of the origin (and `user@host` must not pass for `host`).
    let host = authority.rsplit('@').next()?;
    if host.is_empty() {
        return None;
    }
    let scheme = scheme.to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => return None,
    };
    let host = host.strip_suffix(default_port).unwrap_or(&host);
    Some(format!("{scheme}://{host}"))
}

/// Conditional answers kept (one per URL read); past it the least recently used half goes.
const CACHE_MAX: usize = 1024;
/// Bytes of kept bodies at most (URLs change, the comment lists' every quarter hour, and one
/// list can be large): past it the least recently used answers go until a quarter is free.
const CACHE_BYTES: usize = 16 * 1024 * 1024;
struct Cached {
    etag: String,
    body: String,
    next: Option<String>,
    used: u64,
}

impl Cached {
    /// What it holds, in bytes (the URL it is kept under counted in).
    fn size(&self, url: &str) -> usize {
        url.len() + self.etag.len() + self.body.len() + self.next.as_ref().map_or(0, String::len)
    }
}

/// The conditional answers, least recently used first out, bounded by count and bytes.
#[derive(Default)]
struct Cache {
    map: HashMap<String, Cached>,
    /// A use counter: each entry's `used` is its last value.
    tick: u64,
    /// The sum of the entries' sizes.
    bytes: usize,
}

/// Conditional GET answers kept per URL, for a service that answers an unchanged resource
/// `304 Not Modified` to `If-None-Match` (GitHub, where a 304 costs no rate limit): the last
/// `ETag` of each URL with its body and next page, bounded by count and bytes.
#[derive(Default)]
pub struct ConditionalCache {
    inner: Mutex<Cache>,
}

impl ConditionalCache {
    /// The `ETag` kept for `url`, to send as `If-None-Match` (the entry counts as used).
    pub fn etag(&self, url: &str) -> Option<String> {
        let mut cache = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        cache.tick += 1;
        let now = cache.tick;
        cache.map.get_mut(url).map(|c| {
            c.used = now;
            c.etag.clone()
        })
    }

    /// The body and next page kept for `url` (what a 304 stands for).
    pub fn kept(&self, url: &str) -> Option<(String, Option<String>)> {
        let cache = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        cache.map.get(url).map(|c| (c.body.clone(), c.next.clone()))
    }

    /// Keeps an answer (its `ETag`, body and next page) for `url`, the least recently used
    /// going first past the bounds.
    pub fn remember(&self, url: String, etag: String, body: String, next: Option<String>) {
        let entry = Cached {
            etag,
            body,
            next,
            used: 0,
        };
        let size = entry.size(&url);
        let mut cache = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = cache.map.remove(&url) {
            cache.bytes -= old.size(&url);
        }
        // A body larger than the budget is not kept: its next read is a full one.
        if size > CACHE_BYTES {
            return;
        }
        if cache.map.len() >= CACHE_MAX || cache.bytes + size > CACHE_BYTES {
            let mut ages: Vec<(u64, usize)> = cache
                .map
                .iter()
                .map(|(url, c)| (c.used, c.size(url)))
                .collect();
            ages.sort_unstable();
            // Out go the oldest: half of them past the count, and past the bytes as many as
            // leave a quarter of the budget free besides the new entry.
            let mut count = if cache.map.len() >= CACHE_MAX {
                ages.len() / 2
            } else {
                0
            };
            let mut left = cache.bytes;
            for (n, (_, bytes)) in ages.iter().enumerate() {
                if n >= count && left + size <= CACHE_BYTES / 4 * 3 {
                    break;
                }
                left -= bytes;
                count = count.max(n + 1);
            }
            if let Some(&(cut, _)) = count.checked_sub(1).and_then(|i| ages.get(i)) {
                cache.map.retain(|_, c| c.used > cut);
            }
            cache.bytes = cache.map.iter().map(|(url, c)| c.size(url)).sum();
        }
        cache.tick += 1;
        let used = cache.tick;
        cache.bytes += size;
        cache.map.insert(url, Cached { used, ..entry });
    }
}

/// A service's rate-limit state as a [`BudgetHeaders`] reads it: the last values of its
/// rate-limit headers, and a pause that a 429 (or an exhausted budget) starts. Requests made
/// while paused fail at once without touching the network, so a poll fails fast and running
/// work is left alone.
#[derive(Default)]
pub struct RateLimits {
    /// The last rate-limit headers, names without their prefix (`limit`, `remaining`, ...).
    last: serde_json::Map<String, Value>,
    /// Every request waits until then.
    paused_until: Option<std::time::Instant>,
    /// 429s met in a row (each doubles a pause that came without `Retry-After`).
    strikes: u32,
}

/// How a service reports its rate limits: the header prefix (`x-ratelimit-` for GitHub and
/// most services, `ratelimit-` for GitLab's IETF-draft headers), and the pause a 429 without
/// `Retry-After` starts.
#[derive(Clone, Copy, Debug)]
pub struct BudgetHeaders {
    pub header_prefix: &'static str,
    pub default_pause: Duration,
    /// The remaining-budget header as logs name it (`RateLimit-Remaining`).
    pub remaining_shown: &'static str,
}

impl RateLimits {
    /// How long requests must still wait, if they must.
    pub fn paused_for(&self) -> Option<Duration> {
        let now = std::time::Instant::now();
        self.paused_until
            .filter(|t| *t > now)
            .map(|t| t.duration_since(now))
    }

    /// Keeps the policy's headers of an answer (`header` looks one up by lowercase name);
    /// `headers` lists the answer's names.
    pub fn note(&mut self, policy: &BudgetHeaders, headers: &[(String, String)]) {
        let mut found = serde_json::Map::new();
        for (name, value) in headers {
            if let Some(field) = name.strip_prefix(policy.header_prefix) {
                found.insert(
                    field.to_string(),
                    value
                        .trim()
                        .parse::<i64>()
                        .map_or_else(|_| Value::String(value.to_string()), Value::from),
                );
            }
        }
        if !found.is_empty() {
            self.last = found;
        }
    }

    /// The budget is spent (`remaining` 0 in the last headers): pauses until its `reset`
    /// (epoch seconds in the last headers, `now` the epoch seconds now; at most
    /// [`LONGEST_PAUSE`]), so the next request does not earn a 429. Returns the pause, if any.
    pub fn pause_if_spent(&mut self, now: u64) -> Option<Duration> {
        if self.last.get("remaining").and_then(Value::as_i64) != Some(0) {
            return None;
        }
        let reset = self.last.get("reset").and_then(Value::as_u64)?;
        let wait =
            Duration::from_secs(reset.saturating_sub(now).saturating_add(1)).min(LONGEST_PAUSE);
        self.paused_until = Some(std::time::Instant::now() + wait);
        Some(wait)
    }

    /// An answer that was no refusal ends a run of strikes.
    pub fn ok(&mut self) {
        self.strikes = 0;
    }

    /// Starts a pause after a 429: `retry_after` when the service said, else the policy's
    /// default doubling with each strike, never past [`LONGEST_PAUSE`]. Returns the pause.
    pub fn refused(&mut self, policy: &BudgetHeaders, retry_after: Option<Duration>) -> Duration {
        let wait = retry_after
            .unwrap_or_else(|| policy.default_pause * 2u32.pow(self.strikes.min(6)))
            .min(LONGEST_PAUSE);
        self.strikes += 1;
        self.paused_until = Some(std::time::Instant::now() + wait);
        wait
    }

    /// For the snapshot's `rate_limits`: the last headers, and `paused_for_s` while paused.
    pub fn snapshot(&self) -> Option<Value> {
        let paused = self.paused_for();
        if self.last.is_empty() && paused.is_none() {
            return None;
        }
        let mut out = self.last.clone();
        if let Some(p) = paused {
            out.insert("paused_for_s".into(), Value::from(p.as_secs().max(1)));
        }
        Some(Value::Object(out))
    }
}

/// `s` percent-encoded for a path segment or a query value (everything but letters and digits).
pub fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// What a REST provider's (GitHub's, GitLab's) errors say about it.
pub struct RestErrors {
    /// `github`, `gitlab`.
    pub provider: &'static str,
    /// What to check after a 401 (`check the gitlab api_key or GITLAB_TOKEN`).
    pub unauthorized: &'static str,
    /// What a 403 that is no rate limit means (`the token lacks a permission this needs`).
    pub forbidden: &'static str,
    /// The statuses that say the request itself was wrong.
    pub invalid: &'static [u16],
}

impl RestErrors {
    /// A body that should be JSON.
    pub fn parse(&self, body: &str) -> Result<serde_json::Value, TrackerError> {
        serde_json::from_str(body).map_err(|_| {
            TrackerError::unavailable(format!(
                "{} answered with a body that is not JSON",
                self.provider
            ))
        })
    }

    /// The error for an unexpected status: the provider's own message (`message`, or
    /// `error`), and what to do for 401 and 403; never the path's query.
    pub fn status(&self, method: &str, path: &str, status: u16, body: &str) -> TrackerError {
        use serde_json::Value;
        let message = serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|v| {
                v.get("message")
                    .or_else(|| v.get("error"))
                    .map(|m| match m {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
            })
            .unwrap_or_default();
        let what = format!(
            "{} {method} {} answered HTTP {status}",
            self.provider,
            path_shown(path)
        );
        match status {
            401 => TrackerError::unavailable(format!("{what}: {message} ({})", self.unauthorized)),
            404 => {
                TrackerError::not_found(format!("{what}: not found (or the token cannot see it)"))
            }
            403 => TrackerError::config(format!("{what}: {message} ({})", self.forbidden)),
            s if self.invalid.contains(&s) => TrackerError::invalid(format!("{what}: {message}")),
            _ => TrackerError::unavailable(format!("{what}: {message}")),
        }
    }
}

/// A path as errors show it: without its query string.
pub fn path_shown(path: &str) -> &str {
    path.split('?').next().unwrap_or(path)
}

/// The `rel="next"` URL of a `Link` header (RFC 8288).
pub fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim() == "rel=\"next\"")
            .then(|| {
                url.trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_string()
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers are kept by bytes too: comment-list URLs change every quarter hour and one list
    /// can be large, so a count alone let the cache grow with time. The oldest go first.
    #[test]
    fn the_cache_is_bounded_by_bytes_and_the_oldest_go_first() {
        let api = ConditionalCache::default();
        let body = "x".repeat(1024 * 1024);
        for n in 0..40 {
            api.remember(format!("http://h/{n}"), "\"e\"".into(), body.clone(), None);
        }
        {
            let cache = api.inner.lock().unwrap();
            assert!(cache.bytes <= CACHE_BYTES, "{}", cache.bytes);
            let sum: usize = cache.map.iter().map(|(url, c)| c.size(url)).sum();
            assert_eq!(cache.bytes, sum);
            assert!(cache.map.contains_key("http://h/39"), "the newest stays");
            assert!(!cache.map.contains_key("http://h/0"), "the oldest goes");
        }
        // Kept again under the same URL: counted once.
        api.remember("http://h/39".into(), "\"f\"".into(), "[]".into(), None);
        let cache = api.inner.lock().unwrap();
        let sum: usize = cache.map.iter().map(|(url, c)| c.size(url)).sum();
        assert_eq!(cache.bytes, sum);
        drop(cache);
        // A body larger than the whole budget is not kept at all.
        api.remember(
            "http://h/big".into(),
            "\"g\"".into(),
            "x".repeat(CACHE_BYTES + 1),
            None,
        );
        assert!(!api.inner.lock().unwrap().map.contains_key("http://h/big"));
    }

    #[test]
    fn origins_compare_scheme_host_and_port_only() {
        assert_eq!(
            origin("https://GitLab.example.com/api/v4/projects").as_deref(),
            Some("https://gitlab.example.com")
        );
        assert_eq!(
            origin("https://gitlab.example.com:443/x"),
            origin("https://gitlab.example.com/y")
        );
        assert_ne!(
            origin("http://127.0.0.1:8080/a"),
            origin("http://127.0.0.1:8081/a")
        );
        assert_ne!(
            origin("https://gitlab.example.com@evil.example/a"),
            origin("https://gitlab.example.com/a")
        );
        assert_eq!(origin("/relative"), None);
        assert_eq!(origin("ftp://x/y"), None);
    }

    #[test]
    fn a_429_pauses_for_retry_after_and_strikes_double_the_default() {
        let policy = BudgetHeaders {
            header_prefix: "ratelimit-",
            default_pause: Duration::from_secs(10),
            remaining_shown: "RateLimit-Remaining",
        };
        let mut limits = RateLimits::default();
        limits.note(
            &policy,
            &[
                ("ratelimit-remaining".into(), "0".into()),
                ("x-other".into(), "1".into()),
            ],
        );
        assert_eq!(limits.snapshot().unwrap()["remaining"], 0);
        assert_eq!(
            limits.refused(&policy, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert!(limits.paused_for().is_some());
        assert!(limits.snapshot().unwrap()["paused_for_s"].as_u64().unwrap() >= 1);
        assert_eq!(limits.refused(&policy, None), Duration::from_secs(20));
        limits.ok();
        assert_eq!(limits.refused(&policy, None), Duration::from_secs(10));
        // A spent budget pauses until its reset, a hostile reset no longer than the longest.
        let mut spent = RateLimits::default();
        let headers = |remaining: &str, reset: &str| {
            vec![
                ("ratelimit-remaining".to_string(), remaining.to_string()),
                ("ratelimit-reset".to_string(), reset.to_string()),
            ]
        };
        spent.note(&policy, &headers("5", "1000"));
        assert_eq!(spent.pause_if_spent(990), None);
        spent.note(&policy, &headers("0", "1000"));
        assert_eq!(spent.pause_if_spent(990), Some(Duration::from_secs(11)));
        spent.note(&policy, &headers("0", &i64::MAX.to_string()));
        assert_eq!(spent.pause_if_spent(0), Some(LONGEST_PAUSE));
    }

    /// Property: whatever text a server sends as a number of seconds, reading it never panics,
    /// never exceeds the cap, and takes every plain non-negative number below the cap as it is.
    #[test]
    fn seconds_never_panic_and_stay_under_the_cap() {
        let cap = Duration::from_secs(30);
        let fixed = [
            "-1",
            "inf",
            "-inf",
            "NaN",
            "1e20",
            "1e309",
            "-0",
            "0",
            "+5",
            " 7 ",
            "",
            "1.5e",
            "0x10",
            "18446744073709551616",
            "3.000000000000000001",
            "Wed, 21 Oct 2015 07:28:00 GMT",
        ];
        // A small deterministic generator: random numbers of every magnitude and sign, and
        // random bytes.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut cases: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
        for _ in 0..20_000 {
            let r = next();
            cases.push(match r % 3 {
                0 => f64::from_bits(next()).to_string(),
                1 => format!("{}e{}", (r >> 8) as i64 % 1000, (next() % 700) as i64 - 350),
                _ => (0..(r % 12))
                    .map(|_| (next() % 128) as u8 as char)
                    .collect(),
            });
        }
        for text in &cases {
            if let Some(d) = seconds(text, cap) {
                assert!(d <= cap, "{text:?} -> {d:?}");
                let n: f64 = text.trim().parse().unwrap();
                assert!(n.is_finite() && n >= 0.0, "{text:?} taken");
                if n < 30.0 {
                    assert!((d.as_secs_f64() - n).abs() < 1e-6, "{text:?} -> {d:?}");
                }
            }
        }
        assert_eq!(seconds("-1", cap), None);
        assert_eq!(seconds("inf", cap), None);
        assert_eq!(seconds("NaN", cap), None);
        assert_eq!(seconds("1e20", cap), Some(cap));
        assert_eq!(seconds(" 2.5 ", cap), Some(Duration::from_millis(2500)));
    }
}
