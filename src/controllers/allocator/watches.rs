//! What wakes the allocator: changes of the process's ResourceSlices,
//! DeviceClasses and Nodes (shared stores) wake the pods waiting for
//! devices when what they wait for may have changed, and keep its store of
//! declared nodes; the pod and claim changes it observes queue the pods
//! whose claims need devices and keep its record of its own writes.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use tracing::info;

use super::{Controller, NEEDS_DEVICES, RELISTED, WAITING_WOKEN};
use crate::model::indexes::PODS_BY_CLAIM;
use crate::model::views::{ClaimView, NodeView, PodView};
use crate::runtime::controller::Wake;
use crate::runtime::informer::Observer;
use crate::runtime::store::object_key;

impl Controller {
    /// Queues the pods waiting for devices on `node` (`None`: anywhere).
    fn wake_waiting(&self, node: Option<&str>) {
        self.enqueue(self.ctx.state.waiting_on(node), WAITING_WOKEN);
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
            self.enqueue([object_key(pod.namespace(), pod.name())], NEEDS_DEVICES);
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

impl Observer<ResourceSlice> for Controller {
    fn relisted(&self) {
        info!(
            slices = self.ctx.state.slices.len(),
            "ResourceSlices loaded"
        );
        self.wake_waiting(None);
    }
    fn applied(&self, _old: Option<&ResourceSlice>, _slice: &ResourceSlice) {
        // Any node: a pool's slices on other nodes decide whether the pool
        // is complete.
        self.wake_waiting(None);
    }
    fn deleted(&self, slice: &ResourceSlice) {
        self.slice_changed(slice);
    }
}

impl Observer<DeviceClass> for Controller {
    fn relisted(&self) {
        self.wake_waiting(None);
    }
    fn applied(&self, _old: Option<&DeviceClass>, _class: &DeviceClass) {
        self.wake_waiting(None);
    }
    fn deleted(&self, _class: &DeviceClass) {}
}

/// The declared nodes are those of the one node watch that the selector
/// matches; the allocator keeps them in a store of its own.
impl Observer<NodeView> for Controller {
    fn relisted(&self) {
        let state = &self.ctx.state;
        let declared = state
            .all_nodes
            .list()
            .into_iter()
            .filter(|n| state.node_selector.matches(n.labels()))
            .map(|n| (n.name().to_string(), n))
            .collect();
        state.nodes.replace(declared);
        info!(
            nodes = state.nodes.len(),
            selector = %state.selector_text,
            "declared nodes loaded: allocating for pre-scheduled pods on them"
        );
        self.queue_needing(Wake::Event(RELISTED));
    }
    fn applied(&self, _old: Option<&NodeView>, node: &NodeView) {
        let state = &self.ctx.state;
        let name = node.name().to_string();
        if !state.node_selector.matches(node.labels()) {
            if state.nodes.delete(&name).is_some() {
                info!(node = %name, "node no longer declared for allocation");
            }
            return;
        }
        if state
            .nodes
            .apply(name.clone(), Arc::new(node.clone()))
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
    fn deleted(&self, node: &NodeView) {
        self.ctx.state.nodes.delete(node.name());
    }
}

impl Observer<PodView> for Controller {
    fn relisted(&self) {
        self.queue_needing(Wake::Event(RELISTED));
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
        self.queue_needing(Wake::Event(RELISTED));
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
