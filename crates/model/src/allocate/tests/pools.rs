//! Pools, slices and nodes: which devices a node sees, generations, incomplete pools, `All` mode.

use super::*;

#[test]
fn simple() {
    let case = Case::new(one_device(), one_request(json!({})));
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-1")]));
    let result = case.allocation();
    assert_eq!(
        result["nodeSelector"],
        json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]})
    );
    assert_eq!(result["devices"]["results"][0]["driver"], "driver-a");
    assert!(result["devices"]["results"][0].get("adminAccess").is_none());
}

#[test]
fn other_node() {
    // Only slices of the node itself count.
    let case = Case::new(
        vec![slice_on(
            "slice-2",
            "node-2",
            "pool-2",
            "driver-a",
            1,
            1,
            devices(&["device-1"]),
        )],
        one_request(json!({})),
    );
    let why = case.unsatisfiable();
    assert!(why.contains("0 devices on node node-1"), "{why}");
    assert!(
        why.contains("publishes no node-local ResourceSlices"),
        "{why}"
    );
}

#[test]
fn network_attached_device_is_never_used() {
    let mut network: ResourceSlice = slice("slice-n", "pool-n", "driver-a", devices(&["device-1"]));
    network.spec.node_name = None;
    network.spec.node_selector = Some(
        serde_json::from_value(json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "region", "operator": "In", "values": ["region-1"]}]}]}))
        .unwrap(),
    );
    let mut all_nodes = slice("slice-all", "pool-all", "driver-a", devices(&["device-2"]));
    all_nodes.spec.node_name = None;
    all_nodes.spec.all_nodes = Some(true);
    let case = Case::new(vec![network, all_nodes], one_request(json!({})));
    case.unsatisfiable_because("publishes no node-local ResourceSlices; network-attached and allNodes devices are never used");
}

#[test]
fn small_and_large_backtrack_requests() {
    // The first request's first fit is the large device; backtracking gives
    // it the small one so that the second request gets the large one.
    let case = Case::new(
        on_node(mem_devices(&[("device-2", "2Gi"), ("device-1", "1Gi")])),
        claim(json!({"requests": [
            exactly("req-0", "class-a", mem_selector("1Gi")),
            exactly("req-1", "class-a", mem_selector("2Gi")),
        ]})),
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
fn devices_split_across_different_slices() {
    let case = Case::new(
        vec![
            slice("slice-1", "pool-1", "driver-a", devices(&["device-1"])),
            slice("slice-2", "pool-2", "driver-a", devices(&["device-1"])),
        ],
        one_request(json!({"count": 2})),
    );
    assert_eq!(
        case.devices(),
        picked(&[
            ("req-0", "pool-1", "device-1"),
            ("req-0", "pool-2", "device-1")
        ])
    );
}

#[test]
fn obsolete_slice() {
    // Generation 2 replaces generation 1, and alone it is incomplete.
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 2, &["device-1"]),
            gen_slice("slice-2", NODE, 2, 2, &["device-2"]),
        ],
        one_request(json!({})),
    );
    let why = case.unsatisfiable();
    assert!(
        why.contains("pool driver-a/pool-1 is currently being updated"),
        "{why}"
    );
}

#[test]
fn newest_generation_wins() {
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 1, &["device-old"]),
            gen_slice("slice-2", NODE, 2, 1, &["device-new"]),
        ],
        one_request(json!({})),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-new")]));
}

#[test]
fn multi_host_resource_pool_with_stale_slice_for_current_node() {
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 2, &["device-1"]),
            gen_slice("slice-2", "node-2", 2, 2, &["device-2"]),
        ],
        one_request(json!({})),
    );
    case.unsatisfiable_because("node node-1 publishes no node-local ResourceSlices");
}

#[test]
fn allocation_mode_all_with_multi_host_resource_pool() {
    // The pool is complete counting the other node's slice; only this
    // node's device is taken.
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 2, &["device-1"]),
            gen_slice("slice-2", "node-2", 1, 2, &["device-2"]),
        ],
        one_request(json!({"allocationMode": "All"})),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-1")]));
}

#[test]
fn duplicate_slice() {
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 2, &["device-1"]),
            gen_slice("slice-2", NODE, 1, 2, &["device-1"]),
        ],
        one_request(json!({})),
    );
    let why = case.unsatisfiable();
    assert!(
        why.contains("pool driver-a/pool-1 is currently invalid"),
        "{why}"
    );
}

#[test]
fn invalid_pool_is_ok_if_devices_can_be_allocated_from_other() {
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 2, &["device-1"]),
            gen_slice("slice-2", NODE, 1, 2, &["device-1"]),
            slice("slice-3", "pool-2", "driver-a", devices(&["device-2"])),
        ],
        one_request(json!({})),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-2", "device-2")]));
}

#[test]
fn no_allocation_from_incomplete_pools() {
    let case = Case::new(
        vec![gen_slice("slice-1", NODE, 1, 2, &["device-1", "device-2"])],
        one_request(json!({"count": 2})),
    );
    case.unsatisfiable_because("pool driver-a/pool-1 is currently being updated and was not used");
}

#[test]
fn all_devices_of_the_incomplete_pool() {
    let case = Case::new(
        vec![gen_slice("slice-1", NODE, 1, 2, &["device-1"])],
        one_request(json!({"allocationMode": "All"})),
    );
    assert_eq!(
        case.refused(),
        "claim default/claim-0, request req-0: asks for all devices, but resource pool driver-a/pool-1 \
         is currently being updated"
    );
}

