//! The HTTP server: tiny_http on `server.host:server.port` with a small fixed pool of handler
//! threads, a router following the spec's conventions (JSON bodies, `{error: {code, message}}`,
//! 405 on a wrong verb, 404 `Route not found`, 400 for malformed percent encoding, fixed routes
//! before the catch-all), the `/api/v1` routes, the dashboard files and `POST /mcp`.
//!
//! Handlers only read the published snapshot or send an event to the state thread; they never
//! wait for it, so a slow client cannot stall the orchestrator.

pub mod api;
pub mod ws;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crossbeam_channel::Sender;
use serde_json::{Value, json};
use tiny_http::{Header, Request, Response, Server};

use crate::mcp::auth::{bearer, constant_time_eq};
use crate::mcp::server::{McpServer, Reply};
use crate::orchestrator::runtime::Loaded;
use crate::orchestrator::snapshot::{SnapshotHub, rfc3339, unix_ms};
use crate::orchestrator::state::Event;

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY: usize = 1 << 20;
/// Handler threads.
/// Front handler threads: every route but `/mcp` only reads a snapshot or sends an event, so
/// two threads keep a 2-core machine busy without contending.
pub const WORKERS: usize = 2;
/// Threads for `POST /mcp`, whose tool calls may wait on a tracker (up to its timeout); they
/// never hold up the front threads.
pub const MCP_WORKERS: usize = 4;
/// `/mcp` requests waiting for an MCP thread before new ones get 503.
const MCP_QUEUE: usize = 64;

const JSON: &str = "application/json; charset=utf-8";

/// What handlers share.
pub struct Ctx {
    pub hub: Arc<SnapshotHub>,
    pub events: Sender<Event>,
    pub control_token: String,
    pub mcp: Arc<McpServer>,
    pub loaded: Arc<Mutex<Loaded>>,
    /// The issue store; the issue and trace routes exist only with it.
    pub store: Option<Arc<crate::trace::store::IssueStore>>,
    /// Parsed trace timelines (from the trace watcher).
    pub traces: crate::trace::watcher::SharedIndex,
    /// WebSocket clients.
    pub ws: Arc<ws::Hub>,
    /// The port the server listens on.
    pub port: u16,
}

/// WebSocket clients served at once; more get 503.
const MAX_WS_CLIENTS: usize = 256;

/// A bound server; [`HttpServer::start`] spawns the handler threads.
pub struct HttpServer {
    server: Arc<Server>,
    pub addr: std::net::SocketAddr,
}

impl HttpServer {
    pub fn bind(host: &str, port: u16) -> Result<HttpServer, String> {
        let bind_addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let listener = std::net::TcpListener::bind(&bind_addr)
            .map_err(|e| format!("cannot listen on {bind_addr}: {e}"))?;
        // Accepted sockets inherit TCP_NODELAY on Linux: without it, a response written as
        // headers then body waits on the client's delayed ACK (about 40 ms) on keep-alive.
        set_nodelay(&listener);
        let server = Server::from_listener(listener, None)
            .map_err(|e| format!("cannot listen on {bind_addr}: {e}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| format!("{bind_addr} is not an IP listener"))?;
        Ok(HttpServer {
            server: Arc::new(server),
            addr,
        })
    }

    pub fn start(self, ctx: Arc<Ctx>) {
        let (mcp_tx, mcp_rx) = crossbeam_channel::bounded::<Request>(MCP_QUEUE);
        for n in 0..MCP_WORKERS {
            let ctx = Arc::clone(&ctx);
            let rx = mcp_rx.clone();
            let _ = std::thread::Builder::new()
                .name(format!("http-mcp-{n}"))
                .spawn(move || {
                    for request in rx {
                        handle(&ctx, request);
                    }
                });
        }
        for n in 0..WORKERS {
            let server = Arc::clone(&self.server);
            let ctx = Arc::clone(&ctx);
            let mcp_tx = mcp_tx.clone();
            let _ = std::thread::Builder::new()
                .name(format!("http-{n}"))
                .spawn(move || {
                    while let Ok(request) = server.recv() {
                        dispatch(&ctx, &mcp_tx, request);
                    }
                });
        }
    }
}

/// Runs a request on this front thread, or hands it to where it can take its time: `/mcp` to the
/// MCP pool, a WebSocket upgrade to a thread of its own.
fn dispatch(ctx: &Arc<Ctx>, mcp_tx: &crossbeam_channel::Sender<Request>, request: Request) {
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let method = request.method().as_str().to_string();
    if path == "/ws" && method == "GET" {
        if ctx.ws.client_count() >= MAX_WS_CLIENTS {
            let _ = request.respond(error(503, "too_many_clients", "Too many WebSocket clients"));
            return;
        }
        let ctx = Arc::clone(ctx);
        let _ = std::thread::Builder::new()
            .name("ws-client".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                ws::serve(&ctx, &ctx.ws, request, ctx.port);
            });
        return;
    }
    if path == "/mcp" && method == "POST" {
        if let Err(
            crossbeam_channel::TrySendError::Full(r)
            | crossbeam_channel::TrySendError::Disconnected(r),
        ) = mcp_tx.try_send(request)
        {
            let _ = r.respond(error(
                503,
                "mcp_busy",
                "Too many MCP requests in flight; retry shortly",
            ));
        }
        return;
    }
    handle(ctx, request);
}

fn set_nodelay(listener: &std::net::TcpListener) {
    use std::os::unix::io::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads `one` for the given length.
    unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes())
        .expect("static header names and values are valid")
}

