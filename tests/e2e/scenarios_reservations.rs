//! `status.reservedFor` bookkeeping, deallocation and cleanup of claims
//! whose pods are done, deleted or replaced. The test plays the scheduler
//! and the kubelet: it writes allocations, reservations and pod phases.

use std::time::Duration;

use anyhow::ensure;
use serde_json::json;

use crate::ctx::TestCtx;
use crate::k8s::*;

/// Pods placed without the scheduler get their allocated claims reserved
/// by the controller: a generated claim allocated after creation, and a
/// user's claim allocated before the pod exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prescheduled_pod_gets_reservation() {
    let Some(t) = TestCtx::shared("prescheduled_pod_gets_reservation").await else {
        return;
    };
    t.create_template("tmpl").await;
    let placed = t
        .create_pod("placed", &[("gpu", Source::Template("tmpl"))], Some(NODE))
        .await;
    let claim = t.wait_recorded("placed", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    t.allocate(&claim, json!([])).await;

    t.create_claim(json!({"name": "user-claim"})).await;
    t.allocate("user-claim", json!([])).await;
    let placed_user = t
        .create_pod(
            "placed-user",
            &[("dev", Source::Claim("user-claim"))],
            Some(NODE),
        )
        .await;

    for (claim, pod) in [(claim.as_str(), &placed), ("user-claim", &placed_user)] {
        let pod_name = pod.metadata.name.clone().unwrap();
        wait_for(
            &format!("claim {claim} reserved for pod {pod_name}"),
            TIMEOUT,
            async || {
                let c = t.claims().get(claim).await?;
                let reserved = c.status.and_then(|s| s.reserved_for).unwrap_or_default();
                ensure!(reserved.len() == 1, "reservedFor: {reserved:?}");
                let r = &reserved[0];
                ensure!(
                    r.resource == "pods"
                        && r.api_group.as_deref().unwrap_or("").is_empty()
                        && r.name == pod_name
                        && r.uid == uid(pod),
                    "reservedFor: {reserved:?}"
                );
                Ok(())
            },
        )
        .await;
    }
    t.finish();
}

/// Pods that finished (Succeeded or Failed) release their claims: the
/// claims are deleted, released first or deleted first (see
/// [`assert_cleanly_deleted`]); and no new claim is ever made for a
/// finished pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_pods_release_their_claims() {
    let Some(t) = TestCtx::shared("done_pods_release_their_claims").await else {
        return;
    };
    t.create_template("tmpl").await;
    let mut claims = Vec::new();
    for (pod_name, phase) in [("worker-ok", "Succeeded"), ("worker-failed", "Failed")] {
        let pod = t
            .create_pod(pod_name, &[("gpu", Source::Template("tmpl"))], None)
            .await;
        let claim = t.wait_recorded(pod_name, &["gpu"]).await["gpu"]
            .metadata
            .name
            .clone()
            .unwrap();
        let rv = t
            .allocate(&claim, json!([pod_ref(&pod)]))
            .await
            .metadata
            .resource_version;
        t.set_pod_phase(pod_name, phase).await;
        claims.push((claim, rv.unwrap_or_default(), pod_name));
    }
    for (claim, rv, pod) in &claims {
        let last = t.wait_claim_deleted(claim, rv).await;
        assert_cleanly_deleted(&last, &[&format!("pods/{pod}")]);
    }
    holds_for(
        "no claim for a finished pod",
        Duration::from_secs(3),
        async || {
            let n = t.all_claims().await?.len();
            ensure!(n == 0, "{n} claims");
            Ok(())
        },
    )
    .await;
    t.finish();
}

