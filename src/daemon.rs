//! The daemon: the one place that knows every thread. It loads the workflow, takes the
//! per-workflow lock, starts the trace writer, the poller, the signal thread and the snapshot
//! printer, then runs the state thread on the main thread until shutdown. [`run`] reads as the
//! list of its stages, one function each, in the order they happen.

use std::fs::{self, File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::agent::run::McpEndpoint;
use crate::config;
use crate::config::Settings;
use crate::env::Env;
use crate::http::{Ctx as HttpCtx, HttpServer};
use crate::lockfile::{self, lock_path};
use crate::mcp::server::McpServer;
use crate::orchestrator::poller::{Loaded, Overrides, Poller};
use crate::orchestrator::protocol::Event;
use crate::orchestrator::runtime::{McpProvider, Runtime, RuntimeParts, StoreParts, WorkflowParts};
use crate::orchestrator::snapshot::{DaemonInfo, Endpoint, SnapshotHub};
use crate::orchestrator::store::{self, Config as ClaimStoreConfig};
use crate::time::unix_ms;
use crate::trace::TraceSink;
use crate::trace::store::IssueStore;
use crate::trace::watcher::{Change, SharedIndex};
use crate::tracker::Issue;
use crate::workers::service::PoolHandle;

/// `svc [WORKFLOW|DIR]...`: how the daemon runs (parsed by `cli::args`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DaemonArgs {
    pub no_tui: bool,
    pub no_dashboard: bool,
    pub port: Option<u16>,
    pub logs_root: Option<PathBuf>,
    /// The workflow files and directories of workflow files given (none: the default).
    pub workflows: Vec<PathBuf>,
    /// `--once`: one poll and dispatch, then the exit code says whether every run succeeded.
    pub once: bool,
    /// `--dry-run`: decisions are printed, nothing is started or written.
    pub dry_run: bool,
}

/// An exclusive lock on the workflow's lock file, held for the daemon's life. The kernel drops
/// it when the process dies, however it dies, so a crash never leaves a stale lock behind.
/// Daemons that share a claim store (one whose kind may be shared) may run side by side on one workflow: the first
/// holds `<stem>-<hash>.lock`, the next ones `<stem>-<hash>.<n>.lock` (n = 2, 3, ...); each
/// marks its children with its own lock file.
pub struct WorkflowLock {
    _file: File,
    pub path: PathBuf,
    /// The workflow's first lock file (the claim store is named after it).
    pub base: PathBuf,
}

impl WorkflowLock {
    /// Adds where the daemon serves (`url`) to what its lock file says, so the operator's
    /// commands (`svc steer`) find it whatever port it bound.
    pub fn note_url(&mut self, url: &str) {
        use std::io::{Seek, SeekFrom};
        let mut info = fs::read_to_string(&self.path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .unwrap_or_else(|| serde_json::json!({}));
        info["url"] = url.into();
        let written = self
            ._file
            .set_len(0)
            .and_then(|()| self._file.seek(SeekFrom::Start(0)).map(drop))
            .and_then(|()| self._file.write_all(info.to_string().as_bytes()));
        if let Err(e) = written {
            log::warn!(
                "cannot note the API address in {}: {e}",
                self.path.display()
            );
        }
    }
}

/// Takes the workflow's lock file; with `shared` (a shared claim store keeps daemons apart),
/// the first free of its numbered siblings when another daemon holds it.
pub fn acquire_lock(
    daemon_dir: &Path,
    workflow: &Path,
    owner: &str,
    shared: bool,
) -> Result<WorkflowLock, String> {
    fs::create_dir_all(daemon_dir).map_err(|e| {
        format!(
            "cannot create daemon directory {}: {e}",
            daemon_dir.display()
        )
    })?;
    let base = lock_path(daemon_dir, workflow);
    let first = lock_file(&base, &base, workflow, owner);
    if !shared || first.is_ok() {
        return first;
    }
    for path in lockfile::siblings(&base).skip(1) {
        if let Ok(lock) = lock_file(&path, &base, workflow, owner) {
            return Ok(lock);
        }
    }
    first
}

/// The other lock files of this workflow that no daemon holds (each checked by taking its lock
/// for a moment).
fn free_sibling_locks(lock: &WorkflowLock) -> Vec<PathBuf> {
    lockfile::siblings(&lock.base)
        .filter(|p| *p != lock.path && p.exists())
        .filter(|p| {
            OpenOptions::new().read(true).open(p).is_ok_and(|f| {
                // SAFETY: flock on a descriptor we own; closing it releases the lock.
                unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
            })
        })
        .collect()
}

/// Locks one lock file and writes who holds it.
fn lock_file(
    path: &Path,
    base: &Path,
    workflow: &Path,
    owner: &str,
) -> Result<WorkflowLock, String> {
    let path = path.to_path_buf();
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open lock file {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let holder = fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.get("pid").and_then(|p| p.as_u64()))
            .map_or_else(String::new, |pid| format!(" (pid {pid})"));
        return Err(format!(
            "another svc daemon{holder} is already running for {}; lock file {}. Stop it first, or use another workflow file",
            workflow.display(),
            path.display()
        ));
    }
    let info = serde_json::json!({"pid": std::process::id(), "owner_id": owner, "workflow_path": workflow, "started_at": crate::time::rfc3339(unix_ms())});
    file.set_len(0)
        .and_then(|()| file.write_all(info.to_string().as_bytes()))
        .map_err(|e| format!("cannot write lock file: {e}"))?;
    Ok(WorkflowLock {
        _file: file,
        path,
        base: base.to_path_buf(),
    })
}

/// The control token for `POST /api/v1/refresh` and `/api/v1/stop`: `SVC_CONTROL_TOKEN`, else a
/// random token written (mode 0600) to `<lock file>.token` for local tools and operators.
fn control_token(env: &Env, lock_path: &Path) -> Result<String, String> {
    if let Some(t) = env.non_empty(crate::process::CONTROL_TOKEN_VAR) {
        return Ok(t.to_string());
    }
    use std::os::unix::fs::OpenOptionsExt;
    let token = crate::random::random_token();
    let path = lock_path.with_extension("token");
    let _ = fs::remove_file(&path);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot write control token file {}: {e}", path.display()))?;
    f.write_all(token.as_bytes())
        .map_err(|e| format!("cannot write control token file {}: {e}", path.display()))?;
    Ok(token)
}

