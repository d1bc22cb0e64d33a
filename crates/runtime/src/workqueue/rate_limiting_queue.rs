//! Adding a key after the delay its rate limiter assigns (client-go's
//! `rate_limiting_queue.go`).

use std::fmt::Debug;
use std::hash::Hash;

use super::queue::WorkQueue;
use super::shared::lock;

impl<K> WorkQueue<K>
where
    K: Clone + Eq + Hash + Send + Sync + Debug + 'static,
{
    /// Adds `key` after the delay the rate limiter assigns to it, and counts
    /// a retry. Ignored after shutdown.
    pub(crate) fn add_rate_limited(&self, key: K) {
        if self.is_shutting_down() {
            return;
        }
        let delay = lock(&self.inner.limiter).when(&key);
        self.inner.metrics.retries.inc();
        self.add_after(key, delay);
    }

    /// Resets the rate limiter's backoff for `key`. Does not remove the key
    /// from the queue.
    pub fn forget(&self, key: &K) {
        lock(&self.inner.limiter).forget(key);
    }

    #[cfg(test)]
    /// How often `key` was rate-limited since the last
    /// [`forget`](Self::forget).
    pub(crate) fn num_requeues(&self, key: &K) -> u32 {
        lock(&self.inner.limiter).num_requeues(key)
    }
}
