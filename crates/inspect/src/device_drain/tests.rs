//! `drain`'s plan and writes, as pure values: which rules a node gets, what
//! each step patches, which rules a resumed drain removes, what holds it.

use super::*;

fn slice(name: &str, driver: &str, pool: &str, node: &str, devices: &[&str]) -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": devices.iter().map(|d| json!({"name": d})).collect::<Vec<_>>(),
        },
    }))
    .unwrap()
}

#[test]
fn a_node_local_pool_is_one_rule_a_shared_pool_one_per_device() {
    let slices = [
        slice("a", "gpu.example.com", "node-1", "node-1", &["g0", "g1"]),
        slice("b", "nic.example.com", "fabric", "node-1", &["n0"]),
        slice("c", "nic.example.com", "fabric", "node-2", &["n1"]),
        slice("d", "gpu.example.com", "node-2", "node-2", &["g0"]),
    ];
    let rules = plan_rules("node-1", None, &slices);
    let selected: Vec<(&str, &str, Option<&str>)> = rules
        .iter()
        .map(|r| (r.driver.as_str(), r.pool.as_str(), r.device.as_deref()))
        .collect();
    assert_eq!(
        selected,
        [
            ("gpu.example.com", "node-1", None),
            ("nic.example.com", "fabric", Some("n0")),
        ]
    );
    // One driver only.
    let gpus = plan_rules("node-1", Some("gpu.example.com"), &slices);
    assert_eq!(gpus.len(), 1);
    // The same names on every run: the command resumes.
    assert_eq!(plan_rules("node-1", None, &slices), rules);
    assert!(
        rules
            .iter()
            .all(|r| r.name.starts_with("dra-drain-node-1-"))
    );
    // A node-local pool whose newest generation is incomplete (a
    // second slice announced, not published): per device.
    let mut partial = slice("e", "gpu.example.com", "node-3", "node-3", &["g0", "g1"]);
    partial.spec.pool.resource_slice_count = 2;
    let rules3 = plan_rules("node-3", None, &[partial]);
    assert_eq!(rules3.len(), 2, "{rules3:?}");
    assert!(rules3.iter().all(|r| r.device.is_some()));
    // A node with no devices: nothing to do.
    assert!(plan_rules("node-9", None, &slices).is_empty());
}

#[test]
fn a_long_node_name_still_makes_a_valid_label() {
    let long = "n".repeat(200);
    assert!(node_label(&long).len() <= 63);
    assert_eq!(node_label("node-1"), "node-1");
    assert!(rule_name(&long, "d/p").len() <= 253);
}

/// `drain` asks for budget-respecting evictions unless told
/// `--disable-eviction`; a rule already as asked is left alone, so a
/// resumed drain writes nothing, and switching modes rewrites it.
#[test]
fn no_execute_asks_for_evictions_unless_disabled() {
    let rule = |effect: &str, annotations: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": "r", "annotations": annotations},
            "spec": {"taint": {"key": "k", "effect": effect}},
        }))
        .unwrap()
    };
    let preview = rule("None", json!({}));
    let patch = no_execute_patch(&preview, false, None).unwrap();
    assert_eq!(patch["spec"]["taint"]["effect"], "NoExecute");
    assert_eq!(
        patch["metadata"]["annotations"][EVICTION_API_ANNOTATION],
        "true"
    );
    assert_eq!(patch["metadata"]["annotations"][CONFIRM_ANNOTATION], "true");
    let deleting = no_execute_patch(&preview, true, None).unwrap();
    assert_eq!(
        deleting["metadata"]["annotations"][EVICTION_API_ANNOTATION],
        "false"
    );

    let draining = rule(
        "NoExecute",
        json!({CONFIRM_ANNOTATION: "true", EVICTION_API_ANNOTATION: "true"}),
    );
    assert_eq!(
        no_execute_patch(&draining, false, None),
        None,
        "resumed: nothing to write"
    );
    assert!(
        no_execute_patch(&draining, true, None).is_some(),
        "switched to deleting"
    );
    // A drain begun before budgets were respected is switched over.
    let older = rule("NoExecute", json!({CONFIRM_ANNOTATION: "true"}));
    assert!(no_execute_patch(&older, false, None).is_some());
}

fn drain_rule(name: &str, node: &str, driver: &str, effect: &str, status: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": name, "annotations": {NODE_ANNOTATION: node}},
        "spec": {"deviceSelector": {"driver": driver, "pool": "p"},
                 "taint": {"key": TAINT_KEY, "effect": effect}},
        "status": status,
    }))
    .unwrap()
}

