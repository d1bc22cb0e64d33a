//! One allocation attempt for a pre-scheduled pod on a declared node: read
//! the claims and every allocated device fresh, plan all the pod's claims
//! together, then write each result and its reservation in one guarded
//! status patch. Attempts run one at a time (the allocator's queue has one
//! worker), so each sees what the one before it wrote.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceClass, ResourceClaim, ResourceClaimConsumerReference,
};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tracing::{debug, info, warn};

use super::Context;
use crate::allocate::{self, AllocationInput, Inventory, Outcome, devices_taken};
use crate::model::DeviceId;
use crate::model::consumers::DELETE_PROTECTION_FINALIZER;
use crate::model::features::FeatureGates;
use crate::model::views::{ClaimView, PodView};
use crate::runtime::error::{SyncError, kube_err, may_have_committed};
use crate::runtime::store::object_key;

/// Event reason for a claim the allocator could not allocate.
pub(crate) const REASON_ALLOCATION_FAILED: &str = "FailedResourceClaimAllocation";
/// Page size of the fresh claim read.
const LIST_PAGE: u32 = 500;
/// Claim orders tried for a pod with several claims to allocate (all
/// orders of up to four claims; the given order beyond that).
const MAX_ORDERS: usize = 24;

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    Allocated,
    /// Nothing left to allocate (allocated meanwhile, gone, being deleted).
    NothingToDo,
    /// No allocation now; the pod waits (the user was told).
    Waiting,
}

/// A claim of the pod to allocate, and whom to reserve it for.
pub(crate) struct Wanted<'a> {
    pub claim_name: &'a str,
    pub consumer: &'a ResourceClaimConsumerReference,
}

/// Allocates the pod's `wanted` claims together: either every one gets
/// devices, or none is written.
pub(crate) async fn allocate_for_pod(
    ctx: &Context,
    pod: &PodView,
    wanted: &[Wanted<'_>],
) -> Result<Attempt, SyncError> {
    let state = &ctx.state;
    let ns = pod.namespace();
    let node = pod.node_name().unwrap_or_default();
    let api: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), ns);
    let mut claims = Vec::new();
    for w in wanted {
        let read = api.get_opt(w.claim_name).await;
        let name = w.claim_name;
        let Some(claim) =
            read.map_err(kube_err(format_args!("reading ResourceClaim {ns}/{name}")))?
        else {
            continue;
        };
        state.claim_read(&claim);
        let allocated = claim
            .status
            .as_ref()
            .is_some_and(|s| s.allocation.is_some());
        if claim.metadata.deletion_timestamp.is_none() && !allocated {
            claims.push((claim, w.consumer));
        }
    }
    if claims.is_empty() {
        // Allocated (by us, seen now, or by someone else): the reservation
        // follows from the claim watch.
        return Ok(Attempt::NothingToDo);
    }
    let fresh = list_claims(ctx).await?;
    let cached = ctx.claims.list();
    let uids: HashSet<&str> = claims
        .iter()
        .filter_map(|(c, _)| c.metadata.uid.as_deref())
        .collect();
    let in_use = state.in_use(fresh.iter().chain(cached.iter().map(|c| &**c)), &uids);
    let rules = crate::model::device_taints::rules_of(&state.rules.list());
    let inventory = allocate::node_inventory(node, &state.slices.list()).with_rules(&rules);
    let classes: BTreeMap<String, Arc<DeviceClass>> = state
        .classes
        .list()
        .into_iter()
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
        .collect();
    let pod_key = object_key(ns, pod.name());
    let gates = ctx.gates;
    let to_plan: Vec<&ResourceClaim> = claims.iter().map(|(c, _)| c).collect();
    let plan = match plan(&to_plan, &classes, node, &inventory, in_use, gates) {
        Ok(plan) => plan,
        Err((label, claim_name, why)) => {
            ctx.metrics.record_allocation(label);
            let message = format!("ResourceClaim {claim_name} on node {node}: {why}");
            if state.wait(&pod_key, node, &message) {
                warn!(claim = %claim_name, node, reason = %why, "cannot allocate claim");
                ctx.events
                    .warn(&pod.involved(), REASON_ALLOCATION_FAILED, &message)
                    .await;
            } else {
                debug!(claim = %claim_name, node, reason = %why, "still cannot allocate claim");
            }
            return Ok(Attempt::Waiting);
        }
    };
    for ((claim, consumer), result) in claims.iter().zip(plan) {
        write(ctx, &api, claim, consumer, result, node).await?;
    }
    state.stop_waiting(&pod_key);
    Ok(Attempt::Allocated)
}

