//! The worker pool's state machine: `handle(pool, now, input) -> effects`. It does no I/O,
//! spawns nothing and reads no clock, so every rule below is tested with a fake clock.
//!
//! * **Acquire**: a request waits in line; a ready machine with a free slot is probed, then
//!   handed out (a retry prefers the machine its issue had before). Without one, the pool grows
//!   towards `max`; a request still waiting after `acquire_timeout_ms` is denied.
//! * **Size**: at least `min` machines, `warm` idle ones ready for the next run, at most `max`
//!   (and `spend.max_concurrent_workers`). A failing `provision` backs off (1 s doubling to 30 s).
//! * **Reaping**, every `reap_interval_ms`: machines past `ttl_ms`, or whose heartbeat (the last
//!   good probe) is older than `stale_heartbeat_ms`, are retired; idle machines beyond `warm` are
//!   destroyed after `idle_reap_ms` while more than `min` remain. A retired machine takes no new
//!   lease and is destroyed once its last lease is released: running work is never killed.
//! * **Spend**: every machine that exists (from the provision request until it is destroyed)
//!   costs worker-seconds, counted for the pool's life and per UTC day. Past a seconds cap the
//!   pool is capped: no new lease, no new machine, idle machines destroyed, running leases kept.
//! * **Drain** (daemon stop): waiting requests are denied, idle machines destroyed at once, the
//!   others when released, and every machine left at `drain_deadline_ms` is destroyed anyway.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::{WorkerId, WorkerRecord};
use crate::config::WorkerPoolSettings;
pub use crate::time::Millis;
/// A run's claim on a slot; chosen by the caller, unique per daemon.
pub type LeaseId = u64;

pub(super) const DAY_MS: Millis = 86_400_000;
const PROVISION_BACKOFF_MIN_MS: Millis = 1000;
const PROVISION_BACKOFF_MAX_MS: Millis = 30_000;

/// The pool's settings (`worker.worker_pool`), in the pool's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub min: u64,
    pub max: u64,
    pub warm: u64,
    /// Slots per machine; 0 means unlimited (the `local` driver without a pool block).
    pub max_in_flight: u64,
    pub ttl_ms: Millis,
    pub idle_reap_ms: Millis,
    pub acquire_timeout_ms: Millis,
    pub reap_interval_ms: Millis,
    pub stale_heartbeat_ms: Millis,
    pub drain_deadline_ms: Millis,
    pub max_workers_per_issue: Option<u64>,
    pub max_concurrent_workers: Option<u64>,
    pub max_worker_seconds: Option<u64>,
    pub daily_worker_seconds: Option<u64>,
}

impl Limits {
    pub fn from_settings(s: &WorkerPoolSettings) -> Limits {
        Limits {
            min: s.min,
            max: s.max,
            warm: s.warm,
            max_in_flight: s.max_in_flight,
            ttl_ms: s.ttl_ms,
            idle_reap_ms: s.idle_reap_ms,
            acquire_timeout_ms: s.acquire_timeout_ms,
            reap_interval_ms: s.reap_interval_ms,
            stale_heartbeat_ms: s.stale_heartbeat_ms,
            drain_deadline_ms: s.drain_deadline_ms,
            max_workers_per_issue: s.max_workers_per_issue,
            max_concurrent_workers: s.spend_max_concurrent_workers,
            max_worker_seconds: s.spend_max_worker_seconds,
            daily_worker_seconds: s.spend_daily_worker_seconds,
        }
    }

    /// The spec's defaults of `worker.worker_pool` (for `worker.kind` without a pool block).
    pub fn spec_defaults() -> Limits {
        Limits {
            min: 0,
            max: 1,
            warm: 1,
            max_in_flight: 1,
            ttl_ms: 3_600_000,
            idle_reap_ms: 300_000,
            acquire_timeout_ms: 30_000,
            reap_interval_ms: 15_000,
            stale_heartbeat_ms: 600_000,
            drain_deadline_ms: 30_000,
            max_workers_per_issue: None,
            max_concurrent_workers: None,
            max_worker_seconds: None,
            daily_worker_seconds: None,
        }
    }

    /// This host as one machine with unlimited slots: a workflow without a pool block runs
    /// exactly as it would without a pool.
    pub fn unbounded_local() -> Limits {
        Limits {
            min: 1,
            max: 1,
            warm: 1,
            max_in_flight: 0,
            ttl_ms: Millis::MAX,
            idle_reap_ms: Millis::MAX,
            stale_heartbeat_ms: Millis::MAX,
            drain_deadline_ms: 0,
            ..Limits::spec_defaults()
        }
    }
}

