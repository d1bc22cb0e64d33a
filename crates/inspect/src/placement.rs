//! Which node a claim's devices belong to.
//!
//! A device is tied to a node in one of three ways, all published in its
//! ResourceSlice: node-local (`spec.nodeName`), network-attached to the
//! nodes a selector matches (`spec.nodeSelector`), or usable everywhere
//! (`spec.allNodes`); with `perDeviceNodeSelection` each device says it
//! itself. The allocation repeats the outcome in `allocation.nodeSelector`.
//! Everything here is pure: node labels and slices come in as values.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceSlice};

/// What a node selector is matched against: the node's name (for
/// `matchFields: metadata.name`) and its labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl NodeFacts {
    /// A node known by name only (its Node object is gone or unreadable).
    pub(crate) fn named(name: &str) -> Self {
        NodeFacts {
            name: name.to_string(),
            labels: BTreeMap::new(),
        }
    }
}

/// Whether `selector` selects `node`: any term matches, and a term matches
/// when all its expressions and fields do. A selector without terms selects
/// nothing, as in the scheduler.
pub(crate) fn selector_matches(selector: &NodeSelector, node: &NodeFacts) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, node))
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeFacts) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            // The only field Kubernetes supports in node selectors.
            r.key == "metadata.name" && requirement_matches(r, Some(node.name.as_str()))
        })
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match (r.operator.as_str(), value) {
        ("In", Some(v)) => values.iter().any(|x| x == v),
        ("In", None) => false,
        ("NotIn", Some(v)) => !values.iter().any(|x| x == v),
        ("NotIn", None) => true,
        ("Exists", v) => v.is_some(),
        ("DoesNotExist", v) => v.is_none(),
        ("Gt" | "Lt", Some(v)) => {
            match (v.parse::<i64>(), values.first().map(|x| x.parse::<i64>())) {
                (Ok(have), Some(Ok(want))) if values.len() == 1 => {
                    if r.operator == "Gt" {
                        have > want
                    } else {
                        have < want
                    }
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// Where one device may be used, as its slice publishes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DevicePlacement {
    /// Node-local: prepared by the driver on this node only.
    Node(String),
    /// Network-attached: usable from the nodes the selector matches.
    Selector(NodeSelector),
    /// Usable from every node.
    AllNodes,
    /// No slice publishes this device any more (driver gone or pool
    /// replaced): only the allocation's node selector is left to go by.
    Unknown,
}

impl DevicePlacement {
    pub(crate) fn serves(&self, node: &NodeFacts) -> bool {
        match self {
            DevicePlacement::Node(name) => *name == node.name,
            DevicePlacement::Selector(selector) => selector_matches(selector, node),
            DevicePlacement::AllNodes | DevicePlacement::Unknown => false,
        }
    }
}

/// Where `driver`/`pool`/`device` lives: according to the newest
/// generation of its pool that publishes it (a pool being republished may
/// not list every device in its newest slices yet).
pub(crate) fn device_placement(
    slices: &[ResourceSlice],
    driver: &str,
    pool: &str,
    device: &str,
) -> DevicePlacement {
    let mut candidates: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.driver == driver && s.spec.pool.name == pool)
        .collect();
    candidates.sort_by_key(|s| std::cmp::Reverse(s.spec.pool.generation));
    for slice in candidates {
        let devices = slice.spec.devices.as_deref().unwrap_or_default();
        let Some(found) = devices.iter().find(|d| d.name == device) else {
            continue;
        };
        return if slice.spec.per_device_node_selection == Some(true) {
            placement_of(
                found.node_name.as_deref(),
                found.node_selector.as_ref(),
                found.all_nodes,
            )
        } else {
            placement_of(
                slice.spec.node_name.as_deref(),
                slice.spec.node_selector.as_ref(),
                slice.spec.all_nodes,
            )
        };
    }
    DevicePlacement::Unknown
}

fn placement_of(
    node_name: Option<&str>,
    node_selector: Option<&NodeSelector>,
    all_nodes: Option<bool>,
) -> DevicePlacement {
    match (
        node_name.filter(|n| !n.is_empty()),
        node_selector,
        all_nodes,
    ) {
        (Some(name), _, _) => DevicePlacement::Node(name.to_string()),
        (None, Some(selector), _) => DevicePlacement::Selector(selector.clone()),
        (None, None, Some(true)) => DevicePlacement::AllNodes,
        _ => DevicePlacement::Unknown,
    }
}

/// Whether an allocation holds devices that serve `node`: its own node
/// selector selects the node, or one of its devices (of `driver`, when
/// given) is published for the node.
pub(crate) fn allocation_serves(
    allocation: &AllocationResult,
    slices: &[ResourceSlice],
    node: &NodeFacts,
    driver: Option<&str>,
) -> bool {
    let results = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let mut results = results
        .iter()
        .filter(|r| driver.is_none_or(|d| r.driver == d))
        .peekable();
    if results.peek().is_none() {
        return false;
    }
    if allocation
        .node_selector
        .as_ref()
        .is_some_and(|s| selector_matches(s, node))
    {
        return true;
    }
    results.any(|r| device_placement(slices, &r.driver, &r.pool, &r.device).serves(node))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn selector(v: serde_json::Value) -> NodeSelector {
        serde_json::from_value(json!({ "nodeSelectorTerms": v })).unwrap()
    }

    #[test]
    fn node_selector_rows() {
        let n = node("gpu-1", &[("rack", "r1"), ("gen", "5")]);
        let rows = [
            (
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]),
                true,
            ),
            (
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-2"]}]}]),
                false,
            ),
            (
                json!([{"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["gpu-1"]}]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1", "r2"]}]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["r1"]}]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z"]}]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [{"key": "rack", "operator": "Exists"}]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [{"key": "rack", "operator": "DoesNotExist"}]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["4"]}]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["x"]}]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [{"key": "rack", "operator": "Bogus", "values": ["r1"]}]}]),
                false,
            ),
            // All requirements of a term, any term.
            (
                json!([{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}],
                     "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["other"]}]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r9"]}]},
                    {"matchExpressions": [{"key": "gen", "operator": "In", "values": ["5"]}]}]),
                true,
            ),
            (json!([{}]), false),
            (json!([]), false),
        ];
        for (terms, want) in rows {
            assert_eq!(
                selector_matches(&selector(terms.clone()), &n),
                want,
                "{terms}"
            );
        }
    }

    fn slice(
        driver: &str,
        pool: &str,
        generation: i64,
        where_: serde_json::Value,
        devices: &[&str],
    ) -> ResourceSlice {
        let mut spec = json!({
            "driver": driver,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            "devices": devices.iter().map(|d| json!({"name": d})).collect::<Vec<_>>(),
        });
        for (k, v) in where_.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(
            json!({"metadata": {"name": format!("{pool}-{generation}")}, "spec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn devices_are_placed_by_the_newest_generation_of_their_pool() {
        let slices = vec![
            slice(
                "gpu.example.com",
                "gpu-1",
                1,
                json!({"nodeName": "old-node"}),
                &["d0"],
            ),
            slice(
                "gpu.example.com",
                "gpu-1",
                2,
                json!({"nodeName": "gpu-1"}),
                &["d0", "d1"],
            ),
            slice(
                "nic.example.com",
                "fabric",
                1,
                json!({"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]}}),
                &["port0"],
            ),
            slice(
                "nic.example.com",
                "everywhere",
                1,
                json!({"allNodes": true}),
                &["x"],
            ),
        ];
        assert_eq!(
            device_placement(&slices, "gpu.example.com", "gpu-1", "d0"),
            DevicePlacement::Node("gpu-1".into())
        );
        assert_eq!(
            device_placement(&slices, "gpu.example.com", "gpu-1", "d9"),
            DevicePlacement::Unknown
        );
        // Only an older generation lists it: that one still says where.
        let republishing = vec![
            slice(
                "gpu.example.com",
                "gpu-1",
                1,
                json!({"nodeName": "gpu-1"}),
                &["d0", "d5"],
            ),
            slice(
                "gpu.example.com",
                "gpu-1",
                2,
                json!({"nodeName": "gpu-1"}),
                &["d0"],
            ),
        ];
        assert_eq!(
            device_placement(&republishing, "gpu.example.com", "gpu-1", "d5"),
            DevicePlacement::Node("gpu-1".into())
        );
        assert_eq!(
            device_placement(&slices, "other.example.com", "gpu-1", "d0"),
            DevicePlacement::Unknown
        );
        assert_eq!(
            device_placement(&slices, "nic.example.com", "everywhere", "x"),
            DevicePlacement::AllNodes
        );
        let fabric = device_placement(&slices, "nic.example.com", "fabric", "port0");
        assert!(fabric.serves(&node("n7", &[("rack", "r1")])));
        assert!(!fabric.serves(&node("n8", &[("rack", "r2")])));
        assert!(!DevicePlacement::AllNodes.serves(&node("n7", &[])));
    }

    #[test]
    fn per_device_node_selection() {
        let s: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "s"},
            "spec": {"driver": "d", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                     "perDeviceNodeSelection": true,
                     "devices": [{"name": "a", "nodeName": "n1"}, {"name": "b", "allNodes": true}]}
        }))
        .unwrap();
        let slices = [s];
        assert_eq!(
            device_placement(&slices, "d", "p", "a"),
            DevicePlacement::Node("n1".into())
        );
        assert_eq!(
            device_placement(&slices, "d", "p", "b"),
            DevicePlacement::AllNodes
        );
    }

    #[test]
    fn allocations_serve_nodes_through_their_selector_or_their_devices() {
        let slices = vec![
            slice(
                "gpu.example.com",
                "gpu-1",
                1,
                json!({"nodeName": "gpu-1"}),
                &["d0"],
            ),
            slice(
                "nic.example.com",
                "fabric",
                1,
                json!({"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]}}),
                &["port0"],
            ),
        ];
        let alloc = |results: serde_json::Value, sel: serde_json::Value| -> AllocationResult {
            let mut a = json!({"devices": {"results": results}});
            if !sel.is_null() {
                a["nodeSelector"] = sel;
            }
            serde_json::from_value(a).unwrap()
        };
        let gpu =
            json!([{"request": "r", "driver": "gpu.example.com", "pool": "gpu-1", "device": "d0"}]);
        let nic = json!([{"request": "r", "driver": "nic.example.com", "pool": "fabric", "device": "port0"}]);
        let by_name = json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]});
        let gpu1 = node("gpu-1", &[]);
        let rack1 = node("n7", &[("rack", "r1")]);
        // The scheduler's selector names the node.
        assert!(allocation_serves(
            &alloc(gpu.clone(), by_name.clone()),
            &[],
            &gpu1,
            None
        ));
        // No selector in the allocation: the slice says where the device lives.
        assert!(allocation_serves(
            &alloc(gpu.clone(), json!(null)),
            &slices,
            &gpu1,
            None
        ));
        assert!(!allocation_serves(
            &alloc(gpu.clone(), json!(null)),
            &slices,
            &rack1,
            None
        ));
        // Network-attached: every node the slice's selector matches.
        assert!(allocation_serves(
            &alloc(nic.clone(), json!(null)),
            &slices,
            &rack1,
            None
        ));
        // Restricted to one driver.
        assert!(!allocation_serves(
            &alloc(gpu.clone(), by_name.clone()),
            &slices,
            &gpu1,
            Some("nic.example.com")
        ));
        assert!(allocation_serves(
            &alloc(gpu, by_name),
            &slices,
            &gpu1,
            Some("gpu.example.com")
        ));
        assert!(!allocation_serves(
            &alloc(json!([]), json!(null)),
            &slices,
            &gpu1,
            None
        ));
    }
}
