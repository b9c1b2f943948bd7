//! A real PostgreSQL server for tests: the system's `initdb`/`postgres` (Debian package
//! `postgresql`) with a throwaway cluster in a temporary directory, listening on 127.0.0.1 on a
//! private port, with a password (scram-sha-256) login role `svc_test` for the code under test
//! and a trusted local socket for the superuser `postgres` of [`PgServer::psql`].
//!
//! ```ignore
//! let Some(pg) = PgServer::shared() else { return }; // "skipping: PostgreSQL is not installed"
//! let uri = pg.new_database("claims");              // a fresh database of its own
//! ```
//!
//! Uses only std, so the unit tests in `src` include it too (`crate::pg_server`).
//!
//! As root (CI), the server runs as the system user `postgres` (initdb and postgres refuse
//! root); otherwise as the current user. Nothing outlives the test process: dropping a
//! [`PgServer`] stops it and removes its directory, and every server also has a watchdog
//! (`sh`), started before the server, that reads a pipe from the test process and, when the
//! process ends however it ends (the shared server is never dropped), stops the server
//! (SIGQUIT: immediate shutdown) and removes the directory.
//!
//! Under `CI=true`, or `SVC_TEST_POSTGRES=required` (scripts/test, which installs PostgreSQL),
//! a server that cannot start is a test failure; elsewhere the tests that need one skip.
#![allow(dead_code)]

use std::collections::hash_map::RandomState;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The login role of the code under test (password auth over TCP).
pub const ROLE: &str = "svc_test";
/// The bootstrap superuser (trust over the local socket).
const SUPERUSER: &str = "postgres";
/// How long a start or restart may take before it counts as failed.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Ports tried when another process takes the free one before postgres binds it.
const BIND_ATTEMPTS: usize = 3;

/// A running PostgreSQL server; stopped, with its directory removed, on drop.
pub struct PgServer {
    /// The temporary directory: `data/` (the cluster), the socket, `postgres.log`.
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    bin: PathBuf,
    port: u16,
    password: String,
    /// The uid/gid the server runs as when the tests run as root.
    owner: Option<(u32, u32)>,
    /// The watchdog and the pipe it waits on (its end stops the server).
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

/// Whether a server that cannot start fails the test instead of skipping it.
fn strict() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("SVC_TEST_POSTGRES").is_ok_and(|v| v == "required")
}

