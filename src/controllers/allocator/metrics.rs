//! `dra_claim_controller_allocations_total{result}`: what became of the
//! allocator's attempts.

use prometheus::{IntCounterVec, Opts, Registry};

const NAME: &str = "dra_claim_controller_allocations_total";
const HELP: &str = "Allocation attempts for pre-scheduled pods on declared nodes (--allocate-on-nodes), by \
result: allocated, unsatisfiable (not enough suitable free devices now), refused (the claim asks for something the \
allocator does not support or is wrong), failed (a write failed).";
const RESULTS: [&str; 4] = ["allocated", "unsatisfiable", "refused", "failed"];

#[derive(Clone)]
pub struct AllocatorMetrics {
    attempts: Option<IntCounterVec>,
}

impl AllocatorMetrics {
    /// Registers the counter, every result at 0 so that rates exist from
    /// the start.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let attempts = IntCounterVec::new(Opts::new(NAME, HELP), &["result"])?;
        for result in RESULTS {
            attempts.with_label_values(&[result]);
        }
        registry.register(Box::new(attempts.clone()))?;
        Ok(AllocatorMetrics {
            attempts: Some(attempts),
        })
    }

    /// Metrics that go nowhere (for tests without a registry).
    pub fn unregistered() -> Self {
        AllocatorMetrics { attempts: None }
    }

    /// Counts one attempt under `result`.
    pub(crate) fn record_allocation(&self, result: &str) {
        if let Some(c) = &self.attempts {
            c.with_label_values(&[result]).inc();
        }
    }
}
