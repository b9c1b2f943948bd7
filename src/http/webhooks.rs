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

/// The route's settings from each workflow's last good load (the workflow's name with them;
/// none: 404).
fn route_settings(ctx: &Ctx, source: Source) -> Vec<(std::sync::Arc<str>, webhook::Route)> {
    let workflows = ctx
        .workflows
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    workflows
        .iter()
        .filter_map(|(name, loaded)| {
            let loaded = loaded.lock().unwrap_or_else(|p| p.into_inner());
            webhook::route_settings(&loaded.settings, source).map(|r| (name.clone(), r))
        })
        .collect()
}

/// Whether the route is served: some workflow's tracker is of its kind and has a secret.
pub(super) fn configured(ctx: &Ctx, source: Source) -> bool {
    !route_settings(ctx, source).is_empty()
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
    let routes = route_settings(ctx, source);
    if routes.is_empty() {
        return error(404, "not_found", "Route not found");
    }
    let header = |name: &str| {
        request
            .headers()
            .iter()
            .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str().to_string())
    };
    // Each workflow judges the delivery with its own secret and scope: it wakes those whose
    // verdict is to wake; else the answer is the verdict of one that verified it, if any.
    let now = unix_ms();
    let verdicts: Vec<(std::sync::Arc<str>, Verdict)> = routes
        .iter()
        .map(|(name, route)| {
            (
                name.clone(),
                webhook::judge(source, route, &header, body, now),
            )
        })
        .collect();
    let woken: Vec<String> = verdicts
        .iter()
        .filter(|(_, v)| *v == Verdict::Woke)
        .map(|(name, _)| name.to_string())
        .collect();
    let mut verdict = if woken.is_empty() {
        verdicts
            .iter()
            .map(|(_, v)| *v)
            .find(|v| *v == Verdict::Ignored)
            .unwrap_or(verdicts[0].1)
    } else {
        Verdict::Woke
    };
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
        let several = ctx
            .workflows
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len()
            > 1;
        let _ = ctx.events.send(if several {
            Event::WebhookWakeOf(woken)
        } else {
            Event::WebhookWake
        });
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
