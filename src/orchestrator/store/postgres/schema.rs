//! The `postgres` kind's schema: its tables, the migrations from earlier versions, the
//! ledger's compaction, and preparing a schema (created, or its version checked).

use super::*;

/// The layout this svc writes; a database with a larger one is refused.
pub const SCHEMA_VERSION: u32 = 4;

/// What brings a database from each earlier version to the next (index 0: from version 1),
/// applied in one transaction by the first daemon of the newer svc that opens it.
pub(super) const MIGRATIONS: &[&str] = &[
    // 2: the durable facts (`crate::facts`) and the spend ledger.
    "CREATE TABLE tallies (name text PRIMARY KEY, value double precision NOT NULL);
     CREATE TABLE marks (scope text NOT NULL, key text NOT NULL, seq bigserial, PRIMARY KEY (scope, key));
     CREATE TABLE ledger (name text NOT NULL, owner_id text NOT NULL, input bigint NOT NULL DEFAULT 0,
  output bigint NOT NULL DEFAULT 0, total bigint NOT NULL DEFAULT 0, cost double precision NOT NULL DEFAULT 0,
  runs bigint NOT NULL DEFAULT 0, at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (name, owner_id));
CREATE INDEX ledger_by_time ON ledger (at);",
    // 3: what faults need: each owner's TTL and where its pid means something, the batches
    // applied (a batch whose COMMIT answer was lost is not applied twice), the ledger read by
    // transaction ids (a cursor that cannot skip a change), and a record's identifier read
    // without failing on a malformed record.
    MIGRATION_3,
    // 4: agent kinds' cooldowns after a rate limit (one row per scope and kind).
    MIGRATION_4,
];

/// Schema version 3's additions (see [`MIGRATIONS`]), also part of a new store's tables.
pub(super) const MIGRATION_3: &str = "
ALTER TABLE owners ADD COLUMN ttl_ms bigint, ADD COLUMN boot_id text, ADD COLUMN pidns text;
CREATE TABLE applied (owner_id text NOT NULL, batch bigint NOT NULL, at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (owner_id, batch));
ALTER TABLE ledger ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE marks ADD COLUMN nonce text;
CREATE FUNCTION identifier_of(record text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN
  RETURN coalesce(record::json->'issue'->>'identifier', '');
EXCEPTION WHEN others THEN
  RETURN NULL;
END $f$;
";

/// Schema version 4's additions (see [`MIGRATIONS`]), also part of a new store's tables: the
/// cooldowns, one row per scope key (`fleet`, `host:<hostname>`) and kind; times are the
/// writing daemon's clock, as the state keeps them.
pub(super) const MIGRATION_4: &str = "
CREATE TABLE cooldowns (scope text NOT NULL, kind text NOT NULL, until_ms bigint NOT NULL,
  since_ms bigint NOT NULL, reason text NOT NULL, PRIMARY KEY (scope, kind));
";

/// The ledger's compaction: the lines of daemons gone (no heartbeat row) and unchanged for a
/// day are added to the one line of the daemons gone ([`GONE_OWNER`]) and emptied, so sweeps
/// bring the change to every daemon (which then holds the emptied lines no more); emptied lines
/// are deleted a day later. Without it, every start adds an owner's lines for good.
pub(super) const COMPACT: &str = "
WITH old AS (
  SELECT name, owner_id, input, output, total, cost, runs FROM ledger
   WHERE owner_id <> '*' AND owner_id NOT IN (SELECT owner_id FROM owners)
     AND at < now() - interval '1 day' AND (input, output, total, cost, runs) <> (0, 0, 0, 0, 0)
   FOR UPDATE SKIP LOCKED
), emptied AS (
  UPDATE ledger l SET input = 0, output = 0, total = 0, cost = 0, runs = 0, at = now(), xid = pg_current_xact_id()
    FROM old WHERE l.name = old.name AND l.owner_id = old.owner_id
  RETURNING l.name
)
INSERT INTO ledger (name, owner_id, input, output, total, cost, runs, at)
SELECT name, '*', sum(input), sum(output), sum(total), sum(cost), sum(runs), now() FROM old GROUP BY name
ON CONFLICT (name, owner_id) DO UPDATE SET input = ledger.input + EXCLUDED.input,
  output = ledger.output + EXCLUDED.output, total = ledger.total + EXCLUDED.total,
  cost = ledger.cost + EXCLUDED.cost, runs = ledger.runs + EXCLUDED.runs, at = now(), xid = pg_current_xact_id();
DELETE FROM ledger WHERE owner_id <> '*' AND owner_id NOT IN (SELECT owner_id FROM owners)
  AND (input, output, total, cost, runs) = (0, 0, 0, 0, 0) AND at < now() - interval '1 day';
";

/// The tables (created in an empty schema).
pub(super) const TABLES: &str = "
CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL);
CREATE SEQUENCE fence;
CREATE TABLE owners (owner_id text PRIMARY KEY, hostname text NOT NULL, pid integer NOT NULL,
  heartbeat_at timestamptz NOT NULL, workflow text NOT NULL DEFAULT '', url text,
  started_at bigint NOT NULL DEFAULT 0, running integer NOT NULL DEFAULT 0);
