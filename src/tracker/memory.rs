//! The `memory` tracker: a fixed list of issues from `SVC_MEMORY_TRACKER_ISSUES_JSON` (fallback
//! `SVC_MEMORY_TRACKER_ISSUES`), for demos, tests and benchmarks. It exposes no agent tools.

use serde::Deserialize;

use super::{Issue, StateNames, Tracker, TrackerError};
use crate::env::Env;

pub const ISSUES_VAR: &str = "SVC_MEMORY_TRACKER_ISSUES_JSON";
pub const ISSUES_VAR_FALLBACK: &str = "SVC_MEMORY_TRACKER_ISSUES";

pub struct MemoryTracker {
    issues: Vec<Issue>,
    states: StateNames,
}

/// One record as written in the JSON (camelCase, snake_case accepted too).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    id: String,
    identifier: Option<String>,
    #[serde(default)]
    title: String,
    description: Option<String>,
    state: String,
    #[serde(alias = "state_type", rename = "stateType")]
    state_type: Option<String>,
    #[serde(default)]
    labels: Vec<String>,
    url: Option<String>,
    #[serde(alias = "created_at", rename = "createdAt")]
    created_at: Option<String>,
    #[serde(alias = "updated_at", rename = "updatedAt")]
    updated_at: Option<String>,
    priority: Option<i64>,
}

impl MemoryTracker {
    pub fn from_env(env: &Env, states: StateNames) -> Result<MemoryTracker, TrackerError> {
        let (var, json) = match (
            env.non_empty(ISSUES_VAR),
            env.non_empty(ISSUES_VAR_FALLBACK),
        ) {
            (Some(j), _) => (ISSUES_VAR, j),
            (None, Some(j)) => (ISSUES_VAR_FALLBACK, j),
            (None, None) => (ISSUES_VAR, "[]"),
        };
        Self::from_json(var, json, states)
    }

    pub fn from_json(
        var: &str,
        json: &str,
        states: StateNames,
    ) -> Result<MemoryTracker, TrackerError> {
        let values: Vec<serde_json::Value> = serde_json::from_str(json).map_err(|e| {
            TrackerError::config(format!("{var} must be a JSON array of issue records: {e}"))
        })?;
        let mut issues = Vec::with_capacity(values.len());
        for (idx, value) in values.into_iter().enumerate() {
            let r: Record = serde_json::from_value(value).map_err(|e| {
                TrackerError::config(format!("{var}[{idx}] is not a valid issue record: {e}"))
            })?;
            let state_type = r
                .state_type
                .unwrap_or_else(|| states.state_type(&r.state).to_string());
            issues.push(Issue {
                identifier: r.identifier.unwrap_or_else(|| r.id.clone()),
                id: r.id,
                title: r.title,
                description: r.description,
                state: r.state,
                state_type: Some(state_type),
                labels: r.labels,
                url: r.url,
                created_at: r.created_at,
                updated_at: r.updated_at,
                priority: r.priority,
            });
        }
        Ok(MemoryTracker { issues, states })
    }

    pub fn issue_count(&self) -> usize {
        self.issues.len()
    }
}

impl Tracker for MemoryTracker {
    fn fetch_candidates(&self) -> Result<Vec<Issue>, TrackerError> {
        Ok(self
            .issues
            .iter()
            .filter(|i| self.states.is_active(&i.state))
            .cloned()
            .collect())
    }

    fn fetch_states_by_ids(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        Ok(self
            .issues
            .iter()
            .filter(|i| ids.contains(&i.id))
            .cloned()
            .collect())
    }

    fn fetch_terminal(&self) -> Result<Vec<Issue>, TrackerError> {
        Ok(self
            .issues
            .iter()
            .filter(|i| self.states.is_terminal(&i.state))
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states() -> StateNames {
        StateNames {
            active: vec!["Todo".into(), "In Progress".into()],
            terminal: vec!["Done".into()],
        }
    }

    #[test]
    fn reads_records_and_answers_the_three_questions() {
        let json = r#"[
            {"id": "1", "identifier": "MEM-1", "title": "a", "state": "Todo", "labels": ["x"], "createdAt": "2026-01-01T00:00:00Z"},
            {"id": "2", "title": "b", "state": "Done"},
            {"id": "3", "title": "c", "state": "Backlog", "created_at": "2026-01-02T00:00:00Z"}
        ]"#;
        let t = MemoryTracker::from_json(ISSUES_VAR, json, states()).unwrap();
        let c = t.fetch_candidates().unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].identifier, "MEM-1");
        assert_eq!(c[0].state_type.as_deref(), Some("unstarted"));
        assert_eq!(
            t.fetch_terminal().unwrap()[0].identifier,
            "2",
            "identifier defaults to id"
        );
        let by_id = t
            .fetch_states_by_ids(&["3".into(), "missing".into()])
            .unwrap();
        assert_eq!(by_id.len(), 1);
        assert_eq!(by_id[0].created_at.as_deref(), Some("2026-01-02T00:00:00Z"));
    }

    #[test]
    fn bad_json_is_a_clear_error_naming_the_variable() {
        let err = MemoryTracker::from_json(ISSUES_VAR, "[{", states())
            .err()
            .unwrap();
        assert!(
            err.message
                .starts_with("SVC_MEMORY_TRACKER_ISSUES_JSON must be a JSON array"),
            "{err}"
        );
        let err = MemoryTracker::from_json(
            ISSUES_VAR,
            r#"[{"title": "no id", "state": "Todo"}]"#,
            states(),
        )
        .err()
        .unwrap();
        assert!(
            err.message.contains("[0]") && err.message.contains("id"),
            "{err}"
        );
    }

    #[test]
    fn fallback_variable_is_read_when_the_main_one_is_unset() {
        let env = Env::from_pairs(
            [(ISSUES_VAR_FALLBACK, r#"[{"id":"9","state":"Todo"}]"#)],
            std::path::Path::new("/"),
        );
        assert_eq!(
            MemoryTracker::from_env(&env, states())
                .unwrap()
                .issue_count(),
            1
        );
        let env = Env::from_pairs([], std::path::Path::new("/"));
        assert_eq!(
            MemoryTracker::from_env(&env, states())
                .unwrap()
                .issue_count(),
            0
        );
    }
}
