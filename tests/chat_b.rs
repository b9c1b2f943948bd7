//! chat-b against in-process fakes of Discord: the REST API v10 (`Authorization: Bot <token>`,
//! `{code, message}` errors, `X-RateLimit-*` headers, a 429 with a `retry_after` body, messages
//! newest first paged with `before`, "Start Thread from Message" threads whose id is the
//! message's) and the Gateway (a WebSocket server speaking the documented opcodes: HELLO,
//! IDENTIFY with intents, HEARTBEAT and its ACK, READY with a `resume_gateway_url`, RESUME with
//! a replay of what was missed, RESUMED, dispatches for every change the REST fake makes). The
//! real binary runs the demo agent end to end.

mod common;

use common::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const TOKEN: &str = "MTAxNTk.chat-b-planted.5f1e";
const GUILD: &str = "700000000000000001";
const APP: &str = "700000000000000002";
const BOT: &str = "900000000000000001";
const BOT_ROLE: &str = "800000000000000001";
const OTHER_ROLE: &str = "800000000000000002";
const HUMAN: &str = "500000000000000001";
const HUMAN2: &str = "500000000000000002";
const STRANGER: &str = "500000000000000003";
const OTHER_BOT: &str = "500000000000000004";
const C1: &str = "600000000000000001";
const C2: &str = "600000000000000002";
const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;
const INTENTS: u64 = 34305;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn sf(id: &str) -> u64 {
    id.parse().unwrap()
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .to_string()
}

#[derive(Default)]
struct Store {
    /// Channel id to (name, type).
    channels: BTreeMap<String, (String, u64)>,
    /// Messages by channel or thread id (threads are keyed by their source message's id).
    messages: BTreeMap<String, Vec<Value>>,
    users: BTreeMap<String, Value>,
}

/// The Gateway fake's state.
#[derive(Default)]
struct Gw {
    /// Dispatches not yet delivered (sent once a session is live; replayed after a RESUME).
    queue: Vec<(String, Value)>,
    session: Option<String>,
    sessions: u64,
    seq: u64,
    live: bool,
    /// Every op a client sent (heartbeats, IDENTIFY and RESUME payloads).
    received: Vec<Value>,
    /// Send RECONNECT (op 7) on the live connection.
    send_reconnect: bool,
    /// Stop acknowledging heartbeats on the live connection (a zombie connection).
    mute_acks: bool,
    /// Answer the next RESUME with INVALID_SESSION (op 9, not resumable).
    refuse_resume: bool,
}

#[derive(Clone)]
struct FakeDiscord {
    store: Arc<Mutex<Store>>,
    /// (method, decoded path, body) of every authenticated request.
    calls: Arc<Mutex<Vec<(String, String, Value)>>>,
    auth_seen: Arc<Mutex<Vec<String>>>,
    throttle_next: Arc<AtomicBool>,
    throttled: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
    seq: Arc<AtomicU64>,
    gw: Arc<Mutex<Gw>>,
    drop_gateway: Arc<AtomicBool>,
    url: String,
    ws_url: String,
}

fn respond(req: tiny_http::Request, status: u16, body: Option<&Value>, extra: &[(&str, &str)]) {
    let text = body.map(Value::to_string).unwrap_or_default();
    let mut resp = tiny_http::Response::from_string(text).with_status_code(status);
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("X-RateLimit-Limit", "5"),
        ("X-RateLimit-Remaining", "4"),
        ("X-RateLimit-Reset-After", "0.050"),
        ("X-RateLimit-Bucket", "fakebucket"),
    ];
    headers.extend_from_slice(extra);
    for (k, v) in headers {
        resp = resp.with_header(tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).unwrap());
    }
    let _ = req.respond(resp);
}

fn error(code: u64, message: &str) -> Value {
    json!({"code": code, "message": message})
}

/// A message as Discord serves it: reactions with `count` and `me`, no user lists.
fn served(m: &Value) -> Value {
    let mut m = m.clone();
    if let Some(list) = m["reactions"].as_array_mut() {
        for r in list {
            let users = r["users"].as_array().cloned().unwrap_or_default();
            r["count"] = users.len().into();
            r["me"] = users.iter().any(|u| u == BOT).into();
            r.as_object_mut().unwrap().remove("users");
        }
    }
    m
}