CREATE TABLE claims (issue_id text NOT NULL, slot integer NOT NULL, owner_id text NOT NULL,
  run_id text NOT NULL, token bigint NOT NULL DEFAULT 0, record text NOT NULL, PRIMARY KEY (issue_id, slot));
CREATE INDEX claims_by_owner ON claims (owner_id);
CREATE TABLE retries (issue_id text NOT NULL, slot integer NOT NULL, owner_id text NOT NULL,
  token bigint, record text NOT NULL, PRIMARY KEY (issue_id, slot));
CREATE INDEX retries_by_owner ON retries (owner_id);
CREATE TABLE revoked (token bigint PRIMARY KEY);
CREATE TABLE released (issue_id text NOT NULL, slot integer NOT NULL, owner_id text NOT NULL,
  released_at bigint NOT NULL, PRIMARY KEY (issue_id, slot));
CREATE TABLE runs (run_id text PRIMARY KEY, ended_at bigint NOT NULL, record text NOT NULL, seq bigserial);
CREATE INDEX runs_by_end ON runs (ended_at);
CREATE TABLE steering (key text PRIMARY KEY, owner_id text NOT NULL, issue_id text NOT NULL,
  record text NOT NULL, seq bigserial);
CREATE INDEX steering_by_owner ON steering (owner_id);
CREATE TABLE steering_seen (key text PRIMARY KEY, seq bigserial);
CREATE TABLE cursors (owner_id text NOT NULL, source text NOT NULL, cursor text NOT NULL,
  PRIMARY KEY (owner_id, source));
CREATE TABLE relay (id bigserial PRIMARY KEY, to_owner text NOT NULL, record text NOT NULL);
CREATE INDEX relay_by_owner ON relay (to_owner);
CREATE TABLE tallies (name text PRIMARY KEY, value double precision NOT NULL);
CREATE TABLE marks (scope text NOT NULL, key text NOT NULL, seq bigserial, PRIMARY KEY (scope, key));
CREATE TABLE ledger (name text NOT NULL, owner_id text NOT NULL, input bigint NOT NULL DEFAULT 0,
  output bigint NOT NULL DEFAULT 0, total bigint NOT NULL DEFAULT 0, cost double precision NOT NULL DEFAULT 0,
  runs bigint NOT NULL DEFAULT 0, at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (name, owner_id));
CREATE INDEX ledger_by_time ON ledger (at);
";

/// Creates the schema and its tables when missing, and checks the version of one that is
/// there: one daemon at a time (an advisory lock), so daemons starting together agree.
pub(super) fn prepare(conn: &mut Conn, target: &Target) -> Result<(), String> {
    let shown = target.shown();
    let fail = |e: crate::pq::Error| format!("claim store {shown}: {e}");
    let lock = format!(
        "SELECT pg_advisory_lock(hashtext('svc schema {}'))",
        target.schema
    );
    conn.execute(&lock).map_err(fail)?;
    let result = (|| {
        conn.execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", target.schema))
            .map_err(fail)?;
        let has_meta = conn
            .query(
                "SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'meta'",
                &[Some(&target.schema)],
            )
            .map_err(fail)?;
        if has_meta.is_empty() {
            conn.execute(&format!(
                "BEGIN; {TABLES} {MIGRATION_3} {MIGRATION_4} INSERT INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}'); COMMIT;"
            ))
            .map_err(fail)?;
            return Ok(());
        }
        let version = conn
            .query("SELECT value FROM meta WHERE key = 'schema_version'", &[])
            .map_err(fail)?;
        let found: u32 = version
            .get(0, "value")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if found > SCHEMA_VERSION {
            return Err(format!(
                "claim store {shown}: its tables are schema version {found}, written by a newer svc; this svc knows version {SCHEMA_VERSION}. Upgrade svc on this host, or name another schema (?schema=...)"
            ));
        }
        if (1..SCHEMA_VERSION).contains(&found) {
            let steps: String = MIGRATIONS[found as usize - 1..].concat();
            conn.execute(&format!(
                "BEGIN; {steps} UPDATE meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema_version'; COMMIT;"
            ))
            .map_err(fail)?;
            log::info!(
                "claim store {shown}: tables brought from schema version {found} to {SCHEMA_VERSION}"
            );
            return Ok(());
        }
        if found < SCHEMA_VERSION {
            return Err(format!(
                "claim store {shown}: its tables are schema version {found}, which this svc (version {SCHEMA_VERSION}) cannot read; name another schema (?schema=...)"
            ));
        }
        Ok(())
    })();
    let unlock = format!(
        "SELECT pg_advisory_unlock(hashtext('svc schema {}'))",
        target.schema
    );
    let _ = conn.execute(&unlock);
    result
}
