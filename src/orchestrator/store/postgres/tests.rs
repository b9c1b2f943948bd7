use super::*;

/// Takes a store of version 4 back to version 3's tables.
const UNDO_4: &str = "DROP TABLE cooldowns;";

/// Takes a store of version 3 back to version 2's tables.
const UNDO_3: &str =
    "ALTER TABLE owners DROP COLUMN ttl_ms, DROP COLUMN boot_id, DROP COLUMN pidns;
    DROP TABLE applied; ALTER TABLE ledger DROP COLUMN xid; ALTER TABLE marks DROP COLUMN nonce;
    DROP FUNCTION identifier_of(text);";

#[test]
fn the_lines_of_daemons_long_gone_are_compacted_into_one() {
    let Some(server) = crate::pg_server::PgServer::shared() else {
        return;
    };
    let target = Target::parse(&server.new_database("compact")).unwrap();
    let mut old = Postgres::open(&target, super::super::tests::owner("old")).unwrap();
    old.sweep(1).unwrap();
    let spent = |usd: f64| Spent {
        cost_usd: usd,
        runs: 1,
        ..Spent::default()
    };
    old.apply(&[Op::Spend("issue:A-1".into(), spent(0.25))])
        .unwrap();
    old.unregister().unwrap();
    drop(old);
    let mut c = target.connect().unwrap();
    c.execute("UPDATE ledger SET at = now() - interval '2 days'")
        .unwrap();
    let mut new = Postgres::open(&target, super::super::tests::owner("new")).unwrap();
    // Past the grace of its first connection, its sweep compacts.
    std::thread::sleep(Duration::from_millis(1100));
    new.sweep(2).unwrap();
    let rows = c
        .query(
            "SELECT owner_id, cost::text AS cost, runs::text AS runs FROM ledger WHERE name = 'issue:A-1' ORDER BY owner_id",
            &[],
        )
        .unwrap();
    let got: Vec<(&str, &str, &str)> = (0..rows.len())
        .map(|i| {
            (
                text(&rows, i, "owner_id"),
                text(&rows, i, "cost"),
                text(&rows, i, "runs"),
            )
        })
        .collect();
    assert_eq!(got, [("*", "0.25", "1"), ("old", "0", "0")]);
    assert_eq!(new.line_cost("issue:A-1").unwrap(), 0.25);
    // A daemon's sweep brings both changes: the emptied line and the gone daemons' line.
    let lines = new.sweep(3).unwrap().ledger;
    assert!(
        lines
            .iter()
            .any(|l| l.owner == GONE_OWNER && l.spent.cost_usd == 0.25)
            && lines.iter().any(|l| l.owner == "old" && l.spent.is_empty()),
        "{lines:?}"
    );
}

#[test]
fn a_malformed_record_is_skipped_by_the_sweep_not_fatal_to_it() {
    let Some(server) = crate::pg_server::PgServer::shared() else {
        return;
    };
    let target = Target::parse(&server.new_database("malformed")).unwrap();
    let mut me = Postgres::open(&target, super::super::tests::owner("me")).unwrap();
    let mut c = target.connect().unwrap();
    c.execute(
        "INSERT INTO owners (owner_id, hostname, pid, heartbeat_at, ttl_ms) VALUES ('other', 'elsewhere', 1, now(), 60000);
         INSERT INTO claims (issue_id, slot, owner_id, run_id, record) VALUES ('id-X-1', 0, 'other', 'r', '{not json');
         INSERT INTO claims (issue_id, slot, owner_id, run_id, record) VALUES ('id-X-2', 0, 'other', 'r', '{\"issue\": {\"identifier\": \"X-2\"}}')",
    )
    .unwrap();
    let sweep = me.sweep(1).expect("one bad row stops no sweep");
    let held: Vec<(&str, &str)> = sweep
        .foreign
        .iter()
        .map(|(k, h)| (k.issue_id.as_str(), h.identifier.as_str()))
        .collect();
    assert_eq!(held, [("id-X-1", ""), ("id-X-2", "X-2")]);
    assert!(me.malformed.iter().any(|m| m.contains("id-X-1")), "said");
}

