//! The terminal dashboard (ratatui over crossterm): the snapshot as lanes `run`, `rsv`, `retry`
//! and `block`, refreshed every 250 ms, with token throughput over a 5-second rolling window.
//! Keys: up/down move, enter or 1-9 open a detail card, left/right cycle the agent filter, esc
//! goes back, q stops the daemon gracefully. Rendering is a pure function of the snapshot and
//! the view state ([`render`]); the terminal is restored on exit and on panic.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Row, Table, Widget, Wrap};

use crate::orchestrator::snapshot::{OpsStatePayload, SnapshotHub};
use crate::orchestrator::state::Event;

pub const REFRESH: Duration = Duration::from_millis(250);
pub const THROUGHPUT_WINDOW: Duration = Duration::from_secs(5);

/// What the operator has selected.
#[derive(Clone, Debug, Default)]
pub struct View {
    pub cursor: usize,
    pub detail: bool,
    /// Index into the agent kinds of the running entries; `None` shows every agent.
    pub agent: Option<usize>,
}

/// One lane row.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneRow {
    pub lane: &'static str,
    pub issue: String,
    pub state: String,
    pub agent: String,
    pub info: String,
    /// Label/value pairs of the detail card.
    pub detail: Vec<(&'static str, String)>,
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map_or_else(|| "n/a".to_string(), ToString::to_string)
}

