//! The seed operator's `NodeScalingWatermark` (`redhatcop.redhat.io/v1alpha1`,
//! redhat-cop's proactive-node-scaling-operator), served with the seed's
//! own semantics so that its manifests work here unchanged: which pods
//! count, how their requests add up, how many placeholders that makes, the
//! Deployment that keeps them and the conditions of its status. Pure; the
//! controller reads the stores and writes.
//!
//! One deliberate difference: finished pods (Succeeded, Failed) hold
//! nothing on their node and are not counted (the seed counts every pod
//! bound to a node, finished Job pods included).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Value, json};

use super::watermark::{Condition, DEFAULT_PAUSE_IMAGE, selects};
use crate::model::requests::{ResourceList, add_into, parse_list};
use crate::model::views::{NodeView, PodView};
use crate::naming::SEED_PLACEHOLDER_LABEL;
use crate::runtime::resource::{view_accessors, view_resource};

pub const GROUP: &str = "redhatcop.redhat.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "NodeScalingWatermark";
pub const PLURAL: &str = "nodescalingwatermarks";

/// The seed's defaults (its CRD applies them; repeated here for objects
/// written before the CRD had them).
pub const DEFAULT_NODE_SELECTOR: (&str, &str) = ("node-role.kubernetes.io/worker", "");
pub const DEFAULT_PRIORITY_CLASS: &str = "proactive-node-autoscaling-pods";
/// The seed's default image, `k8s.gcr.io/pause`, is in a frozen registry:
/// it is read as the current pause image.
pub const FROZEN_DEFAULT_IMAGE: &str = "k8s.gcr.io/pause";

/// The label key of the seed's Deployments and placeholder pods (value: the
/// watermark's name).
pub const SEED_WATERMARK_NAME_LABEL: &str = "watermark";

/// Resources a pod may request without a limit.
const OVERCOMMITTABLE: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// The seed's condition types and reasons (its spelling, kept).
pub const RECONCILE_SUCCESS: &str = "ReconcileSuccess";
pub const RECONCILE_ERROR: &str = "ReconcileError";
pub const REASON_SUCCEEDED: &str = "LastReconcileCycleSucceded";
pub const REASON_FAILED: &str = "LastReconcileCycleFailed";

/// A seed `NodeScalingWatermark` as written.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SeedWatermarkView {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SeedSpec,
    #[serde(default)]
    pub status: SeedStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeedSpec {
    #[serde(default)]
    pub watermark_percentage: u32,
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub tolerations: Vec<Value>,
    pub pause_pod_size: Option<BTreeMap<String, Value>>,
    pub pause_pod_image: Option<String>,
    pub priority_class_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct SeedStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

view_accessors!(SeedWatermarkView);
view_resource!(
    SeedWatermarkView,
    k8s_openapi::NamespaceResourceScope,
    GROUP,
    VERSION,
    KIND,
    PLURAL
);

impl SeedSpec {
    /// `nodeSelector`, defaulted; an explicit `{}` selects every node.
    pub fn node_selector(&self) -> BTreeMap<String, String> {
        self.node_selector.clone().unwrap_or_else(|| {
            BTreeMap::from([(
                DEFAULT_NODE_SELECTOR.0.to_string(),
                DEFAULT_NODE_SELECTOR.1.to_string(),
            )])
        })
    }

    /// `pausePodSize` as written (any resource name), defaulted; or what is
    /// wrong with it. A zero or negative size would divide by zero or make
    /// a negative count (the seed then fails on a rejected write): here it
    /// is refused, naming the key.
    pub fn pause_pod_size(&self) -> Result<BTreeMap<String, String>, String> {
        let Some(size) = &self.pause_pod_size else {
            return Ok(BTreeMap::from([
                ("cpu".to_string(), "200m".to_string()),
                ("memory".to_string(), "200Mi".to_string()),
            ]));
        };
        let mut out = BTreeMap::new();
        for (name, value) in size {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => {
                    return Err(format!(
                        "spec.pausePodSize.{name}: {other} is not a quantity"
                    ));
                }
            };
            let quantity = crate::allocate::quantity::Quantity::parse(&text).map_err(|e| {
                format!("spec.pausePodSize.{name}: {text:?} is not a quantity ({e})")
            })?;
            if quantity.sign() <= 0 {
                return Err(format!(
                    "spec.pausePodSize.{name}: {text} must be more than zero (a placeholder of size zero holds nothing)"
                ));
            }
            out.insert(name.clone(), text);
        }
        Ok(out)
    }

    pub fn image(&self) -> String {
        match self.pause_pod_image.as_deref() {
            None | Some("") | Some(FROZEN_DEFAULT_IMAGE) => DEFAULT_PAUSE_IMAGE.to_string(),
            Some(image) => image.to_string(),
        }
    }

    pub fn priority_class_name(&self) -> String {
        self.priority_class_name
            .clone()
            .unwrap_or_else(|| DEFAULT_PRIORITY_CLASS.to_string())
    }
}

