//! Headroom against the real API server: the chart's CRD applied, the
//! controller run with `--controllers=resourceclaim,headroom` and the
//! chart's RBAC for it. CPU/memory watermarks: placeholders sized from the
//! workload on the selected nodes, their Deployment, status and
//! conditions. (Placeholder pods are played by the test: no
//! kube-controller-manager runs the Deployment here.)

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
    let labels = match watermark {
        Some(w) => json!({"dra-claim-controller.io/watermark": w}),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_memory_watermark_sizes_its_placeholders() {
    const NAME: &str = "cpu_memory_watermark_sizes_its_placeholders";
    let opts = ControllerOpts {
        extra_args: vec!["--controllers=resourceclaim,headroom".into()],
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated(NAME, opts, 1).await else {
        return;
    };
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    install_crd(&admin).await;
    node_in_pool(&admin, "gpu-1", "gpu").await;
    node_in_pool(&admin, "cpu-1", "cpu").await;

    let watermarks: Api<DynamicObject> =
        Api::namespaced_with(t.client.clone(), &t.ns, &watermark_resource());
    let watermark = json!({
        "apiVersion": "dra-claim-controller.io/v1alpha1", "kind": "NodeScalingWatermark",
        "metadata": {"name": "pool"},
        "spec": {"watermarkPercentage": 50, "nodeSelector": {"pool": "gpu"},
                 "pausePodSize": {"cpu": "1", "memory": "1Gi"}, "minPlaceholders": 2},
    });
    watermarks
        .create(
            &PostParams::default(),
            &serde_json::from_value(watermark).unwrap(),
        )
        .await
        .unwrap();

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
    wait_for("the Deployment to follow", WAIT, async || {
        let replicas = deployments.get("pool-cpu").await?.spec.replicas;
        ensure!(replicas == Some(5), "replicas {replicas:?}");
        Ok(())
    })
    .await;

    // An entry this version does not serve is Invalid, naming the field.
    watermarks
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"devices": [{"name": "gpu", "deviceClassName": "gpu.example.com"}]}})),
        )
        .await
        .unwrap();
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
