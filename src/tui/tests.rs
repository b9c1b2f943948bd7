//! The terminal dashboard's tests: lanes, layout, keys and rendering on a test backend.

use super::*;
use crate::orchestrator::protocol::{Event as E, PollReport, RunEnd, RunMsg, Tokens, Usage};
use crate::orchestrator::snapshot;
use crate::orchestrator::state::{State, handle};
use crate::orchestrator::testutil::daemon_info;
use crate::orchestrator::testutil::{issue, settings};
use ratatui::backend::TestBackend;

/// A state with `n` issues polled: three run (the cap), the rest are blocked.
fn state_with(n: usize) -> State {
    let mut st = State::new(
        Arc::new(settings(
            "tracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 3\nagents:\n  x:\n    bridge_command: x",
        )),
        1_000_000,
    );
    handle(&mut st, 1_000_000, E::Tick);
    let mut issues: Vec<_> = (0..n)
        .map(|i| {
            issue(
                &format!("T-{i}"),
                "Todo",
                if i % 2 == 0 { &[] } else { &["Svc:x"] },
            )
        })
        .collect();
    issues.truncate(n);
    handle(
        &mut st,
        1_000_001,
        crate::orchestrator::testutil::poll_done(issues),
    );
    st
}

fn payload(n: usize) -> OpsStatePayload {
    snapshot::build(&state_with(n), &daemon_info(), 1_002_000, None).state
}

/// Sends one run message to the live run of `identifier`.
fn run_msg(st: &mut State, now: u64, identifier: &str, msg: RunMsg) {
    let run_id = st
        .running
        .values()
        .find(|r| r.slot.issue.identifier == identifier)
        .unwrap()
        .run_id
        .clone();
    handle(st, now, E::Run { run_id, msg });
}

/// Five issues polled at 1_000_001, then T-1 fails after 850 ms and T-0 succeeds after two
/// turns, 1500 tokens and 13.3 s (at 00:16:53 UTC); the freed slots start T-3 and T-4.
fn snapshot_with_history() -> Snapshot {
    let mut st = state_with(5);
    run_msg(
        &mut st,
        1_000_851,
        "T-1",
        RunMsg::Exited(RunEnd::Failed("bridge crashed".into())),
    );
    run_msg(&mut st, 1_005_000, "T-0", RunMsg::TurnStarted { turn: 2 });
    run_msg(
        &mut st,
        1_005_001,
        "T-0",
        RunMsg::Usage(Usage {
            tokens: Tokens {
                input: 1200,
                output: 300,
                total: 1500,
            },
            ..Usage::default()
        }),
    );
    run_msg(&mut st, 1_013_346, "T-0", RunMsg::Exited(RunEnd::Clean));
    snapshot::build(&st, &daemon_info(), 1_014_000, None)
}

/// A steering message accepted for a running issue, then delivered: the detail card says
/// how many steering turns, and the last message with its author and source.
#[test]
fn the_detail_card_shows_steering() {
    let mut st = state_with(1);
    let message = crate::steering::Message {
        issue_id: "id-T-0".into(),
        source: crate::steering::Source::Api,
        author: "alice".into(),
        text: "use tabs".into(),
        at: "2026-11-25T10:00:00Z".into(),
        key: "k1".into(),
    };
    let fx = handle(
        &mut st,
        1_000_100,
        E::Steer {
            messages: vec![message.clone(), message.clone()],
            cursor: None,
            ignored: Vec::new(),
            held: Vec::new(),
        },
    );
    // The same key twice is one message, handed to the run once.
    let handed: Vec<_> = fx
        .iter()
        .filter(|e| matches!(e, crate::orchestrator::protocol::Effect::Steer { .. }))
        .collect();
    assert_eq!(handed.len(), 1, "{fx:?}");
    let pending = payload_of(&st);
    assert_eq!(pending.running[0].steering_pending, 1);
    run_msg(
        &mut st,
        1_000_200,
        "T-0",
        RunMsg::Steered {
            keys: vec![message.unique_key()],
        },
    );
    let s = payload_of(&st);
    let row = rows(&s, &View::default()).remove(0);
    let steering = row.detail.iter().find(|(k, _)| *k == "steering").unwrap();
    assert_eq!(steering.1, "1 turn(s) · last from alice (api): use tabs");
}

