//! The `chat_b` pack: the agent's tools over a Discord message's thread (status replies, the
//! workpad, comments, reading the thread and its channel, the shared query language over tracked
//! messages, user lookups). Every tool first checks for a configured bot user id and fails closed
//! without one; per-issue tools then check the channel is allowed and the message tracked (by a
//! mention or the bot's marker reaction). There is no create-issue tool: a human mentions the bot
//! or uses the message command to track a message.

use serde_json::{Value, json};

use super::query;
use super::tools::{Pack, ToolResult, ToolSpec, failure, query_properties, required, schema};
use crate::config::{ChatOptions, ProviderOptions, Settings, ToolOptions};
use crate::tracker::StateNames;
use crate::tracker::chat::{self, ChatTools, QUERY_DEFAULT};
use crate::tracker::chat_b::ChatB;
use crate::tracker::chat_b::tools::render_workpad;

pub struct ChatBPack {
    chat: ChatB,
}

impl ChatBPack {
    /// The pack over a chat-b dispatch tracker's options with the `tools.chat_b` keys over
    /// them, or over the slice alone.
    pub fn new(settings: &Settings) -> Option<ChatBPack> {
        let from_tools = settings
            .tools
            .iter()
            .find_map(|(k, o)| match (k.as_str(), o) {
                ("chat_b", ToolOptions::ChatB { options, keys }) => Some((options, keys)),
                _ => None,
            });
        let opts = match (from_tools, &settings.tracker.options) {
            (Some((slice, keys)), ProviderOptions::ChatB(base)) => overlay(base, slice, keys),
            (Some((slice, _)), _) => (**slice).clone(),
            (None, ProviderOptions::ChatB(base)) => base.clone(),
            _ => return None,
        };
        Some(ChatBPack {
            chat: ChatB::new(&opts, StateNames::from_settings(&settings.tracker)),
        })
    }

    fn query(&self, args: &Value) -> ToolResult {
        self.chat.bot().map_err(failure)?;
        let q = query::parse(args).map_err(failure)?;
        let requested: Option<Vec<String>> = match args.get("channels") {
            None | Some(Value::Null) => None,
            Some(Value::Array(list)) => Some(
                list.iter()
                    .map(|c| c.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| failure("'channels' must be an array of channel ids"))?,
            ),
            Some(_) => return Err(failure("'channels' must be an array of channel ids")),
        };
        let channels = chat::intersect_channels(requested.as_deref(), self.chat.channels());
        if channels.is_empty() {
            return Err(failure(
                "none of the requested channels is watched (tracker.channels)",
            ));
        }
        let mut expand = Vec::new();
        match args.get("expand") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                for e in list {
                    match e.as_str() {
                        Some(name @ ("thread" | "reactions")) => expand.push(name.to_string()),
                        _ => return Err(failure("'expand' accepts thread and reactions")),
                    }
                }
            }
            Some(_) => return Err(failure("'expand' must be an array")),
        }
        let records = self
            .chat
            .query_rows(
                &channels,
                expand.iter().any(|e| e == "thread"),
                expand.iter().any(|e| e == "reactions"),
            )
            .map_err(failure)?;
        // Expanded fields are part of the answer whatever the projection.
        let mut select: Vec<String> = q
            .select
            .clone()
            .unwrap_or_else(|| QUERY_DEFAULT.iter().map(|s| s.to_string()).collect());
        for e in expand {
            if !select.contains(&e) {
                select.push(e);
            }
        }
        let q = query::Query {
            select: Some(select),
            ..q
        };
        let (rows, total) = query::run(records, &q, QUERY_DEFAULT);
        Ok(json!({"rows": rows, "total": total}))
    }
}

/// `base` with the keys a `tools.chat_b` slice set taken from the slice.
fn overlay(base: &ChatOptions, slice: &ChatOptions, keys: &[String]) -> ChatOptions {
    let mut out = base.clone();
    for key in keys {
        match key.as_str() {
            "channels" => out.channels = slice.channels.clone(),
            "botUserId" => out.bot_user_id = slice.bot_user_id.clone(),
            "apiKey" => out.api_key = slice.api_key.clone(),
            "endpoint" => out.endpoint = slice.endpoint.clone(),
            "emojiStates" => out.emoji_states = slice.emoji_states.clone(),
            "markerEmoji" => out.marker_emoji = slice.marker_emoji.clone(),
            "scanLookbackDays" => out.lookback_days = slice.lookback_days,
            "guildId" => out.guild_id = slice.guild_id.clone(),
            "users" => out.users = slice.users.clone(),
            _ => {}
        }
    }
    out
}

