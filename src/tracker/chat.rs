//! What the chat trackers (`chat-a`, `chat-b`) share, whatever the platform: mention matching,
//! the reaction-to-state map, the state a thread derives (the bot's latest status reply, else the
//! reactions, else `Todo`), issue ids `<channel>:<message>`, query rows, the channel allow-list
//! the fail-closed checks every chat tool makes before it touches the platform, the options
//! both keep ([`ChatConfig`]), the last scan a poll reuses ([`LastScan`]), and the tools a chat
//! pack drives ([`ChatTools`]), and the doctor's token and channel findings both give.
//!
//! Architecture Invariant: nothing here does I/O; the platform modules fetch messages and hand
//! plain values in (and implement [`ChatTools`] with their own requests).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::{Finding, FindingLevel, Issue, StateNames, TrackerError};
use crate::config::ChatOptions;

/// The state of a tracked message nobody has moved yet.
pub const DEFAULT_STATE: &str = "Todo";

/// A fresh key for one post of the bot (16 hex digits after `svc`, within chat-b's 25-character
/// `nonce`): it names the post across attempts, so a post whose answer was lost is recognized
/// (chat-a: in the message metadata; chat-b: Discord's `enforce_nonce`) instead of sent twice.
pub fn post_key() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // Practically unreachable; the clock is unique enough within one post's attempts.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        bytes = (nanos ^ u64::from(std::process::id())).to_be_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("svc{hex}")
}

/// The ids mentioned in `text`: `<@U123>`, `<@U123|name>` (chat-a) and `<@123>`, `<@!123>`
/// (chat-b). Role mentions (`<@&id>`) are not user mentions and are left out.
pub fn mentioned_ids(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<@") {
        rest = &rest[start + 2..];
        let Some(end) = rest.find('>') else { break };
        let inner = &rest[..end];
        rest = &rest[end + 1..];
        if inner.starts_with('&') {
            continue;
        }
        let id = inner.trim_start_matches('!');
        let id = id.split('|').next().unwrap_or_default();
        if !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            out.push(id);
        }
    }
    out
}

/// Whether `text` mentions the bot. With a bot id only mentions of that id count; without one
/// any mention does (Authentication item 8: the production transports fail closed instead of
/// relying on this).
pub fn mentions_bot(text: &str, bot_user_id: Option<&str>) -> bool {
    let ids = mentioned_ids(text);
    match bot_user_id {
        Some(bot) => ids.contains(&bot),
        None => !ids.is_empty(),
    }
}

