//! Rate limits in the state machine: a kind that met one cools down until its reset (no run
//! starts on it), runs that would use it go to its first fallback that is not cooling down, and
//! the end of a cooldown lets dispatch resume.

use super::*;
use crate::config::CooldownScope;
use crate::orchestrator::protocol::{Cooldown, Limit};

/// What a run on `kind` is called when its issue is routed there but the kind cools down.
pub(super) struct Waits {
    pub kind: String,
    pub until: Millis,
}

/// The cooldown in force for `kind` at `now`.
pub(super) fn cooling<'s>(state: &'s State, kind: &str, now: Millis) -> Option<&'s Cooldown> {
    state.cooldowns.get(kind).filter(|c| c.until > now)
}

/// Which kind runs `issue` now: `routed` (what routing chose) unless it cools down, else its
/// first fallback that does not (with its own settings), unless a route label pinned the kind
/// and its record does not allow `route_fallback`. `Err`: every kind the issue may use cools
/// down, until the earliest reset among them.
pub(super) fn pick_kind(
    state: &State,
    settings: &Settings,
    issue: &Issue,
    routed: String,
    now: Millis,
) -> Result<String, Waits> {
    let Some(cooldown) = cooling(state, &routed, now) else {
        return Ok(routed);
    };
    let mut until = cooldown.until;
    let (_, agents) = settings.agent_for_state(&issue.state);
    let record = agents.kinds.get(&routed);
    let pinned = dispatch::route_names(issue, settings, &routed)
        && !record.is_some_and(|r| r.route_fallback);
    if !pinned {
        for other in record.map(|r| r.fallback.as_slice()).unwrap_or_default() {
            if !agents.kinds.contains_key(other) {
                continue;
            }
            match cooling(state, other, now) {
                None => return Ok(other.clone()),
                Some(c) => until = until.min(c.until),
            }
        }
    }
    Err(Waits {
        kind: routed,
        until,
    })
}

/// `kind` met `limit` at `now`: it cools down until the reset the agent said, else for its
/// `cooldown_ms`. A later reset than the one known extends it; `agent_rate_limited` is said
/// when a cooldown begins.
pub(super) fn note_limit(state: &mut State, now: Millis, kind: &str, limit: &Limit) {
    let record = state.settings.agents.kinds.get(kind);
    let cooldown_ms = record.map_or(crate::config::DEFAULT_COOLDOWN_MS, |r| r.cooldown_ms);
    let scope = match record.map(|r| r.cooldown_scope) {
        Some(CooldownScope::Host) => "host",
        _ => "fleet",
    };
    let until = limit
        .reset_at
        .filter(|t| *t > now)
        .unwrap_or(now + cooldown_ms);
    let known = cooling(state, kind, now).map(|c| c.until);
    if known.is_some_and(|k| k >= until) {
        return;
    }
    state.cooldowns.insert(
        kind.to_string(),
        Cooldown {
            kind: kind.to_string(),
            until,
            since: now,
            reason: limit.reason.clone(),
            scope: scope.to_string(),
        },
    );
    state.event(
        now,
        "agent_rate_limited",
        match known {
            None => format!(
                "{kind} is rate limited until {}: {}",
                crate::time::rfc3339(until),
                limit.reason
            ),
            Some(_) => format!(
                "{kind}'s cooldown extended to {}: {}",
                crate::time::rfc3339(until),
                limit.reason
            ),
        },
        None,
    );
}

/// A cooldown another daemon of the fleet recorded (or this one, before a restart, or another
/// workflow of this daemon): taken when it is of the scope this workflow's settings give the
/// kind and ends later than the one known.
pub fn adopt(state: &mut State, now: Millis, found: Vec<Cooldown>) {
    for c in found {
        if c.until <= now {
            continue;
        }
        let record = state.settings.agents.kinds.get(&c.kind);
        let scope = match record.map(|r| r.cooldown_scope) {
            Some(CooldownScope::Host) => "host",
            _ => "fleet",
        };
        if c.scope != scope {
            continue;
        }
        let known = cooling(state, &c.kind, now).map(|k| k.until);
        if known.is_some_and(|k| k >= c.until) {
            continue;
        }
        if known.is_none() {
            state.event(
                now,
                "agent_rate_limited",
                format!(
                    "{} is rate limited until {} (met by another run of the kind's account): {}",
                    c.kind,
                    crate::time::rfc3339(c.until),
                    c.reason
                ),
                None,
            );
        }
        state.cooldowns.insert(c.kind.clone(), c);
    }
}

/// A turn of a run on `kind` ended; `silent` when it had no output at all. The second silent
/// turn in a row on one kind (in one run or across its runs) is a limit: that run stops
/// `rate_limited`. Returns the stop reason for the run, if it must stop.
pub(super) fn on_turn(
    state: &mut State,
    now: Millis,
    kind: &str,
    silent: bool,
) -> Option<StopReason> {
    if !silent {
        state.silent_turns.remove(kind);
        return None;
    }
    let count = state.silent_turns.entry(kind.to_string()).or_default();
    *count += 1;
    if *count < 2 {
        return None;
    }
    state.silent_turns.remove(kind);
    let limit = Limit {
        reason: "two turns in a row ended with no output at all (a silent limit)".into(),
        reset_at: None,
    };
    note_limit(state, now, kind, &limit);
    Some(StopReason::RateLimited(limit))
}

/// Cooldowns whose reset came: each said `agent_cooldown_ended` and dropped. Returns whether
/// one ended (dispatch may resume).
pub(super) fn end_due(state: &mut State, now: Millis) -> bool {
    let due: Vec<String> = state
        .cooldowns
        .iter()
        .filter(|(_, c)| c.until <= now)
        .map(|(k, _)| k.clone())
        .collect();
    for kind in &due {
        state.cooldowns.remove(kind);
        state.event(
            now,
            "agent_cooldown_ended",
            format!("{kind}'s cooldown ended: runs start on it again"),
            None,
        );
    }
    !due.is_empty()
}

/// The retry error of an issue that waits for a cooldown.
pub(super) fn waiting_error(w: &Waits) -> String {
    format!(
        "agent_rate_limited: {} until {}",
        w.kind,
        crate::time::rfc3339(w.until)
    )
}