/// The agent kinds of the running entries, sorted (the left/right cycle).
pub fn agents(s: &OpsStatePayload) -> Vec<String> {
    let mut kinds: Vec<String> = s.running.iter().map(|r| r.agent_kind.clone()).collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// The rows in lane order, filtered by the selected agent.
pub fn rows(s: &OpsStatePayload, view: &View) -> Vec<LaneRow> {
    let filter = view.agent.and_then(|i| agents(s).get(i).cloned());
    let mut out = Vec::new();
    for r in s
        .running
        .iter()
        .filter(|r| filter.as_ref().is_none_or(|f| *f == r.agent_kind))
    {
        out.push(LaneRow {
            lane: "run",
            issue: r.issue_identifier.clone(),
            state: r.state.clone(),
            agent: r.agent_kind.clone(),
            info: format!(
                "turn {} · {} tok · {}",
                r.turn_count,
                r.tokens.total_tokens,
                opt(&r.last_event)
            ),
            detail: vec![
                (
                    "issue",
                    format!("{} ({})", r.issue_identifier, r.issue_title),
                ),
                ("state", r.state.clone()),
                ("agent", r.agent_kind.clone()),
                ("run", r.run_id.clone()),
                ("session", opt(&r.session_id)),
                ("turns", r.turn_count.to_string()),
                (
                    "tokens",
                    format!(
                        "{} in · {} out · {} total",
                        r.tokens.input_tokens, r.tokens.output_tokens, r.tokens.total_tokens
                    ),
                ),
                ("pid", opt(&r.executor_pid)),
                ("workspace", r.workspace_path.clone()),
                ("started", r.started_at.clone()),
                ("last event", opt(&r.last_event)),
                ("last message", opt(&r.last_message)),
            ],
        });
    }
    for n in 0..s.reserving {
        out.push(LaneRow {
            lane: "rsv",
            issue: format!("slot {}", n + 1),
            state: String::new(),
            agent: String::new(),
            info: "acquiring a slot".into(),
            detail: vec![("slot", "being acquired".into())],
        });
    }
    for r in &s.retrying {
        out.push(LaneRow {
            lane: "retry",
            issue: r.issue_identifier.clone(),
            state: String::new(),
            agent: String::new(),
            info: format!(
                "attempt {} · due {} · {}",
                r.attempt,
                r.due_at,
                opt(&r.error)
            ),
            detail: vec![
                ("issue", r.issue_identifier.clone()),
                ("attempt", r.attempt.to_string()),
                ("due", r.due_at.clone()),
                ("error", opt(&r.error)),
                ("workspace", r.workspace_path.clone()),
            ],
        });
    }
    for b in &s.blocked {
        out.push(LaneRow {
            lane: "block",
            issue: b.issue_identifier.clone(),
            state: b.state.clone(),
            agent: String::new(),
            info: b.label.to_string(),
            detail: vec![
                ("issue", b.issue_identifier.clone()),
                ("state", b.state.clone()),
                ("reason", b.label.to_string()),
            ],
        });
    }
    out
}

/// Draws the whole dashboard into `buf`. A pure function of its arguments.
pub fn render(
    area: Rect,
    buf: &mut Buffer,
    s: &OpsStatePayload,
    view: &View,
    tokens_per_second: f64,
) {
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(3),
        Constraint::Length(2),
    ])
    .areas(area);
    let agent_label = match view.agent.and_then(|i| agents(s).get(i).cloned()) {
        Some(a) => a,
        None => "all agents".into(),
    };
    let daemon = s.daemon.as_ref().map_or_else(String::new, |d| {
        format!("pid {} · {}", d.pid, d.workflow_path)
    });
    let header = vec![
        Line::from(vec![
            Span::styled("svc ", Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(format!(
                "run {} · retry {} · block {} · tokens {} in / {} out · {:.1} tok/s (5 s) · {agent_label}",
                s.counts.running,
                s.counts.retrying,
                s.counts.blocked,
                s.usage_totals.input_tokens,
                s.usage_totals.output_tokens,
                tokens_per_second
            )),
        ]),
        Line::from(Span::styled(
            daemon,
            Style::new().add_modifier(Modifier::DIM),
        )),
    ];
    Paragraph::new(header).render(head, buf);

    let rows = rows(s, view);
    let cursor = view.cursor.min(rows.len().saturating_sub(1));
    let table_rows: Vec<Row> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let key = if i < 9 {
                format!("{}", i + 1)
            } else {
                " ".into()
            };
            let style = if i == cursor {
                Style::new().add_modifier(Modifier::REVERSED)
            } else {
                Style::new()
            };
            Row::new(vec![
                key,
                r.lane.to_string(),
                r.issue.clone(),
                r.state.clone(),
                r.agent.clone(),
                r.info.clone(),
            ])
            .style(style)
        })
        .collect();
    let empty = table_rows.is_empty();
    let table = Table::new(
        table_rows,
        [
            Constraint::Length(2),
            Constraint::Length(6),
            Constraint::Length(14),
            Constraint::Length(12),
            Constraint::Length(10),
            Constraint::Min(10),
        ],
    )
    .header(
        Row::new(vec!["#", "lane", "issue", "state", "agent", ""])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(Block::default().borders(Borders::TOP));
    table.render(body, buf);
    if empty {
        let msg = Rect {
            y: body.y + 2,
            height: 1,
            ..body
        };
        Paragraph::new("Nothing running, retrying or blocked.").render(msg, buf);
    }

    let last = s.recent_events.first().map_or_else(String::new, |e| {
        format!("{} {}: {}", e.at, e.event, e.message)
    });
    Paragraph::new(vec![
        Line::from(Span::styled(last, Style::new().add_modifier(Modifier::DIM))),
        Line::from("↑/↓ move · enter or 1-9 details · ←/→ agent · esc back · q quit"),
    ])
    .render(foot, buf);

    if view.detail
        && let Some(r) = rows.get(cursor)
    {
        let w = body.width.saturating_sub(4).min(100);
        let h = (r.detail.len() as u16 + 2).min(body.height);
        let card = Rect {
            x: body.x + 2,
            y: body.y + 1,
            width: w,
            height: h,
        };
        Clear.render(card, buf);
        let lines: Vec<Line> = r
            .detail
            .iter()
            .map(|(k, v)| {
                Line::from(vec![
                    Span::styled(
                        format!("{k:<13}"),
                        Style::new().add_modifier(Modifier::BOLD),
                    ),
                    Span::raw(v.clone()),
                ])
            })
            .collect();
        Paragraph::new(lines)
            .wrap(Wrap { trim: true })
            .block(
                Block::default()
                    .borders(Borders::ALL)
                    .title(format!(" {} · {} (esc) ", r.lane, r.issue)),
            )
            .render(card, buf);
    }
}

/// Tokens per second over the rolling window of (time, total tokens) samples.
pub fn throughput(samples: &VecDeque<(Instant, u64)>) -> f64 {
    match (samples.front(), samples.back()) {
        (Some((t0, n0)), Some((t1, n1))) if t1 > t0 => {
            n1.saturating_sub(*n0) as f64 / t1.duration_since(*t0).as_secs_f64()
        }
        _ => 0.0,
    }
}

