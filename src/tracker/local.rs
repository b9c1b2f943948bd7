//! The `local` tracker: a board directory of Markdown files, one issue per file, that people can
//! edit by hand. Writes are atomic (temp file, fsync, rename) and serialized by an advisory lock,
//! so readers never see half a file and concurrent writers never lose an update. A malformed file
//! is skipped and reported, never fatal.
//!
//! A board file is named `<id_prefix><n>.md` (for example `BOARD-12.md`) and looks like this:
//!
//! ```text
//! ---
//! title: Fix the login button
//! state: Todo
//! labels: [bug, "Svc:Backend"]
//! priority: 2                          # optional; lower dispatches first
//! created_at: 2026-11-21T10:00:00Z     # optional; defaults to the file's modification time
//! updated_at: 2026-11-21T10:00:00Z     # optional; likewise
//! blocked_by: [BOARD-2, BOARD-5]       # optional; issues this one waits for
//! comments:                            # optional; appended by svc and its agents
//!   - author: agent
//!     at: 2026-11-21T10:05:00Z
//!     body: Done, see the branch.
//! ---
//! The description, in Markdown.
//! ```
//!
//! `title` and `state` are required. Other keys a person adds are kept on rewrite. `blocked_by`
//! becomes the record's `blockedBy`, each blocker with its current state on the board (`unknown`
//! while its file cannot be read); an id that names no file of the board is left out (`svc
//! doctor` reports it).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{Issue, StateNames, Tracker, TrackerError};
use crate::config::LocalOptions;

/// One comment on a board issue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Comment {
    pub author: String,
    pub at: String,
    pub body: String,
}

/// The front matter of a board file, in the order it is written back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct FrontMatter {
    title: String,
    state: String,
    #[serde(default)]
    labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    priority: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    updated_at: Option<String>,
    /// Identifiers of the issues this one waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    blocked_by: Vec<String>,
    /// Keys a person added; preserved verbatim.
    #[serde(flatten)]
    extra: serde_norway::Mapping,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    comments: Vec<Comment>,
}

/// A parsed board file.
#[derive(Clone, Debug, PartialEq)]
pub struct BoardIssue {
    pub issue: Issue,
    pub comments: Vec<Comment>,
    pub path: PathBuf,
    /// The identifiers `blocked_by` names, as written (`issue.blocked_by` holds those on the
    /// board, with their states).
    pub blocked_by: Vec<String>,
}

/// A file that looked like a board issue but could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub file: String,
    pub reason: String,
}

/// Everything one scan of the board found.
#[derive(Clone, Debug, Default)]
pub struct Scan {
    pub issues: Vec<BoardIssue>,
    pub skipped: Vec<Skipped>,
}

/// What identifies one version of a file: size, modification time in nanoseconds and inode
/// (every svc write is a rename, so it changes the inode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime_ns: i128,
    ino: u64,
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ino: m.ino(),
        }
    }
}

type Parsed = Result<BoardIssue, String>;

/// Parsed board files by path, reused while a file is unchanged, so a scan of a large board only
/// reads and parses what changed since the last one.
static PARSED: std::sync::Mutex<Option<std::collections::HashMap<PathBuf, (Stamp, Parsed)>>> =
    std::sync::Mutex::new(None);

/// A board directory.
#[derive(Clone, Debug)]
pub struct Board {
    dir: PathBuf,
    prefix: String,
    states: StateNames,
}

