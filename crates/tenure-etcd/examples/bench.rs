//! Benchmark of the etcd elector against a real etcd it starts on loopback: prints numbers, asserts
//! nothing.
//!
//! - crash failover: a leader in a child process is killed with SIGKILL; time until a follower
//!   leads, as a ratio of the TTL;
//! - handover after resign: time from a leader's resign until the next candidate leads
//!   (p50 / p99 / max);
//! - steady state: requests per second each candidate sends while nothing changes.
//!
//! Run: `cargo run --release -p tenure-etcd --example bench`.

use std::process::Stdio;
use std::time::Duration;

use tenure::Elector;
use tenure_etcd::EtcdElection;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Child mode: campaign and say when leading, until killed.
async fn child(endpoints: String) -> Result<(), Box<dyn std::error::Error>> {
    let endpoints: Vec<String> = endpoints.split(',').map(String::from).collect();
    let election = EtcdElection::connect(&endpoints, "bench-crash").await?;
    let elector = election.campaign("child", TTL)?;
    let _tenure = elector.acquired().await?;
    println!("LEADING");
    std::future::pending::<()>().await;
    Ok(())
}

async fn crash_failover(endpoints: &[String], rounds: usize) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    let mut results = Vec::new();
    for _ in 0..rounds {
        let mut leader = tokio::process::Command::new(std::env::current_exe()?)
            .env("TENURE_ETCD_BENCH_CHILD", endpoints.join(","))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(leader.stdout.take().ok_or("no stdout")?).lines();
        while lines.next_line().await?.as_deref() != Some("LEADING") {}
        let election = EtcdElection::connect(endpoints, "bench-crash").await?;
        let follower = election.campaign("follower", TTL)?;
        let mut rx = follower.subscribe();
        rx.wait_for(|l| l.leader.as_deref() == Some("child")).await?;
        let start = Instant::now();
        leader.start_kill()?;
        follower.acquired().await?;
        results.push(start.elapsed());
        let _ = leader.wait().await;
        follower.shutdown().await?;
    }
    Ok(results)
}

async fn handovers(electors: &[Elector], rounds: usize) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    let mut results = Vec::new();
    for _ in 0..rounds {
        let leader = loop {
            if let Some(i) = electors.iter().position(|e| e.is_leader().is_some()) {
                break i;
            }
            let waits = electors.iter().map(|e| Box::pin(e.acquired()));
            let _ = futures::future::select_all(waits).await;
        };
        let start = Instant::now();
        electors[leader].resign().await?;
        let others = electors.iter().enumerate().filter(|(i, _)| *i != leader).map(|(_, e)| Box::pin(e.acquired()));
        let (tenure, _, _) = futures::future::select_all(others).await;
        results.push(start.elapsed());
        drop(tenure);
    }
    Ok(results)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(endpoints) = std::env::var("TENURE_ETCD_BENCH_CHILD") {
        return child(endpoints).await;
    }
    let cluster = tenure_testkit::etcd::EtcdCluster::start(1).await.ok_or("etcd is not installed")?;
    let endpoints = cluster.endpoints();
    println!("etcd on {}, TTL {:?}", endpoints.join(","), TTL);

    let mut crash = crash_failover(&endpoints, 5).await?;
    crash.sort();
    let ratios: Vec<String> = crash.iter().map(|d| format!("{:.2}", d.as_secs_f64() / TTL.as_secs_f64())).collect();
    println!(
        "crash failover (SIGKILL of the leader): x TTL = [{}], max {:?}",
        ratios.join(", "),
        crash[crash.len() - 1]
    );

    let mut elections = Vec::new();
    let mut electors = Vec::new();
    for name in ["a", "b", "c"] {
        let election = EtcdElection::connect(&endpoints, "bench-handover").await?;
        electors.push(election.campaign(name, TTL)?);
        elections.push(election);
    }
    let mut handover = handovers(&electors, 200).await?;
    handover.sort();
    println!(
        "handover after resign (200 rounds, 3 candidates): p50 {:?}, p99 {:?}, max {:?}",
        percentile(&handover, 0.5),
        percentile(&handover, 0.99),
        handover[handover.len() - 1]
    );

    let window = Duration::from_secs(10);
    // Let the last resigned candidate finish queueing again before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before: Vec<u64> = elections.iter().map(EtcdElection::requests_sent).collect();
    tokio::time::sleep(window).await;
    let rates: Vec<String> = elections
        .iter()
        .zip(before)
        .zip(&electors)
        .map(|((e, b), el)| {
            let role = if el.is_leader().is_some() { "leader" } else { "follower" };
            format!("{} ({role}) {:.2}/s", el.identity(), (e.requests_sent() - b) as f64 / window.as_secs_f64())
        })
        .collect();
    println!("steady state requests per candidate over {window:?}: {}", rates.join(", "));
    println!(
        "  = one keep-alive per TTL/4; a TTL of 10 s costs {:.2} requests/s per candidate; watches are push-only",
        4.0 / 10.0
    );
    for elector in electors {
        elector.shutdown().await?;
    }
    Ok(())
}
