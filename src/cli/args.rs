//! Command-line parsing with lexopt. Each command's flags are declared once (name, value,
//! help) and every command once in [`COMMANDS`]: the parsers accept no long flag that is not
//! declared there, and the help text, "did you mean" suggestions, the shell completions and the
//! man page (`super::docs`) are generated from those declarations.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

/// One flag: `--long`, an optional value placeholder, and its help line.
pub struct Flag {
    pub long: &'static str,
    pub value: Option<&'static str>,
    pub help: &'static str,
}

const HELP: Flag = Flag {
    long: "help",
    value: None,
    help: "Print this help",
};

pub const DAEMON_FLAGS: &[Flag] = &[
    Flag {
        long: "no-tui",
        value: None,
        help: "Do not draw the terminal dashboard; print snapshot JSON lines instead",
    },
    Flag {
        long: "no-dashboard",
        value: None,
        help: "Do not start the HTTP server (web dashboard, API, MCP endpoint)",
    },
    Flag {
        long: "port",
        value: Some("N"),
        help: "HTTP port (overrides server.port; 0 picks a free port)",
    },
    Flag {
        long: "logs-root",
        value: Some("PATH"),
        help: "Write logs to PATH/log/svc.log",
    },
    Flag {
        long: "once",
        value: None,
        help: "Poll and dispatch once, wait for those runs, exit 0 if all succeeded, else 1",
    },
    Flag {
        long: "dry-run",
        value: None,
        help: "Print what each poll would dispatch and why not; start nothing, write nothing",
    },
    Flag {
        long: "version",
        value: None,
        help: "Print the version, commit, target and whether libpq is found",
    },
    HELP,
];

pub const DOCTOR_FLAGS: &[Flag] = &[
    Flag {
        long: "json",
        value: None,
        help: "Print the checks as JSON",
    },
    Flag {
        long: "online",
        value: None,
        help: "Also make one authenticated request to the tracker",
    },
    HELP,
];

pub const RUNS_FLAGS: &[Flag] = &[
    Flag {
        long: "issue",
        value: Some("ID"),
        help: "Only runs of this issue (identifier or id)",
    },
    Flag {
        long: "failed",
        value: None,
        help: "Only failed or stalled runs",
    },
    Flag {
        long: "cost",
        value: None,
        help: "Token cost table per agent, with the top runs",
    },
    Flag {
        long: "spend",
        value: None,
        help: "Issues by what they spent (every run, retry and daemon), with today's spend",
    },
    Flag {
        long: "retries",
        value: None,
        help: "Issues that needed retries",
    },
    Flag {
        long: "id",
        value: Some("RUN"),
        help: "One run and up to 10 related attempts",
    },
    Flag {
        long: "limit",
        value: Some("N"),
        help: "Number of runs to list (positive; default 20)",
    },
    Flag {
        long: "workflow",
        value: Some("NAME"),
        help: "Only the runs of this workflow (a daemon serving several)",
    },
    Flag {
        long: "url",
        value: Some("URL"),
        help: "API base URL of the daemon (wins over --port)",
    },
    Flag {
        long: "port",
        value: Some("PORT"),
        help: "Port of the daemon on server.host",
    },
    Flag {
        long: "json",
        value: None,
        help: "Print the raw JSON body",
    },
    HELP,
];

#[derive(Debug, Default, PartialEq, Eq)]
pub struct DoctorArgs {
    pub json: bool,
    pub online: bool,
    /// Workflow files and directories of them (none: the default workflow).
    pub workflows: Vec<PathBuf>,
}

// Each command's parsed arguments are its own module's type: the commands sit below the
// command line, which builds them.
pub use crate::control_client::{Action, ControlArgs, StatusArgs, SteerArgs};
pub use crate::daemon::DaemonArgs;
pub use crate::runs_client::RunsArgs;

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Daemon(DaemonArgs),
    Doctor(DoctorArgs),
    Runs(RunsArgs),
    Steer(SteerArgs),
    Status(StatusArgs),
    Control(ControlArgs),
    /// `svc store copy <FROM> <TO>`: a claim store's contents into another.
    StoreCopy {
        from: String,
        to: String,
    },
    /// The scripted ACP agent built into svc (see `demo_agent`).
    DemoAgent,
    Help(&'static str),
    Version,
    /// `svc completions bash|zsh|fish`.
    Completions(Shell),
    /// `svc man`: the man page (roff).
    Man,
}

