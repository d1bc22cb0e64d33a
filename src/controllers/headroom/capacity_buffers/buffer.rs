//! The cluster-autoscaler's `CapacityBuffer` (`autoscaling.x-k8s.io`) with
//! our provisioning strategy, `dra-claim-controller.io/placeholder-pods`:
//! real placeholder pods instead of the autoscaler's in-memory ones, which
//! carry no claims and so fit nowhere for a pod template that uses
//! ResourceClaimTemplates. Pure: the count as the autoscaler's buffer
//! controller computes it, the placeholders' Deployment, the status.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::controllers::headroom::watermarks::watermark::{
    Condition, DEFAULT_PAUSE_IMAGE, DEFAULT_PRIORITY_CLASS,
};
use crate::model::requests::{ResourceList, parse_list, written_list};
use crate::naming::{PLACEHOLDER_GATE, WATERMARK_ENTRY_LABEL, WATERMARK_LABEL};
use crate::runtime::resource::view_accessors;

/// Our provisioning strategy: the autoscaler leaves such buffers to us.
pub(crate) const STRATEGY: &str = "dra-claim-controller.io/placeholder-pods";
pub const GROUP: &str = "autoscaling.x-k8s.io";
/// Newest first: the one the cluster serves is used.
pub const VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];
pub(crate) const KIND: &str = "CapacityBuffer";
pub const PLURAL: &str = "capacitybuffers";
/// The watermark entry label of a buffer's placeholders: they are device
/// placeholders for the yield when their pods have claims.
pub(crate) const BUFFER_ENTRY: &str = "capacitybuffer";

/// A CapacityBuffer as read (any served version: the fields read are the
/// same in v1alpha1 and v1beta1).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct BufferView {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: BufferSpec,
    #[serde(default)]
    pub status: BufferStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BufferSpec {
    pub provisioning_strategy: Option<String>,
    pub pod_template_ref: Option<NameRef>,
    pub scalable_ref: Option<ScalableRef>,
    pub replicas: Option<i32>,
    pub percentage: Option<i32>,
    pub limits: Option<BTreeMap<String, Value>>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct NameRef {
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScalableRef {
    #[serde(default)]
    pub api_group: String,
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct BufferStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

view_accessors!(BufferView);

/// The CapacityBuffer version the cluster serves (found at start).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BufferApi {
    pub version: String,
}

impl BufferApi {
    pub fn api_version(&self) -> String {
        format!("{GROUP}/{}", self.version)
    }
}

impl kube::Resource for BufferView {
    type DynamicType = BufferApi;
    // Namespaced, with the version known only at run time.
    type Scope = kube::core::DynamicResourceScope;

    fn kind(_: &BufferApi) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(KIND)
    }
    fn group(_: &BufferApi) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(GROUP)
    }
    fn version(api: &BufferApi) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Owned(api.version.clone())
    }
    fn plural(_: &BufferApi) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(PLURAL)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl BufferSpec {
    /// Whether the buffer asks for our strategy (the autoscaler acts only
    /// on its own, `buffer.x-k8s.io/active-capacity` or empty).
    pub(crate) fn is_ours(&self) -> bool {
        self.provisioning_strategy.as_deref() == Some(STRATEGY)
    }

    /// `limits`, parsed; or which key does not parse.
    pub fn limits(&self) -> Result<Option<ResourceList>, String> {
        self.limits
            .as_ref()
            .map(|limits| written_list("spec.limits", limits).map(parse_list))
            .transpose()
    }
}

/// The number of placeholders, as the autoscaler's buffer controller
/// counts chunks: the larger of `replicas` and `percentage` of the
/// scalable object's replicas (rounded up), whichever are set; capped by
/// `limits` (how many pods of these requests fit, per resource both name,
/// rounded down); only `limits`: that many.
pub(crate) fn buffer_replicas(
    replicas: Option<i32>,
    percentage: Option<i32>,
    scalable_replicas: Option<i32>,
    limits: Option<&ResourceList>,
    pod_requests: &ResourceList,
) -> Result<u32, String> {
    let mut wanted: Option<i64> = replicas.map(|r| i64::from(r.max(0)));
    if let (Some(pct), Some(of)) = (percentage, scalable_replicas) {
        let from_pct = if pct <= 0 || of <= 0 {
            0
        } else {
            (i64::from(pct) * i64::from(of) + 99) / 100
        };
        wanted = Some(wanted.map_or(from_pct, |w| w.max(from_pct)));
    }
    let capped = match limits {
        Some(limits) => {
            let fit = pods_within(limits, pod_requests)?;
            Some(wanted.map_or(fit, |w| w.min(fit)))
        }
        None => wanted,
    };
    let n = capped.ok_or("replicas, percentage and limits are not defined")?;
    Ok(u32::try_from(n.max(0)).unwrap_or(u32::MAX))
}

/// How many pods of `requests` fit within `limits`: the least over the
/// resources both name (requests of zero do not count).
fn pods_within(limits: &ResourceList, requests: &ResourceList) -> Result<i64, String> {
    let fits = requests
        .iter()
        .filter(|(_, q)| q.nanos() > 0)
        .filter_map(|(name, q)| Some(limits.get(name)?.nanos() / q.nanos()))
        .filter(|n| *n >= 0)
        .min();
    fits.map(|n| i64::try_from(n).unwrap_or(i64::MAX))
        .ok_or_else(|| "resources in configured limits not found in the pod template".to_string())
}

