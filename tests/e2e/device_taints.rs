//! The device-taint eviction controller against a real API server: what a
//! user sees when a device goes bad. Test names carry the names of
//! kube-controller-manager's `TestController` cases they play out.
//!
//! Without a kubelet a deleted pod stays Terminating (nobody confirms the
//! deletion), which is what lets these tests read what the eviction wrote:
//! the pod's `deletionTimestamp`, its `DisruptionTarget` condition, the
//! Normal events.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::cluster::{ALL_CONTROLLER_GATES, ApiserverOptions, ControllerOpts};
use crate::ctx::TestCtx;
use crate::k8s::*;

pub const DRIVER: &str = "test.example.com";
const TIMEOUT: Duration = Duration::from_secs(30);
pub const TAINT_KEY: &str = "example.com/unhealthy";

/// A slice on [`NODE`] publishing `devices` (name, taints) in `pool`.
pub async fn publish(t: &TestCtx, pool: &str, devices: &[(&str, Value)]) -> ResourceSlice {
    publish_in(t, pool, pool, devices).await
}

/// [`publish`] as the slice `name`.
async fn publish_in(
    t: &TestCtx,
    name: &str,
    pool: &str,
    devices: &[(&str, Value)],
) -> ResourceSlice {
    let slices: Api<ResourceSlice> = Api::all(t.client.clone());
    let slice = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "nodeName": NODE,
            "devices": devices.iter().map(|(name, taints)| json!({"name": name, "taints": taints})).collect::<Vec<_>>(),
        },
    });
    slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(slice).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("create slice {name}: {e}"))
}

pub fn no_execute() -> Value {
    json!([{"key": TAINT_KEY, "value": "true", "effect": "NoExecute"}])
}

/// A scheduled pod `name` using claim `name`, allocated `device` of `pool`
/// with `tolerations`, reserved for the pod.
pub async fn pod_on_device(
    t: &TestCtx,
    name: &str,
    pool: &str,
    device: &str,
    tolerations: Value,
) -> Pod {
    t.create_claim(json!({"name": name})).await;
    let pod = t
        .create_pod(name, &[("gpu", Source::Claim(name))], None)
        .await;
    let allocation = json!({"devices": {"results": [{
        "request": "req-0", "driver": DRIVER, "pool": pool, "device": device,
        "tolerations": tolerations,
    }]}});
    t.allocate_devices(name, allocation, json!([pod_ref(&pod)]))
        .await;
    t.bind_pod(name, NODE).await;
    pod
}

/// The pod was evicted as kube-controller-manager evicts: being deleted,
/// with the `DisruptionTarget` condition of the device-taint manager.
pub fn ensure_evicted(pod: Option<&Pod>) -> anyhow::Result<()> {
    let Some(pod) = pod else {
        return Ok(());
    };
    ensure!(
        pod.metadata.deletion_timestamp.is_some(),
        "{} is not being deleted",
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let c = conditions
        .iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .context("no DisruptionTarget condition")?;
    ensure!(
        c.status == "True" && c.reason.as_deref() == Some("DeletionByDeviceTaintManager"),
        "DisruptionTarget: {c:?}"
    );
    Ok(())
}

pub fn ensure_untouched(pod: &Pod) -> anyhow::Result<()> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    ensure!(
        pod.metadata.deletion_timestamp.is_none(),
        "{name} is being deleted"
    );
    let disrupted = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "DisruptionTarget"));
    ensure!(!disrupted, "{name} got a DisruptionTarget condition");
    Ok(())
}

/// The messages of the Normal `DeviceTaintManagerEviction` events of a pod.
pub async fn eviction_events(t: &TestCtx, pod: &str) -> anyhow::Result<Vec<String>> {
    Ok(t.events_of(pod, "Normal", "DeviceTaintManagerEviction")
        .await?
        .into_iter()
        .filter_map(|e| e.message)
        .collect())
}

