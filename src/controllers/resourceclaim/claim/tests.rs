//! Request-level tests of `execute`: a mock API server (tower-test) sees
//! every request, in order, and the tests pin method, path, query and body,
//! so a change in what goes over the wire shows up here first.

use std::sync::Arc;

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

use super::super::cache::Caches;
use super::super::context::Context;
use super::super::metrics::{ControllerMetrics, MetricsNaming};
use super::super::{claim, pod};
use crate::model::consumers::DELETE_PROTECTION_FINALIZER;
use crate::model::features::FeatureGates;
use crate::model::views::{ClaimView, PodView, TemplateView};
use crate::naming::POD_CLAIM_NAME_ANNOTATION;
use crate::runtime::controller::Action;
use crate::runtime::events::EventRecorder;
use crate::runtime::reachability::Reachability;
use crate::runtime::store::object_key;

type Handle = mock::Handle<Request<Body>, Response<Body>>;

fn context(caches: Arc<Caches>) -> (Context, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let registry = prometheus::Registry::new();
    let ctx = Context {
        client: kube::Client::new(service, "default"),
        metrics: ControllerMetrics::register(&registry, caches.clone(), MetricsNaming::Both)
            .unwrap(),
        caches,
        gates: FeatureGates::default(),
        events: EventRecorder::disabled(),
        reachability: Arc::new(Reachability::new()),
    };
    (ctx, handle)
}

/// One request as the mock saw it.
#[derive(Debug)]
struct Seen {
    method: Method,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

/// Takes the next request and answers it with `status` and `answer`.
async fn expect(handle: &mut Handle, status: u16, answer: Value) -> Seen {
    let (request, send) = handle.next_request().await.expect("a request");
    let (parts, body) = request.into_parts();
    let bytes = body.collect_bytes().await.unwrap();
    let seen = Seen {
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or_default().to_string(),
        content_type: parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default(),
        body: if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        },
    };
    let response = Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(&answer).unwrap()))
        .unwrap();
    send.send_response(response);
    seen
}

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims";

fn pod_json(phase: &str) -> Value {
    json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {"phase": phase, "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c"}]}
    })
}

fn claim_json(reserved: bool) -> Value {
    let mut claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid", "resourceVersion": "7",
            "finalizers": [DELETE_PROTECTION_FINALIZER],
            "annotations": {POD_CLAIM_NAME_ANNOTATION: "gpu"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-uid", "controller": true}]},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": []}}}
    });
    if reserved {
        claim["status"]["reservedFor"] =
            json!([{"resource": "pods", "name": "p", "uid": "pod-uid"}]);
    }
    claim
}

/// A context whose cache has pod `p` done, and `p`'s claim as still
/// reserved for it.
fn claim_of_done_pod() -> (Context, Handle, ClaimView) {
    let caches = Arc::new(Caches::new());
    let done: PodView = serde_json::from_value(pod_json("Succeeded")).unwrap();
    caches.pods.apply(object_key("ns", "p"), Arc::new(done));
    let seen: ClaimView = serde_json::from_value(claim_json(true)).unwrap();
    let (ctx, handle) = context(caches);
    (ctx, handle, seen)
}

