//! The watches of the kinds several rooms read: ResourceSlices,
//! DeviceClasses, Nodes and DeviceTaintRules, each listed and watched once
//! for the whole process into one store, its changes told to every room
//! observing it. A kind no room reads is not watched at all.

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceSlice};
use kube::Api;
use tracing::{info, warn};

use crate::model::device_taints::RulesVersion;
use crate::model::views::{DeviceStores, NodeView};
use crate::runtime::informer::{Handler, Informer, Observer};
use crate::runtime::optional_api::{ApiStatus, DISCOVERY_PER_TRY, DISCOVERY_TRIES, Discovered};
use crate::runtime::shared::Mirror;

/// Who observes each kind. A kind is watched when someone observes it, or
/// when a room reads its store ([`DeviceWatches::read`]).
#[derive(Default)]
pub struct DeviceObservers {
    pub slices: Vec<Arc<dyn Observer<ResourceSlice>>>,
    pub classes: Vec<Arc<dyn Observer<DeviceClass>>>,
    pub nodes: Vec<Arc<dyn Observer<NodeView>>>,
    pub rules: Vec<Arc<dyn Observer<DeviceTaintRule>>>,
}

/// Which kinds the rooms read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds {
    pub slices: bool,
    pub classes: bool,
    pub nodes: bool,
    /// `DRADeviceTaintRules` on: the rules' API is found by discovery.
    pub rules: bool,
}

impl Kinds {
    /// What allocating devices reads, as kube-scheduler does: slices,
    /// classes, nodes, and the rules' taints with `DRADeviceTaintRules`.
    pub fn for_allocating(gates: &crate::model::features::FeatureGates) -> Kinds {
        Kinds {
            slices: true,
            classes: true,
            nodes: true,
            rules: gates.device_taint_rules_on(),
        }
    }

    pub fn any(&self) -> bool {
        self.slices || self.classes || self.nodes || self.rules
    }
}

pub struct DeviceWatches {
    slices: Informer,
    classes: Informer,
    nodes: Informer,
    rules: Informer,
    stores: DeviceStores,
    kinds: std::sync::Mutex<Kinds>,
    /// Set once discovery found the rules' API (never, when it is not
    /// served).
    rules_version: Arc<OnceLock<RulesVersion>>,
}

impl Default for DeviceWatches {
    fn default() -> Self {
        Self::new()
    }
}

impl DeviceWatches {
    pub fn new() -> Self {
        DeviceWatches {
            slices: Informer::new("resourceslices"),
            classes: Informer::new("deviceclasses"),
            nodes: Informer::new("nodes"),
            rules: Informer::new("devicetaintrules"),
            stores: DeviceStores::default(),
            kinds: Default::default(),
            rules_version: Default::default(),
        }
    }

    pub fn stores(&self) -> &DeviceStores {
        &self.stores
    }

    /// The rules' API version, once discovery found it.
    pub fn rules_version(&self) -> Arc<OnceLock<RulesVersion>> {
        self.rules_version.clone()
    }

    /// A room reads these kinds' stores.
    pub fn read(&self, kinds: Kinds) {
        let mut k = self.kinds.lock().unwrap();
        k.slices |= kinds.slices;
        k.classes |= kinds.classes;
        k.nodes |= kinds.nodes;
        k.rules |= kinds.rules;
    }

    pub fn kinds(&self) -> Kinds {
        *self.kinds.lock().unwrap()
    }

    /// Runs the watches of the kinds read until the process ends.
    pub async fn run(&self, client: kube::Client, observers: DeviceObservers, apis: ApiStatus) {
        let kinds = self.kinds();
        // managedFields are most of a slice's size (an entry per device
        // field, per writer), and no room reads them.
        let slices = Mirror::new(
            self.stores.slices.clone(),
            |s: &ResourceSlice| s.metadata.name.clone().unwrap_or_default(),
            observers.slices,
        )
        .trimmed(|s| s.metadata.managed_fields = None);
        let classes = Mirror::new(
            self.stores.classes.clone(),
            |c: &DeviceClass| c.metadata.name.clone().unwrap_or_default(),
            observers.classes,
        )
        .trimmed(|c| c.metadata.managed_fields = None);
        let nodes = Mirror::new(
            self.stores.nodes.clone(),
            |n: &NodeView| n.name().to_string(),
            observers.nodes,
        );
        let rules = Mirror::new(
            self.stores.rules.clone(),
            |r: &DeviceTaintRule| r.metadata.name.clone().unwrap_or_default(),
            observers.rules,
        )
        .trimmed(|r| r.metadata.managed_fields = None);
        tokio::join!(
            when(
                kinds.slices,
                self.slices
                    .run(Api::<ResourceSlice>::all(client.clone()), &slices)
            ),
            when(
                kinds.classes,
                self.classes
                    .run(Api::<DeviceClass>::all(client.clone()), &classes)
            ),
            when(
                kinds.nodes,
                self.nodes.run(Api::<NodeView>::all(client.clone()), &nodes)
            ),
            when(kinds.rules, self.run_rules(client.clone(), &rules, &apis)),
        );
    }

