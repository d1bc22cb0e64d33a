//! Pod work: create the claims of template entries, record their names in
//! the pod status, reserve allocated claims for pre-scheduled pods, and
//! tell the user when nothing will allocate a pre-scheduled pod's claim.
//!
//! [`decide`] looks at cached state and returns what should be written;
//! [`execute`] (`pod/writes.rs`) writes it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
use serde_json::{Value, json};

use super::cache::Caches;
use crate::model::consumers::{Unreserved, unreserved_claims};
use crate::model::features::FeatureGates;
use crate::model::views::{ClaimView, PodGroupView, PodView, TemplateView};
use crate::naming::{
    ClaimResolution, POD_CLAIM_NAME_ANNOTATION, generate_name, is_controlled_by,
    is_controlled_by_pod_group, pod_owner_reference, resolve_claim,
};

pub use super::entries::{
    EntryAction, EntryOutcome, EntryOwner, REASON_CREATION_FAILED, claim_statuses, perform_entries,
    record_entries,
};

mod writes;

pub use writes::execute;

/// Event reason for a pre-scheduled pod whose claim is not allocated.
pub(crate) const REASON_NOT_ALLOCATED: &str = "ResourceClaimNotAllocated";
/// Event reason for a pod on a node whose recorded claim is gone.
pub(crate) const REASON_CLAIM_MISSING: &str = "ResourceClaimMissing";

/// How long a pre-scheduled pod's claim may stay unallocated before the
/// user is told. A claim watch that lags behind the pod watch by seconds is
/// normal; a warning that is usually false teaches people to ignore it.
pub const NOT_ALLOCATED_GRACE: Duration = Duration::from_secs(10);

/// An allocated claim to reserve for a pod that bypassed the scheduler.
#[derive(Debug, Clone)]
pub struct Reservation {
    pub claim: Arc<ClaimView>,
    pub consumer: ResourceClaimConsumerReference,
}

/// Why pod work leaves a pod alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    Deleting,
    /// It will never run again, so it never gets a new claim.
    Done,
    /// Its PodGroup is not cached yet; its arrival wakes the pod.
    PodGroupUnknown,
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Skip::Deleting => "pod is being deleted",
            Skip::Done => "pod is done",
            Skip::PodGroupUnknown => "its PodGroup is not known yet",
        })
    }
}

/// Everything pod work decided for one pod.
#[derive(Debug, Default)]
pub struct PodDecision {
    /// Entry actions, in `spec.resourceClaims` order.
    pub entries: Vec<EntryAction>,
    /// Every entry of `status.resourceClaimStatuses` as it is now (entry →
    /// claim name, `None` for "no claim needed"). Every status apply sends
    /// all of them, with the new names put over them: an apply that left
    /// one out would remove it, and the kubelet unprepares by these names.
    pub recorded: BTreeMap<String, Option<String>>,
    pub reservations: Vec<Reservation>,
    /// Claims of a pre-scheduled pod that nothing will allocate (warned
    /// about once the grace period is over).
    pub unallocated: Vec<String>,
    /// `(entry, recorded claim)` of a pod on a node whose claim is gone or
    /// no longer its own: not replaced, the user is told once.
    pub missing: Vec<(String, String)>,
    /// Why nothing is done, when nothing is.
    pub skipped: Option<Skip>,
    /// Why the pod is refused until the controller's own settings change
    /// (1.37's non-retryable errors): nothing else is done for it.
    pub refused: Option<String>,
}

impl PodDecision {
    pub(crate) fn is_noop(&self) -> bool {
        self.refused.is_none()
            && self.entries.is_empty()
            && self.reservations.is_empty()
            && self.unallocated.is_empty()
            && self.missing.is_empty()
    }
}

