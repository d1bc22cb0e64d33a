//! What wakes the allocator: its own watches (ResourceSlices, DeviceClasses,
//! declared Nodes) keep its stores and wake the pods waiting for devices
//! when what they wait for may have changed; the pod and claim changes it
//! observes queue the pods whose claims need devices and keep its record
//! of its own writes.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tracing::info;

use super::Controller;
use crate::model::indexes::PODS_BY_CLAIM;
use crate::model::views::{ClaimView, NodeView, PodView};
use crate::runtime::informer::{Handler, Observer};
use crate::runtime::store::{Store, object_key};

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn replace_all<K>(store: &Store<K>, objects: Vec<K>, name: fn(&K) -> String) {
    store.replace(
        objects
            .into_iter()
            .map(|o| (name(&o), Arc::new(o)))
            .collect(),
    );
}

impl Controller {
    /// Queues the pods waiting for devices on `node` (`None`: anywhere).
    fn wake_waiting(&self, node: Option<&str>) {
        self.enqueue(self.ctx.state.waiting_on(node));
    }

    /// Wakes the pods waiting on nodes that publish slices of `pools`.
    fn wake_pools(&self, pools: &BTreeSet<(String, String)>) {
        let nodes: BTreeSet<String> = self
            .ctx
            .state
            .slices
            .list()
            .iter()
            .filter(|s| pools.contains(&(s.spec.driver.clone(), s.spec.pool.name.clone())))
            .filter_map(|s| s.spec.node_name.clone())
            .collect();
        for node in nodes {
            self.wake_waiting(Some(&node));
        }
    }

    /// `released` gave its devices back: the pods waiting on their nodes
    /// may fit now.
    fn released(&self, released: &ClaimView) {
        let pools: BTreeSet<(String, String)> = released
            .held_devices()
            .map(|d| (d.driver, d.pool))
            .collect();
        if !pools.is_empty() {
            self.wake_pools(&pools);
        }
    }

    /// Queues `pod` when its claims need devices now.
    fn consider(&self, pod: &PodView) {
        if self.claims_to_allocate(pod).is_ok() {
            self.enqueue([object_key(pod.namespace(), pod.name())]);
        }
    }

    /// A node-local slice changed: its pool (whose completeness may span
    /// nodes) may offer more now.
    fn slice_changed(&self, slice: &ResourceSlice) {
        if let Some(node) = &slice.spec.node_name {
            let pool = (slice.spec.driver.clone(), slice.spec.pool.name.clone());
            self.wake_pools(&BTreeSet::from([pool]));
            // Deleted slices are no longer in the store.
            self.wake_waiting(Some(node));
        }
    }
}

impl Handler<ResourceSlice> for Controller {
    fn relisted(&self, slices: Vec<ResourceSlice>) {
        let state = &self.ctx.state;
        replace_all(&state.slices, slices, |s| name_of(&s.metadata));
        info!(slices = state.slices.len(), "ResourceSlice cache loaded");
        self.wake_waiting(None);
    }
    fn applied(&self, slice: ResourceSlice) {
        self.ctx
            .state
            .slices
            .apply(name_of(&slice.metadata), Arc::new(slice));
        // Any node: a pool's slices on other nodes decide whether the pool
        // is complete.
        self.wake_waiting(None);
    }
    fn deleted(&self, slice: ResourceSlice) {
        self.ctx.state.slices.delete(&name_of(&slice.metadata));
        self.slice_changed(&slice);
    }
}

impl Handler<DeviceClass> for Controller {
    fn relisted(&self, classes: Vec<DeviceClass>) {
        replace_all(&self.ctx.state.classes, classes, |c| name_of(&c.metadata));
        self.wake_waiting(None);
    }
    fn applied(&self, class: DeviceClass) {
        self.ctx
            .state
            .classes
            .apply(name_of(&class.metadata), Arc::new(class));
        self.wake_waiting(None);
    }
    fn deleted(&self, class: DeviceClass) {
        self.ctx.state.classes.delete(&name_of(&class.metadata));
    }
}

impl Handler<NodeView> for Controller {
    fn relisted(&self, nodes: Vec<NodeView>) {
        let state = &self.ctx.state;
        replace_all(&state.nodes, nodes, |n| name_of(&n.metadata));
        info!(
            nodes = state.nodes.len(),
            selector = %state.node_selector,
            "declared nodes loaded: allocating for pre-scheduled pods on them"
        );
        self.sweep();
    }
    fn applied(&self, node: NodeView) {
        let name = name_of(&node.metadata);
        if self
            .ctx
            .state
            .nodes
            .apply(name.clone(), Arc::new(node))
            .is_none()
        {
            info!(node = %name, "node declared for allocation");
            // Pods already there were told nothing would allocate their
            // claims: now something will.
            for pod in self.ctx.pods.list() {
                if pod.node_name() == Some(name.as_str()) {
                    self.consider(&pod);
                }
            }
        }
    }
    fn deleted(&self, node: NodeView) {
        self.ctx.state.nodes.delete(&name_of(&node.metadata));
    }
}

impl Observer<PodView> for Controller {
    fn relisted(&self) {
        self.sweep();
    }
    fn applied(&self, _old: Option<&PodView>, pod: &PodView) {
        self.consider(pod);
    }
    fn deleted(&self, pod: &PodView) {
        self.ctx
            .state
            .stop_waiting(&object_key(pod.namespace(), pod.name()));
    }
}

impl Observer<ClaimView> for Controller {
    fn relisted(&self) {
        self.ctx.state.claims_relisted(&self.ctx.claims.list());
        // Released or not, every waiting pod may fit now; and a claim that
        // arrived with the list may be one a pod waits to have allocated.
        self.wake_waiting(None);
        self.sweep();
    }
    fn applied(&self, old: Option<&ClaimView>, claim: &ClaimView) {
        self.ctx.state.claim_seen(claim);
        if let Some(old) = old
            && old.is_allocated()
            && !claim.is_allocated()
        {
            self.released(old);
        }
        if !claim.is_allocated() {
            // A pod may have waited for this claim to exist.
            let key = object_key(claim.namespace(), claim.name());
            for pod in self.ctx.pods.by_index(PODS_BY_CLAIM, &key) {
                self.consider(&pod);
            }
        }
    }
    fn deleted(&self, claim: &ClaimView) {
        self.ctx.state.forget_written(claim.uid());
        if claim.is_allocated() {
            self.released(claim);
        }
    }
}