/// `evict-pod-resourceclaim`, `no-evict-pod-not-scheduled`,
/// `no-evict-pod-toleration-forever`, `no-evict-other-device`: of four pods
/// on one driver's pool, only the scheduled one on the tainted device with
/// no toleration is evicted, with the condition and event a user reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_pod_resourceclaim_and_spare_the_rest() {
    let Some(t) = TestCtx::shared("evict_pod_resourceclaim_and_spare_the_rest").await else {
        return;
    };
    let pool = t.ns.clone();
    publish(
        &t,
        &pool,
        &[
            ("bad", no_execute()),
            ("bad-2", no_execute()),
            ("good", json!([])),
        ],
    )
    .await;
    let forever = json!([{"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}]);
    pod_on_device(&t, "evicted", &pool, "bad", json!([])).await;
    pod_on_device(&t, "tolerates", &pool, "bad-2", forever).await;
    pod_on_device(&t, "healthy", &pool, "good", json!([])).await;
    // Allocated the tainted device but never scheduled: not evicted.
    t.create_claim(json!({"name": "unscheduled"})).await;
    let unscheduled = t
        .create_pod(
            "unscheduled",
            &[("gpu", Source::Claim("unscheduled"))],
            None,
        )
        .await;
    let allocation = json!({"devices": {"results": [{
        "request": "req-0", "driver": DRIVER, "pool": pool, "device": "bad",
    }]}});
    t.allocate_devices("unscheduled", allocation, json!([pod_ref(&unscheduled)]))
        .await;

    wait_for(
        "the pod on the tainted device evicted",
        TIMEOUT,
        async || ensure_evicted(t.pods().get_opt("evicted").await?.as_ref()),
    )
    .await;
    let events = eviction_events(&t, "evicted").await.unwrap();
    assert!(
        events.iter().any(|m| m == "Marking for deletion"),
        "events: {events:?}"
    );
    holds_for(
        "the other pods untouched",
        Duration::from_secs(3),
        async || {
            for name in ["tolerates", "healthy", "unscheduled"] {
                ensure_untouched(&t.pods().get(name).await?)?;
            }
            Ok(())
        },
    )
    .await;
    t.finish();
}

/// `evict-pod-later` then `cancel-eviction-remove-taint`: a pod tolerating
/// the taint for a while stays; when the taint goes before its time, the
/// eviction is cancelled with upstream's event and the pod runs on. A
/// second pod with a shorter toleration is evicted once its time is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_pod_later_and_cancel_when_the_taint_goes() {
    let Some(t) = TestCtx::shared("evict_pod_later_and_cancel_when_the_taint_goes").await else {
        return;
    };
    let pool = t.ns.clone();
    let slice = publish(&t, &pool, &[("d0", no_execute()), ("d1", no_execute())]).await;
    let tolerate = |secs: i64| json!([{"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": secs}]);
    pod_on_device(&t, "soon", &pool, "d0", tolerate(4)).await;
    pod_on_device(&t, "later", &pool, "d1", tolerate(3600)).await;
    holds_for(
        "both pods kept within their tolerations",
        Duration::from_secs(2),
        async || {
            ensure_untouched(&t.pods().get("soon").await?)?;
            ensure_untouched(&t.pods().get("later").await?)
        },
    )
    .await;
    wait_for("the pod tolerating 4 s evicted", TIMEOUT, async || {
        ensure_evicted(t.pods().get_opt("soon").await?.as_ref())
    })
    .await;

    // The driver clears the taint of d1: the eviction of `later` is off.
    let slices: Api<ResourceSlice> = Api::all(t.client.clone());
    let mut healed = slice.clone();
    for device in healed.spec.devices.iter_mut().flatten() {
        if device.name == "d1" {
            device.taints = None;
        }
    }
    slices
        .replace(&pool, &PostParams::default(), &healed)
        .await
        .expect("clear the taint");
    wait_for("a Cancelling deletion event", TIMEOUT, async || {
        let events = eviction_events(&t, "later").await?;
        ensure!(
            events.iter().any(|m| m == "Cancelling deletion"),
            "events: {events:?}"
        );
        Ok(())
    })
    .await;
    holds_for(
        "the healed pod untouched",
        Duration::from_secs(3),
        async || ensure_untouched(&t.pods().get("later").await?),
    )
    .await;
    t.finish();
}

/// Beyond kube-controller-manager 1.36 and 1.37 (its issue 141290): a pod
/// holding a tainted device through an extended-resource claim is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_resource_claim_on_a_tainted_device_is_evicted() {
    let Some(t) = TestCtx::shared("extended_resource_claim_on_a_tainted_device_is_evicted").await
    else {
        return;
    };
    // The claim is allocated as the scheduler would (its own device of the
    // pool `pool`); that device then goes bad.
    let (_, claim) = t.create_extended_resource_pod("ext", "ext-claim").await;
    let device = allocation(&t.ns, "ext-claim")["devices"]["results"][0]["device"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(claim.status.is_some_and(|s| s.allocation.is_some()));
    publish_in(&t, &t.ns, "pool", &[(&device, no_execute())]).await;
    // (The extended-resource pod is already on the node.)
    wait_for("the extended-resource pod evicted", TIMEOUT, async || {
        ensure_evicted(t.pods().get_opt("ext").await?.as_ref())
    })
    .await;
    t.finish();
}

/// An API server serving DeviceTaintRules (1.36: beta, off by default).
pub fn rules_apiserver() -> ApiserverOptions {
    ApiserverOptions {
        feature_gates: vec!["DRADeviceTaintRules=true".into()],
        runtime_config: vec!["resource.k8s.io/v1beta2=true".into()],
        ..Default::default()
    }
}

/// Our controller with DeviceTaintRules on.
pub fn rules_controller() -> ControllerOpts {
    ControllerOpts {
        feature_gates: format!("{ALL_CONTROLLER_GATES},DRADeviceTaintRules=true"),
        ..Default::default()
    }
}

pub fn rule_resource() -> ApiResource {
    dra_claim_controller::model::device_taints::RulesVersion::V1beta2.api_resource()
}

pub async fn create_rule(t: &TestCtx, name: &str, effect: &str, selector: Value) {
    let rules: Api<DynamicObject> = Api::all_with(t.client.clone(), &rule_resource());
    let rule: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": TAINT_KEY, "value": "maintenance", "effect": effect},
        },
    }))
    .unwrap();
    rules
        .create(&PostParams::default(), &rule)
        .await
        .unwrap_or_else(|e| panic!("create DeviceTaintRule {name}: {e}"));
}

