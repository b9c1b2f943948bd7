//! The HTTP server: tiny_http on `server.host:server.port` with a small fixed pool of handler
//! threads, a router following the spec's conventions (JSON bodies, `{error: {code, message}}`,
//! 405 on a wrong verb, 404 `Route not found`, 400 for malformed percent encoding, fixed routes
//! before the catch-all), the `/api/v1` routes, the dashboard files and `POST /mcp`.
//!
//! Handlers only read the published snapshot or send an event to the state thread; they never
//! wait for it, so a slow client cannot stall the orchestrator.
//!
//! Hostile clients. tiny_http 0.12 gives every connection a thread and two descriptors and times
//! nothing out; it gives up accepting for good on the first accept error (running out of
//! descriptors); it reads header lines without a length limit; and when a request is dropped it
//! discards the unread rest of its body, first allocating a buffer of the size the client declared
//! and then waiting for the client to send it. So: the [`guard`] thread closes connections that
//! idle, dawdle over a header or a body, or send a header without end, sheds the longest idle when
//! connections or descriptors run short, and restarts the accept loop when tiny_http has given it
//! up; accepted sockets get a send timeout; bodies are read only on the pool threads, with a
//! deadline; and a request declaring a body too large to discard is never dropped
//! ([`refuse_huge_body`]).

pub mod api;
mod guard;
pub mod metrics;
pub mod ws;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use serde_json::{Value, json};
use tiny_http::{Header, Request, Response, Server};

use crate::mcp::auth::{bearer, constant_time_eq};
use crate::mcp::server::{McpServer, Reply};
use crate::orchestrator::runtime::Loaded;
use crate::orchestrator::snapshot::{SnapshotHub, rfc3339, unix_ms};
use crate::orchestrator::state::Event;

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY: usize = 1 << 20;
/// Front handler threads: every route but `/mcp` only reads a snapshot or sends an event, so
/// two threads keep a 2-core machine busy without contending.
pub const WORKERS: usize = 2;
/// Pool threads for `POST /mcp`, whose tool calls may wait on a tracker (up to its timeout), and
/// for any request whose body must be read from its client; they never hold up the front threads.
pub const MCP_WORKERS: usize = 4;
/// Requests waiting for a pool thread before new ones get 503.
const MCP_QUEUE: usize = 64;
/// A request body must have arrived this long after its handler starts reading it (and a refused
/// one must have been discarded this long after the answer); then the connection is closed.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest unread rest of a body left to tiny_http to discard: it allocates a buffer of the
/// rest's size to do so (zeroed pages mapped lazily, so address space rather than memory). A
/// request declaring more is never dropped ([`refuse_huge_body`]).
const DRAIN_LIMIT: usize = 64 << 20;
/// A write to a client that makes no progress for this long fails (SO_SNDTIMEO, which accepted
/// sockets inherit from the listener), so a client that stops reading its responses, for
/// instance while pipelining requests, cannot hold a handler thread for ever.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

const JSON: &str = "application/json; charset=utf-8";

/// A response with its body in memory, as every handler here builds them.
type Answer = Response<std::io::Cursor<Body>>;

/// A response body: made for the request, built into the binary, or the published snapshot's
/// JSON (the state route's body, 35 KB with 50 runs, is shared, not copied per request).
pub enum Body {
    Owned(Vec<u8>),
    Static(&'static [u8]),
    State(Arc<crate::orchestrator::snapshot::Snapshot>),
}

impl AsRef<[u8]> for Body {
    fn as_ref(&self) -> &[u8] {
        match self {
            Body::Owned(bytes) => bytes,
            Body::Static(bytes) => bytes,
            Body::State(snapshot) => snapshot.state_json.as_bytes(),
        }
    }
}

/// A 200 response with `body` (set the status and headers with the `with_` methods).
fn answer(body: Body) -> Answer {
    let len = body.as_ref().len();
    Response::new(
        tiny_http::StatusCode(200),
        Vec::new(),
        std::io::Cursor::new(body),
        Some(len),
        None,
    )
}

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
    /// The `server.mcp_port` listener: only `/mcp` with per-run claims (and `/health`).
    pub claims_only: bool,
    /// Requests answered, by route and status (`/metrics`).
    pub requests: metrics::Requests,
}

