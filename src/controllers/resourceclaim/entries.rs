//! Performing the entry actions of a claim owner (a pod, or a PodGroup):
//! adopting or creating its generated claims, then recording them in its
//! `status.resourceClaimStatuses`, telling the user about entries that
//! could not be provided. Shared by pod and PodGroup work.

use std::collections::BTreeMap;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::context::Context;
use super::metrics::ClaimOwner;
use crate::model::views::ClaimView;
use crate::naming::{FIELD_MANAGER, POD_CLAIM_NAME_ANNOTATION, is_controlled_by};
use crate::runtime::error::{SyncError, kube_err};
use crate::runtime::events::Involved;

/// Event reason for a claim that could not be created (same as kube-controller-manager's).
pub const REASON_CREATION_FAILED: &str = "FailedResourceClaimCreation";
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

/// What performing the entry actions of a pod or PodGroup gave.
pub struct EntryOutcome {
    /// The recorded claim names with the adopted and created ones put over them.
    pub record: BTreeMap<String, Option<String>>,
    /// Whether `record` changed (a status apply is due).
    pub changed: bool,
    /// `(entry, reason)` of every entry that could not be provided.
    pub failures: Vec<(String, String)>,
    /// Names of the claims created.
    pub created: Vec<String>,
}

/// Adopts and creates the claims of an owner (a pod or a PodGroup with UID
/// `owner_uid` in `ns`), counting creates under `owner`.
pub async fn perform_entries(
    ctx: &Context,
    ns: &str,
    owner_uid: &str,
    owner: ClaimOwner,
    mut record: BTreeMap<String, Option<String>>,
    entries: Vec<EntryAction>,
) -> EntryOutcome {
    let mut changed = false;
    let mut failures = Vec::new();
    let mut created = Vec::new();
    let mut committed = None;
    for action in entries {
        match action {
            EntryAction::Adopt { entry, claim_name } => {
                info!(entry = %entry, claim = %claim_name, "adopting existing claim");
                record.insert(entry, Some(claim_name));
                changed = true;
            }
            EntryAction::Create {
                entry,
                claim,
                admin_access,
            } => match create_unless_committed(ctx, ns, owner_uid, &entry, &claim, &mut committed)
                .await
            {
                Ok(claim) => {
                    ctx.metrics.record_create(true, admin_access, owner);
                    info!(entry = %entry, claim = %claim.name(), "created claim");
                    record.insert(entry, Some(claim.name().to_string()));
                    created.push(claim.name().to_string());
                    ctx.caches.remember_created(claim);
                    changed = true;
                }
                Err(err) => {
                    ctx.metrics.record_create(false, admin_access, owner);
                    if crate::runtime::error::may_have_committed(&err) {
                        ctx.caches.mark_uncertain_create(owner_uid, &entry);
                    }
                    failures.push((entry, format!("creating ResourceClaim failed: {err}")));
                }
            },
            EntryAction::Fail { entry, reason } => failures.push((entry, reason)),
        }
    }
    EntryOutcome {
        record,
        changed,
        failures,
        created,
    }
}

/// Creates a generated claim of the owner (a pod or a PodGroup) with UID
/// `owner_uid`, unless an earlier create whose answer was lost did commit:
/// then the API server is asked first (the watch may not show that claim
/// yet), and the claim found is returned instead of making a second one.
/// `committed` holds the owner's claims once listed, so one sync lists
/// once however many of its entries are uncertain.
async fn create_unless_committed(
    ctx: &Context,
    ns: &str,
    owner_uid: &str,
    entry: &str,
    claim: &Value,
    committed: &mut Option<Vec<ClaimView>>,
) -> Result<ClaimView, kube::Error> {
    if ctx.caches.take_uncertain_create(owner_uid, entry) {
        let listed = match committed {
            Some(listed) => listed,
            None => {
                let listed = claims_controlled_by(ctx, ns, owner_uid)
                    .await
                    .inspect_err(|_| {
                        // Still uncertain: ask again next time.
                        ctx.caches.mark_uncertain_create(owner_uid, entry);
                    })?;
                committed.insert(listed)
            }
        };
        if let Some(found) = listed
            .iter()
            .find(|c| c.annotation(POD_CLAIM_NAME_ANNOTATION) == Some(entry))
        {
            info!(entry, claim = %found.name(), "an earlier create did commit; adopting it");
            return Ok(found.clone());
        }
    }
    let url = ClaimView::url_path(&(), Some(ns));
    let body = serde_json::to_vec(claim).map_err(kube::Error::SerdeError)?;
    let req = kube::core::Request::new(url)
        .create(&PostParams::default(), body)
        .map_err(kube::Error::BuildRequest)?;
    ctx.client.request::<ClaimView>(req).await
}

