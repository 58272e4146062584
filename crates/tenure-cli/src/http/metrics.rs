//! `GET /metrics`: the election's state and counters for Prometheus.
//!
//! Why: dashboards and alerts built for Kubernetes components already watch
//! `leader_election_master_status{name}`; the other series say how healthy the election is
//! (renews, failures, latency) and how often leadership moves.
//!
//! Every value is read from the elector at scrape time (a collector, not counters kept twice),
//! all labelled `name="<election>"`:
//!
//! - `leader_election_master_status` gauge: 1 while this instance leads on its own clock, else 0
//! - `tenure_leader_transitions_total`: tenures started by this instance
//! - `tenure_term` gauge: the term of the current holder's tenure (absent while unknown)
//! - `tenure_renews_total`, `tenure_failed_renews_total`, `tenure_lock_errors_total`
//! - `tenure_lock_unreachable_seconds` gauge: how long every call to the lock has failed (0 while
//!   it answers), for an alert on a lock that stays unreachable
//! - `tenure_lock_wait_seconds` gauge: how long this instance still waits on a deleted or corrupt
//!   record (or after resigning) before it may take the lock (0 when it does not)
//! - `tenure_renew_latency_seconds` gauge: the duration of the last successful renew. Not a
//!   histogram: the elector exposes counters and the last latency, not an event per renew, so a
//!   scrape cannot see the renews between two scrapes.
//! - `tenure_lease_duration_seconds`, `tenure_renew_deadline_seconds` gauges: the timing in force
//!   (on ZooKeeper the session timeout the server granted). Why: an alert on renew latency or on a
//!   leaderless election must compare with this election's lease, and `--ttl` differs per
//!   deployment.
//!
//! `deploy/monitoring/` holds alerting rules and a Grafana dashboard built on exactly these names
//! (`crates/tenure-cli/tests/monitoring.rs` checks them against a real scrape).
//!
//! The answer is OpenMetrics text, which Prometheus scrapes natively.

use std::sync::{Arc, Weak};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use tokio::time::Instant;

use super::progress::Progress;
use super::{Api, LeadershipView};

/// The content type of OpenMetrics text, as Prometheus expects it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The registry of the sidecar's metrics, built once; its collector reads the elector at each
/// scrape.
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    /// Metrics of the elector behind `view`, labelled with the election's name, and how often it
    /// gave way for lack of progress (when `progress` is watched).
    pub fn new(view: Weak<dyn LeadershipView>, election: &str, progress: Option<Arc<Progress>>) -> Metrics {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ElectionCollector { view, election: election.to_owned(), progress }));
        Metrics { registry }
    }

    /// The current values in OpenMetrics text.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// `GET /metrics` (see the module documentation).
pub async fn metrics(State(api): State<Api>) -> Response {
    match api.metrics.render() {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(error) => {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the metrics: {error}")).into_response()
        }
    }
}

/// Reads the elector at scrape time. Writes nothing once the elector is gone (shutting down).
struct ElectionCollector {
    view: Weak<dyn LeadershipView>,
    election: String,
    progress: Option<Arc<Progress>>,
}

impl std::fmt::Debug for ElectionCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectionCollector").field("election", &self.election).finish_non_exhaustive()
    }
}

impl Collector for ElectionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(view) = self.view.upgrade() else { return Ok(()) };
        let stats = view.stats();
        let labels = [("name", self.election.as_str())];
        let mut write = |name: &str, help: &str, metric: &dyn EncodeMetric| -> Result<(), std::fmt::Error> {
            let mut family = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(family.encode_family(&labels)?)
        };
        write(
            "leader_election_master_status",
            "1 while this instance leads (checked on its own clock), 0 otherwise",
            &ConstGauge::new(i64::from(view.leads_now())),
        )?;
        write(
            "tenure_leader_transitions",
            "Tenures started by this instance",
            &ConstCounter::new(stats.tenures_started),
        )?;
        if let Some(term) = view.leadership().term {
            write("tenure_term", "Term (fencing token) of the current holder's tenure", &ConstGauge::new(term.0))?;
        }
        write("tenure_renews", "Successful renews of the lock", &ConstCounter::new(stats.renews))?;
        if let Some(progress) = &self.progress {
            let help = "Times this instance, leading, gave way because its application made no progress for --progress-timeout";
            write("tenure_gave_way", help, &ConstCounter::new(progress.gave_way()))?;
        }
        write("tenure_failed_renews", "Renews that failed while leading", &ConstCounter::new(stats.failed_renews))?;
        write("tenure_lock_errors", "Failed calls to the lock of any kind", &ConstCounter::new(stats.lock_errors))?;
        let unreachable_for =
            stats.lock_unreachable_since.map_or(0.0, |since| since.elapsed().unwrap_or_default().as_secs_f64());
        write(
            "tenure_lock_unreachable_seconds",
            "How long every call to the lock has failed (0 while it answers)",
            &ConstGauge::new(unreachable_for),
        )?;
        let waiting_for =
            stats.waiting.map_or(0.0, |wait| wait.until.saturating_duration_since(Instant::now()).as_secs_f64());
        write(
            "tenure_lock_wait_seconds",
            "How long this instance still waits on a deleted or corrupt record (or after resigning) before it may take the lock",
            &ConstGauge::new(waiting_for),
        )?;
        if let Some(latency) = stats.last_renew_latency {
            write(
                "tenure_renew_latency_seconds",
                "Duration of the last successful renew",
                &ConstGauge::new(latency.as_secs_f64()),
            )?;
        }
        let timing = view.timing();
        write(
            "tenure_lease_duration_seconds",
            "Lease duration in force: how long followers wait for a silent leader",
            &ConstGauge::new(timing.lease_duration.as_secs_f64()),
        )?;
        write(
            "tenure_renew_deadline_seconds",
            "Renew deadline in force: how long a leader leads without a successful renew",
            &ConstGauge::new(timing.renew_deadline.as_secs_f64()),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{get, held_by, serve_fake, settings, FakeView};

    #[tokio::test]
    async fn metrics_are_openmetrics_labelled_with_the_election() {
        let view = FakeView::new(held_by("me"));
        view.stats.lock().unwrap().renews = 7;
        let address = serve_fake(&view, settings()).await;
        let (code, head, body) = get(address, "/metrics").await;
        assert_eq!(code, 200);
        assert!(head.contains("content-type: application/openmetrics-text"), "{head}");
        assert!(body.contains("leader_election_master_status{name=\"test\"} 0\n"), "{body}");
        assert!(body.contains("tenure_renews_total{name=\"test\"} 7\n"), "{body}");
        assert!(body.contains("tenure_term{name=\"test\"} 3\n"), "{body}");
        assert!(body.contains("# TYPE tenure_leader_transitions counter"), "{body}");
        assert!(body.contains("tenure_lease_duration_seconds{name=\"test\"} 2.0\n"), "{body}");
        assert!(body.contains("tenure_renew_deadline_seconds{name=\"test\"} 1.0\n"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        *view.leads.lock().unwrap() = true;
        assert!(get(address, "/metrics").await.2.contains("leader_election_master_status{name=\"test\"} 1\n"));
    }
}
