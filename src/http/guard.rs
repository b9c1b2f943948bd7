//! Connection supervision and the restartable accept loop of the HTTP server (the `http`
//! module documentation says why tiny_http needs it).
//!
//! tiny_http does not expose its sockets, so the guard finds them in `/proc/self/fd` (kept open:
//! a scan needs no new descriptor, even when they have run out): a connection is a socket whose
//! local address is the listener's. It knows them by socket inode, which unlike a descriptor
//! number is never reused, and acts on one only through a spare descriptor duplicated from the
//! listed one and checked to still be that socket. Handlers tell it, by peer address, which
//! connections have a request in hand ([`Busy`]); the others are idle.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::unix::io::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tiny_http::Server;

/// A connection with no request in hand for this long is closed: a client has this long to
/// send a request header (however slowly it trickles in), and a kept-alive connection lives
/// this long between requests.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// An idle connection that has sent this much without completing a request header is closed
/// (tiny_http reads a header line, and any number of them, without a limit).
const MAX_HEAD_BYTES: u64 = 1 << 20;
/// Client connections above which the longest idle are closed; each costs tiny_http a thread.
const MAX_CONNECTIONS: usize = 4096;
/// A connection with a request in hand, at least [`STALL_QUEUED`] bytes waiting to be sent to
/// it and none acknowledged by its client for this long has stopped reading: it is closed,
/// which fails the write holding a handler thread at once. (A kernel that keeps growing the
/// send buffer lets such a write inch on well past [`super::SEND_TIMEOUT`].)
const STALL_AFTER: Duration = Duration::from_secs(1);
const STALL_QUEUED: u64 = 256 * 1024;
/// How often the guard looks.
pub const EVERY: Duration = Duration::from_millis(500);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The tiny_http server, replaceable. tiny_http's accept loop ends for good on the first
/// accept error, and panics when it cannot duplicate an accepted socket; both happen when the
/// process runs out of descriptors, and either way it closes its listener. The listening socket
/// lives on in `keep`, so a new tiny_http server takes over the same port, with the
/// connections waiting in its backlog.
pub struct Front {
    keep: TcpListener,
    /// The server, and the descriptor of the listener its accept loop owns.
    current: Mutex<(Arc<Server>, i32)>,
}

impl Front {
    pub fn new(listener: TcpListener) -> std::io::Result<Front> {
        let keep = listener.try_clone()?;
        let fd = listener.as_raw_fd();
        let server = Server::from_listener(listener, None).map_err(std::io::Error::other)?;
        Ok(Front {
            keep,
            current: Mutex::new((Arc::new(server), fd)),
        })
    }

    pub fn current(&self) -> Arc<Server> {
        Arc::clone(&lock(&self.current).0)
    }

    /// Starts a new server if tiny_http's accept loop has ended (its listener descriptor is
    /// closed); returns the old one, whose connections may still send requests.
    pub fn check(&self) -> Option<Arc<Server>> {
        let mut current = lock(&self.current);
        if same_socket(current.1, self.keep.as_raw_fd()) {
            return None;
        }
        // Out of descriptors or threads still: the next check tries again.
        let listener = self.keep.try_clone().ok()?;
        let fd = listener.as_raw_fd();
        // Started from a thread of that name, which tiny_http's threads inherit; tiny_http
        // panics if it cannot spawn its accept thread.
        let server = std::thread::Builder::new()
            .name("http-accept".into())
            .spawn(move || Server::from_listener(listener, None))
            .ok()?
            .join()
            .ok()?
            .ok()?;
        log::warn!(
            "HTTP: tiny_http stopped accepting connections (out of file descriptors?); \
             accepting again on the same socket"
        );
        let (old, _) = std::mem::replace(&mut *current, (Arc::new(server), fd));
        Some(old)
    }
}

/// Marks a request in hand on a connection while it lives.
pub struct Busy {
    guard: Arc<Guard>,
    peer: Option<SocketAddr>,
    pipelined: bool,
}

impl Busy {
    /// Whether the connection had another request in hand already.
    pub fn pipelined(&self) -> bool {
        self.pipelined
    }