/// Claims per page when listing a namespace's claims: a namespace with
/// many claims is read in bounded steps, like the informers' initial list.
const LIST_PAGE: u32 = 500;

/// The claims of `ns` controlled by `owner_uid` and not being deleted, read
/// from the API server page by page (only those are kept).
async fn claims_controlled_by(
    ctx: &Context,
    ns: &str,
    owner_uid: &str,
) -> Result<Vec<ClaimView>, kube::Error> {
    let api: Api<ClaimView> = Api::namespaced(ctx.client.clone(), ns);
    let mut params = kube::api::ListParams::default().limit(LIST_PAGE);
    let mut owned = Vec::new();
    loop {
        let page = api.list(&params).await?;
        owned.extend(
            page.items
                .into_iter()
                .filter(|c| is_controlled_by(c.owner_references(), owner_uid) && !c.is_deleting()),
        );
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(owned),
        }
    }
}

/// The `status.resourceClaimStatuses` list of an apply: every entry, in
/// entry-name order; `None` is an entry without a claim.
pub fn claim_statuses(record: &BTreeMap<String, Option<String>>) -> Vec<Value> {
    record
        .iter()
        .map(|(entry, claim)| match claim {
            Some(claim) => json!({"name": entry, "resourceClaimName": claim}),
            None => json!({"name": entry}),
        })
        .collect()
}

/// Whose entries were performed: how the status apply, the events and the
/// errors name the owner (a pod or a PodGroup) and its entries.
pub struct EntryOwner<'a> {
    pub involved: Involved<'a>,
    /// What the owner's entries are called in messages (`PodResourceClaim`).
    pub entry_kind: &'static str,
    /// How errors name the owner (`pod`, `PodGroup`).
    pub owner_word: &'static str,
}

/// Records what performing the owner's entries gave and tells about each
/// entry that failed. The owner's `status.resourceClaimStatuses` is applied
/// (server-side, our field manager, every entry: an apply that left one out
/// would remove it) even when another entry failed: the claims made so far
/// are then found by name instead of by adoption, and entries that failed
/// keep the name they had. Each failure is told whether or not the apply
/// went through; the first one is the error.
pub async fn record_entries<K>(
    ctx: &Context,
    api: Api<K>,
    owner: &EntryOwner<'_>,
    outcome: &EntryOutcome,
) -> Result<(), SyncError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Involved {
        name,
        namespace: ns,
        ..
    } = owner.involved;
    let word = owner.owner_word;
    let applied = if outcome.changed {
        let body = json!({
            "apiVersion": owner.involved.api_version,
            "kind": owner.involved.kind,
            // The UID makes the API server refuse the write if the owner was
            // replaced under its name meanwhile.
            "metadata": {"name": name, "namespace": ns, "uid": owner.involved.uid},
            "status": {"resourceClaimStatuses": claim_statuses(&outcome.record)},
        });
        api.patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .map(|_| ())
        .map_err(kube_err(format_args!(
            "recording status.resourceClaimStatuses of {word} {ns}/{name}"
        )))
    } else {
        Ok(())
    };
    for (entry, reason) in &outcome.failures {
        warn!(entry = %entry, reason = %reason, owner = word, "cannot provide claim");
        ctx.events
            .warn(
                &owner.involved,
                REASON_CREATION_FAILED,
                &format!("{} {entry}: {reason}", owner.entry_kind),
            )
            .await;
    }
    applied?;
    if let Some((entry, reason)) = outcome.failures.first() {
        return Err(SyncError::Invalid(format!(
            "{word} {ns}/{name}, {} {entry}: {reason}",
            owner.entry_kind
        )));
    }
    Ok(())
}