impl PgServer {
    /// The test process's one shared server, started on first use. None, after one line
    /// `skipping: PostgreSQL is not installed` (or why it cannot start), where PostgreSQL
    /// cannot run and the run is not strict (see the module comment); panics when it is.
    pub fn shared() -> Option<&'static PgServer> {
        static SHARED: OnceLock<Option<PgServer>> = OnceLock::new();
        SHARED.get_or_init(PgServer::start).as_ref()
    }

    /// A private server (for tests that restart or stop it), with the skip policy of
    /// [`PgServer::shared`].
    pub fn start() -> Option<PgServer> {
        match PgServer::try_start() {
            Ok(server) => Some(server),
            Err(Skip::NotInstalled(why)) if !strict() => {
                eprintln!("skipping: PostgreSQL is not installed ({why})");
                None
            }
            Err(Skip::Broken(why)) if !strict() => {
                eprintln!("skipping: PostgreSQL cannot run here: {why}");
                None
            }
            Err(Skip::NotInstalled(why) | Skip::Broken(why)) => panic!(
                "a PostgreSQL server must start for this test run (CI=true or \
                 SVC_TEST_POSTGRES=required; scripts/test installs the postgresql package): {why}"
            ),
        }
    }

    /// [`PgServer::start`], returning why it cannot run instead of deciding to skip.
    fn try_start() -> Result<PgServer, Skip> {
        let bin = bindir().map_err(Skip::NotInstalled)?;
        let owner = if is_root() {
            Some(user_ids("postgres").map_err(|e| {
                Skip::Broken(format!(
                    "running as root needs the unprivileged system user postgres (the \
                     postgresql package creates it): {e}"
                ))
            })?)
        } else {
            None
        };
        let dir = temp_dir().map_err(Skip::Broken)?;
        let mut server = PgServer {
            data: dir.join("data"),
            log: dir.join("postgres.log"),
            dir,
            bin,
            port: 0,
            password: random_hex(),
            owner,
            watchdog: Mutex::new(None),
        };
        // From here on, dropping `server` stops whatever started and removes the directory.
        server.create().map_err(Skip::Broken)?;
        Ok(server)
    }

    /// initdb, the configuration, the first start (on a free port), the watchdog, the role.
    fn create(&mut self) -> Result<(), String> {
        self.spawn_watchdog()?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(&self.dir, Some(uid), Some(gid))
                .map_err(|e| format!("cannot give {} to postgres: {e}", self.dir.display()))?;
        }
        let out = self
            .command("initdb")
            .arg("-D")
            .arg(&self.data)
            .args([
                "-U",
                SUPERUSER,
                "--encoding=UTF8",
                "--locale=C",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
            ])
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // Appended as whoever we are: the file keeps its owner.
        let conf = format!(
            "\n# svc tests\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n\
             max_connections = 200\nshared_buffers = 32MB\n\
             password_encryption = 'scram-sha-256'\nlogging_collector = off\n",
            self.dir.display()
        );
        append(&self.data.join("postgresql.conf"), &conf)?;
        if self.make_certificate().is_ok() {
            append(
                &self.data.join("postgresql.conf"),
                "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
            )?;
        }
        let mut last = String::new();
        for _ in 0..BIND_ATTEMPTS {
            self.port = free_port()?;
            append(
                &self.data.join("postgresql.conf"),
                &format!("port = {}\n", self.port),
            )?;
            match self.pg_ctl_start() {
                Ok(()) => {
                    last.clear();
                    break;
                }
                Err(e) => last = e,
            }
        }
        if !last.is_empty() {
            return Err(last);
        }
        self.psql(
            "postgres",
            &format!(
                "CREATE ROLE {ROLE} LOGIN PASSWORD '{}' CREATEDB",
                self.password
            ),
        );
        Ok(())
    }

    /// A self-signed certificate for 127.0.0.1 (`openssl`), as the server's `server.crt` and
    /// `server.key` and as the clients' root certificate ([`PgServer::tls_root_cert`]).
    fn make_certificate(&self) -> Result<(), String> {
        let (crt, key) = (self.data.join("server.crt"), self.data.join("server.key"));
        let out = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-nodes",
                "-days",
                "7",
                "-subj",
                "/CN=127.0.0.1",
            ])
            .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&crt)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("no openssl: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let mode = |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m));
        mode(&key, 0o600).map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = self.owner {
            for f in [&crt, &key] {
                std::os::unix::fs::chown(f, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
            }
        }
        fs::copy(&crt, self.dir.join("root.crt")).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The certificate that verifies the server's TLS (`sslrootcert=`; `sslmode=verify-full`
    /// works for host 127.0.0.1), or None when the server has no TLS (openssl was missing).
    pub fn tls_root_cert(&self) -> Option<PathBuf> {
        let root = self.dir.join("root.crt");
        root.is_file().then_some(root)
    }

    /// A command of the server's bin directory, run as the server's owner.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.current_dir(&self.dir).stdin(Stdio::null());
        clear_pg_env(&mut cmd);
        if let Some((uid, gid)) = self.owner {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// `pg_ctl start`, waiting until the server accepts connections.
    fn pg_ctl_start(&self) -> Result<(), String> {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", &START_TIMEOUT.as_secs().to_string(), "start"])
            .stdout(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pg_ctl start failed: {}\n{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                self.log_tail()
            ));
        }
        self.wait_ready()
    }

    /// Waits until the TCP port answers a query.
    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok() {
                let out = self.psql_command("postgres", "SELECT 1").output();
                if out.is_ok_and(|o| o.status.success()) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "PostgreSQL did not accept connections on port {}\n{}",
                    self.port,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The end of the server's log, for failure messages.
    fn log_tail(&self) -> String {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "postgres.log:\n{}",
            lines[lines.len().saturating_sub(20)..].join("\n")
        )
    }

    /// The watchdog, started before the server: a shell, in a process group of its own and
    /// deaf to the terminal's signals, that waits for its stdin to end (this process exiting
    /// however it exits). Then it stops the server (SIGQUIT to the postmaster: immediate
    /// shutdown), looking again for a few seconds while there is none (a start may be under
    /// way), and removes the directory. `Drop`, which stops the server itself, writes `stopped` first.
    fn spawn_watchdog(&self) -> Result<(), String> {
        let script = r#"
trap '' INT HUP QUIT TERM PIPE
while read -r msg; do [ "$msg" = stopped ] && exit 0; done
for i in 1 2 3 4 5; do
  pm=""
  [ -f "$1/data/postmaster.pid" ] && read -r pm < "$1/data/postmaster.pid"
  if [ -n "$pm" ] && kill -QUIT "$pm" 2>/dev/null; then
    n=0
    while kill -0 "$pm" 2>/dev/null && [ "$n" -lt 300 ]; do
      st=""; read -r _ _ st _ < "/proc/$pm/stat" 2>/dev/null; [ "$st" = Z ] && break
      sleep 0.1; n=$((n + 1))
    done
    break
  fi
  [ "$i" = 5 ] || sleep 1
done
rm -rf "$1"
"#;
        let mut child = Command::new("sh")
            .args(["-c", script, "svc-pg-watchdog"])
            .arg(&self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start the watchdog: {e}"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        *self.watchdog.lock().unwrap() = Some((child, stdin));
        Ok(())
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The password of [`ROLE`].
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The URI of database `db` for [`ROLE`], with its password, over TCP.
    pub fn uri(&self, db: &str) -> String {
        format!(
            "postgres://{ROLE}:{}@127.0.0.1:{}/{db}",
            self.password, self.port
        )
    }

    /// A new database owned by [`ROLE`], named after `name` and unique on this server; its URI.
    pub fn new_database(&self, name: &str) -> String {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let mut clean: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        if clean.is_empty() {
            clean.push_str("db");
        }
        let db = format!("{clean}_{n}");
        self.psql("postgres", &format!("CREATE DATABASE {db} OWNER {ROLE}"));
        self.uri(&db)
    }

    fn psql_command(&self, db: &str, sql: &str) -> Command {
        let psql = self.bin.join("psql");
        let mut cmd = Command::new(if psql.is_file() {
            psql
        } else {
            PathBuf::from("psql")
        });
        clear_pg_env(&mut cmd);
        cmd.args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.dir)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                SUPERUSER,
                "-d",
                db,
                "-c",
                sql,
            ])
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `sql` in `db` as the superuser (psql -At over the local socket): its output,
    /// trimmed. Panics when psql fails.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = self
            .psql_command(db, sql)
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql: {e}"));
        assert!(
            out.status.success(),
            "psql {sql:?} in {db} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Restarts the server (`pg_ctl restart -m fast`: sessions end, connections break) and waits
    /// until it accepts connections again.
    pub fn restart(&self) {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", &START_TIMEOUT.as_secs().to_string()])
            .args(["-m", "fast", "restart"])
            .stdout(Stdio::null())
            .output()
            .expect("run pg_ctl restart");
        assert!(
            out.status.success(),
            "pg_ctl restart failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
        self.wait_ready().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Stops the server (`pg_ctl stop -m fast`), which keeps its port and data.
    pub fn stop(&self) {
        self.pg_ctl_stop("fast").unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts a server [`PgServer::stop`] stopped, on the same port.
    pub fn start_again(&self) {
        self.pg_ctl_start().unwrap_or_else(|e| panic!("{e}"));
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<(), String> {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", &START_TIMEOUT.as_secs().to_string()])
            .args(["-m", mode, "stop"])
            .stdout(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pg_ctl stop failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    }

    /// Ends every session of database `db` from the server side (`pg_terminate_backend`) but
    /// psql's own: how many it ended.
    pub fn terminate_connections(&self, db: &str) -> usize {
        let db = db.replace('\'', "''");
        self.psql(
            "postgres",
            &format!(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = '{db}' AND pid <> pg_backend_pid()"
            ),
        )
        .parse()
        .expect("a count")
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let stopped =
            !self.data.join("postmaster.pid").exists() || self.pg_ctl_stop("immediate").is_ok();
        // Closing the pipe wakes the watchdog: at once gone when the server is stopped, else
        // it stops the server.
        if let Some((mut child, mut stdin)) = self.watchdog.lock().unwrap().take() {
            if stopped {
                let _ = stdin.write_all(b"stopped\n");
            }
            drop(stdin);
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Why a server cannot run.
enum Skip {
    NotInstalled(String),
    Broken(String),
}

/// The directory of initdb, pg_ctl and postgres: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin`, else the one on PATH holding initdb.
fn bindir() -> Result<PathBuf, String> {
    let complete = |d: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|p| d.join(p).is_file())
    };
    if let Ok(out) = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && complete(&dir) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let dir = e.path().join("bin");
            complete(&dir).then_some((version, dir))
        })
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Ok(dir);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        if complete(&dir) {
            return Ok(dir);
        }
        // A symlinked initdb (as in /usr/local/bin) points into the real bin directory.
        if let Ok(real) = fs::canonicalize(dir.join("initdb"))
            && let Some(real_dir) = real.parent()
            && complete(real_dir)
        {
            return Ok(real_dir.to_path_buf());
        }
    }
    Err(
        "no initdb, pg_ctl and postgres found (pg_config --bindir, /usr/lib/postgresql/*/bin, \
         PATH); install the postgresql package"
            .to_string(),
    )
}

/// Whether this process runs as root (`id -u`, std only).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The uid and gid of `user`.
fn user_ids(user: &str) -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        let out = Command::new("id")
            .args([flag, user])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run id: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| {
                format!(
                    "no user {user}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            })
    };
    Ok((id("-u")?, id("-g")?))
}

/// A fresh directory (mode 0700) with a short path: the server's socket lives in it, and a
/// Unix socket's path has at most 107 bytes.
fn temp_dir() -> Result<PathBuf, String> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut base = std::env::temp_dir();
    if base.as_os_str().len() > 60 {
        base = PathBuf::from("/tmp");
    }
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = base.join(format!("svc-pg-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot restrict {}: {e}", dir.display()))?;
    Ok(dir)
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| format!("cannot bind 127.0.0.1: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// 32 random hex digits (std's randomly seeded hasher, the time and the pid).
fn random_hex() -> String {
    let word = |salt: u64| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", word(1), word(2))
}

fn append(path: &Path, text: &str) -> Result<(), String> {
    fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The caller's libpq variables (PGHOST, PGPASSWORD, ...) must not redirect the harness.
fn clear_pg_env(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PG") {
            cmd.env_remove(key);
        }
    }
}