/// WebSocket clients served at once; more get 503.
const MAX_WS_CLIENTS: usize = 256;

/// A bound server; [`HttpServer::start`] spawns the handler threads.
pub struct HttpServer {
    front: Arc<guard::Front>,
    guard: Arc<guard::Guard>,
    pub addr: std::net::SocketAddr,
}

/// What the handler threads share.
struct Serve {
    ctx: Arc<Ctx>,
    guard: Arc<guard::Guard>,
    front: Arc<guard::Front>,
    /// The pool for `/mcp`, for requests with a body to read, and for pipelined requests.
    pool: Sender<(Request, guard::Busy)>,
    /// Answers for pipelined requests of closed connections, which may wait on earlier ones.
    discard: Sender<(Request, Answer, guard::Busy)>,
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
        // They inherit the send timeout too (which the listener's own accept does not use).
        set_send_timeout(&listener, SEND_TIMEOUT);
        let addr = listener
            .local_addr()
            .map_err(|e| format!("cannot listen on {bind_addr}: {e}"))?;
        let front = guard::Front::new(listener)
            .map_err(|e| format!("cannot listen on {bind_addr}: {e}"))?;
        let guard = guard::Guard::new(&front, addr)
            .map_err(|e| format!("cannot listen on {bind_addr}: {e}"))?;
        Ok(HttpServer {
            front: Arc::new(front),
            guard: Arc::new(guard),
            addr,
        })
    }

    pub fn start(self, ctx: Arc<Ctx>) {
        let (pool_tx, pool_rx) = crossbeam_channel::bounded::<(Request, guard::Busy)>(MCP_QUEUE);
        // Unbounded, but fed only from connections already shut: their requests are what
        // tiny_http had read ahead.
        let (discard_tx, discard_rx) = crossbeam_channel::unbounded();
        let serve = Arc::new(Serve {
            ctx,
            guard: self.guard,
            front: self.front,
            pool: pool_tx,
            discard: discard_tx,
        });
        {
            let serve = Arc::clone(&serve);
            let _ = std::thread::Builder::new()
                .name("http-discard".into())
                .spawn(move || {
                    for (request, response, busy) in discard_rx {
                        let label = url_label(request.url());
                        finish(&serve, request, response, busy, Left::Close, label);
                    }
                });
        }
        for n in 0..MCP_WORKERS {
            let serve = Arc::clone(&serve);
            let rx = pool_rx.clone();
            let _ = std::thread::Builder::new()
                .name(format!("http-mcp-{n}"))
                .spawn(move || {
                    for (request, busy) in rx {
                        handle(&serve, request, busy);
                    }
                });
        }
        for n in 0..WORKERS {
            let serve = Arc::clone(&serve);
            let _ = std::thread::Builder::new()
                .name(format!("http-{n}"))
                .spawn(move || front_thread(&serve));
        }
        let _ = std::thread::Builder::new()
            .name("http-guard".into())
            .spawn(move || guard_thread(&serve));
    }
}

/// A front thread: requests from the current tiny_http server, which the guard may replace (the
/// timeout makes a thread move to a replacement even if it misses the wake-up).
fn front_thread(serve: &Serve) {
    loop {
        match serve.front.current().recv_timeout(Duration::from_secs(5)) {
            Ok(Some(request)) => dispatch(serve, request),
            Ok(None) => {}
            // The accept error that ended tiny_http's accept loop; the guard starts a new one.
            Err(e) => log::warn!("HTTP server: {e}"),
        }
    }
}

/// Every [`guard::EVERY`]: closes the connections that hold the server for nothing, and restarts
/// tiny_http's accept loop if it has given up.
fn guard_thread(serve: &Arc<Serve>) {
    loop {
        std::thread::sleep(guard::EVERY);
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            serve.guard.tick();
            serve.front.check()
        }));
        match checked {
            Ok(Some(old)) => {
                // Front threads waiting on the old server move to the new one now.
                for _ in 0..WORKERS {
                    old.unblock();
                }
                let serve = Arc::clone(serve);
                let _ = std::thread::Builder::new()
                    .name("http-retired".into())
                    .spawn(move || retired(&serve, &old));
            }
            Ok(None) => {}
            Err(_) => log::error!("HTTP guard: a check panicked; going on"),
        }
    }
}