/// An allocation for every claim, trying claim orders (an earlier claim's
/// devices are not free for a later one); the first order's failure when
/// none works: `(metric label, claim, reason)`.
/// `gates`: the allocator reads DRAAdminAccess and DRAPrioritizedList.
pub(crate) fn plan(
    claims: &[&ResourceClaim],
    classes: &BTreeMap<String, Arc<DeviceClass>>,
    node: &str,
    inventory: &Inventory,
    in_use: HashSet<DeviceId>,
    gates: FeatureGates,
) -> Result<Vec<AllocationResult>, (&'static str, String, String)> {
    // One solver thread for every claim and order, and one wall-clock
    // bound for all of them: a pod of several hostile claims costs no more
    // than one.
    allocate::on_solver_stack(|| {
        let deadline = std::time::Instant::now() + allocate::allocator::MAX_SEARCH_TIME;
        let mut first_failure = None;
        for order in orders(claims.len()) {
            let mut taken = in_use.clone();
            let mut results: Vec<Option<AllocationResult>> = vec![None; claims.len()];
            let mut failed = None;
            for &i in &order {
                let claim = claims[i];
                let input = AllocationInput {
                    claim,
                    classes,
                    node,
                    inventory,
                    in_use: &taken,
                    admin_access_enabled: gates.admin_access,
                    prioritized_list_enabled: gates.prioritized_list,
                };
                let outcome = allocate::allocate_until(&input, deadline);
                let name = claim.metadata.name.clone().unwrap_or_default();
                match outcome {
                    Outcome::Allocated(result) => {
                        taken.extend(devices_taken(&result));
                        results[i] = Some(result);
                    }
                    Outcome::Unsatisfiable(why) => {
                        failed = Some(("unsatisfiable", name, why));
                        break;
                    }
                    Outcome::Refused(why) => {
                        // No order changes what the claim asks for.
                        return Err(("refused", name, why));
                    }
                }
            }
            match failed {
                None => return Ok(results.into_iter().flatten().collect()),
                Some(failure) => {
                    first_failure.get_or_insert(failure);
                }
            }
        }
        Err(first_failure.expect("at least one order is tried"))
    })
    .unwrap_or_else(|err| {
        let name = claims
            .first()
            .and_then(|c| c.metadata.name.clone())
            .unwrap_or_default();
        Err((
            "refused",
            name,
            format!("cannot start the allocation thread: {err}"),
        ))
    })
}

/// Orders of `n` claims to try: the given one first.
fn orders(n: usize) -> Vec<Vec<usize>> {
    fn permute(prefix: &mut Vec<usize>, rest: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if rest.is_empty() {
            out.push(prefix.clone());
            return;
        }
        for i in 0..rest.len() {
            let x = rest.remove(i);
            prefix.push(x);
            permute(prefix, rest, out);
            prefix.pop();
            rest.insert(i, x);
        }
    }
    let mut out = Vec::new();
    if n <= 4 {
        permute(&mut Vec::new(), &mut (0..n).collect(), &mut out);
    } else {
        out.push((0..n).collect());
    }
    out.truncate(MAX_ORDERS);
    out
}

