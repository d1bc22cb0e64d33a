//! The ResourceClaim lifecycle controller (kube-controller-manager's
//! `resourceclaim-controller`):
//!
//! - `mod.rs`: the [`Controller`] (queue, informers, observers of its pod
//!   and claim watches); `watches.rs` (what each event does),
//!   `worker.rs` (the sync of one key, as the runtime's [`Reconciler`]),
//!   `resync.rs` (what a takeover and a resync queue); the runtime runs the
//!   workers, the leader gate, retries, the resync and the shut-down;
//! - `pod.rs`, `claim.rs`, `podgroup.rs`: the decisions (pure `decide`) and
//!   their writes (`execute`); `entries.rs`: an owner's claims adopted,
//!   created and recorded, for pod and PodGroup work alike;
//! - below them: `enqueue.rs` (what wakes what, and why), `cache.rs`,
//!   `context.rs`, `observe.rs`, `patch.rs`, `metrics.rs`.
//!
//! Allocation is not its business: on nodes declared for the allocator it
//! only stays quiet about claims nothing else would allocate.

pub mod cache;
pub mod claim;
pub(crate) mod context;
pub(crate) mod enqueue;
pub(crate) mod entries;
pub(crate) mod metrics;
pub(crate) mod observe;
pub(crate) mod patch;
pub mod pod;
pub(crate) mod podgroup;

mod resync;
mod watches;
mod worker;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kube::Api;
use tracing::debug;

use crate::model::features::FeatureGates;
use crate::model::views::{self, ClaimView, NodeView, PodView, TemplateView};
use crate::runtime::controller::{Controller as Run, Queue};
use crate::runtime::events::EventRecorder;
use crate::runtime::informer::{Handler, Informer, Observer};
use crate::runtime::reachability::Reachability;
use crate::runtime::shared::Fanout;
use crate::runtime::store::Store;
use cache::Caches;
use context::Context;
use enqueue::{Why, WorkKey};
use metrics::{ControllerMetrics, MetricsNaming};

/// The queue name, as kube-controller-manager's (`workqueue_*{name="resource_claim"}`).
pub(crate) const QUEUE_NAME: &str = "resource_claim";
/// The source of our events, as kube-controller-manager's controller names it.
pub(crate) const EVENT_COMPONENT: &str = "resource_claim";

/// Who else reacts to the pod and claim watches (the allocator for
/// declared nodes), told after each change is in the caches.
#[derive(Default)]
pub(crate) struct Observers {
    pods: OnceLock<Vec<Arc<dyn Observer<PodView>>>>,
    claims: OnceLock<Vec<Arc<dyn Observer<ClaimView>>>>,
}

impl Observers {
    fn pods(&self) -> impl Iterator<Item = &Arc<dyn Observer<PodView>>> {
        self.pods.get().into_iter().flatten()
    }
    fn claims(&self) -> impl Iterator<Item = &Arc<dyn Observer<ClaimView>>> {
        self.claims.get().into_iter().flatten()
    }
}

/// The controller: informers feeding caches, one queue (the runtime runs
/// its N workers).
pub struct Controller {
    ctx: Arc<Context>,
    /// Keys are queued only while leading; a standby keeps its caches warm.
    queue: Queue<WorkKey, Why>,
    pods: Informer,
    claims: Informer,
    templates: Informer,
    /// With DRAWorkloadResourceClaims only.
    pod_groups: Option<Informer>,
    observers: Observers,
}

impl Controller {
    pub fn new(
        client: kube::Client,
        gates: FeatureGates,
        registry: &prometheus::Registry,
        identity: &str,
        metrics_naming: MetricsNaming,
        pod_group_api: Option<views::PodGroupApi>,
        allocator_nodes: Option<Arc<Store<NodeView>>>,
    ) -> anyhow::Result<Arc<Self>> {
        let with_groups = pod_group_api.is_some();
        let mut caches = match pod_group_api {
            Some(api) if gates.workload_resource_claims => Caches::with_pod_groups(api),
            Some(api) => Caches::reading_pod_groups(api),
            None => Caches::new(),
        };
        if let Some(nodes) = allocator_nodes {
            caches = caches.with_allocator_nodes(nodes);
        }
        let caches = Arc::new(caches);
        let metrics = ControllerMetrics::register(registry, caches.clone(), metrics_naming)?;
        let ctx = Arc::new(Context {
            events: EventRecorder::new(client.clone(), EVENT_COMPONENT, identity.to_string()),
            client,
            caches,
            gates,
            metrics,
            reachability: Arc::new(Reachability::new()),
        });
        Ok(Arc::new(Controller {
            ctx,
            queue: Queue::new(QUEUE_NAME, Some(registry)),
            pods: Informer::new("pods"),
            claims: Informer::new("resourceclaims"),
            templates: Informer::new("resourceclaimtemplates"),
            pod_groups: with_groups.then(|| Informer::new("podgroups")),
            observers: Observers::default(),
        }))
    }

