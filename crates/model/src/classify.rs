//! What is wrong with a claim, judged from the claim and the pods it names.
//!
//! One classifier serves three readers: `drain-check` (one node), `audit`
//! (the cluster) and the controller's `dra_claim_controller_claims` gauge
//! (its caches, at scrape time). It is pure: the caller passes a lookup of
//! pods by name in the claim's namespace and the current time.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimConsumerReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;

use super::consumers::DELETE_PROTECTION_FINALIZER;
use super::views::{ClaimView, PodView};
use crate::naming::{EXTENDED_RESOURCE_CLAIM_ANNOTATION, POD_CLAIM_NAME_ANNOTATION};

/// A claim deleted longer ago than this while its finalizer is still set
/// counts as stuck. The claim controller removes the finalizer within
/// moments of deallocating it; a minute leaves room for a busy controller.
pub(crate) const STUCK_DELETING_AFTER: Duration = Duration::from_secs(60);

/// The fields of a claim the classifier reads, borrowed from either the
/// full API object or the controller's cached view.
#[derive(Debug, Clone, Copy)]
pub struct ClaimFacts<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub allocated: bool,
    pub reserved_for: &'a [ResourceClaimConsumerReference],
    pub owners: &'a [OwnerReference],
    /// Made by a controller for one pod (from a template, or for extended
    /// resources): it should go when its pod is done.
    pub generated: bool,
    pub deleted_at: Option<Timestamp>,
    pub delete_protected: bool,
}

fn is_generated(annotations: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    annotations.is_some_and(|a| {
        a.get(POD_CLAIM_NAME_ANNOTATION)
            .is_some_and(|v| !v.is_empty())
            || a.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION)
                .is_some_and(|v| v == "true")
    })
}

impl<'a> From<&'a ResourceClaim> for ClaimFacts<'a> {
    fn from(c: &'a ResourceClaim) -> Self {
        let status = c.status.as_ref();
        ClaimFacts {
            namespace: c.metadata.namespace.as_deref().unwrap_or_default(),
            name: c.metadata.name.as_deref().unwrap_or_default(),
            allocated: status.is_some_and(|s| s.allocation.is_some()),
            reserved_for: status
                .and_then(|s| s.reserved_for.as_deref())
                .unwrap_or_default(),
            owners: c.metadata.owner_references.as_deref().unwrap_or_default(),
            generated: is_generated(c.metadata.annotations.as_ref()),
            deleted_at: c.metadata.deletion_timestamp.as_ref().map(|t| t.0),
            delete_protected: c
                .metadata
                .finalizers
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|f| f == DELETE_PROTECTION_FINALIZER),
        }
    }
}

impl<'a> From<&'a ClaimView> for ClaimFacts<'a> {
    fn from(c: &'a ClaimView) -> Self {
        ClaimFacts {
            namespace: c.namespace(),
            name: c.name(),
            allocated: c.is_allocated(),
            reserved_for: &c.status.reserved_for,
            owners: c.owner_references(),
            generated: is_generated(c.metadata.annotations.as_ref()),
            deleted_at: c.metadata.deletion_timestamp.as_ref().map(|t| t.0),
            delete_protected: c
                .finalizers()
                .iter()
                .any(|f| f == DELETE_PROTECTION_FINALIZER),
        }
    }
}

/// What became of a pod a claim names (as consumer or owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Exists with the named UID and may run: its devices may be prepared.
    Active {
        node: Option<String>,
        /// Deleted, but its containers may still run on its node.
        terminating: bool,
    },
    /// Succeeded or Failed (or deleted before it was ever scheduled).
    Done { phase: String },
    /// No pod of that name.
    Gone,
    /// A pod of that name with another UID: the named one is gone.
    Replaced,
}

impl PodState {
    /// The pod named by `uid`, judged from what the lookup found.
    pub fn of(found: Option<&PodView>, uid: &str) -> PodState {
        let Some(pod) = found else {
            return PodState::Gone;
        };
        if !uid.is_empty() && pod.uid() != uid {
            return PodState::Replaced;
        }
        if pod.is_done() {
            let phase = if pod.is_terminal() {
                pod.status.phase.clone().unwrap_or_default()
            } else {
                "DeletedBeforeScheduling".into()
            };
            return PodState::Done { phase };
        }
        PodState::Active {
            node: pod.node_name().map(str::to_string),
            terminating: pod.is_deleting(),
        }
    }

    pub(crate) fn is_active(&self) -> bool {
        matches!(self, PodState::Active { .. })
    }

    /// A short word for tables and JSON.
    pub fn describe(&self) -> String {
        match self {
            PodState::Active {
                terminating: true, ..
            } => "Terminating".into(),
            PodState::Active { node: None, .. } => "Pending".into(),
            PodState::Active { .. } => "Running".into(),
            PodState::Done { phase } => phase.clone(),
            PodState::Gone => "Gone".into(),
            PodState::Replaced => "Replaced".into(),
        }
    }
}

/// A pod a claim names, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub state: PodState,
    /// The NodeScalingWatermark whose headroom placeholder this pod is: safe
    /// to evict, never a reason to hold a drain.
    pub placeholder_of: Option<String>,
}

impl PodRef {
    /// The pod `name` with `uid` in `namespace`, judged from what a lookup
    /// of that name found.
    pub fn judge(namespace: &str, name: &str, uid: &str, found: Option<&PodView>) -> Self {
        let state = PodState::of(found, uid);
        let placeholder_of = found
            .filter(|_| !matches!(state, PodState::Gone | PodState::Replaced))
            .and_then(PodView::placeholder_of)
            .map(str::to_string);
        PodRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            state,
            placeholder_of,
        }
    }

    /// "ns/name", with "(placeholder of watermark w)" when it is one.
    pub fn describe(&self) -> String {
        match &self.placeholder_of {
            Some(w) => format!(
                "{}/{} (headroom placeholder of NodeScalingWatermark {w})",
                self.namespace, self.name
            ),
            None => format!("{}/{}", self.namespace, self.name),
        }
    }
}

