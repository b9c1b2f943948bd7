//! The `svc` binary's commands: doctor, flags, secrets and the report-only daemon.

mod common;

use common::*;
use std::process::Command;

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

/// A memory-tracker workflow with a bridge that exists, its own workspace root, and `extra`.
fn memory_workflow(dir: &TestDir, rel: &str, root: &str, extra: &str) -> std::path::PathBuf {
    dir.write(
        rel,
        &format!(
            "---\n{extra}tracker:\n  kind: memory\nworkspace:\n  root: {root}\nagent:\n  kind: mine\nagents:\n  mine:\n    bridge_command: sh\n---\nx {{{{ issue.title }}}}\n"
        ),
    )
}

/// `svc doctor DIR` checks every workflow of the directory: names and agreement first, then
/// each workflow's checks under a line naming it; several paths mix files and directories.
#[test]
fn doctor_checks_a_directory_of_workflows() {
    let dir = TestDir::new("doctor-dir");
    let api = memory_workflow(&dir, "flows/api.md", "ws/api", "server:\n  port: 4321\n");
    let web = memory_workflow(&dir, "flows/web.md", "ws/web", "");
    dir.write("flows/notes.txt", "not a workflow");
    let r = run(svc(&dir).args(["doctor", "flows"]));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let names = r.stdout.lines().find(|l| l.contains("workflow_names"));
    assert!(
        names.is_some_and(|l| l.starts_with("ok") && l.ends_with(" api, web")),
        "{}",
        r.stdout
    );
    for expected in [
        format!("workflow api ({})", api.display()),
        format!("workflow web ({})", web.display()),
    ] {
        assert!(
            r.stdout.contains(&expected),
            "missing {expected:?} in:\n{}",
            r.stdout
        );
    }
    assert_eq!(
        r.stdout.matches("ok       config").count(),
        2,
        "{}",
        r.stdout
    );
    let other = memory_workflow(&dir, "billing/WORKFLOW.md", "ws/billing", "");
    let r = run(svc(&dir).args(["doctor", "--json", "flows"]).arg(&other));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let body: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    let names: Vec<&str> = body["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "web", "billing"]);
    assert_eq!(body["ok"], true);
    // An empty directory is named, with what to do.
    std::fs::create_dir_all(dir.join("none")).unwrap();
    let r = run(svc(&dir).args(["doctor", "none"]));
    assert_eq!(r.code, Some(1), "{}", r.all());
    assert!(
        r.stdout.contains("no workflow files in this directory"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("add a *.md workflow"), "{}", r.stdout);
}

/// Two workflows that disagree on a daemon-wide key, share a name or share a workspace root
/// are refused by the doctor, with both files named.
#[test]
fn doctor_refuses_disagreeing_workflows_naming_both_files() {
    let dir = TestDir::new("doctor-disagree");
    let a = memory_workflow(&dir, "flows/a.md", "ws/a", "server:\n  port: 4321\n");
    let b = memory_workflow(&dir, "flows/b.md", "ws/b", "server:\n  port: 4322\n");
    let r = run(svc(&dir).args(["doctor", "flows"]));
    assert_eq!(r.code, Some(1), "{}", r.all());
    let line = r
        .stdout
        .lines()
        .find(|l| l.contains("daemon_wide"))
        .unwrap_or_default();
    assert!(line.starts_with("error"), "{}", r.stdout);
    for expected in [
        "server.port".to_string(),
        a.display().to_string(),
        b.display().to_string(),
    ] {
        assert!(
            line.contains(&expected),
            "missing {expected:?} in:\n{}",
            r.stdout
        );
    }

    let dupe = memory_workflow(
        &dir,
        "other/WORKFLOW.md",
        "ws/o",
        "name: a\nserver:\n  port: 4321\n",
    );
    let shared = memory_workflow(&dir, "c.md", "ws/a", "");
    for (other, says) in [
        (&dupe, "are both named workflow \"a\""),
        (&shared, "use one workspace root"),
    ] {
        let r = run(svc(&dir).arg("doctor").arg(&a).arg(other));
        assert_eq!(r.code, Some(1), "{}", r.all());
        let expected = format!("{} and {} {says}", a.display(), other.display());
        assert!(r.stdout.contains(&expected), "{}", r.stdout);
    }
}

/// A memory-tracker workflow whose agents are `agents` (YAML under `agents:`, indented by four)
/// and whose `agent.kind` is `one`; `extra` goes at the top of the front matter.
fn fallback_workflow(dir: &TestDir, agents: &str, extra: &str) -> std::path::PathBuf {
    dir.write(
        "WORKFLOW.md",
        &format!(
            "---\n{extra}tracker:\n  kind: memory\nworkspace:\n  root: ws\nagent:\n  kind: one\nagents:\n{agents}---\nx {{{{ issue.title }}}}\n"
        ),
    )
}

/// The doctor lines named `name`.
fn lines_named<'r>(r: &'r Run, name: &str) -> Vec<&'r str> {
    r.stdout
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(name))
        .collect()
}

