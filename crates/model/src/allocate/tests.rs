//! The allocator's decision table. Rows are named after the cases of
//! kube-scheduler's allocator test suite (`structured/internal/allocatortesting`)
//! they mirror, with the same set-up and the same expected outcome.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

use super::allocator::{AllocationInput, Outcome, allocate};
use super::inventory::node_inventory;
use crate::DeviceId;

const NODE: &str = "node-1";

fn slice_on(
    name: &str,
    node: &str,
    pool: &str,
    driver: &str,
    generation: i64,
    count: i64,
    devices: Value,
) -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "driver": driver, "nodeName": node,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        }
    }))
    .unwrap()
}

/// A slice of pool-1 of driver-a with the given generation and slice count.
fn gen_slice(name: &str, node: &str, generation: i64, count: i64, names: &[&str]) -> ResourceSlice {
    slice_on(
        name,
        node,
        "pool-1",
        "driver-a",
        generation,
        count,
        devices(names),
    )
}

/// A slice for all nodes (not node-local).
fn all_nodes_slice(driver: &str) -> ResourceSlice {
    let mut network = slice("slice-n", "pool-n", driver, devices(&["device-9"]));
    network.spec.node_name = None;
    network.spec.all_nodes = Some(true);
    network
}

fn slice(name: &str, pool: &str, driver: &str, devices: Value) -> ResourceSlice {
    slice_on(name, NODE, pool, driver, 1, 1, devices)
}

/// The node's one slice: `devices` of driver-a in pool-1.
fn on_node(devices: Value) -> Vec<ResourceSlice> {
    vec![slice("slice-1", "pool-1", "driver-a", devices)]
}

/// The simplest node: one device of driver-a in pool-1.
fn one_device() -> Vec<ResourceSlice> {
    on_node(devices(&["device-1"]))
}

/// A claim with one request `req-0` of class-a (count 1, plus `extra`).
fn one_request(extra: Value) -> ResourceClaim {
    claim(json!({"requests": [exactly("req-0", "class-a", extra)]}))
}

/// A `firstAvailable` subrequest of `count` devices of `class`.
fn sub(name: &str, class: &str, count: u32) -> Value {
    json!({"name": name, "deviceClassName": class, "allocationMode": "ExactCount", "count": count})
}

fn devices(names: &[&str]) -> Value {
    json!(names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>())
}

fn class(name: &str, driver: &str) -> DeviceClass {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]}
    }))
    .unwrap()
}

fn claim(devices: Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "claim-0", "namespace": "default"},
        "spec": {"devices": devices}
    }))
    .unwrap()
}

fn exactly(name: &str, class: &str, extra: Value) -> Value {
    let mut e = json!({"deviceClassName": class, "allocationMode": "ExactCount", "count": 1});
    for (k, v) in extra.as_object().unwrap() {
        e[k] = v.clone();
    }
    json!({"name": name, "exactly": e})
}

struct Case {
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    claim: ResourceClaim,
    in_use: Vec<(&'static str, &'static str, &'static str)>,
}

impl Case {
    fn new(slices: Vec<ResourceSlice>, claim: ResourceClaim) -> Self {
        Case {
            slices,
            classes: vec![class("class-a", "driver-a"), class("class-b", "driver-b")],
            claim,
            in_use: Vec::new(),
        }
    }

    fn run(&self) -> Outcome {
        let classes: BTreeMap<String, Arc<DeviceClass>> = self
            .classes
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), Arc::new(c.clone())))
            .collect();
        let in_use: HashSet<DeviceId> = self
            .in_use
            .iter()
            .map(|(d, p, n)| DeviceId {
                driver: d.to_string(),
                pool: p.to_string(),
                device: n.to_string(),
            })
            .collect();
        let inventory = node_inventory(NODE, &self.slices);
        allocate(&AllocationInput {
            claim: &self.claim,
            classes: &classes,
            node: NODE,
            inventory: &inventory,
            in_use: &in_use,
            admin_access_enabled: true,
            prioritized_list_enabled: true,
        })
    }

    /// `(request, pool, device)` of each result, in order; panics unless allocated.
    fn devices(&self) -> Vec<(String, String, String)> {
        match self.run() {
            Outcome::Allocated(result) => result
                .devices
                .unwrap()
                .results
                .unwrap()
                .into_iter()
                .map(|r| (r.request, r.pool, r.device))
                .collect(),
            other => panic!("expected an allocation, got {other:?}"),
        }
    }

    fn allocation(&self) -> Value {
        match self.run() {
            Outcome::Allocated(result) => serde_json::to_value(result).unwrap(),
            other => panic!("expected an allocation, got {other:?}"),
        }
    }

    fn unsatisfiable(&self) -> String {
        match self.run() {
            Outcome::Unsatisfiable(why) => why,
            other => panic!("expected unsatisfiable, got {other:?}"),
        }
    }

    /// Unsatisfiable for the reason `because` names (a part of the
    /// message): a row that ends unsatisfiable for another reason fails.
    fn unsatisfiable_because(&self, because: &str) {
        let why = self.unsatisfiable();
        assert!(
            why.contains(because),
            "expected a reason with {because:?}, got {why:?}"
        );
    }

    fn refused(&self) -> String {
        match self.run() {
            Outcome::Refused(why) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

fn picked(list: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    list.iter()
        .map(|(r, p, d)| (r.to_string(), p.to_string(), d.to_string()))
        .collect()
}

fn mem_devices(list: &[(&str, &str)]) -> Value {
    json!(
        list.iter()
            .map(|(n, m)| json!({"name": n, "capacity": {"memory": {"value": m}}}))
            .collect::<Vec<_>>()
    )
}

fn mem_selector(min: &str) -> Value {
    json!({"selectors": [{"cel": {"expression":
        format!("device.capacity[\"driver-a\"].memory.compareTo(quantity(\"{min}\")) >= 0")}}]})
}

#[test]
fn simple() {
    let case = Case::new(one_device(), one_request(json!({})));
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-1")]));
    let result = case.allocation();
    assert_eq!(
        result["nodeSelector"],
        json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]})
    );
    assert_eq!(result["devices"]["results"][0]["driver"], "driver-a");
    assert!(result["devices"]["results"][0].get("adminAccess").is_none());
}