/// Serves what the connections of a replaced tiny_http server still send, until none of the
/// connections it may have accepted is left (the guard closes idle ones).
fn retired(serve: &Serve, old: &Server) {
    // One accepted just before the switch may be seen only at the guard's next look.
    let cutoff = Instant::now() + guard::EVERY * 2;
    loop {
        match old.recv_timeout(Duration::from_secs(1)) {
            Ok(Some(request)) => dispatch(serve, request),
            _ if Instant::now() > cutoff && !serve.guard.any_seen_before(cutoff) => return,
            _ => {}
        }
    }
}

/// How tiny_http set up a request's body; it decides from the headers, as here.
#[derive(Clone, Copy, PartialEq, Debug)]
enum BodyKind {
    /// None, or one tiny_http read before handing the request over (a Content-Length of at most
    /// 1 KiB without `Expect: 100-continue`).
    Ready,
    /// Read from the socket on demand: chunked, longer, or after `100 Continue`.
    Stream,
    /// `Connection: upgrade`: the connection itself, never read as a body here.
    Raw,
}

fn body_kind(request: &Request) -> BodyKind {
    let value = |name: &'static str| {
        request
            .headers()
            .iter()
            .find(|h| h.field.equiv(name))
            .map(|h| h.value.as_str())
    };
    if value("Connection").is_some_and(|v| v.to_ascii_lowercase().contains("upgrade")) {
        return BodyKind::Raw;
    }
    if value("Transfer-Encoding").is_some() {
        return BodyKind::Stream;
    }
    match request.body_length() {
        None | Some(0) => BodyKind::Ready,
        Some(n) if n <= 1024 && value("Expect").is_none() => BodyKind::Ready,
        Some(_) => BodyKind::Stream,
    }
}

/// Runs a request on this front thread, or hands it to where it can take its time: `/mcp` and
/// requests with a body to read to the pool, a WebSocket upgrade to a thread of its own.
fn dispatch(serve: &Serve, request: Request) {
    let busy = serve.guard.busy(request.remote_addr().copied());
    let ctx = &serve.ctx;
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let method = request.method().as_str().to_string();
    let kind = body_kind(&request);
    if kind == BodyKind::Stream
        && let Some(declared) = request.body_length().filter(|&n| n > DRAIN_LIMIT)
    {
        return refuse_huge_body(serve, request, busy, declared);
    }
    // A request pipelined behind one still in hand on its connection cannot be answered before
    // that one is: tiny_http writes a connection's responses in order, and reads body-less
    // requests ahead. Waiting for it, possibly on a client that does not read its responses, is
    // for the pool, never for a front thread.
    let pipelined = busy.pipelined();
    if kind == BodyKind::Stream || (path == "/mcp" && method == "POST") || pipelined {
        if let Err(TrySendError::Full((r, busy)) | TrySendError::Disconnected((r, busy))) =
            serve.pool.try_send((request, busy))
        {
            let response = if path == "/mcp" {
                error(
                    503,
                    "mcp_busy",
                    "Too many MCP requests in flight; retry shortly",
                )
            } else {
                error(
                    503,
                    "server_busy",
                    "Too many requests in flight; retry shortly",
                )
            };
            if pipelined {
                // Even the 503 would wait behind the earlier responses: the connection is closed
                // (which ends any wait on its socket) and the answer left to the discard thread.
                serve
                    .guard
                    .shutdown(r.remote_addr().copied(), libc::SHUT_RDWR);
                let _ = serve.discard.send((r, response, busy));
                return;
            }
            // Discarding the body here would hold up this front thread: the connection is closed.
            let left = if kind == BodyKind::Stream {
                Left::Close
            } else {
                Left::Nothing
            };
            let label = url_label(r.url());
            finish(serve, r, response, busy, left, label);
        }
        return;
    }
    if path == "/ws" && method == "GET" && !ctx.claims_only {
        if ctx.ws.client_count() >= MAX_WS_CLIENTS {
            let response = error(503, "too_many_clients", "Too many WebSocket clients");
            return finish(serve, request, response, busy, Left::Nothing, "/ws");
        }
        let ctx = Arc::clone(ctx);
        let _ = std::thread::Builder::new()
            .name("ws-client".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                ws::serve(&ctx, &ctx.ws, request, ctx.port);
                // The connection stays "busy" for the guard while the WebSocket lives.
                drop(busy);
            });
        return;
    }
    handle(serve, request, busy);
}

