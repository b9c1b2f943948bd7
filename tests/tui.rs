//! The terminal dashboard driven in tmux: a real terminal, keys sent with send-keys, the screen
//! read with capture-pane, and `q` stopping the daemon gracefully.

mod common;

use common::*;
use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs (scripts/test installs it)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.cmd(&["capture-pane", "-p", "-t", "svc"])
    }

    fn wait_screen(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.cmd(&["kill-server"]);
    }
}

#[test]
fn the_terminal_dashboard_shows_lanes_opens_details_and_quits() {
    let dir = TestDir::new("tui");
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    fs::write(
        board.join("BOARD-1.md"),
        "---\ntitle: Terminal issue\nstate: Todo\n---\ndemo: keep-open\ndemo: slow 60000\n",
    )
    .unwrap();
    fs::create_dir_all(dir.join("home")).unwrap();
    let wf = workflow_with_description(
        &dir,
        "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 300\nworkspace:\n  root: ws\nagent:\n  kind: demo\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n",
    );
    let tmux = Tmux {
        socket: format!("svc-test-{}", std::process::id()),
    };
    tmux.cmd(&["new-session", "-d", "-s", "svc", "-x", "120", "-y", "30"]);
    tmux.cmd(&["set-option", "-t", "svc", "remain-on-exit", "on"]);
    let status_file = dir.join("exit-status");
    let command = format!(
        "env -i HOME={} PATH=/usr/bin:/bin TERM=xterm-256color {} {}; echo $? > {}",
        dir.join("home").display(),
        svc_bin(),
        wf.display(),
        status_file.display()
    );
    tmux.cmd(&[
        "respawn-pane",
        "-k",
        "-t",
        "svc",
        "-c",
        &dir.path.display().to_string(),
        &command,
    ]);
    let screen = tmux.wait_screen("the run lane", |s| {
        s.lines()
            .any(|l| l.starts_with("1  run") && l.contains("BOARD-1"))
    });
    assert!(screen.contains("tok/s (5 s)"), "{screen}");
    assert!(screen.contains("q quit"), "{screen}");
    assert!(
        !screen.contains("INFO"),
        "log lines must not reach the dashboard:\n{screen}"
    );
    tmux.cmd(&["send-keys", "-t", "svc", "1"]);
    let screen = tmux.wait_screen("the detail card", |s| {
        s.contains("last message") && s.contains("(esc)")
    });
    assert!(screen.contains("Terminal issue"), "{screen}");
    tmux.cmd(&["send-keys", "-t", "svc", "Escape"]);
    tmux.wait_screen("the card closed", |s| !s.contains("(esc)"));
    tmux.cmd(&["send-keys", "-t", "svc", "q"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(status) = fs::read_to_string(&status_file) {
            assert_eq!(status.trim(), "0", "q stops svc gracefully with status 0");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "svc did not stop after q; screen:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The terminal was restored: the main screen is back, without the dashboard.
    assert!(!tmux.screen().contains("q quit"));
    let log = fs::read_to_string(dir.join("home/.svc/log/svc.log")).unwrap();
    assert!(log.contains("svc stopped"), "{log}");
}
