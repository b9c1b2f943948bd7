//! SSH execution through the system OpenSSH client, so `-F $SVC_SSH_CONFIG`, `ProxyJump`,
//! `known_hosts` and agents behave exactly as the operator configured them (ssh2 would bypass
//! all of that). Every remote command is `ssh [-F <config>] <host> '<guard>'`, each word
//! single-quoted; the local `ssh` runs in its own process group and is killed as a group
//! (SIGTERM, SIGKILL 5 s later) past its timeout (`worker.ssh_timeout_ms`, or a hook's own), and
//! the [`guard`] ends the remote process group when that connection ends.
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

/// What a guarded remote command reads on stdin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteStdin {
    /// `/dev/null` (hooks, workspace commands); svc holds the ssh client's stdin open only
    /// as the lifeline ([`process::Spec::hold_stdin`]).
    Null,
    /// What svc writes to the ssh client (an agent bridge's JSON-RPC), relayed through a FIFO.
    Relay,
}

/// Wraps `command` so that nothing of it outlives its connection on the worker.
///
/// A killed `ssh` client does not end its remote command (without a terminal, sshd sends it
/// no signal), so every remote command runs under this POSIX-shell guard: the command gets a
/// session (and so a process group) of its own through `setsid`, and a lifeline (`cat`) reads
/// the channel's stdin. svc keeps that stdin open for as long as it wants the command; it hits
/// end-of-file when the local `ssh` ends for any reason (a timeout or a cancel killing its
/// group, a stop, the daemon killed by SIGKILL taking its children along through the
/// parent-death signal), because sshd then closes the session. The lifeline then sends the
/// whole remote group SIGTERM, and SIGKILL after the 5 s grace. When the command ends by
/// itself, what is left of its group is killed at once, as for a local child, and the
/// lifeline is retired. The wrapper exits with the command's status.
pub fn guard(command: &str, stdin: RemoteStdin) -> String {
    let grace = process::KILL_GRACE.as_secs();
    let (prepare, input, cleanup) = match stdin {
        RemoteStdin::Null => ("", "/dev/null", ""),
        RemoteStdin::Relay => (
            "d=$(mktemp -d \"${TMPDIR:-/tmp}/svc-guard.XXXXXX\") && mkfifo \"$d/in\" || { echo 'svc: cannot create the stdin relay on the worker (mktemp, mkfifo)' >&2; exit 125; }; ",
            "\"$d/in\"",
            "; rm -rf \"$d\"",
        ),
    };
    format!(
        "c={command}; exec 3<&0 </dev/null; {prepare}\
if command -v setsid >/dev/null 2>&1; then setsid sh -c \"$c\" <{input} 3<&- & else sh -c \"$c\" <{input} 3<&- & fi; p=$!; \
( cat <&3 >{input}; kill -TERM -\"$p\" || kill -TERM \"$p\"; i=0; \
while [ $i -lt {grace} ] && kill -0 -\"$p\"; do sleep 1; i=$((i+1)); done; \
kill -KILL -\"$p\" || kill -KILL \"$p\"{cleanup} ) >/dev/null 2>&1 & l=$!; \
exec 3<&-; wait \"$p\"; r=$?; kill \"$l\" 2>/dev/null; kill -KILL -\"$p\" 2>/dev/null{cleanup}; exit $r",
        command = quote(command),
    )
}

/// The ssh client of an agent bridge on `target`: `command` guarded with its stdin relayed
/// (the run holds the client's stdin for the bridge's whole life).
pub fn bridge_spec(target: &Target, command: &str) -> process::Spec {
    spec(target, &[], &guard(command, RemoteStdin::Relay))
}

/// Runs `remote_command` on `target` with `timeout`, guarded ([`guard`]) so that a timeout
/// ends it on the worker too; a connection failure is an `Err` carrying ssh's own words.
pub fn run(target: &Target, remote_command: &str, timeout: Duration) -> Result<Outcome, String> {
    let spec = spec(target, &[], &guard(remote_command, RemoteStdin::Null)).hold_stdin();
    let out = process::run(&spec, timeout)
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

    /// Runs a guarded command locally under `shell` (as a login shell on the worker would),
    /// with stdin piped; returns the child.
    fn guarded(shell: &str, command: &str, stdin: RemoteStdin) -> std::process::Child {
        std::process::Command::new(shell)
            .arg("-c")
            .arg(guard(command, stdin))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    fn first_line(child: &mut std::process::Child) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        line.trim().to_string()
    }

    fn gone_within(pid: i32, secs: u64) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        while std::time::Instant::now() < deadline {
            if !process::is_alive(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    #[test]
    fn the_guard_relays_stdin_output_and_the_exit_status() {
        use std::io::Write;
        for shell in ["sh", "bash"] {
            let mut child = guarded(shell, "read x; echo \"got $x\"; exit 3", RemoteStdin::Relay);
            // The lifeline stays open (closing it would end the command: see below).
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(b"abc\n").unwrap();
            assert_eq!(first_line(&mut child), "got abc", "{shell}");
            let status = child.wait().unwrap();
            assert_eq!(status.code(), Some(3), "{shell}: {status:?}");
            drop(stdin);
            // Null: the command reads nothing, though svc holds the lifeline open.
            // (`Child::wait` closes the child's stdin first: take it, or the lifeline ends
            // and may take the command with it before it exits by itself.)
            let mut child = guarded(shell, "cat; echo done", RemoteStdin::Null);
            let lifeline = child.stdin.take();
            assert_eq!(first_line(&mut child), "done", "{shell}");
            let status = child.wait().unwrap();
            assert!(status.success(), "{shell}: {status:?}");
            drop(lifeline);
        }
    }

    #[test]
    fn the_guard_ends_the_whole_group_when_the_lifeline_closes() {
        for (shell, stdin) in [("sh", RemoteStdin::Null), ("bash", RemoteStdin::Relay)] {
            // The whole group ignores SIGTERM (an ignored signal stays ignored across exec):
            // it takes the SIGKILL after the grace.
            let mut child = guarded(
                shell,
                "trap '' TERM; sleep 1000 & echo $!; sleep 1000",
                stdin,
            );
            let pid: i32 = first_line(&mut child).parse().unwrap();
            assert!(process::is_alive(pid));
            drop(child.stdin.take()); // the connection ends
            assert!(
                gone_within(pid, process::KILL_GRACE.as_secs() + 3),
                "{shell}"
            );
            child.wait().unwrap();
        }
    }

    #[test]
    fn what_a_finished_guarded_command_leaves_in_its_group_is_killed() {
        let mut child = guarded("sh", "sleep 1000 & echo $!", RemoteStdin::Null);
        let pid: i32 = first_line(&mut child).parse().unwrap();
        // svc still holds the lifeline: the end of the command alone ends its group.
        assert!(gone_within(pid, 3));
        child.wait().unwrap();
    }
}
