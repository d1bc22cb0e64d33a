//! `kubectl dra drain --pod-selector`, as `kubectl drain --pod-selector`:
//! of two pods on a node's devices only the selected one goes; the other
//! keeps running on its device, which stays cordoned, and the drain ends
//! Clean for the selected pods, naming the pod it kept.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::ensure;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::ctx::TestCtx;
use crate::device_taints::{
    DRIVER, ensure_evicted, ensure_untouched, pod_on_device, publish, rules_apiserver,
    rules_controller,
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
