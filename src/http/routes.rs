//! Routing: matching a path to a [`Route`] (fixed routes before the catch-all, strict percent
//! decoding of path parameters, 404 `Route not found`, 400 for malformed percent encoding) and
//! answering each route: the `/api/v1` views, `/metrics`, the issue and trace routes, `/mcp`;
//! the control routes are `super::control`'s, the dashboard files `super::dashboard`'s.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use tiny_http::Request;

use super::dashboard::{self, DashboardFile};
use super::{
    Answer, Body, Ctx, JSON, Listener, answer, api, authorization, control, error, header,
    json_response, metrics,
};
use crate::mcp::server::Reply;
use crate::orchestrator::snapshot::Snapshot;
use crate::time::{rfc3339, unix_ms};
use crate::webhook::Source;

/// Decodes `%XX` escapes strictly: a `%` not followed by two hex digits, or bytes that are not
/// UTF-8, is an error.
pub fn percent_decode_strict(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Query string pairs (`+` is a space; malformed escapes are kept as written).
pub fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let dec = |s: &str| {
                let s = s.replace('+', " ");
                percent_decode_strict(&s).unwrap_or(s)
            };
            (dec(k), dec(v))
        })
        .collect()
}

/// The routes, matched in order: fixed routes before the catch-all.
#[derive(Debug, PartialEq)]
pub enum Route {
    Health,
    Index,
    Asset(String),
    State,
    Runs,
    Refresh,
    Daemon,
    Stop,
    Mcp,
    IssuesRecent,
    IssuesSearch,
    Ws,
    Tickets,
    TicketExists(String),
    TicketEvents(String),
    Issue(String),
    Steer(String),
    Cancel(String),
    Metrics,
    /// `POST /webhooks/<service>`: served by the `server.webhook_port` listener only.
    Webhook(Source),
}

impl Route {
    /// The route's name in `/metrics` (parameters left out).
    pub fn label(&self) -> &'static str {
        match self {
            Route::Health => "/health",
            Route::Index => "/",
            Route::Asset(_) => "/assets/{file}",
            Route::State => "/api/v1/state",
            Route::Runs => "/api/v1/runs",
            Route::Refresh => "/api/v1/refresh",
            Route::Daemon => "/api/v1/daemon",
            Route::Stop => "/api/v1/stop",
            Route::Mcp => "/mcp",
            Route::IssuesRecent => "/api/v1/issues/recent",
            Route::IssuesSearch => "/api/v1/issues/search",
            Route::Ws => "/ws",
            Route::Tickets => "/api/v1/tickets",
            Route::TicketExists(_) => "/api/v1/tickets/{id}/exists",
            Route::TicketEvents(_) => "/api/v1/tickets/{id}/events",
            Route::Issue(_) => "/api/v1/{issue_identifier}",
            Route::Steer(_) => "/api/v1/{issue_identifier}/steer",
            Route::Cancel(_) => "/api/v1/{issue_identifier}/cancel",
            Route::Metrics => "/metrics",
            Route::Webhook(source) => source.route(),
        }
    }
}

