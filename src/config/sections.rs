//! Every section other than the tracker: polling, workspace, worker(s), hooks, agent(s), the
//! legacy agent sections, status overrides, observability, server and logging.

use std::collections::BTreeMap;

use serde_norway::Value;

use super::validate::{self, Ctx, Section, Style, yaml_to_json};
use super::workflow::WorkflowFile;
use super::*;

const TOP_LEVEL: [&str; 18] = [
    "name",
    "tracker",
    "trackers",
    "tools",
    "polling",
    "workspace",
    "worker",
    "workers",
    "hooks",
    "agent",
    "agents",
    "agent_a",
    "agent_b",
    "status_overrides",
    "observability",
    "server",
    "logging",
    "daemon",
];

pub(super) fn settings(ctx: &mut Ctx, file: &WorkflowFile) -> Option<Settings> {
    // Spec rule 3: every string value may be a reference, so all are resolved before any
    // section reads them. The identity below is built from the file as written, so resolved
    // secrets never sit in it.
    let front_matter = validate::resolve_references(ctx, &file.front_matter);
    let root = Section::read(ctx, "", Some(&front_matter), Style::Snake, None);
    for (key, written, _) in &root.entries {
        if !TOP_LEVEL.contains(&key.as_str()) {
            ctx.error(format!("{written} is not supported"));
        }
    }
    let root = Section {
        path: String::new(),
        style: Style::Snake,
        entries: root.entries,
    };
    let get = |key: &str| root.get(key);

    let tracker = tracker::tracker(ctx, &root);
    let tools = tools::tools(ctx, &root);
    let polling = section(ctx, "polling", get("polling"), &["interval_ms"]);
    let polling = PollingSettings {
        interval_ms: polling.positive_int(ctx, "interval_ms").unwrap_or(30_000),
    };
    let workspace = workspace(ctx, get("workspace"));
    let (worker, workers) = worker(ctx, get("worker"), get("workers"));
    let hooks = hooks(ctx, get("hooks"));
    if workspace.isolation == Isolation::None {
        for (name, set) in [
            ("after_create", &hooks.after_create),
            ("before_remove", &hooks.before_remove),
        ] {
            if set.is_some() {
                ctx.error_with_hint(
                    format!("hooks.{name} cannot be used with workspace.isolation: none"),
                    "with one shared workspace there is no per-issue workspace to create or remove",
                );
            }
        }
    }
    let (agent, agents) = agent_sections(ctx, &front_matter, true);
    let status_overrides = status_overrides(ctx, &front_matter, get("status_overrides"));
    let observability = section(
        ctx,
        "observability",
        get("observability"),
        &["dashboard_enabled", "refresh_ms", "render_interval_ms"],
    );
    let observability = ObservabilitySettings {
        dashboard_enabled: observability.bool(ctx, "dashboard_enabled").unwrap_or(true),
        refresh_ms: observability
            .positive_int(ctx, "refresh_ms")
            .unwrap_or(1000),
        render_interval_ms: observability
            .positive_int(ctx, "render_interval_ms")
            .unwrap_or(16),
    };
    let server = server(ctx, get("server"));
    let daemon = section(
        ctx,
        "daemon",
        get("daemon"),
        &["max_concurrent_agents", "daily_budget_usd"],
    );
    let daemon = DaemonSettings {
        max_concurrent_agents: daemon
            .positive_int(ctx, "max_concurrent_agents")
            .map(|n| n as usize),
        daily_budget_usd: daemon.positive_number(ctx, "daily_budget_usd"),
    };
    let name = workflow_name(ctx, get("name"));
    let logging = section(ctx, "logging", get("logging"), &["log_file"]);
    let logging = LoggingSettings {
        log_file: logging.string(ctx, "log_file").map_or_else(
            || ctx.env.resolve_path("~/.svc/log/svc.log"),
            |p| ctx.env.resolve_path(&p),
        ),
    };

    let prompt_template = file.body.clone();
    if let Err(e) = super::prompt::Template::parse(&prompt_template) {
        ctx.error_with_hint(
            format!("prompt template: {e}"),
            "fix the Markdown body of WORKFLOW.md (Liquid syntax)",
        );
    }

    // Before the tracker's early return, so these errors show even without a tracker.
    unsupported_features(ctx, &worker, &agent, &status_overrides);
    let tracker = tracker?;
    let tool_keys: Vec<&str> = tools.iter().map(|(k, _)| k.as_str()).collect();
    if let Err(e) = mounted_packs(tracker.provider, tool_keys, PACKS) {
        ctx.error(e);
    }
    // The pack's notes must be svc's own to the tracker's feedback reader (else the agent
    // steers itself): on the tracker's GitLab, the pack writes with the tracker's token.
    if let ProviderOptions::Gitlab(t) = &tracker.options
        && let Some(ToolOptions::Gitlab(g)) =
            tools.iter().find(|(k, _)| k == "gitlab").map(|(_, o)| o)
        && g.endpoint.eq_ignore_ascii_case(&t.endpoint)
        && g.api_key.expose() != t.api_key.expose()
    {
        ctx.error_with_hint(
            "tools.gitlab.api_key must be the gitlab tracker's token when both use one GitLab",
            "drop tools.gitlab (the tracker lends the pack its token) or give it the tracker's token: the agent's notes written as another user would steer the agent",
        );
    }

    Some(Settings {
        workflow_path: file.path.clone(),
        name,
        tracker,
        tools,
        polling,
        workspace,
        worker,
        workers,
        hooks,
        agent,
        agents,
        status_overrides,
        observability,
        server,
        logging,
        daemon,
        prompt_template,
        uses_op: false,
        credential_vars: Default::default(),
        identity: serde_json::json!({
            "tracker": file.front_matter.get("tracker").map(yaml_to_json),
            "trackers": file.front_matter.get("trackers").map(yaml_to_json),
            "tools": file.front_matter.get("tools").map(yaml_to_json),
        })
        .to_string(),
    })
}

