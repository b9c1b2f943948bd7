//! `tracker-a`: a GraphQL issue tracker (Linear's API). Candidates are filtered on the server by
//! project (explicit slugs, or projects discovered by project label) and active state names,
//! optionally by assignee (`me` is the API key's user), and paginated 50 at a time; states by
//! ids and terminal issues are fetched in batches. Personal API keys go in `Authorization`
//! as they are. New comments on the polled issues steer their agents (one `comments` query a
//! poll, see [`super::comments`]).

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

use super::comments::{CommentSource, Window};
use super::rest::{HttpClient, Request, Resend};
use super::{Blocker, Issue, StateNames, Tracker, TrackerError};
use crate::config::{Secret, TrackerAOptions, TrackerAProjects};
use crate::steering::Batch;

const PAGE: u64 = 50;
/// Terminal issues are only needed to clean up workspaces: the most recently updated pages do.
const TERMINAL_PAGES: usize = 4;

/// The issue fields every issue query reads. Blockers come with them: the first 25 inverse
/// relations (those pointing at the issue, `blocks` among them), a bound that keeps a page of 50
/// issues within Linear's query complexity limit.
const ISSUE_FIELDS: &str = "id identifier title description priority url createdAt updatedAt state { name type } labels { nodes { name } } inverseRelations(first: 25) { nodes { type issue { id identifier state { name } } } }";

pub struct TrackerA {
    http: HttpClient,
    endpoint: String,
    api_key: Secret,
    projects: TrackerAProjects,
    assignee: Option<String>,
    states: StateNames,
    viewer: Mutex<Option<String>>,
    /// Who may steer through comments (user ids or emails); empty: any person.
    users: Vec<String>,
}

impl TrackerA {
    pub fn new(opts: &TrackerAOptions, states: StateNames) -> TrackerA {
        TrackerA {
            http: HttpClient::new(Duration::from_secs(30)),
            endpoint: opts.endpoint.clone(),
            api_key: opts.api_key.clone(),
            projects: opts.projects.clone(),
            assignee: opts.assignee.clone(),
            states,
            viewer: Mutex::new(None),
            users: opts.users.clone(),
        }
    }

    pub fn with_backoff(mut self, backoff: Duration) -> TrackerA {
        self.http.set_backoff(backoff);
        self
    }

