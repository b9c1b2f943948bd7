//! `svc doctor --online` for the `gitlab` tracker, beside the provider: the token (its user and
//! scopes), each project (found, issues on, the token's role may write issues), the scoped
//! labels the workflow's states need (with how to create the missing ones), and whether the
//! instance offers blocking issue links at all (said here once, never at every poll; a Free
//! tier of the Enterprise Edition has none, so only a blocking link seen tells).

use serde_json::Value;

use super::{GitLab, project_path};
use crate::tracker::{Finding, FindingLevel};

/// GitLab's Reporter role: the least that may edit an issue's labels and state.
const REPORTER: u64 = 20;

/// The findings, in order: token, instance, then per project its access and labels.
pub fn findings(gl: &GitLab) -> Vec<Finding> {
    let mut out = vec![token(gl)];
    out.push(blockers(gl));
    for project in &gl.opts.projects {
        out.push(project_access(gl, project));
        out.extend(labels(gl, project));
    }
    out
}

fn token(gl: &GitLab) -> Finding {
    let user = match gl.viewer() {
        Ok(v) => v.username,
        Err(e) => {
            return Finding::problem(
                "tracker_online",
                FindingLevel::Error,
                e.message,
                "check the gitlab api_key (or GITLAB_TOKEN) and endpoint (a self-managed instance's https://<host>/api/v4)",
            );
        }
    };
    match gl.api.get("/personal_access_tokens/self") {
        Ok(got) => {
            let scopes: Vec<String> = got
                .value
                .get("scopes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect();
            let has = |s: &str| scopes.iter().any(|x| x == s);
            if has("api") {
                Finding::ok(
                    "tracker_online",
                    format!(
                        "gitlab accepts the token (user {user}; scopes {})",
                        scopes.join(", ")
                    ),
                )
            } else {
                Finding::problem(
                    "tracker_online",
                    FindingLevel::Error,
                    format!(
                        "the token of {user} lacks the api scope (it has {}){}",
                        if scopes.is_empty() {
                            "none".to_string()
                        } else {
                            scopes.join(", ")
                        },
                        if has("read_api") {
                            ": read_api reads issues, but moving them and writing notes need api"
                        } else {
                            ""
                        }
                    ),
                    "create a personal, group or project access token with the api scope",
                )
            }
        }
        Err(e) => Finding::problem(
            "tracker_online",
            FindingLevel::Warning,
            format!(
                "gitlab accepts the token (user {user}), but its scopes cannot be read: {}",
                e.message
            ),
            "an OAuth token or an old instance has no /personal_access_tokens/self; make sure the token has the api scope",
        ),
    }
}

/// Blocking links (`blocks`, `is_blocked_by`) are a GitLab Premium feature: on the Community
/// Edition every link is `relates_to`, and no issue ever waits for a blocker. `/metadata`'s
/// `enterprise` says only that the Enterprise Edition runs (Free tiers run it too), so the
/// tier is told by links seen: one issue's links (an open one counting blockers, else the
/// first) of the first project, with a link other than `relates_to`.
fn blockers(gl: &GitLab) -> Finding {
    let version = match gl.api.get("/metadata") {
        Ok(got) if got.value.get("enterprise").and_then(Value::as_bool) == Some(false) => {
            return Finding::problem(
                "tracker_blockers",
                FindingLevel::Warning,
                format!(
                    "gitlab {} is the Community Edition: it has no blocking issue links, so no issue waits for a blocker",
                    got.value["version"].as_str().unwrap_or("")
                ),
                "blocks / is blocked by links need GitLab Premium or Ultimate; order the work with states instead",
            );
        }
        Ok(got) => got.value["version"].as_str().unwrap_or("").to_string(),
        Err(e) => {
            return Finding::problem(
                "tracker_blockers",
                FindingLevel::Warning,
                format!(
                    "whether the instance offers blocking issue links cannot be told: {}",
                    e.message
                ),
                "blocks / is blocked by links need GitLab Premium or Ultimate",
            );
        }
    };
    match blocking_link_seen(gl) {
        Ok(Some(issue)) => Finding::ok(
            "tracker_blockers",
            format!(
                "gitlab {version} has blocking issue links ({issue} has one): an issue waits for its blockers"
            ),
        ),
        Ok(None) => Finding::problem(
            "tracker_blockers",
            FindingLevel::Warning,
            format!(
                "gitlab {version}: whether blocking issue links are available cannot be told (no blocking link seen); on a Free tier no issue waits for a blocker"
            ),
            "blocks / is blocked by links need GitLab Premium or Ultimate; without them order the work with states",
        ),
        Err(e) => Finding::problem(
            "tracker_blockers",
            FindingLevel::Warning,
            format!(
                "gitlab {version}: whether blocking issue links are available cannot be told: {}",
                e.message
            ),
            "blocks / is blocked by links need GitLab Premium or Ultimate",
        ),
    }
}

/// An issue of the first project with a link other than `relates_to`, if one is seen: its
/// open issues (one page) are listed, and one's links read.
fn blocking_link_seen(gl: &GitLab) -> Result<Option<String>, crate::tracker::TrackerError> {
    let Some(project) = gl.opts.projects.first() else {
        return Ok(None);
    };
    let pp = project_path(project);
    let issues = gl
        .api
        .get(&format!("{pp}/issues?state=opened&per_page=20"))?
        .value;
    let issues = issues.as_array().cloned().unwrap_or_default();
    let counts = |i: &Value| i.get("blocking_issues_count").and_then(Value::as_u64);
    let Some(issue) = issues
        .iter()
        .find(|i| counts(i).is_some_and(|n| n > 0))
        .or_else(|| issues.first())
    else {
        return Ok(None);
    };
    let iid = issue.get("iid").and_then(Value::as_u64).unwrap_or(0);
    let links = gl
        .api
        .get(&format!("{pp}/issues/{iid}/links?per_page=100"))?
        .value;
    let blocking = links.as_array().into_iter().flatten().any(|l| {
        l.get("link_type")
            .and_then(Value::as_str)
            .is_some_and(|t| t != "relates_to")
    });
    Ok(blocking.then(|| format!("{project}#{iid}")))
}

fn project_access(gl: &GitLab, project: &str) -> Finding {
    match gl.api.get(&project_path(project)) {
        Ok(got) => {
            let v = &got.value;
            let level = [
                "/permissions/project_access/access_level",
                "/permissions/group_access/access_level",
            ]
            .iter()
            .filter_map(|p| v.pointer(p).and_then(Value::as_u64))
            .max()
            .unwrap_or(0);
            if v.get("issues_enabled") == Some(&Value::Bool(false)) {
                Finding::problem(
                    "tracker_project",
                    FindingLevel::Error,
                    format!("{project} has issues turned off"),
                    "turn Issues on in the project's Settings > General > Visibility, project features, permissions",
                )
            } else if level < REPORTER {
                Finding::problem(
                    "tracker_project",
                    FindingLevel::Error,
                    format!(
                        "the token may read {project} but its role cannot edit issues' labels and state"
                    ),
                    "give the token's user (or the project access token) at least the Reporter role in the project",
                )
            } else if v.get("visibility").and_then(Value::as_str) == Some("public")
                && gl.opts.users.is_empty()
            {
                Finding::problem(
                    "tracker_project",
                    FindingLevel::Warning,
                    format!(
                        "{project} is public and users is empty: every member with Developer access or more may steer the agent (notes, reviews, the merge requests they open)"
                    ),
                    "set users to the usernames that may steer",
                )
            } else {
                Finding::ok(
                    "tracker_project",
                    format!("{project}: issues on, the token may write them"),
                )
            }
        }
        Err(e) => Finding::problem(
            "tracker_project",
            FindingLevel::Error,
            e.message,
            format!(
                "check that {project} exists (its full path, group/sub/project) and that the token may read it"
            ),
        ),
    }
}

/// The scoped labels svc writes: one per active state but `Todo` (an open issue without a
/// state label is in `Todo`), and the rework state; then (a warning when missing: a closed
/// issue without its label reads as `Done`) one per terminal state but `Done`.
fn labels(gl: &GitLab, project: &str) -> Vec<Finding> {
    let mut needed: Vec<String> = gl
        .states
        .active
        .iter()
        .filter(|s| !s.trim().eq_ignore_ascii_case("Todo"))
        .map(|s| gl.state_label(s))
        .collect();
    if let Some(r) = &gl.opts.rework_state {
        let label = gl.state_label(r);
        if !needed.contains(&label) {
            needed.push(label);
        }
    }
    let list = match gl.api.get_all(
        &format!(
            "{}/labels?include_ancestor_groups=true&per_page=100",
            project_path(project)
        ),
        20,
    ) {
        Ok(l) => l,
        Err(e) => {
            return vec![Finding::problem(
                "tracker_labels",
                FindingLevel::Error,
                e.message,
                "the token must be able to read the project's labels",
            )];
        }
    };
    let have: Vec<&str> = list
        .iter()
        .filter_map(|l| l.get("name").and_then(Value::as_str))
        .collect();
    let lacks = |needed: &[String]| -> Vec<String> {
        needed
            .iter()
            .filter(|n| !have.iter().any(|h| h.eq_ignore_ascii_case(n)))
            .cloned()
            .collect()
    };
    let create_hint = |first: &str| {
        format!(
            "create them in the project's (or its group's) Manage > Labels, or with the API: POST {}{}/labels with name={first} and a color",
            gl.opts.endpoint,
            project_path(project),
        )
    };
    let missing = lacks(&needed);
    let mut out = vec![if missing.is_empty() {
        Finding::ok(
            "tracker_labels",
            format!(
                "{project} has the state labels {}",
                if needed.is_empty() {
                    "(none needed)".to_string()
                } else {
                    needed.join(", ")
                }
            ),
        )
    } else {
        Finding::problem(
            "tracker_labels",
            FindingLevel::Error,
            format!("{project} lacks the scoped labels {}", missing.join(", ")),
            create_hint(&missing[0]),
        )
    }];
    let terminal: Vec<String> = gl
        .states
        .terminal
        .iter()
        .filter(|s| !s.trim().eq_ignore_ascii_case("Done"))
        .map(|s| gl.state_label(s))
        .collect();
    let missing = lacks(&terminal);
    if !missing.is_empty() {
        out.push(Finding::problem(
            "tracker_labels",
            FindingLevel::Warning,
            format!(
                "{project} lacks the scoped labels of terminal states {}: svc writes them when it closes an issue in one of these states",
                missing.join(", ")
            ),
            create_hint(&missing[0]),
        ));
    }
    out
}
