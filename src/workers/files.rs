//! The pool's files beside the daemon's lock file (`~/.svc/daemon/<name>-<hash>.*`):
//!
//! * `<stem>.spend.json`: the worker-seconds used (for the pool's life and the current UTC day),
//!   so a restart neither resets the day nor the lifetime cap; only while the daemon has no
//!   durable claim store ([`crate::facts`]). With one, they are tallies in the store
//!   ([`SpendKeep`]), shared by every daemon on it, and a spend file left from before moves in
//!   once (renamed `<stem>.spend.json.imported`).
//! * `<stem>.ledger.json` (the inventory; the file keeps its first name): for drivers whose machines outlive the daemon (`usesLedger`), every
//!   machine written *before* it is provisioned and removed once it is destroyed, so a daemon
//!   that was killed can find what it left.
//!
//! Both are written whole to a temporary file, synced and renamed, so a crash leaves the old or
//! the new version, never a torn one. A file that cannot be read is reported and treated as
//! empty (for the inventory, the driver's `list` still finds every labelled machine).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::pool::{DAY_MS, Millis, Spend};
use super::{WorkerRecord, write_atomic};
use crate::facts::Facts;

pub struct SpendFile {
    pub path: PathBuf,
}

impl SpendFile {
    /// The spend so far; a missing file is none, a broken one is reported and taken as none.
    pub fn load(&self) -> Result<Spend, String> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{}: unreadable spend file ({e}); counting from zero",
                    self.path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Spend::default()),
            Err(e) => Err(format!(
                "{}: cannot read the spend file ({e}); counting from zero",
                self.path.display()
            )),
        }
    }

    pub fn save(&self, spend: &Spend) -> Result<(), String> {
        let bytes = serde_json::to_vec_pretty(spend).unwrap_or_default();
        write_atomic(&self.path, &bytes)
            .map_err(|e| format!("{}: cannot write the spend file: {e}", self.path.display()))
    }
}

/// The tally of the pool's worker-milliseconds in the durable store, and that of one UTC day.
const LIFETIME_TALLY: &str = "workers/lifetime_ms";
fn day_tally(day: u64) -> String {
    format!("workers/day/{day}/ms")
}

/// Where the pool's worker-seconds are kept: the daemon's durable store when it has one (so
/// the spend caps hold for every daemon on it), else the spend file.
pub enum SpendKeep {
    File(SpendFile),
    Facts {
        facts: std::sync::Arc<dyn Facts>,
        /// The totals as last read (what this pool used since is added to them at the next save).
        saved: Spend,
    },
}