#[test]
fn other_node() {
    // Only slices of the node itself count.
    let case = Case::new(
        vec![slice_on(
            "slice-2",
            "node-2",
            "pool-2",
            "driver-a",
            1,
            1,
            devices(&["device-1"]),
        )],
        one_request(json!({})),
    );
    let why = case.unsatisfiable();
    assert!(why.contains("0 devices on node node-1"), "{why}");
    assert!(
        why.contains("publishes no node-local ResourceSlices"),
        "{why}"
    );
}

#[test]
fn network_attached_device_is_never_used() {
    let mut network: ResourceSlice = slice("slice-n", "pool-n", "driver-a", devices(&["device-1"]));
    network.spec.node_name = None;
    network.spec.node_selector = Some(
        serde_json::from_value(json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "region", "operator": "In", "values": ["region-1"]}]}]}))
        .unwrap(),
    );
    let mut all_nodes = slice("slice-all", "pool-all", "driver-a", devices(&["device-2"]));
    all_nodes.spec.node_name = None;
    all_nodes.spec.all_nodes = Some(true);
    let case = Case::new(vec![network, all_nodes], one_request(json!({})));
    case.unsatisfiable_because("publishes no node-local ResourceSlices; network-attached and allNodes devices are never used");
}

#[test]
fn small_and_large_backtrack_requests() {
    // The first request's first fit is the large device; backtracking gives
    // it the small one so that the second request gets the large one.
    let case = Case::new(
        on_node(mem_devices(&[("device-2", "2Gi"), ("device-1", "1Gi")])),
        claim(json!({"requests": [
            exactly("req-0", "class-a", mem_selector("1Gi")),
            exactly("req-1", "class-a", mem_selector("2Gi")),
        ]})),
    );
    assert_eq!(
        case.devices(),
        picked(&[
            ("req-0", "pool-1", "device-1"),
            ("req-1", "pool-1", "device-2")
        ])
    );
}

#[test]
fn devices_split_across_different_slices() {
    let case = Case::new(
        vec![
            slice("slice-1", "pool-1", "driver-a", devices(&["device-1"])),
            slice("slice-2", "pool-2", "driver-a", devices(&["device-1"])),
        ],
        one_request(json!({"count": 2})),
    );
    assert_eq!(
        case.devices(),
        picked(&[
            ("req-0", "pool-1", "device-1"),
            ("req-0", "pool-2", "device-1")
        ])
    );
}

#[test]
fn obsolete_slice() {
    // Generation 2 replaces generation 1, and alone it is incomplete.
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 2, &["device-1"]),
            gen_slice("slice-2", NODE, 2, 2, &["device-2"]),
        ],
        one_request(json!({})),
    );
    let why = case.unsatisfiable();
    assert!(
        why.contains("pool driver-a/pool-1 is currently being updated"),
        "{why}"
    );
}

#[test]
fn newest_generation_wins() {
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 1, &["device-old"]),
            gen_slice("slice-2", NODE, 2, 1, &["device-new"]),
        ],
        one_request(json!({})),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-new")]));
}

#[test]
fn multi_host_resource_pool_with_stale_slice_for_current_node() {
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 2, &["device-1"]),
            gen_slice("slice-2", "node-2", 2, 2, &["device-2"]),
        ],
        one_request(json!({})),
    );
    case.unsatisfiable_because("node node-1 publishes no node-local ResourceSlices");
}

