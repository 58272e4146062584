//! Real etcd servers: a cluster of one or more members on free loopback ports, optionally serving
//! its clients over TLS, whose members can be killed and restarted on their ports and data; all
//! stopped and their files removed when dropped.
//!
//! Why here: the etcd tests, the command's tests, the HA runtime's tests, the benchmarks, the
//! fault-injection suite and the IP allocator example's checker all run against a real etcd
//! (Debian's `etcd-server`). A member is ready when its `/health` answers true (it has a raft
//! leader and serves a quorum read), asked on a plain-HTTP metrics port of its own, so the probe
//! needs no client and works alike on a TLS cluster.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::certs::{self, TestPki};
use crate::process::{free_port, log_tail, or_skip, scratch_dir, wait_ready, ServerProcess, ATTEMPTS, POLL};

/// How long a start waits for a member to serve.
const START_BOUND: Duration = Duration::from_secs(30);

/// What to start; [`EtcdConfig::new`] gives a plain cluster in a directory of its own.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// How many members.
    pub size: usize,
    /// `Some(client_cert_auth)`: the members serve clients over TLS only (the peers talk plain
    /// text), with a PKI generated for the occasion; with `client_cert_auth` they also demand a
    /// client certificate signed by the CA.
    pub tls: Option<bool>,
    /// More command-line flags for every member (`--auth-token-ttl 1`).
    pub extra_args: Vec<String>,
    /// Where the members keep their data, logs and certificates, kept after the cluster is
    /// dropped; `None`: a temporary directory, removed then.
    pub dir: Option<PathBuf>,
    /// Checked while waiting for the members to serve: true ends the wait (an interrupted run).
    pub give_up: fn() -> bool,
}

impl EtcdConfig {
    /// A plain cluster of `size` members in a temporary directory.
    pub fn new(size: usize) -> EtcdConfig {
        EtcdConfig { size, tls: None, extra_args: Vec::new(), dir: None, give_up: || false }
    }
}

/// One member of a cluster.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain HTTP, `/health` only: the readiness probe.
    metrics_port: u16,
    process: Option<ServerProcess>,
}

/// A cluster of one or more etcd members on 127.0.0.1.
pub struct EtcdCluster {
    members: Vec<Member>,
    root: PathBuf,
    keep_root: bool,
    token: String,
    /// Set when the members serve clients over TLS.
    pub tls: Option<ServerTls>,
    extra_args: Vec<String>,
}

/// How the members of a TLS cluster serve their clients.
pub struct ServerTls {
    /// The certificates, in the cluster's directory.
    pub pki: TestPki,
    /// `--client-cert-auth`: clients must present a certificate signed by the CA.
    pub client_cert_auth: bool,
}

/// Whether the `etcd` binary runs here; why not if it does not.
pub fn etcd_installed() -> Result<(), String> {
    let runs = Command::new("etcd").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    runs.map(|_| ()).map_err(|_| "etcd is not installed (not on PATH; Debian package etcd-server)".to_owned())
}

/// True if the `etcd` binary runs; otherwise prints "skipped", or panics with `CI=true`.
pub fn etcd_available() -> bool {
    or_skip(etcd_installed()).is_some()
}

impl EtcdCluster {
    /// Starts `size` members and waits until the cluster serves requests; `None` if etcd is not
    /// installed (outside CI).
    pub async fn start(size: usize) -> Option<EtcdCluster> {
        Self::start_or_skip(EtcdConfig::new(size)).await
    }

    /// Starts `size` members that serve clients over TLS only, with a PKI generated for the
    /// occasion; with `client_cert_auth` they also demand a client certificate signed by the CA.
    pub async fn start_tls(size: usize, client_cert_auth: bool) -> Option<EtcdCluster> {
        Self::start_tls_with(size, client_cert_auth, &[]).await
    }

    /// [`EtcdCluster::start_tls`] with more etcd flags (`--auth-token-ttl 1`).
    pub async fn start_tls_with(size: usize, client_cert_auth: bool, extra_args: &[&str]) -> Option<EtcdCluster> {
        let extra_args = extra_args.iter().map(|a| a.to_string()).collect();
        Self::start_or_skip(EtcdConfig { tls: Some(client_cert_auth), extra_args, ..EtcdConfig::new(size) }).await
    }