/// A shell `svc completions` writes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// One command of `svc`: the table the parsers, `--help`, the completions and the man page are
/// made from. `name` is empty for the daemon itself (`svc [OPTIONS] [WORKFLOW|DIR]...`).
pub struct CommandSpec {
    pub name: &'static str,
    pub usage: &'static str,
    pub about: &'static str,
    pub flags: &'static [Flag],
    /// The words its first argument can be (completions), when it is not a file.
    pub words: &'static [&'static str],
}

pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "",
        usage: "svc [OPTIONS] [WORKFLOW|DIR]...",
        about: "Run the daemon on the workflows (files, or directories of *.md workflows)",
        flags: DAEMON_FLAGS,
        words: &[],
    },
    CommandSpec {
        name: "doctor",
        usage: "svc doctor [--json] [--online] [WORKFLOW|DIR]...",
        about: "Check the workflows and their prerequisites",
        flags: DOCTOR_FLAGS,
        words: &[],
    },
    CommandSpec {
        name: "runs",
        usage: "svc runs [OPTIONS] [WORKFLOW.md|DIR]",
        about: "Show runs of a running daemon",
        flags: RUNS_FLAGS,
        words: &[],
    },
    CommandSpec {
        name: "status",
        usage: "svc status [OPTIONS] [WORKFLOW.md|DIR]",
        about: "One screen about the running daemon (--json, --open)",
        flags: STATUS_FLAGS,
        words: &[],
    },
    CommandSpec {
        name: "refresh",
        usage: "svc refresh [OPTIONS] [WORKFLOW.md|DIR]",
        about: "Ask the running daemon to poll now",
        flags: CONTROL_FLAGS,
        words: &[],
    },
    CommandSpec {
        name: "stop",
        usage: "svc stop [OPTIONS] [WORKFLOW.md|DIR]",
        about: "Stop the running daemon gracefully",
        flags: CONTROL_FLAGS,
        words: &[],
    },
    CommandSpec {
        name: "open",
        usage: "svc open [OPTIONS] [WORKFLOW.md|DIR]",
        about: "Print the dashboard URL with the control token",
        flags: CONTROL_FLAGS,
        words: &[],
    },
    CommandSpec {
        name: "steer",
        usage: "svc steer [OPTIONS] <ISSUE> <MESSAGE|-> [WORKFLOW.md|DIR]",
        about: "Send a message to a running agent",
        flags: STEER_FLAGS,
        words: &[],
    },
    CommandSpec {
        name: "store",
        usage: "svc store copy <FROM> <TO>",
        about: "Copy a claim store into another (SQLite <-> PostgreSQL)",
        flags: &[HELP],
        words: &["copy"],
    },
    CommandSpec {
        name: "completions",
        usage: "svc completions bash|zsh|fish",
        about: "Print the shell completions",
        flags: &[HELP],
        words: &["bash", "zsh", "fish"],
    },
    CommandSpec {
        name: "man",
        usage: "svc man",
        about: "Print the man page (roff)",
        flags: &[HELP],
        words: &[],
    },
    CommandSpec {
        name: "demo-agent",
        usage: "svc demo-agent",
        about: "A scripted ACP agent for demos and tests (speaks ACP on stdio)",
        flags: &[],
        words: &[],
    },
];

/// The next argument, refusing a long flag that `flags` does not declare: a flag the parser
/// matches must be in the table, so help, completions and man page cannot miss it.
fn next_arg<'a>(
    p: &'a mut lexopt::Parser,
    command: &'static str,
    flags: &[Flag],
) -> Result<Option<lexopt::Arg<'a>>, UsageError> {
    let arg = p.next().map_err(|e| usage(command, e.to_string(), None))?;
    match arg {
        Some(lexopt::Arg::Long(name)) if !flags.iter().any(|f| f.long == name) => {
            Err(unknown(command, flags, lexopt::Arg::Long(name)))
        }
        other => Ok(other),
    }
}