#[test]
fn allocation_mode_all_with_multi_host_resource_pool() {
    // The pool is complete counting the other node's slice; only this
    // node's device is taken.
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 2, &["device-1"]),
            gen_slice("slice-2", "node-2", 1, 2, &["device-2"]),
        ],
        one_request(json!({"allocationMode": "All"})),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-1")]));
}

#[test]
fn duplicate_slice() {
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 2, &["device-1"]),
            gen_slice("slice-2", NODE, 1, 2, &["device-1"]),
        ],
        one_request(json!({})),
    );
    let why = case.unsatisfiable();
    assert!(
        why.contains("pool driver-a/pool-1 is currently invalid"),
        "{why}"
    );
}

#[test]
fn invalid_pool_is_ok_if_devices_can_be_allocated_from_other() {
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 2, &["device-1"]),
            gen_slice("slice-2", NODE, 1, 2, &["device-1"]),
            slice("slice-3", "pool-2", "driver-a", devices(&["device-2"])),
        ],
        one_request(json!({})),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-2", "device-2")]));
}

#[test]
fn no_allocation_from_incomplete_pools() {
    let case = Case::new(
        vec![gen_slice("slice-1", NODE, 1, 2, &["device-1", "device-2"])],
        one_request(json!({"count": 2})),
    );
    case.unsatisfiable_because("pool driver-a/pool-1 is currently being updated and was not used");
}

#[test]
fn all_devices_of_the_incomplete_pool() {
    let case = Case::new(
        vec![gen_slice("slice-1", NODE, 1, 2, &["device-1"])],
        one_request(json!({"allocationMode": "All"})),
    );
    assert_eq!(
        case.refused(),
        "claim default/claim-0, request req-0: asks for all devices, but resource pool driver-a/pool-1 \
         is currently being updated"
    );
}

#[test]
fn all_devices_many() {
    let case = Case::new(
        vec![
            slice("slice-1", "pool-1", "driver-a", devices(&["device-1"])),
            slice("slice-2", "pool-2", "driver-a", devices(&["device-1"])),
        ],
        one_request(json!({"allocationMode": "All"})),
    );
    assert_eq!(case.devices().len(), 2);
}

#[test]
fn all_devices_some_allocated() {
    let mut case = Case::new(
        on_node(devices(&["device-1", "device-2"])),
        one_request(json!({"allocationMode": "All"})),
    );
    case.in_use = vec![("driver-a", "pool-1", "device-1")];
    let why = case.unsatisfiable();
    assert!(why.contains("1 allocated to other claims"), "{why}");
}

#[test]
fn all_devices_no_slices() {
    let case = Case::new(Vec::new(), one_request(json!({"allocationMode": "All"})));
    case.unsatisfiable_because("0 devices on node node-1, 0 free, all 0 needed");
}

#[test]
fn all_devices_no_solution() {
    // One device; a count-1 request takes it, so All has nothing usable.
    let case = Case::new(
        one_device(),
        claim(json!({"requests": [
            exactly("req-0", "class-a", json!({})),
            exactly("req-1", "class-a", json!({"allocationMode": "All"})),
        ]})),
    );
    case.unsatisfiable_because("not enough devices for all requests together");
}

#[test]
fn all_devices_some_allocated_prioritized_list() {
    let mut case = Case::new(
        vec![
            slice(
                "slice-1",
                "pool-1",
                "driver-a",
                devices(&["device-1", "device-2"]),
            ),
            slice("slice-2", "pool-2", "driver-b", devices(&["device-1"])),
        ],
        claim(json!({"requests": [{"name": "req-0", "firstAvailable": [
            {"name": "subReq-0", "deviceClassName": "class-a", "allocationMode": "All"},
            sub("subReq-1", "class-b", 1),
        ]}]})),
    );
    case.in_use = vec![("driver-a", "pool-1", "device-1")];
    assert_eq!(
        case.devices(),
        picked(&[("req-0/subReq-1", "pool-2", "device-1")])
    );
}

#[test]
fn already_allocated_devices() {
    let mut case = Case::new(one_device(), one_request(json!({})));
    case.in_use = vec![("driver-a", "pool-1", "device-1")];
    let why = case.unsatisfiable();
    assert_eq!(
        why,
        "request req-0: 1 devices on node node-1, 1 allocated to other claims, 0 free, 1 needed"
    );
}

#[test]
fn not_enough_suitable_devices_message_counts_every_reason() {
    let mut case = Case::new(
        vec![
            slice(
                "slice-1",
                "pool-1",
                "driver-a",
                devices(&["device-1", "device-2", "device-3"]),
            ),
            slice("slice-2", "pool-2", "driver-b", devices(&["device-1"])),
        ],
        one_request(json!({"count": 3})),
    );
    case.in_use = vec![("driver-a", "pool-1", "device-2")];
    assert_eq!(
        case.unsatisfiable(),
        "request req-0: 4 devices on node node-1, 1 rejected by class class-a, 1 allocated to other \
         claims, 2 free, 3 needed"
    );
}

