//! The one retry policy of every worker: what happens to a key once its
//! sync ended, decided from the [`SyncError`] kind (a pure function), then
//! applied to the work queue.
//!
//! - done: its failures are forgotten (a later failure starts the backoff
//!   afresh);
//! - done for now, "look again after": forgotten, then re-added after the
//!   delay;
//! - no answer from the API server: says nothing about the item, so no
//!   backoff step and no retry counted; the key waits for the API server
//!   (the outage gate of [`super::reachability`] holds the workers);
//! - a conflict: routine, retried with backoff on fresh state, quietly;
//! - non-retryable (only a change of the controller's own settings helps):
//!   forgotten, logged "will not retry";
//! - anything else: retried with growing backoff, loudly;
//! - while the queue shuts down, a key that got no answer is dropped.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::error::SyncError;
use super::reachability::Reachability;
use crate::workqueue::WorkQueue;

/// What a worker does with a key after a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    Forget,
    RecheckAfter(Duration),
    WhenReachable,
    FreshState,
    Backoff,
    GiveUp,
    Drop,
}

/// The policy: `result` is the sync's outcome (`Some(delay)`: look again
/// after it).
pub(crate) fn retry_for(
    result: &Result<Option<Duration>, SyncError>,
    shutting_down: bool,
) -> Retry {
    match result {
        Ok(None) => Retry::Forget,
        Ok(Some(delay)) => Retry::RecheckAfter(*delay),
        Err(SyncError::Unreachable { .. }) if shutting_down => Retry::Drop,
        Err(SyncError::Unreachable { .. }) => Retry::WhenReachable,
        Err(SyncError::Conflict { .. }) => Retry::FreshState,
        Err(SyncError::NonRetryable(_)) => Retry::GiveUp,
        Err(_) => Retry::Backoff,
    }
}

/// Applies [`retry_for`] to `key` in `queue`, tells `reachability` whether
/// the API server answered, and logs the failure (in the caller's span,
/// which names the key and the sync's reason). Returns what was done.
pub fn requeue<K>(
    queue: &WorkQueue<K>,
    reachability: &Reachability,
    key: &K,
    result: Result<Option<Duration>, SyncError>,
) -> Retry
where
    K: Clone + Eq + Hash + Send + Sync + Debug + 'static,
{
    let retry = retry_for(&result, queue.is_shutting_down());
    // What failed, for the log (retry_for gives the failing kinds only to
    // errors, so it is there wherever it is read below).
    let error = result.err().map(|e| e.to_string()).unwrap_or_default();
    if !matches!(retry, Retry::Drop | Retry::WhenReachable) {
        reachability.report_answer();
    }
    match retry {
        Retry::Drop => {}
        Retry::WhenReachable => {
            if !reachability.report_unreachable(&error) {
                debug!(error, "API server still unreachable");
            }
            queue.add(key.clone());
        }
        Retry::Forget => queue.forget(key),
        Retry::RecheckAfter(delay) => {
            queue.forget(key);
            queue.add_after(key.clone(), delay);
        }
        Retry::FreshState => {
            info!(error, "retrying on fresh state");
            queue.add_rate_limited(key.clone());
        }
        Retry::Backoff => {
            warn!(error, "sync failed; retrying with backoff");
            queue.add_rate_limited(key.clone());
        }
        Retry::GiveUp => {
            warn!(error, "sync failed; will not retry");
            queue.forget(key);
        }
    }
    retry
}

/// First pause after a failed attempt (a watch, or a read the process
/// needs before it can work).
const BACKOFF_MIN: Duration = Duration::from_millis(250);
/// Longest pause. kube-runtime's default grows to 30 s, so after an API
/// server outage the caches could stay stale (or start-up wait) for half a
/// minute after it answered again; an attempt every 4 s costs next to
/// nothing.
pub const BACKOFF_MAX: Duration = Duration::from_secs(4);

/// Pauses between failed attempts of one request that is repeated until it
/// succeeds (a watch, a start-up read): doubling from [`BACKOFF_MIN`] to
/// [`BACKOFF_MAX`] with ±20 % jitter, back to the start after a success.
/// Work items back off in their queue's rate limiter instead.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: BACKOFF_MIN }
    }
}

