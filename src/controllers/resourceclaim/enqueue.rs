//! What wakes what: pure predicates that turn a watch event into work keys.

use std::fmt;

use super::cache::Caches;
use super::pod::{RecordedClaim, recorded_claim_state};
use crate::model::views::PodView;
use crate::naming::{ClaimResolution, resolve_claim};

/// A unit of work: a pod or a claim, by namespace and name.
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

/// Whether the pod may still use its claims. When it may not (deleted,
/// terminal, or deleted before scheduling), its claims get checked so that
/// reservations are released.
pub fn pod_needs_claims(pod: &PodView, deleted: bool) -> Result<(), &'static str> {
    if deleted {
        return Err("pod got removed");
    }
    if pod.is_terminal() {
        return Err("pod has terminated");
    }
    if pod.is_deleting() && pod.node_name().is_none() {
        return Err("pod got deleted before scheduling");
    }
    Ok(())
}

/// Whether a pod needs pod work, with the reason (for logs).
pub fn pod_needs_work(pod: &PodView, caches: &Caches) -> Result<&'static str, &'static str> {
    if pod.is_deleting() {
        return Err("pod is being deleted");
    }
    if pod.is_done() {
        // The reference controller would re-create claims for done pods
        // whose claims are gone; a pod that will not run needs none.
        return Err("pod is done");
    }
    if caches.pod_group_of(pod).is_some() {
        // Group members are few (alpha feature) and their entries resolve
        // through the group: let pod work decide, from the caches.
        return Ok("member of a PodGroup");
    }
    let statuses = &pod.status.resource_claim_statuses;
    for entry in &pod.spec.resource_claims {
        let resolution = resolve_claim(entry, statuses);
        let name = match resolution {
            ClaimResolution::Unsupported => return Ok("claim entry uses an unsupported API"),
            ClaimResolution::NotCreatedYet => return Ok("must create ResourceClaim from template"),
            ClaimResolution::Skipped => continue,
            ClaimResolution::Generated(name) => {
                match recorded_claim_state(pod, &entry.name, name, caches) {
                    RecordedClaim::Usable => name,
                    RecordedClaim::Replace => {
                        return Ok(
                            "recorded ResourceClaim is gone or not the pod's: must create a replacement",
                        );
                    }
                    RecordedClaim::MissingOnNode => {
                        return Ok(
                            "recorded ResourceClaim of a pod on a node is gone: must tell the user",
                        );
                    }
                    RecordedClaim::MissingReported => continue,
                }
            }
            ClaimResolution::Shared(name) => name,
        };
        // A shared claim the user still has to create is not our business.
        let Some(claim) = caches.claim(pod.namespace(), name) else {
            continue;
        };
        if pod.node_name().is_some() && !claim.is_reserved_for(pod.uid()) {
            if claim.is_allocated() {
                return Ok("must reserve allocated claim for pre-scheduled pod");
            }
            let node = pod.node_name().unwrap_or_default();
            if pod.is_pre_scheduled() && !(caches.allocated_elsewhere(node) && !claim.is_deleting())
            {
                // Bound without the scheduler, so nothing will allocate it:
                // the user has to hear about it.
                return Ok("pre-scheduled pod uses a claim nobody will allocate");
            }
        }
    }
    Err("nothing to do")
}

