//! One agent run, on its own thread: workspace and hooks, the bridge, the ACP session and the
//! turn loop. It reports to the state thread with [`RunMsg`]s and obeys [`Control`] messages; it
//! never touches orchestration state.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, select};
use serde_json::{Value, json};

use super::acp::{Connection, is_call};
use super::launch;
use super::limit;
use super::pipes::Incoming;
use super::updates::{Updates, now_rfc3339};
use crate::agent::cost::{Meter, TurnTokens, turn_cost_json};
use crate::config::prompt::Template;
use crate::config::{AgentRecord, Isolation, Settings};
use crate::env::Env;
use crate::hooks::{self, Hook, HookRun};
use crate::orchestrator::protocol::{
    Claim, ClaimGate, Event, Limit, RunEnd, RunMsg, RunSpec, Running, StopReason, Tokens,
};
use crate::steering::{self, Message};
use crate::trace::TraceSink;
use crate::tracker::{Issue, Tracker};
use crate::workers::service::{AcquireError, Lease};
use crate::workspace;

/// How long `initialize` and `session/new` may take.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a cancelled turn may take to end before the bridge is killed.
const CANCEL_GRACE: Duration = Duration::from_secs(5);
/// How long a run waits at a turn's end for the state thread to hold the turn's usage against
/// the budgets ([`Control::TurnChecked`]) before it goes on without the answer.
const TURN_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Messages from the state thread to a run.
#[derive(Debug)]
pub enum Control {
    Cancel(StopReason),
    /// End after the current turn (the day's budget is reached): no turn after it.
    LastTurn,
    /// Steering messages for the agent's next turn.
    Steer(Vec<crate::steering::Message>),
    /// The usage of the turn that ended (its number) was held against the budgets: any
    /// `LastTurn` or `Cancel` it called for came first.
    TurnChecked(u32),
}

/// The svc MCP endpoint handed to agents in `session/new`.
#[derive(Clone, Debug)]
pub struct McpEndpoint {
    pub url: String,
    pub token: String,
}

/// What a run thread is given besides its spec.
pub struct RunContext {
    pub events: Sender<Event>,
    pub control: Receiver<Control>,
    pub tracker: Arc<dyn Tracker>,
    pub trace: TraceSink,
    pub mcp: Option<McpEndpoint>,
    pub env: Arc<Env>,
    /// Where the run acquires its slot (none in unit tests of the run alone).
    pub pool: Option<crate::workers::service::PoolHandle>,
    /// The MCP endpoint of runs on remote workers.
    pub remote_mcp: Option<RemoteMcp>,
    /// The claim store, where the run claims its slot before anything starts.
    pub gate: Arc<dyn ClaimGate>,
    /// Whether an issue, as the tracker has it after a turn, is still to be worked (active
    /// and routable): the dispatch rule, handed in.
    pub dispatchable: fn(&Issue, &Settings) -> bool,
}

impl RunContext {
    fn send(&self, run_id: &str, msg: RunMsg) {
        // The state thread outlives every run; a closed channel means it already exited.
        let _ = self.events.send(Event::Run {
            run_id: run_id.to_string(),
            msg,
        });
    }
}

/// Runs to the end and reports `Exited` last.
pub fn run(spec: RunSpec, ctx: RunContext) {
    // Nothing of the run happens before its slot is claimed in the store.
    let record = Running::new(&spec, 0, crate::time::unix_ms());
    let mut token = None;
    let daily = spec.settings.agent.budgets.daily_budget_usd;
    let refused = match ctx
        .gate
        .acquire(&record.key(), &record, spec.seen_at, daily)
    {
        Ok(t) => {
            token = Some(t);
            ctx.send(&spec.run_id, RunMsg::Claimed { token: t });
            None
        }
        Err(Claim::Held(owner)) => Some(RunEnd::HeldElsewhere(format!(
            "daemon {owner} holds this slot"
        ))),
        Err(Claim::Superseded(owner)) => Some(RunEnd::Superseded(format!(
            "daemon {owner} ran this slot and let it go since the tracker was read"
        ))),
        // Never started; the next dispatch is held by the day's budget.
        Err(Claim::Budget(day)) => Some(RunEnd::BudgetRefused(format!(
            "the day's budget is reached (${} of agent.daily_budget_usd ${} spent, every daemon's)",
            crate::orchestrator::protocol::round_usd(day.spent),
            day.budget
        ))),
        // Without the store nothing proves the slot is free: not started, retried later.
        Err(Claim::Failed(e)) => Some(RunEnd::Failed(format!(
            "{e}; the slot could not be claimed"
        ))),
    };
    if let Some(end) = refused {
        log::info!(
            "[{}] run {} not started: {end:?}",
            spec.slot.issue.identifier,
            spec.run_id
        );
        ctx.send(&spec.run_id, RunMsg::Exited(end));
        return;
    }
    let mut run = Run::new(&spec, &ctx);
    run.claim_token = token;
    let end = run.execute();
    if let RunEnd::Failed(e) = &end {
        log::warn!(
            "[{}] run {} failed: {e}",
            spec.slot.issue.identifier,
            spec.run_id
        );
    } else if let RunEnd::RateLimited(limit) = &end {
        log::warn!(
            "[{}] run {} met a rate limit of {}: {}",
            spec.slot.issue.identifier,
            spec.run_id,
            spec.agent_kind,
            limit.reason
        );
    } else {
        log::info!("[{}] run {} ended", spec.slot.issue.identifier, spec.run_id);
    }
    ctx.send(&spec.run_id, RunMsg::Exited(end));
}

/// Why waiting for a response ended without one.
enum WaitError {
    Timeout,
    Canceled(StopReason),
    Closed,
    /// The error's text, and the error as the bridge sent it.
    Rpc(String, Value),
    Io(String),
}

/// Where a remote run's workspace is: the worker, the root there and the directory name; and
/// how its agent reaches the MCP endpoint (a per-run claim through the host's tunnel).
struct Remote {
    target: crate::workers::ssh::Target,
    root: String,
    name: String,
    mcp: Option<McpEndpoint>,
    /// Held while the run lives: the tunnel reference and the claim (settled when dropped).
    _tunnel: Option<crate::workers::tunnel::TunnelLease>,
    _run_token: Option<RunTokenGuard>,
}

