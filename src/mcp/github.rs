//! The `github` pack: mounted for the `github` tracker, or standalone with `tools.github` (its
//! own token and repositories; a dispatch tracker's token is lent only by a `github` tracker).
//! It acts only on issues of the configured `repos`: the token may reach others, and an agent
//! must not be steered into writing there.

use serde_json::{Value, json};

use super::query;
use super::tools::{
    ISSUE_ROW_DEFAULT, Pack, ToolResult, ToolSpec, failure, issue_record as record, issue_rows,
    merged, query_properties, required, schema, states_arg, tracker_failure,
};
use crate::config::{ProviderOptions, Settings, ToolOptions};
use crate::tracker::StateNames;
use crate::tracker::github::GitHub;

pub(super) struct GithubPack {
    gh: GitHub,
}

/// A comment as the tools show it.
fn comment(c: &Value) -> Value {
    json!({
        "id": c.get("id"),
        "author": c.pointer("/user/login"),
        "body": c.get("body"),
        "createdAt": c.get("created_at"),
        "url": c.get("html_url"),
    })
}

impl GithubPack {
    pub(super) fn new(settings: &Settings) -> Option<GithubPack> {
        let states = StateNames::from_settings(&settings.tracker);
        let from_tools = match settings.tool("github") {
            Some(ToolOptions::Github(opts)) => Some((**opts).clone()),
            _ => None,
        };
        let opts = match (from_tools, &settings.tracker.options) {
            (Some(opts), _) => opts,
            (None, ProviderOptions::Github(opts)) => opts.clone(),
            _ => return None,
        };
        Some(GithubPack {
            gh: GitHub::new(&opts, states),
        })
    }

    /// The issue with its comments and the open pull requests that close it (each watched one
    /// with its reviews, its review decision and its head's check conclusions; one opened by
    /// someone who may not steer, by its author only).
    fn read_issue(&self, id: &str) -> ToolResult {
        let (repo, n) = self.gh.resolve_in_repos(id).map_err(tracker_failure)?;
        let issue = self
            .gh
            .read(&format!("{repo}#{n}"))
            .map_err(tracker_failure)?;
        let comments: Vec<Value> = self
            .gh
            .comments(&issue.id)
            .map_err(tracker_failure)?
            .iter()
            .map(comment)
            .collect();
        let mut pulls = Vec::new();
        for (p, watched) in self.gh.pulls_of(&issue).map_err(tracker_failure)? {
            if !watched {
                pulls.push(json!({
                    "repo": p.repo,
                    "number": p.number,
                    "url": p.url,
                    "author": p.author,
                    "watched": false,
                }));
                continue;
            }
            let reviews = self.gh.reviews(&p).map_err(tracker_failure)?;
            // The decision: each reviewer's last approving or blocking review counts.
            let mut last: Vec<(String, String)> = Vec::new();
            for r in &reviews {
                let who = r
                    .pointer("/user/login")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let state = r.get("state").and_then(Value::as_str).unwrap_or("");
                if matches!(state, "APPROVED" | "CHANGES_REQUESTED" | "DISMISSED") {
                    last.retain(|(w, _)| *w != who);
                    last.push((who, state.to_string()));
                }
            }
            let decision = if last.iter().any(|(_, s)| s == "CHANGES_REQUESTED") {
                Some("CHANGES_REQUESTED")
            } else if last.iter().any(|(_, s)| s == "APPROVED") {
                Some("APPROVED")
            } else {
                None
            };
            let checks: Vec<Value> = self
                .gh
                .check_runs(&p)
                .map_err(tracker_failure)?
                .iter()
                .map(|r| json!({"name": r.get("name"), "status": r.get("status"), "conclusion": r.get("conclusion"), "url": r.get("details_url").or_else(|| r.get("html_url"))}))
                .collect();
            let statuses: Vec<Value> = self
                .gh
                .statuses(&p)
                .map_err(tracker_failure)?
                .iter()
                .map(|s| json!({"context": s.get("context"), "state": s.get("state"), "description": s.get("description"), "url": s.get("target_url")}))
                .collect();
            pulls.push(json!({
                "repo": p.repo,
                "number": p.number,
                "url": p.url,
                "head": p.head,
                "author": p.author,
                "watched": true,
                "reviewDecision": decision,
                "reviews": reviews.iter().map(|r| json!({"author": r.pointer("/user/login"), "state": r.get("state"), "body": r.get("body"), "submittedAt": r.get("submitted_at"), "url": r.get("html_url")})).collect::<Vec<_>>(),
                "checks": checks,
                "statuses": statuses,
            }));
        }
        Ok(json!({"issue": record(&issue), "comments": comments, "pullRequests": pulls}))
    }

