//! The prompt template: the Markdown body of `WORKFLOW.md`, rendered as strict Liquid with the
//! issue record and the attempt number. An unknown variable or filter is an error naming it.
//!
//! Part of the workflow contract, so it lives in `config` and knows no tracker: it renders any
//! record that serializes (the run hands it a `tracker::Issue`).

use std::fmt;

use serde::Serialize;

/// A parsed template, ready to render for any issue.
pub struct Template {
    inner: liquid::Template,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError(String);

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TemplateError {}

fn describe(err: liquid::Error) -> TemplateError {
    // Liquid's messages span lines ("liquid: Unknown variable\n  with:\n    requested=..."); keep
    // them on one line so log lines and doctor output stay readable.
    let text = err.to_string();
    let one_line: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "with:" && *l != "from: {{%")
        .collect();
    TemplateError(
        one_line
            .join("; ")
            .trim_start_matches("liquid: ")
            .to_string(),
    )
}

/// Block tags (`if`, `for`, ... and `elsif` branches) a template may use in all. liquid parses,
/// renders and drops nested blocks and `elsif` chains recursively, so a template nesting
/// thousands of them overflowed the stack of the thread loading the workflow.
pub const MAX_BLOCK_TAGS: usize = 100;
/// `[` index brackets a template may use in all: liquid's parser recurses per nested `a[b[...]]`
/// and panics when it runs short of stack.
pub const MAX_INDEX_BRACKETS: usize = 256;
/// `and`/`or` words one tag may hold: a condition is a chain of boxes, dropped recursively.
pub const MAX_CONDITION_WORDS: usize = 500;

const BLOCKS: &[&str] = &[
    "if",
    "elsif",
    "unless",
    "for",
    "case",
    "capture",
    "comment",
    "raw",
    "tablerow",
    "ifchanged",
];

/// Rejects templates whose nesting liquid would recurse too deeply on. The counts are upper
/// bounds of liquid's depth whatever the template's strings hold: every block tag and every
/// index bracket counts, nested or not.
fn check_nesting(text: &str) -> Result<(), TemplateError> {
    let b = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut blocks = 0;
    let mut brackets = 0;
    for i in 0..b.len() {
        if b[i..].starts_with(b"{%") {
            let mut j = i + 2;
            if b.get(j) == Some(&b'-') {
                j += 1;
            }
            while b.get(j).is_some_and(u8::is_ascii_whitespace) {
                j += 1;
            }
            let end = (j..b.len()).find(|&k| !ident(b[k])).unwrap_or(b.len());
            if BLOCKS.iter().any(|name| name.as_bytes() == &b[j..end]) {
                blocks += 1;
            }
        }
        if b[i] == b'[' && i > 0 && (ident(b[i - 1]) || matches!(b[i - 1], b'-' | b']')) {
            brackets += 1;
        }
    }
    if blocks > MAX_BLOCK_TAGS {
        return Err(TemplateError(format!(
            "too many block tags ({blocks}; at most {MAX_BLOCK_TAGS} if, for, case, elsif, ...)"
        )));
    }
    if brackets > MAX_INDEX_BRACKETS {
        return Err(TemplateError(format!(
            "too many index brackets ({brackets}; at most {MAX_INDEX_BRACKETS})"
        )));
    }
    if longest_condition(b) > MAX_CONDITION_WORDS {
        return Err(TemplateError(format!(
            "a tag has more than {MAX_CONDITION_WORDS} and/or conditions"
        )));
    }
    Ok(())
}

/// An upper bound of the `and`/`or` words in any one tag: every stretch liquid could read as a
/// tag (from a `{%` to the first `%}` outside quotes) is scanned, quoted strings skipped. The
/// scans in progress are merged by quote state, so this is one pass.
fn longest_condition(b: &[u8]) -> usize {
    // Per quote state (outside, in '...', in "..."): the most words any scan in it has counted.
    let mut scans: [Option<usize>; 3] = [None; 3];
    let mut longest = 0;
    for i in 0..b.len() {
        if b[i..].starts_with(b"{%") {
            scans[0] = Some(scans[0].unwrap_or(0));
        }
        let mut next: [Option<usize>; 3] = [None; 3];
        for (state, count) in scans.iter().enumerate() {
            let Some(count) = *count else { continue };
            let (state, count) = match (state, b[i]) {
                (0, _) if b[i..].starts_with(b"%}") => continue,
                (0, b'\'') => (1, count),
                (0, b'"') => (2, count),
                (0, _) if b[i..].starts_with(b"and") || b[i..].starts_with(b"or") => (0, count + 1),
                (1, b'\'') | (2, b'"') => (0, count),
                (state, _) => (state, count),
            };
            next[state] = Some(next[state].map_or(count, |c: usize| c.max(count)));
            longest = longest.max(count);
        }
        scans = next;
    }
    longest
}

