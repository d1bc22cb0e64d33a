//! Headroom against the real API server: the chart's CRD applied, the
//! controller run with `--controllers=resourceclaim,headroom` and the
//! chart's RBAC for it. Placeholders sized from the workload on the
//! selected nodes (CPU/memory, and devices from slices and claims), their
//! Deployments and claim templates, status and conditions. (Placeholder
//! pods are played by the test: no kube-controller-manager runs the
//! Deployments here.)

use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::{holds_for, wait_for};

const WAIT: Duration = Duration::from_secs(60);

fn watermark_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "dra-claim-controller.io",
            "v1alpha1",
            "NodeScalingWatermark",
        ),
        "nodescalingwatermarks",
    )
}

/// Applies the chart's CRD and waits until it is served.
pub(crate) async fn install_crd(admin: &kube::Client) {
    let path = crate::helm::chart_dir().join("crds/nodescalingwatermarks.yaml");
    let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &resource);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .expect("the chart's CRD is accepted by the API server");
    wait_for("the CRD to be established", WAIT, async || {
        let crd = api
            .get("nodescalingwatermarks.dra-claim-controller.io")
            .await?;
        let established = crd.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Established" && c["status"] == "True");
        ensure!(established, "not established yet");
        Ok(())
    })
    .await;
}

/// A node `name` with label `pool=<pool>`.
pub(crate) async fn node_in_pool(admin: &kube::Client, name: &str, pool: &str) {
    crate::nodes::create_schedulable_node(admin, name)
        .await
        .unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pool": pool}}})),
        )
        .await
        .unwrap();
}

/// The device class `driver` and nodes of pool `gpu` with that many of
/// its devices each (a node-local slice per node).
async fn gpu_pool(admin: &kube::Client, driver: &str, nodes: &[(&str, usize)]) {
    crate::nodes::create_device_class(admin, driver)
        .await
        .unwrap();
    for (node, devices) in nodes {
        node_in_pool(admin, node, "gpu").await;
        crate::nodes::create_devices(admin, driver, node, *devices)
            .await
            .unwrap();
    }
}

/// A watermark spec of 50 % on pool `gpu` with one device entry `gpu`
/// (one device of class `driver` per placeholder, at least `min`).
pub(crate) fn device_watermark(driver: &str, min: u32) -> Value {
    json!({"watermarkPercentage": 50, "nodeSelector": {"pool": "gpu"},
           "devices": [{"name": "gpu", "deviceClassName": driver, "minPlaceholders": min}]})
}

/// A running pod bound to `node` requesting `cpu`, labelled as a
/// placeholder of `watermark` when given.
async fn bound_pod(
    t: &TestCtx,
    name: &str,
    node: Option<&str>,
    cpu: &str,
    watermark: Option<&str>,
) {
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    // As the placeholders' Deployment labels its pods.
    let labels = match watermark {
        Some(w) => json!({"dra-claim-controller.io/watermark": w,
                          "dra-claim-controller.io/watermark-entry": "cpu"}),
        None => json!({}),
    };
    let pod = json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]},
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
}

/// Waits until the watermark's status says `want` (a subset of fields).
pub(crate) async fn wait_status(api: &Api<DynamicObject>, name: &str, want: Value) -> Value {
    wait_for(&format!("status {want}"), WAIT, async || {
        let wm = api.get(name).await?;
        let status = wm.data["status"].clone();
        for (k, v) in want.as_object().unwrap() {
            ensure!(
                status[k] == *v,
                "status.{k} is {}; status {status}",
                status[k]
            );
        }
        Ok(status)
    })
    .await
}

pub(crate) fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or(Value::Null)
}

/// A controller running headroom with the chart's CRD installed, the
/// admin client, and the API of the test namespace's watermarks with the
/// watermark `pool` created from `spec`.
async fn headroom_with_watermark(
    name: &'static str,
    setup: impl AsyncFnOnce(&kube::Client),
    spec: Value,
) -> Option<(TestCtx, Api<DynamicObject>)> {
    headroom_with_flags(name, &[], setup, spec).await
}

