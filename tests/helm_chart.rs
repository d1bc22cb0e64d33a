//! Tests of the Helm chart in charts/dra-claim-controller, rendered by a real
//! Helm (see the `dra_e2e::helm` harness module). Tests that need Helm pass with a SKIP
//! line when it cannot be installed here.

use dra_e2e::helm;

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml::Value;

const RELEASE: &str = "dra";
const NAMESPACE: &str = "dra-system";

/// Renders with the given `--set` pairs, or returns from the test when Helm
/// is unavailable.
macro_rules! render_or_skip {
    ($set:expr) => {
        match helm::render_chart(RELEASE, NAMESPACE, $set) {
            Ok(Some(yaml)) => docs(&yaml),
            Ok(None) => return,
            Err(e) => panic!("rendering failed: {e}"),
        }
    };
}

/// Expects rendering to fail; returns Helm's message (or from the test when
/// Helm is unavailable).
macro_rules! render_err_or_skip {
    ($set:expr) => {
        match helm::render_chart(RELEASE, NAMESPACE, $set) {
            Ok(Some(_)) => panic!("rendering with {:?} should have failed", $set),
            Ok(None) => return,
            Err(e) => e,
        }
    };
}

fn docs(yaml: &str) -> Vec<Value> {
    helm::parse_documents(yaml).expect("rendered manifests parse as YAML")
}

fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn all_of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| kind_of(d) == kind).collect()
}

fn one_of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = all_of_kind(docs, kind);
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {kind}, got {}",
        found.len()
    );
    found[0]
}

fn str_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| s.iter().map(str_of).collect())
        .unwrap_or_default()
}

/// The chart's default values.yaml.
fn default_values() -> Value {
    let text = std::fs::read_to_string(helm::chart_dir().join("values.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn chart_yaml() -> Value {
    let text = std::fs::read_to_string(helm::chart_dir().join("Chart.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn container(docs: &[Value]) -> &Value {
    let deploy = one_of_kind(docs, "Deployment");
    let containers = deploy["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .expect("containers");
    assert_eq!(containers.len(), 1);
    &containers[0]
}

fn args(docs: &[Value]) -> Vec<String> {
    strings(&container(docs)["args"])
}

/// Seconds in a Go duration made of integer h/m/s/ms parts.
fn duration_secs(d: &str) -> f64 {
    let mut total = 0.0;
    let mut num = String::new();
    let mut chars = d.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: f64 = num.parse().unwrap_or_else(|_| panic!("bad duration {d}"));
        num.clear();
        total += match c {
            'h' => n * 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                n / 1000.0
            }
            'm' => n * 60.0,
            's' => n,
            _ => panic!("bad duration {d}"),
        };
    }
    assert!(num.is_empty(), "bad duration {d}");
    total
}

/// Every string anywhere inside a value.
fn all_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Sequence(s) => s.iter().for_each(|x| all_strings(x, out)),
        Value::Mapping(m) => m.iter().for_each(|(k, x)| {
            all_strings(k, out);
            all_strings(x, out)
        }),
        Value::Tagged(t) => all_strings(&t.value, out),
        _ => {}
    }
}

// ---------------------------------------------------------------------------
// Chart metadata and values files (no Helm needed)
// ---------------------------------------------------------------------------

#[test]
fn chart_metadata() {
    let chart = chart_yaml();
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(chart["name"], "dra-claim-controller");
    assert_eq!(chart["appVersion"], "0.1.0");
    assert_eq!(chart["kubeVersion"], ">=1.34.0-0");
    assert_eq!(chart["type"], "application");
}

#[test]
fn values_schema_covers_every_value() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(helm::chart_dir().join("values.schema.json")).unwrap(),
    )
    .expect("values.schema.json is JSON");
    assert_eq!(schema["additionalProperties"], serde_json::json!(false));

    // Every value the chart ships has a schema entry, all the way down.
    fn walk(path: &str, value: &Value, schema: &serde_json::Value) {
        let Value::Mapping(map) = value else { return };
        let props = &schema["properties"];
        if props.is_null() {
            // a free-form map (labels, annotations, affinity, ...)
            return;
        }
        for (k, v) in map {
            let k = k.as_str().unwrap();
            let sub = &props[k];
            assert!(
                !sub.is_null(),
                "values key {path}{k} is not in values.schema.json"
            );
            walk(&format!("{path}{k}."), v, sub);
        }
    }
    walk("", &default_values(), &schema);
}

#[test]
fn readme_documents_every_value() {
    let readme = std::fs::read_to_string(helm::chart_dir().join("README.md")).unwrap();
    // Kubernetes objects passed to the manifest as they are: documented as
    // one value.
    const VERBATIM: [&str; 2] = ["podSecurityContext.", "containerSecurityContext."];
    fn leaves(prefix: &str, v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Mapping(m) if !m.is_empty() && !VERBATIM.contains(&prefix) => {
                for (k, x) in m {
                    leaves(&format!("{prefix}{}.", k.as_str().unwrap()), x, out)
                }
            }
            _ => out.push(prefix.trim_end_matches('.').to_string()),
        }
    }
    let mut keys = Vec::new();
    leaves("", &default_values(), &mut keys);
    for key in keys {
        assert!(
            readme.contains(&format!("`{key}`")),
            "README.md values table lacks `{key}`"
        );
    }
}

#[test]
fn dashboard_file_is_json_with_placeholders() {
    let text = std::fs::read_to_string(
        helm::chart_dir()
            .join("dashboards")
            .join("dra-claim-controller.json"),
    )
    .unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    assert_eq!(dash["uid"], "dra-claim-controller");
    assert!(text.contains("vector(__KUBE_API_QPS__)"));
}

// ---------------------------------------------------------------------------
// Lint and schema validation
// ---------------------------------------------------------------------------

#[test]
fn lint_and_render_default_values() {
    let docs = render_or_skip!(&[]);
    let kinds: BTreeSet<&str> = docs.iter().map(kind_of).collect();
    let expected: BTreeSet<&str> = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "FlowSchema",
    ]
    .into();
    assert_eq!(kinds, expected, "objects rendered with default values");
}

#[test]
fn lint_and_render_with_monitoring_enabled() {
    let docs = render_or_skip!(&[
        ("serviceMonitor.enabled", "true"),
        ("serviceMonitor.labels.release", "kube-prometheus-stack"),
        ("prometheusRule.enabled", "true"),
        ("grafanaDashboard.enabled", "true"),
    ]);
    let sm = one_of_kind(&docs, "ServiceMonitor");
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sm["metadata"]["labels"]["release"], "kube-prometheus-stack");
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["interval"], "30s");
    one_of_kind(&docs, "PrometheusRule");
    one_of_kind(&docs, "ConfigMap");
}

