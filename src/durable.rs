//! Small durable facts kept beside the run pipeline, for the parts that are not the state thread:
//! tallies that only grow by what is added to them (the worker pool's worker-seconds), and marks
//! remembered once (the review feedback that already sent its issue back to work).
//!
//! The daemon keeps them in its claim store and [`install`]s the handle once, after the store
//! opens; with a shared store (SQLite beside several daemons, or PostgreSQL for a fleet) every
//! daemon sees the same figures. Before that, and in tests and one-shot commands, there is no
//! handle ([`facts`] is `None`) and each part keeps to its own memory, as it did before.
//! This module is a leaf: the tracker and the worker pool reach the store through it without
//! knowing the orchestrator.

use std::sync::{Arc, RwLock};

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

static INSTALLED: RwLock<Option<Arc<dyn Facts>>> = RwLock::new(None);

/// Makes `facts` the daemon's durable store (the last installed wins).
pub fn install(facts: Arc<dyn Facts>) {
    *INSTALLED.write().unwrap_or_else(|p| p.into_inner()) = Some(facts);
}

/// The daemon's durable store, once installed.
pub fn facts() -> Option<Arc<dyn Facts>> {
    INSTALLED.read().unwrap_or_else(|p| p.into_inner()).clone()
}
