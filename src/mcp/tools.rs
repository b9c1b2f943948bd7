//! Tool packs: what a pack is ([`Pack`]: it declares tools (name, description, JSON Schema) and
//! runs them), the helpers every pack shares, and the packs of the non-chat trackers (`local`,
//! `tracker_a`, `tracker_b`). The chat packs (`mcp/chat_a.rs`, `mcp/chat_b.rs`) plug in from
//! their own modules, and which packs exist and mounting them is the registry's
//! (`mcp/packs.rs`): this module names neither.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::query;
use crate::config::{self, LocalOptions, ProviderOptions, Settings, ToolOptions};
use crate::tracker::local::Board;
use crate::tracker::{Issue, StateNames, TrackerError};

/// A tool as `tools/list` shows it.
#[derive(Clone, Debug)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub input_schema: Value,
}

/// A tool's outcome: `Ok` is the result payload; `Err` is a failure payload (`isError: true`).
pub type ToolResult = Result<Value, Value>;

pub fn failure(message: impl Into<String>) -> Value {
    json!({"error": {"message": message.into()}})
}

pub(super) fn required<'a>(args: &'a Value, key: &str) -> Result<&'a str, Value> {
    args.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| failure(format!("'{key}' is required")))
}

pub(super) fn tracker_failure(e: TrackerError) -> Value {
    failure(e.message)
}

pub(super) trait Pack: Send + Sync {
    fn specs(&self) -> Vec<ToolSpec>;
    /// `None` when the pack does not declare `name`.
    fn call(&self, name: &str, args: &Value) -> Option<ToolResult>;
}

/// `{rows, total}` of a query over tracker issues (their records, as the tools show them).
pub(super) fn issue_rows<'i>(
    issues: impl IntoIterator<Item = &'i Issue>,
    q: &query::Query,
    default: &[&str],
) -> Value {
    let records = issues
        .into_iter()
        .map(|i| issue_record(i).as_object().cloned().unwrap_or_default())
        .collect();
    let (rows, total) = query::run(records, q, default);
    json!({"rows": rows, "total": total})
}

/// The properties `base` and `extra` together (a tool's id argument and its own).
pub(super) fn merged(base: &Value, extra: Value) -> Value {
    let mut m = base.as_object().cloned().unwrap_or_default();
    m.extend(extra.as_object().cloned().unwrap_or_default());
    Value::Object(m)
}

/// A query tool's `states` argument, or `default` without one.
pub(super) fn states_arg(args: &Value, default: &[String]) -> Vec<String> {
    match args.get("states").and_then(Value::as_array) {
        Some(list) => list
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
        None => default.to_vec(),
    }
}

pub(super) fn schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": true})
}

pub(super) fn query_properties() -> Map<String, Value> {
    let props = json!({
        "where": {"type": "object", "description": "A predicate {field, op, value, ci?} or a node {and: [...]}, {or: [...]}, {not: {...}}. ops: eq, ne, lt, lte, gt, gte, in, nin, contains, exists."},
        "select": {"type": "array", "items": {"type": "string"}, "description": "Fields to return"},
        "order_by": {"type": "array", "items": {"type": "object", "properties": {"field": {"type": "string"}, "dir": {"type": "string", "enum": ["asc", "desc"]}}, "required": ["field"]}},
        "limit": {"type": "integer", "minimum": 1, "description": "Page size (default 100, at most 1000)"},
        "offset": {"type": "integer", "minimum": 0}
    });
    props.as_object().cloned().unwrap_or_default()
}

/// The `local` pack: tools over a board directory.
pub(super) struct LocalPack {
    board: Board,
}

impl LocalPack {
    pub(super) fn new(settings: &Settings) -> LocalPack {
        let from_tools = match settings.tool("local") {
            Some(ToolOptions::Local(opts)) => Some(opts.clone()),
            _ => None,
        };
        let from_tracker = match &settings.tracker.options {
            ProviderOptions::Local(opts) => Some(opts.clone()),
            _ => None,
        };
        let opts = from_tools.or(from_tracker).unwrap_or_else(|| LocalOptions {
            path: settings
                .workflow_path
                .parent()
                .unwrap_or(std::path::Path::new("."))
                .join(".svc/local"),
            id_prefix: "BOARD-".into(),
            users: Vec::new(),
        });
        LocalPack {
            board: Board::new(&opts, StateNames::from_settings(&settings.tracker)),
        }
    }
}

