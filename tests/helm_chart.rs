//! Tests of the Helm chart in charts/dra-claim-controller, rendered by a real
//! Helm (see the `dra_e2e::helm` harness module; `tests/helm/venv.sh`
//! installs it). Without it each test prints a SKIP line and passes, unless
//! `DRA_HELM_TESTS_REQUIRED=1` (set by `.ci/run`) makes that a failure.
//! The helpers are here; the tests, by area, in `helm_chart/`.

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
        // Pods: the claim controller reads them; the device-taint eviction
        // controller (on by default) deletes them.
        ("", "pods", &["get", "list", "watch", "delete"][..]),
        ("", "pods/status", &["patch"]),
        // Budget-respecting evictions (DeviceTaintRules that ask for them).
        ("", "pods/eviction", &["create"]),
        (
            "resource.k8s.io",
            "resourceslices",
            &["get", "list", "watch"],
        ),
        (
            "resource.k8s.io",
            "devicetaintrules",
            &["get", "list", "watch"],
        ),
        ("resource.k8s.io", "devicetaintrules/status", &["patch"]),
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
    use dra_claim_controller::model::device_taints::RulesVersion;
    use dra_claim_controller::model::views::PodGroupApi;
    let mut urls = vec!["/version".to_string()];
    urls.extend(
        [RulesVersion::V1, RulesVersion::V1beta2].map(|v| format!("/apis/{}", v.api_version())),
    );
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

/// The args the chart must pass for the given values.yaml content.
fn expected_args(values: &Value) -> Vec<String> {
    let le = &values["leaderElection"];
    let mut out = Vec::new();
    let kubeconfig = str_of(&values["kubeconfig"]);
    if !kubeconfig.is_empty() {
        out.push(format!("--kubeconfig={kubeconfig}"));
    }
    let eviction = &values["deviceTaintEviction"];
    let evicting = eviction["enabled"].as_bool() == Some(true);
    let headroom = values["headroom"]["enabled"].as_bool() == Some(true);
    out.push(format!(
        "--controllers={}{}",
        if evicting { "*" } else { "resourceclaim" },
        if headroom { ",headroom" } else { "" }
    ));
    if evicting {
        out.extend([
            format!(
                "--concurrent-device-taint-eviction-syncs={}",
                str_of(&eviction["concurrentSyncs"])
            ),
            format!(
                "--device-taint-evictions-per-second={}",
                str_of(&eviction["evictionsPerSecond"])
            ),
            format!(
                "--device-taint-evictions-per-rule-per-second={}",
                str_of(&eviction["evictionsPerRulePerSecond"])
            ),
            format!(
                "--device-taint-eviction-max-share={}",
                str_of(&eviction["maxShare"])
            ),
        ]);
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

// ---------------------------------------------------------------------------
// Secure metrics
// ---------------------------------------------------------------------------

fn metrics_reader(docs: &[Value]) -> Option<&Value> {
    let name = format!("{RELEASE}-dra-claim-controller-metrics-reader");
    all_of_kind(docs, "ClusterRole")
        .into_iter()
        .find(|r| str_of(&r["metadata"]["name"]) == name)
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

#[path = "helm_chart/deployment.rs"]
mod deployment;
#[path = "helm_chart/device_taints.rs"]
mod device_taints;
#[path = "helm_chart/headroom.rs"]
mod headroom;
#[path = "helm_chart/monitoring.rs"]
mod monitoring;
#[path = "helm_chart/pool_status.rs"]
mod pool_status;
#[path = "helm_chart/prescheduled_and_allocation.rs"]
mod prescheduled_and_allocation;
#[path = "helm_chart/priority.rs"]
mod priority;
#[path = "helm_chart/rbac.rs"]
mod rbac;
#[path = "helm_chart/release.rs"]
mod release;
#[path = "helm_chart/values.rs"]
mod values;
