//! `svc store copy` for the `postgres` kind: everything the store holds out (`export`) and
//! in (`import`), while no daemon uses it.

use super::*;

/// Opens the store for `svc store copy`, refusing one a daemon uses now (a heartbeat within
/// the default TTL).
pub(super) fn open_idle(target: &Target) -> Result<Conn, String> {
    let mut conn = target.connect()?;
    prepare(&mut conn, target)?;
    let ttl = seconds(super::super::DEFAULT_TTL_MS);
    let users = conn
        .query(
            "SELECT owner_id || ' (' || hostname || ', pid ' || pid || ')' AS who FROM owners
              WHERE heartbeat_at >= now() - make_interval(secs => $1::double precision)",
            &[Some(&ttl)],
        )
        .map_err(|e| format!("claim store {}: {e}", target.shown()))?;
    if users.is_empty() {
        return Ok(conn);
    }
    let who: Vec<&str> = (0..users.len()).map(|i| text(&users, i, "who")).collect();
    Err(format!(
        "claim store {}: daemon {} uses it; stop every daemon on it first",
        target.shown(),
        who.join(", ")
    ))
}

/// Everything the store holds that a move must not lose (`svc store copy`).
pub fn export(target: &Target) -> Result<super::super::Dump, String> {
    use super::super::{Dump, SlotRow};
    let mut c = open_idle(target)?;
    let fail = |e: crate::pq::Error| format!("claim store {}: {e}", target.shown());
    let mut all = |sql: &str| c.query(sql, &[]).map_err(fail);
    let slots = |rows: Rows| -> Vec<SlotRow> {
        (0..rows.len())
            .map(|i| SlotRow {
                issue_id: text(&rows, i, "issue_id").to_string(),
                slot: text(&rows, i, "slot").parse().unwrap_or(0),
                owner_id: text(&rows, i, "owner_id").to_string(),
                record: text(&rows, i, "record").to_string(),
                token: rows.get(i, "token").and_then(|t| t.parse().ok()),
            })
            .collect()
    };
    let claims = slots(all(
        "SELECT issue_id, slot, owner_id, record, token FROM claims ORDER BY issue_id, slot",
    )?);
    let retries = slots(all(
        "SELECT issue_id, slot, owner_id, record, token FROM retries ORDER BY issue_id, slot",
    )?);
    let runs = all("SELECT run_id, ended_at, record FROM runs ORDER BY ended_at")?;
    let steering = all("SELECT key, owner_id, issue_id, record FROM steering ORDER BY seq")?;
    let seen = all("SELECT key FROM steering_seen ORDER BY seq")?;
    let cursors = all("SELECT owner_id, source, cursor FROM cursors")?;
    let tallies = all("SELECT name, value::text AS value FROM tallies ORDER BY name")?;
    let marks = all("SELECT scope, key FROM marks ORDER BY seq")?;
    let ledger = all(
        "SELECT name AS a, owner_id AS b, input::text AS c, output::text AS d, total::text AS e,
         cost::text AS f, runs::text AS g FROM ledger ORDER BY name, owner_id",
    )?;
    let cooldowns = all(
        "SELECT scope AS a, kind AS b, until_ms::text AS c, since_ms::text AS d, reason AS e
         FROM cooldowns ORDER BY scope, kind",
    )?;
    Ok(Dump {
        cooldowns: (0..cooldowns.len())
            .map(|i| cooldown_row(&cooldowns, i))
            .collect(),
        ledger: (0..ledger.len()).map(|i| ledger_row(&ledger, i)).collect(),
        tallies: (0..tallies.len())
            .map(|i| {
                let value = text(&tallies, i, "value").parse().unwrap_or(0.0);
                (text(&tallies, i, "name").to_string(), value)
            })
            .collect(),
        marks: (0..marks.len())
            .map(|i| {
                (
                    text(&marks, i, "scope").to_string(),
                    text(&marks, i, "key").to_string(),
                )
            })
            .collect(),
        claims,
        retries,
        runs: (0..runs.len())
            .map(|i| {
                (
                    text(&runs, i, "run_id").to_string(),
                    text(&runs, i, "ended_at").parse().unwrap_or(0),
                    text(&runs, i, "record").to_string(),
                )
            })
            .collect(),
        steering: (0..steering.len())
            .map(|i| {
                (
                    text(&steering, i, "key").to_string(),
                    text(&steering, i, "owner_id").to_string(),
                    text(&steering, i, "issue_id").to_string(),
                    text(&steering, i, "record").to_string(),
                )
            })
            .collect(),
        seen: (0..seen.len())
            .map(|i| text(&seen, i, "key").to_string())
            .collect(),
        cursors: (0..cursors.len())
            .map(|i| {
                (
                    text(&cursors, i, "owner_id").to_string(),
                    text(&cursors, i, "source").to_string(),
                    text(&cursors, i, "cursor").to_string(),
                )
            })
            .collect(),
    })
}

