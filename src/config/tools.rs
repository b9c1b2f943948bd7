//! `tools.<pack>` and the pack registry: each slice read with its provider's validators
//! (`super::tracker`), every built-in pack with the tools it declares, and the packs a workflow
//! mounts (the dispatch tracker's default pack, then every `tools:` key, one flat namespace).

use std::collections::BTreeMap;

use serde_norway::Value;

use super::tracker::{
    GITHUB_KEYS, GITLAB_KEYS, ProviderSection, chat_options, github_options, gitlab_options,
    local_options, tracker_b_options,
};
use super::validate::{Ctx, Section, Style};
use super::*;

/// A `tools.<pack>` slice read like a provider's options (camelCase keys).
fn tool_section<'v>(ctx: &mut Ctx, path: &str, value: &'v Value) -> ProviderSection<'v> {
    let s = Section::read(ctx, path, Some(value), Style::Camel, None);
    let entries = s
        .entries
        .iter()
        .map(|(k, _, v)| (k.clone(), s.key_path(k), *v))
        .collect();
    ProviderSection {
        entries,
        home: path.to_string(),
    }
}

/// `tools:`: one slice per pack, in file order.
pub(super) fn tools(ctx: &mut Ctx, root: &Section) -> Vec<(String, ToolOptions)> {
    let section = root.section(ctx, "tools", Style::Snake, None);
    let mut out = Vec::new();
    for (_, pack, value) in &section.entries {
        let path = format!("tools.{pack}");
        match pack.as_str() {
            "tracker_a" => {
                let s = Section::read(
                    ctx,
                    &path,
                    Some(value),
                    Style::Snake,
                    Some(&["api_key", "endpoint"]),
                );
                let api_key = s.has("api_key").then(|| s.secret(ctx, "api_key", None));
                // Unset stays unset: the pack then follows a tracker-a dispatch tracker's
                // endpoint before the public default (like its credential).
                let endpoint = s.non_empty_string(ctx, "endpoint");
                out.push((pack.clone(), ToolOptions::TrackerA { api_key, endpoint }));
            }
            "local" => {
                let s = Section::read(
                    ctx,
                    &path,
                    Some(value),
                    Style::Camel,
                    Some(&["path", "idPrefix"]),
                );
                let entries = s
                    .entries
                    .iter()
                    .map(|(k, _, v)| (k.clone(), s.key_path(k), *v))
                    .collect();
                let o = ProviderSection {
                    entries,
                    home: path.clone(),
                };
                if let Some(local) = local_options(ctx, &o) {
                    out.push((pack.clone(), ToolOptions::Local(local)));
                }
            }
            "tracker_b" => {
                let o = tool_section(ctx, &path, value);
                o.reject_unknown(
                    ctx,
                    &[
                        "baseUrl",
                        "email",
                        "apiKey",
                        "projectKeys",
                        "jql",
                        "issueType",
                        "assignee",
                    ],
                );
                if let Some(b) = tracker_b_options(ctx, &o, false) {
                    out.push((pack.clone(), ToolOptions::TrackerB(Box::new(b))));
                }
            }
            "github" => {
                let o = tool_section(ctx, &path, value);
                o.reject_unknown(ctx, &GITHUB_KEYS[..GITHUB_KEYS.len() - 3]);
                if let Some(g) = github_options(ctx, &o, false) {
                    out.push((pack.clone(), ToolOptions::Github(Box::new(g))));
                }
            }
            "gitlab" => {
                let o = tool_section(ctx, &path, value);
                o.reject_unknown(ctx, &GITLAB_KEYS[..GITLAB_KEYS.len() - 3]);
                if let Some(g) = gitlab_options(ctx, &o, false) {
                    out.push((pack.clone(), ToolOptions::Gitlab(Box::new(g))));
                }
            }
            "tracker" => ctx.error_with_hint(
                "tools.tracker is not supported",
                "tools.tracker was removed: use tools.tracker_b",
            ),
            "chat_a" | "chat_b" => {
                let o = tool_section(ctx, &path, value);
                let provider = if pack == "chat_a" {
                    Provider::ChatA
                } else {
                    Provider::ChatB
                };
                if let Some(chat) = chat_options(ctx, provider, &o, false) {
                    let keys = o.entries.iter().map(|(k, _, _)| k.clone()).collect();
                    let options = Box::new(chat);
                    out.push((
                        pack.clone(),
                        if provider == Provider::ChatA {
                            ToolOptions::ChatA { options, keys }
                        } else {
                            ToolOptions::ChatB { options, keys }
                        },
                    ));
                }
            }
            _ => ctx.error(format!("{path} is not supported")),
        }
    }
    out
}

