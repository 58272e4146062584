//! Writes fenced by etcd itself (W2) against a real etcd: a fenced transaction lands only while
//! its tenure is the current one, a failed compare of the user's own is told apart from a deposed
//! writer in the same round trip, and a term no tenure has is a typed error. Interoperable with
//! `etcdctl elect`: its leader's term fences the same way.

use std::process::Stdio;
use std::time::Duration;

use tenure::{Role, Term};
use tenure_etcd::proto::etcdserverpb::{compare, request_op, response_op, Compare, PutRequest, RangeRequest};
use tenure_etcd::proto::etcdserverpb::{RequestOp, TxnRequest};
use tenure_etcd::{EtcdElection, FencedTxnError};
use tenure_testkit::etcd::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(2);
const PATIENCE: Duration = Duration::from_secs(10);

fn put(key: &str, value: &str) -> RequestOp {
    let put = PutRequest { key: key.as_bytes().to_vec(), value: value.as_bytes().to_vec(), ..Default::default() };
    RequestOp { request: Some(request_op::Request::RequestPut(put)) }
}

fn get(key: &str) -> RequestOp {
    let range = RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
    RequestOp { request: Some(request_op::Request::RequestRange(range)) }
}

/// `value(key) == value`: the user's own compare.
fn value_is(key: &str, value: &str) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Value as i32,
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        target_union: Some(compare::TargetUnion::Value(value.as_bytes().to_vec())),
    }
}

async fn value(election: &EtcdElection, key: &str) -> Option<String> {
    election.get(key).await.unwrap().map(|kv| String::from_utf8(kv.value).unwrap())
}

/// The create revision of `identity`'s key in the election: a follower's, no tenure's.
async fn queued_key_of(election: &EtcdElection, identity: &str) -> Term {
    let mut all = RangeRequest { key: b"fenced/".to_vec(), range_end: b"fenced0".to_vec(), ..Default::default() };
    all.limit = 0;
    let list = RequestOp { request: Some(request_op::Request::RequestRange(all)) };
    let answer =
        election.txn(TxnRequest { compare: Vec::new(), success: vec![list], failure: Vec::new() }).await.unwrap();
    let Some(response_op::Response::ResponseRange(range)) = &answer.responses[0].response else { panic!("{answer:?}") };
    let kv = range.kvs.iter().find(|kv| kv.value == identity.as_bytes()).expect("the identity's key");
    Term::from_count(kv.create_revision)
}

/// The revision of the last write to the resource: a term no election key has.
async fn answer_revision(election: &EtcdElection) -> Term {
    Term::from_count(election.get("ips/10.0.0.1").await.unwrap().unwrap().mod_revision)
}

