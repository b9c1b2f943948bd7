//! Helpers for tests that run the real `svc` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A temporary directory removed on drop.
pub struct TestDir {
    pub path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("svc-test-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TestDir { path }
    }

    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

pub fn svc_bin() -> &'static str {
    env!("CARGO_BIN_EXE_svc")
}

/// `svc` with a clean environment: HOME and the working directory in `dir`, a PATH without
/// any agent tools, and none of the caller's tracker variables.
pub fn svc(dir: &TestDir) -> Command {
    let mut cmd = Command::new(svc_bin());
    cmd.env_clear()
        .env("HOME", dir.join("home"))
        .env("PATH", "/usr/bin:/bin")
        .env("TMPDIR", dir.join("tmp"))
        .current_dir(&dir.path);
    std::fs::create_dir_all(dir.join("home")).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    cmd
}

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

pub fn run(cmd: &mut Command) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("svc runs");
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into(),
        stderr: String::from_utf8_lossy(&stderr).into(),
    }
}

/// The repository's shipped WORKFLOW.md.
pub fn shipped_workflow() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("WORKFLOW.md")
}

/// A workflow file with the given front matter and a one-line prompt.
pub fn workflow(dir: &TestDir, front_matter: &str) -> PathBuf {
    dir.write(
        "WORKFLOW.md",
        &format!(
            "---\n{front_matter}\n---\nWork on {{{{ issue.identifier }}}}: {{{{ issue.title }}}}\n"
        ),
    )
}
