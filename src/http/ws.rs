//! `GET /ws`: the WebSocket push channel. tiny_http performs the upgrade; tungstenite speaks the
//! protocol over the upgraded stream. Each client has one thread and a bounded outbox: the
//! broadcaster never waits for a client, and a client whose outbox fills up is dropped, so one
//! slow client never slows the others or the state thread. Pings find dead clients.
//!
//! Server messages: `init` (tickets) first, `ops_state` on connect and on each snapshot change,
//! `events` in answer to `subscribe`, `events_append` (from the first changed index) to the
//! subscribers of a changed ticket, and `update` (tickets) to everyone.

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded, select};
use serde_json::{Value, json};
use tiny_http::{Header, Request, Response};
use tungstenite::protocol::{Role, WebSocketConfig};
use tungstenite::{Message, WebSocket};

use super::{Ctx, api};
use crate::trace::watcher::Change;

const OUTBOX: usize = 256;
const PING_EVERY: Duration = Duration::from_secs(10);
const DEAD_AFTER: Duration = Duration::from_secs(30);
const READ_TIMEOUT_MS: i64 = 100;
/// The largest frame or message a client may send.
const MAX_CLIENT_MESSAGE: usize = 64 * 1024;

struct Client {
    outbox: Sender<Arc<str>>,
    subscriptions: Arc<Mutex<HashSet<String>>>,
}

/// Every connected client.
#[derive(Default)]
pub struct Hub {
    clients: Mutex<Vec<Client>>,
}

impl Hub {
    /// Sends `text` to every client (or those `only` accepts), dropping clients that cannot keep up.
    fn broadcast(&self, text: Arc<str>, only: impl Fn(&HashSet<String>) -> bool) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients.retain(|c| {
            let wanted = only(&c.subscriptions.lock().unwrap_or_else(|p| p.into_inner()));
            if !wanted {
                return true;
            }
            !matches!(
                c.outbox.try_send(Arc::clone(&text)),
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_))
            )
        });
    }

    pub fn client_count(&self) -> usize {
        self.clients.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

fn ops_state(ctx: &Ctx) -> Arc<str> {
    Arc::from(format!(
        "{{\"type\":\"ops_state\",\"state\":{}}}",
        ctx.hub.current().state_json
    ))
}

fn tickets(ctx: &Ctx) -> Value {
    match &ctx.store {
        Some(store) => {
            let index = ctx.traces.read().unwrap_or_else(|p| p.into_inner());
            Value::Array(api::tickets(&index, &ctx.hub.current(), store))
        }
        None => json!([]),
    }
}

/// The broadcaster: snapshot changes become `ops_state`, trace changes `events_append` and
/// `update`. Runs while the daemon runs.
pub fn start_broadcaster(ctx: Arc<Ctx>, hub: Arc<Hub>, changes: Receiver<Vec<Change>>) {
    let wake = ctx.hub.subscribe();
    let _ = std::thread::Builder::new().name("ws-broadcast".into()).spawn(move || {
        loop {
            select! {
                recv(wake) -> msg => {
                    if msg.is_err() {
                        return;
                    }
                    if hub.client_count() > 0 {
                        hub.broadcast(ops_state(&ctx), |_| true);
                    }
                }
                recv(changes) -> msg => {
                    let Ok(changes) = msg else { return };
                    if hub.client_count() == 0 || ctx.store.is_none() {
                        continue;
                    }
                    for change in &changes {
                        let events: Vec<Value> = {
                            let index = ctx.traces.read().unwrap_or_else(|p| p.into_inner());
                            index.tickets.get(&change.issue_id).map(|t| t.events.get(change.from_index..).unwrap_or_default().to_vec()).unwrap_or_default()
                        };
                        let text: Arc<str> = Arc::from(
                            json!({"type": "events_append", "issueId": change.issue_id, "events": events, "fromIndex": change.from_index}).to_string(),
                        );
                        let id = change.issue_id.clone();
                        hub.broadcast(text, move |subs| subs.contains(&id));
                    }
                    let list = tickets(&ctx);
                    for change in &changes {
                        let text: Arc<str> = Arc::from(json!({"type": "update", "issueId": change.issue_id, "tickets": list}).to_string());
                        hub.broadcast(text, |_| true);
                    }
                }
            }
        }
    });
}

/// Finds the descriptor of the accepted socket with this peer and local port, so the read
/// timeout can be set on it (tiny_http does not expose its sockets).
fn socket_fd(peer: SocketAddr, local_port: u16) -> Option<i32> {
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if !std::fs::read_link(entry.path())
            .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
        {
            continue;
        }
        let (Some(p), Some(l)) = (sock_addr(fd, true), sock_addr(fd, false)) else {
            continue;
        };
        if p == peer && l.port() == local_port {
            return Some(fd);
        }
    }
    None
}