/// Answers a request declaring a body over [`DRAIN_LIMIT`]. Dropping it would make tiny_http
/// allocate a buffer of the declared size to discard the body, and an allocation the system
/// refuses aborts the whole daemon (a single `Content-Length: 9223372036854775807` did). So the
/// request is never dropped: it is leaked, 413 is written straight to the socket, the connection
/// shut down and its descriptors released (see [`guard::Guard::abandon`]). What stays behind is a
/// few kilobytes and the tiny_http thread of that connection, parked for ever waiting for the
/// leaked request's reader.
fn refuse_huge_body(serve: &Serve, request: Request, busy: guard::Busy, declared: usize) {
    let peer = request.remote_addr().copied();
    std::mem::forget(request);
    let body = json!({"error": {"code": "payload_too_large", "message": "Request body too large"}})
        .to_string();
    let raw = format!(
        "HTTP/1.1 413 Payload Too Large\r\nContent-Type: {JSON}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // Behind a response still being written, the 413 would land in the middle of it.
    let raw = (!busy.pipelined()).then_some(raw.as_bytes());
    let leaked = serve.guard.abandon(peer, raw);
    drop(busy);
    // Not once per request, which would let a client fill the log.
    if leaked <= 10 || leaked.is_power_of_two() {
        log::warn!(
            "HTTP: refused a request from {} declaring a {declared}-byte body; its connection's \
         handler thread stays parked ({leaked} so far)",
            peer.map_or("?".into(), |p| p.to_string())
        );
    }
}

/// What is left on the socket of a request body when the request is answered.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Left {
    /// Nothing: the connection can carry the next request.
    Nothing,
    /// The rest of a body of a declared length (at most [`DRAIN_LIMIT`]), which tiny_http reads
    /// and throws away when the request is dropped, after the answer: a client still sending
    /// gets to finish and then reads the answer rather than a reset connection. The deadline ends
    /// it for a client that never sends.
    Drain,
    /// A rest that is not to be read: the read side of the connection is shut first, which makes
    /// tiny_http's discarding end at once and the connection close after the answer.
    Close,
}

/// Sends `response` (see [`Left`] for what happens to the rest of the body). A response that
/// cannot be written (the client stopped reading: [`SEND_TIMEOUT`]) closes the connection, so
/// the requests it pipelined behind do not each wait out the timeout again.
/// `label` names the route in `/metrics` (see [`url_label`]).
fn finish(
    serve: &Serve,
    request: Request,
    response: Answer,
    busy: guard::Busy,
    left: Left,
    label: &'static str,
) {
    serve.ctx.requests.record(label, response.status_code().0);
    let peer = request.remote_addr().copied();
    if left == Left::Close {
        serve.guard.shutdown(peer, libc::SHUT_RD);
    }
    if left != Left::Nothing {
        // Also covers a socket the guard could not find to shut.
        busy.deadline(Some(Instant::now() + BODY_TIMEOUT));
    }
    if request.respond(response).is_err() {
        serve.guard.shutdown(peer, libc::SHUT_RDWR);
    }
    drop(busy);
}

/// The `/metrics` label of a request that was answered before it was routed.
fn url_label(url: &str) -> &'static str {
    let path = url.split_once('?').map_or(url, |(p, _)| p);
    route(path).map_or("unmatched", |(r, _)| r.label())
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

fn set_send_timeout(listener: &std::net::TcpListener, timeout: Duration) {
    use std::os::unix::io::AsRawFd;
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt reads `tv` for the given length.
    unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes())
        .expect("static header names and values are valid")
}

fn json_response(status: u16, body: &Value) -> Answer {
    json_text(status, body.to_string())
}

fn json_text(status: u16, body: String) -> Answer {
    answer(Body::Owned(body.into_bytes()))
        .with_status_code(status)
        .with_header(header("Content-Type", JSON))
}

