//! Steering from GitHub: what people write on an issue, and the feedback on the open pull
//! requests that close it (`closedByPullRequestsReferences`), as steering messages (source
//! `github`) for the issue's agent.
//!
//! Watched issues are those the daemon names (running, retrying, waiting for a slot) and the
//! open issues that sit in a non-active, non-terminal state (`Human Review`; parked). All are
//! read at every poll: the comment cursor is one for them all, so an issue left out of a read
//! could lose what was written on it meanwhile. For each, at a poll:
//!
//! * comments on the issue by an allowed person (not for a parked issue: there only the pull
//!   request's feedback counts);
//! * on each watched open pull request that closes it: a review that requests changes (or
//!   comments with text), a review comment, a comment on the pull request's conversation, each
//!   by an allowed person; and each check run or commit status of its head that fails.
//!
//! Who may steer: people with write access to the repository (GitHub's `author_association`
//! `OWNER`, `MEMBER` or `COLLABORATOR`), narrowed by `users` when it is set; never svc's own
//! account, bots or apps. A pull request is watched only when svc's account opened it, or
//! someone who may steer: anyone can open one from a fork saying "Fixes #N", and its checks run
//! what it contains. What is not taken is said once (`Batch::ignored`).
//!
//! One pull request that cannot be read (a fine-grained token without Pull requests, Checks or
//! Commit statuses read) loses only its own feedback, said once per episode with the permission
//! it needs; the others' steering and the cursor go on.
//!
//! A comment list longer than [`COMMENT_PAGES`] pages (a flood of comments, a busy repository
//! not read for long) moves on: it comes oldest first, so the next read asks from the newest
//! comment the cut one read, to the second (the cursor's `resume`), not from the mark again,
//! which would read the same pages at every poll; until the mark passes that point, each read
//! asks from the newest comment the last one read, and a list asked from the same second as
//! the last read goes on from the last page that read (kept in memory: after a restart the
//! first read starts over). Said once per episode, in a warning and a `steering_ignored` event.
//! The cursor asks [`comments::CURSOR_MAX_AGE`] back at most: after a longer stop, what was
//! written before is not read, said once.
//!
//! Costs: one GraphQL query (about a point) finds the pull requests; every other read is a
//! conditional REST request (free when nothing changed): the repository's issue comments and
//! review comments since a quarter-hour mark (the URL stays the same for a quarter hour, so
//! GitHub can answer 304), and each pull request's reviews, check runs and status.
//!
//! Feedback on a parked issue goes to the state thread as held ([`Batch::held`]): it waits for
//! the issue's next run, and with `rework_state` moves the issue there once per piece of
//! feedback ([`crate::tracker::rework`], shared with GitLab); so does feedback read while the
//! issue's run was ending, which waits for that run too.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::GitHub;
use crate::steering::{Batch, Message, Source};
use crate::tracker::comments::{self, Author, Comment};
use crate::tracker::forge::{Opened, after, quoted};
use crate::tracker::{Issue, TrackerError, TrackerErrorKind};

/// Parked issues watched at most.
pub(super) const PARKED_MAX: usize = crate::tracker::rework::PARKED_MAX;
/// List reads ask for comments updated since a mark this coarse.
const MARK: u64 = 15 * 60;
/// Check conclusions that are failures.
const FAILED: &[&str] = &["failure", "timed_out", "action_required", "startup_failure"];
/// GitHub's `author_association` of people with write access to the repository.
const WRITERS: &[&str] = &["OWNER", "MEMBER", "COLLABORATOR"];
/// Pages of 100 comments read per repository list and poll at most: a list cut there is read
/// on from the newest comment read at the next poll.
const COMMENT_PAGES: usize = 100;
/// The cursor's key for where a read follows a cut one (the newest comment that one read).
const RESUME: &str = "resume";
/// What reading the pull requests that close an issue takes.
pub(super) const PULLS_PERMISSION: &str =
    "give the token Pull requests: Read-only (fine-grained) or the repo scope (classic)";

