//! Webhooks' pure parts: which service a route is for, checking a delivery the way its service
//! documents it (an HMAC-SHA256 of the raw body, compared in constant time by `hmac`'s
//! `verify_slice`; GitLab's `X-Gitlab-Token`, the secret itself, compared in constant time), which events wake the poller, the deliveries seen lately ([`Deliveries`]), and the
//! counts the snapshot and `/metrics` show. No I/O and no clock of its own: the caller hands in
//! `now`. The HTTP side is `http::webhooks`.
//!
//! An event only wakes the poller: svc then reads the truth from the tracker's API. Nothing a
//! payload claims (state, labels, authors) is trusted.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::config::{Provider, Settings};

/// A webhook route's service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Github,
    TrackerA,
    TrackerB,
    Gitlab,
}

impl Source {
    pub const ALL: [Source; 4] = [
        Source::Github,
        Source::TrackerA,
        Source::TrackerB,
        Source::Gitlab,
    ];

    pub fn route(self) -> &'static str {
        match self {
            Source::Github => "/webhooks/github",
            Source::TrackerA => "/webhooks/tracker-a",
            Source::TrackerB => "/webhooks/tracker-b",
            Source::Gitlab => "/webhooks/gitlab",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn provider(self) -> Provider {
        match self {
            Source::Github => Provider::Github,
            Source::TrackerA => Provider::TrackerA,
            Source::TrackerB => Provider::TrackerB,
            Source::Gitlab => Provider::Gitlab,
        }
    }
}

/// What became of a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Verified, and it woke the poller.
    Woke,
    /// Verified; an event that wakes nothing (another kind, or another repository or project).
    Ignored,
    /// Verified; a delivery that would wake, seen before (the same body, or the same delivery id).
    Duplicate,
    /// No signature header, or one that does not match.
    Unauthorized,
    /// Linear's `webhookTimestamp` missing or more than [`MAX_SKEW_MS`] from now.
    Stale,
    /// Over `http::MAX_BODY`.
    TooLarge,
    /// Signed, but not JSON.
    NotJson,
    /// A method other than POST.
    Method,
}

impl Verdict {
    pub const ALL: [Verdict; 8] = [
        Verdict::Woke,
        Verdict::Ignored,
        Verdict::Duplicate,
        Verdict::Unauthorized,
        Verdict::Stale,
        Verdict::TooLarge,
        Verdict::NotJson,
        Verdict::Method,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Verdict::Woke => "woke",
            Verdict::Ignored => "ignored",
            Verdict::Duplicate => "duplicate",
            Verdict::Unauthorized => "unauthorized",
            Verdict::Stale => "stale",
            Verdict::TooLarge => "too_large",
            Verdict::NotJson => "not_json",
            Verdict::Method => "method_not_allowed",
        }
    }

    /// Accepted (answered 2xx), as opposed to refused.
    pub fn accepted(self) -> bool {
        matches!(self, Verdict::Woke | Verdict::Ignored | Verdict::Duplicate)
    }
}

/// Linear's documented window: a delivery whose `webhookTimestamp` is further from now is stale.
pub const MAX_SKEW_MS: u64 = 60_000;
/// Delivery keys remembered (two a delivery at most), the oldest forgotten first.
pub const DELIVERY_IDS: usize = 8192;
/// A route's refusals are logged at most this often.
pub const LOG_EVERY_MS: u64 = 60_000;

/// What a route needs to check and judge a delivery, read from the current settings.
pub struct Route {
    pub secret: crate::config::Secret,
    /// GitHub: the watched `owner/name`s; Jira: the project keys when no JQL widens the scope
    /// (empty: any project).
    pub scope: Vec<String>,
}

/// The route's settings, or `None` when it answers 404: its tracker is not the dispatch
/// tracker, or has no `webhook_secret`.
pub fn route_settings(settings: &Settings, source: Source) -> Option<Route> {
    let tracker = &settings.tracker;
    if tracker.provider != source.provider() {
        return None;
    }
    let secret = tracker.webhook_secret.clone().filter(|s| !s.is_empty())?;
    let scope = match &tracker.options {
        crate::config::ProviderOptions::Github(g) => g.repos.clone(),
        crate::config::ProviderOptions::Gitlab(g) => g.projects.clone(),
        crate::config::ProviderOptions::TrackerB(b) if b.scope.jql.is_none() => {
            b.scope.project_keys.clone()
        }
        _ => Vec::new(),
    };
    Some(Route { secret, scope })
}

