//! The `memory` kind of claim store: the same tables as the others, held in this process only
//! (`SVC_CLAIM_STORE=memory`, a dry run, or a store that could not be opened). Nothing survives
//! the daemon and no other daemon sees it; within the process it keeps every promise of the
//! interface, so the state thread, the store thread and the run threads use it like any kind.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{
    Capabilities, Claim, ClaimStore, HISTORY_KEPT, Hydrated, Kind, MAX_TAKEN_DUE_MS, Op, Owner,
    Sweep, pid_alive, retry_of_dead_run,
};
use crate::orchestrator::state::{Key, Millis, Retry, RunRecord, Running};
use crate::steering::{Message, SEEN_MAX};

/// Lost with the daemon, and shared with no other.
pub static KIND: Kind = Kind {
    name: "memory",
    capabilities: Capabilities {
        crash_recovery: false,
        shared_across_processes: false,
        retry_durability: false,
    },
    leadership: "lock_file",
};

/// The store's tables.
#[derive(Debug, Default)]
struct Tables {
    /// Owner id -> hostname, pid, last heartbeat.
    owners: BTreeMap<String, (String, u32, Millis)>,
    /// Finished runs by end time and run id; `run_ends` finds a run's entry by its id.
    runs: BTreeMap<(Millis, String), RunRecord>,
    run_ends: BTreeMap<String, Millis>,
    /// Slot -> owner id and what it holds.
    claims: BTreeMap<Key, (String, Running)>,
    retries: BTreeMap<Key, (String, Retry)>,
    /// Undelivered steering messages by unique key, oldest first.
    steering: Vec<(String, Message)>,
    /// Accepted steering keys, oldest first (at most [`SEEN_MAX`]).
    seen: VecDeque<String>,
    seen_set: BTreeSet<String>,
    cursors: BTreeMap<String, String>,
}

/// A handle on in-memory tables, as one owner.
pub struct Memory {
    tables: Arc<Mutex<Tables>>,
    owner: Owner,
}

impl Memory {
    /// A new, empty store.
    pub fn open(owner: Owner) -> Memory {
        Memory {
            tables: Arc::default(),
            owner,
        }
    }

