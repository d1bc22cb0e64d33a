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

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;

use super::placement::allocation_serves;
use super::report::{ClaimRef, DrainCheckReport, Finding};
use super::snapshot::{Snapshot, claim_ref, devices, named_pods};
use dra_model::classify::{ClaimFacts, PodRef, PodState, pod_consumers, problems};
use dra_model::views::PodView;

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

/// What a pod bound to the node means for its devices now.
enum NodePod {
    /// May run: its allocated claims are in use.
    Running,
    /// Containers finished this long ago, within the grace period.
    Finishing(Duration),
    /// Done long enough ago, or no sign of its containers: not holding.
    Idle,
}

fn node_pod_state(pod: &PodView, scope: DrainScope<'_>, now: Timestamp) -> NodePod {
    if !pod.is_done() {
        return NodePod::Running;
    }
    let Some(finished) = &pod.status.containers_finished_at else {
        return NodePod::Idle;
    };
    let ago: Duration = now
        .duration_since(finished.0)
        .try_into()
        .unwrap_or_default();
    if ago < scope.finished_grace {
        NodePod::Finishing(ago)
    } else {
        NodePod::Idle
    }
}

/// Pods bound to the node, with what they mean now (idle ones left out).
fn node_pods<'s>(
    snapshot: &'s Snapshot,
    scope: DrainScope<'_>,
    now: Timestamp,
) -> Vec<(&'s PodView, NodePod)> {
    let mut pods: Vec<(&PodView, NodePod)> = snapshot
        .pods
        .values()
        .filter(|p| p.node_name() == Some(scope.node))
        .map(|p| (&**p, node_pod_state(p, scope, now)))
        .filter(|(_, state)| !matches!(state, NodePod::Idle))
        .collect();
    pods.sort_by_key(|(p, _)| (p.namespace().to_string(), p.name().to_string()));
    pods
}

