//! The controller's identity on the test API server: the Helm chart's RBAC
//! objects (so a permission the chart forgot fails a test here rather than a
//! rollout), a ServiceAccount token from the TokenRequest API, and a
//! kubeconfig that uses it.

use std::sync::OnceLock;

use anyhow::{Context as _, anyhow};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::helm;

/// Namespace of the controller's ServiceAccount and leader-election Lease.
pub const SYSTEM_NAMESPACE: &str = "dra-system";
/// Helm release name; with the chart's naming rules it is also the object name.
pub const RELEASE: &str = "dra-claim-controller";
/// Lease name the chart's Role grants access to.
pub const LEASE_NAME: &str = "dra-claim-controller";

/// The RBAC objects to apply and where they came from.
#[derive(Debug, Clone)]
pub struct Rbac {
    pub docs: Vec<Value>,
    pub origin: String,
    pub service_account: String,
}

/// Set to `builtin` to skip Helm and use the built-in rules.
pub const RBAC_SOURCE_ENV: &str = "DRA_E2E_RBAC";

/// The chart's RBAC, rendered once per test binary; the built-in copy when
/// Helm is unavailable here or the chart does not render.
pub fn controller_rbac() -> Rbac {
    static RBAC: OnceLock<Rbac> = OnceLock::new();
    if std::env::var(RBAC_SOURCE_ENV).is_ok_and(|v| v == "builtin") {
        return RBAC.get_or_init(builtin).clone();
    }
    // With headroom's rights, so that a test may run that controller too.
    RBAC.get_or_init(|| {
        match helm::render_rbac(RELEASE, SYSTEM_NAMESPACE, &[("headroom.enabled", "true")]) {
            Ok(Some(yaml)) => match from_chart(&yaml) {
                Ok(rbac) => rbac,
                Err(e) => {
                    eprintln!("e2e: rendered chart RBAC unusable ({e}); using the built-in rules");
                    builtin()
                }
            },
            Ok(None) => builtin(),
            Err(e) => {
                eprintln!("e2e: chart render failed ({e}); using the built-in rules");
                builtin()
            }
        }
    })
    .clone()
}

fn from_chart(yaml: &str) -> anyhow::Result<Rbac> {
    let mut docs = Vec::new();
    for doc in helm::parse_documents(yaml).map_err(|e| anyhow!(e))? {
        docs.push(serde_json::to_value(doc)?);
    }
    let service_account = docs
        .iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .and_then(|d| d["metadata"]["name"].as_str())
        .context("the chart renders no ServiceAccount")?
        .to_string();
    for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        if !docs.iter().any(|d| d["kind"] == kind) {
            anyhow::bail!("the chart renders no {kind}");
        }
    }
    Ok(Rbac {
        docs,
        origin: "helm chart charts/dra-claim-controller".into(),
        service_account,
    })
}

/// The same rules as the chart, for machines without Helm.
fn builtin() -> Rbac {
    let sa = RELEASE;
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| json!({"apiGroups": [group], "resources": resources, "verbs": verbs});
    let cluster_rules = vec![
        rule("", &["pods"], &["get", "list", "watch"]),
        rule("", &["pods/status"], &["patch"]),
        rule(
            "resource.k8s.io",
            &["resourceclaims"],
            &[
                "get", "list", "watch", "create", "delete", "update", "patch",
            ],
        ),
        rule(
            "resource.k8s.io",
            &["resourceclaims/status"],
            &["update", "patch"],
        ),
        rule(
            "resource.k8s.io",
            &["resourceclaims/binding"],
            &["update", "patch"],
        ),
        rule(
            "resource.k8s.io",
            &["resourceclaimtemplates"],
            &["get", "list", "watch"],
        ),
        rule("", &["events"], &["create", "patch"]),
        rule("events.k8s.io", &["events"], &["create", "patch"]),
        rule("authentication.k8s.io", &["tokenreviews"], &["create"]),
        rule(
            "authorization.k8s.io",
            &["subjectaccessreviews"],
            &["create"],
        ),
        // headroom.enabled (see controller_rbac).
        rule(
            "dra-claim-controller.io",
            &["nodescalingwatermarks"],
            &["get", "list", "watch"],
        ),
        rule(
            "dra-claim-controller.io",
            &["nodescalingwatermarks/status"],
            &["patch"],
        ),
        rule(
            "apps",
            &["deployments"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        rule(
            "resource.k8s.io",
            &["resourceclaimtemplates"],
            &["create", "patch", "delete"],
        ),
        rule(
            "resource.k8s.io",
            &["resourceslices", "deviceclasses"],
            &["get", "list", "watch"],
        ),
        rule("", &["nodes"], &["list", "watch"]),
        rule("", &["pods"], &["delete", "patch"]),
        rule("", &["pods/eviction"], &["create"]),
    ];
    let subject = json!([{"kind": "ServiceAccount", "name": sa, "namespace": SYSTEM_NAMESPACE}]);
    let docs = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": sa, "namespace": SYSTEM_NAMESPACE}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": sa}, "rules": cluster_rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": INSPECTOR_ROLE}, "rules": [
            rule("", &["pods"], &["get", "list"]),
            rule("", &["nodes"], &["get"]),
            rule("resource.k8s.io", &["resourceclaims", "resourceslices"], &["get", "list"]),
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": METRICS_READER_ROLE},
               "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": sa},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": sa},
               "subjects": subject}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": format!("{sa}-leader-election"), "namespace": SYSTEM_NAMESPACE},
               "rules": [rule("coordination.k8s.io", &["leases"], &["get", "list", "watch", "create", "update"])]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": format!("{sa}-leader-election"), "namespace": SYSTEM_NAMESPACE},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": format!("{sa}-leader-election")},
               "subjects": subject}),
    ];
    Rbac {
        docs,
        origin: "the built-in copy of the chart's rules".into(),
        service_account: sa.to_string(),
    }
}

