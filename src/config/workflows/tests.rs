//! Several workflows: discovery in real directories, names, daemon-wide agreement, the fill, a
//! reload's check and distinct workspace roots.

use std::path::{Path, PathBuf};

use super::*;

/// A fresh directory under the system's temporary directory, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!(
            "svc-workflows-{name}-{}-{}",
            std::process::id(),
            crate::random::random_token()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn write(&self, rel: &str, yaml: &str) -> PathBuf {
        let path = self.0.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("---\n{yaml}---\nWork on it.\n")).unwrap();
        path
    }

    fn env(&self) -> Env {
        Env::from_pairs([("HOME", "/home/u")], &self.0)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MEMORY: &str = "tracker:\n  kind: memory\n";

fn paths(found: &[Found]) -> Vec<PathBuf> {
    found.iter().map(|f| f.path.clone()).collect()
}

#[test]
fn no_path_is_the_default_workflow() {
    let d = Dir::new("default");
    let found = discover(&[], &d.env()).unwrap();
    assert_eq!(paths(&found), [d.0.join("WORKFLOW.md")]);
    let env = Env::from_pairs([("SVC_WORKFLOW", "conf/W.md")], &d.0);
    assert_eq!(
        paths(&discover(&[], &env).unwrap()),
        [d.0.join("conf/W.md")]
    );
}

#[test]
fn a_directory_gives_its_md_files_sorted_skipping_hidden_and_non_files() {
    let d = Dir::new("dir");
    d.write("flows/b.md", MEMORY);
    d.write("flows/a.md", MEMORY);
    d.write("flows/.hidden.md", MEMORY);
    d.write("flows/notes.txt", MEMORY);
    d.write("flows/sub.md/inner.md", MEMORY);
    let found = discover(&["flows".into()], &d.env()).unwrap();
    assert_eq!(
        paths(&found),
        [d.0.join("flows/a.md"), d.0.join("flows/b.md")]
    );
    assert!(found.iter().all(|f| f.in_dir));
    // Files and directories mix, in command-line order.
    let one = d.write("one.md", MEMORY);
    let found = discover(&[one.clone(), "flows".into()], &d.env()).unwrap();
    assert_eq!(
        found[0],
        Found {
            path: one,
            in_dir: false
        }
    );
    assert_eq!(found.len(), 3);
}

#[test]
fn an_empty_directory_is_an_error_naming_it() {
    let d = Dir::new("empty");
    std::fs::create_dir_all(d.0.join("none")).unwrap();
    d.write("none/readme.txt", "");
    let e = discover(&["none".into()], &d.env()).unwrap_err();
    assert_eq!(
        e.message,
        format!(
            "{}: no workflow files in this directory",
            d.0.join("none").display()
        )
    );
    assert!(e.hint.unwrap().contains("add a *.md workflow"));
}

#[test]
fn the_same_file_twice_is_refused() {
    let d = Dir::new("twice");
    let a = d.write("flows/a.md", MEMORY);
    let e = discover(&[a.clone(), "flows".into()], &d.env()).unwrap_err();
    assert!(e.message.contains("given twice"), "{}", e.message);
    assert!(e.message.contains(&a.display().to_string()));
    let e = discover(
        &["flows/a.md".into(), "flows/../flows/a.md".into()],
        &d.env(),
    )
    .unwrap_err();
    assert!(e.message.contains("given twice"), "{}", e.message);
}

#[test]
fn names_come_from_stem_folder_or_name_key() {
    let d = Dir::new("names");
    d.write("flows/api.md", MEMORY);
    d.write("flows/web.md", &format!("name: frontend\n{MEMORY}"));
    let repo = d.write("billing/WORKFLOW.md", MEMORY);
    let other = d.write("ops.v2.md", MEMORY);
    let sources = sources(&["flows".into(), repo.clone(), other.clone()], &d.env()).unwrap();
    let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["api", "frontend", "billing", "ops.v2"]);
    assert_eq!(sources[2].path, repo);
    // In a directory, a WORKFLOW.md is named by its stem.
    d.write("dir2/WORKFLOW.md", MEMORY);
    let s = sources_of(&d, &["dir2"]);
    assert_eq!(s[0].name, "WORKFLOW");
}

fn sources_of(d: &Dir, args: &[&str]) -> Vec<Source> {
    let args: Vec<PathBuf> = args.iter().map(PathBuf::from).collect();
    sources(&args, &d.env()).unwrap()
}