/// `text` without the mentions of the bot, whitespace collapsed per line.
pub fn strip_bot_mention(text: &str, bot_user_id: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("<@") {
        let (before, after) = rest.split_at(start);
        out.push_str(before);
        match after.find('>') {
            Some(end) => {
                let inner = &after[2..end];
                let id = inner
                    .trim_start_matches('!')
                    .split('|')
                    .next()
                    .unwrap_or("");
                if id != bot_user_id {
                    out.push_str(&after[..=end]);
                }
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(after);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_string()
}

/// Longest issue title, in characters; the full text stays in the description.
pub const TITLE_CHARS: usize = 120;

/// A title from a message's text (mention already removed): its first non-empty line, capped.
pub fn title_from(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut title: String = line.chars().take(TITLE_CHARS).collect();
    if line.chars().count() > TITLE_CHARS {
        title.push('…');
    }
    Some(title)
}

/// `#tags` written in a message (`#route-backend` gives `route-backend`).
pub fn hashtags(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || c == ',' || c == ';')
        .filter_map(|w| w.strip_prefix('#'))
        .map(|t| t.trim_end_matches(['.', '!', '?', ')', ':']))
        .filter(|t| {
            !t.is_empty()
                && t.chars()
                    .all(|c| c.is_alphanumeric() || c == '-' || c == '_' || c == ':')
        })
        .map(str::to_string)
        .collect()
}

/// An issue id: the channel and the thread root's message id, `<channel>:<message>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatIssueId {
    pub channel: String,
    pub message: String,
}

impl ChatIssueId {
    pub fn parse(id: &str) -> Option<ChatIssueId> {
        let (channel, message) = id.trim().split_once(':')?;
        (!channel.is_empty() && !message.is_empty() && !message.contains(':')).then(|| {
            ChatIssueId {
                channel: channel.to_string(),
                message: message.to_string(),
            }
        })
    }

    pub fn render(&self) -> String {
        format!("{}:{}", self.channel, self.message)
    }
}

/// The reaction-to-state map (`emoji_states`, merged over the platform defaults).
#[derive(Clone, Debug)]
pub struct EmojiStates {
    map: BTreeMap<String, String>,
}

impl EmojiStates {
    pub fn new(map: BTreeMap<String, String>) -> EmojiStates {
        EmojiStates { map }
    }

    /// The state a reaction stands for.
    pub fn state_of(&self, emoji: &str) -> Option<&str> {
        self.map.get(emoji).map(String::as_str)
    }

    /// The reaction that mirrors `state` (the first in name order when several do).
    pub fn emoji_for(&self, state: &str) -> Option<&str> {
        self.map
            .iter()
            .find(|(_, s)| s.trim().eq_ignore_ascii_case(state.trim()))
            .map(|(e, _)| e.as_str())
    }

    /// Every reaction the map knows.
    pub fn emojis(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(String::as_str)
    }

    /// The state the reactions on a message stand for: of the mapped ones, the last in the
    /// platform's order (the most recently added kind), if any.
    pub fn state_from_reactions<'r>(
        &self,
        reactions: impl IntoIterator<Item = &'r str>,
    ) -> Option<String> {
        reactions
            .into_iter()
            .filter_map(|r| self.state_of(r))
            .last()
            .map(str::to_string)
    }

    /// The configured spelling of a state name the tools accept (the active and terminal states
    /// and the map's states), or `None` for an unknown name.
    pub fn known_state(&self, states: &StateNames, wanted: &str) -> Option<String> {
        let wanted = wanted.trim();
        states
            .active
            .iter()
            .chain(&states.terminal)
            .chain(self.map.values())
            .find(|s| s.trim().eq_ignore_ascii_case(wanted))
            .map(|s| s.trim().to_string())
    }

    /// Every state name [`known_state`](Self::known_state) accepts, deduplicated, for messages.
    pub fn known_states(&self, states: &StateNames) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in states
            .active
            .iter()
            .chain(&states.terminal)
            .chain(self.map.values())
        {
            if !out.iter().any(|o| o.eq_ignore_ascii_case(s.trim())) {
                out.push(s.trim().to_string());
            }
        }
        out
    }
}

/// The state a thread derives: the bot's latest authoritative status reply, else the reactions
/// on the source message, else `Todo`.
pub fn derive_state<'r>(
    status_reply: Option<&str>,
    reactions: impl IntoIterator<Item = &'r str>,
    emoji: &EmojiStates,
) -> String {
    status_reply
        .map(str::to_string)
        .or_else(|| emoji.state_from_reactions(reactions))
        .unwrap_or_else(|| DEFAULT_STATE.to_string())
}

/// The text of the bot's status reply for `state`; [`parse_status_text`] reads it back.
pub fn status_text(state: &str) -> String {
    format!("Status: {state}")
}

/// The state a status reply's text names (`Status: Done`, on its first line: a chat command's
/// reply names who asked on the next), if it is one.
pub fn parse_status_text(text: &str) -> Option<String> {
    let first = text.trim().lines().next()?;
    let rest = first.trim().strip_prefix("Status:")?;
    let state = rest.trim().trim_matches('*').trim();
    (!state.is_empty()).then(|| state.to_string())
}

/// The text of the bot's status reply to a chat command: the status line, then who asked.
pub fn command_status_text(state: &str, who: &str, command: &Command) -> String {
    format!(
        "{}
Asked by {who} with `{}`.",
        status_text(state),
        command.word()
    )
}

/// A chat command a person writes in an issue's thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `!cancel`: the issue's cancelled state.
    Cancel,
    /// `!done`: the issue's done state.
    Done,
    /// `!reopen`: the first active state.
    Reopen,
    /// `!status <State>`: a configured state (the argument as written, maybe empty).
    Status(String),
}

