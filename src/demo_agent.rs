//! `svc demo-agent`: a scripted ACP agent built into the binary, so the shipped workflow runs
//! with no model key, and the test agent of svc's own tests. It speaks ACP on stdio like a real
//! bridge: it streams thoughts, messages and a plan, makes a tool call that needs permission,
//! edits `DEMO.md` in its workspace and reports token usage, and what the session cost so far
//! (a `usage_update` with `cost`).
//!
//! Behaviour can be scripted per issue with lines `demo: <directive>` in the prompt (the issue
//! description reaches the prompt through the template):
//!
//! | directive | effect |
//! |---|---|
//! | `demo: crash` | exit with status 3 when the prompt arrives |
//! | `demo: stall` | never answer the prompt and send nothing |
//! | `demo: slow <ms>` | wait that long (cancellable) before finishing the turn |
//! | `demo: fail` | answer the prompt with a JSON-RPC error |
//! | `demo: deny` | offer only reject options in the permission request |
//! | `demo: flood <n>` | send n message chunks |
//! | `demo: stream <rate> <seconds>` | send `rate` message chunks a second, evenly spaced, for that long (cancellable) |
//! | `demo: stream-cost` | with `stream`: after every 10th chunk also a `usage_update` with the session's cost (a tenth of a cent more each time) |
//! | `demo: stderr <n>` | write n lines to stderr |
//! | `demo: keep-open` | do not complete the issue through MCP |
//! | `demo: finish <State>` | complete the issue in that state instead of `Done` |
//! | `demo: hold <ms>` | in this and every later turn of the session: wait that long, keep the issue open |
//! | `demo: say <text>` | add a message with this text (`\n` in it is a line break), e.g. Markdown |
//! | `demo: burn <usd> <ms>` | during the turn, spend that many dollars evenly over that long, reporting the session's cost every 100 ms (cancellable) |
//! | `demo: report <usd> <tokens> <ms>` | during the turn, report twice in quick succession (the session's cost up by half of `<usd>`, then by all of it; `<tokens>` in its context, half then all; `-` for either reports none), then work silently for that long (cancellable) |
//! | `demo: usage <input> <output>` | the turn's answer reports these token counts (default 1,000 and 200) |
//! | `demo: cost <amount> [currency]` | each turn costs that much (default `0.006 USD`, the demo's 1,000 input and 200 output tokens at $3 and $15 per million); `demo: cost none` reports no cost |
//!
//! When `session/new` hands it an HTTP MCP server, the agent lists the tools and, if the
//! tracker's pack offers them, comments on its issue and moves it to `Done` (`local_comment` and
//! `local_update_status`; `tracker_b_comment` and `tracker_b_update_status`; `chat_a_comment` and
//! `chat_a_update_status`, which posts status `Done` in the Slack thread; `chat_b_workpad` (twice:
//! created, then edited), `chat_b_comment` and `chat_b_update_status` in the Discord thread; `github_comment` and
//! `github_update_status`; `gitlab_comment` and `gitlab_update_status`; for tracker-a,
//! `tracker_a_graphql` with `commentCreate` and `issueUpdate`).
//!
//! A limited account: `SVC_DEMO_AGENT_LIMIT=<how>` answers every prompt as the real bridges do
//! once an account met a limit, with the words of `SVC_DEMO_AGENT_LIMIT_TEXT`, while the file
//! `SVC_DEMO_AGENT_LIMIT_WHILE` exists (for ever without it): `error429` (a
//! JSON-RPC error with code 429 and `retry_after: 3` in its data), `claude-error` (code -32603,
//! the words in the message, `errorKind: rate_limit`), `codex-error` (code -32603, the words in
//! `data.message`, `codex_error_info: usage_limit_exceeded`), `message` (the words as the turn's
//! only message, then `end_turn`), `silent` (`end_turn` with no update at all).
//!
//! And for the whole process with `SVC_DEMO_AGENT` (comma-separated): `crash-on-init`,
//! `hang-on-init`, `crash-on-session`, `no-http-mcp`. With `SVC_DEMO_AGENT_RECORD=<file>` it
//! appends the `session/new` parameters it receives to that file (tests read the MCP token);
//! with `SVC_DEMO_AGENT_PROMPTS=<file>`, every `session/prompt` as it arrives (`atMs`,
//! `issueId`, `runId`, `text`). A prompt that arrives during a turn is queued and runs after it (set
//! `queue_prompts: true` on the agent record so svc sends steering at once).

