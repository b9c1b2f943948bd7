//! Steering from GitLab: the notes people write on an issue, and the feedback on the open merge
//! requests that close it, as steering messages (source `gitlab`) for the issue's agent.
//!
//! Watched issues are those the daemon names (running, retrying, waiting for a slot) and the
//! open issues that sit in a non-active, non-terminal state (`Human Review`; parked). For
//! each watched project, at a poll:
//!
//! * the project's note events since the cursor (`GET /projects/:id/events?action=commented`,
//!   newest first, read back to the cursor, [`EVENT_PAGES`] pages at most: a read that cannot
//!   reach the cursor moves on and says once which notes it did not read; never further back
//!   than [`comments::CURSOR_MAX_AGE`], said once): a note on a watched issue (not a parked one: there
//!   only the merge request's feedback counts), or a discussion or diff note on a watched merge
//!   request, by an allowed person. System notes, svc's own notes and bots never steer;
//! * the project's open merge requests (one list): which issues each closes
//!   (`closes_issues`), its approvals and its reviewers are read again only when its
//!   `updated_at` moved (an approval, an unapproval or a review writes a system note on it,
//!   which touches it). A reviewer's "request changes" and an approval withdrawn steer;
//! * the project's failed pipelines since the cursor (the newest [`PIPELINE_PAGES`] pages; past
//!   them the older ones are not read, said once): one whose commit is a watched merge
//!   request's head steers with its failed jobs' names and web URLs.
//!
//! Who may steer: people with at least Developer access to the project (members API
//! `access_level` >= 30), narrowed by `users` when it is set; never svc's own account or bots.
//! A merge request is watched only when it was opened from the project itself (not a fork) by
//! svc's account or someone who may steer. What is not taken is said once (`Batch::ignored`).
//!
//! Steady cost per project and poll with watched issues: three requests (events, open merge
//! requests, failed pipelines), plus the reads of what changed.
//!
//! Feedback on a parked issue is held for the issue's next run, and with `rework_state` moves
//! it there once per piece of feedback ([`crate::tracker::rework`], shared with GitHub); so
//! does feedback read while the issue's run was ending, which waits for that run too.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::{GitLab, Viewer, project_path};
use crate::steering::{Batch, Message, Source};
use crate::tracker::comments::{self, Author, Comment};
use crate::tracker::forge::{Opened, PRECISION, after, quoted};
use crate::tracker::{Issue, TrackerError, TrackerErrorKind};

/// GitLab's Developer role: the least access that may steer.
pub const DEVELOPER: u64 = 30;
/// A member's access level is asked again after this long.
const ACCESS_MAX_AGE: Duration = Duration::from_secs(600);
/// Pages of 100 events read per project and poll at most: a read that cannot reach the cursor
/// within them moves on (the older notes are not read, said once per episode).
const EVENT_PAGES: usize = 20;
/// Pages of 100 failed pipelines read per project and poll at most (the newest).
const PIPELINE_PAGES: usize = 5;
/// Pages of 100 open merge requests read per project at most.
const MR_PAGES: usize = 10;

/// An open merge request that closes a watched issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeRequest {
    pub project: String,
    pub iid: u64,
    pub url: String,
    pub sha: Option<String>,
    pub author: String,
    /// The issues it closes, by lowercased identifier.
    pub closes: Vec<String>,
}

/// What svc last read of an open merge request.
#[derive(Clone, Debug, Default)]
pub(super) struct Known {
    updated_at: String,
    mr: Option<MergeRequest>,
    /// Whether it was opened from the project itself, and its author's id.
    same_project: bool,
    author_id: u64,
    /// Reviews as read at `reviewed_at` (`None`: not read yet): who approved, who asked for
    /// changes.
    reviewed_at: Option<String>,
    /// Who approved (username, and GitLab's user record, for who may steer).
    approved_by: Vec<(String, Value)>,
    requested: Vec<String>,
}

