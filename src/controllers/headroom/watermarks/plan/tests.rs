//! Decision table of [`Snapshot::plan`]: what a watermark wants from the
//! stores as one sync reads them. Rows are named after the contract's
//! cases (`docs/headroom.md`).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Plan, Snapshot};
use crate::controllers::headroom::watermarks::status::EntryObserved;
use crate::controllers::headroom::watermarks::watermark::WatermarkView;
use crate::model::views::{NodeView, PodView};
use crate::naming::{SEED_PLACEHOLDER_LABEL, WATERMARK_ENTRY_LABEL, WATERMARK_LABEL};

fn watermark(spec: Value) -> WatermarkView {
    serde_json::from_value(json!({
        "metadata": {"name": "pool", "namespace": "headroom", "uid": "wm-uid", "generation": 3},
        "spec": spec,
    }))
    .unwrap()
}

fn node(name: &str, pool: &str) -> Arc<NodeView> {
    Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"pool": pool}}}))
            .unwrap(),
    )
}

/// A pod in `namespace` on `node` requesting `cpu` and `memory`.
fn pod(namespace: &str, name: &str, node: Option<&str>, cpu: &str, memory: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
        "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
        "status": {"phase": "Running"},
    })
}

fn placeholder(name: &str, node: Option<&str>) -> Value {
    let mut p = pod("headroom", name, node, "1", "1Gi");
    p["metadata"]["labels"] = json!({WATERMARK_LABEL: "pool", WATERMARK_ENTRY_LABEL: "cpu"});
    p
}

fn with(mut v: Value, path: &[&str], value: Value) -> Value {
    let mut at = &mut v;
    for key in &path[..path.len() - 1] {
        at = &mut at[*key];
    }
    at[path[path.len() - 1]] = value;
    v
}

fn plan(spec: Value, pods: Vec<Value>) -> Plan {
    let snapshot = Snapshot {
        nodes: vec![
            node("gpu-1", "gpu"),
            node("gpu-2", "gpu"),
            node("cpu-1", "cpu"),
        ],
        pods: pods
            .into_iter()
            .map(|p| Arc::new(serde_json::from_value::<PodView>(p).unwrap()))
            .collect(),
        ..Snapshot::default()
    };
    snapshot.plan("headroom/pool", &watermark(spec)).unwrap()
}

/// An entry's (desired, ready, pending).
type Counts = (u32, u32, u32);

/// The CPU/memory entry's counts.
fn cpu_entry(plan: &Plan) -> Counts {
    let e: &EntryObserved = &plan.observed.entries[0];
    assert_eq!(e.name, "cpu");
    (e.desired, e.ready, e.pending)
}

#[test]
fn cpu_memory_placeholders() {
    // 50 % of what workloads request on the selected nodes, in 1 CPU /
    // 1 GiB placeholders, rounded up.
    let spec = || {
        json!({"watermarkPercentage": 50, "nodeSelector": {"pool": "gpu"},
               "pausePodSize": {"cpu": "1", "memory": "1Gi"}})
    };
    let rows: Vec<(&str, Vec<Value>, Counts)> = vec![
        ("nothing runs: no headroom", vec![], (0, 0, 0)),
        (
            "workload on selected nodes counts, rounded up",
            vec![
                pod("team", "a", Some("gpu-1"), "2", "1Gi"),
                pod("team", "b", Some("gpu-2"), "1", "1Gi"),
            ],
            (2, 0, 0),
        ),
        (
            "memory can be the larger need",
            vec![pod("team", "a", Some("gpu-1"), "1", "8Gi")],
            (4, 0, 0),
        ),
        (
            "other pools do not count",
            vec![pod("team", "a", Some("cpu-1"), "8", "8Gi")],
            (0, 0, 0),
        ),
        (
            "unbound pods do not count",
            vec![pod("team", "a", None, "8", "8Gi")],
            (0, 0, 0),
        ),
        (
            "finished pods hold nothing",
            vec![with(
                pod("team", "a", Some("gpu-1"), "8", "8Gi"),
                &["status", "phase"],
                json!("Succeeded"),
            )],
            (0, 0, 0),
        ),
        (
            "kube-* namespaces are not workload",
            vec![pod("kube-system", "dns", Some("gpu-1"), "8", "8Gi")],
            (0, 0, 0),
        ),
        (
            "the seed operator's placeholders are not workload",
            vec![with(
                pod("team", "pause", Some("gpu-1"), "8", "8Gi"),
                &["metadata", "labels"],
                json!({SEED_PLACEHOLDER_LABEL: ""}),
            )],
            (0, 0, 0),
        ),
        (
            "own placeholders: bound ready, unbound pending, never workload",
            vec![
                pod("team", "a", Some("gpu-1"), "4", "1Gi"),
                placeholder("pool-cpu-1", Some("gpu-1")),
                placeholder("pool-cpu-2", None),
            ],
            (2, 1, 1),
        ),
        (
            "placeholders being deleted are not counted",
            vec![with(
                placeholder("pool-cpu-1", Some("gpu-1")),
                &["metadata", "deletionTimestamp"],
                json!("2026-01-01T00:00:00Z"),
            )],
            (0, 0, 0),
        ),
    ];
    for (name, pods, want) in rows {
        assert_eq!(cpu_entry(&plan(spec(), pods)), want, "{name}");
    }
}

#[test]
fn bounds_apply_and_the_deployment_carries_the_count() {
    let spec = json!({"watermarkPercentage": 100, "nodeSelector": {"pool": "gpu"},
                      "pausePodSize": {"cpu": "1", "memory": "1Gi"},
                      "minPlaceholders": 1, "maxPlaceholders": 3});
    let idle = plan(spec.clone(), vec![]);
    assert_eq!(cpu_entry(&idle), (1, 0, 0), "at least minPlaceholders");
    let busy = plan(spec, vec![pod("team", "a", Some("gpu-1"), "10", "1Gi")]);
    assert_eq!(cpu_entry(&busy), (3, 0, 0), "at most maxPlaceholders");
    let deployment = &busy.objects[0];
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["metadata"]["name"], "pool-cpu");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(busy.observed.generation, Some(3));
}

#[test]
fn an_unparsable_pause_size_is_invalid_and_writes_nothing_for_it() {
    let invalid = plan(
        json!({"watermarkPercentage": 50, "pausePodSize": {"cpu": "lots"}}),
        vec![],
    );
    let entry = &invalid.observed.entries[0];
    assert!(
        entry
            .invalid
            .as_deref()
            .unwrap_or_default()
            .contains("pausePodSize"),
        "{entry:?}"
    );
    assert!(invalid.objects.is_empty());
}

#[test]
fn any_resource_the_pause_pod_names_sizes_it() {
    let gpu_pod = |name: &str, gpus: &str| {
        json!({
            "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}")},
            "spec": {"nodeName": "gpu-1", "containers": [{"resources": {
                "requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": "Running"},
        })
    };
    let spec = json!({"watermarkPercentage": 50, "nodeSelector": {"pool": "gpu"},
                      "pausePodSize": {"nvidia.com/gpu": 1}});
    let p = plan(spec, vec![gpu_pod("a", "3"), gpu_pod("b", "4")]);
    assert_eq!(cpu_entry(&p), (4, 0, 0), "50 % of 7 GPUs, rounded up");
    let resources = &p.objects[0]["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!(resources["requests"]["nvidia.com/gpu"], "1");
    assert_eq!(
        resources["limits"]["nvidia.com/gpu"], "1",
        "extended resources need a limit"
    );
    // cpu and memory keep their defaults when not given.
    assert_eq!(resources["requests"]["cpu"], "200m");
}
