//! `chat-a`: a Slack workspace where an @-mention of the bot becomes an issue, over the Slack Web
//! API (`https://slack.com/api/<method>`, bot token as Bearer, `{ok: false, error}` bodies,
//! `response_metadata.next_cursor` pagination, HTTP 429 with `Retry-After`).
//!
//! A thread root in a watched channel is an issue (id `<channel>:<ts>`) when it mentions the bot,
//! when a human reply in its thread does, or when it carries the bot's marker reaction (added by
//! every status update, so a thread stays tracked once svc worked on it). Discovery reads each
//! channel's recent history (`conversations.history`) and the threads that need it
//! (`conversations.replies`, cached until the thread's `latest_reply` moves); reply mentions are
//! discovered only within `reply_lookback_days`. The state is the bot's latest status reply, else
//! the reactions per `emoji_states`, else `Todo`.
//!
//! Without `bot_user_id` every call fails closed. The bot token only ever travels in the
//! `Authorization` header; no error, log line or snapshot carries it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

mod api;
pub mod doctor;
pub mod socket;
mod steer;
mod tools;

pub use api::{SlackApi, SlackFailure};

pub use super::chat::StateSource;
use super::chat::{self, ChatConfig, ChatIssueId, LastScan};
use super::{Issue, StateNames, Tracker, TrackerError, Wake};
use crate::config::ChatOptions;

/// The environment fallback of `bot_user_id`, named in fail-closed messages.
pub const BOT_USER_ID_VAR: &str = "CHAT_A_BOT_USER_ID";
/// The pack name, named in fail-closed messages.
pub const PACK: &str = "chat_a";
/// `event_type` of the message metadata on the bot's status replies.
pub const STATUS_EVENT: &str = "svc_status";
/// `event_type` of the message metadata on the bot's other thread replies (comments).
pub const COMMENT_EVENT: &str = "svc_comment";

/// Messages per history or replies page (Slack's recommended maximum is 200).
const PAGE: u64 = 200;
/// History pages read per channel and poll: the newest 2000 top-level messages.
const HISTORY_PAGES: usize = 10;
/// Pages of one thread's replies.
const REPLY_PAGES: usize = 20;

/// A Slack `ts` (`"1700000000.000100"`) as seconds.
fn ts_secs(ts: &str) -> Option<f64> {
    ts.parse::<f64>().ok()
}

use crate::time::unix_ms as now_ms;

/// A Slack `ts` as an exact number (microseconds) for ordering; 0 when it is not one.
fn ts_order(ts: &str) -> u128 {
    let (secs, frac) = ts.split_once('.').unwrap_or((ts, ""));
    let frac = format!("{frac:0<6}");
    match (
        secs.parse::<u128>(),
        frac.get(..6).and_then(|f| f.parse::<u128>().ok()),
    ) {
        (Ok(s), Some(f)) => s
            .checked_mul(1_000_000)
            .and_then(|n| n.checked_add(f))
            .unwrap_or(0),
        _ => 0,
    }
}

/// A Slack `ts` as an RFC 3339 timestamp.
fn ts_rfc3339(ts: &str) -> Option<String> {
    let secs = ts_secs(ts)?;
    // Finite, non-negative, and no later than RFC 3339's last second.
    let last = Duration::from_millis(crate::time::LAST_MS);
    let d = crate::tracker::http::seconds_f64(secs, last)?;
    Some(crate::time::rfc3339_seconds(UNIX_EPOCH + d))
}

fn text_of(m: &Value) -> &str {
    m["text"].as_str().unwrap_or_default()
}

fn ts_of(m: &Value) -> &str {
    m["ts"].as_str().unwrap_or_default()
}

