//! chat-a as a steering source: a person's reply in a tracked thread (`conversations.replies`)
//! is a message for the issue's agent, and a chat command (`!cancel`, `!done`, `!reopen`,
//! `!status <State>`) moves the issue with the bot's status reply.
//!
//! What counts: replies by people (a `user`, no `bot_id`, not `bot_message`), plain or with
//! the subtypes people write (`thread_broadcast`, `file_share`, `me_message`), never system
//! subtypes (`channel_join` and the like), never the bot's own, never the thread root; authors
//! on `users` when it is set. A reply is new when its `ts` is above the thread's last `ts` in the
//! cursor; an edit keeps its `ts` (Slack marks it `edited`) and so is never new. A thread the
//! cursor does not know yet counts what was written after the last poll's scan started. The
//! first time (no cursor) delivers nothing: what is there is history.
//!
//! A command is answered once: the bot's answer carries the command's `ts` in its message
//! metadata (`svc_command`), and a command the thread already holds an answer to is not answered
//! again (after a restart that lost the cursor's last step, say).

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::*;
use crate::steering::{Batch, Message};
use crate::tracker::chat::{Command, ThreadReply};

/// Names kept from `users.info` at most (then the cache starts afresh).
const NAMES_MAX: usize = 1000;

/// The source's cursor: per issue (`<channel>:<ts>`), the `ts` of the last reply taken; `floor`
/// the time (`ts` form) the poll's scan started, for threads seen for the first time at the next.
#[derive(Default, Serialize, Deserialize)]
struct Cursor {
    floor: String,
    threads: BTreeMap<String, String>,
}

/// Subtypes of messages people write; any other subtype is a system message.
fn is_person_message(m: &Value) -> bool {
    match m["subtype"].as_str() {
        None => true,
        Some(s) => matches!(s, "thread_broadcast" | "file_share" | "me_message"),
    }
}

fn ms_ts(ms: u64) -> String {
    format!("{}.{:06}", ms / 1000, (ms % 1000) * 1000)
}

impl ChatA {
    /// A person's name for messages: their display name (else real name, else handle) with
    /// their id; the id alone when `users.info` cannot tell.
    fn person(&self, user: &str) -> String {
        if let Some(n) = self
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(user)
        {
            return n.clone();
        }
        let name = match self.api.get("users.info", &[("user", user)]) {
            Ok(v) => {
                let u = &v["user"];
                [
                    u.pointer("/profile/display_name"),
                    u.get("real_name"),
                    u.pointer("/profile/real_name"),
                    u.get("name"),
                ]
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .find(|n| !n.trim().is_empty())
                .map(|n| format!("{} ({user})", n.trim()))
            }
            Err(e) => {
                log::debug!(
                    "chat-a: users.info {user}: {}",
                    TrackerError::from(e).message
                );
                None
            }
        };
        let Some(name) = name else {
            return user.to_string();
        };
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if names.len() >= NAMES_MAX {
            names.clear();
        }
        names.insert(user.to_string(), name.clone());
        name
    }

    /// Whether the bot already answered the command `ts` in the thread.
    fn answered(thread: &Thread, bot: &str, ts: &str) -> bool {
        thread.replies.iter().any(|r| {
            r["user"] == bot
                && r.pointer("/metadata/event_payload/svc_command")
                    .and_then(Value::as_str)
                    == Some(ts)
        })
    }

