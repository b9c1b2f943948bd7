//! The terminal dashboard (ratatui over crossterm): the snapshot as lanes `run`, `rsv`, `retry`,
//! `block` (capacity) and `wait` (issues waiting for their blockers), refreshed every 250 ms, with token throughput over a 5-second rolling window.
//! Below the lanes, when the terminal has room, two panels tell what just happened: "Recent
//! runs" (the snapshot's finished runs, newest first: outcome, issue, agent, turns, tokens,
//! duration) and "Recent events" (time, event, message). The lanes keep priority: the panels get
//! only the lines the lanes leave, show as many rows as fit and disappear when too small.
//! The header's third line tells the daemon's uptime, the time to the next poll and a sparkline
//! of the token rate over the last minute (one sample a second); a fourth, while agent kinds cool
//! down after a rate limit, names each with its reset time.
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
    /// The entry's workflow, in a daemon serving several.
    pub workflow: Option<String>,
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

/// The header's line while agent kinds cool down after a rate limit: each kind (with its
/// workflow, in a daemon serving several), when its limit resets, and how far off that is.
fn cooldown_line(s: &OpsStatePayload, live: &Live) -> String {
    use crate::time::human;
    let kinds: Vec<String> = s
        .cooldowns
        .iter()
        .map(|c| {
            let kind = match &c.workflow {
                Some(w) => format!("{w}:{}", c.agent_kind),
                None => c.agent_kind.clone(),
            };
            let left = match parse_ms(&c.until) {
                Some(t) if live.now_ms > 0 && t > live.now_ms => {
                    format!(" (in {})", human(t - live.now_ms))
                }
                _ => String::new(),
            };
            format!(
                "{kind} rate limited until {} UTC{left}",
                time_of_day(&c.until)
            )
        })
        .collect();
    kinds.join(" · ")
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
    /// The entry's workflow, in a daemon serving several (`None` with one).
    pub workflow: Option<String>,
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
            workflow: r.workflow.clone(),
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
            workflow: r.workflow.clone(),
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
            workflow: r.workflow.clone(),
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
        let mut detail = vec![
            ("issue", b.issue_identifier.clone()),
            ("state", b.state.clone()),
            ("reason", b.label.to_string()),
        ];
        let mut info = b.label.to_string();
        // `agent_rate_limited`: the kind it waits for and when the earliest reset comes.
        if let Some(kind) = &b.agent_kind {
            let reset = b.reset_at.as_deref().map_or("n/a", time_of_day);
            info.push_str(&format!(" · {kind} resets {reset} UTC"));
            detail.push(("agent", kind.clone()));
            detail.push(("resets", opt(&b.reset_at)));
        }
        out.push(LaneRow {
            lane: "block",
            workflow: b.workflow.clone(),
            issue_id: None,
            issue: b.issue_identifier.clone(),
            state: b.state.clone(),
            agent: b.agent_kind.clone().unwrap_or_default(),
            info,
            detail,
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
            workflow: w.workflow.clone(),
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
    // A daemon serving several workflows: each card names its entry's first.
    for row in &mut out {
        if let Some(w) = &row.workflow {
            row.detail.insert(0, ("workflow", w.clone()));
        }
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
    // A fourth header line while an agent kind cools down.
    let head_lines = 3 + u16::from(!s.cooldowns.is_empty());
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(head_lines),
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
    if let Some(workflows) = &s.workflows {
        daemon.push_str(&format!(" · {} workflows", workflows.len()));
        for w in workflows.iter().filter(|w| w.status != "ok") {
            daemon.push_str(&format!(
                " · {} {}{}",
                w.name,
                w.status.to_uppercase(),
                w.last_error
                    .as_ref()
                    .map_or(String::new(), |e| format!(": {e}"))
            ));
        }
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
    let mut header = vec![
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
    if !s.cooldowns.is_empty() {
        header.push(Line::from(vec![
            Span::styled("cooldown ", bold()),
            Span::raw(cooldown_line(s, &live)),
        ]));
    }
    Paragraph::new(header).render(head, buf);

    let rows = rows(s, view);
    let finished: Vec<&RunPayload> = finished_runs(runs).collect();
    let areas = body_areas(body, rows.len(), finished.len(), s.recent_events.len());
    let cursor = view.cursor.min(rows.len().saturating_sub(1));
    // A `wf` column when the entries carry their workflow (a daemon serving several), as wide
    // as the longest name shown (at most 16).
    let wf_width = rows
        .iter()
        .filter_map(|r| r.workflow.as_ref())
        .map(|w| w.chars().count().clamp(2, 16) as u16)
        .max();
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
            let mut cells = vec![
                key,
                r.lane.to_string(),
                r.issue.clone(),
                r.state.clone(),
                r.agent.clone(),
                r.info.clone(),
            ];
            if wf_width.is_some() {
                cells.insert(2, r.workflow.clone().unwrap_or_default());
            }
            Row::new(cells).style(style)
        })
        .collect();
    let empty = table_rows.is_empty();
    let mut widths = vec![
        Constraint::Length(2),
        Constraint::Length(6),
        Constraint::Length(14),
        Constraint::Length(12),
        Constraint::Length(10),
        Constraint::Min(10),
    ];
    let mut headers = vec!["#", "lane", "issue", "state", "agent", ""];
    if let Some(width) = wf_width {
        widths.insert(2, Constraint::Length(width));
        headers.insert(2, "wf");
    }
    let table = Table::new(table_rows, widths)
        .header(Row::new(headers).style(bold()))
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
                // `rate_limited`, the longest outcome, whole.
                Constraint::Length(12),
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
                    workflow: row.workflow.clone(),
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
                            let sent = match &input.workflow {
                                None => events.send(Event::steer(vec![message])),
                                // Several workflows: routed by its qualified identifier, to
                                // its own workflow.
                                Some(w) => events.send(Event::Asked(
                                    crate::orchestrator::protocol::Ask::Steer {
                                        identifier: format!("{w}:{}", input.identifier),
                                        message,
                                        reply: crossbeam_channel::bounded(1).0,
                                    },
                                )),
                            };
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
mod tests;