pub(super) fn sock_addr(fd: i32, peer: bool) -> Option<SocketAddr> {
    // SAFETY: the storage is large enough for any address; len is in/out.
    unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let ptr = &mut storage as *mut libc::sockaddr_storage as *mut libc::sockaddr;
        let rc = if peer {
            libc::getpeername(fd, ptr, &mut len)
        } else {
            libc::getsockname(fd, ptr, &mut len)
        };
        if rc != 0 {
            return None;
        }
        match storage.ss_family as i32 {
            libc::AF_INET => {
                let a = &*(ptr as *const libc::sockaddr_in);
                Some(SocketAddr::from((
                    u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let a = &*(ptr as *const libc::sockaddr_in6);
                Some(SocketAddr::from((
                    a.sin6_addr.s6_addr,
                    u16::from_be(a.sin6_port),
                )))
            }
            _ => None,
        }
    }
}

fn set_read_timeout(fd: i32, ms: i64) {
    let tv = libc::timeval {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_usec: ((ms % 1000) * 1000) as libc::suseconds_t,
    };
    // SAFETY: setsockopt reads `tv` for the given length.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

fn header_value(request: &Request, name: &'static str) -> Option<String> {
    request
        .headers()
        .iter()
        .find(|h| h.field.equiv(name))
        .map(|h| h.value.as_str().to_string())
}

/// Upgrades `request` and serves the client on this thread until it goes away.
pub fn serve(ctx: &Ctx, hub: &Hub, request: Request, local_port: u16) {
    let upgrade =
        header_value(&request, "Upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    let key = header_value(&request, "Sec-WebSocket-Key");
    let (true, Some(key)) = (upgrade, key) else {
        let _ = request.respond(super::error(
            400,
            "websocket_upgrade_required",
            "GET /ws needs a WebSocket upgrade",
        ));
        return;
    };
    let Some(peer) = request.remote_addr().copied() else {
        return;
    };
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let response = Response::empty(101).with_header(
        Header::from_bytes(&b"Sec-WebSocket-Accept"[..], accept.as_bytes()).expect("valid header"),
    );
    let stream = request.upgrade("websocket", response);
    match socket_fd(peer, local_port) {
        Some(fd) => set_read_timeout(fd, READ_TIMEOUT_MS),
        None => {
            log::warn!("websocket: cannot find the socket of {peer}; closing");
            return;
        }
    }
    // Clients only send `subscribe` and `unsubscribe`. tungstenite's defaults let each client
    // make the server reserve 16 MiB for one frame's declared length and hold up to 64 MiB per
    // message; these limits refuse anything bigger than a client ever needs.
    let config = WebSocketConfig::default()
        .max_frame_size(Some(MAX_CLIENT_MESSAGE))
        .max_message_size(Some(MAX_CLIENT_MESSAGE));
    let mut ws = WebSocket::from_raw_socket(stream, Role::Server, Some(config));
    let (outbox, inbox) = bounded::<Arc<str>>(OUTBOX);
    let subscriptions: Arc<Mutex<HashSet<String>>> = Arc::default();
    // First `init`, then `ops_state`, before any broadcast can reach this client.
    let first = [
        json!({"type": "init", "tickets": tickets(ctx)}).to_string(),
        ops_state(ctx).to_string(),
    ];
    for text in first {
        if ws.send(Message::text(text)).is_err() {
            return;
        }
    }
    hub.clients
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Client {
            outbox,
            subscriptions: Arc::clone(&subscriptions),
        });
    let mut last_heard = Instant::now();
    let mut last_ping = Instant::now();
    loop {
        match ws.read() {
            Ok(Message::Text(text)) => {
                last_heard = Instant::now();
                if let Some(reply) = on_client_message(ctx, &subscriptions, text.as_str())
                    && ws.send(Message::text(reply)).is_err()
                {
                    break;
                }
            }
            Ok(Message::Close(_)) => break,
            Ok(_) => last_heard = Instant::now(),
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
        let mut failed = false;
        while let Ok(text) = inbox.try_recv() {
            if ws.write(Message::text(text.to_string())).is_err() {
                failed = true;
                break;
            }
        }
        if failed || ws.flush().is_err() {
            break;
        }
        if last_ping.elapsed() >= PING_EVERY {
            last_ping = Instant::now();
            if ws.send(Message::Ping(Vec::new().into())).is_err() {
                break;
            }
        }
        if last_heard.elapsed() >= DEAD_AFTER {
            break;
        }
    }
    let _ = ws.close(None);
}

/// `subscribe` / `unsubscribe`; anything malformed is ignored. Returns the reply, if any.
fn on_client_message(
    ctx: &Ctx,
    subscriptions: &Mutex<HashSet<String>>,
    text: &str,
) -> Option<String> {
    let msg: Value = serde_json::from_str(text).ok()?;
    let kind = msg.get("type")?.as_str()?;
    let issue_id = msg.get("issueId")?.as_str()?.to_string();
    // Without trace support both are dropped.
    ctx.store.as_ref()?;
    match kind {
        "subscribe" => {
            subscriptions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(issue_id.clone());
            let events: Vec<Value> = ctx
                .traces
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .events_of(&issue_id);
            Some(json!({"type": "events", "issueId": issue_id, "events": events}).to_string())
        }
        "unsubscribe" => {
            subscriptions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&issue_id);
            None
        }
        _ => None,
    }
}