/// Decides pod work from cached state.
pub fn decide(pod: &PodView, caches: &Caches, gates: FeatureGates) -> PodDecision {
    let mut decision = PodDecision::default();
    if pod.is_deleting() {
        decision.skipped = Some(Skip::Deleting);
        return decision;
    }
    if pod.is_done() {
        decision.skipped = Some(Skip::Done);
        return decision;
    }
    let statuses = &pod.status.resource_claim_statuses;
    decision.recorded = statuses
        .iter()
        .map(|s| (s.name.clone(), s.resource_claim_name.clone()))
        .collect();
    if gates.release.is_1_37()
        && !gates.generic_workload
        && let Some(group) = pod.pod_group_name()
    {
        // 1.37: only turning the gate on (and restarting) resolves it.
        decision.refused = Some(format!(
            "GenericWorkload feature is disabled but Pod is in PodGroup {group}: turn the gate on \
             (--feature-gates=GenericWorkload=true, as on kube-apiserver) and restart the controller"
        ));
        return decision;
    }
    // With DRAWorkloadResourceClaims, a member of a PodGroup uses the
    // group's claims for entries that match the group's exactly. (PodGroups
    // are cached with that gate on; in 1.37 also with GenericWorkload on.)
    let group = match caches.pod_group_of(pod) {
        None => None,
        Some(Ok(group)) => Some(group),
        Some(Err(_)) => {
            // Its arrival wakes the pod (members are indexed by group).
            decision.skipped = Some(Skip::PodGroupUnknown);
            return decision;
        }
    };
    // 1.37, DRAWorkloadResourceClaims off: entries matching a group claim
    // get no claim of their own, and one recorded earlier is not reserved.
    let mut not_reserved = Vec::new();
    for entry in &pod.spec.resource_claims {
        if let Some(group) = &group
            && entry.resource_claim_template_name.is_some()
            && group.matching_entry(entry).is_some()
        {
            if !gates.workload_resource_claims {
                let recorded = decision.recorded.get(&entry.name).cloned().flatten();
                match recorded {
                    Some(claim) => not_reserved.push(claim),
                    None => {
                        decision.refused = Some(format!(
                            "DRAWorkloadResourceClaims feature is disabled but spec.resourceClaims[{}] \
                             matches a claim of PodGroup {}: turn the gate on \
                             (--feature-gates=DRAWorkloadResourceClaims=true) and restart the controller",
                            entry.name,
                            group.name()
                        ));
                        decision.entries.clear();
                        return decision;
                    }
                }
                continue;
            }
            if let Some(adopt) = group_claim_to_record(pod, group, &entry.name, caches) {
                decision.entries.push(adopt);
            }
            continue;
        }
        match resolve_claim(entry, statuses) {
            ClaimResolution::Unsupported => decision.entries.push(EntryAction::Fail {
                entry: entry.name.clone(),
                reason: format!(
                    "spec.resourceClaims[{}] sets neither resourceClaimName nor resourceClaimTemplateName; \
                     it uses a field this controller does not know: upgrade dra-claim-controller",
                    entry.name
                ),
            }),
            ClaimResolution::Skipped | ClaimResolution::Shared(_) => {}
            ClaimResolution::Generated(name) => match recorded_claim_state(pod, &entry.name, name, caches) {
                RecordedClaim::Usable | RecordedClaim::MissingReported => {}
                RecordedClaim::MissingOnNode => {
                    decision.missing.push((entry.name.clone(), name.to_string()));
                }
                RecordedClaim::Replace => {
                    decision.entries.push(adopt_or_create(pod, &entry.name, entry, caches, gates));
                }
            },
            ClaimResolution::NotCreatedYet => {
                decision.entries.push(adopt_or_create(pod, &entry.name, entry, caches, gates));
            }
        }
    }
    if pod.node_name().is_some() {
        let group = group.as_deref().filter(|_| gates.workload_resource_claims);
        decide_reservations(pod, caches, group, &mut decision);
        decision
            .reservations
            .retain(|r| !not_reserved.iter().any(|c| c == r.claim.name()));
    }
    decision
}

