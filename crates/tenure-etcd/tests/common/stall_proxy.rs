//! A loopback TCP proxy that a test puts between a client and a real server to hang the store
//! at the worst moment: it can stop forwarding (connections stay open, bytes wait in the proxy
//! and the kernel buffers, new connections are accepted but get no answer), close every open
//! connection, and resume forwarding (held bytes then flow on, as after a network stall).
//!
//! Shared by the etcd and ZooKeeper tests (the ZooKeeper tests include this file by path).
#![allow(dead_code)]

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    forwarding: bool,
    /// Bumped by [`StallProxy::close_all`]: connections opened before the bump end.
    generation: u64,
}

/// The proxy; dropping it stops accepting (open connections end when either side closes).
pub struct StallProxy {
    address: String,
    state: watch::Sender<State>,
    acceptor: JoinHandle<()>,
}

impl StallProxy {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `upstream`.
    pub async fn start(upstream: &str) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let address = listener.local_addr().expect("proxy address").to_string();
        let (state, _) = watch::channel(State { forwarding: true, generation: 0 });
        let upstream = upstream.to_owned();
        let states = state.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let generation = states.borrow().generation;
                let Ok(server) = TcpStream::connect(&upstream).await else { continue };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pipe(client_read, server_write, states.subscribe(), generation));
                tokio::spawn(pipe(server_read, client_write, states.subscribe(), generation));
            }
        });
        StallProxy { address, state, acceptor }
    }

    /// `127.0.0.1:<port>`, to give to the client instead of the server's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Stops forwarding in both directions on every connection, open or new.
    pub fn stall(&self) {
        self.state.send_modify(|s| s.forwarding = false);
    }

    /// Forwards again; bytes held during the stall are delivered.
    pub fn resume(&self) {
        self.state.send_modify(|s| s.forwarding = true);
    }

    /// Closes every open connection (the client sees them end); later ones are served as usual.
    pub fn close_all(&self) {
        self.state.send_modify(|s| s.generation += 1);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.close_all();
    }
}

/// Copies `from` to `to` while the proxy forwards; ends when either side closes or the
/// connection's generation is closed.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut state: watch::Receiver<State>, generation: u64) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        // Read only while forwarding, so that a stall also holds bytes back in the kernel.
        let Ok(current) = state.wait_for(|s| s.forwarding || s.generation != generation).await.map(|s| *s) else {
            return;
        };
        if current.generation != generation {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = state.changed() => continue,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A stall that began while this read was out holds the bytes until it ends.
        let Ok(current) = state.wait_for(|s| s.forwarding || s.generation != generation).await.map(|s| *s) else {
            return;
        };
        if current.generation != generation || to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
