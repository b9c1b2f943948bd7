//! `github`: GitHub issues as the tracker, on GitHub's real REST v3 and GraphQL APIs.
//!
//! * **Identity.** An issue's `id` and `identifier` are both `owner/name#N`.
//! * **States.** With `project` (a Projects v2 board), an open issue's state is its item's
//!   single-select value (`Status`); moving it sets that field (adding the issue to the board
//!   first if it is not on it). Without a project, an open issue is in the state of its
//!   `status: <State>` label, else `Todo`; a closed one is `Done` (completed), `Cancelled` (not
//!   planned) or `Duplicate`; moving it edits the label, or closes or reopens the issue. A
//!   closed issue is never active, whatever its board says.
//! * **Candidates.** Each repository's open issues (all of `labels`, `assignee`), read with
//!   one conditional request per 100 issues: an unchanged list answers 304 and costs nothing.
//!   With a board, one GraphQL query of its items (about one point per 100 items) gives the
//!   states. Pull requests are never issues.
//! * **Blockers.** GitHub's issue dependencies: `issue_dependencies_summary` tells which issues
//!   have blockers, and only those are asked (`dependencies/blocked_by`, conditional).
//! * **Steering and pull-request feedback** live in [`feedback`].
//!
//! The API client ([`api`]) keeps the rate limits for the snapshot and backs off on limits.

pub mod api;
pub mod doctor;
mod feedback;

pub use feedback::Pull;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub use super::forge::split_identifier;
use super::forge::{self, Feedback, Remembered, labels};
use super::http::enc;
use super::{Blocker, Issue, StateNames, Tracker, TrackerError};
use crate::config::GithubOptions;
use api::Api;

/// An open issue on the board with no value in its status field.
pub const NO_STATUS: &str = "No Status";
/// Pages of 100 open issues read per repository at most.
const OPEN_PAGES: usize = 50;
/// Pages of 100 board items read at most.
const BOARD_PAGES: usize = 50;
/// Pages of 100 read at most of a list svc needs whole (a pull request's reviews, an issue's
/// comments or blockers).
const LIST_PAGES: usize = 30;
/// A board read this recently answers the poll's own state check without another query (the
/// poll reads it for candidates, then at once for the running issues); the check after a turn
/// reads it again.
const BOARD_FRESH: Duration = Duration::from_secs(1);
/// A move reads the board at most this old (the options and items it needs change seldom).
const SET_STATE_BOARD_AGE: Duration = Duration::from_secs(60);

pub struct GitHub {
    pub(crate) api: Api,
    opts: GithubOptions,
    states: StateNames,
    /// The token's user's login.
    viewer: Remembered<String>,
    /// The feedback pipeline's state: troubles said, parked issues, rework (shared with
    /// GitLab).
    feedback: Feedback,
    memo: Mutex<Memo>,
}

#[derive(Default)]
struct Memo {
    /// GraphQL node ids of issues, by lowercased identifier (from their REST records and the
    /// board), trimmed at each candidate read to the open issues in scope and the board's.
    nodes: HashMap<String, String>,
    board: Option<Arc<Board>>,
    /// While steering reads on after a cut comment list (`feedback`'s resume point): for each
    /// list's first page, the last page read, where the next read of that list goes on from.
    comment_pages: HashMap<String, String>,
}

/// What svc knows of the project board.
#[derive(Clone)]
struct Board {
    project_id: String,
    field_id: String,
    /// The status field's options: (option id, name).
    options: Vec<(String, String)>,
    /// By lowercased identifier: (item id, status).
    items: HashMap<String, (String, Option<String>)>,
    read_at: Instant,
}

impl Board {
    fn option(&self, state: &str) -> Option<&(String, String)> {
        self.options
            .iter()
            .find(|(_, name)| name.trim().eq_ignore_ascii_case(state.trim()))
    }
}

/// The repository of a REST record (`repository_url` ends in `/repos/<owner>/<name>`).
fn repo_of(v: &Value) -> Option<&str> {
    let url = v.get("repository_url")?.as_str()?;
    let at = url.rfind("/repos/")?;
    Some(&url[at + "/repos/".len()..])
}