fn reaction_names(m: &Value) -> Vec<&str> {
    m["reactions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str())
        .collect()
}

/// Whether `user` reacted to `m` with `name`.
fn reacted(m: &Value, name: &str, user: &str) -> bool {
    m["reactions"].as_array().into_iter().flatten().any(|r| {
        r["name"] == name
            && r["users"]
                .as_array()
                .is_some_and(|u| u.iter().any(|u| u == user))
    })
}

/// Whether a bot or an integration posted `m`.
fn is_bot_message(m: &Value) -> bool {
    m.get("bot_id").is_some_and(|b| !b.is_null()) || m["subtype"] == "bot_message"
}

/// Whether a message is a thread root (or an unthreaded message).
fn is_root(m: &Value) -> bool {
    m["thread_ts"]
        .as_str()
        .is_none_or(|t| t == ts_of(m) || t.is_empty())
        && m["subtype"] != "thread_broadcast"
}

/// A compact message for tool results.
fn message_json(m: &Value) -> Value {
    let mut out = json!({"ts": m["ts"], "user": m["user"], "text": m["text"]});
    for key in ["thread_ts", "reply_count", "bot_id", "subtype"] {
        if let Some(v) = m.get(key).filter(|v| !v.is_null()) {
            out[key] = v.clone();
        }
    }
    out
}

fn reactions_json(m: &Value) -> Value {
    let list: Vec<Value> = m["reactions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| json!({"name": r["name"], "count": r["count"], "users": r["users"]}))
        .collect();
    Value::Array(list)
}

/// Escapes the three characters Slack's message formatting reserves, so text svc posts cannot
/// mention anyone (or the bot itself) or ping a channel.
pub fn escape_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One thread: its root and its replies (oldest first), in a channel.
#[derive(Clone, Debug)]
pub struct Thread {
    pub channel: String,
    pub root: Value,
    pub replies: Vec<Value>,
}

/// A thread's replies as read when its `latest_reply` was `latest_reply`.
struct CachedReplies {
    latest_reply: String,
    replies: Vec<Value>,
    /// The scan that last used it.
    scan: u64,
}

/// How long permalinks wait after a failed `auth.test` before asking again.
const TEAM_URL_RETRY: Duration = Duration::from_secs(60);

pub struct ChatA {
    api: SlackApi,
    config: ChatConfig,
    /// Who may request and steer; empty: any person (never a bot).
    users: Vec<String>,
    reply_lookback: Duration,
    /// The workspace URL from `auth.test`, for permalinks (`None` until known).
    team_url: Mutex<Option<String>>,
    /// When `auth.test` last failed: issues go without a URL for a while instead of asking again
    /// for every issue.
    team_url_failed_at: Mutex<Option<Instant>>,
    /// Thread replies by `<channel>:<ts>`, for every thread a scan read (tracked or not).
    threads: Mutex<HashMap<String, CachedReplies>>,
    /// Counts scans; a cached thread the latest scan did not touch is forgotten.
    scan_generation: AtomicU64,
    last_scan: LastScan,
    /// The tracked threads of the last scan, and when it started (Unix ms), for steering.
    last_tracked: Mutex<(u64, Vec<Thread>)>,
    /// People's names (`users.info`) by user id, for steering authors.
    names: Mutex<HashMap<String, String>>,
    /// Asks the daemon for a poll now (set by [`Tracker::attach`]).
    wake: Mutex<Option<Wake>>,
    /// The Socket Mode client, with an app token: what it needs, and once started by the
    /// daemon's poller ([`Tracker::attach`]), what it shares.
    socket_options: Option<(String, crate::config::Secret)>,
    socket: OnceLock<Option<Arc<socket::Shared>>>,
}

impl Drop for ChatA {
    fn drop(&mut self) {
        if let Some(Some(s)) = self.socket.get() {
            s.stop();
        }
    }
}

impl ChatA {
    pub fn new(opts: &ChatOptions, states: StateNames) -> ChatA {
        ChatA {
            api: SlackApi::new(&opts.endpoint, opts.api_key.clone()),
            config: ChatConfig::new(opts, states, PACK, BOT_USER_ID_VAR),
            // Too long to count is as good as no bound.
            reply_lookback: Duration::try_from_secs_f64(opts.lookback_days * 86_400.0).unwrap_or(
                if opts.lookback_days > 0.0 {
                    Duration::MAX
                } else {
                    Duration::ZERO
                },
            ),
            team_url: Mutex::new(None),
            team_url_failed_at: Mutex::new(None),
            threads: Mutex::new(HashMap::new()),
            scan_generation: AtomicU64::new(0),
            last_scan: LastScan::default(),
            users: opts.users.clone(),
            last_tracked: Mutex::default(),
            names: Mutex::default(),
            wake: Mutex::default(),
            socket_options: (!opts.app_token.is_empty())
                .then(|| (opts.endpoint.clone(), opts.app_token.clone())),
            socket: OnceLock::new(),
        }
    }

    pub fn api(&self) -> &SlackApi {
        &self.api
    }

    /// `auth.test`: who the token is (and the workspace URL, kept for permalinks).
    pub fn auth_test(&self) -> Result<Value, TrackerError> {
        let me = self.api.post("auth.test", &json!({}))?;
        if let Some(url) = me["url"].as_str() {
            *self.team_url.lock().unwrap_or_else(|p| p.into_inner()) = Some(url.to_string());
        }
        Ok(me)
    }

    /// A permalink built like Slack's own (`<workspace>/archives/<channel>/p<ts digits>`), once
    /// `auth.test` told the workspace URL; `None` when it cannot be learnt.
    fn permalink(&self, channel: &str, ts: &str) -> Option<String> {
        let known = self
            .team_url
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let base = match known {
            Some(u) => u,
            None => {
                let mut failed = self
                    .team_url_failed_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if failed.is_some_and(|at| at.elapsed() < TEAM_URL_RETRY) {
                    return None;
                }
                match self.auth_test() {
                    Ok(me) => me["url"].as_str()?.to_string(),
                    Err(_) => {
                        *failed = Some(Instant::now());
                        return None;
                    }
                }
            }
        };
        Some(format!(
            "{}/archives/{channel}/p{}",
            base.trim_end_matches('/'),
            ts.replace('.', "")
        ))
    }

    /// Every message of a thread (root first), or `None` when Slack knows no such thread.
    fn fetch_thread(&self, channel: &str, ts: &str) -> Result<Option<Vec<Value>>, TrackerError> {
        match self.api.paged(
            "conversations.replies",
            &[
                ("channel", channel),
                ("ts", ts),
                ("limit", &PAGE.to_string()),
                ("include_all_metadata", "true"),
            ],
            "messages",
            REPLY_PAGES,
        ) {
            Ok(messages) => Ok(Some(messages)),
            Err(e) if matches!(e.code(), Some("thread_not_found" | "message_not_found")) => {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The thread rooted at `id`, read now; `None` when the message is gone or is not a root.
    pub fn thread(&self, id: &ChatIssueId) -> Result<Option<Thread>, TrackerError> {
        let Some(mut messages) = self.fetch_thread(&id.channel, &id.message)? else {
            return Ok(None);
        };
        if messages.is_empty() || ts_of(&messages[0]) != id.message || !is_root(&messages[0]) {
            return Ok(None);
        }
        let root = messages.remove(0);
        Ok(Some(Thread {
            channel: id.channel.clone(),
            root,
            replies: messages,
        }))
    }

    /// The thread of a history root: its replies from the cache while its `latest_reply` holds.
    fn thread_of_root(&self, channel: &str, root: Value) -> Result<Thread, TrackerError> {
        let reply_count = root["reply_count"].as_u64().unwrap_or(0);
        if reply_count == 0 {
            return Ok(Thread {
                channel: channel.to_string(),
                root,
                replies: Vec::new(),
            });
        }
        let key = format!("{channel}:{}", ts_of(&root));
        let latest = root["latest_reply"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let generation = self.scan_generation.load(Ordering::SeqCst);
        let cached = self
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&key)
            .filter(|c| !latest.is_empty() && c.latest_reply == latest)
            .map(|c| {
                c.scan = generation;
                c.replies.clone()
            });
        let replies = match cached {
            Some(r) => r,
            None => {
                let mut messages = self
                    .fetch_thread(channel, ts_of(&root))?
                    .unwrap_or_default();
                if !messages.is_empty() {
                    messages.remove(0);
                }
                self.threads
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(
                        key,
                        CachedReplies {
                            latest_reply: latest,
                            replies: messages.clone(),
                            scan: generation,
                        },
                    );
                messages
            }
        };
        Ok(Thread {
            channel: channel.to_string(),
            root,
            replies,
        })
    }

    /// Whether `m` was written by a person who may ask svc for work and steer it: not the bot,
    /// not another bot or integration (`bot_id`, `bot_message`), on `users` when it is set.
    fn by_allowed_person(&self, m: &Value, bot: &str) -> bool {
        let user = m["user"].as_str().unwrap_or_default();
        !user.is_empty()
            && user != bot
            && !is_bot_message(m)
            && (self.users.is_empty() || self.users.iter().any(|u| u == user))
    }

    /// Whether a person on `users` (anyone when it is empty; never a bot) mentions the bot in `m`.
    fn human_mention(&self, m: &Value, bot: &str) -> bool {
        self.by_allowed_person(m, bot) && chat::mentions_bot(text_of(m), Some(bot))
    }

    /// Whether the thread is an issue: its root mentions the bot, it carries the bot's marker
    /// reaction, or a human reply mentions the bot (one posted after `reply_cutoff`, when given).
    pub fn tracked(&self, thread: &Thread, bot: &str, reply_cutoff: Option<f64>) -> bool {
        self.human_mention(&thread.root, bot)
            || reacted(&thread.root, &self.config.marker_emoji, bot)
            || thread.replies.iter().any(|r| {
                self.human_mention(r, bot)
                    && reply_cutoff.is_none_or(|c| ts_secs(ts_of(r)).is_some_and(|t| t >= c))
            })
    }

    /// The state the bot's latest status reply names.
    fn status_reply(&self, thread: &Thread, bot: &str) -> Option<String> {
        thread
            .replies
            .iter()
            .rev()
            .filter(|r| {
                r["user"] == bot && r.pointer("/metadata/event_type") != Some(&json!(COMMENT_EVENT))
            })
            .find_map(|r| {
                let meta = &r["metadata"];
                if meta["event_type"] == STATUS_EVENT {
                    if let Some(s) = meta
                        .pointer("/event_payload/status")
                        .and_then(Value::as_str)
                    {
                        return Some(s.to_string());
                    }
                }
                chat::parse_status_text(text_of(r))
            })
    }

    /// The thread's state and where it came from.
    pub fn thread_state(&self, thread: &Thread, bot: &str) -> (String, StateSource) {
        self.config
            .state(self.status_reply(thread, bot), reaction_names(&thread.root))
    }

    /// The human messages of a thread that speak to the bot: the root and reply mentions.
    fn request_texts(&self, thread: &Thread, bot: &str) -> Vec<String> {
        let mut out = vec![chat::strip_bot_mention(text_of(&thread.root), bot)];
        out.extend(
            thread
                .replies
                .iter()
                .filter(|r| self.human_mention(r, bot))
                .map(|r| chat::strip_bot_mention(text_of(r), bot)),
        );
        out.retain(|t| !t.is_empty());
        out
    }

    /// Labels from the thread: `#tags` in the messages that speak to the bot, and reactions on
    /// the root other than the state reactions and the marker (a `route-backend` reaction or a
    /// `#route-backend` tag routes the issue with the shipped prefix `route-`).
    fn labels(&self, thread: &Thread, bot: &str) -> Vec<String> {
        let mut labels: Vec<String> = Vec::new();
        let mut add = |l: String| {
            if !labels.contains(&l) {
                labels.push(l);
            }
        };
        for text in self.request_texts(thread, bot) {
            chat::hashtags(&text).into_iter().for_each(&mut add);
        }
        for r in reaction_names(&thread.root) {
            if self.config.emoji.state_of(r).is_none() && r != self.config.marker_emoji {
                add(r.to_string());
            }
        }
        labels
    }

    /// The normalized issue of a tracked thread.
    pub fn issue(&self, thread: &Thread, bot: &str) -> Issue {
        let ts = ts_of(&thread.root);
        let id = ChatIssueId {
            channel: thread.channel.clone(),
            message: ts.to_string(),
        }
        .render();
        let texts = self.request_texts(thread, bot);
        let description = texts.join("\n\n");
        let (state, _) = self.thread_state(thread, bot);
        let updated = thread
            .replies
            .last()
            .map(ts_of)
            .or_else(|| thread.root["latest_reply"].as_str())
            .unwrap_or(ts);
        Issue {
            title: texts
                .iter()
                .find_map(|t| chat::title_from(t))
                .unwrap_or_else(|| id.clone()),
            identifier: id.clone(),
            id,
            description: (!description.is_empty()).then_some(description),
            state_type: Some(self.config.states.state_type(&state).to_string()),
            state,
            labels: self.labels(thread, bot),
            url: self.permalink(&thread.channel, ts),
            created_at: ts_rfc3339(ts),
            updated_at: ts_rfc3339(updated),
            priority: None,
            blocked_by: Vec::new(),
        }
    }

    /// The tracked threads of a channel's recent history (reply mentions within the lookback).
    pub fn scan_channel(&self, channel: &str, bot: &str) -> Result<Vec<Thread>, TrackerError> {
        let history = self.api.paged(
            "conversations.history",
            &[("channel", channel), ("limit", &PAGE.to_string())],
            "messages",
            HISTORY_PAGES,
        )?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let cutoff = now - self.reply_lookback.as_secs_f64();
        let mut out = Vec::new();
        for root in history.into_iter().filter(is_root) {
            let direct =
                self.human_mention(&root, bot) || reacted(&root, &self.config.marker_emoji, bot);
            let recent_replies = root["latest_reply"]
                .as_str()
                .and_then(ts_secs)
                .is_some_and(|t| t >= cutoff);
            if !direct && !recent_replies {
                continue;
            }
            let thread = self.thread_of_root(channel, root)?;
            if self.tracked(&thread, bot, Some(cutoff)) {
                out.push(thread);
            }
        }
        Ok(out)
    }

    /// Every tracked issue of the watched channels, whatever its state.
    fn scan(&self) -> Result<Vec<Issue>, TrackerError> {
        let bot = self.config.bot_for_tracker()?;
        if let Some(Some(s)) = self.socket.get() {
            s.waker.take();
        }
        let generation = self.scan_generation.fetch_add(1, Ordering::SeqCst) + 1;
        let started = now_ms();
        let mut issues = Vec::new();
        let mut tracked = Vec::new();
        for channel in &self.config.channels {
            for thread in self.scan_channel(channel, bot)? {
                issues.push(self.issue(&thread, bot));
                tracked.push(thread);
            }
        }
        *self.last_tracked.lock().unwrap_or_else(|p| p.into_inner()) = (started, tracked);
        // Forget threads that left the window.
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, c| c.scan == generation);
        self.last_scan.store(&issues);
        Ok(issues)
    }
}

impl Tracker for ChatA {
    fn fetch_candidates(&self) -> Result<Vec<Issue>, TrackerError> {
        Ok(self.config.active(self.scan()?))
    }

    fn fetch_states_by_ids(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        let bot = self.config.bot_for_tracker()?;
        let mut out = Vec::new();
        for raw in ids {
            let Ok(id) = self.config.watched(raw) else {
                continue;
            };
            if let Some(thread) = self.thread(&id)? {
                if self.tracked(&thread, bot, None) {
                    out.push(self.issue(&thread, bot));
                }
            }
        }
        Ok(out)
    }

    fn fetch_terminal(&self) -> Result<Vec<Issue>, TrackerError> {
        Ok(self.config.terminal(self.last_scan.recent(|| self.scan())?))
    }

    fn rate_limits(&self) -> Option<Value> {
        self.api.rate_limits()
    }

    /// Keeps the daemon's wake-up (commands ask for a poll) and, with an app token, starts
    /// Socket Mode once.
    fn attach(&self, wake: &Wake) {
        {
            let mut w = self.wake.lock().unwrap_or_else(|p| p.into_inner());
            if w.is_none() {
                *w = Some(Arc::clone(wake));
            }
        }
        let started = self.socket.get_or_init(|| {
            let (endpoint, token) = self.socket_options.clone()?;
            self.config.bot_user_id.as_ref()?;
            let shared = Arc::new(socket::Shared::default());
            socket::start(
                socket::Config {
                    api: SlackApi::new(&endpoint, token),
                    channels: self.config.channels.clone(),
                },
                Arc::clone(&shared),
            );
            Some(shared)
        });
        if let Some(s) = started {
            s.waker.set(wake);
        }
    }

    fn steering_source(&self) -> Option<String> {
        Some(format!(
            "chat-a:{}",
            self.config.bot_user_id.as_deref().unwrap_or_default()
        ))
    }

    /// Replies in tracked threads (see [`steer`]). A thread's window starts at the newest reply the poll's
    /// scan read (before it could dispatch the thread), never at this read, so `polled_at` is
    /// not needed.
    fn steering(
        &self,
        issues: &[Issue],
        cursor: Option<&str>,
        _polled_at: std::time::SystemTime,
    ) -> Result<crate::steering::Batch, TrackerError> {
        self.steering_batch(issues, cursor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use crate::tracker::chat::ChatTools;

    fn tracker() -> ChatA {
        let opts = ChatOptions {
            guild_id: None,
            channels: vec!["C1".into()],
            bot_user_id: Some("UBOT".into()),
            users: vec![],
            api_key: Secret::new(""),
            app_token: Secret::new(""),
            endpoint: "http://127.0.0.1:9".into(),
            emoji_states: chat::emoji_map(&[
                ("eyes", "In Progress"),
                ("white_check_mark", "Done"),
                ("x", "Cancelled"),
            ]),
            marker_emoji: "robot_face".into(),
            lookback_days: 2.0,
        };
        let t = ChatA::new(&opts, chat::test_states());
        *t.team_url.lock().unwrap() = Some("https://acme.slack.com/".into());
        t
    }

    fn thread(root: Value, replies: Vec<Value>) -> Thread {
        Thread {
            channel: "C1".into(),
            root,
            replies,
        }
    }

    #[test]
    fn a_thread_becomes_an_issue_with_its_derived_state_and_labels() {
        let t = tracker();
        let th = thread(
            json!({"ts": "1700000000.000100", "user": "UHUMAN", "text": "<@UBOT> fix the login page #route-backend", "reactions": [{"name": "eyes", "users": ["UHUMAN"], "count": 1}, {"name": "bug", "users": ["U2"], "count": 1}]}),
            vec![],
        );
        let issue = t.issue(&th, "UBOT");
        assert_eq!(issue.id, "C1:1700000000.000100");
        assert_eq!(issue.title, "fix the login page #route-backend");
        assert_eq!(issue.state, "In Progress", "a mapped reaction");
        assert_eq!(issue.labels, ["route-backend", "bug"]);
        assert_eq!(
            issue.url.as_deref(),
            Some("https://acme.slack.com/archives/C1/p1700000000000100")
        );
        assert_eq!(issue.created_at.as_deref(), Some("2023-11-14T22:13:20Z"));
        // The bot's status reply outranks reactions; a human's look-alike does not count.
        let th = thread(
            th.root.clone(),
            vec![
                json!({"ts": "1700000001.0", "user": "UBOT", "text": "Status: Done", "metadata": {"event_type": STATUS_EVENT, "event_payload": {"status": "Done"}}}),
                json!({"ts": "1700000002.0", "user": "UHUMAN", "text": "Status: Todo"}),
            ],
        );
        assert_eq!(t.issue(&th, "UBOT").state, "Done");
        assert_eq!(t.thread_state(&th, "UBOT").1, StateSource::StatusReply);
    }

    #[test]
    fn only_human_mentions_of_the_bot_track_a_thread() {
        let t = tracker();
        let root = json!({"ts": "100.0", "user": "UHUMAN", "text": "<@UOTHER> can you look?"});
        assert!(!t.tracked(&thread(root.clone(), vec![]), "UBOT", None));
        let bot_self = json!({"ts": "101.0", "user": "UBOT", "text": "&lt;@UBOT&gt; <@UBOT>"});
        assert!(!t.tracked(&thread(root.clone(), vec![bot_self]), "UBOT", None));
        let reply = json!({"ts": "102.0", "user": "UHUMAN", "text": "<@UBOT> take this one"});
        let th = thread(root.clone(), vec![reply]);
        assert!(t.tracked(&th, "UBOT", None));
        assert!(t.tracked(&th, "UBOT", Some(102.0)));
        assert!(!t.tracked(&th, "UBOT", Some(103.0)), "outside the lookback");
        let marked = json!({"ts": "100.0", "user": "UHUMAN", "text": "old", "reactions": [{"name": "robot_face", "users": ["UBOT"], "count": 1}]});
        assert!(t.tracked(&thread(marked, vec![]), "UBOT", Some(1e12)));
        assert_eq!(
            escape_text("<@UBOT> & <!channel>"),
            "&lt;@UBOT&gt; &amp; &lt;!channel&gt;"
        );
    }

    #[test]
    fn without_a_bot_user_id_the_tracker_fails_closed() {
        let mut opts_tracker = tracker();
        opts_tracker.config.bot_user_id = None;
        let e = opts_tracker.fetch_candidates().unwrap_err();
        assert!(e.message.contains("tracker.bot_user_id"), "{e}");
        assert!(
            opts_tracker
                .fetch_states_by_ids(&["C1:1.0".into()])
                .is_err()
        );
        assert!(
            opts_tracker
                .comment("C1:1.0", "x")
                .unwrap_err()
                .contains("unavailable")
        );
    }
}
