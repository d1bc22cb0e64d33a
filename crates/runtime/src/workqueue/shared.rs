//! What every part of the queue shares: its state under one lock, the
//! signals, the rate limiter and the metrics (`Inner`), and the collector
//! that reads the state at scrape time. The queue, the delaying queue and
//! the rate-limiting queue build on this file; it builds on none of them.

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Instant;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use tokio::sync::Notify;

use super::default_rate_limiters::RateLimiter;
use super::metrics::Metrics;
use super::waiting::Waiting;

/// Locks a mutex, ignoring poisoning: the critical sections only make small
/// map and queue updates, so a panic elsewhere (e.g. in a worker holding no
/// lock of ours) must not make the whole queue unusable.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(super) struct State<K> {
    /// Keys ready to be handed out, in order; never contains a key that is
    /// being processed.
    pub(super) queue: VecDeque<K>,
    /// Keys that need processing, with the time they were added (for
    /// `queue_duration`). A key both here and in `processing` is re-queued
    /// on `done`.
    pub(super) dirty: HashMap<K, Instant>,
    /// Keys handed to a worker, with the time `get` returned them.
    pub(super) processing: HashMap<K, Instant>,
    pub(super) waiting: Waiting<K>,
    /// The task moving `waiting` keys into the queue, started on first use.
    pub(super) timer: Option<tokio::task::JoinHandle<()>>,
    pub(super) shutting_down: bool,
}

impl<K: Clone + Eq + Hash> State<K> {
    /// Marks `key` dirty; returns whether it was queued (a getter should be
    /// woken).
    pub(super) fn add(&mut self, key: K, metrics: &Metrics) -> bool {
        if self.shutting_down || self.dirty.contains_key(&key) {
            return false;
        }
        metrics.adds.inc();
        let queued = !self.processing.contains_key(&key);
        if queued {
            self.queue.push_back(key.clone());
        }
        self.dirty.insert(key, Instant::now());
        metrics.depth.set(gauge_value(self.dirty.len()));
        queued
    }

    /// Seconds spent so far by all in-flight keys, and by the longest one.
    pub(super) fn in_progress(&self, now: Instant) -> (f64, f64) {
        self.processing
            .values()
            .map(|started| now.saturating_duration_since(*started).as_secs_f64())
            .fold((0.0, 0.0), |(total, longest), secs| {
                (total + secs, f64::max(longest, secs))
            })
    }
}

pub(super) fn gauge_value(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

pub(super) struct Inner<K> {
    pub(super) name: String,
    pub(super) state: Mutex<State<K>>,
    pub(super) limiter: Mutex<RateLimiter<K>>,
    /// Signalled when a key is queued (one waiter) or on shutdown (all).
    pub(super) ready: Notify,
    /// Signalled when the last in-flight key is done.
    pub(super) idle: Notify,
    /// Wakes the delay timer task: new earliest deadline, shutdown, or drop.
    /// Shared separately because the task holds only a `Weak<Inner>`.
    pub(super) timer_wake: Arc<Notify>,
    pub(super) metrics: Metrics,
}

impl<K> Drop for Inner<K> {
    fn drop(&mut self) {
        // Lets the timer task notice that the queue is gone and exit.
        self.timer_wake.notify_one();
    }
}

/// Exposes a queue's metrics; computes the in-progress gauges at scrape time
/// so they are always current without a background ticker.
pub(super) struct QueueCollector<K> {
    pub(super) metrics: Metrics,
    /// Weak, so a registry outliving the queue does not keep it alive.
    pub(super) queue: Weak<Inner<K>>,
}

impl<K> Collector for QueueCollector<K>
where
    K: Clone + Eq + Hash + Send + Sync + Debug + 'static,
{
    fn desc(&self) -> Vec<&Desc> {
        let m = &self.metrics;
        [
            m.depth.desc(),
            m.adds.desc(),
            m.queue_duration.desc(),
            m.work_duration.desc(),
            m.unfinished_work.desc(),
            m.longest_running.desc(),
            m.retries.desc(),
        ]
        .concat()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let m = &self.metrics;
        let (total, longest) = self.queue.upgrade().map_or((0.0, 0.0), |inner| {
            lock(&inner.state).in_progress(Instant::now())
        });
        m.unfinished_work.set(total);
        m.longest_running.set(longest);
        [
            m.depth.collect(),
            m.adds.collect(),
            m.queue_duration.collect(),
            m.work_duration.collect(),
            m.unfinished_work.collect(),
            m.longest_running.collect(),
            m.retries.collect(),
        ]
        .concat()
    }
}
