//! The allocator: which devices of one node a claim gets, as kube-scheduler's
//! structured allocator would pick them, or why it gets none.
//!
//! Pure: the claim, the DeviceClasses, the node's [`Inventory`] and the
//! devices other claims hold go in; an [`AllocationResult`] or a reason
//! comes out. Search is depth-first in kube-scheduler's order (requests in
//! order, subrequests in order, devices in inventory order, combinations
//! not permutations); the first complete solution wins.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceClass,
    DeviceRequestAllocationResult, DeviceSelector, DeviceTaint, DeviceToleration, ResourceClaim,
};

use super::inventory::{Inventory, NodeDevice};
use super::selector::Selector;
use super::solver_thread::on_solver_stack;
use crate::DeviceId;

use super::search::{Alternative, MatchConstraint, Mode, Request, Tally};
use explain::explain;
use result::result;

mod explain;
mod result;
pub use super::search::{MAX_DEVICES_PER_CLAIM, MAX_SEARCH_STEPS, MAX_SEARCH_TIME};

/// Everything the allocator looks at.
pub struct AllocationInput<'a> {
    pub claim: &'a ResourceClaim,
    pub classes: &'a BTreeMap<String, Arc<DeviceClass>>,
    pub node: &'a str,
    pub inventory: &'a Inventory,
    /// Devices allocated to other claims (admin-access allocations excluded:
    /// they do not take a device).
    pub in_use: &'a HashSet<DeviceId>,
    /// Whether requests may use `adminAccess` and `firstAvailable` (the
    /// DRAAdminAccess and DRAPrioritizedList gates).
    pub admin_access_enabled: bool,
    pub prioritized_list_enabled: bool,
}

/// What the allocator decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Allocated(AllocationResult),
    /// The node's devices do not satisfy the claim now; may change when
    /// slices or other claims do. The text says what was tried.
    Unsatisfiable(String),
    /// The claim (or a class, or the node's slices) asks for something this
    /// allocator does not do, or is wrong; retrying will not help until it
    /// is changed. The text names the object and field.
    Refused(String),
}

/// The devices an allocation takes from others (admin-access results and
/// shares of a device share it).
pub fn devices_taken(result: &AllocationResult) -> Vec<DeviceId> {
    result
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .filter_map(|r| {
            DeviceId::taken_by(
                &r.driver,
                &r.pool,
                &r.device,
                r.admin_access,
                r.share_id.as_deref(),
            )
        })
        .collect()
}

/// Allocates the claim's devices on the input's node, on a solver thread
/// (see [`on_solver_stack`]), within [`MAX_SEARCH_TIME`].
pub fn allocate(input: &AllocationInput) -> Outcome {
    on_solver_stack(|| allocate_until(input, std::time::Instant::now() + MAX_SEARCH_TIME))
        .unwrap_or_else(|err| {
            Outcome::Refused(format!(
                "claim {}: cannot start the allocation thread: {err}",
                claim_key(input.claim)
            ))
        })
}

/// [`allocate`] on the calling thread, giving up at `deadline`: for
/// callers already on a solver thread that try several claims (or orders of
/// them) within one wall-clock bound.
pub fn allocate_until(input: &AllocationInput, deadline: std::time::Instant) -> Outcome {
    debug_assert!(
        super::solver_thread::on_solver_thread(),
        "solving runs on a solver thread, never on an async worker"
    );
    let claim_key = claim_key(input.claim);
    let requests = match prepare(input, &claim_key) {
        Ok(r) => r,
        Err(refusal) => return Outcome::Refused(refusal),
    };
    let constraints = match constraints(input.claim, &claim_key) {
        Ok(c) => c,
        Err(refusal) => return Outcome::Refused(refusal),
    };
    for req in &requests {
        for alt in &req.alternatives {
            if alt.mode == Mode::All
                && let Some((pool, state)) = input.inventory.pool_problems().next()
            {
                return Outcome::Refused(format!(
                    "claim {claim_key}, request {}: asks for all devices, but resource pool {pool} {state}",
                    alt.name
                ));
            }
        }
    }
    let mut search = super::search::Search {
        requests: &requests,
        devices: &input.inventory.devices,
        constraints: &constraints,
        values: vec![None; constraints.len()],
        taken: HashSet::new(),
        chosen: Vec::new(),
        steps: 0,
        deadline,
        timed_out: false,
    };
    match search.solve(0) {
        // Unsatisfiable for now: looked at again, and other orders tried.
        Err(why) if search.timed_out => Outcome::Unsatisfiable(format!("claim {claim_key}: {why}")),
        Err(refusal) => Outcome::Refused(format!("claim {claim_key}: {refusal}")),
        Ok(true) => Outcome::Allocated(result(input, &requests, &search.chosen)),
        Ok(false) => Outcome::Unsatisfiable(explain(input, &requests, &constraints)),
    }
}

