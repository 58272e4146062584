//! The Active/Active throughput benchmark: Pods handled per second by one replica and by three,
//! when every call to the pool takes a fixed delay (a slow external IPAM, as Neutron is for Kuryr),
//! so that a Pod's handling is dominated by its external store calls.
//!
//! Why a program and not a test: it prints numbers (per round, then medians and the ratio); a
//! timed assertion on a shared machine would be flaky. Each round starts its own etcd and API
//! server, starts the replicas, waits (polling the partition table, bounded) until the group has
//! settled, then creates the Pods at once and times until every one is annotated (allocations),
//! then deletes them all and times until the pool is empty (releases).

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::Api;
use tenure_apiserver::{ApiServer, ApiServerConfig};
use tenure_etcd::{EtcdElection, EtcdGroupStore};
use tenure_testkit::etcd::{EtcdCluster, EtcdConfig};
use tokio::time::Instant;

use crate::active_active::{GROUP, WATCHING_LINE};
use crate::checker::active_active::settle;
use crate::checker::{create_pod, kube_client, CheckerError, Harness, Scenario, SAMPLE_EVERY};
use crate::controller::{annotated_ip, ELECTION, POOL_PREFIX};
use crate::pool::IpPool;

/// The longest a round may take to handle its Pods.
const ROUND_BOUND: Duration = Duration::from_secs(300);
/// How many Pods the benchmark creates or deletes at once.
const PARALLEL_REQUESTS: usize = 8;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The controller binary.
    pub controller: PathBuf,
    /// Replica counts to compare (e.g. 1 and 3).
    pub replicas: Vec<usize>,
    /// Pods per round.
    pub pods: usize,
    /// Rounds per replica count.
    pub rounds: usize,
    /// The delay before every pool call.
    pub pool_delay: Duration,
}

/// One round's result.
#[derive(Debug, Clone, Copy)]
pub struct Round {
    /// How many replicas ran.
    pub replicas: usize,
    /// Pods given an address per second.
    pub allocations_per_second: f64,
    /// Deleted Pods whose address was released, per second.
    pub releases_per_second: f64,
    /// The share of the Pods the busiest replica allocated for (from the witness files): the
    /// hash spreads Pods over partitions unevenly, so the best possible ratio is 1 / this share
    /// rather than the replica count.
    pub busiest_share: f64,
}

/// Runs every round, printing each as it ends; returns them all.
pub async fn run(config: &BenchConfig) -> Result<Vec<Round>, CheckerError> {
    let mut rounds = Vec::new();
    for &replicas in &config.replicas {
        for round in 0..config.rounds {
            let result = one_round(config, replicas).await?;
            println!(
                "replicas {replicas} round {}: {:.1} allocations/s, {:.1} releases/s; busiest replica allocated {:.1} % of the Pods",
                round + 1,
                result.allocations_per_second,
                result.releases_per_second,
                result.busiest_share * 100.0
            );
            rounds.push(result);
        }
    }
    Ok(rounds)
}

/// The median of the rounds of `replicas`: (allocations/s, releases/s).
pub fn medians(rounds: &[Round], replicas: usize) -> Option<(f64, f64)> {
    let median = |mut values: Vec<f64>| -> Option<f64> {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(values[n / 2]),
            _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
        }
    };
    let of = rounds.iter().filter(|r| r.replicas == replicas);
    Some((
        median(of.clone().map(|r| r.allocations_per_second).collect())?,
        median(of.map(|r| r.releases_per_second).collect())?,
    ))
}

