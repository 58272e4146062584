//! Prints the numbers of issue 11 for the group layer: balance, movement, requests per member at
//! rest, and handoff times (graceful leave and crash) on the memory and the file store.
//!
//! `cargo run --release -p tenure-group --example group_bench` (`GROUP_BENCH_RUNS=<n>` handoffs per
//! store and kind, default 10).

use std::time::Duration;

use tenure::Timing;
use tenure_group::assignment::{assign, WeightedMember, DEFAULT_PARTITION_COUNT};
use tenure_group::store::GroupStore;
use tenure_group::stores::file::FileGroupStore;
use tenure_group::stores::memory::MemoryGroupStore;
use tenure_group::{Group, GroupConfig};
use tokio::time::Instant;

fn members(n: usize) -> Vec<WeightedMember> {
    let mut list: Vec<WeightedMember> =
        (0..n).map(|i| WeightedMember { identity: format!("member-{i}"), weight: 1 }).collect();
    list.sort_by(|a, b| a.identity.cmp(&b.identity));
    list
}

fn balance_and_movement() {
    let p = DEFAULT_PARTITION_COUNT;
    println!("balance and movement at {p} partitions (max/mean; partitions moved by one join / one leave; bound ceil(P/N)+1)");
    let mut worst_ratio: f64 = 0.0;
    for n in [3, 5, 10, 11, 20, 32, 50] {
        let list = members(n);
        let settled = assign(p, &list, &vec![None; p as usize]);
        let mut loads = vec![0usize; n];
        settled.iter().flatten().for_each(|m| loads[*m] += 1);
        let ratio = *loads.iter().max().unwrap_or(&0) as f64 / (p as f64 / n as f64);
        worst_ratio = worst_ratio.max(ratio);
        let mut joined = list.clone();
        joined.push(WeightedMember { identity: "zz-newcomer".into(), weight: 1 });
        let current: Vec<Option<usize>> = settled.clone();
        let after_join = assign(p, &joined, &current);
        let join_moves = settled.iter().zip(&after_join).filter(|(a, b)| a != b).count();
        let left: Vec<WeightedMember> = list[1..].to_vec();
        let current: Vec<Option<usize>> = settled.iter().map(|o| o.and_then(|m| m.checked_sub(1))).collect();
        let after_leave = assign(p, &left, &current);
        let leave_moves = current.iter().zip(&after_leave).filter(|(a, b)| a != b).count();
        println!(
            "  N={n:>2}: max/mean {ratio:.3}  join moves {join_moves:>3}  leave moves {leave_moves:>3}  bound {}",
            (p as usize).div_ceil(n) + 1
        );
    }
    for n in 3..=50 {
        let settled = assign(p, &members(n), &vec![None; p as usize]);
        let mut loads = vec![0usize; n];
        settled.iter().flatten().for_each(|m| loads[*m] += 1);
        worst_ratio = worst_ratio.max(*loads.iter().max().unwrap_or(&0) as f64 / (p as f64 / n as f64));
    }
    println!("  worst max/mean over every N in 3..=50: {worst_ratio:.3}");
}

fn timing() -> Timing {
    Timing::new(Duration::from_secs(1), Duration::from_millis(500), Duration::from_millis(100)).expect("valid")
}

fn config(partitions: u32) -> GroupConfig {
    GroupConfig { timing: timing(), partition_count: partitions, weight: 1 }
}

fn all_owned(groups: &[&Group], partitions: u32) -> bool {
    (0..partitions).all(|p| groups.iter().filter(|g| g.guard(p).is_some()).count() == 1)
}

async fn wait(groups: &[&Group], partitions: u32, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while !all_owned(groups, partitions) {
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    Some(start.elapsed())
}

fn requests_at_rest() {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("runtime");
    runtime.block_on(async {
        println!("requests per member per minute at rest (memory store, retry period 100 ms, record watch)");
        for (members, partitions) in [(3, 16), (3, 1024), (3, 4096), (10, 1024)] {
            let store = MemoryGroupStore::new();
            let groups: Vec<Group> = (0..members)
                .map(|i| {
                    let id = format!("m{i:02}");
                    Group::builder(id.clone(), store.client(id)).config(config(partitions)).join().expect("join")
                })
                .collect();
            let refs: Vec<&Group> = groups.iter().collect();
            let _ = wait(&refs, partitions, Duration::from_secs(30)).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let before = store.requests("m00");
            tokio::time::sleep(Duration::from_secs(60)).await;
            let after = store.requests("m00");
            println!(
                "  {members:>2} members, P={partitions:>4}: writes {} reads {} (the others' renews come with the watch)",
                after.writes - before.writes,
                after.reads - before.reads
            );
        }
    });
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn print_times(label: &str, mut times: Vec<Duration>) {
    if times.is_empty() {
        println!("  {label}: no sample");
        return;
    }
    times.sort();
    println!(
        "  {label}: p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms  ({} runs)",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        times.last().expect("non-empty").as_secs_f64() * 1e3,
        times.len()
    );
}

async fn handoffs<S: GroupStore, F: Fn(&str) -> S>(label: &str, new_run: impl Fn(usize) -> F, runs: usize) {
    let partitions = 256;
    let mut leaves = Vec::new();
    let mut crashes = Vec::new();
    for run in 0..runs {
        let make = new_run(run);
        let join = |id: &str| Group::builder(id, make(id)).config(config(partitions)).join().expect("join");
        let (a, b, c) = (join("a"), join("b"), join("c"));
        if wait(&[&a, &b, &c], partitions, Duration::from_secs(20)).await.is_none() {
            println!("  {label}: did not settle");
            return;
        }
        let leaving = tokio::spawn(a.leave());
        if let Some(took) = wait(&[&b, &c], partitions, Duration::from_secs(20)).await {
            leaves.push(took);
        }
        let _ = leaving.await;
        drop(c);
        if let Some(took) = wait(&[&b], partitions, Duration::from_secs(20)).await {
            crashes.push(took.saturating_sub(timing().lease_duration));
        }
        drop(b);
        // Let the dropped drivers' in-flight calls finish before the next run reuses the store.
        tokio::task::yield_now().await;
    }
    println!("{label} (256 partitions, 3 members, lease 1 s):");
    print_times("graceful leave, until the others own everything", leaves);
    print_times("crash, until the survivor owns everything, beyond the lease", crashes);
}

fn main() {
    balance_and_movement();
    requests_at_rest();
    let runs = std::env::var("GROUP_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async {
        let memory = |_run: usize| {
            let store = MemoryGroupStore::new();
            move |id: &str| store.client(id)
        };
        handoffs("memory store", memory, runs).await;
        let base = std::env::temp_dir().join(format!("tenure-group-bench-{}", std::process::id()));
        let file = |run: usize| {
            let dir = base.join(format!("run-{run}"));
            move |_: &str| FileGroupStore::open(&dir).expect("group directory")
        };
        handoffs("file store", file, runs).await;
        let _ = std::fs::remove_dir_all(&base);
    });
}