/// Whether the seed counts `pod` on the nodes `selected` accepts: bound
/// there, not in `kube-*`, `openshift-*` or `default`, not a placeholder
/// (the seed's label, any value, or ours), not being deleted; and, unlike
/// the seed, not finished.
pub fn counts(pod: &PodView, selected: impl Fn(&str) -> bool) -> bool {
    let ns = pod.namespace();
    pod.node_name().is_some_and(selected)
        && !ns.starts_with("kube-")
        && !ns.starts_with("openshift-")
        && ns != "default"
        && !pod.is_placeholder()
        && !pod.is_deleting()
        && !pod.is_terminal()
}

/// The nodes a seed watermark selects: every label of its selector, exactly.
pub fn selected_nodes<'a>(
    spec: &SeedSpec,
    nodes: impl IntoIterator<Item = &'a NodeView>,
) -> Vec<String> {
    let selector = spec.node_selector();
    nodes
        .into_iter()
        .filter(|n| selects(&selector, n.labels()))
        .map(|n| n.name().to_string())
        .collect()
}

/// What the counted pods request, as the seed adds it up: the main
/// containers' requests only (no init containers, no overhead), every
/// resource name.
pub fn used<'a>(pods: impl IntoIterator<Item = &'a PodView>) -> ResourceList {
    let mut sum = ResourceList::new();
    for pod in pods {
        add_into(&mut sum, &pod.spec.container_requests);
    }
    sum
}

/// The seed's count: for each resource of the pause pod's size that the
/// pods use, `used × percentage / 100 / size`, in floating point as the
/// seed computes it; the largest, truncated. (1 CPU used at 60 % with
/// 200m placeholders is 2.9999999999999996, so 2, as the seed says.)
pub fn placeholders(used: &ResourceList, percentage: u32, size: &BTreeMap<String, String>) -> u32 {
    let size = parse_list(size.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut replicas = 0f64;
    for (name, per) in &size {
        let Some(total) = used.get(name) else {
            continue;
        };
        let needed = total.as_approximate_float() * f64::from(percentage)
            / 100.0
            / per.as_approximate_float();
        if needed.is_finite() {
            replicas = replicas.max(needed);
        }
    }
    // Truncation, as the seed's int64 conversion; at most u32::MAX.
    replicas.min(f64::from(u32::MAX)) as u32
}

/// The Deployment that keeps a seed watermark's placeholders, shaped as
/// the seed's template renders it: named as the watermark, its pods
/// labelled `watermark: <name>` and with the seed's placeholder label,
/// the watermark's node selector, tolerations and priority class, one
/// `pause` container requesting `pausePodSize`.
pub fn deployment(wm: &SeedWatermarkView, size: &BTreeMap<String, String>, replicas: u32) -> Value {
    let name = wm.name();
    let mut resources = json!({"requests": size});
    // Extended resources (device-plugin GPUs) and hugepages cannot be
    // overcommitted: the API server requires their limit, equal to the
    // request. (The seed's template sets requests only, so the API server
    // refuses its Deployment for such a size.)
    let limits: BTreeMap<&String, &String> = size
        .iter()
        .filter(|(k, _)| !OVERCOMMITTABLE.contains(&k.as_str()))
        .collect();
    if !limits.is_empty() {
        resources["limits"] = json!(limits);
    }
    let mut pod = json!({
        "enableServiceLinks": false,
        "automountServiceAccountToken": false,
        "priorityClassName": wm.spec.priority_class_name(),
        "containers": [{
            "name": "pause",
            "image": wm.spec.image(),
            "resources": resources,
        }],
    });
    let selector = wm.spec.node_selector();
    if !selector.is_empty() {
        pod["nodeSelector"] = json!(selector);
    }
    if !wm.spec.tolerations.is_empty() {
        pod["tolerations"] = json!(wm.spec.tolerations);
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": wm.namespace(),
            "labels": {SEED_WATERMARK_NAME_LABEL: name},
            "ownerReferences": [{
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "kind": KIND,
                "name": name,
                "uid": wm.uid(),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {SEED_WATERMARK_NAME_LABEL: name}},
            "template": {
                "metadata": {"labels": {SEED_WATERMARK_NAME_LABEL: name, SEED_PLACEHOLDER_LABEL: ""}},
                "spec": pod,
            },
        },
    })
}

