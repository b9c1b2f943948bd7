//! The `chat_b` pack: the agent's tools over a Discord message's thread (status replies, the
//! workpad, comments, reading the thread and its channel, the shared query language over tracked
//! messages, user lookups). Every tool first checks for a configured bot user id and fails closed
//! without one; per-issue tools then check the channel is allowed and the message tracked (by a
//! mention or the bot's marker reaction). There is no create-issue tool: a human mentions the bot
//! or uses the message command to track a message. The tools other than the workpad and their
//! dispatch are the shared chat pack's ([`super::chat`]).

use serde_json::{Value, json};

use super::chat::{ChatPack, Texts};
use super::tools::{Pack, ToolResult, ToolSpec, failure, required, schema};
use crate::config::Settings;
use crate::tracker::chat_b::ChatB;
use crate::tracker::chat_b::tools::render_workpad;

pub struct ChatBPack {
    pack: ChatPack<ChatB>,
}

const TEXTS: Texts = Texts {
    issue_id: "The issue id: <channel-id>:<message-id> of the tracked message",
    update_status: (
        "chat_b_update_status",
        "Post the bot's status reply in the issue's thread (for example In Progress or Done); the bot's reactions mirror it. Unknown state names are rejected.",
    ),
    comment: (
        "chat_b_comment",
        "Post a message in the issue's thread (mentions never ping).",
    ),
    read_thread: (
        "chat_b_read_thread",
        "Read the issue's source message, its state (the bot's latest status reply in the thread, else reactions), reactions, permalink and thread messages.",
    ),
    query: (
        "chat_b_query",
        "Query the tracked messages of the allowed channels read-only. Row fields: issueId, channel, messageId, title, state, stateType, labels, text, url (and thread, reactions when expanded).",
    ),
    user_info: ("chat_b_user_info", "Look up a Discord user by id."),
    channel_context: (
        "chat_b_channel_context",
        "The messages around the issue's source message in its channel.",
    ),
};

const WORKPAD: &str = "chat_b_workpad";

impl ChatBPack {
    /// The pack over a chat-b dispatch tracker's options with the `tools.chat_b` keys over
    /// them, or over the slice alone.
    pub fn new(settings: &Settings) -> Option<ChatBPack> {
        let pack = ChatPack::from_settings(settings, "chat_b", &TEXTS, ChatB::new)?;
        Some(ChatBPack { pack })
    }
}

impl Pack for ChatBPack {
    fn specs(&self) -> Vec<ToolSpec> {
        let mut specs = self.pack.specs();
        // Listed after the status tool.
        specs.insert(
            1,
            ToolSpec {
                name: WORKPAD,
                description: "Create or update the issue's workpad: one message in the issue's thread, edited in place on every call. Returns its messageId.",
                input_schema: schema(
                    json!({"issueId": self.pack.issue_id_schema(), "environment": {"type": "string"}, "plan": {"type": "string"}, "acceptanceCriteria": {"type": "string"}, "validationCommands": {"type": "string"}, "progress": {"type": "string"}}),
                    &[
                        "issueId",
                        "environment",
                        "plan",
                        "acceptanceCriteria",
                        "validationCommands",
                    ],
                ),
            },
        );
        specs
    }

    fn call(&self, name: &str, args: &Value) -> Option<ToolResult> {
        if name != WORKPAD {
            return self.pack.call(name, args);
        }
        Some(self.pack.gated(|c| {
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
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::testutil::settings;

    #[test]
    fn the_pack_lists_its_tools_in_the_declared_order() {
        let yaml = "tracker:\n  kind: memory\ntools:\n  chat_b:\n    channels: [\"9\"]";
        let pack = ChatBPack::new(&settings(yaml)).unwrap();
        let names: Vec<&str> = pack.specs().iter().map(|s| s.name).collect();
        let declared = crate::config::PACKS.iter().find(|p| p.name == "chat_b");
        assert_eq!(names, declared.unwrap().tools, "in the declared order");
    }
}
