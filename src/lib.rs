//! `svc`: a long-running daemon that turns tracker issues into coding-agent runs. The binary's
//! `main` only calls [`cli::main`]; the modules are a library so integration tests and
//! benchmarks can drive them directly. ARCHITECTURE.md has the map.

pub mod agent;
pub mod assets;
pub mod cli;
pub mod config;
pub mod control_client;
pub mod daemon;
pub mod demo_agent;
pub mod doctor;
pub mod env;
/// Durable facts beside the run pipeline (tallies, marks), kept in the claim store.
pub mod facts;
/// Fuzz entry points: one function per fuzz target in `tests/fuzz`, replayed by
/// `tests/hostile_input.rs`; each feeds arbitrary bytes to the real parsers and never panics.
pub mod fuzzing;
pub mod hooks;
pub mod http;
pub mod lockfile;
pub mod mcp;
pub mod notify;
pub mod orchestrator;
/// The real PostgreSQL server of the tests (`tests/common/pg.rs`), for the unit tests too.
#[cfg(test)]
#[path = "../tests/common/pg.rs"]
pub mod pg_server;
/// A small PostgreSQL client over the system's libpq, loaded at run time (`dlopen`).
pub mod pq;
pub mod process;
pub mod random;
pub mod runs_client;
pub mod steering;
pub mod time;
pub mod trace;
pub mod tracker;
pub mod tui;
/// Webhooks' pure parts: verification, which events wake, counts (`http::webhooks` serves them).
pub mod webhook;
pub mod workers;
pub mod workspace;
