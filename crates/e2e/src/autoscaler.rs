//! A real cluster-autoscaler (kubernetes/autoscaler, built with its `kwok`
//! cloud provider, which creates Node objects for a node group without any
//! cloud) against a test API server. The harness plays the kubelet and the
//! DRA driver of every node of the group: Ready status, no not-ready taint,
//! a node-local ResourceSlice. Found beside `kube-apiserver`; where it is
//! absent, the tests that need it skip.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cluster::{Cluster, free_port};
use crate::procs::Proc;

pub const SKIP_REASON: &str =
    "no cluster-autoscaler beside kube-apiserver (built with `-tags kwok`; set KUBEBUILDER_ASSETS)";

/// The flags that turn on cluster-autoscaler's CapacityBuffer controller
/// and its injection of virtual pods for ready buffers.
pub const CAPACITY_BUFFER_FLAGS: [&str; 2] = [
    "--capacity-buffer-controller-enabled=true",
    "--capacity-buffer-pod-injection-enabled=true",
];

/// The label whose value names a node's group (the kwok provider's
/// `nodegroups.fromNodeLabelKey`).
pub const NODE_GROUP_LABEL: &str = "autoscaling.e2e.dra-claim-controller.io/node-group";

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The cluster-autoscaler binary for the test `name`, or one `SKIP:` line.
pub fn binary_or_skip(name: &str) -> Option<PathBuf> {
    crate::cluster::beside_apiserver_or_skip(name, "cluster-autoscaler", SKIP_REASON)
}

/// A node group as the kwok provider reads it from its first live node.
#[derive(Debug, Clone, Copy)]
pub struct NodeGroup<'a> {
    pub name: &'a str,
    pub min: u32,
    pub max: u32,
    /// Devices of `driver` each node publishes (one node-local slice).
    pub devices_per_node: usize,
    pub driver: &'a str,
}

/// A running cluster-autoscaler and the harness's kubelet for its nodes.
#[derive(Debug)]
pub struct Autoscaler {
    pub proc: Proc,
    pub port: u16,
    kubelet: tokio::task::JoinHandle<()>,
}

impl Drop for Autoscaler {
    fn drop(&mut self) {
        self.kubelet.abort();
    }
}

impl Autoscaler {
    /// Creates the group's first node (`<group>-0`: Ready, with its slice,
    /// labelled and annotated as the kwok provider expects), the provider's
    /// ConfigMap, and starts cluster-autoscaler with the settings of a DRA
    /// cluster (its expendable-pods cutoff left at -10), a 1 s scan interval
    /// and scale-down off. Returns once it serves `/health-check`.
    pub async fn start(
        binary: &Path,
        cluster: &Cluster,
        admin: &kube::Client,
        group: NodeGroup<'_>,
    ) -> anyhow::Result<Self> {
        Self::start_with(binary, cluster, admin, group, &[]).await
    }

