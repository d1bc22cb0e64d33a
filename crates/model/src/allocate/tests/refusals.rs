//! What the allocator refuses and how it says so: admin access, unknown classes and modes, partitionable devices, consumable capacity.

use super::*;

#[test]
fn not_enough_suitable_devices_message_counts_every_reason() {
    let mut case = Case::new(
        vec![
            slice(
                "slice-1",
                "pool-1",
                "driver-a",
                devices(&["device-1", "device-2", "device-3"]),
            ),
            slice("slice-2", "pool-2", "driver-b", devices(&["device-1"])),
        ],
        one_request(json!({"count": 3})),
    );
    case.in_use = vec![("driver-a", "pool-1", "device-2")];
    assert_eq!(
        case.unsatisfiable(),
        "request req-0: 4 devices on node node-1, 1 rejected by class class-a, 1 allocated to other \
         claims, 2 free, 3 needed"
    );
}

#[test]
fn admin_access_enabled() {
    let mut case = Case::new(one_device(), one_request(json!({"adminAccess": true})));
    case.in_use = vec![("driver-a", "pool-1", "device-1")];
    let result = case.allocation();
    assert_eq!(result["devices"]["results"][0]["device"], "device-1");
    assert_eq!(result["devices"]["results"][0]["adminAccess"], true);
}

#[test]
fn all_devices_some_allocating_admin_access() {
    // An admin request cannot take a device its own claim already took.
    let case = Case::new(
        one_device(),
        claim(json!({"requests": [
            exactly("req-0", "class-a", json!({"adminAccess": true})),
            exactly("req-1", "class-a", json!({"adminAccess": true, "allocationMode": "All"})),
        ]})),
    );
    case.unsatisfiable_because("not enough devices for all requests together");
}

#[test]
fn admin_access_disabled() {
    let case = Case::new(one_device(), one_request(json!({"adminAccess": true})));
    let classes: BTreeMap<String, Arc<DeviceClass>> = [(
        "class-a".to_string(),
        Arc::new(class("class-a", "driver-a")),
    )]
    .into();
    let inventory = node_inventory(NODE, &case.slices);
    let outcome = allocate(&AllocationInput {
        claim: &case.claim,
        classes: &classes,
        node: NODE,
        inventory: &inventory,
        in_use: &HashSet::new(),
        admin_access_enabled: false,
        prioritized_list_enabled: true,
    });
    assert!(
        matches!(outcome, Outcome::Refused(ref why) if why.contains("DRAAdminAccess")),
        "{outcome:?}"
    );
}

#[test]
fn unknown_class() {
    let case = Case::new(
        one_device(),
        claim(json!({"requests": [exactly("req-0", "unknown-class", json!({}))]})),
    );
    assert!(
        case.refused()
            .contains("DeviceClass unknown-class not found")
    );
}

#[test]
fn unknown_allocation_mode() {
    let case = Case::new(
        one_device(),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"allocationMode": "future-mode"}))]}),
        ),
    );
    assert!(
        case.refused()
            .contains("unsupported allocationMode future-mode")
    );
}

#[test]
fn partitionable_devices_are_refused_per_device() {
    let case = Case::new(
        on_node(json!([
            {"name": "device-1", "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "1Gi"}}}]},
            {"name": "device-2", "bindingConditions": ["attached"], "bindingFailureConditions": ["failed"]},
            {"name": "device-3", "allowMultipleAllocations": true},
            {"name": "device-4", "attributes": {"sizes": {"ints": [1, 2]}}},
        ])),
        one_request(json!({})),
    );
    let why = case.unsatisfiable();
    assert!(
        why.contains("4 use features this allocator does not support"),
        "{why}"
    );
    assert!(
        why.contains("driver-a/pool-1/device-1 consumes counters"),
        "{why}"
    );
}

#[test]
fn consumable_capacity_request_is_refused() {
    let case = Case::new(
        one_device(),
        claim(
            json!({"requests": [exactly("req-0", "class-a", json!({"capacity": {"requests": {"memory": "1Gi"}}}))]}),
        ),
    );
    assert!(case.refused().contains("consumable capacity"));
}

#[test]
fn all_devices_refused_when_a_network_attached_device_matches() {
    let all_on = |driver: &str| {
        Case::new(
            vec![
                slice("slice-1", "pool-1", "driver-a", devices(&["device-1"])),
                all_nodes_slice(driver),
            ],
            claim(
                json!({"requests": [exactly("req-0", "class-a", json!({"allocationMode": "All"}))]}),
            ),
        )
    };
    let why = all_on("driver-a").refused();
    assert!(
        why.contains("device driver-a/pool-n/device-9 of a pool that is not node-local"),
        "{why}"
    );
    // A class that matches only node-local devices is not affected.
    assert_eq!(all_on("driver-b").devices().len(), 1);
}
