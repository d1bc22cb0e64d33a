//! Claim work: drop reservations of pods that are gone or done, deallocate
//! claims nobody uses, release the delete-protection finalizer, delete
//! generated claims whose pod is done.
//!
//! [`decide`] is pure over cached state plus the answers of live pod
//! lookups; [`execute`] performs the writes.

use std::collections::HashMap;

use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tracing::{debug, info};

use super::cache::Caches;
use super::context::Context;
use super::patch;
use crate::model::consumers::DELETE_PROTECTION_FINALIZER;
use crate::model::consumers::{is_pod_consumer, is_pod_group_consumer};
use crate::model::views::ClaimView;
use crate::naming::controlling_pod;
use crate::runtime::error::{SyncError, kube_err};
use crate::runtime::priority::{Priority, with_priority};
use crate::runtime::store::object_key;

/// What a live GET said about a pod named in `reservedFor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LivePod {
    /// No such pod, or one with another UID.
    Gone,
    /// The pod exists with this UID and will never run again (Succeeded,
    /// Failed, or deleted before it was scheduled). Pods without claims of
    /// their own, which are not cached, end up here.
    Done,
    /// The pod exists with this UID and may run: keep the reservation (the
    /// scheduler may be binding it right now; our watch has not caught up).
    Active,
}

impl LivePod {
    /// What the API server's answer for the pod named in a reservation of
    /// the pod with `uid` means.
    pub fn of(pod: Option<&crate::model::views::PodView>, uid: &str) -> Self {
        match pod {
            Some(pod) if pod.uid() == uid && pod.is_done() => LivePod::Done,
            Some(pod) if pod.uid() == uid => LivePod::Active,
            _ => LivePod::Gone,
        }
    }
}

/// The writes claim work wants, in the order [`execute`] performs them.
///
/// A generated claim whose pod is done or replaced, when no pod waits to be
/// scheduled, costs two writes instead of the reference's three: it is
/// deleted first (preconditions on UID and resourceVersion), which makes it
/// unusable for anyone (kube-scheduler never reserves or allocates a claim
/// that is being deleted), then its delete-protection finalizer is removed,
/// which removes the object and its allocation with it. A process killed
/// between the two writes leaves a claim being deleted, which the next sync
/// finishes with the second write alone.
///
/// While a pod waits, the deallocation comes first, as in the reference:
/// kube-scheduler 1.36 retries a pod that waits for devices when a claim's
/// allocation is cleared, not when a claim is deleted, so without that write
/// the waiting pod would sit out the scheduler's periodic flush (5 min).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimActions {
    /// New `reservedFor` (and whether to clear the allocation with it).
    pub set_reserved_for: Option<(Vec<ResourceClaimConsumerReference>, bool)>,
    /// Clear the allocation of a claim without reservations to drop.
    pub deallocate: bool,
    /// Delete the claim: generated for a pod that is done or replaced, and
    /// nobody else uses it.
    pub delete: bool,
    /// Remove the delete-protection finalizer: once the claim is
    /// deallocated, or right away from a claim being deleted.
    pub release_finalizer: bool,
}

/// One write of claim work, in the order [`ClaimActions::writes`] gives.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimWrite {
    /// Set `reservedFor` to these consumers (clearing the allocation too
    /// when the flag says so).
    Reservations(Vec<ResourceClaimConsumerReference>, bool),
    /// Clear the allocation.
    Deallocate,
    /// Remove the delete-protection finalizer.
    ReleaseFinalizer,
    /// Delete the claim (UID and resourceVersion preconditions).
    Delete,
}

impl ClaimActions {
    /// The writes in the order they are sent, for a claim that is now
    /// `allocated` and `deleting` or not. An allocated claim is never left
    /// unprotected while it is not being deleted: unallocated once the first
    /// write is done, the finalizer goes first and the delete then removes
    /// the object at once (the reference's order); still allocated (nobody
    /// waits for its devices), the delete goes first and the finalizer's
    /// removal then takes the object and its allocation. A claim that stays
    /// allocated and is not deleted keeps its finalizer.
    pub fn writes(&self, allocated: bool, deleting: bool) -> Vec<ClaimWrite> {
        let mut writes = Vec::new();
        let deallocates = match &self.set_reserved_for {
            Some((remaining, deallocate)) => {
                writes.push(ClaimWrite::Reservations(remaining.clone(), *deallocate));
                *deallocate
            }
            None if self.deallocate => {
                writes.push(ClaimWrite::Deallocate);
                true
            }
            None => false,
        };
        let allocated = allocated && !deallocates;
        if self.release_finalizer && !allocated {
            writes.push(ClaimWrite::ReleaseFinalizer);
            if self.delete {
                writes.push(ClaimWrite::Delete);
            }
        } else {
            if self.delete {
                writes.push(ClaimWrite::Delete);
            }
            if self.release_finalizer && (self.delete || deleting) {
                writes.push(ClaimWrite::ReleaseFinalizer);
            }
        }
        writes
    }
}

