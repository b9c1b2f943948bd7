//! The terminal dashboard driven in tmux: a real terminal, keys sent with send-keys, the screen
//! read with capture-pane, and `q` stopping the daemon gracefully.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Tmux {
    socket: String,
}

impl Tmux {
    /// A tmux server of its own (killed on drop) running `svc <args>` in `dir` in a pane of
    /// 120 columns and `height` lines, with a clean environment. The pane stays after svc
    /// exits, and svc's exit status is written to the returned file.
    fn start_svc(dir: &TestDir, height: u16, args: &[&str]) -> (Tmux, PathBuf) {
        // One tmux server per test: tests in this file run in parallel.
        static SERVERS: AtomicUsize = AtomicUsize::new(0);
        fs::create_dir_all(dir.join("home")).unwrap();
        let tmux = Tmux {
            socket: format!(
                "svc-test-{}-{}",
                std::process::id(),
                SERVERS.fetch_add(1, Ordering::Relaxed)
            ),
        };
        let height = height.to_string();
        tmux.cmd(&["new-session", "-d", "-s", "svc", "-x", "120", "-y", &height]);
        tmux.cmd(&["set-option", "-t", "svc", "remain-on-exit", "on"]);
        let status_file = dir.join("exit-status");
        let command = format!(
            "env -i HOME={} PATH=/usr/bin:/bin TERM=xterm-256color {} {}; echo $? > {}",
            dir.join("home").display(),
            svc_bin(),
            args.join(" "),
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
        (tmux, status_file)
    }

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
        self.wait_screen_within(what, Duration::from_secs(20), pred)
    }

