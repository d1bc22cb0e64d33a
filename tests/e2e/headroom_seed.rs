//! The seed operator's NodeScalingWatermark (`redhatcop.redhat.io/v1alpha1`,
//! proactive-node-scaling-operator) served by the headroom controller: the
//! seed's two samples applied as they are, plus a device-plugin GPU one,
//! give the seed's placeholder counts; the seed's own placeholders, pods in
//! its excluded namespaces and finished pods change nothing.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::wait_for;

const WAIT: Duration = Duration::from_secs(60);

/// `config/samples/zone-watermark.yaml` of the seed operator, as it is.
const ZONE_SAMPLE: &str = "apiVersion: redhatcop.redhat.io/v1alpha1
kind: NodeScalingWatermark
metadata:
  name: us-west-2a
spec:
  watermarkPercentage: 20
  nodeSelector:
    topology.kubernetes.io/zone: us-west-2a
";

/// `config/samples/ai-ml-watermark.yaml` of the seed operator, as it is.
const AI_ML_SAMPLE: &str = "apiVersion: redhatcop.redhat.io/v1alpha1
kind: NodeScalingWatermark
metadata:
  name: ai-ml
spec:
  watermarkPercentage: 20
  nodeSelector:
    machine.openshift.io/cluster-api-machine-type: ai-ml
  tolerations:
  - key: \"workload\"
    operator: \"Equal\"
    value: \"ai-ml\"
    effect: \"NoSchedule\"
";

/// GPUs of a device plugin (an extended resource), on the default node
/// selector (`node-role.kubernetes.io/worker: \"\"`).
const GPU_WATERMARK: &str = "apiVersion: redhatcop.redhat.io/v1alpha1
kind: NodeScalingWatermark
metadata:
  name: gpus
spec:
  watermarkPercentage: 50
  pausePodSize:
    nvidia.com/gpu: 1
";

fn seed_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("redhatcop.redhat.io", "v1alpha1", "NodeScalingWatermark"),
        "nodescalingwatermarks",
    )
}

async fn node(admin: &kube::Client, name: &str, labels: Value) {
    crate::nodes::create_schedulable_node(admin, name)
        .await
        .unwrap();
    Api::<Node>::all(admin.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .unwrap();
}

/// A pod bound to `node` in `ns` requesting `requests` (limits equal, as
/// extended resources need).
async fn pod(
    admin: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    requests: Value,
    labels: Value,
) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.invalid/pause:1",
                 "resources": {"requests": requests, "limits": requests}}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create pod {ns}/{name}: {e}"));
}

