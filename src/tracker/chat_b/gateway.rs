//! chat-b's background: the Discord Gateway client on its own thread, and a worker thread for
//! the REST calls events ask for (the best-effort 👀 on a claimed issue, healing the bot's
//! reactions, answering the "Track with svc" message command).
//!
//! The Gateway client connects to the URL `GET /gateway/bot` gives (v10, JSON) with tungstenite
//! over rustls (`wss://`; plain `ws://` for the test fakes), waits for HELLO (op 10), sends
//! IDENTIFY (op 2) with the intents it needs, heartbeats (op 1) at the HELLO interval (the first
//! after a random fraction of it) and expects HEARTBEAT_ACK (op 11) before the next one, else the
//! connection is a zombie and is dropped. After a drop it connects to READY's
//! `resume_gateway_url` and sends RESUME (op 6) with the session id and the last sequence
//! number; RECONNECT (op 7) asks for the same; INVALID_SESSION (op 9) with `d: false` and the
//! close codes 4007/4009 start a new session; 4004 (bad token), 4010-4014 (shards, API version,
//! intents) are fatal to the session and retried only after a long pause. Failed connections back
//! off exponentially (1 s to 60 s, jittered).
//!
//! Dispatches (op 0) are handed to the tracker through [`Shared`]: the messages an event touched
//! (so an incremental poll re-reads just those) and a wake-up that asks the daemon for a poll now
//! when an event may start or end an issue. The bot token travels only in IDENTIFY and RESUME.

use std::collections::{HashMap, HashSet};
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde_json::{Value, json};
use tungstenite::Message;
use tungstenite::protocol::frame::coding::CloseCode;

use super::api::{DiscordApi, enc};
use crate::tracker::ws::{Socket, connect};

/// GUILDS | GUILD_MESSAGES | GUILD_MESSAGE_REACTIONS | MESSAGE_CONTENT (privileged).
pub const INTENTS: u64 = (1 << 0) | (1 << 9) | (1 << 10) | (1 << 15);
/// The message command a member uses to track a message.
pub const COMMAND_NAME: &str = "Track with svc";

/// How long one read waits, so the thread notices a stop and a due heartbeat.
const READ_SLICE: Duration = Duration::from_millis(250);
/// The pause after a fatal close (bad token, disallowed intents) before trying again.
const FATAL_PAUSE: Duration = Duration::from_secs(300);
/// How long a message whose reaction job failed waits before another.
pub const JOB_RETRY: Duration = Duration::from_secs(600);
use crate::tracker::ws::{REWAKE, backoff, jitter};

/// What the Gateway and the worker share with the tracker.
#[derive(Default)]
pub struct Shared {
    stop: AtomicBool,
    connected: AtomicBool,
    /// Counts READY dispatches: events between two polls of one epoch were all seen.
    epoch: AtomicU64,
    /// `(channel, message)` pairs events touched since the tracker last drained them.
    touched: Mutex<HashSet<(String, String)>>,
    /// Tracked source messages (message id to channel), kept by the tracker.
    tracked: Mutex<HashMap<String, String>>,
    /// Messages with a heal or acknowledgement queued (so polls do not queue it twice).
    pending: Mutex<HashSet<String>>,
    /// When a reaction job last failed per message (it is not retried for a while, so a
    /// missing permission does not log at every poll).
    failed: Mutex<HashMap<String, Instant>>,
    /// Wake-ups of the poller (repeated until a scan takes them).
    pub waker: crate::tracker::ws::LiveWake,
    commands_registered: AtomicBool,
}

impl Shared {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The current session's epoch while the Gateway is connected and identified.
    pub fn live_epoch(&self) -> Option<u64> {
        self.connected
            .load(Ordering::SeqCst)
            .then(|| self.epoch.load(Ordering::SeqCst))
    }

    fn touch(&self, channel: &str, message: &str) {
        self.touched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((channel.to_string(), message.to_string()));
    }