/// [`headroom_with_watermark`] with further controller flags.
pub(crate) async fn headroom_with_flags(
    name: &'static str,
    flags: &[&str],
    setup: impl AsyncFnOnce(&kube::Client),
    spec: Value,
) -> Option<(TestCtx, Api<DynamicObject>)> {
    let mut extra_args = vec!["--controllers=resourceclaim,headroom".to_string()];
    extra_args.extend(flags.iter().map(|f| f.to_string()));
    let opts = ControllerOpts {
        extra_args,
        ..ControllerOpts::default()
    };
    let mut t = TestCtx::isolated(name, opts, 1).await?;
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    install_crd(&admin).await;
    setup(&admin).await;
    let watermarks: Api<DynamicObject> =
        Api::namespaced_with(t.client.clone(), &t.ns, &watermark_resource());
    let watermark = json!({
        "apiVersion": "dra-claim-controller.io/v1alpha1", "kind": "NodeScalingWatermark",
        "metadata": {"name": "pool"},
        "spec": spec,
    });
    watermarks
        .create(
            &PostParams::default(),
            &serde_json::from_value(watermark).unwrap(),
        )
        .await
        .unwrap();
    Some((t, watermarks))
}

/// Waits until the Deployment `name` asks for `replicas`.
async fn wait_replicas(deployments: &Api<Deployment>, name: &str, replicas: i32) {
    wait_for(
        &format!("Deployment {name} at {replicas}"),
        WAIT,
        async || {
            let now = deployments.get(name).await?.spec.replicas;
            ensure!(now == Some(replicas), "replicas {now:?}");
            Ok(())
        },
    )
    .await;
}

