//! Device-taint eviction beside kube-controller-manager
//! (`--device-taints`): N DRA pods on M nodes (one device each, allocated
//! and reserved as a scheduler leaves them), then one DeviceTaintRule
//! (`NoExecute`) that selects the devices of T nodes (their driver). The
//! bench measures the time from the rule's creation to the first and the
//! last of those pods being deleted, the controller's requests, CPU and
//! peak RSS. Three runs on fresh API servers: ours paced (the defaults),
//! ours unpaced and unguarded (upstream's behaviour), and
//! kube-controller-manager 1.36 with only its `device-taint-eviction-controller`.
//! Ours also runs its claim controller (it cannot be turned off); with
//! claims named directly by pods it has nothing to do.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde::Serialize;
use serde_json::json;

use crate::cluster::{
    ApiserverOptions, Binaries, Cluster, Controller, ControllerOpts, ControllerSpec,
};
use crate::rawhttp::metric_sum;
use crate::under_test::proc_stats;

const NAMESPACE: &str = "taints";
const TAINTED_DRIVER: &str = "tainted.example.com";
const HEALTHY_DRIVER: &str = "healthy.example.com";

/// Flags of the device-taint benchmark (recorded in the JSON).
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct DeviceTaintArgs {
    /// Run the device-taint eviction benchmark instead.
    #[arg(long)]
    pub device_taints: bool,
    /// DRA pods, one device each.
    #[arg(long, default_value_t = 2000)]
    pub taint_pods: usize,
    /// Nodes they are spread over.
    #[arg(long, default_value_t = 50)]
    pub taint_nodes: usize,
    /// Nodes whose devices the rule taints.
    #[arg(long, default_value_t = 10)]
    pub tainted_nodes: usize,
}

#[derive(Debug, Clone, Serialize)]
struct Run {
    controller: &'static str,
    tainted_pods: usize,
    first_eviction_s: f64,
    last_eviction_s: f64,
    requests: f64,
    cpu_s: f64,
    peak_rss_mib: f64,
}

enum Under {
    Ours(Controller),
    Reference(crate::reference::Reference, kube::Client),
}

impl Under {
    fn pid(&self) -> u32 {
        match self {
            Under::Ours(c) => c.proc.pid(),
            Under::Reference(r, _) => r.proc.pid(),
        }
    }

    async fn requests(&self) -> f64 {
        let text = match self {
            Under::Ours(c) => c.metrics_text().await.unwrap_or_default(),
            Under::Reference(_, client) => {
                let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
                client.request_text(req).await.unwrap_or_default()
            }
        };
        metric_sum(&text, "rest_client_requests_total")
    }
}

fn apiserver() -> ApiserverOptions {
    ApiserverOptions {
        feature_gates: vec!["DRADeviceTaintRules=true".into()],
        runtime_config: vec!["resource.k8s.io/v1beta2=true".into()],
        ..Default::default()
    }
}

pub async fn run(
    args: &DeviceTaintArgs,
    bins: &Binaries,
    reference: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    let variants: [(&'static str, Vec<String>); 2] = [
        ("ours (paced: 10/s, 5/s per rule)", Vec::new()),
        (
            "ours (unpaced, unguarded)",
            vec![
                "--device-taint-evictions-per-second=0".into(),
                "--device-taint-evictions-per-rule-per-second=0".into(),
                "--device-taint-eviction-max-share=1".into(),
            ],
        ),
    ];
    for (name, extra) in variants {
        eprintln!("==== device taints: {name} ====");
        runs.push(run_one(args, bins, name, Some(extra), None).await?);
    }
    match reference {
        Some(kcm) => {
            eprintln!("==== device taints: kube-controller-manager ====");
            runs.push(run_one(args, bins, "kube-controller-manager", None, Some(kcm)).await?);
        }
        None => println!(
            "device taints: no kube-controller-manager next to kube-apiserver; reference skipped"
        ),
    }
    println!(
        "\n{:<36} {:>7} {:>10} {:>10} {:>9} {:>7} {:>9}",
        "controller", "pods", "first (s)", "last (s)", "requests", "CPU s", "RSS MiB"
    );
    for r in &runs {
        println!(
            "{:<36} {:>7} {:>10.2} {:>10.2} {:>9.0} {:>7.2} {:>9.1}",
            r.controller,
            r.tainted_pods,
            r.first_eviction_s,
            r.last_eviction_s,
            r.requests,
            r.cpu_s,
            r.peak_rss_mib
        );
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!(
        "device-taints-{}.json",
        k8s_openapi::jiff::Timestamp::now().as_second()
    ));
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(&json!({"args": args, "runs": runs}))?,
    )?;
    println!("JSON: {}", path.display());
    Ok(())
}

