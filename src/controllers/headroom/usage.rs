//! What workloads use on the selected nodes: which pods count, and what a
//! pod weighs in CPU and memory (its effective request, as kube-scheduler
//! computes it).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::Deserialize;

use crate::runtime::resource::{view_accessors, view_resource};

use super::sizing::Resources;
use crate::allocate::quantity::Quantity;

pub use crate::naming::{WATERMARK_ENTRY_LABEL as ENTRY_LABEL, WATERMARK_LABEL};

/// The fields of a pod that headroom reads; serde skips the rest.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HeadroomPod {
    #[serde(default, deserialize_with = "pod_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
    #[serde(default)]
    pub status: PodStatus,
}

/// Name, namespace, UID, resourceVersion, deletion and the watermark and
/// entry labels: a tenant's other labels and annotations are not held.
fn pod_meta<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        deletion_timestamp: Option<Time>,
        #[serde(default)]
        labels: Option<BTreeMap<String, String>>,
    }
    let m = Meta::deserialize(d)?;
    let labels = m.labels.map(|l| {
        l.into_iter()
            .filter(|(k, _)| k == WATERMARK_LABEL || k == ENTRY_LABEL)
            .collect::<BTreeMap<_, _>>()
    });
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        deletion_timestamp: m.deletion_timestamp,
        labels,
        ..Default::default()
    })
}

view_accessors!(HeadroomPod);
view_resource!(
    HeadroomPod,
    k8s_openapi::NamespaceResourceScope,
    "",
    "v1",
    "Pod",
    "pods"
);

/// A node as headroom reads it: its name, labels (what node selectors
/// match) and taints; the rest of a node's metadata and its status are
/// not held.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HeadroomNode {
    #[serde(default, deserialize_with = "node_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NodeSpec,
}

/// The node's taints (the yield checks a waiting pod tolerates them).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeSpec {
    #[serde(default)]
    pub taints: Vec<k8s_openapi::api::core::v1::Taint>,
}

fn node_meta<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        labels: Option<BTreeMap<String, String>>,
    }
    let m = Meta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels,
        ..Default::default()
    })
}

view_resource!(
    HeadroomNode,
    k8s_openapi::ClusterResourceScope,
    "",
    "v1",
    "Node",
    "nodes"
);

impl HeadroomNode {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    pub fn labels(&self) -> &BTreeMap<String, String> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        self.metadata.labels.as_ref().unwrap_or(&EMPTY)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    pub node_name: Option<String>,
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(default)]
    pub init_containers: Vec<Container>,
    #[serde(default)]
    pub overhead: BTreeMap<String, String>,
    /// Resolved from the pod's PriorityClass at admission.
    pub priority: Option<i32>,
    /// How many claim entries the pod has (their content is read live
    /// when the pod waits).
    #[serde(default, deserialize_with = "count_entries")]
    pub resource_claims: usize,
    /// Where the placeholder gate is in `spec.schedulingGates`, if there
    /// (the index a guarded JSON patch removes); other gates are not kept.
    #[serde(
        default,
        rename = "schedulingGates",
        deserialize_with = "placeholder_gate_index"
    )]
    pub placeholder_gate: Option<usize>,
}

fn placeholder_gate_index<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<usize>, D::Error> {
    #[derive(Deserialize)]
    struct Gate {
        #[serde(default)]
        name: String,
    }
    let gates: Option<Vec<Gate>> = Option::deserialize(d)?;
    Ok(gates.and_then(|g| {
        g.iter()
            .position(|g| g.name == super::desired::PLACEHOLDER_GATE)
    }))
}

fn count_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let entries: Option<Vec<serde::de::IgnoredAny>> = Option::deserialize(d)?;
    Ok(entries.map_or(0, |e| e.len()))
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default)]
    pub resources: ContainerResources,
    /// `Always` on an init container makes it a sidecar: it runs beside
    /// the main containers.
    pub restart_policy: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerResources {
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodStatus {
    pub phase: Option<String>,
    /// `PodScheduled=False` with reason `Unschedulable`: kube-scheduler
    /// tried and found no node.
    #[serde(default, rename = "conditions", deserialize_with = "unschedulable")]
    pub unschedulable: bool,
}

fn unschedulable<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    struct Condition {
        #[serde(rename = "type", default)]
        type_: String,
        #[serde(default)]
        status: String,
        #[serde(default)]
        reason: String,
    }
    let conditions: Option<Vec<Condition>> = Option::deserialize(d)?;
    Ok(conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason == "Unschedulable"))
}

fn requests_of(map: &BTreeMap<String, String>) -> Resources {
    // An unparsable quantity cannot be in a pod the API server admitted;
    // counting it as zero keeps a view of a future API harmless.
    let get = |k: &str| {
        map.get(k)
            .and_then(|v| Quantity::parse(v).ok())
            .unwrap_or(Quantity::from_units(0))
    };
    Resources {
        cpu: get("cpu"),
        memory: get("memory"),
    }
}

