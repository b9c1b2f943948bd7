//! What the comment-based steering sources share (tracker-a's Linear comments, tracker-b's and
//! tracker-b-mcp's Jira comments), with no I/O: the cursor, who may steer, and the batch.
//!
//! The cursor is a high-water mark of comment creation times (the tracker's clock), with the
//! time the source started (svc's clock) as a floor. Each poll asks for comments created after
//! the mark less [`OVERLAP`], never before the floor: a comment that became visible late is still
//! found, one offered again is not delivered twice (its key is the comment id), and nothing
//! written before the source started is delivered. A poll with nothing new still moves the mark
//! to [`SETTLE`] before now (a minute at a time), so the window stays short. Only creation counts: an edited comment keeps
//! its creation time, so editing an old comment steers nothing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::{Issue, TrackerError};
use crate::steering::{ASIDE, Batch, Message};
use crate::time::{format_time, parse_time};

/// How far behind the newest comment seen each poll asks again.
pub const OVERLAP: Duration = Duration::from_secs(60);
/// How long after its creation a comment is surely visible (and svc's clock and the tracker's
/// agree): a poll moves the mark up to this long before now even when nothing new came, so the
/// window a poll asks about stays short.
pub const SETTLE: Duration = Duration::from_secs(120);

/// The furthest back a comment source whose reads move on (GitHub's, GitLab's) asks: what was
/// written before (a daemon stopped for longer) is not read, said once.
pub const CURSOR_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// A comment source's cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The newest comment creation time seen (or the start, before any).
    pub high: SystemTime,
    /// Nothing created before this is delivered (when the source started).
    pub floor: SystemTime,
}

/// A comment read's window: the cursor it reads from, and when it was asked.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub cursor: Cursor,
    pub now: SystemTime,
}

/// A tracker whose steering is what people comment (tracker-a, tracker-b, tracker-b-mcp):
/// [`super::Tracker::steering`] reads it through [`window`].
pub trait CommentSource {
    /// What people wrote on `issues` within `window`, as a batch with the next cursor.
    fn steering_comments(&self, issues: &[Issue], window: Window) -> Result<Batch, TrackerError>;
}

/// The one prologue of every comment read (the comment sources', the forges'): the window
/// from the source's cursor, or the batch that starts one (`Err`: the whole read's answer the
/// first time), as [`cursor_or_start`] says.
pub fn window(cursor: Option<&str>, polled_at: SystemTime) -> Result<Window, Batch> {
    let now = SystemTime::now();
    cursor_or_start(cursor, polled_at).map(|cursor| Window { cursor, now })
}

/// A source's cursor, or the batch that starts one: the first time (no cursor, or one that
/// cannot be read) nothing written before `polled_at` (the start of the poll this read
/// follows, so before any issue it dispatched) steers, and the batch only carries the start.
pub fn cursor_or_start(
    cursor: Option<&str>,
    polled_at: std::time::SystemTime,
) -> Result<Cursor, crate::steering::Batch> {
    // A cursor ahead of the poll by more than a day, or one that contradicts itself, is taken
    // for none (read from a damaged store, say): it would otherwise silence the source.
    let sane = |c: &Cursor| c.floor <= c.high && c.high <= polled_at + Duration::from_secs(86_400);
    Cursor::read(cursor)
        .filter(sane)
        .ok_or_else(|| crate::steering::Batch {
            cursor: Some(Cursor::start(polled_at).text()),
            ..Default::default()
        })
}

impl Cursor {
    /// The cursor in `text`, if it is one (`None` the first time).
    pub fn read(text: Option<&str>) -> Option<Cursor> {
        let v: Value = serde_json::from_str(text?).ok()?;
        let at = |k: &str| v.get(k).and_then(Value::as_str).and_then(parse_time);
        Some(Cursor {
            high: at("high")?,
            floor: at("floor")?,
        })
    }

    pub fn start(now: SystemTime) -> Cursor {
        Cursor {
            high: now,
            floor: now,
        }
    }

    /// Comments created after this are asked for.
    pub fn since(&self) -> SystemTime {
        self.high
            .checked_sub(OVERLAP)
            .unwrap_or(UNIX_EPOCH)
            .max(self.floor)
    }

    pub fn text(&self) -> String {
        json!({"high": format_time(self.high), "floor": format_time(self.floor)}).to_string()
    }

