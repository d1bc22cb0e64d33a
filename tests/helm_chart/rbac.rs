//! The chart's the RBAC the chart grants: least privilege, no wildcards, leases in the release namespace.

use super::*;

#[test]
fn cluster_role_is_exactly_least_privilege() {
    let docs = render_or_skip!(&[]);
    let binding = one_of_kind(&docs, "ClusterRoleBinding");
    let role = all_of_kind(&docs, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == binding["roleRef"]["name"])
        .expect("the bound ClusterRole is rendered");
    assert_eq!(rules_by_resource(role), expected_cluster_rules());
    for rule in role["rules"].as_sequence().unwrap() {
        assert!(rule["resourceNames"].is_null(), "{rule:?}");
    }
    assert!(role["aggregationRule"].is_null());

    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    let sa = one_of_kind(&docs, "ServiceAccount");
    assert_eq!(binding["subjects"].as_sequence().unwrap().len(), 1);
    let subject = &binding["subjects"][0];
    assert_eq!(subject["kind"], "ServiceAccount");
    assert_eq!(subject["name"], sa["metadata"]["name"]);
    assert_eq!(subject["namespace"], NAMESPACE);
}

/// The role for `drain-check` / `audit`: reads only what they read, writes
/// nothing, bound to no one.
#[test]
fn inspector_role_is_read_only_and_unbound() {
    let docs = render_or_skip!(&[]);
    let name = format!("{RELEASE}-dra-claim-controller-inspector");
    let roles = all_of_kind(&docs, "ClusterRole");
    let inspector = roles
        .iter()
        .find(|r| str_of(&r["metadata"]["name"]) == name)
        .unwrap_or_else(|| panic!("no ClusterRole {name} among {roles:?}"));
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let expected: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::from([
        (("".into(), "pods".into()), set(&["get", "list"])),
        (("".into(), "nodes".into()), set(&["get"])),
        (
            ("resource.k8s.io".into(), "resourceclaims".into()),
            set(&["get", "list"]),
        ),
        (
            ("resource.k8s.io".into(), "resourceslices".into()),
            set(&["get", "list"]),
        ),
    ]);
    assert_eq!(rules_by_resource(inspector), expected);
    assert!(
        inspector["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"].is_null()
    );
    for binding in all_of_kind(&docs, "ClusterRoleBinding") {
        assert_ne!(
            str_of(&binding["roleRef"]["name"]),
            name,
            "the inspector role is bound by the admin"
        );
    }
    let docs = render_or_skip!(&[("inspectorRole.aggregateToView", "true")]);
    let aggregated = all_of_kind(&docs, "ClusterRole")
        .into_iter()
        .find(|r| str_of(&r["metadata"]["name"]) == name)
        .unwrap();
    assert_eq!(
        aggregated["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"],
        "true"
    );
    let docs = render_or_skip!(&[("inspectorRole.create", "false")]);
    assert!(
        all_of_kind(&docs, "ClusterRole")
            .iter()
            .all(|r| str_of(&r["metadata"]["name"]) != name)
    );
}

#[test]
fn no_wildcards_in_rbac() {
    let docs = render_or_skip!(&[
        ("serviceMonitor.enabled", "true"),
        ("prometheusRule.enabled", "true"),
        ("grafanaDashboard.enabled", "true"),
    ]);
    for doc in &docs {
        if !matches!(
            kind_of(doc),
            "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding" | "ServiceAccount"
        ) {
            continue;
        }
        let mut all = Vec::new();
        all_strings(doc, &mut all);
        for s in all {
            assert!(!s.contains('*'), "wildcard {s:?} in {}", kind_of(doc));
        }
    }
}

