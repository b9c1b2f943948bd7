//! GitLab's REST API v4 as the `gitlab` tracker and pack use it, spoken through the shared
//! REST loop ([`crate::tracker::rest`]):
//!
//! * The token goes as `Authorization: Bearer` to the configured endpoint's origin only. No
//!   redirect is followed by the HTTP agent: a redirect within the origin is followed by the
//!   loop, one to another origin is refused (the token would go with it, openai/symphony #124).
//! * GitLab's `RateLimit-*` headers are kept for the snapshot's `rate_limits`; a 429 pauses
//!   every request for its `Retry-After` (or a doubling default), a spent budget
//!   (`RateLimit-Remaining: 0`) until its `RateLimit-Reset`, and requests fail at once
//!   meanwhile, so a poll fails fast and running work is left alone (the shared
//!   [`Budget`] policy).
//! * Lists follow keyset pagination (`Link: rel="next"`) or `X-Next-Page`.
//!
//! Reads are retried on transport errors and 5xx; writes that must not be applied twice
//! (notes, new issues) never are. The token never appears in an error.

use std::time::Duration;

use crate::config::Secret;
use crate::tracker::http::{BudgetHeaders, RestErrors};
use crate::tracker::rate::Budget;
use crate::tracker::rest::{Profile, Rest};

/// GitLab's rate-limit headers, and the pause of a 429 that says no `Retry-After`.
const POLICY: BudgetHeaders = BudgetHeaders {
    header_prefix: "ratelimit-",
    default_pause: Duration::from_secs(60),
    remaining_shown: "RateLimit-Remaining",
};

/// How GitLab's API is spoken, and how its errors read.
static GITLAB: Profile = Profile {
    errors: RestErrors {
        provider: "gitlab",
        unauthorized: "check the gitlab api_key or GITLAB_TOKEN",
        forbidden: "the token lacks a scope or role this needs",
        invalid: &[400, 409, 422],
    },
    accept: "application/json",
    headers: &[],
    conditional: false,
    same_origin: true,
    x_next_page: true,
    user_agent: true,
};

/// GitLab's API client.
pub type Api = Rest<Budget>;

/// A client of the GitLab API at `endpoint` (`.../api/v4`).
pub fn new(endpoint: &str, token: Secret) -> Api {
    Rest::new(&GITLAB, endpoint, token, Budget::new("gitlab", POLICY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_show_gitlabs_message_and_never_the_query() {
        let e = GITLAB.errors.status(
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
            GITLAB.errors.status("GET", "/x", 404, "").kind,
            crate::tracker::TrackerErrorKind::NotFound
        );
    }
}
