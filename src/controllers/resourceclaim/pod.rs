//! Pod work: create the claims of template entries, record their names in
//! the pod status, reserve allocated claims for pre-scheduled pods.
//!
//! [`decide`] looks at cached state and returns what should be written;
//! [`execute`] writes it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::Context;
use super::cache::Caches;
use super::patch;
use super::views::{ClaimView, PodView, TemplateView};
use crate::features::FeatureGates;
use crate::naming::{
    ClaimResolution, FIELD_MANAGER, POD_CLAIM_NAME_ANNOTATION, generate_name, is_controlled_by,
    pod_owner_reference, resolve_claim,
};

/// Event reason for a claim that could not be created (same as kube-controller-manager's).
pub const REASON_CREATION_FAILED: &str = "FailedResourceClaimCreation";
/// Event reason for a pre-scheduled pod whose claim is not allocated.
pub const REASON_NOT_ALLOCATED: &str = "ResourceClaimNotAllocated";

/// What to do for one template entry that has no usable claim yet.
#[derive(Debug, Clone, PartialEq)]
pub enum EntryAction {
    /// A claim controlled by the pod for this entry already exists: record it.
    Adopt { entry: String, claim_name: String },
    /// Create this claim (a full object with `generateName`), then record it.
    Create {
        entry: String,
        claim: Value,
        admin_access: bool,
    },
    /// Cannot proceed for this entry; tell the user why.
    Fail { entry: String, reason: String },
}

/// An allocated claim to reserve for a pod that bypassed the scheduler.
#[derive(Debug, Clone)]
pub struct Reservation {
    pub claim: Arc<ClaimView>,
    pub consumer: ResourceClaimConsumerReference,
}

/// Everything pod work decided for one pod.
#[derive(Debug, Default)]
pub struct PodDecision {
    /// Entry actions, in `spec.resourceClaims` order.
    pub entries: Vec<EntryAction>,
    /// Claim names already recorded and still valid, by entry; re-sent with
    /// every status apply so that the apply never drops them.
    pub recorded: BTreeMap<String, String>,
    pub reservations: Vec<Reservation>,
    /// Warnings about claims of a pre-scheduled pod that nothing will allocate.
    pub unallocated: Vec<String>,
    /// Why nothing is done, when nothing is.
    pub skipped: Option<&'static str>,
}

impl PodDecision {
    pub fn is_noop(&self) -> bool {
        self.entries.is_empty() && self.reservations.is_empty() && self.unallocated.is_empty()
    }
}

/// Decides pod work from cached state.
pub fn decide(pod: &PodView, caches: &Caches, gates: FeatureGates) -> PodDecision {
    let mut decision = PodDecision::default();
    if pod.is_deleting() {
        decision.skipped = Some("pod is being deleted");
        return decision;
    }
    if pod.is_done() {
        // A pod that will never run again never gets a new claim.
        decision.skipped = Some("pod is done");
        return decision;
    }
    let statuses = &pod.status.resource_claim_statuses;
    for entry in &pod.spec.resource_claims {
        match resolve_claim(entry, statuses) {
            ClaimResolution::Unsupported => decision.entries.push(EntryAction::Fail {
                entry: entry.name.clone(),
                reason: format!(
                    "spec.resourceClaims[{}] sets neither resourceClaimName nor resourceClaimTemplateName; \
                     it uses a field this controller does not know: upgrade dra-claim-controller",
                    entry.name
                ),
            }),
            ClaimResolution::Skipped | ClaimResolution::Shared(_) => {}
            ClaimResolution::Generated(name) => {
                match caches.claim(pod.namespace(), name) {
                    Some(claim) if is_controlled_by(claim.owner_references(), pod.uid()) => {
                        decision.recorded.insert(entry.name.clone(), name.to_string());
                    }
                    // Gone, or taken over by someone else: find or make a replacement.
                    _ => decision.entries.push(adopt_or_create(pod, &entry.name, entry, caches, gates)),
                }
            }
            ClaimResolution::NotCreatedYet => {
                decision.entries.push(adopt_or_create(pod, &entry.name, entry, caches, gates));
            }
        }
    }
    if pod.node_name().is_some() {
        decide_reservations(pod, caches, &mut decision);
    }
    decision
}

