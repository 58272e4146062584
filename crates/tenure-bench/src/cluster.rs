//! A group of `tenure elect` processes on one file lock, for the failover and handover
//! benchmarks.

use std::path::{Path, PathBuf};

use crate::binary::Elect;
use crate::process::ChildGuard;

/// Candidates of one election, each a `tenure elect` process, with fresh identities (`c1`, `c2`,
/// ...) so that a replacement never shares an identity with a process it replaces.
///
/// Why fresh identities: a process restarted with the identity of the holder would find "its"
/// record under a term it did not acquire and, by design, wait out the lease like any other
/// candidate. Dropping the cluster kills every process (see [`ChildGuard`]).
pub struct Cluster {
    binary: PathBuf,
    dir: PathBuf,
    lock: PathBuf,
    election: String,
    ttl: String,
    next_id: usize,
    members: Vec<ChildGuard>,
}

impl Cluster {
    /// An empty cluster whose lock and logs live in `dir`.
    pub fn new(binary: &Path, dir: &Path, election: &str, ttl: &str) -> Cluster {
        let (binary, lock, election) = (binary.to_owned(), dir.join(format!("{election}.json")), election.to_owned());
        Cluster { binary, dir: dir.to_owned(), lock, election, ttl: ttl.to_owned(), next_id: 1, members: Vec::new() }
    }

    /// The lock file the candidates share.
    pub fn lock_path(&self) -> &Path {
        &self.lock
    }

    /// Starts one more candidate and returns its identity.
    pub fn start_candidate(&mut self) -> String {
        let id = format!("c{}", self.next_id);
        self.next_id += 1;
        let log = self.dir.join(format!("{id}.log"));
        let elect = Elect { election: &self.election, id: &id, lock: &self.lock, ttl: Some(&self.ttl), http: None };
        let mut command = elect.command(&self.binary, &log).expect("a command line for tenure elect");
        let child = ChildGuard::spawn(&id, &mut command, Some(&log))
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        self.members.push(child);
        id
    }

    /// Takes the candidate `id` out of the cluster (to signal it and wait for its exit).
    pub fn remove(&mut self, id: &str) -> ChildGuard {
        let index = self.members.iter().position(|m| m.name() == id);
        let index = index.unwrap_or_else(|| panic!("{id} is not a running candidate of this cluster"));
        self.members.swap_remove(index)
    }

    /// The number of candidates.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True without candidates.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Panics, with the end of its log, if a candidate has exited.
    pub fn check_running(&mut self) {
        for member in &mut self.members {
            if let Some(status) = member.try_status().expect("the status of a candidate") {
                panic!("candidate {} exited ({status}); its log ends with:\n{}", member.name(), member.log_tail(20));
            }
        }
    }
}