/// `name`: a string following [`workflows::NAME_RULE`].
fn workflow_name(ctx: &mut Ctx, value: Option<&Value>) -> Option<String> {
    match value?.as_str() {
        Some(n) if workflows::valid_name(n) => Some(n.to_string()),
        Some(n) => {
            ctx.error_with_hint(
                format!("name {n:?} is not a valid workflow name"),
                format!("a name must be {}", workflows::NAME_RULE),
            );
            None
        }
        None => {
            ctx.error("name must be a string");
            None
        }
    }
}

/// Parsed features that this build cannot run yet: rejected clearly instead of ignored.
fn unsupported_features(
    ctx: &mut Ctx,
    worker: &WorkerSettings,
    agent: &AgentSettings,
    overrides: &BTreeMap<String, StateOverride>,
) {
    // The docker driver needs its profile (`image`): a bare `worker_pool.driver: docker` has none.
    if worker.kind.is_none()
        && let Some(pool) = &worker.worker_pool
        && pool.driver == "docker"
    {
        ctx.error_with_hint(
            "worker.worker_pool.driver docker needs a workers.<name> profile with an image",
            "add workers.<name>: {driver: docker, image: ...} and select it with worker.kind",
        );
    }
    let ensembles = std::iter::once(agent).chain(overrides.values().map(|o| &o.agent));
    if ensembles
        .into_iter()
        .any(|a| a.ensemble_size > MAX_ENSEMBLE)
    {
        ctx.error_with_hint(
            format!("agent.ensemble_size must be at most {MAX_ENSEMBLE}"),
            "each slot is a parallel run of the issue in its own workspace; use fewer",
        );
    }
}

/// The most parallel runs one issue may have in ensemble mode.
pub const MAX_ENSEMBLE: u64 = 64;

fn section<'v>(
    ctx: &mut Ctx,
    path: &str,
    value: Option<&'v Value>,
    allowed: &[&str],
) -> Section<'v> {
    Section::read(ctx, path, value, Style::Snake, Some(allowed))
}

fn workspace(ctx: &mut Ctx, value: Option<&Value>) -> WorkspaceSettings {
    let s = section(ctx, "workspace", value, &["root", "isolation"]);
    let root_setting = ctx
        .env
        .non_empty("SVC_WORKSPACE_ROOT")
        .map(str::to_string)
        .or_else(|| s.string(ctx, "root"));
    let root = match &root_setting {
        Some(root) => ctx.env.resolve_path(root),
        None => ctx.env.tmpdir().join("svc_workspaces"),
    };
    let isolation = match s
        .one_of(ctx, "isolation", &["per-agent", "none"])
        .as_deref()
    {
        Some("none") => Isolation::None,
        _ => Isolation::PerAgent,
    };
    WorkspaceSettings {
        root,
        root_setting,
        isolation,
    }
}

