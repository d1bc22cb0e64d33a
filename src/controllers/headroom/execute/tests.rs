//! Request-level tests of headroom's writes: a mock API server (tower-test)
//! sees every request of a sync, in order, and the tests pin method, path,
//! query and body.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

use crate::controllers::headroom::controller::{Controller, Placeholders, Settings, Stores};
use crate::controllers::headroom::operator_compat::seed::SeedWatermarkView;
use crate::controllers::headroom::watermarks::watermark::WatermarkView;
use crate::model::features::FeatureGates;
use crate::model::views::{DeviceStores, NodeView, PodView};
use crate::naming::{PLACEHOLDER_GATE, WATERMARK_ENTRY_LABEL, WATERMARK_LABEL};
use crate::runtime::reachability::Reachability;
use crate::runtime::shared::WatchesSynced;
use crate::runtime::store::Store;

type Handle = mock::Handle<Request<Body>, Response<Body>>;

const KEY: &str = "headroom/pool";

fn controller() -> (Arc<Controller>, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let controller = Controller::new(
        kube::Client::new(service, "default"),
        &prometheus::Registry::new(),
        Settings {
            yield_enabled: true,
            seed_watermarks: true,
            capacity_buffers: false,
            health: crate::runtime::http::Health::default(),
            gates: FeatureGates::default(),
        },
        Stores {
            devices: DeviceStores::default(),
            claims: Arc::new(Store::new(Vec::new())),
            claim_pods: Arc::new(Store::new(Vec::new())),
            synced: WatchesSynced::default(),
        },
        "test",
        Arc::new(Reachability::new()),
    )
    .unwrap();
    let wm: WatermarkView = serde_json::from_value(json!({
        "metadata": {"name": "pool", "namespace": "headroom", "uid": "wm-uid", "generation": 1},
        "spec": {"watermarkPercentage": 100, "nodeSelector": {"pool": "gpu"},
                 "pausePodSize": {"cpu": "1", "memory": "1Gi"}},
    }))
    .unwrap();
    controller.watermarks.apply(KEY.into(), Arc::new(wm));
    let node: NodeView =
        serde_json::from_value(json!({"metadata": {"name": "gpu-1", "labels": {"pool": "gpu"}}}))
            .unwrap();
    controller
        .devices
        .nodes
        .apply("gpu-1".into(), Arc::new(node));
    (controller, handle)
}

fn add_pod(controller: &Controller, pod: Value) {
    let pod: PodView = serde_json::from_value(pod).unwrap();
    let key = format!("{}/{}", pod.namespace(), pod.name());
    controller.pods.apply(key, Arc::new(pod));
}

/// One request as the mock saw it: method, path and query, body.
async fn expect(handle: &mut Handle, status: u16, answer: Value) -> (Method, String, Value) {
    let (request, send) = handle.next_request().await.expect("a request");
    let (parts, body) = request.into_parts();
    let bytes = body.collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    send.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&answer).unwrap()))
            .unwrap(),
    );
    (parts.method, parts.uri.to_string(), body)
}

fn empty_list() -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": []})
}

#[tokio::test]
async fn a_sync_applies_the_deployment_prunes_and_writes_the_status_once() {
    let (controller, mut handle) = controller();
    add_pod(
        &controller,
        json!({"metadata": {"name": "job", "namespace": "team", "uid": "u-job"},
               "spec": {"nodeName": "gpu-1", "containers": [{"resources": {"requests": {"cpu": "1500m"}}}]},
               "status": {"phase": "Running"}}),
    );
    let sync = tokio::spawn({
        let controller = controller.clone();
        async move { controller.sync(KEY).await }
    });

    let (method, uri, body) = expect(&mut handle, 200, json!({})).await;
    assert_eq!(method, Method::PATCH);
    assert_eq!(
        uri,
        "/apis/apps/v1/namespaces/headroom/deployments/pool-cpu?&force=true&fieldManager=dra-claim-controller-headroom"
    );
    assert_eq!(body["kind"], "Deployment");
    assert_eq!(
        body["spec"]["replicas"], 2,
        "1.5 CPU at 100 % in 1-CPU placeholders"
    );
    assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "wm-uid");

    // The entries differ from what was written before (nothing): the
    // objects of entries that are gone are looked for, by label.
    for resource in [
        "/apis/apps/v1/namespaces/headroom/deployments",
        "/apis/resource.k8s.io/v1/namespaces/headroom/resourceclaimtemplates",
    ] {
        let (method, uri, _) = expect(&mut handle, 200, empty_list()).await;
        assert_eq!(method, Method::GET);
        assert!(uri.starts_with(resource), "{uri}");
        assert!(
            uri.contains("labelSelector=dra-claim-controller.io%2Fwatermark%3Dpool"),
            "{uri}"
        );
    }

    let answer = json!({"metadata": {"name": "pool", "namespace": "headroom"}, "spec": {}});
    let (method, uri, body) = expect(&mut handle, 200, answer).await;
    assert_eq!(method, Method::PATCH);
    assert_eq!(
        uri,
        "/apis/dra-claim-controller.io/v1alpha1/namespaces/headroom/nodescalingwatermarks/pool/status?"
    );
    assert_eq!(body["status"]["desiredPlaceholders"], 2);
    assert_eq!(body["status"]["observedGeneration"], 1);
    sync.await.unwrap().unwrap();

    // Nothing changed: nothing is written.
    tokio::time::timeout(Duration::from_secs(5), controller.sync(KEY))
        .await
        .expect("an unchanged sync sends no request")
        .unwrap();

    // The watermark goes: nothing is kept for it.
    assert!(controller.written.lock().unwrap().contains_key(KEY));
    controller.forget_watermark("headroom", "pool");
    assert!(controller.written.lock().unwrap().is_empty());
    assert!(controller.yields_unwritten.lock().unwrap().is_empty());
}

