//! `drain NODE [--driver]` and `uncordon NODE`: the admin guide's driver
//! maintenance done with the cluster's own mechanism, as `kubectl drain`
//! does it for a node. The node's devices (of one driver, or all) get
//! DeviceTaintRules: first `NoSchedule` (cordoned: nothing new lands on
//! them), then `NoExecute` (confirmed for the eviction guard: the admin
//! asked for it), so that the device-taint eviction controller evicts the
//! pods using them; the command then waits until `drain-check` finds the
//! node clean. `--dry-run` makes `None` rules instead, whose status
//! previews what would be evicted, and removes them again. `uncordon`
//! deletes the rules. Every step is idempotent: run again, it resumes, on
//! the node's devices as they are now (rules no longer needed go).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::report::DeviceRef;
use dra_model::device_taints::{EVICTION_API_ANNOTATION, GRACE_PERIOD_ANNOTATION, RulesVersion};

mod selected;
pub(crate) use selected::{SelectedEviction, selected_eviction};

/// The label every rule of a drain carries: the node (or, when the name
/// does not fit a label value, a hash of it).
pub(crate) const NODE_LABEL: &str = "dra-claim-controller.io/drain-node";
/// The annotation with the node's full name.
pub(crate) const NODE_ANNOTATION: &str = "dra-claim-controller.io/drain-node";
/// The controller's confirmation of a broad rule (see its eviction guard).
pub(crate) const CONFIRM_ANNOTATION: &str = "dra-claim-controller.io/confirm-eviction";
/// The taint's key; its value names the command.
pub(crate) const TAINT_KEY: &str = "dra-claim-controller.io/drain";

/// The effect a rule is created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Created {
    /// A preview (`--dry-run`): evicts nobody, its status says who would go.
    Preview,
    /// Cordoned: no new pod gets the devices; nobody is evicted yet.
    Cordoned,
}

impl Created {
    fn effect(self) -> &'static str {
        match self {
            Created::Preview => "None",
            Created::Cordoned => "NoSchedule",
        }
    }
}

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

pub(crate) fn rule_name(node: &str, key: &str) -> String {
    let prefix: String = node.chars().take(200).collect();
    let prefix = prefix.trim_end_matches(['.', '-']);
    format!("dra-drain-{prefix}-{:08x}", fnv(key) as u32)
}

/// This node's devices (of `driver`, when given) in each pool's newest
/// generation, with the pool's slices against the count it announces.
fn pools_on_node(
    node: &str,
    driver: Option<&str>,
    slices: &[ResourceSlice],
) -> BTreeMap<(String, String), PoolOnNode> {
    let of_driver = |s: &&ResourceSlice| driver.is_none_or(|d| d == s.spec.driver);
    let mut pools: BTreeMap<(String, String), PoolOnNode> = BTreeMap::new();
    for slice in dra_model::device_taints::current_slices(slices.iter()).filter(of_driver) {
        let s = &slice.spec;
        let pool = pools
            .entry((s.driver.clone(), s.pool.name.clone()))
            .or_default();
        pool.slices += 1;
        pool.announced = s.pool.resource_slice_count;
        let devices = s.devices.iter().flatten();
        if s.node_name.as_deref() == Some(node) {
            pool.devices.extend(devices.map(|d| d.name.clone()));
        } else if s.per_device_node_selection == Some(true) {
            // Each device says where it is: those local to this node. One
            // reachable through a node selector or from all nodes serves
            // other nodes too, and stays.
            pool.devices.extend(
                devices
                    .filter(|d| d.node_name.as_deref() == Some(node))
                    .map(|d| d.name.clone()),
            );
        }
    }
    pools
}

/// This node's devices (of `driver`, when given), as [`plan_rules`] drains
/// them.
pub(crate) fn node_devices(
    node: &str,
    driver: Option<&str>,
    slices: &[ResourceSlice],
) -> Vec<DeviceRef> {
    pools_on_node(node, driver, slices)
        .into_iter()
        .flat_map(|((driver, pool), on_node)| {
            on_node.devices.into_iter().map(move |device| DeviceRef {
                driver: driver.clone(),
                pool: pool.clone(),
                device,
            })
        })
        .collect()
}

/// The rules that select exactly the node's devices (of `driver`, when
/// given): one per pool that lives on this node only (every slice of it,
/// of any generation, on this node, and its newest generation complete),
/// one per device otherwise (a pool spanning nodes, or a device placed on
/// this node by `perDeviceNodeSelection`): a rule must never reach another
/// node's devices, confirmed as it is. `slices` is every slice of the
/// cluster.
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
    let pools = pools_on_node(node, driver, slices);
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