fn worker(
    ctx: &mut Ctx,
    worker: Option<&Value>,
    workers: Option<&Value>,
) -> (WorkerSettings, BTreeMap<String, WorkerProfile>) {
    let s = section(
        ctx,
        "worker",
        worker,
        &[
            "kind",
            "ssh_hosts",
            "ssh_timeout_ms",
            "max_concurrent_agents_per_host",
            "worker_pool",
        ],
    );
    let pool = s.has("worker_pool").then(|| worker_pool(ctx, &s));
    let settings = WorkerSettings {
        kind: s.non_blank_string(ctx, "kind"),
        ssh_hosts: s.string_list(ctx, "ssh_hosts").unwrap_or_default(),
        ssh_timeout_ms: s.positive_int(ctx, "ssh_timeout_ms").unwrap_or(60_000),
        max_concurrent_agents_per_host: s.positive_int(ctx, "max_concurrent_agents_per_host"),
        ssh_config: ctx
            .env
            .non_empty("SVC_SSH_CONFIG")
            .map(|p| ctx.env.resolve_path(p)),
        worker_pool: pool.clone().map(|(p, _)| p),
    };
    let driver_given = pool.as_ref().is_some_and(|(_, given)| *given);
    if !settings.ssh_hosts.is_empty() && (driver_given || settings.kind.is_some()) {
        ctx.error("worker.ssh_hosts cannot combine with worker_pool.driver or worker.kind");
    } else if settings.kind.is_some() && driver_given {
        ctx.error("worker.kind cannot combine with worker_pool.driver or worker.ssh_hosts");
    }

    let profiles_section = Section::read(ctx, "workers", workers, Style::Snake, None);
    let mut profiles = BTreeMap::new();
    for (_, name, value) in &profiles_section.entries {
        let path = format!("workers.{name}");
        // Open section: driver-specific keys pass through to the driver verbatim.
        let p = Section::read(ctx, &path, Some(value), Style::Snake, None);
        let Some(driver) = (match p.get("driver") {
            None => {
                ctx.error(format!("{path}.driver is required"));
                None
            }
            Some(_) => p.non_blank_string(ctx, "driver"),
        }) else {
            continue;
        };
        let ssh_hosts = p.string_list(ctx, "ssh_hosts").unwrap_or_default();
        if driver == "static-ssh" && ssh_hosts.is_empty() {
            ctx.error(format!(
                "{path}.ssh_hosts is required for the static-ssh driver"
            ));
        }
        let image = p.non_blank_string(ctx, "image");
        if driver == "docker" && image.is_none() {
            ctx.error(format!("{path}.image is required for the docker driver"));
        }
        let user_keys: Vec<&str> = ["user", "ssh_user"]
            .into_iter()
            .filter(|k| p.has(k))
            .collect();
        if user_keys.len() > 1 {
            ctx.error(format!("{path}.user is given twice (as user and ssh_user)"));
        }
        let user = user_keys
            .first()
            .and_then(|k| p.string(ctx, k))
            .unwrap_or_else(|| "root".to_string());
        let extra = serde_json::Value::Object(
            p.entries
                .iter()
                .filter(|(k, _, _)| {
                    !["driver", "ssh_hosts", "image", "user", "ssh_user"].contains(&k.as_str())
                })
                .map(|(_, written, v)| (written.clone(), yaml_to_json(v)))
                .collect(),
        );
        if driver == "static-ssh" && !settings.ssh_hosts.is_empty() {
            ctx.error("worker.ssh_hosts cannot combine with worker_pool.driver or worker.kind");
        }
        profiles.insert(
            name.clone(),
            WorkerProfile {
                driver,
                ssh_hosts,
                image,
                user,
                extra,
            },
        );
    }
    if let Some(kind) = &settings.kind
        && !profiles.contains_key(kind)
    {
        ctx.error(format!("worker.kind {kind} has no workers.{kind} profile"));
    }
    (settings, profiles)
}

