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
//! * on each open pull request that closes it: a review that requests changes (or comments
//!   with text), a review comment, a comment on the pull request's conversation, each by an
//!   allowed person; and each check run or commit status of its head that fails.
//!
//! Costs: one GraphQL query (about a point) finds the pull requests; every other read is a
//! conditional REST request (free when nothing changed): the repository's issue comments and
//! review comments since a quarter-hour mark (the URL stays the same for a quarter hour, so
//! GitHub can answer 304), and each pull request's reviews, check runs and status.
//!
//! Feedback on a parked issue goes to the state thread as held ([`Batch::held`]): it waits for
//! the issue's next run (kept in the claim store like every waiting message), so the run that
//! picks it up has it in its first prompt. With `rework_state` the feedback also moves the issue
//! there, so that run comes at once; without it, the run comes when a person moves the issue
//! back to work.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::GitHub;
use crate::steering::{Batch, Message, Source};
use crate::tracker::comments::{self, Author, Comment};
use crate::tracker::{Issue, TrackerError};

/// Parked issues watched at most.
pub(super) const PARKED_MAX: usize = 100;
/// Feedback keys remembered as having sent their issue back (well over what one overlap of
/// the comment cursor can offer again).
pub(super) const REWORKED_MAX: usize = 1000;
/// List reads ask for comments updated since a mark this coarse.
const MARK: u64 = 15 * 60;
/// GitHub's times are whole seconds.
const PRECISION: Duration = Duration::from_secs(1);
/// Check conclusions that are failures.
const FAILED: &[&str] = &["failure", "timed_out", "action_required", "startup_failure"];

/// An open pull request that closes a watched issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pull {
    pub repo: String,
    pub number: u64,
    pub url: String,
    pub head: Option<String>,
    /// The issue it closes.
    pub issue_id: String,
    pub issue: String,
}

pub(super) fn read(
    gh: &GitHub,
    issues: &[Issue],
    cursor: Option<&str>,
    polled_at: SystemTime,
) -> Result<Batch, TrackerError> {
    let now = SystemTime::now();
    let cur = match comments::cursor_or_start(cursor, polled_at) {
        Ok(c) => c,
        Err(first) => return Ok(first),
    };
    let rework = gh.opts.rework_state.clone();
    let parked = gh.memo().parked.clone();
    let given: HashSet<&str> = issues.iter().map(|i| i.id.as_str()).collect();
    let parked: Vec<Issue> = parked
        .into_iter()
        .filter(|i| !given.contains(i.id.as_str()))
        .collect();
    // A watched issue already parked (its agent just moved it to `Human Review` and its run is
    // stopping) is parked too: feedback on it is for its next run, not for the ending one.
    let parked_ids: HashSet<String> = parked
        .iter()
        .chain(issues.iter().filter(|i| gh.is_parked(&i.state)))
        .map(|i| i.id.clone())
        .collect();
    let watched: Vec<&Issue> = issues.iter().chain(parked.iter()).collect();

    let mut batch = if watched.is_empty() {
        comments::batch_coarse(
            Source::Github,
            Vec::new(),
            cur,
            &gh.opts.users,
            now,
            PRECISION,
        )
    } else {
        let since = cur.since();
        let found = gather(gh, &watched, &parked_ids, since)?;
        let mut b = comments::batch_coarse(
            Source::Github,
            found.comments,
            cur,
            &gh.opts.users,
            now,
            PRECISION,
        );
        b.messages.extend(found.checks);
        b
    };

    // Feedback on a parked issue waits for its next run (held). With `rework_state` it also
    // sends the issue back to work; when that move fails, the feedback waits for a later poll.
    let mut moved: HashMap<String, bool> = HashMap::new();
    let mut kept = Vec::new();
    for m in std::mem::take(&mut batch.messages) {
        if !parked_ids.contains(&m.issue_id) {
            kept.push(m);
            continue;
        }
        let Some(state) = &rework else {
            batch.held.push(m);
            continue;
        };
        // Offered again (the state thread takes it once): it moved its issue already.
        if gh.memo().reworked.contains(&m.key) {
            batch.held.push(m);
            continue;
        }
        let ok = *moved
            .entry(m.issue_id.clone())
            .or_insert_with(|| match gh.set_state(&m.issue_id, state) {
                Ok(_) => {
                    log::info!(
                        "{}: review feedback from {} moves it to {state}",
                        m.issue_id,
                        m.author
                    );
                    true
                }
                Err(e) => {
                    log::warn!(
                        "{}: review feedback came, but moving it to {state} failed: {e}; trying again at a later poll",
                        m.issue_id
                    );
                    false
                }
            });
        if ok {
            let mut memo = gh.memo();
            memo.reworked.push_back(m.key.clone());
            while memo.reworked.len() > REWORKED_MAX {
                memo.reworked.pop_front();
            }
            batch.held.push(m);
        }
    }
    batch.messages = kept;
    // A move that failed is tried again at the next poll: the cursor stays, so the feedback is
    // offered again.
    if moved.values().any(|ok| !ok) {
        batch.cursor = cursor.map(str::to_string);
    }
    let by_time = |a: &Message, b: &Message| {
        crate::time::parse_time(&a.at)
            .cmp(&crate::time::parse_time(&b.at))
            .then_with(|| a.key.cmp(&b.key))
    };
    batch.messages.sort_by(by_time);
    batch.held.sort_by(by_time);
    Ok(batch)
}