/// The rule as created, with the effect of `created`.
pub(crate) fn rule_manifest(
    version: RulesVersion,
    node: &str,
    rule: &PlannedRule,
    created: Created,
) -> Value {
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
            "taint": {"key": TAINT_KEY, "value": "kubectl-dra-drain", "effect": created.effect()},
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

/// The node's rules as the server has them, and the names of those this
/// run created.
pub(crate) struct Ensured {
    pub rules: Vec<DynamicObject>,
    pub created: Vec<String>,
}

/// Creates the planned rules that do not exist yet, as `created` says;
/// returns every planned rule as the server has it.
pub(crate) async fn ensure_rules(
    client: &kube::Client,
    version: RulesVersion,
    node: &str,
    planned: &[PlannedRule],
    created: Created,
) -> Result<Ensured, String> {
    let api = rules_api(client, version);
    let mut ensured = Ensured {
        rules: Vec::new(),
        created: Vec::new(),
    };
    for rule in planned {
        let existing = api
            .get_opt(&rule.name)
            .await
            .map_err(|e| format!("reading DeviceTaintRule {}: {e}", rule.name))?;
        let rule = match existing {
            Some(r) => r,
            None => {
                let manifest: DynamicObject =
                    serde_json::from_value(rule_manifest(version, node, rule, created))
                        .map_err(|e| e.to_string())?;
                match api.create(&PostParams::default(), &manifest).await {
                    Ok(r) => {
                        ensured.created.push(rule.name.clone());
                        r
                    }
                    // Created meanwhile (a second run): take it.
                    Err(kube::Error::Api(s)) if s.code == 409 => api
                        .get(&rule.name)
                        .await
                        .map_err(|e| format!("reading DeviceTaintRule {}: {e}", rule.name))?,
                    Err(e) => return Err(format!("creating DeviceTaintRule {}: {e}", rule.name)),
                }
            }
        };
        ensured.rules.push(rule);
    }
    Ok(ensured)
}

/// The change that cordons a rule: a preview (`None`) becomes `NoSchedule`;
/// so does one that evicts when `only_cordon` (a drain with
/// `--pod-selector` evicts through rules of its own); `None` when it is
/// as wanted already.
pub(crate) fn cordon_patch(rule: &DynamicObject, only_cordon: bool) -> Option<Value> {
    let effect = effect(rule);
    (effect == "None" || (only_cordon && effect == "NoExecute"))
        .then(|| json!({"spec": {"taint": {"effect": "NoSchedule"}}}))
}

/// Cordons every rule still a preview (left by an earlier `--dry-run` or
/// an older drain), and with `only_cordon` every rule that evicts.
pub(crate) async fn cordon(
    client: &kube::Client,
    version: RulesVersion,
    rules: &[DynamicObject],
    only_cordon: bool,
) -> Result<(), String> {
    let patch_of = |rule: &DynamicObject| cordon_patch(rule, only_cordon);
    patch_rules(client, version, rules, patch_of, "NoSchedule").await
}

/// Writes to each rule the change `patch_of` asks for (none: left alone);
/// `effect` names the effect it sets, for the error.
async fn patch_rules(
    client: &kube::Client,
    version: RulesVersion,
    rules: &[DynamicObject],
    patch_of: impl Fn(&DynamicObject) -> Option<Value>,
    effect: &str,
) -> Result<(), String> {
    let api = rules_api(client, version);
    for rule in rules {
        let Some(patch) = patch_of(rule) else {
            continue;
        };
        let name = rule.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| format!("setting DeviceTaintRule {name} to {effect}: {e}"))?;
    }
    Ok(())
}

/// Whether `rule` is one of `drain`'s for `node` (and `driver`'s devices,
/// when given).
fn of_drain(rule: &DynamicObject, node: &str, driver: Option<&str>) -> bool {
    let of_node = rule
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_ANNOTATION))
        .is_some_and(|n| n == node);
    of_node && driver.is_none_or(|d| rule.data["spec"]["deviceSelector"]["driver"] == d)
}

/// The node's drain rules (of `driver`, when given) the plan no longer has
/// although their pool is published (`slices`): the pool changed shape, or
/// the device left the node, since the drain began. A rule whose pool is not
/// published now stays: its driver may be down for the very maintenance the
/// drain is for, and its devices come back with it.
pub(crate) fn stale_rules(
    existing: &[DynamicObject],
    node: &str,
    driver: Option<&str>,
    planned: &[PlannedRule],
    slices: &[ResourceSlice],
) -> Vec<String> {
    let wanted: BTreeSet<&str> = planned.iter().map(|r| r.name.as_str()).collect();
    let published: BTreeSet<(&str, &str)> = slices
        .iter()
        .map(|s| (s.spec.driver.as_str(), s.spec.pool.name.as_str()))
        .collect();
    existing
        .iter()
        .filter(|r| of_drain(r, node, driver))
        .filter(|r| {
            let selector = &r.data["spec"]["deviceSelector"];
            let pool = (
                selector["driver"].as_str().unwrap_or_default(),
                selector["pool"].as_str().unwrap_or_default(),
            );
            published.contains(&pool)
        })
        .filter_map(|r| r.metadata.name.clone())
        .filter(|name| !wanted.contains(name.as_str()))
        .collect()
}

