//! The allocator for declared nodes (`--allocate-on-nodes`) against the
//! real API server: allocation, reservation and the pod's status for a pod
//! created with `spec.nodeName`; a failure told with counts, then success
//! once devices are released; a node outside the selector left alone; a
//! device taken by another allocator behind a lagging claim watch never
//! handed out twice; and, with a real kube-scheduler, the same allocation
//! shapes as the scheduler writes.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{bail, ensure};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::fault_proxy::FaultPlan;
use crate::faults_api::controller_behind_proxy;
use crate::k8s::*;
use crate::nodes;

const LABEL: &str = "dra-e2e.example.com/pre-scheduled";
pub const SELECTOR: &str = "dra-e2e.example.com/pre-scheduled=true";
pub const FAILED: &str = "FailedResourceClaimAllocation";
const DELETE_PROTECTION: &str = "resource.kubernetes.io/delete-protection";

fn opts() -> ControllerOpts {
    ControllerOpts {
        extra_args: vec![format!("--allocate-on-nodes={SELECTOR}")],
        ..ControllerOpts::default()
    }
}

/// An isolated cluster with the chart's RBAC for allocation applied (the
/// controller is started by the caller); `None`: skipped.
async fn cluster(name: &'static str) -> Option<TestCtx> {
    let t = TestCtx::isolated(name, opts(), 0).await?;
    crate::rbac::reapply_controller_rbac_or_skip(
        &t.client,
        name,
        &[("allocation.nodeSelector", SELECTOR)],
    )
    .await
    .then_some(t)
}

pub async fn declare(client: &kube::Client, node: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {LABEL: "true"}}})),
        )
        .await
        .unwrap();
}

pub fn count_spec(count: u32) -> Value {
    json!({"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": count}}]}})
}