#[tokio::test]
async fn gates_are_lifted_by_a_guarded_json_patch() {
    let (controller, mut handle) = controller();
    add_pod(
        &controller,
        json!({"metadata": {"name": "pool-gpu-x", "namespace": "headroom", "uid": "u-p",
                            "labels": {WATERMARK_LABEL: "pool", WATERMARK_ENTRY_LABEL: "gpu"}},
               "spec": {"schedulingGates": [{"name": "example.com/other"}, {"name": PLACEHOLDER_GATE}]},
               "status": {"phase": "Pending"}}),
    );
    let lift = tokio::spawn({
        let controller = controller.clone();
        async move {
            let placeholders = Placeholders::of_key(KEY).unwrap();
            controller.lift_gates(KEY, &placeholders).await
        }
    });
    let (method, uri, body) = expect(&mut handle, 200, json!({})).await;
    assert_eq!(method, Method::PATCH);
    assert_eq!(uri, "/api/v1/namespaces/headroom/pods/pool-gpu-x?");
    assert_eq!(
        body,
        json!([
            {"op": "test", "path": "/spec/schedulingGates/1/name", "value": PLACEHOLDER_GATE},
            {"op": "remove", "path": "/spec/schedulingGates/1"},
        ])
    );
    lift.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_seed_watermark_gets_the_seeds_deployment_and_conditions() {
    let (controller, mut handle) = controller();
    let wm: SeedWatermarkView = serde_json::from_value(json!({
        "metadata": {"name": "us-west-2a", "namespace": "headroom", "uid": "seed-uid", "generation": 2},
        "spec": {"watermarkPercentage": 20, "nodeSelector": {"pool": "gpu"}},
    }))
    .unwrap();
    controller
        .seed_watermarks
        .apply("headroom/us-west-2a".into(), Arc::new(wm));
    add_pod(
        &controller,
        json!({"metadata": {"name": "job", "namespace": "team", "uid": "u-job"},
               "spec": {"nodeName": "gpu-1", "containers": [{"resources": {"requests": {"cpu": "3"}}}]},
               "status": {"phase": "Running"}}),
    );
    let sync = tokio::spawn({
        let controller = controller.clone();
        async move { controller.sync("seed:headroom/us-west-2a").await }
    });
    let (method, uri, body) = expect(&mut handle, 200, json!({})).await;
    assert_eq!(method, Method::PATCH);
    assert_eq!(
        uri,
        "/apis/apps/v1/namespaces/headroom/deployments/us-west-2a?&force=true&fieldManager=dra-claim-controller-headroom"
    );
    assert_eq!(
        body["spec"]["replicas"], 2,
        "3 CPU × 20 % / 200m, truncated as the seed does"
    );
    assert_eq!(
        body["spec"]["template"]["metadata"]["labels"]["watermark"],
        "us-west-2a"
    );
    let answer = json!({"metadata": {"name": "us-west-2a", "namespace": "headroom"}, "spec": {}});
    let (method, uri, body) = expect(&mut handle, 200, answer).await;
    assert_eq!(method, Method::PATCH);
    assert_eq!(
        uri,
        "/apis/redhatcop.redhat.io/v1alpha1/namespaces/headroom/nodescalingwatermarks/us-west-2a/status?"
    );
    let condition = &body["status"]["conditions"][0];
    assert_eq!(condition["type"], "ReconcileSuccess");
    assert_eq!(condition["reason"], "LastReconcileCycleSucceded");
    assert_eq!(condition["observedGeneration"], 2);
    sync.await.unwrap().unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        controller.sync("seed:headroom/us-west-2a"),
    )
    .await
    .expect("an unchanged sync sends no request")
    .unwrap();
}

/// One rule for "a placeholder of ours": by namespace, placeholder label
/// and whether the door is a buffer; a watermark named like a buffer's
/// label does not claim the buffer's placeholders, nor the other way.
#[test]
fn each_door_holds_only_its_own_placeholders() {
    let pod = |labels: Value| -> PodView {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "headroom",
                                                    "labels": labels}}))
        .unwrap()
    };
    let buffer_pod =
        pod(json!({WATERMARK_LABEL: "cb.trainers", WATERMARK_ENTRY_LABEL: "capacitybuffer"}));
    let watermark_pod = pod(json!({WATERMARK_LABEL: "cb.trainers", WATERMARK_ENTRY_LABEL: "gpu"}));
    let buffer = Placeholders::of_key("buffer:headroom/trainers").unwrap();
    let watermark = Placeholders::of_key("headroom/cb.trainers").unwrap();
    assert!(buffer.holds(&buffer_pod));
    assert!(!buffer.holds(&watermark_pod));
    assert!(watermark.holds(&watermark_pod));
    assert!(!watermark.holds(&buffer_pod));
    let elsewhere = Placeholders::of_key("buffer:other/trainers").unwrap();
    assert!(!elsewhere.holds(&buffer_pod), "another namespace");
    assert_eq!(Placeholders::of_key("seed:headroom/x"), None);
    assert_eq!(Placeholders::of_key("pod:headroom/x"), None);
}