#[test]
fn admin_access_enabled() {
    let mut case = Case::new(one_device(), one_request(json!({"adminAccess": true})));
    case.in_use = vec![("driver-a", "pool-1", "device-1")];
    let result = case.allocation();
    assert_eq!(result["devices"]["results"][0]["device"], "device-1");
    assert_eq!(result["devices"]["results"][0]["adminAccess"], true);
}

#[test]
fn all_devices_some_allocating_admin_access() {
    // An admin request cannot take a device its own claim already took.
    let case = Case::new(
        one_device(),
        claim(json!({"requests": [
            exactly("req-0", "class-a", json!({"adminAccess": true})),
            exactly("req-1", "class-a", json!({"adminAccess": true, "allocationMode": "All"})),
        ]})),
    );
    case.unsatisfiable_because("not enough devices for all requests together");
}

#[test]
fn admin_access_disabled() {
    let case = Case::new(one_device(), one_request(json!({"adminAccess": true})));
    let classes: BTreeMap<String, Arc<DeviceClass>> = [(
        "class-a".to_string(),
        Arc::new(class("class-a", "driver-a")),
    )]
    .into();
    let inventory = node_inventory(NODE, &case.slices);
    let outcome = allocate(&AllocationInput {
        claim: &case.claim,
        classes: &classes,
        node: NODE,
        inventory: &inventory,
        in_use: &HashSet::new(),
        admin_access_enabled: false,
        prioritized_list_enabled: true,
    });
    assert!(
        matches!(outcome, Outcome::Refused(ref why) if why.contains("DRAAdminAccess")),
        "{outcome:?}"
    );
}

fn attr_devices(list: &[(&str, Value)]) -> Value {
    json!(
        list.iter()
            .map(|(n, attrs)| json!({"name": n, "attributes": attrs}))
            .collect::<Vec<_>>()
    )
}

#[test]
fn with_constraint() {
    let case = Case::new(
        on_node(attr_devices(&[
            (
                "device-1",
                json!({"numa": {"int": 1}, "model": {"string": "a"}, "driverVersion": {"version": "1.0.0"}, "fast": {"bool": true}}),
            ),
            (
                "device-2",
                json!({"numa": {"int": 1}, "model": {"string": "a"}, "driverVersion": {"version": "1.0.0"}, "fast": {"bool": true}}),
            ),
        ])),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({})), exactly("req-1", "class-a", json!({}))],
            "constraints": [
                {"matchAttribute": "driver-a/numa"}, {"matchAttribute": "driver-a/model"},
                {"matchAttribute": "driver-a/driverVersion"}, {"matchAttribute": "driver-a/fast"},
            ],
        })),
    );
    assert_eq!(
        case.devices(),
        picked(&[
            ("req-0", "pool-1", "device-1"),
            ("req-1", "pool-1", "device-2")
        ])
    );
}

#[test]
fn with_constraint_not_matching_int_attribute() {
    let case = Case::new(
        on_node(attr_devices(&[
            ("device-1", json!({"numa": {"int": 1}})),
            ("device-2", json!({"numa": {"int": 2}})),
        ])),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({"count": 2}))],
            "constraints": [{"matchAttribute": "driver-a/numa"}],
        })),
    );
    let why = case.unsatisfiable();
    assert!(
        why.contains("no set of free devices has equal values of driver-a/numa"),
        "{why}"
    );
}

#[test]
fn with_constraint_non_existent_attribute() {
    let case = Case::new(
        one_device(),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({}))],
            "constraints": [{"matchAttribute": "driver-a/numa"}],
        })),
    );
    case.unsatisfiable_because("no set of free devices has equal values of driver-a/numa");
}

#[test]
fn with_constraint_for_request_retry() {
    // The string constraint covers both requests: device-1 ("a") cannot pair
    // with the others ("b"), so the search moves req-0 to device-2.
    let case = Case::new(
        on_node(attr_devices(&[
            (
                "device-1",
                json!({"stringAttribute": {"string": "a"}, "driverVersion": {"version": "1.0.0"}}),
            ),
            (
                "device-2",
                json!({"stringAttribute": {"string": "b"}, "driverVersion": {"version": "1.0.0"}}),
            ),
            (
                "device-3",
                json!({"stringAttribute": {"string": "b"}, "driverVersion": {"version": "2.0.0"}}),
            ),
        ])),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({})), exactly("req-1", "class-a", json!({}))],
            "constraints": [
                {"requests": ["req-0"], "matchAttribute": "driver-a/driverVersion"},
                {"matchAttribute": "driver-a/stringAttribute"},
            ],
        })),
    );
    assert_eq!(
        case.devices(),
        picked(&[
            ("req-0", "pool-1", "device-2"),
            ("req-1", "pool-1", "device-3")
        ])
    );
}

