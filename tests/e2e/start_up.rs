//! How the controller reads its first lists: streaming lists where the API
//! server serves them (one request per resource, no whole list held at
//! once on either side), pages where it does not, and ready either way;
//! pods in protobuf, read exactly as from JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use dra_claim_controller::model::views::PodView;
use dra_claim_controller::naming::{
    PLACEHOLDER_GATE, SEED_PLACEHOLDER_LABEL, WATERMARK_ENTRY_LABEL, WATERMARK_LABEL,
};
use dra_claim_controller::runtime::protobuf;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent};
use serde_json::json;

use crate::cluster::{ControllerOpts, etcd_serves_progress_requests};
use crate::ctx::TestCtx;
use crate::fault_proxy::FaultPlan;
use crate::faults_api::controller_behind_proxy;
use crate::k8s::Source;

/// The claim controller's three watches, by the path of their requests.
const CLAIM_WATCHES: [&str; 3] = [
    "/api/v1/pods",
    "/apis/resource.k8s.io/v1/resourceclaims",
    "/apis/resource.k8s.io/v1/resourceclaimtemplates",
];

/// A pod waiting before the controller starts gets its claim once the
/// first lists are in, whichever way they were read; the way is the one
/// the server serves: streaming on an etcd that answers watch progress
/// requests (kube-apiserver needs them for `sendInitialEvents`), otherwise
/// one refused streaming attempt per watch and pages from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_lists_stream_where_the_server_serves_them() {
    const NAME: &str = "first_lists_stream_where_the_server_serves_them";
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let etcd = t.isolated_env().cluster.etcd_version().await.unwrap();
    let streams = etcd_serves_progress_requests(&etcd);
    t.create_template("gpu-template").await;
    t.create_pod("early", &[("gpu", Source::Template("gpu-template"))], None)
        .await;

    let proxy = controller_behind_proxy(&mut t, FaultPlan::default()).await;
    t.wait_recorded("early", &["gpu"]).await;

    let reads = proxy.list_reads();
    println!("START-UP: {NAME}: etcd {etcd}, list reads {reads:?}");
    for path in CLAIM_WATCHES {
        let of_path: Vec<bool> = reads
            .iter()
            .filter(|r| r.path == path)
            .map(|r| r.streaming)
            .collect();
        if streams {
            assert_eq!(
                of_path,
                [true],
                "{path}: one streaming list, no pages (etcd {etcd})"
            );
        } else {
            assert!(
                of_path.first() == Some(&true)
                    && of_path[1..].iter().all(|s| !s)
                    && of_path.len() >= 2,
                "{path}: one streaming attempt, then pages (etcd {etcd}): {of_path:?}"
            );
        }
    }
    t.finish();
}

