//! The chart's the Deployment: shape, security context, probes, flags from values, scheduling, labels.

use super::*;

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
