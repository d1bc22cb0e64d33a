//! CEL selectors: the environment they see, invalid expressions, errors on devices in use.

use super::*;

#[test]
fn invalid_cel_one_device() {
    let case = Case::new(
        one_device(),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"selectors": [{"cel": {"expression": "noSuchVar"}}]}))]}),
        ),
    );
    let why = case.refused();
    assert!(
        why.contains("claim default/claim-0: selector #0: CEL runtime error"),
        "{why}"
    );
    assert!(why.contains("noSuchVar"), "{why}");
}

#[test]
fn invalid_cel_one_device_class() {
    let mut case = Case::new(one_device(), one_request(json!({})));
    case.classes = vec![
        serde_json::from_value(json!({
            "metadata": {"name": "class-a"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]}
        }))
        .unwrap(),
    ];
    let why = case.refused();
    assert!(
        why.starts_with("class class-a: selector #0: CEL compile error"),
        "{why}"
    );
}

#[test]
fn unsupported_cel_function_is_named() {
    let case = Case::new(
        one_device(),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"selectors": [{"cel": {"expression":
            "sets.contains([1], [1]) && ip('10.0.0.1').family() == 4"}}]}))]}),
        ),
    );
    let why = case.refused();
    assert!(
        why.contains("does not support: family, ip, sets.contains"),
        "{why}"
    );
}

#[test]
fn selectors_see_the_dra_environment() {
    let dev = json!([{
        "name": "device-1",
        "attributes": {"model": {"string": "A100"}, "driverVersion": {"version": "12.4.0"},
                       "numa": {"int": 1}, "other.example.com/rack": {"string": "r1"}},
        "capacity": {"memory": {"value": "40Gi"}},
    }]);
    let accepted = [
        "device.attributes['driver-a'].model.lowerAscii() == 'a100'",
        "device.attributes['driver-a'].driverVersion.isGreaterThan(semver('12.0.0'))",
        "device.attributes['driver-a'].driverVersion.major() == 12",
        "device.capacity['driver-a'].memory.isGreaterThan(quantity('39Gi'))",
        "device.capacity['driver-a'].memory.asInteger() == 40 * 1024 * 1024 * 1024",
        "device.attributes['other.example.com'].rack == 'r1'",
        "!has(device.attributes['unknown.example.com'].x)",
        "!('x' in device.attributes['unknown.example.com'])",
        "cel.bind(a, device.attributes['driver-a'], a.numa == 1 && a.model.startsWith('A'))",
        "[1, 2, 3].isSorted() && 'a,b'.split(',').size() == 2",
        "[1, 2, 3].sum() == 6 && [3, 1, 2].min() == 1 && ['a', 'c'].max() == 'c'",
        "[quantity('1Gi'), device.capacity['driver-a'].memory].max().isGreaterThan(quantity('39Gi'))",
        "device.attributes['driver-a'].exists(k, k == 'numa')",
    ];
    for expression in accepted {
        let case = Case::new(
            on_node(dev.clone()),
            claim(
                json!({"requests": [exactly("req-0", "class-a", json!({"selectors": [{"cel": {"expression": expression}}]}))]}),
            ),
        );
        assert_eq!(case.devices().len(), 1, "{expression}");
    }
    let rejected = [
        "device.attributes['driver-a'].driverVersion.isLessThan(semver('12.0.0'))",
        "device.capacity['driver-a'].memory.compareTo(quantity('80Gi')) >= 0",
    ];
    for expression in rejected {
        let case = Case::new(
            on_node(dev.clone()),
            claim(
                json!({"requests": [exactly("req-0", "class-a", json!({"selectors": [{"cel": {"expression": expression}}]}))]}),
            ),
        );
        assert!(
            case.unsatisfiable()
                .contains("1 rejected by the request's selectors"),
            "{expression}"
        );
    }
}

#[test]
fn selector_errors_on_devices_in_use_do_not_fail_the_claim() {
    // device-1 (in use) lacks the attribute the selector reads: kube-scheduler
    // never evaluates it, so neither may we.
    let mut case = Case::new(
        on_node(attr_devices(&[
            ("device-1", json!({})),
            ("device-2", json!({"model": {"string": "a"}})),
        ])),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"selectors": [
            {"cel": {"expression": "device.attributes['driver-a'].model == 'a'"}}]}))]}),
        ),
    );
    case.in_use = vec![("driver-a", "pool-1", "device-1")];
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-2")]));
}
