//! Headroom's other front doors with a real cluster-autoscaler (kwok
//! provider, its CapacityBuffer controller and virtual-pod injection on):
//! a CapacityBuffer of the autoscaler's own strategy whose pod template
//! claims a device adds no node (its virtual pods carry no allocatable
//! claims: the upstream gap); the same buffer with our strategy adds a node,
//! its placeholders bind there with devices allocated, and a pod of higher
//! priority binds through their yield; a NodeScalingWatermark of the seed
//! operator's API drives a scale-up the same way.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

use crate::autoscaler::{CAPACITY_BUFFER_FLAGS, NODE_GROUP_LABEL};
use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::headroom::{bound_to, gpu_job, gpu_job_template, one_device_template, priority_classes};
use crate::headroom_autoscaler::{
    ControlPlane, DRIVER, SCALE_UP, binaries_or_skip, control_plane_with, nodes_with_devices,
};
use crate::headroom_buffers::{
    OURS, buffer, buffers_api, device_pod_template, wait_buffer_placeholders_hold_devices,
};
use crate::k8s::wait_for;

/// The GPU group's node selector.
fn in_group() -> Value {
    json!({NODE_GROUP_LABEL: "gpu"})
}

/// The cluster these tests share: CRDs `crds` (applied before the control
/// plane starts, so that the autoscaler and the garbage collector know
/// them), the chart's RBAC for `values`, the control plane with further
/// autoscaler flags (its CapacityBuffer ones need the buffer CRD: it waits
/// for their watch), and the controller with `flags`. `None` after one
/// SKIP line when a binary (or Helm) is missing.
async fn cluster(
    name: &'static str,
    flags: &[&str],
    values: &[(&str, &str)],
    crds: &[String],
    autoscaler_flags: &[&str],
) -> Option<(TestCtx, ControlPlane, kube::Client)> {
    let bins = binaries_or_skip(name)?;
    let mut extra_args = vec!["--controllers=resourceclaim,headroom".to_string()];
    extra_args.extend(flags.iter().map(|f| f.to_string()));
    let opts = ControllerOpts {
        extra_args,
        ..ControllerOpts::default()
    };
    let mut t = TestCtx::isolated(name, opts, 0).await?;
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    crate::headroom::install_crd(&admin).await;
    for crd in crds {
        crate::helm::apply_rendered(&admin, crd).await.unwrap();
    }
    priority_classes(&admin).await;
    crate::nodes::create_device_class(&admin, DRIVER)
        .await
        .unwrap();
    let mut all_values = vec![("headroom.enabled", "true")];
    all_values.extend_from_slice(values);
    if !crate::rbac::reapply_controller_rbac_or_skip(&t.client, name, &all_values).await {
        return None;
    }
    let plane = control_plane_with(&mut t, &bins, autoscaler_flags).await;
    t.isolated_env().start_controller().await.unwrap();
    Some((t, plane, admin))
}

fn buffer_crd() -> String {
    serde_yaml::to_string(&crate::headroom_buffers::crd()).unwrap()
}

