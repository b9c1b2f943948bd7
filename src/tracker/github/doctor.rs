//! `svc doctor --online` for the `github` tracker, beside the provider: the token (its user, a
//! classic token's scopes; a fine-grained one's permissions named), each repository (found,
//! issues on, the token may write them) and the board's status field against the states.

use super::GitHub;
use crate::tracker::{Finding, FindingLevel};

fn check(
    name: &'static str,
    level: FindingLevel,
    message: impl Into<String>,
    hint: Option<String>,
) -> Finding {
    Finding {
        name,
        level,
        message: message.into(),
        hint,
    }
}

/// The findings, in order: the token, each repository, the board.
pub fn findings(gh: &GitHub) -> Vec<Finding> {
    let mut out = vec![token(gh)];
    out.extend(repos_and_board(gh));
    out
}

fn token(gh: &GitHub) -> Finding {
    let opts = &gh.opts;
    match gh.api.get("/user") {
        Ok(me) => {
            let login = me.value["login"].as_str().unwrap_or("?");
            match me.header("x-oauth-scopes").map(|s| {
                s.split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect::<Vec<_>>()
            }) {
                None => Finding::ok(
                    "tracker_online",
                    format!(
                        "github accepts the token (user {login}; a fine-grained token: it needs {GITHUB_PERMISSIONS}; its write access is checked per repository below)"
                    ),
                ),
                Some(scopes) => {
                    let has = |s: &str| scopes.iter().any(|x| x == s);
                    let mut lacking = Vec::new();
                    if !has("repo") && !has("public_repo") {
                        lacking.push("repo");
                    }
                    if opts.project.is_some() && !has("project") {
                        lacking.push("project");
                    }
                    if lacking.is_empty() {
                        Finding::ok(
                            "tracker_online",
                            format!(
                                "github accepts the token (user {login}; scopes {})",
                                scopes.join(", ")
                            ),
                        )
                    } else {
                        check(
                            "tracker_online",
                            FindingLevel::Error,
                            format!(
                                "the token of {login} lacks the scope {} (it has {})",
                                lacking.join(" and "),
                                if scopes.is_empty() {
                                    "none".to_string()
                                } else {
                                    scopes.join(", ")
                                }
                            ),
                            Some(format!(
                                "create a token with the repo scope (and project, for a board), or a fine-grained token with {GITHUB_PERMISSIONS}"
                            )),
                        )
                    }
                }
            }
        }
        Err(e) => check(
            "tracker_online",
            FindingLevel::Error,
            e.message,
            Some("check the github api_key (or GITHUB_TOKEN) and endpoint".into()),
        ),
    }
}

/// What a fine-grained token needs for everything svc does on GitHub.
pub const GITHUB_PERMISSIONS: &str = "Issues: Read and write, Pull requests: Read-only, Checks: Read-only, Commit statuses: Read-only, Metadata: Read-only (and Projects: Read and write, for a board)";

/// github online, after the token check: each repository (found, issues on, the token may
/// write issues; a public one watched with no `users` is a warning: every collaborator may
/// steer) and the project (found, its status field with an option for every state the
/// workflow moves issues to).
fn repos_and_board(gh: &GitHub) -> Vec<Finding> {
    let opts = &gh.opts;
    let mut out = Vec::new();
    for repo in &opts.repos {
        out.push(match gh.api.get(&format!("/repos/{repo}")) {
            Ok(got) => {
                let v = &got.value;
                let can = |k: &str| v.pointer(&format!("/permissions/{k}")) == Some(&serde_json::Value::Bool(true));
                if v["has_issues"] == false {
                    check("tracker_repo", FindingLevel::Error, format!("{repo} has issues turned off"), Some("turn Issues on in the repository's Settings > General > Features".into()))
                } else if !(can("push") || can("triage") || can("maintain") || can("admin")) {
                    check("tracker_repo", FindingLevel::Error, format!("the token may read {repo} but not write its issues"), Some(format!("give the token {GITHUB_PERMISSIONS} on the repository (fine-grained), or the repo scope (classic)")))
                } else if v["private"] == false && opts.users.is_empty() {
                    check("tracker_repo", FindingLevel::Warning, format!("{repo} is public and tracker.users is empty: every owner, member and collaborator of it may steer the agent (comments, reviews, the pull requests they open)"), Some("set users to the logins that may steer".into()))
                } else {
                    Finding::ok("tracker_repo", format!("{repo}: issues on, the token may write them"))
                }
            }
            Err(e) => check("tracker_repo", FindingLevel::Error, e.message, Some(format!("check that {repo} exists and that the token may read it"))),
        });
    }
    let Some(project) = &opts.project else {
        return out;
    };
    let t = gh.states();
    out.push(match gh.board_options() {
        Ok(Some(options)) => {
            let has = |s: &str| options.iter().any(|o| o.trim().eq_ignore_ascii_case(s.trim()));
            let mut missing: Vec<String> = t.active.iter().filter(|s| !has(s)).cloned().collect();
            if let Some(r) = &opts.rework_state && !has(r) && !missing.contains(r) {
                missing.push(r.clone());
            }
            if !t.terminal.iter().any(|s| has(s)) {
                missing.push(format!("one of {}", t.terminal.join(", ")));
            }
            if missing.is_empty() {
                Finding::ok("tracker_project", format!("project {}/{}: field {} has {}", project.owner, project.number, project.status_field, options.join(", ")))
            } else {
                check("tracker_project", FindingLevel::Error, format!("project {}/{}: field {} lacks {} (it has {})", project.owner, project.number, project.status_field, missing.join(", "), options.join(", ")), Some("add the options to the field on the board, or change tracker.active_states to the board's names".into()))
            }
        }
        Ok(None) => return out,
        Err(e) => check("tracker_project", FindingLevel::Error, e.message, Some(format!("check project.owner and project.number, and that the token may read and write projects (the project scope, or a fine-grained token with {GITHUB_PERMISSIONS})"))),
    });
    out
}
