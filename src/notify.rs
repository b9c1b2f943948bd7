//! The service manager's notify protocol (systemd's `sd_notify`): one datagram per state change
//! to the unix socket named by `NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).
//! svc sends `READY=1` once its HTTP server answers, `STOPPING=1` when a stop begins, and
//! `WATCHDOG=1` every half `WATCHDOG_USEC` while the state thread's heartbeat is fresh. Without
//! `NOTIFY_SOCKET` every call does nothing.

use std::os::unix::net::UnixDatagram;
use std::sync::OnceLock;
use std::time::Duration;

struct Notifier {
    socket: UnixDatagram,
    target: Target,
}

enum Target {
    Path(std::path::PathBuf),
    Abstract(std::os::unix::net::SocketAddr),
}

static NOTIFIER: OnceLock<Option<Notifier>> = OnceLock::new();

/// Reads `NOTIFY_SOCKET` once; later calls keep the first answer.
pub fn init(env: &crate::env::Env) {
    NOTIFIER.get_or_init(|| {
        let name = env.non_empty("NOTIFY_SOCKET")?;
        let target = match name.strip_prefix('@') {
            Some(abstract_name) => {
                use std::os::linux::net::SocketAddrExt;
                Target::Abstract(
                    std::os::unix::net::SocketAddr::from_abstract_name(abstract_name).ok()?,
                )
            }
            None => Target::Path(name.into()),
        };
        let socket = UnixDatagram::unbound().ok()?;
        Some(Notifier { socket, target })
    });
}

/// Sends one state line (`READY=1`, `STOPPING=1`, `STATUS=...`); failures are logged, never
/// fatal: svc runs the same without a service manager.
pub fn send(state: &str) {
    let Some(Some(n)) = NOTIFIER.get() else {
        return;
    };
    let sent = match &n.target {
        Target::Path(p) => n.socket.send_to(state.as_bytes(), p),
        Target::Abstract(a) => n.socket.send_to_addr(state.as_bytes(), a),
    };
    if let Err(e) = sent {
        log::warn!("cannot notify the service manager ({state}): {e}");
    }
}

/// `STOPPING=1`, once however many ways the stop is seen.
pub fn stopping() {
    static SENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SENT.swap(true, std::sync::atomic::Ordering::Relaxed) {
        send("STOPPING=1");
    }
}

/// The watchdog interval the service manager asked for (`WATCHDOG_USEC`, for this process when
/// `WATCHDOG_PID` names one).
pub fn watchdog(env: &crate::env::Env) -> Option<Duration> {
    NOTIFIER.get()?.as_ref()?;
    if let Some(pid) = env.non_empty("WATCHDOG_PID")
        && pid.parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    let usec: u64 = env.non_empty("WATCHDOG_USEC")?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}