    async fn start_or_skip(config: EtcdConfig) -> Option<EtcdCluster> {
        or_skip(etcd_installed())?;
        Some(Self::start_with(config).await.unwrap_or_else(|why| panic!("could not start an etcd test cluster: {why}")))
    }

    /// [`EtcdCluster::launch`] on a blocking thread, for async callers.
    pub async fn start_with(config: EtcdConfig) -> Result<EtcdCluster, String> {
        tokio::task::spawn_blocking(move || Self::launch(&config)).await.map_err(|e| e.to_string())?
    }

    /// Starts the cluster and waits (polling, at most 30 s) until every member serves. A member
    /// that exits at once had a port taken since it was found free: the cluster is started again
    /// on new ports, up to 5 times.
    pub fn launch(config: &EtcdConfig) -> Result<EtcdCluster, String> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        etcd_installed()?;
        let mut why = String::new();
        for _attempt in 0..ATTEMPTS {
            let root = match &config.dir {
                Some(dir) => dir.clone(),
                None => scratch_dir("etcd").map_err(|e| format!("a temporary directory: {e}"))?,
            };
            let port = || free_port().map_err(|e| format!("no free port: {e}"));
            let mut members = Vec::new();
            for i in 0..config.size {
                let name = format!("m{i}");
                let _ = std::fs::remove_dir_all(root.join(&name)); // a new cluster starts on no data
                members.push(Member {
                    name,
                    client_port: port()?,
                    peer_port: port()?,
                    metrics_port: port()?,
                    process: None,
                });
            }
            let tls = config
                .tls
                .map(|client_cert_auth| ServerTls { pki: TestPki::generate(&root.join("pki")), client_cert_auth });
            let mut cluster = EtcdCluster {
                members,
                root,
                keep_root: config.dir.is_some(),
                token: format!("tenure-test-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)),
                tls,
                extra_args: config.extra_args.clone(),
            };
            for i in 0..config.size {
                cluster.spawn(i, true)?;
            }
            match cluster.wait_ready(START_BOUND, config.give_up) {
                Ok(()) => return Ok(cluster),
                Err(error) if (config.give_up)() => return Err(error),
                Err(error) => why = error,
            }
        }
        Err(why)
    }

