//! What the `chat_b` pack does in a message's thread: status replies with mirrored reactions,
//! the workpad (one message, edited in place), comments, reading the thread and the channel
//! around it, query rows and user lookups. Every operation checks the bot user id first, then
//! (per issue) the watched channel and the tracked message. Every message svc sends sets
//! `allowed_mentions: {parse: []}`, so nothing it writes pings anyone.

use serde_json::{Value, json};

use super::api::{DiscordFailure, THREAD_EXISTS, enc};
use super::*;
use crate::tracker::TrackerError;
use crate::tracker::chat::{self, ChatIssueId, ChatTools, RowFields};

/// Discord's longest message content, in characters.
pub const CONTENT_MAX: usize = 2000;
/// The first line of the workpad message (how svc finds it again).
pub const WORKPAD_HEADER: &str = "**Workpad**";
/// Longest thread name.
const THREAD_NAME_MAX: usize = 100;
/// Threads archive after a week without messages.
const AUTO_ARCHIVE_MINUTES: u64 = 10_080;

fn fail(e: DiscordFailure) -> String {
    TrackerError::from(e).message
}

/// No mention parsing in anything svc sends.
fn outbound(content: &str) -> Value {
    json!({"content": content, "allowed_mentions": {"parse": []}})
}

/// `text` cut to Discord's limit (with an ellipsis when cut).
fn cap(text: &str) -> String {
    if text.chars().count() <= CONTENT_MAX {
        return text.to_string();
    }
    let mut out: String = text.chars().take(CONTENT_MAX - 1).collect();
    out.push('…');
    out
}

/// Chunks of at most `max` characters, split at line ends where possible.
fn chunks(text: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.split_inclusive('\n') {
        if cur.chars().count() + line.chars().count() > max && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        let mut line = line;
        while line.chars().count() > max {
            let cut = line.char_indices().nth(max).map_or(line.len(), |(i, _)| i);
            out.push(line[..cut].to_string());
            line = &line[cut..];
        }
        cur.push_str(line);
    }
    if !cur.trim().is_empty() || out.is_empty() {
        out.push(cur);
    }
    out
}

/// A comment's text that cannot pass for a status reply or the workpad (a zero-width space
/// in front), so only the status tool moves the state.
pub(super) fn neutral(body: &str) -> String {
    let t = body.trim_start();
    if chat::parse_status_text(t).is_some() || t.starts_with(WORKPAD_HEADER) {
        format!("\u{200b}{body}")
    } else {
        body.to_string()
    }
}

/// The workpad's text: the header, then each section.
pub fn render_workpad(
    environment: &str,
    plan: &str,
    acceptance: &str,
    validation: &str,
    progress: Option<&str>,
) -> String {
    let mut out = format!(
        "{WORKPAD_HEADER}\n**Environment**\n{}\n**Plan**\n{}\n**Acceptance criteria**\n{}\n**Validation**\n{}",
        environment.trim(),
        plan.trim(),
        acceptance.trim(),
        validation.trim()
    );
    if let Some(p) = progress.map(str::trim).filter(|p| !p.is_empty()) {
        out.push_str(&format!("\n**Progress**\n{p}"));
    }
    cap(&out)
}

impl ChatB {
    /// The tracked message an issue id names, or why a tool may not touch it.
    pub fn tracked_source(&self, issue_id: &str) -> Result<(ChatIssueId, Source), String> {
        let bot = self.bot()?;
        let id = self.config.watched(issue_id)?;
        let source = self
            .source(&id, bot)
            .map_err(|e| e.message)?
            .ok_or_else(|| chat::not_tracked(issue_id))?;
        Ok((id, source))
    }

    /// The message's thread exists ("Start Thread from Message"; its id is the message's).
    fn ensure_thread(&self, id: &ChatIssueId, source: &Source) -> Result<(), String> {
        if Source::has_thread(&source.root) {
            return Ok(());
        }
        let bot = self.bot()?;
        let role = self.bot_role(bot);
        let text = self.request_text(&source.root, bot, role.as_deref());
        let title = chat::title_from(&text).unwrap_or_else(|| id.render());
        let name: String = title.chars().take(THREAD_NAME_MAX).collect();
        match self.api.call(
            "POST",
            &format!("/channels/{}/messages/{}/threads", id.channel, id.message),
            Some(&json!({"name": name, "auto_archive_duration": AUTO_ARCHIVE_MINUTES})),
        ) {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(THREAD_EXISTS) => Ok(()),
            Err(e) => Err(fail(e)),
        }
    }