pub(super) fn issue_record(issue: &Issue) -> Value {
    let mut v = serde_json::to_value(issue).unwrap_or(Value::Null);
    if let Some(obj) = v.as_object_mut() {
        obj.remove("priority");
    }
    v
}

const LOCAL_ROW_DEFAULT: &[&str] = &["id", "title", "state", "stateType", "labels"];

impl Pack for LocalPack {
    fn specs(&self) -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "local_update_status",
                description: "Move a local board issue to another status (for example In Progress or Done).",
                input_schema: schema(
                    json!({"issueId": {"type": "string"}, "status": {"type": "string"}}),
                    &["issueId", "status"],
                ),
            },
            ToolSpec {
                name: "local_comment",
                description: "Add a comment to a local board issue.",
                input_schema: schema(
                    json!({"issueId": {"type": "string"}, "body": {"type": "string"}}),
                    &["issueId", "body"],
                ),
            },
            ToolSpec {
                name: "local_create_issue",
                description: "Create an issue on the local board.",
                input_schema: schema(
                    json!({"title": {"type": "string"}, "body": {"type": "string"}, "status": {"type": "string", "description": "Default Todo"}, "blockedBy": {"type": "array", "items": {"type": "string"}, "description": "Ids of board issues the new one waits for: svc does not start it while one of them is not done"}}),
                    &["title"],
                ),
            },
            ToolSpec {
                name: "local_read_issue",
                description: "Read a local board issue with its comments.",
                input_schema: schema(json!({"issueId": {"type": "string"}}), &["issueId"]),
            },
            ToolSpec {
                name: "local_query",
                description: "Query the local board read-only. Row fields: id, identifier, title, description, state, stateType, labels, createdAt, updatedAt, blockedBy, and comments when selected.",
                input_schema: schema(Value::Object(query_properties()), &[]),
            },
        ]
    }

    fn call(&self, name: &str, args: &Value) -> Option<ToolResult> {
        let result = match name {
            "local_update_status" => (|| {
                let id = required(args, "issueId")?;
                let status = required(args, "status")?;
                let b = self
                    .board
                    .update_state(id, status)
                    .map_err(tracker_failure)?;
                Ok(json!({"issue": issue_record(&b.issue)}))
            })(),
            "local_comment" => (|| {
                let id = required(args, "issueId")?;
                let body = required(args, "body")?;
                self.board
                    .add_comment(id, "agent", body)
                    .map_err(tracker_failure)?;
                Ok(json!({"ok": true}))
            })(),
            "local_create_issue" => (|| {
                let title = required(args, "title")?;
                let body = args.get("body").and_then(Value::as_str).unwrap_or("");
                let status = args
                    .get("status")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .unwrap_or("Todo");
                let blocked_by: Vec<String> = match args.get("blockedBy") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(ids)) if ids.iter().all(Value::is_string) => ids
                        .iter()
                        .filter_map(|i| i.as_str().map(str::to_string))
                        .collect(),
                    Some(_) => return Err(failure("'blockedBy' must be an array of issue ids")),
                };
                let b = self
                    .board
                    .create(title, body, status, &[], &blocked_by)
                    .map_err(tracker_failure)?;
                Ok(json!({"issue": issue_record(&b.issue)}))
            })(),
            "local_read_issue" => (|| {
                let id = required(args, "issueId")?;
                let b = self.board.read(id).map_err(tracker_failure)?;
                Ok(json!({
                    "issue": {"id": b.issue.id, "status": b.issue.state, "title": b.issue.title, "description": b.issue.description},
                    "comments": b.comments,
                }))
            })(),
            "local_query" => (|| {
                let q = query::parse(args).map_err(failure)?;
                let with_comments = q
                    .select
                    .as_ref()
                    .is_some_and(|s| s.iter().any(|f| f == "comments"));
                let scan = self.board.scan().map_err(tracker_failure)?;
                let records = scan
                    .issues
                    .iter()
                    .map(|b| {
                        let mut row = issue_record(&b.issue)
                            .as_object()
                            .cloned()
                            .unwrap_or_default();
                        row.remove("url");
                        if with_comments {
                            row.insert(
                                "comments".into(),
                                serde_json::to_value(&b.comments).unwrap_or(Value::Null),
                            );
                        }
                        row
                    })
                    .collect();
                let (rows, total) = query::run(records, &q, LOCAL_ROW_DEFAULT);
                let skipped: Vec<Value> = scan
                    .skipped
                    .iter()
                    .map(|s| json!({"file": s.file, "reason": s.reason}))
                    .collect();
                Ok(json!({"rows": rows, "total": total, "skipped": skipped}))
            })(),
            _ => return None,
        };
        Some(result)
    }
}

