//! `tenure demo`: three candidates on one host, a crash and a graceful stop, measured.
//!
//! Why it exists: a newcomer should see leader election work, and how fast, before reading any
//! documentation or setting anything up. The demo re-runs this very binary as three `tenure
//! elect` processes on a file lock in a fresh temporary directory, watches the lock through the
//! library to time every change of holder precisely, and asks each process over HTTP who leads.

use std::fmt::Write as _;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::Signal;
use tenure::RecordLock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::watch;
use tokio::time::{timeout, Instant};

use crate::backend::file::FileBackend;
use crate::backend::LockUrl;
use crate::child::{describe_status, SupervisedChild};
use crate::signals::{Termination, TerminationSignals};
use crate::{error::CliError, exit, output};

/// The `--ttl` of the demo's candidates: lease 2 s, renew deadline 1 s, retry 500 ms.
const TTL: &str = "2s";
/// The lease that [`TTL`] gives, for the explanations.
const LEASE: Duration = Duration::from_secs(2);
/// How long after a renew the demo crashes the leader: half the renew interval.
const MID_RENEW: Duration = Duration::from_millis(250);
/// How often the demo reads the lock to time changes of holder.
const OBSERVE_EVERY: Duration = Duration::from_millis(5);
/// The names of the three candidates.
const REPLICAS: [&str; 3] = ["replica-a", "replica-b", "replica-c"];
/// How long any single step may take before the demo gives up.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `tenure demo` (none: it needs no setup).
#[derive(Debug, Args)]
#[command(
    about = "Watch three candidates elect a leader, survive a crash and hand over (no setup)",
    long_about = "Watch three candidates elect a leader, survive a crash and hand over; no setup \
        needed.\n\n\
        Starts three `tenure elect` processes on a file lock in a fresh temporary directory with \
        --ttl 2s, shows who leads, kills the leader with SIGKILL (failover: the others wait out \
        its lease), stops the next leader with SIGTERM (handover: it releases the lock and the \
        last one takes over at once), prints the measured times, then stops everything and \
        removes the directory. Takes about five seconds. Ctrl-C stops it and cleans up."
)]
pub struct DemoArgs {}

/// Runs `tenure demo`; returns the exit status.
pub async fn demo(_args: DemoArgs) -> Result<u8, CliError> {
    let mut signals = TerminationSignals::install().map_err(CliError::io("install signal handlers"))?;
    let workspace = Workspace::create().map_err(CliError::io("create a temporary directory"))?;
    let mut replicas = Vec::new();
    let outcome = tokio::select! {
        outcome = script(&workspace, &mut replicas) => outcome,
        termination = signals.recv() => Err(Stop::Interrupted(termination)),
    };
    match &outcome {
        Err(Stop::Failed(message)) => {
            output::error_line(&format!("tenure demo: {message}"));
            for replica in &replicas {
                replica.print_log_tail();
            }
        }
        Err(Stop::Interrupted(termination)) => {
            output::say(&format!("\n{} received: stopping the replicas and cleaning up", termination.name));
        }
        Ok(()) => {}
    }
    stop_all(&mut replicas).await;
    drop(replicas);
    drop(workspace); // removes the directory
    match outcome {
        Ok(()) => Ok(exit::SUCCESS),
        Err(Stop::Interrupted(termination)) => Ok(termination.exit_status()),
        Err(Stop::Failed(_)) => Err(CliError::Ended("the demo did not complete (see above)")),
    }
}

/// Why the demo ended early.
#[derive(Debug)]
enum Stop {
    /// A step failed or timed out.
    Failed(String),
    /// Ctrl-C or another termination signal.
    Interrupted(Termination),
}

impl From<String> for Stop {
    fn from(message: String) -> Self {
        Stop::Failed(message)
    }
}

