//! A TCP proxy between one daemon and the real PostgreSQL server, for fault tests: it can
//! freeze that daemon's connections (bytes held both ways, sockets open: a paused VM or a
//! partition as the server sees it), freeze them right after the daemon began a write
//! transaction, cut them (and refuse new ones while blocked), or lose the answers to COMMITs
//! (the server commits, the daemon never hears).
//!
//! It reads the protocol only as far as it must: the startup packet, then the frontend's
//! messages (a type byte and a length), looking at simple `Query` messages ('Q') for `BEGIN`
//! and `COMMIT`. Daemons reach it with `sslmode=disable` (see [`Proxy::uri`]), so the first
//! packet is the startup message.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Faults {
    /// No byte moves either way while set.
    frozen: AtomicBool,
    /// Freeze every connection once a connection inside a transaction has sent a statement on
    /// the claims or retries (so its backend holds their row locks).
    freeze_in_transaction: AtomicBool,
    /// New connections are closed at once while set.
    blocked: AtomicBool,
    /// How many COMMIT answers are still to lose.
    lose_commits: AtomicUsize,
    /// How many were lost.
    lost: AtomicUsize,
    /// Every connection's sockets (client, server), to cut them.
    open: Mutex<Vec<(TcpStream, TcpStream)>>,
}

/// A proxy to 127.0.0.1:`upstream`, listening on a port of its own; ends with the test process.
pub struct Proxy {
    pub port: u16,
    faults: Arc<Faults>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let faults = Arc::new(Faults::default());
        let shared = Arc::clone(&faults);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if shared.blocked.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                shared
                    .open
                    .lock()
                    .unwrap()
                    .push((client.try_clone().unwrap(), server.try_clone().unwrap()));
                let conn = Arc::new(Conn::default());
                let (f1, c1) = (Arc::clone(&shared), Arc::clone(&conn));
                let (from, to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || frontend(from, to, &f1, &c1));
                let (f2, c2) = (Arc::clone(&shared), conn);
                std::thread::spawn(move || backend(server, client, &f2, &c2));
            }
        });
        Proxy { port, faults }
    }

    /// `uri` (a server's, `postgres://user:pw@127.0.0.1:PORT/db`) through this proxy.
    pub fn uri(&self, uri: &str, server_port: u16) -> String {
        let through = uri.replace(
            &format!("127.0.0.1:{server_port}"),
            &format!("127.0.0.1:{}", self.port),
        );
        let sep = if through.contains('?') { '&' } else { '?' };
        format!("{through}{sep}sslmode=disable&gssencmode=disable")
    }

    /// Holds every byte, both ways, from now on (sockets stay open).
    pub fn freeze(&self) {
        self.faults.frozen.store(true, Ordering::SeqCst);
    }

    /// Freezes every connection as soon as one, inside a transaction, has sent a statement on
    /// the claims or retries (the server runs it and holds its row locks; its answer is held).
    pub fn freeze_in_next_transaction(&self) {
        self.faults
            .freeze_in_transaction
            .store(true, Ordering::SeqCst);
    }

    pub fn is_frozen(&self) -> bool {
        self.faults.frozen.load(Ordering::SeqCst)
    }

    /// Lets bytes move again.
    pub fn thaw(&self) {
        self.faults
            .freeze_in_transaction
            .store(false, Ordering::SeqCst);
        self.faults.frozen.store(false, Ordering::SeqCst);
    }

    /// Closes every connection and refuses new ones until [`Proxy::unblock`].
    pub fn block(&self) {
        self.faults.blocked.store(true, Ordering::SeqCst);
        for (a, b) in self.faults.open.lock().unwrap().drain(..) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }

    pub fn unblock(&self) {
        self.faults.blocked.store(false, Ordering::SeqCst);
    }

    /// Loses the answers to the next `n` COMMITs: each is passed to the server (which
    /// commits), its answer dropped and the connection closed.
    pub fn lose_commit_answers(&self, n: usize) {
        self.faults.lose_commits.store(n, Ordering::SeqCst);
    }

    /// How many COMMIT answers were lost so far.
    pub fn lost_commits(&self) -> usize {
        self.faults.lost.load(Ordering::SeqCst)
    }
}

