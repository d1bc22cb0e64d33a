//! Lifecycle benchmark: the same pod load against this controller and, where
//! `kube-controller-manager` is installed next to the e2e binaries, against
//! the in-tree `resourceclaim-controller` it replaces.
//!
//! Each controller gets a fresh etcd + kube-apiserver (started by the e2e
//! harness) with the same pre-fill, so the two never share a server. The
//! load: N pods with K template claims each; the bench records when each pod's
//! claims are recorded, marks every pod Succeeded, records when its claims
//! are deleted, and deletes the pods. It reports throughput, latencies, API
//! requests per pod by verb (from the controller's own
//! `rest_client_requests_total`), conflicts, CPU and peak RSS, prints a table
//! and writes JSON to `target/bench/lifecycle-<timestamp>.json`.
//!
//! Run: `cargo bench --bench lifecycle -- --pods 1000 --kube-api-qps 20 --kube-api-burst 30`
//! The admin guide's scale test, with a real kube-scheduler and a sweep over
//! `--kube-api-qps`: `cargo bench --bench lifecycle -- --scale` (see `scale.rs`).
//! Pod start-up on a real node (kubelet, containerd, the DRA test driver),
//! ours against the reference: `cargo bench --bench lifecycle -- --real-node`
//! (see `real_node.rs`).
//! Device-taint eviction, ours paced and unpaced against the reference's:
//! `cargo bench --bench lifecycle -- --device-taints` (see `device_taints.rs`).
//! A cluster's worth of nodes with devices (`--fill-nodes`, one ResourceSlice
//! each) and every DRA controller on both sides:
//! `--fill-nodes 5000 --ours-arg=--controllers=*,headroom --reference-controllers
//! resourceclaim-controller,device-taint-eviction-controller,resourcepoolstatusrequest-controller`,
//! with `--apiserver-runtime-config`, `--apiserver-feature-gates`,
//! `--reference-feature-gates` and `--ours-arg=--feature-gates=…` for the
//! alpha APIs they need.
//! (`--help` lists the flags). On a busy machine add `--rounds 2`: the
//! controllers then alternate in turn and the table shows medians.
//! Nothing here asserts on time: it measures and reports.

// The bench's own modules share helpers among themselves with `pub`.
#![allow(unreachable_pub)]

use dra_e2e::{cluster, helm, procs, rawhttp, reference, scheduler};

#[path = "lifecycle/device_taints.rs"]
mod device_taints;
#[path = "lifecycle/hostile.rs"]
mod hostile;
#[path = "lifecycle/load.rs"]
mod load;
#[path = "lifecycle/real_node.rs"]
mod real_node;
#[path = "lifecycle/report.rs"]
mod report;
#[path = "lifecycle/scale.rs"]
mod scale;
#[path = "lifecycle/tracker.rs"]
mod tracker;
#[path = "lifecycle/under_test.rs"]
mod under_test;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use serde::Serialize;

use cluster::{ApiserverOptions, Binaries, Cluster};
use report::{Output, RunResult, Snapshot};
use tracker::{State, Tracker};
use under_test::{Kind, UnderTest};