/// `worker.worker_pool`; the flag says whether `driver` was given explicitly.
fn worker_pool(ctx: &mut Ctx, worker: &Section) -> (WorkerPoolSettings, bool) {
    let s = worker.section(
        ctx,
        "worker_pool",
        Style::Snake,
        Some(&[
            "driver",
            "min",
            "max",
            "warm",
            "max_in_flight",
            "ttl_ms",
            "idle_reap_ms",
            "acquire_timeout_ms",
            "reap_interval_ms",
            "stale_heartbeat_ms",
            "drain_deadline_ms",
            "max_workers_per_issue",
            "co_residence",
            "max_concurrent_tunnels",
            "spend",
        ]),
    );
    let spend = s.section(
        ctx,
        "spend",
        Style::Snake,
        Some(&[
            "max_concurrent_workers",
            "max_worker_seconds",
            "daily_worker_seconds",
        ]),
    );
    let driver = s.non_blank_string(ctx, "driver");
    let given = driver.is_some();
    let pool = WorkerPoolSettings {
        driver: driver.unwrap_or_else(|| "fake".to_string()),
        min: s.non_negative_int(ctx, "min").unwrap_or(0),
        max: s.positive_int(ctx, "max").unwrap_or(1),
        warm: s.non_negative_int(ctx, "warm").unwrap_or(1),
        max_in_flight: s.positive_int(ctx, "max_in_flight").unwrap_or(1),
        ttl_ms: s.positive_int(ctx, "ttl_ms").unwrap_or(3_600_000),
        idle_reap_ms: s.positive_int(ctx, "idle_reap_ms").unwrap_or(300_000),
        acquire_timeout_ms: s.positive_int(ctx, "acquire_timeout_ms").unwrap_or(30_000),
        reap_interval_ms: s.positive_int(ctx, "reap_interval_ms").unwrap_or(15_000),
        stale_heartbeat_ms: s.positive_int(ctx, "stale_heartbeat_ms").unwrap_or(600_000),
        drain_deadline_ms: s.positive_int(ctx, "drain_deadline_ms").unwrap_or(30_000),
        max_workers_per_issue: s.positive_int(ctx, "max_workers_per_issue"),
        co_residence: s.bool(ctx, "co_residence"),
        max_concurrent_tunnels: s.positive_int(ctx, "max_concurrent_tunnels"),
        spend_max_concurrent_workers: spend.positive_int(ctx, "max_concurrent_workers"),
        spend_max_worker_seconds: spend.positive_int(ctx, "max_worker_seconds"),
        spend_daily_worker_seconds: spend.positive_int(ctx, "daily_worker_seconds"),
    };
    if pool.max < pool.min {
        ctx.error("worker.worker_pool.max must be >= worker.worker_pool.min");
    }
    if pool.warm > pool.max {
        ctx.error("worker.worker_pool.warm must be <= worker.worker_pool.max");
    }
    if pool.max_in_flight > 1 && pool.co_residence != Some(true) {
        ctx.error_with_hint(
            "worker.worker_pool.max_in_flight above 1 needs worker.worker_pool.co_residence: true",
            "co-resident runs share one machine; opt in explicitly",
        );
    }
    (pool, given)
}

fn hooks(ctx: &mut Ctx, value: Option<&Value>) -> HookSettings {
    let s = section(
        ctx,
        "hooks",
        value,
        &[
            "after_create",
            "before_run",
            "after_run",
            "before_remove",
            "timeout_ms",
        ],
    );
    HookSettings {
        after_create: s.string(ctx, "after_create"),
        before_run: s.string(ctx, "before_run"),
        after_run: s.string(ctx, "after_run"),
        before_remove: s.string(ctx, "before_remove"),
        timeout_ms: s.positive_int(ctx, "timeout_ms").unwrap_or(60_000),
    }
}

const AGENT_KEYS: [&str; 9] = [
    "kind",
    "max_concurrent_agents",
    "max_turns",
    "max_retry_backoff_ms",
    "ensemble_size",
    "skills",
    "max_tokens_per_issue",
    "max_cost_usd_per_issue",
    "daily_budget_usd",
];
const AGENT_RECORD_KEYS: [&str; 15] = [
    "executor",
    "env",
    "turn_timeout_ms",
    "stall_timeout_ms",
    "bridge_command",
    "usage_accounting",
    "provider_config",
    "strict_mcp_config",
    "queue_prompts",
    "pricing",
    "rate_limit_patterns",
    "cooldown_ms",
    "cooldown_scope",
    "fallback",
    "route_fallback",
];
const PRICING_KEYS: [&str; 3] = ["input", "output", "cached_input"];

