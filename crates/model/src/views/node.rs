//! The node view and the device stores shared by the rooms that read devices.

use super::*;

/// A Node: its name, labels (what node selectors match) and taints (what
/// a pod must tolerate); the rest of its metadata and its status are not
/// held.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeView {
    #[serde(deserialize_with = "node_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: NodeViewSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeViewSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub taints: Vec<k8s_openapi::api::core::v1::Taint>,
}

fn node_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        labels: Option<BTreeMap<String, String>>,
    }
    let m = Meta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels,
        ..Default::default()
    })
}

/// The process's one store of each kind that devices are read from, kept
/// by one watch each and read by every room that needs them (the
/// allocator and headroom).
#[derive(Clone)]
pub struct DeviceStores {
    pub slices:
        std::sync::Arc<dra_runtime::store::Store<k8s_openapi::api::resource::v1::ResourceSlice>>,
    pub classes:
        std::sync::Arc<dra_runtime::store::Store<k8s_openapi::api::resource::v1::DeviceClass>>,
    pub nodes: std::sync::Arc<dra_runtime::store::Store<NodeView>>,
    /// DeviceTaintRules (served as `resource.k8s.io/v1`, or converted from
    /// `v1beta2`), keyed by name; empty while `DRADeviceTaintRules` is off.
    pub rules:
        std::sync::Arc<dra_runtime::store::Store<k8s_openapi::api::resource::v1::DeviceTaintRule>>,
}

impl Default for DeviceStores {
    fn default() -> Self {
        DeviceStores {
            slices: std::sync::Arc::new(dra_runtime::store::Store::new(Vec::new())),
            classes: std::sync::Arc::new(dra_runtime::store::Store::new(Vec::new())),
            nodes: std::sync::Arc::new(dra_runtime::store::Store::new(Vec::new())),
            rules: std::sync::Arc::new(dra_runtime::store::Store::new(Vec::new())),
        }
    }
}

impl NodeView {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    pub fn labels(&self) -> &BTreeMap<String, String> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        self.metadata.labels.as_ref().unwrap_or(&EMPTY)
    }
}

view_resource!(
    NodeView,
    k8s_openapi::ClusterResourceScope,
    "",
    "v1",
    "Node",
    "nodes"
);
