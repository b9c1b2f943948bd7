//! Review feedback on parked issues, for the trackers whose change requests steer (GitHub's
//! pull requests, GitLab's merge requests): no tracker I/O, the provider hands in its moves.
//! The one write is the mark of a piece of feedback that sent its issue back, made in the
//! daemon's durable store handed in with the provider ([`crate::facts::Later`]).
//!
//! An issue is *parked* when it is open in a state neither active nor terminal (`Human
//! Review`). Feedback on it goes to the state thread as held ([`Batch::held`]): it waits for the
//! issue's next run (kept in the claim store like every waiting message), so the run that picks
//! it up has it in its first prompt. With `rework_state` the first piece of feedback also moves
//! the issue there, so that run comes at once; without it, the run comes when a person moves
//! the issue back to work. **Invariant:** a piece of feedback (by its key) sends its issue back
//! once, however often a source offers it again (a comment cursor's overlap); a move that fails
//! is tried again at each read while the issue stays parked, said once per episode. Feedback
//! read as ordinary steering while the issue's run was ending (before any read saw it parked)
//! waits for the next run in the state thread; the poller hands it back, and it moves the issue
//! the same way ([`Rework::waiting`]).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::steering::{Batch, Message};
use crate::tracker::TrackerError;

/// Feedback keys remembered as having sent their issue back (well over what one overlap of a
/// comment cursor can offer again).
pub const REWORKED_MAX: usize = 1000;
/// Parked issues a provider watches at most.
pub const PARKED_MAX: usize = 100;

/// The parked issues a feedback reader watches beside the `issues` it was given (those not
/// among them), and the ids of every parked issue: one among `issues` in a parked state (its
/// agent just moved it to `Human Review`) is parked too, so feedback on it is for its next run.
pub fn parked_beside(
    issues: &[crate::tracker::Issue],
    parked: Vec<crate::tracker::Issue>,
    is_parked: impl Fn(&str) -> bool,
) -> (Vec<crate::tracker::Issue>, HashSet<String>) {
    let given: HashSet<&str> = issues.iter().map(|i| i.id.as_str()).collect();
    let parked: Vec<crate::tracker::Issue> = parked
        .into_iter()
        .filter(|i| !given.contains(i.id.as_str()))
        .collect();
    let ids = parked
        .iter()
        .chain(issues.iter().filter(|i| is_parked(&i.state)))
        .map(|i| i.id.clone())
        .collect();
    (parked, ids)
}

#[derive(Default)]
pub struct Rework {
    /// Where the daemon's durable store ([`crate::facts`]) keeps what sent issues back, so a
    /// restart (or another daemon of the fleet reading the same feedback) moves no issue twice;
    /// `None` keeps it in this process only.
    scope: Option<String>,
    /// The durable store, as handed in (empty: this process's memo only).
    facts: crate::facts::Later,
    /// Issue ids and keys of the feedback that already sent its issue back, newest last (at most
    /// [`REWORKED_MAX`]).
    reworked: VecDeque<String>,
    /// Parked issues whose feedback came but whose move is still to make, by issue id: who
    /// wrote the first of that feedback.
    pending: HashMap<String, String>,
    /// Issues whose move failed in the current episode (said once).
    failing: HashSet<String>,
}

impl Rework {
    /// A memo kept in the daemon's durable store under `scope` (the provider and its endpoint).
    pub fn kept(scope: String) -> Rework {
        Rework {
            scope: Some(scope),
            ..Rework::default()
        }
    }

    /// Keeps the memo in `facts` (the daemon's durable store, once it is open).
    pub fn keep_in(&mut self, facts: crate::facts::Later) {
        self.facts = facts;
    }

    /// Whether `key` sends its issue back for the first time: not here, and not in the
    /// durable store (a store that cannot be reached now leaves it to this process's memo).
    fn first_time(&mut self, key: &str) -> bool {
        if self.reworked.iter().any(|k| k == key) {
            return false;
        }
        self.reworked.push_back(key.to_string());
        while self.reworked.len() > REWORKED_MAX {
            self.reworked.pop_front();
        }
        let (Some(scope), Some(facts)) = (&self.scope, self.facts.get()) else {
            return true;
        };
        facts.mark(scope, key, REWORKED_MAX).unwrap_or_else(|e| {
            log::warn!("review feedback {key}: not remembered in the claim store ({e}); this daemon remembers it until it stops");
            true
        })
    }