/// The outcome of deciding claim work.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimDecision {
    /// These pods are in neither the cache nor the deleted set: ask the API
    /// server, then decide again with the answers.
    NeedLiveLookup(Vec<(String, String)>),
    /// As `NeedLiveLookup`, for PodGroups (DRAWorkloadResourceClaims on).
    NeedGroupLookup(Vec<(String, String)>),
    Act(ClaimActions),
}

/// Decides claim work. `live` holds answers for pods by UID; `pods_wait`
/// says whether some pod waits to be scheduled (and may need the devices
/// this claim frees).
pub fn decide(
    claim: &ClaimView,
    caches: &Caches,
    live: &HashMap<String, LivePod>,
    pods_wait: bool,
) -> ClaimDecision {
    let ns = claim.namespace();
    let reserved = &claim.status.reserved_for;
    let mut remaining = Vec::with_capacity(reserved.len());
    let mut lookups = Vec::new();
    let mut group_lookups = Vec::new();
    for consumer in reserved.iter() {
        if caches.group_claims_enabled() && is_pod_group_consumer(consumer) {
            // A PodGroup keeps its reservation until it is gone: deleted,
            // or replaced by another of the same name (a group has no
            // "done"; a terminating one may still have running members).
            let keep = if caches.deleted_pod_groups.contains(&consumer.uid) {
                false
            } else if let Some(group) = caches.pod_groups.get(&object_key(ns, &consumer.name)) {
                group.uid() == consumer.uid
            } else {
                match live.get(&consumer.uid) {
                    Some(LivePod::Gone | LivePod::Done) => false,
                    Some(LivePod::Active) => true,
                    None => {
                        group_lookups.push((consumer.name.clone(), consumer.uid.clone()));
                        true
                    }
                }
            };
            if keep {
                remaining.push(consumer.clone());
            }
            continue;
        }
        if !is_pod_consumer(consumer) {
            // Other consumer kinds are someone else's business: keep them.
            remaining.push(consumer.clone());
            continue;
        }
        let keep = if caches.deleted_pods.contains(&consumer.uid) {
            false
        } else if let Some(pod) = caches.pods.get(&object_key(ns, &consumer.name)) {
            pod.uid() == consumer.uid && !pod.is_done()
        } else {
            match live.get(&consumer.uid) {
                Some(LivePod::Gone | LivePod::Done) => false,
                Some(LivePod::Active) => true,
                None => {
                    lookups.push((consumer.name.clone(), consumer.uid.clone()));
                    true
                }
            }
        };
        if keep {
            remaining.push(consumer.clone());
        }
    }
    if !lookups.is_empty() {
        return ClaimDecision::NeedLiveLookup(lookups);
    }
    if !group_lookups.is_empty() {
        return ClaimDecision::NeedGroupLookup(group_lookups);
    }

    let protected = claim
        .finalizers()
        .iter()
        .any(|f| f == DELETE_PROTECTION_FINALIZER);
    let unused = remaining.is_empty();
    let deleting = claim.is_deleting();
    let mut actions = ClaimActions::default();
    let delete = unused && !deleting && owner_is_finished(claim, caches);
    if delete || (unused && deleting) {
        // The claim goes away: deallocate only to tell the scheduler.
        if pods_wait && protected && claim.is_allocated() {
            if remaining.len() < reserved.len() {
                actions.set_reserved_for = Some((remaining, true));
            } else {
                actions.deallocate = true;
            }
        }
        actions.delete = delete;
        actions.release_finalizer = protected;
    } else if remaining.len() < reserved.len() {
        // Deallocate on the transition from used to unused, so the devices
        // are free for others and the next consumer is not tied to the
        // node the previous one ran on.
        let deallocate = unused && protected && claim.is_allocated();
        actions.set_reserved_for = Some((remaining, deallocate));
        actions.release_finalizer = unused && protected;
    }
    ClaimDecision::Act(actions)
}