/// Checks a delivery and decides whether it wakes the poller. `header` looks a request header
/// up by name (case-insensitive). A duplicate is the caller's to find (it holds the
/// [`Deliveries`]; see [`delivery_keys`]).
pub fn judge(
    source: Source,
    route: &Route,
    header: &dyn Fn(&str) -> Option<String>,
    body: &[u8],
    now: u64,
) -> Verdict {
    if source == Source::Gitlab {
        return judge_gitlab(route, header, body);
    }
    let signature = match source {
        Source::Gitlab => None,
        Source::Github => header("X-Hub-Signature-256")
            .and_then(|s| s.trim().strip_prefix("sha256=").map(str::to_string)),
        Source::TrackerA => header("Linear-Signature").map(|s| s.trim().to_string()),
        Source::TrackerB => header("X-Hub-Signature")
            .and_then(|s| s.trim().strip_prefix("sha256=").map(str::to_string)),
    };
    let Some(signature) = signature.and_then(|s| hex_decode(&s)) else {
        return Verdict::Unauthorized;
    };
    if !signed(route.secret.expose().as_bytes(), body, &signature) {
        return Verdict::Unauthorized;
    }
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return Verdict::NotJson;
    };
    match source {
        Source::Gitlab => Verdict::Unauthorized,
        Source::Github => {
            let event = header("X-GitHub-Event").unwrap_or_default();
            let watched = json
                .pointer("/repository/full_name")
                .and_then(Value::as_str)
                .is_some_and(|repo| route.scope.iter().any(|r| r.eq_ignore_ascii_case(repo)));
            let wakes = matches!(
                event.as_str(),
                "issues"
                    | "issue_comment"
                    | "pull_request_review"
                    | "pull_request_review_comment"
                    | "check_run"
                    | "check_suite"
                    | "status"
            );
            if wakes && watched {
                Verdict::Woke
            } else {
                Verdict::Ignored
            }
        }
        Source::TrackerA => {
            let fresh = json
                .get("webhookTimestamp")
                .and_then(Value::as_u64)
                .is_some_and(|at| at.abs_diff(now) <= MAX_SKEW_MS);
            if !fresh {
                return Verdict::Stale;
            }
            match json.get("type").and_then(Value::as_str) {
                Some("Issue" | "Comment") => Verdict::Woke,
                _ => Verdict::Ignored,
            }
        }
        Source::TrackerB => {
            let event = json
                .get("webhookEvent")
                .and_then(Value::as_str)
                .unwrap_or("");
            let wakes = event.starts_with("jira:issue_") || event.starts_with("comment_");
            let project = json
                .pointer("/issue/fields/project/key")
                .and_then(Value::as_str);
            let watched = route.scope.is_empty()
                || project.is_none_or(|p| route.scope.iter().any(|k| k.eq_ignore_ascii_case(p)));
            if wakes && watched {
                Verdict::Woke
            } else {
                Verdict::Ignored
            }
        }
    }
}

/// GitLab signs nothing: a delivery carries the secret itself in `X-Gitlab-Token`, compared
/// in constant time. Issue, note, merge request and pipeline events of a watched project
/// (`project.path_with_namespace`) wake the poller and the feedback reader.
fn judge_gitlab(route: &Route, header: &dyn Fn(&str) -> Option<String>, body: &[u8]) -> Verdict {
    let Some(token) = header("X-Gitlab-Token") else {
        return Verdict::Unauthorized;
    };
    if !same_secret(token.as_bytes(), route.secret.expose().as_bytes()) {
        return Verdict::Unauthorized;
    }
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return Verdict::NotJson;
    };
    let event = header("X-Gitlab-Event").unwrap_or_default();
    let wakes = matches!(
        event.as_str(),
        "Issue Hook"
            | "Confidential Issue Hook"
            | "Note Hook"
            | "Confidential Note Hook"
            | "Merge Request Hook"
            | "Pipeline Hook"
    );
    let watched = json
        .pointer("/project/path_with_namespace")
        .and_then(Value::as_str)
        .is_some_and(|p| route.scope.iter().any(|s| s.eq_ignore_ascii_case(p)));
    if wakes && watched {
        Verdict::Woke
    } else {
        Verdict::Ignored
    }
}

