//! Headroom with a real cluster-autoscaler (kwok cloud provider): the
//! placeholders a yield displaced make it add a GPU node before any real
//! pod waits, and placeholders below its expendable cutoff never do.
//! kube-scheduler, kube-controller-manager (Deployments, ReplicaSets,
//! garbage collector) and this controller run as in a cluster; the harness
//! plays the kubelet and DRA driver of every node of the group.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::autoscaler::{Autoscaler, NODE_GROUP_LABEL, NodeGroup};
use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::headroom::{
    bound_to, gpu_job, gpu_job_template, headroom_with_flags, patch_watermark, placeholder_pods,
    priority_class, priority_classes, scheduler_and_workload_controllers, wait_entry,
};
use crate::k8s::{holds_for, wait_for};

pub(crate) const DRIVER: &str = "gpu.example.com";
/// Long enough for the autoscaler to notice Pending pods, simulate a node
/// with devices and create it, and for the harness to make it Ready.
pub(crate) const SCALE_UP: Duration = Duration::from_secs(120);

fn gpu_group() -> NodeGroup<'static> {
    NodeGroup {
        name: "gpu",
        min: 1,
        max: 4,
        devices_per_node: 4,
        driver: DRIVER,
    }
}

/// A device watermark on the GPU group keeping `placeholders` placeholders
/// of one device, of the priority class `class`.
fn group_watermark(placeholders: u32, class: &str) -> Value {
    json!({"watermarkPercentage": 50, "nodeSelector": {NODE_GROUP_LABEL: "gpu"},
           "priorityClassName": class,
           "devices": [{"name": "gpu", "deviceClassName": DRIVER,
                        "minPlaceholders": placeholders, "maxPlaceholders": placeholders}]})
}

/// The binaries these tests need, or one SKIP line.
pub(crate) struct Binaries {
    scheduler: std::path::PathBuf,
    kcm: std::path::PathBuf,
    autoscaler: std::path::PathBuf,
}

pub(crate) fn binaries_or_skip(name: &str) -> Option<Binaries> {
    Some(Binaries {
        scheduler: crate::scheduler::binary_or_skip(name)?,
        kcm: crate::reference::binary_or_skip(name)?,
        autoscaler: crate::autoscaler::binary_or_skip(name)?,
    })
}

/// The rest of the control plane, started after the CRD (the garbage
/// collector then knows watermarks) and with the group's first node.
pub(crate) struct ControlPlane {
    _scheduler: crate::scheduler::Scheduler,
    _kcm: crate::reference::Reference,
    pub(crate) autoscaler: Autoscaler,
}

async fn control_plane(t: &mut TestCtx, bins: &Binaries) -> ControlPlane {
    control_plane_with(t, bins, &[]).await
}

/// The control plane with further cluster-autoscaler flags.
pub(crate) async fn control_plane_with(
    t: &mut TestCtx,
    bins: &Binaries,
    autoscaler_flags: &[&str],
) -> ControlPlane {
    let cluster = &t.isolated_env().cluster;
    let admin = cluster.admin_client().await.unwrap();
    let (scheduler, kcm) =
        scheduler_and_workload_controllers(cluster, &bins.scheduler, &bins.kcm).await;
    let autoscaler = Autoscaler::start_with(
        &bins.autoscaler,
        cluster,
        &admin,
        gpu_group(),
        autoscaler_flags,
    )
    .await
    .expect("start cluster-autoscaler");
    ControlPlane {
        _scheduler: scheduler,
        _kcm: kcm,
        autoscaler,
    }
}

/// The names of the group's nodes that publish devices.
pub(crate) async fn nodes_with_devices(admin: &kube::Client) -> anyhow::Result<Vec<String>> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let slices: Api<ResourceSlice> = Api::all(admin.clone());
    let with_slices: Vec<String> = slices
        .list(&ListParams::default())
        .await?
        .into_iter()
        .filter_map(|s| s.spec.node_name)
        .collect();
    Ok(nodes
        .list(&ListParams::default().labels(&format!("{NODE_GROUP_LABEL}=gpu")))
        .await?
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| with_slices.contains(n))
        .collect())
}

