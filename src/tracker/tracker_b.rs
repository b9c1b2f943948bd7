//! `tracker-b`: a REST issue tracker (the Jira Cloud REST API v3). HTTP Basic with `email` and
//! `api_key`; candidates come from the enhanced JQL search (`POST /rest/api/3/search/jql`, token
//! pagination) with the configured scope AND-ed with the active states and the fixed gate
//! (label `agent`, assigned to the worker). Status changes go through transitions; comment bodies
//! are Atlassian Document Format. New comments on the polled issues steer their agents (see
//! [`Tracker::steering`] here and [`super::comments`]).

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use super::comments::{CommentSource, Window};
use super::rest::{HttpClient, Request, Resend};
use super::{Blocker, Issue, StateNames, Tracker, TrackerError};
use crate::config::TrackerBOptions;
use crate::steering::Batch;

/// The fields every search and read asks for (`issuelinks` carries the blockers).
pub const FIELDS: [&str; 9] = [
    "summary",
    "description",
    "status",
    "labels",
    "priority",
    "created",
    "updated",
    "assignee",
    "issuelinks",
];
const PAGE: u64 = 100;
const TERMINAL_PAGES: usize = 2;

pub struct TrackerB {
    http: HttpClient,
    base: String,
    auth: String,
    opts: TrackerBOptions,
    states: StateNames,
    /// The credentials' account id (`/myself`), fetched once for steering.
    myself: std::sync::Mutex<Option<String>>,
}

/// A JQL string literal.
fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The plain text of an Atlassian Document Format node (or a plain string).
pub fn adf_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) => {
            let mut out = o
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if let Some(children) = o.get("content").and_then(Value::as_array) {
                let parts: Vec<String> = children.iter().map(adf_text).collect();
                let block = matches!(o.get("type").and_then(Value::as_str), Some("doc"));
                out.push_str(&parts.join(if block { "\n" } else { "" }));
            }
            out
        }
        _ => String::new(),
    }
}