#[test]
fn optional_monitoring_objects_are_off_by_default() {
    let docs = render_or_skip!(&[]);
    for kind in ["ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(
            all_of_kind(&docs, kind).is_empty(),
            "{kind} rendered by default"
        );
    }
}

#[test]
fn schema_rejects_non_integer_replicas() {
    let err = render_err_or_skip!(&[("replicas", "two")]);
    assert!(err.contains("replicas"), "{err}");
}

#[test]
fn schema_rejects_unknown_top_level_key() {
    let err = render_err_or_skip!(&[("replicaCount", "3")]);
    assert!(err.contains("replicaCount"), "{err}");
}

#[test]
fn schema_rejects_bad_flag_values() {
    for (key, value) in [
        ("logging.format", "xml"),
        ("shutdownTimeout", "soon"),
        ("minResyncPeriod", "daily"),
        ("leaderElection.leaseDuration", "15"),
        ("featureGates", "DRAAdminAccess=yes"),
        ("kubeAPI.qps", "0"),
        ("kubeAPI.burst", "1.5"),
        ("concurrentSyncs", "0"),
        ("metrics.port", "70000"),
        ("leaderElection.enabled", "maybe"),
        ("image.pullPolicy", "Sometimes"),
        ("serviceMonitor.enabled", "yes"),
        ("grafanaDashboard.sidecarLabel", "bad label"),
        ("prometheusRule.alerts.noLeader.for", "two minutes"),
        ("prescheduledPods.policy.failurePolicy", "Maybe"),
        ("metrics.naming", "1.38"),
        ("prometheusRule.alerts.leakedAllocations.for", "a while"),
        ("prometheusRule.alerts.doubleAllocations.for", "soon"),
        ("prometheusRule.alerts.doubleAllocations", "false"),
        ("allocation.nodeSelector", "3"),
    ] {
        let err = render_err_or_skip!(&[(key, value)]);
        let leaf = key.rsplit('.').next().unwrap();
        assert!(err.contains(leaf), "{key}={value}: {err}");
    }
}

#[test]
fn inconsistent_leader_election_durations_fail() {
    let err = render_err_or_skip!(&[
        ("leaderElection.leaseDuration", "10s"),
        ("leaderElection.renewDeadline", "10s"),
    ]);
    assert!(err.contains("leaseDuration must be greater"), "{err}");
    let err = render_err_or_skip!(&[("leaderElection.retryPeriod", "12s")]);
    assert!(err.contains("renewDeadline must be greater"), "{err}");
    // Renders, then the controller refuses it at start: refused here.
    let err = render_err_or_skip!(&[("leaderElection.retryPeriod", "9s")]);
    assert!(err.contains("1.2 x leaderElection.retryPeriod"), "{err}");
}

// ---------------------------------------------------------------------------
// RBAC
// ---------------------------------------------------------------------------

/// Marks a non-resource URL among the (apiGroup, resource) keys.
const NON_RESOURCE: &str = "nonResourceURL";

/// (apiGroup, resource) -> verbs, with an error on duplicate or odd rules;
/// a non-resource URL is keyed (NON_RESOURCE, url).
fn rules_by_resource(role: &Value) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for rule in role["rules"].as_sequence().expect("rules") {
        for url in strings(&rule["nonResourceURLs"]) {
            assert!(
                rule["apiGroups"].is_null(),
                "URLs and resources mixed in {rule:?}"
            );
            out.entry((NON_RESOURCE.to_string(), url))
                .or_default()
                .extend(strings(&rule["verbs"]));
        }
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                out.entry((group.clone(), resource))
                    .or_default()
                    .extend(strings(&rule["verbs"]));
            }
        }
    }
    out
}