/// What a remote run's agent uses to reach MCP, and what keeps it valid.
struct RemoteEndpoint {
    mcp: Option<McpEndpoint>,
    tunnel: Option<crate::workers::tunnel::TunnelLease>,
    run_token: Option<RunTokenGuard>,
}

/// Settles a run's MCP token (the spec's per-run claim) when the run ends, however it ends.
struct RunTokenGuard {
    server: Arc<crate::mcp::server::McpServer>,
    run_key: String,
    generation: u64,
}

impl Drop for RunTokenGuard {
    fn drop(&mut self) {
        self.server
            .run_tokens
            .settle(&self.run_key, self.generation);
    }
}

/// What remote runs need for their agents' MCP endpoint.
#[derive(Clone)]
pub struct RemoteMcp {
    pub server: Arc<crate::mcp::server::McpServer>,
    /// `server.mcp_port`: the loopback listener of per-run claims; `None` without it.
    pub mcp_port: Option<u16>,
    /// Whether the dashboard's server (Token A only) is up: without `mcp_port` a remote run
    /// refuses to attach to it.
    pub dashboard: bool,
    pub tunnels: Arc<crate::workers::tunnel::Tunnels>,
}

impl Remote {
    fn path(&self) -> String {
        format!("{}/{}", self.root, self.name)
    }
}

struct Run<'a> {
    spec: &'a RunSpec,
    ctx: &'a RunContext,
    /// The fencing token of the run's claim: its steering marks land only while it stands.
    claim_token: Option<u64>,
    record: AgentRecord,
    /// Set once a slot on an SSH worker is leased: everything executes there.
    remote: Option<Remote>,
    hook_env: Vec<(String, String)>,
    canceled: Option<StopReason>,
    /// Asked to end after the current turn ([`Control::LastTurn`]).
    last_turn: bool,
    session_id: String,
    turn: u32,
    /// Shared with the bridge's stdout reader, which handles agent updates.
    updates: Arc<std::sync::Mutex<Updates>>,
    /// Woken when the reader held a report back ([`Updates::due`]).
    held: Receiver<()>,
    /// Steering messages received and not yet sent to the agent, oldest first.
    steer_inbox: Vec<Message>,
    /// Messages taken for a prompt not yet written (see `Run::take_steering`).
    steer_in_flight: Vec<Message>,
    /// Steering turns sent to the agent (at most `agent.max_turns` a run).
    steering_turns: u32,
    /// A steering prompt sent while a turn was executing (the agent queues it): its request
    /// id; the next turn waits for its answer instead of sending a prompt.
    queued_prompt: Option<u64>,
    /// Responses that came for a request other than the one awaited (a queued prompt).
    early: Vec<(u64, Value)>,
}

