//! The objects of the load and the bench client's concurrent API calls:
//! namespace and template, pre-fill nodes and pods, load pods, their end
//! and deletion.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Args;
use crate::tracker::Tracker;

pub const NAMESPACE: &str = "bench";
pub const TEMPLATE: &str = "bench-device";
/// Label of the pods with claims; the pre-fill has another value.
pub const LOAD_SELECTOR: &str = "bench=load";
/// Attempts per API call: a busy test API server may time a request out.
const ATTEMPTS: u32 = 5;

/// `<prefix>-00000`, … : sortable names.
pub fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:05}")).collect()
}

/// What a phase of bench calls took, for the report.
#[derive(Debug, Clone, Copy)]
pub struct Calls {
    /// Just before the first call was sent.
    pub started: Instant,
    /// When the last call returned.
    pub finished: Instant,
    pub failed: usize,
}

/// Namespace `bench` with its `default` ServiceAccount (no controller
/// creates it here) and the one ResourceClaimTemplate every pod uses.
pub async fn prepare(client: &kube::Client, args: &Args) -> anyhow::Result<()> {
    let meta = |name: &str| json!({"metadata": {"name": name}});
    create(&Api::<Namespace>::all(client.clone()), meta(NAMESPACE)).await?;
    create(
        &Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE),
        meta("default"),
    )
    .await?;
    let template = json!({
        "metadata": {"name": TEMPLATE},
        "spec": {"spec": {"devices": {"requests": [{
            "name": "req-0",
            "exactly": {"deviceClassName": "gpu.bench.example.com"},
        }]}}},
    });
    create(
        &Api::<ResourceClaimTemplate>::namespaced(client.clone(), NAMESPACE),
        template,
    )
    .await?;
    eprintln!(
        "bench: namespace {NAMESPACE}, template {TEMPLATE}, {} claim(s) per pod",
        args.claims()
    );
    Ok(())
}

async fn create<K>(api: &Api<K>, object: Value) -> anyhow::Result<K>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    Ok(api
        .create(&PostParams::default(), &serde_json::from_value(object)?)
        .await?)
}

/// A pod no kubelet will ever run: `claims` template entries, all used by
/// its one container.
fn pod(name: &str, role: &str, claims: usize) -> anyhow::Result<Pod> {
    let entries: Vec<String> = (0..claims).map(|i| format!("claim-{i}")).collect();
    let mut container = json!({"name": "main", "image": "registry.invalid/bench/pause:1"});
    let mut spec = json!({"containers": [], "terminationGracePeriodSeconds": 0});
    if claims > 0 {
        container["resources"] =
            json!({"claims": entries.iter().map(|e| json!({"name": e})).collect::<Vec<_>>()});
        spec["resourceClaims"] = entries
            .iter()
            .map(|e| json!({"name": e, "resourceClaimTemplateName": TEMPLATE}))
            .collect();
    }
    spec["containers"] = json!([container]);
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": role}},
        "spec": spec,
    }))?)
}

/// Pre-fill: pods without claims, as fast as the concurrency allows.
pub async fn fill(client: &kube::Client, args: &Args) -> anyhow::Result<()> {
    let names = names("fill", args.fill_pods);
    let calls = for_each_pod(client, &names, args, Pace::No, |pods, name| async move {
        create_pod(&pods, &name, "fill", 0).await
    })
    .await;
    let secs = (calls.finished - calls.started).as_secs_f64();
    eprintln!(
        "bench: filled {} pods in {secs:.1}s ({:.0}/s), {} failed",
        names.len(),
        names.len() as f64 / secs.max(1e-9),
        calls.failed
    );
    anyhow::ensure!(calls.failed == 0, "{} fill pods not created", calls.failed);
    Ok(())
}

/// The driver of the `--fill-nodes` slices: no DeviceClass selects it, so
/// the load's claims never compete for these devices.
pub const FILL_DRIVER: &str = "fill.example.com";

/// Pre-fill of nodes: for each a Ready Node (allocatable cpu, memory,
/// pods) and one node-local ResourceSlice, its pool named after the node,
/// with `--fill-devices-per-node` devices; as fast as the concurrency allows.
pub async fn fill_nodes(client: &kube::Client, args: &Args) -> anyhow::Result<()> {
    let names = names("fill-node", args.fill_nodes);
    let nodes: Api<Node> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let devices: Vec<Value> = (0..args.fill_devices_per_node)
        .map(|d| json!({"name": format!("dev-{d}")}))
        .collect();
    let (nodes, slices, devices) = (&nodes, &slices, &devices);
    let calls = drive(&names, args.concurrency, 0.0, |name| async move {
        let node = json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}});
        create_or_found(nodes, node).await?;
        // Status and taints are only the kubelet's and the node lifecycle
        // controller's to set: Ready, with room, and no not-ready taint.
        dra_e2e::nodes::report_ready(client, &name).await?;
        let slice = json!({
            "metadata": {"name": name},
            "spec": {
                "driver": FILL_DRIVER,
                "nodeName": name,
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        });
        create_or_found(slices, slice).await
    })
    .await;
    let secs = (calls.finished - calls.started).as_secs_f64();
    eprintln!(
        "bench: filled {} nodes with a slice of {} devices each in {secs:.1}s ({:.0} nodes/s), {} failed",
        names.len(),
        args.fill_devices_per_node,
        names.len() as f64 / secs.max(1e-9),
        calls.failed
    );
    anyhow::ensure!(calls.failed == 0, "{} fill nodes not created", calls.failed);
    Ok(())
}