/// The scope and the fixed gate (label `agent`, assigned to the worker) as JQL, AND-ed.
pub fn scope_jql(s: &crate::config::TrackerBScope, states: &[String]) -> String {
    let mut parts = Vec::new();
    if let Some(jql) = &s.jql {
        parts.push(format!("({jql})"));
    }
    if !s.project_keys.is_empty() {
        parts.push(format!(
            "project in ({})",
            s.project_keys
                .iter()
                .map(|k| quote(k))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !states.is_empty() {
        parts.push(format!(
            "status in ({})",
            states
                .iter()
                .map(|k| quote(k))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    parts.push("labels = \"agent\"".into());
    parts.push(match s.assignee.as_deref() {
        None | Some("me") => "assignee = currentUser()".into(),
        Some(a) => format!("assignee = {}", quote(a)),
    });
    parts.join(" AND ")
}

/// A Jira-shaped issue as the normalized record; `base` builds the URL when the payload has none.
pub fn map_issue(i: &Value, base: Option<&str>, states: &StateNames) -> Issue {
    let f = &i["fields"];
    let key = i["key"].as_str().unwrap_or_default().to_string();
    let state = f
        .pointer("/status/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let state_type = match f
        .pointer("/status/statusCategory/key")
        .and_then(Value::as_str)
    {
        Some("new") => "unstarted".to_string(),
        Some("indeterminate") => "started".to_string(),
        Some("done") => "completed".to_string(),
        _ => states.state_type(&state).to_string(),
    };
    let description = adf_text(&f["description"]);
    Issue {
        id: i["id"].as_str().unwrap_or_default().to_string(),
        url: i["url"]
            .as_str()
            .map(str::to_string)
            .or_else(|| base.map(|b| format!("{}/browse/{key}", b.trim_end_matches('/')))),
        identifier: key,
        title: f["summary"].as_str().unwrap_or_default().to_string(),
        description: (!description.trim().is_empty()).then_some(description),
        state,
        state_type: Some(state_type),
        labels: f["labels"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_str().map(str::to_string))
            .collect(),
        created_at: f["created"].as_str().map(str::to_string),
        updated_at: f["updated"].as_str().map(str::to_string),
        priority: f
            .pointer("/priority/id")
            .and_then(Value::as_str)
            .and_then(|p| p.parse().ok()),
        blocked_by: blockers(f),
    }
}

/// The issues blocking one, from its `issuelinks`: links of the `Blocks` type whose other end
/// is on the inward side (this issue "is blocked by" it), with the linked issue's status.
fn blockers(fields: &Value) -> Vec<Blocker> {
    fields["issuelinks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| {
            l.pointer("/type/name")
                .and_then(Value::as_str)
                .is_some_and(|n| n.eq_ignore_ascii_case("Blocks"))
        })
        .filter_map(|l| {
            let other = l.get("inwardIssue")?;
            Some(Blocker {
                id: other["id"].as_str()?.to_string(),
                identifier: other["key"].as_str().unwrap_or_default().to_string(),
                state: other
                    .pointer("/fields/status/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            })
        })
        .collect()
}

/// Runs a token-paginated JQL search, up to `max_pages` pages. `fetch` sends one request
/// (`{jql, maxResults, nextPageToken?}`) and returns the page: `{issues, nextPageToken?,
/// isLast?}`, or a bare list of issues. Both transports (REST and MCP) page this way.
pub fn paginate(
    jql: &str,
    max_pages: usize,
    mut fetch: impl FnMut(Value) -> Result<Value, TrackerError>,
) -> Result<Vec<Value>, TrackerError> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..max_pages {
        let mut request = json!({"jql": format!("{jql} ORDER BY created ASC"), "maxResults": PAGE});
        if let Some(t) = &token {
            request["nextPageToken"] = t.clone().into();
        }
        let page = fetch(request)?;
        out.extend(
            page.get("issues")
                .and_then(Value::as_array)
                .or_else(|| page.as_array())
                .cloned()
                .unwrap_or_default(),
        );
        match page.get("nextPageToken").and_then(Value::as_str) {
            Some(t) if page.get("isLast") != Some(&Value::Bool(true)) => {
                token = Some(t.to_string())
            }
            _ => break,
        }
    }
    Ok(out)
}

/// `id in (...)` for the numeric ids among `ids`, in batches of a page; other values cannot be
/// tracker ids and are left out.
pub fn ids_jql(ids: &[String]) -> Vec<String> {
    let numeric: Vec<&str> = ids
        .iter()
        .map(String::as_str)
        .filter(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    numeric
        .chunks(PAGE as usize)
        .map(|chunk| format!("id in ({})", chunk.join(", ")))
        .collect()
}

/// What the `tracker_b` pack needs from a transport (REST or an external MCP server).
pub trait Backend: Send + Sync {
    fn scope(&self, states: &[String]) -> String;
    fn search_jql(&self, jql: &str) -> Result<Vec<Issue>, TrackerError>;
    fn read(&self, id_or_key: &str) -> Result<Issue, TrackerError>;
    fn transition(&self, id_or_key: &str, status: &str) -> Result<(), TrackerError>;
    fn comments(&self, id_or_key: &str) -> Result<Vec<Value>, TrackerError>;
    fn add_comment(&self, id_or_key: &str, body: &str) -> Result<Option<Value>, TrackerError>;
    fn update_comment(
        &self,
        id_or_key: &str,
        comment_id: &str,
        body: &str,
    ) -> Result<Value, TrackerError>;
    /// `assignee`: on REST any value assigns the configured owner; over MCP it is forwarded.
    fn create(
        &self,
        title: &str,
        body: &str,
        status: Option<&str>,
        assignee: Option<&str>,
    ) -> Result<Issue, TrackerError>;
}

impl Backend for TrackerB {
    fn scope(&self, states: &[String]) -> String {
        self.scope_jql(states)
    }
    fn search_jql(&self, jql: &str) -> Result<Vec<Issue>, TrackerError> {
        TrackerB::search_jql(self, jql)
    }
    fn read(&self, id: &str) -> Result<Issue, TrackerError> {
        TrackerB::read(self, id)
    }
    fn transition(&self, id: &str, status: &str) -> Result<(), TrackerError> {
        TrackerB::transition(self, id, status)
    }
    fn comments(&self, id: &str) -> Result<Vec<Value>, TrackerError> {
        TrackerB::comments(self, id)
    }
    fn add_comment(&self, id: &str, body: &str) -> Result<Option<Value>, TrackerError> {
        TrackerB::add_comment(self, id, body)
    }
    fn update_comment(&self, id: &str, cid: &str, body: &str) -> Result<Value, TrackerError> {
        TrackerB::update_comment(self, id, cid, body)
    }
    fn create(
        &self,
        title: &str,
        body: &str,
        status: Option<&str>,
        assignee: Option<&str>,
    ) -> Result<Issue, TrackerError> {
        TrackerB::create(self, title, body, status, assignee.is_some())
    }
}

/// Plain text as an Atlassian Document Format document, one paragraph per line.
pub fn adf(text: &str) -> Value {
    let paragraphs: Vec<Value> = text
        .split('\n')
        .map(|line| {
            if line.is_empty() {
                json!({"type": "paragraph", "content": []})
            } else {
                json!({"type": "paragraph", "content": [{"type": "text", "text": line}]})
            }
        })
        .collect();
    json!({"type": "doc", "version": 1, "content": paragraphs})
}

impl TrackerB {
    pub fn new(opts: &TrackerBOptions, states: StateNames) -> TrackerB {
        let creds = format!("{}:{}", opts.email.expose(), opts.api_key.expose());
        TrackerB {
            http: HttpClient::new(Duration::from_secs(30)),
            base: opts.base_url.expose().trim_end_matches('/').to_string(),
            auth: format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(creds)
            ),
            opts: opts.clone(),
            states,
            myself: std::sync::Mutex::new(None),
        }
    }

    pub fn with_backoff(mut self, backoff: Duration) -> TrackerB {
        self.http.set_backoff(backoff);
        self
    }

    /// One API call; non-2xx answers are errors carrying Jira's error messages.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, TrackerError> {
        let url = format!("{}{path}", self.base);
        let text = body.map(|b| b.to_string());
        let headers = [("Authorization", self.auth.as_str())];
        // Creating a comment or an issue must not happen twice: sent again only when Jira said
        // it was not applied (429); a lost answer is an error that says it may have landed.
        let creates =
            method == "POST" && (path.ends_with("/comment") || path == "/rest/api/3/issue");
        let request = Request::raw("tracker-b", method, &url, &headers, text.as_deref());
        let resend = if creates {
            Resend::IfNotApplied
        } else {
            Resend::Always
        };
        let reply = self.http.send(&request, resend, |_| false)?;
        if !(200..300).contains(&reply.status) {
            let parsed: Value = serde_json::from_str(&reply.body).unwrap_or(Value::Null);
            let mut msgs: Vec<String> = parsed["errorMessages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m.as_str().map(str::to_string))
                .collect();
            if let Some(errs) = parsed["errors"].as_object() {
                msgs.extend(
                    errs.iter()
                        .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap_or_default())),
                );
            }
            let hint = match reply.status {
                401 | 403 => " (check tracker.email and tracker.api_key)",
                404 => " (not found)",
                500.. if creates => " (it may have been applied)",
                _ => "",
            };
            return Err(TrackerError::unavailable(format!(
                "tracker-b answered HTTP {}{hint}: {}",
                reply.status,
                msgs.join("; ")
            )));
        }
        if reply.body.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&reply.body).map_err(|_| {
            TrackerError::unavailable("tracker-b answered with a body that is not JSON")
        })
    }

    pub fn rate_limits(&self) -> Option<Value> {
        self.http.last_rate_limits()
    }

    /// The scope and gate as JQL clauses, AND-ed.
    pub fn scope_jql(&self, states: &[String]) -> String {
        scope_jql(&self.opts.scope, states)
    }

    /// Every issue matching `jql` (the query tool's search).
    pub fn search_jql(&self, jql: &str) -> Result<Vec<Issue>, TrackerError> {
        self.search(jql, 50)
    }

    fn search(&self, jql: &str, max_pages: usize) -> Result<Vec<Issue>, TrackerError> {
        let issues = paginate(jql, max_pages, |mut request| {
            request["fields"] = json!(FIELDS);
            self.call("POST", "/rest/api/3/search/jql", Some(request))
        })?;
        Ok(issues.iter().map(|i| self.issue(i)).collect())
    }

    pub fn issue(&self, i: &Value) -> Issue {
        map_issue(i, Some(&self.base), &self.states)
    }

    pub fn read(&self, id_or_key: &str) -> Result<Issue, TrackerError> {
        let path = format!(
            "/rest/api/3/issue/{}?fields={}",
            enc(id_or_key),
            FIELDS.join(",")
        );
        Ok(self.issue(&self.call("GET", &path, None)?))
    }

    /// Moves an issue to `status` through the transition that leads there.
    pub fn transition(&self, id_or_key: &str, status: &str) -> Result<(), TrackerError> {
        let list = self.call(
            "GET",
            &format!("/rest/api/3/issue/{}/transitions", enc(id_or_key)),
            None,
        )?;
        let transitions = list["transitions"].as_array().cloned().unwrap_or_default();
        let wanted = status.trim().to_lowercase();
        let t = transitions
            .iter()
            .find(|t| {
                t.pointer("/to/name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| n.to_lowercase() == wanted)
            })
            .or_else(|| {
                transitions.iter().find(|t| {
                    t["name"]
                        .as_str()
                        .is_some_and(|n| n.to_lowercase() == wanted)
                })
            })
            .ok_or_else(|| {
                let names: Vec<&str> = transitions
                    .iter()
                    .filter_map(|t| t.pointer("/to/name").and_then(Value::as_str))
                    .collect();
                TrackerError::invalid(format!(
                    "no transition of {id_or_key} leads to {status:?}; available: {}",
                    names.join(", ")
                ))
            })?;
        self.call(
            "POST",
            &format!("/rest/api/3/issue/{}/transitions", enc(id_or_key)),
            Some(json!({"transition": {"id": t["id"]}})),
        )?;
        Ok(())
    }

    pub fn comments(&self, id_or_key: &str) -> Result<Vec<Value>, TrackerError> {
        let page = self.call(
            "GET",
            &format!("/rest/api/3/issue/{}/comment", enc(id_or_key)),
            None,
        )?;
        Ok(page["comments"]
            .as_array()
            .into_iter()
            .flatten()
            .map(comment)
            .collect())
    }

    pub fn add_comment(&self, id_or_key: &str, body: &str) -> Result<Option<Value>, TrackerError> {
        let c = self.call(
            "POST",
            &format!("/rest/api/3/issue/{}/comment", enc(id_or_key)),
            Some(json!({"body": adf(body)})),
        )?;
        Ok((!c.is_null()).then(|| comment(&c)))
    }

    pub fn update_comment(
        &self,
        id_or_key: &str,
        comment_id: &str,
        body: &str,
    ) -> Result<Value, TrackerError> {
        let c = self.call(
            "PUT",
            &format!(
                "/rest/api/3/issue/{}/comment/{}",
                enc(id_or_key),
                enc(comment_id)
            ),
            Some(json!({"body": adf(body)})),
        )?;
        Ok(comment(&c))
    }

    /// Creates an issue in the first configured project; `assign` assigns it to the configured
    /// owner (the current user unless `assignee` names someone).
    pub fn create(
        &self,
        title: &str,
        body: &str,
        status: Option<&str>,
        assign: bool,
    ) -> Result<Issue, TrackerError> {
        let project = self.opts.scope.project_keys.first().ok_or_else(|| {
            TrackerError::invalid("tracker_b_create_issue needs tracker.project_keys")
        })?;
        let mut fields = json!({"project": {"key": project}, "summary": title, "issuetype": {"name": self.opts.scope.issue_type}, "labels": ["agent"]});
        if !body.is_empty() {
            fields["description"] = adf(body);
        }
        if assign {
            let account = match self.opts.scope.assignee.as_deref() {
                None | Some("me") => self.call("GET", "/rest/api/3/myself", None)?["accountId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                Some(a) => a.to_string(),
            };
            fields["assignee"] = json!({"accountId": account});
        }
        let created = self.call("POST", "/rest/api/3/issue", Some(json!({"fields": fields})))?;
        let key = created["key"]
            .as_str()
            .ok_or_else(|| {
                TrackerError::unavailable("tracker-b returned no key for the new issue")
            })?
            .to_string();
        if let Some(s) = status.filter(|s| !s.is_empty()) {
            self.transition(&key, s)?;
        }
        self.read(&key)
    }
}

/// A path segment: everything but unreserved characters is escaped.
fn enc(s: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

pub fn comment(c: &Value) -> Value {
    json!({
        "id": c["id"],
        "author": c.pointer("/author/displayName").cloned().unwrap_or(Value::Null),
        "body": adf_text(&c["body"]),
        "created": c["created"],
        "updated": c["updated"],
    })
}

/// Issues asked about in one steering search (`reconcileIssues` takes 50 at most).
const STEERING_IDS: usize = 50;
/// Comment pages (newest first) read per issue at most.
const STEERING_COMMENT_PAGES: usize = 5;

/// The steering search of issues whose comments may have changed since `since`: the issues
/// among `ids` updated since then (a new comment updates its issue), a relative JQL date so the
/// account's time zone does not matter, with two minutes to spare for clocks that disagree.
pub fn updated_since_jql(
    ids: &[String],
    since: std::time::SystemTime,
    now: std::time::SystemTime,
) -> Vec<String> {
    let age = now.duration_since(since).unwrap_or_default().as_secs();
    let minutes = age.div_ceil(60) + 2;
    ids_jql(ids)
        .into_iter()
        .map(|ids| format!("{ids} AND updated >= \"-{minutes}m\""))
        .collect()
}

/// A Jira comment (REST shape) for steering. `own` is svc's own account id (`None`: unknown,
/// so no comment can be told from svc's own and none is delivered).
pub fn steering_comment(
    issue: &Issue,
    c: &Value,
    own: Option<&str>,
) -> Option<super::comments::Comment> {
    use super::comments::{Author, Comment};
    let s = |p: &str| c.pointer(p).and_then(Value::as_str).map(str::to_string);
    let account = s("/author/accountId");
    let kind = match (own, account.as_deref()) {
        (Some(own), Some(a)) if own == a => Author::Own,
        (None, _) => Author::NotPerson("svc cannot tell its own account's comments here".into()),
        _ if s("/author/accountType").as_deref() == Some("app") => {
            Author::NotPerson("an app".into())
        }
        (_, None) => Author::NotPerson("no account wrote it".into()),
        _ => Author::Person,
    };
    Some(Comment {
        issue_id: issue.id.clone(),
        issue: issue.identifier.clone(),
        id: c.get("id").and_then(|v| {
            v.as_str()
                .map(str::to_string)
                .or_else(|| v.as_u64().map(|n| n.to_string()))
        })?,
        created: s("/created")?,
        author: s("/author/displayName")
            .or_else(|| account.clone())
            .unwrap_or_default(),
        author_ids: [account, s("/author/emailAddress")]
            .into_iter()
            .flatten()
            .collect(),
        kind,
        text: adf_text(&c["body"]),
    })
}

impl TrackerB {
    /// The credentials' account id, fetched once.
    fn myself(&self) -> Result<String, TrackerError> {
        let mut guard = self.myself.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = guard.as_ref() {
            return Ok(id.clone());
        }
        let id = self.call("GET", "/rest/api/3/myself", None)?["accountId"]
            .as_str()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| {
                TrackerError::unavailable("tracker-b returned no accountId for /myself")
            })?
            .to_string();
        *guard = Some(id.clone());
        Ok(id)
    }

    /// The issue's newest comments as Jira returns them, newest first, down to the first page
    /// that reaches back to `since`.
    fn comments_since(
        &self,
        id: &str,
        since: std::time::SystemTime,
    ) -> Result<Vec<Value>, TrackerError> {
        let mut out = Vec::new();
        for page in 0..STEERING_COMMENT_PAGES {
            let reply = self.call(
                "GET",
                &format!(
                    "/rest/api/3/issue/{}/comment?orderBy=-created&startAt={}&maxResults={PAGE}",
                    enc(id),
                    page as u64 * PAGE
                ),
                None,
            )?;
            let comments = reply["comments"].as_array().cloned().unwrap_or_default();
            let older = comments.iter().any(|c| {
                c["created"]
                    .as_str()
                    .and_then(crate::time::parse_time)
                    .is_some_and(|t| t <= since)
            });
            let total = reply["total"].as_u64().unwrap_or(0);
            let n = comments.len() as u64;
            out.extend(comments);
            if older || n == 0 || (page as u64 * PAGE + n) >= total {
                break;
            }
        }
        Ok(out)
    }
}

impl Tracker for TrackerB {
    fn post_comment(&self, issue: &Issue, body: &str) -> Result<(), TrackerError> {
        self.add_comment(&issue.id, body).map(drop)
    }

    fn fetch_candidates(&self) -> Result<Vec<Issue>, TrackerError> {
        self.search(&self.scope_jql(&self.states.active), usize::MAX)
    }

    fn fetch_states_by_ids(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        let mut out = Vec::new();
        for jql in ids_jql(ids) {
            out.extend(self.search(&jql, 1)?);
        }
        Ok(out)
    }

    fn fetch_terminal(&self) -> Result<Vec<Issue>, TrackerError> {
        self.search(&self.scope_jql(&self.states.terminal), TERMINAL_PAGES)
    }

    fn rate_limits(&self) -> Option<Value> {
        TrackerB::rate_limits(self)
    }

    fn steering_source(&self) -> Option<String> {
        Some(format!("tracker-b:{}", site_tag(&self.base)))
    }

    fn comment_source(&self) -> Option<&dyn CommentSource> {
        Some(self)
    }
}

impl CommentSource for TrackerB {
    /// Comments people added to `issues` since the cursor (see [`super::comments`]): one JQL
    /// search for the issues updated since then (`reconcileIssues`, so a comment just written
    /// is not missed by the search index), then each such issue's newest comments. Comments by
    /// the credentials' account (`/myself`: svc), by apps, `!aside` notes and authors outside
    /// `users` are not delivered.
    fn steering_comments(&self, issues: &[Issue], window: Window) -> Result<Batch, TrackerError> {
        let Window { cursor, now } = window;
        let since = cursor.since();
        let ids: Vec<String> = issues.iter().map(|i| i.id.clone()).collect();
        let mut found = Vec::new();
        for chunk in ids.chunks(STEERING_IDS) {
            for jql in updated_since_jql(chunk, since, now) {
                let reconcile: Vec<u64> = chunk.iter().filter_map(|i| i.parse().ok()).collect();
                let updated = paginate(&jql, 1, |mut request| {
                    request["fields"] = json!(["updated"]);
                    request["reconcileIssues"] = json!(reconcile);
                    self.call("POST", "/rest/api/3/search/jql", Some(request))
                })?;
                for u in updated {
                    let Some(issue) = issues.iter().find(|i| u["id"].as_str() == Some(&i.id))
                    else {
                        continue;
                    };
                    let own = self.myself()?;
                    for c in self.comments_since(&issue.id, since)? {
                        found.extend(steering_comment(issue, &c, Some(&own)));
                    }
                }
            }
        }
        Ok(super::comments::batch(
            crate::steering::Source::TrackerB,
            found,
            cursor,
            &self.opts.users,
            now,
        ))
    }
}

/// A short, stable tag of a site's URL for a cursor's name (the URL itself may be a secret).
pub fn site_tag(url: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(url.trim_end_matches('/').as_bytes())
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_batch_numeric_only_and_pages_follow_tokens() {
        let ids: Vec<String> = (0..150)
            .map(|n| (10_000 + n).to_string())
            .chain(["ENG-1".to_string(), String::new()])
            .collect();
        let batches = ids_jql(&ids);
        assert_eq!(batches.len(), 2);
        assert!(batches[0].starts_with("id in (10000, 10001") && !batches[1].contains("ENG"));
        let mut requests = Vec::new();
        let issues = paginate("x", 10, |r| {
            requests.push(r.clone());
            Ok(match r["nextPageToken"].as_str() {
                None => json!({"issues": [1, 2], "nextPageToken": "p2", "isLast": false}),
                Some(_) => json!([3]),
            })
        })
        .unwrap();
        assert_eq!(issues, vec![json!(1), json!(2), json!(3)]);
        assert_eq!(requests[0]["jql"], "x ORDER BY created ASC");
        assert_eq!(requests[1]["nextPageToken"], "p2");
    }

    #[test]
    fn blockers_are_the_inward_side_of_blocks_links() {
        let states = StateNames {
            active: vec!["To Do".into()],
            terminal: vec!["Done".into()],
        };
        let linked = |id: &str, key: &str, status: &str| json!({"id": id, "key": key, "fields": {"summary": "x", "status": {"name": status}}});
        let issue = json!({"id": "10001", "key": "ENG-1", "fields": {"summary": "s", "status": {"name": "To Do"}, "issuelinks": [
            {"id": "1", "type": {"name": "Blocks", "inward": "is blocked by", "outward": "blocks"}, "inwardIssue": linked("10002", "ENG-2", "In Progress")},
            {"id": "2", "type": {"name": "Blocks", "inward": "is blocked by", "outward": "blocks"}, "outwardIssue": linked("10003", "ENG-3", "To Do")},
            {"id": "3", "type": {"name": "Relates", "inward": "relates to", "outward": "relates to"}, "inwardIssue": linked("10004", "ENG-4", "To Do")}
        ]}});
        let b = map_issue(&issue, None, &states).blocked_by;
        assert_eq!(b.len(), 1, "only what blocks this issue: {b:?}");
        assert_eq!(
            (
                b[0].id.as_str(),
                b[0].identifier.as_str(),
                b[0].state.as_str()
            ),
            ("10002", "ENG-2", "In Progress")
        );
    }

    #[test]
    fn the_steering_search_asks_for_recently_updated_issues_in_minutes() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let ids = vec!["10001".to_string(), "ENG-2".to_string()];
        assert_eq!(
            updated_since_jql(&ids, now - Duration::from_secs(181), now),
            ["id in (10001) AND updated >= \"-6m\""]
        );
        // A mark ahead of svc's clock still asks a little way back.
        assert_eq!(
            updated_since_jql(&ids, now + Duration::from_secs(30), now),
            ["id in (10001) AND updated >= \"-2m\""]
        );
    }

    #[test]
    fn adf_round_trips_plain_text() {
        let doc = adf("First line\n\nThird");
        assert_eq!(doc["content"].as_array().unwrap().len(), 3);
        assert_eq!(adf_text(&doc), "First line\n\nThird");
        assert_eq!(quote("a\"b"), "\"a\\\"b\"");
    }
}
