//! JSON-RPC 2.0 over Streamable HTTP for `POST /mcp`: requests are answered with plain
//! `application/json`; notifications and client responses get 202 with no body; unknown methods
//! get -32601 (so clients that try newer methods first fall back cleanly). Tool failures are
//! data: HTTP 200 with `isError: true`.

use serde_json::{Value, json};

use super::auth::{self, Tokens};
use super::{packs, tools};
use crate::config::Settings;

/// Protocol versions this server speaks, newest first.
pub const PROTOCOL_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// What the HTTP layer sends back.
#[derive(Debug, PartialEq)]
pub enum Reply {
    /// 202 with no body.
    Accepted,
    Json(u16, Value),
}

#[derive(Default)]
pub struct McpServer {
    pub tokens: Tokens,
    /// Per-run claims (Token B) of agents on remote workers.
    pub run_tokens: super::run_tokens::RunTokens,
}

fn unauthorized() -> Reply {
    Reply::Json(
        401,
        json!({"error": {"code": "unauthorized", "message": "Missing or invalid bearer token"}}),
    )
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

impl McpServer {
    /// Mints a token for an agent of a run under `settings`.
    pub fn mint(&self, settings: &Settings) -> String {
        self.tokens.mint(
            &settings.workflow_path.to_string_lossy(),
            &auth::scope(settings),
        )
    }

    /// Whether `authorization` carries a settings-scoped token minted under `settings` (of
    /// which workflow a request is, in a daemon serving several).
    pub fn minted_under(&self, authorization: Option<&str>, settings: &Settings) -> bool {
        auth::bearer(authorization).is_some_and(|t| self.tokens.check(t, &auth::scope(settings)))
    }

    /// The run a per-run claim token belongs to, if it is one and still good.
    pub fn run_of(&self, authorization: Option<&str>) -> Option<String> {
        let token = auth::bearer(authorization)?;
        self.run_tokens.check(token, None).ok().map(|c| c.run_id)
    }

    pub fn handle(&self, authorization: Option<&str>, body: &[u8], settings: &Settings) -> Reply {
        let authorized = auth::bearer(authorization)
            .is_some_and(|t| self.tokens.check(t, &auth::scope(settings)));
        if !authorized {
            return unauthorized();
        }
        self.serve(body, settings)
    }

    /// `/mcp` on the `server.mcp_port` listener: only per-run claims (Token B) are accepted,
    /// checked for every message of the request (a tool call against the claim's allowlist);
    /// the settings-scoped token is refused here.
    pub fn handle_claimed(
        &self,
        authorization: Option<&str>,
        body: &[u8],
        settings: &Settings,
    ) -> Reply {
        let Some(token) = auth::bearer(authorization) else {
            return unauthorized();
        };
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let messages: Vec<&Value> = match &parsed {
            Some(Value::Array(batch)) => batch.iter().collect(),
            Some(m) => vec![m],
            None => vec![],
        };
        let mut checked = messages
            .is_empty()
            .then(|| self.run_tokens.check(token, None));
        for m in messages {
            let tool = (m.get("method").and_then(Value::as_str) == Some("tools/call")).then(|| {
                m.pointer("/params/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            });
            let result = self.run_tokens.check(token, tool);
            let failed = result.is_err();
            checked = Some(result);
            if failed {
                break;
            }
        }
        match checked {
            Some(Ok(claim)) => {
                log::debug!("mcp claim of run {} on {}", claim.run_id, claim.worker_host);
                self.serve(body, settings)
            }
            Some(Err(why)) => {
                log::info!("mcp claim refused ({why:?})");
                unauthorized()
            }
            None => unauthorized(),
        }
    }

    fn serve(&self, body: &[u8], settings: &Settings) -> Reply {
        let msg: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return Reply::Json(
                    400,
                    rpc_error(Value::Null, -32700, &format!("Parse error: {e}")),
                );
            }
        };
        match msg {
            Value::Array(batch) => {
                let replies: Vec<Value> = batch
                    .iter()
                    .filter_map(|m| self.message(m, settings))
                    .collect();
                if replies.is_empty() {
                    Reply::Accepted
                } else {
                    Reply::Json(200, Value::Array(replies))
                }
            }
            m => match self.message(&m, settings) {
                Some(reply) => Reply::Json(200, reply),
                None => Reply::Accepted,
            },
        }
    }

    /// One message; `None` for notifications and client responses.
    fn message(&self, m: &Value, settings: &Settings) -> Option<Value> {
        let Some(obj) = m.as_object() else {
            return Some(rpc_error(Value::Null, -32600, "Invalid Request"));
        };
        let id = obj.get("id").cloned();
        let Some(method) = obj.get("method").and_then(Value::as_str) else {
            // A response from the client, or garbage without an id: nothing to answer.
            return id
                .filter(|_| !obj.contains_key("result") && !obj.contains_key("error"))
                .map(|id| rpc_error(id, -32600, "Invalid Request"));
        };
        let id = id?; // notifications get no answer
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        let result = match method {
            "initialize" => {
                let asked = params
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let version = PROTOCOL_VERSIONS
                    .iter()
                    .find(|v| **v == asked)
                    .copied()
                    .unwrap_or(PROTOCOL_VERSIONS[0]);
                json!({
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": false}},
                    "serverInfo": {"name": "mcp", "version": env!("CARGO_PKG_VERSION")},
                    "instructions": "Tools for the issue tracker this svc daemon works from."
                })
            }
            "ping" => json!({}),
            "tools/list" => match packs::mount(settings) {
                Ok(mounted) => {
                    let list: Vec<Value> = mounted
                        .specs()
                        .into_iter()
                        .map(|s| json!({"name": s.name, "description": s.description, "inputSchema": s.input_schema}))
                        .collect();
                    json!({"tools": list})
                }
                Err(e) => return Some(rpc_error(id, -32603, &e)),
            },
            "tools/call" => {
                let Some(name) = params.get("name").and_then(Value::as_str) else {
                    return Some(rpc_error(id, -32602, "'name' is required"));
                };
                let args = params
                    .get("arguments")
                    .cloned()
                    .filter(|a| !a.is_null())
                    .unwrap_or_else(|| json!({}));
                let mounted = match packs::mount(settings) {
                    Ok(m) => m,
                    Err(e) => return Some(rpc_error(id, -32603, &e)),
                };
                // A pack that panics is caught and reported as a failure, like one that throws.
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    mounted.call(name, &args)
                }))
                .unwrap_or_else(|_| {
                    Err(tools::failure(format!("tool {name} failed unexpectedly")))
                });
                let (payload, is_error) = match outcome {
                    Ok(v) => (if v.is_null() { json!({}) } else { v }, false),
                    Err(v) => (v, true),
                };
                json!({"content": [{"type": "text", "text": payload.to_string()}], "isError": is_error})
            }
            other => return Some(rpc_error(id, -32601, &format!("Method not found: {other}"))),
        };
        Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::testutil::settings;

    #[test]
    fn the_claims_listener_takes_per_run_claims_only_and_the_dashboard_never_takes_them() {
        let server = McpServer::default();
        let s = settings("tracker:\n  kind: local");
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
        let call = |tool: &str| {
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": {}}})
                .to_string()
        };
        let token_a = server.mint(&s);
        let bearer = |t: &str| format!("Bearer {t}");
        // Token A works on the dashboard's /mcp, never on the claims listener.
        assert!(matches!(
            server.handle(Some(&bearer(&token_a)), list.as_bytes(), &s),
            Reply::Json(200, _)
        ));
        assert!(matches!(
            server.handle_claimed(Some(&bearer(&token_a)), list.as_bytes(), &s),
            Reply::Json(401, _)
        ));
        let claim = server.run_tokens.mint(
            "issue-1",
            "run-1",
            "w1",
            3,
            std::time::Duration::from_secs(60),
            ["local_query".to_string()].into(),
        );
        // A claim works on the claims listener for its allowed tools only, never on the
        // dashboard's /mcp (no fallback either way).
        assert!(matches!(
            server.handle_claimed(Some(&bearer(&claim)), list.as_bytes(), &s),
            Reply::Json(200, _)
        ));
        assert!(matches!(
            server.handle_claimed(Some(&bearer(&claim)), call("local_query").as_bytes(), &s),
            Reply::Json(200, _)
        ));
        assert!(matches!(
            server.handle_claimed(
                Some(&bearer(&claim)),
                call("local_update_status").as_bytes(),
                &s
            ),
            Reply::Json(401, _)
        ));
        assert!(matches!(
            server.handle(Some(&bearer(&claim)), list.as_bytes(), &s),
            Reply::Json(401, _)
        ));
        // Settled: refused.
        server.run_tokens.settle("issue-1", 3);
        assert!(matches!(
            server.handle_claimed(Some(&bearer(&claim)), list.as_bytes(), &s),
            Reply::Json(401, _)
        ));
        assert!(matches!(
            server.handle_claimed(None, list.as_bytes(), &s),
            Reply::Json(401, _)
        ));
    }

    fn call(server: &McpServer, s: &Settings, token: &str, body: Value) -> Reply {
        server.handle(
            Some(&format!("Bearer {token}")),
            body.to_string().as_bytes(),
            s,
        )
    }

    #[test]
    fn auth_initialize_notifications_and_unknown_methods() {
        let s = settings("tracker:\n  kind: memory");
        let server = McpServer::default();
        let token = server.mint(&s);
        assert!(
            matches!(server.handle(None, b"{}", &s), Reply::Json(401, v) if v["error"]["code"] == "unauthorized")
        );
        assert!(matches!(
            call(&server, &s, "nope", json!({})),
            Reply::Json(401, _)
        ));
        let Reply::Json(200, r) = call(
            &server,
            &s,
            &token,
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}),
        ) else {
            panic!()
        };
        assert_eq!(r["id"], 0, "id 0 is an id");
        assert_eq!(r["result"]["protocolVersion"], "2025-06-18");
        assert_eq!(r["result"]["serverInfo"]["name"], "mcp");
        let Reply::Json(200, r) = call(
            &server,
            &s,
            &token,
            json!({"jsonrpc": "2.0", "id": "a", "method": "initialize", "params": {"protocolVersion": "1999-01-01"}}),
        ) else {
            panic!()
        };
        assert_eq!(r["result"]["protocolVersion"], "2025-11-25");
        assert_eq!(
            call(
                &server,
                &s,
                &token,
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
            ),
            Reply::Accepted
        );
        assert_eq!(
            call(
                &server,
                &s,
                &token,
                json!({"jsonrpc": "2.0", "id": 5, "result": {}})
            ),
            Reply::Accepted
        );
        let Reply::Json(200, r) = call(
            &server,
            &s,
            &token,
            json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover"}),
        ) else {
            panic!()
        };
        assert_eq!(r["error"]["code"], -32601);
        let Reply::Json(200, r) = call(
            &server,
            &s,
            &token,
            json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
        ) else {
            panic!()
        };
        assert_eq!(r["result"], json!({}));
        assert!(
            matches!(server.handle(Some(&format!("Bearer {token}")), b"{not json", &s), Reply::Json(400, v) if v["error"]["code"] == -32700)
        );
    }

    #[test]
    fn memory_mounts_no_tools_and_unknown_tools_fail_as_data() {
        let s = settings("tracker:\n  kind: memory");
        let server = McpServer::default();
        let token = server.mint(&s);
        let Reply::Json(200, r) = call(
            &server,
            &s,
            &token,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        ) else {
            panic!()
        };
        assert_eq!(r["result"]["tools"], json!([]));
        let Reply::Json(200, r) = call(
            &server,
            &s,
            &token,
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "local_query", "arguments": {}}}),
        ) else {
            panic!()
        };
        assert_eq!(r["result"]["isError"], true);
        let payload: Value =
            serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(
            payload["error"]["message"],
            "Unsupported tool: local_query."
        );
        assert_eq!(payload["supportedTools"], json!([]));
    }

    #[test]
    fn local_tools_work_end_to_end() {
        let dir = std::env::temp_dir().join(format!("svc-mcp-local-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let s = settings(&format!(
            "tracker:\n  kind: memory\ntools:\n  local:\n    path: {}\n    id_prefix: T-",
            dir.display()
        ));
        let server = McpServer::default();
        let token = server.mint(&s);
        let tool = |name: &str, args: Value| -> (bool, Value) {
            let Reply::Json(200, r) = call(
                &server,
                &s,
                &token,
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}}),
            ) else {
                panic!()
            };
            let text = r["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .to_string();
            (
                r["result"]["isError"].as_bool().unwrap(),
                serde_json::from_str(&text).unwrap(),
            )
        };
        let Reply::Json(200, r) = call(
            &server,
            &s,
            &token,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        ) else {
            panic!()
        };
        let names: Vec<&str> = r["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "local_update_status",
                "local_comment",
                "local_create_issue",
                "local_read_issue",
                "local_query"
            ]
        );
        assert!(r["result"]["tools"][0]["inputSchema"]["required"].is_array());
        let (err, v) = tool(
            "local_create_issue",
            json!({"title": "First", "body": "Text"}),
        );
        assert!(!err, "{v}");
        assert_eq!(
            (
                v["issue"]["identifier"].as_str(),
                v["issue"]["state"].as_str()
            ),
            (Some("T-1"), Some("Todo"))
        );
        let (err, v) = tool("local_create_issue", json!({}));
        assert!(err);
        assert_eq!(v["error"]["message"], "'title' is required");
        tool(
            "local_create_issue",
            json!({"title": "Second", "status": "In Progress"}),
        );
        assert_eq!(
            tool("local_comment", json!({"issueId": "T-1", "body": "hello"})).1,
            json!({"ok": true})
        );
        let (_, v) = tool(
            "local_update_status",
            json!({"issueId": "T-1", "status": "Done"}),
        );
        assert_eq!(v["issue"]["stateType"], "completed");
        let (_, v) = tool("local_read_issue", json!({"issueId": "T-1"}));
        assert_eq!(v["issue"]["status"], "Done");
        assert_eq!(v["comments"][0]["body"], "hello");
        let (err, v) = tool("local_read_issue", json!({"issueId": "T-9"}));
        assert!(
            err && v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not found")
        );
        std::fs::write(dir.join("T-7.md"), "garbage").unwrap();
        let (_, v) = tool(
            "local_query",
            json!({"where": {"field": "state", "op": "ne", "value": "Done"}}),
        );
        assert_eq!(v["total"], 1);
        assert_eq!(
            v["rows"][0],
            json!({"id": "T-2", "title": "Second", "state": "In Progress", "stateType": "started", "labels": []})
        );
        assert_eq!(v["skipped"][0]["file"], "T-7.md");
        let (_, v) = tool(
            "local_query",
            json!({"select": ["id", "comments"], "order_by": [{"field": "id", "dir": "desc"}]}),
        );
        assert_eq!(v["rows"][1]["comments"][0]["body"], "hello");
        let (err, v) = tool("local_query", json!({"limit": 0}));
        assert!(err && v["error"]["message"] == "limit must be a positive integer");
        // A new issue may wait for others of the board.
        let (err, v) = tool(
            "local_create_issue",
            json!({"title": "After the second", "blockedBy": ["T-2"]}),
        );
        assert!(!err, "{v}");
        assert_eq!(
            v["issue"]["blockedBy"],
            json!([{"id": "T-2", "identifier": "T-2", "state": "In Progress"}])
        );
        let (err, v) = tool(
            "local_create_issue",
            json!({"title": "x", "blockedBy": ["T-99"]}),
        );
        assert!(
            err && v["error"]["message"].as_str().unwrap().contains("T-99"),
            "{v}"
        );
        let (err, v) = tool(
            "local_create_issue",
            json!({"title": "x", "blockedBy": "T-2"}),
        );
        assert!(
            err && v["error"]["message"] == "'blockedBy' must be an array of issue ids",
            "{v}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn tracker_a_graphql_never_borrows_another_trackers_credential() {
        let s = settings("tracker:\n  kind: memory\ntools:\n  tracker_a: {}");
        let server = McpServer::default();
        let token = server.mint(&s);
        let Reply::Json(200, r) = call(
            &server,
            &s,
            &token,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "tracker_a_graphql", "arguments": {"query": "{ viewer { id } }"}}}),
        ) else {
            panic!()
        };
        assert_eq!(r["result"]["isError"], true);
        assert!(
            r["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("no credential")
        );
        let Reply::Json(200, r) = call(
            &server,
            &s,
            &token,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "tracker_a_graphql", "arguments": {}}}),
        ) else {
            panic!()
        };
        assert!(
            r["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("'query' is required")
        );
    }
}
