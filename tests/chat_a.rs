//! chat-a against an in-process fake of the Slack Web API (the methods svc calls, answering like
//! Slack: Bearer bot tokens, `{ok: false, error}` bodies, `response_metadata.next_cursor` pages
//! shorter than the asked `limit`, HTTP 429 with `Retry-After`, message metadata only with
//! `include_all_metadata`). The real binary runs the demo agent end to end: mentions become runs,
//! status comes back as the bot's thread replies, reactions move state, an outage is ridden out,
//! and every chat_a tool is driven through /mcp, including its fail-closed paths.

mod common;

use common::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

const TOKEN: &str = "xoxb-chat-a-planted-5f1e";
/// The app-level token Socket Mode opens connections with.
const APP_TOKEN: &str = "xapp-1-A1-chat-a-planted-77c2";
const BOT: &str = "UBOT";
const HUMAN: &str = "UHUMAN";
/// Slack answers with at most this many items a page, whatever the `limit` (it may, per its
/// pagination docs), so svc has to follow cursors.
const FAKE_PAGE: usize = 20;

struct Channel {
    name: String,
    is_member: bool,
    /// Every message, roots and replies, in posting order.
    messages: Vec<Value>,
}

#[derive(Clone)]
struct FakeSlack {
    channels: Arc<Mutex<BTreeMap<String, Channel>>>,
    /// (method, arguments) of every authenticated request.
    calls: Arc<Mutex<Vec<(String, Value)>>>,
    auth_seen: Arc<Mutex<Vec<String>>>,
    throttle_next: Arc<AtomicBool>,
    down: Arc<AtomicBool>,
    seq: Arc<AtomicU64>,
    /// The last fresh `ts` handed out, in microseconds.
    last_ts: Arc<AtomicU64>,
    url: String,
    socket: Arc<Mutex<SocketFake>>,
    ws_url: String,
}

/// The Socket Mode fake's state.
#[derive(Default)]
struct SocketFake {
    /// Envelopes not yet sent (sent on the current connection once it said hello).
    queue: Vec<Value>,
    /// Envelope ids sent, and the ids clients acknowledged.
    sent: Vec<String>,
    acks: Vec<String>,
    /// Tickets `apps.connections.open` issued, and connections made with one.
    tickets: Vec<String>,
    connections: usize,
    /// The connection that gets envelopes (the newest), and whether it is up.
    current: usize,
    live: bool,
    /// Send `disconnect` with this reason on the current connection.
    disconnect: Option<String>,
    /// Drop the current connection without a word.
    drop_now: bool,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn ts_num(ts: &str) -> f64 {
    ts.parse().unwrap()
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .to_string()
}

fn answer(req: tiny_http::Request, status: u16, body: &Value, retry_after: Option<&str>) {
    let mut resp = tiny_http::Response::from_string(body.to_string())
        .with_status_code(status)
        .with_header(
            tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).unwrap(),
        );
    if let Some(r) = retry_after {
        resp = resp
            .with_header(tiny_http::Header::from_bytes(&b"Retry-After"[..], r.as_bytes()).unwrap());
    }
    let _ = req.respond(resp);
}