/// Whether two secrets are equal, in time that depends on their lengths only: each is
/// reduced to its HMAC under a fixed key, and the two MACs compared by `verify_slice`.
fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    let mac = |bytes: &[u8]| {
        let mut m = Hmac::<Sha256>::new_from_slice(b"svc gitlab token")
            .expect("HMAC takes keys of any length");
        m.update(bytes);
        m
    };
    let expected = mac(secret).finalize().into_bytes();
    mac(given).verify_slice(&expected).is_ok()
}

/// Whether `signature` is the HMAC-SHA256 of `body` under `secret` (constant time).
fn signed(secret: &[u8], body: &[u8], signature: &[u8]) -> bool {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(signature).is_ok()
}

/// The hex signature `sha256=` headers and Linear carry (`HMAC-SHA256` of `body`).
pub fn sign_hex(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// The header by which each service identifies a delivery, the same on its retries: GitHub's
/// `X-GitHub-Delivery`, Linear's `Linear-Delivery`, Jira's `X-Atlassian-Webhook-Identifier`,
/// GitLab's `Idempotency-Key`. None is signed, so it only catches a service's own redelivery.
fn id_header(source: Source) -> &'static str {
    match source {
        Source::Github => "X-GitHub-Delivery",
        Source::TrackerA => "Linear-Delivery",
        Source::TrackerB => "X-Atlassian-Webhook-Identifier",
        Source::Gitlab => "Idempotency-Key",
    }
}

/// What makes a verified delivery the same as one seen before: its body, which is what GitHub,
/// Linear and Jira sign (a replay carries the same body and signature whatever its headers
/// say; GitLab's deliveries differ by their timestamps too), and the service's delivery id
/// ([`id_header`]). Each key is a SHA-256, so remembering one costs 32 bytes.
pub fn delivery_keys(
    source: Source,
    header: &dyn Fn(&str) -> Option<String>,
    body: &[u8],
) -> Vec<[u8; 32]> {
    use sha2::Digest;
    let key = |kind: &str, value: &[u8]| -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(source.route().as_bytes());
        h.update([0]);
        h.update(kind.as_bytes());
        h.update([0]);
        h.update(value);
        h.finalize().into()
    };
    let mut keys = vec![key("body", body)];
    if let Some(id) = header(id_header(source)).filter(|id| !id.trim().is_empty()) {
        keys.push(key("id", id.trim().as_bytes()));
    }
    keys
}

/// A delivery key (a SHA-256).
type Key = [u8; 32];

/// Deliveries seen lately, by their [`delivery_keys`] (bounded: [`DELIVERY_IDS`]).
#[derive(Default)]
pub struct Deliveries {
    seen: Mutex<(VecDeque<Key>, HashSet<Key>)>,
}

impl Deliveries {
    /// Remembers `keys`; false when any of them was seen before.
    pub fn first(&self, keys: &[[u8; 32]]) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (order, set) = &mut *seen;
        let fresh = !keys.iter().any(|k| set.contains(k));
        for k in keys {
            if !set.insert(*k) {
                continue;
            }
            order.push_back(*k);
            if order.len() > DELIVERY_IDS
                && let Some(old) = order.pop_front()
            {
                set.remove(&old);
            }
        }
        fresh
    }
}

/// Per route and verdict, what the webhook listener answered; shared by the listener (which
/// counts), the dashboard's `/metrics` and the state thread (which reads it into the snapshot).
#[derive(Default)]
pub struct Stats {
    counts: [[AtomicU64; Verdict::ALL.len()]; Source::ALL.len()],
    last_at: [AtomicU64; Source::ALL.len()],
    last_logged: [AtomicU64; Source::ALL.len()],
    pub deliveries: Deliveries,
}

/// One route's figures.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RouteFigures {
    pub accepted: u64,
    pub refused: u64,
    /// When the last delivery arrived (ms since the epoch), if any.
    pub last_at: Option<u64>,
}

impl Stats {
    /// Counts a delivery; true when a refusal should be logged now (at most once a minute per
    /// route).
    pub fn record(&self, source: Source, verdict: Verdict, now: u64) -> bool {
        let i = source.index();
        let v = Verdict::ALL.iter().position(|x| *x == verdict).unwrap_or(0);
        self.counts[i][v].fetch_add(1, Ordering::Relaxed);
        self.last_at[i].fetch_max(now.max(1), Ordering::Relaxed);
        if verdict.accepted() {
            return false;
        }
        let last = self.last_logged[i].load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= LOG_EVERY_MS)
            && self.last_logged[i]
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    pub fn count(&self, source: Source, verdict: Verdict) -> u64 {
        let v = Verdict::ALL.iter().position(|x| *x == verdict).unwrap_or(0);
        self.counts[source.index()][v].load(Ordering::Relaxed)
    }