/// What the bench does; every flag is recorded in the JSON.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "lifecycle", about = "ResourceClaim lifecycle benchmark")]
pub struct Args {
    /// Pods with claims created by the load.
    #[arg(long, default_value_t = 1000)]
    pub pods: usize,
    /// Template claim entries per pod (all use one ResourceClaimTemplate).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub claims_per_pod: u16,
    /// Pods without claims created before the controller starts.
    #[arg(long, default_value_t = 0)]
    pub fill_pods: usize,
    /// Ready Nodes created before the controller starts (`fill-node-00000`,
    /// …), each with one node-local ResourceSlice: the slices and nodes a
    /// cluster of that size makes the DRA controllers list and cache.
    #[arg(long, default_value_t = 0)]
    pub fill_nodes: usize,
    /// Devices in the ResourceSlice of each `--fill-nodes` node.
    #[arg(long, default_value_t = 8)]
    pub fill_devices_per_node: usize,
    /// Pod creations per second (0 = as fast as the concurrency allows).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// API calls of the bench client in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// `--kube-api-qps` of the controller under test.
    #[arg(long, default_value_t = 20)]
    pub kube_api_qps: u32,
    /// `--kube-api-burst` of the controller under test.
    #[arg(long, default_value_t = 30)]
    pub kube_api_burst: u32,
    /// Workers of the controller under test (`--concurrent-syncs`,
    /// `--concurrent-resourceclaim-syncs` for the reference).
    #[arg(long, default_value_t = 50)]
    pub concurrent_syncs: u32,
    /// A further flag for our controller, repeatable (e.g.
    /// `--ours-arg=--controllers=*,headroom`; with headroom the chart's CRD
    /// is applied first). `--feature-gates` values add to the bench's DRA
    /// gates; a gate named here wins.
    #[arg(long = "ours-arg", allow_hyphen_values = true)]
    pub ours_args: Vec<String>,
    /// `--controllers` of the reference kube-controller-manager, in its
    /// names (e.g. `resourceclaim-controller,device-taint-eviction-controller,
    /// resourcepoolstatusrequest-controller`).
    #[arg(long, default_value = "resourceclaim-controller")]
    pub reference_controllers: String,
    /// `--feature-gates` of the reference (e.g. `DRAResourcePoolStatus=true`);
    /// empty: its defaults.
    #[arg(long, default_value = "")]
    pub reference_feature_gates: String,
    /// Added to the API server's `--runtime-config`, comma separated (e.g.
    /// `resource.k8s.io/v1alpha3=true`, which serves ResourcePoolStatusRequests).
    #[arg(long, value_delimiter = ',')]
    pub apiserver_runtime_config: Vec<String>,
    /// Added to the API server's `--feature-gates`, comma separated (e.g.
    /// `DRAResourcePoolStatus=true`).
    #[arg(long, value_delimiter = ',')]
    pub apiserver_feature_gates: Vec<String>,
    /// Controllers to run, in this order.
    #[arg(long, value_delimiter = ',', default_value = "ours,reference")]
    pub controllers: Vec<Kind>,
    /// Rounds of all controllers (the table shows medians); even rounds
    /// run them in reverse order.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub rounds: u16,
    /// Upper bound in seconds on each phase (default: from N, K and the QPS).
    #[arg(long)]
    pub phase_timeout: Option<u64>,
    /// The admin guide's scale test (`--scale`) and its flags.
    #[command(flatten)]
    pub scale: scale::ScaleArgs,
    /// Pod start-up on a real node (`--real-node`) and its flags.
    #[command(flatten)]
    pub real_node: real_node::RealNodeArgs,
    /// Device-taint eviction beside kube-controller-manager (`--device-taints`).
    #[command(flatten)]
    pub device_taints: device_taints::DeviceTaintArgs,
    /// Passed by `cargo bench`; without it the binary was started by
    /// `cargo test` and does nothing.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub bench: bool,
}

impl Args {
    pub fn claims(&self) -> usize {
        usize::from(self.claims_per_pod)
    }

    /// Generous bound on one phase: three times what the QPS alone allows
    /// for K + 1 requests a pod, plus slack for a slow API server.
    pub fn phase_timeout(&self) -> Duration {
        if let Some(secs) = self.phase_timeout {
            return Duration::from_secs(secs);
        }
        let requests = (self.pods * (self.claims() + 1)) as f64;
        let paced = requests / f64::from(self.kube_api_qps.max(1));
        Duration::from_secs_f64(120.0 + 3.0 * paced + 0.2 * self.pods as f64)
    }