#[test]
fn with_constraint_not_matching_int_attribute_all_devices() {
    let case = Case::new(
        on_node(attr_devices(&[
            ("device-1", json!({"numa": {"int": 1}})),
            ("device-2", json!({"numa": {"int": 2}})),
        ])),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({"allocationMode": "All"}))],
            "constraints": [{"matchAttribute": "driver-a/numa"}],
        })),
    );
    let why = case.refused();
    assert!(
        why.contains("cannot add device driver-a/pool-1/device-2 because a claim constraint"),
        "{why}"
    );
}

#[test]
fn distinct_attribute_is_refused() {
    let case = Case::new(
        one_device(),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({}))],
            "constraints": [{"distinctAttribute": "driver-a/numa"}],
        })),
    );
    assert!(case.refused().contains("distinctAttribute"));
}

#[test]
fn with_class_device_config_with_multiple_request_and_configs() {
    let mut case = Case::new(
        vec![
            slice(
                "slice-1",
                "pool-1",
                "driver-a",
                devices(&["device-0", "device-1"]),
            ),
            slice("slice-2", "pool-2", "driver-b", devices(&["device-1"])),
        ],
        claim(json!({
            "requests": [
                exactly("req-0", "class-a", json!({})),
                exactly("req-1", "class-a", json!({})),
                exactly("req-2", "class-b", json!({})),
            ],
            "config": [
                {"opaque": {"driver": "driver-a", "parameters": {"claim": "all"}}},
                {"requests": ["req-2"], "opaque": {"driver": "driver-b", "parameters": {"claim": "b"}}},
            ],
        })),
    );
    let with_config = |name: &str, driver: &str| -> DeviceClass {
        let mut c = class(name, driver);
        c.spec.as_mut().unwrap().config = Some(
            serde_json::from_value(
                json!([{"opaque": {"driver": driver, "parameters": {"class": name}}}]),
            )
            .unwrap(),
        );
        c
    };
    case.classes = vec![
        with_config("class-a", "driver-a"),
        with_config("class-b", "driver-b"),
    ];
    let result = case.allocation();
    assert_eq!(
        result["devices"]["config"],
        json!([
            {"source": "FromClass", "requests": ["req-0", "req-1"], "opaque": {"driver": "driver-a", "parameters": {"class": "class-a"}}},
            {"source": "FromClass", "requests": ["req-2"], "opaque": {"driver": "driver-b", "parameters": {"class": "class-b"}}},
            {"source": "FromClaim", "opaque": {"driver": "driver-a", "parameters": {"claim": "all"}}},
            {"source": "FromClaim", "requests": ["req-2"], "opaque": {"driver": "driver-b", "parameters": {"claim": "b"}}},
        ])
    );
}

#[test]
fn prioritized_list_first_unavailable() {
    let case = Case::new(
        one_device(),
        claim(json!({"requests": [{"name": "req-0", "firstAvailable": [
            sub("subReq-0", "class-b", 1),
            sub("subReq-1", "class-a", 1),
        ]}]})),
    );
    assert_eq!(
        case.devices(),
        picked(&[("req-0/subReq-1", "pool-1", "device-1")])
    );
}

#[test]
fn prioritized_list_device_config() {
    let case = Case::new(
        one_device(),
        claim(json!({
            "requests": [{"name": "req-0", "firstAvailable": [
                sub("subReq-0", "class-b", 1),
                sub("subReq-1", "class-a", 1),
            ]}],
            "config": [
                {"requests": ["req-0/subReq-0"], "opaque": {"driver": "driver-b", "parameters": {"n": 0}}},
                {"requests": ["req-0/subReq-1"], "opaque": {"driver": "driver-a", "parameters": {"n": 1}}},
            ],
        })),
    );
    assert_eq!(
        case.allocation()["devices"]["config"],
        json!([{"source": "FromClaim", "requests": ["req-0/subReq-1"], "opaque": {"driver": "driver-a", "parameters": {"n": 1}}}])
    );
}

#[test]
fn prioritized_list_with_backtracking() {
    // req-0's first choice takes the 8Gi device req-1 needs: back to its
    // second subrequest.
    let case = Case::new(
        on_node(mem_devices(&[("device-1", "8Gi"), ("device-2", "4Gi")])),
        claim(json!({"requests": [
            {"name": "req-0", "firstAvailable": [
                {"name": "subReq-0", "deviceClassName": "class-a", "allocationMode": "ExactCount", "count": 1,
                 "selectors": mem_selector("8Gi")["selectors"]},
                {"name": "subReq-1", "deviceClassName": "class-a", "allocationMode": "ExactCount", "count": 1,
                 "selectors": mem_selector("2Gi")["selectors"]},
            ]},
            exactly("req-1", "class-a", mem_selector("8Gi")),
        ]})),
    );
    assert_eq!(
        case.devices(),
        picked(&[
            ("req-0/subReq-1", "pool-1", "device-2"),
            ("req-1", "pool-1", "device-1")
        ])
    );
}

