//! The classifier against tables of claims and the pods they name: each
//! row gives the problems the claim should show.

use super::*;
use serde_json::{Value, json};
use std::collections::HashMap;

const NOW: &str = "2026-11-23T12:00:00Z";

fn pod(name: &str, uid: &str, node: Option<&str>, phase: &str, deleting: bool) -> PodView {
    let mut meta = json!({"name": name, "namespace": "ns", "uid": uid});
    if deleting {
        meta["deletionTimestamp"] = json!("2026-11-23T11:59:00Z");
    }
    serde_json::from_value(json!({
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }))
    .unwrap()
}

fn claim(extra: Value) -> ResourceClaim {
    let mut c = json!({"metadata": {"name": "c", "namespace": "ns", "uid": "cu"}, "spec": {}});
    merge(&mut c, extra);
    serde_json::from_value(c).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn kinds(claim: &ResourceClaim, pods: &[PodView]) -> Vec<ProblemKind> {
    let by_name: HashMap<String, Arc<PodView>> = pods
        .iter()
        .map(|p| (p.name().to_string(), Arc::new(p.clone())))
        .collect();
    let lookup = |name: &str| by_name.get(name).cloned();
    problems(&claim.into(), &lookup, NOW.parse().unwrap())
        .iter()
        .map(Problem::kind)
        .collect()
}

fn reserved(name: &str, uid: &str) -> Value {
    json!({"status": {"allocation": {}, "reservedFor": [{"resource": "pods", "name": name, "uid": uid}]}})
}

fn owned_by(name: &str, uid: &str) -> Value {
    json!({"metadata": {
        "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": true}]}})
}

#[test]
fn pod_states() {
    let running = pod("p", "u1", Some("n1"), "Running", false);
    assert_eq!(
        PodState::of(Some(&running), "u1"),
        PodState::Active {
            node: Some("n1".into()),
            terminating: false
        }
    );
    assert_eq!(PodState::of(Some(&running), "u2"), PodState::Replaced);
    assert_eq!(PodState::of(None, "u1"), PodState::Gone);
    let terminating = pod("p", "u1", Some("n1"), "Running", true);
    assert_eq!(
        PodState::of(Some(&terminating), "u1").describe(),
        "Terminating"
    );
    let never_scheduled = pod("p", "u1", None, "Pending", true);
    assert!(!PodState::of(Some(&never_scheduled), "u1").is_active());
    let done = pod("p", "u1", Some("n1"), "Succeeded", false);
    assert_eq!(PodState::of(Some(&done), "u1").describe(), "Succeeded");
    let pending = pod("p", "u1", None, "Pending", false);
    assert_eq!(PodState::of(Some(&pending), "u1").describe(), "Pending");
}

#[test]
fn reservations() {
    use ProblemKind::*;
    let c = claim(reserved("p", "u1"));
    let rows: [(&str, Vec<PodView>, Vec<ProblemKind>); 6] = [
        (
            "running consumer",
            vec![pod("p", "u1", Some("n"), "Running", false)],
            vec![],
        ),
        (
            "terminating consumer",
            vec![pod("p", "u1", Some("n"), "Running", true)],
            vec![],
        ),
        (
            "pending consumer",
            vec![pod("p", "u1", None, "Pending", false)],
            vec![],
        ),
        ("consumer gone", vec![], vec![StaleReservation]),
        (
            "consumer replaced",
            vec![pod("p", "u2", Some("n"), "Running", false)],
            vec![StaleReservation],
        ),
        (
            "consumer done",
            vec![pod("p", "u1", Some("n"), "Failed", false)],
            vec![StaleReservation],
        ),
    ];
    for (case, pods, want) in rows {
        assert_eq!(kinds(&c, &pods), want, "{case}");
    }
    let podgroup = claim(json!({"status": {"allocation": {}, "reservedFor": [
        {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "g", "uid": "gu"}]}}));
    assert_eq!(kinds(&podgroup, &[]), vec![UnverifiableConsumer]);
}

