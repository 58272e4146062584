//! The ZooKeeper elector over TLS against a real server with a `secureClientPort` (Netty),
//! certificates generated per test. Needs the crate feature `tls`:
//! `cargo nextest run -p tenure-zk --features tls --test tls`.
#![cfg(feature = "tls")]

mod common;

use std::time::Duration;

use common::{certs, tls_server, unique_path, wait_until, SESSION_TIMEOUT};
use tenure::Role;
use tenure_zk::{ZkElection, ZkError, ZkOptions};

fn pem(path: &std::path::Path) -> String {
    String::from_utf8(certs::read(path)).expect("PEM is text")
}

#[tokio::test]
async fn candidates_elect_one_leader_over_tls() {
    let Some((server, pki)) = tls_server(false) else { return };
    let options = ZkOptions::new().with_tls(&pem(&pki.ca), None).unwrap().with_digest("tenure", "s3cret");
    let path = unique_path("tls");
    let election = ZkElection::connect_with(&server.servers, &path, SESSION_TIMEOUT, options).await.unwrap();
    let a = election.campaign("a").unwrap();
    let b = election.campaign("b").unwrap();
    wait_until(&[&a, &b], Duration::from_secs(10), "one leader", |s| {
        s.iter().filter(|l| l.role == Role::Leader).count() == 1 && s.iter().all(|l| l.leader.is_some())
    })
    .await;
    let leader = election.leader().await.unwrap().expect("a leader");
    let (leading, other) = if a.identity() == leader.identity { (a, b) } else { (b, a) };
    leading.shutdown().await.unwrap();
    wait_until(&[&other], Duration::from_secs(10), "the other leads", |s| s[0].role == Role::Leader).await;
    other.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused() {
    let Some((server, pki)) = tls_server(false) else { return };
    let options = ZkOptions::new().with_tls(&pem(&pki.other_ca), None).unwrap();
    let started = tokio::time::Instant::now();
    let result = ZkElection::connect_with(&server.servers, &unique_path("tls-ca"), SESSION_TIMEOUT, options).await;
    let error = result.expect_err("a server signed by another CA was trusted");
    assert!(matches!(&error, ZkError::TlsHandshake { reason, .. } if reason.contains("UnknownIssuer")), "{error:?}");
    assert!(started.elapsed() < SESSION_TIMEOUT * 4, "took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_server_that_demands_a_client_certificate_gets_one() {
    let Some((server, pki)) = tls_server(true) else { return };
    let identity = (pem(&pki.client_cert), pem(&pki.client_key));
    let options = ZkOptions::new().with_tls(&pem(&pki.ca), Some((&identity.0, &identity.1))).unwrap();
    let election =
        ZkElection::connect_with(&server.servers, &unique_path("tls-cert"), SESSION_TIMEOUT, options).await.unwrap();
    let a = election.campaign("a").unwrap();
    wait_until(&[&a], Duration::from_secs(10), "a leads", |s| s[0].role == Role::Leader).await;
    a.shutdown().await.unwrap();

    let without = ZkOptions::new().with_tls(&pem(&pki.ca), None).unwrap();
    let error = ZkElection::connect_with(&server.servers, &unique_path("tls-nocert"), SESSION_TIMEOUT, without)
        .await
        .unwrap_err();
    assert!(matches!(error, ZkError::TlsHandshake { .. }), "{error:?}");
}

#[test]
fn tls_settings_that_are_not_pem_are_refused() {
    assert!(matches!(ZkOptions::new().with_tls("not a certificate", None), Err(ZkError::Tls(_))));
}
