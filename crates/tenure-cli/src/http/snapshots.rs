//! Leadership snapshots numbered in the order this process saw them.
//!
//! Why: long-poll and Server-Sent Events clients need to say "I have seen up to here" and learn
//! only what is newer. The elector's watch channel has no public version, so one small task
//! (on the same current-thread runtime) copies each snapshot into a channel of its own with a
//! counter. Versions start at 1 in every process: a client that sends a version from another
//! process (the sidecar restarted) gets an answer at once, because the versions differ.

use tenure::Leadership;
use tokio::sync::watch;

/// A leadership snapshot and its version: 1 for the first one, +1 for each change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumberedLeadership {
    /// Counts the snapshots seen by this process; doubles as an ETag and SSE event id.
    pub version: u64,
    /// The snapshot itself.
    pub leadership: Leadership,
}

/// Numbers the snapshots of `leadership` from now on. The returned channel closes when the
/// elector stops (so streams built on it end) and the task ends when every receiver is gone.
pub fn number(mut leadership: watch::Receiver<Leadership>) -> watch::Receiver<NumberedLeadership> {
    let presented = |mut snapshot: Leadership| {
        snapshot.leader = super::known_leader(snapshot.leader);
        snapshot
    };
    let first = NumberedLeadership { version: 1, leadership: presented(leadership.borrow_and_update().clone()) };
    let (numbered, receiver) = watch::channel(first);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = leadership.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let snapshot = presented(leadership.borrow_and_update().clone());
                    numbered.send_if_modified(|current| {
                        if current.leadership == snapshot {
                            return false;
                        }
                        current.version += 1;
                        current.leadership = snapshot;
                        true
                    });
                }
                () = numbered.closed() => break,
            }
        }
    });
    receiver
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure::{Role, Term};

    #[tokio::test]
    async fn each_change_gets_the_next_version_and_the_feed_closes_with_the_elector() {
        let (elector, leadership) = watch::channel(Leadership::unknown());
        let mut numbered = number(leadership);
        assert_eq!(numbered.borrow_and_update().version, 1);
        let led = Leadership { leader: Some("a".into()), term: Some(Term(1)), role: Role::Follower };
        elector.send_replace(led.clone());
        numbered.changed().await.unwrap();
        assert_eq!(*numbered.borrow_and_update(), NumberedLeadership { version: 2, leadership: led });
        drop(elector);
        assert!(numbered.changed().await.is_err());
    }
}
