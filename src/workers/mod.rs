//! The worker pool: the machines runs execute on, and the drivers that make them.
//!
//! A run acquires a slot (a lease on a machine) before its workspace is prepared and releases it
//! exactly once when it settles. The pool keeps `min` machines, pre-warms `warm` idle ones, grows
//! to `max` on demand, probes a machine before handing it out, reaps machines past their ttl, idle
//! past `idle_reap_ms` or with stale heartbeats, enforces the spend caps, and drains on stop.
//!
//! * [`pool`] is the pure state machine: `(pool, now, input) -> effects`, no I/O, no clock.
//! * [`service`] is the pool thread that owns it: it executes the effects (driver calls on
//!   threads of their own), answers the run threads' acquires and reports to the state thread.
//! * Drivers sit behind [`Driver`]: [`LocalDriver`] (this host), [`fake::FakeDriver`] (in
//!   memory, with injected faults) and [`sdk::SdkDriver`] (an out-of-tree executable speaking
//!   driver SDK v1, newline-delimited JSON-RPC over its stdio).
//! * [`files`] keeps the spend file and the inventory of machines a driver provisioned.

pub mod docker;
pub mod fake;
pub mod files;
pub mod pool;
pub mod sdk;
pub mod service;
pub mod ssh;
pub mod static_ssh;
pub mod tunnel;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The pool's figures as the views and the state machine see them (the pool thread reports
/// them with each change).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolView {
    /// The driver specifier in use.
    pub driver: String,
    /// Whether the workflow configures a pool (a `worker.worker_pool` block or `worker.kind`).
    pub configured: bool,
    pub status: pool::Status,
}

/// The pool's own name for a machine (`w-1`, `w-2`, ...; unique per daemon start).
pub type WorkerId = String;

/// A machine as its driver describes it (the SDK's worker record, camelCase on the wire).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerRecord {
    pub worker_id: WorkerId,
    /// Where runs on it execute (`fake://worker-3`, a host name); `None` for this host.
    #[serde(default)]
    pub worker_host: Option<String>,
    #[serde(default)]
    pub driver_ref: Option<String>,
    #[serde(default)]
    pub created_at_ms: u64,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub metadata: serde_json::Value,
}

/// What a driver's machines are (static; from the SDK's `initialize`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// Runs reach the machine over SSH at `worker_host`.
    #[serde(default)]
    pub ssh_addressable: bool,
    /// Machines are disposable: destroyed when reaped, drained or past their ttl.
    #[serde(default)]
    pub ephemeral: bool,
    /// Machines outlive the daemon: provisioning is written ahead to the inventory, and a restarted
    /// daemon adopts or destroys the survivors `list` finds.
    #[serde(default)]
    pub uses_ledger: bool,
}

/// What `provision` is asked for.
#[derive(Clone, Debug)]
pub struct ProvisionRequest {
    pub worker_id: WorkerId,
    /// The issue the machine is provisioned for, when one asked.
    pub affinity_key: Option<String>,
    /// Marks the machine as this pool's (`svc-pool`, `svc-worker-id`).
    pub labels: BTreeMap<String, String>,
    pub timeout: Duration,
}

/// The driver contract. `provision` is idempotent on the worker id; `destroy` on a machine that
/// is gone is not an error. Calls block; the pool thread makes them on threads of their own
/// unless the driver is [`Driver::instant`].
pub trait Driver: Send + Sync {
    /// The driver's kind as it reports it (`local`, `fake`, or the SDK `kind`).
    fn kind(&self) -> String;
    fn capabilities(&self) -> Capabilities;
    /// Whether every call returns at once (in memory): the pool thread then calls it inline.
    fn instant(&self) -> bool {
        false
    }
    fn provision(&self, request: &ProvisionRequest) -> Result<WorkerRecord, String>;
    /// `Err` carries the reason the machine is not usable.
    fn probe(&self, worker: &WorkerRecord, timeout: Duration) -> Result<(), String>;
    fn destroy(&self, worker: &WorkerRecord, timeout: Duration, reason: &str)
    -> Result<(), String>;
    fn list(&self, timeout: Duration) -> Result<Vec<WorkerRecord>, String>;
}

/// The `local` driver: one machine, this host. Runs execute here, as without a pool.
pub struct LocalDriver;

impl Driver for LocalDriver {
    fn kind(&self) -> String {
        "local".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn instant(&self) -> bool {
        true
    }

    fn provision(&self, request: &ProvisionRequest) -> Result<WorkerRecord, String> {
        Ok(WorkerRecord {
            worker_id: request.worker_id.clone(),
            worker_host: None,
            driver_ref: None,
            created_at_ms: 0,
            labels: request.labels.clone(),
            metadata: serde_json::Value::Null,
        })
    }

    fn probe(&self, _: &WorkerRecord, _: Duration) -> Result<(), String> {
        Ok(())
    }

    fn destroy(&self, _: &WorkerRecord, _: Duration, _: &str) -> Result<(), String> {
        Ok(())
    }

    fn list(&self, _: Duration) -> Result<Vec<WorkerRecord>, String> {
        Ok(Vec::new())
    }
}

/// The label every machine of a pool carries (its value names the pool), and the one naming
/// the machine.
pub const POOL_LABEL: &str = "svc-pool";
pub const WORKER_LABEL: &str = "svc-worker-id";

/// Unix time in milliseconds (the pool's clock, read by its thread and the drivers).
pub use crate::time::unix_ms;

/// The built-in driver kinds; an exact one always wins over a same-named executable.
pub const BUILT_IN: [&str; 4] = ["local", "fake", "static-ssh", "docker"];

/// Writes `bytes` to `path` atomically (temp file, fsync, rename, fsync of the directory).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
