//! `drain` on a real node: a pod using the test driver's device runs; the
//! node's devices are drained with DeviceTaintRules (preview, then
//! `NoExecute`, evicting through the Eviction API, `drain`'s default); the
//! eviction controller evicts the running pod, the kubelet stops
//! it, the driver unprepares the claim, the claim goes, and the command
//! ends with drain-check's Clean. `uncordon` gives the devices back: a new
//! pod runs on them.

use std::time::Instant;

use crate::ctx::TestCtx;
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
    create_template(&t).await;

    run_pod(&t, "holder", "sleep 600", None).await;
    let claim = claim_of(&t.pods().get("holder").await.unwrap()).expect("claim recorded");

    // The preview evicts nobody.
    let preview = crate::drain_check::run(
        "dra-claim-controller",
        &admin,
        &["drain", NODE, "--driver", DRIVER, "--preview"],
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

    // The drain: evicted, stopped, unprepared, released; Clean.
    let started = Instant::now();
    let drained = crate::drain_check::run(
        "dra-claim-controller",
        &admin,
        &[
            "drain",
            NODE,
            "--driver",
            DRIVER,
            "--timeout",
            "50s",
            "-o",
            "json",
        ],
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