fn add(a: Resources, b: Resources) -> Resources {
    Resources {
        cpu: a.cpu.checked_add(b.cpu).unwrap_or(a.cpu),
        memory: a.memory.checked_add(b.memory).unwrap_or(a.memory),
    }
}

fn max(a: Resources, b: Resources) -> Resources {
    Resources {
        cpu: a.cpu.max(b.cpu),
        memory: a.memory.max(b.memory),
    }
}

impl HeadroomPod {
    /// The pod's effective request: the larger of what its init phase and
    /// its running phase need, per resource, plus the pod overhead. A
    /// regular init container runs beside the sidecars started before it;
    /// the main containers run beside every sidecar.
    pub fn effective_requests(&self) -> Resources {
        let mut sidecars = Resources::default();
        let mut init_peak = Resources::default();
        for init in &self.spec.init_containers {
            let own = requests_of(&init.resources.requests);
            if init.restart_policy.as_deref() == Some("Always") {
                sidecars = add(sidecars, own);
                init_peak = max(init_peak, sidecars);
            } else {
                init_peak = max(init_peak, add(own, sidecars));
            }
        }
        let running = self
            .spec
            .containers
            .iter()
            .map(|c| requests_of(&c.resources.requests))
            .fold(sidecars, add);
        add(max(init_peak, running), requests_of(&self.spec.overhead))
    }

    /// The watermark whose placeholder this pod is, if any.
    pub fn watermark(&self) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()?
            .get(WATERMARK_LABEL)
            .map(String::as_str)
    }

    /// The watermark entry whose placeholder this pod is, if any.
    pub fn entry(&self) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()?
            .get(ENTRY_LABEL)
            .map(String::as_str)
    }

    /// Whether the pod is a placeholder (of any watermark).
    pub fn is_placeholder(&self) -> bool {
        self.watermark().is_some()
    }

    /// Whether the pod waits for devices as the yield understands it:
    /// unbound, found unschedulable by kube-scheduler, with claims, not a
    /// placeholder, of a priority above `placeholder_priority`.
    pub fn waits_for_devices(&self, placeholder_priority: i32) -> bool {
        self.spec.node_name.is_none()
            && self.status.unschedulable
            && self.spec.resource_claims > 0
            && !self.is_placeholder()
            && !self.is_terminal()
            && self.metadata.deletion_timestamp.is_none()
            && self.spec.priority.unwrap_or(0) > placeholder_priority
    }

    /// Whether the pod ended (its requests are free again).
    pub fn is_terminal(&self) -> bool {
        matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// Whether the pod counts as workload on the nodes `selected` accepts:
    /// bound there, not terminal, not being deleted, not a placeholder,
    /// outside the `kube-*` namespaces.
    pub fn is_workload(&self, selected: impl Fn(&str) -> bool) -> bool {
        self.spec.node_name.as_deref().is_some_and(selected)
            && !self.is_terminal()
            && self.metadata.deletion_timestamp.is_none()
            && !self.is_placeholder()
            && !self.namespace().starts_with("kube-")
    }
}

