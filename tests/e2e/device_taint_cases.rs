//! kube-controller-manager's `TestController` cases that need a running
//! system, played against the real API server side by side: each case has
//! a pool of its own, sets up a pod on a device, changes what the case
//! changes, and ends with what a user sees (the pod evicted, or kept; a
//! cancelled eviction's event). (`no-evict-wrong-pod` has no running
//! counterpart: there the claim controller reserves an allocated claim for
//! the scheduled pod that names it, as kube-controller-manager's does, and
//! the pod is rightly evicted; its unit row stays.)

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::ctx::TestCtx;
use crate::device_taints::{
    DRIVER, TAINT_KEY, ensure_evicted, ensure_untouched, eviction_events, no_execute,
    pod_on_device, publish,
};
use crate::k8s::*;

const TIMEOUT: Duration = Duration::from_secs(30);

fn taint(key: &str, value: &str, effect: &str) -> Value {
    json!({"key": key, "value": value, "effect": effect})
}

fn tolerate(key: &str, operator: &str, value: Option<&str>, seconds: Option<i64>) -> Value {
    let mut t = json!({"key": key, "operator": operator, "effect": "NoExecute"});
    if let Some(v) = value {
        t["value"] = json!(v);
    }
    if let Some(s) = seconds {
        t["tolerationSeconds"] = json!(s);
    }
    t
}

/// The pool (and slice) of one case.
fn pool_of(t: &TestCtx, case: &str) -> String {
    format!("{}-{case}", t.ns)
}

/// Replaces the taints of `device` in the case's slice.
async fn retaint(t: &TestCtx, pool: &str, device: &str, taints: Value) {
    let slices: Api<ResourceSlice> = Api::all(t.client.clone());
    let mut slice = slices.get(pool).await.expect("read slice");
    for d in slice.spec.devices.iter_mut().flatten() {
        if d.name == device {
            d.taints = serde_json::from_value(taints.clone()).unwrap();
        }
    }
    slices
        .replace(pool, &PostParams::default(), &slice)
        .await
        .expect("replace slice");
}