/// The claim of a pod that is done: two requests. A delete with UID and
/// resourceVersion preconditions (the finalizer holds the object back, the
/// answer is the terminating claim), then the finalizer removed from that
/// answer, guarded by its version: no separate deallocation write.
#[tokio::test]
async fn claim_of_a_done_pod_is_deleted_then_released() {
    let (ctx, mut handle, seen) = claim_of_done_pod();

    let work = tokio::spawn(async move { claim::execute(&ctx, &seen).await });

    let mut terminating = claim_json(true);
    terminating["metadata"]["resourceVersion"] = json!("8");
    terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let delete = expect(&mut handle, 200, terminating.clone()).await;
    assert_eq!(
        (delete.method, delete.path.as_str()),
        (Method::DELETE, format!("{CLAIMS}/c").as_str())
    );
    assert_eq!(
        delete.body["preconditions"],
        json!({"uid": "claim-uid", "resourceVersion": "7"})
    );

    let mut gone = terminating.clone();
    gone["metadata"]["finalizers"] = json!([]);
    let finalizer = expect(&mut handle, 200, gone).await;
    assert_eq!(
        (finalizer.method, finalizer.path.as_str()),
        (Method::PATCH, format!("{CLAIMS}/c").as_str())
    );
    assert_eq!(finalizer.content_type, "application/json-patch+json");
    assert_eq!(
        finalizer.body,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "8"},
            {"op": "test", "path": "/metadata/finalizers", "value": [DELETE_PROTECTION_FINALIZER]},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ])
    );

    work.await.unwrap().expect("claim work succeeds");
}

/// While another pod waits to be scheduled, the claim of a done pod goes in
/// the reference's order: reservation and allocation cleared (the write
/// kube-scheduler retries waiting pods on), the finalizer, then the delete.
#[tokio::test]
async fn claim_of_a_done_pod_while_a_pod_waits_is_deallocated_first() {
    let (ctx, mut handle, seen) = claim_of_done_pod();
    let mut waiting = pod_json("Pending");
    waiting["metadata"]["name"] = json!("q");
    waiting["metadata"]["uid"] = json!("q-uid");
    let waiting: PodView = serde_json::from_value(waiting).unwrap();
    ctx.caches
        .pods
        .apply(object_key("ns", "q"), Arc::new(waiting));

    let work = tokio::spawn(async move { claim::execute(&ctx, &seen).await });

    let mut released = claim_json(false);
    released["status"] = json!({});
    released["metadata"]["resourceVersion"] = json!("8");
    let status = expect(&mut handle, 200, released.clone()).await;
    assert_eq!(
        (status.method, status.path.as_str()),
        (Method::PATCH, format!("{CLAIMS}/c/status").as_str())
    );
    let mut unprotected = released.clone();
    unprotected["metadata"]["finalizers"] = json!([]);
    unprotected["metadata"]["resourceVersion"] = json!("9");
    let finalizer = expect(&mut handle, 200, unprotected).await;
    assert_eq!(
        (finalizer.method, finalizer.path.as_str()),
        (Method::PATCH, format!("{CLAIMS}/c").as_str())
    );
    let delete = expect(
        &mut handle,
        200,
        json!({"kind": "Status", "status": "Success"}),
    )
    .await;
    assert_eq!(delete.method, Method::DELETE);
    assert_eq!(
        delete.body["preconditions"],
        json!({"uid": "claim-uid", "resourceVersion": "9"})
    );
    work.await.unwrap().expect("claim work succeeds");
}

/// A JSON patch of the claim's metadata whose first operation tests the
/// resourceVersion `rv`.
fn assert_metadata_patch_guarded_by(seen: &Seen, rv: &str) {
    assert_eq!(
        (&seen.method, seen.path.as_str()),
        (&Method::PATCH, format!("{CLAIMS}/c").as_str())
    );
    assert_eq!(
        seen.body[0],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv})
    );
}

