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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry};
use tokio::sync::Notify;

/// Locks a mutex, ignoring poisoning: the critical sections only make small
/// map and queue updates, so a panic elsewhere (e.g. in a worker holding no
/// lock of ours) must not make the whole queue unusable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------
// Rate limiting
// ---------------------------------------------------------------------------

/// An overall token bucket with *reservation* semantics: every call takes the
/// next token, even one that is not there yet, and reports how long to wait
/// for it. With 10 qps and a burst of 100, the 101st call at one instant waits
/// 100 ms, the 102nd 200 ms, and so on (like `rate.Limiter.Reserve`).
///
/// Time is passed in, so the arithmetic is exact and testable.
#[derive(Debug, Clone)]
pub struct TokenBucket {
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
    pub fn new(qps: u32, burst: u32) -> Self {
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
    pub fn reserve_at(&mut self, now: Instant) -> Duration {
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
pub struct RateLimiter<K> {
    base_delay: Duration,
    max_delay: Duration,
    /// Failures per key since the last `forget`.
    failures: HashMap<K, u32>,
    bucket: Option<TokenBucket>,
}

impl<K: Clone + Eq + Hash> RateLimiter<K> {
    /// The controller default: `max(5 ms * 2^failures capped at 1000 s,
    /// token bucket of 10 qps with a burst of 100)`.
    pub fn default_controller() -> Self {
        Self::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
            Some(TokenBucket::new(10, 100)),
        )
    }

    /// Per-key backoff `base_delay * 2^failures`, capped at `max_delay`,
    /// combined with `bucket` if given.
    pub fn new(base_delay: Duration, max_delay: Duration, bucket: Option<TokenBucket>) -> Self {
        Self {
            base_delay,
            max_delay,
            failures: HashMap::new(),
            bucket,
        }
    }

    /// How long `key` should wait now; counts one more failure for it.
    pub fn when(&mut self, key: &K) -> Duration {
        self.when_at(key, Instant::now())
    }

    /// [`when`](Self::when) at a given instant (only the token bucket looks
    /// at time).
    pub fn when_at(&mut self, key: &K, now: Instant) -> Duration {
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
    pub fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// How many times `key` failed since the last [`forget`](Self::forget).
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

/// The client-go workqueue metrics of one queue. Each metric carries the
/// queue name as a constant `name` label: descriptors then differ per queue,
/// so several queues can share a registry, while registering the same name
/// twice is rejected by the registry instead of silently mixing values.
#[derive(Clone)]
struct Metrics {
    depth: IntGauge,
    adds: IntCounter,
    queue_duration: Histogram,
    work_duration: Histogram,
    unfinished_work: Gauge,
    longest_running: Gauge,
    retries: IntCounter,
}

impl Metrics {
    fn new(queue: &str) -> Self {
        const VALID: &str = "constant metric definition is valid";
        let opts = |name: &str, help: &str| {
            Opts::new(name, help)
                .subsystem("workqueue")
                .const_label("name", queue)
        };
        let histogram = |name: &str, help: &str| {
            // Repeated multiplication, as client-go does, so the `le` labels
            // come out identical (including 9.999999999999999e-06).
            let buckets = prometheus::exponential_buckets(1e-8, 10.0, 10).expect(VALID);
            let opts = HistogramOpts::new(name, help)
                .subsystem("workqueue")
                .const_label("name", queue)
                .buckets(buckets);
            Histogram::with_opts(opts).expect(VALID)
        };
        Self {
            depth: IntGauge::with_opts(opts("depth", "Current depth of workqueue")).expect(VALID),
            adds: IntCounter::with_opts(opts(
                "adds_total",
                "Total number of adds handled by workqueue",
            ))
            .expect(VALID),
            queue_duration: histogram(
                "queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested.",
            ),
            work_duration: histogram(
                "work_duration_seconds",
                "How long in seconds processing an item from workqueue takes.",
            ),
            unfinished_work: Gauge::with_opts(opts(
                "unfinished_work_seconds",
                "How many seconds of work has done that is in progress and hasn't been \
                 observed by work_duration. Large values indicate stuck threads. One can \
                 deduce the number of stuck threads by observing the rate at which this \
                 increases.",
            ))
            .expect(VALID),
            longest_running: Gauge::with_opts(opts(
                "longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
            ))
            .expect(VALID),
            retries: IntCounter::with_opts(opts(
                "retries_total",
                "Total number of retries handled by workqueue",
            ))
            .expect(VALID),
        }
    }
}

/// Exposes a queue's metrics; computes the in-progress gauges at scrape time
/// so they are always current without a background ticker.
struct QueueCollector<K> {
    metrics: Metrics,
    /// Weak, so a registry outliving the queue does not keep it alive.
    queue: Weak<Inner<K>>,
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

// ---------------------------------------------------------------------------
// Queue state
// ---------------------------------------------------------------------------

/// Keys waiting for their `add_after` delay. One entry per key, the earliest
/// ready time wins; ordered by time so the timer only looks at the front.
struct Waiting<K> {
    by_key: HashMap<K, (tokio::time::Instant, u64)>,
    /// `(ready_at, sequence)`: the sequence number keeps entries with equal
    /// times distinct without requiring `K: Ord`.
    timeline: BTreeMap<(tokio::time::Instant, u64), K>,
    next_seq: u64,
}

impl<K: Clone + Eq + Hash> Waiting<K> {
    fn new() -> Self {
        Self {
            by_key: HashMap::new(),
            timeline: BTreeMap::new(),
            next_seq: 0,
        }
    }

    fn insert(&mut self, key: K, ready_at: tokio::time::Instant) {
        if let Some(&(existing, seq)) = self.by_key.get(&key) {
            if existing <= ready_at {
                return;
            }
            self.timeline.remove(&(existing, seq));
        }
        let slot = (ready_at, self.next_seq);
        self.next_seq += 1;
        self.timeline.insert(slot, key.clone());
        self.by_key.insert(key, slot);
    }

    /// Removes and returns the keys whose time has come.
    fn pop_due(&mut self, now: tokio::time::Instant) -> Vec<K> {
        let mut due = Vec::new();
        while let Some(entry) = self.timeline.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.by_key.remove(&key);
            due.push(key);
        }
        due
    }

    fn next_ready_at(&self) -> Option<tokio::time::Instant> {
        self.timeline.first_key_value().map(|(&(at, _), _)| at)
    }

    fn clear(&mut self) {
        self.by_key.clear();
        self.timeline.clear();
    }
}

struct State<K> {
    /// Keys ready to be handed out, in order; never contains a key that is
    /// being processed.
    queue: VecDeque<K>,
    /// Keys that need processing, with the time they were added (for
    /// `queue_duration`). A key both here and in `processing` is re-queued
    /// on `done`.
    dirty: HashMap<K, Instant>,
    /// Keys handed to a worker, with the time `get` returned them.
    processing: HashMap<K, Instant>,
    waiting: Waiting<K>,
    /// The task moving `waiting` keys into the queue, started on first use.
    timer: Option<tokio::task::JoinHandle<()>>,
    shutting_down: bool,
}

impl<K: Clone + Eq + Hash> State<K> {
    /// Marks `key` dirty; returns whether it was queued (a getter should be
    /// woken).
    fn add(&mut self, key: K, metrics: &Metrics) -> bool {
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
    fn in_progress(&self, now: Instant) -> (f64, f64) {
        self.processing
            .values()
            .map(|started| now.saturating_duration_since(*started).as_secs_f64())
            .fold((0.0, 0.0), |(total, longest), secs| {
                (total + secs, f64::max(longest, secs))
            })
    }
}

fn gauge_value(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

struct Inner<K> {
    name: String,
    state: Mutex<State<K>>,
    limiter: Mutex<RateLimiter<K>>,
    /// Signalled when a key is queued (one waiter) or on shutdown (all).
    ready: Notify,
    /// Signalled when the last in-flight key is done.
    idle: Notify,
    /// Wakes the delay timer task: new earliest deadline, shutdown, or drop.
    /// Shared separately because the task holds only a `Weak<Inner>`.
    timer_wake: Arc<Notify>,
    metrics: Metrics,
}

impl<K> Drop for Inner<K> {
    fn drop(&mut self) {
        // Lets the timer task notice that the queue is gone and exit.
        self.timer_wake.notify_one();
    }
}

// ---------------------------------------------------------------------------
// The queue
// ---------------------------------------------------------------------------

/// A deduplicating, rate-limited work queue of keys `K`.
///
/// Cheap to clone; all clones share the same queue. Workers loop on
/// [`get`](Self::get), process the key, and must call [`done`](Self::done)
/// for it, followed by [`forget`](Self::forget) on success or
/// [`add_rate_limited`](Self::add_rate_limited) on failure.
pub struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K> Debug for WorkQueue<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.inner.state);
        f.debug_struct("WorkQueue")
            .field("name", &self.inner.name)
            .field("queued", &state.queue.len())
            .field("processing", &state.processing.len())
            .field("waiting", &state.waiting.by_key.len())
            .field("shutting_down", &state.shutting_down)
            .finish()
    }
}

impl<K> WorkQueue<K>
where
    K: Clone + Eq + Hash + Send + Sync + Debug + 'static,
{
    /// A queue with [`RateLimiter::default_controller`], its metrics
    /// registered in `registry` if given. If registration fails (e.g. a
    /// queue of the same name is already registered), a warning is logged
    /// and the queue works without exported metrics.
    pub fn new(name: &str, registry: Option<&Registry>) -> Self {
        Self::with_rate_limiter(name, registry, RateLimiter::default_controller())
    }

    /// Like [`new`](Self::new), with a custom rate limiter.
    pub fn with_rate_limiter(
        name: &str,
        registry: Option<&Registry>,
        limiter: RateLimiter<K>,
    ) -> Self {
        let queue = Self::build(name, limiter);
        if let Some(registry) = registry
            && let Err(error) = queue.register(registry)
        {
            tracing::warn!(queue = name, %error, "workqueue metrics not registered");
        }
        queue
    }

    /// Like [`new`](Self::new), but fails if the metrics cannot be
    /// registered.
    pub fn try_new(name: &str, registry: Option<&Registry>) -> prometheus::Result<Self> {
        Self::try_with_rate_limiter(name, registry, RateLimiter::default_controller())
    }

    /// Like [`with_rate_limiter`](Self::with_rate_limiter), but fails if the
    /// metrics cannot be registered (`prometheus::Error::AlreadyReg` for a
    /// name already registered in `registry`).
    pub fn try_with_rate_limiter(
        name: &str,
        registry: Option<&Registry>,
        limiter: RateLimiter<K>,
    ) -> prometheus::Result<Self> {
        let queue = Self::build(name, limiter);
        if let Some(registry) = registry {
            queue.register(registry)?;
        }
        Ok(queue)
    }

    fn build(name: &str, limiter: RateLimiter<K>) -> Self {
        let inner = Inner {
            name: name.to_owned(),
            state: Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashMap::new(),
                processing: HashMap::new(),
                waiting: Waiting::new(),
                timer: None,
                shutting_down: false,
            }),
            limiter: Mutex::new(limiter),
            ready: Notify::new(),
            idle: Notify::new(),
            timer_wake: Arc::new(Notify::new()),
            metrics: Metrics::new(name),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(QueueCollector {
            metrics: self.inner.metrics.clone(),
            queue: Arc::downgrade(&self.inner),
        }))
    }

    /// The queue name (the `name` label of its metrics).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Queues `key` unless it is already queued; if it is being processed,
    /// it is queued again once [`done`](Self::done) is called. Ignored after
    /// shutdown.
    pub fn add(&self, key: K) {
        let queued = lock(&self.inner.state).add(key, &self.inner.metrics);
        if queued {
            self.inner.ready.notify_one();
        }
    }

    /// Adds `key` once `delay` has passed (zero: right away). If the key is
    /// already waiting, the earlier of the two times is kept. Ignored after
    /// shutdown.
    ///
    /// A non-zero delay must be requested from within a Tokio runtime: the
    /// first one starts the queue's timer task.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        // A delay too large for the clock is as good as never.
        let Some(ready_at) = tokio::time::Instant::now().checked_add(delay) else {
            return;
        };
        let mut state = lock(&self.inner.state);
        if state.shutting_down {
            return;
        }
        state.waiting.insert(key, ready_at);
        // (Re)start the timer if it never ran or its runtime went away;
        // under the lock, so concurrent callers start only one.
        if state.timer.as_ref().is_none_or(|task| task.is_finished()) {
            state.timer = Some(tokio::spawn(run_timer(
                Arc::downgrade(&self.inner),
                Arc::clone(&self.inner.timer_wake),
            )));
        } else {
            drop(state);
            // The new key may be due before the timer's current deadline.
            self.inner.timer_wake.notify_one();
        }
    }

