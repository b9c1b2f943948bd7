//! Build script: links the release binary with its start-up and hot code first.
//!
//! An idle daemon's resident memory was mostly code pages: the kernel maps the 64 KiB around
//! each page a process first touches, and the few thousand functions that start-up, an idle
//! daemon and a run execute lay scattered over the whole 9 MiB of code. `assets/link-order.txt`
//! (written by `scripts/link-order`, which records the functions executed in that scenario)
//! asks the linker to place them together, so they share pages. A name the build no longer has
//! is skipped without a warning: a stale list costs memory, never correctness. Its first line (a
//! comment, which the linker skips) names the code it was written for, and `tests/link_order.rs`
//! fails the test command once the code is other.
//!
//! It also hands `svc --version` the commit and the target it is built from (`SVC_COMMIT`,
//! `SVC_TARGET`); a build outside a git checkout may name its commit with `SVC_COMMIT`.

fn main() {
    build_facts();
    let list = "assets/link-order.txt";
    println!("cargo:rerun-if-changed={list}");
    println!("cargo:rerun-if-env-changed=SVC_LINK_ORDER");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    // Where Rust links with its own LLD by default; elsewhere (or when the build names its own
    // linker) the linker may not know the option.
    // (cargo sets RUSTC_LINKER when a linker is configured, as cargo-zigbuild does.)
    let lld = std::env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu")
        && !std::env::var("CARGO_ENCODED_RUSTFLAGS").is_ok_and(|f| f.contains("linker"))
        && std::env::var_os("RUSTC_LINKER").is_none();
    // `SVC_LINK_ORDER=0` turns it off (a linker that is not LLD chosen another way).
    let wanted = std::env::var("SVC_LINK_ORDER").map_or(true, |v| v != "0");
    if release && lld && wanted && std::path::Path::new(list).exists() {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
        println!("cargo:rustc-link-arg-bin=svc=-Wl,--symbol-ordering-file={dir}/{list}");
        println!("cargo:rustc-link-arg-bin=svc=-Wl,--no-warn-symbol-ordering");
    }
}

/// `SVC_COMMIT` (the checkout's commit, `unknown` outside git) and `SVC_TARGET` for `--version`.
fn build_facts() {
    println!("cargo:rerun-if-env-changed=SVC_COMMIT");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = std::env::var("SVC_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // A new commit builds again: HEAD and the branch it names are watched (the files that exist:
    // one that does not would run this script at every build).
    let mut watched = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        watched.push(format!("{dir}/HEAD"));
    }
    if let (Some(common), Some(reference)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ) {
        watched.push(format!("{common}/{reference}"));
        watched.push(format!("{common}/packed-refs"));
    }
    for file in watched.iter().filter(|f| std::path::Path::new(f).exists()) {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rustc-env=SVC_COMMIT={commit}");
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=SVC_TARGET={target}");
}
