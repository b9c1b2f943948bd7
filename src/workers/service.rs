//! The pool thread: the only owner of the [`Pool`] and its drivers. Run threads acquire through a
//! [`PoolHandle`] (a [`Lease`] releases itself when dropped, so exactly once); driver calls run
//! on threads of their own and come back as inputs; the state thread hears of every event and
//! of each change of the pool's figures through the `notify` callback.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded, select, unbounded};
use serde_json::Value;

use super::fake::FakeDriver;
use super::files::{Inventory, InventoryEntry, SpendFile, SpendKeep};
use super::pool::{self, Effect, Input, LeaseId, Limits, Millis, Pool, Spend};
use super::sdk::{LoadError, SdkDriver};
use super::{BUILT_IN, Driver, LocalDriver, PoolView, ProvisionRequest, WorkerId};
use crate::config::Settings;
use crate::env::Env;

const PROVISION_TIMEOUT: Duration = Duration::from_secs(120);
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
const DESTROY_TIMEOUT: Duration = Duration::from_secs(60);
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

pub use super::{POOL_LABEL, WORKER_LABEL, unix_ms};

/// What the pool tells the state thread.
#[derive(Clone, Debug)]
pub enum Notice {
    Event {
        event: String,
        message: String,
    },
    Status(PoolView),
    /// A machine on `host` was destroyed: claims bound to the host end.
    Recycled {
        host: String,
    },
}

/// Which driver and limits a workflow selects.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    pub specifier: String,
    /// The `workers.<name>` profile minus `driver` (empty without `worker.kind`).
    pub options: Value,
    pub limits: Limits,
    pub configured: bool,
}

pub fn selection(settings: &Settings) -> Selection {
    let worker = &settings.worker;
    let block = worker.worker_pool.as_ref();
    // The legacy static list: one machine per host, runs sharded across them, at most
    // `max_concurrent_agents_per_host` on each (unlimited without it), never reaped.
    if !worker.ssh_hosts.is_empty() {
        let hosts = worker.ssh_hosts.len() as u64;
        return Selection {
            specifier: "static-ssh".into(),
            options: serde_json::json!({ "ssh_hosts": worker.ssh_hosts }),
            // A pool block's timings (acquire timeout, reap interval, drain) still apply.
            limits: Limits {
                min: hosts,
                max: hosts,
                warm: hosts,
                max_in_flight: worker.max_concurrent_agents_per_host.unwrap_or(0),
                ttl_ms: Millis::MAX,
                idle_reap_ms: Millis::MAX,
                stale_heartbeat_ms: Millis::MAX,
                ..block.map_or_else(Limits::spec_defaults, Limits::from_settings)
            },
            configured: true,
        };
    }
    let (specifier, options, hosts) =
        match worker.kind.as_ref().and_then(|k| settings.workers.get(k)) {
            Some(profile) => {
                let mut options = profile.extra.clone();
                if let Some(map) = options.as_object_mut() {
                    if profile.driver == "static-ssh" {
                        map.insert("ssh_hosts".into(), serde_json::json!(profile.ssh_hosts));
                    }
                    if profile.driver == "docker" {
                        map.insert("image".into(), serde_json::json!(profile.image));
                        map.insert("user".into(), serde_json::json!(profile.user));
                    }
                }
                (
                    profile.driver.clone(),
                    options,
                    profile.ssh_hosts.len() as u64,
                )
            }
            None => (
                block.map_or_else(|| "local".to_string(), |p| p.driver.clone()),
                Value::Object(Default::default()),
                0,
            ),
        };
    let configured = block.is_some() || worker.kind.is_some();
    let limits = match block {
        Some(p) => Limits::from_settings(p),
        None if specifier == "local" => Limits::unbounded_local(),
        // A static-ssh profile alone uses every one of its hosts.
        None if specifier == "static-ssh" => Limits {
            min: hosts,
            max: hosts,
            warm: hosts,
            ..Limits::spec_defaults()
        },
        None => Limits::spec_defaults(),
    };
    Selection {
        specifier,
        options,
        limits,
        configured,
    }
}

