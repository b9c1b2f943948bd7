//! What the chat trackers (`chat-a`, `chat-b`) share, whatever the platform: mention matching,
//! the reaction-to-state map, the state a thread derives (the bot's latest status reply, else the
//! reactions, else `Todo`), issue ids `<channel>:<message>`, query rows, the channel allow-list
//! and the fail-closed checks every chat tool makes before it touches the platform.
//!
//! Architecture Invariant: nothing here does I/O; the platform modules fetch messages and hand
//! plain values in.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::StateNames;

/// The state of a tracked message nobody has moved yet.
pub const DEFAULT_STATE: &str = "Todo";

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

/// The state a status reply's text names (`Status: Done`), if it is one.
pub fn parse_status_text(text: &str) -> Option<String> {
    let rest = text.trim().strip_prefix("Status:")?;
    let state = rest.trim().trim_matches('*').trim();
    (!state.is_empty() && !state.contains('\n')).then(|| state.to_string())
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

/// A query row: the spec's fields, from an issue and its source text.
pub struct Row<'a> {
    pub issue_id: &'a str,
    pub channel: &'a str,
    pub message: &'a str,
    pub message_key: &'a str,
    pub title: &'a str,
    pub state: &'a str,
    pub state_type: &'a str,
    pub labels: &'a [String],
    pub text: &'a str,
    pub url: Option<&'a str>,
}

impl Row<'_> {
    pub fn to_map(&self) -> Map<String, Value> {
        let v = json!({
            "issueId": self.issue_id,
            "channel": self.channel,
            self.message_key: self.message,
            "title": self.title,
            "state": self.state,
            "stateType": self.state_type,
            "labels": self.labels,
            "text": self.text,
            "url": self.url,
        });
        v.as_object().cloned().unwrap_or_default()
    }
}

/// Default projection of the chat query tools.
pub const QUERY_DEFAULT: &[&str] = &["issueId", "title", "state", "labels"];

#[cfg(test)]
mod tests {
    use super::*;

    fn emoji() -> EmojiStates {
        EmojiStates::new(
            [
                ("eyes", "In Progress"),
                ("white_check_mark", "Done"),
                ("x", "Cancelled"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into_iter()
            .collect(),
        )
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
    fn state_names_are_checked_against_the_configuration() {
        let names = StateNames {
            active: vec!["Todo".into(), "In Progress".into()],
            terminal: vec!["Done".into(), "Cancelled".into()],
        };
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
