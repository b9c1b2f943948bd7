//! The one place that spawns child processes. Every child runs in its own process group, dies
//! with the thread that spawned it (Linux parent-death signal), and is killed as a whole group on
//! timeout: SIGTERM first, SIGKILL after a grace period.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::Duration;

/// Grace between SIGTERM and SIGKILL for a process group (the spec's 5000 ms).
pub const KILL_GRACE: Duration = Duration::from_millis(5000);

/// Output a child may write before the rest is dropped, per stream.
const CAPTURE_LIMIT: usize = 1 << 20;

/// The file-mode mask children get: the one svc started with. svc's own files (the lock file,
/// the stores, traces, logs) are created under `077` instead ([`keep_own_files_private`]).
static CHILD_UMASK: std::sync::OnceLock<libc::mode_t> = std::sync::OnceLock::new();

/// From now on, what svc creates is readable by its user alone (files 0600, folders 0700):
/// they hold issue text and steering messages. Children keep the mask svc started with.
/// Call it before any other thread exists (the mask is the process's).
pub fn keep_own_files_private() {
    // SAFETY: umask only swaps the process's file-mode mask.
    let started_with = unsafe { libc::umask(0o077) };
    let _ = CHILD_UMASK.set(started_with);
}

/// The mode a file meant for people (a board file) gets when created: `0o666` under the mask
/// svc started with.
pub fn people_file_mode() -> u32 {
    0o666 & !CHILD_UMASK.get().copied().unwrap_or(0o022)
}

/// The variable that carries the daemon's control token: no child inherits it.
pub const CONTROL_TOKEN_VAR: &str = "SVC_CONTROL_TOKEN";

/// Variables svc reads a secret from whatever the workflow says, which no child inherits (an
/// agent, hook, worker driver or tunnel that needs one gets it from `agents.<kind>.env`): the
/// control token, the claim store's URI (`postgres://user:password@...`) and the libpq
/// variables that hold or point at the fleet database's secrets. The 1Password CLI's own
/// tokens are withheld too, but from `op` itself ([`run_program`]).
pub const ALWAYS_WITHHELD: [&str; 6] = [
    CONTROL_TOKEN_VAR,
    "SVC_CLAIM_STORE",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSSLKEY",
    "PGSERVICEFILE",
];

/// The 1Password CLI's credentials: only `op` gets them.
const OP_VARS: [&str; 3] = ["OP_SERVICE_ACCOUNT_TOKEN", "OP_CONNECT_TOKEN", "OP_SESSION"];

/// Variables a loaded workflow read a credential from ([`withhold`]): no child inherits them.
static WITHHELD: Mutex<BTreeSet<OsString>> = Mutex::new(BTreeSet::new());

/// From now on no child inherits `names` (the variables a workflow read its credentials from;
/// a variable once withheld stays withheld, across reloads).
pub fn withhold<I: IntoIterator<Item = S>, S: AsRef<str>>(names: I) {
    let mut withheld = WITHHELD.lock().unwrap_or_else(|p| p.into_inner());
    for name in names {
        withheld.insert(name.as_ref().into());
    }
}

/// Whether a child inherits the variable `name` from svc: never one svc read a secret from.
fn withheld(name: &std::ffi::OsStr, withheld: &BTreeSet<OsString>, keep_op: bool) -> bool {
    let text = name.to_string_lossy();
    ALWAYS_WITHHELD.contains(&text.as_ref())
        || withheld.contains(name)
        || (!keep_op && (OP_VARS.contains(&text.as_ref()) || text.starts_with("OP_SESSION_")))
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Spec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub cwd: Option<PathBuf>,
    /// Variables added to (or replacing) the inherited environment.
    pub env: Vec<(OsString, OsString)>,
    /// Inherited variables the child does not get, before `env` applies; besides these, no
    /// child inherits a variable svc read a secret from ([`ALWAYS_WITHHELD`], [`withhold`]).
    pub remove: Vec<OsString>,
    /// The 1Password CLI's tokens are inherited (for `op` alone).
    pub keep_op: bool,
    /// For [`run`]: stdin is a pipe svc holds open until the child has ended, instead of
    /// `/dev/null`. A remote command reads it as its lifeline: `ssh` forwards the pipe, so the
    /// worker sees end-of-file exactly when this `ssh` is gone (see `workers::ssh::guard`).
    pub hold_stdin: bool,
}