/// `agents.<kind>.pricing`: `{input, output, cached_input}` in US dollars per million tokens,
/// each a non-negative number; `input` and `output` are required, `cached_input` defaults to
/// `input`.
fn agent_pricing(ctx: &mut Ctx, path: &str, v: &Value) -> Option<Pricing> {
    let p = Section::read(ctx, path, Some(v), Style::Snake, Some(&PRICING_KEYS));
    let mut price = |key: &str| {
        let value = p.get(key)?;
        match value.as_f64().filter(|n| n.is_finite() && *n >= 0.0) {
            Some(n) => Some(n),
            None => {
                ctx.error_with_hint(
                    format!("{path}.{key} must be a non-negative number"),
                    "write US dollars per million tokens, e.g. 3 or 0.25",
                );
                None
            }
        }
    };
    let (input, output, cached_input) = (price("input"), price("output"), price("cached_input"));
    for (key, value) in [("input", input), ("output", output)] {
        if value.is_none() && !p.has(key) {
            ctx.error_with_hint(
                format!("{path}.{key} is required"),
                "give input and output prices in US dollars per million tokens",
            );
        }
    }
    let (input, output) = (input?, output?);
    Some(Pricing {
        input,
        output,
        cached_input: if p.has("cached_input") {
            cached_input?
        } else {
            input
        },
    })
}
/// `agents.<kind>.env`: a mapping of variable names to string values (references resolved
/// like every value), checked name by name.
fn agent_env(ctx: &mut Ctx, path: &str, v: &Value) -> Vec<(String, crate::config::Secret)> {
    let Some(map) = v.as_mapping() else {
        ctx.error_with_hint(
            format!("{path} must be a mapping"),
            "name each variable the agent's bridge gets, with its value: NAME: value",
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, v) in map {
        let name = k.as_str().unwrap_or_default();
        let valid = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            ctx.error_with_hint(
                format!("{path} has an invalid variable name"),
                "use letters, digits and underscores, not starting with a digit",
            );
            continue;
        }
        match v {
            Value::String(s) => out.push((name.to_string(), crate::config::Secret::new(s))),
            Value::Number(n) => {
                out.push((name.to_string(), crate::config::Secret::new(n.to_string())))
            }
            Value::Bool(b) => {
                out.push((name.to_string(), crate::config::Secret::new(b.to_string())))
            }
            _ => ctx.error(format!("{path}.{name} must be a string")),
        }
    }
    out
}

/// The model the built-in agent_b record pins.
pub const AGENT_B_MODEL: &str = "claude-sonnet-4-5";

