//! Turning an agent record into a bridge process and its session options, including the
//! `provider_config` overlays in the form each real bridge reads:
//!
//! * agent_b (claude-agent-acp / claude-code-acp): the overlay is a settings.json object, sent as
//!   `_meta.claudeCode.options.settings` in `session/new` (the bridge merges it into the Agent
//!   SDK options, so `model` and `permissions.defaultMode` apply per session), together with
//!   `disallowedTools: ["AskUserQuestion"]`. `AGENT_B_EXECUTABLE` (or `claude` found by a login
//!   shell) becomes `CLAUDE_CODE_EXECUTABLE`.
//! * every other kind (agent_a is codex-acp): the overlay is a config.toml object, merged over
//!   the default posture (`sandbox_mode = "workspace-write"`, `approval_policy = "on-request"`,
//!   `sandbox_workspace_write.network_access = false`) and passed as JSON in `CODEX_CONFIG`,
//!   which codex-acp merges into every thread's config. Its sandbox follows the session mode, so
//!   `INITIAL_AGENT_MODE` is `agent` (workspace-write) or, when the overlay sets
//!   `sandbox_mode = "danger-full-access"`, `agent-full-access`. `AGENT_A_PATH` (or `codex` found
//!   by a login shell) becomes `CODEX_PATH`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::AgentRecord;
use crate::env::Env;
use crate::process::Spec;

/// A bridge ready to spawn.
#[derive(Debug)]
pub struct Launch {
    pub spec: Spec,
    /// `_meta` for `session/new`, when the bridge takes per-session options that way.
    pub session_meta: Option<Value>,
}

/// Resolves a bridge program: a path, a name on PATH, or `svc` (this binary).
pub fn resolve_program(program: &str, env: &Env) -> Option<PathBuf> {
    env.find_executable(program).or_else(|| {
        if program == "svc" {
            std::env::current_exe().ok()
        } else {
            None
        }
    })
}

/// The agent CLI a built-in bridge drives, resolved once per daemon: the explicit variable
/// wins, else a login shell's `command -v`.
fn agent_cli(var: &str, cli: &str, env: &Env) -> Option<PathBuf> {
    static CACHE: Mutex<Option<HashMap<String, Option<PathBuf>>>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let map = cache.get_or_insert_with(HashMap::new);
    let key = format!("{var}={}", env.get(var).unwrap_or(""));
    map.entry(key)
        .or_insert_with(|| resolve_agent_cli(var, cli, env).ok())
        .clone()
}

/// The agent CLI a built-in bridge drives: the explicit variable wins, else a login shell's PATH.
pub fn resolve_agent_cli(var: &str, cli: &str, env: &Env) -> Result<PathBuf, String> {
    if let Some(explicit) = env.non_empty(var) {
        return env
            .find_executable(explicit)
            .ok_or_else(|| format!("{var} is set but {explicit} is not an executable file"));
    }
    let spec = Spec::new("/bin/bash")
        .arg("-lc")
        .arg(format!("command -v {cli}"));
    match crate::process::run(&spec, Duration::from_secs(10)) {
        Ok(out) if out.success() && !out.stdout.trim().is_empty() => {
            Ok(PathBuf::from(out.stdout.trim()))
        }
        _ => Err(format!(
            "{cli} not found on a login shell's PATH and {var} is unset"
        )),
    }
}

/// A local bridge: its program resolved, its working directory, and its environment: the
/// daemon's, less every variable svc read a credential from (`credentials`) and the control
/// token, plus the run's variables, the record's `env` and the per-bridge overlays.
pub fn prepare(
    record: &AgentRecord,
    workspace: &Path,
    env: &Env,
    extra_env: &[(String, String)],
    credentials: &std::collections::BTreeSet<String>,
) -> Result<Launch, String> {
    let argv = record.bridge_argv();
    let Some(program) = argv.first() else {
        return Err(format!("agents.{}.bridge_command is empty", record.kind));
    };
    let path = resolve_program(program, env)
        .ok_or_else(|| format!("bridge command {program} not found on PATH"))?;
    let mut spec = Spec::new(path).cwd(workspace);
    for arg in &argv[1..] {
        spec = spec.arg(*arg);
    }
    for name in credentials {
        spec = spec.without(name);
    }
    for (k, v) in extra_env {
        spec = spec.env(k, v);
    }
    for (k, v) in &record.env {
        spec = spec.env(k, v.expose());
    }
    let (vars, session_meta) = overlays(record, Some(env));
    for (k, v) in vars {
        spec = spec.env(k, v);
    }
    Ok(Launch { spec, session_meta })
}