/// Whether the pod that owns this claim (a generated claim) is cached and
/// done, or replaced under its name: then the claim is ours to delete. A
/// claim whose pod is deleted or unknown is left to the garbage collector,
/// as the reference leaves it.
fn owner_is_finished(claim: &ClaimView, caches: &Caches) -> bool {
    let Some((pod_name, pod_uid)) = controlling_pod(claim.owner_references()) else {
        return false;
    };
    caches
        .pods
        .get(&object_key(claim.namespace(), pod_name))
        .is_some_and(|pod| pod.uid() != pod_uid || pod.is_done())
}

/// Whether claim work for this claim would do anything, judged from the
/// caches alone (a claim that needs a live lookup counts: only the lookup
/// can tell).
pub(crate) fn needs_work(claim: &ClaimView, caches: &Caches) -> bool {
    match decide(claim, caches, &HashMap::new(), false) {
        ClaimDecision::NeedLiveLookup(_) | ClaimDecision::NeedGroupLookup(_) => true,
        ClaimDecision::Act(actions) => actions != ClaimActions::default(),
    }
}

/// Performs claim work for the cached claim. Its requests wait behind pods
/// starting at the client's budget, unless a pod waits to be scheduled (it
/// may need the devices this work frees).
pub async fn execute(ctx: &Context, claim: &ClaimView) -> Result<(), SyncError> {
    let pods_wait = ctx.caches.pods_wait_to_start();
    let class = if pods_wait {
        Priority::StartUp
    } else {
        Priority::Cleanup
    };
    with_priority(class, execute_as(ctx, claim, pods_wait)).await
}

async fn execute_as(ctx: &Context, claim: &ClaimView, pods_wait: bool) -> Result<(), SyncError> {
    let (ns, name) = (claim.namespace().to_string(), claim.name().to_string());
    let key = format!("{ns}/{name}");
    let mut live = HashMap::new();
    let actions = loop {
        match decide(claim, &ctx.caches, &live, pods_wait) {
            ClaimDecision::Act(actions) => break actions,
            ClaimDecision::NeedLiveLookup(pods) => {
                for (pod_name, uid) in pods {
                    let state = lookup_pod(ctx, &ns, &pod_name, &uid).await?;
                    debug!(pod = %pod_name, ?state, "checked reserved pod with the API server");
                    live.insert(uid, state);
                }
            }
            ClaimDecision::NeedGroupLookup(groups) => {
                for (group_name, uid) in groups {
                    let state = lookup_pod_group(ctx, &ns, &group_name, &uid).await?;
                    debug!(podgroup = %group_name, ?state, "checked reserved PodGroup with the API server");
                    live.insert(uid, state);
                }
            }
        }
    };
    if actions == ClaimActions::default() {
        return Ok(());
    }
    let api: Api<ClaimView> = Api::namespaced(ctx.client.clone(), &ns);
    let mut current = claim.clone();
    for write in actions.writes(claim.is_allocated(), claim.is_deleting()) {
        match write {
            ClaimWrite::Reservations(remaining, deallocate) => {
                let p = patch::remove_reservations(claim, &remaining, deallocate);
                current = api
                    .patch_status(&name, &PatchParams::default(), &Patch::Json::<()>(p))
                    .await
                    .map_err(kube_err(format_args!(
                        "removing stale status.reservedFor entries of ResourceClaim {key}"
                    )))?;
                info!(
                    remaining = remaining.len(),
                    deallocated = deallocate,
                    "removed stale reservations"
                );
            }
            ClaimWrite::Deallocate => {
                current = api
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Json::<()>(patch::deallocate(claim)),
                    )
                    .await
                    .map_err(kube_err(format_args!(
                        "clearing status.allocation of ResourceClaim {key}"
                    )))?;
                info!("deallocated unused claim for a waiting pod");
            }
            ClaimWrite::ReleaseFinalizer => {
                // The plan was made from the cache; the server's answer has
                // the last word: an allocated claim that is not being
                // deleted keeps its protection (decided again later).
                if current.is_allocated() && !current.is_deleting() {
                    debug!("the claim is still allocated; keeping its finalizer");
                    continue;
                }
                if let Some(updated) = remove_protection(&api, &current, &key).await? {
                    current = updated;
                }
            }
            ClaimWrite::Delete => match delete_judged(&api, &current, &key).await? {
                Some(terminating) => current = terminating,
                None => return Ok(()),
            },
        }
    }
    Ok(())
}