impl Template {
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        check_nesting(text)?;
        let parser = liquid::ParserBuilder::with_stdlib()
            .build()
            .map_err(describe)?;
        parser
            .parse(text)
            .map(|inner| Template { inner })
            .map_err(describe)
    }

    /// Renders for `issue` (the normalized issue record); `attempt` is `None` on the first run;
    /// `slot` is the ensemble slot and size (`(0, 1)` outside ensemble mode).
    pub fn render(
        &self,
        issue: &impl Serialize,
        attempt: Option<u32>,
        slot: (u32, u32),
    ) -> Result<String, TemplateError> {
        self.render_after(issue, attempt, slot, None)
    }

    /// [`Template::render`] for a run that follows one that met a rate limit on another
    /// agent kind: `previous_attempt` is `{kind, reason, at}` (else nil).
    pub fn render_after(
        &self,
        issue: &impl Serialize,
        attempt: Option<u32>,
        slot: (u32, u32),
        previous_attempt: Option<serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let issue_value = serde_json::to_value(issue).map_err(|e| TemplateError(e.to_string()))?;
        let globals = liquid::object!({
            "issue": issue_value,
            "attempt": attempt,
            "slot_index": slot.0,
            "ensemble_size": slot.1,
            "previous_attempt": previous_attempt,
        });
        self.inner.render(&globals).map_err(describe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracker::Issue;

    fn issue() -> Issue {
        Issue {
            id: "id-1".into(),
            identifier: "ENG-1".into(),
            title: "Fix login".into(),
            description: Some("Steps".into()),
            state: "Todo".into(),
            state_type: Some("unstarted".into()),
            labels: vec!["bug".into(), "Svc:Backend".into()],
            url: Some("https://example.test/ENG-1".into()),
            created_at: Some("2026-11-01T00:00:00Z".into()),
            updated_at: None,
            priority: Some(2),
            blocked_by: Vec::new(),
        }
    }

    #[test]
    fn renders_issue_fields_and_attempt() {
        let t = Template::parse(
            "{{ issue.identifier }}: {{ issue.title }} [{{ issue.state }}/{{ issue.stateType }}] {{ issue.labels | join: ',' }}{% if attempt %} retry {{ attempt }}{% endif %}",
        )
        .unwrap();
        assert_eq!(
            t.render(&issue(), None, (0, 1)).unwrap(),
            "ENG-1: Fix login [Todo/unstarted] bug,Svc:Backend"
        );
        assert_eq!(
            t.render(&issue(), Some(2), (0, 1)).unwrap(),
            "ENG-1: Fix login [Todo/unstarted] bug,Svc:Backend retry 2"
        );
    }

    #[test]
    fn unknown_variable_is_an_error_naming_it() {
        let t = Template::parse("{{ issue.nope }}").unwrap();
        let err = t.render(&issue(), None, (0, 1)).unwrap_err();
        assert!(err.0.contains("nope"), "{err}");
        let t = Template::parse("{{ ticket.title }}").unwrap();
        assert!(
            t.render(&issue(), None, (0, 1))
                .unwrap_err()
                .0
                .contains("ticket")
        );
    }

    #[test]
    fn unknown_filter_is_a_parse_error_naming_it() {
        let err = Template::parse("{{ issue.title | shout }}").err().unwrap();
        assert!(err.0.contains("shout"), "{err}");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let nested = |n: usize| format!("{}x{}", "{% if a %}".repeat(n), "{% endif %}".repeat(n));
        assert!(Template::parse(&nested(MAX_BLOCK_TAGS)).is_ok());
        let err = Template::parse(&nested(5_000)).err().unwrap();
        assert!(err.0.contains("too many block tags"), "{err}");
        let elsif = format!(
            "{{% if a %}}{}{{% endif %}}",
            "{%- elsif a %}".repeat(5_000)
        );
        assert!(Template::parse(&elsif).is_err());
        let index = format!("{{{{ {}1{} }}}}", "a[".repeat(10_000), "]".repeat(10_000));
        let err = Template::parse(&index).err().unwrap();
        assert!(err.0.contains("index brackets"), "{err}");
        let chain = format!("{{% if a{} %}}x{{% endif %}}", " and a".repeat(50_000));
        let err = Template::parse(&chain).err().unwrap();
        assert!(err.0.contains("and/or"), "{err}");
        // A `%}` inside a string does not end the tag.
        let hidden = format!("{{% if '%}}'{} %}}x{{% endif %}}", " or a".repeat(600));
        assert!(Template::parse(&hidden).is_err());
        // Prose with many "and"s and Markdown brackets is fine.
        let prose = "Read [the docs](x) and [more] or less, and then more.\n".repeat(300);
        assert!(Template::parse(&prose).is_ok());
    }

    #[test]
    fn blockers_render_as_issue_blocked_by() {
        let t = Template::parse(
            "{% for b in issue.blockedBy %}{{ b.identifier }} ({{ b.state }}, {{ b.id }}) {% endfor %}",
        )
        .unwrap();
        let mut i = issue();
        assert_eq!(t.render(&i, None, (0, 1)).unwrap(), "");
        i.blocked_by.push(crate::tracker::Blocker {
            id: "id-2".into(),
            identifier: "ENG-2".into(),
            state: "In Progress".into(),
        });
        assert_eq!(
            t.render(&i, None, (0, 1)).unwrap(),
            "ENG-2 (In Progress, id-2) "
        );
    }

    #[test]
    fn unset_optional_fields_render_empty() {
        let t = Template::parse("[{{ issue.updatedAt }}]").unwrap();
        assert_eq!(t.render(&issue(), None, (0, 1)).unwrap(), "[]");
    }
}
