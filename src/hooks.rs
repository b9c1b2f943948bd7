//! Workflow hooks: shell scripts run by a login shell in the workspace, each in its own process
//! group, killed as a group at `hooks.timeout_ms` (SIGTERM, then SIGKILL 5 s later). Containment
//! of the workspace is re-checked immediately before every launch.

use std::path::Path;
use std::time::Duration;

use crate::process;
use crate::workspace;

/// Hook output kept in logs, in characters.
pub const LOG_LIMIT: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    AfterCreate,
    BeforeRun,
    AfterRun,
    BeforeRemove,
}

impl Hook {
    pub fn name(self) -> &'static str {
        match self {
            Hook::AfterCreate => "after_create",
            Hook::BeforeRun => "before_run",
            Hook::AfterRun => "after_run",
            Hook::BeforeRemove => "before_remove",
        }
    }
}

/// What a hook run needs to know.
pub struct HookRun<'a> {
    pub hook: Hook,
    pub script: &'a str,
    pub workspace_root: &'a Path,
    pub workspace: &'a Path,
    pub timeout: Duration,
    /// Extra variables (`SVC_ISSUE_ID`, ...).
    pub env: &'a [(String, String)],
}

/// Truncates `text` to [`LOG_LIMIT`] characters, saying how much was cut.
pub fn truncate_for_log(text: &str) -> String {
    let count = text.chars().count();
    if count <= LOG_LIMIT {
        return text.to_string();
    }
    let kept: String = text.chars().take(LOG_LIMIT).collect();
    format!(
        "{kept}... [{} more characters truncated]",
        count - LOG_LIMIT
    )
}

/// How a hook's process ended, local or remote.
struct Ended<'a> {
    ok: bool,
    timed_out: bool,
    status: String,
    stdout: &'a str,
    stderr: &'a str,
}

/// Logs a finished hook's output (truncated) and turns its end into the run's result; `place`
/// says where it ran (`in <workspace>`, `on <host>`).
fn verdict(hook: Hook, place: &str, timeout: Duration, end: Ended) -> Result<(), String> {
    let Ended {
        ok,
        timed_out,
        status,
        stdout,
        stderr,
    } = end;
    let name = hook.name();
    let output = truncate_for_log(format!("{stdout}{stderr}").trim());
    if ok {
        if !output.is_empty() {
            log::info!("hook {name} {place}: {output}");
        }
        Ok(())
    } else if timed_out {
        let ms = timeout.as_millis();
        log::warn!("hook {name} timed out after {ms} ms {place}: {output}");
        Err(format!("hook {name} timed out after {ms} ms"))
    } else {
        log::warn!("hook {name} failed ({status}) {place}: {output}");
        Err(format!("hook {name} failed ({status})"))
    }
}

/// Runs a hook; `Err` carries a message fit for events and logs.
pub fn run(h: &HookRun) -> Result<(), String> {
    let name = h.hook.name();
    if process::stopping() {
        return Err(format!("hook {name} not started: svc is stopping"));
    }
    workspace::check_contained(h.workspace_root, h.workspace)
        .map_err(|e| format!("hook {name} not run: {e}"))?;
    let mut spec = process::Spec::new("/bin/bash")
        .arg("-lc")
        .arg(h.script)
        .cwd(h.workspace);
    for (k, v) in h.env {
        spec = spec.env(k, v);
    }
    let out =
        process::run(&spec, h.timeout).map_err(|e| format!("hook {name} could not start: {e}"))?;
    let place = format!("in {}", h.workspace.display());
    verdict(
        h.hook,
        &place,
        h.timeout,
        Ended {
            ok: out.success(),
            timed_out: out.timed_out,
            status: out.describe_status(),
            stdout: &out.stdout,
            stderr: &out.stderr,
        },
    )
}

/// Runs a hook on a remote worker: `ssh <host> '<containment check> && cd <workspace> &&
/// env <vars> bash -lc <script>'`, killed as a group at `timeout` like a local one (the remote
/// side ends when its session does).
pub fn run_remote(
    hook: Hook,
    script: &str,
    target: &crate::workers::ssh::Target,
    root: &str,
    name: &str,
    timeout: Duration,
    env: &[(String, String)],
) -> Result<(), String> {
    use crate::workers::ssh;
    let hook_name = hook.name();
    if process::stopping() {
        return Err(format!("hook {hook_name} not started: svc is stopping"));
    }
    let command = ssh::in_workspace(root, name, &ssh::with_env(env, &["bash", "-lc", script]));
    let out = ssh::run(target, &command, timeout)
        .map_err(|e| format!("hook {hook_name} could not run: {e}"))?;
    let place = format!("on {}", target.host);
    verdict(
        hook,
        &place,
        timeout,
        Ended {
            ok: out.ok,
            timed_out: out.timed_out,
            status: out.status.clone(),
            stdout: &out.stdout,
            stderr: &out.stderr,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn hooks_run_in_the_workspace_and_report_failures() {
        let root = std::env::temp_dir().join(format!("svc-hooks-{}", std::process::id()));
        let ws = root.join("ENG-1");
        fs::create_dir_all(&ws).unwrap();
        // A HOME of its own: a login shell reads the user's profile, and killing one mid-way
        // (the timeout case below) can leave that profile's tools in a bad state (a stale
        // pyenv rehash lock made every later login shell wait 60 s).
        let env = vec![
            ("SVC_ISSUE_IDENTIFIER".to_string(), "ENG-1".to_string()),
            ("HOME".to_string(), root.display().to_string()),
        ];
        let run_script = |script: &str, timeout_ms: u64| {
            run(&HookRun {
                hook: Hook::BeforeRun,
                script,
                workspace_root: &root,
                workspace: &ws,
                timeout: Duration::from_millis(timeout_ms),
                env: &env,
            })
        };
        run_script(
            "pwd > where.txt; echo $SVC_ISSUE_IDENTIFIER >> where.txt",
            5000,
        )
        .unwrap();
        let text = fs::read_to_string(ws.join("where.txt")).unwrap();
        assert_eq!(
            text,
            format!("{}\nENG-1\n", fs::canonicalize(&ws).unwrap().display())
        );
        assert_eq!(
            run_script("exit 7", 5000).unwrap_err(),
            "hook before_run failed (exit code 7)"
        );
        assert!(
            run_script("sleep 20", 200)
                .unwrap_err()
                .contains("timed out")
        );
        // A workspace outside the root is refused before anything runs.
        let err = run(&HookRun {
            hook: Hook::AfterCreate,
            script: "touch should-not-exist",
            workspace_root: &ws,
            workspace: &root,
            timeout: Duration::from_secs(5),
            env: &[],
        })
        .unwrap_err();
        assert!(err.contains("workspace outside root"), "{err}");
        assert!(!root.join("should-not-exist").exists());
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn log_output_is_truncated_to_4096_characters() {
        let long = "é".repeat(5000);
        let t = truncate_for_log(&long);
        assert!(t.starts_with(&"é".repeat(4096)));
        assert!(t.ends_with("[904 more characters truncated]"));
        assert_eq!(truncate_for_log("short"), "short");
    }
}
