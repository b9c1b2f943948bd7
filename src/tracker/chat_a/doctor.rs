//! `svc doctor --online` for the `chat-a` tracker, beside the provider: the bot token
//! (`auth.test`, its user against `tracker.bot_user_id`) and the bot's membership of every
//! watched channel (`conversations.info`).

use super::ChatA;
use crate::config::ChatOptions;
use crate::tracker::chat::{channel_failed, token_finding};
use crate::tracker::{Finding, FindingLevel};

/// The findings, in order: the token, then each watched channel.
pub fn findings(t: &ChatA, opts: &ChatOptions) -> Vec<Finding> {
    let mut out = vec![token_finding(
        t.auth_test(),
        "user_id",
        opts.bot_user_id.as_deref(),
        "CHAT_A_BOT_USER_ID",
        "check tracker.api_key (a bot token, xoxb-...) and tracker.endpoint",
        |me, user| {
            let team = me["team"].as_str().unwrap_or("?");
            Finding::ok(
                "tracker_online",
                format!("chat-a accepts the bot token (bot user {user} in {team})"),
            )
        },
    )];
    out.extend(opts.channels.iter().map(|channel| match t.channel_info(channel) {
        Ok(info) if info["is_member"] == true => Finding::ok(
            "tracker_channel",
            format!(
                "the bot is a member of #{} ({channel})",
                info["name"].as_str().unwrap_or("?")
            ),
        ),
        Ok(info) => Finding::problem(
            "tracker_channel",
            FindingLevel::Error,
            format!(
                "the bot is not a member of #{} ({channel})",
                info["name"].as_str().unwrap_or("?")
            ),
            "invite it in the channel: /invite @<bot name>",
        ),
        Err(e) => channel_failed(channel, e, "check the channel id and the app's channels:read (groups:read for private channels) scope"),
    }));
    out
}