/// Merge-patches the watermark `pool`.
pub(crate) async fn patch_watermark(watermarks: &Api<DynamicObject>, patch: Value) {
    watermarks
        .patch("pool", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_memory_watermark_sizes_its_placeholders() {
    const NAME: &str = "cpu_memory_watermark_sizes_its_placeholders";
    let setup = async |admin: &kube::Client| {
        node_in_pool(admin, "gpu-1", "gpu").await;
        node_in_pool(admin, "cpu-1", "cpu").await;
    };
    let spec = json!({"watermarkPercentage": 50, "nodeSelector": {"pool": "gpu"},
                      "pausePodSize": {"cpu": "1", "memory": "1Gi"}, "minPlaceholders": 2});
    let Some((t, watermarks)) = headroom_with_watermark(NAME, setup, spec).await else {
        return;
    };

    // No workload: the minimum, as a Deployment owned by the watermark.
    let status = wait_status(&watermarks, "pool", json!({"desiredPlaceholders": 2})).await;
    assert_eq!(condition(&status, "Ready")["status"], "False", "{status}");
    assert_eq!(condition(&status, "Invalid")["status"], "False", "{status}");
    let deployments: Api<Deployment> = Api::namespaced(t.client.clone(), &t.ns);
    let deployment = deployments
        .get("pool-cpu")
        .await
        .expect("pool-cpu Deployment");
    assert_eq!(deployment.spec.replicas, Some(2));
    let owner = &deployment.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("NodeScalingWatermark", "pool")
    );
    let pod_spec = deployment.spec.template.spec.unwrap();
    assert_eq!(
        pod_spec.priority_class_name.as_deref(),
        Some("dra-headroom")
    );
    assert_eq!(
        pod_spec
            .node_selector
            .unwrap()
            .get("pool")
            .map(String::as_str),
        Some("gpu")
    );

    // Workload on the selected node counts (10 CPUs x 50 % / 1 CPU = 5);
    // on another pool, done, or a placeholder, it does not.
    bound_pod(&t, "work", Some("gpu-1"), "10", None).await;
    bound_pod(&t, "elsewhere", Some("cpu-1"), "30", None).await;
    bound_pod(&t, "pool-cpu-a", Some("gpu-1"), "1", Some("pool")).await;
    bound_pod(&t, "pool-cpu-b", None, "1", Some("pool")).await;
    let status = wait_status(
        &watermarks,
        "pool",
        json!({"desiredPlaceholders": 5, "readyPlaceholders": 1, "pendingPlaceholders": 1}),
    )
    .await;
    assert_eq!(
        condition(&status, "ScaleUpPending")["status"],
        "True",
        "{status}"
    );
    wait_replicas(&deployments, "pool-cpu", 5).await;

    // A device entry whose class does not exist is Invalid, naming the field.
    patch_watermark(
        &watermarks,
        json!({"spec": {"devices": [{"name": "gpu", "deviceClassName": "gpu.example.com"}]}}),
    )
    .await;
    let status = wait_for("Invalid=True", WAIT, async || {
        let status = watermarks.get("pool").await?.data["status"].clone();
        ensure!(
            condition(&status, "Invalid")["status"] == "True",
            "{status}"
        );
        Ok(status)
    })
    .await;
    let message = condition(&status, "Invalid")["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("spec.devices"), "{message}");
    t.finish();
}

/// The entry `name` of a status.
fn entry_status(status: &Value, name: &str) -> Value {
    status["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Waits until entry `name` of the watermark's status has `want`.
pub(crate) async fn wait_entry(
    api: &Api<DynamicObject>,
    wm: &str,
    name: &str,
    want: Value,
) -> Value {
    wait_for(&format!("entry {name}: {want}"), WAIT, async || {
        let status = api.get(wm).await?.data["status"].clone();
        let entry = entry_status(&status, name);
        for (k, v) in want.as_object().unwrap() {
            ensure!(
                entry[k] == *v,
                "{name}.{k} is {}; status {status}",
                entry[k]
            );
        }
        Ok(status)
    })
    .await
}

/// A device watermark on two nodes of 3 devices each: the minimum before
/// any workload, then half of what a workload pod's claim holds; an entry
/// with an unknown class is Invalid on its own; an entry removed takes its
/// Deployment and claim template with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_watermark_follows_the_devices_in_use() {
    const NAME: &str = "device_watermark_follows_the_devices_in_use";
    const DRIVER: &str = "gpu.example.com";
    let setup = async |admin: &kube::Client| {
        gpu_pool(admin, DRIVER, &[("gpu-1", 3), ("gpu-2", 3)]).await;
    };
    let spec = device_watermark(DRIVER, 1);
    let Some((t, watermarks)) = headroom_with_watermark(NAME, setup, spec).await else {
        return;
    };
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"devicesTotal": 6, "devicesInUse": 0, "desiredPlaceholders": 1}),
    )
    .await;
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(t.client.clone(), &t.ns);
    let template = templates
        .get("pool-gpu")
        .await
        .expect("claim template pool-gpu");
    let request = &template
        .spec
        .unwrap()
        .spec
        .unwrap()
        .devices
        .unwrap()
        .requests
        .unwrap()[0];
    assert_eq!(request.exactly.as_ref().unwrap().device_class_name, DRIVER);
    let deployments: Api<Deployment> = Api::namespaced(t.client.clone(), &t.ns);
    let deployment = deployments
        .get("pool-gpu")
        .await
        .expect("Deployment pool-gpu");
    assert_eq!(deployment.spec.replicas, Some(1));
    let pod = deployment.spec.template.spec.unwrap();
    let claims = pod.resource_claims.unwrap();
    assert_eq!(
        claims[0].resource_claim_template_name.as_deref(),
        Some("pool-gpu")
    );

    // A workload pod on each node holding its three devices: 50 % of the
    // 6 devices in use = 3 placeholders; with one pod, 3 x 50 % = 1.5 -> 2.
    for node in ["gpu-1", "gpu-2"] {
        let name = format!("job-{node}");
        bound_pod(&t, &name, Some(node), "1", None).await;
        let job: Pod = Api::namespaced(t.client.clone(), &t.ns)
            .get(&name)
            .await
            .unwrap();
        let claim = format!("{name}-devices");
        t.create_claim(json!({"name": claim})).await;
        let results: Vec<Value> = (0..3)
            .map(|i| json!({"request": "req-0", "driver": DRIVER, "pool": node, "device": format!("dev-{i}")}))
            .collect();
        t.allocate_devices(
            &claim,
            json!({"devices": {"results": results}}),
            json!([crate::k8s::pod_ref(&job)]),
        )
        .await;
    }
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"devicesTotal": 6, "devicesInUse": 6, "desiredPlaceholders": 3}),
    )
    .await;
    wait_replicas(&deployments, "pool-gpu", 3).await;
    Api::<Pod>::namespaced(t.client.clone(), &t.ns)
        .patch_status(
            "job-gpu-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .unwrap();
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"devicesInUse": 3, "desiredPlaceholders": 2}),
    )
    .await;
    wait_replicas(&deployments, "pool-gpu", 2).await;

    // An unknown class, a selector that does not compile: those entries
    // are Invalid, the other one goes on.
    patch_watermark(
        &watermarks,
        json!({"spec": {"devices": [
                {"name": "gpu", "deviceClassName": DRIVER, "minPlaceholders": 1},
                {"name": "bad", "deviceClassName": "missing.example.com"},
                {"name": "badcel", "deviceClassName": DRIVER, "minPlaceholders": 1,
                 "selectors": [{"cel": {"expression": "device.driver == "}}]}]}}),
    )
    .await;
    let status = wait_entry(
        &watermarks,
        "pool",
        "bad",
        json!({"desiredPlaceholders": 0}),
    )
    .await;
    let invalid = condition(&status, "Invalid");
    assert_eq!(invalid["status"], "True", "{status}");
    assert!(
        invalid["message"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.devices[1] (bad): DeviceClass missing.example.com not found"),
        "{invalid}"
    );
    assert_eq!(
        entry_status(&status, "gpu")["desiredPlaceholders"],
        2,
        "{status}"
    );
    assert!(
        invalid["message"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.devices[2] (badcel)"),
        "{invalid}"
    );
    assert_eq!(
        entry_status(&status, "badcel")["desiredPlaceholders"],
        0,
        "{status}"
    );
    for entry in ["pool-bad", "pool-badcel"] {
        assert!(
            deployments.get_opt(entry).await.unwrap().is_none(),
            "{entry}"
        );
        assert!(templates.get_opt(entry).await.unwrap().is_none(), "{entry}");
    }

    // The gpu entry removed: its Deployment and template go.
    patch_watermark(
        &watermarks,
        json!({"spec": {"devices": [
                {"name": "bad", "deviceClassName": "missing.example.com"}]}}),
    )
    .await;
    wait_for("the removed entry's objects to go", WAIT, async || {
        ensure!(
            deployments.get_opt("pool-gpu").await?.is_none(),
            "Deployment still there"
        );
        ensure!(
            templates.get_opt("pool-gpu").await?.is_none(),
            "template still there"
        );
        Ok(())
    })
    .await;
    t.finish();
}

/// Creates the PriorityClass `name` with `value`.
pub(crate) async fn priority_class(admin: &kube::Client, name: &str, value: i32, never: bool) {
    let api: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(admin.clone());
    let mut class = json!({"metadata": {"name": name}, "value": value});
    if never {
        class["preemptionPolicy"] = json!("Never");
    }
    api.create(
        &PostParams::default(),
        &serde_json::from_value(class).unwrap(),
    )
    .await
    .unwrap();
}

/// The chart's placeholder class `dra-headroom` (-1, never preempting)
/// and `high` (1000) for workloads.
pub(crate) async fn priority_classes(admin: &kube::Client) {
    priority_class(admin, "dra-headroom", -1, true).await;
    priority_class(admin, "high", 1000, false).await;
}

/// The node a pod is bound to, if any.
pub(crate) async fn bound_to(pods: &Api<Pod>, name: &str) -> anyhow::Result<Option<String>> {
    Ok(pods
        .get_opt(name)
        .await?
        .and_then(|p| p.spec)
        .and_then(|s| s.node_name))
}

/// A node of 2 devices both held by placeholders, a real kube-scheduler,
/// and a higher-priority pod asking for one device, created last; `None`
/// (after a SKIP line) without a kube-scheduler binary. The test plays
/// the Deployment's ReplicaSet (no kube-controller-manager runs here).
async fn full_node_and_a_waiting_pod(
    name: &'static str,
    flags: &[&str],
) -> Option<(TestCtx, Api<Pod>, crate::scheduler::Scheduler)> {
    const DRIVER: &str = "gpu.example.com";
    let scheduler_bin = crate::scheduler::binary_or_skip(name)?;
    let setup = async |admin: &kube::Client| {
        priority_classes(admin).await;
        gpu_pool(admin, DRIVER, &[("gpu-1", 2)]).await;
    };
    let spec = device_watermark(DRIVER, 2);
    let (mut t, watermarks) = headroom_with_flags(name, flags, setup, spec).await?;
    let scheduler = crate::scheduler::Scheduler::start(&scheduler_bin, &t.isolated_env().cluster)
        .await
        .expect("start kube-scheduler");
    let deployments: Api<Deployment> = Api::namespaced(t.client.clone(), &t.ns);
    wait_replicas(&deployments, "pool-gpu", 2).await;

    let template = deployments.get("pool-gpu").await.unwrap().spec.template;
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    for name in ["pool-gpu-a", "pool-gpu-b"] {
        let mut pod = json!({"metadata": template.metadata, "spec": template.spec});
        pod["metadata"]["name"] = json!(name);
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        )
        .await
        .unwrap();
    }
    for name in ["pool-gpu-a", "pool-gpu-b"] {
        wait_for(&format!("placeholder {name} bound"), WAIT, async || {
            ensure!(bound_to(&pods, name).await?.is_some(), "not bound");
            Ok(())
        })
        .await;
    }
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"devicesTotal": 2, "devicesHeld": 2, "readyPlaceholders": 2}),
    )
    .await;

    gpu_job_template(&t, DRIVER).await;
    gpu_job(&pods, "job").await;
    Some((t, pods, scheduler))
}

