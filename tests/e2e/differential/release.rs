//! Scenarios: pre-scheduled pods; claims released, adopted, replaced and deleted.

use super::*;

/// Pods placed with `spec.nodeName` get their allocated claims reserved: a
/// generated claim allocated after creation, a user's claim allocated
/// before the pod exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_prescheduled_pod_gets_reservation() {
    let Some(p) = Pair::new("differential_prescheduled_pod_gets_reservation").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_template("tmpl").await;
            s.create_pod("placed", &[("gpu", Source::Template("tmpl"))], Some(NODE))
                .await;
            let claim = s.recorded_claim("placed", "gpu").await;
            s.allocate(&claim, json!([])).await;
            s.create_claim(json!({"name": "user-claim"})).await;
            s.allocate("user-claim", json!([])).await;
            s.create_pod(
                "placed-user",
                &[("dev", Source::Claim("user-claim"))],
                Some(NODE),
            )
            .await;
        },
        |s| {
            let generated = s.recorded("placed", "gpu")?;
            ensure!(
                s.reserved(&generated)? == ["pods/placed"],
                "{generated} not reserved"
            );
            ensure!(
                s.reserved("user-claim")? == ["pods/placed-user"],
                "user-claim not reserved"
            );
            Ok(())
        },
        // The claim of "placed" exists unallocated for a moment.
        drop_not_allocated_warnings,
    )
    .await;
}

/// Pods bound with `spec.nodeName` whose claims are not allocated: nothing
/// is reserved, by either. Beyond (contract, "Pre-scheduled pods"): ours
/// tells the user with a Warning `ResourceClaimNotAllocated`, for a user's
/// claim and for a claim made from a template alike; the reference says
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_prescheduled_pod_with_unallocated_claim() {
    let Some(p) = Pair::new("differential_prescheduled_pod_with_unallocated_claim").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_template("tmpl").await;
            s.create_claim(json!({"name": "unallocated"})).await;
            s.create_pod(
                "waiting-user",
                &[("dev", Source::Claim("unallocated"))],
                Some(NODE),
            )
            .await;
            s.create_pod(
                "waiting-generated",
                &[("gpu", Source::Template("tmpl"))],
                Some(NODE),
            )
            .await;
            // Ours warns once its grace period is over; the reference
            // never does.
            if s.who == OURS {
                s.wait_until_within(
                    "the ResourceClaimNotAllocated warnings",
                    NOT_ALLOCATED_GRACE + TIMEOUT,
                    |s| {
                        for pod in ["Pod/waiting-user", "Pod/waiting-generated"] {
                            ensure!(
                                s.events
                                    .iter()
                                    .any(|e| e.reason == NOT_ALLOCATED_REASON && e.object == pod),
                                "no warning on {pod} yet"
                            );
                        }
                        Ok(())
                    },
                )
                .await;
            }
        },
        |s| s.recorded("waiting-generated", "gpu").map(drop),
        require_not_allocated_warnings(&["Pod/waiting-user", "Pod/waiting-generated"]),
    )
    .await;
}

/// Pods that finished release their claims: reservation removed,
/// deallocated, finalizer removed, claim deleted. (The contract's beyond
/// point "completed pods never get a claim again" does not show here: the
/// reference only re-creates such claims after a restart or once more than
/// 100 recent creations pushed them out of its cache, so there is nothing
/// to normalize.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_done_pods_release_their_claims() {
    let Some(p) = Pair::new("differential_done_pods_release_their_claims").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_template("tmpl").await;
            for (pod_name, phase) in [("worker-ok", "Succeeded"), ("worker-failed", "Failed")] {
                let pod = s
                    .create_pod(pod_name, &[("gpu", Source::Template("tmpl"))], None)
                    .await;
                let claim = s.recorded_claim(pod_name, "gpu").await;
                s.allocate(&claim, json!([pod_ref(&pod)])).await;
                s.set_pod_phase(pod_name, phase).await;
            }
        },
        |s| {
            ensure!(s.claims.is_empty(), "{} claims left", s.claims.len());
            ensure!(
                s.deleted_claims.len() == 2,
                "{} deleted",
                s.deleted_claims.len()
            );
            Ok(())
        },
        same,
    )
    .await;
}

/// A deleted pod's reservation is removed and its claim deallocated and
/// unprotected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_deleted_pod_releases_its_claim() {
    let Some(p) = Pair::new("differential_deleted_pod_releases_its_claim").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_template("tmpl").await;
            let pod = s
                .create_pod("gone", &[("gpu", Source::Template("tmpl"))], Some(NODE))
                .await;
            let claim = s.recorded_claim("gone", "gpu").await;
            s.allocate(&claim, json!([pod_ref(&pod)])).await;
            s.delete_pod_now("gone").await;
        },
        |s| match s.claims.first() {
            Some(c) => s.released(c["name"].as_str().unwrap_or_default()),
            None => Ok(()),
        },
        same,
    )
    .await;
}