    /// Polls the pane until `pred` holds; the limit is only there so a broken dashboard fails
    /// the test instead of hanging it.
    fn wait_screen_within(
        &self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + limit;
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

    /// Presses `q` and waits for svc to exit with status 0 and give the terminal back.
    fn quit_gracefully(&self, status_file: &Path) {
        self.cmd(&["send-keys", "-t", "svc", "q"]);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(status) = fs::read_to_string(status_file) {
                assert_eq!(status.trim(), "0", "q stops svc gracefully with status 0");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "svc did not stop after q; screen:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The terminal was restored: the main screen is back, without the dashboard.
        assert!(!self.screen().contains("q quit"));
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
    let wf = board_workflow(
        &dir,
        &[
            (
                "BOARD-1.md",
                "---\ntitle: Terminal issue\nstate: Todo\n---\ndemo: keep-open\ndemo: slow 60000\n",
            ),
            (
                "BOARD-2.md",
                "---\ntitle: Waits for the first\nstate: Todo\nblocked_by: [BOARD-1]\n---\n",
            ),
        ],
        "polling:\n  interval_ms: 300\nagent:\n  kind: demo\n",
    );
    let (tmux, status_file) = Tmux::start_svc(&dir, 30, &[&wf.display().to_string()]);
    let screen = tmux.wait_screen("the run lane", |s| {
        s.lines()
            .any(|l| l.starts_with("1  run") && l.contains("BOARD-1"))
    });
    assert!(screen.contains("tok/s (5 s)"), "{screen}");
    assert!(screen.contains("q quit"), "{screen}");
    // The issue waiting for its blocker has a lane of its own, apart from `block`.
    let screen = tmux.wait_screen("the wait lane", |s| {
        s.lines()
            .any(|l| l.starts_with("2  wait") && l.contains("BOARD-2"))
    });
    assert!(
        screen.contains("blocked by BOARD-1 (Todo)") && screen.contains("block 0 · wait 1"),
        "{screen}"
    );
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
    tmux.quit_gracefully(&status_file);
    let log = fs::read_to_string(dir.join("home/.svc/log/svc.log")).unwrap();
    assert!(log.contains("svc stopped"), "{log}");
}

/// The index of the first line of `screen` containing every one of `parts`.
fn line_with(screen: &str, parts: &[&str]) -> Option<usize> {
    screen
        .lines()
        .position(|l| parts.iter().all(|p| l.contains(p)))
}

#[test]
fn after_the_shipped_demo_the_dashboard_shows_the_recent_runs_and_events() {
    // What `scripts/demo` does the first time: the shipped WORKFLOW.md, its board seeded with
    // the sample issues of assets/demo-board. The issues are read from there, so the test
    // follows the shipped board when it changes.
    let dir = TestDir::new("tui-demo");
    fs::copy(shipped_workflow(), dir.join("WORKFLOW.md")).unwrap();
    let board = dir.join(".svc/local");
    fs::create_dir_all(&board).unwrap();
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo-board");
    let mut identifiers = Vec::new();
    for entry in fs::read_dir(&samples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            fs::copy(&path, board.join(path.file_name().unwrap())).unwrap();
            identifiers.push(path.file_stem().unwrap().to_string_lossy().into_owned());
        }
    }
    identifiers.sort();
    assert!(
        !identifiers.is_empty(),
        "assets/demo-board has sample issues"
    );
    // `--port 0` as in `scripts/demo --port 0`: the shipped port 4040 may be taken on this
    // machine, and the demo agent only needs some port for its MCP tools.
    let (tmux, status_file) = Tmux::start_svc(&dir, 40, &["--port", "0", "WORKFLOW.md"]);
    // The demo is over when every sample issue has a successful run and nothing is left
    // running, retrying or blocked. Only a dashboard with a recent-runs table shows both.
    let screen = tmux.wait_screen_within(
        "the demo's finished runs in the recent-runs table",
        Duration::from_secs(120),
        |s| {
            s.contains("Nothing running, retrying or blocked.")
                && identifiers
                    .iter()
                    .all(|id| line_with(s, &["success", id]).is_some())
        },
    );
    let runs_title = line_with(&screen, &["Recent runs"]).expect("the runs panel");
    let events_title = line_with(&screen, &["Recent events"]).expect("the events panel");
    assert!(runs_title < events_title, "{screen}");
    assert!(
        line_with(
            &screen,
            &["outcome", "issue", "agent", "turns", "tokens", "duration"]
        ) == Some(runs_title + 1),
        "{screen}"
    );
    for id in &identifiers {
        let row = line_with(&screen, &["success", id, "demo"]).unwrap();
        assert!(
            runs_title < row && row < events_title,
            "{id}'s run is in the recent-runs table:\n{screen}"
        );
        // The demo agent reports token usage and each run takes at least one turn.
        let cells: Vec<&str> = screen
            .lines()
            .nth(row)
            .unwrap()
            .split_whitespace()
            .collect();
        assert!(
            matches!(&cells[..], [_, _, _, turns, tokens, duration]
                if turns.parse::<u32>().is_ok_and(|t| t > 0)
                    && tokens.parse::<u64>().is_ok_and(|t| t > 0)
                    && (duration.ends_with("ms") || duration.ends_with('s'))),
            "{id}'s row has outcome, issue, agent, turns, tokens and duration:\n{screen}"
        );
        let ended = line_with(&screen, &["run_succeeded", &format!("{id} run ended")]);
        assert!(
            ended.is_some_and(|l| l > events_title),
            "{id}'s run_succeeded is in the recent events:\n{screen}"
        );
        let started = line_with(&screen, &["run_started", &format!("{id} dispatched")]);
        assert!(
            started.is_some_and(|l| l > events_title),
            "{id}'s run_started is in the recent events:\n{screen}"
        );
    }
    assert!(screen.contains("q quit"), "{screen}");
    tmux.quit_gracefully(&status_file);
}

/// The header's clock line (uptime, the next poll, the token-rate sparkline), and a steering
/// message typed on a running entry's card reaching its agent as its next turn.
#[test]
fn the_header_tells_the_time_and_s_on_a_running_card_steers_the_agent() {
    let dir = TestDir::new("tui-steer");
    let wf = board_workflow(
        &dir,
        &[(
            "BOARD-1.md",
            "---\ntitle: Steered from the terminal\nstate: Todo\n---\ndemo: hold 2000\n",
        )],
        "polling:\n  interval_ms: 30000\nagent:\n  kind: demo\n  max_turns: 5\n",
    );
    let (tmux, status_file) = Tmux::start_svc(&dir, 40, &[&wf.display().to_string()]);
    let screen = tmux.wait_screen("the run lane and the clock line", |s| {
        s.lines()
            .any(|l| l.starts_with("1  run") && l.contains("BOARD-1"))
            && s.contains("tok/s (last ")
    });
    let clock = screen
        .lines()
        .nth(2)
        .expect("the header's third line")
        .to_string();
    assert!(clock.starts_with("up "), "{screen}");
    assert!(clock.contains(" · next poll in "), "{screen}");
    assert!(clock.contains("peak"), "{screen}");
    assert!(
        clock.contains('▁') || clock.contains('█'),
        "a sparkline: {screen}"
    );
    assert!(screen.contains("s steer (running card)"), "{screen}");
    tmux.cmd(&["send-keys", "-t", "svc", "1"]);
    tmux.wait_screen("the running card", |s| {
        s.contains("(esc)") && s.contains("s: send a steering message to this agent")
    });
    tmux.cmd(&["send-keys", "-t", "svc", "s"]);
    tmux.cmd(&["send-keys", "-t", "svc", "-l", "hello from tmux, use tabs"]);
    tmux.wait_screen("the message typed", |s| {
        s.contains("steer> hello from tmux, use tabs█") && s.contains("enter send · esc drop it")
    });
    tmux.cmd(&["send-keys", "-t", "svc", "Enter"]);
    tmux.wait_screen("the notice", |s| {
        s.contains("steering message sent to BOARD-1: the agent's next turn")
    });
    // Delivered at the end of the turn: the card's steering line names it.
    tmux.wait_screen_within("the message delivered", Duration::from_secs(30), |s| {
        s.contains("1 turn(s) · last from operator (tui): hello from tmux, use tabs")
    });
    tmux.cmd(&["send-keys", "-t", "svc", "Escape"]);
    tmux.wait_screen("the card closed", |s| !s.contains("(esc)"));
    tmux.quit_gracefully(&status_file);
}

/// A daemon serving two workflows: each lane row names its workflow in the `wf` column, the
/// header counts the workflows, and the detail card says the entry's workflow first.
#[test]
fn the_terminal_dashboard_names_each_row_s_workflow() {
    let dir = TestDir::new("tui-workflows");
    let wf = held_workflows(&dir, &[("alpha", &["BOARD-1"]), ("beta", &["BOARD-2"])]);
    let (tmux, status_file) = Tmux::start_svc(&dir, 30, &[&wf.display().to_string()]);
    let lane_rows = |s: &str| -> Vec<Vec<String>> {
        s.lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .filter(|w| w.len() > 3 && w[0].parse::<u8>().is_ok() && w[1] == "run")
            .map(|w| w[..4].to_vec())
            .collect()
    };
    let screen = tmux.wait_screen("a run lane row per workflow", |s| lane_rows(s).len() == 2);
    let mut rows = lane_rows(&screen);
    rows.sort_by(|a, b| a[2].cmp(&b[2]));
    assert_eq!(rows[0][2..], ["alpha", "BOARD-1"], "{screen}");
    assert_eq!(rows[1][2..], ["beta", "BOARD-2"], "{screen}");
    let header = line_with(&screen, &["lane", "issue"]).expect("the lanes' header");
    assert_eq!(
        screen
            .lines()
            .nth(header)
            .unwrap()
            .split_whitespace()
            .take(4)
            .collect::<Vec<_>>(),
        ["#", "lane", "wf", "issue"],
        "{screen}"
    );
    assert!(screen.contains("· 2 workflows"), "{screen}");
    tmux.cmd(&["send-keys", "-t", "svc", "1"]);
    let screen = tmux.wait_screen("the detail card", |s| s.contains("(esc)"));
    // The card's labels are 13 wide: `workflow     alpha`.
    let first = &rows.iter().find(|r| r[0] == "1").expect("row 1")[2];
    assert!(
        screen.contains(&format!("workflow     {first} ")),
        "{screen}"
    );
    tmux.cmd(&["send-keys", "-t", "svc", "Escape"]);
    tmux.wait_screen("the card closed", |s| !s.contains("(esc)"));
    tmux.quit_gracefully(&status_file);
}

/// Two workflows whose boards both have BOARD-1: a message typed on beta's card reaches beta's
/// agent, never alpha's (the dashboard routes it by its qualified identifier).
#[test]
fn a_message_typed_on_a_card_goes_to_that_workflow_s_agent() {
    let dir = TestDir::new("tui-workflows-steer");
    let wf = held_workflows(&dir, &[("alpha", &["BOARD-1"]), ("beta", &["BOARD-1"])]);
    for name in ["alpha", "beta"] {
        fs::write(
            dir.join(&format!("boards/{name}/BOARD-1.md")),
            "---\ntitle: Held open\nstate: Todo\n---\ndemo: hold 2000\n",
        )
        .unwrap();
    }
    let (tmux, status_file) = Tmux::start_svc(&dir, 30, &[&wf.display().to_string()]);
    let beta_row = |s: &str| -> Option<String> {
        s.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.len() > 3 && w[1] == "run" && w[2] == "beta" && w[3] == "BOARD-1")
            .map(|w| w[0].to_string())
    };
    let screen = tmux.wait_screen("both BOARD-1 running", |s| {
        beta_row(s).is_some() && s.contains("alpha")
    });
    let row = beta_row(&screen).unwrap();
    tmux.cmd(&["send-keys", "-t", "svc", &row]);
    tmux.wait_screen("beta's card", |s| {
        s.contains("(esc)") && s.contains("workflow     beta ")
    });
    tmux.cmd(&["send-keys", "-t", "svc", "s"]);
    tmux.cmd(&["send-keys", "-t", "svc", "-l", "hello beta only"]);
    tmux.wait_screen("the message typed", |s| {
        s.contains("steer> hello beta only")
    });
    tmux.cmd(&["send-keys", "-t", "svc", "Enter"]);
    tmux.wait_screen_within("delivered on beta's card", Duration::from_secs(30), |s| {
        s.contains("last from operator (tui): hello beta only")
    });
    tmux.cmd(&["send-keys", "-t", "svc", "Escape"]);
    let screen = tmux.wait_screen("the card closed", |s| !s.contains("(esc)"));
    let alpha = screen
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() > 3 && w[1] == "run" && w[2] == "alpha")
        .map(|w| w[0].to_string())
        .expect("alpha's row");
    tmux.cmd(&["send-keys", "-t", "svc", &alpha]);
    let screen = tmux.wait_screen("alpha's card", |s| {
        s.contains("(esc)") && s.contains("workflow     alpha ")
    });
    assert!(!screen.contains("hello beta only"), "{screen}");
    tmux.cmd(&["send-keys", "-t", "svc", "Escape"]);
    tmux.quit_gracefully(&status_file);
}

