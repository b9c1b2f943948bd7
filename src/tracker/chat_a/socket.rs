//! chat-a's live feed: a Slack Socket Mode client on its own thread, started when the workflow
//! sets an app-level token (`app_token`, env `CHAT_A_APP_TOKEN`).
//!
//! It asks `apps.connections.open` (with the app token as Bearer) for a WebSocket URL, connects
//! (tungstenite over rustls), waits for `hello`, and acknowledges every envelope at once by
//! sending back its `envelope_id`. An Events API envelope about a watched channel (a message,
//! a thread reply, an edit or deletion, a mention, a reaction) wakes the daemon for a poll,
//! which finds what changed: new mentions start runs and replies steer running agents within a
//! poll of being written. A `disconnect` message (Slack's `warning` and `refresh_requested`
//! before it recycles a connection) opens a new connection at once; a dropped or silent
//! connection reconnects with backoff (1 s to 60 s, jittered); `link_disabled` and a refused
//! token (Socket Mode off, a wrong token type) wait five minutes. Polling stays the safety net:
//! without Socket Mode, or while it is down, polls find the same things.
//!
//! The app token travels only in the `apps.connections.open` request; no log line carries it or
//! the connection URL (whose ticket is a credential for that connection).

use crate::tracker::ws::backoff;
use std::io::ErrorKind;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::Message;
use tungstenite::protocol::frame::coding::CloseCode;

use super::api::SlackApi;
use crate::tracker::ws::{Socket, connect};

/// How long one read waits, so the thread notices a stop and a wake-up to repeat.
const READ_SLICE: Duration = Duration::from_millis(250);
/// The pause after Slack refused Socket Mode (bad token, Socket Mode disabled).
const FATAL_PAUSE: Duration = Duration::from_secs(300);
/// A ping after this long without any frame; the connection is dropped after twice as long.
const QUIET: Duration = Duration::from_secs(30);
/// How long svc waits for `hello` after connecting.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// What the Socket Mode thread shares with the tracker.
#[derive(Default)]
pub struct Shared {
    stop: AtomicBool,
    connected: AtomicBool,
    /// Wake-ups of the poller (repeated until a scan takes them).
    pub waker: crate::tracker::ws::LiveWake,
}

impl Shared {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Whether a Socket Mode connection is live (after `hello`).
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }
}

/// Whom the thread works for.
pub struct Config {
    /// `apps.connections.open` with the app-level token.
    pub api: SlackApi,
    pub channels: Vec<String>,
}

/// Starts the Socket Mode thread; it ends once `shared` is stopped.
pub fn start(config: Config, shared: Arc<Shared>) {
    let spawned = std::thread::Builder::new()
        .name("chat-a-socket".into())
        .spawn(move || run(&config, &shared));
    if let Err(e) = spawned {
        log::warn!("chat-a: Socket Mode not started: {e}; polling continues");
    }
}