    /// Runs a GraphQL document (a mutation is sent at most once unless Linear said it was
    /// not applied); returns `data`. `errors` on HTTP 200 is a failure too.
    pub fn graphql(&self, query: &str, variables: Value) -> Result<Value, TrackerError> {
        let body = json!({"query": query, "variables": variables}).to_string();
        let rate_limited = |r: &super::rest::Reply| r.body.contains("RATELIMITED");
        let headers = [("Authorization", self.api_key.expose())];
        // A mutation (a comment, an issue) must not be applied twice: it is sent again only
        // when Linear said it was not applied; a lost answer is an error that says so.
        let reply = if is_mutation(query) {
            let request = Request::raw("tracker-a", "POST", &self.endpoint, &headers, Some(&body));
            self.http
                .send(&request, Resend::IfNotApplied, rate_limited)?
        } else {
            self.http
                .post_json("tracker-a", &self.endpoint, &headers, &body, rate_limited)?
        };
        let parsed: Value = serde_json::from_str(&reply.body).map_err(|_| {
            TrackerError::unavailable(format!(
                "tracker-a answered HTTP {} with a body that is not JSON",
                reply.status
            ))
        })?;
        if let Some(errors) = parsed
            .get("errors")
            .and_then(Value::as_array)
            .filter(|e| !e.is_empty())
        {
            let msg = errors
                .iter()
                .filter_map(|e| e.get("message").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("; ");
            let auth = reply.status == 401
                || errors.iter().any(|e| {
                    e.pointer("/extensions/code").and_then(Value::as_str)
                        == Some("AUTHENTICATION_ERROR")
                });
            let kind = if auth {
                "authentication failed (check tracker.api_key)"
            } else {
                "GraphQL error"
            };
            return Err(TrackerError::unavailable(format!(
                "tracker-a {kind} (HTTP {}): {msg}",
                reply.status
            )));
        }
        if !(200..300).contains(&reply.status) {
            return Err(TrackerError::unavailable(format!(
                "tracker-a answered HTTP {}",
                reply.status
            )));
        }
        Ok(parsed.get("data").cloned().unwrap_or(Value::Null))
    }

    pub fn rate_limits(&self) -> Option<Value> {
        self.http.last_rate_limits()
    }

    /// The API key's user id (`viewer`), fetched once.
    pub fn viewer_id(&self) -> Result<String, TrackerError> {
        if let Some(id) = self
            .viewer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(id);
        }
        let data = self.graphql("query SvcViewer { viewer { id } }", json!({}))?;
        let id = data
            .pointer("/viewer/id")
            .and_then(Value::as_str)
            .ok_or_else(|| TrackerError::unavailable("tracker-a returned no viewer id"))?
            .to_string();
        *self.viewer.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.clone());
        Ok(id)
    }

    fn project_filter(&self) -> Result<Value, TrackerError> {
        Ok(match &self.projects {
            TrackerAProjects::Slugs(slugs) => json!({"slugId": {"in": slugs}}),
            TrackerAProjects::Slug(slug) => json!({"slugId": {"eq": slug}}),
            TrackerAProjects::Labels(labels) => {
                let nodes = self.pages("projects", usize::MAX, |after| {
                    (
                        "query SvcProjects($labels: [String!], $first: Int!, $after: String) { projects(filter: {labels: {some: {name: {in: $labels}}}}, first: $first, after: $after) { nodes { id } pageInfo { hasNextPage endCursor } } }".to_string(),
                        json!({"labels": labels, "first": PAGE, "after": after}),
                    )
                })?;
                let ids: Vec<&str> = nodes.iter().filter_map(|n| n["id"].as_str()).collect();
                json!({"id": {"in": ids}})
            }
        })
    }

    fn assignee_filter(&self) -> Result<Option<Value>, TrackerError> {
        match self.assignee.as_deref() {
            None => Ok(None),
            Some("me") => Ok(Some(json!({"id": {"eq": self.viewer_id()?}}))),
            Some(a) if a.contains('@') => Ok(Some(json!({"email": {"eq": a}}))),
            Some(a) => Ok(Some(json!({"id": {"eq": a}}))),
        }
    }

    /// Every issue matching `filter`, up to `max_pages` pages.
    fn issues(&self, filter: Value, max_pages: usize) -> Result<Vec<Issue>, TrackerError> {
        let query = format!(
            "query SvcIssues($filter: IssueFilter, $first: Int!, $after: String) {{ issues(filter: $filter, first: $first, after: $after, orderBy: updatedAt) {{ nodes {{ {ISSUE_FIELDS} }} pageInfo {{ hasNextPage endCursor }} }} }}"
        );
        let nodes = self.pages("issues", max_pages, |after| {
            (
                query.clone(),
                json!({"filter": filter, "first": PAGE, "after": after}),
            )
        })?;
        Ok(nodes.iter().map(|n| self.issue(n)).collect())
    }

    /// The nodes of a cursor-paginated connection `field`, up to `max_pages` pages; `request`
    /// builds the document and variables for a page from the cursor.
    fn pages(
        &self,
        field: &str,
        max_pages: usize,
        request: impl Fn(Option<String>) -> (String, Value),
    ) -> Result<Vec<Value>, TrackerError> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..max_pages {
            let (query, variables) = request(after.take());
            let data = self.graphql(&query, variables)?;
            let conn = &data[field];
            out.extend(conn["nodes"].as_array().into_iter().flatten().cloned());
            match (
                conn.pointer("/pageInfo/hasNextPage")
                    .and_then(Value::as_bool),
                conn.pointer("/pageInfo/endCursor").and_then(Value::as_str),
            ) {
                (Some(true), Some(c)) => after = Some(c.to_string()),
                _ => break,
            }
        }
        Ok(out)
    }

    fn issue(&self, n: &Value) -> Issue {
        let s = |k: &str| n.get(k).and_then(Value::as_str).map(str::to_string);
        let state = n
            .pointer("/state/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Issue {
            id: s("id").unwrap_or_default(),
            identifier: s("identifier").unwrap_or_default(),
            title: s("title").unwrap_or_default(),
            description: s("description"),
            state_type: n
                .pointer("/state/type")
                .and_then(Value::as_str)
                .map(str::to_string)
                .or_else(|| Some(self.states.state_type(&state).to_string())),
            state,
            labels: n
                .pointer("/labels/nodes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|l| l["name"].as_str().map(str::to_string))
                .collect(),
            url: s("url"),
            created_at: s("createdAt"),
            updated_at: s("updatedAt"),
            // tracker-a priority 0 means "no priority"; 1 (urgent) to 4 (low) sort as they are.
            priority: n
                .get("priority")
                .and_then(Value::as_f64)
                .map(|p| p as i64)
                .filter(|p| *p > 0),
            blocked_by: blockers(n),
        }
    }

    fn scoped(&self, states: &[String]) -> Result<Value, TrackerError> {
        let mut filter =
            json!({"project": self.project_filter()?, "state": {"name": {"in": states}}});
        if let Some(a) = self.assignee_filter()? {
            filter["assignee"] = a;
        }
        Ok(filter)
    }
}