    /// Posts `content` in the issue's thread (as a reply to the thread message `reply_to`, when
    /// given); the new message.
    pub(super) fn post_in_thread(
        &self,
        id: &ChatIssueId,
        source: &Source,
        content: &str,
        reply_to: Option<&str>,
    ) -> Result<Value, String> {
        self.ensure_thread(id, source)?;
        // A `nonce` with `enforce_nonce`: if an attempt's answer is lost and the client sends
        // the same body again, Discord answers with the message the first attempt created.
        let mut body = outbound(content);
        body["nonce"] = Value::String(chat::post_key());
        body["enforce_nonce"] = Value::Bool(true);
        if let Some(m) = reply_to {
            body["message_reference"] = json!({"message_id": m, "fail_if_not_exists": false});
        }
        self.api
            .call(
                "POST",
                &format!("/channels/{}/messages", id.message),
                Some(&body),
            )
            .map_err(fail)
    }

    /// The bot's reactions on the source message follow the state its thread derives (for
    /// visibility only: a failure is logged, not returned).
    pub(super) fn mirror_reactions(&self, id: &ChatIssueId, source: &Source, bot: &str) {
        let Some((add, remove)) = self.wanted_reactions(source, bot) else {
            return;
        };
        for (method, list) in [("DELETE", &remove), ("PUT", &add)] {
            for emoji in list {
                let path = format!(
                    "/channels/{}/messages/{}/reactions/{}/@me",
                    id.channel,
                    id.message,
                    enc(emoji)
                );
                if let Err(e) = self.api.call(method, &path, None) {
                    log::warn!(
                        "chat-b: reactions of {} not mirrored: {}",
                        id.render(),
                        fail(e)
                    );
                }
            }
        }
    }

    /// Creates the issue's workpad message, or edits it in place; its message id.
    pub fn workpad(&self, issue_id: &str, content: &str) -> Result<String, String> {
        let bot = self.bot()?.to_string();
        let (id, source) = self.tracked_source(issue_id)?;
        let existing = source
            .thread
            .iter()
            .find(|m| author_of(m) == bot && content_of(m).starts_with(WORKPAD_HEADER))
            .map(|m| id_of(m).to_string());
        let message = match existing {
            Some(mid) => self
                .api
                .call(
                    "PATCH",
                    &format!("/channels/{}/messages/{mid}", id.message),
                    Some(&outbound(content)),
                )
                .map_err(fail)?,
            None => self.post_in_thread(&id, &source, content, None)?,
        };
        Ok(id_of(&message).to_string())
    }
}

impl ChatTools for ChatB {
    fn config(&self) -> &ChatConfig {
        &self.config
    }

    /// Posts the bot's status reply in the thread and mirrors the state with the bot's
    /// reactions (for visibility only: a failed mirror does not fail the update). Returns the
    /// state as configured; an unknown state name is rejected.
    fn update_status(&self, issue_id: &str, status: &str) -> Result<String, String> {
        let (bot, state) = self.config.status_update(issue_id, status)?;
        let (id, mut source) = self.tracked_source(issue_id)?;
        let posted = self.post_in_thread(&id, &source, &chat::status_text(&state), None)?;
        source.thread.push(posted);
        self.mirror_reactions(&id, &source, &bot);
        Ok(state)
    }

    /// Posts `body` in the issue's thread (in several messages when it is longer than Discord
    /// allows).
    fn comment(&self, issue_id: &str, body: &str) -> Result<(), String> {
        let (id, source) = self.tracked_source(issue_id)?;
        // One character spare per part for the neutralizing mark.
        for part in chunks(body, CONTENT_MAX - 1) {
            self.post_in_thread(&id, &source, &neutral(&part), None)?;
        }
        Ok(())
    }

