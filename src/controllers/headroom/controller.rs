//! The headroom controller: its watches (watermarks, pods, nodes), one
//! queue of watermark keys with one worker, and the sync that applies the
//! placeholders' Deployment and writes the status. Leader only.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use prometheus::{IntGaugeVec, Opts, Registry};
use tracing::{Instrument, debug, info, info_span, warn};

use super::desired::{CPU_MEMORY_ENTRY, Owner, cpu_memory_deployment};
use super::sizing::cpu_memory_placeholders;
use super::status::{Observed, conditions, status_patch};
use super::usage::{HeadroomNode, HeadroomPod, workload_requests};
use super::watermark::{WatermarkView, carry_transitions, selects};
use crate::runtime::error::{SyncError, kube_err};
use crate::runtime::informer::{Handler, Informer};
use crate::runtime::store::{Store, object_key};
use crate::workqueue::WorkQueue;

/// The queue's name (`workqueue_*{name="dra_headroom"}`).
pub const QUEUE_NAME: &str = "dra_headroom";
/// Field manager of the placeholders' Deployments and of the status.
pub const FIELD_MANAGER: &str = "dra-claim-controller-headroom";

/// `dra_headroom_placeholders{namespace,watermark,entry,state}`.
struct Metrics {
    placeholders: IntGaugeVec,
}

impl Metrics {
    fn register(registry: &Registry) -> anyhow::Result<Self> {
        let placeholders = IntGaugeVec::new(
            Opts::new(
                "dra_headroom_placeholders",
                "Placeholders of a NodeScalingWatermark entry: desired, ready (bound) and pending (waiting for a node).",
            ),
            &["namespace", "watermark", "entry", "state"],
        )?;
        registry.register(Box::new(placeholders.clone()))?;
        Ok(Metrics { placeholders })
    }

    fn set(&self, wm: &WatermarkView, entry: &str, observed: &Observed) {
        for (state, value) in [
            ("desired", observed.desired),
            ("ready", observed.ready),
            ("pending", observed.pending),
        ] {
            self.placeholders
                .with_label_values(&[wm.namespace(), wm.name(), entry, state])
                .set(i64::from(value));
        }
    }

    fn forget(&self, namespace: &str, name: &str) {
        for state in ["desired", "ready", "pending"] {
            let _ =
                self.placeholders
                    .remove_label_values(&[namespace, name, CPU_MEMORY_ENTRY, state]);
        }
    }
}

/// The headroom controller.
pub struct Controller {
    client: kube::Client,
    queue: WorkQueue<String>,
    leading: AtomicBool,
    watermarks: Store<WatermarkView>,
    pods: Store<HeadroomPod>,
    nodes: Store<HeadroomNode>,
    /// What the last successful sync of each watermark wrote (Deployment
    /// body, status counts): an unchanged sync writes nothing.
    written: std::sync::Mutex<std::collections::HashMap<String, (serde_json::Value, Observed)>>,
    watermark_informer: Informer,
    pod_informer: Informer,
    node_informer: Informer,
    metrics: Metrics,
}

