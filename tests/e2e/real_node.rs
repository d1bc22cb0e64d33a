//! On a real node: a kubelet with containerd and the upstream DRA test
//! driver (see `dra_e2e::real_node`). Pods really run, the driver really
//! prepares and unprepares their claims, and the controller works with
//! what a kubelet really writes (PodScheduled on every pod it syncs, the
//! phase, container statuses).
//!
//! Each test prints one SKIP line where a piece is missing (kubelet or
//! driver beside kube-apiserver, containerd, runc, busybox, root).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::{TIMEOUT, wait_for};
use crate::real_node::{self, BUSYBOX_IMAGE, DEVICE_CLASS, RealNode};
use crate::scheduler::Scheduler;

const NODE: &str = "real-node-1";
const LABEL: &str = "dra-e2e.example.com/declared";
const SELECTOR: &str = "dra-e2e.example.com/declared=true";
/// How long a pod may take to run on the node before a check fails (not a
/// speed target; the figures are printed).
const RUN_BOUND: Duration = Duration::from_secs(60);

/// `None` (after one SKIP line) where a real node cannot run here.
fn can_run(name: &str) -> bool {
    match real_node::missing_piece() {
        Some(why) => {
            println!("SKIP: {name}: {why}");
            false
        }
        None => true,
    }
}

/// A pod on the host network running `script` in busybox, with one claim
/// from template `tmpl`; `node`: pre-scheduled there.
fn pod(name: &str, script: &str, node: Option<&str>) -> Pod {
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": true,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "resources": {"claims": [{"name": "gpu"}]},
            }],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tmpl"}],
        },
    });
    if let Some(node) = node {
        p["spec"]["nodeName"] = json!(node);
    }
    serde_json::from_value(p).expect("pod manifest")
}

async fn create_template(t: &TestCtx) {
    t.create_template_with(
        "tmpl",
        json!({}),
        json!({}),
        json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}}),
    )
    .await;
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// Waits until pod `name` reaches `want` (Running, Succeeded); returns the
/// time since `since`.
async fn until_phase(t: &TestCtx, name: &str, want: &str, since: Instant) -> Duration {
    wait_for(&format!("pod {name} to be {want}"), RUN_BOUND, async || {
        let pod = t.pods().get(name).await?;
        let now = phase(&pod);
        if now == "Failed" && want != "Failed" {
            bail!("pod failed: {:?}", pod.status);
        }
        ensure!(now == want, "phase {now:?}");
        Ok(())
    })
    .await;
    since.elapsed()
}

fn claim_of(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .as_ref()?
        .iter()
        .find_map(|s| s.resource_claim_name.clone())
}

async fn until_claim_gone(t: &TestCtx, claim: &str) -> Duration {
    let started = Instant::now();
    wait_for(
        &format!("claim {claim} to be gone"),
        RUN_BOUND,
        async || {
            ensure!(t.claims().get_opt(claim).await?.is_none(), "still there");
            Ok(())
        },
    )
    .await;
    started.elapsed()
}

/// An isolated cluster with one controller, a real node, kube-scheduler
/// and template `tmpl`; `None` (after one SKIP line) where a piece is
/// missing.
async fn scheduled_bed(name: &'static str) -> Option<(TestCtx, RealNode, Scheduler)> {
    if !can_run(name) {
        return None;
    }
    let scheduler_bin = crate::scheduler::binary_or_skip(name)?;
    let mut t = TestCtx::isolated(name, ControllerOpts::default(), 1).await?;
    let cluster = &t.isolated_env().cluster;
    let node = RealNode::start(cluster, NODE).await.expect("real node");
    let scheduler = Scheduler::start(&scheduler_bin, cluster)
        .await
        .expect("kube-scheduler");
    create_template(&t).await;
    Some((t, node, scheduler))
}