impl Command {
    /// The command as written (`!status In Review`).
    pub fn word(&self) -> String {
        match self {
            Command::Cancel => "!cancel".into(),
            Command::Done => "!done".into(),
            Command::Reopen => "!reopen".into(),
            Command::Status(s) if s.is_empty() => "!status".into(),
            Command::Status(s) => format!("!status {s}"),
        }
    }
}

/// What a person's reply in an issue's thread is to svc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThreadReply {
    /// A reply starting `!aside`: for people only, never delivered.
    Aside,
    /// A chat command (its first word), never delivered.
    Command(Command),
    /// Anything else: a steering message for the issue's agent.
    Steering,
}

/// What a reply's text is: an aside, a command (`!cancel`, `!done`, `!reopen`,
/// `!status <State>`, the first word in any case; the rest of a `!status` line is the state,
/// anything after the first line is ignored), or steering.
pub fn classify_reply(text: &str) -> ThreadReply {
    let t = text.trim_start();
    if t.get(..crate::steering::ASIDE.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(crate::steering::ASIDE))
    {
        return ThreadReply::Aside;
    }
    let line = t.lines().next().unwrap_or_default().trim();
    let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let command = match word.to_ascii_lowercase().as_str() {
        "!cancel" => Command::Cancel,
        "!done" => Command::Done,
        "!reopen" => Command::Reopen,
        "!status" => Command::Status(rest.trim().trim_matches('*').trim().to_string()),
        _ => return ThreadReply::Steering,
    };
    ThreadReply::Command(command)
}

/// The channel ids a query reads: the requested ones that are on the allow-list (in allow-list
/// order), or the whole allow-list when none are requested.
pub fn intersect_channels(requested: Option<&[String]>, allowed: &[String]) -> Vec<String> {
    match requested {
        None => allowed.to_vec(),
        Some(req) => allowed
            .iter()
            .filter(|a| req.iter().any(|r| r == *a))
            .cloned()
            .collect(),
    }
}

/// Longest `before`/`after` window of a channel-context tool, and its default.
pub const CONTEXT_MAX: u64 = 50;
pub const CONTEXT_DEFAULT: u64 = 10;

/// `before` and `after` of a channel-context call: default 10, capped at 50.
pub fn context_window(args: &Value) -> Result<(u64, u64), String> {
    let read = |key: &str| -> Result<u64, String> {
        match args.get(key) {
            None | Some(Value::Null) => Ok(CONTEXT_DEFAULT),
            Some(v) => v
                .as_u64()
                .map(|n| n.min(CONTEXT_MAX))
                .ok_or_else(|| format!("'{key}' must be a non-negative integer")),
        }
    };
    Ok((read("before")?, read("after")?))
}

/// A channel-context answer: the anchor, and it with the messages before and after it in
/// channel order, each as the platform's `message_json` renders it.
pub fn context_answer(
    earlier: &[Value],
    anchor: &Value,
    later: &[Value],
    message_json: fn(&Value) -> Value,
) -> Value {
    let messages: Vec<Value> = earlier
        .iter()
        .chain(std::iter::once(anchor))
        .chain(later)
        .map(message_json)
        .collect();
    json!({"anchor": message_json(anchor), "messages": messages})
}

/// Why a chat tool refuses before touching the platform.
pub fn bot_user_id_missing(pack: &str, env_var: &str) -> String {
    format!(
        "{pack} tools are unavailable because tracker.bot_user_id (or {env_var}) is not configured"
    )
}

/// The fail-closed gate every chat tool passes first: a configured bot user id.
pub fn require_bot<'a>(
    bot_user_id: Option<&'a str>,
    pack: &str,
    env_var: &str,
) -> Result<&'a str, String> {
    bot_user_id
        .filter(|b| !b.trim().is_empty())
        .ok_or_else(|| bot_user_id_missing(pack, env_var))
}

