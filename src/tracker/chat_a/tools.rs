//! What the `chat_a` pack does in a thread: status replies with mirrored reactions, comments,
//! reading a thread and the channel around it, query rows and user lookups. Every operation
//! checks the bot user id first, then (per issue) the watched channel and the tracked message.

use serde_json::{Value, json};

use super::*;
use crate::tracker::TrackerError;
use crate::tracker::chat::{self, ChatIssueId, ChatTools, RowFields};

impl ChatA {
    /// The tracked thread an issue id names, or why a tool may not touch it.
    pub fn tracked_thread(&self, issue_id: &str) -> Result<(ChatIssueId, Thread), String> {
        let bot = self.bot()?;
        let id = self.config.watched(issue_id)?;
        let thread = self
            .thread(&id)
            .map_err(|e| e.message)?
            .filter(|t| self.tracked(t, bot, None))
            .ok_or_else(|| chat::not_tracked(issue_id))?;
        Ok((id, thread))
    }

    /// The bot's reactions on the root follow `state`: the state's reaction on, its other state
    /// reactions off, and the marker on.
    pub(super) fn mirror_reactions(
        &self,
        id: &ChatIssueId,
        root: &Value,
        bot: &str,
        state: &str,
    ) -> Result<(), String> {
        let target = self.config.emoji.emoji_for(state);
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
        for emoji in self.config.emoji.emojis() {
            if Some(emoji) != target && reacted(root, emoji, bot) {
                call("reactions.remove", emoji, "no_reaction")?;
            }
        }
        if let Some(t) = target {
            if !reacted(root, t, bot) {
                call("reactions.add", t, "already_reacted")?;
            }
        }
        if !reacted(root, &self.config.marker_emoji, bot) {
            call(
                "reactions.add",
                &self.config.marker_emoji,
                "already_reacted",
            )?;
        }
        Ok(())
    }

    /// `conversations.info` of a watched channel: its name and whether the bot is a member.
    pub fn channel_info(&self, channel: &str) -> Result<Value, TrackerError> {
        Ok(self
            .api
            .get("conversations.info", &[("channel", channel)])?["channel"]
            .clone())
    }
}

impl ChatA {
    /// Posts `text` as the bot's reply in the thread of `id`, once: the metadata
    /// (`event_type`, `payload`) carries a fresh post key, and after an ambiguous failure the
    /// thread is read for the bot's reply with that key before the post is sent again.
    pub(super) fn reply_once(
        &self,
        id: &ChatIssueId,
        text: &str,
        event_type: &str,
        mut payload: Value,
    ) -> Result<(), String> {
        let bot = self.bot()?.to_string();
        let key = chat::post_key();
        payload["svc_post"] = Value::String(key.clone());
        let body = json!({
            "channel": id.channel,
            "thread_ts": id.message,
            "text": escape_text(text),
            "metadata": {"event_type": event_type, "event_payload": payload},
        });
        let landed = || {
            let thread = self
                .fetch_thread(&id.channel, &id.message)
                .map_err(api::SlackFailure::Transport)?;
            Ok(thread.unwrap_or_default().iter().any(|m| {
                m["user"] == bot.as_str()
                    && m.pointer("/metadata/event_payload/svc_post")
                        .and_then(Value::as_str)
                        == Some(key.as_str())
            }))
        };
        self.api
            .post_once("chat.postMessage", &body, landed)
            .map(drop)
            .map_err(|e| TrackerError::from(e).message)
    }
}

impl ChatTools for ChatA {
    fn config(&self) -> &ChatConfig {
        &self.config
    }