/// Worker-seconds used, in milliseconds: for the pool's life and for one UTC day.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Spend {
    pub lifetime_ms: u64,
    /// Days since the Unix epoch (UTC) that `day_ms` counts.
    pub day: u64,
    pub day_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Provisioning,
    Ready,
    Destroying,
}

#[derive(Clone, Debug)]
pub struct Machine {
    pub id: WorkerId,
    pub record: Option<WorkerRecord>,
    phase: Phase,
    /// Which driver made it (the driver changes when its specifier changes on reload).
    pub generation: u64,
    pub created_at: Millis,
    /// When its last lease was released (or it became ready); `None` while leased.
    pub idle_since: Option<Millis>,
    /// The last good provision or probe.
    pub heartbeat_at: Millis,
    pub leases: BTreeMap<LeaseId, String>,
    /// Waiters promised a slot here once the probe in flight answers.
    assigned: BTreeSet<LeaseId>,
    probing: bool,
    /// Why it takes no new lease (ttl, stale, failed probe, capped, drain, replaced driver).
    pub retired: Option<String>,
    /// When a failed destroy is tried again.
    destroy_retry_at: Option<Millis>,
}

impl Machine {
    fn usable(&self) -> bool {
        self.phase != Phase::Destroying && self.retired.is_none()
    }

    fn is_idle(&self) -> bool {
        self.leases.is_empty() && self.assigned.is_empty()
    }
}

#[derive(Clone, Debug)]
struct Waiter {
    lease: LeaseId,
    issue_id: String,
    affinity: Option<WorkerId>,
    since: Millis,
    /// The machine probing for it.
    assigned: Option<WorkerId>,
}

#[derive(Clone, Debug)]
pub enum Input {
    Acquire {
        lease: LeaseId,
        issue_id: String,
        /// The machine the issue's previous run had.
        affinity: Option<WorkerId>,
    },
    /// The run stopped waiting (cancelled); a slot granted meanwhile is released.
    Cancel {
        lease: LeaseId,
    },
    Release {
        lease: LeaseId,
    },
    Provisioned {
        worker: WorkerId,
        result: Result<WorkerRecord, String>,
    },
    Probed {
        worker: WorkerId,
        result: Result<(), String>,
    },
    Destroyed {
        worker: WorkerId,
        result: Result<(), String>,
    },
    /// Machines that outlived an earlier daemon (the inventory and `list`), adopted as ready ones to
    /// be probed; those beyond `max` are destroyed.
    Adopt {
        records: Vec<WorkerRecord>,
    },
    /// New settings (a reload); running leases are kept.
    Reconfigure(Limits),
    /// A new driver (its specifier changed): machines of older generations are retired.
    NewGeneration(u64),
    Tick,
    Drain,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    Provision {
        worker: WorkerId,
        generation: u64,
        affinity_key: Option<String>,
    },
    Probe {
        worker: WorkerId,
        generation: u64,
        record: WorkerRecord,
    },
    Destroy {
        worker: WorkerId,
        generation: u64,
        record: WorkerRecord,
        reason: String,
    },
    Grant {
        lease: LeaseId,
        worker: WorkerId,
        generation: u64,
        host: Option<String>,
        /// The machine's `metadata.sshOptions` (see `ssh::options_of`).
        ssh_options: Vec<String>,
    },
    Deny {
        lease: LeaseId,
        reason: String,
    },
    Event {
        event: &'static str,
        message: String,
    },
    SaveSpend(Spend),
    Status(Status),
    /// A machine is gone (destroyed): whatever was bound to its host (per-run claims) ends.
    Recycled {
        host: Option<String>,
    },
    /// Draining is over: no machine is left.
    Drained,
}

/// The pool's figures for the snapshot, doctor and dispatch. Worker-seconds are not among
/// them: they move with the clock, so a change of status would be reported at every input;
/// the pool thread publishes them through its `SpendGauge` instead.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// Machines that exist (any phase).
    pub live: u64,
    pub idle: u64,
    pub provisioning: u64,
    pub leased: u64,
    /// Requests waiting for a slot.
    pub waiting: u64,
    /// How many leases the pool can hold now, counting machines it may still create; `None`
    /// when unlimited.
    pub slots: Option<u64>,
    /// Why the pool takes no new work, when a spend cap is reached.
    pub capped: Option<String>,
}

pub struct Pool {
    pub limits: Limits,
    pub machines: BTreeMap<WorkerId, Machine>,
    waiters: VecDeque<Waiter>,
    pub spend: Spend,
    spend_accounted_at: Millis,
    generation: u64,
    next_worker: u64,
    next_reap_at: Millis,
    provision_failures: u32,
    provision_after: Millis,
    last_provision_error: Option<String>,
    capped: Option<String>,
    draining: Option<Millis>,
    drained: bool,
    last_status: Option<Status>,
}

