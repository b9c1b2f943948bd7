//! Orchestration: the pure state machine (`state`), dispatch rules (`dispatch`), the snapshot
//! the views read (`snapshot`), the claim store behind one interface (`store`), and the state
//! thread that runs it all (`runtime`).

pub mod dispatch;
pub mod inbox;
pub mod ledger;
pub mod poller;
pub mod protocol;
pub mod runtime;
pub mod snapshot;
pub mod state;
pub mod store;

/// What a panic said (its message, when it is text).
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

#[cfg(test)]
pub(crate) mod testutil {
    use std::path::Path;

    use crate::config::{self, SecretResolver, Settings};
    use crate::env::Env;
    use crate::tracker::Issue;

    pub fn settings(yaml: &str) -> Settings {
        let text = format!("---\n{yaml}\n---\nx\n");
        let file = config::workflow::parse(Path::new("/w/W.md"), &text).unwrap();
        let env = Env::from_pairs([("HOME", "/h")], Path::new("/w"));
        config::from_workflow(&file, &env, &mut SecretResolver::default())
            .unwrap()
            .settings
    }

    /// A daemon as snapshots describe it: pid 42 on `h`, started at 1,000,000 ms, no HTTP
    /// endpoint, the memory store.
    pub fn daemon_info() -> super::snapshot::DaemonInfo {
        super::snapshot::DaemonInfo {
            owner_id: "o".into(),
            pid: 42,
            hostname: "h".into(),
            started_at: 1_000_000,
            workflow_path: "/w/WORKFLOW.md".into(),
            lock_path: "/l".into(),
            endpoint: super::snapshot::Endpoint {
                kind: "none".into(),
                address: None,
            },
            log_file: None,
            claim_store: &super::store::memory::KIND,
        }
    }

    /// A poll's answer whose candidates are `issues` (nothing else asked or read).
    pub fn poll_done(issues: Vec<Issue>) -> super::protocol::Event {
        super::protocol::Event::PollDone(super::protocol::PollReport {
            candidates: Ok(issues),
            refreshed: Ok(vec![]),
            requested: vec![],
            terminal: None,
            rate_limits: None,
            duration_ms: 0,
            read_at: 0,
        })
    }

    /// When the limit in [`rate_limited`] resets (00:33:20 UTC on the first day).
    pub const RATE_LIMIT_RESET: crate::time::Millis = 2_000_000;

    /// The default agent kind (`agent_a`, no fallback), room for three runs: T-0 runs and meets
    /// a limit (`reason`) that resets at [`RATE_LIMIT_RESET`], then T-0 and T-1 are polled
    /// again and T-1 finds `agent_a` cooling down.
    pub fn rate_limited(reason: &str) -> super::state::State {
        use super::protocol::{Event, Limit, RunEnd, RunMsg};
        use super::state::{State, handle};
        let mut st = State::new(
            std::sync::Arc::new(settings(
                "tracker:\n  kind: memory\nagent:\n  max_concurrent_agents: 3",
            )),
            1_000_000,
        );
        handle(&mut st, 1_000_000, Event::Tick);
        handle(
            &mut st,
            1_000_001,
            poll_done(vec![issue("T-0", "Todo", &[])]),
        );
        let run_id = st.running.values().next().expect("T-0 runs").run_id.clone();
        let limit = Limit {
            reason: reason.into(),
            reset_at: Some(RATE_LIMIT_RESET),
        };
        handle(
            &mut st,
            1_000_500,
            Event::Run {
                run_id,
                msg: RunMsg::Exited(RunEnd::RateLimited(limit)),
            },
        );
        let again = vec![issue("T-0", "Todo", &[]), issue("T-1", "Todo", &[])];
        handle(&mut st, 1_001_000, poll_done(again));
        st
    }

    pub fn issue(identifier: &str, state: &str, labels: &[&str]) -> Issue {
        Issue {
            id: format!("id-{identifier}"),
            identifier: identifier.into(),
            title: identifier.into(),
            description: None,
            state: state.into(),
            state_type: None,
            labels: labels.iter().map(|s| s.to_string()).collect(),
            url: None,
            created_at: None,
            updated_at: None,
            priority: None,
            blocked_by: Vec::new(),
        }
    }
}
