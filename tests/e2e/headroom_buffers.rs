//! CapacityBuffers (`autoscaling.x-k8s.io`) with our provisioning strategy:
//! the buffer's pod shape becomes real placeholder pods (claims kept) in a
//! Deployment owned by the buffer, counted as the autoscaler counts, with
//! the autoscaler's status conditions; the placeholders are scheduled and
//! hold allocated devices, and yield them to a pod of higher priority;
//! buffers of the autoscaler's own strategy are left alone. The door opens
//! when the CRD arrives after the controller started, which runs claims
//! meanwhile. (The CRD here is a minimal stand-in with the autoscaler's
//! names; the autoscaler itself is in `headroom_autoscaler.rs`.)

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::{Source, wait_for};

const WAIT: Duration = Duration::from_secs(60);
const DRIVER: &str = "gpu.example.com";

/// The autoscaler's CapacityBuffer API, schema left open.
pub(crate) fn crd() -> Value {
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

pub(crate) fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// The CapacityBuffers of the test's namespace.
pub(crate) fn buffers_api(t: &TestCtx) -> Api<DynamicObject> {
    Api::namespaced_with(
        t.client.clone(),
        &t.ns,
        &resource(
            "autoscaling.x-k8s.io",
            "v1beta1",
            "CapacityBuffer",
            "capacitybuffers",
        ),
    )
}

/// A CapacityBuffer `name` of `strategy` with `spec`.
pub(crate) fn buffer(name: &str, strategy: &str, spec: Value) -> DynamicObject {
    let mut spec = spec;
    spec["provisioningStrategy"] = json!(strategy);
    serde_json::from_value(json!({"apiVersion": "autoscaling.x-k8s.io/v1beta1",
        "kind": "CapacityBuffer", "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

pub(crate) const OURS: &str = "dra-claim-controller.io/placeholder-pods";

/// The PodTemplate `name` of a pod asking one device through the claim
/// template `one-gpu`, with `node_selector`.
pub(crate) async fn device_pod_template(t: &TestCtx, name: &str, node_selector: Value) -> Value {
    let pod_spec = json!({
        "nodeSelector": node_selector,
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        "containers": [{"name": "train", "image": "registry.invalid/trainer:1",
                        "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]}}],
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
                "metadata": {"name": name}, "template": {"spec": pod_spec}}))
            .unwrap(),
        )
        .await
        .unwrap();
    pod_spec
}

/// Waits until the buffer `buffer` has `want` placeholder pods, each bound
/// to a node with its claim allocated and reserved for it; returns them.
pub(crate) async fn wait_buffer_placeholders_hold_devices(
    t: &TestCtx,
    buffer: &str,
    want: usize,
    within: Duration,
) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    let claims: Api<ResourceClaim> = Api::namespaced(t.client.clone(), &t.ns);
    let label = format!(
        "{}=cb.{buffer}",
        dra_claim_controller::naming::WATERMARK_LABEL
    );
    wait_for(
        &format!("{want} placeholders of buffer {buffer} bound with allocated devices"),
        within,
        async || {
            let placeholders: Vec<Pod> = pods
                .list(&ListParams::default().labels(&label))
                .await?
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            ensure!(
                placeholders.len() == want,
                "{} placeholders",
                placeholders.len()
            );
            let claims = claims.list(&ListParams::default()).await?.items;
            for p in &placeholders {
                let name = p.metadata.name.clone().unwrap_or_default();
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                ensure!(node.is_some(), "{name} not bound");
                let uid = p.metadata.uid.clone().unwrap_or_default();
                let held = claims.iter().any(|c| {
                    let status = c.status.as_ref();
                    status.and_then(|s| s.allocation.as_ref()).is_some()
                        && status
                            .and_then(|s| s.reserved_for.as_ref())
                            .is_some_and(|r| r.iter().any(|r| r.uid == uid))
                });
                ensure!(held, "{name} holds no allocated claim");
            }
            Ok(placeholders)
        },
    )
    .await
}

/// Our strategy end to end: the controller starts before the buffer CRD
/// (claims are created meanwhile and `/readyz` names the closed door),
/// the door opens once the CRD arrives, both kinds of reference are
/// counted as the autoscaler counts, every placeholder is scheduled with
/// its device allocated, a pod of higher priority binds through their
/// yield, the autoscaler's own strategy is left alone, and deleting a
/// buffer takes what it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_buffers_with_our_strategy_get_placeholder_pods() {
    const NAME: &str = "capacity_buffers_with_our_strategy_get_placeholder_pods";
    let Some(scheduler_bin) = crate::scheduler::binary_or_skip(NAME) else {
        return;
    };
    let Some(kcm_bin) = crate::reference::binary_or_skip(NAME) else {
        return;
    };
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
    crate::headroom::priority_classes(&admin).await;
    crate::nodes::create_device_class(&admin, DRIVER)
        .await
        .unwrap();
    for node in ["gpu-1", "gpu-2"] {
        crate::headroom::node_in_pool(&admin, node, "gpu").await;
        crate::nodes::create_devices(&admin, DRIVER, node, 4)
            .await
            .unwrap();
    }
    crate::headroom::one_device_template(&t, "one-gpu", DRIVER).await;
    if !crate::rbac::reapply_controller_rbac_or_skip(
        &t.client,
        NAME,
        &[
            ("headroom.enabled", "true"),
            ("headroom.capacityBuffers.enabled", "true"),
        ],
    )
    .await
    {
        return;
    }
    let (_scheduler, _kcm) = crate::headroom::scheduler_and_workload_controllers(
        &t.isolated_env().cluster,
        &scheduler_bin,
        &kcm_bin,
    )
    .await;
    // No CapacityBuffer CRD yet: the process runs, claims are made, and
    // /readyz says the door is closed.
    t.isolated_env().start_controller().await.unwrap();
    t.create_template("early-template").await;
    t.create_pod(
        "early",
        &[("gpu", Source::Template("early-template"))],
        None,
    )
    .await;
    t.wait_recorded("early", &["gpu"]).await;
    t.pods().delete("early", &Default::default()).await.unwrap();
    let health = t.controller().health;
    let ready = wait_for("/readyz to name the closed door", WAIT, async || {
        let (code, body) = crate::rawhttp::get(health, "/readyz").await?;
        ensure!(
            code == 200 && body.contains("capacitybuffers.autoscaling.x-k8s.io: closed"),
            "{code} {body}"
        );
        Ok(body)
    })
    .await;
    println!("READYZ: {NAME}: {ready:?}");
    assert_eq!(t.restarts(), 0, "a missing CRD never stops the process");

    crate::helm::apply_rendered(&admin, &serde_yaml::to_string(&crd()).unwrap())
        .await
        .unwrap();
    let crd_applied = Instant::now();
    let buffers = buffers_api(&t);
    wait_for("the CapacityBuffer CRD served", WAIT, async || {
        buffers.list(&Default::default()).await?;
        Ok(())
    })
    .await;

    // A DRA pod shape, as a PodTemplate and as a Deployment of 4.
    let pod_spec = device_pod_template(&t, "trainer", json!({"pool": "gpu"})).await;
    let trainer: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "trainer"},
        "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "trainer"}},
                 "template": {"metadata": {"labels": {"app": "trainer"}}, "spec": pod_spec}},
    }))
    .unwrap();
    Api::<Deployment>::namespaced(t.client.clone(), &t.ns)
        .create(&PostParams::default(), &trainer)
        .await
        .unwrap();
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
    wait_for("the first buffer's Deployment", WAIT, async || {
        deployments.get("by-template-placeholders").await?;
        Ok(())
    })
    .await;
    let door_opened = crd_applied.elapsed();
    // 2 replicas; 25 % of 4: 1.
    for (name, want) in [("by-template", 2), ("by-scalable", 1)] {
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
        // What a user sees: the placeholders scheduled, devices held.
        wait_buffer_placeholders_hold_devices(&t, name, want as usize, WAIT).await;
    }
    println!(
        "E2E figure: {NAME}: CapacityBuffer door open and first placeholders applied {:.1} s after the CRD was applied",
        door_opened.as_secs_f64()
    );
    assert!(
        door_opened < Duration::from_secs(10),
        "the door opened {door_opened:?} after the CRD arrived"
    );

    // 4 trainers + 3 placeholders leave 1 of 8 devices: two pods of
    // priority 1000 bind, the second through a placeholder's yield.
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    wait_for("the 4 trainers bound", WAIT, async || {
        let trainers = pods
            .list(&ListParams::default().labels("app=trainer"))
            .await?;
        let bound = trainers
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count();
        ensure!(bound == 4, "{bound} bound");
        Ok(())
    })
    .await;
    crate::headroom::gpu_job_template(&t, DRIVER).await;
    let started = Instant::now();
    for job in ["job-1", "job-2"] {
        crate::headroom::gpu_job(&pods, job).await;
    }
    wait_for("both jobs bound", WAIT, async || {
        for job in ["job-1", "job-2"] {
            ensure!(
                crate::headroom::bound_to(&pods, job).await?.is_some(),
                "{job} not bound"
            );
        }
        Ok(())
    })
    .await;
    println!(
        "E2E figure: {NAME}: two priority-1000 pods bound {:.2} s after creation, one through a buffer placeholder's yield",
        started.elapsed().as_secs_f64()
    );
    assert!(
        crate::headroom::devices_in_two_claims(&t).await.is_empty(),
        "no device in two claims"
    );
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(t.client.clone(), &t.ns);
    wait_for("the PlaceholdersYielded event", WAIT, async || {
        let list = events.list(&Default::default()).await?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("PlaceholdersYielded"))
            .context("no event yet")
    })
    .await;

    // A buffer follows its sources within seconds (watched, not polled):
    // the PodTemplate's requests, the scalable object's replicas.
    let templates: Api<DynamicObject> = Api::namespaced_with(
        t.client.clone(),
        &t.ns,
        &resource("", "v1", "PodTemplate", "podtemplates"),
    );
    let changed = Instant::now();
    templates
        .patch(
            "trainer",
            &PatchParams::default(),
            &Patch::Merge(json!({"template": {"spec": {"containers": [
                {"name": "train", "image": "registry.invalid/trainer:1",
                 "resources": {"requests": {"cpu": "200m"}, "claims": [{"name": "gpu"}]}}]}}})),
        )
        .await
        .unwrap();
    wait_for(
        "by-template follows its PodTemplate",
        Duration::from_secs(10),
        async || {
            let d = deployments.get("by-template-placeholders").await?;
            let spec = d.spec.template.spec.context("no spec")?;
            let cpu = spec.containers[0]
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("cpu"))
                .map(|q| q.0.clone());
            ensure!(cpu.as_deref() == Some("200m"), "cpu {cpu:?}");
            Ok(())
        },
    )
    .await;
    let template_followed = changed.elapsed();
    let changed = Instant::now();
    Api::<Deployment>::namespaced(t.client.clone(), &t.ns)
        .patch(
            "trainer",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    wait_for(
        "by-scalable follows its Deployment",
        Duration::from_secs(10),
        async || {
            let d = deployments.get("by-scalable-placeholders").await?;
            ensure!(d.spec.replicas == Some(0), "{:?}", d.spec.replicas);
            Ok(())
        },
    )
    .await;
    println!(
        "E2E figure: {NAME}: a PodTemplate change reached its buffer's placeholders in {:.2} s, a Deployment scaled to 0 in {:.2} s",
        template_followed.as_secs_f64(),
        changed.elapsed().as_secs_f64()
    );

    // The autoscaler's own buffer is the autoscaler's.
    assert!(deployments.get("theirs-placeholders").await.is_err());
    assert!(buffers.get("theirs").await.unwrap().data["status"].is_null());

    // Deleting a buffer removes what it made: kube-controller-manager's
    // garbage collector follows the owner reference.
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
    t.finish();
}
