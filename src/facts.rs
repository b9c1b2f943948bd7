//! Small durable facts kept beside the run pipeline, for the parts that are not the state thread:
//! tallies that only grow by what is added to them (the worker pool's worker-seconds), and marks
//! remembered once (the review feedback that already sent its issue back to work, the budget
//! comment already posted).
//!
//! The daemon keeps them in its claim store and hands the handle ([`Facts`]) to each part that
//! needs it when it builds that part: the worker pool and the state thread get it directly, the
//! poller's trackers (built with the workflow, before the store opens) through a [`Later`] the
//! daemon fills once the store is open. With a shared store (SQLite beside several daemons, or
//! PostgreSQL for a fleet) every daemon sees the same figures. Without a durable store (tests,
//! one-shot commands, the in-memory store) a part has no handle and keeps to its own memory.
//! This module is a leaf: the tracker and the worker pool use the store through it without
//! knowing the orchestrator.

use std::sync::{Arc, OnceLock};

/// What a durable store offers the parts beside the run pipeline. Each call is one short
/// transaction of its own, made from the caller's thread.
pub trait Facts: Send + Sync {
    /// Adds each delta to its tally (a missing tally starts at zero) and returns the new
    /// totals, in the order given.
    fn add(&self, deltas: &[(String, f64)]) -> Result<Vec<f64>, String>;
    /// The tallies whose names start with `prefix`.
    fn tallies(&self, prefix: &str) -> Result<Vec<(String, f64)>, String>;
    /// Remembers `key` under `scope` (keeping the newest `keep` of the scope); true when it
    /// was not remembered before.
    fn mark(&self, scope: &str, key: &str, keep: usize) -> Result<bool, String>;
}

/// A handle on the durable facts handed to a part built before the store opens: empty until
/// the daemon fills it (once), and empty for good where there is no durable store. Clones
/// share the one handle.
#[derive(Clone, Default)]
pub struct Later(Arc<OnceLock<Arc<dyn Facts>>>);

impl Later {
    /// Hands in the store (a second fill is ignored: the first store stays).
    pub fn fill(&self, facts: Arc<dyn Facts>) {
        let _ = self.0.set(facts);
    }

    /// The store, once filled.
    pub fn get(&self) -> Option<&Arc<dyn Facts>> {
        self.0.get()
    }
}

impl From<Arc<dyn Facts>> for Later {
    fn from(facts: Arc<dyn Facts>) -> Later {
        let later = Later::default();
        later.fill(facts);
        later
    }
}