/// Creates `object`; a retried create may find its own earlier attempt.
async fn create_or_found<K>(api: &Api<K>, object: Value) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api
        .create(&PostParams::default(), &serde_json::from_value(object)?)
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        other => Ok(other.map(drop)?),
    }
}

/// Creates the load pods at `--rate` with `--concurrency`, marking each
/// pod created when its create call returns.
pub async fn create_pods(
    client: &kube::Client,
    names: &[String],
    args: &Args,
    tracker: &Tracker,
) -> Calls {
    let claims = args.claims();
    for_each_pod(client, names, args, Pace::Rate, |pods, name| async move {
        create_pod(&pods, &name, "load", claims).await?;
        tracker.mark(&name, Instant::now(), |t| &mut t.created);
        Ok(())
    })
    .await
}

async fn create_pod(pods: &Api<Pod>, name: &str, role: &str, claims: usize) -> anyhow::Result<()> {
    match pods
        .create(&PostParams::default(), &pod(name, role, claims)?)
        .await
    {
        // A retried create may find its own earlier attempt.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        other => Ok(other.map(drop)?),
    }
}

/// Phase Succeeded through the status subresource, as a kubelet would
/// report the end of the pod.
pub async fn mark_done(
    client: &kube::Client,
    names: &[String],
    args: &Args,
    tracker: &Tracker,
) -> Calls {
    let patch = &Patch::Merge(json!({"status": {"phase": "Succeeded"}}));
    for_each_pod(client, names, args, Pace::No, |pods, name| async move {
        pods.patch_status(&name, &PatchParams::default(), patch)
            .await?;
        tracker.mark(&name, Instant::now(), |t| &mut t.done);
        Ok(())
    })
    .await
}

/// Deletes the pods at once (grace period 0), as a kubelet confirming
/// termination would.
pub async fn delete_pods(client: &kube::Client, names: &[String], args: &Args) -> Calls {
    let dp = &DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for_each_pod(client, names, args, Pace::No, |pods, name| async move {
        match pods.delete(&name, dp).await {
            // A retried delete may find its own earlier attempt done.
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            other => Ok(other.map(drop)?),
        }
    })
    .await
}

/// Whether calls keep to `--rate`: only the load's creates do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    Rate,
    No,
}

/// [`drive`] at `--concurrency`, with the pod API of the bench namespace
/// handed to each call.
async fn for_each_pod<'a, F, Fut>(
    client: &kube::Client,
    names: &'a [String],
    args: &Args,
    pace: Pace,
    call: F,
) -> Calls
where
    F: Fn(Api<Pod>, String) -> Fut + 'a,
    Fut: Future<Output = anyhow::Result<()>> + 'a,
{
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let rate = if pace == Pace::Rate { args.rate } else { 0.0 };
    drive(names, args.concurrency, rate, move |name| {
        call(pods.clone(), name)
    })
    .await
}

/// Runs `call` for every name, `concurrency` at a time; with `rate` > 0 the
/// i-th call starts no earlier than i / rate seconds after the first.
/// Failed calls are retried; those that still fail are counted, and the
/// first few printed.
async fn drive<'a, F, Fut>(names: &'a [String], concurrency: usize, rate: f64, call: F) -> Calls
where
    F: Fn(String) -> Fut + 'a,
    Fut: Future<Output = anyhow::Result<()>> + 'a,
{
    let started = Instant::now();
    let start = tokio::time::Instant::from_std(started);
    let call = &call;
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| async move {
            if rate > 0.0 {
                tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
            }
            retry(|| call(name.clone())).await
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let errors: Vec<_> = results.into_iter().filter_map(Result::err).collect();
    for e in errors.iter().take(3) {
        eprintln!("  bench call failed: {e:#}");
    }
    Calls {
        started,
        finished: Instant::now(),
        failed: errors.len(),
    }
}

async fn retry<Fut>(call: impl Fn() -> Fut) -> anyhow::Result<()>
where
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut delay = Duration::from_millis(100);
    for _ in 1..ATTEMPTS {
        if call().await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
    call().await
}
