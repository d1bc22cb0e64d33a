//! Pod start-up on a real node (`--real-node`), the DRA admin guide's pod
//! start-up SLO: pods with one template claim each, created at a steady
//! rate, scheduled by a real kube-scheduler, their claims prepared by the
//! upstream DRA test driver and their containers started by a real kubelet
//! (`dra_e2e::real_node`). Reported per controller: create -> Running p50,
//! p90, p99 and create -> claim recorded, for ours and the in-tree
//! `resourceclaim-controller` in the same run (each on a fresh API server
//! and a fresh node). Nothing is asserted on time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args as ClapArgs;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde::Serialize;
use serde_json::json;

use crate::Args;
use crate::cluster::{Binaries, Cluster, ControllerOpts, ControllerSpec};
use crate::scale::{Percentiles, percentiles};
use crate::under_test::Kind;
use dra_e2e::real_node::{self, BUSYBOX_IMAGE, DEVICE_CLASS, RealNode};

#[derive(Debug, Clone, ClapArgs, Serialize)]
pub struct RealNodeArgs {
    /// Run the real-node start-up benchmark instead of the lifecycle load.
    #[arg(long = "real-node")]
    pub real_node: bool,
    /// Pods created on the real node.
    #[arg(long = "real-node-pods", default_value_t = 20)]
    pub node_pods: usize,
    /// Pods created per second.
    #[arg(long = "real-node-rate", default_value_t = 2.0)]
    pub node_rate: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RealNodeRun {
    pub controller: String,
    pub pods: usize,
    pub running: Percentiles,
    pub claim_recorded: Percentiles,
}

const NODE: &str = "bench-node-1";

pub async fn run(
    args: &Args,
    bins: &Binaries,
    reference: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    if let Some(why) = real_node::missing_piece() {
        bail!("no real node here: {why}");
    }
    let scheduler = crate::scheduler::binary(bins).context(crate::scheduler::SKIP_REASON)?;
    let mut runs = Vec::new();
    for &kind in &args.controllers {
        if kind == Kind::Reference && reference.is_none() {
            eprintln!("lifecycle: no kube-controller-manager; the reference is left out");
            continue;
        }
        runs.push(one(kind, args, bins, &scheduler, reference).await?);
    }
    println!();
    println!(
        "{:<12} {:>5} {:>22} {:>22}",
        "controller", "pods", "create->Running p50/p90/p99", "create->recorded p50/p99"
    );
    for r in &runs {
        println!(
            "{:<12} {:>5} {:>8.3} {:>6.3} {:>6.3} s {:>10.3} {:>6.3} s",
            r.controller,
            r.pods,
            r.running.p50,
            r.running.p90,
            r.running.p99,
            r.claim_recorded.p50,
            r.claim_recorded.p99
        );
    }
    let dir = dra_e2e::helm::target_dir().join("bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!(
        "real-node-{}.json",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
    ));
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(&json!({"args": args, "runs": runs}))?,
    )?;
    println!("\nwritten to {}", path.display());
    Ok(())
}

async fn one(
    kind: Kind,
    args: &Args,
    bins: &Binaries,
    scheduler: &std::path::Path,
    reference: Option<&std::path::Path>,
) -> anyhow::Result<RealNodeRun> {
    let cluster = Cluster::start(bins).await?;
    // A device for every pod: the figure is start-up, not waiting for a
    // device to come free.
    let devices = u32::try_from(args.real_node.node_pods)
        .unwrap_or(u32::MAX)
        .max(1);
    let node = RealNode::start_with_devices(&cluster, NODE, devices).await?;
    let _scheduler = crate::scheduler::Scheduler::start(scheduler, &cluster).await?;
    // The claim controller under test, at the production budget.
    let _ours;
    let _reference;
    match kind {
        Kind::Ours => {
            let opts = ControllerOpts {
                leader_elect: false,
                qps: args.kube_api_qps,
                burst: args.kube_api_burst,
                ..ControllerOpts::default()
            };
            let spec = ControllerSpec::new(&cluster, &opts, "real-node");
            _ours = Some(crate::cluster::Controller::start(&spec).await?);
        }
        Kind::Reference => {
            let binary = reference.context("no kube-controller-manager")?;
            _reference = Some(crate::reference::Reference::start(binary, &cluster).await?);
        }
    }
    let client = cluster.admin_client().await?;
    let ns = "bench";
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(client.clone(), ns);
    templates
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "tmpl"}, "spec": {"spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}}}}),
            )?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let count = args.real_node.node_pods;
    let interval = Duration::from_secs_f64(1.0 / args.real_node.node_rate.max(0.01));
    // Created at a steady rate by a task of its own, while this one polls
    // every 50 ms for the first time each pod is seen Running (or past it)
    // and with its claim recorded.
    let creator = {
        let pods = pods.clone();
        tokio::spawn(async move {
            let mut created = BTreeMap::new();
            let started = Instant::now();
            for i in 0..count {
                tokio::time::sleep_until((started + interval * i as u32).into()).await;
                let name = format!("p-{i}");
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {
                        "hostNetwork": true, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", "sleep 30"], "resources": {"claims": [{"name": "gpu"}]}}],
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tmpl"}],
                    },
                }))?;
                created.insert(name, Instant::now());
                pods.create(&PostParams::default(), &pod).await?;
            }
            anyhow::Ok(created)
        })
    };
    let mut running = BTreeMap::new();
    let mut recorded = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while running.len() < count && Instant::now() < deadline {
        for p in pods.list(&ListParams::default()).await?.items {
            let name = p.metadata.name.clone().unwrap_or_default();
            let status = p.status.as_ref();
            let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or_default();
            if matches!(phase, "Running" | "Succeeded") {
                running.entry(name.clone()).or_insert_with(Instant::now);
            }
            let has_claim = status
                .and_then(|s| s.resource_claim_statuses.as_ref())
                .is_some_and(|s| s.iter().any(|e| e.resource_claim_name.is_some()));
            if has_claim {
                recorded.entry(name).or_insert_with(Instant::now);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let created = creator.await??;
    let since = |seen: &BTreeMap<String, Instant>| -> Vec<Duration> {
        seen.iter()
            .filter_map(|(n, at)| Some(at.duration_since(*created.get(n)?)))
            .collect()
    };
    let run = RealNodeRun {
        controller: format!("{kind:?}").to_lowercase(),
        pods: running.len(),
        running: percentiles(since(&running)),
        claim_recorded: percentiles(since(&recorded)),
    };
    drop(node);
    Ok(run)
}