impl Spec {
    pub fn new(program: impl Into<PathBuf>) -> Spec {
        Spec {
            program: program.into(),
            args: Vec::new(),
            cwd: None,
            env: Vec::new(),
            remove: Vec::new(),
            keep_op: false,
            hold_stdin: false,
        }
    }

    /// See [`Spec::hold_stdin`].
    pub fn hold_stdin(mut self) -> Spec {
        self.hold_stdin = true;
        self
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Spec {
        self.args.push(arg.into());
        self
    }

    pub fn cwd(mut self, dir: &Path) -> Spec {
        self.cwd = Some(dir.to_path_buf());
        self
    }

    /// The child does not inherit `key` (a value set with [`Spec::env`] still applies).
    pub fn without(mut self, key: impl Into<OsString>) -> Spec {
        self.remove.push(key.into());
        self
    }

    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Spec {
        self.env.push((key.into(), value.into()));
        self
    }

    /// A `std::process::Command` in its own process group that receives SIGKILL when the
    /// spawning thread exits.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        if let Some(cwd) = &self.cwd {
            cmd.current_dir(cwd);
        }
        for k in &self.remove {
            cmd.env_remove(k);
        }
        {
            let names = WITHHELD.lock().unwrap_or_else(|p| p.into_inner());
            for (k, _) in std::env::vars_os() {
                if withheld(&k, &names, self.keep_op) {
                    cmd.env_remove(k);
                }
            }
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if let Some(marker) = OWNER_MARKER.get() {
            cmd.env(OWNER_VAR, marker);
        }
        cmd.process_group(0);
        let umask = CHILD_UMASK.get().copied();
        // SAFETY: prctl and umask are async-signal-safe and touch no memory of the parent.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(mask) = umask {
                    libc::umask(mask);
                }
                #[cfg(target_os = "linux")]
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                Ok(())
            });
        }
        cmd
    }
}

/// The result of a child that ran to completion (or was killed).
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

impl Output {
    pub fn success(&self) -> bool {
        !self.timed_out && self.status.success()
    }

    /// "exit code N" or "killed by signal N".
    pub fn describe_status(&self) -> String {
        if self.timed_out {
            return "timed out".to_string();
        }
        match (self.status.code(), self.status.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => "unknown status".to_string(),
        }
    }
}

/// The variable every child of a daemon carries (and its descendants inherit): the daemon's lock
/// file path. A later daemon holding the same lock knows any process that still carries it is
/// an orphan of a daemon that died (even by SIGKILL), and ends it.
pub const OWNER_VAR: &str = "SVC_DAEMON_LOCK";
static OWNER_MARKER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Marks every child spawned from now on as belonging to the daemon holding `lock_path`.
pub fn set_owner_marker(lock_path: &str) {
    let _ = OWNER_MARKER.set(lock_path.to_string());
}

/// SIGKILLs every process (other than this one) whose environment carries
/// `SVC_DAEMON_LOCK=<lock_path>`: orphans of an earlier daemon on the same workflow. Call only
/// while holding that lock. Returns the pids it ended.
pub fn reap_orphans(lock_path: &str) -> Vec<i32> {
    reap_marked(lock_path, &BTreeSet::new())
}

/// The process group of `pid` (Linux `/proc`).
fn pgid_of(pid: i32) -> Option<libc::pid_t> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // After the command name: state, ppid, pgrp.
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// [`reap_orphans`], sparing processes of the groups in `spare`.
fn reap_marked(lock_path: &str, spare: &BTreeSet<libc::pid_t>) -> Vec<i32> {
    let needle = format!("{OWNER_VAR}={lock_path}");
    let me = std::process::id() as i32;
    let mut reaped = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return reaped;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me || pgid_of(pid).is_some_and(|g| spare.contains(&g)) {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|b| *b == 0)
            .any(|var| var == needle.as_bytes())
        {
            // SAFETY: kill has no memory effects.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            reaped.push(pid);
        }
    }
    reaped
}

