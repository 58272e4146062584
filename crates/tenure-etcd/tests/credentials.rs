//! Credentials in an endpoint (`user:password@host:port`) never show in an error.

use std::time::Duration;

use tenure_etcd::{EtcdElection, EtcdError};
use tenure_testkit::etcd::EtcdCluster;
use tokio::time::timeout;

const PASSWORD: &str = "s3cret-Pa55";

fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

#[tokio::test]
async fn an_unreachable_endpoint_is_named_without_its_password() {
    let endpoint = format!("admin:{PASSWORD}@127.0.0.1:{}", closed_port());
    let error = timeout(Duration::from_secs(10), EtcdElection::connect(&[endpoint], "x"))
        .await
        .expect("fails in time")
        .expect_err("nothing listens there");
    let shown = format!("{error} / {error:?}");
    assert!(!shown.contains(PASSWORD), "{shown}");
    let EtcdError::Rpc { endpoint, .. } = &error else { panic!("not a failed call: {shown}") };
    assert!(endpoint.starts_with("admin:***@127.0.0.1:"), "{endpoint}");
}

#[tokio::test]
async fn an_invalid_endpoint_is_named_without_its_password() {
    let error =
        EtcdElection::connect(&[format!("http://admin:{PASSWORD}@bad host:1")], "x").await.expect_err("not a URI");
    let shown = format!("{error} / {error:?}");
    assert!(matches!(error, EtcdError::BadEndpoint { .. }), "{shown}");
    assert!(!shown.contains(PASSWORD), "{shown}");
    assert!(shown.contains("admin:***@"), "{shown}");
}

#[tokio::test]
async fn a_reachable_endpoint_with_a_password_is_named_without_it_when_a_later_call_fails() {
    let Some(mut cluster) = EtcdCluster::start(1).await else { return };
    let endpoint = format!("admin:{PASSWORD}@{}", cluster.endpoint(0));
    // Not used for authentication (not supported): never sent, only named, redacted.
    let election = timeout(Duration::from_secs(10), EtcdElection::connect(&[endpoint], "x"))
        .await
        .expect("in time")
        .expect("the user information is left out of the connection");
    cluster.kill(0);
    let error = timeout(Duration::from_secs(10), election.leader()).await.expect("in time").expect_err("server gone");
    let shown = format!("{error} / {error:?}");
    assert!(!shown.contains(PASSWORD), "{shown}");
    assert!(shown.contains("admin:***@127.0.0.1:"), "{shown}");
}
