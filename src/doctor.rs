//! `svc doctor`: validates the workflow and everything it needs on this host, one line per check
//! (ok / warning / error, with a hint), or JSON for machines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::{
    self, AgentRecord, LoadError, Provider, ProviderOptions, SecretResolver, Settings,
};
use crate::env::Env;
use crate::tracker;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warning,
    Error,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub message: String,
    pub hint: Option<String>,
}

impl Check {
    fn new(
        name: impl Into<String>,
        status: Status,
        message: impl Into<String>,
        hint: Option<String>,
    ) -> Check {
        Check {
            name: name.into(),
            status,
            message: message.into(),
            hint,
        }
    }

    fn ok(name: impl Into<String>, message: impl Into<String>) -> Check {
        Check::new(name, Status::Ok, message, None)
    }
}

/// The worker pool: its settings, its driver loading (an out-of-tree one is started and
/// initialized), and with `--online` one provision, probe and destroy of a machine.
fn worker_pool_checks(settings: &Settings, env: &Env, online: bool) -> Vec<Check> {
    use crate::workers::service::{self, POOL_LABEL, WORKER_LABEL};
    let chosen = service::selection(settings);
    if !chosen.configured {
        return vec![Check::ok(
            "worker_pool",
            "none configured: runs execute on this host",
        )];
    }
    let l = &chosen.limits;
    let mut caps = Vec::new();
    if let Some(n) = l.max_concurrent_workers {
        caps.push(format!("at most {n} live workers"));
    }
    if let Some(n) = l.max_worker_seconds {
        caps.push(format!("{n} worker-seconds in all"));
    }
    if let Some(n) = l.daily_worker_seconds {
        caps.push(format!("{n} worker-seconds a day (UTC)"));
    }
    let mut checks = vec![Check::ok(
        "worker_pool",
        format!(
            "driver {}: min {}, max {}, warm {}, {} slot(s) per machine, acquire timeout {} ms{}",
            chosen.specifier,
            l.min,
            l.max,
            l.warm,
            l.max_in_flight,
            l.acquire_timeout_ms,
            if caps.is_empty() {
                "; no spend cap".to_string()
            } else {
                format!("; spend caps: {}", caps.join(", "))
            }
        ),
    )];
    checks.extend(remote_checks(settings, env, &chosen, online));
    // Out-of-tree drivers are pinned into a scratch directory here, not the daemon's.
    let pin_dir = env
        .tmpdir()
        .join(format!("svc-doctor-drivers-{}", std::process::id()));
    let built = service::build_driver(&chosen.specifier, &chosen.options, settings, env, &pin_dir);
    let _ = std::fs::remove_dir_all(&pin_dir);
    let driver = match built {
        Ok(b) => b.driver,
        Err(e) => {
            checks.push(Check::new(
                "worker_pool_driver",
                Status::Error,
                format!("{}: {}", e.event(), e.message()),
                Some(
                    "fix the driver specifier or the driver (see the README's driver SDK v1)"
                        .into(),
                ),
            ));
            return checks;
        }
    };
    let caps = driver.capabilities();
    checks.push(Check::ok(
        "worker_pool_driver",
        format!(
            "{} loads: kind {}, sshAddressable {}, ephemeral {}, usesLedger {}",
            chosen.specifier,
            driver.kind(),
            caps.ssh_addressable,
            caps.ephemeral,
            caps.uses_ledger
        ),
    ));
    if online {
        checks.push(pool_online_check(&*driver, POOL_LABEL, WORKER_LABEL));
    }
    checks
}

/// What SSH and docker workers need: the ssh binary, a readable `SVC_SSH_CONFIG`, each static
/// host answering (`--online`), the docker CLI and daemon, and the image (`--online`).
fn remote_checks(
    settings: &Settings,
    env: &Env,
    chosen: &crate::workers::service::Selection,
    online: bool,
) -> Vec<Check> {
    use crate::workers::ssh;
    let mut checks = Vec::new();
    let remote = ["static-ssh", "docker"].contains(&chosen.specifier.as_str());
    if !remote {
        return checks;
    }
    checks.push(match env.find_executable("ssh") {
        Some(p) => Check::ok("ssh", format!("OpenSSH client at {}", p.display())),
        None => Check::new(
            "ssh",
            Status::Error,
            "ssh not found on PATH",
            Some("install the OpenSSH client (Debian: openssh-client)".into()),
        ),
    });
    if let Some(config) = &settings.worker.ssh_config {
        checks.push(match std::fs::read(config) {
            Ok(_) => Check::ok(
                "ssh_config",
                format!("SVC_SSH_CONFIG {} is readable", config.display()),
            ),
            Err(e) => Check::new(
                "ssh_config",
                Status::Error,
                format!("SVC_SSH_CONFIG {}: {e}", config.display()),
                Some("point SVC_SSH_CONFIG at a readable ssh config".into()),
            ),
        });
    }
    let timeout = std::time::Duration::from_millis(settings.worker.ssh_timeout_ms);
    if chosen.specifier == "static-ssh" && online {
        let hosts = crate::workers::static_ssh::StaticSsh::hosts_of(&chosen.options);
        for host in hosts {
            let target = ssh::Target {
                host: host.clone(),
                config: settings.worker.ssh_config.clone(),
                timeout,
                options: Vec::new(),
            };
            checks.push(match ssh::run(&target, "true", timeout) {
                Ok(out) if out.ok => Check::ok(format!("ssh_host_{host}"), format!("{host} answers over SSH")),
                Ok(out) => Check::new(
                    format!("ssh_host_{host}"),
                    Status::Error,
                    format!("{host}: `true` failed ({})", if out.timed_out { "timed out".into() } else { out.status }),
                    None,
                ),
                Err(e) => Check::new(
                    format!("ssh_host_{host}"),
                    Status::Error,
                    e,
                    Some("check the host's entry in SVC_SSH_CONFIG (HostName, User, IdentityFile, pinned host key)".into()),
                ),
            });
        }
    }
    if chosen.specifier == "docker" {
        let docker = |args: &[&str]| {
            let mut spec = crate::process::Spec::new("docker");
            for a in args {
                spec = spec.arg(*a);
            }
            crate::process::run(&spec, std::time::Duration::from_secs(30))
        };
        checks.push(
            match docker(&["version", "--format", "{{.Server.Version}}"]) {
                Ok(out) if out.success() => {
                    Check::ok("docker", format!("docker daemon {}", out.stdout.trim()))
                }
                Ok(out) => Check::new(
                    "docker",
                    Status::Error,
                    format!("the docker daemon does not answer: {}", out.stderr.trim()),
                    Some("start dockerd, or give svc's user access to its socket".into()),
                ),
                Err(e) => Check::new(
                    "docker",
                    Status::Error,
                    format!("cannot run docker: {e}"),
                    Some("install the docker CLI (Debian: docker.io)".into()),
                ),
            },
        );
        if online {
            let image = chosen
                .options
                .get("image")
                .and_then(|v| v.as_str())
                .unwrap_or("");
            checks.push(match docker(&["image", "inspect", image]) {
                Ok(out) if out.success() => {
                    Check::ok("docker_image", format!("image {image} is present"))
                }
                _ => Check::new(
                    "docker_image",
                    Status::Error,
                    format!("image {image} is not present"),
                    Some(format!("docker pull {image}, or build it on this host")),
                ),
            });
        }
    }
    checks
}

