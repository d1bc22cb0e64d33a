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

pub const NODE: &str = "real-node-1";
const LABEL: &str = "dra-e2e.example.com/declared";
const SELECTOR: &str = "dra-e2e.example.com/declared=true";
/// How long a pod may take to run on the node before a check fails (not a
/// speed target; the figures are printed).
pub const RUN_BOUND: Duration = Duration::from_secs(60);

/// `None` (after one SKIP line) where a real node cannot run here.
pub fn can_run(name: &str) -> bool {
    if crate::cluster::binaries().is_none() {
        crate::cluster::skip_without_apiserver(name);
        return false;
    }
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

/// The template `tmpl`: one device of the test driver.
pub async fn create_template(t: &TestCtx) {
    crate::headroom::one_device_template(t, "tmpl", DEVICE_CLASS).await;
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// Waits until pod `name` reaches `want` (Running, Succeeded); returns the
/// time since `since`.
pub async fn until_phase(t: &TestCtx, name: &str, want: &str, since: Instant) -> Duration {
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

/// Creates [`pod`] `name` and waits until it runs; returns when it was
/// created and how long it took to run.
pub async fn run_pod(
    t: &TestCtx,
    name: &str,
    script: &str,
    node: Option<&str>,
) -> (Instant, Duration) {
    let created = Instant::now();
    t.pods()
        .create(&PostParams::default(), &pod(name, script, node))
        .await
        .expect("create pod");
    (created, until_phase(t, name, "Running", created).await)
}

pub fn claim_of(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .as_ref()?
        .iter()
        .find_map(|s| s.resource_claim_name.clone())
}

pub async fn until_claim_gone(t: &TestCtx, claim: &str) -> Duration {
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

/// kube-scheduler and kube-controller-manager for a real-node test, or
/// `None` after one SKIP line naming what is missing.
fn control_plane_binaries(name: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    if !can_run(name) {
        return None;
    }
    let scheduler = crate::scheduler::binary_or_skip(name)?;
    let kcm = crate::reference::binary_or_skip(name)?;
    Some((scheduler, kcm))
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

    let (created, running) = run_pod(&t, "runner", "sleep 3", None).await;
    let pod = t.pods().get("runner").await.unwrap();
    let claim = claim_of(&pod).expect("claim recorded");
    ensure_prepared(&node, &claim);
    let succeeded = until_phase(&t, "runner", "Succeeded", created).await;
    let gone = until_claim_gone(&t, &claim).await;
    until_unprepared(&node).await;
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

/// Waits until the driver logged an unprepare.
pub async fn until_unprepared(node: &RealNode) {
    wait_for("the driver to unprepare the claim", TIMEOUT, async || {
        ensure!(
            !node.driver_log_lines("NodeUnprepareResource").is_empty(),
            "no unprepare in the driver log"
        );
        Ok(())
    })
    .await;
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
    if !crate::rbac::reapply_controller_rbac_or_skip(
        &t.client,
        NAME,
        &[("allocation.nodeSelector", SELECTOR)],
    )
    .await
    {
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
    let (_, live) = run_pod(&t, "live", "sleep 30", Some(NODE)).await;

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

    run_pod(&t, "holder", "sleep 600", None).await;
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

/// The chart as an admin installs it, on the real node: the controller's
/// image made here without Docker (`dra_e2e::image`), rendered with values
/// a user sets (pod network without kube-proxy: `extraEnv` naming the API
/// server), applied, two replicas. Both become Ready, one holds the Lease,
/// claims are made by it (its service account: no other controller runs),
/// `/metrics` over HTTPS answers 401 without a token and 200 with one bound
/// to the chart's metrics-reader role, and deleting the leader's pod hands
/// over within 20 s with no claim made twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_on_a_real_node() {
    const NAME: &str = "the_chart_runs_on_a_real_node";
    const IMAGE: &str = "dra-claim-controller.local/dra-claim-controller";
    let Some((scheduler_bin, kcm_bin)) = control_plane_binaries(NAME) else {
        return;
    };
    let apiserver = crate::cluster::ApiserverOptions {
        serve_pods: true,
        ..Default::default()
    };
    let Some(mut t) = TestCtx::isolated_with(NAME, ControllerOpts::default(), 0, &apiserver).await
    else {
        return;
    };
    let cluster = &t.isolated_env().cluster;
    let port = cluster
        .url()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let node = RealNode::start(cluster, NODE).await.expect("real node");
    let _scheduler = Scheduler::start(&scheduler_bin, cluster)
        .await
        .expect("kube-scheduler");
    // What a cluster's kube-controller-manager does for a Deployment with
    // a service account (not the claim controller: that is the chart's).
    let _kcm = crate::reference::Reference::start_controllers_with(
        &kcm_bin,
        cluster,
        &[
            "serviceaccount-controller",
            "root-ca-certificate-publisher-controller",
            "service-ca-certificate-publisher-controller",
            "deployment-controller",
            "replicaset-controller",
            "garbage-collector-controller",
        ],
        &[format!("--root-ca-file={}", cluster.ca_file().display())],
    )
    .await
    .expect("kube-controller-manager");

    let version = env!("CARGO_PKG_VERSION");
    let binary = crate::cluster::controller_binary().expect("controller binary");
    let archive = dra_e2e::image::write_controller_archive(
        &binary,
        &node.dir.join("controller-image"),
        &format!("{IMAGE}:{version}"),
    )
    .expect("controller image");
    real_node::import_archive(&node, &archive).expect("import the controller image");

    let values = format!(
        "replicas: 2\n\
         image:\n  repository: {IMAGE}\n  tag: \"{version}\"\n  pullPolicy: Never\n\
         extraEnv:\n\
         \x20 - name: KUBERNETES_SERVICE_HOST\n    value: \"{gateway}\"\n\
         \x20 - name: KUBERNETES_SERVICE_PORT\n    value: \"{port}\"\n",
        gateway = real_node::POD_GATEWAY_IP,
    );
    let rendered = match crate::helm::render_chart_with_values(
        crate::rbac::RELEASE,
        crate::rbac::SYSTEM_NAMESPACE,
        &values,
        &[],
    ) {
        Ok(Some(yaml)) => yaml,
        Ok(None) => {
            println!("SKIP: {NAME}: Helm is not available to render the chart");
            return;
        }
        Err(e) => panic!("render the chart: {e}"),
    };
    let applied = crate::helm::apply_rendered(&t.client, &rendered)
        .await
        .expect("apply the rendered chart");

    let controller_pods: Api<Pod> =
        Api::namespaced(t.client.clone(), crate::rbac::SYSTEM_NAMESPACE);
    let selector = "app.kubernetes.io/name=dra-claim-controller";
    let installed = Instant::now();
    let ready_pods = async || -> anyhow::Result<Vec<Pod>> {
        let list = controller_pods
            .list(&kube::api::ListParams::default().labels(selector))
            .await?;
        Ok(list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .collect())
    };
    let pods = wait_for(
        "both replicas Ready",
        Duration::from_secs(120),
        async || {
            let ready = ready_pods().await?;
            ensure!(ready.len() == 2, "{} Ready", ready.len());
            Ok(ready)
        },
    )
    .await;
    let both_ready = installed.elapsed();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(t.client.clone(), crate::rbac::SYSTEM_NAMESPACE);
    let holder = async || -> anyhow::Result<String> {
        Ok(leases
            .get(crate::rbac::LEASE_NAME)
            .await?
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default())
    };
    let names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let leader = wait_for("one replica to hold the Lease", TIMEOUT, async || {
        let h = holder().await?;
        names
            .iter()
            .find(|n| h.starts_with(n.as_str()))
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("holder {h:?} is none of {names:?}"))
    })
    .await;

    // Claims are made by the chart's controller (nothing else runs one).
    create_template(&t).await;
    let (_, first_running) = run_pod(&t, "first", "sleep 2", None).await;

    // The secure metrics port of the leader, from its pod address.
    let leader_pod = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(leader.as_str()))
        .unwrap();
    let ip = leader_pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    let metrics: std::net::SocketAddr = format!("{ip}:8080").parse().unwrap();
    let (code, _) = crate::hostile::scrape_https(metrics, None).await.unwrap();
    assert_eq!(code, 401, "no token");
    let reader = crate::rbac::service_account_with_role(
        &t.client,
        "scraper",
        Some(crate::rbac::METRICS_READER_ROLE),
    )
    .await
    .unwrap();
    let (code, body) = crate::hostile::scrape_https(metrics, Some(&reader))
        .await
        .unwrap();
    assert_eq!(code, 200, "a metrics-reader token: {body}");
    assert!(body.contains("workqueue_depth"), "{body}");

    // Hand-over: the leader's pod is deleted as a rollout or a drain does.
    let deleting = Instant::now();
    controller_pods
        .delete(&leader, &Default::default())
        .await
        .expect("delete the leader's pod");
    let new_leader = wait_for(
        "another replica to take the Lease",
        Duration::from_secs(60),
        async || {
            let h = holder().await?;
            ensure!(
                !h.is_empty() && !h.starts_with(leader.as_str()),
                "held by {h:?}"
            );
            Ok(h)
        },
    )
    .await;
    let handed_over = deleting.elapsed();
    let (_, second_running) = run_pod(&t, "second", "sleep 2", None).await;
    let claims = t.all_claims().await.unwrap();
    for name in ["first", "second"] {
        let owned = claims
            .iter()
            .filter(|c| {
                c.metadata
                    .owner_references
                    .as_ref()
                    .is_some_and(|o| o.iter().any(|o| o.name == name))
            })
            .count();
        assert!(owned <= 1, "pod {name} has {owned} claims");
    }
    println!(
        "REAL NODE: {NAME}: {applied} objects applied, both replicas Ready after {:.1}s, leader \
         {leader}; a pod with a claim Running {:.2}s after creation; /metrics 401 without a \
         token, 200 with a metrics-reader token; leader pod deleted: Lease taken by {new_leader} \
         after {:.1}s; the next pod Running {:.2}s after creation",
        both_ready.as_secs_f64(),
        first_running.as_secs_f64(),
        handed_over.as_secs_f64(),
        second_running.as_secs_f64()
    );
    assert!(
        handed_over <= Duration::from_secs(20),
        "hand-over took {handed_over:?}"
    );
    drop(node);
    t.finish();
}

/// Headroom's yield on a real node: two device placeholders hold both
/// devices of the node (really running, their claims really prepared); a
/// higher-priority pod asking for a device is found unschedulable, a
/// placeholder yields (the kubelet kills it, the driver unprepares its
/// claim, the claim is released), and the pod runs. Its create -> Running
/// is recorded beside the same pod's on a node with a free device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headroom_yields_on_a_real_node() {
    use crate::headroom::{
        device_watermark, gpu_job, gpu_job_template, headroom_with_flags, priority_classes,
        scheduler_and_workload_controllers, wait_entry,
    };
    const NAME: &str = "headroom_yields_on_a_real_node";
    let Some((scheduler_bin, kcm_bin)) = control_plane_binaries(NAME) else {
        return;
    };
    let setup = async |admin: &kube::Client| priority_classes(admin).await;
    let spec = device_watermark(DEVICE_CLASS, 2);
    let Some((mut t, watermarks)) = headroom_with_flags(NAME, &[], setup, spec).await else {
        return;
    };
    let client = t.client.clone();
    let cluster = &t.isolated_env().cluster;
    let node = RealNode::start_with_devices(cluster, NODE, 2)
        .await
        .expect("real node");
    Api::<Node>::all(client)
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pool": "gpu"}}})),
        )
        .await
        .expect("label the node");
    let (_scheduler, _kcm) =
        scheduler_and_workload_controllers(cluster, &scheduler_bin, &kcm_bin).await;
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"devicesTotal": 2, "devicesHeld": 2, "readyPlaceholders": 2}),
    )
    .await;
    let unprepared_before = node.driver_log_lines("NodeUnprepareResources").len();

    gpu_job_template(&t, DEVICE_CLASS).await;
    let created = Instant::now();
    gpu_job(&t.pods(), "job").await;
    let through_yield = until_phase(&t, "job", "Running", created).await;
    // The yielded placeholder's claim is unprepared by its kubelet after
    // the placeholder's containers stopped; the log line may come a moment
    // after the job started (its claim is released once the pod is terminal).
    let unprepared = wait_for(
        "the yielded placeholder's claim to be unprepared",
        RUN_BOUND,
        async || {
            let n = node.driver_log_lines("NodeUnprepareResources").len() - unprepared_before;
            ensure!(n >= 1, "no unprepare yet");
            Ok(n)
        },
    )
    .await;

    // The same pod with a device free: the watermark goes (its placeholders
    // with it), the first job ends.
    watermarks
        .delete("pool", &Default::default())
        .await
        .expect("delete the watermark");
    t.pods()
        .delete("job", &Default::default())
        .await
        .expect("delete the job");
    wait_for("the node's devices to be free", RUN_BOUND, async || {
        let held = t
            .all_claims()
            .await?
            .iter()
            .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
            .count();
        ensure!(held == 0, "{held} claims allocated");
        Ok(())
    })
    .await;
    let created = Instant::now();
    gpu_job(&t.pods(), "job-free").await;
    let free = until_phase(&t, "job-free", "Running", created).await;
    println!(
        "REAL NODE: {NAME}: a pod that needs a placeholder's device Running {:.2}s after \
         creation ({unprepared} placeholder claim(s) unprepared by the driver); the same pod \
         with a free device {:.2}s",
        through_yield.as_secs_f64(),
        free.as_secs_f64()
    );
    drop(node);
    t.finish();
}