    fn query(&self, args: &Value) -> ToolResult {
        let q = query::parse(args).map_err(failure)?;
        let states = states_arg(args, &self.gh.states().active);
        let open = self.gh.open_in_scope().map_err(tracker_failure)?;
        let issues = open
            .iter()
            .filter(|i| crate::config::contains_state(&states, &i.state));
        Ok(issue_rows(issues, &q, ISSUE_ROW_DEFAULT))
    }
}

/// The `issueId` argument, when it names an issue of the configured repos.
fn in_repos(gh: &GitHub, args: &Value) -> Result<(String, u64), Value> {
    gh.resolve_in_repos(required(args, "issueId")?)
        .map_err(tracker_failure)
}

impl Pack for GithubPack {
    fn specs(&self) -> Vec<ToolSpec> {
        let id = json!({"issueId": {"type": "string", "description": "owner/name#N (or #N when the workflow has one repository)"}});
        let with = |extra: Value| merged(&id, extra);
        let mut q = query_properties();
        q.insert("states".into(), json!({"type": "array", "items": {"type": "string"}, "description": "States to include (default: the active states); open issues in scope only"}));
        vec![
            ToolSpec {
                name: "github_update_status",
                description: "Move a GitHub issue to a state (the project board's status field, or the status label and open/closed state).",
                input_schema: schema(
                    with(json!({"status": {"type": "string"}})),
                    &["issueId", "status"],
                ),
            },
            ToolSpec {
                name: "github_comment",
                description: "Comment on a GitHub issue.",
                input_schema: schema(
                    with(json!({"body": {"type": "string", "description": "Markdown"}})),
                    &["issueId", "body"],
                ),
            },
            ToolSpec {
                name: "github_read_issue",
                description: "Read a GitHub issue: its body, comments, blockers, and the open pull requests that close it with their reviews and check conclusions.",
                input_schema: schema(id.clone(), &["issueId"]),
            },
            ToolSpec {
                name: "github_create_issue",
                description: "Create a GitHub issue (in the first configured repository unless repo is given), carrying the workflow's labels.",
                input_schema: schema(
                    json!({"title": {"type": "string"}, "body": {"type": "string"}, "status": {"type": "string", "description": "Default Todo"}, "repo": {"type": "string", "description": "owner/name, one of the workflow's repos"}}),
                    &["title"],
                ),
            },
            ToolSpec {
                name: "github_query",
                description: "Query the open issues in scope read-only (rows: id, identifier, title, description, state, stateType, labels, url, createdAt, updatedAt, blockedBy).",
                input_schema: schema(Value::Object(q), &[]),
            },
        ]
    }

    fn call(&self, name: &str, args: &Value) -> Option<ToolResult> {
        let gh = &self.gh;
        let result = match name {
            "github_update_status" => (|| {
                let (repo, n) = in_repos(gh, args)?;
                let issue = gh
                    .set_state(&format!("{repo}#{n}"), required(args, "status")?)
                    .map_err(tracker_failure)?;
                Ok(json!({"issue": record(&issue)}))
            })(),
            "github_comment" => (|| {
                let (repo, n) = in_repos(gh, args)?;
                let made = gh
                    .comment(&format!("{repo}#{n}"), required(args, "body")?)
                    .map_err(tracker_failure)?;
                Ok(json!({"ok": true, "comment": comment(&made)}))
            })(),
            "github_read_issue" => required(args, "issueId").and_then(|id| self.read_issue(id)),
            "github_create_issue" => (|| {
                let title = required(args, "title")?;
                let body = args.get("body").and_then(Value::as_str).unwrap_or("");
                let issue = gh
                    .create(
                        args.get("repo").and_then(Value::as_str),
                        title,
                        body,
                        args.get("status").and_then(Value::as_str),
                    )
                    .map_err(tracker_failure)?;
                Ok(json!({"issue": record(&issue)}))
            })(),
            "github_query" => self.query(args),
            _ => return None,
        };
        Some(result)
    }
}
