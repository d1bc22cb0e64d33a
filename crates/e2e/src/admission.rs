//! The chart's admission objects (the pre-scheduled-pods
//! MutatingAdmissionPolicy and its binding), rendered with real Helm and
//! created on a test API server, and a wait until the API server enforces
//! them.

use anyhow::{Context as _, anyhow};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;

use crate::helm;

const KINDS: [(&str, &str); 2] = [
    ("MutatingAdmissionPolicy", "mutatingadmissionpolicies"),
    (
        "MutatingAdmissionPolicyBinding",
        "mutatingadmissionpolicybindings",
    ),
];

/// Renders the chart with `set` and returns its admission objects;
/// `Ok(None)` when Helm is unavailable here.
pub fn render_policy(set: &[(&str, &str)]) -> anyhow::Result<Option<Vec<Value>>> {
    let Some(yaml) = helm::render_chart(crate::rbac::RELEASE, crate::rbac::SYSTEM_NAMESPACE, set)
        .map_err(|e| anyhow!(e))?
    else {
        return Ok(None);
    };
    let docs = helm::parse_documents(&yaml)
        .map_err(|e| anyhow!(e))?
        .into_iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<Value>, _>>()?;
    Ok(Some(
        docs.into_iter()
            .filter(|d| KINDS.iter().any(|(k, _)| d["kind"] == *k))
            .collect(),
    ))
}

/// Creates the objects (cluster-scoped) as admin.
pub async fn apply(client: &kube::Client, docs: &[Value]) -> anyhow::Result<()> {
    for doc in docs {
        let kind = doc["kind"].as_str().context("no kind")?;
        let plural = KINDS
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, p)| *p)
            .with_context(|| format!("not an admission kind: {kind}"))?;
        let api_version = doc["apiVersion"].as_str().context("no apiVersion")?;
        let (group, version) = api_version
            .split_once('/')
            .context("apiVersion group/version")?;
        let ar =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let obj: DynamicObject = serde_json::from_value(doc.clone())?;
        Api::<DynamicObject>::all_with(client.clone(), &ar)
            .create(&PostParams::default(), &obj)
            .await
            .with_context(|| {
                format!(
                    "create {kind} {}",
                    obj.metadata.name.as_deref().unwrap_or("?")
                )
            })?;
    }
    Ok(())
}