/// One machine provisioned, probed and destroyed through `driver`.
fn pool_online_check(
    driver: &dyn crate::workers::Driver,
    pool_label: &str,
    worker_label: &str,
) -> Check {
    let id = format!("doctor-{}", std::process::id());
    let request = crate::workers::ProvisionRequest {
        worker_id: id.clone(),
        affinity_key: None,
        labels: [
            (pool_label.to_string(), "svc-doctor".to_string()),
            (worker_label.to_string(), id.clone()),
        ]
        .into(),
        timeout: std::time::Duration::from_secs(120),
    };
    let timeout = std::time::Duration::from_secs(30);
    let record = match driver.provision(&request) {
        Ok(r) => r,
        Err(e) => {
            return Check::new(
                "worker_pool_online",
                Status::Error,
                format!("provision failed: {e}"),
                Some("check the driver's options and credentials".into()),
            );
        }
    };
    let probe = driver.probe(&record, timeout);
    let destroy = driver.destroy(&record, timeout, "svc doctor --online");
    match (probe, destroy) {
        (Ok(()), Ok(())) => Check::ok(
            "worker_pool_online",
            format!(
                "provisioned {} ({}), probed and destroyed it",
                id,
                record.worker_host.as_deref().unwrap_or("this host")
            ),
        ),
        (Err(e), _) => Check::new(
            "worker_pool_online",
            Status::Error,
            format!("provisioned {id}, but the probe failed: {e}"),
            None,
        ),
        (Ok(()), Err(e)) => Check::new(
            "worker_pool_online",
            Status::Error,
            format!(
                "provisioned and probed {id}, but destroying it failed: {e}; remove it by hand"
            ),
            None,
        ),
    }
}

/// Runs every check for the workflow at `path`.
pub fn run(path: &Path, env: &Env, online: bool) -> Vec<Check> {
    let mut secrets = SecretResolver::new(crate::process::run_program);
    let loaded = config::load(path, env, &mut secrets);
    run_loaded(path, env, online, loaded, secrets)
}

/// Every check of one workflow, after its load.
fn run_loaded(
    path: &Path,
    env: &Env,
    online: bool,
    loaded: Result<config::Loaded, LoadError>,
    mut secrets: SecretResolver,
) -> Vec<Check> {
    let mut checks = Vec::new();
    let settings = match loaded {
        Ok(loaded) => {
            crate::process::withhold(&loaded.settings.credential_vars);
            checks.push(Check::ok("workflow_file", path.display().to_string()));
            checks.push(Check::ok(
                "config",
                format!(
                    "valid (tracker {}, agent {})",
                    loaded.settings.tracker.kind, loaded.settings.agent.kind
                ),
            ));
            for w in &loaded.warnings {
                checks.push(Check::new(&w.check, Status::Warning, &w.message, None));
            }
            loaded.settings
        }
        Err(LoadError::File(e)) => {
            let hint = match e {
                config::workflow::WorkflowError::Missing { .. } => {
                    Some("pass the workflow path, set SVC_WORKFLOW, or run in the directory holding WORKFLOW.md".to_string())
                }
                _ => None,
            };
            checks.push(Check::new(
                "workflow_file",
                Status::Error,
                e.to_string(),
                hint,
            ));
            return checks;
        }
        Err(LoadError::Invalid {
            errors, warnings, ..
        }) => {
            checks.push(Check::ok("workflow_file", path.display().to_string()));
            for e in errors {
                checks.push(Check::new("config", Status::Error, e.message, e.hint));
            }
            for w in warnings {
                checks.push(Check::new(w.check, Status::Warning, w.message, None));
            }
            return checks;
        }
    };
    checks.extend(tracker_checks(&settings, env));
    if online {
        // github's, gitlab's, chat-a's and chat-b's token checks are among their own findings.
        if !matches!(
            settings.tracker.provider,
            config::Provider::Github
                | config::Provider::Gitlab
                | config::Provider::ChatA
                | config::Provider::ChatB
        ) {
            checks.push(online_check(&settings));
        }
        checks.extend(chat_a_checks(&settings));
        checks.extend(github_checks(&settings));
        checks.extend(gitlab_checks(&settings));
        checks.extend(github_hook_checks(&settings));
        checks.extend(chat_b_checks(&settings));
    }
    checks.push(prompt_check(&settings));
    checks.push(writable_check(
        "log_path",
        &settings.logging.log_file,
        "logging.log_file",
    ));
    checks.push(workspace_check(&settings));
    checks.extend(worker_pool_checks(&settings, env, online));
    checks.push(dashboard_check(&settings));
    checks.extend(webhook_check(&settings));
    checks.extend(agent_checks(&settings, env));
    checks.extend(budget_check(&settings));
    if settings.uses_op {
        checks.push(match secrets.op_binary(env) {
            Ok(p) => Check::ok("op_cli", format!("1Password CLI at {}", p.display())),
            Err(e) => Check::new("op_cli", Status::Error, e.message, e.hint),
        });
    }
    checks
}

