//! What the GitHub and GitLab trackers (the forges) share beyond the request loop
//! ([`super::rest`]): troubles said once per episode ([`Said`]), the token's user read once
//! ([`Remembered`]), issue ids and list scopes ([`Places`], [`scope`]), the `Tracker` methods
//! they answer alike ([`forge_tracker_methods`]), and the skeleton of their feedback read
//! ([`Feedback::read`]): the cursor (started, or cut at [`comments::CURSOR_MAX_AGE`] and said
//! once), the parked issues watched beside the given ones, and the rework moves feedback on a
//! parked issue makes ([`super::rework`]). What each forge gathers in between (comments,
//! reviews, checks; notes, pipelines) stays its own (`github::feedback`, `gitlab::feedback`).

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::comments::{self, Comment, Cursor};
use super::http::enc;
use super::rework::{self, Rework};
use super::{Issue, TrackerError};
use crate::steering::{Batch, Message, Source};

/// Forge times compare with this slack (whole seconds, and the forge's clock against svc's).
pub const PRECISION: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Troubles said once per episode, by key: said when one starts, gone when it ends, so the
/// next episode is said again.
#[derive(Default)]
pub struct Said(Mutex<HashSet<String>>);

impl Said {
    /// Whether the trouble `key` is to be said now: true when `failing` and it was not said
    /// yet in this episode; `failing == false` ends the episode.
    pub fn episode(&self, key: &str, failing: bool) -> bool {
        let mut said = lock(&self.0);
        if failing {
            said.insert(key.to_string())
        } else {
            said.remove(key);
            false
        }
    }

    /// Ends the episodes whose keys `keep` refuses (what they were about is gone).
    pub fn retain(&self, keep: impl FnMut(&String) -> bool) {
        lock(&self.0).retain(keep);
    }
}

/// A value read once and kept (the token's user).
pub struct Remembered<T>(Mutex<Option<T>>);

impl<T> Default for Remembered<T> {
    fn default() -> Self {
        Remembered(Mutex::new(None))
    }
}

impl<T: Clone> Remembered<T> {
    /// The kept value, or the one `read` gives (kept when it is one).
    pub fn get_or_read(
        &self,
        read: impl FnOnce() -> Result<T, TrackerError>,
    ) -> Result<T, TrackerError> {
        if let Some(v) = lock(&self.0).clone() {
            return Ok(v);
        }
        let v = read()?;
        *lock(&self.0) = Some(v.clone());
        Ok(v)
    }
}

/// A forge's feedback pipeline: who it is, who may steer, where feedback sends a parked issue,
/// and the state it keeps between reads.
pub struct Feedback {
    source: Source,
    /// What a read after a long stop leaves unread (`comments, reviews and checks`).
    history: &'static str,
    /// Who may steer (`users`; empty: everyone allowed).
    users: Vec<String>,
    /// Where feedback on a parked issue sends it, if anywhere (`rework_state`).
    rework_state: Option<String>,
    /// Troubles said once per episode.
    pub said: Said,
    /// Open issues in a non-active, non-terminal state at the last poll (review feedback may
    /// send them back to work), at most [`rework::PARKED_MAX`].
    parked: Mutex<Vec<Issue>>,
    /// Feedback on parked issues and the moves it makes, kept in the daemon's durable store
    /// under `rework <source>:<endpoint>`.
    rework: Mutex<Rework>,
}

impl Feedback {
    pub fn new(
        source: Source,
        history: &'static str,
        endpoint: &str,
        users: &[String],
        rework_state: Option<&str>,
    ) -> Feedback {
        Feedback {
            source,
            history,
            users: users.to_vec(),
            rework_state: rework_state.map(str::to_string),
            said: Said::default(),
            parked: Mutex::default(),
            rework: Mutex::new(Rework::kept(format!(
                "rework {}:{endpoint}",
                source.as_str()
            ))),
        }
    }

    /// The parked issues a candidate read found.
    pub fn set_parked(&self, parked: Vec<Issue>) {
        *lock(&self.parked) = parked;
    }

    /// The batch of `comments` since `cur`, asked at `now`.
    pub fn batch(&self, comments: Vec<Comment>, cur: Cursor, now: SystemTime) -> Batch {
        comments::batch_coarse(self.source, comments, cur, &self.users, now, PRECISION)
    }

    /// Keeps the rework memo in `facts` (the daemon's durable store, once it is open).
    pub fn keep_in(&mut self, facts: crate::facts::Later) {
        self.rework
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .keep_in(facts);
    }