impl Board {
    pub fn new(opts: &LocalOptions, states: StateNames) -> Board {
        Board {
            dir: opts.path.clone(),
            prefix: opts.id_prefix.clone(),
            states,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The issue number of a file name (`BOARD-12.md` gives 12), if it is a board file.
    fn number_of(&self, file_name: &str) -> Option<u64> {
        let digits = file_name.strip_prefix(&self.prefix)?.strip_suffix(".md")?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// The path of `identifier`, refusing anything that is not exactly `<prefix><n>`.
    fn path_of(&self, identifier: &str) -> Result<PathBuf, TrackerError> {
        let file = format!("{identifier}.md");
        match self.number_of(&file) {
            Some(_) => Ok(self.dir.join(file)),
            None => Err(TrackerError::not_found(format!(
                "{identifier} is not an issue id of this board (expected {}<number>)",
                self.prefix
            ))),
        }
    }

    /// Reads every board file. A missing board directory is an empty board.
    pub fn scan(&self) -> Result<Scan, TrackerError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Scan::default()),
            Err(e) => {
                return Err(TrackerError::unavailable(format!(
                    "cannot read board {}: {e}",
                    self.dir.display()
                )));
            }
        };
        let mut numbered = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(n) = self.number_of(name) {
                numbered.push((n, name.to_string()));
            } else if abandoned_temp(&entry) {
                let _ = fs::remove_file(entry.path());
            }
        }
        numbered.sort();
        let mut scan = Scan::default();
        let mut guard = PARSED.lock().unwrap_or_else(|p| p.into_inner());
        let cache = guard.get_or_insert_with(std::collections::HashMap::new);
        let mut seen = std::collections::HashSet::with_capacity(numbered.len());
        for (_, name) in numbered {
            let path = self.dir.join(&name);
            let stamp = fs::metadata(&path).ok().map(|m| Stamp::of(&m));
            let parsed = match (stamp, cache.get(&path)) {
                (Some(stamp), Some((cached, parsed))) if *cached == stamp => parsed.clone(),
                _ => {
                    let parsed = self.read_file(&path);
                    if let Some(stamp) = stamp {
                        cache.insert(path.clone(), (stamp, parsed.clone()));
                    }
                    parsed
                }
            };
            seen.insert(path);
            match parsed {
                Ok(mut issue) => {
                    // State types follow the current settings, which may have been reloaded.
                    issue.issue.state_type =
                        Some(self.states.state_type(&issue.issue.state).to_string());
                    scan.issues.push(issue);
                }
                Err(reason) => scan.skipped.push(Skipped { file: name, reason }),
            }
        }
        cache.retain(|p, _| p.parent() != Some(self.dir.as_path()) || seen.contains(p));
        drop(guard);
        if scan.issues.iter().any(|b| !b.blocked_by.is_empty()) {
            let unreadable = scan.skipped.iter().filter_map(|s| {
                let id = s.file.strip_suffix(".md")?;
                Some((id.to_string(), UNKNOWN_STATE.to_string()))
            });
            let states: std::collections::HashMap<String, String> = unreadable
                .chain(
                    scan.issues
                        .iter()
                        .map(|b| (b.issue.identifier.clone(), b.issue.state.clone())),
                )
                .collect();
            for b in &mut scan.issues {
                resolve_blockers(b, |id| states.get(id).cloned());
            }
        }
        Ok(scan)
    }

    pub fn read(&self, identifier: &str) -> Result<BoardIssue, TrackerError> {
        let path = self.path_of(identifier)?;
        if !path.exists() {
            return Err(TrackerError::not_found(format!(
                "issue {identifier} not found on board {}",
                self.dir.display()
            )));
        }
        let mut issue = self
            .read_file(&path)
            .map_err(|reason| TrackerError::unavailable(format!("{}: {reason}", path.display())))?;
        self.resolve_one(&mut issue);
        Ok(issue)
    }

    /// Resolves one issue's blockers by reading their files.
    fn resolve_one(&self, issue: &mut BoardIssue) {
        if issue.blocked_by.is_empty() {
            return;
        }
        resolve_blockers(issue, |id| {
            let path = self.path_of(id).ok()?;
            match self.read_file(&path) {
                Ok(b) => Some(b.issue.state),
                Err(_) if path.exists() => Some(UNKNOWN_STATE.to_string()),
                Err(_) => None,
            }
        });
    }

    fn read_file(&self, path: &Path) -> Result<BoardIssue, String> {
        let text = fs::read_to_string(path).map_err(|e| e.to_string())?;
        let (fm, description) = parse_file(&text)?;
        let identifier = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let mtime = fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .map(crate::time::rfc3339_seconds);
        let description = description.trim();
        let issue = Issue {
            id: identifier.clone(),
            identifier,
            title: fm.title,
            description: (!description.is_empty()).then(|| description.to_string()),
            state_type: Some(self.states.state_type(&fm.state).to_string()),
            state: fm.state,
            labels: fm.labels,
            url: Some(format!("file://{}", path.display())),
            created_at: fm.created_at.or_else(|| mtime.clone()),
            updated_at: fm.updated_at.or(mtime),
            priority: fm.priority,
            blocked_by: Vec::new(),
        };
        Ok(BoardIssue {
            issue,
            comments: fm.comments,
            path: path.to_path_buf(),
            blocked_by: fm.blocked_by.iter().map(|b| b.trim().to_string()).collect(),
        })
    }

    /// Creates `<prefix><n>.md` with the next free number, waiting for the issues of
    /// `blocked_by` (each must be on the board).
    pub fn create(
        &self,
        title: &str,
        description: &str,
        state: &str,
        labels: &[String],
        blocked_by: &[String],
    ) -> Result<BoardIssue, TrackerError> {
        if title.trim().is_empty() {
            return Err(TrackerError::invalid("title must not be empty"));
        }
        for id in blocked_by {
            if !self.path_of(id).is_ok_and(|p| p.exists()) {
                return Err(TrackerError::invalid(format!(
                    "blockedBy: {id} is not an issue of board {}",
                    self.dir.display()
                )));
            }
        }
        fs::create_dir_all(&self.dir).map_err(|e| {
            TrackerError::unavailable(format!("cannot create board {}: {e}", self.dir.display()))
        })?;
        let _lock = self.lock()?;
        let now = crate::time::rfc3339_seconds(SystemTime::now());
        let fm = FrontMatter {
            title: title.to_string(),
            state: state.to_string(),
            labels: labels.to_vec(),
            priority: None,
            created_at: Some(now.clone()),
            updated_at: Some(now),
            blocked_by: blocked_by.to_vec(),
            extra: Default::default(),
            comments: Vec::new(),
        };
        let text = render_file(&fm, description)?;
        let exhausted = || TrackerError::unavailable("the board's issue numbers are exhausted");
        let mut next = (self.scan_numbers()?.into_iter().max().unwrap_or(0))
            .checked_add(1)
            .ok_or_else(exhausted)?;
        loop {
            let target = self.dir.join(format!("{}{next}.md", self.prefix));
            // A hard link never replaces an existing file, so a writer that does not take the
            // lock (a person, another tool) cannot be overwritten either.
            match write_new(&self.dir, &target, text.as_bytes()) {
                Ok(()) => {
                    let mut created = self.read_file(&target).map_err(TrackerError::unavailable)?;
                    self.resolve_one(&mut created);
                    return Ok(created);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    next = next.checked_add(1).ok_or_else(exhausted)?
                }
                Err(e) => {
                    return Err(TrackerError::unavailable(format!(
                        "cannot write {}: {e}",
                        target.display()
                    )));
                }
            }
        }
    }

    fn scan_numbers(&self) -> Result<Vec<u64>, TrackerError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| {
            TrackerError::unavailable(format!("cannot read board {}: {e}", self.dir.display()))
        })?;
        Ok(entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| self.number_of(n)))
            .collect())
    }

    pub fn update_state(&self, identifier: &str, state: &str) -> Result<BoardIssue, TrackerError> {
        if state.trim().is_empty() {
            return Err(TrackerError::invalid("status must not be empty"));
        }
        self.modify(identifier, |fm| fm.state = state.trim().to_string())
    }

    pub fn add_comment(
        &self,
        identifier: &str,
        author: &str,
        body: &str,
    ) -> Result<BoardIssue, TrackerError> {
        let at = crate::time::rfc3339_seconds(SystemTime::now());
        self.modify(identifier, |fm| {
            fm.comments.push(Comment {
                author: author.to_string(),
                at,
                body: body.to_string(),
            })
        })
    }

    /// Read-modify-write of one file under the board lock, written atomically.
    fn modify(
        &self,
        identifier: &str,
        change: impl FnOnce(&mut FrontMatter),
    ) -> Result<BoardIssue, TrackerError> {
        let path = self.path_of(identifier)?;
        let _lock = self.lock()?;
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(TrackerError::not_found(format!(
                    "issue {identifier} not found on board {}",
                    self.dir.display()
                )));
            }
            Err(e) => {
                return Err(TrackerError::unavailable(format!(
                    "cannot read {}: {e}",
                    path.display()
                )));
            }
        };
        let (mut fm, description) = parse_file(&text)
            .map_err(|reason| TrackerError::unavailable(format!("{}: {reason}", path.display())))?;
        change(&mut fm);
        fm.updated_at = Some(crate::time::rfc3339_seconds(SystemTime::now()));
        let text = render_file(&fm, description)?;
        write_replace(&self.dir, &path, text.as_bytes()).map_err(|e| {
            TrackerError::unavailable(format!("cannot write {}: {e}", path.display()))
        })?;
        let mut issue = self.read_file(&path).map_err(TrackerError::unavailable)?;
        self.resolve_one(&mut issue);
        Ok(issue)
    }

    /// An exclusive advisory lock on `<board>/.board.lock`, released on drop.
    fn lock(&self) -> Result<File, TrackerError> {
        let path = self.dir.join(".board.lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| {
                TrackerError::unavailable(format!("cannot open {}: {e}", path.display()))
            })?;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(file);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(TrackerError::unavailable(format!(
                    "cannot lock {}: {err}",
                    path.display()
                )));
            }
        }
    }
}