#[test]
fn all_devices_many() {
    let case = Case::new(
        vec![
            slice("slice-1", "pool-1", "driver-a", devices(&["device-1"])),
            slice("slice-2", "pool-2", "driver-a", devices(&["device-1"])),
        ],
        one_request(json!({"allocationMode": "All"})),
    );
    assert_eq!(case.devices().len(), 2);
}

#[test]
fn all_devices_some_allocated() {
    let mut case = Case::new(
        on_node(devices(&["device-1", "device-2"])),
        one_request(json!({"allocationMode": "All"})),
    );
    case.in_use = vec![("driver-a", "pool-1", "device-1")];
    let why = case.unsatisfiable();
    assert!(why.contains("1 allocated to other claims"), "{why}");
}

#[test]
fn all_devices_no_slices() {
    let case = Case::new(Vec::new(), one_request(json!({"allocationMode": "All"})));
    case.unsatisfiable_because("0 devices on node node-1, 0 free, all 0 needed");
}

#[test]
fn all_devices_no_solution() {
    // One device; a count-1 request takes it, so All has nothing usable.
    let case = Case::new(
        one_device(),
        claim(json!({"requests": [
            exactly("req-0", "class-a", json!({})),
            exactly("req-1", "class-a", json!({"allocationMode": "All"})),
        ]})),
    );
    case.unsatisfiable_because("not enough devices for all requests together");
}

#[test]
fn all_devices_some_allocated_prioritized_list() {
    let mut case = Case::new(
        vec![
            slice(
                "slice-1",
                "pool-1",
                "driver-a",
                devices(&["device-1", "device-2"]),
            ),
            slice("slice-2", "pool-2", "driver-b", devices(&["device-1"])),
        ],
        claim(json!({"requests": [{"name": "req-0", "firstAvailable": [
            {"name": "subReq-0", "deviceClassName": "class-a", "allocationMode": "All"},
            sub("subReq-1", "class-b", 1),
        ]}]})),
    );
    case.in_use = vec![("driver-a", "pool-1", "device-1")];
    assert_eq!(
        case.devices(),
        picked(&[("req-0/subReq-1", "pool-2", "device-1")])
    );
}

#[test]
fn already_allocated_devices() {
    let mut case = Case::new(one_device(), one_request(json!({})));
    case.in_use = vec![("driver-a", "pool-1", "device-1")];
    let why = case.unsatisfiable();
    assert_eq!(
        why,
        "request req-0: 1 devices on node node-1, 1 allocated to other claims, 0 free, 1 needed"
    );
}

#[test]
fn multi_host_resource_pool_complete_update_from_node_1_to_node_2() {
    // The node's own slices are complete at generation 1: used, as
    // kube-scheduler uses them, although another node publishes generation 2.
    let case = Case::new(
        vec![
            gen_slice("slice-1", NODE, 1, 1, &["device-1"]),
            gen_slice("slice-2", "node-2", 2, 1, &["device-2"]),
        ],
        one_request(json!({})),
    );
    assert_eq!(case.devices(), picked(&[("req-0", "pool-1", "device-1")]));
}

/// Selectors a tenant may write, nested as deep as the API server lets
/// through (its CEL parser stops at 250 levels), allocated from a thread
/// with a tokio worker's 2 MiB stack (16 parentheses overflowed it in a
/// debug build): an answer, never a crash; deeper ones are refused.
#[test]
fn deeply_nested_tenant_selectors_are_harmless() {
    const DEPTH: usize = 240;
    let rows = [
        format!(
            "{}device.driver == 'driver-a'{}",
            "(".repeat(DEPTH),
            ")".repeat(DEPTH)
        ),
        format!("{}true", "!".repeat(DEPTH)),
        format!("size({}1{}) > 0", "[".repeat(DEPTH), "]".repeat(DEPTH)),
        vec!["device.driver == 'driver-a'"; DEPTH].join(" && "),
        format!(
            "{}device.driver == 'driver-a'{}",
            "(true && ".repeat(DEPTH),
            ")".repeat(DEPTH)
        ),
    ];
    let case_for = |expression: &str| {
        Case::new(
            one_device(),
            one_request(json!({"selectors": [{"cel": {"expression": expression}}]})),
        )
    };
    let outcomes = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let mut outcomes: Vec<_> = rows.iter().map(|e| case_for(e).run()).collect();
            let too_deep = format!("{}true{}", "(".repeat(251), ")".repeat(251));
            outcomes.push(case_for(&too_deep).run());
            outcomes
        })
        .unwrap()
        .join()
        .expect("allocating with nested selectors ended the thread");
    let refused = |i: usize, because: &str| match &outcomes[i] {
        Outcome::Refused(why) => assert!(why.contains(because), "row {i}: {why}"),
        other => panic!("row {i}: expected a refusal, got {other:?}"),
    };
    // Long chains and runs of `!` are evaluated; nesting past the CEL
    // parser's own limit (96) is refused with its message, past the API
    // server's (250) before parsing.
    for i in [1, 3] {
        assert!(
            matches!(outcomes[i], Outcome::Allocated(_)),
            "row {i}: {:?}",
            outcomes[i]
        );
    }
    for i in [0, 2, 4] {
        refused(i, "Recursion limit");
    }
    refused(5, "at most 250");
}
