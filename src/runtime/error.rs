//! Why a sync failed, as a value the worker branches on.

use std::fmt;

/// A failed sync. The worker retries every kind, but not in the same way:
/// a conflict is routine, an unreachable API server says nothing about the
/// item, and only the other kinds count as the item failing.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A guarded write found the object changed since it was read (409, or
    /// 422 from a failed JSON Patch `test`): decide again on fresh state.
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
}

/// What a [`kube::Error`] says about where a request got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// An answer came back, telling that the state was not what a guard
    /// expected.
    Conflict,
    /// An answer came back with another error.
    Answered,
    /// No answer came back.
    Nowhere,
}

/// Classifies a client error.
pub fn reached(err: &kube::Error) -> Reached {
    match err {
        kube::Error::Api(status) if status.code == 409 || status.code == 422 => Reached::Conflict,
        kube::Error::Api(_) => Reached::Answered,
        kube::Error::HyperError(_) | kube::Error::Service(_) => Reached::Nowhere,
        _ => Reached::Answered,
    }
}

impl SyncError {
    /// Wraps a client error with what was being done (which names the
    /// object and the field).
    pub fn kube(what: impl fmt::Display, source: kube::Error) -> Self {
        let what = what.to_string();
        match reached(&source) {
            Reached::Conflict => SyncError::Conflict { what, source },
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

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({"code": code, "message": "m"})).unwrap(),
        ))
    }

    #[test]
    fn classification() {
        let rows = [
            (api(409), Reached::Conflict),
            (api(422), Reached::Conflict),
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
    }
}