/// Where a pool keeps its files and what it is called.
#[derive(Clone, Debug)]
pub struct PoolPaths {
    /// The daemon's lock file path without its extension: the spend file and the inventory sit
    /// beside it (`<stem>.spend.json`, `<stem>.ledger.json`).
    pub state_stem: PathBuf,
    /// Where out-of-tree drivers are pinned.
    pub pin_dir: PathBuf,
    /// The value of the `svc-pool` label of this pool's machines.
    pub pool_id: String,
}

impl PoolPaths {
    pub fn beside_lock(lock_path: &std::path::Path) -> PoolPaths {
        let stem = lock_path.with_extension("");
        PoolPaths {
            pin_dir: lock_path
                .parent()
                .unwrap_or(std::path::Path::new("."))
                .join("drivers"),
            pool_id: stem
                .file_name()
                .map_or_else(|| "svc".into(), |n| n.to_string_lossy().into_owned()),
            state_stem: stem,
        }
    }

    fn spend_file(&self) -> SpendFile {
        SpendFile {
            path: self.state_stem.with_extension("spend.json"),
        }
    }

    fn inventory_path(&self) -> PathBuf {
        self.state_stem.with_extension("ledger.json")
    }
}

/// A driver and the events its loading produced.
pub struct Built {
    pub driver: Arc<dyn Driver>,
    pub events: Vec<(&'static str, String)>,
}

/// Builds the driver a specifier names: a built-in kind when it is exactly one, else an
/// out-of-tree executable (loaded, pinned, initialized).
pub fn build_driver(
    specifier: &str,
    options: &Value,
    settings: &Settings,
    env: &Env,
    pin_dir: &std::path::Path,
) -> Result<Built, LoadError> {
    let driver: Arc<dyn Driver> = match specifier {
        "local" => Arc::new(LocalDriver),
        "fake" => Arc::new(FakeDriver::new(options).map_err(LoadError::Failed)?),
        "static-ssh" => Arc::new(
            super::static_ssh::StaticSsh::new(
                options,
                settings.worker.ssh_config.clone(),
                Duration::from_millis(settings.worker.ssh_timeout_ms),
            )
            .map_err(LoadError::Failed)?,
        ),
        "docker" => {
            let user = options
                .get("user")
                .and_then(Value::as_str)
                .unwrap_or("root");
            let dir = pin_dir.parent().unwrap_or(pin_dir).join("docker");
            Arc::new(
                super::docker::Docker::new(options, None, user, &dir).map_err(LoadError::Failed)?,
            )
        }
        s if BUILT_IN.contains(&s) => {
            return Err(LoadError::Failed(format!(
                "worker pool driver {s} is not available in this build of svc"
            )));
        }
        _ => {
            let dir = settings
                .workflow_path
                .parent()
                .unwrap_or(std::path::Path::new("."));
            let loaded = SdkDriver::load(specifier, options, dir, pin_dir, env)?;
            let caps = loaded.driver.capabilities();
            let events = vec![
                (
                    "worker_pool_driver_loaded",
                    format!(
                        "driver {specifier} loaded: kind {}, SDK {}, sshAddressable {}, ephemeral {}, usesLedger {}",
                        loaded.driver.kind(),
                        super::sdk::SDK_MAJOR,
                        caps.ssh_addressable,
                        caps.ephemeral,
                        caps.uses_ledger
                    ),
                ),
                (
                    "worker_pool_driver_module_pinned",
                    format!(
                        "driver {specifier} pinned for the daemon's life: {} (sha256 {}); changing its code needs a restart",
                        loaded.pinned.display(),
                        loaded.sha256
                    ),
                ),
            ];
            return Ok(Built {
                driver: Arc::new(loaded.driver),
                events,
            });
        }
    };
    Ok(Built {
        driver,
        events: Vec::new(),
    })
}

/// A slot granted to a run; dropping it releases the slot (exactly once).
pub struct Lease {
    pub id: LeaseId,
    pub worker_id: WorkerId,
    /// Where the run executes; `None` for this host.
    pub host: Option<String>,
    /// The host is reached over SSH (the driver is `sshAddressable`): the run's workspace,
    /// hooks and bridge execute there.
    pub ssh: bool,
    /// ssh options the driver gave for this machine (`metadata.sshOptions`).
    pub ssh_options: Vec<String>,
    tx: Sender<Msg>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Release(self.id));
    }
}

