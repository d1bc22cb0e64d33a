//! `drain NODE [--driver]` and `uncordon NODE`: the admin guide's driver
//! maintenance done with the cluster's own mechanism. The node's devices
//! (of one driver, or all) get DeviceTaintRules: first with the `None`
//! effect, whose status previews what would be evicted, then `NoExecute`
//! (confirmed for the eviction guard: the admin asked for it), so that the
//! device-taint eviction controller evicts the pods using them; the command
//! then waits until `drain-check` finds the node clean. `uncordon` deletes
//! the rules. Every step is idempotent: run again, it resumes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use dra_model::device_taints::{EVICTION_API_ANNOTATION, RulesVersion};

/// The label every rule of a drain carries: the node (or, when the name
/// does not fit a label value, a hash of it).
pub(crate) const NODE_LABEL: &str = "dra-claim-controller.io/drain-node";
/// The annotation with the node's full name.
pub(crate) const NODE_ANNOTATION: &str = "dra-claim-controller.io/drain-node";
/// The controller's confirmation of a broad rule (see its eviction guard).
pub(crate) const CONFIRM_ANNOTATION: &str = "dra-claim-controller.io/confirm-eviction";
/// The taint's key; its value names the command.
pub(crate) const TAINT_KEY: &str = "dra-claim-controller.io/drain";

/// One rule to create: what it selects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PlannedRule {
    pub name: String,
    pub driver: String,
    pub pool: String,
    /// Set when the pool spans other nodes: only this node's devices.
    pub device: Option<String>,
}

/// Of one pool's newest generation: its slices, the count it announces,
/// and this node's devices.
#[derive(Default)]
struct PoolOnNode {
    slices: i64,
    announced: i64,
    devices: BTreeSet<String>,
}

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The node as a label value: itself when it fits, else a hash.
pub(crate) fn node_label(node: &str) -> String {
    if node.len() <= 63 {
        node.to_string()
    } else {
        format!("h-{:016x}", fnv(node))
    }
}

fn rule_name(node: &str, key: &str) -> String {
    let prefix: String = node.chars().take(200).collect();
    let prefix = prefix.trim_end_matches(['.', '-']);
    format!("dra-drain-{prefix}-{:08x}", fnv(key) as u32)
}

/// The rules that select exactly the node's devices (of `driver`, when
/// given): one per pool that lives on this node only (every slice of it,
/// of any generation, on this node, and its newest generation complete),
/// one per device otherwise: a rule must never reach another node's
/// devices, confirmed as it is. `slices` is every slice of the cluster.
pub(crate) fn plan_rules(
    node: &str,
    driver: Option<&str>,
    slices: &[ResourceSlice],
) -> Vec<PlannedRule> {
    let of_driver = |s: &&ResourceSlice| driver.is_none_or(|d| d == s.spec.driver);
    // Per (driver, pool): whether any slice of any generation is elsewhere.
    let mut elsewhere: BTreeMap<(String, String), bool> = BTreeMap::new();
    for slice in slices.iter().filter(of_driver) {
        let s = &slice.spec;
        *elsewhere
            .entry((s.driver.clone(), s.pool.name.clone()))
            .or_default() |= s.node_name.as_deref() != Some(node);
    }
    // This node's devices, and each pool's newest slices against the count
    // it announces.
    let mut pools: BTreeMap<(String, String), PoolOnNode> = BTreeMap::new();
    for slice in dra_model::device_taints::current_slices(slices.iter()).filter(of_driver) {
        let s = &slice.spec;
        let pool = pools
            .entry((s.driver.clone(), s.pool.name.clone()))
            .or_default();
        pool.slices += 1;
        pool.announced = s.pool.resource_slice_count;
        if s.node_name.as_deref() == Some(node) {
            pool.devices
                .extend(s.devices.iter().flatten().map(|d| d.name.clone()));
        }
    }
    let mut rules = Vec::new();
    for ((driver, pool_name), pool) in pools {
        if pool.devices.is_empty() {
            continue;
        }
        let whole_pool =
            !elsewhere[&(driver.clone(), pool_name.clone())] && pool.slices == pool.announced;
        if whole_pool {
            rules.push(PlannedRule {
                name: rule_name(node, &format!("{driver}/{pool_name}")),
                driver,
                pool: pool_name,
                device: None,
            });
        } else {
            for device in pool.devices {
                rules.push(PlannedRule {
                    name: rule_name(node, &format!("{driver}/{pool_name}/{device}")),
                    driver: driver.clone(),
                    pool: pool_name.clone(),
                    device: Some(device),
                });
            }
        }
    }
    rules
}

/// The rule as created (effect `None`: a preview).
pub(crate) fn rule_manifest(version: RulesVersion, node: &str, rule: &PlannedRule) -> Value {
    let mut selector = json!({"driver": rule.driver, "pool": rule.pool});
    if let Some(device) = &rule.device {
        selector["device"] = json!(device);
    }
    json!({
        "apiVersion": version.api_version(),
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule.name,
            "labels": {NODE_LABEL: node_label(node)},
            "annotations": {NODE_ANNOTATION: node},
        },
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": TAINT_KEY, "value": "kubectl-dra-drain", "effect": "None"},
        },
    })
}

