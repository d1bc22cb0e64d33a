//! The objects a watermark entry wants, as server-side apply bodies:
//! plain values, built without I/O.

use serde_json::{Value, json};

use super::usage::WATERMARK_LABEL;
use super::watermark::{CpuMemoryEntry, GROUP, KIND, Placement, VERSION};

/// Label naming the entry a placeholder belongs to (`cpu` or a device
/// entry's name).
pub const ENTRY_LABEL: &str = "dra-claim-controller.io/watermark-entry";
/// The CPU/memory entry's name in labels, Deployment names and metrics.
pub const CPU_MEMORY_ENTRY: &str = "cpu";

/// The watermark that owns the objects.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// `<watermark>-<entry>`: the Deployment of an entry's placeholders.
pub fn deployment_name(watermark: &str, entry: &str) -> String {
    format!("{watermark}-{entry}")
}

/// The Deployment of the CPU/memory placeholders, at `replicas`.
pub fn cpu_memory_deployment(
    owner: Owner<'_>,
    placement: &Placement,
    entry: &CpuMemoryEntry,
    replicas: u32,
) -> Value {
    let labels = json!({WATERMARK_LABEL: owner.name, ENTRY_LABEL: CPU_MEMORY_ENTRY});
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(owner.name, CPU_MEMORY_ENTRY),
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "kind": KIND,
                "name": owner.name,
                "uid": owner.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    // Placeholders are what an autoscaler may always evict.
                    "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
                },
                "spec": placeholder_pod_spec(placement, &entry.pause_requests),
            },
        },
    })
}

/// A pause container requesting `requests`, placed as the watermark says,
/// gone the moment it is preempted.
fn placeholder_pod_spec(
    placement: &Placement,
    requests: &std::collections::BTreeMap<String, String>,
) -> Value {
    json!({
        "nodeSelector": placement.node_selector,
        "tolerations": placement.tolerations,
        "priorityClassName": placement.priority_class_name,
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65535,
            "runAsGroup": 65535,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": "pause",
            "image": placement.image,
            "resources": {"requests": requests, "limits": requests},
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
            },
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::headroom::watermark::WatermarkSpec;

    #[test]
    fn cpu_memory_deployment_shape() {
        let spec: WatermarkSpec = serde_json::from_value(json!({
            "watermarkPercentage": 20,
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        }))
        .unwrap();
        let settled = spec.settle();
        let entry = settled.cpu_memory.unwrap();
        let owner = Owner {
            namespace: "headroom",
            name: "gpu-pool",
            uid: "u1",
        };
        let d = cpu_memory_deployment(owner, &settled.placement, &entry, 3);
        assert_eq!(d["metadata"]["name"], "gpu-pool-cpu");
        assert_eq!(d["metadata"]["namespace"], "headroom");
        assert_eq!(
            d["metadata"]["ownerReferences"][0]["kind"],
            "NodeScalingWatermark"
        );
        assert_eq!(d["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(d["spec"]["replicas"], 3);
        let template = &d["spec"]["template"];
        assert_eq!(
            template["metadata"]["labels"],
            d["spec"]["selector"]["matchLabels"]
        );
        assert_eq!(template["metadata"]["labels"][WATERMARK_LABEL], "gpu-pool");
        assert_eq!(
            template["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"],
            "true"
        );
        let pod = &template["spec"];
        assert_eq!(pod["nodeSelector"]["pool"], "gpu");
        assert_eq!(pod["tolerations"][0]["key"], "gpu");
        assert_eq!(pod["priorityClassName"], "dra-headroom");
        assert_eq!(pod["terminationGracePeriodSeconds"], 0);
        let container = &pod["containers"][0];
        assert_eq!(container["image"], "registry.k8s.io/pause:3.10");
        assert_eq!(container["resources"]["requests"]["cpu"], "200m");
        assert_eq!(container["resources"]["requests"]["memory"], "200Mi");
    }
}
