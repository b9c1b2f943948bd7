//! A real OpenSSH server on 127.0.0.1 for integration tests: the system `/usr/sbin/sshd` with
//! throwaway keys, and an ssh client config (`ssh -F`) whose host aliases log in to it.
//!
//! ```ignore
//! let dir = TestDir::new("workers");
//! let Some(sshd) = Sshd::start_or_skip(&dir.join("sshd"), &["w1", "w2"]) else {
//!     return;
//! };
//! let out = sshd.ssh("w1", "uname -a");
//! ```
//!
//! Nothing outlives an [`Sshd`]: dropping it kills sshd and every process of the sessions it
//! served, also the ones that left its process tree (found by their `SSH_CONNECTION`), so the
//! ssh clients connected to it end too. Declare the `Sshd` after the `TestDir` holding its
//! directory, so that it is dropped first.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The system sshd (Debian package openssh-server); it must be run by its absolute path.
const SSHD: &str = "/usr/sbin/sshd";
/// sshd's privilege separation directory, needed when it runs as root.
const PRIVSEP_DIR: &str = "/run/sshd";
/// How long sshd gets to accept connections on its port.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ports are tried when another process takes the free one before sshd binds it.
const BIND_ATTEMPTS: usize = 3;
/// The alias of the client config that points at a port nothing listens on.
pub const UNREACHABLE: &str = "unreachable";

/// A running sshd on 127.0.0.1 with its client config; killed, with its sessions, on drop.
pub struct Sshd {
    /// The port sshd listens on, on 127.0.0.1.
    pub port: u16,
    /// The ssh client config (`ssh -F`): a `Host` block per alias, plus `unreachable`.
    pub config: PathBuf,
    /// The directory holding the keys, both configs, known_hosts and sshd's log.
    pub dir: PathBuf,
    /// The user every alias logs in as: the current user (sshd as non-root can serve no other).
    pub user: String,
    /// The client's private key, the only one the server accepts.
    pub identity: PathBuf,
    /// The client's known_hosts file, pinning the server's host key for `[127.0.0.1]:<port>`.
    pub known_hosts: PathBuf,
    /// The port of the `unreachable` alias: bound but never listened on while this value
    /// lives, so connections to it are refused and no other process can take it.
    pub unreachable_port: u16,
    child: Child,
    _unreachable_socket: OwnedFd,
}

impl Sshd {
    /// Starts sshd with the client aliases `aliases` (e.g. `["w1", "w2"]`) in `dir`, which
    /// is created if missing. Returns None, after one line on stderr saying why, only when
    /// sshd cannot run on this machine; callers skip their test then.
    pub fn start(dir: &Path, aliases: &[&str]) -> Option<Sshd> {
        match Sshd::try_start(dir, aliases) {
            Ok(sshd) => Some(sshd),
            Err(why) => {
                eprintln!("sshd not available: {why}");
                None
            }
        }
    }

