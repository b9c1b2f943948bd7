//! The `static-ssh` driver: a fixed list of hosts reached over SSH (a `workers.<name>` profile's
//! `ssh_hosts`, or the legacy `worker.ssh_hosts`). Provisioning hands out a host no other
//! machine of the pool has; probing runs `true` on it over SSH; destroying only gives the host
//! back (a static host is never destroyed); `list` is empty (nothing outlives the daemon).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use super::ssh::{self, Target};
use super::{Capabilities, Driver, ProvisionRequest, WorkerRecord};

pub struct StaticSsh {
    hosts: Vec<String>,
    config: Option<PathBuf>,
    /// `worker.ssh_timeout_ms`: a probe gets no longer.
    ssh_timeout: Duration,
    /// worker id -> host
    taken: Mutex<BTreeMap<String, String>>,
}

impl StaticSsh {
    /// The hosts of the driver's options (`ssh_hosts`).
    pub fn hosts_of(options: &serde_json::Value) -> Vec<String> {
        options
            .get("ssh_hosts")
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|h| h.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn new(
        options: &serde_json::Value,
        config: Option<PathBuf>,
        ssh_timeout: Duration,
    ) -> Result<StaticSsh, String> {
        let hosts = StaticSsh::hosts_of(options);
        if hosts.is_empty() {
            return Err("the static-ssh driver needs ssh_hosts".into());
        }
        Ok(StaticSsh {
            hosts,
            config,
            ssh_timeout,
            taken: Mutex::default(),
        })
    }

    fn target(&self, host: &str, timeout: Duration) -> Target {
        Target {
            host: host.to_string(),
            config: self.config.clone(),
            timeout,
            options: Vec::new(),
        }
    }
}

impl Driver for StaticSsh {
    fn kind(&self) -> String {
        "static-ssh".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ssh_addressable: true,
            ephemeral: false,
            uses_ledger: false,
        }
    }

    fn provision(&self, request: &ProvisionRequest) -> Result<WorkerRecord, String> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let host = match taken.get(&request.worker_id) {
            Some(h) => h.clone(),
            None => {
                let free = self
                    .hosts
                    .iter()
                    .find(|h| !taken.values().any(|t| t == *h))
                    .ok_or_else(|| {
                        format!(
                            "every one of the {} static hosts is in use",
                            self.hosts.len()
                        )
                    })?
                    .clone();
                taken.insert(request.worker_id.clone(), free.clone());
                free
            }
        };
        Ok(WorkerRecord {
            worker_id: request.worker_id.clone(),
            worker_host: Some(host.clone()),
            driver_ref: Some(host),
            created_at_ms: super::unix_ms(),
            labels: request.labels.clone(),
            metadata: serde_json::Value::Null,
        })
    }

    fn probe(&self, worker: &WorkerRecord, timeout: Duration) -> Result<(), String> {
        let timeout = timeout.min(self.ssh_timeout);
        let host = worker
            .worker_host
            .as_deref()
            .ok_or("a static-ssh machine without a host")?;
        let out = ssh::run(&self.target(host, timeout), "true", timeout)?;
        if out.ok {
            Ok(())
        } else if out.timed_out {
            Err(format!(
                "ssh {host}: no answer within {} ms",
                timeout.as_millis()
            ))
        } else {
            Err(format!("ssh {host}: `true` failed ({})", out.status))
        }
    }

    fn destroy(&self, worker: &WorkerRecord, _: Duration, _: &str) -> Result<(), String> {
        // A static host is never destroyed: it is only given back.
        self.taken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&worker.worker_id);
        Ok(())
    }

    fn list(&self, _: Duration) -> Result<Vec<WorkerRecord>, String> {
        Ok(Vec::new())
    }
}
