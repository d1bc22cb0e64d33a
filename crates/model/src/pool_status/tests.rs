//! The answer table: rows carry the names of kube-controller-manager
//! 1.36's `TestCalculatePoolStatus`, `TestIsOlderThan` and
//! `TestShouldDeleteRequest` cases, and 1.37's `TestCalculatePoolStatus_*`
//! additions, with the same set-up and outcome.

use super::*;
use serde_json::json;

const DRIVER: &str = "test.example.com";

fn slice(
    name: &str,
    driver: &str,
    pool: &str,
    generation: i64,
    count: i64,
    devices: usize,
    node: Option<&str>,
) -> ResourceSlice {
    let mut s = json!({
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": (0..devices).map(|i| json!({"name": format!("{name}-d{i}")})).collect::<Vec<_>>(),
        },
    });
    match node {
        Some(n) => s["spec"]["nodeName"] = json!(n),
        None => s["spec"]["allNodes"] = json!(true),
    }
    serde_json::from_value(s).unwrap()
}

fn allocated(pool: &str, devices: &[&str]) -> ClaimView {
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": devices.iter().map(|d| json!({
            "request": "r", "driver": DRIVER, "pool": pool, "device": d})).collect::<Vec<_>>()}}},
    }))
    .unwrap()
}

/// The answer as 1.36 counts.
fn answer_136(
    driver: &str,
    pool_name: Option<&str>,
    limit: Option<i32>,
    slices: &[ResourceSlice],
    claims: &[ClaimView],
) -> Answer {
    let question = Question {
        driver,
        pool_name,
        limit,
        ..Question::default()
    };
    answer(question, Counting::V1_36, slices, claims)
}

/// The answer to "every pool of [`DRIVER`]" as 1.37 counts, `rules` in
/// force.
fn answer_137(slices: &[ResourceSlice], claims: &[ClaimView], rules: &[TaintRule]) -> Answer {
    let question = Question {
        driver: DRIVER,
        ..Question::default()
    };
    answer(question, Counting::V1_37 { rules }, slices, claims)
}

struct Row {
    name: &'static str,
    pool_name: Option<&'static str>,
    limit: Option<i32>,
    slices: Vec<ResourceSlice>,
    claims: Vec<ClaimView>,
    /// (pools returned, pool count, total devices of the complete ones)
    want: (usize, i32, i32),
}

fn row(name: &'static str, slices: Vec<ResourceSlice>, want: (usize, i32, i32)) -> Row {
    Row {
        name,
        pool_name: None,
        limit: None,
        slices,
        claims: Vec::new(),
        want,
    }
}

