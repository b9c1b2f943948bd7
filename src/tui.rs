//! The terminal dashboard (ratatui over crossterm): the snapshot as lanes `run`, `rsv`, `retry`,
//! `block` (capacity) and `wait` (issues waiting for their blockers), refreshed every 250 ms, with token throughput over a 5-second rolling window.
//! Below the lanes, when the terminal has room, two panels tell what just happened: "Recent
//! runs" (the snapshot's finished runs, newest first: outcome, issue, agent, turns, tokens,
//! duration) and "Recent events" (time, event, message). The lanes keep priority: the panels get
//! only the lines the lanes leave, show as many rows as fit and disappear when too small.
//! The header's third line tells the daemon's uptime, the time to the next poll and a sparkline
//! of the token rate over the last minute (one sample a second).
//! Keys: up/down move, enter or 1-9 open a detail card, left/right cycle the agent filter, esc
//! goes back, q stops the daemon gracefully; on a running entry's card `s` opens a line to type a
//! steering message, sent with enter (the agent's next turn) or dropped with esc. Rendering is a
//! pure function of the snapshot, the view state and the live figures ([`render`]); the terminal
//! is restored on exit and on panic.

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

use crate::orchestrator::protocol::{Event, slot_name};
use crate::orchestrator::snapshot::{OpsStatePayload, RunPayload, Snapshot, SnapshotHub};
use crate::time::parse_ms;

pub const REFRESH: Duration = Duration::from_millis(250);
pub const THROUGHPUT_WINDOW: Duration = Duration::from_secs(5);
/// How many one-second token-rate samples the sparkline keeps.
pub const RATE_SAMPLES: usize = 60;

/// What the operator has selected.
#[derive(Clone, Debug, Default)]
pub struct View {
    pub cursor: usize,
    pub detail: bool,
    /// Index into the agent kinds of the running entries; `None` shows every agent.
    pub agent: Option<usize>,
    /// A steering message being typed on a running entry's card.
    pub input: Option<SteerInput>,
}

/// A steering message being typed, and the issue it is for (fixed when `s` was pressed, so
/// rows moving meanwhile do not change it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SteerInput {
    pub issue_id: String,
    pub identifier: String,
    pub text: String,
}

/// What a key asks of the dashboard's loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Act {
    Nothing,
    /// `q`: a graceful stop.
    Quit,
    /// Enter on a typed steering message: hand it to the state thread.
    Steer(SteerInput),
}

/// What moves with the clock rather than the snapshot: the token rates the loop sampled, the
/// time, and the last thing the operator's keys did.
#[derive(Clone, Debug, Default)]
pub struct Live {
    /// Over the last [`THROUGHPUT_WINDOW`].
    pub tokens_per_second: f64,
    /// Tokens per second, one sample a second, oldest first (at most [`RATE_SAMPLES`]).
    pub rates: Vec<u64>,
    /// Milliseconds since the epoch (uptime, next poll); 0 leaves them out.
    pub now_ms: u64,
    /// A line for the footer (what a steering message did).
    pub notice: Option<String>,
}

impl From<f64> for Live {
    fn from(tokens_per_second: f64) -> Live {
        Live {
            tokens_per_second,
            ..Live::default()
        }
    }
}

/// The token rates as a sparkline (`▁` for none, `█` for the busiest second), the newest on
/// the right, at most `width` samples.
pub fn sparkline(rates: &[u64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let shown = &rates[rates.len().saturating_sub(width)..];
    let max = shown.iter().copied().max().unwrap_or(0);
    shown
        .iter()
        .map(|&r| match r {
            0 => BARS[0],
            r => BARS[(1 + (r.saturating_mul(6) / max.max(1)) as usize).min(7)],
        })
        .collect()
}

/// The header's third line: uptime, the next poll, and the token-rate sparkline.
fn clock_line(s: &OpsStatePayload, live: &Live) -> String {
    use crate::time::human;
    let now = live.now_ms;
    let mut parts = Vec::new();
    if now > 0 {
        if let Some(started) = s.daemon.as_ref().and_then(|d| parse_ms(&d.started_at)) {
            parts.push(format!("up {}", human(now.saturating_sub(started))));
        }
        parts.push(if s.polling.in_flight {
            "polling now".to_string()
        } else {
            match s.polling.next_poll_at.as_deref().and_then(parse_ms) {
                Some(t) if t > now => format!("next poll in {}", human(t - now)),
                Some(_) => "next poll due".into(),
                None => "next poll n/a".into(),
            }
        });
    }
    let peak = live.rates.iter().copied().max().unwrap_or(0);
    parts.push(if live.rates.is_empty() {
        "tok/s: sampling".to_string()
    } else {
        format!(
            "tok/s (last {} s) {} peak {peak}",
            live.rates.len(),
            sparkline(&live.rates, RATE_SAMPLES)
        )
    });
    parts.join(" · ")
}

/// What the dashboard draws: the published state and the runs behind it. Built from a whole
/// [`Snapshot`] (what the daemon's dashboard does) or from its state alone, which has no run
/// history and so draws no "Recent runs" panel (svc-bench renders frames that way).
#[derive(Clone, Copy, Debug)]
pub struct DashboardData<'a> {
    pub state: &'a OpsStatePayload,
    /// The snapshot's runs: live ones first, then the history, newest first. Only the finished
    /// ones are drawn below the lanes; the live ones already have their lane rows.
    pub runs: &'a [RunPayload],
}