impl FakeSlack {
    fn start() -> FakeSlack {
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = server.server_addr().to_ip().unwrap().port();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ws_port = listener.local_addr().unwrap().port();
        let fake = FakeSlack {
            socket: Arc::default(),
            ws_url: format!("ws://127.0.0.1:{ws_port}/link/"),
            channels: Arc::default(),
            calls: Arc::default(),
            auth_seen: Arc::default(),
            throttle_next: Arc::default(),
            down: Arc::default(),
            seq: Arc::default(),
            last_ts: Arc::default(),
            url: format!("http://127.0.0.1:{port}/api"),
        };
        let f = fake.clone();
        std::thread::spawn(move || {
            for mut req in server.incoming_requests() {
                if f.down.load(Ordering::SeqCst) {
                    answer(
                        req,
                        503,
                        &json!({"ok": false, "error": "service_unavailable"}),
                        None,
                    );
                    continue;
                }
                if f.throttle_next.swap(false, Ordering::SeqCst) {
                    answer(
                        req,
                        429,
                        &json!({"ok": false, "error": "ratelimited"}),
                        Some("1"),
                    );
                    continue;
                }
                let header = |name: &'static str| {
                    req.headers()
                        .iter()
                        .find(|h| h.field.equiv(name))
                        .map(|h| h.value.as_str().to_string())
                        .unwrap_or_default()
                };
                let auth = header("Authorization");
                let content_type = header("Content-Type");
                let mut body = String::new();
                let _ = req.as_reader().read_to_string(&mut body);
                let (path, query) = req.url().split_once('?').unwrap_or((req.url(), ""));
                let method = path.trim_start_matches("/api/").to_string();
                let mut args = serde_json::Map::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    args.insert(decode(k), Value::String(decode(v)));
                }
                if req.method() == &tiny_http::Method::Post && !body.trim().is_empty() {
                    if !content_type.starts_with("application/json") {
                        answer(
                            req,
                            200,
                            &json!({"ok": false, "error": "invalid_form_data"}),
                            None,
                        );
                        continue;
                    }
                    let v: Value = serde_json::from_str(&body).unwrap();
                    args.extend(v.as_object().unwrap().clone());
                }
                let args = Value::Object(args);
                f.auth_seen.lock().unwrap().push(auth.clone());
                let bearer = auth.strip_prefix("Bearer ");
                // Socket Mode: only an app-level token opens connections, and an app-level
                // token does nothing else.
                let reply = match (method.as_str(), bearer) {
                    ("apps.connections.open", Some(APP_TOKEN)) => {
                        f.calls.lock().unwrap().push((method.clone(), args.clone()));
                        let ticket = format!("tkt-{}", f.seq.fetch_add(1, Ordering::SeqCst));
                        f.socket.lock().unwrap().tickets.push(ticket.clone());
                        answer(
                            req,
                            200,
                            &json!({"ok": true, "url": format!("{}?ticket={ticket}&app_id=A1", f.ws_url)}),
                            None,
                        );
                        continue;
                    }
                    ("apps.connections.open", Some(_)) | (_, Some(APP_TOKEN)) => {
                        json!({"ok": false, "error": "not_allowed_token_type"})
                    }
                    _ => json!(null),
                };
                if !reply.is_null() {
                    answer(req, 200, &reply, None);
                    continue;
                }
                let reply = match bearer {
                    None => json!({"ok": false, "error": "not_authed"}),
                    Some(t) if t != TOKEN => json!({"ok": false, "error": "invalid_auth"}),
                    Some(_) => {
                        f.calls.lock().unwrap().push((method.clone(), args.clone()));
                        f.route(&method, &args)
                    }
                };
                answer(req, 200, &reply, None);
            }
        });
        let f = fake.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let f = f.clone();
                std::thread::spawn(move || f.socket_connection(stream));
            }
        });
        fake
    }

    /// One Socket Mode connection: the ticket checked, `hello`, envelopes for the newest
    /// connection, acknowledgements recorded, `disconnect` or a drop on request.
    // tungstenite's handshake callback returns its own (large) error response.
    #[allow(clippy::result_large_err)]
    fn socket_connection(&self, stream: std::net::TcpStream) {
        stream
            .set_read_timeout(Some(std::time::Duration::from_millis(50)))
            .unwrap();
        let mut path = String::new();
        let Ok(mut ws) = tungstenite::accept_hdr(
            stream,
            |req: &tungstenite::handshake::server::Request, resp| {
                path = req.uri().to_string();
                Ok(resp)
            },
        ) else {
            return;
        };
        let me = {
            let mut s = self.socket.lock().unwrap();
            let ticket = path.split("ticket=").nth(1).unwrap_or_default();
            let ticket = ticket.split('&').next().unwrap_or_default();
            if !s.tickets.iter().any(|t| t == ticket) {
                let _ = ws.close(None);
                return;
            }
            s.connections += 1;
            s.current = s.connections;
            s.live = true;
            s.connections
        };
        let send = |ws: &mut tungstenite::WebSocket<std::net::TcpStream>, v: Value| {
            ws.send(tungstenite::Message::text(v.to_string())).is_ok()
        };
        send(
            &mut ws,
            json!({"type": "hello", "num_connections": 1, "debug_info": {"host": "applink-fake", "build_number": 1, "approximate_connection_time": 18060}, "connection_info": {"app_id": "A1"}}),
        );
        let mut closing: Option<std::time::Instant> = None;
        loop {
            {
                let mut s = self.socket.lock().unwrap();
                if s.current != me {
                    // A newer connection took over.
                    return;
                }
                if std::mem::take(&mut s.drop_now) {
                    s.live = false;
                    return;
                }
                if let Some(reason) = s.disconnect.take() {
                    send(
                        &mut ws,
                        json!({"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}}),
                    );
                    s.live = false;
                    closing = Some(std::time::Instant::now());
                }
                if closing.is_none() {
                    let pending: Vec<Value> = s.queue.drain(..).collect();
                    for e in pending {
                        s.sent.push(e["envelope_id"].as_str().unwrap().to_string());
                        if !send(&mut ws, e) {
                            s.live = false;
                            return;
                        }
                    }
                }
            }
            if closing.is_some_and(|t| t.elapsed() > std::time::Duration::from_secs(5)) {
                return;
            }
            match ws.read() {
                Ok(tungstenite::Message::Text(t)) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                    if let Some(id) = v["envelope_id"].as_str() {
                        self.socket.lock().unwrap().acks.push(id.to_string());
                    }
                }
                Ok(tungstenite::Message::Close(_)) => {
                    let mut s = self.socket.lock().unwrap();
                    if s.current == me {
                        s.live = false;
                    }
                    return;
                }
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => {
                    let mut s = self.socket.lock().unwrap();
                    if s.current == me {
                        s.live = false;
                    }
                    return;
                }
            }
        }
    }

    /// An Events API envelope for a message event Slack sends about `ts` (posted or a reply).
    fn message_event(&self, channel: &str, ts: &str) {
        let m = self.channels.lock().unwrap()[channel]
            .messages
            .iter()
            .find(|m| m["ts"] == ts)
            .cloned()
            .unwrap();
        let mut event = m.clone();
        event["channel"] = channel.into();
        event["event_ts"] = m["ts"].clone();
        event["channel_type"] = "channel".into();
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        self.socket.lock().unwrap().queue.push(json!({
            "envelope_id": format!("env-{n}"),
            "type": "events_api",
            "accepts_response_payload": false,
            "retry_attempt": 0,
            "retry_reason": "",
            "payload": {"team_id": "T1", "api_app_id": "A1", "type": "event_callback", "event_id": format!("Ev{n}"), "event_time": now_secs(), "event": event},
        }));
    }

    fn channel(&self, id: &str, name: &str, is_member: bool) {
        self.channels.lock().unwrap().insert(
            id.to_string(),
            Channel {
                name: name.to_string(),
                is_member,
                messages: Vec::new(),
            },
        );
    }

    /// A fresh `ts` that many seconds ago, with Slack's real microseconds (svc compares a
    /// reply's `ts` with the time a scan started); unique, and strictly increasing among fresh
    /// ones.
    fn ts(&self, age_secs: u64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
            - age_secs * 1_000_000;
        let micros = if age_secs == 0 {
            let mut last = self.last_ts.load(Ordering::SeqCst);
            loop {
                let next = now.max(last + 1);
                match self
                    .last_ts
                    .compare_exchange(last, next, Ordering::SeqCst, Ordering::SeqCst)
                {
                    Ok(_) => break next,
                    Err(seen) => last = seen,
                }
            }
        } else {
            now - now % 1000 + self.seq.fetch_add(1, Ordering::SeqCst) % 1000
        };
        format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
    }

    fn post(&self, channel: &str, mut message: Value) -> String {
        let ts = message["ts"].as_str().unwrap().to_string();
        message["type"] = "message".into();
        self.channels
            .lock()
            .unwrap()
            .get_mut(channel)
            .unwrap()
            .messages
            .push(message);
        ts
    }

    fn root(&self, channel: &str, user: &str, text: &str, age_secs: u64) -> String {
        let ts = self.ts(age_secs);
        self.post(channel, json!({"ts": ts, "user": user, "text": text}))
    }

    fn reply(&self, channel: &str, thread: &str, user: &str, text: &str, age_secs: u64) -> String {
        let ts = self.ts(age_secs);
        self.post(
            channel,
            json!({"ts": ts, "thread_ts": thread, "user": user, "text": text}),
        )
    }

    /// A person edits their message: new text and Slack's `edited` mark; the `ts` stays.
    fn edit(&self, channel: &str, ts: &str, text: &str) {
        let mut channels = self.channels.lock().unwrap();
        let m = channels
            .get_mut(channel)
            .unwrap()
            .messages
            .iter_mut()
            .find(|m| m["ts"] == ts)
            .unwrap();
        m["text"] = text.into();
        m["edited"] = json!({"user": m["user"].clone(), "ts": format!("{}.000000", now_secs())});
    }

    fn react(&self, channel: &str, ts: &str, name: &str, user: &str) -> Result<(), &'static str> {
        let mut channels = self.channels.lock().unwrap();
        let m = channels
            .get_mut(channel)
            .and_then(|c| c.messages.iter_mut().find(|m| m["ts"] == ts))
            .ok_or("message_not_found")?;
        if m["reactions"].is_null() {
            m["reactions"] = json!([]);
        }
        let list = m["reactions"].as_array_mut().unwrap();
        match list.iter_mut().find(|r| r["name"] == name) {
            Some(r) => {
                let users = r["users"].as_array_mut().unwrap();
                if users.iter().any(|u| u == user) {
                    return Err("already_reacted");
                }
                users.push(user.into());
                r["count"] = users.len().into();
            }
            None => list.push(json!({"name": name, "users": [user], "count": 1})),
        }
        Ok(())
    }

    fn unreact(&self, channel: &str, ts: &str, name: &str, user: &str) -> Result<(), &'static str> {
        let mut channels = self.channels.lock().unwrap();
        let m = channels
            .get_mut(channel)
            .and_then(|c| c.messages.iter_mut().find(|m| m["ts"] == ts))
            .ok_or("message_not_found")?;
        let list = m["reactions"].as_array_mut().ok_or("no_reaction")?;
        let r = list
            .iter_mut()
            .find(|r| r["name"] == name)
            .ok_or("no_reaction")?;
        let users = r["users"].as_array_mut().unwrap();
        let before = users.len();
        users.retain(|u| u != user);
        if users.len() == before {
            return Err("no_reaction");
        }
        r["count"] = users.len().into();
        list.retain(|r| r["count"] != 0);
        Ok(())
    }

    /// The messages of a thread after its root, oldest first.
    fn thread(&self, channel: &str, ts: &str) -> Vec<Value> {
        let channels = self.channels.lock().unwrap();
        channels[channel]
            .messages
            .iter()
            .filter(|m| m["thread_ts"] == ts && m["ts"] != ts)
            .cloned()
            .collect()
    }

    fn reactions(&self, channel: &str, ts: &str) -> Vec<(String, Vec<String>)> {
        let channels = self.channels.lock().unwrap();
        let m = channels[channel]
            .messages
            .iter()
            .find(|m| m["ts"] == ts)
            .unwrap();
        m["reactions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                (
                    r["name"].as_str().unwrap().to_string(),
                    r["users"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|u| u.as_str().unwrap().to_string())
                        .collect(),
                )
            })
            .collect()
    }

    fn bot_statuses(&self, channel: &str, ts: &str) -> Vec<String> {
        self.thread(channel, ts)
            .iter()
            .filter(|m| m["user"] == BOT && m["metadata"]["event_type"] == "svc_status")
            .map(|m| {
                m["metadata"]["event_payload"]["status"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    fn calls_of(&self, method: &str) -> Vec<Value> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _)| m == method)
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// One page of `items` from the cursor in `args` (`next_cursor` is an opaque offset).
    fn page(items: Vec<Value>, args: &Value, key: &str) -> Value {
        let start: usize = args["cursor"]
            .as_str()
            .and_then(|c| c.strip_prefix("dXNlcj"))
            .map_or(0, |n| n.parse().unwrap());
        let limit: usize = args["limit"]
            .as_str()
            .map(|l| l.parse().unwrap())
            .or(args["limit"].as_u64().map(|l| l as usize))
            .unwrap_or(100)
            .clamp(1, 999)
            .min(FAKE_PAGE);
        let page: Vec<Value> = items.iter().skip(start).take(limit).cloned().collect();
        let next = start + page.len();
        let more = next < items.len();
        json!({"ok": true, key: page, "has_more": more,
               "response_metadata": {"next_cursor": if more { format!("dXNlcj{next}") } else { String::new() }}})
    }

    fn route(&self, method: &str, a: &Value) -> Value {
        let s = |k: &str| a[k].as_str().unwrap_or_default().to_string();
        let channel = s("channel");
        let membership = || -> Result<(), Value> {
            let channels = self.channels.lock().unwrap();
            match channels.get(&channel) {
                None => Err(json!({"ok": false, "error": "channel_not_found"})),
                Some(c) if !c.is_member => Err(json!({"ok": false, "error": "not_in_channel"})),
                Some(_) => Ok(()),
            }
        };
        match method {
            "auth.test" => {
                json!({"ok": true, "url": "https://acme.slack.com/", "team": "Acme", "user": "svc", "team_id": "T1", "user_id": BOT, "bot_id": "B1"})
            }
            "conversations.info" => {
                let channels = self.channels.lock().unwrap();
                match channels.get(&channel) {
                    Some(c) => {
                        json!({"ok": true, "channel": {"id": channel, "name": c.name, "is_channel": true, "is_member": c.is_member}})
                    }
                    None => json!({"ok": false, "error": "channel_not_found"}),
                }
            }
            "conversations.history" => {
                if let Err(e) = membership() {
                    return e;
                }
                let channels = self.channels.lock().unwrap();
                let all = &channels[&channel].messages;
                let bound = |k: &str| a[k].as_str().map(ts_num);
                let inclusive = a["inclusive"] == "true" || a["inclusive"] == "1";
                let mut roots: Vec<Value> = all
                    .iter()
                    .filter(|m| m["thread_ts"].is_null() || m["thread_ts"] == m["ts"])
                    .filter(|m| {
                        let t = ts_num(m["ts"].as_str().unwrap());
                        bound("oldest").is_none_or(|o| if inclusive { t >= o } else { t > o })
                            && bound("latest")
                                .is_none_or(|l| if inclusive { t <= l } else { t < l })
                    })
                    .map(|m| {
                        let mut m = m.clone();
                        m.as_object_mut().unwrap().remove("metadata");
                        let replies: Vec<&Value> = all
                            .iter()
                            .filter(|r| r["thread_ts"] == m["ts"] && r["ts"] != m["ts"])
                            .collect();
                        if let Some(last) = replies.last() {
                            m["thread_ts"] = m["ts"].clone();
                            m["reply_count"] = replies.len().into();
                            m["latest_reply"] = last["ts"].clone();
                        }
                        m
                    })
                    .collect();
                roots.sort_by(|x, y| {
                    ts_num(y["ts"].as_str().unwrap()).total_cmp(&ts_num(x["ts"].as_str().unwrap()))
                });
                FakeSlack::page(roots, a, "messages")
            }
            "conversations.replies" => {
                if let Err(e) = membership() {
                    return e;
                }
                let ts = s("ts");
                let channels = self.channels.lock().unwrap();
                let all = &channels[&channel].messages;
                let Some(m) = all.iter().find(|m| m["ts"] == ts.as_str()) else {
                    return json!({"ok": false, "error": "thread_not_found"});
                };
                let metadata = a["include_all_metadata"] == "true";
                let mut thread = vec![m.clone()];
                if m["thread_ts"].is_null() || m["thread_ts"] == m["ts"] {
                    thread.extend(
                        all.iter()
                            .filter(|r| r["thread_ts"] == ts.as_str() && r["ts"] != ts.as_str())
                            .cloned(),
                    );
                }
                for t in &mut thread {
                    if !metadata {
                        t.as_object_mut().unwrap().remove("metadata");
                    }
                }
                FakeSlack::page(thread, a, "messages")
            }
            "chat.postMessage" => {
                if let Err(e) = membership() {
                    return e;
                }
                let ts = self.ts(0);
                let mut m = json!({"ts": ts, "user": BOT, "bot_id": "B1", "text": a["text"]});
                if let Some(t) = a["thread_ts"].as_str() {
                    m["thread_ts"] = t.into();
                }
                if !a["metadata"].is_null() {
                    m["metadata"] = a["metadata"].clone();
                }
                self.post(&channel, m.clone());
                json!({"ok": true, "channel": channel, "ts": ts, "message": m})
            }
            "reactions.add" | "reactions.remove" => {
                if let Err(e) = membership() {
                    return e;
                }
                let r = if method == "reactions.add" {
                    self.react(&channel, &s("timestamp"), &s("name"), BOT)
                } else {
                    self.unreact(&channel, &s("timestamp"), &s("name"), BOT)
                };
                match r {
                    Ok(()) => json!({"ok": true}),
                    Err(e) => json!({"ok": false, "error": e}),
                }
            }
            "chat.getPermalink" => json!({"ok": true, "channel": channel,
                "permalink": format!("https://acme.slack.com/archives/{channel}/p{}", s("message_ts").replace('.', ""))}),
            "users.info" => match s("user").as_str() {
                HUMAN => {
                    json!({"ok": true, "user": {"id": HUMAN, "name": "alice", "real_name": "Alice Example", "tz": "Europe/Paris", "is_bot": false, "deleted": false, "profile": {"display_name": "alice", "email": "alice@example.com"}}})
                }
                _ => json!({"ok": false, "error": "user_not_found"}),
            },
            _ => json!({"ok": false, "error": "unknown_method"}),
        }
    }
}

fn chat_a_workflow(dir: &TestDir, fake: &FakeSlack, extra: &str) -> std::path::PathBuf {
    workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: slack\n  dispatch:\n    route_label_prefix: route-\ntrackers:\n  slack:\n    provider: chat-a\n    endpoint: {}\n    channels: [$WATCHED_CHANNEL, $UNSET_CHANNEL]\n    bot_user_id: {BOT}\n{extra}polling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 1\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n",
            fake.url
        ),
    )
}