    /// A feedback read of `issues` since `cursor`: `open` (the cursor, the parked issues), then
    /// `gather` (what the forge read of the watched issues, as a batch), then `close` (held
    /// feedback and rework moves).
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &self,
        issues: &[Issue],
        cursor: Option<&str>,
        polled_at: SystemTime,
        waiting: &[Message],
        is_parked: impl Fn(&str) -> bool,
        send_back: impl FnMut(&str, &str) -> Result<(), TrackerError>,
        gather: impl FnOnce(&Opened, &[&Issue]) -> Result<Batch, TrackerError>,
    ) -> Result<Batch, TrackerError> {
        let opened = match self.open(issues, cursor, polled_at, is_parked) {
            Ok(opened) => opened,
            Err(first) => return Ok(first),
        };
        let batch = gather(&opened, &opened.watched(issues))?;
        Ok(self.close(batch, opened, waiting, send_back))
    }

    /// Begins a feedback read: the cursor, or the batch that starts one (`Err`, the whole
    /// read's answer the first time); a cursor older than [`comments::CURSOR_MAX_AGE`] is cut
    /// there, said once per episode. `is_parked` tells a state that waits for review.
    fn open(
        &self,
        issues: &[Issue],
        cursor: Option<&str>,
        polled_at: SystemTime,
        is_parked: impl Fn(&str) -> bool,
    ) -> Result<Opened, Batch> {
        let comments::Window { cursor: cur, now } = comments::window(cursor, polled_at)?;
        let (cur, too_old) = cur.within(now, comments::CURSOR_MAX_AGE);
        let mut said = None;
        if self.said.episode("cursor too old", too_old) {
            let line = format!(
                "{}: steering was last read more than a day ago: {} before {} are not read",
                self.source.as_str(),
                self.history,
                crate::time::rfc3339_seconds(cur.since())
            );
            log::warn!("{line}");
            said = Some(line);
        }
        let parked = lock(&self.parked).clone();
        let (parked, parked_ids) = rework::parked_beside(issues, parked, is_parked);
        Ok(Opened {
            now,
            cur,
            parked,
            parked_ids,
            said,
        })
    }

    /// Ends a feedback read: what was said of the cursor joins the batch; feedback on a parked
    /// issue waits for its next run (held), and with `rework_state` the first of it sends the
    /// issue back to work (`send_back`); so does feedback read while the issue's run was ending
    /// (`waiting`: it came as ordinary steering), once a read sees the issue parked.
    fn close(
        &self,
        mut batch: Batch,
        opened: Opened,
        waiting: &[Message],
        send_back: impl FnMut(&str, &str) -> Result<(), TrackerError>,
    ) -> Batch {
        batch.ignored.extend(opened.said);
        let state = self.rework_state.as_deref();
        let parked = &opened.parked_ids;
        let mut memo = lock(&self.rework);
        memo.hold(&mut batch, parked, state.is_some());
        memo.waiting(waiting, self.source, parked, state.is_some());
        let mut moves = std::mem::take(&mut *memo);
        drop(memo);
        if let Some(state) = state {
            moves.move_pending(parked, state, send_back);
        }
        *lock(&self.rework) = moves;
        rework::sort(&mut batch);
        batch
    }
}

/// A feedback read begun: its cursor, the issues it watches and what it said so far.
pub struct Opened {
    pub now: SystemTime,
    /// The cursor, cut at [`comments::CURSOR_MAX_AGE`].
    pub cur: Cursor,
    /// The parked issues watched beside the given ones.
    pub parked: Vec<Issue>,
    /// The ids of every parked issue (given or not).
    pub parked_ids: HashSet<String>,
    /// What was said of the cursor (for [`Batch::ignored`]).
    said: Option<String>,
}

impl Opened {
    /// The issues the read watches: the given ones, then the parked ones beside them.
    pub fn watched<'a>(&'a self, issues: &'a [Issue]) -> Vec<&'a Issue> {
        issues.iter().chain(self.parked.iter()).collect()
    }
}

/// `<place>#N` (`owner/name#N`, `group/project#IID`) split into the place and the number.
pub fn split_identifier(id: &str) -> Option<(&str, u64)> {
    let (place, n) = id.trim().rsplit_once('#')?;
    let n = n.parse::<u64>().ok().filter(|n| *n > 0)?;
    place.contains('/').then_some((place, n))
}

/// The label names of an issue record (names, or objects with a `name`).
pub fn labels(v: &Value) -> Vec<String> {
    v.get("labels")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|l| {
            l.as_str()
                .or_else(|| l.get("name").and_then(Value::as_str))
                .map(str::to_string)
        })
        .collect()
}

/// Where a forge's issues live (`repos`, `projects`) and how their ids are written.
pub struct Places<'a> {
    /// `github`, `gitlab`.
    pub provider: &'static str,
    /// The configuration key (`repos`) and its places.
    pub key: &'static str,
    pub configured: &'a [String],
    /// An issue id's form (`owner/name#N`), and the place an example names when none is
    /// configured (`octo/app`).
    pub form: &'static str,
    pub example: &'static str,
}