    /// Moves the messages of `batch` for `parked` issues to [`Batch::held`]; with `moves`
    /// (a `rework_state` is set), the first new piece of feedback on an issue makes its move
    /// pending.
    pub fn hold(&mut self, batch: &mut Batch, parked: &HashSet<String>, moves: bool) {
        let mut kept = Vec::new();
        for m in std::mem::take(&mut batch.messages) {
            if !parked.contains(&m.issue_id) {
                kept.push(m);
                continue;
            }
            // By issue too: one merge request's feedback sends back each issue it closes.
            let key = format!("{} {}", m.issue_id, m.key);
            if moves && self.first_time(&key) {
                self.pending
                    .entry(m.issue_id.clone())
                    .or_insert_with(|| m.author.clone());
            }
            batch.held.push(m);
        }
        batch.messages = kept;
    }

    /// Feedback of `source` that waits for a parked issue's next run though it came as
    /// ordinary steering (read while the issue's run was ending, before any read saw it
    /// parked): with `moves`, it sends its issue back as held feedback does, once per key.
    pub fn waiting(
        &mut self,
        waiting: &[Message],
        source: crate::steering::Source,
        parked: &HashSet<String>,
        moves: bool,
    ) {
        if !moves {
            return;
        }
        for m in waiting {
            if m.source != source || !parked.contains(&m.issue_id) {
                continue;
            }
            let key = format!("{} {}", m.issue_id, m.key);
            if self.first_time(&key) {
                self.pending
                    .entry(m.issue_id.clone())
                    .or_insert_with(|| m.author.clone());
            }
        }
    }

    /// The moves to make now: (issue id, who wrote the feedback). An issue no longer parked
    /// (a person moved it, it closed) needs none.
    pub fn pending(&mut self, parked: &HashSet<String>) -> Vec<(String, String)> {
        self.pending.retain(|id, _| parked.contains(id));
        self.failing.retain(|id| self.pending.contains_key(id));
        let mut out: Vec<(String, String)> = self
            .pending
            .iter()
            .map(|(id, who)| (id.clone(), who.clone()))
            .collect();
        out.sort();
        out
    }

    /// Makes the pending moves to `state` with `set_state`, logging each; a failing one is
    /// said once per episode and tried again at the next read.
    pub fn move_pending(
        &mut self,
        parked: &HashSet<String>,
        state: &str,
        mut set_state: impl FnMut(&str, &str) -> Result<(), TrackerError>,
    ) {
        for (id, author) in self.pending(parked) {
            match set_state(&id, state) {
                Ok(()) => {
                    log::info!("{id}: review feedback from {author} moves it to {state}");
                    self.pending.remove(&id);
                    self.failing.remove(&id);
                }
                Err(e) => {
                    if self.failing.insert(id.clone()) {
                        log::warn!(
                            "{id}: review feedback came, but moving it to {state} failed: {e}; the feedback waits for its next run, and svc tries the move again at each poll"
                        );
                    }
                }
            }
        }
    }
}

