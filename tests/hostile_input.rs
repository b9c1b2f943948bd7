//! Hostile input (issue 7): every input the fuzzers ever crashed on (`tests/fuzz/regressions`)
//! and every seed (`tests/fuzz/seeds`) is replayed through its `svc::fuzzing` target, plus
//! hand-written inputs per target: deep nesting, huge numbers, invalid UTF-8, broken percent
//! escapes, NUL bytes, very long lines, a last line without a newline. A target that panics
//! fails the test; one that overflows its stack aborts the test binary, which fails it too.

use std::path::{Path, PathBuf};

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("workflow", svc::fuzzing::workflow),
    ("query", svc::fuzzing::query),
    ("routing", svc::fuzzing::routing),
    ("acp_reader", svc::fuzzing::acp_reader),
    ("trace_line", svc::fuzzing::trace_line),
    ("webhook", svc::fuzzing::webhook),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz")
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Runs `target` on `input`; a panic becomes an `Err` naming the input.
fn survive(name: &str, target: Target, label: &str, input: &[u8]) -> Result<(), String> {
    std::panic::catch_unwind(|| target(input)).map_err(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        format!("{name} panicked on {label}: {why}")
    })
}

fn check_all(name: &str, inputs: &[(&str, Vec<u8>)]) {
    let target = TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .expect("a known target");
    let failures: Vec<String> = inputs
        .iter()
        .filter_map(|(label, input)| {
            // Shown with --nocapture: the last label names an input that aborted the process.
            eprintln!("{name}: {label}");
            survive(name, target, label, input).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_saved_regression_and_seed_replays() {
    let mut failures = Vec::new();
    let mut replayed = 0;
    for (name, target) in TARGETS {
        for kind in ["regressions", "seeds"] {
            let mut files = Vec::new();
            files_under(&fuzz_dir().join(kind).join(name), &mut files);
            files.sort();
            for path in files {
                let input = std::fs::read(&path).expect("a readable fuzz input");
                replayed += 1;
                if let Err(e) = survive(name, *target, &path.display().to_string(), &input) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        replayed > 0,
        "no seeds or regressions found under tests/fuzz"
    );
}

fn nested(open: &str, inner: &str, close: &str, depth: usize) -> String {
    format!("{}{inner}{}", open.repeat(depth), close.repeat(depth))
}

fn long_line(n: usize) -> String {
    "x".repeat(n)
}

#[test]
fn workflow_survives_hostile_files() {
    let fm = |yaml: &str| format!("---\n{yaml}\n---\nBody {{{{ issue.title }}}}\n").into_bytes();
    let deep_flow = nested("[", "1", "]", 10_000);
    let deep_block: String = (0..3_000)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect();
    let laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\ntracker: *f";
    let deep_liquid = format!(
        "---\ntracker:\n  kind: memory\n---\n{}",
        nested("{% if a %}", "x", "{% endif %}", 5_000)
    );
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("only the opening ruler", b"---".to_vec()),
        ("BOM and rulers", "\u{feff}---\n---\n".as_bytes().to_vec()),
        ("deep flow sequence", fm(&format!("tracker: {deep_flow}"))),
        ("deep block mapping", fm(&deep_block)),
        (
            "deep JSON-style mapping",
            fm(&nested("{a: ", "1", "}", 5_000)),
        ),
        ("alias expansion", fm(laughs)),
        ("recursive alias", fm("a: &a [*a]")),
        (
            "huge numbers",
            fm(
                "tracker:\n  kind: memory\npolling:\n  interval_ms: 1e400\nserver:\n  port: 99999999999999999999999\nagent:\n  max_turns: -99999999999999999999\n  max_concurrent_agents: 18446744073709551616",
            ),
        ),
        (
            "ports out of range",
            fm("tracker:\n  kind: memory\nserver:\n  port: 70000\n  mcp_port: -1"),
        ),
        (
            "NaN and infinity",
            fm(
                "tracker:\n  kind: memory\npolling:\n  interval_ms: .nan\nhooks:\n  timeout_ms: .inf",
            ),
        ),
        ("NUL bytes", fm("tracker:\n  kind: \"mem\0ory\"\n\0: x")),
        (
            "invalid UTF-8",
            [b"---\ntracker:\n  kind: \xff\xfe\n---\n\xc3".as_slice()].concat(),
        ),
        (
            "op reference without op",
            fm(
                "tracker:\n  kind: tracker-a\n  api_key: op://vault/item/field\n  project_slugs: [x]",
            ),
        ),
        (
            "env reference",
            fm("tracker:\n  kind: tracker-a\n  api_key: $FUZZ_TOKEN\n  project_slugs: [x]"),
        ),
        (
            "non-string keys",
            fm("? [a, b]\n: c\n1: 2\ntrue: false\n~: null"),
        ),
        (
            "tags",
            fm("tracker: !custom {kind: memory}\nagent: !!binary aGVsbG8="),
        ),
        (
            "100k-character value",
            fm(&format!("tracker:\n  kind: {}", long_line(100_000))),
        ),
        ("deep liquid", deep_liquid.into_bytes()),
        (
            "broken liquid",
            fm("tracker:\n  kind: memory")
                .into_iter()
                .chain(b"{% for %}{{ | }}{% endif".iter().copied())
                .collect(),
        ),
        (
            "no newline at EOF",
            b"---\ntracker:\n  kind: memory\n---".to_vec(),
        ),
        (
            "CR line ends",
            b"---\r\ntracker:\r\n  kind: memory\r\n---\r\nx".to_vec(),
        ),
    ];
    check_all("workflow", &inputs);
}

#[test]
fn query_survives_hostile_arguments() {
    let pred = r#"{"field":"id","op":"exists","value":true}"#;
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("deep not", format!(r#"{{"where":{}}}"#, nested(r#"{"not":"#, pred, "}", 200)).into_bytes()),
        ("deep JSON", nested("[", "", "]", 100_000).into_bytes()),
        ("deep and", format!(r#"{{"where":{}}}"#, nested(r#"{"and":["#, pred, "]}", 127)).into_bytes()),
        ("huge limit and offset", br#"{"limit":1e300,"offset":18446744073709551615}"#.to_vec()),
        ("max limit and offset", br#"{"limit":9223372036854775807,"offset":9223372036854775807}"#.to_vec()),
        ("negative zero", br#"{"limit":-0,"offset":-0.0}"#.to_vec()),
        ("huge numbers compared", br#"{"where":{"field":"priority","op":"lt","value":1e308},"order_by":[{"field":"priority","dir":"desc"},{"field":"id"}]}"#.to_vec()),
        ("u64 vs i64", br#"{"where":{"field":"priority","op":"in","value":[18446744073709551615,-9223372036854775808,0.0]}}"#.to_vec()),
        ("NUL in field", b"{\"where\":{\"field\":\"i\\u0000d\",\"op\":\"contains\",\"value\":\"\\u0000\",\"ci\":true},\"select\":[\"\\u0000\"]}".to_vec()),
        ("unicode case folding", r#"{"where":{"field":"title","op":"contains","value":"İSTANBUL ǅ ß","ci":true}}"#.as_bytes().to_vec()),
        ("invalid UTF-8", b"{\"where\":\"\xff\"}".to_vec()),
        ("records from input", br#"{"records":[{"id":1e308},{"id":null},{"id":[]}],"order_by":[{"field":"id"}]}"#.to_vec()),
        ("many nodes", format!(r#"{{"where":{{"or":[{}]}}}}"#, vec![pred; 5_000].join(",")).into_bytes()),
        ("100k-character value", format!(r#"{{"where":{{"field":"title","op":"contains","value":"{}","ci":true}}}}"#, long_line(100_000)).into_bytes()),
        ("wrong types everywhere", br#"{"where":[],"select":{},"order_by":"id","limit":"1","offset":null}"#.to_vec()),
    ];
    check_all("query", &inputs);
}

#[test]
fn routing_survives_hostile_targets() {
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("percent at the end", b"/api/v1/A-1%".to_vec()),
        (
            "percent and one digit",
            b"/api/v1/tickets/%4/events".to_vec(),
        ),
        ("bad escape", b"/assets/%ZZ".to_vec()),
        ("escape that is not UTF-8", b"/api/v1/%FF%FE".to_vec()),
        ("escape splitting a character", b"/api/v1/%E2%9C".to_vec()),
        ("multibyte after percent", "/api/v1/%✅".as_bytes().to_vec()),
        (
            "percent before multibyte",
            "/api/v1/a%é1".as_bytes().to_vec(),
        ),
        ("NUL bytes", b"/api/v1/\0%00?id=%00&\0=\0".to_vec()),
        ("encoded slash", b"/api/v1/tickets/a%2Fb/exists".to_vec()),
        ("empty ticket", b"/api/v1/tickets//events".to_vec()),
        ("only the prefix", b"/api/v1/tickets/".to_vec()),
        ("traversal", b"/assets/../../etc/passwd".to_vec()),
        (
            "encoded traversal",
            b"/assets/%2e%2e/%2e%2e/etc/passwd".to_vec(),
        ),
        ("invalid UTF-8", b"/api/v1/\xff\xfe?\xc3=\xa9".to_vec()),
        (
            "huge limit",
            b"/api/v1/runs?limit=99999999999999999999999&limit=-9223372036854775808".to_vec(),
        ),
        (
            "query oddities",
            b"/api/v1/runs?&&=&==&%=%&+%2B+=%ZZ&failed=ON&cost=%31".to_vec(),
        ),
        ("run id", b"/api/v1/runs?id=%&retries=yes".to_vec()),
        (
            "100k-character path",
            format!("/api/v1/{}", "%41".repeat(33_000)).into_bytes(),
        ),
        (
            "100k-character query",
            format!("/?{}", "a=b&".repeat(25_000)).into_bytes(),
        ),
        ("no leading slash", b"api/v1/state".to_vec()),
    ];
    check_all("routing", &inputs);
}

#[test]
fn acp_reader_survives_hostile_streams() {
    // The first byte picks the longest line (0: the daemon's own 16 MiB limit).
    let with = |max: u8, rest: &[u8]| [&[max][..], rest].concat();
    let deep = nested("[", "", "]", 100_000);
    let deep_ok = format!(r#"{{"method":"x","params":{}}}"#, nested("[", "", "]", 126));
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("deep JSON", with(0, deep.as_bytes())),
        (
            "deep JSON just under the limit",
            with(0, deep_ok.as_bytes()),
        ),
        (
            "deep objects",
            with(0, nested(r#"{"a":"#, "1", "}", 127).as_bytes()),
        ),
        ("huge numbers", with(0, br#"{"id":1e999,"method":"x"}"#)),
        (
            "huge integer",
            with(
                0,
                format!(r#"{{"id":{},"method":"x"}}"#, "9".repeat(10_000)).as_bytes(),
            ),
        ),
        ("invalid UTF-8", with(0, b"{\"method\":\"\xff\"}\n\xc3\n")),
        ("NUL bytes", with(0, b"\0\0\n{\"method\":\"a\0\"}\n\0")),
        (
            "100k-character line",
            with(0, format!("{}\n{{}}\n", long_line(100_000)).as_bytes()),
        ),
        (
            "100k-character line over a small limit",
            with(17, format!("{}\n{{}}\n", long_line(100_000)).as_bytes()),
        ),
        ("line exactly at the limit", with(4, b"{}  \n{}   \n{}    ")),
        ("limit of one", with(1, b"a\nbb\n\n\nccc")),
        (
            "no newline at EOF",
            with(0, br#"{"method":"session/update"}"#),
        ),
        ("only newlines", with(0, &[b'\n'; 1000])),
        (
            // Updates take a fast path; odd shapes must be found as the parsed line says.
            "session updates of every shape",
            with(
                0,
                concat!(
                    "{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{\"sessionId\":\"s\",\"update\":{\"sessionUpdate\":\"agent_message_chunk\",\"content\":{\"type\":\"text\",\"text\":\"a\\u00e9\"}}}}\n",
                    "{\"method\":\"session/update\",\"id\":null,\"params\":{\"update\":{}}}\n",
                    "{\"method\":\"session/update\",\"params\":{\"update\":null}}\n",
                    "{\"method\":\"session/update\",\"params\":null}\n",
                    "{\"method\":\"session/update\",\"params\":[1]}\n",
                    "{\"method\":\"session/update\",\"params\":{\"update\":1},\"params\":{\"update\":2}}\n",
                    "{\"method\":\"session/prompt\",\"params\":{\"update\":{}}}\n",
                    "{\"method\":7,\"params\":{\"update\":{}}}\n",
                    "[\"session/update\",null,{\"update\":{}}]\n",
                    "{\"method\":\"session/update\",\"params\":{\"update\":{\"a\":1}}} trailing\n",
                )
                .as_bytes(),
            ),
        ),
        ("CR only", with(0, b"{}\r{}\r")),
        (
            "multibyte cut by the limit",
            with(3, "✅✅✅\n✅\n".as_bytes()),
        ),
    ];
    check_all("acp_reader", &inputs);
}

#[test]
fn trace_line_survives_hostile_files() {
    // The first byte seeds the chunk sizes.
    let with = |seed: u8, rest: &str| [&[seed][..], rest.as_bytes()].concat();
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        (
            "deep JSON",
            with(1, &format!("{}\n", nested("[", "", "]", 100_000))),
        ),
        (
            "deep update",
            with(
                2,
                &format!(
                    "{{\"type\":\"plan\",\"update\":{{\"entries\":{}}}}}\n",
                    nested("[", "", "]", 126)
                ),
            ),
        ),
        (
            // The writer's own chunk lines take a fast path; odd fields must give what the
            // parsed-tree path gives (the fuzz entry point compares the two).
            "chunk lines of every shape",
            with(
                5,
                concat!(
                    "{\"type\":\"agent_message_chunk\",\"at\":\"t1\",\"runId\":\"r\",\"identifier\":\"A-1\",\"update\":{\"content\":{\"text\":\"a\\u00e9\\n\"}}}\n",
                    "{\"type\":\"agent_message_chunk\",\"runId\":\"r\",\"update\":{\"content\":{\"text\":\"b\"}}}\n",
                    "{\"type\":\"agent_message_chunk\",\"runId\":7,\"update\":{\"content\":{\"text\":\"c\"}}}\n",
                    "{\"type\":\"agent_message_chunk\",\"runId\":7,\"update\":{\"content\":{\"text\":\"d\"}}}\n",
                    "{\"type\":\"agent_message_chunk\",\"runId\":null,\"update\":{\"content\":{\"text\":\"e\"}}}\n",
                    "{\"type\":\"agent_message_chunk\",\"update\":{\"content\":{\"text\":\"f\"}}}\n",
                    "{\"type\":\"agent_message_chunk\",\"at\":5,\"update\":{\"content\":[1]}}\n",
                    "{\"type\":\"agent_thought_chunk\",\"update\":{\"content\":{\"text\":5}}}\n",
                    "{\"type\":\"agent_thought_chunk\",\"update\":\"x\",\"update\":{\"content\":{\"text\":\"g\"}}}\n",
                    "{\"type\":\"user_message_chunk\",\"runId\":\"r\",\"update\":null}\n",
                    "{\"type\":\"user_message_chunk\",\"runId\":\"r\",\"update\":{\"content\":null}}\n",
                    "{\"type\":\"agent_message_chunk\",\"type\":\"plan\",\"update\":{\"entries\":[]}}\n",
                ),
            ),
        ),
        (
            "tool call update before and after",
            with(
                3,
                "{\"type\":\"tool_call_update\",\"update\":{\"toolCallId\":\"\"}}\n{\"type\":\"tool_call\",\"at\":\"9999-12-31T23:59:59Z\",\"update\":{\"toolCallId\":\"\"}}\n{\"type\":\"tool_call_update\",\"at\":\"0000-01-01T00:00:00Z\",\"update\":{\"toolCallId\":\"\",\"status\":\"completed\"}}\n",
            ),
        ),
        (
            "odd timestamps",
            with(
                4,
                "{\"type\":\"tool_call\",\"at\":\"1970-01-01T00:00:00Z\",\"update\":{\"toolCallId\":\"a\"}}\n{\"type\":\"tool_call_update\",\"at\":\"1969-12-31T23:59:59.999999999Z\",\"update\":{\"toolCallId\":\"a\",\"status\":\"failed\"}}\n{\"type\":\"tool_call_update\",\"at\":\"2026-02-30T25:61:61.1234567890123Z\",\"update\":{\"toolCallId\":\"a\",\"status\":\"completed\"}}\n",
            ),
        ),
        (
            "huge numbers",
            with(
                5,
                "{\"type\":\"max_turns_reached\",\"maxTurns\":1e999}\n{\"type\":\"turn_started\",\"turn\":-1e308}\n",
            ),
        ),
        (
            "wrong types",
            with(
                6,
                "{\"type\":\"agent_message_chunk\",\"update\":[],\"runId\":{}}\n{\"type\":\"plan\",\"update\":5}\n[]\n5\n\"type\"\n{\"type\":null}\n",
            ),
        ),
        (
            "NUL bytes",
            with(7, "\0\n{\"type\":\"hook\",\"hook\":\"\\u0000\"}\n\0\0"),
        ),
        (
            "invalid UTF-8 lines",
            [&[8u8][..], b"\xff\xfe\n{\"type\":\"\xc3\"}\n"].concat(),
        ),
        (
            "100k-character line",
            with(
                9,
                &format!(
                    "{{\"type\":\"agent_message_chunk\",\"update\":{{\"content\":{{\"text\":\"{}\"}}}}}}\n",
                    long_line(100_000)
                ),
            ),
        ),
        (
            "no newline at EOF",
            with(10, "{\"type\":\"hook\"}\n{\"type\":\"hook\"}"),
        ),
        (
            "CRLF",
            with(11, "{\"type\":\"hook\"}\r\n{\"type\":\"hook\"}\r\n"),
        ),
        (
            "coalescing many chunks",
            with(
                12,
                &"{\"type\":\"agent_thought_chunk\",\"update\":{\"content\":{\"text\":\"ab\"}}}\n"
                    .repeat(2_000),
            ),
        ),
    ];
    check_all("trace_line", &inputs);
}

#[test]
fn webhook_survives_hostile_deliveries() {
    let deep = nested("[", "", "]", 100_000);
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("only a route", vec![1]),
        ("deep JSON, each route", [0u8, 1, 2].iter().flat_map(|r| {
            let mut v = vec![*r, b'x', b'\n'];
            v.extend_from_slice(deep.as_bytes());
            v
        }).collect()),
        ("invalid UTF-8 header", b"\x00\xff\xfe\n{}".to_vec()),
        ("NUL bytes", b"\x02\x00\x00\n\x00{\"webhookEvent\":\"comment_created\"}".to_vec()),
        ("huge timestamp", b"\x01x\n{\"type\":\"Issue\",\"webhookTimestamp\":1e400}".to_vec()),
        ("multibyte signature", "\u{0}sha256=\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\n{}".as_bytes().to_vec()),
        ("long body", {
            let mut v = b"\x00issues\n".to_vec();
            v.extend(long_line(1 << 20).into_bytes());
            v
        }),
    ];
    check_all("webhook", &inputs);
}
