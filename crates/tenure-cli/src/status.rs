//! `tenure status`: read a lock once and say who holds it, since when, and with which term.
//!
//! Why it exists: operators need to see the state of an election without joining it, and
//! scripts need the same in JSON. It reads the record once and writes nothing.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use clap::{Args, ValueEnum};
use serde::Serialize;
use tenure::{LeaderElectionRecord, RecordLock, StoredRecord};

use crate::lock_url::LockUrl;
use crate::options::{parse_duration, ElectionOptions};
use crate::{exit, output, CliError};

/// How long one read of the store may take before the store counts as unreachable.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Arguments of `tenure status`.
#[derive(Debug, Args)]
#[command(
    about = "Show who holds an election's lock",
    long_about = "Show who holds an election's lock: the holder, its term (the fencing token, \
        counted by leaderTransitions), when it acquired and last renewed the lock, and its lease. \
        Reads the lock once and changes nothing.\n\n\
        Exit status: 0 when the lock could be read (held, free, absent or unreadable content), \
        1 when the store could not be reached.\n\n\
        With --watch, follows the election without joining it (like etcdctl elect -l): prints one \
        line (one JSON object with --output json) now and one at every change of state, leader or \
        term, until stopped by SIGINT or SIGTERM (exit status 0). File and Kubernetes locks \
        notify it of each change; etcd and ZooKeeper are read every --interval. A store that \
        cannot be reached is reported once per outage on standard error, and the watch goes on. \
        A Kubernetes multi-lock whose two objects name different holders (for a moment during a \
        handover) is printed as leader unknown."
)]
pub struct StatusArgs {
    #[command(flatten)]
    election: ElectionOptions,

    /// Output format.
    #[arg(long, short, value_name = "FORMAT", value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,

    /// Keep following the election and print each change.
    #[arg(long, short)]
    watch: bool,

    /// With --watch, how often to read the lock when the store does not notify changes (etcd,
    /// ZooKeeper), or in case a notification was missed.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    interval: Duration,
}

/// How `status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    /// Aligned lines for people.
    Text,
    /// One JSON object for scripts.
    Json,
}

/// The state of a lock as `status` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LockState {
    /// A holder is named in the record.
    Held,
    /// The record exists but names no holder (released).
    Free,
    /// There is no record: nobody ever held the lock, or it was deleted.
    Absent,
    /// The record cannot be read as a leader election record.
    Unreadable,
}

/// What `status --output json` prints; the field names follow the record's.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    election: String,
    lock: String,
    pub(crate) state: LockState,
    pub(crate) leader: Option<String>,
    pub(crate) term: Option<i64>,
    acquire_time: Option<String>,
    renew_time: Option<String>,
    lease_duration_seconds: Option<i64>,
    version: Option<String>,
    /// Why the record is unreadable.
    error: Option<String>,
    /// The record exactly as a client-go candidate would write it.
    record: Option<LeaderElectionRecord>,
}

/// Runs `tenure status`; returns the exit status.
pub async fn status(args: StatusArgs) -> Result<u8, CliError> {
    let election = args.election.election.clone();
    let url = args.election.lock_url()?;
    let cluster = args.election.cluster.options().map_err(CliError::Usage)?;
    let source = Source::open(&url, &cluster).await?;
    if args.watch {
        return crate::status_watch::watch(&source, &election, &url, args.output == OutputFormat::Json, args.interval)
            .await;
    }
    let report = source.read(&election, &url).await?;
    let text = match args.output {
        OutputFormat::Text => report.to_text(Utc::now()),
        OutputFormat::Json => serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::Failed(format!("cannot format the status: {e}")))?,
    };
    output::print_line(&text)
        .map_err(|e| CliError::Failed(format!("cannot write the status to standard output: {e}")))?;
    Ok(exit::SUCCESS)
}

/// Where `status` reads the election, opened once so that `--watch` can read it again and again
/// over the same connection.
pub enum Source {
    /// A record lock (file, Kubernetes object, memory).
    Record(Arc<dyn RecordLock>),
    /// An etcd election: the oldest candidate key leads.
    Etcd(tenure_etcd::EtcdElection),
    /// A ZooKeeper election: the lowest latch node leads.
    Zk(tenure_zk::ZkElection),
}

impl Source {
    /// Connects to (or opens) the lock of `url`; writes nothing.
    pub async fn open(url: &LockUrl, cluster: &tenure_kube::ClusterOptions) -> Result<Source, CliError> {
        Ok(match url {
            LockUrl::Zk { servers, path, .. } => {
                Source::Zk(url.zk_election(servers, path, tenure_zk::timing_of(READ_TIMEOUT)).await?)
            }
            LockUrl::Etcd { endpoints, election, .. } => Source::Etcd(url.etcd_election(endpoints, election).await?),
            _ => Source::Record(open_record_lock(url, cluster, "tenure-status").await?),
        })
    }