impl FakeDiscord {
    fn start() -> FakeDiscord {
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = server.server_addr().to_ip().unwrap().port();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ws_port = listener.local_addr().unwrap().port();
        let fake = FakeDiscord {
            store: Arc::default(),
            calls: Arc::default(),
            auth_seen: Arc::default(),
            throttle_next: Arc::default(),
            throttled: Arc::default(),
            down: Arc::default(),
            seq: Arc::default(),
            gw: Arc::default(),
            drop_gateway: Arc::default(),
            url: format!("http://127.0.0.1:{port}/api/v10"),
            ws_url: format!("ws://127.0.0.1:{ws_port}"),
        };
        {
            let mut s = fake.store.lock().unwrap();
            s.channels.insert(C1.into(), ("eng".into(), 0));
            s.channels.insert(C2.into(), ("random".into(), 0));
            s.users.insert(
                HUMAN.into(),
                json!({"id": HUMAN, "username": "alice", "global_name": "Alice Example", "bot": false, "email": "alice@example.com"}),
            );
        }
        let f = fake.clone();
        std::thread::spawn(move || {
            for mut req in server.incoming_requests() {
                if f.down.load(Ordering::SeqCst) {
                    respond(req, 502, Some(&error(0, "Bad Gateway")), &[]);
                    continue;
                }
                if f.throttle_next.swap(false, Ordering::SeqCst) {
                    f.throttled.fetch_add(1, Ordering::SeqCst);
                    respond(
                        req,
                        429,
                        Some(
                            &json!({"message": "You are being rate limited.", "retry_after": 0.25, "global": false}),
                        ),
                        &[("Retry-After", "1"), ("X-RateLimit-Scope", "user")],
                    );
                    continue;
                }
                let auth = req
                    .headers()
                    .iter()
                    .find(|h| h.field.equiv("Authorization"))
                    .map(|h| h.value.as_str().to_string())
                    .unwrap_or_default();
                let mut body = String::new();
                let _ = req.as_reader().read_to_string(&mut body);
                let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let method = req.method().as_str().to_string();
                let url = req.url().to_string();
                let (path, query) = url.split_once('?').unwrap_or((&url, ""));
                let path = decode(path.trim_start_matches("/api/v10"));
                let mut q = BTreeMap::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    q.insert(k.to_string(), decode(v));
                }
                f.auth_seen.lock().unwrap().push(auth.clone());
                if auth != format!("Bot {TOKEN}") {
                    respond(req, 401, Some(&error(0, "401: Unauthorized")), &[]);
                    continue;
                }
                f.calls
                    .lock()
                    .unwrap()
                    .push((method.clone(), path.clone(), body.clone()));
                let (status, reply) = f.route(&method, &path, &q, &body);
                respond(req, status, reply.as_ref(), &[]);
            }
        });
        let f = fake.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let f = f.clone();
                std::thread::spawn(move || f.gateway_connection(stream));
            }
        });
        fake
    }

    /// A fresh snowflake `age_ms` ago (strictly increasing among same-age ids).
    fn id(&self, age_ms: u64) -> String {
        let n = self.seq.fetch_add(1, Ordering::SeqCst) % 4096;
        (((now_ms() - age_ms - DISCORD_EPOCH_MS) << 22) + n).to_string()
    }

    fn dispatch(&self, t: &str, d: Value) {
        self.gw.lock().unwrap().queue.push((t.to_string(), d));
    }

    /// A message posted `age_ms` ago (no event: svc was not listening then).
    fn put(&self, channel: &str, author: &str, content: &str, age_ms: u64, extra: Value) -> String {
        let id = self.id(age_ms);
        let mut m = json!({
            "id": id, "channel_id": channel, "guild_id": GUILD, "type": 0, "content": content,
            "author": {"id": author, "username": format!("user{}", &author[author.len() - 2..]), "bot": author == OTHER_BOT},
            "timestamp": "2026-01-01T00:00:00.000000+00:00", "edited_timestamp": null,
            "mentions": [], "mention_roles": [], "reactions": [],
        });
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            m[k] = v;
        }
        let mentions: Vec<Value> = content
            .split("<@")
            .skip(1)
            .filter_map(|s| s.split_once('>').map(|(id, _)| id.trim_start_matches('!')))
            .filter(|id| !id.starts_with('&'))
            .map(|id| json!({"id": id}))
            .collect();
        m["mentions"] = Value::Array(mentions);
        self.store
            .lock()
            .unwrap()
            .messages
            .entry(channel.to_string())
            .or_default()
            .push(m);
        id
    }

    /// A message posted now while svc listens: it arrives as MESSAGE_CREATE.
    fn say(&self, channel: &str, author: &str, content: &str, extra: Value) -> String {
        let id = self.put(channel, author, content, 0, extra);
        let m = self.message(channel, &id).unwrap();
        self.dispatch("MESSAGE_CREATE", served(&m));
        id
    }

    /// A person writes in the thread of `root` ("Start Thread from Message" first when there is
    /// none, which adds the starter system message), as Discord does it: the message in the
    /// thread channel, the root's `thread` reporting its last message, and MESSAGE_CREATE.
    fn reply(&self, root: &str, author: &str, content: &str) -> String {
        {
            let mut s = self.store.lock().unwrap();
            if !s.messages.contains_key(root) {
                s.messages.insert(root.to_string(), Vec::new());
                let start = self.id(0);
                s.messages.get_mut(root).unwrap().push(json!({
                    "id": start, "channel_id": root, "guild_id": GUILD, "type": 21, "content": "",
                    "author": {"id": author, "username": "starter", "bot": false},
                    "timestamp": "2026-01-01T00:00:00.000000+00:00", "edited_timestamp": null,
                    "mentions": [], "mention_roles": [], "reactions": [],
                    "message_reference": {"channel_id": C1, "guild_id": GUILD, "message_id": root},
                }));
                for list in s.messages.values_mut() {
                    for m in list.iter_mut() {
                        if m["id"] == root {
                            m["thread"] = json!({"id": root, "type": 11, "name": "thread", "last_message_id": start, "message_count": 0});
                        }
                    }
                }
            }
        }
        let id = self.put(root, author, content, 0, json!({}));
        let mut s = self.store.lock().unwrap();
        for list in s.messages.values_mut() {
            for m in list.iter_mut() {
                if m["id"] == root && m["thread"].is_object() {
                    m["thread"]["last_message_id"] = id.clone().into();
                    let n = m["thread"]["message_count"].as_u64().unwrap_or(0);
                    m["thread"]["message_count"] = (n + 1).into();
                }
            }
        }
        drop(s);
        let m = self.message(root, &id).unwrap();
        self.dispatch("MESSAGE_CREATE", served(&m));
        id
    }

    /// A person edits their message: new content, `edited_timestamp`, MESSAGE_UPDATE (the
    /// thread's last message does not move).
    fn edit(&self, channel: &str, id: &str, content: &str) {
        let m = self
            .with_message(channel, id, |m| {
                m["content"] = content.into();
                m["edited_timestamp"] = "2026-01-01T00:00:09.000000+00:00".into();
                m.clone()
            })
            .unwrap();
        self.dispatch("MESSAGE_UPDATE", served(&m));
    }

    fn message(&self, channel: &str, id: &str) -> Option<Value> {
        self.store
            .lock()
            .unwrap()
            .messages
            .get(channel)?
            .iter()
            .find(|m| m["id"] == id)
            .cloned()
    }

    fn with_message<T>(
        &self,
        channel: &str,
        id: &str,
        f: impl FnOnce(&mut Value) -> T,
    ) -> Option<T> {
        let mut s = self.store.lock().unwrap();
        let m = s
            .messages
            .get_mut(channel)?
            .iter_mut()
            .find(|m| m["id"] == id)?;
        Some(f(m))
    }

    fn react(&self, channel: &str, id: &str, emoji: &str, user: &str) -> bool {
        let added = self
            .with_message(channel, id, |m| {
                let list = m["reactions"].as_array_mut().unwrap();
                match list.iter_mut().find(|r| r["emoji"]["name"] == emoji) {
                    Some(r) => {
                        let users = r["users"].as_array_mut().unwrap();
                        if users.iter().any(|u| u == user) {
                            return false;
                        }
                        users.push(user.into());
                    }
                    None => {
                        list.push(json!({"emoji": {"id": null, "name": emoji}, "users": [user]}))
                    }
                }
                true
            })
            .unwrap_or(false);
        if added {
            self.dispatch(
                "MESSAGE_REACTION_ADD",
                json!({"user_id": user, "channel_id": channel, "message_id": id, "guild_id": GUILD, "emoji": {"id": null, "name": emoji}}),
            );
        }
        added
    }

    fn unreact(&self, channel: &str, id: &str, emoji: &str, user: &str) {
        self.with_message(channel, id, |m| {
            let list = m["reactions"].as_array_mut().unwrap();
            for r in list.iter_mut() {
                if r["emoji"]["name"] == emoji {
                    r["users"].as_array_mut().unwrap().retain(|u| u != user);
                }
            }
            list.retain(|r| !r["users"].as_array().unwrap().is_empty());
        });
        self.dispatch(
            "MESSAGE_REACTION_REMOVE",
            json!({"user_id": user, "channel_id": channel, "message_id": id, "guild_id": GUILD, "emoji": {"id": null, "name": emoji}}),
        );
    }

    /// The users who reacted with each emoji.
    fn reactions(&self, channel: &str, id: &str) -> Vec<(String, Vec<String>)> {
        let m = self.message(channel, id).unwrap();
        m["reactions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["emoji"]["name"].as_str().unwrap().to_string(),
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

    fn bot_reactions(&self, channel: &str, id: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .reactions(channel, id)
            .into_iter()
            .filter(|(_, users)| users.iter().any(|u| u == BOT))
            .map(|(e, _)| e)
            .collect();
        out.sort();
        out
    }

    /// The messages of the thread started from `id` (oldest first).
    fn thread(&self, id: &str) -> Vec<Value> {
        self.store
            .lock()
            .unwrap()
            .messages
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    fn statuses(&self, id: &str) -> Vec<String> {
        self.thread(id)
            .iter()
            .filter(|m| m["author"]["id"] == BOT)
            .filter_map(|m| {
                m["content"]
                    .as_str()?
                    .strip_prefix("Status: ")
                    .map(str::to_string)
            })
            .collect()
    }

    fn calls_matching(&self, method: &str, needle: &str) -> Vec<(String, Value)> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, p, _)| m == method && p.contains(needle))
            .map(|(_, p, b)| (p.clone(), b.clone()))
            .collect()
    }

    fn gw_ops(&self, op: u64) -> Vec<Value> {
        self.gw
            .lock()
            .unwrap()
            .received
            .iter()
            .filter(|v| v["op"] == op)
            .cloned()
            .collect()
    }

    fn route(
        &self,
        method: &str,
        path: &str,
        q: &BTreeMap<String, String>,
        body: &Value,
    ) -> (u16, Option<Value>) {
        let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (method, seg.as_slice()) {
            ("GET", ["gateway", "bot"]) => (
                200,
                Some(
                    json!({"url": self.ws_url, "shards": 1, "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}}),
                ),
            ),
            ("GET", ["users", "@me"]) => (
                200,
                Some(json!({"id": BOT, "username": "svc", "bot": true})),
            ),
            ("GET", ["applications", "@me"]) => (
                200,
                Some(json!({"id": APP, "name": "svc", "flags": 1 << 19})),
            ),
            ("GET", ["guilds", g]) if *g == GUILD => {
                (200, Some(json!({"id": GUILD, "name": "Acme"})))
            }
            ("GET", ["guilds", g, "roles"]) if *g == GUILD => (
                200,
                Some(json!([
                    {"id": GUILD, "name": "@everyone"},
                    {"id": OTHER_ROLE, "name": "devs"},
                    {"id": BOT_ROLE, "name": "svc", "managed": true, "tags": {"bot_id": BOT}},
                ])),
            ),
            ("GET", ["users", id]) => match self.store.lock().unwrap().users.get(*id) {
                Some(u) => (200, Some(u.clone())),
                None => (404, Some(error(10013, "Unknown User"))),
            },
            ("POST", ["applications", _, "guilds", _, "commands"]) => (
                201,
                Some(json!({"id": "1", "name": body["name"], "type": body["type"]})),
            ),
            ("POST", ["interactions", _, _, "callback"]) => (204, None),
            ("GET", ["channels", c]) => match self.store.lock().unwrap().channels.get(*c) {
                Some((name, kind)) => (
                    200,
                    Some(json!({"id": c, "name": name, "type": kind, "guild_id": GUILD})),
                ),
                None => (404, Some(error(10003, "Unknown Channel"))),
            },
            ("GET", ["channels", c, "messages"]) => {
                let s = self.store.lock().unwrap();
                if !s.channels.contains_key(*c) && !s.messages.contains_key(*c) {
                    return (404, Some(error(10003, "Unknown Channel")));
                }
                let mut list: Vec<Value> = s.messages.get(*c).cloned().unwrap_or_default();
                list.sort_by_key(|m| std::cmp::Reverse(sf(m["id"].as_str().unwrap())));
                let limit: usize = q
                    .get("limit")
                    .map_or(50, |l| l.parse().unwrap())
                    .clamp(1, 100);
                if let Some(b) = q.get("before") {
                    list.retain(|m| sf(m["id"].as_str().unwrap()) < sf(b));
                }
                if let Some(a) = q.get("after") {
                    // Discord answers the `limit` messages right after the anchor.
                    list.retain(|m| sf(m["id"].as_str().unwrap()) > sf(a));
                    let skip = list.len().saturating_sub(limit);
                    list = list.into_iter().skip(skip).collect();
                }
                let page: Vec<Value> = list.iter().take(limit).map(served).collect();
                (200, Some(Value::Array(page)))
            }
            ("GET", ["channels", c, "messages", m]) => match self.message(c, m) {
                Some(msg) => (200, Some(served(&msg))),
                None => (404, Some(error(10008, "Unknown Message"))),
            },
            ("POST", ["channels", c, "messages", m, "threads"]) => {
                if self.message(c, m).is_none() {
                    return (404, Some(error(10008, "Unknown Message")));
                }
                let mut s = self.store.lock().unwrap();
                if s.messages.contains_key(*m) {
                    return (
                        400,
                        Some(error(
                            160004,
                            "A thread has already been created for this message",
                        )),
                    );
                }
                s.messages.insert(m.to_string(), Vec::new());
                let root = s
                    .messages
                    .get_mut(*c)
                    .unwrap()
                    .iter_mut()
                    .find(|x| x["id"] == *m)
                    .unwrap();
                root["thread"] = json!({"id": m, "parent_id": c, "type": 11, "name": body["name"], "last_message_id": null, "message_count": 0});
                (201, Some(root["thread"].clone()))
            }
            ("POST", ["channels", t, "messages"]) => {
                if !self.store.lock().unwrap().messages.contains_key(*t) {
                    return (404, Some(error(10003, "Unknown Channel")));
                }
                // `enforce_nonce`: a nonce this author used recently answers with the message
                // it created, and creates nothing.
                if body["enforce_nonce"] == true && !body["nonce"].is_null() {
                    let s = self.store.lock().unwrap();
                    if let Some(first) = s.messages[*t]
                        .iter()
                        .find(|m| m["nonce"] == body["nonce"] && m["author"]["id"] == BOT)
                    {
                        return (200, Some(first.clone()));
                    }
                }
                let id = self.id(0);
                let mut msg = json!({
                    "id": id, "channel_id": t, "guild_id": GUILD, "type": 0,
                    "author": {"id": BOT, "username": "svc", "bot": true},
                    "content": body["content"], "timestamp": "2026-01-01T00:00:00.000000+00:00",
                    "edited_timestamp": null, "mentions": [], "mention_roles": [], "reactions": [],
                    "nonce": body["nonce"],
                });
                // A reply: type 19 with the reference Discord fills in.
                if let Some(m) = body.pointer("/message_reference/message_id") {
                    msg["type"] = 19.into();
                    msg["message_reference"] =
                        json!({"type": 0, "message_id": m, "channel_id": t, "guild_id": GUILD});
                }
                let mut s = self.store.lock().unwrap();
                s.messages.get_mut(*t).unwrap().push(msg.clone());
                // The thread's source message reports the thread's last message.
                for list in s.messages.values_mut() {
                    for root in list.iter_mut() {
                        if root["id"] == *t && root["thread"].is_object() {
                            root["thread"]["last_message_id"] = id.clone().into();
                            let n = root["thread"]["message_count"].as_u64().unwrap_or(0);
                            root["thread"]["message_count"] = (n + 1).into();
                        }
                    }
                }
                drop(s);
                self.dispatch("MESSAGE_CREATE", msg.clone());
                (200, Some(msg))
            }
            ("PATCH", ["channels", t, "messages", m]) => {
                let edited = self.with_message(t, m, |msg| {
                    msg["content"] = body["content"].clone();
                    msg["edited_timestamp"] = "2026-01-01T00:00:01.000000+00:00".into();
                    msg.clone()
                });
                match edited {
                    Some(msg) => {
                        self.dispatch("MESSAGE_UPDATE", msg.clone());
                        (200, Some(msg))
                    }
                    None => (404, Some(error(10008, "Unknown Message"))),
                }
            }
            (
                m @ ("PUT" | "DELETE"),
                ["channels", c, "messages", id, "reactions", emoji, "@me"],
            ) => {
                if self.message(c, id).is_none() {
                    return (404, Some(error(10008, "Unknown Message")));
                }
                if m == "PUT" {
                    self.react(c, id, emoji, BOT);
                } else {
                    self.unreact(c, id, emoji, BOT);
                }
                (204, None)
            }
            _ => (404, Some(error(0, "404: Not Found"))),
        }
    }

    /// One Gateway connection: HELLO, then IDENTIFY or RESUME, heartbeats, dispatches.
    fn gateway_connection(&self, stream: std::net::TcpStream) {
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let Ok(mut ws) = tungstenite::accept(stream) else {
            return;
        };
        let send = |ws: &mut tungstenite::WebSocket<std::net::TcpStream>, v: Value| {
            ws.send(tungstenite::Message::text(v.to_string())).is_ok()
        };
        if !send(
            &mut ws,
            json!({"op": 10, "d": {"heartbeat_interval": 1000}}),
        ) {
            return;
        }
        let mut identified = false;
        let mut muted = false;
        loop {
            {
                let mut gw = self.gw.lock().unwrap();
                if identified && std::mem::take(&mut gw.send_reconnect) {
                    send(&mut ws, json!({"op": 7, "d": null}));
                }
                if identified && std::mem::take(&mut gw.mute_acks) {
                    muted = true;
                }
            }
            if self.drop_gateway.swap(false, Ordering::SeqCst) {
                // An abrupt drop: no close frame.
                self.gw.lock().unwrap().live = false;
                return;
            }
            if identified {
                let mut gw = self.gw.lock().unwrap();
                if gw.live {
                    let pending: Vec<(String, Value)> = gw.queue.drain(..).collect();
                    for (t, d) in pending {
                        gw.seq += 1;
                        let s = gw.seq;
                        if !send(&mut ws, json!({"op": 0, "t": t, "s": s, "d": d})) {
                            gw.live = false;
                            return;
                        }
                    }
                }
            }
            let text = match ws.read() {
                Ok(tungstenite::Message::Text(t)) => t.to_string(),
                Ok(tungstenite::Message::Close(_)) => {
                    self.gw.lock().unwrap().live = false;
                    return;
                }
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue;
                }
                Err(_) => {
                    self.gw.lock().unwrap().live = false;
                    return;
                }
            };
            let v: Value = serde_json::from_str(&text).unwrap();
            let mut gw = self.gw.lock().unwrap();
            gw.received.push(v.clone());
            match v["op"].as_u64() {
                // A muted connection leaves heartbeats unanswered.
                Some(1) if !muted => {
                    send(&mut ws, json!({"op": 11}));
                }
                Some(2) => {
                    if v["d"]["token"] != TOKEN {
                        let _ = ws.close(Some(tungstenite::protocol::CloseFrame {
                            code: 4004.into(),
                            reason: "Authentication failed.".into(),
                        }));
                        return;
                    }
                    gw.sessions += 1;
                    let session = format!("sess-{}", gw.sessions);
                    gw.session = Some(session.clone());
                    gw.seq = 1;
                    gw.live = true;
                    identified = true;
                    send(
                        &mut ws,
                        json!({"op": 0, "t": "READY", "s": 1, "d": {"v": 10, "user": {"id": BOT, "bot": true, "username": "svc"}, "guilds": [{"id": GUILD, "unavailable": true}], "session_id": session, "resume_gateway_url": self.ws_url, "application": {"id": APP, "flags": 1 << 19}}}),
                    );
                }
                Some(6) => {
                    if std::mem::take(&mut gw.refuse_resume) {
                        send(&mut ws, json!({"op": 9, "d": false}));
                    } else if v["d"]["token"] == TOKEN
                        && gw.session.as_deref() == v["d"]["session_id"].as_str()
                    {
                        // Replays happen through the queue; RESUMED follows them.
                        gw.live = true;
                        identified = true;
                        let pending: Vec<(String, Value)> = gw.queue.drain(..).collect();
                        for (t, d) in pending {
                            gw.seq += 1;
                            let s = gw.seq;
                            send(&mut ws, json!({"op": 0, "t": t, "s": s, "d": d}));
                        }
                        gw.seq += 1;
                        let s = gw.seq;
                        send(&mut ws, json!({"op": 0, "t": "RESUMED", "s": s, "d": {}}));
                    } else {
                        send(&mut ws, json!({"op": 9, "d": false}));
                    }
                }
                _ => {}
            }
        }
    }
}