/// The bridge of a run on a remote worker: its argv as written (resolved on the worker's
/// PATH, not here) and its environment (the run's variables and the per-bridge overlays; the
/// agent CLIs are the worker's own, so no local path is handed over).
pub fn prepare_remote(
    record: &AgentRecord,
    extra_env: &[(String, String)],
) -> Result<RemoteLaunch, String> {
    let argv: Vec<String> = record.bridge_argv().iter().map(|s| s.to_string()).collect();
    if argv.is_empty() {
        return Err(format!("agents.{}.bridge_command is empty", record.kind));
    }
    let (vars, session_meta) = overlays(record, None);
    let mut env = extra_env.to_vec();
    env.extend(
        record
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string())),
    );
    env.extend(vars);
    Ok(RemoteLaunch {
        argv,
        env,
        session_meta,
    })
}

/// A bridge to start on a remote worker.
#[derive(Debug)]
pub struct RemoteLaunch {
    /// The bridge command's words, resolved on the worker.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `_meta` for `session/new`.
    pub session_meta: Option<Value>,
}

/// The per-bridge overlays: variables and `session/new` `_meta`. With a local `env`, the agent
/// CLI found on this host is handed to the bridge.
fn overlays(record: &AgentRecord, env: Option<&Env>) -> (Vec<(String, String)>, Option<Value>) {
    let mut vars = Vec::new();
    if record.kind == "agent_b" {
        if let Some(cli) = env.and_then(|env| agent_cli("AGENT_B_EXECUTABLE", "claude", env)) {
            vars.push((
                "CLAUDE_CODE_EXECUTABLE".to_string(),
                cli.display().to_string(),
            ));
        }
        let mut options = json!({"disallowedTools": ["AskUserQuestion"]});
        if let Some(settings) = &record.provider_config {
            options["settings"] = settings.clone();
        }
        return (vars, Some(json!({"claudeCode": {"options": options}})));
    }
    if record.kind == "agent_a"
        && let Some(cli) = env.and_then(|env| agent_cli("AGENT_A_PATH", "codex", env))
    {
        vars.push(("CODEX_PATH".to_string(), cli.display().to_string()));
    }
    let config = codex_config(record.provider_config.as_ref());
    let full_access = config["sandbox_mode"] == "danger-full-access";
    vars.push(("CODEX_CONFIG".to_string(), config.to_string()));
    vars.push((
        "INITIAL_AGENT_MODE".to_string(),
        if full_access {
            "agent-full-access"
        } else {
            "agent"
        }
        .to_string(),
    ));
    (vars, None)
}

/// The default agent_a posture with the overlay merged over it.
pub fn codex_config(overlay: Option<&Value>) -> Value {
    let mut config = json!({
        "sandbox_mode": "workspace-write",
        "approval_policy": "on-request",
        "sandbox_workspace_write": {"network_access": false}
    });
    if let Some(o) = overlay {
        crate::config::merge_json(&mut config, o.clone());
    }
    config
}

