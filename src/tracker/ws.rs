//! The WebSocket client both live chat feeds use (chat-b's Gateway, chat-a's Socket Mode):
//! tungstenite over rustls for `wss://`, plain `ws://` for the test fakes, with a connect
//! timeout and a second handle on the socket for read timeouts.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Wake;

/// The longest wait before a live feed reconnects.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A random number in 0..=1 (reconnect and heartbeat jitter).
pub fn jitter() -> f64 {
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    f64::from(u16::from_le_bytes(b)) / f64::from(u16::MAX)
}

/// A live feed's wait before reconnecting: none after a clean end, then 1, 2, 4 ... 60 s,
/// jittered by up to a quarter.
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let base = Duration::from_secs(1u64 << failures.min(6).saturating_sub(1)).min(MAX_BACKOFF);
    base.mul_f64(0.75 + 0.25 * jitter())
}

/// How often a wake-up no scan took is repeated.
pub const REWAKE: Duration = Duration::from_millis(750);

/// A live feed's wake-ups of the daemon's poller. A wake-up that arrives during a poll is
/// coalesced into it, which may have read past the event, so it is repeated (at most every
/// [`REWAKE`]) until a scan takes it.
#[derive(Default)]
pub struct LiveWake {
    wake: Mutex<Option<Wake>>,
    requested: AtomicBool,
    pub last: Mutex<Option<Instant>>,
}

impl LiveWake {
    /// The poller's wake-up (the first one handed in stays).
    pub fn set(&self, wake: &Wake) {
        let mut w = self.wake.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_none() {
            *w = Some(Arc::clone(wake));
        }
    }

    /// Asks the daemon for a poll now.
    pub fn wake(&self) {
        self.requested.store(true, Ordering::SeqCst);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let w = self.wake.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(w) = w {
            w();
        }
    }

    /// A scan starts: it sees every event so far.
    pub fn take(&self) {
        self.requested.store(false, Ordering::SeqCst);
    }

    /// Repeats a wake-up no scan took yet.
    pub fn rewake(&self) {
        let due = self
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none_or(|t| t.elapsed() >= REWAKE);
        if due && self.requested.load(Ordering::SeqCst) {
            self.wake();
        }
    }
}

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

pub type Socket = tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>;

/// Opens the WebSocket (TLS for `wss://`); the second value is a handle on the same socket for
/// read timeouts.
pub fn connect(url: &str) -> Result<(Socket, TcpStream), String> {
    let uri: tungstenite::http::Uri = url.parse().map_err(|e| format!("bad WebSocket url: {e}"))?;
    let host = uri.host().ok_or("the WebSocket url has no host")?;
    let tls = uri.scheme_str() == Some("wss");
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let addr = (host.trim_matches(['[', ']']), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("cannot resolve {host}"))?;
    let tcp = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    tcp.set_read_timeout(Some(CONNECT_TIMEOUT))
        .and_then(|_| tcp.set_write_timeout(Some(CONNECT_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let ctl = tcp.try_clone().map_err(|e| e.to_string())?;
    let (ws, _) = tungstenite::client_tls_with_config(url, tcp, None, None)
        .map_err(|e| format!("WebSocket handshake with {host} failed: {e}"))?;
    Ok((ws, ctl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wss_goes_through_rustls_and_failures_are_errors() {
        // A server that hangs up: the TLS client is built (a missing crypto provider would
        // panic here) and the handshake fails as an error.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            if let Ok((s, _)) = listener.accept() {
                drop(s);
            }
        });
        let e = connect(&format!("wss://127.0.0.1:{port}/?v=10&encoding=json")).unwrap_err();
        assert!(e.contains("handshake"), "{e}");
        assert!(connect("ws://127.0.0.1:1/").is_err());
        assert!(connect("not a url").is_err());
    }
}