    pub fn drain_touched(&self) -> HashSet<(String, String)> {
        std::mem::take(&mut *self.touched.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn set_tracked(&self, tracked: HashMap<String, String>) {
        *self.tracked.lock().unwrap_or_else(|p| p.into_inner()) = tracked;
    }

    fn tracked_channel(&self, message: &str) -> Option<String> {
        self.tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(message)
            .cloned()
    }

    /// Marks `message` pending; false when it already was, or when its last job failed less
    /// than [`JOB_RETRY`] ago.
    pub fn begin(&self, message: &str) -> bool {
        if self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(message)
            .is_some_and(|t| t.elapsed() < JOB_RETRY)
        {
            return false;
        }
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(message.to_string())
    }

    fn end(&self, message: &str, ok: bool) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if ok {
            failed.remove(message);
        } else {
            failed.insert(message.to_string(), Instant::now());
        }
        drop(failed);
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(message);
    }
}

/// Who the background works for.
#[derive(Clone)]
pub struct Config {
    pub api: Arc<DiscordApi>,
    pub guild_id: Option<String>,
    pub channels: Vec<String>,
    pub bot_user_id: String,
    pub users: Vec<String>,
    pub marker_emoji: String,
}

impl Config {
    fn watched(&self, d: &Value) -> Option<String> {
        let channel = d["channel_id"].as_str()?;
        let guild_ok = match (&self.guild_id, d["guild_id"].as_str()) {
            (Some(want), Some(got)) => want == got,
            _ => true,
        };
        (guild_ok && self.channels.iter().any(|c| c == channel)).then(|| channel.to_string())
    }
}

/// A REST job for the worker thread.
pub enum Job {
    /// Reactions the bot should add and remove on a message.
    Reactions {
        channel: String,
        message: String,
        add: Vec<String>,
        remove: Vec<String>,
    },
    /// A message command invocation (`INTERACTION_CREATE`).
    Interaction(Value),
    /// Register the message command for the application (once per process).
    RegisterCommand { application_id: String },
}

/// Starts the Gateway and worker threads; they end once `shared` is stopped.
pub fn start(config: Config, shared: Arc<Shared>) -> Sender<Job> {
    let (tx, rx) = crossbeam_channel::unbounded();
    {
        let (config, shared) = (config.clone(), Arc::clone(&shared));
        let _ = std::thread::Builder::new()
            .name("chat-b-worker".into())
            .spawn(move || worker(config, shared, rx));
    }
    {
        let jobs = tx.clone();
        let _ = std::thread::Builder::new()
            .name("chat-b-gateway".into())
            .spawn(move || run(config, shared, jobs));
    }
    tx
}

/// A session to resume.
struct Session {
    id: String,
    seq: Option<u64>,
    resume_url: String,
}

/// How a connection ended.
enum End {
    Stopped,
    /// Reconnect and resume (a drop, RECONNECT, a zombie connection).
    Resume(String),
    /// Start a new session (INVALID_SESSION false, 4007, 4009).
    Reidentify(String),
    /// The Gateway refused the session as configured.
    Fatal(String),
}

fn with_query(url: &str) -> String {
    let base = url.split('?').next().unwrap_or(url).trim_end_matches('/');
    format!("{base}/?v=10&encoding=json")
}

/// Sleeps `d` in slices; false when stopped meanwhile.
fn pause(shared: &Shared, d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if shared.stopped() {
            return false;
        }
        std::thread::sleep(READ_SLICE.min(until.saturating_duration_since(Instant::now())));
    }
    !shared.stopped()
}

