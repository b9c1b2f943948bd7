//! Table-driven tests of the workflow contract: one row per rule of the spec.

use std::path::Path;

use super::*;

fn load_with(yaml: &str, vars: &[(&str, &str)]) -> Result<Loaded, (Vec<String>, Vec<Warning>)> {
    let text = format!("---\n{yaml}\n---\nWork on {{{{ issue.identifier }}}}.\n");
    let file = workflow::parse(Path::new("/w/WORKFLOW.md"), &text).expect("front matter parses");
    let mut pairs = vec![("HOME", "/home/u"), ("PATH", "/nonexistent")];
    pairs.extend_from_slice(vars);
    let env = Env::from_pairs(pairs, Path::new("/w"));
    match from_workflow(
        &file,
        &env,
        &mut SecretResolver::new(crate::process::run_program),
    ) {
        Ok(l) => Ok(l),
        Err(LoadError::Invalid {
            errors, warnings, ..
        }) => Err((errors.into_iter().map(|e| e.message).collect(), warnings)),
        Err(e) => panic!("{e}"),
    }
}

fn load(yaml: &str) -> Result<Loaded, Vec<String>> {
    load_with(yaml, &[]).map_err(|(e, _)| e)
}

const MEMORY: &str = "tracker:\n  kind: memory\n";

