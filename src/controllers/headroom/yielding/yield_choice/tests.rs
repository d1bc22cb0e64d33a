//! Decision table of the yield: which placeholders release their devices
//! for a pod waiting for them, and when new placeholders stay gated.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelector, Taint, Toleration};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};

use super::*;
use crate::allocate::Inventory;
use crate::allocate::node_inventory;
use crate::model::DeviceId;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{Value, json};

const DRIVER: &str = "gpu.example.com";

fn classes() -> BTreeMap<String, Arc<DeviceClass>> {
    let c: DeviceClass = serde_json::from_value(json!({"metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}}))
    .unwrap();
    BTreeMap::from([("gpu".to_string(), Arc::new(c))])
}

fn slice(node: &str, devices: usize) -> ResourceSlice {
    let devices: Vec<Value> = (0..devices)
        .map(|i| json!({"name": format!("g{i}")}))
        .collect();
    serde_json::from_value(json!({"metadata": {"name": node}, "spec": {
        "driver": DRIVER, "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices}}))
    .unwrap()
}

fn claim(count: u32) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {
            "deviceClassName": "gpu", "allocationMode": "ExactCount", "count": count}}]}}}))
    .unwrap()
}

fn dev(node: &str, i: usize) -> DeviceId {
    DeviceId {
        driver: DRIVER.into(),
        pool: node.into(),
        device: format!("g{i}"),
    }
}

/// A node of `devices` devices; `placeholders[j]` holds those devices
/// (by index), `workload` devices are held by others.
struct Node {
    name: &'static str,
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    inventory: Inventory,
    in_use: HashSet<DeviceId>,
    placeholders: Vec<Placeholder>,
}

fn node(name: &'static str, devices: usize, placeholders: &[&[usize]], workload: &[usize]) -> Node {
    let mut in_use = HashSet::new();
    let placeholders = placeholders
        .iter()
        .enumerate()
        .map(|(j, held)| {
            let devices: Vec<DeviceId> = held.iter().map(|&i| dev(name, i)).collect();
            in_use.extend(devices.iter().cloned());
            Placeholder {
                pod: format!("headroom/{name}-p{j}"),
                devices,
            }
        })
        .collect();
    in_use.extend(workload.iter().map(|&i| dev(name, i)));
    Node {
        name,
        labels: BTreeMap::from([("kubernetes.io/hostname".to_string(), name.to_string())]),
        taints: Vec::new(),
        inventory: node_inventory(name, &[slice(name, devices)]),
        in_use,
        placeholders,
    }
}

fn candidates(nodes: &[Node]) -> Vec<CandidateNode<'_>> {
    nodes
        .iter()
        .map(|n| CandidateNode {
            name: n.name,
            labels: &n.labels,
            taints: &n.taints,
            inventory: &n.inventory,
            in_use: &n.in_use,
            placeholders: n.placeholders.clone(),
        })
        .collect()
}

const GATES: Gates = Gates {
    admin_access: true,
    prioritized_list: true,
    extended_resource: true,
    workload_resource_claims: false,
    generic_workload: false,
    device_taints: true,
    device_taint_rules: false,
    resource_pool_status: false,
    release: crate::model::features::Release::V1_36,
};

fn choose(claims: &[&ResourceClaim], nodes: &[Node], selector: &[(&str, &str)]) -> Option<Yield> {
    let pod = WaitingPod {
        claims: claims.to_vec(),
        node_selector: selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..WaitingPod::default()
    };
    choose_yield(&pod, &candidates(nodes), &classes(), GATES)
}

fn yielded(node: &str, pods: &[&str]) -> Option<Yield> {
    Some(Yield {
        node: node.into(),
        placeholders: pods.iter().map(|p| format!("headroom/{p}")).collect(),
    })
}

#[test]
fn fewest_placeholders_on_one_node() {
    let two = claim(2);
    let two: &[&ResourceClaim] = &[&two];
    // (name, nodes, the pod's claims, the yield wanted)
    type Row<'a> = (&'a str, Vec<Node>, &'a [&'a ResourceClaim], Option<Yield>);
    let rows: Vec<Row<'_>> = vec![
        (
            "one placeholder holding two devices beats two holding one",
            vec![node("n1", 4, &[&[0], &[1], &[2, 3]], &[])],
            two,
            yielded("n1", &["n1-p2"]),
        ),
        (
            "the node needing fewer wins over the first by name",
            vec![
                node("n1", 2, &[&[0], &[1]], &[]),
                node("n2", 2, &[&[0, 1]], &[]),
            ],
            two,
            yielded("n2", &["n2-p0"]),
        ),
        (
            "devices spread over two nodes do not add up",
            vec![node("n1", 2, &[&[0]], &[1]), node("n2", 2, &[&[0]], &[1])],
            two,
            None,
        ),
        (
            "a free device plus one placeholder",
            vec![node("n1", 3, &[&[0], &[1]], &[])],
            two,
            yielded("n1", &["n1-p0"]),
        ),
        (
            "it fits without help: nothing yields",
            vec![node("n1", 4, &[&[0]], &[])],
            two,
            None,
        ),
        (
            "workload devices are never freed",
            vec![node("n1", 2, &[], &[0, 1])],
            two,
            None,
        ),
    ];
    for (name, nodes, claims, want) in rows {
        assert_eq!(choose(claims, &nodes, &[]), want, "{name}");
    }
    let one = claim(1);
    let nodes = vec![node("n1", 2, &[&[0], &[1]], &[])];
    assert_eq!(
        choose(&[&one, &one], &nodes, &[]),
        yielded("n1", &["n1-p0", "n1-p1"]),
        "two claims of one device each"
    );
}

