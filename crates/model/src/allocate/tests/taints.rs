//! Device taints and tolerations.

use super::*;

fn tainted(list: &[(&str, &str, &str)]) -> Value {
    json!(list
        .iter()
        .map(|(n, value, effect)| json!({"name": n, "taints": [{"key": "taint-key", "value": value, "effect": effect}]}))
        .collect::<Vec<_>>())
}

#[test]
fn tainted_two_devices() {
    let case = Case::new(
        on_node(tainted(&[
            ("device-1", "taint-value", "NoSchedule"),
            ("device-2", "taint-value-2", "NoExecute"),
        ])),
        one_request(json!({})),
    );
    assert!(case.unsatisfiable().contains("2 tainted and not tolerated"));
}

#[test]
fn tainted_two_devices_tolerated() {
    let toleration = json!({"key": "taint-key", "operator": "Equal", "value": "taint-value-2", "effect": "NoExecute"});
    let case = Case::new(
        on_node(tainted(&[
            ("device-1", "taint-value", "NoSchedule"),
            ("device-2", "taint-value-2", "NoExecute"),
        ])),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"tolerations": [toleration]}))]}),
        ),
    );
    let result = case.allocation();
    assert_eq!(result["devices"]["results"][0]["device"], "device-2");
    assert_eq!(
        result["devices"]["results"][0]["tolerations"],
        json!([toleration])
    );
}

#[test]
fn tainted_no_effect() {
    let case = Case::new(
        on_node(tainted(&[("device-1", "v", "None")])),
        one_request(json!({})),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-1")]));
}

#[test]
fn tainted_admin_access() {
    // Admin access does not bypass taints.
    let case = Case::new(
        on_node(tainted(&[("device-1", "v", "NoSchedule")])),
        one_request(json!({"adminAccess": true})),
    );
    case.unsatisfiable_because("1 tainted and not tolerated, 0 free, 1 needed");
}

#[test]
fn tainted_one_device_two_taints_both_tolerated() {
    let case = Case::new(
        on_node(json!([{"name": "device-1", "taints": [
            {"key": "taint-key", "value": "taint-value", "effect": "NoSchedule"},
            {"key": "taint-key", "value": "taint-value-2", "effect": "NoExecute"},
        ]}])),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"tolerations": [
                {"key": "taint-key", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "taint-key", "operator": "Equal", "value": "taint-value-2", "effect": "NoExecute"},
            ]}))]}),
        ),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-1")]));
}

fn rule(selector: Value, effect: &str) -> crate::device_taints::TaintRule {
    crate::device_taints::TaintRule::from_v1(
        &serde_json::from_value(json!({
            "metadata": {"name": "rule"},
            "spec": {"deviceSelector": selector, "taint": {"key": "taint-key", "effect": effect}},
        }))
        .unwrap(),
    )
}

/// Beyond the suite's cases: a DeviceTaintRule's taint counts as a
/// slice's does (kube-scheduler's DRADeviceTaintRules), `None` not at all.
#[test]
fn tainted_by_rules() {
    let mut case = Case::new(
        on_node(devices(&["device-1", "device-2"])),
        one_request(json!({})),
    );
    case.rules = vec![rule(json!({"device": "device-1"}), "NoSchedule")];
    assert_eq!(
        case.allocation()["devices"]["results"][0]["device"],
        "device-2"
    );
    case.rules = vec![rule(json!({}), "NoExecute")];
    assert!(
        case.unsatisfiable().contains("2 tainted and not tolerated"),
        "{}",
        case.unsatisfiable()
    );
    case.rules = vec![rule(json!({}), "None")];
    assert_eq!(
        case.allocation()["devices"]["results"][0]["device"],
        "device-1"
    );
}