    /// [`Sshd::start`] with the skip policy of the tests: when sshd cannot run, prints
    /// `skipped: ...` and returns None, except under `CI=true`, where sshd must work (CI
    /// installs openssh-server), so it panics.
    pub fn start_or_skip(dir: &Path, aliases: &[&str]) -> Option<Sshd> {
        match Sshd::try_start(dir, aliases) {
            Ok(sshd) => Some(sshd),
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("sshd must work in CI (CI=true): {why}")
            }
            Err(why) => {
                eprintln!("skipped: sshd not available: {why}");
                None
            }
        }
    }

    /// [`Sshd::start`], returning why sshd cannot run instead of printing it.
    pub fn try_start(dir: &Path, aliases: &[&str]) -> Result<Sshd, String> {
        for alias in aliases {
            assert!(
                !alias.is_empty()
                    && *alias != UNREACHABLE
                    && alias
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
                "bad ssh alias {alias:?}"
            );
        }
        if !Path::new(SSHD).is_file() {
            return Err(format!("{SSHD} is missing (install openssh-server)"));
        }
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        // Absolute paths throughout: sshd and ssh resolve relative ones against other
        // directories.
        let dir = dir
            .canonicalize()
            .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
        let user = current_user()?;
        if is_root() && !Path::new(PRIVSEP_DIR).is_dir() {
            fs::create_dir_all(PRIVSEP_DIR)
                .and_then(|()| fs::set_permissions(PRIVSEP_DIR, fs::Permissions::from_mode(0o755)))
                .map_err(|e| format!("cannot create {PRIVSEP_DIR}: {e}"))?;
        }

        // Throwaway keys: the server's host key and the client's key pair, which is the only
        // authorized one.
        let host_key = dir.join("ssh_host_ed25519_key");
        let identity = dir.join("id_ed25519");
        keygen(&host_key)?;
        keygen(&identity)?;
        let authorized_keys = dir.join("authorized_keys");
        fs::copy(identity.with_extension("pub"), &authorized_keys)
            .map_err(|e| format!("cannot write {}: {e}", authorized_keys.display()))?;
        let host_public = read(&host_key.with_extension("pub"))?;
        // "<type> <base64>", without the comment.
        let host_public = host_public
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");

        let (unreachable_socket, unreachable_port) = refusing_port()?;
        let sshd_config = dir.join("sshd_config");
        let log = dir.join("sshd.log");
        let mut server = ServerConfig {
            dir: dir.clone(),
            host_key,
            authorized_keys,
            disable_penalties: false,
        };
        // OpenSSH 9.8+ penalizes (then refuses) a source address for connections without
        // authentication, such as the readiness probe below and tests of failures; every
        // connection here comes from 127.0.0.1, so the penalties are turned off where sshd
        // knows them. `sshd -T` prints the effective config, and validates ours on the way.
        write(&sshd_config, &server.render(22))?;
        let dump = Command::new(SSHD)
            .arg("-T")
            .arg("-f")
            .arg(&sshd_config)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {SSHD}: {e}"))?;
        if !dump.status.success() {
            return Err(format!(
                "{SSHD} -T rejects the test config: {}",
                String::from_utf8_lossy(&dump.stderr).trim()
            ));
        }
        server.disable_penalties = String::from_utf8_lossy(&dump.stdout)
            .lines()
            .any(|line| line.starts_with("persourcepenalties "));

        // Pick a free port, then let sshd bind it; another process may take it in between,
        // and then sshd exits and the next port is tried.
        let mut why = String::new();
        for _ in 0..BIND_ATTEMPTS {
            let port = free_port()?;
            write(&sshd_config, &server.render(port))?;
            let log_file = fs::File::create(&log)
                .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
            let child = Command::new(SSHD)
                // -D: stay in the foreground as our child; -e: log to stderr (the log file).
                .arg("-D")
                .arg("-e")
                .arg("-f")
                .arg(&sshd_config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log_file)
                .spawn()
                .map_err(|e| format!("cannot run {SSHD}: {e}"))?;
            // From here on, dropping `sshd` (an early return included) kills the child.
            let mut sshd = Sshd {
                port,
                config: dir.join("ssh_config"),
                dir: dir.clone(),
                user: user.clone(),
                identity: identity.clone(),
                known_hosts: dir.join("known_hosts"),
                unreachable_port,
                child,
                _unreachable_socket: unreachable_socket.try_clone().map_err(|e| e.to_string())?,
            };
            match sshd.wait_ready() {
                Ok(()) => {}
                Err(Exit::Exited(text)) if text.contains("Address already in use") => {
                    why = text;
                    continue;
                }
                Err(Exit::Exited(text)) => return Err(format!("sshd exited: {text}")),
                Err(Exit::TimedOut) => {
                    return Err(format!(
                        "sshd did not accept connections on 127.0.0.1:{port} within {} s; log: {}",
                        READY_TIMEOUT.as_secs(),
                        sshd.log().trim()
                    ));
                }
            }
            write(
                &sshd.known_hosts,
                &format!("[127.0.0.1]:{port} {host_public}\n"),
            )?;
            let config = sshd.client_config(aliases);
            write(&sshd.config, &config)?;
            sshd.check_login()?;
            return Ok(sshd);
        }
        Err(format!(
            "sshd could not bind a free port in {BIND_ATTEMPTS} attempts: {why}"
        ))
    }

    /// Runs `ssh -F <config> <alias> <command>` to completion (stdin empty).
    pub fn ssh(&self, alias: &str, command: &str) -> Output {
        self.command(alias, command)
            .output()
            .expect("ssh can be started")
    }

    /// The command `ssh -F <config> <alias> <command>` with an empty stdin, to spawn or
    /// adjust; `ssh` is looked up on PATH.
    pub fn command(&self, alias: &str, command: &str) -> Command {
        let mut cmd = Command::new("ssh");
        cmd.arg("-F")
            .arg(&self.config)
            .arg(alias)
            .arg(command)
            .stdin(Stdio::null());
        cmd
    }

    /// sshd's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What sshd has logged (errors only, plus anything it prints while starting).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }

    /// The client options every alias shares, as ssh_config lines.
    fn client_options(&self, port: u16) -> Vec<String> {
        vec![
            "HostName 127.0.0.1".into(),
            format!("Port {port}"),
            format!("User {}", self.user),
            format!("IdentityFile \"{}\"", self.identity.display()),
            "IdentitiesOnly yes".into(),
            format!("UserKnownHostsFile \"{}\"", self.known_hosts.display()),
            // Only the pinned key counts, not one in the system's known_hosts.
            "GlobalKnownHostsFile /dev/null".into(),
            "StrictHostKeyChecking yes".into(),
            "BatchMode yes".into(),
            "LogLevel ERROR".into(),
            "ConnectTimeout 5".into(),
        ]
    }

    /// The client config: one `Host` block per alias, and `unreachable` on a refusing port.
    fn client_config(&self, aliases: &[&str]) -> String {
        let mut text =
            String::from("# A throwaway ssh client config written by tests/common/sshd.rs.\n");
        let hosts = aliases.iter().map(|a| (*a, self.port));
        for (alias, port) in hosts.chain([(UNREACHABLE, self.unreachable_port)]) {
            text.push_str(&format!("\nHost {alias}\n"));
            for line in self.client_options(port) {
                text.push_str(&format!("  {line}\n"));
            }
        }
        text
    }

    /// Logs in once with the client options, so a harness that starts is one that works.
    fn check_login(&self) -> Result<(), String> {
        let mut probe = Command::new("ssh");
        probe.arg("-F").arg("/dev/null");
        for line in self.client_options(self.port) {
            probe.arg("-o").arg(line);
        }
        let out = match probe.arg("sshd-harness-probe").arg("true").output() {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err("ssh is missing (install openssh-client)".into());
            }
            Err(e) => return Err(format!("cannot run ssh: {e}")),
        };
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "sshd runs but logging in as {} fails ({}): {}; sshd log: {}{}",
            self.user,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            self.log().trim(),
            locked_account_hint(&self.user)
        ))
    }

    /// Waits until sshd accepts connections on its port, or exits, or time runs out.
    fn wait_ready(&mut self) -> Result<(), Exit> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Exit::Exited(format!(
                    "{status}; log: {}",
                    self.log().trim()
                )));
            }
            // The listening socket must be sshd's own: if another process took the port, a
            // connection would succeed before sshd fails to bind it.
            if listens(self.child.id(), self.port) && ssh_banner(&addr) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Exit::TimedOut);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sshd {
    /// Stops sshd, first killing every process of its sessions: sshd's own per-connection
    /// processes (each in a session of its own, so a process-group kill misses them) and
    /// what ran in them, including processes that detached from the tree.
    fn drop(&mut self) {
        // Exited and reaped already (e.g. a failed start): its pid may belong to another
        // process by now.
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let pid = self.child.id() as i32;
        // Freeze the listener (no new connections are forked), then freeze what belongs to
        // its sessions until nothing new turns up, so nothing can fork away while we look;
        // then kill it all at once.
        signal(pid, libc::SIGSTOP);
        let mut frozen = BTreeSet::new();
        for _ in 0..50 {
            let found: Vec<i32> = session_processes(pid, self.port)
                .into_iter()
                .filter(|p| !frozen.contains(p))
                .collect();
            if found.is_empty() {
                break;
            }
            for p in found {
                signal(p, libc::SIGSTOP);
                frozen.insert(p);
            }
        }
        for &p in &frozen {
            signal(p, libc::SIGKILL);
        }
        // A stopped process acts on SIGTERM once continued.
        signal(pid, libc::SIGTERM);
        signal(pid, libc::SIGCONT);
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Why sshd did not become ready.
enum Exit {
    /// It exited; its status and log.
    Exited(String),
    /// It runs but does not accept connections.
    TimedOut,
}

/// What the sshd_config is made of.
struct ServerConfig {
    dir: PathBuf,
    host_key: PathBuf,
    authorized_keys: PathBuf,
    /// Whether to add `PerSourcePenalties no` (OpenSSH 9.8+).
    disable_penalties: bool,
}

impl ServerConfig {
    /// The sshd_config for `port`. Unset options keep sshd's defaults: no `AcceptEnv` (no
    /// client environment is accepted) and no `SetEnv`.
    fn render(&self, port: u16) -> String {
        let mut text = format!(
            "# A throwaway sshd config written by tests/common/sshd.rs.
ListenAddress 127.0.0.1
Port {port}
HostKey \"{host_key}\"
PidFile \"{pid_file}\"
AuthorizedKeysFile \"{authorized_keys}\"
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# Tests run as root; run by another user, sshd can only log in as that same user.
PermitRootLogin prohibit-password
# The temporary directory's permissions do not matter.
StrictModes no
UsePAM no
AllowTcpForwarding yes
GatewayPorts no
PermitTunnel no
X11Forwarding no
PrintMotd no
Subsystem sftp internal-sftp
LogLevel ERROR
# Tests may open many connections at once; the default starts dropping them at 10.
MaxStartups 100
",
            host_key = self.host_key.display(),
            pid_file = self.dir.join("sshd.pid").display(),
            authorized_keys = self.authorized_keys.display(),
        );
        if self.disable_penalties {
            text.push_str("PerSourcePenalties no\n");
        }
        text
    }
}

/// The user name of this process, from `whoami`.
fn current_user() -> Result<String, String> {
    let out = Command::new("whoami")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run whoami: {e}"))?;
    let user = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || user.is_empty() {
        return Err(format!(
            "whoami does not name the current user: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(user)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and no memory effects.
    unsafe { libc::geteuid() == 0 }
}

/// Creates a fresh ed25519 key pair at `path` and `path.pub`.
fn keygen(path: &Path) -> Result<(), String> {
    // ssh-keygen asks before overwriting, and would read "no" from the empty stdin.
    let _ = fs::remove_file(path);
    let _ = fs::remove_file(path.with_extension("pub"));
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "svc-test"])
        .arg("-f")
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => "ssh-keygen is missing (install openssh-client)".into(),
            _ => format!("cannot run ssh-keygen: {e}"),
        })?;
    if !out.status.success() {
        return Err(format!(
            "ssh-keygen failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot bind 127.0.0.1: {e}"))
}

/// A TCP socket bound to a port on 127.0.0.1 but not listening: connections to the port are
/// refused, and no other process can bind it while the socket is open.
fn refusing_port() -> Result<(OwnedFd, u16), String> {
    let err = |what: &str| {
        format!(
            "cannot reserve a port ({what}): {}",
            std::io::Error::last_os_error()
        )
    };
    // SAFETY: plain socket calls on a descriptor we own, with fully initialised addresses of
    // the length we pass.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(err("socket"));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from(Ipv4Addr::LOCALHOST).to_be();
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let sa = &mut addr as *mut libc::sockaddr_in as *mut libc::sockaddr;
        if libc::bind(fd.as_raw_fd(), sa, len) != 0 {
            return Err(err("bind"));
        }
        if libc::getsockname(fd.as_raw_fd(), sa, &mut len) != 0 {
            return Err(err("getsockname"));
        }
        Ok((fd, u16::from_be(addr.sin_port)))
    }
}

/// Whether a server at `addr` accepts a connection and greets as an SSH server. The probe
/// answers with a banner of its own before closing, which sshd logs below `LogLevel ERROR`
/// (a bare close is an error line in sshd's log).
fn ssh_banner(addr: &SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut greeting = String::new();
    let greets = BufReader::new(&stream).read_line(&mut greeting).is_ok()
        && greeting.starts_with("SSH-2.0-");
    let _ = stream.write_all(b"SSH-2.0-svc_test_probe\r\n");
    greets
}

/// Whether process `pid` holds a socket listening on 127.0.0.1:`port` (Linux /proc; true
/// where that cannot be read, leaving the connection test alone to decide).
fn listens(pid: u32, port: u16) -> bool {
    let Ok(table) = fs::read_to_string("/proc/net/tcp") else {
        return true;
    };
    // The address in host byte order (little- or big-endian), the port as a number.
    let local = [
        format!("0100007F:{port:04X}"),
        format!("7F000001:{port:04X}"),
    ];
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // 0A is TCP_LISTEN.
            (f.len() > 9 && local.iter().any(|l| l == f[1]) && f[3] == "0A")
                .then(|| format!("socket:[{}]", f[9]))
        })
        .collect();
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return !inodes.is_empty();
    };
    fds.flatten().any(|fd| {
        fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

/// The processes of the sessions that sshd `root` (listening on `port`) serves: its
/// descendants, and processes whose `SSH_CONNECTION` names its port (they may have detached
/// from the tree). Never `root` itself nor this process.
fn session_processes(root: i32, port: u16) -> BTreeSet<i32> {
    let me = std::process::id() as i32;
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    let mut found = BTreeSet::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(ppid) = parent(pid) {
            children.entry(ppid).or_default().push(pid);
        }
        if served_by(pid, port) {
            found.insert(pid);
        }
    }
    let mut descendants = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            if descendants.insert(c) {
                todo.push(c);
            }
        }
    }
    found.extend(descendants);
    found.remove(&root);
    found.remove(&me);
    found
}

