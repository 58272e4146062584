//! `GET /hold?term=<term>`: the application's work holds the sidecar's tenure, so a graceful
//! release waits for it.
//!
//! Why: the library's rule is that the lock is released only after the leader's work has
//! stopped (the elector's drain waits for every [`tenure::Tenure`] guard); without this, a sidecar
//! user's worker could still be finishing an item when the next leader starts on SIGTERM. An
//! open `/hold` request *is* such a guard: the sidecar answers `holding <term>` at once, a
//! comment line every second while the tenure lasts, and `ended <term>` the moment it ends
//! (loss, self-fencing, SIGTERM); a graceful release then waits until the application closes the
//! connection (its work has stopped), up to the drain timeout. A crashed application closes the
//! connection with its process, so it never holds anything up for long.
//!
//! Answers: 200 with the stream above; 409 when this instance does not lead with that term (the
//! work must not start); 400 without a term.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use tenure::{Tenure, Term};
use tokio::time::Instant;

use super::{query_value, Api};

/// How often a held tenure sends a comment line: a client that went away is noticed then.
const HOLDING_TICK: Duration = Duration::from_secs(1);
/// How often a line is sent after the tenure ended, so that the guard goes as soon as the client
/// closes the connection.
const ENDED_TICK: Duration = Duration::from_millis(50);

/// `GET /hold?term=<term>` (see the module documentation).
pub async fn hold(State(api): State<Api>, RawQuery(query): RawQuery) -> Response {
    let Some(term) = query_value(query.as_deref(), "term").and_then(|t| t.parse::<u64>().ok()).map(Term) else {
        return (StatusCode::BAD_REQUEST, "hold needs ?term=<the term this instance leads with>\n").into_response();
    };
    let tenure = api.read(|view| view.tenure()).flatten().filter(|tenure| tenure.term() == term);
    let (Some(tenure), Some(linger)) = (tenure, api.read(|view| view.timing().renew_deadline)) else {
        return (StatusCode::CONFLICT, format!("not leading with term {term}\n")).into_response();
    };
    let headers = [(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")];
    (headers, Body::from_stream(hold_stream(tenure, linger))).into_response()
}

/// Where a hold stream is.
enum Stage {
    Announce,
    Holding,
    /// The tenure ended; the guard is kept until the client closes or `until` passes (the
    /// elector's default drain timeout, after which it releases anyway).
    Ended {
        until: Instant,
    },
}

/// The lines of one hold; the guard lives as long as the stream.
fn hold_stream(tenure: Tenure, linger: Duration) -> impl Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::unfold((tenure, Stage::Announce), move |(tenure, stage)| async move {
        let term = tenure.term();
        let (line, next) = match stage {
            Stage::Announce => (format!("holding {term}\n"), Stage::Holding),
            Stage::Holding => tokio::select! {
                () = tenure.ended() => (format!("ended {term}\n"), Stage::Ended { until: Instant::now() + linger }),
                () = tokio::time::sleep(HOLDING_TICK) => (":\n".to_owned(), Stage::Holding),
            },
            Stage::Ended { until } => {
                if Instant::now() >= until {
                    return None;
                }
                tokio::time::sleep(ENDED_TICK.min(until.saturating_duration_since(Instant::now()))).await;
                (":\n".to_owned(), Stage::Ended { until })
            }
        };
        Some((Ok(Bytes::from(line)), (tenure, next)))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tenure::locks::memory::MemoryStore;
    use tenure::{Elector, Timing};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::super::{router, serve, tests::get, tests::settings, LeadershipView};
    use super::*;

    #[tokio::test]
    async fn a_graceful_release_waits_until_the_holding_application_closes_its_hold() {
        let store = MemoryStore::new();
        let timing = Timing::from_ttl(Duration::from_secs(4)).unwrap();
        let elector = Arc::new(Elector::builder("me", store.client("me")).timing(timing).spawn().unwrap());
        let term = elector.acquired().await.unwrap().term();
        let view: std::sync::Weak<dyn LeadershipView> = Arc::downgrade(&(elector.clone() as Arc<dyn LeadershipView>));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, router(view, settings()), std::future::pending()));

        assert_eq!(get(address, &format!("/hold?term={}", term.0 + 1)).await.0, 409, "not our term");
        assert_eq!(get(address, "/hold").await.0, 400);

        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET /hold?term={} HTTP/1.1\r\nHost: x\r\n\r\n", term.0);
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut lines = BufReader::new(stream).lines();
        async fn next_body_line(lines: &mut tokio::io::Lines<BufReader<tokio::net::TcpStream>>) -> String {
            loop {
                let line = lines.next_line().await.unwrap().expect("the hold stream goes on");
                if line.starts_with("holding") || line.starts_with("ended") {
                    return line;
                }
            }
        }
        assert_eq!(next_body_line(&mut lines).await, format!("holding {term}"));

        let elector = Arc::try_unwrap(elector).ok().expect("the router holds the elector weakly");
        let stopping = tokio::spawn(elector.shutdown());
        assert_eq!(next_body_line(&mut lines).await, format!("ended {term}"));
        // The work is still finishing: the lock stays ours.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!stopping.is_finished(), "released while the application still held its tenure");
        let holder = store.peek().unwrap().record.unwrap().holder_identity;
        assert_eq!(holder, "me");

        let closed = Instant::now();
        drop(lines);
        stopping.await.unwrap().unwrap();
        assert!(closed.elapsed() < Duration::from_secs(1), "released {:?} after the hold closed", closed.elapsed());
        assert_eq!(store.peek().unwrap().record.unwrap().holder_identity, "", "released");
    }
}