fn claim_devices(claim: &ResourceClaim) -> Option<&k8s_openapi::api::resource::v1::DeviceClaim> {
    claim.spec.as_ref()?.devices.as_ref()
}

fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Compiles selectors and filters the inventory per request alternative.
fn prepare(input: &AllocationInput, claim_key: &str) -> Result<Vec<Request>, String> {
    let requests = claim_devices(input.claim).and_then(|d| d.requests.as_ref());
    let mut prepared = Vec::new();
    let mut exact_total = 0usize;
    for (i, request) in requests.into_iter().flatten().enumerate() {
        let field = format!("spec.devices.requests[{i}]");
        let mut alternatives = Vec::new();
        if let Some(exactly) = &request.exactly {
            if exactly.capacity.is_some() {
                return Err(format!(
                    "claim {claim_key}, request {}: {field}.exactly.capacity asks for consumable \
                     capacity, which this allocator does not support: remove it, or schedule the pod \
                     through kube-scheduler",
                    request.name
                ));
            }
            let admin = exactly.admin_access == Some(true);
            if admin && !input.admin_access_enabled {
                return Err(format!(
                    "claim {claim_key}, request {}: admin access is requested, but the DRAAdminAccess \
                     feature gate is off",
                    request.name
                ));
            }
            let alt = alternative(
                input,
                claim_key,
                &request.name,
                &exactly.device_class_name,
                exactly.selectors.as_deref().unwrap_or_default(),
                exactly.allocation_mode.as_deref(),
                exactly.count,
                admin,
                exactly.tolerations.clone().unwrap_or_default(),
            )?;
            if let Mode::Count(n) = alt.mode {
                exact_total += n;
            }
            alternatives.push(alt);
        } else if let Some(subs) = request.first_available.as_ref().filter(|s| !s.is_empty()) {
            if !input.prioritized_list_enabled {
                return Err(format!(
                    "claim {claim_key}, request {}: has subrequests, but the DRAPrioritizedList \
                     feature gate is off",
                    request.name
                ));
            }
            for sub in subs {
                if sub.capacity.is_some() {
                    return Err(format!(
                        "claim {claim_key}, request {}/{}: {field}.firstAvailable capacity asks for \
                         consumable capacity, which this allocator does not support",
                        request.name, sub.name
                    ));
                }
                alternatives.push(alternative(
                    input,
                    claim_key,
                    &format!("{}/{}", request.name, sub.name),
                    &sub.device_class_name,
                    sub.selectors.as_deref().unwrap_or_default(),
                    sub.allocation_mode.as_deref(),
                    sub.count,
                    false,
                    sub.tolerations.clone().unwrap_or_default(),
                )?);
            }
        } else {
            return Err(format!(
                "claim {claim_key}, request {}: {field} sets neither exactly nor firstAvailable \
                 (a request type this allocator does not know)",
                request.name
            ));
        }
        prepared.push(Request {
            name: request.name.clone(),
            alternatives,
        });
    }
    if exact_total > MAX_DEVICES_PER_CLAIM {
        return Err(format!(
            "claim {claim_key}: number of requested devices {exact_total} exceeds the claim limit of \
             {MAX_DEVICES_PER_CLAIM}"
        ));
    }
    Ok(prepared)
}