/// The state of an issue without a board: closed by its reason, open by its `status:` label.
fn label_state(v: &Value) -> String {
    if v.get("state").and_then(Value::as_str) == Some("closed") {
        return match v.get("state_reason").and_then(Value::as_str) {
            Some("not_planned") => "Cancelled",
            Some("duplicate") => "Duplicate",
            _ => "Done",
        }
        .to_string();
    }
    labels(v)
        .iter()
        .find_map(|l| status_label(l).map(str::to_string))
        .unwrap_or_else(|| "Todo".to_string())
}

/// The state a `status: <State>` label names.
fn status_label(label: &str) -> Option<&str> {
    let (head, rest) = label.split_once(':')?;
    head.trim()
        .eq_ignore_ascii_case("status")
        .then(|| rest.trim())
        .filter(|s| !s.is_empty())
}

fn is_pull_request(v: &Value) -> bool {
    v.get("pull_request").is_some_and(|p| !p.is_null())
}

/// Blockers GitHub says an issue has (open or closed).
fn has_blockers(v: &Value) -> bool {
    v.pointer("/issue_dependencies_summary/total_blocked_by")
        .and_then(Value::as_u64)
        .is_some_and(|n| n > 0)
}

impl GitHub {
    pub fn new(opts: &GithubOptions, states: StateNames) -> GitHub {
        GitHub {
            api: Api::new(&opts.endpoint, &opts.graphql_url(), opts.api_key.clone()),
            opts: opts.clone(),
            states,
            viewer: Remembered::default(),
            feedback: Feedback::new(
                crate::steering::Source::Github,
                "comments, reviews and checks",
                &opts.endpoint,
                &opts.users,
                opts.rework_state.as_deref(),
            ),
            memo: Mutex::default(),
        }
    }

    /// Remembers what sent issues back in the daemon's durable store, once it is handed in.
    pub fn keeping(mut self, facts: crate::facts::Later) -> GitHub {
        self.feedback.keep_in(facts);
        self
    }

    /// An open issue that waits in a state neither active nor terminal (`Human Review`), where
    /// pull-request feedback may send it back to `rework_state`.
    fn is_parked(&self, state: &str) -> bool {
        !self.states.is_active(state) && !self.states.is_terminal(state) && state != NO_STATUS
    }

    pub fn with_backoff(mut self, backoff: Duration) -> GitHub {
        self.api.set_backoff(backoff);
        self
    }

    pub fn states(&self) -> &StateNames {
        &self.states
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, Memo> {
        self.memo.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The token's user (`GET /user`, asked once).
    pub fn viewer(&self) -> Result<String, TrackerError> {
        self.viewer.get_or_read(|| {
            let got = self.api.get("/user")?;
            got.value
                .get("login")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| TrackerError::unavailable("github GET /user returned no login"))
        })
    }

    /// The configured repositories, and how issue ids name them.
    fn places(&self) -> forge::Places<'_> {
        forge::Places {
            provider: "github",
            key: "repos",
            configured: &self.opts.repos,
            form: "owner/name#N",
            example: "octo/app",
        }
    }

    /// The configured spelling of `repo` when it is one of `repos`, else `repo` as it is.
    fn canonical(&self, repo: &str) -> String {
        self.places().canonical(repo)
    }

    /// [`GitHub::resolve`], refusing an issue outside the configured `repos` (what the `github`
    /// pack acts on: the token may reach other repositories, the workflow does not).
    pub fn resolve_in_repos(&self, id: &str) -> Result<(String, u64), TrackerError> {
        self.places().resolve_configured(id)
    }

    /// An issue id an agent or operator gave: `owner/name#N`, or `#N` / `N` when svc works a
    /// single repository.
    pub fn resolve(&self, id: &str) -> Result<(String, u64), TrackerError> {
        self.places().resolve(id)
    }

    /// The query string that scopes issue lists: `labels` and `assignee`.
    fn scope(&self) -> Result<String, TrackerError> {
        let o = &self.opts;
        forge::scope(&o.labels, o.assignee.as_deref(), "assignee", || {
            self.viewer()
        })
    }

