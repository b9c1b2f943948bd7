//! Time as svc reads, writes and shows it: the wall clock in epoch milliseconds, RFC 3339 in
//! and out (also with the offsets Jira writes), and durations for people. A leaf: it uses
//! nothing of the crate, and every layer (trackers, the state thread, the commands) may use it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: how svc keeps every instant it reads or is told.
pub type Millis = u64;

/// The wall clock in milliseconds since the epoch (0 before it).
pub fn unix_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The last millisecond RFC 3339 can write: 9999-12-31T23:59:59.999Z.
pub const LAST_MS: u64 = 253_402_300_799_999;

/// `t` moved into what RFC 3339 can write, from the epoch to [`LAST_MS`]: humantime panics on
/// a time before the epoch and fails past year 9999, and times come from outside (a file's
/// mtime, a tracker's date, a row read back), so every formatter goes through this.
fn writable(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) if d.as_millis() <= u128::from(LAST_MS) => t,
        Ok(_) => UNIX_EPOCH + Duration::from_millis(LAST_MS),
        Err(_) => UNIX_EPOCH,
    }
}

/// Epoch milliseconds as RFC 3339 with milliseconds, UTC.
pub fn rfc3339(ms: u64) -> String {
    format_time(UNIX_EPOCH + Duration::from_millis(ms.min(LAST_MS)))
}

/// RFC 3339 in whole seconds, UTC (what people write on the board).
pub fn rfc3339_seconds(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(writable(t)).to_string()
}

/// Milliseconds since the epoch of an RFC 3339 time (offsets and fractions taken); `None` for
/// a time before the epoch or text that is not one.
pub fn parse_ms(ts: &str) -> Option<u64> {
    parse_time(ts)?
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

/// RFC 3339 with milliseconds, UTC.
pub fn format_time(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(writable(t)).to_string()
}

/// An RFC 3339 time, also with the offsets Jira writes (`+0000`, `-05:30`); `None` for one
/// that cannot be written back (before the epoch, past year 9999, through its offset).
pub fn parse_time(s: &str) -> Option<SystemTime> {
    parse_any_time(s).filter(|t| writable(*t) == *t)
}

fn parse_any_time(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Some(t);
    }
    let t_at = s.find('T')?;
    let (base, offset) = match s[t_at..].rfind(['+', '-']) {
        Some(i) => s.split_at(t_at + i),
        None => (s.trim_end_matches('Z'), "Z"),
    };
    let utc = humantime::parse_rfc3339_weak(&format!("{base}Z")).ok()?;
    if offset == "Z" {
        return Some(utc);
    }
    let digits: String = offset[1..].chars().filter(|c| *c != ':').collect();
    if digits.len() != 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let minutes: u64 = digits[..2].parse::<u64>().ok()? * 60 + digits[2..].parse::<u64>().ok()?;
    let shift = Duration::from_secs(minutes * 60);
    // Local time = UTC + offset, so UTC = local - offset.
    if offset.starts_with('+') {
        utc.checked_sub(shift)
    } else {
        utc.checked_add(shift)
    }
}

/// A duration for people: `45 s`, `12 min 5 s`, `3 h 4 min`, `2 d 5 h`.
pub fn human(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_outside_what_rfc3339_writes_never_panic() {
        let before = UNIX_EPOCH - Duration::from_secs(86_400);
        assert_eq!(rfc3339_seconds(before), "1970-01-01T00:00:00Z");
        let after = UNIX_EPOCH + Duration::from_secs(400_000_000_000);
        assert_eq!(format_time(after), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59.999Z");
        // A Jira offset late on the last day would land in year 10000: not a time svc takes.
        assert_eq!(parse_time("9999-12-31T23:30:00.000-0500"), None);
        assert_eq!(parse_time("1970-01-01T00:00:00+05:00"), None);
        assert!(parse_time("2026-11-25T10:00:00.000-0500").is_some());
    }

    #[test]
    fn times_round_trip_and_durations_read_for_people() {
        assert_eq!(rfc3339(1_000), "1970-01-01T00:00:01.000Z");
        assert_eq!(parse_ms("1970-01-01T00:00:01.500Z"), Some(1_500));
        assert_eq!(parse_ms("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_ms("not a time"), None);
        assert_eq!(
            rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(1_999)),
            "1970-01-01T00:00:01Z"
        );
        assert_eq!(human(999), "0 s");
        assert_eq!(human(61_000), "1 min 1 s");
        assert_eq!(human(3_723_000), "1 h 2 min");
        assert_eq!(human(90_000_000), "1 d 1 h");
    }
}