/// Why an acquire returned without a lease.
#[derive(Debug)]
pub enum AcquireError<T> {
    Denied(String),
    /// A message arrived on the caller's control channel first (a cancel); the request was
    /// withdrawn.
    Interrupted(T),
}

#[derive(Clone, Debug)]
struct Grant {
    worker: WorkerId,
    host: Option<String>,
    ssh: bool,
    ssh_options: Vec<String>,
}

enum Msg {
    Acquire {
        lease: LeaseId,
        issue_id: String,
        affinity: Option<WorkerId>,
        reply: Sender<Result<Grant, String>>,
    },
    Cancel(LeaseId),
    Release(LeaseId),
    Input(Input),
    Reload(Arc<Settings>),
    Drain(Sender<()>),
}

/// The worker-seconds used, updated by the pool thread for the snapshot (they move with the
/// clock, so they are read live rather than published as changes).
#[derive(Default)]
pub struct SpendGauge {
    pub lifetime_seconds: AtomicU64,
    pub day_seconds: AtomicU64,
}

#[derive(Clone)]
pub struct PoolHandle {
    tx: Sender<Msg>,
    next_lease: Arc<AtomicU64>,
    pub spend: Arc<SpendGauge>,
    /// The longest an acquire may wait (the pool denies it at `acquire_timeout_ms`; this is a
    /// safety net should the pool thread be gone).
    acquire_limit: Arc<AtomicU64>,
}

impl PoolHandle {
    /// Waits for a slot for `issue_id`, preferring `affinity`; returns early when `interrupt`
    /// delivers a message (the request is then withdrawn).
    pub fn acquire<T>(
        &self,
        issue_id: &str,
        affinity: Option<WorkerId>,
        interrupt: &Receiver<T>,
    ) -> Result<Lease, AcquireError<T>> {
        self.acquire_keeping(issue_id, affinity, interrupt, |_| true, &mut Vec::new())
    }

    /// [`acquire`](Self::acquire), where only messages `interrupts` accepts end the wait;
    /// the others are kept in `kept`, in order, for the caller.
    pub fn acquire_keeping<T>(
        &self,
        issue_id: &str,
        affinity: Option<WorkerId>,
        interrupt: &Receiver<T>,
        interrupts: impl Fn(&T) -> bool,
        kept: &mut Vec<T>,
    ) -> Result<Lease, AcquireError<T>> {
        let lease = self.next_lease.fetch_add(1, Ordering::Relaxed) + 1;
        let (reply, answer) = bounded(1);
        self.tx
            .send(Msg::Acquire {
                lease,
                issue_id: issue_id.to_string(),
                affinity,
                reply,
            })
            .map_err(|_| AcquireError::Denied("the worker pool has stopped".into()))?;
        let limit = Duration::from_millis(self.acquire_limit.load(Ordering::Relaxed))
            + Duration::from_secs(10);
        let deadline = std::time::Instant::now() + limit;
        loop {
            select! {
                recv(answer) -> a => return match a {
                    Ok(Ok(grant)) => Ok(Lease {
                        id: lease,
                        worker_id: grant.worker,
                        host: grant.host,
                        ssh: grant.ssh,
                        ssh_options: grant.ssh_options,
                        tx: self.tx.clone(),
                    }),
                    Ok(Err(reason)) => Err(AcquireError::Denied(reason)),
                    Err(_) => Err(AcquireError::Denied("the worker pool has stopped".into())),
                },
                recv(interrupt) -> msg => match msg {
                    Ok(m) if !interrupts(&m) => kept.push(m),
                    Ok(m) => {
                        let _ = self.tx.send(Msg::Cancel(lease));
                        return Err(AcquireError::Interrupted(m));
                    }
                    Err(_) => {
                        let _ = self.tx.send(Msg::Cancel(lease));
                        return Err(AcquireError::Denied("the run was abandoned".into()));
                    }
                },
                default(deadline.saturating_duration_since(std::time::Instant::now())) => {
                    let _ = self.tx.send(Msg::Cancel(lease));
                    return Err(AcquireError::Denied("the worker pool did not answer".into()));
                },
            }
        }
    }