/// The `tracker_b` pack over the REST transport.
pub(super) struct TrackerBPack {
    client: Box<dyn crate::tracker::tracker_b::Backend>,
    states: StateNames,
}

/// A query row's default fields for a remote tracker's pack (`tracker_b`, `github`).
pub(super) const ISSUE_ROW_DEFAULT: &[&str] = &[
    "id",
    "identifier",
    "title",
    "state",
    "stateType",
    "labels",
    "url",
];

impl TrackerBPack {
    pub(super) fn new(settings: &Settings) -> Option<TrackerBPack> {
        use crate::tracker::{tracker_b::TrackerB, tracker_b_mcp::TrackerBMcp};
        let states = StateNames::from_settings(&settings.tracker);
        let from_tools = match settings.tool("tracker_b") {
            Some(ToolOptions::TrackerB(opts)) => Some((**opts).clone()),
            _ => None,
        };
        let client: Box<dyn crate::tracker::tracker_b::Backend> =
            match (from_tools, &settings.tracker.options) {
                (Some(opts), _) => Box::new(TrackerB::new(&opts, states.clone())),
                (None, ProviderOptions::TrackerB(opts)) => {
                    Box::new(TrackerB::new(opts, states.clone()))
                }
                (None, ProviderOptions::TrackerBMcp(opts)) => {
                    Box::new(TrackerBMcp::new(opts, states.clone()))
                }
                _ => return None,
            };
        Some(TrackerBPack { client, states })
    }

    fn query(&self, args: &Value) -> ToolResult {
        let q = query::parse(args).map_err(failure)?;
        let issues = if let Some(ids) = args.get("issueIds").and_then(Value::as_array) {
            let ids: Vec<String> = ids
                .iter()
                .filter_map(|i| i.as_str().map(str::to_string))
                .collect();
            let mut out = Vec::new();
            for id in ids {
                match self.client.read(&id) {
                    Ok(i) => out.push(i),
                    Err(e) if e.message.contains("404") => {}
                    Err(e) => return Err(tracker_failure(e)),
                }
            }
            out
        } else {
            let states = states_arg(args, &self.states.active);
            let mut jql = self.client.scope(&states);
            if let Some(extra) = args
                .get("query")
                .and_then(Value::as_str)
                .filter(|q| !q.trim().is_empty())
            {
                jql = format!("{jql} AND ({extra})");
            }
            self.client.search_jql(&jql).map_err(tracker_failure)?
        };
        Ok(issue_rows(&issues, &q, ISSUE_ROW_DEFAULT))
    }
}