/// The claim template `job-gpu`: one device of the class `driver`.
pub(crate) async fn gpu_job_template(t: &TestCtx, driver: &str) {
    one_device_template(t, "job-gpu", driver).await;
}

/// A claim template `name` asking for one device (request `gpu`) of
/// `class`.
pub(crate) async fn one_device_template(t: &TestCtx, name: &str, class: &str) {
    t.create_template_with(
        name,
        json!({}),
        json!({}),
        json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}),
    )
    .await;
}

/// A priority-1000 pod `name` claiming one device through `job-gpu`.
pub(crate) async fn gpu_job(pods: &Api<Pod>, name: &str) {
    let job = json!({"metadata": {"name": name}, "spec": {
        "priorityClassName": "high",
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "job-gpu"}]}});
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(job).unwrap(),
    )
    .await
    .unwrap();
}

/// The yield: kube-scheduler finds the pod `Unschedulable` ("preemption is
/// not helpful" for devices), the controller releases one placeholder, and
/// the scheduler binds the pod; a Warning event says what yielded where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholders_yield_their_devices_to_a_waiting_pod() {
    const NAME: &str = "placeholders_yield_their_devices_to_a_waiting_pod";
    let Some((t, pods, _scheduler)) = full_node_and_a_waiting_pod(NAME, &[]).await else {
        return;
    };
    let node = wait_for("the pod to bind after a yield", WAIT, async || {
        if let Some(node) = bound_to(&pods, "job").await? {
            return Ok(node);
        }
        anyhow::bail!("not bound yet; {}", yield_state(&pods).await?)
    })
    .await;
    assert_eq!(node, "gpu-1");
    let mut left = Vec::new();
    for name in ["pool-gpu-a", "pool-gpu-b"] {
        if pods.get_opt(name).await.unwrap().is_some() {
            left.push(name);
        }
    }
    assert_eq!(
        left.len(),
        1,
        "exactly one placeholder yielded: left {left:?}"
    );
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(t.client.clone(), &t.ns);
    let yielded = wait_for("the PlaceholdersYielded event", WAIT, async || {
        let list = events.list(&Default::default()).await?;
        list.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("PlaceholdersYielded")
                    && e.involved_object.name.as_deref() == Some("job")
            })
            .context("no event yet")
    })
    .await;
    assert!(
        yielded.message.unwrap_or_default().contains("gpu-1"),
        "the event names the node"
    );
    t.finish();
}