/// The autoscaler's own strategy, a pod template that claims one device,
/// 6 replicas against a node of 4 devices: the autoscaler handles the
/// buffer (its status says so) and still adds no node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_capacity_buffer_with_a_device_claim_adds_no_node() {
    const NAME: &str = "active_capacity_buffer_with_a_device_claim_adds_no_node";
    let Some((t, plane, admin)) =
        cluster(NAME, &[], &[], &[buffer_crd()], &CAPACITY_BUFFER_FLAGS).await
    else {
        return;
    };
    one_device_template(&t, "one-gpu", DRIVER).await;
    device_pod_template(&t, "trainer", in_group()).await;
    let buffers = buffers_api(&t);
    buffers
        .create(
            &PostParams::default(),
            &buffer(
                "theirs",
                "buffer.x-k8s.io/active-capacity",
                json!({"podTemplateRef": {"name": "trainer"}, "replicas": 6}),
            ),
        )
        .await
        .unwrap();
    let status = wait_for(
        "the autoscaler's status on its buffer",
        SCALE_UP,
        async || {
            let b = buffers.get("theirs").await?;
            let conditions = b.data["status"]["conditions"]
                .as_array()
                .cloned()
                .context("no conditions yet")?;
            ensure!(!conditions.is_empty(), "no conditions yet");
            Ok(b.data["status"].clone())
        },
    )
    .await;
    // Twenty scan intervals: time enough to have added a node.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let nodes = nodes_with_devices(&admin).await.unwrap();
    println!(
        "E2E figure: {NAME}: the autoscaler's own strategy with a device claim: status {status}, nodes after 20 s {nodes:?}; log: {}",
        plane.autoscaler.grep("capacitybuffer", 3)
    );
    assert_eq!(
        nodes,
        vec!["gpu-0".to_string()],
        "no node for the autoscaler's virtual pods"
    );
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no real pod for the autoscaler's strategy"
    );
    t.finish();
}

/// Our strategy on the same shape, 8 replicas against a node of 4
/// devices: placeholders bind on it, the autoscaler adds a node for the
/// others, which bind there with devices allocated; then a priority-1000
/// pod binds at once through a placeholder's yield and the displaced
/// placeholder gets a third node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_buffer_strategy_adds_a_node_and_yields_to_a_real_pod() {
    const NAME: &str = "our_buffer_strategy_adds_a_node_and_yields_to_a_real_pod";
    let Some((t, plane, admin)) = cluster(
        NAME,
        &["--headroom-capacity-buffers=true"],
        &[("headroom.capacityBuffers.enabled", "true")],
        &[buffer_crd()],
        &CAPACITY_BUFFER_FLAGS,
    )
    .await
    else {
        return;
    };
    one_device_template(&t, "one-gpu", DRIVER).await;
    device_pod_template(&t, "trainer", in_group()).await;
    let started = Instant::now();
    buffers_api(&t)
        .create(
            &PostParams::default(),
            &buffer(
                "ours",
                OURS,
                json!({"podTemplateRef": {"name": "trainer"}, "replicas": 8}),
            ),
        )
        .await
        .unwrap();
    let second = wait_for("a second GPU node with devices", SCALE_UP, async || {
        let nodes = nodes_with_devices(&admin).await?;
        ensure!(nodes.len() >= 2, "nodes {nodes:?}");
        Ok(nodes)
    })
    .await;
    let to_node = started.elapsed();
    let placeholders = wait_buffer_placeholders_hold_devices(&t, "ours", 8, SCALE_UP).await;
    let to_bound = started.elapsed();
    let on_nodes: std::collections::BTreeSet<String> = placeholders
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(
        on_nodes.len(),
        2,
        "the placeholders fill two nodes: {on_nodes:?}"
    );

    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    gpu_job_template(&t, DRIVER).await;
    let job_started = Instant::now();
    gpu_job(&pods, "job").await;
    wait_for("the real pod bound through a yield", SCALE_UP, async || {
        bound_to(&pods, "job").await?.context("not bound yet")
    })
    .await;
    let job_bound = job_started.elapsed();
    let third = wait_for(
        "a third node for the displaced placeholder",
        SCALE_UP,
        async || {
            let nodes = nodes_with_devices(&admin).await?;
            ensure!(nodes.len() >= 3, "nodes {nodes:?}");
            Ok(nodes)
        },
    )
    .await;
    wait_buffer_placeholders_hold_devices(&t, "ours", 8, SCALE_UP).await;
    let plan = plane.autoscaler.grep("Final scale-up plan", 3);
    println!(
        "E2E figure: {NAME}: buffer of 8 one-device placeholders on a 4-device node: second node {:.1} s after the buffer was created, all placeholders bound with devices {:.1} s; a priority-1000 pod bound {:.2} s after creation through the yield, a third node followed; nodes {second:?} then {third:?}",
        to_node.as_secs_f64(),
        to_bound.as_secs_f64(),
        job_bound.as_secs_f64(),
    );
    assert!(!plan.is_empty(), "the autoscaler planned the scale-ups");
    assert!(
        crate::headroom::devices_in_two_claims(&t).await.is_empty(),
        "no device in two claims"
    );
    t.finish();
}

