//! What start-up opens, seen from outside the daemon (`/proc/<pid>/fd`, as `lsof` shows it).
//! Each SQLite connection costs an idle daemon about 100 KiB of heap (its lookaside buffer, page
//! cache and parsed schema) besides its descriptors; the durable facts (the worker pool's spend,
//! review and budget marks) opened a connection of their own at start; they share the runs' now
//! (`tests/pool.rs` holds the spend across a restart through it).

mod common;

use common::*;
use std::path::Path;

/// How many of the process's descriptors are open on `path` itself (not its `-wal` or `-shm`).
fn descriptors_on(pid: u32, path: &Path) -> usize {
    let path = std::fs::canonicalize(path).unwrap();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| *target == path)
        .count()
}

#[test]
fn the_claim_store_is_opened_once_for_its_thread_and_once_for_runs_and_durable_facts() {
    let dir = TestDir::new("start-up-store");
    let wf = workflow(&dir, &demo_memory(""));
    let store = dir.join("claims.db");
    let mut cmd = svc(&dir);
    cmd.env("SVC_CLAIM_STORE", &store)
        .env(
            "SVC_MEMORY_TRACKER_ISSUES_JSON",
            issues_json(&[("M-1", "Todo", &[], "")]),
        )
        .arg("--no-tui")
        .arg(&wf);
    let d = Daemon::start(cmd);
    // Past start-up, and a run has claimed its slot and ended.
    d.wait_for(30, "M-1's run to succeed", |s| {
        events(s).contains(&"run_succeeded".to_string())
    });
    assert_eq!(
        descriptors_on(d.child.id(), &store),
        2,
        "the store thread's connection and the runs' (which the durable facts share)"
    );
}