/// What a yield that did not happen left behind, to tell a missed yield
/// (both placeholders there) from a scheduler that has not retried yet.
async fn yield_state(pods: &Api<Pod>) -> anyhow::Result<String> {
    let mut left = Vec::new();
    for name in ["pool-gpu-a", "pool-gpu-b"] {
        if pods.get_opt(name).await?.is_some() {
            left.push(name);
        }
    }
    let job = pods.get("job").await?;
    let scheduled = job
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .map(|c| format!("{}/{}", c.status, c.reason.unwrap_or_default()));
    Ok(format!(
        "placeholders left {left:?}, the pod's PodScheduled {scheduled:?}"
    ))
}

/// `--headroom-yield=false`: the same pod stays Pending, which is
/// kube-scheduler's limit the yield exists for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_yield_the_waiting_pod_stays_pending() {
    const NAME: &str = "without_the_yield_the_waiting_pod_stays_pending";
    let Some((t, pods, _scheduler)) =
        full_node_and_a_waiting_pod(NAME, &["--headroom-yield=false"]).await
    else {
        return;
    };
    // Long enough for the scheduler to give up on it and for a yield to
    // have happened several times over (it takes well under a second).
    holds_for(
        "the job unbound and both placeholders kept",
        Duration::from_secs(10),
        async || {
            let bound = bound_to(&pods, "job").await?;
            ensure!(bound.is_none(), "bound to {bound:?} without a yield");
            for name in ["pool-gpu-a", "pool-gpu-b"] {
                ensure!(pods.get_opt(name).await?.is_some(), "{name} was released");
            }
            Ok(())
        },
    )
    .await;
    t.finish();
}

