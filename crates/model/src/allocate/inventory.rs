//! The devices one node offers from its node-local ResourceSlices: only
//! slices with `spec.nodeName` set to the node (never network-attached or
//! `allNodes` pools, which kube-scheduler may hand to pods on other nodes),
//! only the newest generation of each pool, and only complete pools.
//!
//! Order is kube-scheduler's: pools by driver then name, slices by name,
//! devices as listed.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, DeviceTaint, ResourceSlice};

use super::quantity::Quantity;
use super::selector::{AttributeValue, DeviceFacts};
use super::semver::Version;
use crate::DeviceId;

/// One device of the node.
#[derive(Clone, Debug)]
pub struct NodeDevice {
    pub id: DeviceId,
    pub facts: DeviceFacts,
    pub taints: Vec<DeviceTaint>,
    /// Set when the device uses a feature this allocator does not
    /// implement; such a device is never picked.
    pub unsupported: Option<String>,
}

/// What a node offers.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    pub devices: Vec<NodeDevice>,
    /// `driver/pool` of node pools whose newest generation is not complete
    /// (the driver is publishing it).
    pub incomplete_pools: BTreeSet<String>,
    /// `driver/pool` of node pools that name a device twice.
    pub invalid_pools: BTreeSet<String>,
    /// Devices of pools that are not node-local (network-attached,
    /// `allNodes`, per-device node selection), which may be visible to the
    /// node too: never allocated here, but an `All` request that matches one
    /// must be refused rather than given fewer devices than the scheduler
    /// would give.
    pub foreign: Vec<NodeDevice>,
}

impl Inventory {
    /// The devices with the taints DeviceTaintRules put on them too, as
    /// kube-scheduler sees them: a rule's `NoSchedule` or `NoExecute` taint
    /// keeps a device from new claims unless they tolerate it.
    pub fn with_rules(mut self, rules: &[crate::device_taints::TaintRule]) -> Self {
        if rules.is_empty() {
            return self;
        }
        for device in self.devices.iter_mut() {
            let id = &device.id;
            device.taints.extend(
                rules
                    .iter()
                    .filter(|r| r.selects(&id.driver, &id.pool, &id.device))
                    .map(|r| r.taint.clone()),
            );
        }
        self
    }

    pub(crate) fn pool_problems(&self) -> impl Iterator<Item = (&String, &'static str)> {
        self.incomplete_pools
            .iter()
            .map(|p| (p, "is currently being updated"))
            .chain(
                self.invalid_pools
                    .iter()
                    .map(|p| (p, "is currently invalid")),
            )
    }
}

/// The node's slices of one pool at the newest generation it has.
struct LocalPool<'a> {
    generation: i64,
    expected: i64,
    slices: Vec<&'a ResourceSlice>,
}

/// The node's devices from `slices` (all slices the cluster has: a pool
/// that spans nodes is complete only counting its slices on every node).
///
/// As kube-scheduler decides it: the newest generation among the node's
/// own slices of a pool counts; complete when those slices are as many as
/// the pool says; otherwise the pool is obsolete when another node has a
/// newer generation, complete when the slices of that generation on every
/// node add up, incomplete if not.
pub fn node_inventory<S: Borrow<ResourceSlice>>(node: &str, slices: &[S]) -> Inventory {
    let slices: Vec<&ResourceSlice> = slices.iter().map(Borrow::borrow).collect();
    let mut pools: BTreeMap<(&str, &str), LocalPool> = BTreeMap::new();
    for slice in slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node))
    {
        let key = (slice.spec.driver.as_str(), slice.spec.pool.name.as_str());
        let pool = &slice.spec.pool;
        let entry = pools.entry(key).or_insert(LocalPool {
            generation: pool.generation,
            expected: pool.resource_slice_count,
            slices: Vec::new(),
        });
        if pool.generation > entry.generation {
            entry.generation = pool.generation;
            entry.expected = pool.resource_slice_count;
            entry.slices.clear();
        }
        if pool.generation == entry.generation {
            entry.slices.push(slice);
        }
    }
    let mut inventory = Inventory::default();
    for slice in slices.iter().filter(|s| s.spec.node_name.is_none()) {
        let driver = slice.spec.driver.as_str();
        for device in slice.spec.devices.iter().flatten() {
            let (facts, _) = device_facts(driver, device);
            inventory.foreign.push(NodeDevice {
                id: DeviceId {
                    driver: driver.to_string(),
                    pool: slice.spec.pool.name.clone(),
                    device: device.name.clone(),
                },
                facts,
                taints: Vec::new(),
                unsupported: Some("is not node-local".into()),
            });
        }
    }
    for ((driver, pool_name), mut pool) in pools {
        let pool_key = format!("{driver}/{pool_name}");
        if pool.slices.len() as i64 != pool.expected {
            let same_pool = || {
                slices
                    .iter()
                    .filter(|s| s.spec.driver == driver && s.spec.pool.name == pool_name)
            };
            if same_pool().any(|s| s.spec.pool.generation > pool.generation) {
                // Obsolete: the driver has moved on.
                continue;
            }
            let everywhere = same_pool()
                .filter(|s| s.spec.pool.generation == pool.generation)
                .count();
            if everywhere as i64 != pool.expected {
                inventory.incomplete_pools.insert(pool_key);
                continue;
            }
        }
        pool.slices
            .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut names = BTreeSet::new();
        let duplicate = pool
            .slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .any(|d| !names.insert(d.name.as_str()));
        if duplicate {
            inventory.invalid_pools.insert(pool_key);
            continue;
        }
        let local = pool.slices;
        for slice in local {
            let slice_unsupported = slice_unsupported(slice);
            for device in slice.spec.devices.iter().flatten() {
                let (facts, attribute_problem) = device_facts(driver, device);
                inventory.devices.push(NodeDevice {
                    id: DeviceId {
                        driver: driver.to_string(),
                        pool: pool_name.to_string(),
                        device: device.name.clone(),
                    },
                    facts,
                    taints: device.taints.clone().unwrap_or_default(),
                    unsupported: slice_unsupported
                        .clone()
                        .or_else(|| device_unsupported(device))
                        .or(attribute_problem),
                });
            }
        }
    }
    inventory
}