#[test]
fn calculate_pool_status() {
    let n1 = Some("node-1");
    let rows = vec![
        row(
            "single-pool-no-allocations",
            vec![slice("s1", DRIVER, "pool-1", 1, 1, 4, n1)],
            (1, 1, 4),
        ),
        Row {
            claims: vec![
                allocated("pool-1", &["s1-d0"]),
                allocated("pool-1", &["s1-d1"]),
            ],
            ..row(
                "single-pool-with-allocations",
                vec![slice("s1", DRIVER, "pool-1", 1, 1, 4, n1)],
                (1, 1, 4),
            )
        },
        row(
            "multiple-pools",
            vec![
                slice("s1", DRIVER, "pool-1", 1, 1, 4, n1),
                slice("s2", DRIVER, "pool-2", 1, 1, 8, n1),
            ],
            (2, 2, 12),
        ),
        row(
            "filter-by-driver",
            vec![
                slice("s1", DRIVER, "pool-1", 1, 1, 4, n1),
                slice("s2", "other.example.com", "pool-2", 1, 1, 8, n1),
            ],
            (1, 1, 4),
        ),
        Row {
            pool_name: Some("pool-1"),
            ..row(
                "filter-by-pool-name",
                vec![
                    slice("s1", DRIVER, "pool-1", 1, 1, 4, n1),
                    slice("s2", DRIVER, "pool-2", 1, 1, 8, n1),
                ],
                (1, 1, 4),
            )
        },
        row(
            "multiple-slices-same-pool",
            vec![
                slice("s1", DRIVER, "pool-1", 1, 1, 4, n1),
                slice("s2", DRIVER, "pool-1", 1, 1, 4, n1),
            ],
            (1, 1, 8),
        ),
        Row {
            limit: Some(1),
            ..row(
                "limit-pools",
                vec![
                    slice("s1", DRIVER, "pool-1", 1, 1, 4, n1),
                    slice("s2", DRIVER, "pool-2", 1, 1, 8, n1),
                ],
                (1, 2, 4),
            )
        },
        row(
            "no-matching-pools",
            vec![slice("s1", "other.example.com", "pool-1", 1, 1, 4, n1)],
            (0, 0, 0),
        ),
        row(
            "older-generation-slices-ignored",
            vec![
                slice("old", DRIVER, "pool-1", 1, 1, 8, n1),
                slice("s1", DRIVER, "pool-1", 2, 2, 4, n1),
                slice("s2", DRIVER, "pool-1", 2, 2, 4, n1),
            ],
            (1, 1, 8),
        ),
        row(
            "incomplete-pool-has-validation-error",
            vec![
                slice("s1", DRIVER, "pool-1", 1, 5, 4, n1),
                slice("s2", DRIVER, "pool-1", 1, 5, 4, n1),
                slice("s3", DRIVER, "pool-1", 1, 5, 4, n1),
            ],
            (1, 1, 0),
        ),
        row(
            "mix-of-complete-and-incomplete-pools",
            vec![
                slice("s1", DRIVER, "pool-1", 1, 1, 4, n1),
                slice("s2", DRIVER, "pool-2", 1, 3, 4, n1),
            ],
            (2, 2, 4),
        ),
        row(
            "all-pools-complete-no-validation-errors",
            vec![
                slice("s1", DRIVER, "pool-1", 1, 2, 4, n1),
                slice("s2", DRIVER, "pool-1", 1, 2, 4, n1),
            ],
            (1, 1, 8),
        ),
    ];
    for r in rows {
        let got = answer_136(DRIVER, r.pool_name, r.limit, &r.slices, &r.claims);
        let total: i32 = got.pools.iter().filter_map(|p| p.total_devices).sum();
        assert_eq!(
            (got.pools.len(), got.pool_count, total),
            r.want,
            "{}: {got:?}",
            r.name
        );
        assert!(
            got.message.starts_with("Calculated status for "),
            "{}",
            r.name
        );
    }
}

#[test]
fn allocations_incomplete_pools_and_node_names() {
    let n1 = Some("node-1");
    // single-pool-with-allocations: counted per result.
    let got = answer_136(
        DRIVER,
        None,
        None,
        &[slice("s1", DRIVER, "pool-1", 1, 1, 4, n1)],
        &[
            allocated("pool-1", &["s1-d0"]),
            allocated("pool-1", &["s1-d1"]),
        ],
    );
    let p = &got.pools[0];
    assert_eq!(
        (
            p.allocated_devices,
            p.available_devices,
            p.unavailable_devices
        ),
        (Some(2), Some(2), Some(0))
    );
    assert_eq!(got.message, "Calculated status for 1 pools");

    // incomplete-pool-has-validation-error: no counts, upstream's words.
    let got = answer_136(
        DRIVER,
        None,
        None,
        &[slice("s1", DRIVER, "pool-1", 3, 5, 4, n1)],
        &[],
    );
    let p = &got.pools[0];
    assert_eq!(
        p.validation_error.as_deref(),
        Some("pool test.example.com/pool-1 is incomplete: observed 1/5 slices at generation 3")
    );
    assert_eq!(
        (p.total_devices, p.allocated_devices, p.resource_slice_count),
        (None, None, None)
    );
    assert!(got.has_incomplete_pool());
    assert_eq!(got.message, "Calculated status for 1 pools (1 incomplete)");

    // same-node-pool-sets-nodename, mixed-node-pool-clears-nodename,
    // nil-nodename-slices-no-nodename.
    let node_of = |slices: &[ResourceSlice]| {
        answer_136(DRIVER, None, None, slices, &[]).pools[0]
            .node_name
            .clone()
    };
    assert_eq!(
        node_of(&[
            slice("a", DRIVER, "p", 1, 2, 1, n1),
            slice("b", DRIVER, "p", 1, 2, 1, n1)
        ]),
        Some("node-1".into())
    );
    assert_eq!(
        node_of(&[
            slice("a", DRIVER, "p", 1, 2, 1, n1),
            slice("b", DRIVER, "p", 1, 2, 1, Some("node-2"))
        ]),
        None
    );
    assert_eq!(
        node_of(&[
            slice("a", DRIVER, "p", 1, 2, 1, None),
            slice("b", DRIVER, "p", 1, 2, 1, None)
        ]),
        None
    );
}

