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

mod constraints;
mod pools;
mod refusals;
mod selectors;
mod solving;
mod taints;

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
    /// DeviceTaintRules, as kube-scheduler reads them.
    rules: Vec<crate::device_taints::TaintRule>,
}

impl Case {
    fn new(slices: Vec<ResourceSlice>, claim: ResourceClaim) -> Self {
        Case {
            slices,
            classes: vec![class("class-a", "driver-a"), class("class-b", "driver-b")],
            claim,
            in_use: Vec::new(),
            rules: Vec::new(),
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
        let inventory = node_inventory(NODE, &self.slices).with_rules(&self.rules);
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

fn attr_devices(list: &[(&str, Value)]) -> Value {
    json!(
        list.iter()
            .map(|(n, attrs)| json!({"name": n, "attributes": attrs}))
            .collect::<Vec<_>>()
    )
}
