//! Device headroom: which devices of the selected nodes a `devices[]`
//! entry counts (its class's selectors and its own), and who uses them: a
//! workload pod (in use), a placeholder of that entry (held), or nobody
//! that counts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceSelector, ResourceSlice};

use super::watermark::DeviceEntrySpec;
use crate::allocate::inventory::{NodeDevice, node_inventory};
use crate::allocate::selector::Selector;
use crate::model::DeviceId;
use crate::model::views::ClaimView;

/// An entry's device filter: the class's selectors, then the entry's.
pub(crate) struct EntryDevices {
    selectors: Vec<Selector>,
}

/// Compiles entry `index` against the cluster's classes; an unknown class
/// or a selector that does not compile is the entry's `Invalid` message,
/// naming the field.
pub(crate) fn entry_devices(
    index: usize,
    entry: &DeviceEntrySpec,
    classes: &BTreeMap<String, Arc<DeviceClass>>,
) -> Result<EntryDevices, String> {
    let field = format!("spec.devices[{index}] ({})", entry.name);
    let Some(class) = classes.get(&entry.device_class_name) else {
        return Err(format!(
            "{field}: DeviceClass {} not found: create it, or fix deviceClassName",
            entry.device_class_name
        ));
    };
    let mut selectors = Vec::new();
    let class_selectors = class
        .spec
        .as_ref()
        .and_then(|s| s.selectors.as_deref())
        .unwrap_or_default();
    for (i, s) in class_selectors.iter().enumerate() {
        selectors.push(compile(s, || {
            format!(
                "{field}: DeviceClass {} selector #{i}",
                entry.device_class_name
            )
        })?);
    }
    for (i, raw) in entry.selectors.iter().enumerate() {
        let origin = || format!("{field}.selectors[{i}]");
        let selector: DeviceSelector = serde_json::from_value(raw.clone())
            .map_err(|e| format!("{}: not a device selector: {e}", origin()))?;
        selectors.push(compile(&selector, origin)?);
    }
    Ok(EntryDevices { selectors })
}

fn compile(selector: &DeviceSelector, origin: impl Fn() -> String) -> Result<Selector, String> {
    let Some(cel) = &selector.cel else {
        return Err(format!("{}: no CEL expression", origin()));
    };
    Selector::compile(&cel.expression).map_err(|e| format!("{}: {e}", origin()))
}

impl EntryDevices {
    /// Whether every selector selects the device (an evaluation error, a
    /// missing attribute say, means no, as in kube-scheduler).
    fn selects(&self, device: &NodeDevice) -> bool {
        self.selectors
            .iter()
            .all(|s| s.matches(&device.facts).unwrap_or(false))
    }
}

/// Who a claim's devices are for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Consumer {
    /// A pod that counts as workload.
    Workload,
    /// A placeholder of (watermark key `namespace/name`, entry).
    Placeholder(String, String),
}

/// Each allocated device with the consumer of its claim; a claim reserved
/// for no pod that `consumer_of` knows is left out.
pub(crate) fn device_consumers(
    claims: &[Arc<ClaimView>],
    consumer_of: impl Fn(&str) -> Option<Consumer>,
) -> HashMap<DeviceId, Consumer> {
    let mut out = HashMap::new();
    for claim in claims {
        let Some(consumer) = claim
            .status
            .reserved_for
            .iter()
            .filter(|r| r.resource == "pods")
            .find_map(|r| consumer_of(&r.uid))
        else {
            continue;
        };
        for device in claim.held_devices() {
            out.insert(device, consumer.clone());
        }
    }
    out
}

/// Devices of an entry on the selected nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DeviceCount {
    pub total: u32,
    /// Allocated to workload pods.
    pub in_use: u32,
    /// Allocated to this entry's placeholders.
    pub held: u32,
}

