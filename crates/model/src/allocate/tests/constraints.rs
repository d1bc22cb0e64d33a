//! Constraints, configuration and prioritized lists: matchAttribute, class and claim configs, subrequests, backtracking.

use super::*;

#[test]
fn with_constraint() {
    let case = Case::new(
        on_node(attr_devices(&[
            (
                "device-1",
                json!({"numa": {"int": 1}, "model": {"string": "a"}, "driverVersion": {"version": "1.0.0"}, "fast": {"bool": true}}),
            ),
            (
                "device-2",
                json!({"numa": {"int": 1}, "model": {"string": "a"}, "driverVersion": {"version": "1.0.0"}, "fast": {"bool": true}}),
            ),
        ])),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({})), exactly("req-1", "class-a", json!({}))],
            "constraints": [
                {"matchAttribute": "driver-a/numa"}, {"matchAttribute": "driver-a/model"},
                {"matchAttribute": "driver-a/driverVersion"}, {"matchAttribute": "driver-a/fast"},
            ],
        })),
    );
    assert_eq!(
        case.devices(),
        picked(&[
            ("req-0", "pool-1", "device-1"),
            ("req-1", "pool-1", "device-2")
        ])
    );
}

#[test]
fn with_constraint_not_matching_int_attribute() {
    let case = Case::new(
        on_node(attr_devices(&[
            ("device-1", json!({"numa": {"int": 1}})),
            ("device-2", json!({"numa": {"int": 2}})),
        ])),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({"count": 2}))],
            "constraints": [{"matchAttribute": "driver-a/numa"}],
        })),
    );
    let why = case.unsatisfiable();
    assert!(
        why.contains("no set of free devices has equal values of driver-a/numa"),
        "{why}"
    );
}

#[test]
fn with_constraint_non_existent_attribute() {
    let case = Case::new(
        one_device(),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({}))],
            "constraints": [{"matchAttribute": "driver-a/numa"}],
        })),
    );
    case.unsatisfiable_because("no set of free devices has equal values of driver-a/numa");
}

#[test]
fn with_constraint_for_request_retry() {
    // The string constraint covers both requests: device-1 ("a") cannot pair
    // with the others ("b"), so the search moves req-0 to device-2.
    let case = Case::new(
        on_node(attr_devices(&[
            (
                "device-1",
                json!({"stringAttribute": {"string": "a"}, "driverVersion": {"version": "1.0.0"}}),
            ),
            (
                "device-2",
                json!({"stringAttribute": {"string": "b"}, "driverVersion": {"version": "1.0.0"}}),
            ),
            (
                "device-3",
                json!({"stringAttribute": {"string": "b"}, "driverVersion": {"version": "2.0.0"}}),
            ),
        ])),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({})), exactly("req-1", "class-a", json!({}))],
            "constraints": [
                {"requests": ["req-0"], "matchAttribute": "driver-a/driverVersion"},
                {"matchAttribute": "driver-a/stringAttribute"},
            ],
        })),
    );
    assert_eq!(
        case.devices(),
        picked(&[
            ("req-0", "pool-1", "device-2"),
            ("req-1", "pool-1", "device-3")
        ])
    );
}

#[test]
fn with_constraint_not_matching_int_attribute_all_devices() {
    let case = Case::new(
        on_node(attr_devices(&[
            ("device-1", json!({"numa": {"int": 1}})),
            ("device-2", json!({"numa": {"int": 2}})),
        ])),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({"allocationMode": "All"}))],
            "constraints": [{"matchAttribute": "driver-a/numa"}],
        })),
    );
    let why = case.refused();
    assert!(
        why.contains("cannot add device driver-a/pool-1/device-2 because a claim constraint"),
        "{why}"
    );
}

#[test]
fn distinct_attribute_is_refused() {
    let case = Case::new(
        one_device(),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({}))],
            "constraints": [{"distinctAttribute": "driver-a/numa"}],
        })),
    );
    assert!(case.refused().contains("distinctAttribute"));
}

#[test]
fn with_class_device_config_with_multiple_request_and_configs() {
    let mut case = Case::new(
        vec![
            slice(
                "slice-1",
                "pool-1",
                "driver-a",
                devices(&["device-0", "device-1"]),
            ),
            slice("slice-2", "pool-2", "driver-b", devices(&["device-1"])),
        ],
        claim(json!({
            "requests": [
                exactly("req-0", "class-a", json!({})),
                exactly("req-1", "class-a", json!({})),
                exactly("req-2", "class-b", json!({})),
            ],
            "config": [
                {"opaque": {"driver": "driver-a", "parameters": {"claim": "all"}}},
                {"requests": ["req-2"], "opaque": {"driver": "driver-b", "parameters": {"claim": "b"}}},
            ],
        })),
    );
    let with_config = |name: &str, driver: &str| -> DeviceClass {
        let mut c = class(name, driver);
        c.spec.as_mut().unwrap().config = Some(
            serde_json::from_value(
                json!([{"opaque": {"driver": driver, "parameters": {"class": name}}}]),
            )
            .unwrap(),
        );
        c
    };
    case.classes = vec![
        with_config("class-a", "driver-a"),
        with_config("class-b", "driver-b"),
    ];
    let result = case.allocation();
    assert_eq!(
        result["devices"]["config"],
        json!([
            {"source": "FromClass", "requests": ["req-0", "req-1"], "opaque": {"driver": "driver-a", "parameters": {"class": "class-a"}}},
            {"source": "FromClass", "requests": ["req-2"], "opaque": {"driver": "driver-b", "parameters": {"class": "class-b"}}},
            {"source": "FromClaim", "opaque": {"driver": "driver-a", "parameters": {"claim": "all"}}},
            {"source": "FromClaim", "requests": ["req-2"], "opaque": {"driver": "driver-b", "parameters": {"claim": "b"}}},
        ])
    );
}