async fn script(workspace: &Workspace, replicas: &mut Vec<Replica>) -> Result<(), Stop> {
    let clock = Instant::now();
    let lock_url = FileBackend::url(workspace.lock_path());
    output::say("Tenure demo: three candidates, one leader.");
    output::say(&format!("  lock:   {lock_url}"));
    output::say(&format!("  timing: --ttl {TTL}: lease 2s, renew deadline 1s, renew every 500ms"));
    output::say("");

    let lock =
        crate::backend::file::open(&workspace.lock_path()).map_err(|e| format!("cannot open the demo's lock: {e}"))?;
    let history = observe(lock);
    for name in REPLICAS {
        let replica = Replica::start(name, &lock_url, workspace).map_err(|e| format!("cannot start {name}: {e}"))?;
        replicas.push(replica);
    }
    for replica in replicas.iter_mut() {
        replica.wait_for_http().await?;
        say(clock, &format!("started {} (pid {}, http://{})", replica.name, replica.child.pid(), replica.address()));
    }

    // 1. First election.
    let first = wait_for_holder(&history, |holder| holder.is_some(), "a first leader").await?;
    let first_leader = first.holder.clone().unwrap_or_default();
    say(clock, &format!("{first_leader} acquired the lock (term {})", first.term_text()));
    show_agreement(clock, replicas, &first_leader).await?;

    let seen_so_far = history.borrow().len();
    wait_for_change(
        &history,
        |h| h.len() > seen_so_far && h.last().is_some_and(|s| s.holder.as_deref() == Some(&first_leader)),
        "a renew",
    )
    .await?;
    say(clock, &format!("{first_leader} renewed its lease; followers count the lease from the last renew they saw"));

    // 2. Failover: the leader crashes and cannot release; the others wait out its lease.
    // Crash halfway between two renews (a pause for the show, not for synchronisation), so that
    // the summary shows the lease being counted from the last renew, not from the crash.
    tokio::time::sleep(MID_RENEW).await;
    output::say("");
    let victim = index_of(replicas, &first_leader)?;
    replicas[victim].child.signal_group(Signal::SIGKILL);
    let killed_at = Instant::now();
    say(clock, &format!("SIGKILL {first_leader}: it cannot release the lock, so the others wait out its lease"));
    let _ = replicas[victim].child.wait().await;
    replicas[victim].exited = true;
    let after_crash =
        wait_for_holder(&history, |holder| holder.is_some_and(|h| h != first_leader), "a new leader").await?;
    let second_leader = after_crash.holder.clone().unwrap_or_default();
    let last_renew = history
        .borrow()
        .iter()
        .rev()
        .find(|seen| seen.seen_at <= killed_at && seen.holder.as_deref() == Some(&first_leader))
        .map(|seen| seen.seen_at);
    let failover_from_kill = after_crash.seen_at.saturating_duration_since(killed_at);
    let failover_from_renew = last_renew.map(|renew| after_crash.seen_at.saturating_duration_since(renew));
    say(clock, &format!("{second_leader} acquired the lock (term {})", after_crash.term_text()));
    show_agreement(clock, replicas, &second_leader).await?;

    // 3. Handover: the leader is stopped gracefully and releases the lock at once.
    output::say("");
    let stopping = index_of(replicas, &second_leader)?;
    replicas[stopping].child.signal_group(Signal::SIGTERM);
    let terminated_at = Instant::now();
    say(clock, &format!("SIGTERM {second_leader}: it releases the lock on its way out"));
    let after_handover =
        wait_for_holder(&history, |holder| holder.is_some_and(|h| h != second_leader), "the next leader").await?;
    let third_leader = after_handover.holder.clone().unwrap_or_default();
    let handover = after_handover.seen_at.saturating_duration_since(terminated_at);
    say(clock, &format!("{third_leader} acquired the lock (term {})", after_handover.term_text()));
    let status = timeout(STEP_TIMEOUT, replicas[stopping].child.wait())
        .await
        .map_err(|_| format!("{second_leader} did not exit after SIGTERM"))?
        .map_err(|e| format!("cannot wait for {second_leader}: {e}"))?;
    replicas[stopping].exited = true;
    say(clock, &format!("{second_leader} {}", describe_status(status)));
    show_agreement(clock, replicas, &third_leader).await?;

    // 4. Summary.
    output::say("");
    output::say("Summary");
    output::say(&format!("  term {:<4} {first_leader:<10} first election", first.term_text()));
    let mut failover = format!(
        "  term {:<4} {second_leader:<10} failover after SIGKILL of {first_leader}: {} after the kill",
        after_crash.term_text(),
        seconds(failover_from_kill)
    );
    if let Some(from_renew) = failover_from_renew {
        let _ = write!(
            failover,
            ", {} after its last renew (lease {})",
            seconds(from_renew),
            humantime::format_duration(LEASE)
        );
    }
    output::say(&failover);
    output::say(&format!(
        "  term {:<4} {third_leader:<10} handover after SIGTERM of {second_leader}: {}",
        after_handover.term_text(),
        seconds(handover)
    ));
    output::say("");
    output::say("A crashed leader is replaced one lease after its last renew; a stopped one at once.");
    output::say("The term grows with every new tenure: it is the fencing token leaders pass to what they write.");
    Ok(())
}