/// The seed's status after a sync: `ReconcileSuccess`, or `ReconcileError`
/// with the message, replacing the condition of the same type only (as the
/// seed does: an older error stays beside a later success).
pub fn conditions(
    old: &[Condition],
    outcome: Result<(), &str>,
    generation: Option<i64>,
    now: &str,
) -> Vec<Condition> {
    let new = match outcome {
        Ok(()) => Condition {
            type_: RECONCILE_SUCCESS.into(),
            status: "True".into(),
            reason: REASON_SUCCEEDED.into(),
            message: String::new(),
            last_transition_time: now.into(),
            observed_generation: generation,
        },
        Err(message) => Condition {
            type_: RECONCILE_ERROR.into(),
            status: "True".into(),
            reason: REASON_FAILED.into(),
            message: message.into(),
            last_transition_time: now.into(),
            observed_generation: generation,
        },
    };
    let mut out: Vec<Condition> = old
        .iter()
        .filter(|c| c.type_ != new.type_)
        .cloned()
        .collect();
    out.push(new);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(pairs: &[(&str, &str)]) -> ResourceList {
        parse_list(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    fn size(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The seed's formula, rows from its float pipeline.
    #[test]
    fn seed_count_table() {
        let default_size = size(&[("cpu", "200m"), ("memory", "200Mi")]);
        let rows = [
            (
                "1 CPU at 60 %: 2.9999999999999996 truncates to 2",
                list(&[("cpu", "1")]),
                60,
                default_size.clone(),
                2,
            ),
            (
                "2 CPU at 30 %: 2.9999999999999996",
                list(&[("cpu", "2")]),
                30,
                default_size.clone(),
                2,
            ),
            (
                "1.5 CPU at 40 %",
                list(&[("cpu", "1500m")]),
                40,
                default_size.clone(),
                2,
            ),
            (
                "3 CPU at 10 %",
                list(&[("cpu", "3")]),
                10,
                default_size.clone(),
                1,
            ),
            (
                "1 CPU at 20 %: exactly 1",
                list(&[("cpu", "1")]),
                20,
                default_size.clone(),
                1,
            ),
            (
                "1Gi at 20 % in 200Mi: 1.024",
                list(&[("memory", "1Gi")]),
                20,
                default_size.clone(),
                1,
            ),
            (
                "3Gi at 20 % in 200Mi: 3.072",
                list(&[("memory", "3Gi")]),
                20,
                default_size.clone(),
                3,
            ),
            (
                "the most constraining resource wins",
                list(&[("cpu", "1"), ("memory", "3Gi")]),
                20,
                default_size.clone(),
                3,
            ),
            ("nothing used", list(&[]), 20, default_size.clone(), 0),
            (
                "a used resource the pause pod does not name is ignored",
                list(&[("ephemeral-storage", "100Gi")]),
                100,
                default_size.clone(),
                0,
            ),
            (
                "device-plugin GPUs",
                list(&[("nvidia.com/gpu", "7")]),
                50,
                size(&[("nvidia.com/gpu", "1")]),
                3,
            ),
        ];
        for (name, used, percentage, size, want) in rows {
            assert_eq!(placeholders(&used, percentage, &size), want, "{name}");
        }
    }

    fn pod(v: Value) -> PodView {
        let mut v = v;
        if v["metadata"].get("name").is_none() {
            v["metadata"]["name"] = json!("p");
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn which_pods_the_seed_counts() {
        let selected = |n: &str| n == "w1";
        let on = |ns: &str| json!({"metadata": {"namespace": ns}, "spec": {"nodeName": "w1"}, "status": {"phase": "Running"}});
        let rows = [
            ("a workload pod", pod(on("team")), true),
            ("kube-system", pod(on("kube-system")), false),
            (
                "openshift-monitoring",
                pod(on("openshift-monitoring")),
                false,
            ),
            ("default", pod(on("default")), false),
            (
                "defaulting (only default itself is out)",
                pod(on("defaulting")),
                true,
            ),
            (
                "the seed's placeholder (empty label value)",
                pod({
                    let mut p = on("team");
                    p["metadata"]["labels"] = json!({SEED_PLACEHOLDER_LABEL: ""});
                    p
                }),
                false,
            ),
            (
                "being deleted",
                pod({
                    let mut p = on("team");
                    p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                    p
                }),
                false,
            ),
            (
                "finished (our deliberate difference)",
                pod({
                    let mut p = on("team");
                    p["status"]["phase"] = json!("Succeeded");
                    p
                }),
                false,
            ),
            (
                "another node",
                pod({
                    let mut p = on("team");
                    p["spec"]["nodeName"] = json!("w2");
                    p
                }),
                false,
            ),
        ];
        for (name, p, want) in rows {
            assert_eq!(counts(&p, selected), want, "{name}");
        }
    }

    #[test]
    fn requests_are_the_main_containers_only() {
        let p = pod(json!({"metadata": {"namespace": "team"}, "spec": {
            "containers": [{"resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}},
                           {"resources": {"requests": {"cpu": "500m"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "8"}}}],
            "overhead": {"cpu": "1"}}}));
        assert_eq!(
            used([&p]),
            list(&[("cpu", "1500m"), ("nvidia.com/gpu", "1")])
        );
    }

    #[test]
    fn defaults_and_refusals() {
        let spec: SeedSpec = serde_json::from_value(json!({"watermarkPercentage": 20})).unwrap();
        assert_eq!(
            spec.node_selector(),
            BTreeMap::from([("node-role.kubernetes.io/worker".to_string(), String::new())])
        );
        assert_eq!(
            spec.pause_pod_size().unwrap(),
            size(&[("cpu", "200m"), ("memory", "200Mi")])
        );
        assert_eq!(spec.priority_class_name(), DEFAULT_PRIORITY_CLASS);
        assert_eq!(spec.image(), DEFAULT_PAUSE_IMAGE);
        let only_cpu: SeedSpec =
            serde_json::from_value(json!({"pausePodSize": {"cpu": "1"}})).unwrap();
        assert_eq!(
            only_cpu.pause_pod_size().unwrap(),
            size(&[("cpu", "1")]),
            "no memory default added"
        );
        let zero: SeedSpec = serde_json::from_value(json!({"pausePodSize": {"cpu": "0"}})).unwrap();
        assert!(
            zero.pause_pod_size()
                .unwrap_err()
                .contains("spec.pausePodSize.cpu")
        );
    }

    #[test]
    fn the_deployment_is_the_seeds_template() {
        let wm: SeedWatermarkView = serde_json::from_value(json!({
            "metadata": {"name": "ai-ml", "namespace": "headroom", "uid": "u1"},
            "spec": {"watermarkPercentage": 20,
                     "nodeSelector": {"machine.openshift.io/cluster-api-machine-type": "ai-ml"},
                     "tolerations": [{"key": "workload", "operator": "Equal", "value": "ai-ml", "effect": "NoSchedule"}]},
        }))
        .unwrap();
        let size = wm.spec.pause_pod_size().unwrap();
        let d = deployment(&wm, &size, 4);
        assert_eq!(d["metadata"]["name"], "ai-ml");
        assert_eq!(d["spec"]["replicas"], 4);
        assert_eq!(
            d["spec"]["selector"]["matchLabels"],
            json!({"watermark": "ai-ml"})
        );
        let pod = &d["spec"]["template"];
        assert_eq!(
            pod["metadata"]["labels"],
            json!({"watermark": "ai-ml", SEED_PLACEHOLDER_LABEL: ""})
        );
        assert_eq!(pod["spec"]["priorityClassName"], DEFAULT_PRIORITY_CLASS);
        assert_eq!(pod["spec"]["tolerations"][0]["value"], "ai-ml");
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"],
            json!({"cpu": "200m", "memory": "200Mi"})
        );
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
        assert!(
            pod["spec"]["containers"][0]["resources"]
                .get("limits")
                .is_none()
        );
        let gpus: SeedWatermarkView = serde_json::from_value(json!({
            "metadata": {"name": "gpus", "namespace": "headroom", "uid": "u2"},
            "spec": {"watermarkPercentage": 50, "pausePodSize": {"nvidia.com/gpu": 1, "cpu": "100m"}},
        }))
        .unwrap();
        let size = gpus.spec.pause_pod_size().unwrap();
        let d = deployment(&gpus, &size, 1);
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["resources"],
            json!({"requests": {"cpu": "100m", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}),
            "extended resources need their limit"
        );
        assert_eq!(
            d["metadata"]["ownerReferences"][0]["apiVersion"],
            "redhatcop.redhat.io/v1alpha1"
        );
    }

    #[test]
    fn conditions_are_replaced_by_type_only() {
        let failed = conditions(&[], Err("boom"), Some(1), "t1");
        let then_ok = conditions(&failed, Ok(()), Some(2), "t2");
        let types: Vec<&str> = then_ok.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [RECONCILE_ERROR, RECONCILE_SUCCESS]);
        assert_eq!(then_ok[1].reason, REASON_SUCCEEDED);
    }
}