/// For a member pod's entry bound to its group: the group's claim to
/// record in the pod's status, when it exists and is not recorded yet. The
/// pod never gets a claim of its own for such an entry; until the group's
/// claim exists, it waits.
fn group_claim_to_record(
    pod: &PodView,
    group: &PodGroupView,
    entry: &str,
    caches: &Caches,
) -> Option<EntryAction> {
    let status = pod
        .status
        .resource_claim_statuses
        .iter()
        .find(|s| s.name == entry);
    if status.is_some_and(|s| s.resource_claim_name.is_none()) {
        // Recorded as "no claim needed": settled.
        return None;
    }
    let recorded = status.and_then(|s| s.resource_claim_name.as_deref());
    if let Some(name) = recorded
        && caches
            .claim(pod.namespace(), name)
            .is_some_and(|c| is_controlled_by_pod_group(c.owner_references(), group.name()))
    {
        return None;
    }
    adoptable(
        caches.claims_owned_by_group(group.namespace(), group.uid()),
        entry,
    )
}

/// The claim to adopt for `entry` among those its owner controls: the
/// first by name made for that entry and not being deleted.
pub(crate) fn adoptable(mut owned: Vec<Arc<ClaimView>>, entry: &str) -> Option<EntryAction> {
    owned.sort_by(|a, b| a.name().cmp(b.name()));
    let claim = owned
        .iter()
        .find(|c| c.annotation(POD_CLAIM_NAME_ANNOTATION) == Some(entry) && !c.is_deleting())?;
    Some(EntryAction::Adopt {
        entry: entry.to_string(),
        claim_name: claim.name().to_string(),
    })
}

/// What a recorded claim name of a template entry means now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordedClaim {
    /// The claim exists and the pod controls it.
    Usable,
    /// Gone or no longer the pod's, and the pod is not on a node yet: find
    /// or make a replacement (the scheduler will allocate it).
    Replace,
    /// Gone or no longer the pod's, and the pod is bound to a node: a
    /// replacement could never be allocated (the scheduler is done with the
    /// pod) and the kubelet prepared, and will unprepare, the recorded one.
    /// Not replaced; the user is told.
    MissingOnNode,
    /// As `MissingOnNode`, and the user was told already.
    MissingReported,
}

/// Classifies the recorded claim `name` of the pod's template entry.
pub(crate) fn recorded_claim_state(
    pod: &PodView,
    entry: &str,
    name: &str,
    caches: &Caches,
) -> RecordedClaim {
    match caches.claim(pod.namespace(), name) {
        Some(claim) if is_controlled_by(claim.owner_references(), pod.uid()) => {
            RecordedClaim::Usable
        }
        _ if pod.node_name().is_none() => RecordedClaim::Replace,
        _ if caches.missing_claim_reported(pod.uid(), entry) => RecordedClaim::MissingReported,
        _ => RecordedClaim::MissingOnNode,
    }
}

fn adopt_or_create(
    pod: &PodView,
    entry_name: &str,
    entry: &k8s_openapi::api::core::v1::PodResourceClaim,
    caches: &Caches,
    gates: FeatureGates,
) -> EntryAction {
    // Adopt before creating: a claim we made earlier (maybe a moment ago,
    // before a failed status write) must be reused, never duplicated.
    if let Some(adopt) = adoptable(caches.claims_owned_by(pod.uid()), entry_name) {
        return adopt;
    }
    let template_name = entry
        .resource_claim_template_name
        .as_deref()
        .unwrap_or_default();
    let template = match usable_template(pod.namespace(), entry_name, template_name, caches, gates)
    {
        Ok(t) => t,
        Err(reason) => {
            return EntryAction::Fail {
                entry: entry_name.to_string(),
                reason,
            };
        }
    };
    let (claim, admin_access) = claim_from_template(pod, entry_name, &template);
    EntryAction::Create {
        entry: entry_name.to_string(),
        claim,
        admin_access,
    }
}

