//! `drain-check`: may the DRA driver of a node go?
//!
//! A driver must stay until every claim whose devices it prepared on the
//! node has been released: otherwise the kubelet cannot unprepare them and
//! the pods hang in Terminating. A claim matters to the node when it is
//! allocated devices that serve the node, or reserved for a pod bound to it.
//! It blocks while one of those consumers still exists with the reserved
//! UID and is not done.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;

use super::classify::{ClaimFacts, PodState, pod_consumers, problems};
use super::placement::allocation_serves;
use super::report::{DrainCheckReport, Finding};
use super::snapshot::{Snapshot, claim_ref, devices, named_pods};

/// The node (and optionally the driver) being drained.
#[derive(Debug, Clone, Copy)]
pub struct DrainScope<'a> {
    pub node: &'a str,
    pub driver: Option<&'a str>,
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
pub fn matters_to_node(claim: &ResourceClaim, snapshot: &Snapshot, scope: DrainScope<'_>) -> bool {
    if devices(claim, scope.driver).is_empty() {
        // Not allocated (or nothing of this driver): nothing is prepared.
        return false;
    }
    if allocated_for_node(claim, snapshot, scope) {
        return true;
    }
    let facts = ClaimFacts::from(claim);
    let lookup = |name: &str| snapshot.pod(facts.namespace, name);
    pod_consumers(&facts, &lookup)
        .iter()
        .any(|c| matches!(&c.state, PodState::Active { node: Some(n), .. } if n == scope.node))
}

/// Pods that claims mattering to the node name but that are not in the
/// snapshot yet: the reader fetches each (absent afterwards = gone).
pub fn pods_to_look_up(snapshot: &Snapshot, scope: DrainScope<'_>) -> BTreeSet<(String, String)> {
    snapshot
        .claims
        .iter()
        .filter(|c| matters_to_node(c, snapshot, scope))
        .flat_map(named_pods)
        .filter(|key| !snapshot.pods.contains_key(key))
        .collect()
}