/// A usage error: what is wrong and, when there is one, the nearest valid spelling.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError {
    pub message: String,
    pub suggestion: Option<String>,
    pub command: &'static str,
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(s) = &self.suggestion {
            write!(f, "; did you mean {s}?")?;
        }
        Ok(())
    }
}

fn subcommands() -> impl Iterator<Item = &'static str> {
    COMMANDS.iter().map(|c| c.name).filter(|n| !n.is_empty())
}

pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    let args: Vec<OsString> = args.into_iter().collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("doctor") => parse_doctor(args[1..].to_vec()),
        Some("runs") => parse_runs(args[1..].to_vec()),
        Some("steer") => parse_steer(args[1..].to_vec()),
        Some("status") => parse_status(args[1..].to_vec()),
        Some("refresh") => parse_control(Action::Refresh, args[1..].to_vec()),
        Some("stop") => parse_control(Action::Stop, args[1..].to_vec()),
        Some("open") => parse_control(Action::Open, args[1..].to_vec()),
        Some("store") => parse_store(args[1..].to_vec()),
        Some("demo-agent") => Ok(Command::DemoAgent),
        Some("completions") => parse_completions(&args[1..]),
        Some("man") => parse_man(&args[1..]),
        Some("help") => Ok(Command::Help(top_help())),
        _ => parse_daemon(args),
    }
}

fn usage(command: &'static str, message: String, suggestion: Option<String>) -> UsageError {
    UsageError {
        message,
        suggestion,
        command,
    }
}

fn unknown(command: &'static str, flags: &[Flag], arg: lexopt::Arg) -> UsageError {
    match arg {
        lexopt::Arg::Long(name) => {
            let suggestion = nearest(name, flags.iter().map(|f| f.long)).map(|s| format!("--{s}"));
            usage(command, format!("unknown flag --{name}"), suggestion)
        }
        lexopt::Arg::Short(c) => {
            let suggestion = flags
                .iter()
                .find(|f| f.long.starts_with(c))
                .map(|f| format!("--{}", f.long));
            usage(command, format!("unknown flag -{c}"), suggestion)
        }
        lexopt::Arg::Value(v) => usage(
            command,
            format!("unexpected argument {}", v.to_string_lossy()),
            None,
        ),
    }
}

/// The candidate closest to `input` by edit distance, if it is close enough to be a typo.
pub fn nearest<'a>(input: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(input, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3) || c.starts_with(input) || input.starts_with(c))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// An API base URL flag (`--url`): http or https, without a trailing slash.
fn url_flag(
    command: &'static str,
    raw: Result<OsString, lexopt::Error>,
) -> Result<String, UsageError> {
    let s = value_str(command, "url", raw)?;
    if !(s.starts_with("http://") || s.starts_with("https://")) {
        return Err(usage(
            command,
            format!("--url must start with http:// or https:// (got {s:?})"),
            None,
        ));
    }
    Ok(s.trim_end_matches('/').to_string())
}

/// A port flag (`--port`): 0-65535.
fn port_flag(
    command: &'static str,
    raw: Result<OsString, lexopt::Error>,
) -> Result<u16, UsageError> {
    let s = value_str(command, "port", raw)?;
    s.parse::<u16>().map_err(|_| {
        usage(
            command,
            format!("--port must be a non-negative integer up to 65535 (got {s:?})"),
            None,
        )
    })
}

/// The port of a running daemon (`--port` of the operator's commands): 1-65535.
fn daemon_port(
    command: &'static str,
    raw: Result<OsString, lexopt::Error>,
) -> Result<u16, UsageError> {
    let port = port_flag(command, raw)?;
    if port == 0 {
        return Err(usage(
            command,
            "--port must be 1-65535 (got \"0\")".into(),
            None,
        ));
    }
    Ok(port)
}

fn value_str(
    command: &'static str,
    flag: &str,
    raw: Result<OsString, lexopt::Error>,
) -> Result<String, UsageError> {
    let raw = raw.map_err(|_| usage(command, format!("--{flag} needs a value"), None))?;
    raw.into_string()
        .map_err(|_| usage(command, format!("--{flag} must be valid UTF-8"), None))
}

fn port_value(
    command: &'static str,
    flag: &str,
    raw: Result<OsString, lexopt::Error>,
) -> Result<u16, UsageError> {
    let s = value_str(command, flag, raw)?;
    s.parse().map_err(|_| {
        usage(
            command,
            format!("--{flag} must be a port number from 0 to 65535 (got {s:?})"),
            None,
        )
    })
}