/// An open pull request that closes a watched issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pull {
    pub repo: String,
    pub number: u64,
    pub url: String,
    pub head: Option<String>,
    /// Who opened it (a login), and GitHub's `authorAssociation` of them with the repository.
    pub author: String,
    pub association: String,
    /// The issue it closes.
    pub issue_id: String,
    pub issue: String,
}

/// What was written about the `watched` issues of a read `opened` (see
/// [`crate::tracker::forge`], which holds and sends back the parked ones), as a batch.
pub(super) fn gather(
    gh: &GitHub,
    opened: &Opened,
    watched: &[&Issue],
    cursor: Option<&str>,
) -> Result<Batch, TrackerError> {
    let (now, cur) = (opened.now, opened.cur);
    // A resume point ahead of now (a damaged store) is taken for none: it would hide comments.
    let resume = resume_of(cursor).filter(|r| *r <= now);

    let (mut batch, cut_at, newest, pages) = if watched.is_empty() {
        (
            gh.feedback.batch(Vec::new(), cur, now),
            None,
            None,
            Vec::new(),
        )
    } else {
        let found = gather_found(gh, watched, &opened.parked_ids, cur.since(), resume)?;
        let mut b = gh.feedback.batch(found.comments, cur, now);
        b.messages.extend(found.checks);
        b.ignored.extend(found.ignored);
        (b, found.cut_at, found.newest, found.pages)
    };
    // A list cut at its page limit: what was read is delivered, and the next read goes on from
    // the newest comment read (keys keep what comes twice from being delivered twice), with
    // the mark kept at most there, so nothing after it is skipped. Until the mark passes it,
    // each read goes on from the newest comment the last one read (not from the mark, whose
    // window holds the flood).
    let mut next = comments::Cursor::read(batch.cursor.as_deref()).unwrap_or(cur);
    let resume = match cut_at {
        Some(at) => {
            next.high = cur.high.max(at).min(next.high);
            Some(at)
        }
        None => resume
            .map(|r| newest.map_or(r, |n| r.max(n.min(now))))
            .filter(|r| mark(next.since()) < *r),
    };
    batch.cursor = Some(with_resume(next.text(), resume));
    // Where each list read goes on from, while reads go on from a resume point.
    gh.memo().comment_pages = match resume {
        Some(_) => pages.into_iter().collect(),
        None => HashMap::new(),
    };
    Ok(batch)
}

struct Found {
    /// Comments and reviews by people (the users filter applies).
    comments: Vec<Comment>,
    /// Failed checks and statuses (no person wrote them) of watched pull requests.
    checks: Vec<Message>,
    /// What was not read or is not watched, each said once per episode.
    ignored: Vec<String>,
    /// When a comment list was cut at its page limit: where the next read asks from (the
    /// newest comment read, or a second past where this one asked when all it read was in that
    /// second; the earliest over the lists cut).
    cut_at: Option<SystemTime>,
    /// The newest comment a list read (the earliest over the lists that read one).
    newest: Option<SystemTime>,
    /// Each list's first page and the last page read.
    pages: Vec<(String, String)>,
}

/// `since` rounded down to its quarter hour (a list's URL stays the same that long, so GitHub
/// can answer 304).
fn mark(since: SystemTime) -> SystemTime {
    since
        .duration_since(UNIX_EPOCH)
        .map(|d| UNIX_EPOCH + Duration::from_secs(d.as_secs() / MARK * MARK))
        .unwrap_or(UNIX_EPOCH)
}

/// Where the cursor `text` says the next read asks from, after a cut one.
fn resume_of(text: Option<&str>) -> Option<SystemTime> {
    let v: Value = serde_json::from_str(text?).ok()?;
    v.get(RESUME)?.as_str().and_then(crate::time::parse_time)
}

