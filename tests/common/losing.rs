//! A TCP proxy in front of an in-process HTTP fake that can lose the answer to a request the
//! fake has applied: the failure a client cannot tell apart from "not applied", which must not
//! make it apply a write twice.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// How the answer to the armed request is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lose {
    /// The client gets `500 Internal Server Error` instead of the fake's answer.
    Status500,
    /// The client's connection is closed without an answer.
    Drop,
}

/// Forwards every request, one connection to the fake per client connection.
pub struct LosingProxy {
    /// `http://127.0.0.1:<port>`: the fake's base with the proxy's port.
    pub base: String,
    armed: Arc<Mutex<Vec<(String, Lose)>>>,
    lost: Arc<Mutex<Vec<String>>>,
}

impl LosingProxy {
    /// A proxy for the fake listening on `upstream` (`127.0.0.1:<port>`).
    pub fn start(upstream: &str) -> LosingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = LosingProxy {
            base: format!("http://127.0.0.1:{port}"),
            armed: Arc::default(),
            lost: Arc::default(),
        };
        let (armed, lost, upstream) = (
            proxy.armed.clone(),
            proxy.lost.clone(),
            upstream.to_string(),
        );
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (armed, lost, upstream) = (armed.clone(), lost.clone(), upstream.clone());
                std::thread::spawn(move || serve(client, &upstream, &armed, &lost));
            }
        });
        proxy
    }

    /// The next request whose request line (`POST /path HTTP/1.1`) contains `needle` reaches
    /// the fake, and its answer is lost as `how`. Arm several to lose several, in order.
    pub fn arm(&self, needle: &str, how: Lose) {
        self.armed.lock().unwrap().push((needle.to_string(), how));
    }

    /// The request lines whose answers were lost.
    pub fn lost(&self) -> Vec<String> {
        self.lost.lock().unwrap().clone()
    }
}

/// One HTTP/1.1 message (head and `Content-Length` body) from `r`; `None` at the end.
fn message(r: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let length = super::content_length(&head);
    let mut bytes = head.clone().into_bytes();
    let mut body = vec![0; length];
    r.read_exact(&mut body).ok()?;
    bytes.extend(body);
    Some((head, bytes))
}

fn serve(
    client: TcpStream,
    upstream: &str,
    armed: &Mutex<Vec<(String, Lose)>>,
    lost: &Mutex<Vec<String>>,
) {
    let Ok(fake) = TcpStream::connect(upstream) else {
        return;
    };
    let mut to_fake = fake.try_clone().unwrap();
    let mut from_fake = BufReader::new(fake);
    let mut to_client = client.try_clone().unwrap();
    let mut from_client = BufReader::new(client);
    while let Some((head, request)) = message(&mut from_client) {
        let line = head.lines().next().unwrap_or_default().to_string();
        if to_fake.write_all(&request).is_err() {
            return;
        }
        let Some((_, answer)) = message(&mut from_fake) else {
            return;
        };
        let how = {
            let mut armed = armed.lock().unwrap();
            let at = armed
                .iter()
                .position(|(needle, _)| line.contains(needle.as_str()));
            at.map(|i| armed.remove(i).1)
        };
        match how {
            None => {
                if to_client.write_all(&answer).is_err() {
                    return;
                }
            }
            Some(how) => {
                lost.lock().unwrap().push(line);
                if how == Lose::Status500 {
                    let body = "{\"message\": \"500: Internal Server Error\", \"code\": 0}";
                    let _ = write!(
                        to_client,
                        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
                let _ = to_client.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}