async fn replicas(t: &TestCtx, name: &str) -> anyhow::Result<i32> {
    let d = Api::<Deployment>::namespaced(t.client.clone(), &t.ns)
        .get(name)
        .await?;
    d.spec.replicas.context("no replicas")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_samples_give_the_seeds_counts() {
    const NAME: &str = "seed_samples_give_the_seeds_counts";
    let opts = ControllerOpts {
        extra_args: vec![
            "--controllers=resourceclaim,headroom".into(),
            "--headroom-seed-watermarks=true".into(),
        ],
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated(NAME, opts, 0).await else {
        return;
    };
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    crate::headroom::install_crd(&admin).await;
    let seed_crd = crate::helm::chart_dir().join("files/seed-nodescalingwatermarks.yaml");
    crate::helm::apply_rendered(&admin, &std::fs::read_to_string(seed_crd).unwrap())
        .await
        .expect("the chart's seed CRD is accepted");
    let seeds: Api<DynamicObject> = Api::namespaced_with(t.client.clone(), &t.ns, &seed_resource());
    wait_for("the seed CRD served", WAIT, async || {
        seeds.list(&Default::default()).await?;
        Ok(())
    })
    .await;
    // The controller runs as the chart's RBAC with the seed on.
    if !crate::rbac::reapply_controller_rbac_or_skip(
        &t.client,
        NAME,
        &[
            ("headroom.enabled", "true"),
            ("headroom.seedOperator.enabled", "true"),
        ],
    )
    .await
    {
        return;
    }
    t.isolated_env().start_controller().await.unwrap();

    node(
        &admin,
        "zone-a1",
        json!({"topology.kubernetes.io/zone": "us-west-2a"}),
    )
    .await;
    node(
        &admin,
        "ai-ml-1",
        json!({"machine.openshift.io/cluster-api-machine-type": "ai-ml"}),
    )
    .await;
    node(
        &admin,
        "worker-1",
        json!({"node-role.kubernetes.io/worker": ""}),
    )
    .await;
    for ns in ["openshift-monitoring"] {
        Api::<Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await
            .unwrap();
    }
    let team = t.ns.clone();
    // Counted: 3 CPU, 1Gi on the zone node; 2 CPU, 4Gi on the ai-ml node;
    // 3 + 4 GPUs on the worker.
    pod(
        &admin,
        &team,
        "web",
        "zone-a1",
        json!({"cpu": "3", "memory": "1Gi"}),
        json!({}),
    )
    .await;
    pod(
        &admin,
        &team,
        "train",
        "ai-ml-1",
        json!({"cpu": "2", "memory": "4Gi"}),
        json!({}),
    )
    .await;
    pod(
        &admin,
        &team,
        "gpu-a",
        "worker-1",
        json!({"nvidia.com/gpu": "3"}),
        json!({}),
    )
    .await;
    pod(
        &admin,
        &team,
        "gpu-b",
        "worker-1",
        json!({"nvidia.com/gpu": "4"}),
        json!({}),
    )
    .await;
    // Not counted, each a rule of the seed (and the last one ours).
    for (ns, name) in [
        ("kube-system", "dns"),
        ("default", "app"),
        ("openshift-monitoring", "prom"),
    ] {
        pod(
            &admin,
            ns,
            name,
            "zone-a1",
            json!({"cpu": "8", "memory": "8Gi"}),
            json!({}),
        )
        .await;
    }
    pod(
        &admin,
        &team,
        "seed-pause",
        "zone-a1",
        json!({"cpu": "8", "memory": "8Gi"}),
        json!({"proactive-node-scaling-operator.redhat-cop.io/watermark": ""}),
    )
    .await;
    pod(
        &admin,
        &team,
        "done-job",
        "zone-a1",
        json!({"cpu": "8", "memory": "8Gi"}),
        json!({}),
    )
    .await;
    Api::<Pod>::namespaced(admin.clone(), &team)
        .patch_status(
            "done-job",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .unwrap();

    for manifest in [ZONE_SAMPLE, AI_ML_SAMPLE, GPU_WATERMARK] {
        let obj: DynamicObject = serde_yaml::from_str(manifest).unwrap();
        seeds.create(&PostParams::default(), &obj).await.unwrap();
    }
    // The seed's counts: floor(max over pausePodSize keys of used × % / 100 / size).
    // us-west-2a: 3 CPU × 20 % / 200m is 2.9999999999999996 in the seed's floating
    // point, so 2; ai-ml: 4Gi × 20 % / 200Mi = 4.096; gpus: 7 × 50 % / 1 = 3.5.
    for (name, want) in [("us-west-2a", 2), ("ai-ml", 4), ("gpus", 3)] {
        wait_for(&format!("{name}: {want} placeholders"), WAIT, async || {
            let got = replicas(&t, name).await?;
            ensure!(got == want, "{got}");
            Ok(())
        })
        .await;
    }
    let d = Api::<Deployment>::namespaced(t.client.clone(), &t.ns)
        .get("ai-ml")
        .await
        .unwrap();
    let pod_spec = d.spec.template.spec.unwrap();
    assert_eq!(
        pod_spec.tolerations.unwrap()[0].value.as_deref(),
        Some("ai-ml")
    );
    assert_eq!(
        pod_spec.priority_class_name.as_deref(),
        Some("proactive-node-autoscaling-pods")
    );
    wait_for("ReconcileSuccess", WAIT, async || {
        let wm = seeds.get("us-west-2a").await?;
        let ok = wm.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "ReconcileSuccess" && c["status"] == "True");
        ensure!(ok, "{}", wm.data["status"]);
        Ok(())
    })
    .await;
    // More workload moves the count (and nothing else does).
    pod(
        &admin,
        &team,
        "web-2",
        "zone-a1",
        json!({"cpu": "2"}),
        json!({}),
    )
    .await;
    wait_for("us-west-2a: 5 placeholders", WAIT, async || {
        let got = replicas(&t, "us-west-2a").await?;
        ensure!(got == 5, "{got}");
        Ok(())
    })
    .await;
    t.finish();
}