#[test]
fn is_older_than_table() {
    let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
    let ago = |mins: i64| Some(now.checked_sub(SignedDuration::from_mins(mins)).unwrap());
    let hour = Duration::from_secs(3600);
    let rows = [
        ("zero-time-is-not-older", None, false),
        ("recent-time-is-not-older", ago(30), false),
        ("old-time-is-older", ago(120), true),
        ("just-under-boundary-is-not-older", ago(59), false),
    ];
    for (name, at, want) in rows {
        assert_eq!(is_older_than(at, hour, now), want, "{name}");
    }
}

#[test]
fn should_delete_request_table() {
    let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
    let ago = |mins: i64| Some(now.checked_sub(SignedDuration::from_mins(mins)).unwrap());
    let rows = [
        ("completed-request-not-expired", ago(0), Some(ago(0)), false),
        ("completed-request-expired", ago(180), Some(ago(120)), true),
        ("pending-request-not-expired", ago(0), None, false),
        ("pending-request-expired", ago(25 * 60), None, true),
        // A status without Complete or Failed: its creation, with the hour.
        ("status-without-condition", ago(61), Some(None), true),
    ];
    for (name, created, answered, want) in rows {
        assert_eq!(should_delete(created, answered, now), want, "{name}");
    }
}

#[test]
fn an_incomplete_pool_waits_for_its_slices_then_is_answered() {
    let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
    let ago = |secs: i64| Some(now.checked_sub(SignedDuration::from_secs(secs)).unwrap());
    let n1 = Some("node-1");
    let complete = answer_136(
        DRIVER,
        None,
        None,
        &[slice("s1", DRIVER, "pool-1", 1, 1, 4, n1)],
        &[],
    );
    let incomplete = answer_136(
        DRIVER,
        None,
        None,
        &[slice("s1", DRIVER, "pool-1", 1, 2, 4, n1)],
        &[],
    );
    // An incomplete pool past `limit` is not returned: nothing to wait for.
    let beyond_limit = answer_136(
        DRIVER,
        None,
        Some(1),
        &[
            slice("a", DRIVER, "pool-a", 1, 1, 4, n1),
            slice("b", DRIVER, "pool-b", 1, 2, 4, n1),
        ],
        &[],
    );
    let rows = [
        ("complete-at-once", &complete, ago(0), Reply::Write),
        (
            "incomplete-just-created",
            &incomplete,
            ago(0),
            Reply::WaitForSlices(Duration::from_secs(2)),
        ),
        (
            "incomplete-near-the-end-of-the-grace",
            &incomplete,
            ago(29),
            Reply::WaitForSlices(Duration::from_secs(1)),
        ),
        (
            "incomplete-after-the-grace",
            &incomplete,
            ago(30),
            Reply::Write,
        ),
        (
            "incomplete-without-creation-time",
            &incomplete,
            None,
            Reply::Write,
        ),
        (
            "incomplete-beyond-the-limit",
            &beyond_limit,
            ago(0),
            Reply::Write,
        ),
    ];
    for (name, answer, created, want) in rows {
        assert_eq!(when_to_reply(answer, created, now), want, "{name}");
    }
}

#[test]
fn answered_at_is_the_first_complete_or_failed_condition() {
    use k8s_openapi::api::resource::v1alpha3::ResourcePoolStatusRequestStatus;
    let status: ResourcePoolStatusRequestStatus = serde_json::from_value(json!({
        "poolCount": 0,
        "conditions": [
            {"type": "Other", "status": "True", "reason": "R", "message": "",
             "lastTransitionTime": "2026-01-01T10:00:00Z"},
            {"type": "Failed", "status": "True", "reason": "CalculationFailed", "message": "",
             "lastTransitionTime": "2026-01-01T11:00:00Z"},
            {"type": "Complete", "status": "True", "reason": COMPLETE_REASON, "message": "",
             "lastTransitionTime": "2026-01-01T11:30:00Z"}
        ]
    }))
    .unwrap();
    assert_eq!(
        answered_at(Some(&status)),
        Some(Some("2026-01-01T11:00:00Z".parse().unwrap()))
    );
    let bare: ResourcePoolStatusRequestStatus =
        serde_json::from_value(json!({"poolCount": 0})).unwrap();
    assert_eq!(answered_at(Some(&bare)), Some(None));
    assert_eq!(answered_at(None), None);
}