fn daemon(dir: &TestDir, wf: &std::path::Path, token: &str) -> Daemon {
    let mut cmd = svc(dir);
    cmd.arg("--no-tui")
        .arg(wf)
        .env("WATCHED_CHANNEL", "C1")
        .env_remove("UNSET_CHANNEL")
        .env("CHAT_A_BOT_TOKEN", token)
        .env("SVC_DEMO_AGENT_RECORD", dir.join("sessions.jsonl"));
    Daemon::start(cmd)
}

#[test]
fn mentions_become_runs_that_end_done_and_every_tool_answers() {
    let fake = FakeSlack::start();
    fake.channel("C1", "eng", true);
    fake.channel("C2", "random", true);
    // Old chatter before everything, so history takes pages and context has a cap to reach.
    for n in 0..60 {
        fake.root("C1", HUMAN, &format!("chatter {n}"), 20 * 86_400 - n);
    }
    let old = fake.root("C1", HUMAN, "an old thread", 10 * 86_400);
    fake.reply("C1", &old, HUMAN, "<@UBOT> long ago", 5 * 86_400);
    let a = fake.root(
        "C1",
        HUMAN,
        "<@UBOT> fix the login page #route-web\nIt fails on submit.",
        3_600,
    );
    let other = fake.root("C1", HUMAN, "<@UOTHER> can you look at this?", 3_500);
    let c = fake.root("C1", HUMAN, "the build is flaky", 3_400);
    fake.reply("C1", &c, HUMAN, "<@UBOT> please take this one", 3_300);
    let done = fake.root("C1", HUMAN, "<@UBOT> already handled", 3_200);
    fake.react("C1", &done, "white_check_mark", HUMAN).unwrap();
    let unwatched = fake.root("C2", HUMAN, "<@UBOT> not here", 3_100);
    fake.throttle_next.store(true, Ordering::SeqCst);

    let dir = TestDir::new("chat-a");
    let wf = chat_a_workflow(&dir, &fake, "");
    let d = daemon(&dir, &wf, TOKEN);
    // The demo agent finishes both mention threads through chat_a_update_status.
    wait_until(60, "both mention threads done", || {
        fake.bot_statuses("C1", &a).last().map(String::as_str) == Some("Done")
            && fake.bot_statuses("C1", &c).last().map(String::as_str) == Some("Done")
    });
    let s = d.wait_for(30, "workspaces removed", |s| {
        events(s).contains(&"workspace_removed".to_string()) && s["counts"]["running"] == 0
    });
    assert!(
        s["rate_limits"]["retry-after"].is_number(),
        "the 429 is surfaced: {}",
        s["rate_limits"]
    );
    for (ts, why) in [
        (&other, "a mention of another user"),
        (&done, "a thread already Done by reaction"),
        (&old, "a reply mention outside reply_lookback_days"),
    ] {
        assert!(
            fake.thread("C1", ts).iter().all(|m| m["user"] != BOT),
            "{why}"
        );
    }
    assert!(
        fake.thread("C2", &unwatched).is_empty(),
        "an unwatched channel"
    );
    assert!(
        fake.calls
            .lock()
            .unwrap()
            .iter()
            .all(|(_, args)| args["channel"].as_str().is_none_or(|c| c == "C1")),
        "svc never reads or writes an unwatched channel"
    );
    // The status reply is mirrored by the bot's reactions (and its marker).
    let reactions = fake.reactions("C1", &a);
    for name in ["white_check_mark", "robot_face"] {
        assert!(
            reactions
                .iter()
                .any(|(n, users)| n == name && users.contains(&BOT.to_string())),
            "{name}: {reactions:?}"
        );
    }
    assert!(
        !reactions.iter().any(|(n, _)| n == "eyes"),
        "no stale state reaction: {reactions:?}"
    );
    let comment = fake
        .thread("C1", &a)
        .into_iter()
        .find(|m| m["user"] == BOT && m["metadata"]["event_type"] == "svc_comment")
        .expect("the demo agent's comment");
    assert!(comment["text"].as_str().unwrap().contains("DEMO.md"));
    assert!(
        fake.auth_seen
            .lock()
            .unwrap()
            .iter()
            .all(|h| *h == format!("Bearer {TOKEN}")),
        "the bot token travels as Bearer"
    );
    assert!(
        fake.calls_of("conversations.replies")
            .iter()
            .all(|a| a["include_all_metadata"] == "true")
    );

    // An unchanged thread is not read again: replies are cached until `latest_reply` moves.
    let replies_of_c = || {
        fake.calls_of("conversations.replies")
            .iter()
            .filter(|a| a["ts"] == c.as_str())
            .count()
    };
    // The bot's own last status reply moved `latest_reply` once more; wait until the reads of
    // the thread have settled over a few polls, then watch 20 more.
    let polls_from_now = |n: usize| {
        let histories = fake.calls_of("conversations.history").len();
        wait_until(60, "more polls", || {
            fake.calls_of("conversations.history").len() >= histories + n
        });
    };
    let mut read_before = replies_of_c();
    for _ in 0..10 {
        polls_from_now(5);
        let now = replies_of_c();
        if now == read_before {
            break;
        }
        read_before = now;
    }
    polls_from_now(20);
    assert_eq!(replies_of_c(), read_before);

    // Every tool through /mcp with the token a run received.
    let mcp = mcp_of(&dir);
    let id_a = format!("C1:{a}");
    let (err, v) = tool(&mcp, "chat_a_read_thread", json!({"issueId": id_a}));
    assert!(!err, "{v}");
    assert_eq!(v["status"]["state"], "Done");
    assert_eq!(v["status"]["source"], "status_reply");
    assert_eq!(v["title"], "fix the login page #route-web");
    assert_eq!(v["labels"], json!(["route-web"]));
    assert_eq!(
        v["permalink"],
        format!("https://acme.slack.com/archives/C1/p{}", a.replace('.', ""))
    );
    assert!(v["replies"].as_array().unwrap().len() >= 2, "{v}");
    assert!(
        v["reactions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "robot_face")
    );

    let unknown = error_of(tool(
        &mcp,
        "chat_a_update_status",
        json!({"issueId": id_a, "status": "Shipped"}),
    ));
    assert!(unknown.contains("unknown status"), "{unknown}");
    assert_eq!(
        fake.bot_statuses("C1", &a).last().unwrap(),
        "Done",
        "unchanged"
    );
    // A terminal state, so the daemon does not pick the thread up again.
    let (err, v) = tool(
        &mcp,
        "chat_a_update_status",
        json!({"issueId": id_a, "status": "cancelled"}),
    );
    assert!(!err, "{v}");
    assert_eq!(v, json!({"ok": true, "status": "Cancelled"}));
    assert_eq!(fake.bot_statuses("C1", &a).last().unwrap(), "Cancelled");
    let reactions = fake.reactions("C1", &a);
    assert!(
        reactions
            .iter()
            .any(|(n, u)| n == "x" && u.contains(&BOT.to_string()))
    );
    assert!(
        !reactions.iter().any(|(n, _)| n == "white_check_mark"),
        "{reactions:?}"
    );

    let (err, v) = tool(
        &mcp,
        "chat_a_comment",
        json!({"issueId": id_a, "body": "ping <!channel> & <@UBOT>"}),
    );
    assert_eq!(v, json!({"ok": true}), "{err}");
    assert_eq!(
        fake.thread("C1", &a).last().unwrap()["text"],
        "ping &lt;!channel&gt; &amp; &lt;@UBOT&gt;",
        "svc's own text cannot mention anyone"
    );

    // Queries read the watched channels only.
    assert_query_reads_watched(
        &mcp,
        "chat_a",
        &["C1", "C2"],
        vec![id_a.clone(), format!("C1:{c}"), format!("C1:{done}")],
        (
            &["issueId", "channel", "ts", "stateType", "url", "text"],
            2,
            "C1",
        ),
        &["C2"],
    );

    // Channel context is capped at 50 each side.
    assert_channel_context(&mcp, "chat_a", &id_a, ("ts", &a), [&other, &c], 3);

    let (err, v) = tool(&mcp, "chat_a_user_info", json!({"userId": HUMAN}));
    assert!(!err, "{v}");
    assert_eq!(v["user"]["real_name"], "Alice Example");
    assert!(v["user"].get("email").is_none());
    let missing = error_of(tool(&mcp, "chat_a_user_info", json!({"userId": "UNOPE"})));
    assert!(missing.contains("user_not_found"), "{missing}");

    // Per-issue tools refuse untracked messages and unwatched channels.
    assert_refused(
        &mcp,
        &[
            "chat_a_read_thread",
            "chat_a_comment",
            "chat_a_update_status",
            "chat_a_channel_context",
        ],
        |id| json!({"issueId": id, "body": "x", "status": "Done"}),
        &[format!("C1:{other}"), "C1:999.000001".into()],
        &format!("C2:{unwatched}"),
    );
    assert!(fake.thread("C2", &unwatched).is_empty());
    assert!(fake.thread("C1", &other).is_empty());
    let e = error_of(tool(&mcp, "chat_a_create_issue", json!({"title": "x"})));
    assert!(e.contains("Unsupported tool"), "{e}");
    assert!(
        !d.stderr().contains(TOKEN),
        "the token never reaches the log"
    );
    let snapshot = d.latest().unwrap().to_string();
    assert!(!snapshot.contains(TOKEN));
}

#[test]
fn reactions_move_state_and_an_outage_leaves_running_work_alone() {
    let fake = FakeSlack::start();
    fake.channel("C1", "eng", true);
    let long = fake.root(
        "C1",
        HUMAN,
        "<@UBOT> a long job\ndemo: keep-open\ndemo: slow 60000",
        60,
    );
    let dir = TestDir::new("chat-a-outage");
    let wf = chat_a_workflow(&dir, &fake, "    emoji_states:\n      rocket: Done\n");
    let d = daemon(&dir, &wf, TOKEN);
    let id = format!("C1:{long}");
    d.wait_for(30, "the mention running", |s| {
        running_ids(s) == [id.clone()]
    });

    fake.down.store(true, Ordering::SeqCst);
    let s = d.wait_for(60, "a failed poll", |s| {
        events(s).contains(&"tracker_poll_failed".to_string())
    });
    assert_eq!(running_ids(&s), [id.as_str()], "running work is left alone");
    fake.down.store(false, Ordering::SeqCst);

    // A human's reaction from the merged map ends the issue.
    fake.react("C1", &long, "rocket", HUMAN).unwrap();
    d.wait_for(60, "the run stopped and its workspace removed", |s| {
        s["counts"]["running"] == 0 && events(s).contains(&"workspace_removed".to_string())
    });
    assert!(
        fake.bot_statuses("C1", &long).is_empty(),
        "keep-open posted nothing"
    );
    assert!(!d.stderr().contains(TOKEN));
}

#[test]
fn every_tool_fails_closed_without_a_bot_user_id() {
    let fake = FakeSlack::start();
    fake.channel("C1", "eng", true);
    let ts = fake.root("C1", HUMAN, "<@UBOT> hi", 60);
    let dir = TestDir::new("chat-a-closed");
    let slice = format!("    endpoint: {}\n    channels: [C1]\n", fake.url);
    let env = [("CHAT_A_BOT_TOKEN", TOKEN), ("CHAT_A_BOT_USER_ID", "")];
    let (_d, mcp) = chat_pack_daemon(&dir, "chat_a", &slice, &env);
    let id = format!("C1:{ts}");
    let calls = chat_tool_calls("chat_a", &id, HUMAN);
    assert_fail_closed(&mcp, "chat_a", "CHAT_A_BOT_USER_ID", calls);
    assert!(
        fake.calls.lock().unwrap().is_empty(),
        "nothing reached the API"
    );
}

#[test]
fn doctor_online_checks_the_token_and_channel_membership() {
    let fake = FakeSlack::start();
    fake.channel("C1", "eng", true);
    let dir = TestDir::new("chat-a-doctor");
    let wf = chat_a_workflow(&dir, &fake, "");
    let doctor = |token: &str| {
        doctor_online(
            &dir,
            &wf,
            &[("WATCHED_CHANNEL", "C1"), ("CHAT_A_BOT_TOKEN", token)],
        )
    };
    let r = doctor(TOKEN);
    assert!(
        r.stdout
            .contains("chat-a accepts the bot token (bot user UBOT in Acme)"),
        "{}",
        r.all()
    );
    assert!(
        r.stdout.contains("the bot is a member of #eng (C1)"),
        "{}",
        r.stdout
    );
    fake.channel("C1", "eng", false);
    let r = doctor("xoxb-wrong");
    assert_eq!(r.code, Some(1));
    assert!(r.stdout.contains("invalid_auth"), "{}", r.stdout);
    let r = doctor(TOKEN);
    assert_eq!(r.code, Some(1));
    assert!(
        r.stdout.contains("the bot is not a member of #eng (C1)"),
        "{}",
        r.stdout
    );
    assert!(!r.all().contains(TOKEN));
}

/// A `chat.postMessage` whose answer is lost (a 500 after Slack posted it, a dropped
/// connection) is not sent again blindly: svc finds its reply in the thread by the post key in
/// its metadata, and the thread has one reply, not two.
#[test]
fn a_post_whose_answer_is_lost_is_not_posted_twice() {
    let fake = FakeSlack::start();
    fake.channel("C1", "eng", true);
    let ts = fake.root("C1", HUMAN, "<@UBOT> hi", 60);
    let upstream = fake
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/api")
        .to_string();
    let proxy = common::losing::LosingProxy::start(&upstream);
    let dir = TestDir::new("chat-a-lost");
    let slice = format!("    endpoint: {}/api\n    channels: [C1]\n", proxy.base);
    let env = [("CHAT_A_BOT_TOKEN", TOKEN), ("CHAT_A_BOT_USER_ID", BOT)];
    let (_d, mcp) = chat_pack_daemon(&dir, "chat_a", &slice, &env);
    let id = format!("C1:{ts}");
    proxy.arm("chat.postMessage", common::losing::Lose::Status500);
    let r = tool(
        &mcp,
        "chat_a_comment",
        json!({"issueId": id, "body": "one comment"}),
    );
    assert!(!r.0, "{}", r.1);
    proxy.arm("chat.postMessage", common::losing::Lose::Drop);
    let r = tool(
        &mcp,
        "chat_a_update_status",
        json!({"issueId": id, "status": "Done"}),
    );
    assert!(!r.0, "{}", r.1);
    assert_eq!(proxy.lost().len(), 2, "both answers were lost");
    let comments = fake
        .thread("C1", &ts)
        .iter()
        .filter(|m| m["user"] == BOT && m["text"] == "one comment")
        .count();
    assert_eq!(comments, 1, "{:#?}", fake.thread("C1", &ts));
    assert_eq!(fake.bot_statuses("C1", &ts), ["Done"]);
}

/// Human steering found by the poll: a person's reply in the thread reaches the running
/// agent as its next prompt, with the author's name; the bot's own replies, another bot, a user
/// outside `users`, a system message, an edit and an `!aside` do not; `!status` with an unknown
/// state is answered in the thread; `!cancel` posts the status reply naming who asked (with
/// the command in its metadata), mirrors the reaction and ends the run.
#[test]
fn thread_replies_steer_the_running_agent_and_cancel_ends_it() {
    const BOB: &str = "UBOB";
    let fake = FakeSlack::start();
    fake.channel("C1", "eng", true);
    let dir = TestDir::new("chat-a-steer");
    let prompts_file = dir.join("prompts.jsonl");
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: slack\ntrackers:\n  slack:\n    provider: chat-a\n    endpoint: {}\n    channels: [$WATCHED_CHANNEL]\n    bot_user_id: {BOT}\n    users: [{HUMAN}, {BOB}]\npolling:\n  interval_ms: 200\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 5\nagents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n",
            fake.url,
            prompts_file.display(),
            svc_bin()
        ),
    );
    let root = fake.root(
        "C1",
        HUMAN,
        "<@UBOT> steer me\ndemo: slow 8000\ndemo: keep-open",
        5,
    );
    let d = daemon(&dir, &wf, TOKEN);
    let id = format!("C1:{root}");
    d.wait_for(60, "the run in its first turn", |s| {
        running_by_id(s, &id).is_some_and(|r| r["turn_count"] == 1)
    });
    wait_until(30, "the first prompt", || {
        prompt_texts(&prompts_file).len() == 1
    });

    // What is not for the agent, then a person's reply.
    fake.post(
        "C1",
        json!({"ts": fake.ts(0), "thread_ts": root, "user": BOT, "bot_id": "B1", "text": "the bot's own words"}),
    );
    fake.post(
        "C1",
        json!({"ts": fake.ts(0), "thread_ts": root, "user": "UOTHERBOT", "bot_id": "B2", "text": "beep from another bot"}),
    );
    fake.post(
        "C1",
        json!({"ts": fake.ts(0), "thread_ts": root, "user": BOB, "subtype": "channel_join", "text": "<@UBOB> has joined the channel"}),
    );
    fake.reply("C1", &root, "USTRANGER", "a stranger's advice", 0);
    fake.reply("C1", &root, HUMAN, "!aside between us humans", 0);
    // (Each reply keeps the demo agent busy, and from completing the issue, for its turn.)
    let alice = fake.reply(
        "C1",
        &root,
        HUMAN,
        "Alice says: use tabs\ndemo: slow 5000\ndemo: keep-open",
        0,
    );
    wait_until(30, "alice's reply delivered", || {
        prompt_texts(&prompts_file)
            .iter()
            .any(|p| p.contains("--- from alice (UHUMAN) (via chat-a,"))
    });
    wait_until(20, "the ignored replies counted", || {
        d.latest()
            .is_some_and(|s| s["recent_events"].to_string().contains("USTRANGER"))
    });

    // An edit is not a new message; bob's reply after it is.
    fake.edit("C1", &alice, "EDITED: use spaces");
    fake.reply(
        "C1",
        &root,
        BOB,
        "Bob: second note\ndemo: slow 60000\ndemo: keep-open",
        0,
    );
    wait_until(30, "bob's reply delivered", || {
        prompt_texts(&prompts_file)
            .iter()
            .any(|p| p.contains("--- from UBOB (via chat-a,") && p.contains("Bob: second note"))
    });
    let all = prompt_texts(&prompts_file).join("\n");
    assert!(all.contains("Alice says: use tabs"), "{all}");
    for never in [
        "the bot's own words",
        "beep from another bot",
        "has joined the channel",
        "a stranger's advice",
        "between us humans",
        "EDITED",
    ] {
        assert!(!all.contains(never), "{never:?} was delivered:\n{all}");
    }
    assert_eq!(all.matches("Alice says: use tabs").count(), 1, "{all}");

    // Commands: a stranger's is not obeyed; an unknown state is answered; !cancel ends the run.
    fake.reply("C1", &root, "USTRANGER", "!cancel", 0);
    let unknown = fake.reply("C1", &root, HUMAN, "!status Shipped", 0);
    wait_until(30, "the unknown state answered", || {
        fake.thread("C1", &root).iter().any(|m| {
            m["user"] == BOT
                && m["metadata"]["event_payload"]["svc_command"] == unknown.as_str()
                && m["text"]
                    .as_str()
                    .unwrap()
                    .contains("unknown status \"Shipped\"")
        })
    });
    assert!(fake.bot_statuses("C1", &root).is_empty());
    assert_eq!(running_ids(&d.latest().unwrap()), [id.as_str()]);
    let cancel = fake.reply("C1", &root, BOB, "!cancel", 0);
    wait_until(60, "the run stopped", || {
        d.latest().is_some_and(|s| running_by_id(&s, &id).is_none())
    });
    let thread = fake.thread("C1", &root);
    let answers: Vec<&Value> = thread
        .iter()
        .filter(|m| {
            m["user"] == BOT && m["metadata"]["event_payload"]["svc_command"] == cancel.as_str()
        })
        .collect();
    assert_eq!(answers.len(), 1, "{thread:?}");
    assert_eq!(
        answers[0]["text"],
        "Status: Cancelled\nAsked by UBOB with `!cancel`."
    );
    assert_eq!(fake.bot_statuses("C1", &root), ["Cancelled"]);
    assert!(
        fake.reactions("C1", &root)
            .iter()
            .any(|(name, users)| name == "x" && users.iter().any(|u| u == BOT)),
        "{:?}",
        fake.reactions("C1", &root)
    );
    let all = prompt_texts(&prompts_file).join("\n");
    assert!(
        !all.contains("!cancel") && !all.contains("!status"),
        "{all}"
    );
    // Nothing is answered twice.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let answered = fake
        .thread("C1", &root)
        .iter()
        .filter(|m| m["user"] == BOT && !m["metadata"]["event_payload"]["svc_command"].is_null())
        .count();
    assert_eq!(answered, 2);
    // A command in the thread of a finished issue: !reopen brings it back to Todo, and a new
    // run starts.
    fake.reply("C1", &root, HUMAN, "!reopen", 0);
    wait_until(30, "the issue reopened", || {
        fake.bot_statuses("C1", &root) == ["Cancelled", "Todo"]
    });
    wait_until(60, "a new run", || {
        d.latest().is_some_and(|s| running_by_id(&s, &id).is_some())
    });
    assert!(!d.stderr().contains(TOKEN));
}