/// What was written about the `watched` issues of a read `opened` (see
/// [`crate::tracker::forge`], which holds and sends back the parked ones), as a batch; the
/// cursor's text is not needed (GitLab's reads go on from the cursor itself).
pub(super) fn gather(
    gl: &GitLab,
    opened: &Opened,
    watched: &[&Issue],
    _cursor: Option<&str>,
) -> Result<Batch, TrackerError> {
    let (now, cur) = (opened.now, opened.cur);
    Ok(if watched.is_empty() {
        gl.feedback.batch(Vec::new(), cur, now)
    } else {
        let found = gather_found(gl, watched, &opened.parked_ids, cur.since())?;
        let mut b = gl.feedback.batch(found.comments, cur, now);
        b.messages.extend(found.pipelines);
        b.ignored.extend(found.ignored);
        // A read cut at its page limit moves on: the next one asks from when the cut one
        // began (it read every note from its oldest to then), not from the cursor again.
        if let Some(began) = found.cut_read_began
            && let Some(mut next) = comments::Cursor::read(b.cursor.as_deref())
        {
            next.high = next.high.max(began + comments::OVERLAP);
            b.cursor = Some(next.text());
        }
        b
    })
}

struct Found {
    comments: Vec<Comment>,
    pipelines: Vec<Message>,
    ignored: Vec<String>,
    /// When a project's notes were cut at [`EVENT_PAGES`]: when that read began (svc's clock;
    /// the earliest over the projects cut).
    cut_read_began: Option<SystemTime>,
}

/// Whether `user` is a bot: GitLab's `bot` flag (the basic user record notes and events carry
/// has none), or the usernames of project and group access tokens' bot users
/// (`project_<id>_bot...`, `group_<id>_bot...`), of service accounts (`service_account_...`)
/// and GitLab's own bots.
fn is_bot(user: &Value) -> bool {
    if user.get("bot").and_then(Value::as_bool) == Some(true) {
        return true;
    }
    let name = user.get("username").and_then(Value::as_str).unwrap_or("");
    let token_bot = ["project_", "group_"].iter().any(|p| {
        name.strip_prefix(p).is_some_and(|rest| {
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            digits > 0 && rest[digits..].starts_with("_bot")
        })
    });
    token_bot
        || name.starts_with("service_account_")
        || matches!(name, "support-bot" | "alert-bot" | "ghost" | "gitlab-bot")
}

/// The access level of user `id` in `project` (0: not a member), asked at most every
/// [`ACCESS_MAX_AGE`].
fn access(gl: &GitLab, project: &str, id: u64) -> Result<u64, TrackerError> {
    let key = (project.to_ascii_lowercase(), id);
    if let Some((level, at)) = gl.memo().access.get(&key)
        && at.elapsed() < ACCESS_MAX_AGE
    {
        return Ok(*level);
    }
    let level = match gl
        .api
        .get(&format!("{}/members/all/{id}", project_path(project)))
    {
        Ok(got) => got.value["access_level"].as_u64().unwrap_or(0),
        Err(e) if e.kind == TrackerErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    gl.memo().access.insert(key, (level, Instant::now()));
    Ok(level)
}

/// Who `user` is to steering in `project`.
fn author_kind(
    gl: &GitLab,
    project: &str,
    user: &Value,
    viewer: &Viewer,
) -> Result<(String, Author), TrackerError> {
    let username = user
        .get("username")
        .and_then(Value::as_str)
        .unwrap_or("someone")
        .to_string();
    let id = user.get("id").and_then(Value::as_u64).unwrap_or(0);
    let kind = if id == viewer.id || username.eq_ignore_ascii_case(&viewer.username) {
        Author::Own
    } else if is_bot(user) {
        Author::NotPerson("a bot".into())
    } else if access(gl, project, id)? < DEVELOPER {
        Author::Refused("less than Developer access to the project".into())
    } else {
        Author::Person
    };
    Ok((username, kind))
}

/// Why the merge request is not watched (its feedback never steers), or `None` when it is:
/// opened from the project itself by svc's account, or by a person who may steer.
pub(super) fn unwatched(
    gl: &GitLab,
    project: &str,
    mr: &Value,
    viewer: &Viewer,
) -> Result<Option<&'static str>, TrackerError> {
    let same = mr.get("source_project_id").is_some()
        && mr.get("source_project_id") == mr.get("target_project_id");
    if !same {
        return Ok(Some("opened from a fork"));
    }
    let author = mr.get("author").cloned().unwrap_or(Value::Null);
    let (username, kind) = author_kind(gl, project, &author, viewer)?;
    Ok(match kind {
        Author::Own => None,
        Author::NotPerson(_) => Some("a bot"),
        Author::Refused(_) => Some("its author has less than Developer access"),
        Author::Person
            if !gl.opts.users.is_empty()
                && !gl.opts.users.iter().any(|u| {
                    u.trim()
                        .trim_start_matches('@')
                        .eq_ignore_ascii_case(&username)
                }) =>
        {
            Some("its author is not in the tracker's users")
        }
        Author::Person => None,
    })
}

