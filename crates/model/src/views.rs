//! Slim views of the objects the controller watches.
//!
//! A cluster-wide pod watch dominates the memory of this controller. These
//! types deserialize only the fields the controller reads (serde skips the
//! rest without allocating), so managed fields, container specs, most
//! conditions and the like are never held in memory.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Deref;
use std::time::Instant;

use dra_runtime::resource::{view_accessors, view_resource};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{PodResourceClaim, PodResourceClaimStatus};
use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

use super::requests::{self, InitRequests, PodRequests, ResourceList};

/// The metadata fields kept for every watched object.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    /// Only the labels in [`POD_LABELS_READ`] (pods are the only objects
    /// that carry them).
    #[serde(default, deserialize_with = "labels_read")]
    labels: Option<BTreeMap<String, String>>,
    /// Whether a field manager owns `spec.nodeName` (read for pods; see
    /// [`PodView::node_name_written`]); nothing else of the managed fields
    /// is held.
    #[serde(default, rename = "managedFields", deserialize_with = "owns_node_name")]
    node_name_written: bool,
}

/// `metadata.managedFields`: whether an entry of the object itself (not of
/// a subresource) owns `f:spec.f:nodeName`.
fn owns_node_name<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    struct Entry {
        #[serde(default)]
        subresource: Option<String>,
        #[serde(default, rename = "fieldsV1")]
        fields: Option<ManagedFields>,
    }
    let entries = Option::<Vec<Entry>>::deserialize(d)?.unwrap_or_default();
    Ok(entries.iter().any(|e| {
        e.subresource.as_deref().unwrap_or_default().is_empty()
            && e.fields.as_ref().is_some_and(ManagedFields::own_node_name)
    }))
}

/// The part of a managed-fields entry's `fieldsV1` that says whether it
/// owns `spec.nodeName`; everything else is parsed past.
#[derive(Deserialize)]
struct ManagedFields {
    #[serde(default, rename = "f:spec")]
    spec: Option<ManagedSpecFields>,
}

#[derive(Deserialize)]
struct ManagedSpecFields {
    #[serde(default, rename = "f:nodeName")]
    node_name: Option<serde::de::IgnoredAny>,
}

impl ManagedFields {
    fn own_node_name(&self) -> bool {
        self.spec.as_ref().is_some_and(|s| s.node_name.is_some())
    }
}

/// [`ManagedFields::own_node_name`] of a raw `fieldsV1` JSON document (as
/// protobuf carries it); one that does not parse owns nothing.
pub(crate) fn fields_v1_own_node_name(raw: &[u8]) -> bool {
    serde_json::from_slice::<ManagedFields>(raw).is_ok_and(|f| f.own_node_name())
}

/// Metadata of claims: also what ownership, adoption, finalizers and metrics read.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ClaimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    #[serde(default, deserialize_with = "annotations_read")]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "controller_reference")]
    owner_references: Option<Vec<OwnerReference>>,
    finalizers: Option<Vec<String>>,
}

/// The annotation keys of a claim this controller reads. A tenant owns the
/// rest (up to 256 KiB per claim) and none of it is held in memory.
const CLAIM_ANNOTATIONS_READ: [&str; 2] = [
    crate::naming::POD_CLAIM_NAME_ANNOTATION,
    crate::naming::EXTENDED_RESOURCE_CLAIM_ANNOTATION,
];

/// The longest value of a read annotation that can mean anything: a pod
/// claim entry name is a DNS label (63), the other one says "true". A
/// longer value matches nothing, so it is dropped instead of held.
const ANNOTATION_VALUE_MAX: usize = 253;

/// `metadata.annotations`, keeping only [`CLAIM_ANNOTATIONS_READ`]: every
/// other key is parsed past without allocating its value.
fn annotations_read<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(KeepOnly(&CLAIM_ANNOTATIONS_READ))
}

/// The labels read from pods: the headroom placeholder labels (ours, and
/// the seed operator's, whose placeholders never count as workload); a
/// tenant's other labels are not held.
const POD_LABELS_READ: [&str; 3] = [
    crate::naming::WATERMARK_LABEL,
    crate::naming::WATERMARK_ENTRY_LABEL,
    crate::naming::SEED_PLACEHOLDER_LABEL,
];

/// `metadata.labels` of pods, keeping only [`POD_LABELS_READ`].
fn labels_read<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(KeepOnly(&POD_LABELS_READ))
}

/// A string map (labels, annotations) of which only these keys are kept,
/// with values no longer than [`ANNOTATION_VALUE_MAX`]; the rest is parsed
/// past without allocating, so a tenant's maps cost no memory.
struct KeepOnly(&'static [&'static str]);

