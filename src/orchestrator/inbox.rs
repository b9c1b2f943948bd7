//! Steering's home in the state machine: the messages waiting for an issue's next run, the keys
//! of messages taken (so none is delivered twice), the keys said ignored (so each is said
//! once), and each source's cursor. Pure, like `state`, and owned by it.
//!
//! Every change goes through a method here, and every method that changes anything moves
//! [`Inbox::version`], which the state thread watches to persist steering in one claim-store
//! transaction: no call site can forget it. A method that has to let messages go (a full
//! queue, an issue that is over) returns them, so the caller reports each as
//! `steering_ignored` with its reason: nothing is dropped silently, nothing is kept for ever.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::steering::{self, Message};

/// Keys of steering messages not taken that are remembered (so each is said ignored once).
pub const IGNORED_MAX: usize = 256;

#[derive(Clone, Debug, Default)]
pub struct Inbox {
    /// Messages waiting for an issue's next run, oldest first (at most
    /// [`steering::QUEUE_MAX`] an issue).
    queues: BTreeMap<String, VecDeque<Message>>,
    /// Keys of taken messages (at most [`steering::SEEN_MAX`], oldest first).
    seen: VecDeque<String>,
    seen_set: BTreeSet<String>,
    /// Keys of messages not taken, newest last (at most [`IGNORED_MAX`]): a source offers a
    /// message again while it is in its window, and it is said ignored once.
    ignored: VecDeque<String>,
    /// Each source's cursor (what it has handed in so far).
    cursors: BTreeMap<String, String>,
    version: u64,
}

impl Inbox {
    /// Moves whenever anything here changed (or a run's share of it: [`Inbox::touch`]).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Something kept with steering changed outside the inbox (the messages handed to a run).
    pub fn touch(&mut self) {
        self.version += 1;
    }

    pub fn cursors(&self) -> &BTreeMap<String, String> {
        &self.cursors
    }

    pub fn set_cursor(&mut self, source: String, cursor: String) {
        if self.cursors.get(&source) != Some(&cursor) {
            self.cursors.insert(source, cursor);
            self.version += 1;
        }
    }

    /// Whether the message with this unique key was taken before.
    pub fn was_taken(&self, key: &str) -> bool {
        self.seen_set.contains(key)
    }

    /// The newest key taken.
    pub fn last_taken(&self) -> Option<&String> {
        self.seen.back()
    }

    /// Every key taken, oldest first.
    pub fn taken(&self) -> impl DoubleEndedIterator<Item = &String> {
        self.seen.iter()
    }

    /// Remembers a taken key; false when it was taken before.
    pub fn take_key(&mut self, key: String) -> bool {
        if !self.seen_set.insert(key.clone()) {
            return false;
        }
        self.seen.push_back(key);
        while self.seen.len() > steering::SEEN_MAX {
            if let Some(old) = self.seen.pop_front() {
                self.seen_set.remove(&old);
            }
        }
        self.version += 1;
        true
    }

    /// Notes a key not taken; false when it was noted before (the event is said once).
    pub fn note_ignored(&mut self, key: String) -> bool {
        if self.ignored.contains(&key) {
            return false;
        }
        self.ignored.push_back(key);
        if self.ignored.len() > IGNORED_MAX {
            self.ignored.pop_front();
        }
        true
    }

    /// Queues `message` for its issue's next run; returns what the full queue let go (the
    /// oldest).
    pub fn queue(&mut self, message: Message) -> Vec<Message> {
        self.version += 1;
        let queue = self.queues.entry(message.issue_id.clone()).or_default();
        queue.push_back(message);
        let over = queue.len().saturating_sub(steering::QUEUE_MAX);
        queue.drain(..over).collect()
    }

    /// Puts back what a run did not deliver, ahead of newer messages; returns what the full
    /// queue let go (the newest).
    pub fn requeue(&mut self, issue_id: &str, undelivered: Vec<Message>) -> Vec<Message> {
        if undelivered.is_empty() {
            return Vec::new();
        }
        self.version += 1;
        let queue = self.queues.entry(issue_id.to_string()).or_default();
        for m in undelivered.into_iter().rev() {
            queue.push_front(m);
        }
        let keep = queue.len().min(steering::QUEUE_MAX);
        queue.drain(keep..).collect()
    }

    /// The messages waiting for `issue_id`'s next run, handed to that run.
    pub fn take_for_run(&mut self, issue_id: &str) -> Vec<Message> {
        match self.queues.remove(issue_id) {
            Some(q) => {
                self.version += 1;
                q.into()
            }
            None => Vec::new(),
        }
    }

