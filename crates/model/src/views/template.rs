//! The ResourceClaimTemplate view.

use super::*;

/// A ResourceClaimTemplate. Its `spec` is kept as raw JSON and copied into
/// generated claims verbatim, so fields newer than this build's API types
/// are carried over instead of being dropped.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TemplateView {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: serde_json::Value,
}

namespaced_resource!(
    TemplateView,
    "resource.k8s.io",
    "v1",
    "ResourceClaimTemplate",
    "resourceclaimtemplates"
);

impl TemplateView {
    fn requests(&self) -> impl Iterator<Item = &serde_json::Value> {
        self.spec
            .pointer("/spec/devices/requests")
            .and_then(|r| r.as_array())
            .into_iter()
            .flatten()
    }
    /// Any request with `exactly.adminAccess: true` (needs DRAAdminAccess).
    pub fn needs_admin_access(&self) -> bool {
        self.requests()
            .any(|r| r.pointer("/exactly/adminAccess").and_then(|v| v.as_bool()) == Some(true))
    }
    /// Any request with a non-empty `firstAvailable` list (needs DRAPrioritizedList).
    pub fn has_prioritized_list(&self) -> bool {
        self.requests().any(|r| {
            r.get("firstAvailable")
                .and_then(|v| v.as_array())
                .is_some_and(|a| !a.is_empty())
        })
    }
    /// `spec.metadata.labels` / `spec.metadata.annotations` of the template.
    pub fn claim_metadata(&self, field: &str) -> BTreeMap<String, String> {
        self.spec
            .pointer(&format!("/metadata/{field}"))
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }
    /// `spec.spec`: the claim spec to copy.
    pub fn claim_spec(&self) -> serde_json::Value {
        self.spec
            .get("spec")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({}))
    }
}
