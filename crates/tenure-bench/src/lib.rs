//! What the benchmarks of Tenure share: statistics, the report format (a table for people and a
//! one-line JSON summary for the README), readings of `/proc` (with where a process's memory
//! is), guards that stop child processes and remove scratch directories even when a benchmark
//! panics, the location of the `tenure` binary, a watcher that timestamps every write to a file
//! lock, and a client of the in-process Kubernetes API server.
//!
//! Why a library: the four benchmarks (`cargo bench -p tenure-bench`) measure different things
//! but must report them alike and clean up alike; each `benches/*.rs` file only holds its method.

pub mod binary;
pub mod cluster;
pub mod http_get;
pub mod kube_client;
pub mod lock_watch;
pub mod process;
pub mod procfs;
pub mod report;
pub mod scratch;
pub mod smaps;
pub mod stats;

use std::time::Duration;

/// Reads a positive integer setting from the environment (`name`), or `default`.
///
/// Why: the benchmarks are sized to fit a shared 2-core machine (rounds, window lengths); a
/// developer with time to spare can ask for more samples without editing code.
pub fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(value) if value > 0 => value,
            _ => panic!("{name}={text:?} is not a positive integer"),
        },
        Err(_) => default,
    }
}

/// Reads a duration setting in whole seconds from the environment (`name`), or `default`.
pub fn env_seconds(name: &str, default: Duration) -> Duration {
    std::env::var(name).map_or(default, |_| Duration::from_secs(env_usize(name, 1) as u64))
}

/// Milliseconds as a float, the unit every latency is reported in.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