/// Matches a path to a route and the methods it takes. `Err` is an error response.
pub fn route(
    path: &str,
) -> Result<(Route, &'static [&'static str]), (u16, &'static str, &'static str)> {
    const GET: &[&str] = &["GET"];
    const POST: &[&str] = &["POST"];
    let r = match path {
        "/health" => (Route::Health, GET),
        "/metrics" => (Route::Metrics, GET),
        "/" | "/index.html" => (Route::Index, GET),
        "/api/v1/state" => (Route::State, GET),
        "/api/v1/runs" => (Route::Runs, GET),
        "/api/v1/refresh" => (Route::Refresh, POST),
        "/api/v1/daemon" => (Route::Daemon, GET),
        "/api/v1/stop" => (Route::Stop, POST),
        "/mcp" => (Route::Mcp, POST),
        "/ws" => (Route::Ws, GET),
        "/api/v1/issues/recent" => (Route::IssuesRecent, GET),
        "/api/v1/issues/search" => (Route::IssuesSearch, GET),
        "/api/v1/tickets" => (Route::Tickets, GET),
        "/webhooks/github" => (Route::Webhook(Source::Github), POST),
        "/webhooks/tracker-a" => (Route::Webhook(Source::TrackerA), POST),
        "/webhooks/tracker-b" => (Route::Webhook(Source::TrackerB), POST),
        "/webhooks/gitlab" => (Route::Webhook(Source::Gitlab), POST),
        p if p.starts_with("/api/v1/tickets/") => {
            let rest = &p["/api/v1/tickets/".len()..];
            let (raw, tail) = rest
                .rsplit_once('/')
                .ok_or((404, "not_found", "Route not found"))?;
            if raw.is_empty() || raw.contains('/') {
                return Err((404, "not_found", "Route not found"));
            }
            let id = percent_decode_strict(raw).ok_or((
                400,
                "invalid_path_parameter",
                "Malformed percent encoding in path parameter",
            ))?;
            match tail {
                "exists" => (Route::TicketExists(id), GET),
                "events" => (Route::TicketEvents(id), GET),
                _ => return Err((404, "not_found", "Route not found")),
            }
        }
        p if p.starts_with("/assets/") => {
            let rest = &p["/assets/".len()..];
            let decoded = percent_decode_strict(rest).ok_or((
                400,
                "invalid_path_parameter",
                "Malformed percent encoding in path parameter",
            ))?;
            (Route::Asset(decoded), GET)
        }
        p if p.starts_with("/api/v1/") && action_of(p).is_some() => {
            let (raw, action) = action_of(p).unwrap_or_default();
            let decoded = percent_decode_strict(raw).ok_or((
                400,
                "invalid_path_parameter",
                "Malformed percent encoding in path parameter",
            ))?;
            match action {
                "steer" => (Route::Steer(decoded), POST),
                _ => (Route::Cancel(decoded), POST),
            }
        }
        p if p.starts_with("/api/v1/")
            && !p["/api/v1/".len()..].is_empty()
            && !p["/api/v1/".len()..].contains('/') =>
        {
            let raw = &p["/api/v1/".len()..];
            let decoded = percent_decode_strict(raw).ok_or((
                400,
                "invalid_path_parameter",
                "Malformed percent encoding in path parameter",
            ))?;
            (Route::Issue(decoded), GET)
        }
        _ => return Err((404, "not_found", "Route not found")),
    };
    Ok(r)
}

/// `/api/v1/<issue>/steer` or `/api/v1/<issue>/cancel`: the raw issue and the action.
fn action_of(path: &str) -> Option<(&str, &'static str)> {
    let rest = path.strip_prefix("/api/v1/")?;
    let (raw, tail) = rest.split_once('/')?;
    let action = match tail {
        "steer" => "steer",
        "cancel" => "cancel",
        _ => return None,
    };
    (!raw.is_empty()).then_some((raw, action))
}