fn adopt_or_create(
    pod: &PodView,
    entry_name: &str,
    entry: &k8s_openapi::api::core::v1::PodResourceClaim,
    caches: &Caches,
    gates: FeatureGates,
) -> EntryAction {
    // Adopt before creating: a claim we made earlier (maybe a moment ago,
    // before a failed status write) must be reused, never duplicated.
    let mut owned = caches.claims_owned_by(pod.uid());
    owned.sort_by(|a, b| a.name().cmp(b.name()));
    if let Some(claim) = owned
        .iter()
        .find(|c| c.annotation(POD_CLAIM_NAME_ANNOTATION) == Some(entry_name) && !c.is_deleting())
    {
        return EntryAction::Adopt {
            entry: entry_name.to_string(),
            claim_name: claim.name().to_string(),
        };
    }
    let template_name = entry
        .resource_claim_template_name
        .as_deref()
        .unwrap_or_default();
    let key = super::cache::object_key(pod.namespace(), template_name);
    let Some(template) = caches.templates.get(&key) else {
        return EntryAction::Fail {
            entry: entry_name.to_string(),
            reason: format!(
                "ResourceClaimTemplate {key} not found: create it, or fix \
                 spec.resourceClaims[{entry_name}].resourceClaimTemplateName"
            ),
        };
    };
    if !gates.admin_access && template.needs_admin_access() {
        return EntryAction::Fail {
            entry: entry_name.to_string(),
            reason: format!(
                "ResourceClaimTemplate {key} requests adminAccess, but the DRAAdminAccess \
                 feature gate is off: remove adminAccess or enable the gate (--feature-gates)"
            ),
        };
    }
    if !gates.prioritized_list && template.has_prioritized_list() {
        return EntryAction::Fail {
            entry: entry_name.to_string(),
            reason: format!(
                "ResourceClaimTemplate {key} uses a prioritized list (firstAvailable), but the \
                 DRAPrioritizedList feature gate is off: use exactly or enable the gate (--feature-gates)"
            ),
        };
    }
    let (claim, admin_access) = claim_from_template(pod, entry_name, &template);
    EntryAction::Create {
        entry: entry_name.to_string(),
        claim,
        admin_access,
    }
}

/// The claim object generated for `pod`'s entry from `template`.
pub fn claim_from_template(
    pod: &PodView,
    entry_name: &str,
    template: &TemplateView,
) -> (Value, bool) {
    let mut annotations = template.claim_metadata("annotations");
    annotations.insert(
        POD_CLAIM_NAME_ANNOTATION.to_string(),
        entry_name.to_string(),
    );
    let labels = template.claim_metadata("labels");
    let mut metadata = json!({
        "generateName": generate_name(pod.name(), entry_name),
        "namespace": pod.namespace(),
        "ownerReferences": [pod_owner_reference(pod.name(), pod.uid())],
        "annotations": annotations,
    });
    if !labels.is_empty() {
        metadata["labels"] = json!(labels);
    }
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": template.claim_spec(),
    });
    let admin_access = template.needs_admin_access();
    (claim, admin_access)
}

fn decide_reservations(pod: &PodView, caches: &Caches, decision: &mut PodDecision) {
    let statuses = &pod.status.resource_claim_statuses;
    for entry in &pod.spec.resource_claims {
        let resolution = resolve_claim(entry, statuses);
        let Some(name) = resolution.name() else {
            continue;
        };
        let Some(claim) = caches.claim(pod.namespace(), name) else {
            continue;
        };
        if resolution.must_check_owner() && !is_controlled_by(claim.owner_references(), pod.uid()) {
            continue;
        }
        if claim.is_reserved_for(pod.uid()) {
            continue;
        }
        if claim.is_allocated() {
            decision.reservations.push(Reservation {
                consumer: patch::pod_consumer(pod.name(), pod.uid()),
                claim,
            });
        } else {
            decision.unallocated.push(name.to_string());
        }
    }
}

