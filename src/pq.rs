//! A small PostgreSQL client over the system's libpq, loaded at run time with `dlopen` only when
//! a PostgreSQL store is configured: the binary neither links libpq nor needs it to start, and
//! no async runtime enters. Every libpq connection parameter, the libpq environment
//! (`PGPASSWORD`, `PGSSLMODE`, ...), `~/.pgpass` and TLS work as libpq documents them, because
//! libpq itself reads them.
//!
//! Synchronous and blocking, one connection per [`Conn`], which a thread owns at a time (libpq
//! is thread-safe per connection). Text in, text out: parameters and results in the text
//! format, the client encoding set to UTF-8. A password in a connection string never reaches a
//! message: [`redact`] writes connection strings for people, and every error text goes through
//! a scrubber that removes the password should libpq echo it. A leaf: it uses nothing of the
//! crate.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::fmt;
use std::ptr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod redact;

pub use redact::redact;
use redact::{scrub, secrets};

/// The library names tried, in order, when `SVC_LIBPQ` names none.
const DEFAULT_NAMES: [&str; 2] = ["libpq.so.5", "libpq.so"];

/// `ConnStatusType::CONNECTION_OK`.
const CONNECTION_OK: c_int = 0;
/// `ExecStatusType` values (libpq-fe.h).
const PGRES_EMPTY_QUERY: c_int = 0;
const PGRES_COMMAND_OK: c_int = 1;
const PGRES_TUPLES_OK: c_int = 2;
const PGRES_COPY_OUT: c_int = 3;
const PGRES_COPY_IN: c_int = 4;
const PGRES_COPY_BOTH: c_int = 8;
/// `PGTransactionStatusType::PQTRANS_IDLE`.
const PQTRANS_IDLE: c_int = 0;
/// `PG_DIAG_SQLSTATE`.
const PG_DIAG_SQLSTATE: c_int = b'C' as c_int;

/// libpq's opaque connection.
#[repr(C)]
struct PGconn {
    _private: [u8; 0],
}

/// libpq's opaque result.
#[repr(C)]
struct PGresult {
    _private: [u8; 0],
}

/// libpq's `PGnotify`.
#[repr(C)]
struct PGnotify {
    relname: *mut c_char,
    be_pid: c_int,
    extra: *mut c_char,
    next: *mut PGnotify,
}

type Oid = c_uint;

/// libpq's `PQnoticeProcessor`.
type NoticeProcessor = unsafe extern "C" fn(*mut c_void, *const c_char);

/// The server's notices and warnings (`NOTICE: relation "x" already exists, skipping`), which
/// libpq would print on stderr: to the debug log instead.
unsafe extern "C" fn notice(_arg: *mut c_void, message: *const c_char) {
    // SAFETY: libpq passes a NUL-terminated message valid for the call.
    let message = unsafe { text(message) };
    log::debug!("PostgreSQL: {}", message.trim());
}