    pub fn figures(&self, source: Source) -> RouteFigures {
        let (mut accepted, mut refused) = (0, 0);
        for verdict in Verdict::ALL {
            let n = self.count(source, verdict);
            if verdict.accepted() {
                accepted += n;
            } else {
                refused += n;
            }
        }
        let last = self.last_at[source.index()].load(Ordering::Relaxed);
        RouteFigures {
            accepted,
            refused,
            last_at: (last > 0).then_some(last),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn route(scope: &[&str]) -> Route {
        Route {
            secret: Secret::new("s3cret"),
            scope: scope.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn headers(pairs: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn github_deliveries_are_checked_by_their_sha256_signature() {
        let body = br#"{"repository":{"full_name":"Acme/App"}}"#;
        let sig = format!("sha256={}", sign_hex(b"s3cret", body));
        let ok = headers(vec![
            ("X-Hub-Signature-256", sig.clone()),
            ("X-GitHub-Event", "issues".into()),
        ]);
        let r = route(&["acme/app"]);
        assert_eq!(judge(Source::Github, &r, &ok, body, 0), Verdict::Woke);
        // Another repository, or an event that wakes nothing.
        assert_eq!(
            judge(Source::Github, &route(&["acme/other"]), &ok, body, 0),
            Verdict::Ignored
        );
        let push = headers(vec![
            ("X-Hub-Signature-256", sig.clone()),
            ("X-GitHub-Event", "push".into()),
        ]);
        assert_eq!(judge(Source::Github, &r, &push, body, 0), Verdict::Ignored);
        // Missing, malformed, wrong, or the body changed.
        let none = headers(vec![("X-GitHub-Event", "issues".into())]);
        assert_eq!(
            judge(Source::Github, &r, &none, body, 0),
            Verdict::Unauthorized
        );
        let bare = headers(vec![("X-Hub-Signature-256", sig[7..].to_string())]);
        assert_eq!(
            judge(Source::Github, &r, &bare, body, 0),
            Verdict::Unauthorized
        );
        let wrong = format!("sha256={}", sign_hex(b"other", body));
        let wrong = headers(vec![("X-Hub-Signature-256", wrong)]);
        assert_eq!(
            judge(Source::Github, &r, &wrong, body, 0),
            Verdict::Unauthorized
        );
        assert_eq!(
            judge(Source::Github, &r, &ok, b"{} ", 0),
            Verdict::Unauthorized
        );
        // Signed but not JSON.
        let sig = format!("sha256={}", sign_hex(b"s3cret", b"nope"));
        let signed = headers(vec![("X-Hub-Signature-256", sig)]);
        assert_eq!(
            judge(Source::Github, &r, &signed, b"nope", 0),
            Verdict::NotJson
        );
    }

    #[test]
    fn gitlab_deliveries_carry_the_secret_and_wake_for_their_projects_events() {
        let body = br#"{"object_kind":"note","project":{"path_with_namespace":"Acme/Sub/App"}}"#;
        let with = |token: &str, event: &str| {
            headers(vec![
                ("X-Gitlab-Token", token.to_string()),
                ("X-Gitlab-Event", event.to_string()),
            ])
        };
        let r = route(&["acme/sub/app"]);
        for event in [
            "Issue Hook",
            "Note Hook",
            "Merge Request Hook",
            "Pipeline Hook",
        ] {
            assert_eq!(
                judge(Source::Gitlab, &r, &with("s3cret", event), body, 0),
                Verdict::Woke,
                "{event}"
            );
        }
        assert_eq!(
            judge(Source::Gitlab, &r, &with("s3cret", "Push Hook"), body, 0),
            Verdict::Ignored
        );
        assert_eq!(
            judge(
                Source::Gitlab,
                &route(&["acme/other"]),
                &with("s3cret", "Note Hook"),
                body,
                0
            ),
            Verdict::Ignored
        );
        for wrong in ["s3cre", "s3cret ", "S3CRET", ""] {
            assert_eq!(
                judge(Source::Gitlab, &r, &with(wrong, "Note Hook"), body, 0),
                Verdict::Unauthorized,
                "{wrong:?}"
            );
        }
        let none = headers(vec![("X-Gitlab-Event", "Note Hook".into())]);
        assert_eq!(
            judge(Source::Gitlab, &r, &none, body, 0),
            Verdict::Unauthorized
        );
        assert_eq!(
            judge(Source::Gitlab, &r, &with("s3cret", "Note Hook"), b"nope", 0),
            Verdict::NotJson
        );
    }

    #[test]
    fn linear_deliveries_need_a_fresh_timestamp() {
        let now = 1_800_000_000_000u64;
        let check = |at: u64, kind: &str| {
            let body = format!(r#"{{"type":"{kind}","action":"create","webhookTimestamp":{at}}}"#);
            let h = headers(vec![(
                "Linear-Signature",
                sign_hex(b"s3cret", body.as_bytes()),
            )]);
            judge(Source::TrackerA, &route(&[]), &h, body.as_bytes(), now)
        };
        assert_eq!(check(now - 1_000, "Issue"), Verdict::Woke);
        assert_eq!(check(now + 1_000, "Comment"), Verdict::Woke);
        assert_eq!(check(now - 1_000, "Cycle"), Verdict::Ignored);
        assert_eq!(check(now - 61_000, "Issue"), Verdict::Stale);
        assert_eq!(check(now + 61_000, "Issue"), Verdict::Stale);
    }

    #[test]
    fn jira_deliveries_wake_for_issues_and_comments_of_watched_projects() {
        let check = |event: &str, project: &str, scope: &[&str]| {
            let body = format!(
                r#"{{"webhookEvent":"{event}","issue":{{"fields":{{"project":{{"key":"{project}"}}}}}}}}"#
            );
            let sig = format!("sha256={}", sign_hex(b"s3cret", body.as_bytes()));
            let h = headers(vec![("X-Hub-Signature", sig)]);
            judge(Source::TrackerB, &route(scope), &h, body.as_bytes(), 0)
        };
        assert_eq!(check("jira:issue_created", "ENG", &["ENG"]), Verdict::Woke);
        assert_eq!(check("comment_created", "ENG", &[]), Verdict::Woke);
        assert_eq!(
            check("jira:issue_created", "OPS", &["ENG"]),
            Verdict::Ignored
        );
        assert_eq!(check("sprint_started", "ENG", &["ENG"]), Verdict::Ignored);
    }

    #[test]
    fn deliveries_are_remembered_within_a_bound() {
        let d = Deliveries::default();
        let key = |s: &str| delivery_keys(Source::Github, &|_| None, s.as_bytes());
        assert!(d.first(&key("a")));
        assert!(!d.first(&key("a")));
        for i in 0..DELIVERY_IDS {
            assert!(d.first(&key(&i.to_string())));
        }
        // "a" was the oldest and is forgotten.
        assert!(d.first(&key("a")));
    }

    #[test]
    fn a_delivery_is_the_same_by_its_body_or_its_services_id() {
        let d = Deliveries::default();
        let with = |id: Option<&'static str>| {
            move |name: &str| {
                id.filter(|_| name.eq_ignore_ascii_case("Linear-Delivery"))
                    .map(str::to_string)
            }
        };
        let keys = |id, body: &str| delivery_keys(Source::TrackerA, &with(id), body.as_bytes());
        assert!(d.first(&keys(Some("d-1"), "{\"n\":1}")));
        // The same body under another id (a replay), or the same id again (a redelivery).
        assert!(!d.first(&keys(Some("d-2"), "{\"n\":1}")));
        assert!(!d.first(&keys(Some("d-1"), "{\"n\":2}")));
        assert!(!d.first(&keys(None, "{\"n\":1}")));
        assert!(d.first(&keys(None, "{\"n\":3}")));
        // Routes apart.
        let gitlab = delivery_keys(Source::Gitlab, &|_| None, b"{\"n\":3}");
        assert!(d.first(&gitlab));
    }

    #[test]
    fn refusals_are_logged_at_most_once_a_minute_per_route() {
        let s = Stats::default();
        assert!(s.record(Source::Github, Verdict::Unauthorized, 1_000));
        assert!(!s.record(Source::Github, Verdict::Unauthorized, 2_000));
        assert!(s.record(Source::TrackerA, Verdict::Stale, 2_000));
        assert!(!s.record(Source::Github, Verdict::Woke, 3_000));
        assert!(s.record(Source::Github, Verdict::NotJson, 61_000));
        let f = s.figures(Source::Github);
        assert_eq!((f.accepted, f.refused, f.last_at), (1, 3, Some(61_000)));
        assert_eq!(s.figures(Source::TrackerB), RouteFigures::default());
    }
}
