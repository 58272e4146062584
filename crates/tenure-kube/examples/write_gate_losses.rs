//! `cargo run --release -p tenure-kube --example write_gate_losses`
//!
//! The write gate under repeated loss of leadership, against `tenure-apiserver` on loopback: a
//! writer task writes a ConfigMap through a gated client as fast as it can, while the leader's
//! own lock client is cut off from the server (a partition) until the leader fences itself, and
//! then healed until it leads again. Each loss: the server's count of the writer's writes is read
//! when the tenure ends (plus 20 ms for a request already on the wire to land), and again after
//! the writer has kept trying for 300 ms more; every write that reaches the server in between
//! counts. TENURE_LOSSES loss events (default 100); lease 1 s. Goal: 0 writes after loss.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use tenure::{Elector, Timing};
use tenure_apiserver::{ApiServer, ApiServerConfig, Verb};
use tenure_kube::{KubeLock, KubeLockRef, LockKind, WriteGate};

fn client(server: &ApiServer, agent: &str) -> kube::Client {
    let mut config = kube::Config::new(server.url().parse().expect("a URL"));
    config.headers.push((http::header::USER_AGENT, agent.parse().expect("a header value")));
    config.default_retry = false;
    kube::Client::try_from(config).expect("a client")
}

fn writes(server: &ApiServer, agent: &str) -> u64 {
    [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete].iter().map(|v| server.faults().request_count(agent, *v)).sum()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let losses: usize = std::env::var("TENURE_LOSSES").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let server = ApiServer::start(ApiServerConfig::default()).await.expect("the API server starts");
    let timing = Timing::new(Duration::from_secs(1), Duration::from_millis(600), Duration::from_millis(200)).unwrap();
    let reference = KubeLockRef { namespace: "default".into(), kind: LockKind::Leases, name: "gated".into() };
    let lock = KubeLock::new(client(&server, "lock-a"), &reference, "a");
    let elector = Elector::builder("a", lock.record_lock()).timing(timing).spawn().expect("an elector");
    let gated = WriteGate::leader(&elector).client(client(&server, "writer-a"));
    let configmaps: Api<ConfigMap> = Api::namespaced(gated, "default");

    // The writer: replace-or-create one ConfigMap, as fast as the gate and the server allow.
    let attempts = Arc::new(AtomicU64::new(0));
    let writer = {
        let (configmaps, attempts) = (configmaps.clone(), attempts.clone());
        tokio::spawn(async move {
            let mut object = ConfigMap::default();
            object.metadata.name = Some("written".into());
            loop {
                attempts.fetch_add(1, Ordering::Relaxed);
                if configmaps.create(&PostParams::default(), &object).await.is_ok() {
                    let _ = configmaps.delete("written", &Default::default()).await;
                }
                tokio::task::yield_now().await;
            }
        })
    };

    let mut after_loss = Vec::new();
    let mut written_while_leading = 0;
    for _ in 0..losses {
        let tenure = tokio::time::timeout(Duration::from_secs(30), elector.acquired()).await.expect("leads").unwrap();
        let before = writes(&server, "writer-a");
        tokio::time::sleep(Duration::from_millis(100)).await; // some writes while leading
        server.faults().partition("lock-a");
        tenure.ended().await;
        drop(tenure);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let at_loss = writes(&server, "writer-a");
        written_while_leading += at_loss - before;
        let tries = attempts.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(attempts.load(Ordering::Relaxed) > tries, "the writer kept trying");
        after_loss.push(writes(&server, "writer-a") - at_loss);
        server.faults().heal("lock-a");
    }
    writer.abort();
    let total: u64 = after_loss.iter().sum();
    println!("loss events: {losses}");
    println!("writes that reached the server while leading: {written_while_leading}");
    println!("writes that reached the server after a loss: {total} (goal 0)");
    println!("{{\"bench\":\"write_gate_losses\",\"losses\":{losses},\"writes_while_leading\":{written_while_leading},\"writes_after_loss\":{total},\"pass\":{}}}", total == 0);
    let _ = elector.shutdown().await;
}