    /// The API server of a run, serving what `--apiserver-*` ask for.
    pub fn apiserver(&self) -> ApiserverOptions {
        ApiserverOptions {
            feature_gates: self.apiserver_feature_gates.clone(),
            runtime_config: self.apiserver_runtime_config.clone(),
            ..ApiserverOptions::default()
        }
    }
}

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not (and
    // may pass libtest flags), so anything else is a no-op that succeeds.
    if !std::env::args().any(|a| a == "--bench") {
        println!("lifecycle: a benchmark; run it with `cargo bench --bench lifecycle`");
        return ExitCode::SUCCESS;
    }
    let args = Args::parse();
    let Some(bins) = cluster::binaries() else {
        println!("SKIP: lifecycle benchmark: {}", cluster::SKIP_REASON);
        return ExitCode::SUCCESS;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(&args, &bins)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lifecycle: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args, bins: &Binaries) -> anyhow::Result<()> {
    let reference = reference::binary(bins);
    under_test::describe_binaries(reference.as_deref());
    if args.scale.scale {
        return scale::run(args, bins, reference.as_deref()).await;
    }
    if args.real_node.real_node {
        return real_node::run(args, bins, reference.as_deref()).await;
    }
    if args.device_taints.device_taints {
        return device_taints::run(&args.device_taints, bins, reference.as_deref()).await;
    }
    let kinds: Vec<Kind> = args
        .controllers
        .iter()
        .copied()
        .filter(|k| *k == Kind::Ours || reference.is_some())
        .collect();
    if kinds.len() < args.controllers.len() {
        println!("lifecycle: no kube-controller-manager next to kube-apiserver; reference skipped");
    }
    let output = Output::new()?;
    let mut runs = Vec::new();
    for round in 1..=usize::from(args.rounds) {
        for kind in round_order(&kinds, round) {
            eprintln!("==== round {round}: {kind} on a fresh API server ====");
            let loadavg_at_start = under_test::load_average();
            match run_one(kind, args, bins, reference.clone(), &output, round).await {
                Ok(r) => runs.push(RunResult {
                    round,
                    loadavg_at_start,
                    ..r
                }),
                Err(e) => eprintln!("lifecycle: {kind} run failed: {e:#}"),
            }
        }
    }
    anyhow::ensure!(!runs.is_empty(), "no run finished");
    report::print_table(args, &runs);
    let path = output.write_json(args, &runs)?;
    println!("JSON: {}", path.display());
    Ok(())
}

/// Even rounds run the controllers in reverse order, so that neither one
/// always gets the first (or the last) turn on a busy machine.
fn round_order(kinds: &[Kind], round: usize) -> Vec<Kind> {
    let mut order = kinds.to_vec();
    if round.is_multiple_of(2) {
        order.reverse();
    }
    order
}

/// One controller against a fresh server with the same fill and load.
async fn run_one(
    kind: Kind,
    args: &Args,
    bins: &Binaries,
    reference: Option<PathBuf>,
    output: &Output,
    round: usize,
) -> anyhow::Result<RunResult> {
    let cluster = Cluster::start_with(bins, &args.apiserver()).await?;
    let client = cluster.admin_client().await?;
    load::prepare(&client, args).await?;
    if args.ours_args.iter().any(|a| a.contains("headroom")) {
        let crd = helm::chart_dir().join("crds/nodescalingwatermarks.yaml");
        helm::apply_rendered(&client, &std::fs::read_to_string(crd)?).await?;
    }
    if args.fill_nodes > 0 {
        load::fill_nodes(&client, args).await?;
    }
    if args.fill_pods > 0 {
        load::fill(&client, args).await?;
    }
    let tracker = Tracker::start(client.clone(), args.claims());
    tracker.wait_synced(Duration::from_secs(120)).await?;
    let started = Instant::now();
    let controller = UnderTest::start(kind, &cluster, args, reference).await?;
    let result = measure(&client, &tracker, &controller, args, started).await;
    controller.stop();
    // The server's directory, log included, goes with `cluster`.
    let log = output.keep_log(&controller, round);
    eprintln!("{kind}: log {log}");
    result.map(|r| RunResult { log, ..r })
}

/// Warm-up, then the three phases of the load, with a metrics and
/// process snapshot between phases.
async fn measure(
    client: &kube::Client,
    tracker: &Tracker,
    controller: &UnderTest,
    args: &Args,
    started: Instant,
) -> anyhow::Result<RunResult> {
    let ready_s = warm_up(client, tracker, controller, args, started).await?;
    let timeout = args.phase_timeout();
    let names = load::names("load", args.pods);

    let base = Snapshot::take(controller).await?;
    let created = load::create_pods(client, &names, args, tracker).await;
    tracker
        .wait("claims recorded", &names, timeout, State::recorded)
        .await;
    let after_create = Snapshot::take(controller).await?;

    let done = load::mark_done(client, &names, args, tracker).await;
    tracker
        .wait("claims deleted", &names, timeout, State::cleaned)
        .await;
    let after_done = Snapshot::take(controller).await?;

    load::delete_pods(client, &names, args).await;
    tracker
        .wait("pods gone", &names, timeout, State::gone)
        .await;
    controller.settle().await;
    let end = Snapshot::take(controller).await?;

    Ok(report::summarize(
        controller,
        args,
        &tracker.state(),
        &names,
        (created, done),
        [&base, &after_create, &after_done, &end],
        ready_s,
    ))
}

/// One pod through the whole lifecycle: proves the controller has synced
/// its caches and works, so startup is not charged to the load. Returns the
/// seconds from `process_started` until that pod was through (not counting
/// the wait for the controller's requests to settle that follows: with
/// watches renewed every 8–10 s, three seconds without a request take
/// longer to come for ours than for the reference).
async fn warm_up(
    client: &kube::Client,
    tracker: &Tracker,
    controller: &UnderTest,
    args: &Args,
    process_started: Instant,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let names = load::names("warmup", 1);
    let timeout = Duration::from_secs(300);
    let warm = Args {
        rate: 0.0,
        ..args.clone()
    };
    load::create_pods(client, &names, &warm, tracker).await;
    let ok = tracker
        .wait("warm-up claims recorded", &names, timeout, State::recorded)
        .await;
    anyhow::ensure!(
        ok,
        "{}: the warm-up pod never got its claims (its log is kept)",
        controller.kind()
    );
    load::mark_done(client, &names, &warm, tracker).await;
    tracker
        .wait("warm-up claims deleted", &names, timeout, State::cleaned)
        .await;
    load::delete_pods(client, &names, &warm).await;
    tracker
        .wait("warm-up pod gone", &names, timeout, State::gone)
        .await;
    let through_s = process_started.elapsed().as_secs_f64();
    eprintln!(
        "{}: ready, warm-up took {:.1}s",
        controller.kind(),
        started.elapsed().as_secs_f64()
    );
    controller.settle().await;
    Ok(through_s)
}