fn run(config: Config, shared: Arc<Shared>, jobs: Sender<Job>) {
    let mut session: Option<Session> = None;
    let mut failures: u32 = 0;
    let mut last_error = String::new();
    while !shared.stopped() {
        let url = match &session {
            Some(s) => s.resume_url.clone(),
            None => match config.api.get("/gateway/bot") {
                Ok(v) => match v["url"].as_str() {
                    Some(u) => with_query(u),
                    None => {
                        log::warn!("chat-b: GET /gateway/bot answered without a url");
                        failures += 1;
                        if !pause(&shared, backoff(failures)) {
                            return;
                        }
                        continue;
                    }
                },
                Err(e) => {
                    let e = crate::tracker::TrackerError::from(e).message;
                    if e != last_error {
                        log::warn!("chat-b: cannot reach the Gateway: {e}");
                        last_error = e;
                    }
                    failures += 1;
                    if !pause(&shared, backoff(failures)) {
                        return;
                    }
                    continue;
                }
            },
        };
        let mut was_live = false;
        let end = serve(&config, &shared, &jobs, &url, &mut session, &mut was_live);
        shared.connected.store(false, Ordering::SeqCst);
        if was_live {
            failures = 0;
        }
        let wait = match end {
            End::Stopped => return,
            End::Resume(why) => {
                log::info!("chat-b: Gateway connection dropped ({why}); resuming");
                if !was_live {
                    failures += 1;
                }
                if failures >= 5 {
                    // Resuming keeps failing: start over with a new session.
                    session = None;
                }
                backoff(failures)
            }
            End::Reidentify(why) => {
                log::info!("chat-b: Gateway session ended ({why}); identifying again");
                session = None;
                failures += 1;
                // Discord asks for a random 1-5 s wait before a new IDENTIFY.
                Duration::from_secs_f64(1.0 + 4.0 * jitter()).max(backoff(failures))
            }
            End::Fatal(why) => {
                log::error!("chat-b: the Gateway refused the bot: {why}; polling continues");
                session = None;
                FATAL_PAUSE
            }
        };
        if !pause(&shared, wait) {
            return;
        }
    }
}

fn send(ws: &mut Socket, v: &Value) -> Result<(), String> {
    ws.send(Message::text(v.to_string()))
        .map_err(|e| format!("send failed: {e}"))
}

fn close_end(code: u16, reason: &str) -> End {
    let why = format!("close code {code} {reason}").trim().to_string();
    match code {
        4004 => End::Fatal(format!(
            "{why}: authentication failed (check tracker.api_key or CHAT_B_BOT_TOKEN)"
        )),
        4013 | 4014 => End::Fatal(format!(
            "{why}: intents refused (enable the MESSAGE CONTENT privileged intent for the bot in the Developer Portal)"
        )),
        4010..=4012 => End::Fatal(why),
        4007 | 4009 => End::Reidentify(why),
        _ => End::Resume(why),
    }
}