    /// Reads who holds the lock now, within the read timeout.
    pub async fn read(&self, election: &str, url: &LockUrl) -> Result<StatusReport, CliError> {
        let election = election.to_owned();
        match self {
            Source::Zk(zk) => {
                let leader = ask_leader(url, zk.leader()).await?.map(|l| (l.identity, l.term, l.node));
                Ok(StatusReport::native(election, url, leader))
            }
            Source::Etcd(etcd) => {
                let leader = ask_leader(url, etcd.leader()).await?.map(|l| (l.identity, l.term, l.key));
                Ok(StatusReport::native(election, url, leader))
            }
            Source::Record(lock) => {
                let stored = match tokio::time::timeout(READ_TIMEOUT, lock.get()).await {
                    Ok(Ok(stored)) => stored,
                    Ok(Err(error)) => return Err(CliError::Failed(format!("cannot read the lock {url}: {error}"))),
                    Err(_) => return Err(CliError::Failed(no_answer(url))),
                };
                Ok(StatusReport::new(election, url.to_string(), stored))
            }
        }
    }

    /// Notifications of changes, where the store pushes them (file and Kubernetes locks).
    pub fn changes(&self) -> Option<tenure::ChangeStream> {
        match self {
            Source::Record(lock) => lock.watch(),
            Source::Etcd(_) | Source::Zk(_) => None,
        }
    }
}