impl Pack for ChatBPack {
    fn specs(&self) -> Vec<ToolSpec> {
        let id = json!({"type": "string", "description": "The issue id: <channel-id>:<message-id> of the tracked message"});
        let mut q = query_properties();
        q.insert(
            "channels".into(),
            json!({"type": "array", "items": {"type": "string"}, "description": "Channel ids (intersected with the watched channels; default all of them)"}),
        );
        q.insert(
            "expand".into(),
            json!({"type": "array", "items": {"type": "string", "enum": ["thread", "reactions"]}}),
        );
        vec![
            ToolSpec {
                name: "chat_b_update_status",
                description: "Post the bot's status reply in the issue's thread (for example In Progress or Done); the bot's reactions mirror it. Unknown state names are rejected.",
                input_schema: schema(
                    json!({"issueId": id, "status": {"type": "string"}}),
                    &["issueId", "status"],
                ),
            },
            ToolSpec {
                name: "chat_b_workpad",
                description: "Create or update the issue's workpad: one message in the issue's thread, edited in place on every call. Returns its messageId.",
                input_schema: schema(
                    json!({"issueId": id, "environment": {"type": "string"}, "plan": {"type": "string"}, "acceptanceCriteria": {"type": "string"}, "validationCommands": {"type": "string"}, "progress": {"type": "string"}}),
                    &[
                        "issueId",
                        "environment",
                        "plan",
                        "acceptanceCriteria",
                        "validationCommands",
                    ],
                ),
            },
            ToolSpec {
                name: "chat_b_comment",
                description: "Post a message in the issue's thread (mentions never ping).",
                input_schema: schema(
                    json!({"issueId": id, "body": {"type": "string"}}),
                    &["issueId", "body"],
                ),
            },
            ToolSpec {
                name: "chat_b_read_thread",
                description: "Read the issue's source message, its state (the bot's latest status reply in the thread, else reactions), reactions, permalink and thread messages.",
                input_schema: schema(json!({"issueId": id}), &["issueId"]),
            },
            ToolSpec {
                name: "chat_b_query",
                description: "Query the tracked messages of the allowed channels read-only. Row fields: issueId, channel, messageId, title, state, stateType, labels, text, url (and thread, reactions when expanded).",
                input_schema: schema(Value::Object(q), &[]),
            },
            ToolSpec {
                name: "chat_b_user_info",
                description: "Look up a Discord user by id.",
                input_schema: schema(json!({"userId": {"type": "string"}}), &["userId"]),
            },
            ToolSpec {
                name: "chat_b_channel_context",
                description: "The messages around the issue's source message in its channel.",
                input_schema: schema(
                    json!({"issueId": id, "before": {"type": "integer", "minimum": 0, "maximum": 50, "description": "Default 10"}, "after": {"type": "integer", "minimum": 0, "maximum": 50, "description": "Default 10"}}),
                    &["issueId"],
                ),
            },
        ]
    }

    fn call(&self, name: &str, args: &Value) -> Option<ToolResult> {
        let c = &self.chat;
        let result = match name {
            "chat_b_update_status" => (|| {
                c.bot().map_err(failure)?;
                let status = c
                    .update_status(required(args, "issueId")?, required(args, "status")?)
                    .map_err(failure)?;
                Ok(json!({"ok": true, "status": status}))
            })(),
            "chat_b_workpad" => (|| {
                c.bot().map_err(failure)?;
                let id = required(args, "issueId")?;
                let text = render_workpad(
                    required(args, "environment")?,
                    required(args, "plan")?,
                    required(args, "acceptanceCriteria")?,
                    required(args, "validationCommands")?,
                    args.get("progress").and_then(Value::as_str),
                );
                let message_id = c.workpad(id, &text).map_err(failure)?;
                Ok(json!({"ok": true, "messageId": message_id}))
            })(),
            "chat_b_comment" => (|| {
                c.bot().map_err(failure)?;
                c.comment(required(args, "issueId")?, required(args, "body")?)
                    .map_err(failure)?;
                Ok(json!({"ok": true}))
            })(),
            "chat_b_read_thread" => (|| {
                c.bot().map_err(failure)?;
                c.read_thread(required(args, "issueId")?).map_err(failure)
            })(),
            "chat_b_query" => self.query(args),
            "chat_b_user_info" => (|| {
                c.bot().map_err(failure)?;
                Ok(json!({"user": c.user_info(required(args, "userId")?).map_err(failure)?}))
            })(),
            "chat_b_channel_context" => (|| {
                c.bot().map_err(failure)?;
                let id = required(args, "issueId")?;
                let (before, after) = chat::context_window(args).map_err(failure)?;
                c.channel_context(id, before, after).map_err(failure)
            })(),
            _ => return None,
        };
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::testutil::settings;

    #[test]
    fn a_tools_slice_overrides_the_dispatch_tracker_key_by_key() {
        let s = settings(
            "tracker:\n  kind: chat-b\n  guild_id: G1\n  channels: [\"1\"]\n  bot_user_id: \"900\"\n  api_key: dispatch\ntools:\n  chat_b:\n    api_key: tools\n    channels: [\"2\"]",
        );
        let pack = ChatBPack::new(&s).unwrap();
        assert_eq!(pack.chat.channels(), ["2"]);
        assert_eq!(
            pack.chat.bot().unwrap(),
            "900",
            "kept from the dispatch tracker"
        );
        assert_eq!(pack.chat.guild_id(), Some("G1"));
        let alone = settings("tracker:\n  kind: memory\ntools:\n  chat_b:\n    channels: [\"9\"]");
        let pack = ChatBPack::new(&alone).unwrap();
        assert_eq!(pack.chat.channels(), ["9"]);
        assert!(pack.chat.bot().is_err());
        assert!(ChatBPack::new(&settings("tracker:\n  kind: memory")).is_none());
        assert!(pack.specs().iter().any(|s| s.name == "chat_b_workpad"));
    }
}
