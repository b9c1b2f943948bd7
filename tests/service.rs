//! svc as a service: the systemd notify protocol against a test datagram socket, the shipped
//! unit file (checked by `systemd-analyze verify` and its command run as systemd would), and the
//! log file reopened on SIGHUP for logrotate.

mod common;

use common::*;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

/// A notify socket: what the service manager would listen on.
fn notify_socket(dir: &TestDir) -> (UnixDatagram, std::path::PathBuf) {
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    (socket, path)
}

/// Waits for a datagram holding `line` (each datagram may hold several lines).
fn wait_notify(socket: &UnixDatagram, line: &str, secs: u64) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let found = text.lines().any(|l| l == line);
            seen.push(text);
            if found {
                return seen;
            }
        }
    }
    panic!("no {line} from svc within {secs} s; got {seen:?}");
}

#[test]
fn ready_once_serving_watchdog_while_alive_and_stopping_on_sigterm() {
    let dir = TestDir::new("notify");
    let (socket, path) = notify_socket(&dir);
    let wf = workflow_with_description(&dir, &demo_memory(""));
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_MEMORY_TRACKER_ISSUES_JSON", "[]")
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "400000");
    let mut d = Daemon::start(cmd);
    wait_notify(&socket, "READY=1", 20);
    // Ready means answering: the first request after it gets its 200.
    let s = d.wait_for(10, "a snapshot", |_| true);
    let base = s["daemon"]["endpoint"]["address"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(http("GET", &format!("{base}/health"), &[], None).0, 200);
    wait_notify(&socket, "WATCHDOG=1", 5);
    wait_notify(&socket, "WATCHDOG=1", 5);
    d.signal(libc::SIGTERM);
    wait_notify(&socket, "STOPPING=1", 10);
    assert_eq!(d.wait_exit(15), Some(0));
}

#[test]
fn an_abstract_notify_socket_is_reached_too() {
    use std::os::linux::net::SocketAddrExt;
    let dir = TestDir::new("notify-abstract");
    let name = format!("svc-test-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let socket = UnixDatagram::bind_addr(&addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let wf = workflow_with_description(&dir, &demo_memory(""));
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_MEMORY_TRACKER_ISSUES_JSON", "[]")
        .env("NOTIFY_SOCKET", format!("@{name}"));
    let _d = Daemon::start(cmd);
    wait_notify(&socket, "READY=1", 20);
}

/// The unit's `Key=value` lines of one key.
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

#[test]
fn the_shipped_unit_is_valid_and_its_command_starts_svc_as_a_notify_service() {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/svc.service"),
    )
    .unwrap();
    assert_eq!(unit_values(&unit, "Type"), ["notify"]);
    for hardening in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
    ] {
        assert!(unit.lines().any(|l| l == hardening), "{hardening}");
    }
    assert!(unit_values(&unit, "User").iter().all(|u| *u != "root"));
    let dir = TestDir::new("unit");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    // The unit as it would be installed here: this build's binary, this test's state directory.
    let local = unit
        .replace("/usr/bin/svc", svc_bin())
        .replace("/etc/svc/WORKFLOW.md", "/var/lib/svc/WORKFLOW.md")
        .replace("/var/lib/svc", &state.display().to_string());
    let unit_path = dir.write("svc.service", &local);
    if std::path::Path::new("/usr/bin/systemd-analyze").exists() {
        let out = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(&unit_path)
            .output()
            .unwrap();
        let complaints = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && complaints.trim().is_empty(),
            "systemd-analyze verify: {complaints}"
        );
    } else {
        eprintln!("systemd-analyze is not installed; the unit's syntax is not verified here");
    }
    // ExecStart with the unit's environment, as systemd would run it.
    std::fs::write(
        state.join("WORKFLOW.md"),
        format!(
            "---\n{}\n---\nWork on {{{{ issue.identifier }}}}.\n",
            demo_memory("")
        ),
    )
    .unwrap();
    let exec = unit_values(&local, "ExecStart")[0];
    let mut words = exec.split_whitespace();
    let mut cmd = std::process::Command::new(words.next().unwrap());
    cmd.args(words).env_clear().env("PATH", "/usr/bin:/bin");
    for assignment in unit_values(&local, "Environment") {
        let (k, v) = assignment.split_once('=').unwrap();
        cmd.env(k, v);
    }
    let working = unit_values(&local, "WorkingDirectory")[0];
    let (socket, path) = notify_socket(&dir);
    cmd.current_dir(working)
        .env("NOTIFY_SOCKET", &path)
        .env("SVC_MEMORY_TRACKER_ISSUES_JSON", "[]");
    let mut d = Daemon::start(cmd);
    wait_notify(&socket, "READY=1", 20);
    // Its state went where the unit lets it write: under the state directory.
    assert!(state.join(".svc/daemon").is_dir());
    d.signal(libc::SIGTERM);
    wait_notify(&socket, "STOPPING=1", 10);
    assert_eq!(d.wait_exit(15), Some(0));
}

#[test]
fn sighup_reopens_a_log_file_that_logrotate_moved() {
    let dir = TestDir::new("sighup");
    let wf = workflow_with_description(&dir, &demo_memory(""));
    let logs = dir.join("logs");
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg("--logs-root")
        .arg(&logs)
        .arg(&wf)
        .env("SVC_MEMORY_TRACKER_ISSUES_JSON", "[]");
    let d = Daemon::start(cmd);
    let log = logs.join("log/svc.log");
    wait_until(20, "the log file written", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("started"))
    });
    // The daemon takes signals from its signal thread on (a start-up stage after "started"
    // is logged); its first snapshot comes after that stage.
    d.wait_for(20, "the first snapshot", |_| true);
    let rotated = logs.join("log/svc.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    d.signal(libc::SIGHUP);
    wait_until(10, "a new log file", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("SIGHUP: log file reopened"))
    });
    assert!(
        !std::fs::read_to_string(&rotated)
            .unwrap()
            .contains("SIGHUP"),
        "the rotated file gets nothing after the reopen"
    );
    // SIGHUP does not stop svc.
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(d.child.id() as i64));
}