/// Process groups of children that are alive, so that a stop or a forced exit can kill them all.
static LIVE_GROUPS: Mutex<BTreeSet<libc::pid_t>> = Mutex::new(BTreeSet::new());

/// Process groups of the daemon's own helpers (out-of-tree worker drivers): a stop leaves them
/// running, since draining the worker pool needs them; a forced exit kills them too.
static SERVICE_GROUPS: Mutex<BTreeSet<libc::pid_t>> = Mutex::new(BTreeSet::new());

/// Set once the daemon stops: from then on no child is started.
static STOPPING: AtomicBool = AtomicBool::new(false);

fn register(pgid: libc::pid_t) {
    let mut groups = LIVE_GROUPS.lock().unwrap_or_else(|p| p.into_inner());
    // Checked under the lock that `stop_all` takes, so a child spawned while the stop began is
    // either in the set `stop_all` signals, or killed here: none slips through.
    if STOPPING.load(Ordering::Acquire) {
        kill_group(pgid, libc::SIGKILL);
    }
    groups.insert(pgid);
}

/// Registers a child's group as work ([`register`]) or as one of the daemon's helpers.
fn register_as(pgid: libc::pid_t, service: bool) {
    if service {
        SERVICE_GROUPS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pgid);
    } else {
        register(pgid);
    }
}

fn unregister(pgid: libc::pid_t) {
    LIVE_GROUPS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&pgid);
    SERVICE_GROUPS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&pgid);
}

fn service_groups() -> BTreeSet<libc::pid_t> {
    SERVICE_GROUPS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// SIGKILLs every process group of the daemon's work (hooks, bridges, `op`) still registered.
fn kill_work_groups() {
    let groups: Vec<libc::pid_t> = LIVE_GROUPS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .copied()
        .collect();
    for g in groups {
        kill_group(g, libc::SIGKILL);
    }
}

/// SIGKILLs every process group svc started that is still registered, helpers included
/// (forced exit).
pub fn kill_all_groups() {
    kill_work_groups();
    for g in service_groups() {
        kill_group(g, libc::SIGKILL);
    }
}

/// SIGKILLs every registered process group and every process carrying this daemon's owner
/// marker: that also ends descendants that left their group (`setsid`, a double fork).
pub fn kill_everything() {
    kill_all_groups();
    if let Some(marker) = OWNER_MARKER.get() {
        reap_orphans(marker);
    }
}

/// The end of a stop's grace: the work's groups and every marked process outside the helpers'
/// groups get SIGKILL; the helpers (worker drivers) live on until the pool has drained.
pub fn kill_work() {
    kill_work_groups();
    if let Some(marker) = OWNER_MARKER.get() {
        reap_marked(marker, &service_groups());
    }
}

/// The daemon's graceful stop, for every child at once: no new child starts from now on
/// ([`stopping`]), every live process group (hooks, bridges, `op`) gets SIGTERM now, and
/// SIGKILL [`KILL_GRACE`] later. Returns at once; a second call does nothing.
///
/// This is what bounds a stop: whatever a run thread is waiting on (a hook, a bridge's turn)
/// ends within the grace, so the threads wind down by themselves.
pub fn stop_all() {
    let groups: Vec<libc::pid_t> = {
        let groups = LIVE_GROUPS.lock().unwrap_or_else(|p| p.into_inner());
        if STOPPING.swap(true, Ordering::AcqRel) {
            return;
        }
        groups.iter().copied().collect()
    };
    for g in &groups {
        kill_group(*g, libc::SIGTERM);
    }
    let _ = std::thread::Builder::new()
        .name("stop-kill".into())
        .spawn(|| {
            std::thread::sleep(KILL_GRACE);
            kill_work();
        });
}

/// Whether the daemon is stopping (no child may start).
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Acquire)
}