#[test]
fn role_only_grants_leases_in_release_namespace() {
    let docs = render_or_skip!(&[]);
    let role = one_of_kind(&docs, "Role");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    let rules = rules_by_resource(role);
    let keys: Vec<_> = rules.keys().cloned().collect();
    assert_eq!(
        keys,
        vec![("coordination.k8s.io".to_string(), "leases".to_string())]
    );
    let verbs = &rules[&("coordination.k8s.io".to_string(), "leases".to_string())];
    let expected: BTreeSet<String> = ["get", "list", "watch", "create", "update"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(verbs, &expected);
    // Everything but create (which cannot be) is limited to our lease.
    for rule in role["rules"].as_sequence().unwrap() {
        if strings(&rule["verbs"]) != ["create"] {
            assert_eq!(strings(&rule["resourceNames"]), ["dra-claim-controller"]);
        }
    }

    let binding = one_of_kind(&docs, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], NAMESPACE);
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    assert_eq!(
        binding["subjects"][0]["name"],
        one_of_kind(&docs, "ServiceAccount")["metadata"]["name"]
    );
}

#[test]
fn lease_role_follows_lease_name_and_namespace() {
    let docs = render_or_skip!(&[
        ("leaderElection.resourceName", "claims-leader"),
        ("leaderElection.resourceNamespace", "leases"),
    ]);
    let role = one_of_kind(&docs, "Role");
    assert_eq!(role["metadata"]["namespace"], "leases");
    assert_eq!(
        one_of_kind(&docs, "RoleBinding")["metadata"]["namespace"],
        "leases"
    );
    let named: Vec<String> = role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| strings(&r["resourceNames"]))
        .collect();
    assert_eq!(named, ["claims-leader"]);
    let args = args(&docs);
    assert!(args.contains(&"--leader-elect-resource-name=claims-leader".to_string()));
    assert!(args.contains(&"--leader-elect-resource-namespace=leases".to_string()));
}

#[test]
fn rbac_helper_returns_only_rbac_objects() {
    let yaml = match helm::render_rbac(RELEASE, NAMESPACE, &[]) {
        Ok(Some(yaml)) => yaml,
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    let kinds: BTreeSet<String> = docs(&yaml).iter().map(|d| kind_of(d).to_string()).collect();
    let expected: BTreeSet<String> = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(kinds, expected);
}

#[test]
fn rbac_can_be_disabled() {
    let docs = render_or_skip!(&[("rbac.create", "false")]);
    for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        assert!(
            all_of_kind(&docs, kind).is_empty(),
            "{kind} with rbac.create=false"
        );
    }
}

// ---------------------------------------------------------------------------
// Deployment
// ---------------------------------------------------------------------------

#[test]
fn deployment_shape() {
    let docs = render_or_skip!(&[]);
    let deploy = one_of_kind(&docs, "Deployment");
    assert_eq!(deploy["metadata"]["namespace"], NAMESPACE);
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(deploy["spec"]["strategy"]["type"], "RollingUpdate");
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], true);
    assert_eq!(
        pod["serviceAccountName"],
        one_of_kind(&docs, "ServiceAccount")["metadata"]["name"]
    );
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");

    // selector matches the pod labels
    let selector = deploy["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap();
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for (k, v) in selector {
        assert_eq!(&labels[k.as_str().unwrap()], v);
    }

    // preferred anti-affinity by hostname
    let terms =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    let term = &terms[0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        term["labelSelector"]["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    assert!(
        pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            .is_null()
    );

    // downward API env
    let c = container(&docs);
    let env = c["env"].as_sequence().unwrap();
    let field = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| str_of(&e["valueFrom"]["fieldRef"]["fieldPath"]))
    };
    assert_eq!(
        field("POD_NAMESPACE").as_deref(),
        Some("metadata.namespace")
    );
    assert_eq!(field("POD_NAME").as_deref(), Some("metadata.name"));

    // requests and limits
    for part in ["requests", "limits"] {
        for res in ["cpu", "memory"] {
            assert!(
                !c["resources"][part][res].is_null(),
                "resources.{part}.{res}"
            );
        }
    }
}
