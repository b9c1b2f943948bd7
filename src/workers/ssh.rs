//! SSH execution through the system OpenSSH client, so `-F $SVC_SSH_CONFIG`, `ProxyJump`,
//! `known_hosts` and agents behave exactly as the operator configured them (ssh2 would bypass
//! all of that). Every remote command is `ssh [-F <config>] <host> 'cd <dir> && <command>'`,
//! each word single-quoted; it runs in its own process group and is killed as a group
//! (SIGTERM, SIGKILL 5 s later) past its timeout (`worker.ssh_timeout_ms`, or a hook's own).
//!
//! Remote workspaces follow the local rules: the root is the configured `workspace.root`, where
//! a leading `~` or `$HOME` means the worker's home; an issue's directory is its sanitized
//! identifier under it, and its real path is checked to be inside the root's real path before
//! every hook (a symlink may not lead out).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use crate::process;

/// Where a remote command goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    /// `SVC_SSH_CONFIG`, passed as `-F`.
    pub config: Option<PathBuf>,
    /// `worker.ssh_timeout_ms`.
    pub timeout: Duration,
    /// Options a driver hands over for its machines (a worker record's
    /// `metadata.sshOptions`, such as the identity and the pinned host key of a container),
    /// placed before the operator's config takes effect for the rest.
    pub options: Vec<String>,
}

/// The `sshOptions` of a worker record's metadata (strings only).
pub fn options_of(metadata: &serde_json::Value) -> Vec<String> {
    metadata
        .get("sshOptions")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|o| o.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A word for a POSIX shell, single-quoted (`it's` becomes `'it'\''s'`).
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// `ssh [-F cfg] -T -o BatchMode=yes <host> <remote command>`; `extra` options go before the host.
pub fn spec(target: &Target, extra: &[&str], remote_command: &str) -> process::Spec {
    let mut spec = process::Spec::new("ssh");
    if let Some(config) = &target.config {
        spec = spec.arg("-F").arg(config);
    }
    for arg in ["-T", "-o", "BatchMode=yes"].iter().chain(extra) {
        spec = spec.arg(*arg);
    }
    for option in &target.options {
        spec = spec.arg(option);
    }
    // `--` ends ssh's options: a host can never be read as one.
    spec.arg("--").arg(&target.host).arg(remote_command)
}

/// The remote command `cd <dir> && <command>`.
pub fn in_dir(dir: &str, command: &str) -> String {
    format!("cd {} && {command}", quote(dir))
}

/// The outcome of a remote command.
#[derive(Debug)]
pub struct Outcome {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    pub status: String,
}

/// Runs `remote_command` on `target` with `timeout`; a connection failure is an `Err` carrying
/// ssh's own words.
pub fn run(target: &Target, remote_command: &str, timeout: Duration) -> Result<Outcome, String> {
    let out = process::run(&spec(target, &[], remote_command), timeout)
        .map_err(|e| format!("ssh {}: cannot start ssh: {e}", target.host))?;
    // ssh exits 255 for its own failures (connection, authentication, host key).
    if out.status.code() == Some(255) && !out.timed_out {
        let why = out.stderr.trim();
        return Err(format!(
            "ssh {}: {}",
            target.host,
            if why.is_empty() {
                "connection failed"
            } else {
                why
            }
        ));
    }
    Ok(Outcome {
        ok: out.success(),
        timed_out: out.timed_out,
        status: out.describe_status(),
        stdout: out.stdout,
        stderr: out.stderr,
    })
}

/// The worker's home directory, asked once per host and remembered.
pub fn home(target: &Target) -> Result<String, String> {
    static HOMES: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);
    let key = format!("{}|{:?}", target.host, target.config);
    if let Some(h) = HOMES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&key)
    {
        return Ok(h.clone());
    }
    let out = run(target, "printf %s \"$HOME\"", target.timeout)?;
    let home = out.stdout.trim().to_string();
    if !out.ok || !home.starts_with('/') {
        return Err(format!(
            "ssh {}: cannot read the worker's home ({})",
            target.host,
            if out.timed_out {
                "timed out".to_string()
            } else {
                out.status
            }
        ));
    }
    HOMES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, home.clone());
    Ok(home)
}