/// The answer of a routed request whose method the route takes. The `server.mcp_port`
/// listener serves only `/health` and `/mcp`.
pub(super) fn respond(
    ctx: &Ctx,
    route: Route,
    query: &str,
    request: &Request,
    body: &[u8],
) -> Answer {
    match (ctx.listener, &route) {
        (Listener::Webhooks, Route::Webhook(source)) => {
            return super::webhooks::respond(ctx, *source, request, body);
        }
        (Listener::Webhooks, _) => return error(404, "not_found", "Route not found"),
        (Listener::PerRun, Route::Health) => {
            return json_response(200, &json!({"status": "ok"}));
        }
        (Listener::PerRun, Route::Mcp) => return mcp_response(ctx, request, body),
        (Listener::PerRun, _) => return error(404, "not_found", "Route not found"),
        (Listener::Dashboard, _) => {}
    }
    match route {
        Route::Health => json_response(200, &json!({"status": "ok"})),
        Route::State => match workflow_view(&ctx.hub.current(), query) {
            Ok(None) => {
                answer(Body::State(ctx.hub.current())).with_header(header("Content-Type", JSON))
            }
            Ok(Some(only)) => {
                answer(Body::State(Arc::new(only))).with_header(header("Content-Type", JSON))
            }
            Err(no) => no,
        },
        Route::Metrics => {
            let (tracker, webhook_listener) = {
                let loaded = ctx.loaded.lock().unwrap_or_else(|p| p.into_inner());
                (
                    loaded.settings.tracker.kind.clone(),
                    loaded.settings.server.webhook_port.is_some(),
                )
            };
            let body = metrics::render(
                &ctx.hub.current(),
                &metrics::Extra {
                    tracker: &tracker,
                    requests: &ctx.requests,
                    ws_clients: ctx.ws.client_count(),
                    now: unix_ms(),
                    webhooks: webhook_listener.then_some(&*ctx.webhooks),
                },
            );
            answer(Body::Owned(body.into_bytes()))
                .with_status_code(200)
                .with_header(header("Content-Type", metrics::CONTENT_TYPE))
        }
        Route::Runs => {
            let mut snapshot = match workflow_view(&ctx.hub.current(), query) {
                Ok(None) => ctx.hub.current(),
                Ok(Some(only)) => Arc::new(only),
                Err(no) => return no,
            };
            let mut query = parse_query(query);
            // `?issue=` names an issue as the issue routes do: qualified, or unambiguous.
            if let Some(issue) = query.get("issue").filter(|i| !i.is_empty()).cloned() {
                match one_workflow(&snapshot, &issue) {
                    Ok(Some((only, bare))) => {
                        query.insert("issue".into(), bare.to_string());
                        snapshot = Arc::new(only);
                    }
                    Ok(None) => {}
                    Err(no) => return no,
                }
            }
            match api::runs(&snapshot, &query, &rfc3339(unix_ms())) {
                Ok(body) => json_response(200, &body),
                Err((status, code, message)) => error(status, code, message),
            }
        }
        Route::Daemon => match ctx.hub.current().daemon_status_at(crate::time::unix_ms()) {
            Some(d) => json_response(200, &serde_json::to_value(&d).unwrap_or(Value::Null)),
            None => error(
                503,
                "daemon_status_unavailable",
                "Daemon status unavailable",
            ),
        },
        Route::Refresh => control::refresh(ctx, request),
        Route::Stop => control::stop(ctx, request),
        Route::Steer(identifier) => control::steer(ctx, request, &identifier, body),
        Route::Cancel(identifier) => control::cancel(ctx, request, &identifier),
        Route::Issue(identifier) => {
            let snapshot = ctx.hub.current();
            let (snapshot, bare) = match one_workflow(&snapshot, &identifier) {
                Ok(Some((only, bare))) => (Arc::new(only), bare),
                Ok(None) => (snapshot, identifier.as_str()),
                Err(no) => return no,
            };
            match api::issue_detail(&snapshot, bare) {
                Some(body) => json_response(200, &body),
                None => error(404, "issue_not_found", "Issue not found"),
            }
        }
        Route::Tickets | Route::TicketExists(_) | Route::TicketEvents(_) => {
            let Some(store) = &ctx.store else {
                return error(404, "not_found", "Route not found");
            };
            let index = ctx.traces.read().unwrap_or_else(|p| p.into_inner());
            match route {
                Route::Tickets => json_response(
                    200,
                    &json!({"tickets": api::tickets(&index, &ctx.hub.current(), store)}),
                ),
                Route::TicketExists(id) => {
                    json_response(200, &json!({"exists": index.tickets.contains_key(&id)}))
                }
                Route::TicketEvents(id) => {
                    let t = index.tickets.get(&id);
                    json_response(
                        200,
                        &json!({
                            "issueId": id,
                            "identifier": t.and_then(|t| t.facts.identifier.clone()),
                            "events": index.events_of(&id),
                        }),
                    )
                }
                _ => unreachable!("matched above"),
            }
        }
        Route::IssuesRecent | Route::IssuesSearch => {
            let Some(store) = &ctx.store else {
                return error(404, "not_found", "Route not found");
            };
            let q = parse_query(query);
            let default = if route == Route::IssuesRecent { 5 } else { 20 };
            let limit = q
                .get("limit")
                .and_then(|l| l.trim().parse::<i64>().ok())
                .map_or(default, |l| l.clamp(1, 100)) as usize;
            let result = if route == Route::IssuesRecent {
                store.recent(limit)
            } else {
                store.search(q.get("q").map_or("", String::as_str), limit)
            };
            match result {
                Ok(issues) => json_response(200, &json!({"issues": issues})),
                Err(e) => error(503, "issue_store_unavailable", &e.0),
            }
        }
        // Upgrades are taken off the front threads before routing; a plain request lands here.
        Route::Ws => error(
            400,
            "websocket_upgrade_required",
            "GET /ws needs a WebSocket upgrade",
        ),
        Route::Index => dashboard::file(ctx, DashboardFile::Index),
        Route::Asset(name) => dashboard::file(ctx, DashboardFile::Asset(&name)),
        Route::Mcp => mcp_response(ctx, request, body),
        // Never routed here: the dashboard's listener does not serve them (`super::served`).
        Route::Webhook(_) => error(404, "not_found", "Route not found"),
    }
}

