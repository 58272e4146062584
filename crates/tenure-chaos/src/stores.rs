//! The stores the candidates elect on, started as the project's integration tests start them:
//! a lock file; `tenure apiserver` (in memory); a one-member etcd with its data directory; a
//! ZooKeeper server with its data directory. All listen on 127.0.0.1 only.
//!
//! Why one type for all: the scenarios inject the same faults on every backend; what differs is
//! how a store starts, restarts and is named in a lock URL, which is what this module knows.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use crate::process::{free_port, wait_for, Process};
use crate::ChaosError;

/// The backends the harness knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum Backend {
    /// A lock file on the local file system (no network: no partition, no restart).
    File,
    /// `tenure apiserver`, a Kubernetes Lease, in memory.
    Apiserver,
    /// A one-member etcd.
    Etcd,
    /// A standalone ZooKeeper.
    Zookeeper,
}

impl Backend {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Backend::File => "file",
            Backend::Apiserver => "apiserver",
            Backend::Etcd => "etcd",
            Backend::Zookeeper => "zookeeper",
        }
    }

    /// Whether candidates reach it over the network (so a partition and a restart mean something).
    pub fn networked(self) -> bool {
        self != Backend::File
    }
}

const JAVA_DIR: &str = "/usr/share/java";
const ZK_JARS: [&str; 4] = ["zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-nop.jar"];

/// A running store.
pub struct Store {
    /// Which backend.
    pub backend: Backend,
    dir: PathBuf,
    process: Option<Process>,
    /// `host:port` of the store's client endpoint (changes when the API server restarts).
    pub address: String,
    port: u16,
    restarts: u32,
}

impl Store {
    /// Starts the store with its files under `dir`; a clear error when its software is missing.
    pub fn start(backend: Backend, dir: &Path, tenure: &Path) -> Result<Store, ChaosError> {
        std::fs::create_dir_all(dir).map_err(|e| ChaosError::Io(format!("{}: {e}", dir.display())))?;
        let mut store =
            Store { backend, dir: dir.to_owned(), process: None, address: String::new(), port: 0, restarts: 0 };
        match backend {
            Backend::File | Backend::Apiserver => {}
            Backend::Etcd => {
                Command::new("etcd").arg("--version").output().map_err(|_| {
                    ChaosError::Missing("etcd is not installed (Debian package etcd-server)".to_owned())
                })?;
                store.port = free_port()?;
            }
            Backend::Zookeeper => {
                for jar in ZK_JARS {
                    if !Path::new(JAVA_DIR).join(jar).exists() {
                        return Err(ChaosError::Missing(format!(
                            "{JAVA_DIR}/{jar} is missing (Debian packages libzookeeper-java, openjdk-17-jdk-headless)"
                        )));
                    }
                }
                store.port = free_port()?;
                let config = format!(
                    "tickTime=100\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
                     4lw.commands.whitelist=ruok,srvr\nminSessionTimeout=200\nmaxSessionTimeout=60000\nmaxClientCnxns=0\n",
                    dir.join("data").display(),
                    store.port
                );
                std::fs::write(dir.join("zoo.cfg"), config).map_err(|e| ChaosError::Io(e.to_string()))?;
            }
        }
        store.launch(tenure)?;
        Ok(store)
    }

    /// The file a file lock lives in.
    pub fn lock_file(&self, election: &str) -> PathBuf {
        self.dir.join(format!("{election}.lock"))
    }

    /// The `--lock` URL (and extra arguments) for a candidate reaching the store at `via`
    /// (`host:port`, its proxy).
    pub fn lock_args(&self, election: &str, via: &str) -> Vec<String> {
        match self.backend {
            Backend::File => vec!["--lock".into(), format!("file://{}", self.lock_file(election).display())],
            Backend::Etcd => vec!["--lock".into(), format!("etcd://{via}/{election}")],
            Backend::Zookeeper => vec!["--lock".into(), format!("zk://{via}/tenure-chaos/{election}")],
            Backend::Apiserver => vec![
                "--lock".into(),
                format!("kube://default/leases/{election}"),
                "--kubeconfig".into(),
                self.dir.join("kubeconfig").display().to_string(),
                "--server".into(),
                format!("http://{via}"),
            ],
        }
    }