/// A fallback list naming a kind with no record, or the kind itself, fails the load: doctor
/// names the key, the kind and what to list instead.
#[test]
fn doctor_names_an_unknown_or_own_fallback_kind() {
    let dir = TestDir::new("doctor-fallback-unknown");
    let wf = fallback_workflow(
        &dir,
        "    one:\n      bridge_command: sh\n      fallback: [two, ghost]\n    two:\n      bridge_command: sh\n      fallback: [two]\n",
        "",
    );
    let r = run(svc(&dir).arg("doctor").arg(&wf));
    assert_eq!(r.code, Some(1), "{}", r.all());
    let errors = lines_named(&r, "config");
    for expected in [
        "agents.one.fallback[1] names ghost, which has no agents.ghost record",
        "agents.two.fallback[0] names two itself",
    ] {
        assert!(
            errors
                .iter()
                .any(|l| l.starts_with("error") && l.contains(expected)),
            "missing {expected:?} in:\n{}",
            r.stdout
        );
    }
    assert!(
        r.stdout
            .contains("use agent_a, agent_b or a kind configured under agents:"),
        "{}",
        r.stdout
    );
}

/// Fallback lists that lead back to where they start are a warning, not a failure: a limited
/// kind's runs move once, along its own list only. Each cycle is named once, however many
/// kinds it has; lists that only go forward have none.
#[test]
fn doctor_warns_of_fallback_cycles_and_passes() {
    let dir = TestDir::new("doctor-fallback-cycle");
    let sh = |name: &str, fallback: &str| {
        format!("    {name}:\n      bridge_command: sh\n      fallback: [{fallback}]\n")
    };
    let cases = [
        // Two kinds standing in for each other.
        (
            format!("{}{}", sh("one", "two"), sh("two", "one")),
            vec!["one → two → one (agents.one.fallback[0] is two, agents.two.fallback[0] is one)"],
        ),
        // A longer ring, and a list that names it second.
        (
            format!(
                "{}{}{}",
                sh("one", "two"),
                sh("two", "agent_b, three"),
                sh("three", "one")
            ),
            vec![
                "one → two → three → one (agents.one.fallback[0] is two, agents.two.fallback[1] is three, agents.three.fallback[0] is one)",
            ],
        ),
        // Two rings through one kind.
        (
            format!(
                "{}{}{}",
                sh("one", "two, three"),
                sh("two", "one"),
                sh("three", "one")
            ),
            vec!["one → two → one", "one → three → one"],
        ),
    ];
    for (agents, cycles) in cases {
        let agents = format!("{agents}    agent_b:\n      bridge_command: sh\n");
        let wf = fallback_workflow(&dir, &agents, "");
        let r = run(svc(&dir).arg("doctor").arg(&wf));
        assert_eq!(r.code, Some(0), "{}", r.all());
        let warnings = lines_named(&r, "agent_fallback_cycle");
        assert_eq!(warnings.len(), cycles.len(), "{}", r.stdout);
        for (line, cycle) in warnings.iter().zip(&cycles) {
            assert!(line.starts_with("warning"), "{}", r.stdout);
            assert!(line.contains(cycle), "missing {cycle:?} in:\n{}", r.stdout);
            assert!(
                line.contains("a fallback's own list is not followed"),
                "{}",
                r.stdout
            );
        }
    }

    // Forward only: each list is named, no cycle.
    let agents = format!(
        "{}{}    three:\n      bridge_command: sh\n",
        sh("one", "two, three"),
        sh("two", "three")
    );
    let wf = fallback_workflow(&dir, &agents, "");
    let r = run(svc(&dir).args(["doctor", "--json"]).arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let body: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    let checks = body["checks"].as_array().unwrap();
    assert!(
        !checks.iter().any(|c| c["name"] == "agent_fallback_cycle"),
        "{}",
        r.stdout
    );
    let one = checks
        .iter()
        .find(|c| c["name"] == "agent_fallback_one")
        .expect("the line of one's list");
    assert_eq!(one["status"], "ok");
    assert!(
        one["message"]
            .as_str()
            .unwrap()
            .contains("its runs go to two, then three"),
        "{one}"
    );

    // A status override's lists are checked too, and named.
    let wf = fallback_workflow(
        &dir,
        &format!("{}    two:\n      bridge_command: sh\n", sh("one", "two")),
        "status_overrides:\n  review:\n    agents:\n      two:\n        fallback: [one]\n",
    );
    let r = run(svc(&dir).arg("doctor").arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let warnings = lines_named(&r, "agent_fallback_cycle");
    assert_eq!(warnings.len(), 1, "{}", r.stdout);
    assert!(
        warnings[0]
            .contains("status_overrides.review: the fallback lists form a cycle one → two → one"),
        "{}",
        r.stdout
    );
}

/// A fallback's bridge is checked like the main kind's, with the same severity, and its line
/// says whose runs it takes: a built-in record no one configured counts once a list names it.
#[test]
fn doctor_checks_the_bridge_of_each_fallback() {
    let dir = TestDir::new("doctor-fallback-bridge");
    let wf = fallback_workflow(
        &dir,
        "    one:\n      bridge_command: sh\n      fallback: [two, agent_a]\n    two:\n      bridge_command: no-such-acp --flag\n",
        "",
    );
    let r = run(svc(&dir).args(["doctor", "--json"]).arg(&wf));
    assert_eq!(r.code, Some(1), "{}", r.all());
    let body: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    let checks = body["checks"].as_array().unwrap();
    let check = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {}", r.stdout))
    };
    let main = check("agent_bridge_one");
    assert_eq!(main["status"], "ok");
    for (name, program) in [
        ("agent_bridge_two", "no-such-acp"),
        ("agent_bridge_agent_a", "agent-a-acp"),
    ] {
        let c = check(name);
        assert_eq!(c["status"], "error", "{c}");
        assert_eq!(
            c["message"],
            format!(
                "bridge command {program} not found on PATH (the fallback of one, runs move to it while that cools down)"
            ),
        );
        assert!(c["hint"].is_string(), "{c}");
    }
    // The built-in agent_a brings its CLI check along, as when it is the main kind.
    check("agent_cli_agent_a");

    // Installed: the ok line names the fallback too, and doctor passes.
    let wf = fallback_workflow(
        &dir,
        "    one:\n      bridge_command: sh\n      fallback: [two]\n    two:\n      bridge_command: sh\n",
        "",
    );
    let r = run(svc(&dir).arg("doctor").arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let two = lines_named(&r, "agent_bridge_two");
    assert!(
        two.len() == 1 && two[0].starts_with("ok") && two[0].contains("(the fallback of one,"),
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
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], format!("svc {}", env!("CARGO_PKG_VERSION")));
    assert!(
        lines[1].starts_with("commit: ") && lines[1].len() > 8,
        "{}",
        r.stdout
    );
    assert!(
        lines[2].starts_with("target: ") && lines[2].contains("-linux-"),
        "{}",
        r.stdout
    );
    assert!(lines[3].starts_with("libpq: "), "{}", r.stdout);
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

/// A board daemon with BOARD-1 running for a minute and BOARD-2 waiting for it, whose control
/// token is the file beside its lock (no `SVC_CONTROL_TOKEN`).
fn operator_daemon(dir: &TestDir) -> (Daemon, std::path::PathBuf) {
    let wf = board_workflow(
        dir,
        &[
            (
                "BOARD-1.md",
                "---\ntitle: Long one\nstate: Todo\n---\ndemo: keep-open\ndemo: slow 60000\n",
            ),
            (
                "BOARD-2.md",
                "---\ntitle: Waits\nstate: Todo\nblocked_by: [BOARD-1]\n---\n",
            ),
        ],
        "polling:\n  interval_ms: 30000\nagent:\n  kind: demo\n",
    );
    let mut cmd = svc(dir);
    cmd.arg("--no-tui").arg(&wf);
    (Daemon::start(cmd), wf)
}

/// The control token file of the daemon of this test's home (there is one).
fn token_file(dir: &TestDir) -> String {
    let daemon_dir = dir.join("home/.svc/daemon");
    let path = std::fs::read_dir(&daemon_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "token"))
        .expect("a token file beside the lock");
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

/// `svc status`, `svc refresh`, `svc open` and `svc stop` find the daemon of the workflow
/// from its lock file and its token from the file beside it; no daemon, a wrong token and a
/// daemon that does not answer each have a clear message and their own exit status.
#[test]
fn status_refresh_open_and_stop_act_on_the_running_daemon() {
    let dir = TestDir::new("operator");
    let wf = workflow_with_description(&dir, "tracker:\n  kind: memory\n");
    for command in ["status", "refresh", "stop", "open"] {
        let r = run(svc(&dir).arg(command).arg(&wf));
        assert_eq!(r.code, Some(3), "svc {command}: {}", r.all());
        assert!(
            r.stderr
                .contains(&format!("svc {command}: no svc daemon is running for")),
            "{}",
            r.all()
        );
    }
    let (mut d, wf) = operator_daemon(&dir);
    d.wait_for(30, "BOARD-1 running and BOARD-2 waiting", |s| {
        running_ids(s) == ["BOARD-1"]
            && !waiting_on_blockers(s).is_empty()
            && s["running"][0]["turn_count"] == 1
    });
    let base = base_url(&d);
    let pid = d.child.id();

    let r = run(svc(&dir).arg("status").arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    for part in [
        format!("daemon      pid {pid} on "),
        format!("url         {base}"),
        "(up ".into(),
        "heartbeat   ".into(),
        "next poll   in ".into(),
        "(every 30 s)".into(),
        "counts      running 1 · retrying 0 · blocked 0 · waiting 1".into(),
        "claim store sqlite".into(),
        "pool        none".into(),
        "running (1)\n  BOARD-1".into(),
        "waiting (1)\n  BOARD-2".into(),
        "blocked by BOARD-1 (Todo)".into(),
    ] {
        assert!(r.stdout.contains(&part), "{part:?} missing:\n{}", r.stdout);
    }
    let r = run(svc(&dir).args(["status", "--json"]).arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
    assert_eq!(v["daemons"][0]["url"], base.as_str());
    assert_eq!(v["daemons"][0]["daemon"]["pid"], pid);
    assert_eq!(v["daemons"][0]["state"]["counts"]["running"], 1);
    assert!(v["daemons"][0]["state"]["polling"]["interval_ms"] == 30000);

    // The token goes only into the URL's fragment.
    let token = token_file(&dir);
    let r = run(svc(&dir).args(["status", "--open"]).arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(
        r.stdout
            .contains(&format!("\nopen {base}/#token={token}\n")),
        "{}",
        r.stdout
    );
    let r = run(svc(&dir).arg("open").arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert_eq!(r.stdout, format!("{base}/#token={token}\n"));
    // A directory stands for its first workflow file by name.
    let r = run(svc(&dir).arg("open").arg(wf.parent().unwrap()));
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert_eq!(r.stdout, format!("{base}/#token={token}\n"));

    // A wrong token is refused, and never printed.
    for command in ["refresh", "stop", "open"] {
        let r = run(svc(&dir)
            .env("SVC_CONTROL_TOKEN", "not-the-token-4711")
            .arg(command)
            .arg(&wf));
        assert_eq!(r.code, Some(4), "svc {command}: {}", r.all());
        assert!(
            r.stderr.contains("refused the control token")
                && r.stderr.contains("SVC_CONTROL_TOKEN"),
            "{}",
            r.all()
        );
        assert!(!r.all().contains("4711"), "{}", r.all());
    }
    let r = run(svc(&dir)
        .env("SVC_CONTROL_TOKEN", "not-the-token-4711")
        .args(["status", "--open"])
        .arg(&wf));
    assert_eq!(r.code, Some(4), "{}", r.all());
    assert!(!r.all().contains("4711"), "{}", r.all());

    // A daemon that does not answer.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let r = run(svc(&dir)
        .args(["status", "--port", &port.to_string()])
        .arg(&wf));
    assert_eq!(r.code, Some(5), "{}", r.all());
    assert!(r.stderr.contains("does not answer"), "{}", r.all());

    // Refresh: the poll runs now (one every 30 s would not come by itself), so the next one is
    // due 30 s after it.
    let next_poll = || {
        let (_, _, body) = http("GET", &format!("{base}/api/v1/state"), &[], None);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["polling"]["next_poll_at"].as_str().map(str::to_string)
    };
    let before = next_poll().expect("no poll under way");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let r = run(svc(&dir).arg("refresh").arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(
        r.stdout
            .contains(&format!("{base}: poll and reconcile queued")),
        "{}",
        r.stdout
    );
    wait_until(10, "the refresh's poll", || {
        next_poll().is_some_and(|next| next > before)
    });

    // Stop: the command waits until the daemon has exited.
    let r = run(svc(&dir).arg("stop").arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(
        r.stdout
            .contains(&format!("stopped the daemon (pid {pid} at {base})")),
        "{}",
        r.stdout
    );
    assert_eq!(d.child.try_wait().unwrap().and_then(|s| s.code()), Some(0));
    assert_eq!(d.wait_exit(5), Some(0));
    let r = run(svc(&dir).arg("status").arg(&wf));
    assert_eq!(r.code, Some(3), "{}", r.all());
}

/// A refresh asked while a poll is under way joins it: the tracker here never answers, so the
/// first poll is still in flight when `svc refresh` asks.
#[test]
fn a_refresh_during_a_poll_is_coalesced_into_it() {
    let dir = TestDir::new("operator-coalesce");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    // Accepts and holds every connection without a word.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in silent.incoming().flatten() {
            held.push(c);
        }
    });
    let wf = workflow(
        &dir,
        &format!(
            "tracker:\n  kind: t\ntrackers:\n  t:\n    provider: tracker-a\n    endpoint: http://{addr}/graphql\n    api_key: k\n    project_slugs: [core]\npolling:\n  interval_ms: 600000\nworkspace:\n  root: ws\nagent:\n  kind: demo\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n"
        ),
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("SVC_TRACKER_TIMEOUT_MS", "20000");
    let d = Daemon::start(cmd);
    d.wait_for(20, "the first poll under way", |s| {
        s["polling"]["in_flight"] == true
    });
    for _ in 0..2 {
        let r = run(svc(&dir).arg("refresh").arg(&wf));
        assert_eq!(r.code, Some(0), "{}", r.all());
        assert!(
            r.stdout
                .contains("a poll is already under way; the refresh is coalesced into it"),
            "{}",
            r.stdout
        );
    }
    let r = run(svc(&dir).arg("status").arg(&wf));
    assert!(r.stdout.contains("next poll   polling now"), "{}", r.stdout);
    drop(d);
}

/// A daemon whose only agent kind met its limit: `svc status` lists the kind in a cooldowns
/// section, with its reset, how far off that is and the agent's words, and the issue waiting for
/// it says which kind and until when; before the limit there is no such section.
#[test]
fn status_lists_the_agent_kinds_cooling_down_and_the_issues_waiting_for_them() {
    let dir = TestDir::new("operator-limit");
    let (words, _) = limit_hours_off();
    let wf = limited_workflow(&dir, &words);
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    d.wait_for(20, "the daemon's state", |s| s["cooldowns"].is_array());
    let r = run(svc(&dir).arg("status").arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(
        r.stdout.contains("counts      running 0") && !r.stdout.contains("cooldowns ("),
        "no limit yet:\n{}",
        r.stdout
    );

    add_board_issue(&dir, "BOARD-1");
    d.wait_for(60, "agent_a cooling down", |s| {
        s["cooldowns"].as_array().is_some_and(|c| !c.is_empty())
    });
    add_board_issue(&dir, "BOARD-2");
    let s = d.wait_for(60, "BOARD-2 waiting for the limit", |s| {
        cooling_and_blocked(s, "BOARD-2")
    });
    let until = s["cooldowns"][0]["until"].as_str().unwrap().to_string();
    let r = run(svc(&dir).arg("status").arg(&wf));
    assert_eq!(r.code, Some(0), "{}", r.all());
    let section = r
        .stdout
        .split("\ncooldowns (1)\n")
        .nth(1)
        .unwrap_or_else(|| panic!("a cooldowns section:\n{}", r.stdout));
    let line = section.lines().next().unwrap();
    assert!(
        line.starts_with(&format!("  agent_a rate limited until {until}, in "))
            && line.contains(" h ")
            && line.ends_with(&format!("({words})")),
        "{}",
        r.stdout
    );
    let blocked = r
        .stdout
        .lines()
        .find(|l| l.starts_with("  BOARD-2 "))
        .unwrap_or_else(|| panic!("BOARD-2's row:\n{}", r.stdout));
    assert!(
        blocked.contains(&format!("agent rate limited: agent_a until {until}")),
        "{}",
        r.stdout
    );
}

/// Each command's flags as its `--help` shows them, for every command `svc --help` lists.
fn flags_by_command(dir: &TestDir) -> Vec<(String, Vec<String>)> {
    let top = run(svc(dir).arg("--help")).stdout;
    let commands = top
        .split("\nCommands:\n")
        .nth(1)
        .expect("svc --help lists its commands")
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string);
    let flags = |help: &str| -> Vec<String> {
        help.lines()
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .filter_map(|l| l.split_whitespace().next())
            .map(|f| format!("--{f}"))
            .collect()
    };
    let mut out = vec![(String::new(), flags(&top))];
    for c in commands.filter(|c| c != "demo-agent") {
        let help = run(svc(dir).args([c.as_str(), "--help"]));
        assert_eq!(help.code, Some(0), "{c} --help: {}", help.all());
        out.push((c, flags(&help.stdout)));
    }
    assert!(
        out.len() > 8 && out.iter().all(|(_, f)| !f.is_empty()),
        "{out:?}"
    );
    out
}

/// The completions of bash and fish, run in those shells, offer every flag each command's help
/// lists, zsh's parse, and the man page renders every flag: a flag the parser takes that they
/// missed would fail here (the parser refuses flags its table does not declare).
#[test]
fn completions_and_man_page_cover_every_flag() {
    let dir = TestDir::new("completions");
    let commands = flags_by_command(&dir);
    let bash = dir.write(
        "svc.bash",
        &run(svc(&dir).args(["completions", "bash"])).stdout,
    );
    let fish = dir.write(
        "svc.fish",
        &run(svc(&dir).args(["completions", "fish"])).stdout,
    );
    let zsh = dir.write("_svc", &run(svc(&dir).args(["completions", "zsh"])).stdout);
    let man = dir.write("svc.1", &run(svc(&dir).arg("man")).stdout);
    for (command, flags) in &commands {
        let line = format!("svc {command} --").replace("  ", " ");
        let words: Vec<&str> = line.split(' ').collect();
        let script = format!(
            "source {}; COMP_WORDS=({}); COMP_CWORD={}; _svc; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            bash.display(),
            words.join(" "),
            words.len() - 1
        );
        let offered = run(Command::new("bash").args(["-c", &script]));
        assert_eq!(offered.code, Some(0), "{}", offered.all());
        let by_fish = run(Command::new("fish").args([
            "-c",
            &format!("source {}; complete -C '{line}'", fish.display()),
        ]));
        assert_eq!(by_fish.code, Some(0), "{}", by_fish.all());
        for flag in flags {
            assert!(
                offered.stdout.lines().any(|l| l == flag),
                "bash: {line} does not offer {flag}: {}",
                offered.stdout
            );
            assert!(
                by_fish
                    .stdout
                    .lines()
                    .any(|l| l.split('\t').next() == Some(flag)),
                "fish: {line} does not offer {flag}: {}",
                by_fish.stdout
            );
        }
    }
    let checked = run(Command::new("zsh").args(["-n"]).arg(&zsh));
    assert_eq!(checked.code, Some(0), "zsh -n: {}", checked.all());
    let zsh_text = std::fs::read_to_string(&zsh).unwrap();
    // roff: groff warns about nothing, and the page as man shows it has every command and flag.
    let lint = run(Command::new("groff").args(["-ww", "-z", "-man"]).arg(&man));
    assert!(
        lint.code == Some(0) && lint.stderr.is_empty(),
        "{}",
        lint.all()
    );
    let page = run(Command::new("man")
        .arg("-l")
        .arg(&man)
        .env("MANWIDTH", "200")
        .env("PAGER", "cat"));
    assert_eq!(page.code, Some(0), "{}", page.all());
    for (command, flags) in &commands {
        // The command's subsection: from its heading ("   svc <command> ...") to the next one.
        let heading = if command.is_empty() {
            "   svc [".to_string()
        } else {
            format!("   svc {command}")
        };
        let section = page
            .stdout
            .split("\n")
            .skip_while(|l| {
                // (`svc stop` is not `svc store`.)
                let rest = l.strip_prefix(heading.as_str());
                !rest.is_some_and(|r| command.is_empty() || r.is_empty() || r.starts_with(' '))
            })
            .skip(1)
            .take_while(|l| {
                !l.starts_with("   svc ") && !l.starts_with(|c: char| c.is_alphabetic())
            })
            .collect::<Vec<_>>()
            .join("\n");
        for flag in flags {
            assert!(section.contains(flag.as_str()), "man: svc {command} {flag}");
            assert!(zsh_text.contains(&format!("'{flag}")), "zsh: {flag}");
        }
    }
}