#[test]
fn two_workflows_with_one_name_are_refused_with_both_paths() {
    let d = Dir::new("dupe");
    let a = d.write("flows/api.md", MEMORY);
    let b = d.write("other/WORKFLOW.md", &format!("name: api\n{MEMORY}"));
    let e = sources(&["flows".into(), b.clone()], &d.env()).unwrap_err();
    assert_eq!(
        e.message,
        format!(
            "{} and {} are both named workflow \"api\"",
            a.display(),
            b.display()
        )
    );
    assert!(e.hint.unwrap().contains("set a different name:"));
}

#[test]
fn invalid_names_name_the_file_and_the_rule() {
    let d = Dir::new("invalid");
    d.write("flows/b.md", MEMORY);
    // An explicit name, then an implicit one (with several workflows).
    for (rel, yaml, says) in [
        (
            "flows/a.md",
            "name: \"my flow\"\n",
            "\"my flow\" (from its name: key)",
        ),
        ("flows/-x.md", "", "\"-x\" (from its file or folder name)"),
    ] {
        let bad = d.write(rel, &format!("{yaml}{MEMORY}"));
        let e = sources(&["flows".into()], &d.env()).unwrap_err();
        let expected = format!("{}: workflow name {says} is not valid", bad.display());
        assert!(e.message.starts_with(&expected), "{}", e.message);
        assert!(e.message.ends_with(NAME_RULE), "{}", e.message);
        std::fs::remove_file(&bad).unwrap();
    }
    // A name that is not a string.
    let e = sources(&[d.write("n.md", &format!("name: 5\n{MEMORY}"))], &d.env()).unwrap_err();
    assert!(
        e.message.ends_with("name must be a string"),
        "{}",
        e.message
    );
}

#[test]
fn a_single_workflow_is_never_refused_for_its_folder_name() {
    let d = Dir::new("single");
    let path = d.write("my repo/WORKFLOW.md", MEMORY);
    let s = sources(&[path], &d.env()).unwrap();
    assert_eq!(s[0].name, "my-repo");
    assert!(valid_name(&s[0].name));
}

#[test]
fn the_name_rule() {
    for ok in ["a", "A1", "9", "api.v2", "my_flow-2"] {
        assert!(valid_name(ok), "{ok}");
    }
    for bad in ["", "-a", ".a", "_a", "a b", "a:b", "a/b", "é"] {
        assert!(!valid_name(bad), "{bad}");
    }
}

#[test]
fn control_clients_use_a_directorys_first_workflow() {
    let d = Dir::new("control");
    d.write("flows/b.md", MEMORY);
    d.write("flows/a.md", MEMORY);
    let env = d.env();
    assert_eq!(
        control_path(Some(Path::new("flows")), &env).unwrap(),
        d.0.join("flows/a.md")
    );
    assert_eq!(
        control_path(Some(Path::new("x.md")), &env).unwrap(),
        d.0.join("x.md")
    );
    std::fs::create_dir_all(d.0.join("empty")).unwrap();
    let e = control_path(Some(Path::new("empty")), &env).unwrap_err();
    assert!(e.message.contains("no workflow files"), "{}", e.message);
}

fn file(path: &str, yaml: &str) -> WorkflowFile {
    workflow::parse(Path::new(path), &format!("---\n{yaml}---\n")).unwrap()
}

#[test]
fn agreeing_files_are_filled_with_each_others_daemon_wide_keys() {
    let mut files = vec![
        file(
            "/w/a.md",
            "server:\n  port: 5000\nlogging:\n  log_file: /l/svc.log\n",
        ),
        file(
            "/w/b.md",
            "server:\n  port: 5000\n  host: 0.0.0.0\ndaemon:\n  max_concurrent_agents: 3\n",
        ),
        file("/w/c.md", "tracker:\n  kind: memory\n"),
    ];
    let wide = agree(&mut files).unwrap();
    assert!(!wide.is_empty());
    for f in &files {
        let fm = &f.front_matter;
        assert_eq!(
            fm["server"]["port"].as_i64(),
            Some(5000),
            "{}",
            f.path.display()
        );
        assert_eq!(fm["server"]["host"].as_str(), Some("0.0.0.0"));
        assert_eq!(fm["logging"]["log_file"].as_str(), Some("/l/svc.log"));
        assert_eq!(fm["daemon"]["max_concurrent_agents"].as_i64(), Some(3));
    }
    assert_eq!(
        files[2].front_matter["tracker"]["kind"].as_str(),
        Some("memory")
    );
}