/// The cap reached, if any, for `spend` under `limits`.
fn spend_cap(limits: &Limits, spend: &Spend) -> Option<String> {
    if let Some(cap) = limits.max_worker_seconds
        && spend.lifetime_ms / 1000 >= cap
    {
        return Some(format!(
            "spend.max_worker_seconds reached ({} of {cap} worker-seconds)",
            spend.lifetime_ms / 1000
        ));
    }
    if let Some(cap) = limits.daily_worker_seconds
        && spend.day_ms / 1000 >= cap
    {
        return Some(format!(
            "spend.daily_worker_seconds reached ({} of {cap} worker-seconds today, UTC)",
            spend.day_ms / 1000
        ));
    }
    None
}

impl Pool {
    /// How many more machines may be created now. `max` counts only the current driver's
    /// machines: a replaced driver's machines keep their runs until those end, but not its
    /// successor's capacity (else a reload that swaps drivers stalls dispatch until the old
    /// runs end). The spend cap `max_concurrent_workers` counts every machine that exists,
    /// since each one costs.
    fn room(&self) -> u64 {
        let own = self
            .machines
            .values()
            .filter(|m| m.generation == self.generation)
            .count() as u64;
        let by_max = self.limits.max.saturating_sub(own);
        self.limits.max_concurrent_workers.map_or(by_max, |cap| {
            by_max.min(cap.saturating_sub(self.machines.len() as u64))
        })
    }

    /// Whether more machines exist than [`Pool::room`] allows (after `max` was lowered).
    fn over_max(&self) -> bool {
        let own = self
            .machines
            .values()
            .filter(|m| m.generation == self.generation)
            .count() as u64;
        own > self.limits.max
            || self
                .limits
                .max_concurrent_workers
                .is_some_and(|cap| self.machines.len() as u64 > cap)
    }

    /// A pool starting at `now` with the spend already used (from the spend file).
    pub fn new(limits: Limits, mut spend: Spend, now: Millis) -> Pool {
        // A figure of an earlier day (from the spend file) does not count today.
        if spend.day != now / DAY_MS {
            spend.day = now / DAY_MS;
            spend.day_ms = 0;
        }
        Pool {
            next_reap_at: now + limits.reap_interval_ms,
            limits,
            machines: BTreeMap::new(),
            waiters: VecDeque::new(),
            spend,
            spend_accounted_at: now,
            generation: 0,
            next_worker: 0,
            provision_failures: 0,
            provision_after: 0,
            last_provision_error: None,
            capped: None,
            draining: None,
            drained: false,
            last_status: None,
        }
    }

    /// When the pool next needs a [`Input::Tick`]: an acquire timing out, the reaper, a
    /// provision backoff ending, a failed destroy to retry, the drain deadline.
    pub fn next_deadline(&self) -> Option<Millis> {
        let mut next = Some(self.next_reap_at);
        let mut consider = |t: Millis| next = Some(next.map_or(t, |n: Millis| n.min(t)));
        if let Some(w) = self.waiters.front() {
            consider(w.since.saturating_add(self.limits.acquire_timeout_ms));
        }
        if self.provision_after > 0 {
            consider(self.provision_after);
        }
        for m in self.machines.values() {
            if let Some(t) = m.destroy_retry_at {
                consider(t);
            }
        }
        if let Some(deadline) = self.draining {
            consider(deadline);
        }
        next
    }

    pub fn draining(&self) -> bool {
        self.draining.is_some()
    }

    pub fn capped(&self) -> Option<&str> {
        self.capped.as_deref()
    }

    fn slots_per_machine(&self) -> Option<u64> {
        (self.limits.max_in_flight > 0).then_some(self.limits.max_in_flight)
    }

    fn has_room(&self, m: &Machine) -> bool {
        self.slots_per_machine()
            .is_none_or(|slots| ((m.leases.len() + m.assigned.len()) as u64) < slots)
    }

    /// Adds the worker-seconds every existing machine cost since the last count.
    fn account(&mut self, now: Millis) {
        let from = self.spend_accounted_at;
        self.spend_accounted_at = now.max(from);
        let machines = self.machines.len() as u64;
        if now <= from {
            return;
        }
        let today = now / DAY_MS;
        if self.spend.day != today {
            // The day rolled over: today counts only from midnight (UTC).
            let midnight = today * DAY_MS;
            self.spend.day = today;
            self.spend.day_ms = now.saturating_sub(midnight.max(from)) * machines;
        } else {
            self.spend.day_ms = self
                .spend
                .day_ms
                .saturating_add(now.saturating_sub(from).saturating_mul(machines));
        }
        self.spend.lifetime_ms = self
            .spend
            .lifetime_ms
            .saturating_add(now.saturating_sub(from).saturating_mul(machines));
    }