/// A slice of `pool-1` with five devices, `d0`..`d4`, some tainted.
fn tainted_slice(taints: &[(&str, &str)]) -> ResourceSlice {
    let devices: Vec<serde_json::Value> = (0..5)
        .map(|i| {
            let name = format!("d{i}");
            let taints: Vec<serde_json::Value> = taints
                .iter()
                .filter(|(d, _)| *d == name)
                .map(|(_, effect)| json!({"key": "k", "effect": effect}))
                .collect();
            json!({"name": name, "taints": taints})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "s1"},
        "spec": {"driver": DRIVER, "nodeName": "node-1",
                 "pool": {"name": "pool-1", "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    }))
    .unwrap()
}

fn claim_with(results: serde_json::Value) -> ClaimView {
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns"},
        "status": {"allocation": {"devices": {"results": results}}},
    }))
    .unwrap()
}

fn rule(effect: &str, device: &str) -> TaintRule {
    let rule: k8s_openapi::api::resource::v1::DeviceTaintRule = serde_json::from_value(json!({
        "metadata": {"name": "r"},
        "spec": {"deviceSelector": {"driver": DRIVER, "pool": "pool-1", "device": device},
                 "taint": {"key": "k", "effect": effect}},
    }))
    .unwrap();
    TaintRule::from_v1(&rule)
}

/// 1.37's additions: (allocated, available, unavailable) of pool-1.
#[test]
fn calculate_pool_status_as_1_37_counts() {
    let one = |taints: &[(&str, &str)], claims: &[ClaimView], rules: &[TaintRule]| {
        let got = answer_137(&[tainted_slice(taints)], claims, rules);
        let p = &got.pools[0];
        (
            p.allocated_devices.unwrap(),
            p.available_devices.unwrap(),
            p.unavailable_devices.unwrap(),
        )
    };
    let on = |d: &str| json!({"request": "r", "driver": DRIVER, "pool": "pool-1", "device": d});
    let admin = |d: &str| json!({"request": "r", "driver": DRIVER, "pool": "pool-1", "device": d, "adminAccess": true});
    /// (allocated, available, unavailable)
    type Counts = (i32, i32, i32);
    let rows: [(&str, Counts, Counts); 6] = [
        (
            "CapAtOnePerDevice: three claims on d0",
            one(
                &[],
                &[
                    claim_with(json!([on("d0")])),
                    claim_with(json!([on("d0")])),
                    claim_with(json!([on("d0")])),
                ],
                &[],
            ),
            (1, 4, 0),
        ),
        (
            "SkipAdminAccess",
            one(
                &[],
                &[
                    claim_with(json!([on("d0")])),
                    claim_with(json!([admin("d1")])),
                ],
                &[],
            ),
            (1, 4, 0),
        ),
        (
            "UnavailableFromTaints/NoSchedule",
            one(&[("d0", "NoSchedule"), ("d1", "NoSchedule")], &[], &[]),
            (0, 3, 2),
        ),
        (
            "UnavailableFromTaints/NoExecute, one device tainted twice",
            one(
                &[
                    ("d0", "NoExecute"),
                    ("d0", "NoSchedule"),
                    ("d1", "NoExecute"),
                ],
                &[],
                &[],
            ),
            (0, 3, 2),
        ),
        (
            "NoneTaintIsAvailable",
            one(&[("d0", "None")], &[], &[]),
            (0, 5, 0),
        ),
        (
            "UnavailableFromTaintRule (a None rule does nothing)",
            one(&[], &[], &[rule("NoExecute", "d3"), rule("None", "d4")]),
            (0, 4, 1),
        ),
    ];
    for (name, got, want) in rows {
        assert_eq!(got, want, "{name}");
    }
    // Allocated and tainted: subtracted twice, as 1.37 does.
    assert_eq!(
        one(
            &[("d0", "NoSchedule")],
            &[claim_with(json!([on("d0")]))],
            &[]
        ),
        (1, 3, 1)
    );
}