fn chat_b_workflow(
    dir: &TestDir,
    fake: &FakeDiscord,
    interval_ms: u64,
    extra: &str,
) -> std::path::PathBuf {
    workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: discord\n  dispatch:\n    route_label_prefix: route-\ntrackers:\n  discord:\n    provider: chat-b\n    endpoint: {}\n    channels: [$WATCHED_CHANNEL, $UNSET_CHANNEL]\n{extra}polling:\n  interval_ms: {interval_ms}\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 1\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n",
            fake.url
        ),
    )
}

fn daemon(dir: &TestDir, wf: &std::path::Path) -> Daemon {
    let mut cmd = svc(dir);
    cmd.arg("--no-tui")
        .arg(wf)
        .env("WATCHED_CHANNEL", C1)
        .env_remove("UNSET_CHANNEL")
        .env("CHAT_B_GUILD_ID", GUILD)
        .env("CHAT_B_BOT_USER_ID", BOT)
        .env("CHAT_B_BOT_TOKEN", TOKEN)
        .env("RUST_LOG", "info")
        .env("SVC_DEMO_AGENT_RECORD", dir.join("sessions.jsonl"));
    Daemon::start(cmd)
}

#[test]
fn mentions_roles_and_markers_become_runs_that_end_done_in_the_thread() {
    let fake = FakeDiscord::start();
    // Everything here was posted while svc was down: the first scan finds it. A tracked
    // message sits below 250 messages of chatter, so the scan pages with `before`.
    let marked = fake.put(
        C1,
        STRANGER,
        "an old message someone tracked with the message command",
        30 * 86_400_000,
        json!({"reactions": [{"emoji": {"id": null, "name": "🤖"}, "users": [BOT]}]}),
    );
    for n in 0..250 {
        fake.put(
            C1,
            HUMAN2,
            &format!("chatter {n}"),
            20 * 86_400_000 - n * 1000,
            json!({}),
        );
    }
    let a = fake.put(
        C1,
        HUMAN,
        &format!("<@{BOT}> fix the login page #route-web\nIt fails on submit."),
        3_600_000,
        json!({}),
    );
    let role = fake.put(
        C1,
        HUMAN,
        &format!("<@&{BOT_ROLE}> the build is flaky"),
        3_500_000,
        json!({"mention_roles": [BOT_ROLE]}),
    );
    let other = fake.put(
        C1,
        HUMAN,
        "<@500000000000000009> can you look?",
        3_400_000,
        json!({}),
    );
    let other_role = fake.put(
        C1,
        HUMAN,
        &format!("<@&{OTHER_ROLE}> anyone?"),
        3_300_000,
        json!({"mention_roles": [OTHER_ROLE]}),
    );
    let stranger = fake.put(
        C1,
        STRANGER,
        &format!("<@!{BOT}> do my bidding"),
        3_200_000,
        json!({}),
    );
    let bot_author = fake.put(
        C1,
        OTHER_BOT,
        &format!("<@{BOT}> beep"),
        3_100_000,
        json!({}),
    );
    let done = fake.put(
        C1,
        HUMAN,
        &format!("<@{BOT}> already handled"),
        3_000_000,
        json!({"reactions": [{"emoji": {"id": null, "name": "✅"}, "users": [HUMAN]}]}),
    );
    let unwatched = fake.put(
        C2,
        HUMAN,
        &format!("<@{BOT}> not here"),
        2_900_000,
        json!({}),
    );
    fake.throttle_next.store(true, Ordering::SeqCst);

    let dir = TestDir::new("chat-b");
    let wf = chat_b_workflow(
        &dir,
        &fake,
        200,
        &format!("    users: [\"{HUMAN}\", \"{HUMAN2}\"]\n"),
    );
    let d = daemon(&dir, &wf);
    wait_until(90, "the three tracked messages done", || {
        [&a, &role, &marked]
            .iter()
            .all(|m| fake.statuses(m).last().map(String::as_str) == Some("Done"))
    });
    d.wait_for(30, "workspaces removed", |s| {
        events(s).contains(&"workspace_removed".to_string()) && s["counts"]["running"] == 0
    });
    assert_eq!(
        fake.throttled.load(Ordering::SeqCst),
        1,
        "the 429 was answered"
    );
    let s = d.latest().unwrap();
    assert!(
        s["rate_limits"]["x-ratelimit-limit"].is_number(),
        "{}",
        s["rate_limits"]
    );

    // Nothing else was touched: other mentions, a stranger, another bot, a Done message, an
    // unwatched channel.
    for (id, why) in [
        (&other, "a mention of another user"),
        (&other_role, "a mention of another role"),
        (&stranger, "an author outside tracker.users"),
        (&bot_author, "a bot author"),
        (&done, "a message already Done by reaction"),
    ] {
        assert!(fake.thread(id).is_empty(), "{why}");
        assert!(fake.bot_reactions(C1, id).is_empty(), "{why}");
    }
    assert!(fake.thread(&unwatched).is_empty());
    assert!(
        fake.calls
            .lock()
            .unwrap()
            .iter()
            .all(|(_, p, _)| !p.contains(C2)),
        "svc never reads or writes an unwatched channel"
    );

    for id in [&a, &role, &marked] {
        // Status and progress live in the message's own thread (its id is the message's).
        let thread = fake.thread(id);
        assert!(thread.iter().all(|m| m["channel_id"] == id.as_str()));
        let workpads: Vec<&Value> = thread
            .iter()
            .filter(|m| m["content"].as_str().unwrap().starts_with("**Workpad**"))
            .collect();
        assert_eq!(
            workpads.len(),
            1,
            "one workpad, edited in place: {thread:?}"
        );
        assert!(
            workpads[0]["content"]
                .as_str()
                .unwrap()
                .contains("DEMO.md written")
        );
        assert!(workpads[0]["edited_timestamp"].is_string());
        assert!(thread.iter().any(|m| {
            m["content"]
                .as_str()
                .unwrap()
                .contains("DEMO.md in its workspace")
        }));
        // The bot's reactions mirror Done (the 👀 of the claim is healed away).
        wait_until(30, "reactions mirroring Done", || {
            fake.bot_reactions(C1, id) == ["✅", "🤖"]
        });
    }
    let threads = fake.calls_matching("POST", "/threads");
    assert_eq!(threads.len(), 3, "one thread per issue");
    assert!(
        threads
            .iter()
            .any(|(p, b)| p.contains(&a) && b["name"] == "fix the login page #route-web")
    );
    assert!(
        !fake.calls_matching("PUT", "/reactions/👀/@me").is_empty(),
        "a claimed Todo issue is acknowledged with 👀"
    );
    // Every message svc sent disables mention parsing.
    let sent: Vec<(String, Value)> = fake
        .calls_matching("POST", "/messages")
        .into_iter()
        .filter(|(p, _)| p.ends_with("/messages"))
        .chain(fake.calls_matching("PATCH", "/messages/"))
        .collect();
    assert!(sent.len() >= 12, "{sent:?}");
    for (p, b) in &sent {
        assert_eq!(b["allowed_mentions"], json!({"parse": []}), "{p}");
    }
    assert!(
        fake.auth_seen
            .lock()
            .unwrap()
            .iter()
            .all(|h| *h == format!("Bot {TOKEN}")),
        "the token travels as a Bot token"
    );
    let identify = fake.gw_ops(2);
    assert_eq!(identify.len(), 1, "one session");
    assert_eq!(identify[0]["d"]["intents"], INTENTS);
    assert!(
        !fake
            .calls_matching(
                "POST",
                &format!("/applications/{APP}/guilds/{GUILD}/commands")
            )
            .is_empty(),
        "the message command is registered"
    );

    // Self-heal: a moderator removes the bot's ✅; the bot puts it back.
    fake.unreact(C1, &a, "✅", BOT);
    wait_until(30, "the bot's ✅ restored", || {
        fake.bot_reactions(C1, &a) == ["✅", "🤖"]
    });

    // Every tool through /mcp with the token a run received.
    let mcp = mcp_of(&dir);
    let id_a = format!("{C1}:{a}");
    let (err, v) = tool(&mcp, "chat_b_read_thread", json!({"issueId": id_a}));
    assert!(!err, "{v}");
    assert_eq!(v["status"]["state"], "Done");
    assert_eq!(v["status"]["source"], "status_reply");
    assert_eq!(v["title"], "fix the login page #route-web");
    assert_eq!(v["labels"], json!(["route-web"]));
    assert_eq!(v["threadId"], a.as_str());
    assert_eq!(
        v["permalink"],
        format!("https://discord.com/channels/{GUILD}/{C1}/{a}")
    );
    assert!(v["messages"].as_array().unwrap().len() >= 3, "{v}");

    // The workpad tool edits the one workpad message.
    let pad_id = fake
        .thread(&a)
        .iter()
        .find(|m| m["content"].as_str().unwrap().starts_with("**Workpad**"))
        .unwrap()["id"]
        .clone();
    let (err, v) = tool(
        &mcp,
        "chat_b_workpad",
        json!({"issueId": id_a, "environment": "linux", "plan": "1. look", "acceptanceCriteria": "it works", "validationCommands": "cargo test", "progress": "all done"}),
    );
    assert!(!err, "{v}");
    assert_eq!(v, json!({"ok": true, "messageId": pad_id}));
    let e = error_of(tool(
        &mcp,
        "chat_b_workpad",
        json!({"issueId": id_a, "environment": "x"}),
    ));
    assert!(e.contains("'plan' is required"), "{e}");

    let unknown = error_of(tool(
        &mcp,
        "chat_b_update_status",
        json!({"issueId": id_a, "status": "Shipped"}),
    ));
    assert!(unknown.contains("unknown status"), "{unknown}");
    let (err, v) = tool(
        &mcp,
        "chat_b_update_status",
        json!({"issueId": id_a, "status": "cancelled"}),
    );
    assert!(!err, "{v}");
    assert_eq!(v, json!({"ok": true, "status": "Cancelled"}));
    assert_eq!(fake.statuses(&a).last().unwrap(), "Cancelled");
    assert_eq!(fake.bot_reactions(C1, &a), ["❌", "🤖"]);

    let (err, v) = tool(
        &mcp,
        "chat_b_comment",
        json!({"issueId": id_a, "body": format!("ping <@{HUMAN}> @everyone")}),
    );
    assert_eq!(v, json!({"ok": true}), "{err}");
    let (_, last) = fake
        .calls_matching("POST", &format!("/channels/{a}/messages"))
        .pop()
        .unwrap();
    assert_eq!(last["content"], format!("ping <@{HUMAN}> @everyone"));
    assert_eq!(
        last["allowed_mentions"],
        json!({"parse": []}),
        "nobody is pinged"
    );
    let (err, v) = tool(
        &mcp,
        "chat_b_comment",
        json!({"issueId": id_a, "body": "Status: Done"}),
    );
    assert!(!err, "{v}");
    let (_, v) = tool(&mcp, "chat_b_read_thread", json!({"issueId": id_a}));
    assert_eq!(
        v["status"]["state"], "Cancelled",
        "a comment never moves the state"
    );

    // Queries read the allowed channels only.
    assert_query_reads_watched(
        &mcp,
        "chat_b",
        &[C1, C2],
        vec![
            format!("{C1}:{a}"),
            format!("{C1}:{role}"),
            format!("{C1}:{marked}"),
            format!("{C1}:{done}"),
        ],
        (
            &["issueId", "channel", "messageId", "stateType", "url"],
            3,
            C1,
        ),
        &[C2],
    );

    // Channel context is capped at 50 each side.
    assert_channel_context(&mcp, "chat_b", &id_a, ("id", &a), [&role, &other], 6);

    let (err, v) = tool(&mcp, "chat_b_user_info", json!({"userId": HUMAN}));
    assert!(!err, "{v}");
    assert_eq!(v["user"]["global_name"], "Alice Example");
    assert!(v["user"].get("email").is_none());
    let missing = error_of(tool(&mcp, "chat_b_user_info", json!({"userId": "123"})));
    assert!(missing.contains("Unknown User"), "{missing}");

    // Per-issue tools refuse untracked messages and unwatched channels.
    assert_refused(
        &mcp,
        &[
            "chat_b_read_thread",
            "chat_b_comment",
            "chat_b_update_status",
            "chat_b_channel_context",
            "chat_b_workpad",
        ],
        |id| json!({"issueId": id, "body": "x", "status": "Done", "environment": "e", "plan": "p", "acceptanceCriteria": "a", "validationCommands": "v"}),
        &[
            format!("{C1}:{other}"),
            format!("{C1}:{stranger}"),
            format!("{C1}:123"),
        ],
        &format!("{C2}:{unwatched}"),
    );
    assert!(fake.thread(&other).is_empty() && fake.thread(&stranger).is_empty());
    let e = error_of(tool(&mcp, "chat_b_create_issue", json!({"title": "x"})));
    assert!(e.contains("Unsupported tool"), "{e}");
    assert!(
        !d.stderr().contains(TOKEN),
        "the token never reaches the log"
    );
    assert!(!d.latest().unwrap().to_string().contains(TOKEN));
}

