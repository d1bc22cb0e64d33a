//! Who consumes a claim: the `reservedFor` entries of pods and PodGroups,
//! and the finalizer that keeps an allocated claim from being deleted
//! while it may be in use.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;

use super::views::{ClaimView, PodGroupApi, PodGroupView, PodView};
use crate::naming::{is_controlled_by, is_controlled_by_pod_group, resolve_claim};

/// Finalizer the scheduler adds when it allocates a claim.
pub const DELETE_PROTECTION_FINALIZER: &str = "resource.kubernetes.io/delete-protection";

/// Whether a `reservedFor` entry names a core pod.
pub fn is_pod_consumer(r: &ResourceClaimConsumerReference) -> bool {
    r.api_group.as_deref().unwrap_or_default().is_empty() && r.resource == "pods"
}

/// A `reservedFor` entry naming a PodGroup.
pub fn is_pod_group_consumer(r: &ResourceClaimConsumerReference) -> bool {
    r.api_group.as_deref() == Some(PodGroupApi::GROUP) && r.resource == PodGroupApi::PLURAL
}

/// The `reservedFor` entry for a pod (core API group, resource `pods`).
pub fn pod_consumer(name: &str, uid: &str) -> ResourceClaimConsumerReference {
    ResourceClaimConsumerReference {
        api_group: None,
        resource: "pods".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// The `reservedFor` entry of a PodGroup.
pub(crate) fn pod_group_consumer(name: &str, uid: &str) -> ResourceClaimConsumerReference {
    ResourceClaimConsumerReference {
        api_group: Some(PodGroupApi::GROUP.into()),
        resource: PodGroupApi::PLURAL.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// A claim a pod on a node uses that is not reserved for it (or for its
/// PodGroup) yet, and the consumer to reserve it for.
#[derive(Debug, Clone)]
pub struct Unreserved {
    pub claim: Arc<ClaimView>,
    pub consumer: ResourceClaimConsumerReference,
}

/// The claims of `pod` not yet reserved for it, in entry order: what a
/// scheduler would have reserved when binding. A generated claim counts only
/// when the pod (or, for an entry bound to its `group`, the group) controls
/// it; an entry that matches the group's is reserved for the group.
/// `claim` looks a claim of the pod's namespace up by name.
pub fn unreserved_claims(
    pod: &PodView,
    group: Option<&PodGroupView>,
    claim: impl Fn(&str) -> Option<Arc<ClaimView>>,
) -> Vec<Unreserved> {
    let statuses = &pod.status.resource_claim_statuses;
    let mut out = Vec::new();
    for entry in &pod.spec.resource_claims {
        let resolution = resolve_claim(entry, statuses);
        let Some(name) = resolution.name() else {
            continue;
        };
        let Some(claim) = claim(name) else {
            continue;
        };
        let bound = group.filter(|g| g.matching_entry(entry).is_some());
        let owned = is_controlled_by(claim.owner_references(), pod.uid())
            || bound
                .is_some_and(|g| is_controlled_by_pod_group(claim.owner_references(), g.name()));
        if resolution.must_check_owner() && !owned {
            continue;
        }
        let reserved_for_group = group.is_some_and(|g| {
            claim
                .status
                .reserved_for
                .iter()
                .any(|r| is_pod_group_consumer(r) && r.name == g.name())
        });
        if claim.is_reserved_for(pod.uid()) || reserved_for_group {
            continue;
        }
        let consumer = match bound {
            Some(g) => pod_group_consumer(g.name(), g.uid()),
            None => pod_consumer(pod.name(), pod.uid()),
        };
        out.push(Unreserved { claim, consumer });
    }
    out
}