/// Claims the node's running or finishing pods name that the snapshot
/// lacks: the reader fetches each (absent afterwards = no such claim).
pub(crate) fn claims_to_look_up(
    snapshot: &Snapshot,
    scope: DrainScope<'_>,
    now: Timestamp,
) -> BTreeSet<(String, String)> {
    let have = snapshot.claims_by_key();
    node_pods(snapshot, scope, now)
        .into_iter()
        .flat_map(|(pod, _)| {
            pod.claim_names()
                .into_iter()
                .map(move |name| (pod.namespace(), name))
        })
        .filter(|key| !have.contains_key(key))
        .map(|(ns, name)| (ns.to_string(), name.to_string()))
        .collect()
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
mod tests {
    use super::*;
    use crate::placement::NodeFacts;
    use crate::report::{DrainCheckReport, Verdict};
    use dra_model::views::PodView;
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
            DrainScope::new(NODE, None),
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

    /// A pod bound to the node naming `claims` (recorded statuses), with
    /// containers that finished at `finished` when given.
    fn node_pod(name: &str, phase: &str, claims: &[&str], finished: Option<&str>) -> PodView {
        let statuses: Vec<Value> = claims
            .iter()
            .map(|c| json!({"name": c, "resourceClaimName": c}))
            .collect();
        let mut status = json!({"phase": phase, "resourceClaimStatuses": statuses});
        if let Some(at) = finished {
            status["containerStatuses"] = json!([{"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": at}}}]);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid")},
            "spec": {"nodeName": NODE}, "status": status}))
        .unwrap()
    }

    fn kinds(r: &DrainCheckReport) -> (Vec<String>, Vec<String>) {
        (
            r.blocking.iter().map(|f| f.kind.clone()).collect(),
            r.warnings.iter().map(|f| f.kind.clone()).collect(),
        )
    }

    const NOW: &str = "2026-11-23T12:00:00Z";

    #[test]
    fn the_node_pods_own_claims_block() {
        // Allocated for a pod group, a network-attached device (no node
        // selector naming this node): only the pod's side shows the use.
        let group: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "group-claim", "namespace": "ns"}, "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": "nic.example.com", "pool": "fabric", "device": "p0"}]}},
                       "reservedFor": [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "g", "uid": "g1"}]}}))
        .unwrap();
        let s = snapshot(
            vec![group],
            vec![node_pod("member", "Running", &["group-claim"], None)],
        );
        let r = check(&s, DrainScope::new(NODE, None), NOW.parse().unwrap());
        assert_eq!(r.verdict, Verdict::Blocked);
        assert_eq!(kinds(&r), (vec!["InUse".into()], vec![]));
        assert_eq!(r.blocking[0].claim.name, "group-claim");
        // Reserved for the pod as well: reported once, not twice.
        let s = snapshot(
            vec![claim("c", "gpu-1", &[("member", "member-uid")], Some(NODE))],
            vec![node_pod("member", "Running", &["c"], None)],
        );
        let r = check(&s, DrainScope::new(NODE, None), NOW.parse().unwrap());
        assert_eq!(kinds(&r), (vec!["InUse".into()], vec![]));
        // A claim the pod names that is not in the snapshot is fetched.
        let s = snapshot(vec![], vec![node_pod("member", "Running", &["late"], None)]);
        assert_eq!(
            claims_to_look_up(&s, DrainScope::new(NODE, None), NOW.parse().unwrap())
                .into_iter()
                .collect::<Vec<_>>(),
            vec![("ns".to_string(), "late".to_string())]
        );
    }

    /// A headroom placeholder (the watermark label) holding a device on the
    /// node is listed as such and never blocks; a workload pod beside it
    /// still does. Named as a placeholder whether found through the claim's
    /// reservation or from the pod's side only.
    #[test]
    fn placeholders_are_named_and_never_block() {
        let mut placeholder = node_pod("pool-gpu-x", "Running", &["held"], None);
        placeholder.metadata.labels = Some(
            [(
                dra_model::naming::WATERMARK_LABEL.to_string(),
                "pool".to_string(),
            )]
            .into(),
        );
        let reserved = claim(
            "held",
            "gpu-1",
            &[("pool-gpu-x", "pool-gpu-x-uid")],
            Some(NODE),
        );
        let s = snapshot(vec![reserved.clone()], vec![placeholder.clone()]);
        let r = check(&s, DrainScope::new(NODE, None), NOW.parse().unwrap());
        assert_eq!(r.verdict, Verdict::Clean);
        assert_eq!(kinds(&r), (vec![], vec![]));
        assert_eq!(r.placeholders.len(), 1, "{r:?}");
        let subject = r.placeholders[0].subject.as_ref().unwrap();
        assert_eq!(subject.placeholder_of.as_deref(), Some("pool"));
        assert!(r.placeholders[0].action.contains("safe to evict"));
        assert!(
            r.table().contains("pool-gpu-x (placeholder of pool)"),
            "{}",
            r.table()
        );

        // Only the pod's side: the claim is not reserved for it (yet; the
        // allocated, unreserved claim is a warning of its own).
        let unreserved = claim("held", "gpu-1", &[], Some(NODE));
        let s = snapshot(vec![unreserved], vec![placeholder.clone()]);
        let r = check(&s, DrainScope::new(NODE, None), NOW.parse().unwrap());
        assert_eq!(kinds(&r), (vec![], vec!["LeakedAllocation".to_string()]));
        assert_eq!(r.placeholders.len(), 1);

        // A workload beside it blocks as before.
        let s = snapshot(
            vec![
                reserved,
                claim("work", "gpu-1", &[("job", "job-uid")], Some(NODE)),
            ],
            vec![placeholder, node_pod("job", "Running", &["work"], None)],
        );
        let r = check(&s, DrainScope::new(NODE, None), NOW.parse().unwrap());
        assert_eq!(r.verdict, Verdict::Blocked);
        assert_eq!(kinds(&r).0, vec!["InUse".to_string()]);
        assert_eq!(r.blocking[0].claim.name, "work");
        assert_eq!(r.placeholders.len(), 1);
    }

    #[test]
    fn pods_that_finished_moments_ago_still_block() {
        let scope = DrainScope::new(NODE, None);
        let rows = [
            (
                "finished 10s ago, claim already gone",
                Some("2026-11-23T11:59:50Z"),
                vec!["Finishing".to_string()],
            ),
            ("finished 5m ago", Some("2026-11-23T11:55:00Z"), vec![]),
            ("no container statuses (no kubelet)", None, vec![]),
        ];
        for (case, finished, want) in rows {
            let s = snapshot(
                vec![],
                vec![node_pod("done", "Succeeded", &["gone-claim"], finished)],
            );
            let r = check(&s, scope, NOW.parse().unwrap());
            assert_eq!(kinds(&r).0, want, "{case}");
        }
        // Another driver's claim, still showing its devices: no concern.
        let s = snapshot(
            vec![claim("c", "gpu-1", &[], Some(NODE))],
            vec![node_pod(
                "done",
                "Succeeded",
                &["c"],
                Some("2026-11-23T11:59:50Z"),
            )],
        );
        let nic = DrainScope::new(NODE, Some("nic.example.com"));
        assert!(check(&s, nic, NOW.parse().unwrap()).blocking.is_empty());
    }

    #[test]
    fn unknown_names_are_not_clean() {
        let empty = Snapshot::default();
        let typo = unknown_target(&empty, DrainScope::new("gpu-l", None)).unwrap();
        assert!(typo.contains("\"gpu-l\" not found"), "{typo}");
        let known = snapshot(vec![claim("c", "gpu-1", &[], Some(NODE))], vec![]);
        assert!(unknown_target(&known, DrainScope::new(NODE, None)).is_none());
        assert!(unknown_target(&known, DrainScope::new(NODE, Some("gpu.example.com"))).is_none());
        let driver = unknown_target(&known, DrainScope::new(NODE, Some("gpu.example.co"))).unwrap();
        assert!(driver.contains("gpu.example.co"), "{driver}");
        // A Node object that is gone, with a pod still bound to it: known.
        let orphan = Snapshot {
            nodes: Default::default(),
            ..snapshot(vec![], vec![pod("p", "u", Some(NODE), "Running")])
        };
        assert!(unknown_target(&orphan, DrainScope::new(NODE, None)).is_none());
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
        let other = DrainScope::new(NODE, Some("nic.example.com"));
        assert_eq!(
            check(&s, other, Timestamp::UNIX_EPOCH).verdict,
            Verdict::Clean
        );
        let all = DrainScope::new(NODE, None);
        assert_eq!(
            pods_to_look_up(&s, all).into_iter().collect::<Vec<_>>(),
            vec![("ns".to_string(), "elsewhere".to_string())]
        );
        assert!(pods_to_look_up(&s, other).is_empty());
    }
}