impl<'a> From<&'a Snapshot> for DashboardData<'a> {
    fn from(snapshot: &'a Snapshot) -> Self {
        DashboardData {
            state: &snapshot.state,
            runs: &snapshot.runs,
        }
    }
}

impl<'a> From<&'a OpsStatePayload> for DashboardData<'a> {
    fn from(state: &'a OpsStatePayload) -> Self {
        DashboardData { state, runs: &[] }
    }
}

/// One lane row.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneRow {
    pub lane: &'static str,
    /// The issue's id, for the rows a steering message can go to (lane `run`).
    pub issue_id: Option<String>,
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

/// The first lines of a running entry's detail card (lanes `run` and `rsv`).
fn run_head(r: &crate::orchestrator::snapshot::RunningEntryPayload) -> Vec<(&'static str, String)> {
    let mut head = vec![(
        "issue",
        format!("{} ({})", r.issue_identifier, r.issue_title),
    )];
    if r.ensemble_size > 1 {
        head.push(("slot", format!("{} of {}", r.slot_index, r.ensemble_size)));
    }
    head.extend([
        ("state", r.state.clone()),
        ("agent", r.agent_kind.clone()),
        ("run", r.run_id.clone()),
    ]);
    head
}

/// A running entry's steering: turns delivered, what waits, and the last message.
fn steering_line(r: &crate::orchestrator::snapshot::RunningEntryPayload) -> String {
    let mut line = format!("{} turn(s)", r.steering_turns);
    if r.steering_pending > 0 {
        line.push_str(&format!(" · {} waiting", r.steering_pending));
    }
    if let Some(last) = &r.last_steering {
        line.push_str(&format!(
            " · last from {} ({}): {}",
            last.author, last.source, last.text
        ));
    }
    line
}

