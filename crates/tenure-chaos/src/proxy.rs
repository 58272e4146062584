//! A TCP proxy on loopback between one candidate and its store, which can be cut and healed.
//!
//! Why this and not firewall rules or network namespaces: it cuts the candidate's real sockets
//! exactly like a silent partition (bytes stop flowing both ways, connections stay open, new
//! connections are accepted and hang), it needs no privilege, touches nothing outside this
//! process, and disappears with it, so an interrupted run leaves no rule behind. On heal the
//! held bytes flow again, as TCP retransmission would deliver them. It also lets a store restart
//! on another port (the in-memory API server) behind an unchanged address.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::ChaosError;

/// How often a held connection looks whether the partition healed.
const HOLD_POLL: Duration = Duration::from_millis(5);

struct Shared {
    upstream: Mutex<String>,
    cut: AtomicBool,
    closed: AtomicBool,
}

/// A running proxy; it stops (and closes its connections) when dropped.
pub struct Proxy {
    /// The address candidates connect to.
    pub port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Starts a proxy on a free 127.0.0.1 port to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Result<Proxy, ChaosError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| ChaosError::Io(format!("proxy: {e}")))?;
        let port = listener.local_addr().map_err(|e| ChaosError::Io(e.to_string()))?.port();
        listener.set_nonblocking(true).map_err(|e| ChaosError::Io(e.to_string()))?;
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream.to_owned()),
            cut: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        });
        let accept = shared.clone();
        std::thread::spawn(move || accept_loop(listener, accept));
        Ok(Proxy { port, shared })
    }

    /// Cuts (true) or heals (false) the connection to the store.
    pub fn set_cut(&self, cut: bool) {
        self.shared.cut.store(cut, Ordering::SeqCst);
    }

    /// Points new connections at another upstream address (a restarted store).
    pub fn set_upstream(&self, upstream: &str) {
        if let Ok(mut current) = self.shared.upstream.lock() {
            upstream.clone_into(&mut current);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.closed.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                let shared = shared.clone();
                std::thread::spawn(move || connect(client, shared));
            }
            Err(_) => std::thread::sleep(HOLD_POLL),
        }
    }
}

/// Holds a new connection while cut, then connects it upstream and pumps both ways.
fn connect(client: TcpStream, shared: Arc<Shared>) {
    while shared.cut.load(Ordering::SeqCst) {
        if shared.closed.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(HOLD_POLL);
    }
    let upstream = shared.upstream.lock().map(|u| u.clone()).unwrap_or_default();
    let Ok(server) = TcpStream::connect(&upstream) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else { return };
    let back = shared.clone();
    std::thread::spawn(move || pump(server2, client2, back));
    pump(client, server, shared);
}

/// Copies `from` to `to` while not cut; stops both on end of stream, error or close.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if shared.closed.load(Ordering::SeqCst) {
            break;
        }
        if shared.cut.load(Ordering::SeqCst) {
            std::thread::sleep(HOLD_POLL);
            continue;
        }
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                // Bytes read just before a cut are held until the heal.
                while shared.cut.load(Ordering::SeqCst) && !shared.closed.load(Ordering::SeqCst) {
                    std::thread::sleep(HOLD_POLL);
                }
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let mut buffer = [0u8; 64];
                    while let Ok(n) = stream.read(&mut buffer) {
                        if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        port
    }

    fn round_trip(stream: &mut TcpStream, text: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(text)?;
        let mut answer = vec![0u8; text.len()];
        stream.read_exact(&mut answer)?;
        Ok(answer)
    }

    #[test]
    fn a_cut_proxy_holds_bytes_until_healed() {
        let proxy = Proxy::start(&format!("127.0.0.1:{}", echo_server())).unwrap();
        let mut stream = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        assert_eq!(round_trip(&mut stream, b"one").unwrap(), b"one");
        proxy.set_cut(true);
        assert!(round_trip(&mut stream, b"two").is_err(), "no answer crosses a partition");
        proxy.set_cut(false);
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut late = [0u8; 3];
        stream.read_exact(&mut late).unwrap();
        assert_eq!(&late, b"two", "held bytes arrive after the heal");
    }
}
