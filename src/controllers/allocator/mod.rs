//! The allocator for declared nodes (`--allocate-on-nodes`): devices for
//! the claims of pods that bypassed kube-scheduler onto nodes the admin
//! handed to us. A controller of its own, beside the claim controller:
//!
//! - `mod.rs`: the [`Controller`] (its queue, run by the runtime with
//!   **one** worker) and the sync of one pod;
//! - `watches.rs`: what ResourceSlice, DeviceClass, Node, pod and claim
//!   changes do (it observes the process's stores; it watches nothing);
//! - `decide.rs`: which claims of a pod to allocate (pure);
//! - `attempt.rs`: one attempt (fresh reads, planning with the solver in
//!   `crate::allocate`, guarded writes);
//! - `state.rs`: its stores, its own writes not seen yet, waiting pods;
//! - `metrics.rs`: `dra_claim_controller_allocations_total`.
//!
//! It reads and observes the process's stores (`crate::watches`),
//! subscribing in [`build`].

pub(crate) mod attempt;
pub(crate) mod decide;
pub(crate) mod metrics;
pub(crate) mod state;
mod watches;

use std::sync::Arc;
use std::time::Duration;

use tracing::{Span, debug, info, info_span};

use crate::model::features::FeatureGates;
use crate::model::selector::LabelSelector;
use crate::model::views::{ClaimView, PodGroupView, PodView};
use crate::runtime::controller::{Action, Controller as Run, Lead, Queue, Reconciler, Sweep, Wake};
use crate::runtime::error::SyncError;
use crate::runtime::events::EventRecorder;
use crate::runtime::reachability::Reachability;
use crate::runtime::shared::WatchesSynced;
use crate::runtime::store::{Store, object_key};
use crate::shared::Shared;
use crate::watches::devices::Kinds;
use attempt::{Attempt, Wanted, allocate_for_pod, wake_kubelet};
use decide::{Lookup, claims_to_allocate};
use metrics::AllocatorMetrics;
use state::Allocation;

/// The queue's name (`workqueue_*{name="dra_allocator"}`).
pub(crate) const QUEUE_NAME: &str = "dra_allocator";

/// How often a pod waiting for devices is looked at again when nothing
/// woke it (slice, class and claim changes do).
pub(crate) const RECHECK_WAITING: Duration = Duration::from_secs(60);

/// Why a pod is queued (the `reason` of its span).
const NEEDS_DEVICES: &str = "its claims need devices";
const WAITING_WOKEN: &str = "devices changed where it waits";
const RELISTED: &str = "a watch listed again";

/// What the allocator is built with.
pub struct Settings {
    /// `--allocate-on-nodes`, as given and parsed (`None`: off).
    pub allocate_on_nodes: Option<(String, LabelSelector)>,
    /// `--min-resync-period`.
    pub min_resync_period: Duration,
    /// The source of its events (the claim controller's: users see one
    /// component for their claims).
    pub event_component: &'static str,
}

/// The allocator, with `--allocate-on-nodes` only: it reads slices,
/// classes, nodes (and rules' taints, as kube-scheduler does), and observes
/// pods, claims and the device kinds.
pub fn build(shared: &Shared, settings: Settings) -> anyhow::Result<Option<Box<dyn Lead>>> {
    let Some(node_selector) = settings.allocate_on_nodes else {
        return Ok(None);
    };
    shared.read_devices(Kinds::for_allocating(&shared.gates));
    let stores = shared.claims.stores();
    let client = shared.client.clone();
    let allocator = Arc::new(Controller {
        ctx: Context {
            events: EventRecorder::new(
                client.clone(),
                settings.event_component,
                shared.identity.clone(),
            ),
            client,
            state: Allocation::new(node_selector.0, node_selector.1, shared.devices.stores()),
            pods: stores.pods.clone(),
            claims: stores.claims.clone(),
            pod_groups: shared
                .group_claims_served()
                .then(|| stores.pod_groups.clone()),
            gates: shared.gates,
            metrics: AllocatorMetrics::register(&shared.registry)?,
            reachability: shared.reachability.clone(),
        },
        queue: Queue::new(QUEUE_NAME, Some(&shared.registry)),
        synced: shared.synced.clone(),
    });
    shared.observe_pods(allocator.clone());
    shared.observe_claims(allocator.clone());
    shared.observe_slices(allocator.clone());
    shared.observe_classes(allocator.clone());
    shared.observe_nodes(allocator.clone());
    Ok(Some(Box::new(allocator.run(settings.min_resync_period))))
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
    /// Only the leader enqueues.
    queue: Queue<String, &'static str>,
    synced: WatchesSynced,
}

impl Controller {
    /// This controller as the runtime runs it: one worker (attempts never
    /// overlap, so each sees the writes of the one before), a jittered
    /// resync from `min_resync_period`.
    pub fn run(self: &Arc<Self>, min_resync_period: Duration) -> Run<Self> {
        Run::new(
            self.clone(),
            self.queue.clone(),
            self.ctx.reachability.clone(),
        )
        .resync_every(min_resync_period)
    }

    pub fn is_synced(&self) -> bool {
        self.synced.is_synced()
    }

    fn enqueue(&self, keys: impl IntoIterator<Item = String>, why: &'static str) {
        if !self.queue.is_leading() {
            return;
        }
        for key in keys {
            debug!(pod = %key, reason = why, "enqueue for allocation");
            self.queue.add(key, why);
        }
    }

    /// Queues every cached pod whose claims need allocating; returns how
    /// many.
    fn queue_needing(&self, why: Wake<&'static str>) -> usize {
        if !self.queue.is_leading() {
            return 0;
        }
        let keys: Vec<String> = self
            .ctx
            .pods
            .list()
            .iter()
            .filter(|pod| self.claims_to_allocate(pod).is_ok())
            .map(|pod| object_key(pod.namespace(), pod.name()))
            .collect();
        let queued = keys.len();
        for key in keys {
            self.queue.add_for(key, why.clone());
        }
        queued
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

    /// One attempt for the pod `key`.
    async fn sync(&self, key: &str) -> Result<Action, SyncError> {
        let Some(pod) = self.ctx.pods.get(key) else {
            self.ctx.state.stop_waiting(key);
            debug!("pod is gone; nothing to allocate");
            return Ok(Action::Done);
        };
        let unreserved = match self.claims_to_allocate(&pod) {
            Ok(unreserved) => unreserved,
            Err(reason) => {
                self.ctx.state.stop_waiting(key);
                debug!(%reason, "nothing to allocate");
                return Ok(Action::Done);
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
                Ok(Action::Done)
            }
            Attempt::NothingToDo => Ok(Action::Done),
            // Woken by slice, class and claim changes; this is the net
            // under those.
            Attempt::Waiting => Ok(Action::RecheckAfter(RECHECK_WAITING)),
        }
    }
}

impl Reconciler for Controller {
    type Key = String;
    type Why = &'static str;

    fn span(&self, key: &String, why: &Wake<&'static str>) -> Span {
        info_span!("allocate", pod = %key, reason = %why)
    }

    async fn reconcile(&self, key: &String) -> Result<Action, SyncError> {
        self.sync(key).await
    }

    fn sweep(&self, sweep: Sweep) {
        let queued = self.queue_needing(sweep.wake());
        match sweep {
            Sweep::Takeover => info!(
                pods = queued,
                "allocator leading: queued the pods whose claims need devices"
            ),
            Sweep::Resync => info!(
                queued,
                "allocator resync: queued the pods whose claims need devices"
            ),
        }
    }

    fn is_synced(&self) -> bool {
        Controller::is_synced(self)
    }
}