    fn status(&self) -> Status {
        let live = self.machines.len() as u64;
        let leased: u64 = self.machines.values().map(|m| m.leases.len() as u64).sum();
        let slots = if self.capped.is_some() || self.draining.is_some() {
            Some(leased)
        } else {
            self.slots_per_machine().map(|per| {
                let usable = self.machines.values().filter(|m| m.usable()).count() as u64;
                let retired_leases: u64 = self
                    .machines
                    .values()
                    .filter(|m| !m.usable())
                    .map(|m| m.leases.len() as u64)
                    .sum();
                let growth = self.room();
                (usable + growth) * per + retired_leases
            })
        };
        Status {
            live,
            idle: self
                .machines
                .values()
                .filter(|m| m.phase == Phase::Ready && m.usable() && m.is_idle())
                .count() as u64,
            provisioning: self
                .machines
                .values()
                .filter(|m| m.phase == Phase::Provisioning)
                .count() as u64,
            leased,
            waiting: self.waiters.len() as u64,
            slots,
            capped: self.capped.clone(),
        }
    }
}

/// Feeds one input to the pool.
pub fn handle(pool: &mut Pool, now: Millis, input: Input) -> Vec<Effect> {
    let mut fx = Vec::new();
    pool.account(now);
    match input {
        Input::Acquire {
            lease,
            issue_id,
            affinity,
        } => {
            if let Some(why) = refusal(pool) {
                fx.push(Effect::Deny { lease, reason: why });
            } else {
                pool.waiters.push_back(Waiter {
                    lease,
                    issue_id,
                    affinity,
                    since: now,
                    assigned: None,
                });
            }
        }
        Input::Cancel { lease } => {
            pool.waiters.retain(|w| w.lease != lease);
            for m in pool.machines.values_mut() {
                m.assigned.remove(&lease);
            }
            release(pool, now, lease, &mut fx);
        }
        Input::Release { lease } => release(pool, now, lease, &mut fx),
        Input::Provisioned { worker, result } => on_provisioned(pool, now, worker, result, &mut fx),
        Input::Probed { worker, result } => on_probed(pool, now, worker, result, &mut fx),
        Input::Destroyed { worker, result } => on_destroyed(pool, now, worker, result, &mut fx),
        Input::Adopt { records } => {
            for record in records {
                let id = record.worker_id.clone();
                if pool.machines.contains_key(&id) {
                    continue;
                }
                // Keep later ids clear of adopted ones (`w-7` adopted: the next is `w-8`).
                // (A driver's answer is outside input: an id near the top never takes over the
                // numbering.)
                if let Some(n) = id
                    .strip_prefix("w-")
                    .and_then(|n| n.parse::<u64>().ok())
                    .filter(|n| *n < u64::MAX / 2)
                {
                    pool.next_worker = pool.next_worker.max(n);
                }
                let over = pool.room() == 0;
                let mut m = machine(id.clone(), pool.generation, now, Phase::Ready);
                m.record = Some(record);
                m.idle_since = Some(now);
                if over {
                    m.retired = Some("adopted beyond worker_pool.max".into());
                }
                fx.push(Effect::Event {
                    event: "worker_pool_worker_adopted",
                    message: format!(
                        "{id} survived an earlier daemon; {}",
                        if over {
                            "destroying it (over max)"
                        } else {
                            "adopted after a probe"
                        }
                    ),
                });
                pool.machines.insert(id, m);
            }
            // Adopted machines are probed before any use (their heartbeat is unknown).
            let ids: Vec<WorkerId> = pool.machines.keys().cloned().collect();
            for id in ids {
                let m = pool.machines.get_mut(&id).expect("listed above");
                if m.retired.is_some() && m.is_idle() {
                    start_destroy(pool, &id, "adopted beyond worker_pool.max", &mut fx);
                } else if m.phase == Phase::Ready && !m.probing && m.heartbeat_at == now {
                    m.probing = true;
                    let record = m.record.clone().expect("ready machines have a record");
                    fx.push(Effect::Probe {
                        worker: id,
                        generation: m.generation,
                        record,
                    });
                }
            }
        }
        Input::Reconfigure(limits) => {
            if pool.limits.reap_interval_ms != limits.reap_interval_ms {
                pool.next_reap_at = now + limits.reap_interval_ms;
            }
            pool.limits = limits;
        }
        Input::NewGeneration(generation) => {
            pool.generation = generation;
            let ids: Vec<WorkerId> = pool
                .machines
                .values()
                .filter(|m| m.generation < generation)
                .map(|m| m.id.clone())
                .collect();
            for id in ids {
                retire(pool, &id, "its driver was replaced", &mut fx);
            }
        }
        Input::Tick => {}
        Input::Drain => {
            if pool.draining.is_none() {
                pool.draining = Some(now + pool.limits.drain_deadline_ms);
                for w in std::mem::take(&mut pool.waiters) {
                    fx.push(Effect::Deny {
                        lease: w.lease,
                        reason: "the worker pool is draining (svc is stopping)".into(),
                    });
                }
                let ids: Vec<WorkerId> = pool.machines.keys().cloned().collect();
                for id in ids {
                    if let Some(m) = pool.machines.get_mut(&id) {
                        m.assigned.clear();
                    }
                    retire(pool, &id, "the pool is draining", &mut fx);
                }
                fx.push(Effect::SaveSpend(pool.spend));
            }
        }
    }
    on_clock(pool, now, &mut fx);
    if pool.draining.is_none() {
        pump(pool, now, &mut fx);
        grow(pool, now, &mut fx);
    } else if pool.machines.is_empty() && !pool.drained {
        pool.drained = true;
        fx.push(Effect::Drained);
    }
    let status = pool.status();
    if pool.last_status.as_ref() != Some(&status) {
        pool.last_status = Some(status.clone());
        fx.push(Effect::Status(status));
    }
    fx
}