fn positional(
    command: &'static str,
    slot: &mut Option<PathBuf>,
    value: OsString,
) -> Result<(), UsageError> {
    if slot.is_some() {
        let hint = (command == "svc")
            .then(|| nearest(&value.to_string_lossy(), subcommands()).map(str::to_string))
            .flatten();
        return Err(usage(
            command,
            format!(
                "unexpected argument {}: only one workflow file may be given",
                value.to_string_lossy()
            ),
            hint,
        ));
    }
    *slot = Some(PathBuf::from(value));
    Ok(())
}

fn parse_daemon(args: Vec<OsString>) -> Result<Command, UsageError> {
    use lexopt::prelude::*;
    let mut out = DaemonArgs::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = next_arg(&mut p, "svc", DAEMON_FLAGS)? {
        match arg {
            Long("no-tui") => out.no_tui = true,
            Long("no-dashboard") => out.no_dashboard = true,
            Long("once") => out.once = true,
            Long("dry-run") => out.dry_run = true,
            Long("port") => out.port = Some(port_value("svc", "port", p.value())?),
            Long("logs-root") => {
                out.logs_root = Some(PathBuf::from(value_str("svc", "logs-root", p.value())?))
            }
            Long("version") | Short('V') => return Ok(Command::Version),
            Long("help") | Short('h') => return Ok(Command::Help(daemon_help())),
            Value(v) => out.workflows.push(PathBuf::from(v)),
            other => return Err(unknown("svc", DAEMON_FLAGS, other)),
        }
    }
    Ok(Command::Daemon(out))
}

fn parse_doctor(args: Vec<OsString>) -> Result<Command, UsageError> {
    use lexopt::prelude::*;
    let mut out = DoctorArgs::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = next_arg(&mut p, "svc doctor", DOCTOR_FLAGS)? {
        match arg {
            Long("json") => out.json = true,
            Long("online") => out.online = true,
            Long("help") | Short('h') => return Ok(Command::Help(doctor_help())),
            Value(v) => out.workflows.push(PathBuf::from(v)),
            other => return Err(unknown("svc doctor", DOCTOR_FLAGS, other)),
        }
    }
    Ok(Command::Doctor(out))
}

fn parse_runs(args: Vec<OsString>) -> Result<Command, UsageError> {
    use lexopt::prelude::*;
    const C: &str = "svc runs";
    let mut out = RunsArgs::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = next_arg(&mut p, C, RUNS_FLAGS)? {
        match arg {
            Long("issue") => out.issue = Some(value_str(C, "issue", p.value())?),
            Long("failed") => out.failed = true,
            Long("cost") => out.cost = true,
            Long("spend") => out.spend = true,
            Long("retries") => out.retries = true,
            Long("id") => out.id = Some(value_str(C, "id", p.value())?),
            Long("limit") => {
                let s = value_str(C, "limit", p.value())?;
                let n: u32 = s.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                    usage(
                        C,
                        format!("--limit must be a positive integer (got {s:?})"),
                        None,
                    )
                })?;
                out.limit = Some(n);
            }
            Long("workflow") => {
                let name = value_str(C, "workflow", p.value())?;
                if name.is_empty() {
                    return Err(usage(C, "--workflow needs a workflow's name".into(), None));
                }
                out.workflow_name = Some(name);
            }
            Long("url") => out.url = Some(url_flag(C, p.value())?),
            Long("port") => out.port = Some(port_flag(C, p.value())?),
            Long("json") => out.json = true,
            Long("help") | Short('h') => return Ok(Command::Help(runs_help())),
            Value(v) => positional(C, &mut out.workflow, v)?,
            other => return Err(unknown(C, RUNS_FLAGS, other)),
        }
    }
    Ok(Command::Runs(out))
}

pub const STEER_FLAGS: &[Flag] = &[
    Flag {
        long: "author",
        value: Some("NAME"),
        help: "Who the message is from (default: $USER, else operator)",
    },
    DAEMON_URL,
    DAEMON_PORT,
    HELP,
];

