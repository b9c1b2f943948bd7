//! `POST /webhooks/github|gitlab|tracker-a|tracker-b` on the `server.webhook_port` listener: a verified
//! delivery of an event that matters, seen for the first time (`webhook::delivery_keys`), wakes
//! the poller (`Event::WebhookWake`: at most one poll brought forward a polling interval) and is
//! answered 202; svc then reads the truth from the tracker's API. The checks are
//! `crate::webhook`'s. A refusal is counted and logged at most once a minute per route, never
//! with the body; no secret reaches an answer or a log. The handler only sends an event: it
//! never waits for the state thread.

use serde_json::json;
use tiny_http::Request;

use super::{Answer, Ctx, error, json_response};
use crate::orchestrator::protocol::Event;
use crate::time::unix_ms;
use crate::webhook::{self, Source, Verdict};

/// The route's settings from the poller's last good load, or `None` (404).
fn route_settings(ctx: &Ctx, source: Source) -> Option<webhook::Route> {
    let loaded = ctx.loaded.lock().unwrap_or_else(|p| p.into_inner());
    webhook::route_settings(&loaded.settings, source)
}

/// Whether the route is served: its tracker is the dispatch tracker and has a secret.
pub(super) fn configured(ctx: &Ctx, source: Source) -> bool {
    route_settings(ctx, source).is_some()
}

/// Counts a refusal answered before the route's own checks: 413 from the body reader, 405, or
/// a body that could not be read (400, counted with the bodies that are not JSON).
pub(super) fn refused(ctx: &Ctx, source: Source, status: u16) {
    let verdict = match status {
        413 => Verdict::TooLarge,
        405 => Verdict::Method,
        _ => Verdict::NotJson,
    };
    record(ctx, source, verdict);
}

fn record(ctx: &Ctx, source: Source, verdict: Verdict) {
    if ctx.webhooks.record(source, verdict, unix_ms()) {
        log::warn!(
            "webhook {}: refused a delivery ({}); further refusals on this route are counted in \
             the snapshot's webhooks and logged at most once a minute",
            source.route(),
            verdict.label()
        );
    }
}

pub(super) fn respond(ctx: &Ctx, source: Source, request: &Request, body: &[u8]) -> Answer {
    let Some(settings) = route_settings(ctx, source) else {
        return error(404, "not_found", "Route not found");
    };
    let header = |name: &str| {
        request
            .headers()
            .iter()
            .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str().to_string())
    };
    let mut verdict = webhook::judge(source, &settings, &header, body, unix_ms());
    // Only a delivery that would wake is remembered: one that wakes nothing costs nothing again,
    // and cannot push a waking one out.
    if verdict == Verdict::Woke
        && !ctx
            .webhooks
            .deliveries
            .first(&webhook::delivery_keys(source, &header, body))
    {
        verdict = Verdict::Duplicate;
    }
    if verdict == Verdict::Woke {
        let _ = ctx.events.send(Event::WebhookWake);
    }
    record(ctx, source, verdict);
    match verdict {
        Verdict::Woke | Verdict::Ignored | Verdict::Duplicate => {
            json_response(202, &json!({"status": verdict.label()}))
        }
        Verdict::Unauthorized => error(401, "unauthorized", "Missing or invalid webhook signature"),
        Verdict::Stale => error(
            401,
            "unauthorized",
            "Webhook timestamp is more than 60 s from now",
        ),
        Verdict::NotJson => error(400, "invalid_request", "Request body is not JSON"),
        Verdict::TooLarge => error(413, "payload_too_large", "Request body too large"),
        Verdict::Method => error(405, "method_not_allowed", "Only POST is allowed"),
    }
}
