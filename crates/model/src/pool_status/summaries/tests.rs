//! The summaries' table: rows carry the names of kube-controller-manager
//! 1.37's `TestComputePartitionSummary`, `TestComputeShareableSummary`,
//! `TestComputePoolViews_*`, `TestResolveDevicePartitions` and
//! `TestResolvePartitionType` cases, with the same set-up and outcome.

use super::*;
use k8s_openapi::api::resource::v1::Device;
use serde_json::{Value, json};

const DRIVER: &str = "gpu.example.com";
const PROFILE: &str = "gpu.example.com/profile";

fn device(value: Value) -> Device {
    serde_json::from_value(value).unwrap()
}

/// A partition of `profile` drawing `memory` of counter set `gpu-0`.
fn partition(name: &str, profile: &str, memory: &str) -> Device {
    device(json!({
        "name": name,
        "attributes": {"profile": {"string": profile}},
        "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": memory}}}],
    }))
}

fn counters(name: &str, counters: &[(&str, &str)]) -> CounterSet {
    serde_json::from_value(json!({
        "name": name,
        "counters": counters.iter().map(|(c, v)| (c.to_string(), json!({"value": v})))
            .collect::<serde_json::Map<_, _>>(),
    }))
    .unwrap()
}

fn used<'a>(devices: &[&'a str], consumed: &[(&'a str, &str)]) -> PoolUse<'a> {
    let mut used = PoolUse {
        devices: devices.iter().copied().collect(),
        ..PoolUse::default()
    };
    for (name, amount) in consumed {
        used.add_consumed(name, Amount::parse(amount));
    }
    used
}

fn partition_rows(summary: &Summaries) -> Vec<(&str, i32, i32)> {
    summary
        .partitions
        .iter()
        .flatten()
        .map(|p| (p.type_.as_str(), p.total, p.allocatable))
        .collect()
}

/// Devices of one slice naming `attribute`, with the counters.
fn pool<'a>(
    devices: &'a [Device],
    attribute: Option<&'a str>,
    sets: &'a [CounterSet],
) -> PoolDevices<'a> {
    PoolDevices {
        devices: devices.iter().map(|d| (d, attribute)).collect(),
        shared_counters: sets.iter().collect(),
    }
}

/// The summaries of one slice's devices with nothing in use and no
/// request default.
fn untouched(devices: &[Device], attribute: Option<&str>, sets: &[CounterSet]) -> Summaries {
    summaries(
        DRIVER,
        "pool-1",
        &pool(devices, attribute, sets),
        None,
        &PoolUse::default(),
    )
}