fn parse_steer(args: Vec<OsString>) -> Result<Command, UsageError> {
    use lexopt::prelude::*;
    const C: &str = "svc steer";
    let mut out = SteerArgs::default();
    let mut words: Vec<String> = Vec::new();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = next_arg(&mut p, C, STEER_FLAGS)? {
        match arg {
            Long("author") => out.author = Some(value_str(C, "author", p.value())?),
            Long("url") => out.url = Some(url_flag(C, p.value())?),
            Long("port") => out.port = Some(daemon_port(C, p.value())?),
            Long("help") | Short('h') => return Ok(Command::Help(steer_help())),
            Value(v) => words.push(v.to_string_lossy().into_owned()),
            other => return Err(unknown(C, STEER_FLAGS, other)),
        }
    }
    match words.len() {
        2 | 3 => {
            let mut words = words.into_iter();
            out.issue = words.next().unwrap_or_default();
            out.message = words.next().unwrap_or_default();
            out.workflow = words.next().map(PathBuf::from);
        }
        _ => {
            return Err(usage(
                C,
                "expected <ISSUE> <MESSAGE> [WORKFLOW.md|DIR] (MESSAGE `-` reads standard input)"
                    .into(),
                None,
            ));
        }
    }
    Ok(Command::Steer(out))
}

/// `--url` of the commands that talk to a running daemon.
const DAEMON_URL: Flag = Flag {
    long: "url",
    value: Some("URL"),
    help: "The daemon's base URL (default: the one its lock file records)",
};

/// `--port` of the commands that talk to a running daemon.
const DAEMON_PORT: Flag = Flag {
    long: "port",
    value: Some("PORT"),
    help: "The daemon's port on 127.0.0.1",
};

pub const STATUS_FLAGS: &[Flag] = &[
    Flag {
        long: "json",
        value: None,
        help: "Print {daemons: [{url, daemon, state}]} as JSON",
    },
    Flag {
        long: "open",
        value: None,
        help: "Also print the dashboard's URL with the control token in its fragment",
    },
    DAEMON_URL,
    DAEMON_PORT,
    HELP,
];

pub const CONTROL_FLAGS: &[Flag] = &[DAEMON_URL, DAEMON_PORT, HELP];

fn parse_status(args: Vec<OsString>) -> Result<Command, UsageError> {
    use lexopt::prelude::*;
    const C: &str = "svc status";
    let mut out = StatusArgs::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = next_arg(&mut p, C, STATUS_FLAGS)? {
        match arg {
            Long("json") => out.json = true,
            Long("open") => out.open = true,
            Long("url") => out.url = Some(url_flag(C, p.value())?),
            Long("port") => out.port = Some(daemon_port(C, p.value())?),
            Long("help") | Short('h') => return Ok(Command::Help(status_help())),
            Value(v) => positional(C, &mut out.workflow, v)?,
            other => return Err(unknown(C, STATUS_FLAGS, other)),
        }
    }
    Ok(Command::Status(out))
}

/// `svc store copy <FROM> <TO>`: each an SQLite file's path or a PostgreSQL URI.
fn parse_store(args: Vec<OsString>) -> Result<Command, UsageError> {
    let c = "svc store";
    let words: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match words.as_slice() {
        [h] if h == "--help" || h == "-h" => Ok(Command::Help(store_help())),
        [copy, from, to] if copy == "copy" && !from.starts_with('-') && !to.starts_with('-') => {
            Ok(Command::StoreCopy {
                from: from.clone(),
                to: to.clone(),
            })
        }
        [first, ..] if first != "copy" => Err(usage(
            c,
            format!("unknown store command {first}"),
            Some("svc store copy <FROM> <TO>".into()),
        )),
        _ => Err(usage(
            c,
            "svc store copy takes two stores: <FROM> <TO> (an SQLite file or a postgres:// URI each)".into(),
            None,
        )),
    }
}

fn store_help() -> &'static str {
    leak(render_help(
        "svc store copy <FROM> <TO>",
        "Copies a claim store's pending retries, runs in flight (retried by the next daemon), run history, steering messages and cursors into another, while no daemon uses either. FROM and TO are each an SQLite file's path or a PostgreSQL URI (postgres://...): moving a team's daemons to a shared PostgreSQL store (or back) loses nothing",
        &[HELP],
    ))
}