#[test]
fn prioritized_list_first_unavailable() {
    let case = Case::new(
        one_device(),
        claim(json!({"requests": [{"name": "req-0", "firstAvailable": [
            sub("subReq-0", "class-b", 1),
            sub("subReq-1", "class-a", 1),
        ]}]})),
    );
    assert_eq!(
        case.devices(),
        picked(&[("req-0/subReq-1", "pool-1", "device-1")])
    );
}

#[test]
fn prioritized_list_device_config() {
    let case = Case::new(
        one_device(),
        claim(json!({
            "requests": [{"name": "req-0", "firstAvailable": [
                sub("subReq-0", "class-b", 1),
                sub("subReq-1", "class-a", 1),
            ]}],
            "config": [
                {"requests": ["req-0/subReq-0"], "opaque": {"driver": "driver-b", "parameters": {"n": 0}}},
                {"requests": ["req-0/subReq-1"], "opaque": {"driver": "driver-a", "parameters": {"n": 1}}},
            ],
        })),
    );
    assert_eq!(
        case.allocation()["devices"]["config"],
        json!([{"source": "FromClaim", "requests": ["req-0/subReq-1"], "opaque": {"driver": "driver-a", "parameters": {"n": 1}}}])
    );
}

#[test]
fn prioritized_list_with_backtracking() {
    // req-0's first choice takes the 8Gi device req-1 needs: back to its
    // second subrequest.
    let case = Case::new(
        on_node(mem_devices(&[("device-1", "8Gi"), ("device-2", "4Gi")])),
        claim(json!({"requests": [
            {"name": "req-0", "firstAvailable": [
                {"name": "subReq-0", "deviceClassName": "class-a", "allocationMode": "ExactCount", "count": 1,
                 "selectors": mem_selector("8Gi")["selectors"]},
                {"name": "subReq-1", "deviceClassName": "class-a", "allocationMode": "ExactCount", "count": 1,
                 "selectors": mem_selector("2Gi")["selectors"]},
            ]},
            exactly("req-1", "class-a", mem_selector("8Gi")),
        ]})),
    );
    assert_eq!(
        case.devices(),
        picked(&[
            ("req-0/subReq-1", "pool-1", "device-2"),
            ("req-1", "pool-1", "device-1")
        ])
    );
}

#[test]
fn prioritized_list_too_many_in_first_subrequest() {
    let case = Case::new(
        one_device(),
        claim(json!({"requests": [{"name": "req-0", "firstAvailable": [
            sub("subReq-0", "class-a", 500),
            sub("subReq-1", "class-a", 1),
        ]}]})),
    );
    assert_eq!(
        case.devices(),
        picked(&[("req-0/subReq-1", "pool-1", "device-1")])
    );
}

#[test]
fn too_many_devices_single_request() {
    let case = Case::new(one_device(), one_request(json!({"count": 500})));
    assert!(case.refused().contains("exceeds the claim limit of 32"));
}

#[test]
fn too_many_devices_total_across_subrequests() {
    // 16 + 17 results would exceed the claim's 32: the second request falls
    // back to its one-device subrequest.
    let names: Vec<String> = (0..40).map(|i| format!("device-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let case = Case::new(
        on_node(devices(&names)),
        claim(json!({"requests": [
            exactly("req-0", "class-a", json!({"count": 16})),
            {"name": "req-1", "firstAvailable": [
                sub("many", "class-a", 17),
                sub("one", "class-a", 1),
            ]},
        ]})),
    );
    let got = case.devices();
    assert_eq!(got.len(), 17);
    assert_eq!(got.last().unwrap().0, "req-1/one");
}

#[test]
fn with_constraint_not_matching_version_build_metadata() {
    // Versions are compared as written: build metadata makes them differ.
    let case = Case::new(
        on_node(attr_devices(&[
            ("device-1", json!({"driverVersion": {"version": "1.0.0+a"}})),
            ("device-2", json!({"driverVersion": {"version": "1.0.0+b"}})),
        ])),
        claim(json!({
            "requests": [exactly("req-0", "class-a", json!({"count": 2}))],
            "constraints": [{"matchAttribute": "driver-a/driverVersion"}],
        })),
    );
    case.unsatisfiable_because("no set of free devices has equal values of driver-a/driverVersion");
}
