//! One TLS handshake with a ZooKeeper server, to explain why sessions cannot be established.
//!
//! Why: zookeeper-client retries a failed handshake until the session timeout and then reports
//! only "timeout"; an operator who gave the wrong CA needs to read "unknown issuer".

use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Handshakes with `server` (`host:port`) as the client would; `Err` says why it fails.
pub(crate) fn handshake(server: &str, ca_pem: &str, identity: Option<&(String, String)>) -> Result<(), String> {
    let (host, _) = server.rsplit_once(':').ok_or("no port")?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(certificate.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>();
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| e.to_string())?;
            builder.with_client_auth_cert(chain.map_err(|e| e.to_string())?, key).map_err(|e| e.to_string())?
        }
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from(host).map_err(|e| e.to_string())?;
    let mut connection = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let address = server.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("no address")?;
    let mut socket = TcpStream::connect_timeout(&address, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    socket.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    socket.set_write_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    let mut stream = rustls::Stream::new(&mut connection, &mut socket);
    // A zero-length write drives the handshake to its end (or its error).
    stream.write_all(&[]).and_then(|()| stream.flush()).map_err(|e| e.to_string())?;
    // A server that refuses the client certificate says so after the client's side of a TLS 1.3
    // handshake is over: read once. A server that accepted waits for a request (the read times
    // out).
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => Err("the server closed the connection after the handshake".into()),
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}