/// The CPU and memory the workload pods among `pods` request.
pub fn workload_requests<'a>(
    pods: impl IntoIterator<Item = &'a HeadroomPod>,
    selected: impl Fn(&str) -> bool + Copy,
) -> Resources {
    pods.into_iter()
        .filter(|p| p.is_workload(selected))
        .map(HeadroomPod::effective_requests)
        .fold(Resources::default(), add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(v: Value) -> HeadroomPod {
        serde_json::from_value(v).unwrap()
    }

    fn c(cpu: &str, memory: &str) -> Value {
        json!({"resources": {"requests": {"cpu": cpu, "memory": memory}}})
    }

    fn sidecar(cpu: &str, memory: &str) -> Value {
        let mut v = c(cpu, memory);
        v["restartPolicy"] = json!("Always");
        v
    }

    fn res(cpu: &str, memory: &str) -> Resources {
        Resources {
            cpu: Quantity::parse(cpu).unwrap(),
            memory: Quantity::parse(memory).unwrap(),
        }
    }

    #[test]
    fn effective_requests() {
        let rows = [
            (
                "containers add up",
                json!({"containers": [c("1", "1Gi"), c("500m", "1Gi")]}),
                res("1500m", "2Gi"),
            ),
            (
                "a big init container dominates",
                json!({"initContainers": [c("4", "100Mi")], "containers": [c("1", "1Gi")]}),
                res("4", "1Gi"),
            ),
            (
                "sidecars run beside later init containers and the main ones",
                json!({"initContainers": [sidecar("1", "1Gi"), c("2", "0")], "containers": [c("500m", "1Gi")]}),
                res("3", "2Gi"),
            ),
            (
                "overhead on top",
                json!({"containers": [c("1", "1Gi")], "overhead": {"cpu": "250m", "memory": "64Mi"}}),
                res("1250m", "1088Mi"),
            ),
            ("no requests", json!({"containers": [{}]}), res("0", "0")),
        ];
        for (name, spec, want) in rows {
            assert_eq!(
                pod(json!({"spec": spec})).effective_requests(),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn what_counts_as_workload() {
        let selected = |node: &str| node.starts_with("gpu-");
        let base = || json!({"metadata": {"namespace": "team"}, "spec": {"nodeName": "gpu-1"}});
        let with = |path: &str, v: Value| {
            let mut p = base();
            let (outer, inner) = path.split_once('.').unwrap();
            p[outer][inner] = v;
            pod(p)
        };
        let rows = [
            ("bound to a selected node", pod(base()), true),
            ("unbound", with("spec.nodeName", Value::Null), false),
            ("another pool", with("spec.nodeName", json!("cpu-1")), false),
            ("succeeded", with("status.phase", json!("Succeeded")), false),
            ("failed", with("status.phase", json!("Failed")), false),
            ("running", with("status.phase", json!("Running")), true),
            (
                "being deleted",
                with("metadata.deletionTimestamp", json!("2026-01-01T00:00:00Z")),
                false,
            ),
            (
                "another watermark's placeholder",
                with(
                    "metadata.labels",
                    json!({WATERMARK_LABEL: "other", "app": "x"}),
                ),
                false,
            ),
            (
                "unrelated labels",
                with("metadata.labels", json!({"app": "x"})),
                true,
            ),
            (
                "kube-system",
                with("metadata.namespace", json!("kube-system")),
                false,
            ),
        ];
        for (name, p, want) in rows {
            assert_eq!(p.is_workload(selected), want, "{name}");
        }
        let pods = [
            pod(
                json!({"metadata": {"namespace": "a"}, "spec": {"nodeName": "gpu-1", "containers": [c("1", "1Gi")]}}),
            ),
            pod(
                json!({"metadata": {"namespace": "a"}, "spec": {"nodeName": "gpu-2", "containers": [c("2", "1Gi")]}}),
            ),
            pod(
                json!({"metadata": {"namespace": "a", "labels": {WATERMARK_LABEL: "w"}},
                "spec": {"nodeName": "gpu-1", "containers": [c("8", "8Gi")]}}),
            ),
        ];
        assert_eq!(workload_requests(&pods, selected), res("3", "2Gi"));
    }

    #[test]
    fn the_placeholder_gate_is_found_by_index() {
        let gated = |gates: Value| -> Option<usize> {
            let pod: HeadroomPod =
                serde_json::from_value(json!({"spec": {"schedulingGates": gates}})).unwrap();
            pod.spec.placeholder_gate
        };
        let ours = super::super::desired::PLACEHOLDER_GATE;
        assert_eq!(gated(json!([{"name": ours}])), Some(0));
        assert_eq!(gated(json!([{"name": "other"}, {"name": ours}])), Some(1));
        assert_eq!(gated(json!([{"name": "other"}])), None);
        assert_eq!(gated(json!(null)), None);
    }

    #[test]
    fn who_waits_for_devices() {
        let unschedulable =
            json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]);
        let waiting = || {
            json!({"metadata": {"namespace": "team", "name": "job"},
                "spec": {"priority": 100, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
                "status": {"phase": "Pending", "conditions": unschedulable}})
        };
        let rows = [
            ("unschedulable with claims", waiting(), true),
            (
                "bound",
                {
                    let mut p = waiting();
                    p["spec"]["nodeName"] = json!("n1");
                    p
                },
                false,
            ),
            (
                "not yet tried",
                {
                    let mut p = waiting();
                    p["status"]["conditions"] = json!([]);
                    p
                },
                false,
            ),
            (
                "scheduling gated",
                {
                    let mut p = waiting();
                    p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]);
                    p
                },
                false,
            ),
            (
                "no claims",
                {
                    let mut p = waiting();
                    p["spec"]["resourceClaims"] = json!([]);
                    p
                },
                false,
            ),
            (
                "priority not above the placeholders'",
                {
                    let mut p = waiting();
                    p["spec"]["priority"] = json!(-1);
                    p
                },
                false,
            ),
            (
                "a placeholder",
                {
                    let mut p = waiting();
                    p["metadata"]["labels"] = json!({WATERMARK_LABEL: "w", ENTRY_LABEL: "gpu"});
                    p
                },
                false,
            ),
        ];
        for (name, v, want) in rows {
            assert_eq!(pod(v).waits_for_devices(-1), want, "{name}");
        }
    }
}
