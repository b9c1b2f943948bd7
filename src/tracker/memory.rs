//! The `memory` tracker: a fixed list of issues from `SVC_MEMORY_TRACKER_ISSUES_JSON` (fallback
//! `SVC_MEMORY_TRACKER_ISSUES`), for demos, tests and benchmarks. It exposes no agent tools.
//!
//! A record's `blockedBy` lists its blockers, each an id (or identifier) of another record, or
//! an object `{id, identifier?, state?}`; what an object leaves out comes from the record it
//! names, and `state` is required when it names none.

use serde::Deserialize;

use super::{Blocker, Issue, StateNames, Tracker, TrackerError};
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
    #[serde(default, alias = "blocked_by", rename = "blockedBy")]
    blocked_by: Vec<BlockerRecord>,
}

/// One entry of a record's `blockedBy`.
#[derive(Deserialize)]
#[serde(untagged)]
enum BlockerRecord {
    Id(String),
    Full {
        id: String,
        identifier: Option<String>,
        state: Option<String>,
    },
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
        let records = values
            .into_iter()
            .enumerate()
            .map(|(idx, value)| {
                serde_json::from_value::<Record>(value).map_err(|e| {
                    TrackerError::config(format!("{var}[{idx}] is not a valid issue record: {e}"))
                })
            })
            .collect::<Result<Vec<Record>, TrackerError>>()?;
        // What each record's blockers name, resolved against the others before they move.
        let mut blocked_by = Vec::with_capacity(records.len());
        for (idx, r) in records.iter().enumerate() {
            let mut list = Vec::with_capacity(r.blocked_by.len());
            for b in &r.blocked_by {
                let (key, identifier, state) = match b {
                    BlockerRecord::Id(id) => (id, None, None),
                    BlockerRecord::Full {
                        id,
                        identifier,
                        state,
                    } => (id, identifier.clone(), state.clone()),
                };
                let named = records
                    .iter()
                    .find(|o| o.id == *key)
                    .or_else(|| records.iter().find(|o| o.identifier.as_ref() == Some(key)));
                let state = state
                    .or_else(|| named.map(|o| o.state.clone()))
                    .ok_or_else(|| {
                        TrackerError::config(format!(
                            "{var}[{idx}].blockedBy names {key}, which is no record: give its state"
                        ))
                    })?;
                list.push(Blocker {
                    id: named.map_or_else(|| key.clone(), |o| o.id.clone()),
                    identifier: identifier
                        .or_else(|| named.map(|o| o.identifier.clone().unwrap_or(o.id.clone())))
                        .unwrap_or_else(|| key.clone()),
                    state,
                });
            }
            blocked_by.push(list);
        }
        let mut issues = Vec::with_capacity(records.len());
        for (r, blocked_by) in records.into_iter().zip(blocked_by) {
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
                blocked_by,
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
    fn blockers_name_other_records_or_carry_their_state() {
        let json = r#"[
            {"id": "1", "identifier": "MEM-1", "state": "In Progress"},
            {"id": "2", "identifier": "MEM-2", "state": "Todo", "blockedBy": ["MEM-1", {"id": "ext-9", "identifier": "EXT-9", "state": "Done"}]},
            {"id": "3", "state": "Todo", "blocked_by": [{"id": "1", "state": "Done"}]}
        ]"#;
        let t = MemoryTracker::from_json(ISSUES_VAR, json, states()).unwrap();
        let by = |id: &str| {
            t.fetch_states_by_ids(&[id.into()]).unwrap()[0]
                .blocked_by
                .clone()
        };
        let b = by("2");
        assert_eq!(
            (
                b[0].id.as_str(),
                b[0].identifier.as_str(),
                b[0].state.as_str()
            ),
            ("1", "MEM-1", "In Progress"),
            "an identifier names the record, which gives id and state"
        );
        assert_eq!(
            (
                b[1].id.as_str(),
                b[1].identifier.as_str(),
                b[1].state.as_str()
            ),
            ("ext-9", "EXT-9", "Done")
        );
        let b = by("3");
        assert_eq!(
            (b[0].identifier.as_str(), b[0].state.as_str()),
            ("MEM-1", "Done"),
            "a given state wins over the record's"
        );
        assert!(by("1").is_empty());
        let err = MemoryTracker::from_json(
            ISSUES_VAR,
            r#"[{"id": "1", "state": "Todo", "blockedBy": ["nowhere"]}]"#,
            states(),
        )
        .err()
        .unwrap();
        assert!(err.message.contains("[0].blockedBy names nowhere"), "{err}");
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
