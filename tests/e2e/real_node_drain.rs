//! `drain` on a real node: a pod using the test driver's device runs under
//! a PodDisruptionBudget (kube-controller-manager's disruption controller
//! keeps its status); the node's devices are drained with DeviceTaintRules
//! (a dry run, then cordoned and `NoExecute`, evicting through the
//! Eviction API, `drain`'s default). While the budget allows nothing the
//! drain is held and says so; once it allows one, the eviction controller
//! evicts the running pod, the kubelet stops it, the driver unprepares the
//! claim, the claim goes, and the command ends with drain-check's Clean.
//! `uncordon` gives the devices back: a new pod runs on them.

use std::time::{Duration, Instant};

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::ctx::TestCtx;
use crate::device_taint_budgets::{create_budget, set_min_available, until_budget_allows};
use crate::device_taints::{rules_apiserver, rules_controller};
use crate::real_node::{DRIVER, RealNode};
use crate::real_node_tests::{
    NODE, can_run, claim_of, create_template, run_pod, until_claim_gone, until_unprepared,
};
use crate::scheduler::Scheduler;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_and_uncordon_a_real_node() {
    const NAME: &str = "drain_and_uncordon_a_real_node";
    if !can_run(NAME) {
        return;
    }
    let Some(scheduler_bin) = crate::scheduler::binary_or_skip(NAME) else {
        return;
    };
    let Some(kcm) = crate::reference::binary_or_skip(NAME) else {
        return;
    };
    let Some(mut t) = TestCtx::isolated_with(NAME, rules_controller(), 1, &rules_apiserver()).await
    else {
        return;
    };
    let cluster = &t.isolated_env().cluster;
    let admin = cluster.admin_kubeconfig.clone();
    let node = RealNode::start(cluster, NODE).await.expect("real node");
    let _scheduler = Scheduler::start(&scheduler_bin, cluster)
        .await
        .expect("kube-scheduler");
    let _disruption =
        crate::reference::Reference::start_controllers(&kcm, cluster, &["disruption-controller"])
            .await
            .expect("kube-controller-manager's disruption controller");
    create_template(&t).await;

    run_pod(&t, "holder", "sleep 600", None).await;
    let claim = claim_of(&t.pods().get("holder").await.unwrap()).expect("claim recorded");

    // The preview evicts nobody.
    let preview = crate::drain_check::run(
        "dra-claim-controller",
        &admin,
        &["drain", NODE, "--driver", DRIVER, "--dry-run"],
    )
    .await;
    assert_eq!(preview.code, 0, "{preview:?}");
    assert!(
        preview
            .stderr
            .contains("1 pod would be evicted in 1 namespace"),
        "the preview says what would go: {preview:?}"
    );
    let running = t.pods().get("holder").await.unwrap();
    assert!(
        running.metadata.deletion_timestamp.is_none(),
        "evicted by a preview"
    );

    // A budget that allows nothing holds the drain, which says so.
    t.pods()
        .patch(
            "holder",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "holder"}}})),
        )
        .await
        .unwrap();
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(t.client.clone(), &t.ns);
    create_budget(&budgets, "holder", "holder", 1).await;
    until_budget_allows(&budgets, "holder", 0).await;
    let held = crate::drain_check::run(
        "dra-claim-controller",
        &admin,
        &["drain", NODE, "--driver", DRIVER, "--timeout", "15s"],
    )
    .await;
    assert_ne!(held.code, 0, "{held:?}");
    assert!(
        held.stderr
            .contains(&format!("waiting for PodDisruptionBudget {}/holder", t.ns)),
        "the drain names the budget: {held:?}"
    );
    let running = t.pods().get("holder").await.unwrap();
    assert!(
        running.metadata.deletion_timestamp.is_none(),
        "evicted while the budget allowed nothing"
    );
    // The budget allows one: the drain goes through (the controller may
    // evict the pod the moment the budget allows it, even before this test
    // could read the budget's new status).
    set_min_available(&budgets, "holder", 0).await;

    // The drain: evicted, stopped, unprepared, released; Clean.
    let started = Instant::now();
    // The controller asks again on its own pace (up to a minute apart
    // after refusals, as the budget is not watched).
    let drained = crate::drain_check::run_within(
        "dra-claim-controller",
        &admin,
        &[
            "drain",
            NODE,
            "--driver",
            DRIVER,
            "--timeout",
            "100s",
            "-o",
            "json",
        ],
        Duration::from_secs(120),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(drained.code, 0, "{drained:?}");
    assert_eq!(drained.json()["verdict"], "Clean", "{drained:?}");
    assert!(
        t.pods().get_opt("holder").await.unwrap().is_none(),
        "the pod is gone"
    );
    until_claim_gone(&t, &claim).await;
    until_unprepared(&node).await;
    // Run again: nothing left to do, still Clean.
    let again = crate::drain_check::run(
        "dra-claim-controller",
        &admin,
        &["drain", NODE, "--driver", DRIVER, "--timeout", "20s"],
    )
    .await;
    assert_eq!(again.code, 0, "{again:?}");

    // Uncordoned, the devices serve a new pod.
    let uncordon =
        crate::drain_check::run("dra-claim-controller", &admin, &["uncordon", NODE]).await;
    assert_eq!(uncordon.code, 0, "{uncordon:?}");
    assert!(uncordon.stdout.contains("deleted"), "{uncordon:?}");
    let (_, back) = run_pod(&t, "after", "sleep 600", None).await;
    println!(
        "REAL NODE: {NAME}: drain to Clean in {:.1}s (pod evicted, stopped, claim unprepared and \
         deleted); after uncordon a new pod ran in {:.1}s",
        took.as_secs_f64(),
        back.as_secs_f64()
    );
    drop(node);
    t.finish();
}