/// `POST /mcp` with the settings of this request: per-run claims only on the `mcp_port`
/// listener, the settings-scoped token only on the dashboard's.
fn mcp_response(ctx: &Ctx, request: &Request, body: &[u8]) -> Answer {
    let auth = authorization(request);
    let settings = mcp_settings(ctx, auth.as_deref());
    let reply = if ctx.listener == Listener::PerRun {
        ctx.mcp.handle_claimed(auth.as_deref(), body, &settings)
    } else {
        ctx.mcp.handle(auth.as_deref(), body, &settings)
    };
    match reply {
        Reply::Accepted => answer(Body::Owned(Vec::new())).with_status_code(202),
        Reply::Json(status, v) => json_response(status, &v),
    }
}

/// The settings an `/mcp` request is served under: its workflow's, in a daemon serving
/// several (a per-run claim names its run, whose id ends with its workflow's name; a
/// settings-scoped token was minted under one workflow's settings); else the only one's.
fn mcp_settings(ctx: &Ctx, authorization: Option<&str>) -> Arc<crate::config::Settings> {
    let settings_of = |loaded: &std::sync::Mutex<crate::orchestrator::poller::Loaded>| {
        Arc::clone(&loaded.lock().unwrap_or_else(|p| p.into_inner()).settings)
    };
    let workflows = ctx
        .workflows
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if workflows.len() > 1 {
        let run = ctx.mcp.run_of(authorization);
        for (name, loaded) in &workflows {
            let settings = settings_of(loaded);
            let mine = match &run {
                // `run-<ms>-<seq>-<workflow>`.
                Some(run_id) => run_id.splitn(4, '-').nth(3) == Some(&**name),
                None => ctx.mcp.minted_under(authorization, &settings),
            };
            if mine {
                return settings;
            }
        }
    }
    settings_of(&ctx.loaded)
}

/// `?workflow=NAME` of the state and runs routes: that workflow's view (`None`: the whole);
/// a workflow the daemon does not serve answers 404 `workflow_not_found`.
fn workflow_view(snapshot: &Snapshot, query: &str) -> Result<Option<Snapshot>, Answer> {
    match parse_query(query).get("workflow").filter(|w| !w.is_empty()) {
        None => Ok(None),
        Some(name) if snapshot.has_workflow(name) => Ok(Some(snapshot.only(name))),
        Some(_) => Err(error(
            404,
            "workflow_not_found",
            "No workflow of that name: GET /api/v1/state lists the workflows",
        )),
    }
}