/// Applies a key; returns true when the operator asked to quit.
pub fn on_key(view: &mut View, code: KeyCode, s: &OpsStatePayload) -> bool {
    let n = rows(s, view).len();
    match code {
        KeyCode::Char('q') => return true,
        KeyCode::Up => view.cursor = view.cursor.saturating_sub(1),
        KeyCode::Down => view.cursor = (view.cursor + 1).min(n.saturating_sub(1)),
        KeyCode::Enter => view.detail = n > 0,
        KeyCode::Esc => view.detail = false,
        KeyCode::Char(c @ '1'..='9') => {
            let i = c as usize - '1' as usize;
            if i < n {
                view.cursor = i;
                view.detail = true;
            }
        }
        KeyCode::Left | KeyCode::Right => {
            let count = agents(s).len();
            view.cursor = 0;
            view.agent = match (view.agent, code, count) {
                (_, _, 0) => None,
                (None, KeyCode::Right, _) => Some(0),
                (None, _, c) => Some(c - 1),
                (Some(i), KeyCode::Right, c) if i + 1 < c => Some(i + 1),
                (Some(i), KeyCode::Left, _) if i > 0 => Some(i - 1),
                _ => None,
            };
        }
        _ => {}
    }
    false
}

fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(
        io::stdout(),
        LeaveAlternateScreen,
        ratatui::crossterm::cursor::Show
    );
}

/// Runs the dashboard on this thread until `stop` is set. `q` sends a graceful shutdown.
pub fn run(hub: Arc<SnapshotHub>, events: Sender<Event>, stop: Arc<AtomicBool>) -> io::Result<()> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
    enable_raw_mode()?;
    execute!(io::stdout(), EnterAlternateScreen)?;
    let result = (|| -> io::Result<()> {
        let mut terminal = Terminal::new(CrosstermBackend::new(io::stdout()))?;
        let mut view = View::default();
        let mut samples: VecDeque<(Instant, u64)> = VecDeque::new();
        let mut quitting = false;
        while !stop.load(Ordering::Acquire) {
            let snap = hub.current();
            let now = Instant::now();
            samples.push_back((now, snap.state.usage_totals.total_tokens));
            while samples
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t) > THROUGHPUT_WINDOW)
            {
                samples.pop_front();
            }
            let tps = throughput(&samples);
            terminal.draw(|f| render(f.area(), f.buffer_mut(), &snap.state, &view, tps))?;
            let deadline = Instant::now() + REFRESH;
            while let Some(wait) = deadline.checked_duration_since(Instant::now()) {
                if !event::poll(wait)? {
                    break;
                }
                if let TermEvent::Key(k) = event::read()?
                    && k.kind == KeyEventKind::Press
                {
                    if on_key(&mut view, k.code, &snap.state) && !quitting {
                        quitting = true;
                        let _ = events.send(Event::Shutdown);
                    }
                    break;
                }
            }
        }
        Ok(())
    })();
    restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::snapshot;
    use crate::orchestrator::state::{Event as E, PollReport, State, handle};
    use crate::orchestrator::testutil::{issue, settings};
    use ratatui::backend::TestBackend;

    fn payload(n: usize) -> OpsStatePayload {
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
            E::PollDone(PollReport {
                candidates: Ok(issues),
                refreshed: Ok(vec![]),
                requested: vec![],
                terminal: None,
                rate_limits: None,
            }),
        );
        let daemon = snapshot::DaemonInfo {
            owner_id: "o".into(),
            pid: 42,
            hostname: "h".into(),
            started_at: 1_000_000,
            workflow_path: "/w/WORKFLOW.md".into(),
            lock_path: "/l".into(),
            endpoint: snapshot::Endpoint {
                kind: "none".into(),
                address: None,
            },
            log_file: None,
        };
        snapshot::build(&st, &daemon, 1_002_000, 1, 0).state
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

    fn draw(s: &OpsStatePayload, view: &View) -> String {
        let mut terminal = Terminal::new(TestBackend::new(100, 20)).unwrap();
        terminal
            .draw(|f| render(f.area(), f.buffer_mut(), s, view, 12.5))
            .unwrap();
        text(terminal.backend().buffer())
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
    fn keys_move_open_details_filter_agents_and_quit() {
        let s = payload(5);
        let mut view = View::default();
        assert!(!on_key(&mut view, KeyCode::Down, &s));
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
        assert!(on_key(&mut view, KeyCode::Char('q'), &s));
        let empty = payload(0);
        assert!(draw(&empty, &View::default()).contains("Nothing running"));
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
}
