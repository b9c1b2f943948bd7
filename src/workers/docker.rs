//! The `docker` driver, through the `docker` CLI: each machine is a container of the profile's
//! `image` running sshd, its port 22 published on a loopback port, labelled as this pool's
//! (`svc-pool`, `svc-worker-id`), reached over SSH like any host.
//!
//! * svc keeps one key pair for its containers (`<daemon dir>/docker/id_ed25519`, made with
//!   `ssh-keygen` on first use) and hands the public key to each container as the environment
//!   variable `SSH_AUTHORIZED_KEY` (the image's entrypoint writes it to the user's
//!   `authorized_keys`); the image must run sshd on port 22 and honour that variable.
//! * The container's host key is read with `docker exec` and pinned in a known_hosts file of
//!   its own, so every SSH connection to it checks the key (`StrictHostKeyChecking yes`).
//! * Machines outlive a killed daemon, so the driver keeps a ledger (`usesLedger`): `list`
//!   finds the pool's containers by label and a restarted daemon adopts or removes them.
//! * `destroy` is `docker rm -f` (a gone container is not an error).
//! * Profile options: `image` (required), `user` (default `root`), `volumes` (`-v` mounts).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Capabilities, Driver, ProvisionRequest, WorkerRecord};
use crate::process;

pub struct Docker {
    image: String,
    user: String,
    /// `volumes`: `-v` mounts for every container (`"/host/path:/in/container:ro"`).
    volumes: Vec<String>,
    /// `<daemon dir>/docker`: the key pair and the pinned host keys.
    dir: PathBuf,
}

fn docker(args: &[&str], timeout: Duration) -> Result<String, String> {
    let mut spec = process::Spec::new("docker");
    for a in args {
        spec = spec.arg(*a);
    }
    // A helper of the pool, not work: it must run while the daemon drains.
    let out =
        process::run_service(&spec, timeout).map_err(|e| format!("cannot run docker: {e}"))?;
    if out.timed_out {
        return Err(format!(
            "docker {} timed out after {} ms",
            args.first().unwrap_or(&""),
            timeout.as_millis()
        ));
    }
    if !out.success() {
        return Err(format!(
            "docker {} failed ({}): {}",
            args.first().unwrap_or(&""),
            out.describe_status(),
            out.stderr.trim().chars().take(500).collect::<String>()
        ));
    }
    Ok(out.stdout)
}

