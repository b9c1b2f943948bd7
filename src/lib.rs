//! `svc`: a long-running daemon that turns tracker issues into coding-agent runs. The binary's
//! `main` only calls [`cli::main`]; the modules are a library so integration tests and
//! benchmarks can drive them directly. ARCHITECTURE.md has the map.

pub mod agent;
pub mod assets;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod demo_agent;
pub mod doctor;
pub mod env;
pub mod hooks;
pub mod http;
pub mod mcp;
pub mod orchestrator;
pub mod process;
pub mod prompt;
pub mod runs_client;
pub mod trace;
pub mod tracker;
pub mod tui;
pub mod workspace;
