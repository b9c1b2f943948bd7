//! The `docker` driver against a real dockerd (Debian's docker.io, started by
//! `scripts/docker-test-image` when it is not running) and an image built on this machine from
//! Debian packages (no registry): provision, a run whose agent works over SSH and reaches MCP
//! through the tunnel, destroy, drain, and adoption of a survivor after svc is SIGKILLed. No
//! container, ssh process or tunnel is left behind. Skips with one line where docker cannot run.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::process::Command;

/// The test image's tag, or `None` (after a skip line) where docker cannot run here.
fn image() -> Option<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/docker-test-image");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.code() == Some(3) {
        eprintln!("{}", stdout.trim());
        return None;
    }
    assert!(
        out.status.success(),
        "scripts/docker-test-image failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(stdout.lines().last().unwrap_or("").trim().to_string())
}

/// Containers of the pools these tests start (label `svc-pool`, name prefix `svc-WORKFLOW`).
fn containers(pool_dir: &Path) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=svc-pool",
            "--format",
            "{{.Names}} {{.Label \"svc-pool\"}}",
        ])
        .output()
        .unwrap();
    let ours = fs::read_dir(pool_dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .strip_suffix(".lock")
                        .map(str::to_string)
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, pool)| ours.iter().any(|o| o == pool))
        .map(|(name, _)| name.to_string())
        .collect()
}

#[test]
fn docker_workers_run_the_demo_drain_and_are_adopted_after_a_crash() {
    let Some(image) = image() else { return };
    let dir = TestDir::new("docker-workers");
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    fs::write(
        board.join("BOARD-1.md"),
        "---\ntitle: In a container\nstate: Todo\n---\necho\n",
    )
    .unwrap();
    let mcp_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let wf = workflow_with_description(
        &dir,
        &format!(
            "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 300\nworkspace:\n  root: /root/ws\nagent:\n  kind: demo\n  max_turns: 2\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  mcp_port: {mcp_port}\nhooks:\n  after_create: echo \"$SSH_CONNECTION\" > /root/created-over.txt\nworker:\n  kind: box\n  worker_pool:\n    max: 1\n    warm: 1\n    drain_deadline_ms: 5000\nworkers:\n  box:\n    driver: docker\n    image: {image}\n    volumes: [\"{}:/usr/local/bin/svc:ro\"]\n",
            svc_bin()
        ),
    );
    let pool_dir = dir.join("home/.svc/daemon");
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let mut d = Daemon::start(cmd);
    let s = d.wait_for(90, "a run in a container", |s| {
        s["running"][0]["worker_host"]
            .as_str()
            .is_some_and(|h| h.starts_with("ssh://root@127.0.0.1:"))
    });
    assert_eq!(s["worker_pool"]["driver"], "docker");
    wait_until(90, "the issue done from inside the container", || {
        board_state(&dir, "BOARD-1.md") == "Done"
    });
    let running = containers(&pool_dir);
    assert_eq!(running.len(), 1, "{running:?}");
    let over = Command::new("docker")
        .args(["exec", &running[0], "cat", "/root/created-over.txt"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&over.stdout).trim().is_empty(),
        "the hook ran over SSH in the container (SSH_CONNECTION set)"
    );
    // SIGKILL: the container survives; a new daemon adopts it (max 1) and serves the next
    // issue on it.
    d.signal(libc::SIGKILL);
    d.wait_exit(10);
    assert_eq!(
        containers(&pool_dir),
        running,
        "the container outlives a killed daemon"
    );
    fs::write(
        board.join("BOARD-2.md"),
        "---\ntitle: After the crash\nstate: Todo\n---\necho\n",
    )
    .unwrap();
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let mut d = Daemon::start(cmd);
    d.wait_for(60, "the survivor adopted", |s| {
        s["recent_events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event"] == "worker_pool_worker_adopted")
    });
    wait_until(90, "the second issue done", || {
        board_state(&dir, "BOARD-2.md") == "Done"
    });
    assert_eq!(
        containers(&pool_dir),
        running,
        "the same container served it\n{}",
        d.stderr()
    );
    // A stop drains the pool: the container is removed; no ssh or tunnel is left.
    d.signal(libc::SIGTERM);
    assert_eq!(d.wait_exit(60), Some(0));
    assert!(containers(&pool_dir).is_empty(), "drained");
    let forward = format!("127.0.0.1:{mcp_port}");
    let left: Vec<String> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.starts_with("ssh ") && c.contains(&forward))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