fn rules_api(client: &kube::Client, version: RulesVersion) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &version.api_resource())
}

/// Which version serves DeviceTaintRules, if any.
pub(crate) async fn rules_version(client: &kube::Client) -> Result<RulesVersion, String> {
    let served = RulesVersion::API
        .probe(client)
        .await
        .map_err(|e| format!("discovering DeviceTaintRules: {e}"))?;
    match served.as_deref() {
        Some(version) => Ok(RulesVersion::from_served(version)),
        None => Err("the API server serves no DeviceTaintRule (resource.k8s.io v1 or v1beta2): on Kubernetes 1.36 \
         turn on the DRADeviceTaintRules gate and --runtime-config=resource.k8s.io/v1beta2=true"
            .into()),
    }
}

/// The `EvictionInProgress` message of a rule, if written.
fn condition_message(rule: &DynamicObject) -> Option<(String, String)> {
    rule.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "EvictionInProgress")
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
}

fn effect(rule: &DynamicObject) -> &str {
    rule.data["spec"]["taint"]["effect"]
        .as_str()
        .unwrap_or_default()
}

/// Creates the rules that do not exist yet (as previews); returns every
/// planned rule as the server has it.
pub(crate) async fn ensure_rules(
    client: &kube::Client,
    version: RulesVersion,
    node: &str,
    planned: &[PlannedRule],
) -> Result<Vec<DynamicObject>, String> {
    let api = rules_api(client, version);
    let mut rules = Vec::new();
    for rule in planned {
        let existing = api
            .get_opt(&rule.name)
            .await
            .map_err(|e| format!("reading DeviceTaintRule {}: {e}", rule.name))?;
        let rule = match existing {
            Some(r) => r,
            None => {
                let manifest: DynamicObject =
                    serde_json::from_value(rule_manifest(version, node, rule))
                        .map_err(|e| e.to_string())?;
                match api.create(&PostParams::default(), &manifest).await {
                    Ok(r) => r,
                    // Created meanwhile (a second run): take it.
                    Err(kube::Error::Api(s)) if s.code == 409 => api
                        .get(&rule.name)
                        .await
                        .map_err(|e| format!("reading DeviceTaintRule {}: {e}", rule.name))?,
                    Err(e) => return Err(format!("creating DeviceTaintRule {}: {e}", rule.name)),
                }
            }
        };
        rules.push(rule);
    }
    Ok(rules)
}

/// Waits (at most `within`) for the preview of each `None` rule and
/// returns what each says.
pub(crate) async fn previews(
    client: &kube::Client,
    version: RulesVersion,
    names: &[String],
    within: Duration,
) -> Vec<(String, Option<String>)> {
    let api = rules_api(client, version);
    let deadline = Instant::now() + within;
    loop {
        let mut out = Vec::new();
        for name in names {
            let said = api
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|r| condition_message(&r))
                .filter(|(reason, _)| reason == "NoEffect")
                .map(|(_, message)| message);
            out.push((name.clone(), said));
        }
        if out.iter().all(|(_, said)| said.is_some()) || Instant::now() >= deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The change that turns a rule to `NoExecute`, confirmed, evicting
/// through the Eviction API (PodDisruptionBudgets hold its pods) unless
/// `delete` says to delete them as kube-controller-manager does; `None`
/// when the rule is so already (a resumed drain writes nothing).
pub(crate) fn no_execute_patch(rule: &DynamicObject, delete: bool) -> Option<Value> {
    let annotation = |key: &str| {
        rule.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let respect = if delete { "false" } else { "true" };
    if effect(rule) == "NoExecute"
        && annotation(CONFIRM_ANNOTATION) == Some("true")
        && annotation(EVICTION_API_ANNOTATION) == Some(respect)
    {
        return None;
    }
    Some(json!({
        "metadata": {"annotations": {CONFIRM_ANNOTATION: "true", EVICTION_API_ANNOTATION: respect}},
        "spec": {"taint": {"effect": "NoExecute"}},
    }))
}

/// Turns each rule to `NoExecute`, confirmed; its pods are evicted through
/// the Eviction API, or deleted with `delete` (`--disable-eviction`).
pub(crate) async fn evict(
    client: &kube::Client,
    version: RulesVersion,
    rules: &[DynamicObject],
    delete: bool,
) -> Result<(), String> {
    let api = rules_api(client, version);
    for rule in rules {
        let name = rule.metadata.name.clone().unwrap_or_default();
        let Some(patch) = no_execute_patch(rule, delete) else {
            continue;
        };
        api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| format!("setting DeviceTaintRule {name} to NoExecute: {e}"))?;
    }
    Ok(())
}

/// Deletes the node's drain rules (of `driver`'s devices, when given);
/// returns their names.
pub(crate) async fn uncordon(
    client: &kube::Client,
    version: RulesVersion,
    node: &str,
    driver: Option<&str>,
) -> Result<Vec<String>, String> {
    let api = rules_api(client, version);
    let selector = format!("{NODE_LABEL}={}", node_label(node));
    let rules = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("listing the drain rules of node {node}: {e}"))?;
    let mut deleted = Vec::new();
    for rule in rules.items {
        let of_node = rule
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODE_ANNOTATION))
            .is_some_and(|n| n == node);
        let of_driver = driver.is_none_or(|d| rule.data["spec"]["deviceSelector"]["driver"] == d);
        if !(of_node && of_driver) {
            continue;
        }
        let name = rule.metadata.name.clone().unwrap_or_default();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted.push(name),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(format!("deleting DeviceTaintRule {name}: {e}")),
        }
    }
    Ok(deleted)
}

