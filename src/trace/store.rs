//! The issue store: SQLite (bundled, WAL mode) at `server.issue_store_path`, keeping the
//! metadata of issues as runs see them, so the trace viewer can name and find them after a
//! restart or a SIGKILL. Full-text search uses SQLite's FTS5.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OpenFlags, params};
use serde::Serialize;

use crate::tracker::Issue;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One stored issue (wire payload of the issue routes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StoredIssue {
    pub id: String,
    pub identifier: String,
    pub title: String,
    pub url: Option<String>,
    pub state: String,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
    /// Unix milliseconds of the last time a run saw the issue.
    pub last_seen_at: i64,
}

pub struct IssueStore {
    conn: Mutex<Connection>,
    pub path: PathBuf,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS issues (
    id TEXT PRIMARY KEY,
    identifier TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    url TEXT,
    state TEXT NOT NULL DEFAULT '',
    created_at TEXT,
    updated_at TEXT,
    last_seen_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS issues_last_seen ON issues(last_seen_at DESC);
CREATE VIRTUAL TABLE IF NOT EXISTS issues_fts USING fts5(id UNINDEXED, identifier, title);
";

fn explain(path: &Path, e: rusqlite::Error) -> StoreError {
    let what = match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked => {
                "is locked by another process; stop it, or give this daemon its own server.issue_store_path".to_string()
            }
            rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt => {
                "is not a valid SQLite database (corrupt?); move it aside and svc creates a new one".to_string()
            }
            rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::PermissionDenied | rusqlite::ErrorCode::ReadOnly => {
                "cannot be opened for writing; check server.issue_store_path and its directory's permissions".to_string()
            }
            _ => e.to_string(),
        },
        _ => e.to_string(),
    };
    StoreError(format!("issue store {}: {what}", path.display()))
}

impl IssueStore {
    pub fn open(path: &Path) -> Result<IssueStore, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError(format!(
                    "issue store {}: cannot create its directory: {e}",
                    path.display()
                ))
            })?;
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| explain(path, e))?;
        conn.busy_timeout(std::time::Duration::from_millis(1000))
            .map_err(|e| explain(path, e))?;
        // WAL: readers never block the writer, and a killed process leaves a consistent file.
        conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
            .map_err(|e| explain(path, e))?;
        conn.execute_batch("PRAGMA synchronous=NORMAL;")
            .map_err(|e| explain(path, e))?;
        conn.execute_batch(SCHEMA).map_err(|e| explain(path, e))?;
        // Read once so a corrupt file is found now, not at the first request.
        conn.query_row("SELECT count(*) FROM issues", [], |r| r.get::<_, i64>(0))
            .map_err(|e| explain(path, e))?;
        Ok(IssueStore {
            conn: Mutex::new(conn),
            path: path.to_path_buf(),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records (or refreshes) issues seen at `now_ms`, in one transaction.
    pub fn upsert(&self, issues: &[Issue], now_ms: i64) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| explain(&self.path, e))?;
        for i in issues {
            tx.execute(
                "INSERT INTO issues (id, identifier, title, url, state, created_at, updated_at, last_seen_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT(id) DO UPDATE SET identifier=excluded.identifier, title=excluded.title, url=excluded.url,
                   state=excluded.state, created_at=excluded.created_at, updated_at=excluded.updated_at, last_seen_at=excluded.last_seen_at",
                params![i.id, i.identifier, i.title, i.url, i.state, i.created_at, i.updated_at, now_ms],
            )
            .map_err(|e| explain(&self.path, e))?;
            tx.execute("DELETE FROM issues_fts WHERE id = ?1", params![i.id])
                .map_err(|e| explain(&self.path, e))?;
            tx.execute(
                "INSERT INTO issues_fts (id, identifier, title) VALUES (?1, ?2, ?3)",
                params![i.id, i.identifier, i.title],
            )
            .map_err(|e| explain(&self.path, e))?;
        }
        tx.commit().map_err(|e| explain(&self.path, e))
    }

    fn rows(
        &self,
        sql: &str,
        args: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<StoredIssue>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(sql)
            .map_err(|e| explain(&self.path, e))?;
        let rows = stmt
            .query_map(args, |r| {
                Ok(StoredIssue {
                    id: r.get(0)?,
                    identifier: r.get(1)?,
                    title: r.get(2)?,
                    url: r.get(3)?,
                    state: r.get(4)?,
                    created_at: r.get(5)?,
                    updated_at: r.get(6)?,
                    last_seen_at: r.get(7)?,
                })
            })
            .map_err(|e| explain(&self.path, e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| explain(&self.path, e))
    }

    /// Most recently seen first.
    pub fn recent(&self, limit: usize) -> Result<Vec<StoredIssue>, StoreError> {
        self.rows(
            "SELECT id, identifier, title, url, state, created_at, updated_at, last_seen_at FROM issues ORDER BY last_seen_at DESC, identifier LIMIT ?1",
            &[&(limit as i64)],
        )
    }

    /// Full-text search over identifier and title (each word as a prefix); an empty query lists
    /// the most recent.
    pub fn search(&self, q: &str, limit: usize) -> Result<Vec<StoredIssue>, StoreError> {
        let words: Vec<String> = q
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(|w| format!("\"{}\"*", w.replace('"', "")))
            .collect();
        if words.is_empty() {
            return self.recent(limit);
        }
        let fts = words.join(" ");
        self.rows(
            "SELECT i.id, i.identifier, i.title, i.url, i.state, i.created_at, i.updated_at, i.last_seen_at
             FROM issues_fts f JOIN issues i ON i.id = f.id WHERE issues_fts MATCH ?1
             ORDER BY rank, i.last_seen_at DESC LIMIT ?2",
            &[&fts, &(limit as i64)],
        )
    }

    pub fn get(&self, id: &str) -> Result<Option<StoredIssue>, StoreError> {
        Ok(self
            .rows("SELECT id, identifier, title, url, state, created_at, updated_at, last_seen_at FROM issues WHERE id = ?1", &[&id])?
            .into_iter()
            .next())
    }
}