/// Why a new acquire is refused at once, if it is.
fn refusal(pool: &Pool) -> Option<String> {
    if pool.draining.is_some() {
        return Some("the worker pool is draining (svc is stopping)".into());
    }
    pool.capped
        .as_ref()
        .map(|why| format!("the worker pool is capped: {why}"))
}

fn machine(id: WorkerId, generation: u64, now: Millis, phase: Phase) -> Machine {
    Machine {
        id,
        record: None,
        phase,
        generation,
        created_at: now,
        idle_since: None,
        heartbeat_at: now,
        leases: BTreeMap::new(),
        assigned: BTreeSet::new(),
        probing: false,
        retired: None,
        destroy_retry_at: None,
    }
}

fn release(pool: &mut Pool, now: Millis, lease: LeaseId, fx: &mut Vec<Effect>) {
    let Some(id) = pool
        .machines
        .values()
        .find(|m| m.leases.contains_key(&lease))
        .map(|m| m.id.clone())
    else {
        return;
    };
    let m = pool.machines.get_mut(&id).expect("found above");
    m.leases.remove(&lease);
    if m.is_idle() {
        m.idle_since = Some(now);
        if let Some(why) = m.retired.clone() {
            start_destroy(pool, &id, &why, fx);
        }
    }
}

/// Marks a machine as taking no new lease; an idle one is destroyed at once.
fn retire(pool: &mut Pool, id: &str, why: &str, fx: &mut Vec<Effect>) {
    let Some(m) = pool.machines.get_mut(id) else {
        return;
    };
    if m.retired.is_none() {
        m.retired = Some(why.to_string());
    }
    // Waiters promised this machine go back in line.
    let promised: Vec<LeaseId> = std::mem::take(&mut m.assigned).into_iter().collect();
    for w in pool.waiters.iter_mut() {
        if promised.contains(&w.lease) {
            w.assigned = None;
        }
    }
    let m = pool.machines.get(id).expect("present above");
    if m.leases.is_empty() && m.phase == Phase::Ready {
        start_destroy(pool, id, why, fx);
    }
}

fn start_destroy(pool: &mut Pool, id: &str, why: &str, fx: &mut Vec<Effect>) {
    let Some(m) = pool.machines.get_mut(id) else {
        return;
    };
    if m.phase == Phase::Destroying && m.destroy_retry_at.is_none() {
        return;
    }
    m.phase = Phase::Destroying;
    m.destroy_retry_at = None;
    match m.record.clone() {
        Some(record) => fx.push(Effect::Destroy {
            worker: m.id.clone(),
            generation: m.generation,
            record,
            reason: why.to_string(),
        }),
        // Never provisioned (a provision still in flight is destroyed when it answers).
        None => {
            pool.machines.remove(id);
        }
    }
}

fn on_provisioned(
    pool: &mut Pool,
    now: Millis,
    id: WorkerId,
    result: Result<WorkerRecord, String>,
    fx: &mut Vec<Effect>,
) {
    let Some(m) = pool.machines.get_mut(&id) else {
        return;
    };
    match result {
        Ok(record) => {
            // The failure count is reset by the first good probe, not here: a machine that
            // provisions but never probes well must back off too.
            pool.provision_after = 0;
            pool.last_provision_error = None;
            m.record = Some(record);
            m.phase = Phase::Ready;
            m.heartbeat_at = now;
            m.idle_since = Some(now);
            fx.push(Effect::Event {
                event: "worker_pool_worker_provisioned",
                message: format!("{id} provisioned"),
            });
            if let Some(why) = m.retired.clone() {
                start_destroy(pool, &id, &why, fx);
            } else if pool.draining.is_some() {
                retire(pool, &id, "the pool is draining", fx);
            }
        }
        Err(e) => {
            pool.machines.remove(&id);
            let backoff = back_off(pool, now);
            pool.last_provision_error = Some(e.clone());
            fx.push(Effect::Event {
                event: "worker_pool_provision_failed",
                message: format!("{id}: {e}; trying again in {backoff} ms"),
            });
        }
    }
}

