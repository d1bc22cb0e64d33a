//! The chart's metrics access, ServiceMonitor, NetworkPolicy, PrometheusRule alerts, the Grafana dashboard, NOTES.

use super::*;

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
fn prometheus_rule_has_the_ten_alerts() {
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
        (
            "DRAPoolExhausted",
            (
                &[
                    r#"sum by (driver) (dra_claim_controller_pool_devices{state="free"}) == 0"#,
                    r#"sum by (driver) (dra_claim_controller_pool_devices{state="total"}) > 0"#,
                ][..],
                "15m",
            ),
        ),
        (
            "DRADeviceTaintRuleHeld",
            (
                &["max(dra_claim_controller_device_taint_rules_held) > 0"][..],
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
    assert_eq!(rules.len(), 8);
    assert!(
        expr("DRAPoolExhausted")
            .unwrap()
            .0
            .contains(r#"dra_claim_controller_pool_devices{state="free",job="dra-metrics"}"#)
    );
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
