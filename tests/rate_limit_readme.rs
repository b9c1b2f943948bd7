//! README's "Rate limits and fallback" held against the code: its numbered list of default
//! patterns is `DEFAULT_RATE_LIMIT_PATTERNS`, in order; every real message its table quotes
//! matches the pattern its row names, and so the defaults, with a reset time read exactly where
//! the row says one is; the messages it quotes as not limits match no default.

use svc::agent::limit::{Patterns, from_message, reset_time};
use svc::config::DEFAULT_RATE_LIMIT_PATTERNS;
use svc::time::Millis;

/// When a row gives no date to read it at: 2026-11-28T12:00:00Z. A reset given as a clock time
/// alone is the next one to come, so any time will do for those rows.
const NOW: Millis = 1_795_867_200_000;

const SECTION: &str = "## Rate limits and fallback";

/// The README's section, from its heading to the next section of its level.
fn section() -> String {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = text
        .lines()
        .position(|l| l.trim_end() == SECTION)
        .unwrap_or_else(|| panic!("README.md has no {SECTION:?}"));
    text.lines()
        .skip(start + 1)
        .take_while(|l| !l.starts_with("## "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The inside of a cell that is one code span, with GitHub's table escape `\|` undone.
fn code_span(cell: &str) -> Option<String> {
    let inner = cell.trim().strip_prefix('`')?.strip_suffix('`')?;
    (!inner.is_empty() && !inner.contains('`')).then(|| inner.replace("\\|", "|"))
}

/// A table row's cells: split on the pipes that are not escaped, the outer ones dropped.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut out = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                out.last_mut().unwrap().push_str("\\|");
                chars.next();
            }
            '|' => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The body rows of the table whose header is `header`, as maps from column to cell.
fn table(section: &str, header: &[&str]) -> Vec<Vec<(String, String)>> {
    let lines: Vec<&str> = section.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with('|') && cells(l) == header)
        .unwrap_or_else(|| panic!("{SECTION} has no table headed {header:?}"));
    lines[at + 2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let row = cells(l);
            assert_eq!(row.len(), header.len(), "a row of {header:?}: {l}");
            header.iter().map(|h| h.to_string()).zip(row).collect()
        })
        .collect()
}

fn cell<'r>(row: &'r [(String, String)], column: &str) -> &'r str {
    &row.iter().find(|(c, _)| c == column).unwrap().1
}

/// The numbered list whose items are each one code span: the default patterns.
fn pattern_list(section: &str) -> Vec<String> {
    section
        .lines()
        .filter_map(|l| {
            let (n, rest) = l.split_once(". ")?;
            n.parse::<usize>().ok()?;
            code_span(rest)
        })
        .collect()
}

fn defaults() -> Vec<String> {
    DEFAULT_RATE_LIMIT_PATTERNS
        .iter()
        .map(|p| p.to_string())
        .collect()
}

/// When a row's reset is read: "yes, as of 2025-08-19" is that day's start (UTC): the message
/// said a date or an epoch then ahead; plain "yes" is [`NOW`].
fn read_at(reset: &str) -> Millis {
    match reset.strip_prefix("yes, as of ") {
        Some(day) => format!("{day}T00:00:00Z")
            .parse::<jiff::Timestamp>()
            .unwrap_or_else(|e| panic!("{reset:?}: {e}"))
            .as_millisecond() as Millis,
        None => NOW,
    }
}

#[test]
fn the_listed_patterns_are_the_defaults_in_order() {
    assert_eq!(pattern_list(&section()), defaults());
}

#[test]
fn every_quoted_message_matches_its_pattern_and_gives_the_reset_the_table_says() {
    let section = section();
    let rows = table(&section, &["Pattern", "Message", "Reset", "Source"]);
    let defaults = defaults();
    let all = Patterns::new(&defaults);
    let mut shown = vec![false; defaults.len()];
    for row in &rows {
        let message = code_span(cell(row, "Message"))
            .unwrap_or_else(|| panic!("a message in backticks: {row:?}"));
        let n: usize = cell(row, "Pattern").parse().expect("a pattern number");
        let pattern = defaults
            .get(n.wrapping_sub(1))
            .unwrap_or_else(|| panic!("no pattern {n}: {row:?}"));
        assert!(
            Patterns::new(std::slice::from_ref(pattern)).matches(&message),
            "pattern {n} ({pattern}) misses {message:?}"
        );
        shown[n - 1] = true;
        let reset = cell(row, "Reset");
        let now = read_at(reset);
        let limit = from_message(&message, &all, now)
            .unwrap_or_else(|| panic!("the defaults miss {message:?}"));
        assert!(!cell(row, "Source").is_empty(), "a source: {row:?}");
        match reset {
            "no" => {
                assert_eq!(reset_time(&message, now), None, "{message:?}");
                assert_eq!(limit.reset_at, None, "{message:?}");
            }
            r if r.starts_with("yes") => {
                let at = reset_time(&message, now)
                    .unwrap_or_else(|| panic!("no reset read in {message:?}"));
                assert!(at > now, "{message:?}: {at} is not after {now}");
                assert_eq!(limit.reset_at, Some(at), "{message:?}");
            }
            other => panic!("Reset is yes, yes, as of <date>, or no, not {other:?}"),
        }
    }
    for (n, shown) in shown.iter().enumerate() {
        assert!(shown, "no quoted message for pattern {}", n + 1);
    }
}

#[test]
fn messages_quoted_as_no_limit_match_no_default() {
    let section = section();
    let rows = table(&section, &["Not a limit", "Source"]);
    assert!(!rows.is_empty());
    let all = Patterns::new(&defaults());
    for row in &rows {
        let message = code_span(cell(row, "Not a limit"))
            .unwrap_or_else(|| panic!("a message in backticks: {row:?}"));
        assert!(
            from_message(&message, &all, NOW).is_none(),
            "a default takes {message:?} for a limit"
        );
    }
}