/// The check itself.
pub fn check(snapshot: &Snapshot, scope: DrainScope<'_>, now: Timestamp) -> DrainCheckReport {
    let mut report = DrainCheckReport::new(scope.node, scope.driver, now.to_string());
    let mut claims: Vec<&ResourceClaim> = snapshot
        .claims
        .iter()
        .filter(|c| matters_to_node(c, snapshot, scope))
        .collect();
    claims.sort_by_key(|c| (c.metadata.namespace.clone(), c.metadata.name.clone()));
    for claim in claims {
        let facts = ClaimFacts::from(claim);
        let lookup = |name: &str| snapshot.pod(facts.namespace, name);
        let devs = devices(claim, scope.driver);
        let allocated_here = allocated_for_node(claim, snapshot, scope);
        for consumer in pod_consumers(&facts, &lookup) {
            let blocks = match &consumer.state {
                PodState::Active { node: Some(n), .. } => n == scope.node,
                // Not bound yet: it will run where its devices are.
                PodState::Active { node: None, .. } => allocated_here,
                _ => false,
            };
            if blocks {
                report
                    .blocking
                    .push(Finding::in_use(claim_ref(claim), devs.clone(), &consumer));
            }
        }
        for problem in problems(&facts, &lookup, now) {
            report
                .warnings
                .push(Finding::problem(claim_ref(claim), devs.clone(), &problem));
        }
    }
    report.conclude()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::resourceclaim::views::PodView;
    use crate::inspect::placement::NodeFacts;
    use crate::inspect::report::Verdict;
    use serde_json::{Value, json};

    const NODE: &str = "gpu-1";

    fn pod(name: &str, uid: &str, node: Option<&str>, phase: &str) -> PodView {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"nodeName": node}, "status": {"phase": phase}}))
        .unwrap()
    }

    fn claim(
        name: &str,
        device_pool: &str,
        reserved: &[(&str, &str)],
        selector_node: Option<&str>,
    ) -> ResourceClaim {
        let mut allocation = json!({"devices": {"results": [
            {"request": "gpu", "driver": "gpu.example.com", "pool": device_pool, "device": "d0"}]}});
        if let Some(n) = selector_node {
            allocation["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [n]}]}]});
        }
        let reserved: Vec<Value> = reserved
            .iter()
            .map(|(n, u)| json!({"resource": "pods", "name": n, "uid": u}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {},
            "status": {"allocation": allocation, "reservedFor": reserved}}))
        .unwrap()
    }

    fn snapshot(claims: Vec<ResourceClaim>, pods: Vec<PodView>) -> Snapshot {
        let mut s = Snapshot {
            claims,
            ..Default::default()
        };
        for p in pods {
            s.add_pod(p);
        }
        s.nodes.insert(NODE.into(), NodeFacts::named(NODE));
        s
    }

    /// Verdict, number of blocking entries, warning types.
    type Outcome = (Verdict, usize, Vec<String>);

    fn verdict(s: &Snapshot) -> Outcome {
        let r = check(
            s,
            DrainScope {
                node: NODE,
                driver: None,
            },
            "2026-11-23T12:00:00Z".parse().unwrap(),
        );
        (
            r.verdict,
            r.blocking.len(),
            r.warnings.iter().map(|w| w.kind.clone()).collect(),
        )
    }

    #[test]
    fn consumers_decide() {
        let rows: [(&str, Snapshot, Outcome); 7] = [
            (
                "running consumer on the node",
                snapshot(
                    vec![claim("c", "gpu-1", &[("p", "u1")], Some(NODE))],
                    vec![pod("p", "u1", Some(NODE), "Running")],
                ),
                (Verdict::Blocked, 1, vec![]),
            ),
            (
                "consumer done: stale, not blocking",
                snapshot(
                    vec![claim("c", "gpu-1", &[("p", "u1")], Some(NODE))],
                    vec![pod("p", "u1", Some(NODE), "Succeeded")],
                ),
                (Verdict::Warnings, 0, vec!["StaleReservation".into()]),
            ),
            (
                "consumer gone",
                snapshot(
                    vec![claim("c", "gpu-1", &[("p", "u1")], Some(NODE))],
                    vec![],
                ),
                (Verdict::Warnings, 0, vec!["StaleReservation".into()]),
            ),
            (
                "not yet bound, allocated here",
                snapshot(
                    vec![claim("c", "gpu-1", &[("p", "u1")], Some(NODE))],
                    vec![pod("p", "u1", None, "Pending")],
                ),
                (Verdict::Blocked, 1, vec![]),
            ),
            (
                "claim on another node",
                snapshot(
                    vec![claim("c", "gpu-2", &[("p", "u1")], Some("gpu-2"))],
                    vec![pod("p", "u1", Some("gpu-2"), "Running")],
                ),
                (Verdict::Clean, 0, vec![]),
            ),
            (
                "allocation without selector, consumer bound here",
                snapshot(
                    vec![claim("c", "anywhere", &[("p", "u1")], None)],
                    vec![pod("p", "u1", Some(NODE), "Running")],
                ),
                (Verdict::Blocked, 1, vec![]),
            ),
            (
                "leaked on the node",
                snapshot(vec![claim("c", "gpu-1", &[], Some(NODE))], vec![]),
                (Verdict::Warnings, 0, vec!["LeakedAllocation".into()]),
            ),
        ];
        for (case, s, want) in rows {
            assert_eq!(verdict(&s), want, "{case}");
        }
    }

    #[test]
    fn driver_filter_and_lookups() {
        let s = snapshot(
            vec![claim(
                "c",
                "gpu-1",
                &[("p", "u1"), ("elsewhere", "u2")],
                Some(NODE),
            )],
            vec![pod("p", "u1", Some(NODE), "Running")],
        );
        let other = DrainScope {
            node: NODE,
            driver: Some("nic.example.com"),
        };
        assert_eq!(
            check(&s, other, Timestamp::UNIX_EPOCH).verdict,
            Verdict::Clean
        );
        let all = DrainScope {
            node: NODE,
            driver: None,
        };
        assert_eq!(
            pods_to_look_up(&s, all).into_iter().collect::<Vec<_>>(),
            vec![("ns".to_string(), "elsewhere".to_string())]
        );
        assert!(pods_to_look_up(&s, other).is_empty());
    }
}
