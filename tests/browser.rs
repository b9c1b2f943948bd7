//! The web dashboard in a real headless browser (Debian's chromium, which the test command
//! installs): the running table and a live trace timeline rendered from the running daemon.

mod common;

use common::*;
use std::fs;
use std::process::Command;

/// Headless chromium, quiet and offline but for the page it is given.
const HEADLESS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
];

fn chromium(dir: &TestDir, url: &str, args: &[&str]) -> String {
    let profile = dir.join(&format!("chrome-{}", args.len()));
    let out = Command::new("chromium")
        .args(HEADLESS)
        .arg("--virtual-time-budget=5000")
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("chromium runs (scripts/test installs Debian's chromium)");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The DOM once `ready` holds: a page fills itself from fetches and a WebSocket, which can take
/// longer than chromium's virtual-time budget on a loaded machine, so a dump is tried up to
/// three times. The caller's assertions then say what is missing.
fn dump_dom(dir: &TestDir, url: &str, ready: impl Fn(&str) -> bool) -> String {
    let mut dom = String::new();
    for _ in 0..3 {
        dom = chromium(dir, url, &["--dump-dom"]);
        if ready(&dom) {
            break;
        }
    }
    dom
}

#[test]
fn the_dashboard_renders_running_runs_and_a_live_trace() {
    let dir = TestDir::new("browser");
    let wf = board_workflow(
        &dir,
        &[
            (
                "BOARD-1.md",
                "---\ntitle: Browser visible issue\nstate: Todo\n---\ndemo: keep-open\ndemo: slow 60000\n",
            ),
            (
                "BOARD-2.md",
                "---\ntitle: Waits for the first\nstate: Todo\nblocked_by: [BOARD-1]\n---\n",
            ),
        ],
        "polling:\n  interval_ms: 300\nagent:\n  kind: demo\nworker:\n  worker_pool:\n    driver: fake\n    max: 2\n",
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    d.wait_for(20, "a run with its tool call done", |s| {
        s["running"]
            .as_array()
            .is_some_and(|r| r.len() == 1 && r[0]["last_event"].is_string())
    });
    std::thread::sleep(std::time::Duration::from_millis(700));
    let base = base_url(&d);

    let dom = dump_dom(&dir, &format!("{base}/"), |dom| {
        dom.contains("BOARD-1") && dom.contains("class=\"badge live\"")
    });
    let running = dom
        .split("<table id=\"running\">")
        .nth(1)
        .expect("the running table")
        .split("</table>")
        .next()
        .unwrap()
        .to_string();
    assert!(
        running.contains("BOARD-1") && running.contains("demo"),
        "running table: {running}"
    );
    // The run's worker host, and the pool's figures in their card.
    assert!(
        running.contains("fake://worker-w-1"),
        "running table: {running}"
    );
    let pool_card = dom
        .split("id=\"c-pool\"")
        .nth(1)
        .expect("the worker pool card")
        .split("</span>")
        .next()
        .unwrap()
        .to_string();
    assert!(
        pool_card.contains("fake: ") && pool_card.contains("1 leased"),
        "pool card: {pool_card}"
    );
    assert!(
        dom.contains("id=\"link\" class=\"badge live\""),
        "the WebSocket connected"
    );
    // One workflow: no workflows table, filter or Workflow column.
    assert!(
        dom.contains("<div id=\"workflows-box\" hidden=\"\">") && !running.contains(">Workflow<"),
        "running table: {running}"
    );
    // The issue waiting for its blocker is listed apart from the capacity-blocked ones.
    let table = |id: &str| {
        dom.split(&format!("<table id=\"{id}\">"))
            .nth(1)
            .unwrap_or_else(|| panic!("the {id} table"))
            .split("</table>")
            .next()
            .unwrap()
            .to_string()
    };
    let waiting = table("waiting");
    assert!(
        waiting.contains("BOARD-2") && waiting.contains("BOARD-1 (Todo)"),
        "waiting table: {waiting}"
    );
    assert!(
        !table("blocked").contains("BOARD-2"),
        "{}",
        table("blocked")
    );

    let dom = dump_dom(&dir, &format!("{base}/#/traces/BOARD-1"), |dom| {
        dom.contains("Working on BOARD-1") && dom.contains("Browser visible issue")
    });
    let timeline = dom
        .split("id=\"timeline\"")
        .nth(1)
        .expect("the timeline")
        .split("</ol>")
        .next()
        .unwrap()
        .to_string();
    for text in [
        "Turn 1 started",
        "Write DEMO.md",
        "completed",
        "approval_auto_approved",
        "Working on BOARD-1",
    ] {
        assert!(
            timeline.contains(text),
            "{text:?} missing from the timeline: {timeline}"
        );
    }
    assert!(
        dom.contains("Browser visible issue"),
        "the ticket title comes from the issue store"
    );

    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-trace.png");
    chromium(
        &dir,
        &format!("{base}/#/traces/BOARD-1"),
        &[&format!("--screenshot={}", shot.display())],
    );
    assert!(
        fs::metadata(&shot).unwrap().len() > 10_000,
        "a real screenshot at {}",
        shot.display()
    );
}

/// A headless chromium driven over the DevTools protocol (a WebSocket of its own): pages are
/// opened, scripts evaluated and awaited, as a person would click and type. Killed on drop.
struct Browser {
    child: std::process::Child,
    ws: svc::tracker::ws::Socket,
    next: u64,
}

impl Browser {
    fn start(dir: &TestDir) -> Browser {
        use std::process::Stdio;
        let profile = dir.join("chrome-cdp");
        let child = Command::new("chromium")
            .args(HEADLESS)
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium runs (scripts/test installs Debian's chromium)");
        let port_file = profile.join("DevToolsActivePort");
        wait_until(30, "chromium's DevTools port", || {
            fs::read_to_string(&port_file).is_ok_and(|t| t.lines().count() >= 2)
        });
        let port = fs::read_to_string(&port_file).unwrap();
        let port = port.lines().next().unwrap().trim().to_string();
        let mut page = None;
        wait_until(30, "a page target", || {
            let (_, _, body) = http(
                "GET",
                &format!("http://127.0.0.1:{port}/json/list"),
                &[],
                None,
            );
            let list: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            page = list.as_array().into_iter().flatten().find_map(|t| {
                (t["type"] == "page")
                    .then(|| t["webSocketDebuggerUrl"].as_str().map(str::to_string))?
            });
            page.is_some()
        });
        let (ws, ctl) = svc::tracker::ws::connect(&page.unwrap()).expect("DevTools WebSocket");
        ctl.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        Browser { child, ws, next: 0 }
    }

    /// Sends one DevTools command and returns its result.
    fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next += 1;
        let id = self.next;
        let msg = serde_json::json!({"id": id, "method": method, "params": params});
        self.ws
            .send(tungstenite::Message::text(msg.to_string()))
            .unwrap();
        loop {
            let frame = self.ws.read().expect("a DevTools answer");
            let Ok(text) = frame.to_text() else { continue };
            let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
            if v["id"] == id {
                assert!(v["error"].is_null(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    fn goto(&mut self, url: &str) {
        self.call("Page.navigate", serde_json::json!({"url": url}));
    }

    /// The value of a script (promises awaited).
    fn eval(&mut self, script: &str) -> serde_json::Value {
        let r = self.call(
            "Runtime.evaluate",
            serde_json::json!({"expression": script, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(r["exceptionDetails"].is_null(), "{script}: {r}");
        r["result"]["value"].clone()
    }

    /// Waits until `script` is true in the page; panics with `what` and the page's text.
    fn wait(&mut self, what: &str, script: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.eval(&format!("!!({script})")) != true {
            if std::time::Instant::now() > deadline {
                let text = self.eval("document.body ? document.body.innerText : ''");
                panic!(
                    "timed out waiting for {what}; page:\n{}",
                    text.as_str().unwrap_or("")
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The DOM of text `s` as a JavaScript string literal.
fn js(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// What an operator does from the page: finds issues by search and among the recent ones,
/// reads the agent's Markdown (a hostile sample stays inert), and with the token `svc open`
/// hands over, steers and cancels a running issue; without it the page is read-only and the
/// daemon refuses, and a wrong token is refused too.
#[test]
fn the_dashboard_searches_renders_markdown_safely_and_acts_with_the_token() {
    let dir = TestDir::new("browser-act");
    let say = concat!(
        "demo: say ## Plan for the *fix*\\n",
        "- read `src/lib.rs`\\n  - then `src/main.rs`\\n- write **tests**\\n1. first\\n2. second\\n",
        "| file | lines |\\n|:--|--:|\\n| a.rs | 10 |\\n",
        "```\\nfn main() {}\\n```\\n",
        "See [the docs](https://example.com/docs) and <https://example.com/raw>.\\n",
        "Hostile: <script>window.__pwned = 1</script> <img src=x onerror=\"window.__pwned = 2\"> ",
        "[click](javascript:window.__pwned=3) [data](data:text/html,x) **<b>bold?</b>**"
    );
    let wf = board_workflow(
        &dir,
        &[
            (
                "BOARD-1.md",
                &format!(
                    "---\ntitle: Browser visible issue\nstate: Todo\n---\ndemo: keep-open\ndemo: slow 60000\n{say}\n"
                ),
            ),
            (
                "BOARD-2.md",
                "---\ntitle: Quick other thing\nstate: Todo\n---\n",
            ),
        ],
        "polling:\n  interval_ms: 300\nagent:\n  kind: demo\n",
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    d.wait_for(30, "BOARD-1 running, BOARD-2 done", |s| {
        running_ids(s) == ["BOARD-1"] && s["running"][0]["last_event"].is_string()
    });
    let base = base_url(&d);
    // The page is served under a strict policy.
    let (status, _, _) = http("GET", &format!("{base}/"), &[], None);
    assert_eq!(status, 200);
    let csp = ureq::get(&format!("{base}/"))
        .call()
        .unwrap()
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    let open = run(svc(&dir).arg("open").arg(&wf));
    assert_eq!(open.code, Some(0), "{}", open.all());
    let open_url = open.stdout.trim().to_string();
    assert!(
        open_url.starts_with(&format!("{base}/#token=")),
        "{open_url}"
    );

    let mut b = Browser::start(&dir);
    // Recent issues and search.
    b.goto(&format!("{base}/#/issues"));
    b.wait(
        "both issues among the recent ones",
        "document.querySelectorAll('#recent-issues li a').length >= 2",
    );
    let recent = b.eval("document.getElementById('recent-issues').innerText");
    assert!(
        recent.as_str().unwrap().contains("BOARD-1")
            && recent.as_str().unwrap().contains("BOARD-2"),
        "{recent}"
    );
    b.eval("const q = document.getElementById('q'); q.value = 'visib'; q.dispatchEvent(new Event('input')); true");
    b.wait(
        "the search's result",
        "document.getElementById('search-results').innerText.includes('BOARD-1')",
    );
    let results = b.eval("document.getElementById('search-results').innerText");
    assert!(
        !results.as_str().unwrap().contains("BOARD-2"),
        "only the match: {results}"
    );

    // The agent's Markdown, rendered; the hostile parts stay text.
    b.goto(&format!("{base}/#/traces/BOARD-1"));
    b.wait(
        "the agent's Markdown in the timeline",
        "document.querySelector('#timeline li.md h5')",
    );
    let facts = b.eval(
        r#"(() => {
        // The agent's message (the prompt above it holds the same text on one line).
        const t = [...document.querySelectorAll('#timeline li.md')].find((li) => li.querySelector('h5'));
        return {
          heading: t.querySelector('h5') && t.querySelector('h5').textContent,
          em: t.querySelector('h5 em') && t.querySelector('h5 em').textContent,
          items: [...t.querySelector('ul').children].map((li) => [...li.childNodes].filter((n) => n.nodeName !== 'UL').map((n) => n.textContent).join('')),
          nested: [...t.querySelectorAll(':scope ul > li > ul > li')].map((li) => li.textContent),
          cells: [...t.querySelectorAll('table th, table td')].map((c) => c.textContent),
          right: [...t.querySelectorAll('td.align-right')].map((c) => c.textContent),
          ordered: t.querySelectorAll(':scope ol li').length,
          code: [...t.querySelectorAll('code')].map((c) => c.textContent),
          pre: t.querySelector('pre code') && t.querySelector('pre code').textContent,
          links: [...t.querySelectorAll('a')].map((a) => a.getAttribute('href')),
          scripts: document.querySelectorAll('script').length,
          handlers: document.querySelectorAll('[onerror], [onload], [onclick]').length,
          images: document.querySelectorAll('img').length,
          bolds: document.querySelectorAll('#timeline b').length,
          pwned: window.__pwned === undefined ? null : window.__pwned,
          text: t.innerText,
        };
    })()"#,
    );
    assert_eq!(facts["heading"], "Plan for the fix", "{facts:#}");
    assert_eq!(facts["em"], "fix", "{facts:#}");
    assert_eq!(
        facts["items"],
        serde_json::json!(["read src/lib.rs", "write tests"]),
        "{facts:#}"
    );
    assert_eq!(
        facts["nested"],
        serde_json::json!(["then src/main.rs"]),
        "{facts:#}"
    );
    assert_eq!(facts["ordered"], 2, "{facts:#}");
    assert_eq!(
        facts["cells"],
        serde_json::json!(["file", "lines", "a.rs", "10"]),
        "{facts:#}"
    );
    assert_eq!(facts["right"], serde_json::json!(["10"]), "{facts:#}");
    assert_eq!(facts["pre"], "fn main() {}", "{facts:#}");
    assert_eq!(
        facts["links"],
        serde_json::json!(["https://example.com/docs", "https://example.com/raw"]),
        "only http(s) links become links: {facts:#}"
    );
    assert_eq!(facts["scripts"], 1, "app.js only: {facts:#}");
    assert_eq!(facts["handlers"], 0, "{facts:#}");
    assert_eq!(facts["images"], 0, "{facts:#}");
    assert_eq!(facts["bolds"], 0, "{facts:#}");
    assert!(facts["pwned"].is_null(), "{facts:#}");
    let text = facts["text"].as_str().unwrap();
    for inert in [
        "<script>window.__pwned = 1</script>",
        "<img src=x onerror=\"window.__pwned = 2\">",
        "[click](javascript:window.__pwned=3)",
    ] {
        assert!(text.contains(inert), "{inert:?} shown as text: {text}");
    }

    // Without a token: read-only, and the daemon refuses the page's requests.
    b.wait("the act panel", "!document.getElementById('act').hidden");
    assert_eq!(
        b.eval("[document.getElementById('act-readonly').hidden, document.getElementById('steer-form').hidden, document.getElementById('control').textContent]"),
        serde_json::json!([false, true, "read-only"])
    );
    assert_eq!(
        b.eval("fetch('/api/v1/BOARD-1/cancel', {method: 'POST'}).then((r) => r.status)"),
        401
    );

    // A wrong token is refused.
    b.goto(&format!("{base}/#token=not-this-daemons"));
    b.wait(
        "the token taken",
        "document.getElementById('control').textContent === 'control: this tab'",
    );
    b.eval("location.hash = '#/traces/BOARD-1'; true");
    b.wait(
        "the steering box",
        "!document.getElementById('steer-form').hidden",
    );
    b.eval(&format!(
        "document.getElementById('steer-text').value = {}; document.getElementById('steer-send').click(); true",
        js("from a stranger")
    ));
    b.wait(
        "the refusal",
        "document.getElementById('act-status').textContent.startsWith('Refused')",
    );

    // The token `svc open` printed: it leaves the address bar and stays in this tab only.
    b.goto(&open_url);
    b.wait(
        "the token taken",
        "document.getElementById('control').textContent === 'control: this tab'",
    );
    assert_eq!(b.eval("location.hash"), "#/");
    let token = open_url.split("#token=").nth(1).unwrap();
    assert_eq!(b.eval("sessionStorage.getItem('svc-control-token')"), token);
    assert_eq!(b.eval("localStorage.length"), 0);
    b.eval("location.hash = '#/traces/BOARD-1'; true");
    b.wait(
        "the steering box",
        "!document.getElementById('steer-form').hidden",
    );
    b.eval(&format!(
        "document.getElementById('steer-text').value = {}; document.getElementById('steer-send').click(); true",
        js("Please add a test for the parser")
    ));
    b.wait(
        "the steering sent",
        "document.getElementById('act-status').textContent.startsWith('Sent to BOARD-1')",
    );
    let shot = b.call(
        "Page.captureScreenshot",
        serde_json::json!({"format": "png"}),
    );
    let png = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap()
    };
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-act.png");
    fs::write(&shot, &png).unwrap();
    assert!(
        png.len() > 10_000,
        "a real screenshot at {}",
        shot.display()
    );
    d.wait_for(20, "the message handed to the run", |s| {
        s["running"][0]["steering_pending"] == 1 && events(s).contains(&"steering_accepted".into())
    });
    // Cancel: the first press arms the button, the second sends.
    b.eval("document.getElementById('cancel-run').click(); true");
    b.wait(
        "the armed button",
        "document.getElementById('cancel-run').textContent === 'Confirm cancel'",
    );
    b.eval("document.getElementById('cancel-run').click(); true");
    b.wait(
        "the cancel sent",
        "document.getElementById('act-status').textContent.startsWith('Canceled BOARD-1 (running)')",
    );
    let s = d.wait_for(20, "the run canceled", |s| {
        running_ids(s).is_empty() && events(s).contains(&"run_canceled".into())
    });
    assert!(events(&s).contains(&"operator_canceled".into()), "{s:#}");
    let (_, _, runs) = http(
        "GET",
        &format!("{base}/api/v1/runs?issue=BOARD-1"),
        &[],
        None,
    );
    let runs: serde_json::Value = serde_json::from_str(&runs).unwrap();
    // The spec's `canceled` count stays 0: the run failed, its error says why.
    assert_eq!(runs["summary"]["canceled"], 0, "{runs:#}");
    assert_eq!(runs["summary"]["failed"], 1, "{runs:#}");
    assert_eq!(
        runs["runs"][0]["failure_reason"], "canceled by the operator",
        "{runs:#}"
    );
    // Held back while it stays in Todo: no new run after more polls.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    assert!(running_ids(&d.latest().unwrap()).is_empty());
    b.wait(
        "the act panel gone",
        "document.getElementById('act').hidden",
    );
}

/// Two daemons with homes of their own sharing one claim store: each dashboard's Fleet card
/// lists both, the other one a link to its dashboard.
#[test]
fn the_fleet_card_lists_every_daemon_sharing_the_store() {
    let dir = TestDir::new("browser-fleet");
    let board = dir.join("board");
    fs::create_dir_all(&board).unwrap();
    let wf = workflow_with_description(
        &dir,
        "tracker:\n  kind: work\ntrackers:\n  work:\n    provider: local\n    path: board\npolling:\n  interval_ms: 300\nworkspace:\n  root: ~/ws\nagent:\n  kind: demo\nagents:\n  demo:\n    bridge_command: svc demo-agent\nserver:\n  port: 0\n",
    );
    let store = dir.join("shared.claims.db");
    let start = |home: &str| {
        fs::create_dir_all(dir.join(home)).unwrap();
        let mut cmd = svc(&dir);
        cmd.arg("--no-tui")
            .arg(&wf)
            .env("HOME", dir.join(home))
            .env("SVC_CLAIM_STORE", &store);
        Daemon::start(cmd)
    };
    let a = start("h1");
    let b = start("h2");
    let s = a.wait_for(20, "both daemons in the fleet", |s| {
        s["fleet"].as_array().is_some_and(|f| f.len() == 2)
    });
    let other_pid = s["fleet"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["this"] == false)
        .unwrap()["pid"]
        .to_string();
    let dom = dump_dom(&dir, &format!("{}/", base_url(&a)), |dom| {
        dom.contains(&format!(":{other_pid}<"))
    });
    let card = dom
        .split("id=\"c-fleet\"")
        .nth(1)
        .expect("the fleet card")
        .split("</span>")
        .next()
        .unwrap()
        .to_string();
    assert!(
        card.contains(&format!(":{other_pid}")),
        "fleet card: {card}"
    );
    assert!(
        card.contains(&format!("href=\"{}\"", base_url(&b))),
        "fleet card: {card}"
    );
    assert!(card.contains("(this)"), "fleet card: {card}");
}

/// A daemon serving two workflows: the Workflows table lists both, the issue tables get a
/// Workflow column, and choosing a workflow in the filter leaves only its rows (and "all
/// workflows" brings the others back).
#[test]
fn the_workflow_filter_leaves_only_the_chosen_workflow_s_rows() {
    let dir = TestDir::new("browser-workflows");
    let wf = held_workflows(
        &dir,
        &[("alpha", &["BOARD-1"]), ("beta", &["BOARD-2", "BOARD-3"])],
    );
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    d.wait_for(30, "three runs in two workflows", |s| {
        s["running"].as_array().is_some_and(|r| r.len() == 3)
    });
    let mut b = Browser::start(&dir);
    b.goto(&format!("{}/", base_url(&d)));
    b.wait(
        "three running rows",
        "document.querySelectorAll('#running tbody tr:not(.empty)').length === 3",
    );
    // Each row's first two cells: its workflow and its issue.
    let rows = "[...document.querySelectorAll('#running tbody tr')].map((tr) => [...tr.cells].slice(0, 2).map((c) => c.textContent).join(' ')).sort()";
    assert_eq!(
        b.eval(rows),
        serde_json::json!(["alpha BOARD-1", "beta BOARD-2", "beta BOARD-3"])
    );
    assert_eq!(
        b.eval("[...document.querySelectorAll('#running thead th, #retrying thead th, #blocked thead th')].filter((th) => th.textContent === 'Workflow').length"),
        3
    );
    assert_eq!(
        b.eval("document.getElementById('workflows-box').hidden"),
        false
    );
    assert_eq!(
        b.eval("[...document.querySelectorAll('#workflows tbody tr')].map((tr) => tr.cells[0].textContent + ' ' + tr.cells[1].textContent + ' ' + tr.cells[3].textContent)"),
        serde_json::json!(["alpha ok 1", "beta ok 2"])
    );
    assert_eq!(
        b.eval("[...document.getElementById('wf-filter').options].map((o) => o.textContent)"),
        serde_json::json!(["all workflows", "alpha", "beta"])
    );
    let mut choose = |name: &str| {
        b.eval(&format!(
            "(() => {{ const f = document.getElementById('wf-filter'); f.value = {}; f.dispatchEvent(new Event('change')); return true; }})()",
            js(name)
        ));
        b.eval(rows)
    };
    assert_eq!(
        choose("beta"),
        serde_json::json!(["beta BOARD-2", "beta BOARD-3"])
    );
    assert_eq!(choose("alpha"), serde_json::json!(["alpha BOARD-1"]));
    assert_eq!(
        choose(""),
        serde_json::json!(["alpha BOARD-1", "beta BOARD-2", "beta BOARD-3"])
    );
}

/// A daemon whose only agent kind meets its limit, watched on one open page: no Cooldowns table
/// before the limit; after it, the table lists the kind with its reset, the agent's words and
/// the scope, and the issue that arrived meanwhile is blocked waiting for that kind's reset.
#[test]
fn the_dashboard_shows_a_cooling_agent_kind_and_the_issue_waiting_for_it() {
    let dir = TestDir::new("browser-cooldown");
    let (words, _) = limit_hours_off();
    let wf = limited_workflow(&dir, &words);
    let mut cmd = svc(&dir);
    cmd.arg("--no-tui").arg(&wf);
    let d = Daemon::start(cmd);
    let mut b = Browser::start(&dir);
    b.goto(&format!("{}/", base_url(&d)));
    // The overview drawn from the daemon's state (the tables' empty rows come from it).
    b.wait(
        "the overview drawn",
        "document.querySelector('#blocked tbody tr.empty')",
    );
    assert_eq!(
        b.eval("document.getElementById('cooldowns-box').hidden"),
        true,
        "no kind cools down yet"
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
    // The page follows the daemon live: no reload.
    b.wait(
        "BOARD-2's blocked row",
        "[...document.querySelectorAll('#blocked tbody tr')].some((tr) => tr.cells[0].textContent === 'BOARD-2')",
    );
    assert_eq!(
        b.eval("document.getElementById('cooldowns-box').hidden"),
        false
    );
    let reset = b.eval(&format!("new Date({}).toLocaleString()", js(&until)));
    let reset = reset.as_str().unwrap();
    assert_eq!(
        b.eval("[...document.querySelectorAll('#cooldowns tbody tr')].map((tr) => [...tr.cells].map((c) => c.textContent))"),
        serde_json::json!([["agent_a", reset, words, "fleet"]])
    );
    assert_eq!(
        b.eval("document.querySelector('#cooldowns tbody tr').cells[1].title"),
        until.as_str()
    );
    let row = b.eval(
        "[...[...document.querySelectorAll('#blocked tbody tr')].find((tr) => tr.cells[0].textContent === 'BOARD-2').cells].map((c) => [c.textContent, c.title])",
    );
    assert_eq!(
        row[2],
        serde_json::json!([format!("agent rate limited: agent_a resets {reset}"), until]),
        "BOARD-2's row: {row}"
    );
}