/// The issue id of a per-issue tool, in a watched channel.
pub fn require_watched(issue_id: &str, channels: &[String]) -> Result<ChatIssueId, String> {
    let id = ChatIssueId::parse(issue_id).ok_or_else(|| {
        format!("issueId {issue_id:?} is not a chat issue id (expected <channel>:<message>)")
    })?;
    if !channels.contains(&id.channel) {
        return Err(format!(
            "channel {} is not watched (tracker.channels)",
            id.channel
        ));
    }
    Ok(id)
}

/// The message a per-issue tool names is not tracked (no mention of the bot, no marker).
pub fn not_tracked(issue_id: &str) -> String {
    format!(
        "{issue_id} is not a tracked message: nobody mentioned the bot there and it has no marker reaction"
    )
}

/// What a tracked message adds to its issue's fields in a query row: its id (under
/// `message_key`), its text, and its thread and reactions for the expansions.
pub struct RowFields {
    pub message_key: &'static str,
    pub message: String,
    pub text: String,
    pub thread: Value,
    pub reactions: Value,
}

impl RowFields {
    /// The spec's row of `issue` in `channel`; `thread` and `reactions` when expanded.
    pub fn into_row(
        self,
        issue: &Issue,
        channel: &str,
        expand_thread: bool,
        expand_reactions: bool,
    ) -> Map<String, Value> {
        let v = json!({
            "issueId": issue.id,
            "channel": channel,
            self.message_key: self.message,
            "title": issue.title,
            "state": issue.state,
            "stateType": issue.state_type.as_deref().unwrap_or_default(),
            "labels": issue.labels,
            "text": self.text,
            "url": issue.url,
        });
        let mut row = v.as_object().cloned().unwrap_or_default();
        if expand_thread {
            row.insert("thread".into(), self.thread);
        }
        if expand_reactions {
            row.insert("reactions".into(), self.reactions);
        }
        row
    }
}

/// Default projection of the chat query tools.
pub const QUERY_DEFAULT: &[&str] = &["issueId", "title", "state", "labels"];

/// Where a thread's state came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateSource {
    StatusReply,
    Reactions,
    Default,
}

impl StateSource {
    pub fn name(self) -> &'static str {
        match self {
            StateSource::StatusReply => "status_reply",
            StateSource::Reactions => "reactions",
            StateSource::Default => "default",
        }
    }
}

/// What both chat trackers keep from their options, and the checks made with it.
pub struct ChatConfig {
    pub channels: Vec<String>,
    /// `None` makes every call fail closed.
    pub bot_user_id: Option<String>,
    pub emoji: EmojiStates,
    pub marker_emoji: String,
    pub states: StateNames,
    /// The pack and the environment fallback of `bot_user_id`, named in fail-closed messages.
    pack: &'static str,
    bot_user_id_var: &'static str,
}

impl ChatConfig {
    pub fn new(
        opts: &ChatOptions,
        states: StateNames,
        pack: &'static str,
        bot_user_id_var: &'static str,
    ) -> ChatConfig {
        ChatConfig {
            channels: opts.channels.clone(),
            bot_user_id: opts.bot_user_id.clone().filter(|b| !b.trim().is_empty()),
            emoji: EmojiStates::new(opts.emoji_states.clone()),
            marker_emoji: opts.marker_emoji.clone(),
            states,
            pack,
            bot_user_id_var,
        }
    }

    /// The bot user id, or the fail-closed message.
    pub fn bot(&self) -> Result<&str, String> {
        require_bot(self.bot_user_id.as_deref(), self.pack, self.bot_user_id_var)
    }

    /// The bot user id, or the fail-closed error of a poll.
    pub fn bot_for_tracker(&self) -> Result<&str, TrackerError> {
        self.bot().map_err(TrackerError::config)
    }

    /// The issue id of a per-issue tool, in a watched channel.
    pub fn watched(&self, issue_id: &str) -> Result<ChatIssueId, String> {
        require_watched(issue_id, &self.channels)
    }