impl Backoff {
    pub fn next_pause(&mut self) -> Duration {
        use rand::Rng;
        let pause = self.next.mul_f64(rand::rng().random_range(0.8..1.2));
        self.next = (self.next * 2).min(BACKOFF_MAX);
        pause
    }

    pub fn reset(&mut self) {
        self.next = BACKOFF_MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kube_err(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({"code": code, "message": "m"})).unwrap(),
        ))
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::default();
        let pauses: Vec<Duration> = (0..8).map(|_| b.next_pause()).collect();
        assert!(pauses[0] >= Duration::from_millis(200) && pauses[0] <= Duration::from_millis(300));
        assert!(pauses.iter().all(|p| *p <= BACKOFF_MAX.mul_f64(1.2)));
        assert!(pauses[7] >= BACKOFF_MAX.mul_f64(0.8));
        b.reset();
        assert!(b.next_pause() <= Duration::from_millis(300));
    }

    #[test]
    fn every_outcome_has_one_retry() {
        let wait = Duration::from_secs(5);
        let unreachable = || SyncError::kube("x", kube::Error::Service("refused".into()));
        let rows: Vec<(Result<Option<Duration>, SyncError>, bool, Retry)> = vec![
            (Ok(None), false, Retry::Forget),
            (Ok(Some(wait)), false, Retry::RecheckAfter(wait)),
            (Err(unreachable()), false, Retry::WhenReachable),
            (Err(unreachable()), true, Retry::Drop),
            (
                Err(SyncError::kube("x", kube_err(409))),
                false,
                Retry::FreshState,
            ),
            (
                Err(SyncError::kube("x", kube_err(422))),
                false,
                Retry::Backoff,
            ),
            (
                Err(SyncError::kube("x", kube_err(500))),
                false,
                Retry::Backoff,
            ),
            (
                Err(SyncError::Invalid("no template".into())),
                false,
                Retry::Backoff,
            ),
            // 1.37's nonretryable-error and wrapped-nonretryable-error.
            (
                Err(SyncError::NonRetryable("gate off".into())),
                false,
                Retry::GiveUp,
            ),
            // Shutting down drops only what got no answer.
            (
                Err(SyncError::kube("x", kube_err(409))),
                true,
                Retry::FreshState,
            ),
        ];
        for (result, shutting_down, want) in rows {
            assert_eq!(retry_for(&result, shutting_down), want, "{result:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_acts_on_the_queue() {
        let queue: WorkQueue<String> = WorkQueue::new("retry_test", None);
        let reachability = Reachability::new();
        let key = "k".to_string();
        // A failure takes a backoff step; a success forgets it.
        let failed = requeue(
            &queue,
            &reachability,
            &key,
            Err(SyncError::Invalid("bad".into())),
        );
        assert_eq!(failed, Retry::Backoff);
        assert_eq!(queue.num_requeues(&key), 1);
        let got = queue.get().await.unwrap();
        queue.done(&got);
        assert_eq!(
            requeue(&queue, &reachability, &key, Ok(None)),
            Retry::Forget
        );
        assert_eq!(queue.num_requeues(&key), 0);
        // No answer: no backoff step, the key is back at once.
        let unreachable = SyncError::kube("x", kube::Error::Service("refused".into()));
        assert_eq!(
            requeue(&queue, &reachability, &key, Err(unreachable)),
            Retry::WhenReachable
        );
        assert_eq!(queue.num_requeues(&key), 0);
        assert_eq!(queue.len(), 1);
        let got = queue.get().await.unwrap();
        queue.done(&got);
        // Non-retryable: forgotten, not queued again.
        assert_eq!(
            requeue(
                &queue,
                &reachability,
                &key,
                Err(SyncError::NonRetryable("GenericWorkload is off".into()))
            ),
            Retry::GiveUp
        );
        assert_eq!((queue.len(), queue.num_requeues(&key)), (0, 0));
    }
}
