//! The HTTP server: tiny_http on `server.host:server.port` with a small fixed pool of handler
//! threads, following the spec's conventions (JSON bodies, `{error: {code, message}}`, 405 on a
//! wrong verb). This file starts the server and its threads, hands each request to a thread
//! where it may take its time, reads bodies, sends the answers, and holds what every route
//! shares ([`Ctx`], [`Body`], the JSON and error answers). Each other job has its file: routing
//! and the routes' answers ([`routes`]: the `/api/v1` routes, `/metrics`, `POST /mcp`), the
//! control routes (`control.rs`), the dashboard files (`dashboard.rs`), the `/api/v1` views
//! ([`api`]), `/metrics` ([`metrics`]), `/ws` ([`ws`]) and the connection guard (`guard.rs`).
//!
//! Handlers only read the published snapshot or send an event to the state thread; they never
//! wait for it, so a slow client cannot stall the orchestrator.
//!
//! Hostile clients. tiny_http 0.12 gives every connection a thread and two descriptors and times
//! nothing out; it gives up accepting for good on the first accept error (running out of
//! descriptors); it reads header lines without a length limit; and when a request is dropped it
//! discards the unread rest of its body, waiting for the client to send it (through a fixed
//! buffer: svc builds a patched copy, `src/vendor/tiny_http`, as 0.12 allocated one of the size the
//! client declared). So: the [`guard`] thread closes connections that idle, dawdle over a header
//! or a body, or send a header without end, sheds the longest idle when connections or
//! descriptors run short, and restarts the accept loop when tiny_http has given it up; accepted
//! sockets get a send timeout; bodies are read only on the pool threads, with a deadline; and a
//! request declaring more body than is worth discarding has its connection's read side shut
//! before it is dropped ([`Left::Close`]). Every request is dropped once answered, so none keeps
//! tiny_http's thread of its connection after it.

pub mod api;
mod control;
mod dashboard;
mod guard;
pub mod metrics;
pub mod routes;
mod webhooks;
pub mod ws;

use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use serde_json::{Value, json};
use tiny_http::{Header, Request, Response, Server};

use self::routes::{respond, route};
use crate::mcp::server::McpServer;
use crate::orchestrator::poller::Loaded;
use crate::orchestrator::protocol::Event;
use crate::orchestrator::snapshot::SnapshotHub;

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
/// The largest unread rest of a body left to tiny_http to discard ([`Left::Drain`]), so that a
/// client still sending it then reads the 413; a request declaring more has its connection's
/// read side shut instead ([`Left::Close`]).
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
    /// Every workflow the daemon serves, by name (the first is `loaded`), kept current by the
    /// state thread as workflows are added and removed.
    pub workflows: crate::orchestrator::poller::Served,
    /// The issue store; the issue and trace routes exist only with it.
    pub store: Option<Arc<crate::trace::store::IssueStore>>,
    /// Parsed trace timelines (from the trace watcher).
    pub traces: crate::trace::watcher::SharedIndex,
    /// WebSocket clients.
    pub ws: Arc<ws::Hub>,
    /// The port the server listens on.
    pub port: u16,
    /// Which of svc's listeners this is: what it serves follows from it.
    pub listener: Listener,
    /// What the webhook listener answered (shared by every listener: `/metrics` shows it, the
    /// state thread reads it into the snapshot), and GitHub's delivery ids seen lately.
    pub webhooks: Arc<crate::webhook::Stats>,
    /// Requests answered, by route and status (`/metrics`).
    pub requests: metrics::Requests,
}

/// svc's listeners, each serving its own routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// `server.port`: the HTTP API, the dashboard and the settings-scoped `/mcp`.
    Dashboard,
    /// `server.mcp_port`: only `/mcp` with per-run claims (and `/health`).
    PerRun,
    /// `server.webhook_port`: only the configured `POST /webhooks/<service>` routes; every
    /// other path is 404, and the other listeners never serve those routes.
    Webhooks,
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
                        survive("http-discard", || {
                            finish(&serve, request, response, busy, Left::Close, label)
                        });
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
                        survive("http-mcp", || handle(&serve, request, busy));
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

/// Runs one request's work; a panic in it (input nobody foresaw) costs that request (its
/// connection closes as the request is dropped), never the thread: there are few of them.
fn survive(thread: &str, work: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        let why = crate::orchestrator::panic_text(panic.as_ref());
        log::error!("{thread}: a request's handler panicked ({why}); the thread goes on");
    }
}

/// A front thread: requests from the current tiny_http server, which the guard may replace (the
/// timeout makes a thread move to a replacement even if it misses the wake-up).
fn front_thread(serve: &Serve) {
    loop {
        match serve.front.current().recv_timeout(Duration::from_secs(5)) {
            Ok(Some(request)) => survive("http", || dispatch(serve, request)),
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
    if path == "/ws" && method == "GET" && ctx.listener == Listener::Dashboard {
        if ctx.ws.client_count() >= MAX_WS_CLIENTS {
            let response = error(503, "too_many_clients", "Too many WebSocket clients");
            return finish(serve, request, response, busy, Left::Nothing, "/ws");
        }
        let ctx = Arc::clone(ctx);
        let _ = std::thread::Builder::new()
            .name("ws-client".into())
            // A client's message is parsed on this thread, up to serde's 128 levels deep: the
            // bridge reader's stack, which was sized for that depth (a stack overflow aborts).
            .stack_size(crate::agent::pipes::READER_STACK)
            .spawn(move || {
                ws::serve(&ctx, &ctx.ws, request, ctx.port);
                // The connection stays "busy" for the guard while the WebSocket lives.
                drop(busy);
            });
        return;
    }
    handle(serve, request, busy);
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
    if let Some(declared) = request.body_length().filter(|&n| n > MAX_BODY) {
        // A client waiting for `100 Continue` has sent nothing and will not: no rest to drain.
        let expects_continue = request.headers().iter().any(|h| h.field.equiv("Expect"));
        let left = if expects_continue || declared > DRAIN_LIMIT {
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

/// What this listener serves of a routed path: the webhook listener only its configured
/// webhook routes, the others never a webhook route; the rest is 404 before any method check,
/// so a listener does not even say that another's routes exist.
fn served(
    ctx: &Ctx,
    routed: Result<(routes::Route, &'static [&'static str]), (u16, &'static str, &'static str)>,
) -> Result<(routes::Route, &'static [&'static str]), (u16, &'static str, &'static str)> {
    const NOT_FOUND: (u16, &str, &str) = (404, "not_found", "Route not found");
    match routed {
        Ok((routes::Route::Webhook(source), methods)) => {
            if ctx.listener == Listener::Webhooks && webhooks::configured(ctx, source) {
                Ok((routes::Route::Webhook(source), methods))
            } else {
                Err(NOT_FOUND)
            }
        }
        _ if ctx.listener == Listener::Webhooks => Err(NOT_FOUND),
        other => other,
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
    let routed = served(ctx, route(path));
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
                    if let Ok((routes::Route::Webhook(source), _)) = &routed {
                        webhooks::refused(ctx, *source, response.status_code().0);
                    }
                    return finish(serve, request, response, busy, left, label);
                }
            }
        }
    };
    let method = request.method().as_str().to_string();
    let response = match routed {
        Err((status, code, message)) => error(status, code, message),
        Ok((ref route, methods))
            if !(methods.contains(&method.as_str())
                || method == "HEAD" && methods.contains(&"GET")) =>
        {
            if let routes::Route::Webhook(source) = *route {
                webhooks::refused(ctx, source, 405);
            }
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