/// Counts the devices `entry` selects on `nodes`.
pub(crate) fn count_devices(
    entry: &EntryDevices,
    placeholder_of: &Consumer,
    nodes: &[String],
    slices: &[Arc<ResourceSlice>],
    consumers: &HashMap<DeviceId, Consumer>,
) -> DeviceCount {
    let mut count = DeviceCount::default();
    for node in nodes {
        let inventory = node_inventory(node, slices);
        for device in inventory.devices.iter().filter(|d| entry.selects(d)) {
            count.total += 1;
            match consumers.get(&device.id) {
                Some(Consumer::Workload) => count.in_use += 1,
                Some(c) if c == placeholder_of => count.held += 1,
                _ => {}
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn class(name: &str, driver: &str) -> (String, Arc<DeviceClass>) {
        let c: DeviceClass = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{driver}'")}}]}}))
        .unwrap();
        (name.to_string(), Arc::new(c))
    }

    fn slice(node: &str, driver: &str, devices: &[(&str, &str)]) -> Arc<ResourceSlice> {
        let devices: Vec<Value> = devices
            .iter()
            .map(|(n, model)| json!({"name": n, "attributes": {"model": {"string": model}}}))
            .collect();
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"name": format!("{node}-{driver}")}, "spec": {
                "driver": driver, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices}}),
            )
            .unwrap(),
        )
    }

    fn claim(driver: &str, pool: &str, device: &str, pod_uid: &str) -> Arc<ClaimView> {
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"name": format!("c-{device}"), "namespace": "ns"},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "r", "driver": driver, "pool": pool, "device": device}]}},
                    "reservedFor": [{"resource": "pods", "name": "p", "uid": pod_uid}]}}),
            )
            .unwrap(),
        )
    }

    fn entry(v: Value) -> DeviceEntrySpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn devices_are_counted_by_class_selectors_and_consumer() {
        let classes = BTreeMap::from([class("gpu", "gpu.example.com")]);
        let slices = vec![
            slice(
                "n1",
                "gpu.example.com",
                &[("g0", "a100"), ("g1", "a100"), ("g2", "h100")],
            ),
            slice("n2", "gpu.example.com", &[("g0", "a100")]),
            slice("other", "gpu.example.com", &[("g0", "a100")]),
            slice("n1", "nic.example.com", &[("x0", "a100")]),
        ];
        let claims = vec![
            claim("gpu.example.com", "n1", "g0", "workload"),
            claim("gpu.example.com", "n1", "g1", "placeholder"),
            claim("gpu.example.com", "n2", "g0", "other-placeholder"),
            claim("gpu.example.com", "other", "g0", "workload"),
        ];
        let mine = Consumer::Placeholder("ns/w".into(), "gpu".into());
        let consumers = device_consumers(&claims, |uid| match uid {
            "workload" => Some(Consumer::Workload),
            "placeholder" => Some(mine.clone()),
            "other-placeholder" => Some(Consumer::Placeholder("ns/w".into(), "other".into())),
            _ => None,
        });
        let nodes = vec!["n1".to_string(), "n2".to_string()];
        let all = entry_devices(
            0,
            &entry(json!({"name": "gpu", "deviceClassName": "gpu"})),
            &classes,
        )
        .ok()
        .unwrap();
        assert_eq!(
            count_devices(&all, &mine, &nodes, &slices, &consumers),
            DeviceCount {
                total: 4,
                in_use: 1,
                held: 1
            }
        );
        let a100 = entry(json!({"name": "gpu", "deviceClassName": "gpu",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.example.com'].model == 'a100'"}}]}));
        let a100 = entry_devices(0, &a100, &classes).ok().unwrap();
        assert_eq!(
            count_devices(&a100, &mine, &nodes, &slices, &consumers),
            DeviceCount {
                total: 3,
                in_use: 1,
                held: 1
            }
        );
    }

    #[test]
    fn bad_entries_name_the_field() {
        let classes = BTreeMap::from([class("gpu", "gpu.example.com")]);
        let rows = [
            (
                json!({"name": "e", "deviceClassName": "nope"}),
                "spec.devices[2] (e): DeviceClass nope not found",
            ),
            (
                json!({"name": "e", "deviceClassName": "gpu", "selectors": [{"cel": {"expression": "device.("}}]}),
                "spec.devices[2] (e).selectors[0]",
            ),
            (
                json!({"name": "e", "deviceClassName": "gpu", "selectors": [{"other": 1}]}),
                "spec.devices[2] (e).selectors[0]: no CEL expression",
            ),
        ];
        for (v, want) in rows {
            let err = entry_devices(2, &entry(v.clone()), &classes).err().unwrap();
            assert!(err.starts_with(want), "{v}: {err}");
        }
    }
}