/// The budgets: a dollar budget where no agent kind has a price can trip only on a cost the
/// bridge itself reports, so it is a warning (a token budget needs no price).
fn budget_check(settings: &Settings) -> Option<Check> {
    let b = settings.agent.budgets;
    let dollar_keys: Vec<&str> = [
        ("agent.max_cost_usd_per_issue", b.max_cost_usd_per_issue),
        ("agent.daily_budget_usd", b.daily_budget_usd),
    ]
    .iter()
    .filter(|(_, v)| v.is_some())
    .map(|(k, _)| *k)
    .collect();
    if dollar_keys.is_empty() && b.max_tokens_per_issue.is_none() {
        return None;
    }
    let priced: Vec<&String> = settings
        .agents
        .kinds
        .iter()
        .filter(|(_, r)| r.pricing.is_some())
        .map(|(k, _)| k)
        .collect();
    if !dollar_keys.is_empty() && priced.is_empty() {
        return Some(Check::new(
            "budgets",
            Status::Warning,
            format!(
                "{} set, but no agent kind has prices (agents.<kind>.pricing): it can trip only if the bridge reports its cost in USD",
                dollar_keys.join(" and ")
            ),
            Some(
                "add agents.<kind>.pricing {input, output, cached_input} in USD per million tokens"
                    .into(),
            ),
        ));
    }
    Some(Check::ok(
        "budgets",
        format!(
            "per issue: {} tokens, ${}; daily: ${} (priced kinds: {})",
            b.max_tokens_per_issue
                .map_or("no limit".into(), |n| n.to_string()),
            b.max_cost_usd_per_issue
                .map_or("no limit".into(), |n| n.to_string()),
            b.daily_budget_usd
                .map_or("no limit".into(), |n| n.to_string()),
            if priced.is_empty() {
                "none".to_string()
            } else {
                priced
                    .iter()
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
    ))
}

fn tracker_checks(settings: &Settings, env: &Env) -> Vec<Check> {
    let mut out = Vec::new();
    let t = &settings.tracker;
    if !tracker::is_available(t.provider) {
        out.push(Check::new(
            "tracker",
            Status::Error,
            format!(
                "tracker.kind {} is not available in this build of svc",
                t.provider.name()
            ),
            Some("use local or memory".into()),
        ));
        return out;
    }
    if let ProviderOptions::Local(opts) = &t.options {
        let board = tracker::local::Board::new(opts, tracker::StateNames::from_settings(t));
        if !opts.path.exists() {
            out.push(Check::new(
                "tracker",
                Status::Warning,
                format!("local board {} does not exist yet", opts.path.display()),
                Some("it is created with the first issue; create one by writing BOARD-1.md there (see README)".into()),
            ));
            return out;
        }
        match board.scan() {
            Ok(scan) => {
                let active = scan
                    .issues
                    .iter()
                    .filter(|b| t.is_active(&b.issue.state))
                    .count();
                out.push(Check::ok(
                    "tracker",
                    format!(
                        "local board {}: {} issues, {active} active",
                        opts.path.display(),
                        scan.issues.len()
                    ),
                ));
                // A blocker that names no file of the board is ignored by dispatch: say so.
                let on_board: std::collections::HashSet<&str> = scan
                    .issues
                    .iter()
                    .map(|b| b.issue.identifier.as_str())
                    .chain(
                        scan.skipped
                            .iter()
                            .filter_map(|s| s.file.strip_suffix(".md")),
                    )
                    .collect();
                for b in &scan.issues {
                    for missing in b
                        .blocked_by
                        .iter()
                        .filter(|id| !on_board.contains(id.as_str()))
                    {
                        out.push(Check::new(
                            "tracker_board_blocker",
                            Status::Warning,
                            format!(
                                "{} is blocked by {missing}, which is not on the board: dispatch ignores it",
                                b.issue.identifier
                            ),
                            Some(format!(
                                "fix blocked_by in {} (ids are file names without .md)",
                                b.path.display()
                            )),
                        ));
                    }
                }
                for s in scan.skipped {
                    out.push(Check::new(
                        "tracker_board_file",
                        Status::Warning,
                        format!("{} is skipped: {}", s.file, s.reason),
                        Some("fix the file's front matter (title and state are required)".into()),
                    ));
                }
            }
            Err(e) => out.push(Check::new("tracker", Status::Error, e.message, None)),
        }
        return out;
    }
    match &t.options {
        ProviderOptions::TrackerA(opts) => {
            out.push(Check::ok(
                "tracker",
                format!(
                    "tracker-a at {} (svc doctor --online checks the credential)",
                    opts.endpoint
                ),
            ));
            return out;
        }
        ProviderOptions::TrackerBMcp(opts) => {
            out.push(Check::ok(
                "tracker",
                format!(
                    "tracker-b-mcp through {} (svc doctor --online checks the server)",
                    opts.url.expose()
                ),
            ));
            return out;
        }
        ProviderOptions::TrackerB(opts) => {
            out.push(Check::ok(
                "tracker",
                format!(
                    "tracker-b at {} (svc doctor --online checks the credentials)",
                    opts.base_url.expose()
                ),
            ));
            return out;
        }
        ProviderOptions::ChatA(opts) => {
            out.push(chat_a_check(opts));
            return out;
        }
        ProviderOptions::Github(opts) => {
            out.push(Check::ok(
                "tracker",
                format!(
                    "github at {}: {}{} (svc doctor --online checks the token, the repositories and the project)",
                    opts.endpoint,
                    opts.repos.join(", "),
                    opts.project.as_ref().map_or_else(
                        || "; states from status: labels".to_string(),
                        |p| format!("; states from project {}/{} ({})", p.owner, p.number, p.status_field)
                    )
                ),
            ));
            return out;
        }
        ProviderOptions::Gitlab(opts) => {
            out.push(Check::ok(
                "tracker",
                format!(
                    "gitlab at {}: {}; states from {}<State> labels (svc doctor --online checks the token, the projects and the labels)",
                    opts.endpoint,
                    opts.projects.join(", "),
                    opts.status_label_prefix
                ),
            ));
            return out;
        }
        ProviderOptions::ChatB(opts) => {
            out.push(chat_b_check(opts));
            out.push(Check::ok(
                "tracker_intents",
                "chat-b reads message text through the MESSAGE CONTENT privileged intent: enable it under Bot > Privileged Gateway Intents in the Discord Developer Portal (svc doctor --online checks it)",
            ));
            return out;
        }
        _ => {}
    }
    match tracker::build(t, env) {
        Ok(tr) => match tr.fetch_candidates() {
            Ok(c) => out.push(Check::ok(
                "tracker",
                format!("{}: {} active issues", t.provider.name(), c.len()),
            )),
            Err(e) => out.push(Check::new("tracker", Status::Error, e.message, None)),
        },
        Err(e) => {
            let hint = (t.provider == Provider::Memory)
                .then(|| "set SVC_MEMORY_TRACKER_ISSUES_JSON to a JSON array of {id, identifier, title, state, labels}".to_string());
            out.push(Check::new("tracker", Status::Error, e.message, hint));
        }
    }
    out
}

/// chat-a offline: a token, channels and a bot user id to work with.
fn chat_a_check(opts: &config::ChatOptions) -> Check {
    if opts.api_key.is_empty() {
        return Check::new(
            "tracker",
            Status::Error,
            "chat-a has no bot token",
            Some("set tracker.api_key (for example $CHAT_A_BOT_TOKEN) or CHAT_A_BOT_TOKEN to the app's xoxb- token".into()),
        );
    }
    if opts.channels.is_empty() {
        return no_channels(
            "chat-a",
            "list channel ids such as C0123456789 in tracker.channels",
        );
    }
    Check::ok(
        "tracker",
        format!(
            "chat-a at {}, watching {} as bot user {} (svc doctor --online checks the token and channel membership)",
            opts.endpoint,
            opts.channels.join(", "),
            opts.bot_user_id.as_deref().unwrap_or("?")
        ),
    )
}

/// A chat tracker that watches no channel.
fn no_channels(provider: &str, hint: &str) -> Check {
    Check::new(
        "tracker",
        Status::Error,
        format!("{provider} watches no channels (every tracker.channels reference is unset)"),
        Some(hint.into()),
    )
}

/// chat-b offline: a token, a guild, channels and a bot user id to work with.
fn chat_b_check(opts: &config::ChatOptions) -> Check {
    if opts.channels.is_empty() {
        return no_channels(
            "chat-b",
            "list channel ids (Developer Mode: right-click a channel > Copy Channel ID) in tracker.channels",
        );
    }
    Check::ok(
        "tracker",
        format!(
            "chat-b at {}, guild {}, watching {} as bot user {} (svc doctor --online checks the token, guild, channels and intents)",
            opts.endpoint,
            opts.guild_id.as_deref().unwrap_or("?"),
            opts.channels.join(", "),
            opts.bot_user_id.as_deref().unwrap_or("?")
        ),
    )
}

/// chat-a online: the provider's own findings (`tracker::chat_a::doctor`: the token and each
/// channel), as checks.
fn chat_a_checks(settings: &Settings) -> Vec<Check> {
    let ProviderOptions::ChatA(opts) = &settings.tracker.options else {
        return Vec::new();
    };
    let t =
        tracker::chat_a::ChatA::new(opts, tracker::StateNames::from_settings(&settings.tracker));
    findings_as_checks(tracker::chat_a::doctor::findings(&t, opts))
}

/// chat-b online: the provider's own findings (`tracker::chat_b::doctor`: the token, the guild,
/// each channel and the intents), as checks.
fn chat_b_checks(settings: &Settings) -> Vec<Check> {
    let ProviderOptions::ChatB(opts) = &settings.tracker.options else {
        return Vec::new();
    };
    let t =
        tracker::chat_b::ChatB::new(opts, tracker::StateNames::from_settings(&settings.tracker));
    findings_as_checks(tracker::chat_b::doctor::findings(&t, opts))
}

/// github online: the provider's own findings (`tracker::github::doctor`: the token, each
/// repository and the board), as checks.
fn github_checks(settings: &Settings) -> Vec<Check> {
    let ProviderOptions::Github(opts) = &settings.tracker.options else {
        return Vec::new();
    };
    let gh =
        tracker::github::GitHub::new(opts, tracker::StateNames::from_settings(&settings.tracker));
    findings_as_checks(tracker::github::doctor::findings(&gh))
}

/// A provider's findings as `svc doctor` checks.
fn findings_as_checks(findings: Vec<tracker::Finding>) -> Vec<Check> {
    findings
        .into_iter()
        .map(|f| {
            let status = match f.level {
                tracker::FindingLevel::Ok => Status::Ok,
                tracker::FindingLevel::Warning => Status::Warning,
                tracker::FindingLevel::Error => Status::Error,
            };
            Check::new(f.name, status, f.message, f.hint)
        })
        .collect()
}

/// gitlab online: the provider's own findings (`tracker::gitlab::doctor`), as checks.
fn gitlab_checks(settings: &Settings) -> Vec<Check> {
    let ProviderOptions::Gitlab(opts) = &settings.tracker.options else {
        return Vec::new();
    };
    let gl =
        tracker::gitlab::GitLab::new(opts, tracker::StateNames::from_settings(&settings.tracker));
    findings_as_checks(tracker::gitlab::doctor::findings(&gl))
}

/// The webhook listener's settings: a port apart from the others, and a route it serves (the
/// dispatch tracker has a route and a `webhook_secret`). Nothing when neither key is set.
fn webhook_check(settings: &Settings) -> Option<Check> {
    let server = &settings.server;
    let route = crate::webhook::Source::ALL
        .into_iter()
        .find(|s| crate::webhook::route_settings(settings, *s).is_some());
    let Some(port) = server.webhook_port else {
        return settings.tracker.webhook_secret.as_ref().map(|_| {
            Check::new(
                "webhooks",
                Status::Warning,
                "tracker.webhook_secret is set but server.webhook_port is not: no webhook listener, svc polls only",
                Some("set server.webhook_port (and server.webhook_host) to receive webhooks".into()),
            )
        });
    };
    let clash = if port == server.port {
        Some("server.port")
    } else if Some(port) == server.mcp_port {
        Some("server.mcp_port")
    } else {
        None
    };
    Some(match (clash, route) {
        (Some(other), _) => Check::new(
            "webhooks",
            Status::Error,
            format!("server.webhook_port {port} is also {other}"),
            Some("give the webhook listener a port of its own".into()),
        ),
        (None, None) => Check::new(
            "webhooks",
            Status::Warning,
            format!(
                "the webhook listener on {}:{port} serves no route: tracker {} has no webhook_secret{}",
                server.webhook_host,
                settings.tracker.kind,
                if matches!(settings.tracker.provider, config::Provider::Github | config::Provider::Gitlab | config::Provider::TrackerA | config::Provider::TrackerB) { "" } else { " (only github, gitlab, tracker-a and tracker-b have a webhook route)" }
            ),
            Some("set webhook_secret on the tracker (or its environment fallback), or remove server.webhook_port".into()),
        ),
        (None, Some(source)) => Check::ok(
            "webhooks",
            format!(
                "POST {} on {}:{port} (verified with the tracker's webhook_secret; polling every {} ms stays the backstop)",
                source.route(),
                server.webhook_host,
                settings.polling.interval_ms
            ),
        ),
    })
}

/// github online, with a webhook route: each repository has a hook pointing at
/// `/webhooks/github`, where the token may read hooks (a warning where it may not).
fn github_hook_checks(settings: &Settings) -> Vec<Check> {
    let ProviderOptions::Github(opts) = &settings.tracker.options else {
        return Vec::new();
    };
    if settings.server.webhook_port.is_none()
        || crate::webhook::route_settings(settings, crate::webhook::Source::Github).is_none()
    {
        return Vec::new();
    }
    let gh =
        tracker::github::GitHub::new(opts, tracker::StateNames::from_settings(&settings.tracker));
    let route = crate::webhook::Source::Github.route();
    opts.repos
        .iter()
        .map(|repo| match gh.api.get(&format!("/repos/{repo}/hooks")) {
            Ok(got) => {
                let hooks = got.value.as_array().cloned().unwrap_or_default();
                let found = hooks.iter().any(|h| {
                    h["active"] != false
                        && h.pointer("/config/url")
                            .and_then(serde_json::Value::as_str)
                            .is_some_and(|u| u.split(['?', '#']).next().unwrap_or("").ends_with(route))
                });
                if found {
                    Check::ok("webhook_hook", format!("{repo} has an active hook pointing at {route}"))
                } else {
                    Check::new(
                        "webhook_hook",
                        Status::Warning,
                        format!("{repo} has no active hook pointing at {route}: svc learns of its changes only at each poll"),
                        Some(format!("add a webhook in {repo}'s Settings > Webhooks: payload URL https://<your host>{route}, content type application/json, the secret of webhook_secret, events Issues, Issue comments, Pull request reviews, Pull request review comments, Check runs, Check suites, Statuses")),
                    )
                }
            }
            Err(e) => Check::new(
                "webhook_hook",
                Status::Warning,
                format!("cannot tell whether {repo} has a hook pointing at {route}: the token may not read its hooks ({})", e.message),
                Some("give the token Webhooks: Read-only (fine-grained) or admin:repo_hook / read:repo_hook (classic) to have this checked; svc itself does not need it".into()),
            ),
        })
        .collect()
}

/// One authenticated request to the tracker (`--online`).
fn online_check(settings: &Settings) -> Check {
    match &settings.tracker.options {
        ProviderOptions::TrackerA(opts) => {
            let t = tracker::tracker_a::TrackerA::new(
                opts,
                tracker::StateNames::from_settings(&settings.tracker),
            );
            match t.viewer_id() {
                Ok(id) => Check::ok(
                    "tracker_online",
                    format!(
                        "tracker-a at {} accepts the key (viewer {id})",
                        opts.endpoint
                    ),
                ),
                Err(e) => Check::new(
                    "tracker_online",
                    Status::Error,
                    e.message,
                    Some("check tracker.api_key and tracker.endpoint".into()),
                ),
            }
        }
        ProviderOptions::TrackerBMcp(opts) => {
            let t = tracker::tracker_b_mcp::TrackerBMcp::new(
                opts,
                tracker::StateNames::from_settings(&settings.tracker),
            );
            let args = serde_json::json!({"jql": tracker::tracker_b::scope_jql(&opts.scope, &settings.tracker.active_states), "maxResults": 1});
            match t.call_tool(&opts.tools.search, args) {
                Ok(_) => Check::ok(
                    "tracker_online",
                    format!("the MCP server answers {}", opts.tools.search),
                ),
                Err(e) => Check::new(
                    "tracker_online",
                    Status::Error,
                    e.message,
                    Some("check tracker.mcp.url, tracker.mcp.token and tracker.mcp.tools".into()),
                ),
            }
        }
        ProviderOptions::TrackerB(opts) => {
            let t = tracker::tracker_b::TrackerB::new(
                opts,
                tracker::StateNames::from_settings(&settings.tracker),
            );
            match t.call("GET", "/rest/api/3/myself", None) {
                Ok(me) => Check::ok(
                    "tracker_online",
                    format!(
                        "tracker-b accepts the credentials (account {})",
                        me["accountId"].as_str().unwrap_or("?")
                    ),
                ),
                Err(e) => Check::new(
                    "tracker_online",
                    Status::Error,
                    e.message,
                    Some("check tracker.base_url, tracker.email and tracker.api_key".into()),
                ),
            }
        }
        _ => Check::ok(
            "tracker_online",
            format!("{} needs no online check", settings.tracker.provider.name()),
        ),
    }
}

fn prompt_check(settings: &Settings) -> Check {
    let sample = tracker::Issue {
        id: "sample-id".into(),
        identifier: "SAMPLE-1".into(),
        title: "Sample issue".into(),
        description: Some("Sample description".into()),
        state: settings
            .tracker
            .active_states
            .first()
            .cloned()
            .unwrap_or_default(),
        state_type: Some("unstarted".into()),
        labels: vec!["sample".into()],
        url: Some("https://example.invalid/SAMPLE-1".into()),
        created_at: Some("2026-01-01T00:00:00Z".into()),
        updated_at: Some("2026-01-01T00:00:00Z".into()),
        priority: Some(1),
        blocked_by: vec![tracker::Blocker {
            id: "sample-blocker-id".into(),
            identifier: "SAMPLE-0".into(),
            state: "Done".into(),
        }],
    };
    let rendered =
        crate::config::prompt::Template::parse(&settings.prompt_template).and_then(|t| {
            t.render(&sample, None, (0, 1))?;
            t.render(&sample, Some(2), (1, 2))
        });
    match rendered {
        Ok(text) if text.trim().is_empty() => Check::new(
            "prompt_template",
            Status::Warning,
            "the prompt template renders to nothing",
            Some("write the agent's instructions in the Markdown body of WORKFLOW.md".into()),
        ),
        Ok(_) => Check::ok("prompt_template", "renders for a sample issue"),
        Err(e) => Check::new(
            "prompt_template",
            Status::Error,
            e.to_string(),
            Some("available variables: issue.id, issue.identifier, issue.title, issue.description, issue.state, issue.stateType, issue.labels, issue.url, issue.createdAt, issue.updatedAt, issue.priority, issue.blockedBy (each id, identifier, state), attempt".into()),
        ),
    }
}

/// The nearest existing ancestor of `path`.
fn existing_ancestor(path: &Path) -> Option<PathBuf> {
    path.ancestors().find(|p| p.exists()).map(Path::to_path_buf)
}

fn is_writable_dir(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access only reads the NUL-terminated path.
    dir.is_dir() && unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0
}

fn writable_check(name: &str, file: &Path, key: &str) -> Check {
    let dir = file.parent().unwrap_or(Path::new("/"));
    let ok = if file.exists() {
        std::fs::OpenOptions::new().append(true).open(file).is_ok()
    } else {
        existing_ancestor(dir).is_some_and(|a| is_writable_dir(&a))
    };
    if ok {
        Check::ok(name, format!("{} is writable", file.display()))
    } else {
        Check::new(
            name,
            Status::Error,
            format!("{} is not writable", file.display()),
            Some(format!(
                "set {key} to a writable path, or fix the permissions"
            )),
        )
    }
}

fn workspace_check(settings: &Settings) -> Check {
    let root = &settings.workspace.root;
    let ok = if root.exists() {
        is_writable_dir(root)
    } else {
        existing_ancestor(root).is_some_and(|a| is_writable_dir(&a))
    };
    if ok {
        Check::ok("workspace_root", format!("{} is usable", root.display()))
    } else {
        Check::new(
            "workspace_root",
            Status::Error,
            format!("{} cannot be created or written", root.display()),
            Some("set workspace.root or SVC_WORKSPACE_ROOT to a writable directory".into()),
        )
    }
}

fn dashboard_check(settings: &Settings) -> Check {
    match &settings.server.static_dir {
        Some(dir) if dir.join("index.html").is_file() => Check::ok("dashboard_assets", format!("{}/index.html", dir.display())),
        Some(dir) => Check::new(
            "dashboard_assets",
            Status::Error,
            format!("{}/index.html not found", dir.display()),
            Some("remove server.static_dir to use the dashboard built into svc, or point it at a directory with index.html".into()),
        ),
        None => Check::ok("dashboard_assets", format!("built into the binary ({} bytes)", crate::assets::total_bytes())),
    }
}

/// The agent kinds a workflow can run: `agent.kind`, the kinds of status overrides, every
/// configured `agents.<kind>` record (each is also a route), and every kind a fallback list
/// names (runs move there while the listing kind cools down, built-in records included).
fn kinds_in_use(settings: &Settings) -> Vec<String> {
    let mut kinds = vec![settings.agent.kind.clone()];
    kinds.extend(
        settings
            .status_overrides
            .values()
            .map(|o| o.agent.kind.clone()),
    );
    kinds.extend(
        settings
            .agents
            .kinds
            .values()
            .filter(|r| !r.builtin_only)
            .map(|r| r.kind.clone()),
    );
    kinds.extend(fallback_of(settings).into_keys());
    let mut seen = Vec::new();
    kinds.retain(|k| {
        let new = !seen.contains(k);
        seen.push(k.clone());
        new
    });
    kinds
}

/// Every agent record set of the workflow: the base's, then each status override's (named by
/// its state), whose fallback lists may differ.
fn agent_record_sets(settings: &Settings) -> Vec<(Option<&str>, &BTreeMap<String, AgentRecord>)> {
    let mut sets = vec![(None, &settings.agents.kinds)];
    sets.extend(
        settings
            .status_overrides
            .iter()
            .map(|(state, o)| (Some(state.as_str()), &o.agents.kinds)),
    );
    sets
}

/// Each kind some fallback list names, with the kinds whose list names it (base and status
/// overrides together, each listing kind once).
fn fallback_of(settings: &Settings) -> BTreeMap<String, Vec<String>> {
    let mut of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, kinds) in agent_record_sets(settings) {
        for record in kinds.values() {
            for other in &record.fallback {
                let listers = of.entry(other.clone()).or_default();
                if !listers.contains(&record.kind) {
                    listers.push(record.kind.clone());
                }
            }
        }
    }
    of
}

/// `kind`'s record: the base's, else the first status override's that has one.
fn record_of<'s>(settings: &'s Settings, kind: &str) -> Option<&'s AgentRecord> {
    agent_record_sets(settings)
        .into_iter()
        .find_map(|(_, kinds)| kinds.get(kind))
}