impl Pack for TrackerBPack {
    fn specs(&self) -> Vec<ToolSpec> {
        let id = json!({"issueId": {"type": "string", "description": "Issue key (ENG-12) or id"}});
        let with = |extra: Value| merged(&id, extra);
        let mut q = query_properties();
        q.insert("states".into(), json!({"type": "array", "items": {"type": "string"}, "description": "Status names (default: the active states)"}));
        q.insert(
            "issueIds".into(),
            json!({"type": "array", "items": {"type": "string"}}),
        );
        q.insert(
            "query".into(),
            json!({"type": "string", "description": "Extra JQL, AND-ed with the scope"}),
        );
        vec![
            ToolSpec {
                name: "tracker_b_read_issue",
                description: "Read an issue.",
                input_schema: schema(id.clone(), &["issueId"]),
            },
            ToolSpec {
                name: "tracker_b_query",
                description: "Query issues in the configured scope read-only (rows: id, identifier, title, description, state, stateType, labels, url, createdAt, updatedAt, blockedBy).",
                input_schema: schema(Value::Object(q), &[]),
            },
            ToolSpec {
                name: "tracker_b_update_status",
                description: "Move an issue to a status through its workflow transition.",
                input_schema: schema(
                    with(json!({"status": {"type": "string"}})),
                    &["issueId", "status"],
                ),
            },
            ToolSpec {
                name: "tracker_b_list_comments",
                description: "List an issue's comments.",
                input_schema: schema(id.clone(), &["issueId"]),
            },
            ToolSpec {
                name: "tracker_b_comment",
                description: "Comment on an issue.",
                input_schema: schema(
                    with(json!({"body": {"type": "string"}})),
                    &["issueId", "body"],
                ),
            },
            ToolSpec {
                name: "tracker_b_update_comment",
                description: "Replace the text of a comment.",
                input_schema: schema(
                    with(json!({"commentId": {"type": "string"}, "body": {"type": "string"}})),
                    &["issueId", "commentId", "body"],
                ),
            },
            ToolSpec {
                name: "tracker_b_create_issue",
                description: "Create an issue in the first configured project.",
                input_schema: schema(
                    json!({"title": {"type": "string"}, "body": {"type": "string"}, "status": {"type": "string"}, "assignee": {"type": "string", "description": "Any value assigns the issue to the configured owner"}}),
                    &["title"],
                ),
            },
        ]
    }

    fn call(&self, name: &str, args: &Value) -> Option<ToolResult> {
        let c = &self.client;
        let result = match name {
            "tracker_b_read_issue" => (|| {
                Ok(
                    json!({"issue": issue_record(&c.read(required(args, "issueId")?).map_err(tracker_failure)?)}),
                )
            })(),
            "tracker_b_query" => self.query(args),
            "tracker_b_update_status" => (|| {
                let id = required(args, "issueId")?;
                c.transition(id, required(args, "status")?)
                    .map_err(tracker_failure)?;
                Ok(json!({"issue": issue_record(&c.read(id).map_err(tracker_failure)?)}))
            })(),
            "tracker_b_list_comments" => (|| {
                Ok(
                    json!({"comments": c.comments(required(args, "issueId")?).map_err(tracker_failure)?}),
                )
            })(),
            "tracker_b_comment" => (|| {
                let made = c
                    .add_comment(required(args, "issueId")?, required(args, "body")?)
                    .map_err(tracker_failure)?;
                Ok(match made {
                    Some(comment) => json!({"ok": true, "comment": comment}),
                    None => json!({"ok": true}),
                })
            })(),
            "tracker_b_update_comment" => (|| {
                let comment = c
                    .update_comment(
                        required(args, "issueId")?,
                        required(args, "commentId")?,
                        required(args, "body")?,
                    )
                    .map_err(tracker_failure)?;
                Ok(json!({"comment": comment}))
            })(),
            "tracker_b_create_issue" => (|| {
                let title = required(args, "title")?;
                let body = args.get("body").and_then(Value::as_str).unwrap_or("");
                let status = args.get("status").and_then(Value::as_str);
                let assign = args.get("assignee").and_then(Value::as_str);
                Ok(
                    json!({"issue": issue_record(&c.create(title, body, status, assign).map_err(tracker_failure)?)}),
                )
            })(),
            _ => return None,
        };
        Some(result)
    }
}

/// The `tracker_a` pack: one raw GraphQL tool.
pub(super) struct TrackerAPack {
    api_key: Option<config::Secret>,
    endpoint: String,
}

