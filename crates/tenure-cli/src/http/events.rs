//! `GET /events`: leadership changes pushed as Server-Sent Events.
//!
//! Why: an application that must start or stop work with leadership should learn of a change
//! the moment the elector does, not at its next poll. SSE is plain HTTP that any language reads
//! (`curl -N`, `EventSource`), and a reconnecting client simply gets the current state first.
//!
//! The stream: first the current snapshot, then one event per change, each
//!
//! ```text
//! event: leadership
//! id: <version>
//! data: {"leader":"a","term":3,"role":"follower"}
//! ```
//!
//! with a comment line every [`KEEP_ALIVE`] so that proxies keep an idle stream open. Versions
//! increase by one per change; a client that is slower than the changes skips to the latest
//! snapshot (the gap shows in the ids) rather than reading stale ones. The stream ends when the
//! elector stops (after it released the lock on SIGTERM).

use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use tokio::sync::watch;

use super::snapshots::NumberedLeadership;
use super::Api;

/// How often an idle stream carries a comment line.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `GET /events` (see the module documentation).
pub async fn events(State(api): State<Api>) -> Sse<impl Stream<Item = Result<Event, axum::Error>>> {
    Sse::new(leadership_events(api.snapshots.clone())).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// The current snapshot, then each new one, as SSE events; ends when the channel closes.
fn leadership_events(snapshots: watch::Receiver<NumberedLeadership>) -> impl Stream<Item = Result<Event, axum::Error>> {
    futures::stream::unfold((snapshots, true), |(mut snapshots, first)| async move {
        if !first {
            snapshots.changed().await.ok()?;
        }
        let snapshot = snapshots.borrow_and_update().clone();
        let event =
            Event::default().event("leadership").id(snapshot.version.to_string()).json_data(&snapshot.leadership);
        Some((event, (snapshots, false)))
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{held_by, serve_fake, settings, FakeView};
    use tenure::Leadership;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    #[tokio::test]
    async fn a_client_gets_the_current_snapshot_then_each_change() {
        let view = FakeView::new(Leadership::unknown());
        let address = serve_fake(&view, settings()).await;
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut lines = BufReader::new(stream).lines();
        let mut data = Vec::new();
        while data.len() < 2 {
            let line = lines.next_line().await.unwrap().unwrap();
            if line.starts_with("content-type") {
                assert_eq!(line, "content-type: text/event-stream");
            }
            if let Some(json) = line.strip_prefix("data: ") {
                data.push(json.to_owned());
                view.leadership.send_replace(held_by("b"));
            }
        }
        assert_eq!(data[0], r#"{"leader":null,"term":null,"role":"follower"}"#);
        assert_eq!(data[1], r#"{"leader":"b","term":3,"role":"follower"}"#);
    }
}
