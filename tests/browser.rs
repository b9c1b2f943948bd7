//! The web dashboard in a real headless browser (Debian's chromium, which the test command
//! installs): the running table and a live trace timeline rendered from the running daemon.

mod common;

use common::*;
use std::fs;
use std::process::Command;

fn chromium(dir: &TestDir, url: &str, args: &[&str]) -> String {
    let profile = dir.join(&format!("chrome-{}", args.len()));
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,900",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("chromium runs (scripts/test installs Debian's chromium)");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The DOM once `ready` holds: a page fills itself from fetches and a WebSocket, which can take
/// longer than chromium's virtual-time budget on a loaded machine, so a dump is tried up to
/// three times. The caller's assertions then say what is missing.
fn dump_dom(dir: &TestDir, url: &str, ready: impl Fn(&str) -> bool) -> String {
    let mut dom = String::new();
    for _ in 0..3 {
        dom = chromium(dir, url, &["--dump-dom"]);
        if ready(&dom) {
            break;
        }
    }
    dom
}

#[test]
fn the_dashboard_renders_running_runs_and_a_live_trace() {
    let dir = TestDir::new("browser");
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    fs::write(
        board.join("BOARD-1.md"),
        "---\ntitle: Browser visible issue\nstate: Todo\n---\ndemo: keep-open\ndemo: slow 60000\n",
    )
    .unwrap();
    fs::write(
        board.join("BOARD-2.md"),
        "---\ntitle: Waits for the first\nstate: Todo\nblocked_by: [BOARD-1]\n---\n",
    )
    .unwrap();
    let wf = workflow_with_description(
        &dir,
        "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 300\nworkspace:\n  root: ws\nagent:\n  kind: demo\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n  trace_dir: traces\nworker:\n  worker_pool:\n    driver: fake\n    max: 2\n",
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    d.wait_for(20, "a run with its tool call done", |s| {
        s["running"]
            .as_array()
            .is_some_and(|r| r.len() == 1 && r[0]["last_event"].is_string())
    });
    std::thread::sleep(std::time::Duration::from_millis(700));
    let base = base_url(&d);

    let dom = dump_dom(&dir, &format!("{base}/"), |dom| {
        dom.contains("BOARD-1") && dom.contains("class=\"badge live\"")
    });
    let running = dom
        .split("<table id=\"running\">")
        .nth(1)
        .expect("the running table")
        .split("</table>")
        .next()
        .unwrap()
        .to_string();
    assert!(
        running.contains("BOARD-1") && running.contains("demo"),
        "running table: {running}"
    );
    // The run's worker host, and the pool's figures in their card.
    assert!(
        running.contains("fake://worker-w-1"),
        "running table: {running}"
    );
    let pool_card = dom
        .split("id=\"c-pool\"")
        .nth(1)
        .expect("the worker pool card")
        .split("</span>")
        .next()
        .unwrap()
        .to_string();
    assert!(
        pool_card.contains("fake: ") && pool_card.contains("1 leased"),
        "pool card: {pool_card}"
    );
    assert!(
        dom.contains("id=\"link\" class=\"badge live\""),
        "the WebSocket connected"
    );
    // The issue waiting for its blocker is listed apart from the capacity-blocked ones.
    let table = |id: &str| {
        dom.split(&format!("<table id=\"{id}\">"))
            .nth(1)
            .unwrap_or_else(|| panic!("the {id} table"))
            .split("</table>")
            .next()
            .unwrap()
            .to_string()
    };
    let waiting = table("waiting");
    assert!(
        waiting.contains("BOARD-2") && waiting.contains("BOARD-1 (Todo)"),
        "waiting table: {waiting}"
    );
    assert!(
        !table("blocked").contains("BOARD-2"),
        "{}",
        table("blocked")
    );

    let dom = dump_dom(&dir, &format!("{base}/#/traces/BOARD-1"), |dom| {
        dom.contains("Working on BOARD-1") && dom.contains("Browser visible issue")
    });
    let timeline = dom
        .split("id=\"timeline\"")
        .nth(1)
        .expect("the timeline")
        .split("</ol>")
        .next()
        .unwrap()
        .to_string();
    for text in [
        "Turn 1 started",
        "Write DEMO.md",
        "completed",
        "approval_auto_approved",
        "Working on BOARD-1",
    ] {
        assert!(
            timeline.contains(text),
            "{text:?} missing from the timeline: {timeline}"
        );
    }
    assert!(
        dom.contains("Browser visible issue"),
        "the ticket title comes from the issue store"
    );

    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-trace.png");
    chromium(
        &dir,
        &format!("{base}/#/traces/BOARD-1"),
        &[&format!("--screenshot={}", shot.display())],
    );
    assert!(
        fs::metadata(&shot).unwrap().len() > 10_000,
        "a real screenshot at {}",
        shot.display()
    );
}