    /// Posts the bot's status reply in the thread and mirrors the state with reactions (for
    /// visibility only: a failed mirror does not fail the update). Returns the state as
    /// configured.
    fn update_status(&self, issue_id: &str, status: &str) -> Result<String, String> {
        let (bot, state) = self.config.status_update(issue_id, status)?;
        let (id, thread) = self.tracked_thread(issue_id)?;
        self.reply_once(
            &id,
            &chat::status_text(&state),
            STATUS_EVENT,
            json!({"status": state}),
        )?;
        if let Err(e) = self.mirror_reactions(&id, &thread.root, &bot, &state) {
            log::warn!("chat-a: reactions of {issue_id} not mirrored: {e}");
        }
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id.render());
        self.last_scan.clear();
        Ok(state)
    }

    /// Posts `body` in the issue's thread.
    fn comment(&self, issue_id: &str, body: &str) -> Result<(), String> {
        let (id, _) = self.tracked_thread(issue_id)?;
        self.reply_once(&id, body, COMMENT_EVENT, json!({}))?;
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id.render());
        Ok(())
    }

    /// The source message, the thread-derived status, reactions, permalink and replies.
    fn read_thread(&self, issue_id: &str) -> Result<Value, String> {
        let (id, thread) = self.tracked_thread(issue_id)?;
        let bot = self.bot()?;
        let state = self.thread_state(&thread, bot);
        let permalink = self
            .api
            .get(
                "chat.getPermalink",
                &[("channel", &id.channel), ("message_ts", &id.message)],
            )
            .map_err(|e| TrackerError::from(e).message)?["permalink"]
            .clone();
        let issue = self.issue(&thread, bot);
        let mut answer = self.config.thread_answer(
            &id,
            "ts",
            &issue,
            state,
            message_json(&thread.root),
            reactions_json(&thread.root),
        );
        answer.insert("permalink".into(), permalink);
        let replies = thread.replies.iter().map(message_json).collect();
        answer.insert("replies".into(), Value::Array(replies));
        Ok(Value::Object(answer))
    }

    fn tracked_rows(
        &self,
        channel: &str,
        bot: &str,
    ) -> Result<Vec<(Issue, RowFields)>, TrackerError> {
        let threads = self.scan_channel(channel, bot)?;
        Ok(threads
            .into_iter()
            .map(|t| {
                let replies = Value::Array(t.replies.iter().map(message_json).collect());
                let fields = RowFields {
                    message_key: "ts",
                    message: ts_of(&t.root).to_string(),
                    text: text_of(&t.root).to_string(),
                    thread: replies,
                    reactions: reactions_json(&t.root),
                };
                (self.issue(&t, bot), fields)
            })
            .collect())
    }

    /// `users.info`, trimmed to what an agent needs (no email).
    fn user_info(&self, user_id: &str) -> Result<Value, String> {
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
    fn channel_context(&self, issue_id: &str, before: u64, after: u64) -> Result<Value, String> {
        let (id, thread) = self.tracked_thread(issue_id)?;
        // The history on one side of the anchor (`latest`: before it, `oldest`: after it),
        // oldest first and without the anchor.
        let side = |bound: &str, n: u64, limit: &str, want: usize| -> Result<Vec<Value>, String> {
            if n == 0 {
                return Ok(Vec::new());
            }
            let params = [
                ("channel", id.channel.as_str()),
                (bound, id.message.as_str()),
                ("inclusive", "false"),
                ("limit", limit),
            ];
            let mut messages = self
                .api
                .paged_until(
                    "conversations.history",
                    &params,
                    "messages",
                    HISTORY_PAGES,
                    want,
                )
                .map_err(|e| TrackerError::from(e).message)?;
            messages.retain(|m| ts_of(m) != id.message);
            messages.sort_by(|a, b| cmp_ts(ts_of(a), ts_of(b)));
            Ok(messages)
        };
        let earlier = side("latest", before, &before.to_string(), before as usize)?;
        let skip = earlier.len().saturating_sub(before as usize);
        // Slack pages newest first from the present back to the anchor; sorted, the first
        // ones follow the anchor.
        let mut later = side("oldest", after, &PAGE.to_string(), usize::MAX)?;
        later.truncate(after as usize);
        Ok(chat::context_answer(
            &earlier[skip..],
            &thread.root,
            &later,
            message_json,
        ))
    }
}

fn cmp_ts(a: &str, b: &str) -> std::cmp::Ordering {
    let (a, b) = (ts_secs(a).unwrap_or(0.0), ts_secs(b).unwrap_or(0.0));
    a.total_cmp(&b)
}
