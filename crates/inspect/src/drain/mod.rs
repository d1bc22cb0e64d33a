//! `drain-check`: may the DRA driver of a node go?
//!
//! A driver must stay until every claim whose devices it prepared on the
//! node has been released: otherwise the kubelet cannot unprepare them and
//! the pods hang in Terminating. A claim matters to the node when it is
//! allocated devices that serve the node, or reserved for a pod bound to it.
//! It blocks while one of those consumers still exists with the reserved
//! UID and is not done.
//!
//! The node's own pods are also checked from their side: a pod bound to
//! the node that may run blocks on every allocated claim it names, reserved
//! for it or not (a claim reserved for a pod group, a reservation written
//! after the claims were read); and a pod whose containers finished only
//! moments ago blocks too, because the kubelet unprepares devices after
//! the pod finishes, when the claim controller may already have released
//! the claim.
//!
//! That side, each node pod and what it means for its devices now, is
//! `node_pods.rs`'s; the check itself and what matters to the node, here.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;

use super::placement::allocation_serves;
use super::report::{ClaimRef, DrainCheckReport, Finding};
use super::snapshot::{Snapshot, claim_ref, devices, named_pods};
use dra_model::classify::{ClaimFacts, PodRef, PodState, pod_consumers, problems};

mod node_pods;

pub(crate) use node_pods::claims_to_look_up;
use node_pods::{NodePod, node_pods};

/// How long after its containers finished a pod still counts as holding
/// its devices: the kubelet unprepares them during the pod's cleanup.
pub(crate) const DEFAULT_FINISHED_GRACE: Duration = Duration::from_secs(30);

/// The node (and optionally the driver) being drained.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DrainScope<'a> {
    pub node: &'a str,
    pub driver: Option<&'a str>,
    /// See [`DEFAULT_FINISHED_GRACE`].
    pub finished_grace: Duration,
}

impl<'a> DrainScope<'a> {
    pub(crate) fn new(node: &'a str, driver: Option<&'a str>) -> Self {
        DrainScope {
            node,
            driver,
            finished_grace: DEFAULT_FINISHED_GRACE,
        }
    }
}

/// Why the check cannot mean anything for this node or driver: a name that
/// nothing in the cluster knows is almost certainly a typo, and "clean"
/// would be a dangerous answer to it.
pub(crate) fn unknown_target(snapshot: &Snapshot, scope: DrainScope<'_>) -> Option<String> {
    let node_known = snapshot.nodes.contains_key(scope.node)
        || snapshot
            .pods
            .values()
            .any(|p| p.node_name() == Some(scope.node))
        || snapshot
            .slices
            .iter()
            .any(|s| s.spec.node_name.as_deref() == Some(scope.node));
    if !node_known {
        return Some(format!(
            "node {:?} not found: no Node object, no pod bound to it, no ResourceSlice for it; check the name (kubectl get nodes)",
            scope.node
        ));
    }
    let driver = scope.driver?;
    let driver_known = snapshot.slices.iter().any(|s| s.spec.driver == driver)
        || snapshot
            .claims
            .iter()
            .any(|c| !devices(c, Some(driver)).is_empty());
    (!driver_known).then(|| {
        format!(
            "driver {driver:?} publishes no ResourceSlice and no claim is allocated a device of it; check the name (kubectl get resourceslices)"
        )
    })
}

/// Whether the claim's allocation serves the node through its selector or
/// its devices' slices.
fn allocated_for_node(claim: &ResourceClaim, snapshot: &Snapshot, scope: DrainScope<'_>) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .is_some_and(|a| {
            allocation_serves(
                a,
                &snapshot.slices,
                &snapshot.node(scope.node),
                scope.driver,
            )
        })
}

/// Whether the claim holds devices (of the driver, when given) that matter
/// to the node. `snapshot.pods` must hold every pod bound to the node.
pub(crate) fn matters_to_node(
    claim: &ResourceClaim,
    snapshot: &Snapshot,
    scope: DrainScope<'_>,
) -> bool {
    relevance(claim, snapshot, scope).is_some()
}

/// `None` when the claim does not matter to the node; otherwise whether
/// its allocation serves the node (it may matter only through a consumer
/// running there).
fn relevance(claim: &ResourceClaim, snapshot: &Snapshot, scope: DrainScope<'_>) -> Option<bool> {
    if devices(claim, scope.driver).is_empty() {
        // Not allocated (or nothing of this driver): nothing is prepared.
        return None;
    }
    if allocated_for_node(claim, snapshot, scope) {
        return Some(true);
    }
    let facts = ClaimFacts::from(claim);
    let lookup = |name: &str| snapshot.pod(facts.namespace, name);
    pod_consumers(&facts, &lookup)
        .iter()
        .any(|c| matches!(&c.state, PodState::Active { node: Some(n), .. } if n == scope.node))
        .then_some(false)
}

