//! API Priority and Fairness: with the API server's seats made few and a
//! flood of expensive lists from other service accounts saturating
//! `workload-low` (where the built-in `service-accounts` FlowSchema sends
//! any service account outside kube-system, ours included), the chart's
//! FlowSchema keeps the controller at the pace it has without the flood,
//! as kube-controller-manager's built-in schema keeps it in `workload-high`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::cluster::{ApiserverOptions, ControllerOpts, client_from};
use crate::ctx::TestCtx;
use crate::k8s::{Source, wait_for};

/// Service accounts flooding, and concurrent lists each keeps going.
const FLOODERS: usize = 6;
const LISTS_PER_FLOODER: usize = 4;
/// ConfigMaps of this many bytes the flood lists: each list costs the
/// API server tens of milliseconds of a seat.
const CONFIGMAPS: usize = 60;
const CONFIGMAP_BYTES: usize = 100_000;
/// Pods whose claims are timed in each phase.
const PODS: usize = 15;

/// A flood of lists from `FLOODERS` service accounts that hold their
/// seats: each list's answer is never read, so the API server's handler
/// waits to write it (costing no CPU, as a slow client does) and keeps its
/// seat; a refused list (429) is sent again. Stops when dropped.
struct Flood {
    stop: Arc<AtomicBool>,
    held: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    async fn start(clients: &[kube::Client], ns: &str) -> Flood {
        let (stop, held, refused) = Default::default();
        let mut flood = Flood {
            stop,
            held,
            refused,
            tasks: Vec::new(),
        };
        for client in clients {
            for _ in 0..LISTS_PER_FLOODER {
                let client = client.clone();
                let path = format!("/api/v1/namespaces/{ns}/configmaps");
                let (stop, held, refused) = (
                    flood.stop.clone(),
                    flood.held.clone(),
                    flood.refused.clone(),
                );
                flood.tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let request = http::Request::get(&path)
                            .body(kube::client::Body::empty())
                            .unwrap();
                        match client.send(request).await {
                            Ok(answer) if answer.status().is_success() => {
                                held.fetch_add(1, Ordering::Relaxed);
                                // Held, unread, until the flood stops.
                                while !stop.load(Ordering::Relaxed) {
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                }
                                drop(answer);
                            }
                            _ => {
                                refused.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                }));
            }
        }
        // The priority level is full: the lists hold every seat it has (the
        // count stops growing for a second; the rest wait in its queues or
        // are refused).
        let deadline = Instant::now() + Duration::from_secs(30);
        let (mut last, mut since) = (u64::MAX, Instant::now());
        loop {
            let held = flood.held.load(Ordering::Relaxed);
            if held != last {
                (last, since) = (held, Instant::now());
            } else if held > 0 && since.elapsed() >= Duration::from_secs(1) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the flood never filled its priority level: {held} held, {} refused",
                flood.refused.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        flood
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Creates `PODS` pods with a template claim (`prefix-i`) and waits up to
/// `PHASE` for their claims to be recorded; returns how many were and how
/// long it took.
async fn time_claims(t: &TestCtx, prefix: &str) -> (usize, Duration) {
    let started = Instant::now();
    let names: Vec<String> = (0..PODS).map(|i| format!("{prefix}-{i}")).collect();
    for name in &names {
        t.create_pod(name, &[("gpu", Source::Template("gpu-template"))], None)
            .await;
    }
    loop {
        let mut recorded = 0;
        for name in &names {
            let pod = t.pods().get(name).await.unwrap();
            let statuses = pod
                .status
                .and_then(|s| s.resource_claim_statuses)
                .unwrap_or_default();
            if statuses.iter().any(|s| s.resource_claim_name.is_some()) {
                recorded += 1;
            }
        }
        if recorded == PODS || started.elapsed() >= PHASE {
            return (recorded, started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long a phase waits for its claims.
const PHASE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_flow_schema_keeps_claims_at_pace_under_an_api_flood() {
    const NAME: &str = "the_chart_flow_schema_keeps_claims_at_pace_under_an_api_flood";
    let apiserver = ApiserverOptions {
        priority_and_fairness: Some((8, 4)),
        ..ApiserverOptions::default()
    };
    let Some(mut t) = TestCtx::isolated_with(NAME, ControllerOpts::default(), 0, &apiserver).await
    else {
        return;
    };
    let Some(chart) =
        crate::helm::render_chart(crate::rbac::RELEASE, crate::rbac::SYSTEM_NAMESPACE, &[])
            .expect("the chart renders")
    else {
        println!("SKIP: {NAME}: Helm is not available to render the chart's FlowSchema");
        return;
    };
    let flow_schema: Vec<serde_yaml::Value> = crate::helm::parse_documents(&chart)
        .unwrap()
        .into_iter()
        .filter(|d| d["kind"] == "FlowSchema")
        .collect();
    assert_eq!(flow_schema.len(), 1, "the chart ships one FlowSchema");
    let flow_schema_name = flow_schema[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let flow_schema = serde_yaml::to_string(&flow_schema[0]).unwrap();

    // What the flood lists, in a namespace of its own.
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    let flood_ns = "flood";
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": flood_ns}})).unwrap(),
        )
        .await
        .unwrap();
    let payload = "x".repeat(CONFIGMAP_BYTES);
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), flood_ns);
    for i in 0..CONFIGMAPS {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("cm-{i}")}, "data": {"payload": payload}}),
        )
        .unwrap();
        configmaps
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
    }
    // (The built-in `view` role is filled by kube-controller-manager's
    // aggregation controller, which does not run here.)
    let role: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "configmap-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
    }))
    .unwrap();
    Api::<kube::api::DynamicObject>::all_with(
        admin.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRole"),
            "clusterroles",
        ),
    )
    .create(&PostParams::default(), &role)
    .await
    .unwrap();
    let mut flooders = Vec::new();
    for i in 0..FLOODERS {
        let kubeconfig = t
            .isolated_env()
            .cluster
            .service_account_kubeconfig(&format!("flooder-{i}"), Some("configmap-reader"))
            .await
            .unwrap();
        flooders.push(client_from(&kubeconfig).await.unwrap());
    }

    t.create_template("gpu-template").await;
    t.isolated_env().start_controller().await.unwrap();
    // Caches loaded, leader elected: the phases time claims alone.
    t.create_pod("warm", &[("gpu", Source::Template("gpu-template"))], None)
        .await;
    t.wait_recorded("warm", &["gpu"]).await;
    let (_, quiet) = time_claims(&t, "quiet").await;

    let flood = Flood::start(&flooders, flood_ns).await;
    let (low_recorded, low_took) = time_claims(&t, "low").await;
    let low_held = flood.held.load(Ordering::Relaxed);
    assert!(
        low_held > 0,
        "the flood's lists were let in (they hold seats, they are not errors)"
    );
    drop(flood);
    let low_restarts = t.restarts();
    // The flood gone, the controller catches up before the next phase.
    for i in 0..PODS {
        t.wait_recorded(&format!("low-{i}"), &["gpu"]).await;
    }

    crate::helm::apply_rendered(&admin, &flow_schema)
        .await
        .unwrap();
    // The API server's configuration controller has taken the schema in
    // once it has judged it (its Dangling condition: False, the priority
    // level exists).
    let schemas: Api<k8s_openapi::api::flowcontrol::v1::FlowSchema> = Api::all(admin.clone());
    wait_for(
        "the API server to take the FlowSchema in",
        Duration::from_secs(30),
        async || {
            let schema = schemas.get(&flow_schema_name).await?;
            let dangling = schema
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "Dangling")
                .and_then(|c| c.status);
            anyhow::ensure!(
                dangling.as_deref() == Some("False"),
                "Dangling: {dangling:?}"
            );
            Ok(())
        },
    )
    .await;
    let flood = Flood::start(&flooders, flood_ns).await;
    let (high_recorded, high_took) = time_claims(&t, "high").await;
    let (held, refused) = (
        flood.held.load(Ordering::Relaxed),
        flood.refused.load(Ordering::Relaxed),
    );
    drop(flood);
    let high_restarts = t.restarts() - low_restarts;
    println!(
        "E2E figure: {NAME}: {PODS} pods' claims recorded in {:.2} s without a flood; under a flood \
         of {FLOODERS}x{LISTS_PER_FLOODER} lists of {} MB whose answers are never read ({low_held} \
         and {held} let in and holding seats, {refused} refused in the second): without the chart's \
         FlowSchema (workload-low) {low_recorded}/{PODS} recorded in {:.2} s, {low_restarts} lost \
         lease(s); with it (workload-high) {high_recorded}/{PODS} in {:.2} s, {high_restarts} lost \
         lease(s)",
        quiet.as_secs_f64(),
        CONFIGMAPS * CONFIGMAP_BYTES / 1_000_000,
        low_took.as_secs_f64(),
        high_took.as_secs_f64(),
    );
    assert_eq!(
        high_recorded, PODS,
        "with the FlowSchema every claim is recorded"
    );
    assert_eq!(high_restarts, 0, "with the FlowSchema the lease holds");
    assert!(
        high_took <= quiet * 3 + Duration::from_secs(2),
        "with the FlowSchema the pace stays near the quiet one: {high_took:?} against {quiet:?}"
    );
    assert!(
        low_recorded < PODS || low_took > high_took * 2,
        "the flood slows the controller without the FlowSchema ({low_recorded} in {low_took:?}), \
         or it proves nothing"
    );
    t.finish();
}
