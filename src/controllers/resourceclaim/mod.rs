//! The ResourceClaim lifecycle controller: watches, caches, enqueue rules and
//! the worker loop. Decisions live in `pod.rs` and `claim.rs`.

pub mod cache;
pub mod claim;
pub mod enqueue;
pub mod error;
pub mod events;
pub mod metrics;
pub mod observe;
pub mod patch;
pub mod pod;
pub mod views;

#[cfg(test)]
mod decision_tests;
#[cfg(test)]
mod test_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::features::FeatureGates;
use crate::reachability::Reachability;
use crate::workqueue::WorkQueue;
use cache::{Caches, PODS_BY_CLAIM, PODS_BY_TEMPLATE, object_key};
use enqueue::{WorkKey, keys_for_pod_event, pod_needs_work};
use error::SyncError;
use events::EventRecorder;
use metrics::ControllerMetrics;
use observe::observe;
use views::{ClaimView, PodView, TemplateView};

/// The queue name, as kube-controller-manager's (`workqueue_*{name="resource_claim"}`).
pub const QUEUE_NAME: &str = "resource_claim";

/// The shortest server-side timeout of a watch request, in seconds.
const WATCH_TIMEOUT_MIN_SECS: u32 = 40;
/// Each watch draws its timeout from `MIN..=MIN + JITTER`, so the three
/// watches (and the replicas) do not all re-watch at the same moment.
const WATCH_TIMEOUT_JITTER_SECS: u32 = 10;

/// The configuration of one watch.
///
/// Liveness: kube-runtime abandons a watch that delivers nothing, not even
/// a bookmark, for its server-side timeout plus 5 s, and re-watches from
/// the last resourceVersion it saw. A healthy stream always delivers or
/// ends within the timeout (the API server closes it then), so a stream
/// that stays silent longer is dead: a stalled proxy or load balancer, a
/// half-open connection. With 40-50 s timeouts such a stream is replaced at
/// most 55 s after its last byte, at the cost of one watch request per
/// watch every 40-50 s (kube-runtime's default, 290 s, trusted a silent
/// stream for five minutes).
fn watch_config() -> watcher::Config {
    use rand::Rng;
    let timeout = WATCH_TIMEOUT_MIN_SECS + rand::rng().random_range(0..=WATCH_TIMEOUT_JITTER_SECS);
    watcher::Config::default()
        // Pages keep the memory of the initial list of a big cluster bounded.
        .page_size(500)
        .timeout(timeout)
}

/// First pause before re-watching after a watch failed.
const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// Longest pause. kube-runtime's default grows to 30 s, so after an API
/// server outage the caches could stay stale for half a minute after it
/// answered again; a few watch attempts every 4 s cost next to nothing.
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(4);

/// Pauses between failed watch attempts: doubling from
/// [`WATCH_BACKOFF_MIN`] to [`WATCH_BACKOFF_MAX`] with ±20 % jitter, back to
/// the start once a watch delivers.
#[derive(Debug)]
struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff {
            next: WATCH_BACKOFF_MIN,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        use rand::Rng;
        let pause = self.next.mul_f64(rand::rng().random_range(0.8..1.2));
        self.next = (self.next * 2).min(WATCH_BACKOFF_MAX);
        Some(pause)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_BACKOFF_MIN;
    }
}

/// How a sync that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synced {
    Done,
    /// Nothing failed, but the key must be looked at again after this
    /// long (a grace period is running).
    RecheckAfter(Duration),
}

/// Everything a sync needs.
pub struct Context {
    pub client: kube::Client,
    pub caches: Arc<Caches>,
    pub gates: FeatureGates,
    pub events: EventRecorder,
    pub metrics: ControllerMetrics,
    /// Whether the API server answers; workers hold while it does not.
    pub reachability: Arc<Reachability>,
}

/// The controller: three watches feeding caches, one queue, N workers.
pub struct Controller {
    ctx: Arc<Context>,
    queue: WorkQueue<WorkKey>,
    /// Only the leader enqueues; a standby keeps its caches warm.
    leading: AtomicBool,
    synced: watch::Sender<[bool; 3]>,
    /// Objects of a (re)list, buffered until the list is complete.
    pod_init: std::sync::Mutex<Vec<PodView>>,
    claim_init: std::sync::Mutex<Vec<ClaimView>>,
    template_init: std::sync::Mutex<Vec<TemplateView>>,
}

