//! The spend ledger as the state thread holds it: what was spent per issue and per UTC day
//! (tokens, dollars where known, runs), across retries, restarts and the daemons of a fleet.
//!
//! The claim store keeps one line per (line name, daemon): each daemon adds only to its own
//! ([`super::store::Op::Spend`]), and a sweep brings the other daemons' lines whole when they
//! change. So a line's total is the others' lines plus what this daemon added: nothing is
//! counted twice, however the store's answers and this daemon's additions interleave. A line
//! of an earlier life of this daemon (a restart) is another daemon's line.

use std::collections::{BTreeMap, HashMap};

use super::protocol::{DayReached, LedgerRow, Spent};
use crate::time::Millis;

/// The ledger line of an issue.
pub fn issue_line(identifier: &str) -> String {
    format!("issue:{identifier}")
}

/// The daily budget's word on a run about to start at `now`: with a budget (`daily_usd`), a
/// day whose spend (`line_cost` of the day's line: the fleet's, as the store has it committed
/// now) reached it grants nothing. The state thread learns of other daemons' spend a sweep
/// later; the store knows it now. A spend that cannot be read grants (the state thread's own
/// count holds meanwhile).
pub fn day_refuses<E: std::fmt::Display>(
    daily_usd: Option<f64>,
    now: Millis,
    line_cost: impl FnOnce(&str) -> Result<f64, E>,
) -> Option<DayReached> {
    let budget = daily_usd?;
    match line_cost(&day_line(now)) {
        Ok(spent) => (spent >= budget).then_some(DayReached { spent, budget }),
        Err(e) => {
            log::warn!("claim store: the day's spend not read: {e}");
            None
        }
    }
}

/// The ledger line of the UTC day of `at`.
pub fn day_line(at: Millis) -> String {
    format!("day:{}", day_of(at))
}

/// The UTC day of `at`, `YYYY-MM-DD`.
pub fn day_of(at: Millis) -> String {
    crate::time::rfc3339(at)
        .get(..10)
        .unwrap_or_default()
        .to_string()
}

#[derive(Debug, Default)]
pub struct Ledger {
    /// Other daemons' lines, whole, by (line, owner).
    others: HashMap<(String, String), Spent>,
    /// Their sums by line.
    others_sum: HashMap<String, Spent>,
    /// What this daemon added, by line.
    mine: HashMap<String, Spent>,
    /// What this daemon added since its last hand-over to the store.
    unsent: BTreeMap<String, Spent>,
    /// The current UTC day (days since the epoch) and its line's name, made once a day.
    day: (u64, String),
}

impl Ledger {
    /// A line's total, every daemon's.
    pub fn line(&self, name: &str) -> Spent {
        let mut total = self.others_sum.get(name).copied().unwrap_or_default();
        if let Some(mine) = self.mine.get(name) {
            total.add(mine);
        }
        total
    }

    /// Adds `spent` to the lines `names` (an issue's and the day's).
    pub fn add(&mut self, names: &[&str], spent: &Spent) {
        if spent.is_empty() {
            return;
        }
        // Lines met before take no new key (the hot path of usage reports).
        for name in names {
            match self.mine.get_mut(*name) {
                Some(line) => line.add(spent),
                None => {
                    self.mine.insert((*name).to_string(), *spent);
                }
            }
            match self.unsent.get_mut(*name) {
                Some(line) => line.add(spent),
                None => {
                    self.unsent.insert((*name).to_string(), *spent);
                }
            }
        }
    }

    /// The line of the UTC day of `now` (its name made once a day).
    pub fn day(&self, now: Millis) -> Spent {
        if self.day.0 == now / 86_400_000 && !self.day.1.is_empty() {
            self.line(&self.day.1)
        } else {
            self.line(&day_line(now))
        }
    }

    /// Adds `spent` to the lines of the issue `identifier` and of the UTC day of `now`.
    pub fn add_for_issue(&mut self, identifier: &str, now: Millis, spent: &Spent) {
        if spent.is_empty() {
            return;
        }
        let day = now / 86_400_000;
        if self.day.0 != day || self.day.1.is_empty() {
            self.day = (day, day_line(now));
        }
        let today = std::mem::take(&mut self.day.1);
        self.add(&[&issue_line(identifier), &today], spent);
        self.day.1 = today;
    }

