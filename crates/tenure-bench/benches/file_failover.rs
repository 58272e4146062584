//! `cargo bench -p tenure-bench --bench file_failover`
//!
//! Crash failover on the file lock with real processes. Goal: p99 <= lease + 50 ms.
//!
//! Method: three `tenure elect --election bench --id cN --lock file://<tmp>/bench.json --ttl 2s`
//! processes (lease 2 s, renew deadline 1 s, renew every 500 ms). This benchmark watches the lock
//! file through the library (`FileLock::watch`, inotify), which timestamps every version within
//! microseconds of its rename. Each round waits for a renew of the leader, pauses a random part
//! of the renew period (so that kills land at every phase of the cycle), SIGKILLs the leader and
//! measures from the leader's last successful renew (the instant the watcher saw the last
//! version that leader wrote) to the instant a record of a new holder appears. The killed
//! process is then replaced by a fresh one with a new identity (a restarted process with the
//! holder's identity would by design wait out the lease), so every kill hits a group of three.
//!
//! Settings: TENURE_BENCH_KILLS (default 20), TENURE_BIN (the binary; see `tenure_binary`).

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
const LEASE: Duration = Duration::from_secs(2);
const RENEW_PERIOD: Duration = Duration::from_millis(500);
const GOAL_EXCESS_MS: f64 = 50.0;
const CANDIDATES: usize = 3;

fn main() {
    let kills = env_usize("TENURE_BENCH_KILLS", 20);
    let binary = tenure_binary();
    let scratch = ScratchDir::new("file-failover").expect("a scratch directory");
    let mut cluster = Cluster::new(&binary, scratch.path(), "bench", TTL);
    let mut watcher = LockWatcher::start(cluster.lock_path()).expect("a watch of the lock file");
    for _ in 0..CANDIDATES {
        cluster.start_candidate();
    }
    eprintln!("file_failover: {} ({CANDIDATES} candidates, --ttl {TTL}), {kills} kills", binary.display());

    let mut rng = rand::make_rng::<SmallRng>();
    let mut after_renew = Vec::with_capacity(kills);
    let mut after_kill = Vec::with_capacity(kills);
    let mut term_errors = 0;
    let started = Instant::now();
    for round in 1..=kills {
        let Some(renew) = watcher.wait_for_renew(LEASE * 3) else {
            cluster.check_running();
            panic!("round {round}: no leader renewed within {:?}", LEASE * 3);
        };
        let leader = renew.holder.clone().expect("a renew has a holder");
        let term = renew.term;
        let mut last_renew = renew.at;
        let mut note_renew = |seen: &tenure_bench::lock_watch::Seen| {
            if seen.holder.as_deref() == Some(leader.as_str()) {
                last_renew = seen.at;
            }
        };
        let pause = rng.random_range(Duration::ZERO..RENEW_PERIOD);
        watcher.wait_for(pause, &mut note_renew, |_| false);
        cluster.check_running();

        let mut victim = cluster.remove(&leader);
        let killed_at = Instant::now();
        victim.signal(Signal::SIGKILL).expect("SIGKILL the leader");
        let new = watcher
            .wait_for(LEASE + Duration::from_secs(5), &mut note_renew, |seen| {
                seen.holder.is_some() && seen.holder.as_deref() != Some(leader.as_str())
            })
            .unwrap_or_else(|| {
                panic!("round {round}: nobody took over from {leader} within {:?}", LEASE + Duration::from_secs(5))
            });
        victim.kill_and_reap().expect("reap the killed leader");
        if new.term != term.map(|t| t + 1) {
            term_errors += 1;
        }
        let failover = new.at.duration_since(last_renew);
        after_renew.push(ms(failover));
        after_kill.push(ms(new.at.duration_since(killed_at)));
        eprintln!(
            "  kill {round:>2}: {leader} -> {}: {:.1} ms after its last renew ({:.1} ms after the kill)",
            new.holder.as_deref().unwrap_or("?"),
            ms(failover),
            ms(new.at.duration_since(killed_at)),
        );
        cluster.start_candidate();
    }
    let elapsed = started.elapsed();

    let failover = Summary::of(&after_renew).expect("at least one kill");
    let excess: Vec<f64> = after_renew.iter().map(|f| f - ms(LEASE)).collect();
    let excess = Summary::of(&excess).expect("at least one kill");
    let from_kill = Summary::of(&after_kill).expect("at least one kill");
    let mut report = Report::new("file_failover");
    report
        .distribution(
            "failover_ms",
            "failover (last renew -> new holder)",
            &failover,
            "ms",
            Some(ms(LEASE) + GOAL_EXCESS_MS),
        )
        .distribution("excess_ms", "failover - lease", &excess, "ms", Some(GOAL_EXCESS_MS))
        .distribution("kill_to_new_ms", "SIGKILL -> new holder", &from_kill, "ms", None)
        .info("term_errors", "new term != old term + 1", term_errors as f64, "")
        .extra("kills", json!(kills))
        .extra("ttl", json!(TTL))
        .extra("binary", json!(binary.display().to_string()))
        .note(format!(
            "{kills} SIGKILLs of the leader among {CANDIDATES} `tenure elect --ttl {TTL}` processes in {:.0} s",
            elapsed.as_secs_f64()
        ))
        .note("failover: from the watcher seeing the killed leader's last version to it seeing the new holder's first")
        .note("p99 is nearest-rank: with fewer than 100 kills it is the maximum");
    report.print();
}
