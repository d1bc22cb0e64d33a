//! Which claims of a pod the allocator allocates, decided from the stores:
//! pure, so the rules read as a table (see the tests).

use std::fmt;
use std::sync::Arc;

use crate::model::consumers::{Unreserved, unreserved_claims};
use crate::model::views::{ClaimView, PodGroupView, PodView};

/// Why a pod is not the allocator's work (for the sync's log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotMine {
    Deleting,
    Done,
    /// Not on a node the admin declared with `--allocate-on-nodes`.
    NodeNotDeclared,
    /// Bound by a scheduler, which allocates before it binds.
    ScheduledByScheduler,
    /// Its PodGroup is not known yet; the group's arrival wakes it.
    PodGroupUnknown,
    /// Every claim is allocated, reserved, being deleted or not there yet.
    NothingUnallocated,
}

impl fmt::Display for NotMine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotMine::Deleting => "pod is being deleted",
            NotMine::Done => "pod is done",
            NotMine::NodeNotDeclared => "pod is not on a declared node",
            NotMine::ScheduledByScheduler => "pod was bound by a scheduler",
            NotMine::PodGroupUnknown => "its PodGroup is not known yet",
            NotMine::NothingUnallocated => "no unallocated claim to allocate",
        })
    }
}

/// What the allocator reads about the cluster, from its stores.
pub(crate) struct Lookup<'a> {
    /// Whether the admin declared the node.
    pub is_declared: &'a dyn Fn(&str) -> bool,
    /// The pod's PodGroup, when PodGroups are served and the pod names one
    /// (`Some(None)`: named but not known).
    pub group: Option<Option<Arc<PodGroupView>>>,
    /// A claim of the pod's namespace by name.
    pub claim: &'a dyn Fn(&str) -> Option<Arc<ClaimView>>,
}

/// The claims of `pod` to allocate on its node, with whom to reserve each
/// for; or why there are none.
pub(crate) fn claims_to_allocate(
    pod: &PodView,
    lookup: &Lookup<'_>,
) -> Result<Vec<Unreserved>, NotMine> {
    if pod.is_deleting() {
        return Err(NotMine::Deleting);
    }
    if pod.is_done() {
        return Err(NotMine::Done);
    }
    let Some(node) = pod.node_name() else {
        return Err(NotMine::NodeNotDeclared);
    };
    if !(lookup.is_declared)(node) {
        return Err(NotMine::NodeNotDeclared);
    }
    if !pod.is_pre_scheduled() {
        return Err(NotMine::ScheduledByScheduler);
    }
    let group = match &lookup.group {
        None => None,
        Some(Some(group)) => Some(group.as_ref()),
        Some(None) => return Err(NotMine::PodGroupUnknown),
    };
    let wanted: Vec<Unreserved> = unreserved_claims(pod, group, lookup.claim)
        .into_iter()
        .filter(|u| !u.claim.is_allocated() && !u.claim.is_deleting())
        .collect();
    if wanted.is_empty() {
        return Err(NotMine::NothingUnallocated);
    }
    Ok(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::views::PodView;
    use serde_json::{Value, json};
    use std::collections::HashMap;

    fn pod(extra: Value) -> PodView {
        let mut v = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"nodeName": "declared-1",
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}]}
        });
        for (k, val) in extra.as_object().unwrap() {
            for (k2, val2) in val.as_object().unwrap() {
                v[k][k2] = val2.clone();
            }
        }
        let mut pod: PodView = serde_json::from_value(v).unwrap();
        // First seen with a node and no scheduler's word: pre-scheduled.
        pod.history.pre_scheduled = pod.spec.node_name.is_some();
        pod
    }

    fn claim(allocated: bool, deleting: bool, reserved: bool) -> Arc<ClaimView> {
        let mut v = json!({
            "metadata": {"name": "c1", "namespace": "ns", "uid": "c-uid",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1", "controller": true}]},
            "status": {}
        });
        if allocated {
            v["status"]["allocation"] = json!({});
        }
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        if reserved {
            v["status"]["reservedFor"] = json!([{"resource": "pods", "name": "p", "uid": "u1"}]);
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn decide(pod: &PodView, claim: Option<Arc<ClaimView>>) -> Result<Vec<String>, NotMine> {
        let claims: HashMap<String, Arc<ClaimView>> = claim
            .into_iter()
            .map(|c| (c.name().to_string(), c))
            .collect();
        let lookup = Lookup {
            is_declared: &|node| node.starts_with("declared"),
            group: None,
            claim: &|name| claims.get(name).cloned(),
        };
        claims_to_allocate(pod, &lookup).map(|w| {
            w.iter()
                .map(|u| format!("{}->{}", u.claim.name(), u.consumer.name))
                .collect()
        })
    }

    #[test]
    fn which_claims_the_allocator_takes() {
        type Row = (
            &'static str,
            PodView,
            Option<Arc<ClaimView>>,
            Result<Vec<String>, NotMine>,
        );
        let rows: Vec<Row> = vec![
            (
                "unallocated",
                pod(json!({})),
                Some(claim(false, false, false)),
                Ok(vec!["c1->p".into()]),
            ),
            (
                "allocated",
                pod(json!({})),
                Some(claim(true, false, false)),
                Err(NotMine::NothingUnallocated),
            ),
            (
                "reserved",
                pod(json!({})),
                Some(claim(false, false, true)),
                Err(NotMine::NothingUnallocated),
            ),
            (
                "claim-deleting",
                pod(json!({})),
                Some(claim(false, true, false)),
                Err(NotMine::NothingUnallocated),
            ),
            (
                "claim-not-there-yet",
                pod(json!({})),
                None,
                Err(NotMine::NothingUnallocated),
            ),
            (
                "other-node",
                pod(json!({"spec": {"nodeName": "n-2"}})),
                Some(claim(false, false, false)),
                Err(NotMine::NodeNotDeclared),
            ),
            (
                "done",
                pod(json!({"status": {"phase": "Succeeded"}})),
                Some(claim(false, false, false)),
                Err(NotMine::Done),
            ),
            (
                "deleting",
                pod(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})),
                Some(claim(false, false, false)),
                Err(NotMine::Deleting),
            ),
        ];
        for (case, pod, claim, want) in rows {
            assert_eq!(decide(&pod, claim), want, "case {case}");
        }
    }

    #[test]
    fn a_pod_bound_by_a_scheduler_is_left_to_it() {
        let mut p = pod(json!({}));
        p.history.pre_scheduled = false;
        assert_eq!(
            decide(&p, Some(claim(false, false, false))),
            Err(NotMine::ScheduledByScheduler)
        );
    }
}