/// The rule's `EvictionInProgress` condition: (status, reason, message).
pub async fn rule_condition(t: &TestCtx, name: &str) -> anyhow::Result<(String, String, String)> {
    let rules: Api<DynamicObject> = Api::all_with(t.client.clone(), &rule_resource());
    let rule = rules.get(name).await?;
    let conditions = rule.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let Some(c) = conditions
        .iter()
        .find(|c| c["type"] == "EvictionInProgress")
    else {
        bail!(
            "no EvictionInProgress condition yet: {:?}",
            rule.data["status"]
        );
    };
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Ok((s("status"), s("reason"), s("message")))
}

/// DeviceTaintRules (`DRADeviceTaintRules`, `resource.k8s.io/v1beta2` on
/// 1.36) on a server that serves them: `none-pod-rule` (the simulation's
/// counts, nothing evicted), `evict-pod-rule` (the pod evicted, the status
/// `Completed` with the count), and beyond upstream a rule selecting every
/// allocated device held until an admin confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_taint_rules_evict_report_and_wait_for_confirmation() {
    let Some(t) = TestCtx::isolated_with(
        "device_taint_rules_evict_report_and_wait_for_confirmation",
        rules_controller(),
        1,
        &rules_apiserver(),
    )
    .await
    else {
        return;
    };
    let pool = "rules-pool";
    publish(
        &t,
        pool,
        &[
            ("d0", json!([])),
            ("d1", json!([])),
            ("d2", json!([])),
            ("d3", json!([])),
        ],
    )
    .await;
    for (pod, device) in [("p0", "d0"), ("p1", "d1"), ("p2", "d2")] {
        pod_on_device(&t, pod, pool, device, json!([])).await;
    }
    let one_device = |d: &str| json!({"driver": DRIVER, "pool": pool, "device": d});

    // `None`: what NoExecute would do, and nothing done.
    create_rule(&t, "preview", "None", one_device("d0")).await;
    let preview = wait_for("the None rule's simulated counts", TIMEOUT, async || {
        let c = rule_condition(&t, "preview").await?;
        ensure!(c.1 == "NoEffect", "{c:?}");
        Ok(c)
    })
    .await;
    assert_eq!(preview.0, "False");
    assert_eq!(
        preview.2,
        "1 published device selected. 1 allocated device selected. 1 pod would be evicted in 1 namespace \
         if the effect was NoExecute. This information will not be updated again. Recreate the \
         DeviceTaintRule to trigger an update."
    );
    ensure_untouched(&t.pod("p0").await).unwrap();

    // `NoExecute` on one device: its pod goes, the status counts it.
    create_rule(&t, "evict-d0", "NoExecute", one_device("d0")).await;
    wait_for("the pod on d0 evicted", TIMEOUT, async || {
        ensure_evicted(t.pods().get_opt("p0").await?.as_ref())
    })
    .await;
    let done = wait_for("the rule's status Completed", TIMEOUT, async || {
        let c = rule_condition(&t, "evict-d0").await?;
        ensure!(c.1 == "Completed", "{c:?}");
        Ok(c)
    })
    .await;
    assert_eq!(done.2, "1 pod evicted since starting the controller.");

    // Every device of the driver: 3 of 3 allocated devices, more than the
    // default half. Held, said so, nothing evicted...
    create_rule(&t, "everything", "NoExecute", json!({"driver": DRIVER})).await;
    let held = wait_for("the broad rule held", TIMEOUT, async || {
        let c = rule_condition(&t, "everything").await?;
        ensure!(c.1 == "ConfirmationRequired", "{c:?}");
        Ok(c)
    })
    .await;
    assert!(
        held.2
            .contains("dra-claim-controller.io/confirm-eviction=true"),
        "{held:?}"
    );
    // ... and told where `kubectl describe devicetaintrule everything` looks.
    wait_for(
        "a Warning EvictionHeld event on the rule",
        TIMEOUT,
        async || {
            let events: Api<Event> = Api::namespaced(t.client.clone(), "default");
            let lp = ListParams::default().fields("involvedObject.name=everything");
            let held = events.list(&lp).await?.items.into_iter().any(|e| {
                e.reason.as_deref() == Some("EvictionHeld")
                    && e.type_.as_deref() == Some("Warning")
                    && e.involved_object.kind.as_deref() == Some("DeviceTaintRule")
                    && e.involved_object.namespace.is_none()
            });
            ensure!(held, "no such event yet");
            Ok(())
        },
    )
    .await;
    holds_for(
        "pods p1 and p2 kept while held",
        Duration::from_secs(3),
        async || {
            ensure_untouched(&t.pod("p1").await)?;
            ensure_untouched(&t.pod("p2").await)
        },
    )
    .await;
    // ... until an admin confirms it.
    let rules: Api<DynamicObject> = Api::all_with(t.client.clone(), &rule_resource());
    rules
        .patch(
            "everything",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "dra-claim-controller.io/confirm-eviction": "true"}}})),
        )
        .await
        .expect("confirm the rule");
    wait_for("p1 and p2 evicted once confirmed", TIMEOUT, async || {
        ensure_evicted(t.pods().get_opt("p1").await?.as_ref())?;
        ensure_evicted(t.pods().get_opt("p2").await?.as_ref())
    })
    .await;
    t.finish();
}