    /// The checks of a status update, in order: the bot user id, the watched channel, and the
    /// state name; the bot user id and the state as configured, or why the update is refused.
    pub fn status_update(&self, issue_id: &str, status: &str) -> Result<(String, String), String> {
        let bot = self.bot()?.to_string();
        self.watched(issue_id)?;
        let state = self
            .emoji
            .known_state(&self.states, status)
            .ok_or_else(|| {
                format!(
                    "unknown status {status:?}; use one of: {}",
                    self.emoji.known_states(&self.states).join(", ")
                )
            })?;
        Ok((bot, state))
    }

    /// The state a chat command asks for, as configured, or what to answer instead: `!cancel`
    /// a cancelled state (`Cancelled`/`Canceled` when known, else the first terminal state of
    /// the cancelled type), `!done` `Done` when known (else the first completed terminal state),
    /// `!reopen` the first active state, `!status <State>` a known state.
    pub fn command_state(&self, command: &Command) -> Result<String, String> {
        let known = |name: &str| self.emoji.known_state(&self.states, name);
        let of_type = |t: &str| {
            self.states
                .terminal
                .iter()
                .find(|s| self.states.state_type(s) == t)
                .map(|s| s.trim().to_string())
        };
        let choices = || self.emoji.known_states(&self.states).join(", ");
        match command {
            Command::Cancel => known("Cancelled")
                .or_else(|| known("Canceled"))
                .or_else(|| of_type("canceled"))
                .ok_or_else(|| {
                    "no cancelled state is configured (tracker.terminal_states)".to_string()
                }),
            Command::Done => known("Done")
                .or_else(|| of_type("completed"))
                .ok_or_else(|| "no done state is configured (tracker.terminal_states)".to_string()),
            Command::Reopen => self
                .states
                .active
                .first()
                .map(|s| s.trim().to_string())
                .ok_or_else(|| "no active state is configured (tracker.active_states)".to_string()),
            Command::Status(s) if s.is_empty() => {
                Err(format!("`!status` needs a state: one of {}", choices()))
            }
            Command::Status(s) => {
                known(s).ok_or_else(|| format!("unknown status {s:?}; use one of: {}", choices()))
            }
        }
    }

    /// The fields of a read-thread answer both platforms give: the issue, its source message
    /// (its id under `message_key`), its state and where it came from, and its reactions.
    pub fn thread_answer(
        &self,
        id: &ChatIssueId,
        message_key: &str,
        issue: &Issue,
        (state, from): (String, StateSource),
        source: Value,
        reactions: Value,
    ) -> Map<String, Value> {
        let v = json!({
            "issueId": id.render(),
            "channel": id.channel,
            message_key: id.message,
            "title": issue.title,
            "labels": issue.labels,
            "source": source,
            "status": {"state": state, "stateType": self.states.state_type(&state), "source": from.name()},
            "reactions": reactions,
        });
        v.as_object().cloned().unwrap_or_default()
    }

    /// A thread's state and where it came from: the bot's latest status reply, else the
    /// reactions on the source message, else `Todo`.
    pub fn state<'r>(
        &self,
        status_reply: Option<String>,
        reactions: impl IntoIterator<Item = &'r str>,
    ) -> (String, StateSource) {
        if let Some(s) = status_reply {
            return (s, StateSource::StatusReply);
        }
        match self.emoji.state_from_reactions(reactions) {
            Some(s) => (s, StateSource::Reactions),
            None => (DEFAULT_STATE.to_string(), StateSource::Default),
        }
    }

    /// The issues of a scan in an active state.
    pub fn active(&self, mut issues: Vec<Issue>) -> Vec<Issue> {
        issues.retain(|i| self.states.is_active(&i.state));
        issues
    }

    /// The issues of a scan in a terminal state.
    pub fn terminal(&self, mut issues: Vec<Issue>) -> Vec<Issue> {
        issues.retain(|i| self.states.is_terminal(&i.state));
        issues
    }
}

/// How long one scan answers both the candidate and the terminal question of a poll.
pub const SCAN_REUSE: Duration = Duration::from_secs(5);

/// The last scan, so one poll's candidate and terminal questions cost one scan.
#[derive(Default)]
pub struct LastScan(Mutex<Option<(Instant, Vec<Issue>)>>);

