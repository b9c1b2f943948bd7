//! The ssh test harness (`tests/common/sshd.rs`) against itself: a real sshd on 127.0.0.1
//! reached through the client config's aliases, the `unreachable` alias refused, and nothing
//! of the sessions left once the harness is dropped.

mod common;

use common::sshd::Sshd;
use common::{TestDir, alive, dead_soon};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn harness_serves_aliases_refuses_unreachable_and_leaves_nothing() {
    let dir = TestDir::new("ssh-harness");
    // Skips (prints why) where sshd cannot run; panics instead under CI=true.
    let Some(sshd) = Sshd::start_or_skip(&dir.join("sshd"), &["w1", "w2"]) else {
        return;
    };

    // Both aliases log in to our sshd, as the current user.
    for alias in ["w1", "w2"] {
        let out = sshd.ssh(alias, "echo $SSH_CONNECTION; pwd");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "ssh {alias} failed ({}): {stderr}\nsshd log: {}",
            out.status,
            sshd.log()
        );
        let mut lines = stdout.lines();
        let connection = lines.next().unwrap_or("");
        assert!(
            !connection.is_empty() && connection.contains("127.0.0.1"),
            "SSH_CONNECTION of {alias}: {connection:?} (stdout {stdout:?})"
        );
        assert!(
            connection.ends_with(&format!("127.0.0.1 {}", sshd.port)),
            "{alias} reached another server: {connection:?}"
        );
        let pwd = lines.next().unwrap_or("");
        assert!(pwd.starts_with('/'), "pwd of {alias}: {pwd:?}");
    }

    // The unreachable alias fails the way ssh fails to connect: exit 255 and an ssh error.
    let out = sshd.ssh("unreachable", "true");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "stderr: {stderr}");
    assert!(
        stderr.contains("ssh:") && stderr.contains("Connection refused"),
        "stderr: {stderr}"
    );

    // Leave a detached remote process behind (it escapes sshd's process tree) and keep a
    // session open; dropping the harness must end both, and the client with them.
    let out = sshd.ssh(
        "w2",
        "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!",
    );
    let detached: i64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the remote shell prints the detached pid");
    assert!(alive(detached), "the detached remote sleep runs");
    let mut client = sshd
        .command("w1", "echo started; exec sleep 600")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ssh starts");
    let mut first = String::new();
    BufReader::new(client.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert_eq!(first.trim(), "started");

    let sshd_pid = sshd.pid() as i64;
    drop(sshd);
    assert!(!alive(sshd_pid), "sshd is gone");
    assert!(dead_soon(detached), "the detached remote process is gone");
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = client.kill();
            let _ = client.wait();
            panic!("the ssh client outlived the server");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