    fn launch(&mut self, tenure: &Path) -> Result<(), ChaosError> {
        let log = self.dir.join("store.log");
        match self.backend {
            Backend::File => Ok(()),
            Backend::Etcd => {
                let client = format!("http://127.0.0.1:{}", self.port);
                let peer = format!("http://127.0.0.1:{}", free_port()?);
                let mut command = Command::new("etcd");
                command
                    .args(["--name", "chaos", "--data-dir"])
                    .arg(self.dir.join("data"))
                    .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &format!("chaos={peer}"), "--logger", "zap", "--log-level", "warn"]);
                self.process = Some(Process::start("etcd", &mut command, &log)?);
                self.address = format!("127.0.0.1:{}", self.port);
                let port = self.port;
                self.wait_ready(Duration::from_secs(30), move || http_ok(port, "/health", "\"health\":\"true\""))
            }
            Backend::Zookeeper => {
                let classpath = ZK_JARS.iter().map(|j| format!("{JAVA_DIR}/{j}")).collect::<Vec<_>>().join(":");
                let mut command = Command::new("java");
                command
                    .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", &classpath])
                    .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
                    .arg(self.dir.join("zoo.cfg"));
                self.process = Some(Process::start("zookeeper", &mut command, &log)?);
                self.address = format!("127.0.0.1:{}", self.port);
                let port = self.port;
                self.wait_ready(Duration::from_secs(60), move || {
                    four_letter_word(port, "ruok").is_some_and(|a| a.contains("imok"))
                        && four_letter_word(port, "srvr").is_some_and(|a| a.contains("Mode:"))
                })
            }
            Backend::Apiserver => {
                let out = self.dir.join(format!("apiserver-{}.out", self.restarts));
                let kubeconfig = self.dir.join("kubeconfig");
                let mut command = Command::new(tenure);
                command.args(["apiserver", "--listen", "127.0.0.1:0", "--kubeconfig"]).arg(&kubeconfig);
                self.process = Some(Process::start("apiserver", &mut command, &out)?);
                let mut url = None;
                self.wait_ready(Duration::from_secs(20), || {
                    url = std::fs::read_to_string(&out).ok().and_then(|text| {
                        text.lines().find_map(|l| l.trim().strip_prefix("http://").map(str::to_owned))
                    });
                    url.is_some()
                })?;
                let url = url.unwrap_or_default();
                self.address = url.trim_end_matches('/').to_owned();
                Ok(())
            }
        }
    }

    fn wait_ready(&mut self, limit: Duration, mut ready: impl FnMut() -> bool) -> Result<(), ChaosError> {
        let mut exited = false;
        let up = wait_for(limit, || {
            exited = self.process.as_mut().is_some_and(|p| !p.running());
            exited || ready()
        });
        if up && !exited {
            return Ok(());
        }
        let log = std::fs::read_to_string(self.dir.join("store.log")).unwrap_or_default();
        let tail: String =
            log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        Err(ChaosError::Start(format!("{} did not come up within {limit:?}; log tail:\n{tail}", self.backend.name())))
    }

    /// Kills the store (SIGKILL) and starts it again on its data; the API server loses all its
    /// objects and comes back on a new port. Returns when it serves again.
    pub fn restart(&mut self, tenure: &Path) -> Result<(), ChaosError> {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
        self.restarts += 1;
        self.launch(tenure)
    }
}

/// `GET path` on 127.0.0.1:port answers 200 with a body containing `needle`.
fn http_ok(port: u16, path: &str, needle: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(stream, "GET {path} HTTP/1.1\r\nHost: chaos\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200") && answer.contains(needle)
}

/// Sends a ZooKeeper four-letter word and returns the answer.
fn four_letter_word(port: u16, word: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(word.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}
