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

use crate::controllers::headroom::watermarks::watermark::{
    Condition, DEFAULT_PAUSE_IMAGE, selects,
};
use crate::model::requests::{ResourceList, add_into, parse_list, written_list};
use crate::model::views::{NodeView, PodView};
use crate::naming::SEED_PLACEHOLDER_LABEL;
use crate::runtime::resource::{view_accessors, view_resource};

pub const GROUP: &str = "redhatcop.redhat.io";
pub const VERSION: &str = "v1alpha1";
pub(crate) const KIND: &str = "NodeScalingWatermark";
pub const PLURAL: &str = "nodescalingwatermarks";

/// The seed's defaults (its CRD applies them; repeated here for objects
/// written before the CRD had them).
pub(crate) const DEFAULT_NODE_SELECTOR: (&str, &str) = ("node-role.kubernetes.io/worker", "");
pub const DEFAULT_PRIORITY_CLASS: &str = "proactive-node-autoscaling-pods";
/// The seed's default image, `k8s.gcr.io/pause`, is in a frozen registry:
/// it is read as the current pause image.
pub(crate) const FROZEN_DEFAULT_IMAGE: &str = "k8s.gcr.io/pause";

/// The label key of the seed's Deployments and placeholder pods (value: the
/// watermark's name).
pub(crate) const SEED_WATERMARK_NAME_LABEL: &str = "watermark";

/// Resources a pod may request without a limit.
const OVERCOMMITTABLE: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// The seed's condition types and reasons (its spelling, kept).
pub(crate) const RECONCILE_SUCCESS: &str = "ReconcileSuccess";
pub(crate) const RECONCILE_ERROR: &str = "ReconcileError";
pub(crate) const REASON_SUCCEEDED: &str = "LastReconcileCycleSucceded";
pub(crate) const REASON_FAILED: &str = "LastReconcileCycleFailed";

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
    pub(crate) fn pause_pod_size(&self) -> Result<BTreeMap<String, String>, String> {
        let Some(size) = &self.pause_pod_size else {
            return Ok(BTreeMap::from([
                ("cpu".to_string(), "200m".to_string()),
                ("memory".to_string(), "200Mi".to_string()),
            ]));
        };
        let out = written_list("spec.pausePodSize", size)?;
        for (name, quantity) in parse_list(out.clone()) {
            if quantity.sign() <= 0 {
                return Err(format!(
                    "spec.pausePodSize.{name}: {} must be more than zero (a placeholder of size zero holds nothing)",
                    out[&name]
                ));
            }
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
pub(crate) fn selected_nodes<'a>(
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
mod tests;
