//! `tenure break-lock`: an operator's deliberate way to free a lock that nobody live holds.
//!
//! Why: candidates honour a record they cannot prove dead for a full lease: a deleted lock whose
//! record claimed a day-long lease, a corrupt record, or a holder that vanished without releasing.
//! That is the safe default, and it can stall an election for as long as the record claims. This
//! command watches the lock for a while, refuses if anything renews it, and otherwise writes a
//! released record (compare-and-swap on the version it observed), so that the candidates take
//! the lock at once with a higher term. It says exactly what it overrides.
//!
//! etcd and ZooKeeper need no such command: their servers end a dead candidate's session
//! themselves, after its TTL.

use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use tenure::{LeaderElectionRecord, RecordLock, StoredRecord};

use crate::backend::lock_failed;
use crate::options::{parse_duration, ElectionOptions};
use crate::{error::CliError, exit, output};

/// The longest a held record is watched by default before it is judged stale.
const MAX_DEFAULT_OBSERVE: Duration = Duration::from_secs(60);
/// How long a record that names no live holder (absent, corrupt) is watched by default: longer
/// than client-go's longest jittered retry (4.4 s), so a foreign writer renewing it is seen.
const UNHELD_OBSERVE: Duration = Duration::from_secs(10);
/// How often the lock is read while it is watched, when it cannot notify changes.
const POLL: Duration = Duration::from_millis(250);

/// Arguments of `tenure break-lock`.
#[derive(Debug, Args)]
#[command(
    about = "Free a lock that no live holder renews (a stale, deleted or corrupt record)",
    long_about = "Free a lock that no live holder renews: a holder that vanished without \
        releasing, a lock deleted while its record claimed a long lease, or a corrupt record. \
        Candidates otherwise wait out the lease such a record claims (up to a day).\n\n\
        Watches the lock for --observe and refuses (exit 1) if it changes meanwhile: a live holder \
        is renewing it. Otherwise writes a released record (compare-and-swap on the version it \
        watched; the term is kept, so the next leader's term is higher) and prints what it \
        overrode. Candidates watching the lock take it at once.\n\n\
        Only record locks (file, Kubernetes, memory): etcd and ZooKeeper end a dead candidate's \
        session themselves. A holder that is only paused (SIGSTOP, a frozen VM) longer than \
        --observe still believes it leads until its renew deadline when it resumes: fence its \
        writes with the term.",
    after_help = "Example:  tenure break-lock --election nightly-backup --observe 30s"
)]
pub struct BreakLockArgs {
    #[command(flatten)]
    election: ElectionOptions,

    /// How long the lock must stay unchanged before it is broken. [default: the record's lease,
    /// at most 60s; 10s for a lock that is absent, free or unreadable]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    observe: Option<Duration>,
}

/// Runs `tenure break-lock`; returns the exit status.
pub async fn break_lock(args: BreakLockArgs) -> Result<u8, CliError> {
    let url = args.election.lock_url()?;
    let Some(store) = url.record_store() else { return Err(CliError::NothingToBreak { lock: url.to_string() }) };
    let cluster = args.election.cluster.options()?;
    let lock = store.open("tenure-break-lock", &cluster).await?;
    let shown = url.to_string();
    let before = lock.get().await.map_err(lock_failed("read the lock", &shown))?;
    let what = describe(before.as_ref());
    if matches!(&before, Some(StoredRecord { record: Ok(r), .. }) if r.holder_identity.is_empty()) {
        output::say(&format!("{url}: {what}; nothing to break"));
        return Ok(exit::SUCCESS);
    }
    let observe = args.observe.unwrap_or_else(|| default_observe(before.as_ref()));
    output::say(&format!("{url}: {what}"));
    output::say(&format!("watching it for {} to make sure nobody renews it ...", humantime::format_duration(observe)));
    if let Some(changed) = changed_within(lock.as_ref(), before.as_ref(), observe).await? {
        return Err(CliError::Renewed { now: describe(changed.as_ref()) });
    }
    let term = before.as_ref().and_then(|stored| stored.record.as_ref().ok()).map_or(0, |r| r.leader_transitions);
    let now = chrono::Utc::now();
    let released = LeaderElectionRecord {
        holder_identity: String::new(),
        lease_duration_seconds: 1,
        acquire_time: Some(now),
        renew_time: Some(now),
        leader_transitions: term,
        ..Default::default()
    };
    let written = match &before {
        Some(stored) => lock.update(&stored.version, &released).await,
        None => lock.create(&released).await,
    };
    match written {
        Ok(_) => {
            output::say(&format!("broke the lock: overrode {what}; candidates may take it now (term above {term})"));
            Ok(exit::SUCCESS)
        }
        Err(error) if error.is_conflict() => Err(CliError::ChangedBeforeWrite),
        Err(error) => Err(lock_failed("write the lock", &shown)(error)),
    }
}

/// The stored state in words, saying whose record is overridden.
fn describe(stored: Option<&StoredRecord>) -> String {
    match stored {
        None => "no lock object (deleted, or never created)".to_owned(),
        Some(StoredRecord { record: Err(error), version }) => {
            format!("unreadable record at version {} ({error})", version.0)
        }
        Some(StoredRecord { record: Ok(r), .. }) if r.holder_identity.is_empty() => "free (released)".to_owned(),
        Some(StoredRecord { record: Ok(r), version }) => format!(
            "held by {:?} with term {} and a {}s lease, last renewed {} (version {})",
            r.holder_identity,
            r.leader_transitions,
            r.lease_duration_seconds,
            r.renew_time.map_or_else(|| "at an unknown time".to_owned(), |t| t.to_rfc3339()),
            version.0
        ),
    }
}

fn default_observe(stored: Option<&StoredRecord>) -> Duration {
    match stored {
        Some(StoredRecord { record: Ok(r), .. }) if !r.holder_identity.is_empty() => {
            Duration::from_secs(u64::try_from(r.lease_duration_seconds).unwrap_or(0))
                .clamp(UNHELD_OBSERVE, MAX_DEFAULT_OBSERVE)
        }
        _ => UNHELD_OBSERVE,
    }
}

/// Watches the lock for `observe` (through its change notifications, and by reading it every
/// [`POLL`]); the new state if it differs from `before`.
async fn changed_within(
    lock: &dyn RecordLock,
    before: Option<&StoredRecord>,
    observe: Duration,
) -> Result<Option<Option<StoredRecord>>, CliError> {
    let version_of = |stored: Option<&StoredRecord>| stored.map(|s| s.version.clone());
    let initial = version_of(before);
    let mut changes = lock.watch();
    let deadline = tokio::time::Instant::now() + observe;
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        let wake = (now + POLL).min(deadline);
        let notified = async {
            match changes.as_mut() {
                Some(stream) => stream.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            change = notified => match change {
                Some(Ok(stored)) if version_of(stored.as_ref()) != initial => return Ok(Some(stored)),
                Some(Ok(_)) => {}
                // A broken notification stream: keep reading instead.
                Some(Err(_)) | None => changes = None,
            },
            _ = tokio::time::sleep_until(wake) => {
                let stored = lock.get().await.map_err(|e| CliError::Lock { what: "read the lock", lock: None, source: e.into() })?;
                if version_of(stored.as_ref()) != initial {
                    return Ok(Some(stored));
                }
            }
        }
    }
    Ok(None)
}
