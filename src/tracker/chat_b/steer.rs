//! chat-b as a steering source: a person's reply in a tracked message's thread (the thread whose
//! id is the message's) is a message for the issue's agent, and a chat command (`!cancel`,
//! `!done`, `!reopen`, `!status <State>`) moves the issue with the bot's status reply.
//!
//! What counts: messages of the default (0) and reply (19) types, never system messages; never
//! the bot's own, never another bot's (`author.bot`); authors on `users` when it is set. A
//! message is new when its id (a snowflake, so ordered in time) is above the thread's last id in
//! the cursor; an edit keeps its id and so is never new. A thread the cursor does not know yet
//! (a message tracked since the last poll) counts what was written after that poll. The first
//! time (no cursor) delivers nothing: what is there is history.
//!
//! A command is answered once: the bot's answer is a Discord reply to it (`message_reference`),
//! and a command that already has the bot's reply is not answered again (after a restart that
//! lost the cursor's last step, say). The Gateway wakes a poll at each MESSAGE_CREATE in a
//! tracked thread, so both arrive within a poll of being written.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::tools::neutral;
use super::*;
use crate::steering::{Batch, Message};
use crate::tracker::chat::{Command, ThreadReply};

/// The source's cursor: per thread, the id of the last message taken; `floor` the time (as a
/// snowflake) the poll's scan started, for threads seen for the first time at the next one.
#[derive(Default, Serialize, Deserialize)]
struct Cursor {
    floor: u64,
    threads: BTreeMap<String, u64>,
}

/// One new thread message to look at.
struct New {
    issue: usize,
    message: Value,
}

/// Default and reply messages: what people write. Everything else (joins, pins, thread
/// starters, command invocations) is a system message.
fn is_person_message(m: &Value) -> bool {
    matches!(m["type"].as_u64().unwrap_or(0), 0 | 19)
}

fn author_name(m: &Value) -> String {
    let id = author_of(m);
    let name = m
        .pointer("/author/global_name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .or_else(|| m.pointer("/author/username").and_then(Value::as_str))
        .unwrap_or(id);
    if name == id {
        id.to_string()
    } else {
        format!("{name} ({id})")
    }
}

/// The text of a message for the agent: its content, then a line per attachment.
fn message_text(m: &Value) -> String {
    let mut text = content_of(m).trim().to_string();
    for a in m["attachments"].as_array().into_iter().flatten() {
        if let Some(url) = a["url"].as_str() {
            let name = a["filename"].as_str().unwrap_or("file");
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&format!("[attachment {name}: {url}]"));
        }
    }
    text
}

impl ChatB {
    /// Whether the bot already answered the command `message` in `source`'s thread.
    fn answered(source: &Source, bot: &str, message: &str) -> bool {
        source.thread.iter().any(|m| {
            author_of(m) == bot
                && m.pointer("/message_reference/message_id")
                    .and_then(Value::as_str)
                    == Some(message)
        })
    }

    /// Carries out a chat command: the bot's status reply naming who asked (a reply to the
    /// command), with the reactions mirrored; or, for a state it cannot take, an answer saying
    /// why. The bot's new message, `None` when the command was answered before.
    fn command(
        &self,
        source: &Source,
        message: &Value,
        command: &Command,
        bot: &str,
    ) -> Result<Option<Value>, String> {
        let mid = id_of(message);
        if Self::answered(source, bot, mid) {
            return Ok(None);
        }
        let id = source.id();
        let who = format!("<@{}>", author_of(message));
        match self.config.command_state(command) {
            Ok(state) => {
                let text = chat::command_status_text(&state, &who, command);
                let posted = self.post_in_thread(&id, source, &text, Some(mid))?;
                let mut after = source.clone();
                after.thread.push(posted.clone());
                self.mirror_reactions(&id, &after, bot);
                log::info!(
                    "chat-b: {} asked for {state} on {} ({})",
                    author_name(message),
                    id.render(),
                    command.word()
                );
                Ok(Some(posted))
            }
            Err(why) => {
                let text = neutral(&format!("{who}: {why}"));
                self.post_in_thread(&id, source, &text, Some(mid)).map(Some)
            }
        }
    }