/// The cursor `text` with `resume` in it (none: without).
fn with_resume(text: String, resume: Option<SystemTime>) -> String {
    let Some(at) = resume else { return text };
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(mut map)) => {
            map.insert(RESUME.into(), json!(crate::time::rfc3339_seconds(at)));
            Value::Object(map).to_string()
        }
        _ => text,
    }
}

/// A read of one pull request's feedback: its list, or none when the token may not read it
/// (that failure noted with the `permission` it needs, for the pull request's line). Other
/// failures (GitHub unreachable, a rate limit) fail the whole read, which keeps the cursor.
fn isolated(
    read: Result<Vec<Value>, TrackerError>,
    permission: &'static str,
    failed: &mut Vec<(String, &'static str)>,
) -> Result<Vec<Value>, TrackerError> {
    match read {
        Ok(list) => Ok(list),
        Err(e)
            if matches!(
                e.kind,
                TrackerErrorKind::Config | TrackerErrorKind::NotFound
            ) =>
        {
            failed.push((e.message, permission));
            Ok(Vec::new())
        }
        Err(e) => Err(e),
    }
}

/// Everything written about `watched` since `since`.
fn gather_found(
    gh: &GitHub,
    watched: &[&Issue],
    parked: &HashSet<String>,
    since: SystemTime,
    resume: Option<SystemTime>,
) -> Result<Found, TrackerError> {
    let viewer = gh.viewer()?;
    let linked = linked_pulls(gh, watched)?;
    let mut out = Found {
        comments: Vec::new(),
        checks: Vec::new(),
        ignored: Vec::new(),
        cut_at: None,
        newest: None,
        pages: Vec::new(),
    };
    if gh
        .feedback
        .said
        .episode("linked", !linked.unreadable.is_empty())
    {
        let line = format!(
            "{}: the pull requests that close it cannot be read, so their feedback is not ({PULLS_PERMISSION})",
            linked.unreadable.join(", ")
        );
        log::warn!("github: {line}");
        out.ignored.push(line);
    }
    // What is said about a pull request ends with it (closed, merged, no longer linked).
    let current: HashSet<String> = linked
        .pulls
        .iter()
        .map(|p| format!("{}#{}", p.repo, p.number).to_ascii_lowercase())
        .collect();
    gh.feedback.said.retain(|k| {
        k.strip_prefix("pull ")
            .and_then(|rest| rest.split_once(' '))
            .is_none_or(|(_, pr)| current.contains(pr))
    });
    let mut pulls = Vec::new();
    for p in linked.pulls {
        let key = format!("{}#{}", p.repo, p.number).to_ascii_lowercase();
        match unwatched(gh, &p, &viewer) {
            None => pulls.push(p),
            Some(why) => {
                if gh
                    .feedback
                    .said
                    .episode(&format!("pull unwatched {key}"), true)
                {
                    out.ignored.push(format!(
                        "{}: pull request {}#{} by {} ({why}): its reviews, comments and checks do not steer",
                        p.issue, p.repo, p.number, p.author
                    ));
                }
            }
        }
    }
    let by_issue: HashMap<String, &Issue> = watched
        .iter()
        .map(|i| (i.id.to_ascii_lowercase(), *i))
        .collect();
    let by_pull: HashMap<String, &Pull> = pulls
        .iter()
        .map(|p| (format!("{}#{}", p.repo, p.number).to_ascii_lowercase(), p))
        .collect();
    let mut repos: BTreeSet<String> = BTreeSet::new();
    for i in watched {
        if let Ok((repo, _)) = gh.resolve(&i.id) {
            repos.insert(repo);
        }
    }
    for p in &pulls {
        repos.insert(gh.canonical(&p.repo));
    }
    // From the quarter-hour mark, or, after a cut read, from the newest comment it read.
    let asked = resume.map_or(mark(since), |r| r.max(mark(since)));
    let from = crate::time::rfc3339_seconds(asked);
    let who = |c: &Value| -> (String, Author) {
        let login = c
            .pointer("/user/login")
            .and_then(Value::as_str)
            .unwrap_or("someone")
            .to_string();
        let association = c
            .get("author_association")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = if login.eq_ignore_ascii_case(&viewer) {
            Author::Own
        } else if c.pointer("/user/type").and_then(Value::as_str) == Some("Bot") {
            Author::NotPerson("a bot".into())
        } else if !WRITERS.contains(&association) {
            Author::Refused("not a collaborator".into())
        } else {
            Author::Person
        };
        (login, kind)
    };
    let mut comments = Vec::new();
    let mut push =
        |issue_id: &str, issue: &str, id: String, c: &Value, created: &str, text: String| {
            let (author, kind) = who(c);
            comments.push(Comment {
                issue_id: issue_id.to_string(),
                issue: issue.to_string(),
                id,
                created: created.to_string(),
                author_ids: vec![author.clone()],
                author,
                kind,
                text,
            });
        };
    // The repository's comments of `kind` (`issues`, `pulls`) since `from`, each with the
    // lowercased `owner/name#N` its `parent` URL names; and, when the list was cut at its page
    // limit, where the next read asks from.
    let comments_of = |repo: &str,
                       kind: &str,
                       parent: &str,
                       ignored: &mut Vec<String>,
                       pages: &mut Vec<(String, String)>|
     -> Result<_, TrackerError> {
        let first = format!(
            "/repos/{repo}/{kind}/comments?since={from}&sort=created&direction=asc&per_page=100"
        );
        // Reading on after a cut: a list asked from the same time as the last read goes on
        // from the last page that read (read again: a comment deleted meanwhile moves the
        // rest a place back). The list is oldest first, so what was written since comes after.
        let start = match resume {
            Some(_) => gh.memo().comment_pages.get(&first).cloned(),
            None => None,
        };
        let listed = gh
            .api
            .get_list(start.as_deref().unwrap_or(&first), COMMENT_PAGES)?;
        pages.push((first, listed.last_page.clone()));
        // Oldest first: the next read asks from the newest comment read, which it reads again
        // (others written in its second may come after the cut; when all were written in that
        // second, the next read goes on from the last page).
        let newest = listed
            .items
            .iter()
            .filter_map(|c| crate::time::parse_time(field(c, "created_at")))
            .max();
        let cut_at = (!listed.complete).then(|| newest.unwrap_or(asked).max(asked));
        let what = if kind == "issues" {
            "issue and pull request"
        } else {
            "review"
        };
        if let Some(at) = cut_at
            && gh
                .feedback
                .said
                .episode(&format!("comments {kind} {repo}"), true)
        {
            let line = format!(
                "github {repo}: more than {} {what} comments since {from}: each read takes {} of them and the next reads on from the newest, {}; steering waits for them",
                COMMENT_PAGES * 100,
                COMMENT_PAGES * 100,
                crate::time::rfc3339_seconds(at)
            );
            log::warn!("{line}");
            ignored.push(line);
        }
        if cut_at.is_none() {
            gh.feedback
                .said
                .episode(&format!("comments {kind} {repo}"), false);
        }
        let on = |c: &Value| -> Option<String> {
            let url = c.get(parent)?.as_str()?;
            let rest = &url[url.rfind("/repos/")? + "/repos/".len()..];
            let (repo, n) = rest.rsplit_once(&format!("/{kind}/"))?;
            Some(format!("{repo}#{}", n.parse::<u64>().ok()?).to_ascii_lowercase())
        };
        let list = listed
            .items
            .into_iter()
            .filter_map(|c| Some((on(&c)?, c)))
            .collect::<Vec<_>>();
        Ok((list, cut_at, newest))
    };
    let earliest = |a: Option<SystemTime>, b: Option<SystemTime>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    for repo in &repos {
        let (list, cut_at, newest) = comments_of(
            repo,
            "issues",
            "issue_url",
            &mut out.ignored,
            &mut out.pages,
        )?;
        out.cut_at = earliest(out.cut_at, cut_at);
        out.newest = earliest(out.newest, newest);
        for (key, c) in &list {
            let (created, body, url) = (
                field(c, "created_at"),
                field(c, "body"),
                field(c, "html_url"),
            );
            let id = id_of("comment", c);
            if let Some(issue) = by_issue.get(key) {
                if !parked.contains(&issue.id) {
                    push(
                        &issue.id,
                        &issue.identifier,
                        id,
                        c,
                        created,
                        body.to_string(),
                    );
                }
            } else if let Some(p) = by_pull.get(key) {
                let text = quoted(
                    format!("Comment on pull request {}#{} ({url})", p.repo, p.number),
                    body,
                );
                push(&p.issue_id, &p.issue, id, c, created, text);
            }
        }
        if !pulls.iter().any(|p| p.repo.eq_ignore_ascii_case(repo)) {
            continue;
        }
        // Review comments need Pull requests read: without it, only they are missing.
        let mut failed = Vec::new();
        let list = match comments_of(
            repo,
            "pulls",
            "pull_request_url",
            &mut out.ignored,
            &mut out.pages,
        ) {
            Ok((list, cut_at, newest)) => {
                out.cut_at = earliest(out.cut_at, cut_at);
                out.newest = earliest(out.newest, newest);
                list
            }
            Err(e) => {
                isolated(Err(e), "Pull requests", &mut failed)?;
                Vec::new()
            }
        };
        if gh
            .feedback
            .said
            .episode(&format!("review-comments {repo}"), !failed.is_empty())
        {
            let line = format!(
                "{repo}: review comments on pull requests cannot be read: {} (give the token Pull requests: Read-only)",
                failed[0].0
            );
            log::warn!("{line}");
            out.ignored.push(line);
        }
        for (key, c) in &list {
            let Some(p) = by_pull.get(key) else {
                continue;
            };
            let (created, body, url) = (
                field(c, "created_at"),
                field(c, "body"),
                field(c, "html_url"),
            );
            let place = match (
                c.get("path").and_then(Value::as_str),
                c.get("line").and_then(Value::as_u64),
            ) {
                (Some(path), Some(line)) => format!(" on {path}:{line}"),
                (Some(path), None) => format!(" on {path}"),
                _ => String::new(),
            };
            let text = quoted(
                format!(
                    "Review comment{place} in pull request {}#{} ({url})",
                    p.repo, p.number
                ),
                body,
            );
            let id = id_of("review-comment", c);
            push(&p.issue_id, &p.issue, id, c, created, text);
        }
    }
    for p in &pulls {
        // Each pull request is read on its own: one the token may not read loses only its
        // own feedback, said once per episode with what the token needs.
        let mut failed = Vec::new();
        let reviews = isolated(gh.reviews(p), "Pull requests", &mut failed)?;
        let runs = isolated(gh.check_runs(p), "Checks", &mut failed)?;
        let statuses = isolated(gh.statuses(p), "Commit statuses", &mut failed)?;
        let key = format!("pull unread {}#{}", p.repo, p.number).to_ascii_lowercase();
        if gh.feedback.said.episode(&key, !failed.is_empty()) {
            let errors: Vec<&str> = failed.iter().map(|(e, _)| e.as_str()).collect();
            let mut needs: Vec<&str> = failed.iter().map(|(_, p)| *p).collect();
            needs.dedup();
            let line = format!(
                "{}: the feedback on pull request {}#{} ({}) cannot be read: {}; give the token {}: Read-only",
                p.issue,
                p.repo,
                p.number,
                p.url,
                errors.join("; "),
                needs.join(", ")
            );
            log::warn!("{line}");
            out.ignored.push(line);
        }
        for r in &reviews {
            let state = r.get("state").and_then(Value::as_str).unwrap_or("");
            let body = r.get("body").and_then(Value::as_str).unwrap_or("").trim();
            if body.starts_with(crate::steering::ASIDE) {
                continue;
            }
            let what = match state {
                "CHANGES_REQUESTED" => "Changes requested",
                "COMMENTED" if !body.is_empty() => "A review",
                _ => continue,
            };
            let url = r.get("html_url").and_then(Value::as_str).unwrap_or(&p.url);
            let created = r.get("submitted_at").and_then(Value::as_str).unwrap_or("");
            let text = format!(
                "{what} on pull request {}#{} ({url}):\n{}",
                p.repo,
                p.number,
                if body.is_empty() { "(no text)" } else { body }
            );
            let id = id_of("review", r);
            push(&p.issue_id, &p.issue, id, r, created, text);
        }
        let Some(sha) = &p.head else { continue };
        for run in &runs {
            let conclusion = run.get("conclusion").and_then(Value::as_str).unwrap_or("");
            let at = run
                .get("completed_at")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !FAILED.contains(&conclusion) || !after(at, since) {
                continue;
            }
            let name = run.get("name").and_then(Value::as_str).unwrap_or("a check");
            let url = run
                .get("details_url")
                .or_else(|| run.get("html_url"))
                .and_then(Value::as_str)
                .unwrap_or(&p.url);
            let mut text = format!(
                "Check \"{name}\" ended {conclusion} on pull request {}#{} ({url})",
                p.repo, p.number
            );
            for part in ["/output/title", "/output/summary"] {
                if let Some(s) = run
                    .pointer(part)
                    .and_then(Value::as_str)
                    .filter(|s| !s.trim().is_empty())
                {
                    text.push('\n');
                    text.push_str(s.trim());
                }
            }
            let author = run
                .pointer("/app/name")
                .and_then(Value::as_str)
                .unwrap_or("checks")
                .to_string();
            out.checks.push(Message {
                issue_id: p.issue_id.clone(),
                source: Source::Github,
                author,
                text,
                at: at.to_string(),
                key: format!(
                    "check-{}-{}",
                    run.get("id").map(Value::to_string).unwrap_or_default(),
                    sha
                ),
            });
        }
        for s in &statuses {
            let state = s.get("state").and_then(Value::as_str).unwrap_or("");
            let at = s
                .get("updated_at")
                .or_else(|| s.get("created_at"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if !matches!(state, "failure" | "error") || !after(at, since) {
                continue;
            }
            let context = s
                .get("context")
                .and_then(Value::as_str)
                .unwrap_or("a status");
            let url = s
                .get("target_url")
                .and_then(Value::as_str)
                .unwrap_or(&p.url);
            let mut text = format!(
                "Status \"{context}\" is {state} on pull request {}#{} ({url})",
                p.repo, p.number
            );
            if let Some(d) = s
                .get("description")
                .and_then(Value::as_str)
                .filter(|d| !d.trim().is_empty())
            {
                text.push('\n');
                text.push_str(d.trim());
            }
            out.checks.push(Message {
                issue_id: p.issue_id.clone(),
                source: Source::Github,
                author: context.to_string(),
                text,
                at: at.to_string(),
                key: id_of("status", s),
            });
        }
    }
    out.comments = comments;
    Ok(out)
}

/// A string field of a GitHub record (empty when it has none).
fn field<'v>(v: &'v Value, key: &str) -> &'v str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// `<prefix>-<GitHub's id>`: a message key.
fn id_of(prefix: &str, v: &Value) -> String {
    format!(
        "{prefix}-{}",
        v.get("id").map(Value::to_string).unwrap_or_default()
    )
}

/// The open pull requests that close some issues.
pub(super) struct Linked {
    pub pulls: Vec<Pull>,
    /// Identifiers of issues whose pull requests the token may not read.
    pub unreadable: Vec<String>,
}

/// Why `p` is not watched (its feedback never steers), or `None` when it is: svc's account
/// opened it, or a person with write access to the repository who is in `users` (when set).
pub(super) fn unwatched(gh: &GitHub, p: &Pull, viewer: &str) -> Option<&'static str> {
    if p.author.eq_ignore_ascii_case(viewer) {
        None
    } else if !WRITERS.contains(&p.association.as_str()) {
        Some("not a collaborator")
    } else if !gh.opts.users.is_empty()
        && !gh
            .opts
            .users
            .iter()
            .any(|u| u.trim().eq_ignore_ascii_case(&p.author))
    {
        Some("not in the tracker's users")
    } else {
        None
    }
}

/// The open pull requests that close `issues` (one GraphQL query per 100 issues).
pub(super) fn linked_pulls(gh: &GitHub, issues: &[&Issue]) -> Result<Linked, TrackerError> {
    let mut nodes: Vec<(String, &Issue)> = Vec::new();
    for i in issues {
        let Ok((repo, n)) = gh.resolve(&i.id) else {
            continue;
        };
        if let Ok(node) = gh.node_id(&repo, n) {
            nodes.push((node, i));
        }
    }
    let mut out = Linked {
        pulls: Vec::new(),
        unreadable: Vec::new(),
    };
    for chunk in nodes.chunks(100) {
        let ids: Vec<&str> = chunk.iter().map(|(n, _)| n.as_str()).collect();
        let data = gh.api.graphql(
            "query SvcLinkedPulls($ids: [ID!]!) { nodes(ids: $ids) { ... on Issue { id number closedByPullRequestsReferences(first: 10, includeClosedPrs: false) { nodes { id number url state isDraft headRefOid repository { nameWithOwner } author { login } authorAssociation } } } } rateLimit { cost remaining limit resetAt used } }",
            json!({"ids": ids}),
            true,
        )?;
        for node in data
            .get("nodes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(issue) = node
                .get("id")
                .and_then(Value::as_str)
                .and_then(|id| chunk.iter().find(|(n, _)| n == id))
                .map(|(_, i)| *i)
            else {
                continue;
            };
            // The issue is there but its pull requests are not: GitHub's FORBIDDEN (the token
            // may not read pull requests).
            if node
                .get("closedByPullRequestsReferences")
                .is_none_or(Value::is_null)
            {
                out.unreadable.push(issue.identifier.clone());
                continue;
            }
            for pr in node
                .pointer("/closedByPullRequestsReferences/nodes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if pr.get("state").and_then(Value::as_str) != Some("OPEN") {
                    continue;
                }
                let (Some(repo), Some(number)) = (
                    pr.pointer("/repository/nameWithOwner")
                        .and_then(Value::as_str),
                    pr.get("number").and_then(Value::as_u64),
                ) else {
                    continue;
                };
                let text = |path: &str| {
                    pr.pointer(path)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                out.pulls.push(Pull {
                    author: text("/author/login"),
                    association: text("/authorAssociation"),
                    repo: gh.canonical(repo),
                    number,
                    url: pr
                        .get("url")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    head: pr
                        .get("headRefOid")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    issue_id: issue.id.clone(),
                    issue: issue.identifier.clone(),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        crate::time::parse_time(s).unwrap()
    }

    /// A cursor carries where a read goes on from after a cut one, read back as written; the
    /// shared cursor's fields are left as they are, and a plain cursor has none.
    #[test]
    fn a_resume_point_rides_in_the_cursor() {
        let cur = comments::Cursor::start(at("2026-11-25T10:00:00Z"));
        assert_eq!(resume_of(Some(&cur.text())), None);
        let text = with_resume(cur.text(), Some(at("2026-11-25T10:07:31Z")));
        assert_eq!(resume_of(Some(&text)), Some(at("2026-11-25T10:07:31Z")));
        assert_eq!(comments::Cursor::read(Some(&text)), Some(cur));
        assert_eq!(with_resume(cur.text(), None), cur.text());
        assert_eq!(mark(at("2026-11-25T10:07:31Z")), at("2026-11-25T10:00:00Z"));
    }
}
