//! `svc doctor --online` for the `chat-b` tracker, beside the provider: the bot token (a bot,
//! its user against `tracker.bot_user_id`), the guild, every watched channel (a text or
//! announcement channel of the guild) and the application's MESSAGE CONTENT intent.

use super::ChatB;
use crate::config::ChatOptions;
use crate::tracker::chat::{channel_failed, token_finding};
use crate::tracker::{Finding, FindingLevel, TrackerError};

/// The findings, in order: the token, the guild, each watched channel, the intents.
pub fn findings(t: &ChatB, opts: &ChatOptions) -> Vec<Finding> {
    let mut out = vec![token_finding(
        t.me(),
        "id",
        opts.bot_user_id.as_deref(),
        "CHAT_B_BOT_USER_ID",
        "check tracker.api_key (the bot token) and tracker.endpoint",
        |me, user| {
            let name = me["username"].as_str().unwrap_or("?");
            if me["bot"] != true {
                return Finding::problem(
                    "tracker_online",
                    FindingLevel::Error,
                    format!("the token belongs to {name} ({user}), which is not a bot"),
                    "use the bot token from the Developer Portal (Bot > Reset Token)",
                );
            }
            Finding::ok(
                "tracker_online",
                format!("chat-b accepts the bot token (bot user {user}, {name})"),
            )
        },
    )];
    let guild = opts.guild_id.as_deref().unwrap_or("?");
    out.push(match t.guild() {
        Ok(g) => Finding::ok(
            "tracker_guild",
            format!("the bot is in {} ({guild})", g["name"].as_str().unwrap_or("?")),
        ),
        Err(e) => Finding::problem(
            "tracker_guild",
            FindingLevel::Error,
            format!("guild {guild}: {}", e.message),
            "check tracker.guild_id and invite the bot to the server (OAuth2 URL with the bot and applications.commands scopes)",
        ),
    });
    for channel in &opts.channels {
        out.push(match t.channel_info(channel) {
            Ok(c) if !matches!(c["type"].as_u64(), Some(0 | 5)) => Finding::problem(
                "tracker_channel",
                FindingLevel::Error,
                format!("#{} ({channel}) is not a text or announcement channel", c["name"].as_str().unwrap_or("?")),
                "list text or announcement channels in tracker.channels",
            ),
            Ok(c) if c["guild_id"].as_str().is_some_and(|g| g != guild) => Finding::problem(
                "tracker_channel",
                FindingLevel::Error,
                format!("#{} ({channel}) belongs to another guild", c["name"].as_str().unwrap_or("?")),
                "list channels of tracker.guild_id",
            ),
            Ok(c) => Finding::ok(
                "tracker_channel",
                format!("the bot can see #{} ({channel})", c["name"].as_str().unwrap_or("?")),
            ),
            Err(e) => channel_failed(channel, e, "check the channel id and give the bot View Channel, Send Messages, Send Messages in Threads, Create Public Threads, Add Reactions and Read Message History there"),
        });
    }
    // Application flags: GATEWAY_MESSAGE_CONTENT (1 << 19) or its limited form (1 << 18).
    out.push(match t.api().get("/applications/@me") {
        Ok(app) if app["flags"].as_u64().is_some_and(|f| f & (3 << 18) != 0) => {
            Finding::ok("tracker_intents", "the MESSAGE CONTENT intent is enabled")
        }
        Ok(_) => Finding::problem(
            "tracker_intents",
            FindingLevel::Error,
            "the MESSAGE CONTENT intent is not enabled: message text arrives empty and the Gateway refuses the session (close code 4014)",
            "enable Message Content Intent under Bot > Privileged Gateway Intents in the Discord Developer Portal",
        ),
        Err(e) => Finding::problem(
            "tracker_intents",
            FindingLevel::Warning,
            format!("the intents could not be checked: {}", TrackerError::from(e).message),
            "make sure Message Content Intent is enabled in the Developer Portal",
        ),
    });
    out
}