/// `--grace-period` is carried by the rule; a run without it takes an
/// earlier run's away; the same value again writes nothing.
#[test]
fn the_grace_period_rides_on_the_rule() {
    let preview = drain_rule("r", "n", "d", "None", json!({}));
    let patch = no_execute_patch(&preview, false, Some(30)).unwrap();
    assert_eq!(
        patch["metadata"]["annotations"][GRACE_PERIOD_ANNOTATION],
        "30"
    );
    let without = no_execute_patch(&preview, false, None).unwrap();
    assert!(without["metadata"]["annotations"][GRACE_PERIOD_ANNOTATION].is_null());
    // Negative: the pod's own, as kubectl's -1.
    let negative = no_execute_patch(&preview, false, Some(-1)).unwrap();
    assert!(negative["metadata"]["annotations"][GRACE_PERIOD_ANNOTATION].is_null());
    let mut draining = preview.clone();
    draining.data["spec"]["taint"]["effect"] = json!("NoExecute");
    draining.metadata.annotations = Some(BTreeMap::from([
        (NODE_ANNOTATION.to_string(), "n".to_string()),
        (CONFIRM_ANNOTATION.to_string(), "true".to_string()),
        (EVICTION_API_ANNOTATION.to_string(), "true".to_string()),
        (GRACE_PERIOD_ANNOTATION.to_string(), "30".to_string()),
    ]));
    assert_eq!(no_execute_patch(&draining, false, Some(30)), None);
    assert!(no_execute_patch(&draining, false, Some(10)).is_some());
    assert!(no_execute_patch(&draining, false, None).is_some());
}

/// Cordoning turns a preview into `NoSchedule` and leaves a rule that
/// cordons or evicts already.
#[test]
fn cordon_turns_only_previews() {
    // (effect now, --pod-selector given, effect written: None = nothing)
    let rows = [
        ("None", false, Some("NoSchedule")),
        ("NoSchedule", false, None),
        ("NoExecute", false, None),
        ("None", true, Some("NoSchedule")),
        ("NoSchedule", true, None),
        // With --pod-selector the eviction has rules of its own: a rule
        // an earlier, unselective drain turned NoExecute only cordons.
        ("NoExecute", true, Some("NoSchedule")),
    ];
    for (effect, only_cordon, want) in rows {
        let patch = cordon_patch(&drain_rule("r", "n", "d", effect, json!({})), only_cordon);
        assert_eq!(
            patch
                .as_ref()
                .map(|p| p["spec"]["taint"]["effect"].as_str().unwrap()),
            want,
            "{effect}, only_cordon {only_cordon}"
        );
    }
}

/// A resumed drain converges on the current plan: the node's rules the
/// plan no longer has go, another node's or another driver's stay.
#[test]
fn rules_no_longer_planned_are_stale() {
    let planned = vec![PlannedRule {
        name: "keep".into(),
        driver: "gpu".into(),
        pool: "p".into(),
        device: None,
    }];
    let existing = [
        drain_rule("keep", "node-1", "gpu", "NoExecute", json!({})),
        drain_rule("old-shape", "node-1", "gpu", "NoExecute", json!({})),
        drain_rule("nic", "node-1", "nic", "NoExecute", json!({})),
        drain_rule("other-node", "node-2", "gpu", "NoExecute", json!({})),
    ];
    let published = [
        slice("s1", "gpu", "p", "node-1", &["g0"]),
        slice("s2", "nic", "p", "node-1", &["n0"]),
    ];
    assert_eq!(
        stale_rules(&existing, "node-1", None, &planned, &published),
        ["old-shape", "nic"]
    );
    assert_eq!(
        stale_rules(&existing, "node-1", Some("gpu"), &planned, &published),
        ["old-shape"],
        "with --driver, only that driver's rules"
    );
    // The driver is down for the maintenance (its pool unpublished): a
    // resumed drain keeps its rules, whatever the plan says.
    assert!(stale_rules(&existing, "node-1", None, &[], &[]).is_empty());
}

/// Devices placed one by one (`perDeviceNodeSelection`) are drained
/// when local to the node; those reachable from other nodes are not.
#[test]
fn per_device_placement_is_drained_device_by_device() {
    let slice: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "fabric"},
        "spec": {
            "driver": "nic.example.com",
            "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
            "perDeviceNodeSelection": true,
            "devices": [
                {"name": "here", "nodeName": "node-1"},
                {"name": "there", "nodeName": "node-2"},
                {"name": "everywhere", "allNodes": true},
            ],
        },
    }))
    .unwrap();
    let rules = plan_rules("node-1", None, &[slice]);
    let devices: Vec<Option<&str>> = rules.iter().map(|r| r.device.as_deref()).collect();
    assert_eq!(devices, [Some("here")]);
}

/// What holds a stuck drain, read off the rules' status.
#[test]
fn the_budgets_holding_a_drain_are_named() {
    let status = |message: &str| {
        json!({"conditions": [{"type": "EvictionInProgress", "status": "True",
            "reason": "PodsPendingEviction", "message": message}]})
    };
    let rules = [
        drain_rule(
            "r1",
            "n",
            "d",
            "NoExecute",
            status(
                "3 pods need to be evicted in 1 namespace. 1 pod waiting for PodDisruptionBudget \
                 ns/a. 2 pods waiting for PodDisruptionBudget ns/b.",
            ),
        ),
        drain_rule(
            "r2",
            "n",
            "d",
            "NoExecute",
            status("1 pod needs to be evicted in 1 namespace."),
        ),
    ];
    assert_eq!(
        budget_holds(&rules),
        [
            "r1: 1 pod waiting for PodDisruptionBudget ns/a.",
            "r1: 2 pods waiting for PodDisruptionBudget ns/b.",
        ]
    );
}
