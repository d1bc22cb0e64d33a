//! Decisions that must never be wrong: a running pod keeps its devices, a
//! warning is sent only when it is true, a done pod's reservation goes
//! whatever the pod looks like, a pod on a node keeps its recorded claim,
//! and a status apply never drops an entry.

use std::time::Duration;

use anyhow::ensure;
use serde_json::json;

use crate::ctx::TestCtx;
use crate::k8s::*;

const NOT_ALLOCATED_REASON: &str = "ResourceClaimNotAllocated";
const CLAIM_MISSING_REASON: &str = "ResourceClaimMissing";
/// The controller's grace period before `ResourceClaimNotAllocated`, plus
/// the time a sync and an event write take.
const PAST_GRACE: Duration = Duration::from_secs(14);

/// A status write that drops `extendedResourceClaimStatus` (what a client
/// built on older types does with a full status update) is not the pod's
/// deletion: the claim stays reserved, allocated and protected while the
/// pod runs, and is still cleaned up once the pod is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_pod_keeps_extended_claim_when_status_drops_it() {
    let Some(t) = TestCtx::shared("running_pod_keeps_extended_claim_when_status_drops_it").await
    else {
        return;
    };
    let (_, claim) = t.create_extended_resource_pod("ext", "ext-claim").await;
    t.set_pod_phase("ext", "Running").await;
    t.patch_pod_status("ext", json!({"extendedResourceClaimStatus": null}))
        .await;
    let status = t.pod("ext").await.status.unwrap_or_default();
    assert!(
        status.extended_resource_claim_status.is_none(),
        "the API server kept extendedResourceClaimStatus: the scenario needs it dropped"
    );
    holds_for(
        "the running pod's claim to stay reserved, allocated and protected",
        Duration::from_secs(5),
        async || ensure_held(&t.claims().get("ext-claim").await?, &["pods/ext"]),
    )
    .await;
    t.set_pod_phase("ext", "Succeeded").await;
    let last = t
        .wait_claim_deleted(
            "ext-claim",
            &claim.metadata.resource_version.unwrap_or_default(),
        )
        .await;
    assert_cleanly_deleted(&last, &["pods/ext"]);
    t.finish();
}

