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
        status["containerStatuses"] =
            json!([{"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": at}}}]);
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

/// `--pod-selector`: of two pods on the node's devices, only the selected
/// one blocks; the other is kept, and its device gets no eviction rule
/// while the node's other devices (the free one included) get one each.
#[test]
fn a_pod_selector_evicts_only_the_devices_of_selected_pods() {
    let device_claim = |name: &str, device: &str, pod: (&str, &str)| {
        let mut c = serde_json::to_value(claim(name, "gpu-1", &[pod], Some(NODE))).unwrap();
        c["status"]["allocation"]["devices"]["results"][0]["device"] = json!(device);
        serde_json::from_value::<ResourceClaim>(c).unwrap()
    };
    let s = snapshot(
        vec![
            device_claim("web", "d0", ("web", "u-web")),
            device_claim("db", "d1", ("db", "u-db")),
        ],
        vec![
            pod("web", "u-web", Some(NODE), "Running"),
            pod("db", "u-db", Some(NODE), "Running"),
        ],
    );
    let now = "2026-11-23T12:00:00Z".parse().unwrap();
    let report = check(&s, DrainScope::new(NODE, None), now);
    assert_eq!(report.verdict, Verdict::Blocked);

    let selected = BTreeSet::from(["u-web".to_string()]);
    let report = report.keep_unselected(&selected);
    let subjects = |findings: &[crate::report::Finding]| -> Vec<String> {
        findings
            .iter()
            .map(|f| f.subject.as_ref().unwrap().name.clone())
            .collect()
    };
    assert_eq!(subjects(&report.blocking), ["web"]);
    assert_eq!(subjects(&report.kept), ["db"]);
    assert_eq!(report.verdict, Verdict::Blocked, "web still blocks");
    assert!(report.table().contains("KEPT"), "{}", report.table());

    let device = |name: &str| crate::report::DeviceRef {
        driver: "gpu.example.com".into(),
        pool: "gpu-1".into(),
        device: name.into(),
    };
    let on_node = [device("d0"), device("d1"), device("d2")];
    let eviction =
        crate::device_drain::selected_eviction(NODE, &on_node, &report.kept, &report.blocking);
    assert!(eviction.stuck.is_empty(), "{:?}", eviction.stuck);
    let evicted: Vec<_> = eviction
        .rules
        .iter()
        .map(|r| r.device.clone().unwrap())
        .collect();
    assert_eq!(evicted, ["d0", "d2"], "db's device d1 is only cordoned");
    assert_eq!(
        eviction.kept,
        std::collections::BTreeMap::from([(device("d1"), BTreeSet::from(["ns/db".to_string()]))])
    );
    let cordon_rule_of_d0 = crate::device_drain::rule_name(NODE, "gpu.example.com/gpu-1/d0");
    assert!(eviction.rules.iter().all(|r| r.name != cordon_rule_of_d0));

    // A selected pod sharing its only device with an unselected one: no
    // rule evicts it, and the drain says so.
    let shared = snapshot(
        vec![claim(
            "shared",
            "gpu-1",
            &[("web", "u-web"), ("db", "u-db")],
            Some(NODE),
        )],
        vec![
            pod("web", "u-web", Some(NODE), "Running"),
            pod("db", "u-db", Some(NODE), "Running"),
        ],
    );
    let report = check(&shared, DrainScope::new(NODE, None), now).keep_unselected(&selected);
    let eviction =
        crate::device_drain::selected_eviction(NODE, &on_node, &report.kept, &report.blocking);
    assert_eq!(
        eviction.stuck,
        std::collections::BTreeMap::from([("ns/web".to_string(), BTreeSet::from([device("d0")]))])
    );

    // web gone: nothing selected blocks, the verdict is Clean, db kept.
    let s = snapshot(
        vec![device_claim("db", "d1", ("db", "u-db"))],
        vec![pod("db", "u-db", Some(NODE), "Running")],
    );
    let report = check(&s, DrainScope::new(NODE, None), now).keep_unselected(&selected);
    assert_eq!(report.verdict, Verdict::Clean);
    assert_eq!(subjects(&report.kept), ["db"]);
    assert!(
        report.table().contains("the driver must stay for them"),
        "{}",
        report.table()
    );
}