fn on_probed(
    pool: &mut Pool,
    now: Millis,
    id: WorkerId,
    result: Result<(), String>,
    fx: &mut Vec<Effect>,
) {
    let Some(m) = pool.machines.get_mut(&id) else {
        return;
    };
    m.probing = false;
    match result {
        Ok(()) => {
            m.heartbeat_at = now;
            pool.provision_failures = 0;
            if m.retired.is_some() || m.phase != Phase::Ready {
                return;
            }
            let host = m.record.as_ref().and_then(|r| r.worker_host.clone());
            let ssh_options = m
                .record
                .as_ref()
                .map(|r| super::ssh::options_of(&r.metadata))
                .unwrap_or_default();
            let generation = m.generation;
            let promised: Vec<LeaseId> = std::mem::take(&mut m.assigned).into_iter().collect();
            for lease in promised {
                let Some(pos) = pool.waiters.iter().position(|w| w.lease == lease) else {
                    continue;
                };
                let w = pool.waiters.remove(pos).expect("found above");
                let m = pool.machines.get_mut(&id).expect("present above");
                m.leases.insert(lease, w.issue_id);
                m.idle_since = None;
                fx.push(Effect::Grant {
                    lease,
                    worker: id.clone(),
                    generation,
                    host: host.clone(),
                    ssh_options: ssh_options.clone(),
                });
            }
        }
        Err(e) => {
            // A new machine is not asked for at once: a host that keeps failing its probe
            // would otherwise be provisioned, probed and destroyed in a tight loop.
            let backoff = back_off(pool, now);
            pool.last_provision_error = Some(format!("probe failed: {e}"));
            fx.push(Effect::Event {
                event: "worker_pool_probe_failed",
                message: format!(
                    "{id}: {e}; the machine takes no new runs (next machine in {backoff} ms)"
                ),
            });
            retire(pool, &id, &format!("probe failed: {e}"), fx);
        }
    }
}

fn on_destroyed(
    pool: &mut Pool,
    now: Millis,
    id: WorkerId,
    result: Result<(), String>,
    fx: &mut Vec<Effect>,
) {
    match result {
        Ok(()) => {
            if let Some(m) = pool.machines.remove(&id) {
                fx.push(Effect::Event {
                    event: "worker_pool_worker_destroyed",
                    message: format!("{id} destroyed"),
                });
                fx.push(Effect::Recycled {
                    host: m.record.and_then(|r| r.worker_host),
                });
            }
        }
        Err(e) => {
            let draining = pool.draining.is_some();
            let Some(m) = pool.machines.get_mut(&id) else {
                return;
            };
            fx.push(Effect::Event {
                event: "worker_pool_destroy_failed",
                message: if draining {
                    format!("{id}: {e}; left behind (the next start finds it if the driver keeps a ledger)")
                } else {
                    format!("{id}: {e}; trying again in {} ms", pool.limits.reap_interval_ms)
                },
            });
            if draining {
                pool.machines.remove(&id);
            } else {
                m.destroy_retry_at = Some(now + pool.limits.reap_interval_ms);
            }
        }
    }
}

/// Counts one more failure and holds provisioning back: 1 s, doubling to 30 s.
fn back_off(pool: &mut Pool, now: Millis) -> Millis {
    pool.provision_failures += 1;
    let backoff = (PROVISION_BACKOFF_MIN_MS << (pool.provision_failures - 1).min(5))
        .min(PROVISION_BACKOFF_MAX_MS);
    pool.provision_after = now + backoff;
    backoff
}

