//! A single etcd server on a free loopback port with its data in a temporary directory, for the
//! checker's runs (the binary mode cannot use the test harness of `tenure-etcd`).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tenure_etcd::EtcdElection;

/// Why etcd could not be started.
#[derive(Debug, thiserror::Error)]
pub enum EtcdServerError {
    /// The `etcd` binary is missing or could not be run.
    #[error("could not run etcd (is it installed and on PATH?): {0}")]
    Spawn(std::io::Error),
    /// It did not serve within the bound (its log is in the data directory).
    #[error("etcd did not serve within {0:?}; see {1}")]
    NotServing(Duration, String),
    /// The temporary directory could not be made.
    #[error("temporary directory: {0}")]
    Io(#[from] std::io::Error),
}

/// A running etcd; killed and its directory removed when dropped.
pub struct EtcdServer {
    child: Child,
    root: PathBuf,
    endpoint: String,
}

fn free_port() -> Result<u16, std::io::Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether the `etcd` binary runs here.
pub fn etcd_installed() -> bool {
    Command::new("etcd").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

impl EtcdServer {
    /// Starts etcd and waits (polling, bounded) until it answers a read.
    pub async fn start() -> Result<EtcdServer, EtcdServerError> {
        let root = std::env::temp_dir().join(format!("tenure-ipam-etcd-{}-{}", std::process::id(), free_port()?));
        std::fs::create_dir_all(&root)?;
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(root.join("etcd.log"))?;
        let child = Command::new("etcd")
            .args(["--name", "ipam", "--data-dir"])
            .arg(root.join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("ipam={peer}")])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(EtcdServerError::Spawn)?;
        let server = EtcdServer { child, root, endpoint: format!("127.0.0.1:{client_port}") };
        let bound = Duration::from_secs(20);
        let deadline = Instant::now() + bound;
        loop {
            let endpoints = vec![server.endpoint.clone()];
            if let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_secs(2), EtcdElection::connect(&endpoints, "health")).await
            {
                return Ok(server);
            }
            if Instant::now() >= deadline {
                return Err(EtcdServerError::NotServing(bound, server.root.display().to_string()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `host:port` of its client URL.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