/// The pod view read from the API server's protobuf equals the one read
/// from its JSON, field for field, for pods that fill every field the
/// view keeps: claim entries of both kinds, claim statuses, the node, the
/// scheduled and disruption-target conditions, terminated and running
/// containers, labels kept and dropped, a deletion in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_read_from_protobuf_equal_pods_read_from_json() {
    const NAME: &str = "pods_read_from_protobuf_equal_pods_read_from_json";
    // No controller: nothing may change the pods between the two reads.
    let Some(t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let pods = t.pods();
    let mut finished = crate::k8s::pod_manifest(
        "finished",
        &[
            ("gpu", Source::Template("gpu-template")),
            ("shared", Source::Claim("shared-claim")),
        ],
        Some("node-1"),
    );
    finished["metadata"]["labels"] = json!({WATERMARK_LABEL: "wm-1", "app": "dropped"});
    let mut held =
        crate::k8s::pod_manifest("held", &[("gpu", Source::Template("gpu-template"))], None);
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    let bound =
        crate::k8s::pod_manifest("bound", &[("gpu", Source::Template("gpu-template"))], None);
    // What headroom reads: requests of every kind (main, init, sidecar,
    // pod-level), the placeholder gate among others, placeholder labels.
    let mut plain = crate::k8s::pod_manifest("plain", &[], None);
    plain["metadata"]["labels"] = json!({
        WATERMARK_LABEL: "wm-1",
        WATERMARK_ENTRY_LABEL: "gpu",
        SEED_PLACEHOLDER_LABEL: "",
    });
    plain["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "250m", "memory": "64Mi", "example.com/gpu": "2"}, "limits": {"example.com/gpu": "2"}});
    plain["spec"]["initContainers"] = json!([
        {"name": "side", "image": "registry.invalid/pause:1", "restartPolicy": "Always",
         "resources": {"requests": {"cpu": "100m"}}},
        {"name": "init", "image": "registry.invalid/pause:1", "resources": {"requests": {"memory": "1Gi"}}},
    ]);
    plain["spec"]["schedulingGates"] = json!([
        {"name": "example.com/other"},
        {"name": PLACEHOLDER_GATE},
    ]);
    for manifest in [finished, held, bound, plain] {
        let pod: Pod = serde_json::from_value(manifest).unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    // Placed as a scheduler places a pod: nobody owns its nodeName.
    crate::k8s::bind_pod(&pods, "bound", "node-2")
        .await
        .unwrap();
    let container = |state: serde_json::Value| {
        json!([{"name": "main", "image": "registry.invalid/pause:1", "imageID": "", "ready": false,
                "restartCount": 0, "state": state}])
    };
    let terminated = json!({"terminated": {"exitCode": 0, "startedAt": "2026-11-25T10:00:00Z",
                                           "finishedAt": "2026-11-25T10:05:07Z"}});
    let statuses = [
        (
            "finished",
            json!({"phase": "Succeeded",
                   "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
                   "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "finished-gpu-x7k2p"}],
                   "containerStatuses": container(terminated)}),
        ),
        (
            "held",
            json!({"phase": "Running",
                   "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                                   "message": "Eviction API: evicting", "lastTransitionTime": "2026-11-25T10:06:00Z"}],
                   "containerStatuses": container(json!({"running": {"startedAt": "2026-11-25T10:00:00Z"}}))}),
        ),
        (
            "plain",
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}),
        ),
    ];
    for (name, status) in statuses {
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
    }
    pods.delete("held", &DeleteParams::default()).await.unwrap();

    let as_json: BTreeMap<String, PodView> = Api::<PodView>::namespaced(t.client.clone(), &t.ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect();

    // A watch from "any" version: every pod as it is, as ADDED (or, should
    // the watch cache still be catching up, MODIFIED) events, until the
    // server ends the watch. Unlike a streaming list it needs nothing of
    // etcd, so this runs on any test bed.
    let request = http::Request::get(format!(
        "/api/v1/namespaces/{}/pods?watch=true&resourceVersion=0&timeoutSeconds=3",
        t.ns
    ))
    .header(http::header::ACCEPT, protobuf::ACCEPT)
    .body(kube::client::Body::empty())
    .unwrap();
    let response = t.client.send(request).await.unwrap();
    assert!(
        protobuf::is_protobuf(&response),
        "answered in {:?}",
        response.headers()
    );
    let mut events = protobuf::events::<PodView>(response.into_body());
    let mut as_protobuf = BTreeMap::new();
    while let Some(event) = events.next().await {
        match event.unwrap() {
            WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                as_protobuf.insert(pod.metadata.name.clone().unwrap(), pod);
            }
            other => panic!("unexpected event {other:?}"),
        }
    }

    assert_eq!(as_json.len(), 4);
    assert_eq!(
        format!("{as_protobuf:#?}"),
        format!("{as_json:#?}"),
        "the same pods read from protobuf and from JSON"
    );
    // The comparison covers real values, not two empty views.
    let finished = &as_protobuf["finished"];
    assert_eq!(finished.spec.node_name.as_deref(), Some("node-1"));
    assert_eq!(finished.spec.resource_claims.len(), 2);
    assert_eq!(finished.status.resource_claim_statuses.len(), 1);
    assert!(finished.status.conditions.scheduling.scheduled);
    assert!(finished.status.containers_finished_at.is_some());
    assert_eq!(
        finished.metadata.labels,
        Some([(WATERMARK_LABEL.to_string(), "wm-1".to_string())].into())
    );
    // Created with its node: its creator owns spec.nodeName; bound
    // through pods/binding: nobody does (both read alike above).
    assert!(finished.node_name_written);
    let bound = &as_protobuf["bound"];
    assert_eq!(bound.spec.node_name.as_deref(), Some("node-2"));
    assert!(bound.status.conditions.scheduling.scheduled && !bound.node_name_written);
    let plain = &as_protobuf["plain"];
    assert!(plain.status.conditions.scheduling.unschedulable);
    assert_eq!(plain.spec.placeholder_gate, Some(1));
    assert!(plain.is_seed_placeholder() && plain.placeholder_entry() == Some("gpu"));
    let effective = plain.requests().effective();
    let quantity = |q: &str| dra_claim_controller::allocate::quantity::Quantity::parse(q).unwrap();
    assert_eq!(effective.get("cpu"), Some(&quantity("350m")));
    assert_eq!(effective.get("memory"), Some(&quantity("1Gi")));
    assert_eq!(effective.get("example.com/gpu"), Some(&quantity("2")));
    let held = &as_protobuf["held"];
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(held.status.containers_finished_at.is_none());
    assert_eq!(held.status.phase.as_deref(), Some("Running"));
    let target = held.status.conditions.disruption_target.as_deref();
    assert_eq!(
        target.map(|c| (c.status.as_str(), c.reason.as_deref())),
        Some(("True", Some("EvictionByEvictionAPI")))
    );
    assert!(target.is_some_and(|c| c.last_transition_time.is_some()));

    // Let the held pod go, so the namespace can.
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    t.finish();
}

