//! The chart's ResourcePoolStatusRequest controller: named in
//! `--controllers` by default, its rights granted only with the
//! `DRAResourcePoolStatus` gate in `featureGates` (alpha, off by default),
//! and gone with `poolStatusRequests.enabled=false`.

use super::*;

const GATED: &str = "DRAAdminAccess=true\\,DRAResourcePoolStatus=true";

fn pool_status_rules() -> BTreeMap<(String, String), BTreeSet<String>> {
    let verbs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    BTreeMap::from([
        (
            (
                "resource.k8s.io".into(),
                "resourcepoolstatusrequests".into(),
            ),
            verbs(&["get", "list", "watch", "delete"]),
        ),
        (
            (
                "resource.k8s.io".into(),
                "resourcepoolstatusrequests/status".into(),
            ),
            verbs(&["update"]),
        ),
        (
            (NON_RESOURCE.into(), "/apis/resource.k8s.io/v1alpha3".into()),
            verbs(&["get"]),
        ),
    ])
}

#[test]
fn pool_status_requests_get_rights_only_with_their_gate() {
    let default = render_or_skip!(&[]);
    assert!(args(&default).contains(&"--controllers=*".to_string()));
    assert_eq!(bound_cluster_rules(&default), expected_cluster_rules());

    let gated = render_or_skip!(&[("featureGates", GATED)]);
    let mut want = expected_cluster_rules();
    want.extend(pool_status_rules());
    assert_eq!(bound_cluster_rules(&gated), want);
    assert!(
        args(&gated).contains(
            &"--feature-gates=DRAAdminAccess=true,DRAResourcePoolStatus=true".to_string()
        )
    );

    let off = render_or_skip!(&[
        ("featureGates", GATED),
        ("poolStatusRequests.enabled", "false")
    ]);
    assert!(
        args(&off).contains(&"--controllers=*,-resourcepoolstatusrequest".to_string()),
        "{:?}",
        args(&off)
    );
    assert_eq!(bound_cluster_rules(&off), expected_cluster_rules());

    // Without the eviction controller, requests still read DeviceTaintRules
    // (1.37 counts the devices they taint): the rights to list them stay,
    // or the process would wait for that list forever.
    let plain = render_or_skip!(&[("deviceTaintEviction.enabled", "false")]);
    let alone = render_or_skip!(&[
        ("deviceTaintEviction.enabled", "false"),
        ("featureGates", GATED)
    ]);
    let mut want = bound_cluster_rules(&plain);
    want.extend(pool_status_rules());
    let read = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    for resource in ["devicetaintrules", "resourceslices"] {
        want.insert(
            ("resource.k8s.io".into(), resource.into()),
            read(&["get", "list", "watch"]),
        );
    }
    for version in ["v1", "v1beta2"] {
        want.insert(
            (
                NON_RESOURCE.into(),
                format!("/apis/resource.k8s.io/{version}"),
            ),
            read(&["get"]),
        );
    }
    assert_eq!(bound_cluster_rules(&alone), want);
}
