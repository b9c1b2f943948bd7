//! The control routes, `POST /api/v1/refresh` and `POST /api/v1/stop`: each needs the control
//! token (`Authorization: Bearer`, compared in constant time), sends the state thread an event
//! and answers 202 without waiting for it.

use serde_json::json;
use tiny_http::Request;

use super::{Answer, Ctx, authorization, error, json_response};
use crate::mcp::auth::{bearer, constant_time_eq};
use crate::orchestrator::snapshot::{rfc3339, unix_ms};
use crate::orchestrator::state::Event;

/// Whether the request carries the control token.
fn authorized(ctx: &Ctx, request: &Request) -> bool {
    bearer(authorization(request).as_deref())
        .is_some_and(|t| constant_time_eq(t.as_bytes(), ctx.control_token.as_bytes()))
}

fn unauthorized() -> Answer {
    error(401, "unauthorized", "Missing or invalid control token")
}

/// `POST /api/v1/refresh`: a poll and reconciliation now (coalesced with one in flight).
pub(super) fn refresh(ctx: &Ctx, request: &Request) -> Answer {
    if !authorized(ctx, request) {
        return unauthorized();
    }
    let requested_at = rfc3339(unix_ms());
    let coalesced = ctx.hub.current().poll_in_flight;
    if ctx.events.send(Event::Refresh).is_err() {
        return error(
            503,
            "orchestrator_unavailable",
            "Orchestrator is unavailable",
        );
    }
    json_response(
        202,
        &json!({"requested_at": requested_at, "queued": !coalesced, "coalesced": coalesced, "operations": ["poll", "reconcile"]}),
    )
}

/// `POST /api/v1/stop`: a graceful stop, as on SIGTERM.
pub(super) fn stop(ctx: &Ctx, request: &Request) -> Answer {
    if !authorized(ctx, request) {
        return unauthorized();
    }
    let requested_at = rfc3339(unix_ms());
    if ctx.events.send(Event::Shutdown).is_err() {
        return error(
            503,
            "daemon_control_unavailable",
            "Daemon control unavailable",
        );
    }
    json_response(
        202,
        &json!({"requested_at": requested_at, "stopping": true}),
    )
}
