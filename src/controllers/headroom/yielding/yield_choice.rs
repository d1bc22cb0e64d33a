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
pub(crate) struct WaitingPod<'a> {
    /// Its claims that are not allocated yet.
    pub claims: Vec<&'a ResourceClaim>,
    pub node_selector: BTreeMap<String, String>,
    pub required_affinity: Option<&'a NodeSelector>,
    pub tolerations: &'a [Toleration],
}

/// A device placeholder running on a node, and the devices its claim holds.
#[derive(Debug, Clone)]
pub(crate) struct Placeholder {
    /// `namespace/name` of the placeholder pod.
    pub pod: String,
    pub devices: Vec<DeviceId>,
}

/// A selected node as the yield sees it.
#[derive(Debug)]
pub(crate) struct CandidateNode<'a> {
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
pub(crate) struct Yield {
    pub node: String,
    /// `namespace/name` of the placeholders to delete.
    pub placeholders: Vec<String>,
}

/// Feature gates the allocation must respect (`--feature-gates`; the
/// allocator reads DRAAdminAccess and DRAPrioritizedList).
pub(crate) use crate::model::features::FeatureGates as Gates;

/// The fewest placeholders to release, on the first node (by name) that
/// needs the fewest; `None` when no node fits or the pod fits without a
/// yield (then the scheduler needs no help).
pub(crate) fn choose_yield(
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
pub(super) fn for_each_combination(n: usize, k: usize, visit: &mut dyn FnMut(&[usize]) -> bool) {
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
pub(crate) fn node_fits(pod: &WaitingPod<'_>, node: &CandidateNode<'_>) -> bool {
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
pub(crate) fn yield_spent_elsewhere(
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
pub(crate) fn gate_hold(
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
mod tests;