use std::io::{self, BufRead, Write};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, unbounded};
use serde_json::{Value, json};

/// An MCP server from `session/new`.
struct McpServer {
    url: String,
    headers: Vec<(String, String)>,
}

impl McpServer {
    fn post(&self, agent: &ureq::Agent, body: &Value) -> Result<Value, String> {
        let mut req = agent
            .post(&self.url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream");
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        let mut resp = req
            .send(body.to_string().as_str())
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        if status == 202 {
            return Ok(Value::Null);
        }
        if status != 200 {
            return Err(format!("HTTP {status}: {text}"));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        match v.get("error") {
            Some(e) => Err(e.to_string()),
            None => Ok(v["result"].clone()),
        }
    }

    /// Lists the tools and, where the pack has them, comments and moves the issue to Done.
    fn complete(&self, issue_id: &str, turn: u64, finish: &str) -> Result<Option<String>, String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(20)))
            .http_status_as_error(false)
            .build()
            .into();
        self.post(&agent, &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "svc-demo-agent", "version": env!("CARGO_PKG_VERSION")}}}))?;
        self.post(
            &agent,
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )?;
        let tools = self.post(
            &agent,
            &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )?;
        let names: Vec<&str> = tools["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default();
        let call = |id: u64, name: String, args: Value| -> Result<Value, String> {
            let r = self.post(&agent, &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}}))?;
            let text = r["content"][0]["text"].as_str().unwrap_or("");
            if r["isError"] == true {
                return Err(format!("{name}: {text}"));
            }
            Ok(serde_json::from_str(text).unwrap_or(Value::Null))
        };
        let body =
            format!("The demo agent wrote DEMO.md in its workspace (turn {turn}) and is done.");
        let prefix = ["local", "tracker_b", "chat_a", "chat_b", "github", "gitlab"]
            .into_iter()
            .find(|p| names.contains(&format!("{p}_update_status").as_str()));
        let Some(prefix) = prefix else {
            if names.contains(&"tracker_a_graphql") {
                // tracker-a: find the team's Done state, comment, then move the issue.
                let team = call(
                    3,
                    "tracker_a_graphql".into(),
                    json!({"query": "query($id: String!) { issue(id: $id) { team { states(filter: {name: {eq: \"Done\"}}) { nodes { id } } } } }", "variables": {"id": issue_id}}),
                )?;
                let state_id = team
                    .pointer("/data/issue/team/states/nodes/0/id")
                    .and_then(Value::as_str)
                    .ok_or("tracker-a has no Done state")?
                    .to_string();
                call(
                    4,
                    "tracker_a_graphql".into(),
                    json!({"query": "mutation($id: String!, $body: String!) { commentCreate(input: {issueId: $id, body: $body}) { success } }", "variables": {"id": issue_id, "body": body}}),
                )?;
                call(
                    5,
                    "tracker_a_graphql".into(),
                    json!({"query": "mutation($id: String!, $state: String!) { issueUpdate(id: $id, input: {stateId: $state}) { success } }", "variables": {"id": issue_id, "state": state_id}}),
                )?;
                return Ok(Some("tracker_a_graphql".into()));
            }
            return Ok(None);
        };
        if names.contains(&format!("{prefix}_workpad").as_str()) {
            // The workpad: written once, then updated in place with the progress.
            let pad = |progress: &str| json!({"issueId": issue_id, "environment": "svc demo agent", "plan": "1. Write DEMO.md", "acceptanceCriteria": "DEMO.md exists", "validationCommands": "test -f DEMO.md", "progress": progress});
            call(5, format!("{prefix}_workpad"), pad("started"))?;
            call(6, format!("{prefix}_workpad"), pad("DEMO.md written"))?;
        }
        call(
            3,
            format!("{prefix}_comment"),
            json!({"issueId": issue_id, "body": body}),
        )?;
        call(
            4,
            format!("{prefix}_update_status"),
            json!({"issueId": issue_id, "status": finish}),
        )?;
        Ok(Some(format!("{prefix}_update_status")))
    }
}