/// Adds the finalizer, then writes allocation and reservation in one patch
/// guarded by the resourceVersion.
async fn write(
    ctx: &Context,
    api: &Api<ResourceClaim>,
    claim: &ResourceClaim,
    consumer: &ResourceClaimConsumerReference,
    mut result: AllocationResult,
    node: &str,
) -> Result<(), SyncError> {
    // kube-scheduler 1.36 stamps the allocation (DRADeviceBindingConditions
    // and DRAResourceClaimDeviceStatus, both on by default); an API server
    // without those gates drops the field.
    result.allocation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    let devices = devices_taken(&result);
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
        let updated = api
            .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .inspect_err(|_| ctx.metrics.record_allocation("failed"))
            .map_err(kube_err(format_args!(
                "adding finalizer {DELETE_PROTECTION_FINALIZER} to ResourceClaim {ns}/{name}"
            )))?;
        version = updated.metadata.resource_version.unwrap_or_default();
    }
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "add", "path": "/status/allocation", "value": result},
        {"op": "add", "path": "/status/reservedFor", "value": [consumer]},
    ]))
    .expect("well-formed patch");
    // Counted as taken before the write, with the version it is guarded
    // by: an answer lost after the write committed (or a write that
    // commits late) must not free the devices for the next claim.
    let state = &ctx.state;
    state.note_written(uid, &version, devices.clone());
    let written = api
        .patch_status(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await;
    if let Err(err) = written {
        if !may_have_committed(&err) {
            state.forget_written(uid);
        }
        ctx.metrics.record_allocation("failed");
        return Err(kube_err(format_args!(
            "writing status.allocation of ResourceClaim {ns}/{name}"
        ))(err));
    }
    ctx.metrics.record_allocation("allocated");
    let names: Vec<String> = devices.iter().map(ToString::to_string).collect();
    info!(claim = %name, node, devices = ?names, "allocated claim and reserved it for the pod");
    Ok(())
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

/// Tells the pod's kubelet that its devices are allocated, by setting
/// [`crate::naming::DEVICES_ALLOCATED_ANNOTATION`]. Best effort: without
/// it the kubelet still prepares, after its back-off.
pub(crate) async fn wake_kubelet(ctx: &Context, pod: &PodView) {
    let api: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(ctx.client.clone(), pod.namespace());
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    let patch =
        json!({"metadata": {"annotations": {crate::naming::DEVICES_ALLOCATED_ANNOTATION: now}}});
    let params = PatchParams {
        field_manager: Some(crate::naming::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api.patch(pod.name(), &params, &Patch::Merge(&patch)).await {
        Ok(_) => debug!("annotated the pod so that its kubelet prepares its devices now"),
        Err(err) => {
            debug!(error = %err, "could not annotate the pod; its kubelet prepares after its back-off")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::ResourceSlice;

    /// Two claims of one pod: the first fits either device, the second only
    /// model a. Claim by claim in the given order would strand the second;
    /// planning both finds the assignment kube-scheduler would.
    #[test]
    fn a_pods_claims_are_planned_together() {
        let slice: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "s"},
            "spec": {"driver": "gpu", "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "a"}}},
                                 {"name": "gpu-1", "attributes": {"model": {"string": "b"}}}]}}))
        .unwrap();
        let class: DeviceClass =
            serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {}})).unwrap();
        let classes = BTreeMap::from([("gpu".to_string(), Arc::new(class))]);
        let claim = |name: &str, selectors: serde_json::Value| -> ResourceClaim {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                    "deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 1, "selectors": selectors}}]}}}))
            .unwrap()
        };
        let any = claim("any", json!([]));
        let model_a = claim(
            "model-a",
            json!([{"cel": {"expression": "device.attributes['gpu'].model == 'a'"}}]),
        );
        let inventory = allocate::node_inventory("n", &[slice]);
        let plan = plan(
            &[&any, &model_a],
            &classes,
            "n",
            &inventory,
            HashSet::new(),
            FeatureGates::default(),
        )
        .unwrap();
        let device = |r: &AllocationResult| {
            r.devices.as_ref().unwrap().results.as_ref().unwrap()[0]
                .device
                .clone()
        };
        assert_eq!(device(&plan[0]), "gpu-1");
        assert_eq!(device(&plan[1]), "gpu-0");
        // Nothing fits both: the failure of the given order is told.
        let err = plan_err(&[&model_a, &model_a.clone()], &classes, &inventory);
        assert_eq!(err.0, "unsatisfiable");
    }

    fn plan_err(
        claims: &[&ResourceClaim],
        classes: &BTreeMap<String, Arc<DeviceClass>>,
        inventory: &Inventory,
    ) -> (&'static str, String, String) {
        plan(
            claims,
            classes,
            "n",
            inventory,
            HashSet::new(),
            FeatureGates::default(),
        )
        .unwrap_err()
    }

    #[test]
    fn orders_start_with_the_given_one_and_stay_bounded() {
        assert_eq!(orders(1), vec![vec![0]]);
        assert_eq!(orders(2), vec![vec![0, 1], vec![1, 0]]);
        assert_eq!(orders(4).len(), 24);
        assert_eq!(orders(4)[0], vec![0, 1, 2, 3]);
        assert_eq!(orders(6), vec![vec![0, 1, 2, 3, 4, 5]]);
    }
}
