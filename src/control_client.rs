//! The operator's commands that act on a running daemon (`svc steer`): finding the daemon of a
//! workflow and its control token, then one blocking request. It holds no state.
//!
//! A daemon records where it serves in its lock file (`url`, beside `pid` and `owner_id`) and
//! writes its control token beside it (`<lock>.token`, mode 0600) unless `SVC_CONTROL_TOKEN`
//! set it. Daemons sharing a claim store hold numbered sibling lock files; each one that is held
//! is asked in turn.

use std::fs::{self, OpenOptions};
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::args::SteerArgs;
use crate::env::Env;

/// A live daemon of the workflow: where it serves and its control token.
#[derive(Debug)]
pub struct Found {
    pub url: String,
    pub token: String,
    pub lock: PathBuf,
}

/// The held lock files of `workflow` (the first, then its numbered siblings).
fn held_locks(env: &Env, workflow: &Path) -> Vec<PathBuf> {
    let dir = env
        .home()
        .unwrap_or_else(|| env.tmpdir())
        .join(".svc")
        .join("daemon");
    let base = crate::daemon::lock_path(&dir, workflow);
    std::iter::once(base.clone())
        .chain((2..=32).map(|n| base.with_extension(format!("{n}.lock"))))
        .filter(|p| p.exists())
        .filter(|p| {
            OpenOptions::new().read(true).open(p).is_ok_and(|f| {
                // SAFETY: flock on a descriptor we own; closing it releases a lock we took.
                unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
            })
        })
        .collect()
}

/// Every live daemon of `workflow`, with the URL and token to reach it. `url` and `port` (the
/// flags) override where it serves; `SVC_CONTROL_TOKEN` overrides the token file.
pub fn find(
    env: &Env,
    workflow: &Path,
    url: Option<&str>,
    port: Option<u16>,
) -> Result<Vec<Found>, String> {
    let locks = held_locks(env, workflow);
    if locks.is_empty() && url.is_none() && port.is_none() {
        return Err(format!(
            "no svc daemon is running for {} (no held lock file); start one, or pass --url",
            workflow.display()
        ));
    }
    let token_of = |lock: &Path| -> Result<String, String> {
        if let Some(t) = env.non_empty("SVC_CONTROL_TOKEN") {
            return Ok(t.to_string());
        }
        let path = lock.with_extension("token");
        let mut text = String::new();
        fs::File::open(&path)
            .and_then(|mut f| f.read_to_string(&mut text))
            .map_err(|e| {
                format!(
                    "cannot read the control token {} ({e}); set SVC_CONTROL_TOKEN to the daemon's token",
                    path.display()
                )
            })?;
        Ok(text.trim().to_string())
    };
    let fixed = url
        .map(str::to_string)
        .or_else(|| port.map(|p| format!("http://127.0.0.1:{p}")));
    if locks.is_empty() {
        let token = env.non_empty("SVC_CONTROL_TOKEN").ok_or_else(|| {
            "no daemon lock file here to read its control token from; set SVC_CONTROL_TOKEN"
                .to_string()
        })?;
        return Ok(vec![Found {
            url: fixed.unwrap_or_default(),
            token: token.to_string(),
            lock: PathBuf::new(),
        }]);
    }
    let mut found = Vec::new();
    for lock in locks {
        let recorded = fs::read_to_string(&lock)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["url"].as_str().map(str::to_string));
        let Some(url) = fixed.clone().or(recorded) else {
            continue;
        };
        found.push(Found {
            url,
            token: token_of(&lock)?,
            lock,
        });
    }
    if found.is_empty() {
        return Err(
            "the daemon serves no HTTP API (started with --no-dashboard?); nothing to send to"
                .into(),
        );
    }
    Ok(found)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// `svc steer`: posts the message to each live daemon of the workflow until one knows the
/// issue; the line to print says where it went.
pub fn steer(a: &SteerArgs, workflow: &Path, env: &Env) -> Result<String, String> {
    let message = if a.message == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read the message from standard input: {e}"))?;
        text
    } else {
        a.message.clone()
    };
    if message.trim().is_empty() {
        return Err("the message is empty".into());
    }
    let author = a
        .author
        .clone()
        .or_else(|| env.non_empty("USER").map(str::to_string))
        .unwrap_or_else(|| "operator".into());
    let path = format!(
        "/api/v1/{}/steer",
        percent_encoding::utf8_percent_encode(&a.issue, percent_encoding::NON_ALPHANUMERIC)
    );
    let body = json!({"message": message, "author": author}).to_string();
    let mut last = String::new();
    for daemon in find(env, workflow, a.url.as_deref(), a.port)? {
        let url = format!("{}{path}", daemon.url.trim_end_matches('/'));
        let mut resp = agent()
            .post(&url)
            .header("Authorization", &format!("Bearer {}", daemon.token))
            .header("Content-Type", "application/json")
            .send(body.as_str())
            .map_err(|e| format!("cannot reach the daemon at {}: {e}", daemon.url))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let why = v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or(text.trim())
            .to_string();
        match status {
            202 => {
                return Ok(match v["delivery"].as_str() {
                    Some("running") => format!(
                        "sent to the running agent of {}: it is its next turn",
                        a.issue
                    ),
                    _ => format!(
                        "{} is not running now: the message waits for its next run",
                        a.issue
                    ),
                });
            }
            404 => last = format!("{} is neither running nor waiting in this daemon", a.issue),
            401 => {
                return Err(format!(
                    "the daemon at {} refused the control token ({why}); check SVC_CONTROL_TOKEN or {}",
                    daemon.url,
                    daemon.lock.with_extension("token").display()
                ));
            }
            _ => return Err(format!("the daemon answered HTTP {status}: {why}")),
        }
    }
    Err(last)
}