struct Agent {
    mcp: Option<McpServer>,
    out: io::Stdout,
    rx: Receiver<Value>,
    next_id: u64,
    session: u64,
    cwd: std::path::PathBuf,
    turns: u64,
    /// Prompts that arrived during a turn, run after it in order.
    queued: std::collections::VecDeque<Value>,
    /// `demo: hold <ms>` seen: every later turn waits that long and keeps the issue open.
    hold: Option<u64>,
    /// What the session cost so far, as `usage_update` reports it (cumulative).
    spent: f64,
    /// `SVC_DEMO_AGENT_LIMIT`: the account is limited (while `SVC_DEMO_AGENT_LIMIT_WHILE` exists).
    limit: Option<Limited>,
}

/// A limited account, as the real bridges show it (`SVC_DEMO_AGENT_LIMIT=<how>`, with the
/// words in `SVC_DEMO_AGENT_LIMIT_TEXT`, while the file `SVC_DEMO_AGENT_LIMIT_WHILE` exists
/// when that is set).
struct Limited {
    how: String,
    text: String,
    /// `SVC_DEMO_AGENT_LIMIT_WHILE`: limited only while this file exists.
    while_file: Option<std::path::PathBuf>,
}

impl Limited {
    fn from_env() -> Option<Limited> {
        let how = std::env::var("SVC_DEMO_AGENT_LIMIT").ok()?;
        Some(Limited {
            how,
            text: std::env::var("SVC_DEMO_AGENT_LIMIT_TEXT")
                .unwrap_or_else(|_| "You've hit your limit".into()),
            while_file: std::env::var_os("SVC_DEMO_AGENT_LIMIT_WHILE").map(Into::into),
        })
    }

    fn active(&self) -> bool {
        self.while_file.as_ref().is_none_or(|f| f.exists())
    }
}