async fn one_round(config: &BenchConfig, replicas: usize) -> Result<Round, CheckerError> {
    let etcd = EtcdCluster::start_with(EtcdConfig::new(1)).await.map_err(CheckerError::EtcdServer)?;
    let apiserver = ApiServer::start(ApiServerConfig::default())
        .await
        .map_err(|e| CheckerError::Kube(format!("apiserver: {e}")))?;
    let pods: Api<Pod> = Api::namespaced(kube_client(&apiserver.url())?, "default");
    let pool = IpPool::new(
        EtcdElection::connect(&[etcd.endpoint(0)], ELECTION).await?,
        POOL_PREFIX,
        std::net::Ipv4Addr::new(10, 0, 0, 0),
        1000,
    );
    let logs = std::env::temp_dir().join(format!("tenure-ipam-bench-{}-{}", std::process::id(), etcd.endpoint(0)));
    std::fs::create_dir_all(&logs).map_err(|e| CheckerError::Process(format!("{}: {e}", logs.display())))?;
    let scenario = Scenario {
        pool_delay: config.pool_delay,
        // No periodic pass during the measurement: only the Pods' own events are handled.
        gc_period: Duration::from_secs(600),
        ..Scenario::active_active(config.controller.clone(), 0)
    };
    let mut harness = Harness::new(logs.clone(), scenario, etcd.endpoint(0), apiserver.url());
    for _ in 0..replicas {
        harness.spawn()?;
    }
    let store = EtcdGroupStore::connect(&[etcd.endpoint(0)], GROUP).await?;
    settle(&store, &mut harness, &[], "the start").await?;
    let identities: Vec<String> = harness.replicas.iter().map(|r| r.identity.clone()).collect();
    wait_until(
        Instant::now(),
        "every replica watching",
        || async {
            Some(identities.iter().filter(|id| log_contains(&logs.join(format!("{id}.log")), WATCHING_LINE)).count())
        },
        replicas,
    )
    .await?;

    let names: Vec<String> = (0..config.pods).map(|i| format!("bench-{i}")).collect();
    let started = Instant::now();
    let created: Vec<Result<Pod, CheckerError>> = futures::stream::iter(&names)
        .map(|name| create_pod(&pods, name, false))
        .buffer_unordered(PARALLEL_REQUESTS)
        .collect()
        .await;
    created.into_iter().collect::<Result<Vec<_>, _>>()?;
    wait_until(
        started,
        "every Pod annotated",
        || async {
            let listed = pods.list(&ListParams::default()).await.ok()?;
            Some(
                listed
                    .items
                    .iter()
                    .filter(|pod| pod.metadata.annotations.as_ref().and_then(annotated_ip).is_some())
                    .count(),
            )
        },
        config.pods,
    )
    .await?;
    let allocated = started.elapsed();

    let started = Instant::now();
    let deleted: Vec<Result<(), CheckerError>> = futures::stream::iter(&names)
        .map(|name| {
            let pods = &pods;
            async move {
                pods.delete(name, &DeleteParams::default())
                    .await
                    .map(|_| ())
                    .map_err(|e| CheckerError::Kube(format!("delete {name}: {e}")))
            }
        })
        .buffer_unordered(PARALLEL_REQUESTS)
        .collect()
        .await;
    deleted.into_iter().collect::<Result<Vec<_>, _>>()?;
    wait_until(
        started,
        "every address released",
        || async { Some(config.pods - pool.list().await.ok()?.len()) },
        config.pods,
    )
    .await?;
    let released = started.elapsed();

    harness.stop().await;
    apiserver.shutdown().await;
    drop(etcd);
    let mut allocated_by: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for handled in crate::witness::read_dir(&logs) {
        if handled.kind == "reconcile" && handled.outcome == Some(crate::witness::Outcome::Done) {
            *allocated_by.entry(handled.replica).or_default() += 1;
        }
    }
    let busiest = allocated_by.values().copied().max().unwrap_or_default();
    if std::env::var_os("TENURE_IPAM_KEEP_LOGS").is_none() {
        let _ = std::fs::remove_dir_all(&logs);
    }
    Ok(Round {
        replicas,
        allocations_per_second: config.pods as f64 / allocated.as_secs_f64(),
        releases_per_second: config.pods as f64 / released.as_secs_f64(),
        busiest_share: busiest as f64 / config.pods as f64,
    })
}

fn log_contains(path: &std::path::Path, needle: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| text.contains(needle))
}

/// Polls `count` until it reaches `target`, bounded by [`ROUND_BOUND`] from `started`.
async fn wait_until<F, Fut>(started: Instant, what: &str, count: F, target: usize) -> Result<(), CheckerError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<usize>>,
{
    loop {
        if count().await.is_some_and(|n| n >= target) {
            return Ok(());
        }
        if started.elapsed() >= ROUND_BOUND {
            return Err(CheckerError::Process(format!("{what}: not within {ROUND_BOUND:?}")));
        }
        tokio::time::sleep(SAMPLE_EVERY / 2).await;
    }
}
