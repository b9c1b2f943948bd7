//! What the `chat_a` pack does in a thread: status replies with mirrored reactions, comments,
//! reading a thread and the channel around it, query rows and user lookups. Every operation
//! checks the bot user id first, then (per issue) the watched channel and the tracked message.

use serde_json::{Map, Value, json};

use super::api::SlackFailure;
use super::*;
use crate::tracker::TrackerError;
use crate::tracker::chat::{self, ChatIssueId};

impl ChatA {
    /// The tracked thread an issue id names, or why a tool may not touch it.
    pub fn tracked_thread(&self, issue_id: &str) -> Result<(ChatIssueId, Thread), String> {
        let bot = self.bot()?;
        let id = chat::require_watched(issue_id, &self.channels)?;
        let thread = self
            .thread(&id)
            .map_err(|e| e.message)?
            .filter(|t| self.tracked(t, bot, None))
            .ok_or_else(|| chat::not_tracked(issue_id))?;
        Ok((id, thread))
    }

    /// Posts the bot's status reply in the thread and mirrors the state with reactions (for
    /// visibility only: a failed mirror does not fail the update). Returns the state as
    /// configured.
    pub fn update_status(&self, issue_id: &str, status: &str) -> Result<String, String> {
        let bot = self.bot()?.to_string();
        chat::require_watched(issue_id, &self.channels)?;
        let state = self
            .emoji
            .known_state(&self.states, status)
            .ok_or_else(|| {
                format!(
                    "unknown status {status:?}; use one of: {}",
                    self.emoji.known_states(&self.states).join(", ")
                )
            })?;
        let (id, thread) = self.tracked_thread(issue_id)?;
        self.api
            .post(
                "chat.postMessage",
                &json!({
                    "channel": id.channel,
                    "thread_ts": id.message,
                    "text": escape_text(&chat::status_text(&state)),
                    "metadata": {"event_type": STATUS_EVENT, "event_payload": {"status": state}},
                }),
            )
            .map_err(|e| TrackerError::from(e).message)?;
        if let Err(e) = self.mirror_reactions(&id, &thread.root, &bot, &state) {
            log::warn!("chat-a: reactions of {issue_id} not mirrored: {e}");
        }
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id.render());
        *self.last_scan.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(state)
    }

    /// The bot's reactions on the root follow `state`: the state's reaction on, its other state
    /// reactions off, and the marker on.
    fn mirror_reactions(
        &self,
        id: &ChatIssueId,
        root: &Value,
        bot: &str,
        state: &str,
    ) -> Result<(), String> {
        let target = self.emoji.emoji_for(state);
        let call = |method: &str, name: &str, tolerated: &str| -> Result<(), String> {
            match self.api.post(
                method,
                &json!({"channel": id.channel, "timestamp": id.message, "name": name}),
            ) {
                Ok(_) => Ok(()),
                Err(e) if e.code() == Some(tolerated) => Ok(()),
                Err(e) => Err(TrackerError::from(e).message),
            }
        };
        for emoji in self.emoji.emojis() {
            if Some(emoji) != target && reacted(root, emoji, bot) {
                call("reactions.remove", emoji, "no_reaction")?;
            }
        }
        if let Some(t) = target {
            if !reacted(root, t, bot) {
                call("reactions.add", t, "already_reacted")?;
            }
        }
        if !reacted(root, &self.marker_emoji, bot) {
            call("reactions.add", &self.marker_emoji, "already_reacted")?;
        }
        Ok(())
    }

    /// Posts `body` in the issue's thread.
    pub fn comment(&self, issue_id: &str, body: &str) -> Result<(), String> {
        let (id, _) = self.tracked_thread(issue_id)?;
        self.api
            .post(
                "chat.postMessage",
                &json!({"channel": id.channel, "thread_ts": id.message, "text": escape_text(body)}),
            )
            .map_err(|e| TrackerError::from(e).message)?;
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id.render());
        Ok(())
    }

    /// The source message, the thread-derived status, reactions, permalink and replies.
    pub fn read_thread(&self, issue_id: &str) -> Result<Value, String> {
        let (id, thread) = self.tracked_thread(issue_id)?;
        let bot = self.bot()?;
        let (state, source) = self.thread_state(&thread, bot);
        let permalink = self
            .api
            .get(
                "chat.getPermalink",
                &[("channel", &id.channel), ("message_ts", &id.message)],
            )
            .map_err(|e| TrackerError::from(e).message)?["permalink"]
            .clone();
        let issue = self.issue(&thread, bot);
        Ok(json!({
            "issueId": id.render(),
            "channel": id.channel,
            "ts": id.message,
            "title": issue.title,
            "labels": issue.labels,
            "source": message_json(&thread.root),
            "status": {"state": state, "stateType": self.states.state_type(&state), "source": source.name()},
            "reactions": reactions_json(&thread.root),
            "permalink": permalink,
            "replies": thread.replies.iter().map(message_json).collect::<Vec<_>>(),
        }))
    }

    /// Query rows of the tracked threads in `channels` (already intersected with the allow-list);
    /// `thread` and `reactions` add those fields.
    pub fn query_rows(
        &self,
        channels: &[String],
        expand_thread: bool,
        expand_reactions: bool,
    ) -> Result<Vec<Map<String, Value>>, String> {
        let bot = self.bot()?;
        let mut rows = Vec::new();
        for channel in channels {
            for thread in self.scan_channel(channel, bot).map_err(|e| e.message)? {
                let issue = self.issue(&thread, bot);
                let ts = ts_of(&thread.root);
                let mut row = chat::Row {
                    issue_id: &issue.id,
                    channel,
                    message: ts,
                    message_key: "ts",
                    title: &issue.title,
                    state: &issue.state,
                    state_type: issue.state_type.as_deref().unwrap_or_default(),
                    labels: &issue.labels,
                    text: text_of(&thread.root),
                    url: issue.url.as_deref(),
                }
                .to_map();
                if expand_thread {
                    row.insert(
                        "thread".into(),
                        Value::Array(thread.replies.iter().map(message_json).collect()),
                    );
                }
                if expand_reactions {
                    row.insert("reactions".into(), reactions_json(&thread.root));
                }
                rows.push(row);
            }
        }
        Ok(rows)
    }

    /// `users.info`, trimmed to what an agent needs (no email).
    pub fn user_info(&self, user_id: &str) -> Result<Value, String> {
        self.bot()?;
        if user_id.is_empty() || !user_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(format!("userId {user_id:?} is not a user id"));
        }
        let u = self
            .api
            .get("users.info", &[("user", user_id)])
            .map_err(|e| TrackerError::from(e).message)?;
        let u = &u["user"];
        Ok(json!({
            "id": u["id"],
            "name": u["name"],
            "real_name": u["real_name"].as_str().or_else(|| u.pointer("/profile/real_name").and_then(Value::as_str)),
            "display_name": u.pointer("/profile/display_name"),
            "title": u.pointer("/profile/title"),
            "tz": u["tz"],
            "is_bot": u["is_bot"],
            "deleted": u["deleted"],
        }))
    }

    /// The issue's root message and up to `before` messages before it and `after` after it, in
    /// channel order.
    pub fn channel_context(
        &self,
        issue_id: &str,
        before: u64,
        after: u64,
    ) -> Result<Value, String> {
        let (id, thread) = self.tracked_thread(issue_id)?;
        let fail = |e: SlackFailure| TrackerError::from(e).message;
        let mut earlier = if before == 0 {
            Vec::new()
        } else {
            self.api
                .paged_until(
                    "conversations.history",
                    &[
                        ("channel", &id.channel),
                        ("latest", &id.message),
                        ("inclusive", "false"),
                        ("limit", &before.to_string()),
                    ],
                    "messages",
                    HISTORY_PAGES,
                    before as usize,
                )
                .map_err(fail)?
        };
        earlier.retain(|m| ts_of(m) != id.message);
        earlier.sort_by(|a, b| cmp_ts(ts_of(a), ts_of(b)));
        let skip = earlier.len().saturating_sub(before as usize);
        let earlier: Vec<Value> = earlier.into_iter().skip(skip).collect();
        let mut later = if after == 0 {
            Vec::new()
        } else {
            // Slack pages newest first from the present back to the anchor; sorted, the first
            // ones follow the anchor.
            self.api
                .paged(
                    "conversations.history",
                    &[
                        ("channel", &id.channel),
                        ("oldest", &id.message),
                        ("inclusive", "false"),
                        ("limit", &PAGE.to_string()),
                    ],
                    "messages",
                    HISTORY_PAGES,
                )
                .map_err(fail)?
        };
        later.retain(|m| ts_of(m) != id.message);
        later.sort_by(|a, b| cmp_ts(ts_of(a), ts_of(b)));
        later.truncate(after as usize);
        let messages: Vec<Value> = earlier
            .iter()
            .chain(std::iter::once(&thread.root))
            .chain(later.iter())
            .map(message_json)
            .collect();
        Ok(json!({"anchor": message_json(&thread.root), "messages": messages}))
    }

    /// `conversations.info` of a watched channel: its name and whether the bot is a member.
    pub fn channel_info(&self, channel: &str) -> Result<Value, TrackerError> {
        Ok(self
            .api
            .get("conversations.info", &[("channel", channel)])?["channel"]
            .clone())
    }
}

fn cmp_ts(a: &str, b: &str) -> std::cmp::Ordering {
    let (a, b) = (ts_secs(a).unwrap_or(0.0), ts_secs(b).unwrap_or(0.0));
    a.total_cmp(&b)
}