#[test]
fn the_gateway_starts_runs_resumes_after_a_drop_and_serves_the_message_command() {
    let fake = FakeDiscord::start();
    let dir = TestDir::new("chat-b-gateway");
    // A poll every 10 minutes: after the first one only Gateway events can start runs soon.
    let wf = chat_b_workflow(&dir, &fake, 600_000, "");
    let d = daemon(&dir, &wf);
    wait_until(30, "a Gateway session", || fake.gw.lock().unwrap().live);
    let identify = fake.gw_ops(2);
    assert_eq!(identify[0]["d"]["token"], TOKEN);
    assert_eq!(identify[0]["d"]["intents"], INTENTS);

    let first = fake.say(C1, HUMAN, &format!("<@{BOT}> first job"), json!({}));
    wait_until(60, "the first job done", || {
        fake.statuses(&first).last().map(String::as_str) == Some("Done")
    });
    wait_until(30, "a heartbeat", || !fake.gw_ops(1).is_empty());

    // The connection drops; what happens meanwhile is replayed after RESUME.
    let seq_before = fake.gw.lock().unwrap().seq;
    fake.drop_gateway.store(true, Ordering::SeqCst);
    let second = fake.say(C1, HUMAN, &format!("<@{BOT}> second job"), json!({}));
    wait_until(60, "a RESUME", || !fake.gw_ops(6).is_empty());
    let resume = &fake.gw_ops(6)[0];
    assert_eq!(resume["d"]["session_id"], "sess-1");
    assert_eq!(resume["d"]["token"], TOKEN);
    assert!(
        resume["d"]["seq"].as_u64().unwrap() >= seq_before,
        "{resume}"
    );
    wait_until(60, "the second job done", || {
        fake.statuses(&second).last().map(String::as_str) == Some("Done")
    });
    assert_eq!(fake.gw_ops(2).len(), 1, "resumed, not identified again");

    // RECONNECT asks for a resume; so does a connection that stops acknowledging heartbeats.
    fake.gw.lock().unwrap().send_reconnect = true;
    wait_until(30, "a RESUME after RECONNECT", || fake.gw_ops(6).len() == 2);
    fake.gw.lock().unwrap().mute_acks = true;
    wait_until(30, "a RESUME after missing ACKs", || {
        fake.gw_ops(6).len() == 3
    });
    // A session Discord will not resume: a new IDENTIFY.
    fake.gw.lock().unwrap().refuse_resume = true;
    fake.drop_gateway.store(true, Ordering::SeqCst);
    wait_until(30, "a second IDENTIFY", || fake.gw_ops(2).len() == 2);
    assert_eq!(fake.gw_ops(6).len(), 4);
    wait_until(30, "the new session live", || fake.gw.lock().unwrap().live);

    // "Track with svc" on a message without a mention: the bot marks it and it becomes a run.
    let plain = fake.say(C1, HUMAN2, "the docs are out of date", json!({}));
    fake.dispatch(
        "INTERACTION_CREATE",
        json!({"id": "990000000000000001", "application_id": APP, "type": 2, "token": "aW50ZXJhY3Rpb24tdG9rZW4", "guild_id": GUILD, "channel_id": C1,
               "member": {"user": {"id": HUMAN}}, "data": {"id": "1", "name": "Track with svc", "type": 3, "target_id": plain}}),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while fake.statuses(&plain).last().map(String::as_str) != Some("Done") {
        assert!(
            std::time::Instant::now() < deadline,
            "the marked message is not done\n{}\n{:?}",
            d.stderr(),
            fake.calls
                .lock()
                .unwrap()
                .iter()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let callbacks = fake.calls_matching("POST", "/callback");
    assert_eq!(callbacks.len(), 1);
    assert_eq!(callbacks[0].1["type"], 4);
    assert_eq!(callbacks[0].1["data"]["flags"], 64, "an ephemeral answer");
    assert!(!d.stderr().contains("aW50ZXJhY3Rpb24tdG9rZW4"));

    // A chatty message that mentions nobody starts nothing.
    let chatter = fake.say(C1, HUMAN, "lunch?", json!({}));
    let other_channel = fake.say(C2, HUMAN, &format!("<@{BOT}> wrong channel"), json!({}));
    // Another mention after them proves the events before it were handled.
    let last = fake.say(C1, HUMAN, &format!("<@{BOT}> last job"), json!({}));
    wait_until(60, "the last job done", || {
        fake.statuses(&last).last().map(String::as_str) == Some("Done")
    });
    assert!(fake.thread(&chatter).is_empty());
    assert!(fake.thread(&other_channel).is_empty());
    assert!(!d.stderr().contains(TOKEN));

    // svc stops; a mention arrives meanwhile (no event reaches anyone); the next start's scan
    // finds it.
    drop(d);
    let offline = fake.put(
        C1,
        HUMAN,
        &format!("<@{BOT}> while svc was down"),
        0,
        json!({}),
    );
    let d = daemon(&dir, &wf);
    wait_until(60, "the message posted while svc was down done", || {
        fake.statuses(&offline).last().map(String::as_str) == Some("Done")
    });
    assert_eq!(fake.gw_ops(2).len(), 3, "a new session after the restart");
    for id in [&first, &second, &plain, &last] {
        assert_eq!(
            fake.statuses(id),
            ["Done"],
            "finished work is not picked up again"
        );
    }
    assert!(!d.stderr().contains(TOKEN));
}

#[test]
fn an_outage_leaves_running_work_alone_and_a_reaction_ends_the_issue() {
    let fake = FakeDiscord::start();
    let long = fake.put(
        C1,
        HUMAN,
        &format!("<@{BOT}> a long job\ndemo: keep-open\ndemo: slow 60000"),
        60_000,
        json!({}),
    );
    let dir = TestDir::new("chat-b-outage");
    let wf = chat_b_workflow(&dir, &fake, 200, "    emoji_states:\n      🚀: Done\n");
    let d = daemon(&dir, &wf);
    let id = format!("{C1}:{long}");
    d.wait_for(30, "the mention running", |s| {
        running_ids(s) == [id.clone()]
    });
    // The claim's best-effort 👀.
    wait_until(30, "the 👀 acknowledgement", || {
        fake.bot_reactions(C1, &long) == ["👀"]
    });

    fake.down.store(true, Ordering::SeqCst);
    let s = d.wait_for(60, "a failed poll", |s| {
        events(s).contains(&"tracker_poll_failed".to_string())
    });
    assert_eq!(running_ids(&s), [id.as_str()], "running work is left alone");
    fake.down.store(false, Ordering::SeqCst);

    // A human's reaction from the merged map ends the issue.
    fake.react(C1, &long, "🚀", HUMAN);
    d.wait_for(60, "the run stopped and its workspace removed", |s| {
        s["counts"]["running"] == 0 && events(s).contains(&"workspace_removed".to_string())
    });
    assert!(fake.statuses(&long).is_empty(), "keep-open posted nothing");
    assert!(!d.stderr().contains(TOKEN));
}

#[test]
fn every_tool_fails_closed_without_a_bot_user_id() {
    let fake = FakeDiscord::start();
    let m = fake.put(C1, HUMAN, &format!("<@{BOT}> hi"), 60_000, json!({}));
    let dir = TestDir::new("chat-b-closed");
    let slice = format!("    endpoint: {}\n    channels: [\"{C1}\"]\n", fake.url);
    let env = [("CHAT_B_BOT_TOKEN", TOKEN), ("CHAT_B_BOT_USER_ID", "")];
    let (_d, mcp) = chat_pack_daemon(&dir, "chat_b", &slice, &env);
    let id = format!("{C1}:{m}");
    let mut calls = chat_tool_calls("chat_b", &id, HUMAN);
    calls.push((
        "chat_b_workpad".into(),
        json!({"issueId": id, "environment": "e", "plan": "p", "acceptanceCriteria": "a", "validationCommands": "v"}),
    ));
    assert_fail_closed(&mcp, "chat_b", "CHAT_B_BOT_USER_ID", calls);
    assert!(
        fake.calls.lock().unwrap().is_empty(),
        "nothing reached the API"
    );
}

#[test]
fn doctor_online_checks_the_token_guild_channels_and_intents() {
    let fake = FakeDiscord::start();
    let dir = TestDir::new("chat-b-doctor");
    let wf = chat_b_workflow(&dir, &fake, 200, "");
    let doctor = |channel: &str, token: &str| {
        doctor_online(
            &dir,
            &wf,
            &[
                ("WATCHED_CHANNEL", channel),
                ("CHAT_B_GUILD_ID", GUILD),
                ("CHAT_B_BOT_USER_ID", BOT),
                ("CHAT_B_BOT_TOKEN", token),
            ],
        )
    };
    let r = doctor(C1, TOKEN);
    for line in [
        format!("chat-b accepts the bot token (bot user {BOT}, svc)"),
        format!("the bot is in Acme ({GUILD})"),
        format!("the bot can see #eng ({C1})"),
        "the MESSAGE CONTENT intent is enabled".to_string(),
    ] {
        assert!(r.stdout.contains(&line), "{line}\n{}", r.all());
    }
    let r = doctor(C1, "wrong-token");
    assert_eq!(r.code, Some(1));
    assert!(r.stdout.contains("401"), "{}", r.stdout);
    assert!(!r.all().contains(TOKEN) && !r.all().contains("wrong-token"));
    let r = doctor("600000000000000999", TOKEN);
    assert_eq!(r.code, Some(1));
    assert!(r.stdout.contains("Unknown Channel"), "{}", r.stdout);
}

/// A message create whose answer is lost (a 500 after Discord created it, a dropped
/// connection) is sent again with the same `nonce` and `enforce_nonce`, so the thread gets one
/// message, not two.
#[test]
fn a_post_whose_answer_is_lost_is_not_posted_twice() {
    let fake = FakeDiscord::start();
    let m = fake.put(C1, HUMAN, &format!("<@{BOT}> hi"), 60_000, json!({}));
    let upstream = fake
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/api/v10")
        .to_string();
    let proxy = common::losing::LosingProxy::start(&upstream);
    let dir = TestDir::new("chat-b-lost");
    let slice = format!(
        "    endpoint: {}/api/v10\n    channels: [\"{C1}\"]\n",
        proxy.base
    );
    let env = [("CHAT_B_BOT_TOKEN", TOKEN), ("CHAT_B_BOT_USER_ID", BOT)];
    let (_d, mcp) = chat_pack_daemon(&dir, "chat_b", &slice, &env);
    let id = format!("{C1}:{m}");
    let create = format!("POST /api/v10/channels/{m}/messages ");
    for (how, text) in [
        (common::losing::Lose::Status500, "after a 500"),
        (common::losing::Lose::Drop, "after a dropped connection"),
    ] {
        proxy.arm(&create, how);
        let r = tool(&mcp, "chat_b_comment", json!({"issueId": id, "body": text}));
        assert!(!r.0, "{how:?}: {}", r.1);
        let posted = fake
            .thread(&m)
            .iter()
            .filter(|x| x["content"].as_str().is_some_and(|c| c.contains(text)))
            .count();
        assert_eq!(posted, 1, "{how:?}: {:#?}", fake.thread(&m));
    }
    assert_eq!(proxy.lost().len(), 2, "both answers were lost");
}

/// Human steering over the Gateway: a person's reply in the message's thread reaches the running
/// agent as its next prompt, with the author; the bot's own messages, another bot, a user
/// outside `users`, a system message, an edit and an `!aside` do not; `!status` with an unknown
/// state is answered in the thread; `!cancel` posts the status reply naming who asked (a reply
/// to the command), mirrors ❌ and ends the run. Polls come only from Gateway events here.
#[test]
fn thread_replies_steer_the_running_agent_and_cancel_ends_it() {
    let fake = FakeDiscord::start();
    let dir = TestDir::new("chat-b-steer");
    let prompts_file = dir.join("prompts.jsonl");
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: discord\ntrackers:\n  discord:\n    provider: chat-b\n    endpoint: {}\n    channels: [$WATCHED_CHANNEL]\n    users: [\"{HUMAN}\", \"{HUMAN2}\"]\npolling:\n  interval_ms: 600000\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 5\nagents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n",
            fake.url,
            prompts_file.display(),
            svc_bin()
        ),
    );
    let d = daemon(&dir, &wf);
    wait_until(30, "a Gateway session", || fake.gw.lock().unwrap().live);
    let root = fake.say(
        C1,
        HUMAN,
        &format!("<@{BOT}> steer me\ndemo: slow 8000\ndemo: keep-open"),
        json!({}),
    );
    let id = format!("{C1}:{root}");
    d.wait_for(60, "the run in its first turn", |s| {
        running_by_id(s, &id).is_some_and(|r| r["turn_count"] == 1)
    });
    wait_until(30, "the first prompt", || {
        prompt_texts(&prompts_file).len() == 1
    });

    // What is not for the agent, then a person's reply.
    fake.reply(&root, BOT, "the bot's own words");
    fake.reply(&root, OTHER_BOT, "beep from another bot");
    fake.reply(&root, STRANGER, "a stranger's advice");
    fake.reply(&root, HUMAN, "!aside between us humans");
    // (Each reply keeps the demo agent busy, and from completing the issue, for its turn.)
    let alice = fake.reply(
        &root,
        HUMAN,
        "Alice says: use tabs\ndemo: slow 5000\ndemo: keep-open",
    );
    wait_until(30, "alice's reply delivered", || {
        prompt_texts(&prompts_file)
            .iter()
            .any(|p| p.contains("--- from user01 (500000000000000001) (via chat-b,"))
    });
    let s = d.wait_for(20, "the ignored replies counted", |s| {
        events(s).contains(&"steering_ignored".to_string())
    });
    let recent = s["recent_events"].to_string();
    assert!(
        recent.contains("a stranger") || recent.contains("not in the tracker"),
        "{recent}"
    );

    // An edit is not a new message; bob's reply after it is.
    fake.edit(&root, &alice, "EDITED: use spaces");
    fake.reply(
        &root,
        HUMAN2,
        "Bob: second note\ndemo: slow 60000\ndemo: keep-open",
    );
    wait_until(30, "bob's reply delivered", || {
        prompt_texts(&prompts_file)
            .iter()
            .any(|p| p.contains("Bob: second note"))
    });
    let all = prompt_texts(&prompts_file).join("\n");
    assert!(all.contains("Alice says: use tabs"), "{all}");
    for never in [
        "the bot's own words",
        "beep from another bot",
        "a stranger's advice",
        "between us humans",
        "EDITED",
    ] {
        assert!(!all.contains(never), "{never:?} was delivered:\n{all}");
    }
    assert_eq!(all.matches("Alice says: use tabs").count(), 1, "{all}");

    // Commands: a stranger's is not obeyed; an unknown state is answered; !cancel ends the run.
    fake.reply(&root, STRANGER, "!cancel");
    let unknown = fake.reply(&root, HUMAN, "!status Shipped");
    wait_until(30, "the unknown state answered", || {
        fake.thread(&root).iter().any(|m| {
            m["author"]["id"] == BOT
                && m["message_reference"]["message_id"] == unknown.as_str()
                && m["content"]
                    .as_str()
                    .unwrap()
                    .contains("unknown status \"Shipped\"")
        })
    });
    assert!(fake.statuses(&root).is_empty(), "{:?}", fake.thread(&root));
    assert_eq!(running_ids(&d.latest().unwrap()), [id.as_str()]);
    let cancel = fake.reply(&root, HUMAN2, "!cancel");
    wait_until(60, "the run stopped", || {
        d.latest().is_some_and(|s| running_by_id(&s, &id).is_none())
    });
    let thread = fake.thread(&root);
    let replies: Vec<&Value> = thread
        .iter()
        .filter(|m| {
            m["author"]["id"] == BOT && m["message_reference"]["message_id"] == cancel.as_str()
        })
        .collect();
    assert_eq!(replies.len(), 1, "{thread:?}");
    assert_eq!(
        replies[0]["content"],
        format!("Status: Cancelled\nAsked by <@{HUMAN2}> with `!cancel`.")
    );
    assert_eq!(fake.statuses(&root).len(), 1);
    wait_until(30, "❌ mirrored", || {
        fake.bot_reactions(C1, &root).contains(&"❌".to_string())
    });
    let all = prompt_texts(&prompts_file).join("\n");
    assert!(
        !all.contains("!cancel") && !all.contains("!status"),
        "{all}"
    );
    // Nothing is answered twice.
    std::thread::sleep(Duration::from_millis(1500));
    let thread = fake.thread(&root);
    assert_eq!(
        thread
            .iter()
            .filter(|m| m["author"]["id"] == BOT && m["type"] == 19)
            .count(),
        2,
        "{thread:?}"
    );
    assert!(!d.stderr().contains(TOKEN));
}

/// A benchmark harness, not a test (ignored; it asserts nothing but that the messages arrive):
/// the time from a person's reply entering svc as a Gateway event (MESSAGE_CREATE sent by the
/// fake) to its `session/prompt` reaching the bridge, with idle bridges that take queued
/// prompts. `scripts/bench-steering` runs it in release mode and prints the figure.
#[test]
#[ignore]
fn gateway_steering_latency() {
    let n: usize = std::env::var("SVC_BENCH_ISSUES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let fake = FakeDiscord::start();
    let dir = TestDir::new("chat-b-steer-bench");
    let prompts_file = dir.join("prompts.jsonl");
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: discord\ntrackers:\n  discord:\n    provider: chat-b\n    endpoint: {}\n    channels: [$WATCHED_CHANNEL]\npolling:\n  interval_ms: 600000\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 5\n  max_concurrent_agents: {n}\nagents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\n    stall_timeout_ms: 0\n    queue_prompts: true\nserver:\n  port: 0\n  trace_dir: traces\n",
            fake.url,
            prompts_file.display(),
            svc_bin()
        ),
    );
    let d = daemon(&dir, &wf);
    wait_until(30, "a Gateway session", || fake.gw.lock().unwrap().live);
    let roots: Vec<String> = (0..n)
        .map(|i| {
            fake.say(
                C1,
                HUMAN,
                &format!("<@{BOT}> bench {i}\ndemo: slow 600000\ndemo: keep-open"),
                json!({}),
            )
        })
        .collect();
    wait_until(120, "every run in its first turn", || {
        prompt_texts(&prompts_file).len() >= n
    });
    let stamped = |needle: &str| -> Option<u64> {
        std::fs::read_to_string(&prompts_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|p| p["text"].as_str().is_some_and(|t| t.contains(needle)))
            .and_then(|p| p["atMs"].as_u64())
    };
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let mut latencies = Vec::new();
    for (i, root) in roots.iter().enumerate() {
        let needle = format!("gateway note {i}");
        let sent = now_ms();
        fake.reply(root, HUMAN, &needle);
        wait_until(30, "the reply at its bridge", || stamped(&needle).is_some());
        latencies.push(stamped(&needle).unwrap().saturating_sub(sent));
    }
    latencies.sort();
    println!(
        "steering latency (Gateway MESSAGE_CREATE -> session/prompt at the bridge), {} messages: median {} ms, p90 {} ms, max {} ms",
        latencies.len(),
        latencies[latencies.len() / 2],
        latencies[(latencies.len() * 9 / 10).min(latencies.len() - 1)],
        latencies[latencies.len() - 1]
    );
    drop(d);
}
