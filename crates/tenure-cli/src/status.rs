//! `tenure status`: read a lock once and say who holds it, since when, and with which term.
//!
//! Why it exists: operators need to see the state of an election without joining it, and
//! scripts need the same in JSON. It reads the record once and writes nothing.
//!
//! `tenure status --watch` follows an election without joining it and prints each change:
//! operators watching a rollout or a failover want to see every change of leader as it
//! happens, as `etcdctl elect -l` shows it, whatever the backend. Only changes of state, leader
//! or term are printed (a renew changes nothing anyone watches for), so the output is a history
//! of tenures.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use clap::{Args, ValueEnum};
use futures::StreamExt;
use serde::Serialize;
use tenure::{LeaderElectionRecord, StoredRecord};

use crate::backend::{lock_failed, LockUrl, Observation, StatusSource, READ_TIMEOUT};
use crate::options::{parse_duration, ElectionOptions};
use crate::signals::TerminationSignals;
use crate::{error::CliError, exit, output};

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LockState {
    /// A holder is named in the record.
    Held,
    /// The record exists but names no holder (released).
    Free,
    /// There is no record: nobody ever held the lock, or it was deleted.
    #[default]
    Absent,
    /// The record cannot be read as a leader election record.
    Unreadable,
}

/// What `status --output json` prints; the field names follow the record's.
#[derive(Debug, Default, Serialize)]
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
    /// What the term is made of, in words.
    #[serde(skip)]
    term_source: &'static str,
}

/// Runs `tenure status`; returns the exit status.
pub async fn status(args: StatusArgs) -> Result<u8, CliError> {
    let election = args.election.election.clone();
    let url = args.election.lock_url()?;
    let cluster = args.election.cluster.options()?;
    let source = url.status_source(&cluster).await?;
    if args.watch {
        let json = args.output == OutputFormat::Json;
        return watch(source.as_ref(), &election, &url, json, args.interval).await;
    }
    let report = read(source.as_ref(), &election, &url).await?;
    let text = match args.output {
        OutputFormat::Text => report.to_text(Utc::now()),
        OutputFormat::Json => serde_json::to_string_pretty(&report)?,
    };
    output::print_line(&text).map_err(CliError::io("write the status to standard output"))?;
    Ok(exit::SUCCESS)
}

/// Reads who holds the lock now, within the read timeout.
pub async fn read(source: &dyn StatusSource, election: &str, url: &LockUrl) -> Result<StatusReport, CliError> {
    let no_answer = |_| lock_failed("read", &url.to_string())(NoAnswer);
    let observation = tokio::time::timeout(READ_TIMEOUT, source.read()).await.map_err(no_answer)??;
    let mut report = StatusReport::new(election.to_owned(), url.to_string(), None);
    match observation {
        Observation::Record(stored) => report.fill(stored),
        Observation::Leader(Some((identity, term, key)), term_source) => {
            report.state = LockState::Held;
            report.leader = Some(identity);
            report.term = i64::try_from(term.0).ok();
            report.version = Some(key);
            report.term_source = term_source;
        }
        Observation::Leader(None, _) => {}
    }
    Ok(report)
}

/// A store that did not answer within [`READ_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
#[error("no answer within {}", humantime::format_duration(READ_TIMEOUT))]
struct NoAnswer;

impl StatusReport {
    fn new(election: String, lock: String, stored: Option<StoredRecord>) -> Self {
        let mut report = StatusReport { election, lock, term_source: "leaderTransitions", ..Default::default() };
        report.fill(stored);
        report
    }

    /// Fills in what a record lock's record says.
    fn fill(&mut self, stored: Option<StoredRecord>) {
        let Some(stored) = stored else { return };
        self.version = Some(stored.version.0);
        match stored.record {
            Err(error) => {
                self.state = LockState::Unreadable;
                self.error = Some(error.to_string());
            }
            Ok(record) => {
                self.state = if record.holder_identity.is_empty() { LockState::Free } else { LockState::Held };
                self.leader = Some(record.holder_identity.clone()).filter(|h| !h.is_empty());
                self.term = Some(record.leader_transitions);
                self.acquire_time = record.acquire_time.map(rfc3339);
                self.renew_time = record.renew_time.map(rfc3339);
                self.lease_duration_seconds = Some(record.lease_duration_seconds);
                self.record = Some(record);
            }
        }
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
                let renewed = record.and_then(|r| r.renew_time).zip(self.lease_duration_seconds);
                match renewed.map(|(renewed, lease)| (now.signed_duration_since(renewed), lease)) {
                    Some((silent, lease)) if silent > chrono::Duration::seconds(lease) => lines.push(format!(
                        "state:     held, but not renewed for {} (lease {lease}s): the holder may be gone",
                        ago(silent)
                    )),
                    _ => lines.push("state:     held".to_owned()),
                }
            }
        }
        if let Some(term) = self.term {
            lines.push(format!("term:      {term} ({}; the fencing token)", self.term_source));
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

/// What a change is made of: the lock's state, its holder and the holder's term.
type Observed = (LockState, Option<String>, Option<i64>);

/// Follows `source` until a termination signal; prints the first state and every change.
pub async fn watch(
    source: &dyn StatusSource,
    election: &str,
    url: &LockUrl,
    json: bool,
    interval: Duration,
) -> Result<u8, CliError> {
    let mut signals = TerminationSignals::install().map_err(CliError::io("install signal handlers"))?;
    let mut changes = source.changes();
    let mut last: Option<Observed> = None;
    let mut unreachable = false;
    loop {
        match read(source, election, url).await {
            Ok(mut report) => {
                // A Kubernetes multi-lock whose two objects name different holders (for a moment
                // during a handover) holds client-go's placeholder, which names nobody: printed
                // as unknown, as the HTTP API answers it.
                report.leader = crate::http::known_leader(report.leader);
                if unreachable {
                    output::error_line(&format!("tenure: {url} can be read again"));
                    unreachable = false;
                }
                let observed = (report.state, report.leader.clone(), report.term);
                if last.as_ref() != Some(&observed) {
                    print(&report, json)?;
                    last = Some(observed);
                }
            }
            Err(error) => {
                if !unreachable {
                    output::error_line(&format!("tenure: {error}; still watching"));
                    unreachable = true;
                }
            }
        }
        let changed = async {
            let Some(stream) = changes.as_mut() else { return std::future::pending().await };
            if stream.next().await.is_none() {
                // The notifications ended: read every interval from now on.
                changes = None;
            }
        };
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(interval) => {}
            _ = signals.recv() => return Ok(exit::SUCCESS),
        }
    }
}

/// One line per change: the instant it was seen, then who holds the lock.
fn print(report: &StatusReport, json: bool) -> Result<(), CliError> {
    let line = if json {
        serde_json::to_string(report)?
    } else {
        let seen = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
        match (&report.leader, report.term) {
            (Some(leader), Some(term)) => format!("{seen}  leader {leader}  term {term}"),
            (Some(leader), None) => format!("{seen}  leader {leader}"),
            (None, _) if report.state == LockState::Held => format!("{seen}  leader unknown"),
            (None, _) => format!("{seen}  no leader ({})", describe(report.state)),
        }
    };
    output::print_line(&line).map_err(CliError::io("write to standard output"))
}

fn describe(state: LockState) -> &'static str {
    match state {
        LockState::Held => "held",
        LockState::Free => "released",
        LockState::Absent => "no lock",
        LockState::Unreadable => "unreadable record",
    }
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