/// `(pool, device)` of each result, or `None` while unallocated.
fn allocated(claim: &ResourceClaim) -> Option<Vec<(String, String)>> {
    let c = serde_json::to_value(claim).ok()?;
    let results = c["status"]["allocation"]["devices"]["results"].as_array()?;
    Some(
        results
            .iter()
            .map(|r| {
                (
                    r["pool"].as_str().unwrap_or_default().to_string(),
                    r["device"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect(),
    )
}

/// The pod's claim for entry `gpu`, once recorded and allocated.
pub async fn wait_allocated(t: &TestCtx, pod: &str, what: &str) -> (String, Vec<(String, String)>) {
    wait_for(what, Duration::from_secs(60), async || {
        let p = t.pod(pod).await;
        let Some(Some(name)) = recorded(&p).get("gpu").cloned() else {
            bail!("claim not recorded yet")
        };
        let Some(claim) = t.claim(&name).await else {
            bail!("claim {name} missing")
        };
        let Some(devices) = allocated(&claim) else {
            bail!("claim {name} not allocated")
        };
        ensure!(
            reserved_names(&claim) == vec![format!("pods/{pod}")],
            "claim {name} reserved for {:?}",
            reserved_names(&claim)
        );
        ensure!(
            claim
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == DELETE_PROTECTION),
            "no {DELETE_PROTECTION} finalizer"
        );
        Ok((name, devices))
    })
    .await
}

/// The message of the first allocation failure told on `pod`.
pub async fn failure_told(t: &TestCtx, pod: &str) -> String {
    wait_for(
        &format!("{pod} told why not"),
        Duration::from_secs(60),
        async || {
            let events = t.warning_events(pod, FAILED).await?;
            let Some(message) = events.first().and_then(|e| e.message.clone()) else {
                bail!("no {FAILED} event yet")
            };
            Ok(message)
        },
    )
    .await
}

async fn double_allocations(t: &TestCtx) -> f64 {
    let text = t.controller().metrics_text().await.expect("metrics");
    crate::rawhttp::metric_value(&text, "dra_claim_controller_device_double_allocations", &[])
        .expect("double allocation gauge exported")
}

/// Two of four devices for one pod; a second asking for three is told why
/// not (with counts), and gets them once the first is done and its claim
/// released; a node outside the selector keeps today's warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocator_on_declared_nodes() {
    const NAME: &str = "allocator_on_declared_nodes";
    let Some(mut t) = cluster(NAME).await else {
        return;
    };
    nodes::create_device_class(&t.client, DEVICE_CLASS)
        .await
        .unwrap();
    for node in ["alloc-1", "alloc-2"] {
        nodes::create_schedulable_node(&t.client, node)
            .await
            .unwrap();
        nodes::create_devices(&t.client, DEVICE_CLASS, node, 4)
            .await
            .unwrap();
    }
    declare(&t.client, "alloc-1").await;
    t.isolated_env()
        .start_controller()
        .await
        .expect("start controller");
    t.create_template_with("two", json!({}), json!({}), count_spec(2))
        .await;
    t.create_template_with("three", json!({}), json!({}), count_spec(3))
        .await;

    t.create_pod(
        "first",
        &[("gpu", Source::Template("two"))],
        Some("alloc-1"),
    )
    .await;
    let (first_claim, first_devices) =
        wait_allocated(&t, "first", "first pod's claim allocated, reserved").await;
    assert_eq!(first_devices.len(), 2);
    assert!(
        first_devices.iter().all(|(pool, _)| pool == "alloc-1"),
        "{first_devices:?}"
    );
    let c = serde_json::to_value(t.claim(&first_claim).await.unwrap()).unwrap();
    assert_eq!(
        c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"],
        json!(["alloc-1"])
    );

    t.create_pod(
        "second",
        &[("gpu", Source::Template("three"))],
        Some("alloc-1"),
    )
    .await;
    let told = failure_told(&t, "second").await;
    assert!(
        told.contains("4 devices on node alloc-1, 2 allocated to other claims, 2 free, 3 needed"),
        "{told}"
    );

    // The first pod finishes: its claim is released, the second gets three.
    t.set_pod_phase("first", "Succeeded").await;
    let (_, second_devices) = wait_allocated(
        &t,
        "second",
        "second pod's claim allocated after the release",
    )
    .await;
    assert_eq!(second_devices.len(), 3);

    // Outside the selector: untouched, and the user hears the old warning.
    t.create_pod(
        "elsewhere",
        &[("gpu", Source::Template("two"))],
        Some("alloc-2"),
    )
    .await;
    wait_for(
        "not-allocated warning on the undeclared node",
        Duration::from_secs(60),
        async || {
            ensure!(
                !t.warning_events("elsewhere", "ResourceClaimNotAllocated")
                    .await?
                    .is_empty(),
                "no warning yet"
            );
            Ok(())
        },
    )
    .await;
    let p = t.pod("elsewhere").await;
    let name = recorded(&p)
        .get("gpu")
        .cloned()
        .flatten()
        .expect("claim recorded");
    assert!(
        allocated(&t.claim(&name).await.unwrap()).is_none(),
        "allocated on an undeclared node"
    );

    // Declared later: the pod already there is picked up at once (not at
    // the next resync).
    declare(&t.client, "alloc-2").await;
    let (_, late) = wait_allocated(&t, "elsewhere", "allocated once its node is declared").await;
    assert!(late.iter().all(|(pool, _)| pool == "alloc-2"), "{late:?}");

    let text = t.controller().metrics_text().await.unwrap();
    let ok = crate::rawhttp::metric_value(
        &text,
        "dra_claim_controller_allocations_total",
        &["result=\"allocated\""],
    );
    assert!(ok.is_some_and(|n| n >= 3.0), "allocations counted: {ok:?}");
    assert_eq!(double_allocations(&t).await, 0.0);
    t.finish();
}

/// Another allocator (this test) gives three of four devices to a claim
/// while the controller's claim watch runs seconds late: the controller must
/// not see them as free. It reads every claim fresh before allocating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocator_never_reuses_a_device_behind_a_lagging_watch() {
    const NAME: &str = "allocator_never_reuses_a_device_behind_a_lagging_watch";
    let Some(mut t) = cluster(NAME).await else {
        return;
    };
    nodes::create_device_class(&t.client, DEVICE_CLASS)
        .await
        .unwrap();
    nodes::create_schedulable_node(&t.client, "lag-1")
        .await
        .unwrap();
    nodes::create_devices(&t.client, DEVICE_CLASS, "lag-1", 4)
        .await
        .unwrap();
    declare(&t.client, "lag-1").await;
    // Only the claim watch lags: the pod arrives on time, its claim's
    // neighbour late.
    let plan = FaultPlan {
        watch_lag: Duration::from_secs(5),
        watch_lag_only: vec!["/resourceclaims".into()],
        ..FaultPlan::default()
    };
    let _proxy = controller_behind_proxy(&mut t, plan).await;

    // The other allocator's claim: created and allocated by the test.
    let claims = t.claims();
    let mut other: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "other"}, "spec": count_spec(3)}))
    .unwrap();
    other = claims.create(&PostParams::default(), &other).await.unwrap();
    let taken: Vec<Value> = (0..3)
        .map(|i| json!({"request": "gpu", "driver": DEVICE_CLASS, "pool": "lag-1", "device": format!("dev-{i}")}))
        .collect();
    let mut status = serde_json::to_value(&other).unwrap();
    status["status"] = json!({"allocation": {"devices": {"results": taken}, "nodeSelector": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["lag-1"]}]}]}}});
    claims
        .replace_status(
            "other",
            &PostParams::default(),
            &serde_json::from_value(status).unwrap(),
        )
        .await
        .expect("the other allocator's write");
    // At once, well inside the watch lag.
    t.create_template_with("two", json!({}), json!({}), count_spec(2))
        .await;
    t.create_pod("mine", &[("gpu", Source::Template("two"))], Some("lag-1"))
        .await;
    let told = failure_told(&t, "mine").await;
    assert!(
        told.contains("3 allocated to other claims, 1 free, 2 needed"),
        "{told}"
    );

    // The other allocator lets go: now there is room.
    let mut released = serde_json::to_value(claims.get("other").await.unwrap()).unwrap();
    released["status"] = json!({});
    claims
        .replace_status(
            "other",
            &PostParams::default(),
            &serde_json::from_value(released).unwrap(),
        )
        .await
        .unwrap();
    let (_, devices) = wait_allocated(&t, "mine", "allocated once the other claim let go").await;
    assert_eq!(devices.len(), 2);
    assert_eq!(double_allocations(&t).await, 0.0);
    t.finish();
}