    /// Lets `pods` and `claims` react to changes of the pod and claim
    /// stores too. Set once, before the watches run.
    pub fn observe(
        &self,
        pods: Vec<Arc<dyn Observer<PodView>>>,
        claims: Vec<Arc<dyn Observer<ClaimView>>>,
    ) {
        let _ = self.observers.pods.set(pods);
        let _ = self.observers.claims.set(claims);
    }

    /// Whether the API server answers, shared with whoever else writes.
    pub fn reachability(&self) -> &Arc<Reachability> {
        &self.ctx.reachability
    }

    /// Probes the API server while it is reported unreachable; runs until
    /// the process ends.
    pub(crate) async fn run_reachability_probe(self: Arc<Self>) {
        self.ctx.reachability.probe(self.ctx.client.clone()).await;
    }

    pub fn caches(&self) -> &Arc<Caches> {
        &self.ctx.caches
    }

    /// This controller as the runtime runs it: `workers` syncs at once
    /// (`--concurrent-resourceclaim-syncs`), a jittered resync from
    /// `min_resync_period` (`--min-resync-period`).
    pub fn run(self: &Arc<Self>, workers: usize, min_resync_period: Duration) -> Run<Self> {
        Run::new(
            self.clone(),
            self.queue.clone(),
            self.ctx.reachability.clone(),
        )
        .workers(workers)
        .resync_every(min_resync_period)
    }

    /// Resolves once the first list of every watch has been loaded.
    pub async fn wait_synced(&self) {
        self.pods.wait_synced().await;
        self.claims.wait_synced().await;
        self.templates.wait_synced().await;
        if let Some(groups) = &self.pod_groups {
            groups.wait_synced().await;
        }
        self.ctx.caches.mark_synced();
    }

    pub fn is_synced(&self) -> bool {
        self.pods.is_synced()
            && self.claims.is_synced()
            && self.templates.is_synced()
            && self.pod_groups.as_ref().is_none_or(Informer::is_synced)
    }

    /// Runs the watches until the process ends. The pod watch is the
    /// process's only one: `also_pods` (other rooms' handlers, wired by
    /// `app.rs`) see each of its events after this controller does.
    pub(crate) async fn run_watches(self: Arc<Self>, also_pods: Vec<Arc<dyn Handler<PodView>>>) {
        let client = self.ctx.client.clone();
        let this = &*self;
        let mut pod_handlers: Vec<&dyn Handler<PodView>> = vec![this];
        pod_handlers.extend(also_pods.iter().map(|h| &**h));
        let pods = Fanout::new(pod_handlers);
        let groups = async {
            if let (Some(informer), Some(api)) = (&this.pod_groups, this.ctx.caches.pod_group_api())
            {
                informer
                    .run(
                        Api::<views::PodGroupView>::all_with(client.clone(), api),
                        this,
                    )
                    .await
            }
        };
        tokio::join!(
            this.pods
                .run_protobuf(Api::<PodView>::all(client.clone()), &pods),
            this.claims.run(Api::<ClaimView>::all(client.clone()), this),
            this.templates
                .run(Api::<TemplateView>::all(client.clone()), this),
            groups,
        );
    }

    fn enqueue(&self, keys: impl IntoIterator<Item = (WorkKey, Why)>) {
        if !self.queue.is_leading() {
            return;
        }
        for (key, why) in keys {
            debug!(key = %key, reason = %why, "enqueue");
            self.queue.add(key, why);
        }
    }
}