#[test]
fn tables_of_version_two_are_brought_up_to_date_and_keep_their_rows() {
    let Some(server) = crate::pg_server::PgServer::shared() else {
        return;
    };
    let uri = server.new_database("migrate2");
    let target = Target::parse(&uri).unwrap();
    let owner = super::super::tests::owner("old");
    let mut store = Postgres::open(&target, owner.clone()).unwrap();
    store
        .apply(&[Op::Spend(
            "day:2026-11-27".into(),
            Spent {
                cost_usd: 0.5,
                ..Spent::default()
            },
        )])
        .unwrap();
    drop(store);
    let mut c = target.connect().unwrap();
    c.execute(&format!(
        "{UNDO_4} {UNDO_3} UPDATE meta SET value = '2' WHERE key = 'schema_version'"
    ))
    .unwrap();
    let mut store = Postgres::open(&target, owner).unwrap();
    assert_eq!(store.line_cost("day:2026-11-27").unwrap(), 0.5, "kept");
    store
        .apply_once(
            1,
            &[Op::Spend(
                "day:2026-11-27".into(),
                Spent {
                    cost_usd: 0.25,
                    ..Spent::default()
                },
            )],
        )
        .unwrap();
    store
        .apply_once(
            1,
            &[Op::Spend(
                "day:2026-11-27".into(),
                Spent {
                    cost_usd: 0.25,
                    ..Spent::default()
                },
            )],
        )
        .unwrap();
    assert_eq!(
        store.line_cost("day:2026-11-27").unwrap(),
        0.75,
        "batch 1 applied once"
    );
    let v = c
        .query("SELECT value FROM meta WHERE key = 'schema_version'", &[])
        .unwrap();
    assert_eq!(v.get(0, "value"), Some(SCHEMA_VERSION.to_string().as_str()));
}

#[test]
fn tables_of_the_first_version_are_brought_up_to_date_and_keep_their_rows() {
    let Some(server) = crate::pg_server::PgServer::shared() else {
        return;
    };
    let uri = server.new_database("migrate");
    let target = Target::parse(&uri).unwrap();
    let owner = super::super::tests::owner("old");
    drop(Postgres::open(&target, owner.clone()).unwrap());
    // What version 1 wrote: no durable facts.
    let mut c = target.connect().unwrap();
    c.execute(&format!("{UNDO_4} {UNDO_3} DROP TABLE tallies, marks, ledger; UPDATE meta SET value = '1' WHERE key = 'schema_version'; INSERT INTO steering_seen (key) VALUES ('kept')"))
        .unwrap();
    let mut store = Postgres::open(&target, owner).unwrap();
    assert_eq!(
        store.add_tallies(&[("t".into(), 2.5)]).unwrap(),
        [2.5],
        "the new tables exist"
    );
    store
        .apply(&[Op::Spend(
            "day:2026-11-26".into(),
            Spent {
                cost_usd: 1.5,
                ..Spent::default()
            },
        )])
        .unwrap();
    assert_eq!(store.line_cost("day:2026-11-26").unwrap(), 1.5);
    let rows = c
        .query(
            "SELECT (SELECT value FROM meta WHERE key = 'schema_version') AS v, (SELECT count(*) FROM steering_seen)::text AS n",
            &[],
        )
        .unwrap();
    assert_eq!(rows.get(0, "v"), Some(SCHEMA_VERSION.to_string().as_str()));
    assert_eq!(rows.get(0, "n"), Some("1"), "rows of version 1 are kept");
}

/// A store of version 3 (before cooldowns were kept) gains their table and keeps its rows.
#[test]
fn tables_of_version_three_gain_the_cooldowns() {
    use super::super::tests::cooldown;
    let Some(server) = crate::pg_server::PgServer::shared() else {
        return;
    };
    let target = Target::parse(&server.new_database("migrate3")).unwrap();
    let owner = super::super::tests::owner("old");
    drop(Postgres::open(&target, owner.clone()).unwrap());
    let mut c = target.connect().unwrap();
    c.execute(&format!(
        "{UNDO_4} UPDATE meta SET value = '3' WHERE key = 'schema_version'; INSERT INTO steering_seen (key) VALUES ('kept')"
    ))
    .unwrap();
    let mut store = Postgres::open(&target, owner).unwrap();
    let t0 = crate::time::unix_ms();
    store
        .apply(&[Op::PutCooldown(Box::new(cooldown(
            "claude",
            "host",
            t0,
            t0 + 1000,
        )))])
        .unwrap();
    assert_eq!(
        store.sweep(t0).unwrap().cooldowns,
        [cooldown("claude", "host", t0, t0 + 1000)]
    );
    let rows = c
        .query(
            "SELECT (SELECT value FROM meta WHERE key = 'schema_version') AS v, (SELECT count(*) FROM steering_seen)::text AS n, (SELECT scope FROM cooldowns) AS s",
            &[],
        )
        .unwrap();
    assert_eq!(rows.get(0, "v"), Some(SCHEMA_VERSION.to_string().as_str()));
    assert_eq!(rows.get(0, "n"), Some("1"), "rows of version 3 are kept");
    assert_eq!(rows.get(0, "s"), Some("host:test-host"));
}