/// A fallback list, in words: "agent_a, then agent_c".
fn in_order(kinds: &[String]) -> String {
    kinds.join(", then ")
}

/// The fallback lists (`agents.<kind>.fallback`): one line per kind that has one, and a warning
/// per cycle. A kind the list names without a record, or the kind itself, is a config error
/// (reported with the load); a fallback's bridge is checked with the other kinds in use.
fn fallback_checks(settings: &Settings) -> Vec<Check> {
    let mut out = Vec::new();
    for record in settings.agents.kinds.values() {
        if record.fallback.is_empty() {
            continue;
        }
        out.push(Check::ok(
            format!("agent_fallback_{}", record.kind),
            format!(
                "while {} cools down, its runs go to {} (the first not cooling down)",
                record.kind,
                in_order(&record.fallback)
            ),
        ));
    }
    let mut reported: Vec<Vec<String>> = Vec::new();
    for (state, kinds) in agent_record_sets(settings) {
        for cycle in fallback_cycles(kinds) {
            if reported.contains(&cycle) {
                continue;
            }
            out.push(cycle_check(state, &cycle, kinds));
            reported.push(cycle);
        }
    }
    out
}

/// The most cycles doctor lists (a few kinds make few; many kinds listing each other could
/// make very many, and the first ones say what to fix).
const MAX_FALLBACK_CYCLES: usize = 20;