fn refuse_when_stopping() -> io::Result<()> {
    if stopping() {
        return Err(io::Error::other(
            "svc is stopping; no new process is started",
        ));
    }
    Ok(())
}

/// A long-running child with piped stdio (an agent bridge). Dropping it kills its group.
pub struct Piped {
    pub child: Child,
    pub pgid: libc::pid_t,
    reaped: bool,
}

impl Piped {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ends the whole group: SIGTERM, then SIGKILL after `grace`; returns the exit status.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.reaped {
            return None;
        }
        kill_group(self.pgid, libc::SIGTERM);
        let status = wait_with_deadline(&mut self.child, grace).or_else(|| {
            kill_group(self.pgid, libc::SIGKILL);
            self.child.wait().ok()
        });
        kill_group(self.pgid, libc::SIGKILL);
        self.reaped = true;
        unregister(self.pgid);
        status
    }

    /// Waits up to `timeout` for the child to exit by itself.
    pub fn wait_for(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let status = wait_with_deadline(&mut self.child, timeout)?;
        kill_group(self.pgid, libc::SIGKILL);
        self.reaped = true;
        unregister(self.pgid);
        Some(status)
    }
}

impl Drop for Piped {
    fn drop(&mut self) {
        if !self.reaped {
            self.terminate(Duration::from_millis(200));
        }
    }
}

fn wait_with_deadline(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            _ => return None,
        }
    }
}

/// Spawns one of the daemon's helpers (an out-of-tree worker driver) like [`spawn_piped`], but
/// outside the work a stop ends: a stop neither refuses nor signals it (draining the pool needs
/// it), a forced exit and the end of its owning thread still kill it.
pub fn spawn_service(spec: &Spec) -> io::Result<Piped> {
    spawn_piped_as(spec, true)
}

/// Spawns `spec` with stdin, stdout and stderr piped, in its own registered process group.
/// Call from the thread that owns the child for its whole life (parent-death signal).
pub fn spawn_piped(spec: &Spec) -> io::Result<Piped> {
    refuse_when_stopping()?;
    spawn_piped_as(spec, false)
}

fn spawn_piped_as(spec: &Spec, service: bool) -> io::Result<Piped> {
    let mut cmd = spec.command();
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn()?;
    let pgid = child.id() as libc::pid_t;
    register_as(pgid, service);
    Ok(Piped {
        child,
        pgid,
        reaped: false,
    })
}

/// Runs `spec` with stdin closed (or held open, [`Spec::hold_stdin`]), capturing stdout and
/// stderr, and kills its whole process group when `timeout` passes.
pub fn run(spec: &Spec, timeout: Duration) -> io::Result<Output> {
    refuse_when_stopping()?;
    run_registered(spec, timeout, false)
}

/// [`run`] for the daemon's helpers (the `docker` CLI of the docker driver): allowed while the
/// daemon stops, and spared by the stop's signals, since draining the worker pool needs it.
/// Its own timeout still kills its group.
pub fn run_service(spec: &Spec, timeout: Duration) -> io::Result<Output> {
    run_registered(spec, timeout, true)
}