fn expected_cluster_rules() -> BTreeMap<(String, String), BTreeSet<String>> {
    [
        ("", "pods", &["get", "list", "watch"][..]),
        ("", "pods/status", &["patch"]),
        (
            "resource.k8s.io",
            "resourceclaims",
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        ("resource.k8s.io", "resourceclaims/status", &["patch"]),
        (
            "resource.k8s.io",
            "resourceclaims/binding",
            &["update", "patch"],
        ),
        (
            "resource.k8s.io",
            "resourceclaimtemplates",
            &["get", "list", "watch"],
        ),
        ("", "events", &["create", "patch"]),
        // metrics.secure (the default): delegated authn/authz of scrapes.
        ("authentication.k8s.io", "tokenreviews", &["create"]),
        ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
    ]
    .into_iter()
    .map(|(g, r, verbs)| {
        (
            (g.to_string(), r.to_string()),
            verbs.iter().map(|v| v.to_string()).collect(),
        )
    })
    .chain(
        start_up_urls()
            .into_iter()
            .map(|url| ((NON_RESOURCE.to_string(), url), ["get".to_string()].into())),
    )
    .collect()
}

/// The non-resource URLs the process reads at start and takeover, from the
/// code's own constants: `/version`, and each API version it may discover
/// (PodGroups, headroom's front doors).
fn start_up_urls() -> Vec<String> {
    use dra_claim_controller::controllers::headroom::{buffer, seed, watermark};
    use dra_claim_controller::model::views::PodGroupApi;
    let mut urls = vec!["/version".to_string()];
    urls.extend(
        PodGroupApi::VERSIONS
            .iter()
            .map(|v| format!("/apis/{}/{v}", PodGroupApi::GROUP)),
    );
    urls.push(format!("/apis/{}/{}", watermark::GROUP, watermark::VERSION));
    urls.push(format!("/apis/{}/{}", seed::GROUP, seed::VERSION));
    urls.extend(
        buffer::VERSIONS
            .iter()
            .map(|v| format!("/apis/{}/{v}", buffer::GROUP)),
    );
    urls
}

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

#[test]
fn deployment_security_context() {
    let docs = render_or_skip!(&[]);
    let deploy = one_of_kind(&docs, "Deployment");
    let pod_sc = &deploy["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(pod_sc["runAsNonRoot"], true);
    assert_eq!(pod_sc["runAsUser"], 65532);
    assert_eq!(pod_sc["seccompProfile"]["type"], "RuntimeDefault");

    let sc = &container(&docs)["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["runAsUser"], 65532);
    assert_eq!(sc["runAsGroup"], 65532);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    assert!(sc["capabilities"]["add"].is_null());
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
}

/// Where the platform assigns the UID (OpenShift's restricted-v2), the
/// fixed IDs go and everything else stays; an umbrella chart's `global`
/// values are accepted.
#[test]
fn security_context_can_leave_the_uid_to_the_platform() {
    let docs = render_or_skip!(&[
        ("podSecurityContext.runAsUser", "null"),
        ("podSecurityContext.runAsGroup", "null"),
        ("podSecurityContext.fsGroup", "null"),
        ("containerSecurityContext.runAsUser", "null"),
        ("containerSecurityContext.runAsGroup", "null"),
        ("global.imageRegistry", "registry.example.com"),
    ]);
    let deploy = one_of_kind(&docs, "Deployment");
    let pod_sc = &deploy["spec"]["template"]["spec"]["securityContext"];
    for key in ["runAsUser", "runAsGroup", "fsGroup"] {
        assert!(pod_sc[key].is_null(), "pod {key}: {pod_sc:?}");
    }
    assert_eq!(pod_sc["runAsNonRoot"], true);
    let sc = &container(&docs)["securityContext"];
    assert!(
        sc["runAsUser"].is_null() && sc["runAsGroup"].is_null(),
        "{sc:?}"
    );
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
}

#[test]
fn deployment_ports_and_probes() {
    let docs = render_or_skip!(&[]);
    let c = container(&docs);
    let ports: BTreeMap<String, i64> = c["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| (str_of(&p["name"]), p["containerPort"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        ports,
        BTreeMap::from([("health".to_string(), 8081), ("metrics".to_string(), 8080)])
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "health");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "health");

    let svc = one_of_kind(&docs, "Service");
    let port = &svc["spec"]["ports"][0];
    assert_eq!(port["name"], "metrics");
    assert_eq!(port["port"], 8080);
    assert_eq!(port["targetPort"], "metrics");
    assert_eq!(
        svc["spec"]["selector"],
        one_of_kind(&docs, "Deployment")["spec"]["selector"]["matchLabels"]
    );
}

/// The args the chart must pass for the given values.yaml content.
fn expected_args(values: &Value) -> Vec<String> {
    let le = &values["leaderElection"];
    let mut out = Vec::new();
    let kubeconfig = str_of(&values["kubeconfig"]);
    if !kubeconfig.is_empty() {
        out.push(format!("--kubeconfig={kubeconfig}"));
    }
    if values["headroom"]["enabled"].as_bool() == Some(true) {
        out.push("--controllers=resourceclaim,headroom".to_string());
    }
    out.extend([
        format!("--kube-api-qps={}", str_of(&values["kubeAPI"]["qps"])),
        format!("--kube-api-burst={}", str_of(&values["kubeAPI"]["burst"])),
        format!(
            "--concurrent-resourceclaim-syncs={}",
            str_of(&values["concurrentSyncs"])
        ),
        format!("--min-resync-period={}", str_of(&values["minResyncPeriod"])),
        format!("--feature-gates={}", str_of(&values["featureGates"])),
    ]);
    let allocate_on = str_of(&values["allocation"]["nodeSelector"]);
    if !allocate_on.is_empty() {
        out.push(format!("--allocate-on-nodes={allocate_on}"));
    }
    out.extend([
        format!("--leader-elect={}", str_of(&le["enabled"])),
        format!(
            "--leader-elect-lease-duration={}",
            str_of(&le["leaseDuration"])
        ),
        format!(
            "--leader-elect-renew-deadline={}",
            str_of(&le["renewDeadline"])
        ),
        format!("--leader-elect-retry-period={}", str_of(&le["retryPeriod"])),
        format!(
            "--leader-elect-resource-name={}",
            str_of(&le["resourceName"])
        ),
        format!("--leader-elect-resource-namespace={NAMESPACE}"),
        format!(
            "--metrics-bind-address={}:{}",
            str_of(&values["metrics"]["bindHost"]),
            str_of(&values["metrics"]["port"])
        ),
        format!(
            "--health-probe-bind-address={}:{}",
            str_of(&values["health"]["bindHost"]),
            str_of(&values["health"]["port"])
        ),
        format!("--metrics-naming={}", str_of(&values["metrics"]["naming"])),
        format!("--metrics-secure={}", str_of(&values["metrics"]["secure"])),
    ]);
    if values["metrics"]["secure"].as_bool() == Some(true)
        && !str_of(&values["metrics"]["tlsSecretName"]).is_empty()
    {
        out.extend([
            "--tls-cert-file=/etc/dra-claim-controller/tls/tls.crt".to_string(),
            "--tls-private-key-file=/etc/dra-claim-controller/tls/tls.key".to_string(),
        ]);
    }
    out.extend([
        format!("--shutdown-timeout={}", str_of(&values["shutdownTimeout"])),
        format!("--log-format={}", str_of(&values["logging"]["format"])),
        format!("--log-level={}", str_of(&values["logging"]["level"])),
    ]);
    out.extend(strings(&values["extraArgs"]));
    out
}

#[test]
fn args_carry_every_flag_from_values() {
    let docs = render_or_skip!(&[]);
    let values = default_values();
    assert!(
        str_of(&values["leaderElection"]["resourceNamespace"]).is_empty(),
        "default lease namespace is the release namespace"
    );
    assert_eq!(args(&docs), expected_args(&values));

    // The documented defaults, spelled out.
    let args = args(&docs);
    for flag in [
        "--kube-api-qps=20",
        "--kube-api-burst=30",
        "--concurrent-resourceclaim-syncs=50",
        "--min-resync-period=12h",
        "--feature-gates=DRAAdminAccess=true,DRAPrioritizedList=true,DRAExtendedResource=true",
        "--leader-elect=true",
        "--leader-elect-lease-duration=15s",
        "--leader-elect-renew-deadline=10s",
        "--leader-elect-retry-period=2s",
        "--leader-elect-resource-name=dra-claim-controller",
        "--leader-elect-resource-namespace=dra-system",
        "--metrics-bind-address=:8080",
        "--health-probe-bind-address=:8081",
        "--metrics-naming=both",
        "--shutdown-timeout=20s",
        "--log-format=json",
        "--log-level=info",
    ] {
        assert!(
            args.contains(&flag.to_string()),
            "missing {flag} in {args:?}"
        );
    }
    assert!(!args.iter().any(|a| a.starts_with("--kubeconfig")));
}

#[test]
fn args_follow_overridden_values() {
    // qps as a float needs a values file: --set has no floats.
    let values = r#"
kubeconfig: /etc/dra/kubeconfig
kubeAPI:
  qps: 12.5
  burst: 1000000
concurrentSyncs: 8
featureGates: DRAAdminAccess=false,DRAPrioritizedList=true
leaderElection:
  enabled: false
replicas: 1
metrics:
  bindHost: 127.0.0.1
  port: 9090
  naming: "1.37"
health:
  port: 9091
shutdownTimeout: 45s
logging:
  format: text
  level: info,dra_claim_controller=debug
extraArgs:
  - --some-new-flag=1
"#;
    let docs = match helm::render_chart_with_values(RELEASE, NAMESPACE, values, &[]) {
        Ok(Some(yaml)) => docs(&yaml),
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    let args = args(&docs);
    for flag in [
        "--kubeconfig=/etc/dra/kubeconfig",
        "--kube-api-qps=12.5",
        "--kube-api-burst=1000000",
        "--concurrent-resourceclaim-syncs=8",
        "--feature-gates=DRAAdminAccess=false,DRAPrioritizedList=true",
        "--leader-elect=false",
        "--metrics-bind-address=127.0.0.1:9090",
        "--health-probe-bind-address=:9091",
        "--metrics-naming=1.37",
        "--shutdown-timeout=45s",
        "--log-format=text",
        "--log-level=info,dra_claim_controller=debug",
    ] {
        assert!(
            args.contains(&flag.to_string()),
            "missing {flag} in {args:?}"
        );
    }
    assert_eq!(args.last().unwrap(), "--some-new-flag=1");
    let c = container(&docs);
    let port = |name: &str| {
        c["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| p["containerPort"].as_i64().unwrap())
    };
    assert_eq!(port("metrics"), Some(9090));
    assert_eq!(port("health"), Some(9091));
    assert_eq!(
        one_of_kind(&docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        55
    );
}

#[test]
fn termination_grace_period_exceeds_shutdown_timeout() {
    let docs = render_or_skip!(&[]);
    let grace = |docs: &[Value]| {
        one_of_kind(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .expect("terminationGracePeriodSeconds")
    };
    let shutdown = duration_secs(&str_of(&default_values()["shutdownTimeout"]));
    assert!(
        grace(&docs) as f64 > shutdown,
        "grace {} <= shutdown {shutdown}",
        grace(&docs)
    );
    assert_eq!(grace(&docs), 30);

    for (timeout, expected) in [("1m30s", 100), ("1500ms", 12), ("1h", 3610)] {
        let docs = render_or_skip!(&[("shutdownTimeout", timeout)]);
        assert_eq!(grace(&docs), expected, "shutdownTimeout={timeout}");
        assert!(grace(&docs) as f64 > duration_secs(timeout));
        assert!(args(&docs).contains(&format!("--shutdown-timeout={timeout}")));
    }
}

#[test]
fn scheduling_values_are_applied() {
    let docs = render_or_skip!(&[
        ("replicas", "3"),
        ("priorityClassName", "system-cluster-critical"),
        ("nodeSelector.node-role\\.kubernetes\\.io/control-plane", ""),
        (
            "tolerations[0].key",
            "node-role.kubernetes.io/control-plane"
        ),
        ("tolerations[0].effect", "NoSchedule"),
        ("podAnnotations.example\\.com/team", "dra"),
        ("podLabels.tier", "control-plane"),
        ("podAntiAffinityPreset", "hard"),
        ("resources.limits.memory", "512Mi"),
    ]);
    let deploy = one_of_kind(&docs, "Deployment");
    assert_eq!(deploy["spec"]["replicas"], 3);
    let tpl = &deploy["spec"]["template"];
    let pod = &tpl["spec"];
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(
        pod["nodeSelector"]["node-role.kubernetes.io/control-plane"],
        ""
    );
    assert_eq!(pod["tolerations"][0]["effect"], "NoSchedule");
    assert_eq!(tpl["metadata"]["annotations"]["example.com/team"], "dra");
    assert_eq!(tpl["metadata"]["labels"]["tier"], "control-plane");
    assert_eq!(
        pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(container(&docs)["resources"]["limits"]["memory"], "512Mi");
}

#[test]
fn image_defaults_to_app_version_and_is_overridable() {
    let docs = render_or_skip!(&[]);
    let app_version = str_of(&chart_yaml()["appVersion"]);
    assert_eq!(
        container(&docs)["image"],
        format!("ghcr.io/dra-claim-controller/dra-claim-controller:{app_version}").as_str()
    );

    let docs = render_or_skip!(&[
        ("image.repository", "registry.example/dra"),
        ("image.tag", "v9"),
    ]);
    assert_eq!(container(&docs)["image"], "registry.example/dra:v9");
    let digest = format!("sha256:{}", "a".repeat(64));
    let docs = render_or_skip!(&[("image.digest", digest.as_str())]);
    assert_eq!(
        container(&docs)["image"],
        format!("ghcr.io/dra-claim-controller/dra-claim-controller@{digest}").as_str()
    );
}

#[test]
fn standard_labels_on_every_object() {
    let docs = render_or_skip!(&[
        ("serviceMonitor.enabled", "true"),
        ("prometheusRule.enabled", "true"),
        ("grafanaDashboard.enabled", "true"),
    ]);
    let chart = chart_yaml();
    let chart_label = format!("{}-{}", str_of(&chart["name"]), str_of(&chart["version"]));
    for doc in &docs {
        let labels = &doc["metadata"]["labels"];
        let what = format!("{} {}", kind_of(doc), str_of(&doc["metadata"]["name"]));
        assert_eq!(
            labels["app.kubernetes.io/name"], "dra-claim-controller",
            "{what}"
        );
        assert_eq!(labels["app.kubernetes.io/instance"], RELEASE, "{what}");
        assert_eq!(labels["app.kubernetes.io/version"], "0.1.0", "{what}");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{what}");
        assert_eq!(labels["helm.sh/chart"], chart_label.as_str(), "{what}");
    }
}

#[test]
fn pod_disruption_budget() {
    let docs = render_or_skip!(&[]);
    let pdb = one_of_kind(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        one_of_kind(&docs, "Deployment")["spec"]["selector"]["matchLabels"]
    );

    let docs = render_or_skip!(&[("pdb.minAvailable", ""), ("pdb.maxUnavailable", "50%")]);
    let pdb = one_of_kind(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], "50%");
    assert!(pdb["spec"]["minAvailable"].is_null());

    // One replica: a budget would block every drain of its node.
    let docs = render_or_skip!(&[("replicas", "1")]);
    assert!(all_of_kind(&docs, "PodDisruptionBudget").is_empty());
}

#[test]
fn critical_priority_by_default_with_a_switch() {
    let docs = render_or_skip!(&[]);
    let pod = &one_of_kind(&docs, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    let docs = render_or_skip!(&[("priorityClassName", "")]);
    let pod = &one_of_kind(&docs, "Deployment")["spec"]["template"]["spec"];
    assert!(pod["priorityClassName"].is_null());
}

// ---------------------------------------------------------------------------
// Secure metrics
// ---------------------------------------------------------------------------

fn metrics_reader(docs: &[Value]) -> Option<&Value> {
    let name = format!("{RELEASE}-dra-claim-controller-metrics-reader");
    all_of_kind(docs, "ClusterRole")
        .into_iter()
        .find(|r| str_of(&r["metadata"]["name"]) == name)
}

#[test]
fn metrics_reader_role_grants_only_get_on_metrics() {
    let docs = render_or_skip!(&[]);
    let role = metrics_reader(&docs).expect("metrics-reader ClusterRole rendered");
    let rules = role["rules"].as_sequence().unwrap();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(strings(&rules[0]["nonResourceURLs"]), ["/metrics"]);
    assert_eq!(strings(&rules[0]["verbs"]), ["get"]);
    assert!(rules[0]["resources"].is_null() && rules[0]["apiGroups"].is_null());
    for binding in all_of_kind(&docs, "ClusterRoleBinding") {
        assert_ne!(
            binding["roleRef"]["name"], role["metadata"]["name"],
            "bound by the admin to Prometheus' account"
        );
    }
    let docs = render_or_skip!(&[("metrics.readerRole.create", "false")]);
    assert!(metrics_reader(&docs).is_none());
}

#[test]
fn service_monitor_scrapes_https_with_a_token() {
    let docs = render_or_skip!(&[("serviceMonitor.enabled", "true")]);
    let endpoint = &one_of_kind(&docs, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(
        endpoint["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    assert_eq!(endpoint["tlsConfig"]["insecureSkipVerify"], true);
    assert!(endpoint["tlsConfig"]["ca"].is_null());

    let docs = render_or_skip!(&[
        ("serviceMonitor.enabled", "true"),
        ("serviceMonitor.tlsConfig.insecureSkipVerify", "false"),
        (
            "serviceMonitor.tlsConfig.serverName",
            "dra-metrics.dra-system.svc"
        ),
        ("serviceMonitor.tlsConfig.caSecret.name", "dra-ca"),
        ("metrics.tlsSecretName", "dra-metrics-tls"),
    ]);
    let endpoint = &one_of_kind(&docs, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(endpoint["tlsConfig"]["insecureSkipVerify"], false);
    assert_eq!(
        endpoint["tlsConfig"]["serverName"],
        "dra-metrics.dra-system.svc"
    );
    assert_eq!(endpoint["tlsConfig"]["ca"]["secret"]["name"], "dra-ca");
    assert_eq!(endpoint["tlsConfig"]["ca"]["secret"]["key"], "ca.crt");
    let pod = &one_of_kind(&docs, "Deployment")["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "metrics-tls")
        .expect("the TLS Secret is mounted");
    assert_eq!(volume["secret"]["secretName"], "dra-metrics-tls");
    let a = args(&docs);
    assert!(a.contains(&"--tls-cert-file=/etc/dra-claim-controller/tls/tls.crt".to_string()));
    assert!(
        a.contains(&"--tls-private-key-file=/etc/dra-claim-controller/tls/tls.key".to_string())
    );
}

#[test]
fn plain_metrics_drop_tls_review_rights_and_reader_role() {
    let docs = render_or_skip!(&[
        ("metrics.secure", "false"),
        ("serviceMonitor.enabled", "true"),
        ("metrics.tlsSecretName", "ignored"),
    ]);
    let endpoint = &one_of_kind(&docs, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "http");
    assert!(endpoint["bearerTokenFile"].is_null() && endpoint["tlsConfig"].is_null());
    assert!(metrics_reader(&docs).is_none());
    assert!(args(&docs).contains(&"--metrics-secure=false".to_string()));
    assert!(!args(&docs).iter().any(|a| a.starts_with("--tls-")));
    let rules = bound_cluster_rules(&docs);
    assert!(!rules.contains_key(&("authentication.k8s.io".into(), "tokenreviews".into())));
    assert!(!rules.contains_key(&("authorization.k8s.io".into(), "subjectaccessreviews".into())));
}

#[test]
fn network_policy_admits_only_listed_scrapers() {
    let docs = render_or_skip!(&[]);
    assert!(
        all_of_kind(&docs, "NetworkPolicy").is_empty(),
        "off by default"
    );
    let docs = render_or_skip!(&[
        ("networkPolicy.enabled", "true"),
        (
            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name",
            "monitoring"
        ),
    ]);
    let policy = one_of_kind(&docs, "NetworkPolicy");
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        one_of_kind(&docs, "Deployment")["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(strings(&policy["spec"]["policyTypes"]), ["Ingress"]);
    let ingress = policy["spec"]["ingress"].as_sequence().unwrap();
    assert_eq!(ingress.len(), 2, "{ingress:?}");
    assert_eq!(ingress[0]["ports"][0]["port"], "health");
    assert!(ingress[0]["from"].is_null(), "probes from anywhere");
    assert_eq!(ingress[1]["ports"][0]["port"], "metrics");
    assert_eq!(
        ingress[1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    // Without scrapers listed, nobody reaches /metrics.
    let docs = render_or_skip!(&[("networkPolicy.enabled", "true")]);
    let ingress = one_of_kind(&docs, "NetworkPolicy")["spec"]["ingress"].clone();
    assert_eq!(ingress.as_sequence().unwrap().len(), 1);
}

// ---------------------------------------------------------------------------
// Monitoring
// ---------------------------------------------------------------------------

#[test]
fn prometheus_rule_has_the_eight_alerts() {
    let docs = render_or_skip!(&[("prometheusRule.enabled", "true")]);
    let rule = one_of_kind(&docs, "PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    let mut alerts: BTreeMap<String, (String, String)> = BTreeMap::new();
    for group in rule["spec"]["groups"].as_sequence().unwrap() {
        for r in group["rules"].as_sequence().unwrap() {
            alerts.insert(str_of(&r["alert"]), (str_of(&r["expr"]), str_of(&r["for"])));
            assert!(!r["labels"]["severity"].is_null());
            assert!(!r["annotations"]["summary"].is_null());
        }
    }
    let expected: BTreeMap<&str, (&[&str], &str)> = BTreeMap::from([
        (
            "DRAClaimControllerWorkQueueDepthHigh",
            (
                &[r#"workqueue_depth{name="resource_claim"} > 100"#][..],
                "10m",
            ),
        ),
        (
            "DRAClaimControllerWorkDurationHigh",
            (
                &[
                    "histogram_quantile(0.99,",
                    r#"rate(workqueue_work_duration_seconds_bucket{name="resource_claim"}[5m])"#,
                    "> 5",
                ][..],
                "10m",
            ),
        ),
        (
            "DRAClaimControllerRetriesRising",
            (
                &[r#"rate(workqueue_retries_total{name="resource_claim"}[5m])"#][..],
                "15m",
            ),
        ),
        (
            "DRAClaimControllerNoLeader",
            (
                &[
                    r#"max(leader_election_master_status{name="dra-claim-controller"}) < 1"#,
                    r#"absent(leader_election_master_status{name="dra-claim-controller"})"#,
                ][..],
                "2m",
            ),
        ),
        (
            "DRAClaimControllerClaimCreationFailures",
            (
                &[r#"rate(resourceclaim_controller_creates_total{status="failure"}[5m])) > 0"#][..],
                "5m",
            ),
        ),
        (
            "DRAClaimLeakedAllocations",
            (
                &[r#"max(dra_claim_controller_claims{state="leaked_allocation"}) > 0"#][..],
                "30m",
            ),
        ),
        (
            "DRAClaimStuckDeleting",
            (
                &[r#"max(dra_claim_controller_claims{state="stuck_deleting"}) > 0"#][..],
                "30m",
            ),
        ),
        (
            "DRADeviceDoubleAllocation",
            (
                &["max(dra_claim_controller_device_double_allocations) > 0"][..],
                "5m",
            ),
        ),
    ]);
    assert_eq!(
        alerts.keys().map(String::as_str).collect::<Vec<_>>(),
        expected.keys().copied().collect::<Vec<_>>()
    );
    for (name, (needles, for_)) in expected {
        let (expr, got_for) = &alerts[name];
        for needle in needles {
            assert!(expr.contains(needle), "{name}: {expr:?} lacks {needle:?}");
        }
        assert_eq!(got_for, for_, "{name}");
    }
}

#[test]
fn prometheus_rule_thresholds_come_from_values() {
    // A float threshold needs a values file: --set has no floats.
    let values = r#"
prometheusRule:
  enabled: true
  selector: job="dra-metrics"
  alerts:
    workQueueDepthHigh:
      threshold: 250
    workDurationHigh:
      thresholdSeconds: 0.5
    retriesRising:
      threshold: 3
    noLeader:
      for: 5m
    claimCreationFailures:
      enabled: false
    leakedAllocations:
      for: 2h
    stuckDeletions:
      enabled: false
    doubleAllocations:
      for: 1m
"#;
    let docs = match helm::render_chart_with_values(RELEASE, NAMESPACE, values, &[]) {
        Ok(Some(yaml)) => docs(&yaml),
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    let rule = one_of_kind(&docs, "PrometheusRule");
    let rules = rule["spec"]["groups"][0]["rules"].as_sequence().unwrap();
    let expr = |name: &str| {
        rules
            .iter()
            .find(|r| r["alert"] == name)
            .map(|r| (str_of(&r["expr"]), str_of(&r["for"])))
    };
    assert_eq!(rules.len(), 6);
    let (e, _) = expr("DRAClaimControllerWorkQueueDepthHigh").unwrap();
    assert_eq!(
        e,
        r#"workqueue_depth{name="resource_claim",job="dra-metrics"} > 250"#
    );
    assert!(
        expr("DRAClaimControllerWorkDurationHigh")
            .unwrap()
            .0
            .ends_with("> 0.5")
    );
    assert!(
        expr("DRAClaimControllerRetriesRising")
            .unwrap()
            .0
            .ends_with("> 3")
    );
    assert_eq!(expr("DRAClaimControllerNoLeader").unwrap().1, "5m");
    assert!(expr("DRAClaimControllerClaimCreationFailures").is_none());
    assert_eq!(
        expr("DRAClaimLeakedAllocations").unwrap(),
        (
            r#"max(dra_claim_controller_claims{state="leaked_allocation",job="dra-metrics"}) > 0"#
                .to_string(),
            "2h".to_string()
        )
    );
    assert!(expr("DRAClaimStuckDeleting").is_none());
    // No matcher of its own: the selector alone, well-formed.
    assert_eq!(
        expr("DRADeviceDoubleAllocation").unwrap(),
        (
            r#"max(dra_claim_controller_device_double_allocations{job="dra-metrics"}) > 0"#
                .to_string(),
            "1m".to_string()
        )
    );
}

fn dashboard_exprs(dash: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    out
}

#[test]
fn grafana_dashboard_configmap() {
    let docs = render_or_skip!(&[("grafanaDashboard.enabled", "true")]);
    let cm = one_of_kind(&docs, "ConfigMap");
    assert_eq!(cm["metadata"]["namespace"], NAMESPACE);
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let data = cm["data"].as_mapping().unwrap();
    assert_eq!(data.len(), 1);
    let (key, json) = data.iter().next().unwrap();
    assert!(key.as_str().unwrap().ends_with(".json"));
    let dash: serde_json::Value =
        serde_json::from_str(json.as_str().unwrap()).expect("dashboard is JSON");
    let exprs = dashboard_exprs(&dash);
    for expected in [
        r#"rate(workqueue_adds_total{name="resource_claim"}[5m])"#,
        r#"workqueue_depth{name="resource_claim"}"#,
        r#"histogram_quantile(0.99, sum by (le) (rate(workqueue_work_duration_seconds_bucket{name="resource_claim"}[5m])))"#,
        "sum by (status) (rate(resourceclaim_controller_creates_total[5m]))",
        "sum by (allocated, admin_access, source) (resourceclaim_controller_resource_claims)",
        "sum(rate(rest_client_requests_total[1m]))",
        "vector(20)",
        "histogram_quantile(0.99, sum by (le) (rate(rest_client_rate_limiter_duration_seconds_bucket[5m])))",
        r#"leader_election_master_status{name="dra-claim-controller"}"#,
        r#"rate(workqueue_retries_total{name="resource_claim"}[5m])"#,
        r#"workqueue_unfinished_work_seconds{name="resource_claim"}"#,
        "max by (state) (dra_claim_controller_claims)",
        "sum by (result) (rate(dra_claim_controller_allocations_total[5m]))",
        "max(dra_claim_controller_device_double_allocations)",
    ] {
        assert!(
            exprs.iter().any(|e| e == expected),
            "dashboard lacks {expected:?}; has {exprs:#?}"
        );
    }
    // The QPS line sits on the same panel as the request rate.
    let qps_panel = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| {
            p["targets"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["expr"] == "vector(20)"))
        })
        .expect("QPS panel");
    assert!(
        qps_panel["targets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["expr"] == "sum(rate(rest_client_requests_total[1m]))")
    );
    // Allocation results and double allocations share one panel.
    let allocation_panel = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"] == "Device allocation")
        .expect("Device allocation panel");
    let panel_exprs: Vec<&str> = allocation_panel["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["expr"].as_str().unwrap())
        .collect();
    assert_eq!(
        panel_exprs,
        [
            "sum by (result) (rate(dra_claim_controller_allocations_total[5m]))",
            "max(dra_claim_controller_device_double_allocations)",
        ]
    );
    assert_eq!(allocation_panel["datasource"]["uid"], "${datasource}");
    // Panel ids are unique.
    let ids: Vec<u64> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ids.iter().collect::<BTreeSet<_>>().len(),
        ids.len(),
        "{ids:?}"
    );
    assert!(
        !json.as_str().unwrap().contains("__"),
        "unreplaced placeholder"
    );
}

#[test]
fn grafana_dashboard_follows_values() {
    let docs = render_or_skip!(&[
        ("grafanaDashboard.enabled", "true"),
        ("grafanaDashboard.sidecarLabel", "example.com/dashboard"),
        ("grafanaDashboard.sidecarLabelValue", "yes"),
        ("grafanaDashboard.namespace", "monitoring"),
        ("grafanaDashboard.annotations.grafana_folder", "DRA"),
        ("kubeAPI.qps", "42"),
        ("leaderElection.resourceName", "claims-leader"),
    ]);
    let cm = one_of_kind(&docs, "ConfigMap");
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["labels"]["example.com/dashboard"], "yes");
    assert!(cm["metadata"]["labels"]["grafana_dashboard"].is_null());
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "DRA");
    let (_, json) = cm["data"].as_mapping().unwrap().iter().next().unwrap();
    let dash: serde_json::Value = serde_json::from_str(json.as_str().unwrap()).unwrap();
    let exprs = dashboard_exprs(&dash);
    assert!(exprs.iter().any(|e| e == "vector(42)"), "{exprs:#?}");
    assert!(
        exprs
            .iter()
            .any(|e| e == r#"leader_election_master_status{name="claims-leader"}"#)
    );
}

// ---------------------------------------------------------------------------
// NOTES.txt
// ---------------------------------------------------------------------------

#[test]
fn notes_explain_turning_off_the_in_tree_controller() {
    let notes = match helm::render_notes(RELEASE, NAMESPACE, &[]) {
        Ok(Some(notes)) => notes,
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    for needle in [
        "--controllers=*,-resourceclaim-controller",
        "kube-controller-manager",
        "kubectl get lease -n kube-system",
        "kubectl get lease -n dra-system dra-claim-controller",
        "logs",
    ] {
        assert!(
            notes.contains(needle),
            "NOTES.txt lacks {needle:?}:\n{notes}"
        );
    }
}

// ---------------------------------------------------------------------------
// Pre-scheduled pods policy
// ---------------------------------------------------------------------------

fn render_for(
    set: &[(&str, &str)],
    kube_version: Option<&str>,
    api_versions: &[&str],
) -> Option<Result<Vec<Value>, String>> {
    match helm::render_chart_for_cluster(RELEASE, NAMESPACE, set, kube_version, api_versions) {
        Ok(Some(yaml)) => Some(Ok(docs(&yaml))),
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    }
}

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

// ---------------------------------------------------------------------------
// Allocation on pre-scheduled nodes (allocation.nodeSelector)
// ---------------------------------------------------------------------------

const PRE_SCHEDULED: &str = "dra.example.com/pre-scheduled=true";

/// The rules of the ClusterRole the controller's ServiceAccount is bound to.
fn bound_cluster_rules(docs: &[Value]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let binding = one_of_kind(docs, "ClusterRoleBinding");
    let role = all_of_kind(docs, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == binding["roleRef"]["name"])
        .expect("the bound ClusterRole is rendered");
    rules_by_resource(role)
}

/// The rules `allocation.nodeSelector` adds, and only those.
fn allocation_rules() -> BTreeMap<(String, String), BTreeSet<String>> {
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    BTreeMap::from([
        (
            ("resource.k8s.io".into(), "resourceslices".into()),
            set(&["get", "list", "watch"]),
        ),
        (
            ("resource.k8s.io".into(), "deviceclasses".into()),
            set(&["get", "list", "watch"]),
        ),
        (("".into(), "nodes".into()), set(&["list", "watch"])),
    ])
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
    for key in allocation_rules().keys() {
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
        7,
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

/// headroom.enabled: the flag, the PriorityClass, and exactly the rights
/// the headroom controller needs on top of the claim controller's.
#[test]
fn headroom_adds_its_flag_class_and_rights_only_when_enabled() {
    let off = render_or_skip!(&[]);
    assert!(all_of_kind(&off, "PriorityClass").is_empty());
    assert!(!args(&off).iter().any(|a| a.starts_with("--controllers")));
    let on = render_or_skip!(&[("headroom.enabled", "true")]);
    assert!(args(&on).contains(&"--controllers=resourceclaim,headroom".to_string()));
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

/// Artifact Hub's image list names the image of this chart version, and its
/// CRD list every CRD the chart ships.
#[test]
fn artifact_hub_annotations_follow_the_chart() {
    let chart: Value = serde_yaml::from_str(
        &std::fs::read_to_string(helm::chart_dir().join("Chart.yaml")).unwrap(),
    )
    .unwrap();
    let app_version = chart["appVersion"].as_str().unwrap();
    let images = chart["annotations"]["artifacthub.io/images"]
        .as_str()
        .unwrap();
    assert!(
        images.contains(&format!("dra-claim-controller:{app_version}")),
        "{images}"
    );
    let crds = chart["annotations"]["artifacthub.io/crds"]
        .as_str()
        .unwrap();
    for entry in std::fs::read_dir(helm::chart_dir().join("crds")).unwrap() {
        let crd: Value =
            serde_yaml::from_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap()).unwrap();
        let name = crd["metadata"]["name"].as_str().unwrap();
        assert!(crds.contains(name), "artifacthub.io/crds lacks {name}");
    }
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
fn service_monitor_authorization_and_a_verifiable_certificate() {
    let base = [
        ("serviceMonitor.enabled", "true"),
        ("serviceMonitor.namespace", "monitoring"),
    ];
    let endpoint =
        |docs: &[Value]| one_of_kind(docs, "ServiceMonitor")["spec"]["endpoints"][0].clone();

    // Default: the deprecated token file, and a self-signed certificate.
    let docs = render_or_skip!(&base);
    let e = endpoint(&docs);
    assert!(e["bearerTokenFile"].is_string(), "{e:?}");
    assert_eq!(e["tlsConfig"]["insecureSkipVerify"], true);
    assert!(all_of_kind(&docs, "Certificate").is_empty());

    // prometheus-operator's authorization, from a token Secret the chart makes.
    let mut set = base.to_vec();
    set.push((
        "serviceMonitor.authorization.prometheusServiceAccount",
        "prometheus-k8s",
    ));
    let docs = render_or_skip!(&set);
    let e = endpoint(&docs);
    assert!(e["bearerTokenFile"].is_null(), "{e:?}");
    assert_eq!(e["authorization"]["type"], "Bearer");
    assert_eq!(str_of(&e["authorization"]["credentials"]["key"]), "token");
    let secret = all_of_kind(&docs, "Secret")
        .into_iter()
        .find(|s| s["type"].as_str() == Some("kubernetes.io/service-account-token"))
        .expect("a token Secret");
    assert_eq!(str_of(&secret["metadata"]["namespace"]), "monitoring");
    assert_eq!(
        str_of(&secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]),
        "prometheus-k8s"
    );
    assert_eq!(
        str_of(&e["authorization"]["credentials"]["name"]),
        str_of(&secret["metadata"]["name"])
    );

    // An existing Secret instead.
    let mut set = base.to_vec();
    set.push(("serviceMonitor.authorization.secret.name", "prom-token"));
    let docs = render_or_skip!(&set);
    assert_eq!(
        str_of(&endpoint(&docs)["authorization"]["credentials"]["name"]),
        "prom-token"
    );

    // cert-manager: a certificate naming the Service, verified.
    let mut set = base.to_vec();
    set.push(("metrics.certManager.issuerRef.name", "cluster-ca"));
    set.push(("metrics.certManager.issuerRef.kind", "ClusterIssuer"));
    let docs = render_or_skip!(&set);
    let cert = one_of_kind(&docs, "Certificate");
    let dns = strings(&cert["spec"]["dnsNames"]);
    assert!(dns[0].ends_with("-metrics.dra-system.svc"), "{dns:?}");
    let e = endpoint(&docs);
    assert_eq!(e["tlsConfig"]["insecureSkipVerify"], false);
    assert_eq!(str_of(&e["tlsConfig"]["serverName"]), dns[0]);
    let secret_name = str_of(&cert["spec"]["secretName"]);
    assert_eq!(str_of(&e["tlsConfig"]["ca"]["secret"]["name"]), secret_name);
    // The controller serves that certificate.
    let deploy = one_of_kind(&docs, "Deployment");
    let mounted = deploy["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|v| v["secret"]["secretName"].as_str() == Some(secret_name.as_str()));
    assert!(mounted, "the Certificate's Secret is mounted");
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

#[test]
fn the_helm_test_hook_checks_the_release_with_rights_of_its_own() {
    let off = render_or_skip!(&[]);
    assert!(all_of_kind(&off, "Pod").is_empty(), "opt-in");
    let docs = render_or_skip!(&[("helmTest.enabled", "true")]);
    let pod = one_of_kind(&docs, "Pod");
    assert_eq!(
        str_of(&pod["metadata"]["annotations"]["helm.sh/hook"]),
        "test"
    );
    let c = &pod["spec"]["containers"][0];
    let args = strings(&c["args"]);
    assert_eq!(args[0], "check-release");
    assert!(
        args.iter()
            .any(|a| a.starts_with("--metrics-url=https://") && a.ends_with(":8080/metrics")),
        "{args:?}"
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    // Its own service account, with only what the checks read.
    let sa = str_of(&pod["spec"]["serviceAccountName"]);
    let role = all_of_kind(&docs, "Role")
        .into_iter()
        .find(|r| str_of(&r["metadata"]["name"]) == sa)
        .expect("the hook's Role");
    let verbs: Vec<String> = role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| strings(&r["verbs"]))
        .collect();
    assert_eq!(verbs, ["list", "get"]);
    let metrics = all_of_kind(&docs, "ClusterRoleBinding")
        .into_iter()
        .any(|b| {
            str_of(&b["roleRef"]["name"]).ends_with("-metrics-reader")
                && str_of(&b["subjects"][0]["name"]) == sa
        });
    assert!(metrics, "the hook may read /metrics");
}

/// API Priority and Fairness: by default a FlowSchema sends every request
/// of the controller's service account to `workload-high`, one flow per
/// user, matched before the built-in `service-accounts` schema (9000);
/// a value turns it off or picks the level; a precedence that would lose
/// to the built-in schema is refused.
#[test]
fn a_flow_schema_puts_the_controller_beside_kube_controller_manager() {
    let docs = render_or_skip!(&[]);
    let schema = one_of_kind(&docs, "FlowSchema");
    assert_eq!(schema["apiVersion"], "flowcontrol.apiserver.k8s.io/v1");
    let spec = &schema["spec"];
    assert_eq!(spec["priorityLevelConfiguration"]["name"], "workload-high");
    let precedence = spec["matchingPrecedence"].as_u64().unwrap();
    assert!(precedence < 9000, "{precedence}");
    assert_eq!(spec["distinguisherMethod"]["type"], "ByUser");
    let sa = one_of_kind(&docs, "ServiceAccount");
    let subject = &spec["rules"][0]["subjects"][0];
    assert_eq!(subject["kind"], "ServiceAccount");
    assert_eq!(subject["serviceAccount"]["name"], sa["metadata"]["name"]);
    assert_eq!(subject["serviceAccount"]["namespace"], NAMESPACE);
    assert_eq!(spec["rules"][0]["resourceRules"][0]["clusterScope"], true);
    assert_eq!(
        strings(&spec["rules"][0]["nonResourceRules"][0]["nonResourceURLs"]),
        ["*"]
    );

    let off = render_or_skip!(&[("kubeAPI.flowSchema.enabled", "false")]);
    assert!(all_of_kind(&off, "FlowSchema").is_empty());
    let chosen = render_or_skip!(&[("kubeAPI.flowSchema.priorityLevel", "global-default")]);
    assert_eq!(
        one_of_kind(&chosen, "FlowSchema")["spec"]["priorityLevelConfiguration"]["name"],
        "global-default"
    );
    let err = render_err_or_skip!(&[("kubeAPI.flowSchema.matchingPrecedence", "9000")]);
    assert!(err.to_string().contains("matchingPrecedence"), "{err}");
}
