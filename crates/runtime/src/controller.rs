//! One controller shape for every controller of the process (kube-runtime's
//! `Controller`, client-go's controller skeleton): a controller says what a
//! key is, how one key is reconciled, and what it queues when it takes the
//! lead or resyncs (a [`Reconciler`]); the runtime owns everything around
//! that, once: the queue with its reasons ([`Queue`]), N workers, the
//! leader gate (nothing is queued while standing by), the hold through an
//! API server outage, the retry policy ([`crate::retry`]), the jittered
//! resync and the shut-down ([`Controller`]).
//!
//! `app` sees each controller only as a [`Lead`]: start leading, stop
//! taking work, wait for the work in flight.

use std::collections::HashMap;
use std::fmt::{self, Debug, Display};
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tracing::{Instrument, Span, debug};

use crate::error::SyncError;
use crate::reachability::Reachability;
use crate::retry::requeue;
use crate::workqueue::WorkQueue;

#[cfg(test)]
mod tests;

/// What a reconcile asks for once it succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until an event queues the key again.
    Done,
    /// Look again after this long (a grace period, a wait for an object
    /// still being written); the key's failures are forgotten.
    RecheckAfter(Duration),
}

/// Why a key was queued, for the span of its sync: an event of the
/// controller's own kind (`W`), or one of the runtime's reasons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake<W> {
    Event(W),
    /// This replica became leader: everything is swept once.
    Takeover,
    /// The periodic resync.
    Resync,
    /// A wait a sync asked for ([`Action::RecheckAfter`]) is over.
    Recheck,
    /// A sync failed (or got no answer) and is tried again.
    Retry,
}

impl<W: Display> Display for Wake<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wake::Event(why) => why.fmt(f),
            Wake::Takeover => f.write_str("became leader"),
            Wake::Resync => f.write_str("resync"),
            Wake::Recheck => f.write_str("recheck after a wait"),
            Wake::Retry => f.write_str("retry after a failure"),
        }
    }
}

/// When a controller's [`Reconciler::sweep`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// Once, when this replica takes the lead (caches warm).
    Takeover,
    /// At each jittered resync, while leading and synced.
    Resync,
}

impl Sweep {
    /// The reason keys queued by this sweep carry.
    pub fn wake<W>(self) -> Wake<W> {
        match self {
            Sweep::Takeover => Wake::Takeover,
            Sweep::Resync => Wake::Resync,
        }
    }
}

/// What one controller is: its key, the reconcile of one key from its
/// caches, and what it queues when it takes the lead or resyncs.
pub trait Reconciler: Send + Sync + 'static {
    /// One work item (an object's key, or an enum of the kinds it works on).
    type Key: Clone + Eq + Hash + Debug + Send + Sync + 'static;
    /// Why an event queued a key (shown in the sync's span).
    type Why: Display + Send + 'static;

    /// The span of one sync of `key`: every line logged inside it carries
    /// the key, and it says why the key was queued.
    fn span(&self, key: &Self::Key, why: &Wake<Self::Why>) -> Span;

    /// One sync of `key`, from the caches' current state.
    fn reconcile(&self, key: &Self::Key) -> impl Future<Output = Result<Action, SyncError>> + Send;

    /// Queues what needs work (through the controller's [`Queue`]), with
    /// `sweep.wake()` as the reason.
    fn sweep(&self, sweep: Sweep);

    /// Whether the caches it reads hold their first list (a resync of
    /// half-loaded caches would be wasted).
    fn is_synced(&self) -> bool {
        true
    }
}

/// A controller's queue as its event handlers see it: keys are queued only
/// while this replica leads (a standby keeps its caches warm and nothing
/// more), each with the reason it was first queued for. Cheap to clone.
pub struct Queue<K, W> {
    shared: Arc<QueueShared<K, W>>,
}

struct QueueShared<K, W> {
    queue: WorkQueue<K>,
    leading: AtomicBool,
    /// Why each queued key was queued, until a worker takes it (the queue
    /// holds a key once, so the first reason is the one reported).
    reasons: Mutex<HashMap<K, Wake<W>>>,
}

impl<K, W> Clone for Queue<K, W> {
    fn clone(&self) -> Self {
        Queue {
            shared: self.shared.clone(),
        }
    }
}