async fn drain_rules_of(
    api: &Api<DynamicObject>,
    node: &str,
) -> Result<Vec<DynamicObject>, String> {
    let selector = format!("{NODE_LABEL}={}", node_label(node));
    api.list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .map_err(|e| format!("listing the drain rules of node {node}: {e}"))
}

/// Deletes the rules named; returns those deleted (one already gone is
/// not).
pub(crate) async fn delete_rules(
    client: &kube::Client,
    version: RulesVersion,
    names: &[String],
) -> Result<Vec<String>, String> {
    let api = rules_api(client, version);
    let mut deleted = Vec::new();
    for name in names {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => deleted.push(name.clone()),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(format!("deleting DeviceTaintRule {name}: {e}")),
        }
    }
    Ok(deleted)
}

/// Deletes the node's drain rules that the plan no longer has; returns
/// their names.
pub(crate) async fn prune_rules(
    client: &kube::Client,
    version: RulesVersion,
    node: &str,
    driver: Option<&str>,
    planned: &[PlannedRule],
    slices: &[ResourceSlice],
) -> Result<Vec<String>, String> {
    let existing = drain_rules_of(&rules_api(client, version), node).await?;
    let stale = stale_rules(&existing, node, driver, planned, slices);
    delete_rules(client, version, &stale).await
}

/// What holds the drain, from the rules' status: one line per budget that
/// holds pods of a rule ("rule: 1 pod waiting for PodDisruptionBudget
/// ns/name.").
pub(crate) fn budget_holds(rules: &[DynamicObject]) -> Vec<String> {
    let mut holds = Vec::new();
    for rule in rules {
        let Some((_, message)) = condition_message(rule) else {
            continue;
        };
        let name = rule.metadata.name.as_deref().unwrap_or_default();
        holds.extend(
            message
                .split_inclusive(". ")
                .map(str::trim)
                .filter(|sentence| sentence.contains("waiting for PodDisruptionBudget"))
                .map(|sentence| format!("{name}: {sentence}")),
        );
    }
    holds
}

/// The node's rules (of `driver`, when given) as the server has them now.
pub(crate) async fn rules_of(
    client: &kube::Client,
    version: RulesVersion,
    node: &str,
    driver: Option<&str>,
) -> Result<Vec<DynamicObject>, String> {
    let existing = drain_rules_of(&rules_api(client, version), node).await?;
    Ok(existing
        .into_iter()
        .filter(|r| of_drain(r, node, driver))
        .collect())
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
/// `delete` says to delete them as kube-controller-manager does, giving
/// each pod `grace` seconds to terminate when set (its own otherwise);
/// `None` when the rule is so already (a resumed drain writes nothing).
pub(crate) fn no_execute_patch(
    rule: &DynamicObject,
    delete: bool,
    grace: Option<i64>,
) -> Option<Value> {
    let annotation = |key: &str| {
        rule.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let respect = if delete { "false" } else { "true" };
    let grace = grace.filter(|s| *s >= 0).map(|s| s.to_string());
    if effect(rule) == "NoExecute"
        && annotation(CONFIRM_ANNOTATION) == Some("true")
        && annotation(EVICTION_API_ANNOTATION) == Some(respect)
        && annotation(GRACE_PERIOD_ANNOTATION) == grace.as_deref()
    {
        return None;
    }
    Some(json!({
        "metadata": {"annotations": {
            CONFIRM_ANNOTATION: "true",
            EVICTION_API_ANNOTATION: respect,
            // null removes a grace period an earlier run set.
            GRACE_PERIOD_ANNOTATION: grace,
        }},
        "spec": {"taint": {"effect": "NoExecute"}},
    }))
}

/// Turns each rule to `NoExecute`, confirmed; its pods are evicted through
/// the Eviction API, or deleted with `delete` (`--disable-eviction`), each
/// given `grace` seconds when set (`--grace-period`).
pub(crate) async fn evict(
    client: &kube::Client,
    version: RulesVersion,
    rules: &[DynamicObject],
    delete: bool,
    grace: Option<i64>,
) -> Result<(), String> {
    let patch_of = |rule: &DynamicObject| no_execute_patch(rule, delete, grace);
    patch_rules(client, version, rules, patch_of, "NoExecute").await
}

/// Deletes the node's drain rules (of `driver`'s devices, when given);
/// returns their names.
pub(crate) async fn uncordon(
    client: &kube::Client,
    version: RulesVersion,
    node: &str,
    driver: Option<&str>,
) -> Result<Vec<String>, String> {
    let names: Vec<String> = rules_of(client, version, node, driver)
        .await?
        .into_iter()
        .filter_map(|r| r.metadata.name)
        .collect();
    delete_rules(client, version, &names).await
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
mod tests;
