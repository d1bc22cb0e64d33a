//! PodGroup work (DRAWorkloadResourceClaims, KEP-5729): a PodGroup's
//! template entries get one generated claim each, owned by the group and
//! recorded in its `status.resourceClaimStatuses`; member pods whose entry
//! matches the group's exactly use that claim instead of one of their own
//! (see `pod.rs`). Group claims are never deleted here: the garbage
//! collector removes them with their group, as in kube-controller-manager.
//!
//! [`decide`] is pure over cached state; [`execute`] writes.

use std::collections::BTreeMap;

use kube::api::Api;

use super::cache::Caches;
use super::context::Context;
use super::metrics::ClaimOwner;
use super::pod::{
    EntryAction, EntryOwner, generated_claim, perform_entries, record_entries, usable_template,
};
use crate::model::features::FeatureGates;
use crate::model::views::{PodGroupApi, PodGroupView};
use crate::naming::{is_controlled_by, pod_group_owner_reference};
use crate::runtime::error::SyncError;
use crate::runtime::events::Involved;
use crate::runtime::store::object_key;

/// The `owner_api_*` labels of claims made for PodGroups.
pub(crate) const GROUP_OWNER: ClaimOwner = ClaimOwner {
    api_group: PodGroupApi::GROUP,
    kind: "PodGroup",
};

/// What group work decided for one PodGroup.
#[derive(Debug, Default)]
pub(crate) struct GroupDecision {
    pub entries: Vec<EntryAction>,
    /// Every entry of `status.resourceClaimStatuses` as it is now; every
    /// status apply sends them all (an apply leaving one out removes it).
    pub recorded: BTreeMap<String, Option<String>>,
    pub skipped: Option<&'static str>,
}

/// Decides group work from cached state.
pub(crate) fn decide(
    group: &PodGroupView,
    caches: &Caches,
    gates: FeatureGates,
    api: &PodGroupApi,
) -> GroupDecision {
    let mut decision = GroupDecision::default();
    if !caches.group_claims_enabled() {
        decision.skipped = Some("PodGroup claims are off (DRAWorkloadResourceClaims)");
        return decision;
    }
    if group.is_deleting() {
        decision.skipped = Some("PodGroup is being deleted");
        return decision;
    }
    decision.recorded = group
        .status
        .resource_claim_statuses
        .iter()
        .map(|s| (s.name.clone(), s.resource_claim_name.clone()))
        .collect();
    for entry in &group.spec.resource_claims {
        let Some(template_name) = entry.resource_claim_template_name.as_deref() else {
            if entry.resource_claim_name.is_none() {
                decision.entries.push(EntryAction::Fail {
                    entry: entry.name.clone(),
                    reason: format!(
                        "spec.resourceClaims[{}] sets neither resourceClaimName nor \
                         resourceClaimTemplateName; it uses a field this controller does not \
                         know: upgrade dra-claim-controller",
                        entry.name
                    ),
                });
            }
            // A claim named directly is used as it is, never created.
            continue;
        };
        if has_own_claim(group, &entry.name, caches) {
            continue;
        }
        // Adopt before creating: one claim per entry, whatever happened to
        // an earlier status write.
        if let Some(adopt) = super::pod::adoptable(
            caches.claims_owned_by_group(group.namespace(), group.uid()),
            &entry.name,
        ) {
            decision.entries.push(adopt);
            continue;
        }
        let template =
            match usable_template(group.namespace(), &entry.name, template_name, caches, gates) {
                Ok(t) => t,
                Err(reason) => {
                    decision.entries.push(EntryAction::Fail {
                        entry: entry.name.clone(),
                        reason,
                    });
                    continue;
                }
            };
        let owner = pod_group_owner_reference(&api.api_version(), group.name(), group.uid());
        let (claim, admin_access) = generated_claim(
            group.namespace(),
            group.name(),
            owner,
            &entry.name,
            &template,
        );
        decision.entries.push(EntryAction::Create {
            entry: entry.name.clone(),
            claim,
            admin_access,
        });
    }
    decision
}

/// Whether a PodGroup needs group work: read off what [`decide`] decides
/// for it, so that what queues a group and what its sync does cannot
/// disagree.
pub(crate) fn needs_work(group: &PodGroupView, caches: &Caches, gates: FeatureGates) -> bool {
    caches
        .pod_group_api()
        .is_some_and(|api| !decide(group, caches, gates, api).entries.is_empty())
}

/// Whether the claim recorded for `entry` exists and the group controls it.
fn has_own_claim(group: &PodGroupView, entry: &str, caches: &Caches) -> bool {
    group.recorded(entry).is_some_and(|name| {
        caches
            .claim(group.namespace(), name)
            .is_some_and(|c| is_controlled_by(c.owner_references(), group.uid()))
    })
}

fn involved<'a>(group: &'a PodGroupView, api: &PodGroupApi) -> Involved<'a> {
    Involved {
        api_version: api.api_version(),
        kind: "PodGroup",
        name: group.name(),
        namespace: group.namespace(),
        uid: group.uid(),
        resource_version: group.metadata.resource_version.as_deref(),
    }
}

/// Performs group work.
pub(crate) async fn execute(
    ctx: &Context,
    group: &PodGroupView,
    api: &PodGroupApi,
    decision: GroupDecision,
) -> Result<(), SyncError> {
    let ns = group.namespace();
    let outcome = perform_entries(
        ctx,
        ns,
        group.uid(),
        GROUP_OWNER,
        decision.recorded,
        decision.entries,
    )
    .await;
    let owner = EntryOwner {
        involved: involved(group, api),
        entry_kind: "PodGroupResourceClaim",
        owner_word: "PodGroup",
    };
    let groups = Api::<PodGroupView>::namespaced_with(ctx.client.clone(), ns, api);
    record_entries(ctx, groups, &owner, &outcome).await
}

/// `namespace/name` keys of the member pods of a group.
pub(crate) fn members(
    group: &PodGroupView,
    caches: &Caches,
) -> Vec<std::sync::Arc<crate::model::views::PodView>> {
    caches.pods.by_index(
        crate::model::indexes::PODS_BY_GROUP,
        &object_key(group.namespace(), group.name()),
    )
}

#[cfg(test)]
mod tests;