/// Timeouts, the reaper, spend caps and the drain deadline.
fn on_clock(pool: &mut Pool, now: Millis, fx: &mut Vec<Effect>) {
    // Acquires that waited too long.
    let timeout = pool.limits.acquire_timeout_ms;
    let expired: Vec<Waiter> = pool
        .waiters
        .iter()
        .filter(|w| now >= w.since.saturating_add(timeout))
        .cloned()
        .collect();
    for w in expired {
        pool.waiters.retain(|x| x.lease != w.lease);
        for m in pool.machines.values_mut() {
            m.assigned.remove(&w.lease);
        }
        let why = pool
            .last_provision_error
            .as_ref()
            .map_or(String::new(), |e| format!(" (last provision error: {e})"));
        fx.push(Effect::Deny {
            lease: w.lease,
            reason: format!(
                "no worker became available within acquire_timeout_ms ({timeout} ms){why}"
            ),
        });
    }
    // Failed destroys tried again.
    let retry: Vec<WorkerId> = pool
        .machines
        .values()
        .filter(|m| m.destroy_retry_at.is_some_and(|t| now >= t))
        .map(|m| m.id.clone())
        .collect();
    for id in retry {
        let why = pool.machines[&id].retired.clone().unwrap_or_default();
        start_destroy(pool, &id, &why, fx);
    }
    // Spend caps.
    let cap = spend_cap(&pool.limits, &pool.spend);
    if cap != pool.capped {
        match &cap {
            Some(why) => {
                fx.push(Effect::Event {
                    event: "worker_pool_spend_capped",
                    message: format!("{why}: no new runs on the pool; running work continues"),
                });
                for w in std::mem::take(&mut pool.waiters) {
                    for m in pool.machines.values_mut() {
                        m.assigned.remove(&w.lease);
                    }
                    fx.push(Effect::Deny {
                        lease: w.lease,
                        reason: format!("the worker pool is capped: {why}"),
                    });
                }
            }
            None => fx.push(Effect::Event {
                event: "worker_pool_spend_uncapped",
                message: "the spend caps allow new runs again".into(),
            }),
        }
        pool.capped = cap;
        fx.push(Effect::SaveSpend(pool.spend));
    }
    if let Some(why) = pool.capped.clone() {
        // Idle machines only cost: stop them.
        let idle: Vec<WorkerId> = pool
            .machines
            .values()
            .filter(|m| m.phase == Phase::Ready && m.is_idle() && m.retired.is_none())
            .map(|m| m.id.clone())
            .collect();
        for id in idle {
            retire(pool, &id, &why, fx);
        }
    }
    // The drain deadline: whatever is left goes.
    if let Some(deadline) = pool.draining
        && now >= deadline
    {
        let left: Vec<WorkerId> = pool
            .machines
            .values()
            .filter(|m| m.phase == Phase::Ready || m.destroy_retry_at.is_some())
            .map(|m| m.id.clone())
            .collect();
        for id in left {
            fx.push(Effect::Event {
                event: "worker_pool_drain_deadline",
                message: format!("{id} still leased at the drain deadline; destroying it"),
            });
            start_destroy(pool, &id, "drain deadline", fx);
        }
    }
    if now < pool.next_reap_at {
        return;
    }
    pool.next_reap_at = now + pool.limits.reap_interval_ms;
    fx.push(Effect::SaveSpend(pool.spend));
    if pool.draining.is_some() {
        return;
    }
    let limits = pool.limits.clone();
    let ids: Vec<WorkerId> = pool.machines.keys().cloned().collect();
    for id in &ids {
        let m = &pool.machines[id];
        if m.phase != Phase::Ready || m.retired.is_some() {
            continue;
        }
        if now >= m.created_at.saturating_add(limits.ttl_ms) {
            let why = format!("past ttl_ms ({} ms)", limits.ttl_ms);
            retire(pool, id, &why, fx);
        } else if now >= m.heartbeat_at.saturating_add(limits.stale_heartbeat_ms) {
            let why = format!(
                "heartbeat older than stale_heartbeat_ms ({} ms)",
                limits.stale_heartbeat_ms
            );
            retire(pool, id, &why, fx);
        }
    }
    // Idle machines beyond `warm` and above `min`, idle for too long.
    let mut idle: Vec<(Millis, WorkerId)> = pool
        .machines
        .values()
        .filter(|m| m.phase == Phase::Ready && m.usable() && m.is_idle())
        .map(|m| (m.idle_since.unwrap_or(now), m.id.clone()))
        .collect();
    idle.sort();
    let mut idle_left = idle.len() as u64;
    for (since, id) in idle {
        let usable = pool.machines.values().filter(|m| m.usable()).count() as u64;
        let over_max = pool.over_max();
        let long_idle = now >= since.saturating_add(limits.idle_reap_ms)
            && idle_left > limits.warm
            && usable > limits.min;
        if over_max || long_idle {
            let why = if over_max {
                "more machines than worker_pool.max".to_string()
            } else {
                format!("idle past idle_reap_ms ({} ms)", limits.idle_reap_ms)
            };
            retire(pool, &id, &why, fx);
            idle_left -= 1;
        }
    }
    // Heartbeats: probe ready machines not heard from for a reap interval.
    for id in &ids {
        let Some(m) = pool.machines.get_mut(id) else {
            continue;
        };
        if m.phase == Phase::Ready
            && m.retired.is_none()
            && !m.probing
            && now >= m.heartbeat_at.saturating_add(limits.reap_interval_ms)
        {
            m.probing = true;
            fx.push(Effect::Probe {
                worker: id.clone(),
                generation: m.generation,
                record: m.record.clone().expect("ready machines have a record"),
            });
        }
    }
}