/// The state of a blocker whose file exists but cannot be read (malformed, or caught in the
/// middle of a hand edit): not terminal, so it holds its dependents until it reads again.
const UNKNOWN_STATE: &str = "unknown";

/// Sets `b.issue.blocked_by` from the identifiers its file names, each with the state
/// `state_of` finds for it; an identifier it finds nothing for is left out.
fn resolve_blockers(b: &mut BoardIssue, state_of: impl Fn(&str) -> Option<String>) {
    b.issue.blocked_by = b
        .blocked_by
        .iter()
        .filter_map(|id| {
            Some(super::Blocker {
                id: id.clone(),
                identifier: id.clone(),
                state: state_of(id)?,
            })
        })
        .collect();
}

fn parse_file(text: &str) -> Result<(FrontMatter, &str), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        .ok_or("missing front matter: the file must start with a `---` line")?;
    let (yaml, body) = match rest.find("\n---") {
        Some(idx) => {
            let after = &rest[idx + 4..];
            let line_end = after.find('\n').map_or(after.len(), |i| i + 1);
            if !after[..line_end].trim().is_empty() {
                return Err("front matter is not closed by a `---` line".into());
            }
            (&rest[..idx + 1], &after[line_end..])
        }
        None if rest.starts_with("---") => ("", rest[3..].trim_start_matches(['\r', '\n'])),
        None => return Err("front matter is not closed by a `---` line".into()),
    };
    let fm: FrontMatter =
        serde_norway::from_str(yaml).map_err(|e| format!("invalid front matter: {e}"))?;
    if fm.title.trim().is_empty() {
        return Err("title must not be empty".into());
    }
    if fm.state.trim().is_empty() {
        return Err("state must not be empty".into());
    }
    for (name, ts) in [
        ("created_at", &fm.created_at),
        ("updated_at", &fm.updated_at),
    ] {
        if let Some(ts) = ts
            && humantime::parse_rfc3339_weak(ts).is_err()
        {
            return Err(format!("{name} is not an RFC 3339 timestamp: {ts:?}"));
        }
    }
    Ok((fm, body))
}