/// The workspace root on the worker: `~` and `$HOME` (and `${HOME}`) at the start mean the
/// worker's home; a relative root is relative to it; without a setting, `/tmp/svc_workspaces`.
pub fn remote_root(target: &Target, setting: Option<&str>) -> Result<String, String> {
    let Some(raw) = setting.filter(|s| !s.trim().is_empty()) else {
        return Ok("/tmp/svc_workspaces".into());
    };
    for prefix in ["~", "$HOME", "${HOME}"] {
        if let Some(rest) = raw.strip_prefix(prefix)
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return Ok(format!("{}{rest}", home(target)?));
        }
    }
    if raw.starts_with('/') {
        Ok(raw.to_string())
    } else {
        Ok(format!("{}/{raw}", home(target)?))
    }
}

/// A shell check that `<root>/<name>` exists and its real path is directly inside the root's.
fn contained(root: &str, name: &str) -> String {
    format!(
        "r=$(cd {root} && pwd -P) && w=$(cd {root}/{name} && pwd -P) && [ \"$w\" = \"$r/\"{name} ] || {{ echo 'workspace outside root (unsafe symlink in workspace path)' >&2; exit 97; }}",
        root = quote(root),
        name = quote(name)
    )
}

/// Creates `<root>/<name>` on the worker; `Ok(true)` when it was created now.
pub fn ensure_workspace(target: &Target, root: &str, name: &str) -> Result<bool, String> {
    let script = format!(
        "mkdir -p -- {root} && if [ -d {path} ]; then s=existed; else mkdir -- {path} && s=created; fi && {check} && echo $s",
        root = quote(root),
        path = quote(&format!("{root}/{name}")),
        check = contained(root, name)
    );
    let out = run(target, &script, target.timeout)?;
    if !out.ok {
        return Err(remote_failure(target, "creating the workspace", &out));
    }
    Ok(out.stdout.trim() == "created")
}

/// Removes `<root>/<name>` on the worker (a missing one is fine).
pub fn remove_workspace(target: &Target, root: &str, name: &str) -> Result<(), String> {
    let path = quote(&format!("{root}/{name}"));
    let script = format!(
        "if [ -e {path} ]; then {check} && rm -rf -- {path}; fi",
        check = contained(root, name)
    );
    let out = run(target, &script, target.timeout)?;
    if !out.ok {
        return Err(remote_failure(target, "removing the workspace", &out));
    }
    Ok(())
}

/// `cd <workspace>` after the containment check, then `command` (for hooks and the bridge).
pub fn in_workspace(root: &str, name: &str, command: &str) -> String {
    format!(
        "{check} && cd {path} && {command}",
        check = contained(root, name),
        path = quote(&format!("{root}/{name}"))
    )
}

/// `env K=V ... <argv...>` with every word quoted.
pub fn with_env(env: &[(String, String)], argv: &[&str]) -> String {
    let mut words: Vec<String> = vec!["env".into()];
    words.extend(env.iter().map(|(k, v)| quote(&format!("{k}={v}"))));
    words.extend(argv.iter().map(|a| quote(a)));
    words.join(" ")
}

fn remote_failure(target: &Target, what: &str, out: &Outcome) -> String {
    let why = out.stderr.trim();
    format!(
        "ssh {}: {what} failed ({}){}",
        target.host,
        if out.timed_out {
            format!("timed out after {} ms", target.timeout.as_millis())
        } else {
            out.status.clone()
        },
        if why.is_empty() {
            String::new()
        } else {
            format!(": {}", why.chars().take(500).collect::<String>())
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_a_posix_shell() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's $HOME; rm -rf /"), r"'it'\''s $HOME; rm -rf /'");
        assert_eq!(
            with_env(&[("A".into(), "x y".into())], &["svc", "demo-agent"]),
            "env 'A=x y' 'svc' 'demo-agent'"
        );
        assert_eq!(in_dir("/w s", "true"), "cd '/w s' && true");
        let t = Target {
            host: "-oProxyCommand=x".into(),
            config: Some("/etc/cfg".into()),
            timeout: Duration::from_secs(1),
            options: Vec::new(),
        };
        let s = spec(&t, &[], "true");
        let args: Vec<String> = s.args.iter().map(|a| a.to_string_lossy().into()).collect();
        assert_eq!(
            args,
            [
                "-F",
                "/etc/cfg",
                "-T",
                "-o",
                "BatchMode=yes",
                "--",
                "-oProxyCommand=x",
                "true"
            ]
        );
    }
}
