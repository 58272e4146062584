//! `tenure run --probe CMD --progress-timeout D`: a leader whose command stops answering its
//! health probe gives way (invariant G1), so a replica whose command works leads.
//!
//! Why: `tenure run` renews the lock for as long as its own process is healthy, whatever its
//! command does; a command that hangs (a deadlock, a stuck connection) would keep the leadership
//! until someone kills it. The probe is a shell command run every `--probe-every` while the
//! command runs (with the command's environment, `TENURE_TERM` included); exit status 0 is a
//! proof of progress. A probe that does not finish within its interval is killed and counts as
//! failed, so a probe that hangs never holds anything up. After `--progress-timeout` without a
//! successful probe (counted from the command's start), `tenure run` stops the command as a
//! SIGUSR1 would, releases the lock and stays a candidate. An HTTP check is a probe like any
//! other (`--probe 'curl -fsS http://127.0.0.1:8080/healthz'`): one mechanism, no HTTP client
//! in tenure for it.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use tokio::time::{sleep_until, timeout, Instant};

/// The probe and its rhythm.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The shell command (`sh -c`).
    pub command: OsString,
    /// How often it runs, and how long one run may take.
    pub every: Duration,
    /// How long without a success before giving way.
    pub allowed_silence: Duration,
}

impl Probe {
    /// Completes when the probe has not succeeded for the allowed silence since `started`;
    /// never while it keeps succeeding. `environment` is the command's.
    pub async fn silence(&self, started: Instant, environment: &[(String, String)]) {
        let mut last_success = started;
        let mut next = started;
        loop {
            if Instant::now() >= last_success + self.allowed_silence {
                return;
            }
            // The next run, or the end of the silence if that comes first.
            let run_at = next.min(last_success + self.allowed_silence);
            sleep_until(run_at).await;
            if Instant::now() >= last_success + self.allowed_silence {
                return;
            }
            let began = Instant::now();
            next = began + self.every;
            if self.run_once(environment).await {
                last_success = began;
            }
        }
    }

    /// One run: true when it exits with status 0 within its interval.
    async fn run_once(&self, environment: &[(String, String)]) -> bool {
        let mut command = Command::new("/bin/sh");
        command.arg("-c").arg(&self.command).envs(environment.iter().map(|(k, v)| (k, v)));
        command.stdin(Stdio::null()).stdout(Stdio::null()).kill_on_drop(true);
        let Ok(mut child) = command.spawn() else {
            tracing::warn!("cannot start the probe");
            return false;
        };
        match timeout(self.every, child.wait()).await {
            Ok(Ok(status)) => status.success(),
            Ok(Err(error)) => {
                tracing::warn!(%error, "lost track of the probe");
                false
            }
            Err(_) => {
                tracing::warn!(every = %humantime::format_duration(self.every), "the probe did not finish within its interval; killed");
                let _ = child.kill().await;
                false
            }
        }
    }
}
