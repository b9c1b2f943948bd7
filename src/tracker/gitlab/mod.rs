//! `gitlab`: GitLab issues as the tracker, on GitLab's REST API v4 (gitlab.com or a
//! self-managed instance's `/api/v4`).
//!
//! * **Identity.** An issue's `id` and `identifier` are both `group/project#IID`; its `url` is
//!   the issue's web URL.
//! * **States.** Scoped labels are the board, as on GitLab's own issue boards: an open issue is
//!   in the state of its `status::<State>` label (the scope is `status_label_prefix`), else
//!   `Todo`. A closed issue is `Done`, unless it carries a terminal state's label
//!   (`status::Cancelled`). A move replaces the scoped label and closes or reopens the issue in
//!   one `PUT` (`add_labels`, `remove_labels`, `state_event`).
//! * **Candidates.** Each project's open issues in scope (all of `labels`, `assignee`): one
//!   request per 100 issues. The running issues' records come from that list when it was just
//!   read; those off it (closed, out of scope) are read in one request per project (`iids[]`).
//! * **Blockers.** Issue links of type `is_blocked_by` (or `blocks`, seen from the other side).
//!   An issue's links are read when its `updated_at` moves (a new link writes a system note on
//!   it, which touches it) or once in 12 to 24 hours (by issue, so they do not all come due in
//!   one poll); the blockers' states come from the same poll's list,
//!   or one request per project for blockers outside it.
//! * **Steering and merge-request feedback** live in [`feedback`].
//!
//! The API client ([`api`]) keeps the rate limits for the snapshot and backs off on a 429.

pub mod api;
pub mod doctor;
mod feedback;

pub use feedback::MergeRequest;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub use super::forge::split_identifier;
use super::forge::{self, Feedback, Remembered, labels};
use super::http::enc;
use super::{Blocker, Issue, StateNames, Tracker, TrackerError, TrackerErrorKind};
use crate::config::GitlabOptions;
use api::Api;

/// Pages of 100 open issues read per project at most.
const OPEN_PAGES: usize = 50;
/// An open-issue list read this recently answers the poll's own state check of the issues on
/// it (the poll reads it for candidates, then at once for the running issues); any other
/// state check reads the issue.
const OPEN_FRESH: Duration = Duration::from_secs(2);
/// Pages of 100 read at most of a list svc needs whole (an issue's notes or links).
const LIST_PAGES: usize = 30;
/// An issue's links are read again at least this often, even when it did not change (a day:
/// a new or removed link touches the issue, so this is a safety net). Each issue's age is cut
/// by its own part of the second half ([`links_max_age`]), so the links read together at start
/// are not all read again in one poll.
const LINKS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// How long the links of the issue `key` are kept at most: between half [`LINKS_MAX_AGE`] and
/// all of it, by a hash of the key (stable across restarts).
fn links_max_age(key: &str) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    let half = LINKS_MAX_AGE.as_secs() / 2;
    LINKS_MAX_AGE - Duration::from_secs(h.finish() % half)
}

/// The token's user.
#[derive(Clone, Debug)]
pub struct Viewer {
    pub id: u64,
    pub username: String,
}

pub struct GitLab {
    pub(crate) api: Api,
    opts: GitlabOptions,
    states: StateNames,
    viewer: Remembered<Viewer>,
    /// The feedback pipeline's state: troubles said, parked issues, rework (shared with
    /// GitHub).
    feedback: Feedback,
    memo: Mutex<Memo>,
}

#[derive(Default)]
struct Memo {
    /// The blockers of issues by lowercased identifier, read at the issue's `updated_at`.
    links: HashMap<String, Links>,
    /// Members' access levels by (project, user id), with when they were read.
    access: HashMap<(String, u64), (u64, Instant)>,
    /// The records of the last candidate read's open issues, by lowercased identifier, and
    /// when it was read (every project's list).
    open_records: HashMap<String, Value>,
    open_read_at: Option<Instant>,
    /// What svc knows of the open merge requests, by `project!iid`.
    merge_requests: HashMap<String, feedback::Known>,
}