/// The MCP server name an agent sees: `svc_<kind>` with anything but letters, digits and `_`
/// replaced by `_`.
pub fn mcp_server_name(kind: &str) -> String {
    format!("svc_{kind}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UsageAccounting;

    fn record(kind: &str, bridge: &str, pc: Option<Value>) -> AgentRecord {
        AgentRecord {
            kind: kind.into(),
            turn_timeout_ms: 1,
            stall_timeout_ms: 1,
            bridge_command: bridge.into(),
            usage_accounting: UsageAccounting::PerTurn,
            provider_config: pc,
            strict_mcp_config: true,
            builtin_only: false,
            queue_prompts: false,
            pricing: None,
            env: Vec::new(),
            rate_limit_patterns: Vec::new(),
            cooldown_ms: crate::config::DEFAULT_COOLDOWN_MS,
            cooldown_scope: crate::config::CooldownScope::Fleet,
            fallback: Vec::new(),
            route_fallback: false,
        }
    }

    fn env_of(spec: &Spec, key: &str) -> Option<String> {
        spec.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.to_string_lossy().into_owned())
    }

    #[test]
    fn agent_a_overlays_go_to_codex_config_and_mode() {
        let env = Env::from_pairs(
            [("PATH", "/bin:/usr/bin"), ("AGENT_A_PATH", "/bin/sh")],
            Path::new("/"),
        );
        let l = prepare(
            &record(
                "agent_a",
                "sh -c true",
                Some(
                    json!({"model": "gpt-5", "sandbox_workspace_write": {"network_access": true}}),
                ),
            ),
            Path::new("/tmp"),
            &env,
            &[],
            &Default::default(),
        )
        .unwrap();
        let config: Value =
            serde_json::from_str(&env_of(&l.spec, "CODEX_CONFIG").unwrap()).unwrap();
        assert_eq!(config["model"], "gpt-5");
        assert_eq!(config["sandbox_mode"], "workspace-write");
        assert_eq!(config["sandbox_workspace_write"]["network_access"], true);
        assert_eq!(
            env_of(&l.spec, "INITIAL_AGENT_MODE").as_deref(),
            Some("agent")
        );
        assert_eq!(env_of(&l.spec, "CODEX_PATH").as_deref(), Some("/bin/sh"));
        assert_eq!(l.spec.args, ["-c", "true"]);
        assert!(l.session_meta.is_none());
        let full = prepare(
            &record(
                "agent_a",
                "sh",
                Some(json!({"sandbox_mode": "danger-full-access"})),
            ),
            Path::new("/tmp"),
            &env,
            &[],
            &Default::default(),
        )
        .unwrap();
        assert_eq!(
            env_of(&full.spec, "INITIAL_AGENT_MODE").as_deref(),
            Some("agent-full-access")
        );
    }

    #[test]
    fn agent_b_overlays_go_to_session_meta() {
        let env = Env::from_pairs(
            [("PATH", "/bin:/usr/bin"), ("AGENT_B_EXECUTABLE", "/bin/sh")],
            Path::new("/"),
        );
        let pc = json!({"model": "m", "permissions": {"defaultMode": "dontAsk"}});
        let l = prepare(
            &record("agent_b", "sh", Some(pc.clone())),
            Path::new("/tmp"),
            &env,
            &[],
            &Default::default(),
        )
        .unwrap();
        let meta = l.session_meta.unwrap();
        assert_eq!(meta["claudeCode"]["options"]["settings"], pc);
        assert_eq!(
            meta["claudeCode"]["options"]["disallowedTools"][0],
            "AskUserQuestion"
        );
        assert_eq!(
            env_of(&l.spec, "CLAUDE_CODE_EXECUTABLE").as_deref(),
            Some("/bin/sh")
        );
        assert!(env_of(&l.spec, "CODEX_CONFIG").is_none());
    }

    #[test]
    fn missing_bridges_and_svc_itself() {
        let env = Env::from_pairs([("PATH", "/nonexistent")], Path::new("/"));
        let err = prepare(
            &record("x", "no-such-bridge --flag", None),
            Path::new("/tmp"),
            &env,
            &[],
            &Default::default(),
        )
        .unwrap_err();
        assert_eq!(err, "bridge command no-such-bridge not found on PATH");
        let l = prepare(
            &record("demo", "svc demo-agent", None),
            Path::new("/tmp"),
            &env,
            &[],
            &Default::default(),
        )
        .unwrap();
        assert_eq!(l.spec.program, std::env::current_exe().unwrap());
        assert_eq!(mcp_server_name("agent-b.x"), "svc_agent_b_x");
    }
}