impl LastScan {
    pub fn store(&self, issues: &[Issue]) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), issues.to_vec()));
    }

    /// Makes the next poll scan again.
    pub fn clear(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The last scan if it is fresh enough to answer this poll too, else `scan()`.
    pub fn recent(
        &self,
        scan: impl FnOnce() -> Result<Vec<Issue>, TrackerError>,
    ) -> Result<Vec<Issue>, TrackerError> {
        if let Some((at, issues)) = &*self.0.lock().unwrap_or_else(|p| p.into_inner())
            && at.elapsed() < SCAN_REUSE
        {
            return Ok(issues.clone());
        }
        scan()
    }
}

/// What a chat pack's tools do on a platform; [`ChatConfig`] answers the checks every tool
/// makes first. Every operation fails closed without a bot user id.
pub trait ChatTools {
    fn config(&self) -> &ChatConfig;

    /// The bot user id, or the fail-closed message.
    fn bot(&self) -> Result<&str, String> {
        self.config().bot()
    }

    /// The watched channels.
    fn channels(&self) -> &[String] {
        &self.config().channels
    }

    /// Posts the bot's status reply for `status` (a configured state name); the state as
    /// configured.
    fn update_status(&self, issue_id: &str, status: &str) -> Result<String, String>;

    /// Posts `body` in the issue's thread.
    fn comment(&self, issue_id: &str, body: &str) -> Result<(), String>;

    /// The source message, its state, reactions, permalink and thread messages.
    fn read_thread(&self, issue_id: &str) -> Result<Value, String>;

    /// The tracked messages of one channel read now (for queries): each one's issue and the
    /// fields it adds to the issue's in a query row.
    fn tracked_rows(
        &self,
        channel: &str,
        bot: &str,
    ) -> Result<Vec<(Issue, RowFields)>, TrackerError>;

    /// Query rows of the tracked messages in `channels` (already intersected with the
    /// allow-list); `thread` and `reactions` add those fields.
    fn query_rows(
        &self,
        channels: &[String],
        expand_thread: bool,
        expand_reactions: bool,
    ) -> Result<Vec<Map<String, Value>>, String> {
        let bot = self.bot()?;
        let mut rows = Vec::new();
        for channel in channels {
            for (issue, fields) in self.tracked_rows(channel, bot).map_err(|e| e.message)? {
                rows.push(fields.into_row(&issue, channel, expand_thread, expand_reactions));
            }
        }
        Ok(rows)
    }

    /// A platform user, trimmed to what an agent needs.
    fn user_info(&self, user_id: &str) -> Result<Value, String>;

    /// The issue's message and up to `before` messages before it and `after` after it, in
    /// channel order.
    fn channel_context(&self, issue_id: &str, before: u64, after: u64) -> Result<Value, String>;
}

/// A reaction-to-state map from pairs (for tests).
#[cfg(test)]
pub(crate) fn emoji_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The state names the chat tests configure: Todo and In Progress active, Done and Cancelled
/// terminal.
#[cfg(test)]
pub(crate) fn test_states() -> StateNames {
    StateNames {
        active: vec!["Todo".into(), "In Progress".into()],
        terminal: vec!["Done".into(), "Cancelled".into()],
    }
}

/// A thread's issue as the chat steering tests hand it in (id and identifier alike).
#[cfg(test)]
pub(crate) fn test_issue(id: &str) -> Issue {
    Issue {
        id: id.into(),
        identifier: id.into(),
        title: "t".into(),
        description: None,
        state: "In Progress".into(),
        state_type: None,
        labels: vec![],
        url: None,
        created_at: None,
        updated_at: None,
        priority: None,
        blocked_by: Vec::new(),
    }
}

/// The doctor's finding for a chat tracker's token: `me` is who the token is, `user` the key of
/// its user id. A token of another user than `tracker.bot_user_id` (or `bot_user_var`) is an
/// error; else `accepted` judges `me`.
pub fn token_finding(
    me: Result<Value, TrackerError>,
    user: &str,
    bot_user_id: Option<&str>,
    bot_user_var: &str,
    hint: &str,
    accepted: impl FnOnce(&Value, &str) -> Finding,
) -> Finding {
    let me = match me {
        Ok(me) => me,
        Err(e) => {
            return Finding::problem("tracker_online", FindingLevel::Error, e.message, hint);
        }
    };
    let user = me[user].as_str().unwrap_or("?");
    match bot_user_id {
        Some(bot) if bot != user => Finding::problem(
            "tracker_online",
            FindingLevel::Error,
            format!("the bot token belongs to user {user}, not tracker.bot_user_id {bot}"),
            format!("set tracker.bot_user_id (or {bot_user_var}) to {user}"),
        ),
        _ => accepted(&me, user),
    }
}

