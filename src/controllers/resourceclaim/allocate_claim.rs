//! Allocating a pre-scheduled pod's claim on a declared node: read the
//! claim and every allocated device fresh, run the allocator, write the
//! result and the reservation in one guarded status patch.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimConsumerReference};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tracing::{debug, info, warn};

use super::allocation::Allocation;
use super::context::Context;
use super::error::{SyncError, kube_err};
use super::views::{ClaimView, PodView};
use crate::allocate::{self, AllocationInput, DeviceId, Outcome};

/// Event reason for a claim the allocator could not allocate.
pub const REASON_ALLOCATION_FAILED: &str = "FailedResourceClaimAllocation";
/// The finalizer kube-scheduler puts on claims it allocates, so that an
/// allocated claim is not deleted before it is deallocated.
pub const DELETE_PROTECTION_FINALIZER: &str = "resource.kubernetes.io/delete-protection";
/// Page size of the fresh claim read.
const LIST_PAGE: u32 = 500;

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Allocated,
    /// Someone else allocated it, or it is gone or being deleted.
    NothingToDo,
    /// No allocation now; the pod waits (the user was told).
    Waiting,
}

/// Allocates `claim_name` for `pod` (reserving it for `consumer`).
pub async fn allocate_for_pod(
    ctx: &Context,
    state: &Allocation,
    pod: &PodView,
    claim_name: &str,
    consumer: &ResourceClaimConsumerReference,
) -> Result<Attempt, SyncError> {
    let ns = pod.namespace();
    let node = pod.node_name().unwrap_or_default();
    let _turn = state.turn.lock().await;
    let claims: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), ns);
    let read = claims.get_opt(claim_name).await;
    let Some(claim) = read.map_err(kube_err(format_args!(
        "reading ResourceClaim {ns}/{claim_name}"
    )))?
    else {
        return Ok(Attempt::NothingToDo);
    };
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    if claim.metadata.deletion_timestamp.is_some()
        || claim
            .status
            .as_ref()
            .is_some_and(|s| s.allocation.is_some())
    {
        // Allocated (by us, seen now, or by someone else): the reservation
        // follows from the claim watch.
        state.forget_written(&uid);
        return Ok(Attempt::NothingToDo);
    }
    // Read fresh: an earlier write of ours that lost its answer did not
    // commit after all.
    state.forget_written(&uid);
    let fresh = list_claims(ctx).await?;
    let cached = ctx.caches.claims.list();
    let in_use = state.in_use(fresh.iter().chain(cached.iter().map(|c| &**c)), &uid);
    let slices = state.slices.list();
    let slices: Vec<_> = slices.iter().map(|s| (**s).clone()).collect();
    let inventory = allocate::node_inventory(node, &slices);
    let classes: BTreeMap<String, DeviceClass> = state
        .classes
        .list()
        .into_iter()
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), (*c).clone()))
        .collect();
    let outcome = allocate::allocate(&AllocationInput {
        claim: &claim,
        classes: &classes,
        node,
        inventory: &inventory,
        in_use: &in_use,
        admin_access_enabled: ctx.gates.admin_access,
        prioritized_list_enabled: ctx.gates.prioritized_list,
    });
    let pod_key = format!("{ns}/{}", pod.name());
    let (label, why) = match outcome {
        Outcome::Allocated(result) => ("allocated", Ok(result)),
        Outcome::Unsatisfiable(why) => ("unsatisfiable", Err(why)),
        Outcome::Refused(why) => ("refused", Err(why)),
    };
    let result = match why {
        Ok(result) => result,
        Err(why) => {
            ctx.metrics.record_allocation(label);
            let message = format!("ResourceClaim {claim_name} on node {node}: {why}");
            warn!(claim = %claim_name, node, reason = %why, "cannot allocate claim");
            if state.wait(&pod_key, node, &message) {
                ctx.events
                    .warn(pod, REASON_ALLOCATION_FAILED, &message)
                    .await;
            }
            return Ok(Attempt::Waiting);
        }
    };
    let devices: Vec<DeviceId> = result
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.admin_access != Some(true))
        .map(|r| DeviceId {
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
        })
        .collect();
    let mut version = claim.metadata.resource_version.clone().unwrap_or_default();
    let finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
    if !finalizers.iter().any(|f| f == DELETE_PROTECTION_FINALIZER) {
        let add = if finalizers.is_empty() {
            json!({"op": "add", "path": "/metadata/finalizers", "value": [DELETE_PROTECTION_FINALIZER]})
        } else {
            json!({"op": "add", "path": "/metadata/finalizers/-", "value": DELETE_PROTECTION_FINALIZER})
        };
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            add,
        ]))
        .expect("well-formed patch");
        let updated = claims
            .patch(
                claim_name,
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await
            .inspect_err(|_| ctx.metrics.record_allocation("failed"))
            .map_err(kube_err(format_args!(
                "adding finalizer {DELETE_PROTECTION_FINALIZER} to ResourceClaim {ns}/{claim_name}"
            )))?;
        version = updated.metadata.resource_version.unwrap_or_default();
    }
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "add", "path": "/status/allocation", "value": result},
        {"op": "add", "path": "/status/reservedFor", "value": [consumer]},
    ]))
    .expect("well-formed patch");
    // Counted as taken before the write: an answer lost after the write
    // committed must not free the devices for the next claim.
    state.note_written(&uid, devices.clone());
    let written = claims
        .patch_status(
            claim_name,
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await;
    if let Err(err) = written {
        if !super::pod::may_have_committed(&err) {
            state.forget_written(&uid);
        }
        ctx.metrics.record_allocation("failed");
        return Err(kube_err(format_args!(
            "writing status.allocation of ResourceClaim {ns}/{claim_name}"
        ))(err));
    }
    ctx.metrics.record_allocation("allocated");
    state.stop_waiting(&pod_key);
    let names: Vec<String> = devices.iter().map(ToString::to_string).collect();
    info!(claim = %claim_name, node, devices = ?names, "allocated claim and reserved it for the pod");
    Ok(Attempt::Allocated)
}

/// Every claim as the API server has it now (a quorum read, paged): the
/// claim watch may lag by seconds, and a device must never be handed out
/// twice because a watch was late.
async fn list_claims(ctx: &Context) -> Result<Vec<ClaimView>, SyncError> {
    let api: Api<ClaimView> = Api::all(ctx.client.clone());
    let mut claims = Vec::new();
    let mut params = ListParams::default().limit(LIST_PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(kube_err(format_args!("listing ResourceClaims")))?;
        claims.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    debug!(claims = claims.len(), "read every claim for allocation");
    Ok(claims)
}
