//! The crate's import graph, read from the source: every `crate::` and `super::` path in the
//! code of every file of `src/` (comments and unit tests left out) resolved to the file that
//! defines it. It has no circle, and
//! no tracker reaches the orchestrator by any path (ARCHITECTURE.md, "Architecture
//! invariants").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file (`src/tracker/chat_a/mod.rs` -> `tracker::chat_a`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The file that defines the longest prefix of `path` (a module path from the crate root).
fn resolve(files: &BTreeMap<Vec<String>, String>, path: &[String]) -> Option<String> {
    (1..=path.len())
        .rev()
        .find_map(|n| files.get(&path[..n]).cloned())
}

/// Expands a `use` tree or a path at the start of `text` (after `crate::` or `super::`):
/// `a::b`, `a::{b, c::{d}}`, `self`, into paths of names.
fn expand(text: &str) -> Vec<Vec<String>> {
    fn tree(chars: &[char], i: &mut usize) -> Vec<Vec<String>> {
        let mut prefix: Vec<String> = Vec::new();
        loop {
            while *i < chars.len() && chars[*i].is_whitespace() {
                *i += 1;
            }
            if *i < chars.len() && chars[*i] == '{' {
                *i += 1;
                let mut out = Vec::new();
                loop {
                    for mut sub in tree(chars, i) {
                        let mut p = prefix.clone();
                        p.append(&mut sub);
                        out.push(p);
                    }
                    while *i < chars.len() && chars[*i].is_whitespace() {
                        *i += 1;
                    }
                    match chars.get(*i) {
                        Some(',') => *i += 1,
                        Some('}') => {
                            *i += 1;
                            return out;
                        }
                        _ => return out,
                    }
                }
            }
            let start = *i;
            while *i < chars.len() && (chars[*i].is_alphanumeric() || chars[*i] == '_') {
                *i += 1;
            }
            if *i == start {
                return vec![prefix];
            }
            let name: String = chars[start..*i].iter().collect();
            if name != "self" {
                prefix.push(name);
            }
            if chars.get(*i) == Some(&':') && chars.get(*i + 1) == Some(&':') {
                *i += 2;
            } else {
                return vec![prefix];
            }
        }
    }
    let chars: Vec<char> = text.chars().take(4000).collect();
    tree(&chars, &mut 0)
}

/// A file's code: without its comments and its unit tests (from `#[cfg(test)]` on).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// File -> the files it imports.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut list = Vec::new();
    sources(&src, &mut list);
    list.retain(|f| {
        let name = f.file_name().unwrap().to_string_lossy();
        // A crate of its own (a patched dependency), not svc's modules.
        !f.starts_with(src.join("bin"))
            && !f.starts_with(src.join("vendor"))
            && !matches!(&*name, "main.rs" | "build.rs" | "tests.rs" | "testutil.rs")
            && !name.ends_with("_tests.rs")
    });
    let files: BTreeMap<Vec<String>, String> = list
        .iter()
        .map(|f| {
            let name = f.strip_prefix(&src).unwrap().display().to_string();
            (module_of(&src, f), name)
        })
        .collect();
    let mut out = BTreeMap::new();
    for (module, name) in &files {
        let text = code(&std::fs::read_to_string(src.join(name)).unwrap());
        let mut to = BTreeSet::new();
        for (at, _) in text.match_indices("crate::") {
            for path in expand(&text[at + "crate::".len()..]) {
                to.extend(resolve(&files, &path));
            }
        }
        // `super::` from a file: its module's parent (a `mod.rs` is its folder's module).
        for (at, _) in text.match_indices("super::") {
            let mut rest = &text[at..];
            let mut base = module.clone();
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            for path in expand(rest) {
                let mut full = base.clone();
                full.extend(path);
                to.extend(resolve(&files, &full));
            }
        }
        to.remove(name);
        out.insert(name.clone(), to);
    }
    out
}

/// Every file reachable from `from`.
fn reach(g: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeMap<String, String> {
    // Each file reached, with the file it was reached from (to print the path).
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut todo = vec![from.to_string()];
    while let Some(f) = todo.pop() {
        for t in g.get(&f).into_iter().flatten() {
            if !seen.contains_key(t) {
                seen.insert(t.clone(), f.clone());
                todo.push(t.clone());
            }
        }
    }
    seen
}

fn path_to(seen: &BTreeMap<String, String>, from: &str, to: &str) -> String {
    let mut path = vec![to.to_string()];
    let mut at = to.to_string();
    while at != from {
        at = seen[&at].clone();
        path.push(at.clone());
        if path.len() > 100 {
            break;
        }
    }
    path.reverse();
    path.join(" -> ")
}

#[test]
fn the_import_graph_has_no_circle() {
    let g = graph();
    assert!(g.len() > 50, "the source was read: {} files", g.len());
    for file in g.keys() {
        let seen = reach(&g, file);
        if let Some(last) = seen.get(file) {
            panic!("an import circle: {} -> {file}", path_to(&seen, file, last));
        }
    }
}

#[test]
fn no_tracker_reaches_the_orchestrator() {
    let g = graph();
    assert!(
        g["daemon.rs"].contains("orchestrator/runtime.rs")
            && g["tracker/local.rs"].contains("tracker/mod.rs"),
        "the graph reads `crate::` and `super::` paths"
    );
    for file in g.keys().filter(|f| f.starts_with("tracker/")) {
        let seen = reach(&g, file);
        if let Some(o) = seen.keys().find(|f| f.starts_with("orchestrator/")) {
            panic!(
                "a tracker reaches the orchestrator: {}",
                path_to(&seen, file, o)
            );
        }
    }
}