#[tokio::test]
async fn a_fenced_txn_lands_while_its_tenure_holds_tells_a_failed_compare_from_deposed_and_refuses_bad_terms() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "fenced").await.unwrap();
    let a = election.campaign("a", TTL).unwrap();
    let tenure = timeout(PATIENCE, a.acquired()).await.unwrap().unwrap();
    let term_a = tenure.term();

    // Leads: the user's transaction runs, and its answer is the user's.
    let request = TxnRequest { compare: Vec::new(), success: vec![put("ips/10.0.0.1", "pod-1")], failure: Vec::new() };
    let answer = election.fenced_txn(term_a, request).await.unwrap();
    assert!(answer.succeeded);
    assert!(matches!(answer.responses[0].response, Some(response_op::Response::ResponsePut(_))));
    assert!(answer.header.unwrap().revision > i64::try_from(term_a.0).unwrap());
    assert_eq!(value(&election, "ips/10.0.0.1").await.as_deref(), Some("pod-1"));

    // Leads, but the user's own compare fails: not deposed; the user's failure branch ran.
    let request = TxnRequest {
        compare: vec![value_is("ips/10.0.0.1", "free")],
        success: vec![put("ips/10.0.0.1", "pod-2")],
        failure: vec![get("ips/10.0.0.1")],
    };
    let answer = election.fenced_txn(term_a, request).await.unwrap();
    assert!(!answer.succeeded, "the user's compare failed");
    let Some(response_op::Response::ResponseRange(range)) = &answer.responses[0].response else {
        panic!("the user's failure branch answers: {answer:?}")
    };
    assert_eq!(range.kvs[0].value, b"pod-1");

    // Another leads: deposed, naming who leads; nothing of the transaction runs, not even its
    // failure branch.
    let b = election.campaign("b", TTL).unwrap();
    let mut b_view = b.subscribe();
    timeout(PATIENCE, b_view.wait_for(|l| l.leader.as_deref() == Some("a") && l.role == Role::Follower))
        .await
        .unwrap()
        .unwrap();
    drop(tenure);
    a.resign().await.unwrap();
    let term_b = timeout(PATIENCE, b.acquired()).await.unwrap().unwrap().term();
    let request = TxnRequest {
        compare: vec![value_is("ips/10.0.0.1", "free")],
        success: vec![put("ips/10.0.0.1", "late")],
        failure: vec![put("ips/failure-branch", "ran")],
    };
    let error = election.fenced_txn(term_a, request).await.unwrap_err();
    let FencedTxnError::Deposed { election: name, term, shows } = &error else { panic!("{error}") };
    assert_eq!((name.as_str(), *term), ("fenced", term_a));
    assert!(shows.starts_with(&format!("\"b\" leading at term {term_b}")), "{error}");
    assert!(error.to_string().starts_with("deposed: "), "{error}");
    assert_eq!(value(&election, "ips/10.0.0.1").await.as_deref(), Some("pod-1"));
    assert_eq!(value(&election, "ips/failure-branch").await, None);

    // The new tenure writes; guarded_txn (kept) agrees with fenced_txn.
    assert!(election.guarded_txn(term_b, vec![put("ips/10.0.0.1", "pod-3")]).await.unwrap().succeeded);
    assert!(!election.guarded_txn(term_a, vec![put("ips/10.0.0.1", "late")]).await.unwrap().succeeded);
    assert_eq!(value(&election, "ips/10.0.0.1").await.as_deref(), Some("pod-3"));

    // Terms no tenure has: typed errors, no write.
    for bad in [Term(0), Term(u64::MAX)] {
        let request =
            TxnRequest { compare: Vec::new(), success: vec![put("ips/10.0.0.1", "bad")], failure: Vec::new() };
        let error = election.fenced_txn(bad, request).await.unwrap_err();
        assert!(matches!(error, FencedTxnError::BadTerm { .. }), "{error}");
    }
    // The term of a queued follower's key (a, queued again after its resign), or a revision of
    // another key: no tenure, deposed.
    let mut a_view = a.subscribe();
    timeout(PATIENCE, a_view.wait_for(|l| l.leader.as_deref() == Some("b") && l.role == Role::Follower))
        .await
        .unwrap()
        .unwrap();
    let queued = queued_key_of(&election, "a").await;
    for not_leading in [queued, answer_revision(&election).await] {
        let request =
            TxnRequest { compare: Vec::new(), success: vec![put("ips/10.0.0.1", "bad")], failure: Vec::new() };
        let error = election.fenced_txn(not_leading, request).await.unwrap_err();
        assert!(matches!(error, FencedTxnError::Deposed { .. }), "{error}");
    }
    assert_eq!(value(&election, "ips/10.0.0.1").await.as_deref(), Some("pod-3"));

    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
    // Nobody leads: deposed, and it says so.
    let request = TxnRequest { compare: Vec::new(), success: vec![put("ips/10.0.0.1", "late")], failure: Vec::new() };
    let error = election.fenced_txn(term_b, request).await.unwrap_err();
    assert!(matches!(&error, FencedTxnError::Deposed { shows, .. } if shows == "no leader"), "{error}");
}

#[tokio::test]
async fn the_term_of_an_etcdctl_elect_leader_fences_its_writes_and_a_deleted_election_key_deposes_it() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "interop").await.unwrap();
    let mut etcdctl = tokio::process::Command::new("etcdctl")
        .args(["--endpoints", &cluster.endpoint(0), "elect", "interop", "from-etcdctl"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run etcdctl");
    let mut lines = BufReader::new(etcdctl.stdout.take().unwrap()).lines();
    // etcdctl prints its key, then its proposal, once it leads.
    timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "from-etcdctl" {
                return;
            }
        }
        panic!("etcdctl ended without leading");
    })
    .await
    .expect("etcdctl leads in time");
    let leader = election.leader().await.unwrap().expect("etcdctl's key");

    let request = TxnRequest { compare: Vec::new(), success: vec![put("resource", "etcdctl's")], failure: Vec::new() };
    assert!(election.fenced_txn(leader.term, request).await.unwrap().succeeded);

    // A Tenure candidate queues behind etcdctl; the election key is deleted under etcdctl (what
    // an expired lease does): its term is over, the Tenure candidate leads, and etcdctl's late
    // write is refused by etcd.
    let tenure_candidate = election.campaign("tenure", TTL).unwrap();
    let mut seen = tenure_candidate.subscribe();
    timeout(PATIENCE, seen.wait_for(|l| l.leader.as_deref() == Some("from-etcdctl") && l.role == Role::Follower))
        .await
        .unwrap()
        .unwrap();
    cluster.etcdctl(&["del", &leader.key]);
    let term = timeout(PATIENCE, tenure_candidate.acquired()).await.unwrap().unwrap().term();
    let request = TxnRequest { compare: Vec::new(), success: vec![put("resource", "late")], failure: Vec::new() };
    let error = election.fenced_txn(leader.term, request).await.unwrap_err();
    assert!(matches!(&error, FencedTxnError::Deposed { shows, .. } if shows.starts_with("\"tenure\"")), "{error}");
    let request = TxnRequest { compare: Vec::new(), success: vec![put("resource", "tenure's")], failure: Vec::new() };
    assert!(election.fenced_txn(term, request).await.unwrap().succeeded);
    assert_eq!(value(&election, "resource").await.as_deref(), Some("tenure's"));
    tenure_candidate.shutdown().await.unwrap();
}