impl<K, W> Queue<K, W>
where
    K: Clone + Eq + Hash + Debug + Send + Sync + 'static,
    W: Display,
{
    /// A queue named `name` (the `name` label of client-go's `workqueue_*`
    /// metrics, registered in `registry` when given).
    pub fn new(name: &str, registry: Option<&prometheus::Registry>) -> Self {
        Queue {
            shared: Arc::new(QueueShared {
                queue: WorkQueue::new(name, registry),
                leading: AtomicBool::new(false),
                reasons: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Whether this replica leads (and so queues work).
    pub fn is_leading(&self) -> bool {
        self.shared.leading.load(Ordering::Acquire)
    }

    /// Queues `key` because of `why`; nothing while standing by.
    pub fn add(&self, key: K, why: W) {
        self.add_for(key, Wake::Event(why));
    }

    /// Queues `key` for one of the runtime's reasons (a sweep's).
    pub fn add_for(&self, key: K, why: Wake<W>) {
        if !self.is_leading() {
            return;
        }
        self.remember(&key, why);
        self.shared.queue.add(key);
    }

    /// Queues `key` after `delay` (a deadline, a pacing slot).
    pub fn add_after(&self, key: K, delay: Duration, why: W) {
        if !self.is_leading() {
            return;
        }
        self.remember(&key, Wake::Event(why));
        self.shared.queue.add_after(key, delay);
    }

    fn remember(&self, key: &K, why: Wake<W>) {
        self.shared
            .reasons
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_insert(why);
    }

    /// Why `key` was queued; a key with no reason left came back from a
    /// backoff.
    fn take_reason(&self, key: &K) -> Wake<W> {
        self.shared
            .reasons
            .lock()
            .unwrap()
            .remove(key)
            .unwrap_or(Wake::Retry)
    }

    /// The work queue itself (its length, for tests and benchmarks).
    pub fn work_queue(&self) -> &WorkQueue<K> {
        &self.shared.queue
    }

    fn set_leading(&self, leading: bool) {
        self.shared.leading.store(leading, Ordering::Release);
    }
}

/// What `app` does with each controller, whatever its key.
pub trait Lead: Send + Sync {
    /// From now on events queue work; what needs work now is swept once.
    /// The returned future runs the workers (and the resync) until the
    /// queue shuts down.
    fn lead(&self) -> BoxFuture<'static, ()>;
    /// No new work: the queue shuts down (work taken finishes).
    fn stop_taking_work(&self);
    /// Resolves once the work in flight has finished.
    fn finish_in_flight(&self) -> BoxFuture<'static, ()>;
}

/// A [`Reconciler`] run by the runtime: its queue, its workers, its resync.
pub struct Controller<R: Reconciler> {
    reconciler: Arc<R>,
    queue: Queue<R::Key, R::Why>,
    reachability: Arc<Reachability>,
    workers: usize,
    /// The least period of the jittered resync; none without one.
    resync: Option<Duration>,
}

impl<R: Reconciler> Controller<R> {
    /// One worker and no resync until said otherwise. Work waits while
    /// `reachability` says the API server does not answer.
    pub fn new(
        reconciler: Arc<R>,
        queue: Queue<R::Key, R::Why>,
        reachability: Arc<Reachability>,
    ) -> Self {
        Controller {
            reconciler,
            queue,
            reachability,
            workers: 1,
            resync: None,
        }
    }

    /// `workers` keys synced at once (never the same key twice at once).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Sweeps ([`Sweep::Resync`]) at a random period between `min_period`
    /// and twice that, as kube-controller-manager's `--min-resync-period`
    /// does for each informer: a missed event heals by itself.
    pub fn resync_every(mut self, min_period: Duration) -> Self {
        // A zero period would spin; a second is the least that makes sense.
        self.resync = Some(min_period.max(Duration::from_secs(1)));
        self
    }
}

impl<R: Reconciler> Lead for Controller<R> {
    fn lead(&self) -> BoxFuture<'static, ()> {
        self.queue.set_leading(true);
        self.reconciler.sweep(Sweep::Takeover);
        let workers = futures::future::join_all((0..self.workers).map(|_| {
            worker(
                self.reconciler.clone(),
                self.queue.clone(),
                self.reachability.clone(),
            )
        }));
        let resync = self
            .resync
            .map(|period| resync(self.reconciler.clone(), self.queue.clone(), period));
        Box::pin(async move {
            match resync {
                // The resync never ends; the workers end with the queue.
                Some(resync) => {
                    tokio::select! {
                        _ = workers => {}
                        _ = resync => {}
                    }
                }
                None => {
                    workers.await;
                }
            }
        })
    }

    fn stop_taking_work(&self) {
        self.queue.set_leading(false);
        self.queue.shared.queue.shut_down();
    }

    fn finish_in_flight(&self) -> BoxFuture<'static, ()> {
        let queue = self.queue.clone();
        Box::pin(async move { queue.shared.queue.wait_idle().await })
    }
}

/// One worker: take a key, sync it in its span, requeue it as its outcome
/// calls for, until the queue shuts down.
async fn worker<R: Reconciler>(
    reconciler: Arc<R>,
    queue: Queue<R::Key, R::Why>,
    reachability: Arc<Reachability>,
) {
    let work = queue.work_queue();
    loop {
        // Through an API server outage, keys wait in the queue rather than
        // fail one by one.
        reachability.wait_reachable().await;
        let Some(key) = work.get().await else {
            return;
        };
        let started = Instant::now();
        let why = queue.take_reason(&key);
        let span = reconciler.span(&key, &why);
        let result = reconciler.reconcile(&key).instrument(span.clone()).await;
        let _entered = span.enter();
        let outcome = result.map(|action| match action {
            Action::Done => None,
            Action::RecheckAfter(delay) => Some(delay),
        });
        match &outcome {
            Ok(None) => debug!(elapsed_ms = started.elapsed().as_millis() as u64, "synced"),
            Ok(Some(delay)) => {
                debug!(
                    delay_ms = delay.as_millis() as u64,
                    "synced; checking again later"
                );
                queue.remember(&key, Wake::Recheck);
            }
            Err(_) => {}
        }
        requeue(work, &reachability, &key, outcome);
        work.done(&key);
    }
}

/// Sweeps at a random period between `min_period` and twice that, forever;
/// only a leader with synced caches queues anything.
async fn resync<R: Reconciler>(
    reconciler: Arc<R>,
    queue: Queue<R::Key, R::Why>,
    min_period: Duration,
) {
    use rand::Rng;
    loop {
        let period = min_period.mul_f64(1.0 + rand::rng().random::<f64>());
        tokio::time::sleep(period).await;
        if queue.is_leading() && reconciler.is_synced() {
            reconciler.sweep(Sweep::Resync);
        }
    }
}