/// Issues waiting for a store that cannot be written (locked, say) before new ones are dropped.
const PENDING_MAX: usize = 10_000;
/// How long to wait before writing again after a failure.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts the store's writer thread: issues sent to it are written in batches. A failed write
/// is kept and tried again every second (the latest version of each issue, up to
/// [`PENDING_MAX`] issues), so a store locked for a while loses nothing; `notify` hears of the
/// first failure and of the recovery.
pub fn start_writer(
    store: std::sync::Arc<IssueStore>,
    notify: impl Fn(&str, String) + Send + 'static,
) -> crossbeam_channel::Sender<Issue> {
    // Small: a bounded channel allocates and touches every slot up front. Senders use
    // `try_send`; an issue dropped when it is full is sent again the next time it runs.
    let (tx, rx) = crossbeam_channel::bounded::<Issue>(256);
    let _ = std::thread::Builder::new()
        .name("issue-store".into())
        .spawn(move || {
            let mut pending: Vec<Issue> = Vec::new();
            // Where each pending issue is in `pending`, so a newer version replaces it.
            let mut at: std::collections::HashMap<String, usize> = Default::default();
            let mut failing = false;
            let add = |pending: &mut Vec<Issue>,
                       at: &mut std::collections::HashMap<String, usize>,
                       issue: Issue| {
                if let Some(&i) = at.get(&issue.id) {
                    pending[i] = issue;
                } else if pending.len() < PENDING_MAX {
                    at.insert(issue.id.clone(), pending.len());
                    pending.push(issue);
                }
            };
            loop {
                // Something is pending only while the store fails: then wait at most a second.
                let next = if pending.is_empty() {
                    rx.recv().map_err(|_| true)
                } else {
                    rx.recv_timeout(RETRY_EVERY)
                        .map_err(|e| e.is_disconnected())
                };
                let closed = match next {
                    Ok(issue) => {
                        add(&mut pending, &mut at, issue);
                        false
                    }
                    Err(closed) => closed,
                };
                if closed && pending.is_empty() {
                    return;
                }
                for issue in rx.try_iter().take(511) {
                    add(&mut pending, &mut at, issue);
                }
                let now = crate::time::unix_ms() as i64;
                match store.upsert(&pending, now) {
                    Ok(()) => {
                        pending.clear();
                        at.clear();
                        if failing {
                            failing = false;
                            log::info!("issue store {} is written again", store.path.display());
                            notify(
                                "issue_store_recovered",
                                format!("issue store {} is written again", store.path.display()),
                            );
                        }
                    }
                    Err(e) => {
                        if !failing {
                            failing = true;
                            let message = format!(
                                "{e}; {} issue(s) are kept and written when it can be",
                                pending.len()
                            );
                            log::warn!("{message}");
                            notify("issue_store_write_failed", message);
                        }
                        if closed {
                            // Shutting down and the store still fails: nothing more can be done.
                            return;
                        }
                    }
                }
            }
        });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue(id: &str, identifier: &str, title: &str) -> Issue {
        Issue {
            id: id.into(),
            identifier: identifier.into(),
            title: title.into(),
            description: None,
            state: "Todo".into(),
            state_type: None,
            labels: vec![],
            url: Some(format!("https://t.example/{identifier}")),
            created_at: None,
            updated_at: None,
            priority: None,
            blocked_by: Vec::new(),
        }
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("svc-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn upsert_recent_search_and_reopen() {
        let dir = temp("basic");
        let path = dir.join("issues.db");
        let store = IssueStore::open(&path).unwrap();
        store
            .upsert(
                &[
                    issue("a", "ENG-1", "Fix the login button"),
                    issue("b", "ENG-2", "Write docs"),
                ],
                1000,
            )
            .unwrap();
        store
            .upsert(&[issue("c", "OPS-7", "Rotate logs")], 2000)
            .unwrap();
        store
            .upsert(&[issue("a", "ENG-1", "Fix the login page")], 3000)
            .unwrap();
        let recent: Vec<String> = store
            .recent(5)
            .unwrap()
            .into_iter()
            .map(|i| i.identifier)
            .collect();
        assert_eq!(recent, ["ENG-1", "OPS-7", "ENG-2"]);
        assert_eq!(store.recent(1).unwrap().len(), 1);
        let found: Vec<String> = store
            .search("logi", 20)
            .unwrap()
            .into_iter()
            .map(|i| i.title)
            .collect();
        assert_eq!(
            found,
            ["Fix the login page"],
            "the old title is no longer indexed"
        );
        assert_eq!(store.search("eng 2", 20).unwrap()[0].identifier, "ENG-2");
        assert_eq!(
            store.search("\"; DROP TABLE issues; --", 20).unwrap().len(),
            0
        );
        assert_eq!(store.search("", 2).unwrap().len(), 2);
        drop(store);
        let again = IssueStore::open(&path).unwrap();
        assert_eq!(again.get("c").unwrap().unwrap().title, "Rotate logs");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_corrupt_file_is_a_clear_error() {
        let dir = temp("corrupt");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("issues.db");
        std::fs::write(&path, vec![b'x'; 8192]).unwrap();
        let err = IssueStore::open(&path).err().unwrap();
        assert!(err.0.contains("not a valid SQLite database"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
