//! The etcd elector against real etcd servers that serve clients over TLS, demand client
//! certificates, and have etcd's authentication enabled. Certificates are generated per test.

use std::time::Duration;

use tenure::{Elector, Role};
use tenure_etcd::{EtcdElection, EtcdError, EtcdOptions, EtcdTls};
use tenure_testkit::certs;
use tenure_testkit::etcd::EtcdCluster;
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(2);

/// Waits (bounded) until `elector` leads.
async fn leads(elector: &Elector) {
    match timeout(Duration::from_secs(10), elector.acquired()).await {
        Ok(Ok(tenure)) => drop(tenure),
        other => panic!("{} did not lead: {other:?}", elector.identity()),
    }
}

/// Waits (bounded) until `elector` follows `leader`.
async fn follows(elector: &Elector, leader: &str) {
    let mut rx = elector.subscribe();
    let seen = timeout(
        Duration::from_secs(10),
        rx.wait_for(|l| l.role != Role::Leader && l.leader.as_deref() == Some(leader)),
    )
    .await;
    assert!(matches!(seen, Ok(Ok(_))), "{} does not follow {leader}: {:?}", elector.identity(), elector.leadership());
}

fn tls_with(ca: &std::path::Path, pki: &certs::TestPki, client_cert: bool) -> EtcdTls {
    let tls = EtcdTls::new(certs::read(ca)).expect("CA");
    if !client_cert {
        return tls;
    }
    tls.with_client_identity(certs::read(&pki.client_cert), certs::read(&pki.client_key)).expect("identity")
}

#[tokio::test]
async fn candidates_with_client_certificates_elect_one_leader_over_tls() {
    let Some(cluster) = EtcdCluster::start_tls(1, true).await else { return };
    let options = cluster.client_options();
    let election = EtcdElection::connect_with(&cluster.endpoints(), "tls", &options).await.unwrap();
    let a = election.campaign("a", TTL).unwrap();
    leads(&a).await;
    let b = election.campaign("b", TTL).unwrap();
    follows(&b, "a").await;
    assert_eq!(election.leader().await.unwrap().map(|l| l.identity).as_deref(), Some("a"));
    a.shutdown().await.unwrap();
    leads(&b).await;
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused_with_a_clear_error() {
    let Some(cluster) = EtcdCluster::start_tls(1, false).await else { return };
    let pki = &cluster.tls.as_ref().unwrap().pki;
    let options = EtcdOptions::new().with_tls(tls_with(&pki.other_ca, pki, false));
    let error = EtcdElection::connect_with(&cluster.endpoints(), "wrong-ca", &options).await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("UnknownIssuer") || message.contains("certificate"), "unclear error: {message}");
    assert!(message.contains(&cluster.endpoint(0)), "the error names the endpoint: {message}");
}

#[tokio::test]
async fn a_server_name_override_is_checked_against_the_certificate() {
    let Some(cluster) = EtcdCluster::start_tls(1, false).await else { return };
    let pki = &cluster.tls.as_ref().unwrap().pki;
    // The certificate names localhost and 127.0.0.1.
    let right = EtcdOptions::new().with_tls(tls_with(&pki.ca, pki, false).with_server_name("localhost"));
    EtcdElection::connect_with(&cluster.endpoints(), "name", &right).await.expect("localhost is named");
    let wrong = EtcdOptions::new().with_tls(tls_with(&pki.ca, pki, false).with_server_name("etcd.example.org"));
    let error = EtcdElection::connect_with(&cluster.endpoints(), "name", &wrong).await.unwrap_err();
    assert!(error.to_string().contains("not valid for name"), "unclear error: {error}");
}

#[tokio::test]
async fn a_client_without_certificate_is_refused_when_the_server_demands_one() {
    let Some(cluster) = EtcdCluster::start_tls(1, true).await else { return };
    let pki = &cluster.tls.as_ref().unwrap().pki;
    let options = EtcdOptions::new().with_tls(tls_with(&pki.ca, pki, false));
    let error = EtcdElection::connect_with(&cluster.endpoints(), "no-cert", &options).await.unwrap_err();
    assert!(matches!(error, EtcdError::Rpc { .. } | EtcdError::Timeout(_)), "{error:?}");
    // A plain-text client gets nowhere either.
    let plain = EtcdElection::connect(&cluster.endpoints(), "plain").await;
    assert!(plain.is_err(), "a plain-text client reached a TLS-only server");
}

