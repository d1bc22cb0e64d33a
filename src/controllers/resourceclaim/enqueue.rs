//! What wakes what: pure predicates that turn a watch event into work keys.

use std::fmt;

use super::cache::Caches;
use super::entries::EntryAction;
use super::pod::{self, PodDecision, Skip};
use crate::model::features::FeatureGates;
use crate::model::views::PodView;
use crate::naming::{ClaimResolution, resolve_claim};

/// A unit of work: a pod, a claim or a PodGroup, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkKey {
    Pod {
        namespace: String,
        name: String,
    },
    Claim {
        namespace: String,
        name: String,
    },
    /// DRAWorkloadResourceClaims: a PodGroup's claims.
    PodGroup {
        namespace: String,
        name: String,
    },
}

impl WorkKey {
    pub fn pod(namespace: &str, name: &str) -> Self {
        WorkKey::Pod {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
    pub fn claim(namespace: &str, name: &str) -> Self {
        WorkKey::Claim {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
    pub fn pod_group(namespace: &str, name: &str) -> Self {
        WorkKey::PodGroup {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// Same spelling as kube-controller-manager's keys (`pod:ns/name`,
/// `claim:ns/name`, `podgroup:ns/name`), so logs of both can be compared.
impl fmt::Display for WorkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkKey::Pod { namespace, name } => write!(f, "pod:{namespace}/{name}"),
            WorkKey::Claim { namespace, name } => write!(f, "claim:{namespace}/{name}"),
            WorkKey::PodGroup { namespace, name } => write!(f, "podgroup:{namespace}/{name}"),
        }
    }
}

/// Why a pod needs pod work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodNeeds {
    /// A member of a PodGroup: its entries resolve through the group.
    GroupMember,
    UnsupportedEntry,
    ClaimFromTemplate,
    ReplacementClaim,
    /// Its recorded claim is gone while it is on a node: the user is told.
    MissingClaimOnNode,
    /// An allocated claim to reserve for a pod that bypassed the scheduler.
    Reservation,
    /// A pre-scheduled pod's claim that nothing will allocate: the user is
    /// told.
    NobodyAllocates,
    /// The controller's own settings refuse the pod (1.37's non-retryable
    /// errors): the user is told.
    Refused,
}

impl fmt::Display for PodNeeds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PodNeeds::GroupMember => "member of a PodGroup",
            PodNeeds::UnsupportedEntry => "claim entry uses an unsupported API",
            PodNeeds::ClaimFromTemplate => "must create ResourceClaim from template",
            PodNeeds::ReplacementClaim => {
                "recorded ResourceClaim is gone or not the pod's: must create a replacement"
            }
            PodNeeds::MissingClaimOnNode => {
                "recorded ResourceClaim of a pod on a node is gone: must tell the user"
            }
            PodNeeds::Reservation => "must reserve allocated claim for pre-scheduled pod",
            PodNeeds::NobodyAllocates => "pre-scheduled pod uses a claim nobody will allocate",
            PodNeeds::Refused => {
                "pod refused by the controller's feature gates: must tell the user"
            }
        })
    }
}

/// Why a pod needs no pod work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoPodWork {
    Deleting,
    Done,
    NothingToDo,
}

impl fmt::Display for NoPodWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NoPodWork::Deleting => "pod is being deleted",
            NoPodWork::Done => "pod is done",
            NoPodWork::NothingToDo => "nothing to do",
        })
    }
}

/// Why a pod no longer uses its claims (they are checked, so that their
/// reservations go).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LetGo {
    Removed,
    Terminated,
    DeletedBeforeScheduling,
    /// Deleted, and a new pod now carries its name.
    Replaced,
}

impl fmt::Display for LetGo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LetGo::Removed => "pod got removed",
            LetGo::Terminated => "pod has terminated",
            LetGo::DeletedBeforeScheduling => "pod got deleted before scheduling",
            LetGo::Replaced => "pod got replaced under its name",
        })
    }
}

/// Why an event queued a key: the `reason` of its sync span (the
/// runtime adds its own: takeover, resync, recheck, retry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Pod(PodNeeds),
    /// A claim of a pod that let go of it.
    PodLetGo(LetGo),
    ClaimChanged,
    /// A PodGroup has claims to create or record.
    PodGroupNeedsWork,
    /// A PodGroup is gone: its claims and members are checked.
    PodGroupGone,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Pod(needs) => needs.fmt(f),
            Why::PodLetGo(why) => write!(f, "claim released: {why}"),
            Why::ClaimChanged => f.write_str("claim changed"),
            Why::PodGroupNeedsWork => f.write_str("PodGroup needs its claims"),
            Why::PodGroupGone => f.write_str("PodGroup is gone"),
        }
    }
}

