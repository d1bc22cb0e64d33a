//! When a pod must go for its devices' `NoExecute` taints, as a plain value.
//!
//! For each device a claim was allocated: every `NoExecute` taint on it
//! (its slice's, current pool generation, and every matching rule's) that
//! the allocation's tolerations do not tolerate forever counts; its time is
//! `timeAdded`, plus the smallest `tolerationSeconds` (negative: 0) of the
//! tolerations that match it. A claim goes at the earliest such time, a pod
//! at the earliest of its claims. Which claims count: those the pod names
//! in `spec.resourceClaims` (a template's through `resourceClaimStatuses`,
//! controlled by the pod or, with PodGroup claims, by its PodGroup), and,
//! beyond kube-controller-manager 1.36 and 1.37, the claim of its extended
//! resources; each allocated and reserved for the pod (or its PodGroup).

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::DeviceToleration;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::model::consumers::is_pod_group_consumer;
use crate::model::device_taints::{DeviceTaints, TaintSource, tolerates_no_execute};
use crate::model::views::{ClaimView, PodView};
use crate::naming::{is_controlled_by, is_controlled_by_pod_group};

/// A pending eviction: when, and every taint that counts.
#[derive(Clone, Debug, PartialEq)]
pub struct Eviction {
    pub at: Timestamp,
    pub reasons: BTreeSet<TaintSource>,
}

impl Eviction {
    fn merge(into: &mut Option<Eviction>, other: Eviction) {
        match into {
            None => *into = Some(other),
            Some(e) => {
                e.at = e.at.min(other.at);
                e.reasons.extend(other.reasons);
            }
        }
    }
}

/// When the claim's devices make its users go, if ever. Every counted
/// taint is a reason; only those with a time set one (the API server always
/// sets `timeAdded`; a claim whose taints all lack it is not evicted).
pub fn claim_eviction(claim: &ClaimView, taints: &DeviceTaints) -> Option<Eviction> {
    let results = &claim.status.allocation.as_ref()?.devices.results;
    let mut at: Option<Timestamp> = None;
    let mut reasons = BTreeSet::new();
    for result in results {
        for (source, taint) in taints.of(&result.driver, &result.pool, &result.device) {
            if taint.effect != "NoExecute" {
                continue;
            }
            let Counted(when) = counted(taint, &result.tolerations) else {
                continue;
            };
            reasons.insert(source);
            if let Some(when) = when {
                at = Some(at.map_or(when, |a| a.min(when)));
            }
        }
    }
    at.map(|at| Eviction { at, reasons })
}

/// How one taint counts under these tolerations: not at all when
/// tolerated forever (`NotCounted`); else when it evicts, if its time is
/// known. A grace past the end of time saturates there.
enum Counting {
    Counted(Option<Timestamp>),
    NotCounted,
}
use Counting::{Counted, NotCounted};

fn counted(
    taint: &k8s_openapi::api::resource::v1::DeviceTaint,
    tolerations: &[DeviceToleration],
) -> Counting {
    let matching: Vec<&DeviceToleration> = tolerations
        .iter()
        .filter(|t| tolerates_no_execute(t, taint))
        .collect();
    if matching.iter().any(|t| t.toleration_seconds.is_none()) {
        return NotCounted;
    }
    let Some(added) = taint.time_added.as_ref().map(|t| t.0) else {
        return Counted(None);
    };
    let grace = matching
        .iter()
        .filter_map(|t| t.toleration_seconds)
        .map(|s| s.max(0))
        .min()
        .unwrap_or(0);
    Counted(Some(
        added
            .checked_add(SignedDuration::from_secs(grace))
            .unwrap_or(Timestamp::MAX),
    ))
}

/// When the pod must go, if ever. `claim` finds a cached claim by
/// namespace and name; `pod_group_claims`: DRAWorkloadResourceClaims.
pub fn pod_eviction<C: std::ops::Deref<Target = ClaimView>>(
    pod: &PodView,
    claim: impl Fn(&str, &str) -> Option<C>,
    taints: &DeviceTaints,
    pod_group_claims: bool,
) -> Option<Eviction> {
    pod.node_name()?;
    let group = pod.pod_group_name().filter(|_| pod_group_claims);
    let reserved = |c: &ClaimView| {
        c.is_reserved_for(pod.uid())
            || group.is_some_and(|g| {
                c.status
                    .reserved_for
                    .iter()
                    .any(|r| is_pod_group_consumer(r) && r.name == g)
            })
    };
    let mut eviction = None;
    let mut consider = |name: &str, must_be_ours: bool| {
        let Some(c) = claim(pod.namespace(), name) else {
            return;
        };
        let c: &ClaimView = &c;
        let ours = is_controlled_by(c.owner_references(), pod.uid())
            || group.is_some_and(|g| is_controlled_by_pod_group(c.owner_references(), g));
        if (must_be_ours && !ours) || !reserved(c) {
            return;
        }
        if let Some(e) = claim_eviction(c, taints) {
            Eviction::merge(&mut eviction, e);
        }
    };
    for entry in &pod.spec.resource_claims {
        if let Some(name) = entry.resource_claim_name.as_deref() {
            consider(name, false);
        } else if entry.resource_claim_template_name.is_some() {
            let recorded = pod
                .status
                .resource_claim_statuses
                .iter()
                .find(|s| s.name == entry.name)
                .and_then(|s| s.resource_claim_name.as_deref());
            if let Some(name) = recorded {
                consider(name, true);
            }
        }
    }
    // As 1.38 (kubernetes #142289), and beyond 1.36 and 1.37, whatever the
    // release acted as: devices held through extended resources are
    // evicted from too, when the claim is the pod's own.
    if let Some(name) = pod.extended_claim_name() {
        consider(name, true);
    }
    eviction
}

#[cfg(test)]
mod tests;