fn error(status: u16, code: &str, message: &str) -> Answer {
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
    Metrics,
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
            Route::Metrics => "/metrics",
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

/// Reads a streamed body, within the deadline its caller set. A body over [`MAX_BODY`] gets 413;
/// what happens to the rest of it is the [`Left`] returned with the response.
fn read_body(request: &mut Request) -> Result<Vec<u8>, (Answer, Left)> {
    let too_large = || error(413, "payload_too_large", "Request body too large");
    if request.body_length().is_some_and(|n| n > MAX_BODY) {
        // A client waiting for `100 Continue` has sent nothing and will not: no rest to drain.
        let expects_continue = request.headers().iter().any(|h| h.field.equiv("Expect"));
        let left = if expects_continue {
            Left::Close
        } else {
            Left::Drain
        };
        return Err((too_large(), left));
    }
    let mut body = Vec::new();
    match request
        .as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut body)
    {
        Ok(_) if body.len() <= MAX_BODY => Ok(body),
        // Chunked, so tiny_http would not discard the rest: it is read and thrown away here
        // (up to DRAIN_LIMIT) before answering, for the same reason as [`Left::Drain`].
        Ok(_) if discard(request.as_reader()) => Err((too_large(), Left::Nothing)),
        Ok(_) => Err((too_large(), Left::Close)),
        Err(_) => Err((
            error(400, "bad_request", "Could not read the request body"),
            Left::Close,
        )),
    }
}

/// Reads and drops up to [`DRAIN_LIMIT`] bytes; whether the body ended within them.
fn discard(reader: &mut dyn Read) -> bool {
    matches!(
        std::io::copy(&mut reader.take(DRAIN_LIMIT as u64 + 1), &mut std::io::sink()),
        Ok(n) if n <= DRAIN_LIMIT as u64
    )
}

fn handle(serve: &Serve, mut request: Request, busy: guard::Busy) {
    let ctx = &serve.ctx;
    let url = request.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    // Routed once: the answer and the `/metrics` label both come from this.
    let routed = route(path);
    let label = routed.as_ref().map_or("unmatched", |(r, _)| r.label());
    let body = match body_kind(&request) {
        BodyKind::Raw => Vec::new(),
        BodyKind::Ready => {
            let mut body = Vec::new();
            let _ = request.as_reader().read_to_end(&mut body);
            body
        }
        BodyKind::Stream => {
            // Only pool threads get here: the client may take its time, but not for ever.
            busy.deadline(Some(Instant::now() + BODY_TIMEOUT));
            let read = read_body(&mut request);
            busy.deadline(None);
            match read {
                Ok(body) => body,
                Err((response, left)) => {
                    return finish(serve, request, response, busy, left, label);
                }
            }
        }
    };
    let method = request.method().as_str().to_string();
    let response = match routed {
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
        Ok((route, _)) => respond(ctx, route, query, &request, &body),
    };
    finish(serve, request, response, busy, Left::Nothing, label);
}

