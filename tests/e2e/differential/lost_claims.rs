//! Scenarios: claims lost under running and bound pods, extended-resource
//! claims, late allocations, status applies that keep failing entries.

use super::*;

/// Beyond (contract, "Pod work"): when a running pod's recorded claim is
/// deleted, ours creates a replacement at once; the reference keeps
/// pointing at the deleted name (its own cache remembers creating it, for
/// up to an hour). This scenario checks that the outcomes differ in exactly
/// that way and are the same otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_deleted_claim_of_running_pod() {
    let Some(p) = Pair::new("differential_deleted_claim_of_running_pod").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_template("tmpl").await;
            s.create_pod("victim", &[("gpu", Source::Template("tmpl"))], None)
                .await;
            let first = s.recorded_claim("victim", "gpu").await;
            s.claims()
                .delete(&first, &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("{}: delete claim {first}: {e}", s.who));
            s.wait_until("the deletion to be seen", |s| {
                ensure!(s.deleted_claims.len() == 1, "not yet");
                Ok(())
            })
            .await;
        },
        // Either side: the deletion is through; ours has also replaced it.
        |s| {
            ensure!(s.deleted_claims.len() == 1, "not deleted yet");
            Ok(())
        },
        |s| {
            // Our replacement, recorded in place of the deleted claim.
            let replacement = s.recorded("victim", "gpu").unwrap_or_else(|e| {
                panic!("ours must have replaced the deleted claim at once: {e:#}")
            });
            let deleted = format!(
                "{}{DELETED}",
                s.deleted_claims[0]["name"].as_str().unwrap_or_default()
            );
            s.claims.retain(|c| c["name"] != replacement.as_str());
            for pod in &mut s.pods {
                for status in pod["resourceClaimStatuses"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    status["resourceClaimName"] = json!(deleted);
                }
            }
            vec![format!(
                "ours replaced the deleted claim of the running pod at once ({replacement}); \
                 the reference keeps recording the deleted one"
            )]
        },
    )
    .await;
}

/// A status write that drops `extendedResourceClaimStatus` of a running
/// pod is no deletion: both keep the claim reserved and allocated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_running_pod_keeps_extended_claim_when_status_drops_it() {
    let Some(p) =
        Pair::new("differential_running_pod_keeps_extended_claim_when_status_drops_it").await
    else {
        return;
    };
    p.run(
        async |s: &Side| {
            create_extended_resource_pod(s, "ext", "ext-claim").await;
            s.set_pod_phase("ext", "Running").await;
            s.patch_pod_status("ext", json!({"extendedResourceClaimStatus": null}))
                .await;
            // Long enough for a wrong release to happen and show.
            tokio::time::sleep(STABLE_FOR * 2).await;
        },
        |s| {
            ensure!(s.reserved("ext-claim")? == ["pods/ext"], "not reserved");
            Ok(())
        },
        same,
    )
    .await;
}

/// A pod without claims of its own, done, in a shared claim's
/// `reservedFor`: both remove the entry, deallocate and unprotect (the
/// allocation's own update is the event that wakes both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_done_pod_without_claims_is_removed_from_reserved_for() {
    let Some(p) =
        Pair::new("differential_done_pod_without_claims_is_removed_from_reserved_for").await
    else {
        return;
    };
    p.run(
        async |s: &Side| {
            let plain = s.create_pod("plain", &[], None).await;
            s.set_pod_phase("plain", "Succeeded").await;
            s.create_claim(json!({"name": "shared"})).await;
            s.allocate("shared", json!([pod_ref(&plain)])).await;
            // No further write to the claim: the reference removes the
            // finalizer with an update right after its status update, and a
            // concurrent write makes that update fail for good (it never
            // retries the finalizer of a claim that is not being deleted).
        },
        |s| s.released("shared"),
        same,
    )
    .await;
}

/// A pod bound by a scheduler whose claim shows up allocated a second
/// later: neither warns. Beyond (contract, "pre-scheduled"): ours would
/// warn about a pre-scheduled pod, and here checks it is not one; the
/// scenario waits out our grace period so a false warning would show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_scheduled_pod_with_late_allocation() {
    let Some(p) = Pair::new("differential_scheduled_pod_with_late_allocation").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_template("tmpl").await;
            let pod = s
                .create_pod("bound", &[("gpu", Source::Template("tmpl"))], None)
                .await;
            let claim = s.recorded_claim("bound", "gpu").await;
            s.bind_pod("bound", NODE).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            s.allocate(&claim, json!([pod_ref(&pod)])).await;
            tokio::time::sleep(NOT_ALLOCATED_GRACE + Duration::from_secs(3)).await;
        },
        |s| {
            let claim = s.recorded("bound", "gpu")?;
            ensure!(s.reserved(&claim)? == ["pods/bound"], "not reserved");
            Ok(())
        },
        |_| {
            vec![
                "ours sent no ResourceClaimNotAllocated: the pod was bound by a binder, not pre-scheduled"
                    .to_string(),
            ]
        },
    )
    .await;
}