/// A deleted pod's reservation is removed and its claim deallocated and
/// unprotected. Deleting the claim itself is left to the garbage collector
/// (as the reference does when the pod is not found), which does not run
/// here; a controller that deletes it at once passes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pod_releases_its_claim() {
    let Some(t) = TestCtx::shared("deleted_pod_releases_its_claim").await else {
        return;
    };
    t.create_template("tmpl").await;
    let pod = t
        .create_pod("gone", &[("gpu", Source::Template("tmpl"))], Some(NODE))
        .await;
    let claim = t.wait_recorded("gone", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    t.allocate(&claim, json!([pod_ref(&pod)])).await;
    t.delete_pod_now("gone").await;
    wait_for(
        "the deleted pod's claim to be released",
        TIMEOUT,
        async || {
            let Some(c) = t.claims().get_opt(&claim).await? else {
                return Ok(());
            };
            ensure_released(&c)
        },
    )
    .await;
    t.finish();
}

/// A pod deleted and re-created under the same name: the old pod's claim is
/// released and deleted, the new pod gets a claim of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_pod_gets_a_new_claim() {
    let Some(t) = TestCtx::shared("replaced_pod_gets_a_new_claim").await else {
        return;
    };
    t.create_template("tmpl").await;
    let old = t
        .create_pod("phoenix", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    let old_claim = t.wait_recorded("phoenix", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    let rv = t
        .allocate(&old_claim, json!([pod_ref(&old)]))
        .await
        .metadata
        .resource_version;

    t.delete_pod_now("phoenix").await;
    let new = t
        .create_pod("phoenix", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    assert_ne!(uid(&old), uid(&new));

    let new_claim = t.wait_recorded("phoenix", &["gpu"]).await["gpu"].clone();
    assert_ne!(new_claim.metadata.name.as_deref(), Some(old_claim.as_str()));
    assert!(controlled_by(&new_claim, &uid(&new)));
    let last = t
        .wait_claim_deleted(&old_claim, &rv.unwrap_or_default())
        .await;
    assert_cleanly_deleted(&last, &["pods/phoenix"]);
    t.finish();
}

/// A pod on a node recreated under its name only after its claim was
/// released: the claim's own sync saw no pod and left the claim to the garbage
/// collector, as kube-controller-manager does; the new pod's arrival then
/// proves the claim unused for good, and it is deleted (this API server
/// runs no garbage collector, so nothing else would delete it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_recreated_after_the_release_gets_its_old_claim_deleted() {
    let Some(t) =
        TestCtx::shared("pod_recreated_after_the_release_gets_its_old_claim_deleted").await
    else {
        return;
    };
    t.create_template("tmpl").await;
    // On a node, so that its deletion is not a "done" pod the claim sync
    // could see: the claim is released only once the pod is gone.
    let old = t
        .create_pod("again", &[("gpu", Source::Template("tmpl"))], Some(NODE))
        .await;
    let old_claim = t.wait_recorded("again", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    t.allocate(&old_claim, json!([pod_ref(&old)])).await;

    t.delete_pod_now("again").await;
    wait_for("the old claim to be released", TIMEOUT, async || {
        ensure_released(&t.claims().get(&old_claim).await?)
    })
    .await;
    holds_for(
        "the released claim to stay while no pod has the name",
        Duration::from_secs(1),
        async || {
            t.claims().get(&old_claim).await?;
            Ok(())
        },
    )
    .await;
    let rv = t
        .claims()
        .get(&old_claim)
        .await
        .unwrap()
        .metadata
        .resource_version;

    let new = t
        .create_pod("again", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    let new_claim = t.wait_recorded("again", &["gpu"]).await["gpu"].clone();
    assert!(controlled_by(&new_claim, &uid(&new)));
    t.wait_claim_deleted(&old_claim, &rv.unwrap_or_default())
        .await;
    t.finish();
}

/// A reservation for a pod that never existed is removed; the claim, now
/// unused, is deallocated and unprotected but kept (no pod owns it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_for_missing_pod_is_removed() {
    let Some(t) = TestCtx::shared("reservation_for_missing_pod_is_removed").await else {
        return;
    };
    t.create_claim(json!({"name": "stale"})).await;
    t.allocate(
        "stale",
        json!([{"resource": "pods", "name": "never-existed", "uid": "6c1d3a0e-0000-4000-8000-000000000001"}]),
    )
    .await;

    wait_for(
        "the stale reservation to be removed and the claim released",
        TIMEOUT,
        async || {
            let c = t.claims().get("stale").await?;
            ensure_released(&c)
        },
    )
    .await;
    holds_for(
        "the user's claim to stay",
        Duration::from_secs(2),
        async || {
            ensure!(
                t.claims().get_opt("stale").await?.is_some(),
                "claim deleted"
            );
            Ok(())
        },
    )
    .await;
    t.finish();
}

/// Consumers of kinds the controller does not know are never removed, so
/// the claim stays allocated and protected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_consumer_kinds_are_kept() {
    let Some(t) = TestCtx::shared("unknown_consumer_kinds_are_kept").await else {
        return;
    };
    t.create_claim(json!({"name": "mixed"})).await;
    t.allocate(
        "mixed",
        json!([
            {"resource": "pods", "name": "ghost", "uid": "6c1d3a0e-0000-4000-8000-000000000002"},
            {"apiGroup": "example.com", "resource": "widgets", "name": "w1",
             "uid": "6c1d3a0e-0000-4000-8000-000000000003"},
        ]),
    )
    .await;

    wait_for(
        "the ghost pod's reservation to be removed",
        TIMEOUT,
        async || {
            let c = t.claims().get("mixed").await?;
            ensure!(
                reserved_names(&c) == ["widgets/w1"],
                "reservedFor {:?}",
                reserved_names(&c)
            );
            Ok(())
        },
    )
    .await;
    holds_for(
        "the widget reservation, allocation and finalizer to stay",
        Duration::from_secs(2),
        async || ensure_held(&t.claims().get("mixed").await?, &["widgets/w1"]),
    )
    .await;
    t.finish();
}

/// A claim deleted while allocated but unused has its finalizer removed, so
/// the deletion completes (deallocated first only while a pod waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_unused_allocated_claim_goes_away() {
    let Some(t) = TestCtx::shared("deleted_unused_allocated_claim_goes_away").await else {
        return;
    };
    t.create_claim(json!({"name": "doomed"})).await;
    let rv = t
        .allocate("doomed", json!([]))
        .await
        .metadata
        .resource_version;
    t.claims()
        .delete("doomed", &Default::default())
        .await
        .expect("delete claim");
    let last = t
        .wait_claim_deleted("doomed", &rv.unwrap_or_default())
        .await;
    assert_cleanly_deleted(&last, &[]);
    t.finish();
}

/// A claim the scheduler made for an extended resource (no claim entry in
/// the pod spec, only `status.extendedResourceClaimStatus`) is cleaned up
/// when its pod is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_resource_claim_cleaned_up() {
    let Some(t) = TestCtx::shared("extended_resource_claim_cleaned_up").await else {
        return;
    };
    let (_, claim) = t.create_extended_resource_pod("ext", "ext-claim").await;
    let rv = claim.metadata.resource_version;

    // Still running: the claim must stay reserved.
    holds_for(
        "the running pod's claim to stay",
        Duration::from_secs(2),
        async || {
            let c = t.claims().get("ext-claim").await?;
            ensure!(
                reserved_names(&c) == ["pods/ext"],
                "reservedFor {:?}",
                reserved_names(&c)
            );
            Ok(())
        },
    )
    .await;
    t.set_pod_phase("ext", "Succeeded").await;
    let last = t
        .wait_claim_deleted("ext-claim", &rv.unwrap_or_default())
        .await;
    assert_cleanly_deleted(&last, &["pods/ext"]);
    assert!(
        t.pods().get_opt("ext").await.unwrap().is_some(),
        "the controller must not delete the pod"
    );
    t.finish();
}
