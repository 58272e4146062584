//! `cargo bench -p tenure-bench --bench cold_standby`
//!
//! A cold standby taking over a Pod controller: how long until it has caught up with the Pods,
//! and how much it receives, when it resumes from the previous leader's checkpoint versus when it
//! lists every Pod again.
//!
//! Method: the project's in-memory API server in this process, with TENURE_BENCH_PODS Pods
//! (default 10,000; about 760 bytes each as served) in one namespace. Each round, a previous leader is
//! assumed to have processed everything up to a checkpoint (the current resourceVersion); then k
//! changes happen while nobody watches (k/2 Pods deleted, k/2 created, so the count stays); then
//! the new leader starts a `tenure_kube::ResumableWatcher` on a fresh client and is "caught up"
//! once the watcher has delivered the version of the last change. Resume starts from the
//! checkpoint; relist starts without one (what a checkpoint older than the server's event window
//! also comes to). The client reaches the server through a loopback TCP relay that counts the
//! bytes the server sends, so "bytes" is what crossed the wire (HTTP framing included).
//! k in TENURE_BENCH_MISSED (default 10,100,1000); TENURE_BENCH_ROUNDS rounds each (default 10).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::{json, Value};
use tenure_apiserver::resources::find_resource_type;
use tenure_apiserver::store::DeletePreconditions;
use tenure_apiserver::{ApiServer, ApiServerConfig, Store};
use tenure_bench::kube_client::kube_client;
use tenure_bench::report::Report;
use tenure_bench::stats::Summary;
use tenure_bench::{env_usize, ms};
use tenure_kube::resume::{ResumableWatcher, ResumeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const NAMESPACE: &str = "default";

/// A Pod about the size of a small real one.
fn pod(name: &str) -> Value {
    json!({
        "metadata": {
            "name": name,
            "labels": {"app": "web", "pod-template-hash": "5d9c7b8f6"},
            "annotations": {"example.com/allocated-ip": "10.0.0.1"},
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [{
                "name": "web",
                "image": "registry.example/web:1.2.3",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "MODE", "value": "production"}, {"name": "LOG", "value": "info"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "hostIP": "192.168.0.1",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        },
    })
}

/// Relays loopback connections to `target`, counting the bytes sent back to the client.
async fn counting_relay(target: std::net::SocketAddr, received: Arc<AtomicU64>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a relay port");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(target).await else { continue };
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
                let _ = to_server.shutdown().await;
            });
            let received = received.clone();
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 64 * 1024];
                while let Ok(n) = from_server.read(&mut buffer).await {
                    if n == 0 || to_client.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                    received.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    url
}

/// Makes `count` changes nobody watches (half deletions, half creations); returns the version of
/// the last one.
fn miss_changes(store: &Store, live: &mut std::collections::VecDeque<String>, next: &mut usize, count: usize) -> u64 {
    let pods = find_resource_type("", "v1", "pods").expect("pods");
    for i in 0..count {
        if i % 2 == 0 {
            let victim = live.pop_front().expect("a Pod to delete");
            store.delete(pods, NAMESPACE, &victim, &DeletePreconditions::default()).expect("a deletion");
        } else {
            let name = format!("pod-{next}");
            *next += 1;
            store.create(pods, NAMESPACE, pod(&name)).expect("a creation");
            live.push_back(name);
        }
    }
    store.current_resource_version()
}

/// One takeover: time until the watcher has delivered `target`, bytes received, objects received.
async fn take_over(url: &str, received: &AtomicU64, checkpoint: Option<String>, target: u64) -> (f64, f64, f64) {
    let bytes_before = received.load(Ordering::Relaxed);
    let started = Instant::now();
    let pods: Api<Pod> = Api::namespaced(kube_client(url, "new-leader"), NAMESPACE);
    let mut watcher = ResumableWatcher::new(pods, ResumeConfig::default(), checkpoint).expect("a valid config");
    let deadline = started + Duration::from_secs(120);
    loop {
        let event = tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), watcher.next_event())
            .await
            .expect("caught up in time");
        if let Err(error) = event {
            panic!("the watcher failed: {error}");
        }
        let delivered: u64 = watcher.last_delivered_version().and_then(|v| v.parse().ok()).unwrap_or(0);
        if delivered >= target {
            break;
        }
    }
    let elapsed = started.elapsed();
    let stats = watcher.stats();
    assert_eq!(stats.failed_resumes, 0, "the checkpoint stayed inside the event window");
    let bytes = received.load(Ordering::Relaxed) - bytes_before;
    (ms(elapsed), bytes as f64, (stats.objects_listed + stats.changes) as f64)
}

