//! A `NodeScalingWatermark` as the controller reads it: the spec with the
//! contract's defaults filled in, checked entry by entry (a bad entry is
//! `Invalid` on its own; the others go on).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::runtime::resource::{view_accessors, view_resource};
use serde_json::Value;

use super::sizing::Bounds;
use crate::model::requests::{ResourceList, parse_list, written_list};

pub const GROUP: &str = "dra-claim-controller.io";
pub const VERSION: &str = "v1alpha1";
pub(crate) const KIND: &str = "NodeScalingWatermark";
pub const PLURAL: &str = "nodescalingwatermarks";

/// Defaults of the seed operator, kept so that its users change only the
/// apiVersion.
pub(crate) const DEFAULT_NODE_SELECTOR: (&str, &str) = ("node-role.kubernetes.io/worker", "");
pub(crate) const DEFAULT_PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
pub(crate) const DEFAULT_PAUSE_CPU: &str = "200m";
pub(crate) const DEFAULT_PAUSE_MEMORY: &str = "200Mi";
/// The chart's PriorityClass for placeholders (value -1, never preempts).
pub const DEFAULT_PRIORITY_CLASS: &str = "dra-headroom";

/// A `NodeScalingWatermark`: its metadata, spec, and the conditions of its
/// status (kept so that a condition's transition time survives syncs).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WatermarkView {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: WatermarkSpec,
    #[serde(default)]
    pub status: WatermarkStatusView,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct WatermarkStatusView {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Placeholders released by yields so far.
    #[serde(default)]
    pub yields: u64,
}

/// A status condition, as `metav1.Condition` spells it.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

view_resource!(
    WatermarkView,
    k8s_openapi::NamespaceResourceScope,
    GROUP,
    VERSION,
    KIND,
    PLURAL
);

view_accessors!(WatermarkView);

/// Conditions for a new status: each keeps its transition time when its
/// status did not change since `old`, else takes `now`.
pub(crate) fn carry_transitions(
    old: &[Condition],
    mut new: Vec<Condition>,
    now: &str,
) -> Vec<Condition> {
    for c in &mut new {
        c.last_transition_time = old
            .iter()
            .find(|o| {
                o.type_ == c.type_ && o.status == c.status && !o.last_transition_time.is_empty()
            })
            .map(|o| o.last_transition_time.clone())
            .unwrap_or_else(|| now.to_string());
    }
    new
}

/// The spec as written (only what the controller reads).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatermarkSpec {
    #[serde(default)]
    pub watermark_percentage: u32,
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub tolerations: Vec<Value>,
    #[serde(default)]
    pub pause_pod_size: BTreeMap<String, Value>,
    pub pause_pod_image: Option<String>,
    pub priority_class_name: Option<String>,
    #[serde(default)]
    pub min_placeholders: u32,
    pub max_placeholders: Option<u32>,
    #[serde(default)]
    pub devices: Vec<DeviceEntrySpec>,
}

/// One `devices[]` entry as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceEntrySpec {
    pub name: String,
    pub device_class_name: String,
    #[serde(default)]
    pub selectors: Vec<Value>,
    pub count: Option<u32>,
    pub watermark_percentage: Option<u32>,
    #[serde(default)]
    pub min_placeholders: u32,
    pub max_placeholders: Option<u32>,
}

/// The CPU/memory entry, settled.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuMemoryEntry {
    pub percentage: u32,
    /// What one placeholder requests: cpu and memory (defaulted each), and
    /// any other resource `pausePodSize` names.
    pub pause: ResourceList,
    /// `pausePodSize` as the placeholder's container requests it.
    pub pause_requests: BTreeMap<String, String>,
    pub bounds: Bounds,
}

/// What the placeholders of every entry share.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Value>,
    pub image: String,
    pub priority_class_name: String,
}

/// The spec settled: defaults filled in, quantities parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    pub placement: Placement,
    pub cpu_memory: Result<CpuMemoryEntry, String>,
}