    /// The connection is closed if this request is still in hand at `at`.
    pub fn deadline(&self, at: Option<Instant>) {
        if let Some(peer) = self.peer
            && let Some(p) = lock(&self.guard.peers).get_mut(&peer)
        {
            p.deadline = at;
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(peer) = self.peer
            && let Some(p) = lock(&self.guard.peers).get_mut(&peer)
        {
            p.busy = p.busy.saturating_sub(1);
            p.activity += 1;
            if p.busy == 0 {
                p.deadline = None;
            }
        }
    }
}

#[derive(Default)]
struct Peer {
    /// Requests in hand.
    busy: u32,
    /// Counts requests started and finished: a change is progress.
    activity: u64,
    deadline: Option<Instant>,
}

pub struct Guard {
    peers: Mutex<HashMap<SocketAddr, Peer>>,
    /// Lock order: `table`, then `peers`.
    table: Mutex<Table>,
    port: u16,
    ip: IpAddr,
}

struct Conn {
    /// One of the descriptors of this socket when last listed.
    fd: i32,
    peer: SocketAddr,
    idle_since: Instant,
    /// Bytes received when it became idle.
    rx_base: Option<u64>,
    /// The peer's activity count when last looked at.
    seen: u64,
    /// Bytes the client had acknowledged, and since when.
    acked: Option<(u64, Instant)>,
    /// Shut down by the guard: nothing more to do with it.
    shut: bool,
    /// When the guard first saw it.
    since: Instant,
}

struct Table {
    /// Client connections, by socket inode.
    conns: HashMap<u64, Conn>,
    /// Other sockets (listeners, outgoing connections).
    others: HashSet<u64>,
    dir: FdDir,
    /// A descriptor reserved for acting on a socket: it points at the listener when unused.
    spare: i32,
    parking: i32,
    /// Descriptors open at the last scan.
    fds: usize,
}

impl Guard {
    pub fn new(front: &Front, addr: SocketAddr) -> std::io::Result<Guard> {
        let parking = front.keep.as_raw_fd();
        // SAFETY: duplicates a descriptor this process owns.
        let spare = unsafe { libc::fcntl(parking, libc::F_DUPFD_CLOEXEC, 0) };
        if spare < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Guard {
            peers: Mutex::default(),
            table: Mutex::new(Table {
                conns: HashMap::new(),
                others: HashSet::new(),
                dir: FdDir::open()?,
                spare,
                parking,
                fds: 0,
            }),
            port: addr.port(),
            ip: addr.ip(),
        })
    }

    /// Marks a request in hand on the connection from `peer` until the result is dropped.
    pub fn busy(self: &Arc<Self>, peer: Option<SocketAddr>) -> Busy {
        let mut pipelined = false;
        if let Some(peer) = peer {
            let mut peers = lock(&self.peers);
            let p = peers.entry(peer).or_default();
            pipelined = p.busy > 0;
            p.busy += 1;
            p.activity += 1;
        }
        Busy {
            guard: Arc::clone(self),
            peer,
            pipelined,
        }
    }

    /// Whether a connection first seen before `t` is still open.
    pub fn any_seen_before(&self, t: Instant) -> bool {
        lock(&self.table)
            .conns
            .values()
            .any(|c| !c.shut && c.since < t)
    }

    /// `shutdown(2)` on the connection from `peer`, if it is found.
    pub fn shutdown(&self, peer: Option<SocketAddr>, how: i32) {
        let Some(peer) = peer else { return };
        let mut table = lock(&self.table);
        if let Some(ino) = table.find(peer, self.port, self.ip) {
            table.shut(ino, how);
        }
    }