impl Places<'_> {
    /// The configured spelling of `place` when it is configured (forges compare these names
    /// case-insensitively), else `place` as it is.
    pub fn canonical(&self, place: &str) -> String {
        self.configured
            .iter()
            .find(|p| p.eq_ignore_ascii_case(place))
            .cloned()
            .unwrap_or_else(|| place.to_string())
    }

    /// An issue id an agent or operator gave: `<place>#N`, or `#N` / `N` when svc works a
    /// single place.
    pub fn resolve(&self, id: &str) -> Result<(String, u64), TrackerError> {
        if let Some((place, n)) = split_identifier(id) {
            return Ok((self.canonical(place), n));
        }
        let bare = id.trim().trim_start_matches('#');
        match (bare.parse::<u64>(), self.configured) {
            (Ok(n), [place]) if n > 0 => Ok((place.clone(), n)),
            _ => Err(TrackerError::invalid(format!(
                "'{id}' is not an issue id: use {} (for example {}#1)",
                self.form,
                self.configured.first().map_or(self.example, String::as_str)
            ))),
        }
    }

    /// [`Places::resolve`], refusing an issue outside the configured places (what the
    /// forge's pack acts on: the token may reach others, the workflow does not).
    pub fn resolve_configured(&self, id: &str) -> Result<(String, u64), TrackerError> {
        let (place, n) = self.resolve(id)?;
        if !self
            .configured
            .iter()
            .any(|p| p.eq_ignore_ascii_case(&place))
        {
            return Err(TrackerError::invalid(format!(
                "{place}#{n} is not in the workflow's {} ({}): the {} tools act only on their issues",
                self.key,
                self.configured.join(", "),
                self.provider
            )));
        }
        Ok((place, n))
    }
}

/// The query string that scopes issue lists: `labels`, and `assignee` as `assignee_key`
/// (`me`: the token's user, which `me` reads).
pub fn scope(
    labels: &[String],
    assignee: Option<&str>,
    assignee_key: &str,
    me: impl FnOnce() -> Result<String, TrackerError>,
) -> Result<String, TrackerError> {
    let mut q = String::new();
    if !labels.is_empty() {
        q.push_str("&labels=");
        q.push_str(&enc(&labels.join(",")));
    }
    let assignee = match assignee {
        None => return Ok(q),
        Some(a) if a.eq_ignore_ascii_case("me") => me()?,
        Some(a) => a.to_string(),
    };
    q.push_str(&format!("&{assignee_key}="));
    q.push_str(&enc(&assignee));
    Ok(q)
}

/// A comment's text quoted under `header` (`alice commented on owner/app#5`), or nothing when
/// the text is blank or an `!aside`.
pub fn quoted(header: String, body: &str) -> String {
    let body = body.trim();
    if body.is_empty() || body.starts_with(crate::steering::ASIDE) {
        String::new()
    } else {
        format!("{header}:\n{body}")
    }
}

/// Whether `at` (a forge's time, whole seconds) may be after `since`.
pub fn after(at: &str, since: SystemTime) -> bool {
    crate::time::parse_time(at).is_some_and(|t| t + PRECISION > since)
}

/// The `Tracker` methods GitHub and GitLab answer alike (in `impl Tracker`, where the type has
/// `api`, `opts.endpoint`, `feedback`, `is_parked` and `set_state`, and its module a
/// `feedback::gather`): the rate limits the API client keeps, the steering source
/// `<name>:<endpoint>`, and steering read by the feedback pipeline ([`Feedback::read`]).
macro_rules! forge_tracker_methods {
    ($name:literal) => {
        fn rate_limits(&self) -> Option<serde_json::Value> {
            self.api.rate_limits()
        }

        fn steering_source(&self) -> Option<String> {
            Some(format!(concat!($name, ":{}"), self.opts.endpoint))
        }

        fn steering(
            &self,
            issues: &[Issue],
            cursor: Option<&str>,
            polled_at: std::time::SystemTime,
        ) -> Result<crate::steering::Batch, TrackerError> {
            self.steering_waiting(issues, cursor, polled_at, &[])
        }

        fn steering_waiting(
            &self,
            issues: &[Issue],
            cursor: Option<&str>,
            polled_at: std::time::SystemTime,
            waiting: &[crate::steering::Message],
        ) -> Result<crate::steering::Batch, TrackerError> {
            self.feedback.read(
                issues,
                cursor,
                polled_at,
                waiting,
                |state| self.is_parked(state),
                |id, state| self.set_state(id, state).map(|_| ()),
                |opened, watched| feedback::gather(self, opened, watched, cursor),
            )
        }
    };
}
pub(crate) use forge_tracker_methods;