pub fn main() -> std::process::ExitCode {
    let modes: Vec<String> = std::env::var("SVC_DEMO_AGENT")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let has = |m: &str| modes.iter().any(|x| x == m);
    let (tx, rx) = unbounded();
    let prompts = std::env::var("SVC_DEMO_AGENT_PROMPTS").ok();
    std::thread::spawn(move || {
        for line in io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            // Tests and the steering benchmark read every prompt and when it arrived.
            if let Some(path) = &prompts
                && v.get("method").and_then(Value::as_str) == Some("session/prompt")
            {
                let at_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                let record = json!({
                    "atMs": at_ms,
                    "issueId": std::env::var("SVC_ISSUE_ID").unwrap_or_default(),
                    "runId": std::env::var("SVC_RUN_ID").unwrap_or_default(),
                    "text": prompt_text(&v["params"]),
                });
                let _ = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|mut f| f.write_all(format!("{record}\n").as_bytes()));
            }
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    let mut agent = Agent {
        mcp: None,
        out: io::stdout(),
        rx,
        next_id: 1000,
        session: 0,
        cwd: std::env::current_dir().unwrap_or_default(),
        turns: 0,
        queued: std::collections::VecDeque::new(),
        hold: None,
        spent: 0.0,
        limit: Limited::from_env(),
    };
    loop {
        // A prompt that arrived during a turn runs after it (queued prompts).
        let msg = match agent.queued.pop_front() {
            Some(m) => m,
            None => match agent.rx.recv() {
                Ok(m) => m,
                Err(_) => return std::process::ExitCode::SUCCESS,
            },
        };
        let method = msg
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let id = msg.get("id").cloned();
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        match (method.as_str(), id) {
            ("initialize", Some(id)) => {
                if has("crash-on-init") {
                    std::process::exit(4);
                }
                if has("hang-on-init") {
                    loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    }
                }
                agent.reply(&id, json!({
                    "protocolVersion": 1,
                    "agentCapabilities": {"loadSession": false, "mcpCapabilities": {"http": !has("no-http-mcp"), "sse": false}},
                    "agentInfo": {"name": "svc-demo-agent", "version": env!("CARGO_PKG_VERSION")},
                    "authMethods": []
                }));
            }
            ("session/new", Some(id)) => {
                if has("crash-on-session") {
                    std::process::exit(5);
                }
                agent.session += 1;
                // Tests read what a run handed its agent (the MCP endpoint and token).
                if let Ok(path) = std::env::var("SVC_DEMO_AGENT_RECORD") {
                    let line = format!(
                        "{}\n",
                        json!({"issueId": std::env::var("SVC_ISSUE_ID").unwrap_or_default(), "params": params})
                    );
                    let _ = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .and_then(|mut f| f.write_all(line.as_bytes()));
                }
                if let Some(cwd) = params.get("cwd").and_then(Value::as_str) {
                    agent.cwd = cwd.into();
                }
                agent.mcp =
                    params
                        .get("mcpServers")
                        .and_then(Value::as_array)
                        .and_then(|servers| {
                            servers
                                .iter()
                                .find(|s| s["type"] == "http")
                                .map(|s| McpServer {
                                    url: s["url"].as_str().unwrap_or_default().to_string(),
                                    headers: s["headers"]
                                        .as_array()
                                        .map(|h| {
                                            h.iter()
                                                .map(|h| {
                                                    (
                                                        h["name"]
                                                            .as_str()
                                                            .unwrap_or_default()
                                                            .to_string(),
                                                        h["value"]
                                                            .as_str()
                                                            .unwrap_or_default()
                                                            .to_string(),
                                                    )
                                                })
                                                .collect()
                                        })
                                        .unwrap_or_default(),
                                })
                        });
                agent.reply(
                    &id,
                    json!({"sessionId": format!("demo-{}-{}", std::process::id(), agent.session)}),
                );
            }
            ("session/prompt", Some(id)) => {
                let text = prompt_text(&params);
                agent.prompt(&id, &text);
            }
            (_, Some(id)) => agent.error(&id, -32601, &format!("Method not found: {method}")),
            (_, None) => {}
        }
    }
}

/// The text blocks of a `session/prompt`'s params, joined.
fn prompt_text(params: &Value) -> String {
    params
        .get("prompt")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Whether `m` is a `session/prompt` request (queued when it arrives during a turn).
fn is_prompt(m: &Value) -> bool {
    m.get("method").and_then(Value::as_str) == Some("session/prompt") && m.get("id").is_some()
}

fn directive<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        // A steering turn quotes what people wrote (`> demo: ...`).
        let line = l.trim();
        let line = line.strip_prefix('>').map_or(line, str::trim_start);
        let rest = line.strip_prefix("demo:")?.trim();
        let rest = rest.strip_prefix(name)?;
        (rest.is_empty() || rest.starts_with(' ')).then(|| rest.trim())
    })
}

impl Agent {
    fn send(&mut self, msg: Value) {
        let mut line = msg.to_string();
        line.push('\n');
        let mut out = self.out.lock();
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }

