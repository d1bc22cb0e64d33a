//! The secondary indexes of the shared stores: which pods use a claim or a
//! template, which claims an owner controls, which pods and claims belong
//! to a PodGroup. Plain functions from an object to its index values.

use k8s_openapi::api::core::v1::PodResourceClaim;

use super::views::{ClaimView, PodGroupView, PodView};
use crate::naming::{controller_of, controlling_pod, resolve_claim};
use dra_runtime::store::object_key;

pub const PODS_BY_CLAIM: &str = "pods-by-claim";
pub const PODS_BY_TEMPLATE: &str = "pods-by-template";
pub const CLAIMS_BY_OWNER_UID: &str = "claims-by-owner-uid";
pub const PODS_BY_GROUP: &str = "pods-by-group";
/// Pods waiting to be scheduled (not done, not being deleted, on no node),
/// all under the one value [`WAITING`].
pub const PODS_WAITING: &str = "pods-waiting";
pub const WAITING: &str = "waiting";
pub const GROUPS_BY_TEMPLATE: &str = "groups-by-template";
pub const GROUPS_BY_CLAIM: &str = "groups-by-claim";

/// `namespace/claim` for every claim the pod resolves to, the
/// extended-resource claim included.
pub fn pod_claim_index(pod: &PodView) -> Vec<String> {
    let mut keys: Vec<String> = pod
        .spec
        .resource_claims
        .iter()
        .filter_map(|entry| resolve_claim(entry, &pod.status.resource_claim_statuses).name())
        .map(|name| object_key(pod.namespace(), name))
        .collect();
    if let Some(name) = pod.extended_claim_name() {
        keys.push(object_key(pod.namespace(), name));
    }
    keys.sort();
    keys.dedup();
    keys
}

/// `namespace/template` of every template the entries name, once each.
pub(crate) fn template_keys(namespace: &str, entries: &[PodResourceClaim]) -> Vec<String> {
    let mut keys: Vec<String> = entries
        .iter()
        .filter_map(|e| e.resource_claim_template_name.as_deref())
        .map(|t| object_key(namespace, t))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

pub fn pod_template_index(pod: &PodView) -> Vec<String> {
    template_keys(pod.namespace(), &pod.spec.resource_claims)
}

/// The claim's controlling pod's UID, or `<namespace>/<uid>` for a
/// controlling PodGroup (kube-controller-manager's `claimPodGroupOwner`
/// key; a UID holds no `/`, so the two never meet): adoption only ever
/// finds claims of the right kind.
pub fn claim_owner_index(claim: &ClaimView) -> Vec<String> {
    if let Some((_, uid)) = controlling_pod(claim.owner_references()) {
        return vec![uid.to_string()];
    }
    controller_of(claim.owner_references())
        .filter(|o| o.kind == "PodGroup" && o.api_version.starts_with("scheduling.k8s.io/"))
        .map(|o| vec![group_owner_key(claim.namespace(), &o.uid)])
        .unwrap_or_default()
}

pub fn group_owner_key(namespace: &str, uid: &str) -> String {
    format!("{namespace}/{uid}")
}

/// Files a pod that waits to be scheduled under [`WAITING`].
pub fn pod_waiting_index(pod: &PodView) -> Vec<String> {
    if pod.node_name().is_none() && !pod.is_done() && !pod.is_deleting() {
        vec![WAITING.to_string()]
    } else {
        Vec::new()
    }
}

/// `namespace/group` of the PodGroup a pod belongs to.
pub fn pod_group_index(pod: &PodView) -> Vec<String> {
    pod.pod_group_name()
        .map(|g| vec![object_key(pod.namespace(), g)])
        .unwrap_or_default()
}

pub fn group_template_index(group: &PodGroupView) -> Vec<String> {
    template_keys(group.namespace(), &group.spec.resource_claims)
}

/// Every claim a PodGroup names: directly, or recorded in its status.
pub fn group_claim_index(group: &PodGroupView) -> Vec<String> {
    let mut keys: Vec<String> = group
        .spec
        .resource_claims
        .iter()
        .filter_map(|e| e.resource_claim_name.as_deref())
        .chain(
            group
                .status
                .resource_claim_statuses
                .iter()
                .filter_map(|s| s.resource_claim_name.as_deref()),
        )
        .map(|c| object_key(group.namespace(), c))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}
