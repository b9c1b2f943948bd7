//! The tracker interface: three questions the orchestrator asks of any issue tracker, the
//! normalized issue record every provider returns, and the providers themselves.

pub mod chat;
pub mod chat_a;
pub mod chat_b;
pub mod comments;
pub mod forge;
pub mod github;
pub mod gitlab;
pub mod http;
pub mod local;
pub mod memory;
pub mod rate;
pub mod rest;
pub mod rework;
pub mod tracker_a;
pub mod tracker_b;
pub mod tracker_b_mcp;
pub mod ws;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::config::{Provider, ProviderOptions, TrackerSettings};
use crate::env::Env;

/// An issue as tools, queries, templates and the orchestrator see it, whatever the tracker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Issue {
    pub id: String,
    pub identifier: String,
    pub title: String,
    pub description: Option<String>,
    pub state: String,
    pub state_type: Option<String>,
    pub labels: Vec<String>,
    pub url: Option<String>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
    /// Lower numbers dispatch first; `None` sorts last.
    pub priority: Option<i64>,
    /// The issues that block this one, each with its state as the tracker reported it with
    /// this record (empty when the tracker has none or cannot say).
    #[serde(default)]
    pub blocked_by: Vec<Blocker>,
}

/// An issue that blocks another (`blockedBy` of the record that waits for it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocker {
    pub id: String,
    pub identifier: String,
    /// The blocker's state when the tracker answered.
    pub state: String,
}

/// What went wrong talking to a tracker. Messages never carry credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackerError {
    pub kind: TrackerErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrackerErrorKind {
    /// The tracker cannot be used as configured (fix the workflow or environment).
    Config,
    /// The tracker could not be reached or answered with an error.
    Unavailable,
    /// The issue does not exist.
    NotFound,
    /// The request itself is wrong (bad argument).
    Invalid,
}