    /// The open issues of `repo` in scope (pull requests left out), the oldest
    /// [`OPEN_PAGES`] pages of them (said once per episode when there are more).
    fn open_issues(&self, repo: &str) -> Result<Vec<Value>, TrackerError> {
        let path = format!(
            "/repos/{repo}/issues?state=open&sort=created&direction=asc&per_page=100{}",
            self.scope()?
        );
        let listed = self.api.get_list(&path, OPEN_PAGES)?;
        if self
            .feedback
            .said
            .episode(&format!("open:{repo}"), !listed.complete)
        {
            log::warn!(
                "github {repo} has more than {} open issues in scope: svc reads the oldest {} and sees no newer one; narrow the scope with labels or assignee",
                OPEN_PAGES * 100,
                OPEN_PAGES * 100
            );
        }
        let mut list = listed.items;
        list.retain(|v| !is_pull_request(v));
        Ok(list)
    }

    /// The board (its items when `refresh`, or when the last read is older than `fresh`);
    /// `None` without a project.
    fn board(&self, max_age: Duration) -> Result<Option<Arc<Board>>, TrackerError> {
        let Some(project) = &self.opts.project else {
            return Ok(None);
        };
        if let Some(b) = &self.memo().board
            && b.read_at.elapsed() < max_age
        {
            return Ok(Some(Arc::clone(b)));
        }
        let query = "query SvcProjectItems($owner: String!, $number: Int!, $field: String!, $after: String) { repositoryOwner(login: $owner) { ... on ProjectV2Owner { projectV2(number: $number) { id title field(name: $field) { ... on ProjectV2SingleSelectField { id name options { id name } } } items(first: 100, after: $after) { pageInfo { hasNextPage endCursor } nodes { id isArchived fieldValueByName(name: $field) { ... on ProjectV2ItemFieldSingleSelectValue { name optionId } } content { __typename ... on Issue { id number state stateReason repository { nameWithOwner } } } } } } } } rateLimit { cost remaining limit resetAt used } }";
        let mut board: Option<Board> = None;
        let mut after: Option<String> = None;
        let mut nodes = Vec::new();
        let mut cut = true;
        for _ in 0..BOARD_PAGES {
            let data = self.api.graphql(
                query,
                json!({"owner": project.owner, "number": project.number, "field": project.status_field, "after": after}),
                false,
            )?;
            let p = data
                .pointer("/repositoryOwner/projectV2")
                .filter(|p| !p.is_null())
                .ok_or_else(|| {
                    TrackerError::config(format!(
                        "github project {}/{} was not found (or the token cannot read it)",
                        project.owner, project.number
                    ))
                })?;
            let b = board.get_or_insert_with(|| Board {
                project_id: p["id"].as_str().unwrap_or_default().to_string(),
                field_id: p
                    .pointer("/field/id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                options: p
                    .pointer("/field/options")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|o| {
                        Some((
                            o["id"].as_str()?.to_string(),
                            o["name"].as_str()?.to_string(),
                        ))
                    })
                    .collect(),
                items: HashMap::new(),
                read_at: Instant::now(),
            });
            if b.field_id.is_empty() {
                return Err(TrackerError::config(format!(
                    "github project {}/{} has no single-select field named {:?}: set project.status_field",
                    project.owner, project.number, project.status_field
                )));
            }
            for item in p
                .pointer("/items/nodes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let content = &item["content"];
                if item["isArchived"].as_bool() == Some(true)
                    || content["__typename"].as_str() != Some("Issue")
                {
                    continue;
                }
                let (Some(repo), Some(n)) = (
                    content
                        .pointer("/repository/nameWithOwner")
                        .and_then(Value::as_str),
                    content["number"].as_u64(),
                ) else {
                    continue;
                };
                let key = format!("{repo}#{n}").to_ascii_lowercase();
                let status = item
                    .pointer("/fieldValueByName/name")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                if let Some(node) = content["id"].as_str() {
                    nodes.push((key.clone(), node.to_string()));
                }
                b.items.insert(
                    key,
                    (item["id"].as_str().unwrap_or_default().to_string(), status),
                );
            }
            match (
                p.pointer("/items/pageInfo/hasNextPage")
                    .and_then(Value::as_bool),
                p.pointer("/items/pageInfo/endCursor")
                    .and_then(Value::as_str),
            ) {
                (Some(true), Some(c)) => after = Some(c.to_string()),
                _ => {
                    cut = false;
                    break;
                }
            }
        }
        if self.feedback.said.episode("board", cut) {
            log::warn!(
                "github project {}/{} has more than {} items: svc reads the first {} and sees no issue past them; archive the items that are done",
                project.owner,
                project.number,
                BOARD_PAGES * 100,
                BOARD_PAGES * 100
            );
        }
        let board = board.map(Arc::new);
        let mut memo = self.memo();
        memo.nodes.extend(nodes);
        memo.board = board.clone();
        Ok(board)
    }