/// A claim no pod owns (a user's claim that stays), in `claim_json`'s
/// shape otherwise.
fn unowned_claim_json(reserved: bool) -> Value {
    let mut claim = claim_json(reserved);
    claim["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    claim
}

type Work = tokio::task::JoinHandle<Result<(), crate::runtime::error::SyncError>>;

/// Claim work started on an unowned claim still reserved for pod `p`,
/// which the cache has done; the claim as the work saw it.
fn claim_that_stays_at_work() -> (Handle, Work, Value) {
    let caches = Arc::new(Caches::new());
    let done: PodView = serde_json::from_value(pod_json("Succeeded")).unwrap();
    caches.pods.apply(object_key("ns", "p"), Arc::new(done));
    let shared = unowned_claim_json(true);
    let seen: ClaimView = serde_json::from_value(shared.clone()).unwrap();
    let (ctx, handle) = context(caches);
    let work = tokio::spawn(async move { claim::execute(&ctx, &seen).await });
    (handle, work, shared)
}

/// A claim that is not generated (no owning pod) keeps the reference's
/// order: reservation and allocation removed in one guarded status patch,
/// then the finalizer; it is not deleted.
#[tokio::test]
async fn claim_that_stays_is_deallocated_then_released() {
    let (mut handle, work, shared) = claim_that_stays_at_work();

    let mut released = shared.clone();
    released["status"] = json!({});
    released["metadata"]["resourceVersion"] = json!("8");
    let status = expect(&mut handle, 200, released.clone()).await;
    assert_eq!(
        (status.method, status.path.as_str()),
        (Method::PATCH, format!("{CLAIMS}/c/status").as_str())
    );
    assert_eq!(
        status.body,
        json!([
            {"op": "test", "path": "/status/reservedFor",
             "value": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]},
            {"op": "remove", "path": "/status/reservedFor"},
            {"op": "remove", "path": "/status/allocation"},
        ])
    );
    let mut unprotected = released.clone();
    unprotected["metadata"]["finalizers"] = json!([]);
    let finalizer = expect(&mut handle, 200, unprotected).await;
    assert_metadata_patch_guarded_by(&finalizer, "8");
    work.await.unwrap().expect("claim work succeeds");
    assert!(
        handle.next_request().await.is_none(),
        "no delete for a claim that is not generated"
    );
}

/// A precondition that fails (409: the claim changed since it was read)
/// ends the sync with a conflict, and nothing else is sent.
#[tokio::test]
async fn failed_guard_is_a_conflict_and_stops_the_sync() {
    let (ctx, mut handle, seen) = claim_of_done_pod();

    let work = tokio::spawn(async move { claim::execute(&ctx, &seen).await });
    let changed = json!({"kind": "Status", "status": "Failure", "code": 409,
        "reason": "Conflict", "message": "Precondition failed: ResourceVersion in precondition: 7, ResourceVersion in object meta: 9"});
    let delete = expect(&mut handle, 409, changed).await;
    assert_eq!(delete.method, Method::DELETE);
    ends_as_conflict_sending_nothing_more(handle, work).await;
}

/// The sync ends with a conflict, and sends no further request. Another
/// request would wait for an answer forever, so the sync must end on its
/// own; once it has, the client is gone and the mock reports no request
/// (or none arrives).
async fn ends_as_conflict_sending_nothing_more(mut handle: Handle, work: Work) {
    let result = tokio::time::timeout(std::time::Duration::from_secs(2), work)
        .await
        .expect("the sync ends, sending nothing more")
        .unwrap();
    assert!(
        matches!(
            result,
            Err(crate::runtime::error::SyncError::Conflict { .. })
        ),
        "{result:?}"
    );
    let next =
        tokio::time::timeout(std::time::Duration::from_millis(100), handle.next_request()).await;
    assert!(
        matches!(next, Err(_) | Ok(None)),
        "no request after the sync"
    );
}

/// The claim that stays, released by a status patch; its finalizer write
/// meets a claim someone annotated in between. The answer is what
/// kube-apiserver sends for a failed JSON Patch `test`.
async fn release_meets_a_write_in_between(fresh: Value) -> (Handle, Work) {
    let (mut handle, work, shared) = claim_that_stays_at_work();

    let mut released = shared;
    released["status"] = json!({});
    released["metadata"]["resourceVersion"] = json!("8");
    expect(&mut handle, 200, released).await;
    let bare_422 = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "the server rejected our request due to an error in our request",
        "reason": "Invalid", "details": {}, "code": 422});
    let first = expect(&mut handle, 422, bare_422).await;
    assert_eq!(
        first.body[0],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": "8"})
    );
    let read = expect(&mut handle, 200, fresh).await;
    assert_eq!(
        (read.method, read.path.as_str()),
        (Method::GET, format!("{CLAIMS}/c").as_str())
    );
    (handle, work)
}