impl Controller {
    pub fn new(client: kube::Client, registry: &Registry) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Controller {
            client,
            queue: WorkQueue::new(QUEUE_NAME, Some(registry)),
            leading: AtomicBool::new(false),
            watermarks: Store::new(Vec::new()),
            pods: Store::new(Vec::new()),
            nodes: Store::new(Vec::new()),
            written: Default::default(),
            watermark_informer: Informer::new("nodescalingwatermarks"),
            pod_informer: Informer::new("pods (headroom)"),
            node_informer: Informer::new("nodes (headroom)"),
            metrics: Metrics::register(registry)?,
        }))
    }

    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Runs the three watches until the process ends.
    pub async fn run_watches(self: Arc<Self>) {
        let client = self.client.clone();
        let this = &*self;
        let (watermark_events, pod_events, node_events) =
            (WatermarkEvents(this), PodEvents(this), NodeEvents(this));
        tokio::join!(
            this.watermark_informer
                .run(Api::<WatermarkView>::all(client.clone()), &watermark_events),
            this.pod_informer
                .run(Api::<HeadroomPod>::all(client.clone()), &pod_events),
            this.node_informer
                .run(Api::<HeadroomNode>::all(client.clone()), &node_events),
        );
    }

    pub async fn wait_synced(&self) {
        self.watermark_informer.wait_synced().await;
        self.pod_informer.wait_synced().await;
        self.node_informer.wait_synced().await;
    }

    /// From now on events enqueue work; every watermark is queued.
    pub fn start_leading(&self) {
        self.leading.store(true, Ordering::Release);
        self.enqueue_all();
        info!(
            watermarks = self.watermarks.len(),
            "headroom leading: queued every watermark"
        );
    }

    pub async fn shut_down(&self) {
        self.leading.store(false, Ordering::Release);
        self.queue.shut_down();
        self.queue.wait_idle().await;
    }

    fn enqueue(&self, key: String) {
        if self.leading.load(Ordering::Acquire) {
            self.queue.add(key);
        }
    }

    /// Usage moves every watermark whose nodes it touches; there are few
    /// watermarks, so all are queued (the queue folds repeats).
    fn enqueue_all(&self) {
        for wm in self.watermarks.list() {
            self.enqueue(object_key(wm.namespace(), wm.name()));
        }
    }

    /// The one worker: syncs never overlap.
    pub async fn run_worker(self: Arc<Self>) {
        while let Some(key) = self.queue.get().await {
            let span = info_span!("headroom", watermark = %key);
            let result = self.sync(&key).instrument(span.clone()).await;
            let _entered = span.enter();
            match result {
                Ok(()) => self.queue.forget(&key),
                Err(err) => {
                    warn!(error = %err, "headroom sync failed; retrying with backoff");
                    self.queue.add_rate_limited(key.clone());
                }
            }
            self.queue.done(&key);
        }
    }

    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let Some(wm) = self.watermarks.get(key) else {
            debug!("watermark is gone; its objects go with it (owner references)");
            return Ok(());
        };
        let settled = wm.spec.settle();
        let selected: HashSet<String> = self
            .nodes
            .list()
            .iter()
            .filter(|n| selects(&settled.placement.node_selector, n.labels()))
            .map(|n| n.name().to_string())
            .collect();
        let pods = self.pods.list();
        let usage = workload_requests(pods.iter().map(|p| &**p), |node| selected.contains(node));
        let mine = |p: &&Arc<HeadroomPod>| {
            p.namespace() == wm.namespace() && p.watermark() == Some(wm.name()) && !p.is_terminal()
        };
        let ready = pods
            .iter()
            .filter(mine)
            .filter(|p| p.spec.node_name.is_some())
            .count();
        let pending = pods
            .iter()
            .filter(mine)
            .filter(|p| p.spec.node_name.is_none())
            .count();
        let mut observed = Observed {
            generation: wm.metadata.generation,
            ready: u32::try_from(ready).unwrap_or(u32::MAX),
            pending: u32::try_from(pending).unwrap_or(u32::MAX),
            ..Observed::default()
        };
        let mut deployment = serde_json::Value::Null;
        match &settled.cpu_memory {
            Ok(entry) => {
                observed.desired =
                    cpu_memory_placeholders(usage, entry.percentage, entry.pause, entry.bounds);
                let owner = Owner {
                    namespace: wm.namespace(),
                    name: wm.name(),
                    uid: wm.uid(),
                };
                deployment =
                    cpu_memory_deployment(owner, &settled.placement, entry, observed.desired);
                debug!(
                    selected_nodes = selected.len(),
                    cpu_in_use = %usage.cpu,
                    memory_in_use = %usage.memory,
                    desired = observed.desired,
                    ready = observed.ready,
                    pending = observed.pending,
                    "placeholders sized"
                );
            }
            Err(why) => {
                warn!(reason = %why, "watermark is invalid; no placeholders for it");
                observed.invalid = Some(why.clone());
            }
        }
        if !wm.spec.devices.is_empty() && observed.invalid.is_none() {
            observed.invalid = Some(
                "spec.devices: device headroom is not served by this version yet; remove the \
                 entries or run a version that serves them"
                    .into(),
            );
        }
        self.metrics.set(&wm, CPU_MEMORY_ENTRY, &observed);
        let written = self.written.lock().unwrap().get(key).cloned();
        if written.as_ref().map(|(d, _)| d) != Some(&deployment) && !deployment.is_null() {
            self.apply_deployment(wm.namespace(), &deployment).await?;
            info!(
                desired = observed.desired,
                "placeholders' Deployment applied"
            );
        }
        if written.as_ref().map(|(_, o)| o) != Some(&observed) {
            self.write_status(&wm, &observed).await?;
        }
        self.written
            .lock()
            .unwrap()
            .insert(key.to_string(), (deployment, observed));
        Ok(())
    }

    async fn apply_deployment(
        &self,
        namespace: &str,
        deployment: &serde_json::Value,
    ) -> Result<(), SyncError> {
        let name = deployment["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let resource = kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("apps", "v1", "Deployment"),
            "deployments",
        );
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource);
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(deployment),
        )
        .await
        .map_err(kube_err(format!("applying Deployment {namespace}/{name}")))?;
        Ok(())
    }

    async fn write_status(&self, wm: &WatermarkView, observed: &Observed) -> Result<(), SyncError> {
        let now = Timestamp::now().to_string();
        let conditions = carry_transitions(&wm.status.conditions, conditions(observed), &now);
        let api: Api<WatermarkView> = Api::namespaced(self.client.clone(), wm.namespace());
        api.patch_status(
            wm.name(),
            &PatchParams::default(),
            &Patch::Merge(status_patch(observed, &conditions)),
        )
        .await
        .map_err(kube_err(format!(
            "writing status of NodeScalingWatermark {}/{}",
            wm.namespace(),
            wm.name()
        )))?;
        Ok(())
    }
}

