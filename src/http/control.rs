//! The control routes, `POST /api/v1/refresh`, `POST /api/v1/stop`,
//! `POST /api/v1/<issue_identifier>/steer` and `POST /api/v1/<issue_identifier>/cancel`: each
//! needs the control token (`Authorization:
//! Bearer`, compared in constant time). Refresh, steer and cancel ask the state thread, which
//! answers from the state it owns (the published snapshot lags it by up to 100 ms, and an issue
//! dispatched a moment ago is not in it yet); stop sends its event and answers 202 at once.

use serde_json::{Value, json};
use tiny_http::Request;

use super::{Answer, Ctx, authorization, error, json_response};
use crate::mcp::auth::{bearer, constant_time_eq};
use crate::orchestrator::protocol::{Ask, Event};
use crate::time::{rfc3339, unix_ms};
use crossbeam_channel::{Sender, bounded};

/// Whether the request carries the control token.
fn authorized(ctx: &Ctx, request: &Request) -> bool {
    bearer(authorization(request).as_deref())
        .is_some_and(|t| constant_time_eq(t.as_bytes(), ctx.control_token.as_bytes()))
}

fn unauthorized() -> Answer {
    error(401, "unauthorized", "Missing or invalid control token")
}

/// How long a route waits for the state thread's answer (it handles events as they come, so
/// this is only reached when it is gone or stuck).
const ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn unavailable() -> Answer {
    error(
        503,
        "orchestrator_unavailable",
        "Orchestrator is unavailable",
    )
}

/// Asks the state thread (`make` builds the request around the reply channel) and waits for
/// its answer; the 503 to answer when it is gone or does not answer in time.
fn ask<T>(ctx: &Ctx, make: impl FnOnce(Sender<T>) -> Ask) -> Result<T, Answer> {
    let (tx, rx) = bounded(1);
    ctx.events
        .send(Event::Asked(make(tx)))
        .map_err(|_| unavailable())?;
    rx.recv_timeout(ASK_TIMEOUT).map_err(|_| unavailable())
}

/// `POST /api/v1/refresh`: a poll and reconciliation now (coalesced with one in flight).
pub(super) fn refresh(ctx: &Ctx, request: &Request) -> Answer {
    if !authorized(ctx, request) {
        return unauthorized();
    }
    let requested_at = rfc3339(unix_ms());
    let coalesced = match ask(ctx, |reply| Ask::Refresh { reply }) {
        Ok(in_flight) => in_flight,
        Err(answer) => return answer,
    };
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

/// The largest steering message the API takes, in bytes (the agent gets at most
/// `steering::TEXT_MAX` of it, with a note when it is cut).
pub use crate::steering::STEER_MAX;

/// `POST /api/v1/<issue_identifier>/steer` (`{"message": "...", "author": "..."}`): a
/// steering message for the running agent (its next turn), or for its next run when it
/// is retrying or waiting. 202 says where it went (`delivery`: `running` or `next_run`).
pub(super) fn steer(ctx: &Ctx, request: &Request, identifier: &str, body: &[u8]) -> Answer {
    use crate::steering::Message;
    if !authorized(ctx, request) {
        return unauthorized();
    }
    let invalid = |why: &str| error(400, "invalid_request", why);
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return invalid(
            "the body must be a JSON object: {\"message\": \"...\", \"author\": \"...\"}",
        );
    };
    let Some(text) = v.get("message").and_then(Value::as_str) else {
        return invalid("message (a string) is required");
    };
    if text.trim().is_empty() {
        return invalid("message is empty");
    }
    if text.len() > STEER_MAX {
        return invalid(&format!(
            "message is {} bytes; at most {STEER_MAX} are taken",
            text.len()
        ));
    }
    let author = match v.get("author") {
        None | Some(Value::Null) => "operator".to_string(),
        Some(Value::String(a)) if !a.trim().is_empty() && a.len() <= 200 => a.trim().to_string(),
        Some(_) => return invalid("author must be a non-empty string of at most 200 bytes"),
    };
    // The issue id is filled in by the state thread, which knows where the issue is now.
    let message = Message::operator(
        String::new(),
        crate::steering::Source::Api,
        author,
        text.to_string(),
        unix_ms(),
    );
    let key = message.key.clone();
    let routed = match ask(ctx, |reply| Ask::Steer {
        identifier: identifier.to_string(),
        message,
        reply,
    }) {
        Ok(Some(routed)) if routed.what == "ambiguous" => {
            return ambiguous(identifier, &routed.among);
        }
        Ok(Some(routed)) => routed,
        Ok(None) => return error(404, "issue_not_found", "Issue not found"),
        Err(answer) => return answer,
    };
    let mut body = json!({"accepted": true, "issue_identifier": identifier, "delivery": routed.what, "key": key});
    relayed(&mut body, routed.holder);
    json_response(202, &body)
}

/// `POST /api/v1/<issue_identifier>/cancel`: stops the runs (outcome `canceled`, no
/// retry) or drops its retry; the issue is not dispatched again while its tracker state stays
/// the same. 202 says what was canceled (`running` or `retrying`).
pub(super) fn cancel(ctx: &Ctx, request: &Request, identifier: &str) -> Answer {
    if !authorized(ctx, request) {
        return unauthorized();
    }
    let routed = match ask(ctx, |reply| Ask::Cancel {
        identifier: identifier.to_string(),
        reply,
    }) {
        Ok(Some(routed)) if routed.what == "ambiguous" => {
            return ambiguous(identifier, &routed.among);
        }
        Ok(Some(routed)) => routed,
        Ok(None) => return error(404, "issue_not_found", "Issue not found"),
        Err(answer) => return answer,
    };
    let mut body = json!({"requested_at": rfc3339(unix_ms()), "issue_identifier": identifier, "canceled": routed.what});
    relayed(&mut body, routed.holder);
    json_response(202, &body)
}

/// 409 `ambiguous_issue`: several workflows of the daemon have an issue of that identifier;
/// the answer lists them, and the qualified form names one.
pub(super) fn ambiguous(identifier: &str, among: &[String]) -> Answer {
    let message = format!(
        "{identifier} is an issue of several workflows ({}): name one as <workflow>:{identifier}",
        among.join(", ")
    );
    json_response(
        409,
        &json!({"error": {"code": "ambiguous_issue", "message": message}, "workflows": among}),
    )
}

/// A request for an issue another daemon of the fleet holds went through the claim store:
/// the answer says `relayed` and names the holder (its owner id).
fn relayed(body: &mut Value, holder: Option<String>) {
    if let Some(holder) = holder {
        body["relayed"] = Value::Bool(true);
        body["holder"] = Value::String(holder);
    }
}