impl SpendKeep {
    /// Opens where the spend is kept and reads it back; a problem is returned beside what is
    /// used instead (zero, or the spend file's figures).
    pub fn open(
        file: SpendFile,
        facts: Option<std::sync::Arc<dyn Facts>>,
        now: Millis,
    ) -> (SpendKeep, Spend, Option<String>) {
        let from_file = |file: SpendFile, problem: Option<String>| match file.load() {
            Ok(spend) => (SpendKeep::File(file), spend, problem),
            Err(e) => (SpendKeep::File(file), Spend::default(), problem.or(Some(e))),
        };
        let Some(facts) = facts else {
            return from_file(file, None);
        };
        let today = now / DAY_MS;
        let read = facts.tallies("workers/").map(|all| {
            let get = |name: &str| {
                all.iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.max(0.0) as u64)
            };
            get(LIFETIME_TALLY).map(|lifetime_ms| Spend {
                lifetime_ms,
                day: today,
                day_ms: get(&day_tally(today)).unwrap_or(0),
            })
        });
        let shown = file.path.display().to_string();
        let unreachable = |e: String| {
            Some(format!(
                "{e}; the worker-seconds are kept in {shown} until the next start"
            ))
        };
        match read {
            Ok(Some(spend)) => (
                SpendKeep::Facts {
                    facts,
                    saved: spend,
                },
                spend,
                None,
            ),
            Ok(None) => {
                // Nothing in the store yet: what the spend file counted moves in.
                let (old, problem) = match file.load() {
                    Ok(spend) => (spend, None),
                    Err(e) => (Spend::default(), Some(e)),
                };
                let day_ms = if old.day == today { old.day_ms } else { 0 };
                let deltas = [
                    (LIFETIME_TALLY.to_string(), old.lifetime_ms as f64),
                    (day_tally(today), day_ms as f64),
                ];
                match facts.add(&deltas) {
                    Ok(totals) => {
                        if file.path.exists() {
                            let moved = file.path.with_extension("json.imported");
                            let _ = std::fs::rename(&file.path, moved);
                        }
                        let spend = Spend {
                            lifetime_ms: totals[0].max(0.0) as u64,
                            day: today,
                            day_ms: totals[1].max(0.0) as u64,
                        };
                        (
                            SpendKeep::Facts {
                                facts,
                                saved: spend,
                            },
                            spend,
                            problem,
                        )
                    }
                    Err(e) => from_file(file, unreachable(e)),
                }
            }
            Err(e) => from_file(file, unreachable(e)),
        }
    }

    /// Keeps `spend`: the spend file is written whole; the store is added what this pool used
    /// since the last save, and answers with the totals of every daemon on it (what the caps
    /// are then held to).
    pub fn save(&mut self, spend: Spend) -> Result<Spend, String> {
        match self {
            SpendKeep::File(file) => file.save(&spend).map(|()| spend),
            SpendKeep::Facts { facts, saved } => {
                let lifetime = spend.lifetime_ms.saturating_sub(saved.lifetime_ms);
                let day = if spend.day == saved.day {
                    spend.day_ms.saturating_sub(saved.day_ms)
                } else {
                    spend.day_ms
                };
                let totals = facts
                    .add(&[
                        (LIFETIME_TALLY.to_string(), lifetime as f64),
                        (day_tally(spend.day), day as f64),
                    ])
                    .map_err(|e| format!("the worker-seconds are not written: {e}"))?;
                *saved = Spend {
                    lifetime_ms: totals[0].max(0.0) as u64,
                    day: spend.day,
                    day_ms: totals[1].max(0.0) as u64,
                };
                Ok(*saved)
            }
        }
    }
}

/// One machine in the inventory: `record` is absent while its provision is under way.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InventoryEntry {
    #[serde(default)]
    pub record: Option<WorkerRecord>,
    /// The driver specifier that made it.
    #[serde(default)]
    pub driver: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct InventoryDoc {
    workers: BTreeMap<String, InventoryEntry>,
}

pub struct Inventory {
    pub path: PathBuf,
    entries: BTreeMap<String, InventoryEntry>,
}

