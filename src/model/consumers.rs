//! Who consumes a claim: the `reservedFor` entries of pods and PodGroups,
//! and the finalizer that keeps an allocated claim from being deleted
//! while it may be in use.

use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;

use super::views::PodGroupApi;

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
pub fn pod_group_consumer(name: &str, uid: &str) -> ResourceClaimConsumerReference {
    ResourceClaimConsumerReference {
        api_group: Some(PodGroupApi::GROUP.into()),
        resource: PodGroupApi::PLURAL.into(),
        name: name.into(),
        uid: uid.into(),
    }
}