fn render_file(fm: &FrontMatter, description: &str) -> Result<String, TrackerError> {
    let yaml = serde_norway::to_string(fm)
        .map_err(|e| TrackerError::unavailable(format!("cannot encode issue: {e}")))?;
    let description = description.trim_matches('\n');
    Ok(if description.is_empty() {
        format!("---\n{yaml}---\n")
    } else {
        format!("---\n{yaml}---\n{description}\n")
    })
}

/// Writes `bytes` to a fresh temporary file in `dir`, flushed to disk.
fn write_temp(dir: &Path, target: &Path, bytes: &[u8]) -> io::Result<PathBuf> {
    let name = target
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("issue");
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tid = format!("{:?}", std::thread::current().id())
        .chars()
        .filter(char::is_ascii_digit)
        .collect::<String>();
    let tmp = dir.join(format!(".{name}.{}.{tid}.{nanos}.tmp", std::process::id()));
    let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
    // A board file is the people's: it keeps its mode, and a new one gets the usual mode
    // (svc's own files are private, the board is not).
    let mode = fs::metadata(target).map_or_else(
        |_| crate::process::people_file_mode(),
        |m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()),
    );
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(tmp)
}

/// Whether a board entry is a temporary file ([`write_temp`]) that its writer left for good (a
/// daemon killed in the middle of a write): the process that wrote it, its pid in the name, is
/// gone from this host.
fn abandoned_temp(entry: &fs::DirEntry) -> bool {
    let name = entry.file_name();
    let Some(name) = name.to_str() else {
        return false;
    };
    let Some(rest) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
        return false;
    };
    // `<file>.<pid>.<thread>.<nanos>`
    let Some(pid) = rest
        .rsplit('.')
        .nth(2)
        .and_then(|p| p.parse::<libc::pid_t>().ok())
    else {
        return false;
    };
    // SAFETY: signal 0 only asks whether the process exists.
    pid > 0
        && pid as u32 != std::process::id()
        && unsafe { libc::kill(pid, 0) != 0 && *libc::__errno_location() == libc::ESRCH }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Atomically replaces `target`.