    /// Finds the rules' API, then watches it; a `v1beta2` rule is read
    /// as the `v1` one it is field for field.
    async fn run_rules(
        &self,
        client: kube::Client,
        rules: &Mirror<DeviceTaintRule>,
        apis: &ApiStatus,
    ) {
        let Some(version) = discover_rules_version(&client, apis).await else {
            warn!(
                "DRADeviceTaintRules is on, but the API server serves no DeviceTaintRule (or did not answer its discovery) \
                 (resource.k8s.io v1 or v1beta2): rules are ignored. On Kubernetes 1.36, enable \
                 the API server's --runtime-config=resource.k8s.io/v1beta2=true and its \
                 DRADeviceTaintRules gate, then restart this controller"
            );
            // Nothing to wait for: an empty store is the truth.
            rules.relisted(Vec::new());
            self.rules.mark_synced();
            return;
        };
        let _ = self.rules_version.set(version);
        info!(
            api_version = version.api_version(),
            "watching DeviceTaintRules"
        );
        match version {
            RulesVersion::V1 => {
                self.rules
                    .run(Api::<DeviceTaintRule>::all(client), rules)
                    .await
            }
            RulesVersion::V1beta2 => {
                let converted = Converted(rules);
                self.rules
                    .run(
                        Api::<k8s_openapi::api::resource::v1beta2::DeviceTaintRule>::all(client),
                        &converted,
                    )
                    .await
            }
        }
    }

    /// Resolves once the first list of each kind read is in.
    pub async fn wait_synced(&self) {
        let kinds = self.kinds();
        if kinds.slices {
            self.slices.wait_synced().await;
        }
        if kinds.classes {
            self.classes.wait_synced().await;
        }
        if kinds.nodes {
            self.nodes.wait_synced().await;
        }
        if kinds.rules {
            self.rules.wait_synced().await;
        }
    }
}

/// Runs `watch` when its kind is read.
async fn when(on: bool, watch: impl Future<Output = ()>) {
    if on {
        watch.await
    }
}

/// Which version serves DeviceTaintRules: `v1` first, then `v1beta2`;
/// `None` when neither lists the resource (or discovery got no answer in
/// [`DISCOVERY_TRIES`] tries).
async fn discover_rules_version(client: &kube::Client, apis: &ApiStatus) -> Option<RulesVersion> {
    let found = RulesVersion::API
        .discover(client, DISCOVERY_TRIES, DISCOVERY_PER_TRY)
        .await;
    apis.report(
        &RulesVersion::API,
        &found,
        "on Kubernetes 1.36 enable kube-apiserver's --runtime-config=resource.k8s.io/v1beta2=true \
         and its DRADeviceTaintRules gate, then restart this controller",
    );
    match found {
        Discovered::Served(version) => Some(RulesVersion::from_served(&version)),
        Discovered::NotServed | Discovered::NoAnswer => None,
    }
}

/// A `v1beta2` rule read as `v1`: the same fields under another
/// `apiVersion`.
struct Converted<'a>(&'a Mirror<DeviceTaintRule>);

fn to_v1(rule: k8s_openapi::api::resource::v1beta2::DeviceTaintRule) -> Option<DeviceTaintRule> {
    let mut value = serde_json::to_value(rule).ok()?;
    value["apiVersion"] = RulesVersion::V1.api_version().into();
    serde_json::from_value(value).ok()
}

impl Handler<k8s_openapi::api::resource::v1beta2::DeviceTaintRule> for Converted<'_> {
    fn admit(
        &self,
        obj: k8s_openapi::api::resource::v1beta2::DeviceTaintRule,
    ) -> Option<k8s_openapi::api::resource::v1beta2::DeviceTaintRule> {
        Some(obj)
    }
    fn relisted(&self, objects: Vec<k8s_openapi::api::resource::v1beta2::DeviceTaintRule>) {
        self.0
            .relisted(objects.into_iter().filter_map(to_v1).collect());
    }
    fn applied(&self, obj: k8s_openapi::api::resource::v1beta2::DeviceTaintRule) {
        if let Some(rule) = to_v1(obj) {
            self.0.applied(rule);
        }
    }
    fn deleted(&self, obj: k8s_openapi::api::resource::v1beta2::DeviceTaintRule) {
        if let Some(rule) = to_v1(obj) {
            self.0.deleted(rule);
        }
    }
}
