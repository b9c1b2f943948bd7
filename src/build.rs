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

fn main() {
    let list = "assets/link-order.txt";
    println!("cargo:rerun-if-changed={list}");
    println!("cargo:rerun-if-env-changed=SVC_LINK_ORDER");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    // Where Rust links with its own LLD by default; elsewhere (or when the build names its own
    // linker) the linker may not know the option.
    let lld = std::env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu")
        && !std::env::var("CARGO_ENCODED_RUSTFLAGS").is_ok_and(|f| f.contains("linker"));
    // `SVC_LINK_ORDER=0` turns it off (a linker that is not LLD chosen another way).
    let wanted = std::env::var("SVC_LINK_ORDER").map_or(true, |v| v != "0");
    if release && lld && wanted && std::path::Path::new(list).exists() {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
        println!("cargo:rustc-link-arg-bin=svc=-Wl,--symbol-ordering-file={dir}/{list}");
        println!("cargo:rustc-link-arg-bin=svc=-Wl,--no-warn-symbol-ordering");
    }
}