/// Writes `dump` into the store (its tables created when missing), in one transaction; rows
/// it has already are kept.
pub fn import(target: &Target, dump: &super::super::Dump) -> Result<(), String> {
    let mut c = open_idle(target)?;
    let fail = |e: crate::pq::Error| format!("claim store {}: {e}", target.shown());
    let result = (|| -> Result<(), crate::pq::Error> {
        c.execute("BEGIN")?;
        for r in &dump.claims {
            let run_id = serde_json::from_str::<serde_json::Value>(&r.record)
                .ok()
                .and_then(|v| v["run_id"].as_str().map(str::to_string))
                .unwrap_or_default();
            let (slot, token) = (r.slot.to_string(), r.token.unwrap_or(0).to_string());
            c.query(
                "INSERT INTO claims (issue_id, slot, owner_id, run_id, record, token)
                 VALUES ($1, $2::integer, $3, $4, $5, $6::bigint) ON CONFLICT DO NOTHING",
                &[
                    Some(&r.issue_id),
                    Some(&slot),
                    Some(&r.owner_id),
                    Some(&run_id),
                    Some(&r.record),
                    Some(&token),
                ],
            )?;
        }
        for r in &dump.retries {
            let slot = r.slot.to_string();
            let token = r.token.map(|t| t.to_string());
            c.query(
                "INSERT INTO retries (issue_id, slot, owner_id, record, token)
                 VALUES ($1, $2::integer, $3, $4, $5::bigint) ON CONFLICT DO NOTHING",
                &[
                    Some(&r.issue_id),
                    Some(&slot),
                    Some(&r.owner_id),
                    Some(&r.record),
                    token.as_deref(),
                ],
            )?;
        }
        for (id, end, record) in &dump.runs {
            let end = end.to_string();
            c.query(
                "INSERT INTO runs (run_id, ended_at, record) VALUES ($1, $2::bigint, $3) ON CONFLICT DO NOTHING",
                &[Some(id), Some(&end), Some(record)],
            )?;
        }
        for (key, owner, issue, record) in &dump.steering {
            c.query(
                "INSERT INTO steering (key, owner_id, issue_id, record) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                &[Some(key), Some(owner), Some(issue), Some(record)],
            )?;
        }
        for key in &dump.seen {
            c.query(
                "INSERT INTO steering_seen (key) VALUES ($1) ON CONFLICT DO NOTHING",
                &[Some(key)],
            )?;
        }
        for (name, value) in &dump.tallies {
            let value = value.to_string();
            c.query(
                "INSERT INTO tallies (name, value) VALUES ($1, $2::double precision) ON CONFLICT DO NOTHING",
                &[Some(name), Some(&value)],
            )?;
        }
        for (scope, key) in &dump.marks {
            c.query(
                "INSERT INTO marks (scope, key) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[Some(scope), Some(key)],
            )?;
        }
        for line in &dump.ledger {
            add_spend(&mut c, &line.name, &line.owner, &line.spent, false)?;
        }
        for row in &dump.cooldowns {
            put_cooldown(&mut c, row)?;
        }
        for (owner, source, cursor) in &dump.cursors {
            c.query(
                "INSERT INTO cursors (owner_id, source, cursor) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                &[Some(owner), Some(source), Some(cursor)],
            )?;
        }
        // Tokens only grow: the next claim's is above every copied one.
        let max = dump.max_token().to_string();
        c.query(
            "SELECT setval('fence', greatest($1::bigint, (SELECT last_value FROM fence)))",
            &[Some(&max)],
        )?;
        c.execute("COMMIT")?;
        Ok(())
    })();
    result.map_err(fail)
}