/// Socket Mode: with an app-level token svc opens a connection from `apps.connections.open`,
/// acknowledges every envelope, and polls at once when an event comes, so a new mention and a
/// thread reply arrive live though the poll interval is ten minutes; a `disconnect` and a
/// dropped connection are followed by a new connection that keeps bringing events.
#[test]
fn socket_mode_brings_mentions_and_replies_live_and_reconnects() {
    let fake = FakeSlack::start();
    fake.channel("C1", "eng", true);
    let dir = TestDir::new("chat-a-socket");
    let prompts_file = dir.join("prompts.jsonl");
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: slack\ntrackers:\n  slack:\n    provider: chat-a\n    endpoint: {}\n    channels: [$WATCHED_CHANNEL]\n    bot_user_id: {BOT}\npolling:\n  interval_ms: 600000\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 5\nagents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n",
            fake.url,
            prompts_file.display(),
            svc_bin()
        ),
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("WATCHED_CHANNEL", "C1")
        .env("CHAT_A_BOT_TOKEN", TOKEN)
        .env("CHAT_A_APP_TOKEN", APP_TOKEN)
        .env("RUST_LOG", "info");
    let d = Daemon::start(cmd);
    wait_until(30, "a Socket Mode connection", || {
        fake.socket.lock().unwrap().live
    });
    // After the first poll, only events bring anything soon.
    d.wait_log(30, "chat-a: Socket Mode connected");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let root = fake.root(
        "C1",
        HUMAN,
        "<@UBOT> a live job\ndemo: slow 8000\ndemo: keep-open",
        0,
    );
    fake.message_event("C1", &root);
    let id = format!("C1:{root}");
    wait_until(30, "the mention running", || {
        d.latest().is_some_and(|s| running_ids(&s) == [id.clone()])
    });
    wait_until(30, "the first prompt", || {
        prompt_texts(&prompts_file).len() == 1
    });
    let steer = |text: &str| {
        let ts = fake.reply("C1", &root, HUMAN, text, 0);
        fake.message_event("C1", &ts);
    };
    steer("Alice, live: use tabs\ndemo: slow 3000\ndemo: keep-open");
    wait_until(30, "the live reply delivered", || {
        prompt_texts(&prompts_file).iter().any(|p| {
            p.contains("--- from alice (UHUMAN) (via chat-a,") && p.contains("Alice, live")
        })
    });

    // Slack recycles the connection: svc opens another at once.
    fake.socket.lock().unwrap().disconnect = Some("refresh_requested".into());
    wait_until(30, "a second connection", || {
        let s = fake.socket.lock().unwrap();
        s.connections == 2 && s.live
    });
    steer("Bob, after the refresh\ndemo: slow 3000\ndemo: keep-open");
    wait_until(30, "the reply after the refresh delivered", || {
        prompt_texts(&prompts_file)
            .iter()
            .any(|p| p.contains("Bob, after the refresh"))
    });
    // The connection drops without a word: svc reconnects after its backoff.
    fake.socket.lock().unwrap().drop_now = true;
    wait_until(30, "a third connection", || {
        let s = fake.socket.lock().unwrap();
        s.connections == 3 && s.live
    });
    steer("Carol, after the drop\ndemo: slow 60000\ndemo: keep-open");
    wait_until(30, "the reply after the drop delivered", || {
        prompt_texts(&prompts_file)
            .iter()
            .any(|p| p.contains("Carol, after the drop"))
    });

    let s = fake.socket.lock().unwrap();
    assert!(!s.sent.is_empty());
    for e in &s.sent {
        assert!(
            s.acks.contains(e),
            "envelope {e} acknowledged: {:?}",
            s.acks
        );
    }
    assert_eq!(
        s.tickets.len(),
        3,
        "one apps.connections.open per connection"
    );
    drop(s);
    // The app token opens connections and nothing else; the bot token never opens one.
    let auth = fake.auth_seen.lock().unwrap().clone();
    assert_eq!(
        auth.iter()
            .filter(|a| *a == &format!("Bearer {APP_TOKEN}"))
            .count(),
        3
    );
    let log = d.stderr();
    assert!(
        !log.contains(APP_TOKEN) && !log.contains(TOKEN) && !log.contains("tkt-"),
        "{log}"
    );
}