struct Found {
    /// Comments and reviews by people (the users filter applies).
    comments: Vec<Comment>,
    /// Failed checks and statuses (no person wrote them).
    checks: Vec<Message>,
}

/// Everything written about `watched` since `since`.
fn gather(
    gh: &GitHub,
    watched: &[&Issue],
    parked: &HashSet<String>,
    since: SystemTime,
) -> Result<Found, TrackerError> {
    let viewer = gh.viewer()?;
    let pulls = linked_pulls(gh, watched)?;
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
    let mark = since
        .duration_since(UNIX_EPOCH)
        .map(|d| UNIX_EPOCH + Duration::from_secs(d.as_secs() / MARK * MARK))
        .unwrap_or(UNIX_EPOCH);
    let mark = humantime::format_rfc3339_seconds(mark).to_string();
    let who = |c: &Value| -> (String, Author) {
        let login = c
            .pointer("/user/login")
            .and_then(Value::as_str)
            .unwrap_or("someone")
            .to_string();
        let kind = if login.eq_ignore_ascii_case(&viewer) {
            Author::Own
        } else if c.pointer("/user/type").and_then(Value::as_str) == Some("Bot") {
            Author::NotPerson("a bot".into())
        } else {
            Author::Person
        };
        (login, kind)
    };
    let mut out = Found {
        comments: Vec::new(),
        checks: Vec::new(),
    };
    let mut push =
        |issue_id: &str, issue: &str, id: String, c: &Value, created: &str, text: String| {
            let (author, kind) = who(c);
            out.comments.push(Comment {
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
    // The repository's comments of `kind` (`issues`, `pulls`) since the mark, each with the
    // lowercased `owner/name#N` its `parent` URL names.
    let comments_of = |repo: &str, kind: &str, parent: &str| -> Result<_, TrackerError> {
        let list = gh.api.get_all(
            &format!(
                "/repos/{repo}/{kind}/comments?since={mark}&sort=created&direction=asc&per_page=100"
            ),
            10,
        )?;
        let on = |c: &Value| -> Option<String> {
            let url = c.get(parent)?.as_str()?;
            let rest = &url[url.rfind("/repos/")? + "/repos/".len()..];
            let (repo, n) = rest.rsplit_once(&format!("/{kind}/"))?;
            Some(format!("{repo}#{}", n.parse::<u64>().ok()?).to_ascii_lowercase())
        };
        Ok(list
            .into_iter()
            .filter_map(|c| Some((on(&c)?, c)))
            .collect::<Vec<_>>())
    };
    for repo in &repos {
        for (key, c) in &comments_of(repo, "issues", "issue_url")? {
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
        for (key, c) in &comments_of(repo, "pulls", "pull_request_url")? {
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
        for r in &gh.reviews(p)? {
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
        for run in &gh.check_runs(p)? {
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
        for s in &gh.statuses(p)? {
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

/// A person's text under a line saying where it was written; empty (not delivered) when the
/// text is blank or an `!aside`.
fn quoted(header: String, body: &str) -> String {
    let body = body.trim();
    if body.is_empty() || body.starts_with(crate::steering::ASIDE) {
        String::new()
    } else {
        format!("{header}:\n{body}")
    }
}

/// Whether `at` (GitHub's whole seconds) may be after `since`.
fn after(at: &str, since: SystemTime) -> bool {
    crate::time::parse_time(at).is_some_and(|t| t + PRECISION > since)
}

/// The open pull requests that close `issues` (one GraphQL query per 100 issues).
pub(super) fn linked_pulls(gh: &GitHub, issues: &[&Issue]) -> Result<Vec<Pull>, TrackerError> {
    let mut nodes: Vec<(String, &Issue)> = Vec::new();
    for i in issues {
        let Ok((repo, n)) = gh.resolve(&i.id) else {
            continue;
        };
        if let Ok(node) = gh.node_id(&repo, n) {
            nodes.push((node, i));
        }
    }
    let mut out = Vec::new();
    for chunk in nodes.chunks(100) {
        let ids: Vec<&str> = chunk.iter().map(|(n, _)| n.as_str()).collect();
        let data = gh.api.graphql(
            "query SvcLinkedPulls($ids: [ID!]!) { nodes(ids: $ids) { ... on Issue { id number closedByPullRequestsReferences(first: 10, includeClosedPrs: false) { nodes { id number url state isDraft headRefOid repository { nameWithOwner } author { login } } } } } rateLimit { cost remaining limit resetAt used } }",
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
                out.push(Pull {
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