#[test]
fn error_rows() {
    // (yaml, expected message)
    let rows: &[(&str, &str)] = &[
        ("polling:\n  interval_ms: 5", "tracker.kind is required"),
        (
            "tracker:\n  kind: memory\npolling:\n  interval: 5",
            "polling.interval is not supported",
        ),
        ("tracker:\n  kind: memory\nfoo: 1", "foo is not supported"),
        (
            "tracker:\n  kind: memory\n  active_states: Todo",
            "tracker.active_states must be a list of strings",
        ),
        (
            "tracker:\n  kind: memory\n  terminal_states: [1, 2]",
            "tracker.terminal_states must be a list of strings",
        ),
        (
            "tracker:\n  kind: memory\n  dispatch:\n    accept_unrouted: maybe",
            "tracker.dispatch.accept_unrouted must be a boolean",
        ),
        (
            "tracker:\n  kind: memory\n  dispatch:\n    routes: []",
            "tracker.dispatch.routes is not supported",
        ),
        (
            "tracker:\n  kind: local\n  base_url: 5",
            "tracker.baseUrl is not supported",
        ),
        (
            "tracker:\n  kind: local\n  path: 5",
            "tracker.path must be a string",
        ),
        (
            "tracker:\n  kind: local\n  path: ''",
            "tracker.path must not be empty",
        ),
        (
            "tracker:\n  kind: local\n  id_prefix: -X",
            "tracker.idPrefix must start with a letter or digit",
        ),
        (
            "tracker:\n  kind: memory\n  jql: x",
            "tracker.jql is not supported",
        ),
        (
            "tracker:\n  kind: nope",
            "tracker.kind nope is not a registered tracker",
        ),
        (
            "tracker:\n  kind: work\ntrackers:\n  work:\n    path: /b",
            "trackers.work.provider is required",
        ),
        (
            "tracker:\n  kind: tracker-b\n  base_url: 7\n  email: a\n  api_key: k\n  jql: x",
            "tracker.baseUrl must be a string",
        ),
        (
            "tracker:\n  kind: tracker-a\n  project_slugs: [a]",
            "tracker.apiKey is required",
        ),
        (
            "tracker:\n  kind: tracker-a\n  api_key: k",
            "tracker needs exactly one of projectSlugs, projectLabels or projectSlug",
        ),
        (
            "tracker:\n  kind: tracker-a\n  api_key: k\n  project_slugs: [a]\n  project_labels: [b]",
            "tracker needs exactly one of projectSlugs, projectLabels or projectSlug",
        ),
        (
            "tracker:\n  kind: tracker-b\n  base_url: https://x\n  email: a\n  api_key: k",
            "tracker needs at least one of jql or projectKeys",
        ),
        (
            "tracker:\n  kind: tracker-b\n  jql: x",
            "tracker.baseUrl is required",
        ),
        (
            "tracker:\n  kind: tracker-b\n  jql: x",
            "tracker.email is required",
        ),
        (
            "tracker:\n  kind: tracker-b\n  jql: x",
            "tracker.apiKey is required",
        ),
        (
            "tracker:\n  kind: tracker-b-mcp\n  jql: x",
            "tracker.mcp.url is required",
        ),
        (
            "tracker:\n  kind: tracker-b-mcp\n  jql: x\n  mcp:\n    url: http://m\n    tools:\n      frobnicate: y",
            "tracker.mcp.tools.frobnicate is not supported",
        ),
        (
            "tracker:\n  kind: tracker-b-mcp\n  jql: x\n  email: e\n  mcp:\n    url: http://m",
            "tracker.email is not supported",
        ),
        (
            "tracker:\n  kind: chat-a\n  channels: [C1]\n  bot_user_id: U1\n  assignee: me",
            "tracker.assignee is not supported",
        ),
        (
            "tracker:\n  kind: chat-a\n  bot_user_id: U1",
            "tracker.channels is required",
        ),
        (
            "tracker:\n  kind: chat-a\n  channels: [C1]",
            "tracker.botUserId is required",
        ),
        (
            "tracker:\n  kind: chat-b\n  channels: [C1]\n  bot_user_id: U\n  api_key: t",
            "tracker.guildId is required",
        ),
        (
            "tracker:\n  kind: chat-b\n  guild_id: G\n  channels: [C1]\n  bot_user_id: U\n  api_key: t\n  reply_lookback_days: 2",
            "tracker.replyLookbackDays is not supported",
        ),
        (
            "tracker:\n  kind: memory\ntools:\n  chat_b:\n    reply_lookback_days: 2",
            "tools.chat_b.replyLookbackDays is not supported",
        ),
        (
            "tracker:\n  kind: memory\ntools:\n  chat_a:\n    guild_id: G",
            "tools.chat_a.guildId is not supported",
        ),
        (
            "tracker:\n  kind: memory\ntools:\n  tracker_a:\n    token: x",
            "tools.tracker_a.token is not supported",
        ),
        (
            "tracker:\n  kind: memory\ntools:\n  local:\n    dir: x",
            "tools.local.dir is not supported",
        ),
        (
            "tracker:\n  kind: memory\ntools:\n  tracker: {}",
            "tools.tracker is not supported",
        ),
        (
            "tracker:\n  kind: memory\ntools:\n  gitea: {}",
            "tools.gitea is not supported",
        ),
        (
            "tracker:\n  kind: memory\npolling:\n  interval_ms: 0",
            "polling.interval_ms must be a positive integer",
        ),
        (
            "tracker:\n  kind: memory\npolling:\n  interval_ms: '30000'",
            "polling.interval_ms must be a positive integer",
        ),
        (
            "tracker:\n  kind: memory\nworkspace:\n  isolation: shared",
            "workspace.isolation must be one of: per-agent, none",
        ),
        (
            "tracker:\n  kind: memory\nworkspace:\n  isolation: none\nhooks:\n  after_create: echo",
            "hooks.after_create cannot be used with workspace.isolation: none",
        ),
        (
            "tracker:\n  kind: memory\nworker:\n  ssh_hosts: [a]\n  worker_pool:\n    driver: static-ssh",
            "worker.ssh_hosts cannot combine with worker_pool.driver or worker.kind",
        ),
        (
            "tracker:\n  kind: memory\nworker:\n  ssh_hosts: [a]\n  kind: big\nworkers:\n  big:\n    driver: docker\n    image: i",
            "worker.ssh_hosts cannot combine with worker_pool.driver or worker.kind",
        ),
        (
            "tracker:\n  kind: memory\nworker:\n  worker_pool:\n    min: 3\n    max: 2",
            "worker.worker_pool.max must be >= worker.worker_pool.min",
        ),
        (
            "tracker:\n  kind: memory\nworker:\n  worker_pool:\n    max: 2\n    warm: 3",
            "worker.worker_pool.warm must be <= worker.worker_pool.max",
        ),
        (
            "tracker:\n  kind: memory\nworker:\n  worker_pool:\n    max_in_flight: 2",
            "worker.worker_pool.max_in_flight above 1 needs worker.worker_pool.co_residence: true",
        ),
        (
            "tracker:\n  kind: memory\nworker:\n  worker_pool:\n    enabled: true",
            "worker.worker_pool.enabled is not supported",
        ),
        (
            "tracker:\n  kind: memory\nworkers:\n  w:\n    image: x",
            "workers.w.driver is required",
        ),
        (
            "tracker:\n  kind: memory\nworkers:\n  w:\n    driver: static-ssh",
            "workers.w.ssh_hosts is required for the static-ssh driver",
        ),
        (
            "tracker:\n  kind: memory\nworkers:\n  w:\n    driver: docker",
            "workers.w.image is required for the docker driver",
        ),
        (
            "tracker:\n  kind: memory\nworker:\n  worker_pool:\n    driver: docker",
            "worker.worker_pool.driver docker needs a workers.<name> profile with an image",
        ),
        (
            "tracker:\n  kind: memory\nworker:\n  ssh_hosts: [h]\n  kind: box\nworkers:\n  box:\n    driver: fake",
            "worker.ssh_hosts cannot combine with worker_pool.driver or worker.kind",
        ),
        (
            "tracker:\n  kind: memory\nhooks:\n  timeout_ms: -1",
            "hooks.timeout_ms must be a positive integer",
        ),
        (
            "tracker:\n  kind: memory\nhooks:\n  on_start: x",
            "hooks.on_start is not supported",
        ),
        (
            "tracker:\n  kind: memory\nagent:\n  max_turns: 0",
            "agent.max_turns must be a positive integer",
        ),
        (
            "tracker:\n  kind: memory\nagent:\n  max_tokens_per_issue: 0",
            "agent.max_tokens_per_issue must be a positive integer",
        ),
        (
            "tracker:\n  kind: memory\nagent:\n  max_cost_usd_per_issue: -1",
            "agent.max_cost_usd_per_issue must be a positive number",
        ),
        (
            "tracker:\n  kind: memory\nagent:\n  daily_budget_usd: lots",
            "agent.daily_budget_usd must be a positive number",
        ),
        (
            "tracker:\n  kind: memory\ndaemon:\n  daily_budget_usd: 0",
            "daemon.daily_budget_usd must be a positive number",
        ),
        (
            "tracker:\n  kind: memory\ndaemon:\n  daily_budget_usd: ten",
            "daemon.daily_budget_usd must be a positive number",
        ),
        (
            "tracker:\n  kind: memory\ndaemon:\n  max_concurrent_agents: 0",
            "daemon.max_concurrent_agents must be a positive integer",
        ),
        (
            "tracker:\n  kind: memory\ndaemon:\n  max_concurrent_agents: 2.5",
            "daemon.max_concurrent_agents must be a positive integer",
        ),
        (
            "tracker:\n  kind: memory\ndaemon:\n  max_agents: 2",
            "daemon.max_agents is not supported",
        ),
        (
            "tracker:\n  kind: memory\ndaemon: 5",
            "daemon must be a mapping",
        ),
        (
            "tracker:\n  kind: memory\nname: [a]",
            "name must be a string",
        ),
        (
            "tracker:\n  kind: memory\nname: \"a:b\"",
            "name \"a:b\" is not a valid workflow name",
        ),
        (
            "tracker:\n  kind: memory\nagent:\n  skills: a",
            "agent.skills must be a list of strings",
        ),
        (
            "tracker:\n  kind: memory\nagent:\n  kind: agent_c",
            "agent.kind agent_c has no agents.agent_c record",
        ),
        (
            "tracker:\n  kind: memory\nagent:\n  ensemble_size: 65",
            "agent.ensemble_size must be at most 64",
        ),
        (
            "tracker:\n  kind: memory\nagents:\n  stall_timeout_ms: -5",
            "agents.stall_timeout_ms must be a non-negative integer",
        ),
        (
            "tracker:\n  kind: memory\nagents:\n  turn_timeout_ms: 0",
            "agents.turn_timeout_ms must be a positive integer",
        ),
        (
            "tracker:\n  kind: memory\nagents:\n  agent_a:\n    executor: shell",
            "agents.agent_a.executor must be acp",
        ),
        (
            "tracker:\n  kind: memory\nagents:\n  agent_a:\n    bridge_command: '  '",
            "agents.agent_a.bridge_command must not be blank",
        ),
        (
            "tracker:\n  kind: memory\nagents:\n  mine:\n    turn_timeout_ms: 5",
            "agents.mine.bridge_command is required",
        ),
        (
            "tracker:\n  kind: memory\nagents:\n  agent_a:\n    bridge_args: [x]",
            "agents.agent_a.bridge_args is not supported",
        ),
        (
            "tracker:\n  kind: memory\nagents:\n  agent_a:\n    usage_accounting: total",
            "agents.agent_a.usage_accounting must be one of: per-turn, cumulative",
        ),
        (
            "tracker:\n  kind: memory\nagents:\n  agent_b:\n    provider_config: x",
            "agents.agent_b.provider_config must be a mapping",
        ),
        (
            "tracker:\n  kind: memory\nagent_a:\n  model: x",
            "agent_a.model is not supported",
        ),
        (
            "tracker:\n  kind: memory\nstatus_overrides:\n  Todo:\n    agents:\n      agent_a:\n        executor: acp",
            "status_overrides.Todo.agents.agent_a.executor is not supported",
        ),
        (
            "tracker:\n  kind: memory\nstatus_overrides:\n  Todo:\n    agents:\n      agent_a:\n        skills: [x]",
            "status_overrides.Todo.agents.agent_a.skills is not supported",
        ),
        (
            "tracker:\n  kind: memory\nstatus_overrides:\n  Todo:\n    agent:\n      daily_budget_usd: 5",
            "status_overrides.Todo.agent.daily_budget_usd is not supported",
        ),
        (
            "tracker:\n  kind: memory\nstatus_overrides:\n  Todo:\n    hooks: {}",
            "status_overrides.Todo.hooks is not supported",
        ),
        (
            "tracker:\n  kind: memory\nstatus_overrides:\n  Todo:\n    agent:\n      max_turns: nope",
            "status_overrides.Todo: agent.max_turns must be a positive integer",
        ),
        (
            "tracker:\n  kind: memory\nobservability:\n  dashboard_enabled: 1",
            "observability.dashboard_enabled must be a boolean",
        ),
        (
            "tracker:\n  kind: memory\nserver:\n  port: 70000",
            "server.port must be a valid port (0-65535)",
        ),
        (
            "tracker:\n  kind: memory\nserver:\n  mcp_port: 0",
            "server.mcp_port must be an integer from 1 to 65535",
        ),
        (
            "tracker:\n  kind: memory\nserver:\n  webhook_port: 0",
            "server.webhook_port must be an integer from 1 to 65535",
        ),
        (
            "tracker:\n  kind: memory\nserver:\n  webhook_port: 70000",
            "server.webhook_port must be an integer from 1 to 65535",
        ),
        (
            "tracker:\n  kind: memory\nserver:\n  webhook_host: \" \"",
            "server.webhook_host must not be blank",
        ),
        (
            "tracker:\n  kind: memory\nserver:\n  tls: true",
            "server.tls is not supported",
        ),
        (
            "tracker:\n  kind: memory\nlogging:\n  level: debug",
            "logging.level is not supported",
        ),
        (
            "tracker:\n  kind: memory\nlogging:\n  log_file: [a]",
            "logging.log_file must be a string",
        ),
        (
            "tracker:\n  kind: memory\npolling: 5",
            "polling must be a mapping",
        ),
        (
            "tracker:\n  kind: memory\npolling:\n  interval_ms: 5\n  intervalMs: 6",
            "polling.intervalMs is given twice (also as interval_ms)",
        ),
    ];
    let mut failures = Vec::new();
    for (yaml, expected) in rows {
        match load(yaml) {
            Ok(_) => failures.push(format!("{yaml:?}: loaded, expected {expected:?}")),
            Err(errors) => {
                if !errors.iter().any(|e| e.starts_with(expected)) {
                    failures.push(format!("{yaml:?}: expected {expected:?}, got {errors:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_error_in_a_file_is_reported_at_once() {
    let errors =
        load("polling:\n  interval_ms: nope\n  bogus: 1\nagent:\n  max_turns: x").unwrap_err();
    for expected in [
        "tracker.kind is required",
        "polling.interval_ms must be a positive integer",
        "polling.bogus is not supported",
        "agent.max_turns must be a positive integer",
    ] {
        assert!(
            errors.iter().any(|e| e == expected),
            "{expected} missing from {errors:?}"
        );
    }
}

#[test]
fn the_name_key_and_the_daemon_section() {
    let s = load("tracker:\n  kind: memory\n").unwrap().settings;
    assert_eq!(s.name, None);
    assert_eq!(s.daemon, DaemonSettings::default());
    let s = load(
        "name: api.v2\ntracker:\n  kind: memory\ndaemon:\n  max_concurrent_agents: 4\n  daily_budget_usd: 12.5",
    )
    .unwrap()
    .settings;
    assert_eq!(s.name.as_deref(), Some("api.v2"));
    assert_eq!(
        s.daemon,
        DaemonSettings {
            max_concurrent_agents: Some(4),
            daily_budget_usd: Some(12.5)
        }
    );
    assert_eq!(
        load("tracker:\n  kind: memory\ndaemon:\n  daily_budget_usd: 3")
            .unwrap()
            .settings
            .daemon
            .daily_budget_usd,
        Some(3.0)
    );
}

#[test]
fn defaults_match_the_spec() {
    let s = load(MEMORY).unwrap().settings;
    assert_eq!(s.tracker.active_states, ["Todo", "In Progress"]);
    assert_eq!(
        s.tracker.terminal_states,
        ["Closed", "Cancelled", "Canceled", "Duplicate", "Done"]
    );
    assert!(s.tracker.dispatch.accept_unrouted);
    assert_eq!(s.tracker.dispatch.only_routes, None);
    assert_eq!(s.tracker.dispatch.route_label_prefix, "Svc:");
    assert_eq!(s.polling.interval_ms, 30_000);
    assert_eq!(s.workspace.root, Path::new("/tmp/svc_workspaces"));
    assert_eq!(s.workspace.isolation, Isolation::PerAgent);
    assert_eq!(s.worker.ssh_timeout_ms, 60_000);
    assert!(s.worker.worker_pool.is_none());
    assert_eq!(s.hooks.timeout_ms, 60_000);
    assert_eq!(s.agent.kind, "agent_a");
    assert_eq!(s.agent.max_concurrent_agents, 10);
    assert_eq!(s.agent.max_turns, 20);
    assert_eq!(s.agent.max_retry_backoff_ms, 300_000);
    assert_eq!(s.agent.ensemble_size, 1);
    assert!(s.agent.skills.is_empty());
    assert_eq!(s.agents.turn_timeout_ms, 3_600_000);
    assert_eq!(s.agents.stall_timeout_ms, 300_000);
    let a = &s.agents.kinds["agent_a"];
    assert_eq!(a.bridge_command, "agent-a-acp");
    assert_eq!(a.usage_accounting, UsageAccounting::PerTurn);
    assert!(a.strict_mcp_config);
    let b = &s.agents.kinds["agent_b"];
    assert_eq!(b.bridge_command, "agent-b-acp");
    assert_eq!(
        b.provider_config.as_ref().unwrap()["permissions"]["defaultMode"],
        "dontAsk"
    );
    assert!(b.provider_config.as_ref().unwrap()["model"].is_string());
    assert!(s.observability.dashboard_enabled);
    assert_eq!(s.observability.refresh_ms, 1000);
    assert_eq!(s.observability.render_interval_ms, 16);
    assert_eq!(s.server.host, "127.0.0.1");
    assert_eq!(s.server.port, 4040);
    assert_eq!(s.server.mcp_port, None);
    assert_eq!(s.server.webhook_port, None);
    assert_eq!(s.server.webhook_host, "127.0.0.1");
    assert!(s.tracker.webhook_secret.is_none());
    assert_eq!(s.server.trace_dir, Path::new("/home/u/.svc/issues"));
    assert_eq!(
        s.server.issue_store_path,
        Path::new("/home/u/.svc/issues.db")
    );
    assert_eq!(s.logging.log_file, Path::new("/home/u/.svc/log/svc.log"));
    assert_eq!(s.prompt_template, "Work on {{ issue.identifier }}.\n");
}

#[test]
fn worker_pool_defaults_apply_when_the_block_is_present() {
    // The default driver of a present block is `fake`.
    let s = load("tracker:\n  kind: memory\nworker:\n  worker_pool: {}")
        .unwrap()
        .settings;
    assert_eq!(s.worker.worker_pool.unwrap().driver, "fake");
    let s = load("tracker:\n  kind: memory\nworker:\n  worker_pool:\n    driver: local")
        .unwrap()
        .settings;
    let pool = s.worker.worker_pool.unwrap();
    assert_eq!(
        (pool.min, pool.max, pool.warm, pool.max_in_flight),
        (0, 1, 1, 1)
    );
    assert_eq!(
        (pool.ttl_ms, pool.idle_reap_ms, pool.acquire_timeout_ms),
        (3_600_000, 300_000, 30_000)
    );
    assert_eq!(
        (
            pool.reap_interval_ms,
            pool.stale_heartbeat_ms,
            pool.drain_deadline_ms
        ),
        (15_000, 600_000, 30_000)
    );
}

#[test]
fn local_path_and_prefix_rules() {
    let s = load("tracker:\n  kind: local").unwrap().settings;
    let ProviderOptions::Local(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.path, Path::new("/w/.svc/local"));
    assert_eq!(o.id_prefix, "BOARD-");
    let s = load_with(
        "tracker:\n  kind: local\n  path: ~/b/${TEAM}/$X\n  idPrefix: T_1-",
        &[("TEAM", "core"), ("X", "q")],
    )
    .unwrap()
    .settings;
    let ProviderOptions::Local(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.path, Path::new("/home/u/b/core/q"));
    assert_eq!(o.id_prefix, "T_1-");
}

#[test]
fn bundle_shape_merges_selector_options_and_does_not_warn() {
    let yaml = "tracker:\n  kind: team\n  active_states: [Ready]\ntrackers:\n  team:\n    provider: local\n    path: /boards/team\n    id_prefix: TEAM-";
    let loaded = load(yaml).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let t = &loaded.settings.tracker;
    assert_eq!((t.kind.as_str(), t.provider), ("team", Provider::Local));
    assert_eq!(t.active_states, ["Ready"]);
    let ProviderOptions::Local(o) = &t.options else {
        panic!()
    };
    assert_eq!(
        (o.path.as_path(), o.id_prefix.as_str()),
        (Path::new("/boards/team"), "TEAM-")
    );
    // Errors in a bundle name the bundle.
    let errors =
        load("tracker:\n  kind: team\ntrackers:\n  team:\n    provider: local\n    color: red")
            .unwrap_err();
    assert!(
        errors.contains(&"trackers.team.color is not supported".to_string()),
        "{errors:?}"
    );
}

#[test]
fn flat_shape_and_project_slug_warn_as_deprecations() {
    let (_, warnings) = load_with(
        "tracker:\n  kind: tracker-a\n  api_key: k\n  project_slug: core",
        &[],
    )
    .map(|l| ((), l.warnings))
    .unwrap();
    let checks: Vec<&str> = warnings.iter().map(|w| w.check.as_str()).collect();
    assert!(
        checks.contains(&"config_deprecation_flat_tracker"),
        "{checks:?}"
    );
    assert!(
        checks.contains(&"config_deprecation_project_slug"),
        "{checks:?}"
    );
    let loaded = load("tracker:\n  kind: local\n  path: /b").unwrap();
    assert_eq!(loaded.warnings[0].check, "config_deprecation_flat_tracker");
    assert!(loaded.warnings[0].message.contains("path"));
}

#[test]
fn legacy_agent_sections_map_into_agents_and_warn_per_key() {
    let yaml = "tracker:\n  kind: memory\nagent_b:\n  command: my-bridge --x\n  model: opus\n  turn_timeout_ms: 5\nagents:\n  agent_b:\n    turn_timeout_ms: 9";
    let loaded = load(yaml).unwrap();
    let b = &loaded.settings.agents.kinds["agent_b"];
    assert_eq!(b.bridge_command, "my-bridge --x");
    assert_eq!(b.bridge_argv(), ["my-bridge", "--x"]);
    assert_eq!(b.turn_timeout_ms, 9, "the canonical key wins");
    // The built-in record pins a model, and the legacy key only fills an unset one.
    assert_ne!(b.provider_config.as_ref().unwrap()["model"], "opus");
    let messages: Vec<&str> = loaded.warnings.iter().map(|w| w.message.as_str()).collect();
    assert!(
        messages.contains(&"agent_b.command is deprecated: use agents.agent_b.bridge_command"),
        "{messages:?}"
    );
    assert!(
        messages.contains(&"agent_b.model is deprecated: use agents.agent_b.provider_config.model"),
        "{messages:?}"
    );
    assert_eq!(loaded.warnings.len(), 3);
    let a = load("tracker:\n  kind: memory\nagent_a:\n  command: codex-acp\nagents:\n  agent_a:\n    bridge_command: other").unwrap();
    assert_eq!(a.settings.agents.kinds["agent_a"].bridge_command, "other");
}

#[test]
fn custom_agent_kinds_and_provider_config_overlays() {
    let yaml = "tracker:\n  kind: memory\nagent:\n  kind: demo\nagents:\n  stall_timeout_ms: 0\n  demo:\n    bridge_command: svc demo-agent\n    usage_accounting: cumulative\n  agent_b:\n    provider_config:\n      permissions:\n        allow: [Bash]";
    let s = load(yaml).unwrap().settings;
    let demo = &s.agents.kinds["demo"];
    assert_eq!(demo.stall_timeout_ms, 0);
    assert_eq!(demo.usage_accounting, UsageAccounting::Cumulative);
    let pc = s.agents.kinds["agent_b"].provider_config.clone().unwrap();
    assert_eq!(
        pc["permissions"]["defaultMode"], "dontAsk",
        "overlay merges onto the built-in record"
    );
    assert_eq!(pc["permissions"]["allow"][0], "Bash");
}

#[test]
fn status_overrides_merge_onto_a_clone_of_the_base() {
    let yaml = "tracker:\n  kind: memory\nagent:\n  max_turns: 7\nstatus_overrides:\n  ' In Progress ':\n    agent:\n      kind: agent_b\n    agents:\n      agent_b:\n        turn_timeout_ms: 1000";
    let s = load(yaml).unwrap().settings;
    let (agent, agents) = s.agent_for_state("in progress");
    assert_eq!(agent.kind, "agent_b");
    assert_eq!(agent.max_turns, 7, "unset keys come from the base");
    assert_eq!(agents.kinds["agent_b"].turn_timeout_ms, 1000);
    let (base, base_agents) = s.agent_for_state("Todo");
    assert_eq!(base.kind, "agent_a");
    assert_eq!(base_agents.kinds["agent_b"].turn_timeout_ms, 3_600_000);
}

#[test]
fn agent_pricing_is_read_in_dollars_per_million_tokens_and_overridden_per_state() {
    let yaml = "tracker:\n  kind: memory\nagents:\n  agent_a:\n    pricing:\n      input: 3\n      output: 15.5\n      cached_input: 0.3\n  agent_b:\n    pricing: {input: 1, output: 2}\nstatus_overrides:\n  Review:\n    agents:\n      agent_a:\n        pricing:\n          output: 20";
    let s = load(yaml).unwrap().settings;
    let a = s.agents.kinds["agent_a"].pricing.unwrap();
    assert_eq!((a.input, a.output, a.cached_input), (3.0, 15.5, 0.3));
    let b = s.agents.kinds["agent_b"].pricing.unwrap();
    assert_eq!(b.cached_input, 1.0, "cached_input defaults to input");
    let (_, review) = s.agent_for_state("review");
    let r = review.kinds["agent_a"].pricing.unwrap();
    assert_eq!(
        (r.input, r.output, r.cached_input),
        (3.0, 20.0, 0.3),
        "the override's keys merge onto the base prices"
    );
    assert_eq!(
        load(MEMORY).unwrap().settings.agents.kinds["agent_a"].pricing,
        None
    );
    // 1,000 input, 500 cached, 200 output at 3 / 0.3 / 15.5 per million.
    assert!((a.cost_usd(1000, 500, 200) - 0.00625).abs() < 1e-12);
}

#[test]
fn bad_agent_pricing_is_rejected() {
    let rows: &[(&str, &str)] = &[
        (
            "pricing: {input: 1, output: 2, reasoning: 3}",
            "agents.agent_a.pricing.reasoning is not supported",
        ),
        (
            "pricing: {input: -1, output: 2}",
            "agents.agent_a.pricing.input must be a non-negative number",
        ),
        (
            "pricing: {input: 1, output: cheap}",
            "agents.agent_a.pricing.output must be a non-negative number",
        ),
        (
            "pricing: {input: 1, output: 2, cached_input: '0.1'}",
            "agents.agent_a.pricing.cached_input must be a non-negative number",
        ),
        (
            "pricing: {input: 1, output: .inf}",
            "agents.agent_a.pricing.output must be a non-negative number",
        ),
        (
            "pricing: {input: 1}",
            "agents.agent_a.pricing.output is required",
        ),
        ("pricing: 3", "agents.agent_a.pricing must be a mapping"),
    ];
    for (record, expected) in rows {
        let yaml = format!("tracker:\n  kind: memory\nagents:\n  agent_a:\n    {record}");
        let errors = load(&yaml).err().unwrap_or_default();
        assert!(
            errors.iter().any(|e| e == expected),
            "{record}: expected {expected:?}, got {errors:?}"
        );
    }
    let errors = load("tracker:\n  kind: memory\nstatus_overrides:\n  Todo:\n    agents:\n      agent_a:\n        pricing: {input: 1, output: 2, per_call: 1}").err().unwrap_or_default();
    assert!(
        errors
            .iter()
            .any(|e| e == "status_overrides.Todo: agents.agent_a.pricing.per_call is not supported"),
        "{errors:?}"
    );
}

#[test]
fn environment_overrides_and_ssh_config() {
    let s = load_with(
        MEMORY,
        &[
            ("SVC_WORKSPACE_ROOT", "~/ws"),
            ("SVC_SSH_CONFIG", "/etc/svc/ssh_config"),
        ],
    )
    .unwrap()
    .settings;
    assert_eq!(s.workspace.root, Path::new("/home/u/ws"));
    assert_eq!(
        s.worker.ssh_config.as_deref(),
        Some(Path::new("/etc/svc/ssh_config"))
    );
    let s = load_with(
        "tracker:\n  kind: memory\nworkspace:\n  root: rel/ws",
        &[("TMPDIR", "/scratch")],
    )
    .unwrap()
    .settings;
    assert_eq!(s.workspace.root, Path::new("/w/rel/ws"));
    let s = load_with(MEMORY, &[("TMPDIR", "/scratch")])
        .unwrap()
        .settings;
    assert_eq!(s.workspace.root, Path::new("/scratch/svc_workspaces"));
}

#[test]
fn secret_references_resolve_in_order() {
    let base = "tracker:\n  kind: tracker-a\n  project_slugs: [core]\n";
    // (a) a whole-value $VAR
    let s = load_with(
        &format!("{base}  api_key: $MY_KEY"),
        &[("MY_KEY", "from-var")],
    )
    .unwrap()
    .settings;
    let ProviderOptions::TrackerA(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.api_key.expose(), "from-var");
    // (b) an unset $VAR falls back to the provider's variable
    let s = load_with(
        &format!("{base}  api_key: $UNSET"),
        &[("TRACKER_A_API_KEY", "fallback")],
    )
    .unwrap()
    .settings;
    let ProviderOptions::TrackerA(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.api_key.expose(), "fallback");
    // ... and so does an absent key
    let s = load_with(base, &[("TRACKER_A_API_KEY", "fallback2")])
        .unwrap()
        .settings;
    let ProviderOptions::TrackerA(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.api_key.expose(), "fallback2");
    // substrings are never interpolated
    let s = load_with(&format!("{base}  api_key: pre$MY_KEY"), &[("MY_KEY", "x")])
        .unwrap()
        .settings;
    let ProviderOptions::TrackerA(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.api_key.expose(), "pre$MY_KEY");
    // (c) op:// with no op on PATH
    let errors = load_with(&format!("{base}  api_key: op://vault/item/field"), &[])
        .unwrap_err()
        .0;
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("1Password CLI (op) is required")),
        "{errors:?}"
    );
    // a bare op:// fallback resolves too (and so needs op)
    let errors = load_with(base, &[("TRACKER_A_API_KEY", "op://v/i/f")])
        .unwrap_err()
        .0;
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("1Password CLI (op) is required")),
        "{errors:?}"
    );
}

#[test]
fn references_resolve_in_every_string_value() {
    let yaml = "tracker:\n  kind: $KIND\n  active_states: [$STATE, Review]\n  dispatch:\n    route_label_prefix: $ROUTE_PREFIX\n    only_routes: [$ROUTE]\nworkspace:\n  root: $WS\nhooks:\n  before_run: $HOOK\n  after_run: echo $HOME/x\nagent:\n  kind: demo\nagents:\n  demo:\n    bridge_command: $BRIDGE\n    provider_config:\n      env:\n        TOKEN: $MODEL_TOKEN\nserver:\n  host: $HOST\n";
    let vars = [
        ("KIND", "memory"),
        ("STATE", "Ready"),
        ("ROUTE_PREFIX", "Team/"),
        ("ROUTE", "backend"),
        ("WS", "/srv/ws"),
        ("HOOK", "make setup"),
        ("BRIDGE", "svc demo-agent"),
        ("MODEL_TOKEN", "tok-1"),
        ("HOST", "127.0.0.2"),
    ];
    let s = load_with(yaml, &vars).unwrap().settings;
    assert_eq!(s.tracker.provider, Provider::Memory);
    assert_eq!(s.tracker.active_states, ["Ready", "Review"]);
    assert_eq!(s.tracker.dispatch.route_label_prefix, "Team/");
    assert_eq!(
        s.tracker.dispatch.only_routes,
        Some(vec!["backend".to_string()])
    );
    assert_eq!(s.workspace.root, Path::new("/srv/ws"));
    assert_eq!(s.hooks.before_run.as_deref(), Some("make setup"));
    // Substrings are never interpolated.
    assert_eq!(s.hooks.after_run.as_deref(), Some("echo $HOME/x"));
    assert_eq!(s.agents.kinds["demo"].bridge_command, "svc demo-agent");
    let config = s.agents.kinds["demo"].provider_config.as_ref().unwrap();
    assert_eq!(config["env"]["TOKEN"], "tok-1");
    assert_eq!(s.server.host, "127.0.0.2");
    // An unset variable is the empty string, which a key then judges like any empty value.
    let errors = load_with(yaml, &vars[..8]).unwrap_err().0;
    assert!(
        errors.iter().any(|e| e.contains("server.host")),
        "{errors:?}"
    );
    // The identity (the MCP token scope) holds the file as written, never resolved values.
    assert!(!s.identity.contains("Team/") && s.identity.contains("$ROUTE_PREFIX"));
}

#[test]
fn op_references_resolve_in_any_value_through_the_cli() {
    let bin = std::env::temp_dir().join(format!("svc-op-{}", std::process::id()));
    std::fs::create_dir_all(&bin).unwrap();
    let op = bin.join("op");
    std::fs::write(
        &op,
        "#!/bin/sh\ncase \"$1\" in --version) echo 2.30.0;; read) case \"$3\" in op://ops/routing/prefix) printf 'Team/';; op://ops/tracker/key) printf 'k-from-op';; *) echo \"no such item\" >&2; exit 1;; esac;; esac\n",
    )
    .unwrap();
    std::fs::set_permissions(&op, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = bin.display().to_string();
    let base = "tracker:\n  kind: tracker-a\n  project_slugs: [core]\n  api_key: $KEY_REF\n  dispatch:\n    route_label_prefix: op://ops/routing/prefix\n";
    let loaded = load_with(
        base,
        &[("PATH", &path), ("KEY_REF", "op://ops/tracker/key")],
    )
    .unwrap();
    let s = loaded.settings;
    assert_eq!(s.tracker.dispatch.route_label_prefix, "Team/");
    let ProviderOptions::TrackerA(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.api_key.expose(), "k-from-op");
    assert!(s.uses_op);
    // A failed read names the reference, never a value.
    let errors = load_with(
        "tracker:\n  kind: memory\nworkspace:\n  root: op://ops/missing/root\n",
        &[("PATH", &path)],
    )
    .unwrap_err()
    .0;
    assert_eq!(
        errors,
        ["Failed to resolve 1Password reference: op://ops/missing/root"]
    );
    let _ = std::fs::remove_dir_all(bin);
}

#[test]
fn assignee_fallback_and_blank_means_no_filter() {
    let base = "tracker:\n  kind: tracker-a\n  api_key: k\n  project_slugs: [core]\n";
    let s = load_with(base, &[("TRACKER_A_ASSIGNEE", "me")])
        .unwrap()
        .settings;
    let ProviderOptions::TrackerA(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.assignee.as_deref(), Some("me"));
    let s = load_with(&format!("{base}  assignee: '  '"), &[])
        .unwrap()
        .settings;
    let ProviderOptions::TrackerA(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.assignee, None);
}

#[test]
fn tracker_b_base_url_defaults_to_its_variable_and_mcp_tool_names_have_aliases() {
    let s = load_with(
        "tracker:\n  kind: tracker-b\n  project_keys: [ENG]",
        &[
            ("TRACKER_B_BASE_URL", "https://x.example"),
            ("TRACKER_B_EMAIL", "a@b"),
            ("TRACKER_B_API_KEY", "k"),
        ],
    )
    .unwrap()
    .settings;
    let ProviderOptions::TrackerB(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.base_url.expose(), "https://x.example");
    assert_eq!(o.scope.issue_type, "Task");
    let s = load(
        "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: tracker-b-mcp\n    jql: project = X\n    mcp:\n      url: http://m\n      token: $T\n      headers:\n        X-Team: core\n      tools:\n        readIssue: get_it\n        update_status: move_it",
    )
    .unwrap()
    .settings;
    let ProviderOptions::TrackerBMcp(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.tools.read_issue, "get_it");
    assert_eq!(o.tools.update_status, "move_it");
    assert_eq!(o.tools.search, "tracker_b_search");
    assert_eq!(o.tools.comment, "tracker_b_add_comment");
    assert_eq!(o.headers[0].0, "X-Team");
    assert_eq!(o.base_url, None);
}

#[test]
fn tracker_comment_sources_take_a_users_list() {
    let s = load(
        "tracker:\n  kind: tracker-a\n  api_key: k\n  project_slugs: [core]\n  users: [user-1, ann@example.com]",
    )
    .unwrap()
    .settings;
    let ProviderOptions::TrackerA(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.users, ["user-1", "ann@example.com"]);
    let s = load("tracker:\n  kind: tracker-b\n  base_url: https://x\n  email: a\n  api_key: k\n  jql: x\n  users: [acc-1]").unwrap().settings;
    let ProviderOptions::TrackerB(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.users, ["acc-1"]);
    let s = load(
        "tracker:\n  kind: tracker-b-mcp\n  jql: x\n  mcp:\n    url: http://m\n  users: [acc-2]",
    )
    .unwrap()
    .settings;
    let ProviderOptions::TrackerBMcp(o) = &s.tracker.options else {
        panic!()
    };
    assert_eq!(o.users, ["acc-2"]);
    // Empty by default; anything but a list of strings is refused.
    let s = load(
        "tracker:\n  kind: tracker-b\n  base_url: https://x\n  email: a\n  api_key: k\n  jql: x",
    )
    .unwrap()
    .settings;
    let ProviderOptions::TrackerB(o) = &s.tracker.options else {
        panic!()
    };
    assert!(o.users.is_empty());
    for yaml in [
        "tracker:\n  kind: tracker-a\n  api_key: k\n  project_slugs: [core]\n  users: ann",
        "tracker:\n  kind: tracker-b\n  base_url: https://x\n  email: a\n  api_key: k\n  jql: x\n  users: [1]",
        "tracker:\n  kind: tracker-b-mcp\n  jql: x\n  mcp:\n    url: http://m\n  users: {a: b}",
    ] {
        let errors = load(yaml).unwrap_err();
        assert!(
            errors
                .iter()
                .any(|e| e == "tracker.users must be a list of strings"),
            "{yaml}: {errors:?}"
        );
    }
    // The tracker_b pack's slice has no comment sources: `users` is not one of its keys.
    let errors =
        load("tracker:\n  kind: memory\ntools:\n  tracker_b:\n    users: [a]").unwrap_err();
    assert!(
        errors.iter().any(|e| e.contains("users is not supported")),
        "{errors:?}"
    );
}

#[test]
fn tool_slices_accept_aliases() {
    let s = load("tracker:\n  kind: memory\ntools:\n  tracker_a:\n    apiKey: k\n  local:\n    idPrefix: X-\n    path: /b").unwrap().settings;
    assert_eq!(s.tools.len(), 2);
    assert!(
        matches!(&s.tools[0].1, ToolOptions::TrackerA { api_key: Some(k), .. } if k.expose() == "k")
    );
    assert!(matches!(&s.tools[1].1, ToolOptions::Local(o) if o.id_prefix == "X-"));
}

#[test]
fn tool_mounting_is_first_seen_and_detects_collisions() {
    let names = |packs: Vec<&Pack>| packs.iter().map(|p| p.name).collect::<Vec<_>>();
    assert_eq!(
        names(mounted_packs(Provider::Local, ["tracker_a", "local"], PACKS).unwrap()),
        ["local", "tracker_a"]
    );
    assert!(
        mounted_packs(Provider::Memory, [], PACKS)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        names(mounted_packs(Provider::TrackerBMcp, [], PACKS).unwrap()),
        ["tracker_b"]
    );
    let registry = [
        Pack {
            name: "a",
            tools: &["x", "y", "x"],
        },
        Pack {
            name: "b",
            tools: &["y"],
        },
    ];
    let err = mounted_packs(Provider::Memory, ["a", "b"], &registry).unwrap_err();
    assert_eq!(
        err,
        "tool name collision: y is declared by both the \"a\" and \"b\" packs"
    );
}

#[test]
fn prompt_template_errors_are_config_errors() {
    let file = workflow::parse(
        Path::new("/w/W.md"),
        "---\ntracker:\n  kind: memory\n---\n{{ issue.title | nope }}\n",
    )
    .unwrap();
    let env = Env::from_pairs([("HOME", "/h")], Path::new("/w"));
    let Err(LoadError::Invalid { errors, .. }) =
        from_workflow(&file, &env, &mut SecretResolver::default())
    else {
        panic!()
    };
    assert!(
        errors[0].message.starts_with("prompt template:") && errors[0].message.contains("nope"),
        "{errors:?}"
    );
}

#[test]
fn secrets_never_appear_in_debug_output_or_errors() {
    let planted = "sk-planted-7f3a9c";
    let yaml = "tracker:\n  kind: tracker-b\n  base_url: https://x\n  email: $EMAIL\n  api_key: $KEY\n  jql: 5\n";
    let errors = load_with(yaml, &[("KEY", planted), ("EMAIL", "e@x")])
        .unwrap_err()
        .0;
    assert!(errors.iter().all(|e| !e.contains(planted)));
    let yaml = "tracker:\n  kind: tracker-b\n  base_url: https://x\n  email: e\n  api_key: $KEY\n  jql: project = X\n";
    let loaded = load_with(yaml, &[("KEY", planted)]).unwrap();
    let debug = format!("{:?}", loaded.settings);
    assert!(!debug.contains(planted), "{debug}");
    let ProviderOptions::TrackerB(o) = &loaded.settings.tracker.options else {
        panic!()
    };
    assert_eq!(o.api_key.expose(), planted);
}

#[test]
fn chat_a_options_resolve_references_defaults_and_fallbacks() {
    let yaml = "tracker:\n  kind: chat-a\n  channels: [C1, $CHAN_TWO, $UNSET_CHAN]\n  users: [U1, $CHAN_TWO]\n  emoji_states:\n    rocket: Done\n    x: Won't Do";
    // An empty CHAT_A_BOT_USER_ID does not satisfy bot_user_id.
    let errors = load_with(yaml, &[("CHAN_TWO", "C2"), ("CHAT_A_BOT_USER_ID", "")])
        .map(|_| ())
        .unwrap_err()
        .0;
    assert_eq!(errors, ["tracker.botUserId is required"]);
    let loaded = load_with(
        yaml,
        &[
            ("CHAN_TWO", "C2"),
            ("CHAT_A_BOT_USER_ID", "UBOT"),
            ("CHAT_A_BOT_TOKEN", "xoxb-planted"),
            ("CHAT_A_APP_TOKEN", "xapp-planted"),
        ],
    )
    .map_err(|(e, _)| e)
    .unwrap();
    let ProviderOptions::ChatA(o) = &loaded.settings.tracker.options else {
        panic!("chat-a options")
    };
    assert_eq!(
        o.app_token.expose(),
        "xapp-planted",
        "Socket Mode's fallback"
    );
    assert_eq!(
        o.channels,
        ["C1", "C2"],
        "an unresolved reference is dropped"
    );
    assert_eq!(o.bot_user_id.as_deref(), Some("UBOT"));
    assert_eq!(o.users, ["U1", "C2"], "users, as chat-b has them");
    assert_eq!(o.api_key.expose(), "xoxb-planted");
    assert_eq!(o.endpoint, "https://slack.com/api");
    assert_eq!(o.marker_emoji, "robot_face");
    assert_eq!(o.lookback_days, 2.0);
    let states: Vec<(&str, &str)> = o
        .emoji_states
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        states,
        [
            ("eyes", "In Progress"),
            ("rocket", "Done"),
            ("white_check_mark", "Done"),
            ("x", "Won't Do")
        ],
        "merged over the defaults"
    );
    let loaded = load_with(
        "tracker:\n  kind: chat-a\n  channels: [C1]\n  bot_user_id: U1\n  app_token: $APP",
        &[("APP", "xapp-from-file"), ("CHAT_A_APP_TOKEN", "xapp-env")],
    )
    .map_err(|(e, _)| e)
    .unwrap();
    let ProviderOptions::ChatA(o) = &loaded.settings.tracker.options else {
        panic!("chat-a options")
    };
    assert_eq!(o.app_token.expose(), "xapp-from-file");
    let errors = load("tracker:\n  kind: memory\ntools:\n  chat_a:\n    app_token: xapp-x")
        .map(|_| ())
        .unwrap_err();
    assert_eq!(errors, ["tools.chat_a.appToken is not supported"]);
    // A standalone tools.chat_a slice requires nothing: its tools fail closed instead.
    let loaded = load("tracker:\n  kind: memory\ntools:\n  chat_a:\n    channels: [C1]").unwrap();
    assert!(
        matches!(&loaded.settings.tools[0].1, ToolOptions::ChatA { options, keys } if options.bot_user_id.is_none() && keys == &["channels"])
    );
}

#[test]
fn chat_b_options_resolve_references_defaults_and_fallbacks() {
    let yaml = "tracker:\n  kind: chat-b\n  channels: [\"111\", $CHAN_TWO, $UNSET_CHAN]\n  users: [\"5\"]\n  emoji_states:\n    \"🚀\": Done";
    let errors = load_with(yaml, &[("CHAN_TWO", "222")])
        .map(|_| ())
        .unwrap_err()
        .0;
    assert_eq!(
        errors,
        [
            "tracker.botUserId is required",
            "tracker.guildId is required",
            "tracker.apiKey is required"
        ]
    );
    let loaded = load_with(
        yaml,
        &[
            ("CHAN_TWO", "222"),
            ("CHAT_B_GUILD_ID", "G1"),
            ("CHAT_B_BOT_USER_ID", "900"),
            ("CHAT_B_BOT_TOKEN", "planted-bot-token"),
        ],
    )
    .map_err(|(e, _)| e)
    .unwrap();
    let ProviderOptions::ChatB(o) = &loaded.settings.tracker.options else {
        panic!("chat-b options")
    };
    assert_eq!(o.channels, ["111", "222"]);
    assert_eq!(o.guild_id.as_deref(), Some("G1"));
    assert_eq!(o.bot_user_id.as_deref(), Some("900"));
    assert_eq!(o.users, ["5"]);
    assert_eq!(o.api_key.expose(), "planted-bot-token");
    assert_eq!(o.endpoint, "https://discord.com/api/v10");
    assert_eq!(o.marker_emoji, "🤖");
    assert_eq!(o.lookback_days, 0.0, "unbounded by default");
    let states: Vec<(&str, &str)> = o
        .emoji_states
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(states.len(), 4, "{states:?}");
    assert!(states.contains(&("🚀", "Done")) && states.contains(&("👀", "In Progress")));
    assert!(!format!("{:?}", loaded.settings).contains("planted-bot-token"));
    // A standalone tools.chat_b slice requires nothing: its tools fail closed instead.
    let loaded =
        load("tracker:\n  kind: memory\ntools:\n  chat_b:\n    channels: [\"1\"]").unwrap();
    assert!(
        matches!(&loaded.settings.tools[0].1, ToolOptions::ChatB { options, keys } if options.bot_user_id.is_none() && keys == &["channels"])
    );
}

#[test]
fn github_options_bundle_and_flat() {
    let yaml = "tracker:\n  kind: gh\n  active_states: [Todo, In Progress]\ntrackers:\n  gh:\n    provider: github\n    repos: [octo/app, Octo/lib.rs]\n    labels: [agent]\n    assignee: \"@me\"\n    users: [alice]\n    rework_state: In Progress\n    project:\n      owner: octo\n      number: 4\n";
    let loaded = load_with(yaml, &[("GITHUB_TOKEN", "ghp_planted_token")])
        .map_err(|(e, _)| e)
        .unwrap();
    let ProviderOptions::Github(o) = &loaded.settings.tracker.options else {
        panic!("github options")
    };
    assert_eq!(o.repos, ["octo/app", "Octo/lib.rs"]);
    assert_eq!(o.labels, ["agent"]);
    assert_eq!(o.assignee.as_deref(), Some("me"));
    assert_eq!(o.users, ["alice"]);
    assert_eq!(o.rework_state.as_deref(), Some("In Progress"));
    assert_eq!(o.api_key.expose(), "ghp_planted_token");
    assert_eq!(o.endpoint, "https://api.github.com");
    assert_eq!(o.graphql_url(), "https://api.github.com/graphql");
    assert_eq!(
        o.project,
        Some(GithubProject {
            owner: "octo".into(),
            number: 4,
            status_field: "Status".into()
        })
    );
    assert!(!format!("{:?}", loaded.settings).contains("ghp_planted_token"));
    // A GitHub Enterprise Server base derives its GraphQL endpoint.
    let loaded = load("tracker:\n  kind: github\n  api_key: k\n  endpoint: https://ghe.example/api/v3/\n  repos: [a/b]").unwrap();
    let ProviderOptions::Github(o) = &loaded.settings.tracker.options else {
        panic!("github options")
    };
    assert_eq!(o.endpoint, "https://ghe.example/api/v3");
    assert_eq!(o.graphql_url(), "https://ghe.example/api/graphql");
    assert_eq!(o.project, None);
    // The pack mounts for the tracker, or standalone.
    assert_eq!(
        mounted_packs(Provider::Github, [], PACKS).unwrap()[0].name,
        "github"
    );
    let loaded =
        load("tracker:\n  kind: memory\ntools:\n  github:\n    api_key: k\n    repos: [a/b]")
            .unwrap();
    assert!(matches!(&loaded.settings.tools[0].1, ToolOptions::Github(g) if g.repos == ["a/b"]));
}

#[test]
fn github_errors_name_the_key_and_the_fix() {
    let errors = |yaml: &str| load(yaml).err().unwrap_or_default();
    let e = errors("tracker:\n  kind: github");
    assert!(
        e.contains(&"tracker.apiKey is required".to_string()),
        "{e:?}"
    );
    assert!(
        e.contains(&"tracker.repos is required".to_string()),
        "{e:?}"
    );
    let e = errors("tracker:\n  kind: github\n  api_key: k\n  repos: [app, a/b/c, ok/fine]");
    assert_eq!(
        e,
        [
            "tracker.repos must list repositories as owner/name (got \"app\")",
            "tracker.repos must list repositories as owner/name (got \"a/b/c\")"
        ]
    );
    let e = errors(
        "tracker:\n  kind: github\n  api_key: k\n  repos: [a/b]\n  project:\n    owner: a\n    number: 1.5\n    column: x",
    );
    assert!(
        e.contains(&"tracker.project.column is not supported".to_string())
            && e.contains(&"tracker.project.number must be a positive whole number".to_string()),
        "{e:?}"
    );
    let e = errors(
        "tracker:\n  kind: github\n  api_key: k\n  repos: [a/b]\n  rework_state: Human Review",
    );
    assert_eq!(
        e,
        ["tracker.reworkState (Human Review) is not one of tracker.active_states"]
    );
    let e = errors(
        "tracker:\n  kind: memory\ntools:\n  github:\n    api_key: k\n    repos: [a/b]\n    rework_state: Todo",
    );
    assert_eq!(e, ["tools.github.reworkState is not supported"]);
}

#[test]
fn webhook_secrets_per_provider_with_their_environment_fallbacks() {
    let secret = |yaml: &str, vars: &[(&str, &str)]| {
        let loaded = load_with(yaml, vars).map_err(|(e, _)| e).unwrap();
        let debug = format!("{:?}", loaded.settings);
        if let Some(at) = debug.find("planted-hook") {
            panic!("{}", &debug[at.saturating_sub(300)..at + 20]);
        }
        let secret = loaded.settings.tracker.webhook_secret.clone();
        (
            secret.map(|s| s.expose().to_string()),
            loaded.settings.credential_vars.clone(),
        )
    };
    let github = "tracker:\n  kind: github\n  api_key: k\n  repos: [a/b]\n";
    assert_eq!(secret(github, &[]).0, None);
    let (s, vars) = secret(github, &[("GITHUB_WEBHOOK_SECRET", "planted-hook-1")]);
    assert_eq!(s.as_deref(), Some("planted-hook-1"));
    assert!(
        vars.iter().any(|v| v == "GITHUB_WEBHOOK_SECRET"),
        "{vars:?}"
    );
    let written = format!("{github}  webhook_secret: $MY_HOOK\n");
    let (s, _) = secret(&written, &[("MY_HOOK", "planted-hook-2")]);
    assert_eq!(s.as_deref(), Some("planted-hook-2"));
    let linear = "tracker:\n  kind: la\ntrackers:\n  la:\n    provider: tracker-a\n    api_key: k\n    project_slugs: [p]\n";
    let (s, _) = secret(linear, &[("TRACKER_A_WEBHOOK_SECRET", "planted-hook-3")]);
    assert_eq!(s.as_deref(), Some("planted-hook-3"));
    let jira = "tracker:\n  kind: tracker-b\n  base_url: https://x.example\n  email: e\n  api_key: k\n  project_keys: [ENG]\n  webhook_secret: literal-hook-4\n";
    let (s, _) = secret(jira, &[]);
    assert_eq!(s.as_deref(), Some("literal-hook-4"));
    // Another tracker's fallback is not read.
    let (s, _) = secret(jira, &[("GITHUB_WEBHOOK_SECRET", "planted-hook-5")]);
    assert_eq!(s.as_deref(), Some("literal-hook-4"));
    // Other providers, and the github pack, have no webhook route: the key is refused.
    let errors = load("tracker:\n  kind: memory\n  webhook_secret: x").unwrap_err();
    assert!(errors.iter().any(|e| e.contains("webhook")), "{errors:?}");
    let errors = load("tracker:\n  kind: memory\ntools:\n  github:\n    api_key: k\n    repos: [a/b]\n    webhook_secret: x").unwrap_err();
    assert!(errors.iter().any(|e| e.contains("webhook")), "{errors:?}");
}

#[test]
fn gitlab_options_with_their_defaults_fallbacks_and_errors() {
    let yaml = "tracker:\n  kind: gl\n  active_states: [Todo, In Progress]\ntrackers:\n  gl:\n    provider: gitlab\n    projects: [acme/sub/app]\n    labels: [agent]\n    assignee: \"@me\"\n    users: [\"@alice\"]\n    rework_state: In Progress\n";
    let loaded = load_with(
        yaml,
        &[
            ("GITLAB_TOKEN", "glpat_planted_token"),
            ("GITLAB_WEBHOOK_SECRET", "planted-gl-hook"),
        ],
    )
    .map_err(|(e, _)| e)
    .unwrap();
    let ProviderOptions::Gitlab(o) = &loaded.settings.tracker.options else {
        panic!("gitlab options")
    };
    assert_eq!(o.projects, ["acme/sub/app"]);
    assert_eq!(o.endpoint, "https://gitlab.com/api/v4");
    assert_eq!(o.status_label_prefix, "status::");
    assert_eq!(o.assignee.as_deref(), Some("me"));
    assert_eq!(o.rework_state.as_deref(), Some("In Progress"));
    assert_eq!(o.users, ["alice"]);
    assert_eq!(o.api_key.expose(), "glpat_planted_token");
    assert_eq!(
        loaded
            .settings
            .tracker
            .webhook_secret
            .as_ref()
            .map(|s| s.expose()),
        Some("planted-gl-hook")
    );
    let debug = format!("{:?}", loaded.settings);
    assert!(!debug.contains("glpat_planted_token") && !debug.contains("planted-gl-hook"));
    // The flat shape, a self-managed endpoint and another label scope.
    let loaded = load("tracker:\n  kind: gitlab\n  api_key: k\n  endpoint: https://gl.example/api/v4/\n  projects: [a/b]\n  status_label_prefix: workflow").unwrap();
    let ProviderOptions::Gitlab(o) = &loaded.settings.tracker.options else {
        panic!("gitlab options")
    };
    assert_eq!(o.endpoint, "https://gl.example/api/v4");
    assert_eq!(o.status_label_prefix, "workflow::");
    assert_eq!(
        mounted_packs(Provider::Gitlab, [], PACKS).unwrap()[0].name,
        "gitlab"
    );
    let loaded =
        load("tracker:\n  kind: memory\ntools:\n  gitlab:\n    api_key: k\n    projects: [a/b]")
            .unwrap();
    assert!(matches!(&loaded.settings.tools[0].1, ToolOptions::Gitlab(g) if g.projects == ["a/b"]));
    let errors = |yaml: &str| load(yaml).err().unwrap_or_default();
    // The pack writes as svc on the tracker's GitLab: another token there is refused.
    let both = |pack: &str| {
        format!(
            "tracker:\n  kind: gitlab\n  api_key: k1\n  projects: [a/b]\ntools:\n  gitlab:\n    api_key: {pack}\n    projects: [a/c]"
        )
    };
    let e = errors(&both("k2"));
    assert!(
        e.iter()
            .any(|e| e.contains("tools.gitlab.api_key must be the gitlab tracker's token")),
        "{e:?}"
    );
    assert!(!format!("{e:?}").contains("k2"), "{e:?}");
    assert!(load(&both("k1")).is_ok());
    assert!(
        load(&format!(
            "{}\n    endpoint: https://other.example/api/v4",
            both("k2")
        ))
        .is_ok()
    );
    // Credentials in the endpoint are refused, and never echoed.
    for endpoint in [
        "https://oauth2:glpat_planted_url@gl.example/api/v4",
        "oauth2:glpat_planted_url@gl.example/api/v4",
    ] {
        let e = errors(&format!(
            "tracker:\n  kind: gitlab\n  api_key: k\n  endpoint: {endpoint}\n  projects: [a/b]"
        ));
        assert!(
            e.iter().any(|e| e.contains("must not carry credentials")),
            "{e:?}"
        );
        assert!(!format!("{e:?}").contains("glpat_planted_url"), "{e:?}");
    }
    let e = errors("tracker:\n  kind: gitlab");
    assert!(e.iter().any(|e| e == "tracker.apiKey is required"), "{e:?}");
    assert!(
        e.iter().any(|e| e == "tracker.projects is required"),
        "{e:?}"
    );
    let e =
        errors("tracker:\n  kind: gitlab\n  api_key: k\n  projects: [app, a//b]\n  repos: [x/y]");
    assert!(
        e.iter().any(|e| e.contains("must list full project paths such as group/project (got \"app\")")),
        "{e:?}"
    );
    assert!(e.iter().any(|e| e.contains("(got \"a//b\")")), "{e:?}");
    assert!(
        e.iter().any(|e| e == "tracker.repos is not supported"),
        "{e:?}"
    );
    let e = errors(
        "tracker:\n  kind: gitlab\n  api_key: k\n  projects: [a/b]\n  endpoint: gitlab.example.com",
    );
    assert!(
        e.iter().any(|e| e.contains(
            "must be a GitLab API v4 base URL ending in /api/v4 (got gitlab.example.com)"
        )),
        "{e:?}"
    );
    let e = errors(
        "tracker:\n  kind: gitlab\n  api_key: k\n  projects: [a/b]\n  endpoint: https://gitlab.example.com",
    );
    assert!(e.iter().any(|e| e.contains("ending in /api/v4")), "{e:?}");
    let e =
        errors("tracker:\n  kind: gitlab\n  api_key: k\n  projects: [a/b]\n  rework_state: Review");
    assert!(
        e.iter()
            .any(|e| e.contains("reworkState (Review) is not one of tracker.active_states")),
        "{e:?}"
    );
    let e = errors(
        "tracker:\n  kind: memory\ntools:\n  gitlab:\n    api_key: k\n    projects: [a/b]\n    users: [x]",
    );
    assert_eq!(e, ["tools.gitlab.users is not supported"]);
}
