//! The queue itself (client-go's `queue.go`): the dirty set, one worker
//! per key, re-queue on `done`, shutdown and draining.

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus::Registry;
use tokio::sync::Notify;

use super::default_rate_limiters::RateLimiter;
use super::metrics::Metrics;
use super::shared::{Inner, QueueCollector, State, gauge_value, lock};
use super::waiting::Waiting;

/// A deduplicating, rate-limited work queue of keys `K`.
///
/// Cheap to clone; all clones share the same queue. Workers loop on
/// [`get`](Self::get), process the key, and must call [`done`](Self::done)
/// for it, followed by [`forget`](Self::forget) on success or
/// [`add_rate_limited`](Self::add_rate_limited) on failure.
pub struct WorkQueue<K> {
    pub(super) inner: Arc<Inner<K>>,
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
    pub(crate) fn with_rate_limiter(
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

    #[cfg(test)]
    /// Like [`new`](Self::new), but fails if the metrics cannot be
    /// registered.
    pub(crate) fn try_new(name: &str, registry: Option<&Registry>) -> prometheus::Result<Self> {
        Self::try_with_rate_limiter(name, registry, RateLimiter::default_controller())
    }

    #[cfg(test)]
    /// Like [`with_rate_limiter`](Self::with_rate_limiter), but fails if the
    /// metrics cannot be registered (`prometheus::Error::AlreadyReg` for a
    /// name already registered in `registry`).
    pub(crate) fn try_with_rate_limiter(
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
    pub(crate) fn is_shutting_down(&self) -> bool {
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