/// The rows in lane order, filtered by the selected agent.
pub fn rows(s: &OpsStatePayload, view: &View) -> Vec<LaneRow> {
    let filter = view.agent.and_then(|i| agents(s).get(i).cloned());
    let mut out = Vec::new();
    let shown = |r: &&crate::orchestrator::snapshot::RunningEntryPayload| {
        filter.as_ref().is_none_or(|f| *f == r.agent_kind)
    };
    for r in s.running.iter().filter(shown).filter(|r| !r.reserving) {
        out.push(LaneRow {
            lane: "run",
            issue_id: Some(r.issue_id.clone()),
            issue: slot_name(&r.issue_identifier, r.slot_index, r.ensemble_size),
            state: r.state.clone(),
            agent: r.agent_kind.clone(),
            info: format!(
                "turn {} · {} tok{} · {}",
                r.turn_count,
                r.tokens.total_tokens,
                if r.spend.cost_usd > 0.0 {
                    format!(" · issue ${:.2}", r.spend.cost_usd)
                } else {
                    String::new()
                },
                opt(&r.last_event)
            ),
            detail: [
                run_head(r),
                vec![
                    ("session", opt(&r.session_id)),
                    ("turns", r.turn_count.to_string()),
                    (
                        "tokens",
                        format!(
                            "{} in · {} out · {} total{}",
                            r.tokens.input_tokens,
                            r.tokens.output_tokens,
                            r.tokens.total_tokens,
                            if r.spend.runs > 0 {
                                format!(
                                    " · issue: {} tokens, ${:.6}, {} runs",
                                    r.spend.total_tokens, r.spend.cost_usd, r.spend.runs
                                )
                            } else {
                                String::new()
                            }
                        ),
                    ),
                    ("pid", opt(&r.executor_pid)),
                    ("workspace", r.workspace_path.clone()),
                    ("started", r.started_at.clone()),
                    ("last event", opt(&r.last_event)),
                    ("last message", opt(&r.last_message)),
                    ("steering", steering_line(r)),
                    (
                        "worker",
                        r.worker_host.clone().unwrap_or_else(|| "this host".into()),
                    ),
                ],
            ]
            .concat(),
        });
    }
    // Runs acquiring a slot on the worker pool.
    for r in s.running.iter().filter(shown).filter(|r| r.reserving) {
        out.push(LaneRow {
            lane: "rsv",
            issue_id: None,
            issue: slot_name(&r.issue_identifier, r.slot_index, r.ensemble_size),
            state: r.state.clone(),
            agent: r.agent_kind.clone(),
            info: "acquiring a worker slot".into(),
            detail: [
                run_head(r),
                vec![
                    ("slot", "being acquired from the worker pool".into()),
                    ("started", r.started_at.clone()),
                ],
            ]
            .concat(),
        });
    }
    for r in &s.retrying {
        out.push(LaneRow {
            lane: "retry",
            issue_id: None,
            issue: slot_name(&r.issue_identifier, r.slot_index, r.ensemble_size),
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
            issue_id: None,
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
    for w in &s.waiting_on_blockers {
        let blockers: Vec<String> = w
            .blockers
            .iter()
            .map(|b| format!("{} ({})", b.identifier, b.state))
            .collect();
        let blockers = blockers.join(", ");
        let cycle = if w.cycle {
            " · a cycle of blockers"
        } else {
            ""
        };
        out.push(LaneRow {
            lane: "wait",
            issue_id: None,
            issue: w.issue_identifier.clone(),
            state: w.state.clone(),
            agent: String::new(),
            info: format!("blocked by {blockers}{cycle}"),
            detail: vec![
                ("issue", w.issue_identifier.clone()),
                ("state", w.state.clone()),
                ("waits for", blockers),
                ("cycle", if w.cycle { "yes" } else { "no" }.into()),
            ],
        });
    }
    out
}

/// Lines a table with a top border (carrying the title) and a header row takes before its first
/// data row.
const TABLE_CHROME_LINES: u16 = 2;

/// The fewest lines a panel below the lanes is drawn with: its border, its header and one row.
/// With less room a panel is left out rather than drawn as a title with nothing under it.
const PANEL_MIN_LINES: u16 = TABLE_CHROME_LINES + 1;

/// Where the parts of the body go: the lanes at the top, then the optional panels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyAreas {
    pub lanes: Rect,
    pub recent_runs: Option<Rect>,
    pub recent_events: Option<Rect>,
}

/// Splits the body between the lanes and the two panels below them. The lanes come first and
/// take what they need (their chrome plus one line per row, or one line for the "nothing" message
/// when empty), even the whole body; the panels share what is left. Neither panel takes more than
/// it can fill; recent events get at most half of the rest unless recent runs need less, and a
/// panel that would get fewer than [`PANEL_MIN_LINES`] is left out, its room going to the other.
pub fn body_areas(
    body: Rect,
    lane_rows: usize,
    finished_runs: usize,
    recent_events: usize,
) -> BodyAreas {
    let wanted =
        |rows: usize| TABLE_CHROME_LINES.saturating_add(rows.min(u16::MAX as usize) as u16);
    let lanes_height = wanted(lane_rows.max(1)).min(body.height);
    let lanes = Rect {
        height: lanes_height,
        ..body
    };
    let left = body.height - lanes_height;
    let runs_want = if finished_runs > 0 {
        wanted(finished_runs)
    } else {
        0
    };
    let events_want = if recent_events > 0 {
        wanted(recent_events)
    } else {
        0
    };
    let events_share = events_want.min(left / 2);
    let mut runs_height = runs_want.min(left - events_share);
    let mut events_height = events_want.min(left - runs_height);
    if events_height < PANEL_MIN_LINES {
        events_height = 0;
        runs_height = runs_want.min(left);
    }
    if runs_height < PANEL_MIN_LINES {
        runs_height = 0;
        events_height = events_want.min(left);
        if events_height < PANEL_MIN_LINES {
            events_height = 0;
        }
    }
    let mut y = lanes.y + lanes_height;
    let mut take = |height: u16| {
        (height > 0).then(|| {
            let area = Rect { y, height, ..body };
            y += height;
            area
        })
    };
    let recent_runs = take(runs_height);
    let recent_events = take(events_height);
    BodyAreas {
        lanes,
        recent_runs,
        recent_events,
    }
}

/// The finished runs among the snapshot's runs (newest first, as the history keeps them).
pub fn finished_runs(runs: &[RunPayload]) -> impl Iterator<Item = &RunPayload> {
    runs.iter().filter(|r| r.outcome != "running")
}

/// The time of day of an RFC 3339 timestamp (`10:04:05` of `2026-11-24T10:04:05.123Z`), or the
/// whole text when it is not one. Snapshot times are UTC.
fn time_of_day(rfc3339: &str) -> &str {
    match rfc3339.get(11..19) {
        Some(t) if rfc3339.as_bytes().get(10) == Some(&b'T') => t,
        _ => rfc3339,
    }
}

fn bold() -> Style {
    Style::new().add_modifier(Modifier::BOLD)
}

/// A panel's frame: a top border carrying the title, like the lanes' separator.
fn panel_block(title: &str) -> Block<'_> {
    Block::default()
        .borders(Borders::TOP)
        .title(Span::styled(format!(" {title} "), bold()))
}

/// Draws the whole dashboard into `buf`. A pure function of its arguments.
pub fn render<'a>(
    area: Rect,
    buf: &mut Buffer,
    data: impl Into<DashboardData<'a>>,
    view: &View,
    live: impl Into<Live>,
) {
    let live = live.into();
    let tokens_per_second = live.tokens_per_second;
    let DashboardData { state: s, runs } = data.into();
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
    let mut daemon = s.daemon.as_ref().map_or_else(String::new, |d| {
        format!("pid {} · {}", d.pid, d.workflow_path)
    });
    if s.fleet.len() > 1 {
        let stale = s.fleet.iter().filter(|m| m.stale).count();
        daemon.push_str(&format!(
            " · fleet {} daemons, {} running{}",
            s.fleet.len(),
            s.fleet.iter().map(|m| m.running).sum::<u32>(),
            if stale > 0 {
                format!(", {stale} STALE")
            } else {
                String::new()
            }
        ));
    }
    if s.ledger.today.cost_usd > 0.0 || s.ledger.daily_budget_usd.is_some() {
        daemon.push_str(&format!(
            " · today ${:.2}{}",
            s.ledger.today.cost_usd,
            match s.ledger.daily_budget_usd {
                Some(b) if s.ledger.daily_budget_reached => format!(" of ${b} REACHED"),
                Some(b) => format!(" of ${b}"),
                None => String::new(),
            }
        ));
    }
    if let Some(p) = &s.worker_pool {
        daemon.push_str(&format!(
            " · pool {}: {} live, {} idle, {} leased, {} worker-s{}",
            p.driver,
            p.live,
            p.idle,
            p.leased,
            p.spend.worker_seconds,
            p.capped
                .as_ref()
                .map_or(String::new(), |c| format!(" · CAPPED: {c}"))
        ));
    }
    let header = vec![
        Line::from(vec![
            Span::styled("svc ", bold()),
            Span::raw(format!(
                "run {} · retry {} · block {} · wait {} · tokens {} in / {} out · {:.1} tok/s (5 s) · {agent_label}",
                s.counts.running,
                s.counts.retrying,
                s.counts.blocked,
                s.waiting_on_blockers.len(),
                s.usage_totals.input_tokens,
                s.usage_totals.output_tokens,
                tokens_per_second
            )),
        ]),
        Line::from(Span::styled(
            daemon,
            Style::new().add_modifier(Modifier::DIM),
        )),
        Line::from(clock_line(s, &live)),
    ];
    Paragraph::new(header).render(head, buf);

    let rows = rows(s, view);
    let finished: Vec<&RunPayload> = finished_runs(runs).collect();
    let areas = body_areas(body, rows.len(), finished.len(), s.recent_events.len());
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
    .header(Row::new(vec!["#", "lane", "issue", "state", "agent", ""]).style(bold()))
    .block(Block::default().borders(Borders::TOP));
    table.render(areas.lanes, buf);
    // The message takes the line of the first row, so empty lanes cost three lines, not the
    // screen; it is left out when the lanes got fewer lines than that.
    if empty && areas.lanes.height > TABLE_CHROME_LINES {
        let msg = Rect {
            y: areas.lanes.y + TABLE_CHROME_LINES,
            height: 1,
            ..areas.lanes
        };
        Paragraph::new("Nothing running, retrying or blocked.").render(msg, buf);
    }

    if let Some(panel) = areas.recent_runs {
        let fits = usize::from(panel.height - TABLE_CHROME_LINES);
        let run_rows: Vec<Row> = finished
            .iter()
            .take(fits)
            .map(|r| {
                Row::new(vec![
                    r.outcome.to_string(),
                    r.issue_identifier.clone(),
                    r.agent_kind.clone(),
                    r.turn_count.to_string(),
                    r.tokens.total_tokens.to_string(),
                    // The same format as `svc runs`, so the two read alike.
                    crate::runs_client::duration(&serde_json::Value::from(r.duration_ms)),
                ])
            })
            .collect();
        Table::new(
            run_rows,
            [
                Constraint::Length(9),
                Constraint::Length(14),
                Constraint::Length(10),
                Constraint::Length(6),
                Constraint::Length(10),
                Constraint::Min(8),
            ],
        )
        .header(
            Row::new(vec![
                "outcome", "issue", "agent", "turns", "tokens", "duration",
            ])
            .style(bold()),
        )
        .block(panel_block("Recent runs"))
        .render(panel, buf);
    }

    if let Some(panel) = areas.recent_events {
        let fits = usize::from(panel.height - TABLE_CHROME_LINES);
        let shown = &s.recent_events[..fits.min(s.recent_events.len())];
        // The event column is as wide as the longest name shown (never cut); the message takes
        // what is left, and at least a third of the panel.
        let longest = shown.iter().map(|e| e.event.chars().count()).max();
        let event_width = longest
            .unwrap_or(0)
            .max("event".len())
            .min(usize::from(panel.width / 3).max("event".len())) as u16;
        let event_rows: Vec<Row> = shown
            .iter()
            .map(|e| {
                Row::new(vec![
                    time_of_day(&e.at).to_string(),
                    e.event.clone(),
                    e.message.clone(),
                ])
            })
            .collect();
        Table::new(
            event_rows,
            [
                Constraint::Length(10),
                Constraint::Length(event_width),
                Constraint::Min(10),
            ],
        )
        .header(Row::new(vec!["time (UTC)", "event", "message"]).style(bold()))
        .block(panel_block("Recent events"))
        .render(panel, buf);
    }

    let last = match &live.notice {
        Some(notice) => Line::from(Span::styled(notice.clone(), bold())),
        None => Line::from(Span::styled(
            s.recent_events.first().map_or_else(String::new, |e| {
                format!("{} {}: {}", e.at, e.event, e.message)
            }),
            Style::new().add_modifier(Modifier::DIM),
        )),
    };
    let keys = if view.input.is_some() {
        "type the message · enter send · esc drop it"
    } else {
        "↑/↓ move · enter or 1-9 details · s steer (running card) · ←/→ agent · esc back · q quit"
    };
    Paragraph::new(vec![last, Line::from(keys)]).render(foot, buf);

    if view.detail
        && let Some(r) = rows.get(cursor)
    {
        // The card covers the body from its second line, panels included, and never leaves it.
        let w = body.width.saturating_sub(4).min(100);
        let typing = view.input.is_some() && r.lane == "run";
        // The steering line (lane `run`): what is typed, or the hint.
        let extra = u16::from(r.lane == "run");
        let h = (r.detail.len() as u16 + 2 + extra).min(body.height.saturating_sub(1));
        let card = Rect {
            x: body.x + 2.min(body.width),
            y: body.y + 1.min(body.height),
            width: w,
            height: h,
        };
        Clear.render(card, buf);
        let mut lines: Vec<Line> = r
            .detail
            .iter()
            .map(|(k, v)| {
                Line::from(vec![
                    Span::styled(format!("{k:<13}"), bold()),
                    Span::raw(v.clone()),
                ])
            })
            .collect();
        // What is typed goes first, so a short terminal never hides it; the hint goes last
        // (the footer names the key too).
        if typing && let Some(input) = &view.input {
            lines.insert(
                0,
                Line::from(vec![
                    Span::styled("steer> ", bold()),
                    Span::raw(format!("{}█", input.text)),
                ]),
            );
        } else if r.lane == "run" {
            lines.push(Line::from(Span::styled(
                "s: send a steering message to this agent",
                Style::new().add_modifier(Modifier::DIM),
            )));
        }
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

/// Applies a key; says what the loop should do (quit, send a steering message). While a
/// steering message is typed every key goes to it.
pub fn on_key(view: &mut View, code: KeyCode, s: &OpsStatePayload) -> Act {
    if let Some(input) = &mut view.input {
        match code {
            // As `POST .../steer`, a message takes at most STEER_MAX bytes; keys past it are dropped.
            KeyCode::Char(c) if input.text.len() + c.len_utf8() <= crate::steering::STEER_MAX => {
                input.text.push(c)
            }
            KeyCode::Char(_) => {}
            KeyCode::Backspace => {
                input.text.pop();
            }
            KeyCode::Esc => view.input = None,
            KeyCode::Enter => {
                let input = view.input.take().unwrap_or_default();
                if !input.text.trim().is_empty() {
                    return Act::Steer(input);
                }
            }
            _ => {}
        }
        return Act::Nothing;
    }
    let all = rows(s, view);
    let n = all.len();
    match code {
        KeyCode::Char('q') => return Act::Quit,
        KeyCode::Char('s') if view.detail => {
            if let Some(row) = all.get(view.cursor.min(n.saturating_sub(1)))
                && let Some(issue_id) = &row.issue_id
            {
                view.input = Some(SteerInput {
                    issue_id: issue_id.clone(),
                    identifier: row.issue.clone(),
                    text: String::new(),
                });
            }
        }
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
    Act::Nothing
}

/// The steering message a typed line becomes: source `tui`, from `$USER` (else `operator`).
pub fn steering_message(input: &SteerInput, now_ms: u64) -> crate::steering::Message {
    let author = std::env::var("USER")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "operator".into());
    crate::steering::Message::operator(
        input.issue_id.clone(),
        crate::steering::Source::Tui,
        author,
        input.text.clone(),
        now_ms,
    )
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
        let mut live = Live::default();
        let mut rates: VecDeque<u64> = VecDeque::new();
        let mut last_second: Option<(Instant, u64)> = None;
        let mut notice_until = Instant::now();
        while !stop.load(Ordering::Acquire) {
            let snap = hub.current();
            let now = Instant::now();
            let total = snap.state.usage_totals.total_tokens;
            samples.push_back((now, total));
            while samples
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t) > THROUGHPUT_WINDOW)
            {
                samples.pop_front();
            }
            // One rate sample a second for the sparkline.
            match last_second {
                Some((at, tokens)) if now.duration_since(at) >= Duration::from_secs(1) => {
                    let secs = now.duration_since(at).as_secs_f64();
                    rates.push_back((total.saturating_sub(tokens) as f64 / secs).round() as u64);
                    if rates.len() > RATE_SAMPLES {
                        rates.pop_front();
                    }
                    last_second = Some((now, total));
                }
                None => last_second = Some((now, total)),
                _ => {}
            }
            live.tokens_per_second = throughput(&samples);
            live.rates = rates.iter().copied().collect();
            live.now_ms = crate::time::unix_ms();
            if now >= notice_until {
                live.notice = None;
            }
            terminal.draw(|f| render(f.area(), f.buffer_mut(), &*snap, &view, live.clone()))?;
            let deadline = Instant::now() + REFRESH;
            while let Some(wait) = deadline.checked_duration_since(Instant::now()) {
                if !event::poll(wait)? {
                    break;
                }
                if let TermEvent::Key(k) = event::read()?
                    && k.kind == KeyEventKind::Press
                {
                    match on_key(&mut view, k.code, &snap.state) {
                        Act::Quit if !quitting => {
                            quitting = true;
                            let _ = events.send(Event::Shutdown);
                        }
                        Act::Steer(input) => {
                            let message = steering_message(&input, live.now_ms);
                            let sent = events.send(Event::steer(vec![message]));
                            live.notice = Some(match sent {
                                Ok(()) => format!(
                                    "steering message sent to {}: the agent's next turn",
                                    input.identifier
                                ),
                                Err(_) => "the daemon is stopping: the message was not sent".into(),
                            });
                            notice_until = Instant::now() + Duration::from_secs(8);
                        }
                        _ => {}
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
            .find(|r| r.issue.identifier == identifier)
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
            &run.issue.identifier,
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
            ("rsv", st.running[&reserving].issue.identifier.clone())
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
}
