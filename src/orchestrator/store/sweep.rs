//! The decisions of a sweep, made once for every kind: who is alive, what a dead owner's rows
//! become (its retries this daemon's, its runs retries, its waiting messages and cursors this
//! daemon's, what was relayed to it this daemon's to deliver), and what was relayed to this
//! daemon. Each kind answers the queries ([`Rows`]) inside its own transaction.

use std::collections::BTreeSet;

use super::{MAX_TAKEN_DUE_MS, Owner, Sweep, merge_cursor, pid_alive, retry_of_dead_run};
use crate::orchestrator::protocol::{Key, Relay, Relayed, Retry, Running};
use crate::steering::Message;
use crate::time::Millis;

/// A slot's row as a takeover reads it: the slot, its record (`None`: unreadable, skipped) and
/// the fencing token to revoke.
pub type Taken<T> = (Key, Option<T>, Option<u64>);

/// The queries of a sweep, in one kind's transaction, as this daemon (`me`).
pub trait Rows {
    type Error;
    /// The dead owner's retries, made `me`'s (with no token).
    fn move_retries(&mut self, dead: &str) -> Result<Vec<Taken<Retry>>, Self::Error>;
    /// The dead owner's claims, deleted.
    fn delete_claims(&mut self, dead: &str) -> Result<Vec<Taken<Running>>, Self::Error>;
    /// Revokes a fencing token: no write that carries it lands any more.
    fn revoke(&mut self, token: Option<u64>) -> Result<(), Self::Error>;
    /// Writes `retry` as `me`'s unless the slot has a retry already; true when written.
    fn insert_retry(&mut self, key: &Key, retry: &Retry) -> Result<bool, Self::Error>;
    /// The dead owner's waiting messages, made `me`'s, oldest first.
    fn move_steering(&mut self, dead: &str) -> Result<Vec<Message>, Self::Error>;
    /// The dead owner's steering cursors (source, cursor), deleted.
    fn delete_cursors(&mut self, dead: &str) -> Result<Vec<(String, String)>, Self::Error>;
    /// `me`'s cursor of `source`.
    fn cursor(&mut self, source: &str) -> Result<Option<String>, Self::Error>;
    /// Sets `me`'s cursor of `source`.
    fn put_cursor(&mut self, source: &str, cursor: &str) -> Result<(), Self::Error>;
    /// What was relayed to the dead owner is for `me` now.
    fn move_relays(&mut self, dead: &str) -> Result<(), Self::Error>;
    /// The requests relayed to `me`, deleted, oldest first.
    fn take_relays(&mut self) -> Result<Vec<Relay>, Self::Error>;
    /// A waiting message of `me`'s.
    fn put_steer(&mut self, m: &Message) -> Result<(), Self::Error>;
}

/// Whether another owner is alive for `me`: its heartbeat (`beat`) is fresh by `me`'s TTL and,
/// when it runs on this host, its process still exists.
pub fn alive(me: &Owner, hostname: &str, pid: u32, beat: Millis, now: Millis) -> bool {
    let fresh = beat.saturating_add(me.ttl_ms) >= now;
    let gone = hostname == me.hostname && !pid_alive(pid);
    fresh && !gone
}

/// Takes over what the dead owner `dead` held: its retries first (same attempt and due time,
/// no later than [`MAX_TAKEN_DUE_MS`] from now), then its runs as retries (unless another owner
/// holds a retry of the slot), its waiting messages, its cursors (the earlier of two time
/// cursors is kept, [`merge_cursor`]) and what was relayed to it; every token it held is
/// revoked.
pub fn take_over<R: Rows>(
    rows: &mut R,
    dead: &str,
    now: Millis,
    out: &mut Sweep,
) -> Result<(), R::Error> {
    let mut taken: BTreeSet<Key> = BTreeSet::new();
    for (key, retry, token) in rows.move_retries(dead)? {
        taken.insert(key.clone());
        rows.revoke(token)?;
        if let Some(mut retry) = retry {
            retry.fetching = false;
            retry.due_at = retry.due_at.min(now.saturating_add(MAX_TAKEN_DUE_MS));
            retry.claim_token = None;
            out.taken_over.push((key, retry));
        }
    }
    for (key, run, token) in rows.delete_claims(dead)? {
        rows.revoke(token)?;
        let Some(run) = run else {
            continue;
        };
        if taken.contains(&key) {
            continue;
        }
        let retry = retry_of_dead_run(&run, dead, now);
        // A retry someone else holds for the slot stays theirs.
        if rows.insert_retry(&key, &retry)? {
            out.taken_over.push((key, retry));
        }
    }
    out.steering.extend(rows.move_steering(dead)?);
    for (source, cursor) in rows.delete_cursors(dead)? {
        let mine = rows.cursor(&source)?;
        let kept = match &mine {
            Some(mine) => merge_cursor(mine, &cursor),
            None => cursor,
        };
        if mine.as_ref() != Some(&kept) {
            rows.put_cursor(&source, &kept)?;
            out.cursors.insert(source, kept);
        }
    }
    // What was relayed to it is for whoever holds the issue now: delivered here (this daemon
    // took its slots over), or by the next run's daemon as a waiting message.
    rows.move_relays(dead)
}

/// Takes the requests relayed to this daemon: each delivered once (a steering message is this
/// daemon's waiting message in the same transaction, so a crash cannot lose it).
pub fn take_relayed<R: Rows>(rows: &mut R, out: &mut Sweep) -> Result<(), R::Error> {
    for relay in rows.take_relays()? {
        if let Relayed::Steer(m) = &relay.what {
            rows.put_steer(m)?;
        }
        out.relayed.push(relay);
    }
    Ok(())
}
