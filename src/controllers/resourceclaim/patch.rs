//! JSON Patch (RFC 6902) builders for claim writes.
//!
//! Every patch starts with `test` operations on exactly the state the
//! decision was based on. If the scheduler or another replica changed that
//! state in the meantime, the API server rejects the patch (422) instead of
//! letting us overwrite their write; the key is retried and decided again on
//! fresh state.

use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
use serde_json::{Value, json};

use crate::model::views::ClaimView;

fn to_patch(ops: Value) -> json_patch::Patch {
    serde_json::from_value(ops).expect("patch operations are well-formed by construction")
}

/// A guard on the whole object version, for decisions based on the
/// absence of a field (RFC 6902 cannot test for absence).
fn test_resource_version(claim: &ClaimView) -> Value {
    json!({"op": "test", "path": "/metadata/resourceVersion",
           "value": claim.metadata.resource_version.clone().unwrap_or_default()})
}

/// Tests `reservedFor` against the entries exactly as they were read, not
/// as our types would write them back.
fn test_reserved_for(claim: &ClaimView) -> Value {
    json!({"op": "test", "path": "/status/reservedFor", "value": claim.status.reserved_for.raw()})
}

/// Adds `consumer` to `status.reservedFor` of the claim as seen.
pub(crate) fn add_reservation(
    seen: &ClaimView,
    consumer: &ResourceClaimConsumerReference,
) -> json_patch::Patch {
    if seen.status.reserved_for.is_empty() {
        to_patch(json!([
            test_resource_version(seen),
            {"op": "add", "path": "/status/reservedFor", "value": [consumer]},
        ]))
    } else {
        to_patch(json!([
            test_reserved_for(seen),
            {"op": "add", "path": "/status/reservedFor/-", "value": consumer},
        ]))
    }
}

/// Replaces `status.reservedFor` of the claim as seen with `remaining` (a
/// subset of its entries, written back as they were read), and clears
/// `status.allocation` when `deallocate` is set.
pub(crate) fn remove_reservations(
    seen: &ClaimView,
    remaining: &[ResourceClaimConsumerReference],
    deallocate: bool,
) -> json_patch::Patch {
    let mut ops = vec![test_reserved_for(seen)];
    if remaining.is_empty() {
        ops.push(json!({"op": "remove", "path": "/status/reservedFor"}));
    } else {
        let kept = seen.status.reserved_for.raw_of(remaining);
        ops.push(json!({"op": "replace", "path": "/status/reservedFor", "value": kept}));
    }
    if deallocate {
        ops.push(json!({"op": "remove", "path": "/status/allocation"}));
    }
    to_patch(Value::Array(ops))
}

/// Clears `status.allocation` of an unreserved claim as seen.
pub(crate) fn deallocate(seen: &ClaimView) -> json_patch::Patch {
    to_patch(json!([
        test_resource_version(seen),
        {"op": "remove", "path": "/status/allocation"},
    ]))
}

