//! Kubernetes probes: `GET /healthz` (liveness) and `GET /readyz` (readiness).
//!
//! Why: a sidecar whose election is stuck while it believes it leads must be restarted, or the
//! application next to it keeps acting as leader (client-go's `HealthzAdaptor` exists for this);
//! and some deployments want a Service to route to the leader only, which readiness does.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use tenure::{ElectorStats, Role};
use tokio::time::Instant;

use super::{Api, LeadershipView};

/// `GET /healthz`: 500 only when this instance believes it leads (its published role is
/// `leader`) but has not started a successful renew for longer than the lease plus
/// `--healthz-timeout`; 200 `ok` otherwise, followers included (a follower has nothing to be
/// stuck on). This is client-go's healthz adaptor rule.
pub async fn healthz(State(api): State<Api>) -> (StatusCode, String) {
    let timeout = api.settings.healthz_timeout;
    match api.read(|view| stuck_leader(view, timeout, Instant::now())).flatten() {
        Some(silence) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("leading without a successful renew for {:.1}s\n", silence.as_secs_f64()),
        ),
        None => (StatusCode::OK, "ok\n".to_owned()),
    }
}

/// How long a leader has gone without renewing, if that is longer than the lease plus `timeout`.
///
/// A tenure that is still valid on the local clock is healthy whatever the counters say (its
/// validity was set by its last renew or by the acquisition, which the renew counters do not
/// include). A leader without any recorded renew has just acquired the lock and is healthy too.
fn stuck_leader(view: &dyn LeadershipView, timeout: Duration, now: Instant) -> Option<Duration> {
    if view.leadership().role != Role::Leader || view.leads_now() {
        return None;
    }
    let ElectorStats { last_renew_started, .. } = view.stats();
    let silence = now.saturating_duration_since(last_renew_started?);
    (silence > view.timing().lease_duration + timeout).then_some(silence)
}

/// `GET /readyz`: 200 `ok` by default (the sidecar is up and answering). With
/// `--ready-only-when-leader`, 200 only while this instance leads on its own clock and 503
/// otherwise, so that a Service in front of the pods routes only to the leader.
pub async fn readyz(State(api): State<Api>) -> (StatusCode, &'static str) {
    if !api.settings.ready_only_when_leader || api.read(|view| view.leads_now()).unwrap_or(false) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not the leader\n")
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{get, held_by, serve_fake, settings, FakeView};
    use super::super::ApiSettings;
    use super::*;
    use tenure::Leadership;

    fn leading(view: &FakeView) {
        let mut leadership: Leadership = held_by("me");
        leadership.role = Role::Leader;
        view.leadership.send_replace(leadership);
    }

    #[test]
    fn only_a_leader_that_stopped_renewing_for_lease_plus_timeout_is_unhealthy() {
        let view = FakeView::new(held_by("other"));
        let timeout = Duration::from_secs(20);
        let now = Instant::now() + Duration::from_secs(100);
        view.stats.lock().unwrap().last_renew_started = Some(now - Duration::from_secs(30));
        assert_eq!(stuck_leader(view.as_ref(), timeout, now), None, "a follower is healthy");
        leading(&view);
        *view.leads.lock().unwrap() = true;
        assert_eq!(stuck_leader(view.as_ref(), timeout, now), None, "a valid tenure is healthy");
        *view.leads.lock().unwrap() = false;
        assert_eq!(stuck_leader(view.as_ref(), timeout, now), Some(Duration::from_secs(30)));
        view.stats.lock().unwrap().last_renew_started = Some(now - Duration::from_secs(21));
        assert_eq!(stuck_leader(view.as_ref(), timeout, now), None, "within lease (2 s) + timeout");
    }

    #[tokio::test]
    async fn readiness_follows_leadership_only_when_asked() {
        let view = FakeView::new(held_by("other"));
        let always = serve_fake(&view, settings()).await;
        let leader_only = serve_fake(&view, ApiSettings { ready_only_when_leader: true, ..settings() }).await;
        assert_eq!(get(always, "/readyz").await.0, 200);
        assert_eq!(get(leader_only, "/readyz").await.0, 503);
        leading(&view);
        *view.leads.lock().unwrap() = true;
        assert_eq!(get(leader_only, "/readyz").await.0, 200);
        assert_eq!(get(leader_only, "/healthz").await.0, 200);
    }
}
