//! kube-controller-manager's three metrics of the
//! `resourcepoolstatusrequest-controller` (same names, help texts, buckets
//! and `driver_name` label), counted when the status write is attempted,
//! as there. The label is what a request's author wrote: its distinct
//! values are capped, the rest counted under `other`, so that requests
//! naming ever new drivers cannot grow the exposition without bound.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

const PROCESSED: &str = "resourcepoolstatusrequest_controller_requests_processed_total";
const PROCESSED_HELP: &str = "[ALPHA] Total number of ResourcePoolStatusRequests processed";
const ERRORS: &str = "resourcepoolstatusrequest_controller_request_processing_errors_total";
const ERRORS_HELP: &str =
    "[ALPHA] Total number of errors encountered while processing ResourcePoolStatusRequests";
const DURATION: &str = "resourcepoolstatusrequest_controller_request_processing_duration_seconds";
const DURATION_HELP: &str = "[ALPHA] Time taken to process a ResourcePoolStatusRequest";
const LABEL: &str = "driver_name";
/// Distinct `driver_name` values at most; later ones count as `other`.
pub(crate) const MAX_DRIVER_LABELS: usize = 100;
pub(crate) const OTHER_DRIVERS: &str = "other";

pub(crate) struct RequestMetrics {
    processed: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
    drivers: Mutex<HashSet<String>>,
}

/// kube-controller-manager's buckets: 1 ms doubling 15 times (to 16.384 s).
fn duration_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.001, 2.0, 15).expect("valid buckets")
}

impl RequestMetrics {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = RequestMetrics {
            processed: IntCounterVec::new(Opts::new(PROCESSED, PROCESSED_HELP), &[LABEL])?,
            errors: IntCounterVec::new(Opts::new(ERRORS, ERRORS_HELP), &[LABEL])?,
            duration: HistogramVec::new(
                HistogramOpts::new(DURATION, DURATION_HELP).buckets(duration_buckets()),
                &[LABEL],
            )?,
            drivers: Mutex::new(HashSet::new()),
        };
        registry.register(Box::new(m.processed.clone()))?;
        registry.register(Box::new(m.errors.clone()))?;
        registry.register(Box::new(m.duration.clone()))?;
        Ok(m)
    }

    /// The label value for `driver`: itself while the cap allows.
    fn label<'a>(&self, driver: &'a str) -> &'a str {
        let mut drivers = self.drivers.lock().unwrap();
        if drivers.contains(driver) {
            return driver;
        }
        if drivers.len() < MAX_DRIVER_LABELS {
            drivers.insert(driver.to_string());
            return driver;
        }
        OTHER_DRIVERS
    }

    /// A status write was attempted for a request of `driver`, its sync
    /// having taken `seconds`.
    pub(crate) fn processed(&self, driver: &str, seconds: f64, failed: bool) {
        let label = self.label(driver);
        self.processed.with_label_values(&[label]).inc();
        if failed {
            self.errors.with_label_values(&[label]).inc();
        }
        self.duration
            .with_label_values(&[label])
            .observe(seconds.max(0.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(registry: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut out,
        )
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    /// Upstream's `TestRequestsProcessed`, `TestRequestProcessingErrors`
    /// and `TestRequestProcessingDuration`: HELP, TYPE and counts per
    /// `driver_name`.
    #[test]
    fn requests_processed_errors_and_duration() {
        let registry = Registry::new();
        let m = RequestMetrics::register(&registry).unwrap();
        m.processed("driver-a", 0.002, false);
        m.processed("driver-a", 0.003, true);
        m.processed("driver-b", 0.002, false);
        let text = exposition(&registry);
        for line in [
            "# HELP resourcepoolstatusrequest_controller_requests_processed_total [ALPHA] Total number of ResourcePoolStatusRequests processed",
            "# TYPE resourcepoolstatusrequest_controller_requests_processed_total counter",
            "resourcepoolstatusrequest_controller_requests_processed_total{driver_name=\"driver-a\"} 2",
            "resourcepoolstatusrequest_controller_requests_processed_total{driver_name=\"driver-b\"} 1",
            "# HELP resourcepoolstatusrequest_controller_request_processing_errors_total [ALPHA] Total number of errors encountered while processing ResourcePoolStatusRequests",
            "resourcepoolstatusrequest_controller_request_processing_errors_total{driver_name=\"driver-a\"} 1",
            "# TYPE resourcepoolstatusrequest_controller_request_processing_duration_seconds histogram",
            "resourcepoolstatusrequest_controller_request_processing_duration_seconds_count{driver_name=\"driver-a\"} 2",
            "resourcepoolstatusrequest_controller_request_processing_duration_seconds_bucket{driver_name=\"driver-b\",le=\"0.001\"} 0",
            "resourcepoolstatusrequest_controller_request_processing_duration_seconds_bucket{driver_name=\"driver-b\",le=\"16.384\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("errors_total{driver_name=\"driver-b\"}"));
    }

    /// Requests naming ever new drivers: the label takes the first 100,
    /// then `other`.
    #[test]
    fn driver_labels_are_capped() {
        let registry = Registry::new();
        let m = RequestMetrics::register(&registry).unwrap();
        for i in 0..MAX_DRIVER_LABELS + 7 {
            m.processed(&format!("d{i}.example.com"), 0.0, false);
        }
        m.processed("d0.example.com", 0.0, false);
        let text = exposition(&registry);
        let series = text
            .lines()
            .filter(|l| {
                l.starts_with("resourcepoolstatusrequest_controller_requests_processed_total{")
            })
            .count();
        assert_eq!(series, MAX_DRIVER_LABELS + 1);
        assert!(text.lines().any(|l| l
            == "resourcepoolstatusrequest_controller_requests_processed_total{driver_name=\"other\"} 7"));
        assert!(text.lines().any(|l| l
            == "resourcepoolstatusrequest_controller_requests_processed_total{driver_name=\"d0.example.com\"} 2"));
    }
}