#[test]
fn tls_settings_that_are_not_pem_are_refused_before_connecting() {
    assert!(matches!(EtcdTls::new(b"-----BEGIN NOTHING-----".to_vec()), Err(EtcdError::Tls(_))));
    let dir = std::env::temp_dir().join(format!("tenure-etcd-pem-{}", std::process::id()));
    let pki = certs::TestPki::generate(&dir);
    let ca = EtcdTls::new(certs::read(&pki.ca)).unwrap();
    // A certificate given as the key: no private key in it.
    let swapped = ca.with_client_identity(certs::read(&pki.client_cert), certs::read(&pki.client_cert));
    assert!(matches!(swapped, Err(EtcdError::Tls(ref m)) if m.contains("private key")), "{swapped:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Enables etcd's authentication, with the user `tenure` allowed the elections `secure*`.
fn enable_auth(cluster: &EtcdCluster) {
    cluster.enable_auth("tenure", "s3cret", "secure");
}

#[tokio::test]
async fn an_etcd_user_campaigns_with_its_password_and_a_wrong_one_is_refused() {
    let Some(cluster) = EtcdCluster::start_tls(1, false).await else { return };
    enable_auth(&cluster);
    let pki = &cluster.tls.as_ref().unwrap().pki;
    let tls = tls_with(&pki.ca, pki, false);

    let wrong = EtcdOptions::new().with_tls(tls.clone()).with_user("tenure", "guess");
    let error = EtcdElection::connect_with(&cluster.endpoints(), "secure-a", &wrong).await.unwrap_err();
    assert!(
        matches!(&error, EtcdError::Authentication { user, message, .. }
            if user == "tenure" && message.contains("authentication failed")),
        "{error:?}"
    );
    assert!(!error.to_string().contains("guess"), "the password must not show: {error}");

    let anonymous =
        EtcdElection::connect_with(&cluster.endpoints(), "secure-a", &EtcdOptions::new().with_tls(tls.clone()))
            .await
            .unwrap_err();
    assert!(anonymous.to_string().contains("user name is empty"), "{anonymous}");

    let right = EtcdOptions::new().with_tls(tls.clone()).with_user("tenure", "s3cret");
    let election = EtcdElection::connect_with(&cluster.endpoints(), "secure-a", &right).await.unwrap();
    let a = election.campaign("a", TTL).unwrap();
    leads(&a).await;
    let b = election.campaign("b", TTL).unwrap();
    follows(&b, "a").await;
    a.resign().await.unwrap();
    leads(&b).await;

    // The role covers `secure*` only: another election is refused, and nobody leads there.
    let outside = EtcdElection::connect_with(&cluster.endpoints(), "other", &right).await.unwrap_err();
    assert!(outside.to_string().contains("permission denied"), "{outside}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_expired_token_is_replaced_by_authenticating_again() {
    // Tokens unused for a second expire (etcd checks every second).
    let Some(cluster) = EtcdCluster::start_tls_with(1, false, &["--auth-token-ttl", "1"]).await else { return };
    enable_auth(&cluster);
    let pki = &cluster.tls.as_ref().unwrap().pki;
    let options = EtcdOptions::new().with_tls(tls_with(&pki.ca, pki, false)).with_user("tenure", "s3cret");
    let election = EtcdElection::connect_with(&cluster.endpoints(), "secure-b", &options).await.unwrap();
    let a = election.campaign("a", TTL).unwrap();
    leads(&a).await;
    for _ in 0..2 {
        // Idle for longer than the token lives: this wait is the condition under test.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let leader = election.leader().await.expect("a read after the token expired");
        assert_eq!(leader.map(|l| l.identity).as_deref(), Some("a"));
        assert!(a.is_leader().is_some(), "the leader lost its tenure: {:?}", a.leadership());
    }
    // A new campaign (a transaction) after an idle time works too.
    a.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let b = election.campaign("b", TTL).unwrap();
    leads(&b).await;
    b.shutdown().await.unwrap();
}