/// One watch per resource kind for the whole process: with the claim
/// controller, the allocator and headroom all on, each kind is listed once
/// and watched once at start-up, as the API server's audit log of list and
/// watch requests shows. (A (re)list is a streaming list, or a paged list
/// where the server refuses those: at most one of each per kind.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_resource_kind_is_listed_and_watched_once() {
    const NAME: &str = "each_resource_kind_is_listed_and_watched_once";
    let apiserver = crate::cluster::ApiserverOptions {
        audit_list_watch: true,
        ..Default::default()
    };
    let opts = ControllerOpts {
        extra_args: vec![
            "--controllers=resourceclaim,headroom".into(),
            "--allocate-on-nodes=dra.example.com/pre-scheduled=true".into(),
        ],
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated_with(NAME, opts, 0, &apiserver).await else {
        return;
    };
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    crate::headroom::install_crd(&admin).await;
    let audit_log = t.isolated_env().cluster.audit_log();
    t.isolated_env().start_controller().await.unwrap();

    let expected = [
        "pods",
        "resourceclaims",
        "resourceclaimtemplates",
        "resourceslices",
        "deviceclasses",
        "nodes",
        "nodescalingwatermarks",
    ];
    let requests = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&audit_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| {
                e["userAgent"]
                    .as_str()
                    .is_some_and(|ua| ua.starts_with("dra-claim-controller/"))
            })
            .collect()
    };
    let kind_of = |e: &serde_json::Value| e["objectRef"]["resource"].as_str().map(str::to_string);
    let query = |e: &serde_json::Value, key: &str| -> Option<String> {
        let uri = e["requestURI"].as_str()?;
        let (_, query) = uri.split_once('?')?;
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_string))
    };
    // A one-object probe (`limit=1`: is the CRD installed, does the node
    // selector parse) caches nothing.
    let is_probe = |e: &serde_json::Value| query(e, "limit").as_deref() == Some("1");
    let is_stream_list = |e: &serde_json::Value| {
        e["verb"] == "watch" && query(e, "sendInitialEvents").as_deref() == Some("true")
    };
    let is_page_list = |e: &serde_json::Value| e["verb"] == "list" && !is_probe(e);
    let is_follow = |e: &serde_json::Value| e["verb"] == "watch" && !is_stream_list(e);
    crate::k8s::wait_for("every kind listed", Duration::from_secs(60), async || {
        let listed: std::collections::BTreeSet<String> = requests()
            .iter()
            .filter(|e| is_stream_list(e) || is_page_list(e))
            .filter_map(kind_of)
            .collect();
        let missing: Vec<&str> = expected
            .iter()
            .filter(|k| !listed.contains(**k))
            .copied()
            .collect();
        anyhow::ensure!(missing.is_empty(), "not listed yet: {missing:?}");
        Ok(())
    })
    .await;
    // Every watch follows its list at once; a second informer of a kind
    // would have listed and watched by now too. Re-watches come only after
    // the 8 s server timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = requests();
    let mut counts: BTreeMap<String, [usize; 3]> = BTreeMap::new();
    for e in &seen {
        let Some(kind) = kind_of(e) else { continue };
        let slot = counts.entry(kind).or_default();
        if is_stream_list(e) {
            slot[0] += 1;
        } else if is_page_list(e) {
            slot[1] += 1;
        } else if is_follow(e) {
            slot[2] += 1;
        }
    }
    eprintln!("{NAME}: [streaming lists, paged lists, watches] per kind: {counts:?}");
    for (kind, [stream, pages, follows]) in &counts {
        assert!(
            *stream <= 1 && *pages <= 1 && stream + pages >= 1,
            "{kind} listed more than once (or never): {stream} streaming, {pages} paged"
        );
        assert!(*follows <= 1, "{kind} watched {follows} times");
    }
    for kind in expected {
        assert!(counts.contains_key(kind), "{kind} never listed");
    }
    t.finish();
}

/// A kubeconfig's `proxy-url` is honoured as kubectl honours it: the
/// controller and the kubectl plugin reach the API server through an HTTP
/// proxy (CONNECT), and do their work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_is_reached_through_an_http_proxy() {
    through_a_proxy(
        "the_api_server_is_reached_through_an_http_proxy",
        crate::forward_proxy::Kind::HttpConnect,
    )
    .await;
}