/// Performs pod work. Returns an error (and the key is retried with
/// backoff) when any entry failed or a write failed.
pub async fn execute(ctx: &Context, pod: &PodView, decision: PodDecision) -> anyhow::Result<()> {
    let (ns, name) = (pod.namespace(), pod.name());
    let mut record = decision.recorded;
    let mut changed = false;
    let mut failures = Vec::new();
    let mut created = Vec::new();
    for action in decision.entries {
        match action {
            EntryAction::Adopt { entry, claim_name } => {
                info!(pod = %format!("{ns}/{name}"), entry = %entry, claim = %claim_name, "adopting existing claim");
                record.insert(entry, claim_name);
                changed = true;
            }
            EntryAction::Create {
                entry,
                claim,
                admin_access,
            } => match create_unless_committed(ctx, pod, &entry, &claim).await {
                Ok(claim) => {
                    ctx.metrics.record_create(true, admin_access);
                    info!(pod = %format!("{ns}/{name}"), entry = %entry, claim = %claim.name(), "created claim");
                    record.insert(entry, claim.name().to_string());
                    created.push(claim.name().to_string());
                    ctx.caches.remember_created(claim);
                    changed = true;
                }
                Err(err) => {
                    ctx.metrics.record_create(false, admin_access);
                    if may_have_committed(&err) {
                        ctx.caches.mark_uncertain_create(pod.uid(), &entry);
                    }
                    failures.push((entry, format!("creating ResourceClaim failed: {err}")));
                }
            },
            EntryAction::Fail { entry, reason } => failures.push((entry, reason)),
        }
    }
    if changed {
        // Record what we have even when another entry failed: the claims
        // made so far are then found by name instead of by adoption.
        apply_claim_statuses(ctx, ns, name, &record).await?;
    }
    for (entry, reason) in &failures {
        warn!(pod = %format!("{ns}/{name}"), entry = %entry, reason = %reason, "cannot provide claim");
        ctx.events
            .warn(
                pod,
                REASON_CREATION_FAILED,
                &format!("PodResourceClaim {entry}: {reason}"),
            )
            .await;
    }
    if !failures.is_empty() {
        let (entry, reason) = &failures[0];
        anyhow::bail!("pod {ns}/{name}, PodResourceClaim {entry}: {reason}");
    }
    let mut unallocated = decision.unallocated;
    if pod.node_name().is_some() {
        // Claims created just now for a pod bound without the scheduler:
        // nothing will allocate them either.
        unallocated.extend(created.iter().cloned());
    }
    for claim_name in &unallocated {
        ctx.events
            .warn(
                pod,
                REASON_NOT_ALLOCATED,
                &format!(
                    "ResourceClaim {claim_name} is not allocated, but the pod was bound to node {} \
                     without the scheduler: nothing will allocate it. Allocate the claim, or create \
                     the pod without spec.nodeName",
                    pod.node_name().unwrap_or_default()
                ),
            )
            .await;
    }
    for reservation in decision.reservations {
        let claim = &reservation.claim;
        debug!(pod = %format!("{ns}/{name}"), claim = %claim.name(), "reserving claim for pre-scheduled pod");
        let p = patch::add_reservation(claim, &reservation.consumer);
        let api: Api<ClaimView> = Api::namespaced(ctx.client.clone(), ns);
        api.patch_status(claim.name(), &PatchParams::default(), &Patch::Json::<()>(p))
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "reserving ResourceClaim {ns}/{} for pod {name}: {e}",
                    claim.name()
                )
            })?;
        info!(pod = %format!("{ns}/{name}"), claim = %claim.name(), "reserved claim for pod");
    }
    Ok(())
}

/// Creates the claim, unless an earlier create for this entry failed in a
/// way that may have committed it: then the API server is asked first (the
/// watch may not show that claim yet), and the claim found is returned
/// instead of making a second one.
async fn create_unless_committed(
    ctx: &Context,
    pod: &PodView,
    entry: &str,
    claim: &Value,
) -> Result<ClaimView, kube::Error> {
    let ns = pod.namespace();
    if ctx.caches.take_uncertain_create(pod.uid(), entry) {
        let api: Api<ClaimView> = Api::namespaced(ctx.client.clone(), ns);
        let existing = api
            .list(&kube::api::ListParams::default())
            .await
            .inspect_err(|_| {
                // Still uncertain: ask again next time.
                ctx.caches.mark_uncertain_create(pod.uid(), entry);
            })?;
        if let Some(found) = existing.items.into_iter().find(|c| {
            is_controlled_by(c.owner_references(), pod.uid())
                && c.annotation(POD_CLAIM_NAME_ANNOTATION) == Some(entry)
                && !c.is_deleting()
        }) {
            info!(pod = %format!("{ns}/{}", pod.name()), entry, claim = %found.name(), "an earlier create did commit; adopting it");
            return Ok(found);
        }
    }
    let url = ClaimView::url_path(&(), Some(ns));
    let body = serde_json::to_vec(claim).map_err(kube::Error::SerdeError)?;
    let req = kube::core::Request::new(url)
        .create(&PostParams::default(), body)
        .map_err(kube::Error::BuildRequest)?;
    ctx.client.request::<ClaimView>(req).await
}

/// Whether a failed create may still have been committed: server errors,
/// timeouts and lost connections. 4xx answers (429 included) mean the
/// request was refused before anything was written.
pub fn may_have_committed(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code >= 500,
        kube::Error::SerdeError(_) | kube::Error::BuildRequest(_) => false,
        _ => true,
    }
}

/// Server-side apply of `status.resourceClaimStatuses` with our field
/// manager. The full set we own is always sent: an apply that left one out
/// would remove it.
async fn apply_claim_statuses(
    ctx: &Context,
    ns: &str,
    name: &str,
    record: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let statuses: Vec<Value> = record
        .iter()
        .map(|(entry, claim)| json!({"name": entry, "resourceClaimName": claim}))
        .collect();
    let body = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "status": {"resourceClaimStatuses": statuses},
    });
    let api: Api<PodView> = Api::namespaced(ctx.client.clone(), ns);
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!("recording status.resourceClaimStatuses of pod {ns}/{name}: {e}")
    })?;
    Ok(())
}
