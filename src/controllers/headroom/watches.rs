//! What wakes headroom: its own watch of watermarks, its share of the
//! process's pod watch (it keeps the pods it reads), and the changes of the
//! process's claim, slice, class and node stores, which it observes.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::Api;
use kube::api::ListParams;
use tracing::error;

use super::buffer::BufferView;
use super::controller::{
    BUFFER_KEY_PREFIX, Controller, PLACEHOLDER_PRIORITY, POD_KEY_PREFIX, SEED_KEY_PREFIX,
};
use super::seed::SeedWatermarkView;
use super::watermark::{WatermarkView, selects};
use crate::model::views::{ClaimView, NodeView, PodView};
use crate::runtime::informer::{Handler, Observer};
use crate::runtime::store::object_key;

/// The pods headroom keeps of the pod watch: those bound to a node and not
/// finished (usage), those with claims that have not finished (they may
/// wait for devices), and placeholders of any state. Unbound pods without
/// claims, and finished ones, weigh nothing here and are not held.
pub fn keeps(pod: &PodView) -> bool {
    pod.is_placeholder()
        || (!pod.is_terminal()
            && (pod.node_name().is_some() || !pod.spec.resource_claims.is_empty()))
}

impl Controller {
    /// Runs the watermark watch until the process ends.
    pub async fn run_watch(self: Arc<Self>) {
        self.check_crd().await;
        let events = WatermarkEvents(&self);
        let seed_events = SeedEvents(&self);
        let seeds = async {
            if let Some(watch) = &self.seed_watch {
                watch
                    .run(
                        Api::<SeedWatermarkView>::all(self.client.clone()),
                        &seed_events,
                    )
                    .await
            }
        };
        let buffer_events = BufferEvents(&self);
        let buffers = async {
            if let (Some(watch), Some(api)) = (&self.buffer_watch, &self.buffer_api) {
                watch
                    .run(
                        Api::<BufferView>::all_with(self.client.clone(), api),
                        &buffer_events,
                    )
                    .await
            }
        };
        tokio::join!(
            self.watermark_watch
                .run(Api::<WatermarkView>::all(self.client.clone()), &events),
            seeds,
            buffers,
        );
    }

    /// Says once, plainly, when the CRD is not installed: the watch alone
    /// would only retry with "404 page not found".
    async fn check_crd(&self) {
        let api = Api::<WatermarkView>::all(self.client.clone());
        if let Err(kube::Error::Api(status)) = api.list(&ListParams::default().limit(1)).await
            && status.code == 404
        {
            error!(
                "the NodeScalingWatermark CRD (nodescalingwatermarks.dra-claim-controller.io) is not \
                 installed: apply charts/dra-claim-controller/crds/nodescalingwatermarks.yaml (helm \
                 install does), or drop headroom from --controllers; waiting for it"
            );
        }
        if self.seed_watch.is_some()
            && let Err(kube::Error::Api(status)) =
                Api::<SeedWatermarkView>::all(self.client.clone())
                    .list(&ListParams::default().limit(1))
                    .await
            && status.code == 404
        {
            error!(
                "--headroom-seed-watermarks: the seed operator's CRD \
                 (nodescalingwatermarks.redhatcop.redhat.io) is not installed: install the chart \
                 with headroom.seedOperator.enabled=true, or drop the flag; waiting for it"
            );
        }
    }

    /// Resolves once the watermarks and the process's watches are loaded.
    pub async fn wait_synced(&self) {
        self.watermark_watch.wait_synced().await;
        if let Some(watch) = &self.seed_watch {
            watch.wait_synced().await;
        }
        if let Some(watch) = &self.buffer_watch {
            watch.wait_synced().await;
        }
        self.synced.wait().await;
    }

    /// The watermarks a change of `pod` (from `old`) may move: those whose
    /// placeholder it is, and those whose nodes it is or was bound to.
    fn touched_by(&self, pod: &PodView, old: Option<&PodView>) -> Vec<String> {
        let nodes: Vec<Arc<NodeView>> = [Some(pod), old]
            .into_iter()
            .flatten()
            .filter_map(|p| self.devices.nodes.get(p.node_name()?))
            .collect();
        self.watermarks
            .list()
            .iter()
            .filter(|wm| {
                let placeholder = [Some(pod), old].into_iter().flatten().any(|p| {
                    p.namespace() == wm.namespace() && p.placeholder_of() == Some(wm.name())
                });
                placeholder || {
                    let selector = wm.spec.settle().placement.node_selector;
                    nodes.iter().any(|n| selects(&selector, n.labels()))
                }
            })
            .map(|wm| object_key(wm.namespace(), wm.name()))
            .collect()
    }

