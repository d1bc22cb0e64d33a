//! The yield: which device placeholders to release so that a pod waiting
//! for devices binds, since kube-scheduler cannot preempt for devices. The
//! fewest placeholders on **one** node whose devices, counted as free, make
//! every claim of the pod allocatable there (the pure allocator decides);
//! the node must pass the pod's node selector, required node affinity and
//! taints. Nothing when no single node would fit the pod.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, Taint, Toleration};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};

use crate::allocate::{AllocationInput, Inventory, Outcome, allocate, devices_taken};
use crate::model::DeviceId;

/// Placeholders on one node considered together at most; past this the
/// search takes them in order of devices held (largest first) instead of
/// trying every combination.
const EXHAUSTIVE_UP_TO: usize = 12;

/// What the waiting pod asks of a node.
#[derive(Debug, Default)]
pub struct WaitingPod<'a> {
    /// Its claims that are not allocated yet.
    pub claims: Vec<&'a ResourceClaim>,
    pub node_selector: BTreeMap<String, String>,
    pub required_affinity: Option<&'a NodeSelector>,
    pub tolerations: &'a [Toleration],
}

/// A device placeholder running on a node, and the devices its claim holds.
#[derive(Debug, Clone)]
pub struct Placeholder {
    /// `namespace/name` of the placeholder pod.
    pub pod: String,
    pub devices: Vec<DeviceId>,
}

/// A selected node as the yield sees it.
#[derive(Debug)]
pub struct CandidateNode<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub taints: &'a [Taint],
    pub inventory: &'a Inventory,
    /// Devices allocated to any claim.
    pub in_use: &'a HashSet<DeviceId>,
    pub placeholders: Vec<Placeholder>,
}

/// The chosen yield.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Yield {
    pub node: String,
    /// `namespace/name` of the placeholders to delete.
    pub placeholders: Vec<String>,
}

/// Feature gates the allocation must respect (`--feature-gates`; the
/// allocator reads DRAAdminAccess and DRAPrioritizedList).
pub use crate::model::features::FeatureGates as Gates;