fn parse_control(action: Action, args: Vec<OsString>) -> Result<Command, UsageError> {
    use lexopt::prelude::*;
    let c = action.name();
    let mut out = ControlArgs {
        action,
        ..ControlArgs::default()
    };
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = next_arg(&mut p, c, CONTROL_FLAGS)? {
        match arg {
            Long("url") => out.url = Some(url_flag(c, p.value())?),
            Long("port") => out.port = Some(daemon_port(c, p.value())?),
            Long("help") | Short('h') => return Ok(Command::Help(control_help(action))),
            Value(v) => positional(c, &mut out.workflow, v)?,
            other => return Err(unknown(c, CONTROL_FLAGS, other)),
        }
    }
    Ok(Command::Control(out))
}

fn status_help() -> &'static str {
    leak(render_help(
        "svc status [OPTIONS] [WORKFLOW.md|DIR]",
        "One screen about the running daemon of the workflow: heartbeat, uptime, next poll, counts, running, retrying, blocked and waiting issues, worker pool, claim store. Exit status 3 when no daemon runs, 4 when its control token is refused (--open), 5 when it does not answer or its heartbeat is stale",
        STATUS_FLAGS,
    ))
}

fn control_help(action: Action) -> &'static str {
    let (usage_line, about) = match action {
        Action::Refresh => (
            "svc refresh [OPTIONS] [WORKFLOW.md|DIR]",
            "Ask the running daemon to poll the tracker and reconcile now (coalesced with a poll under way)",
        ),
        Action::Stop => (
            "svc stop [OPTIONS] [WORKFLOW.md|DIR]",
            "Stop the running daemon gracefully (as SIGTERM does) and wait until it has exited",
        ),
        Action::Open => (
            "svc open [OPTIONS] [WORKFLOW.md|DIR]",
            "Print the web dashboard's loopback URL with the control token in its fragment (#token=...), which lets that browser tab steer and cancel; the fragment is never sent to a server",
        ),
    };
    leak(render_help(
        usage_line,
        &format!(
            "{about}. The daemon and its control token are found from the workflow's lock file (the token file beside it, or $SVC_CONTROL_TOKEN). Exit status 3 when no daemon runs, 4 when the token is refused, 5 when the daemon does not answer"
        ),
        CONTROL_FLAGS,
    ))
}

fn render_help(usage_line: &str, about: &str, flags: &[Flag]) -> String {
    let mut out = format!("{about}\n\nUsage: {usage_line}\n\nOptions:\n");
    for f in flags {
        let left = match f.value {
            Some(v) => format!("--{} <{v}>", f.long),
            None => format!("--{}", f.long),
        };
        out.push_str(&format!("  {left:<20} {}\n", f.help));
    }
    out
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn top_help() -> &'static str {
    daemon_help()
}

fn daemon_help() -> &'static str {
    let mut commands = String::from("\nCommands:\n");
    for c in COMMANDS.iter().filter(|c| !c.name.is_empty()) {
        commands.push_str(&format!("  {:<20} {}\n", c.name, c.about));
    }
    leak(format!(
        "{}{commands}\nThe workflow is WORKFLOW.md, else $SVC_WORKFLOW, else ./WORKFLOW.md. A directory stands for each *.md file in it (the daemon and doctor take several; the other commands find the daemon from its first by name).\n",
        render_help(
            "svc [OPTIONS] [WORKFLOW|DIR]...\n       svc doctor [--json] [WORKFLOW|DIR]...\n       svc runs [OPTIONS] [WORKFLOW.md|DIR]\n       svc status|refresh|stop|open [OPTIONS] [WORKFLOW.md|DIR]",
            "svc: turns tracker issues into coding-agent runs",
            DAEMON_FLAGS
        )
    ))
}