/// The label value naming a buffer on its placeholders (a label value
/// holds at most 63 characters; `cb.` keeps it apart from watermarks).
pub(crate) fn placeholder_label(buffer: &str) -> String {
    let mut v = format!("cb.{buffer}");
    v.truncate(63);
    v.trim_end_matches(['-', '.', '_']).to_string()
}

/// The placeholder pod made from the buffer's pod template: its requests,
/// claims and where it may run are kept (containers' resources,
/// `resourceClaims`, node selector, affinity, tolerations, topology spread,
/// runtime class and scheduler); everything that runs something is not
/// (each container becomes the pause image, no init containers, volumes or
/// service account). The placeholders' priority class, and with claims the
/// yield's scheduling gate, as device placeholders have.
pub(crate) fn placeholder_pod(template_spec: &Value, buffer: &str) -> Value {
    let keep = [
        "nodeSelector",
        "affinity",
        "tolerations",
        "topologySpreadConstraints",
        "runtimeClassName",
        "schedulerName",
        "resourceClaims",
        "resources",
    ];
    let mut spec = serde_json::Map::new();
    for key in keep {
        if let Some(v) = template_spec.get(key).filter(|v| !v.is_null()) {
            spec.insert(key.to_string(), v.clone());
        }
    }
    let containers: Vec<Value> = template_spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let mut placeholder = json!({
                "name": c["name"].as_str().map_or_else(|| format!("pause-{i}"), str::to_string),
                "image": DEFAULT_PAUSE_IMAGE,
            });
            if !c["resources"].is_null() {
                placeholder["resources"] = c["resources"].clone();
            }
            placeholder
        })
        .collect();
    spec.insert("containers".into(), json!(containers));
    spec.insert("priorityClassName".into(), json!(DEFAULT_PRIORITY_CLASS));
    spec.insert("terminationGracePeriodSeconds".into(), json!(0));
    spec.insert("automountServiceAccountToken".into(), json!(false));
    spec.insert("enableServiceLinks".into(), json!(false));
    let has_claims = template_spec["resourceClaims"]
        .as_array()
        .is_some_and(|c| !c.is_empty());
    if has_claims {
        spec.insert(
            "schedulingGates".into(),
            json!([{"name": PLACEHOLDER_GATE}]),
        );
    }
    json!({
        "metadata": {
            "labels": {WATERMARK_LABEL: placeholder_label(buffer), WATERMARK_ENTRY_LABEL: BUFFER_ENTRY},
            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
        },
        "spec": Value::Object(spec),
    })
}

/// The Deployment keeping `replicas` placeholders of `pod` for the buffer.
pub fn deployment(buffer: &BufferView, api_version: &str, pod: Value, replicas: u32) -> Value {
    let name = format!("{}-placeholders", buffer.name());
    let label = placeholder_label(buffer.name());
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": buffer.namespace(),
            "labels": {WATERMARK_LABEL: label, WATERMARK_ENTRY_LABEL: BUFFER_ENTRY},
            "ownerReferences": [{
                "apiVersion": api_version,
                "kind": KIND,
                "name": buffer.name(),
                "uid": buffer.uid(),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {WATERMARK_LABEL: label, WATERMARK_ENTRY_LABEL: BUFFER_ENTRY}},
            "template": pod,
        },
    })
}

/// The buffer's status after a sync, in the autoscaler's terms:
/// `ReadyForProvisioning` and `Provisioning`, `replicas`, the strategy.
pub(crate) fn status_patch(
    old: &[Condition],
    outcome: Result<u32, &str>,
    generation: Option<i64>,
    now: &str,
) -> Value {
    let condition = |type_: &str, on: bool, reason: &str, message: String| Condition {
        type_: type_.into(),
        status: if on { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: now.into(),
        observed_generation: generation,
    };
    let (ready, provisioning, replicas) = match outcome {
        Ok(n) => (
            condition(
                "ReadyForProvisioning",
                true,
                "AttributesSetSuccessfully",
                "ready".into(),
            ),
            if n == 0 {
                condition(
                    "Provisioning",
                    false,
                    "BufferIsEmpty",
                    "CapacityBuffer has zero replicas".into(),
                )
            } else {
                condition(
                    "Provisioning",
                    true,
                    "PlaceholderPodsCreated",
                    format!("{n} placeholder pod(s) kept by dra-claim-controller"),
                )
            },
            Some(n),
        ),
        Err(why) => (
            condition(
                "ReadyForProvisioning",
                false,
                "error",
                format!("Buffer not ready for provisioning: {why}"),
            ),
            condition(
                "Provisioning",
                false,
                "NotReadyForProvisioning",
                "CapacityBuffer is not ready for provisioning".into(),
            ),
            None,
        ),
    };
    // A condition keeps its transition time while its status stays.
    let carried: Vec<Condition> = [ready, provisioning]
        .into_iter()
        .map(|mut c| {
            if let Some(o) = old
                .iter()
                .find(|o| o.type_ == c.type_ && o.status == c.status)
            {
                c.last_transition_time = o.last_transition_time.clone();
            }
            c
        })
        .collect();
    let mut conditions: Vec<Condition> = old
        .iter()
        .filter(|o| !carried.iter().any(|c| c.type_ == o.type_))
        .cloned()
        .collect();
    conditions.extend(carried);
    json!({"status": {
        "replicas": replicas,
        "provisioningStrategy": STRATEGY,
        "conditions": conditions,
    }})
}

#[cfg(test)]
mod tests;