/// A daemon whose only agent kind meets its limit: the header gains a cooldown line naming the
/// kind, its reset and how far off that is, and the issue that arrived meanwhile has a `block`
/// row saying it waits for that kind's reset. Before the limit there is no cooldown line.
#[test]
fn the_terminal_dashboard_shows_a_cooling_agent_kind_and_the_issue_waiting_for_it() {
    let dir = TestDir::new("tui-limit");
    let (words, hour) = limit_hours_off();
    let wf = limited_workflow(&dir, &words);
    let (tmux, status_file) = Tmux::start_svc(&dir, 30, &[&wf.display().to_string()]);
    let screen = tmux.wait_screen("the dashboard", |s| s.contains("q quit"));
    assert!(
        !screen.lines().any(|l| l.starts_with("cooldown ")),
        "no kind cools down yet:\n{screen}"
    );
    add_board_issue(&dir, "BOARD-1");
    let reset = format!("{hour:02}:00:00 UTC");
    let screen = tmux.wait_screen_within("the cooldown line", Duration::from_secs(60), |s| {
        s.lines().any(|l| l.starts_with("cooldown "))
    });
    let line = screen
        .lines()
        .nth(3)
        .expect("the header's fourth line")
        .to_string();
    assert!(
        line.starts_with(&format!("cooldown agent_a rate limited until {reset} (in "))
            && line.contains(" h "),
        "{screen}"
    );
    add_board_issue(&dir, "BOARD-2");
    let screen = tmux.wait_screen_within("BOARD-2's block row", Duration::from_secs(60), |s| {
        line_with(s, &["block", "BOARD-2"]).is_some()
    });
    let row = screen
        .lines()
        .nth(line_with(&screen, &["block", "BOARD-2"]).unwrap())
        .unwrap();
    assert!(
        row.contains(&format!("agent rate limited · agent_a resets {reset}")),
        "{screen}"
    );
    tmux.quit_gracefully(&status_file);
}