/// `svc completions bash|zsh|fish`.
fn parse_completions(args: &[OsString]) -> Result<Command, UsageError> {
    const C: &str = "svc completions";
    let words: Vec<&str> = args.iter().map(|a| a.to_str().unwrap_or("")).collect();
    match words.as_slice() {
        ["bash"] => Ok(Command::Completions(Shell::Bash)),
        ["zsh"] => Ok(Command::Completions(Shell::Zsh)),
        ["fish"] => Ok(Command::Completions(Shell::Fish)),
        ["--help" | "-h"] => Ok(Command::Help(leak(render_help(
            "svc completions bash|zsh|fish",
            "Print the shell completions of svc's commands and flags, for example `svc completions bash > /etc/bash_completion.d/svc`",
            &[HELP],
        )))),
        [other] => Err(usage(
            C,
            format!("unknown shell {other:?}: bash, zsh or fish"),
            nearest(other, ["bash", "zsh", "fish"]).map(str::to_string),
        )),
        _ => Err(usage(
            C,
            "expected one shell: bash, zsh or fish".into(),
            None,
        )),
    }
}

/// `svc man`.
fn parse_man(args: &[OsString]) -> Result<Command, UsageError> {
    match args.first().and_then(|a| a.to_str()) {
        None => Ok(Command::Man),
        Some("--help" | "-h") => Ok(Command::Help(leak(render_help(
            "svc man",
            "Print svc's man page (roff), for example `svc man | man -l -`",
            &[HELP],
        )))),
        Some(other) => Err(usage(
            "svc man",
            format!("unexpected argument {other}"),
            None,
        )),
    }
}

fn doctor_help() -> &'static str {
    leak(render_help(
        "svc doctor [--json] [--online] [WORKFLOW|DIR]...",
        "Validate the workflows and the prerequisites; with several (or a directory), first their names, the daemon-wide sections they must agree on and their workspace roots, then each workflow's checks under a line naming it; exit status 1 on any error",
        DOCTOR_FLAGS,
    ))
}

fn steer_help() -> &'static str {
    leak(render_help(
        "svc steer [OPTIONS] <ISSUE> <MESSAGE|-> [WORKFLOW.md|DIR]",
        "Send a message to the agent working on ISSUE (its identifier): delivered as its next turn, or at its next run when it is retrying or waiting. The daemon and its control token are found from the workflow's lock file (the token file beside it, or $SVC_CONTROL_TOKEN)",
        STEER_FLAGS,
    ))
}