/// Declares [`Lib`], one function pointer per libpq function svc calls, and its loader.
macro_rules! libpq {
    ($($name:ident: fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// libpq, loaded: the functions svc calls. Only [`load`] makes one, and it lives for
        /// the rest of the process (the library is never unloaded).
        #[allow(non_snake_case)]
        pub struct Lib {
            /// The file it was loaded from.
            pub path: String,
            $($name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        impl Lib {
            /// Resolves every function in the library `handle` (loaded from `path`).
            fn resolve(handle: *mut c_void, path: &str) -> Result<Lib, String> {
                Ok(Lib {
                    path: path.to_string(),
                    $($name: {
                        let name = concat!(stringify!($name), "\0");
                        // SAFETY: `handle` is a live dlopen handle and `name` ends in NUL.
                        let f = unsafe { libc::dlsym(handle, name.as_ptr().cast()) };
                        if f.is_null() {
                            return Err(format!(
                                "{path} is not a usable libpq: it lacks {} ({})",
                                stringify!($name),
                                dl_error()
                            ));
                        }
                        // SAFETY: the symbol is libpq's function of this name, whose C
                        // signature (libpq-fe.h) the declaration above repeats.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(f)
                        }
                    },)*
                })
            }
        }
    };
}

libpq! {
    PQconnectdb: fn(*const c_char) -> *mut PGconn;
    PQconnectdbParams: fn(*const *const c_char, *const *const c_char, c_int) -> *mut PGconn;
    PQfinish: fn(*mut PGconn);
    PQreset: fn(*mut PGconn);
    PQstatus: fn(*const PGconn) -> c_int;
    PQerrorMessage: fn(*const PGconn) -> *const c_char;
    PQtransactionStatus: fn(*const PGconn) -> c_int;
    PQparameterStatus: fn(*const PGconn, *const c_char) -> *const c_char;
    PQsetClientEncoding: fn(*mut PGconn, *const c_char) -> c_int;
    PQbackendPID: fn(*const PGconn) -> c_int;
    PQserverVersion: fn(*const PGconn) -> c_int;
    PQsocket: fn(*const PGconn) -> c_int;
    PQexec: fn(*mut PGconn, *const c_char) -> *mut PGresult;
    PQexecParams: fn(
        *mut PGconn,
        *const c_char,
        c_int,
        *const Oid,
        *const *const c_char,
        *const c_int,
        *const c_int,
        c_int
    ) -> *mut PGresult;
    PQgetResult: fn(*mut PGconn) -> *mut PGresult;
    PQsendQuery: fn(*mut PGconn, *const c_char) -> c_int;
    PQsendQueryParams: fn(
        *mut PGconn,
        *const c_char,
        c_int,
        *const Oid,
        *const *const c_char,
        *const c_int,
        *const c_int,
        c_int
    ) -> c_int;
    PQisBusy: fn(*mut PGconn) -> c_int;
    PQresultStatus: fn(*const PGresult) -> c_int;
    PQresultErrorMessage: fn(*const PGresult) -> *const c_char;
    PQresultErrorField: fn(*const PGresult, c_int) -> *const c_char;
    PQntuples: fn(*const PGresult) -> c_int;
    PQnfields: fn(*const PGresult) -> c_int;
    PQfname: fn(*const PGresult, c_int) -> *const c_char;
    PQgetvalue: fn(*const PGresult, c_int, c_int) -> *const c_char;
    PQgetlength: fn(*const PGresult, c_int, c_int) -> c_int;
    PQgetisnull: fn(*const PGresult, c_int, c_int) -> c_int;
    PQcmdTuples: fn(*mut PGresult) -> *const c_char;
    PQclear: fn(*mut PGresult);
    PQconsumeInput: fn(*mut PGconn) -> c_int;
    PQnotifies: fn(*mut PGconn) -> *mut PGnotify;
    PQfreemem: fn(*mut c_void);
    PQputCopyEnd: fn(*mut PGconn, *const c_char) -> c_int;
    PQgetCopyData: fn(*mut PGconn, *mut *mut c_char, c_int) -> c_int;
    PQisthreadsafe: fn() -> c_int;
    PQsetNoticeProcessor: fn(*mut PGconn, NoticeProcessor, *mut c_void) -> Option<NoticeProcessor>;
}

/// The last `dlerror` text of this thread.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call
    // of this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "no reason given".to_string()
    } else {
        // SAFETY: see above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// libpq, loaded once per process. `SVC_LIBPQ` may name the library file (a path or a name
/// for the dynamic loader); by default "libpq.so.5", then "libpq.so", are tried.
pub fn load() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| match std::env::var("SVC_LIBPQ") {
        Ok(path) if !path.is_empty() => load_from(&[&path]),
        _ => load_from(&DEFAULT_NAMES),
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Loads the first of `names` that `dlopen` opens, and checks it is a thread-safe libpq. The
/// library stays loaded for the rest of the process, also when this fails after opening it.
pub fn load_from(names: &[&str]) -> Result<Lib, String> {
    let mut said = Vec::new();
    for name in names {
        let Ok(c_name) = CString::new(*name) else {
            said.push(format!("{name:?} contains a NUL byte"));
            continue;
        };
        // SAFETY: `c_name` is NUL-terminated; the handle is never closed, so the functions
        // resolved from it stay valid for the life of the process.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            said.push(dl_error());
            continue;
        }
        let lib = Lib::resolve(handle, name)?;
        // SAFETY: PQisthreadsafe takes nothing and only returns a constant.
        if unsafe { (lib.PQisthreadsafe)() } == 0 {
            return Err(format!(
                "{name} was built without thread safety, which svc needs (one connection per thread)"
            ));
        }
        return Ok(lib);
    }
    Err(format!(
        "PostgreSQL needs libpq (libpq.so.5), which is not installed: install the libpq5 package \
         (Debian/Ubuntu) or postgresql-libs; dlopen said: {}",
        said.join("; ")
    ))
}

/// A failed connection or statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// What libpq or the server said, trimmed, never with the password.
    pub message: String,
    /// The SQLSTATE of a server error (`42601`, `40001`, ...), when there is one.
    pub sqlstate: Option<String>,
    /// The connection is not usable after this (the server restarted or ended the session, the
    /// network failed, or it never connected): drop or [`Conn::reset`] it, with backoff.
    pub connection_lost: bool,
}

impl Error {
    fn local(message: impl Into<String>) -> Error {
        Error {
            message: message.into(),
            sqlstate: None,
            connection_lost: false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(state) = &self.sqlstate {
            write!(f, " (SQLSTATE {state})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// A statement's result: its columns, its rows as text (None for SQL NULL), and the rows it
/// affected (`INSERT`, `UPDATE`, `DELETE`, `SELECT`, ...; 0 when the command reports none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<String>>>,
    pub affected: u64,
}

impl Rows {
    /// The value of column `col` in row `row`: None when either is missing or the value is NULL.
    pub fn get(&self, row: usize, col: &str) -> Option<&str> {
        let at = self.columns.iter().position(|c| c == col)?;
        self.rows.get(row)?.get(at)?.as_deref()
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A `NOTIFY` received on a channel this connection listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub channel: String,
    pub payload: String,
    /// The backend that sent it (compare with [`Conn::backend_pid`] to skip one's own).
    pub pid: i32,
}

/// One libpq connection. `Send` (a thread at a time), not `Sync`; closed on drop.
pub struct Conn {
    raw: *mut PGconn,
    lib: &'static Lib,
    /// The passwords of the connection string, removed from every message.
    secrets: Vec<String>,
    /// How long a statement's answer may take ([`Conn::set_answer_timeout`]); `None` waits as
    /// long as the socket stays up.
    answer_timeout: Option<Duration>,
    /// A statement's answer did not come in time: the session is given up (the server may
    /// still be in the middle of it; only a new connection is safe).
    abandoned: bool,
}

// SAFETY: libpq is thread-safe (checked at load) as long as one PGconn is used by one thread
// at a time, which `&mut self`/`&self` without `Sync` guarantees.
unsafe impl Send for Conn {}

/// Frees a result on every path.
struct Result_<'a> {
    raw: *mut PGresult,
    lib: &'a Lib,
}

impl Drop for Result_<'_> {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: `raw` came from libpq and is cleared once.
            unsafe { (self.lib.PQclear)(self.raw) };
        }
    }
}

/// A C string from libpq as text (lossy), "" for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's promise.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Conn {
    /// Connects with `PQconnectdb`: `uri` is a `postgres://` URI or a `key=value` string, and
    /// libpq also reads its environment and files. An error has `connection_lost` set (there is
    /// no connection) and no SQLSTATE; its message is libpq's, without the password.
    pub fn connect(uri: &str) -> Result<Conn, Error> {
        Conn::connect_with(uri, &[])
    }

    /// [`Conn::connect`] with `defaults`: libpq parameters (`("connect_timeout", "10")`,
    /// `("application_name", "svc")`, `("keepalives_idle", "10")`, ...) used only where
    /// neither `uri` nor the parameter's libpq environment variable (`PGCONNECT_TIMEOUT`,
    /// `PGAPPNAME`, ...) sets one (`PQconnectdbParams`, the URI expanded after the defaults).
    pub fn connect_with(uri: &str, defaults: &[(&str, &str)]) -> Result<Conn, Error> {
        let lib = load().map_err(Error::local)?;
        let secrets = secrets(uri);
        let nul = || Error::local("the PostgreSQL connection string contains a NUL byte");
        let c_uri = CString::new(uri).map_err(|_| nul())?;
        let defaults: Vec<(CString, CString)> = defaults
            .iter()
            .filter(|(key, _)| {
                env_var_of(key).is_none_or(|var| std::env::var_os(var).is_none_or(|v| v.is_empty()))
            })
            .map(|(k, v)| {
                Ok((
                    CString::new(*k).map_err(|_| nul())?,
                    CString::new(*v).map_err(|_| nul())?,
                ))
            })
            .collect::<Result<_, Error>>()?;
        let raw = if defaults.is_empty() {
            // SAFETY: `c_uri` is NUL-terminated; the connection (even a failed one) is
            // finished by the Conn's drop.
            unsafe { (lib.PQconnectdb)(c_uri.as_ptr()) }
        } else {
            // The defaults first, then `dbname` = the whole string, which libpq expands (the
            // connection string's values override the earlier ones); both lists end in NULL.
            let mut keys: Vec<*const c_char> = defaults.iter().map(|(k, _)| k.as_ptr()).collect();
            let mut values: Vec<*const c_char> = defaults.iter().map(|(_, v)| v.as_ptr()).collect();
            keys.extend([c"dbname".as_ptr(), ptr::null()]);
            values.extend([c_uri.as_ptr(), ptr::null()]);
            // SAFETY: two NULL-terminated arrays of NUL-terminated strings that outlive the
            // call; the connection is finished by the Conn's drop.
            unsafe { (lib.PQconnectdbParams)(keys.as_ptr(), values.as_ptr(), 1) }
        };
        if raw.is_null() {
            return Err(Error::local("libpq could not allocate a connection"));
        }
        // SAFETY: live connection; `notice` lives forever and ignores its argument.
        unsafe { (lib.PQsetNoticeProcessor)(raw, notice, ptr::null_mut()) };
        let mut conn = Conn {
            raw,
            lib,
            secrets,
            answer_timeout: None,
            abandoned: false,
        };
        if !conn.is_ok() {
            return Err(conn.conn_error("could not connect to PostgreSQL"));
        }
        conn.utf8()?;
        Ok(conn)
    }

    /// Sets the client encoding to UTF-8 unless the server already sends that.
    fn utf8(&mut self) -> Result<(), Error> {
        // SAFETY: live connection; the parameter name is NUL-terminated; the answer is copied.
        let current = unsafe {
            text((self.lib.PQparameterStatus)(
                self.raw,
                c"client_encoding".as_ptr(),
            ))
        };
        if current == "UTF8" {
            return Ok(());
        }
        // SAFETY: live connection and a NUL-terminated encoding name.
        if unsafe { (self.lib.PQsetClientEncoding)(self.raw, c"UTF8".as_ptr()) } != 0 {
            return Err(self.conn_error("could not set the client encoding to UTF8"));
        }
        Ok(())
    }

    /// The connection's error message, scrubbed, as an [`Error`]; `fallback` when empty.
    fn conn_error(&self, fallback: &str) -> Error {
        // SAFETY: live connection; the message is copied at once.
        let message = unsafe { text((self.lib.PQerrorMessage)(self.raw)) };
        let message = self.scrub(message.trim());
        Error {
            message: if message.is_empty() {
                fallback.to_string()
            } else {
                message
            },
            sqlstate: None,
            connection_lost: !self.is_ok(),
        }
    }

    /// `message` without any password of the connection string.
    fn scrub(&self, message: &str) -> String {
        scrub(message, &self.secrets)
    }

    /// From now on a statement whose answer has not come within `timeout` fails with
    /// `connection_lost` and the connection is given up: a server, network or proxy that holds
    /// the bytes (a partition, a paused host) cannot hold the caller for ever. (The server's own
    /// `statement_timeout` bounds a slow statement; this bounds an answer that never comes.)
    pub fn set_answer_timeout(&mut self, timeout: Option<Duration>) {
        self.answer_timeout = timeout;
    }

    /// Runs `sql` with the simple protocol (`PQexec`): it may hold several statements, run as
    /// one implicit transaction unless they say otherwise; the result is the last statement's.
    /// No parameters: use [`Conn::query`] for values.
    pub fn execute(&mut self, sql: &str) -> Result<Rows, Error> {
        let c_sql =
            CString::new(sql).map_err(|_| Error::local("the SQL text contains a NUL byte"))?;
        if let Some(timeout) = self.answer_timeout {
            self.check_usable()?;
            // SAFETY: live connection and a NUL-terminated command.
            let sent = unsafe { (self.lib.PQsendQuery)(self.raw, c_sql.as_ptr()) };
            return self.answer(sent, timeout);
        }
        // SAFETY: live connection and a NUL-terminated command.
        let raw = unsafe { (self.lib.PQexec)(self.raw, c_sql.as_ptr()) };
        self.result(raw)
    }

    /// An error for a connection given up after an answer did not come.
    fn check_usable(&self) -> Result<(), Error> {
        if self.abandoned {
            return Err(Error {
                connection_lost: true,
                ..Error::local("the connection was given up: an answer did not come in time")
            });
        }
        Ok(())
    }

    /// Waits up to `timeout` for the answer to a statement sent with `PQsendQuery*` (`sent`
    /// its return value), as `PQexec` would return it: the last result.
    fn answer(&mut self, sent: c_int, timeout: Duration) -> Result<Rows, Error> {
        if sent == 0 {
            return Err(self.conn_error("could not send the statement"));
        }
        let lib = self.lib;
        let deadline = Instant::now() + timeout;
        let mut last: Option<Result<Rows, Error>> = None;
        loop {
            // SAFETY: live connection.
            while unsafe { (lib.PQisBusy)(self.raw) } != 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    self.abandoned = true;
                    return Err(Error {
                        connection_lost: true,
                        ..Error::local(format!(
                            "no answer from the server within {} ms; the connection is given up",
                            timeout.as_millis()
                        ))
                    });
                }
                self.wait(left);
                // SAFETY: live connection.
                if unsafe { (lib.PQconsumeInput)(self.raw) } == 0 {
                    return Err(self.conn_error("could not read from the PostgreSQL connection"));
                }
            }
            // SAFETY: live connection; the result (or NULL, the end) is handed to `result`.
            let raw = unsafe { (lib.PQgetResult)(self.raw) };
            if raw.is_null() {
                return last.unwrap_or_else(|| Err(self.conn_error("no result from the server")));
            }
            let this = self.result(raw);
            // PQexec's rule: an error result is kept over what follows it.
            if !matches!(last, Some(Err(_))) {
                last = Some(this);
            }
            if !self.is_ok() {
                return last.expect("set above");
            }
        }
    }

    /// Runs one statement with parameters `$1..$n` (`PQexecParams`), all as text (None is SQL
    /// NULL; the server infers their types, so cast in SQL where it cannot: `$1::bigint`).
    pub fn query(&mut self, sql: &str, params: &[Option<&str>]) -> Result<Rows, Error> {
        let c_sql =
            CString::new(sql).map_err(|_| Error::local("the SQL text contains a NUL byte"))?;
        let n = c_int::try_from(params.len())
            .ok()
            .filter(|n| *n <= 65535)
            .ok_or_else(|| Error::local("too many parameters (65535 at most)"))?;
        let values: Vec<Option<CString>> = params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                p.map(|p| {
                    CString::new(p).map_err(|_| {
                        Error::local(format!("parameter ${} contains a NUL byte", i + 1))
                    })
                })
                .transpose()
            })
            .collect::<Result<_, _>>()?;
        let pointers: Vec<*const c_char> = values
            .iter()
            .map(|v| v.as_ref().map_or(ptr::null(), |v| v.as_ptr()))
            .collect();
        if let Some(timeout) = self.answer_timeout {
            self.check_usable()?;
            // SAFETY: as for PQexecParams below.
            let sent = unsafe {
                (self.lib.PQsendQueryParams)(
                    self.raw,
                    c_sql.as_ptr(),
                    n,
                    ptr::null(),
                    pointers.as_ptr(),
                    ptr::null(),
                    ptr::null(),
                    0,
                )
            };
            return self.answer(sent, timeout);
        }
        // SAFETY: live connection; `pointers` holds `n` pointers, each NULL or a NUL-terminated
        // string of `values`, which outlives the call; NULL types, lengths and formats mean
        // "inferred" and "text"; result format 0 is text.
        let raw = unsafe {
            (self.lib.PQexecParams)(
                self.raw,
                c_sql.as_ptr(),
                n,
                ptr::null(),
                pointers.as_ptr(),
                ptr::null(),
                ptr::null(),
                0,
            )
        };
        self.result(raw)
    }

    /// Reads a result from `PQexec`/`PQexecParams` into [`Rows`] or an [`Error`], and clears it.
    fn result(&mut self, raw: *mut PGresult) -> Result<Rows, Error> {
        if raw.is_null() {
            return Err(self.conn_error("no result from the server"));
        }
        let res = Result_ { raw, lib: self.lib };
        let lib = self.lib;
        // SAFETY (this block's calls): `res.raw` is a live result until `res` drops.
        let status = unsafe { (lib.PQresultStatus)(res.raw) };
        match status {
            PGRES_COMMAND_OK | PGRES_TUPLES_OK | PGRES_EMPTY_QUERY => {}
            PGRES_COPY_IN | PGRES_COPY_OUT | PGRES_COPY_BOTH => {
                drop(res);
                self.end_copy();
                return Err(Error {
                    connection_lost: !self.is_ok(),
                    ..Error::local("COPY is not supported by this client")
                });
            }
            _ => {
                let message = unsafe { text((lib.PQresultErrorMessage)(res.raw)) };
                let state = unsafe { (lib.PQresultErrorField)(res.raw, PG_DIAG_SQLSTATE) };
                let sqlstate = (!state.is_null())
                    .then(|| unsafe { text(state) })
                    .filter(|s| !s.is_empty());
                drop(res);
                let mut error = self.conn_error("the statement failed");
                let message = self.scrub(message.trim());
                if !message.is_empty() {
                    error.message = message;
                }
                error.sqlstate = sqlstate;
                return Err(error);
            }
        }
        let rows = unsafe { (lib.PQntuples)(res.raw) }.max(0);
        let fields = unsafe { (lib.PQnfields)(res.raw) }.max(0);
        let columns = (0..fields)
            .map(|c| unsafe { text((lib.PQfname)(res.raw, c)) })
            .collect();
        let rows = (0..rows)
            .map(|r| {
                (0..fields)
                    .map(|c| unsafe {
                        if (lib.PQgetisnull)(res.raw, r, c) != 0 {
                            return None;
                        }
                        let p = (lib.PQgetvalue)(res.raw, r, c);
                        let len = usize::try_from((lib.PQgetlength)(res.raw, r, c)).unwrap_or(0);
                        if p.is_null() {
                            return Some(String::new());
                        }
                        let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len);
                        Some(String::from_utf8_lossy(bytes).into_owned())
                    })
                    .collect()
            })
            .collect();
        let affected = unsafe { text((lib.PQcmdTuples)(res.raw)) }
            .parse()
            .unwrap_or(0);
        Ok(Rows {
            columns,
            rows,
            affected,
        })
    }

    /// Leaves a COPY a statement started (svc never copies; this keeps the connection usable).
    fn end_copy(&mut self) {
        let lib = self.lib;
        for _ in 0..1000 {
            // SAFETY: live connection; every buffer and result libpq hands out is freed.
            unsafe {
                (lib.PQputCopyEnd)(self.raw, c"COPY is not supported by svc".as_ptr());
                let mut buf: *mut c_char = ptr::null_mut();
                while (lib.PQgetCopyData)(self.raw, &mut buf, 0) > 0 {
                    (lib.PQfreemem)(buf.cast());
                    buf = ptr::null_mut();
                }
                let r = (lib.PQgetResult)(self.raw);
                if r.is_null() {
                    return;
                }
                (lib.PQclear)(r);
            }
        }
    }

    /// Whether the connection is up (`PQstatus` is `CONNECTION_OK`) and was not given up.
    pub fn is_ok(&self) -> bool {
        // SAFETY: live connection.
        !self.abandoned && unsafe { (self.lib.PQstatus)(self.raw) == CONNECTION_OK }
    }

    /// Reconnects with the same parameters (`PQreset`). A new session: `LISTEN`s, `SET`s and
    /// temporary tables of the old one are gone.
    pub fn reset(&mut self) -> Result<(), Error> {
        // SAFETY: live connection.
        unsafe { (self.lib.PQreset)(self.raw) };
        if !self.is_ok() {
            return Err(self.conn_error("could not reconnect to PostgreSQL"));
        }
        self.utf8()
    }

    /// The process id of the server backend of this session.
    pub fn backend_pid(&self) -> i32 {
        // SAFETY: live connection.
        unsafe { (self.lib.PQbackendPID)(self.raw) }
    }

    /// The server's version as a number (`150004` for 15.4), 0 when not connected.
    pub fn server_version(&self) -> i32 {
        // SAFETY: live connection.
        unsafe { (self.lib.PQserverVersion)(self.raw) }
    }

    /// The notifications that arrived, reading what the socket holds first (`PQconsumeInput`)
    /// and draining libpq's queue, which also holds those received during statements. Never
    /// blocks. Call it before [`Conn::wait`], which sees only what is still on the socket.
    pub fn notifications(&mut self) -> Result<Vec<Notification>, Error> {
        let lib = self.lib;
        // SAFETY: live connection.
        if unsafe { (lib.PQconsumeInput)(self.raw) } == 0 {
            return Err(self.conn_error("could not read from the PostgreSQL connection"));
        }
        let mut out = Vec::new();
        loop {
            // SAFETY: live connection; each PGnotify is read, then freed once with PQfreemem.
            unsafe {
                let n = (lib.PQnotifies)(self.raw);
                if n.is_null() {
                    break;
                }
                out.push(Notification {
                    channel: text((*n).relname),
                    payload: text((*n).extra),
                    pid: (*n).be_pid,
                });
                (lib.PQfreemem)(n.cast());
            }
        }
        Ok(out)
    }

    /// Waits up to `timeout` for the server to send something (`poll` on the socket): true when
    /// there is something to read (a notification, or the connection's end, which
    /// [`Conn::notifications`] then reports), false on timeout or without a socket.
    pub fn wait(&self, timeout: Duration) -> bool {
        // SAFETY: live connection.
        let fd = unsafe { (self.lib.PQsocket)(self.raw) };
        if fd < 0 {
            return false;
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Round up, so a short wait does not become a busy loop of zero-timeout polls.
            let ms = c_int::try_from(left.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX);
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n > 0 {
                return true;
            }
            if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return false;
            }
        }
    }

    /// Whether a transaction is open (or failed, or the state is unknown): `PQtransactionStatus`
    /// is not idle.
    pub fn in_transaction(&self) -> bool {
        // SAFETY: live connection.
        unsafe { (self.lib.PQtransactionStatus)(self.raw) != PQTRANS_IDLE }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: `raw` came from PQconnectdb and is finished once.
        unsafe { (self.lib.PQfinish)(self.raw) };
    }
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("backend_pid", &self.backend_pid())
            .field("ok", &self.is_ok())
            .finish()
    }
}