fn say(clock: Instant, message: &str) {
    output::say(&format!("[{:>6.3}s] {message}", clock.elapsed().as_secs_f64()));
}

fn seconds(duration: Duration) -> String {
    format!("{:.3}s", duration.as_secs_f64())
}

fn index_of(replicas: &[Replica], name: &str) -> Result<usize, String> {
    replicas
        .iter()
        .position(|r| r.name == name)
        .ok_or_else(|| format!("the lock names '{name}', which is not one of the demo's replicas"))
}

/// Waits until every running replica answers `GET /` with `leader`, and shows the answers.
async fn show_agreement(clock: Instant, replicas: &[Replica], leader: &str) -> Result<(), String> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    let running: Vec<&Replica> = replicas.iter().filter(|r| !r.exited).collect();
    loop {
        let mut answers = Vec::new();
        for replica in &running {
            answers.push(replica.leader_over_http().await);
        }
        if answers.iter().all(|a| a.as_deref() == Ok(leader)) {
            let shown: Vec<&str> = running.iter().map(|r| r.name.as_str()).collect();
            say(clock, &format!("GET / on {}: all answer {{\"name\":\"{leader}\"}}", shown.join(", ")));
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("the replicas do not agree that {leader} leads: {answers:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One change of the lock as the demo saw it.
#[derive(Debug, Clone)]
struct Seen {
    holder: Option<String>,
    term: Option<i64>,
    seen_at: Instant,
}

impl Seen {
    fn term_text(&self) -> String {
        self.term.map_or_else(|| "?".to_owned(), |t| t.to_string())
    }
}

/// Reads the lock every few milliseconds in the background and keeps every change (each renew
/// changes the version), so that the demo can time acquisitions and find a leader's last renew.
fn observe(lock: Arc<dyn RecordLock>) -> watch::Receiver<Vec<Seen>> {
    let (history, receiver) = watch::channel(Vec::<Seen>::new());
    tokio::spawn(async move {
        let mut last_version: Option<Option<String>> = None;
        while !history.is_closed() {
            if let Ok(stored) = lock.get().await {
                let version = stored.as_ref().map(|s| s.version.0.clone());
                if last_version.as_ref() != Some(&version) {
                    let record = stored.and_then(|s| s.record.ok());
                    let seen = Seen {
                        holder: record.as_ref().map(|r| r.holder_identity.clone()).filter(|h| !h.is_empty()),
                        term: record.as_ref().map(|r| r.leader_transitions),
                        seen_at: Instant::now(),
                    };
                    history.send_modify(|h| h.push(seen));
                    last_version = Some(version);
                }
            }
            tokio::time::sleep(OBSERVE_EVERY).await;
        }
    });
    receiver
}

/// Waits until the latest state of the lock names a holder that satisfies `wanted`.
async fn wait_for_holder(
    history: &watch::Receiver<Vec<Seen>>,
    wanted: impl Fn(Option<&str>) -> bool,
    what: &str,
) -> Result<Seen, String> {
    wait_for_change(history, |h| h.last().is_some_and(|seen| wanted(seen.holder.as_deref())), what).await
}

/// Waits until the history of the lock satisfies `wanted`; returns its latest state.
async fn wait_for_change(
    history: &watch::Receiver<Vec<Seen>>,
    wanted: impl Fn(&Vec<Seen>) -> bool,
    what: &str,
) -> Result<Seen, String> {
    let mut history = history.clone();
    let found = timeout(STEP_TIMEOUT, history.wait_for(|h| wanted(h)))
        .await
        .map_err(|_| format!("no sign of {what} within {}", seconds(STEP_TIMEOUT)))?
        .map_err(|_| "the lock observer stopped".to_owned())?;
    found.last().cloned().ok_or_else(|| "the lock observer lost its history".to_owned())
}

/// One `tenure elect` process of the demo.
struct Replica {
    name: String,
    child: SupervisedChild,
    log: PathBuf,
    http: Option<String>,
    exited: bool,
}

impl Replica {
    fn start(name: &str, lock_url: &LockUrl, workspace: &Workspace) -> std::io::Result<Replica> {
        let log = workspace.path.join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log)?;
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["elect", "--election", "demo", "--id", name, "--ttl", TTL, "--http", "127.0.0.1:0"])
            .arg("--lock")
            .arg(lock_url.to_string())
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        let child = SupervisedChild::spawn(&mut command)?;
        Ok(Replica { name: name.to_owned(), child, log, http: None, exited: false })
    }

    fn address(&self) -> &str {
        self.http.as_deref().unwrap_or("?")
    }

    /// Waits until the replica logs the address its HTTP server is bound to.
    async fn wait_for_http(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if let Some(address) = bound_address(&self.log) {
                self.http = Some(address);
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("{} did not start its HTTP server", self.name));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The replica's `GET /` answer.
    async fn leader_over_http(&self) -> Result<String, String> {
        let address = self.http.as_deref().ok_or("no HTTP address")?;
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(address).await?;
            stream.write_all(b"GET / HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n").await?;
            let mut response = String::new();
            stream.read_to_string(&mut response).await?;
            Ok::<_, std::io::Error>(response)
        };
        let response = timeout(Duration::from_secs(2), exchange)
            .await
            .map_err(|_| "timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        let body = response.split("\r\n\r\n").nth(1).ok_or("no body")?;
        let answer: serde_json::Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
        answer["name"].as_str().map(str::to_owned).ok_or_else(|| format!("unexpected answer {body}"))
    }

    fn print_log_tail(&self) {
        let Ok(text) = std::fs::read_to_string(&self.log) else { return };
        let lines: Vec<&str> = text.lines().collect();
        output::error_line(&format!("--- last lines of {}'s log:", self.name));
        for line in &lines[lines.len().saturating_sub(5)..] {
            output::error_line(line);
        }
    }
}

/// The address in a replica's "serving the leader's name over HTTP" log line, if written yet.
fn bound_address(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().find_map(|line| {
        let event: serde_json::Value = serde_json::from_str(line).ok()?;
        event["message"].as_str().filter(|m| m.contains("over HTTP"))?;
        event["address"].as_str().map(str::to_owned)
    })
}

/// Stops every replica still running: SIGTERM to all at once, then SIGKILL to any still there
/// after a few seconds.
async fn stop_all(replicas: &mut [Replica]) {
    for replica in replicas.iter().filter(|r| !r.exited) {
        replica.child.signal_group(Signal::SIGTERM);
    }
    for replica in replicas.iter_mut().filter(|r| !r.exited) {
        let _ = replica.child.stop(Duration::from_secs(3), std::future::pending()).await;
        replica.exited = true;
    }
}

/// The demo's temporary directory, removed when the demo ends however it ends.
struct Workspace {
    path: PathBuf,
}

impl Workspace {
    fn create() -> std::io::Result<Workspace> {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let path = std::env::temp_dir().join(format!("tenure-demo-{}-{nanos:x}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Workspace { path })
    }

    fn lock_path(&self) -> PathBuf {
        self.path.join("demo.lock")
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.path) {
            output::error_line(&format!("tenure demo: could not remove {}: {error}", self.path.display()));
        }
    }
}