/// A template with what real claims use: a count, a prioritized list, a
/// matchAttribute constraint, a claim config; and a class config.
fn rich_spec() -> Value {
    json!({"devices": {
        "requests": [
            {"name": "pair", "exactly": {"deviceClassName": "rich", "allocationMode": "ExactCount", "count": 2}},
            {"name": "one", "firstAvailable": [
                {"name": "big", "deviceClassName": "rich", "allocationMode": "ExactCount", "count": 1,
                 "selectors": [{"cel": {"expression": "device.capacity['rich.e2e.example.com'].memory.compareTo(quantity('80Gi')) >= 0"}}]},
                {"name": "any", "deviceClassName": "rich", "allocationMode": "ExactCount", "count": 1},
            ]},
        ],
        "constraints": [{"requests": ["pair"], "matchAttribute": "rich.e2e.example.com/numa"}],
        "config": [{"requests": ["pair"], "opaque": {"driver": "rich.e2e.example.com", "parameters": {"sharing": "none"}}}],
    }})
}

async fn create_rich_devices(client: &kube::Client, node: &str) {
    let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(client.clone());
    let devices: Vec<Value> = (0..4)
        .map(|i| {
            json!({"name": format!("gpu-{i}"),
            "attributes": {"numa": {"int": i / 2}, "model": {"string": "e2e"}},
            "capacity": {"memory": {"value": "40Gi"}}})
        })
        .collect();
    slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": format!("rich-{node}")}, "spec": {
                "driver": "rich.e2e.example.com", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
}