/// `none-pod-rule` as an admin runs it: a pod on a device, then at once a
/// `None` rule for the device, while the claim watch is a second behind
/// the rule's (an API server under load). The preview, written once, still
/// counts the pod: it is taken once the other watches have caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_counts_the_pods_created_just_before_it() {
    const NAME: &str = "a_preview_counts_the_pods_created_just_before_it";
    let Some(mut t) = TestCtx::isolated_with(NAME, rules_controller(), 0, &rules_apiserver()).await
    else {
        return;
    };
    let plan = crate::fault_proxy::FaultPlan {
        watch_lag: Duration::from_secs(1),
        watch_lag_only: vec!["/resourceclaims".into()],
        ..Default::default()
    };
    let _proxy = crate::faults_api::controller_behind_proxy(&mut t, plan).await;
    // Leading before anything is written, so the rule is seen as an event
    // (a takeover would read every watch first).
    let ours = t.isolated_env().controllers[0].clone();
    wait_for("leading", TIMEOUT, async || {
        let status = crate::handover::master_status(&ours.current()).await?;
        ensure!(status == 1.0, "not leading yet");
        Ok(())
    })
    .await;
    let pool = "preview-pool";
    publish(&t, pool, &[("d0", json!([]))]).await;
    pod_on_device(&t, "previewed", pool, "d0", json!([])).await;
    let selector = json!({"driver": DRIVER, "pool": pool, "device": "d0"});
    create_rule(&t, "preview-d0", "None", selector).await;

    let (_, _, message) = wait_for("the preview written", TIMEOUT, async || {
        let c = rule_condition(&t, "preview-d0").await?;
        ensure!(c.1 == "NoEffect", "{c:?}");
        Ok(c)
    })
    .await;
    assert!(
        message.starts_with(
            "1 published device selected. 1 allocated device selected. \
             1 pod would be evicted in 1 namespace if the effect was NoExecute."
        ),
        "{message}"
    );
    holds_for("the pod kept", Duration::from_secs(2), async || {
        ensure_untouched(&t.pods().get("previewed").await?)
    })
    .await;
    t.finish();
}