    /// The same tables as another owner (several daemons' views in one process, for tests).
    #[cfg(test)]
    pub(crate) fn beside(&self, owner: Owner) -> Memory {
        Memory {
            tables: Arc::clone(&self.tables),
            owner,
        }
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Tables {
    /// The owners that are alive: `me`, and each other whose heartbeat is fresh and, when it
    /// runs on this host, whose process still exists.
    fn live_owners(&self, me: &Owner, now: Millis) -> BTreeSet<String> {
        let mut live = BTreeSet::from([me.id.clone()]);
        for (id, (host, pid, beat)) in &self.owners {
            let fresh = beat.saturating_add(me.ttl_ms) >= now;
            let gone = *host == me.hostname && !pid_alive(*pid);
            if fresh && !gone {
                live.insert(id.clone());
            }
        }
        live
    }
}

impl ClaimStore for Memory {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn location(&self) -> String {
        "memory".into()
    }

    fn reopen(&self) -> Result<Box<dyn ClaimStore>, String> {
        Ok(Box::new(Memory {
            tables: Arc::clone(&self.tables),
            owner: self.owner.clone(),
        }))
    }

    fn hydrate(&mut self, limit: usize, now: Millis) -> Result<Hydrated, String> {
        let (steering, steering_seen, steering_cursors) = {
            let t = self.tables();
            (
                t.steering.iter().map(|(_, m)| m.clone()).collect(),
                t.seen.iter().cloned().collect(),
                t.cursors.clone(),
            )
        };
        Ok(Hydrated {
            history: self.history(limit)?,
            sweep: self.sweep(now)?,
            steering,
            steering_seen,
            steering_cursors,
        })
    }

    fn history(&self, limit: usize) -> Result<Vec<RunRecord>, String> {
        Ok(self
            .tables()
            .runs
            .values()
            .rev()
            .take(limit)
            .cloned()
            .collect())
    }

    fn sweep(&mut self, now: Millis) -> Result<Sweep, String> {
        let me = &self.owner;
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        t.owners
            .entry(me.id.clone())
            .and_modify(|o| o.2 = now)
            .or_insert_with(|| (me.hostname.clone(), me.pid, now));
        let live = t.live_owners(me, now);
        let holders: BTreeSet<String> = t
            .claims
            .values()
            .map(|(o, _)| o)
            .chain(t.retries.values().map(|(o, _)| o))
            .cloned()
            .collect();
        let mut out = Sweep::default();
        for dead in holders.iter().filter(|o| !live.contains(*o)) {
            // Its retries first (same attempt and due time), then its runs as retries.
            let mut taken: BTreeSet<Key> = BTreeSet::new();
            for (key, (owner, retry)) in t.retries.iter_mut() {
                if owner != dead {
                    continue;
                }
                taken.insert(key.clone());
                retry.fetching = false;
                retry.due_at = retry.due_at.min(now.saturating_add(MAX_TAKEN_DUE_MS));
                out.taken_over.push((key.clone(), retry.clone()));
                owner.clone_from(&me.id);
            }
            let runs: Vec<(Key, Running)> = t
                .claims
                .iter()
                .filter(|(_, (owner, _))| owner == dead)
                .map(|(key, (_, run))| (key.clone(), run.clone()))
                .collect();
            for (key, run) in runs {
                t.claims.remove(&key);
                if taken.contains(&key) {
                    continue;
                }
                // A retry someone else holds for the slot stays theirs.
                if !t.retries.contains_key(&key) {
                    let retry = retry_of_dead_run(&run, dead, now);
                    t.retries
                        .insert(key.clone(), (me.id.clone(), retry.clone()));
                    out.taken_over.push((key, retry));
                }
            }
        }
        // What other live owners hold now.
        out.foreign = t
            .claims
            .iter()
            .map(|(k, (o, _))| (k, o))
            .chain(t.retries.iter().map(|(k, (o, _))| (k, o)))
            .filter(|(_, o)| **o != me.id)
            .map(|(k, _)| k.clone())
            .collect();
        // The dead are gone now; their rows are this daemon's.
        t.owners.retain(|id, _| live.contains(id));
        Ok(out)
    }

    fn acquire(&mut self, key: &Key, run: &Running, now: Millis) -> Result<(), Claim> {
        let me = &self.owner;
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let live = t.live_owners(me, now);
        for holder in [
            t.claims.get(key).map(|(o, _)| o.clone()),
            t.retries.get(key).map(|(o, _)| o.clone()),
        ]
        .into_iter()
        .flatten()
        {
            if holder != me.id && live.contains(&holder) {
                return Err(Claim::Held(holder));
            }
        }
        // What a dead owner held is dropped.
        if t.retries.get(key).is_some_and(|(o, _)| *o != me.id) {
            t.retries.remove(key);
        }
        t.claims.insert(key.clone(), (me.id.clone(), run.clone()));
        Ok(())
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), String> {
        let me = &self.owner.id;
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut *t;
        for op in ops {
            match op {
                Op::PutRun(r) => {
                    if let Some(end) = t.run_ends.insert(r.run.run_id.clone(), r.ended_at) {
                        t.runs.remove(&(end, r.run.run_id.clone()));
                    }
                    t.runs
                        .insert((r.ended_at, r.run.run_id.clone()), (**r).clone());
                }
                Op::PutRetry(k, r) => put_owned(&mut t.retries, k, me, r),
                Op::DeleteRetry(k) => delete_owned(&mut t.retries, k, me),
                Op::PutClaim(k, r) => put_owned(&mut t.claims, k, me, r),
                Op::DeleteClaim(k) => delete_owned(&mut t.claims, k, me),
                Op::PutSteer(m) => {
                    let key = m.unique_key();
                    t.steering.retain(|(k, _)| *k != key);
                    t.steering.push((key, (**m).clone()));
                }
                Op::DeleteSteer(key) => t.steering.retain(|(k, _)| k != key),
                Op::PutSeen(keys) => {
                    for key in keys {
                        if t.seen_set.insert(key.clone()) {
                            t.seen.push_back(key.clone());
                        }
                    }
                    while t.seen.len() > SEEN_MAX {
                        if let Some(old) = t.seen.pop_front() {
                            t.seen_set.remove(&old);
                        }
                    }
                }
                Op::PutCursor(source, cursor) => {
                    t.cursors.insert(source.clone(), cursor.clone());
                }
            }
        }
        while t.runs.len() > HISTORY_KEPT {
            if let Some(((_, run_id), _)) = t.runs.pop_first() {
                t.run_ends.remove(&run_id);
            }
        }
        Ok(())
    }

    fn unregister(&mut self) -> Result<(), String> {
        let id = self.owner.id.clone();
        self.tables().owners.remove(&id);
        Ok(())
    }
}

/// Writes `record` under `k` for `me`, unless another owner holds the row (as SQLite's
/// conditional upsert: only the owner's rows are written).
fn put_owned<T: Clone>(rows: &mut BTreeMap<Key, (String, T)>, k: &Key, me: &str, record: &T) {
    match rows.get_mut(k) {
        Some((owner, held)) if owner == me => *held = record.clone(),
        Some(_) => {}
        None => {
            rows.insert(k.clone(), (me.to_string(), record.clone()));
        }
    }
}

/// Deletes the row under `k` when `me` holds it.
fn delete_owned<T>(rows: &mut BTreeMap<Key, (String, T)>, k: &Key, me: &str) {
    if rows.get(k).is_some_and(|(o, _)| o == me) {
        rows.remove(k);
    }
}