/// A problem with one claim. A claim may have several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// `reservedFor` names a pod that is gone, replaced or done: the claim
    /// controller has not caught up (or is not running), or the pod was
    /// force-deleted.
    StaleReservation { consumer: PodRef },
    /// Allocated, reserved for nobody, and no live pod owns it: its devices
    /// are held for no one.
    LeakedAllocation { owner: Option<PodRef> },
    /// Generated for a pod that is done or gone, and not deleted.
    OrphanedGenerated { owner: PodRef },
    /// Deleted a while ago, still held by the delete-protection finalizer.
    StuckDeleting { deleted_for: Duration },
    /// Reserved for something other than a pod, which this tool cannot check.
    UnverifiableConsumer {
        api_group: String,
        resource: String,
        name: String,
    },
}

/// The kinds of [`Problem`], as the gauge labels them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProblemKind {
    StaleReservation,
    LeakedAllocation,
    OrphanedGenerated,
    StuckDeleting,
    UnverifiableConsumer,
}

impl ProblemKind {
    /// The states the controller's gauge exports (always all of them, so
    /// alerts see zeros rather than absent series).
    pub const GAUGE_STATES: [ProblemKind; 4] = [
        ProblemKind::StaleReservation,
        ProblemKind::LeakedAllocation,
        ProblemKind::OrphanedGenerated,
        ProblemKind::StuckDeleting,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ProblemKind::StaleReservation => "stale_reservation",
            ProblemKind::LeakedAllocation => "leaked_allocation",
            ProblemKind::OrphanedGenerated => "orphaned_generated",
            ProblemKind::StuckDeleting => "stuck_deleting",
            ProblemKind::UnverifiableConsumer => "unverifiable_consumer",
        }
    }
}

impl Problem {
    pub fn kind(&self) -> ProblemKind {
        match self {
            Problem::StaleReservation { .. } => ProblemKind::StaleReservation,
            Problem::LeakedAllocation { .. } => ProblemKind::LeakedAllocation,
            Problem::OrphanedGenerated { .. } => ProblemKind::OrphanedGenerated,
            Problem::StuckDeleting { .. } => ProblemKind::StuckDeleting,
            Problem::UnverifiableConsumer { .. } => ProblemKind::UnverifiableConsumer,
        }
    }
}

use super::consumers::is_pod_consumer;

/// The pods `reservedFor` names, with their states.
pub fn pod_consumers(
    claim: &ClaimFacts<'_>,
    pods: &dyn Fn(&str) -> Option<Arc<PodView>>,
) -> Vec<PodRef> {
    claim
        .reserved_for
        .iter()
        .filter(|r| is_pod_consumer(r))
        .map(|r| PodRef::judge(claim.namespace, &r.name, &r.uid, pods(&r.name).as_deref()))
        .collect()
}

/// The pod that controls the claim, if a pod does, with its state.
pub(crate) fn owner_pod(
    claim: &ClaimFacts<'_>,
    pods: &dyn Fn(&str) -> Option<Arc<PodView>>,
) -> Option<PodRef> {
    let (name, uid) = crate::naming::controlling_pod(claim.owners)?;
    Some(PodRef::judge(
        claim.namespace,
        name,
        uid,
        pods(name).as_deref(),
    ))
}

/// The claim's problems. `pods` finds a pod by name in the claim's
/// namespace; `None` means no such pod exists.
pub fn problems(
    claim: &ClaimFacts<'_>,
    pods: &dyn Fn(&str) -> Option<Arc<PodView>>,
    now: Timestamp,
) -> Vec<Problem> {
    let mut found = Vec::new();
    for r in claim.reserved_for.iter().filter(|r| !is_pod_consumer(r)) {
        found.push(Problem::UnverifiableConsumer {
            api_group: r.api_group.clone().unwrap_or_default(),
            resource: r.resource.clone(),
            name: r.name.clone(),
        });
    }
    for consumer in pod_consumers(claim, pods) {
        if !consumer.state.is_active() {
            found.push(Problem::StaleReservation { consumer });
        }
    }
    if let Some(deleted_at) = claim.deleted_at {
        // Being deleted: leaks and orphans resolve themselves once the
        // finalizer goes, so only a finalizer that stays is a problem.
        let deleted_for = now
            .duration_since(deleted_at)
            .try_into()
            .unwrap_or_default();
        if claim.delete_protected && deleted_for >= STUCK_DELETING_AFTER {
            found.push(Problem::StuckDeleting { deleted_for });
        }
        return found;
    }
    let controlled_by_other_kind = claim
        .owners
        .iter()
        .any(|o| o.controller == Some(true) && !(o.api_version == "v1" && o.kind == "Pod"));
    let owner = owner_pod(claim, pods);
    if let Some(owner) = &owner
        && claim.generated
        && !owner.state.is_active()
    {
        found.push(Problem::OrphanedGenerated {
            owner: owner.clone(),
        });
    }
    let owner_alive = owner.as_ref().is_some_and(|o| o.state.is_active());
    if claim.allocated && claim.reserved_for.is_empty() && !owner_alive && !controlled_by_other_kind
    {
        found.push(Problem::LeakedAllocation { owner });
    }
    found
}

#[cfg(test)]
mod tests;