const PODS: usize = 0;
const CLAIMS: usize = 1;
const TEMPLATES: usize = 2;

impl Controller {
    pub fn new(
        client: kube::Client,
        gates: FeatureGates,
        registry: &prometheus::Registry,
        identity: &str,
    ) -> anyhow::Result<Arc<Self>> {
        let caches = Arc::new(Caches::new());
        let metrics = ControllerMetrics::register(registry, caches.clone())?;
        let ctx = Arc::new(Context {
            events: EventRecorder::new(client.clone(), identity.to_string()),
            client,
            caches,
            gates,
            metrics,
            reachability: Arc::new(Reachability::new()),
        });
        Ok(Arc::new(Controller {
            ctx,
            queue: WorkQueue::new(QUEUE_NAME, Some(registry)),
            leading: AtomicBool::new(false),
            synced: watch::Sender::new([false; 3]),
            pod_init: Default::default(),
            claim_init: Default::default(),
            template_init: Default::default(),
        }))
    }

    /// Probes the API server while it is reported unreachable; runs until
    /// the process ends.
    pub async fn run_reachability_probe(self: Arc<Self>) {
        self.ctx.reachability.probe(self.ctx.client.clone()).await;
    }

    pub fn caches(&self) -> &Arc<Caches> {
        &self.ctx.caches
    }

    pub fn queue(&self) -> &WorkQueue<WorkKey> {
        &self.queue
    }

