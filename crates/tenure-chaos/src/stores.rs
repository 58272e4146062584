//! The stores the candidates elect on, started as the project's integration tests start them
//! (etcd and ZooKeeper by tenure-testkit): a lock file; `tenure apiserver` (in memory); a
//! one-member etcd with its data directory; a ZooKeeper server with its data directory. All
//! listen on 127.0.0.1 only.
//!
//! Why one type for all: the scenarios inject the same faults on every backend; what differs is
//! how a store starts, restarts and is named in a lock URL, which is what this module knows.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;
use tenure_testkit::etcd::{etcd_installed, EtcdCluster, EtcdConfig};
use tenure_testkit::process::log_tail;
use tenure_testkit::zookeeper::{zookeeper_installed, ZkConfig, ZkServer};

use crate::process::{wait_for, Process};
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

/// A running store.
pub struct Store {
    /// Which backend.
    pub backend: Backend,
    dir: PathBuf,
    /// The API server's process.
    process: Option<Process>,
    etcd: Option<EtcdCluster>,
    zookeeper: Option<ZkServer>,
    /// `host:port` of the store's client endpoint (changes when the API server restarts).
    pub address: String,
    restarts: u32,
}

impl Store {
    /// Starts the store with its files under `dir`; a clear error when its software is missing.
    pub fn start(backend: Backend, dir: &Path, tenure: &Path) -> Result<Store, ChaosError> {
        std::fs::create_dir_all(dir).map_err(|e| ChaosError::Io(format!("{}: {e}", dir.display())))?;
        let mut store = Store {
            backend,
            dir: dir.to_owned(),
            process: None,
            etcd: None,
            zookeeper: None,
            address: String::new(),
            restarts: 0,
        };
        let (dir, give_up) = (Some(dir.to_owned()), crate::interrupted as fn() -> bool);
        match backend {
            Backend::File => {}
            Backend::Apiserver => store.start_apiserver(tenure)?,
            Backend::Etcd => {
                etcd_installed().map_err(ChaosError::Missing)?;
                let etcd = EtcdCluster::launch(&EtcdConfig { dir, give_up, ..EtcdConfig::new(1) });
                store.address = store.etcd.insert(etcd.map_err(ChaosError::Start)?).endpoint(0);
            }
            Backend::Zookeeper => {
                zookeeper_installed().map_err(ChaosError::Missing)?;
                // Sessions as long as the longest lease a scenario asks for.
                let config =
                    ZkConfig { max_session_timeout: Duration::from_secs(60), dir, give_up, ..ZkConfig::default() };
                store.address =
                    store.zookeeper.insert(ZkServer::start(&config).map_err(ChaosError::Start)?).servers.clone();
            }
        }
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

    fn start_apiserver(&mut self, tenure: &Path) -> Result<(), ChaosError> {
        let out = self.dir.join(format!("apiserver-{}.out", self.restarts));
        let kubeconfig = self.dir.join("kubeconfig");
        let mut command = Command::new(tenure);
        command.args(["apiserver", "--listen", "127.0.0.1:0", "--kubeconfig"]).arg(&kubeconfig);
        let process = self.process.insert(Process::start("apiserver", &mut command, &out)?);
        let (mut url, mut exited, limit) = (None, false, Duration::from_secs(20));
        let up = wait_for(limit, || {
            exited = !process.running();
            url = std::fs::read_to_string(&out)
                .ok()
                .and_then(|text| text.lines().find_map(|l| l.trim().strip_prefix("http://").map(str::to_owned)));
            exited || url.is_some()
        });
        match url {
            Some(url) if up && !exited => {
                self.address = url.trim_end_matches('/').to_owned();
                Ok(())
            }
            _ => Err(ChaosError::Start(format!("apiserver did not come up within {limit:?}:\n{}", log_tail(&out, 20)))),
        }
    }

    /// Kills the store (SIGKILL) and starts it again on its data; the API server loses all its
    /// objects and comes back on a new port. Returns when it serves again.
    pub fn restart(&mut self, tenure: &Path) -> Result<(), ChaosError> {
        self.restarts += 1;
        match (self.backend, &mut self.etcd, &self.zookeeper) {
            (Backend::Etcd, Some(etcd), _) => etcd.try_restart(0, crate::interrupted).map_err(ChaosError::Start),
            (Backend::Zookeeper, _, Some(zookeeper)) => {
                zookeeper.try_restart(crate::interrupted).map_err(ChaosError::Start)
            }
            (Backend::Apiserver, _, _) => {
                if let Some(mut process) = self.process.take() {
                    process.kill();
                }
                self.start_apiserver(tenure)
            }
            _ => Ok(()),
        }
    }
}
