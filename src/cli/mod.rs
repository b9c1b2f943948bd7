//! Entry points of the `svc` commands: parse, then run the daemon, `doctor` or `runs`.

pub mod args;

use std::process::ExitCode;

use args::{Command, DaemonArgs, DoctorArgs, RunsArgs, SteerArgs};

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
            println!("svc {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Doctor(a) => doctor(a),
        Command::Runs(a) => runs(a),
        Command::Steer(a) => steer(a),
        Command::Daemon(a) => daemon(a),
        Command::DemoAgent => crate::demo_agent::main(),
    }
}

fn doctor(a: DoctorArgs) -> ExitCode {
    let env = Env::from_process();
    let path = config::workflow::resolve_path(a.workflow.as_deref(), &env);
    let checks = crate::doctor::run(&path, &env, a.online);
    let failed = if a.json {
        crate::doctor::print_json(&checks)
    } else {
        crate::doctor::print_human(&checks)
    };
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn runs(a: RunsArgs) -> ExitCode {
    let env = Env::from_process();
    let path = config::workflow::resolve_path(a.workflow.as_deref(), &env);
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

fn steer(a: SteerArgs) -> ExitCode {
    let env = Env::from_process();
    let path = config::workflow::resolve_path(a.workflow.as_deref(), &env);
    match crate::control_client::steer(&a, &path, &env) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("svc steer: {msg}");
            ExitCode::from(1)
        }
    }
}

fn daemon(a: DaemonArgs) -> ExitCode {
    crate::daemon::run(a)
}