impl Tracker for TrackerA {
    fn post_comment(&self, issue: &Issue, body: &str) -> Result<(), TrackerError> {
        self.graphql(
            "mutation($id: String!, $body: String!) { commentCreate(input: {issueId: $id, body: $body}) { success } }",
            serde_json::json!({"id": issue.id, "body": body}),
        )
        .map(drop)
    }

    fn fetch_candidates(&self) -> Result<Vec<Issue>, TrackerError> {
        self.issues(self.scoped(&self.states.active)?, usize::MAX)
    }

    fn fetch_states_by_ids(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        let mut out = Vec::new();
        for chunk in ids.chunks(PAGE as usize) {
            out.extend(self.issues(json!({"id": {"in": chunk}}), 1)?);
        }
        Ok(out)
    }

    fn fetch_terminal(&self) -> Result<Vec<Issue>, TrackerError> {
        let mut filter = json!({"project": self.project_filter()?, "state": {"name": {"in": self.states.terminal}}});
        if let Some(a) = self.assignee_filter()? {
            filter["assignee"] = a;
        }
        self.issues(filter, TERMINAL_PAGES)
    }

    fn rate_limits(&self) -> Option<Value> {
        TrackerA::rate_limits(self)
    }

    fn steering_source(&self) -> Option<String> {
        Some(format!("tracker-a:{}", self.endpoint))
    }

    fn comment_source(&self) -> Option<&dyn CommentSource> {
        Some(self)
    }
}

impl CommentSource for TrackerA {
    /// Comments people added to `issues` since the cursor (see [`super::comments`]): one
    /// `comments` query for all of them (filtered on the server by issue and creation time).
    /// Comments by the API key's user (svc), by bots, apps and integrations (`botActor`, an
    /// app user, no user), `!aside` notes and authors outside `users` are not delivered.
    fn steering_comments(&self, issues: &[Issue], window: Window) -> Result<Batch, TrackerError> {
        let Window { cursor, now } = window;
        let ids: Vec<&str> = issues.iter().map(|i| i.id.as_str()).collect();
        if ids.is_empty() {
            return Ok(super::comments::batch(
                crate::steering::Source::TrackerA,
                Vec::new(),
                cursor,
                &self.users,
                now,
            ));
        }
        let viewer = self.viewer_id()?;
        let since = crate::time::format_time(cursor.since());
        let mut found = Vec::new();
        for chunk in ids.chunks(STEERING_IDS) {
            let filter = json!({"issue": {"id": {"in": chunk}}, "createdAt": {"gt": since}});
            let nodes = self.pages("comments", STEERING_PAGES, |after| {
                (
                    format!("query SvcComments($filter: CommentFilter, $first: Int!, $after: String) {{ comments(filter: $filter, first: $first, after: $after, orderBy: createdAt) {{ nodes {{ {COMMENT_FIELDS} }} pageInfo {{ hasNextPage endCursor }} }} }}"),
                    json!({"filter": filter, "first": PAGE, "after": after}),
                )
            })?;
            found.extend(nodes.iter().filter_map(|n| comment(n, &viewer)));
        }
        Ok(super::comments::batch(
            crate::steering::Source::TrackerA,
            found,
            cursor,
            &self.users,
            now,
        ))
    }
}