/// The template an entry names, if it exists and the gates allow what it
/// asks for; otherwise what to tell the user.
pub(crate) fn usable_template(
    namespace: &str,
    entry_name: &str,
    template_name: &str,
    caches: &Caches,
    gates: FeatureGates,
) -> Result<Arc<TemplateView>, String> {
    let key = crate::runtime::store::object_key(namespace, template_name);
    let Some(template) = caches.templates.get(&key) else {
        return Err(format!(
            "ResourceClaimTemplate {key} not found: create it, or fix \
             spec.resourceClaims[{entry_name}].resourceClaimTemplateName"
        ));
    };
    if !gates.admin_access && template.needs_admin_access() {
        return Err(format!(
            "ResourceClaimTemplate {key} requests adminAccess, but the DRAAdminAccess \
             feature gate is off: remove adminAccess or enable the gate (--feature-gates)"
        ));
    }
    if !gates.prioritized_list && template.has_prioritized_list() {
        return Err(format!(
            "ResourceClaimTemplate {key} uses a prioritized list (firstAvailable), but the \
             DRAPrioritizedList feature gate is off: use exactly or enable the gate (--feature-gates)"
        ));
    }
    Ok(template)
}

/// The claim object generated for `pod`'s entry from `template`.
pub(crate) fn claim_from_template(
    pod: &PodView,
    entry_name: &str,
    template: &TemplateView,
) -> (Value, bool) {
    generated_claim(
        pod.namespace(),
        pod.name(),
        pod_owner_reference(pod.name(), pod.uid()),
        entry_name,
        template,
    )
}

/// The claim object generated for the entry `entry_name` of an owner (a
/// pod, or a PodGroup) named `owner_name`, from `template`; and whether it
/// asks for admin access.
pub(crate) fn generated_claim(
    namespace: &str,
    owner_name: &str,
    owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    entry_name: &str,
    template: &TemplateView,
) -> (Value, bool) {
    let mut annotations = template.claim_metadata("annotations");
    annotations.insert(
        POD_CLAIM_NAME_ANNOTATION.to_string(),
        entry_name.to_string(),
    );
    let labels = template.claim_metadata("labels");
    let mut metadata = json!({
        "generateName": generate_name(owner_name, entry_name),
        "namespace": namespace,
        "ownerReferences": [owner],
        "annotations": annotations,
    });
    if !labels.is_empty() {
        metadata["labels"] = json!(labels);
    }
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": template.claim_spec(),
    });
    let admin_access = template.needs_admin_access();
    (claim, admin_access)
}

fn decide_reservations(
    pod: &PodView,
    caches: &Caches,
    group: Option<&PodGroupView>,
    decision: &mut PodDecision,
) {
    let node = pod.node_name().unwrap_or_default();
    for Unreserved { claim, consumer } in
        unreserved_claims(pod, group, |name| caches.claim(pod.namespace(), name))
    {
        if claim.is_allocated() {
            decision.reservations.push(Reservation { consumer, claim });
        } else if pod.is_pre_scheduled() && !caches.allocated_elsewhere(node, &claim) {
            // Bound by a scheduler, the claim was allocated before binding
            // and our watch has not shown it yet; bound without one, nothing
            // will allocate it (on a node whose claims the allocator serves,
            // the allocator will).
            decision.unallocated.push(claim.name().to_string());
        }
    }
}

/// The text of the `ResourceClaimNotAllocated` warning: what happened and
/// what to do.
pub(crate) fn not_allocated_message(claim_name: &str, node: &str) -> String {
    format!(
        "ResourceClaim {claim_name} is not allocated, and nothing will allocate it: the pod was \
         created with spec.nodeName={node}, which bypasses kube-scheduler, and only the scheduler \
         allocates claims. Re-create the pod without spec.nodeName and pin it with a node \
         selector instead (kubernetes.io/hostname: {node}); to have such pods rewritten that way \
         automatically, install the dra-claim-controller chart with \
         prescheduledPods.policy.enabled=true"
    )
}

#[cfg(test)]
mod tests;