    fn pod_changed(&self, pod: &PodView, old: Option<&PodView>) {
        for key in self.touched_by(pod, old) {
            self.enqueue(key);
        }
        // The seed's watermarks: those whose nodes the pod is or was on.
        let nodes: Vec<Arc<NodeView>> = [Some(pod), old]
            .into_iter()
            .flatten()
            .filter_map(|p| self.devices.nodes.get(p.node_name()?))
            .collect();
        if nodes.is_empty() {
            return;
        }
        for wm in self.seed_watermarks.list() {
            let selector = wm.spec.node_selector();
            if nodes.iter().any(|n| selects(&selector, n.labels())) {
                self.enqueue(format!(
                    "{SEED_KEY_PREFIX}{}",
                    object_key(wm.namespace(), wm.name())
                ));
            }
        }
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
            self.0.forget_watermark(gone.namespace(), gone.name());
        }
        self.0.enqueue_all();
    }
    fn applied(&self, wm: WatermarkView) {
        let key = object_key(wm.namespace(), wm.name());
        self.0.watermarks.apply(key.clone(), Arc::new(wm));
        self.0.enqueue(key);
    }
    fn deleted(&self, wm: WatermarkView) {
        self.0
            .watermarks
            .delete(&object_key(wm.namespace(), wm.name()));
        self.0.forget_watermark(wm.namespace(), wm.name());
    }
}

struct SeedEvents<'a>(&'a Controller);

/// The seed operator's watermarks: kept, and queued on each change.
impl Handler<SeedWatermarkView> for SeedEvents<'_> {
    fn relisted(&self, watermarks: Vec<SeedWatermarkView>) {
        let entries = watermarks
            .into_iter()
            .map(|w| (object_key(w.namespace(), w.name()), Arc::new(w)))
            .collect();
        for gone in self.0.seed_watermarks.replace(entries) {
            self.0.forget_seed(gone.namespace(), gone.name());
        }
        self.0.enqueue_all();
    }
    fn applied(&self, wm: SeedWatermarkView) {
        let key = object_key(wm.namespace(), wm.name());
        self.0.seed_watermarks.apply(key.clone(), Arc::new(wm));
        self.0.enqueue(format!("{SEED_KEY_PREFIX}{key}"));
    }
    fn deleted(&self, wm: SeedWatermarkView) {
        self.0
            .seed_watermarks
            .delete(&object_key(wm.namespace(), wm.name()));
        self.0.forget_seed(wm.namespace(), wm.name());
    }
}

struct BufferEvents<'a>(&'a Controller);

/// CapacityBuffers: kept, and those with our strategy queued on each change.
impl Handler<BufferView> for BufferEvents<'_> {
    fn relisted(&self, buffers: Vec<BufferView>) {
        let entries = buffers
            .into_iter()
            .map(|b| (object_key(b.namespace(), b.name()), Arc::new(b)))
            .collect();
        for gone in self.0.buffers.replace(entries) {
            self.0.forget_buffer(gone.namespace(), gone.name());
        }
        self.0.enqueue_all();
    }
    fn applied(&self, buffer: BufferView) {
        let key = object_key(buffer.namespace(), buffer.name());
        let ours = buffer.spec.is_ours();
        self.0.buffers.apply(key.clone(), Arc::new(buffer));
        if ours {
            self.0.enqueue(format!("{BUFFER_KEY_PREFIX}{key}"));
        }
    }
    fn deleted(&self, buffer: BufferView) {
        self.0
            .buffers
            .delete(&object_key(buffer.namespace(), buffer.name()));
        self.0.forget_buffer(buffer.namespace(), buffer.name());
    }
}

/// Headroom's share of the process's pod watch.
impl Handler<PodView> for Controller {
    fn admit(&self, pod: PodView) -> Option<PodView> {
        keeps(&pod).then_some(pod)
    }
    fn relisted(&self, pods: Vec<PodView>) {
        let entries = pods
            .into_iter()
            .map(|p| (object_key(p.namespace(), p.name()), Arc::new(p)))
            .collect();
        self.pods.replace(entries);
        self.enqueue_all();
    }
    fn applied(&self, pod: PodView) {
        let key = object_key(pod.namespace(), pod.name());
        if self.yield_enabled && pod.waits_for_devices(PLACEHOLDER_PRIORITY) {
            self.enqueue(format!("{POD_KEY_PREFIX}{key}"));
        }
        let old = if keeps(&pod) {
            self.pods.apply(key, Arc::new(pod.clone()))
        } else {
            self.pods.delete(&key)
        };
        self.pod_changed(&pod, old.as_deref());
    }
    fn deleted(&self, pod: PodView) {
        let old = self.pods.delete(&object_key(pod.namespace(), pod.name()));
        self.pod_changed(&pod, old.as_deref());
    }
}

/// Claims, slices, classes and nodes move device counts and node
/// selections: every watermark is looked at again.
macro_rules! requeue_all_on_change {
    ($($kind:ty),*) => {$(
        impl Observer<$kind> for Controller {
            fn relisted(&self) {
                self.enqueue_all();
            }
            fn applied(&self, _old: Option<&$kind>, _new: &$kind) {
                self.enqueue_all();
            }
            fn deleted(&self, _last: &$kind) {
                self.enqueue_all();
            }
        }
    )*};
}

requeue_all_on_change!(ClaimView, ResourceSlice, DeviceClass, NodeView);
