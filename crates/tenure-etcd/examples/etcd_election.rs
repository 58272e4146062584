//! Leader election on etcd, shared with `etcdctl elect my-service`, and a write fenced by the
//! term. Start an etcd (`etcd`), then `cargo run -p tenure-etcd --example etcd_election`.

use std::time::Duration;

use tenure_etcd::proto::etcdserverpb::{request_op::Request, PutRequest, RequestOp};
use tenure_etcd::EtcdElection;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let election = EtcdElection::connect(&["127.0.0.1:2379".to_owned()], "my-service").await?;
    let elector = election.campaign(format!("replica-{}", std::process::id()), Duration::from_secs(10))?; // lease TTL
    let tenure = elector.acquired().await?;
    // etcd applies this put only while the key of this tenure leads: a paused ex-leader cannot.
    let put = PutRequest { key: b"my-service-state".to_vec(), value: b"42".to_vec(), ..Default::default() };
    let op = RequestOp { request: Some(Request::RequestPut(put)) };
    let applied = election.guarded_txn(tenure.check()?, vec![op]).await?.succeeded;
    println!("leading with term {}; fenced write applied: {applied}", tenure.term());
    drop(tenure);
    elector.shutdown().await?; // deletes the key: the next candidate leads at once
    Ok(())
}