fn run_registered(spec: &Spec, timeout: Duration, service: bool) -> io::Result<Output> {
    let mut cmd = spec.command();
    cmd.stdin(if spec.hold_stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    register_as(child.id() as libc::pid_t, service);
    // Held (never written) until the child has ended; dropped with this frame.
    let _stdin = child.stdin.take();
    let stdout = capture(child.stdout.take());
    let stderr = capture(child.stderr.take());
    let (status, timed_out) = wait_with_timeout(&mut child, timeout)?;
    Ok(Output {
        status,
        stdout: stdout.finish(),
        stderr: stderr.finish(),
        timed_out,
    })
}

/// How long output is still read after the child's group is gone. A descendant that left the
/// group (`setsid`) can hold the pipe open for ever; its output is then cut here.
const CAPTURE_DRAIN: Duration = Duration::from_secs(1);

/// One stream being read by its own thread into a shared, capped buffer.
struct Capture {
    buf: std::sync::Arc<Mutex<Vec<u8>>>,
    done: mpsc::Receiver<()>,
}

impl Capture {
    /// The output read so far, waiting at most [`CAPTURE_DRAIN`] for the end of the stream.
    fn finish(self) -> String {
        let _ = self.done.recv_timeout(CAPTURE_DRAIN);
        let buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// [`run`] in the shape `config` asks for (`config::secret::RunProgram`): whether `program`
/// exited 0, and its standard output.
pub fn run_program(
    program: &Path,
    args: &[&str],
    timeout: Duration,
) -> Result<(bool, String), String> {
    let mut spec = Spec::new(program);
    // The runner of the 1Password CLI (`config::secret`): `op` reads its own tokens.
    spec.keep_op = true;
    for arg in args {
        spec = spec.arg(*arg);
    }
    let out = run(&spec, timeout).map_err(|e| e.to_string())?;
    Ok((out.success(), out.stdout))
}

fn capture(stream: Option<impl Read + Send + 'static>) -> Capture {
    let buf = std::sync::Arc::new(Mutex::new(Vec::new()));
    let (tx, done) = mpsc::channel();
    let shared = std::sync::Arc::clone(&buf);
    std::thread::spawn(move || {
        if let Some(mut s) = stream {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = s.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                let mut buf = shared.lock().unwrap_or_else(|p| p.into_inner());
                let room = CAPTURE_LIMIT.saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
        let _ = tx.send(());
    });
    Capture { buf, done }
}

/// Waits for `child`; past `timeout` the group gets SIGTERM, then SIGKILL after [`KILL_GRACE`].
/// Returns the exit status and whether the deadline was hit.
pub fn wait_with_timeout(child: &mut Child, timeout: Duration) -> io::Result<(ExitStatus, bool)> {
    let pgid = child.id() as libc::pid_t;
    let (tx, rx) = mpsc::channel();
    // The waiter owns nothing but the pid; `Child::wait` is not Sync, so reap by pid here.
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(reap(pgid));
    });
    let result = match rx.recv_timeout(timeout) {
        Ok(status) => (status?, false),
        Err(_) => {
            kill_group(pgid, libc::SIGTERM);
            match rx.recv_timeout(KILL_GRACE) {
                Ok(status) => (status?, true),
                Err(_) => {
                    kill_group(pgid, libc::SIGKILL);
                    (
                        rx.recv()
                            .map_err(|_| io::Error::other("waiter thread died"))??,
                        true,
                    )
                }
            }
        }
    };
    let _ = waiter.join();
    // The leader is reaped; make sure nothing else of its group lingers either.
    kill_group(pgid, libc::SIGKILL);
    unregister(pgid);
    Ok(result)
}

fn reap(pid: libc::pid_t) -> io::Result<ExitStatus> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waitpid writes only into `status`.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Sends `signal` to every process in group `pgid`. Errors (group already gone) are ignored.
pub fn kill_group(pgid: libc::pid_t, signal: libc::c_int) {
    if pgid > 0 {
        // SAFETY: killpg has no memory effects.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

/// Whether process `pid` exists and is not a zombie (Linux `/proc`).
pub fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn captures_output_and_exit_code() {
        let out = run(
            &Spec::new("/bin/sh")
                .arg("-c")
                .arg("echo hi; echo err >&2; exit 3"),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(out.stdout, "hi\n");
        assert_eq!(out.stderr, "err\n");
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.describe_status(), "exit code 3");
    }

    #[test]
    fn timeout_kills_the_whole_process_group() {
        let dir = std::env::temp_dir().join(format!("svc-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("grandchild.pid");
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let started = Instant::now();
        let out = run(
            &Spec::new("/bin/sh").arg("-c").arg(script),
            Duration::from_millis(300),
        )
        .unwrap();
        assert!(out.timed_out);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "SIGTERM should end sh and sleep"
        );
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Death is asynchronous: the pipe closes before the kernel marks the exit.
        let deadline = Instant::now() + Duration::from_secs(2);
        while is_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!is_alive(pid), "grandchild {pid} survived the group kill");
        let _ = std::fs::remove_dir_all(dir);
    }
}
