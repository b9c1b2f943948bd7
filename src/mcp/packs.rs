//! The pack registry: which tool packs exist and mounting them. Mounting follows the spec: the
//! dispatch tracker's default pack, then every `tools:` key, first seen wins, one flat
//! namespace. Packs are built per request from the current settings, so a hot-reloaded workflow
//! changes the tools at once.
//!
//! **Architecture Invariant:** this is the one place that names every pack. It sits above the
//! packs (`super::tools`, `super::github`, `super::gitlab` and the chat packs `super::chat_a`,
//! `super::chat_b`), and none of them
//! imports it.

use serde_json::{Value, json};

use super::chat_a::ChatAPack;
use super::chat_b::ChatBPack;
use super::github::GithubPack;
use super::gitlab::GitlabPack;
use super::tools::{LocalPack, Pack, ToolResult, ToolSpec, TrackerAPack, TrackerBPack};
use crate::config::{self, Settings};

/// The tools mounted for one request.
pub struct Mounted {
    packs: Vec<Box<dyn Pack>>,
}

impl Mounted {
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.packs.iter().flat_map(|p| p.specs()).collect()
    }

    pub fn call(&self, name: &str, args: &Value) -> ToolResult {
        for p in &self.packs {
            if let Some(result) = p.call(name, args) {
                return result;
            }
        }
        let supported: Vec<&str> = self.specs().iter().map(|s| s.name).collect();
        Err(
            json!({"error": {"message": format!("Unsupported tool: {name}.")}, "supportedTools": supported}),
        )
    }
}

/// Mounts the packs the settings name.
pub fn mount(settings: &Settings) -> Result<Mounted, String> {
    let keys: Vec<&str> = settings.tools.iter().map(|(k, _)| k.as_str()).collect();
    let packs = config::mounted_packs(settings.tracker.provider, keys, config::PACKS)?;
    let mut mounted: Vec<Box<dyn Pack>> = Vec::new();
    for pack in packs {
        match pack.name {
            "local" => mounted.push(Box::new(LocalPack::new(settings))),
            "tracker_a" => mounted.push(Box::new(TrackerAPack::new(settings))),
            "tracker_b" => {
                if let Some(pack) = TrackerBPack::new(settings) {
                    mounted.push(Box::new(pack));
                }
            }
            "chat_a" => {
                if let Some(pack) = ChatAPack::new(settings) {
                    mounted.push(Box::new(pack));
                }
            }
            "chat_b" => {
                if let Some(pack) = ChatBPack::new(settings) {
                    mounted.push(Box::new(pack));
                }
            }
            "github" => {
                if let Some(pack) = GithubPack::new(settings) {
                    mounted.push(Box::new(pack));
                }
            }
            "gitlab" => {
                if let Some(pack) = GitlabPack::new(settings) {
                    mounted.push(Box::new(pack));
                }
            }
            // Packs of trackers this build cannot poll are rejected when the workflow loads.
            _ => {}
        }
    }
    Ok(Mounted { packs: mounted })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::testutil::settings;

    #[test]
    fn mounting_follows_the_dispatch_tracker_then_tools_keys() {
        let names = |yaml: &str| {
            mount(&settings(yaml))
                .unwrap()
                .specs()
                .iter()
                .map(|t| t.name)
                .collect::<Vec<_>>()
        };
        assert!(names("tracker:\n  kind: memory").is_empty());
        assert_eq!(names("tracker:\n  kind: local").len(), 5);
        assert_eq!(
            names("tracker:\n  kind: local\ntools:\n  tracker_a:\n    api_key: k").last(),
            Some(&"tracker_a_graphql")
        );
        assert_eq!(
            names("tracker:\n  kind: memory\ntools:\n  tracker_a: {}\n  local: {}")[0],
            "tracker_a_graphql"
        );
    }
}
