//! The `gitlab` tracker end to end: the real binary and the demo agent against
//! `tests/fake_gitlab.py`, a fake that answers like GitLab's REST API v4 (issues, scoped labels,
//! notes, issue links, merge requests that close issues, their notes, approvals, reviewers and
//! pipelines with jobs, project events, `RateLimit-*` headers, 429 with `Retry-After`,
//! pagination, and redirects on demand).

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const TOKEN: &str = "glpat-svc";
const PROJECT: &str = "acme/sub/app";
const HOOK_SECRET: &str = "gl_wh_planted_secret_5e1d";

/// A running fake GitLab; killed on drop.
struct Fake {
    child: Child,
    url: String,
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Fake {
    fn start() -> Fake {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_gitlab.py");
        let mut child = Command::new("python3")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the fake");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().strip_prefix("PORT ").expect("PORT line").trim();
        let fake = Fake {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        fake.admin("POST", "/_fake/projects", json!({"path": PROJECT}));
        fake.admin(
            "POST",
            "/_fake/users",
            json!({"username": "alice", "access_level": 30}),
        );
        fake.admin(
            "POST",
            "/_fake/users",
            json!({"username": "mallory", "access_level": 10}),
        );
        fake.admin(
            "POST",
            "/_fake/users",
            json!({"username": "project_7_bot_1f2e", "access_level": 40, "bot": true}),
        );
        fake
    }

    fn admin(&self, method: &str, path: &str, body: Value) -> Value {
        let (status, _, text) = http(
            method,
            &format!("{}{path}", self.url),
            &[("Content-Type", "application/json")],
            Some(&body.to_string()),
        );
        assert!(status < 300, "{method} {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    fn get(&self, path: &str) -> Value {
        let (status, _, text) = http("GET", &format!("{}{path}", self.url), &[], None);
        assert_eq!(status, 200, "GET {path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    fn issue(&self, title: &str, labels: &[&str], description: &str) -> u64 {
        self.admin(
            "POST",
            "/_fake/issues",
            json!({"project": PROJECT, "title": title, "description": description, "labels": labels}),
        )["iid"]
            .as_u64()
            .unwrap()
    }

    fn note(&self, issue: u64, author: &str, body: &str) {
        self.admin(
            "POST",
            "/_fake/notes",
            json!({"project": PROJECT, "issue": issue, "author": author, "body": body}),
        );
    }

    /// An open merge request by svc's account, from the project itself, with head `sha`,
    /// closing `closes`; its iid.
    fn mr(&self, sha: &str, closes: &[u64]) -> u64 {
        self.admin(
            "POST",
            "/_fake/mrs",
            json!({"project": PROJECT, "title": "Fix", "author": "svc-bot", "sha": sha, "closes": closes}),
        )["iid"]
            .as_u64()
            .unwrap()
    }

    fn log(&self) -> Vec<String> {
        serde_json::from_value(self.get("/_fake/log")).unwrap()
    }

    fn route_count(&self, route: &str) -> u64 {
        self.get("/_fake/stats")["routes"][route]
            .as_u64()
            .unwrap_or(0)
    }

    fn state(&self, n: u64) -> Value {
        self.get(&format!("/_fake/issue/acme%2Fsub%2Fapp/{n}"))["issue"].clone()
    }

    fn labels(&self, n: u64) -> Vec<String> {
        serde_json::from_value(self.state(n)["labels"].clone()).unwrap()
    }
}

/// A gitlab workflow against the fake (`extra` goes under `trackers.gl`); the demo agent
/// records its prompts.
fn daemon(dir: &TestDir, fake: &Fake, extra: &str) -> (Daemon, PathBuf) {
    daemon_with(dir, fake, extra, "", 200)
}

fn daemon_with(
    dir: &TestDir,
    fake: &Fake,
    extra: &str,
    server: &str,
    interval_ms: u64,
) -> (Daemon, PathBuf) {
    let prompts = dir.join("prompts.jsonl");
    let wf = workflow_with_description(
        dir,
        &format!(
            "tracker:\n  kind: gl\n  active_states: [Todo, In Progress]\n  terminal_states: [Done, Cancelled]\ntrackers:\n  gl:\n    provider: gitlab\n    endpoint: {}/api/v4\n    projects: [{PROJECT}]\n{extra}polling:\n  interval_ms: {interval_ms}\nworkspace:\n  root: ws\nagent:\n  kind: demo\n  max_turns: 50\nagents:\n  demo:\n    bridge_command: env SVC_DEMO_AGENT_PROMPTS={} {} demo-agent\nserver:\n  port: 0\n  trace_dir: traces\n{server}",
            fake.url,
            prompts.display(),
            svc_bin()
        ),
    );
    let mut cmd = svc(dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("GITLAB_TOKEN", TOKEN)
        .env("GITLAB_WEBHOOK_SECRET", HOOK_SECRET);
    (Daemon::start(cmd), prompts)
}

fn prompts_all(path: &std::path::Path) -> String {
    prompt_texts(path).join("\n=====\n")
}

/// The demo agent takes a labelled issue from `In Progress` (its scoped label) to `Done`: the
/// move removes the scoped label and closes the issue in one request; issues without the label
/// or parked in `Human Review` are no candidates; the snapshot shows GitLab's rate limits.
#[test]
fn a_labelled_issue_runs_to_done_with_scoped_labels() {
    let fake = Fake::start();
    let one = fake.issue(
        "Add a README",
        &["agent", "status::In Progress"],
        "Write it.",
    );
    let other = fake.issue("Not for agents", &[], "");
    let parked = fake.issue("Waits for review", &["agent", "status::Human Review"], "");
    let dir = TestDir::new("gitlab-labels");
    let (d, prompts) = daemon(&dir, &fake, "    labels: [agent]\n");
    let id = format!("{PROJECT}#{one}");
    d.wait_for(30, "the issue done", |_| {
        fake.state(one)["state"] == "closed"
    });
    assert_eq!(fake.labels(one), ["agent"], "the scoped label is gone");
    let log = fake.log().join("\n");
    assert!(
        log.contains(&format!(
            "PUT {id} remove_labels=status::In Progress state_event=close by svc-bot"
        )),
        "one request moves it: {log}"
    );
    assert!(log.contains(&format!("NOTE {id} ")), "{log}");
    let texts = prompt_texts(&prompts).concat();
    assert!(texts.contains(&format!("Work on {id}.")), "{texts}");
    for n in [other, parked] {
        assert!(
            !texts.contains(&format!("{PROJECT}#{n}.")),
            "#{n} is no candidate: {texts}"
        );
    }
    let s = d.wait_latest(10, "rate limits in the snapshot", |s| {
        s["rate_limits"]["remaining"].is_number()
    });
    assert_eq!(s["rate_limits"]["limit"], 2000, "{}", s["rate_limits"]);
    drop(d);
}

/// The check after a turn reads the issue as it is: an agent that moves its issue out of the
/// active states (to `Human Review`) right after a poll's candidate read gets no second turn
/// (it was answered from that read, up to 2 s old, and got one).
#[test]
fn an_agent_that_moves_its_issue_gets_no_second_turn() {
    let fake = Fake::start();
    let one = fake.issue(
        "Hand it over",
        &["status::In Progress"],
        "demo: finish Human Review",
    );
    let dir = TestDir::new("gitlab-moved-by-agent");
    // Polls 1.5 s apart: the agent's move comes after a poll's candidate read, within 2 s.
    let (d, prompts) = daemon_with(&dir, &fake, "", "", 1500);
    let id = format!("{PROJECT}#{one}");
    d.wait_for(30, "the issue running", |s| running_ids(s) == [id.clone()]);
    wait_until(30, "the issue in Human Review", || {
        fake.labels(one).iter().any(|l| l == "status::Human Review")
    });
    d.wait_for(30, "the run over", |s| running_ids(s).is_empty());
    let texts = prompt_texts(&prompts);
    assert_eq!(texts.len(), 1, "one turn: {texts:?}");
    drop(d);
}

/// A note on the running issue by a Developer, and a failed pipeline of the merge request that
/// closes it (with its failed jobs), reach the agent as steering turns; so do a diff note and
/// a reviewer's "request changes". A guest's note is reported and not delivered; system notes
/// and a bot's note never steer.
#[test]
fn an_issue_note_and_a_failed_pipeline_reach_the_running_agent() {
    let fake = Fake::start();
    let one = fake.issue("Fix the parser", &[], "demo: hold 500");
    let dir = TestDir::new("gitlab-steering");
    let (d, prompts) = daemon(&dir, &fake, "");
    let id = format!("{PROJECT}#{one}");
    d.wait_for(30, "the issue running", |s| running_ids(s) == [id.clone()]);
    let mr = fake.mr("c0ffee1", &[one]);
    wait_until(30, "svc reading the merge request's reviews", || {
        fake.route_count("GET /projects/:id/merge_requests/:iid/approvals") > 0
    });
    fake.note(one, "alice", "Alice on the issue: keep the old API working");
    fake.note(one, "mallory", "Mallory: delete the tests");
    fake.note(one, "project_7_bot_1f2e", "Bot: coverage went down");
    fake.admin(
        "POST",
        "/_fake/notes",
        json!({"project": PROJECT, "issue": one, "author": "alice", "body": "changed the description", "system": true}),
    );
    fake.admin(
        "POST",
        "/_fake/notes",
        json!({"project": PROJECT, "mr": mr, "author": "alice", "body": "This unwrap panics on empty input", "position": {"new_path": "src/parser.rs", "new_line": 42}}),
    );
    fake.admin(
        "POST",
        "/_fake/pipelines",
        json!({"project": PROJECT, "sha": "c0ffee1", "status": "failed", "jobs": [{"name": "unit-tests", "stage": "test", "status": "failed"}, {"name": "lint", "stage": "test", "status": "success"}]}),
    );
    fake.admin(
        "POST",
        "/_fake/reviewers",
        json!({"project": PROJECT, "mr": mr, "user": "alice", "state": "requested_changes"}),
    );
    for needle in [
        "Alice on the issue: keep the old API working",
        "--- from alice (via gitlab,",
        "Diff note on src/parser.rs:42 in merge request acme/sub/app!",
        "This unwrap panics on empty input",
        "failed on merge request acme/sub/app!",
        "job \"unit-tests\" (test) failed: https://gitlab.example/acme/sub/app/-/jobs/",
        "Changes requested on merge request acme/sub/app!",
    ] {
        wait_until(30, needle, || prompts_all(&prompts).contains(needle));
    }
    let s = d.wait_for(20, "mallory's note reported", |s| {
        format!("{}", s["recent_events"]).contains("mallory")
    });
    assert!(
        format!("{}", s["recent_events"]).contains("less than Developer access"),
        "{}",
        s["recent_events"]
    );
    let all = prompts_all(&prompts);
    for absent in [
        "Mallory: delete the tests",
        "Bot: coverage went down",
        "changed the description",
        "job \"lint\"",
    ] {
        assert!(!all.contains(absent), "{absent} delivered: {all}");
    }
    assert_eq!(
        all.matches("Alice on the issue").count(),
        1,
        "delivered once: {all}"
    );
    drop(d);
}

/// A merge request that closes two running issues steers both: its note, a reviewer's
/// "request changes" and its failed pipeline reach each issue's agent.
#[test]
fn a_merge_request_closing_two_issues_steers_both() {
    let fake = Fake::start();
    let one = fake.issue("Fix the parser", &[], "demo: hold 500");
    let two = fake.issue("Fix the printer", &[], "demo: hold 500");
    let dir = TestDir::new("gitlab-two");
    let (d, prompts) = daemon(&dir, &fake, "");
    let ids = [format!("{PROJECT}#{one}"), format!("{PROJECT}#{two}")];
    d.wait_for(30, "both running", |s| running_ids(s).len() == 2);
    let mr = fake.mr("d00d1e", &[one, two]);
    wait_until(30, "svc reading the merge request's reviews", || {
        fake.route_count("GET /projects/:id/merge_requests/:iid/approvals") > 0
    });
    fake.admin(
        "POST",
        "/_fake/notes",
        json!({"project": PROJECT, "mr": mr, "author": "alice", "body": "Both need the new escaping"}),
    );
    fake.admin(
        "POST",
        "/_fake/pipelines",
        json!({"project": PROJECT, "sha": "d00d1e", "status": "failed", "jobs": [{"name": "e2e", "stage": "test", "status": "failed"}]}),
    );
    fake.admin(
        "POST",
        "/_fake/reviewers",
        json!({"project": PROJECT, "mr": mr, "user": "alice", "state": "requested_changes"}),
    );
    let of = |id: &str| -> String {
        std::fs::read_to_string(&prompts)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|p| p["issueId"] == id)
            .map(|p| p["text"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
            .join("\n=====\n")
    };
    for id in &ids {
        for needle in [
            "Both need the new escaping",
            "job \"e2e\" (test) failed",
            "Changes requested on merge request acme/sub/app!",
        ] {
            wait_until(30, &format!("{needle} for {id}"), || {
                of(id).contains(needle)
            });
        }
    }
    drop(d);
}

/// A note whose time does not read is skipped, not the end of the scan: the older note written
/// in the same poll still steers.
#[test]
fn a_note_with_an_unreadable_time_does_not_hide_older_notes() {
    let fake = Fake::start();
    let one = fake.issue("Fix the lexer", &[], "demo: hold 500");
    let dir = TestDir::new("gitlab-bad-time");
    // Polls far apart: both notes land between two of them.
    let (d, prompts) = daemon_with(&dir, &fake, "", "", 3000);
    let id = format!("{PROJECT}#{one}");
    d.wait_for(30, "the issue running", |s| running_ids(s) == [id.clone()]);
    fake.note(one, "alice", "Older note: keep the tokens");
    fake.admin(
        "POST",
        "/_fake/notes",
        json!({"project": PROJECT, "issue": one, "author": "alice", "body": "Newer note", "created_at": "yesterday-ish"}),
    );
    wait_until(30, "the older note delivered", || {
        prompts_all(&prompts).contains("Older note: keep the tokens")
    });
    drop(d);
}

/// A flood of notes (more than the 20 pages of events a read takes) does not pin the steering
/// cursor: the read that cannot reach it moves on and says once which notes it did not read,
/// later polls read the events in a request each, and a note written after the flood steers.
#[test]
fn a_flood_of_notes_moves_the_cursor_on_and_is_said_once() {
    let fake = Fake::start();
    let one = fake.issue("Fix the parser", &[], "demo: hold 500");
    let spam = fake.admin(
        "POST",
        "/_fake/issues",
        json!({"project": PROJECT, "title": "Public thread", "state": "closed"}),
    )["iid"]
        .as_u64()
        .unwrap();
    let dir = TestDir::new("gitlab-note-flood");
    let (d, prompts) = daemon(&dir, &fake, "");
    let id = format!("{PROJECT}#{one}");
    d.wait_for(30, "the issue running", |s| running_ids(s) == [id.clone()]);
    wait_until(30, "svc reading the project's notes", || {
        fake.route_count("GET /projects/:id/events") > 0
    });
    fake.admin(
        "POST",
        "/_fake/notes",
        json!({"project": PROJECT, "issue": spam, "author": "mallory", "body": "spam", "count": 2500}),
    );
    d.wait_for(30, "the notes not read said", |s| {
        format!("{}", s["recent_events"]).contains("more than 2000 notes since the last read")
    });
    // Well past the flood (ten polls), three polls cost a request of events each.
    let polls = || fake.route_count("GET /projects/:id/issues");
    let after = polls();
    wait_until(30, "ten polls after the flood", || polls() >= after + 10);
    fake.admin("POST", "/_fake/stats/reset", json!({}));
    wait_until(30, "three more polls", || polls() >= 3);
    let events = fake.route_count("GET /projects/:id/events");
    assert!(
        events <= 5,
        "the cursor moved on: {events} event reads in 3 polls"
    );
    fake.note(
        one,
        "alice",
        "Alice after the flood: keep the old API working",
    );
    wait_until(30, "the note after the flood delivered", || {
        prompts_all(&prompts).contains("Alice after the flood")
    });
    let err = d.stderr();
    assert_eq!(
        err.matches("more than 2000 notes since the last read")
            .count(),
        1,
        "said once: {err}"
    );
    drop(d);
}

/// More failed pipelines since the cursor than a read takes (500) do not stop GitLab steering:
/// the newest are read, the rest is said once, and a note still steers.
#[test]
fn a_flood_of_failed_pipelines_does_not_stop_steering() {
    let fake = Fake::start();
    let one = fake.issue("Fix the lexer", &[], "demo: hold 500");
    let dir = TestDir::new("gitlab-pipeline-flood");
    let (d, prompts) = daemon(&dir, &fake, "");
    let id = format!("{PROJECT}#{one}");
    d.wait_for(30, "the issue running", |s| running_ids(s) == [id.clone()]);
    fake.mr("5eed5eed", &[one]);
    wait_until(30, "svc reading the failed pipelines", || {
        fake.route_count("GET /projects/:id/pipelines") > 0
    });
    fake.admin(
        "POST",
        "/_fake/pipelines",
        json!({"project": PROJECT, "sha": "0ther", "status": "failed", "count": 600}),
    );
    fake.admin(
        "POST",
        "/_fake/pipelines",
        json!({"project": PROJECT, "sha": "5eed5eed", "status": "failed", "jobs": [{"name": "unit-tests", "stage": "test", "status": "failed"}]}),
    );
    fake.note(one, "alice", "Alice during the flood: the lexer drops tabs");
    for needle in [
        "Alice during the flood: the lexer drops tabs",
        "job \"unit-tests\" (test) failed",
    ] {
        wait_until(30, needle, || prompts_all(&prompts).contains(needle));
    }
    let err = d.stderr();
    assert_eq!(
        err.matches("more than 500 failed pipelines since").count(),
        1,
        "said once: {err}"
    );
    assert!(!err.contains("steering from gitlab failed"), "{err}");
    drop(d);
}

/// A merge request opened from a fork never steers (its failing pipeline runs what it
/// contains) and is reported once; an approval withdrawn on svc's own merge request does steer.
#[test]
fn a_fork_never_steers_and_a_withdrawn_approval_does() {
    let fake = Fake::start();
    let one = fake.issue("Fix the lexer", &[], "demo: hold 500");
    let dir = TestDir::new("gitlab-fork");
    let (d, prompts) = daemon(&dir, &fake, "");
    let id = format!("{PROJECT}#{one}");
    d.wait_for(30, "the issue running", |s| running_ids(s) == [id.clone()]);
    let fork = fake.admin(
        "POST",
        "/_fake/mrs",
        json!({"project": PROJECT, "title": "From a fork", "author": "alice", "sha": "f0f0f0", "closes": [one], "fork": true}),
    )["iid"]
        .as_u64()
        .unwrap();
    fake.admin(
        "POST",
        "/_fake/pipelines",
        json!({"project": PROJECT, "sha": "f0f0f0", "status": "failed", "jobs": [{"name": "fork-job", "stage": "test", "status": "failed"}]}),
    );
    fake.admin(
        "POST",
        "/_fake/notes",
        json!({"project": PROJECT, "mr": fork, "author": "alice", "body": "Fork note: rm -rf the tests"}),
    );
    let s = d.wait_for(30, "the fork reported", |s| {
        format!("{}", s["recent_events"]).contains("opened from a fork")
    });
    assert!(
        format!("{}", s["recent_events"]).contains(&format!("acme/sub/app!{fork}")),
        "{}",
        s["recent_events"]
    );
    let own = fake.mr("0badc0de", &[one]);
    wait_until(30, "svc reading the merge request's approvals", || {
        fake.route_count("GET /projects/:id/merge_requests/:iid/approvals") >= 1
    });
    fake.admin(
        "POST",
        "/_fake/approvals",
        json!({"project": PROJECT, "mr": own, "user": "alice", "approved": true}),
    );
    wait_until(
        30,
        "svc reading the approval (the merge request changed)",
        || fake.route_count("GET /projects/:id/merge_requests/:iid/approvals") >= 2,
    );
    fake.admin(
        "POST",
        "/_fake/approvals",
        json!({"project": PROJECT, "mr": own, "user": "alice", "approved": false}),
    );
    wait_until(30, "the withdrawn approval delivered", || {
        prompts_all(&prompts).contains(&format!(
            "alice withdrew their approval of merge request acme/sub/app!{own}"
        ))
    });
    let all = prompts_all(&prompts);
    for absent in ["fork-job", "Fork note"] {
        assert!(!all.contains(absent), "{absent} delivered: {all}");
    }
    drop(d);
}

/// With `rework_state`, review feedback on the merge request of an issue its agent parked in
/// `Human Review` moves it back to work once, and the rework run has the feedback in its first
/// prompt. Here the review (a reviewer's "request changes") comes right after the run ended,
/// before any read saw the issue parked: the steering read that finds it follows a candidate
/// read that still saw the issue at work (that read is held up by a slow GitLab answer while
/// the run ends).
#[test]
fn rework_state_sends_a_reviewed_issue_back() {
    let fake = Fake::start();
    // A turn longer than the 2 s a candidate read answers the after-turn state check.
    let one = fake.issue(
        "Ship it",
        &["agent"],
        "demo: slow 3000\ndemo: finish Human Review",
    );
    let mr = fake.mr("feed01", &[one]);
    // The first steering read that watches the issue (so while it runs) answers late.
    fake.admin(
        "POST",
        "/_fake/gate",
        json!({"method": "GET", "path": "/projects/[^/]+/merge_requests"}),
    );
    let dir = TestDir::new("gitlab-rework");
    let (d, prompts) = daemon(
        &dir,
        &fake,
        "    labels: [agent]\n    rework_state: In Progress\n",
    );
    let id = format!("{PROJECT}#{one}");
    wait_until(30, "a steering read held up while the issue runs", || {
        fake.get("/_fake/gate")["waiting"] == 1
    });
    let running = || {
        let (_, _, body) = http("GET", &format!("{}/api/v1/state", base_url(&d)), &[], None);
        serde_json::from_str::<Value>(&body).unwrap_or(Value::Null)["running"]
            .as_array()
            .map_or(usize::MAX, Vec::len)
    };
    wait_until(30, "the first run ended in Human Review", || {
        fake.labels(one)
            .contains(&"status::Human Review".to_string())
            && running() == 0
    });
    fake.admin(
        "POST",
        "/_fake/reviewers",
        json!({"project": PROJECT, "mr": mr, "user": "alice", "state": "requested_changes"}),
    );
    fake.admin("POST", "/_fake/gate/open", json!({}));
    let first = format!("Work on {id}.");
    wait_until(30, "the second run's prompt", || {
        prompt_texts(&prompts)
            .iter()
            .filter(|t| t.contains(&first))
            .count()
            >= 2
    });
    let second = prompt_texts(&prompts)
        .into_iter()
        .filter(|t| t.contains(&first))
        .nth(1)
        .unwrap();
    assert!(
        second.contains(&format!(
            "Changes requested on merge request {PROJECT}!{mr}"
        )) && second.contains("by alice"),
        "the review is in the first prompt of the rework run: {second}"
    );
    wait_until(30, "the rework run ends in Human Review", || {
        fake.log()
            .iter()
            .filter(|l| l.contains("add_labels=status::Human Review"))
            .count()
            == 2
    });
    let log = fake.log().join("\n");
    assert_eq!(
        log.matches("add_labels=status::In Progress").count(),
        1,
        "sent back once: {log}"
    );
    drop(d);
}

/// An issue blocked by an open one (an `is_blocked_by` link) waits, then runs once its blocker
/// is done.
#[test]
fn a_blocked_issue_waits_for_its_blocker() {
    let fake = Fake::start();
    let first = fake.issue("First", &[], "demo: slow 1500");
    let second = fake.issue("Second", &[], "");
    fake.admin(
        "POST",
        "/_fake/links",
        json!({"project": PROJECT, "iid": second, "blocked_by": first}),
    );
    let dir = TestDir::new("gitlab-blocked");
    let (d, prompts) = daemon(&dir, &fake, "");
    let (a, b) = (format!("{PROJECT}#{first}"), format!("{PROJECT}#{second}"));
    let s = d.wait_for(30, "the second waiting on the first", |s| {
        waiting_on_blockers(s).iter().any(|(id, _, _)| id == &b)
    });
    assert!(running_ids(&s).contains(&a), "{}", s["running"]);
    d.wait_for(30, "the second done", |_| {
        fake.state(second)["state"] == "closed"
    });
    let texts = prompt_texts(&prompts);
    let at = |id: &str| {
        texts
            .iter()
            .position(|t| t.contains(&format!("Work on {id}.")))
            .unwrap()
    };
    assert!(at(&a) < at(&b), "{texts:?}");
    drop(d);
}

/// A 429 pauses every request for its `Retry-After`: the snapshot shows the pause, no request
/// reaches GitLab meanwhile, the running agent is left alone, and polling resumes after.
#[test]
fn a_429_backs_off_and_recovers() {
    let fake = Fake::start();
    let one = fake.issue("Long one", &[], "demo: hold 500");
    let dir = TestDir::new("gitlab-limits");
    let (d, _prompts) = daemon(&dir, &fake, "");
    let id = format!("{PROJECT}#{one}");
    d.wait_for(30, "running", |s| running_ids(s) == [id.clone()]);
    fake.admin(
        "POST",
        "/_fake/limit",
        json!({"count": 1, "retry_after": 4}),
    );
    let s = d.wait_for(20, "the pause in the snapshot", |s| {
        s["rate_limits"]["paused_for_s"].is_number()
    });
    assert!(
        running_ids(&s).contains(&id),
        "the run goes on: {}",
        s["running"]
    );
    let during = fake.get("/_fake/stats")["requests"].as_u64().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let later = fake.get("/_fake/stats")["requests"].as_u64().unwrap();
    assert_eq!(later, during, "no request while paused");
    let two = fake.issue("After the pause", &[], "demo: hold 500");
    let two_id = format!("{PROJECT}#{two}");
    let s = d.wait_for(30, "the new issue running", |s| {
        running_ids(s).contains(&two_id)
    });
    assert!(running_ids(&s).contains(&id), "{}", s["running"]);
    drop(d);
}

/// An endpoint that redirects to another origin never gets the token sent there: the listener
/// at the other origin sees no request with it, and the poll fails saying why.
#[test]
fn a_redirect_to_another_origin_does_not_carry_the_token() {
    let fake = Fake::start();
    fake.issue("Anything", &[], "");
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = format!("http://{}", elsewhere.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let seen_by_listener = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in elsewhere.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(std::time::Duration::from_millis(500)));
            let mut buf = [0u8; 8192];
            let n = conn.read(&mut buf).unwrap_or(0);
            seen_by_listener
                .lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
            let _ = std::io::Write::write_all(
                &mut conn,
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n[]",
            );
        }
    });
    fake.admin(
        "POST",
        "/_fake/redirect",
        json!({"to": other, "count": 1000}),
    );
    let dir = TestDir::new("gitlab-redirect");
    let (d, _prompts) = daemon(&dir, &fake, "");
    let refused = || {
        d.latest()
            .is_some_and(|s| s.to_string().contains("redirect to another origin"))
    };
    wait_until(30, "the redirect refused or followed", || {
        refused() || !seen.lock().unwrap().is_empty()
    });
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.contains(TOKEN), "the token went elsewhere: {seen}");
    assert!(refused(), "the poll says why it failed");
    assert!(
        fake.get("/_fake/stats")["requests"].as_u64().unwrap() > 0,
        "svc asked the endpoint"
    );
    drop(d);
}

/// The `gitlab` pack mounted standalone (`tools.gitlab`) beside another tracker, through
/// `/mcp`: create, move (scoped label), note, read (notes without system notes, the closing
/// merge request's approvals and head pipeline), query, close as Cancelled; failures are data.
#[test]
fn the_gitlab_pack_works_through_mcp() {
    let fake = Fake::start();
    let dir = TestDir::new("gitlab-pack");
    let wf = workflow_with_description(
        &dir,
        &demo_memory(&format!(
            "tools:\n  gitlab:\n    endpoint: {}/api/v4\n    api_key: $GITLAB_TOKEN\n    projects: [{PROJECT}]\n    labels: [agent]\n",
            fake.url
        )),
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui")
        .arg(&wf)
        .env("GITLAB_TOKEN", TOKEN)
        .env(
            "SVC_MEMORY_TRACKER_ISSUES_JSON",
            issues_json(&[("MEM-1", "Todo", &[], "demo: keep-open")]),
        )
        .env("SVC_DEMO_AGENT_RECORD", dir.join("sessions.jsonl"));
    let _d = Daemon::start(cmd);
    let mcp = mcp_of(&dir);
    let (failed, made) = tool(
        &mcp,
        "gitlab_create_issue",
        json!({"title": "Filed by an agent", "body": "Found while working"}),
    );
    assert!(!failed, "{made}");
    let id = made["issue"]["id"].as_str().unwrap().to_string();
    let n: u64 = id.rsplit_once('#').unwrap().1.parse().unwrap();
    assert_eq!(made["issue"]["state"], "Todo");
    assert_eq!(fake.labels(n), ["agent"]);
    let (failed, moved) = tool(
        &mcp,
        "gitlab_update_status",
        json!({"issueId": id, "status": "In Progress"}),
    );
    assert!(!failed, "{moved}");
    assert_eq!(moved["issue"]["state"], "In Progress");
    assert_eq!(fake.labels(n), ["agent", "status::In Progress"]);
    let (failed, c) = tool(
        &mcp,
        "gitlab_comment",
        json!({"issueId": format!("#{n}"), "body": "Started on it"}),
    );
    assert!(!failed && c["ok"] == true, "{c}");
    fake.admin(
        "POST",
        "/_fake/notes",
        json!({"project": PROJECT, "issue": n, "author": "alice", "body": "changed the title", "system": true}),
    );
    let mr = fake.mr("beef02", &[n]);
    fake.admin(
        "POST",
        "/_fake/approvals",
        json!({"project": PROJECT, "mr": mr, "user": "alice", "approved": true}),
    );
    fake.admin(
        "POST",
        "/_fake/pipelines",
        json!({"project": PROJECT, "sha": "beef02", "status": "failed", "jobs": []}),
    );
    let (failed, read) = tool(&mcp, "gitlab_read_issue", json!({"issueId": id}));
    assert!(!failed, "{read}");
    assert_eq!(read["issue"]["title"], "Filed by an agent");
    assert_eq!(read["notes"].as_array().unwrap().len(), 1, "{read}");
    assert_eq!(read["notes"][0]["body"], "Started on it");
    assert_eq!(read["notes"][0]["author"], "svc-bot");
    let m = &read["mergeRequests"][0];
    assert_eq!(m["iid"], mr, "{read}");
    assert_eq!(m["approved"], true, "{m}");
    assert_eq!(m["approvedBy"], json!(["alice"]), "{m}");
    assert_eq!(m["headPipeline"]["status"], "failed", "{m}");
    let (failed, rows) = tool(
        &mcp,
        "gitlab_query",
        json!({"states": ["Todo", "In Progress"], "where": {"field": "state", "op": "eq", "value": "In Progress"}, "select": ["identifier", "state"]}),
    );
    assert!(!failed, "{rows}");
    assert_eq!(rows["total"], 1, "{rows}");
    assert_eq!(
        rows["rows"][0],
        json!({"identifier": id, "state": "In Progress"})
    );
    // Lists are read page by page (100 a page, `X-Next-Page`): 150 more open issues in scope.
    fake.admin(
        "POST",
        "/_fake/issues",
        json!({"project": PROJECT, "title": "Bulk", "labels": ["agent"], "count": 150}),
    );
    let (failed, rows) = tool(
        &mcp,
        "gitlab_query",
        json!({"states": ["Todo"], "select": ["identifier"], "limit": 1}),
    );
    assert!(!failed, "{rows}");
    assert_eq!(rows["total"], 150, "every page read: {rows}");
    let (failed, closed) = tool(
        &mcp,
        "gitlab_update_status",
        json!({"issueId": id, "status": "Cancelled"}),
    );
    assert!(!failed, "{closed}");
    assert_eq!(closed["issue"]["state"], "Cancelled", "{closed}");
    assert_eq!(fake.state(n)["state"], "closed");
    assert_eq!(fake.labels(n), ["agent", "status::Cancelled"]);
    let e = error_of(tool(
        &mcp,
        "gitlab_update_status",
        json!({"issueId": format!("{PROJECT}#999"), "status": "Done"}),
    ));
    assert!(e.contains("HTTP 404"), "{e}");
    // A comma in a status would write other labels: refused, on create as on a move.
    let writes = fake.log().len();
    let e = error_of(tool(
        &mcp,
        "gitlab_create_issue",
        json!({"title": "Sneaky", "status": "In Progress,admin"}),
    ));
    assert!(e.contains("cannot hold a comma"), "{e}");
    let e = error_of(tool(
        &mcp,
        "gitlab_update_status",
        json!({"issueId": id, "status": "Todo,admin"}),
    ));
    assert!(e.contains("cannot hold a comma"), "{e}");
    assert_eq!(
        fake.log().len(),
        writes,
        "nothing written: {:?}",
        fake.log()
    );
    let e = error_of(tool(&mcp, "gitlab_read_issue", json!({"issueId": "nope"})));
    assert!(e.contains("'nope' is not an issue id"), "{e}");
    let e = error_of(tool(
        &mcp,
        "gitlab_comment",
        json!({"issueId": "acme/other#1", "body": "hi"}),
    ));
    assert!(
        e.contains("acme/other#1 is not in the workflow's projects (acme/sub/app)"),
        "{e}"
    );
}

/// `POST /webhooks/gitlab` with the right `X-Gitlab-Token` wakes the poll at once (the poll
/// interval is a minute); a wrong or missing token is refused, another project's event and
/// other events wake nothing.
#[test]
fn gitlab_webhooks_wake_the_poll() {
    let fake = Fake::start();
    let dir = TestDir::new("gitlab-webhooks");
    let port = free_port();
    let (d, prompts) = daemon_with(
        &dir,
        &fake,
        "",
        &format!("  webhook_port: {port}\n"),
        60_000,
    );
    wait_until(20, "the first poll", || {
        fake.route_count("GET /projects/:id/issues") >= 1
    });
    let one = fake.issue("Webhook-driven", &[], "demo: hold 2000");
    let id = format!("{PROJECT}#{one}");
    let body = json!({"object_kind": "issue", "project": {"path_with_namespace": PROJECT}, "object_attributes": {"iid": one}}).to_string();
    let deliver = |token: Option<&str>, event: &str, body: &str| {
        let mut headers = vec![
            ("X-Gitlab-Event", event),
            ("Content-Type", "application/json"),
        ];
        if let Some(t) = token {
            headers.push(("X-Gitlab-Token", t));
        }
        post_hook(port, "/webhooks/gitlab", &headers, body)
    };
    assert_eq!(
        deliver(Some("wrong"), "Issue Hook", &body),
        (401, "unauthorized".into())
    );
    assert_eq!(
        deliver(None, "Issue Hook", &body),
        (401, "unauthorized".into())
    );
    let elsewhere =
        json!({"object_kind": "issue", "project": {"path_with_namespace": "acme/other"}})
            .to_string();
    assert_eq!(
        deliver(Some(HOOK_SECRET), "Issue Hook", &elsewhere),
        (202, "ignored".into())
    );
    assert_eq!(
        deliver(Some(HOOK_SECRET), "Push Hook", &body),
        (202, "ignored".into())
    );
    assert_eq!(
        deliver(Some(HOOK_SECRET), "Issue Hook", &body),
        (202, "woke".into())
    );
    d.wait_for(20, "the issue dispatched on the webhook", |s| {
        running_ids(s) == [id.clone()]
    });
    // A note event brings a note to the running agent (at the next poll: it comes within an
    // interval of the delivery that brought one forward).
    fake.note(one, "alice", "Webhook note: use the new API");
    let note =
        json!({"object_kind": "note", "project": {"path_with_namespace": PROJECT}}).to_string();
    assert_eq!(
        deliver(Some(HOOK_SECRET), "Note Hook", &note),
        (202, "woke".into())
    );
    // Within a polling interval of the delivery that brought a poll forward: left to the next
    // poll, which comes within the interval (a flood costs at most one poll an interval); the
    // run's turns, held 2 s each, outlast it.
    wait_until(90, "the note delivered", || {
        prompts_all(&prompts).contains("Webhook note: use the new API")
    });
    let s = d.latest().unwrap().to_string();
    assert!(!s.contains(HOOK_SECRET) && !s.contains(TOKEN), "{s}");
    assert!(!d.stderr().contains(HOOK_SECRET), "no secret in the log");
    drop(d);
}

/// `svc doctor --online` checks the token's user and scopes, each project, and the scoped
/// labels the states need (with a hint to create them); a wrong token is named without its
/// value.
#[test]
fn doctor_checks_the_token_the_projects_and_the_labels() {
    let fake = Fake::start();
    fake.admin(
        "POST",
        "/_fake/labels",
        json!({"project": PROJECT, "name": "status::In Progress"}),
    );
    let dir = TestDir::new("gitlab-doctor");
    let wf = workflow(
        &dir,
        &format!(
            "tracker:\n  kind: gl\ntrackers:\n  gl:\n    provider: gitlab\n    endpoint: {}/api/v4\n    projects: [{PROJECT}, acme/missing]\n    rework_state: In Progress\nagent:\n  kind: demo\nagents:\n  demo:\n    bridge_command: svc demo-agent\n",
            fake.url
        ),
    );
    let r = doctor_online(&dir, &wf, &[("GITLAB_TOKEN", TOKEN)]);
    let out = r.all();
    assert!(
        out.contains("gitlab accepts the token (user svc-bot; scopes api)"),
        "{out}"
    );
    assert!(
        out.contains("acme/sub/app: issues on, the token may write them"),
        "{out}"
    );
    assert!(
        out.contains("acme/sub/app has the state labels status::In Progress"),
        "{out}"
    );
    assert!(
        out.contains("gitlab GET /projects/acme%2Fmissing answered HTTP 404"),
        "{out}"
    );
    // `enterprise: true` runs on Free tiers too: without a blocking link seen, it cannot tell.
    assert!(
        out.contains("whether blocking issue links are available cannot be told"),
        "blockers said once, in doctor: {out}"
    );
    assert!(!out.contains("has blocking issue links"), "{out}");
    // The labels of the terminal states svc writes: a warning with how to create them.
    assert!(
        out.contains("acme/sub/app lacks the scoped labels of terminal states status::Closed, status::Cancelled"),
        "{out}"
    );
    assert!(out.contains("name=status::Closed"), "{out}");
    assert_ne!(r.code, Some(0), "{out}");
    // A blocking link seen on an issue tells the tier has them.
    let blocker = fake.issue("Blocker", &[], "");
    let blocked = fake.issue("Blocked", &[], "");
    fake.admin(
        "POST",
        "/_fake/links",
        json!({"project": PROJECT, "iid": blocked, "blocked_by": blocker}),
    );
    let out = doctor_online(&dir, &wf, &[("GITLAB_TOKEN", TOKEN)]).all();
    assert!(
        out.contains(&format!(
            "has blocking issue links ({PROJECT}#{blocker} has one)"
        )),
        "{out}"
    );
    // A read_api token: writes need api.
    fake.admin(
        "POST",
        "/_fake/users",
        json!({"username": "svc-bot", "token": "glpat-read", "access_level": 40, "scopes": ["read_api"]}),
    );
    let out = doctor_online(&dir, &wf, &[("GITLAB_TOKEN", "glpat-read")]).all();
    assert!(
        out.contains("lacks the api scope (it has read_api)"),
        "{out}"
    );
    // Missing labels: said with how to create them.
    let wf2 = dir.write(
        "WF2.md",
        &std::fs::read_to_string(&wf)
            .unwrap()
            .replace(", acme/missing", "")
            .replace(
                "kind: gl\n",
                "kind: gl\n  active_states: [Todo, In Progress, Review]\n",
            ),
    );
    let out = doctor_online(&dir, &wf2, &[("GITLAB_TOKEN", TOKEN)]).all();
    assert!(
        out.contains("acme/sub/app lacks the scoped labels status::Review"),
        "{out}"
    );
    assert!(out.contains("Manage > Labels"), "{out}");
    let r = doctor_online(&dir, &wf, &[("GITLAB_TOKEN", "glpat-wrong")]);
    let out = r.all();
    assert!(out.contains("HTTP 401"), "{out}");
    assert!(!out.contains("glpat-wrong"), "the token never shows: {out}");
}

/// A flood of deliveries costs at most one poll an interval: 100 replays of one captured
/// delivery and 100 forged ones (GitLab's token is the secret itself, so whoever captured one
/// can write any) bring one poll forward; the replays are answered `duplicate`, and the next
/// poll after that one is a whole interval away. Before issue 40 each of them woke the poller,
/// so the flood kept it polling back to back.
#[test]
fn a_flood_of_gitlab_deliveries_costs_at_most_one_poll_an_interval() {
    let fake = Fake::start();
    let dir = TestDir::new("gitlab-webhook-flood");
    let port = free_port();
    let (d, _prompts) = daemon_with(
        &dir,
        &fake,
        "",
        &format!("  webhook_port: {port}\n"),
        60_000,
    );
    let polls = || fake.route_count("GET /projects/:id/issues");
    wait_until(20, "the first poll", || polls() >= 1);
    d.wait_for(20, "the first poll done", |s| {
        s["polling"]["in_flight"] == false
    });
    let before = polls();
    let deliver = |body: &str| {
        post_hook(
            port,
            "/webhooks/gitlab",
            &[
                ("X-Gitlab-Event", "Issue Hook"),
                ("X-Gitlab-Token", HOOK_SECRET),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    let captured = json!({"object_kind": "issue", "project": {"path_with_namespace": PROJECT}, "object_attributes": {"iid": 1}}).to_string();
    assert_eq!(deliver(&captured), (202, "woke".into()));
    for _ in 0..100 {
        assert_eq!(deliver(&captured), (202, "duplicate".into()));
    }
    for i in 0..100 {
        let forged = json!({"object_kind": "issue", "project": {"path_with_namespace": PROJECT}, "object_attributes": {"iid": 1, "n": i}}).to_string();
        assert_eq!(deliver(&forged), (202, "woke".into()));
    }
    // Settled: every delivery counted, no poll under way, and the next one far off.
    let ahead = |s: &Value| {
        s["polling"]["next_poll_at"]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339(t).ok())
            .and_then(|t| t.duration_since(std::time::SystemTime::now()).ok())
            .unwrap_or_default()
    };
    d.wait_for(30, "the flood counted and the poll it brought done", |s| {
        s["webhooks"]["/webhooks/gitlab"]["accepted"] == 201
            && s["polling"]["in_flight"] == false
            && ahead(s) > std::time::Duration::from_secs(30)
    });
    assert_eq!(polls(), before + 1, "one poll brought forward");
    drop(d);
}