/// Issues asked about in one comments query, and its pages at most.
const STEERING_IDS: usize = 200;
const STEERING_PAGES: usize = 10;

const COMMENT_FIELDS: &str = "id body createdAt issue { id identifier } user { id name displayName email app } botActor { name } externalUser { name }";

/// A Linear comment node for steering; `viewer` is svc's own user.
fn comment(n: &Value, viewer: &str) -> Option<super::comments::Comment> {
    use super::comments::{Author, Comment};
    let s = |p: &str| n.pointer(p).and_then(Value::as_str).map(str::to_string);
    let user = n.get("user").filter(|u| u.is_object());
    let (author, kind) = match user {
        Some(u) => {
            let name = s("/user/name")
                .filter(|n| !n.is_empty())
                .or_else(|| s("/user/displayName"))
                .unwrap_or_default();
            let kind = if u["id"].as_str() == Some(viewer) {
                Author::Own
            } else if u["app"] == true {
                Author::NotPerson("an app user".into())
            } else {
                Author::Person
            };
            (name, kind)
        }
        None => match (s("/botActor/name"), s("/externalUser/name")) {
            (Some(bot), _) => (bot, Author::NotPerson("a bot".into())),
            (None, Some(ext)) => (ext, Author::NotPerson("not a tracker-a user".into())),
            (None, None) => (
                "an integration".into(),
                Author::NotPerson("no user wrote it".into()),
            ),
        },
    };
    Some(Comment {
        issue_id: s("/issue/id")?,
        issue: s("/issue/identifier").unwrap_or_default(),
        id: s("/id")?,
        created: s("/createdAt")?,
        author,
        author_ids: [s("/user/id"), s("/user/email")]
            .into_iter()
            .flatten()
            .collect(),
        kind,
        text: s("/body").unwrap_or_default(),
    })
}

/// The issues blocking issue node `n`: its inverse relations of type `blocks` (a relation
/// `X blocks n` is one of `n`'s inverse relations, with `X` as its `issue`).
fn blockers(n: &Value) -> Vec<Blocker> {
    n.pointer("/inverseRelations/nodes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r["type"].as_str() == Some("blocks"))
        .filter_map(|r| {
            let b = &r["issue"];
            Some(Blocker {
                id: b["id"].as_str()?.to_string(),
                identifier: b["identifier"].as_str().unwrap_or_default().to_string(),
                state: b
                    .pointer("/state/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            })
        })
        .collect()
}

/// Whether a GraphQL document is a mutation: its first operation keyword, after blanks and
/// `#` comments, is `mutation`.
fn is_mutation(query: &str) -> bool {
    query
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .find(|l| !l.is_empty())
        .is_some_and(|l| l.starts_with("mutation"))
}

#[cfg(test)]
mod tests {
    use super::{blockers, is_mutation};
    use serde_json::json;

    #[test]
    fn blockers_are_the_inverse_relations_of_type_blocks() {
        let node = json!({"inverseRelations": {"nodes": [
            {"type": "blocks", "issue": {"id": "u-2", "identifier": "ENG-2", "state": {"name": "In Progress"}}},
            {"type": "related", "issue": {"id": "u-3", "identifier": "ENG-3", "state": {"name": "Todo"}}},
            {"type": "duplicate", "issue": {"id": "u-4", "identifier": "ENG-4", "state": {"name": "Todo"}}}
        ]}});
        let b = blockers(&node);
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(
            (
                b[0].id.as_str(),
                b[0].identifier.as_str(),
                b[0].state.as_str()
            ),
            ("u-2", "ENG-2", "In Progress")
        );
        assert!(blockers(&json!({"id": "u-1"})).is_empty());
    }

    #[test]
    fn mutations_are_told_from_queries() {
        assert!(is_mutation(
            "mutation { commentCreate(input: {}) { success } }"
        ));
        assert!(is_mutation(
            "  # a note\n\n  mutation Update($id: String!) { x }"
        ));
        assert!(!is_mutation("query { viewer { id } }"));
        assert!(!is_mutation("{ issues { nodes { id } } }"));
        assert!(!is_mutation("# mutation in a comment\nquery { x }"));
    }
}
