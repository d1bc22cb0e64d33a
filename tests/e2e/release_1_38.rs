//! Acting as kube-controller-manager 1.38: pinned (`--reference-release=1.38`)
//! where 1.38 differs in the controller rather than in the API (the test
//! bed's API server is 1.36), and chosen by `auto` behind the fault proxy
//! answering `/version` as v1.38.0 and as v1.39.0 (newer than any release
//! known: served as 1.38, and said so).

use std::time::Duration;

use anyhow::ensure;
use serde_json::{Value, json};

use crate::cluster::{ALL_CONTROLLER_GATES, ControllerOpts};
use crate::ctx::TestCtx;
use crate::device_taints::{
    create_rule, ensure_evicted, no_execute, pod_on_device, publish, rules_apiserver,
};
use crate::fault_proxy::FaultPlan;
use crate::faults_api::fault_proxy_kubeconfig;
use crate::k8s::*;

const TIMEOUT: Duration = Duration::from_secs(30);

fn as_1_38(extra: &[&str]) -> ControllerOpts {
    let mut extra_args = vec!["--reference-release=1.38".to_string()];
    extra_args.extend(extra.iter().map(|a| a.to_string()));
    ControllerOpts {
        extra_args,
        ..ControllerOpts::default()
    }
}

/// The controller's log says which release it acts as.
fn acts_as(t: &TestCtx, release: &str) -> anyhow::Result<String> {
    let log = t.controller().proc.log_tail(400);
    ensure!(
        log.contains(&format!(
            "acting as kube-controller-manager {release}'s DRA controllers"
        )),
        "no start-up line for {release} in:\n{log}"
    );
    Ok(log)
}

/// 1.38's `TestController/evict-pod-extended-resourceclaim` (kubernetes
/// #142289): a pod holding a tainted device only through
/// `status.extendedResourceClaimStatus` is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_1_38_a_pod_holding_a_tainted_device_through_an_extended_resource_claim_is_evicted() {
    const NAME: &str =
        "as_1_38_a_pod_holding_a_tainted_device_through_an_extended_resource_claim_is_evicted";
    let Some(t) = TestCtx::isolated(NAME, as_1_38(&[]), 1).await else {
        return;
    };
    acts_as(&t, "1.38").unwrap();
    let (_, claim) = t.create_extended_resource_pod("ext", "ext-claim").await;
    let device = allocation(&t.ns, "ext-claim")["devices"]["results"][0]["device"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(claim.status.is_some_and(|s| s.allocation.is_some()));
    publish(&t, "pool", &[(&device, no_execute())]).await;
    wait_for("the extended-resource pod evicted", TIMEOUT, async || {
        ensure_evicted(t.pods().get_opt("ext").await?.as_ref())
    })
    .await;
    t.finish();
}

/// kubernetes #141648, as 1.38 documents it: a DeviceTaintRule without
/// `deviceSelector` selects no device, so its `NoExecute` evicts nobody;
/// an empty selector (`{}`) selects every device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_1_38_a_rule_without_selector_evicts_nobody_and_an_empty_one_everybody() {
    const NAME: &str = "as_1_38_a_rule_without_selector_evicts_nobody_and_an_empty_one_everybody";
    let mut opts = as_1_38(&["--device-taint-eviction-max-share=1"]);
    opts.feature_gates = format!("{ALL_CONTROLLER_GATES},DRADeviceTaintRules=true");
    let Some(t) = TestCtx::isolated_with(NAME, opts, 1, &rules_apiserver()).await else {
        return;
    };
    acts_as(&t, "1.38").unwrap();
    publish(&t, "pool", &[("d0", json!([])), ("d1", json!([]))]).await;
    pod_on_device(&t, "a", "pool", "d0", json!([])).await;
    pod_on_device(&t, "b", "pool", "d1", json!([])).await;

    create_rule(&t, "no-selector", "NoExecute", Value::Null).await;
    holds_for("both pods to stay", Duration::from_secs(4), async || {
        for name in ["a", "b"] {
            let pod = t.pods().get(name).await?;
            ensure!(
                pod.metadata.deletion_timestamp.is_none(),
                "{name} is being deleted by a rule that selects nothing"
            );
        }
        Ok(())
    })
    .await;

    create_rule(&t, "everything", "NoExecute", json!({})).await;
    wait_for("both pods evicted", TIMEOUT, async || {
        for name in ["a", "b"] {
            ensure_evicted(t.pods().get_opt(name).await?.as_ref())?;
        }
        Ok(())
    })
    .await;
    t.finish();
}

/// `--reference-release=auto` with the API server's `/version` answered as
/// `git_version` by the fault proxy: the controller acts as `acting`, its
/// claims are made, and the release metric carries both.
async fn auto_behind_a_server_of(
    name: &'static str,
    git_version: &str,
    acting: &str,
) -> Option<String> {
    let mut t = TestCtx::isolated(name, ControllerOpts::default(), 0).await?;
    let (proxy, kubeconfig) = fault_proxy_kubeconfig(&mut t, FaultPlan::default()).await;
    proxy.answer_version(git_version);
    t.isolated_env()
        .start_controller_with_kubeconfig(&kubeconfig)
        .await
        .expect("start the controller behind the proxy");
    t.create_template("tmpl").await;
    t.create_pod("pod", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    t.wait_recorded("pod", &["gpu"]).await;
    let log = acts_as(&t, acting).unwrap();
    let served = git_version
        .trim_start_matches('v')
        .rsplit_once('.')
        .map(|(minor, _)| minor.to_string())
        .unwrap();
    let metrics = t.controller().metrics_text().await.unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("dra_claim_controller_reference_release{"))
        .unwrap_or_default()
        .to_string();
    assert!(
        line.contains(&format!("release=\"{acting}\""))
            && line.contains(&format!("api_server=\"{served}\""))
            && line.ends_with(" 1"),
        "{line:?}"
    );
    assert_eq!(t.restarts(), 0);
    t.finish();
    Some(log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_on_a_1_38_api_server_acts_as_1_38() {
    const NAME: &str = "auto_on_a_1_38_api_server_acts_as_1_38";
    let Some(log) = auto_behind_a_server_of(NAME, "v1.38.0", "1.38").await else {
        return;
    };
    assert!(!log.contains("newer than the newest release"), "{log}");
}

/// A server newer than any release known is served with the newest known
/// rules, never refused, and the log says so once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_on_a_newer_api_server_acts_as_the_newest_known_and_says_so_once() {
    const NAME: &str = "auto_on_a_newer_api_server_acts_as_the_newest_known_and_says_so_once";
    let Some(log) = auto_behind_a_server_of(NAME, "v1.39.0", "1.38").await else {
        return;
    };
    let notices = log
        .lines()
        .filter(|l| l.contains("the API server is Kubernetes 1.39, newer than the newest release"))
        .count();
    assert_eq!(notices, 1, "{log}");
}