impl TrackerError {
    pub fn config(message: impl Into<String>) -> TrackerError {
        TrackerError {
            kind: TrackerErrorKind::Config,
            message: message.into(),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> TrackerError {
        TrackerError {
            kind: TrackerErrorKind::Unavailable,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> TrackerError {
        TrackerError {
            kind: TrackerErrorKind::NotFound,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> TrackerError {
        TrackerError {
            kind: TrackerErrorKind::Invalid,
            message: message.into(),
        }
    }
}

impl fmt::Display for TrackerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TrackerError {}

/// The three questions the orchestrator asks. Implementations block; callers run them on their
/// own threads.
pub trait Tracker: Send + Sync {
    /// Issues in an active state (routing is the orchestrator's business, not the tracker's).
    fn fetch_candidates(&self) -> Result<Vec<Issue>, TrackerError>;
    /// The current record of each id that still exists; missing ids are left out. Read as it
    /// is now: the check after an agent's turn asks this, and must see a move the agent made.
    fn fetch_states_by_ids(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError>;
    /// [`Tracker::fetch_states_by_ids`] asked by a poll right after its
    /// [`Tracker::fetch_candidates`]: a tracker may answer from what that read just saw (only
    /// the poll that made it asks this). The default reads as `fetch_states_by_ids` does.
    fn fetch_states_after_candidates(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        self.fetch_states_by_ids(ids)
    }
    /// Issues in a terminal state (for cleaning up their workspaces).
    fn fetch_terminal(&self) -> Result<Vec<Issue>, TrackerError>;
    /// Rate-limit information the service last reported, if any.
    fn rate_limits(&self) -> Option<serde_json::Value> {
        None
    }
    /// The daemon polls this tracker: a tracker with a live event feed (chat-b's Gateway) starts
    /// it here, once, and calls `wake` when an event is worth a poll now. Called before every
    /// poll; the default does nothing.
    fn attach(&self, _wake: &Wake) {}
    /// The daemon claimed `issue` for a first run (a best-effort acknowledgement, never
    /// blocking; the default does nothing).
    fn picked_up(&self, _issue: &Issue) {}
    /// The name of this tracker's steering source and what it reads (`local:<board>`), the key
    /// of its cursor: a reload to another tracker starts another cursor. `None`: the tracker
    /// is no steering source (the default).
    fn steering_source(&self) -> Option<String> {
        None
    }
    /// Posts `body` as svc's own comment on `issue` (a budget that stopped work on it). A
    /// tracker that cannot comment says so.
    fn post_comment(&self, _issue: &Issue, _body: &str) -> Result<(), TrackerError> {
        Err(TrackerError::invalid(
            "this tracker kind takes no comments from svc",
        ))
    }
    /// What people wrote to `issues` (running, retrying or waiting for a slot) since `cursor` (this
    /// source's own text): the messages to deliver, what was ignored, and the new cursor.
    /// `polled_at` is when the poll this read follows began: the first time (no cursor) what was
    /// written before it is history, and anything after it counts, since an issue that poll
    /// dispatched is not named before the next read. **Invariant:** a source never starts an
    /// issue's window at the read that first names it, but at the poll that could dispatch it.
    /// The default reads the tracker's [`Tracker::comment_source`], if it has one.
    fn steering(
        &self,
        issues: &[Issue],
        cursor: Option<&str>,
        polled_at: std::time::SystemTime,
    ) -> Result<crate::steering::Batch, TrackerError> {
        let Some(source) = self.comment_source() else {
            return Ok(crate::steering::Batch::default());
        };
        match comments::window(cursor, polled_at) {
            Ok(window) => source.steering_comments(issues, window),
            Err(first) => Ok(first),
        }
    }
    /// The tracker's comments as its steering (see [`comments::CommentSource`]); none by
    /// default.
    fn comment_source(&self) -> Option<&dyn comments::CommentSource> {
        None
    }
    /// [`Tracker::steering`], told which messages wait for their issue's next run (`waiting`,
    /// any source's). A source that sends parked issues back to work (GitHub's and GitLab's
    /// `rework_state`) sends back a parked issue whose own feedback waits, as if that feedback
    /// had come held: feedback read while the issue's run was ending came as ordinary steering,
    /// before any read saw the issue parked. The default reads as [`Tracker::steering`] does.
    fn steering_waiting(
        &self,
        issues: &[Issue],
        cursor: Option<&str>,
        polled_at: std::time::SystemTime,
        _waiting: &[crate::steering::Message],
    ) -> Result<crate::steering::Batch, TrackerError> {
        self.steering(issues, cursor, polled_at)
    }
}

/// A provider's own `svc doctor --online` finding, made beside the provider (`svc doctor`
/// turns each into one of its checks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub name: &'static str,
    pub level: FindingLevel,
    pub message: String,
    pub hint: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FindingLevel {
    Ok,
    Warning,
    Error,
}

impl Finding {
    pub fn ok(name: &'static str, message: impl Into<String>) -> Finding {
        Finding {
            name,
            level: FindingLevel::Ok,
            message: message.into(),
            hint: None,
        }
    }

    pub fn problem(
        name: &'static str,
        level: FindingLevel,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Finding {
        Finding {
            name,
            level,
            message: message.into(),
            hint: Some(hint.into()),
        }
    }
}

/// Asks the daemon for a poll now (coalesced with one under way).
pub type Wake = std::sync::Arc<dyn Fn() + Send + Sync>;

/// Builds the tracker the settings select.
pub fn build(settings: &TrackerSettings, env: &Env) -> Result<Box<dyn Tracker>, TrackerError> {
    build_keeping(settings, env, &crate::facts::Later::default())
}

/// [`build`], with the daemon's durable store handed in (`facts`, filled once it opens): where
/// GitHub and GitLab remember the review feedback that sent an issue back.
pub fn build_keeping(
    settings: &TrackerSettings,
    env: &Env,
    facts: &crate::facts::Later,
) -> Result<Box<dyn Tracker>, TrackerError> {
    let states = StateNames::from_settings(settings);
    match &settings.options {
        ProviderOptions::Memory => Ok(Box::new(memory::MemoryTracker::from_env(env, states)?)),
        ProviderOptions::Local(opts) => Ok(Box::new(local::LocalTracker::new(
            local::Board::new(opts, states),
            opts.users.clone(),
        ))),
        ProviderOptions::TrackerA(opts) => Ok(Box::new(tracker_a::TrackerA::new(opts, states))),
        ProviderOptions::TrackerB(opts) => Ok(Box::new(tracker_b::TrackerB::new(opts, states))),
        ProviderOptions::TrackerBMcp(opts) => {
            Ok(Box::new(tracker_b_mcp::TrackerBMcp::new(opts, states)))
        }
        ProviderOptions::ChatA(opts) => Ok(Box::new(chat_a::ChatA::new(opts, states))),
        ProviderOptions::ChatB(opts) => Ok(Box::new(chat_b::ChatB::new(opts, states))),
        ProviderOptions::Github(opts) => Ok(Box::new(
            github::GitHub::new(opts, states).keeping(facts.clone()),
        )),
        ProviderOptions::Gitlab(opts) => Ok(Box::new(
            gitlab::GitLab::new(opts, states).keeping(facts.clone()),
        )),
    }
}

/// Whether this build can poll `provider`.
pub fn is_available(provider: Provider) -> bool {
    matches!(
        provider,
        Provider::Memory
            | Provider::Local
            | Provider::TrackerA
            | Provider::TrackerB
            | Provider::TrackerBMcp
            | Provider::ChatA
            | Provider::ChatB
            | Provider::Github
            | Provider::Gitlab
    )
}

/// The configured active and terminal state names, used to classify states for trackers that
/// have no state types of their own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateNames {
    pub active: Vec<String>,
    pub terminal: Vec<String>,
}

impl StateNames {
    pub fn from_settings(settings: &TrackerSettings) -> StateNames {
        StateNames {
            active: settings.active_states.clone(),
            terminal: settings.terminal_states.clone(),
        }
    }

    pub fn is_active(&self, state: &str) -> bool {
        crate::config::contains_state(&self.active, state)
    }

    pub fn is_terminal(&self, state: &str) -> bool {
        crate::config::contains_state(&self.terminal, state)
    }

    /// A state type in tracker-a's vocabulary: the first active state is `unstarted`, other
    /// active states `started`; terminal states are `canceled` when named like a cancellation
    /// or duplicate, else `completed`; anything else is `backlog`.
    pub fn state_type(&self, state: &str) -> &'static str {
        let s = state.trim();
        if self.is_terminal(s) {
            let lower = s.to_ascii_lowercase();
            if lower.starts_with("cancel") || lower.starts_with("duplicate") {
                "canceled"
            } else {
                "completed"
            }
        } else if self
            .active
            .first()
            .is_some_and(|first| first.trim().eq_ignore_ascii_case(s))
        {
            "unstarted"
        } else if self.is_active(s) {
            "started"
        } else {
            "backlog"
        }
    }
}

/// The one of `configured` (repositories, projects) that `asked` names, case-insensitively;
/// the first when none is asked for. Another is refused, naming them (`noun`: `repos`).
pub fn one_of_configured(
    configured: &[String],
    asked: Option<&str>,
    noun: &str,
) -> Result<String, TrackerError> {
    match asked.map(str::trim).filter(|r| !r.is_empty()) {
        Some(r) => configured
            .iter()
            .find(|c| c.eq_ignore_ascii_case(r))
            .cloned()
            .ok_or_else(|| {
                TrackerError::invalid(format!(
                    "'{r}' is not one of the workflow's {noun} ({})",
                    configured.join(", ")
                ))
            }),
        None => configured
            .first()
            .cloned()
            .ok_or_else(|| TrackerError::invalid(format!("the workflow names no {noun}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_types_follow_the_configured_names() {
        let names = StateNames {
            active: vec!["Todo".into(), "In Progress".into()],
            terminal: ["Closed", "Cancelled", "Canceled", "Duplicate", "Done"]
                .map(String::from)
                .to_vec(),
        };
        assert_eq!(names.state_type("todo"), "unstarted");
        assert_eq!(names.state_type("In Progress"), "started");
        assert_eq!(names.state_type("Done"), "completed");
        assert_eq!(names.state_type("Canceled"), "canceled");
        assert_eq!(names.state_type("Duplicate"), "canceled");
        assert_eq!(names.state_type("Backlog"), "backlog");
    }
}