/// The parent of process `pid`, from /proc/<pid>/stat ("pid (comm) state ppid ...").
fn parent(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether process `pid` runs in an ssh session to 127.0.0.1:`port`: its environment has
/// `SSH_CONNECTION=<client ip> <client port> 127.0.0.1 <port>`.
fn served_by(pid: i32, port: u16) -> bool {
    let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let want = format!("127.0.0.1 {port}");
    env.split(|&b| b == 0).any(|var| {
        var.strip_prefix(b"SSH_CONNECTION=").is_some_and(|value| {
            let value = String::from_utf8_lossy(value);
            let fields: Vec<&str> = value.split_whitespace().collect();
            fields.len() == 4 && fields[2..].join(" ") == want
        })
    })
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill has no memory effects.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// A hint when `user`'s account is locked (a password field starting with `!`), which sshd
/// with `UsePAM no` refuses even for key logins; empty otherwise or when unknown.
fn locked_account_hint(user: &str) -> String {
    let Ok(shadow) = fs::read_to_string("/etc/shadow") else {
        return String::new();
    };
    let locked = shadow.lines().any(|line| {
        let mut f = line.split(':');
        f.next() == Some(user) && f.next().is_some_and(|p| p.starts_with('!'))
    });
    if locked {
        format!(
            " (the account {user} is locked, which sshd refuses without PAM; `usermod -p '*' {user}` unlocks it for key logins)"
        )
    } else {
        String::new()
    }
}
