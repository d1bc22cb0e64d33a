//! `kubectl dra drain --pod-selector`, as `kubectl drain --pod-selector`:
//! of two pods on a node's devices only the selected one goes; the other
//! keeps running on its device, which stays cordoned, and the drain ends
//! Clean for the selected pods, naming the pod it kept. And a `--dry-run`
//! interrupted leaves no rule behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::ensure;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::ctx::TestCtx;
use crate::device_taints::{
    DRIVER, ensure_evicted, ensure_untouched, pod_on_device, publish, rule_resource,
    rules_apiserver, rules_controller,
};
use crate::drain_budgets::{Background, stand_in_kubelet};
use crate::k8s::*;

const TIMEOUT: Duration = Duration::from_secs(60);

/// `kubectl dra drain NODE --driver DRIVER --disable-eviction`, with
/// `extra` flags, the report as JSON.
async fn drain(kubeconfig: &std::path::Path, extra: &[&str]) -> crate::drain_check::Run {
    let mut args = vec!["drain", NODE, "--driver", DRIVER, "--disable-eviction"];
    args.extend_from_slice(extra);
    args.extend(["--timeout", "40s", "--interval", "1s", "-o", "json"]);
    crate::drain_check::run_within("kubectl-dra", kubeconfig, &args, Duration::from_secs(90)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_selector_drains_only_the_selected_pods() {
    const NAME: &str = "a_pod_selector_drains_only_the_selected_pods";
    let Some(mut t) = TestCtx::isolated_with(NAME, rules_controller(), 1, &rules_apiserver()).await
    else {
        return;
    };
    let kubeconfig = t.isolated_env().cluster.admin_kubeconfig.clone();
    let pool = "selector-pool";
    publish(
        &t,
        pool,
        &[("d0", json!([])), ("d1", json!([])), ("d2", json!([]))],
    )
    .await;
    for (name, device, app) in [("web", "d0", "web"), ("db", "d1", "db")] {
        pod_on_device(&t, name, pool, device, json!([])).await;
        t.pods()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"app": app}}})),
            )
            .await
            .unwrap();
    }
    // Deletions confirmed as a kubelet confirms them.
    let stop = Arc::new(AtomicBool::new(false));
    let background = Background(vec![stand_in_kubelet(t.pods(), stop.clone())]);

    let drained = drain(&kubeconfig, &["--pod-selector", "app=web"]).await;
    assert_eq!(drained.code, 0, "{drained:?}");
    let report = drained.json();
    assert_eq!(report["verdict"], "Clean", "{drained:?}");
    let kept: Vec<&str> = report["kept"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["subject"]["name"].as_str())
        .collect();
    assert_eq!(kept, ["db"], "{drained:?}");
    assert!(
        drained.stderr.contains(&format!(
            "kept: device {DRIVER}/{pool}/d1 stays in use by {}/db",
            t.ns
        )),
        "{drained:?}"
    );
    wait_for("web evicted", TIMEOUT, async || {
        ensure_evicted(t.pods().get_opt("web").await?.as_ref())
    })
    .await;
    holds_for("db kept running", Duration::from_secs(3), async || {
        let db = t.pods().get("db").await?;
        ensure!(
            db.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
            "db is not Running"
        );
        ensure_untouched(&db)
    })
    .await;

    // Run again without the selector: the rest goes.
    let rest = drain(&kubeconfig, &[]).await;
    assert_eq!(rest.code, 0, "{rest:?}");
    assert_eq!(rest.json()["verdict"], "Clean", "{rest:?}");
    wait_for("db evicted", TIMEOUT, async || {
        ensure_evicted(t.pods().get_opt("db").await?.as_ref())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    drop(background);
    t.finish();
}

/// The names of the node's drain rules, as the server has them.
async fn drain_rules(t: &TestCtx) -> anyhow::Result<Vec<String>> {
    let rules: Api<DynamicObject> = Api::all_with(t.client.clone(), &rule_resource());
    let selector = format!("dra-claim-controller.io/drain-node={NODE}");
    Ok(rules
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter_map(|r| r.metadata.name)
        .collect())
}

/// A `--dry-run` stopped while it waits for its previews (no controller
/// writes them here) removes the preview rules it made: after Ctrl-C none
/// is left. One killed outright cannot; the next dry run removes what it
/// left, and evicts nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_dry_run_leaves_no_rule_behind() {
    const NAME: &str = "an_interrupted_dry_run_leaves_no_rule_behind";
    let Some(mut t) = TestCtx::isolated_with(NAME, rules_controller(), 0, &rules_apiserver()).await
    else {
        return;
    };
    let kubeconfig = t.isolated_env().cluster.admin_kubeconfig.clone();
    publish(&t, "dry-pool", &[("d0", json!([]))]).await;
    let dry_run = [
        "drain",
        NODE,
        "--driver",
        DRIVER,
        "--dry-run",
        "--preview-timeout",
        "60s",
    ];
    for signal in [libc::SIGINT, libc::SIGKILL] {
        let child = crate::drain_check::command("kubectl-dra", &kubeconfig, &dry_run)
            .spawn()
            .expect("start kubectl-dra");
        wait_for("the preview rule made", TIMEOUT, async || {
            ensure!(drain_rules(&t).await?.len() == 1, "no preview rule yet");
            Ok(())
        })
        .await;
        crate::procs::signal_child(&child, signal);
        let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
            .await
            .expect("kubectl-dra ends once signalled")
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let left = drain_rules(&t).await.unwrap();
        if signal == libc::SIGINT {
            assert_ne!(out.status.code(), Some(0), "{stderr}");
            assert!(stderr.contains("dry run interrupted"), "{stderr}");
            assert!(left.is_empty(), "left behind: {left:?}");
        } else {
            assert_eq!(left.len(), 1, "a killed dry run cannot clean up");
        }
    }
    let next = crate::drain_check::run_within(
        "kubectl-dra",
        &kubeconfig,
        &[
            "drain",
            NODE,
            "--driver",
            DRIVER,
            "--dry-run",
            "--preview-timeout",
            "2s",
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(next.code, 0, "{next:?}");
    let left = drain_rules(&t).await.unwrap();
    assert!(left.is_empty(), "the leftover preview removed: {left:?}");
    t.finish();
}