    /// New settings from a reload: limits apply at once; a changed driver specifier loads the
    /// new driver (the old machines are retired, their leases kept).
    pub fn reload(&self, settings: Arc<Settings>) {
        let _ = self.tx.send(Msg::Reload(settings));
    }

    /// Drains the pool (see [`pool`]) and waits until it is drained or `limit` passes.
    pub fn drain(&self, limit: Duration) -> bool {
        let (done, drained) = bounded(1);
        if self.tx.send(Msg::Drain(done)).is_err() {
            return true;
        }
        drained.recv_timeout(limit).is_ok()
    }
}

/// Starts the pool thread for `settings`, keeping its worker-seconds in `facts` (the daemon's
/// durable store) when there is one, else in the spend file. Fails (a start error) when the
/// driver cannot be loaded.
pub fn start(
    settings: &Arc<Settings>,
    env: Arc<Env>,
    paths: PoolPaths,
    facts: Option<Arc<dyn crate::facts::Facts>>,
    notify: Box<dyn Fn(Notice) + Send>,
) -> Result<PoolHandle, String> {
    let chosen = selection(settings);
    let built = build_driver(
        &chosen.specifier,
        &chosen.options,
        settings,
        &env,
        &paths.pin_dir,
    )
    .map_err(|e| format!("{}: {}", e.event(), e.message()))?;
    for (event, message) in &built.events {
        log::info!("{message}");
        notify(Notice::Event {
            event: event.to_string(),
            message: message.clone(),
        });
    }
    let now = unix_ms();
    let (spend_keep, spend, problem) = SpendKeep::open(paths.spend_file(), facts, now);
    if let Some(e) = problem {
        log::warn!("{e}");
        notify(Notice::Event {
            event: "worker_pool_spend_file_unreadable".into(),
            message: e,
        });
    }
    let mut pool = Pool::new(chosen.limits.clone(), spend, now);
    let (tx, rx) = unbounded();
    let handle = PoolHandle {
        tx: tx.clone(),
        next_lease: Arc::default(),
        spend: Arc::default(),
        acquire_limit: Arc::new(AtomicU64::new(chosen.limits.acquire_timeout_ms)),
    };
    let mut service = Service {
        drivers: BTreeMap::from([(0, Arc::clone(&built.driver))]),
        generation: 0,
        selection: chosen,
        waiting: HashMap::new(),
        inventory: None,
        spend_keep,
        spend_failing: false,
        inbox: tx,
        notify,
        drains: Vec::new(),
        settings: Arc::clone(settings),
        env,
        paths,
        gauge: Arc::clone(&handle.spend),
        acquire_limit: Arc::clone(&handle.acquire_limit),
    };
    if built.driver.capabilities().uses_ledger {
        let survivors = service.open_inventory(&built.driver);
        service.feed(&mut pool, Input::Adopt { records: survivors });
    }
    // Before the state thread's first poll: `min` and warm machines are asked for, and the
    // pool's figures (a spend cap read back from the file, say) reach dispatch first.
    service.feed(&mut pool, Input::Tick);
    std::thread::Builder::new()
        .name("worker-pool".into())
        .spawn(move || service.run(pool, rx))
        .map_err(|e| format!("cannot start the worker pool thread: {e}"))?;
    Ok(handle)
}