    /// See [`Tracker::steering`]: the messages people wrote in tracked threads since `cursor`,
    /// for `issues`; commands in any tracked thread are carried out here.
    pub(super) fn steering_batch(
        &self,
        issues: &[Issue],
        cursor: Option<&str>,
    ) -> Result<Batch, TrackerError> {
        let bot = self.config.bot_for_tracker()?.to_string();
        // No cursor (or one this version cannot read): what is there is history.
        let parsed: Option<Cursor> = cursor.and_then(|c| serde_json::from_str(c).ok());
        let first = parsed.is_none();
        let before = parsed.unwrap_or_default();
        let wanted: HashSet<&str> = issues.iter().map(|i| i.id.as_str()).collect();
        let mut batch = Batch::default();
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        // What the scan read is in the index; a thread it did not read yet counts from the
        // scan's start at the next poll.
        let mut next = Cursor {
            floor: snowflake_at(index.scan_started_ms).max(before.floor),
            threads: BTreeMap::new(),
        };
        // The sources and their new messages, oldest first.
        let keys: Vec<String> = index.sources.keys().cloned().collect();
        let mut new: Vec<New> = Vec::new();
        for (n, key) in keys.iter().enumerate() {
            let source = &index.sources[key].source;
            let thread = id_of(&source.root).to_string();
            let newest = source
                .thread
                .iter()
                .map(|m| snowflake(id_of(m)))
                .max()
                .unwrap_or(0);
            let from = match before.threads.get(&thread) {
                Some(last) => *last,
                None if first => newest,
                None => before.floor,
            };
            next.threads.insert(thread.clone(), from.max(newest));
            for m in &source.thread {
                if snowflake(id_of(m)) > from && id_of(m) != thread {
                    new.push(New {
                        issue: n,
                        message: m.clone(),
                    });
                }
            }
        }
        new.sort_by_key(|x| snowflake(id_of(&x.message)));
        // Threads whose command failed: what follows waits for the next poll.
        let mut held: HashSet<usize> = HashSet::new();
        let mut answered = false;
        for New { issue, message } in new {
            if held.contains(&issue) {
                continue;
            }
            let key = &keys[issue];
            let author = author_of(&message);
            if author.is_empty() || author == bot || !is_person_message(&message) {
                continue;
            }
            let is_wanted = wanted.contains(key.as_str());
            let who = author_name(&message);
            let reply = chat::classify_reply(content_of(&message));
            if message.pointer("/author/bot") == Some(&Value::Bool(true)) {
                if is_wanted || matches!(reply, ThreadReply::Command(_)) {
                    batch
                        .ignored
                        .push(format!("{key}: a reply by {who}, a bot (chat-b)"));
                }
                continue;
            }
            let allowed = self.users.is_empty() || self.users.iter().any(|u| u == author);
            match reply {
                ThreadReply::Aside => {}
                ThreadReply::Command(command) if !allowed => batch.ignored.push(format!(
                    "{key}: {} by {who} (not in the tracker's users)",
                    command.word()
                )),
                ThreadReply::Command(command) => {
                    let source = index.sources[key].source.clone();
                    match self.command(&source, &message, &command, &bot) {
                        Ok(Some(posted)) => {
                            answered = true;
                            let indexed = index.sources.get_mut(key).expect("listed above");
                            indexed.thread_last = Some(id_of(&posted).to_string());
                            indexed.source.thread.push(posted);
                        }
                        Ok(None) => {}
                        Err(e) => {
                            log::warn!(
                                "chat-b: {} on {key} not carried out (trying again at the next poll): {e}",
                                command.word()
                            );
                            held.insert(issue);
                            let thread = id_of(&index.sources[key].source.root).to_string();
                            next.threads
                                .insert(thread, snowflake(id_of(&message)).saturating_sub(1));
                        }
                    }
                }
                ThreadReply::Steering if !is_wanted => {}
                ThreadReply::Steering if !allowed => batch.ignored.push(format!(
                    "{key}: a reply by {who} (not in the tracker's users)"
                )),
                ThreadReply::Steering => {
                    let text = message_text(&message);
                    if text.is_empty() {
                        continue;
                    }
                    let mid = id_of(&message).to_string();
                    batch.messages.push(Message {
                        issue_id: key.clone(),
                        source: crate::steering::Source::ChatB,
                        author: who,
                        text,
                        at: snowflake_ms(&mid).map(rfc3339_ms).unwrap_or_default(),
                        key: mid,
                    });
                }
            }
        }
        drop(index);
        if answered {
            // The state moved: the next poll reads it, and comes now.
            self.last_scan.clear();
            if let Some(b) = self.background() {
                b.shared.waker.wake();
            }
        }
        batch.cursor = Some(serde_json::to_string(&next).unwrap_or_default());
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use serde_json::json;

    const BOT: &str = "900";

    fn tracker(users: &[&str]) -> ChatB {
        let opts = ChatOptions {
            guild_id: Some("G1".into()),
            channels: vec!["111".into()],
            bot_user_id: Some(BOT.into()),
            users: users.iter().map(|u| u.to_string()).collect(),
            api_key: Secret::new(""),
            app_token: Secret::new(""),
            endpoint: "http://127.0.0.1:9".into(),
            emoji_states: chat::emoji_map(&[("✅", "Done")]),
            marker_emoji: "🤖".into(),
            lookback_days: 0.0,
        };
        ChatB::new(&opts, chat::test_states())
    }

    /// A snowflake `n` ms after now (so it is newer than any floor taken now).
    fn sf(n: u64) -> String {
        (snowflake_at(now_ms() + 60_000 + n) + n).to_string()
    }

    fn msg(id: &str, author: &str, content: &str) -> Value {
        json!({"id": id, "type": 0, "author": {"id": author, "username": format!("u{author}")}, "content": content})
    }

    fn set_thread(t: &ChatB, root: &str, thread: Vec<Value>) {
        let mut index = t.index.lock().unwrap();
        index.sources.insert(
            format!("111:{root}"),
            Indexed {
                source: Source {
                    channel: "111".into(),
                    root: msg(root, "5", "<@900> fix it"),
                    thread,
                },
                thread_last: None,
                refreshed: std::time::Instant::now(),
            },
        );
    }

    fn issue(id: &str) -> Issue {
        crate::tracker::chat::test_issue(id)
    }

    #[test]
    fn people_s_new_replies_steer_and_the_rest_does_not() {
        let t = tracker(&["5", "6"]);
        t.index.lock().unwrap().scan_started_ms = now_ms();
        let root = "1000";
        let old = msg(&sf(1), "5", "written before svc looked");
        set_thread(&t, root, vec![old.clone()]);
        let issues = [issue("111:1000")];
        // The first time: history only.
        let b = t.steering_batch(&issues, None).unwrap();
        assert!(b.messages.is_empty() && b.ignored.is_empty(), "{b:?}");
        let cursor = b.cursor.unwrap();
        let mut edited = old.clone();
        edited["content"] = "edited later".into();
        edited["edited_timestamp"] = "2026-01-01T00:00:01+00:00".into();
        let mut other_bot = msg(&sf(4), "7", "beep");
        other_bot["author"]["bot"] = true.into();
        let mut system = msg(&sf(6), "5", "pinned a message");
        system["type"] = 6.into();
        let mut reply = msg(&sf(8), "6", "and mind the tests");
        reply["type"] = 19.into();
        reply["author"]["global_name"] = "Bob B".into();
        reply["attachments"] = json!([{"filename": "log.txt", "url": "https://cdn/log.txt"}]);
        set_thread(
            &t,
            root,
            vec![
                edited,
                msg(&sf(2), "5", "use tabs"),
                msg(&sf(3), BOT, "Status: In Progress"),
                other_bot,
                msg(&sf(5), "8", "a stranger's idea"),
                system,
                msg(&sf(7), "5", "!aside the bot need not know"),
                reply,
            ],
        );
        let b = t.steering_batch(&issues, Some(&cursor)).unwrap();
        let texts: Vec<(&str, &str)> = b
            .messages
            .iter()
            .map(|m| (m.author.as_str(), m.text.as_str()))
            .collect();
        assert_eq!(
            texts,
            [
                ("u5 (5)", "use tabs"),
                (
                    "Bob B (6)",
                    "and mind the tests\n[attachment log.txt: https://cdn/log.txt]"
                )
            ]
        );
        assert_eq!(b.messages[0].source, crate::steering::Source::ChatB);
        assert_eq!(b.messages[0].issue_id, "111:1000");
        assert_eq!(b.ignored.len(), 2, "{:?}", b.ignored);
        assert!(b.ignored[0].contains("a bot"), "{:?}", b.ignored);
        assert!(b.ignored[1].contains("not in the tracker's users"));
        // Nothing again from the new cursor; a thread first seen now counts from the floor.
        let cursor = b.cursor.unwrap();
        set_thread(&t, "2000", vec![msg(&sf(9), "5", "new issue, new note")]);
        let b = t
            .steering_batch(&[issue("111:1000"), issue("111:2000")], Some(&cursor))
            .unwrap();
        assert_eq!(b.messages.len(), 1, "{b:?}");
        assert_eq!(b.messages[0].text, "new issue, new note");
        // Replies in threads of issues not asked about are not steering.
        let cursor = b.cursor.unwrap();
        set_thread(&t, "2000", vec![msg(&sf(10), "5", "too late")]);
        let b = t.steering_batch(&issues, Some(&cursor)).unwrap();
        assert!(b.messages.is_empty() && b.ignored.is_empty(), "{b:?}");
    }

    #[test]
    fn a_command_the_bot_replied_to_is_answered() {
        let mut answer = msg("3", BOT, "Status: Cancelled\nAsked by <@5> with `!cancel`.");
        answer["type"] = 19.into();
        answer["message_reference"] = json!({"message_id": "2", "channel_id": "1000"});
        let mut by_someone = msg("4", "6", "me too");
        by_someone["message_reference"] = json!({"message_id": "9"});
        let source = Source {
            channel: "111".into(),
            root: msg("1000", "5", "<@900> x"),
            thread: vec![msg("2", "5", "!cancel"), answer, by_someone],
        };
        assert!(ChatB::answered(&source, BOT, "2"));
        assert!(
            !ChatB::answered(&source, BOT, "9"),
            "only the bot's replies"
        );
        assert!(!ChatB::answered(&source, BOT, "4"));
    }
}
