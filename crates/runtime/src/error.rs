//! Why a sync failed, as a value the worker branches on.

use std::fmt;

/// A failed sync. The worker retries every kind but one, and not in the
/// same way: a conflict is routine, an unreachable API server says nothing
/// about the item, a non-retryable error is given up, and only the other
/// kinds count as the item failing.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A guarded write found the object changed since it was read (409, or
    /// a 422 that reports a failed JSON Patch `test`): decide again on fresh
    /// state.
    #[error("{what}: the object changed meanwhile: {source}")]
    Conflict {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// No answer from the API server at all (connection refused, TLS
    /// failure, connection lost before a response).
    #[error("{what}: API server unreachable: {source}")]
    Unreachable {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The API server refused the write as invalid (422 from validation):
    /// the same write fails again until the object, a webhook or this
    /// controller changes, so it is retried with growing backoff, loudly.
    #[error("{what}: rejected as invalid by the API server: {source}")]
    Rejected {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The API server answered with an error.
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The objects as they are cannot be worked with (a missing template,
    /// a gated field, an unknown API): the message says what to change.
    #[error("{0}")]
    Invalid(String),
    /// Retrying cannot help until the controller itself changes (a feature
    /// gate must be turned on and the process restarted): the key is
    /// forgotten, as kube-controller-manager 1.37 forgets its
    /// non-retryable work items; the next event of the object brings it
    /// back.
    #[error("{0}")]
    NonRetryable(String),
}

/// What a [`kube::Error`] says about where a request got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// An answer came back, telling that the state was not what a guard
    /// expected.
    Conflict,
    /// An answer came back refusing the write as invalid.
    Invalid,
    /// An answer came back with another error.
    Answered,
    /// No answer came back.
    Nowhere,
}

/// Classifies a client error.
pub fn reached(err: &kube::Error) -> Reached {
    match err {
        kube::Error::Api(status) if status.code == 409 => Reached::Conflict,
        kube::Error::Api(status) if status.code == 422 => {
            if is_failed_patch_test(status) {
                Reached::Conflict
            } else {
                Reached::Invalid
            }
        }
        kube::Error::Api(_) => Reached::Answered,
        kube::Error::HyperError(_) | kube::Error::Service(_) => Reached::Nowhere,
        _ => Reached::Answered,
    }
}

/// Whether a 422 reports a JSON Patch that could not be applied: a `test`
/// operation that failed, or a path the object no longer has. The API
/// server answers those with a bare 422: reason Invalid, the generic
/// message, no kind and no causes (the patch library's own words are
/// dropped). A validation failure names the kind and the invalid fields,
/// and a patch that does not decode names the field `patch`.
fn is_failed_patch_test(status: &kube::core::Status) -> bool {
    const GENERIC_422: &str = "the server rejected our request due to an error in our request";
    let mentions_test = |text: &str| text.contains("testing value") || text.contains("test failed");
    let details = status.details.as_ref();
    let names_kind = details.is_some_and(|d| !d.kind.is_empty());
    let causes = details.map(|d| d.causes.as_slice()).unwrap_or_default();
    if causes.iter().any(|c| mentions_test(&c.message)) || mentions_test(&status.message) {
        return true;
    }
    status.message == GENERIC_422 && !names_kind && causes.is_empty()
}

impl SyncError {
    /// Wraps a client error with what was being done (which names the
    /// object and the field).
    pub fn kube(what: impl fmt::Display, source: kube::Error) -> Self {
        let what = what.to_string();
        match reached(&source) {
            Reached::Conflict => SyncError::Conflict { what, source },
            Reached::Invalid => SyncError::Rejected { what, source },
            Reached::Nowhere => SyncError::Unreachable { what, source },
            Reached::Answered => SyncError::Api { what, source },
        }
    }
}

/// `map_err` shorthand: `.map_err(kube_err("reading pod ns/p"))`.
pub fn kube_err(what: impl fmt::Display) -> impl FnOnce(kube::Error) -> SyncError {
    move |source| SyncError::kube(what, source)
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn api(code: u16) -> kube::Error {
        status(json!({"code": code, "message": "m"}))
    }

    fn status(body: serde_json::Value) -> kube::Error {
        kube::Error::Api(Box::new(serde_json::from_value(body).unwrap()))
    }

    #[test]
    fn classification() {
        let rows = [
            (api(409), Reached::Conflict),
            (api(422), Reached::Invalid),
            (
                status(json!({"code": 422, "reason": "Invalid",
                    "message": "the server rejected our request due to an error in our request",
                    "details": {"causes": [{"reason": "UnexpectedServerResponse",
                        "message": "testing value /metadata/resourceVersion failed: test failed"}]}})),
                Reached::Conflict,
            ),
            // What kube-apiserver 1.36 really answers for a failed `test`.
            (
                status(json!({"code": 422, "reason": "Invalid",
                    "message": "the server rejected our request due to an error in our request",
                    "details": {}})),
                Reached::Conflict,
            ),
            // A patch that decodes but leaves an object that does not.
            (
                status(json!({"code": 422, "reason": "Invalid",
                    "message": " \"\" is invalid: patch: Invalid value: \"{}\": json: cannot unmarshal",
                    "details": {"causes": [{"reason": "FieldValueInvalid", "field": "patch"}]}})),
                Reached::Invalid,
            ),
            (
                status(json!({"code": 422, "reason": "Invalid",
                    "message": "ConfigMap \"c\" is invalid: data: Invalid value",
                    "details": {"kind": "ConfigMap", "name": "c",
                        "causes": [{"reason": "FieldValueInvalid", "field": "data"}]}})),
                Reached::Invalid,
            ),
            (api(404), Reached::Answered),
            (api(429), Reached::Answered),
            (api(503), Reached::Answered),
            (
                kube::Error::Service("connection refused".into()),
                Reached::Nowhere,
            ),
        ];
        for (err, want) in rows {
            assert_eq!(reached(&err), want, "{err}");
        }
        let e = SyncError::kube("patching ConfigMap ns/c", api(409));
        assert!(matches!(e, SyncError::Conflict { .. }));
        assert!(
            e.to_string().starts_with("patching ConfigMap ns/c: "),
            "{e}"
        );
        let e = SyncError::kube("creating ConfigMap ns/c", api(422));
        assert!(matches!(e, SyncError::Rejected { .. }));
        assert!(e.to_string().contains("rejected as invalid"), "{e}");
    }
}