impl Docker {
    pub fn new(
        options: &serde_json::Value,
        image: Option<&str>,
        user: &str,
        dir: &Path,
    ) -> Result<Docker, String> {
        let image = image
            .map(str::to_string)
            .or_else(|| {
                options
                    .get("image")
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            })
            .ok_or("the docker driver needs image")?;
        let volumes = match options.get("volumes") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect())
                .ok_or("docker driver option volumes must be a list of strings")?,
        };
        const KNOWN: [&str; 3] = ["image", "user", "volumes"];
        if let Some(map) = options.as_object()
            && let Some(unknown) = map.keys().find(|k| !KNOWN.contains(&k.as_str()))
        {
            return Err(format!(
                "docker driver option {unknown} is not supported (supported: {})",
                KNOWN.join(", ")
            ));
        }
        Ok(Docker {
            image,
            user: user.to_string(),
            volumes,
            dir: dir.to_path_buf(),
        })
    }

    fn key(&self) -> PathBuf {
        self.dir.join("id_ed25519")
    }

    /// The key pair for containers, made on first use.
    fn public_key(&self) -> Result<String, String> {
        let key = self.key();
        if !key.exists() {
            std::fs::create_dir_all(&self.dir)
                .map_err(|e| format!("{}: {e}", self.dir.display()))?;
            let out = process::run(
                &process::Spec::new("ssh-keygen")
                    .arg("-q")
                    .arg("-t")
                    .arg("ed25519")
                    .arg("-N")
                    .arg("")
                    .arg("-C")
                    .arg("svc docker workers")
                    .arg("-f")
                    .arg(&key),
                Duration::from_secs(30),
            )
            .map_err(|e| format!("cannot run ssh-keygen: {e}"))?;
            if !out.success() {
                return Err(format!("ssh-keygen failed: {}", out.stderr.trim()));
            }
        }
        std::fs::read_to_string(key.with_extension("pub"))
            .map(|k| k.trim().to_string())
            .map_err(|e| format!("{}: {e}", key.display()))
    }

    fn name(worker_id: &str, labels: &BTreeMap<String, String>) -> String {
        let pool = labels.get(super::POOL_LABEL).map_or("svc", String::as_str);
        let clean: String = format!("svc-{pool}-{worker_id}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        clean
    }

    /// The record of a running container: its published port, its pinned host key, and the
    /// ssh options that use both.
    fn record(
        &self,
        container: &str,
        worker_id: &str,
        labels: BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<WorkerRecord, String> {
        let port_line = docker(&["port", container, "22/tcp"], timeout)?;
        let port = port_line
            .lines()
            .filter_map(|l| l.trim().rsplit_once(':'))
            .find(|(addr, _)| addr.starts_with("127.0.0.1"))
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .ok_or_else(|| {
                format!("container {container} publishes no loopback port for 22: {port_line:?}")
            })?;
        // The host key, pinned for this container (sshd may still be generating it).
        let mut host_key = String::new();
        for _ in 0..50 {
            if let Ok(k) = docker(
                &[
                    "exec",
                    container,
                    "sh",
                    "-c",
                    "cat /etc/ssh/ssh_host_ed25519_key.pub",
                ],
                timeout,
            ) && !k.trim().is_empty()
            {
                host_key = k.trim().to_string();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if host_key.is_empty() {
            return Err(format!(
                "container {container} has no ed25519 host key (is sshd in the image?)"
            ));
        }
        // Per container (unique across pools and restarts), never per worker id.
        let known = self.dir.join(format!("known_hosts-{container}"));
        let line = format!("[127.0.0.1]:{port} {host_key}\n");
        super::write_atomic(&known, line.as_bytes())
            .map_err(|e| format!("{}: {e}", known.display()))?;
        let options = vec![
            "-i".to_string(),
            self.key().display().to_string(),
            "-o".to_string(),
            "IdentitiesOnly=yes".to_string(),
            "-o".to_string(),
            format!("UserKnownHostsFile={}", known.display()),
            "-o".to_string(),
            "StrictHostKeyChecking=yes".to_string(),
        ];
        Ok(WorkerRecord {
            worker_id: worker_id.to_string(),
            worker_host: Some(format!("ssh://{}@127.0.0.1:{port}", self.user)),
            driver_ref: Some(container.to_string()),
            created_at_ms: super::unix_ms(),
            labels,
            metadata: serde_json::json!({"sshOptions": options, "container": container}),
        })
    }
}

impl Driver for Docker {
    fn kind(&self) -> String {
        "docker".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ssh_addressable: true,
            ephemeral: true,
            uses_ledger: true,
        }
    }

    fn provision(&self, r: &ProvisionRequest) -> Result<WorkerRecord, String> {
        let name = Docker::name(&r.worker_id, &r.labels);
        // Idempotent on the worker id: a container of that name is reused.
        let exists = docker(&["inspect", "-f", "{{.State.Running}}", &name], r.timeout);
        if !matches!(exists.as_deref().map(str::trim), Ok("true")) {
            if exists.is_ok() {
                let _ = docker(&["rm", "-f", &name], r.timeout);
            }
            let key = format!("SSH_AUTHORIZED_KEY={}", self.public_key()?);
            let mut args: Vec<String> = [
                "run",
                "-d",
                "--name",
                &name,
                "-e",
                &key,
                "-p",
                "127.0.0.1::22",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            for (k, v) in &r.labels {
                args.push("--label".into());
                args.push(format!("{k}={v}"));
            }
            for v in &self.volumes {
                args.push("-v".into());
                args.push(v.clone());
            }
            args.push(self.image.clone());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            docker(&args, r.timeout)?;
        }
        self.record(&name, &r.worker_id, r.labels.clone(), r.timeout)
            .inspect_err(|_| {
                let _ = docker(&["rm", "-f", &name], r.timeout);
            })
    }

    fn probe(&self, worker: &WorkerRecord, timeout: Duration) -> Result<(), String> {
        let container = worker
            .driver_ref
            .as_deref()
            .ok_or("a docker machine without a container")?;
        let running = docker(&["inspect", "-f", "{{.State.Running}}", container], timeout)?;
        if running.trim() != "true" {
            return Err(format!("container {container} is not running"));
        }
        let host = worker.worker_host.clone().ok_or("no host")?;
        let target = super::ssh::Target {
            host,
            config: None,
            timeout,
            options: super::ssh::options_of(&worker.metadata),
        };
        let out = super::ssh::run(&target, "true", timeout)?;
        if out.ok {
            Ok(())
        } else {
            Err(format!("ssh into {container} failed ({})", out.status))
        }
    }

    fn destroy(&self, worker: &WorkerRecord, timeout: Duration, _: &str) -> Result<(), String> {
        let container = worker
            .driver_ref
            .as_deref()
            .ok_or("a docker machine without a container")?;
        match docker(&["rm", "-f", container], timeout) {
            Ok(_) => {}
            Err(e) if e.contains("No such container") => {}
            Err(e) => return Err(e),
        }
        let _ = std::fs::remove_file(self.dir.join(format!("known_hosts-{container}")));
        Ok(())
    }

    fn list(&self, timeout: Duration) -> Result<Vec<WorkerRecord>, String> {
        let out = docker(
            &[
                "ps",
                "--filter",
                &format!("label={}", super::POOL_LABEL),
                "--format",
                "{{.Names}}",
            ],
            timeout,
        )?;
        let mut records = Vec::new();
        for name in out.lines().map(str::trim).filter(|n| !n.is_empty()) {
            let labels_json = docker(&["inspect", "-f", "{{json .Config.Labels}}", name], timeout)?;
            let labels: BTreeMap<String, String> =
                serde_json::from_str(labels_json.trim()).unwrap_or_default();
            let Some(worker_id) = labels.get(super::WORKER_LABEL).cloned() else {
                continue;
            };
            match self.record(name, &worker_id, labels, timeout) {
                Ok(r) => records.push(r),
                Err(e) => log::warn!("docker worker {name}: {e}"),
            }
        }
        Ok(records)
    }
}