fn median(samples: &[f64]) -> f64 {
    Summary::of(samples).expect("samples").p50
}

async fn run(report: &mut Report) {
    let pod_count = env_usize("TENURE_BENCH_PODS", 10_000);
    let rounds = env_usize("TENURE_BENCH_ROUNDS", 10);
    let missed: Vec<usize> = std::env::var("TENURE_BENCH_MISSED")
        .unwrap_or_else(|_| "10,100,1000".into())
        .split(',')
        .map(|k| k.trim().parse().expect("TENURE_BENCH_MISSED: a comma-separated list of counts"))
        .collect();
    let config = ApiServerConfig { event_log_capacity: 100_000, ..ApiServerConfig::default() };
    let server = ApiServer::start(config).await.expect("a server");
    let store = server.store().clone();
    let pods = find_resource_type("", "v1", "pods").expect("pods");
    let mut live = std::collections::VecDeque::new();
    for i in 0..pod_count {
        let name = format!("pod-{i}");
        store.create(pods, NAMESPACE, pod(&name)).expect("a Pod");
        live.push_back(name);
    }
    let mut next = pod_count;
    let received = Arc::new(AtomicU64::new(0));
    let url = counting_relay(server.address(), received.clone()).await;

    // `rounds` takeovers after `k` missed changes each: (time, bytes, objects) per round.
    let mut takeovers = async |k: usize, resume: bool| {
        let mut samples: (Vec<f64>, Vec<f64>, Vec<f64>) = Default::default();
        for _ in 0..rounds {
            let checkpoint = resume.then(|| store.current_resource_version().to_string());
            let target = miss_changes(&store, &mut live, &mut next, k);
            samples.extend([take_over(&url, &received, checkpoint, target).await]);
        }
        samples
    };
    let relist = takeovers(2, false).await;
    let relist_time = Summary::of(&relist.0).expect("samples");
    report.distribution("relist_ms", &format!("relist of {pod_count} Pods -> caught up"), &relist_time, "ms", None);
    report.info("relist_kb", "relist: received (median)", median(&relist.1) / 1e3, "KB");
    report.info("relist_objects", "relist: objects received (median)", median(&relist.2), "objects");

    for &k in &missed {
        let samples = takeovers(k, true).await;
        let time = Summary::of(&samples.0).expect("samples");
        let (key, after) = (format!("resume_{k}"), format!("resume after {k}"));
        report.distribution(&format!("{key}_ms"), &format!("{after} missed changes -> caught up"), &time, "ms", None);
        report.info(&format!("{key}_kb"), &format!("{after}: received (median)"), median(&samples.1) / 1e3, "KB");
        let objects = format!("{after}: objects received (median)");
        report.info(&format!("{key}_objects"), &objects, median(&samples.2), "objects");
        let ratio = time.p50 / relist_time.p50;
        report.info(&format!("{key}_time_ratio"), &format!("{after} / relist, median time"), ratio, "x");
    }
    report.extra("pods", json!(pod_count));
    report.extra("rounds", json!(rounds));
    report.note(format!(
        "{pod_count} Pods of ~{:.0} bytes as listed; server, relay and watcher share one 2-worker runtime on loopback",
        median(&relist.1) / pod_count as f64
    ));
    report
        .note("caught up = the watcher has delivered the version of the last missed change; a fresh client each round");
    server.shutdown().await;
}

fn main() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let mut report = Report::new("cold_standby");
    runtime.block_on(run(&mut report));
    report.print();
}