impl TrackerAPack {
    pub(super) fn new(settings: &Settings) -> TrackerAPack {
        let slice = match settings.tool("tracker_a") {
            Some(ToolOptions::TrackerA { api_key, endpoint }) => {
                Some((api_key.clone(), endpoint.clone()))
            }
            _ => None,
        };
        // Only a tracker-a dispatch tracker lends its key; another tracker's token is never sent.
        let dispatch = match &settings.tracker.options {
            ProviderOptions::TrackerA(o) => Some((o.api_key.clone(), o.endpoint.clone())),
            _ => None,
        };
        let api_key = slice
            .as_ref()
            .and_then(|(k, _)| k.clone())
            .filter(|k| !k.is_empty())
            .or_else(|| dispatch.as_ref().map(|(k, _)| k.clone()));
        // The endpoint resolves like the credential: the pack's own, then (only for a tracker-a
        // dispatch tracker) the dispatch tracker's, then the public default.
        let endpoint = slice
            .and_then(|(_, e)| e)
            .or_else(|| dispatch.map(|(_, e)| e))
            .unwrap_or_else(|| config::TRACKER_A_DEFAULT_ENDPOINT.to_string());
        TrackerAPack { api_key, endpoint }
    }

    fn graphql(&self, args: &Value) -> ToolResult {
        let (query, mut variables) = match args.get("query") {
            Some(Value::String(q)) if !q.is_empty() => (q.clone(), Value::Null),
            Some(Value::Object(o)) => match o.get("query").and_then(Value::as_str) {
                Some(q) if !q.is_empty() => (
                    q.to_string(),
                    o.get("variables").cloned().unwrap_or(Value::Null),
                ),
                _ => return Err(failure("'query' is required")),
            },
            _ => return Err(failure("'query' is required")),
        };
        match args.get("variables") {
            None | Some(Value::Null) => {}
            Some(v @ Value::Object(_)) => variables = v.clone(),
            Some(_) => return Err(failure("'variables' must be an object or null")),
        }
        let Some(key) = self.api_key.as_ref().filter(|k| !k.is_empty()) else {
            return Err(failure(
                "tracker_a_graphql has no credential: set tools.tracker_a.api_key (or use a tracker-a dispatch tracker)",
            ));
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(30)))
            .http_status_as_error(false)
            .build()
            .into();
        let body = json!({"query": query, "variables": variables}).to_string();
        let response = agent
            .post(&self.endpoint)
            .header("Authorization", key.expose())
            .header("Content-Type", "application/json")
            .send(body.as_str());
        let mut response = match response {
            Ok(r) => r,
            Err(e) => return Err(failure(format!("tracker_a request failed: {e}"))),
        };
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        if !(200..300).contains(&status) {
            let excerpt: String = text.chars().take(300).collect();
            return Err(failure(format!(
                "tracker_a answered HTTP {status}: {excerpt}"
            )));
        }
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| failure(format!("tracker_a answered invalid JSON: {e}")))?;
        if value
            .get("errors")
            .is_some_and(|e| e.as_array().is_some_and(|a| !a.is_empty()))
        {
            return Err(value);
        }
        Ok(value)
    }
}