impl Inventory {
    /// Opens the inventory; `Err` carries a report and an empty inventory (the file is not touched
    /// until the next write).
    pub fn open(path: PathBuf) -> (Inventory, Option<String>) {
        let (entries, problem) = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<InventoryDoc>(&bytes) {
                Ok(doc) => (doc.workers, None),
                Err(e) => (
                    BTreeMap::new(),
                    Some(format!(
                        "{}: unreadable inventory ({e}); relying on the driver's list",
                        path.display()
                    )),
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (BTreeMap::new(), None),
            Err(e) => (
                BTreeMap::new(),
                Some(format!(
                    "{}: cannot read the inventory ({e})",
                    path.display()
                )),
            ),
        };
        (Inventory { path, entries }, problem)
    }

    pub fn entries(&self) -> &BTreeMap<String, InventoryEntry> {
        &self.entries
    }

    pub fn set(&mut self, worker_id: &str, entry: InventoryEntry) -> Result<(), String> {
        self.entries.insert(worker_id.to_string(), entry);
        self.save()
    }

    pub fn remove(&mut self, worker_id: &str) -> Result<(), String> {
        if self.entries.remove(worker_id).is_some() {
            self.save()
        } else {
            Ok(())
        }
    }

    fn save(&self) -> Result<(), String> {
        let doc = InventoryDoc {
            workers: self.entries.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        write_atomic(&self.path, &bytes)
            .map_err(|e| format!("{}: cannot write the inventory: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_and_ledger_survive_a_reopen_and_a_broken_file_is_reported() {
        let dir = std::env::temp_dir().join(format!("svc-files-{}", std::process::id()));
        let spend = SpendFile {
            path: dir.join("x.spend.json"),
        };
        assert_eq!(spend.load().unwrap(), Spend::default());
        let used = Spend {
            lifetime_ms: 7,
            day: 3,
            day_ms: 5,
        };
        spend.save(&used).unwrap();
        assert_eq!(spend.load().unwrap(), used);
        std::fs::write(&spend.path, "{torn").unwrap();
        assert!(spend.load().unwrap_err().contains("unreadable spend file"));

        let path = dir.join("x.ledger.json");
        let (mut inventory, problem) = Inventory::open(path.clone());
        assert!(problem.is_none());
        inventory
            .set(
                "w-1",
                InventoryEntry {
                    record: None,
                    driver: "./d".into(),
                },
            )
            .unwrap();
        inventory.set("w-2", InventoryEntry::default()).unwrap();
        inventory.remove("w-2").unwrap();
        let (again, _) = Inventory::open(path.clone());
        assert_eq!(again.entries().keys().collect::<Vec<_>>(), ["w-1"]);
        std::fs::write(&path, "not json").unwrap();
        let (broken, problem) = Inventory::open(path);
        assert!(broken.entries().is_empty() && problem.unwrap().contains("unreadable inventory"));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Tallies in memory, as a shared store keeps them.
    #[derive(Default)]
    struct Tallies(std::sync::Mutex<BTreeMap<String, f64>>);

    impl Facts for Tallies {
        fn add(&self, deltas: &[(String, f64)]) -> Result<Vec<f64>, String> {
            let mut t = self.0.lock().unwrap();
            Ok(deltas
                .iter()
                .map(|(n, d)| {
                    *t.entry(n.clone()).or_default() += d;
                    t[n]
                })
                .collect())
        }
        fn tallies(&self, prefix: &str) -> Result<Vec<(String, f64)>, String> {
            let t = self.0.lock().unwrap();
            Ok(t.iter()
                .filter(|(n, _)| n.starts_with(prefix))
                .map(|(n, v)| (n.clone(), *v))
                .collect())
        }
        fn mark(&self, _: &str, _: &str, _: usize) -> Result<bool, String> {
            unreachable!()
        }
    }

    #[test]
    fn with_a_store_the_spend_file_moves_in_once_and_two_pools_count_against_one_total() {
        let dir = std::env::temp_dir().join(format!("svc-spend-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = |name: &str| SpendFile {
            path: dir.join(format!("{name}.spend.json")),
        };
        let day = 20_000;
        let now = day * DAY_MS + 5;
        file("a")
            .save(&Spend {
                lifetime_ms: 9000,
                day,
                day_ms: 4000,
            })
            .unwrap();
        let store: std::sync::Arc<dyn Facts> = std::sync::Arc::new(Tallies::default());
        let (mut a, spend, problem) = SpendKeep::open(file("a"), Some(store.clone()), now);
        assert_eq!(problem, None);
        assert_eq!(
            (spend.lifetime_ms, spend.day, spend.day_ms),
            (9000, day, 4000)
        );
        assert!(!file("a").path.exists(), "moved in, so never counted twice");
        assert!(
            dir.join("a.spend.json.imported").exists(),
            "kept aside, not lost"
        );
        // A second daemon's pool on the same store (its own file is empty) sees the total.
        let (mut b, spend_b, _) = SpendKeep::open(file("b"), Some(store.clone()), now);
        assert_eq!(spend_b, spend);
        // Each adds what it used since its last save; each is answered with the total.
        let a_used = Spend {
            lifetime_ms: 9000 + 100,
            day,
            day_ms: 4000 + 100,
        };
        assert_eq!(a.save(a_used).unwrap().day_ms, 4100);
        let b_used = Spend {
            lifetime_ms: 9000 + 30,
            day,
            day_ms: 4000 + 30,
        };
        let total = b.save(b_used).unwrap();
        assert_eq!((total.lifetime_ms, total.day_ms), (9130, 4130));
        // The day rolls over: the new day counts what was used since midnight only.
        let next = Spend {
            lifetime_ms: 9130 + 7,
            day: day + 1,
            day_ms: 7,
        };
        let total = b.save(next).unwrap();
        assert_eq!(
            (total.lifetime_ms, total.day, total.day_ms),
            (9137, day + 1, 7)
        );
        // A restart reads today's figure back, not yesterday's.
        let (_, again, _) = SpendKeep::open(file("c"), Some(store), (day + 1) * DAY_MS);
        assert_eq!((again.lifetime_ms, again.day_ms), (9137, 7));
        let _ = std::fs::remove_dir_all(dir);
    }
}