/// A tool pack: its name and the tools it declares.
#[derive(Debug, PartialEq, Eq)]
pub struct Pack {
    pub name: &'static str,
    pub tools: &'static [&'static str],
}

/// Every built-in pack.
pub const PACKS: &[Pack] = &[
    Pack {
        name: "tracker_a",
        tools: &["tracker_a_graphql"],
    },
    Pack {
        name: "tracker_b",
        tools: &[
            "tracker_b_read_issue",
            "tracker_b_query",
            "tracker_b_update_status",
            "tracker_b_list_comments",
            "tracker_b_comment",
            "tracker_b_update_comment",
            "tracker_b_create_issue",
        ],
    },
    Pack {
        name: "local",
        tools: &[
            "local_update_status",
            "local_comment",
            "local_create_issue",
            "local_read_issue",
            "local_query",
        ],
    },
    Pack {
        name: "chat_a",
        tools: &[
            "chat_a_update_status",
            "chat_a_comment",
            "chat_a_read_thread",
            "chat_a_query",
            "chat_a_user_info",
            "chat_a_channel_context",
        ],
    },
    Pack {
        name: "chat_b",
        tools: &[
            "chat_b_update_status",
            "chat_b_workpad",
            "chat_b_comment",
            "chat_b_read_thread",
            "chat_b_query",
            "chat_b_user_info",
            "chat_b_channel_context",
        ],
    },
    Pack {
        name: "github",
        tools: &[
            "github_update_status",
            "github_comment",
            "github_read_issue",
            "github_create_issue",
            "github_query",
        ],
    },
    Pack {
        name: "gitlab",
        tools: &[
            "gitlab_update_status",
            "gitlab_comment",
            "gitlab_read_issue",
            "gitlab_create_issue",
            "gitlab_query",
        ],
    },
];

fn default_pack(provider: Provider) -> Option<&'static str> {
    match provider {
        Provider::TrackerA => Some("tracker_a"),
        Provider::TrackerB | Provider::TrackerBMcp => Some("tracker_b"),
        Provider::Local => Some("local"),
        Provider::ChatA => Some("chat_a"),
        Provider::ChatB => Some("chat_b"),
        Provider::Github => Some("github"),
        Provider::Gitlab => Some("gitlab"),
        Provider::Memory => None,
    }
}

/// The packs a workflow mounts: the dispatch tracker's default pack, then every `tools:` key,
/// first-seen wins. Two packs declaring one tool name is an error.
pub fn mounted_packs<'p>(
    provider: Provider,
    tool_keys: impl IntoIterator<Item = &'p str>,
    registry: &'p [Pack],
) -> Result<Vec<&'p Pack>, String> {
    let mut names: Vec<&str> = default_pack(provider).into_iter().collect();
    for key in tool_keys {
        if !names.contains(&key) {
            names.push(key);
        }
    }
    let packs: Vec<&Pack> = names
        .iter()
        .filter_map(|n| registry.iter().find(|p| p.name == *n))
        .collect();
    let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
    for pack in &packs {
        for tool in pack.tools {
            match owner.get(tool) {
                Some(other) if *other != pack.name => {
                    return Err(format!(
                        "tool name collision: {tool} is declared by both the \"{other}\" and \"{}\" packs",
                        pack.name
                    ));
                }
                _ => {
                    owner.insert(tool, pack.name);
                }
            }
        }
    }
    Ok(packs)
}