/// Every cycle of the fallback lists, each once: from its least kind, along the lists. Only
/// kinds with a record count (a list naming another is a config error already).
fn fallback_cycles(kinds: &BTreeMap<String, AgentRecord>) -> Vec<Vec<String>> {
    let mut cycles = Vec::new();
    for start in kinds.keys() {
        let mut path = vec![start.clone()];
        extend_cycles(kinds, &mut path, &mut cycles);
    }
    cycles
}

/// The cycles through `path[0]` that continue `path` with kinds greater than `path[0]` (so a
/// cycle is found only from its least kind) not on it yet.
fn extend_cycles(
    kinds: &BTreeMap<String, AgentRecord>,
    path: &mut Vec<String>,
    cycles: &mut Vec<Vec<String>>,
) {
    let last = path.last().expect("a path starts with one kind").clone();
    let Some(record) = kinds.get(&last) else {
        return;
    };
    for next in &record.fallback {
        if cycles.len() >= MAX_FALLBACK_CYCLES {
            return;
        }
        if *next == path[0] {
            if path.len() > 1 && !cycles.contains(path) {
                cycles.push(path.clone());
            }
            continue;
        }
        if *next < path[0] || path.contains(next) || !kinds.contains_key(next) {
            continue;
        }
        path.push(next.clone());
        extend_cycles(kinds, path, cycles);
        path.pop();
    }
}