/// 1.37's incomplete pool: the `PoolIncomplete:` prefix.
#[test]
fn incomplete_pool_is_prefixed_as_1_37_writes_it() {
    let slices = [slice("s1", DRIVER, "pool-1", 3, 5, 4, Some("node-1"))];
    let got = answer_137(&slices, &[], &[]);
    assert_eq!(
        got.pools[0].validation_error.as_deref(),
        Some(
            "PoolIncomplete: pool test.example.com/pool-1 is incomplete: observed 1/5 slices at generation 3"
        )
    );
    assert!(got.has_incomplete_pool());
    assert_eq!(got.message, "Calculated status for 1 pools (1 incomplete)");
}

/// 1.37's `TestCalculatePoolStatus_PartitionSummary`,
/// `_PoolAttributeBeatsRequestDefault`, `_RequestPartitionAttribute`,
/// `_ShareableSummary` and `TestSyncRequestWritesStructuralViewError`,
/// through the whole answer: a counters-only slice beside a devices slice,
/// claims' consumption summed (admin access skipped), a summary's problem
/// reported beside the pool's counts.
#[test]
fn summaries_in_the_answer_as_1_37_writes_them() {
    let pool_slice = |name: &str, spec: serde_json::Value| -> ResourceSlice {
        let mut s = json!({
            "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": "node-1",
                     "pool": {"name": "pool-1", "generation": 1, "resourceSliceCount": 2}},
        });
        for (k, v) in spec.as_object().unwrap() {
            s["spec"][k] = v.clone();
        }
        serde_json::from_value(s).unwrap()
    };
    let part = |name: &str, profile: &str, memory: &str| {
        json!({"name": name, "attributes": {"profile": {"string": profile}},
               "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": memory}}}]})
    };
    let counters = pool_slice(
        "counters",
        json!({"sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]}),
    );
    let devices = |attribute: Option<&str>| {
        let mut spec = json!({"devices": [
            part("full-0", "1g.80gb", "80Gi"), part("half-0", "1g.40gb", "40Gi"),
            part("half-1", "1g.40gb", "40Gi"),
            {"name": "shared-0", "allowMultipleAllocations": true, "capacity": {"memory": {"value": "40Gi"}}},
        ]});
        if let Some(a) = attribute {
            spec["partitionTypeAttribute"] = json!(a);
        }
        pool_slice("devices", spec)
    };
    let ask = |default: Option<&str>, slices: &[ResourceSlice], claims: &[ClaimView]| {
        let question = Question {
            driver: DRIVER,
            default_partition_type_attribute: default,
            ..Question::default()
        };
        let a = answer(question, Counting::V1_37 { rules: &[] }, slices, claims);
        a.pools.into_iter().next().unwrap()
    };
    let claims = [
        claim_with(
            json!([{"request": "r", "driver": DRIVER, "pool": "pool-1", "device": "half-0"}]),
        ),
        claim_with(
            json!([{"request": "r", "driver": DRIVER, "pool": "pool-1", "device": "shared-0",
                           "shareID": "a", "consumedCapacity": {"memory": "10Gi"}}]),
        ),
        claim_with(
            json!([{"request": "r", "driver": DRIVER, "pool": "pool-1", "device": "shared-0",
                           "shareID": "b", "consumedCapacity": {"memory": "6Gi"}}]),
        ),
        claim_with(
            json!([{"request": "r", "driver": DRIVER, "pool": "pool-1", "device": "full-0",
                           "adminAccess": true}]),
        ),
    ];
    let rows = |p: &PoolAnswer| -> Vec<(String, String, i32, i32)> {
        p.partition_summary
            .iter()
            .flatten()
            .map(|t| (t.attribute.clone(), t.type_.clone(), t.total, t.allocatable))
            .collect()
    };
    let profile = "test.example.com/profile";
    let want = vec![
        (profile.to_string(), "1g.40gb".to_string(), 2, 1),
        (profile.to_string(), "1g.80gb".to_string(), 1, 0),
    ];

    // _PartitionSummary: the slice names the attribute.
    let slices = [counters.clone(), devices(Some(profile))];
    let pool = ask(None, &slices, &claims);
    assert_eq!(pool.resource_slice_count, Some(2));
    assert_eq!(
        (pool.total_devices, pool.allocated_devices),
        (Some(4), Some(2))
    );
    assert_eq!(rows(&pool), want);
    assert_eq!(pool.validation_error, None);
    // _ShareableSummary: both shares summed, the admin result skipped.
    let shared = pool.shareable_summary.unwrap();
    assert_eq!((shared.fully_available, shared.partially_available), (0, 1));
    let memory = &shared.capacity[0];
    assert_eq!(
        (
            &*memory.name,
            &*memory.total,
            &*memory.consumed,
            &*memory.available
        ),
        ("memory", "40Gi", "16Gi", "24Gi")
    );

    // _RequestPartitionAttribute: the request's default fills in.
    let plain = [counters.clone(), devices(None)];
    assert_eq!(rows(&ask(Some(profile), &plain, &claims)), want);
    assert_eq!(rows(&ask(None, &plain, &claims)), Vec::new());
    // _PoolAttributeBeatsRequestDefault
    let other = "test.example.com/other";
    assert_eq!(rows(&ask(Some(other), &slices, &claims)), want);

    // WritesStructuralViewError: an attribute without counters is reported
    // on a complete pool that keeps its counts; the answer is written.
    let lone = [pool_slice(
        "devices",
        json!({"pool": {"name": "pool-1", "generation": 1, "resourceSliceCount": 1},
               "partitionTypeAttribute": profile, "devices": [part("full-0", "1g.80gb", "80Gi")]}),
    )];
    let question = Question {
        driver: DRIVER,
        ..Question::default()
    };
    let whole = answer(question, Counting::V1_37 { rules: &[] }, &lone, &[]);
    let pool = &whole.pools[0];
    assert!(
        pool.validation_error
            .as_deref()
            .unwrap()
            .starts_with("PartitionTypeMissing: pool test.example.com/pool-1 declares")
    );
    assert_eq!(pool.total_devices, Some(1));
    assert_eq!(pool.partition_summary, None);
    assert_eq!(when_to_reply(&whole, None, Timestamp::now()), Reply::Write);
    assert_eq!(
        whole.message,
        "Calculated status for 1 pools (1 incomplete)"
    );
    // 1.36 writes no summaries.
    let pool = answer_136(DRIVER, None, None, &slices, &claims)
        .pools
        .remove(0);
    assert_eq!(
        (pool.partition_summary, pool.shareable_summary),
        (None, None)
    );
}

/// 1.38 (kubernetes #142202, "capacity names qualified or unqualified";
/// the counting is inferred from pre-release source): a claim's
/// `consumedCapacity` and a slice's `capacity` name the same capacity
/// whether or not they carry the driver's domain, so the shareable
/// summary counts what 1.37 missed; the summary keeps the slice's spelling,
/// and a name of another domain stays another capacity.
#[test]
fn capacity_names_with_or_without_the_drivers_domain_as_1_38() {
    let slice: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "devices"},
        "spec": {"driver": DRIVER, "nodeName": "node-1",
                 "pool": {"name": "pool-1", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "shared-0", "allowMultipleAllocations": true,
                              "capacity": {"memory": {"value": "40Gi"},
                                           "test.example.com/cores": {"value": "8"}}}]},
    }))
    .unwrap();
    let share = |id: &str, consumed: serde_json::Value| {
        claim_with(json!([{"request": "r", "driver": DRIVER, "pool": "pool-1",
                           "device": "shared-0", "shareID": id, "consumedCapacity": consumed}]))
    };
    let claims = [
        share(
            "a",
            json!({"test.example.com/memory": "10Gi", "cores": "2"}),
        ),
        share("b", json!({"memory": "6Gi"})),
        share("c", json!({"other.example.com/memory": "1Gi"})),
    ];
    let consumed = |counting: Counting<'_>| -> Vec<(String, String)> {
        let question = Question {
            driver: DRIVER,
            ..Question::default()
        };
        let pool = answer(question, counting, std::slice::from_ref(&slice), &claims)
            .pools
            .remove(0);
        pool.shareable_summary
            .unwrap()
            .capacity
            .into_iter()
            .map(|c| (c.name, c.consumed))
            .collect()
    };
    assert_eq!(
        consumed(Counting::V1_38 { rules: &[] }),
        [
            ("memory".to_string(), "16Gi".to_string()),
            ("test.example.com/cores".to_string(), "2".to_string()),
        ]
    );
    // 1.37 compares names as written.
    assert_eq!(
        consumed(Counting::V1_37 { rules: &[] }),
        [
            ("memory".to_string(), "6Gi".to_string()),
            ("test.example.com/cores".to_string(), "0".to_string()),
        ]
    );
}