fn write_replace(dir: &Path, target: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = write_temp(dir, target, bytes)?;
    if let Err(e) = fs::rename(&tmp, target) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir);
    Ok(())
}

/// Atomically creates `target`, failing with `AlreadyExists` if it exists.
fn write_new(dir: &Path, target: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = write_temp(dir, target, bytes)?;
    let linked = fs::hard_link(&tmp, target);
    let _ = fs::remove_file(&tmp);
    linked?;
    sync_dir(dir);
    Ok(())
}

/// The tracker over a board.
pub struct LocalTracker {
    board: Board,
    /// Comment authors who may steer; empty: anyone but svc's own comments.
    users: Vec<String>,
    /// Each candidate's comment count as the last `fetch_candidates` read it: where the
    /// steering cursor of an issue that poll may dispatch starts (before its run, never after).
    fetched: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
}

/// The author svc's local pack writes its agents' comments as (never steering).
pub const AGENT_AUTHOR: &str = "agent";

impl LocalTracker {
    pub fn new(board: Board, users: Vec<String>) -> LocalTracker {
        LocalTracker {
            board,
            users,
            fetched: Default::default(),
        }
    }

    /// Every issue on the board, with its comment count.
    fn issues(&self) -> Result<Vec<(Issue, usize)>, TrackerError> {
        let scan = self.board.scan()?;
        for s in &scan.skipped {
            log::warn!(
                "board {}: skipping malformed file {}: {}",
                self.board.dir.display(),
                s.file,
                s.reason
            );
        }
        Ok(scan
            .issues
            .into_iter()
            .map(|b| (b.issue, b.comments.len()))
            .collect())
    }
}

impl Tracker for LocalTracker {
    fn post_comment(&self, issue: &Issue, body: &str) -> Result<(), TrackerError> {
        self.board
            .add_comment(&issue.identifier, AGENT_AUTHOR, body)
            .map(drop)
    }

    fn fetch_candidates(&self) -> Result<Vec<Issue>, TrackerError> {
        let active: Vec<(Issue, usize)> = self
            .issues()?
            .into_iter()
            .filter(|(i, _)| self.board.states.is_active(&i.state))
            .collect();
        *self.fetched.lock().unwrap_or_else(|p| p.into_inner()) = active
            .iter()
            .map(|(i, n)| (i.identifier.clone(), *n))
            .collect();
        Ok(active.into_iter().map(|(i, _)| i).collect())
    }

