//! `svc store copy <FROM> <TO>`: what a claim store holds, into another, while no daemon uses
//! either, so a team moving from an SQLite file to a shared PostgreSQL store (or back) loses
//! nothing. Rows keep their owners: the first daemon on the new store finds those owners dead
//! and takes their retries, runs in flight (as retries), steering and cursors over.

use super::{Config, postgres, sqlite};
use crate::env::Env;

/// Copies `from` into `to` (each an SQLite file's path or a PostgreSQL URI) and says what it
/// copied.
pub fn run(from: &str, to: &str, env: &Env) -> Result<String, String> {
    let open = |s: &str, must_exist: bool| -> Result<Config, String> {
        if s == "memory" {
            return Err("the memory store lives in a daemon's process only; copy from or to an SQLite file or a postgres:// URI".into());
        }
        if crate::pq::is_uri(s) {
            return Ok(Config::Postgres(postgres::Target::parse(s)?));
        }
        let path = env.resolve_path(s);
        if must_exist && !path.is_file() {
            return Err(format!("{}: no such claim store file", path.display()));
        }
        Ok(Config::Sqlite(path))
    };
    let (source, target) = (open(from, true)?, open(to, false)?);
    if source == target {
        return Err("FROM and TO are the same store".into());
    }
    let dump = match &source {
        Config::Sqlite(path) => sqlite::export(path)?,
        Config::Postgres(t) => postgres::export(t)?,
        Config::Memory => unreachable!("refused above"),
    };
    match &target {
        Config::Sqlite(path) => sqlite::import(path, &dump)?,
        Config::Postgres(t) => postgres::import(t, &dump)?,
        Config::Memory => unreachable!("refused above"),
    }
    let shown = |c: &Config| match c {
        Config::Sqlite(p) => p.display().to_string(),
        Config::Postgres(t) => t.shown(),
        Config::Memory => "memory".into(),
    };
    Ok(format!(
        "copied {} pending retries, {} runs in flight (retried by the next daemon), {} finished runs, {} waiting steering messages, {} taken steering keys, {} cursors, {} agent cooldowns, {} tallies, {} marks and {} ledger lines from {} to {}",
        dump.retries.len(),
        dump.claims.len(),
        dump.runs.len(),
        dump.steering.len(),
        dump.seen.len(),
        dump.cursors.len(),
        dump.cooldowns.len(),
        dump.tallies.len(),
        dump.marks.len(),
        dump.ledger.len(),
        shown(&source),
        shown(&target)
    ))
}