    /// One look: closes connections idle too long, past their deadline, or sending a header
    /// without end, then the longest idle while there are too many connections or too few
    /// descriptors left.
    pub fn tick(&self) {
        let now = Instant::now();
        let mut table = lock(&self.table);
        table.scan(self.port, self.ip, now);
        let mut peers = lock(&self.peers);
        let mut doomed: Vec<u64> = Vec::new();
        let mut idle: Vec<(Instant, u64)> = Vec::new();
        let mut live: usize = 0;
        for (&ino, c) in table.conns.iter_mut().filter(|(_, c)| !c.shut) {
            live += 1;
            let (busy, activity, deadline) = peers
                .get(&c.peer)
                .map_or((0, 0, None), |p| (p.busy, p.activity, p.deadline));
            if activity != c.seen {
                c.seen = activity;
                c.idle_since = now;
                c.rx_base = None;
                c.acked = None;
            }
            if busy > 0 {
                if deadline.is_some_and(|d| now >= d) {
                    doomed.push(ino);
                } else if let Some((acked, queued)) = send_state(c.fd) {
                    // The stall clock runs only while much is queued and nothing is acked.
                    match c.acked {
                        Some((before, since)) if before == acked && queued >= STALL_QUEUED => {
                            if now.duration_since(since) >= STALL_AFTER {
                                doomed.push(ino);
                            }
                        }
                        _ => c.acked = Some((acked, now)),
                    }
                }
                continue;
            }
            if now.duration_since(c.idle_since) >= IDLE_TIMEOUT {
                doomed.push(ino);
                continue;
            }
            let rx = bytes_received(c.fd);
            match (c.rx_base, rx) {
                (None, _) => c.rx_base = rx,
                (Some(base), Some(rx)) if rx.saturating_sub(base) > MAX_HEAD_BYTES => {
                    doomed.push(ino);
                    continue;
                }
                _ => {}
            }
            idle.push((c.idle_since, ino));
        }
        let limit = fd_limit();
        // Each connection holds two descriptors.
        let fd_excess = if table.fds > limit / 10 * 8 {
            (table.fds - limit / 10 * 7).div_ceil(2)
        } else {
            0
        };
        let excess = fd_excess
            .max(live.saturating_sub(MAX_CONNECTIONS))
            .saturating_sub(doomed.len())
            .min(idle.len());
        if excess > 0 {
            log::warn!(
                "HTTP: {live} connections, {} of {limit} file descriptors in use: closing \
                 the {excess} longest idle",
                table.fds
            );
            idle.sort();
            doomed.extend(idle.iter().take(excess).map(|&(_, ino)| ino));
        }
        let present: HashSet<SocketAddr> = table
            .conns
            .values()
            .filter(|c| !c.shut)
            .map(|c| c.peer)
            .collect();
        peers.retain(|peer, p| p.busy > 0 || present.contains(peer));
        drop(peers);
        if !doomed.is_empty() {
            log::debug!("HTTP: closing {} connections", doomed.len());
        }
        for ino in doomed {
            table.shut(ino, libc::SHUT_RDWR);
        }
    }
}

impl Table {
    /// Lists the process's sockets; new ones are classified once.
    fn scan(&mut self, port: u16, ip: IpAddr, now: Instant) {
        let fds = self.dir.list();
        self.fds = fds.len();
        let mut present: HashMap<u64, i32> = HashMap::with_capacity(fds.len());
        for fd in fds {
            if fd != self.spare
                && let Some(ino) = socket_inode(fd)
            {
                present.entry(ino).or_insert(fd);
            }
        }
        self.conns.retain(|ino, c| match present.get(ino) {
            Some(&fd) => {
                c.fd = fd;
                true
            }
            None => false,
        });
        self.others.retain(|ino| present.contains_key(ino));
        for (ino, fd) in present {
            if self.conns.contains_key(&ino) || self.others.contains(&ino) {
                continue;
            }
            let ours = match (
                super::ws::sock_addr(fd, false),
                super::ws::sock_addr(fd, true),
            ) {
                (Some(local), Some(peer))
                    if local.port() == port && (ip.is_unspecified() || local.ip() == ip) =>
                {
                    Some(peer)
                }
                _ => None,
            };
            // The descriptor may have been closed and reused since it was listed.
            if socket_inode(fd) != Some(ino) {
                continue;
            }
            match ours {
                Some(peer) => {
                    self.conns.insert(
                        ino,
                        Conn {
                            fd,
                            peer,
                            idle_since: now,
                            rx_base: None,
                            seen: 0,
                            acked: None,
                            shut: false,
                            since: now,
                        },
                    );
                }
                None => {
                    self.others.insert(ino);
                }
            }
        }
    }

    /// The connection from `peer`, scanning again if it is not known yet.
    fn find(&mut self, peer: SocketAddr, port: u16, ip: IpAddr) -> Option<u64> {
        let hit = |t: &Table| {
            t.conns
                .iter()
                .find(|(_, c)| c.peer == peer && !c.shut)
                .map(|(&ino, _)| ino)
        };
        hit(self).or_else(|| {
            self.scan(port, ip, Instant::now());
            hit(self)
        })
    }

