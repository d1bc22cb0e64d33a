//! `drain --pod-selector`: rules select devices, not pods, so the devices
//! a pod outside the selector uses are only cordoned (their pods keep
//! running), and each of the node's other devices gets a `NoExecute` rule
//! of its own. A device shared by a selected and an unselected pod stays:
//! evicting one would evict both.

use std::collections::{BTreeMap, BTreeSet};

use super::{PlannedRule, rule_name};
use crate::report::{DeviceRef, Finding};

/// What a drain with `--pod-selector` evicts and what it leaves.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SelectedEviction {
    /// One `NoExecute` rule per device no unselected pod uses.
    pub rules: Vec<PlannedRule>,
    /// The devices left in use, each with the unselected pods
    /// (`namespace/name`) using it.
    pub kept: BTreeMap<DeviceRef, BTreeSet<String>>,
    /// Selected pods this drain cannot evict: each of their devices on
    /// the node is shared with an unselected pod (those devices).
    pub stuck: BTreeMap<String, BTreeSet<DeviceRef>>,
}

/// The eviction rules for the node's `devices`, given the findings of the
/// pods the selector leaves (`kept`) and of those it selects (`blocking`),
/// from a drain-check of the node whose unselected pods were set apart.
pub(crate) fn selected_eviction(
    node: &str,
    devices: &[DeviceRef],
    kept: &[Finding],
    blocking: &[Finding],
) -> SelectedEviction {
    let on_node: BTreeSet<&DeviceRef> = devices.iter().collect();
    let mut out = SelectedEviction::default();
    for finding in kept {
        let pod = finding
            .subject
            .as_ref()
            .map(|s| format!("{}/{}", finding.claim.namespace, s.name))
            .unwrap_or_default();
        for device in finding.devices.iter().filter(|d| on_node.contains(d)) {
            out.kept
                .entry(device.clone())
                .or_default()
                .insert(pod.clone());
        }
    }
    out.rules = devices
        .iter()
        .filter(|d| !out.kept.contains_key(*d))
        .map(|d| PlannedRule {
            // Not the name of the device's cordon rule (a pool spanning
            // nodes is cordoned device by device): "#evict" sets it apart.
            name: rule_name(node, &format!("{}/{}/{}#evict", d.driver, d.pool, d.device)),
            driver: d.driver.clone(),
            pool: d.pool.clone(),
            device: Some(d.device.clone()),
        })
        .collect();
    // A selected pod goes when one of its devices is tainted; with every
    // device on the node kept, nothing here evicts it.
    let mut devices_of: BTreeMap<String, BTreeSet<&DeviceRef>> = BTreeMap::new();
    for finding in blocking {
        let Some(subject) = &finding.subject else {
            continue;
        };
        let pod = format!("{}/{}", finding.claim.namespace, subject.name);
        devices_of
            .entry(pod)
            .or_default()
            .extend(finding.devices.iter().filter(|d| on_node.contains(d)));
    }
    for (pod, devices) in devices_of {
        if !devices.is_empty() && devices.iter().all(|d| out.kept.contains_key(*d)) {
            out.stuck
                .insert(pod, devices.into_iter().cloned().collect());
        }
    }
    out
}