    fn fetch_states_by_ids(&self, ids: &[String]) -> Result<Vec<Issue>, TrackerError> {
        let mut out = Vec::new();
        for id in ids {
            match self.board.read(id) {
                Ok(b) => out.push(b.issue),
                Err(e) if e.kind == super::TrackerErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn fetch_terminal(&self) -> Result<Vec<Issue>, TrackerError> {
        Ok(self
            .issues()?
            .into_iter()
            .map(|(i, _)| i)
            .filter(|i| self.board.states.is_terminal(&i.state))
            .collect())
    }

    fn steering_source(&self) -> Option<String> {
        Some(format!("local:{}", self.board.dir.display()))
    }

    /// Board comments as steering: the cursor is each issue's comment count (comments are
    /// appended), so what was added since the last poll, or while svc was down, is new. It holds
    /// the issues named and every candidate of the poll this read follows: a candidate new to
    /// it starts at the count that poll's fetch read, before it could dispatch the issue, so a
    /// comment written once its run began is never taken for history, and one added while the
    /// issue waited (between runs, say) reaches its next run. The first time (no cursor) what is
    /// there is history. Comments svc's agents wrote (`agent`), `!aside` notes and authors
    /// outside `users` are not delivered.
    fn steering(
        &self,
        issues: &[Issue],
        cursor: Option<&str>,
        _polled_at: std::time::SystemTime,
    ) -> Result<crate::steering::Batch, TrackerError> {
        let before: std::collections::BTreeMap<String, usize> = cursor
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or_default();
        let fetched = self
            .fetched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // The issues of this poll are kept: named ones, then candidates (an issue that leaves
        // both and comes back starts afresh).
        let mut counts = std::collections::BTreeMap::new();
        let mut batch = crate::steering::Batch::default();
        for issue in issues {
            // Where this issue's window starts: the cursor, else the count this poll's fetch read.
            let seen = cursor.and(
                before
                    .get(&issue.identifier)
                    .or(fetched.get(&issue.identifier))
                    .copied(),
            );
            let Ok(b) = self.board.read(&issue.identifier) else {
                if let Some(n) = seen {
                    counts.insert(issue.identifier.clone(), n);
                }
                continue;
            };
            counts.insert(issue.identifier.clone(), b.comments.len());
            // The first read of all (no cursor): history, not steering.
            let Some(seen) = seen else {
                continue;
            };
            for (n, c) in b.comments.iter().enumerate().skip(seen) {
                if c.author == AGENT_AUTHOR || c.body.trim().is_empty() {
                    continue;
                }
                if c.body.trim_start().starts_with(crate::steering::ASIDE) {
                    continue;
                }
                if !self.users.is_empty() && !self.users.contains(&c.author) {
                    batch.ignored.push(format!(
                        "{}: a comment by {} (not in the tracker's users)",
                        issue.identifier, c.author
                    ));
                    continue;
                }
                batch.messages.push(crate::steering::Message {
                    issue_id: issue.id.clone(),
                    source: crate::steering::Source::Local,
                    author: c.author.clone(),
                    text: c.body.clone(),
                    at: c.at.clone(),
                    key: format!("{}#{n}@{}", issue.identifier, c.at),
                });
            }
        }
        for (identifier, n) in fetched {
            let kept = before
                .get(&identifier)
                .copied()
                .filter(|_| cursor.is_some());
            counts.entry(identifier).or_insert(kept.unwrap_or(n));
        }
        batch.cursor = Some(serde_json::to_string(&counts).unwrap_or_default());
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct TempDir(PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn board(name: &str) -> (TempDir, Board) {
        let dir = std::env::temp_dir().join(format!("svc-board-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let states = StateNames {
            active: vec!["Todo".into(), "In Progress".into()],
            terminal: vec!["Done".into()],
        };
        let b = Board::new(
            &LocalOptions {
                path: dir.join("board"),
                id_prefix: "BOARD-".into(),
                users: Vec::new(),
            },
            states,
        );
        (TempDir(dir), b)
    }

    /// A temporary file a killed writer left is removed at the next scan; one of a live writer
    /// (this process) is not.
    #[test]
    fn a_temp_file_left_by_a_writer_that_is_gone_is_removed() {
        let (_t, b) = board("left-temp");
        fs::create_dir_all(b.dir()).unwrap();
        // A child that has exited: its pid names no process (until reused, long after).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let dead = b.dir().join(format!(".BOARD-1.md.{gone}.3.12345.tmp"));
        let live = b
            .dir()
            .join(format!(".BOARD-2.md.{}.3.12345.tmp", std::process::id()));
        fs::write(&dead, "x").unwrap();
        fs::write(&live, "y").unwrap();
        b.scan().unwrap();
        assert!(!dead.exists(), "left by a writer that is gone");
        assert!(live.exists(), "a live writer's");
    }

    /// A file's times are outside input: an mtime before the epoch (or past year 9999) is
    /// read like any other, never a panic.
    #[test]
    fn a_file_stamped_before_the_epoch_is_read() {
        let (_t, b) = board("old-mtime");
        b.create("Old", "", "Todo", &[], &[]).unwrap();
        let path = b.dir.join("BOARD-1.md");
        for t in [
            SystemTime::UNIX_EPOCH - std::time::Duration::from_secs(86_400),
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(300_000_000_000),
        ] {
            fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(t)
                .unwrap();
            let read = b.read("BOARD-1").unwrap();
            assert!(read.issue.created_at.is_some());
        }
    }

    #[test]
    fn create_read_update_comment_round_trip() {
        let (_t, b) = board("roundtrip");
        let created = b
            .create(
                "Fix login",
                "Steps:\n\n1. open",
                "Todo",
                &["bug".into()],
                &[],
            )
            .unwrap();
        assert_eq!(created.issue.identifier, "BOARD-1");
        assert_eq!(
            created.issue.description.as_deref(),
            Some("Steps:\n\n1. open")
        );
        assert_eq!(created.issue.state_type.as_deref(), Some("unstarted"));
        let second = b.create("Second", "", "Todo", &[], &[]).unwrap();
        assert_eq!(second.issue.identifier, "BOARD-2");
        assert_eq!(second.issue.description, None);

        b.update_state("BOARD-1", "In Progress").unwrap();
        b.add_comment("BOARD-1", "agent", "Working on it.\nLine two: with colon")
            .unwrap();
        let read = b.read("BOARD-1").unwrap();
        assert_eq!(read.issue.state, "In Progress");
        assert_eq!(read.issue.labels, vec!["bug".to_string()]);
        assert_eq!(read.comments.len(), 1);
        assert_eq!(
            read.comments[0].body,
            "Working on it.\nLine two: with colon"
        );
        assert_eq!(read.issue.description.as_deref(), Some("Steps:\n\n1. open"));
        let text = fs::read_to_string(&read.path).unwrap();
        assert!(
            text.starts_with("---\ntitle: Fix login\nstate: In Progress\n"),
            "{text}"
        );
    }

    #[test]
    fn hand_written_files_keep_unknown_keys_and_default_timestamps() {
        let (_t, b) = board("hand");
        fs::create_dir_all(b.dir()).unwrap();
        fs::write(
            b.dir().join("BOARD-7.md"),
            "---\ntitle: By hand\nstate: Todo\nowner: ana\n---\nBody\n",
        )
        .unwrap();
        fs::write(b.dir().join("README.md"), "not an issue").unwrap();
        let scan = b.scan().unwrap();
        assert_eq!(scan.issues.len(), 1);
        assert!(
            scan.issues[0].issue.created_at.is_some(),
            "mtime stands in for created_at"
        );
        b.update_state("BOARD-7", "Done").unwrap();
        let text = fs::read_to_string(b.dir().join("BOARD-7.md")).unwrap();
        assert!(text.contains("owner: ana"), "{text}");
        assert_eq!(
            b.read("BOARD-7").unwrap().issue.state_type.as_deref(),
            Some("completed")
        );
        assert_eq!(
            b.create("next", "", "Todo", &[], &[])
                .unwrap()
                .issue
                .identifier,
            "BOARD-8"
        );
    }

    #[test]
    fn malformed_files_are_skipped_and_reported() {
        let (_t, b) = board("malformed");
        fs::create_dir_all(b.dir()).unwrap();
        fs::write(
            b.dir().join("BOARD-1.md"),
            "---\ntitle: ok\nstate: Todo\n---\n",
        )
        .unwrap();
        fs::write(b.dir().join("BOARD-2.md"), "no front matter").unwrap();
        fs::write(b.dir().join("BOARD-3.md"), "---\ntitle: [unclosed\n---\n").unwrap();
        fs::write(b.dir().join("BOARD-4.md"), "---\nstate: Todo\n---\n").unwrap();
        fs::write(
            b.dir().join("BOARD-5.md"),
            "---\ntitle: t\nstate: Todo\ncreated_at: yesterday\n---\n",
        )
        .unwrap();
        fs::write(b.dir().join("BOARD-6.md"), "---\ntitle: t\nstate: Todo\n").unwrap();
        let scan = b.scan().unwrap();
        assert_eq!(scan.issues.len(), 1);
        let files: Vec<&str> = scan.skipped.iter().map(|s| s.file.as_str()).collect();
        assert_eq!(
            files,
            [
                "BOARD-2.md",
                "BOARD-3.md",
                "BOARD-4.md",
                "BOARD-5.md",
                "BOARD-6.md"
            ]
        );
        assert!(
            scan.skipped[2].reason.contains("title"),
            "{:?}",
            scan.skipped[2]
        );
        assert!(
            scan.skipped[3].reason.contains("created_at"),
            "{:?}",
            scan.skipped[3]
        );
        let t = LocalTracker::new(b.clone(), Vec::new());
        assert_eq!(t.fetch_candidates().unwrap().len(), 1);
        assert!(
            b.update_state("BOARD-2", "Done").is_err(),
            "a malformed file is never overwritten"
        );
        assert_eq!(
            fs::read_to_string(b.dir().join("BOARD-2.md")).unwrap(),
            "no front matter"
        );
    }

    #[test]
    fn blocked_by_carries_each_blockers_current_state_and_leaves_out_missing_ids() {
        let (_t, b) = board("blocked");
        b.create("first", "", "In Progress", &[], &[]).unwrap();
        let second = b
            .create("second", "", "Todo", &[], &["BOARD-1".into()])
            .unwrap();
        assert_eq!(second.issue.blocked_by.len(), 1);
        assert_eq!(second.issue.blocked_by[0].state, "In Progress");
        assert!(
            b.create("x", "", "Todo", &[], &["BOARD-9".into()]).is_err(),
            "a blocker must be on the board"
        );
        fs::write(
            b.dir().join("BOARD-3.md"),
            "---\ntitle: by hand\nstate: Todo\nblocked_by: [BOARD-2, BOARD-7]\n---\n",
        )
        .unwrap();
        b.update_state("BOARD-2", "Done").unwrap();
        let scan = b.scan().unwrap();
        let third = scan
            .issues
            .iter()
            .find(|i| i.issue.identifier == "BOARD-3")
            .unwrap();
        assert_eq!(third.blocked_by, ["BOARD-2", "BOARD-7"], "as written");
        let blockers: Vec<(&str, &str)> = third
            .issue
            .blocked_by
            .iter()
            .map(|x| (x.identifier.as_str(), x.state.as_str()))
            .collect();
        assert_eq!(
            blockers,
            [("BOARD-2", "Done")],
            "BOARD-7 is not on the board"
        );
        let read = b.read("BOARD-3").unwrap();
        assert_eq!(read.issue.blocked_by, third.issue.blocked_by);
        // A blocker whose file cannot be read still holds, in state unknown.
        let before = fs::read_to_string(b.dir().join("BOARD-2.md")).unwrap();
        fs::write(b.dir().join("BOARD-2.md"), "---\ntitle: half writ").unwrap();
        let scan = b.scan().unwrap();
        let third = scan
            .issues
            .iter()
            .find(|i| i.issue.identifier == "BOARD-3")
            .unwrap();
        assert_eq!(third.issue.blocked_by[0].state, "unknown");
        assert_eq!(
            b.read("BOARD-3").unwrap().issue.blocked_by[0].state,
            "unknown"
        );
        fs::write(b.dir().join("BOARD-2.md"), before).unwrap();
        // A rewrite keeps the list.
        b.add_comment("BOARD-3", "agent", "hi").unwrap();
        let text = fs::read_to_string(b.dir().join("BOARD-3.md")).unwrap();
        assert!(
            text.contains("blocked_by:\n- BOARD-2\n- BOARD-7\n"),
            "{text}"
        );
    }

    #[test]
    fn identifiers_outside_the_pattern_are_refused() {
        let (_t, b) = board("ids");
        for bad in [
            "../etc/passwd",
            "BOARD-1/../../x",
            "BOARD-",
            "BOARD-x",
            "OTHER-1",
            "BOARD-1.md",
        ] {
            let err = b.read(bad).unwrap_err();
            assert_eq!(err.kind, super::super::TrackerErrorKind::NotFound, "{bad}");
        }
    }

    #[test]
    fn concurrent_writers_lose_nothing() {
        let (_t, b) = board("concurrent");
        b.create("shared", "", "Todo", &[], &[]).unwrap();
        let b = Arc::new(b);
        let mut handles = Vec::new();
        for w in 0..8 {
            let b = Arc::clone(&b);
            handles.push(std::thread::spawn(move || {
                for i in 0..10 {
                    b.add_comment("BOARD-1", "w", &format!("{w}-{i}")).unwrap();
                    b.create(&format!("w{w}-{i}"), "", "Todo", &[], &[])
                        .unwrap();
                }
            }));
        }
        // A reader racing the writers never sees a partial file.
        let reader = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                for _ in 0..200 {
                    assert!(b.scan().unwrap().skipped.is_empty());
                }
            })
        };
        for h in handles {
            h.join().unwrap();
        }
        reader.join().unwrap();
        assert_eq!(b.read("BOARD-1").unwrap().comments.len(), 80);
        let scan = b.scan().unwrap();
        assert_eq!(scan.issues.len(), 81);
        let leftovers: Vec<_> = fs::read_dir(b.dir())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
