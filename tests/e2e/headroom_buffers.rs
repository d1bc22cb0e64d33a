//! CapacityBuffers (`autoscaling.x-k8s.io`) with our provisioning strategy:
//! the buffer's pod shape becomes real placeholder pods (claims kept) in a
//! Deployment owned by the buffer, counted as the autoscaler counts, with
//! the autoscaler's status conditions; buffers of the autoscaler's own
//! strategy are left alone. (The CRD here is a minimal stand-in with the
//! autoscaler's names; the autoscaler itself is not needed.)

use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::wait_for;

const WAIT: Duration = Duration::from_secs(60);

/// The autoscaler's CapacityBuffer API, schema left open.
fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "capacitybuffers.autoscaling.x-k8s.io"},
        "spec": {"group": "autoscaling.x-k8s.io", "scope": "Namespaced",
            "names": {"kind": "CapacityBuffer", "listKind": "CapacityBufferList",
                      "plural": "capacitybuffers", "singular": "capacitybuffer"},
            "versions": [{"name": "v1beta1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]},
    })
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_buffers_with_our_strategy_get_placeholder_pods() {
    const NAME: &str = "capacity_buffers_with_our_strategy_get_placeholder_pods";
    let opts = ControllerOpts {
        extra_args: vec![
            "--controllers=resourceclaim,headroom".into(),
            "--headroom-capacity-buffers=true".into(),
        ],
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated(NAME, opts, 0).await else {
        return;
    };
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    crate::headroom::install_crd(&admin).await;
    crate::helm::apply_rendered(&admin, &serde_yaml::to_string(&crd()).unwrap())
        .await
        .unwrap();
    let buffers: Api<DynamicObject> = Api::namespaced_with(
        t.client.clone(),
        &t.ns,
        &resource(
            "autoscaling.x-k8s.io",
            "v1beta1",
            "CapacityBuffer",
            "capacitybuffers",
        ),
    );
    wait_for("the CapacityBuffer CRD served", WAIT, async || {
        buffers.list(&Default::default()).await?;
        Ok(())
    })
    .await;
    let applied = crate::rbac::reapply_controller_rbac(
        &t.client,
        &[
            ("headroom.enabled", "true"),
            ("headroom.capacityBuffers.enabled", "true"),
        ],
    )
    .await
    .unwrap();
    if !applied {
        println!("SKIP: {NAME}: Helm is not available to render the chart's RBAC");
        return;
    }
    t.isolated_env().start_controller().await.unwrap();

    // A DRA pod shape, as a PodTemplate and as a Deployment of 10.
    let pod_spec = json!({
        "nodeSelector": {"pool": "gpu"},
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        "containers": [{"name": "train", "image": "registry.invalid/trainer:1",
                        "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}}],
    });
    let templates: Api<DynamicObject> = Api::namespaced_with(
        t.client.clone(),
        &t.ns,
        &resource("", "v1", "PodTemplate", "podtemplates"),
    );
    templates
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "PodTemplate",
                "metadata": {"name": "trainer"}, "template": {"spec": pod_spec}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let trainer: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "trainer"},
        "spec": {"replicas": 10, "selector": {"matchLabels": {"app": "trainer"}},
                 "template": {"metadata": {"labels": {"app": "trainer"}}, "spec": pod_spec}},
    }))
    .unwrap();
    Api::<Deployment>::namespaced(t.client.clone(), &t.ns)
        .create(&PostParams::default(), &trainer)
        .await
        .unwrap();

    let buffer = |name: &str, strategy: &str, spec: Value| -> DynamicObject {
        let mut spec = spec;
        spec["provisioningStrategy"] = json!(strategy);
        serde_json::from_value(json!({"apiVersion": "autoscaling.x-k8s.io/v1beta1",
            "kind": "CapacityBuffer", "metadata": {"name": name}, "spec": spec}))
        .unwrap()
    };
    const OURS: &str = "dra-claim-controller.io/placeholder-pods";
    for b in [
        buffer(
            "by-template",
            OURS,
            json!({"podTemplateRef": {"name": "trainer"}, "replicas": 2}),
        ),
        buffer(
            "by-scalable",
            OURS,
            json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "trainer"},
                   "percentage": 25}),
        ),
        buffer(
            "theirs",
            "buffer.x-k8s.io/active-capacity",
            json!({"podTemplateRef": {"name": "trainer"}, "replicas": 2}),
        ),
    ] {
        buffers.create(&PostParams::default(), &b).await.unwrap();
    }

    let deployments: Api<Deployment> = Api::namespaced(t.client.clone(), &t.ns);
    // 2 replicas; 25 % of 10, rounded up: 3.
    for (name, want) in [("by-template", 2), ("by-scalable", 3)] {
        let placeholders = format!("{name}-placeholders");
        let d = wait_for(&format!("{placeholders}: {want}"), WAIT, async || {
            let d = deployments.get(&placeholders).await?;
            ensure!(d.spec.replicas == Some(want), "{:?}", d.spec.replicas);
            Ok(d)
        })
        .await;
        let spec = d.spec.template.spec.clone().unwrap();
        assert_eq!(
            spec.resource_claims.as_ref().unwrap()[0]
                .resource_claim_template_name
                .as_deref(),
            Some("one-gpu"),
            "the placeholders keep the claims"
        );
        assert!(
            spec.containers[0]
                .image
                .as_deref()
                .unwrap()
                .contains("pause")
        );
        assert_eq!(spec.priority_class_name.as_deref(), Some("dra-headroom"));
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("CapacityBuffer", name)
        );
        let status = wait_for(&format!("{name}: status"), WAIT, async || {
            let b = buffers.get(name).await?;
            let conditions = b.data["status"]["conditions"]
                .as_array()
                .cloned()
                .context("none yet")?;
            ensure!(conditions.len() == 2, "{conditions:?}");
            Ok(b.data["status"].clone())
        })
        .await;
        assert_eq!(status["replicas"], want);
        assert_eq!(status["conditions"][0]["type"], "ReadyForProvisioning");
        assert_eq!(status["conditions"][0]["status"], "True");
        assert_eq!(status["conditions"][1]["type"], "Provisioning");
    }
    // The autoscaler's own buffer is the autoscaler's.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(deployments.get("theirs-placeholders").await.is_err());
    assert!(buffers.get("theirs").await.unwrap().data["status"].is_null());

    // Deleting a buffer removes what it made: kube-controller-manager's
    // garbage collector follows the owner reference.
    if let Some(kcm) = crate::reference::binary_or_skip(NAME) {
        let cluster = &t.isolated_env().cluster;
        let _gc =
            crate::reference::Reference::start_controllers(&kcm, cluster, &["garbagecollector"])
                .await
                .unwrap();
        buffers
            .delete("by-template", &Default::default())
            .await
            .unwrap();
        wait_for("the buffer's Deployment collected", WAIT, async || {
            ensure!(
                deployments.get("by-template-placeholders").await.is_err(),
                "still there"
            );
            Ok(())
        })
        .await;
    }
    t.finish();
}
