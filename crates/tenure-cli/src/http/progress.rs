//! `POST /progress?term=<term>`: the application proves that its work moves, so that a leader
//! whose work is dead gives way (invariant G1, `tenure elect --progress-timeout`).
//!
//! Why: a sidecar renews the lock whatever its application does. A hung controller (a deadlock,
//! a stuck connection, SIGSTOP of its container alone) kept leadership until a liveness probe
//! killed it, if one was configured (the failure reported against Cilium's operator). With
//! `--progress-timeout`, the leader's application calls `/progress` with its term whenever its
//! work advances; after that much silence, counted from the start of the tenure or the last
//! call, the sidecar resigns (drain, release; a healthy replica leads at once) and stays a
//! candidate. Only the application's silence counts: a slow renew of the sidecar never makes it
//! give way.
//!
//! Answers: 204 (noted); 409 when this instance does not lead with that term (a stale term: the
//! work must stop); 400 without a term; 404 when the sidecar was started without
//! `--progress-timeout`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tenure::{Leadership, Term};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

use super::{query_value, Api};

/// The application's last proof of progress, shared by the route and the watchdog.
#[derive(Debug)]
pub struct Progress {
    /// How much silence is allowed.
    pub allowed_silence: Duration,
    /// The term the last proof was for, and when it came (on this process's monotonic clock).
    last: Mutex<Option<(Term, Instant)>>,
    /// Times this instance gave way for lack of progress.
    gave_way: AtomicU64,
}

impl Progress {
    /// No proof yet, `allowed_silence` allowed.
    pub fn new(allowed_silence: Duration) -> Progress {
        Progress { allowed_silence, last: Mutex::new(None), gave_way: AtomicU64::new(0) }
    }

    fn note(&self, term: Term, at: Instant) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((term, at));
    }

    /// When the silence of the tenure `term`, which started at `started`, becomes too long.
    fn deadline(&self, term: Term, started: Instant) -> Instant {
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        let since = match last {
            Some((proved, at)) if proved == term => at.max(started),
            _ => started,
        };
        since + self.allowed_silence
    }

    /// Times this instance gave way for lack of progress (`tenure_gave_way_total`).
    pub fn gave_way(&self) -> u64 {
        self.gave_way.load(Ordering::Relaxed)
    }
}

/// `POST /progress?term=<term>` (see the module documentation).
pub(super) async fn progress(State(api): State<Api>, RawQuery(query): RawQuery) -> Response {
    let Some(progress) = api.settings.progress.as_ref() else {
        return (StatusCode::NOT_FOUND, "progress is not watched: start tenure elect with --progress-timeout\n")
            .into_response();
    };
    let Some(term) = query_value(query.as_deref(), "term").and_then(|t| t.parse::<u64>().ok()).map(Term) else {
        return (StatusCode::BAD_REQUEST, "progress needs ?term=<the term this instance leads with>\n").into_response();
    };
    // Judged now, on this process's clock: a thawed leader whose lease may have run out refuses.
    let leads = api.read(|view| view.tenure()).flatten().is_some_and(|tenure| tenure.term() == term);
    if !leads {
        let message = format!("this instance does not lead with term {term}: stop the work\n");
        return (StatusCode::CONFLICT, message).into_response();
    }
    progress.note(term, Instant::now());
    StatusCode::NO_CONTENT.into_response()
}

/// Watches each tenure of this instance: when its application has been silent for the allowed
/// silence, sends the tenure's term on `give_way` (the owner of the elector resigns).
pub async fn watch_progress(
    progress: std::sync::Arc<Progress>,
    mut leadership: watch::Receiver<Leadership>,
    give_way: mpsc::Sender<Term>,
) {
    loop {
        let Ok(term) = leadership.wait_for(|now| now.is_leader()).await.map(|now| now.term) else { return };
        let Some(term) = term else { continue };
        let started = Instant::now();
        loop {
            let deadline = progress.deadline(term, started);
            tokio::select! {
                () = sleep_until(deadline) => {
                    if progress.deadline(term, started) <= Instant::now() {
                        progress.gave_way.fetch_add(1, Ordering::Relaxed);
                        if give_way.send(term).await.is_err() {
                            return;
                        }
                        break;
                    }
                }
                changed = leadership.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let still = { let now = leadership.borrow_and_update(); now.is_leader() && now.term == Some(term) };
                    if !still {
                        break;
                    }
                }
            }
        }
        // Until this tenure is over: the next one starts its own silence.
        if leadership.wait_for(|now| !(now.is_leader() && now.term == Some(term))).await.is_err() {
            return;
        }
    }
}