/// The libpq environment variable of a connection parameter, for those that have one.
fn env_var_of(key: &str) -> Option<&'static str> {
    Some(match key {
        "host" => "PGHOST",
        "hostaddr" => "PGHOSTADDR",
        "port" => "PGPORT",
        "dbname" => "PGDATABASE",
        "user" => "PGUSER",
        "password" => "PGPASSWORD",
        "passfile" => "PGPASSFILE",
        "channel_binding" => "PGCHANNELBINDING",
        "service" => "PGSERVICE",
        "options" => "PGOPTIONS",
        "application_name" => "PGAPPNAME",
        "sslmode" => "PGSSLMODE",
        "requiressl" => "PGREQUIRESSL",
        "sslcompression" => "PGSSLCOMPRESSION",
        "sslcert" => "PGSSLCERT",
        "sslkey" => "PGSSLKEY",
        "sslrootcert" => "PGSSLROOTCERT",
        "sslcrl" => "PGSSLCRL",
        "sslcrldir" => "PGSSLCRLDIR",
        "sslsni" => "PGSSLSNI",
        "requirepeer" => "PGREQUIREPEER",
        "ssl_min_protocol_version" => "PGSSLMINPROTOCOLVERSION",
        "ssl_max_protocol_version" => "PGSSLMAXPROTOCOLVERSION",
        "gssencmode" => "PGGSSENCMODE",
        "krbsrvname" => "PGKRBSRVNAME",
        "gsslib" => "PGGSSLIB",
        "connect_timeout" => "PGCONNECT_TIMEOUT",
        "client_encoding" => "PGCLIENTENCODING",
        "target_session_attrs" => "PGTARGETSESSIONATTRS",
        "load_balance_hosts" => "PGLOADBALANCEHOSTS",
        _ => return None,
    })
}