/// A pod with a template claim is scheduled by kube-scheduler, its claim
/// prepared by the driver, it runs and finishes; the driver unprepares and
/// the controller deletes the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_a_claim_runs_on_a_real_node() {
    const NAME: &str = "a_pod_with_a_claim_runs_on_a_real_node";
    let Some((t, node, _scheduler)) = scheduled_bed(NAME).await else {
        return;
    };

    let created = Instant::now();
    t.pods()
        .create(&PostParams::default(), &pod("runner", "sleep 3", None))
        .await
        .expect("create pod");
    let running = until_phase(&t, "runner", "Running", created).await;
    let pod = t.pods().get("runner").await.unwrap();
    let claim = claim_of(&pod).expect("claim recorded");
    ensure_prepared(&node, &claim);
    let succeeded = until_phase(&t, "runner", "Succeeded", created).await;
    let gone = until_claim_gone(&t, &claim).await;
    wait_for("the driver to unprepare the claim", TIMEOUT, async || {
        ensure!(
            !node.driver_log_lines("NodeUnprepareResource").is_empty(),
            "no unprepare in the driver log"
        );
        Ok(())
    })
    .await;
    println!(
        "REAL NODE: {NAME}: Running {:.2}s after creation, Succeeded after {:.2}s, claim gone \
         {:.2}s after that",
        running.as_secs_f64(),
        succeeded.as_secs_f64(),
        gone.as_secs_f64()
    );
    drop(node);
    t.finish();
}

fn ensure_prepared(node: &RealNode, claim: &str) {
    let prepared = node.driver_log_lines("NodePrepareResource");
    assert!(
        !prepared.is_empty(),
        "the driver logged no prepare for claim {claim}"
    );
}

async fn declare(t: &TestCtx) {
    Api::<Node>::all(t.client.clone())
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {LABEL: "true"}}})),
        )
        .await
        .expect("label the node");
}

/// Pre-scheduled pods (created with `spec.nodeName`) with
/// `--allocate-on-nodes`: one created while the controller runs, one
/// created while it is down (the kubelet has written PodScheduled=True
/// into it by the time the controller sees it). Both run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_scheduled_pods_run_on_a_real_node() {
    const NAME: &str = "pre_scheduled_pods_run_on_a_real_node";
    if !can_run(NAME) {
        return;
    }
    let opts = ControllerOpts {
        extra_args: vec![format!("--allocate-on-nodes={SELECTOR}")],
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated(NAME, opts, 0).await else {
        return;
    };
    let applied =
        crate::rbac::reapply_controller_rbac(&t.client, &[("allocation.nodeSelector", SELECTOR)])
            .await
            .expect("apply the chart's RBAC with allocation on");
    if !applied {
        println!("SKIP: {NAME}: Helm is not available to render the chart's RBAC");
        return;
    }
    let cluster = &t.isolated_env().cluster;
    let node = RealNode::start(cluster, NODE).await.expect("real node");
    declare(&t).await;
    create_template(&t).await;
    let controller = t
        .isolated_env()
        .start_controller()
        .await
        .expect("start the controller");

    // Created while the controller runs.
    let created = Instant::now();
    t.pods()
        .create(&PostParams::default(), &pod("live", "sleep 30", Some(NODE)))
        .await
        .expect("create pod");
    let live = until_phase(&t, "live", "Running", created).await;

    // Created while the controller is down: by the time it is back, the
    // kubelet has written PodScheduled=True into the pod.
    controller.kill();
    let down = Instant::now();
    t.pods()
        .create(
            &PostParams::default(),
            &pod("while-down", "sleep 30", Some(NODE)),
        )
        .await
        .expect("create pod");
    wait_for(
        "the kubelet to mark the pod scheduled",
        TIMEOUT,
        async || {
            let pod = t.pods().get("while-down").await?;
            let scheduled = pod
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "PodScheduled" && c.status == "True");
            ensure!(scheduled, "not yet");
            Ok(())
        },
    )
    .await;
    t.isolated_env()
        .start_controller()
        .await
        .expect("start the controller again");
    let restarted = Instant::now();
    let while_down = until_phase(&t, "while-down", "Running", restarted).await;
    println!(
        "REAL NODE: {NAME}: pre-scheduled pod Running {:.2}s after creation; one created while \
         the controller was down ({:.1}s before it came back) Running {:.2}s after it did",
        live.as_secs_f64(),
        restarted.duration_since(down).as_secs_f64(),
        while_down.as_secs_f64()
    );
    for name in ["live", "while-down"] {
        let pod: Value = serde_json::to_value(t.pods().get(name).await.unwrap()).unwrap();
        assert_eq!(pod["spec"]["nodeName"], json!(NODE), "{name}");
    }
    drop(node);
    t.finish();
}