impl WatermarkSpec {
    /// The spec with the contract's defaults; a pause pod size that does
    /// not parse makes the CPU/memory entry `Err` with the field named.
    pub fn settle(&self) -> Settled {
        let node_selector = self.node_selector.clone().unwrap_or_else(|| {
            BTreeMap::from([(
                DEFAULT_NODE_SELECTOR.0.to_string(),
                DEFAULT_NODE_SELECTOR.1.to_string(),
            )])
        });
        let placement = Placement {
            node_selector,
            tolerations: self.tolerations.clone(),
            image: self
                .pause_pod_image
                .clone()
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| DEFAULT_PAUSE_IMAGE.into()),
            priority_class_name: self
                .priority_class_name
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| DEFAULT_PRIORITY_CLASS.into()),
        };
        Settled {
            placement,
            cpu_memory: self.cpu_memory(),
        }
    }

    fn cpu_memory(&self) -> Result<CpuMemoryEntry, String> {
        if !(1..=100).contains(&self.watermark_percentage) {
            return Err(format!(
                "spec.watermarkPercentage is {}; it must be 1 to 100",
                self.watermark_percentage
            ));
        }
        let mut requests = BTreeMap::new();
        for (resource, default) in [("cpu", DEFAULT_PAUSE_CPU), ("memory", DEFAULT_PAUSE_MEMORY)] {
            if !self.pause_pod_size.contains_key(resource) {
                requests.insert(resource.to_string(), default.to_string());
            }
        }
        // Every resource name counts (device-plugin GPUs, hugepages, ...).
        requests.extend(written_list("spec.pausePodSize", &self.pause_pod_size)?);
        Ok(CpuMemoryEntry {
            percentage: self.watermark_percentage,
            pause: parse_list(requests.clone()),
            pause_requests: requests,
            bounds: Bounds {
                min: self.min_placeholders,
                max: self.max_placeholders,
            },
        })
    }
}

/// Whether a node's labels satisfy a watermark's node selector (equality
/// on every key, as `nodeSelector` on a pod).
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> WatermarkSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn seed_defaults_fill_in() {
        let settled = spec(json!({"watermarkPercentage": 20})).settle();
        assert_eq!(
            settled.placement.node_selector,
            BTreeMap::from([("node-role.kubernetes.io/worker".into(), String::new())])
        );
        assert_eq!(settled.placement.image, "registry.k8s.io/pause:3.10");
        assert_eq!(settled.placement.priority_class_name, "dra-headroom");
        let cpu = settled.cpu_memory.unwrap();
        assert_eq!(cpu.pause_requests["cpu"], "200m");
        assert_eq!(cpu.pause_requests["memory"], "200Mi");
        assert_eq!(cpu.bounds, Bounds { min: 0, max: None });
    }

    #[test]
    fn bad_values_name_the_field() {
        let rows = [
            (
                json!({"watermarkPercentage": 0}),
                "spec.watermarkPercentage",
            ),
            (
                json!({"watermarkPercentage": 101}),
                "spec.watermarkPercentage",
            ),
            (
                json!({"watermarkPercentage": 10, "pausePodSize": {"cpu": "lots"}}),
                "spec.pausePodSize.cpu",
            ),
            (
                json!({"watermarkPercentage": 10, "pausePodSize": {"memory": {"a": 1}}}),
                "spec.pausePodSize.memory",
            ),
        ];
        for (v, field) in rows {
            let err = spec(v.clone()).settle().cpu_memory.unwrap_err();
            assert!(err.contains(field), "{v}: {err}");
        }
        let numeric = spec(json!({"watermarkPercentage": 10, "pausePodSize": {"cpu": 1}}));
        assert_eq!(
            numeric.settle().cpu_memory.unwrap().pause_requests["cpu"],
            "1"
        );
    }

    #[test]
    fn condition_transitions_survive_unchanged_status() {
        let cond = |t: &str, s: &str, at: &str| Condition {
            type_: t.into(),
            status: s.into(),
            last_transition_time: at.into(),
            ..Default::default()
        };
        let old = [
            cond("Ready", "True", "t0"),
            cond("ScaleUpPending", "False", "t0"),
        ];
        let new = carry_transitions(
            &old,
            vec![
                cond("Ready", "True", ""),
                cond("ScaleUpPending", "True", ""),
                cond("Invalid", "False", ""),
            ],
            "t1",
        );
        let times: Vec<&str> = new
            .iter()
            .map(|c| c.last_transition_time.as_str())
            .collect();
        assert_eq!(times, ["t0", "t1", "t1"]);
    }

    #[test]
    fn node_selection_is_equality_on_every_key() {
        let selector = BTreeMap::from([("pool".to_string(), "gpu".to_string())]);
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(selects(
            &selector,
            &labels(&[("pool", "gpu"), ("zone", "a")])
        ));
        assert!(!selects(&selector, &labels(&[("pool", "cpu")])));
        assert!(!selects(&selector, &labels(&[])));
        assert!(selects(&BTreeMap::new(), &labels(&[])));
    }
}