#[test]
fn prioritized_list_too_many_in_first_subrequest() {
    let case = Case::new(
        one_device(),
        claim(json!({"requests": [{"name": "req-0", "firstAvailable": [
            sub("subReq-0", "class-a", 500),
            sub("subReq-1", "class-a", 1),
        ]}]})),
    );
    assert_eq!(
        case.devices(),
        picked(&[("req-0/subReq-1", "pool-1", "device-1")])
    );
}

#[test]
fn too_many_devices_single_request() {
    let case = Case::new(one_device(), one_request(json!({"count": 500})));
    assert!(case.refused().contains("exceeds the claim limit of 32"));
}

fn tainted(list: &[(&str, &str, &str)]) -> Value {
    json!(list
        .iter()
        .map(|(n, value, effect)| json!({"name": n, "taints": [{"key": "taint-key", "value": value, "effect": effect}]}))
        .collect::<Vec<_>>())
}

#[test]
fn tainted_two_devices() {
    let case = Case::new(
        on_node(tainted(&[
            ("device-1", "taint-value", "NoSchedule"),
            ("device-2", "taint-value-2", "NoExecute"),
        ])),
        one_request(json!({})),
    );
    assert!(case.unsatisfiable().contains("2 tainted and not tolerated"));
}

#[test]
fn tainted_two_devices_tolerated() {
    let toleration = json!({"key": "taint-key", "operator": "Equal", "value": "taint-value-2", "effect": "NoExecute"});
    let case = Case::new(
        on_node(tainted(&[
            ("device-1", "taint-value", "NoSchedule"),
            ("device-2", "taint-value-2", "NoExecute"),
        ])),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"tolerations": [toleration]}))]}),
        ),
    );
    let result = case.allocation();
    assert_eq!(result["devices"]["results"][0]["device"], "device-2");
    assert_eq!(
        result["devices"]["results"][0]["tolerations"],
        json!([toleration])
    );
}

#[test]
fn tainted_no_effect() {
    let case = Case::new(
        on_node(tainted(&[("device-1", "v", "None")])),
        one_request(json!({})),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-1")]));
}

#[test]
fn tainted_admin_access() {
    // Admin access does not bypass taints.
    let case = Case::new(
        on_node(tainted(&[("device-1", "v", "NoSchedule")])),
        one_request(json!({"adminAccess": true})),
    );
    case.unsatisfiable_because("1 tainted and not tolerated, 0 free, 1 needed");
}

#[test]
fn tainted_one_device_two_taints_both_tolerated() {
    let case = Case::new(
        on_node(json!([{"name": "device-1", "taints": [
            {"key": "taint-key", "value": "taint-value", "effect": "NoSchedule"},
            {"key": "taint-key", "value": "taint-value-2", "effect": "NoExecute"},
        ]}])),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"tolerations": [
                {"key": "taint-key", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "taint-key", "operator": "Equal", "value": "taint-value-2", "effect": "NoExecute"},
            ]}))]}),
        ),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-1")]));
}

#[test]
fn invalid_cel_one_device() {
    let case = Case::new(
        one_device(),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"selectors": [{"cel": {"expression": "noSuchVar"}}]}))]}),
        ),
    );
    let why = case.refused();
    assert!(
        why.contains("claim default/claim-0: selector #0: CEL runtime error"),
        "{why}"
    );
    assert!(why.contains("noSuchVar"), "{why}");
}

#[test]
fn invalid_cel_one_device_class() {
    let mut case = Case::new(one_device(), one_request(json!({})));
    case.classes = vec![
        serde_json::from_value(json!({
            "metadata": {"name": "class-a"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]}
        }))
        .unwrap(),
    ];
    let why = case.refused();
    assert!(
        why.starts_with("class class-a: selector #0: CEL compile error"),
        "{why}"
    );
}

#[test]
fn unsupported_cel_function_is_named() {
    let case = Case::new(
        one_device(),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"selectors": [{"cel": {"expression":
            "sets.contains([1], [1]) && ip('10.0.0.1').family() == 4"}}]}))]}),
        ),
    );
    let why = case.refused();
    assert!(
        why.contains("does not support: family, ip, sets.contains"),
        "{why}"
    );
}

#[test]
fn unknown_class() {
    let case = Case::new(
        one_device(),
        claim(json!({"requests": [exactly("req-0", "unknown-class", json!({}))]})),
    );
    assert!(
        case.refused()
            .contains("DeviceClass unknown-class not found")
    );
}