/// `agent`, `agents` and the legacy `agent_a:` / `agent_b:` sections of `root`. Deprecations
/// are reported only when `warn` (status-override merges re-read the same keys).
fn agent_sections(ctx: &mut Ctx, root: &Value, warn: bool) -> (AgentSettings, AgentsSettings) {
    let a = section(ctx, "agent", root.get("agent"), &AGENT_KEYS);
    let agent = AgentSettings {
        kind: a
            .non_blank_string(ctx, "kind")
            .unwrap_or_else(|| "agent_a".to_string()),
        max_concurrent_agents: a.positive_int(ctx, "max_concurrent_agents").unwrap_or(10),
        max_turns: a.positive_int(ctx, "max_turns").unwrap_or(20),
        max_retry_backoff_ms: a
            .positive_int(ctx, "max_retry_backoff_ms")
            .unwrap_or(300_000),
        ensemble_size: a.positive_int(ctx, "ensemble_size").unwrap_or(1),
        skills: a.string_list(ctx, "skills").unwrap_or_default(),
        budgets: Budgets {
            max_tokens_per_issue: a.positive_int(ctx, "max_tokens_per_issue"),
            max_cost_usd_per_issue: a.positive_number(ctx, "max_cost_usd_per_issue"),
            daily_budget_usd: a.positive_number(ctx, "daily_budget_usd"),
        },
    };

    let s = Section::read(ctx, "agents", root.get("agents"), Style::Snake, None);
    let shared_turn = s.positive_int(ctx, "turn_timeout_ms").unwrap_or(3_600_000);
    let shared_stall = s
        .non_negative_int(ctx, "stall_timeout_ms")
        .unwrap_or(300_000);
    let mut kinds = BTreeMap::new();
    for builtin in ["agent_a", "agent_b"] {
        kinds.insert(
            builtin.to_string(),
            builtin_record(builtin, shared_turn, shared_stall),
        );
    }

    // Legacy sections first, so that canonical `agents.<kind>` keys win over them.
    for legacy in ["agent_a", "agent_b"] {
        let Some(value) = root.get(legacy) else {
            continue;
        };
        let allowed: &[&str] = if legacy == "agent_a" {
            &["command", "turn_timeout_ms", "stall_timeout_ms"]
        } else {
            &[
                "command",
                "turn_timeout_ms",
                "stall_timeout_ms",
                "model",
                "strict_mcp_config",
                "provider_config",
            ]
        };
        let l = section(ctx, legacy, Some(value), allowed);
        let record = kinds
            .get_mut(legacy)
            .expect("built-in records were inserted above");
        for (key, _, _) in &l.entries {
            let replacement = match key.as_str() {
                "command" => format!("agents.{legacy}.bridge_command"),
                "model" => format!("agents.{legacy}.provider_config.model"),
                other => format!("agents.{legacy}.{other}"),
            };
            if warn {
                ctx.deprecated(
                    &format!("{legacy}_{key}"),
                    format!("{legacy}.{key} is deprecated: use {replacement}"),
                );
            }
        }
        if let Some(cmd) = l.non_blank_string(ctx, "command") {
            record.bridge_command = cmd;
            record.builtin_only = false;
        }
        if let Some(v) = l.positive_int(ctx, "turn_timeout_ms") {
            record.turn_timeout_ms = v;
        }
        if let Some(v) = l.non_negative_int(ctx, "stall_timeout_ms") {
            record.stall_timeout_ms = v;
        }
        if let Some(v) = l.bool(ctx, "strict_mcp_config") {
            record.strict_mcp_config = v;
        }
        if let Some(pc) = l.get("provider_config") {
            if pc.is_mapping() {
                record.provider_config = Some(yaml_to_json(pc));
            } else {
                ctx.error(format!("{legacy}.provider_config must be a mapping"));
            }
        }
        if let Some(model) = l.string(ctx, "model") {
            let pc = record
                .provider_config
                .get_or_insert_with(|| serde_json::json!({}));
            if let Some(obj) = pc.as_object_mut() {
                obj.entry("model")
                    .or_insert(serde_json::Value::String(model));
            }
        }
    }

    for (key, written, value) in &s.entries {
        if key == "turn_timeout_ms" || key == "stall_timeout_ms" {
            continue;
        }
        let path = format!("agents.{written}");
        let r = Section::read(
            ctx,
            &path,
            Some(value),
            Style::Snake,
            Some(&AGENT_RECORD_KEYS),
        );
        let record = kinds.entry(written.clone()).or_insert_with(|| AgentRecord {
            kind: written.clone(),
            turn_timeout_ms: shared_turn,
            stall_timeout_ms: shared_stall,
            bridge_command: String::new(),
            usage_accounting: UsageAccounting::PerTurn,
            provider_config: None,
            strict_mcp_config: true,
            builtin_only: false,
            queue_prompts: false,
            env: Vec::new(),
            pricing: None,
            rate_limit_patterns: default_rate_limit_patterns(),
            cooldown_ms: DEFAULT_COOLDOWN_MS,
            cooldown_scope: CooldownScope::Fleet,
            fallback: Vec::new(),
            route_fallback: false,
        });
        record.builtin_only = false;
        if let Some(executor) = r.string(ctx, "executor")
            && executor != "acp"
        {
            ctx.error_with_hint(
                format!("{path}.executor must be acp"),
                "acp is the only built-in executor",
            );
        }
        if let Some(v) = r.positive_int(ctx, "turn_timeout_ms") {
            record.turn_timeout_ms = v;
        }
        if let Some(v) = r.non_negative_int(ctx, "stall_timeout_ms") {
            record.stall_timeout_ms = v;
        }
        if r.has("bridge_command") {
            if let Some(cmd) = r.non_blank_string(ctx, "bridge_command") {
                record.bridge_command = cmd;
            }
        } else if record.bridge_command.is_empty() {
            ctx.error_with_hint(
                format!("{path}.bridge_command is required"),
                "name the ACP bridge command that runs this agent",
            );
        }
        match r
            .one_of(ctx, "usage_accounting", &["per-turn", "cumulative"])
            .as_deref()
        {
            Some("cumulative") => record.usage_accounting = UsageAccounting::Cumulative,
            Some(_) => record.usage_accounting = UsageAccounting::PerTurn,
            None => {}
        }
        if let Some(pc) = r.get("provider_config") {
            if pc.is_mapping() {
                let overlay = yaml_to_json(pc);
                let merged = match record.provider_config.take() {
                    Some(mut base) => {
                        merge_json(&mut base, overlay);
                        base
                    }
                    None => overlay,
                };
                record.provider_config = Some(merged);
            } else {
                ctx.error(format!("{path}.provider_config must be a mapping"));
            }
        }
        if let Some(v) = r.bool(ctx, "strict_mcp_config") {
            record.strict_mcp_config = v;
        }
        if let Some(v) = r.bool(ctx, "queue_prompts") {
            record.queue_prompts = v;
        }
        if let Some(env) = r.get("env") {
            record.env = agent_env(ctx, &format!("{path}.env"), env);
        }
        if let Some(pricing) = r.get("pricing") {
            record.pricing = agent_pricing(ctx, &format!("{path}.pricing"), pricing);
        }
        if let Some(patterns) = rate_limit_patterns(ctx, &r, &path) {
            record.rate_limit_patterns = patterns;
        }
        if let Some(v) = r.positive_int(ctx, "cooldown_ms") {
            record.cooldown_ms = v;
        }
        match r
            .one_of(ctx, "cooldown_scope", &["fleet", "host"])
            .as_deref()
        {
            Some("host") => record.cooldown_scope = CooldownScope::Host,
            Some(_) => record.cooldown_scope = CooldownScope::Fleet,
            None => {}
        }
        if let Some(list) = r.string_list(ctx, "fallback") {
            record.fallback = list.iter().map(|k| k.trim().to_string()).collect();
        }
        if let Some(v) = r.bool(ctx, "route_fallback") {
            record.route_fallback = v;
        }
    }
    // Fallback lists name other configured kinds (after every record is read).
    for (kind, record) in &kinds {
        for (n, other) in record.fallback.iter().enumerate() {
            if other == kind {
                ctx.error_with_hint(
                    format!("agents.{kind}.fallback[{n}] names {kind} itself"),
                    "list other kinds, to take its runs while it cools down",
                );
            } else if !kinds.contains_key(other) {
                ctx.error_with_hint(
                    format!("agents.{kind}.fallback[{n}] names {other}, which has no agents.{other} record"),
                    "use agent_a, agent_b or a kind configured under agents:",
                );
            }
        }
    }
    if !kinds.contains_key(&agent.kind) {
        ctx.error_with_hint(
            format!(
                "agent.kind {} has no agents.{} record",
                agent.kind, agent.kind
            ),
            "use agent_a, agent_b or a kind configured under agents:",
        );
    }
    (
        agent,
        AgentsSettings {
            turn_timeout_ms: shared_turn,
            stall_timeout_ms: shared_stall,
            kinds,
        },
    )
}