fn respond(ctx: &Ctx, route: Route, query: &str, request: &Request, body: &[u8]) -> Answer {
    if ctx.claims_only {
        return match route {
            Route::Health => json_response(200, &json!({"status": "ok"})),
            Route::Mcp => mcp_response(ctx, request, body),
            _ => error(404, "not_found", "Route not found"),
        };
    }
    match route {
        Route::Health => json_response(200, &json!({"status": "ok"})),
        Route::State => {
            answer(Body::State(ctx.hub.current())).with_header(header("Content-Type", JSON))
        }
        Route::Metrics => {
            let tracker = ctx
                .loaded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .settings
                .tracker
                .kind
                .clone();
            let body = metrics::render(
                &ctx.hub.current(),
                &metrics::Extra {
                    tracker: &tracker,
                    requests: &ctx.requests,
                    ws_clients: ctx.ws.client_count(),
                    now: unix_ms(),
                },
            );
            answer(Body::Owned(body.into_bytes()))
                .with_status_code(200)
                .with_header(header("Content-Type", metrics::CONTENT_TYPE))
        }
        Route::Runs => {
            let snapshot = ctx.hub.current();
            match api::runs(&snapshot, &parse_query(query), &rfc3339(unix_ms())) {
                Ok(body) => json_response(200, &body),
                Err((status, code, message)) => error(status, code, message),
            }
        }
        Route::Daemon => match ctx
            .hub
            .current()
            .daemon_status_at(crate::orchestrator::snapshot::unix_ms())
        {
            Some(d) => json_response(200, &serde_json::to_value(&d).unwrap_or(Value::Null)),
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
        Route::Index => static_file(ctx, DashboardFile::Index),
        Route::Asset(name) => static_file(ctx, DashboardFile::Asset(&name)),
        Route::Mcp => mcp_response(ctx, request, body),
    }
}

/// `POST /mcp` with the settings of this request: per-run claims only on the `mcp_port`
/// listener, the settings-scoped token only on the dashboard's.
fn mcp_response(ctx: &Ctx, request: &Request, body: &[u8]) -> Answer {
    let settings = Arc::clone(
        &ctx.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .settings,
    );
    let auth = authorization(request);
    let reply = if ctx.claims_only {
        ctx.mcp.handle_claimed(auth.as_deref(), body, &settings)
    } else {
        ctx.mcp.handle(auth.as_deref(), body, &settings)
    };
    match reply {
        Reply::Accepted => answer(Body::Owned(Vec::new())).with_status_code(202),
        Reply::Json(status, v) => json_response(status, &v),
    }
}

fn content_type(name: &str) -> &'static str {
    let extension = Path::new(name).extension().and_then(|e| e.to_str());
    match extension.map(str::to_ascii_lowercase).as_deref() {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json" | "map") => JSON,
        Some("txt") => "text/plain; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("ico") => "image/x-icon",
        Some("woff") => "font/woff",
        Some("woff2") => "font/woff2",
        Some("ttf") => "font/ttf",
        Some("wasm") => "application/wasm",
        _ => "application/octet-stream",
    }
}

/// Which dashboard file a request wants.
enum DashboardFile<'a> {
    Index,
    /// The part of the path after `/assets/`, percent-decoded.
    Asset(&'a str),
}

/// A dashboard file from `server.static_dir`, or from the files built into the binary.
///
/// A static dir is laid out like a built dashboard: `index.html` at its top and the files the
/// page loads under `assets/`. `GET /assets/<file>` reads `<static_dir>/assets/<file>`, then
/// (the flat layout of earlier releases) `<static_dir>/<file>`. A name with an empty, `.` or
/// `..` segment, or a file whose real path leaves the static dir (a symlink), is not found.
fn static_file(ctx: &Ctx, file: DashboardFile) -> Answer {
    let static_dir: Option<PathBuf> = ctx
        .loaded
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .settings
        .server
        .static_dir
        .clone();
    let name = match file {
        DashboardFile::Index => "index.html",
        DashboardFile::Asset(name) => name,
    };
    let safe = !name.is_empty()
        && !name
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == ".." || seg.contains(['\\', '\0']));
    if !safe {
        return error(404, "not_found", "Route not found");
    }
    let Some(dir) = static_dir else {
        return match crate::assets::get(name) {
            Some((ct, bytes)) => {
                answer(Body::Static(bytes)).with_header(header("Content-Type", ct))
            }
            None => error(404, "not_found", "Route not found"),
        };
    };
    let candidates = match file {
        DashboardFile::Index => vec![dir.join(name)],
        DashboardFile::Asset(_) => vec![dir.join("assets").join(name), dir.join(name)],
    };
    if let Some(bytes) = candidates
        .iter()
        .find_map(|path| read_contained(&dir, path))
    {
        return answer(Body::Owned(bytes)).with_header(header("Content-Type", content_type(name)));
    }
    match file {
        DashboardFile::Index => error(
            503,
            "dashboard_not_built",
            &format!(
                "Dashboard assets not found. Run: mkdir -p {dir}/assets && cp assets/index.html {dir}/ && cp assets/*.js assets/*.css {dir}/assets/ (or unset server.static_dir to use the dashboard built into svc)",
                dir = dir.display()
            ),
        ),
        DashboardFile::Asset(_) => error(404, "not_found", "Route not found"),
    }
}

/// The bytes of the regular file `path` when its real path lies inside the real `dir`.
fn read_contained(dir: &Path, path: &Path) -> Option<Vec<u8>> {
    let root = std::fs::canonicalize(dir).ok()?;
    let real = std::fs::canonicalize(path).ok()?;
    if !real.starts_with(&root) || !real.is_file() {
        return None;
    }
    std::fs::read(real).ok()
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