/// The doctor's finding for a watched channel the chat tracker could not read.
pub fn channel_failed(channel: &str, e: TrackerError, hint: &str) -> Finding {
    Finding::problem(
        "tracker_channel",
        FindingLevel::Error,
        format!("{channel}: {}", e.message),
        hint,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emoji() -> EmojiStates {
        EmojiStates::new(emoji_map(&[
            ("eyes", "In Progress"),
            ("white_check_mark", "Done"),
            ("x", "Cancelled"),
        ]))
    }

    #[test]
    fn only_mentions_of_the_bot_count_when_its_id_is_set() {
        let text = "hey <@U999|alice> and <!here>, <@UBOT> fix it; <@&R1>";
        assert_eq!(mentioned_ids(text), ["U999", "UBOT"]);
        assert!(mentions_bot(text, Some("UBOT")));
        assert!(!mentions_bot("<@U999> please", Some("UBOT")));
        assert!(mentions_bot("<@U999> please", None), "unset: any mention");
        assert!(!mentions_bot("no mention at all", None));
        assert!(mentions_bot("<@!123> hi", Some("123")), "chat-b nick form");
    }

    #[test]
    fn titles_drop_the_bot_mention_and_keep_others() {
        let text = "<@UBOT>   fix the   login page\nwith <@U2>";
        let stripped = strip_bot_mention(text, "UBOT");
        assert_eq!(stripped, "fix the login page\nwith <@U2>");
        assert_eq!(title_from(&stripped).unwrap(), "fix the login page");
        assert_eq!(title_from("  \n "), None);
        let long = "x".repeat(200);
        assert_eq!(title_from(&long).unwrap().chars().count(), TITLE_CHARS + 1);
        assert_eq!(
            hashtags("please #route-backend, and #bug. not#this"),
            ["route-backend", "bug"]
        );
    }

    #[test]
    fn a_thread_derives_its_state_from_the_status_reply_then_reactions() {
        let e = emoji();
        assert_eq!(derive_state(None, [], &e), "Todo");
        assert_eq!(derive_state(None, ["thumbsup", "eyes"], &e), "In Progress");
        assert_eq!(
            derive_state(None, ["eyes", "white_check_mark"], &e),
            "Done",
            "the later mapped reaction wins"
        );
        assert_eq!(derive_state(Some("In Progress"), ["x"], &e), "In Progress");
        assert_eq!(parse_status_text("Status: *Done*").as_deref(), Some("Done"));
        assert_eq!(
            parse_status_text(&status_text("In Progress")).unwrap(),
            "In Progress"
        );
        assert_eq!(parse_status_text("status is done"), None);
    }

    #[test]
    fn replies_are_asides_commands_or_steering() {
        assert_eq!(
            classify_reply("  !aside not for the bot"),
            ThreadReply::Aside
        );
        assert_eq!(classify_reply("!ASIDE shh"), ThreadReply::Aside);
        assert_eq!(
            classify_reply("!cancel\nwrong issue"),
            ThreadReply::Command(Command::Cancel)
        );
        assert_eq!(classify_reply("!Done"), ThreadReply::Command(Command::Done));
        assert_eq!(
            classify_reply("!reopen please"),
            ThreadReply::Command(Command::Reopen)
        );
        assert_eq!(
            classify_reply("!status  In Progress \nbecause"),
            ThreadReply::Command(Command::Status("In Progress".into()))
        );
        assert_eq!(
            classify_reply("!status"),
            ThreadReply::Command(Command::Status(String::new()))
        );
        assert_eq!(classify_reply("use tabs !cancel"), ThreadReply::Steering);
        assert_eq!(classify_reply("!cancelled"), ThreadReply::Steering);
        assert_eq!(classify_reply(""), ThreadReply::Steering);
    }

    #[test]
    fn commands_name_configured_states() {
        let opts = ChatOptions {
            guild_id: None,
            channels: vec!["C1".into()],
            bot_user_id: Some("UBOT".into()),
            users: vec![],
            api_key: crate::config::Secret::new(""),
            app_token: crate::config::Secret::new(""),
            endpoint: String::new(),
            emoji_states: emoji_map(&[("x", "Cancelled")]),
            marker_emoji: "robot_face".into(),
            lookback_days: 0.0,
        };
        let mut c = ChatConfig::new(&opts, test_states(), "chat_a", "X");
        assert_eq!(c.command_state(&Command::Cancel).unwrap(), "Cancelled");
        assert_eq!(c.command_state(&Command::Done).unwrap(), "Done");
        assert_eq!(c.command_state(&Command::Reopen).unwrap(), "Todo");
        assert_eq!(
            c.command_state(&Command::Status("in progress".into()))
                .unwrap(),
            "In Progress"
        );
        let e = c
            .command_state(&Command::Status("Shipped".into()))
            .unwrap_err();
        assert!(
            e.contains("unknown status \"Shipped\"") && e.contains("Todo"),
            "{e}"
        );
        assert!(c.command_state(&Command::Status(String::new())).is_err());
        c.states.terminal = vec!["Closed".into(), "Duplicate".into()];
        c.emoji = EmojiStates::new(BTreeMap::new());
        assert_eq!(c.command_state(&Command::Done).unwrap(), "Closed");
        assert_eq!(c.command_state(&Command::Cancel).unwrap(), "Duplicate");
        let text = command_status_text("Cancelled", "alice", &Command::Cancel);
        assert_eq!(text, "Status: Cancelled\nAsked by alice with `!cancel`.");
        assert_eq!(parse_status_text(&text).as_deref(), Some("Cancelled"));
    }

    #[test]
    fn state_names_are_checked_against_the_configuration() {
        let names = test_states();
        let e = emoji();
        assert_eq!(e.known_state(&names, "done").as_deref(), Some("Done"));
        assert_eq!(e.known_state(&names, "Shipped"), None);
        assert_eq!(e.emoji_for("in progress"), Some("eyes"));
        assert_eq!(e.emoji_for("Todo"), None);
        assert_eq!(
            e.known_states(&names),
            ["Todo", "In Progress", "Done", "Cancelled"]
        );
    }

    #[test]
    fn queries_read_only_allowed_channels_and_contexts_are_capped() {
        let allowed = vec!["C1".to_string(), "C2".to_string()];
        assert_eq!(intersect_channels(None, &allowed), allowed);
        let req = vec!["C2".to_string(), "C9".to_string()];
        assert_eq!(intersect_channels(Some(&req), &allowed), ["C2"]);
        assert!(intersect_channels(Some(&["C9".to_string()]), &allowed).is_empty());
        assert_eq!(context_window(&json!({})).unwrap(), (10, 10));
        assert_eq!(
            context_window(&json!({"before": 500, "after": 3})).unwrap(),
            (50, 3)
        );
        assert!(context_window(&json!({"before": -1})).is_err());
    }

    #[test]
    fn tools_fail_closed_without_a_bot_or_outside_the_watched_channels() {
        let err = require_bot(None, "chat_a", "CHAT_A_BOT_USER_ID").unwrap_err();
        assert!(err.contains("tracker.bot_user_id") && err.contains("unavailable"));
        assert!(require_bot(Some(" "), "chat_a", "X").is_err());
        let channels = vec!["C1".to_string()];
        assert_eq!(
            require_watched("C1:1.2", &channels).unwrap(),
            ChatIssueId {
                channel: "C1".into(),
                message: "1.2".into()
            }
        );
        assert!(
            require_watched("C2:1.2", &channels)
                .unwrap_err()
                .contains("not watched")
        );
        assert!(require_watched("nonsense", &channels).is_err());
    }
}