struct WatermarkEvents<'a>(&'a Controller);

impl Handler<WatermarkView> for WatermarkEvents<'_> {
    fn relisted(&self, watermarks: Vec<WatermarkView>) {
        let entries = watermarks
            .into_iter()
            .map(|w| (object_key(w.namespace(), w.name()), Arc::new(w)))
            .collect();
        for gone in self.0.watermarks.replace(entries) {
            self.0.metrics.forget(gone.namespace(), gone.name());
        }
        self.0.enqueue_all();
    }
    fn applied(&self, wm: WatermarkView) {
        let key = object_key(wm.namespace(), wm.name());
        self.0.watermarks.apply(key.clone(), Arc::new(wm));
        self.0.enqueue(key);
    }
    fn deleted(&self, wm: WatermarkView) {
        let key = object_key(wm.namespace(), wm.name());
        self.0.watermarks.delete(&key);
        self.0.written.lock().unwrap().remove(&key);
        self.0.metrics.forget(wm.namespace(), wm.name());
    }
}

struct PodEvents<'a>(&'a Controller);

impl Handler<HeadroomPod> for PodEvents<'_> {
    fn relisted(&self, pods: Vec<HeadroomPod>) {
        let entries = pods
            .into_iter()
            .map(|p| (object_key(p.namespace(), p.name()), Arc::new(p)))
            .collect();
        self.0.pods.replace(entries);
        self.0.enqueue_all();
    }
    fn applied(&self, pod: HeadroomPod) {
        self.0
            .pods
            .apply(object_key(pod.namespace(), pod.name()), Arc::new(pod));
        self.0.enqueue_all();
    }
    fn deleted(&self, pod: HeadroomPod) {
        self.0.pods.delete(&object_key(pod.namespace(), pod.name()));
        self.0.enqueue_all();
    }
}

struct NodeEvents<'a>(&'a Controller);

impl Handler<HeadroomNode> for NodeEvents<'_> {
    fn relisted(&self, nodes: Vec<HeadroomNode>) {
        let entries = nodes
            .into_iter()
            .map(|n| (n.name().to_string(), Arc::new(n)))
            .collect();
        self.0.nodes.replace(entries);
        self.0.enqueue_all();
    }
    fn applied(&self, node: HeadroomNode) {
        self.0.nodes.apply(node.name().to_string(), Arc::new(node));
        self.0.enqueue_all();
    }
    fn deleted(&self, node: HeadroomNode) {
        self.0.nodes.delete(node.name());
        self.0.enqueue_all();
    }
}