/// A reservation for a pod that never existed is removed; the claim is
/// deallocated and unprotected but kept (no pod owns it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_reservation_for_missing_pod_is_removed() {
    let Some(p) = Pair::new("differential_reservation_for_missing_pod_is_removed").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_claim(json!({"name": "stale"})).await;
            s.allocate(
                "stale",
                json!([{"resource": "pods", "name": "never-existed",
                        "uid": "6c1d3a0e-0000-4000-8000-000000000001"}]),
            )
            .await;
        },
        |s| s.released("stale"),
        same,
    )
    .await;
}

/// Consumers of kinds the controller does not know are kept, so the claim
/// stays allocated and protected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_unknown_consumer_kinds_are_kept() {
    let Some(p) = Pair::new("differential_unknown_consumer_kinds_are_kept").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_claim(json!({"name": "mixed"})).await;
            s.allocate(
                "mixed",
                json!([
                    {"resource": "pods", "name": "ghost",
                     "uid": "6c1d3a0e-0000-4000-8000-000000000002"},
                    {"apiGroup": "example.com", "resource": "widgets", "name": "w1",
                     "uid": "6c1d3a0e-0000-4000-8000-000000000003"},
                ]),
            )
            .await;
        },
        |s| {
            ensure!(
                s.reserved("mixed")? == ["widgets/w1"],
                "{:?}",
                s.reserved("mixed")?
            );
            Ok(())
        },
        same,
    )
    .await;
}

/// A claim the pod already controls, with the entry's annotation, is
/// adopted instead of creating a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_orphan_claim_is_adopted() {
    let Some(p) = Pair::new("differential_orphan_claim_is_adopted").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            // No template yet: nothing can be created before the orphan exists.
            let pod = s
                .create_pod("adopter", &[("gpu", Source::Template("tmpl-later"))], None)
                .await;
            s.wait_creation_failed().await;
            s.create_claim(json!({
                "name": "adopter-gpu-orphan",
                "annotations": {POD_CLAIM_NAME_ANNOTATION: "gpu"},
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Pod", "name": "adopter",
                    "uid": pod.metadata.uid, "controller": true, "blockOwnerDeletion": true,
                }],
            }))
            .await;
            s.create_template("tmpl-later").await;
        },
        |s| s.recorded("adopter", "gpu").map(drop),
        same,
    )
    .await;
}

/// An entry recorded without a claim name means "not needed": no claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_skipped_entry_gets_no_claim() {
    let Some(p) = Pair::new("differential_skipped_entry_gets_no_claim").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_pod(
                "skipper",
                &[
                    ("skip", Source::Template("tmpl-skip")),
                    ("use", Source::Template("tmpl-skip")),
                ],
                None,
            )
            .await;
            s.patch_pod_status(
                "skipper",
                json!({"resourceClaimStatuses": [{"name": "skip"}]}),
            )
            .await;
            s.wait_creation_failed().await;
            s.create_template("tmpl-skip").await;
        },
        |s| s.recorded("skipper", "use").map(drop),
        same,
    )
    .await;
}

/// A recorded claim controlled by another pod is not used: the pod gets a
/// claim of its own, the other pod's claim stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_claim_owned_by_another_pod_is_replaced() {
    let Some(p) = Pair::new("differential_claim_owned_by_another_pod_is_replaced").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_template("tmpl-first").await;
            s.create_pod("first", &[("gpu", Source::Template("tmpl-first"))], None)
                .await;
            let foreign = s.recorded_claim("first", "gpu").await;
            s.create_pod("second", &[("gpu", Source::Template("tmpl-second"))], None)
                .await;
            s.wait_creation_failed().await;
            s.patch_pod_status(
                "second",
                json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": foreign}]}),
            )
            .await;
            s.create_template("tmpl-second").await;
        },
        |s| {
            let second = s.recorded("second", "gpu")?;
            ensure!(second.starts_with("second-gpu-"), "second records {second}");
            s.recorded("first", "gpu").map(drop)
        },
        same,
    )
    .await;
}

/// A claim deleted while allocated but unused is deallocated and its
/// finalizer removed, so the deletion completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_deleted_unused_allocated_claim_goes_away() {
    let Some(p) = Pair::new("differential_deleted_unused_allocated_claim_goes_away").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_claim(json!({"name": "doomed"})).await;
            s.allocate("doomed", json!([])).await;
            s.claims()
                .delete("doomed", &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("{}: delete claim: {e}", s.who));
        },
        |s| {
            ensure!(s.claims.is_empty(), "{} claims left", s.claims.len());
            ensure!(s.deleted_claims.len() == 1, "not deleted yet");
            Ok(())
        },
        same,
    )
    .await;
}

/// A claim the scheduler made for an extended resource is released and
/// deleted when its pod is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_extended_resource_claim_cleaned_up() {
    let Some(p) = Pair::new("differential_extended_resource_claim_cleaned_up").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            create_extended_resource_pod(s, "ext", "ext-claim").await;
            // Running: the claim stays reserved.
            tokio::time::sleep(STABLE_FOR).await;
            s.wait_until("the running pod's claim to stay reserved", |s| {
                ensure!(s.reserved("ext-claim")? == ["pods/ext"], "not reserved");
                Ok(())
            })
            .await;
            s.set_pod_phase("ext", "Succeeded").await;
        },
        |s| {
            ensure!(s.claims.is_empty(), "{} claims left", s.claims.len());
            Ok(())
        },
        same,
    )
    .await;
}