/// Creates the pods `names` (one device each) and waits until all are
/// bound; returns how long the last one took.
async fn run_pods(pods: &Api<Pod>, names: &[String], within: Duration) -> Duration {
    let started = Instant::now();
    for name in names {
        gpu_job(pods, name).await;
    }
    wait_for("the pods to bind", within, async || {
        for name in names {
            ensure!(bound_to(pods, name).await?.is_some(), "{name} not bound");
        }
        Ok(())
    })
    .await;
    started.elapsed()
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// One GPU node of 4 devices holding 2 workload pods and 2 placeholders:
/// two more priority-1000 pods bind at once through a yield, the displaced
/// placeholders go Pending, cluster-autoscaler adds a node and they bind
/// there. The same burst on a full node without headroom waits for that
/// node itself. Both waits are printed: the feature's headline figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaler_scales_up_for_device_headroom() {
    const NAME: &str = "autoscaler_scales_up_for_device_headroom";
    let Some(bins) = binaries_or_skip(NAME) else {
        return;
    };
    let setup = async |admin: &kube::Client| {
        priority_classes(admin).await;
        crate::nodes::create_device_class(admin, DRIVER)
            .await
            .unwrap();
    };
    let Some((mut t, watermarks)) =
        headroom_with_flags(NAME, &[], setup, group_watermark(2, "dra-headroom")).await
    else {
        return;
    };
    let plane = control_plane(&mut t, &bins).await;
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    gpu_job_template(&t, DRIVER).await;
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    run_pods(&pods, &names("steady", 2), SCALE_UP).await;
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"devicesTotal": 4, "devicesInUse": 2, "devicesHeld": 2, "readyPlaceholders": 2}),
    )
    .await;
    let before = nodes_with_devices(&admin).await.unwrap();
    assert_eq!(
        before,
        vec!["gpu-0".to_string()],
        "nothing to scale for yet"
    );

    // The burst: the node is full (2 workload pods, 2 placeholders).
    let burst_started = Instant::now();
    let burst_wait = run_pods(&pods, &names("burst", 2), Duration::from_secs(30)).await;
    let second = wait_for("a second GPU node with devices", SCALE_UP, async || {
        let now = nodes_with_devices(&admin).await?;
        now.into_iter()
            .find(|n| n != "gpu-0")
            .context("only gpu-0 so far")
    })
    .await;
    let capacity_after = burst_started.elapsed();
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"devicesTotal": 8, "devicesInUse": 4, "readyPlaceholders": 2, "pendingPlaceholders": 0}),
    )
    .await;
    for p in placeholder_pods(&pods).await {
        assert_eq!(
            p.spec.and_then(|s| s.node_name).as_deref(),
            Some(second.as_str()),
            "the displaced placeholders moved to the new node"
        );
    }
    let plan = plane.autoscaler.grep("Final scale-up plan", 3);
    assert!(!plan.is_empty(), "the autoscaler planned the scale-up");

    // The same burst on a full node without headroom: the pods wait for
    // the autoscaler themselves.
    let unaided = burst_without_headroom(&bins).await;
    println!(
        "E2E figure: {NAME}: burst of 2 GPU pods bound in {} ms with headroom (a new node with free devices {:.1} s later), \
         {:.1} s without headroom (Pending until cluster-autoscaler added a node); ratio {:.0}x",
        burst_wait.as_millis(),
        capacity_after.as_secs_f64(),
        unaided.as_secs_f64(),
        unaided.as_secs_f64() / burst_wait.as_secs_f64().max(0.001),
    );
    assert!(
        burst_wait < unaided,
        "with headroom the burst waited {burst_wait:?}, without {unaided:?}"
    );
    t.finish();
}

/// A GPU node full of 4 workload pods and no watermark: 2 more pods wait
/// Pending until cluster-autoscaler adds a node; returns that wait.
async fn burst_without_headroom(bins: &Binaries) -> Duration {
    const NAME: &str = "autoscaler_scales_up_without_headroom";
    let mut t = TestCtx::isolated(NAME, ControllerOpts::default(), 1)
        .await
        .expect("API server binaries are present");
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    priority_classes(&admin).await;
    crate::nodes::create_device_class(&admin, DRIVER)
        .await
        .unwrap();
    let _plane = control_plane(&mut t, bins).await;
    gpu_job_template(&t, DRIVER).await;
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    run_pods(&pods, &names("steady", 4), SCALE_UP).await;
    let wait = run_pods(&pods, &names("burst", 2), SCALE_UP).await;
    assert_eq!(nodes_with_devices(&admin).await.unwrap().len(), 2);
    t.finish();
    wait
}

/// Placeholders of a class below cluster-autoscaler's expendable cutoff
/// (-10) never make it act: they stay Pending on a full node. Moved to the
/// chart's class (-1), the same placeholders get a node: why `dra-headroom`
/// is -1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expendable_placeholders_never_make_the_autoscaler_act() {
    const NAME: &str = "expendable_placeholders_never_make_the_autoscaler_act";
    let Some(bins) = binaries_or_skip(NAME) else {
        return;
    };
    let setup = async |admin: &kube::Client| {
        priority_classes(admin).await;
        priority_class(admin, "expendable", -20, true).await;
        crate::nodes::create_device_class(admin, DRIVER)
            .await
            .unwrap();
    };
    // No placeholder until the node is full.
    let Some((mut t, watermarks)) =
        headroom_with_flags(NAME, &[], setup, group_watermark(0, "expendable")).await
    else {
        return;
    };
    let _plane = control_plane(&mut t, &bins).await;
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    gpu_job_template(&t, DRIVER).await;
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    run_pods(&pods, &names("steady", 4), SCALE_UP).await;
    patch_watermark(
        &watermarks,
        json!({"spec": group_watermark(2, "expendable")}),
    )
    .await;
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"desiredPlaceholders": 2, "pendingPlaceholders": 2}),
    )
    .await;
    // Twenty scan intervals: time enough to have added a node.
    holds_for(
        "no node added for placeholders below the expendable cutoff",
        Duration::from_secs(20),
        async || {
            let nodes = nodes_with_devices(&admin).await?;
            ensure!(nodes == ["gpu-0"], "nodes with devices: {nodes:?}");
            Ok(())
        },
    )
    .await;

    patch_watermark(
        &watermarks,
        json!({"spec": {"priorityClassName": "dra-headroom"}}),
    )
    .await;
    wait_for("a node for the -1 placeholders", SCALE_UP, async || {
        let nodes = nodes_with_devices(&admin).await?;
        ensure!(nodes.len() == 2, "nodes {nodes:?}");
        Ok(())
    })
    .await;
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"readyPlaceholders": 2, "pendingPlaceholders": 0}),
    )
    .await;
    t.finish();
}
