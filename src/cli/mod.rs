//! Entry points of the `svc` commands: parse, then run the daemon, `doctor`, `runs`, or one of
//! the operator's commands that act on a running daemon (`status`, `refresh`, `stop`, `open`,
//! `steer`).

pub mod args;
pub mod docs;

use std::process::ExitCode;

use args::{Command, ControlArgs, DaemonArgs, DoctorArgs, RunsArgs, StatusArgs, SteerArgs};

use crate::config;
use crate::env::Env;

pub fn main() -> ExitCode {
    let command = match args::parse(std::env::args_os().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: error: {e}", e.command);
            eprintln!("Run `{} --help` for usage.", e.command);
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Help(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Command::Version => {
            print!("{}", version());
            ExitCode::SUCCESS
        }
        Command::Completions(shell) => {
            print!("{}", docs::completions(shell));
            ExitCode::SUCCESS
        }
        Command::Man => {
            print!("{}", docs::man());
            ExitCode::SUCCESS
        }
        Command::Doctor(a) => doctor(a),
        Command::Runs(a) => runs(a),
        Command::Steer(a) => steer(a),
        Command::Status(a) => status(a),
        Command::Control(a) => control(a),
        Command::Daemon(a) => daemon(a),
        Command::StoreCopy { from, to } => store_copy(&from, &to),
        Command::DemoAgent => crate::demo_agent::main(),
    }
}

/// What a packaged binary tells about itself: version, the commit and target it was built from
/// (src/build.rs) and whether this host has the libpq a PostgreSQL claim store loads.
fn version() -> String {
    let libpq = match crate::pq::load() {
        Ok(_) => "found".to_string(),
        Err(_) => "not found (only a PostgreSQL claim store needs it: install libpq5)".to_string(),
    };
    format!(
        "svc {}\ncommit: {}\ntarget: {}\nlibpq: {libpq}\n",
        env!("CARGO_PKG_VERSION"),
        env!("SVC_COMMIT"),
        env!("SVC_TARGET"),
    )
}

fn store_copy(from: &str, to: &str) -> ExitCode {
    let env = Env::from_process();
    match crate::orchestrator::store::copy::run(from, to, &env) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("svc store copy: {e}");
            ExitCode::from(1)
        }
    }
}

fn doctor(a: DoctorArgs) -> ExitCode {
    let env = Env::from_process();
    let report = crate::doctor::run_all(&a.workflows, &env, a.online);
    let failed = if a.json {
        crate::doctor::print_report_json(&report)
    } else {
        crate::doctor::print_report_human(&report)
    };
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn runs(a: RunsArgs) -> ExitCode {
    let env = Env::from_process();
    let path = match control_path("svc runs", a.workflow.as_deref(), &env) {
        Ok(p) => p,
        Err(code) => return code,
    };
    match crate::runs_client::run(&a, &path, &env) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("svc runs: {msg}");
            ExitCode::from(1)
        }
    }
}

/// The workflow file an operator's command finds the daemon from (a directory's first `*.md`);
/// an empty directory is reported with exit status 1.
fn control_path(
    command: &str,
    arg: Option<&std::path::Path>,
    env: &Env,
) -> Result<std::path::PathBuf, ExitCode> {
    config::workflows::control_path(arg, env).map_err(|e| {
        eprintln!("{command}: {}", e.with_hint());
        ExitCode::from(1)
    })
}

/// Prints what an operator's command says, or its failure with the command's name; the
/// failure's exit status says what went wrong (`control_client::NO_DAEMON`, ...).
fn report(command: &str, result: Result<String, crate::control_client::Failure>) -> ExitCode {
    match result {
        Ok(text) => {
            print!("{text}");
            if !text.is_empty() && !text.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("{command}: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn steer(a: SteerArgs) -> ExitCode {
    let env = Env::from_process();
    let path = match control_path("svc steer", a.workflow.as_deref(), &env) {
        Ok(p) => p,
        Err(code) => return code,
    };
    report("svc steer", crate::control_client::steer(&a, &path, &env))
}

fn status(a: StatusArgs) -> ExitCode {
    let env = Env::from_process();
    let path = match control_path("svc status", a.workflow.as_deref(), &env) {
        Ok(p) => p,
        Err(code) => return code,
    };
    report("svc status", crate::control_client::status(&a, &path, &env))
}

fn control(a: ControlArgs) -> ExitCode {
    let env = Env::from_process();
    let path = match control_path(a.action.name(), a.workflow.as_deref(), &env) {
        Ok(p) => p,
        Err(code) => return code,
    };
    report(
        a.action.name(),
        crate::control_client::control(&a, &path, &env),
    )
}

fn daemon(a: DaemonArgs) -> ExitCode {
    crate::daemon::run(a)
}