/// An eviction writes from the pod as the shared watch holds it, not from a
/// fresh read; both of its writes carry the pod's UID. So with the pod
/// watch seconds behind, a pod deleted and created again under its name
/// (without the device) is never touched by the eviction meant for the old
/// one: no `DisruptionTarget` condition, no deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_replaced_under_its_name_is_not_evicted_for_the_old_one() {
    const NAME: &str = "a_pod_replaced_under_its_name_is_not_evicted_for_the_old_one";
    const LAG: Duration = Duration::from_secs(3);
    let Some(mut t) = TestCtx::isolated_with(NAME, rules_controller(), 0, &rules_apiserver()).await
    else {
        return;
    };
    let plan = crate::fault_proxy::FaultPlan {
        watch_lag: LAG,
        watch_lag_only: vec!["/pods".into()],
        ..Default::default()
    };
    let _proxy = crate::faults_api::controller_behind_proxy(&mut t, plan).await;
    let pool = "replaced-pool";
    publish(&t, pool, &[("d0", json!([]))]).await;
    let old = pod_on_device(&t, "victim", pool, "d0", json!([])).await;
    let old_uid = old.metadata.uid.clone().unwrap();
    // The controller's pod watch has caught up with the old pod.
    tokio::time::sleep(LAG + Duration::from_secs(1)).await;

    t.pods()
        .delete(
            "victim",
            &kube::api::DeleteParams::default().grace_period(0),
        )
        .await
        .expect("delete the old pod");
    let new = t.create_pod("victim", &[], Some(NODE)).await;
    assert_ne!(new.metadata.uid.as_deref(), Some(old_uid.as_str()));
    create_rule(
        &t,
        "replaced-d0",
        "NoExecute",
        json!({"driver": DRIVER, "pool": pool, "device": "d0"}),
    )
    .await;

    // The eviction was tried for the old pod, from the lagging copy ...
    wait_for("the eviction tried for the old pod", TIMEOUT, async || {
        let tried = t
            .events_of("victim", "Normal", "DeviceTaintManagerEviction")
            .await?
            .iter()
            .any(|e| e.involved_object.uid.as_deref() == Some(old_uid.as_str()));
        ensure!(tried, "no eviction event for the old pod yet");
        Ok(())
    })
    .await;
    // ... and the new pod, past the lag, was never touched.
    holds_for(
        "the new pod untouched",
        LAG + Duration::from_secs(2),
        async || {
            let pod = t.pods().get("victim").await?;
            ensure!(pod.metadata.uid == new.metadata.uid, "replaced again");
            ensure_untouched(&pod)
        },
    )
    .await;
    t.finish();
}
