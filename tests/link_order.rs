//! The release binary's link order (`src/build.rs`, `assets/link-order.txt`) is written for the
//! code as it is. A list that fell behind costs no correctness, only memory (idle RSS up by half
//! in issue 40, found weeks later by a benchmark), so the test command checks it instead:
//! `scripts/link-order --check` compares the digest of the code the list was written for with
//! the code's, without a release build.

mod common;

use common::TestDir;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `scripts/link-order --check` over the source tree at `root`.
fn check(root: &Path) -> Output {
    Command::new("bash")
        .arg(repo().join("scripts/link-order"))
        .arg("--check")
        .arg(root)
        .output()
        .expect("running bash scripts/link-order --check")
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_link_order_is_written_for_this_code() {
    let out = check(&repo());
    assert!(
        out.status.success(),
        "assets/link-order.txt fell behind the code: {}",
        said(&out)
    );
}

/// Copies what the svc binary is built from (and the list) to a directory of its own.
fn copy_of_the_sources(dir: &TestDir) -> PathBuf {
    let root = dir.join("tree");
    std::fs::create_dir_all(root.join("assets")).unwrap();
    let copied = Command::new("cp")
        .arg("-r")
        .arg(repo().join("src"))
        .arg(repo().join("Cargo.toml"))
        .arg(repo().join("Cargo.lock"))
        .arg(&root)
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::copy(
        repo().join("assets/link-order.txt"),
        root.join("assets/link-order.txt"),
    )
    .unwrap();
    root
}

/// Appends `text` to the file `rel` under `root`.
fn append(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    let mut body = std::fs::read_to_string(&path).unwrap();
    body.push_str(text);
    std::fs::write(&path, body).unwrap();
}

/// Writes the copy's list as scripts/link-order does for the code as it is: its first line
/// names that code's digest (what `--check` says it is now).
fn write_list_for_the_code(root: &Path) {
    let text = said(&check(root));
    let digest: String = text
        .split("the code is now ")
        .nth(1)
        .or_else(|| text.split("is current (code ").nth(1))
        .unwrap_or_else(|| panic!("no digest in: {text}"))
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    let list = std::fs::read_to_string(root.join("assets/link-order.txt")).unwrap();
    let mut written = format!("# code {digest}: written by scripts/link-order\n");
    for name in list.lines().filter(|l| !l.starts_with('#')) {
        written.push_str(name);
        written.push('\n');
    }
    std::fs::write(root.join("assets/link-order.txt"), written).unwrap();
    let out = check(root);
    assert!(out.status.success(), "{}", said(&out));
}

fn assert_stale(root: &Path) {
    let out = check(root);
    let text = said(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("written for other code") && text.contains("bash scripts/link-order"),
        "{text}"
    );
}

#[test]
fn the_check_fails_once_the_code_changes_and_not_for_tests_alone() {
    let dir = TestDir::new("link-order");
    let root = copy_of_the_sources(&dir);
    write_list_for_the_code(&root);

    // Tests are not in the binary: a module compiled only for tests changes nothing.
    append(&root, "src/config/tests.rs", "\n// a test-only edit\n");
    append(&root, "src/bin/svc-bench.rs", "\n// another binary\n");
    let out = check(&root);
    assert!(out.status.success(), "{}", said(&out));

    // A function of the daemon changed: the list no longer names what start-up runs.
    append(&root, "src/daemon.rs", "\npub fn added_for_the_test() {}\n");
    assert_stale(&root);

    // A dependency's other version renames all of its functions (its crate hash).
    write_list_for_the_code(&root);
    append(&root, "Cargo.lock", "\n");
    assert_stale(&root);
}
