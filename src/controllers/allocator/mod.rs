//! The allocator for declared nodes (`--allocate-on-nodes`): devices for
//! the claims of pods that bypassed kube-scheduler onto nodes the admin
//! handed to us. A controller of its own, beside the claim controller:
//!
//! - `mod.rs`: the [`Controller`] (its queue with **one** worker,
//!   leadership) and the worker loop;
//! - `watches.rs`: what ResourceSlice, DeviceClass, Node, pod and claim
//!   changes do (it observes the process's stores; it watches nothing);
//! - `decide.rs`: which claims of a pod to allocate (pure);
//! - `attempt.rs`: one attempt (fresh reads, planning with the solver in
//!   `crate::allocate`, guarded writes);
//! - `state.rs`: its stores, its own writes not seen yet, waiting pods;
//! - `metrics.rs`: `dra_claim_controller_allocations_total`.
//!
//! The pod, claim and PodGroup stores are the claim controller's, handed
//! over by `app.rs`, which also makes this controller their observer.

pub(crate) mod attempt;
pub(crate) mod decide;
pub(crate) mod metrics;
pub(crate) mod state;
mod watches;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::{Instrument, debug, info, info_span};

use crate::model::features::FeatureGates;
use crate::model::selector::LabelSelector;
use crate::model::views::{ClaimView, DeviceStores, NodeView, PodGroupView, PodView};
use crate::runtime::error::SyncError;
use crate::runtime::events::EventRecorder;
use crate::runtime::reachability::Reachability;
use crate::runtime::retry::requeue;
use crate::runtime::shared::WatchesSynced;
use crate::runtime::store::{Store, object_key};
use crate::workqueue::WorkQueue;
use attempt::{Attempt, Wanted, allocate_for_pod, wake_kubelet};
use decide::{Lookup, claims_to_allocate};
use metrics::AllocatorMetrics;
use state::Allocation;

/// The queue's name (`workqueue_*{name="dra_allocator"}`).
pub(crate) const QUEUE_NAME: &str = "dra_allocator";

/// How often a pod waiting for devices is looked at again when nothing
/// woke it (slice, class and claim changes do).
pub(crate) const RECHECK_WAITING: Duration = Duration::from_secs(60);

/// What the claim controller shares with the allocator.
pub struct SharedStores {
    pub pods: Arc<Store<PodView>>,
    pub claims: Arc<Store<ClaimView>>,
    /// With DRAWorkloadResourceClaims only.
    pub pod_groups: Option<Arc<Store<PodGroupView>>>,
    /// The process's slices, classes and nodes.
    pub devices: DeviceStores,
    /// Whether every watch has its first list in.
    pub synced: WatchesSynced,
}

/// Everything an attempt needs.
pub struct Context {
    pub client: kube::Client,
    pub state: Allocation,
    pub pods: Arc<Store<PodView>>,
    pub claims: Arc<Store<ClaimView>>,
    pub pod_groups: Option<Arc<Store<PodGroupView>>>,
    pub gates: FeatureGates,
    pub events: EventRecorder,
    pub metrics: AllocatorMetrics,
    pub reachability: Arc<Reachability>,
}

/// The allocator: the process's stores observed, one queue of pod keys
/// (`namespace/name`), one worker.
pub struct Controller {
    ctx: Context,
    queue: WorkQueue<String>,
    /// Only the leader enqueues.
    leading: AtomicBool,
    synced: WatchesSynced,
}

