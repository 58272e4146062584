//! What the Kubernetes tests of tenure-ha share: the project's API server with a kubeconfig for
//! it, a journal of reconciles, runtimes for replicas, and bounded waits.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long any single expected event may take before a test fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub mod shard;

/// The project's API server on a free loopback port, and a kubeconfig for it: tenure-testkit's
/// cluster, as a type of these tests' own, which each test extends with its helpers.
pub struct TestServer(tenure_testkit::kube::Cluster);

impl TestServer {
    pub async fn start() -> TestServer {
        TestServer(tenure_testkit::kube::Cluster::start().await)
    }

    pub async fn start_with(config: tenure_apiserver::ApiServerConfig) -> TestServer {
        TestServer(tenure_testkit::kube::Cluster::start_with(config).await)
    }
}

impl std::ops::Deref for TestServer {
    type Target = tenure_testkit::kube::Cluster;

    fn deref(&self) -> &tenure_testkit::kube::Cluster {
        &self.0
    }
}

/// A runtime of one worker thread: a replica's, as if the replica were a process.
pub fn replica_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

/// Polls `condition` until it holds; fails the test after [`PATIENCE`], saying `what` it waited for.
pub async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One reconcile as the reconciler saw it.
#[derive(Debug, Clone)]
pub struct Span {
    pub replica: String,
    /// The reconciled object.
    pub name: String,
    pub partition: u32,
    pub term: u64,
    pub started: Instant,
    pub ended: Option<Instant>,
    /// False if the reconcile was aborted (its future dropped) instead of returning.
    pub completed: bool,
}

/// Every reconcile of every replica.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<Vec<Span>>>);

impl Journal {
    pub fn spans(&self) -> Vec<Span> {
        self.0.lock().unwrap().clone()
    }

    pub fn by(&self, replica: &str) -> Vec<Span> {
        self.spans().into_iter().filter(|s| s.replica == replica).collect()
    }

    /// The objects `replica` reconciled to completion, sorted.
    pub fn completed_by(&self, replica: &str) -> Vec<String> {
        let mut names: Vec<String> = self.by(replica).into_iter().filter(|s| s.completed).map(|s| s.name).collect();
        names.sort();
        names.dedup();
        names
    }

    /// Records the start of a reconcile; it ends when the returned guard is dropped.
    pub fn start(&self, replica: &str, name: String, partition: u32, term: u64) -> SpanEnd {
        let mut spans = self.0.lock().unwrap();
        let replica = replica.to_owned();
        spans.push(Span { replica, name, partition, term, started: Instant::now(), ended: None, completed: false });
        SpanEnd { journal: self.clone(), index: spans.len() - 1, completed: false }
    }
}

/// Ends its span when dropped: completed if `complete` was called, aborted otherwise.
pub struct SpanEnd {
    journal: Journal,
    index: usize,
    completed: bool,
}

impl SpanEnd {
    pub fn complete(mut self) {
        self.completed = true;
    }
}

impl Drop for SpanEnd {
    fn drop(&mut self) {
        let mut spans = self.journal.0.lock().unwrap();
        spans[self.index].ended = Some(Instant::now());
        spans[self.index].completed = self.completed;
    }
}

/// Checks that no two replicas (or two terms) ever reconciled objects of one partition at
/// overlapping times, and that every reconcile has ended.
pub fn assert_no_overlapping_owners(spans: &[Span]) {
    for (i, a) in spans.iter().enumerate() {
        let a_end = a.ended.unwrap_or_else(|| panic!("a reconcile never ended: {a:?}"));
        for b in &spans[i + 1..] {
            if a.partition != b.partition || (a.replica == b.replica && a.term == b.term) {
                continue;
            }
            let b_end = b.ended.unwrap_or_else(|| panic!("a reconcile never ended: {b:?}"));
            assert!(
                a_end <= b.started || b_end <= a.started,
                "two owners of partition {} reconciled at once: {a:?} and {b:?}",
                a.partition
            );
        }
    }
}

/// Checks that the terms of each partition only grow over time: an older ownership never
/// reconciles after a newer one started.
pub fn assert_terms_grow_per_partition(spans: &[Span]) {
    for a in spans {
        for b in spans {
            if a.partition == b.partition && a.started < b.started {
                assert!(a.term <= b.term, "partition {} went back from term {} to {}", a.partition, a.term, b.term);
            }
        }
    }
}

/// Runs each `scenario(standby)` as two tests, `cold_standby::scenario` and
/// `warm_standby::scenario`.
#[macro_export]
macro_rules! in_both_standby_modes {
    ($($scenario:ident),* $(,)?) => {
        $crate::in_both_standby_modes!(@mode cold_standby, Cold, $($scenario),*);
        $crate::in_both_standby_modes!(@mode warm_standby, Warm, $($scenario),*);
    };
    (@mode $module:ident, $standby:ident, $($scenario:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Standby::$standby).await;
                }
            )*
        }
    };
}