/// The control plane a placeholder's life needs besides this controller:
/// kube-scheduler, and kube-controller-manager running the Deployment,
/// ReplicaSet and garbage-collector controllers (started after the CRD, so
/// the garbage collector knows watermarks as owners). `None` after one
/// SKIP line when a binary is missing.
async fn with_control_plane(
    name: &'static str,
    flags: &[&str],
    setup: impl AsyncFnOnce(&kube::Client),
    spec: Value,
) -> Option<(
    TestCtx,
    Api<DynamicObject>,
    crate::scheduler::Scheduler,
    crate::reference::Reference,
)> {
    let scheduler_bin = crate::scheduler::binary_or_skip(name)?;
    let kcm_bin = crate::reference::binary_or_skip(name)?;
    let (mut t, watermarks) = headroom_with_flags(name, flags, setup, spec).await?;
    let (scheduler, kcm) =
        scheduler_and_workload_controllers(&t.isolated_env().cluster, &scheduler_bin, &kcm_bin)
            .await;
    Some((t, watermarks, scheduler, kcm))
}

/// kube-scheduler, and kube-controller-manager with the controllers that
/// run placeholders (Deployments, ReplicaSets, garbage collector).
pub(crate) async fn scheduler_and_workload_controllers(
    cluster: &crate::cluster::Cluster,
    scheduler_bin: &std::path::Path,
    kcm_bin: &std::path::Path,
) -> (crate::scheduler::Scheduler, crate::reference::Reference) {
    let scheduler = crate::scheduler::Scheduler::start(scheduler_bin, cluster)
        .await
        .expect("start kube-scheduler");
    let kcm = crate::reference::Reference::start_controllers(
        kcm_bin,
        cluster,
        &[
            "deployment-controller",
            "replicaset-controller",
            "garbage-collector-controller",
        ],
    )
    .await
    .expect("start kube-controller-manager");
    (scheduler, kcm)
}