#[test]
fn unknown_allocation_mode() {
    let case = Case::new(
        one_device(),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"allocationMode": "future-mode"}))]}),
        ),
    );
    assert!(
        case.refused()
            .contains("unsupported allocationMode future-mode")
    );
}

#[test]
fn partitionable_devices_are_refused_per_device() {
    let case = Case::new(
        on_node(json!([
            {"name": "device-1", "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "1Gi"}}}]},
            {"name": "device-2", "bindingConditions": ["attached"], "bindingFailureConditions": ["failed"]},
            {"name": "device-3", "allowMultipleAllocations": true},
            {"name": "device-4", "attributes": {"sizes": {"ints": [1, 2]}}},
        ])),
        one_request(json!({})),
    );
    let why = case.unsatisfiable();
    assert!(
        why.contains("4 use features this allocator does not support"),
        "{why}"
    );
    assert!(
        why.contains("driver-a/pool-1/device-1 consumes counters"),
        "{why}"
    );
}

#[test]
fn consumable_capacity_request_is_refused() {
    let case = Case::new(
        one_device(),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"capacity": {"requests": {"memory": "1Gi"}}}))]}),
        ),
    );
    assert!(case.refused().contains("consumable capacity"));
}

#[test]
fn selectors_see_the_dra_environment() {
    let dev = json!([{
        "name": "device-1",
        "attributes": {"model": {"string": "A100"}, "driverVersion": {"version": "12.4.0"},
                       "numa": {"int": 1}, "other.example.com/rack": {"string": "r1"}},
        "capacity": {"memory": {"value": "40Gi"}},
    }]);
    let accepted = [
        "device.attributes['driver-a'].model.lowerAscii() == 'a100'",
        "device.attributes['driver-a'].driverVersion.isGreaterThan(semver('12.0.0'))",
        "device.attributes['driver-a'].driverVersion.major() == 12",
        "device.capacity['driver-a'].memory.isGreaterThan(quantity('39Gi'))",
        "device.capacity['driver-a'].memory.asInteger() == 40 * 1024 * 1024 * 1024",
        "device.attributes['other.example.com'].rack == 'r1'",
        "!has(device.attributes['unknown.example.com'].x)",
        "!('x' in device.attributes['unknown.example.com'])",
        "cel.bind(a, device.attributes['driver-a'], a.numa == 1 && a.model.startsWith('A'))",
        "[1, 2, 3].isSorted() && 'a,b'.split(',').size() == 2",
        "[1, 2, 3].sum() == 6 && [3, 1, 2].min() == 1 && ['a', 'c'].max() == 'c'",
        "[quantity('1Gi'), device.capacity['driver-a'].memory].max().isGreaterThan(quantity('39Gi'))",
        "device.attributes['driver-a'].exists(k, k == 'numa')",
    ];
    for expression in accepted {
        let case = Case::new(
            on_node(dev.clone()),
            claim(
                json!({"requests": [exactly("req-0", "class-a", json!({"selectors": [{"cel": {"expression": expression}}]}))]}),
            ),
        );
        assert_eq!(case.devices().len(), 1, "{expression}");
    }
    let rejected = [
        "device.attributes['driver-a'].driverVersion.isLessThan(semver('12.0.0'))",
        "device.capacity['driver-a'].memory.compareTo(quantity('80Gi')) >= 0",
    ];
    for expression in rejected {
        let case = Case::new(
            on_node(dev.clone()),
            claim(
                json!({"requests": [exactly("req-0", "class-a", json!({"selectors": [{"cel": {"expression": expression}}]}))]}),
            ),
        );
        assert!(
            case.unsatisfiable()
                .contains("1 rejected by the request's selectors"),
            "{expression}"
        );
    }
}

#[test]
fn too_many_devices_total_across_subrequests() {
    // 16 + 17 results would exceed the claim's 32: the second request falls
    // back to its one-device subrequest.
    let names: Vec<String> = (0..40).map(|i| format!("device-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let case = Case::new(
        on_node(devices(&names)),
        claim(json!({"requests": [
            exactly("req-0", "class-a", json!({"count": 16})),
            {"name": "req-1", "firstAvailable": [
                sub("many", "class-a", 17),
                sub("one", "class-a", 1),
            ]},
        ]})),
    );
    let got = case.devices();
    assert_eq!(got.len(), 17);
    assert_eq!(got.last().unwrap().0, "req-1/one");
}

#[test]
fn selector_errors_on_devices_in_use_do_not_fail_the_claim() {
    // device-1 (in use) lacks the attribute the selector reads: kube-scheduler
    // never evaluates it, so neither may we.
    let mut case = Case::new(
        on_node(attr_devices(&[
            ("device-1", json!({})),
            ("device-2", json!({"model": {"string": "a"}})),
        ])),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"selectors": [
            {"cel": {"expression": "device.attributes['driver-a'].model == 'a'"}}]}))]}),
        ),
    );
    case.in_use = vec![("driver-a", "pool-1", "device-1")];
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-2")]));
}

