//! The chart against the API server's own admission: the controller's pod,
//! as the chart renders it, is admitted into a namespace that enforces the
//! Pod Security Standard `restricted`, with the chart's fixed UID and with
//! the UID left to the platform (OpenShift's restricted-v2 assigns its
//! own); and the CRD upgrade step of the chart's README keeps working.

use anyhow::ensure;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;

/// The Deployment's pod, rendered with `set`, as a Pod in `namespace`.
fn chart_pod(namespace: &str, set: &[(&str, &str)]) -> Option<Pod> {
    let rendered = crate::helm::render_chart("dra", namespace, set)
        .unwrap_or_else(|e| panic!("render: {e}"))?;
    let deployment = crate::helm::parse_documents(&rendered)
        .unwrap()
        .into_iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))
        .expect("a Deployment");
    let template = &deployment["spec"]["template"];
    let pod = json!({
        "metadata": {"name": "controller", "namespace": namespace,
                     "labels": serde_json::to_value(&template["metadata"]["labels"]).unwrap()},
        "spec": serde_json::to_value(&template["spec"]).unwrap(),
    });
    Some(serde_json::from_value(pod).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_passes_pod_security_restricted() {
    const NAME: &str = "the_chart_passes_pod_security_restricted";
    let Some(t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let namespaces: Api<Namespace> = Api::all(t.client.clone());
    let ns = format!("{}-restricted", t.ns);
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let platform_uid = [
        ("podSecurityContext.runAsUser", "null"),
        ("podSecurityContext.runAsGroup", "null"),
        ("podSecurityContext.fsGroup", "null"),
        ("containerSecurityContext.runAsUser", "null"),
        ("containerSecurityContext.runAsGroup", "null"),
    ];
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &ns);
    for (case, set) in [
        ("the chart's UID", &[][..]),
        ("the platform's UID", &platform_uid[..]),
    ] {
        let Some(mut pod) = chart_pod(&ns, set) else {
            println!("SKIP: {NAME}: Helm is not available to render the chart");
            return;
        };
        pod.metadata.name = Some(format!("controller-{}", set.len()));
        // The ServiceAccount is the chart's; admission only needs the pod.
        if let Some(spec) = pod.spec.as_mut() {
            spec.service_account_name = None;
        }
        pods.create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("{case}: refused by Pod Security restricted: {e}"));
    }
    // And a pod that breaks the standard is refused there: the check is on.
    // (No securityContext at all: root allowed, capabilities kept.)
    let plain: Pod = serde_json::from_value(json!({
        "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
    }))
    .unwrap();
    let refused = pods.create(&PostParams::default(), &plain).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "{refused:?}"
    );
    t.finish();
}

/// The chart README's CRD upgrade step (`kubectl apply --server-side -f
/// crds/`): applied over an older CRD it serves the new schema, and
/// watermarks already stored survive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crd_upgrades_in_place() {
    const NAME: &str = "the_crd_upgrades_in_place";
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    let path = crate::helm::chart_dir().join("crds/nodescalingwatermarks.yaml");
    let current = std::fs::read_to_string(path).unwrap();
    // An older CRD: pausePodSize knew cpu and memory only (the rest pruned).
    let mut older: serde_json::Value = serde_yaml::from_str(&current).unwrap();
    older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["pausePodSize"] = json!({"type": "object", "properties": {
            "cpu": {"x-kubernetes-int-or-string": true},
            "memory": {"x-kubernetes-int-or-string": true}}});
    crate::helm::apply_rendered(&admin, &serde_yaml::to_string(&older).unwrap())
        .await
        .unwrap();
    let watermarks: Api<DynamicObject> = Api::namespaced_with(
        t.client.clone(),
        &t.ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(
                "dra-claim-controller.io",
                "v1alpha1",
                "NodeScalingWatermark",
            ),
            "nodescalingwatermarks",
        ),
    );
    let create = |name: &str| {
        serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": "dra-claim-controller.io/v1alpha1", "kind": "NodeScalingWatermark",
            "metadata": {"name": name},
            "spec": {"watermarkPercentage": 20, "pausePodSize": {"cpu": "1", "nvidia.com/gpu": "1"}},
        }))
        .unwrap()
    };
    crate::k8s::wait_for("the older CRD served", crate::k8s::TIMEOUT, async || {
        watermarks.list(&Default::default()).await?;
        Ok(())
    })
    .await;
    watermarks
        .create(&PostParams::default(), &create("before"))
        .await
        .unwrap();
    let before = watermarks.get("before").await.unwrap();
    assert!(
        before.data["spec"]["pausePodSize"]
            .get("nvidia.com/gpu")
            .is_none(),
        "the older schema prunes what it does not know"
    );
    // The upgrade step: server-side apply of the chart's crds/.
    crate::helm::apply_rendered(&admin, &current).await.unwrap();
    crate::k8s::wait_for("the new schema served", crate::k8s::TIMEOUT, async || {
        let _ = watermarks.delete("after", &Default::default()).await;
        watermarks
            .create(&PostParams::default(), &create("after"))
            .await?;
        let after = watermarks.get("after").await?;
        ensure!(
            after.data["spec"]["pausePodSize"]["nvidia.com/gpu"] == "1",
            "{}",
            after.data["spec"]
        );
        Ok(())
    })
    .await;
    assert!(
        watermarks.get("before").await.is_ok(),
        "stored watermarks survive"
    );
    t.finish();
}

/// `check-release` (the chart's `helm test`) against a running controller:
/// the Lease held and renewed and /metrics answering pass; no pods of the
/// selector fail; once the controller is gone, its Lease goes stale and
/// the check says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_release_tells_a_working_controller_from_a_stuck_one() {
    const NAME: &str = "check_release_tells_a_working_controller_from_a_stuck_one";
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 1).await else {
        return;
    };
    let kubeconfig = t.isolated_env().cluster.admin_kubeconfig.clone();
    let metrics = format!("http://{}/metrics", t.controller().metrics);
    let check = || {
        let (kubeconfig, metrics) = (kubeconfig.clone(), metrics.clone());
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_dra-claim-controller"))
                .args(["check-release", "--kubeconfig"])
                .arg(&kubeconfig)
                .args([
                    "-n",
                    crate::rbac::SYSTEM_NAMESPACE,
                    "--lease",
                    crate::rbac::LEASE_NAME,
                    "--metrics-url",
                    &metrics,
                ])
                .output()
                .await
                .unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        }
    };
    let (code, out) = crate::k8s::wait_for("the Lease held", crate::k8s::TIMEOUT, async || {
        let (code, out) = check().await;
        ensure!(out.contains("ok:   Lease"), "{out}");
        Ok((code, out))
    })
    .await;
    assert!(out.contains("ok:   http://"), "{out}");
    assert!(
        out.contains("FAIL: 0 of 0 pod(s)"),
        "the controller runs as a process here: {out}"
    );
    assert_eq!(code, Some(1), "{out}");

    t.replica(0).kill();
    crate::k8s::wait_for("the Lease stale", crate::k8s::TIMEOUT, async || {
        let (_, out) = check().await;
        ensure!(out.contains("FAIL: Lease"), "{out}");
        Ok(())
    })
    .await;
    t.finish();
}