/// The same through a SOCKS5 proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_is_reached_through_a_socks5_proxy() {
    through_a_proxy(
        "the_api_server_is_reached_through_a_socks5_proxy",
        crate::forward_proxy::Kind::Socks5,
    )
    .await;
}

async fn through_a_proxy(name: &'static str, kind: crate::forward_proxy::Kind) {
    use crate::forward_proxy::ForwardProxy;
    let Some(mut t) = TestCtx::isolated(name, ControllerOpts::default(), 0).await else {
        return;
    };
    let proxy = ForwardProxy::start(kind).await.unwrap();
    let cluster = &t.isolated_env().cluster;
    let (controller_kc, admin_kc) = (
        cluster.controller_kubeconfig.clone(),
        cluster.admin_kubeconfig.clone(),
    );
    let via_proxy = proxy
        .write_kubeconfig(&controller_kc, &cluster.dir.join("via-proxy.kubeconfig"))
        .unwrap();
    let admin_via_proxy = proxy
        .write_kubeconfig(&admin_kc, &cluster.dir.join("admin-via-proxy.kubeconfig"))
        .unwrap();
    t.isolated_env()
        .start_controller_with_kubeconfig(&via_proxy)
        .await
        .expect("the controller starts through the proxy");
    t.create_template("gpu-template").await;
    t.create_pod("p", &[("gpu", Source::Template("gpu-template"))], None)
        .await;
    t.wait_recorded("p", &["gpu"]).await;
    let by_controller = proxy.tunnels();
    assert!(
        by_controller > 0,
        "{kind:?}: the controller went through the proxy"
    );
    let audit = crate::drain_check::run(
        "kubectl-dra",
        &admin_via_proxy,
        &["audit", "-A", "-o", "json"],
    )
    .await;
    assert_eq!(audit.code, 0, "{kind:?}: {audit:?}");
    assert_eq!(audit.json()["kind"], "AuditReport");
    assert!(
        proxy.tunnels() > by_controller,
        "{kind:?}: the plugin went through the proxy"
    );
    println!(
        "PROXY: {name}: {} tunnel(s) through {}, claim recorded, kubectl dra audit answered",
        proxy.tunnels(),
        proxy.url()
    );
    t.finish();
}

/// A protobuf pod watch whose body ends inside a frame (a connection
/// closed mid-message, passed on by the proxy as a clean end) is opened
/// again in protobuf: an early end is a transport fault, not a sign that
/// the server cannot speak protobuf, and every pod event stays cheap to
/// decode. The controller keeps recording claims throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_watch_cut_mid_frame_stays_in_protobuf() {
    const NAME: &str = "a_pod_watch_cut_mid_frame_stays_in_protobuf";
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let plan = FaultPlan {
        truncate: 1000,
        cut_after: (Duration::from_millis(500), Duration::from_millis(1500)),
        only: vec!["/api/v1/pods".into()],
        ..FaultPlan::default()
    };
    let proxy = controller_behind_proxy(&mut t, plan).await;
    t.create_template("gpu-template").await;
    // Pod events keep flowing, so that truncations land inside frames.
    let mut created = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while proxy.counts().truncated < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} truncated watch bodies in 60 s",
            proxy.counts().truncated
        );
        t.create_pod(
            &format!("p-{created}"),
            &[("gpu", Source::Template("gpu-template"))],
            None,
        )
        .await;
        created += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Past the truncations: a new watch, and the work goes on.
    let watches_then = proxy.watch_requests().len();
    t.create_pod("last", &[("gpu", Source::Template("gpu-template"))], None)
        .await;
    t.wait_recorded("last", &["gpu"]).await;
    crate::k8s::wait_for(
        "a pod watch after the truncations",
        Duration::from_secs(30),
        async || {
            anyhow::ensure!(proxy.watch_requests().len() > watches_then, "none yet");
            Ok(())
        },
    )
    .await;
    let pod_watches: Vec<String> = proxy
        .watch_requests()
        .into_iter()
        .filter(|(path, _)| path == "/api/v1/pods")
        .map(|(_, accept)| accept)
        .collect();
    println!(
        "PROTOBUF: {NAME}: {} truncated watch bodies, {} pod watches, accepts {:?}",
        proxy.counts().truncated,
        pod_watches.len(),
        pod_watches
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
    );
    assert!(pod_watches.len() >= 4, "{pod_watches:?}");
    for accept in &pod_watches {
        assert!(
            accept.contains(protobuf::ACCEPT),
            "every pod watch asks for protobuf, after the cuts too: {pod_watches:?}"
        );
    }
    t.finish();
}
