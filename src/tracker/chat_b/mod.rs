//! `chat-b`: a Discord guild where a mention of the bot becomes an issue, over the Discord REST
//! API v10 (`Authorization: Bot <token>`, `{code, message}` error bodies, per-route rate-limit
//! buckets, 429 with `retry_after`) and the Gateway (see [`gateway`]).
//!
//! A top-level message in a watched channel is an issue (id `<channel-id>:<message-id>`) when a
//! requester mentions the bot (`<@id>`, `<@!id>`, or the bot's managed role `<@&role>`) or when
//! it carries the bot's marker reaction (which the "Track with svc" message command adds, and
//! every status update keeps). Requesters are the `users` allow-list, or any non-bot author when
//! it is empty. Status replies and progress notes go in the message's thread ("Start Thread from
//! Message": the thread's id is the source message's id). The state is the bot's latest status
//! reply in that thread, else the reactions per `emoji_states`, else `Todo`.
//!
//! Discovery pages each channel's messages (newest first, `before=`) back to
//! `scan_lookback_days` (0: unbounded, capped at [`MAX_PAGES`] pages a poll). The first poll
//! reads in full, which finds whatever was posted while svc was down. While the Gateway session
//! is live and unchanged since the last poll, a poll reads only what is newer than the last scan
//! plus the messages events touched; a new session syncs with a full read; without a session a
//! poll reads what is new and re-reads every tracked message, and everything every
//! [`FULL_RESCAN`]. The bot's reactions mirror each issue's state and are
//! healed in the background when they drift.
//!
//! Without `bot_user_id` every call fails closed. The bot token only travels in the
//! `Authorization` header and the Gateway's IDENTIFY/RESUME; no error, log line or snapshot
//! carries it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde_json::{Value, json};

mod api;
pub mod doctor;
pub mod gateway;
mod steer;
pub mod tools;

pub use api::{DiscordApi, DiscordFailure};

pub use super::chat::StateSource;
use super::chat::{self, ChatConfig, ChatIssueId, LastScan};
use super::{Issue, StateNames, Tracker, TrackerError, Wake};
use crate::config::ChatOptions;

/// The environment fallback of `bot_user_id`, named in fail-closed messages.
pub const BOT_USER_ID_VAR: &str = "CHAT_B_BOT_USER_ID";
/// The pack name, named in fail-closed messages.
pub const PACK: &str = "chat_b";

/// Messages per page (Discord's maximum).
const PAGE: usize = 100;
/// Pages of one channel a scan reads at most (10,000 messages).
pub const MAX_PAGES: usize = 100;
/// Thread pages a read reads at most.
const THREAD_PAGES: usize = 10;
/// An incremental poll still re-reads a tracked message this old (a missed event's bound).
const REFRESH_EVERY: Duration = Duration::from_secs(600);
/// Without a live Gateway session, how often a poll reads the channels in full (in between,
/// polls read what is new and re-read every tracked message).
const FULL_RESCAN: Duration = Duration::from_secs(600);
/// How long the managed role lookup waits after a failure.
const ROLE_RETRY: Duration = Duration::from_secs(60);
/// Discord's epoch (2015-01-01T00:00:00Z) in Unix milliseconds.
const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;

/// The Unix milliseconds a snowflake was minted at.
pub fn snowflake_ms(id: &str) -> Option<u64> {
    id.parse::<u64>().ok().map(|n| (n >> 22) + DISCORD_EPOCH_MS)
}

/// The smallest snowflake of a Unix time in milliseconds (for `after`/`before` bounds).
fn snowflake_at(unix_ms: u64) -> u64 {
    unix_ms.saturating_sub(DISCORD_EPOCH_MS) << 22
}

fn snowflake(id: &str) -> u64 {
    id.parse().unwrap_or(0)
}

fn rfc3339_ms(ms: u64) -> String {
    crate::time::rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms))
}

use crate::time::unix_ms as now_ms;

fn id_of(m: &Value) -> &str {
    m["id"].as_str().unwrap_or_default()
}

fn content_of(m: &Value) -> &str {
    m["content"].as_str().unwrap_or_default()
}