/// An issue's blockers as its links said, and when.
struct Links {
    /// The issue's `updated_at` when they were read (a new link moves it).
    updated_at: String,
    read_at: Instant,
    /// (project path, iid) of each blocker.
    blockers: Vec<(String, u64)>,
}

/// `/projects/<url-encoded path>`.
pub fn project_path(project: &str) -> String {
    format!("/projects/{}", enc(project))
}

/// The project path of an issue record: `references.full` (`group/project#5`), else its web
/// URL (`<host>/group/project/-/issues/5`).
fn project_of(v: &Value) -> Option<String> {
    if let Some(full) = v.pointer("/references/full").and_then(Value::as_str)
        && let Some((project, _)) = split_identifier(full)
    {
        return Some(project.to_string());
    }
    let url = v.get("web_url")?.as_str()?;
    let before = url.split("/-/").next()?;
    let rest = before.split_once("://")?.1;
    let (_, path) = rest.split_once('/')?;
    Some(path.to_string())
}

impl GitLab {
    pub fn new(opts: &GitlabOptions, states: StateNames) -> GitLab {
        GitLab {
            api: api::new(&opts.endpoint, opts.api_key.clone()),
            opts: opts.clone(),
            states,
            viewer: Remembered::default(),
            feedback: Feedback::new(
                crate::steering::Source::Gitlab,
                "notes and failed pipelines",
                &opts.endpoint,
                &opts.users,
                opts.rework_state.as_deref(),
            ),
            memo: Mutex::default(),
        }
    }

    /// Remembers what sent issues back in the daemon's durable store, once it is handed in.
    pub fn keeping(mut self, facts: crate::facts::Later) -> GitLab {
        self.feedback.keep_in(facts);
        self
    }

    pub fn with_backoff(mut self, backoff: Duration) -> GitLab {
        self.api.backoff = backoff;
        self
    }

    pub fn states(&self) -> &StateNames {
        &self.states
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, Memo> {
        self.memo.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An open issue that waits in a state neither active nor terminal (`Human Review`).
    fn is_parked(&self, state: &str) -> bool {
        !self.states.is_active(state) && !self.states.is_terminal(state)
    }

    /// The token's user (`GET /user`, asked once).
    pub fn viewer(&self) -> Result<Viewer, TrackerError> {
        self.viewer.get_or_read(|| {
            let got = self.api.get("/user")?;
            Ok(Viewer {
                id: got.value["id"].as_u64().unwrap_or_default(),
                username: got
                    .value
                    .get("username")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        TrackerError::unavailable("gitlab GET /user returned no username")
                    })?
                    .to_string(),
            })
        })
    }

    /// The state label of `state`: `<prefix><State>`.
    pub fn state_label(&self, state: &str) -> String {
        format!("{}{}", self.opts.status_label_prefix, state.trim())
    }