/// A warning for one cycle: no loop follows from it (only the limited kind's own list is
/// walked), but the operator may not mean the kinds to stand in for each other.
fn cycle_check(
    state: Option<&str>,
    cycle: &[String],
    kinds: &BTreeMap<String, AgentRecord>,
) -> Check {
    let mut arrows = cycle.to_vec();
    arrows.push(cycle[0].clone());
    let where_ = state.map_or(String::new(), |s| format!("status_overrides.{s}: "));
    let keys: Vec<String> = cycle
        .iter()
        .zip(arrows.iter().skip(1))
        .map(|(kind, next)| {
            let n = kinds[kind]
                .fallback
                .iter()
                .position(|k| k == next)
                .unwrap_or(0);
            format!("agents.{kind}.fallback[{n}] is {next}")
        })
        .collect();
    Check::new(
        "agent_fallback_cycle",
        Status::Warning,
        format!(
            "{where_}the fallback lists form a cycle {} ({})",
            arrows.join(" → "),
            keys.join(", ")
        ),
        Some(
            "this is no loop: a limited kind's runs move once, to the first kind of its own list that is not cooling down, and a fallback's own list is not followed; so these kinds only stand in for each other. Remove one entry if that is not meant"
                .into(),
        ),
    )
}

fn agent_checks(settings: &Settings, env: &Env) -> Vec<Check> {
    let mut out = Vec::new();
    let fallback_of = fallback_of(settings);
    for kind in kinds_in_use(settings) {
        let Some(record) = record_of(settings, &kind) else {
            continue;
        };
        let argv = record.bridge_argv();
        let program = argv.first().copied().unwrap_or_default();
        let name = format!("agent_bridge_{kind}");
        // A fallback's bridge is needed as much as a main kind's: say whose runs it takes.
        let role = fallback_of.get(&kind).map_or(String::new(), |of| {
            format!(
                " (the fallback of {}, runs move to it while that cools down)",
                of.join(" and ")
            )
        });
        match crate::agent::launch::resolve_program(program, env) {
            Some(path) => out.push(Check::ok(
                name,
                format!("{program} at {}{role}", path.display()),
            )),
            None => {
                let hint = match kind.as_str() {
                    "agent_a" => {
                        "install the agent_a ACP bridge (codex-acp) and set agents.agent_a.bridge_command to it"
                    }
                    "agent_b" => {
                        "install the agent_b ACP bridge (claude-agent-acp) and set agents.agent_b.bridge_command to it"
                    }
                    _ => "install the bridge or fix agents.<kind>.bridge_command",
                };
                out.push(Check::new(
                    name,
                    Status::Error,
                    format!("bridge command {program} not found on PATH{role}"),
                    Some(hint.into()),
                ));
            }
        }
        if let Some((var, cli)) = match kind.as_str() {
            "agent_a" => Some(("AGENT_A_PATH", "codex")),
            "agent_b" => Some(("AGENT_B_EXECUTABLE", "claude")),
            _ => None,
        } {
            out.push(agent_cli_check(&kind, var, cli, env));
        }
    }
    out.extend(fallback_checks(settings));
    out
}

