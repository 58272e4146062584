//! Fencing end to end on a real etcd (feature `etcd`): the term of a tenure guards both the
//! checkpoint and the user's own writes, and a deposed leader's late writes are refused by etcd.
#![cfg(feature = "etcd")]

use std::sync::Arc;
use std::time::Duration;

use tenure::Term;
use tenure_etcd::proto::etcdserverpb::{request_op, PutRequest, RequestOp};
use tenure_etcd::EtcdElection;
use tenure_ha::checkpoint::etcd::EtcdCheckpointStore;
use tenure_ha::checkpoint::{Checkpoint, CheckpointError, CheckpointStore, Checkpointer};
use tenure_testkit::etcd::EtcdCluster;
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(20);

fn put(key: &str, value: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ..Default::default()
        })),
    }
}

#[tokio::test]
async fn a_deposed_leader_can_write_neither_the_checkpoint_nor_a_fenced_resource() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let endpoints = cluster.endpoints();
    let connect = || EtcdElection::connect(&endpoints, "ip-allocator");
    let election_a = connect().await.expect("connected").with_drain_timeout(Duration::from_millis(100));
    let election_b = connect().await.expect("connected");
    let checkpoint_key = "ip-allocator-state/checkpoint";
    let store_a = Arc::new(EtcdCheckpointStore::new(election_a.clone(), checkpoint_key, "ip-allocator"));
    let store_b = Arc::new(EtcdCheckpointStore::new(election_b.clone(), checkpoint_key, "ip-allocator"));

    let a = election_a.campaign("a", TTL).expect("campaign");
    let tenure_a = timeout(BOUND, a.acquired()).await.expect("a leads in time").expect("a leads");
    let term_a = tenure_a.term();
    let old = Checkpointer::resume(store_a.clone(), &tenure_a, TTL / 4).await.expect("resumed");
    old.record("pods", "10");
    old.flush().await.expect("written while leading");
    let allocated = election_a.guarded_txn(term_a, vec![put("ips/10.0.0.1", "pod-1")]).await.expect("txn");
    assert!(allocated.succeeded, "the leader's fenced write applies");

    // `a` loses its tenure (its key is gone) but keeps its handles, as a paused process would.
    let b = election_b.campaign("b", TTL).expect("campaign");
    drop(tenure_a);
    a.resign().await.expect("resigned");
    let tenure_b = timeout(BOUND, b.acquired()).await.expect("b leads in time").expect("b leads");
    assert!(tenure_b.term() > term_a);
    let new = Checkpointer::resume(store_b.clone(), &tenure_b, TTL / 4).await.expect("resumed");
    assert_eq!(new.resumed_from(), Some(term_a));
    assert_eq!(new.resource_version("pods").as_deref(), Some("10"));
    new.record("pods", "20");
    new.flush().await.expect("written under the new term");

    // The deposed leader's checkpointer ignores progress recorded after its tenure (C2), so its
    // flush has nothing to write; a save that reaches the store anyway (a paused process whose
    // write was already built) is refused by etcd itself: the election key of its term is gone.
    old.record("pods", "15");
    old.flush().await.expect("nothing recorded under an ended tenure, nothing to write");
    let mut late_checkpoint = Checkpoint::new("ip-allocator");
    late_checkpoint.resource_versions.insert("pods".into(), "15".into());
    let rejected = store_a.save(term_a, &late_checkpoint).await;
    assert!(matches!(rejected, Err(CheckpointError::Superseded { ours, .. }) if ours == term_a), "{rejected:?}");
    let late = election_a.guarded_txn(term_a, vec![put("ips/10.0.0.1", "pod-2")]).await.expect("txn");
    assert!(!late.succeeded, "etcd refuses the deposed leader's write");
    let stored = store_a.load().await.expect("readable").expect("present");
    assert_eq!((stored.term, stored.checkpoint.resource_version("pods")), (tenure_b.term(), Some("20")));
    let ip = election_b.get("ips/10.0.0.1").await.expect("read").expect("allocated");
    assert_eq!(ip.value, b"pod-1");
    assert_ne!(tenure_b.term(), Term(0));
    drop((new, tenure_b));
    b.shutdown().await.expect("shut down");
    let _ = a.shutdown().await;
}