    /// Takes in other daemons' lines as the store holds them now.
    pub fn merge(&mut self, rows: Vec<LedgerRow>) {
        for row in rows {
            let sum = self.others_sum.entry(row.name.clone()).or_default();
            if let Some(old) = self.others.get(&(row.name.clone(), row.owner.clone())) {
                sum.sub(old);
            }
            sum.add(&row.spent);
            // A line emptied in the store (its spend moved to the line of the daemons that are
            // gone, see the PostgreSQL store's compaction) is no longer held.
            if row.spent.is_empty() {
                self.others.remove(&(row.name, row.owner));
            } else {
                self.others.insert((row.name, row.owner), row.spent);
            }
        }
    }

    /// What to hand to the store now (each line's additions since the last time).
    pub fn take_unsent(&mut self) -> Vec<(String, Spent)> {
        std::mem::take(&mut self.unsent).into_iter().collect()
    }

    /// Every issue's line: (identifier, total), the largest spend first (dollars, then tokens).
    pub fn issues(&self) -> Vec<(String, Spent)> {
        let names: std::collections::BTreeSet<&String> = self
            .others_sum
            .keys()
            .chain(self.mine.keys())
            .filter(|n| n.starts_with("issue:"))
            .collect();
        let mut out: Vec<(String, Spent)> = names
            .into_iter()
            .map(|n| (n["issue:".len()..].to_string(), self.line(n)))
            .collect();
        out.sort_by(|a, b| {
            b.1.cost_usd
                .total_cmp(&a.1.cost_usd)
                .then(b.1.total_tokens.cmp(&a.1.total_tokens))
                .then(a.0.cmp(&b.0))
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spent(tokens: u64, usd: f64) -> Spent {
        Spent {
            input_tokens: tokens,
            total_tokens: tokens,
            cost_usd: usd,
            ..Spent::default()
        }
    }

    #[test]
    fn the_day_refuses_a_run_once_its_spend_reached_the_budget() {
        // 2026-11-26T12:00:00Z.
        let noon = 1_795_694_400_000;
        let cost = |usd: f64| {
            move |line: &str| -> Result<f64, String> {
                assert_eq!(line, "day:2026-11-26");
                Ok(usd)
            }
        };
        assert_eq!(day_refuses(Some(1.0), noon, cost(0.99)), None);
        assert_eq!(
            day_refuses(Some(1.0), noon, cost(1.0)),
            Some(DayReached {
                spent: 1.0,
                budget: 1.0
            })
        );
        assert_eq!(day_refuses(None, noon, cost(5.0)), None, "no budget");
        let unread = |_: &str| Err::<f64, _>("down");
        assert_eq!(
            day_refuses(Some(1.0), noon, unread),
            None,
            "not read: granted"
        );
    }

    #[test]
    fn a_line_is_the_others_whole_lines_plus_what_this_daemon_added_never_twice() {
        let mut l = Ledger::default();
        l.add(&["issue:A-1", "day:2026-11-26"], &spent(100, 0.5));
        assert_eq!(l.take_unsent().len(), 2);
        assert!(l.take_unsent().is_empty(), "handed over once");
        // Another daemon's line arrives, then changes: replaced, not added.
        let row = |n: &str, owner: &str, t: u64, usd: f64| LedgerRow {
            name: n.into(),
            owner: owner.into(),
            spent: spent(t, usd),
        };
        l.merge(vec![row("issue:A-1", "b", 40, 0.25)]);
        l.merge(vec![row("issue:A-1", "b", 60, 0.75)]);
        l.merge(vec![row("issue:A-1", "c", 5, 0.0)]);
        assert_eq!(l.line("issue:A-1"), spent(165, 1.25));
        assert_eq!(l.line("day:2026-11-26"), spent(100, 0.5));
        l.add(&["issue:B-2"], &spent(7, 2.0));
        let issues = l.issues();
        assert_eq!(issues[0].0, "B-2", "the most dollars first");
        assert_eq!(issues[1], ("A-1".to_string(), spent(165, 1.25)));
        assert_eq!(day_line(0), "day:1970-01-01");
        // Compacted in the store: b's line emptied, its spend on the gone daemons' line. The
        // total stays, and the emptied line is held no more.
        l.merge(vec![
            row("issue:A-1", "b", 0, 0.0),
            row("issue:A-1", "*", 60, 0.75),
        ]);
        assert_eq!(l.line("issue:A-1"), spent(165, 1.25));
        assert!(
            !l.others
                .contains_key(&("issue:A-1".to_string(), "b".to_string()))
        );
    }
}