fn agent_cli_check(kind: &str, var: &str, cli: &str, env: &Env) -> Check {
    let name = format!("agent_cli_{kind}");
    match crate::agent::launch::resolve_agent_cli(var, cli, env) {
        Ok(path) => Check::ok(name, format!("{cli} at {}", path.display())),
        Err(msg) if env.non_empty(var).is_some() => Check::new(
            name,
            Status::Error,
            msg,
            Some(format!("point {var} at the {cli} binary")),
        ),
        Err(msg) => Check::new(
            name,
            Status::Warning,
            msg,
            Some(format!(
                "bridges that bundle their agent need nothing more; otherwise install {cli} or set {var}"
            )),
        ),
    }
}

/// One workflow's checks in a report on several.
#[derive(Debug, Serialize)]
pub struct WorkflowChecks {
    pub name: String,
    pub path: PathBuf,
    pub checks: Vec<Check>,
}

/// What `svc doctor` found: the checks of one workflow (exactly as ever), or for several the
/// checks across them (discovery, names, daemon-wide agreement, workspace roots) and then each
/// workflow's own.
#[derive(Debug)]
pub enum Report {
    One(Vec<Check>),
    Many {
        common: Vec<Check>,
        workflows: Vec<WorkflowChecks>,
    },
}

/// Checks the workflows the command line names (files and directories; none: the default).
pub fn run_all(args: &[PathBuf], env: &Env, online: bool) -> Report {
    use config::workflows::{self, DaemonWide};
    let found = match workflows::discover(args, env) {
        Ok(found) => found,
        Err(e) => {
            return Report::Many {
                common: vec![Check::new("workflows", Status::Error, e.message, e.hint)],
                workflows: Vec::new(),
            };
        }
    };
    if let [one] = found.as_slice() {
        return Report::One(run(&one.path, env, online));
    }
    let mut common = vec![Check::ok(
        "workflows",
        format!("{} workflow files", found.len()),
    )];
    let sources = match workflows::name_all(&found) {
        Ok(sources) => {
            let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
            common.push(Check::ok("workflow_names", names.join(", ")));
            sources
        }
        Err(e) => {
            common.push(Check::new(
                "workflow_names",
                Status::Error,
                e.message,
                e.hint,
            ));
            found
                .iter()
                .map(|f| workflows::Source {
                    name: workflows::implicit_name(f),
                    path: f.path.clone(),
                })
                .collect()
        }
    };
    // Unreadable files are reported among their own checks.
    let files: Vec<Option<config::workflow::WorkflowFile>> = sources
        .iter()
        .map(|s| config::workflow::read(&s.path).ok())
        .collect();
    let agreed = DaemonWide::from_files(files.iter().flatten());
    common.push(match &agreed {
        Ok(_) => Check::ok(
            "daemon_wide",
            "the workflows agree on server, logging, observability and daemon",
        ),
        Err(e) => Check::new("daemon_wide", Status::Error, &e.message, e.hint.clone()),
    });
    let mut loads = Vec::new();
    for (i, source) in sources.iter().enumerate() {
        // Each workflow with the others' daemon-wide keys, when they agree.
        let others = files
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, f)| f.as_ref());
        let shared = match agreed {
            Ok(_) => DaemonWide::from_files(others).unwrap_or_default(),
            Err(_) => DaemonWide::default(),
        };
        let mut secrets = SecretResolver::new(crate::process::run_program);
        let loaded = config::load_shared(&source.path, env, &mut secrets, &shared);
        loads.push((loaded, secrets));
    }
    let loaded_settings = sources
        .iter()
        .zip(&loads)
        .filter_map(|(s, (l, _))| l.as_ref().ok().map(|l| (s, &l.settings)));
    common.push(match workflows::distinct_roots(loaded_settings) {
        Ok(()) => Check::ok(
            "workspace_roots",
            "each workflow has its own workspace root",
        ),
        Err(e) => Check::new("workspace_roots", Status::Error, e.message, e.hint),
    });
    let workflows = sources
        .into_iter()
        .zip(loads)
        .map(|(source, (loaded, secrets))| WorkflowChecks {
            checks: run_loaded(&source.path, env, online, loaded, secrets),
            name: source.name,
            path: source.path,
        })
        .collect();
    Report::Many { common, workflows }
}