    /// This cursor, or, when it asks further back than `max_age` before `now` (the source was
    /// not read for that long: the daemon was stopped), one that asks from `max_age` back; and
    /// whether it was cut (what was written before is not read).
    pub fn within(self, now: SystemTime, max_age: Duration) -> (Cursor, bool) {
        let oldest = now.checked_sub(max_age).unwrap_or(UNIX_EPOCH);
        if self.since() >= oldest {
            return (self, false);
        }
        let cut = Cursor {
            high: oldest + OVERLAP,
            floor: self.floor.min(oldest),
        };
        (cut, true)
    }
}

/// Who wrote a comment, as far as steering cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Author {
    /// A person's account.
    Person,
    /// svc's own account (never delivered, never reported).
    Own,
    /// Not a person: a bot, an app or an integration (the reason says which).
    NotPerson(String),
    /// A person the tracker says may not steer there (GitHub: no write access to the
    /// repository), whatever `users` says; the reason says why.
    Refused(String),
}

/// A comment as a tracker reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Comment {
    /// The tracker's id of the issue, and its identifier (for the lines of what was ignored).
    pub issue_id: String,
    pub issue: String,
    /// The comment's own id (the message key).
    pub id: String,
    /// When it was created, as the tracker wrote it.
    pub created: String,
    /// The author's name, as the message shows it.
    pub author: String,
    /// What `users` may name the author by (account id, email).
    pub author_ids: Vec<String>,
    pub kind: Author,
    pub text: String,
}

/// What people wrote in `comments` (any order) since `cursor`, asked at `now`: messages oldest
/// first for the allowed people (everyone when `users` is empty), a line for each comment not
/// delivered (reported once: only comments past the cursor's mark), and the new cursor.
pub fn batch(
    source: crate::steering::Source,
    comments: Vec<Comment>,
    cursor: Cursor,
    users: &[String],
    now: SystemTime,
) -> Batch {
    batch_coarse(source, comments, cursor, users, now, Duration::ZERO)
}

/// [`batch`] for a tracker whose times are `precision` coarse (GitHub writes whole seconds):
/// a comment stamped within `precision` before the window still counts (its key keeps it from
/// being delivered twice), so one written in the second svc started is not lost.
pub fn batch_coarse(
    source: crate::steering::Source,
    comments: Vec<Comment>,
    cursor: Cursor,
    users: &[String],
    now: SystemTime,
    precision: Duration,
) -> Batch {
    let since = cursor.since().checked_sub(precision).unwrap_or(UNIX_EPOCH);
    // Settled time moves the mark a minute at a time at most (each move is a store write).
    let settled = now.checked_sub(SETTLE).unwrap_or(UNIX_EPOCH);
    let mut high = if settled > cursor.high + Duration::from_secs(60) {
        settled
    } else {
        cursor.high
    };
    let mut found: Vec<(SystemTime, Comment)> = comments
        .into_iter()
        .filter_map(|c| parse_time(&c.created).map(|t| (t, c)))
        .filter(|(t, _)| *t > since)
        .collect();
    found.sort_by(|a, b| (a.0, &a.1.id, &a.1.issue_id).cmp(&(b.0, &b.1.id, &b.1.issue_id)));
    found.dedup_by(|a, b| a.1.id == b.1.id && a.1.issue_id == b.1.issue_id);
    let mut out = Batch::default();
    for (t, c) in found {
        // A coarse time stands for the whole of its second: a comment counts as new (for the
        // report of what was ignored) until the mark has passed its second's end.
        let end = t + precision.saturating_sub(Duration::from_millis(1));
        let new = end > cursor.high;
        // A date ahead of now (a clock ahead, a hostile date) cannot pin the mark in the future.
        high = high.max(end.min(now));
        let text = c.text.trim();
        if c.kind == Author::Own || text.is_empty() || text.starts_with(ASIDE) {
            continue;
        }
        let why = match &c.kind {
            Author::NotPerson(reason) | Author::Refused(reason) => Some(reason.clone()),
            _ if !users.is_empty() && !allowed(users, &c.author_ids) => {
                Some("not in the tracker's users".to_string())
            }
            _ => None,
        };
        if let Some(why) = why {
            if new {
                out.ignored
                    .push(format!("{}: a comment by {} ({why})", c.issue, c.author));
            }
            continue;
        }
        out.messages.push(Message {
            issue_id: c.issue_id,
            source,
            author: c.author,
            text: c.text,
            at: c.created,
            key: c.id,
        });
    }
    out.cursor = Some(
        Cursor {
            high,
            floor: cursor.floor,
        }
        .text(),
    );
    out
}