fn author_of(m: &Value) -> &str {
    m.pointer("/author/id")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// A reaction's emoji as configuration names it: a Unicode emoji itself, a custom emoji by
/// its name or as `name:id` (also the form the reaction routes take).
fn emoji_names(r: &Value) -> (Option<&str>, Option<String>) {
    let name = r.pointer("/emoji/name").and_then(Value::as_str);
    let full = match (name, r.pointer("/emoji/id").and_then(Value::as_str)) {
        (Some(n), Some(id)) => Some(format!("{n}:{id}")),
        _ => None,
    };
    (name, full)
}

/// Whether the bot itself reacted to `m` with `key` (`me` is the bot's own).
fn bot_reacted(m: &Value, key: &str) -> bool {
    m["reactions"].as_array().into_iter().flatten().any(|r| {
        let (name, full) = emoji_names(r);
        r["me"] == true && (name == Some(key) || full.as_deref() == Some(key))
    })
}

/// A compact message for tool results.
pub(crate) fn message_json(m: &Value) -> Value {
    let mut out = json!({
        "id": m["id"],
        "author": {"id": m.pointer("/author/id"), "username": m.pointer("/author/username"), "bot": m.pointer("/author/bot").cloned().unwrap_or(Value::Bool(false))},
        "content": m["content"],
        "timestamp": m["timestamp"],
    });
    for key in ["edited_timestamp", "type"] {
        if let Some(v) = m.get(key).filter(|v| !v.is_null()) {
            out[key] = v.clone();
        }
    }
    out
}

fn reactions_json(m: &Value) -> Value {
    Value::Array(
        m["reactions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| json!({"emoji": r.pointer("/emoji/name"), "count": r["count"], "me": r["me"]}))
            .collect(),
    )
}

/// A tracked message and its thread's messages (oldest first; empty without a thread).
#[derive(Clone, Debug)]
pub struct Source {
    pub channel: String,
    pub root: Value,
    pub thread: Vec<Value>,
}

impl Source {
    pub fn id(&self) -> ChatIssueId {
        ChatIssueId {
            channel: self.channel.clone(),
            message: id_of(&self.root).to_string(),
        }
    }

    /// Whether a thread was started from the message (its `thread` object, or the
    /// HAS_THREAD flag, 1 << 5).
    pub fn has_thread(root: &Value) -> bool {
        root.get("thread").is_some_and(|t| !t.is_null())
            || root["flags"].as_u64().is_some_and(|f| f & (1 << 5) != 0)
    }

    /// What says the thread moved: its last message id (or message count) as the root reports
    /// it; `None` when the root does not tell (the thread is then read every time).
    fn thread_last(root: &Value) -> Option<String> {
        let t = root.get("thread").filter(|t| !t.is_null())?;
        Some(
            t["last_message_id"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| format!("count:{}", t["message_count"])),
        )
    }
}

/// A tracked message as the index keeps it.
struct Indexed {
    source: Source,
    /// The thread's last message id when `source.thread` was read.
    thread_last: Option<String>,
    refreshed: Instant,
}

/// What the tracker remembers between polls.
#[derive(Default)]
struct Index {
    /// Per channel, the newest message id the last complete scan reached.
    floor: HashMap<String, u64>,
    /// Tracked messages by issue id.
    sources: BTreeMap<String, Indexed>,
    /// The Gateway epoch the floors belong to (0: none).
    epoch: u64,
    /// When a scan last read every channel in full.
    last_full: Option<Instant>,
    /// When the last scan started (Unix ms): steering's floor for threads it did not know.
    scan_started_ms: u64,
}

struct Background {
    shared: Arc<gateway::Shared>,
    jobs: crossbeam_channel::Sender<gateway::Job>,
}

#[derive(Default)]
struct RoleCache {
    role: Option<Option<String>>,
    failed_at: Option<Instant>,
}

pub struct ChatB {
    api: Arc<DiscordApi>,
    guild_id: Option<String>,
    config: ChatConfig,
    users: Vec<String>,
    /// The scan window (`None`: unbounded).
    lookback: Option<Duration>,
    role: Mutex<RoleCache>,
    index: Mutex<Index>,
    last_scan: LastScan,
    /// The Gateway and worker threads, started by the daemon's poller ([`Tracker::attach`]).
    background: OnceLock<Option<Background>>,
}

impl Drop for ChatB {
    fn drop(&mut self) {
        if let Some(Some(b)) = self.background.get() {
            b.shared.stop();
        }
    }
}

impl ChatB {
    pub fn new(opts: &ChatOptions, states: StateNames) -> ChatB {
        ChatB {
            api: Arc::new(DiscordApi::new(&opts.endpoint, opts.api_key.clone())),
            guild_id: opts.guild_id.clone().filter(|g| !g.trim().is_empty()),
            config: ChatConfig::new(opts, states, PACK, BOT_USER_ID_VAR),
            users: opts.users.clone(),
            lookback: (opts.lookback_days > 0.0)
                .then(|| Duration::try_from_secs_f64(opts.lookback_days * 86_400.0).ok())
                .flatten(),
            role: Mutex::default(),
            index: Mutex::default(),
            last_scan: LastScan::default(),
            background: OnceLock::new(),
        }
    }

    pub fn api(&self) -> &DiscordApi {
        &self.api
    }

    pub fn guild_id(&self) -> Option<&str> {
        self.guild_id.as_deref()
    }

    /// The bot's managed role in the guild (`tags.bot_id`), looked up once; `None` when there
    /// is none or it cannot be learnt now.
    pub fn bot_role(&self, bot: &str) -> Option<String> {
        let guild = self.guild_id.as_deref()?;
        let mut cache = self.role.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = &cache.role {
            return r.clone();
        }
        if cache.failed_at.is_some_and(|t| t.elapsed() < ROLE_RETRY) {
            return None;
        }
        match self.api.get(&format!("/guilds/{guild}/roles")) {
            Ok(roles) => {
                let role = roles.as_array().into_iter().flatten().find_map(|r| {
                    (r.pointer("/tags/bot_id").and_then(Value::as_str) == Some(bot))
                        .then(|| id_of(r).to_string())
                });
                cache.role = Some(role.clone());
                role
            }
            Err(e) => {
                log::warn!(
                    "chat-b: the bot's managed role is unknown for now: {}",
                    TrackerError::from(e).message
                );
                cache.failed_at = Some(Instant::now());
                None
            }
        }
    }

    /// Whether a requester mentions the bot in `m`: a user mention or its managed role, by a
    /// non-bot author on the allow-list (any non-bot author when the list is empty).
    fn requested(&self, m: &Value, bot: &str, role: Option<&str>) -> bool {
        let author = author_of(m);
        if author.is_empty() || author == bot {
            return false;
        }
        let allowed = if self.users.is_empty() {
            m.pointer("/author/bot") != Some(&Value::Bool(true))
        } else {
            self.users.iter().any(|u| u == author)
        };
        if !allowed {
            return false;
        }
        let text = content_of(m);
        chat::mentions_bot(text, Some(bot))
            || m["mentions"]
                .as_array()
                .is_some_and(|l| l.iter().any(|u| u["id"] == bot))
            || role.is_some_and(|r| {
                text.contains(&format!("<@&{r}>"))
                    || m["mention_roles"]
                        .as_array()
                        .is_some_and(|l| l.iter().any(|x| x == r))
            })
    }

    /// The reactions on a message in Discord's order, each as the configuration names it (a
    /// custom emoji as `name:id` when `emoji_states` or the marker use that form).
    fn reaction_keys(&self, m: &Value) -> Vec<String> {
        m["reactions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                let (name, full) = emoji_names(r);
                match full {
                    Some(f)
                        if self.config.emoji.state_of(&f).is_some()
                            || f == self.config.marker_emoji =>
                    {
                        Some(f)
                    }
                    _ => name.map(str::to_string),
                }
            })
            .collect()
    }

    /// Whether `m` (a top-level message of a watched channel) is an issue.
    pub fn is_source(&self, m: &Value, bot: &str, role: Option<&str>) -> bool {
        // Default (0) and reply (19) messages; system messages never are.
        let kind = m["type"].as_u64().unwrap_or(0);
        (kind == 0 || kind == 19)
            && (self.requested(m, bot, role) || bot_reacted(m, &self.config.marker_emoji))
    }

    /// A thread's messages, oldest first (none when the thread does not exist).
    fn read_thread_messages(&self, thread: &str, pages: usize) -> Result<Vec<Value>, TrackerError> {
        let mut out: Vec<Value> = Vec::new();
        let mut before: Option<String> = None;
        for _ in 0..pages {
            let path = match &before {
                Some(b) => format!("/channels/{thread}/messages?limit={PAGE}&before={b}"),
                None => format!("/channels/{thread}/messages?limit={PAGE}"),
            };
            let page = match self.api.get(&path) {
                Ok(v) => v.as_array().cloned().unwrap_or_default(),
                Err(e) if e.is_not_found() => break,
                Err(e) => return Err(e.into()),
            };
            let n = page.len();
            before = page.last().map(|m| id_of(m).to_string());
            out.extend(page);
            if n < PAGE {
                break;
            }
        }
        out.sort_by_key(|m| snowflake(id_of(m)));
        Ok(out)
    }

    /// A message of a watched channel read now; `None` when it is gone.
    fn fetch_message(&self, channel: &str, message: &str) -> Result<Option<Value>, TrackerError> {
        match self
            .api
            .get(&format!("/channels/{channel}/messages/{message}"))
        {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The tracked message an issue id names, with its thread, read now; `None` when it is gone
    /// or not tracked.
    pub fn source(&self, id: &ChatIssueId, bot: &str) -> Result<Option<Source>, TrackerError> {
        if !id.message.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(None);
        }
        let Some(root) = self.fetch_message(&id.channel, &id.message)? else {
            return Ok(None);
        };
        let role = self.bot_role(bot);
        if !self.is_source(&root, bot, role.as_deref()) {
            return Ok(None);
        }
        let thread = if Source::has_thread(&root) {
            self.read_thread_messages(&id.message, THREAD_PAGES)?
        } else {
            Vec::new()
        };
        Ok(Some(Source {
            channel: id.channel.clone(),
            root,
            thread,
        }))
    }

    /// The state the bot's latest status reply in the thread names.
    fn status_reply(&self, source: &Source, bot: &str) -> Option<String> {
        source
            .thread
            .iter()
            .rev()
            .filter(|m| author_of(m) == bot)
            .find_map(|m| chat::parse_status_text(content_of(m)))
    }

    /// The source's state and where it came from.
    pub fn source_state(&self, source: &Source, bot: &str) -> (String, StateSource) {
        let names = self.reaction_keys(&source.root);
        self.config.state(
            self.status_reply(source, bot),
            names.iter().map(String::as_str),
        )
    }

    /// The source's text without the bot's mentions (user and managed role).
    fn request_text(&self, root: &Value, bot: &str, role: Option<&str>) -> String {
        let mut text = content_of(root).to_string();
        if let Some(r) = role {
            text = text.replace(&format!("<@&{r}>"), "");
        }
        chat::strip_bot_mention(&text, bot)
    }

    /// `#tags` in the request and reactions other than the state reactions and the marker.
    fn labels(&self, source: &Source, text: &str) -> Vec<String> {
        let mut labels: Vec<String> = Vec::new();
        for l in chat::hashtags(text).into_iter().chain(
            self.reaction_keys(&source.root).into_iter().filter(|r| {
                self.config.emoji.state_of(r).is_none() && *r != self.config.marker_emoji
            }),
        ) {
            if !labels.contains(&l) {
                labels.push(l);
            }
        }
        labels
    }

    /// The message's link in the Discord client.
    pub fn permalink(&self, channel: &str, message: &str) -> Option<String> {
        let guild = self.guild_id.as_deref()?;
        Some(format!(
            "https://discord.com/channels/{guild}/{channel}/{message}"
        ))
    }

    /// The normalized issue of a tracked message.
    pub fn issue(&self, source: &Source, bot: &str, role: Option<&str>) -> Issue {
        let id = source.id();
        let rendered = id.render();
        let text = self.request_text(&source.root, bot, role);
        let (state, _) = self.source_state(source, bot);
        let created = snowflake_ms(&id.message);
        let updated = source
            .thread
            .last()
            .and_then(|m| snowflake_ms(id_of(m)))
            .into_iter()
            .chain(created)
            .max();
        Issue {
            title: chat::title_from(&text).unwrap_or_else(|| rendered.clone()),
            identifier: rendered.clone(),
            id: rendered,
            description: (!text.is_empty()).then(|| text.clone()),
            state_type: Some(self.config.states.state_type(&state).to_string()),
            state,
            labels: self.labels(source, &text),
            url: self.permalink(&id.channel, &id.message),
            created_at: created.map(rfc3339_ms),
            updated_at: updated.map(rfc3339_ms),
            priority: None,
            blocked_by: Vec::new(),
        }
    }

    /// The oldest snowflake the scan window reaches (`None`: unbounded).
    fn cutoff(&self) -> Option<u64> {
        self.lookback
            .map(|d| snowflake_at(now_ms().saturating_sub(d.as_millis() as u64)))
    }

    /// The top-level messages of a channel from the newest down to (not including) `floor` or
    /// the scan window, at most [`MAX_PAGES`] pages, newest first.
    pub fn channel_messages(
        &self,
        channel: &str,
        floor: Option<u64>,
    ) -> Result<Vec<Value>, TrackerError> {
        let bound = floor.into_iter().chain(self.cutoff()).max();
        let mut out = Vec::new();
        let mut before: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let path = match &before {
                Some(b) => format!("/channels/{channel}/messages?limit={PAGE}&before={b}"),
                None => format!("/channels/{channel}/messages?limit={PAGE}"),
            };
            let page = self.api.get(&path)?;
            let page = page.as_array().cloned().unwrap_or_default();
            let n = page.len();
            before = page.last().map(|m| id_of(m).to_string());
            let mut reached = false;
            for m in page {
                if bound.is_some_and(|b| snowflake(id_of(&m)) <= b) {
                    reached = true;
                    break;
                }
                out.push(m);
            }
            if reached || n < PAGE {
                break;
            }
        }
        Ok(out)
    }

    /// The tracked messages of one channel read in full (for queries), with their threads.
    pub fn scan_channel(&self, channel: &str, bot: &str) -> Result<Vec<Source>, TrackerError> {
        let role = self.bot_role(bot);
        let mut out = Vec::new();
        for root in self.channel_messages(channel, None)? {
            if self.is_source(&root, bot, role.as_deref()) {
                let thread = if Source::has_thread(&root) {
                    self.read_thread_messages(id_of(&root), THREAD_PAGES)?
                } else {
                    Vec::new()
                };
                out.push(Source {
                    channel: channel.to_string(),
                    root,
                    thread,
                });
            }
        }
        Ok(out)
    }

    fn background(&self) -> Option<&Background> {
        self.background.get().and_then(Option::as_ref)
    }

    /// Every tracked issue of the watched channels, whatever its state.
    fn scan(&self) -> Result<Vec<Issue>, TrackerError> {
        let bot = self.config.bot_for_tracker()?;
        let role = self.bot_role(bot);
        if let Some(b) = self.background() {
            b.shared.waker.take();
        }
        let live = self.background().and_then(|b| b.shared.live_epoch());
        let touched = self
            .background()
            .map(|b| b.shared.drain_touched())
            .unwrap_or_default();
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        index.scan_started_ms = now_ms();
        // With a live session whose events since the last scan were all seen, read what is new
        // and what events touched. A new session (or the first scan, or a failed one) syncs
        // with a full read. Without a session, read what is new and re-read every tracked
        // message, and everything every FULL_RESCAN.
        let trusted = live.is_some_and(|e| e == index.epoch);
        let full = match live {
            Some(_) => !trusted,
            None => index.last_full.is_none_or(|t| t.elapsed() >= FULL_RESCAN),
        };
        if full {
            index.floor.clear();
        }
        // A failed scan leaves the next one to read in full (touched events are not lost).
        index.epoch = 0;
        let cutoff = self.cutoff();
        let mut seen: HashSet<String> = HashSet::new();
        for channel in &self.config.channels {
            let floor = index.floor.get(channel).copied();
            let messages = self.channel_messages(channel, floor)?;
            let newest = messages
                .first()
                .map(|m| snowflake(id_of(m)))
                .into_iter()
                .chain(floor)
                .max();
            let mut roots: Vec<Value> = messages;
            // Touched messages the page scan did not cover (older than the floor).
            for (c, m) in &touched {
                if c == channel
                    && floor.is_some_and(|f| snowflake(m) <= f)
                    && !index.sources.contains_key(&format!("{c}:{m}"))
                    && let Some(root) = self.fetch_message(c, m)?
                {
                    roots.push(root);
                }
            }
            for root in roots {
                let key = format!("{channel}:{}", id_of(&root));
                seen.insert(key.clone());
                if self.is_source(&root, bot, role.as_deref()) {
                    self.upsert(&mut index, channel, root)?;
                } else {
                    index.sources.remove(&key);
                }
            }
            // Tracked messages the pages did not reach.
            let older: Vec<String> = index
                .sources
                .iter()
                .filter(|(k, s)| s.source.channel == *channel && !seen.contains(*k))
                .map(|(k, _)| k.clone())
                .collect();
            for key in older {
                let message = key.split_once(':').map(|(_, m)| m).unwrap_or_default();
                if cutoff.is_some_and(|c| snowflake(message) <= c) {
                    index.sources.remove(&key);
                    continue;
                }
                let stale = index
                    .sources
                    .get(&key)
                    .is_none_or(|s| s.refreshed.elapsed() >= REFRESH_EVERY);
                let hit = touched.contains(&(channel.clone(), message.to_string()));
                if trusted && !hit && !stale {
                    continue;
                }
                match self.fetch_message(channel, message)? {
                    Some(root) if self.is_source(&root, bot, role.as_deref()) => {
                        self.upsert(&mut index, channel, root)?;
                    }
                    _ => {
                        index.sources.remove(&key);
                    }
                }
            }
            if let Some(n) = newest {
                index.floor.insert(channel.clone(), n);
            }
        }
        index.epoch = live.unwrap_or(0);
        if full {
            index.last_full = Some(Instant::now());
        }
        let issues: Vec<Issue> = index
            .sources
            .values()
            .map(|s| self.issue(&s.source, bot, role.as_deref()))
            .collect();
        if let Some(b) = self.background() {
            b.shared.set_tracked(
                index
                    .sources
                    .values()
                    .map(|s| (id_of(&s.source.root).to_string(), s.source.channel.clone()))
                    .collect(),
            );
            for s in index.sources.values() {
                self.heal(b, &s.source, bot);
            }
        }
        drop(index);
        self.last_scan.store(&issues);
        Ok(issues)
    }

    /// Records a tracked message read now; its thread is re-read when it moved.
    fn upsert(&self, index: &mut Index, channel: &str, root: Value) -> Result<(), TrackerError> {
        let key = format!("{channel}:{}", id_of(&root));
        let last = Source::thread_last(&root);
        let cached = index
            .sources
            .get(&key)
            .filter(|s| last.is_some() && s.thread_last == last)
            .map(|s| s.source.thread.clone());
        let thread = match cached {
            Some(t) => t,
            None if Source::has_thread(&root) => {
                self.read_thread_messages(id_of(&root), THREAD_PAGES)?
            }
            None => Vec::new(),
        };
        index.sources.insert(
            key,
            Indexed {
                source: Source {
                    channel: channel.to_string(),
                    root,
                    thread,
                },
                thread_last: last,
                refreshed: Instant::now(),
            },
        );
        Ok(())
    }

    /// The bot's reactions a status reply asks for: the state's reaction (when it has one), no
    /// other state reaction, and the marker.
    fn wanted_reactions(&self, source: &Source, bot: &str) -> Option<(Vec<String>, Vec<String>)> {
        // The bot mirrors its own status replies; states humans set with reactions are
        // visible already.
        let (state, from) = self.source_state(source, bot);
        if from != StateSource::StatusReply {
            return None;
        }
        let target = self.config.emoji.emoji_for(&state).map(str::to_string);
        let mut add = Vec::new();
        let mut remove = Vec::new();
        for e in self.config.emoji.emojis() {
            if Some(e) != target.as_deref() && bot_reacted(&source.root, e) {
                remove.push(e.to_string());
            }
        }
        if let Some(t) = target
            && !bot_reacted(&source.root, &t)
        {
            add.push(t);
        }
        if !bot_reacted(&source.root, &self.config.marker_emoji) {
            add.push(self.config.marker_emoji.clone());
        }
        (!add.is_empty() || !remove.is_empty()).then_some((add, remove))
    }

    /// Queues the repair of the bot's reactions when they drifted from the state.
    fn heal(&self, b: &Background, source: &Source, bot: &str) {
        if let Some((add, remove)) = self.wanted_reactions(source, bot) {
            let message = id_of(&source.root).to_string();
            if b.shared.begin(&message) {
                let _ = b.jobs.send(gateway::Job::Reactions {
                    channel: source.channel.clone(),
                    message,
                    add,
                    remove,
                });
            }
        }
    }

    /// `GET /users/@me`: who the token is.
    pub fn me(&self) -> Result<Value, TrackerError> {
        Ok(self.api.get("/users/@me")?)
    }

    /// `GET /guilds/{guild}`: the guild, when the bot is in it.
    pub fn guild(&self) -> Result<Value, TrackerError> {
        let guild = self
            .guild_id
            .as_deref()
            .ok_or_else(|| TrackerError::config("tracker.guild_id is not set"))?;
        Ok(self.api.get(&format!("/guilds/{guild}"))?)
    }

    /// `GET /channels/{channel}`.
    pub fn channel_info(&self, channel: &str) -> Result<Value, TrackerError> {
        Ok(self.api.get(&format!("/channels/{channel}"))?)
    }
}

impl Tracker for ChatB {
    fn fetch_candidates(&self) -> Result<Vec<Issue>, TrackerError> {
        Ok(self.config.active(self.scan()?))
    }

    fn fetch_states_by_ids(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        let bot = self.config.bot_for_tracker()?;
        let role = self.bot_role(bot);
        let mut out = Vec::new();
        for raw in ids {
            let Ok(id) = self.config.watched(raw) else {
                continue;
            };
            if let Some(source) = self.source(&id, bot)? {
                out.push(self.issue(&source, bot, role.as_deref()));
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

    fn attach(&self, wake: &Wake) {
        let started = self.background.get_or_init(|| {
            let bot = self.config.bot_user_id.clone()?;
            let shared = Arc::new(gateway::Shared::default());
            let jobs = gateway::start(
                gateway::Config {
                    api: Arc::clone(&self.api),
                    guild_id: self.guild_id.clone(),
                    channels: self.config.channels.clone(),
                    bot_user_id: bot,
                    users: self.users.clone(),
                    marker_emoji: self.config.marker_emoji.clone(),
                },
                Arc::clone(&shared),
            );
            Some(Background { shared, jobs })
        });
        if let Some(b) = started {
            b.shared.waker.set(wake);
        }
    }

    fn steering_source(&self) -> Option<String> {
        Some(format!(
            "chat-b:{}",
            self.guild_id.as_deref().unwrap_or_default()
        ))
    }

    /// Replies in tracked messages' threads (see [`steer`]). A thread's window starts at the newest reply the poll's
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

    fn picked_up(&self, issue: &Issue) {
        let Some(b) = self.background() else { return };
        if !issue.state.trim().eq_ignore_ascii_case(chat::DEFAULT_STATE) {
            return;
        }
        let (Some(id), Some(eyes)) = (
            ChatIssueId::parse(&issue.id),
            self.config.emoji.emoji_for("In Progress"),
        ) else {
            return;
        };
        if b.shared.begin(&id.message) {
            let _ = b.jobs.send(gateway::Job::Reactions {
                channel: id.channel,
                message: id.message,
                add: vec![eyes.to_string()],
                remove: Vec::new(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use crate::tracker::chat::ChatTools;

    fn tracker(users: &[&str]) -> ChatB {
        let opts = ChatOptions {
            guild_id: Some("G1".into()),
            channels: vec!["111".into()],
            bot_user_id: Some("900".into()),
            users: users.iter().map(|u| u.to_string()).collect(),
            api_key: Secret::new(""),
            app_token: Secret::new(""),
            endpoint: "http://127.0.0.1:9".into(),
            emoji_states: chat::emoji_map(&[
                ("👀", "In Progress"),
                ("✅", "Done"),
                ("❌", "Cancelled"),
            ]),
            marker_emoji: "🤖".into(),
            lookback_days: 0.0,
        };
        ChatB::new(&opts, chat::test_states())
    }

    fn msg(id: &str, author: &str, content: &str) -> Value {
        json!({"id": id, "type": 0, "author": {"id": author, "username": "alice"}, "content": content, "mentions": [], "mention_roles": []})
    }

    #[test]
    fn mentions_roles_markers_and_the_allow_list_decide_what_is_tracked() {
        let t = tracker(&[]);
        let bot = "900";
        assert!(t.is_source(&msg("1", "5", "<@900> fix it"), bot, None));
        assert!(t.is_source(&msg("1", "5", "<@!900> fix it"), bot, None));
        assert!(!t.is_source(&msg("1", "5", "<@901> fix it"), bot, None));
        assert!(!t.is_source(&msg("1", "900", "<@900> me"), bot, None));
        let mut by_bot = msg("1", "6", "<@900> from a bot");
        by_bot["author"]["bot"] = true.into();
        assert!(!t.is_source(&by_bot, bot, None), "bots are not requesters");
        let mut role = msg("1", "5", "<@&77> please");
        role["mention_roles"] = json!(["77"]);
        assert!(t.is_source(&role, bot, Some("77")));
        assert!(!t.is_source(&role, bot, Some("78")));
        let mut marked = msg("1", "6", "no mention");
        marked["reactions"] =
            json!([{"emoji": {"id": null, "name": "🤖"}, "count": 1, "me": true}]);
        assert!(t.is_source(&marked, bot, None));
        marked["reactions"][0]["me"] = false.into();
        assert!(
            !t.is_source(&marked, bot, None),
            "only the bot's own marker"
        );
        let mut system = msg("1", "5", "<@900>");
        system["type"] = 7.into();
        assert!(!t.is_source(&system, bot, None));
        let only = tracker(&["5"]);
        assert!(only.is_source(&msg("1", "5", "<@900> hi"), bot, None));
        assert!(!only.is_source(&msg("1", "6", "<@900> hi"), bot, None));
    }

    #[test]
    fn a_source_becomes_an_issue_with_its_thread_state() {
        let t = tracker(&[]);
        let mut root = msg(
            "1187061700000000000",
            "5",
            "<@900> <@&77> fix the login page #route-web\nIt fails.",
        );
        root["reactions"] = json!([{"emoji": {"name": "👀"}, "count": 1, "me": false}, {"emoji": {"name": "bug"}, "count": 1, "me": false}]);
        let source = Source {
            channel: "111".into(),
            root,
            thread: vec![],
        };
        let issue = t.issue(&source, "900", Some("77"));
        assert_eq!(issue.id, "111:1187061700000000000");
        assert_eq!(issue.title, "fix the login page #route-web");
        assert_eq!(issue.state, "In Progress");
        assert_eq!(issue.labels, ["route-web", "bug"]);
        assert_eq!(
            issue.url.as_deref(),
            Some("https://discord.com/channels/G1/111/1187061700000000000")
        );
        assert_eq!(issue.created_at.as_deref(), Some("2023-12-20T15:59:23Z"));
        let with_status = Source {
            thread: vec![
                msg("1187061700000000001", "900", "Status: Done"),
                msg("1187061700000000002", "5", "Status: Todo"),
            ],
            ..source
        };
        assert_eq!(
            t.source_state(&with_status, "900"),
            ("Done".to_string(), StateSource::StatusReply)
        );
        let (add, remove) = t.wanted_reactions(&with_status, "900").unwrap();
        assert_eq!(add, ["✅", "🤖"]);
        assert!(remove.is_empty());
    }

    #[test]
    fn custom_emoji_match_by_name_or_name_and_id() {
        let mut t = tracker(&[]);
        t.config.emoji = chat::EmojiStates::new(chat::emoji_map(&[
            ("shipit:42", "Done"),
            ("nope", "Cancelled"),
        ]));
        let mut root = msg("1", "5", "<@900> x");
        root["reactions"] =
            json!([{"emoji": {"id": "42", "name": "shipit"}, "count": 1, "me": false}]);
        let source = Source {
            channel: "111".into(),
            root: root.clone(),
            thread: vec![],
        };
        assert_eq!(t.source_state(&source, "900").0, "Done");
        root["reactions"] = json!([{"emoji": {"id": "7", "name": "nope"}, "count": 1, "me": true}]);
        let source = Source { root, ..source };
        assert_eq!(t.source_state(&source, "900").0, "Cancelled");
        assert!(bot_reacted(&source.root, "nope") && bot_reacted(&source.root, "nope:7"));
    }

    #[test]
    fn snowflakes_carry_their_time() {
        let ms = 1_700_000_000_000;
        let id = snowflake_at(ms).to_string();
        assert_eq!(snowflake_ms(&id), Some(ms));
    }

    #[test]
    fn without_a_bot_user_id_the_tracker_fails_closed() {
        let mut t = tracker(&[]);
        t.config.bot_user_id = None;
        let e = t.fetch_candidates().unwrap_err();
        assert!(e.message.contains("tracker.bot_user_id"), "{e}");
        assert!(t.fetch_states_by_ids(&["111:1".into()]).is_err());
        assert!(t.comment("111:1", "x").unwrap_err().contains("unavailable"));
    }
}