fn text<'v>(v: &'v Value, pointer: &str) -> &'v str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// A piece of feedback's key for one issue: one merge request closes several issues, and each
/// is steered by it (the inbox and rework take a key once, whatever its issue).
fn keyed(what: &str, issue_id: &str) -> String {
    format!("{what}@{}", issue_id.to_ascii_lowercase())
}

/// The open merge requests of `project`, refreshed where they changed; those that close a
/// watched issue are returned with their new review feedback (as comments by the reviewer).
fn merge_requests(
    gl: &GitLab,
    project: &str,
    watched: &HashMap<String, &Issue>,
    viewer: &Viewer,
    comments: &mut Vec<Comment>,
    ignored: &mut Vec<String>,
) -> Result<Vec<MergeRequest>, TrackerError> {
    let pp = project_path(project);
    let list = gl.api.get_list(
        &format!("{pp}/merge_requests?state=opened&order_by=updated_at&sort=desc&per_page=100"),
        MR_PAGES,
    )?;
    let mut open = HashSet::new();
    let mut out = Vec::new();
    for mr in &list.items {
        let iid = mr["iid"].as_u64().unwrap_or_default();
        let key = format!("{project}!{iid}").to_ascii_lowercase();
        open.insert(key.clone());
        let updated = text(mr, "/updated_at").to_string();
        let mut known = gl
            .memo()
            .merge_requests
            .get(&key)
            .cloned()
            .unwrap_or_default();
        if known.mr.is_none() || known.updated_at != updated {
            let closes = gl.api.get_all(
                &format!("{pp}/merge_requests/{iid}/closes_issues?per_page=100"),
                5,
            )?;
            let closes: Vec<String> = closes
                .iter()
                .filter_map(|i| {
                    let p = super::project_of(i).unwrap_or_else(|| project.to_string());
                    Some(
                        format!("{}#{}", gl.places().canonical(&p), i.get("iid")?.as_u64()?)
                            .to_ascii_lowercase(),
                    )
                })
                .collect();
            known.updated_at = updated.clone();
            known.same_project = mr.get("source_project_id").is_some()
                && mr.get("source_project_id") == mr.get("target_project_id");
            known.author_id = mr
                .pointer("/author/id")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            known.mr = Some(MergeRequest {
                project: project.to_string(),
                iid,
                url: text(mr, "/web_url").to_string(),
                sha: mr.get("sha").and_then(Value::as_str).map(str::to_string),
                author: text(mr, "/author/username").to_string(),
                closes,
            });
        }
        let Some(m) = known.mr.clone() else { continue };
        let closes_watched: Vec<&&Issue> = m.closes.iter().filter_map(|k| watched.get(k)).collect();
        if closes_watched.is_empty() {
            gl.memo().merge_requests.insert(key, known);
            continue;
        }
        if let Some(why) = unwatched(gl, project, mr, viewer)? {
            if gl
                .feedback
                .said
                .episode(&format!("mr unwatched {key}"), true)
            {
                for issue in &closes_watched {
                    ignored.push(format!(
                        "{}: merge request {project}!{iid} by {} ({why}): its notes, reviews and pipelines do not steer",
                        issue.identifier, m.author
                    ));
                }
            }
            gl.memo().merge_requests.insert(key, known);
            continue;
        }
        if known.reviewed_at.as_deref() != Some(updated.as_str()) {
            let approvals = gl
                .api
                .get(&format!("{pp}/merge_requests/{iid}/approvals"))?
                .value;
            let approved_by: Vec<(String, Value)> = approvals
                .get("approved_by")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|a| {
                    Some((
                        a.pointer("/user/username")?.as_str()?.to_string(),
                        a["user"].clone(),
                    ))
                })
                .collect();
            let reviewers = gl
                .api
                .get_all(&format!("{pp}/merge_requests/{iid}/reviewers"), 1)?;
            let requested: Vec<(String, Value)> = reviewers
                .iter()
                .filter(|r| r.get("state").and_then(Value::as_str) == Some("requested_changes"))
                .filter_map(|r| {
                    Some((
                        r.pointer("/user/username")?.as_str()?.to_string(),
                        r["user"].clone(),
                    ))
                })
                .collect();
            let first = known.reviewed_at.is_none();
            for issue in &closes_watched {
                for (who, user) in &requested {
                    if known.requested.contains(who) {
                        continue;
                    }
                    let (author, kind) = author_kind(gl, project, user, viewer)?;
                    comments.push(Comment {
                        issue_id: issue.id.clone(),
                        issue: issue.identifier.clone(),
                        id: keyed(&format!("changes-{key}-{who}-{updated}"), &issue.id),
                        created: updated.clone(),
                        author_ids: vec![author.clone()],
                        author,
                        kind,
                        text: format!(
                            "Changes requested on merge request {project}!{iid} ({}) by {who}",
                            m.url
                        ),
                    });
                }
                if first {
                    continue;
                }
                for (who, user) in &known.approved_by {
                    if approved_by.iter().any(|(w, _)| w == who) {
                        continue;
                    }
                    let (author, kind) = author_kind(gl, project, user, viewer)?;
                    comments.push(Comment {
                        issue_id: issue.id.clone(),
                        issue: issue.identifier.clone(),
                        id: keyed(&format!("unapproved-{key}-{who}-{updated}"), &issue.id),
                        created: updated.clone(),
                        author_ids: vec![author.clone()],
                        author,
                        kind,
                        text: format!(
                            "{who} withdrew their approval of merge request {project}!{iid} ({})",
                            m.url
                        ),
                    });
                }
            }
            known.reviewed_at = Some(updated.clone());
            known.approved_by = approved_by;
            known.requested = requested.into_iter().map(|(w, _)| w).collect();
        }
        gl.memo().merge_requests.insert(key, known);
        out.push(m);
    }
    // What is known of a merge request, and what was said of it, ends with it.
    let prefix = format!("{project}!").to_ascii_lowercase();
    let mut memo = gl.memo();
    memo.merge_requests
        .retain(|k, _| !k.starts_with(&prefix) || open.contains(k));
    drop(memo);
    gl.feedback.said.retain(|k| {
        k.strip_prefix("mr unwatched ")
            .is_none_or(|mr| !mr.starts_with(&prefix) || open.contains(mr))
    });
    Ok(out)
}

