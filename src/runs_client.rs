//! `svc runs`: a blocking client of a running daemon's `GET /api/v1/runs`.

use std::path::Path;

use crate::cli::args::RunsArgs;
use crate::config::{self, SecretResolver};
use crate::env::Env;

pub const NO_PORT: &str =
    "No observability server port configured. Pass --port/--url or set server.port in WORKFLOW.md.";

/// The daemon's base URL, first match wins: `--url`, `--port` (> 0) on `server.host`, then
/// `server.port` (> 0) of the workflow.
pub fn base_url(a: &RunsArgs, workflow: &Path, env: &Env) -> Result<String, String> {
    if let Some(url) = &a.url {
        return Ok(url.trim_end_matches('/').to_string());
    }
    let settings = config::load(workflow, env, &mut SecretResolver::default())
        .ok()
        .map(|l| l.settings);
    let host = settings
        .as_ref()
        .map_or_else(|| "127.0.0.1".to_string(), |s| s.server.host.clone());
    if let Some(port) = a.port.filter(|p| *p > 0) {
        return Ok(format!("http://{host}:{port}"));
    }
    match settings.map(|s| s.server.port).filter(|p| *p > 0) {
        Some(port) => Ok(format!("http://{host}:{port}")),
        None => Err(NO_PORT.to_string()),
    }
}