/// Whether the pod may still use its claims. When it may not (deleted,
/// terminal, or deleted before scheduling), its claims get checked so that
/// reservations are released.
pub(crate) fn pod_needs_claims(pod: &PodView, deleted: bool) -> Result<(), LetGo> {
    if deleted {
        return Err(LetGo::Removed);
    }
    if pod.is_terminal() {
        return Err(LetGo::Terminated);
    }
    if pod.is_deleting() && pod.node_name().is_none() {
        return Err(LetGo::DeletedBeforeScheduling);
    }
    Ok(())
}

/// Whether a pod needs pod work, and why: read off what [`pod::decide`]
/// decides for it, so that what queues a pod and what its sync does cannot
/// disagree (a key queued for nothing, or work never queued).
pub(crate) fn pod_needs_work(
    pod: &PodView,
    caches: &Caches,
    gates: FeatureGates,
) -> Result<PodNeeds, NoPodWork> {
    let decision = pod::decide(pod, caches, gates);
    match decision.skipped {
        Some(Skip::Deleting) => return Err(NoPodWork::Deleting),
        Some(Skip::Done) => return Err(NoPodWork::Done),
        Some(Skip::PodGroupUnknown) | None => {}
    }
    needs_of(pod, &decision).ok_or(NoPodWork::NothingToDo)
}

/// The first thing a decision does, as the reason its pod is queued.
fn needs_of(pod: &PodView, decision: &PodDecision) -> Option<PodNeeds> {
    if decision.refused.is_some() {
        return Some(PodNeeds::Refused);
    }
    if let Some(action) = decision.entries.first() {
        let (EntryAction::Fail { entry, .. }
        | EntryAction::Adopt { entry, .. }
        | EntryAction::Create { entry, .. }) = action;
        let spec = pod.spec.resource_claims.iter().find(|e| &e.name == entry);
        if spec.is_some_and(|e| {
            resolve_claim(e, &pod.status.resource_claim_statuses) == ClaimResolution::Unsupported
        }) {
            return Some(PodNeeds::UnsupportedEntry);
        }
        if pod.pod_group_name().is_some() && pod_group_entry(pod, entry) {
            return Some(PodNeeds::GroupMember);
        }
        let recorded = decision.recorded.get(entry).is_some_and(Option::is_some);
        return Some(if recorded {
            PodNeeds::ReplacementClaim
        } else {
            PodNeeds::ClaimFromTemplate
        });
    }
    if !decision.missing.is_empty() {
        return Some(PodNeeds::MissingClaimOnNode);
    }
    if !decision.reservations.is_empty() {
        return Some(PodNeeds::Reservation);
    }
    if !decision.unallocated.is_empty() {
        return Some(PodNeeds::NobodyAllocates);
    }
    None
}

/// Whether `entry` of a PodGroup member is one the group provides (a
/// template entry; the group's own claim is adopted for it).
fn pod_group_entry(pod: &PodView, entry: &str) -> bool {
    pod.spec
        .resource_claims
        .iter()
        .any(|e| e.name == entry && e.resource_claim_template_name.is_some())
}

/// The keys a pod event wakes up, each with why.
pub(crate) fn keys_for_pod_event(
    pod: &PodView,
    deleted: bool,
    caches: &Caches,
    gates: FeatureGates,
) -> Vec<(WorkKey, Why)> {
    let mut keys = Vec::new();
    if !pod.is_relevant() {
        return keys;
    }
    if let Err(let_go) = pod_needs_claims(pod, deleted) {
        let why = Why::PodLetGo(let_go);
        let statuses = &pod.status.resource_claim_statuses;
        for entry in &pod.spec.resource_claims {
            if let Some(name) = resolve_claim(entry, statuses).name() {
                keys.push((WorkKey::claim(pod.namespace(), name), why));
            }
        }
        // Claims the scheduler made for extended resources are cleaned up
        // like generated ones, whatever the feature gate says now.
        if let Some(name) = pod.extended_claim_name() {
            keys.push((WorkKey::claim(pod.namespace(), name), why));
        }
        // Claims made for this pod whose names it does not carry: created,
        // but the status write recording them had not succeeded when the
        // pod finished. Only the pod's event can tell their claim sync
        // that they are no longer needed; nothing else would wake it until
        // the next resync (kube-controller-manager has this gap).
        for claim in caches.claims_owned_by(pod.uid()) {
            let key = WorkKey::claim(claim.namespace(), claim.name());
            if !keys.iter().any(|(k, _)| *k == key) {
                keys.push((key, why));
            }
        }
    }
    if !deleted && let Ok(needs) = pod_needs_work(pod, caches, gates) {
        keys.push((WorkKey::pod(pod.namespace(), pod.name()), Why::Pod(needs)));
    }
    keys
}

