//! The `svc` binary's commands: doctor, flags, secrets and the report-only daemon.

mod common;

use common::*;

#[test]
fn doctor_passes_on_the_shipped_workflow() {
    let dir = TestDir::new("doctor-shipped");
    let r = run(svc(&dir).arg("doctor").arg(shipped_workflow()));
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(r.stdout.contains("ok       config"), "{}", r.stdout);
    assert!(r.stdout.contains("agent_bridge_demo"), "{}", r.stdout);
}

#[test]
fn doctor_reports_every_error_of_a_file_and_exits_1() {
    let dir = TestDir::new("doctor-bad");
    let wf = workflow(
        &dir,
        "polling:\n  interval_ms: soon\n  jitter: 5\nagent:\n  max_turns: 3",
    );
    let r = run(svc(&dir).arg("doctor").arg(&wf));
    assert_eq!(r.code, Some(1), "{}", r.all());
    for expected in [
        "polling.jitter is not supported",
        "tracker.kind is required",
        "polling.interval_ms must be a positive integer",
    ] {
        assert!(
            r.stdout.contains(expected),
            "missing {expected:?} in:\n{}",
            r.stdout
        );
    }
}

/// Without `tracker.kind` the rest of the section is still checked: the shared keys' type errors
/// and the features this build rejects come with the missing kind, from doctor and the daemon.
#[test]
fn every_error_shows_also_without_a_tracker_kind() {
    let dir = TestDir::new("no-kind");
    let wf = workflow(
        &dir,
        "tracker:\n  active_states: Todo\n  terminal_states: [1, 2]\n  dispatch:\n    bogus: 1\n",
    );
    let expected = [
        "tracker.kind is required",
        "tracker.active_states must be a list of strings",
        "tracker.terminal_states must be a list of strings",
        "tracker.dispatch.bogus is not supported",
    ];
    let doctor = run(svc(&dir).arg("doctor").arg(&wf));
    assert_eq!(doctor.code, Some(1), "{}", doctor.all());
    let daemon = run(svc(&dir).arg("--no-tui").arg(&wf));
    assert_ne!(daemon.code, Some(0), "{}", daemon.all());
    for (who, out) in [("doctor", doctor.stdout.clone()), ("daemon", daemon.all())] {
        for e in expected {
            assert!(out.contains(e), "{who}: missing {e:?} in:\n{out}");
        }
    }
}

#[test]
fn doctor_json_is_machine_readable() {
    let dir = TestDir::new("doctor-json");
    let wf = workflow(&dir, "tracker:\n  kind: memory\nagent_a:\n  command: x-acp");
    let r = run(svc(&dir).args(["doctor", "--json"]).arg(&wf));
    let body: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    let checks = body["checks"].as_array().unwrap();
    let dep = checks
        .iter()
        .find(|c| c["name"] == "config_deprecation_agent_a_command")
        .expect("deprecation check");
    assert_eq!(dep["status"], "warning");
    // The x-acp bridge is not installed: an error with a hint, and exit status 1.
    let bridge = checks
        .iter()
        .find(|c| c["name"] == "agent_bridge_agent_a")
        .unwrap();
    assert_eq!(bridge["status"], "error");
    assert!(bridge["hint"].is_string());
    assert_eq!(body["ok"], false);
    assert_eq!(r.code, Some(1));
}

#[test]
fn doctor_names_the_file_and_yaml_line() {
    let dir = TestDir::new("doctor-yaml");
    let wf = dir.write(
        "W.md",
        "---\ntracker:\n  kind: memory\n  active_states: [Todo\n---\nbody\n",
    );
    let r = run(svc(&dir).arg("doctor").arg(&wf));
    assert_eq!(r.code, Some(1));
    let wf_text = wf.display().to_string();
    assert!(
        r.stdout.contains(&format!("{wf_text}:")) && r.stdout.contains("line"),
        "{}",
        r.stdout
    );
    let r = run(svc(&dir).arg("doctor").arg(dir.join("missing.md")));
    assert_eq!(r.code, Some(1));
    assert!(
        r.stdout.contains("missing.md: workflow file not found"),
        "{}",
        r.stdout
    );
    let nofm = dir.write("plain.md", "# no front matter\n");
    let r = run(svc(&dir).arg("doctor").arg(&nofm));
    assert!(
        r.stdout.contains("missing YAML front matter"),
        "{}",
        r.stdout
    );
}

#[test]
fn workflow_path_comes_from_svc_workflow_then_cwd() {
    let dir = TestDir::new("doctor-env-path");
    dir.write("conf/W.md", "---\ntracker:\n  kind: memory\nagent:\n  kind: mine\nagents:\n  mine:\n    bridge_command: sh\n---\nx {{ issue.title }}\n");
    let r = run(svc(&dir).arg("doctor").env("SVC_WORKFLOW", "conf/W.md"));
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(r.stdout.contains("conf/W.md"), "{}", r.stdout);
    let r = run(svc(&dir).arg("doctor"));
    assert!(
        r.stdout.contains(&format!(
            "{}: workflow file not found",
            dir.join("WORKFLOW.md").display()
        )),
        "{}",
        r.stdout
    );
}

#[test]
fn unknown_flags_are_named_with_a_suggestion() {
    let dir = TestDir::new("flags");
    let r = run(svc(&dir).arg("--no-tuii"));
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr
            .contains("unknown flag --no-tuii; did you mean --no-tui?"),
        "{}",
        r.stderr
    );
    let r = run(svc(&dir).args(["runs", "--limt", "3"]));
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr
            .contains("svc runs: error: unknown flag --limt; did you mean --limit?"),
        "{}",
        r.stderr
    );
    let r = run(svc(&dir).arg("--version"));
    assert_eq!(
        r.stdout.trim(),
        format!("svc {}", env!("CARGO_PKG_VERSION"))
    );
    let r = run(svc(&dir).args(["doctor", "--help"]));
    assert_eq!(r.code, Some(0));
    assert!(r.stdout.contains("--json"));
}