fn slice_unsupported(slice: &ResourceSlice) -> Option<String> {
    if slice
        .spec
        .shared_counters
        .as_ref()
        .is_some_and(|c| !c.is_empty())
    {
        return Some("its slice declares shared counters (partitionable devices)".into());
    }
    None
}

/// The features a device uses that this allocator refuses to guess about.
fn device_unsupported(device: &Device) -> Option<String> {
    let set = |v: &Option<Vec<_>>| v.as_ref().is_some_and(|v: &Vec<_>| !v.is_empty());
    if device
        .consumes_counters
        .as_ref()
        .is_some_and(|c| !c.is_empty())
    {
        return Some("consumes counters (partitionable devices)".into());
    }
    if set(&device.binding_conditions)
        || set(&device.binding_failure_conditions)
        || device.binds_to_node == Some(true)
    {
        return Some("has binding conditions".into());
    }
    if device.allow_multiple_allocations == Some(true)
        || device
            .capacity
            .iter()
            .flatten()
            .any(|(_, c)| c.request_policy.is_some())
    {
        return Some("has consumable capacity".into());
    }
    if device.node_name.is_some() || device.node_selector.is_some() || device.all_nodes.is_some() {
        return Some("selects its nodes per device".into());
    }
    None
}

/// What selectors see of a device, and why it cannot be offered, if an
/// attribute cannot be represented.
fn device_facts(driver: &str, device: &Device) -> (DeviceFacts, Option<String>) {
    let mut facts = DeviceFacts {
        driver: driver.to_string(),
        ..DeviceFacts::default()
    };
    let mut problem = None;
    for (name, attr) in device.attributes.iter().flatten() {
        let (domain, id) = qualified(driver, name);
        let value = if let Some(b) = attr.bool {
            AttributeValue::Bool(b)
        } else if let Some(i) = attr.int {
            AttributeValue::Int(i)
        } else if let Some(s) = &attr.string {
            AttributeValue::String(s.clone())
        } else if let Some(v) = &attr.version {
            match Version::parse(v) {
                Ok(parsed) => AttributeValue::Version(parsed, v.clone()),
                Err(e) => {
                    problem.get_or_insert(format!("attribute {name}: {e}"));
                    continue;
                }
            }
        } else {
            problem.get_or_insert(format!(
                "attribute {name} is a list (list-type attributes are not supported)"
            ));
            continue;
        };
        facts
            .attributes
            .entry(domain)
            .or_default()
            .insert(id, value);
    }
    for (name, capacity) in device.capacity.iter().flatten() {
        let (domain, id) = qualified(driver, name);
        match Quantity::parse(&capacity.value.0) {
            Ok(q) => {
                facts.capacity.entry(domain).or_default().insert(id, q);
            }
            Err(e) => {
                problem.get_or_insert(format!("capacity {name}: {e}"));
            }
        }
    }
    (facts, problem)
}

/// `domain/id` → (domain, id); a bare id belongs to the driver's domain.
pub(crate) fn qualified(driver: &str, name: &str) -> (String, String) {
    match name.split_once('/') {
        Some((domain, id)) => (domain.to_string(), id.to_string()),
        None => (driver.to_string(), name.to_string()),
    }
}