/// Every device allocated in the namespace, with the claims holding it:
/// none may be in two.
pub(crate) async fn devices_in_two_claims(t: &TestCtx) -> Vec<String> {
    let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        Api::namespaced(t.client.clone(), &t.ns);
    let mut holders: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for claim in claims.list(&Default::default()).await.unwrap() {
        let results = claim
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default();
        for r in results {
            holders
                .entry(format!("{}/{}/{}", r.driver, r.pool, r.device))
                .or_default()
                .push(claim.metadata.name.clone().unwrap_or_default());
        }
    }
    holders
        .into_iter()
        .filter(|(_, claims)| claims.len() > 1)
        .map(|(device, claims)| format!("{device}: {claims:?}"))
        .collect()
}

/// The pods of the namespace that are placeholders (by their label).
pub(crate) async fn placeholder_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(
        &kube::api::ListParams::default().labels(dra_claim_controller::naming::WATERMARK_LABEL),
    )
    .await
    .unwrap()
    .items
}

/// The whole loop with real Deployments: 4 devices, 2 held by placeholders;
/// four priority-1000 pods asking one device each all bind (two through a
/// yield), the recreated placeholders are Pending and the watermark says
/// `ScaleUpPending`; no device is ever in two claims. Deleting the
/// watermark then takes its Deployments, templates, placeholders and their
/// claims, and leaves the workload alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surplus_placeholders_wait_for_a_node_and_go_with_their_watermark() {
    const NAME: &str = "surplus_placeholders_wait_for_a_node_and_go_with_their_watermark";
    const DRIVER: &str = "gpu.example.com";
    let setup = async |admin: &kube::Client| {
        priority_classes(admin).await;
        gpu_pool(admin, DRIVER, &[("gpu-1", 4)]).await;
    };
    let spec = device_watermark(DRIVER, 2);
    let Some((t, watermarks, _scheduler, _kcm)) = with_control_plane(NAME, &[], setup, spec).await
    else {
        return;
    };
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"devicesTotal": 4, "devicesHeld": 2, "readyPlaceholders": 2}),
    )
    .await;

    gpu_job_template(&t, DRIVER).await;
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    let jobs: Vec<String> = (0..4).map(|i| format!("job-{i}")).collect();
    for job in &jobs {
        gpu_job(&pods, job).await;
    }
    let started = std::time::Instant::now();
    wait_for(
        "every workload pod to bind",
        Duration::from_secs(30),
        async || {
            for job in &jobs {
                ensure!(bound_to(&pods, job).await?.is_some(), "{job} not bound");
            }
            Ok(())
        },
    )
    .await;
    println!(
        "{NAME}: 4 workload pods bound {} ms after the first was created (2 through a yield)",
        started.elapsed().as_millis()
    );
    let status = wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"devicesInUse": 4, "desiredPlaceholders": 2, "pendingPlaceholders": 2,
               "readyPlaceholders": 0}),
    )
    .await;
    assert_eq!(
        condition(&status, "ScaleUpPending")["status"],
        "True",
        "{status}"
    );
    assert!(status["yields"].as_i64().unwrap_or(0) >= 1, "{status}");
    let twice = devices_in_two_claims(&t).await;
    assert!(twice.is_empty(), "devices in two claims: {twice:?}");
    let waiting = placeholder_pods(&pods).await;
    assert_eq!(waiting.len(), 2, "the Deployment keeps its 2 replicas");
    assert!(
        waiting
            .iter()
            .all(|p| p.spec.as_ref().unwrap().node_name.is_none()),
        "the recreated placeholders wait for a node"
    );

    // The watermark goes: everything it made goes with it.
    watermarks
        .delete("pool", &Default::default())
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(t.client.clone(), &t.ns);
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(t.client.clone(), &t.ns);
    let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        Api::namespaced(t.client.clone(), &t.ns);
    wait_for("the watermark's objects to go", WAIT, async || {
        ensure!(
            deployments.get_opt("pool-gpu").await?.is_none(),
            "Deployment still there"
        );
        ensure!(
            templates.get_opt("pool-gpu").await?.is_none(),
            "template still there"
        );
        let left = placeholder_pods(&pods).await.len();
        ensure!(left == 0, "{left} placeholder pods left");
        let claims = claims.list(&Default::default()).await?;
        let names: Vec<String> = claims
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        ensure!(
            names.len() == 4 && names.iter().all(|n| n.starts_with("job-")),
            "claims left: {names:?}"
        );
        Ok(())
    })
    .await;
    for job in &jobs {
        assert!(
            bound_to(&pods, job).await.unwrap().is_some(),
            "{job} untouched"
        );
    }
    t.finish();
}