    /// Lets go of everything waiting for `issue_id` (the issue is over); returns it.
    pub fn release(&mut self, issue_id: &str) -> Vec<Message> {
        self.take_for_run(issue_id)
    }

    /// Keeps only the waiting messages `keep` accepts; returns the others.
    pub fn retain(&mut self, mut keep: impl FnMut(&Message) -> bool) -> Vec<Message> {
        let mut gone = Vec::new();
        for queue in self.queues.values_mut() {
            for m in std::mem::take(queue) {
                if keep(&m) {
                    queue.push_back(m);
                } else {
                    gone.push(m);
                }
            }
        }
        self.queues.retain(|_, q| !q.is_empty());
        if !gone.is_empty() {
            self.version += 1;
        }
        gone
    }

    /// How many messages wait for `issue_id`'s next run.
    pub fn waiting_for(&self, issue_id: &str) -> usize {
        self.queues.get(issue_id).map_or(0, VecDeque::len)
    }

    /// The issues with messages waiting.
    pub fn waiting_issues(&self) -> impl Iterator<Item = &String> {
        self.queues.keys()
    }

    /// Every waiting message.
    pub fn queued(&self) -> impl Iterator<Item = &Message> {
        self.queues.values().flatten()
    }

    /// What a dead daemon sharing the claim store left, taken over by this one: its waiting
    /// messages (those this inbox has not taken already) and its cursors (already merged with
    /// this daemon's by the store). Both are stored again as this daemon's.
    pub fn adopt(
        &mut self,
        waiting: Vec<Message>,
        cursors: BTreeMap<String, String>,
    ) -> Vec<Message> {
        let mut dropped = Vec::new();
        for m in waiting {
            if self.was_taken(&m.unique_key())
                && self.queued().any(|q| q.unique_key() == m.unique_key())
            {
                continue;
            }
            self.take_key(m.unique_key());
            dropped.extend(self.queue(m));
        }
        for (source, cursor) in cursors {
            self.set_cursor(source, cursor);
        }
        self.version += 1;
        dropped
    }

    /// What the claim store held: keys taken, waiting messages (their keys taken too) and
    /// cursors. The version does not move: this is what is stored already.
    pub fn restore(
        &mut self,
        taken: Vec<String>,
        waiting: Vec<Message>,
        cursors: BTreeMap<String, String>,
    ) {
        let version = self.version;
        for key in taken {
            self.take_key(key);
        }
        for m in waiting {
            self.take_key(m.unique_key());
            let queue = self.queues.entry(m.issue_id.clone()).or_default();
            queue.push_back(m);
            let over = queue.len().saturating_sub(steering::QUEUE_MAX);
            queue.drain(..over);
        }
        self.cursors = cursors;
        self.version = version;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steering::Source;

    fn msg(n: usize) -> Message {
        Message {
            issue_id: "i1".into(),
            source: Source::Api,
            author: "ann".into(),
            text: format!("m{n}"),
            at: "2026-11-25T10:00:00Z".into(),
            key: format!("k{n}"),
        }
    }

    #[test]
    fn every_change_moves_the_version_and_what_is_let_go_is_returned() {
        let mut inbox = Inbox::default();
        let v = inbox.version();
        assert!(inbox.take_key("api:k0".into()));
        assert!(!inbox.take_key("api:k0".into()));
        assert!(inbox.version() > v);
        let mut dropped = Vec::new();
        for n in 0..steering::QUEUE_MAX + 2 {
            dropped.extend(inbox.queue(msg(n)));
        }
        assert_eq!(
            dropped.iter().map(|m| m.text.as_str()).collect::<Vec<_>>(),
            ["m0", "m1"],
            "the oldest go, and the caller hears of them"
        );
        let back = inbox.requeue("i1", vec![msg(100)]);
        assert_eq!(back.len(), 1, "a full queue lets the newest go");
        assert_eq!(inbox.queued().next().unwrap().text, "m100");
        let v = inbox.version();
        assert_eq!(inbox.release("i1").len(), steering::QUEUE_MAX);
        assert!(inbox.version() > v);
        assert_eq!(inbox.queued().count(), 0);
        let v = inbox.version();
        inbox.restore(vec!["api:k9".into()], vec![msg(9)], BTreeMap::new());
        assert_eq!(
            inbox.version(),
            v,
            "what the store held is not written again"
        );
        assert!(inbox.was_taken("api:k9"));
    }
}
