//! The pool's files beside the daemon's lock file (`~/.svc/daemon/<name>-<hash>.*`):
//!
//! * `<stem>.spend.json`: the worker-seconds used (for the pool's life and the current UTC day),
//!   so a restart neither resets the day nor the lifetime cap.
//! * `<stem>.ledger.json`: for drivers whose machines outlive the daemon (`usesLedger`), every
//!   machine written *before* it is provisioned and removed once it is destroyed, so a daemon
//!   that was killed can find what it left.
//!
//! Both are written whole to a temporary file, synced and renamed, so a crash leaves the old or
//! the new version, never a torn one. A file that cannot be read is reported and treated as
//! empty (for the ledger, the driver's `list` still finds every labelled machine).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::WorkerRecord;
use super::pool::Spend;

/// Writes `bytes` to `path` atomically (temp file, fsync, rename, fsync of the directory).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

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

/// One machine in the ledger: `record` is absent while its provision is under way.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    #[serde(default)]
    pub record: Option<WorkerRecord>,
    /// The driver specifier that made it.
    #[serde(default)]
    pub driver: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LedgerDoc {
    workers: BTreeMap<String, LedgerEntry>,
}

pub struct Ledger {
    pub path: PathBuf,
    entries: BTreeMap<String, LedgerEntry>,
}

impl Ledger {
    /// Opens the ledger; `Err` carries a report and an empty ledger (the file is not touched
    /// until the next write).
    pub fn open(path: PathBuf) -> (Ledger, Option<String>) {
        let (entries, problem) = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<LedgerDoc>(&bytes) {
                Ok(doc) => (doc.workers, None),
                Err(e) => (
                    BTreeMap::new(),
                    Some(format!(
                        "{}: unreadable ledger ({e}); relying on the driver's list",
                        path.display()
                    )),
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (BTreeMap::new(), None),
            Err(e) => (
                BTreeMap::new(),
                Some(format!("{}: cannot read the ledger ({e})", path.display())),
            ),
        };
        (Ledger { path, entries }, problem)
    }

    pub fn entries(&self) -> &BTreeMap<String, LedgerEntry> {
        &self.entries
    }

    pub fn set(&mut self, worker_id: &str, entry: LedgerEntry) -> Result<(), String> {
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
        let doc = LedgerDoc {
            workers: self.entries.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        write_atomic(&self.path, &bytes)
            .map_err(|e| format!("{}: cannot write the ledger: {e}", self.path.display()))
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
        let (mut ledger, problem) = Ledger::open(path.clone());
        assert!(problem.is_none());
        ledger
            .set(
                "w-1",
                LedgerEntry {
                    record: None,
                    driver: "./d".into(),
                },
            )
            .unwrap();
        ledger.set("w-2", LedgerEntry::default()).unwrap();
        ledger.remove("w-2").unwrap();
        let (again, _) = Ledger::open(path.clone());
        assert_eq!(again.entries().keys().collect::<Vec<_>>(), ["w-1"]);
        std::fs::write(&path, "not json").unwrap();
        let (broken, problem) = Ledger::open(path);
        assert!(broken.entries().is_empty() && problem.unwrap().contains("unreadable ledger"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
