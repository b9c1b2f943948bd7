//! Out-of-tree drivers, driver SDK v1: an executable that speaks newline-delimited JSON-RPC 2.0
//! on its stdin and stdout (stderr is its log, copied into svc's log).
//!
//! * The specifier is an absolute path, a path relative to the workflow file's directory, a
//!   `file:` URL or a bare name looked up on PATH, with an optional `#export` suffix handed to
//!   the driver. A `?` query is refused (`worker_pool_driver_invalid_specifier`). An exact
//!   built-in kind always wins over a same-named executable.
//! * Loading copies the executable into `<daemon dir>/drivers/` under its SHA-256 and runs that
//!   copy for the daemon's life (`worker_pool_driver_module_pinned`): editing the original
//!   changes nothing until a restart. Loading happens at start and when the specifier string
//!   changes on reload, never while leasing.
//! * `initialize` (`{sdk: 1, export, options}`) must answer SDK major 1, else
//!   `worker_pool_driver_sdk_mismatch` and the driver is not used.
//! * One thread owns the process for its whole life (the parent-death signal is per thread): it
//!   writes requests, a reader thread routes answers by id. A driver that crashes, hangs past a
//!   call's timeout or answers garbage fails the calls in flight with a clear error and is
//!   killed; the next call restarts it (after 1 s, doubling to 30 s, while it keeps failing)
//!   and initializes it again.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read as _, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, select, unbounded};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Capabilities, Driver, ProvisionRequest, WorkerRecord};
use crate::env::Env;
use crate::process;

/// The SDK major this svc speaks.
pub const SDK_MAJOR: u64 = 1;
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(10);
/// Extra time svc waits past the `timeoutMs` it hands the driver.
const ANSWER_GRACE: Duration = Duration::from_secs(2);
const RESTART_MIN: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(30);
/// Characters of one driver stderr line kept in svc's log.
const LOG_LINE_LIMIT: usize = 4096;
/// Longest answer line read from a driver.
const LINE_LIMIT: usize = 4 << 20;

/// Why a driver could not be loaded; the event name says which.
#[derive(Debug)]
pub enum LoadError {
    InvalidSpecifier(String),
    SdkMismatch(String),
    Failed(String),
}

impl LoadError {
    pub fn event(&self) -> &'static str {
        match self {
            LoadError::InvalidSpecifier(_) => "worker_pool_driver_invalid_specifier",
            LoadError::SdkMismatch(_) => "worker_pool_driver_sdk_mismatch",
            LoadError::Failed(_) => "worker_pool_driver_load_failed",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            LoadError::InvalidSpecifier(m) | LoadError::SdkMismatch(m) | LoadError::Failed(m) => m,
        }
    }
}

/// A specifier resolved to an executable and an export name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub path: PathBuf,
    pub export: Option<String>,
}

/// Resolves a specifier (see the module documentation) against the workflow's directory.
pub fn resolve(specifier: &str, workflow_dir: &Path, env: &Env) -> Result<Resolved, LoadError> {
    if specifier.contains('?') {
        return Err(LoadError::InvalidSpecifier(format!(
            "driver specifier {specifier} carries a query string; cache-busting queries are refused (the driver is pinned for the daemon's life: restart svc to load new code)"
        )));
    }
    let (target, export) = match specifier.rsplit_once('#') {
        Some((t, e)) if !e.is_empty() => (t, Some(e.to_string())),
        Some((t, _)) => (t, None),
        None => (specifier, None),
    };
    let path = if let Some(rest) = target.strip_prefix("file:") {
        let rest = rest.strip_prefix("//").map_or(rest, |r| {
            // `file://host/path`: only the empty host or localhost are this machine.
            r.strip_prefix("localhost").unwrap_or(r)
        });
        let decoded = percent_encoding::percent_decode_str(rest)
            .decode_utf8()
            .map_err(|_| {
                LoadError::InvalidSpecifier(format!(
                    "driver specifier {specifier}: malformed file: URL"
                ))
            })?
            .into_owned();
        PathBuf::from(decoded)
    } else if target.starts_with('/') {
        PathBuf::from(target)
    } else if target.contains('/') {
        workflow_dir.join(target)
    } else {
        env.find_executable(target).ok_or_else(|| {
            LoadError::Failed(format!(
                "driver {target} not found on PATH (give an absolute path, a path relative to WORKFLOW.md or a file: URL)"
            ))
        })?
    };
    let meta = std::fs::metadata(&path)
        .map_err(|e| LoadError::Failed(format!("driver {specifier}: {}: {e}", path.display())))?;
    use std::os::unix::fs::PermissionsExt;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(LoadError::Failed(format!(
            "driver {specifier}: {} is not an executable file (chmod +x it)",
            path.display()
        )));
    }
    Ok(Resolved { path, export })
}