struct Service {
    drivers: BTreeMap<u64, Arc<dyn Driver>>,
    generation: u64,
    selection: Selection,
    waiting: HashMap<LeaseId, Sender<Result<Grant, String>>>,
    inventory: Option<Inventory>,
    spend_keep: SpendKeep,
    spend_failing: bool,
    inbox: Sender<Msg>,
    notify: Box<dyn Fn(Notice) + Send>,
    drains: Vec<Sender<()>>,
    settings: Arc<Settings>,
    env: Arc<Env>,
    paths: PoolPaths,
    gauge: Arc<SpendGauge>,
    acquire_limit: Arc<AtomicU64>,
}

impl Service {
    fn event(&self, event: &str, message: String) {
        log::info!("worker pool: {event}: {message}");
        (self.notify)(Notice::Event {
            event: event.to_string(),
            message,
        });
    }

    /// Reads the inventory and the driver's machines: the labelled survivors of an earlier daemon
    /// are returned for adoption, inventory entries the driver no longer has are dropped.
    fn open_inventory(&mut self, driver: &Arc<dyn Driver>) -> Vec<super::WorkerRecord> {
        let (mut inventory, problem) = Inventory::open(self.paths.inventory_path());
        if let Some(p) = problem {
            self.event("worker_pool_ledger_unreadable", p);
        }
        let listed = match driver.list(LIST_TIMEOUT) {
            Ok(l) => l,
            Err(e) => {
                self.event(
                    "worker_pool_list_failed",
                    format!("cannot list the driver's machines: {e}; survivors of an earlier daemon are not adopted now"),
                );
                self.inventory = Some(inventory);
                return Vec::new();
            }
        };
        let ours: Vec<super::WorkerRecord> = listed
            .into_iter()
            .filter(|r| r.labels.get(POOL_LABEL) == Some(&self.paths.pool_id))
            .collect();
        let gone: Vec<String> = inventory
            .entries()
            .keys()
            .filter(|id| !ours.iter().any(|r| &r.worker_id == *id))
            .cloned()
            .collect();
        for id in gone {
            let _ = inventory.remove(&id);
        }
        for r in &ours {
            let _ = inventory.set(
                &r.worker_id,
                InventoryEntry {
                    record: Some(r.clone()),
                    driver: self.selection.specifier.clone(),
                },
            );
        }
        self.inventory = Some(inventory);
        ours
    }

    fn run(mut self, mut pool: Pool, inbox: Receiver<Msg>) {
        loop {
            let now = unix_ms();
            let wait = pool.next_deadline().map_or(Duration::from_secs(60), |t| {
                Duration::from_millis(t.saturating_sub(now))
            });
            let input = select! {
                recv(inbox) -> msg => match msg {
                    Ok(msg) => self.on_message(&mut pool, msg),
                    Err(_) => return,
                },
                default(wait) => Some(Input::Tick),
            };
            if let Some(input) = input {
                self.feed(&mut pool, input);
            }
            if pool_is_drained(&pool) && !self.drains.is_empty() {
                for d in self.drains.drain(..) {
                    let _ = d.send(());
                }
                return;
            }
        }
    }

    fn on_message(&mut self, pool: &mut Pool, msg: Msg) -> Option<Input> {
        match msg {
            Msg::Acquire {
                lease,
                issue_id,
                affinity,
                reply,
            } => {
                self.waiting.insert(lease, reply);
                Some(Input::Acquire {
                    lease,
                    issue_id,
                    affinity,
                })
            }
            Msg::Cancel(lease) => {
                self.waiting.remove(&lease);
                Some(Input::Cancel { lease })
            }
            Msg::Release(lease) => Some(Input::Release { lease }),
            Msg::Input(input) => {
                self.on_driver_result(&input);
                Some(input)
            }
            Msg::Reload(settings) => {
                self.reload(pool, settings);
                Some(Input::Tick)
            }
            Msg::Drain(done) => {
                self.drains.push(done);
                Some(Input::Drain)
            }
        }
    }

