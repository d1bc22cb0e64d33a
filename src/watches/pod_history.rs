//! What a pod event means for the shared pod store: which version to keep,
//! what the pod's history says, and whether an older pod of that name is
//! gone.
//!
//! The rule this module exists for: a pod is gone only on a delete event
//! (or its absence from a relist), or when a pod with another UID holds its
//! name. A pod that merely stops listing claims (a status write from an
//! older client drops `extendedResourceClaimStatus`, say) still runs and
//! still uses its devices.

use std::time::Instant;

use crate::model::views::PodView;

/// What to do with the pod cache for one observed pod.
#[derive(Debug)]
pub(crate) struct Observation {
    /// The version to cache under the pod's key, if any.
    pub keep: Option<PodView>,
    /// An older pod of the same name (another UID) that is gone.
    pub replaced: bool,
}

/// Decides what to cache for `seen`, given the cached pod of the same name.
pub(crate) fn observe(cached: Option<&PodView>, mut seen: PodView, now: Instant) -> Observation {
    let same_pod = cached.filter(|old| old.uid() == seen.uid());
    let replaced = cached.is_some() && same_pod.is_none();
    match same_pod {
        Some(old) => {
            seen.history = old.history.clone();
            if seen.status.extended_resource_claim_status.is_none() {
                // The scheduler's claim of a pod does not change once it is
                // recorded; a write that dropped the field does not free it.
                seen.status.extended_resource_claim_status =
                    old.status.extended_resource_claim_status.clone();
            }
        }
        None => seen = seen.at_first_sight(now),
    }
    Observation {
        keep: seen.is_relevant().then_some(seen),
        replaced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(uid: &str, status: Value, node: Option<&str>) -> PodView {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": uid},
            "spec": {"nodeName": node},
            "status": status,
        }))
        .unwrap()
    }

    fn ext(name: &str) -> Value {
        json!({"phase": "Running", "extendedResourceClaimStatus": {"resourceClaimName": name, "requestMappings": []}})
    }

    #[test]
    fn dropped_extended_claim_status_is_not_a_deletion() {
        let now = Instant::now();
        let first = observe(None, pod("u1", ext("ext-1"), Some("n")), now);
        let cached = first.keep.expect("a pod with an extended claim is cached");
        let later = observe(
            Some(&cached),
            pod("u1", json!({"phase": "Running"}), Some("n")),
            now,
        );
        assert!(!later.replaced);
        let kept = later.keep.expect("the same pod stays cached");
        assert_eq!(kept.extended_claim_name(), Some("ext-1"));
        assert_eq!(kept.history, cached.history);
    }

    #[test]
    fn another_uid_under_the_name_replaces() {
        let now = Instant::now();
        let cached = observe(None, pod("u1", ext("ext-1"), Some("n")), now)
            .keep
            .unwrap();
        let other = observe(Some(&cached), pod("u2", json!({}), None), now);
        assert!(other.replaced);
        assert!(other.keep.is_none(), "the new pod has no claims");
        let other = observe(Some(&cached), pod("u2", ext("ext-2"), Some("n")), now);
        assert!(other.replaced);
        assert_eq!(other.keep.unwrap().extended_claim_name(), Some("ext-2"));
    }

    /// `managedFields` of a pod created by kubectl, owning `spec.nodeName`
    /// when `with_node`, and the kubelet's status entry.
    fn managed(with_node: bool) -> Value {
        let spec = if with_node {
            json!({"f:nodeName": {}, "f:containers": {}})
        } else {
            json!({"f:containers": {}})
        };
        json!([
            {"manager": "kubectl-create", "operation": "Update", "apiVersion": "v1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": spec}},
            {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "subresource": "status",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}},
        ])
    }

    #[test]
    fn pre_scheduled_is_decided_from_state_that_survives_a_restart() {
        let now = Instant::now();
        let scheduled = json!({"conditions": [{"type": "PodScheduled", "status": "True"}]});
        let unschedulable = json!({"conditions": [{"type": "PodScheduled", "status": "False"}]});
        // (case, managed fields, status, node, pre-scheduled?)
        let cases = [
            (
                "created with nodeName, seen before the kubelet",
                managed(true),
                json!({}),
                Some("n"),
                true,
            ),
            // The bug a real kubelet showed: a pod created with nodeName
            // while the controller was down, first seen after the kubelet
            // wrote PodScheduled=True into it.
            (
                "created with nodeName, seen after the kubelet (restart)",
                managed(true),
                scheduled.clone(),
                Some("n"),
                true,
            ),
            (
                "bound through pods/binding by a scheduler",
                managed(false),
                scheduled.clone(),
                Some("n"),
                false,
            ),
            ("not bound yet", managed(false), json!({}), None, false),
            (
                "not bound, nodeName owned by nobody yet",
                managed(true),
                json!({}),
                None,
                false,
            ),
            (
                "managed fields stripped, seen before the kubelet",
                json!(null),
                json!({}),
                Some("n"),
                true,
            ),
            (
                "managed fields stripped, scheduling failed so far",
                json!(null),
                unschedulable,
                Some("n"),
                true,
            ),
            (
                "managed fields stripped, seen scheduled",
                json!(null),
                scheduled,
                Some("n"),
                false,
            ),
        ];
        for (case, managed_fields, mut status, node, want) in cases {
            status["extendedResourceClaimStatus"] = json!({"resourceClaimName": "x"});
            let mut p: Value = serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "managedFields": managed_fields},
                "spec": {"nodeName": node},
                "status": status,
            }))
            .unwrap();
            if p["metadata"]["managedFields"].is_null() {
                p["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("managedFields");
            }
            let seen = observe(None, serde_json::from_value(p).unwrap(), now)
                .keep
                .unwrap();
            assert_eq!(seen.is_pre_scheduled(), want, "case {case}");
            assert_eq!(seen.history.first_seen, Some(now), "case {case}");
        }
        // Seen unbound first, bound later: never pre-scheduled.
        let unbound = observe(None, pod("u1", ext("x"), None), now).keep.unwrap();
        let bound = observe(Some(&unbound), pod("u1", ext("x"), Some("n")), now)
            .keep
            .unwrap();
        assert!(!bound.is_pre_scheduled());
    }

    #[test]
    fn pods_without_claims_are_not_cached() {
        let seen = observe(
            None,
            pod("u1", json!({"phase": "Running"}), None),
            Instant::now(),
        );
        assert!(seen.keep.is_none() && !seen.replaced);
    }
}
