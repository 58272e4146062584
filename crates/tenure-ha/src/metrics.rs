//! Prometheus metrics of the HA runtime (gate and garbage collector).
//!
//! Why one module: operators read them side by side (is the work running, why did it stop, how
//! many orphans were found and deleted), and both runtimes register into the same
//! `prometheus_client` registry the sidecar already serves.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The label set of a counter split by one reason.
pub type ReasonLabel = [(&'static str, &'static str); 1];

/// Metrics of a [`crate::gate::Gate`]. Clones share the same series.
#[derive(Debug, Clone)]
pub struct GateMetrics {
    /// 1 while the leader work runs, else 0.
    pub running: Gauge,
    /// Starts of the work (first start of a tenure and restarts).
    pub starts: Counter,
    /// Stops of the work by reason: lost, fenced, resigned, shutdown, failed, finished, stuck (the
    /// replica gave way because an operation outlived `GateBuilder::stuck_after`).
    pub stops: Family<ReasonLabel, Counter>,
    /// Seconds from telling the work to stop until it stopped (or was aborted).
    pub drain_seconds: Histogram,
}

impl Default for GateMetrics {
    fn default() -> Self {
        // 1 ms .. about 65 s.
        let drain_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        GateMetrics { running: Gauge::default(), starts: Counter::default(), stops: Family::default(), drain_seconds }
    }
}

impl GateMetrics {
    /// New metrics registered in `registry` as `tenure_ha_work_running`,
    /// `tenure_ha_work_starts_total`, `tenure_ha_work_stops_total{reason}` and
    /// `tenure_ha_work_drain_seconds`.
    pub fn register(registry: &mut Registry) -> GateMetrics {
        let metrics = GateMetrics::default();
        registry.register("tenure_ha_work_running", "1 while the leader-gated work runs", metrics.running.clone());
        registry.register("tenure_ha_work_starts", "Starts of the leader-gated work", metrics.starts.clone());
        registry.register("tenure_ha_work_stops", "Stops of the leader-gated work by reason", metrics.stops.clone());
        registry.register(
            "tenure_ha_work_drain_seconds",
            "Time from telling the work to stop until it stopped or was aborted",
            metrics.drain_seconds.clone(),
        );
        metrics
    }

    /// How many times the work stopped for `reason`.
    pub fn stops_for(&self, reason: &'static str) -> u64 {
        self.stops.get_or_create(&[("reason", reason)]).get()
    }
}

/// Metrics of a [`crate::gc::GarbageCollector`]. Clones share the same series.
#[derive(Debug, Clone, Default)]
pub struct GcMetrics {
    /// Passes completed.
    pub passes: Counter,
    /// Passes skipped because listing the external resources failed (nothing was deleted).
    pub skipped_passes: Counter,
    /// Orphans found (unreferenced and past the grace period), counted once per pass that saw them.
    pub orphans_found: Counter,
    /// Orphans deleted (not counting dry runs, which only report).
    pub orphans_deleted: Counter,
    /// Deletions that failed.
    pub delete_failures: Counter,
}

impl GcMetrics {
    /// New metrics registered in `registry` under `tenure_ha_gc_*`.
    pub fn register(registry: &mut Registry) -> GcMetrics {
        let metrics = GcMetrics::default();
        for (name, help, counter) in [
            ("tenure_ha_gc_passes", "Garbage collection passes completed", &metrics.passes),
            (
                "tenure_ha_gc_skipped_passes",
                "Garbage collection passes skipped because listing failed",
                &metrics.skipped_passes,
            ),
            ("tenure_ha_gc_orphans_found", "Orphans found per pass", &metrics.orphans_found),
            ("tenure_ha_gc_orphans_deleted", "Orphans deleted", &metrics.orphans_deleted),
            ("tenure_ha_gc_delete_failures", "Deletions of orphans that failed", &metrics.delete_failures),
        ] {
            registry.register(name, help, counter.clone());
        }
        metrics
    }
}
