//! The ResourceClaim lifecycle controller (kube-controller-manager's
//! `resourceclaim-controller`):
//!
//! - `mod.rs`: the [`Controller`] (queue, informers, leadership, observers
//!   of its pod and claim watches); `watches.rs` (what each event does),
//!   `worker.rs` (the worker loop, a span per sync with its reason),
//!   `resync.rs` (the periodic resync);
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

#[cfg(test)]
mod decision_tests;
#[cfg(test)]
mod execute_tests;
#[cfg(test)]
mod podgroup_tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use kube::Api;
use tracing::{debug, info};

use crate::model::features::FeatureGates;
use crate::model::views::{self, ClaimView, NodeView, PodView, TemplateView};
use crate::runtime::events::EventRecorder;
use crate::runtime::informer::{Handler, Informer, Observer};
use crate::runtime::reachability::Reachability;
use crate::runtime::shared::Fanout;
use crate::runtime::store::Store;
use crate::workqueue::WorkQueue;
use cache::Caches;
use context::Context;
use enqueue::{Why, WorkKey, pod_needs_work};
use metrics::{ControllerMetrics, MetricsNaming};

pub use context::Synced;
/// Whether the API server serves PodGroups (the DRAWorkloadResourceClaims
/// gate needs them), for `app.rs`.
pub use podgroup::discover_api as discover_pod_group_api;

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

/// The controller: informers feeding caches, one queue, N workers.
pub struct Controller {
    ctx: Arc<Context>,
    queue: WorkQueue<WorkKey>,
    /// Only the leader enqueues; a standby keeps its caches warm.
    leading: AtomicBool,
    /// Why each queued key was queued, until a worker takes it.
    reasons: Mutex<HashMap<WorkKey, Why>>,
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
            queue: WorkQueue::new(QUEUE_NAME, Some(registry)),
            leading: AtomicBool::new(false),
            reasons: Mutex::new(HashMap::new()),
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

    pub fn queue(&self) -> &WorkQueue<WorkKey> {
        &self.queue
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
        if !self.leading.load(Ordering::Acquire) {
            return;
        }
        for (key, why) in keys {
            debug!(key = %key, reason = %why, "enqueue");
            self.add(key, why);
        }
    }

    /// Queues `key`, remembering why unless an earlier reason is still
    /// waiting to be reported with it (the queue holds a key once).
    fn add(&self, key: WorkKey, why: Why) {
        self.reasons
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_insert(why);
        self.queue.add(key);
    }

    /// Why `key` was queued, for its sync span; a key with no reason left
    /// came back from a backoff.
    fn take_reason(&self, key: &WorkKey) -> Why {
        self.reasons
            .lock()
            .unwrap()
            .remove(key)
            .unwrap_or(Why::Retry)
    }

    /// Called when this replica becomes leader: from now on events enqueue
    /// work, and everything that happened before is swept once.
    pub(crate) fn start_leading(&self) {
        self.leading.store(true, Ordering::Release);
        let caches = &self.ctx.caches;
        let mut claims = 0;
        for claim in caches.claims.list() {
            self.add(
                WorkKey::claim(claim.namespace(), claim.name()),
                Why::Leading,
            );
            claims += 1;
        }
        let mut pods = 0;
        for pod in caches.pods.list() {
            if pod_needs_work(&pod, caches, self.ctx.gates).is_ok() {
                self.add(WorkKey::pod(pod.namespace(), pod.name()), Why::Leading);
                pods += 1;
            }
        }
        let mut groups = 0;
        for group in caches.pod_groups.list() {
            if podgroup::needs_work(&group, caches, self.ctx.gates) {
                self.add(
                    WorkKey::pod_group(group.namespace(), group.name()),
                    Why::Leading,
                );
                groups += 1;
            }
        }
        info!(
            claims,
            pods, groups, "leading: queued every claim and every pod and PodGroup that needs work"
        );
    }

    /// Stops handing out work and waits (bounded by the caller) for
    /// in-flight syncs to finish.
    pub async fn shut_down(&self) {
        self.leading.store(false, Ordering::Release);
        self.queue.shut_down();
        self.queue.wait_idle().await;
    }
}