fn api_resource(doc: &Value) -> anyhow::Result<(ApiResource, bool)> {
    let api_version = doc["apiVersion"].as_str().context("no apiVersion")?;
    let kind = doc["kind"].as_str().context("no kind")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (plural, namespaced) = match kind {
        "ServiceAccount" => ("serviceaccounts", true),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        other => anyhow::bail!("unexpected kind {other} in RBAC documents"),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Ok((ApiResource::from_gvk_with_plural(&gvk, plural), namespaced))
}

/// The API of an RBAC document's kind (namespaced ones default to
/// [`SYSTEM_NAMESPACE`]), the document as an object, and its resource.
fn api_for(
    client: &kube::Client,
    doc: &Value,
) -> anyhow::Result<(Api<DynamicObject>, DynamicObject, ApiResource)> {
    let (ar, namespaced) = api_resource(doc)?;
    let obj: DynamicObject = serde_json::from_value(doc.clone())?;
    let api = if namespaced {
        let ns = obj
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| SYSTEM_NAMESPACE.to_string());
        Api::namespaced_with(client.clone(), &ns, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    };
    Ok((api, obj, ar))
}

/// Creates the RBAC objects as admin.
pub async fn apply(client: &kube::Client, rbac: &Rbac) -> anyhow::Result<()> {
    for doc in &rbac.docs {
        let (api, obj, ar) = api_for(client, doc)?;
        api.create(&PostParams::default(), &obj)
            .await
            .with_context(|| {
                format!(
                    "create {} {}",
                    ar.kind,
                    obj.metadata.name.as_deref().unwrap_or("?")
                )
            })?;
    }
    Ok(())
}

/// Re-applies the chart's RBAC rendered with `set` over what the cluster
/// has (server-side apply), e.g. with a feature gate that grants more.
/// `Ok(false)`: Helm is not available here, nothing was applied.
pub async fn reapply_controller_rbac(
    client: &kube::Client,
    set: &[(&str, &str)],
) -> anyhow::Result<bool> {
    let Some(yaml) = helm::render_rbac(RELEASE, SYSTEM_NAMESPACE, set).map_err(|e| anyhow!(e))?
    else {
        return Ok(false);
    };
    for doc in from_chart(&yaml)?.docs {
        let (api, obj, ar) = api_for(client, &doc)?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &kube::api::PatchParams::apply("e2e").force(),
            &kube::api::Patch::Apply(&doc),
        )
        .await
        .with_context(|| format!("apply {} {name}", ar.kind))?;
    }
    Ok(true)
}

/// [`reapply_controller_rbac`] for the test `name`: panics when applying
/// fails; `false` after one `SKIP:` line when Helm is not available here.
pub async fn reapply_controller_rbac_or_skip(
    client: &kube::Client,
    name: &str,
    set: &[(&str, &str)],
) -> bool {
    let applied = reapply_controller_rbac(client, set)
        .await
        .unwrap_or_else(|e| panic!("{name}: apply the chart's RBAC with {set:?}: {e:#}"));
    if !applied {
        println!("SKIP: {name}: Helm is not available to render the chart's RBAC with {set:?}");
    }
    applied
}

/// The chart's read-only ClusterRole for `drain-check` and `audit`.
pub const INSPECTOR_ROLE: &str = "dra-claim-controller-inspector";
/// The chart's role for reading the secure `/metrics`.
pub const METRICS_READER_ROLE: &str = "dra-claim-controller-metrics-reader";

/// A new ServiceAccount `name` in [`SYSTEM_NAMESPACE`], bound to
/// `cluster_role` when given (none: a user without rights), and a token
/// for it. For testing what the chart's roles allow, as someone other
/// than admin (see `Cluster::service_account_kubeconfig`).
pub async fn service_account_with_role(
    admin: &kube::Client,
    name: &str,
    cluster_role: Option<&str>,
) -> anyhow::Result<String> {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}}))?,
    )
    .await
    .with_context(|| format!("create ServiceAccount {name}"))?;
    if let Some(role) = cluster_role {
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{name}-{role}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": SYSTEM_NAMESPACE}],
        });
        let (ar, _) = api_resource(&binding)?;
        Api::<DynamicObject>::all_with(admin.clone(), &ar)
            .create(&PostParams::default(), &serde_json::from_value(binding)?)
            .await
            .with_context(|| format!("bind {name} to ClusterRole {role}"))?;
    }
    service_account_token(admin, name).await
}

/// A token for the controller's ServiceAccount, minted through the
/// `serviceaccounts/token` subresource.
pub async fn service_account_token(client: &kube::Client, sa: &str) -> anyhow::Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(24 * 3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let resp = api
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for {SYSTEM_NAMESPACE}/{sa}"))?;
    resp.status
        .and_then(|s| s.token)
        .context("TokenRequest returned no token")
}