/// Copies the driver into `dir` under its SHA-256; returns the copy and the digest.
fn pin(source: &Path, dir: &Path) -> Result<(PathBuf, String), String> {
    let bytes = std::fs::read(source).map_err(|e| format!("{}: {e}", source.display()))?;
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "driver".into());
    let pinned = dir.join(format!("{}-{name}", &digest[..16]));
    if !pinned.exists() {
        super::write_atomic(&pinned, &bytes)
            .map_err(|e| format!("cannot pin the driver at {}: {e}", pinned.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pinned, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", pinned.display()))?;
    }
    Ok((pinned, digest))
}

struct Call {
    method: &'static str,
    params: Value,
    timeout: Duration,
    reply: Sender<Result<Value, String>>,
}

/// What the reader thread of one process saw.
enum Seen {
    Answer(Value),
    Garbage(String),
    Closed,
}

pub struct SdkDriver {
    specifier: String,
    kind: String,
    capabilities: Capabilities,
    calls: Sender<Call>,
}

/// What a successful load tells the pool (for its events).
pub struct Loaded {
    pub driver: SdkDriver,
    pub pinned: PathBuf,
    pub sha256: String,
}

impl SdkDriver {
    /// Resolves, pins, starts and initializes a driver.
    pub fn load(
        specifier: &str,
        options: &Value,
        workflow_dir: &Path,
        pin_dir: &Path,
        env: &Env,
    ) -> Result<Loaded, LoadError> {
        let resolved = resolve(specifier, workflow_dir, env)?;
        let (pinned, sha256) = pin(&resolved.path, pin_dir).map_err(LoadError::Failed)?;
        let init_params = json!({"sdk": SDK_MAJOR, "export": resolved.export, "options": options});
        let (calls, rx) = unbounded();
        let owner = Owner {
            program: pinned.clone(),
            specifier: specifier.to_string(),
            init_params,
            workdir: workflow_dir.to_path_buf(),
        };
        let (ready_tx, ready_rx) = bounded(1);
        std::thread::Builder::new()
            .name("worker-driver".into())
            .spawn(move || owner.run(rx, ready_tx))
            .map_err(|e| LoadError::Failed(format!("cannot start the driver thread: {e}")))?;
        let init = ready_rx
            .recv()
            .unwrap_or_else(|_| Err("the driver thread ended".into()))
            .map_err(|e| LoadError::Failed(format!("driver {specifier}: {e}")))?;
        let major = init.get("sdk").and_then(Value::as_u64);
        if major != Some(SDK_MAJOR) {
            drop(calls);
            return Err(LoadError::SdkMismatch(format!(
                "driver {specifier} speaks SDK {}, svc speaks SDK {SDK_MAJOR}; the driver is not used",
                major.map_or_else(|| "(none given)".to_string(), |m| m.to_string())
            )));
        }
        let capabilities = init
            .get("capabilities")
            .cloned()
            .map(serde_json::from_value::<Capabilities>)
            .transpose()
            .map_err(|e| LoadError::Failed(format!("driver {specifier}: bad capabilities: {e}")))?
            .unwrap_or_default();
        let kind = init
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or(specifier)
            .to_string();
        Ok(Loaded {
            driver: SdkDriver {
                specifier: specifier.to_string(),
                kind,
                capabilities,
                calls,
            },
            pinned,
            sha256,
        })
    }

    fn call(
        &self,
        method: &'static str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, String> {
        let (reply, rx) = bounded(1);
        self.calls
            .send(Call {
                method,
                params,
                timeout,
                reply,
            })
            .map_err(|_| format!("driver {}: its thread ended", self.specifier))?;
        rx.recv()
            .unwrap_or_else(|_| Err(format!("driver {}: no answer", self.specifier)))
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn parse_record(v: Value, method: &str) -> Result<WorkerRecord, String> {
    serde_json::from_value(v).map_err(|e| format!("{method} answered a bad worker record: {e}"))
}

impl Driver for SdkDriver {
    fn kind(&self) -> String {
        self.kind.clone()
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn provision(&self, r: &ProvisionRequest) -> Result<WorkerRecord, String> {
        let v = self.call(
            "provision",
            json!({"workerId": r.worker_id, "affinityKey": r.affinity_key, "labels": r.labels,
                   "timeoutMs": ms(r.timeout), "driverOptions": Value::Null}),
            r.timeout,
        )?;
        let record = parse_record(v, "provision")?;
        if record.worker_id != r.worker_id {
            return Err(format!(
                "provision of {} answered a record of {}",
                r.worker_id, record.worker_id
            ));
        }
        Ok(record)
    }

    fn probe(&self, worker: &WorkerRecord, timeout: Duration) -> Result<(), String> {
        let v = self.call(
            "probe",
            json!({"worker": worker, "timeoutMs": ms(timeout)}),
            timeout,
        )?;
        match v.get("ok").and_then(Value::as_bool) {
            Some(true) => Ok(()),
            Some(false) => Err(v
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("the driver gave no reason")
                .to_string()),
            None => Err(format!("probe answered without ok: {v}")),
        }
    }

    fn destroy(
        &self,
        worker: &WorkerRecord,
        timeout: Duration,
        reason: &str,
    ) -> Result<(), String> {
        self.call(
            "destroy",
            json!({"worker": worker, "timeoutMs": ms(timeout), "reason": reason}),
            timeout,
        )
        .map(|_| ())
    }

    fn list(&self, timeout: Duration) -> Result<Vec<WorkerRecord>, String> {
        let v = self.call("list", json!({"timeoutMs": ms(timeout)}), timeout)?;
        let workers = v
            .get("workers")
            .cloned()
            .ok_or_else(|| "list answered without workers".to_string())?;
        serde_json::from_value(workers).map_err(|e| format!("list answered bad records: {e}"))
    }
}

/// The thread that owns the driver process.
struct Owner {
    program: PathBuf,
    specifier: String,
    init_params: Value,
    workdir: PathBuf,
}

/// A call in flight: its method, its deadline and where its answer goes.
type Pending = (&'static str, Instant, Sender<Result<Value, String>>);

/// One running driver process.
struct Proc {
    child: process::Piped,
    stdin: std::process::ChildStdin,
    seen: Receiver<Seen>,
    next_id: u64,
    /// id -> (method, deadline, reply)
    pending: HashMap<u64, Pending>,
}

impl Owner {
    fn run(self, calls: Receiver<Call>, ready: Sender<Result<Value, String>>) {
        let mut failures: u32 = 0;
        let mut restart_at = Instant::now();
        // The first start answers the loader.
        let mut proc: Option<Proc> = match self.start() {
            Ok((p, init)) => {
                let _ = ready.send(Ok(init));
                Some(p)
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        loop {
            let seen = proc
                .as_ref()
                .map_or_else(crossbeam_channel::never, |p| p.seen.clone());
            let tick = crossbeam_channel::after(Duration::from_millis(100));
            select! {
                recv(calls) -> call => {
                    let Ok(call) = call else {
                        // The pool dropped the driver: end the process.
                        if let Some(mut p) = proc.take() {
                            p.child.terminate(process::KILL_GRACE);
                        }
                        return;
                    };
                    if proc.is_none() {
                        if Instant::now() < restart_at {
                            let wait = restart_at - Instant::now();
                            let _ = call.reply.send(Err(format!(
                                "driver {} is restarting after a failure (next try in {} ms)",
                                self.specifier, wait.as_millis()
                            )));
                            continue;
                        }
                        match self.start() {
                            Ok((p, _)) => {
                                log::info!("worker driver {} restarted", self.specifier);
                                proc = Some(p);
                            }
                            Err(e) => {
                                failures += 1;
                                restart_at = Instant::now() + backoff(failures);
                                let _ = call.reply.send(Err(format!("driver {}: {e}", self.specifier)));
                                continue;
                            }
                        }
                    }
                    let p = proc.as_mut().expect("started above");
                    if let Err(e) = p.send(call) {
                        log::warn!("worker driver {}: {e}; restarting it", self.specifier);
                        failures += 1;
                        restart_at = Instant::now() + backoff(failures);
                        fail_all(proc.take(), &e);
                    }
                }
                recv(seen) -> what => {
                    let p = proc.as_mut().expect("seen only with a process");
                    match what.unwrap_or(Seen::Closed) {
                        Seen::Answer(v) => {
                            if p.route(v) {
                                failures = 0;
                            }
                        }
                        Seen::Garbage(line) => {
                            let e = format!("driver {} answered garbage: {line}", self.specifier);
                            log::warn!("{e}; restarting it");
                            failures += 1;
                            restart_at = Instant::now() + backoff(failures);
                            fail_all(proc.take(), &e);
                        }
                        Seen::Closed => {
                            let mut p = proc.take().expect("present above");
                            let status = p.child.wait_for(Duration::from_secs(1));
                            let e = format!(
                                "driver {} exited ({})",
                                self.specifier,
                                status.map_or_else(|| "still running".to_string(), |s| s.to_string())
                            );
                            log::warn!("{e}; restarting it on the next call");
                            failures += 1;
                            restart_at = Instant::now() + backoff(failures);
                            fail_all(Some(p), &e);
                        }
                    }
                }
                recv(tick) -> _ => {
                    let now = Instant::now();
                    let late = proc.as_ref().and_then(|p| {
                        p.pending.values().find(|(_, deadline, _)| now >= *deadline).map(|(m, _, _)| *m)
                    });
                    if let Some(method) = late {
                        let e = format!("driver {} did not answer {method} in time", self.specifier);
                        log::warn!("{e}; killing and restarting it");
                        failures += 1;
                        restart_at = Instant::now() + backoff(failures);
                        fail_all(proc.take(), &e);
                    }
                }
            }
        }
    }

    /// Starts the process and initializes it; answers the `initialize` result.
    fn start(&self) -> Result<(Proc, Value), String> {
        let spec = process::Spec::new(&self.program).cwd(&self.workdir);
        let mut child = process::spawn_service(&spec).map_err(|e| format!("cannot start: {e}"))?;
        let stdin = child.child.stdin.take().ok_or("no stdin")?;
        let stdout = child.child.stdout.take().ok_or("no stdout")?;
        if let Some(stderr) = child.child.stderr.take() {
            let name = self.specifier.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    log::info!(
                        "worker driver {name}: {}",
                        line.chars().take(LOG_LINE_LIMIT).collect::<String>()
                    );
                }
            });
        }
        let (seen_tx, seen) = unbounded();
        std::thread::spawn(move || read_answers(stdout, seen_tx));
        let mut p = Proc {
            child,
            stdin,
            seen,
            next_id: 0,
            pending: HashMap::new(),
        };
        let (reply, rx) = bounded(1);
        p.send(Call {
            method: "initialize",
            params: self.init_params.clone(),
            timeout: INITIALIZE_TIMEOUT,
            reply,
        })?;
        let deadline = Instant::now() + INITIALIZE_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match p.seen.recv_timeout(left) {
                Ok(Seen::Answer(v)) => {
                    p.route(v);
                    if let Ok(answer) = rx.try_recv() {
                        return answer
                            .map(|init| (p, init))
                            .map_err(|e| format!("initialize failed: {e}"));
                    }
                }
                Ok(Seen::Garbage(line)) => {
                    return Err(format!("initialize answered garbage: {line}"));
                }
                Ok(Seen::Closed) => return Err("the driver exited during initialize".into()),
                Err(_) => return Err("the driver did not answer initialize within 10 s".into()),
            }
        }
    }
}

fn backoff(failures: u32) -> Duration {
    (RESTART_MIN * 2u32.saturating_pow(failures.saturating_sub(1).min(5))).min(RESTART_MAX)
}

/// Fails every call in flight on a process that is being dropped (which kills its group).
fn fail_all(proc: Option<Proc>, error: &str) {
    if let Some(mut p) = proc {
        for (_, (_, _, reply)) in p.pending.drain() {
            let _ = reply.send(Err(error.to_string()));
        }
        p.child.terminate(Duration::from_millis(500));
    }
}

impl Proc {
    fn send(&mut self, call: Call) -> Result<(), String> {
        self.next_id += 1;
        let id = self.next_id;
        let line =
            json!({"jsonrpc": "2.0", "id": id, "method": call.method, "params": call.params});
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        let deadline = Instant::now() + call.timeout + ANSWER_GRACE;
        if let Err(e) = self
            .stdin
            .write_all(&bytes)
            .and_then(|()| self.stdin.flush())
        {
            let e = format!("cannot write to the driver: {e}");
            let _ = call.reply.send(Err(e.clone()));
            return Err(e);
        }
        self.pending.insert(id, (call.method, deadline, call.reply));
        Ok(())
    }

    /// Routes an answer to its call; false when it matched none.
    fn route(&mut self, v: Value) -> bool {
        let Some((_, _, reply)) = v
            .get("id")
            .and_then(Value::as_u64)
            .and_then(|id| self.pending.remove(&id))
        else {
            log::warn!("worker driver sent an answer to no call: {v}");
            return false;
        };
        let answer = match (v.get("result"), v.get("error")) {
            (_, Some(err)) => Err(err
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| err.to_string(), str::to_string)),
            (Some(result), None) => Ok(result.clone()),
            (None, None) => Err(format!("answer without result or error: {v}")),
        };
        let _ = reply.send(answer);
        true
    }
}

fn read_answers(stdout: std::process::ChildStdout, seen: Sender<Seen>) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader)
            .take(LINE_LIMIT as u64)
            .read_until(b'\n', &mut line)
            .unwrap_or_default();
        if n == 0 {
            let _ = seen.send(Seen::Closed);
            return;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let what = match serde_json::from_str::<Value>(text) {
            Ok(v) if v.is_object() => Seen::Answer(v),
            _ => Seen::Garbage(text.chars().take(200).collect()),
        };
        if seen.send(what).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specifiers_resolve_like_the_spec_says() {
        let dir = std::env::temp_dir().join(format!("svc-sdk-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        let driver = dir.join("bin/my driver");
        std::fs::write(&driver, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&driver, std::fs::Permissions::from_mode(0o755)).unwrap();
        let env = Env::from_pairs(
            [("PATH", dir.join("bin").to_str().unwrap())],
            Path::new("/"),
        );
        let at = |s: &str| resolve(s, &dir, &env);
        let want = |export: Option<&str>| Resolved {
            path: driver.clone(),
            export: export.map(str::to_string),
        };
        assert_eq!(
            at("./bin/my driver").unwrap().path,
            dir.join("./bin/my driver")
        );
        assert_eq!(
            at(&format!("{}#big", driver.display())).unwrap(),
            want(Some("big"))
        );
        assert_eq!(
            at(&format!("file://{}", dir.join("bin/my%20driver").display())).unwrap(),
            want(None)
        );
        assert_eq!(at("my driver#x").unwrap(), want(Some("x")));
        assert!(matches!(
            at("./bin/my driver?v=2"),
            Err(LoadError::InvalidSpecifier(_))
        ));
        assert!(matches!(at("nope"), Err(LoadError::Failed(m)) if m.contains("not found on PATH")));
        let _ = std::fs::remove_dir_all(dir);
    }
}