    fn reload(&mut self, pool: &mut Pool, settings: Arc<Settings>) {
        let chosen = selection(&settings);
        self.settings = settings;
        if chosen.limits != self.selection.limits {
            self.acquire_limit
                .store(chosen.limits.acquire_timeout_ms, Ordering::Relaxed);
            self.feed(pool, Input::Reconfigure(chosen.limits.clone()));
        }
        if chosen.specifier != self.selection.specifier {
            match build_driver(
                &chosen.specifier,
                &chosen.options,
                &self.settings,
                &self.env,
                &self.paths.pin_dir,
            ) {
                Ok(built) => {
                    for (event, message) in built.events {
                        self.event(event, message);
                    }
                    self.generation += 1;
                    self.drivers.insert(self.generation, built.driver);
                    self.event(
                        "worker_pool_driver_replaced",
                        format!(
                            "driver {} replaces {}; its machines are retired as their runs end",
                            chosen.specifier, self.selection.specifier
                        ),
                    );
                    self.selection = chosen;
                    let generation = self.generation;
                    self.feed(pool, Input::NewGeneration(generation));
                }
                Err(e) => self.event(
                    e.event(),
                    format!(
                        "{}; keeping driver {}",
                        e.message(),
                        self.selection.specifier
                    ),
                ),
            }
        } else {
            self.selection.limits = chosen.limits;
        }
    }

    fn feed(&mut self, pool: &mut Pool, input: Input) {
        let fx = pool::handle(pool, unix_ms(), input);
        self.execute(pool, fx);
        // A replaced driver ends (its process too) once none of its machines is left.
        let current = self.generation;
        self.drivers
            .retain(|g, _| *g == current || pool.machines.values().any(|m| m.generation == *g));
        self.gauge
            .lifetime_seconds
            .store(pool.spend.lifetime_ms / 1000, Ordering::Relaxed);
        self.gauge
            .day_seconds
            .store(pool.spend.day_ms / 1000, Ordering::Relaxed);
    }

    /// Keeps the inventory in step with what the driver reported.
    fn on_driver_result(&mut self, input: &Input) {
        let Some(inventory) = self.inventory.as_mut() else {
            return;
        };
        let result = match input {
            Input::Provisioned {
                worker,
                result: Ok(record),
            } => inventory.set(
                worker,
                InventoryEntry {
                    record: Some(record.clone()),
                    driver: self.selection.specifier.clone(),
                },
            ),
            Input::Provisioned {
                worker,
                result: Err(_),
            }
            | Input::Destroyed {
                worker,
                result: Ok(()),
            } => inventory.remove(worker),
            _ => Ok(()),
        };
        if let Err(e) = result {
            self.event("worker_pool_ledger_write_failed", e);
        }
    }

    fn execute(&mut self, pool: &mut Pool, fx: Vec<Effect>) {
        let mut pending: VecDeque<Effect> = fx.into();
        while let Some(effect) = pending.pop_front() {
            if let Effect::SaveSpend(spend) = effect {
                self.save_spend(pool, spend);
                continue;
            }
            if let Some(input) = self.execute_one(effect) {
                // An instant driver answered inline: feed its answer now.
                self.on_driver_result(&input);
                let more = pool::handle(pool, unix_ms(), input);
                pending.extend(more);
            }
        }
    }

    /// Keeps the spend; with a shared store, the pool's caps are then held to the totals of
    /// every daemon on it.
    fn save_spend(&mut self, pool: &mut Pool, spend: Spend) {
        match self.spend_keep.save(spend) {
            Ok(totals) => {
                self.spend_failing = false;
                if totals.day == pool.spend.day {
                    pool.spend = totals;
                }
            }
            Err(e) if !self.spend_failing => {
                self.spend_failing = true;
                self.event("worker_pool_spend_file_write_failed", e);
            }
            Err(_) => {}
        }
    }

