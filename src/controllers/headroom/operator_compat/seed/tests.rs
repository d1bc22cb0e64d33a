//! Tables of `seed.rs`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::controllers::headroom::watermarks::watermark::DEFAULT_PAUSE_IMAGE;
use crate::model::requests::{ResourceList, parse_list};
use crate::model::views::PodView;
use crate::naming::SEED_PLACEHOLDER_LABEL;

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
    let only_cpu: SeedSpec = serde_json::from_value(json!({"pausePodSize": {"cpu": "1"}})).unwrap();
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