    /// The state of a REST record.
    fn state_of(&self, v: &Value, key: &str, board: Option<&Board>) -> String {
        let closed = v.get("state").and_then(Value::as_str) == Some("closed");
        if let Some(b) = board {
            match b.items.get(key).and_then(|(_, s)| s.clone()) {
                Some(s) if !closed || self.states.is_terminal(&s) => return s,
                None if !closed => return NO_STATUS.to_string(),
                _ => {}
            }
        }
        label_state(v)
    }

    /// The normalized issue of a REST record (`repo` when the record does not say).
    fn record(&self, v: &Value, repo: &str, board: Option<&Board>) -> Issue {
        let repo = self.canonical(repo_of(v).unwrap_or(repo));
        let number = v.get("number").and_then(Value::as_u64).unwrap_or_default();
        let identifier = format!("{repo}#{number}");
        let key = identifier.to_ascii_lowercase();
        if let Some(node) = v.get("node_id").and_then(Value::as_str) {
            self.memo().nodes.insert(key.clone(), node.to_string());
        }
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let state = self.state_of(v, &key, board);
        Issue {
            id: identifier.clone(),
            identifier,
            title: s("title").unwrap_or_default(),
            description: s("body"),
            state_type: Some(self.states.state_type(&state).to_string()),
            state,
            labels: labels(v),
            url: s("html_url"),
            created_at: s("created_at"),
            updated_at: s("updated_at"),
            priority: None,
            blocked_by: Vec::new(),
        }
    }

    /// The issues that block `issue` (GitHub's "blocked by" dependencies).
    fn blockers(&self, issue: &Issue, board: Option<&Board>) -> Result<Vec<Blocker>, TrackerError> {
        let (repo, n) = self.resolve(&issue.id)?;
        let list = self.api.get_all(
            &format!("/repos/{repo}/issues/{n}/dependencies/blocked_by?per_page=100"),
            LIST_PAGES,
        )?;
        Ok(list
            .iter()
            .map(|v| {
                let b = self.record(v, &repo, board);
                Blocker {
                    id: b.id,
                    identifier: b.identifier,
                    state: b.state,
                }
            })
            .collect())
    }

    /// The issue `id` (`owner/name#N`) as it is now, with its blockers.
    pub fn read(&self, id: &str) -> Result<Issue, TrackerError> {
        self.read_with(id, BOARD_FRESH)
    }

    /// [`GitHub::read`] with the board read at most `board_age` ago.
    fn read_with(&self, id: &str, board_age: Duration) -> Result<Issue, TrackerError> {
        let (repo, n) = self.resolve(id)?;
        let got = self.api.get(&format!("/repos/{repo}/issues/{n}"))?;
        if is_pull_request(&got.value) {
            return Err(TrackerError::not_found(format!(
                "{repo}#{n} is a pull request, not an issue"
            )));
        }
        let board = self.board(board_age)?;
        let mut issue = self.record(&got.value, &repo, board.as_deref());
        if has_blockers(&got.value) {
            issue.blocked_by = self.blockers(&issue, board.as_deref())?;
        }
        Ok(issue)
    }

