//! Reverse tunnels: how agents on a remote worker reach svc's MCP listener. One `ssh -N -R`
//! per worker host, shared by every run on it (reference-counted), capped by
//! `worker_pool.max_concurrent_tunnels`, torn down with its last run, and restarted on the same
//! remote port if it dies while runs still need it.
//!
//! The remote side binds loopback only (`-R 127.0.0.1:0:127.0.0.1:<port>`); the port is the one
//! sshd allocates, read from ssh's own "Allocated port" line.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, select, unbounded};

use super::ssh::{self, Target};
use crate::process;

/// Waits between restarts of a tunnel that keeps dying.
const RESTART_BACKOFF: Duration = Duration::from_secs(1);

struct Entry {
    refs: usize,
    remote_port: u16,
    stop: Sender<()>,
}

#[derive(Default)]
pub struct Tunnels {
    entries: Mutex<HashMap<String, Entry>>,
}

/// A run's use of its host's tunnel; dropping it releases the reference.
pub struct TunnelLease {
    host: String,
    pub remote_port: u16,
    tunnels: Arc<Tunnels>,
}

impl Drop for TunnelLease {
    fn drop(&mut self) {
        let mut entries = self
            .tunnels
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.get_mut(&self.host) {
            e.refs = e.refs.saturating_sub(1);
            if e.refs == 0 {
                let _ = e.stop.send(());
                entries.remove(&self.host);
            }
        }
    }
}

impl Tunnels {
    /// How many tunnels are up (or starting).
    pub fn count(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A reference to the tunnel of `target`'s host towards `local_port`, starting it when
    /// there is none (at most `cap` tunnels at once).
    pub fn acquire(
        self: &Arc<Self>,
        target: &Target,
        local_port: u16,
        cap: Option<u64>,
    ) -> Result<TunnelLease, String> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.get_mut(&target.host) {
            e.refs += 1;
            return Ok(TunnelLease {
                host: target.host.clone(),
                remote_port: e.remote_port,
                tunnels: Arc::clone(self),
            });
        }
        if let Some(cap) = cap
            && entries.len() as u64 >= cap
        {
            return Err(format!(
                "worker_pool.max_concurrent_tunnels ({cap}) reached: no tunnel for {}",
                target.host
            ));
        }
        // Started under the lock: a second run on the host waits and shares it.
        let (ready_tx, ready_rx) = bounded(1);
        let (stop_tx, stop_rx) = bounded(1);
        let t = target.clone();
        std::thread::Builder::new()
            .name(format!("tunnel-{}", target.host))
            .spawn(move || keep_tunnel(t, local_port, ready_tx, stop_rx))
            .map_err(|e| format!("cannot start a tunnel thread: {e}"))?;
        let remote_port = ready_rx
            .recv()
            .unwrap_or_else(|_| Err("the tunnel thread ended".into()))?;
        log::info!(
            "tunnel to {} up: its 127.0.0.1:{remote_port} reaches svc's 127.0.0.1:{local_port}",
            target.host
        );
        entries.insert(
            target.host.clone(),
            Entry {
                refs: 1,
                remote_port,
                stop: stop_tx,
            },
        );
        Ok(TunnelLease {
            host: target.host.clone(),
            remote_port,
            tunnels: Arc::clone(self),
        })
    }
}

/// A running `ssh -N -R` and the lines of its stderr.
struct Running {
    child: process::Piped,
    lines: Receiver<String>,
}

fn start(target: &Target, remote_port: u16, local_port: u16) -> Result<Running, String> {
    let forward = format!("127.0.0.1:{remote_port}:127.0.0.1:{local_port}");
    let spec = ssh::spec(
        target,
        &[
            "-N",
            "-o",
            "ExitOnForwardFailure=yes",
            "-o",
            "ServerAliveInterval=10",
            "-o",
            "ServerAliveCountMax=3",
            // The "Allocated port" line is an INFO message; this wins over the config's level.
            "-o",
            "LogLevel=INFO",
            "-R",
            &forward,
        ],
        "",
    );
    // `ssh -N` takes no command: drop the empty one `spec` put last.
    let mut spec = spec;
    spec.args.pop();
    let mut child = process::spawn_piped(&spec).map_err(|e| format!("cannot start ssh: {e}"))?;
    let stderr = child.child.stderr.take().ok_or("no stderr")?;
    let (tx, lines) = unbounded();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    Ok(Running { child, lines })
}

/// Waits for the forward: the allocated port (asked for 0) or the process staying up (a fixed
/// port); `Err` carries ssh's words.
fn wait_ready(run: &mut Running, asked: u16, limit: Duration) -> Result<u16, String> {
    let deadline = Instant::now() + limit;
    let mut said = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // A fixed port gives no message: up for a second means the forward held.
        let wait = if asked == 0 {
            left
        } else {
            left.min(Duration::from_secs(1))
        };
        match run.lines.recv_timeout(wait) {
            Ok(line) => {
                if let Some(port) = line
                    .split("Allocated port ")
                    .nth(1)
                    .and_then(|rest| rest.split_whitespace().next())
                    .and_then(|p| p.parse::<u16>().ok())
                {
                    return Ok(port);
                }
                said.push(line);
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) if asked != 0 => {
                if run.child.child.try_wait().ok().flatten().is_none() {
                    return Ok(asked);
                }
            }
            Err(_) => {
                return Err(format!(
                    "the tunnel did not come up: {}",
                    if said.is_empty() {
                        "no answer from ssh".to_string()
                    } else {
                        said.join("; ")
                    }
                ));
            }
        }
        if Instant::now() >= deadline {
            return Err("the tunnel did not come up in time".into());
        }
    }
}

/// The tunnel thread: starts the tunnel, reports its remote port, and keeps it up (on the same
/// port) until told to stop.
fn keep_tunnel(
    target: Target,
    local_port: u16,
    ready: Sender<Result<u16, String>>,
    stop: Receiver<()>,
) {
    let mut run = match start(&target, 0, local_port) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(format!("ssh {}: {e}", target.host)));
            return;
        }
    };
    let port = match wait_ready(&mut run, 0, target.timeout) {
        Ok(p) => p,
        Err(e) => {
            run.child.terminate(Duration::from_millis(500));
            let _ = ready.send(Err(format!("ssh {}: {e}", target.host)));
            return;
        }
    };
    let _ = ready.send(Ok(port));
    loop {
        select! {
            recv(stop) -> _ => {
                run.child.terminate(Duration::from_millis(500));
                return;
            }
            default(Duration::from_millis(200)) => {
                if run.child.child.try_wait().ok().flatten().is_none() {
                    continue;
                }
                log::warn!("tunnel to {} died; restarting it on port {port}", target.host);
                // The runs hold this port in their MCP URL: come back on it.
                loop {
                    if stop.recv_timeout(RESTART_BACKOFF).is_ok() {
                        return;
                    }
                    match start(&target, port, local_port) {
                        Ok(mut r) => match wait_ready(&mut r, port, target.timeout) {
                            Ok(_) => {
                                run = r;
                                log::info!("tunnel to {} restored on port {port}", target.host);
                                break;
                            }
                            Err(e) => {
                                r.child.terminate(Duration::from_millis(500));
                                log::warn!("tunnel to {}: {e}", target.host);
                            }
                        },
                        Err(e) => log::warn!("tunnel to {}: {e}", target.host),
                    }
                }
            }
        }
    }
}
