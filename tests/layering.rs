//! The crate's import graph, read from the source: every `crate::` and `super::` path in the
//! code of every file of `src/` (comments and unit tests left out) resolved to the file that
//! defines it. It has no circle, of files or of folders, and it keeps every layering rule of
//! ARCHITECTURE.md ("Architecture invariants"): the table [`RULES`], one line a rule.

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

/// A set of files, by their paths under `src/`.
#[derive(Clone, Copy)]
enum Files {
    /// This file.
    File(&'static str),
    /// Every file under this folder (`"tracker/"`).
    Folder(&'static str),
    /// Any of these.
    AnyOf(&'static [Files]),
    /// Every file but these.
    AllBut(&'static [Files]),
}

impl Files {
    fn has(self, file: &str) -> bool {
        match self {
            Files::File(f) => file == f,
            Files::Folder(d) => file.starts_with(d),
            Files::AnyOf(list) => list.iter().any(|f| f.has(file)),
            Files::AllBut(list) => !list.iter().any(|f| f.has(file)),
        }
    }
}

use Files::{AllBut, AnyOf, File, Folder};

/// How far a rule looks from each of its files: its own imports, or everything they lead to.
#[derive(Clone, Copy, PartialEq)]
enum Reach {
    Imports,
    Paths,
}

/// "`from` never imports (or never reaches, by any path) `to`", and why.
struct Rule {
    name: &'static str,
    from: Files,
    to: Files,
    reach: Reach,
}

/// The modules that are threads, or run their loops: the state machine and the claim store
/// use none of them.
const THREADS: Files = AnyOf(&[
    File("daemon.rs"),
    File("tui.rs"),
    Folder("http/"),
    File("orchestrator/runtime.rs"),
    File("orchestrator/poller.rs"),
    File("agent/run.rs"),
    File("agent/pipes.rs"),
    File("workers/service.rs"),
    File("trace/watcher.rs"),
    File("tracker/chat_a/socket.rs"),
    File("tracker/chat_b/gateway.rs"),
]);

/// The state machine: the pure `(state, event, now) -> effects` function and what it decides
/// with.
const STATE_MACHINE: Files = AnyOf(&[
    File("orchestrator/state.rs"),
    Folder("orchestrator/state/"),
    File("orchestrator/dispatch.rs"),
    File("orchestrator/inbox.rs"),
    File("orchestrator/ledger.rs"),
]);

/// The worker pool's drivers (they may use `workers/mod.rs` and `workers/ssh.rs` of the pool).
const DRIVERS: Files = AnyOf(&[
    File("workers/docker.rs"),
    File("workers/sdk.rs"),
    File("workers/fake.rs"),
    File("workers/static_ssh.rs"),
    File("workers/tunnel.rs"),
]);

/// What may use the orchestrator beyond its protocol: the commands and views above it.
const ABOVE_ORCHESTRATOR: Files = AnyOf(&[
    Folder("orchestrator/"),
    Folder("cli/"),
    Folder("http/"),
    File("daemon.rs"),
    File("tui.rs"),
    File("doctor.rs"),
    File("fuzzing.rs"),
    File("runs_client.rs"),
    File("control_client.rs"),
]);

const RULES: &[Rule] = &[
    Rule {
        name: "config is a leaf: it uses only env and its own files",
        from: Folder("config/"),
        to: AllBut(&[Folder("config/"), File("env.rs")]),
        reach: Reach::Imports,
    },
    Rule {
        name: "time is a leaf",
        from: File("time.rs"),
        to: AllBut(&[]),
        reach: Reach::Imports,
    },
    Rule {
        name: "steering is a leaf below the trackers: it uses only time and random",
        from: File("steering.rs"),
        to: AllBut(&[File("time.rs"), File("random.rs")]),
        reach: Reach::Imports,
    },
    Rule {
        name: "no tracker reaches the orchestrator",
        from: Folder("tracker/"),
        to: Folder("orchestrator/"),
        reach: Reach::Paths,
    },
    Rule {
        name: "the worker pool never reaches the orchestrator",
        from: Folder("workers/"),
        to: Folder("orchestrator/"),
        reach: Reach::Paths,
    },
    Rule {
        name: "inside the pool, a driver uses only workers/mod.rs and workers/ssh.rs",
        from: DRIVERS,
        to: AllBut(&[
            File("workers/mod.rs"),
            File("workers/ssh.rs"),
            AllBut(&[Folder("workers/")]),
        ]),
        reach: Reach::Imports,
    },
    Rule {
        name: "the pool's thread is above its drivers, never below",
        from: AnyOf(&[DRIVERS, File("workers/mod.rs"), File("workers/pool.rs")]),
        to: File("workers/service.rs"),
        reach: Reach::Paths,
    },
    Rule {
        name: "the state machine reaches no thread module",
        from: STATE_MACHINE,
        to: THREADS,
        reach: Reach::Paths,
    },
    Rule {
        name: "the protocol is below the state machine",
        from: File("orchestrator/protocol.rs"),
        to: AnyOf(&[STATE_MACHINE, THREADS, Folder("orchestrator/store/")]),
        reach: Reach::Paths,
    },
    Rule {
        name: "the claim store never reaches the state machine or the state thread",
        from: Folder("orchestrator/store/"),
        to: AnyOf(&[
            File("orchestrator/state.rs"),
            File("orchestrator/dispatch.rs"),
            File("orchestrator/runtime.rs"),
        ]),
        reach: Reach::Paths,
    },
    Rule {
        name: "the claim store imports no tracker (the records it keeps come in the protocol)",
        from: Folder("orchestrator/store/"),
        to: Folder("tracker/"),
        reach: Reach::Imports,
    },
    Rule {
        name: "below the commands and views, the orchestrator is used only through its protocol",
        from: AllBut(&[ABOVE_ORCHESTRATOR]),
        to: AllBut(&[
            File("orchestrator/protocol.rs"),
            AllBut(&[Folder("orchestrator/")]),
        ]),
        reach: Reach::Imports,
    },
    Rule {
        name: "a run thread talks to the state thread only in the protocol",
        from: Folder("agent/"),
        to: AllBut(&[
            File("orchestrator/protocol.rs"),
            AllBut(&[Folder("orchestrator/")]),
        ]),
        reach: Reach::Paths,
    },
    Rule {
        name: "the bridge reader is below the ACP client",
        from: File("agent/pipes.rs"),
        to: File("agent/acp.rs"),
        reach: Reach::Paths,
    },
    Rule {
        name: "mcp::tools is below the packs and names none",
        from: File("mcp/tools.rs"),
        to: AnyOf(&[
            File("mcp/chat.rs"),
            File("mcp/chat_a.rs"),
            File("mcp/chat_b.rs"),
            File("mcp/github.rs"),
            File("mcp/gitlab.rs"),
            File("mcp/packs.rs"),
        ]),
        reach: Reach::Paths,
    },
    Rule {
        name: "no pack imports the registry of packs",
        from: AnyOf(&[
            File("mcp/chat.rs"),
            File("mcp/chat_a.rs"),
            File("mcp/chat_b.rs"),
            File("mcp/github.rs"),
            File("mcp/gitlab.rs"),
        ]),
        to: File("mcp/packs.rs"),
        reach: Reach::Paths,
    },
    Rule {
        name: "the commands sit above what they check: nothing but cli uses doctor",
        from: AllBut(&[Folder("cli/"), File("doctor.rs")]),
        to: File("doctor.rs"),
        reach: Reach::Imports,
    },
];

/// The rules `g` breaks, each with the path that breaks it.
fn broken(g: &BTreeMap<String, BTreeSet<String>>, rules: &[Rule]) -> Vec<String> {
    let mut out = Vec::new();
    for rule in rules {
        for file in g.keys().filter(|f| rule.from.has(f)) {
            let hit = match rule.reach {
                Reach::Imports => g[file]
                    .iter()
                    .find(|t| rule.to.has(t))
                    .map(|t| format!("{file} -> {t}")),
                Reach::Paths => {
                    let seen = reach(g, file);
                    seen.keys()
                        .find(|t| rule.to.has(t))
                        .map(|t| path_to(&seen, file, t))
                }
            };
            if let Some(path) = hit {
                out.push(format!("{}: {path}", rule.name));
            }
        }
    }
    out
}

/// The folders whose files lead out of them and back in: `(folder, path)`. The protocol
/// module stands apart from its folder: it is the one way in from below.
fn folder_circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let apart = |f: &str| f == "orchestrator/protocol.rs";
    let mut folders: BTreeSet<String> = BTreeSet::new();
    for file in g.keys() {
        let mut at = 0;
        while let Some(i) = file[at..].find('/') {
            at += i + 1;
            folders.insert(file[..at].to_string());
        }
    }
    let mut out = Vec::new();
    for folder in &folders {
        let inside = |f: &str| f.starts_with(folder.as_str()) && !apart(f);
        'files: for file in g.keys().filter(|f| inside(f)) {
            for next in g[file].iter().filter(|t| !inside(t)) {
                // Out of the folder: does any path from there, staying out, come back?
                let mut seen: BTreeMap<String, String> = BTreeMap::new();
                let mut todo = vec![next.clone()];
                while let Some(f) = todo.pop() {
                    for t in &g[&f] {
                        if inside(t) {
                            let mut path = vec![t.clone(), f.clone()];
                            let mut at = f.clone();
                            while let Some(prev) = seen.get(&at) {
                                path.push(prev.clone());
                                at = prev.clone();
                            }
                            path.push(file.clone());
                            path.reverse();
                            out.push(format!("{folder}: {}", path.join(" -> ")));
                            break 'files;
                        }
                        if !seen.contains_key(t) && t != next {
                            seen.insert(t.clone(), f.clone());
                            todo.push(t.clone());
                        }
                    }
                }
            }
        }
    }
    out
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
fn no_folder_is_left_and_entered_again() {
    let circles = folder_circles(&graph());
    assert!(
        circles.is_empty(),
        "import circles of folders:\n{}",
        circles.join("\n")
    );
}

#[test]
fn every_layering_rule_holds() {
    let g = graph();
    assert!(
        g["daemon.rs"].contains("orchestrator/runtime.rs")
            && g["tracker/local.rs"].contains("tracker/mod.rs"),
        "the graph reads `crate::` and `super::` paths"
    );
    let broken = broken(&g, RULES);
    assert!(
        broken.is_empty(),
        "layering rules broken:\n{}",
        broken.join("\n")
    );
}

/// Each rule can fail: an import it forbids, added to the real graph, breaks that rule.
#[test]
fn each_rule_notices_an_import_it_forbids() {
    let g = graph();
    for rule in RULES {
        let from = g.keys().find(|f| rule.from.has(f)).expect(rule.name);
        let to = g
            .keys()
            .find(|t| rule.to.has(t) && *t != from)
            .expect(rule.name);
        let mut bad = g.clone();
        bad.get_mut(from).unwrap().insert(to.clone());
        let found = broken(&bad, std::slice::from_ref(rule));
        assert!(
            !found.is_empty(),
            "{} did not notice {from} -> {to}",
            rule.name
        );
    }
    let mut bad = g.clone();
    bad.get_mut("tracker/mod.rs")
        .unwrap()
        .insert("workers/mod.rs".into());
    bad.get_mut("workers/mod.rs")
        .unwrap()
        .insert("tracker/memory.rs".into());
    assert!(
        !folder_circles(&bad).is_empty(),
        "a circle of folders goes unnoticed"
    );
}
