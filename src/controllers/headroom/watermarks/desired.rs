//! The objects a watermark entry wants, as server-side apply bodies:
//! plain values, built without I/O.

use serde_json::{Value, json};

use super::watermark::{CpuMemoryEntry, DeviceEntrySpec, GROUP, KIND, Placement, VERSION};
use crate::naming::{WATERMARK_ENTRY_LABEL as ENTRY_LABEL, WATERMARK_LABEL};

/// The CPU/memory entry's name in labels, Deployment names and metrics.
pub(crate) const CPU_MEMORY_ENTRY: &str = "cpu";

/// The watermark that owns the objects.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// `<watermark>-<entry>`: the Deployment of an entry's placeholders.
pub(crate) fn deployment_name(watermark: &str, entry: &str) -> String {
    format!("{watermark}-{entry}")
}

/// The name of the claim entry in a device placeholder's pod, and of the
/// request in its claim template.
pub(crate) const DEVICES_CLAIM: &str = "devices";

/// Scheduling gate every device placeholder is created with. A placeholder
/// recreated after a yield would otherwise race the pod it yielded to for
/// the devices just freed (the scheduler takes whichever pod comes first);
/// the controller lifts the gate once no yield is in flight.
pub(crate) use crate::naming::PLACEHOLDER_GATE;

fn labels(owner: Owner<'_>, entry: &str) -> Value {
    json!({WATERMARK_LABEL: owner.name, ENTRY_LABEL: entry})
}

fn metadata(owner: Owner<'_>, entry: &str) -> Value {
    json!({
        "name": deployment_name(owner.name, entry),
        "namespace": owner.namespace,
        "labels": labels(owner, entry),
        "ownerReferences": [{
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": KIND,
            "name": owner.name,
            "uid": owner.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
    })
}

/// A Deployment of `replicas` placeholders of `entry` running `pod`.
fn placeholder_deployment(owner: Owner<'_>, entry: &str, replicas: u32, pod: Value) -> Value {
    let labels = labels(owner, entry);
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, entry),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    // Placeholders are what an autoscaler may always evict.
                    "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
                },
                "spec": pod,
            },
        },
    })
}

/// The Deployment of the CPU/memory placeholders, at `replicas`.
pub(crate) fn cpu_memory_deployment(
    owner: Owner<'_>,
    placement: &Placement,
    entry: &CpuMemoryEntry,
    replicas: u32,
) -> Value {
    let resources = json!({"requests": entry.pause_requests, "limits": entry.pause_requests});
    let pod = placeholder_pod_spec(placement, resources, None);
    placeholder_deployment(owner, CPU_MEMORY_ENTRY, replicas, pod)
}

/// The ResourceClaimTemplate of a device entry's placeholders: `count`
/// devices of the class, with the entry's selectors. Our claim controller
/// makes each placeholder's claim from it, like any pod's, which is what
/// lets an autoscaler simulate the placeholders.
pub(crate) fn device_claim_template(owner: Owner<'_>, entry: &DeviceEntrySpec) -> Value {
    let mut exactly = json!({
        "deviceClassName": entry.device_class_name,
        "allocationMode": "ExactCount",
        "count": entry.count.unwrap_or(1),
    });
    if !entry.selectors.is_empty() {
        exactly["selectors"] = json!(entry.selectors);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": metadata(owner, &entry.name),
        "spec": {
            "metadata": {"labels": labels(owner, &entry.name)},
            "spec": {"devices": {"requests": [{"name": DEVICES_CLAIM, "exactly": exactly}]}},
        },
    })
}

/// The Deployment of a device entry's placeholders: each claims the
/// entry's devices through its template and requests nothing else.
pub(crate) fn device_deployment(
    owner: Owner<'_>,
    placement: &Placement,
    entry: &DeviceEntrySpec,
    replicas: u32,
) -> Value {
    let resources = json!({"claims": [{"name": DEVICES_CLAIM}]});
    let claims = json!([{
        "name": DEVICES_CLAIM,
        "resourceClaimTemplateName": deployment_name(owner.name, &entry.name),
    }]);
    let mut pod = placeholder_pod_spec(placement, resources, Some(claims));
    pod["schedulingGates"] = json!([{"name": PLACEHOLDER_GATE}]);
    placeholder_deployment(owner, &entry.name, replicas, pod)
}

/// A pause container with `resources`, placed as the watermark says, gone
/// the moment it is preempted or yields.
fn placeholder_pod_spec(placement: &Placement, resources: Value, claims: Option<Value>) -> Value {
    let mut pod = json!({
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
            "resources": resources,
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
            },
        }],
    });
    if let Some(claims) = claims {
        pod["resourceClaims"] = claims;
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::headroom::watermarks::watermark::WatermarkSpec;

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
        // The scheduler preempts CPU/memory placeholders itself: no gate.
        assert!(pod.get("schedulingGates").is_none());
        let container = &pod["containers"][0];
        assert_eq!(container["image"], "registry.k8s.io/pause:3.10");
        assert_eq!(container["resources"]["requests"]["cpu"], "200m");
        assert_eq!(container["resources"]["requests"]["memory"], "200Mi");
    }

    #[test]
    fn device_entry_objects() {
        let spec: WatermarkSpec = serde_json::from_value(json!({
            "watermarkPercentage": 50,
            "nodeSelector": {"pool": "gpu"},
            "devices": [{"name": "a100", "deviceClassName": "gpu.example.com", "count": 2,
                "selectors": [{"cel": {"expression": "device.attributes['gpu.example.com'].model == 'a100'"}}]}],
        }))
        .unwrap();
        let settled = spec.settle();
        let owner = Owner {
            namespace: "headroom",
            name: "pool",
            uid: "u1",
        };
        let entry = &spec.devices[0];
        let template = device_claim_template(owner, entry);
        assert_eq!(template["kind"], "ResourceClaimTemplate");
        assert_eq!(template["metadata"]["name"], "pool-a100");
        assert_eq!(template["metadata"]["ownerReferences"][0]["uid"], "u1");
        let request = &template["spec"]["spec"]["devices"]["requests"][0];
        assert_eq!(request["name"], DEVICES_CLAIM);
        assert_eq!(request["exactly"]["deviceClassName"], "gpu.example.com");
        assert_eq!(request["exactly"]["count"], 2);
        assert_eq!(request["exactly"]["selectors"], json!(entry.selectors));
        let d = device_deployment(owner, &settled.placement, entry, 4);
        assert_eq!(d["metadata"]["name"], "pool-a100");
        assert_eq!(d["spec"]["replicas"], 4);
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(
            pod["resourceClaims"][0]["resourceClaimTemplateName"],
            "pool-a100"
        );
        assert_eq!(
            pod["containers"][0]["resources"]["claims"][0]["name"],
            DEVICES_CLAIM
        );
        assert_eq!(pod["schedulingGates"], json!([{"name": PLACEHOLDER_GATE}]));
        assert_eq!(
            d["spec"]["template"]["metadata"]["labels"][ENTRY_LABEL],
            "a100"
        );
    }
}