/// The allocation with node-specific names replaced, for comparing shapes.
fn shape(claim: &ResourceClaim, node: &str) -> Value {
    let mut a = serde_json::to_value(claim).unwrap()["status"]["allocation"].clone();
    // When is not part of the shape; whether it is stamped is.
    if let Some(stamp) = a.get_mut("allocationTimestamp") {
        *stamp = json!("<time>");
    }
    let text = a.to_string().replace(&format!("\"{node}\""), "\"<node>\"");
    let mut a: Value = serde_json::from_str(&text).unwrap();
    // Which devices of equal ones were picked is not part of the shape.
    if let Some(results) = a["devices"]["results"].as_array_mut() {
        for r in results {
            r["device"] = json!("<device>");
        }
    }
    a
}

/// The same claim on identical nodes: once pinned by node affinity (the
/// real kube-scheduler allocates), once by `nodeName` on a declared node
/// (we allocate). The allocations must have the same shape: requests and
/// subrequests chosen, device counts, pools, configs, node selector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_allocation_shapes_against_kube_scheduler() {
    const NAME: &str = "differential_allocation_shapes_against_kube_scheduler";
    let Some(scheduler_bin) = crate::scheduler::binary_or_skip(NAME) else {
        return;
    };
    let Some(mut t) = cluster(NAME).await else {
        return;
    };
    let classes: Api<DeviceClass> = Api::all(t.client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "rich"}, "spec": {
                "selectors": [{"cel": {"expression": "device.driver == 'rich.e2e.example.com'"}}],
                "config": [{"opaque": {"driver": "rich.e2e.example.com", "parameters": {"class": "rich"}}}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    for node in ["sched-1", "ours-1"] {
        nodes::create_schedulable_node(&t.client, node)
            .await
            .unwrap();
        create_rich_devices(&t.client, node).await;
    }
    declare(&t.client, "ours-1").await;
    t.isolated_env()
        .start_controller()
        .await
        .expect("start controller");
    let _scheduler = crate::scheduler::Scheduler::start(&scheduler_bin, &t.isolated_env().cluster)
        .await
        .expect("start kube-scheduler");
    t.create_template_with("rich", json!({}), json!({}), rich_spec())
        .await;

    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(t.client.clone(), &t.ns);
    let pod = |name: &str, placement: Value| -> k8s_openapi::api::core::v1::Pod {
        let mut spec = json!({
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                             "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "rich"}],
        });
        for (k, v) in placement.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    };
    pods.create(
        &PostParams::default(),
        &pod(
            "by-scheduler",
            json!({"nodeSelector": {"kubernetes.io/hostname": "sched-1"}}),
        ),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &pod("by-us", json!({"nodeName": "ours-1"})),
    )
    .await
    .unwrap();
    let mut shapes = Vec::new();
    for (pod, node) in [("by-scheduler", "sched-1"), ("by-us", "ours-1")] {
        let (name, _) =
            wait_allocated(&t, pod, &format!("{pod}: claim allocated and reserved")).await;
        let claim = t.claim(&name).await.unwrap();
        let devices: BTreeSet<(String, String)> = allocated(&claim).unwrap().into_iter().collect();
        assert_eq!(devices.len(), 3, "{pod}: {devices:?}");
        shapes.push(shape(&claim, node));
    }
    assert_eq!(
        shapes[0], shapes[1],
        "scheduler (left) and ours (right) differ"
    );
    println!("differential allocation shape: {}", shapes[1]);
    assert_eq!(double_allocations(&t).await, 0.0);
    t.finish();
}