#[test]
fn compute_partition_summary() {
    let gpu = [counters("gpu-0", &[("memory", "80Gi")])];
    let devices = [
        partition("full-0", "1g.80gb", "80Gi"),
        partition("half-0", "1g.40gb", "40Gi"),
        partition("half-1", "1g.40gb", "40Gi"),
    ];
    // (case, devices in use, (type, total, allocatable) per type)
    type Case = (
        &'static str,
        Vec<&'static str>,
        Vec<(&'static str, i32, i32)>,
    );
    let rows: Vec<Case> = vec![
        (
            "all-fresh-independent-per-type",
            vec![],
            vec![("1g.40gb", 2, 2), ("1g.80gb", 1, 1)],
        ),
        (
            "in-use-full-consumes-counter",
            vec!["full-0"],
            vec![("1g.40gb", 2, 0), ("1g.80gb", 1, 0)],
        ),
        (
            "one-half-in-use-leaves-one-half",
            vec!["half-0"],
            vec![("1g.40gb", 2, 1), ("1g.80gb", 1, 0)],
        ),
    ];
    for (name, in_use, want) in rows {
        let summary = summaries(
            DRIVER,
            "pool-1",
            &pool(&devices, Some(PROFILE), &gpu),
            None,
            &used(&in_use, &[]),
        );
        assert_eq!(summary.error, None, "{name}");
        assert_eq!(partition_rows(&summary), want, "{name}");
    }

    // fresh-device-clamp-binds-before-counter: plenty of memory, three
    // devices: three fit.
    let big = [counters("gpu-0", &[("memory", "800Gi")])];
    let fulls = [
        partition("full-0", "1g.80gb", "80Gi"),
        partition("full-1", "1g.80gb", "80Gi"),
        partition("full-2", "1g.80gb", "80Gi"),
    ];
    let summary = untouched(&fulls, Some(PROFILE), &big);
    assert_eq!(partition_rows(&summary), [("1g.80gb", 3, 3)]);

    // missing-attribute
    let mut unnamed = partition("full-0", "x", "80Gi");
    unnamed.attributes = None;
    let summary = untouched(std::slice::from_ref(&unnamed), Some(PROFILE), &gpu);
    assert_eq!(
        summary.error.as_deref(),
        Some(
            "PartitionTypeMissing: device \"full-0\" in pool gpu.example.com/pool-1 does not carry partition type attribute \"gpu.example.com/profile\""
        )
    );
    assert_eq!(summary.partitions, None);

    // cost-mismatch-within-type
    let mismatched = [
        partition("a", "1g.40gb", "40Gi"),
        partition("b", "1g.40gb", "41Gi"),
    ];
    let summary = untouched(&mismatched, Some(PROFILE), &gpu);
    assert_eq!(
        summary.error.as_deref(),
        Some(
            "PartitionCostMismatch: devices of partition type \"1g.40gb\" in pool gpu.example.com/pool-1 consume different counters"
        )
    );
}

/// `TestComputePartitionSummary_MultiCounterSet`: the tightest counter
/// binds.
#[test]
fn compute_partition_summary_multi_counter_set() {
    let sets = [
        counters("mem", &[("memory", "160Gi")]),
        counters("cores", &[("sm", "8")]),
    ];
    let devices = [0, 1].map(|i| {
        device(json!({
            "name": format!("p{i}"),
            "attributes": {"profile": {"string": "big"}},
            "consumesCounters": [
                {"counterSet": "mem", "counters": {"memory": {"value": "80Gi"}}},
                {"counterSet": "cores", "counters": {"sm": {"value": "8"}}},
            ],
        }))
    });
    let summary = untouched(&devices, Some(PROFILE), &sets);
    assert_eq!(partition_rows(&summary), [("big", 2, 1)]);
}

fn shareable(name: &str, capacity: &[(&str, &str)]) -> Device {
    device(json!({
        "name": name,
        "allowMultipleAllocations": true,
        "capacity": capacity.iter().map(|(k, v)| (k.to_string(), json!({"value": v})))
            .collect::<serde_json::Map<_, _>>(),
    }))
}

fn capacity_rows(summary: &Summaries) -> (i32, i32, Vec<[String; 4]>) {
    let s = summary.shareable.as_ref().expect("a shareable summary");
    let rows = s
        .capacity
        .iter()
        .map(|c| {
            [
                c.name.clone(),
                c.total.clone(),
                c.consumed.clone(),
                c.available.clone(),
            ]
        })
        .collect();
    (s.fully_available, s.partially_available, rows)
}

fn strings<const N: usize>(row: [&str; N]) -> [String; N] {
    row.map(str::to_string)
}

/// `TestComputeShareableSummary`, `_MultipleCapacities`,
/// `_NoShareableDevices`.
#[test]
fn compute_shareable_summary() {
    let devices = [
        shareable("s0", &[("memory", "40Gi")]),
        shareable("s1", &[("memory", "40Gi")]),
    ];
    let summary = summaries(
        DRIVER,
        "pool-1",
        &pool(&devices, None, &[]),
        None,
        &used(&["s0"], &[("memory", "10Gi")]),
    );
    assert_eq!(
        capacity_rows(&summary),
        (1, 1, vec![strings(["memory", "80Gi", "10Gi", "70Gi"])])
    );
    assert_eq!(summary.error, None);

    let one = [shareable("s0", &[("memory", "40Gi"), ("cores", "8")])];
    let summary = summaries(
        DRIVER,
        "pool-1",
        &pool(&one, None, &[]),
        None,
        &used(&["s0"], &[("memory", "10Gi"), ("cores", "2")]),
    );
    assert_eq!(
        capacity_rows(&summary),
        (
            0,
            1,
            vec![
                strings(["cores", "8", "2", "6"]),
                strings(["memory", "40Gi", "10Gi", "30Gi"]),
            ]
        )
    );

    // Over-consumed capacity reads zero available; a capacity nothing
    // consumed reads "0" consumed.
    let summary = summaries(
        DRIVER,
        "pool-1",
        &pool(&one, None, &[]),
        None,
        &used(&["s0"], &[("memory", "50Gi")]),
    );
    assert_eq!(
        capacity_rows(&summary).2,
        vec![
            strings(["cores", "8", "0", "8"]),
            strings(["memory", "40Gi", "50Gi", "0"]),
        ]
    );

    let plain = [device(json!({"name": "d0"}))];
    let summary = untouched(&plain, None, &[]);
    assert_eq!(summary, Summaries::default());
}

/// `TestComputePoolViews_Hybrid` and the caps: the shareable view stays
/// beside a partition error; more than 32 entries is an error.
#[test]
fn compute_pool_views_hybrid_and_caps() {
    let gpu = [counters("gpu-0", &[("memory", "80Gi")])];
    let mut devices = vec![
        partition("half-0", "1g.40gb", "40Gi"),
        shareable("s0", &[("memory", "40Gi")]),
    ];
    let summary = untouched(&devices, Some(PROFILE), &gpu);
    assert_eq!(partition_rows(&summary), [("1g.40gb", 1, 1)]);
    assert_eq!(capacity_rows(&summary).0, 1);

    devices.push(partition("half-1", "1g.40gb", "41Gi"));
    let summary = untouched(&devices, Some(PROFILE), &gpu);
    assert!(summary.error.unwrap().starts_with("PartitionCostMismatch:"));
    assert_eq!(summary.partitions, None);
    assert!(summary.shareable.is_some());

    let many: Vec<Device> = (0..33)
        .map(|i| partition(&format!("p{i}"), &format!("t{i:02}"), "1Gi"))
        .collect();
    let summary = untouched(&many, Some(PROFILE), &gpu);
    assert_eq!(
        summary.error.as_deref(),
        Some(
            "PartitionSummaryOverCap: pool gpu.example.com/pool-1 has 33 partition types, exceeding the maximum of 32"
        )
    );
    let wide: Vec<(String, String)> = (0..33).map(|i| (format!("c{i}"), "1".into())).collect();
    let wide: Vec<(&str, &str)> = wide.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let summary = untouched(&[shareable("s0", &wide)], None, &[]);
    assert!(
        summary
            .error
            .unwrap()
            .starts_with("ShareableSummaryOverCap: pool gpu.example.com/pool-1 has 33")
    );
    assert_eq!(summary.shareable, None);
}

/// `TestComputePoolViews_PartitionAttributeGatesView` and
/// `TestResolveDevicePartitions`: no attribute, no partition view; the
/// slice's attribute beats the request's default, which fills in only
/// when no slice of the pool names one.
#[test]
fn resolve_device_partitions() {
    let gpu = [counters("gpu-0", &[("memory", "80Gi")])];
    let devices = [partition("full-0", "1g.80gb", "80Gi")];
    let other = "gpu.example.com/other";
    let view = |attribute: Option<&str>, default: Option<&str>| {
        summaries(
            DRIVER,
            "pool-1",
            &pool(&devices, attribute, &gpu),
            default,
            &used(&[], &[]),
        )
    };
    // neither slice nor request names one
    assert_eq!(view(None, None), Summaries::default());
    // request default fills devices when no slice declares
    assert_eq!(
        partition_rows(&view(None, Some(PROFILE))),
        [("1g.80gb", 1, 1)]
    );
    // slice declaration wins over request default
    let won = view(Some(PROFILE), Some(other));
    assert_eq!(won.partitions.unwrap()[0].attribute, PROFILE);

    // request default ignored when any slice declares: the second slice's
    // device stays ungrouped.
    let second = [partition("half-0", "1g.40gb", "40Gi")];
    let mixed = PoolDevices {
        devices: vec![(&devices[0], Some(PROFILE)), (&second[0], None)],
        shared_counters: gpu.iter().collect(),
    };
    let summary = summaries(DRIVER, "pool-1", &mixed, Some(PROFILE), &used(&[], &[]));
    assert_eq!(partition_rows(&summary), [("1g.80gb", 1, 1)]);

    // differing slice attributes are each kept
    let mut elsewhere = second[0].clone();
    elsewhere.attributes = serde_json::from_value(json!({"other": {"string": "1g.40gb"}})).ok();
    let both = PoolDevices {
        devices: vec![(&devices[0], Some(PROFILE)), (&elsewhere, Some(other))],
        shared_counters: gpu.iter().collect(),
    };
    let summary = summaries(DRIVER, "pool-1", &both, None, &used(&[], &[]));
    let groups: Vec<_> = summary
        .partitions
        .unwrap()
        .into_iter()
        .map(|p| p.attribute)
        .collect();
    assert_eq!(groups, [other, PROFILE], "sorted by attribute");

    // A pool without shared counters that names an attribute.
    let summary = summaries(
        DRIVER,
        "pool-1",
        &pool(&devices, None, &[]),
        Some(PROFILE),
        &used(&[], &[]),
    );
    assert_eq!(
        summary.error.as_deref(),
        Some(
            "PartitionTypeMissing: pool gpu.example.com/pool-1 declares partitionTypeAttribute but publishes no sharedCounters"
        )
    );
}

/// `TestResolvePartitionType`.
#[test]
fn resolve_partition_type() {
    let with = |attributes: Value| device(json!({"name": "d", "attributes": attributes}));
    let bare = with(json!({"profile": {"string": "a"}}));
    assert_eq!(string_attribute(DRIVER, &bare, PROFILE), Some("a"));
    let number = with(json!({"profile": {"int": 1}}));
    assert_eq!(string_attribute(DRIVER, &number, PROFILE), None);
    assert_eq!(
        string_attribute(DRIVER, &bare, "gpu.example.com/missing"),
        None
    );
    assert_eq!(
        string_attribute(DRIVER, &bare, "other.example.com/profile"),
        None
    );
    let both = with(json!({"profile": {"string": "bare"}, PROFILE: {"string": "explicit"}}));
    assert_eq!(string_attribute(DRIVER, &both, PROFILE), Some("explicit"));
}
