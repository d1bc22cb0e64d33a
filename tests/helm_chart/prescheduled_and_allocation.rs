//! The chart's pre-scheduled pods: the admission policy, PodGroup rights, --allocate-on-nodes.

use super::*;

#[test]
fn prescheduled_policy_is_off_by_default() {
    let docs = render_or_skip!(&[]);
    assert!(all_of_kind(&docs, "MutatingAdmissionPolicy").is_empty());
    assert!(all_of_kind(&docs, "MutatingAdmissionPolicyBinding").is_empty());
}

#[test]
fn prescheduled_policy_shape() {
    let docs = render_or_skip!(&[
        ("prescheduledPods.policy.enabled", "true"),
        (
            "prescheduledPods.policy.namespaceSelector.matchLabels.team",
            "ml"
        ),
    ]);
    let policy = one_of_kind(&docs, "MutatingAdmissionPolicy");
    let binding = one_of_kind(&docs, "MutatingAdmissionPolicyBinding");
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(
        binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]["team"],
        "ml"
    );
    assert!(binding["spec"]["matchResources"]["objectSelector"].is_null());
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    assert_eq!(spec["reinvocationPolicy"], "Never");
    let rule = &spec["matchConstraints"]["resourceRules"][0];
    assert_eq!(strings(&rule["operations"]), vec!["CREATE"]);
    assert_eq!(strings(&rule["resources"]), vec!["pods"]);
    let conditions: Vec<String> = spec["matchConditions"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| str_of(&c["expression"]))
        .collect();
    assert!(
        conditions
            .iter()
            .any(|c| c.contains("object.spec.nodeName"))
    );
    assert!(
        conditions
            .iter()
            .any(|c| c.contains("object.spec.resourceClaims"))
    );
    assert!(
        conditions
            .iter()
            .any(|c| c.contains("kubernetes.io/config.mirror"))
    );
    let patch = str_of(&spec["mutations"][0]["jsonPatch"]["expression"]);
    assert!(
        patch.contains(r#"op: "remove", path: "/spec/nodeName""#),
        "{patch}"
    );
    assert!(patch.contains("dra-claim-controller.io/requested-node-name"));
    assert!(
        !patch.contains("/spec/tolerations"),
        "no toleration unless asked"
    );
    let docs = render_or_skip!(&[
        ("prescheduledPods.policy.enabled", "true"),
        ("prescheduledPods.policy.tolerateAllTaints", "true"),
        ("prescheduledPods.policy.failurePolicy", "Ignore"),
    ]);
    let policy = one_of_kind(&docs, "MutatingAdmissionPolicy");
    assert_eq!(policy["spec"]["failurePolicy"], "Ignore");
    let patch = str_of(&policy["spec"]["mutations"][0]["jsonPatch"]["expression"]);
    assert!(patch.contains(r#"{"operator": "Exists"}"#), "{patch}");
    assert!(
        one_of_kind(&docs, "MutatingAdmissionPolicyBinding")["spec"]["matchResources"].is_null()
    );
}

/// Clusters without MutatingAdmissionPolicy (1.34/1.35 defaults) fail the
/// install with a clear message, only when the policy is enabled; where
/// only v1beta1 is served, v1beta1 objects are rendered.
#[test]
fn prescheduled_policy_follows_the_cluster() {
    let enabled = [("prescheduledPods.policy.enabled", "true")];
    let Some(without) = render_for(&enabled, Some("v1.35.0"), &[]) else {
        return;
    };
    let err = without.expect_err("1.35 without the API must fail");
    assert!(
        err.contains("prescheduledPods.policy.enabled=true needs MutatingAdmissionPolicy")
            && err.contains("v1.35.0")
            && err.contains("MutatingAdmissionPolicy=true"),
        "{err}"
    );
    let off = render_for(&[], Some("v1.35.0"), &[]).unwrap();
    assert!(off.is_ok(), "policy off installs anywhere: {off:?}");
    let beta = render_for(
        &enabled,
        Some("v1.35.0"),
        &["admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"],
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        one_of_kind(&beta, "MutatingAdmissionPolicy")["apiVersion"],
        "admissionregistration.k8s.io/v1beta1"
    );
    let served = render_for(
        &enabled,
        Some("v1.36.1"),
        &["admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"],
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        one_of_kind(&served, "MutatingAdmissionPolicyBinding")["apiVersion"],
        "admissionregistration.k8s.io/v1"
    );
}

#[test]
fn notes_explain_the_prescheduled_policy_when_on() {
    let notes = match helm::render_notes(
        RELEASE,
        NAMESPACE,
        &[("prescheduledPods.policy.enabled", "true")],
    ) {
        Ok(Some(n)) => n,
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    assert!(notes.contains("Pre-scheduled pods policy is ON"), "{notes}");
    assert!(notes.contains("tolerateAllTaints=true"), "{notes}");
    assert!(notes.contains("requested-node-name"), "{notes}");
    let off = helm::render_notes(RELEASE, NAMESPACE, &[])
        .unwrap()
        .unwrap();
    assert!(!off.contains("Pre-scheduled pods policy"), "{off}");
}

/// PodGroup access only with DRAWorkloadResourceClaims on.
#[test]
fn podgroup_rules_only_with_the_gate() {
    let on = render_or_skip!(&[(
        "featureGates",
        r"DRAAdminAccess=true\,DRAWorkloadResourceClaims=true"
    )]);
    let binding = one_of_kind(&on, "ClusterRoleBinding");
    let role = all_of_kind(&on, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == binding["roleRef"]["name"])
        .unwrap();
    let mut expected = expected_cluster_rules();
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    expected.insert(
        ("scheduling.k8s.io".into(), "podgroups".into()),
        set(&["get", "list", "watch"]),
    );
    expected.insert(
        ("scheduling.k8s.io".into(), "podgroups/status".into()),
        set(&["patch"]),
    );
    assert_eq!(rules_by_resource(role), expected);
    let alias = render_or_skip!(&[("featureGates", "WorkloadResourceClaims=true")]);
    let binding = one_of_kind(&alias, "ClusterRoleBinding");
    let role = all_of_kind(&alias, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == binding["roleRef"]["name"])
        .unwrap();
    assert_eq!(
        rules_by_resource(role),
        expected,
        "the gate's other spelling"
    );
    let off = render_or_skip!(&[("featureGates", "DRAWorkloadResourceClaims=false")]);
    let binding = one_of_kind(&off, "ClusterRoleBinding");
    let role = all_of_kind(&off, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == binding["roleRef"]["name"])
        .unwrap();
    assert_eq!(rules_by_resource(role), expected_cluster_rules());
}

#[test]
fn allocation_is_off_by_default() {
    let values = default_values();
    assert_eq!(str_of(&values["allocation"]["nodeSelector"]), "");
    let docs = render_or_skip!(&[]);
    let args = args(&docs);
    assert!(
        !args.iter().any(|a| a.starts_with("--allocate-on-nodes")),
        "{args:?}"
    );
    let rules = bound_cluster_rules(&docs);
    // Slices are read by default too, for the device-taint eviction
    // controller.
    let slices = ("resource.k8s.io".to_string(), "resourceslices".to_string());
    for key in allocation_rules().keys().filter(|k| **k != slices) {
        assert!(!rules.contains_key(key), "{key:?} granted by default");
    }
    assert_eq!(rules, expected_cluster_rules());
}

#[test]
fn allocation_node_selector_sets_flag_and_rbac() {
    let on = render_or_skip!(&[("allocation.nodeSelector", PRE_SCHEDULED)]);
    let got = args(&on);
    let flags: Vec<&String> = got
        .iter()
        .filter(|a| a.starts_with("--allocate-on-nodes"))
        .collect();
    assert_eq!(
        flags,
        [&format!("--allocate-on-nodes={PRE_SCHEDULED}")],
        "{got:?}"
    );
    let mut values = default_values();
    values["allocation"]["nodeSelector"] = Value::String(PRE_SCHEDULED.into());
    assert_eq!(got, expected_args(&values));

    // Exactly the default rules plus the allocation ones: the finalizer and
    // status writes use the resourceclaims patch and the status/binding
    // rules every release has.
    let mut expected = expected_cluster_rules();
    let claims = &expected[&("resource.k8s.io".to_string(), "resourceclaims".to_string())];
    assert!(claims.contains("patch"), "{claims:?}");
    expected.extend(allocation_rules());
    // The annotation that wakes a pre-scheduled pod's kubelet once its
    // devices are allocated.
    expected
        .entry((String::new(), "pods".into()))
        .or_default()
        .insert("patch".into());
    assert_eq!(bound_cluster_rules(&on), expected);

    // Set-based selectors with commas and spaces arrive as one argument.
    let values = "allocation:\n  nodeSelector: \"pool in (a, b),!dra.example.com/drain\"\n";
    let set_based = match helm::render_chart_with_values(RELEASE, NAMESPACE, values, &[]) {
        Ok(Some(yaml)) => docs(&yaml),
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    let got = args(&set_based);
    assert!(
        got.contains(&"--allocate-on-nodes=pool in (a, b),!dra.example.com/drain".to_string()),
        "{got:?}"
    );
}

#[test]
fn double_allocation_alert_follows_values() {
    let alert = |docs: &[Value]| -> Option<Value> {
        one_of_kind(docs, "PrometheusRule")["spec"]["groups"][0]["rules"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|r| r["alert"] == "DRADeviceDoubleAllocation")
            .cloned()
    };
    // Rendered with allocation off too: the gauge is always exported.
    let docs = render_or_skip!(&[
        ("prometheusRule.enabled", "true"),
        ("prometheusRule.alerts.doubleAllocations.for", "10m"),
    ]);
    let rule = alert(&docs).expect("DRADeviceDoubleAllocation rendered");
    assert_eq!(
        str_of(&rule["expr"]),
        "max(dra_claim_controller_device_double_allocations) > 0"
    );
    assert_eq!(rule["for"], "10m");
    assert_eq!(rule["labels"]["severity"], "critical");
    let description = str_of(&rule["annotations"]["description"]);
    assert!(
        description.contains("kubectl get resourceclaims -A"),
        "{description}"
    );
    assert!(description.contains("{{ $value }}"), "{description}");
    assert!(
        str_of(&rule["annotations"]["summary"]).contains("more than one"),
        "{rule:?}"
    );

    let docs = render_or_skip!(&[
        ("prometheusRule.enabled", "true"),
        ("allocation.nodeSelector", PRE_SCHEDULED),
        ("prometheusRule.alerts.doubleAllocations.severity", "page"),
        ("prometheusRule.additionalAlertLabels.team", "dra"),
    ]);
    let rule = alert(&docs).expect("rendered with allocation on");
    assert_eq!(rule["for"], "5m");
    assert_eq!(rule["labels"]["severity"], "page");
    assert_eq!(rule["labels"]["team"], "dra");

    // Turned off like the other alerts: enabled=false, or the key null.
    let docs = render_or_skip!(&[
        ("prometheusRule.enabled", "true"),
        ("prometheusRule.alerts.doubleAllocations.enabled", "false"),
    ]);
    assert!(alert(&docs).is_none());
    let docs = render_or_skip!(&[
        ("prometheusRule.enabled", "true"),
        ("prometheusRule.alerts.doubleAllocations", "null"),
    ]);
    assert!(alert(&docs).is_none());
    assert_eq!(
        one_of_kind(&docs, "PrometheusRule")["spec"]["groups"][0]["rules"]
            .as_sequence()
            .unwrap()
            .len(),
        9,
        "only that alert is dropped"
    );
}

#[test]
fn notes_explain_allocation_when_on() {
    let notes = match helm::render_notes(
        RELEASE,
        NAMESPACE,
        &[("allocation.nodeSelector", PRE_SCHEDULED)],
    ) {
        Ok(Some(n)) => n,
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    for needle in [
        "Allocation on pre-scheduled nodes is ON",
        "kubectl get nodes -l 'dra.example.com/pre-scheduled=true'",
        "NoSchedule",
        "DRADeviceDoubleAllocation",
        "prometheusRule.enabled=true",
    ] {
        assert!(
            notes.contains(needle),
            "NOTES.txt lacks {needle:?}:\n{notes}"
        );
    }
    assert!(
        !notes.contains("prescheduledPods.policy is also on"),
        "{notes}"
    );
    let off = helm::render_notes(RELEASE, NAMESPACE, &[])
        .unwrap()
        .unwrap();
    assert!(!off.contains("Allocation on pre-scheduled nodes"), "{off}");
    assert!(!off.contains("DRADeviceDoubleAllocation"), "{off}");
}

// ---------------------------------------------------------------------------
// Headroom CRD
// ---------------------------------------------------------------------------

/// The NodeScalingWatermark CRD in crds/ (Helm installs it before the
/// templates): the group, names and version of the contract, the status
/// subresource, the printer columns, and the seed operator's fields.
#[test]
fn watermark_crd_matches_the_contract() {
    let path = helm::chart_dir().join("crds/nodescalingwatermarks.yaml");
    let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(crd["kind"], "CustomResourceDefinition");
    assert_eq!(
        crd["metadata"]["name"],
        "nodescalingwatermarks.dra-claim-controller.io"
    );
    let spec = &crd["spec"];
    assert_eq!(spec["group"], "dra-claim-controller.io");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["kind"], "NodeScalingWatermark");
    let version = &spec["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert!(version["subresources"]["status"].is_mapping());
    let columns: Vec<String> = version["additionalPrinterColumns"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| str_of(&c["name"]))
        .collect();
    assert_eq!(
        columns,
        ["Percentage", "Desired", "Ready", "Pending", "Age"]
    );
    let fields = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    for field in [
        "watermarkPercentage",
        "nodeSelector",
        "tolerations",
        "pausePodSize",
        "pausePodImage",
        "priorityClassName",
        "devices",
        "minPlaceholders",
        "maxPlaceholders",
    ] {
        assert!(fields[field].is_mapping(), "spec.{field} missing");
    }
    assert_eq!(fields["watermarkPercentage"]["minimum"], 1);
    assert_eq!(fields["watermarkPercentage"]["maximum"], 100);
    let entry = &fields["devices"]["items"];
    assert_eq!(strings(&entry["required"]), ["name", "deviceClassName"]);
}