/// The DRA admin guide's drain order, on a real kubelet. With a pod
/// holding a prepared claim, `drain-check` says the driver must stay. Done
/// the wrong way round (driver stopped, then the pod deleted), the kubelet
/// cannot unprepare: the pod stays Terminating and its claim allocated and
/// reserved, and `drain-check` keeps saying so. With the driver back, the
/// kubelet finishes, the controller cleans up, nothing leaks and
/// `drain-check` says Clean. Every verdict is checked against what the
/// kubelet really did at that moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_order_on_a_real_node() {
    const NAME: &str = "drain_order_on_a_real_node";
    let Some((mut t, mut node, _scheduler)) = scheduled_bed(NAME).await else {
        return;
    };
    let inspector = t
        .isolated_env()
        .cluster
        .service_account_kubeconfig("drain-checker", Some(crate::rbac::INSPECTOR_ROLE))
        .await
        .expect("inspector identity");
    let check = async || {
        crate::drain_check::run(
            "dra-claim-controller",
            &inspector,
            &["drain-check", "--node", NODE, "-o", "json"],
        )
        .await
    };

    let created = Instant::now();
    t.pods()
        .create(&PostParams::default(), &pod("holder", "sleep 600", None))
        .await
        .expect("create pod");
    until_phase(&t, "holder", "Running", created).await;
    let claim = claim_of(&t.pods().get("holder").await.unwrap()).expect("claim recorded");
    let r = check().await;
    assert_eq!(r.code, 1, "a prepared claim in use blocks the drain: {r:?}");
    let blocking = r.entries("blocking");
    assert!(
        blocking.iter().any(|(_, c)| *c == claim),
        "the claim is named: {blocking:?}"
    );

    // The wrong order: the driver goes first.
    node.stop_driver();
    let deleted = Instant::now();
    t.pods()
        .delete("holder", &Default::default())
        .await
        .expect("delete pod");
    // What the kubelet does: it stops the container, but cannot unprepare
    // without the driver, so it never confirms the deletion.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pod = t.pods().get_opt("holder").await.unwrap();
    let stuck = pod
        .as_ref()
        .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
    let c = t.claims().get_opt(&claim).await.unwrap();
    let reserved = c
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|r| !r.is_empty());
    let allocated = c
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .is_some_and(|s| s.allocation.is_some());
    let r = check().await;
    println!(
        "REAL NODE: {NAME}: driver stopped, pod deleted: after 10 s the pod is {} and its claim \
         {}, drain-check exit {} ({} blocking)",
        if stuck { "Terminating" } else { "gone" },
        match (c.is_some(), allocated, reserved) {
            (false, _, _) => "gone",
            (true, true, true) => "allocated and reserved",
            (true, true, false) => "allocated, not reserved",
            (true, false, _) => "not allocated",
        },
        r.code,
        r.entries("blocking").len()
    );
    assert!(
        stuck,
        "the kubelet confirmed the deletion without the driver"
    );
    assert!(
        allocated && reserved,
        "the claim was released without an unprepare"
    );
    assert_eq!(
        r.code, 1,
        "drain-check must say the node is not clean: {r:?}"
    );

    // The driver comes back: the kubelet unprepares, the pod goes, the
    // controller releases and deletes the claim.
    node.start_driver().expect("start the driver again");
    let back = Instant::now();
    wait_for("the pod to be gone", RUN_BOUND, async || {
        ensure!(t.pods().get_opt("holder").await?.is_none(), "still there");
        Ok(())
    })
    .await;
    let pod_gone = back.elapsed();
    until_claim_gone(&t, &claim).await;
    let claim_gone = back.elapsed();
    let r = check().await;
    assert_eq!(r.code, 0, "clean once cleanup finished: {r:?}");
    assert_eq!(r.json()["verdict"], "Clean");
    println!(
        "REAL NODE: {NAME}: driver back: pod gone after {:.1}s, claim gone after {:.1}s, \
         drain-check Clean ({:.1}s after the deletion was asked for)",
        pod_gone.as_secs_f64(),
        claim_gone.as_secs_f64(),
        deleted.elapsed().as_secs_f64()
    );
    drop(node);
    t.finish();
}