/// Prints a report, one check a line (each workflow's under a line naming it); returns whether
/// any check is an error.
pub fn print_report_human(report: &Report) -> bool {
    let (common, workflows) = match report {
        Report::One(checks) => return print_human(checks),
        Report::Many { common, workflows } => (common, workflows),
    };
    print_lines(common);
    let mut all: Vec<&Check> = common.iter().collect();
    for w in workflows {
        println!("workflow {} ({})", w.name, w.path.display());
        print_lines(&w.checks);
        all.extend(&w.checks);
    }
    print_totals(all.into_iter())
}

/// A report as JSON: `{ok, checks}` for one workflow, plus `workflows: [{name, path,
/// checks}]` for several; returns whether any check is an error.
pub fn print_report_json(report: &Report) -> bool {
    let (common, workflows) = match report {
        Report::One(checks) => return print_json(checks),
        Report::Many { common, workflows } => (common, workflows),
    };
    let failed = common
        .iter()
        .chain(workflows.iter().flat_map(|w| &w.checks))
        .any(|c| c.status == Status::Error);
    let body = serde_json::json!({ "ok": !failed, "checks": common, "workflows": workflows });
    println!("{body}");
    failed
}

/// Prints checks one per line; returns whether any is an error.
pub fn print_human(checks: &[Check]) -> bool {
    print_lines(checks);
    print_totals(checks.iter())
}

fn print_lines(checks: &[Check]) {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in checks {
        let status = match c.status {
            Status::Ok => "ok",
            Status::Warning => "warning",
            Status::Error => "error",
        };
        let mut line = format!("{status:<7}  {:<width$}  {}", c.name, c.message);
        if let Some(h) = &c.hint
            && c.status != Status::Ok
        {
            line.push_str(&format!("  (hint: {h})"));
        }
        println!("{line}");
    }
}

/// The closing line; whether any check is an error.
fn print_totals<'a>(checks: impl Iterator<Item = &'a Check>) -> bool {
    let (mut total, mut errors, mut warnings) = (0, 0, 0);
    for c in checks {
        total += 1;
        errors += usize::from(c.status == Status::Error);
        warnings += usize::from(c.status == Status::Warning);
    }
    println!("{total} checks: {errors} errors, {warnings} warnings");
    errors > 0
}

pub fn print_json(checks: &[Check]) -> bool {
    let failed = checks.iter().any(|c| c.status == Status::Error);
    let body = serde_json::json!({ "ok": !failed, "checks": checks });
    println!("{body}");
    failed
}