    /// Runs `f` on socket `ino` through the spare descriptor: a duplicate of the listed
    /// descriptor made now either is that socket, or is left alone.
    fn on(&self, ino: u64, f: impl FnOnce(i32)) -> bool {
        let Some(c) = self.conns.get(&ino) else {
            return false;
        };
        // SAFETY: dup3 onto the spare descriptor this table owns; close-on-exec keeps it from
        // children.
        unsafe {
            if libc::dup3(c.fd, self.spare, libc::O_CLOEXEC) < 0 {
                return false;
            }
            let same = socket_inode(self.spare) == Some(ino);
            if same {
                f(self.spare);
            }
            libc::dup3(self.parking, self.spare, libc::O_CLOEXEC);
            same
        }
    }

    fn shut(&mut self, ino: u64, how: i32) {
        self.on(ino, |s| {
            // SAFETY: shutdown on a descriptor that is this connection's socket.
            unsafe { libc::shutdown(s, how) };
        });
        if how == libc::SHUT_RDWR
            && let Some(c) = self.conns.get_mut(&ino)
        {
            c.shut = true;
        }
    }
}

/// `/proc/self/fd`, open for the process's life.
struct FdDir(*mut libc::DIR);

// SAFETY: the directory stream is only used under the table's lock.
unsafe impl Send for FdDir {}

impl FdDir {
    fn open() -> std::io::Result<FdDir> {
        // SAFETY: a valid C string; glibc opens it close-on-exec.
        let dir = unsafe { libc::opendir(c"/proc/self/fd".as_ptr()) };
        if dir.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        Ok(FdDir(dir))
    }

    /// The descriptors open now.
    fn list(&mut self) -> Vec<i32> {
        let mut fds = Vec::new();
        // SAFETY: the stream is open; entries are read before the next readdir call.
        unsafe {
            libc::rewinddir(self.0);
            loop {
                let entry = libc::readdir(self.0);
                if entry.is_null() {
                    break;
                }
                let name = std::ffi::CStr::from_ptr((*entry).d_name.as_ptr());
                if let Some(fd) = name.to_str().ok().and_then(|n| n.parse().ok()) {
                    fds.push(fd);
                }
            }
        }
        fds
    }
}

/// fstat, if `fd` is open and of file type `kind`.
fn stat(fd: i32, kind: libc::mode_t) -> Option<libc::stat> {
    // SAFETY: fstat writes into the zeroed struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == kind).then_some(st)
    }
}

fn socket_inode(fd: i32) -> Option<u64> {
    // ino_t is u32 on some 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    stat(fd, libc::S_IFSOCK).map(|st| st.st_ino as u64)
}

fn same_socket(a: i32, b: i32) -> bool {
    match (stat(a, libc::S_IFSOCK), stat(b, libc::S_IFSOCK)) {
        (Some(a), Some(b)) => a.st_ino == b.st_ino && a.st_dev == b.st_dev,
        _ => false,
    }
}

fn tcp_info(fd: i32) -> Option<libc::tcp_info> {
    // SAFETY: getsockopt writes at most `len` bytes into the zeroed struct.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut info as *mut libc::tcp_info as *mut libc::c_void,
            &mut len,
        );
        // Kernels older than 4.1 fill less of the struct than the byte counters.
        let needed = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) + 8;
        (rc == 0 && len as usize >= needed).then_some(info)
    }
}

fn bytes_received(fd: i32) -> Option<u64> {
    tcp_info(fd).map(|i| i.tcpi_bytes_received)
}

/// Bytes the client has acknowledged, and bytes waiting in the send queue.
fn send_state(fd: i32) -> Option<(u64, u64)> {
    let acked = tcp_info(fd)?.tcpi_bytes_acked;
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) };
    (rc == 0).then_some((acked, queued.max(0) as u64))
}

fn fd_limit() -> usize {
    // SAFETY: getrlimit writes into the zeroed struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 || r.rlim_cur == libc::RLIM_INFINITY {
            usize::MAX
        } else {
            r.rlim_cur as usize
        }
    }
}
