//! `tracker-b-mcp`: the same tracker reached through an external MCP server. svc is an MCP
//! client over Streamable HTTP (`mcp.url`, `mcp.token` as Bearer, `mcp.headers`), calling the
//! configured tool names (`mcp.tools.*`). Payloads are expected in the tracker's REST shape
//! (issues with `id`, `key`, `fields`); `base_url` only builds issue URLs when they carry none.
//!
//! The external tools are called with these arguments: search `{jql, maxResults,
//! nextPageToken?, fields}` (`fields` as the REST search takes them, `issuelinks` among them for
//! the blockers; answering `{issues, nextPageToken?, isLast?}` or an array of issues),
//! read_issue `{issueId}`, update_status `{issueId, status}`, list_comments `{issueId}`, comment
//! `{issueId, body}`, update_comment `{issueId, commentId, body}`, create_issue `{projectKey,
//! title, body, issueType, status?, assignee?}`.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

use super::comments::{CommentSource, Window};
use super::rest::HttpClient;
use super::tracker_b::{
    Backend, comment, ids_jql, map_issue, paginate, scope_jql, site_tag, steering_comment,
    updated_since_jql,
};
use super::{Issue, StateNames, Tracker, TrackerError};
use crate::config::TrackerBMcpOptions;
use crate::steering::Batch;

pub struct TrackerBMcp {
    http: HttpClient,
    opts: TrackerBMcpOptions,
    states: StateNames,
    session: Mutex<Option<Option<String>>>,
    next_id: Mutex<u64>,
}

/// The JSON-RPC message in a response body: plain JSON, or the `data:` of an SSE stream.
fn rpc_message(body: &str, id: u64) -> Option<Value> {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return Some(v);
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").and_then(Value::as_u64) == Some(id))
}

impl TrackerBMcp {
    pub fn new(opts: &TrackerBMcpOptions, states: StateNames) -> TrackerBMcp {
        TrackerBMcp {
            http: HttpClient::new(Duration::from_secs(60)),
            opts: opts.clone(),
            states,
            session: Mutex::new(None),
            next_id: Mutex::new(1),
        }
    }

    fn headers(&self, session: &Option<String>) -> Vec<(String, String)> {
        let mut h: Vec<(String, String)> = self
            .opts
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string()))
            .collect();
        h.push((
            "Accept".into(),
            "application/json, text/event-stream".into(),
        ));
        if let Some(t) = &self.opts.token {
            h.push(("Authorization".into(), format!("Bearer {}", t.expose())));
        }
        if let Some(s) = session {
            h.push(("Mcp-Session-Id".into(), s.clone()));
        }
        h
    }

    fn post(
        &self,
        msg: &Value,
        session: &Option<String>,
    ) -> Result<super::rest::Reply, TrackerError> {
        let headers = self.headers(session);
        let refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.http.request(
            "tracker-b-mcp",
            "POST",
            self.opts.url.expose(),
            &refs,
            Some(&msg.to_string()),
            |_| false,
        )
    }

    /// `initialize` once per process (keeping the server's session id, if it gives one).
    fn session(&self) -> Result<Option<String>, TrackerError> {
        let mut guard = self.session.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = guard.as_ref() {
            return Ok(s.clone());
        }
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "svc", "version": env!("CARGO_PKG_VERSION")}}});
        let reply = self.post(&init, &None)?;
        if reply.status != 200 {
            return Err(TrackerError::unavailable(format!(
                "tracker-b-mcp: initialize answered HTTP {}",
                reply.status
            )));
        }
        let session = reply.session_id.clone();
        let _ = self.post(
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            &session,
        )?;
        *guard = Some(session.clone());
        Ok(session)
    }

    /// Calls an external tool; returns its JSON payload, or the tool's error text as a failure.
    pub fn call_tool(&self, name: &str, args: Value) -> Result<Value, TrackerError> {
        let session = self.session()?;
        let id = {
            let mut n = self.next_id.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            *n
        };
        let reply = self.post(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}}), &session)?;
        if reply.status == 404 {
            // The server forgot the session: start a new one next time.
            *self.session.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        if reply.status != 200 {
            return Err(TrackerError::unavailable(format!(
                "tracker-b-mcp: {name} answered HTTP {}",
                reply.status
            )));
        }
        let msg = rpc_message(&reply.body, id).ok_or_else(|| {
            TrackerError::unavailable(format!(
                "tracker-b-mcp: {name} answered no JSON-RPC message"
            ))
        })?;
        if let Some(e) = msg.get("error") {
            return Err(TrackerError::unavailable(format!(
                "tracker-b-mcp: {name} failed: {}",
                e["message"].as_str().unwrap_or("unknown error")
            )));
        }
        let result = &msg["result"];
        let text = result
            .pointer("/content/0/text")
            .and_then(Value::as_str)
            .unwrap_or("");
        if result["isError"] == true {
            return Err(TrackerError::unavailable(format!(
                "tracker-b-mcp: {name}: {text}"
            )));
        }
        if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null()) {
            return Ok(structured.clone());
        }
        Ok(serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string())))
    }

    fn map(&self, v: &Value) -> Issue {
        let issue = v.get("issue").filter(|i| i.is_object()).unwrap_or(v);
        map_issue(
            issue,
            self.opts.base_url.as_ref().map(|b| b.expose()),
            &self.states,
        )
    }

    fn search(&self, jql: &str, max_pages: usize) -> Result<Vec<Issue>, TrackerError> {
        let issues = paginate(jql, max_pages, |mut request| {
            request["fields"] = json!(super::tracker_b::FIELDS);
            self.call_tool(&self.opts.tools.search, request)
        })?;
        Ok(issues.iter().map(|i| self.map(i)).collect())
    }
}