fn runs_help() -> &'static str {
    leak(render_help(
        "svc runs [OPTIONS] [WORKFLOW.md|DIR]",
        "Show the runs of a running daemon (GET /api/v1/runs)",
        RUNS_FLAGS,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn daemon_flags_and_workflow() {
        let cmd =
            parse_strs(&["--no-tui", "--port", "0", "--logs-root", "/tmp/l", "W.md"]).unwrap();
        assert_eq!(
            cmd,
            Command::Daemon(DaemonArgs {
                no_tui: true,
                no_dashboard: false,
                port: Some(0),
                logs_root: Some("/tmp/l".into()),
                workflows: vec!["W.md".into()],
                ..Default::default()
            })
        );
        let Command::Daemon(a) = parse_strs(&["a.md", "dir", "--once", "b.md"]).unwrap() else {
            panic!()
        };
        assert_eq!(a.workflows, ["a.md", "dir", "b.md"].map(PathBuf::from));
        let Command::Doctor(a) = parse_strs(&["doctor", "a.md", "--json", "dir"]).unwrap() else {
            panic!()
        };
        assert_eq!(a.workflows, ["a.md", "dir"].map(PathBuf::from));
        assert!(a.json);
        assert_eq!(
            parse_strs(&["--once", "--dry-run"]).unwrap(),
            Command::Daemon(DaemonArgs {
                once: true,
                dry_run: true,
                ..Default::default()
            })
        );
        assert_eq!(
            parse_strs(&["--port=8080"]).unwrap(),
            Command::Daemon(DaemonArgs {
                port: Some(8080),
                ..Default::default()
            })
        );
        assert_eq!(parse_strs(&["--version"]).unwrap(), Command::Version);
    }

    #[test]
    fn unknown_flags_name_the_flag_and_suggest_the_nearest() {
        let e = parse_strs(&["--no-tu"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown flag --no-tu; did you mean --no-tui?"
        );
        let e = parse_strs(&["--dashboard"]).unwrap_err();
        assert_eq!(e.suggestion.as_deref(), Some("--no-dashboard"));
        let e = parse_strs(&["runs", "--fialed"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown flag --fialed; did you mean --failed?"
        );
        assert_eq!(e.command, "svc runs");
        let e = parse_strs(&["doctor", "--jsn"]).unwrap_err();
        assert_eq!(e.suggestion.as_deref(), Some("--json"));
        let e = parse_strs(&["--zzzzzzzz"]).unwrap_err();
        assert_eq!(e.suggestion, None);
    }

    #[test]
    fn values_are_validated() {
        assert!(
            parse_strs(&["--port", "70000"])
                .unwrap_err()
                .message
                .contains("--port")
        );
        assert!(
            parse_strs(&["--port"])
                .unwrap_err()
                .message
                .contains("needs a value")
        );
        assert!(
            parse_strs(&["runs", "--limit", "0"])
                .unwrap_err()
                .message
                .contains("positive")
        );
        assert!(parse_strs(&["runs", "--port", "-1"]).is_err());
        assert!(parse_strs(&["runs", "--url", "localhost:4040"]).is_err());
        for c in ["status", "runs", "refresh", "stop", "open"] {
            let e = parse_strs(&[c, "a.md", "b.md"]).unwrap_err();
            assert_eq!(
                e.message,
                "unexpected argument b.md: only one workflow file may be given"
            );
        }
    }

    #[test]
    fn runs_flags_parse() {
        let cmd = parse_strs(&[
            "runs",
            "--issue",
            "ENG-1",
            "--failed",
            "--cost",
            "--retries",
            "--id",
            "r1",
            "--limit",
            "5",
            "--url",
            "http://h:1/",
            "--port",
            "0",
            "--json",
            "--workflow",
            "beta",
        ])
        .unwrap();
        assert_eq!(
            cmd,
            Command::Runs(RunsArgs {
                issue: Some("ENG-1".into()),
                failed: true,
                cost: true,
                spend: false,
                retries: true,
                id: Some("r1".into()),
                limit: Some(5),
                url: Some("http://h:1".into()),
                port: Some(0),
                json: true,
                workflow_name: Some("beta".into()),
                workflow: None
            })
        );
        assert!(
            parse_strs(&["runs", "--workflow", ""])
                .unwrap_err()
                .message
                .contains("--workflow needs")
        );
    }

    #[test]
    fn help_lists_every_flag() {
        let Command::Help(text) = parse_strs(&["runs", "--help"]).unwrap() else {
            panic!()
        };
        for f in RUNS_FLAGS {
            assert!(text.contains(&format!("--{}", f.long)), "{}", f.long);
        }
        let Command::Help(text) = parse_strs(&["--help"]).unwrap() else {
            panic!()
        };
        assert!(text.contains("doctor") && text.contains("--no-dashboard"));
    }

    /// The parsers take every flag the table declares for their command, and refuse one it
    /// does not: the table is the one list help, completions and the man page are made from.
    #[test]
    fn the_parsers_take_exactly_the_declared_flags() {
        for c in COMMANDS.iter().filter(|c| c.name != "demo-agent") {
            for f in c.flags {
                let mut args: Vec<&str> = Vec::new();
                if !c.name.is_empty() {
                    args.push(c.name);
                }
                let flag = format!("--{}", f.long);
                args.push(&flag);
                if f.value.is_some() {
                    args.push(if f.long == "url" { "http://h:1" } else { "1" });
                }
                if c.name == "steer" {
                    args.extend(["ENG-1", "hello"]);
                }
                if let Err(e) = parse_strs(&args) {
                    assert!(!e.message.contains("unknown flag"), "{args:?}: {e}");
                }
            }
        }
        let mut p = lexopt::Parser::from_args(["--once"]);
        let e = next_arg(&mut p, "svc doctor", DOCTOR_FLAGS).unwrap_err();
        assert_eq!(e.message, "unknown flag --once");
    }

    #[test]
    fn completions_and_man_take_their_arguments() {
        assert_eq!(
            parse_strs(&["completions", "zsh"]).unwrap(),
            Command::Completions(Shell::Zsh)
        );
        let e = parse_strs(&["completions", "bsh"]).unwrap_err();
        assert_eq!(e.suggestion.as_deref(), Some("bash"));
        assert!(parse_strs(&["completions"]).is_err());
        assert_eq!(parse_strs(&["man"]).unwrap(), Command::Man);
        assert!(parse_strs(&["man", "x"]).is_err());
    }
}