/// The name this daemon gives its host in the fleet view and for host-scoped cooldowns:
/// `SVC_HOSTNAME` when set (a stable name for a container whose host name changes at each
/// start), else the system's host name.
fn hostname(env: &Env) -> String {
    if let Some(name) = env.non_empty("SVC_HOSTNAME") {
        return name.to_string();
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    if getrandom::fill(&mut buf).is_err() {
        // Practically unreachable; fall back to pid and time, which is unique enough for an id.
        return format!("{:x}{:x}", std::process::id(), unix_ms());
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes each log line to the log file, and to stderr unless the terminal dashboard owns the
/// terminal.
struct Tee {
    file: Option<File>,
    path: PathBuf,
    stderr: bool,
}

/// Set by SIGHUP: the next log line reopens the log file (after logrotate moved it away).
static REOPEN_LOG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn open_log(path: &Path) -> Option<File> {
    OpenOptions::new().create(true).append(true).open(path).ok()
}

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if REOPEN_LOG.swap(false, std::sync::atomic::Ordering::Relaxed) && self.file.is_some() {
            // A file that cannot be reopened keeps the old one: no line is lost for it.
            if let Some(f) = open_log(&self.path) {
                self.file = Some(f);
            }
        }
        if self.stderr {
            let _ = std::io::stderr().write_all(buf);
        }
        if let Some(f) = &mut self.file {
            let _ = f.write_all(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn init_logging(log_file: &Path, stderr: bool) -> Option<String> {
    let file = log_file
        .parent()
        .map(fs::create_dir_all)
        .and_then(Result::ok)
        .and_then(|()| open_log(log_file));
    let opened = file.is_some();
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    builder.format(|buf, record| {
        let now = crate::time::format_time(std::time::SystemTime::now());
        writeln!(buf, "{now} {:<5} {}", record.level(), record.args())
    });
    builder.target(env_logger::Target::Pipe(Box::new(Tee {
        file,
        path: log_file.to_path_buf(),
        stderr,
    })));
    let _ = builder.try_init();
    if !opened {
        log::warn!(
            "cannot open log file {}; logging to stderr only",
            log_file.display()
        );
    }
    opened.then(|| log_file.display().to_string())
}

/// glibc gives threads their own malloc arenas, up to eight per core, each holding freed memory
/// of its own: with a thread per run and two per bridge, that is memory the daemon keeps for no
/// gain on the few cores it runs on. Two arenas serve the state, HTTP and run threads well.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// A start-up stage that failed. It has said why (on stderr, and in the log once logging is
/// up); the daemon exits 1.
struct StartFailed;

/// The daemon: the start-up stages in their order, the state thread on this thread until it
/// stops, then the stop. The order matters (ARCHITECTURE.md, "Start-up order"): logging is up
/// before the lock is taken, every listener is bound before anything starts, orphans are ended
/// only under the lock, the state thread's inbox exists before the parts that report into it,
/// and a service manager hears `READY=1` only once the listeners serve.
pub fn run(args: DaemonArgs) -> ExitCode {
    limit_malloc_arenas();
    crate::process::keep_own_files_private();
    let Ok((workflow, mut poller)) = load_workflow(&args) else {
        return ExitCode::from(1);
    };
    let settings = workflow.settings();
    let logging = start_logging(&args, &workflow, &settings);
    let Ok(mut lock) = take_lock(&args, &workflow) else {
        return ExitCode::from(1);
    };
    let Ok(listeners) = bind_listeners(&args, &settings, &mut poller) else {
        return ExitCode::from(1);
    };
    if let Some(url) = &listeners.endpoint.address {
        lock.lock.note_url(url);
    }
    // Read again: the port the dashboard bound is in them now.
    let settings = workflow.settings();
    let Ok(control_token) = take_over_workflow(&workflow.env, &lock.lock) else {
        return ExitCode::from(1);
    };
    // The state thread's inbox exists before the parts that report into it.
    let events = crossbeam_channel::unbounded();
    // The stores first: the worker pool and the trackers keep their facts in the durable one.
    let url = listeners.endpoint.address.clone();
    let Ok(stores) = start_stores(&args, &settings, &workflow, &lock, url, &events.0) else {
        return ExitCode::from(1);
    };
    let facts = stores.claims.gate.facts();
    if let Some(facts) = &facts {
        poller.keep_facts(Arc::clone(facts));
    }
    let port = settings.server.port;
    let url = listeners.endpoint.address.clone();
    let Ok(joiner) = joiner(&args, &workflow, &lock, &control_token, url, port) else {
        return ExitCode::from(1);
    };
    let pool = start_pool(
        &args, &settings, &workflow, &lock, &listeners, facts, &events.0,
    );
    let Ok(pool) = pool else {
        return ExitCode::from(1);
    };
    let daemon = announce(
        &workflow,
        &settings,
        &lock,
        &listeners,
        stores.claims_kind,
        logging.log_file,
    );
    let (store, seen_issues) = open_issue_store(&settings, &events.0);
    let handover = Handover {
        daemon,
        events,
        pool: pool.clone(),
        trace: stores.trace,
        claims: stores.claims,
        seen_issues,
    };
    let (mut runtime, hub) = start_orchestrator(&args, &workflow, poller, &listeners, handover);
    if workflow.several {
        let served = Arc::clone(&workflow.served);
        runtime.watch(watch_workflows(&args, &workflow, joiner), served);
    }
    let traces = start_trace_watcher(&settings, store.is_some(), &listeners);
    start_servers(
        listeners,
        &runtime,
        &hub,
        &workflow,
        control_token,
        store.as_ref(),
        traces,
    );
    start_signal_thread(runtime.events_tx.clone());
    notify_ready(&workflow.env, &hub);
    let displays = start_displays(&args, logging.tui, &hub, &runtime);
    let exit_code = runtime.run();
    shut_down(&workflow, pool, hub, displays, stores.trace_thread, lock);
    ExitCode::from(exit_code)
}

/// The workflow as the configuration stage found it.
struct Workflow {
    env: Arc<Env>,
    /// The first workflow's name and file.
    name: Arc<str>,
    path: PathBuf,
    /// The command line names several workflows, or a directory that may gain some: the
    /// others start once the daemon serves, and the files are looked at again each second.
    several: bool,
    /// The daemon-wide keys every workflow's file set, which a workflow added later must agree
    /// with.
    shared: config::workflows::DaemonWide,
    /// Each workflow's workspace root, by name.
    roots: std::collections::BTreeMap<String, PathBuf>,
    /// The workflows served, as the HTTP server finds them (the state thread keeps it current).
    served: crate::orchestrator::runtime::Served,
    /// The current load (settings and tracker); the poller replaces it on a reload.
    loaded: Arc<Mutex<Loaded>>,
    warnings: Vec<config::Warning>,
}

impl Workflow {
    /// The settings of the current load.
    fn settings(&self) -> Arc<Settings> {
        Arc::clone(
            &self
                .loaded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .settings,
        )
    }
}

/// Configuration: the process environment (and the service manager's socket), the workflow
/// files the command line names, and each one's first load (settings and tracker), held by its
/// poller. With several, every file must agree on the daemon-wide sections (each then carries
/// them all) and have its own workspace root; one that does not load is reported and the
/// others start. The only workflow, or every one, not loading stops the start (on stderr:
/// logging is not up yet).
fn load_workflow(args: &DaemonArgs) -> Result<(Workflow, Poller), StartFailed> {
    let env = Arc::new(Env::from_process());
    crate::notify::init(&env);
    let fail = |e: config::ConfigError| {
        eprintln!("svc: {}", e.with_hint());
        StartFailed
    };
    let sources = config::workflows::sources(&args.workflows, &env).map_err(fail)?;
    // Every file that parses, for the daemon-wide sections they must agree on.
    let mut files: Vec<config::workflow::WorkflowFile> = sources
        .iter()
        .filter_map(|s| config::workflow::read(&s.path).ok())
        .collect();
    let shared = if sources.len() > 1 {
        config::workflows::agree(&mut files).map_err(fail)?
    } else {
        Default::default()
    };
    // A directory may gain workflows: give its workflows their own folders from the start.
    let several = sources.len() > 1 || args.workflows.iter().any(|p| p.is_dir());
    // The first workflow that loads; the others start once the daemon serves (see
    // `watch_workflows`), a file that does not load listed as failing until it does.
    for source in sources {
        let overrides = Overrides {
            port: args.port,
            workflow: several.then(|| source.name.clone()),
        };
        let (poller, warnings) = match Poller::start(
            source.path.clone(),
            Arc::clone(&env),
            overrides,
            shared.clone(),
        ) {
            Ok(started) => started,
            Err(e) => {
                eprintln!("svc: {e}");
                continue;
            }
        };
        let loaded = poller.current();
        let root = loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .settings
            .workspace
            .root
            .clone();
        let name: Arc<str> = source.name.as_str().into();
        let workflow = Workflow {
            env,
            name: Arc::clone(&name),
            path: source.path,
            several,
            shared,
            roots: [(source.name, root)].into(),
            served: Arc::new(std::sync::RwLock::new(vec![(name, Arc::clone(&loaded))])),
            loaded,
            warnings,
        };
        return Ok((workflow, poller));
    }
    Err(StartFailed)
}

/// A workflow after the first, loaded and not started yet.
struct More {
    name: Arc<str>,
    path: PathBuf,
    poller: Poller,
    warnings: Vec<config::Warning>,
}

/// What starting a workflow beside the first needs, owned, so workflows added to a directory
/// at run time start as those named at start did ([`Joiner::join`]).
struct Joiner {
    env: Arc<Env>,
    daemon_dir: PathBuf,
    /// This daemon in the claim store (its `workflow` replaced by each one's path).
    owner: store::Owner,
    /// Daemons may share a workflow (the claim store keeps them apart).
    shared: bool,
    dry_run: bool,
    control_token: String,
    url: Option<String>,
    /// The port the dashboard bound, written into each workflow's settings.
    port: u16,
}

impl Joiner {
    /// Starts workflow `m` beside the first: it takes its own lock file (a control client
    /// pointed at it finds this daemon, with the same control token), ends the orphans earlier
    /// daemons on it left, and opens its own part of the claim store (a SQLite file beside its
    /// lock, or the part of the store `SVC_CLAIM_STORE` names that is its own, see
    /// [`ClaimStoreConfig::for_workflow`]) with its own store thread and inbox.
    fn join(&self, mut m: More) -> Result<WorkflowParts, String> {
        let env = &self.env;
        for w in &m.warnings {
            log::warn!("{}: {}", m.path.display(), w.message);
        }
        let mut own_lock = acquire_lock(&self.daemon_dir, &m.path, &self.owner.id, self.shared)?;
        if let Some(url) = &self.url {
            own_lock.note_url(url);
        }
        share_control_token(env, &own_lock.path, &self.control_token)?;
        let orphans = crate::process::reap_orphans(&own_lock.path.display().to_string());
        if !orphans.is_empty() {
            log::warn!(
                "ended {} orphaned process(es) of an earlier daemon on {}: {orphans:?}",
                orphans.len(),
                m.path.display()
            );
        }
        let port = m
            .poller
            .current()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .settings
            .server
            .port;
        if port != self.port {
            m.poller.set_port(self.port);
        }
        let config = if self.dry_run {
            ClaimStoreConfig::Memory
        } else {
            let own = ClaimStoreConfig::from_env(env, &own_lock.base)?;
            if env.non_empty("SVC_CLAIM_STORE").is_some() {
                own.for_workflow(&m.name)
            } else {
                own
            }
        };
        let owner = store::Owner {
            workflow: m.path.display().to_string(),
            ..self.owner.clone()
        };
        let events = crossbeam_channel::unbounded();
        let opened = match open_claim_store(&config, owner.clone(), &events.0) {
            Ok(opened) => opened,
            Err(e) if matches!(config, ClaimStoreConfig::Postgres(_)) => {
                return Err(format!(
                    "{e}; svc does not start without the fleet's claim store (SVC_CLAIM_STORE), since it could run an issue another daemon runs"
                ));
            }
            Err(_) => open_claim_store(&ClaimStoreConfig::Memory, owner, &events.0)
                .expect("the in-memory claim store always opens"),
        };
        let gate = Arc::new(opened.gate);
        if let Some(facts) = gate.facts() {
            m.poller.keep_facts(facts);
        }
        let store = start_claim_store(opened.store, opened.hydrated, gate, &events.0);
        log::info!("workflow {} ({}) served", m.name, m.path.display());
        Ok(WorkflowParts {
            loaded: m.poller.current(),
            name: m.name,
            path: m.path,
            poller: m.poller,
            events,
            store,
            holds: Box::new(own_lock),
        })
    }
}

/// What starts the workflows after the first ([`Joiner::join`]), once the daemon serves.
fn joiner(
    args: &DaemonArgs,
    first: &Workflow,
    lock: &Locked,
    control_token: &str,
    url: Option<String>,
    port: u16,
) -> Result<Joiner, StartFailed> {
    let owner = claim_store_owner(&lock.owner_id, first, url.clone()).map_err(|e| {
        log::error!("{e}");
        eprintln!("svc: {e}");
        StartFailed
    })?;
    Ok(Joiner {
        env: Arc::clone(&first.env),
        daemon_dir: lockfile::daemon_dir(&first.env),
        owner,
        shared: lock.store.kind().capabilities.shared_across_processes && !args.dry_run,
        dry_run: args.dry_run,
        control_token: control_token.to_string(),
        url,
        port,
    })
}

/// Looks at the workflow files the command line names again (when it names several, or a
/// directory), first as the state thread starts and then each second: a workflow not served
/// yet (those after the first at start, a file added since) is loaded against the
/// daemon-wide keys and started ([`Joiner::join`]); one that does not load, whose workspace
/// root is another's, or that cannot start (another daemon holds it, its claim store is
/// unreachable) is reported once and listed as failing, and looked at again each time.
fn watch_workflows(
    args: &DaemonArgs,
    first: &Workflow,
    joiner: Joiner,
) -> crate::orchestrator::runtime::Rescan {
    let given = args.workflows.clone();
    let port = args.port;
    let env = Arc::clone(&first.env);
    let shared = first.shared.clone();
    let mut roots: std::collections::BTreeMap<String, PathBuf> = first.roots.clone();
    let mut reported: std::collections::BTreeMap<String, String> = Default::default();
    Box::new(move |served: &[Arc<str>]| {
        use crate::orchestrator::runtime::Rescanned;
        let mut found = Rescanned {
            added: Vec::new(),
            present: served.iter().map(|n| n.to_string()).collect(),
            failed: Vec::new(),
        };
        let sources = match config::workflows::sources(&given, &env) {
            Ok(sources) => sources,
            Err(e) => {
                let e = e.with_hint();
                if reported.get("") != Some(&e) {
                    log::warn!("the workflow files: {e}; the workflows served stay as they are");
                    reported.insert(String::new(), e);
                }
                return found;
            }
        };
        reported.remove("");
        found.present = sources.iter().map(|s| s.name.clone()).collect();
        roots
            .retain(|name, _| found.present.contains(name) || served.iter().any(|s| **s == **name));
        for source in sources {
            if served.iter().any(|s| **s == *source.name) {
                continue;
            }
            let overrides = Overrides {
                port,
                workflow: Some(source.name.clone()),
            };
            let started = Poller::start(source.path.clone(), Arc::clone(&env), overrides, shared.clone())
                .and_then(|(poller, warnings)| {
                    let root = poller
                        .current()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .settings
                        .workspace
                        .root
                        .clone();
                    if let Some((other, _)) = roots.iter().find(|(_, r)| **r == root) {
                        return Err(format!(
                            "{}: its workspace root {} is workflow {other}'s: give each workflow its own workspace.root",
                            source.path.display(),
                            root.display()
                        ));
                    }
                    let joined = joiner.join(More {
                        name: source.name.as_str().into(),
                        path: source.path.clone(),
                        poller,
                        warnings,
                    })?;
                    roots.insert(source.name.clone(), root);
                    Ok(joined)
                });
            match started {
                Ok(parts) => {
                    reported.remove(&source.name);
                    found.added.push(parts);
                }
                Err(e) => {
                    if reported.get(&source.name) != Some(&e) {
                        log::error!("workflow {} not started: {e}", source.name);
                        reported.insert(source.name.clone(), e.clone());
                    }
                    found
                        .failed
                        .push((source.name.as_str().into(), source.path, e));
                }
            }
        }
        found
    })
}

/// Writes the daemon's control token beside another workflow's lock file (unless
/// `SVC_CONTROL_TOKEN` gives it), so control clients find it from any workflow.
fn share_control_token(env: &Env, lock_path: &Path, token: &str) -> Result<(), String> {
    if env.non_empty(crate::process::CONTROL_TOKEN_VAR).is_some() {
        return Ok(());
    }
    use std::os::unix::fs::OpenOptionsExt;
    let path = lock_path.with_extension("token");
    let _ = fs::remove_file(&path);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(token.as_bytes()))
        .map_err(|e| format!("cannot write control token file {}: {e}", path.display()))
}

/// What the logging stage set up.
struct Logging {
    /// The log file, when it could be opened.
    log_file: Option<String>,
    /// Whether the terminal dashboard owns the terminal (then nothing is logged to stderr).
    tui: bool,
}

/// Logging: to the log file (under `--logs-root`, else `logging.log_file`), and to stderr unless
/// the terminal dashboard owns the terminal; then the workflow's warnings.
fn start_logging(args: &DaemonArgs, workflow: &Workflow, settings: &Settings) -> Logging {
    let log_file = match &args.logs_root {
        Some(root) => workflow
            .env
            .resolve_path(&root.to_string_lossy())
            .join("log")
            .join("svc.log"),
        None => settings.logging.log_file.clone(),
    };
    // A dry run's report is its stdout: no dashboard there, no snapshot lines.
    let tui = !args.no_tui && !args.dry_run && std::io::stdout().is_terminal();
    let log_file = init_logging(&log_file, !tui);
    for w in &workflow.warnings {
        log::warn!("{}", w.message);
    }
    Logging { log_file, tui }
}

/// The workflow's lock and what comes with it.
struct Locked {
    /// This daemon's id (in its lock file, the claim store and the snapshot).
    owner_id: String,
    /// The claim store `SVC_CLAIM_STORE` names.
    store: ClaimStoreConfig,
    /// Held until the very end of [`run`].
    lock: WorkflowLock,
}

/// The lock: this daemon's owner id and the workflow's lock file, or the first free numbered
/// sibling when the claim store's kind lets daemons share the workflow. Another daemon holding it
/// stops the start.
fn take_lock(args: &DaemonArgs, workflow: &Workflow) -> Result<Locked, StartFailed> {
    let env = &workflow.env;
    let owner_id = random_hex(8);
    let daemon_dir = lockfile::daemon_dir(env);
    let store = match ClaimStoreConfig::from_env(env, &lock_path(&daemon_dir, &workflow.path)) {
        Ok(store) => store,
        Err(e) => {
            log::error!("{e}");
            eprintln!("svc: {e}");
            return Err(StartFailed);
        }
    };
    let shared = store.kind().capabilities.shared_across_processes && !args.dry_run;
    let lock = match acquire_lock(&daemon_dir, &workflow.path, &owner_id, shared) {
        Ok(l) => l,
        Err(e) => {
            log::error!("{e}");
            eprintln!("svc: {e}");
            return Err(StartFailed);
        }
    };
    Ok(Locked {
        owner_id,
        store,
        lock,
    })
}

/// The listeners, bound but not serving yet, and the MCP server behind them.
struct Listeners {
    mcp: Arc<McpServer>,
    /// The `server.mcp_port` listener (per-run claims only).
    per_run: Option<HttpServer>,
    /// The dashboard's listener: HTTP API, dashboard and MCP endpoint (none with
    /// `--no-dashboard`).
    dashboard: Option<HttpServer>,
    /// Where the dashboard is reached, for the snapshot.
    endpoint: Endpoint,
    /// The MCP endpoint runs on this host are given (the dashboard's).
    mcp_provider: Option<McpProvider>,
    /// The `server.webhook_port` listener (the webhook routes only).
    webhook: Option<HttpServer>,
    /// What it answered: counted by it, shown by `/metrics` and the snapshot.
    webhooks: Arc<crate::webhook::Stats>,
}

/// A listener a key may ask for (`key`: its name in messages; `what`: what it serves, for the
/// log): `None` without a port; a port that cannot be bound stops the start.
fn bind_optional(
    host: &str,
    port: Option<u16>,
    key: &str,
    what: &str,
) -> Result<Option<HttpServer>, StartFailed> {
    let Some(port) = port else { return Ok(None) };
    match HttpServer::bind(host, port) {
        Ok(b) => {
            log::info!("{what} on {}", b.addr);
            Ok(Some(b))
        }
        Err(e) => {
            log::error!("{e}");
            eprintln!("svc: {e} ({key})");
            Err(StartFailed)
        }
    }
}

/// The listeners: the `server.mcp_port` listener of remote runs' claims, then the dashboard's
/// (whose bound port goes into the settings, for `server.port: 0`). A port that cannot be bound
/// stops the start; nothing else has started yet.
fn bind_listeners(
    args: &DaemonArgs,
    settings: &Settings,
    poller: &mut Poller,
) -> Result<Listeners, StartFailed> {
    let mcp = Arc::new(McpServer::default());
    // `server.mcp_port`: the loopback listener of remote runs' per-run claims (Token B only),
    // with or without the dashboard; a port that cannot be bound stops the start.
    let per_run_server = bind_optional(
        "127.0.0.1",
        settings.server.mcp_port,
        "server.mcp_port",
        "MCP endpoint for remote runs (per-run claims)",
    )?;
    // `server.webhook_port`: the listener of the webhook routes alone, bound like the claims
    // listener; a port that cannot be bound stops the start.
    let webhook = bind_optional(
        &settings.server.webhook_host,
        settings.server.webhook_port,
        "server.webhook_port",
        "webhook routes (/webhooks/...)",
    )?;
    let mut server = None;
    let mut endpoint = Endpoint {
        kind: "none".into(),
        address: None,
    };
    let mut mcp_provider: Option<McpProvider> = None;
    if !args.no_dashboard {
        let bound = match HttpServer::bind(&settings.server.host, settings.server.port) {
            Ok(b) => b,
            Err(e) => {
                log::error!("{e}");
                eprintln!("svc: {e}. Set server.port (0 picks a free port) or pass --port");
                return Err(StartFailed);
            }
        };
        poller.set_port(bound.addr.port());
        // Agents on this host reach an unspecified bind address through loopback.
        let mut reach = bound.addr;
        if reach.ip().is_unspecified() {
            reach.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let base = format!("http://{reach}");
        endpoint = Endpoint {
            kind: "http".into(),
            address: Some(base.clone()),
        };
        let mcp_for_runs = Arc::clone(&mcp);
        let url = format!("{base}/mcp");
        mcp_provider = Some(Arc::new(move |settings: &Settings, _run_id: &str| {
            Some(McpEndpoint {
                url: url.clone(),
                token: mcp_for_runs.mint(settings),
            })
        }));
        log::info!("HTTP API, dashboard and MCP endpoint on {base}");
        server = Some(bound);
    }
    Ok(Listeners {
        mcp,
        per_run: per_run_server,
        dashboard: server,
        endpoint,
        mcp_provider,
        webhooks: Arc::default(),
        webhook,
    })
}

/// Taking the workflow over, under its lock: the control token (see [`control_token`]; a token
/// file that cannot be written stops the start), then the processes earlier daemons on this
/// workflow left behind, which are ended. From here on every child carries this daemon's lock
/// path.
fn take_over_workflow(env: &Env, lock: &WorkflowLock) -> Result<String, StartFailed> {
    let control_token = match control_token(env, &lock.path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("svc: {e}");
            return Err(StartFailed);
        }
    };
    // Children of an earlier daemon on this workflow that outlived it (a SIGKILL leaves
    // grandchildren behind) carry its lock path; holding the lock now, end them.
    let lock_text = lock.path.display().to_string();
    let mut orphans = crate::process::reap_orphans(&lock_text);
    // The siblings' too, where no daemon holds that lock file now (a dead sharer's children).
    for sibling in free_sibling_locks(lock) {
        orphans.extend(crate::process::reap_orphans(&sibling.display().to_string()));
    }
    if !orphans.is_empty() {
        log::warn!(
            "ended {} orphaned process(es) of an earlier daemon on this workflow: {orphans:?}",
            orphans.len()
        );
    }
    crate::process::set_owner_marker(&lock_text);
    Ok(control_token)
}

/// The worker pool: its driver loads now (a driver that cannot load stops the start). A dry
/// run starts no pool (no machine is made for runs that are only decided). The pool reports
/// into the state thread's inbox and tells the MCP server which hosts it recycled.
fn start_pool(
    args: &DaemonArgs,
    settings: &Arc<Settings>,
    workflow: &Workflow,
    lock: &Locked,
    listeners: &Listeners,
    facts: Option<Arc<dyn crate::facts::Facts>>,
    events: &Sender<Event>,
) -> Result<Option<PoolHandle>, StartFailed> {
    let pool_notices = events.clone();
    let pool_claims = Arc::clone(&listeners.mcp);
    let pool = if args.dry_run {
        None
    } else {
        Some(
            match crate::workers::service::start(
                settings,
                Arc::clone(&workflow.env),
                crate::workers::service::PoolPaths::beside_lock(&lock.lock.path),
                facts,
                Box::new(move |notice| {
                    use crate::workers::service::Notice;
                    let _ = pool_notices.send(match notice {
                        Notice::Event { event, message } => Event::Notice { event, message },
                        Notice::Status(view) => Event::Pool(view),
                        Notice::Recycled { host } => {
                            pool_claims.run_tokens.recycle_host(&host);
                            return;
                        }
                    });
                }),
            ) {
                Ok(p) => p,
                Err(e) => {
                    log::error!("{e}");
                    eprintln!("svc: {e}");
                    return Err(StartFailed);
                }
            },
        )
    };
    Ok(pool)
}

/// The trace writer and the claim store.
struct Stores {
    trace: TraceSink,
    /// The trace writer thread (let go at the end).
    trace_thread: JoinHandle<()>,
    /// The claim store, of whichever kind was opened.
    claims: StoreParts,
    /// That kind.
    claims_kind: &'static store::Kind,
}

/// The stores: the trace writer thread, then the claim store (read back, swept once, and its
/// store thread; the in-memory one in a dry run). A claim store that cannot be opened is
/// reported and the daemon runs on with the in-memory one, except beside another daemon on this workflow, where only the
/// store keeps the two apart: that stops the start.
fn start_stores(
    args: &DaemonArgs,
    settings: &Settings,
    workflow: &Workflow,
    lock: &Locked,
    url: Option<String>,
    events: &Sender<Event>,
) -> Result<Stores, StartFailed> {
    let notices = events.clone();
    let (trace, trace_thread) =
        crate::trace::start(settings.server.trace_dir.clone(), move |message| {
            let _ = notices.send(Event::Notice {
                event: "trace_write_failed".into(),
                message,
            });
        });
    let config = if args.dry_run {
        ClaimStoreConfig::Memory
    } else {
        lock.store.clone()
    };
    let owner = match claim_store_owner(&lock.owner_id, workflow, url) {
        Ok(owner) => owner,
        Err(e) => {
            log::error!("{e}");
            eprintln!("svc: {e}");
            return Err(StartFailed);
        }
    };
    let opened = match open_claim_store(&config, owner.clone(), events) {
        Ok(opened) => opened,
        // Beside another daemon on this workflow, only the store keeps the two apart.
        // A fleet's store: without it this daemon cannot know what the others run.
        Err(e) if matches!(config, ClaimStoreConfig::Postgres(_)) => {
            let e = format!(
                "{e}; svc does not start without the fleet's claim store (SVC_CLAIM_STORE), since it could run an issue another daemon runs"
            );
            log::error!("{e}");
            eprintln!("svc: {e}");
            return Err(StartFailed);
        }
        Err(e) if lock.lock.path != lock.lock.base => {
            let e = format!(
                "{e}; another daemon runs on this workflow ({}), and without the claim store the two could run one issue twice. Fix the store or stop the other daemon",
                lock.lock.base.display()
            );
            log::error!("{e}");
            eprintln!("svc: {e}");
            return Err(StartFailed);
        }
        Err(_) => open_claim_store(&ClaimStoreConfig::Memory, owner, events)
            .expect("the in-memory claim store always opens"),
    };
    let claims_kind = opened.store.kind();
    let gate = Arc::new(opened.gate);
    Ok(Stores {
        trace,
        trace_thread,
        claims: start_claim_store(opened.store, opened.hydrated, gate, events),
        claims_kind,
    })
}

/// The announcement: what the snapshot tells of this daemon, and the "started" log line.
fn announce(
    workflow: &Workflow,
    settings: &Settings,
    lock: &Locked,
    listeners: &Listeners,
    claim_store: &'static store::Kind,
    log_file: Option<String>,
) -> DaemonInfo {
    let daemon = DaemonInfo {
        owner_id: lock.owner_id.clone(),
        pid: std::process::id(),
        hostname: hostname(&workflow.env),
        started_at: unix_ms(),
        workflow_path: workflow.path.display().to_string(),
        lock_path: lock.lock.path.display().to_string(),
        endpoint: listeners.endpoint.clone(),
        log_file,
        claim_store,
    };
    log::info!(
        "svc {} started: workflow {}, tracker {}, agent {}, lock {}",
        env!("CARGO_PKG_VERSION"),
        workflow.path.display(),
        settings.tracker.kind,
        settings.agent.kind,
        lock.lock.path.display()
    );
    daemon
}

/// The issue store (SQLite) and its writer thread: the store (the issue and trace routes exist
/// only with it) and where runs send their issues to the writer. A store that cannot be opened
/// is reported, and the daemon runs on without it (a corrupt or locked file must not become a
/// crash loop).
fn open_issue_store(
    settings: &Settings,
    events: &Sender<Event>,
) -> (Option<Arc<IssueStore>>, Option<Sender<Issue>>) {
    let store = match IssueStore::open(&settings.server.issue_store_path) {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            let message = format!("{e}; the issue and trace routes are off until it is fixed");
            log::error!("{message}");
            let _ = events.send(Event::Notice {
                event: "issue_store_unavailable".into(),
                message,
            });
            None
        }
    };
    let seen = store.as_ref().map(|s| {
        let notices = events.clone();
        crate::trace::store::start_writer(Arc::clone(s), move |event, message| {
            let _ = notices.send(Event::Notice {
                event: event.into(),
                message,
            });
        })
    });
    (store, seen)
}

/// What the stages before made for the state thread, moved into it.
struct Handover {
    daemon: DaemonInfo,
    /// The state thread's inbox.
    events: (Sender<Event>, Receiver<Event>),
    pool: Option<PoolHandle>,
    trace: TraceSink,
    claims: StoreParts,
    seen_issues: Option<Sender<Issue>>,
}

/// The orchestrator: everything is handed to it, the poller thread starts, and the state (with
/// what the claim store held) and its first snapshot are built. The state thread itself runs
/// last, on this thread ([`Runtime::run`]).
fn start_orchestrator(
    args: &DaemonArgs,
    workflow: &Workflow,
    poller: Poller,
    listeners: &Listeners,
    handover: Handover,
) -> (Runtime, Arc<SnapshotHub>) {
    let parts = RuntimeParts {
        name: Arc::clone(&workflow.name),
        path: workflow.path.clone(),
        limits: crate::orchestrator::runtime::DaemonLimits {
            max_concurrent_agents: workflow.settings().daemon.max_concurrent_agents,
            daily_budget_usd: workflow.settings().daemon.daily_budget_usd,
        },
        loaded: Arc::clone(&workflow.loaded),
        trace: handover.trace,
        env: Arc::clone(&workflow.env),
        daemon: handover.daemon,
        mcp: listeners.mcp_provider.clone(),
        seen_issues: handover.seen_issues,
        events: handover.events,
        pool: handover.pool,
        store: handover.claims,
        mode: crate::orchestrator::protocol::Mode {
            once: args.once,
            dry_run: args.dry_run,
        },
        remote_mcp: Some(crate::agent::run::RemoteMcp {
            server: Arc::clone(&listeners.mcp),
            mcp_port: listeners.per_run.as_ref().map(|s| s.addr.port()),
            dashboard: listeners.dashboard.is_some(),
            tunnels: Arc::default(),
        }),
        webhooks: listeners
            .webhook
            .is_some()
            .then(|| Arc::clone(&listeners.webhooks)),
    };
    Runtime::new(parts, poller)
}

/// The trace index the HTTP routes read, and the changes `/ws` broadcasts.
struct Traces {
    index: SharedIndex,
    changes: Receiver<Vec<Change>>,
}

/// The trace watcher: with an issue store and a dashboard, a thread polls the trace files into
/// the bounded index the trace routes and `/ws` read.
fn start_trace_watcher(settings: &Settings, has_store: bool, listeners: &Listeners) -> Traces {
    let traces: SharedIndex = Arc::default();
    let (trace_changes, trace_changes_rx) = crossbeam_channel::bounded(64);
    if has_store && listeners.dashboard.is_some() {
        crate::trace::watcher::start(
            settings.server.trace_dir.clone(),
            Arc::clone(&traces),
            trace_changes,
        );
    }
    Traces {
        index: traces,
        changes: trace_changes_rx,
    }
}

/// Serving: the listeners bound before start answering, the claims-only one first, then the
/// dashboard's with its WebSocket broadcaster.
fn start_servers(
    listeners: Listeners,
    runtime: &Runtime,
    hub: &Arc<SnapshotHub>,
    workflow: &Workflow,
    control_token: String,
    store: Option<&Arc<IssueStore>>,
    traces: Traces,
) {
    let workflows = Arc::clone(&workflow.served);
    if let Some(per_run_server) = listeners.per_run {
        let port = per_run_server.addr.port();
        per_run_server.start(Arc::new(HttpCtx {
            hub: Arc::clone(hub),
            events: runtime.events_tx.clone(),
            control_token: control_token.clone(),
            mcp: Arc::clone(&listeners.mcp),
            loaded: Arc::clone(&workflow.loaded),
            workflows: Arc::clone(&workflows),
            store: None,
            traces: Arc::default(),
            ws: Arc::default(),
            port,
            listener: crate::http::Listener::PerRun,
            webhooks: Arc::clone(&listeners.webhooks),
            requests: Default::default(),
        }));
    }
    if let Some(webhook_server) = listeners.webhook {
        let port = webhook_server.addr.port();
        webhook_server.start(Arc::new(HttpCtx {
            hub: Arc::clone(hub),
            events: runtime.events_tx.clone(),
            // Never used here: no control route is served.
            control_token: String::new(),
            mcp: Arc::default(),
            loaded: Arc::clone(&workflow.loaded),
            workflows: Arc::clone(&workflows),
            store: None,
            traces: Arc::default(),
            ws: Arc::default(),
            port,
            listener: crate::http::Listener::Webhooks,
            webhooks: Arc::clone(&listeners.webhooks),
            requests: Default::default(),
        }));
    }
    if let Some(server) = listeners.dashboard {
        let ws_hub = Arc::new(crate::http::ws::Hub::default());
        let port = server.addr.port();
        let ctx = Arc::new(HttpCtx {
            hub: Arc::clone(hub),
            events: runtime.events_tx.clone(),
            control_token,
            mcp: listeners.mcp,
            loaded: Arc::clone(&workflow.loaded),
            workflows,
            store: store.cloned(),
            traces: traces.index,
            ws: Arc::clone(&ws_hub),
            port,
            listener: crate::http::Listener::Dashboard,
            webhooks: Arc::clone(&listeners.webhooks),
            requests: Default::default(),
        });
        crate::http::ws::start_broadcaster(Arc::clone(&ctx), ws_hub, traces.changes);
        server.start(ctx);
    }
}

/// Readiness: serving (the listeners were bound before this and answer now), so a service
/// manager is told, and its watchdog is pinged while the state thread is alive.
fn notify_ready(env: &Env, hub: &Arc<SnapshotHub>) {
    crate::notify::send("READY=1\nSTATUS=serving");
    if let Some(interval) = crate::notify::watchdog(env) {
        start_watchdog(Arc::clone(hub), interval);
    }
}

/// The threads that show the snapshot; the stop waits a little for them.
struct Displays {
    printer: Option<JoinHandle<()>>,
    tui_stop: Arc<AtomicBool>,
    tui: Option<JoinHandle<()>>,
}

/// The displays: the snapshot printer (a JSON line on stdout per change) or the terminal
/// dashboard when it owns the terminal; neither in a dry run.
fn start_displays(
    args: &DaemonArgs,
    tui: bool,
    hub: &Arc<SnapshotHub>,
    runtime: &Runtime,
) -> Displays {
    let printer = (!tui && !args.dry_run).then(|| start_printer(Arc::clone(hub)));
    let tui_stop = Arc::new(AtomicBool::new(false));
    let tui_thread = tui.then(|| {
        let (hub, events, stop) = (
            Arc::clone(hub),
            runtime.events_tx.clone(),
            Arc::clone(&tui_stop),
        );
        std::thread::Builder::new()
            .name("tui".into())
            .spawn(move || {
                if let Err(e) = crate::tui::run(hub, events.clone(), stop) {
                    log::error!("terminal dashboard failed: {e}; stopping");
                    let _ = events.send(crate::orchestrator::protocol::Event::Shutdown);
                }
            })
            .expect("spawning the terminal dashboard")
    });
    Displays {
        printer,
        tui_stop,
        tui: tui_thread,
    }
}

/// The stop, once the state thread has returned: the service manager is told, the worker pool
/// drained, the displays given their last snapshot, and the lock let go last.
fn shut_down(
    workflow: &Workflow,
    pool: Option<PoolHandle>,
    hub: Arc<SnapshotHub>,
    displays: Displays,
    trace_thread: JoinHandle<()>,
    lock: Locked,
) {
    crate::notify::stopping();
    // Drain the pool: machines still leased get until drain_deadline_ms, then every machine is
    // destroyed (each destroy bounded by its driver timeout).
    let drain_deadline = workflow
        .loaded
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .settings
        .worker
        .worker_pool
        .as_ref()
        .map_or(0, |p| p.drain_deadline_ms);
    if let Some(pool) = &pool
        && !pool.drain(Duration::from_millis(drain_deadline) + Duration::from_secs(65))
    {
        log::warn!(
            "the worker pool did not drain in time; machines may be left (a driver with a ledger finds them at the next start)"
        );
    }
    log::info!("svc stopped");
    // The printer ends once it has printed the last snapshot and the hub is closed; the
    // dashboard restores the terminal before the process exits.
    hub.close();
    // Both are bounded: a stdout nobody reads (a stopped pager, a full pipe) must not hold
    // the exit. The printer gets a second for the last snapshot, the dashboard a second to
    // restore the terminal (it checks the flag every 250 ms).
    if let Some(p) = displays.printer {
        join_within(p, Duration::from_secs(1), "snapshot printer");
    }
    displays
        .tui_stop
        .store(true, std::sync::atomic::Ordering::Release);
    if let Some(t) = displays.tui {
        join_within(t, Duration::from_secs(1), "terminal dashboard");
    }
    drop(trace_thread);
    drop(lock);
}

/// Who this daemon is in the claim store: its owner id, host and pid, and how long it may stay
/// silent before others take its claims over (`SVC_CLAIM_TTL_MS`).
/// A TTL that is not a number of milliseconds of at least [`store::MIN_TTL_MS`] is refused.
fn claim_store_owner(
    owner_id: &str,
    workflow: &Workflow,
    url: Option<String>,
) -> Result<store::Owner, String> {
    let ttl_ms = match workflow.env.non_empty("SVC_CLAIM_TTL_MS") {
        None => store::DEFAULT_TTL_MS,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(ms) if ms >= store::MIN_TTL_MS => ms,
            _ => {
                return Err(format!(
                    "SVC_CLAIM_TTL_MS={v} is not a number of milliseconds of at least {} (twice the heartbeat of {} ms): with less, a live daemon's claims could be taken over between two of its heartbeats. Set it to {} or more, or unset it for the default {}",
                    store::MIN_TTL_MS,
                    store::HEARTBEAT.as_millis(),
                    store::MIN_TTL_MS,
                    store::DEFAULT_TTL_MS
                ));
            }
        },
    };
    Ok(store::Owner {
        id: owner_id.to_string(),
        hostname: hostname(&workflow.env),
        pid: std::process::id(),
        ttl_ms,
        workflow: workflow.path.display().to_string(),
        url,
        started_at: unix_ms(),
    })
}

/// Opens the claim store and reads it back (the history, and a first sweep that takes over
/// what earlier daemons left), with a second handle for the run threads. A store that cannot
/// be opened or read is reported, and the daemon runs on with the in-memory store (the
/// snapshot says `memory`).
fn open_claim_store(
    config: &ClaimStoreConfig,
    owner: store::Owner,
    events: &Sender<Event>,
) -> Result<store::Opened, String> {
    let opened = match config.open_and_hydrate(
        owner,
        crate::orchestrator::state::HISTORY_LIMIT,
        unix_ms(),
    ) {
        Ok(opened) => opened,
        Err(e) => {
            let message = format!(
                "{e}; claims, retries and run history are kept in memory only until it is fixed"
            );
            log::error!("{message}");
            let _ = events.send(Event::Notice {
                event: "claim_store_unavailable".into(),
                message,
            });
            return Err(e.message);
        }
    };
    // What earlier daemons left, in a store that outlives them.
    if opened.store.kind().capabilities.crash_recovery {
        let hydrated = &opened.hydrated;
        log::info!(
            "claim store {}: {} retries taken over from earlier daemons, {} slots held by other daemons, {} past runs",
            opened.store.location(),
            hydrated.sweep.taken_over.len(),
            hydrated.sweep.foreign.len(),
            hydrated.history.len()
        );
    }
    Ok(opened)
}

/// Starts the claim store's thread over the opened store, its reports turned into events:
/// batches written, failures and recoveries (once each), and what its sweeps found.
fn start_claim_store(
    claims: Box<dyn store::ClaimStore>,
    hydrated: store::Hydrated,
    gate: Arc<store::Gate>,
    events: &Sender<Event>,
) -> StoreParts {
    use crate::orchestrator::store::Written;
    let notices = events.clone();
    let failing = std::sync::atomic::AtomicBool::new(false);
    let foreign = hydrated.sweep.foreign.clone();
    let tx = store::start_writer(claims, foreign, move |written| match written {
        Written::Ok { ops, last, at } => {
            let _ = notices.send(Event::Persisted { ops, last, at });
        }
        Written::Recovered => {
            if failing.swap(false, std::sync::atomic::Ordering::Relaxed) {
                log::info!("claim store: reached and written again");
                let _ = notices.send(Event::Notice {
                    event: "claim_store_recovered".into(),
                    message: "the claim store is reached and written again".into(),
                });
            }
        }
        Written::Unavailable(e) => {
            if !failing.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log::warn!("{e}; running runs go on, nothing new is claimed until it is back");
                let _ = notices.send(Event::Notice {
                    event: "claim_store_unavailable".into(),
                    message: format!(
                        "{e}; running runs go on, nothing new is claimed until it is back"
                    ),
                });
            }
        }
        Written::Failed(e) => {
            if !failing.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log::warn!("{e}; kept and tried again every second");
                let _ = notices.send(Event::Notice {
                    event: "claim_store_write_failed".into(),
                    message: format!("{e}; kept and tried again every second"),
                });
            }
        }
        Written::SetAside { op, error } => {
            let message = format!(
                "{error}; this write ({op}) can never succeed and was set aside, so the writes behind it go on"
            );
            log::warn!("claim store: {message}");
            let _ = notices.send(Event::Notice {
                event: "claim_store_write_set_aside".into(),
                message,
            });
        }
        Written::Swept(sweep) => {
            let _ = notices.send(Event::Swept(sweep));
        }
    });
    StoreParts { tx, hydrated, gate }
}