/// Deletes exactly the claim judged (UID and resourceVersion
/// preconditions: another with the same name, or this one changed since,
/// is decided again instead). The terminating claim while a finalizer holds
/// it back; `None` once it is gone.
async fn delete_judged(
    api: &Api<ClaimView>,
    current: &ClaimView,
    key: &str,
) -> Result<Option<ClaimView>, SyncError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(current.uid().to_string()),
            resource_version: current.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    match api.delete(current.name(), &params).await {
        // The answer is the object while a finalizer holds it back, else
        // the final Status.
        Ok(answer) => match answer.left() {
            Some(terminating) => {
                info!("deleting claim of a pod that is done or gone");
                Ok(Some(terminating))
            }
            None => {
                info!("deleted claim of a pod that is done or gone");
                Ok(None)
            }
        },
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(SyncError::kube(
            format_args!("deleting unused generated ResourceClaim {key}"),
            e,
        )),
    }
}

/// Removes the delete-protection finalizer from the claim as seen (guarded
/// by its version); the updated claim, or `None` when there was nothing to
/// remove or the claim went away meanwhile.
///
/// When the guard fails because someone else wrote the claim in between
/// (a label, an annotation), the claim is read again and the removal
/// retried while it is still the same claim, unused and unallocated. Only
/// this step needs that: the writes before it leave a state the next sync
/// reads back, but an unused, unallocated claim that still carries the
/// finalizer looks like one the scheduler is about to allocate, so a later
/// decision could not tell that the removal is owed.
async fn remove_protection(
    api: &Api<ClaimView>,
    current: &ClaimView,
    key: &str,
) -> Result<Option<ClaimView>, SyncError> {
    const ATTEMPTS: usize = 3;
    let mut seen = current.clone();
    for attempt in 1..=ATTEMPTS {
        let Some(p) = patch::remove_finalizer(&seen, DELETE_PROTECTION_FINALIZER) else {
            return Ok(None);
        };
        let err = match api
            .patch(seen.name(), &PatchParams::default(), &Patch::Json::<()>(p))
            .await
        {
            Ok(updated) => {
                info!("removed delete-protection finalizer");
                return Ok(Some(updated));
            }
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => SyncError::kube(
                format_args!(
                    "removing finalizer {DELETE_PROTECTION_FINALIZER} of ResourceClaim {key}"
                ),
                e,
            ),
        };
        if !matches!(err, SyncError::Conflict { .. }) || attempt == ATTEMPTS {
            return Err(err);
        }
        let fresh = api
            .get_opt(seen.name())
            .await
            .map_err(kube_err(format_args!(
                "reading ResourceClaim {key} again to remove its finalizer"
            )))?;
        match fresh {
            Some(fresh) if still_owes_release(current, &fresh) => {
                debug!(
                    attempt,
                    "claim changed meanwhile; removing the finalizer from the fresh copy"
                );
                seen = fresh;
            }
            Some(_) => return Err(err),
            None => return Ok(None),
        }
    }
    unreachable!("the last attempt returns")
}

/// Whether a claim read again is still the one whose finalizer we set out
/// to remove, in a state where removing it is right: same UID, nobody
/// reserved, nothing allocated.
fn still_owes_release(judged: &ClaimView, fresh: &ClaimView) -> bool {
    fresh.uid() == judged.uid() && fresh.status.reserved_for.is_empty() && !fresh.is_allocated()
}

async fn lookup_pod_group(
    ctx: &Context,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<LivePod, SyncError> {
    let Some(api) = ctx.caches.pod_group_api() else {
        return Ok(LivePod::Active);
    };
    let groups: Api<crate::model::views::PodGroupView> =
        Api::namespaced_with(ctx.client.clone(), ns, api);
    let group = groups.get_opt(name).await.map_err(kube_err(format_args!(
        "looking up PodGroup {ns}/{name} reserved in a claim"
    )))?;
    Ok(match group {
        Some(g) if g.uid() == uid => LivePod::Active,
        _ => LivePod::Gone,
    })
}

async fn lookup_pod(ctx: &Context, ns: &str, name: &str, uid: &str) -> Result<LivePod, SyncError> {
    let api: Api<crate::model::views::PodView> = Api::namespaced(ctx.client.clone(), ns);
    let pod = api.get_opt(name).await.map_err(kube_err(format_args!(
        "looking up pod {ns}/{name} reserved in a claim"
    )))?;
    Ok(LivePod::of(pod.as_ref(), uid))
}

#[cfg(test)]
mod tests;
