//! Where a workflow's lock files live and what they say: the one path rule the daemon takes its
//! lock by and the operator's commands find it by. A leaf: it uses only `env`.
//!
//! The first daemon of a workflow holds `<daemon dir>/<stem>-<hash>.lock`; daemons that share a
//! durable claim store hold its numbered siblings `<stem>-<hash>.<n>.lock` (n = 2, 3, ...). The
//! file holds a JSON object (`pid`, `owner_id`, `workflow_path`, `started_at`, and `url` once
//! the daemon serves).

use std::fs::{self, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::env::Env;

/// How many daemons may share one workflow (and its claim store).
pub const MAX_SHARING_DAEMONS: u32 = 32;

/// The directory of the lock files: `~/.svc/daemon` (the temporary directory without a home).
pub fn daemon_dir(env: &Env) -> PathBuf {
    env.home()
        .unwrap_or_else(|| env.tmpdir())
        .join(".svc")
        .join("daemon")
}

/// The lock file of a workflow: `<daemon dir>/<file stem>-<sha256 of its path, 16 hex>.lock`.
pub fn lock_path(daemon_dir: &Path, workflow: &Path) -> PathBuf {
    let canonical = fs::canonicalize(workflow).unwrap_or_else(|_| workflow.to_path_buf());
    let digest = Sha256::digest(canonical.to_string_lossy().as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let stem: String = workflow
        .file_stem()
        .map(|s| {
            s.to_string_lossy()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect()
        })
        .unwrap_or_else(|| "workflow".into());
    daemon_dir.join(format!("{stem}-{hex}.lock"))
}

/// The workflow's first lock file `base`, then its numbered siblings.
pub fn siblings(base: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    std::iter::once(base.to_path_buf())
        .chain((2..=MAX_SHARING_DAEMONS).map(|n| base.with_extension(format!("{n}.lock"))))
}

/// Whether a daemon holds the lock file `path` (a shared lock cannot be taken).
pub fn held(path: &Path) -> bool {
    path.exists()
        && OpenOptions::new().read(true).open(path).is_ok_and(|f| {
            // SAFETY: flock on a descriptor we own; closing it releases a lock we took.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
        })
}

/// The address the daemon holding `path` recorded, if it did.
pub fn recorded_url(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["url"].as_str().map(str::to_string)
}