/// The fewest placeholders to release, on the first node (by name) that
/// needs the fewest; `None` when no node fits or the pod fits without a
/// yield (then the scheduler needs no help).
pub fn choose_yield(
    pod: &WaitingPod<'_>,
    nodes: &[CandidateNode<'_>],
    classes: &BTreeMap<String, Arc<DeviceClass>>,
    gates: Gates,
) -> Option<Yield> {
    let mut best: Option<Yield> = None;
    let mut ordered: Vec<&CandidateNode<'_>> = nodes.iter().collect();
    ordered.sort_by_key(|n| n.name);
    for node in ordered {
        if !node_fits(pod, node) {
            continue;
        }
        let limit = best
            .as_ref()
            .map_or(node.placeholders.len(), |b| b.placeholders.len() - 1);
        if let Some(chosen) = fewest_on_node(pod, node, classes, gates, limit) {
            if chosen.is_empty() {
                // It fits already: nothing to yield anywhere.
                return None;
            }
            best = Some(Yield {
                node: node.name.to_string(),
                placeholders: chosen,
            });
        }
    }
    best
}

/// The fewest placeholders (at most `limit`) of `node` whose release lets
/// every claim of the pod allocate there; `Some(vec![])` if none is needed.
fn fewest_on_node(
    pod: &WaitingPod<'_>,
    node: &CandidateNode<'_>,
    classes: &BTreeMap<String, Arc<DeviceClass>>,
    gates: Gates,
    limit: usize,
) -> Option<Vec<String>> {
    let fits = |released: &[&Placeholder]| {
        let mut in_use = node.in_use.clone();
        for p in released {
            for d in &p.devices {
                in_use.remove(d);
            }
        }
        allocates(pod, node, classes, gates, in_use)
    };
    if fits(&[]) {
        return Some(Vec::new());
    }
    let mut placeholders: Vec<&Placeholder> = node.placeholders.iter().collect();
    placeholders.sort_by(|a, b| {
        b.devices
            .len()
            .cmp(&a.devices.len())
            .then(a.pod.cmp(&b.pod))
    });
    let names = |set: &[&Placeholder]| set.iter().map(|p| p.pod.clone()).collect::<Vec<_>>();
    if placeholders.len() > EXHAUSTIVE_UP_TO {
        // Largest first, one at a time.
        for k in 1..=limit.min(placeholders.len()) {
            if fits(&placeholders[..k]) {
                return Some(names(&placeholders[..k]));
            }
        }
        return None;
    }
    for k in 1..=limit.min(placeholders.len()) {
        let mut found = None;
        for_each_combination(placeholders.len(), k, &mut |idx| {
            let set: Vec<&Placeholder> = idx.iter().map(|&i| placeholders[i]).collect();
            if fits(&set) {
                found = Some(names(&set));
                return true;
            }
            false
        });
        if found.is_some() {
            return found;
        }
    }
    None
}

/// Calls `visit` with each k-subset of `0..n` in lexicographic order until
/// it returns true.
fn for_each_combination(n: usize, k: usize, visit: &mut dyn FnMut(&[usize]) -> bool) {
    let mut idx: Vec<usize> = (0..k).collect();
    loop {
        if visit(&idx) {
            return;
        }
        // Advance the rightmost index that can move.
        let Some(i) = (0..k).rev().find(|&i| idx[i] < n - k + i) else {
            return;
        };
        idx[i] += 1;
        for j in i + 1..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
}

/// Whether every claim allocates on the node with `in_use` taken, one
/// after the other (each result taking its devices).
fn allocates(
    pod: &WaitingPod<'_>,
    node: &CandidateNode<'_>,
    classes: &BTreeMap<String, Arc<DeviceClass>>,
    gates: Gates,
    mut in_use: HashSet<DeviceId>,
) -> bool {
    for claim in &pod.claims {
        let outcome = allocate(&AllocationInput {
            claim,
            classes,
            node: node.name,
            inventory: node.inventory,
            in_use: &in_use,
            admin_access_enabled: gates.admin_access,
            prioritized_list_enabled: gates.prioritized_list,
        });
        match outcome {
            Outcome::Allocated(result) => in_use.extend(devices_taken(&result)),
            Outcome::Unsatisfiable(_) | Outcome::Refused(_) => return false,
        }
    }
    true
}

/// The pod's node selector, required node affinity and taints against the
/// node, as kube-scheduler's filters judge them.
pub fn node_fits(pod: &WaitingPod<'_>, node: &CandidateNode<'_>) -> bool {
    let selector = pod
        .node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    let affinity = pod.required_affinity.is_none_or(|required| {
        required.node_selector_terms.iter().any(|term| {
            term.match_expressions
                .iter()
                .flatten()
                .all(|e| requirement_holds(e, node.labels.get(&e.key).map(String::as_str)))
                && term
                    .match_fields
                    .iter()
                    .flatten()
                    .all(|e| e.key == "metadata.name" && requirement_holds(e, Some(node.name)))
        })
    });
    let tolerated = node
        .taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| pod.tolerations.iter().any(|tol| tolerates(tol, t)));
    selector && affinity && tolerated
}

fn requirement_holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v < x)
        }
        _ => false,
    }
}

fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    let effect = tol.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    match tol.operator.as_deref().unwrap_or("Equal") {
        "Exists" => tol
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == taint.key),
        _ => {
            tol.key.as_deref() == Some(taint.key.as_str())
                && tol.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    }
}

/// Whether the devices a yield `freed` all went to someone else: each is
/// held again by a claim other than the released placeholders' own. Then
/// the pod it was made for needs another (the scheduler gave them to
/// whichever waiting pod came first).
pub fn yield_spent_elsewhere(
    freed: &HashSet<DeviceId>,
    held_by_others: &HashSet<DeviceId>,
) -> bool {
    !freed.is_empty() && freed.is_subset(held_by_others)
}

/// How much longer new placeholders stay gated: while a pod that
/// placeholders yielded to within `hold` still waits, its freed devices
/// are its own, so no placeholder may compete for them. `promises`: per
/// yield, the time since it and whether its pod still waits (exists with
/// the same UID, unbound, not deleting). `None`: lift the gates now.
pub fn gate_hold(
    promises: impl IntoIterator<Item = (std::time::Duration, bool)>,
    hold: std::time::Duration,
) -> Option<std::time::Duration> {
    promises
        .into_iter()
        .filter(|(since, waits)| *waits && *since < hold)
        .map(|(since, _)| hold - since)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocate::node_inventory;
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

    fn node(
        name: &'static str,
        devices: usize,
        placeholders: &[&[usize]],
        workload: &[usize],
    ) -> Node {
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
    };

    fn choose(
        claims: &[&ResourceClaim],
        nodes: &[Node],
        selector: &[(&str, &str)],
    ) -> Option<Yield> {
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
}