impl<'de> serde::de::Visitor<'de> for KeepOnly {
    type Value = Option<BTreeMap<String, String>>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a map of strings")
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            match self.0.iter().find(|k| **k == key) {
                Some(read) => {
                    let value: String = map.next_value()?;
                    if value.len() <= ANNOTATION_VALUE_MAX {
                        kept.insert((*read).to_owned(), value);
                    }
                }
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok((!kept.is_empty()).then_some(kept))
    }
}

/// `metadata.ownerReferences`, keeping only the controller reference (the
/// API server allows one): every decision reads that one, and a tenant may
/// add any number of others.
fn controller_reference<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<OwnerReference>>, D::Error> {
    let all: Option<Vec<OwnerReference>> = Option::deserialize(d)?;
    Ok(all
        .and_then(|refs| refs.into_iter().find(|o| o.controller == Some(true)))
        .map(|controller| vec![controller]))
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    Ok(SlimMeta::deserialize(d)?.into_meta())
}

impl SlimMeta {
    fn into_meta(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            resource_version: self.resource_version,
            deletion_timestamp: self.deletion_timestamp,
            labels: self.labels,
            ..Default::default()
        }
    }
}

fn claim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = ClaimMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        deletion_timestamp: m.deletion_timestamp,
        annotations: m.annotations,
        owner_references: m.owner_references,
        finalizers: m.finalizers,
        ..Default::default()
    })
}

/// `null` and absent both mean "empty" in the Kubernetes API.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

macro_rules! namespaced_resource {
    ($ty:ty, $group:expr, $version:expr, $kind:expr, $plural:expr) => {
        view_resource!(
            $ty,
            NamespaceResourceScope,
            $group,
            $version,
            $kind,
            $plural
        );
        view_accessors!($ty);
    };
}

mod claim;
mod node;
mod pod;
mod pod_group;
mod template;

pub use claim::*;
pub use node::*;
pub use pod::*;
pub use pod_group::*;
pub use template::*;

impl dra_runtime::store::HasUid for PodView {
    fn uid(&self) -> &str {
        PodView::uid(self)
    }
}

impl dra_runtime::store::HasUid for ClaimView {
    fn uid(&self) -> &str {
        ClaimView::uid(self)
    }
}

impl dra_runtime::store::HasUid for PodGroupView {
    fn uid(&self) -> &str {
        PodGroupView::uid(self)
    }
}