/// Whether one of `ids` is in `users` (emails compare case-insensitively).
fn allowed(users: &[String], ids: &[String]) -> bool {
    ids.iter()
        .filter(|i| !i.is_empty())
        .any(|i| users.iter().any(|u| u.trim().eq_ignore_ascii_case(i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        parse_time(s).unwrap()
    }

    fn comment(id: &str, created: &str, author: &str, kind: Author, text: &str) -> Comment {
        Comment {
            issue_id: "i1".into(),
            issue: "ENG-1".into(),
            id: id.into(),
            created: created.into(),
            author: author.into(),
            author_ids: vec![format!("id-{author}"), format!("{author}@example.com")],
            kind,
            text: text.into(),
        }
    }

    /// The first read starts the window at the poll it follows, not at itself: a comment on an
    /// issue that poll dispatched, written before the read, reaches the next read. And a read
    /// moves the window no further than its own time less the overlap, so the read after one
    /// that did not name an issue yet still covers what was written on it meanwhile.
    #[test]
    fn a_window_starts_at_the_poll_and_covers_the_issues_a_read_did_not_name() {
        let polled_at = at("2026-11-25T10:00:00Z");
        let first = cursor_or_start(None, polled_at).unwrap_err();
        let c = Cursor::read(first.cursor.as_deref()).unwrap();
        let early = comment(
            "c1",
            "2026-11-25T10:00:00.100Z",
            "bob",
            Author::Person,
            "early",
        );
        let b = batch(
            crate::steering::Source::TrackerA,
            vec![early],
            c,
            &[],
            at("2026-11-25T10:00:05Z"),
        );
        assert_eq!(b.messages.len(), 1, "{b:?}");
        // A quiet read at 10:30 (nothing on the issues it named) moves the mark to settled time;
        // a comment written just before it on an issue it did not name is inside the next window.
        let quiet = batch(
            crate::steering::Source::TrackerA,
            vec![],
            c,
            &[],
            at("2026-11-25T10:30:00Z"),
        );
        let c = Cursor::read(quiet.cursor.as_deref()).unwrap();
        assert!(c.since() < at("2026-11-25T10:29:59Z"), "{:?}", c.since());
    }

    /// A comment dated in the future (a clock ahead, a hostile date) is delivered but cannot
    /// move the mark past now, and a cursor far ahead read back from a store is taken for none.
    #[test]
    fn a_future_date_cannot_pin_the_mark() {
        let now = at("2026-11-25T10:00:00Z");
        let c = Cursor::start(at("2026-11-25T09:00:00Z"));
        let ahead = comment(
            "c1",
            "2030-01-01T00:00:00Z",
            "bob",
            Author::Person,
            "from the future",
        );
        let b = batch(crate::steering::Source::TrackerB, vec![ahead], c, &[], now);
        assert_eq!(b.messages.len(), 1);
        let next = Cursor::read(b.cursor.as_deref()).unwrap();
        assert!(next.high <= now, "{:?}", next.high);
        let far = Cursor::start(at("2030-01-01T00:00:00Z")).text();
        assert!(cursor_or_start(Some(&far), now).is_err(), "taken for none");
    }

    /// A cursor older than its maximum age asks from that age back, never further; a recent
    /// one is left as it is.
    #[test]
    fn a_cursor_asks_no_further_back_than_its_maximum_age() {
        let now = at("2026-11-25T10:00:00Z");
        let day = Duration::from_secs(86_400);
        let old = Cursor::start(at("2026-11-20T10:00:00Z"));
        let (cut, was_cut) = old.within(now, day);
        assert!(was_cut);
        assert_eq!(cut.since(), at("2026-11-24T10:00:00Z"));
        assert!(cut.floor <= cut.high);
        let recent = Cursor {
            high: at("2026-11-25T09:00:00Z"),
            floor: at("2026-11-20T10:00:00Z"),
        };
        assert_eq!(recent.within(now, day), (recent, false));
    }

    #[test]
    fn times_parse_with_jira_offsets() {
        let z = at("2026-11-25T10:00:00.000Z");
        assert_eq!(at("2026-11-25T10:00:00.000+0000"), z);
        assert_eq!(at("2026-11-25T11:30:00.000+0130"), z);
        assert_eq!(at("2026-11-25T05:00:00.000-05:00"), z);
        assert_eq!(at("2026-11-25T10:00:00Z"), z);
        assert!(parse_time("2026-11-25T10:00:00.000+01").is_none());
        assert!(parse_time("yesterday").is_none());
    }

    #[test]
    fn a_cursor_round_trips_and_asks_with_an_overlap_never_before_its_floor() {
        let start = at("2026-11-25T10:00:00Z");
        let c = Cursor::start(start);
        assert_eq!(c.since(), start, "the floor holds at first");
        assert_eq!(Cursor::read(Some(&c.text())), Some(c));
        assert_eq!(Cursor::read(Some("garbage")), None);
        assert_eq!(Cursor::read(None), None);
        let later = Cursor {
            high: at("2026-11-25T11:00:00Z"),
            floor: start,
        };
        assert_eq!(later.since(), at("2026-11-25T10:59:00Z"));
    }

    #[test]
    fn only_allowed_people_steer_and_what_is_not_taken_is_said_once() {
        let cursor = Cursor {
            high: at("2026-11-25T10:00:00Z"),
            floor: at("2026-11-25T09:00:00Z"),
        };
        let comments = vec![
            comment(
                "c5",
                "2026-11-25T10:00:05.000+0000",
                "alice",
                Author::Person,
                "second",
            ),
            comment(
                "c4",
                "2026-11-25T10:00:04Z",
                "alice",
                Author::Person,
                "first",
            ),
            comment("c6", "2026-11-25T10:00:06Z", "svc", Author::Own, "mine"),
            comment(
                "c7",
                "2026-11-25T10:00:07Z",
                "gh",
                Author::NotPerson("a bot".into()),
                "linked a PR",
            ),
            comment(
                "c8",
                "2026-11-25T10:00:08Z",
                "mallory",
                Author::Person,
                "hi",
            ),
            comment(
                "c9",
                "2026-11-25T10:00:09Z",
                "alice",
                Author::Person,
                "!aside humans only",
            ),
            // In the overlap: offered again, not reported again.
            comment(
                "c1",
                "2026-11-25T09:59:30Z",
                "mallory",
                Author::Person,
                "old",
            ),
            // Before the overlap: never.
            comment(
                "c0",
                "2026-11-25T09:58:00Z",
                "alice",
                Author::Person,
                "older",
            ),
        ];
        let users = vec!["ALICE@example.com".to_string()];
        let b = batch(
            crate::steering::Source::TrackerB,
            comments,
            cursor,
            &users,
            at("2026-11-25T10:00:10Z"),
        );
        let texts: Vec<&str> = b.messages.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(texts, ["first", "second"]);
        assert_eq!(b.messages[0].key, "c4");
        assert_eq!(b.messages[0].source, crate::steering::Source::TrackerB);
        assert_eq!(b.messages[0].author, "alice");
        assert_eq!(
            b.ignored,
            [
                "ENG-1: a comment by gh (a bot)",
                "ENG-1: a comment by mallory (not in the tracker's users)"
            ]
        );
        let next = Cursor::read(b.cursor.as_deref()).unwrap();
        assert_eq!(next.high, at("2026-11-25T10:00:09Z"));
        assert_eq!(next.floor, cursor.floor);
        // Anyone may steer when `users` is empty.
        let b = batch(
            crate::steering::Source::TrackerA,
            vec![comment(
                "c8",
                "2026-11-25T10:00:08Z",
                "mallory",
                Author::Person,
                "hi",
            )],
            cursor,
            &[],
            cursor.high,
        );
        assert_eq!(b.messages.len(), 1);
        // Nothing new: the mark still moves up to a settled time before now.
        let now = at("2026-11-25T12:00:00Z");
        let b = batch(
            crate::steering::Source::TrackerA,
            Vec::new(),
            cursor,
            &[],
            now,
        );
        let next = Cursor::read(b.cursor.as_deref()).unwrap();
        assert_eq!(next.high, at("2026-11-25T11:58:00Z"));
        assert_eq!(next.since(), at("2026-11-25T11:57:00Z"));
        // Less than a minute later, it stays (no store write every poll).
        let b = batch(
            crate::steering::Source::TrackerA,
            Vec::new(),
            next,
            &[],
            now + Duration::from_secs(50),
        );
        assert_eq!(b.cursor, Some(next.text()));
    }
}