/// Whether `s` is a PostgreSQL connection URI (`postgres://` or `postgresql://`, as libpq
/// recognizes them) rather than, say, an SQLite file's path.
pub fn is_uri(s: &str) -> bool {
    s.starts_with("postgresql://") || s.starts_with("postgres://")
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::pg_server::PgServer;

    /// A connection to a fresh database of the shared server; None when the test skips.
    fn connect(name: &str) -> Option<(&'static PgServer, String, Conn)> {
        let pg = PgServer::shared()?;
        let uri = pg.new_database(name);
        let conn = Conn::connect(&uri).unwrap_or_else(|e| panic!("connect {}: {e}", redact(&uri)));
        Some((pg, uri, conn))
    }

    #[test]
    fn queries_take_text_parameters_and_nulls() {
        let Some((_pg, _uri, mut c)) = connect("pq_params") else {
            return;
        };
        assert!(c.is_ok());
        assert!(c.server_version() >= 100000, "{}", c.server_version());
        assert!(c.backend_pid() > 0);
        let r = c
            .execute("CREATE TABLE t (id bigint PRIMARY KEY, name text); INSERT INTO t VALUES (1, 'one')")
            .unwrap();
        assert_eq!(r.affected, 1);
        let r = c
            .query(
                "INSERT INTO t VALUES ($1::bigint, $2), ($3::bigint, $4)",
                &[Some("2"), None, Some("3"), Some("drei é ✓ 'q'")],
            )
            .unwrap();
        assert_eq!(r.affected, 2);
        let r = c
            .query(
                "SELECT id, name FROM t WHERE id >= $1::bigint ORDER BY id",
                &[Some("1")],
            )
            .unwrap();
        assert_eq!(r.columns, ["id", "name"]);
        assert_eq!(r.len(), 3);
        assert!(!r.is_empty());
        assert_eq!(r.affected, 3);
        assert_eq!(r.get(0, "name"), Some("one"));
        assert_eq!(r.get(1, "id"), Some("2"));
        assert_eq!(r.get(1, "name"), None);
        assert_eq!(r.rows[1][1], None);
        assert_eq!(r.get(2, "name"), Some("drei é ✓ 'q'"));
        assert_eq!(r.get(3, "name"), None);
        assert_eq!(r.get(0, "nope"), None);
        // A NULL parameter is SQL NULL, not the empty string.
        let r = c
            .query(
                "SELECT $1::text IS NULL AS n, $2::text = '' AS e",
                &[None, Some("")],
            )
            .unwrap();
        assert_eq!((r.get(0, "n"), r.get(0, "e")), (Some("t"), Some("t")));
        // A notice goes to the log, not stderr.
        c.execute("DO $$ BEGIN RAISE NOTICE 'a notice'; END $$")
            .unwrap();
        c.execute("CREATE TABLE IF NOT EXISTS t (id int)").unwrap();
        // Statements without rows, and the empty statement.
        assert!(c.execute("").unwrap().is_empty());
        let r = c
            .query(
                "UPDATE t SET name = 'x' WHERE id = $1::bigint",
                &[Some("99")],
            )
            .unwrap();
        assert_eq!((r.affected, r.columns.len()), (0, 0));
        // Transactions show.
        assert!(!c.in_transaction());
        c.execute("BEGIN").unwrap();
        assert!(c.in_transaction());
        c.execute("ROLLBACK").unwrap();
        assert!(!c.in_transaction());
    }

    #[test]
    fn errors_carry_the_sqlstate_and_keep_the_connection() {
        let Some((_pg, _uri, mut c)) = connect("pq_errors") else {
            return;
        };
        let e = c.execute("SELEC 1").unwrap_err();
        assert_eq!(e.sqlstate.as_deref(), Some("42601"), "{e}");
        assert!(e.message.contains("syntax error"), "{e}");
        assert!(!e.connection_lost);
        assert!(e.to_string().ends_with("(SQLSTATE 42601)"), "{e}");
        // Several statements: the failing one's error, and the earlier ones are rolled back.
        c.execute("CREATE TABLE u (id int PRIMARY KEY)").unwrap();
        let e = c
            .execute("INSERT INTO u VALUES (1); INSERT INTO u VALUES (1)")
            .unwrap_err();
        assert_eq!(e.sqlstate.as_deref(), Some("23505"), "{e}");
        assert_eq!(
            c.execute("SELECT count(*) AS n FROM u")
                .unwrap()
                .get(0, "n"),
            Some("0")
        );
        // Several statements: the last one's rows.
        let r = c.execute("SELECT 1 AS a; SELECT 2 AS b").unwrap();
        assert_eq!(r.get(0, "b"), Some("2"));
        // A failed statement in a transaction leaves it failed until the rollback.
        c.execute("BEGIN").unwrap();
        assert!(c.query("SELECT 1/$1::int", &[Some("0")]).is_err());
        assert_eq!(
            c.execute("SELECT 1").unwrap_err().sqlstate.as_deref(),
            Some("25P02")
        );
        c.execute("ROLLBACK").unwrap();
        // Odd input is an error, not a panic.
        assert!(
            c.execute("SELECT '\0'")
                .unwrap_err()
                .message
                .contains("NUL")
        );
        assert!(
            c.query("SELECT $1", &[Some("a\0b")])
                .unwrap_err()
                .message
                .contains("$1")
        );
        let many = vec![Some("1"); 70000];
        assert!(c.query("SELECT 1", &many).is_err());
        assert!(c.query("SELECT $2::int", &[Some("1")]).is_err());
        // A COPY is refused and the connection stays usable.
        assert!(c.execute("COPY u TO STDOUT").is_err());
        assert!(c.execute("COPY u FROM STDIN").is_err());
        assert_eq!(c.execute("SELECT 7 AS n").unwrap().get(0, "n"), Some("7"));
        assert!(c.is_ok());
    }

    #[test]
    fn a_wrong_password_is_refused_without_showing_it() {
        let Some(pg) = PgServer::shared() else {
            return;
        };
        let wrong = "Wr0ng-pass-Word-7781";
        for uri in [
            format!(
                "postgres://svc_test:{wrong}@127.0.0.1:{}/postgres",
                pg.port()
            ),
            format!(
                "postgresql://svc_test@127.0.0.1:{}/postgres?password={wrong}",
                pg.port()
            ),
            format!(
                "host=127.0.0.1 port={} user=svc_test dbname=postgres password='{wrong}'",
                pg.port()
            ),
        ] {
            let e = Conn::connect(&uri).unwrap_err();
            let all = format!("{e} {e:?}");
            assert!(!all.contains(wrong), "{all}");
            assert!(all.contains("password authentication failed"), "{all}");
            assert!(e.connection_lost);
            assert!(!redact(&uri).contains(wrong));
        }
        // The right one works (the role exists and the failure was the password).
        let c = Conn::connect(&pg.uri("postgres")).unwrap();
        assert!(c.is_ok());
        // Nothing listening.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = Conn::connect(&format!(
            "postgres://svc_test:{wrong}@127.0.0.1:{port}/x?connect_timeout=5"
        ))
        .unwrap_err();
        assert!(!e.to_string().contains(wrong), "{e}");
        assert!(e.message.contains("127.0.0.1"), "{e}");
        // A NUL byte.
        assert!(
            Conn::connect("postgres://h/\0")
                .unwrap_err()
                .message
                .contains("NUL")
        );
    }

    #[test]
    fn scrubbing_catches_a_password_libpq_echoes() {
        // libpq echoes an invalid port; put the password where it lands in the message.
        let e = Conn::connect("postgres://u:hunter2secret@127.0.0.1:hunter2secret/db").unwrap_err();
        assert!(!e.message.contains("hunter2secret"), "{e}");
        let e = Conn::connect("host=127.0.0.1 port=Zz9secret password=Zz9secret").unwrap_err();
        assert!(!e.message.contains("Zz9secret"), "{e}");
        assert!(e.message.contains("***"), "{e}");
    }

    #[test]
    fn listen_and_notify_round_trip() {
        let Some((_pg, uri, mut listener)) = connect("pq_notify") else {
            return;
        };
        let mut sender = Conn::connect(&uri).unwrap();
        listener.execute("LISTEN svc_wake").unwrap();
        assert!(listener.notifications().unwrap().is_empty());
        assert!(!listener.wait(Duration::from_millis(50)));
        sender
            .query(
                "SELECT pg_notify('svc_wake', $1)",
                &[Some("claim released")],
            )
            .unwrap();
        assert!(listener.wait(Duration::from_secs(10)));
        let got = listener.notifications().unwrap();
        assert_eq!(
            got,
            [Notification {
                channel: "svc_wake".into(),
                payload: "claim released".into(),
                pid: sender.backend_pid(),
            }]
        );
        // From another thread, while this one waits; and one received during a statement
        // waits in libpq's queue, not on the socket.
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            sender
                .execute("NOTIFY svc_wake, 'a'; NOTIFY svc_wake, 'b'")
                .unwrap();
            sender
        });
        let started = Instant::now();
        assert!(listener.wait(Duration::from_secs(10)));
        assert!(started.elapsed() < Duration::from_secs(5));
        let sender = t.join().unwrap();
        let mut payloads = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while payloads.len() < 2 && Instant::now() < deadline {
            payloads.extend(
                listener
                    .notifications()
                    .unwrap()
                    .into_iter()
                    .map(|n| n.payload),
            );
            listener.wait(Duration::from_millis(100));
        }
        assert_eq!(payloads, ["a", "b"]);
        listener
            .execute("SELECT pg_notify('svc_wake', 'self')")
            .unwrap();
        let own = listener.notifications().unwrap();
        assert_eq!(own.len(), 1);
        assert_eq!(own[0].pid, listener.backend_pid());
        drop(sender);
    }

    #[test]
    fn a_terminated_session_is_lost_and_reset_brings_it_back() {
        let Some((pg, uri, mut c)) = connect("pq_terminate") else {
            return;
        };
        let db = uri.rsplit('/').next().unwrap().to_string();
        let before = c.backend_pid();
        c.execute("LISTEN gone").unwrap();
        assert_eq!(pg.terminate_connections(&db), 1);
        // The listener sees the end on its socket.
        assert!(c.wait(Duration::from_secs(10)));
        let e = c.execute("SELECT 1").unwrap_err();
        assert!(e.connection_lost, "{e:?}");
        assert!(!c.is_ok());
        assert!(c.notifications().unwrap_err().connection_lost);
        assert!(c.query("SELECT 1", &[]).unwrap_err().connection_lost);
        c.reset().unwrap();
        assert!(c.is_ok());
        assert_ne!(c.backend_pid(), before);
        assert_eq!(
            c.execute("SELECT 1 AS one").unwrap().get(0, "one"),
            Some("1")
        );
        // A Conn moves to another thread.
        let t = std::thread::spawn(move || {
            c.execute("SELECT 2 AS two")
                .unwrap()
                .get(0, "two")
                .map(str::to_string)
        });
        assert_eq!(t.join().unwrap().as_deref(), Some("2"));
    }

    #[test]
    fn a_restarted_or_stopped_server_loses_the_session_until_it_is_back() {
        let Some(pg) = PgServer::start() else {
            return;
        };
        let dir = pg.psql("postgres", "SHOW data_directory");
        let uri = pg.new_database("pq_restart");
        let mut c = Conn::connect(&uri).unwrap();
        c.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before')")
            .unwrap();
        pg.restart();
        let e = c.execute("SELECT v FROM kept").unwrap_err();
        assert!(e.connection_lost, "{e:?}");
        c.reset().unwrap();
        assert_eq!(
            c.execute("SELECT v FROM kept").unwrap().get(0, "v"),
            Some("before")
        );
        pg.stop();
        assert!(c.execute("SELECT 1").unwrap_err().connection_lost);
        let e = c.reset().unwrap_err();
        assert!(e.connection_lost, "{e:?}");
        assert!(!e.message.contains(pg.password()), "{e}");
        assert!(Conn::connect(&uri).is_err());
        pg.start_again();
        c.reset().unwrap();
        assert_eq!(
            c.execute("SELECT v FROM kept").unwrap().get(0, "v"),
            Some("before")
        );
        drop(c);
        // Dropping the server stops it and removes its directory.
        drop(pg);
        assert!(!std::path::Path::new(&dir).exists(), "{dir}");
        assert!(Conn::connect(&uri).is_err());
    }

    #[test]
    fn defaults_apply_where_the_uri_sets_nothing() {
        let Some((_pg, uri, _c)) = connect("pq_defaults") else {
            return;
        };
        let name = |c: &mut Conn| {
            c.execute("SHOW application_name").unwrap().rows[0][0]
                .clone()
                .unwrap()
        };
        let defaults = [
            ("application_name", "svc-default"),
            ("connect_timeout", "10"),
        ];
        let mut c = Conn::connect_with(&uri, &defaults).unwrap();
        assert_eq!(name(&mut c), "svc-default");
        let mut c = Conn::connect_with(&format!("{uri}?application_name=mine"), &defaults).unwrap();
        assert_eq!(name(&mut c), "mine");
        // The defaults survive a reset.
        let mut c = Conn::connect_with(&uri, &defaults).unwrap();
        c.reset().unwrap();
        assert_eq!(name(&mut c), "svc-default");
        // A wrong password through this path is scrubbed too.
        let bad = uri.replace(_pg.password(), "Xq7-wrong-pw");
        let e = Conn::connect_with(&bad, &defaults).unwrap_err();
        assert!(!e.to_string().contains("Xq7-wrong-pw"), "{e}");
        assert!(env_var_of("connect_timeout") == Some("PGCONNECT_TIMEOUT"));
        assert!(env_var_of("keepalives_idle").is_none());
    }

    #[test]
    fn tls_is_libpqs_own() {
        let Some((pg, uri, mut c)) = connect("pq_tls") else {
            return;
        };
        let ssl = |c: &mut Conn| {
            let r = c
                .execute("SELECT ssl::text AS ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .unwrap();
            r.get(0, "ssl").map(str::to_string)
        };
        let Some(root) = pg.tls_root_cert() else {
            eprintln!("skipping: the test server has no TLS (openssl is missing)");
            return;
        };
        // libpq's default (sslmode=prefer) takes the server's TLS.
        assert_eq!(ssl(&mut c).as_deref(), Some("true"));
        let mut c = Conn::connect(&format!("{uri}?sslmode=disable")).unwrap();
        assert_eq!(ssl(&mut c).as_deref(), Some("false"));
        let verified = format!("{uri}?sslmode=verify-full&sslrootcert={}", root.display());
        let mut c = Conn::connect(&verified).unwrap();
        assert_eq!(ssl(&mut c).as_deref(), Some("true"));
        // A certificate that does not match: refused by libpq's verification.
        let other = uri.replace("127.0.0.1", "localhost");
        let e = Conn::connect(&format!(
            "{other}?sslmode=verify-full&sslrootcert={}",
            root.display()
        ))
        .unwrap_err();
        assert!(e.message.contains("localhost"), "{e}");
        assert!(!e.message.contains(pg.password()), "{e}");
    }

    #[test]
    fn is_uri_knows_both_schemes() {
        assert!(is_uri("postgres://h/db"));
        assert!(is_uri("postgresql://h/db"));
        assert!(!is_uri("/var/lib/svc.db"));
        assert!(!is_uri("memory"));
        assert!(!is_uri("host=h"));
    }

    #[test]
    fn a_missing_library_gives_the_install_message() {
        let err = load_from(&["/nonexistent/libpq-missing.so.5"])
            .err()
            .expect("a missing file cannot load");
        assert!(
            err.starts_with("PostgreSQL needs libpq (libpq.so.5), which is not installed: install the libpq5 package (Debian/Ubuntu) or postgresql-libs; dlopen said: "),
            "{err}"
        );
        assert!(err.contains("libpq-missing.so.5"), "{err}");
        // A library that is not libpq.
        let err = load_from(&["libc.so.6"]).err().expect("libc is not libpq");
        assert!(err.contains("lacks PQconnectdb"), "{err}");
    }
}