fn payload_of(st: &State) -> OpsStatePayload {
    snapshot::build(st, &daemon_info(), 1_002_000, None).state
}

/// The same snapshot with nothing live left, as after the shipped demo's runs end.
fn snapshot_after_everything_ended() -> Snapshot {
    let mut snap = snapshot_with_history();
    snap.state.running.clear();
    snap.state.retrying.clear();
    snap.state.blocked.clear();
    snap.runs.retain(|r| r.outcome != "running");
    snap
}

fn text(buf: &Buffer) -> String {
    let mut out = String::new();
    for y in 0..buf.area.height {
        for x in 0..buf.area.width {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

fn draw_sized<'a>(
    data: impl Into<DashboardData<'a>> + Copy,
    view: &View,
    width: u16,
    height: u16,
) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal
        .draw(|f| render(f.area(), f.buffer_mut(), data, view, 12.5))
        .unwrap();
    text(terminal.backend().buffer())
}

fn draw(s: &OpsStatePayload, view: &View) -> String {
    draw_sized(s, view, 100, 20)
}

/// The index of the first screen line containing every one of `parts`.
fn line_with(screen: &str, parts: &[&str]) -> Option<usize> {
    screen
        .lines()
        .position(|l| parts.iter().all(|p| l.contains(p)))
}

#[test]
fn lanes_header_and_footer_render() {
    let s = payload(5);
    let screen = draw(&s, &View::default());
    assert!(screen.contains("run 3 · retry 0 · block 2"), "{screen}");
    assert!(screen.contains("12.5 tok/s (5 s)"), "{screen}");
    assert!(screen.contains("pid 42 · /w/WORKFLOW.md"));
    let lane = |name: &str| {
        screen
            .lines()
            .filter(|l| {
                l.starts_with(|c: char| c.is_ascii_digit())
                    && l.split_whitespace().nth(1) == Some(name)
            })
            .count()
    };
    let (run_lines, block_lines) = (lane("run"), lane("block"));
    assert_eq!((run_lines, block_lines), (3, 2), "{screen}");
    assert!(screen.contains("global concurrency cap"));
    assert!(screen.contains("q quit"));
}

#[test]
fn the_header_shows_the_day_s_spend_and_a_lane_its_issue_s() {
    let mut st = state_with(1);
    let run = st.running.values().next().unwrap().clone();
    st.ledger.add_for_issue(
        &run.slot.issue.identifier,
        1_001_000,
        &crate::orchestrator::protocol::Spent {
            total_tokens: 900,
            cost_usd: 1.25,
            runs: 2,
            ..Default::default()
        },
    );
    let s = snapshot::build(&st, &daemon_info(), 1_002_000, None).state;
    let screen = draw(&s, &View::default());
    assert!(screen.contains("today $1.25"), "{screen}");
    assert!(screen.contains("issue $1.25"), "{screen}");
}

#[test]
fn reserving_runs_sit_in_lane_rsv_and_the_header_shows_the_pool() {
    let mut st = state_with(2);
    let reserving = st.running.keys().next().unwrap().clone();
    st.running.get_mut(&reserving).unwrap().reserving = true;
    let leased = st.running.keys().nth(1).unwrap().clone();
    st.running.get_mut(&leased).unwrap().worker_host = Some("fake://worker-w-1".into());
    st.pool = Some(crate::workers::PoolView {
        driver: "fake".into(),
        configured: true,
        status: crate::workers::pool::Status {
            live: 1,
            leased: 1,
            ..Default::default()
        },
    });
    let s = snapshot::build(&st, &daemon_info(), 1_002_000, None).state;
    assert_eq!(s.reserving, 1);
    let lanes: Vec<(&str, String)> = rows(&s, &View::default())
        .into_iter()
        .map(|r| (r.lane, r.issue))
        .collect();
    assert_eq!(lanes[0].0, "run");
    assert_eq!(
        lanes[1],
        ("rsv", st.running[&reserving].slot.issue.identifier.clone())
    );
    let screen = draw_sized(&s, &View::default(), 140, 12);
    assert!(
        screen.contains("pool fake: 1 live, 0 idle, 1 leased"),
        "{screen}"
    );
    assert!(screen.contains("acquiring a worker slot"), "{screen}");
}

#[test]
fn keys_move_open_details_filter_agents_and_quit() {
    let s = payload(5);
    let mut view = View::default();
    assert_eq!(on_key(&mut view, KeyCode::Down, &s), Act::Nothing);
    assert_eq!(view.cursor, 1);
    on_key(&mut view, KeyCode::Char('3'), &s);
    assert!(view.detail && view.cursor == 2);
    let screen = draw(&s, &view);
    assert!(
        screen.contains("last message") && screen.contains("(esc)"),
        "{screen}"
    );
    on_key(&mut view, KeyCode::Esc, &s);
    assert!(!view.detail);
    on_key(&mut view, KeyCode::Right, &s);
    assert_eq!(agents(&s)[view.agent.unwrap()], "agent_a");
    assert!(
        rows(&s, &view)
            .iter()
            .filter(|r| r.lane == "run")
            .all(|r| r.agent == "agent_a")
    );
    on_key(&mut view, KeyCode::Right, &s);
    assert_eq!(agents(&s)[view.agent.unwrap()], "x");
    on_key(&mut view, KeyCode::Right, &s);
    assert_eq!(view.agent, None, "cycles back to all agents");
    assert_eq!(on_key(&mut view, KeyCode::Char('q'), &s), Act::Quit);
    let empty = payload(0);
    assert!(draw(&empty, &View::default()).contains("Nothing running"));
}

/// A long event name is shown whole (it was cut at 22 columns), and the message follows it.
#[test]
fn long_event_names_are_not_cut() {
    let mut snap = snapshot_with_history();
    let mut e = snap.state.recent_events[0].clone();
    e.event = "worker_pool_worker_provisioned".into();
    e.message = "machine m-1 is up".into();
    snap.state.recent_events.insert(0, e);
    let screen = draw_sized(&snap, &View::default(), 100, 40);
    assert!(
        line_with(
            &screen,
            &["worker_pool_worker_provisioned", "machine m-1 is up"]
        )
        .is_some(),
        "{screen}"
    );
}

#[test]
fn recent_runs_and_events_render_below_the_lanes() {
    let snap = snapshot_with_history();
    let screen = draw_sized(&snap, &View::default(), 100, 40);
    // The lanes still come first: T-2 still runs, and the slots T-1 and T-0 freed went to
    // T-3 and T-4.
    let last_lane = ["T-2", "T-3", "T-4"]
        .iter()
        .map(|id| line_with(&screen, &["run", id, "turn 0"]).expect(id))
        .max()
        .unwrap();
    let runs_title = line_with(&screen, &["Recent runs"]).expect("the runs panel");
    let events_title = line_with(&screen, &["Recent events"]).expect("the events panel");
    assert!(
        last_lane < runs_title && runs_title < events_title,
        "{screen}"
    );
    let header = line_with(
        &screen,
        &["outcome", "issue", "agent", "turns", "tokens", "duration"],
    );
    assert_eq!(header, Some(runs_title + 1), "{screen}");
    // Newest first, with the duration in the format of `svc runs`.
    let success = line_with(
        &screen,
        &["success", "T-0", "agent_a", " 2 ", "1500", "13.3s"],
    );
    let failed = line_with(&screen, &["failed", "T-1", " x ", " 0 ", "850ms"]);
    assert_eq!(success, Some(runs_title + 2), "{screen}");
    assert_eq!(failed, Some(runs_title + 3), "{screen}");
    let events_header = line_with(&screen, &["time (UTC)", "event", "message"]);
    assert_eq!(events_header, Some(events_title + 1), "{screen}");
    // Newest first: T-0's end freed the slot that started T-4 at the same moment.
    let started = line_with(&screen, &["00:16:53", "run_started", "T-4 dispatched"]);
    let succeeded = line_with(&screen, &["00:16:53", "run_succeeded", "T-0 run ended"]);
    assert_eq!(started, Some(events_title + 2), "{screen}");
    assert_eq!(succeeded, Some(events_title + 3), "{screen}");
    assert!(
        line_with(&screen, &["00:16:40", "run_failed", "T-1: bridge crashed"]).is_some(),
        "{screen}"
    );
    assert!(line_with(&screen, &["retry_scheduled", "T-1 retry 1"]).is_some());
    assert!(screen.contains("q quit"), "the footer stays: {screen}");
}

#[test]
fn after_every_run_ended_the_empty_lanes_take_three_lines_and_the_panels_the_rest() {
    let snap = snapshot_after_everything_ended();
    let screen = draw_sized(&snap, &View::default(), 100, 30);
    let nothing = line_with(&screen, &["Nothing running, retrying or blocked."]).unwrap();
    assert_eq!(
        line_with(&screen, &["Recent runs"]),
        Some(nothing + 1),
        "{screen}"
    );
    assert!(
        line_with(&screen, &["success", "T-0", "13.3s"]).is_some(),
        "{screen}"
    );
    assert!(
        line_with(&screen, &["failed", "T-1", "850ms"]).is_some(),
        "{screen}"
    );
    assert!(
        line_with(&screen, &["run_succeeded", "T-0 run ended"]).is_some(),
        "{screen}"
    );
    // A state without its snapshot (as svc-bench renders) has no history: no runs panel,
    // but its events are still there.
    let screen = draw_sized(&snap.state, &View::default(), 100, 30);
    assert!(!screen.contains("Recent runs"), "{screen}");
    assert!(screen.contains("Recent events"), "{screen}");
}

#[test]
fn panels_show_only_the_rows_that_fit_and_the_lanes_keep_priority() {
    let body = |height| Rect::new(0, 3, 80, height);
    let heights = |a: BodyAreas| {
        (
            a.lanes.height,
            a.recent_runs.map(|r| r.height),
            a.recent_events.map(|r| r.height),
        )
    };
    // Room for everything: each panel takes what it can fill, nothing more.
    assert_eq!(
        heights(body_areas(body(25), 0, 2, 8)),
        (3, Some(4), Some(10))
    );
    // Short of room: events get at most half of what the lanes leave.
    assert_eq!(
        heights(body_areas(body(10), 0, 50, 20)),
        (3, Some(4), Some(3))
    );
    // Too little for two panels: the runs panel takes it all.
    assert_eq!(heights(body_areas(body(8), 0, 50, 20)), (3, Some(5), None));
    // No finished run yet: the events panel takes the room.
    assert_eq!(heights(body_areas(body(20), 0, 0, 5)), (3, None, Some(7)));
    // Lanes first, even when they fill the body.
    assert_eq!(heights(body_areas(body(10), 20, 50, 20)), (10, None, None));
    assert_eq!(heights(body_areas(body(9), 5, 50, 20)), (7, None, None));
    assert_eq!(heights(body_areas(body(2), 0, 50, 20)), (2, None, None));
    assert_eq!(heights(body_areas(body(0), 0, 50, 20)), (0, None, None));
    let areas = body_areas(body(25), 1, 2, 8);
    assert_eq!(areas.lanes.y, 3);
    assert_eq!(areas.recent_runs.unwrap().y, 3 + 3);
    assert_eq!(areas.recent_events.unwrap().y, 3 + 3 + 4);

    // On a short terminal the tables hold only the rows that fit: one run, one event.
    let snap = snapshot_after_everything_ended();
    let screen = draw_sized(&snap, &View::default(), 100, 14);
    assert!(
        line_with(&screen, &["success", "T-0"]).is_some(),
        "{screen}"
    );
    assert!(line_with(&screen, &["failed", "T-1"]).is_none(), "{screen}");
    assert!(
        line_with(&screen, &["run_started", "T-4"]).is_some(),
        "{screen}"
    );
    assert!(line_with(&screen, &["run_succeeded"]).is_none(), "{screen}");
    // Behind five lane rows there is room for one panel only: the runs get it.
    let snap = snapshot_with_history();
    let screen = draw_sized(&snap, &View::default(), 100, 15);
    assert!(
        line_with(&screen, &["success", "T-0"]).is_some(),
        "{screen}"
    );
    assert!(!screen.contains("Recent events"), "{screen}");
    // With the lanes taking (nearly) all the body, the panels disappear.
    let screen = draw_sized(&snap, &View::default(), 100, 13);
    assert!(line_with(&screen, &["retry", "T-1"]).is_some(), "{screen}");
    assert!(!screen.contains("Recent"), "{screen}");
}

#[test]
fn tiny_terminals_do_not_panic() {
    let snap = snapshot_with_history();
    let detail = View {
        cursor: 2,
        detail: true,
        agent: None,
        input: None,
    };
    for view in [View::default(), detail] {
        for width in [0, 1, 2, 3, 4, 6, 9, 14, 20, 27, 40] {
            for height in 0..=14 {
                draw_sized(&snap, &view, width, height);
            }
        }
        let screen = draw_sized(&snap, &view, 20, 5);
        assert_eq!(screen.lines().count(), 5);
        draw_sized(&snapshot_after_everything_ended(), &view, 20, 5);
    }
}

#[test]
fn issues_waiting_for_blockers_have_a_lane_apart_from_the_capacity_blocked() {
    let mut st = state_with(4);
    handle(&mut st, 1_000_002, E::Refresh);
    handle(&mut st, 1_000_002, E::Tick);
    let mut waiting = issue("W-1", "Todo", &[]);
    waiting.blocked_by = vec![crate::tracker::Blocker {
        id: "id-ENG-2".into(),
        identifier: "ENG-2".into(),
        state: "In Progress".into(),
    }];
    let mut candidates: Vec<_> = (0..4)
        .map(|i| issue(&format!("T-{i}"), "Todo", &[]))
        .collect();
    candidates.push(waiting);
    handle(
        &mut st,
        1_000_003,
        E::PollDone(PollReport {
            candidates: Ok(candidates),
            refreshed: Ok(vec![]),
            requested: vec![],
            terminal: None,
            rate_limits: None,
            duration_ms: 0,
            read_at: 0,
        }),
    );
    let s = snapshot::build(&st, &daemon_info(), 1_002_000, None).state;
    let lanes: Vec<(&str, String)> = rows(&s, &View::default())
        .into_iter()
        .map(|r| (r.lane, r.issue))
        .collect();
    assert_eq!(
        lanes.iter().filter(|l| l.0 == "block").count(),
        1,
        "{lanes:?}"
    );
    assert_eq!(lanes.last().unwrap(), &("wait", "W-1".to_string()));
    let screen = draw(&s, &View::default());
    assert!(screen.contains("block 1 · wait 1"), "{screen}");
    let line = line_with(&screen, &["wait", "W-1"]).expect(&screen);
    assert!(
        screen
            .lines()
            .nth(line)
            .unwrap()
            .contains("blocked by ENG-2 (In Progress)"),
        "{screen}"
    );
    let card = draw(
        &s,
        &View {
            cursor: lanes.len() - 1,
            detail: true,
            agent: None,
            input: None,
        },
    );
    assert!(
        card.contains("waits for") && card.contains("ENG-2 (In Progress)"),
        "{card}"
    );
}

#[test]
fn throughput_is_tokens_over_the_window() {
    let t0 = Instant::now();
    let samples: VecDeque<_> = [
        (t0, 100),
        (t0 + Duration::from_secs(2), 300),
        (t0 + Duration::from_secs(4), 500),
    ]
    .into();
    assert!((throughput(&samples) - 100.0).abs() < 1e-9);
    assert_eq!(throughput(&VecDeque::new()), 0.0);
}

#[test]
fn the_header_tells_uptime_next_poll_and_the_token_rate() {
    let s = payload(1);
    let live = Live {
        tokens_per_second: 3.0,
        rates: vec![0, 10, 40, 80, 20],
        // 1_002_000 built, daemon started at 1_000_000; the next poll is due at 1_000_001
        // plus the default interval (30 s).
        now_ms: 1_000_000 + 125_000,
        notice: None,
    };
    let mut terminal = Terminal::new(TestBackend::new(120, 20)).unwrap();
    terminal
        .draw(|f| render(f.area(), f.buffer_mut(), &s, &View::default(), live.clone()))
        .unwrap();
    let screen = text(terminal.backend().buffer());
    let line = screen.lines().nth(2).unwrap();
    assert!(line.contains("up 2 min 5 s"), "{screen}");
    assert!(line.contains("next poll due"), "{screen}");
    assert!(line.contains("tok/s (last 5 s) ▁▂▅█▃ peak 80"), "{screen}");
    assert_eq!(sparkline(&[0, 0], 10), "▁▁");
    assert_eq!(sparkline(&[1, 2, 3, 4, 5, 6, 7], 3), "▆▇█");
}

#[test]
fn s_on_a_running_card_types_a_steering_message() {
    let s = payload(5);
    let mut view = View::default();
    // Not without a card, and not on a blocked row's card.
    assert_eq!(on_key(&mut view, KeyCode::Char('s'), &s), Act::Nothing);
    assert!(view.input.is_none());
    let last = rows(&s, &view).len();
    on_key(&mut view, KeyCode::Char(char::from(b'0' + last as u8)), &s);
    on_key(&mut view, KeyCode::Char('s'), &s);
    assert!(view.input.is_none(), "a blocked row takes no message");
    on_key(&mut view, KeyCode::Esc, &s);
    on_key(&mut view, KeyCode::Char('1'), &s);
    assert_eq!(on_key(&mut view, KeyCode::Char('s'), &s), Act::Nothing);
    let target = rows(&s, &view)[0].clone();
    // Every key goes to the message while it is typed, q included.
    for c in "use q".chars() {
        assert_eq!(on_key(&mut view, KeyCode::Char(c), &s), Act::Nothing);
    }
    on_key(&mut view, KeyCode::Backspace, &s);
    on_key(&mut view, KeyCode::Char('Q'), &s);
    let screen = draw_sized(&s, &view, 100, 14);
    assert!(screen.contains("steer> use Q█"), "{screen}");
    assert!(screen.contains("enter send · esc drop it"), "{screen}");
    let Act::Steer(input) = on_key(&mut view, KeyCode::Enter, &s) else {
        panic!("enter sends")
    };
    assert_eq!(input.text, "use Q");
    assert_eq!(Some(input.issue_id.clone()), target.issue_id);
    assert_eq!(input.identifier, target.issue);
    assert!(view.input.is_none() && view.detail);
    let m = steering_message(&input, 1_000_000);
    assert_eq!((m.source.as_str(), m.text.as_str()), ("tui", "use Q"));
    // Esc drops a message being typed; enter on an empty one sends nothing.
    on_key(&mut view, KeyCode::Char('s'), &s);
    on_key(&mut view, KeyCode::Char('x'), &s);
    on_key(&mut view, KeyCode::Esc, &s);
    assert!(view.input.is_none() && view.detail);
    on_key(&mut view, KeyCode::Char('s'), &s);
    assert_eq!(on_key(&mut view, KeyCode::Enter, &s), Act::Nothing);
}

/// A daemon serving two workflows: each lane row names its workflow in a `wf` column, its
/// card says it first, and the header counts the workflows and names a failing one with its
/// reason. One workflow draws no such column.
#[test]
fn lanes_name_their_workflow_when_the_daemon_serves_several() {
    let mut alpha = state_with(2);
    run_msg(
        &mut alpha,
        1_000_851,
        "T-1",
        RunMsg::Exited(RunEnd::Failed("bridge crashed".into())),
    );
    alpha.workflow = Some("alpha".into());
    let mut beta = state_with(4);
    beta.workflow = Some("beta".into());
    let workflow =
        |name: &str, status: &'static str, last_error: Option<&str>| snapshot::WorkflowPayload {
            name: name.into(),
            path: format!("/w/wf/{name}.md"),
            tracker_kind: "memory".into(),
            running: 0,
            retrying: 0,
            blocked: 0,
            last_poll_at: None,
            last_error: last_error.map(str::to_string),
            status,
        };
    let snap = snapshot::build_many(
        &[&alpha, &beta],
        Some(vec![
            workflow("alpha", "ok", None),
            workflow("beta", "failing", Some("board missing")),
        ]),
        &daemon_info(),
        1_002_000,
        None,
        None,
        false,
    );
    let screen = draw_sized(&snap, &View::default(), 120, 20);
    let header = line_with(&screen, &["lane", "issue", "state"]).expect("the lanes' header");
    let cells = |l: &str| -> Vec<String> { l.split_whitespace().map(str::to_string).collect() };
    let lines: Vec<Vec<String>> = screen.lines().map(cells).collect();
    assert_eq!(lines[header][..4], ["#", "lane", "wf", "issue"], "{screen}");
    let lane_rows: Vec<(String, String, String)> = lines
        .iter()
        .filter(|l| l.first().is_some_and(|c| c.parse::<u8>().is_ok()) && l.len() > 3)
        .map(|l| (l[1].clone(), l[2].clone(), l[3].clone()))
        .collect();
    let row = |lane: &str, wf: &str, issue: &str| (lane.into(), wf.into(), issue.into());
    for expected in [
        row("run", "alpha", "T-0"),
        row("run", "beta", "T-0"),
        row("run", "beta", "T-2"),
        row("retry", "alpha", "T-1"),
        row("block", "beta", "T-3"),
    ] {
        assert!(lane_rows.contains(&expected), "{expected:?}: {screen}");
    }
    assert!(
        screen.contains("2 workflows · beta FAILING: board missing"),
        "{screen}"
    );
    let rows = rows(&snap.state, &View::default());
    assert!(
        rows.iter()
            .all(|r| r.detail[0] == ("workflow", r.workflow.clone().unwrap())),
        "{rows:?}"
    );

    let one = draw_sized(&snapshot_with_history(), &View::default(), 120, 20);
    let header = line_with(&one, &["lane", "issue", "state"]).expect("the lanes' header");
    assert_eq!(
        cells(one.lines().nth(header).unwrap())[..3],
        ["#", "lane", "issue"],
        "{one}"
    );
    assert!(!one.contains("workflows"), "{one}");
}

