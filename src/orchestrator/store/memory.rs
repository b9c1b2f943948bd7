//! The `memory` kind of claim store: the same tables as the others, held in this process only
//! (`SVC_CLAIM_STORE=memory`, a dry run, or a store that could not be opened). Nothing survives
//! the daemon and no other daemon sees it; within the process it keeps every promise of the
//! interface, so the state thread, the store thread and the run threads use it like any kind.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::sweep::{self, Taken};
use super::{
    Capabilities, Claim, ClaimStore, CooldownRow, HISTORY_KEPT, Hydrated, Kind, Op, Owner,
    STALE_SHOWN_MS, StoreError, Sweep,
};
use crate::orchestrator::protocol::{
    Holder, Key, LedgerRow, Relay, Retry, RunRecord, Running, Spent,
};
use crate::steering::{Message, SEEN_MAX};
use crate::time::Millis;

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
    /// Owner id -> who it is, last heartbeat.
    owners: BTreeMap<String, (Owner, Millis)>,
    /// Finished runs by end time and run id; `run_ends` finds a run's entry by its id.
    runs: BTreeMap<(Millis, String), RunRecord>,
    run_ends: BTreeMap<String, Millis>,
    /// Slot -> owner id and what it holds (a claim with its fencing token).
    claims: BTreeMap<Key, (String, (Running, u64))>,
    retries: BTreeMap<Key, (String, Retry)>,
    /// The last fencing token given, and the tokens revoked.
    fence: u64,
    revoked: BTreeSet<u64>,
    /// Undelivered steering messages by unique key, oldest first, with the owner holding each.
    steering: Vec<(String, String, Message)>,
    /// Accepted steering keys, oldest first (at most [`SEEN_MAX`]).
    seen: VecDeque<String>,
    seen_set: BTreeSet<String>,
    /// (Owner, source) -> cursor.
    cursors: BTreeMap<(String, String), String>,
    /// Requests relayed to an owner, oldest first.
    relay: Vec<Relay>,
    /// Slot -> who let it go last, and when.
    released: BTreeMap<Key, (String, Millis)>,
    /// Durable tallies by name.
    tallies: BTreeMap<String, f64>,
    /// Marks by scope, oldest first.
    marks: BTreeMap<String, VecDeque<String>>,
    /// The ledger: (line, owner) -> what that owner added, and when it last changed.
    ledger: BTreeMap<(String, String), (Spent, u64)>,
    ledger_seq: u64,
    /// Cooldowns by scope key and kind ([`CooldownRow`]).
    cooldowns: BTreeMap<(String, String), CooldownRow>,
}

/// A handle on in-memory tables, as one owner.
pub struct Memory {
    tables: Arc<Mutex<Tables>>,
    owner: Owner,
    /// The newest change of the ledger this handle's sweeps have reported.
    ledger_seen: u64,
}

impl Memory {
    /// A new, empty store.
    pub fn open(owner: Owner) -> Memory {
        Memory {
            tables: Arc::default(),
            owner,
            ledger_seen: 0,
        }
    }

