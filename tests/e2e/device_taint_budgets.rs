//! Evictions that respect PodDisruptionBudgets (a DeviceTaintRule annotated
//! `dra-claim-controller.io/respect-disruption-budgets=true`): the pods of
//! such a rule go through the Eviction API, so a budget that allows no
//! disruption holds them, and the admin sees which budget in the rule's
//! status, a Warning event on the pod and a metric; once the budget allows
//! it, the pod is evicted.

use std::time::Duration;

use anyhow::ensure;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cluster::{ALL_CONTROLLER_GATES, ControllerOpts};
use crate::ctx::TestCtx;
use crate::device_taints::{
    DRIVER, TAINT_KEY, pod_on_device, publish, rule_condition, rule_resource, rules_apiserver,
};
use crate::k8s::*;

const TIMEOUT: Duration = Duration::from_secs(30);
const BUDGET: &str = "web-pdb";

/// A PodDisruptionBudget `name` over the pods labelled `app=<app>`, with
/// `minAvailable: min_available`.
pub async fn create_budget(
    budgets: &Api<PodDisruptionBudget>,
    name: &str,
    app: &str,
    min_available: i32,
) {
    budgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
}

/// Sets the budget's `minAvailable`.
pub async fn set_min_available(budgets: &Api<PodDisruptionBudget>, name: &str, min_available: i32) {
    budgets
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minAvailable": min_available}})),
        )
        .await
        .unwrap();
}

/// Waits until kube-controller-manager's disruption controller says the
/// budget (as it is now) allows `n` disruptions.
pub async fn until_budget_allows(budgets: &Api<PodDisruptionBudget>, name: &str, n: i32) {
    wait_for(
        &format!("budget {name} to allow {n}"),
        Duration::from_secs(60),
        async || {
            let budget = budgets.get(name).await?;
            let status = budget.status.unwrap_or_default();
            ensure!(
                status.observed_generation == budget.metadata.generation
                    && status.disruptions_allowed == Some(n),
                "{status:?}"
            );
            Ok(())
        },
    )
    .await;
}

/// Being deleted, or gone: the eviction went through.
fn evicted(pod: Option<&Pod>) -> anyhow::Result<()> {
    if let Some(pod) = pod {
        ensure!(
            pod.metadata.deletion_timestamp.is_some(),
            "{} is not being deleted",
            pod.metadata.name.as_deref().unwrap_or_default()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_that_allows_nothing_holds_the_eviction_and_says_which() {
    const NAME: &str = "a_budget_that_allows_nothing_holds_the_eviction_and_says_which";
    let opts = ControllerOpts {
        feature_gates: format!("{ALL_CONTROLLER_GATES},DRADeviceTaintRules=true"),
        extra_args: vec!["--device-taint-eviction-max-share=1".into()],
        ..ControllerOpts::default()
    };
    let Some(t) = TestCtx::isolated_with(NAME, opts, 1, &rules_apiserver()).await else {
        return;
    };
    publish(&t, "pool", &[("d0", json!([]))]).await;
    pod_on_device(&t, "web-0", "pool", "d0", json!([])).await;
    // Running, as a kubelet reports it: the API server lets evictions of
    // pending pods through whatever their budget says.
    t.set_pod_phase("web-0", "Running").await;
    t.pods()
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
        )
        .await
        .unwrap();
    // No disruption controller runs here: the API server refuses every
    // eviction the budget covers ("still being processed").
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(t.client.clone(), &t.ns);
    create_budget(&budgets, BUDGET, "web", 1).await;
    let rules: Api<DynamicObject> = Api::all_with(t.client.clone(), &rule_resource());
    let rule: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "drain", "annotations": {
            "dra-claim-controller.io/respect-disruption-budgets": "true"}},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": "pool"},
            "taint": {"key": TAINT_KEY, "value": "maintenance", "effect": "NoExecute"},
        },
    }))
    .unwrap();
    rules.create(&PostParams::default(), &rule).await.unwrap();

    let budget = format!("{}/{BUDGET}", t.ns);
    wait_for(
        "the rule's status to name the budget",
        TIMEOUT,
        async || {
            let (status, reason, message) = rule_condition(&t, "drain").await?;
            ensure!(
                status == "True"
                    && reason == "PodsPendingEviction"
                    && message
                        .contains(&format!("1 pod waiting for PodDisruptionBudget {budget}.")),
                "{status} {reason} {message:?}"
            );
            Ok(())
        },
    )
    .await;
    holds_for(
        "the pod to stay while the budget holds",
        Duration::from_secs(3),
        async || {
            let pod = t.pods().get("web-0").await?;
            ensure!(
                pod.metadata.deletion_timestamp.is_none(),
                "web-0 is being deleted"
            );
            Ok(())
        },
    )
    .await;
    let warnings = t
        .warning_events("web-0", "EvictionBlockedByDisruptionBudget")
        .await
        .unwrap();
    assert!(
        warnings.iter().any(|e| e
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&format!("PodDisruptionBudget {budget}")))),
        "{warnings:?}"
    );
    let metrics = t.controller().metrics_text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "dra_claim_controller_device_taint_evictions_refused_total{rule=\"drain\"}"
        )),
        "no refusal counted"
    );
    let errors = t.controller().proc.log_tail(400);
    assert!(
        !errors.contains("sync failed; retrying with backoff"),
        "a refusal is not an error:\n{errors}"
    );

    // The budget goes (as it would allow a disruption): the pod is evicted.
    budgets.delete(BUDGET, &Default::default()).await.unwrap();
    wait_for("web-0 evicted", Duration::from_secs(90), async || {
        evicted(t.pods().get_opt("web-0").await?.as_ref())
    })
    .await;
    t.finish();
}