#[test]
fn node_selector_affinity_and_taints() {
    let one = claim(1);
    let full = || vec![node("n1", 1, &[&[0]], &[]), node("n2", 1, &[&[0]], &[])];
    assert_eq!(
        choose(&[&one], &full(), &[("kubernetes.io/hostname", "n2")]),
        yielded("n2", &["n2-p0"]),
        "node selector"
    );
    assert_eq!(
        choose(&[&one], &full(), &[("kubernetes.io/hostname", "n9")]),
        None,
        "no node matches the selector"
    );

    let mut tainted = full();
    tainted[0].taints = vec![Taint {
        key: "gpu".into(),
        value: Some("busy".into()),
        effect: "NoSchedule".into(),
        ..Taint::default()
    }];
    assert_eq!(
        choose(&[&one], &tainted, &[]),
        yielded("n2", &["n2-p0"]),
        "taint skips n1"
    );
    let tolerations = [Toleration {
        key: Some("gpu".into()),
        operator: Some("Equal".into()),
        value: Some("busy".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    }];
    let pod = WaitingPod {
        claims: vec![&one],
        tolerations: &tolerations,
        ..WaitingPod::default()
    };
    assert_eq!(
        choose_yield(&pod, &candidates(&tainted), &classes(), GATES),
        yielded("n1", &["n1-p0"]),
        "tolerated taint"
    );

    let affinity: NodeSelector = serde_json::from_value(json!({"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}]}]}))
    .unwrap();
    let pod = WaitingPod {
        claims: vec![&one],
        required_affinity: Some(&affinity),
        ..WaitingPod::default()
    };
    assert_eq!(
        choose_yield(&pod, &candidates(&full()), &classes(), GATES),
        yielded("n2", &["n2-p0"]),
        "required node affinity"
    );
}

#[test]
fn combinations_are_visited_in_order() {
    let mut seen = Vec::new();
    for_each_combination(4, 2, &mut |idx| {
        seen.push(idx.to_vec());
        false
    });
    assert_eq!(
        seen,
        [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]].map(|a| a.to_vec())
    );
}

#[test]
fn gates_stay_while_a_yield_is_in_flight() {
    use std::time::Duration;
    let hold = Duration::from_secs(30);
    let s = Duration::from_secs;
    // (case, per yield: time since it and whether its pod waits, hold)
    type Row = (&'static str, Vec<(Duration, bool)>, Option<Duration>);
    let rows: [Row; 5] = [
        ("no yield", vec![], None),
        ("the pod still waits", vec![(s(10), true)], Some(s(20))),
        ("the pod bound (or went)", vec![(s(1), false)], None),
        ("the hold ran out", vec![(s(30), true)], None),
        (
            "the longest wait counts",
            vec![(s(25), true), (s(5), true), (s(1), false)],
            Some(s(25)),
        ),
    ];
    for (case, promises, want) in rows {
        assert_eq!(gate_hold(promises, hold), want, "{case}");
    }
}

#[test]
fn a_yield_is_spent_when_others_hold_all_it_freed() {
    let d = |n: &str| DeviceId::taken_by("gpu.example.com", "gpu-1", n, None, None).unwrap();
    let set = |names: &[&str]| names.iter().map(|n| d(n)).collect::<HashSet<_>>();
    let rows = [
        ("still free", set(&["a"]), set(&["b"]), false),
        ("taken by another pod", set(&["a"]), set(&["a", "b"]), true),
        ("one of two taken", set(&["a", "b"]), set(&["a"]), false),
        ("both taken", set(&["a", "b"]), set(&["a", "b", "c"]), true),
        ("nothing freed", set(&[]), set(&["a"]), false),
    ];
    for (case, freed, held, want) in rows {
        assert_eq!(yield_spent_elsewhere(&freed, &held), want, "{case}");
    }
}