/// The one workflow an issue route's identifier names in a daemon serving several:
/// `<workflow>:<identifier>`, or a bare identifier only one workflow has (`None`: one
/// workflow, or none has it). Several: 409 `ambiguous_issue`, listing them.
fn one_workflow<'a>(
    snapshot: &Snapshot,
    identifier: &'a str,
) -> Result<Option<(Snapshot, &'a str)>, Answer> {
    if let Some((workflow, bare)) = identifier.split_once(':')
        && snapshot.has_workflow(workflow)
    {
        return Ok(Some((snapshot.only(workflow), bare)));
    }
    match snapshot.workflows_of(identifier).as_slice() {
        [] => Ok(None),
        [one] => Ok(Some((snapshot.only(one), identifier))),
        many => Err(super::control::ambiguous(identifier, many)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_routes_win_over_the_catch_all() {
        assert_eq!(route("/api/v1/state").unwrap().0, Route::State);
        assert_eq!(route("/api/v1/runs").unwrap().0, Route::Runs);
        assert_eq!(route("/api/v1/daemon").unwrap().0, Route::Daemon);
        assert_eq!(
            route("/api/v1/ENG-1").unwrap().0,
            Route::Issue("ENG-1".into())
        );
        assert_eq!(
            route("/api/v1/a%2Fb").unwrap().0,
            Route::Issue("a/b".into())
        );
        assert_eq!(
            route("/api/v1/tickets/x%2Fy/events").unwrap().0,
            Route::TicketEvents("x/y".into())
        );
        assert_eq!(route("/api/v1/tickets/x/nope").unwrap_err().0, 404);
        assert_eq!(route("/api/v1/tickets/%zz/exists").unwrap_err().0, 400);
        assert_eq!(
            route("/api/v1/bad%zz").unwrap_err(),
            (
                400,
                "invalid_path_parameter",
                "Malformed percent encoding in path parameter"
            )
        );
        assert_eq!(route("/api/v1/a/b").unwrap_err().0, 404);
        assert_eq!(
            route("/nope").unwrap_err(),
            (404, "not_found", "Route not found")
        );
        assert_eq!(route("/mcp").unwrap().1, &["POST"]);
        assert_eq!(
            route("/api/v1/ENG-1/cancel").unwrap(),
            (Route::Cancel("ENG-1".into()), &["POST"][..])
        );
        assert_eq!(
            route("/api/v1/a%2Fb/steer").unwrap().0,
            Route::Steer("a/b".into())
        );
        assert_eq!(route("/api/v1//cancel").unwrap_err().0, 404);
        assert_eq!(route("/api/v1/a/b/cancel").unwrap_err().0, 404);
        assert_eq!(route("/api/v1/%zz/cancel").unwrap_err().0, 400);
        assert_eq!(
            route("/webhooks/tracker-a").unwrap(),
            (
                Route::Webhook(crate::webhook::Source::TrackerA),
                &["POST"][..]
            )
        );
        assert_eq!(route("/webhooks/other").unwrap_err().0, 404);
        for source in Source::ALL {
            assert_eq!(route(source.route()).unwrap().0, Route::Webhook(source));
            assert_eq!(Route::Webhook(source).label(), source.route());
        }
    }

    #[test]
    fn percent_decoding_is_strict() {
        assert_eq!(percent_decode_strict("a%20b").as_deref(), Some("a b"));
        assert_eq!(percent_decode_strict("%E2%9C%85").as_deref(), Some("✅"));
        assert_eq!(percent_decode_strict("%"), None);
        assert_eq!(percent_decode_strict("%4"), None);
        assert_eq!(percent_decode_strict("%GG"), None);
        assert_eq!(percent_decode_strict("%FF"), None, "not UTF-8");
        let q = parse_query("issue=ENG-1&failed&limit=5&q=a+b%21");
        assert_eq!(q["issue"], "ENG-1");
        assert_eq!(q["failed"], "");
        assert_eq!(q["q"], "a b!");
    }
}