    /// The same tables as another owner (several daemons' views in one process, for tests).
    #[cfg(test)]
    pub(crate) fn beside(&self, owner: Owner) -> Memory {
        Memory {
            tables: Arc::clone(&self.tables),
            owner,
            ledger_seen: 0,
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
        for (id, (owner, beat)) in &self.owners {
            if sweep::alive(me, &owner.hostname, owner.pid, *beat, now) {
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

    fn reopen(&self) -> Result<Box<dyn ClaimStore>, StoreError> {
        Ok(Box::new(Memory {
            tables: Arc::clone(&self.tables),
            owner: self.owner.clone(),
            ledger_seen: 0,
        }))
    }

    fn hydrate(&mut self, limit: usize, now: Millis) -> Result<Hydrated, StoreError> {
        let mut sweep = self.sweep(now)?;
        sweep.steering.clear();
        sweep.cursors.clear();
        let me = self.owner.id.clone();
        let (steering, steering_seen, steering_cursors) = {
            let t = self.tables();
            (
                t.steering
                    .iter()
                    .filter(|(_, o, _)| *o == me)
                    .map(|(_, _, m)| m.clone())
                    .collect(),
                t.seen.iter().cloned().collect(),
                t.cursors
                    .iter()
                    .filter(|((o, _), _)| *o == me)
                    .map(|((_, s), c)| (s.clone(), c.clone()))
                    .collect(),
            )
        };
        Ok(Hydrated {
            history: self.history(limit)?,
            sweep,
            steering,
            steering_seen,
            steering_cursors,
        })
    }

    fn history(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        Ok(self
            .tables()
            .runs
            .values()
            .rev()
            .take(limit)
            .cloned()
            .collect())
    }

    fn sweep(&mut self, now: Millis) -> Result<Sweep, StoreError> {
        let me = &self.owner;
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut *t;
        t.owners
            .entry(me.id.clone())
            .and_modify(|o| o.1 = now)
            .or_insert_with(|| (me.clone(), now));
        let live = t.live_owners(me, now);
        let holders: BTreeSet<String> = t
            .claims
            .values()
            .map(|(o, _)| o)
            .chain(t.retries.values().map(|(o, _)| o))
            .chain(t.steering.iter().map(|(_, o, _)| o))
            .chain(t.cursors.keys().map(|(o, _)| o))
            .chain(t.relay.iter().map(|r| &r.to_owner))
            .cloned()
            .collect();
        let mut out = Sweep::default();
        let mut rows = Rows {
            t: &mut *t,
            me: &me.id,
        };
        let taken = holders
            .iter()
            .filter(|o| !live.contains(*o))
            .try_for_each(|dead| sweep::take_over(&mut rows, dead, now, &mut out))
            .and_then(|()| sweep::take_relayed(&mut rows, &mut out));
        if let Err(never) = taken {
            match never {}
        }
        // What other live owners hold now.
        let identifier = |k: &Key, o: &String, identifier: &String| {
            (
                k.clone(),
                Holder {
                    owner: o.clone(),
                    identifier: identifier.clone(),
                },
            )
        };
        out.foreign = t
            .claims
            .iter()
            .filter(|(_, (o, _))| *o != me.id)
            .map(|(k, (o, (run, _)))| identifier(k, o, &run.slot.issue.identifier))
            .chain(
                t.retries
                    .iter()
                    .filter(|(_, (o, _))| *o != me.id)
                    .map(|(k, (o, r))| identifier(k, o, &r.slot.issue.identifier)),
            )
            .collect();
        // The dead are shown stale for a while, then forgotten.
        let keep = me.ttl_ms.max(STALE_SHOWN_MS);
        t.owners
            .retain(|_, (_, beat)| beat.saturating_add(keep) >= now);
        let claims = &t.claims;
        out.fleet = Some(
            t.owners
                .values()
                .map(|(owner, _)| {
                    let running = claims.values().filter(|(o, _)| *o == owner.id).count();
                    owner.member(
                        u32::try_from(running).unwrap_or(u32::MAX),
                        !live.contains(&owner.id),
                    )
                })
                .collect(),
        );
        for ((name, owner), (spent, seq)) in &t.ledger {
            if *seq > self.ledger_seen && *owner != me.id {
                out.ledger.push(LedgerRow {
                    name: name.clone(),
                    owner: owner.clone(),
                    spent: *spent,
                });
            }
        }
        self.ledger_seen = t.ledger_seq;
        out.cooldowns = t
            .cooldowns
            .values()
            .filter(|c| c.until > now)
            .filter_map(|c| c.shared(&me.hostname))
            .collect();
        out.cooldowns
            .sort_by(|a, b| (&a.kind, &a.scope).cmp(&(&b.kind, &b.scope)));
        Ok(out)
    }

    fn acquire(
        &mut self,
        key: &Key,
        run: &Running,
        now: Millis,
        seen_at: Millis,
    ) -> Result<u64, Claim> {
        let me = &self.owner;
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let live = t.live_owners(me, now);
        if let Some((owner, at)) = t.released.get(key)
            && *owner != me.id
            && *at > seen_at
        {
            return Err(Claim::Superseded(owner.clone()));
        }
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
        // What a dead owner held is dropped, and its token revoked.
        if t.retries.get(key).is_some_and(|(o, _)| *o != me.id) {
            t.retries.remove(key);
        }
        if let Some((_, (_, token))) = t.claims.get(key).filter(|(o, _)| *o != me.id) {
            let token = *token;
            t.revoked.insert(token);
        }
        t.fence += 1;
        let token = t.fence;
        t.claims
            .insert(key.clone(), (me.id.clone(), (run.clone(), token)));
        Ok(token)
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        let me = &self.owner.id;
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut *t;
        for op in ops {
            match op {
                Op::PutCooldown(c) => {
                    let row = CooldownRow::of(c, &self.owner.hostname);
                    let gone = crate::time::unix_ms().saturating_sub(super::COOLDOWN_KEPT_MS);
                    put_cooldown(t, row, gone);
                }
                Op::Fence(token) => {
                    if t.revoked.contains(token) {
                        break;
                    }
                }
                Op::PutRun(r) if r.run.claim_token.is_some_and(|c| t.revoked.contains(&c)) => {}
                Op::PutRetry(_, r) if r.claim_token.is_some_and(|c| t.revoked.contains(&c)) => {}
                Op::PutClaim(_, r) if r.claim_token.is_some_and(|c| t.revoked.contains(&c)) => {}
                Op::PutRun(r) => {
                    if let Some(end) = t.run_ends.insert(r.run.run_id.clone(), r.ended_at) {
                        t.runs.remove(&(end, r.run.run_id.clone()));
                    }
                    t.runs
                        .insert((r.ended_at, r.run.run_id.clone()), (**r).clone());
                }
                // Never on a slot another daemon runs (see the PostgreSQL store).
                Op::PutRetry(k, _) if t.claims.get(k).is_some_and(|(o, _)| o != me) => {}
                Op::PutRetry(k, r) => put_owned(&mut t.retries, k, me, r),
                Op::DeleteRetry(k) => delete_owned(&mut t.retries, k, me),
                Op::PutClaim(k, r) => match t.claims.get_mut(k) {
                    Some((owner, (held, _))) if *owner == *me => *held = (**r).clone(),
                    Some(_) => {}
                    None => {
                        t.claims.insert(k.clone(), (me.clone(), ((**r).clone(), 0)));
                    }
                },
                Op::DeleteClaim(k) => {
                    if t.claims.get(k).is_some_and(|(o, _)| o == me) {
                        t.claims.remove(k);
                        let now = crate::time::unix_ms();
                        t.released.insert(k.clone(), (me.clone(), now));
                    }
                }
                Op::PutSteer(m) => put_steer(t, me, m),
                Op::DeleteSteer(key) => t.steering.retain(|(k, o, _)| k != key || o != me),
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
                    t.cursors
                        .insert((me.clone(), source.clone()), cursor.clone());
                }
                Op::Relay(relay) => t.relay.push((**relay).clone()),
                Op::Spend(name, spent) => {
                    t.ledger_seq += 1;
                    let seq = t.ledger_seq;
                    let line = t.ledger.entry((name.clone(), me.clone())).or_default();
                    line.0.add(spent);
                    line.1 = seq;
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

    fn unregister(&mut self) -> Result<(), StoreError> {
        let id = self.owner.id.clone();
        self.tables().owners.remove(&id);
        Ok(())
    }

    fn add_tallies(&mut self, deltas: &[(String, f64)]) -> Result<Vec<f64>, StoreError> {
        let mut t = self.tables();
        Ok(deltas
            .iter()
            .map(|(name, delta)| {
                let total = t.tallies.entry(name.clone()).or_default();
                *total += delta;
                *total
            })
            .collect())
    }

    fn tallies(&mut self, prefix: &str) -> Result<Vec<(String, f64)>, StoreError> {
        let t = self.tables();
        Ok(t.tallies
            .range(prefix.to_string()..)
            .take_while(|(name, _)| name.starts_with(prefix))
            .map(|(name, value)| (name.clone(), *value))
            .collect())
    }

    fn line_cost(&mut self, line: &str) -> Result<f64, StoreError> {
        let t = self.tables();
        Ok(t.ledger
            .iter()
            .filter(|((name, _), _)| name == line)
            .map(|(_, (spent, _))| spent.cost_usd)
            .sum())
    }

    fn mark(&mut self, scope: &str, key: &str, keep: usize) -> Result<bool, StoreError> {
        let mut t = self.tables();
        let marks = t.marks.entry(scope.to_string()).or_default();
        if marks.iter().any(|k| k == key) {
            return Ok(false);
        }
        marks.push_back(key.to_string());
        while marks.len() > keep {
            marks.pop_front();
        }
        Ok(true)
    }
}

/// The tables as one owner's sweep queries them ([`sweep::Rows`]).
struct Rows<'a> {
    t: &'a mut Tables,
    me: &'a str,
}

impl sweep::Rows for Rows<'_> {
    type Error = std::convert::Infallible;

    fn move_retries(&mut self, dead: &str) -> Result<Vec<Taken<Retry>>, Self::Error> {
        let mut moved = Vec::new();
        for (key, (owner, retry)) in self.t.retries.iter_mut().filter(|(_, (o, _))| o == dead) {
            owner.clear();
            owner.push_str(self.me);
            moved.push((key.clone(), Some(retry.clone()), retry.claim_token));
        }
        Ok(moved)
    }

    fn delete_claims(&mut self, dead: &str) -> Result<Vec<Taken<Running>>, Self::Error> {
        let (theirs, others) = std::mem::take(&mut self.t.claims)
            .into_iter()
            .partition(|(_, (o, _))| o == dead);
        self.t.claims = others;
        let theirs: BTreeMap<Key, _> = theirs;
        Ok(theirs
            .into_iter()
            .map(|(key, (_, (run, token)))| (key, Some(run), Some(token)))
            .collect())
    }

    fn revoke(&mut self, token: Option<u64>) -> Result<(), Self::Error> {
        self.t.revoked.extend(token);
        Ok(())
    }

    fn insert_retry(&mut self, key: &Key, retry: &Retry) -> Result<bool, Self::Error> {
        if self.t.retries.contains_key(key) {
            return Ok(false);
        }
        let row = (self.me.to_string(), retry.clone());
        self.t.retries.insert(key.clone(), row);
        Ok(true)
    }

    fn move_steering(&mut self, dead: &str) -> Result<Vec<Message>, Self::Error> {
        let mut moved = Vec::new();
        for (_, owner, m) in self.t.steering.iter_mut().filter(|(_, o, _)| o == dead) {
            owner.clear();
            owner.push_str(self.me);
            moved.push(m.clone());
        }
        Ok(moved)
    }

    fn delete_cursors(&mut self, dead: &str) -> Result<Vec<(String, String)>, Self::Error> {
        let (theirs, others) = std::mem::take(&mut self.t.cursors)
            .into_iter()
            .partition(|((o, _), _)| o == dead);
        self.t.cursors = others;
        let theirs: BTreeMap<(String, String), String> = theirs;
        Ok(theirs.into_iter().map(|((_, s), c)| (s, c)).collect())
    }

    fn cursor(&mut self, source: &str) -> Result<Option<String>, Self::Error> {
        let key = (self.me.to_string(), source.to_string());
        Ok(self.t.cursors.get(&key).cloned())
    }

    fn put_cursor(&mut self, source: &str, cursor: &str) -> Result<(), Self::Error> {
        let key = (self.me.to_string(), source.to_string());
        self.t.cursors.insert(key, cursor.to_string());
        Ok(())
    }

    fn move_relays(&mut self, dead: &str) -> Result<(), Self::Error> {
        for relay in self.t.relay.iter_mut().filter(|r| r.to_owner == *dead) {
            relay.to_owner = self.me.to_string();
        }
        Ok(())
    }

    fn take_relays(&mut self) -> Result<Vec<Relay>, Self::Error> {
        let (mine, others) = std::mem::take(&mut self.t.relay)
            .into_iter()
            .partition(|r| r.to_owner == self.me);
        self.t.relay = others;
        Ok(mine)
    }

    fn put_steer(&mut self, m: &Message) -> Result<(), Self::Error> {
        put_steer(self.t, self.me, m);
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

/// A waiting steering message, held by `owner`.
fn put_steer(t: &mut Tables, owner: &str, m: &Message) {
    let key = m.unique_key();
    t.steering.retain(|(k, _, _)| *k != key);
    t.steering.push((key, owner.to_string(), m.clone()));
}

/// Keeps `row` unless its scope and kind have a row that ends no earlier (of two daemons'
/// cooldowns the later reset stands); rows whose reset is before `gone` are let go.
fn put_cooldown(t: &mut Tables, row: CooldownRow, gone: Millis) {
    let at = (row.scope_key.clone(), row.kind.clone());
    if t.cooldowns
        .get(&at)
        .is_none_or(|held| held.until < row.until)
    {
        t.cooldowns.insert(at, row);
    }
    t.cooldowns.retain(|_, c| c.until >= gone);
}

/// Deletes the row under `k` when `me` holds it.
fn delete_owned<T>(rows: &mut BTreeMap<Key, (String, T)>, k: &Key, me: &str) {
    if rows.get(k).is_some_and(|(o, _)| o == me) {
        rows.remove(k);
    }
}
