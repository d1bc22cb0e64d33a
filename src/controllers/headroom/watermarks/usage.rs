//! Which pods count as workload on the selected nodes, and what they
//! weigh (their effective request, as kube-scheduler computes it, of every
//! resource: `model::requests`).

use crate::model::requests::{ResourceList, add_into};
use crate::model::views::PodView;

/// Waits for devices as the headroom yield understands it: unbound, found
/// unschedulable by kube-scheduler, with claims, not a placeholder, of a
/// priority above `placeholder_priority`.
pub(crate) fn waits_for_devices(pod: &PodView, placeholder_priority: i32) -> bool {
    pod.is_unbound()
        && pod.status.conditions.scheduling.unschedulable
        && !pod.spec.resource_claims.is_empty()
        && !pod.is_placeholder()
        && pod.spec.priority.unwrap_or(0) > placeholder_priority
}

/// Whether the pod counts as workload on the nodes `selected` accepts:
/// bound there, not terminal, not being deleted, not a placeholder (ours
/// or the seed operator's), outside the `kube-*` namespaces.
pub(crate) fn is_workload(pod: &PodView, selected: impl Fn(&str) -> bool) -> bool {
    pod.holds_node()
        && pod.node_name().is_some_and(selected)
        && !pod.is_placeholder()
        && !pod.namespace().starts_with("kube-")
}

/// What the workload pods among `pods` request, per resource.
pub(crate) fn workload_requests<'a>(
    pods: impl IntoIterator<Item = &'a PodView>,
    selected: impl Fn(&str) -> bool + Copy,
) -> ResourceList {
    let mut sum = ResourceList::new();
    for pod in pods.into_iter().filter(|p| is_workload(p, selected)) {
        add_into(&mut sum, &pod.requests().effective());
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    use crate::naming::{
        SEED_PLACEHOLDER_LABEL, WATERMARK_ENTRY_LABEL as ENTRY_LABEL, WATERMARK_LABEL,
    };

    fn pod(mut v: Value) -> PodView {
        if v.get("metadata").is_none() {
            v["metadata"] = json!({"name": "p", "namespace": "team"});
        }
        serde_json::from_value(v).unwrap()
    }

    fn cpu_memory(pod: &PodView) -> ResourceList {
        pod.requests().effective()
    }

    fn c(cpu: &str, memory: &str) -> Value {
        json!({"resources": {"requests": {"cpu": cpu, "memory": memory}}})
    }

    fn sidecar(cpu: &str, memory: &str) -> Value {
        let mut v = c(cpu, memory);
        v["restartPolicy"] = json!("Always");
        v
    }

    fn res(cpu: &str, memory: &str) -> ResourceList {
        crate::model::requests::parse_list([
            ("cpu".to_string(), cpu.to_string()),
            ("memory".to_string(), memory.to_string()),
        ])
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
            (
                "no requests",
                json!({"containers": [{}]}),
                ResourceList::new(),
            ),
        ];
        for (name, spec, want) in rows {
            assert_eq!(cpu_memory(&pod(json!({"spec": spec}))), want, "{name}");
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
            assert_eq!(is_workload(&p, selected), want, "{name}");
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
        // The seed operator's placeholders are headroom too.
        let seed = pod(
            json!({"metadata": {"namespace": "a", "labels": {SEED_PLACEHOLDER_LABEL: ""}},
            "spec": {"nodeName": "gpu-1", "containers": [c("8", "8Gi")]}}),
        );
        assert!(!is_workload(&seed, selected));
    }

    #[test]
    fn the_placeholder_gate_is_found_by_index() {
        let gated = |gates: Value| -> Option<usize> {
            let pod = pod(json!({"spec": {"schedulingGates": gates}}));
            pod.spec.placeholder_gate
        };
        let ours = crate::naming::PLACEHOLDER_GATE;
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
            assert_eq!(waits_for_devices(&pod(v), -1), want, "{name}");
        }
    }
}
