//! Headroom against the real API server: the chart's CRD applied, the
//! controller run with `--controllers=resourceclaim,headroom` and the
//! chart's RBAC for it. Placeholders sized from the workload on the
//! selected nodes (CPU/memory, and devices from slices and claims), their
//! Deployments and claim templates, status and conditions. (Placeholder
//! pods are played by the test: no kube-controller-manager runs the
//! Deployments here.)

use std::time::Duration;

use anyhow::ensure;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::wait_for;

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
async fn install_crd(admin: &kube::Client) {
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
async fn node_in_pool(admin: &kube::Client, name: &str, pool: &str) {
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
async fn wait_status(api: &Api<DynamicObject>, name: &str, want: Value) -> Value {
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

fn condition(status: &Value, type_: &str) -> Value {
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
    let opts = ControllerOpts {
        extra_args: vec!["--controllers=resourceclaim,headroom".into()],
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
async fn patch_watermark(watermarks: &Api<DynamicObject>, patch: Value) {
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
async fn wait_entry(api: &Api<DynamicObject>, wm: &str, name: &str, want: Value) -> Value {
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
        crate::nodes::create_device_class(admin, DRIVER)
            .await
            .unwrap();
        for node in ["gpu-1", "gpu-2"] {
            node_in_pool(admin, node, "gpu").await;
            crate::nodes::create_devices(admin, DRIVER, node, 3)
                .await
                .unwrap();
        }
    };
    let spec = json!({"watermarkPercentage": 50, "nodeSelector": {"pool": "gpu"},
             "devices": [{"name": "gpu", "deviceClassName": DRIVER, "minPlaceholders": 1}]});
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

    // A workload pod on gpu-1 holding three devices: 3 x 50 % = 2.
    bound_pod(&t, "job", Some("gpu-1"), "1", None).await;
    let job: Pod = Api::namespaced(t.client.clone(), &t.ns)
        .get("job")
        .await
        .unwrap();
    t.create_claim(json!({"name": "job-devices"})).await;
    let results: Vec<Value> = (0..3)
        .map(|i| json!({"request": "req-0", "driver": DRIVER, "pool": "gpu-1", "device": format!("dev-{i}")}))
        .collect();
    t.allocate_devices(
        "job-devices",
        json!({"devices": {"results": results}}),
        json!([crate::k8s::pod_ref(&job)]),
    )
    .await;
    wait_entry(
        &watermarks,
        "pool",
        "gpu",
        json!({"devicesTotal": 6, "devicesInUse": 3, "desiredPlaceholders": 2}),
    )
    .await;
    wait_replicas(&deployments, "pool-gpu", 2).await;

    // An unknown class: that entry is Invalid, the other one goes on.
    patch_watermark(
        &watermarks,
        json!({"spec": {"devices": [
                {"name": "gpu", "deviceClassName": DRIVER, "minPlaceholders": 1},
                {"name": "bad", "deviceClassName": "missing.example.com"}]}}),
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
    assert!(deployments.get_opt("pool-bad").await.unwrap().is_none());

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
