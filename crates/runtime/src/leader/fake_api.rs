//! An in-memory Lease endpoint that answers as the API server does (get,
//! create, replace guarded by resourceVersion, list; a watch that stays
//! open without events), for tests of the election that need no API
//! server. It records every write that went through, so a test can read
//! the renewal rhythm, and lets a test play another candidate.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::client::Body;
use serde_json::json;

/// A write refused: code, reason, message.
type Refusal = (StatusCode, &'static str, &'static str);

/// A write the endpoint accepted.
#[derive(Clone, Debug)]
pub struct Write {
    pub at: Instant,
    pub holder: String,
}

#[derive(Default)]
struct State {
    lease: Option<Lease>,
    resource_version: u64,
    writes: Vec<Write>,
    /// Answer every write with 500 (an API server that reads but cannot
    /// write, e.g. etcd without quorum).
    failing_writes: bool,
}

/// The endpoint; clones share it.
#[derive(Clone, Default)]
pub struct FakeLeaseApi {
    state: Arc<Mutex<State>>,
}

impl FakeLeaseApi {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A client whose every request this endpoint answers.
    pub fn client(&self) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let api = api.clone();
            async move { Ok::<_, Infallible>(api.answer(request).await) }
        });
        kube::Client::new(service, "default")
    }

    /// The writes that went through, oldest first.
    pub fn writes(&self) -> Vec<Write> {
        self.lock().writes.clone()
    }

    /// Who holds the Lease now (empty: released).
    pub fn holder(&self) -> Option<String> {
        let state = self.lock();
        let spec = state.lease.as_ref()?.spec.as_ref()?;
        Some(spec.holder_identity.clone().unwrap_or_default())
    }

    /// Another candidate writes the Lease as its own.
    pub fn take_over(&self, holder: &str, duration_seconds: i32) {
        let mut state = self.lock();
        let mut lease = state.lease.clone().unwrap_or_default();
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(duration_seconds),
            acquire_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            lease_transitions: Some(1),
            ..Default::default()
        });
        state.store(lease);
    }

    /// Makes every later write fail with 500 (or succeed again).
    pub fn set_failing_writes(&self, failing: bool) {
        self.lock().failing_writes = failing;
    }

    async fn answer(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_owned();
        let query = parts.uri.query().unwrap_or_default().to_owned();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default();
        // /apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let named = match segments.as_slice() {
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                _,
                "leases",
            ] => None,
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                _,
                "leases",
                name,
            ] => Some((*name).to_owned()),
            _ => return status(StatusCode::NOT_FOUND, "NotFound", &path),
        };
        match (parts.method, named) {
            (Method::GET, None) if query.contains("watch=true") => {
                // Open without events: the election reads and writes itself.
                std::future::pending().await
            }
            (Method::GET, None) => {
                let state = self.lock();
                let items: Vec<&Lease> = state.lease.iter().collect();
                ok(json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                    "metadata": {"resourceVersion": state.resource_version.to_string()},
                    "items": items,
                }))
            }
            (Method::GET, Some(name)) => match &self.lock().lease {
                Some(lease) => ok(json!(lease)),
                None => status(StatusCode::NOT_FOUND, "NotFound", &name),
            },
            (Method::POST, None) => self.write(&body, |state, _| {
                if state.lease.is_some() {
                    return Err((StatusCode::CONFLICT, "AlreadyExists", "lease"));
                }
                Ok(StatusCode::CREATED)
            }),
            (Method::PUT, Some(_)) => self.write(&body, |state, sent| {
                let current = state
                    .lease
                    .as_ref()
                    .and_then(|l| l.metadata.resource_version.clone());
                match current {
                    None => Err((StatusCode::NOT_FOUND, "NotFound", "lease")),
                    Some(rv) if Some(&rv) != sent.metadata.resource_version.as_ref() => Err((
                        StatusCode::CONFLICT,
                        "Conflict",
                        "the object has been modified",
                    )),
                    Some(_) => Ok(StatusCode::OK),
                }
            }),
            (method, _) => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                method.as_str(),
            ),
        }
    }

    /// Stores the Lease in `body` if `allowed` says so, as one step.
    fn write(
        &self,
        body: &[u8],
        allowed: impl FnOnce(&State, &Lease) -> Result<StatusCode, Refusal>,
    ) -> Response<Body> {
        let Ok(sent) = serde_json::from_slice::<Lease>(body) else {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "not a Lease");
        };
        let mut state = self.lock();
        if state.failing_writes {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "etcd unavailable",
            );
        }
        let code = match allowed(&state, &sent) {
            Ok(code) => code,
            Err((code, reason, message)) => return status(code, reason, message),
        };
        let holder = sent
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        let stored = state.store(sent);
        state.writes.push(Write {
            at: Instant::now(),
            holder,
        });
        answer(code, json!(stored))
    }
}

impl State {
    fn store(&mut self, mut lease: Lease) -> Lease {
        self.resource_version += 1;
        lease.metadata.resource_version = Some(self.resource_version.to_string());
        self.lease = Some(lease.clone());
        lease
    }
}

fn ok(body: serde_json::Value) -> Response<Body> {
    answer(StatusCode::OK, body)
}

fn answer(code: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
    *response.status_mut() = code;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    answer(
        code,
        json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
               "reason": reason, "message": message, "code": code.as_u16()}),
    )
}
