//! The coordinator's session: the application's signs of life, and what keeps running between
//! its requests (membership renews, the session's end).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Coordinator;

/// When the application last showed it was alive, and whether the session is over.
pub struct Session {
    timeout: Duration,
    last_call: Mutex<Instant>,
    in_flight: AtomicUsize,
    expired: AtomicBool,
}

impl Session {
    pub fn new(timeout: Duration) -> Self {
        Session {
            timeout,
            last_call: Mutex::new(Instant::now()),
            in_flight: AtomicUsize::new(0),
            expired: AtomicBool::new(false),
        }
    }

    fn last_call(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.last_call.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A request started; the session lives while it is in flight.
    pub fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        *self.last_call() = Instant::now();
    }

    /// A request finished: the session lives for the timeout from now.
    pub fn finished(&self) {
        *self.last_call() = Instant::now();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// The earliest the session can end, as of now.
    pub fn ends(&self) -> Instant {
        let from = if self.in_flight.load(Ordering::SeqCst) > 0 { Instant::now() } else { *self.last_call() };
        from + self.timeout
    }

    /// Whether the application was silent for the timeout as of now, whether or not the task
    /// that ends the session has run yet (it may not have, after a freeze of this process).
    pub fn due(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0 && Instant::now() >= *self.last_call() + self.timeout
    }

    /// Marks the session ended; true for the one caller that ended it (the others find it so).
    pub fn expire(&self) -> bool {
        !self.expired.swap(true, Ordering::SeqCst)
    }

    /// Whether the session ended (everything released; requests are refused).
    pub fn expired(&self) -> bool {
        self.expired.load(Ordering::SeqCst)
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// How often this process notes that its event loop turns ([`keep_pulse`]).
pub const PULSE_PERIOD: Duration = Duration::from_millis(100);

/// A longer gap between two turns of this process's event loop means it was frozen (SIGSTOP, a
/// paused VM or container, a starved host): what it learnt from its watches before may be
/// stale, however healthy they look.
pub const FREEZE_GAP: Duration = Duration::from_millis(300);

/// This process's own evidence that it ran without a gap: the last turn of its event loop on
/// its monotonic clock, and a count of the gaps seen (an epoch: answers proven fresh before a
/// gap are not proof after it).
pub struct Pulse {
    origin: Instant,
    last_turn_ns: AtomicU64,
    gaps: AtomicU64,
}

impl Pulse {
    pub fn new() -> Self {
        Pulse { origin: Instant::now(), last_turn_ns: AtomicU64::new(0), gaps: AtomicU64::new(0) }
    }

    /// Notes a turn now; the number of gaps seen so far, this one included.
    pub fn turn(&self) -> u64 {
        let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let before = self.last_turn_ns.swap(now, Ordering::SeqCst);
        let gap = Duration::from_nanos(now.saturating_sub(before));
        if gap > FREEZE_GAP {
            tracing::debug!(?gap, "this process did not run for a while: its views are read again from the store");
            return self.gaps.fetch_add(1, Ordering::SeqCst) + 1;
        }
        self.gaps.load(Ordering::SeqCst)
    }
}

/// Turns every [`PULSE_PERIOD`] until the coordinator stops, so that [`Pulse::turn`] sees a
/// freeze of this process even when no request came during it.
pub async fn keep_pulse(coordinator: Arc<Coordinator>) {
    let mut tick = tokio::time::interval(PULSE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = coordinator.stop.cancelled() => return,
            _ = tick.tick() => {
                coordinator.pulse.turn();
            }
        }
    }
}

/// Renews the memberships every retry period and ends the session once the application was
/// silent for the timeout; returns when the coordinator stops or the session ended.
pub async fn keep(coordinator: Arc<Coordinator>) {
    let mut renew = tokio::time::interval(coordinator.timing.retry_period);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if coordinator.session.expired() {
            return; // ended by a request that arrived after the timeout (it releases everything)
        }
        let ends = coordinator.session.ends();
        tokio::select! {
            () = coordinator.stop.cancelled() => return,
            _ = renew.tick() => coordinator.renew_memberships().await,
            () = tokio::time::sleep_until(ends.into()) => {
                if Instant::now() >= coordinator.session.ends() {
                    break;
                }
            }
        }
    }
    if !coordinator.session.expire() {
        return; // a request found it ended first, and releases everything
    }
    tracing::warn!(
        timeout = ?coordinator.session.timeout,
        "no request from the application within the session timeout: releasing every lock, leadership and membership"
    );
    coordinator.release_everything().await;
}