#[test]
fn multi_host_resource_pool_complete_update_from_node_1_to_node_2() {
    // The node's own slices are complete at generation 1: used, as
    // kube-scheduler uses them, although another node publishes generation 2.
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 1, &["device-1"]),
            gen_slice("slice-2", "node-2", 2, 1, &["device-2"]),
        ],
        one_request(json!({})),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-1")]));
}

#[test]
fn all_devices_refused_when_a_network_attached_device_matches() {
    let all_on = |driver: &str| {
        Case::new(
            vec![
                slice("slice-1", "pool-1", "driver-a", devices(&["device-1"])),
                all_nodes_slice(driver),
            ],
            claim(
                json!({"requests": [exactly("req-0", "class-a", json!({"allocationMode": "All"}))]}),
            ),
        )
    };
    let why = all_on("driver-a").refused();
    assert!(
        why.contains("device driver-a/pool-n/device-9 of a pool that is not node-local"),
        "{why}"
    );
    // A class that matches only node-local devices is not affected.
    assert_eq!(all_on("driver-b").devices().len(), 1);
}

#[test]
fn with_constraint_not_matching_version_build_metadata() {
    // Versions are compared as written: build metadata makes them differ.
    let case = Case::new(
        on_node(attr_devices(&[
            ("device-1", json!({"driverVersion": {"version": "1.0.0+a"}})),
            ("device-2", json!({"driverVersion": {"version": "1.0.0+b"}})),
        ])),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({"count": 2}))],
            "constraints": [{"matchAttribute": "driver-a/driverVersion"}],
        })),
    );
    case.unsatisfiable_because("no set of free devices has equal values of driver-a/driverVersion");
}

/// Selectors a tenant may write, nested as deep as the API server lets
/// through (its CEL parser stops at 250 levels), allocated from a thread
/// with a tokio worker's 2 MiB stack (16 parentheses overflowed it in a
/// debug build): an answer, never a crash; deeper ones are refused.
#[test]
fn deeply_nested_tenant_selectors_are_harmless() {
    const DEPTH: usize = 240;
    let rows = [
        format!(
            "{}device.driver == 'driver-a'{}",
            "(".repeat(DEPTH),
            ")".repeat(DEPTH)
        ),
        format!("{}true", "!".repeat(DEPTH)),
        format!("size({}1{}) > 0", "[".repeat(DEPTH), "]".repeat(DEPTH)),
        vec!["device.driver == 'driver-a'"; DEPTH].join(" && "),
        format!(
            "{}device.driver == 'driver-a'{}",
            "(true && ".repeat(DEPTH),
            ")".repeat(DEPTH)
        ),
    ];
    let case_for = |expression: &str| {
        Case::new(
            one_device(),
            one_request(json!({"selectors": [{"cel": {"expression": expression}}]})),
        )
    };
    let outcomes = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let mut outcomes: Vec<_> = rows.iter().map(|e| case_for(e).run()).collect();
            let too_deep = format!("{}true{}", "(".repeat(251), ")".repeat(251));
            outcomes.push(case_for(&too_deep).run());
            outcomes
        })
        .unwrap()
        .join()
        .expect("allocating with nested selectors ended the thread");
    let refused = |i: usize, because: &str| match &outcomes[i] {
        Outcome::Refused(why) => assert!(why.contains(because), "row {i}: {why}"),
        other => panic!("row {i}: expected a refusal, got {other:?}"),
    };
    // Long chains and runs of `!` are evaluated; nesting past the CEL
    // parser's own limit (96) is refused with its message, past the API
    // server's (250) before parsing.
    for i in [1, 3] {
        assert!(
            matches!(outcomes[i], Outcome::Allocated(_)),
            "row {i}: {:?}",
            outcomes[i]
        );
    }
    for i in [0, 2, 4] {
        refused(i, "Recursion limit");
    }
    refused(5, "at most 250");
}

/// Solving never holds an async worker: on a runtime of one worker (the
/// chart's one CPU), a task keeps running while a claim is solved.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn solving_leaves_the_async_worker_to_other_tasks() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let ticks = Arc::new(AtomicU32::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    // Let the ticker start on the one worker.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let before = ticks.load(Ordering::Relaxed);
    // Solved from a task, as the controllers do: on the runtime's worker.
    tokio::spawn(async {
        super::on_solver_stack(|| std::thread::sleep(std::time::Duration::from_millis(300)))
            .unwrap()
    })
    .await
    .unwrap();
    let during = ticks.load(Ordering::Relaxed) - before;
    ticker.abort();
    assert!(
        during >= 10,
        "the other task ran {during} times in 300 ms of solving (every 10 ms when free)"
    );
}