/// A pod bound by a scheduler (`pods/binding`), whose claim shows up
/// allocated a second later (a lagging claim watch looks just like this),
/// gets no `ResourceClaimNotAllocated` warning: it was not pre-scheduled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_pod_with_late_allocation_gets_no_warning() {
    let Some(t) = TestCtx::shared("scheduled_pod_with_late_allocation_gets_no_warning").await
    else {
        return;
    };
    t.create_template("tmpl").await;
    let pod = t
        .create_pod("bound", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    let claim = t.wait_recorded("bound", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    t.bind_pod("bound", NODE).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    t.allocate(&claim, json!([pod_ref(&pod)])).await;
    holds_for(
        "no ResourceClaimNotAllocated warning past the grace period",
        PAST_GRACE,
        async || {
            let warnings = t.warning_events("bound", NOT_ALLOCATED_REASON).await?;
            ensure!(warnings.is_empty(), "warned: {:?}", messages(&warnings));
            Ok(())
        },
    )
    .await;
    t.finish();
}

/// A pod created with `spec.nodeName` whose claim nobody allocates is told
/// so, once the grace period is over, with what to do about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prescheduled_pod_is_warned_after_grace_period() {
    let Some(t) = TestCtx::shared("prescheduled_pod_is_warned_after_grace_period").await else {
        return;
    };
    t.create_template("tmpl").await;
    t.create_pod("pinned", &[("gpu", Source::Template("tmpl"))], Some(NODE))
        .await;
    let claim = t.wait_recorded("pinned", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    let recorded_at = std::time::Instant::now();
    let warning = wait_for(
        "the ResourceClaimNotAllocated warning",
        PAST_GRACE + TIMEOUT,
        async || {
            let warnings = t.warning_events("pinned", NOT_ALLOCATED_REASON).await?;
            ensure!(!warnings.is_empty(), "no warning yet");
            Ok(warnings[0].clone())
        },
    )
    .await;
    assert!(
        recorded_at.elapsed() >= Duration::from_secs(5),
        "warned {:?} after the claim was recorded: the grace period was not respected",
        recorded_at.elapsed()
    );
    let message = warning.message.unwrap_or_default();
    assert!(
        message.contains(&claim)
            && message.contains("kubernetes.io/hostname")
            && message.contains("prescheduledPods.policy.enabled=true"),
        "the warning names the claim and the fix: {message}"
    );
    t.finish();
}

/// A pod without claims of its own, done, listed in a shared claim's
/// `reservedFor`: the entry goes, the claim is deallocated and unprotected
/// (the pod is not cached; the live lookup must tell "done" from "there").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_pod_without_claims_is_removed_from_reserved_for() {
    let Some(t) = TestCtx::shared("done_pod_without_claims_is_removed_from_reserved_for").await
    else {
        return;
    };
    let plain = t.create_pod("plain", &[], None).await;
    t.set_pod_phase("plain", "Succeeded").await;
    t.create_claim(json!({"name": "shared"})).await;
    t.allocate("shared", json!([pod_ref(&plain)])).await;
    // Touch the claim, as any update would.
    t.claims()
        .patch(
            "shared",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await
        .expect("touch claim");
    wait_for("the done pod's reservation to go", TIMEOUT, async || {
        let c = t.claims().get("shared").await?;
        ensure_released(&c)
    })
    .await;
    t.finish();
}

/// A pod bound to a node whose recorded claim is deleted: no replacement
/// (it could never be allocated, and the kubelet unprepares by the recorded
/// name), the recorded name stays, and one warning says what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_claim_of_bound_pod_is_not_replaced() {
    let Some(t) = TestCtx::shared("deleted_claim_of_bound_pod_is_not_replaced").await else {
        return;
    };
    t.create_template("tmpl").await;
    t.create_pod("on-node", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    let claim = t.wait_recorded("on-node", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    t.bind_pod("on-node", NODE).await;
    t.claims()
        .delete(&claim, &Default::default())
        .await
        .expect("delete claim");
    t.wait_claim_gone(&claim).await;
    wait_for("one ResourceClaimMissing warning", TIMEOUT, async || {
        let warnings = t.warning_events("on-node", CLAIM_MISSING_REASON).await?;
        ensure!(warnings.len() == 1, "warnings: {:?}", messages(&warnings));
        Ok(())
    })
    .await;
    holds_for(
        "no replacement, the recorded name kept, one warning",
        Duration::from_secs(4),
        async || {
            let claims = t.all_claims().await?;
            ensure!(claims.is_empty(), "{} claims exist", claims.len());
            let recorded = recorded(&t.pods().get("on-node").await?);
            ensure!(
                recorded.get("gpu") == Some(&Some(claim.clone())),
                "status now {recorded:?}"
            );
            let warnings = t.warning_events("on-node", CLAIM_MISSING_REASON).await?;
            ensure!(
                warnings.len() == 1 && warnings[0].count.unwrap_or(1) == 1,
                "warned more than once: {:?}",
                warnings.iter().map(|w| w.count).collect::<Vec<_>>()
            );
            Ok(())
        },
    )
    .await;
    t.finish();
}

/// Two template entries, both recorded; `tb` is deleted, then both claims
/// (`b`'s first). `a` gets a new claim, `b` fails, and the status keeps
/// `b`'s recorded name: the apply for `a` must not drop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_apply_keeps_failing_entries() {
    let Some(t) = TestCtx::shared("status_apply_keeps_failing_entries").await else {
        return;
    };
    t.create_template("ta").await;
    t.create_template("tb").await;
    t.create_pod(
        "two",
        &[("a", Source::Template("ta")), ("b", Source::Template("tb"))],
        None,
    )
    .await;
    let first = t.wait_recorded("two", &["a", "b"]).await;
    let (old_a, old_b) = (
        first["a"].metadata.name.clone().unwrap(),
        first["b"].metadata.name.clone().unwrap(),
    );
    t.templates()
        .delete("tb", &Default::default())
        .await
        .expect("delete template tb");
    t.claims()
        .delete(&old_b, &Default::default())
        .await
        .expect("delete claim b");
    wait_for("the failure for b to be reported", TIMEOUT, async || {
        ensure!(
            !t.warning_events("two", FAILED_CREATION_REASON)
                .await?
                .is_empty(),
            "no event yet"
        );
        Ok(())
    })
    .await;
    t.claims()
        .delete(&old_a, &Default::default())
        .await
        .expect("delete claim a");
    let new_a = wait_for("a new claim for a", TIMEOUT, async || {
        let recorded = recorded(&t.pods().get("two").await?);
        match recorded.get("a") {
            Some(Some(name)) if *name != old_a => Ok(name.clone()),
            other => anyhow::bail!("a is {other:?}"),
        }
    })
    .await;
    holds_for(
        "b's recorded name to stay",
        Duration::from_secs(3),
        async || {
            let recorded = recorded(&t.pods().get("two").await?);
            ensure!(
                recorded.get("a") == Some(&Some(new_a.clone()))
                    && recorded.get("b") == Some(&Some(old_b.clone())),
                "status now {recorded:?}"
            );
            Ok(())
        },
    )
    .await;
    t.finish();
}

fn messages(events: &[k8s_openapi::api::core::v1::Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| e.message.clone().unwrap_or_default())
        .collect()
}

/// A stale reservation that no event will ever point at (a pod without
/// claims of its own finishes: its update concerns no cached object) is
/// cleaned up by the periodic resync, which re-examines every cached claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_cleans_up_a_reservation_no_event_points_at() {
    const NAME: &str = "resync_cleans_up_a_reservation_no_event_points_at";
    let opts = crate::cluster::ControllerOpts {
        min_resync_period: Some("3s".into()),
        ..Default::default()
    };
    let Some(t) = TestCtx::isolated(NAME, opts, 1).await else {
        return;
    };
    let plain = t.create_pod("plain", &[], None).await;
    t.set_pod_phase("plain", "Running").await;
    t.create_claim(json!({"name": "shared"})).await;
    t.allocate("shared", json!([pod_ref(&plain)])).await;
    holds_for(
        "the running pod's reservation to stay",
        Duration::from_secs(2),
        async || {
            let c = t.claims().get("shared").await?;
            ensure!(
                reserved_names(&c) == ["pods/plain"],
                "reservedFor {:?}",
                reserved_names(&c)
            );
            Ok(())
        },
    )
    .await;
    t.set_pod_phase("plain", "Succeeded").await;
    wait_for("a resync to release the claim", TIMEOUT, async || {
        ensure_released(&t.claims().get("shared").await?)
    })
    .await;
    t.finish();
}