impl Pack for TrackerAPack {
    fn specs(&self) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "tracker_a_graphql",
            description: "Run a GraphQL query or mutation against the tracker-a API.",
            input_schema: schema(
                json!({
                    "query": {"description": "A GraphQL document, or an object {query, variables}", "anyOf": [{"type": "string"}, {"type": "object"}]},
                    "variables": {"type": ["object", "null"]}
                }),
                &["query"],
            ),
        }]
    }

    fn call(&self, name: &str, args: &Value) -> Option<ToolResult> {
        (name == "tracker_a_graphql").then(|| self.graphql(args))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::testutil::settings;

    /// A fake GraphQL endpoint answering like tracker-a: data, `errors` on HTTP 200, or 401.
    fn fake_graphql() -> (String, std::sync::mpsc::Receiver<(String, Value)>) {
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = server.server_addr().to_ip().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for mut req in server.incoming_requests() {
                let auth = req
                    .headers()
                    .iter()
                    .find(|h| h.field.equiv("Authorization"))
                    .map(|h| h.value.as_str().to_string())
                    .unwrap_or_default();
                let mut body = String::new();
                req.as_reader().read_to_string(&mut body).unwrap();
                let v: Value = serde_json::from_str(&body).unwrap();
                let q = v["query"].as_str().unwrap_or_default().to_string();
                let _ = tx.send((auth.clone(), v));
                let (status, answer) = if auth != "lin_api_test" {
                    (
                        401,
                        json!({"errors": [{"message": "Authentication required"}]}),
                    )
                } else if q.contains("broken") {
                    (
                        200,
                        json!({"data": null, "errors": [{"message": "Cannot query field broken"}]}),
                    )
                } else {
                    (200, json!({"data": {"viewer": {"id": "u1"}}}))
                };
                let _ = req.respond(
                    tiny_http::Response::from_string(answer.to_string()).with_status_code(status),
                );
            }
        });
        (format!("http://127.0.0.1:{port}/graphql"), rx)
    }

    /// Calls a tool `pack` declares.
    fn call(pack: &dyn Pack, name: &str, args: &Value) -> ToolResult {
        pack.call(name, args).expect("a tool the pack declares")
    }

    #[test]
    fn tracker_a_graphql_sends_only_its_own_credential_and_reports_failures() {
        let (endpoint, seen) = fake_graphql();
        let s = settings(&format!(
            "tracker:\n  kind: memory\ntools:\n  tracker_a:\n    api_key: lin_api_test\n    endpoint: {endpoint}"
        ));
        let m = TrackerAPack::new(&s);
        let ok = call(
            &m,
            "tracker_a_graphql",
            &json!({"query": "query { viewer { id } }"}),
        )
        .unwrap();
        assert_eq!(ok["data"]["viewer"]["id"], "u1");
        let (auth, body) = seen.recv().unwrap();
        assert_eq!(auth, "lin_api_test");
        assert_eq!(body["variables"], Value::Null);
        let with_vars = call(&m, "tracker_a_graphql", &json!({"query": {"query": "query($id: String!) { issue(id: $id) { id } }", "variables": {"id": "X"}}})).unwrap();
        assert!(with_vars["data"].is_object());
        assert_eq!(seen.recv().unwrap().1["variables"]["id"], "X");
        // GraphQL errors on HTTP 200: a failure whose result is the body.
        let err = call(&m, "tracker_a_graphql", &json!({"query": "{ broken }"})).unwrap_err();
        assert_eq!(err["errors"][0]["message"], "Cannot query field broken");
        // HTTP failures carry the status.
        let s = settings(&format!(
            "tracker:\n  kind: memory\ntools:\n  tracker_a:\n    api_key: wrong\n    endpoint: {endpoint}"
        ));
        let err = call(
            &TrackerAPack::new(&s),
            "tracker_a_graphql",
            &json!({"query": "{ viewer { id } }"}),
        )
        .unwrap_err();
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .contains("HTTP 401"),
            "{err}"
        );
    }

    #[test]
    fn the_tracker_a_endpoint_resolves_like_its_credential() {
        let endpoint = |yaml: &str| TrackerAPack::new(&settings(yaml)).endpoint;
        let dispatch = "tracker:\n  kind: tracker-a\n  api_key: d\n  project_slugs: [x]\n  endpoint: http://127.0.0.1:9/gql\n";
        // The pack's own endpoint first.
        assert_eq!(
            endpoint(&format!(
                "{dispatch}tools:\n  tracker_a:\n    api_key: k\n    endpoint: http://own/gql"
            )),
            "http://own/gql"
        );
        // Then a tracker-a dispatch tracker's, even when only the key is the pack's own.
        assert_eq!(
            endpoint(&format!("{dispatch}tools:\n  tracker_a:\n    api_key: k")),
            "http://127.0.0.1:9/gql"
        );
        // Another tracker lends nothing: the public default.
        assert_eq!(
            endpoint("tracker:\n  kind: memory\ntools:\n  tracker_a:\n    api_key: k"),
            config::TRACKER_A_DEFAULT_ENDPOINT
        );
    }
}
