//! The rate limiters of client-go's `default_rate_limiters.go`: per-key
//! exponential backoff, an overall token bucket, and their maximum.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// An overall token bucket with *reservation* semantics: every call takes the
/// next token, even one that is not there yet, and reports how long to wait
/// for it. With 10 qps and a burst of 100, the 101st call at one instant waits
/// 100 ms, the 102nd 200 ms, and so on (like `rate.Limiter.Reserve`).
///
/// Time is passed in, so the arithmetic is exact and testable.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    /// Time to earn one token.
    interval: Duration,
    /// Time to earn a full bucket (`interval * burst`).
    burst_span: Duration,
    /// The instant at which the bucket is full again; `None` = full now.
    /// Keeping this instead of a token count keeps everything in integer
    /// `Duration`s and never subtracts from an `Instant`.
    full_at: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket refilling at `qps` tokens per second, holding at most
    /// `burst` tokens.
    ///
    /// # Panics
    ///
    /// If `qps` is zero.
    pub(crate) fn new(qps: u32, burst: u32) -> Self {
        assert!(qps > 0, "token bucket needs a positive rate");
        let interval = Duration::from_secs(1) / qps;
        Self {
            interval,
            burst_span: interval * burst,
            full_at: None,
        }
    }

    /// Reserves one token at `now` and returns how long the caller has to
    /// wait before it may act (zero while tokens are left).
    pub(crate) fn reserve_at(&mut self, now: Instant) -> Duration {
        // Tokens never accumulate beyond the burst: a full_at in the past
        // means a full bucket.
        let start = self.full_at.map_or(now, |at| at.max(now));
        let full_at = start + self.interval;
        self.full_at = Some(full_at);
        // Tokens missing after this reservation, expressed as time; whatever
        // exceeds the burst has to be waited for.
        (full_at - now).saturating_sub(self.burst_span)
    }
}

/// Decides how long a failed key waits before it is retried: the maximum of a
/// per-key exponential backoff and (optionally) an overall [`TokenBucket`].
///
/// A plain value; the queue keeps it behind a lock.
#[derive(Debug, Clone)]
pub(crate) struct RateLimiter<K> {
    base_delay: Duration,
    max_delay: Duration,
    /// Failures per key since the last `forget`.
    pub(super) failures: HashMap<K, u32>,
    bucket: Option<TokenBucket>,
}

impl<K: Clone + Eq + Hash> RateLimiter<K> {
    /// The controller default: `max(5 ms * 2^failures capped at 1000 s,
    /// token bucket of 10 qps with a burst of 100)`.
    pub(crate) fn default_controller() -> Self {
        Self::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
            Some(TokenBucket::new(10, 100)),
        )
    }

    /// Per-key backoff `base_delay * 2^failures`, capped at `max_delay`,
    /// combined with `bucket` if given.
    pub(crate) fn new(
        base_delay: Duration,
        max_delay: Duration,
        bucket: Option<TokenBucket>,
    ) -> Self {
        Self {
            base_delay,
            max_delay,
            failures: HashMap::new(),
            bucket,
        }
    }

    /// How long `key` should wait now; counts one more failure for it.
    pub(crate) fn when(&mut self, key: &K) -> Duration {
        self.when_at(key, Instant::now())
    }

    /// [`when`](Self::when) at a given instant (only the token bucket looks
    /// at time).
    pub(crate) fn when_at(&mut self, key: &K, now: Instant) -> Duration {
        let failures = self.failures.entry(key.clone()).or_insert(0);
        let exponent = *failures;
        *failures = failures.saturating_add(1);
        // Any overflow means "far beyond the cap".
        let backoff = 2u32
            .checked_pow(exponent)
            .and_then(|factor| self.base_delay.checked_mul(factor))
            .map_or(self.max_delay, |delay| delay.min(self.max_delay));
        // The bucket is consulted even when the backoff dominates, so that a
        // storm of failures also drains it.
        let bucket = self
            .bucket
            .as_mut()
            .map_or(Duration::ZERO, |bucket| bucket.reserve_at(now));
        backoff.max(bucket)
    }

    /// Resets the backoff of `key` (call after it was processed
    /// successfully).
    pub(crate) fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    #[cfg(test)]
    /// How many times `key` failed since the last [`forget`](Self::forget).
    pub(crate) fn num_requeues(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }
}