    /// The source message, its state, reactions, permalink and thread messages.
    fn read_thread(&self, issue_id: &str) -> Result<Value, String> {
        let (id, source) = self.tracked_source(issue_id)?;
        let bot = self.bot()?;
        let role = self.bot_role(bot);
        let state = self.source_state(&source, bot);
        let issue = self.issue(&source, bot, role.as_deref());
        let mut answer = self.config.thread_answer(
            &id,
            "messageId",
            &issue,
            state,
            message_json(&source.root),
            reactions_json(&source.root),
        );
        answer.insert("permalink".into(), json!(issue.url));
        let thread_id = Source::has_thread(&source.root).then(|| id.message.clone());
        answer.insert("threadId".into(), json!(thread_id));
        let messages = source.thread.iter().map(message_json).collect();
        answer.insert("messages".into(), Value::Array(messages));
        Ok(Value::Object(answer))
    }

    fn tracked_rows(
        &self,
        channel: &str,
        bot: &str,
    ) -> Result<Vec<(Issue, RowFields)>, TrackerError> {
        let role = self.bot_role(bot);
        let sources = self.scan_channel(channel, bot)?;
        Ok(sources
            .into_iter()
            .map(|s| {
                let fields = RowFields {
                    message_key: "messageId",
                    message: id_of(&s.root).to_string(),
                    text: content_of(&s.root).to_string(),
                    thread: Value::Array(s.thread.iter().map(message_json).collect()),
                    reactions: reactions_json(&s.root),
                };
                (self.issue(&s, bot, role.as_deref()), fields)
            })
            .collect())
    }

    /// `GET /users/{id}`, trimmed to what an agent needs.
    fn user_info(&self, user_id: &str) -> Result<Value, String> {
        self.bot()?;
        if user_id.is_empty() || !user_id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("userId {user_id:?} is not a user id"));
        }
        let u = self.api.get(&format!("/users/{user_id}")).map_err(fail)?;
        Ok(json!({
            "id": u["id"],
            "username": u["username"],
            "global_name": u["global_name"],
            "bot": u["bot"].as_bool().unwrap_or(false),
        }))
    }

    /// The issue's message and up to `before` messages before it and `after` after it, in
    /// channel order.
    fn channel_context(&self, issue_id: &str, before: u64, after: u64) -> Result<Value, String> {
        let (id, source) = self.tracked_source(issue_id)?;
        let around = |dir: &str, n: u64| -> Result<Vec<Value>, String> {
            if n == 0 {
                return Ok(Vec::new());
            }
            let v = self
                .api
                .get(&format!(
                    "/channels/{}/messages?{dir}={}&limit={n}",
                    id.channel, id.message
                ))
                .map_err(fail)?;
            Ok(v.as_array().cloned().unwrap_or_default())
        };
        let mut earlier = around("before", before)?;
        earlier.retain(|m| snowflake(id_of(m)) < snowflake(&id.message));
        earlier.sort_by_key(|m| snowflake(id_of(m)));
        let skip = earlier.len().saturating_sub(before as usize);
        let mut later = around("after", after)?;
        later.retain(|m| snowflake(id_of(m)) > snowflake(&id.message));
        later.sort_by_key(|m| snowflake(id_of(m)));
        later.truncate(after as usize);
        Ok(chat::context_answer(
            &earlier[skip..],
            &source.root,
            &later,
            message_json,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_split_or_capped_and_look_alikes_are_neutral() {
        let long = "line\n".repeat(900);
        let parts = chunks(&long, CONTENT_MAX);
        assert!(parts.len() >= 3 && parts.iter().all(|p| p.chars().count() <= CONTENT_MAX));
        assert_eq!(parts.concat(), long);
        let one = "x".repeat(4500);
        assert_eq!(chunks(&one, CONTENT_MAX).concat(), one);
        assert_eq!(chunks("hi", CONTENT_MAX), ["hi"]);
        let sneaky = format!("{}\nStatus: Done", "a".repeat(10));
        let parts = chunks(&sneaky, 12);
        assert_eq!(parts[1], "Status: Done");
        assert!(chat::parse_status_text(&neutral(&parts[1])).is_none());
        assert_eq!(cap(&"y".repeat(3000)).chars().count(), CONTENT_MAX);
        assert!(chat::parse_status_text(&neutral("Status: Done")).is_none());
        assert!(!neutral("**Workpad** fake").starts_with(WORKPAD_HEADER));
        assert_eq!(neutral("all good"), "all good");
        let pad = render_workpad("linux", "1. do it", "it works", "cargo test", Some("half"));
        assert!(pad.starts_with(WORKPAD_HEADER) && pad.contains("**Progress**\nhalf"));
    }
}