fn builtin_record(kind: &str, turn: u64, stall: u64) -> AgentRecord {
    let (bridge, provider_config) = match kind {
        "agent_a" => ("agent-a-acp", None),
        _ => (
            "agent-b-acp",
            Some(
                serde_json::json!({"model": AGENT_B_MODEL, "permissions": {"defaultMode": "dontAsk"}}),
            ),
        ),
    };
    AgentRecord {
        kind: kind.to_string(),
        turn_timeout_ms: turn,
        stall_timeout_ms: stall,
        bridge_command: bridge.to_string(),
        usage_accounting: UsageAccounting::PerTurn,
        provider_config,
        strict_mcp_config: true,
        builtin_only: true,
        queue_prompts: false,
        env: Vec::new(),
        pricing: None,
        rate_limit_patterns: default_rate_limit_patterns(),
        cooldown_ms: DEFAULT_COOLDOWN_MS,
        cooldown_scope: CooldownScope::Fleet,
        fallback: Vec::new(),
        route_fallback: false,
    }
}

fn default_rate_limit_patterns() -> Vec<String> {
    DEFAULT_RATE_LIMIT_PATTERNS
        .iter()
        .map(|p| p.to_string())
        .collect()
}

/// `agents.<kind>.rate_limit_patterns`: a list of regular expressions, each of which must
/// compile.
fn rate_limit_patterns(ctx: &mut Ctx, r: &Section, path: &str) -> Option<Vec<String>> {
    let list = r.string_list(ctx, "rate_limit_patterns")?;
    let mut ok = true;
    for (n, pattern) in list.iter().enumerate() {
        if let Err(e) = regex::Regex::new(pattern) {
            ok = false;
            let why = e.to_string();
            let why = why.lines().last().unwrap_or("invalid").trim().to_string();
            ctx.error_with_hint(
                format!("{path}.rate_limit_patterns[{n}] is not a valid regular expression: {why}"),
                "write it in Rust regex syntax (https://docs.rs/regex/#syntax), or remove it",
            );
        }
    }
    ok.then_some(list)
}