/// Pods that claims mattering to the node name but that are not in the
/// snapshot yet: the reader fetches each (absent afterwards = gone).
pub(crate) fn pods_to_look_up(
    snapshot: &Snapshot,
    scope: DrainScope<'_>,
) -> BTreeSet<(String, String)> {
    snapshot
        .claims
        .iter()
        .filter(|c| matters_to_node(c, snapshot, scope))
        .flat_map(named_pods)
        .filter(|key| !snapshot.pods.contains_key(key))
        .collect()
}

/// The check itself.
pub(crate) fn check(
    snapshot: &Snapshot,
    scope: DrainScope<'_>,
    now: Timestamp,
) -> DrainCheckReport {
    let mut report = DrainCheckReport::new(scope.node, scope.driver, now.to_string());
    let mut claims: Vec<(&ResourceClaim, bool)> = snapshot
        .claims
        .iter()
        .filter_map(|c| Some((c, relevance(c, snapshot, scope)?)))
        .collect();
    claims.sort_by_key(|(c, _)| (c.metadata.namespace.clone(), c.metadata.name.clone()));
    // (claim, pod UID) pairs already reported as blocking.
    let mut blocking: BTreeSet<(String, String, String)> = BTreeSet::new();
    for (claim, allocated_here) in claims {
        let facts = ClaimFacts::from(claim);
        let lookup = |name: &str| snapshot.pod(facts.namespace, name);
        let devs = devices(claim, scope.driver);
        for consumer in pod_consumers(&facts, &lookup) {
            let blocks = match &consumer.state {
                PodState::Active { node: Some(n), .. } => n == scope.node,
                // Not bound yet: it will run where its devices are.
                PodState::Active { node: None, .. } => allocated_here,
                _ => false,
            };
            if blocks {
                let r = claim_ref(claim);
                blocking.insert((r.namespace.clone(), r.name.clone(), consumer.uid.clone()));
                if consumer.placeholder_of.is_some() {
                    report
                        .placeholders
                        .push(Finding::placeholder(r, devs.clone(), &consumer));
                } else {
                    report
                        .blocking
                        .push(Finding::in_use(r, devs.clone(), &consumer));
                }
            }
        }
        for problem in problems(&facts, &lookup, now) {
            report
                .warnings
                .push(Finding::problem(claim_ref(claim), devs.clone(), &problem));
        }
    }
    // From the pods' side.
    let by_name = snapshot.claims_by_key();
    for (pod, state) in node_pods(snapshot, scope, now) {
        let pod_ref = PodRef::judge(pod.namespace(), pod.name(), pod.uid(), Some(pod));
        for name in pod.claim_names() {
            let claim = by_name.get(&(pod.namespace(), name)).copied();
            let key = (
                pod.namespace().to_string(),
                name.to_string(),
                pod.uid().to_string(),
            );
            if blocking.contains(&key) {
                continue;
            }
            let r = ClaimRef {
                namespace: pod.namespace().to_string(),
                name: name.to_string(),
            };
            match (&state, claim) {
                (_, claim) if pod_ref.placeholder_of.is_some() => {
                    let devs = claim.map(|c| devices(c, scope.driver)).unwrap_or_default();
                    if !devs.is_empty() {
                        blocking.insert(key);
                        report
                            .placeholders
                            .push(Finding::placeholder(r, devs, &pod_ref));
                    }
                }
                (NodePod::Running, Some(claim)) => {
                    let devs = devices(claim, scope.driver);
                    if !devs.is_empty() {
                        blocking.insert(key);
                        report.blocking.push(Finding::in_use(r, devs, &pod_ref));
                    }
                }
                (NodePod::Finishing(ago), claim) => {
                    // The claim may be released or gone already; its devices
                    // may still be prepared. Another driver's claim that
                    // still shows its devices is no concern.
                    let devs = claim.map(|c| devices(c, scope.driver)).unwrap_or_default();
                    let other_driver = claim.is_some_and(|c| {
                        devices(c, scope.driver).is_empty() && !devices(c, None).is_empty()
                    });
                    if !other_driver {
                        blocking.insert(key);
                        report
                            .blocking
                            .push(Finding::finishing(r, devs, &pod_ref, *ago));
                    }
                }
                _ => {}
            }
        }
    }
    report.conclude()
}

#[cfg(test)]
mod tests;