/// Asks the store, within the read timeout.
async fn ask_leader<T, E: std::fmt::Display>(
    url: &LockUrl,
    query: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, CliError> {
    tokio::time::timeout(READ_TIMEOUT, query)
        .await
        .map_err(|_| CliError::Failed(no_answer(url)))?
        .map_err(|e| CliError::Failed(format!("cannot read {url}: {e}")))
}

fn no_answer(url: &LockUrl) -> String {
    format!("cannot read {url}: no answer within {}", humantime::format_duration(READ_TIMEOUT))
}

/// The record lock behind `url` (file, Kubernetes, memory), named `client` to the store.
pub async fn open_record_lock(
    url: &LockUrl,
    cluster: &tenure_kube::ClusterOptions,
    client: &str,
) -> Result<Arc<dyn RecordLock>, CliError> {
    Ok(match url {
        LockUrl::Kube(reference) => url.kube_lock(reference, cluster, client).await?.record_lock(),
        _ => url.open(client)?,
    })
}

impl StatusReport {
    /// A report on a backend with its own elector: who leads, with which term, under which
    /// node or key.
    fn native(election: String, url: &LockUrl, leader: Option<(String, tenure::Term, String)>) -> Self {
        let mut report = StatusReport::new(election, url.to_string(), None);
        if let Some((identity, term, node)) = leader {
            report.state = LockState::Held;
            report.leader = Some(identity);
            report.term = i64::try_from(term.0).ok();
            report.version = Some(node);
        }
        report
    }

    fn new(election: String, lock: String, stored: Option<StoredRecord>) -> Self {
        let mut report = StatusReport {
            election,
            lock,
            state: LockState::Absent,
            leader: None,
            term: None,
            acquire_time: None,
            renew_time: None,
            lease_duration_seconds: None,
            version: None,
            error: None,
            record: None,
        };
        let Some(stored) = stored else {
            return report;
        };
        report.version = Some(stored.version.0);
        match stored.record {
            Err(error) => {
                report.state = LockState::Unreadable;
                report.error = Some(error.to_string());
            }
            Ok(record) => {
                report.state = if record.holder_identity.is_empty() { LockState::Free } else { LockState::Held };
                report.leader = Some(record.holder_identity.clone()).filter(|h| !h.is_empty());
                report.term = Some(record.leader_transitions);
                report.acquire_time = record.acquire_time.map(rfc3339);
                report.renew_time = record.renew_time.map(rfc3339);
                report.lease_duration_seconds = Some(record.lease_duration_seconds);
                report.record = Some(record);
            }
        }
        report
    }

    /// The human-readable form. `now` only serves the "ago" hints: the record's times are the
    /// writers' wall clocks, shown for people and never used to decide anything.
    fn to_text(&self, now: DateTime<Utc>) -> String {
        let mut lines = vec![format!("election:  {}", self.election), format!("lock:      {}", self.lock)];
        let record = self.record.as_ref();
        match self.state {
            LockState::Absent => {
                lines.push("state:     nobody holds it (no record yet, or it was deleted)".to_owned());
                lines.push(
                    "           deleted while held: candidates that saw the holder wait out its lease \
                     (their /status says until when); `tenure break-lock` ends the wait"
                        .to_owned(),
                );
            }
            LockState::Unreadable => {
                let why = self.error.as_deref().unwrap_or("unknown reason");
                lines.push(format!("state:     unreadable record ({why})"));
                lines.push(
                    "           candidates treat it as held by an unknown holder for one lease, then take it \
                     over; `tenure break-lock` frees it now"
                        .to_owned(),
                );
            }
            LockState::Free => lines.push("state:     free (released; nobody holds it)".to_owned()),
            LockState::Held => {
                lines.push(format!("leader:    {}", self.leader.as_deref().unwrap_or_default()));
                if let (Some(renewed), Some(lease)) = (record.and_then(|r| r.renew_time), self.lease_duration_seconds) {
                    let silent = now.signed_duration_since(renewed);
                    if silent > chrono::Duration::seconds(lease) {
                        lines.push(format!(
                            "state:     held, but not renewed for {} (lease {lease}s): the holder may be gone",
                            ago(silent)
                        ));
                    } else {
                        lines.push("state:     held".to_owned());
                    }
                } else {
                    lines.push("state:     held".to_owned());
                }
            }
        }
        if let Some(term) = self.term {
            let source = match (record.is_some(), self.lock.starts_with("etcd:")) {
                (true, _) => "leaderTransitions",
                (false, true) => "create revision of the leader's key",
                (false, false) => "creation zxid of the leader's node",
            };
            lines.push(format!("term:      {term} ({source}; the fencing token)"));
        }
        if let Some(record) = record {
            lines.push(format!("acquired:  {}", time_with_age(record.acquire_time, now)));
            lines.push(format!("renewed:   {}", time_with_age(record.renew_time, now)));
            lines.push(format!("lease:     {}s", record.lease_duration_seconds));
            lines.push(format!("record:    {}", record.to_json()));
        }
        if let Some(version) = &self.version {
            lines.push(format!("version:   {version}"));
        }
        lines.join("\n")
    }
}

fn rfc3339(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn time_with_age(time: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    match time {
        Some(time) => format!("{} ({} ago)", rfc3339(time), ago(now.signed_duration_since(time))),
        None => "-".to_owned(),
    }
}

fn ago(elapsed: chrono::Duration) -> String {
    let seconds = u64::try_from(elapsed.num_seconds()).unwrap_or(0);
    humantime::format_duration(Duration::from_secs(seconds)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure::{RecordError, Version};

    fn held(renewed_ago: i64, now: DateTime<Utc>) -> StoredRecord {
        StoredRecord {
            version: Version("7".into()),
            record: Ok(LeaderElectionRecord {
                holder_identity: "replica-a".into(),
                lease_duration_seconds: 10,
                acquire_time: Some(now - chrono::Duration::seconds(60)),
                renew_time: Some(now - chrono::Duration::seconds(renewed_ago)),
                leader_transitions: 3,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn held_lock_shows_leader_term_times_and_lease() {
        let now = Utc::now();
        let text = StatusReport::new("e".into(), "memory:".into(), Some(held(2, now))).to_text(now);
        assert!(text.contains("leader:    replica-a"), "{text}");
        assert!(text.contains("state:     held\n"), "{text}");
        assert!(text.contains("term:      3"), "{text}");
        assert!(text.contains("(1m ago)"), "{text}");
        assert!(text.contains("lease:     10s"), "{text}");
    }

    #[test]
    fn stale_lock_says_the_holder_may_be_gone() {
        let now = Utc::now();
        let text = StatusReport::new("e".into(), "memory:".into(), Some(held(30, now))).to_text(now);
        assert!(text.contains("not renewed for 30s"), "{text}");
    }

    #[test]
    fn absent_and_unreadable_records_are_explained() {
        let now = Utc::now();
        let absent = StatusReport::new("e".into(), "memory:".into(), None);
        assert!(absent.to_text(now).contains("nobody holds it"));
        let corrupt = StoredRecord { version: Version("1".into()), record: Err(RecordError::Malformed("x".into())) };
        let report = StatusReport::new("e".into(), "memory:".into(), Some(corrupt));
        assert_eq!(report.state, LockState::Unreadable);
        assert!(report.to_text(now).contains("unreadable record"));
    }

    #[test]
    fn json_uses_the_record_field_names() {
        let now = Utc::now();
        let report = StatusReport::new("e".into(), "memory:".into(), Some(held(2, now)));
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["state"], "held");
        assert_eq!(json["leader"], "replica-a");
        assert_eq!(json["term"], 3);
        assert_eq!(json["leaseDurationSeconds"], 10);
        assert_eq!(json["record"]["holderIdentity"], "replica-a");
    }
}