    /// Adds `key` after the delay the rate limiter assigns to it, and counts
    /// a retry. Ignored after shutdown.
    pub fn add_rate_limited(&self, key: K) {
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

    /// How often `key` was rate-limited since the last
    /// [`forget`](Self::forget).
    pub fn num_requeues(&self, key: &K) -> u32 {
        lock(&self.inner.limiter).num_requeues(key)
    }

    /// Waits for the next key and marks it as being processed; the caller
    /// must call [`done`](Self::done) for it. Returns `None` once the queue
    /// is shut down, even if keys are still queued.
    ///
    /// Cancel-safe: a key is only taken when the future completes.
    pub async fn get(&self) -> Option<K> {
        loop {
            // Register interest before looking, so a key queued between the
            // look and the wait still wakes this getter.
            let mut notified = pin!(self.inner.ready.notified());
            notified.as_mut().enable();
            {
                let mut state = lock(&self.inner.state);
                if state.shutting_down {
                    return None;
                }
                if let Some(key) = state.queue.pop_front() {
                    let now = Instant::now();
                    let metrics = &self.inner.metrics;
                    if let Some(added) = state.dirty.remove(&key) {
                        metrics
                            .queue_duration
                            .observe(now.saturating_duration_since(added).as_secs_f64());
                    }
                    metrics.depth.set(gauge_value(state.dirty.len()));
                    state.processing.insert(key.clone(), now);
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Marks `key` as processed. If it was added while being processed, it
    /// is queued again. Unknown keys are ignored.
    pub fn done(&self, key: &K) {
        let (requeued, idle) = {
            let mut state = lock(&self.inner.state);
            let Some(started) = state.processing.remove(key) else {
                return;
            };
            self.inner
                .metrics
                .work_duration
                .observe(started.elapsed().as_secs_f64());
            // Still dirty: it was added during processing and must run again.
            // (After shutdown it stays put, `get` hands nothing out anyway.)
            let requeued = state.dirty.contains_key(key) && !state.shutting_down;
            if requeued {
                state.queue.push_back(key.clone());
            }
            (requeued, state.processing.is_empty())
        };
        if requeued {
            self.inner.ready.notify_one();
        }
        if idle {
            self.inner.idle.notify_waiters();
        }
    }

    /// Stops the queue: later adds are ignored, pending delays are dropped,
    /// and every current and future [`get`](Self::get) returns `None`. Keys
    /// in flight may still be marked [`done`](Self::done); use
    /// [`wait_idle`](Self::wait_idle) to wait for them.
    pub fn shut_down(&self) {
        {
            let mut state = lock(&self.inner.state);
            state.shutting_down = true;
            state.waiting.clear();
        }
        self.inner.ready.notify_waiters();
        self.inner.timer_wake.notify_one();
    }

    /// Whether [`shut_down`](Self::shut_down) was called.
    pub fn is_shutting_down(&self) -> bool {
        lock(&self.inner.state).shutting_down
    }

    /// Resolves once no key is being processed (immediately if none is).
    /// Bound it with `tokio::time::timeout` when draining on shutdown.
    pub async fn wait_idle(&self) {
        loop {
            let mut notified = pin!(self.inner.idle.notified());
            notified.as_mut().enable();
            if lock(&self.inner.state).processing.is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// Number of keys queued and ready to be handed out (neither those being
    /// processed nor those waiting for a delay).
    pub fn len(&self) -> usize {
        lock(&self.inner.state).queue.len()
    }

    /// Whether no key is ready to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Moves keys whose `add_after` delay has passed into the queue. Holds only a
/// weak reference, so dropping every handle ends it; shutdown ends it too.
async fn run_timer<K>(queue: Weak<Inner<K>>, wake: Arc<Notify>)
where
    K: Clone + Eq + Hash + Send + Sync + Debug + 'static,
{
    loop {
        let next = {
            let Some(inner) = queue.upgrade() else {
                return;
            };
            let (due, next) = {
                let mut state = lock(&inner.state);
                if state.shutting_down {
                    return;
                }
                let due = state.waiting.pop_due(tokio::time::Instant::now());
                (due, state.waiting.next_ready_at())
            };
            let handle = WorkQueue { inner };
            for key in due {
                handle.add(key);
            }
            next
        };
        // `notify_one` stores a permit when nobody waits, so a wake-up sent
        // while the keys above were being added is not lost.
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use tokio::time::timeout;

    const SHORT: Duration = Duration::from_millis(50);
    const LONG: Duration = Duration::from_secs(5);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A queue without token bucket, so delays are exactly the backoff.
    fn queue(name: &str, registry: Option<&Registry>) -> WorkQueue<String> {
        let limiter = RateLimiter::new(ms(5), Duration::from_secs(1000), None);
        WorkQueue::try_with_rate_limiter(name, registry, limiter).unwrap()
    }

    /// `get`, but failing the test instead of hanging.
    async fn get_soon(q: &WorkQueue<String>) -> Option<String> {
        timeout(LONG, q.get()).await.expect("get timed out")
    }

    /// Whether `get` yields nothing within a short while.
    async fn nothing_soon(q: &WorkQueue<String>) -> bool {
        timeout(SHORT, q.get()).await.is_err()
    }

    fn family<'a>(families: &'a [MetricFamily], name: &str) -> &'a MetricFamily {
        families
            .iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("metric {name} missing"))
    }

    /// The sample of `metric` labelled `name=queue`.
    fn sample<'a>(
        families: &'a [MetricFamily],
        metric: &str,
        queue: &str,
    ) -> &'a prometheus::proto::Metric {
        family(families, metric)
            .get_metric()
            .iter()
            .find(|m| {
                let labels = m.get_label();
                labels.len() == 1 && labels[0].name() == "name" && labels[0].value() == queue
            })
            .unwrap_or_else(|| panic!("{metric}{{name={queue:?}}} missing"))
    }

    #[tokio::test]
    async fn adding_a_key_repeatedly_queues_it_once() {
        let registry = Registry::new();
        let q = queue("dedup", Some(&registry));
        for _ in 0..3 {
            q.add("a".to_owned());
        }
        assert_eq!(q.len(), 1);
        let families = registry.gather();
        assert_eq!(
            sample(&families, "workqueue_depth", "dedup")
                .get_gauge()
                .get_value(),
            1.0
        );
        assert_eq!(get_soon(&q).await.as_deref(), Some("a"));
        assert!(nothing_soon(&q).await);
    }

    #[tokio::test]
    async fn a_key_in_processing_is_not_handed_to_a_second_worker() {
        let q = queue("exclusive", None);
        q.add("a".to_owned());
        assert_eq!(get_soon(&q).await.as_deref(), Some("a"));
        q.add("a".to_owned());
        // Dirty but not ready while the first worker still has it.
        assert_eq!(q.len(), 0);
        assert!(nothing_soon(&q).await);
    }

    #[tokio::test]
    async fn adds_during_processing_requeue_once_after_done() {
        let q = queue("requeue", None);
        q.add("a".to_owned());
        let key = get_soon(&q).await.unwrap();
        q.add("a".to_owned());
        q.add("a".to_owned());
        q.done(&key);
        assert_eq!(q.len(), 1);
        let again = get_soon(&q).await.unwrap();
        assert_eq!(again, "a");
        q.done(&again);
        assert!(nothing_soon(&q).await);
        // Done without a new add: nothing comes back.
        assert_eq!(q.len(), 0);
    }

    #[tokio::test]
    async fn a_requeue_on_done_wakes_a_waiting_worker() {
        let q = queue("requeue_wake", None);
        q.add("a".to_owned());
        let key = get_soon(&q).await.unwrap();
        let other_worker = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        q.add("a".to_owned());
        tokio::time::sleep(SHORT).await;
        assert!(!other_worker.is_finished());
        q.done(&key);
        let got = timeout(LONG, other_worker).await.unwrap().unwrap();
        assert_eq!(got.as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn done_for_an_unknown_key_is_ignored() {
        let q = queue("unknown", None);
        q.done(&"ghost".to_owned());
        q.add("a".to_owned());
        assert_eq!(get_soon(&q).await.as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn a_waiting_getter_is_woken_by_add() {
        let q = queue("wake", None);
        let getter = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        tokio::time::sleep(SHORT).await;
        q.add("a".to_owned());
        let got = timeout(LONG, getter).await.unwrap().unwrap();
        assert_eq!(got.as_deref(), Some("a"));
    }

    // The crate's tokio has no `test-util`, so these use real, short delays
    // with generous margins instead of a paused clock.
    #[tokio::test]
    async fn add_after_delivers_after_the_delay() {
        let q = queue("after", None);
        q.add_after("now".to_owned(), Duration::ZERO);
        assert_eq!(q.len(), 1);
        assert_eq!(get_soon(&q).await.as_deref(), Some("now"));

        let start = Instant::now();
        q.add_after("later".to_owned(), ms(200));
        tokio::time::sleep(ms(50)).await;
        assert_eq!(q.len(), 0);
        assert_eq!(get_soon(&q).await.as_deref(), Some("later"));
        assert!(start.elapsed() >= ms(200), "{:?}", start.elapsed());
    }

    #[tokio::test]
    async fn add_after_keeps_the_earliest_time_per_key() {
        let q = queue("earliest", None);
        let waiting = |q: &WorkQueue<String>| lock(&q.inner.state).waiting.by_key.len();

        q.add_after("a".to_owned(), Duration::from_secs(3600));
        q.add_after("a".to_owned(), ms(20));
        assert_eq!(waiting(&q), 1);
        assert_eq!(get_soon(&q).await.as_deref(), Some("a"));
        // The hour-long entry was replaced, not kept alongside.
        assert_eq!(waiting(&q), 0);

        q.add_after("b".to_owned(), ms(20));
        q.add_after("b".to_owned(), Duration::from_secs(3600));
        assert_eq!(get_soon(&q).await.as_deref(), Some("b"));
        assert_eq!(waiting(&q), 0);
    }

    #[tokio::test]
    async fn add_after_orders_keys_by_ready_time() {
        let q = queue("order", None);
        q.add_after("second".to_owned(), ms(120));
        q.add_after("first".to_owned(), ms(40));
        assert_eq!(get_soon(&q).await.as_deref(), Some("first"));
        assert_eq!(get_soon(&q).await.as_deref(), Some("second"));
    }

    #[test]
    fn delays_still_fire_after_the_runtime_that_started_the_timer_is_gone() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let q = queue("two_runtimes", None);
        runtime().block_on(async { q.add_after("a".to_owned(), Duration::from_secs(3600)) });
        runtime().block_on(async {
            q.add_after("b".to_owned(), ms(20));
            assert_eq!(get_soon(&q).await.as_deref(), Some("b"));
        });
    }

    #[tokio::test]
    async fn add_rate_limited_backs_off_and_forget_resets() {
        let registry = Registry::new();
        let q = queue("retry", Some(&registry));
        let key = "a".to_owned();
        for expected in 1..=3 {
            q.add_rate_limited(key.clone());
            assert_eq!(q.num_requeues(&key), expected);
            let got = get_soon(&q).await.unwrap();
            q.done(&got);
        }
        // 5 ms, 10 ms, 20 ms went by; the next one would be 40 ms.
        assert_eq!(lock(&q.inner.limiter).when(&key), ms(40));
        q.forget(&key);
        assert_eq!(q.num_requeues(&key), 0);
        assert_eq!(lock(&q.inner.limiter).when(&key), ms(5));

        let families = registry.gather();
        let retries = sample(&families, "workqueue_retries_total", "retry");
        assert_eq!(retries.get_counter().get_value(), 3.0);
    }

    #[test]
    fn backoff_doubles_per_failure_from_5ms() {
        let mut limiter = RateLimiter::new(ms(5), Duration::from_secs(1000), None);
        let now = Instant::now();
        let delays: Vec<_> = (0..5).map(|_| limiter.when_at(&"a", now)).collect();
        assert_eq!(delays, [ms(5), ms(10), ms(20), ms(40), ms(80)]);
        assert_eq!(limiter.num_requeues(&"a"), 5);
        // Keys back off independently.
        assert_eq!(limiter.when_at(&"b", now), ms(5));
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(limiter.when_at(&"a", now), ms(5));
    }

    #[test]
    fn backoff_is_capped_and_never_overflows() {
        let cap = Duration::from_secs(1000);
        let mut limiter = RateLimiter::new(ms(5), cap, None);
        let now = Instant::now();
        let delays: Vec<_> = (0..300).map(|_| limiter.when_at(&"a", now)).collect();
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert!(delays.iter().all(|d| *d <= cap));
        // 5 ms * 2^18 = 1310.72 s is the first one over the cap.
        assert!(delays[17] < cap);
        assert_eq!(delays[18], cap);
        assert_eq!(delays[299], cap);

        limiter.failures.insert("a", u32::MAX);
        assert_eq!(limiter.when_at(&"a", now), cap);
        assert_eq!(limiter.num_requeues(&"a"), u32::MAX);

        // Base times factor overflowing `Duration` also ends at the cap.
        let mut huge = RateLimiter::new(Duration::MAX, cap, None);
        assert_eq!(huge.when_at(&"a", now), cap);
        assert_eq!(huge.when_at(&"a", now), cap);
    }

    #[test]
    fn token_bucket_reserves_tokens_it_does_not_have_yet() {
        let mut bucket = TokenBucket::new(10, 100);
        let t0 = Instant::now();
        for call in 1..=100 {
            assert_eq!(bucket.reserve_at(t0), Duration::ZERO, "call {call}");
        }
        assert_eq!(bucket.reserve_at(t0), ms(100));
        assert_eq!(bucket.reserve_at(t0), ms(200));
        assert_eq!(bucket.reserve_at(t0), ms(300));
    }

    #[test]
    fn token_bucket_refills_at_its_rate_up_to_the_burst() {
        let mut bucket = TokenBucket::new(10, 100);
        let t0 = Instant::now();
        for _ in 0..100 {
            bucket.reserve_at(t0);
        }
        // One second earns ten tokens.
        let t1 = t0 + Duration::from_secs(1);
        for call in 1..=10 {
            assert_eq!(bucket.reserve_at(t1), Duration::ZERO, "call {call}");
        }
        assert_eq!(bucket.reserve_at(t1), ms(100));

        // A long pause refills no more than the burst.
        let t2 = t1 + Duration::from_secs(3600);
        for _ in 0..100 {
            assert_eq!(bucket.reserve_at(t2), Duration::ZERO);
        }
        assert_eq!(bucket.reserve_at(t2), ms(100));
    }

    #[test]
    fn default_controller_limiter_is_the_max_of_backoff_and_bucket() {
        let mut limiter = RateLimiter::default_controller();
        let now = Instant::now();
        // 100 different keys: the bucket has tokens, the backoff decides.
        for key in 0..100 {
            assert_eq!(limiter.when_at(&key, now), ms(5));
        }
        // The 101st call waits for a token.
        assert_eq!(limiter.when_at(&100, now), ms(100));
        assert_eq!(limiter.when_at(&101, now), ms(200));
        // Later, a key with many failures is dominated by its backoff.
        let later = now + Duration::from_secs(3600);
        for _ in 0..9 {
            limiter.when_at(&7, later);
        }
        assert_eq!(limiter.when_at(&7, later), ms(5 * 1024));
    }

    #[tokio::test]
    async fn shut_down_stops_handing_out_work_and_ignores_adds() {
        let q = queue("shutdown", None);
        q.add("a".to_owned());
        q.add("b".to_owned());
        let in_flight = get_soon(&q).await.unwrap();

        q.shut_down();
        assert!(q.is_shutting_down());
        // "b" is still queued, but no new work is taken.
        assert_eq!(get_soon(&q).await, None);
        assert_eq!(q.len(), 1);
        q.add("c".to_owned());
        q.add_after("d".to_owned(), ms(1));
        q.add_rate_limited("e".to_owned());
        assert_eq!(q.len(), 1);
        assert_eq!(q.num_requeues(&"e".to_owned()), 0);

        // wait_idle resolves only once the in-flight key is done.
        assert!(timeout(SHORT, q.wait_idle()).await.is_err());
        let worker = q.clone();
        tokio::spawn(async move {
            tokio::time::sleep(SHORT).await;
            worker.done(&in_flight);
        });
        timeout(LONG, q.wait_idle()).await.expect("never idle");
        assert_eq!(get_soon(&q).await, None);
    }

    #[tokio::test]
    async fn shut_down_wakes_waiting_getters() {
        let q = queue("wake_on_shutdown", None);
        let getters: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move { q.get().await })
            })
            .collect();
        tokio::time::sleep(SHORT).await;
        q.shut_down();
        for getter in getters {
            assert_eq!(timeout(LONG, getter).await.unwrap().unwrap(), None);
        }
    }

    #[tokio::test]
    async fn wait_idle_is_immediate_without_work_in_flight() {
        let q = queue("idle", None);
        q.add("queued-but-not-taken".to_owned());
        timeout(SHORT, q.wait_idle()).await.expect("not idle");
    }

    #[tokio::test]
    async fn dropping_the_queue_frees_it_despite_pending_delays() {
        let q = queue("drop", None);
        q.add_after("a".to_owned(), Duration::from_secs(3600));
        let inner = Arc::downgrade(&q.inner);
        tokio::task::yield_now().await;
        drop(q);
        assert!(inner.upgrade().is_none());
    }

    #[tokio::test]
    async fn metrics_follow_client_go() {
        let registry = Registry::new();
        let q = queue("resource_claim", Some(&registry));
        for key in ["a", "b", "a", "c"] {
            q.add(key.to_owned());
        }
        let a = get_soon(&q).await.unwrap();
        let b = get_soon(&q).await.unwrap();
        tokio::time::sleep(SHORT).await;

        let families = registry.gather();
        let value = |metric: &str| sample(&families, metric, "resource_claim");
        assert_eq!(value("workqueue_depth").get_gauge().get_value(), 1.0);
        assert_eq!(value("workqueue_adds_total").get_counter().get_value(), 3.0);
        let queued = value("workqueue_queue_duration_seconds").get_histogram();
        assert_eq!(queued.get_sample_count(), 2);
        let unfinished = value("workqueue_unfinished_work_seconds")
            .get_gauge()
            .get_value();
        let longest = value("workqueue_longest_running_processor_seconds")
            .get_gauge()
            .get_value();
        // Two keys in flight for at least SHORT each.
        assert!(longest >= SHORT.as_secs_f64(), "{longest}");
        assert!(unfinished >= 2.0 * SHORT.as_secs_f64(), "{unfinished}");
        assert!(unfinished >= longest);

        q.done(&a);
        q.done(&b);
        let families = registry.gather();
        let value = |metric: &str| sample(&families, metric, "resource_claim");
        let worked = value("workqueue_work_duration_seconds").get_histogram();
        assert_eq!(worked.get_sample_count(), 2);
        assert!(worked.get_sample_sum() >= 2.0 * SHORT.as_secs_f64());
        assert_eq!(
            value("workqueue_unfinished_work_seconds")
                .get_gauge()
                .get_value(),
            0.0
        );
        assert_eq!(
            value("workqueue_longest_running_processor_seconds")
                .get_gauge()
                .get_value(),
            0.0
        );
        assert_eq!(
            value("workqueue_retries_total").get_counter().get_value(),
            0.0
        );

        // Bucket bounds exactly as kube-controller-manager's workqueues
        // have them, `ExponentialBuckets(10e-9, 10, 10)`: 1e-8 times 10,
        // nine times, computed by repeated multiplication.
        let expected = [
            1e-8,
            1e-7,
            1e-6,
            9.999999999999999e-6,
            9.999999999999999e-5,
            1e-3,
            1e-2,
            1e-1,
            1.0,
            10.0,
        ];
        for metric in [
            "workqueue_queue_duration_seconds",
            "workqueue_work_duration_seconds",
        ] {
            let bounds: Vec<f64> = value(metric)
                .get_histogram()
                .get_bucket()
                .iter()
                .map(|b| b.upper_bound())
                .collect();
            assert_eq!(bounds, expected, "{metric}");
        }

        assert_eq!(
            family(&families, "workqueue_depth").help(),
            "Current depth of workqueue"
        );
        assert_eq!(
            family(&families, "workqueue_unfinished_work_seconds").help(),
            "How many seconds of work has done that is in progress and hasn't been observed \
             by work_duration. Large values indicate stuck threads. One can deduce the number \
             of stuck threads by observing the rate at which this increases."
        );
        assert_eq!(
            family(&families, "workqueue_longest_running_processor_seconds").help(),
            "How many seconds has the longest running processor for workqueue been running."
        );
        let names: HashSet<_> = families.iter().map(|f| f.name()).collect();
        let expected_names: HashSet<_> = [
            "workqueue_depth",
            "workqueue_adds_total",
            "workqueue_queue_duration_seconds",
            "workqueue_work_duration_seconds",
            "workqueue_unfinished_work_seconds",
            "workqueue_longest_running_processor_seconds",
            "workqueue_retries_total",
        ]
        .into();
        assert_eq!(names, expected_names);
    }

    #[tokio::test]
    async fn queues_share_a_registry_by_name() {
        let registry = Registry::new();
        let claims = queue("resource_claim", Some(&registry));
        let pods = queue("pod", Some(&registry));
        claims.add("a".to_owned());
        claims.add("b".to_owned());
        pods.add("x".to_owned());

        let families = registry.gather();
        let depth = |queue: &str| {
            sample(&families, "workqueue_depth", queue)
                .get_gauge()
                .get_value()
        };
        assert_eq!(depth("resource_claim"), 2.0);
        assert_eq!(depth("pod"), 1.0);

        // The same name twice is refused, not merged or panicking.
        let duplicate = WorkQueue::<String>::try_new("pod", Some(&registry));
        assert!(matches!(duplicate, Err(prometheus::Error::AlreadyReg)));
        // The infallible constructor still yields a working queue.
        let unregistered = WorkQueue::<String>::new("pod", Some(&registry));
        unregistered.add("y".to_owned());
        assert_eq!(get_soon(&unregistered).await.as_deref(), Some("y"));
        let families = registry.gather();
        assert_eq!(
            sample(&families, "workqueue_depth", "pod")
                .get_gauge()
                .get_value(),
            1.0
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_workers_never_share_a_key_and_miss_no_add() {
        const KEYS: usize = 200;
        const WORKERS: usize = 8;
        const ADDERS: usize = 16;
        const ROUNDS: usize = 20;

        let q: WorkQueue<usize> =
            WorkQueue::with_rate_limiter("concurrent", None, RateLimiter::new(ms(1), ms(10), None));
        // Per key: how many adds were issued, and the highest such count a
        // worker saw when it started processing the key. A key is covered
        // once some processing started after its last add.
        let issued: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let covered: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let active = Arc::new(Mutex::new(HashSet::new()));
        let overlap = Arc::new(AtomicBool::new(false));

        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (q, issued, covered) = (q.clone(), issued.clone(), covered.clone());
                let (active, overlap) = (active.clone(), overlap.clone());
                tokio::spawn(async move {
                    while let Some(key) = q.get().await {
                        if !lock(&active).insert(key) {
                            overlap.store(true, Ordering::SeqCst);
                        }
                        let seen = issued[key].load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        covered[key].fetch_max(seen, Ordering::SeqCst);
                        lock(&active).remove(&key);
                        q.done(&key);
                    }
                })
            })
            .collect();

        let adders: Vec<_> = (0..ADDERS)
            .map(|adder| {
                let (q, issued) = (q.clone(), issued.clone());
                tokio::spawn(async move {
                    for round in 0..ROUNDS {
                        for i in 0..KEYS {
                            // Each adder walks the keys in its own order.
                            let key = (i * 7 + adder * 13 + round) % KEYS;
                            issued[key].fetch_add(1, Ordering::SeqCst);
                            q.add(key);
                            if i % 16 == 0 {
                                tokio::task::yield_now().await;
                            }
                        }
                    }
                })
            })
            .collect();
        for adder in adders {
            adder.await.unwrap();
        }

        let all_covered = || {
            (0..KEYS).all(|k| covered[k].load(Ordering::SeqCst) == issued[k].load(Ordering::SeqCst))
        };
        timeout(Duration::from_secs(20), async {
            while !all_covered() {
                tokio::time::sleep(ms(10)).await;
            }
        })
        .await
        .expect("some key was not processed after its last add");

        q.shut_down();
        for worker in workers {
            timeout(LONG, worker).await.unwrap().unwrap();
        }
        assert!(!overlap.load(Ordering::SeqCst), "two workers had one key");
        assert_eq!(
            issued.iter().map(|n| n.load(Ordering::SeqCst)).sum::<u64>(),
            (ADDERS * ROUNDS * KEYS) as u64
        );
    }
}