fn serve(
    config: &Config,
    shared: &Shared,
    jobs: &Sender<Job>,
    url: &str,
    session: &mut Option<Session>,
    was_live: &mut bool,
) -> End {
    let (mut ws, ctl) = match connect(url) {
        Ok(c) => c,
        Err(e) => return End::Resume(e),
    };
    // HELLO.
    let interval = loop {
        match ws.read() {
            Ok(Message::Text(t)) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                if v["op"] == 10 {
                    break Duration::from_millis(
                        v["d"]["heartbeat_interval"].as_u64().unwrap_or(41_250),
                    );
                }
            }
            Ok(Message::Close(f)) => {
                return f.map_or(End::Resume("closed before HELLO".into()), |f| {
                    close_end(u16::from(f.code), &f.reason)
                });
            }
            Ok(_) => {}
            Err(e) => return End::Resume(format!("no HELLO: {e}")),
        }
    };
    let token = config.api.token().expose().to_string();
    let first = match session {
        Some(s) => json!({"op": 6, "d": {"token": token, "session_id": s.id, "seq": s.seq}}),
        None => json!({"op": 2, "d": {
            "token": token,
            "intents": INTENTS,
            "properties": {"os": std::env::consts::OS, "browser": "svc", "device": "svc"},
        }}),
    };
    if let Err(e) = send(&mut ws, &first) {
        return End::Resume(e);
    }
    if ctl.set_read_timeout(Some(READ_SLICE)).is_err() {
        return End::Resume("cannot set a read timeout".into());
    }
    let mut next_beat = Instant::now() + interval.mul_f64(jitter());
    let mut acked = true;
    loop {
        shared.waker.rewake();
        if shared.stopped() {
            let _ = ws.close(Some(tungstenite::protocol::CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            }));
            let _ = ws.flush();
            return End::Stopped;
        }
        if Instant::now() >= next_beat {
            if !acked {
                return End::Resume("no HEARTBEAT_ACK".into());
            }
            let seq = session.as_ref().and_then(|s| s.seq);
            if let Err(e) = send(&mut ws, &json!({"op": 1, "d": seq})) {
                return End::Resume(e);
            }
            acked = false;
            next_beat = Instant::now() + interval;
        }
        let text = match ws.read() {
            Ok(Message::Text(t)) => t,
            Ok(Message::Close(f)) => {
                return f.map_or(End::Resume("closed".into()), |f| {
                    close_end(u16::from(f.code), &f.reason)
                });
            }
            Ok(_) => continue,
            Err(tungstenite::Error::Io(e))
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                continue;
            }
            Err(e) => return End::Resume(e.to_string()),
        };
        let v: Value = match serde_json::from_str(text.as_str()) {
            Ok(v) => v,
            Err(_) => continue,
        };
        match v["op"].as_u64() {
            Some(0) => {
                if let (Some(s), Some(seq)) = (session.as_mut(), v["s"].as_u64()) {
                    s.seq = Some(seq);
                }
                let t = v["t"].as_str().unwrap_or_default();
                let d = &v["d"];
                match t {
                    "READY" => {
                        *session = Some(Session {
                            id: d["session_id"].as_str().unwrap_or_default().to_string(),
                            seq: v["s"].as_u64(),
                            resume_url: with_query(d["resume_gateway_url"].as_str().unwrap_or(url)),
                        });
                        shared.epoch.fetch_add(1, Ordering::SeqCst);
                        shared.connected.store(true, Ordering::SeqCst);
                        *was_live = true;
                        log::info!("chat-b: Gateway session ready");
                        if let Some(app) = d.pointer("/application/id").and_then(Value::as_str) {
                            if !shared.commands_registered.swap(true, Ordering::SeqCst) {
                                let _ = jobs.send(Job::RegisterCommand {
                                    application_id: app.to_string(),
                                });
                            }
                        }
                        // Whatever happened while svc was not connected: poll now.
                        shared.waker.wake();
                    }
                    "RESUMED" => {
                        shared.connected.store(true, Ordering::SeqCst);
                        *was_live = true;
                        log::info!("chat-b: Gateway session resumed");
                    }
                    _ => dispatch(config, shared, jobs, t, d),
                }
            }
            Some(1) => {
                let seq = session.as_ref().and_then(|s| s.seq);
                if let Err(e) = send(&mut ws, &json!({"op": 1, "d": seq})) {
                    return End::Resume(e);
                }
            }
            Some(7) => return End::Resume("RECONNECT requested".into()),
            Some(9) => {
                return if v["d"] == true {
                    End::Resume("INVALID_SESSION (resumable)".into())
                } else {
                    End::Reidentify("INVALID_SESSION".into())
                };
            }
            Some(11) => acked = true,
            _ => {}
        }
    }
}

/// Whether a message event names the bot (user mention) or any role (a managed-role mention
/// the tracker checks).
fn may_mention_bot(d: &Value, bot: &str) -> bool {
    d["mentions"]
        .as_array()
        .is_some_and(|m| m.iter().any(|u| u["id"] == bot))
        || d["mention_roles"].as_array().is_some_and(|r| !r.is_empty())
        || crate::tracker::chat::mentions_bot(d["content"].as_str().unwrap_or_default(), Some(bot))
}