/// Removes `finalizer` from the claim as seen. The whole version is
/// guarded: the decision may rest on a reservation being absent, or (for a
/// claim being deleted) on its remaining reservations being stale.
pub(crate) fn remove_finalizer(seen: &ClaimView, finalizer: &str) -> Option<json_patch::Patch> {
    let finalizers = seen.finalizers();
    let index = finalizers.iter().position(|f| f == finalizer)?;
    Some(to_patch(json!([
        test_resource_version(seen),
        {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
    ])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::consumers::pod_consumer;

    fn claim(value: Value) -> ClaimView {
        serde_json::from_value(value).unwrap()
    }

    fn apply(doc: &Value, patch: &json_patch::Patch) -> Result<Value, String> {
        let mut doc = doc.clone();
        json_patch::patch(&mut doc, patch).map_err(|e| e.to_string())?;
        Ok(doc)
    }

    fn server_claim(reserved: Value) -> Value {
        json!({
            "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "10",
                         "finalizers": ["other", "resource.kubernetes.io/delete-protection"]},
            "status": {"allocation": {"devices": {"results": []}}, "reservedFor": reserved}
        })
    }

    #[test]
    fn add_reservation_to_empty_guards_resource_version() {
        let mut doc = server_claim(json!(null));
        doc["status"].as_object_mut().unwrap().remove("reservedFor");
        let seen = claim(doc.clone());
        let patch = add_reservation(&seen, &pod_consumer("p", "u1"));
        let out = apply(&doc, &patch).unwrap();
        assert_eq!(
            out["status"]["reservedFor"],
            json!([{"resource": "pods", "name": "p", "uid": "u1"}])
        );
        // Someone else reserved meanwhile (new resourceVersion): rejected.
        let mut raced = doc.clone();
        raced["metadata"]["resourceVersion"] = json!("11");
        raced["status"]["reservedFor"] = json!([{"resource": "pods", "name": "q", "uid": "u2"}]);
        assert!(apply(&raced, &patch).is_err());
    }

    #[test]
    fn add_reservation_appends_after_test() {
        let doc = server_claim(json!([{"resource": "pods", "name": "q", "uid": "u2"}]));
        let seen = claim(doc.clone());
        let patch = add_reservation(&seen, &pod_consumer("p", "u1"));
        let out = apply(&doc, &patch).unwrap();
        assert_eq!(out["status"]["reservedFor"].as_array().unwrap().len(), 2);
        let raced = server_claim(json!([]));
        assert!(
            apply(&raced, &patch).is_err(),
            "the seen entry vanished: must fail"
        );
    }

    #[test]
    fn remove_reservations_and_deallocate() {
        let doc = server_claim(json!([
            {"resource": "pods", "name": "p", "uid": "u1"},
            {"apiGroup": "foo.com", "resource": "foos", "name": "f", "uid": "u9"}
        ]));
        let seen = claim(doc.clone());
        let keep = vec![seen.status.reserved_for[1].clone()];
        let out = apply(&doc, &remove_reservations(&seen, &keep, false)).unwrap();
        assert_eq!(
            out["status"]["reservedFor"],
            json!([{"apiGroup": "foo.com", "resource": "foos", "name": "f", "uid": "u9"}])
        );
        assert!(out["status"].get("allocation").is_some());

        let out = apply(&doc, &remove_reservations(&seen, &[], true)).unwrap();
        assert!(out["status"].get("reservedFor").is_none());
        assert!(out["status"].get("allocation").is_none());

        // The scheduler added a pod meanwhile: our removal must not win.
        let raced = server_claim(json!([
            {"resource": "pods", "name": "p", "uid": "u1"},
            {"apiGroup": "foo.com", "resource": "foos", "name": "f", "uid": "u9"},
            {"resource": "pods", "name": "new", "uid": "u3"}
        ]));
        assert!(apply(&raced, &remove_reservations(&seen, &[], true)).is_err());
    }

    /// A field a newer API server adds to an entry is neither a reason for
    /// the guard to fail nor dropped from the entries kept.
    #[test]
    fn guards_use_entries_as_read() {
        let doc = server_claim(json!([
            {"resource": "pods", "name": "p", "uid": "u1", "futureField": {"x": 1}},
            {"apiGroup": "foo.com", "resource": "foos", "name": "f", "uid": "u9", "futureField": 2}
        ]));
        let seen = claim(doc.clone());
        let keep = vec![seen.status.reserved_for[1].clone()];
        let out = apply(&doc, &remove_reservations(&seen, &keep, false)).unwrap();
        assert_eq!(
            out["status"]["reservedFor"],
            json!([{"apiGroup": "foo.com", "resource": "foos", "name": "f", "uid": "u9", "futureField": 2}])
        );
        let out = apply(&doc, &add_reservation(&seen, &pod_consumer("q", "u2"))).unwrap();
        assert_eq!(out["status"]["reservedFor"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn finalizer_removal_is_guarded() {
        let doc = server_claim(json!([]));
        let seen = claim(doc.clone());
        let patch = remove_finalizer(&seen, "resource.kubernetes.io/delete-protection").unwrap();
        let out = apply(&doc, &patch).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["other"]));
        let mut raced = doc.clone();
        raced["metadata"]["finalizers"] = json!(["resource.kubernetes.io/delete-protection"]);
        assert!(apply(&raced, &patch).is_err());
        // A reservation added meanwhile bumps the version: rejected.
        let mut reserved = doc.clone();
        reserved["metadata"]["resourceVersion"] = json!("11");
        assert!(apply(&reserved, &patch).is_err());
        assert!(remove_finalizer(&seen, "absent").is_none());
    }

    #[test]
    fn deallocate_guards_version() {
        let doc = server_claim(json!([]));
        let seen = claim(doc.clone());
        let out = apply(&doc, &deallocate(&seen)).unwrap();
        assert!(out["status"].get("allocation").is_none());
        let mut raced = doc.clone();
        raced["metadata"]["resourceVersion"] = json!("12");
        assert!(apply(&raced, &deallocate(&seen)).is_err());
    }
}