/// Still unused and unallocated when read again: the finalizer is removed
/// from the fresh copy (a later sync could not tell the removal is owed).
#[tokio::test]
async fn finalizer_removal_is_retried_on_a_fresh_read() {
    let mut fresh = unowned_claim_json(false);
    fresh["metadata"]["resourceVersion"] = json!("9");
    fresh["metadata"]["annotations"]["touched"] = json!("yes");
    fresh["status"] = json!({});
    let (mut handle, work) = release_meets_a_write_in_between(fresh.clone()).await;

    let mut unprotected = fresh;
    unprotected["metadata"]["finalizers"] = json!([]);
    let retry = expect(&mut handle, 200, unprotected).await;
    assert_metadata_patch_guarded_by(&retry, "9");
    work.await.unwrap().expect("claim work succeeds");
}

/// Allocated again when read back (the scheduler took it for a new pod):
/// the finalizer stays, and the sync ends as a conflict.
#[tokio::test]
async fn finalizer_stays_on_a_claim_allocated_meanwhile() {
    let mut fresh = unowned_claim_json(false);
    fresh["metadata"]["resourceVersion"] = json!("9");
    fresh["status"]["reservedFor"] = json!([{"resource": "pods", "name": "q", "uid": "q-uid"}]);
    let (handle, work) = release_meets_a_write_in_between(fresh).await;
    ends_as_conflict_sending_nothing_more(handle, work).await;
}

/// A pod whose template entry has no claim yet: one create from the
/// template, then one server-side apply of the pod status as
/// `ResourceClaimController`, forced, carrying every entry.
#[tokio::test]
async fn pod_work_creates_then_records_with_one_apply() {
    let caches = Arc::new(Caches::new());
    let mut pod = pod_json("Pending");
    pod["status"]["resourceClaimStatuses"] = json!([]);
    let pod = PodView::at_first_sight(
        serde_json::from_value(pod).unwrap(),
        std::time::Instant::now(),
    );
    let template: TemplateView = serde_json::from_value(json!({
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}}}
    }))
    .unwrap();
    caches
        .templates
        .apply(object_key("ns", "t"), Arc::new(template));
    let decision = pod::decide(&pod, &caches, FeatureGates::default());
    let (ctx, mut handle) = context(caches);

    let work = tokio::spawn(async move { pod::execute(&ctx, &pod, decision).await });

    let mut created = claim_json(false);
    created["metadata"]["name"] = json!("p-gpu-x7k2q");
    let create = expect(&mut handle, 201, created).await;
    assert_eq!(
        (create.method, create.path.as_str()),
        (Method::POST, CLAIMS)
    );
    assert_eq!(create.body["metadata"]["generateName"], "p-gpu-");
    assert_eq!(
        create.body["spec"],
        json!({"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}})
    );

    let apply = expect(&mut handle, 200, pod_json("Pending")).await;
    assert_eq!(
        (apply.method, apply.path.as_str()),
        (Method::PATCH, "/api/v1/namespaces/ns/pods/p/status")
    );
    assert_eq!(apply.content_type, "application/apply-patch+yaml");
    assert!(
        apply.query.contains("fieldManager=ResourceClaimController")
            && apply.query.contains("force=true"),
        "{}",
        apply.query
    );
    assert_eq!(
        apply.body["metadata"]["uid"], "pod-uid",
        "a pod replaced meanwhile must not get this status"
    );
    assert_eq!(
        apply.body["status"],
        json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x7k2q"}]})
    );

    assert_eq!(
        work.await.unwrap().expect("pod work succeeds"),
        Action::Done
    );
}