/// Sorts a batch's messages and held messages oldest first (ties by key).
pub fn sort(batch: &mut Batch) {
    let by_time = |a: &Message, b: &Message| {
        crate::time::parse_time(&a.at)
            .cmp(&crate::time::parse_time(&b.at))
            .then_with(|| a.key.cmp(&b.key))
    };
    batch.messages.sort_by(by_time);
    batch.held.sort_by(by_time);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steering::Source;

    fn msg(issue: &str, key: &str) -> Message {
        Message {
            issue_id: issue.into(),
            source: Source::Gitlab,
            author: "alice".into(),
            text: "fix it".into(),
            at: "2026-11-26T10:00:00Z".into(),
            key: key.into(),
        }
    }

    #[test]
    fn feedback_on_a_parked_issue_is_held_and_moves_it_once() {
        let parked: HashSet<String> = ["p".to_string()].into();
        let mut rework = Rework::default();
        let mut batch = Batch {
            messages: vec![msg("p", "n1"), msg("r", "n2")],
            ..Default::default()
        };
        rework.hold(&mut batch, &parked, true);
        assert_eq!(batch.messages, [msg("r", "n2")]);
        assert_eq!(batch.held, [msg("p", "n1")]);
        let mut moves = Vec::new();
        rework.move_pending(&parked, "In Progress", |id, s| {
            moves.push(format!("{id} {s}"));
            Ok(())
        });
        assert_eq!(moves, ["p In Progress"]);
        // Offered again: held again, but no second move.
        let mut again = Batch {
            messages: vec![msg("p", "n1")],
            ..Default::default()
        };
        rework.hold(&mut again, &parked, true);
        assert_eq!(again.held.len(), 1);
        assert!(rework.pending(&parked).is_empty());
    }

    /// Marks in memory, as the claim store keeps them.
    #[derive(Default)]
    struct Marks(std::sync::Mutex<HashSet<String>>);

    impl crate::facts::Facts for Marks {
        fn add(&self, _: &[(String, f64)]) -> Result<Vec<f64>, String> {
            unreachable!()
        }
        fn tallies(&self, _: &str) -> Result<Vec<(String, f64)>, String> {
            unreachable!()
        }
        fn mark(&self, scope: &str, key: &str, _: usize) -> Result<bool, String> {
            Ok(self.0.lock().unwrap().insert(format!("{scope} {key}")))
        }
    }

    #[test]
    fn feedback_remembered_in_the_store_moves_its_issue_once_across_restarts_and_daemons() {
        let parked: HashSet<String> = ["p".to_string()].into();
        let store: std::sync::Arc<dyn crate::facts::Facts> = std::sync::Arc::new(Marks::default());
        let kept = || Rework {
            facts: store.clone().into(),
            ..Rework::kept("rework github:x".into())
        };
        let feedback = || Batch {
            messages: vec![msg("p", "n1")],
            ..Default::default()
        };
        let mut first = kept();
        first.hold(&mut feedback(), &parked, true);
        assert_eq!(first.pending(&parked).len(), 1);
        // After a restart (a new memo), or in another daemon: held, but no second move.
        let mut again = kept();
        let mut batch = feedback();
        again.hold(&mut batch, &parked, true);
        assert_eq!(batch.held.len(), 1);
        assert!(again.pending(&parked).is_empty());
        // Another scope (another endpoint) is another matter.
        let mut other = Rework {
            facts: store.clone().into(),
            ..Rework::kept("rework gitlab:y".into())
        };
        other.hold(&mut feedback(), &parked, true);
        assert_eq!(other.pending(&parked).len(), 1);
    }

    /// Feedback read as ordinary steering while its issue's run was ending waits for the next
    /// run; once a read sees the issue parked, that feedback sends it back, once per key, and
    /// feedback that came held (already counted) or from another source does not.
    #[test]
    fn waiting_feedback_on_a_parked_issue_moves_it_once() {
        let parked: HashSet<String> = ["p".to_string()].into();
        let mut rework = Rework::default();
        let mut held = Batch {
            messages: vec![msg("p", "n1")],
            ..Default::default()
        };
        rework.hold(&mut held, &parked, true);
        rework.move_pending(&parked, "In Progress", |_, _| Ok(()));
        let mut operator = msg("p", "op");
        operator.source = Source::Api;
        let waiting = [msg("p", "n1"), operator, msg("r", "n3")];
        rework.waiting(&waiting, Source::Gitlab, &parked, true);
        assert!(
            rework.pending(&parked).is_empty(),
            "held before, an operator's, not parked"
        );
        let waiting = [msg("p", "n2")];
        rework.waiting(&waiting, Source::Gitlab, &parked, false);
        assert!(rework.pending(&parked).is_empty(), "no rework_state");
        rework.waiting(&waiting, Source::Gitlab, &parked, true);
        assert_eq!(rework.pending(&parked), [("p".into(), "alice".into())]);
        rework.move_pending(&parked, "In Progress", |_, _| Ok(()));
        rework.waiting(&waiting, Source::Gitlab, &parked, true);
        assert!(rework.pending(&parked).is_empty(), "once per key");
    }

    #[test]
    fn one_key_on_two_parked_issues_moves_both() {
        let parked: HashSet<String> = ["p".to_string(), "q".to_string()].into();
        let mut rework = Rework::default();
        let mut batch = Batch {
            messages: vec![msg("p", "n1"), msg("q", "n1")],
            ..Default::default()
        };
        rework.hold(&mut batch, &parked, true);
        let ids: Vec<String> = rework
            .pending(&parked)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, ["p", "q"]);
    }

    #[test]
    fn a_failing_move_is_kept_until_the_issue_leaves_its_parking() {
        let parked: HashSet<String> = ["p".to_string()].into();
        let mut rework = Rework::default();
        let mut batch = Batch {
            messages: vec![msg("p", "n1")],
            ..Default::default()
        };
        rework.hold(&mut batch, &parked, true);
        rework.move_pending(&parked, "In Progress", |_, _| {
            Err(TrackerError::unavailable("down"))
        });
        assert_eq!(rework.pending(&parked).len(), 1);
        assert!(rework.pending(&HashSet::new()).is_empty());
        // Without rework_state nothing is ever pending.
        let mut batch = Batch {
            messages: vec![msg("p", "n9")],
            ..Default::default()
        };
        rework.hold(&mut batch, &parked, false);
        assert_eq!(batch.held.len(), 1);
        assert!(rework.pending(&parked).is_empty());
    }
}
