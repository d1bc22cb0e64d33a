//! What wakes headroom: its own watch of watermarks, its share of the
//! process's pod watch (it keeps the pods it reads), and the changes of the
//! process's claim, slice, class and node stores, which it observes.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::Api;
use tracing::info;

use super::capacity_buffers::buffer::{BufferApi, BufferView};
use super::controller::{
    BUFFER_KEY_PREFIX, Controller, PLACEHOLDER_PRIORITY, POD_KEY_PREFIX, SEED_KEY_PREFIX,
};
use super::operator_compat::seed::SeedWatermarkView;
use super::watermarks::usage::waits_for_devices;
use super::watermarks::watermark::{WatermarkView, selects};
use crate::model::views::{ClaimView, NodeView, PodView};
use crate::runtime::informer::{Handler, Observer};
use crate::runtime::store::{Store, object_key};

/// The pods headroom keeps of the pod watch: those bound to a node and not
/// finished (usage), those with claims that have not finished (they may
/// wait for devices), and placeholders of any state. Unbound pods without
/// claims, and finished ones, weigh nothing here and are not held.
pub(crate) fn keeps(pod: &PodView) -> bool {
    pod.is_placeholder()
        || (!pod.is_terminal()
            && (pod.node_name().is_some() || !pod.spec.resource_claims.is_empty()))
}

impl Controller {
    /// Runs the front doors' watches until the process ends, each once
    /// its CRD is served (`doors.rs`).
    pub async fn run_watch(self: Arc<Self>) {
        let served = &self.metrics.door_served;
        let events = Kept {
            controller: &self,
            store: &self.watermarks,
            prefix: "",
            serves: |_| true,
            forget: Controller::forget_watermark,
        };
        let ours = async {
            let door = &self.watermark_door;
            door.opened(&self.client, &self.health, served).await;
            door.watch
                .run(Api::<WatermarkView>::all(self.client.clone()), &events)
                .await
        };
        let seed_events = Kept {
            controller: &self,
            store: &self.seed_watermarks,
            prefix: SEED_KEY_PREFIX,
            serves: |_| true,
            forget: Controller::forget_seed,
        };
        let seeds = async {
            if let Some(door) = &self.seed_door {
                door.opened(&self.client, &self.health, served).await;
                door.watch
                    .run(
                        Api::<SeedWatermarkView>::all(self.client.clone()),
                        &seed_events,
                    )
                    .await
            }
        };
        let buffer_events = Kept {
            controller: &self,
            store: &self.buffers,
            prefix: BUFFER_KEY_PREFIX,
            serves: |b: &BufferView| b.spec.is_ours(),
            forget: Controller::forget_buffer,
        };
        let buffers = async {
            if let Some(door) = &self.buffer_door {
                let version = door.opened(&self.client, &self.health, served).await;
                let api = self.buffer_api.get_or_init(|| BufferApi { version });
                info!(api_version = %api.api_version(), "serving CapacityBuffers with strategy dra-claim-controller.io/placeholder-pods");
                let watch = door.watch.run(
                    Api::<BufferView>::all_with(self.client.clone(), api),
                    &buffer_events,
                );
                tokio::join!(watch, self.run_source_watches());
            }
        };
        tokio::join!(ours, seeds, buffers);
    }

    /// Resolves once the process's watches are loaded and each front door
    /// is known closed or has its first list in.
    pub async fn wait_synced(&self) {
        self.watermark_door.wait_settled().await;
        for door in [&self.seed_door, &self.buffer_door].into_iter().flatten() {
            door.wait_settled().await;
        }
        self.synced.wait().await;
    }

    /// The door objects a change of `pod` (from `old`) may move: the one
    /// whose placeholder it is (by the one rule, `door_key_of`), and ours
    /// and the seed operator's watermarks whose nodes it is or was bound to.
    fn touched_by(&self, pod: &PodView, old: Option<&PodView>) -> Vec<String> {
        let versions = || [Some(pod), old].into_iter().flatten();
        let nodes: Vec<Arc<NodeView>> = versions()
            .filter_map(|p| self.devices.nodes.get(p.node_name()?))
            .collect();
        let on_nodes = |selector: &std::collections::BTreeMap<String, String>| {
            nodes.iter().any(|n| selects(selector, n.labels()))
        };
        let mut keys: Vec<String> = self
            .watermarks
            .list()
            .iter()
            .filter(|wm| on_nodes(&wm.spec.settle().placement.node_selector))
            .map(|wm| object_key(wm.namespace(), wm.name()))
            .collect();
        // Its own door: a watermark (its counts follow its placeholders)
        // while it exists; a buffer while the placeholder waits with its
        // gate, which the buffer's sync lifts (other changes move nothing a
        // buffer counts).
        keys.extend(versions().filter_map(|p| {
            let key = self.door_key_of(p)?;
            let moves = if key.starts_with(BUFFER_KEY_PREFIX) {
                p.spec.placeholder_gate.is_some() && p.node_name().is_none()
            } else {
                self.watermarks.get(&key).is_some()
            };
            moves.then_some(key)
        }));
        keys.extend(
            self.seed_watermarks
                .list()
                .iter()
                .filter(|wm| on_nodes(&wm.spec.node_selector()))
                .map(|wm| format!("{SEED_KEY_PREFIX}{}", object_key(wm.namespace(), wm.name()))),
        );
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    fn pod_changed(&self, pod: &PodView, old: Option<&PodView>) {
        for key in self.touched_by(pod, old) {
            self.enqueue(key);
        }
    }
}

/// A watch of headroom's own objects (our watermarks, the seed operator's,
/// CapacityBuffers): kept in `store`; a change queues the object's key
/// (`prefix` and `namespace/name`) when `serves` says it is ours to serve;
/// what was kept for an object that is gone is forgotten.
struct Kept<'a, K> {
    controller: &'a Controller,
    store: &'a Store<K>,
    prefix: &'static str,
    serves: fn(&K) -> bool,
    forget: fn(&Controller, &str, &str),
}