    /// Resolves once the first list of every watch has been loaded.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| s.iter().all(|b| *b)).await;
    }

    pub fn is_synced(&self) -> bool {
        self.synced.borrow().iter().all(|b| *b)
    }

    /// Runs the three watches until the process ends. Watch errors are
    /// retried with backoff by kube-runtime; a 410 Gone causes a relist.
    pub async fn run_watches(self: Arc<Self>) {
        let client = self.ctx.client.clone();
        let pods = watcher::watcher(Api::<PodView>::all(client.clone()), watch_config())
            .backoff(WatchBackoff::default());
        let claims = watcher::watcher(Api::<ClaimView>::all(client.clone()), watch_config())
            .backoff(WatchBackoff::default());
        let templates = watcher::watcher(Api::<TemplateView>::all(client), watch_config())
            .backoff(WatchBackoff::default());
        tokio::join!(
            self.clone().consume("pods", pods, Self::on_pods),
            self.clone()
                .consume("resourceclaims", claims, Self::on_claims),
            self.clone()
                .consume("resourceclaimtemplates", templates, Self::on_templates),
        );
    }

    async fn consume<K, S>(
        self: Arc<Self>,
        what: &'static str,
        stream: S,
        handle: fn(&Self, Event<K>),
    ) where
        S: Stream<Item = Result<Event<K>, watcher::Error>>,
    {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => handle(&self, event),
                Err(e) => warn!(resource = what, error = %e, "watch failed; retrying with backoff"),
            }
        }
    }

    fn enqueue(&self, keys: impl IntoIterator<Item = WorkKey>) {
        if !self.leading.load(Ordering::Acquire) {
            return;
        }
        for key in keys {
            debug!(key = %key, "enqueue");
            self.queue.add(key);
        }
    }

    fn mark_synced(&self, index: usize) {
        self.synced.send_modify(|s| s[index] = true);
    }

    fn on_pods(&self, event: Event<PodView>) {
        let caches = &self.ctx.caches;
        match event {
            Event::Init => self.pod_buffer().clear(),
            Event::InitApply(pod) => {
                // The cache still holds the previous list: the history of a
                // pod carries over into the new one.
                let cached = caches.pods.get(&object_key(pod.namespace(), pod.name()));
                if let Some(pod) = observe(cached.as_deref(), pod, Instant::now()).keep {
                    self.pod_buffer().push(pod);
                }
            }
            Event::InitDone => {
                let pods: Vec<Arc<PodView>> = self.pod_buffer().drain(..).map(Arc::new).collect();
                let entries: Vec<(String, Arc<PodView>)> = pods
                    .iter()
                    .map(|p| (object_key(p.namespace(), p.name()), p.clone()))
                    .collect();
                let replaced: Vec<Arc<PodView>> = entries
                    .iter()
                    .filter_map(|(key, pod)| caches.pods.get(key).filter(|o| o.uid() != pod.uid()))
                    .collect();
                // Absent from the list: deleted while the watch was down.
                for gone in caches.pods.replace(entries).iter().chain(&replaced) {
                    self.pod_deleted(gone);
                }
                for pod in &pods {
                    self.enqueue(keys_for_pod_event(pod, false, caches));
                }
                info!(
                    pods = caches.pods.len(),
                    "pod cache loaded (pods with claims only)"
                );
                self.mark_synced(PODS);
            }
            Event::Apply(pod) => {
                let key = object_key(pod.namespace(), pod.name());
                let cached = caches.pods.get(&key);
                let seen = observe(cached.as_deref(), pod, Instant::now());
                if seen.replaced
                    && let Some(old) = &cached
                {
                    self.pod_deleted(old);
                }
                match seen.keep {
                    Some(pod) => {
                        let pod = Arc::new(pod);
                        caches.pods.apply(key, pod.clone());
                        self.enqueue(keys_for_pod_event(&pod, false, caches));
                    }
                    // Replaced under the same name by a pod without claims.
                    None if seen.replaced => {
                        caches.pods.delete(&key);
                    }
                    None => {}
                }
            }
            Event::Delete(pod) => {
                let key = object_key(pod.namespace(), pod.name());
                // The cached version may name claims the deleted one no
                // longer lists (see `observe`). A cached pod with another
                // UID is a newer pod of that name: it stays.
                let pod = match caches.pods.get(&key) {
                    Some(cached) if cached.uid() == pod.uid() => {
                        caches.pods.delete(&key);
                        cached
                    }
                    _ => Arc::new(pod),
                };
                if pod.is_relevant() {
                    self.pod_deleted(&pod);
                }
            }
        }
    }

    fn pod_deleted(&self, pod: &PodView) {
        let caches = &self.ctx.caches;
        caches.deleted_pods.add(pod.uid().to_string());
        self.enqueue(keys_for_pod_event(pod, true, caches));
    }

    fn pod_buffer(&self) -> std::sync::MutexGuard<'_, Vec<PodView>> {
        self.pod_init.lock().unwrap()
    }

    fn on_claims(&self, event: Event<ClaimView>) {
        let caches = &self.ctx.caches;
        match event {
            Event::Init => self.claim_buffer().clear(),
            Event::InitApply(claim) => self.claim_buffer().push(claim),
            Event::InitDone => {
                let claims: Vec<Arc<ClaimView>> =
                    self.claim_buffer().drain(..).map(Arc::new).collect();
                let entries = claims
                    .iter()
                    .map(|c| (object_key(c.namespace(), c.name()), c.clone()))
                    .collect();
                for gone in caches.claims.replace(entries) {
                    caches.forget_created(&object_key(gone.namespace(), gone.name()));
                    self.claim_changed(&gone, true);
                }
                // Startup (and every relist): check every claim once, for
                // reservations that went stale while nobody watched.
                for claim in &claims {
                    caches.forget_created(&object_key(claim.namespace(), claim.name()));
                    self.claim_changed(claim, false);
                }
                info!(claims = caches.claims.len(), "claim cache loaded");
                self.mark_synced(CLAIMS);
            }
            Event::Apply(claim) => {
                let key = object_key(claim.namespace(), claim.name());
                let claim = Arc::new(claim);
                caches.claims.apply(key.clone(), claim.clone());
                caches.forget_created(&key);
                self.claim_changed(&claim, false);
            }
            Event::Delete(claim) => {
                let key = object_key(claim.namespace(), claim.name());
                caches.claims.delete(&key);
                caches.forget_created(&key);
                self.claim_changed(&claim, true);
            }
        }
    }

    fn claim_buffer(&self) -> std::sync::MutexGuard<'_, Vec<ClaimView>> {
        self.claim_init.lock().unwrap()
    }

    fn claim_changed(&self, claim: &ClaimView, deleted: bool) {
        let caches = &self.ctx.caches;
        let mut keys = Vec::new();
        if !deleted {
            keys.push(WorkKey::claim(claim.namespace(), claim.name()));
        }
        for pod in caches
            .pods
            .by_index(PODS_BY_CLAIM, &object_key(claim.namespace(), claim.name()))
        {
            keys.extend(keys_for_pod_event(&pod, false, caches));
        }
        self.enqueue(keys);
    }

    fn on_templates(&self, event: Event<TemplateView>) {
        let caches = &self.ctx.caches;
        match event {
            Event::Init => self.template_buffer().clear(),
            Event::InitApply(t) => self.template_buffer().push(t),
            Event::InitDone => {
                let templates: Vec<(String, Arc<TemplateView>)> = self
                    .template_buffer()
                    .drain(..)
                    .map(|t| (object_key(t.namespace(), t.name()), Arc::new(t)))
                    .collect();
                let keys: Vec<String> = templates.iter().map(|(k, _)| k.clone()).collect();
                caches.templates.replace(templates);
                for key in keys {
                    self.template_changed(&key);
                }
                self.mark_synced(TEMPLATES);
            }
            Event::Apply(t) => {
                let key = object_key(t.namespace(), t.name());
                caches.templates.apply(key.clone(), Arc::new(t));
                self.template_changed(&key);
            }
            Event::Delete(t) => {
                caches
                    .templates
                    .delete(&object_key(t.namespace(), t.name()));
            }
        }
    }

    fn template_buffer(&self) -> std::sync::MutexGuard<'_, Vec<TemplateView>> {
        self.template_init.lock().unwrap()
    }

    fn template_changed(&self, key: &str) {
        let caches = &self.ctx.caches;
        let mut keys = Vec::new();
        for pod in caches.pods.by_index(PODS_BY_TEMPLATE, key) {
            keys.extend(keys_for_pod_event(&pod, false, caches));
        }
        self.enqueue(keys);
    }

    /// Called when this replica becomes leader: from now on events enqueue
    /// work, and everything that happened before is swept once.
    pub fn start_leading(&self) {
        self.leading.store(true, Ordering::Release);
        let caches = &self.ctx.caches;
        let mut claims = 0;
        for claim in caches.claims.list() {
            self.queue
                .add(WorkKey::claim(claim.namespace(), claim.name()));
            claims += 1;
        }
        let mut pods = 0;
        for pod in caches.pods.list() {
            if pod_needs_work(&pod, caches).is_ok() {
                self.queue.add(WorkKey::pod(pod.namespace(), pod.name()));
                pods += 1;
            }
        }
        info!(
            claims,
            pods, "leading: queued every claim and every pod that needs work"
        );
    }

    /// Re-examines every cached pod and claim at a random period between
    /// `min_period` and twice that, forever (kube-controller-manager's
    /// `--min-resync-period`, as each of its informers does). Only objects
    /// whose decision is not a no-op are queued, and only on the leader;
    /// the resync itself reads the caches and sends nothing.
    pub async fn run_resync(self: Arc<Self>, min_period: Duration) {
        // A zero period would spin; a second is the least that makes sense.
        let min_period = min_period.max(Duration::from_secs(1));
        tokio::join!(
            self.resync_every(min_period, "pods", Self::resync_pods),
            self.resync_every(min_period, "resourceclaims", Self::resync_claims),
        );
    }

    async fn resync_every(
        &self,
        min_period: Duration,
        what: &'static str,
        resync: fn(&Self) -> usize,
    ) {
        use rand::Rng;
        loop {
            let period = min_period.mul_f64(1.0 + rand::rng().random::<f64>());
            tokio::time::sleep(period).await;
            if !self.is_synced() {
                continue;
            }
            let queued = resync(self);
            info!(
                resource = what,
                queued, "resync: queued the cached objects that need work"
            );
        }
    }

    fn resync_pods(&self) -> usize {
        let caches = &self.ctx.caches;
        let keys: Vec<WorkKey> = caches
            .pods
            .list()
            .iter()
            .filter(|pod| pod_needs_work(pod, caches).is_ok())
            .map(|pod| WorkKey::pod(pod.namespace(), pod.name()))
            .collect();
        let queued = keys.len();
        self.enqueue(keys);
        queued
    }

    fn resync_claims(&self) -> usize {
        let caches = &self.ctx.caches;
        let keys: Vec<WorkKey> = caches
            .claims
            .list()
            .iter()
            .filter(|claim| claim::needs_work(claim, caches))
            .map(|claim| WorkKey::claim(claim.namespace(), claim.name()))
            .collect();
        let queued = keys.len();
        self.enqueue(keys);
        queued
    }

    /// Runs `workers` workers until the queue is shut down.
    pub async fn run_workers(self: Arc<Self>, workers: usize) {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..workers.max(1) {
            let this = self.clone();
            tasks.spawn(async move { this.worker().await });
        }
        while tasks.join_next().await.is_some() {}
    }

    async fn worker(&self) {
        loop {
            // Through an API server outage, keys wait in the queue rather
            // than fail one by one.
            self.ctx.reachability.wait_reachable().await;
            let Some(key) = self.queue.get().await else {
                return;
            };
            let started = Instant::now();
            // One span per sync: every line logged inside carries the key.
            let span = info_span!("sync", key = %key);
            let result = self.sync(&key).instrument(span.clone()).await;
            let _entered = span.enter();
            match result {
                Ok(Synced::Done) => {
                    self.ctx.reachability.report_answer();
                    self.queue.forget(&key);
                    debug!(elapsed_ms = started.elapsed().as_millis() as u64, "synced");
                }
                Ok(Synced::RecheckAfter(delay)) => {
                    self.ctx.reachability.report_answer();
                    self.queue.forget(&key);
                    debug!(
                        delay_ms = delay.as_millis() as u64,
                        "synced; checking again later"
                    );
                    self.queue.add_after(key.clone(), delay);
                }
                Err(SyncError::Unreachable { .. }) if self.queue.is_shutting_down() => {}
                Err(e @ SyncError::Unreachable { .. }) => {
                    // Says nothing about the item: no backoff step, no
                    // retry counted; the key waits for the API server.
                    if !self.ctx.reachability.report_unreachable(&e) {
                        debug!(error = %e, "API server still unreachable");
                    }
                    self.queue.add(key.clone());
                }
                Err(e @ SyncError::Conflict { .. }) => {
                    self.ctx.reachability.report_answer();
                    info!(error = %e, "retrying on fresh state");
                    self.queue.add_rate_limited(key.clone());
                }
                Err(e) => {
                    self.ctx.reachability.report_answer();
                    warn!(error = %e, "sync failed; retrying with backoff");
                    self.queue.add_rate_limited(key.clone());
                }
            }
            self.queue.done(&key);
        }
    }

    /// One sync of one key, from the cache's current state.
    pub async fn sync(&self, key: &WorkKey) -> Result<Synced, SyncError> {
        let ctx = &self.ctx;
        match key {
            WorkKey::Pod { namespace, name } => {
                let Some(pod) = ctx.caches.pods.get(&object_key(namespace, name)) else {
                    debug!("pod is gone; nothing to do");
                    return Ok(Synced::Done);
                };
                let decision = pod::decide(&pod, &ctx.caches, ctx.gates);
                if let Some(reason) = decision.skipped {
                    debug!(reason, "nothing to do for pod");
                }
                if decision.is_noop() {
                    return Ok(Synced::Done);
                }
                pod::execute(ctx, &pod, decision).await
            }
            WorkKey::Claim { namespace, name } => {
                let Some(claim) = ctx.caches.claims.get(&object_key(namespace, name)) else {
                    debug!("claim is gone; nothing to do");
                    return Ok(Synced::Done);
                };
                claim::execute(ctx, &claim).await.map(|()| Synced::Done)
            }
        }
    }

    /// Stops handing out work and waits (bounded by the caller) for
    /// in-flight syncs to finish.
    pub async fn shut_down(&self) {
        self.leading.store(false, Ordering::Release);
        self.queue.shut_down();
        self.queue.wait_idle().await;
    }
}
