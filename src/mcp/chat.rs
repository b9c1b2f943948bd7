//! What the chat packs (`chat_a`, `chat_b`) share: their options (the `tools.chat_x` keys over
//! a chat dispatch tracker's options, or the slice alone), the tools both declare (status
//! updates, comments, reading the thread and its channel, the shared query language over
//! tracked messages, user lookups) and their dispatch. Every tool first checks for a configured
//! bot user id and fails closed without one; the platform ([`ChatTools`]) does the rest.

use serde_json::{Value, json};

use super::query;
use super::tools::{Pack, ToolResult, ToolSpec, failure, query_properties, required, schema};
use crate::config::{ChatOptions, ProviderOptions, Settings, ToolOptions};
use crate::tracker::StateNames;
use crate::tracker::chat::{self, ChatTools, QUERY_DEFAULT};

/// A pack's names and descriptions of the tools every chat pack declares.
pub struct Texts {
    /// What an issue id looks like on the platform.
    pub issue_id: &'static str,
    /// (name, description) of each tool.
    pub update_status: (&'static str, &'static str),
    pub comment: (&'static str, &'static str),
    pub read_thread: (&'static str, &'static str),
    pub query: (&'static str, &'static str),
    pub user_info: (&'static str, &'static str),
    pub channel_context: (&'static str, &'static str),
}

/// A chat pack over the platform's tracker.
pub struct ChatPack<T> {
    pub(super) chat: T,
    texts: &'static Texts,
}

impl<T: ChatTools> ChatPack<T> {
    /// The pack over a chat dispatch tracker's options with the `tools.<pack>` keys over them,
    /// or over the slice alone; `None` when neither is configured.
    pub fn from_settings(
        settings: &Settings,
        pack: &str,
        texts: &'static Texts,
        tracker: impl FnOnce(&ChatOptions, StateNames) -> T,
    ) -> Option<ChatPack<T>> {
        let opts = options(settings, pack)?;
        Some(ChatPack {
            chat: tracker(&opts, StateNames::from_settings(&settings.tracker)),
            texts,
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

    /// `tool` once the fail-closed gate (a configured bot user id) passed.
    pub fn gated(&self, tool: impl FnOnce(&T) -> ToolResult) -> ToolResult {
        self.chat.bot().map_err(failure)?;
        tool(&self.chat)
    }

    /// The schema of an issue id argument.
    pub fn issue_id_schema(&self) -> Value {
        json!({"type": "string", "description": self.texts.issue_id})
    }
}

/// The options of the `tools.<pack>` slice over a chat dispatch tracker of the same platform.
fn options(settings: &Settings, pack: &str) -> Option<ChatOptions> {
    let from_tools = match settings.tool(pack) {
        Some(ToolOptions::ChatA { options, keys } | ToolOptions::ChatB { options, keys }) => {
            Some((options, keys))
        }
        _ => None,
    };
    let base = match (pack, &settings.tracker.options) {
        ("chat_a", ProviderOptions::ChatA(base)) | ("chat_b", ProviderOptions::ChatB(base)) => {
            Some(base)
        }
        _ => None,
    };
    match (from_tools, base) {
        (Some((slice, keys)), Some(base)) => Some(overlay(base, slice, keys)),
        (Some((slice, _)), None) => Some((**slice).clone()),
        (None, Some(base)) => Some(base.clone()),
        (None, None) => None,
    }
}

/// `base` with the keys a `tools.chat_x` slice set taken from the slice (each platform's
/// configuration accepts only its own keys).
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
            "replyLookbackDays" | "scanLookbackDays" => out.lookback_days = slice.lookback_days,
            "guildId" => out.guild_id = slice.guild_id.clone(),
            "users" => out.users = slice.users.clone(),
            _ => {}
        }
    }
    out
}

impl<T: ChatTools + Send + Sync> Pack for ChatPack<T> {
    fn specs(&self) -> Vec<ToolSpec> {
        let t = self.texts;
        let id = self.issue_id_schema();
        let mut q = query_properties();
        q.insert(
            "channels".into(),
            json!({"type": "array", "items": {"type": "string"}, "description": "Channel ids (intersected with the watched channels; default all of them)"}),
        );
        q.insert(
            "expand".into(),
            json!({"type": "array", "items": {"type": "string", "enum": ["thread", "reactions"]}}),
        );
        let spec = |(name, description): (&'static str, &'static str), input_schema| ToolSpec {
            name,
            description,
            input_schema,
        };
        vec![
            spec(
                t.update_status,
                schema(
                    json!({"issueId": id, "status": {"type": "string"}}),
                    &["issueId", "status"],
                ),
            ),
            spec(
                t.comment,
                schema(
                    json!({"issueId": id, "body": {"type": "string"}}),
                    &["issueId", "body"],
                ),
            ),
            spec(t.read_thread, schema(json!({"issueId": id}), &["issueId"])),
            spec(t.query, schema(Value::Object(q), &[])),
            spec(
                t.user_info,
                schema(json!({"userId": {"type": "string"}}), &["userId"]),
            ),
            spec(
                t.channel_context,
                schema(
                    json!({"issueId": id, "before": {"type": "integer", "minimum": 0, "maximum": 50, "description": "Default 10"}, "after": {"type": "integer", "minimum": 0, "maximum": 50, "description": "Default 10"}}),
                    &["issueId"],
                ),
            ),
        ]
    }