    fn reply(&mut self, id: &Value, result: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    fn error(&mut self, id: &Value, code: i64, message: &str) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}));
    }

    fn update(&mut self, update: Value) {
        let session = format!("demo-{}-{}", std::process::id(), self.session);
        self.send(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": update}}));
    }

    fn chunk(&mut self, kind: &str, text: &str) {
        self.update(json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}}));
    }

    /// Waits up to `d` for a `session/cancel`; true when one arrived.
    fn cancelled_within(&mut self, d: Duration) -> bool {
        let deadline = std::time::Instant::now() + d;
        loop {
            match self
                .rx
                .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            {
                Ok(m) if m.get("method").and_then(Value::as_str) == Some("session/cancel") => {
                    return true;
                }
                Ok(m) if is_prompt(&m) => self.queued.push_back(m),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => return false,
                Err(RecvTimeoutError::Disconnected) => std::process::exit(0),
            }
        }
    }

    /// Sends a request to the client and waits for its response (cancels are noted).
    fn ask(&mut self, method: &str, params: Value) -> (Option<Value>, bool) {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut cancelled = false;
        loop {
            let Ok(m) = self.rx.recv() else {
                std::process::exit(0)
            };
            if m.get("method").and_then(Value::as_str) == Some("session/cancel") {
                cancelled = true;
            } else if is_prompt(&m) {
                self.queued.push_back(m);
            } else if m.get("method").is_none() && m.get("id").and_then(Value::as_u64) == Some(id) {
                return (m.get("result").cloned(), cancelled);
            }
        }
    }

    fn prompt(&mut self, id: &Value, text: &str) {
        self.turns += 1;
        let turn = self.turns;
        if let Some(limited) = self.limit.as_ref().filter(|l| l.active()) {
            let words = limited.text.clone();
            match limited.how.as_str() {
                // An HTTP 429 passed through as the error's code, the wait in its data.
                "error429" => {
                    let error = json!({"code": 429, "message": words, "data": {"retry_after": 3}});
                    return self.send(json!({"jsonrpc": "2.0", "id": id, "error": error}));
                }
                // claude-agent-acp: the words in the message, the kind in data.
                "claude-error" => {
                    let error = json!({"code": -32603, "message": format!("Internal error: {words}"), "data": {"errorKind": "rate_limit"}});
                    return self.send(json!({"jsonrpc": "2.0", "id": id, "error": error}));
                }
                // codex-acp: the words in data.
                "codex-error" => {
                    let error = json!({"code": -32603, "message": "Internal error", "data": {"message": words, "codex_error_info": "usage_limit_exceeded"}});
                    return self.send(json!({"jsonrpc": "2.0", "id": id, "error": error}));
                }
                // The words as the turn's only message, and a clean end.
                "message" => {
                    self.chunk("agent_message_chunk", &words);
                    return self.reply(id, json!({"stopReason": "end_turn"}));
                }
                // Nothing at all, and a clean end (claude-agent-acp #146).
                _ => return self.reply(id, json!({"stopReason": "end_turn"})),
            }
        }
        if let Some(ms) = directive(text, "hold").and_then(|n| n.parse::<u64>().ok()) {
            self.hold = Some(ms);
        }
        if directive(text, "crash").is_some() {
            std::process::exit(3);
        }
        if directive(text, "stall").is_some() {
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        if directive(text, "fail").is_some() {
            return self.error(id, -32603, "demo agent was told to fail");
        }
        if let Some(n) = directive(text, "stderr").and_then(|n| n.parse::<usize>().ok()) {
            let mut err = io::stderr().lock();
            for i in 0..n {
                let _ = writeln!(err, "demo agent log line {i}");
            }
        }
        let identifier =
            std::env::var("SVC_ISSUE_IDENTIFIER").unwrap_or_else(|_| "the issue".into());
        self.chunk(
            "agent_thought_chunk",
            &format!("Reading {identifier} and planning turn {turn}."),
        );
        self.update(json!({"sessionUpdate": "plan", "entries": [
            {"content": "Read the issue", "priority": "high", "status": "completed"},
            {"content": "Write DEMO.md", "priority": "medium", "status": "in_progress"}
        ]}));
        self.chunk("agent_message_chunk", "Working on ");
        self.chunk("agent_message_chunk", &format!("{identifier} "));
        self.chunk("agent_message_chunk", &format!("(turn {turn})."));
        if let Some(said) = directive(text, "say") {
            let said = format!("\n\n{}\n\n", said.replace("\\n", "\n"));
            self.chunk("agent_message_chunk", &said);
        }
        if let Some(n) = directive(text, "flood").and_then(|n| n.parse::<usize>().ok()) {
            for i in 0..n {
                self.chunk("agent_message_chunk", &format!(" flood {i}"));
            }
        }
        if let Some((rate, secs)) = directive(text, "stream").and_then(|args| {
            let (rate, secs) = args.split_once(' ')?;
            Some((
                rate.trim().parse::<u64>().ok()?,
                secs.trim().parse::<u64>().ok()?,
            ))
        }) && rate > 0
        {
            let every = Duration::from_micros(1_000_000 / rate);
            let start = std::time::Instant::now();
            let metered = directive(text, "stream-cost").is_some();
            for i in 0..rate * secs {
                let due = start + every * i as u32;
                if self.cancelled_within(due.saturating_duration_since(std::time::Instant::now())) {
                    return self.reply(id, json!({"stopReason": "cancelled"}));
                }
                self.chunk("agent_message_chunk", &format!(" token {i}"));
                if metered && i % 10 == 9 {
                    self.spent += 0.0001;
                    let spent = (self.spent * 1e9).round() / 1e9;
                    self.update(json!({"sessionUpdate": "usage_update", "used": 1200 * turn, "size": 200_000,
                        "cost": {"amount": spent, "currency": "USD"}}));
                }
            }
        }
        if let Some((usd, ms)) = directive(text, "burn").and_then(|args| {
            let (usd, ms) = args.split_once(' ')?;
            Some((
                usd.trim().parse::<f64>().ok()?,
                ms.trim().parse::<u64>().ok()?,
            ))
        }) {
            let steps = (ms / 100).max(1);
            for _ in 0..steps {
                if self.cancelled_within(Duration::from_millis(100)) {
                    return self.reply(id, json!({"stopReason": "cancelled"}));
                }
                self.spent += usd / steps as f64;
                let spent = (self.spent * 1e9).round() / 1e9;
                self.update(
                    json!({"sessionUpdate": "usage_update", "used": 1200 * turn, "size": 200_000,
                    "cost": {"amount": spent, "currency": "USD"}}),
                );
            }
        }
        if let Some((usd, tokens, ms)) = directive(text, "report").and_then(|args| {
            let mut args = args.split_whitespace();
            let usd = args.next()?.parse::<f64>().ok();
            let tokens = args.next()?.parse::<u64>().ok();
            Some((usd, tokens, args.next()?.parse::<u64>().ok()?))
        }) {
            let base = self.spent;
            for part in [0.5, 1.0] {
                let mut update = json!({"sessionUpdate": "usage_update", "size": 10_000_000});
                if let Some(tokens) = tokens {
                    update["used"] = json!((tokens as f64 * part) as u64);
                }
                if let Some(usd) = usd {
                    self.spent = base + usd * part;
                    let spent = (self.spent * 1e9).round() / 1e9;
                    update["cost"] = json!({"amount": spent, "currency": "USD"});
                }
                self.update(update);
            }
            if self.cancelled_within(Duration::from_millis(ms)) {
                return self.reply(id, json!({"stopReason": "cancelled"}));
            }
        }
        let call_id = format!("call-{turn}");
        self.update(json!({"sessionUpdate": "tool_call", "toolCallId": call_id, "title": "Write DEMO.md", "kind": "edit", "status": "pending",
            "locations": [{"path": self.cwd.join("DEMO.md")}]}));
        let options = if directive(text, "deny").is_some() {
            json!([{"optionId": "no", "name": "Reject", "kind": "reject_once"}])
        } else {
            json!([{"optionId": "yes-once", "name": "Allow", "kind": "allow_once"}, {"optionId": "no", "name": "Reject", "kind": "reject_once"}])
        };
        let session = format!("demo-{}-{}", std::process::id(), self.session);
        let (answer, mut cancelled) = self.ask(
            "session/request_permission",
            json!({"sessionId": session, "toolCall": {"toolCallId": call_id, "title": "Write DEMO.md", "kind": "edit"}, "options": options}),
        );
        let selected = answer
            .as_ref()
            .and_then(|a| a.pointer("/outcome/optionId"))
            .and_then(Value::as_str)
            .map(str::to_string);
        match selected.as_deref() {
            Some(opt) if opt.starts_with("yes") => {
                let path = self.cwd.join("DEMO.md");
                let line = format!("turn {turn} of {identifier}\n");
                let ok = std::fs::OpenOptions::new().create(true).append(true).open(&path).and_then(|mut f| f.write_all(line.as_bytes()));
                let status = if ok.is_ok() { "completed" } else { "failed" };
                self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status,
                    "content": [{"type": "diff", "path": path, "oldText": null, "newText": line}]}));
            }
            _ => self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "failed"})),
        }
        if let Some(ms) = directive(text, "slow")
            .and_then(|n| n.parse::<u64>().ok())
            .or(self.hold)
        {
            cancelled |= self.cancelled_within(Duration::from_millis(ms));
        }
        if cancelled {
            return self.reply(id, json!({"stopReason": "cancelled"}));
        }
        let cost = match directive(text, "cost").map(str::split_whitespace) {
            Some(mut args) => match args.next() {
                Some("none") => None,
                amount => Some((
                    amount.and_then(|a| a.parse::<f64>().ok()).unwrap_or(0.006),
                    args.next().unwrap_or("USD").to_string(),
                )),
            },
            None => Some((0.006, "USD".to_string())),
        };
        match cost {
            Some((amount, currency)) => {
                self.spent += amount;
                let spent = (self.spent * 1e9).round() / 1e9;
                self.update(
                    json!({"sessionUpdate": "usage_update", "used": 1200 * turn, "size": 200_000,
                    "cost": {"amount": spent, "currency": currency}}),
                );
            }
            None => self.update(
                json!({"sessionUpdate": "usage_update", "used": 1200 * turn, "size": 200_000}),
            ),
        }
        if directive(text, "keep-open").is_none()
            && self.hold.is_none()
            && let Some(mcp) = self.mcp.take()
        {
            let issue_id = std::env::var("SVC_ISSUE_ID").unwrap_or_default();
            let call_id = format!("mcp-{turn}");
            self.update(json!({"sessionUpdate": "tool_call", "toolCallId": call_id, "title": "Complete the issue through MCP", "kind": "other", "status": "in_progress"}));
            let finish = directive(text, "finish").unwrap_or("Done").to_string();
            let outcome = mcp.complete(&issue_id, turn, &finish);
            let (status, text) = match &outcome {
                Ok(Some(tool)) => (
                    "completed",
                    format!(" Commented on {identifier} and moved it to {finish} ({tool})."),
                ),
                Ok(None) => (
                    "completed",
                    " The tracker offers no status tool; leaving the issue as it is.".to_string(),
                ),
                Err(e) => ("failed", format!(" Could not complete {identifier}: {e}")),
            };
            self.mcp = Some(mcp);
            self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status}));
            self.chunk("agent_message_chunk", &text);
        }
        self.chunk("agent_message_chunk", " Done.");
        let (input, output) = directive(text, "usage")
            .and_then(|args| {
                let (i, o) = args.split_once(' ')?;
                Some((i.trim().parse::<u64>().ok()?, o.trim().parse::<u64>().ok()?))
            })
            .unwrap_or((1000, 200));
        self.reply(id, json!({"stopReason": "end_turn", "usage": {"inputTokens": input, "outputTokens": output, "totalTokens": input.saturating_add(output)}}));
    }
}