async fn run_one(
    args: &DeviceTaintArgs,
    bins: &Binaries,
    name: &'static str,
    ours: Option<Vec<String>>,
    reference: Option<&std::path::Path>,
) -> anyhow::Result<Run> {
    let cluster = Cluster::start_with(bins, &apiserver()).await?;
    let client = cluster.admin_client().await?;
    let tainted = fill(&client, args).await?;
    eprintln!(
        "device taints: {} pods placed, {} on devices to taint",
        args.taint_pods,
        tainted.len()
    );
    let under = match (ours, reference) {
        (Some(extra), _) => {
            let opts = ControllerOpts {
                feature_gates: format!(
                    "{},DRADeviceTaintRules=true",
                    crate::cluster::ALL_CONTROLLER_GATES
                ),
                leader_elect: false,
                qps: 20,
                burst: 30,
                extra_args: extra,
                ..ControllerOpts::default()
            };
            let spec = ControllerSpec {
                kubeconfig: cluster.admin_kubeconfig.clone(),
                ..ControllerSpec::new(&cluster, &opts, "bench")
            };
            Under::Ours(Controller::start(&spec).await?)
        }
        (None, Some(kcm)) => {
            let r = crate::reference::Reference::start_controllers_with(
                kcm,
                &cluster,
                &["device-taint-eviction-controller"],
                &[
                    "--feature-gates=DRADeviceTaintRules=true".into(),
                    // kube-controller-manager's defaults, as ours has.
                    "--kube-api-qps=20".into(),
                    "--kube-api-burst=30".into(),
                ],
            )
            .await?;
            let mut config = kube::Config::new(format!("https://127.0.0.1:{}", r.port).parse()?);
            config.accept_invalid_certs = true;
            let metrics = kube::Client::try_from(config)?;
            Under::Reference(r, metrics)
        }
        (None, None) => anyhow::bail!("nothing to run"),
    };
    // Both list every pod, claim and slice first; the rule comes once they
    // are in (a bench may wait: nothing here asserts on time).
    tokio::time::sleep(Duration::from_secs(15)).await;
    let deleted: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let watch = {
        let deleted = deleted.clone();
        let tainted = tainted.clone();
        let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        tokio::spawn(async move {
            let mut seen = HashSet::new();
            let mut stream = watcher::watcher(pods, watcher::Config::default()).boxed();
            while let Ok(Some(event)) = stream.try_next().await {
                let pods = match event {
                    Event::Apply(p) | Event::InitApply(p) | Event::Delete(p) => vec![p],
                    _ => continue,
                };
                for p in pods {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    if p.metadata.deletion_timestamp.is_some()
                        && tainted.contains(&name)
                        && seen.insert(name)
                    {
                        deleted.lock().unwrap().push(Instant::now());
                    }
                }
                if seen.len() == tainted.len() {
                    return;
                }
            }
        })
    };
    let requests_before = under.requests().await;
    let cpu_before = proc_stats(under.pid())?.cpu_s;
    let rules_resource =
        dra_claim_controller::model::device_taints::RulesVersion::V1beta2.api_resource();
    let rules: Api<DynamicObject> = Api::all_with(client.clone(), &rules_resource);
    let created = Instant::now();
    rules
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1beta2",
                "kind": "DeviceTaintRule",
                "metadata": {"name": "maintenance"},
                "spec": {"deviceSelector": {"driver": TAINTED_DRIVER},
                         "taint": {"key": "example.com/maintenance", "effect": "NoExecute"}},
            }))?,
        )
        .await?;
    let _ = tokio::time::timeout(Duration::from_secs(900), watch).await;
    let times = deleted.lock().unwrap().clone();
    let stats = proc_stats(under.pid())?;
    let run = Run {
        controller: name,
        tainted_pods: times.len(),
        first_eviction_s: times
            .first()
            .map_or(f64::NAN, |t| t.duration_since(created).as_secs_f64()),
        last_eviction_s: times
            .last()
            .map_or(f64::NAN, |t| t.duration_since(created).as_secs_f64()),
        requests: under.requests().await - requests_before,
        cpu_s: stats.cpu_s - cpu_before,
        peak_rss_mib: stats.peak_rss_mib,
    };
    eprintln!("device taints: {run:?}");
    Ok(run)
}

/// Nodes, slices, and the pods with their allocated claims; returns the
/// names of the pods on devices the rule will taint.
async fn fill(client: &kube::Client, args: &DeviceTaintArgs) -> anyhow::Result<HashSet<String>> {
    crate::scale::create_namespace(client, NAMESPACE).await?;
    let per_node = args.taint_pods.div_ceil(args.taint_nodes.max(1));
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let driver_of = |node: usize| {
        if node < args.tainted_nodes {
            TAINTED_DRIVER
        } else {
            HEALTHY_DRIVER
        }
    };
    for n in 0..args.taint_nodes {
        let node = format!("node-{n}");
        dra_e2e::nodes::create_schedulable_node(client, &node).await?;
        let devices: Vec<_> = (0..per_node)
            .map(|d| json!({"name": format!("d{d}")}))
            .collect();
        slices
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": node},
                    "spec": {"driver": driver_of(n), "nodeName": node, "devices": devices,
                             "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
                }))?,
            )
            .await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let tainted: HashSet<String> = (0..args.taint_pods)
        .filter(|i| i / per_node < args.tainted_nodes)
        .map(|i| format!("pod-{i}"))
        .collect();
    futures::stream::iter(0..args.taint_pods)
        .map(|i| {
            let (pods, claims) = (pods.clone(), claims.clone());
            async move {
                let (node, device) = (i / per_node, i % per_node);
                let name = format!("pod-{i}");
                claims
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(json!({
                            "metadata": {"name": name},
                            "spec": {"devices": {"requests": [{"name": "req-0",
                                "exactly": {"deviceClassName": "gpu.example.com"}}]}},
                        }))?,
                    )
                    .await?;
                let pod = pods
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(json!({
                            "metadata": {"name": name},
                            "spec": {
                                "nodeName": format!("node-{node}"),
                                "containers": [{"name": "main", "image": "busybox",
                                                "resources": {"claims": [{"name": "gpu"}]}}],
                                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                            },
                        }))?,
                    )
                    .await?;
                claims
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {
                            "allocation": {"devices": {"results": [{
                                "request": "req-0", "driver": driver_of(node),
                                "pool": format!("node-{node}"), "device": format!("d{device}")}]}},
                            "reservedFor": [{"resource": "pods", "name": name,
                                             "uid": pod.metadata.uid}],
                        }})),
                    )
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(tainted)
}
