//! kube-controller-manager's two metrics of the eviction controller (same
//! names, help texts and buckets, no labels), and ours for the pacing and
//! the guard.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

const DELETIONS: &str = "device_taint_eviction_controller_pod_deletions_total";
/// kube-controller-manager marks these ALPHA, and says so in the HELP text.
const DELETIONS_HELP: &str =
    "[ALPHA] Total number of Pods deleted by DeviceTaintEvictionController since its start.";
const LATENCY: &str = "device_taint_eviction_controller_pod_deletion_duration_seconds";
const LATENCY_HELP: &str = "[ALPHA] Latency, in seconds, between the time when a device taint effect has been activated \
and a Pod's deletion via DeviceTaintEvictionController.";
/// kube-controller-manager's buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0, 120.0, 180.0, 240.0,
];
const PACING: &str = "dra_claim_controller_device_taint_eviction_pacing_wait_seconds";
const PACING_HELP: &str = "Time an eviction waited for its turn under --device-taint-evictions-per-second and \
--device-taint-evictions-per-rule-per-second (0 when it did not wait).";
const PACING_BUCKETS: [f64; 10] = [0.0, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0];
const HELD: &str = "dra_claim_controller_device_taint_rules_held";
const HELD_HELP: &str = "DeviceTaintRules with the NoExecute effect not acted on because they select more of the \
allocated devices than --device-taint-eviction-max-share allows and no admin confirmed them.";

const REFUSED: &str = "dra_claim_controller_device_taint_evictions_refused_total";
const REFUSED_HELP: &str = "Evictions through the Eviction API (DeviceTaintRules annotated \
dra-claim-controller.io/respect-disruption-budgets=true) a PodDisruptionBudget refused for now, by rule; \
each is tried again with backoff.";

#[derive(Clone)]
pub(crate) struct EvictionMetrics {
    refused: IntCounterVec,
    deletions: IntCounter,
    latency: Histogram,
    pacing: Histogram,
    held: IntGauge,
}

impl EvictionMetrics {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = EvictionMetrics {
            refused: IntCounterVec::new(Opts::new(REFUSED, REFUSED_HELP), &["rule"])?,
            deletions: IntCounter::with_opts(Opts::new(DELETIONS, DELETIONS_HELP))?,
            latency: Histogram::with_opts(
                HistogramOpts::new(LATENCY, LATENCY_HELP).buckets(LATENCY_BUCKETS.to_vec()),
            )?,
            pacing: Histogram::with_opts(
                HistogramOpts::new(PACING, PACING_HELP).buckets(PACING_BUCKETS.to_vec()),
            )?,
            held: IntGauge::with_opts(Opts::new(HELD, HELD_HELP))?,
        };
        registry.register(Box::new(m.deletions.clone()))?;
        registry.register(Box::new(m.latency.clone()))?;
        registry.register(Box::new(m.pacing.clone()))?;
        registry.register(Box::new(m.held.clone()))?;
        registry.register(Box::new(m.refused.clone()))?;
        Ok(m)
    }

    /// A pod deleted `late` seconds after its taint took effect.
    pub(crate) fn deleted(&self, late: f64) {
        self.deletions.inc();
        self.latency.observe(late.max(0.0));
    }

    pub(crate) fn paced(&self, waited: f64) {
        self.pacing.observe(waited);
    }

    /// A budget refused an eviction for these rules.
    pub(crate) fn refused(&self, rules: &[String]) {
        for rule in rules {
            self.refused.with_label_values(&[rule]).inc();
        }
    }

    pub(crate) fn set_held(&self, rules: usize) {
        self.held.set(rules as i64);
    }
}