    /// As [`Autoscaler::start`], with further flags (CapacityBuffers on,
    /// say).
    pub async fn start_with(
        binary: &Path,
        cluster: &Cluster,
        admin: &kube::Client,
        group: NodeGroup<'_>,
        extra_args: &[&str],
    ) -> anyhow::Result<Self> {
        let first = format!("{}-0", group.name);
        crate::nodes::create_schedulable_node(admin, &first).await?;
        Api::<Node>::all(admin.clone())
            .patch(
                &first,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": {
                        "labels": {NODE_GROUP_LABEL: group.name},
                        "annotations": {
                            "cluster-autoscaler.kwok.nodegroup/name": group.name,
                            "cluster-autoscaler.kwok.nodegroup/min-count": group.min.to_string(),
                            "cluster-autoscaler.kwok.nodegroup/max-count": group.max.to_string(),
                            "cluster-autoscaler.kwok.nodegroup/desired-count": "1",
                        },
                    },
                    "spec": {"providerID": format!("kwok:{first}")},
                })),
            )
            .await
            .context("labelling the node group's first node")?;
        crate::nodes::create_devices(admin, group.driver, &first, group.devices_per_node).await?;
        let config = format!(
            "apiVersion: v1alpha1\nreadNodesFrom: cluster\nnodegroups:\n  fromNodeLabelKey: \"{NODE_GROUP_LABEL}\"\nnodes:\n  skipTaint: true\n"
        );
        Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "kwok-provider-config"},
                    "data": {"config": config},
                }))?,
            )
            .await
            .context("creating kube-system/kwok-provider-config")?;
        let kubelet = tokio::spawn(play_kubelet(
            admin.clone(),
            group.name.to_string(),
            group.driver.to_string(),
            group.devices_per_node,
        ));
        let mut last_err = anyhow::anyhow!("cluster-autoscaler never started");
        for attempt in 0..3 {
            let port = free_port();
            let args = vec![
                "--cloud-provider=kwok".to_string(),
                format!("--kubeconfig={}", cluster.admin_kubeconfig.display()),
                "--namespace=kube-system".into(),
                format!("--address=127.0.0.1:{port}"),
                "--leader-elect=false".into(),
                "--scan-interval=1s".into(),
                "--scale-down-enabled=false".into(),
                "--max-nodes-total=8".into(),
                "--v=4".into(),
            ];
            let args: Vec<String> = args
                .into_iter()
                .chain(extra_args.iter().map(|a| a.to_string()))
                .collect();
            let log = cluster
                .dir
                .join(format!("cluster-autoscaler-{attempt}.log"));
            // In local mode the kwok provider builds its own client from
            // $KUBECONFIG (not from --kubeconfig).
            let kubeconfig = cluster.admin_kubeconfig.display().to_string();
            let env = [
                ("KWOK_PROVIDER_MODE", "local"),
                ("POD_NAMESPACE", "kube-system"),
                ("KUBECONFIG", kubeconfig.as_str()),
            ];
            let proc = Proc::spawn_with_env("cluster-autoscaler", binary, &args, &env, &log)?;
            match wait_healthy(&proc, port).await {
                Ok(()) => {
                    return Ok(Self {
                        proc,
                        port,
                        kubelet,
                    });
                }
                Err(e) if proc.exited().is_some() => last_err = e,
                Err(e) => return Err(e),
            }
        }
        kubelet.abort();
        Err(last_err)
    }

    /// The log lines that contain `needle` (the last `max` of them).
    pub fn grep(&self, needle: &str, max: usize) -> String {
        crate::procs::grep(&self.proc.log, needle, max)
    }
}

/// Waits until `/health-check` on the metrics address answers 200.
async fn wait_healthy(proc: &Proc, port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = proc.exited() {
            bail!("{} exited ({status}):\n{}", proc.name, proc.log_tail(30));
        }
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        if crate::rawhttp::get(addr, "/health-check")
            .await
            .is_ok_and(|(code, _)| code == 200)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} /health-check not 200 after {READY_TIMEOUT:?}:\n{}",
                proc.name,
                proc.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reports the pods bound to `nodes` Running and Ready, as their kubelet
/// would once the containers started: Deployments (the placeholders')
/// count them available and can roll out.
async fn start_bound_pods(admin: &kube::Client, nodes: &HashSet<String>) {
    let pods: Api<Pod> = Api::all(admin.clone());
    let Ok(list) = pods.list(&ListParams::default()).await else {
        return;
    };
    for pod in list {
        let bound_here = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some_and(|n| nodes.contains(n));
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if !bound_here || phase == Some("Running") || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            continue;
        };
        let now = "2026-01-01T00:00:00Z";
        let ready =
            |type_: &str| json!({"type": type_, "status": "True", "lastTransitionTime": now});
        let _ = Api::<Pod>::namespaced(admin.clone(), ns)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {
                    "phase": "Running",
                    "conditions": [ready("Initialized"), ready("ContainersReady"), ready("Ready")],
                }})),
            )
            .await;
    }
}

/// The kubelet and DRA driver of every node of the group, the first one
/// included: each new node is reported Ready, loses the not-ready taint
/// and gets its node-local slice, once.
async fn play_kubelet(admin: kube::Client, group: String, driver: String, devices: usize) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let selector = format!("{NODE_GROUP_LABEL}={group}");
    let mut ready: HashSet<String> = HashSet::new();
    loop {
        if let Ok(list) = nodes.list(&ListParams::default().labels(&selector)).await {
            for node in list {
                let Some(name) = node.metadata.name else {
                    continue;
                };
                if ready.contains(&name) {
                    continue;
                }
                let slice = crate::nodes::create_devices(&admin, &driver, &name, devices).await;
                let slice_ok = match &slice {
                    Ok(()) => true,
                    Err(e) => e
                        .downcast_ref::<kube::Error>()
                        .is_some_and(|e| matches!(e, kube::Error::Api(s) if s.code == 409)),
                };
                if slice_ok && crate::nodes::report_ready(&admin, &name).await.is_ok() {
                    ready.insert(name);
                }
            }
        }
        start_bound_pods(&admin, &ready).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
