//! The chart's device-taint eviction controller: on by default (as
//! kube-controller-manager's), its flags from values, and its rights gone
//! when it is turned off.

use super::*;

#[test]
fn device_taint_eviction_is_on_by_default_and_its_rights_go_with_it() {
    let on = render_or_skip!(&[
        ("deviceTaintEviction.evictionsPerSecond", "3"),
        ("deviceTaintEviction.maxShare", "1"),
    ]);
    let got = args(&on);
    for want in [
        "--controllers=*",
        "--concurrent-device-taint-eviction-syncs=8",
        "--device-taint-evictions-per-second=3",
        "--device-taint-evictions-per-rule-per-second=5",
        "--device-taint-eviction-max-share=1",
    ] {
        assert!(
            got.contains(&want.to_string()),
            "{want} missing from {got:?}"
        );
    }

    let off = render_or_skip!(&[("deviceTaintEviction.enabled", "false")]);
    let got = args(&off);
    assert!(
        got.contains(&"--controllers=resourceclaim,resourcepoolstatusrequest".to_string()),
        "{got:?}"
    );
    assert!(!got.iter().any(|a| a.contains("device-taint")), "{got:?}");
    let rules = bound_cluster_rules(&off);
    let mut want = expected_cluster_rules();
    want.remove(&("resource.k8s.io".into(), "resourceslices".into()));
    want.remove(&("resource.k8s.io".into(), "devicetaintrules".into()));
    want.remove(&("resource.k8s.io".into(), "devicetaintrules/status".into()));
    want.get_mut(&(String::new(), "pods".into()))
        .unwrap()
        .remove("delete");
    for version in ["v1", "v1beta2"] {
        want.remove(&(
            NON_RESOURCE.into(),
            format!("/apis/resource.k8s.io/{version}"),
        ));
    }
    assert_eq!(rules, want);
}

/// A share above 1 or at 0 is refused by the schema, before any pod starts.
#[test]
fn device_taint_eviction_values_are_checked() {
    for bad in ["0", "1.5", "-1"] {
        let err = render_err_or_skip!(&[("deviceTaintEviction.maxShare", bad)]);
        assert!(err.contains("maxShare"), "maxShare={bad}: {err}");
    }
}