/// T-0 met a rate limit on agent_a (resetting at 2,000,000 ms, 00:33:20 UTC), then T-1 was
/// polled and found agent_a cooling down: a header line names the kind and its reset, T-1's
/// block row and card say which kind it waits for and when, and the run's outcome is whole.
#[test]
fn a_cooling_agent_kind_has_a_header_line_and_its_blocked_issues_name_it() {
    let st = crate::orchestrator::testutil::rate_limited("You've hit your limit");
    let snap = snapshot::build(&st, &daemon_info(), 1_002_000, None);
    let live = Live {
        now_ms: 1_400_000,
        ..Live::default()
    };
    let mut terminal = Terminal::new(TestBackend::new(120, 24)).unwrap();
    terminal
        .draw(|f| {
            render(
                f.area(),
                f.buffer_mut(),
                &snap,
                &View::default(),
                live.clone(),
            )
        })
        .unwrap();
    let screen = text(terminal.backend().buffer());
    let line = screen.lines().nth(3).unwrap();
    assert!(
        line.contains("cooldown agent_a rate limited until 00:33:20 UTC (in 10 min 0 s)"),
        "{screen}"
    );
    assert!(
        line_with(
            &screen,
            &[
                "block",
                "T-1",
                "agent_a",
                "agent rate limited · agent_a resets 00:33:20 UTC"
            ]
        )
        .is_some(),
        "{screen}"
    );
    assert!(
        line_with(&screen, &["rate_limited", "T-0", "agent_a"]).is_some(),
        "{screen}"
    );
    let row = rows(&snap.state, &View::default())
        .into_iter()
        .find(|r| r.lane == "block")
        .unwrap();
    assert!(row.detail.contains(&("agent", "agent_a".into())), "{row:?}");
    assert!(
        row.detail
            .contains(&("resets", crate::time::rfc3339(2_000_000))),
        "{row:?}"
    );
    // Without a cooldown the header keeps its three lines.
    let quiet = draw_sized(&snapshot_with_history(), &View::default(), 120, 24);
    assert!(!quiet.contains("cooldown"), "{quiet}");
}
