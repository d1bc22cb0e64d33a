//! `kubectl dra drain` as `kubectl drain` for devices, against a real
//! control plane: kube-scheduler allocating devices, kube-controller-manager's
//! deployment, replicaset and disruption controllers, ours, and a stand-in
//! kubelet that reports placed pods Ready and confirms deletions. A
//! Deployment of 3 device pods under a PodDisruptionBudget `minAvailable: 2`
//! is drained off its node: never fewer than 2 pods available, all 3 moved.
//! Then a budget that allows nothing holds the next drain, which exits
//! non-zero naming it; `--disable-eviction` deletes at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::ensure;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cluster::{ALL_CONTROLLER_GATES, ControllerOpts};
use crate::ctx::TestCtx;
use crate::device_taint_budgets::{create_budget, set_min_available, until_budget_allows};
use crate::device_taints::rules_apiserver;
use crate::k8s::*;

const DRIVER: &str = "drain.example.com";
const TIMEOUT: Duration = Duration::from_secs(90);

/// Background tasks of the test, stopped with it (also when it fails).
pub struct Background(pub Vec<tokio::task::JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        self.0.iter().for_each(|task| task.abort());
    }
}

/// Whether the pod counts as available: Ready and not being deleted.
fn available(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Available pods of the Deployment, by node.
async fn available_on(pods: &Api<Pod>) -> anyhow::Result<Vec<String>> {
    let list = pods.list(&ListParams::default().labels("app=web")).await?;
    Ok(list
        .items
        .iter()
        .filter(|p| available(p))
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect())
}

/// What a kubelet does for the fake nodes, until `stop`: a pod placed on a
/// node is reported Running and Ready; a pod being deleted is confirmed
/// gone (its containers stopped at once).
pub fn stand_in_kubelet(pods: Api<Pod>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let Ok(list) = pods.list(&ListParams::default()).await else {
                continue;
            };
            for pod in list.items {
                let name = pod.metadata.name.clone().unwrap_or_default();
                if pod.metadata.deletion_timestamp.is_some() {
                    let _ = pods
                        .delete(&name, &DeleteParams::default().grace_period(0))
                        .await;
                    continue;
                }
                let placed = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
                if placed && !available(&pod) {
                    let now = "2026-01-01T00:00:00Z";
                    let status = json!({"status": {"phase": "Running", "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    ]}});
                    let _ = pods
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                        .await;
                }
            }
        }
    })
}

/// `kubectl cordon NODE`.
async fn cordon_node(admin: &kube::Client, node: &str) {
    Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
}

/// Samples the Deployment's available pods until `stop`; the fewest seen.
fn fewest_available(
    pods: Api<Pod>,
    stop: Arc<AtomicBool>,
) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    let fewest = Arc::new(AtomicUsize::new(usize::MAX));
    let seen = fewest.clone();
    let handle = tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(on) = available_on(&pods).await {
                seen.fetch_min(on.len(), Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (handle, fewest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_drained_under_its_budget_never_drops_below_it() {
    const NAME: &str = "a_deployment_drained_under_its_budget_never_drops_below_it";
    let Some(scheduler_bin) = crate::scheduler::binary_or_skip(NAME) else {
        return;
    };
    let Some(kcm) = crate::reference::binary_or_skip(NAME) else {
        return;
    };
    let opts = ControllerOpts {
        feature_gates: format!("{ALL_CONTROLLER_GATES},DRADeviceTaintRules=true"),
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated_with(NAME, opts, 1, &rules_apiserver()).await else {
        return;
    };
    let cluster = &t.isolated_env().cluster;
    let admin_kubeconfig = cluster.admin_kubeconfig.clone();
    let admin = cluster.admin_client().await.unwrap();
    let _scheduler = crate::scheduler::Scheduler::start_with(
        &scheduler_bin,
        cluster,
        &["--feature-gates=DRADeviceTaints=true,DRADeviceTaintRules=true".into()],
    )
    .await
    .expect("kube-scheduler");
    let _control_plane = crate::reference::Reference::start_controllers(
        &kcm,
        cluster,
        &[
            "deployment-controller",
            "replicaset-controller",
            "disruption-controller",
        ],
    )
    .await
    .expect("kube-controller-manager");
    crate::nodes::create_device_class(&admin, DRIVER)
        .await
        .unwrap();
    crate::nodes::create_schedulable_node(&admin, "node-a")
        .await
        .unwrap();
    crate::nodes::create_devices(&admin, DRIVER, "node-a", 3)
        .await
        .unwrap();

    let ns = t.ns.clone();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let stop = Arc::new(AtomicBool::new(false));
    let mut background = Background(vec![stand_in_kubelet(pods.clone(), stop.clone())]);
    Api::<ResourceClaimTemplate>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "gpu"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<Deployment>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 3,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {
                            "terminationGracePeriodSeconds": 0,
                            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
                            "containers": [{"name": "c", "image": "busybox",
                                            "resources": {"claims": [{"name": "gpu"}]}}],
                        },
                    },
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), &ns);
    create_budget(&budgets, "web", "web", 2).await;
    wait_for("3 pods available on node-a", TIMEOUT, async || {
        let on = available_on(&pods).await?;
        ensure!(on.len() == 3 && on.iter().all(|n| n == "node-a"), "{on:?}");
        Ok(())
    })
    .await;
    // Room elsewhere, then the drain. The node is cordoned too, as an admin
    // taking it out of service does: this test bed's kube-scheduler 1.36
    // lists DeviceTaintRules but acts on no rule made after its start (its
    // informer delivers no event), so the rules alone would not keep the
    // replacements off node-a's devices.
    crate::nodes::create_schedulable_node(&admin, "node-b")
        .await
        .unwrap();
    crate::nodes::create_devices(&admin, DRIVER, "node-b", 3)
        .await
        .unwrap();
    cordon_node(&admin, "node-a").await;
    let (sampler, fewest) = fewest_available(pods.clone(), stop.clone());
    background.0.push(sampler);
    let drained = crate::drain_check::run_within(
        "kubectl-dra",
        &admin_kubeconfig,
        &[
            "drain",
            "node-a",
            "--driver",
            DRIVER,
            "--timeout",
            "150s",
            "-o",
            "json",
        ],
        Duration::from_secs(180),
    )
    .await;
    assert_eq!(drained.code, 0, "{drained:?}");
    assert_eq!(drained.json()["verdict"], "Clean", "{drained:?}");
    assert!(
        drained.stderr.contains("node node-a cordoned"),
        "{drained:?}"
    );
    wait_for("3 pods available on node-b", TIMEOUT, async || {
        let on = available_on(&pods).await?;
        ensure!(on.len() == 3 && on.iter().all(|n| n == "node-b"), "{on:?}");
        Ok(())
    })
    .await;
    let fewest_seen = fewest.load(Ordering::Relaxed);
    assert!(
        fewest_seen >= 2,
        "the budget was broken: {fewest_seen} pods available at one point"
    );

    // A budget that allows nothing: the drain of node-b is held, and says
    // by what once its time is up.
    set_min_available(&budgets, "web", 3).await;
    until_budget_allows(&budgets, "web", 0).await;
    cordon_node(&admin, "node-b").await;
    let held = crate::drain_check::run_within(
        "kubectl-dra",
        &admin_kubeconfig,
        &["drain", "node-b", "--driver", DRIVER, "--timeout", "20s"],
        Duration::from_secs(60),
    )
    .await;
    assert_ne!(held.code, 0, "{held:?}");
    assert!(
        held.stderr
            .contains(&format!("waiting for PodDisruptionBudget {ns}/web")),
        "the drain names the budget holding it: {held:?}"
    );
    let on = available_on(&pods).await.unwrap();
    assert_eq!(on.len(), 3, "nobody evicted while the budget holds: {on:?}");

    // --disable-eviction deletes, whatever the budget says.
    let forced = crate::drain_check::run_within(
        "kubectl-dra",
        &admin_kubeconfig,
        &[
            "drain",
            "node-b",
            "--driver",
            DRIVER,
            "--disable-eviction",
            "--timeout",
            "10s",
            "-o",
            "json",
        ],
        Duration::from_secs(40),
    )
    .await;
    assert_eq!(forced.code, 0, "{forced:?}");
    assert_eq!(forced.json()["verdict"], "Clean", "{forced:?}");
    let on = available_on(&pods).await.unwrap();
    assert!(on.iter().all(|n| n != "node-b"), "{on:?}");

    stop.store(true, Ordering::Relaxed);
    drop(background);
    t.finish();
}