/// A pod bound to a node whose recorded claim is deleted. Beyond (contract,
/// "bound to a node"): ours creates no replacement, keeps the recorded name
/// and tells the user with one Warning `ResourceClaimMissing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_deleted_claim_of_bound_pod() {
    let Some(p) = Pair::new("differential_deleted_claim_of_bound_pod").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_template("tmpl").await;
            s.create_pod("on-node", &[("gpu", Source::Template("tmpl"))], None)
                .await;
            let claim = s.recorded_claim("on-node", "gpu").await;
            s.bind_pod("on-node", NODE).await;
            s.claims()
                .delete(&claim, &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("{}: delete claim {claim}: {e}", s.who));
            s.wait_until("the deletion to be seen", |s| {
                ensure!(s.deleted_claims.len() == 1, "not yet");
                Ok(())
            })
            .await;
            if s.who == OURS {
                s.wait_until("the ResourceClaimMissing warning", |s| {
                    s.has_event(CLAIM_MISSING_REASON)
                })
                .await;
            }
            // Nothing more follows (a second warning, a replacement): the
            // settle step holds the outcome for STABLE_FOR.
        },
        |s| {
            ensure!(s.deleted_claims.len() == 1, "not deleted yet");
            Ok(())
        },
        |s| {
            let ours: Vec<EventKey> = s
                .events
                .iter()
                .filter(|e| e.reason == CLAIM_MISSING_REASON)
                .cloned()
                .collect();
            assert_eq!(
                ours.len(),
                1,
                "beyond point not delivered: one Warning {CLAIM_MISSING_REASON}; events: {:?}",
                s.events
            );
            for e in &ours {
                s.events.remove(e);
            }
            vec![format!(
                "ours sent Warning {CLAIM_MISSING_REASON} on {} (recorded claim of a pod on a node deleted; not replaced)",
                ours[0].object
            )]
        },
    )
    .await;
}

/// Two template entries, both recorded; template `tb` is deleted, then
/// `b`'s claim, then `a`'s. The reference's outcome varies from run to run:
/// while its own cache remembers creating `b`'s claim it does not try `b`
/// at all, and its apply records only the names it has just created, so
/// an entry is lost in some runs (kubernetes/kubernetes#138408, fixed in
/// 1.37). Beyond (contract, "Pod work"): ours replaces `a`, reports `b`'s
/// missing template, and every apply carries `b`'s recorded name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_status_apply_keeps_failing_entries() {
    let Some(p) = Pair::new("differential_status_apply_keeps_failing_entries").await else {
        return;
    };
    p.run_diverging(
        async |s: &Side| {
            s.create_template("ta").await;
            s.create_template("tb").await;
            s.create_pod(
                "two",
                &[("a", Source::Template("ta")), ("b", Source::Template("tb"))],
                None,
            )
            .await;
            let old_a = s.recorded_claim("two", "a").await;
            let old_b = s.recorded_claim("two", "b").await;
            Api::<ResourceClaimTemplate>::namespaced(s.client.clone(), &s.ns)
                .delete("tb", &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("{}: delete template tb: {e}", s.who));
            for (claim, deleted) in [(&old_b, 1), (&old_a, 2)] {
                s.claims()
                    .delete(claim, &DeleteParams::default())
                    .await
                    .unwrap_or_else(|e| panic!("{}: delete claim {claim}: {e}", s.who));
                s.wait_until("the deletion to be seen", |s| {
                    ensure!(s.deleted_claims.len() == deleted, "not yet");
                    Ok(())
                })
                .await;
                // What each side does about it shows before the next
                // deletion: the settle step cannot wait between the two.
                tokio::time::sleep(STABLE_FOR).await;
            }
        },
        |s| {
            ensure!(s.deleted_claims.len() == 2, "not both deleted yet");
            Ok(())
        },
        |s| {
            let deleted_name = |entry: &str| {
                let prefix = format!("two-{entry}-");
                s.deleted_claims
                    .iter()
                    .filter_map(|c| c["name"].as_str())
                    .find(|n| n.starts_with(&prefix))
                    .map(|n| format!("{n}{DELETED}"))
                    .unwrap_or_else(|| panic!("no deleted claim of entry {entry}"))
            };
            let (old_a, old_b) = (deleted_name("a"), deleted_name("b"));
            let new_a = s.recorded("two", "a").unwrap_or_default();
            assert!(
                new_a != old_a && !new_a.is_empty(),
                "ours must replace a's deleted claim; a is {new_a:?}"
            );
            assert_eq!(
                s.recorded_name("two", "b").ok().as_deref(),
                Some(old_b.as_str()),
                "ours must keep b's recorded name while applying a's"
            );
            let failed: Vec<&EventKey> = s
                .events
                .iter()
                .filter(|e| e.reason == FAILED_CREATION_REASON)
                .collect();
            assert!(
                !failed.is_empty(),
                "beyond point not delivered: ours must report b's missing template"
            );
            vec![format!(
                "ours reported b's missing template ({} event) and kept b's recorded name \
                 ({old_b}) in the apply that recorded a's replacement",
                failed.len()
            )]
        },
    )
    .await;
}
