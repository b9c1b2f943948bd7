//! Where a `postgres` store is (`Target`: the connection string without its `schema`
//! parameter, and the schema) and how long its sessions may wait (`Bounds`).

use super::*;

/// Where the store is: the connection string for libpq (the `schema` parameter taken out)
/// and the schema. Clones share one count of lost connections ([`Target::lost`]).
#[derive(Clone, Debug)]
pub struct Target {
    pub(super) uri: String,
    pub schema: String,
    /// How many times a connection of this daemon to the store was found lost: each handle
    /// (the store thread's, the run threads', the durable facts', the listener's) re-makes its
    /// own connection before its next use once another found the server gone, instead of
    /// failing on it first.
    pub(super) lost: Arc<std::sync::atomic::AtomicU64>,
}

impl PartialEq for Target {
    fn eq(&self, other: &Target) -> bool {
        self.uri == other.uri && self.schema == other.schema
    }
}

impl Eq for Target {}

/// How long a daemon's session may wait, each well under the claim TTL so that nothing a
/// frozen or cut-off peer holds can stall this daemon past it (see [`Bounds::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// An answer that has not come by then gives the connection up (client side), and the
    /// server cancels a statement that runs longer (`statement_timeout`); also libpq's
    /// `tcp_user_timeout` (data sent and not acknowledged).
    pub answer_ms: Millis,
    /// A wait for a lock (a row, an advisory lock) fails after this (`lock_timeout`).
    pub lock_ms: Millis,
    /// The server ends a session idle inside a transaction this long
    /// (`idle_in_transaction_session_timeout`): a daemon frozen after `BEGIN` (SIGSTOP, a
    /// paused VM, a partition) releases its locks.
    pub idle_ms: Millis,
}

impl Bounds {
    /// The bounds for a claim TTL of `ttl_ms`.
    pub fn of(ttl_ms: Millis) -> Bounds {
        Bounds {
            answer_ms: (ttl_ms * 3 / 4).clamp(1500, 5000),
            lock_ms: (ttl_ms / 4).clamp(250, 2000),
            idle_ms: (ttl_ms / 2).clamp(1000, 5000),
        }
    }
}

impl Target {
    /// Reads `SVC_CLAIM_STORE`'s URI: `postgres://` or `postgresql://`, every libpq parameter
    /// kept; a `schema` query parameter names the schema (default `svc`).
    pub fn parse(text: &str) -> Result<Target, String> {
        let shown = crate::pq::redact(text);
        let (base, query) = match text.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (text, None),
        };
        let mut schema = "svc".to_string();
        let mut kept: Vec<&str> = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some(("schema", value)) => schema = value.to_string(),
                _ if !pair.is_empty() => kept.push(pair),
                _ => {}
            }
        }
        let valid = !schema.is_empty()
            && schema.len() <= 63
            && schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && !schema.starts_with(|c: char| c.is_ascii_digit())
            && !schema.starts_with("pg_");
        if !valid {
            return Err(format!(
                "claim store {shown}: schema {schema:?} is not a usable name: use lower-case letters, digits and _ (at most 63, not starting with a digit or pg_)"
            ));
        }
        let uri = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok(Target {
            uri,
            schema,
            lost: Arc::default(),
        })
    }

    /// How many times a connection to the store was found lost (see [`Target::lost`]).
    pub(super) fn losses(&self) -> u64 {
        self.lost.load(Ordering::Acquire)
    }

    /// Tells every handle that a connection was found lost.
    pub(super) fn lose(&self) {
        self.lost.fetch_add(1, Ordering::AcqRel);
    }

    /// The key of an advisory lock of this store's (`what` names it): locks are scoped by the
    /// schema, so two fleets in one database never wait on each other.
    pub(super) fn lock_key(&self, what: &str) -> String {
        format!("hashtext('svc {} {what}')", self.schema)
    }

    /// A daemon's connection: [`Target::connect`] with every wait bounded ([`Bounds`]).
    pub fn connect_bounded(&self, bounds: Bounds) -> Result<Conn, String> {
        let tcp = bounds.answer_ms.to_string();
        let mut conn = self.connect_with(&[("tcp_user_timeout", &tcp)])?;
        conn.execute(&format!(
            "SET statement_timeout = {}; SET lock_timeout = {}; SET idle_in_transaction_session_timeout = {}",
            bounds.answer_ms, bounds.lock_ms, bounds.idle_ms
        ))
        .map_err(|e| format!("claim store {}: {e}", self.shown()))?;
        conn.set_answer_timeout(Some(Duration::from_millis(bounds.answer_ms)));
        Ok(conn)
    }

    /// The URI as messages show it: without its password.
    pub fn shown(&self) -> String {
        format!("{} (schema {})", crate::pq::redact(&self.uri), self.schema)
    }

    /// A new connection, its `search_path` set to the store's schema.
    pub fn connect(&self) -> Result<Conn, String> {
        self.connect_with(&[])
    }

    /// [`Target::connect`] with more libpq defaults.
    pub(super) fn connect_with(&self, more: &[(&str, &str)]) -> Result<Conn, String> {
        let mut defaults = vec![
            ("application_name", "svc"),
            ("connect_timeout", "5"),
            ("keepalives_idle", "5"),
            ("keepalives_interval", "2"),
            ("keepalives_count", "3"),
        ];
        defaults.extend_from_slice(more);
        let mut conn = Conn::connect_with(&self.uri, &defaults)
            .map_err(|e| format!("claim store {}: {e}", self.shown()))?;
        conn.execute(&format!("SET search_path TO {}", self.schema))
            .map_err(|e| format!("claim store {}: {e}", self.shown()))?;
        Ok(conn)
    }

    /// The `LISTEN`/`NOTIFY` channel of this store's daemons.
    pub(super) fn channel(&self) -> String {
        format!("svc_{}", self.schema)
    }
}