    /// Executes one effect; an instant driver's answer comes back at once.
    fn execute_one(&mut self, effect: Effect) -> Option<Input> {
        match effect {
            Effect::Provision {
                worker,
                generation,
                affinity_key,
            } => {
                let driver = self.driver(generation)?;
                if let Some(inventory) = self.inventory.as_mut()
                    && let Err(e) = inventory.set(
                        &worker,
                        InventoryEntry {
                            record: None,
                            driver: self.selection.specifier.clone(),
                        },
                    )
                {
                    // Write-ahead failed: provisioning now could leak a machine no restart finds.
                    self.event("worker_pool_ledger_write_failed", e.clone());
                    return Some(Input::Provisioned {
                        worker,
                        result: Err(format!("not provisioned: {e}")),
                    });
                }
                let request = ProvisionRequest {
                    labels: BTreeMap::from([
                        (POOL_LABEL.to_string(), self.paths.pool_id.clone()),
                        (WORKER_LABEL.to_string(), worker.clone()),
                    ]),
                    worker_id: worker.clone(),
                    affinity_key,
                    timeout: PROVISION_TIMEOUT,
                };
                self.call(driver, move |d| Input::Provisioned {
                    result: d.provision(&request),
                    worker,
                })
            }
            Effect::Probe {
                worker,
                generation,
                record,
            } => {
                let driver = self.driver(generation)?;
                self.call(driver, move |d| Input::Probed {
                    result: d.probe(&record, PROBE_TIMEOUT),
                    worker,
                })
            }
            Effect::Destroy {
                worker,
                generation,
                record,
                reason,
            } => {
                let driver = self.driver(generation)?;
                self.call(driver, move |d| Input::Destroyed {
                    result: d.destroy(&record, DESTROY_TIMEOUT, &reason),
                    worker,
                })
            }
            Effect::Grant {
                lease,
                worker,
                generation,
                host,
                ssh_options,
            } => {
                let ssh = self
                    .driver(generation)
                    .is_some_and(|d| d.capabilities().ssh_addressable);
                let gone = self.waiting.remove(&lease).is_none_or(|reply| {
                    reply
                        .send(Ok(Grant {
                            worker,
                            host,
                            ssh,
                            ssh_options,
                        }))
                        .is_err()
                });
                // Nobody took it (the run gave up meanwhile): the slot goes back.
                gone.then_some(Input::Release { lease })
            }
            Effect::Deny { lease, reason } => {
                if let Some(reply) = self.waiting.remove(&lease) {
                    let _ = reply.send(Err(reason));
                }
                None
            }
            Effect::Event { event, message } => {
                self.event(event, message);
                None
            }
            Effect::SaveSpend(_) => unreachable!("saved by `execute`, with the pool at hand"),
            Effect::Status(status) => {
                (self.notify)(Notice::Status(PoolView {
                    driver: self.selection.specifier.clone(),
                    configured: self.selection.configured,
                    status,
                }));
                None
            }
            Effect::Recycled { host } => {
                if let Some(host) = host {
                    (self.notify)(Notice::Recycled { host });
                }
                None
            }
            Effect::Drained => None,
        }
    }

    fn driver(&self, generation: u64) -> Option<Arc<dyn Driver>> {
        self.drivers.get(&generation).cloned()
    }

    /// Runs a driver call inline (an instant driver) or on a thread of its own.
    fn call(
        &self,
        driver: Arc<dyn Driver>,
        f: impl FnOnce(&dyn Driver) -> Input + Send + 'static,
    ) -> Option<Input> {
        if driver.instant() {
            return Some(f(&*driver));
        }
        let inbox = self.inbox.clone();
        let spawned = std::thread::Builder::new()
            .name("worker-call".into())
            .spawn(move || {
                let _ = inbox.send(Msg::Input(f(&*driver)));
            });
        if spawned.is_err() {
            log::error!("cannot start a worker driver call thread");
        }
        None
    }
}

fn pool_is_drained(pool: &Pool) -> bool {
    pool.machines.is_empty() && pool.draining()
}