/// The distinct machines an issue holds or is promised.
fn machines_of_issue(pool: &Pool, issue_id: &str) -> BTreeSet<WorkerId> {
    pool.machines
        .values()
        .filter(|m| {
            m.leases.values().any(|i| i == issue_id)
                || m.assigned.iter().any(|l| {
                    pool.waiters
                        .iter()
                        .any(|w| w.lease == *l && w.issue_id == issue_id)
                })
        })
        .map(|m| m.id.clone())
        .collect()
}

/// Hands free slots to waiters in line: each is promised a ready machine, which is probed
/// before the slot is granted.
fn pump(pool: &mut Pool, _now: Millis, fx: &mut Vec<Effect>) {
    if pool.capped.is_some() {
        return;
    }
    for i in 0..pool.waiters.len() {
        if pool.waiters[i].assigned.is_some() {
            continue;
        }
        let (lease, issue_id, affinity) = {
            let w = &pool.waiters[i];
            (w.lease, w.issue_id.clone(), w.affinity.clone())
        };
        let held = machines_of_issue(pool, &issue_id);
        let per_issue_full = pool
            .limits
            .max_workers_per_issue
            .is_some_and(|cap| held.len() as u64 >= cap);
        let eligible = |m: &Machine| {
            m.phase == Phase::Ready
                && m.usable()
                && pool.has_room(m)
                && (!per_issue_full || held.contains(&m.id))
        };
        // The issue's previous machine first, then the busiest machine with room (packing
        // leaves whole machines idle for reaping), then the lowest id.
        let choice = affinity
            .as_ref()
            .and_then(|a| pool.machines.get(a))
            .filter(|m| eligible(m))
            .or_else(|| {
                pool.machines
                    .values()
                    .filter(|m| eligible(m))
                    .max_by_key(|m| {
                        (
                            m.leases.len() + m.assigned.len(),
                            std::cmp::Reverse(m.id.clone()),
                        )
                    })
            })
            .map(|m| m.id.clone());
        let Some(id) = choice else { continue };
        let m = pool.machines.get_mut(&id).expect("chosen above");
        m.assigned.insert(lease);
        pool.waiters[i].assigned = Some(id.clone());
        if !m.probing {
            m.probing = true;
            fx.push(Effect::Probe {
                worker: id,
                generation: m.generation,
                record: m.record.clone().expect("ready machines have a record"),
            });
        }
    }
}

/// Provisions what `min`, `warm` and the waiting requests need, up to the maximum.
fn grow(pool: &mut Pool, now: Millis, fx: &mut Vec<Effect>) {
    if pool.capped.is_some() || now < pool.provision_after {
        return;
    }
    let per = pool.slots_per_machine().unwrap_or(u64::MAX);
    let unserved: Vec<&Waiter> = pool
        .waiters
        .iter()
        .filter(|w| w.assigned.is_none())
        .filter(|w| {
            pool.limits
                .max_workers_per_issue
                .is_none_or(|cap| (machines_of_issue(pool, &w.issue_id).len() as u64) < cap)
        })
        .collect();
    let provisioning = pool
        .machines
        .values()
        .filter(|m| m.phase == Phase::Provisioning && m.retired.is_none())
        .count() as u64;
    let idle_ready = pool
        .machines
        .values()
        .filter(|m| m.phase == Phase::Ready && m.usable() && m.is_idle())
        .count() as u64;
    let usable = pool.machines.values().filter(|m| m.usable()).count() as u64;
    let for_waiters = (unserved.len() as u64).div_ceil(per.max(1));
    let spare = provisioning.saturating_sub(for_waiters) + idle_ready;
    let affinity_key = unserved.first().map(|w| w.issue_id.clone());
    let mut want =
        for_waiters.saturating_sub(provisioning) + pool.limits.warm.saturating_sub(spare);
    want = want.max(pool.limits.min.saturating_sub(usable));
    let room = pool.room();
    for _ in 0..want.min(room) {
        pool.next_worker = pool.next_worker.saturating_add(1);
        let id = format!("w-{}", pool.next_worker);
        pool.machines.insert(
            id.clone(),
            machine(id.clone(), pool.generation, now, Phase::Provisioning),
        );
        fx.push(Effect::Provision {
            worker: id,
            generation: pool.generation,
            affinity_key: affinity_key.clone(),
        });
    }
}

#[cfg(test)]
mod tests;