/// The keys a pod new to the cache wakes because it replaces a deleted pod
/// of its name: the claims the deleted pod owned. Their sync may have run
/// while neither pod was cached; it then left them to the garbage collector,
/// and nothing else would bring them back before the next resync, although
/// the replacement now proves they will never be used.
pub(crate) fn keys_for_replacement(pod: &PodView, caches: &Caches) -> Vec<(WorkKey, Why)> {
    let Some(previous_uid) = caches.deleted_pod_uid(pod.namespace(), pod.name()) else {
        return Vec::new();
    };
    if previous_uid == pod.uid() {
        return Vec::new();
    }
    caches
        .claims_owned_by(&previous_uid)
        .iter()
        .map(|c| {
            (
                WorkKey::claim(c.namespace(), c.name()),
                Why::PodLetGo(LetGo::Replaced),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::test_support::merge;
    use serde_json::{Value, json};
    use std::sync::Arc;
    use std::time::Instant;

    fn pod(extra: Value) -> PodView {
        let mut base = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {}
        });
        merge(&mut base, extra);
        PodView::at_first_sight(serde_json::from_value(base).unwrap(), Instant::now())
    }

    fn claim(
        name: &str,
        owner: &str,
        allocated: bool,
        reserved: &[&str],
    ) -> Arc<crate::model::views::ClaimView> {
        let reserved: Vec<Value> = reserved
            .iter()
            .map(|u| json!({"resource": "pods", "name": "p", "uid": u}))
            .collect();
        let mut v = json!({
            "metadata": {"name": name, "namespace": "ns",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner, "controller": true}]},
            "status": {"reservedFor": reserved}
        });
        if allocated {
            v["status"]["allocation"] = json!({});
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn display_matches_reference_keys() {
        assert_eq!(WorkKey::pod("ns", "p").to_string(), "pod:ns/p");
        assert_eq!(WorkKey::claim("ns", "c").to_string(), "claim:ns/c");
    }

    #[test]
    fn needs_work_table() {
        let recorded = json!({"status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}]}});
        let scheduled_recorded = json!({"spec": {"nodeName": "n"}, "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}]}});
        type Case = (
            &'static str,
            Value,
            Option<Arc<crate::model::views::ClaimView>>,
            Result<PodNeeds, NoPodWork>,
        );
        let cases: Vec<Case> = vec![
            (
                "not-created",
                json!({}),
                None,
                Ok(PodNeeds::ClaimFromTemplate),
            ),
            (
                "recorded-exists",
                recorded.clone(),
                Some(claim("c1", "u1", false, &[])),
                Err(NoPodWork::NothingToDo),
            ),
            (
                "recorded-gone",
                recorded.clone(),
                None,
                Ok(PodNeeds::ReplacementClaim),
            ),
            (
                "recorded-wrong-owner",
                recorded.clone(),
                Some(claim("c1", "other", false, &[])),
                Ok(PodNeeds::ReplacementClaim),
            ),
            (
                "skipped",
                json!({"status": {"resourceClaimStatuses": [{"name": "gpu"}]}}),
                None,
                Err(NoPodWork::NothingToDo),
            ),
            (
                "done",
                json!({"status": {"phase": "Succeeded"}}),
                None,
                Err(NoPodWork::Done),
            ),
            (
                "failed",
                json!({"status": {"phase": "Failed"}}),
                None,
                Err(NoPodWork::Done),
            ),
            (
                "deleting",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
                None,
                Err(NoPodWork::Deleting),
            ),
            (
                "unsupported",
                json!({"spec": {"resourceClaims": [{"name": "x"}]}}),
                None,
                Ok(PodNeeds::UnsupportedEntry),
            ),
            (
                "add-reserved",
                scheduled_recorded.clone(),
                Some(claim("c1", "u1", true, &[])),
                Ok(PodNeeds::Reservation),
            ),
            (
                "already-reserved",
                scheduled_recorded.clone(),
                Some(claim("c1", "u1", true, &["u1"])),
                Err(NoPodWork::NothingToDo),
            ),
            (
                // Pre-scheduled: nothing will allocate it, the user is told.
                "pre-scheduled-unallocated",
                scheduled_recorded,
                Some(claim("c1", "u1", false, &[])),
                Ok(PodNeeds::NobodyAllocates),
            ),
            (
                // Bound by a scheduler: it allocated the claim before
                // binding, our claim watch is only behind.
                "bound-by-scheduler-unallocated",
                json!({"spec": {"nodeName": "n"}, "status": {
                    "conditions": [{"type": "PodScheduled", "status": "True"}],
                    "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}]}}),
                Some(claim("c1", "u1", false, &[])),
                Err(NoPodWork::NothingToDo),
            ),
            (
                // On a node: no replacement, but the user must be told.
                "recorded-gone-on-node",
                json!({"spec": {"nodeName": "n"}, "status": {
                    "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}]}}),
                None,
                Ok(PodNeeds::MissingClaimOnNode),
            ),
            (
                "shared-missing",
                json!({"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "user-claim", "resourceClaimTemplateName": null}]}}),
                None,
                Err(NoPodWork::NothingToDo),
            ),
        ];
        for (case, extra, cached, want) in cases {
            let caches = Caches::new();
            if let Some(c) = cached {
                caches.claims.apply(format!("ns/{}", c.name()), c);
            }
            let p = pod(extra);
            assert_eq!(
                pod_needs_work(&p, &caches, FeatureGates::default()),
                want,
                "case {case}"
            );
            if case == "recorded-gone-on-node" {
                caches.note_missing_claim_reported(p.uid(), "gpu");
                assert_eq!(
                    pod_needs_work(&p, &caches, FeatureGates::default()),
                    Err(NoPodWork::NothingToDo),
                    "told once: {case}"
                );
            }
        }
    }

    #[test]
    fn done_or_deleted_pod_wakes_its_claims() {
        let caches = Caches::new();
        let done = pod(json!({"status": {"phase": "Succeeded",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}],
            "extendedResourceClaimStatus": {"resourceClaimName": "ext", "requestMappings": []}}}));
        let terminated = Why::PodLetGo(LetGo::Terminated);
        assert_eq!(
            keys_for_pod_event(&done, false, &caches, FeatureGates::default()),
            vec![
                (WorkKey::claim("ns", "c1"), terminated),
                (WorkKey::claim("ns", "ext"), terminated)
            ]
        );
        let running = pod(json!({"status": {"phase": "Running",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}]}}));
        caches
            .claims
            .apply("ns/c1".into(), claim("c1", "u1", false, &[]));
        assert!(keys_for_pod_event(&running, false, &caches, FeatureGates::default()).is_empty());
        assert_eq!(
            keys_for_pod_event(&running, true, &caches, FeatureGates::default()),
            vec![(WorkKey::claim("ns", "c1"), Why::PodLetGo(LetGo::Removed))]
        );
        let unrelated: PodView =
            serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "ns"}})).unwrap();
        assert!(keys_for_pod_event(&unrelated, true, &caches, FeatureGates::default()).is_empty());
    }

    /// The sequence that leaked claims under faults: the claim is created,
    /// every write recording its name in the pod's status fails, then the
    /// pod finishes. Its event must still wake the claim, found through
    /// the owner index, once (not again when the name is recorded).
    #[test]
    fn pod_done_before_its_claim_is_recorded_wakes_that_claim() {
        let caches = Caches::new();
        caches
            .claims
            .apply("ns/generated".into(), claim("generated", "u1", false, &[]));
        caches.claims.apply(
            "ns/someone-elses".into(),
            claim("someone-elses", "u2", false, &[]),
        );
        let terminated = Why::PodLetGo(LetGo::Terminated);
        let unrecorded = pod(json!({"status": {"phase": "Succeeded"}}));
        assert_eq!(
            keys_for_pod_event(&unrecorded, false, &caches, FeatureGates::default()),
            vec![(WorkKey::claim("ns", "generated"), terminated)]
        );
        let recorded = pod(json!({"status": {"phase": "Failed",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "generated"}]}}));
        assert_eq!(
            keys_for_pod_event(&recorded, false, &caches, FeatureGates::default()),
            vec![(WorkKey::claim("ns", "generated"), terminated)]
        );
        assert_eq!(
            keys_for_pod_event(
                &pod(json!({"status": {"phase": "Running"}})),
                true,
                &caches,
                FeatureGates::default()
            ),
            vec![(
                WorkKey::claim("ns", "generated"),
                Why::PodLetGo(LetGo::Removed)
            )]
        );
    }

    /// A pod deleted and created again under its name: the new pod's
    /// arrival wakes the claims the deleted one owned, and only those.
    #[test]
    fn replacement_wakes_the_claims_of_the_pod_it_replaces() {
        let caches = Caches::new();
        caches
            .claims
            .apply("ns/old".into(), claim("old", "u1", false, &[]));
        caches
            .claims
            .apply("ns/new".into(), claim("new", "u2", false, &[]));
        let replacement = pod(json!({"metadata": {"uid": "u2"}}));
        assert!(keys_for_replacement(&replacement, &caches).is_empty());
        caches.note_pod_deleted("ns", "p", "u1");
        assert_eq!(
            keys_for_replacement(&replacement, &caches),
            vec![(WorkKey::claim("ns", "old"), Why::PodLetGo(LetGo::Replaced))]
        );
        // The deleted pod's own update (same UID) wakes nothing.
        assert!(keys_for_replacement(&pod(json!({})), &caches).is_empty());
    }
}
