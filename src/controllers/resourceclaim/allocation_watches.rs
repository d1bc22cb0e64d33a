//! What the allocator's watches (ResourceSlices, DeviceClasses, declared
//! Nodes) do: keep its stores, and wake the pods waiting for devices when
//! what they wait for may have changed.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use tracing::info;

use super::Controller;
use super::allocation::{Allocation, NodeView};
use super::enqueue::WorkKey;
use crate::model::views::ClaimView;
use crate::runtime::informer::Handler;
use crate::runtime::store::Store;

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
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
    pub(super) fn wake_waiting(&self, node: Option<&str>) {
        let Some(state) = &self.ctx.caches.allocation else {
            return;
        };
        let keys = state.waiting_on(node).into_iter().filter_map(|key| {
            let (ns, name) = key.split_once('/')?;
            Some(WorkKey::pod(ns, name))
        });
        self.enqueue(keys);
    }

    /// A claim changed; `released` is its allocated state when this change
    /// freed the devices: the pods waiting on their nodes may fit now.
    pub(super) fn allocation_claim_changed(
        &self,
        claim: &ClaimView,
        released: Option<&ClaimView>,
        gone: bool,
    ) {
        let Some(state) = &self.ctx.caches.allocation else {
            return;
        };
        if gone {
            state.forget_written(claim.uid());
        } else {
            state.claim_seen(claim);
        }
        if let Some(allocated) = released {
            let pools: BTreeSet<(String, String)> = allocated
                .held_devices()
                .map(|d| (d.driver, d.pool))
                .collect();
            if !pools.is_empty() {
                self.wake_pools(state, &pools);
            }
        }
    }

    /// Wakes the pods waiting on nodes that publish slices of `pools`.
    fn wake_pools(&self, state: &Allocation, pools: &BTreeSet<(String, String)>) {
        let nodes: BTreeSet<String> = state
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

    /// A node-local slice changed: its pool (whose completeness may span
    /// nodes) may offer more now.
    fn slice_changed(&self, state: &Allocation, slice: &ResourceSlice) {
        if slice.spec.node_name.is_some() {
            let pool = (slice.spec.driver.clone(), slice.spec.pool.name.clone());
            self.wake_pools(state, &BTreeSet::from([pool]));
            if let Some(node) = &slice.spec.node_name {
                // Deleted slices are no longer in the store.
                self.wake_waiting(Some(node));
            }
        }
    }
}

impl Handler<ResourceSlice> for Controller {
    fn relisted(&self, slices: Vec<ResourceSlice>) {
        if let Some(state) = &self.ctx.caches.allocation {
            replace_all(&state.slices, slices, |s| name_of(&s.metadata));
            info!(slices = state.slices.len(), "ResourceSlice cache loaded");
            self.wake_waiting(None);
        }
    }
    fn applied(&self, slice: ResourceSlice) {
        if let Some(state) = &self.ctx.caches.allocation {
            state
                .slices
                .apply(name_of(&slice.metadata), Arc::new(slice));
            // Any node: a pool's slices on other nodes decide whether the
            // pool is complete.
            self.wake_waiting(None);
        }
    }
    fn deleted(&self, slice: ResourceSlice) {
        if let Some(state) = &self.ctx.caches.allocation {
            state.slices.delete(&name_of(&slice.metadata));
            self.slice_changed(state, &slice);
        }
    }
}

impl Handler<DeviceClass> for Controller {
    fn relisted(&self, classes: Vec<DeviceClass>) {
        if let Some(state) = &self.ctx.caches.allocation {
            replace_all(&state.classes, classes, |c| name_of(&c.metadata));
            self.wake_waiting(None);
        }
    }
    fn applied(&self, class: DeviceClass) {
        if let Some(state) = &self.ctx.caches.allocation {
            state
                .classes
                .apply(name_of(&class.metadata), Arc::new(class));
            self.wake_waiting(None);
        }
    }
    fn deleted(&self, class: DeviceClass) {
        if let Some(state) = &self.ctx.caches.allocation {
            state.classes.delete(&name_of(&class.metadata));
        }
    }
}

impl Handler<NodeView> for Controller {
    fn relisted(&self, nodes: Vec<NodeView>) {
        if let Some(state) = &self.ctx.caches.allocation {
            replace_all(&state.nodes, nodes, |n| name_of(&n.metadata));
            info!(
                nodes = state.nodes.len(),
                selector = %state.node_selector,
                "declared nodes loaded: allocating for pre-scheduled pods on them"
            );
        }
    }
    fn applied(&self, node: NodeView) {
        if let Some(state) = &self.ctx.caches.allocation {
            let name = name_of(&node.metadata);
            if state.nodes.apply(name.clone(), Arc::new(node)).is_none() {
                info!(node = %name, "node declared for allocation");
                // Pods already there were told nothing would allocate
                // their claims: now something will.
                let keys: Vec<WorkKey> = self
                    .ctx
                    .caches
                    .pods
                    .list()
                    .iter()
                    .filter(|p| p.node_name() == Some(name.as_str()))
                    .map(|p| WorkKey::pod(p.namespace(), p.name()))
                    .collect();
                self.enqueue(keys);
            }
        }
    }
    fn deleted(&self, node: NodeView) {
        if let Some(state) = &self.ctx.caches.allocation {
            state.nodes.delete(&name_of(&node.metadata));
        }
    }
}
