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