impl Controller {
    /// An allocator for the nodes `node_selector` selects (kept in
    /// `declared`, which the claim controller reads too), writing with
    /// `client` and telling users through events from `event_component`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: kube::Client,
        node_selector: (String, LabelSelector),
        declared: Arc<Store<NodeView>>,
        stores: SharedStores,
        gates: FeatureGates,
        registry: &prometheus::Registry,
        identity: &str,
        event_component: &'static str,
        reachability: Arc<Reachability>,
    ) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Controller {
            ctx: Context {
                events: EventRecorder::new(client.clone(), event_component, identity.to_string()),
                client,
                state: Allocation::new(node_selector.0, node_selector.1, &stores.devices, declared),
                pods: stores.pods,
                claims: stores.claims,
                pod_groups: stores.pod_groups,
                gates,
                metrics: AllocatorMetrics::register(registry)?,
                reachability,
            },
            queue: WorkQueue::new(QUEUE_NAME, Some(registry)),
            leading: AtomicBool::new(false),
            synced: stores.synced,
        }))
    }

    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    pub fn is_synced(&self) -> bool {
        self.synced.is_synced()
    }

    fn enqueue(&self, keys: impl IntoIterator<Item = String>) {
        if !self.leading.load(Ordering::Acquire) {
            return;
        }
        for key in keys {
            debug!(pod = %key, "enqueue for allocation");
            self.queue.add(key);
        }
    }

    /// Called when this replica becomes leader: from now on events enqueue
    /// work, and every pod that needs an allocation now is queued.
    pub(crate) fn start_leading(&self) {
        self.leading.store(true, Ordering::Release);
        let queued = self.sweep();
        info!(
            pods = queued,
            "allocator leading: queued the pods whose claims need devices"
        );
    }

    /// Queues every cached pod whose claims need allocating; returns how
    /// many.
    fn sweep(&self) -> usize {
        let keys: Vec<String> = self
            .ctx
            .pods
            .list()
            .iter()
            .filter(|pod| self.claims_to_allocate(pod).is_ok())
            .map(|pod| object_key(pod.namespace(), pod.name()))
            .collect();
        let queued = keys.len();
        self.enqueue(keys);
        queued
    }

    /// Looks every cached pod over again at a random period between
    /// `min_period` and twice that (the claim controller's resync does the
    /// same for its own work).
    pub(crate) async fn run_resync(self: Arc<Self>, min_period: Duration) {
        use rand::Rng;
        let min_period = min_period.max(Duration::from_secs(1));
        loop {
            let period = min_period.mul_f64(1.0 + rand::rng().random::<f64>());
            tokio::time::sleep(period).await;
            if self.is_synced() {
                let queued = self.sweep();
                info!(
                    queued,
                    "allocator resync: queued the pods whose claims need devices"
                );
            }
        }
    }

    /// Stops handing out work and waits (bounded by the caller) for the
    /// attempt in flight to finish.
    pub async fn shut_down(&self) {
        self.leading.store(false, Ordering::Release);
        self.queue.shut_down();
        self.queue.wait_idle().await;
    }

    /// What this controller would allocate for `pod` now, from the stores.
    fn claims_to_allocate(
        &self,
        pod: &PodView,
    ) -> Result<Vec<crate::model::consumers::Unreserved>, decide::NotMine> {
        let ctx = &self.ctx;
        let group = ctx.pod_groups.as_ref().and_then(|groups| {
            let name = pod.pod_group_name()?;
            Some(groups.get(&object_key(pod.namespace(), name)))
        });
        let declared = |node: &str| ctx.state.is_declared(node);
        let claim = |name: &str| ctx.claims.get(&object_key(pod.namespace(), name));
        claims_to_allocate(
            pod,
            &Lookup {
                is_declared: &declared,
                group,
                claim: &claim,
            },
        )
    }

    /// Runs the one worker until the queue is shut down: attempts never
    /// overlap, so each sees the writes of the one before.
    pub(crate) async fn run_worker(self: Arc<Self>) {
        loop {
            self.ctx.reachability.wait_reachable().await;
            let Some(key) = self.queue.get().await else {
                return;
            };
            let started = Instant::now();
            let span = info_span!("allocate", pod = %key);
            let result = self.sync(&key).instrument(span.clone()).await;
            let _entered = span.enter();
            if let Ok(None) = &result {
                debug!(elapsed_ms = started.elapsed().as_millis() as u64, "done");
            }
            requeue(&self.queue, &self.ctx.reachability, &key, result);
            self.queue.done(&key);
        }
    }

    /// One attempt for the pod `key`; `Some(delay)`: look again after it.
    async fn sync(&self, key: &str) -> Result<Option<Duration>, SyncError> {
        let Some(pod) = self.ctx.pods.get(key) else {
            self.ctx.state.stop_waiting(key);
            debug!("pod is gone; nothing to allocate");
            return Ok(None);
        };
        let unreserved = match self.claims_to_allocate(&pod) {
            Ok(unreserved) => unreserved,
            Err(reason) => {
                self.ctx.state.stop_waiting(key);
                debug!(%reason, "nothing to allocate");
                return Ok(None);
            }
        };
        let wanted: Vec<Wanted> = unreserved
            .iter()
            .map(|u| Wanted {
                claim_name: u.claim.name(),
                consumer: &u.consumer,
            })
            .collect();
        match allocate_for_pod(&self.ctx, &pod, &wanted).await? {
            Attempt::Allocated => {
                wake_kubelet(&self.ctx, &pod).await;
                Ok(None)
            }
            Attempt::NothingToDo => Ok(None),
            // Woken by slice, class and claim changes; this is the net
            // under those.
            Attempt::Waiting => Ok(Some(RECHECK_WAITING)),
        }
    }
}