/// Every slice of the cluster.
pub(crate) async fn all_slices(client: &kube::Client) -> Result<Vec<ResourceSlice>, String> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| format!("listing ResourceSlices: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, driver: &str, pool: &str, node: &str, devices: &[&str]) -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "nodeName": node,
                "devices": devices.iter().map(|d| json!({"name": d})).collect::<Vec<_>>(),
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_node_local_pool_is_one_rule_a_shared_pool_one_per_device() {
        let slices = [
            slice("a", "gpu.example.com", "node-1", "node-1", &["g0", "g1"]),
            slice("b", "nic.example.com", "fabric", "node-1", &["n0"]),
            slice("c", "nic.example.com", "fabric", "node-2", &["n1"]),
            slice("d", "gpu.example.com", "node-2", "node-2", &["g0"]),
        ];
        let rules = plan_rules("node-1", None, &slices);
        let selected: Vec<(&str, &str, Option<&str>)> = rules
            .iter()
            .map(|r| (r.driver.as_str(), r.pool.as_str(), r.device.as_deref()))
            .collect();
        assert_eq!(
            selected,
            [
                ("gpu.example.com", "node-1", None),
                ("nic.example.com", "fabric", Some("n0")),
            ]
        );
        // One driver only.
        let gpus = plan_rules("node-1", Some("gpu.example.com"), &slices);
        assert_eq!(gpus.len(), 1);
        // The same names on every run: the command resumes.
        assert_eq!(plan_rules("node-1", None, &slices), rules);
        assert!(
            rules
                .iter()
                .all(|r| r.name.starts_with("dra-drain-node-1-"))
        );
        // A node-local pool whose newest generation is incomplete (a
        // second slice announced, not published): per device.
        let mut partial = slice("e", "gpu.example.com", "node-3", "node-3", &["g0", "g1"]);
        partial.spec.pool.resource_slice_count = 2;
        let rules3 = plan_rules("node-3", None, &[partial]);
        assert_eq!(rules3.len(), 2, "{rules3:?}");
        assert!(rules3.iter().all(|r| r.device.is_some()));
        // A node with no devices: nothing to do.
        assert!(plan_rules("node-9", None, &slices).is_empty());
    }

    #[test]
    fn a_long_node_name_still_makes_a_valid_label() {
        let long = "n".repeat(200);
        assert!(node_label(&long).len() <= 63);
        assert_eq!(node_label("node-1"), "node-1");
        assert!(rule_name(&long, "d/p").len() <= 253);
    }

    /// `drain` asks for budget-respecting evictions unless told
    /// `--disable-eviction`; a rule already as asked is left alone, so a
    /// resumed drain writes nothing, and switching modes rewrites it.
    #[test]
    fn no_execute_asks_for_evictions_unless_disabled() {
        let rule = |effect: &str, annotations: serde_json::Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                "metadata": {"name": "r", "annotations": annotations},
                "spec": {"taint": {"key": "k", "effect": effect}},
            }))
            .unwrap()
        };
        let preview = rule("None", json!({}));
        let patch = no_execute_patch(&preview, false).unwrap();
        assert_eq!(patch["spec"]["taint"]["effect"], "NoExecute");
        assert_eq!(
            patch["metadata"]["annotations"][EVICTION_API_ANNOTATION],
            "true"
        );
        assert_eq!(patch["metadata"]["annotations"][CONFIRM_ANNOTATION], "true");
        let deleting = no_execute_patch(&preview, true).unwrap();
        assert_eq!(
            deleting["metadata"]["annotations"][EVICTION_API_ANNOTATION],
            "false"
        );

        let draining = rule(
            "NoExecute",
            json!({CONFIRM_ANNOTATION: "true", EVICTION_API_ANNOTATION: "true"}),
        );
        assert_eq!(
            no_execute_patch(&draining, false),
            None,
            "resumed: nothing to write"
        );
        assert!(
            no_execute_patch(&draining, true).is_some(),
            "switched to deleting"
        );
        // A drain begun before budgets were respected is switched over.
        let older = rule("NoExecute", json!({CONFIRM_ANNOTATION: "true"}));
        assert!(no_execute_patch(&older, false).is_some());
    }
}
