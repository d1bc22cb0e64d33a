//! The chart's values.yaml, its schema and README, lint and render.

use super::*;

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

/// The shipped dashboard is JSON with the tokens the chart substitutes
/// (`__KUBE_API_QPS__`: the QPS line drawn from values); what a user sees
/// rendered, the token replaced, is `grafana_dashboard_follows_values`.
#[test]
fn dashboard_file_is_json_with_value_tokens() {
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