    /// Carries out a chat command: the bot's status reply naming who asked, with the reactions
    /// mirrored; or, for a state it cannot take, an answer saying why. Whether the bot posted.
    fn command(
        &self,
        thread: &Thread,
        message: &Value,
        command: &Command,
        who: &str,
        bot: &str,
    ) -> Result<bool, String> {
        let ts = ts_of(message);
        if Self::answered(thread, bot, ts) {
            return Ok(false);
        }
        let id = ChatIssueId {
            channel: thread.channel.clone(),
            message: ts_of(&thread.root).to_string(),
        };
        match self.config.command_state(command) {
            Ok(state) => {
                self.reply_once(
                    &id,
                    &chat::command_status_text(&state, who, command),
                    STATUS_EVENT,
                    json!({"status": state, "svc_command": ts}),
                )?;
                if let Err(e) = self.mirror_reactions(&id, &thread.root, bot, &state) {
                    log::warn!("chat-a: reactions of {} not mirrored: {e}", id.render());
                }
                log::info!(
                    "chat-a: {who} asked for {state} on {} ({})",
                    id.render(),
                    command.word()
                );
            }
            Err(why) => self.reply_once(
                &id,
                &format!("{who}: {why}"),
                COMMENT_EVENT,
                json!({"svc_command": ts}),
            )?,
        }
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id.render());
        Ok(true)
    }

    /// See [`Tracker::steering`]: the replies people wrote in tracked threads since `cursor`,
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
        let (started, mut threads) = self
            .last_tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // Issues asked about that the scan did not track (a running issue outside the window):
        // read now.
        for issue in issues {
            let known = threads.iter().any(|t| {
                ChatIssueId {
                    channel: t.channel.clone(),
                    message: ts_of(&t.root).to_string(),
                }
                .render()
                    == issue.id
            });
            if !known
                && let Ok(id) = self.config.watched(&issue.id)
                && let Some(t) = self.thread(&id)?
                && self.tracked(&t, &bot, None)
            {
                threads.push(t);
            }
        }
        let wanted: HashSet<&str> = issues.iter().map(|i| i.id.as_str()).collect();
        let floor = if ts_order(&before.floor) > ts_order(&ms_ts(started)) {
            before.floor.clone()
        } else {
            ms_ts(started)
        };
        let mut next = Cursor {
            floor,
            threads: BTreeMap::new(),
        };
        let mut batch = Batch::default();
        let mut answered = false;
        for thread in &threads {
            let key = format!("{}:{}", thread.channel, ts_of(&thread.root));
            let newest = thread
                .replies
                .iter()
                .map(ts_of)
                .max_by_key(|t| ts_order(t))
                .unwrap_or_default()
                .to_string();
            let from = match before.threads.get(&key) {
                Some(last) => last.clone(),
                None if first => newest.clone(),
                None => before.floor.clone(),
            };
            let mut upto = if ts_order(&newest) > ts_order(&from) {
                newest
            } else {
                from.clone()
            };
            let mut new: Vec<&Value> = thread
                .replies
                .iter()
                .filter(|r| ts_order(ts_of(r)) > ts_order(&from) && ts_of(r) != ts_of(&thread.root))
                .collect();
            new.sort_by_key(|r| ts_order(ts_of(r)));
            let is_wanted = wanted.contains(key.as_str());
            for m in new {
                let user = m["user"].as_str().unwrap_or_default();
                if user.is_empty() || user == bot || !is_person_message(m) && !is_bot_message(m) {
                    continue;
                }
                let reply = chat::classify_reply(text_of(m));
                let counts = is_wanted || matches!(reply, ThreadReply::Command(_));
                if is_bot_message(m) {
                    if counts {
                        batch
                            .ignored
                            .push(format!("{key}: a reply by {user}, a bot (chat-a)"));
                    }
                    continue;
                }
                if matches!(reply, ThreadReply::Aside) || !counts {
                    continue;
                }
                let who = self.person(user);
                if !self.by_allowed_person(m, &bot) {
                    let what = match &reply {
                        ThreadReply::Command(c) => c.word(),
                        _ => "a reply".to_string(),
                    };
                    batch.ignored.push(format!(
                        "{key}: {what} by {who} (not in the tracker's users)"
                    ));
                    continue;
                }
                match reply {
                    ThreadReply::Command(command) => {
                        match self.command(thread, m, &command, &who, &bot) {
                            Ok(posted) => answered |= posted,
                            Err(e) => {
                                log::warn!(
                                    "chat-a: {} on {key} not carried out (trying again at the next poll): {e}",
                                    command.word()
                                );
                                // This thread's later replies wait with the command.
                                upto = prev_ts(ts_of(m));
                                break;
                            }
                        }
                    }
                    _ => {
                        let text = text_of(m).trim().to_string();
                        if text.is_empty() {
                            continue;
                        }
                        batch.messages.push(Message {
                            issue_id: key.clone(),
                            source: crate::steering::Source::ChatA,
                            author: who,
                            text,
                            at: ts_rfc3339(ts_of(m)).unwrap_or_default(),
                            key: format!("{}:{}", thread.channel, ts_of(m)),
                        });
                    }
                }
            }
            next.threads.insert(key, upto);
        }
        if answered {
            // The state moved: the next poll reads it, and comes now.
            self.last_scan.clear();
            let wake = self.wake.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some(w) = wake {
                w();
            }
        }
        batch
            .messages
            .sort_by_key(|m| m.key.split_once(':').map_or(0, |(_, ts)| ts_order(ts)));
        batch.cursor = Some(serde_json::to_string(&next).unwrap_or_default());
        Ok(batch)
    }
}

