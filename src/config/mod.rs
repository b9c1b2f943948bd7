//! The workflow contract: reading `WORKFLOW.md`, validating every section of its front matter
//! strictly with the spec's messages, resolving secret references, and producing typed
//! [`Settings`]. Pure apart from `op` reads: text and environment in, settings or errors out.

pub mod prompt;
pub mod secret;
mod sections;
mod tools;
mod tracker;
pub mod validate;
pub mod workflow;
pub mod workflows;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

pub use secret::{Secret, SecretResolver};
pub use sections::merge_json;
pub use tools::{PACKS, Pack, mounted_packs};
pub use workflows::load_shared;

use crate::env::Env;
use validate::Ctx;

/// One configuration problem. `message` is the spec's exact wording; `hint` says what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub message: String,
    pub hint: Option<String>,
}

impl ConfigError {
    /// The message, then ` (hint: ...)` when there is a hint.
    pub fn with_hint(&self) -> String {
        match &self.hint {
            Some(hint) => format!("{} (hint: {hint})", self.message),
            None => self.message.clone(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A deprecation: `check` is the doctor check name (`config_deprecation_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub check: String,
    pub message: String,
}

/// Everything `WORKFLOW.md` configures, with defaults applied and references resolved.
#[derive(Clone, Debug)]
pub struct Settings {
    pub workflow_path: PathBuf,
    /// `name`: the workflow's name when the file sets one (see [`workflows::name_all`]).
    pub name: Option<String>,
    pub tracker: TrackerSettings,
    /// Options of the packs named under `tools:` (in file order).
    pub tools: Vec<(String, ToolOptions)>,
    pub polling: PollingSettings,
    pub workspace: WorkspaceSettings,
    pub worker: WorkerSettings,
    pub workers: BTreeMap<String, WorkerProfile>,
    pub hooks: HookSettings,
    pub agent: AgentSettings,
    pub agents: AgentsSettings,
    /// Per-state agent settings, keyed by the trimmed, lowercased state name.
    pub status_overrides: BTreeMap<String, StateOverride>,
    pub observability: ObservabilitySettings,
    pub server: ServerSettings,
    pub logging: LoggingSettings,
    pub daemon: DaemonSettings,
    pub prompt_template: String,
    /// Whether any value was an `op://` reference.
    pub uses_op: bool,
    /// The environment variables svc read a credential from (a credential key's `$NAME`, or
    /// the provider's fallback variable). Agents never inherit them (`agents.<kind>.env` may
    /// hand one over explicitly).
    pub credential_vars: std::collections::BTreeSet<String>,
    /// The tracker, trackers and tools sections as written, canonicalized (sorted keys): part of
    /// the MCP token scope, so changing any of them rotates the tokens.
    pub identity: String,
}

impl Settings {
    /// The agent settings for an issue in `state`: the base, or the state's override.
    pub fn agent_for_state(&self, state: &str) -> (&AgentSettings, &AgentsSettings) {
        match self.status_overrides.get(&state.trim().to_lowercase()) {
            Some(o) => (&o.agent, &o.agents),
            None => (&self.agent, &self.agents),
        }
    }

    /// The options of the pack slice `tools.<name>`, when the workflow has one.
    pub fn tool(&self, name: &str) -> Option<&ToolOptions> {
        self.tools.iter().find(|(k, _)| k == name).map(|(_, o)| o)
    }
}

#[derive(Clone, Debug)]
pub struct TrackerSettings {
    /// `tracker.kind` as written: a provider name or a `trackers.<name>` bundle.
    pub kind: String,
    pub provider: Provider,
    pub active_states: Vec<String>,
    pub terminal_states: Vec<String>,
    pub dispatch: DispatchSettings,
    pub options: ProviderOptions,
    /// `webhook_secret` of a `github`, `gitlab`, `tracker-a` or `tracker-b` tracker: the secret its
    /// webhook route checks deliveries with (`None`: the route answers 404).
    pub webhook_secret: Option<Secret>,
}

impl TrackerSettings {
    pub fn is_active(&self, state: &str) -> bool {
        contains_state(&self.active_states, state)
    }

    pub fn is_terminal(&self, state: &str) -> bool {
        contains_state(&self.terminal_states, state)
    }
}

/// State names compare trimmed and case-insensitively.
pub fn contains_state(states: &[String], state: &str) -> bool {
    let state = state.trim();
    states.iter().any(|s| s.trim().eq_ignore_ascii_case(state))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    TrackerA,
    TrackerB,
    TrackerBMcp,
    Local,
    ChatA,
    ChatB,
    Github,
    Gitlab,
    Memory,
}

impl Provider {
    pub const ALL: [Provider; 9] = [
        Provider::TrackerA,
        Provider::TrackerB,
        Provider::TrackerBMcp,
        Provider::Local,
        Provider::ChatA,
        Provider::ChatB,
        Provider::Github,
        Provider::Gitlab,
        Provider::Memory,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Provider::TrackerA => "tracker-a",
            Provider::TrackerB => "tracker-b",
            Provider::TrackerBMcp => "tracker-b-mcp",
            Provider::Local => "local",
            Provider::ChatA => "chat-a",
            Provider::ChatB => "chat-b",
            Provider::Github => "github",
            Provider::Gitlab => "gitlab",
            Provider::Memory => "memory",
        }
    }

    pub fn from_name(name: &str) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.name() == name)
    }
}

#[derive(Clone, Debug)]
pub struct DispatchSettings {
    pub accept_unrouted: bool,
    pub only_routes: Option<Vec<String>>,
    pub route_label_prefix: String,
}

#[derive(Clone, Debug)]
pub enum ProviderOptions {
    TrackerA(TrackerAOptions),
    TrackerB(TrackerBOptions),
    TrackerBMcp(TrackerBMcpOptions),
    Local(LocalOptions),
    ChatA(ChatOptions),
    ChatB(ChatOptions),
    Github(GithubOptions),
    Gitlab(GitlabOptions),
    Memory,
}

#[derive(Clone, Debug)]
pub enum TrackerAProjects {
    Slugs(Vec<String>),
    Labels(Vec<String>),
    /// Deprecated single slug; the only form that powers the operator project URL.
    Slug(String),
}

#[derive(Clone, Debug)]
pub struct TrackerAOptions {
    pub api_key: Secret,
    pub endpoint: String,
    pub projects: TrackerAProjects,
    /// `None` means no assignee filter; `Some("me")` resolves to the viewer.
    pub assignee: Option<String>,
    /// Who may steer through comments (user ids or emails); empty: any person.
    pub users: Vec<String>,
}

pub const TRACKER_A_DEFAULT_ENDPOINT: &str = "https://api.linear.app/graphql";

#[derive(Clone, Debug)]
pub struct TrackerBOptions {
    pub base_url: Secret,
    pub email: Secret,
    pub api_key: Secret,
    pub scope: TrackerBScope,
    /// Who may steer through comments (account ids or emails); empty: any person.
    pub users: Vec<String>,
}

/// The candidate scope shared by `tracker-b` and `tracker-b-mcp`.
#[derive(Clone, Debug)]
pub struct TrackerBScope {
    pub project_keys: Vec<String>,
    pub jql: Option<String>,
    pub issue_type: String,
    /// `None` (unset) or `me` means the current user; anything else is used verbatim.
    pub assignee: Option<String>,
}

#[derive(Clone, Debug)]
pub struct TrackerBMcpOptions {
    pub base_url: Option<Secret>,
    pub url: Secret,
    pub token: Option<Secret>,
    pub headers: Vec<(String, Secret)>,
    pub tools: McpToolNames,
    pub scope: TrackerBScope,
    /// Who may steer through comments (account ids or emails); empty: any person.
    pub users: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpToolNames {
    pub search: String,
    pub read_issue: String,
    pub update_status: String,
    pub list_comments: String,
    pub comment: String,
    pub update_comment: String,
    pub create_issue: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalOptions {
    pub path: PathBuf,
    pub id_prefix: String,
    /// Who may steer through board comments (comment authors); empty: anyone but svc.
    pub users: Vec<String>,
}

/// The `github` tracker's options (and a standalone `tools.github` pack's).
#[derive(Clone, Debug)]
pub struct GithubOptions {
    pub api_key: Secret,
    /// The REST API base (`https://api.github.com`, or `https://<host>/api/v3` for GitHub
    /// Enterprise Server), without a trailing slash.
    pub endpoint: String,
    /// `owner/name`, at least one.
    pub repos: Vec<String>,
    /// Only issues carrying all of them are candidates; empty: all issues.
    pub labels: Vec<String>,
    /// `None`: no assignee filter; `Some("me")`: the token's user; otherwise a login.
    pub assignee: Option<String>,
    /// Who may steer through comments and pull-request feedback (logins); empty: any person.
    pub users: Vec<String>,
    /// A Projects v2 board whose single-select field holds the states; `None`: states come
    /// from `status: <State>` labels and the open/closed state.
    pub project: Option<GithubProject>,
    /// Where pull-request feedback moves an issue that sits in a non-active, non-terminal
    /// state (none by default).
    pub rework_state: Option<String>,
}

impl GithubOptions {
    /// The GraphQL endpoint that belongs to the REST base: `<host>/api/graphql` for an
    /// Enterprise Server's `<host>/api/v3`, else `<base>/graphql`.
    pub fn graphql_url(&self) -> String {
        match self.endpoint.strip_suffix("/api/v3") {
            Some(host) => format!("{host}/api/graphql"),
            None => format!("{}/graphql", self.endpoint),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GithubProject {
    /// The organization or user that owns the board.
    pub owner: String,
    pub number: u64,
    /// The single-select field that holds the state (`Status`).
    pub status_field: String,
}

pub const GITHUB_DEFAULT_ENDPOINT: &str = "https://api.github.com";

/// The `gitlab` tracker's options (and a standalone `tools.gitlab` pack's).
#[derive(Clone, Debug)]
pub struct GitlabOptions {
    pub api_key: Secret,
    /// The REST API v4 base (`https://gitlab.com/api/v4`, or `https://<host>/api/v4` for a
    /// self-managed instance), without a trailing slash.
    pub endpoint: String,
    /// Full project paths (`group/sub/project`), at least one.
    pub projects: Vec<String>,
    /// Only issues carrying all of them are candidates; empty: all issues.
    pub labels: Vec<String>,
    /// `None`: no assignee filter; `Some("me")`: the token's user; otherwise a username.
    pub assignee: Option<String>,
    /// Who may steer through notes and merge-request feedback (usernames); empty: anyone
    /// with at least Developer access to the project.
    pub users: Vec<String>,
    /// The scope of the state labels, with its `::` (`status::`): an open issue's state is
    /// the label `<prefix><State>`.
    pub status_label_prefix: String,
    /// Where merge-request feedback moves an issue that sits in a non-active, non-terminal
    /// state (none by default).
    pub rework_state: Option<String>,
}

pub const GITLAB_DEFAULT_ENDPOINT: &str = "https://gitlab.com/api/v4";

#[derive(Clone, Debug)]
pub struct ChatOptions {
    pub guild_id: Option<String>,
    pub channels: Vec<String>,
    pub bot_user_id: Option<String>,
    pub users: Vec<String>,
    pub api_key: Secret,
    /// chat-a's app-level token for Socket Mode (empty: no Socket Mode; always empty for
    /// chat-b).
    pub app_token: Secret,
    pub endpoint: String,
    pub emoji_states: BTreeMap<String, String>,
    pub marker_emoji: String,
    pub lookback_days: f64,
}

/// Options of one `tools.<pack>` slice.
#[derive(Clone, Debug)]
pub enum ToolOptions {
    TrackerA {
        api_key: Option<Secret>,
        /// `None` when unset: the endpoint then resolves like the credential (the dispatch
        /// tracker's when it is tracker-a, else [`TRACKER_A_DEFAULT_ENDPOINT`]).
        endpoint: Option<String>,
    },
    Local(LocalOptions),
    TrackerB(Box<TrackerBOptions>),
    /// A `tools.chat_a` slice: the chat-a options, none of them required (the tools fail closed
    /// without a bot user id), and the keys the slice set (camelCase), which override a chat-a
    /// dispatch tracker's options one by one.
    ChatA {
        options: Box<ChatOptions>,
        keys: Vec<String>,
    },
    /// A `tools.chat_b` slice, like `ChatA` for the chat-b options.
    ChatB {
        options: Box<ChatOptions>,
        keys: Vec<String>,
    },
    /// A `tools.github` slice: the pack's own credential and repositories.
    Github(Box<GithubOptions>),
    /// A `tools.gitlab` slice: the pack's own credential and projects.
    Gitlab(Box<GitlabOptions>),
}

#[derive(Clone, Debug)]
pub struct PollingSettings {
    pub interval_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    PerAgent,
    None,
}

#[derive(Clone, Debug)]
pub struct WorkspaceSettings {
    pub root: PathBuf,
    /// The root as configured (`SVC_WORKSPACE_ROOT` or `workspace.root`, before `~`
    /// expansion): a remote worker expands `~` and `$HOME` against its own home.
    pub root_setting: Option<String>,
    pub isolation: Isolation,
}

#[derive(Clone, Debug, Default)]
pub struct WorkerSettings {
    pub kind: Option<String>,
    pub ssh_hosts: Vec<String>,
    pub ssh_timeout_ms: u64,
    pub max_concurrent_agents_per_host: Option<u64>,
    pub worker_pool: Option<WorkerPoolSettings>,
    /// `SVC_SSH_CONFIG`, passed to ssh as `-F <path>`.
    pub ssh_config: Option<PathBuf>,
}

#[derive(Clone, Debug, Default)]
pub struct WorkerPoolSettings {
    pub driver: String,
    pub min: u64,
    pub max: u64,
    pub warm: u64,
    pub max_in_flight: u64,
    pub ttl_ms: u64,
    pub idle_reap_ms: u64,
    pub acquire_timeout_ms: u64,
    pub reap_interval_ms: u64,
    pub stale_heartbeat_ms: u64,
    pub drain_deadline_ms: u64,
    pub max_workers_per_issue: Option<u64>,
    pub co_residence: Option<bool>,
    pub max_concurrent_tunnels: Option<u64>,
    pub spend_max_concurrent_workers: Option<u64>,
    pub spend_max_worker_seconds: Option<u64>,
    pub spend_daily_worker_seconds: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct WorkerProfile {
    pub driver: String,
    pub ssh_hosts: Vec<String>,
    pub image: Option<String>,
    pub user: String,
    pub extra: serde_json::Value,
}

#[derive(Clone, Debug, Default)]
pub struct HookSettings {
    pub after_create: Option<String>,
    pub before_run: Option<String>,
    pub after_run: Option<String>,
    pub before_remove: Option<String>,
    pub timeout_ms: u64,
}

#[derive(Clone, Debug)]
pub struct AgentSettings {
    pub kind: String,
    pub max_concurrent_agents: u64,
    pub max_turns: u64,
    pub max_retry_backoff_ms: u64,
    pub ensemble_size: u64,
    pub skills: Vec<String>,
    pub budgets: Budgets,
}

/// `agent.max_tokens_per_issue`, `agent.max_cost_usd_per_issue`, `agent.daily_budget_usd`:
/// none by default.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Budgets {
    pub max_tokens_per_issue: Option<u64>,
    pub max_cost_usd_per_issue: Option<f64>,
    /// The UTC day's, for every daemon on a shared claim store.
    pub daily_budget_usd: Option<f64>,
}

#[derive(Clone, Debug)]
pub struct AgentsSettings {
    pub turn_timeout_ms: u64,
    pub stall_timeout_ms: u64,
    /// Every agent record: the built-in `agent_a` and `agent_b` plus configured kinds.
    pub kinds: BTreeMap<String, AgentRecord>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageAccounting {
    PerTurn,
    Cumulative,
}

/// `agents.<kind>.pricing`: what the agent's tokens cost, in US dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pricing {
    pub input: f64,
    pub output: f64,
    /// Input tokens read from the provider's prompt cache (`cachedReadTokens`); `input` when
    /// unset.
    pub cached_input: f64,
}

impl Pricing {
    /// What these token counts cost, in US dollars.
    pub fn cost_usd(&self, input: u64, cached_input: u64, output: u64) -> f64 {
        (input as f64 * self.input
            + cached_input as f64 * self.cached_input
            + output as f64 * self.output)
            / 1_000_000.0
    }
}

#[derive(Clone, Debug)]
pub struct AgentRecord {
    pub kind: String,
    pub turn_timeout_ms: u64,
    /// 0 disables stall detection.
    pub stall_timeout_ms: u64,
    /// The bridge command as written.
    pub bridge_command: String,
    pub usage_accounting: UsageAccounting,
    pub provider_config: Option<serde_json::Value>,
    pub strict_mcp_config: bool,
    /// Whether this record exists only because it is built in (not configured).
    pub builtin_only: bool,
    /// Whether the bridge takes a `session/prompt` while a turn is executing (and runs it
    /// after that turn): steering is then sent at once instead of at the turn's end.
    pub queue_prompts: bool,
    /// `env`: variables the bridge gets on top of what it inherits (where a variable svc keeps
    /// from agents can be handed over on purpose). Values are held as secrets.
    pub env: Vec<(String, crate::config::Secret)>,
    /// `pricing`: the price of its tokens; `None` when not configured (its cost is then
    /// unknown unless the bridge reports one).
    pub pricing: Option<Pricing>,
    /// `rate_limit_patterns`: regular expressions; a turn whose last agent message matches
    /// one met a rate limit ([`DEFAULT_RATE_LIMIT_PATTERNS`] unless configured). Checked to
    /// compile when the workflow loads.
    pub rate_limit_patterns: Vec<String>,
    /// `cooldown_ms`: how long a limit lasts when the agent did not say when it resets.
    pub cooldown_ms: u64,
    /// `cooldown_scope`: who shares this kind's cooldowns.
    pub cooldown_scope: CooldownScope,
    /// `fallback`: other kinds, in order, that take runs while this one cools down.
    pub fallback: Vec<String>,
    /// `route_fallback`: an issue routed to this kind by a route label may fall back too
    /// (by default a route keeps its kind and waits).
    pub route_fallback: bool,
}

/// `agents.<kind>.cooldown_scope`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CooldownScope {
    /// Every daemon sharing the claim store shares the kind's account.
    #[default]
    Fleet,
    /// Each host has its own account: a cooldown holds on this host only.
    Host,
}

/// `agents.<kind>.cooldown_ms` when unset: 15 minutes.
pub const DEFAULT_COOLDOWN_MS: u64 = 15 * 60 * 1000;

/// `agents.<kind>.rate_limit_patterns` when unset: the wording of the known bridges' limit
/// messages (README, "Rate limits and fallback", quotes each with its source). Matched against
/// the turn's last agent message, trimmed.
pub const DEFAULT_RATE_LIMIT_PATTERNS: &[&str] = &[
    // Claude Code, under agent_b's bridge: "You've hit your session limit · resets 4pm
    // (Europe/Berlin)", "You've hit your limit · resets 8:30am (America/Los_Angeles)".
    r"(?i)^(internal error: |error running [\w ]+: )?you['’]ve (hit|reached) your [\w' ]*limit",
    // Claude Code, 2025: "5-hour limit reached ∙ resets 5am", "Session limit reached ∙ ...".
    r"(?i)^(internal error: )?(5-hour|session|weekly|opus|sonnet) limit reached",
    // Claude Code headless and mid-2025: "Claude AI usage limit reached|1755772800",
    // "Claude usage limit reached. Your limit will reset at 9pm (America/New_York)."
    r"(?i)^(internal error: )?claude (ai )?usage limit reached",
    // Claude Code's other blocking texts: "You're out of usage credits", "You're out of extra
    // usage · resets ...", "Your org is out of usage · add funds to continue".
    r"(?i)^(internal error: )?(you['’]re out of (usage credits|extra usage)|your org is out of usage)",
    // Claude Code's API errors: "API Error: Rate limit reached", "API Error: 529 Overloaded.",
    // "Error: 429 {"type":"error","error":{"type":"rate_limit_error",...}}".
    r"(?i)^(api )?error: (429|529|rate limit reached)\b",
    // Codex, under agent_a's bridge: "You've hit your usage limit. ... or try again at 2:57
    // PM." (the first pattern), "Your workspace is out of credits. ...", "You hit your spend
    // cap ...", "Quota exceeded. Check your plan and billing details."
    r"(?i)^(your workspace is out of credits|you hit your spend cap|quota exceeded\. check your plan)",
    // Codex after its retries: "exceeded retry limit, last status: 429 Too Many Requests".
    r"(?i)^(stream error: )?exceeded retry limit, last status: 429",
    // OpenAI's API: "Rate limit reached for <model> ... Please try again in 1.2s.", "You
    // exceeded your current quota, please check your plan and billing details."
    r"(?i)^(rate limit reached for|you exceeded your current quota)",
    // Codex when the model is overloaded, and its older 429 text: "Selected model is at
    // capacity. Please try a different model.", "rate limited (status 429 Too Many Requests),
    // retry after 30s, ...".
    r"(?i)^(selected model is at capacity|rate limited \(status 429)",
    // Anthropic's API spend limit, as Claude Code prints it: "API Error: 400 {... You have
    // reached your specified API usage limits. You will regain access on 2025-12-01 at 00:00
    // UTC.}".
    r"(?i)^(api )?error: 400 .*you have reached your specified api usage limits",
];

impl AgentRecord {
    /// The bridge command split on whitespace: program and arguments.
    pub fn bridge_argv(&self) -> Vec<&str> {
        self.bridge_command.split_whitespace().collect()
    }
}

#[derive(Clone, Debug)]
pub struct StateOverride {
    /// `agent.max_concurrent_agents` when the override sets it: the cap for issues in this state.
    pub max_concurrent_agents: Option<u64>,
    pub agent: AgentSettings,
    pub agents: AgentsSettings,
}

#[derive(Clone, Debug)]
pub struct ObservabilitySettings {
    pub dashboard_enabled: bool,
    pub refresh_ms: u64,
    pub render_interval_ms: u64,
}

#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub host: String,
    pub port: u16,
    pub mcp_port: Option<u16>,
    /// `server.webhook_port`: the listener that serves only the webhook routes (`None`: none).
    pub webhook_port: Option<u16>,
    /// `server.webhook_host`: where that listener binds.
    pub webhook_host: String,
    pub trace_dir: PathBuf,
    pub issue_store_path: PathBuf,
    pub static_dir: Option<PathBuf>,
}

#[derive(Clone, Debug)]
pub struct LoggingSettings {
    pub log_file: PathBuf,
}

/// The `daemon` section: limits over every workflow of the daemon.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DaemonSettings {
    /// `daemon.max_concurrent_agents`: runs at once over all workflows (`None`: no cap).
    pub max_concurrent_agents: Option<usize>,
    /// `daemon.daily_budget_usd`: the UTC day's spend over all workflows, in US dollars
    /// (`None`: no daemon-wide budget).
    pub daily_budget_usd: Option<f64>,
}

/// A validated workflow and the deprecations it uses.
#[derive(Debug)]
pub struct Loaded {
    pub settings: Settings,
    pub warnings: Vec<Warning>,
}

/// Why a workflow could not be loaded.
#[derive(Debug)]
pub enum LoadError {
    /// The file could not be read or split (one error).
    File(workflow::WorkflowError),
    /// The front matter is readable but invalid; every problem at once.
    Invalid {
        path: PathBuf,
        errors: Vec<ConfigError>,
        warnings: Vec<Warning>,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::File(e) => e.fmt(f),
            LoadError::Invalid { path, errors, .. } => {
                write!(
                    f,
                    "{}: {} configuration error{}",
                    path.display(),
                    errors.len(),
                    if errors.len() == 1 { "" } else { "s" }
                )?;
                for e in errors {
                    write!(f, "\n  - {}", e.message)?;
                    if let Some(hint) = &e.hint {
                        write!(f, " (hint: {hint})")?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Reads and validates the workflow at `path`.
pub fn load(path: &Path, env: &Env, secrets: &mut SecretResolver) -> Result<Loaded, LoadError> {
    let file = workflow::read(path).map_err(LoadError::File)?;
    from_workflow(&file, env, secrets)
}

/// Validates an already split workflow file.
pub fn from_workflow(
    file: &workflow::WorkflowFile,
    env: &Env,
    secrets: &mut SecretResolver,
) -> Result<Loaded, LoadError> {
    let used_op_before = secrets.used_op;
    secrets.used_op = false;
    let mut ctx = Ctx::new(env, secrets);
    let settings = sections::settings(&mut ctx, file);
    let uses_op = ctx.secrets.used_op;
    ctx.secrets.used_op |= used_op_before;
    let Ctx {
        errors,
        warnings,
        credential_vars,
        ..
    } = ctx;
    match settings {
        Some(mut settings) if errors.is_empty() => {
            settings.uses_op = uses_op;
            settings.credential_vars = credential_vars;
            Ok(Loaded { settings, warnings })
        }
        _ => Err(LoadError::Invalid {
            path: file.path.clone(),
            errors,
            warnings,
        }),
    }
}

#[cfg(test)]
mod tests;