/// The seed operator's NodeScalingWatermark (`redhatcop.redhat.io`): a
/// workload of 48 CPU on a 64-CPU node and a 50 % watermark in 8-CPU
/// placeholders make 3 placeholders; 2 fit, the third makes the
/// autoscaler add a node, where it binds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_watermark_drives_a_scale_up() {
    const NAME: &str = "a_seed_watermark_drives_a_scale_up";
    let seed_crd = std::fs::read_to_string(
        crate::helm::chart_dir().join("files/seed-nodescalingwatermarks.yaml"),
    )
    .unwrap();
    let Some((t, plane, admin)) = cluster(
        NAME,
        &["--headroom-seed-watermarks=true"],
        &[("headroom.seedOperator.enabled", "true")],
        &[seed_crd],
        &[],
    )
    .await
    else {
        return;
    };
    // The seed's default class, which its installation created and a
    // migration keeps (docs/headroom.md): above the autoscaler's
    // expendable cutoff.
    crate::headroom::priority_class(
        &admin,
        dra_claim_controller::controllers::headroom::seed::DEFAULT_PRIORITY_CLASS,
        -1,
        true,
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    let web: Pod = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {
        "nodeSelector": in_group(),
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "48"}}}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &web).await.unwrap();
    wait_for("the workload bound", SCALE_UP, async || {
        bound_to(&pods, "web").await?.context("not bound")
    })
    .await;
    let seeds: Api<DynamicObject> = Api::namespaced_with(
        t.client.clone(),
        &t.ns,
        &crate::headroom_buffers::resource(
            "redhatcop.redhat.io",
            "v1alpha1",
            "NodeScalingWatermark",
            "nodescalingwatermarks",
        ),
    );
    let started = Instant::now();
    seeds
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "redhatcop.redhat.io/v1alpha1", "kind": "NodeScalingWatermark",
                "metadata": {"name": "gpu-group"},
                "spec": {"watermarkPercentage": 50, "nodeSelector": in_group(),
                         "pausePodSize": {"cpu": "8"}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let label = dra_claim_controller::naming::SEED_PLACEHOLDER_LABEL;
    let second = wait_for("a second node", SCALE_UP, async || {
        let nodes = nodes_with_devices(&admin).await?;
        let placeholders = pods.list(&ListParams::default().labels(label)).await?;
        let bound = placeholders
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count();
        let status = seeds.get("gpu-group").await?.data["status"].clone();
        ensure!(
            nodes.len() >= 2,
            "nodes {nodes:?}; {} seed placeholders, {bound} bound; watermark status {status}; autoscaler: {}",
            placeholders.items.len(),
            plane.autoscaler.grep("nschedulable", 6)
        );
        Ok(nodes)
    })
    .await;
    let to_node = started.elapsed();
    let nodes_of_placeholders = wait_for("3 seed placeholders bound", SCALE_UP, async || {
        let placeholders = pods.list(&ListParams::default().labels(label)).await?;
        let nodes: Vec<String> = placeholders
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect();
        ensure!(
            placeholders.items.len() == 3 && nodes.len() == 3,
            "{} placeholders, {} bound",
            placeholders.items.len(),
            nodes.len()
        );
        Ok(nodes)
    })
    .await;
    let to_bound = started.elapsed();
    println!(
        "E2E figure: {NAME}: a seed watermark's third placeholder got a new node {:.1} s after the watermark was created, all 3 bound {:.1} s; nodes {second:?}, placeholders on {nodes_of_placeholders:?}",
        to_node.as_secs_f64(),
        to_bound.as_secs_f64()
    );
    assert!(
        nodes_of_placeholders.iter().any(|n| n != "gpu-0"),
        "a placeholder bound on the new node"
    );
    t.finish();
}