/// Hands one dispatch to the tracker.
fn dispatch(config: &Config, shared: &Shared, jobs: &Sender<Job>, t: &str, d: &Value) {
    let bot = config.bot_user_id.as_str();
    match t {
        "MESSAGE_CREATE" | "MESSAGE_UPDATE" | "MESSAGE_DELETE" => {
            let message = d["id"].as_str().unwrap_or_default();
            if let Some(channel) = config.watched(d) {
                shared.touch(&channel, message);
                if may_mention_bot(d, bot) || shared.tracked_channel(message).is_some() {
                    shared.waker.wake();
                }
            } else if let Some(thread) = d["channel_id"].as_str() {
                // A message in the thread of a tracked message (the thread's id is the source
                // message's): the bot's status replies change the state, and a person's
                // new reply is steering or a command (an edit is neither).
                if let Some(channel) = shared.tracked_channel(thread) {
                    shared.touch(&channel, thread);
                    if t == "MESSAGE_CREATE"
                        || d.pointer("/author/id").and_then(Value::as_str) == Some(bot)
                    {
                        shared.waker.wake();
                    }
                }
            }
        }
        "MESSAGE_REACTION_ADD"
        | "MESSAGE_REACTION_REMOVE"
        | "MESSAGE_REACTION_REMOVE_ALL"
        | "MESSAGE_REACTION_REMOVE_EMOJI" => {
            let message = d["message_id"].as_str().unwrap_or_default();
            if let Some(channel) = config.watched(d) {
                shared.touch(&channel, message);
                let marker = d.pointer("/emoji/name").and_then(Value::as_str)
                    == Some(config.marker_emoji.as_str());
                if marker || shared.tracked_channel(message).is_some() {
                    shared.waker.wake();
                }
            }
        }
        // An application command (2) of the message kind (3).
        "INTERACTION_CREATE" if d["type"] == 2 && d.pointer("/data/type") == Some(&json!(3)) => {
            let _ = jobs.send(Job::Interaction(d.clone()));
        }
        _ => {}
    }
}