fn json_response(status: u16, body: &Value) -> Response<std::io::Cursor<Vec<u8>>> {
    json_text(status, body.to_string())
}

fn json_text(status: u16, body: String) -> Response<std::io::Cursor<Vec<u8>>> {
    Response::from_data(body.into_bytes())
        .with_status_code(status)
        .with_header(header("Content-Type", JSON))
}

fn error(status: u16, code: &str, message: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    json_response(
        status,
        &json!({"error": {"code": code, "message": message}}),
    )
}

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
}

/// Matches a path to a route and the methods it takes. `Err` is an error response.
pub fn route(
    path: &str,
) -> Result<(Route, &'static [&'static str]), (u16, &'static str, &'static str)> {
    const GET: &[&str] = &["GET"];
    const POST: &[&str] = &["POST"];
    let r = match path {
        "/health" => (Route::Health, GET),
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

fn authorization(request: &Request) -> Option<String> {
    request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .map(|h| h.value.as_str().to_string())
}

fn read_body(request: &mut Request) -> Result<Vec<u8>, Response<std::io::Cursor<Vec<u8>>>> {
    if request.body_length().is_some_and(|n| n > MAX_BODY) {
        return Err(error(413, "payload_too_large", "Request body too large"));
    }
    let mut body = Vec::new();
    match request
        .as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut body)
    {
        Ok(_) if body.len() > MAX_BODY => {
            Err(error(413, "payload_too_large", "Request body too large"))
        }
        Ok(_) => Ok(body),
        Err(_) => Err(error(400, "bad_request", "Could not read the request body")),
    }
}

fn handle(ctx: &Ctx, mut request: Request) {
    let url = request.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let method = request.method().as_str().to_string();
    let response = match route(path) {
        Err((status, code, message)) => error(status, code, message),
        Ok((_, methods))
            if !(methods.contains(&method.as_str())
                || method == "HEAD" && methods.contains(&"GET")) =>
        {
            error(
                405,
                "method_not_allowed",
                &format!("Method {method} is not allowed on {path}"),
            )
        }
        Ok((route, _)) => respond(ctx, route, query, &mut request),
    };
    let _ = request.respond(response);
}

fn respond(
    ctx: &Ctx,
    route: Route,
    query: &str,
    request: &mut Request,
) -> Response<std::io::Cursor<Vec<u8>>> {
    match route {
        Route::Health => json_response(200, &json!({"status": "ok"})),
        Route::State => json_text(200, ctx.hub.current().state_json.clone()),
        Route::Runs => {
            let snapshot = ctx.hub.current();
            match api::runs(&snapshot, &parse_query(query), &rfc3339(unix_ms())) {
                Ok(body) => json_response(200, &body),
                Err((status, code, message)) => error(status, code, message),
            }
        }
        Route::Daemon => match &ctx.hub.current().state.daemon {
            Some(d) => json_response(200, &serde_json::to_value(d).unwrap_or(Value::Null)),
            None => error(
                503,
                "daemon_status_unavailable",
                "Daemon status unavailable",
            ),
        },
        Route::Refresh | Route::Stop => {
            let ok = bearer(authorization(request).as_deref())
                .is_some_and(|t| constant_time_eq(t.as_bytes(), ctx.control_token.as_bytes()));
            if !ok {
                return error(401, "unauthorized", "Missing or invalid control token");
            }
            let requested_at = rfc3339(unix_ms());
            if route == Route::Refresh {
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
            } else {
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
        }
        Route::Issue(identifier) => match api::issue_detail(&ctx.hub.current(), &identifier) {
            Some(body) => json_response(200, &body),
            None => error(404, "issue_not_found", "Issue not found"),
        },
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
        Route::Index => static_file(ctx, "index.html"),
        Route::Asset(name) => static_file(ctx, &name),
        Route::Mcp => {
            let body = match read_body(request) {
                Ok(b) => b,
                Err(r) => return r,
            };
            let settings = Arc::clone(
                &ctx.loaded
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .settings,
            );
            match ctx
                .mcp
                .handle(authorization(request).as_deref(), &body, &settings)
            {
                Reply::Accepted => Response::from_data(Vec::new()).with_status_code(202),
                Reply::Json(status, v) => json_response(status, &v),
            }
        }
    }
}

fn content_type(name: &str) -> &'static str {
    match Path::new(name).extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => JSON,
        _ => "application/octet-stream",
    }
}

/// A dashboard file from `server.static_dir`, or from the files built into the binary.
fn static_file(ctx: &Ctx, name: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    let static_dir: Option<PathBuf> = ctx
        .loaded
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .settings
        .server
        .static_dir
        .clone();
    let safe = !name.is_empty()
        && !name
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == ".." || seg.contains('\\'));
    if !safe {
        return error(404, "not_found", "Route not found");
    }
    match static_dir {
        Some(dir) => match std::fs::read(dir.join(name)) {
            Ok(bytes) => {
                Response::from_data(bytes).with_header(header("Content-Type", content_type(name)))
            }
            Err(_) if name == "index.html" => error(
                503,
                "dashboard_not_built",
                &format!(
                    "Dashboard assets not found. Run: cp -r assets/. {} (or unset server.static_dir to use the dashboard built into svc)",
                    dir.display()
                ),
            ),
            Err(_) => error(404, "not_found", "Route not found"),
        },
        None => match crate::assets::get(name) {
            Some((ct, bytes)) => {
                Response::from_data(bytes.to_vec()).with_header(header("Content-Type", ct))
            }
            None => error(404, "not_found", "Route not found"),
        },
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
