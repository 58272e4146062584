//! `tenure status --watch`: follow an election without joining it and print each change.
//!
//! Why: operators watching a rollout or a failover want to see every change of leader as it
//! happens, as `etcdctl elect -l` shows it, whatever the backend. Only changes of state, leader
//! or term are printed (a renew changes nothing anyone watches for), so the output is a history
//! of tenures.

use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use futures::StreamExt;

use crate::backend::{LockUrl, StatusSource};
use crate::signals::TerminationSignals;
use crate::status::{LockState, StatusReport};
use crate::{exit, output, CliError};

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
        match crate::status::read(source, election, url).await {
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
