//! The README as a newcomer meets it: the two commands first, then a table of contents that
//! links every section (GitHub's heading anchors) and a "where next" for a team moving from the
//! demo to its own tracker; every link to a heading lands on one.

use std::collections::BTreeSet;

/// GitHub's anchor of a heading's text: lowercase, punctuation but `-` and `_` dropped, spaces
/// to `-`, a repeated anchor numbered `-1`, `-2`, ...
fn anchor(text: &str, seen: &mut BTreeSet<String>) -> String {
    let base: String = text
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect();
    let mut slug = base.clone();
    let mut n = 0;
    while seen.contains(&slug) {
        n += 1;
        slug = format!("{base}-{n}");
    }
    seen.insert(slug.clone());
    slug
}

/// The README's lines outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence {
            out.push((n + 1, line));
        }
    }
    out
}

#[test]
fn the_contents_link_every_section_and_every_link_lands() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let lines = prose(&text);
    let mut seen = BTreeSet::new();
    // (level, anchor) of every heading below the title.
    let headings: Vec<(usize, String)> = lines
        .iter()
        .filter_map(|(_, l)| {
            let level = l.chars().take_while(|c| *c == '#').count();
            (level > 0 && l[level..].starts_with(' '))
                .then(|| (level, anchor(&l[level..], &mut seen)))
        })
        .collect();
    let links: Vec<(usize, String)> = lines
        .iter()
        .flat_map(|(n, l)| {
            l.split("](#")
                .skip(1)
                .filter_map(|rest| rest.split(')').next())
                .map(|a| (*n, a.to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    let anchors: BTreeSet<&String> = headings.iter().map(|(_, a)| a).collect();
    for (n, a) in &links {
        assert!(anchors.contains(a), "README.md:{n}: #{a} is no heading");
    }
    // The contents come right after the two commands, before the next section.
    let line_of = |needle: &str| {
        text.lines()
            .position(|l| l.contains(needle))
            .map(|i| i + 1)
            .unwrap_or_else(|| panic!("README.md has no {needle:?}"))
    };
    let commands = line_of("bash scripts/test");
    let contents = line_of("**Contents**");
    assert!(commands < contents, "the Contents follow the two commands");
    let next_section = lines
        .iter()
        .find(|(n, l)| *n > contents && l.starts_with("## "))
        .map(|(n, _)| *n)
        .expect("sections after the Contents");
    let listed: BTreeSet<&String> = links
        .iter()
        .filter(|(n, _)| *n > contents && *n < next_section)
        .map(|(_, a)| a)
        .collect();
    for (level, a) in &headings {
        if *level == 2 || *level == 3 {
            assert!(listed.contains(a), "the Contents do not link #{a}");
        }
    }
    let where_next = &text[text.find("**Where next**").expect("a Where next")..];
    let items = where_next
        .lines()
        .skip(1)
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.starts_with("- "))
        .count();
    assert_eq!(items, 3, "three lines of where next");
}