#[test]
fn runs_without_a_port_fails_with_the_spec_message() {
    let dir = TestDir::new("runs-noport");
    workflow(&dir, "tracker:\n  kind: memory\nserver:\n  port: 0");
    let r = run(svc(&dir).arg("runs"));
    assert_ne!(r.code, Some(0));
    assert!(
        r.stderr.contains("No observability server port configured. Pass --port/--url or set server.port in WORKFLOW.md."),
        "{}",
        r.stderr
    );
}

fn fake_op(dir: &TestDir, script: &str) -> std::path::PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let op = dir.write("bin/op", &format!("#!/bin/sh\n{script}\n"));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&op, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

const OP_WORKFLOW: &str = "tracker:\n  kind: memory\nagent:\n  kind: mine\nagents:\n  mine:\n    bridge_command: sh\ntools:\n  tracker_a:\n    api_key: op://Vault/tracker/credential";

#[test]
fn op_references_without_the_cli_say_it_is_required() {
    let dir = TestDir::new("op-missing");
    let wf = workflow(&dir, OP_WORKFLOW);
    let r = run(svc(&dir).arg("doctor").arg(&wf));
    assert_eq!(r.code, Some(1));
    assert!(
        r.stdout.contains("1Password CLI (op) is required"),
        "{}",
        r.stdout
    );
}

#[test]
fn op_read_failure_names_the_reference() {
    let dir = TestDir::new("op-failing");
    let bin = fake_op(
        &dir,
        "case \"$1\" in --version) echo 2.30.0;; *) echo 'item not found' >&2; exit 1;; esac",
    );
    let wf = workflow(&dir, OP_WORKFLOW);
    let r = run(svc(&dir)
        .arg("doctor")
        .arg(&wf)
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display())));
    assert_eq!(r.code, Some(1));
    assert!(
        r.stdout
            .contains("Failed to resolve 1Password reference: op://Vault/tracker/credential"),
        "{}",
        r.stdout
    );
}

#[test]
fn op_read_success_resolves_and_never_prints_the_secret() {
    let dir = TestDir::new("op-ok");
    let secret = "op-planted-secret-5a1f";
    let bin = fake_op(
        &dir,
        &format!(
            "case \"$1\" in --version) echo 2.30.0;; read) [ \"$3\" = op://Vault/tracker/credential ] && printf '{secret}' || exit 1;; esac"
        ),
    );
    let wf = workflow(&dir, OP_WORKFLOW);
    let r = run(svc(&dir)
        .arg("doctor")
        .arg(&wf)
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display())));
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(r.stdout.contains("ok       op_cli"), "{}", r.stdout);
    assert!(!r.all().contains(secret));
}

#[test]
fn planted_secrets_never_reach_any_output() {
    let dir = TestDir::new("planted");
    let secret = "planted-secret-value-93e1";
    let wf = workflow(
        &dir,
        "tracker:\n  kind: tracker-b\n  base_url: $BASE\n  email: ops@example.com\n  api_key: $PLANTED\n  jql: 7\nagent_b:\n  command: 5",
    );
    for args in [vec!["doctor"], vec!["doctor", "--json"], vec![]] {
        let r = run(svc(&dir)
            .args(&args)
            .arg(&wf)
            .env("PLANTED", secret)
            .env("BASE", secret)
            .env("TRACKER_B_API_KEY", secret));
        assert!(!r.all().contains(secret), "{args:?} leaked:\n{}", r.all());
        assert!(
            r.all().contains("tracker.jql must be a string"),
            "{}",
            r.all()
        );
    }
}

#[test]
fn daemon_rejects_bad_memory_issue_json_at_start() {
    let dir = TestDir::new("daemon-memory");
    let wf = workflow(
        &dir,
        "tracker:\n  kind: memory\nagent:\n  kind: mine\nagents:\n  mine:\n    bridge_command: sh",
    );
    let r = run(svc(&dir)
        .arg("--no-tui")
        .arg(&wf)
        .env("SVC_MEMORY_TRACKER_ISSUES_JSON", "[{oops"));
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr
            .contains("SVC_MEMORY_TRACKER_ISSUES_JSON must be a JSON array of issue records"),
        "{}",
        r.stderr
    );
}

#[test]
fn daemon_prints_deprecations_at_start() {
    let dir = TestDir::new("daemon-deprecations");
    let wf = workflow(
        &dir,
        "tracker:\n  kind: local\n  path: board\nagent:\n  kind: mine\nagents:\n  mine:\n    bridge_command: sh\nserver:\n  port: 0",
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    d.wait_log(
        20,
        "provider options directly under tracker (path) are deprecated",
    );
}

#[test]
fn logs_root_puts_the_log_under_it() {
    let dir = TestDir::new("logs-root");
    let wf = workflow(
        &dir,
        "tracker:\n  kind: memory\nagent:\n  kind: mine\nagents:\n  mine:\n    bridge_command: sh\nserver:\n  port: 0",
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg("--logs-root")
        .arg(dir.join("logs"))
        .arg(&wf);
    let d = Daemon::start(cmd);
    d.wait_log(20, "started: workflow");
    let log = std::fs::read_to_string(dir.join("logs/log/svc.log"))
        .expect("the log file under --logs-root");
    assert!(log.contains("started: workflow"), "{log}");
}