    /// Moves `id` to `state`: the board's status field, or the `status:` label and the
    /// open/closed state. Returns the issue as it is afterwards.
    pub fn set_state(&self, id: &str, state: &str) -> Result<Issue, TrackerError> {
        let (repo, n) = self.resolve(id)?;
        let state = state.trim();
        if state.is_empty() {
            return Err(TrackerError::invalid("'status' is required"));
        }
        if self.opts.project.is_some() {
            let board = self
                .board(SET_STATE_BOARD_AGE)?
                .ok_or_else(|| TrackerError::config("github project is not readable"))?;
            let Some((option, name)) = board.option(state).cloned() else {
                let names: Vec<&str> = board.options.iter().map(|(_, n)| n.as_str()).collect();
                return Err(TrackerError::invalid(format!(
                    "the board's status field has no option {state:?} (it has: {})",
                    names.join(", ")
                )));
            };
            let key = format!("{repo}#{n}").to_ascii_lowercase();
            let item = match board.items.get(&key) {
                Some((item, _)) => item.clone(),
                None => self.add_to_board(&board, &repo, n)?,
            };
            self.api.graphql(
                "mutation SvcSetStatus($project: ID!, $item: ID!, $field: ID!, $option: String!) { updateProjectV2ItemFieldValue(input: {projectId: $project, itemId: $item, fieldId: $field, value: {singleSelectOptionId: $option}}) { projectV2Item { id } } }",
                json!({"project": board.project_id, "item": item, "field": board.field_id, "option": option}),
                false,
            )?;
            if let Some(b) = self.memo().board.as_mut() {
                Arc::make_mut(b).items.insert(key, (item, Some(name)));
            }
            // The board svc knows has the move: the issue is read without asking for it again.
            return self.read_with(&format!("{repo}#{n}"), SET_STATE_BOARD_AGE);
        }
        let got = self.api.get(&format!("/repos/{repo}/issues/{n}"))?;
        let current = got.value;
        if is_pull_request(&current) {
            return Err(TrackerError::invalid(format!(
                "{repo}#{n} is a pull request, not an issue"
            )));
        }
        let closed = current.get("state").and_then(Value::as_str) == Some("closed");
        let old: Vec<String> = labels(&current)
            .into_iter()
            .filter(|l| status_label(l).is_some())
            .collect();
        let terminal = self.states.is_terminal(state);
        let want_label =
            (!terminal && !state.eq_ignore_ascii_case("Todo")).then(|| format!("status: {state}"));
        if let Some(label) = &want_label
            && !old.iter().any(|l| l == label)
        {
            self.api.write(
                "POST",
                &format!("/repos/{repo}/issues/{n}/labels"),
                &json!({"labels": [label]}),
                true,
            )?;
        }
        for label in old.iter().filter(|l| Some(*l) != want_label.as_ref()) {
            match self.api.write(
                "DELETE",
                &format!("/repos/{repo}/issues/{n}/labels/{}", enc(label)),
                &Value::Null,
                true,
            ) {
                Ok(_) => {}
                Err(e) if e.kind == super::TrackerErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if terminal {
            let lower = state.to_ascii_lowercase();
            let reason = if lower.starts_with("cancel") || lower.starts_with("won") {
                "not_planned"
            } else if lower.starts_with("duplicate") {
                "duplicate"
            } else {
                "completed"
            };
            let reason_now = current.get("state_reason").and_then(Value::as_str);
            if !closed || reason_now != Some(reason) {
                self.api.write(
                    "PATCH",
                    &format!("/repos/{repo}/issues/{n}"),
                    &json!({"state": "closed", "state_reason": reason}),
                    true,
                )?;
            }
        } else if closed {
            self.api.write(
                "PATCH",
                &format!("/repos/{repo}/issues/{n}"),
                &json!({"state": "open"}),
                true,
            )?;
        }
        self.read(&format!("{repo}#{n}"))
    }

    fn add_to_board(&self, board: &Board, repo: &str, n: u64) -> Result<String, TrackerError> {
        let node = self.node_id(repo, n)?;
        let data = self.api.graphql(
            "mutation SvcAddItem($project: ID!, $content: ID!) { addProjectV2ItemById(input: {projectId: $project, contentId: $content}) { item { id } } }",
            json!({"project": board.project_id, "content": node}),
            false,
        )?;
        data.pointer("/addProjectV2ItemById/item/id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| TrackerError::unavailable("github did not add the issue to the board"))
    }

    /// The GraphQL node id of an issue (remembered from its REST record, else read).
    fn node_id(&self, repo: &str, n: u64) -> Result<String, TrackerError> {
        let key = format!("{repo}#{n}").to_ascii_lowercase();
        if let Some(node) = self.memo().nodes.get(&key) {
            return Ok(node.clone());
        }
        let got = self.api.get(&format!("/repos/{repo}/issues/{n}"))?;
        got.value
            .get("node_id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| TrackerError::unavailable("github returned an issue without a node id"))
    }

    /// The options of the board's status field (`None` without a project), read now.
    pub fn board_options(&self) -> Result<Option<Vec<String>>, TrackerError> {
        Ok(self
            .board(Duration::ZERO)?
            .map(|b| b.options.iter().map(|(_, name)| name.clone()).collect()))
    }

    /// The issues `ids` as they are (each a conditional read), their states from the board
    /// read at most `board_age` ago.
    fn issues_now(&self, ids: &[String], board_age: Duration) -> Result<Vec<Issue>, TrackerError> {
        let mut out = Vec::new();
        let board = self.board(board_age)?;
        for id in ids {
            let Ok((repo, n)) = self.resolve(id) else {
                continue;
            };
            let got = match self.api.get(&format!("/repos/{repo}/issues/{n}")) {
                Ok(g) => g,
                Err(e) if e.kind == super::TrackerErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if is_pull_request(&got.value) {
                continue;
            }
            let mut issue = self.record(&got.value, &repo, board.as_deref());
            if has_blockers(&got.value) {
                issue.blocked_by = self.blockers(&issue, board.as_deref())?;
            }
            out.push(issue);
        }
        Ok(out)
    }

    /// Every open issue in scope, whatever its state (for `github_query`).
    pub fn open_in_scope(&self) -> Result<Vec<Issue>, TrackerError> {
        let board = self.board(BOARD_FRESH)?;
        let mut out = Vec::new();
        for repo in &self.opts.repos {
            for v in self.open_issues(repo)? {
                let mut issue = self.record(&v, repo, board.as_deref());
                if has_blockers(&v) {
                    issue.blocked_by = self.blockers(&issue, board.as_deref())?;
                }
                out.push(issue);
            }
        }
        Ok(out)
    }

    /// The open pull requests that close `issue`, with whether each is watched (opened by
    /// svc's account or by someone who may steer).
    pub fn pulls_of(&self, issue: &Issue) -> Result<Vec<(Pull, bool)>, TrackerError> {
        let linked = feedback::linked_pulls(self, &[issue])?;
        if !linked.unreadable.is_empty() {
            return Err(TrackerError::config(format!(
                "the pull requests that close {} cannot be read: {}",
                issue.identifier,
                feedback::PULLS_PERMISSION
            )));
        }
        let viewer = self.viewer()?;
        Ok(linked
            .pulls
            .into_iter()
            .map(|p| {
                let watched = feedback::unwatched(self, &p, &viewer).is_none();
                (p, watched)
            })
            .collect())
    }

    /// The reviews of pull request `p`, oldest first.
    pub fn reviews(&self, p: &Pull) -> Result<Vec<Value>, TrackerError> {
        self.api.get_all(
            &format!("/repos/{}/pulls/{}/reviews?per_page=100", p.repo, p.number),
            LIST_PAGES,
        )
    }

    /// The check runs of `p`'s head commit (none without a head).
    pub fn check_runs(&self, p: &Pull) -> Result<Vec<Value>, TrackerError> {
        self.head_list(p, "check-runs?per_page=100", "check_runs")
    }

    /// The commit statuses of `p`'s head commit, from its combined status (none without a
    /// head).
    pub fn statuses(&self, p: &Pull) -> Result<Vec<Value>, TrackerError> {
        self.head_list(p, "status", "statuses")
    }

    /// The list `key` of `GET /repos/{repo}/commits/{head}/{path}`.
    fn head_list(&self, p: &Pull, path: &str, key: &str) -> Result<Vec<Value>, TrackerError> {
        let Some(sha) = &p.head else {
            return Ok(Vec::new());
        };
        let mut got = self
            .api
            .get(&format!("/repos/{}/commits/{sha}/{path}", p.repo))?;
        Ok(match got.value.get_mut(key).map(Value::take) {
            Some(Value::Array(list)) => list,
            _ => Vec::new(),
        })
    }

    /// Comments on `id` (`POST .../comments`, sent once: it is not idempotent).
    pub fn comment(&self, id: &str, body: &str) -> Result<Value, TrackerError> {
        let (repo, n) = self.resolve(id)?;
        self.api.write(
            "POST",
            &format!("/repos/{repo}/issues/{n}/comments"),
            &json!({"body": body}),
            false,
        )
    }

    /// Every comment of `id`, oldest first.
    pub fn comments(&self, id: &str) -> Result<Vec<Value>, TrackerError> {
        let (repo, n) = self.resolve(id)?;
        self.api.get_all(
            &format!("/repos/{repo}/issues/{n}/comments?per_page=100"),
            LIST_PAGES,
        )
    }

    /// Creates an issue in `repo` (the first configured one by default) carrying the
    /// configured `labels`, in `state` (default `Todo`).
    pub fn create(
        &self,
        repo: Option<&str>,
        title: &str,
        body: &str,
        state: Option<&str>,
    ) -> Result<Issue, TrackerError> {
        let repo = super::one_of_configured(&self.opts.repos, repo, "repos")?;
        let state = state.map(str::trim).filter(|s| !s.is_empty());
        let mut labels = self.opts.labels.clone();
        if self.opts.project.is_none()
            && let Some(s) = state
            && !s.eq_ignore_ascii_case("Todo")
            && !self.states.is_terminal(s)
        {
            labels.push(format!("status: {s}"));
        }
        let created = self.api.write(
            "POST",
            &format!("/repos/{repo}/issues"),
            &json!({"title": title, "body": body, "labels": labels}),
            false,
        )?;
        let issue = self.record(&created, &repo, None);
        let terminal = state.is_some_and(|s| self.states.is_terminal(s));
        if self.opts.project.is_some() || terminal {
            return self.set_state(&issue.id, state.unwrap_or("Todo"));
        }
        Ok(issue)
    }
}

impl Tracker for GitHub {
    fn post_comment(&self, issue: &Issue, body: &str) -> Result<(), TrackerError> {
        GitHub::comment(self, &issue.identifier, body).map(drop)
    }

    fn fetch_candidates(&self) -> Result<Vec<Issue>, TrackerError> {
        let board = self.board(Duration::ZERO)?;
        let mut out = Vec::new();
        let mut parked = Vec::new();
        let mut open = HashSet::new();
        for repo in &self.opts.repos {
            for v in self.open_issues(repo)? {
                let mut issue = self.record(&v, repo, board.as_deref());
                open.insert(issue.id.to_ascii_lowercase());
                if self.states.is_active(&issue.state) {
                    if has_blockers(&v) {
                        issue.blocked_by = self.blockers(&issue, board.as_deref())?;
                    }
                    out.push(issue);
                } else if self.is_parked(&issue.state) && parked.len() < feedback::PARKED_MAX {
                    parked.push(issue);
                }
            }
        }
        self.feedback.set_parked(parked);
        let mut memo = self.memo();
        // Node ids are kept for the open issues in scope and the board's items only: closed
        // issues, blockers and issues read once would otherwise pile up for ever. An issue
        // left out is read again (its REST record has the id) when it is needed.
        memo.nodes.retain(|key, _| {
            open.contains(key) || board.as_ref().is_some_and(|b| b.items.contains_key(key))
        });
        Ok(out)
    }

    fn fetch_states_by_ids(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        self.issues_now(ids, Duration::ZERO)
    }

    fn fetch_states_after_candidates(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        self.issues_now(ids, BOARD_FRESH)
    }

    fn fetch_terminal(&self) -> Result<Vec<Issue>, TrackerError> {
        let board = self.board(BOARD_FRESH)?;
        let mut out = Vec::new();
        for repo in &self.opts.repos {
            let path = format!(
                "/repos/{repo}/issues?state=closed&sort=updated&direction=desc&per_page=100{}",
                self.scope()?
            );
            // The newest 100 closed: terminal cleanup needs the recent ones only.
            for v in self.api.get_list(&path, 1)?.items {
                if !is_pull_request(&v) {
                    out.push(self.record(&v, repo, board.as_deref()));
                }
            }
            if board.is_some() {
                for v in self.open_issues(repo)? {
                    let issue = self.record(&v, repo, board.as_deref());
                    if self.states.is_terminal(&issue.state) {
                        out.push(issue);
                    }
                }
            }
        }
        out.retain(|i| self.states.is_terminal(&i.state));
        Ok(out)
    }

    forge::forge_tracker_methods!("github");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_split_into_repository_and_number() {
        assert_eq!(split_identifier("octo/app#12"), Some(("octo/app", 12)));
        assert_eq!(
            split_identifier(" octo/app.rs#3 "),
            Some(("octo/app.rs", 3))
        );
        assert_eq!(split_identifier("app#12"), None);
        assert_eq!(split_identifier("octo/app#0"), None);
        assert_eq!(split_identifier("octo/app#x"), None);
    }

    #[test]
    fn without_a_board_states_come_from_labels_and_the_close_reason() {
        let open = |labels: Value| json!({"state": "open", "labels": labels});
        assert_eq!(label_state(&open(json!([]))), "Todo");
        assert_eq!(
            label_state(&open(
                json!([{"name": "bug"}, {"name": "Status: In Progress"}])
            )),
            "In Progress"
        );
        assert_eq!(label_state(&open(json!([{"name": "status:"}]))), "Todo");
        let closed = |reason: Value| json!({"state": "closed", "state_reason": reason, "labels": [{"name": "status: In Progress"}]});
        assert_eq!(label_state(&closed(json!("completed"))), "Done");
        assert_eq!(label_state(&closed(Value::Null)), "Done");
        assert_eq!(label_state(&closed(json!("not_planned"))), "Cancelled");
        assert_eq!(label_state(&closed(json!("duplicate"))), "Duplicate");
    }

    /// A one-thread HTTP server answering each request with `answer(path)` (JSON), closing
    /// each connection; its base URL.
    fn serve(answer: impl Fn(&str) -> String + Send + 'static) -> String {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut first = String::new();
                let _ = reader.read_line(&mut first);
                let mut len = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; len];
                let _ = reader.read_exact(&mut body);
                let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
                let text = answer(&path);
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
            }
        });
        base
    }

    fn options(endpoint: &str) -> GithubOptions {
        GithubOptions {
            api_key: crate::config::Secret::new("t"),
            endpoint: endpoint.to_string(),
            repos: vec!["acme/app".into()],
            labels: Vec::new(),
            assignee: None,
            users: Vec::new(),
            project: None,
            rework_state: None,
        }
    }

    /// Node ids are remembered from every record read (closed issues, blockers, issues read
    /// once): each candidate read keeps only those of the open issues in scope, so the memo
    /// does not grow with time.
    #[test]
    fn node_ids_are_kept_for_the_open_issues_only() {
        let open = Arc::new(Mutex::new(vec![1u64, 2, 3]));
        let list = Arc::clone(&open);
        let base = serve(move |_| {
            let issues: Vec<Value> = list
                .lock()
                .unwrap()
                .iter()
                .map(|n| json!({"number": n, "node_id": format!("I_{n}"), "state": "open", "title": "t", "labels": []}))
                .collect();
            Value::Array(issues).to_string()
        });
        let states = StateNames {
            active: vec!["Todo".into()],
            terminal: vec!["Done".into()],
        };
        let gh = GitHub::new(&options(&base), states);
        assert_eq!(gh.fetch_candidates().unwrap().len(), 3);
        assert_eq!(gh.memo().nodes.len(), 3);
        // Records read elsewhere (a blocker in another repository) are remembered meanwhile.
        gh.record(
            &json!({"number": 9, "node_id": "I_9", "repository_url": "http://x/repos/acme/lib"}),
            "acme/lib",
            None,
        );
        assert_eq!(gh.memo().nodes.len(), 4);
        *open.lock().unwrap() = vec![3];
        assert_eq!(gh.fetch_candidates().unwrap().len(), 1);
        let keys: Vec<String> = gh.memo().nodes.keys().cloned().collect();
        assert_eq!(keys, ["acme/app#3"]);
    }

    #[test]
    fn the_repository_comes_from_the_record() {
        let v = json!({"repository_url": "https://ghe.example/api/v3/repos/Octo/App"});
        assert_eq!(repo_of(&v), Some("Octo/App"));
        assert!(is_pull_request(&json!({"pull_request": {"url": "x"}})));
        assert!(!is_pull_request(&json!({"pull_request": null})));
    }
}
