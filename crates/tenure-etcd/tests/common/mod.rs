//! A test harness that runs real etcd servers on free loopback ports, with data in temporary
//! directories, and stops them when dropped.
//!
//! If `etcd` is not installed, [`EtcdCluster::start`] returns `None` after printing
//! "skipped: etcd not installed", unless `CI=true`, where it panics: CI must run these tests.
#![allow(dead_code)]

#[path = "../../../../tests/support/certs.rs"]
pub mod certs;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One member of a test cluster.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    data_dir: PathBuf,
    child: Option<Child>,
}

/// A cluster of one or more etcd members on 127.0.0.1.
pub struct EtcdCluster {
    pub members: Vec<Member>,
    root: PathBuf,
    token: String,
    /// Set when the members serve clients over TLS.
    pub tls: Option<ServerTls>,
    /// More command-line flags for every member.
    extra_args: Vec<String>,
}

/// How the members of a TLS cluster serve their clients.
pub struct ServerTls {
    /// The certificates, in the cluster's directory.
    pub pki: certs::TestPki,
    /// `--client-cert-auth`: clients must present a certificate signed by the CA.
    pub client_cert_auth: bool,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// True if the `etcd` binary runs; panics in CI when it does not.
pub fn etcd_available() -> bool {
    let found = Command::new("etcd").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("etcd is not installed (not on PATH), and CI=true: install etcd (Debian package `etcd-server`) to run these tests");
        }
        println!("skipped: etcd not installed");
    }
    found
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

impl EtcdCluster {
    /// Starts `size` members and waits until the cluster serves requests; `None` if etcd is not
    /// installed (outside CI). Retries with new ports if one was taken in the meantime.
    pub async fn start(size: usize) -> Option<EtcdCluster> {
        Self::start_with(size, None, &[]).await
    }

    /// Starts `size` members that serve clients over TLS only (the peers talk plain text), with
    /// a PKI generated for the occasion; with `client_cert_auth` they also demand a client
    /// certificate signed by the CA.
    pub async fn start_tls(size: usize, client_cert_auth: bool) -> Option<EtcdCluster> {
        Self::start_with(size, Some(client_cert_auth), &[]).await
    }

    /// [`EtcdCluster::start_tls`] with more etcd flags (`--auth-token-ttl 1`).
    pub async fn start_tls_with(size: usize, client_cert_auth: bool, extra_args: &[&str]) -> Option<EtcdCluster> {
        Self::start_with(size, Some(client_cert_auth), extra_args).await
    }

    async fn start_with(size: usize, tls: Option<bool>, extra_args: &[&str]) -> Option<EtcdCluster> {
        if !etcd_available() {
            return None;
        }
        for _attempt in 0..5 {
            let id = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let root = std::env::temp_dir().join(format!("tenure-etcd-test-{}-{id}-{nanos}", std::process::id()));
            std::fs::create_dir_all(&root).expect("create the test directory");
            let members = (0..size)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: free_port(),
                    peer_port: free_port(),
                    data_dir: root.join(format!("m{i}")),
                    child: None,
                })
                .collect();
            let tls = tls.map(|client_cert_auth| ServerTls {
                pki: certs::TestPki::generate(&root.join("pki")),
                client_cert_auth,
            });
            let mut cluster = EtcdCluster {
                members,
                root,
                token: format!("tenure-test-{id}"),
                tls,
                extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            };
            for i in 0..size {
                cluster.spawn(i, true);
            }
            if cluster.wait_serving(Duration::from_secs(20)).await {
                return Some(cluster);
            }
            eprintln!("etcd did not come up (port taken?); retrying with new ports");
        }
        panic!("could not start an etcd test cluster");
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, index: usize, new: bool) {
        let initial_cluster = self.initial_cluster();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join(format!("{}.log", self.members[index].name)))
            .expect("open the etcd log");
        let member = &mut self.members[index];
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
        command.args(&self.extra_args);
        let child = command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial_cluster, "--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", if new { "new" } else { "existing" }])
            .args(["--logger", "zap", "--log-level", "warn"])
            // A restarted member must not depose a healthy raft leader (etcd 3.5's default).
            .arg("--pre-vote")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        member.child = Some(child);
    }

    /// Waits until every running member answers a read (which needs a raft leader).
    pub async fn wait_serving(&mut self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            loop {
                if let Some(child) = self.members[i].child.as_mut() {
                    if let Ok(Some(_)) = child.try_wait() {
                        return false; // exited: port taken or bad flags
                    }
                }
                let endpoint = vec![self.endpoint(i)];
                let options = self.client_options();
                let ok = matches!(
                    tokio::time::timeout(
                        Duration::from_secs(2),
                        tenure_etcd::EtcdElection::connect_with(&endpoint, "health", &options)
                    )
                    .await,
                    Ok(Ok(_))
                );
                if ok {
                    break;
                }
                if Instant::now() >= deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        true
    }

    pub fn endpoint(&self, index: usize) -> String {
        format!("127.0.0.1:{}", self.members[index].client_port)
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

    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Kills member `index` with SIGKILL.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restarts a killed member on its ports and data.
    pub fn restart(&mut self, index: usize) {
        self.spawn(index, false);
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The monotonic clock (CLOCK_MONOTONIC) in nanoseconds: one clock for every process on the host.
pub fn monotonic_nanos() -> u128 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock_gettime");
    u128::try_from(now.tv_sec()).unwrap_or(0) * 1_000_000_000 + u128::try_from(now.tv_nsec()).unwrap_or(0)
}

pub mod log_capture;
pub mod stall_proxy;