/// Joins `thread` unless it is still running after `limit` (then it is left to the exit).
fn join_within(thread: std::thread::JoinHandle<()>, limit: Duration, what: &str) {
    let deadline = std::time::Instant::now() + limit;
    while !thread.is_finished() {
        if std::time::Instant::now() >= deadline {
            log::warn!(
                "the {what} did not finish within {} ms; exiting without it",
                limit.as_millis()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = thread.join();
}

/// Pings the service manager's watchdog every half interval while the state thread's heartbeat
/// is younger than the interval: a wedged state thread stops the pings, and the manager restarts
/// svc.
fn start_watchdog(hub: Arc<SnapshotHub>, interval: Duration) {
    let _ = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            loop {
                let age = unix_ms().saturating_sub(hub.current().built_at);
                if u128::from(age) < interval.as_millis() {
                    crate::notify::send("WATCHDOG=1");
                }
                std::thread::sleep(interval / 2);
            }
        });
}

/// SIGINT and SIGTERM stop gracefully; a second signal kills every child and exits (130 for
/// SIGINT, 143 for SIGTERM). SIGHUP reopens the log file (for logrotate).
fn start_signal_thread(events: crossbeam_channel::Sender<Event>) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        log::warn!("cannot install signal handlers; stop svc with SIGKILL");
        return;
    };
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut seen = 0;
            for sig in signals.forever() {
                if sig == SIGHUP {
                    REOPEN_LOG.store(true, std::sync::atomic::Ordering::Relaxed);
                    log::info!("SIGHUP: log file reopened");
                    continue;
                }
                seen += 1;
                if seen == 1 {
                    log::info!("signal {sig}: stopping gracefully (send it again to force)");
                    let _ = events.send(Event::Shutdown);
                } else {
                    log::warn!("signal {sig} again: killing every child and exiting now");
                    crate::process::kill_everything();
                    std::process::exit(if sig == SIGINT { 130 } else { 143 });
                }
            }
        });
}

/// Prints the snapshot as one JSON line on stdout after each change, at most four times a
/// second (the TUI's refresh rate); ends after the last publication.
fn start_printer(hub: Arc<SnapshotHub>) -> std::thread::JoinHandle<()> {
    let wake = hub.subscribe();
    std::thread::Builder::new()
        .name("snapshot-printer".into())
        .spawn(move || {
            let mut printed = u64::MAX;
            let mut stdout = std::io::stdout();
            loop {
                let closed = wake
                    .recv_timeout(Duration::from_secs(1))
                    .is_err_and(|e| e.is_disconnected());
                let version = hub.version();
                if version != printed {
                    printed = version;
                    let snap = hub.current();
                    let mut line = snap.state_json.clone();
                    line.push('\n');
                    if stdout
                        .write_all(line.as_bytes())
                        .and_then(|()| stdout.flush())
                        .is_err()
                    {
                        return;
                    }
                }
                if closed {
                    return;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
        .expect("spawning the printer")
}