/// The `ts` just before `ts` (one microsecond earlier).
fn prev_ts(ts: &str) -> String {
    let n = ts_order(ts).saturating_sub(1);
    format!("{}.{:06}", n / 1_000_000, n % 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn tracker(users: &[&str]) -> ChatA {
        let opts = ChatOptions {
            guild_id: None,
            channels: vec!["C1".into()],
            bot_user_id: Some("UBOT".into()),
            users: users.iter().map(|u| u.to_string()).collect(),
            api_key: Secret::new(""),
            app_token: Secret::new(""),
            endpoint: "http://127.0.0.1:9".into(),
            emoji_states: chat::emoji_map(&[("white_check_mark", "Done")]),
            marker_emoji: "robot_face".into(),
            lookback_days: 2.0,
        };
        let t = ChatA::new(&opts, chat::test_states());
        let mut names = t.names.lock().unwrap();
        for u in ["U1", "U2", "U3", "UX"] {
            names.insert(u.into(), format!("{} ({u})", u.to_lowercase()));
        }
        drop(names);
        t
    }

    /// A `ts` `n` ms after now (newer than any floor taken now).
    fn ts(n: u64) -> String {
        ms_ts(now_ms() + 60_000 + n)
    }

    fn set_thread(t: &ChatA, root: &str, replies: Vec<Value>) {
        let mut tracked = t.last_tracked.lock().unwrap();
        tracked.0 = now_ms();
        tracked.1.retain(|th| ts_of(&th.root) != root);
        tracked.1.push(Thread {
            channel: "C1".into(),
            root: json!({"ts": root, "user": "U1", "text": "<@UBOT> fix it"}),
            replies,
        });
    }

    fn issue(id: &str) -> Issue {
        crate::tracker::chat::test_issue(id)
    }

    #[test]
    fn ts_values_order_exactly() {
        assert!(ts_order("1700000000.000100") > ts_order("1700000000.000099"));
        assert_eq!(ts_order("1700000000.1"), 1_700_000_000_100_000);
        assert_eq!(ts_order("junk"), 0);
        assert_eq!(prev_ts("1700000000.000100"), "1700000000.000099");
        assert_eq!(ms_ts(1_700_000_000_123), "1700000000.123000");
    }

    #[test]
    fn people_s_new_replies_steer_and_the_rest_does_not() {
        let t = tracker(&["U1", "U2"]);
        let root = "1000.000001";
        let old = json!({"ts": ts(1), "user": "U1", "text": "before svc looked"});
        set_thread(&t, root, vec![old.clone()]);
        let issues = [issue(&format!("C1:{root}"))];
        let b = t.steering_batch(&issues, None).unwrap();
        assert!(b.messages.is_empty() && b.ignored.is_empty(), "{b:?}");
        let cursor = b.cursor.unwrap();
        let mut edited = old.clone();
        edited["text"] = "edited later".into();
        edited["edited"] = json!({"user": "U1", "ts": ts(20)});
        set_thread(
            &t,
            root,
            vec![
                edited,
                json!({"ts": ts(2), "user": "U1", "text": "use tabs"}),
                json!({"ts": ts(3), "user": "UBOT", "bot_id": "B1", "text": "Status: In Progress"}),
                json!({"ts": ts(4), "user": "UX", "bot_id": "B9", "text": "beep"}),
                json!({"ts": ts(5), "user": "U3", "text": "a stranger's idea"}),
                json!({"ts": ts(6), "user": "U2", "subtype": "channel_join", "text": "joined"}),
                json!({"ts": ts(7), "user": "U1", "text": "!aside the bot need not know"}),
                json!({"ts": ts(8), "user": "U2", "subtype": "thread_broadcast", "text": "and mind the tests"}),
            ],
        );
        let b = t.steering_batch(&issues, Some(&cursor)).unwrap();
        let got: Vec<(&str, &str)> = b
            .messages
            .iter()
            .map(|m| (m.author.as_str(), m.text.as_str()))
            .collect();
        assert_eq!(
            got,
            [("u1 (U1)", "use tabs"), ("u2 (U2)", "and mind the tests")]
        );
        assert_eq!(b.messages[0].source, crate::steering::Source::ChatA);
        assert_eq!(b.messages[0].issue_id, format!("C1:{root}"));
        assert_eq!(b.ignored.len(), 2, "{:?}", b.ignored);
        assert!(b.ignored[0].contains("a bot"));
        assert!(b.ignored[1].contains("u3 (U3)") && b.ignored[1].contains("users"));
        // Nothing twice; a thread first seen now counts from the last scan's start.
        let cursor = b.cursor.unwrap();
        set_thread(
            &t,
            "2000.000001",
            vec![json!({"ts": ts(9), "user": "U2", "text": "new issue, new note"})],
        );
        let both = [issue(&format!("C1:{root}")), issue("C1:2000.000001")];
        let b = t.steering_batch(&both, Some(&cursor)).unwrap();
        assert_eq!(b.messages.len(), 1, "{b:?}");
        assert_eq!(b.messages[0].text, "new issue, new note");
        // A cursor it cannot read is no cursor: history.
        let b = t.steering_batch(&both, Some("garbage")).unwrap();
        assert!(b.messages.is_empty(), "{b:?}");
    }

    #[test]
    fn requesters_are_people_on_the_list() {
        let t = tracker(&["U1"]);
        let m = |user: &str| json!({"ts": "1.0", "user": user, "text": "<@UBOT> do it"});
        assert!(t.human_mention(&m("U1"), "UBOT"));
        assert!(!t.human_mention(&m("U2"), "UBOT"), "not on users");
        let anyone = tracker(&[]);
        assert!(anyone.human_mention(&m("U2"), "UBOT"));
        let mut bot = m("U2");
        bot["bot_id"] = "B2".into();
        assert!(!anyone.human_mention(&bot, "UBOT"), "bots never request");
        let a = json!({"ts": "9.0", "user": "UBOT", "metadata": {"event_payload": {"svc_command": "5.0"}}});
        let th = Thread {
            channel: "C1".into(),
            root: m("U1"),
            replies: vec![a],
        };
        assert!(ChatA::answered(&th, "UBOT", "5.0"));
        assert!(!ChatA::answered(&th, "UBOT", "6.0"));
    }
}
