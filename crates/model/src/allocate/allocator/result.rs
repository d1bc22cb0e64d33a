//! The allocation result written to the claim: devices per request, the
//! configs of classes and claim, the node selector.

use super::*;

/// The allocation result for the chosen devices.
pub(super) fn result(
    input: &AllocationInput,
    requests: &[Request],
    chosen: &[(usize, Vec<usize>)],
) -> AllocationResult {
    let mut results = Vec::new();
    for (request, (a, devices)) in requests.iter().zip(chosen) {
        let alt = &request.alternatives[*a];
        for &d in devices {
            let id = &input.inventory.devices[d].id;
            results.push(DeviceRequestAllocationResult {
                request: alt.name.clone(),
                driver: id.driver.clone(),
                pool: id.pool.clone(),
                device: id.device.clone(),
                admin_access: alt.admin.then_some(true),
                tolerations: (!alt.tolerations.is_empty()).then(|| alt.tolerations.clone()),
                ..Default::default()
            });
        }
    }
    let config = configs(input, requests, chosen);
    let node_selector = (!results.is_empty()).then(|| NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".to_string(),
                operator: "In".to_string(),
                values: Some(vec![input.node.to_string()]),
            }]),
            match_expressions: None,
        }],
    });
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(results),
            config: (!config.is_empty()).then_some(config),
        }),
        node_selector,
        allocation_timestamp: None,
    }
}

/// Class configs first (each class once, naming every request that used
/// it), then the claim's configs that apply to a chosen request — in the
/// order and shape kube-scheduler writes them.
fn configs(
    input: &AllocationInput,
    requests: &[Request],
    chosen: &[(usize, Vec<usize>)],
) -> Vec<DeviceAllocationConfiguration> {
    let mut out: Vec<DeviceAllocationConfiguration> = Vec::new();
    let mut class_entries: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (request, (a, _)) in requests.iter().zip(chosen) {
        let alt = &request.alternatives[*a];
        if let Some(indices) = class_entries.get(alt.class_name.as_str()) {
            for &i in indices {
                out[i]
                    .requests
                    .get_or_insert_with(Vec::new)
                    .push(alt.name.clone());
            }
            continue;
        }
        let class = &input.classes[&alt.class_name];
        let mut indices = Vec::new();
        let class_configs = class.spec.as_ref().and_then(|s| s.config.as_ref());
        for config in class_configs.into_iter().flatten() {
            indices.push(out.len());
            out.push(DeviceAllocationConfiguration {
                source: "FromClass".to_string(),
                requests: Some(vec![alt.name.clone()]),
                opaque: config.opaque.clone(),
            });
        }
        class_entries.insert(alt.class_name.as_str(), indices);
    }
    let claim_configs = claim_devices(input.claim).and_then(|d| d.config.as_ref());
    for config in claim_configs.into_iter().flatten() {
        let named = config.requests.clone().unwrap_or_default();
        let entry = || DeviceAllocationConfiguration {
            source: "FromClaim".to_string(),
            requests: config.requests.clone().filter(|r| !r.is_empty()),
            opaque: config.opaque.clone(),
        };
        if named.is_empty() {
            out.push(entry());
            continue;
        }
        for (request, (a, _)) in requests.iter().zip(chosen) {
            let alt = &request.alternatives[*a];
            if named.iter().any(|n| *n == request.name || *n == alt.name) {
                out.push(entry());
            }
        }
    }
    out
}