#[allow(clippy::too_many_arguments)]
fn alternative(
    input: &AllocationInput,
    claim_key: &str,
    name: &str,
    class_name: &str,
    request_selectors: &[DeviceSelector],
    allocation_mode: Option<&str>,
    count: Option<i64>,
    admin: bool,
    tolerations: Vec<DeviceToleration>,
) -> Result<Alternative, String> {
    if class_name.is_empty() {
        return Err(format!(
            "claim {claim_key}, request {name}: missing device class name"
        ));
    }
    let Some(class) = input.classes.get(class_name) else {
        return Err(format!(
            "claim {claim_key}, request {name}: DeviceClass {class_name} not found: create it, or fix \
             the request's deviceClassName"
        ));
    };
    let mode = match allocation_mode.unwrap_or("ExactCount") {
        "ExactCount" | "" => Mode::Count(usize::try_from(count.unwrap_or(1)).unwrap_or(0)),
        "All" => Mode::All,
        other => {
            return Err(format!(
                "claim {claim_key}, request {name}: unsupported allocationMode {other}"
            ));
        }
    };
    let class_selectors = compile_all(
        class
            .spec
            .as_ref()
            .and_then(|s| s.selectors.as_deref())
            .unwrap_or_default(),
        &format!("class {class_name}"),
    )?;
    let own_selectors = compile_all(request_selectors, &format!("claim {claim_key}"))?;
    let mut tally = Tally::default();
    let mut candidates = Vec::new();
    let mut matching = Vec::new();
    for (idx, device) in input.inventory.devices.iter().enumerate() {
        tally.total += 1;
        // kube-scheduler skips devices in use before evaluating selectors:
        // an error on one of those must not fail the claim.
        let taken = !admin && input.in_use.contains(&device.id);
        let lenient = |r: Result<bool, String>| if taken { r.or(Ok(false)) } else { r };
        if !lenient(selected(&class_selectors, device))? {
            tally.class_rejected += 1;
            continue;
        }
        if !lenient(selected(&own_selectors, device))? {
            tally.request_rejected += 1;
            continue;
        }
        matching.push(idx);
        if device.unsupported.is_some() {
            tally.unsupported += 1;
        } else if !tolerated(&device.taints, &tolerations) {
            tally.tainted += 1;
        } else if !admin && input.in_use.contains(&device.id) {
            tally.in_use += 1;
        } else {
            tally.free += 1;
            candidates.push(idx);
        }
    }
    if mode == Mode::All {
        for device in &input.inventory.foreign {
            if selected(&class_selectors, device).unwrap_or(false)
                && selected(&own_selectors, device).unwrap_or(false)
            {
                return Err(format!(
                    "claim {claim_key}, request {name}: asks for all devices, and device {} of a pool \
                     that is not node-local matches; this allocator only allocates node-local devices: \
                     use a class or selectors that match node-local devices only, or schedule the pod \
                     through kube-scheduler",
                    device.id
                ));
            }
        }
    }
    Ok(Alternative {
        name: name.to_string(),
        class_name: class_name.to_string(),
        mode,
        admin,
        tolerations,
        candidates,
        matching,
        tally,
    })
}

/// `(where, selector)` for each CEL selector; `where` is how errors name it.
fn compile_all(
    selectors: &[DeviceSelector],
    owner: &str,
) -> Result<Vec<(String, Selector)>, String> {
    selectors
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let origin = format!("{owner}: selector #{i}");
            let Some(cel) = &s.cel else {
                return Err(format!(
                    "{origin}: CEL expression empty (unsupported selector type?)"
                ));
            };
            Selector::compile(&cel.expression)
                .map(|compiled| (origin.clone(), compiled))
                .map_err(|e| format!("{origin}: {e}"))
        })
        .collect()
}

fn selected(selectors: &[(String, Selector)], device: &NodeDevice) -> Result<bool, String> {
    for (origin, selector) in selectors {
        match selector.matches(&device.facts) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => {
                return Err(format!(
                    "{origin}: CEL runtime error on device {}: {e}",
                    device.id
                ));
            }
        }
    }
    Ok(true)
}

/// Whether every taint that keeps devices from new pods is tolerated.
pub fn tolerated(taints: &[DeviceTaint], tolerations: &[DeviceToleration]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|taint| tolerations.iter().any(|t| tolerates(t, taint)))
}

fn tolerates(toleration: &DeviceToleration, taint: &DeviceTaint) -> bool {
    let effect = toleration.effect.as_deref().filter(|e| !e.is_empty());
    effect.is_none_or(|e| e == taint.effect)
        && crate::device_taints::matches_key_and_value(toleration, taint)
}

fn constraints(claim: &ResourceClaim, claim_key: &str) -> Result<Vec<MatchConstraint>, String> {
    let list = claim_devices(claim).and_then(|d| d.constraints.as_ref());
    list.into_iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            if c.distinct_attribute.is_some() {
                return Err(format!(
                    "claim {claim_key}, constraint #{i}: spec.devices.constraints[{i}].distinctAttribute \
                     is not supported by this allocator"
                ));
            }
            let Some(attribute) = &c.match_attribute else {
                return Err(format!(
                    "claim {claim_key}, constraint #{i}: empty constraint (unsupported constraint type?)"
                ));
            };
            Ok(MatchConstraint {
                requests: c.requests.clone().unwrap_or_default(),
                attribute: attribute.clone(),
            })
        })
        .collect()
}
