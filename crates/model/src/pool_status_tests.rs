//! The answer table: rows carry the names of kube-controller-manager
//! 1.36's `TestCalculatePoolStatus`, `TestIsOlderThan` and
//! `TestShouldDeleteRequest` cases, with the same set-up and outcome.

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
        let got = answer(DRIVER, r.pool_name, r.limit, &r.slices, &r.claims);
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
    let got = answer(
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
    let got = answer(
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
        answer(DRIVER, None, None, slices, &[]).pools[0]
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
    let complete = answer(
        DRIVER,
        None,
        None,
        &[slice("s1", DRIVER, "pool-1", 1, 1, 4, n1)],
        &[],
    );
    let incomplete = answer(
        DRIVER,
        None,
        None,
        &[slice("s1", DRIVER, "pool-1", 1, 2, 4, n1)],
        &[],
    );
    // An incomplete pool past `limit` is not returned: nothing to wait for.
    let beyond_limit = answer(
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
