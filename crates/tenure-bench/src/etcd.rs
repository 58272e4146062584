//! A one-member etcd server for the benchmarks, on free loopback ports, with its data in a
//! scratch directory; killed and removed when dropped.
//!
//! Why here: the group benchmark measures Tenure on a real etcd (Debian's `etcd-server`), and a
//! benchmark that fails half-way must not leave a server running on a shared machine
//! ([`ChildGuard`], [`ScratchDir`]).

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::ChildGuard;
use crate::scratch::ScratchDir;

/// A running etcd; the child is declared first so it is killed before its directory goes.
pub struct EtcdServer {
    _child: ChildGuard,
    _dir: ScratchDir,
    endpoint: String,
}

fn free_loopback_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdServer {
    /// Starts `etcd` and waits (bounded, 20 s) until `ready` answers true for its endpoint, or
    /// explains why not (not installed, did not serve).
    pub async fn start<F, R>(ready: F) -> Result<EtcdServer, String>
    where
        F: Fn(String) -> R,
        R: std::future::Future<Output = bool>,
    {
        let dir = ScratchDir::new("etcd").map_err(|e| format!("scratch directory: {e}"))?;
        let port = |what| free_loopback_port().map_err(|e| format!("a free port for {what}: {e}"));
        let (client, peer) =
            (format!("http://127.0.0.1:{}", port("clients")?), format!("http://127.0.0.1:{}", port("peers")?));
        let log = dir.path().join("etcd.log");
        let log_file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut command = Command::new("etcd");
        command
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("bench={peer}"), "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        let child = ChildGuard::spawn("etcd", &mut command, Some(&log))
            .map_err(|e| format!("cannot run etcd (Debian package etcd-server): {e}"))?;
        let endpoint = client.trim_start_matches("http://").to_owned();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready(endpoint.clone()).await {
            if Instant::now() >= deadline {
                return Err(format!("etcd did not serve within 20 s:\n{}", child.log_tail(20)));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(EtcdServer { _child: child, _dir: dir, endpoint })
    }

    /// `host:port` of its client URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}