/// The cases whose pods must end evicted, and those that must be kept;
/// set-up of every case first, then the changes, then the outcomes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_cases_on_a_real_api_server() {
    let Some(t) = TestCtx::shared("upstream_cases_on_a_real_api_server").await else {
        return;
    };
    // evict-pod-resourceclaimtemplate: the claim made from a template by
    // the claim controller, recorded in the pod's status.
    let pool = pool_of(&t, "template");
    publish(&t, &pool, &[("d0", no_execute())]).await;
    t.create_template("tmpl").await;
    let pod = t
        .create_pod("template", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    let claim = t.wait_recorded("template", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    let allocation = json!({"devices": {"results": [{
        "request": "req-0", "driver": DRIVER, "pool": pool, "device": "d0"}]}});
    t.allocate_devices(&claim, allocation, json!([pod_ref(&pod)]))
        .await;
    t.bind_pod("template", NODE).await;

    // eviction-change-taint: tolerated forever for value "a", then the
    // taint's value becomes "b".
    let change = pool_of(&t, "change");
    publish(
        &t,
        &change,
        &[("d0", json!([taint(TAINT_KEY, "a", "NoExecute")]))],
    )
    .await;
    pod_on_device(
        &t,
        "change-taint",
        &change,
        "d0",
        json!([tolerate(TAINT_KEY, "Equal", Some("a"), None)]),
    )
    .await;

    // evict-pod-partial-toleration: two taints, one tolerated forever.
    let partial = pool_of(&t, "partial");
    publish(
        &t,
        &partial,
        &[(
            "d0",
            json!([taint("k1", "x", "NoExecute"), taint("k2", "x", "NoExecute")]),
        )],
    )
    .await;
    pod_on_device(
        &t,
        "partial-toleration",
        &partial,
        "d0",
        json!([tolerate("k1", "Exists", None, None)]),
    )
    .await;

    // evict-pod-later-many: the smallest tolerationSeconds (3) wins.
    let many = pool_of(&t, "many");
    publish(&t, &many, &[("d0", no_execute())]).await;
    pod_on_device(
        &t,
        "later-many",
        &many,
        "d0",
        json!([
            tolerate(TAINT_KEY, "Exists", None, Some(3600)),
            tolerate(TAINT_KEY, "Exists", None, Some(3))
        ]),
    )
    .await;

    // no-evict-pod-toleration-forever-many: forever beats 3 s.
    let forever = pool_of(&t, "forever");
    publish(&t, &forever, &[("d0", no_execute())]).await;
    pod_on_device(
        &t,
        "forever-many",
        &forever,
        "d0",
        json!([
            tolerate(TAINT_KEY, "Exists", None, Some(3)),
            tolerate(TAINT_KEY, "Exists", None, None)
        ]),
    )
    .await;

    // ignore-none-effect.
    let none = pool_of(&t, "none");
    publish(&t, &none, &[("d0", json!([taint(TAINT_KEY, "x", "None")]))]).await;
    pod_on_device(&t, "none-effect", &none, "d0", json!([])).await;

    // evict-pod-toleration-mismatch: a toleration for another key does not
    // help.
    let mismatch = pool_of(&t, "mismatch");
    publish(&t, &mismatch, &[("d0", no_execute())]).await;
    pod_on_device(
        &t,
        "toleration-mismatch",
        &mismatch,
        "d0",
        json!([tolerate("other", "Exists", None, None)]),
    )
    .await;

    // cancel-eviction-remove-slice and no-evict-resourceclaim-deallocated:
    // tolerated for 8 s, then the slice goes / the claim is deallocated.
    let gone = pool_of(&t, "gone");
    publish(&t, &gone, &[("d0", no_execute())]).await;
    pod_on_device(
        &t,
        "slice-removed",
        &gone,
        "d0",
        json!([tolerate(TAINT_KEY, "Exists", None, Some(8))]),
    )
    .await;
    let dealloc = pool_of(&t, "dealloc");
    publish(&t, &dealloc, &[("d0", no_execute())]).await;
    pod_on_device(
        &t,
        "deallocated",
        &dealloc,
        "d0",
        json!([tolerate(TAINT_KEY, "Exists", None, Some(8))]),
    )
    .await;

    // The changes.
    retaint(
        &t,
        &change,
        "d0",
        json!([taint(TAINT_KEY, "b", "NoExecute")]),
    )
    .await;
    let slices: Api<ResourceSlice> = Api::all(t.client.clone());
    slices
        .delete(&gone, &DeleteParams::default())
        .await
        .expect("delete slice");
    t.claims()
        .patch_status(
            "deallocated",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": null, "reservedFor": null}})),
        )
        .await
        .expect("deallocate");

    let evicted = [
        "template",
        "change-taint",
        "partial-toleration",
        "later-many",
        "toleration-mismatch",
    ];
    wait_for(
        "the pods of the evicting cases evicted",
        TIMEOUT,
        async || {
            for pod in evicted {
                ensure_evicted(t.pods().get_opt(pod).await?.as_ref())
                    .map_err(|e| anyhow::anyhow!("{pod}: {e:#}"))?;
            }
            Ok(())
        },
    )
    .await;
    // Past the 8 s the cancelled ones tolerated.
    holds_for(
        "the pods of the other cases kept",
        Duration::from_secs(10),
        async || {
            for pod in [
                "forever-many",
                "none-effect",
                "slice-removed",
                "deallocated",
            ] {
                ensure_untouched(&t.pods().get(pod).await?)
                    .map_err(|e| anyhow::anyhow!("{pod}: {e:#}"))?;
            }
            Ok(())
        },
    )
    .await;
    for pod in ["slice-removed", "deallocated"] {
        let events = eviction_events(&t, pod).await.unwrap();
        assert!(
            events.iter().any(|m| m == "Cancelling deletion"),
            "{pod}: events {events:?}"
        );
    }
    t.finish();
}

/// `evict-pod-resourceclaim-podgroup` and
/// `no-evict-pod-in-podgroup-without-claim` (DRAWorkloadResourceClaims):
/// the PodGroup's claim, reserved for the group, is allocated a tainted
/// device; its bound members go, a member of the group that does not use
/// the claim stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_pod_resourceclaim_podgroup() {
    use crate::podgroups::{ENTRY, GROUP, apiserver, create_group, create_member, gates};
    let opts = crate::cluster::ControllerOpts {
        feature_gates: gates(),
        ..Default::default()
    };
    const NAME: &str = "evict_pod_resourceclaim_podgroup";
    let Some(mut t) = TestCtx::isolated_with(NAME, opts, 0, &apiserver()).await else {
        return;
    };
    if !crate::podgroups::start_with_gate_rbac(&mut t, NAME, &gates()).await {
        return;
    }
    let pool = pool_of(&t, "group");
    publish(&t, &pool, &[("d0", no_execute())]).await;
    t.create_template("tmpl").await;
    create_group(&t).await;
    for pod in ["member-1", "member-2"] {
        create_member(&t, pod).await;
    }
    let claim = wait_for("members record the group's claim", TIMEOUT, async || {
        let mut names = Vec::new();
        for pod in ["member-1", "member-2"] {
            let recorded = recorded(&t.pod(pod).await);
            names.push(recorded.get(ENTRY).cloned().flatten().unwrap_or_default());
        }
        anyhow::ensure!(!names[0].is_empty() && names[0] == names[1], "{names:?}");
        Ok(names[0].clone())
    })
    .await;
    // A member without claims of its own.
    let mut outsider = pod_manifest("outsider", &[], None);
    outsider["spec"]["schedulingGroup"] = json!({"podGroupName": GROUP});
    t.pods()
        .create(
            &PostParams::default(),
            &serde_json::from_value(outsider).unwrap(),
        )
        .await
        .expect("create outsider");
    let allocation = json!({"devices": {"results": [{
        "request": "req-0", "driver": DRIVER, "pool": pool, "device": "d0"}]}});
    t.allocate_devices(&claim, allocation, json!([])).await;
    for pod in ["member-1", "member-2", "outsider"] {
        t.bind_pod(pod, NODE).await;
    }
    wait_for(
        "the members using the group's claim evicted",
        TIMEOUT,
        async || {
            for pod in ["member-1", "member-2"] {
                ensure_evicted(t.pods().get_opt(pod).await?.as_ref())
                    .map_err(|e| anyhow::anyhow!("{pod}: {e:#}"))?;
            }
            Ok(())
        },
    )
    .await;
    holds_for(
        "the member without the claim kept",
        Duration::from_secs(3),
        async || ensure_untouched(&t.pods().get("outsider").await?),
    )
    .await;
    t.finish();
}