/// Everything written about `watched` since `since`.
fn gather_found(
    gl: &GitLab,
    watched: &[&Issue],
    parked: &HashSet<String>,
    since: SystemTime,
) -> Result<Found, TrackerError> {
    let viewer = gl.viewer()?;
    let mut out = Found {
        comments: Vec::new(),
        pipelines: Vec::new(),
        ignored: Vec::new(),
        cut_read_began: None,
    };
    let by_issue: HashMap<String, &Issue> = watched
        .iter()
        .map(|i| (i.id.to_ascii_lowercase(), *i))
        .collect();
    let projects: BTreeSet<String> = watched
        .iter()
        .filter_map(|i| gl.resolve(&i.id).ok().map(|(p, _)| p))
        .collect();
    // The events API takes a day: events after the day before `since`'s.
    let day_before = since
        .checked_sub(Duration::from_secs(86_400))
        .unwrap_or(UNIX_EPOCH);
    let after_day = crate::time::rfc3339_seconds(day_before)[..10].to_string();
    for project in &projects {
        let pp = project_path(project);
        let mrs = merge_requests(
            gl,
            project,
            &by_issue,
            &viewer,
            &mut out.comments,
            &mut out.ignored,
        )?;
        let by_mr: HashMap<u64, &MergeRequest> = mrs.iter().map(|m| (m.iid, m)).collect();
        // Notes, newest first, back to the cursor.
        let mut next = Some(format!(
            "{pp}/events?action=commented&after={after_day}&sort=desc&per_page=100"
        ));
        let mut pages = 0;
        let began = SystemTime::now();
        // The oldest note time read so far.
        let mut oldest: Option<SystemTime> = None;
        let mut cut = false;
        'pages: while let Some(path) = next.take() {
            if pages == EVENT_PAGES {
                cut = true;
                break;
            }
            pages += 1;
            let got = gl.api.get(&path)?;
            next = got.next;
            for event in got.value.as_array().into_iter().flatten() {
                let Some(note) = event.get("note") else {
                    continue;
                };
                let created = text(note, "/created_at");
                // A time that does not read is that note's matter: older notes still count.
                let Some(at) = crate::time::parse_time(created) else {
                    continue;
                };
                if at + PRECISION <= since {
                    break 'pages;
                }
                oldest = Some(oldest.map_or(at, |o| o.min(at)));
                if note.get("system").and_then(Value::as_bool) == Some(true) {
                    continue;
                }
                let iid = note
                    .get("noteable_iid")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                let body = text(note, "/body");
                let note_id = note.get("id").map(Value::to_string).unwrap_or_default();
                let (issue_id, identifier, text_out) = match text(note, "/noteable_type") {
                    "Issue" => {
                        let key = format!("{project}#{iid}").to_ascii_lowercase();
                        let Some(issue) = by_issue.get(&key) else {
                            continue;
                        };
                        if parked.contains(&issue.id) {
                            continue;
                        }
                        (issue.id.clone(), issue.identifier.clone(), body.to_string())
                    }
                    "MergeRequest" => {
                        let Some(m) = by_mr.get(&iid) else { continue };
                        let place = match (
                            note.pointer("/position/new_path").and_then(Value::as_str),
                            note.pointer("/position/new_line").and_then(Value::as_u64),
                        ) {
                            (Some(path), Some(line)) => format!("Diff note on {path}:{line}"),
                            (Some(path), None) => format!("Diff note on {path}"),
                            _ => "Comment".to_string(),
                        };
                        let header = format!(
                            "{place} in merge request {project}!{iid} ({}#note_{note_id})",
                            m.url
                        );
                        let text_out = quoted(header, body);
                        let mut targets = Vec::new();
                        for k in &m.closes {
                            if let Some(issue) = by_issue.get(k) {
                                targets.push((issue.id.clone(), issue.identifier.clone()));
                            }
                        }
                        let author = note.get("author").cloned().unwrap_or(Value::Null);
                        let (name, kind) = author_kind(gl, project, &author, &viewer)?;
                        for (id, ident) in targets {
                            out.comments.push(Comment {
                                id: keyed(&format!("note-{note_id}"), &id),
                                issue_id: id,
                                issue: ident,
                                created: created.to_string(),
                                author_ids: vec![name.clone()],
                                author: name.clone(),
                                kind: kind.clone(),
                                text: text_out.clone(),
                            });
                        }
                        continue;
                    }
                    _ => continue,
                };
                let author = note.get("author").cloned().unwrap_or(Value::Null);
                let (name, kind) = author_kind(gl, project, &author, &viewer)?;
                out.comments.push(Comment {
                    id: keyed(&format!("note-{note_id}"), &issue_id),
                    issue_id,
                    issue: identifier,
                    created: created.to_string(),
                    author_ids: vec![name.clone()],
                    author: name,
                    kind,
                    text: text_out,
                });
            }
        }
        // Cut: the read moves on past the notes it could not reach (a flood of notes, or a
        // busy project not read for long would otherwise hold the cursor for good), said once
        // per episode.
        let back_to = oldest.filter(|_| cut).unwrap_or(since);
        if gl.feedback.said.episode(&format!("events {project}"), cut) {
            let line = format!(
                "gitlab {project}: more than {} notes since the last read: notes written from {} to {} are not read",
                EVENT_PAGES * 100,
                crate::time::rfc3339_seconds(since),
                crate::time::rfc3339_seconds(back_to)
            );
            log::warn!("{line}");
            out.ignored.push(line);
        }
        if cut {
            out.cut_read_began = Some(out.cut_read_began.map_or(began, |t| t.min(began)));
        }
        // Failed pipelines of the watched merge requests' heads.
        let heads: HashMap<&str, &MergeRequest> = mrs
            .iter()
            .filter_map(|m| Some((m.sha.as_deref()?, m)))
            .collect();
        if heads.is_empty() {
            continue;
        }
        let from = crate::time::rfc3339_seconds(since.checked_sub(PRECISION).unwrap_or(UNIX_EPOCH));
        // The newest failed pipelines: past the page limit the older ones are not read (said
        // once per episode), so a flood of them cannot stop steering.
        let failed = gl.api.get_list(
            &format!(
                "{pp}/pipelines?status=failed&updated_after={}&order_by=updated_at&sort=desc&per_page=100",
                crate::tracker::http::enc(&from)
            ),
            PIPELINE_PAGES,
        )?;
        if gl
            .feedback
            .said
            .episode(&format!("pipelines {project}"), !failed.complete)
        {
            let line = format!(
                "gitlab {project}: more than {} failed pipelines since {from}: svc reads the newest {}",
                PIPELINE_PAGES * 100,
                PIPELINE_PAGES * 100
            );
            log::warn!("{line}");
            out.ignored.push(line);
        }
        for p in &failed.items {
            let Some(m) = heads.get(text(p, "/sha")) else {
                continue;
            };
            let at = p
                .get("updated_at")
                .or_else(|| p.get("finished_at"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if !after(at, since) {
                continue;
            }
            let id = p["id"].as_u64().unwrap_or_default();
            // The first 500 failed jobs name the failure well enough: a list past them is cut,
            // not an error that would stop steering.
            let jobs = gl
                .api
                .get_list(
                    &format!("{pp}/pipelines/{id}/jobs?scope%5B%5D=failed&per_page=100"),
                    5,
                )?
                .items;
            let mut text_out = format!(
                "Pipeline #{id} failed on merge request {project}!{} ({})",
                m.iid,
                text(p, "/web_url")
            );
            for j in &jobs {
                text_out.push_str(&format!(
                    "\n- job \"{}\" ({}) failed: {}",
                    text(j, "/name"),
                    text(j, "/stage"),
                    text(j, "/web_url")
                ));
            }
            for k in &m.closes {
                if let Some(issue) = by_issue.get(k) {
                    out.pipelines.push(Message {
                        issue_id: issue.id.clone(),
                        source: Source::Gitlab,
                        author: "pipeline".into(),
                        text: text_out.clone(),
                        at: at.to_string(),
                        // A pipeline retried that fails again is new feedback.
                        key: keyed(&format!("pipeline-{id}-{at}"), &issue.id),
                    });
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bots_are_known_by_flag_and_by_token_user_names() {
        assert!(is_bot(&json!({"username": "project_42_bot_3f1a"})));
        assert!(is_bot(&json!({"username": "group_7_bot"})));
        assert!(is_bot(&json!({"username": "alice", "bot": true})));
        assert!(is_bot(&json!({"username": "service_account_3f9c2a1b"})));
        assert!(is_bot(
            &json!({"username": "service_account_group_12_8d1e"})
        ));
        assert!(!is_bot(&json!({"username": "service_accountant"})));
        assert!(!is_bot(&json!({"username": "project_manager"})));
        assert!(!is_bot(&json!({"username": "alice"})));
    }
}