/// The keys a pod event wakes up.
pub fn keys_for_pod_event(pod: &PodView, deleted: bool, caches: &Caches) -> Vec<WorkKey> {
    let mut keys = Vec::new();
    if !pod.is_relevant() {
        return keys;
    }
    if pod_needs_claims(pod, deleted).is_err() {
        let statuses = &pod.status.resource_claim_statuses;
        for entry in &pod.spec.resource_claims {
            if let Some(name) = resolve_claim(entry, statuses).name() {
                keys.push(WorkKey::claim(pod.namespace(), name));
            }
        }
        // Claims the scheduler made for extended resources are cleaned up
        // like generated ones, whatever the feature gate says now.
        if let Some(name) = pod.extended_claim_name() {
            keys.push(WorkKey::claim(pod.namespace(), name));
        }
    }
    if !deleted && pod_needs_work(pod, caches).is_ok() {
        keys.push(WorkKey::pod(pod.namespace(), pod.name()));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::super::observe::first_sight;
    use super::super::test_support::merge;
    use super::*;
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
        first_sight(serde_json::from_value(base).unwrap(), Instant::now())
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
        let cases: Vec<(
            &str,
            Value,
            Option<Arc<crate::model::views::ClaimView>>,
            bool,
        )> = vec![
            ("not-created", json!({}), None, true),
            (
                "recorded-exists",
                recorded.clone(),
                Some(claim("c1", "u1", false, &[])),
                false,
            ),
            ("recorded-gone", recorded.clone(), None, true),
            (
                "recorded-wrong-owner",
                recorded.clone(),
                Some(claim("c1", "other", false, &[])),
                true,
            ),
            (
                "skipped",
                json!({"status": {"resourceClaimStatuses": [{"name": "gpu"}]}}),
                None,
                false,
            ),
            (
                "done",
                json!({"status": {"phase": "Succeeded"}}),
                None,
                false,
            ),
            (
                "failed",
                json!({"status": {"phase": "Failed"}}),
                None,
                false,
            ),
            (
                "deleting",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
                None,
                false,
            ),
            (
                "unsupported",
                json!({"spec": {"resourceClaims": [{"name": "x"}]}}),
                None,
                true,
            ),
            (
                "add-reserved",
                scheduled_recorded.clone(),
                Some(claim("c1", "u1", true, &[])),
                true,
            ),
            (
                "already-reserved",
                scheduled_recorded.clone(),
                Some(claim("c1", "u1", true, &["u1"])),
                false,
            ),
            (
                // Pre-scheduled: nothing will allocate it, the user is told.
                "pre-scheduled-unallocated",
                scheduled_recorded,
                Some(claim("c1", "u1", false, &[])),
                true,
            ),
            (
                // Bound by a scheduler: it allocated the claim before
                // binding, our claim watch is only behind.
                "bound-by-scheduler-unallocated",
                json!({"spec": {"nodeName": "n"}, "status": {
                    "conditions": [{"type": "PodScheduled", "status": "True"}],
                    "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}]}}),
                Some(claim("c1", "u1", false, &[])),
                false,
            ),
            (
                // On a node: no replacement, but the user must be told.
                "recorded-gone-on-node",
                json!({"spec": {"nodeName": "n"}, "status": {
                    "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}]}}),
                None,
                true,
            ),
            (
                "shared-missing",
                json!({"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "user-claim", "resourceClaimTemplateName": null}]}}),
                None,
                false,
            ),
        ];
        for (case, extra, cached, want) in cases {
            let caches = Caches::new();
            if let Some(c) = cached {
                caches.claims.apply(format!("ns/{}", c.name()), c);
            }
            let p = pod(extra);
            assert_eq!(pod_needs_work(&p, &caches).is_ok(), want, "case {case}");
            if case == "recorded-gone-on-node" {
                caches.note_missing_claim_reported(p.uid(), "gpu");
                assert!(pod_needs_work(&p, &caches).is_err(), "told once: {case}");
            }
        }
    }

    #[test]
    fn done_or_deleted_pod_wakes_its_claims() {
        let caches = Caches::new();
        let done = pod(json!({"status": {"phase": "Succeeded",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}],
            "extendedResourceClaimStatus": {"resourceClaimName": "ext", "requestMappings": []}}}));
        assert_eq!(
            keys_for_pod_event(&done, false, &caches),
            vec![WorkKey::claim("ns", "c1"), WorkKey::claim("ns", "ext")]
        );
        let running = pod(json!({"status": {"phase": "Running",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}]}}));
        caches
            .claims
            .apply("ns/c1".into(), claim("c1", "u1", false, &[]));
        assert!(keys_for_pod_event(&running, false, &caches).is_empty());
        assert_eq!(
            keys_for_pod_event(&running, true, &caches),
            vec![WorkKey::claim("ns", "c1")]
        );
        let unrelated: PodView =
            serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "ns"}})).unwrap();
        assert!(keys_for_pod_event(&unrelated, true, &caches).is_empty());
    }
}