fn worker(config: Config, shared: Arc<Shared>, jobs: Receiver<Job>) {
    loop {
        let job = match jobs.recv_timeout(REWAKE) {
            Ok(j) => j,
            Err(RecvTimeoutError::Timeout) => {
                if shared.stopped() {
                    return;
                }
                shared.waker.rewake();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if shared.stopped() {
            return;
        }
        match job {
            Job::Reactions {
                channel,
                message,
                add,
                remove,
            } => {
                let mut ok = true;
                for (method, list) in [("DELETE", &remove), ("PUT", &add)] {
                    for emoji in list {
                        let path = format!(
                            "/channels/{channel}/messages/{message}/reactions/{}/@me",
                            enc(emoji)
                        );
                        if let Err(e) = config.api.call(method, &path, None) {
                            ok = false;
                            log::warn!(
                                "chat-b: reaction {emoji} on {channel}:{message} not mirrored (next try in {} min): {}",
                                JOB_RETRY.as_secs() / 60,
                                crate::tracker::TrackerError::from(e).message
                            );
                        }
                    }
                }
                shared.end(&message, ok);
            }
            Job::Interaction(d) => {
                // Discord wants the answer within 3 s: never queue it behind reaction jobs.
                let (config, shared) = (config.clone(), Arc::clone(&shared));
                let spawned = std::thread::Builder::new()
                    .name("chat-b-interaction".into())
                    .spawn(move || interaction(&config, &shared, &d));
                if let Err(e) = spawned {
                    log::warn!("chat-b: cannot answer a message command: {e}");
                }
            }
            Job::RegisterCommand { application_id } => {
                let Some(guild) = &config.guild_id else {
                    continue;
                };
                let path = format!("/applications/{application_id}/guilds/{guild}/commands");
                match config.api.call(
                    "POST",
                    &path,
                    Some(&json!({"name": COMMAND_NAME, "type": 3})),
                ) {
                    Ok(_) => log::info!("chat-b: message command {COMMAND_NAME:?} registered"),
                    Err(e) => log::warn!(
                        "chat-b: message command not registered (invite the bot with the applications.commands scope): {}",
                        crate::tracker::TrackerError::from(e).message
                    ),
                }
            }
        }
    }
}

/// "Track with svc" on a message: the bot adds its marker reaction (which tracks the message)
/// and answers the member privately.
fn interaction(config: &Config, shared: &Shared, d: &Value) {
    let (Some(id), Some(token)) = (d["id"].as_str(), d["token"].as_str()) else {
        return;
    };
    let user = d
        .pointer("/member/user/id")
        .or_else(|| d.pointer("/user/id"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let target = d
        .pointer("/data/target_id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let text = if d.pointer("/data/name").and_then(Value::as_str) != Some(COMMAND_NAME) {
        return;
    } else if config.watched(d).is_none() {
        "svc does not watch this channel.".to_string()
    } else if !config.users.is_empty() && !config.users.iter().any(|u| u == user) {
        "You are not on svc's requester list (tracker.users).".to_string()
    } else {
        let channel = d["channel_id"].as_str().unwrap_or_default();
        let path = format!(
            "/channels/{channel}/messages/{target}/reactions/{}/@me",
            enc(&config.marker_emoji)
        );
        match config.api.call("PUT", &path, None) {
            Ok(_) => {
                shared.touch(channel, target);
                shared.waker.wake();
                "Tracking this message: svc picks it up on its next poll.".to_string()
            }
            Err(e) => format!(
                "svc could not mark the message: {}",
                crate::tracker::TrackerError::from(e).message
            ),
        }
    };
    let path = format!("/interactions/{id}/{token}/callback");
    let body = json!({"type": 4, "data": {"content": text, "flags": 64, "allowed_mentions": {"parse": []}}});
    if let Err(e) = config.api.call("POST", &path, Some(&body)) {
        // The interaction token is in the path; name only the failure.
        let e = crate::tracker::TrackerError::from(e);
        log::warn!(
            "chat-b: the message command was not answered: {}",
            e.message.replace(token, "<token>")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reaction_jobs_are_queued_once_and_a_failure_waits() {
        let shared = Shared::default();
        assert!(shared.begin("1"));
        assert!(!shared.begin("1"), "already queued");
        shared.end("1", true);
        assert!(shared.begin("1"));
        shared.end("1", false);
        assert!(!shared.begin("1"), "failed a moment ago");
        assert!(shared.begin("2"), "other messages are not held");
        shared.touch("c", "1");
        shared.touch("c", "1");
        assert_eq!(shared.drain_touched().len(), 1);
        assert!(shared.drain_touched().is_empty());
    }

    #[test]
    fn intents_and_close_codes() {
        assert_eq!(INTENTS, 34305);
        assert!(matches!(close_end(4004, ""), End::Fatal(_)));
        assert!(matches!(close_end(4014, ""), End::Fatal(m) if m.contains("MESSAGE CONTENT")));
        assert!(matches!(close_end(4009, ""), End::Reidentify(_)));
        assert!(matches!(close_end(4000, ""), End::Resume(_)));
        assert_eq!(
            with_query("wss://gateway.discord.gg"),
            "wss://gateway.discord.gg/?v=10&encoding=json"
        );
        assert_eq!(
            with_query("ws://127.0.0.1:5/?v=9"),
            "ws://127.0.0.1:5/?v=10&encoding=json"
        );
        assert!(backoff(10) <= crate::tracker::ws::MAX_BACKOFF && backoff(0).is_zero());
    }
}
