//! A typed, rate-limited work queue with the semantics controllers built on
//! client-go's `util/workqueue` rely on:
//!
//! * a key is queued at most once, however often it is added (the *dirty*
//!   set);
//! * a key that is being processed is never handed to a second worker; if it
//!   is added meanwhile, it is queued again exactly once when `done` is
//!   called;
//! * delayed and rate-limited adds (per-key exponential backoff combined with
//!   an overall token bucket);
//! * the `workqueue_*` Prometheus metrics, with client-go's names, help texts,
//!   buckets and the `name` label, so existing dashboards and alerts keep
//!   working.
//!
//! Unlike client-go, `get` returns `None` as soon as the queue is shut down,
//! even if keys are still queued: on leader loss or SIGTERM the controller
//! must stop taking new work and only finish what is in flight (see
//! [`WorkQueue::wait_idle`]).

mod default_rate_limiters;
mod delaying_queue;
mod metrics;
mod queue;
mod rate_limiting_queue;
#[cfg(test)]
mod tests;

use std::sync::{Mutex, MutexGuard, PoisonError};

pub use default_rate_limiters::{RateLimiter, TokenBucket};
pub use queue::WorkQueue;

/// Locks a mutex, ignoring poisoning: the critical sections only make small
/// map and queue updates, so a panic elsewhere (e.g. in a worker holding no
/// lock of ours) must not make the whole queue unusable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
