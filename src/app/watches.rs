//! The watches of the kinds several rooms read: ResourceSlices,
//! DeviceClasses and Nodes, each listed and watched once for the whole
//! process into one store, its changes told to every room observing it.
//! (Pods, claims, templates and PodGroups are watched once too, by the
//! claim controller, which keeps their stores; pods fan out from there.)

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::Api;

use crate::model::views::{DeviceStores, NodeView};
use crate::runtime::informer::{Informer, Observer};
use crate::runtime::shared::Mirror;

/// Who observes each kind.
#[derive(Default)]
pub(crate) struct DeviceObservers {
    pub slices: Vec<Arc<dyn Observer<ResourceSlice>>>,
    pub classes: Vec<Arc<dyn Observer<DeviceClass>>>,
    pub nodes: Vec<Arc<dyn Observer<NodeView>>>,
}

pub(crate) struct DeviceWatches {
    slices: Informer,
    classes: Informer,
    nodes: Informer,
    stores: DeviceStores,
}

impl Default for DeviceWatches {
    fn default() -> Self {
        Self::new()
    }
}

impl DeviceWatches {
    pub(crate) fn new() -> Self {
        DeviceWatches {
            slices: Informer::new("resourceslices"),
            classes: Informer::new("deviceclasses"),
            nodes: Informer::new("nodes"),
            stores: DeviceStores::default(),
        }
    }

    pub(crate) fn stores(&self) -> &DeviceStores {
        &self.stores
    }

    /// Runs the three watches until the process ends.
    pub(crate) async fn run(&self, client: kube::Client, observers: DeviceObservers) {
        let slices = Mirror::new(
            self.stores.slices.clone(),
            |s: &ResourceSlice| s.metadata.name.clone().unwrap_or_default(),
            observers.slices,
        );
        let classes = Mirror::new(
            self.stores.classes.clone(),
            |c: &DeviceClass| c.metadata.name.clone().unwrap_or_default(),
            observers.classes,
        );
        let nodes = Mirror::new(
            self.stores.nodes.clone(),
            |n: &NodeView| n.name().to_string(),
            observers.nodes,
        );
        tokio::join!(
            self.slices
                .run(Api::<ResourceSlice>::all(client.clone()), &slices),
            self.classes
                .run(Api::<DeviceClass>::all(client.clone()), &classes),
            self.nodes.run(Api::<NodeView>::all(client), &nodes),
        );
    }

    /// Resolves once the first list of each is in.
    pub(crate) async fn wait_synced(&self) {
        self.slices.wait_synced().await;
        self.classes.wait_synced().await;
        self.nodes.wait_synced().await;
    }
}
