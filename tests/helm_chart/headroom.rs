//! The chart's headroom: the CRDs, flags, rights and alerts of its three front doors.

use super::*;

/// headroom.enabled: the flag, the PriorityClass, and exactly the rights
/// the headroom controller needs on top of the claim controller's.
#[test]
fn headroom_adds_its_flag_class_and_rights_only_when_enabled() {
    let off = render_or_skip!(&[]);
    assert!(all_of_kind(&off, "PriorityClass").is_empty());
    assert!(args(&off).contains(&"--controllers=*".to_string()));
    let on = render_or_skip!(&[("headroom.enabled", "true")]);
    assert!(args(&on).contains(&"--controllers=*,headroom".to_string()));
    let class = one_of_kind(&on, "PriorityClass");
    assert_eq!(class["metadata"]["name"], "dra-headroom");
    assert_eq!(class["value"], -1);
    assert_eq!(class["preemptionPolicy"], "Never");
    let mut want = expected_cluster_rules();
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    want.insert(
        (
            "dra-claim-controller.io".into(),
            "nodescalingwatermarks".into(),
        ),
        set(&["get", "list", "watch"]),
    );
    want.insert(
        (
            "dra-claim-controller.io".into(),
            "nodescalingwatermarks/status".into(),
        ),
        set(&["patch"]),
    );
    want.insert(
        ("apps".into(), "deployments".into()),
        set(&["get", "list", "watch", "create", "patch", "delete"]),
    );
    want.insert(
        ("resource.k8s.io".into(), "resourceclaimtemplates".into()),
        set(&["get", "list", "watch", "create", "patch", "delete"]),
    );
    for resource in ["resourceslices", "deviceclasses"] {
        want.insert(
            ("resource.k8s.io".into(), resource.into()),
            set(&["get", "list", "watch"]),
        );
    }
    want.insert(("".into(), "nodes".into()), set(&["list", "watch"]));
    want.insert(
        ("".into(), "pods".into()),
        set(&["get", "list", "watch", "delete", "patch"]),
    );
    assert_eq!(bound_cluster_rules(&on), want);
    let no_class = render_or_skip!(&[
        ("headroom.enabled", "true"),
        ("headroom.priorityClass.create", "false")
    ]);
    assert!(all_of_kind(&no_class, "PriorityClass").is_empty());
}

/// With headroom.enabled the PrometheusRule also alerts on placeholders
/// Pending for long (the autoscaler is not adding nodes); not without.
#[test]
fn headroom_alert_only_with_headroom() {
    let alert_names = |docs: &[Value]| -> Vec<String> {
        one_of_kind(docs, "PrometheusRule")["spec"]["groups"][0]["rules"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|r| str_of(&r["alert"]))
            .collect()
    };
    let off = render_or_skip!(&[("prometheusRule.enabled", "true")]);
    assert!(!alert_names(&off).contains(&"DRAHeadroomPlaceholdersPending".to_string()));
    let on = render_or_skip!(&[
        ("prometheusRule.enabled", "true"),
        ("headroom.enabled", "true")
    ]);
    let rule = one_of_kind(&on, "PrometheusRule")["spec"]["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|r| r["alert"] == "DRAHeadroomPlaceholdersPending")
        .expect("the headroom alert")
        .clone();
    assert_eq!(
        str_of(&rule["expr"]),
        r#"max by (namespace, watermark, entry) (dra_headroom_placeholders{state="pending"}) > 0"#
    );
    assert_eq!(rule["for"], "15m");
}

#[test]
fn the_seed_operators_crd_rbac_and_flag_come_only_when_asked_for() {
    let off = render_or_skip!(&[("headroom.enabled", "true")]);
    assert!(all_of_kind(&off, "CustomResourceDefinition").is_empty());
    assert!(!args(&off).iter().any(|a| a.contains("seed")));
    let on = render_or_skip!(&[
        ("headroom.enabled", "true"),
        ("headroom.seedOperator.enabled", "true")
    ]);
    let crd = one_of_kind(&on, "CustomResourceDefinition");
    assert_eq!(
        str_of(&crd["metadata"]["name"]),
        "nodescalingwatermarks.redhatcop.redhat.io"
    );
    assert_eq!(
        str_of(&crd["metadata"]["annotations"]["helm.sh/resource-policy"]),
        "keep",
        "uninstalling must not delete the admins' watermarks"
    );
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(
        str_of(&spec["properties"]["priorityClassName"]["default"]),
        "proactive-node-autoscaling-pods"
    );
    assert!(
        spec["properties"]["pausePodSize"]["additionalProperties"].is_mapping(),
        "every resource name is accepted"
    );
    assert!(args(&on).contains(&"--headroom-seed-watermarks=true".to_string()));
    let rules = bound_cluster_rules(&on);
    assert!(
        rules
            .keys()
            .any(|(group, resource)| group == "redhatcop.redhat.io"
                && resource == "nodescalingwatermarks/status"),
        "{rules:?}"
    );
}

#[test]
fn capacity_buffers_bring_their_flag_and_rbac_only_when_asked_for() {
    let key = (
        "autoscaling.x-k8s.io".to_string(),
        "capacitybuffers/status".to_string(),
    );
    let off = render_or_skip!(&[("headroom.enabled", "true")]);
    assert!(!args(&off).iter().any(|a| a.contains("capacity-buffers")));
    assert!(!bound_cluster_rules(&off).contains_key(&key));
    let on = render_or_skip!(&[
        ("headroom.enabled", "true"),
        ("headroom.capacityBuffers.enabled", "true")
    ]);
    assert!(args(&on).contains(&"--headroom-capacity-buffers=true".to_string()));
    let rules = bound_cluster_rules(&on);
    assert!(rules.contains_key(&key), "{rules:?}");
    // Every kind a buffer may read its pod shape from: read and watched.
    let watched: BTreeSet<String> = ["get", "list", "watch"].map(String::from).into();
    for (group, resource) in [
        ("", "podtemplates"),
        ("apps", "deployments"),
        ("apps", "replicasets"),
        ("apps", "statefulsets"),
        ("batch", "jobs"),
    ] {
        let verbs = &rules[&(group.to_string(), resource.to_string())];
        assert!(verbs.is_superset(&watched), "{resource}: {verbs:?}");
    }
    assert!(
        all_of_kind(&on, "CustomResourceDefinition").is_empty(),
        "the autoscaler owns the CapacityBuffer CRD"
    );
}