/// One proxied connection's state.
#[derive(Default)]
struct Conn {
    /// The frontend sent a COMMIT whose answer is to be lost.
    lose_answer: AtomicBool,
    /// Closed by either pump.
    closed: AtomicBool,
}

fn close(a: &TcpStream, b: &TcpStream, conn: &Conn) {
    conn.closed.store(true, Ordering::SeqCst);
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
}

/// Waits while the proxy is frozen (the bytes stay where they are).
fn hold(faults: &Faults, conn: &Conn) {
    while faults.frozen.load(Ordering::SeqCst) && !conn.closed.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_exact(s: &mut TcpStream, n: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0; n];
    s.read_exact(&mut buf).ok()?;
    Some(buf)
}

/// Client to server, message by message.
fn frontend(mut from: TcpStream, mut to: TcpStream, faults: &Faults, conn: &Conn) {
    // The startup packet: a length, then the rest.
    let Some(len) = read_exact(&mut from, 4) else {
        return close(&from, &to, conn);
    };
    let n = u32::from_be_bytes(len[..4].try_into().unwrap()) as usize;
    let Some(rest) = read_exact(&mut from, n.saturating_sub(4)) else {
        return close(&from, &to, conn);
    };
    if to
        .write_all(&len)
        .and_then(|_| to.write_all(&rest))
        .is_err()
    {
        return close(&from, &to, conn);
    }
    let mut in_transaction = false;
    // The transaction sent a statement on the claims or retries.
    let mut writes_slots = false;
    loop {
        let Some(head) = read_exact(&mut from, 5) else {
            return close(&from, &to, conn);
        };
        let n = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        let Some(body) = read_exact(&mut from, n.saturating_sub(4)) else {
            return close(&from, &to, conn);
        };
        hold(faults, conn);
        let kind = head[0];
        let text = String::from_utf8_lossy(&body).trim().to_ascii_uppercase();
        let text = text.trim_end_matches('\0').trim();
        if kind == b'Q' && text.starts_with("COMMIT") {
            in_transaction = false;
            if faults
                .lose_commits
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                conn.lose_answer.store(true, Ordering::SeqCst);
            }
        }
        if to
            .write_all(&head)
            .and_then(|_| to.write_all(&body))
            .is_err()
        {
            return close(&from, &to, conn);
        }
        if kind == b'Q' && text.starts_with("BEGIN") {
            in_transaction = true;
            writes_slots = false;
        } else if in_transaction && kind == b'P' && touches_slots(text) {
            writes_slots = true;
        } else if writes_slots
            && kind == b'S'
            && faults.freeze_in_transaction.load(Ordering::SeqCst)
        {
            // A statement on the claims or retries is with the server, inside a transaction:
            // it holds their row locks now. Freeze everything.
            faults.freeze_in_transaction.store(false, Ordering::SeqCst);
            faults.frozen.store(true, Ordering::SeqCst);
        }
    }
}

/// Whether a statement's text reads or writes the slots' rows.
fn touches_slots(text: &str) -> bool {
    [
        "INTO CLAIMS",
        "INTO RETRIES",
        "FROM CLAIMS",
        "FROM RETRIES",
        "UPDATE CLAIMS",
        "UPDATE RETRIES",
    ]
    .iter()
    .any(|t| text.contains(t))
}

/// Server to client, chunk by chunk; an answer to lose is dropped with the connection.
fn backend(mut from: TcpStream, mut to: TcpStream, faults: &Faults, conn: &Conn) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return close(&from, &to, conn),
            Ok(n) => n,
        };
        hold(faults, conn);
        if conn.lose_answer.load(Ordering::SeqCst) {
            faults.lost.fetch_add(1, Ordering::SeqCst);
            return close(&from, &to, conn);
        }
        if to.write_all(&buf[..n]).is_err() {
            return close(&from, &to, conn);
        }
    }
}