    fn initial_cluster(&self) -> String {
        let peers = self.members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port));
        peers.collect::<Vec<_>>().join(",")
    }

    fn log(&self, index: usize) -> PathBuf {
        self.root.join(format!("{}.log", self.members[index].name))
    }

    fn spawn(&mut self, index: usize, new: bool) -> Result<(), String> {
        let initial_cluster = self.initial_cluster();
        let member = &self.members[index];
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command.arg("--cert-file").arg(&tls.pki.server_cert);
            command.arg("--key-file").arg(&tls.pki.server_key);
            // etcd 3.4 demands client certificates whenever it has a trusted CA file.
            if tls.client_cert_auth {
                command.arg("--trusted-ca-file").arg(&tls.pki.ca).arg("--client-cert-auth");
            }
        }
        command
            .args(&self.extra_args)
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(self.root.join(&member.name))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .arg(format!("--listen-metrics-urls=http://127.0.0.1:{}", member.metrics_port))
            .args(["--initial-cluster", &initial_cluster, "--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", if new { "new" } else { "existing" }])
            .args(["--logger", "zap", "--log-level", "warn"])
            // A restarted member must not depose a healthy raft leader (etcd 3.5's default).
            .arg("--pre-vote");
        let process = ServerProcess::spawn(command, &self.log(index)).map_err(|e| format!("cannot run etcd: {e}"))?;
        self.members[index].process = Some(process);
        Ok(())
    }

    /// The metrics ports of the running members, or why not: one of them exited.
    fn running(&self) -> Result<Vec<u16>, String> {
        let running = self.members.iter().enumerate().filter(|(_, m)| m.process.is_some());
        running
            .map(|(i, m)| match m.process.as_ref().is_some_and(ServerProcess::exited) {
                true => Err(format!("etcd {} exited; its log ends:\n{}", m.name, log_tail(&self.log(i), 20))),
                false => Ok(m.metrics_port),
            })
            .collect()
    }

    /// Waits (polling) until every running member serves, one exits, `give_up` holds or `bound`
    /// passed; the last two with the tail of member 0's log.
    pub fn wait_ready(&mut self, bound: Duration, give_up: fn() -> bool) -> Result<(), String> {
        let mut exited = None;
        let waited = wait_ready(
            bound,
            give_up,
            || self.running().map_err(|why| exited = Some(why)).is_err(),
            || self.running().is_ok_and(|ports| ports.into_iter().all(healthy)),
        );
        waited.map_err(|why| {
            exited.unwrap_or_else(|| format!("etcd: {why}; its log ends:\n{}", log_tail(&self.log(0), 20)))
        })
    }

    /// Waits until every running member serves (async, for a test whose candidates run on the
    /// same runtime meanwhile); false if one exited or `bound` passed.
    pub async fn wait_serving(&mut self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        while let Ok(ports) = self.running() {
            if tokio::task::spawn_blocking(move || ports.into_iter().all(healthy)).await.unwrap_or(false) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
        false
    }

    /// `127.0.0.1:<port>` of member `index`'s client URL.
    pub fn endpoint(&self, index: usize) -> String {
        format!("127.0.0.1:{}", self.members[index].client_port)
    }

    /// The client endpoints of every member.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// What a client needs to reach this cluster: for a TLS cluster the CA and the client
    /// certificate.
    pub fn client_options(&self) -> tenure_etcd::EtcdOptions {
        let options = tenure_etcd::EtcdOptions::new();
        let Some(tls) = &self.tls else {
            return options;
        };
        let client = tenure_etcd::EtcdTls::new(certs::read(&tls.pki.ca))
            .and_then(|t| t.with_client_identity(certs::read(&tls.pki.client_cert), certs::read(&tls.pki.client_key)))
            .expect("the test PKI is valid");
        options.with_tls(client)
    }

    /// Runs `etcdctl` against member 0 (with the TLS files of a TLS cluster) and panics with its
    /// output if it fails; returns its standard output.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut command = Command::new("etcdctl");
        command.env("ETCDCTL_API", "3").arg(format!("--endpoints={scheme}://{}", self.endpoint(0)));
        if let Some(tls) = &self.tls {
            command.arg("--cacert").arg(&tls.pki.ca);
            command.arg("--cert").arg(&tls.pki.client_cert);
            command.arg("--key").arg(&tls.pki.client_key);
        }
        let output = command.args(args).output().expect("run etcdctl");
        assert!(
            output.status.success(),
            "etcdctl {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Enables etcd's authentication: `root`, and `user` with `password` and read-write access
    /// to the keys starting with `prefix`.
    pub fn enable_auth(&self, user: &str, password: &str, prefix: &str) {
        self.etcdctl(&["user", "add", "root:rootpw", "--interactive=false"]);
        self.etcdctl(&["user", "grant-role", "root", "root"]);
        self.etcdctl(&["role", "add", "candidates"]);
        self.etcdctl(&["role", "grant-permission", "candidates", "--prefix=true", "readwrite", prefix]);
        self.etcdctl(&["user", "add", &format!("{user}:{password}"), "--interactive=false"]);
        self.etcdctl(&["user", "grant-role", user, "candidates"]);
        let enabled = self.etcdctl(&["auth", "enable"]);
        assert!(enabled.contains("Authentication Enabled"), "auth enable said: {enabled}");
    }

    /// The process id of member `index` (also its process group's), `None` while it is killed:
    /// to freeze the member (SIGSTOP) and thaw it (SIGCONT), a store outage without a restart.
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.members[index].process.as_ref().map(ServerProcess::pid)
    }

    /// Kills member `index` with SIGKILL and waits until it is gone.
    pub fn kill(&mut self, index: usize) {
        self.members[index].process.take();
    }

    /// Restarts a killed member on its ports and data; [`EtcdCluster::wait_serving`] or
    /// [`EtcdCluster::wait_ready`] waits until it serves.
    pub fn restart(&mut self, index: usize) {
        self.spawn(index, false).expect("restart etcd");
    }

    /// [`EtcdCluster::restart`] for a harness: kills member `index` first if it runs and waits
    /// until the cluster serves again; an error instead of a panic, `give_up` checked while
    /// waiting.
    pub fn try_restart(&mut self, index: usize, give_up: fn() -> bool) -> Result<(), String> {
        self.kill(index);
        self.spawn(index, false)?;
        self.wait_ready(START_BOUND, give_up)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.members.clear(); // kills them
        if !self.keep_root {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Whether the `/health` of the member whose metrics listen on `port` answers true.
fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(stream, "GET /health HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200") && answer.contains("\"health\":\"true\"")
}