impl Backend for TrackerBMcp {
    fn scope(&self, states: &[String]) -> String {
        scope_jql(&self.opts.scope, states)
    }
    fn search_jql(&self, jql: &str) -> Result<Vec<Issue>, TrackerError> {
        self.search(jql, 50)
    }
    fn read(&self, id: &str) -> Result<Issue, TrackerError> {
        Ok(self.map(&self.call_tool(&self.opts.tools.read_issue, json!({"issueId": id}))?))
    }
    fn transition(&self, id: &str, status: &str) -> Result<(), TrackerError> {
        self.call_tool(
            &self.opts.tools.update_status,
            json!({"issueId": id, "status": status}),
        )?;
        Ok(())
    }
    fn comments(&self, id: &str) -> Result<Vec<Value>, TrackerError> {
        let v = self.call_tool(&self.opts.tools.list_comments, json!({"issueId": id}))?;
        Ok(v.get("comments")
            .and_then(Value::as_array)
            .or_else(|| v.as_array())
            .into_iter()
            .flatten()
            .map(comment)
            .collect())
    }
    fn add_comment(&self, id: &str, body: &str) -> Result<Option<Value>, TrackerError> {
        let v = self.call_tool(
            &self.opts.tools.comment,
            json!({"issueId": id, "body": body}),
        )?;
        Ok(v.get("id").is_some().then(|| comment(&v)))
    }
    fn update_comment(&self, id: &str, cid: &str, body: &str) -> Result<Value, TrackerError> {
        Ok(comment(&self.call_tool(
            &self.opts.tools.update_comment,
            json!({"issueId": id, "commentId": cid, "body": body}),
        )?))
    }
    fn create(
        &self,
        title: &str,
        body: &str,
        status: Option<&str>,
        assignee: Option<&str>,
    ) -> Result<Issue, TrackerError> {
        let project = self.opts.scope.project_keys.first().ok_or_else(|| {
            TrackerError::invalid("tracker_b_create_issue needs tracker.project_keys")
        })?;
        let mut args = json!({"projectKey": project, "title": title, "body": body, "issueType": self.opts.scope.issue_type});
        if let Some(s) = status.filter(|s| !s.is_empty()) {
            args["status"] = s.into();
        }
        if let Some(a) = assignee.filter(|a| !a.is_empty()) {
            args["assignee"] = a.into();
        }
        let v = self.call_tool(&self.opts.tools.create_issue, args)?;
        let issue = self.map(&v);
        if issue.identifier.is_empty()
            && let Some(key) = v.get("key").and_then(Value::as_str)
        {
            return self.read(key);
        }
        Ok(issue)
    }
}

impl Tracker for TrackerBMcp {
    fn post_comment(&self, issue: &Issue, body: &str) -> Result<(), TrackerError> {
        Backend::add_comment(self, &issue.id, body).map(drop)
    }

    fn fetch_candidates(&self) -> Result<Vec<Issue>, TrackerError> {
        self.search(
            &scope_jql(&self.opts.scope, &self.states.active),
            usize::MAX,
        )
    }

    fn fetch_states_by_ids(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        let mut out = Vec::new();
        for jql in ids_jql(ids) {
            out.extend(self.search(&jql, 1)?);
        }
        Ok(out)
    }

    fn fetch_terminal(&self) -> Result<Vec<Issue>, TrackerError> {
        self.search(&scope_jql(&self.opts.scope, &self.states.terminal), 2)
    }

    fn steering_source(&self) -> Option<String> {
        Some(format!(
            "tracker-b-mcp:{}",
            site_tag(self.opts.url.expose())
        ))
    }

    fn comment_source(&self) -> Option<&dyn CommentSource> {
        Some(self)
    }
}

impl CommentSource for TrackerBMcp {
    /// Comments people added to `issues` since the cursor, as tracker-b finds them, through the
    /// search and list_comments tools. An MCP server has no standard way to say whose account it
    /// acts as, so svc's own account is the one the issue is assigned to (the worker: the gate
    /// dispatches nothing else); an issue the search returns without an assignee delivers
    /// nothing (each comment is reported as not delivered).
    fn steering_comments(&self, issues: &[Issue], window: Window) -> Result<Batch, TrackerError> {
        let Window { cursor, now } = window;
        let since = cursor.since();
        let ids: Vec<String> = issues.iter().map(|i| i.id.clone()).collect();
        let verbatim = self
            .opts
            .scope
            .assignee
            .as_deref()
            .filter(|a| *a != "me")
            .map(str::to_string);
        let mut found = Vec::new();
        for jql in updated_since_jql(&ids, since, now) {
            // Only the fields this needs (the search returns no others, as Jira's does).
            let updated = paginate(&jql, 1, |mut request| {
                request["fields"] = json!(["assignee", "updated"]);
                self.call_tool(&self.opts.tools.search, request)
            })?;
            for u in updated {
                let u = u.get("issue").filter(|i| i.is_object()).unwrap_or(&u);
                let Some(issue) = issues.iter().find(|i| {
                    u["id"].as_str() == Some(&i.id) || u["key"].as_str() == Some(&i.identifier)
                }) else {
                    continue;
                };
                let own = u
                    .pointer("/fields/assignee/accountId")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .or_else(|| verbatim.clone());
                let v =
                    self.call_tool(&self.opts.tools.list_comments, json!({"issueId": issue.id}))?;
                for c in v
                    .get("comments")
                    .and_then(Value::as_array)
                    .or_else(|| v.as_array())
                    .into_iter()
                    .flatten()
                {
                    found.extend(steering_comment(issue, c, own.as_deref()));
                }
            }
        }
        Ok(super::comments::batch(
            crate::steering::Source::TrackerBMcp,
            found,
            cursor,
            &self.opts.users,
            now,
        ))
    }
}
