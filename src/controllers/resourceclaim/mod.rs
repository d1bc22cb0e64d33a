//! The ResourceClaim lifecycle controller (kube-controller-manager's
//! `resourceclaim-controller`):
//!
//! - `mod.rs`: the [`Controller`] (its caches over the process's stores,
//!   its queue); `watches.rs` (what each change of those stores queues),
//!   `worker.rs` (the sync of one key, as the runtime's [`Reconciler`]),
//!   `resync.rs` (what a takeover and a resync queue); the runtime runs the
//!   workers, the leader gate, retries, the resync and the shut-down;
//! - `pod.rs`, `claim.rs`, `podgroup.rs`: the decisions (pure `decide`) and
//!   their writes (`execute`); `entries.rs`: an owner's claims adopted,
//!   created and recorded, for pod and PodGroup work alike;
//! - below them: `enqueue.rs` (what wakes what, and why), `cache.rs`,
//!   `context.rs`, `patch.rs`, `metrics.rs`.
//!
//! Allocation is not its business: on nodes declared for the allocator it
//! only stays quiet about claims nothing else would allocate.

pub mod cache;
pub mod claim;
pub(crate) mod context;
pub(crate) mod enqueue;
pub(crate) mod entries;
pub(crate) mod metrics;
pub(crate) mod patch;
pub mod pod;
pub(crate) mod podgroup;

mod resync;
mod watches;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use crate::model::selector::LabelSelector;
use crate::runtime::controller::{Controller as Run, Lead, Queue};
use crate::runtime::events::EventRecorder;
use crate::shared::Shared;
use crate::watches::devices::Kinds;
use cache::{Caches, DeclaredNodes};
use context::Context;
use enqueue::{Why, WorkKey};
use metrics::{ControllerMetrics, MetricsNaming};

/// The queue name, as kube-controller-manager's (`workqueue_*{name="resource_claim"}`).
pub(crate) const QUEUE_NAME: &str = "resource_claim";
/// The source of our events, as kube-controller-manager's controller names it.
pub(crate) const EVENT_COMPONENT: &str = "resource_claim";

/// What the claim controller is built with.
pub struct Settings {
    /// `--concurrent-resourceclaim-syncs`.
    pub workers: usize,
    /// `--min-resync-period`.
    pub min_resync_period: Duration,
    pub metrics_naming: MetricsNaming,
    /// `--allocate-on-nodes`: pre-scheduled pods on these nodes have their
    /// claims allocated by the allocator, so nobody is told that nothing
    /// will.
    pub allocate_on_nodes: Option<LabelSelector>,
}

/// The claim controller on the process's watches: it observes pods,
/// claims, templates and PodGroups (and reads nodes with
/// `--allocate-on-nodes`). Always runs.
pub fn build(shared: &Shared, settings: Settings) -> anyhow::Result<Box<dyn Lead>> {
    let declared = settings.allocate_on_nodes.map(|selector| {
        shared.read_devices(Kinds {
            nodes: true,
            ..Kinds::default()
        });
        DeclaredNodes {
            selector,
            nodes: shared.devices.stores().nodes.clone(),
        }
    });
    let mut caches = Caches::on(&shared.claims, shared.group_claims_served());
    if let Some(declared) = declared {
        caches = caches.with_allocator_nodes(declared);
    }
    let caches = Arc::new(caches);
    let metrics =
        ControllerMetrics::register(&shared.registry, caches.clone(), settings.metrics_naming)?;
    let client = shared.client.clone();
    let controller = Arc::new(Controller {
        ctx: Arc::new(Context {
            events: EventRecorder::new(client.clone(), EVENT_COMPONENT, shared.identity.clone()),
            client,
            caches,
            gates: shared.gates,
            metrics,
            reachability: shared.reachability.clone(),
        }),
        queue: Queue::new(QUEUE_NAME, Some(&shared.registry)),
    });
    shared.observe_pods(controller.clone());
    shared.observe_claims(controller.clone());
    shared.observe_templates(controller.clone());
    shared.observe_pod_groups(controller.clone());
    Ok(Box::new(
        controller.run(settings.workers, settings.min_resync_period),
    ))
}

/// The controller: its caches over the process's stores, one queue (the
/// runtime runs its N workers).
pub struct Controller {
    ctx: Arc<Context>,
    /// Keys are queued only while leading; a standby keeps its caches warm.
    queue: Queue<WorkKey, Why>,
}

impl Controller {
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

    pub fn is_synced(&self) -> bool {
        self.ctx.caches.is_synced()
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
