//! The `gitlab` pack: mounted for the `gitlab` tracker, or standalone with `tools.gitlab` (its
//! own token and projects; a dispatch tracker's token is lent only by a `gitlab` tracker).
//! It acts only on issues of the configured `projects`: the token may reach others, and an
//! agent must not be steered into writing there.

use serde_json::{Value, json};

use super::query;
use super::tools::{
    ISSUE_ROW_DEFAULT, Pack, ToolResult, ToolSpec, failure, issue_record as record, issue_rows,
    merged, query_properties, required, schema, states_arg, tracker_failure,
};
use crate::config::{ProviderOptions, Settings, ToolOptions};
use crate::tracker::StateNames;
use crate::tracker::gitlab::GitLab;

pub(super) struct GitlabPack {
    gl: GitLab,
}

/// A note as the tools show it.
fn note(n: &Value) -> Value {
    json!({
        "id": n.get("id"),
        "author": n.pointer("/author/username"),
        "body": n.get("body"),
        "createdAt": n.get("created_at"),
    })
}

impl GitlabPack {
    pub(super) fn new(settings: &Settings) -> Option<GitlabPack> {
        let states = StateNames::from_settings(&settings.tracker);
        let from_tools = match settings.tool("gitlab") {
            Some(ToolOptions::Gitlab(opts)) => Some((**opts).clone()),
            _ => None,
        };
        let opts = match (from_tools, &settings.tracker.options) {
            (Some(opts), _) => opts,
            (None, ProviderOptions::Gitlab(opts)) => opts.clone(),
            _ => return None,
        };
        Some(GitlabPack {
            gl: GitLab::new(&opts, states),
        })
    }

    /// The issue with its notes (system notes left out) and the merge requests that close it,
    /// with their approval state and head pipeline status.
    fn read_issue(&self, id: &str) -> ToolResult {
        let (project, n) = self.gl.resolve_in_projects(id).map_err(tracker_failure)?;
        let id = format!("{project}#{n}");
        let issue = self.gl.read(&id).map_err(tracker_failure)?;
        let notes: Vec<Value> = self
            .gl
            .notes(&id)
            .map_err(tracker_failure)?
            .iter()
            .map(note)
            .collect();
        let mrs = self
            .gl
            .closing_merge_requests(&id)
            .map_err(tracker_failure)?;
        Ok(json!({"issue": record(&issue), "notes": notes, "mergeRequests": mrs}))
    }

    fn query(&self, args: &Value) -> ToolResult {
        let q = query::parse(args).map_err(failure)?;
        let states = states_arg(args, &self.gl.states().active);
        let open = self.gl.open_in_scope().map_err(tracker_failure)?;
        let issues = open
            .iter()
            .filter(|i| crate::config::contains_state(&states, &i.state));
        Ok(issue_rows(issues, &q, ISSUE_ROW_DEFAULT))
    }
}

/// The `issueId` argument, when it names an issue of the configured projects.
fn in_projects(gl: &GitLab, args: &Value) -> Result<String, Value> {
    gl.resolve_in_projects(required(args, "issueId")?)
        .map(|(p, n)| format!("{p}#{n}"))
        .map_err(tracker_failure)
}

impl Pack for GitlabPack {
    fn specs(&self) -> Vec<ToolSpec> {
        let id = json!({"issueId": {"type": "string", "description": "group/project#IID (or #IID when the workflow has one project)"}});
        let with = |extra: Value| merged(&id, extra);
        let mut q = query_properties();
        q.insert("states".into(), json!({"type": "array", "items": {"type": "string"}, "description": "States to include (default: the active states); open issues in scope only"}));
        vec![
            ToolSpec {
                name: "gitlab_update_status",
                description: "Move a GitLab issue to a state (its scoped status label, and closed or reopened).",
                input_schema: schema(
                    with(json!({"status": {"type": "string"}})),
                    &["issueId", "status"],
                ),
            },
            ToolSpec {
                name: "gitlab_comment",
                description: "Add a note to a GitLab issue.",
                input_schema: schema(
                    with(json!({"body": {"type": "string", "description": "Markdown"}})),
                    &["issueId", "body"],
                ),
            },
            ToolSpec {
                name: "gitlab_read_issue",
                description: "Read a GitLab issue: its description, notes (without system notes), blockers, and the merge requests that close it with their approval state and head pipeline status.",
                input_schema: schema(id.clone(), &["issueId"]),
            },
            ToolSpec {
                name: "gitlab_create_issue",
                description: "Create a GitLab issue (in the first configured project unless project is given), carrying the workflow's labels.",
                input_schema: schema(
                    json!({"title": {"type": "string"}, "body": {"type": "string"}, "status": {"type": "string", "description": "Default Todo"}, "project": {"type": "string", "description": "group/project, one of the workflow's projects"}}),
                    &["title"],
                ),
            },
            ToolSpec {
                name: "gitlab_query",
                description: "Query the open issues in scope read-only (rows: id, identifier, title, description, state, stateType, labels, url, createdAt, updatedAt, blockedBy).",
                input_schema: schema(Value::Object(q), &[]),
            },
        ]
    }

    fn call(&self, name: &str, args: &Value) -> Option<ToolResult> {
        let gl = &self.gl;
        let result = match name {
            "gitlab_update_status" => (|| {
                let id = in_projects(gl, args)?;
                let issue = gl
                    .set_state(&id, required(args, "status")?)
                    .map_err(tracker_failure)?;
                Ok(json!({"issue": record(&issue)}))
            })(),
            "gitlab_comment" => (|| {
                let id = in_projects(gl, args)?;
                let made = gl
                    .comment(&id, required(args, "body")?)
                    .map_err(tracker_failure)?;
                Ok(json!({"ok": true, "note": note(&made)}))
            })(),
            "gitlab_read_issue" => required(args, "issueId").and_then(|id| self.read_issue(id)),
            "gitlab_create_issue" => (|| {
                let title = required(args, "title")?;
                let body = args.get("body").and_then(Value::as_str).unwrap_or("");
                let issue = gl
                    .create(
                        args.get("project").and_then(Value::as_str),
                        title,
                        body,
                        args.get("status").and_then(Value::as_str),
                    )
                    .map_err(tracker_failure)?;
                Ok(json!({"issue": record(&issue)}))
            })(),
            "gitlab_query" => self.query(args),
            _ => return None,
        };
        Some(result)
    }
}