impl<'a> Run<'a> {
    fn new(spec: &'a RunSpec, ctx: &'a RunContext) -> Run<'a> {
        let (_, agents) = spec.settings.agent_for_state(&spec.slot.issue.state);
        let record = agents
            .kinds
            .get(&spec.agent_kind)
            .cloned()
            .unwrap_or_else(|| agents.kinds["agent_a"].clone());
        let hook_env = vec![
            ("SVC_ISSUE_ID".to_string(), spec.slot.issue.id.clone()),
            (
                "SVC_ISSUE_IDENTIFIER".to_string(),
                spec.slot.issue.identifier.clone(),
            ),
            ("SVC_RUN_ID".to_string(), spec.run_id.clone()),
            (
                "SVC_WORKSPACE".to_string(),
                spec.slot.workspace_path.display().to_string(),
            ),
        ];
        let meter = Meter::new(record.pricing, record.usage_accounting);
        let (nudge, held) = crossbeam_channel::bounded(1);
        Run {
            spec,
            ctx,
            claim_token: None,
            record,
            remote: None,
            hook_env,
            canceled: None,
            last_turn: false,
            session_id: String::new(),
            turn: 0,
            updates: Arc::new(std::sync::Mutex::new(Updates {
                trace: ctx.trace.clone(),
                events: ctx.events.clone(),
                run_id: spec.run_id.clone(),
                issue_id: spec.slot.issue.id.clone(),
                identifier: spec.slot.issue.identifier.clone(),
                session_id: String::new(),
                turn: 0,
                turn_context_tokens: None,
                meter,
                usage_sent_at: None,
                usage_pending: false,
                nudge,
                absurd_said: false,
                message: String::new(),
                turn_output: 0,
                turn_text: String::new(),
                last_activity_sent: None,
                pending_activity: None,
            })),
            held,
            steer_inbox: spec.steering.clone(),
            steer_in_flight: Vec::new(),
            steering_turns: 0,
            queued_prompt: None,
            early: Vec::new(),
        }
    }

    /// Sends the waiting steering at once as a queued `session/prompt`, when the agent takes
    /// those (`queue_prompts`) and none is queued yet; the agent runs it after its current turn.
    fn queue_steering(&mut self, conn: &mut Connection) {
        if !self.record.queue_prompts || self.queued_prompt.is_some() {
            return;
        }
        let Some(text) = self.take_steering() else {
            return;
        };
        match conn.request(
            "session/prompt",
            json!({"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]}),
        ) {
            Ok(id) => {
                self.queued_prompt = Some(id);
                self.steering_sent();
            }
            Err(e) => {
                self.steering_unsent();
                log::warn!(
                    "[{}] steering could not be sent to the bridge: {e}",
                    self.spec.slot.issue.identifier
                )
            }
        }
    }

    /// The steering budget: `agent.max_turns` steering turns a run.
    fn steering_budget(&self) -> u32 {
        let (agent, _) = self
            .spec
            .settings
            .agent_for_state(&self.spec.slot.issue.state);
        agent.max_turns as u32
    }

    /// Says that the waiting messages wait for the next run (this run's budget is spent).
    fn defer_steering(&self) {
        self.send(RunMsg::Notice {
            event: "steering_deferred".into(),
            message: format!(
                "{} message(s) wait for the next run: this run has had its {} steering turn(s)",
                self.steer_inbox.len(),
                self.steering_budget()
            ),
        });
    }

    /// Takes the waiting steering messages for one turn when the budget allows, reports them
    /// delivered (in the claim store itself, then to the state thread), and returns the turn's
    /// text. They are in flight until [`Run::steering_sent`]
    /// (the prompt was written: traced) or [`Run::steering_unsent`] (it was not: they wait
    /// again, and the state thread hears so). Reported before the write, a message is never
    /// delivered twice after a crash; taken back after a failed write, it is never lost. Past
    /// the budget they stay for the next run (the state thread queues what a run did not
    /// deliver).
    fn take_steering(&mut self) -> Option<String> {
        if self.steer_inbox.is_empty() {
            return None;
        }
        if self.steering_turns >= self.steering_budget() {
            self.defer_steering();
            return None;
        }
        let messages = std::mem::take(&mut self.steer_inbox);
        self.steering_turns += 1;
        let keys: Vec<String> = messages.iter().map(Message::unique_key).collect();
        self.ctx.gate.delivered(&keys, self.claim_token);
        self.send(RunMsg::Steered { keys });
        let text = steering::prompt_text(&self.spec.slot.issue.identifier, &messages);
        self.steer_in_flight = messages;
        Some(text)
    }

    /// The prompt carrying the messages in flight was written to the bridge: each is traced
    /// as a `user_message`.
    fn steering_sent(&mut self) {
        let messages = std::mem::take(&mut self.steer_in_flight);
        for m in &messages {
            self.trace(
                "user_message",
                json!({"source": m.source, "author": m.author, "text": m.text, "writtenAt": m.at, "key": m.key, "steeringTurn": self.steering_turns}),
            );
        }
    }

    /// The prompt carrying the messages in flight could not be written: they wait again,
    /// ahead of newer ones (and go back to the state thread's queue if the run ends).
    fn steering_unsent(&mut self) {
        let mut messages = std::mem::take(&mut self.steer_in_flight);
        if messages.is_empty() {
            return;
        }
        self.steering_turns = self.steering_turns.saturating_sub(1);
        self.ctx.gate.undelivered(&messages, self.claim_token);
        self.send(RunMsg::Unsteered {
            messages: messages.clone(),
        });
        messages.append(&mut self.steer_inbox);
        self.steer_inbox = messages;
    }

    /// A control message that is not a cancel: steering joins the inbox.
    fn on_control(&mut self, ctl: Control) {
        match ctl {
            Control::Cancel(reason) => {
                if self.canceled.is_none() {
                    self.canceled = Some(reason);
                }
            }
            Control::Steer(messages) => self.steer_inbox.extend(messages),
            Control::LastTurn => self.last_turn = true,
            // The answer to a check given up on (see `Run::turn_checked`).
            Control::TurnChecked(_) => {}
        }
    }

    fn trace(&self, kind: &str, mut fields: Value) {
        if let Some(obj) = fields.as_object_mut() {
            obj.insert("type".into(), kind.into());
            obj.insert("at".into(), now_rfc3339().into());
            obj.insert("runId".into(), self.spec.run_id.clone().into());
            obj.insert("issueId".into(), self.spec.slot.issue.id.clone().into());
            obj.insert(
                "identifier".into(),
                self.spec.slot.issue.identifier.clone().into(),
            );
        }
        self.ctx.trace.record(&self.spec.slot.issue.id, &fields);
    }

    fn send(&self, msg: RunMsg) {
        self.ctx.send(&self.spec.run_id, msg);
    }

    fn hook(&self, hook: Hook) -> Result<(), String> {
        let s = &self.spec.settings;
        let script = match hook {
            Hook::AfterCreate => &s.hooks.after_create,
            Hook::BeforeRun => &s.hooks.before_run,
            Hook::AfterRun => &s.hooks.after_run,
            Hook::BeforeRemove => &s.hooks.before_remove,
        };
        let Some(script) = script else { return Ok(()) };
        let timeout = Duration::from_millis(s.hooks.timeout_ms);
        let result = match &self.remote {
            Some(r) => hooks::run_remote(
                hook,
                script,
                &r.target,
                &r.root,
                &r.name,
                timeout,
                &self.hook_env,
            ),
            None => hooks::run(&HookRun {
                hook,
                script,
                workspace_root: &s.workspace.root,
                workspace: &self.spec.slot.workspace_path,
                timeout,
                env: &self.hook_env,
            }),
        };
        self.trace(
            "hook",
            json!({"hook": hook.name(), "ok": result.is_ok(), "error": result.as_ref().err()}),
        );
        if let Err(e) = &result {
            self.send(RunMsg::Notice {
                event: "hook_failed".into(),
                message: e.clone(),
            });
        }
        result
    }

    /// Acquires a slot on the worker pool (the run is reserving meanwhile). `Ok(None)` without
    /// a pool.
    fn acquire(&mut self) -> Result<Option<Lease>, RunEnd> {
        let Some(pool) = self.ctx.pool.clone() else {
            return Ok(None);
        };
        self.send(RunMsg::Reserving);
        let affinity = self.spec.affinity.clone();
        let mut kept = Vec::new();
        let acquired = pool.acquire_keeping(
            &self.spec.slot.issue.id,
            affinity,
            &self.ctx.control,
            |c| matches!(c, Control::Cancel(_)),
            &mut kept,
        );
        for ctl in kept {
            self.on_control(ctl);
        }
        match acquired {
            Ok(lease) => {
                self.send(RunMsg::Leased {
                    worker_id: lease.worker_id.clone(),
                    host: lease.host.clone(),
                    ssh: lease.ssh.then(|| lease.ssh_options.clone()),
                });
                self.trace(
                    "worker_leased",
                    json!({"workerId": lease.worker_id, "workerHost": lease.host}),
                );
                Ok(Some(lease))
            }
            Err(AcquireError::Denied(reason)) => {
                Err(RunEnd::Failed(format!("no worker slot: {reason}")))
            }
            Err(AcquireError::Interrupted(Control::Cancel(reason))) => {
                self.canceled = Some(reason.clone());
                Err(RunEnd::Failed(format!("canceled: {reason}")))
            }
            Err(AcquireError::Interrupted(
                Control::Steer(_) | Control::LastTurn | Control::TurnChecked(_),
            )) => {
                unreachable!("only a cancel interrupts an acquire")
            }
        }
    }

    fn execute(&mut self) -> RunEnd {
        // The slot is held until the run settles (the lease releases itself when dropped).
        let lease = match self.acquire() {
            Ok(lease) => lease,
            Err(end) => return end,
        };
        if let Some(l) = lease.as_ref().filter(|l| l.ssh)
            && let Some(host) = l.host.clone()
        {
            return self.execute_remote(host, l.ssh_options.clone(), l.id);
        }
        let s = Arc::clone(&self.spec.settings);
        let ws = &self.spec.slot.workspace_path;
        // Workspace and the hooks before the agent.
        let created = match workspace::ensure(&s.workspace.root, ws) {
            Ok(c) => c,
            Err(e) => return RunEnd::Failed(e.to_string()),
        };
        if created
            && s.workspace.isolation == Isolation::PerAgent
            && let Err(e) = self.hook(Hook::AfterCreate)
        {
            let _ = workspace::remove(&s.workspace.root, ws);
            return RunEnd::Failed(e);
        }
        let (agent, _) = s.agent_for_state(&self.spec.slot.issue.state);
        if let Err(e) = workspace::overlay_skills(
            ws,
            &agent.skills,
            s.workflow_path.parent().unwrap_or(Path::new("/")),
        ) {
            return RunEnd::Failed(e.to_string());
        }
        self.run_agent()
    }

    /// Once the workspace is ready, wherever it is: `before_run`, the agent's session and
    /// `after_run`.
    fn run_agent(&mut self) -> RunEnd {
        if let Some(reason) = self.poll_cancel() {
            return RunEnd::Failed(format!("canceled: {reason}"));
        }
        if let Err(e) = self.hook(Hook::BeforeRun) {
            return RunEnd::Failed(e);
        }
        let end = self.agent_session();
        // after_run is best effort: its failure does not change the outcome.
        let _ = self.hook(Hook::AfterRun);
        end
    }

    /// The same steps on an SSH worker: workspace, hooks and the bridge all execute there.
    /// The MCP endpoint of a remote run's agent: a per-run claim on `server.mcp_port`, reached
    /// through the host's reverse tunnel.
    fn remote_endpoint(
        &mut self,
        target: &crate::workers::ssh::Target,
        generation: u64,
    ) -> Result<RemoteEndpoint, String> {
        let none = || RemoteEndpoint {
            mcp: None,
            tunnel: None,
            run_token: None,
        };
        let Some(rm) = self.ctx.remote_mcp.clone() else {
            return Ok(none());
        };
        let Some(port) = rm.mcp_port else {
            if rm.dashboard {
                self.send(RunMsg::Notice {
                    event: "remote_mcp_refused".into(),
                    message: format!(
                        "{} runs on {}: a remote per-run endpoint refuses to attach to the dashboard's port (settings-scoped tokens only); set server.mcp_port to give remote agents their tools",
                        self.spec.slot.issue.identifier, target.host
                    ),
                });
            }
            return Ok(none());
        };
        let s = &self.spec.settings;
        let cap = s
            .worker
            .worker_pool
            .as_ref()
            .and_then(|p| p.max_concurrent_tunnels);
        let tunnel = rm.tunnels.acquire(target, port, cap)?;
        let tools = crate::mcp::packs::mount(s)
            .map(|m| m.specs().iter().map(|t| t.name.to_string()).collect())
            .unwrap_or_default();
        let (_, agents) = s.agent_for_state(&self.spec.slot.issue.state);
        // A coarse cap: every turn at its deadline, at most a day.
        let lifetime = Duration::from_millis(
            self.record
                .turn_timeout_ms
                .saturating_mul(s.agent.max_turns.max(1))
                .saturating_add(agents.stall_timeout_ms)
                .min(86_400_000),
        );
        // The run key: the issue, and its slot in ensemble mode (slots must not supersede
        // each other's claims).
        let run_key = if self.spec.slot.ensemble_size > 1 {
            format!("{}#{}", self.spec.slot.issue.id, self.spec.slot.slot_index)
        } else {
            self.spec.slot.issue.id.clone()
        };
        let token = rm.server.run_tokens.mint(
            &run_key,
            &self.spec.run_id,
            &target.host,
            generation,
            lifetime,
            tools,
        );
        let endpoint = McpEndpoint {
            url: format!("http://127.0.0.1:{}/mcp", tunnel.remote_port),
            token,
        };
        let guard = RunTokenGuard {
            server: Arc::clone(&rm.server),
            run_key,
            generation,
        };
        Ok(RemoteEndpoint {
            mcp: Some(endpoint),
            tunnel: Some(tunnel),
            run_token: Some(guard),
        })
    }

    fn execute_remote(&mut self, host: String, options: Vec<String>, generation: u64) -> RunEnd {
        use crate::workers::ssh;
        let s = Arc::clone(&self.spec.settings);
        let target = ssh::Target {
            host,
            config: s.worker.ssh_config.clone(),
            timeout: Duration::from_millis(s.worker.ssh_timeout_ms),
            options,
        };
        let root = match ssh::remote_root(&target, s.workspace.root_setting.as_deref()) {
            Ok(r) => r,
            Err(e) => return RunEnd::Failed(e),
        };
        let name = workspace::slot_dir_name(
            &self.spec.slot.issue.identifier,
            self.spec.slot.slot_index,
            self.spec.slot.ensemble_size,
        );
        let name = if s.workspace.isolation == Isolation::None {
            "shared".to_string()
        } else {
            name
        };
        let endpoint = match self.remote_endpoint(&target, generation) {
            Ok(e) => e,
            Err(e) => return RunEnd::Failed(e),
        };
        let remote = Remote {
            target,
            root,
            name,
            mcp: endpoint.mcp,
            _tunnel: endpoint.tunnel,
            _run_token: endpoint.run_token,
        };
        self.send(RunMsg::Workspace(PathBuf::from(remote.path())));
        for (k, v) in self.hook_env.iter_mut() {
            if k == "SVC_WORKSPACE" {
                *v = remote.path();
            }
        }
        let created = match ssh::ensure_workspace(&remote.target, &remote.root, &remote.name) {
            Ok(c) => c,
            Err(e) => return RunEnd::Failed(e),
        };
        self.remote = Some(remote);
        if created
            && s.workspace.isolation == Isolation::PerAgent
            && let Err(e) = self.hook(Hook::AfterCreate)
        {
            if let Some(r) = &self.remote {
                let _ = ssh::remove_workspace(&r.target, &r.root, &r.name);
            }
            return RunEnd::Failed(e);
        }
        let (agent, _) = s.agent_for_state(&self.spec.slot.issue.state);
        if !agent.skills.is_empty() {
            return RunEnd::Failed(
                "agent.skills cannot be overlaid on a remote worker in this build of svc; remove them or run locally".into(),
            );
        }
        self.run_agent()
    }

    fn poll_cancel(&mut self) -> Option<StopReason> {
        while let Ok(ctl) = self.ctx.control.try_recv() {
            self.on_control(ctl);
        }
        self.canceled.clone()
    }

    fn agent_session(&mut self) -> RunEnd {
        let prepared = match &self.remote {
            Some(r) => launch::prepare_remote(&self.record, &self.hook_env).map(|remote| {
                let argv: Vec<&str> = remote.argv.iter().map(String::as_str).collect();
                let command = crate::workers::ssh::in_workspace(
                    &r.root,
                    &r.name,
                    &format!("exec {}", crate::workers::ssh::with_env(&remote.env, &argv)),
                );
                launch::Launch {
                    spec: crate::workers::ssh::bridge_spec(&r.target, &command),
                    session_meta: remote.session_meta,
                }
            }),
            None => launch::prepare(
                &self.record,
                &self.spec.slot.workspace_path,
                &self.ctx.env,
                &self.hook_env,
                &self.spec.settings.credential_vars,
            ),
        };
        let launch = match prepared {
            Ok(l) => l,
            Err(e) => return RunEnd::Failed(e),
        };
        let updates = Arc::clone(&self.updates);
        let handler: super::pipes::Handler = Box::new(move |line: &str| {
            let Some(update) = super::acp::session_update(line) else {
                return false;
            };
            if let Some(update) = update {
                updates
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .on_update(&update);
            }
            true
        });
        let mut conn = match Connection::spawn(&launch.spec, Some(handler)) {
            Ok(c) => c,
            Err(e) => {
                return RunEnd::Failed(format!(
                    "cannot start bridge {}: {e}",
                    self.record.bridge_command
                ));
            }
        };
        self.trace("process_started", json!({"pid": conn.pid()}));
        self.send(RunMsg::Started {
            pid: Some(conn.pid()),
        });
        log::info!(
            "[{}] run {} started {} (pid {})",
            self.spec.slot.issue.identifier,
            self.spec.run_id,
            self.record.bridge_command,
            conn.pid()
        );
        let end = self.session(&mut conn, launch.session_meta);
        let how = if matches!(end, RunEnd::Clean) {
            conn.shut_down(Duration::from_millis(2000))
        } else {
            conn.kill()
        };
        self.trace("process_exit", json!({"status": how}));
        end
    }

    fn session(&mut self, conn: &mut Connection, session_meta: Option<Value>) -> RunEnd {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let init = json!({
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false},
            "clientInfo": {"name": "svc", "version": env!("CARGO_PKG_VERSION")}
        });
        let init_result = match self.call(conn, "initialize", init, deadline) {
            Ok(r) => r,
            Err(e) => return self.fail(conn, "initialize", e),
        };
        let http_mcp = init_result
            .pointer("/agentCapabilities/mcpCapabilities/http")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut mcp_servers = Vec::new();
        let mcp = match &self.remote {
            Some(r) => r.mcp.clone(),
            None => self.ctx.mcp.clone(),
        };
        if let Some(mcp) = &mcp {
            if http_mcp {
                mcp_servers.push(json!({
                    "type": "http",
                    "name": launch::mcp_server_name(&self.record.kind),
                    "url": mcp.url,
                    "headers": [{"name": "Authorization", "value": format!("Bearer {}", mcp.token)}]
                }));
            } else {
                self.send(RunMsg::Notice {
                    event: "mcp_unsupported".into(),
                    message: format!(
                        "{} does not accept HTTP MCP servers; the agent gets no tracker tools",
                        self.record.bridge_command
                    ),
                });
            }
        }
        let cwd = match &self.remote {
            Some(r) => r.path(),
            None => self.spec.slot.workspace_path.display().to_string(),
        };
        let mut params = json!({"cwd": cwd, "mcpServers": mcp_servers});
        if let Some(meta) = session_meta {
            params["_meta"] = meta;
        }
        let new = match self.call(conn, "session/new", params, deadline) {
            Ok(r) => r,
            Err(e) => return self.fail(conn, "session/new", e),
        };
        let Some(session_id) = new.get("sessionId").and_then(Value::as_str) else {
            return RunEnd::Failed("session/new returned no sessionId".into());
        };
        self.session_id = session_id.to_string();
        self.updates().session_id = self.session_id.clone();
        self.trace(
            "session_started",
            json!({"sessionId": session_id, "agentKind": self.record.kind, "pid": conn.pid()}),
        );

        let template = match Template::parse(&self.spec.settings.prompt_template) {
            Ok(t) => t,
            Err(e) => return RunEnd::Failed(format!("prompt template: {e}")),
        };
        let (agent, _) = self
            .spec
            .settings
            .agent_for_state(&self.spec.slot.issue.state);
        let max_turns = agent.max_turns as u32;
        let mut issue = self.spec.slot.issue.clone();
        // Turns from the workflow's prompt or the continuation prompt; steering turns are
        // counted apart (`steering_turns`).
        let mut autonomous = 0u32;
        loop {
            self.turn += 1;
            self.updates().turn = self.turn;
            self.send(RunMsg::TurnStarted { turn: self.turn });
            self.send(RunMsg::Session {
                session_id: format!("{}-{}", self.session_id, self.turn),
            });
            self.poll_cancel();
            // A steering prompt the agent queued during the last turn is this turn: wait for
            // its answer. Otherwise the first turn is the workflow's prompt (with the messages
            // that waited for this run), then steering before the continuation prompt.
            let queued = self.queued_prompt.take();
            let steering_before = self.steering_turns;
            let text = if queued.is_some() {
                None
            } else if self.turn == 1 {
                autonomous += 1;
                let previous = self.spec.previous_attempt.as_ref().map(|p| {
                    json!({"kind": p.kind, "reason": p.reason, "at": crate::time::rfc3339(p.at)})
                });
                let mut text = match template.render_after(
                    &issue,
                    self.spec.attempt,
                    (self.spec.slot.slot_index, self.spec.slot.ensemble_size),
                    previous,
                ) {
                    Ok(t) => t,
                    Err(e) => return RunEnd::Failed(format!("prompt template: {e}")),
                };
                if let Some(steer) = self.take_steering() {
                    text.push_str("\n\n");
                    text.push_str(&steer);
                }
                Some(text)
            } else if let Some(steer) = self.take_steering() {
                Some(steer)
            } else {
                autonomous += 1;
                Some(continuation_prompt(
                    &issue.identifier,
                    &issue.title,
                    &issue.state,
                    autonomous,
                    max_turns,
                ))
            };
            let steering_turn = queued.is_some() || self.steering_turns > steering_before;
            self.trace(
                "turn_started",
                json!({"turn": self.turn, "steering": steering_turn}),
            );
            let turn_deadline = Instant::now() + Duration::from_millis(self.record.turn_timeout_ms);
            let cost_before = {
                let mut updates = self.updates();
                updates.turn_context_tokens = None;
                updates.turn_output = 0;
                updates.turn_text.clear();
                updates
                    .meter
                    .cost()
                    .map(|c| (c.amount, c.currency.to_string()))
            };
            let sent = match (queued, text) {
                (Some(id), _) => Ok(id),
                (None, text) => conn
                    .request(
                        "session/prompt",
                        json!({"sessionId": self.session_id, "prompt": [{"type": "text", "text": text.unwrap_or_default()}]}),
                    )
                    .map_err(|e| WaitError::Io(e.to_string())),
            };
            match &sent {
                Ok(_) => self.steering_sent(),
                Err(_) => self.steering_unsent(),
            }
            let result = match sent
                .and_then(|id| self.wait(conn, "session/prompt", id, turn_deadline))
            {
                Ok(r) => r,
                Err(WaitError::Timeout) => {
                    let _ = conn.notify("session/cancel", json!({"sessionId": self.session_id}));
                    let msg = format!(
                        "turn {} timed out after {} ms",
                        self.turn, self.record.turn_timeout_ms
                    );
                    self.trace("turn_failed", json!({"turn": self.turn, "error": msg}));
                    return RunEnd::Failed(msg);
                }
                Err(WaitError::Rpc(text, err)) => {
                    if self.canceled.is_none()
                        && let Some(limit) = limit::from_error(&err, crate::time::unix_ms())
                    {
                        return self.rate_limited(limit);
                    }
                    return self.fail(conn, "session/prompt", WaitError::Rpc(text, err));
                }
                Err(e) => return self.fail(conn, "session/prompt", e),
            };
            let stop = result
                .get("stopReason")
                .and_then(Value::as_str)
                .unwrap_or("end_turn")
                .to_string();
            let cost = self.account(result.get("usage"), cost_before);
            self.trace(
                "turn_completed",
                json!({"turn": self.turn, "stopReason": stop, "usage": result.get("usage"), "cost": cost}),
            );
            // A limit the agent said in words ends the run before anything else is asked.
            let (silent, said) = {
                let updates = self.updates();
                let text = (!updates.turn_text.is_empty()).then(|| updates.turn_text.clone());
                (updates.turn_output == 0, text)
            };
            if self.canceled.is_none()
                && let Some(text) = said
                && let Some(limit) = limit::from_message(
                    &text,
                    &limit::Patterns::new(&self.record.rate_limit_patterns),
                    crate::time::unix_ms(),
                )
            {
                return self.rate_limited(limit);
            }
            self.turn_checked(silent);
            if let Some(reason) = &self.canceled {
                return RunEnd::Failed(format!("canceled: {reason}"));
            }
            if stop == "cancelled" || stop == "refusal" {
                return RunEnd::Failed(format!("turn {} ended with stop reason {stop}", self.turn));
            }
            // Keep going only while the issue is still active and routable.
            match self
                .ctx
                .tracker
                .fetch_states_by_ids(std::slice::from_ref(&issue.id))
            {
                Ok(list) => match list.into_iter().find(|i| i.id == issue.id) {
                    Some(fresh) if (self.ctx.dispatchable)(&fresh, &self.spec.settings) => {
                        issue = fresh
                    }
                    _ => return RunEnd::Clean,
                },
                Err(e) => log::warn!(
                    "[{}] tracker check after turn {} failed: {e}; continuing",
                    issue.identifier,
                    self.turn
                ),
            }
            self.poll_cancel();
            if self.last_turn {
                self.trace(
                    "last_turn",
                    json!({"turn": self.turn, "why": "daily budget reached"}),
                );
                if !self.steer_inbox.is_empty() {
                    self.defer_steering();
                }
                return RunEnd::Clean;
            }
            let steering_waits = self.queued_prompt.is_some()
                || (!self.steer_inbox.is_empty() && self.steering_turns < max_turns);
            if autonomous >= max_turns && !steering_waits {
                self.trace(
                    "max_turns_reached",
                    json!({"turn": self.turn, "maxTurns": max_turns, "steeringTurns": self.steering_turns}),
                );
                if !self.steer_inbox.is_empty() {
                    self.defer_steering();
                }
                return RunEnd::Clean;
            }
        }
    }

    /// Tells the state thread the turn ended (its usage was sent) and waits until the usage
    /// was held against the budgets: a turn that took its issue past a budget is cancelled,
    /// and one that took the day past its budget is the last, before another can start.
    fn turn_checked(&mut self, silent: bool) {
        if self.canceled.is_some() {
            return;
        }
        self.send(RunMsg::TurnEnded {
            turn: self.turn,
            silent,
        });
        let deadline = Instant::now() + TURN_CHECK_TIMEOUT;
        while self.canceled.is_none() {
            match self.ctx.control.recv_deadline(deadline) {
                Ok(Control::TurnChecked(turn)) if turn == self.turn => return,
                Ok(ctl) => self.on_control(ctl),
                Err(_) => {
                    log::warn!(
                        "[{}] run {}: the budgets were not checked within {:?} of turn {}'s end; going on",
                        self.spec.slot.issue.identifier,
                        self.spec.run_id,
                        TURN_CHECK_TIMEOUT,
                        self.turn
                    );
                    return;
                }
            }
        }
    }

    /// The turn met a limit of the agent's account: traced (the `rate_limit` type the timeline
    /// leaves out, and `turn_failed` for the run's last event), and the run ends.
    fn rate_limited(&mut self, limit: Limit) -> RunEnd {
        let reset_at = limit.reset_at.map(crate::time::rfc3339);
        self.trace(
            "rate_limit",
            json!({"turn": self.turn, "agentKind": self.record.kind, "reason": limit.reason, "resetAt": reset_at}),
        );
        let msg = format!("agent_rate_limited: {}", limit.reason);
        self.trace("turn_failed", json!({"turn": self.turn, "error": msg}));
        // Steering not yet delivered goes back to the issue's queue as the run exits.
        RunEnd::RateLimited(limit)
    }

    fn fail(&mut self, conn: &mut Connection, step: &str, e: WaitError) -> RunEnd {
        let msg = match e {
            WaitError::Timeout => format!("{step} timed out"),
            WaitError::Canceled(reason) => format!("canceled: {reason}"),
            WaitError::Closed => format!("agent bridge exited during {step} ({})", conn.kill()),
            WaitError::Rpc(m, _) => format!("{step} failed: {m}"),
            WaitError::Io(m) => format!("{step}: cannot write to the bridge: {m}"),
        };
        self.trace("turn_failed", json!({"turn": self.turn, "error": msg}));
        RunEnd::Failed(msg)
    }

    /// Token accounting after a turn: the prompt result's `usage`, else the context size the
    /// turn's `usage_update`s reported. Per-turn reports add up; cumulative ones replace (see
    /// [`Meter::turn`]). Returns the turn's cost as the trace records it (null when unknown):
    /// what the run's cost grew by since `before`, its cost as the turn started.
    fn account(&mut self, usage: Option<&Value>, before: Option<(f64, String)>) -> Value {
        let mut updates = self.updates();
        let mut get = |u: &Value, k: &str| {
            let n = u.get(k).and_then(Value::as_u64).unwrap_or(0);
            updates.bounded(n)
        };
        let turn = match usage {
            Some(u) if u.is_object() => {
                let (input, output) = (get(u, "inputTokens"), get(u, "outputTokens"));
                let cached_input = get(u, "cachedReadTokens");
                let total = match u.get("totalTokens").and_then(Value::as_u64) {
                    Some(total) => get(u, "totalTokens").min(total),
                    None => input.saturating_add(output).saturating_add(cached_input),
                };
                Some(TurnTokens {
                    tokens: Tokens {
                        input,
                        output,
                        total,
                    },
                    cached_input,
                })
            }
            _ => updates.turn_context_tokens.map(|used| TurnTokens {
                tokens: Tokens {
                    input: used,
                    output: 0,
                    total: used,
                },
                cached_input: 0,
            }),
        };
        if let Some(turn) = turn {
            updates.meter.turn(turn);
        }
        // The turn is accounted: its context size no longer stands in for its input.
        let context = updates.turn_context_tokens.take();
        if turn.is_some() || context.is_some() || updates.usage_pending {
            updates.send_usage(Instant::now());
        }
        let before = before.as_ref().map(|(a, c)| (*a, c.as_str()));
        turn_cost_json(before, updates.meter.cost().as_ref())
    }

    /// Sends a request and waits for its response, handling everything the agent sends
    /// meanwhile. A cancel sends `session/cancel` once and shortens the deadline.
    fn call(
        &mut self,
        conn: &mut Connection,
        method: &str,
        params: Value,
        deadline: Instant,
    ) -> Result<Value, WaitError> {
        let id = conn
            .request(method, params)
            .map_err(|e| WaitError::Io(e.to_string()))?;
        self.wait(conn, method, id, deadline)
    }

    /// Waits for the response to request `id` (`method`), handling everything the agent sends
    /// meanwhile, and control messages: a cancel, or steering (during a prompt, sent at once
    /// as a queued prompt where the agent takes those, else kept for the turn's end).
    fn wait(
        &mut self,
        conn: &mut Connection,
        method: &str,
        id: u64,
        deadline: Instant,
    ) -> Result<Value, WaitError> {
        if let Some(at) = self.early.iter().position(|(i, _)| *i == id) {
            let (_, m) = self.early.remove(at);
            if let Some(err) = m.get("error") {
                return Err(WaitError::Rpc(rpc_error_text(err), err.clone()));
            }
            return Ok(m.get("result").cloned().unwrap_or(Value::Null));
        }
        let mut deadline = deadline;
        if let Some(reason) = self.canceled.clone() {
            if method != "session/prompt" {
                return Err(WaitError::Canceled(reason));
            }
            let _ = conn.notify("session/cancel", json!({"sessionId": self.session_id}));
            deadline = deadline.min(Instant::now() + CANCEL_GRACE);
        }
        loop {
            // Wake for a report the reader held back, when its interval is up.
            let wake = self
                .updates()
                .due()
                .map_or(deadline, |due| due.min(deadline));
            let timeout = wake.saturating_duration_since(Instant::now());
            select! {
                recv(self.held) -> _ => {}
                recv(conn.incoming) -> msg => match msg {
                    Ok(Incoming::Message(m)) => {
                        if is_call(&m) {
                            self.on_call(conn, &m);
                        } else if m.get("id").and_then(Value::as_u64) == Some(id) {
                            if let Some(err) = m.get("error") {
                                return Err(WaitError::Rpc(rpc_error_text(err), err.clone()));
                            }
                            self.flush_activity();
                            return Ok(m.get("result").cloned().unwrap_or(Value::Null));
                        } else if let Some(other) = m.get("id").and_then(Value::as_u64)
                            && Some(other) == self.queued_prompt
                        {
                            self.early.push((other, m));
                        }
                    }
                    Ok(Incoming::Garbage(line)) => self.trace("stderr", json!({"line": line, "stream": "stdout"})),
                    Ok(Incoming::Stderr(line)) => self.trace("stderr", json!({"line": line})),
                    Ok(Incoming::Closed) | Err(_) => return Err(WaitError::Closed),
                },
                recv(self.ctx.control) -> ctl => {
                    if let Ok(Control::Steer(messages)) = ctl {
                        self.steer_inbox.extend(messages);
                        if method == "session/prompt" && self.canceled.is_none() {
                            self.queue_steering(conn);
                        }
                    } else if let Ok(Control::LastTurn) = ctl {
                        self.last_turn = true;
                    } else if let Ok(Control::Cancel(reason)) = ctl && self.canceled.is_none() {
                        log::info!("[{}] stopping run {}: {reason}", self.spec.slot.issue.identifier, self.spec.run_id);
                        self.canceled = Some(reason.clone());
                        if method != "session/prompt" {
                            return Err(WaitError::Canceled(reason));
                        }
                        let _ = conn.notify("session/cancel", json!({"sessionId": self.session_id}));
                        deadline = deadline.min(Instant::now() + CANCEL_GRACE);
                    }
                },
                default(timeout) => {
                    if Instant::now() < deadline {
                        self.updates().send_due();
                        continue;
                    }
                    return Err(match &self.canceled {
                        Some(reason) => WaitError::Canceled(reason.clone()),
                        None => WaitError::Timeout,
                    });
                }
            }
        }
    }

    /// A request or notification from the agent.
    fn on_call(&mut self, conn: &mut Connection, m: &Value) {
        let method = m["method"].as_str().unwrap_or_default();
        let params = m.get("params").unwrap_or(&Value::Null);
        match (method, m.get("id")) {
            ("session/update", None) => self.on_update(params),
            ("session/request_permission", Some(id)) => {
                let answer = self.permission(params);
                let _ = conn.respond(id, answer);
            }
            (_, Some(id)) => {
                let _ = conn.respond_error(id, -32601, &format!("Method not found: {method}"));
            }
            (_, None) => {}
        }
    }

    fn permission(&mut self, params: &Value) -> Value {
        let title = params
            .pointer("/toolCall/title")
            .and_then(Value::as_str)
            .unwrap_or("tool call")
            .to_string();
        let options = params
            .get("options")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let allow = options.iter().find(|o| {
            o.get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.starts_with("allow"))
        });
        let (answer, event, option_id) = match (allow, &self.canceled) {
            (Some(opt), None) => {
                let option_id = opt.get("optionId").cloned().unwrap_or(Value::Null);
                (
                    json!({"outcome": {"outcome": "selected", "optionId": option_id}}),
                    "approval_auto_approved",
                    option_id,
                )
            }
            (_, Some(_)) => (
                json!({"outcome": {"outcome": "cancelled"}}),
                "approval_cancelled",
                Value::Null,
            ),
            (None, None) => (
                json!({"outcome": {"outcome": "cancelled"}}),
                "approval_required",
                Value::Null,
            ),
        };
        self.trace(
            "permission_request",
            json!({"title": title, "decision": event, "optionId": option_id, "options": options}),
        );
        if event != "approval_cancelled" {
            self.send(RunMsg::Notice {
                event: event.into(),
                message: title,
            });
        }
        self.touch(event);
        answer
    }

    fn on_update(&mut self, params: &Value) {
        if let Some(update) = params
            .get("update")
            .and_then(|u| serde_json::value::to_raw_value(u).ok())
        {
            self.updates().on_update(&update);
        }
    }

    fn touch(&mut self, kind: &str) {
        self.updates().touch(kind, false);
    }

    /// Sends the activity the throttle held back, so the snapshot ends a turn up to date.
    fn flush_activity(&mut self) {
        self.updates().flush();
    }

    fn updates(&self) -> std::sync::MutexGuard<'_, Updates> {
        self.updates.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A JSON-RPC error as text: the message, the code, and the `data` the bridge gave (its details
/// are often the real reason), cut to a readable length.
fn rpc_error_text(err: &Value) -> String {
    let mut text = err
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("unknown error")
        .to_string();
    if let Some(code) = err.get("code").and_then(Value::as_i64) {
        text.push_str(&format!(" (code {code})"));
    }
    match err.get("data") {
        None | Some(Value::Null) => {}
        Some(Value::String(d)) => text.push_str(&format!(": {d}")),
        Some(d) => text.push_str(&format!(": {d}")),
    }
    text.chars().take(800).collect()
}

/// The prompt of turns after the first.
pub fn continuation_prompt(
    identifier: &str,
    title: &str,
    state: &str,
    turn: u32,
    max_turns: u32,
) -> String {
    format!(
        "Continue working on {identifier}: {title}. The issue is still in state \"{state}\" (turn {turn} of {max_turns}). \
         Pick up where you left off; when the work is done, record it on the issue and move it out of its active state."
    )
}
