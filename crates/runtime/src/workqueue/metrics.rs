//! The `workqueue_*` metrics, with client-go's names, help texts, buckets
//! and `name` label.

use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Opts};

/// The client-go workqueue metrics of one queue. Each metric carries the
/// queue name as a constant `name` label: descriptors then differ per queue,
/// so several queues can share a registry, while registering the same name
/// twice is rejected by the registry instead of silently mixing values.
#[derive(Clone)]
pub(super) struct Metrics {
    pub(super) depth: IntGauge,
    pub(super) adds: IntCounter,
    pub(super) queue_duration: Histogram,
    pub(super) work_duration: Histogram,
    pub(super) unfinished_work: Gauge,
    pub(super) longest_running: Gauge,
    pub(super) retries: IntCounter,
}

impl Metrics {
    pub(super) fn new(queue: &str) -> Self {
        const VALID: &str = "constant metric definition is valid";
        // kube-controller-manager 1.36 marks the workqueue metrics BETA and
        // says so in their HELP, as component-base does.
        let opts = |name: &str, help: &str| {
            Opts::new(name, format!("[BETA] {help}"))
                .subsystem("workqueue")
                .const_label("name", queue)
        };
        let histogram = |name: &str, help: &str| {
            // Repeated multiplication, as client-go does, so the `le` labels
            // come out identical (including 9.999999999999999e-06).
            let buckets = prometheus::exponential_buckets(1e-8, 10.0, 10).expect(VALID);
            let opts = HistogramOpts::new(name, format!("[BETA] {help}"))
                .subsystem("workqueue")
                .const_label("name", queue)
                .buckets(buckets);
            Histogram::with_opts(opts).expect(VALID)
        };
        Self {
            depth: IntGauge::with_opts(opts("depth", "Current depth of workqueue")).expect(VALID),
            adds: IntCounter::with_opts(opts(
                "adds_total",
                "Total number of adds handled by workqueue",
            ))
            .expect(VALID),
            queue_duration: histogram(
                "queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested.",
            ),
            work_duration: histogram(
                "work_duration_seconds",
                "How long in seconds processing an item from workqueue takes.",
            ),
            unfinished_work: Gauge::with_opts(opts(
                "unfinished_work_seconds",
                "How many seconds of work has done that is in progress and hasn't been \
                 observed by work_duration. Large values indicate stuck threads. One can \
                 deduce the number of stuck threads by observing the rate at which this \
                 increases.",
            ))
            .expect(VALID),
            longest_running: Gauge::with_opts(opts(
                "longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
            ))
            .expect(VALID),
            retries: IntCounter::with_opts(opts(
                "retries_total",
                "Total number of retries handled by workqueue",
            ))
            .expect(VALID),
        }
    }
}