/// `namespace/name` of a namespaced object.
fn key_of<K: kube::Resource>(obj: &K) -> String {
    let meta = obj.meta();
    object_key(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

impl<K: kube::Resource + Send + Sync> Handler<K> for Kept<'_, K> {
    fn relisted(&self, objects: Vec<K>) {
        let entries = objects
            .into_iter()
            .map(|o| (key_of(&o), Arc::new(o)))
            .collect();
        for gone in self.store.replace(entries) {
            let meta = gone.meta();
            (self.forget)(
                self.controller,
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
            );
        }
        // Every object of this door (a change missed in a watch gap comes
        // back as a relist, not as an event).
        for obj in self.store.list() {
            if (self.serves)(&obj) {
                self.controller
                    .enqueue(format!("{}{}", self.prefix, key_of(&*obj)));
            }
        }
        self.controller.enqueue_all();
    }
    fn applied(&self, obj: K) {
        let key = key_of(&obj);
        let serves = (self.serves)(&obj);
        self.store.apply(key.clone(), Arc::new(obj));
        if serves {
            self.controller.enqueue(format!("{}{key}", self.prefix));
        }
    }
    fn deleted(&self, obj: K) {
        self.store.delete(&key_of(&obj));
        let meta = obj.meta();
        (self.forget)(
            self.controller,
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        );
    }
}

impl Controller {
    /// `pod` to keep: the shared pod store's copy of this very version
    /// when it holds one (its keeper handles each pod event first), so that
    /// a pod both keep is held once. Its copy differs from the event only in
    /// the pod's history (and a recorded extended-resource claim a later
    /// write dropped): such a copy is not shared.
    fn shared(&self, pod: PodView) -> Arc<PodView> {
        match self
            .claim_pods
            .get(&object_key(pod.namespace(), pod.name()))
        {
            Some(cached) if same_version(&cached, &pod) => cached,
            _ => Arc::new(pod),
        }
    }
}

fn same_version(cached: &PodView, seen: &PodView) -> bool {
    cached.uid() == seen.uid()
        && cached.metadata.resource_version == seen.metadata.resource_version
        && cached.status.extended_resource_claim_status.is_some()
            == seen.status.extended_resource_claim_status.is_some()
}

/// Headroom's share of the process's pod watch.
impl Handler<PodView> for Controller {
    fn admit(&self, pod: PodView) -> Option<PodView> {
        keeps(&pod).then_some(pod)
    }
    fn relisted(&self, pods: Vec<PodView>) {
        let entries = pods
            .into_iter()
            .map(|p| (object_key(p.namespace(), p.name()), self.shared(p)))
            .collect();
        self.pods.replace(entries);
        self.enqueue_all();
        // A relist delivers no event per pod: the pods that wait for
        // devices are looked at again, as their events would have had them.
        if self.yield_enabled {
            for pod in self.pods.list() {
                if waits_for_devices(&pod, PLACEHOLDER_PRIORITY) {
                    self.enqueue(format!(
                        "{POD_KEY_PREFIX}{}",
                        object_key(pod.namespace(), pod.name())
                    ));
                }
            }
        }
    }
    fn applied(&self, pod: PodView) {
        let key = object_key(pod.namespace(), pod.name());
        let waits = self.yield_enabled && waits_for_devices(&pod, PLACEHOLDER_PRIORITY);
        let pod = self.shared(pod);
        let old = if keeps(&pod) {
            self.pods.apply(key.clone(), pod.clone())
        } else {
            self.pods.delete(&key)
        };
        // Queued only once the store holds this version: a worker that
        // took the key first would read the version before it (not yet
        // Unschedulable), drop the key, and no event would bring it back
        // (kube-scheduler does not rewrite an unchanged condition).
        if waits {
            self.enqueue(format!("{POD_KEY_PREFIX}{key}"));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(rv: &str, extended: bool) -> PodView {
        let mut status = json!({"phase": "Pending"});
        if extended {
            status["extendedResourceClaimStatus"] =
                json!({"resourceClaimName": "ext", "requestMappings": []});
        }
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": rv},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": status,
        }))
        .unwrap()
    }

    /// The claim controller's copy is shared for the version the event
    /// carries, not for another version, nor where it kept an
    /// extended-resource claim the event dropped.
    #[test]
    fn only_the_same_version_is_shared() {
        assert!(same_version(&pod("5", false), &pod("5", false)));
        assert!(same_version(&pod("5", true), &pod("5", true)));
        assert!(!same_version(&pod("4", false), &pod("5", false)));
        assert!(!same_version(&pod("5", true), &pod("5", false)));
    }
}
