//! Fenced checkpoints on a real ZooKeeper (feature `zk`, on tenure-testkit's server):
//! a save is one multi-operation that checks the election node of the writer's term, so a
//! deposed leader is refused by the server itself, even before the next leader has written; the
//! next leader resumes from the last checkpoint; unusable documents read as absent.
#![cfg(feature = "zk")]

use std::sync::Arc;
use std::time::Duration;

use tenure::{Elector, Tenure, Term};
use tenure_ha::checkpoint::zk::ZkCheckpointStore;
use tenure_ha::checkpoint::{Checkpoint, CheckpointError, CheckpointStore, Checkpointer};
use tenure_testkit::zookeeper::{server, unique_path, SESSION_TIMEOUT};
use tenure_zk::{zk, ZkElection};
use tokio::time::timeout;

const CONTROLLER: &str = "ip-allocator";
const BOUND: Duration = Duration::from_secs(20);

async fn election(test: &str) -> Option<ZkElection> {
    let server = server()?;
    let path = unique_path(test);
    Some(ZkElection::connect(&server.servers, &path, SESSION_TIMEOUT).await.expect("connect"))
}

fn checkpoint_at(version: &str) -> Checkpoint {
    let mut checkpoint = Checkpoint::new(CONTROLLER);
    checkpoint.resource_versions.insert("pods".into(), version.into());
    checkpoint
}

async fn leads(elector: &Elector) -> Tenure {
    timeout(BOUND, elector.acquired()).await.expect("leads in time").expect("leads")
}

/// The stored checkpoint as (term, Pods' version).
async fn stored(store: &ZkCheckpointStore) -> Option<(Term, String)> {
    let stored = store.load().await.expect("load")?;
    Some((stored.term, stored.checkpoint.resource_version("pods")?.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_zookeeper_leader_cannot_checkpoint_even_before_the_next_leader_has() {
    let Some(election) = election("deposed").await else { return };
    let store_a = ZkCheckpointStore::next_to(election.clone(), CONTROLLER);
    let store_b = ZkCheckpointStore::next_to(election.clone(), CONTROLLER);
    assert_eq!(store_a.path(), format!("{}-checkpoint", election.path()));

    let a = election.campaign("a").expect("campaign");
    let tenure_a = leads(&a).await;
    let term_a = tenure_a.term();
    store_a.save(term_a, &checkpoint_at("10")).await.expect("the leader checkpoints");
    store_a.save(term_a, &checkpoint_at("11")).await.expect("and again under the same term");

    // `a` loses its tenure (its node is deleted) but keeps its store, as a paused process would.
    let b = election.campaign("b").expect("campaign");
    drop(tenure_a);
    a.shutdown().await.expect("a steps down");
    let tenure_b = leads(&b).await;
    assert!(tenure_b.term() > term_a);

    // Nothing newer is stored yet: only the election node's absence refuses the late write.
    let late = store_a.save(term_a, &checkpoint_at("12")).await;
    assert!(
        matches!(late, Err(CheckpointError::Superseded { ours, newer: None }) if ours == term_a),
        "the deposed leader's write must be refused, got {late:?}"
    );
    assert_eq!(stored(&store_b).await, Some((term_a, "11".to_owned())), "the checkpoint did not move");

    store_b.save(tenure_b.term(), &checkpoint_at("25")).await.expect("the new leader checkpoints");
    let later = store_a.save(term_a, &checkpoint_at("13")).await;
    assert!(matches!(later, Err(CheckpointError::Superseded { .. })), "got {later:?}");
    assert_eq!(stored(&store_a).await, Some((tenure_b.term(), "25".to_owned())));
    drop(tenure_b);
    b.shutdown().await.expect("b steps down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_zookeeper_leader_resumes_where_the_last_one_checkpointed() {
    let Some(election) = election("resume").await else { return };
    let store = Arc::new(ZkCheckpointStore::next_to(election.clone(), CONTROLLER));
    let a = election.campaign("a").expect("campaign");
    let b = election.campaign("b").expect("campaign");
    let (first, second, first_tenure) = tokio::select! {
        tenure = a.acquired() => (a, b, tenure.expect("a leads")),
        tenure = b.acquired() => (b, a, tenure.expect("b leads")),
    };

    let old = Checkpointer::resume(store.clone(), &first_tenure, Duration::from_millis(100)).await.expect("resumed");
    assert_eq!(old.resumed_from(), None, "nothing was checkpointed yet");
    old.record("pods", "4711");
    drop(old); // the last write, before the tenure is released
    let term = first_tenure.term();
    drop(first_tenure);
    first.shutdown().await.expect("the leader steps down");

    let tenure = leads(&second).await;
    let new = Checkpointer::resume(store.clone(), &tenure, Duration::from_millis(100)).await.expect("resumed");
    assert_eq!(new.resumed_from(), Some(term));
    assert_eq!(new.resource_version("pods").as_deref(), Some("4711"));
    drop(new);
    drop(tenure);
    second.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_zookeeper_checkpoints_are_treated_as_absent() {
    let Some(election) = election("bad").await else { return };
    let store = ZkCheckpointStore::next_to(election.clone(), CONTROLLER);
    let elector = election.campaign("a").expect("campaign");
    let tenure = leads(&elector).await;
    let term = tenure.term();
    let client = election.client();
    let put = |document: String| {
        let client = client.clone();
        let path = store.path().to_owned();
        async move {
            match client.check_stat(&path).await.expect("stat") {
                Some(stat) => {
                    client.set_data(&path, document.as_bytes(), Some(stat.version)).await.expect("set");
                }
                None => {
                    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                    client.create(&path, document.as_bytes(), &options).await.expect("create");
                }
            }
        }
    };

    put("{not json".to_owned()).await;
    assert_eq!(store.load().await.expect("load"), None, "a document that does not parse");
    store.save(term, &checkpoint_at("5")).await.expect("an unusable document does not block writing");
    assert_eq!(stored(&store).await, Some((term, "5".to_owned())));

    put(format!(
        r#"{{"term":{},"formatVersion":1,"controller":"someone-else","resourceVersions":{{"pods":"9"}}}}"#,
        term.0
    ))
    .await;
    assert_eq!(store.load().await.expect("load"), None, "another controller's checkpoint");

    put(format!(r#"{{"term":{},"formatVersion":99,"controller":"{CONTROLLER}"}}"#, term.0 + 1)).await;
    assert_eq!(store.load().await.expect("load"), None, "a newer format");
    let refused = store.save(term, &checkpoint_at("6")).await;
    assert!(
        matches!(refused, Err(CheckpointError::Superseded { newer: Some(newer), .. }) if newer == Term(term.0 + 1)),
        "its term still fences older writers: {refused:?}"
    );
    drop(tenure);
    elector.shutdown().await.expect("shutdown");
}