/// Deep-merges `overlay` into `base` (objects merge key by key; anything else replaces).
pub fn merge_json(base: &mut serde_json::Value, overlay: serde_json::Value) {
    match (base, overlay) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) => merge_json(existing, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

fn merge_yaml(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) => merge_yaml(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

fn status_overrides(
    ctx: &mut Ctx,
    root: &Value,
    value: Option<&Value>,
) -> BTreeMap<String, StateOverride> {
    let states = Section::read(ctx, "status_overrides", value, Style::Snake, None);
    let mut out = BTreeMap::new();
    for (_, state, fragment) in &states.entries {
        let path = format!("status_overrides.{state}");
        let f = Section::read(
            ctx,
            &path,
            Some(fragment),
            Style::Snake,
            Some(&["agent", "agents", "agent_a", "agent_b"]),
        );
        let mut ok = true;
        // Per-kind fragments may not change the executor or the skills.
        let per_kind = f.section(ctx, "agents", Style::Snake, None);
        for (_, kind, record) in &per_kind.entries {
            if let Some(m) = record.as_mapping() {
                for key in ["executor", "skills"] {
                    if m.contains_key(key) {
                        ctx.error(format!("{path}.agents.{kind}.{key} is not supported"));
                        ok = false;
                    }
                }
            }
        }
        // Budgets hold for an issue whatever its state, and for the day: not per state.
        if let Some(m) = f.get("agent").and_then(Value::as_mapping) {
            for key in [
                "max_tokens_per_issue",
                "max_cost_usd_per_issue",
                "daily_budget_usd",
            ] {
                if m.contains_key(key) {
                    ctx.error(format!(
                        "{path}.agent.{key} is not supported (budgets hold for an issue in every state; set agent.{key})"
                    ));
                    ok = false;
                }
            }
        }
        if !ok {
            continue;
        }
        let mut merged = root.clone();
        let merged_map = merged.as_mapping_mut().expect("front matter is a mapping");
        for (key, _, v) in &f.entries {
            let k = Value::String(key.clone());
            match merged_map.get_mut(&k) {
                Some(existing) => merge_yaml(existing, v),
                None => {
                    merged_map.insert(k, (*v).clone());
                }
            }
        }
        // Re-validate the merged agent settings; report only what the fragment broke.
        // The base's own errors are already reported (the base sections were read first).
        let mut inner = Ctx::new(ctx.env, &mut *ctx.secrets);
        let (agent, agents) = agent_sections(&mut inner, &merged, false);
        let inner_errors = inner.errors;
        let new_errors: Vec<ConfigError> = inner_errors
            .into_iter()
            .filter(|e| !ctx.errors.contains(e))
            .collect();
        for e in new_errors {
            ctx.errors.push(ConfigError {
                message: format!("{path}: {}", e.message),
                hint: e.hint,
            });
        }
        let sets_cap = f
            .get("agent")
            .and_then(Value::as_mapping)
            .is_some_and(|m| m.contains_key("max_concurrent_agents"));
        let max_concurrent_agents = sets_cap.then_some(agent.max_concurrent_agents);
        out.insert(
            state.trim().to_lowercase(),
            StateOverride {
                max_concurrent_agents,
                agent,
                agents,
            },
        );
    }
    out
}

fn server(ctx: &mut Ctx, value: Option<&Value>) -> ServerSettings {
    let s = section(
        ctx,
        "server",
        value,
        &[
            "host",
            "port",
            "mcp_port",
            "webhook_port",
            "webhook_host",
            "trace_dir",
            "issue_store_path",
            "static_dir",
        ],
    );
    let path_or = |ctx: &mut Ctx, key: &str, default: &str| {
        let raw = s.string(ctx, key).unwrap_or_else(|| default.to_string());
        ctx.env.resolve_path(&raw)
    };
    ServerSettings {
        host: s
            .non_blank_string(ctx, "host")
            .unwrap_or_else(|| "127.0.0.1".to_string()),
        port: s
            .int_in(ctx, "port", 0, 65535, "a valid port (0-65535)")
            .unwrap_or(4040) as u16,
        mcp_port: s
            .int_in(ctx, "mcp_port", 1, 65535, "an integer from 1 to 65535")
            .map(|p| p as u16),
        webhook_port: s
            .int_in(ctx, "webhook_port", 1, 65535, "an integer from 1 to 65535")
            .map(|p| p as u16),
        webhook_host: s
            .non_blank_string(ctx, "webhook_host")
            .unwrap_or_else(|| "127.0.0.1".to_string()),
        trace_dir: path_or(ctx, "trace_dir", "~/.svc/issues"),
        issue_store_path: path_or(ctx, "issue_store_path", "~/.svc/issues.db"),
        static_dir: s
            .string(ctx, "static_dir")
            .map(|p| ctx.env.resolve_path(&p)),
    }
}
