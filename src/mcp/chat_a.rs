//! The `chat_a` pack: the agent's tools over a Slack thread (status replies, comments, reading
//! the thread and its channel, the shared query language over tracked threads, user lookups).
//! Every tool first checks for a configured bot user id and fails closed without one; per-issue
//! tools then check the channel is watched and the message tracked. There is no create-issue
//! tool: only a human @-mention starts an issue. The tools and their dispatch are the shared
//! chat pack's ([`super::chat`]).

use super::chat::{ChatPack, Texts};
use crate::config::Settings;
use crate::tracker::chat_a::ChatA;

pub type ChatAPack = ChatPack<ChatA>;

const TEXTS: Texts = Texts {
    issue_id: "The issue id: <channel>:<ts> of the thread root",
    update_status: (
        "chat_a_update_status",
        "Post the bot's status reply in the issue's thread (for example In Progress or Done); reactions mirror it. Unknown state names are rejected.",
    ),
    comment: ("chat_a_comment", "Reply in the issue's thread."),
    read_thread: (
        "chat_a_read_thread",
        "Read the issue's source message, its thread-derived status, reactions, permalink and replies.",
    ),
    query: (
        "chat_a_query",
        "Query the tracked threads of the watched channels read-only. Row fields: issueId, channel, ts, title, state, stateType, labels, text, url (and thread, reactions when expanded).",
    ),
    user_info: ("chat_a_user_info", "Look up a workspace user by id."),
    channel_context: (
        "chat_a_channel_context",
        "The messages around the issue's source message in its channel.",
    ),
};

impl ChatAPack {
    /// The pack over a chat-a dispatch tracker's options with the `tools.chat_a` keys over
    /// them, or over the slice alone.
    pub fn new(settings: &Settings) -> Option<ChatAPack> {
        ChatPack::from_settings(settings, "chat_a", &TEXTS, ChatA::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::tools::Pack;
    use crate::orchestrator::testutil::settings;

    #[test]
    fn the_pack_lists_its_tools_in_the_declared_order() {
        let yaml = "tracker:\n  kind: memory\ntools:\n  chat_a:\n    channels: [C9]";
        let pack = ChatAPack::new(&settings(yaml)).unwrap();
        let names: Vec<&str> = pack.specs().iter().map(|s| s.name).collect();
        let declared = crate::config::PACKS.iter().find(|p| p.name == "chat_a");
        assert_eq!(names, declared.unwrap().tools, "in the declared order");
    }
}
