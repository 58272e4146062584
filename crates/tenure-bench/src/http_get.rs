//! One `GET` (or `POST`) to a sidecar's HTTP server on a new connection, as a probe makes it.
//!
//! Why: the footprint benchmarks time answers from `tenure elect --http` and drive its steady
//! state with the requests probes send, and the give_way benchmark's application proves its
//! progress to its sidecar; a blocking client of a dozen lines says exactly when the first byte
//! came, which an HTTP client crate would hide behind its own pooling.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// When its first bytes were read.
    pub answered_at: Instant,
    /// The status code.
    pub code: u16,
    /// The body, lossily decoded as UTF-8.
    pub body: String,
}

/// `GET path` on a new connection (`Connection: close`); `None` if nothing answered like HTTP
/// within a second.
pub fn get(address: SocketAddr, path: &str) -> Option<Answer> {
    request(address, "GET", path)
}

/// `POST path` without a body on a new connection (`Connection: close`), as an application
/// calls its sidecar (`/progress?term=T`); `None` if nothing answered like HTTP within a second.
pub fn post(address: SocketAddr, path: &str) -> Option<Answer> {
    request(address, "POST", path)
}

fn request(address: SocketAddr, method: &str, path: &str) -> Option<Answer> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(100)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let length = if method == "GET" { "" } else { "Content-Length: 0\r\n" };
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{length}Connection: close\r\n\r\n").ok()?;
    let mut response = Vec::new();
    let mut buffer = [0u8; 1024];
    let mut answered_at = None;
    // Until the end of the stream or an error.
    while let Ok(n @ 1..) = stream.read(&mut buffer) {
        answered_at.get_or_insert_with(Instant::now);
        response.extend_from_slice(&buffer[..n]);
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    if !text.starts_with("HTTP/1.") {
        return None;
    }
    let code = text.get(9..12)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or(String::new(), |(_, body)| body.to_owned());
    Some(Answer { answered_at: answered_at?, code, body })
}

/// The body of a 200 answer to `GET path`.
pub fn ok_body(address: SocketAddr, path: &str) -> Option<String> {
    get(address, path).filter(|answer| answer.code == 200).map(|answer| answer.body)
}
