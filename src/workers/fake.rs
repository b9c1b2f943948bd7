//! The `fake` driver: machines that exist only in memory (hosts `fake://worker-<id>`; runs on
//! them execute on this host). It is the reference implementation of the driver contract, and
//! lets tests inject failures through its profile options:
//!
//! | option | effect |
//! |---|---|
//! | `fail_provision: N` | the first N `provision` calls fail |
//! | `fail_probe: N` | the first N `probe` calls report the machine unusable |
//! | `fail_destroy: N` | the first N `destroy` calls fail (the machine stays) |
//! | `provision_delay_ms: N` | each `provision` takes this long |

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use super::{Capabilities, Driver, ProvisionRequest, WorkerRecord};

#[derive(Default)]
struct Faults {
    provision: u64,
    probe: u64,
    destroy: u64,
}

pub struct FakeDriver {
    machines: Mutex<BTreeMap<String, WorkerRecord>>,
    faults: Mutex<Faults>,
    provision_delay: Duration,
}

/// A counter option of the profile; anything but a non-negative integer is an error.
fn count(options: &serde_json::Value, key: &str) -> Result<u64, String> {
    match options.get(key) {
        None | Some(serde_json::Value::Null) => Ok(0),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("fake driver option {key} must be a non-negative integer")),
    }
}

impl FakeDriver {
    /// A fake driver configured by a profile's options (the keys other than `driver`).
    pub fn new(options: &serde_json::Value) -> Result<FakeDriver, String> {
        const KNOWN: [&str; 4] = [
            "fail_provision",
            "fail_probe",
            "fail_destroy",
            "provision_delay_ms",
        ];
        if let Some(map) = options.as_object()
            && let Some(unknown) = map.keys().find(|k| !KNOWN.contains(&k.as_str()))
        {
            return Err(format!(
                "fake driver option {unknown} is not supported (supported: {})",
                KNOWN.join(", ")
            ));
        }
        Ok(FakeDriver {
            machines: Mutex::default(),
            faults: Mutex::new(Faults {
                provision: count(options, "fail_provision")?,
                probe: count(options, "fail_probe")?,
                destroy: count(options, "fail_destroy")?,
            }),
            provision_delay: Duration::from_millis(count(options, "provision_delay_ms")?),
        })
    }

    /// Takes one injected failure of a kind, if any are left.
    fn inject(&self, pick: impl FnOnce(&mut Faults) -> &mut u64) -> bool {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let left = pick(&mut faults);
        if *left > 0 {
            *left -= 1;
            true
        } else {
            false
        }
    }
}

impl Driver for FakeDriver {
    fn kind(&self) -> String {
        "fake".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ssh_addressable: false,
            ephemeral: true,
            uses_ledger: false,
        }
    }

    fn instant(&self) -> bool {
        self.provision_delay.is_zero()
    }

    fn provision(&self, request: &ProvisionRequest) -> Result<WorkerRecord, String> {
        if !self.provision_delay.is_zero() {
            std::thread::sleep(self.provision_delay.min(request.timeout));
        }
        if self.inject(|f| &mut f.provision) {
            return Err("injected provision failure".into());
        }
        let mut machines = self.machines.lock().unwrap_or_else(|p| p.into_inner());
        let record = machines
            .entry(request.worker_id.clone())
            .or_insert_with(|| WorkerRecord {
                worker_id: request.worker_id.clone(),
                worker_host: Some(format!("fake://worker-{}", request.worker_id)),
                driver_ref: Some(format!("fake-{}", request.worker_id)),
                created_at_ms: super::unix_ms(),
                labels: request.labels.clone(),
                metadata: serde_json::Value::Null,
            });
        Ok(record.clone())
    }

    fn probe(&self, worker: &WorkerRecord, _: Duration) -> Result<(), String> {
        if self.inject(|f| &mut f.probe) {
            return Err("injected probe failure".into());
        }
        let machines = self.machines.lock().unwrap_or_else(|p| p.into_inner());
        if machines.contains_key(&worker.worker_id) {
            Ok(())
        } else {
            Err(format!("fake machine {} does not exist", worker.worker_id))
        }
    }

    fn destroy(&self, worker: &WorkerRecord, _: Duration, _: &str) -> Result<(), String> {
        if self.inject(|f| &mut f.destroy) {
            return Err("injected destroy failure".into());
        }
        self.machines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&worker.worker_id);
        Ok(())
    }

    fn list(&self, _: Duration) -> Result<Vec<WorkerRecord>, String> {
        Ok(self
            .machines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str) -> ProvisionRequest {
        ProvisionRequest {
            worker_id: id.into(),
            affinity_key: None,
            labels: BTreeMap::new(),
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn keeps_the_driver_contract_and_injects_faults() {
        let d =
            FakeDriver::new(&serde_json::json!({"fail_provision": 1, "fail_destroy": 1})).unwrap();
        assert!(d.provision(&request("w-1")).is_err());
        let first = d.provision(&request("w-1")).unwrap();
        // Idempotent on the worker id.
        assert_eq!(d.provision(&request("w-1")).unwrap(), first);
        assert_eq!(first.worker_host.as_deref(), Some("fake://worker-w-1"));
        assert!(d.probe(&first, Duration::ZERO).is_ok());
        assert!(d.destroy(&first, Duration::ZERO, "test").is_err());
        assert_eq!(d.list(Duration::ZERO).unwrap().len(), 1);
        d.destroy(&first, Duration::ZERO, "test").unwrap();
        // Destroying a gone machine is not an error; probing it fails.
        d.destroy(&first, Duration::ZERO, "test").unwrap();
        assert!(d.probe(&first, Duration::ZERO).is_err());
        assert!(FakeDriver::new(&serde_json::json!({"fail_everything": 1})).is_err());
    }
}
