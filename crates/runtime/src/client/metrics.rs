//! client-go's `rest_client_*` metrics, as kube-controller-manager exports them.

use super::*;

/// The client-go `rest_client_*` metrics. Cloning shares the underlying
/// collectors.
#[derive(Clone)]
pub(crate) struct ClientMetrics {
    pub(super) requests: IntCounterVec,
    pub(super) request_duration: HistogramVec,
    pub(super) rate_limiter_duration: HistogramVec,
    /// Our own: the same wait by request class (start-up or cleanup).
    pub(super) priority_wait: HistogramVec,
}

impl Default for ClientMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ClientMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientMetrics").finish_non_exhaustive()
    }
}

impl ClientMetrics {
    /// Creates unregistered collectors.
    pub(crate) fn new() -> Self {
        // The names, labels and buckets are constants; construction can only
        // fail on invalid ones, which the tests would catch.
        let requests = IntCounterVec::new(
            Opts::new(
                "rest_client_requests_total",
                "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.",
            ),
            &["code", "host", "method"],
        )
        .expect("valid rest_client_requests_total definition");
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "rest_client_request_duration_seconds",
                "[ALPHA] Request latency in seconds. Broken down by verb and host.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["verb", "host"],
        )
        .expect("valid rest_client_request_duration_seconds definition");
        let rate_limiter_duration = HistogramVec::new(
            HistogramOpts::new(
                "rest_client_rate_limiter_duration_seconds",
                "[ALPHA] Client side rate limiter latency in seconds. Broken down by verb and host.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["verb", "host"],
        )
        .expect("valid rest_client_rate_limiter_duration_seconds definition");
        let priority_wait = HistogramVec::new(
            HistogramOpts::new(
                "dra_rate_limiter_wait_seconds",
                "Wait for a token of the client's QPS budget, by request class: startup (a pod's path to start) or cleanup (releasing claims of finished pods).",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["priority"],
        )
        .expect("valid dra_rate_limiter_wait_seconds definition");
        Self {
            requests,
            request_duration,
            rate_limiter_duration,
            priority_wait,
        }
    }

    /// Registers all collectors.
    pub(crate) fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.requests.clone()))?;
        registry.register(Box::new(self.request_duration.clone()))?;
        registry.register(Box::new(self.rate_limiter_duration.clone()))?;
        registry.register(Box::new(self.priority_wait.clone()))?;
        Ok(())
    }

    #[cfg(test)]
    /// `rest_client_requests_total{code,host,method}`.
    pub(crate) fn requests_total(&self, code: &str, host: &str, method: &str) -> u64 {
        self.requests.with_label_values(&[code, host, method]).get()
    }

    #[cfg(test)]
    /// Number of `rest_client_request_duration_seconds{verb,host}` samples.
    pub(crate) fn request_duration_count(&self, verb: &str, host: &str) -> u64 {
        self.request_duration
            .with_label_values(&[verb, host])
            .get_sample_count()
    }

    #[cfg(test)]
    /// Sample count and total seconds of
    /// `rest_client_rate_limiter_duration_seconds{verb,host}`.
    pub(crate) fn rate_limiter_wait(&self, verb: &str, host: &str) -> (u64, f64) {
        let h = self.rate_limiter_duration.with_label_values(&[verb, host]);
        (h.get_sample_count(), h.get_sample_sum())
    }

    #[cfg(test)]
    /// Sample count and total seconds of
    /// `dra_rate_limiter_wait_seconds{priority}`.
    pub(crate) fn priority_wait(&self, priority: Priority) -> (u64, f64) {
        let h = self.priority_wait.with_label_values(&[priority.label()]);
        (h.get_sample_count(), h.get_sample_sum())
    }
}