#[test]
fn leaks_and_orphans() {
    use ProblemKind::*;
    let allocated = json!({"status": {"allocation": {}}});
    let mut generated_allocated = owned_by("p", "u1");
    merge(&mut generated_allocated, allocated.clone());
    let rows: [(&str, ResourceClaim, Vec<PodView>, Vec<ProblemKind>); 9] = [
        ("unallocated user claim", claim(json!({})), vec![], vec![]),
        (
            "allocated user claim, no consumer",
            claim(allocated.clone()),
            vec![],
            vec![LeakedAllocation],
        ),
        (
            "generated, owner running, allocated ahead of reservation",
            claim(generated_allocated.clone()),
            vec![pod("p", "u1", Some("n"), "Running", false)],
            vec![],
        ),
        (
            "generated, owner gone, allocated",
            claim(generated_allocated.clone()),
            vec![],
            vec![OrphanedGenerated, LeakedAllocation],
        ),
        (
            "generated, owner done, not allocated",
            claim(owned_by("p", "u1")),
            vec![pod("p", "u1", Some("n"), "Succeeded", false)],
            vec![OrphanedGenerated],
        ),
        (
            "generated, owner replaced",
            claim(owned_by("p", "u1")),
            vec![pod("p", "u2", Some("n"), "Running", false)],
            vec![OrphanedGenerated],
        ),
        (
            "generated, owner running",
            claim(owned_by("p", "u1")),
            vec![pod("p", "u1", Some("n"), "Running", false)],
            vec![],
        ),
        (
            "owned by another kind: not ours to judge",
            claim(json!({
            "metadata": {"ownerReferences": [{"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
                                              "name": "g", "uid": "g1", "controller": true}]},
            "status": {"allocation": {}}})),
            vec![],
            vec![],
        ),
        (
            "done owner, still reserved",
            claim({
                let mut v = owned_by("p", "u1");
                merge(&mut v, reserved("p", "u1"));
                v
            }),
            vec![pod("p", "u1", Some("n"), "Succeeded", false)],
            vec![StaleReservation, OrphanedGenerated],
        ),
    ];
    for (case, c, pods, want) in rows {
        assert_eq!(kinds(&c, &pods), want, "{case}");
    }
}

#[test]
fn deletions() {
    use ProblemKind::*;
    let deleting = |at: &str, finalizer: bool| {
        let mut v = json!({"metadata": {"deletionTimestamp": at}, "status": {"allocation": {}}});
        if finalizer {
            v["metadata"]["finalizers"] = json!(["resource.kubernetes.io/delete-protection"]);
        }
        claim(v)
    };
    assert_eq!(
        kinds(&deleting("2026-11-23T11:50:00Z", true), &[]),
        vec![StuckDeleting]
    );
    assert_eq!(
        kinds(&deleting("2026-11-23T11:59:30Z", true), &[]),
        vec![],
        "within a minute"
    );
    assert_eq!(
        kinds(&deleting("2026-11-23T11:50:00Z", false), &[]),
        vec![],
        "other finalizers are not ours"
    );
    let facts: ResourceClaim = deleting("2026-11-23T11:50:00Z", true);
    let found = problems(&(&facts).into(), &|_| None, NOW.parse().unwrap());
    assert_eq!(
        found,
        vec![Problem::StuckDeleting {
            deleted_for: Duration::from_secs(600)
        }]
    );
}

#[test]
fn claim_views_give_the_same_facts() {
    let full = claim({
        let mut v = owned_by("p", "u1");
        merge(&mut v, reserved("p", "u1"));
        merge(
            &mut v,
            json!({"metadata": {"finalizers": ["resource.kubernetes.io/delete-protection"]}}),
        );
        v
    });
    let view: ClaimView = serde_json::from_value(serde_json::to_value(&full).unwrap()).unwrap();
    let (a, b) = (ClaimFacts::from(&full), ClaimFacts::from(&view));
    assert_eq!(
        (
            a.namespace,
            a.name,
            a.allocated,
            a.reserved_for,
            a.owners,
            a.generated,
            a.delete_protected
        ),
        (
            b.namespace,
            b.name,
            b.allocated,
            b.reserved_for,
            b.owners,
            b.generated,
            b.delete_protected
        )
    );
    assert!(a.generated && a.allocated && a.delete_protected);
}
