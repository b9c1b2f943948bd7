//! Per-run scoped claims (Token B) for agents on remote workers. A claim token is opaque (32
//! random bytes, nothing in it); it resolves only inside this daemon to a claim pinning the run
//! key (the issue), the worker host, a generation (the run's lease) and a coarse lifetime cap.
//! Every request re-checks, in this order: expiry, the per-operation tool allowlist, liveness
//! and generation (false once the run settled, its host was recycled, or a newer run of the
//! same key superseded it). Any miss denies; there is no fallback to the settings-scoped token,
//! and the run key always comes from the token, never from a header.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::random::random_token;
use sha2::{Digest, Sha256};

#[derive(Clone, Debug)]
pub struct Claim {
    /// The run key: the issue id (one run of an issue at a time).
    pub run_key: String,
    pub run_id: String,
    pub worker_host: String,
    pub generation: u64,
    pub expires_at: Instant,
    /// The tools the run may call (the packs mounted when it started).
    pub tools: HashSet<String>,
}

/// Why a claim was denied (for the log; the client only sees 401).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    Unknown,
    Expired,
    ToolNotAllowed,
    Settled,
    Superseded,
}

#[derive(Default)]
struct Inner {
    claims: HashMap<[u8; 32], Claim>,
    /// run key -> the generation of its live run.
    live: HashMap<String, u64>,
}

#[derive(Default)]
pub struct RunTokens {
    inner: Mutex<Inner>,
}

fn key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl RunTokens {
    /// Mints a token for a run; a newer generation of the same key supersedes older claims.
    pub fn mint(
        &self,
        run_key: &str,
        run_id: &str,
        worker_host: &str,
        generation: u64,
        lifetime: Duration,
        tools: HashSet<String>,
    ) -> String {
        let token = random_token();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        // Forget what can never pass again.
        inner.claims.retain(|_, c| c.expires_at > now);
        let current = inner.live.get(run_key).copied().unwrap_or(0);
        inner
            .live
            .insert(run_key.to_string(), current.max(generation));
        inner.claims.insert(
            key(&token),
            Claim {
                run_key: run_key.to_string(),
                run_id: run_id.to_string(),
                worker_host: worker_host.to_string(),
                generation,
                expires_at: now + lifetime,
                tools,
            },
        );
        token
    }

    /// The run settled: its claims stop working.
    pub fn settle(&self, run_key: &str, generation: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.live.get(run_key) == Some(&generation) {
            inner.live.remove(run_key);
        }
        inner
            .claims
            .retain(|_, c| !(c.run_key == run_key && c.generation == generation));
    }

    /// A worker host was recycled (its machine destroyed): every claim on it stops working.
    pub fn recycle_host(&self, host: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.claims.retain(|_, c| c.worker_host != host);
    }

    /// Checks `token` for calling `tool` (`None`: an operation that calls no tool, such as
    /// `tools/list`), in the order expiry, allowlist, liveness and generation.
    pub fn check(&self, token: &str, tool: Option<&str>) -> Result<Claim, Denied> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let claim = inner.claims.get(&key(token)).ok_or(Denied::Unknown)?;
        if Instant::now() >= claim.expires_at {
            return Err(Denied::Expired);
        }
        if let Some(tool) = tool
            && !claim.tools.contains(tool)
        {
            return Err(Denied::ToolNotAllowed);
        }
        match inner.live.get(&claim.run_key) {
            None => Err(Denied::Settled),
            Some(g) if *g != claim.generation => Err(Denied::Superseded),
            Some(_) => Ok(claim.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> HashSet<String> {
        ["local_comment".to_string()].into()
    }

    #[test]
    fn claims_are_checked_in_order_and_never_outlive_their_run() {
        let c = RunTokens::default();
        let t = c.mint(
            "issue-1",
            "run-1",
            "w1",
            5,
            Duration::from_secs(60),
            tools(),
        );
        assert_eq!(c.check(&t, None).unwrap().run_key, "issue-1");
        assert!(c.check(&t, Some("local_comment")).is_ok());
        assert_eq!(
            c.check(&t, Some("local_update_status")).unwrap_err(),
            Denied::ToolNotAllowed
        );
        assert_eq!(c.check("forged", None).unwrap_err(), Denied::Unknown);
        // A newer run of the same issue supersedes it.
        let newer = c.mint(
            "issue-1",
            "run-2",
            "w2",
            6,
            Duration::from_secs(60),
            tools(),
        );
        assert_eq!(c.check(&t, None).unwrap_err(), Denied::Superseded);
        assert!(c.check(&newer, None).is_ok());
        // Settling the older generation does not touch the newer one.
        c.settle("issue-1", 5);
        assert!(c.check(&newer, None).is_ok());
        c.settle("issue-1", 6);
        assert!(matches!(
            c.check(&newer, None).unwrap_err(),
            Denied::Unknown | Denied::Settled
        ));
        // Expiry comes first.
        let short = c.mint("issue-2", "run-3", "w1", 7, Duration::ZERO, tools());
        assert_eq!(c.check(&short, None).unwrap_err(), Denied::Expired);
        // A recycled host takes its claims with it.
        let on_w1 = c.mint(
            "issue-3",
            "run-4",
            "w1",
            8,
            Duration::from_secs(60),
            tools(),
        );
        c.recycle_host("w1");
        assert_eq!(c.check(&on_w1, None).unwrap_err(), Denied::Unknown);
    }
}
