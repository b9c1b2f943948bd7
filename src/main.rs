//! `svc`: a long-running daemon that turns tracker issues into coding-agent runs.

fn main() -> std::process::ExitCode {
    svc::cli::main()
}
