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
mod shared;
#[cfg(test)]
mod tests;
mod waiting;

pub use queue::WorkQueue;