/// A CPU/memory-only watermark: kube-scheduler's own preemption makes room.
/// A node of 4 CPUs, 2 placeholders of 1 CPU; a priority-1000 pod asking 3
/// CPUs preempts one, binds, and the replacement waits for a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_memory_placeholders_are_preempted_by_the_scheduler() {
    const NAME: &str = "cpu_memory_placeholders_are_preempted_by_the_scheduler";
    let setup = async |admin: &kube::Client| {
        priority_classes(admin).await;
        node_in_pool(admin, "small-1", "gpu").await;
        let capacity = json!({"cpu": "4", "memory": "16Gi", "pods": "110"});
        Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone())
            .patch_status(
                "small-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"capacity": capacity, "allocatable": capacity}})),
            )
            .await
            .unwrap();
    };
    let spec = json!({"watermarkPercentage": 50, "nodeSelector": {"pool": "gpu"},
                      "pausePodSize": {"cpu": "1", "memory": "64Mi"}, "minPlaceholders": 2});
    let Some((t, watermarks, _scheduler, _kcm)) = with_control_plane(NAME, &[], setup, spec).await
    else {
        return;
    };
    wait_status(&watermarks, "pool", json!({"readyPlaceholders": 2})).await;
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    let before: Vec<String> = placeholder_pods(&pods)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let job = json!({"metadata": {"name": "job"}, "spec": {
        "priorityClassName": "high",
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "3", "memory": "64Mi"}}}]}});
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(job).unwrap(),
    )
    .await
    .unwrap();
    let node = wait_for("the pod to bind after a preemption", WAIT, async || {
        bound_to(&pods, "job").await?.context("not bound yet")
    })
    .await;
    assert_eq!(node, "small-1");
    // 3 CPUs x 50 % / 1 CPU = 2 (rounded up): one placeholder keeps its
    // place, the preempted one's replacement waits for a node.
    let status = wait_status(
        &watermarks,
        "pool",
        json!({"desiredPlaceholders": 2, "readyPlaceholders": 1, "pendingPlaceholders": 1}),
    )
    .await;
    assert_eq!(
        condition(&status, "ScaleUpPending")["status"],
        "True",
        "{status}"
    );
    let after: Vec<String> = placeholder_pods(&pods)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let kept = after.iter().filter(|n| before.contains(n)).count();
    assert_eq!(
        kept, 1,
        "one placeholder preempted: before {before:?}, after {after:?}"
    );
    t.finish();
}