    fn call(&self, name: &str, args: &Value) -> Option<ToolResult> {
        let t = self.texts;
        let result = match name {
            n if n == t.query.0 => self.query(args),
            n if n == t.update_status.0 => self.gated(|c| {
                let status = c
                    .update_status(required(args, "issueId")?, required(args, "status")?)
                    .map_err(failure)?;
                Ok(json!({"ok": true, "status": status}))
            }),
            n if n == t.comment.0 => self.gated(|c| {
                c.comment(required(args, "issueId")?, required(args, "body")?)
                    .map_err(failure)?;
                Ok(json!({"ok": true}))
            }),
            n if n == t.read_thread.0 => {
                self.gated(|c| c.read_thread(required(args, "issueId")?).map_err(failure))
            }
            n if n == t.user_info.0 => self.gated(|c| {
                Ok(json!({"user": c.user_info(required(args, "userId")?).map_err(failure)?}))
            }),
            n if n == t.channel_context.0 => self.gated(|c| {
                let id = required(args, "issueId")?;
                let (before, after) = chat::context_window(args).map_err(failure)?;
                c.channel_context(id, before, after).map_err(failure)
            }),
            _ => return None,
        };
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::testutil::settings;
    use crate::tracker::chat_a::ChatA;
    use crate::tracker::chat_b::ChatB;

    /// Names and descriptions for packs built here; each pack's own are tested with the pack.
    const TEXTS: Texts = Texts {
        issue_id: "id",
        update_status: ("update_status", ""),
        comment: ("comment", ""),
        read_thread: ("read_thread", ""),
        query: ("query", ""),
        user_info: ("user_info", ""),
        channel_context: ("channel_context", ""),
    };

    /// The pack of a dispatch tracker and a `tools` slice (`yaml`), and of the slice alone
    /// (`alone`); none without either.
    fn packs<T>(
        new: impl Fn(&Settings) -> Option<ChatPack<T>>,
        yaml: &str,
        alone: &str,
    ) -> (ChatPack<T>, ChatPack<T>) {
        assert!(new(&settings("tracker:\n  kind: memory")).is_none());
        (
            new(&settings(yaml)).unwrap(),
            new(&settings(alone)).unwrap(),
        )
    }

    #[test]
    fn a_tools_slice_overrides_the_dispatch_tracker_key_by_key() {
        let (over, alone) = packs(
            |s| ChatPack::from_settings(s, "chat_a", &TEXTS, ChatA::new),
            "tracker:\n  kind: chat-a\n  channels: [C1]\n  bot_user_id: UBOT\n  api_key: xoxb-dispatch\ntools:\n  chat_a:\n    api_key: xoxb-tools\n    channels: [C2]",
            "tracker:\n  kind: memory\ntools:\n  chat_a:\n    channels: [C9]",
        );
        assert_eq!(over.chat.channels(), ["C2"]);
        assert_eq!(
            over.chat.bot().unwrap(),
            "UBOT",
            "kept from the dispatch tracker"
        );
        assert_eq!(alone.chat.channels(), ["C9"]);
        assert!(alone.chat.bot().is_err());

        let (over, alone) = packs(
            |s| ChatPack::from_settings(s, "chat_b", &TEXTS, ChatB::new),
            "tracker:\n  kind: chat-b\n  guild_id: G1\n  channels: [\"1\"]\n  bot_user_id: \"900\"\n  api_key: dispatch\ntools:\n  chat_b:\n    api_key: tools\n    channels: [\"2\"]",
            "tracker:\n  kind: memory\ntools:\n  chat_b:\n    channels: [\"9\"]",
        );
        assert_eq!(over.chat.channels(), ["2"]);
        assert_eq!(
            over.chat.bot().unwrap(),
            "900",
            "kept from the dispatch tracker"
        );
        assert_eq!(over.chat.guild_id(), Some("G1"));
        assert_eq!(alone.chat.channels(), ["9"]);
        assert!(alone.chat.bot().is_err());
    }
}
