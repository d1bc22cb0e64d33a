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
    want.remove(&(String::new(), "pods/eviction".into()));
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

/// The DeviceTaintRule versions whose discovery the bound ClusterRole
/// grants.
fn rule_discovery(docs: &[Value]) -> Vec<String> {
    bound_cluster_rules(docs)
        .into_keys()
        .filter(|(group, url)| group == NON_RESOURCE && url.starts_with("/apis/resource.k8s.io/"))
        .map(|(_, url)| url.trim_start_matches("/apis/resource.k8s.io/").to_string())
        .collect()
}

/// Acting as 1.38 (pinned, or on a cluster Helm sees as 1.38 or later),
/// DeviceTaintRules are read in `v1` only: the chart grants no `v1beta2`
/// discovery, and a pinned release reaches the flag. Older clusters keep
/// both versions (1.36 serves rules in `v1beta2` only).
#[test]
fn from_1_38_device_taint_rules_are_read_in_v1_only() {
    let Some(default) = render_for(&[], Some("v1.37.0"), &[]) else {
        return;
    };
    let default = default.unwrap();
    assert_eq!(rule_discovery(&default), ["v1", "v1beta2"]);
    assert!(
        !args(&default)
            .iter()
            .any(|a| a.starts_with("--reference-release"))
    );

    let on_1_38 = render_for(&[], Some("v1.38.0"), &[]).unwrap().unwrap();
    assert_eq!(rule_discovery(&on_1_38), ["v1"]);

    let pinned = render_for(&[("referenceRelease", "1.38")], Some("v1.37.0"), &[])
        .unwrap()
        .unwrap();
    assert_eq!(rule_discovery(&pinned), ["v1"]);
    assert!(
        args(&pinned).contains(&"--reference-release=1.38".to_string()),
        "{:?}",
        args(&pinned)
    );

    let err = render_err_or_skip!(&[("referenceRelease", "1.39")]);
    assert!(err.contains("referenceRelease"), "{err}");
}
