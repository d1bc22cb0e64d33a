//! Hostile tenants beside the scale test (`--hostile-pods-per-second`): pods
//! created with `spec.nodeName` on a declared node (`--allocate-on-nodes`),
//! each with a claim whose device search runs to its bound (eight devices of
//! the node's 48, then one device nobody offers). The allocator solves each
//! one; the ordinary pods' start-up and the leader's renewals show whether
//! that work holds anything else up. `--ours-cpus` holds the controller to
//! the given CPUs (`taskset`), as the chart's one-CPU limit does.
//!
//! The hostile pods live in a namespace of their own, so the scale test's
//! figures count only ordinary pods.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::Serialize;
use serde_json::json;

const NAMESPACE: &str = "hostile";
const NODE: &str = "declared-0";
const DECLARED_LABEL: &str = "bench.dra.example.com/declared";
const TEMPLATE: &str = "hostile";
/// The class of the request nobody can satisfy: no slice offers its driver.
const ABSENT_CLASS: &str = "absent.example.com";
/// Devices on the declared node.
const DECLARED_DEVICES: usize = 48;

/// Flags of the hostile load (recorded in the JSON).
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct HostileArgs {
    /// Hostile pods created per second on a declared node while the scale
    /// test runs (0: none, and no allocator).
    #[arg(long, default_value_t = 0.0)]
    pub hostile_pods_per_second: f64,
    /// CPUs the controller under test may use (`taskset -c`), e.g. `0`.
    #[arg(long)]
    pub ours_cpus: Option<String>,
    /// Run ours with leader election (production timings: 15 s lease, 10 s
    /// renew deadline, 2 s retry) and report the longest gap between its
    /// renewals.
    #[arg(long)]
    pub leader_elect: bool,
}

impl HostileArgs {
    pub fn on(&self) -> bool {
        self.hostile_pods_per_second > 0.0
    }

    /// Flags for ours: the allocator on the declared node.
    pub fn ours_args(&self) -> Vec<String> {
        if self.on() {
            vec![format!("--allocate-on-nodes={DECLARED_LABEL}=true")]
        } else {
            Vec::new()
        }
    }

    /// The command ours runs under.
    pub fn run_under(&self) -> Vec<String> {
        match &self.ours_cpus {
            Some(cpus) => vec!["taskset".into(), "-c".into(), cpus.clone()],
            None => Vec::new(),
        }
    }
}

/// The declared node (tainted so kube-scheduler places no ordinary pod on
/// it), its devices, the class nobody offers, and the hostile template.
pub async fn prepare(client: &kube::Client, device_class: &str) -> anyhow::Result<()> {
    let pp = PostParams::default();
    crate::scale::create_namespace(client, NAMESPACE).await?;
    dra_e2e::nodes::create_schedulable_node(client, NODE).await?;
    Api::<Node>::all(client.clone())
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {DECLARED_LABEL: "true"}},
                "spec": {"taints": [{"key": DECLARED_LABEL, "effect": "NoSchedule"}]},
            })),
        )
        .await?;
    dra_e2e::nodes::create_devices(client, device_class, NODE, DECLARED_DEVICES).await?;
    dra_e2e::nodes::create_device_class(client, ABSENT_CLASS).await?;
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), NAMESPACE)
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": TEMPLATE}, "spec": {"spec": {
            "devices": {"requests": [
                {"name": "eight", "exactly": {"deviceClassName": device_class, "count": 8}},
                {"name": "absent", "exactly": {"deviceClassName": ABSENT_CLASS, "count": 1}},
            ]}}}}))?,
        )
        .await?;
    Ok(())
}

/// Creates hostile pods at `per_second` until aborted; returns never.
pub async fn create_at_pace(client: kube::Client, per_second: f64, created: Arc<Mutex<usize>>) {
    let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    for i in 0.. {
        tick.tick().await;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("hostile-{i:05}")},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "dev"}]}}],
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": TEMPLATE}],
            },
        }))
        .expect("pod manifest");
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => *created.lock().unwrap_or_else(|e| e.into_inner()) += 1,
            Err(e) => eprintln!("scale: create hostile pod {i}: {e}"),
        }
    }
}

/// When the leader's renewals were written (the Lease's renewTime), as
/// watched; the longest gap between two of them after `since`.
#[derive(Clone, Default)]
pub struct Renewals(Arc<Mutex<Vec<Instant>>>);

impl Renewals {
    /// Watches the Lease until aborted.
    pub async fn watch(self, client: kube::Client, namespace: &str, name: &str) {
        let leases: Api<Lease> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher::watcher(leases, config).default_backoff();
        futures::pin_mut!(stream);
        let mut last = None;
        while let Some(event) = stream.next().await {
            let (Ok(Event::Apply(lease)) | Ok(Event::InitApply(lease))) = event else {
                continue;
            };
            let renewed = lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
            if renewed.is_some() && renewed != last {
                last = renewed;
                self.0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Instant::now());
            }
        }
    }

    /// The longest time between two renewals seen after `since` (the first
    /// counted from `since`); `None` without renewals.
    pub fn longest_gap(&self, since: Instant, until: Instant) -> Option<Duration> {
        let seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut times: Vec<Instant> = seen.iter().copied().filter(|t| *t >= since).collect();
        if times.is_empty() {
            return None;
        }
        times.insert(0, since);
        times.push(until);
        times.windows(2).map(|w| w[1] - w[0]).max()
    }
}
