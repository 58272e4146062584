//! `cargo bench -p tenure-bench --bench file_handover`
//!
//! Graceful handover on the file lock with real processes. Goal: p99 <= 50 ms.
//!
//! Method: three `tenure elect --election bench --id cN --lock file://<tmp>/bench.json --ttl 2s`
//! processes; this benchmark watches the lock file through the library (`FileLock::watch`,
//! inotify). Each round waits for a renew of the leader, pauses a random part of the renew
//! period, sends SIGTERM to the leader (which releases the lock and exits 0), and measures from
//! just before `kill(2)` to the instant the watcher sees a record of a new holder; the instant
//! the release itself appears is reported too. The stopped process is replaced by a fresh one
//! with a new identity, so every handover happens in a group of three.
//!
//! Settings: TENURE_BENCH_ROUNDS (default 30), TENURE_BIN (the binary; see `tenure_binary`).

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rand::rngs::SmallRng;
use rand::RngExt;
use serde_json::json;
use tenure_bench::binary::tenure_binary;
use tenure_bench::cluster::Cluster;
use tenure_bench::lock_watch::LockWatcher;
use tenure_bench::report::Report;
use tenure_bench::scratch::ScratchDir;
use tenure_bench::stats::Summary;
use tenure_bench::{env_usize, ms};

/// `--ttl 2s`: lease 2 s, renew deadline 1 s, retry (renew period) 500 ms.
const TTL: &str = "2s";
const RENEW_PERIOD: Duration = Duration::from_millis(500);
const GOAL_MS: f64 = 50.0;
const CANDIDATES: usize = 3;
/// How long a stopped leader may take to exit.
const EXIT_LIMIT: Duration = Duration::from_secs(5);

fn main() {
    let rounds = env_usize("TENURE_BENCH_ROUNDS", 30);
    let binary = tenure_binary();
    let scratch = ScratchDir::new("file-handover").expect("a scratch directory");
    let mut cluster = Cluster::new(&binary, scratch.path(), "bench", TTL);
    let mut watcher = LockWatcher::start(cluster.lock_path()).expect("a watch of the lock file");
    for _ in 0..CANDIDATES {
        cluster.start_candidate();
    }
    eprintln!("file_handover: {} ({CANDIDATES} candidates, --ttl {TTL}), {rounds} rounds", binary.display());

    let mut rng = rand::make_rng::<SmallRng>();
    let mut handovers = Vec::with_capacity(rounds);
    let mut releases = Vec::with_capacity(rounds);
    let mut exits = Vec::with_capacity(rounds);
    let mut failed_exits = 0;
    let started = Instant::now();
    for round in 1..=rounds {
        let Some(renew) = watcher.wait_for_renew(RENEW_PERIOD * 8) else {
            cluster.check_running();
            panic!("round {round}: no leader renewed within {:?}", RENEW_PERIOD * 8);
        };
        let leader = renew.holder.clone().expect("a renew has a holder");
        watcher.wait_for(rng.random_range(Duration::ZERO..RENEW_PERIOD), |_| {}, |_| false);
        cluster.check_running();

        let mut stopping = cluster.remove(&leader);
        let mut released_at = None;
        let signalled_at = Instant::now();
        stopping.signal(Signal::SIGTERM).expect("SIGTERM the leader");
        let new = watcher
            .wait_for(
                Duration::from_secs(5),
                |seen| {
                    if seen.holder.is_none() && seen.version.is_some() && released_at.is_none() {
                        released_at = Some(seen.at);
                    }
                },
                |seen| seen.holder.is_some() && seen.holder.as_deref() != Some(leader.as_str()),
            )
            .unwrap_or_else(|| panic!("round {round}: nobody took over from {leader} within 5 s"));
        let status = stopping.wait_timeout(EXIT_LIMIT).expect("wait for the stopped leader");
        match status {
            Some(status) if status.success() => exits.push(ms(signalled_at.elapsed())),
            _ => {
                failed_exits += 1;
                eprintln!("  round {round}: {leader} exited with {status:?}; log:\n{}", stopping.log_tail(10));
            }
        }
        let handover = new.at.duration_since(signalled_at);
        handovers.push(ms(handover));
        if let Some(released_at) = released_at {
            releases.push(ms(released_at.duration_since(signalled_at)));
        }
        eprintln!(
            "  round {round:>2}: {leader} -> {}: {:.2} ms (release seen after {})",
            new.holder.as_deref().unwrap_or("?"),
            ms(handover),
            released_at.map_or("-".to_owned(), |at| format!("{:.2} ms", ms(at.duration_since(signalled_at)))),
        );
        drop(stopping);
        cluster.start_candidate();
    }
    let elapsed = started.elapsed();

    let handover = Summary::of(&handovers).expect("at least one round");
    let mut report = Report::new("file_handover");
    report.distribution("handover_ms", "SIGTERM -> new holder", &handover, "ms", Some(GOAL_MS));
    if let Some(release) = Summary::of(&releases) {
        report.distribution("release_ms", "SIGTERM -> release seen", &release, "ms", None);
    }
    if let Some(exit) = Summary::of(&exits) {
        report.info("exit_ms_p50", "SIGTERM -> exit 0 reaped p50", exit.p50, "ms");
    }
    report
        .info("failed_exits", "leaders not exiting 0", failed_exits as f64, "")
        .extra("rounds", json!(rounds))
        .extra("releases_seen", json!(releases.len()))
        .extra("ttl", json!(TTL))
        .extra("binary", json!(binary.display().to_string()))
        .note(format!("{rounds} SIGTERMs of the leader among {CANDIDATES} `tenure elect --ttl {TTL}` processes in {:.0} s", elapsed.as_secs_f64()))
        .note("from just before kill(2) to the watcher seeing the new holder's first version (inotify)")
        .note(format!("the release record was seen separately in {} of {rounds} rounds (inotify bursts may merge it with the takeover)", releases.len()))
        .note("p99 is nearest-rank: with fewer than 100 rounds it is the maximum");
    report.print();
}