/// How a connection ended.
#[derive(Debug, PartialEq)]
enum End {
    Stopped,
    /// Slack asked for a new connection (`disconnect`): open one now.
    Refresh(String),
    /// The connection failed or dropped: open another after the backoff.
    Dropped(String),
    /// Slack refused Socket Mode as configured.
    Fatal(String),
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

/// Whether an `apps.connections.open` failure is Slack refusing the token or the app (worth
/// the long pause), not a passing one.
fn refused(code: Option<&str>) -> bool {
    matches!(
        code,
        Some(
            "not_authed"
                | "invalid_auth"
                | "not_allowed_token_type"
                | "account_inactive"
                | "token_revoked"
                | "token_expired"
                | "missing_scope"
        )
    )
}

fn run(config: &Config, shared: &Shared) {
    let mut failures: u32 = 0;
    let mut last_error = String::new();
    while !shared.stopped() {
        let end = match config.api.post("apps.connections.open", &json!({})) {
            Ok(v) => match v["url"].as_str() {
                Some(url) => serve(config, shared, url),
                None => End::Dropped("apps.connections.open answered without a url".into()),
            },
            Err(e) if refused(e.code()) => {
                let code = e.code().unwrap_or_default().to_string();
                End::Fatal(format!(
                    "apps.connections.open failed: {code} (tracker.app_token or CHAT_A_APP_TOKEN must be an app-level token, xapp-, with connections:write, and Socket Mode enabled for the app)"
                ))
            }
            Err(e) => End::Dropped(crate::tracker::TrackerError::from(e).message),
        };
        let was_live = shared.connected.swap(false, Ordering::SeqCst);
        if was_live {
            failures = 0;
            last_error.clear();
        }
        let wait = match end {
            End::Stopped => return,
            End::Refresh(why) => {
                log::info!("chat-a: Socket Mode connection recycled ({why}); reconnecting");
                Duration::ZERO
            }
            End::Dropped(why) => {
                if why != last_error {
                    log::warn!("chat-a: Socket Mode connection lost ({why}); reconnecting");
                    last_error = why;
                }
                failures += 1;
                backoff(failures)
            }
            End::Fatal(why) => {
                log::error!("chat-a: Slack refused Socket Mode: {why}; polling continues");
                FATAL_PAUSE
            }
        };
        if !pause(shared, wait) {
            return;
        }
    }
}

fn send(ws: &mut Socket, v: &Value) -> Result<(), String> {
    ws.send(Message::text(v.to_string()))
        .map_err(|e| format!("send failed: {e}"))
}

/// One connection: `hello`, then envelopes (each acknowledged) until it ends.
fn serve(config: &Config, shared: &Shared, url: &str) -> End {
    let (mut ws, ctl) = match connect(url) {
        Ok(c) => c,
        // The URL carries the connection's ticket: name the failure only.
        Err(e) => return End::Dropped(e.replace(url, "<socket url>")),
    };
    if ctl.set_read_timeout(Some(READ_SLICE)).is_err() {
        return End::Dropped("cannot set a read timeout".into());
    }
    let opened = Instant::now();
    let mut last_frame = Instant::now();
    let mut pinged = false;
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
        if !shared.connected() && opened.elapsed() >= HELLO_TIMEOUT {
            return End::Dropped("no hello".into());
        }
        let quiet = last_frame.elapsed();
        if quiet >= QUIET * 2 {
            return End::Dropped("the connection went silent".into());
        }
        if quiet >= QUIET && !pinged {
            if let Err(e) = ws.send(Message::Ping(Vec::new().into())) {
                return End::Dropped(e.to_string());
            }
            pinged = true;
        }
        let text = match ws.read() {
            Ok(Message::Text(t)) => t,
            Ok(Message::Close(f)) => {
                let why = f.map_or("closed".to_string(), |f| {
                    format!("closed with {} {}", u16::from(f.code), f.reason)
                });
                return End::Dropped(why.trim().to_string());
            }
            Ok(_) => {
                // Pings (answered by tungstenite), pongs.
                last_frame = Instant::now();
                pinged = false;
                continue;
            }
            Err(tungstenite::Error::Io(e))
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                continue;
            }
            Err(e) => return End::Dropped(e.to_string()),
        };
        last_frame = Instant::now();
        pinged = false;
        let v: Value = match serde_json::from_str(text.as_str()) {
            Ok(v) => v,
            Err(_) => continue,
        };
        // Every envelope is acknowledged first, whatever it holds (Slack retries those that
        // are not).
        if let Some(id) = v["envelope_id"].as_str()
            && let Err(e) = send(&mut ws, &json!({"envelope_id": id}))
        {
            return End::Dropped(e);
        }
        match v["type"].as_str() {
            Some("hello") => {
                shared.connected.store(true, Ordering::SeqCst);
                log::info!("chat-a: Socket Mode connected");
                // Whatever happened while svc was not connected: poll now.
                shared.waker.wake();
            }
            Some("disconnect") => {
                let reason = v["reason"].as_str().unwrap_or("disconnect").to_string();
                return if reason == "link_disabled" {
                    End::Fatal("Socket Mode was disabled for the app (link_disabled)".into())
                } else {
                    End::Refresh(reason)
                };
            }
            Some("events_api") if wakes(config, &v["payload"]["event"]) => shared.waker.wake(),
            _ => {}
        }
    }
}

/// Whether an Events API event may change what a poll finds: a message event (new, a thread
/// reply, an edit, a deletion), a mention or a reaction in a watched channel.
fn wakes(config: &Config, event: &Value) -> bool {
    let channel = match event["type"].as_str() {
        Some("message" | "app_mention") => event["channel"].as_str(),
        Some("reaction_added" | "reaction_removed") => {
            event.pointer("/item/channel").and_then(Value::as_str)
        }
        _ => None,
    };
    channel.is_some_and(|c| config.channels.iter().any(|w| w == c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_in_watched_channels_wake_a_poll() {
        let config = Config {
            api: SlackApi::new("http://127.0.0.1:9", crate::config::Secret::new("")),
            channels: vec!["C1".into()],
        };
        for (event, wake) in [
            (
                json!({"type": "message", "channel": "C1", "ts": "1.0", "thread_ts": "0.5"}),
                true,
            ),
            (
                json!({"type": "message", "subtype": "message_changed", "channel": "C1"}),
                true,
            ),
            (json!({"type": "app_mention", "channel": "C1"}), true),
            (
                json!({"type": "reaction_added", "item": {"type": "message", "channel": "C1"}}),
                true,
            ),
            (json!({"type": "message", "channel": "C2"}), false),
            (json!({"type": "team_join"}), false),
        ] {
            assert_eq!(wakes(&config, &event), wake, "{event}");
        }
        assert!(refused(Some("not_allowed_token_type")));
        assert!(!refused(Some("ratelimited")) && !refused(None));
        assert!(backoff(10) <= crate::tracker::ws::MAX_BACKOFF && backoff(0).is_zero());
    }

    #[test]
    fn a_repeated_wake_up_waits_for_a_scan() {
        let shared = Shared::default();
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&n);
        let wake: crate::tracker::Wake = Arc::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        shared.waker.set(&wake);
        shared.waker.wake();
        assert_eq!(n.load(Ordering::SeqCst), 1);
        shared.waker.rewake();
        assert_eq!(n.load(Ordering::SeqCst), 1, "not yet due");
        *shared.waker.last.lock().unwrap() = Some(Instant::now() - crate::tracker::ws::REWAKE);
        shared.waker.rewake();
        assert_eq!(n.load(Ordering::SeqCst), 2, "no scan took it: repeated");
        shared.waker.take();
        *shared.waker.last.lock().unwrap() = Some(Instant::now() - crate::tracker::ws::REWAKE);
        shared.waker.rewake();
        assert_eq!(n.load(Ordering::SeqCst), 2, "a scan took it");
    }
}
