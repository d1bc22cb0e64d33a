//! Pod work's writes: [`execute`] carries out a [`PodDecision`] (claims
//! created or adopted and recorded, reservations for pre-scheduled pods,
//! the warnings), asking the API server first wherever the caches may be
//! behind.

use kube::api::{Api, Patch, PatchParams};
use tracing::{debug, info, warn};

use super::{
    EntryAction, EntryOwner, NOT_ALLOCATED_GRACE, PodDecision, REASON_CLAIM_MISSING,
    REASON_NOT_ALLOCATED, not_allocated_message, perform_entries, record_entries,
};
use crate::controllers::resourceclaim::context::Context;
use crate::controllers::resourceclaim::metrics::ClaimOwner;
use crate::controllers::resourceclaim::patch;
use crate::model::views::{ClaimView, PodView};
use crate::naming::is_controlled_by;
use crate::runtime::controller::Action;
use crate::runtime::error::{SyncError, kube_err};

/// Performs pod work. Returns an error (and the key is retried with
/// backoff) when any entry failed or a write failed.
pub async fn execute(
    ctx: &Context,
    pod: &PodView,
    mut decision: PodDecision,
) -> Result<Action, SyncError> {
    if let Some(why) = decision.refused {
        return Err(SyncError::NonRetryable(format!(
            "pod {}: {why}",
            pod.name()
        )));
    }
    let (ns, name) = (pod.namespace(), pod.name());
    if ctx.gates.release.is_1_37() {
        confirm_recorded_claims_gone(ctx, pod, &mut decision).await?;
    }
    let outcome = perform_entries(
        ctx,
        ns,
        pod.uid(),
        ClaimOwner::POD,
        decision.recorded,
        decision.entries,
    )
    .await;
    let owner = EntryOwner {
        involved: pod.involved(),
        entry_kind: "PodResourceClaim",
        owner_word: "pod",
    };
    record_entries(
        ctx,
        Api::<PodView>::namespaced(ctx.client.clone(), ns),
        &owner,
        &outcome,
    )
    .await?;
    let created = outcome.created;
    for (entry, claim_name) in &decision.missing {
        report_missing_claim(ctx, pod, entry, claim_name).await?;
    }
    for reservation in decision.reservations {
        let claim = &reservation.claim;
        debug!(claim = %claim.name(), "reserving claim for pre-scheduled pod");
        let p = patch::add_reservation(claim, &reservation.consumer);
        let api: Api<ClaimView> = Api::namespaced(ctx.client.clone(), ns);
        api.patch_status(claim.name(), &PatchParams::default(), &Patch::Json::<()>(p))
            .await
            .map_err(kube_err(format_args!(
                "reserving ResourceClaim {ns}/{} for pod {name}",
                claim.name()
            )))?;
        info!(claim = %claim.name(), "reserved claim for pod");
    }
    if pod.is_pre_scheduled() && !created.is_empty() {
        // Just made: give whoever may allocate it the grace period too.
        return Ok(Action::RecheckAfter(NOT_ALLOCATED_GRACE));
    }
    if decision.unallocated.is_empty() {
        return Ok(Action::Done);
    }
    let waited = pod
        .history
        .first_seen
        .map_or(NOT_ALLOCATED_GRACE, |seen| seen.elapsed());
    if let Some(left) = NOT_ALLOCATED_GRACE
        .checked_sub(waited)
        .filter(|d| !d.is_zero())
    {
        return Ok(Action::RecheckAfter(left));
    }
    for claim_name in &decision.unallocated {
        warn_if_still_unallocated(ctx, pod, claim_name).await?;
    }
    Ok(Action::Done)
}

/// 1.37: before a claim the pod's status records is replaced because the
/// caches do not have it, the API server is asked. A claim the caches lost
/// (or have not shown yet) but that exists and is the pod's is recorded
/// again instead of duplicated; only a claim the server does not have (or
/// that is not the pod's) is replaced.
async fn confirm_recorded_claims_gone(
    ctx: &Context,
    pod: &PodView,
    decision: &mut PodDecision,
) -> Result<(), SyncError> {
    let mut confirmed = Vec::with_capacity(decision.entries.len());
    for action in std::mem::take(&mut decision.entries) {
        let recorded = match &action {
            EntryAction::Create { entry, .. } => decision.recorded.get(entry).cloned().flatten(),
            _ => None,
        };
        if let Some(recorded) = recorded {
            let fresh = read_claim(ctx, pod.namespace(), &recorded).await?;
            if fresh.is_some_and(|c| is_controlled_by(c.owner_references(), pod.uid())) {
                info!(claim = %recorded, "the recorded claim exists after all (the caches missed it): not replaced");
                continue;
            }
        }
        confirmed.push(action);
    }
    decision.entries = confirmed;
    Ok(())
}

/// The claim as the API server has it now, for decisions the cache may be
/// too late for.
async fn read_claim(ctx: &Context, ns: &str, name: &str) -> Result<Option<ClaimView>, SyncError> {
    Api::<ClaimView>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(kube_err(format_args!("reading ResourceClaim {ns}/{name}")))
}

/// Warns that a pre-scheduled pod's claim is not allocated, after asking
/// the API server: the cached claim may be behind.
async fn warn_if_still_unallocated(
    ctx: &Context,
    pod: &PodView,
    claim_name: &str,
) -> Result<(), SyncError> {
    let fresh = read_claim(ctx, pod.namespace(), claim_name).await?;
    if fresh.is_none_or(|c| c.is_allocated()) {
        debug!(claim = %claim_name, "claim is allocated (or gone) after all: no warning");
        return Ok(());
    }
    let node = pod.node_name().unwrap_or_default();
    ctx.events
        .warn(
            &pod.involved(),
            REASON_NOT_ALLOCATED,
            &not_allocated_message(claim_name, node),
        )
        .await;
    Ok(())
}

/// Tells the user, once, that a pod on a node lost its recorded claim and
/// is not given a new one. Asks the API server first: a claim missing from
/// the cache may only be late.
async fn report_missing_claim(
    ctx: &Context,
    pod: &PodView,
    entry: &str,
    claim_name: &str,
) -> Result<(), SyncError> {
    let fresh = read_claim(ctx, pod.namespace(), claim_name).await?;
    if fresh.is_some_and(|c| is_controlled_by(c.owner_references(), pod.uid())) {
        debug!(entry, claim = %claim_name, "recorded claim exists after all: the claim watch is behind");
        return Ok(());
    }
    let node = pod.node_name().unwrap_or_default();
    warn!(entry, claim = %claim_name, node, "recorded claim of a pod on a node is gone; not replacing it");
    ctx.events
        .warn(
            &pod.involved(),
            REASON_CLAIM_MISSING,
            &format!(
                "ResourceClaim {claim_name} of PodResourceClaim {entry} was deleted (or is no longer \
                 controlled by this pod) while the pod is bound to node {node}. No replacement is \
                 created: it could not be allocated for a pod already on a node, and the kubelet \
                 releases devices by the recorded name. Delete the pod and create it again"
            ),
        )
        .await;
    ctx.caches.note_missing_claim_reported(pod.uid(), entry);
    Ok(())
}