#[test]
fn a_disagreement_names_both_files_the_key_and_both_values() {
    let mut files = vec![
        file("/w/a.md", "server:\n  port: 5000\n"),
        file("/w/b.md", "server:\n  host: h\n"),
        file("/w/c.md", "server:\n  port: 5001\n"),
    ];
    let e = agree(&mut files).unwrap_err();
    assert_eq!(
        e.message,
        "server.port differs between workflows: /w/a.md sets 5000, /w/c.md sets 5001"
    );
    assert!(e.hint.unwrap().contains("give the key one value"));
    // Either way round; keys compare in snake_case.
    let e = DaemonWide::from_files(&[
        file("/w/c.md", "server:\n  mcpPort: 7\n"),
        file("/w/a.md", "server:\n  mcp_port: 8\n"),
    ])
    .unwrap_err();
    assert_eq!(
        e.message,
        "server.mcp_port differs between workflows: /w/c.md sets 7, /w/a.md sets 8"
    );
}

#[test]
fn secret_looking_values_are_never_shown() {
    let e = DaemonWide::from_files(&[
        file("/w/a.md", "daemon:\n  api_token: hunter2\n"),
        file("/w/b.md", "daemon:\n  api_token: swordfish\n"),
    ])
    .unwrap_err();
    assert!(e.message.contains("daemon.api_token"), "{}", e.message);
    assert!(!e.message.contains("hunter2") && !e.message.contains("swordfish"));
    assert!(e.message.contains("(hidden)"));
}

#[test]
fn a_reload_is_checked_against_the_others_and_filled() {
    let others = DaemonWide::from_files(&[
        file("/w/a.md", "server:\n  port: 5000\n"),
        file("/w/b.md", "observability:\n  refresh_ms: 250\n"),
    ])
    .unwrap();
    let mut ok = file("/w/c.md", "server:\n  port: 5000\n");
    others.check_and_fill(&mut ok).unwrap();
    assert_eq!(
        ok.front_matter["observability"]["refresh_ms"].as_i64(),
        Some(250)
    );
    let mut bad = file("/w/c.md", "observability:\n  refresh_ms: 100\n");
    let e = others.check_and_fill(&mut bad).unwrap_err();
    assert_eq!(
        e.message,
        "observability.refresh_ms differs between workflows: /w/b.md sets 250, /w/c.md sets 100"
    );
}

#[test]
fn load_shared_reports_a_disagreement_as_a_load_error_and_fills_settings() {
    let d = Dir::new("shared");
    let others = DaemonWide::from_files(&[file(
        "/w/a.md",
        "server:\n  port: 5000\ndaemon:\n  daily_budget_usd: 20\n",
    )])
    .unwrap();
    let env = d.env();
    let mut secrets = SecretResolver::new(crate::process::run_program);
    let path = d.write("c.md", MEMORY);
    let loaded = load_shared(&path, &env, &mut secrets, &others).unwrap();
    assert_eq!(loaded.settings.server.port, 5000);
    assert_eq!(loaded.settings.daemon.daily_budget_usd, Some(20.0));
    let path = d.write("c.md", &format!("{MEMORY}server:\n  port: 6000\n"));
    let Err(LoadError::Invalid {
        path: p, errors, ..
    }) = load_shared(&path, &env, &mut secrets, &others)
    else {
        panic!("a disagreement loads")
    };
    assert_eq!(p, path);
    assert!(
        errors[0].message.starts_with("server.port differs"),
        "{errors:?}"
    );
}

fn settings(d: &Dir, rel: &str, yaml: &str) -> (Source, Settings) {
    let path = d.write(rel, &format!("{MEMORY}{yaml}"));
    let mut secrets = SecretResolver::new(crate::process::run_program);
    let loaded = super::super::load(&path, &d.env(), &mut secrets).unwrap();
    let name = rel.trim_end_matches(".md").to_string();
    (Source { name, path }, loaded.settings)
}

#[test]
fn two_workflows_on_one_workspace_root_are_refused() {
    let d = Dir::new("roots");
    let a = settings(&d, "a.md", "workspace:\n  root: ws/a\n");
    let b = settings(&d, "b.md", "workspace:\n  root: ws/b\n");
    let c = settings(&d, "c.md", "workspace:\n  root: ws/a/\n");
    distinct_roots([(&a.0, &a.1), (&b.0, &b.1)]).unwrap();
    let e = distinct_roots([(&a.0, &a.1), (&b.0, &b.1), (&c.0, &c.1)]).unwrap_err();
    assert_eq!(
        e.message,
        format!(
            "{} and {} use one workspace root, {}",
            a.0.path.display(),
            c.0.path.display(),
            d.0.join("ws/a").display()
        )
    );
    assert!(e.hint.unwrap().contains("its own workspace.root"));
}