mod protobuf;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn pod_view_keeps_only_what_is_read() {
        let pod: PodView = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"a": "b"}, "managedFields": [{"manager": "x"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready"}],
                "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}],
                "extendedResourceClaimStatus": {"resourceClaimName": "p-ext", "requestMappings": []}}
        }))
        .unwrap();
        assert_eq!((pod.name(), pod.namespace(), pod.uid()), ("p", "ns", "u1"));
        assert!(pod.metadata.labels.is_none() && pod.metadata.managed_fields.is_none());
        assert_eq!(pod.node_name(), Some("n1"));
        assert_eq!(pod.spec.resource_claims.len(), 1);
        assert_eq!(
            pod.status.resource_claim_statuses[0]
                .resource_claim_name
                .as_deref(),
            Some("p-gpu-x")
        );
        assert_eq!(pod.extended_claim_name(), Some("p-ext"));
        assert!(pod.is_relevant() && !pod.is_done());
        assert_eq!(pod.claim_names(), vec!["p-ext", "p-gpu-x"]);
        assert!(pod.status.containers_finished_at.is_none());
    }

    /// Of a pod's labels only the placeholder label is kept; a tenant's
    /// others (and null) leave nothing behind.
    #[test]
    fn pod_view_keeps_only_the_placeholder_label() {
        let labelled = |labels: Value| -> PodView {
            serde_json::from_value(json!({"metadata": {"name": "p", "labels": labels}})).unwrap()
        };
        let placeholder = labelled(json!({
            crate::naming::WATERMARK_LABEL: "pool", "app": "x", "big": "y".repeat(63)}));
        assert_eq!(placeholder.placeholder_of(), Some("pool"));
        assert_eq!(placeholder.metadata.labels.as_ref().unwrap().len(), 1);
        for none in [
            json!({"app": "x"}),
            json!(null),
            json!({crate::naming::WATERMARK_LABEL: ""}),
        ] {
            let pod = labelled(none.clone());
            assert_eq!(pod.placeholder_of(), None, "{none}");
        }
        assert!(labelled(json!({"app": "x"})).metadata.labels.is_none());
    }

    #[test]
    fn containers_finish_when_all_have() {
        let view = |statuses: serde_json::Value| -> PodView {
            serde_json::from_value(
                json!({"metadata": {"name": "p"}, "status": {"containerStatuses": statuses}}),
            )
            .unwrap()
        };
        let done = view(json!([
            {"name": "a", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-23T12:00:05Z"}}},
            {"name": "b", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-23T12:00:09Z"}}}]));
        assert_eq!(
            done.status.containers_finished_at.unwrap().0.to_string(),
            "2026-11-23T12:00:09Z"
        );
        let running = view(json!([
            {"name": "a", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-23T12:00:05Z"}}},
            {"name": "b", "state": {"running": {"startedAt": "2026-11-23T12:00:00Z"}}}]));
        assert!(running.status.containers_finished_at.is_none());
        assert!(
            view(serde_json::Value::Null)
                .status
                .containers_finished_at
                .is_none()
        );
    }

    #[test]
    fn pod_done_rules() {
        let mut pod = PodView::default();
        assert!(!pod.is_done());
        pod.status.phase = Some("Succeeded".into());
        assert!(pod.is_done());
        pod.status.phase = Some("Failed".into());
        assert!(pod.is_done());
        pod.status.phase = Some("Running".into());
        pod.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert!(pod.is_done(), "deleted before scheduling");
        pod.spec.node_name = Some("n".into());
        assert!(
            !pod.is_done(),
            "deleted while running: containers may still run"
        );
        let nulls: PodView = serde_json::from_value(json!({
            "metadata": {"name": "p"}, "spec": {"resourceClaims": null}, "status": null
        }))
        .unwrap();
        assert!(!nulls.is_relevant());
    }

    /// What a tenant writes on a claim beyond what the controller reads is
    /// not held: other annotations, overlong values, owners that are not
    /// the controller.
    #[test]
    fn claim_view_holds_only_what_is_read() {
        let bloat = "x".repeat(100 * 1024);
        let claim: ClaimView = serde_json::from_slice(
            serde_json::to_vec(&json!({
                "metadata": {"name": "c", "namespace": "ns",
                    "annotations": {
                        "a": bloat,
                        "resource.kubernetes.io/pod-claim-name": "gpu",
                        "resource.kubernetes.io/extended-resource-claim": "y".repeat(300),
                        "z": {"not": "a string"},
                    },
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "x"},
                        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1", "controller": true},
                        {"apiVersion": "v1", "kind": "Secret", "name": "y", "uid": "y", "controller": false},
                    ]}
            }))
            .unwrap()
            .as_slice(),
        )
        .unwrap();
        let kept = claim.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            kept.iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
            [("resource.kubernetes.io/pod-claim-name", "gpu")]
        );
        assert_eq!(claim.owner_references().len(), 1);
        assert_eq!(claim.owner_references()[0].uid, "u1");
        for nothing in [json!(null), json!({}), json!({"other": "1"})] {
            let claim: ClaimView =
                serde_json::from_value(json!({"metadata": {"name": "c", "annotations": nothing}}))
                    .unwrap();
            assert!(claim.metadata.annotations.is_none(), "{nothing}");
        }
    }

    #[test]
    fn claim_view() {
        let claim: ClaimView = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "cu",
                "finalizers": ["resource.kubernetes.io/delete-protection"],
                "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1", "controller": true}]},
            "spec": {"devices": {"requests": [
                {"name": "a", "firstAvailable": [{"name": "s", "deviceClassName": "x"}]},
                {"name": "b", "exactly": {"deviceClassName": "x", "adminAccess": true}}]}},
            "status": {"allocation": {"devices": {"results": []}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}
        }))
        .unwrap();
        assert!(claim.is_allocated() && claim.admin_access() && claim.is_reserved_for("u1"));
        assert!(!claim.is_reserved_for("u2"));
        assert_eq!(
            claim.annotation(crate::naming::POD_CLAIM_NAME_ANNOTATION),
            Some("gpu")
        );
        assert_eq!(claim.finalizers().len(), 1);
        let bare: ClaimView = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
        assert!(!bare.is_allocated() && !bare.admin_access());
    }

    #[test]
    fn template_view_gates_and_copy() {
        let t: TemplateView = serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"metadata": {"labels": {"l": "1"}, "annotations": {"a": "2"}},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "futureField": 1}}]}}}
        }))
        .unwrap();
        assert!(!t.needs_admin_access() && !t.has_prioritized_list());
        assert_eq!(
            t.claim_metadata("labels").get("l").map(String::as_str),
            Some("1")
        );
        assert_eq!(
            t.claim_spec()["devices"]["requests"][0]["exactly"]["futureField"],
            1
        );
        let gated: TemplateView = serde_json::from_value(json!({
            "metadata": {"name": "t"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "r", "exactly": {"deviceClassName": "gpu", "adminAccess": true}},
                {"name": "s", "firstAvailable": [{"name": "x", "deviceClassName": "gpu"}]}]}}}
        }))
        .unwrap();
        assert!(gated.needs_admin_access() && gated.has_prioritized_list());
    }
}
