//! What the allocator's watches (ResourceSlices, DeviceClasses, declared
//! Nodes) do: keep its stores, and wake the pods waiting for devices when
//! what they wait for may have changed.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use tracing::info;

use super::Controller;
use super::allocation::NodeView;
use super::cache::Store;
use super::enqueue::WorkKey;
use super::views::ClaimView;
use crate::informer::Handler;

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

    /// A claim changed: an allocation it held may be free now.
    pub(super) fn allocation_claim_changed(&self, claim: &ClaimView, released: bool, gone: bool) {
        let Some(state) = &self.ctx.caches.allocation else {
            return;
        };
        if gone {
            state.forget_written(claim.uid());
        } else {
            state.claim_seen(claim);
        }
        if released {
            self.wake_waiting(None);
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
            self.wake_waiting(None);
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
            }
        }
    }
    fn deleted(&self, node: NodeView) {
        if let Some(state) = &self.ctx.caches.allocation {
            state.nodes.delete(&name_of(&node.metadata));
        }
    }
}