    /// The state a label names, if it is a state label.
    fn label_state<'l>(&self, label: &'l str) -> Option<&'l str> {
        let prefix = &self.opts.status_label_prefix;
        (label.len() > prefix.len() && label.is_char_boundary(prefix.len()))
            .then(|| &label[..prefix.len()])
            .filter(|head| head.eq_ignore_ascii_case(prefix))
            .map(|_| label[prefix.len()..].trim())
            .filter(|s| !s.is_empty())
    }

    /// The state of a record: open by its state label (else `Todo`), closed `Done` unless it
    /// carries a terminal state's label.
    fn state_of(&self, v: &Value) -> String {
        let labels = labels(v);
        let named = labels.iter().find_map(|l| self.label_state(l));
        if v.get("state").and_then(Value::as_str) == Some("closed") {
            return match named {
                Some(s) if self.states.is_terminal(s) => s.to_string(),
                _ => "Done".to_string(),
            };
        }
        named.unwrap_or("Todo").to_string()
    }

    /// The configured projects, and how issue ids name them.
    fn places(&self) -> forge::Places<'_> {
        forge::Places {
            provider: "gitlab",
            key: "projects",
            configured: &self.opts.projects,
            form: "group/project#IID",
            example: "group/app",
        }
    }

    /// The normalized issue of a REST record (`project` when the record does not say).
    fn record(&self, v: &Value, project: &str) -> Issue {
        let project = self
            .places()
            .canonical(&project_of(v).unwrap_or_else(|| project.to_string()));
        let iid = v.get("iid").and_then(Value::as_u64).unwrap_or_default();
        let identifier = format!("{project}#{iid}");
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let state = self.state_of(v);
        Issue {
            id: identifier.clone(),
            identifier,
            title: s("title").unwrap_or_default(),
            description: s("description"),
            state_type: Some(self.states.state_type(&state).to_string()),
            state,
            labels: labels(v),
            url: s("web_url"),
            created_at: s("created_at"),
            updated_at: s("updated_at"),
            priority: None,
            blocked_by: Vec::new(),
        }
    }

    /// An issue id an agent or operator gave: `group/project#IID`, or `#IID` / `IID` when svc
    /// works a single project.
    pub fn resolve(&self, id: &str) -> Result<(String, u64), TrackerError> {
        self.places().resolve(id)
    }

    /// [`GitLab::resolve`], refusing an issue outside the configured `projects` (what the
    /// `gitlab` pack acts on: the token may reach other projects, the workflow does not).
    pub fn resolve_in_projects(&self, id: &str) -> Result<(String, u64), TrackerError> {
        self.places().resolve_configured(id)
    }

    /// The query string that scopes issue lists: `labels` and `assignee` (a username).
    fn scope(&self) -> Result<String, TrackerError> {
        let o = &self.opts;
        forge::scope(
            &o.labels,
            o.assignee.as_deref(),
            "assignee_username",
            || Ok(self.viewer()?.username),
        )
    }

    /// The open issues of `project` in scope, the oldest [`OPEN_PAGES`] pages of them.
    fn open_issues(&self, project: &str) -> Result<Vec<Value>, TrackerError> {
        let path = format!(
            "{}/issues?state=opened&order_by=created_at&sort=asc&per_page=100{}",
            project_path(project),
            self.scope()?
        );
        let listed = self.api.get_list(&path, OPEN_PAGES)?;
        if self
            .feedback
            .said
            .episode(&format!("open:{project}"), !listed.complete)
        {
            log::warn!(
                "gitlab {project} has more than {} open issues in scope: svc reads the oldest {} and sees no newer one; narrow the scope with labels or assignee",
                OPEN_PAGES * 100,
                OPEN_PAGES * 100
            );
        }
        Ok(listed.items)
    }

    /// The blockers of the issue `v` (project path, iid), from its links, read again only when
    /// it changed or its [`links_max_age`] passed.
    fn blocker_refs(&self, issue: &Issue) -> Result<Vec<(String, u64)>, TrackerError> {
        let key = issue.id.to_ascii_lowercase();
        let updated = issue.updated_at.clone().unwrap_or_default();
        if let Some(links) = self.memo().links.get(&key)
            && links.updated_at == updated
            && !updated.is_empty()
            && links.read_at.elapsed() < links_max_age(&key)
        {
            return Ok(links.blockers.clone());
        }
        let Some((project, iid)) = split_identifier(&issue.id) else {
            return Ok(Vec::new());
        };
        let list = self.api.get_all(
            &format!("{}/issues/{iid}/links?per_page=100", project_path(project)),
            LIST_PAGES,
        )?;
        let refs: Vec<(String, u64)> = list
            .iter()
            .filter(|l| l.get("link_type").and_then(Value::as_str) == Some("is_blocked_by"))
            .filter_map(|l| {
                let p = project_of(l).unwrap_or_else(|| project.to_string());
                Some((self.places().canonical(&p), l.get("iid")?.as_u64()?))
            })
            .collect();
        self.memo().links.insert(
            key,
            Links {
                updated_at: updated,
                read_at: Instant::now(),
                blockers: refs.clone(),
            },
        );
        Ok(refs)
    }

    /// Fills the blockers of `issues` (each with its record), their states from `known`
    /// (records read this poll) or read per project in one request.
    fn fill_blockers(
        &self,
        issues: &mut [(Issue, Value)],
        known: &HashMap<String, String>,
    ) -> Result<(), TrackerError> {
        let mut wanted: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut refs_of = Vec::with_capacity(issues.len());
        for (issue, _) in issues.iter() {
            let refs = self.blocker_refs(issue)?;
            for (p, n) in &refs {
                if !known.contains_key(&format!("{p}#{n}").to_ascii_lowercase()) {
                    wanted.entry(p.clone()).or_default().push(*n);
                }
            }
            refs_of.push(refs);
        }
        let mut states = known.clone();
        for (project, mut iids) in wanted {
            iids.sort_unstable();
            iids.dedup();
            for chunk in iids.chunks(100) {
                for v in self.by_iids(&project, chunk)? {
                    let b = self.record(&v, &project);
                    states.insert(b.id.to_ascii_lowercase(), b.state);
                }
            }
        }
        for ((issue, _), refs) in issues.iter_mut().zip(refs_of) {
            issue.blocked_by = refs
                .into_iter()
                .map(|(p, n)| {
                    let id = format!("{p}#{n}");
                    let state = states
                        .get(&id.to_ascii_lowercase())
                        .cloned()
                        .unwrap_or_else(|| "Todo".to_string());
                    Blocker {
                        id: id.clone(),
                        identifier: id,
                        state,
                    }
                })
                .collect();
        }
        Ok(())
    }

    /// The records of `iids` in `project`, open or closed (one request per 100).
    fn by_iids(&self, project: &str, iids: &[u64]) -> Result<Vec<Value>, TrackerError> {
        let mut path = format!("{}/issues?state=all&per_page=100", project_path(project));
        for n in iids {
            path.push_str(&format!("&iids%5B%5D={n}"));
        }
        self.api.get_all(&path, 1 + iids.len() / 100)
    }

    /// The issue `id` as it is now, with its blockers.
    pub fn read(&self, id: &str) -> Result<Issue, TrackerError> {
        let (project, n) = self.resolve(id)?;
        let got = self
            .api
            .get(&format!("{}/issues/{n}", project_path(&project)))?;
        let issue = self.record(&got.value, &project);
        let mut one = [(issue, got.value)];
        self.fill_blockers(&mut one, &HashMap::new())?;
        let [(issue, _)] = one;
        Ok(issue)
    }

    /// Moves `id` to `state` in one request: its state label replaced (none for `Todo` and
    /// `Done`), closed for a terminal state, reopened for another. Returns the issue after.
    pub fn set_state(&self, id: &str, state: &str) -> Result<Issue, TrackerError> {
        let (project, n) = self.resolve(id)?;
        let state = state.trim();
        if state.is_empty() {
            return Err(TrackerError::invalid("'status' is required"));
        }
        comma_free(state)?;
        let path = format!("{}/issues/{n}", project_path(&project));
        let current = self.api.get(&path)?.value;
        let terminal = self.states.is_terminal(state);
        let want = (!state.eq_ignore_ascii_case("Todo") && !state.eq_ignore_ascii_case("Done"))
            .then(|| self.state_label(state));
        let old: Vec<String> = labels(&current)
            .into_iter()
            .filter(|l| self.label_state(l).is_some() && Some(l) != want.as_ref())
            .collect();
        let closed = current.get("state").and_then(Value::as_str) == Some("closed");
        let has_want = want
            .as_ref()
            .is_none_or(|w| labels(&current).iter().any(|l| l == w));
        if old.is_empty() && has_want && closed == terminal {
            return Ok(self.record(&current, &project));
        }
        let mut body = serde_json::Map::new();
        if let Some(w) = &want
            && !has_want
        {
            body.insert("add_labels".into(), json!(w));
        }
        if !old.is_empty() {
            body.insert("remove_labels".into(), json!(old.join(",")));
        }
        if terminal && !closed {
            body.insert("state_event".into(), json!("close"));
        } else if !terminal && closed {
            body.insert("state_event".into(), json!("reopen"));
        }
        let updated = self.api.write("PUT", &path, &Value::Object(body), true)?;
        let issue = self.record(&updated, &project);
        let mut one = [(issue, updated)];
        self.fill_blockers(&mut one, &HashMap::new())?;
        let [(issue, _)] = one;
        Ok(issue)
    }

    /// A note on `id` (`POST .../notes`, sent once: it is not idempotent).
    pub fn comment(&self, id: &str, body: &str) -> Result<Value, TrackerError> {
        let (project, n) = self.resolve(id)?;
        self.api.write(
            "POST",
            &format!("{}/issues/{n}/notes", project_path(&project)),
            &json!({"body": body}),
            false,
        )
    }

    /// The notes of `id` that people wrote (system notes left out), oldest first.
    pub fn notes(&self, id: &str) -> Result<Vec<Value>, TrackerError> {
        let (project, n) = self.resolve(id)?;
        let mut list = self.api.get_all(
            &format!(
                "{}/issues/{n}/notes?sort=asc&order_by=created_at&per_page=100",
                project_path(&project)
            ),
            LIST_PAGES,
        )?;
        list.retain(|v| !v.get("system").and_then(Value::as_bool).unwrap_or(false));
        Ok(list)
    }

    /// The merge requests that close `id` (`closed_by`), each with its approvals and head
    /// pipeline, and whether its feedback steers.
    pub fn closing_merge_requests(&self, id: &str) -> Result<Vec<Value>, TrackerError> {
        let (project, n) = self.resolve(id)?;
        let pp = project_path(&project);
        let list = self.api.get_all(
            &format!("{pp}/issues/{n}/closed_by?per_page=100"),
            LIST_PAGES,
        )?;
        let viewer = self.viewer()?;
        let mut out = Vec::new();
        for mr in list {
            let iid = mr["iid"].as_u64().unwrap_or_default();
            let mrp = format!("/projects/{}/merge_requests/{iid}", mr["project_id"]);
            let steers = feedback::unwatched(self, &project, &mr, &viewer)?.is_none();
            let approvals = self.api.get(&format!("{mrp}/approvals"))?.value;
            let full = self.api.get(&mrp)?.value;
            out.push(json!({
                "iid": iid,
                "reference": mr.pointer("/references/full"),
                "title": mr.get("title"),
                "state": mr.get("state"),
                "url": mr.get("web_url"),
                "author": mr.pointer("/author/username"),
                "steers": steers,
                "approved": approvals.get("approved"),
                "approvedBy": approvals.get("approved_by").and_then(Value::as_array).map(|a| a.iter().map(|x| x.pointer("/user/username").cloned().unwrap_or(Value::Null)).collect::<Vec<_>>()),
                "headPipeline": full.get("head_pipeline").filter(|p| !p.is_null()).map(|p| json!({"id": p.get("id"), "status": p.get("status"), "url": p.get("web_url")})),
            }));
        }
        Ok(out)
    }

    /// Creates an issue in `project` (the first configured one by default) carrying the
    /// configured `labels`, in `state` (default `Todo`).
    pub fn create(
        &self,
        project: Option<&str>,
        title: &str,
        body: &str,
        state: Option<&str>,
    ) -> Result<Issue, TrackerError> {
        let project = super::one_of_configured(&self.opts.projects, project, "projects")?;
        let state = state.map(str::trim).filter(|s| !s.is_empty());
        if let Some(s) = state {
            comma_free(s)?;
        }
        let mut labels = self.opts.labels.clone();
        let terminal = state.is_some_and(|s| self.states.is_terminal(s));
        if let Some(s) = state
            && !s.eq_ignore_ascii_case("Todo")
            && !s.eq_ignore_ascii_case("Done")
        {
            labels.push(self.state_label(s));
        }
        let created = self.api.write(
            "POST",
            &format!("{}/issues", project_path(&project)),
            &json!({"title": title, "description": body, "labels": labels.join(",")}),
            false,
        )?;
        let issue = self.record(&created, &project);
        if terminal {
            return self.set_state(&issue.id, state.unwrap_or("Done"));
        }
        Ok(issue)
    }

    /// The issues `ids` as they are: from `fresh` (records of the open list a poll just read)
    /// when there, else read.
    fn issues_now(
        &self,
        ids: &[String],
        fresh: HashMap<String, Value>,
    ) -> Result<Vec<Issue>, TrackerError> {
        let mut by_project: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut out = Vec::new();
        for id in ids {
            if let Ok((project, n)) = self.resolve(id) {
                // On the open list just read: its record is current. Off it (closed, or out of
                // scope now), it is read.
                match fresh.get(&format!("{project}#{n}").to_ascii_lowercase()) {
                    Some(v) => out.push((self.record(v, &project), v.clone())),
                    None => by_project.entry(project).or_default().push(n),
                }
            }
        }
        for (project, iids) in by_project {
            for chunk in iids.chunks(100) {
                match self.by_iids(&project, chunk) {
                    Ok(list) => {
                        for v in list {
                            let issue = self.record(&v, &project);
                            out.push((issue, v));
                        }
                    }
                    Err(e) if e.kind == TrackerErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let known = out
            .iter()
            .map(|(i, _)| (i.id.to_ascii_lowercase(), i.state.clone()))
            .collect();
        self.fill_blockers(&mut out, &known)?;
        Ok(out.into_iter().map(|(i, _)| i).collect())
    }

    /// Every open issue in scope, whatever its state (for `gitlab_query`).
    pub fn open_in_scope(&self) -> Result<Vec<Issue>, TrackerError> {
        let mut all = Vec::new();
        for project in &self.opts.projects {
            for v in self.open_issues(project)? {
                all.push((self.record(&v, project), v));
            }
        }
        let known = all
            .iter()
            .map(|(i, _)| (i.id.to_ascii_lowercase(), i.state.clone()))
            .collect();
        self.fill_blockers(&mut all, &known)?;
        Ok(all.into_iter().map(|(i, _)| i).collect())
    }
}

impl Tracker for GitLab {
    fn post_comment(&self, issue: &Issue, body: &str) -> Result<(), TrackerError> {
        GitLab::comment(self, &issue.identifier, body).map(drop)
    }

    fn fetch_candidates(&self) -> Result<Vec<Issue>, TrackerError> {
        let mut active = Vec::new();
        let mut parked = Vec::new();
        let mut known = HashMap::new();
        let mut open = HashSet::new();
        let mut records = HashMap::new();
        for project in &self.opts.projects {
            for v in self.open_issues(project)? {
                let issue = self.record(&v, project);
                known.insert(issue.id.to_ascii_lowercase(), issue.state.clone());
                open.insert(issue.id.to_ascii_lowercase());
                records.insert(issue.id.to_ascii_lowercase(), v.clone());
                if self.states.is_active(&issue.state) {
                    active.push((issue, v));
                } else if self.is_parked(&issue.state) && parked.len() < super::rework::PARKED_MAX {
                    parked.push(issue);
                }
            }
        }
        self.fill_blockers(&mut active, &known)?;
        self.feedback.set_parked(parked);
        let mut memo = self.memo();
        memo.open_records = records;
        memo.open_read_at = Some(Instant::now());
        // Links are kept for the open issues in scope only.
        memo.links.retain(|key, _| open.contains(key));
        Ok(active.into_iter().map(|(i, _)| i).collect())
    }

    fn fetch_states_by_ids(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        self.issues_now(ids, HashMap::new())
    }

    fn fetch_states_after_candidates(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        let fresh: HashMap<String, Value> = {
            let memo = self.memo();
            if memo.open_read_at.is_some_and(|t| t.elapsed() < OPEN_FRESH) {
                memo.open_records.clone()
            } else {
                HashMap::new()
            }
        };
        self.issues_now(ids, fresh)
    }

    fn fetch_terminal(&self) -> Result<Vec<Issue>, TrackerError> {
        let mut out = Vec::new();
        for project in &self.opts.projects {
            let path = format!(
                "{}/issues?state=closed&order_by=updated_at&sort=desc&per_page=100{}",
                project_path(project),
                self.scope()?
            );
            // The newest 100 closed: terminal cleanup needs the recent ones only.
            for v in self.api.get_list(&path, 1)?.items {
                out.push(self.record(&v, project));
            }
        }
        out.retain(|i| self.states.is_terminal(&i.state));
        Ok(out)
    }

    forge::forge_tracker_methods!("gitlab");
}

/// A state svc writes as a label: labels go to GitLab comma-separated, so a comma in a state
/// would write other labels.
fn comma_free(state: &str) -> Result<(), TrackerError> {
    if state.contains(',') {
        return Err(TrackerError::invalid(format!(
            "{state:?} cannot be a state: GitLab label names svc writes cannot hold a comma"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gitlab(prefix: &str) -> GitLab {
        GitLab::new(
            &GitlabOptions {
                api_key: crate::config::Secret::new("t"),
                endpoint: "http://127.0.0.1:1/api/v4".into(),
                projects: vec!["acme/sub/app".into()],
                labels: Vec::new(),
                assignee: None,
                users: Vec::new(),
                status_label_prefix: prefix.into(),
                rework_state: None,
            },
            StateNames {
                active: vec!["Todo".into(), "In Progress".into()],
                terminal: vec!["Done".into(), "Cancelled".into()],
            },
        )
    }

    #[test]
    fn links_expire_spread_over_the_second_half_of_a_day() {
        let ages: Vec<Duration> = (1..=200)
            .map(|n| links_max_age(&format!("acme/sub/app#{n}")))
            .collect();
        assert!(
            ages.iter()
                .all(|a| *a > LINKS_MAX_AGE / 2 && *a <= LINKS_MAX_AGE)
        );
        let (lo, hi) = (ages.iter().min().unwrap(), ages.iter().max().unwrap());
        assert!(*hi - *lo > LINKS_MAX_AGE / 3, "{lo:?}..{hi:?}");
        // No hour holds more than a fifth of them (about a twelfth each).
        let mut hours = HashMap::new();
        for a in &ages {
            *hours.entry(a.as_secs() / 3600).or_insert(0) += 1;
        }
        assert!(hours.values().all(|n| *n <= 40), "{hours:?}");
        assert_eq!(links_max_age("acme/sub/app#1"), ages[0], "stable");
    }

    #[test]
    fn identifiers_split_into_project_path_and_iid() {
        assert_eq!(
            split_identifier("acme/sub/app#12"),
            Some(("acme/sub/app", 12))
        );
        assert_eq!(split_identifier("app#12"), None);
        assert_eq!(split_identifier("acme/app#0"), None);
        assert_eq!(project_path("acme/sub/app"), "/projects/acme%2Fsub%2Fapp");
        let g = gitlab("status::");
        assert_eq!(g.resolve("#3").unwrap(), ("acme/sub/app".to_string(), 3));
        assert!(g.resolve_in_projects("other/x#1").is_err());
    }

    #[test]
    fn states_come_from_scoped_labels_and_the_open_closed_state() {
        let g = gitlab("status::");
        let v = |state: &str, labels: Value| json!({"state": state, "labels": labels});
        assert_eq!(g.state_of(&v("opened", json!([]))), "Todo");
        assert_eq!(
            g.state_of(&v("opened", json!(["bug", "Status::In Progress"]))),
            "In Progress"
        );
        assert_eq!(g.state_of(&v("opened", json!(["status::"]))), "Todo");
        assert_eq!(
            g.state_of(&v("closed", json!(["status::In Progress"]))),
            "Done"
        );
        assert_eq!(
            g.state_of(&v("closed", json!(["status::Cancelled"]))),
            "Cancelled"
        );
        let w = gitlab("workflow::");
        assert_eq!(
            w.state_of(&v("opened", json!(["status::Review", "workflow::Review"]))),
            "Review"
        );
    }

    #[test]
    fn the_project_comes_from_references_or_the_web_url() {
        assert_eq!(
            project_of(&json!({"references": {"full": "acme/sub/app#4"}})).as_deref(),
            Some("acme/sub/app")
        );
        assert_eq!(
            project_of(&json!({"web_url": "https://gl.example/acme/app/-/issues/4"})).as_deref(),
            Some("acme/app")
        );
    }
}
