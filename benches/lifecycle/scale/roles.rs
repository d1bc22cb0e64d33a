//! The parts of a cluster the scale test plays itself: the job controller
//! (pods created at a steady rate, churn pods replaced as they finish), the
//! kubelet (bound pods Running, churn pods Succeeded, then deleted), the
//! watches that time pods and claims, and the objects a run starts with.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;

use super::{CLASS, NAMESPACE, ScaleArgs, TEMPLATE, World, lock};

/// The job controller: creates pods at `job_qps`, long-lived first mixed
/// with the first churn round, then replacements as churn pods finish;
/// returns once every pod ran (or the run timed out).
pub(super) async fn create_at_pace(
    client: &kube::Client,
    world: &Arc<Mutex<World>>,
    s: &ScaleArgs,
    total: usize,
) -> bool {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(s.run_timeout);
    let mut queue: VecDeque<bool> = VecDeque::new();
    // Interleave the first churn round with the long-lived pods.
    let every = (s.long_lived / s.churn.max(1)).max(1);
    let mut churn_left = s.churn;
    for i in 0..s.long_lived {
        queue.push_back(false);
        if churn_left > 0 && i % every == 0 {
            queue.push_back(true);
            churn_left -= 1;
        }
    }
    queue.extend(std::iter::repeat_n(true, churn_left));
    let mut replacements_left = s.churn * s.churn_rounds.saturating_sub(1);
    let mut created = 0;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / s.job_qps.max(0.1)));
    while Instant::now() < deadline {
        {
            let mut w = lock(world);
            let due = w.replacements_due.min(replacements_left);
            w.replacements_due -= due;
            replacements_left -= due;
            queue.extend(std::iter::repeat_n(true, due));
        }
        let done_running = {
            let w = lock(world);
            w.churn_finished >= s.churn * s.churn_rounds
                && w.pods
                    .values()
                    .filter(|p| !p.churn && p.bound.is_some())
                    .count()
                    >= s.long_lived
        };
        if done_running && created >= total {
            return true;
        }
        let Some(churn) = queue.pop_front() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        tick.tick().await;
        let name = format!("{}-{created:05}", if churn { "churn" } else { "long" });
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"scale": if churn { "churn" } else { "long" }}},
            "spec": {
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "dev"}]}}],
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": TEMPLATE}],
                "terminationGracePeriodSeconds": 0,
            },
        }))
        .expect("pod manifest");
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => {
                let mut w = lock(world);
                let t = w.pods.entry(name).or_default();
                t.created = Some(Instant::now());
                t.churn = churn;
                created += 1;
            }
            Err(e) => {
                eprintln!("scale: create {name}: {e}");
                queue.push_front(churn);
            }
        }
    }
    false
}

/// The kubelet: bound pods start after the start delay; churn pods succeed
/// after their run time and are deleted once their claim is gone (or after
/// a minute). Also records when claims are recorded and pods bound.
pub(super) async fn watch_pods(client: kube::Client, world: Arc<Mutex<World>>, s: ScaleArgs) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let stream = watcher::watcher(pods.clone(), watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let (Ok(Event::Apply(pod)) | Ok(Event::InitApply(pod))) = event else {
            continue;
        };
        let now = Instant::now();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let claim = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .and_then(|s| s.first())
            .and_then(|s| s.resource_claim_name.clone());
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .is_some();
        let newly_bound = {
            let mut w = lock(&world);
            let t = w.pods.entry(name.clone()).or_default();
            if claim.is_some() && t.recorded.is_none() {
                t.recorded = Some(now);
                t.claim = claim;
            }
            let newly = bound && t.bound.is_none();
            if newly {
                t.bound = Some(now);
            }
            newly.then_some(t.churn)
        };
        if let Some(churn) = newly_bound {
            tokio::spawn(kubelet(pods.clone(), world.clone(), name, churn, s.clone()));
        }
    }
}

async fn set_phase(pods: &Api<Pod>, name: &str, phase: &str) -> kube::Result<()> {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase}})),
    )
    .await
    .map(|_| ())
}

async fn kubelet(
    pods: Api<Pod>,
    world: Arc<Mutex<World>>,
    name: String,
    churn: bool,
    s: ScaleArgs,
) {
    tokio::time::sleep(Duration::from_secs_f64(s.start_delay)).await;
    if let Err(e) = set_phase(&pods, &name, "Running").await {
        eprintln!("scale: start {name}: {e}");
    }
    if !churn {
        return;
    }
    tokio::time::sleep(Duration::from_secs_f64(s.run_seconds)).await;
    if let Err(e) = set_phase(&pods, &name, "Succeeded").await {
        eprintln!("scale: finish {name}: {e}");
        return;
    }
    let claim = {
        let mut w = lock(&world);
        w.replacements_due += 1;
        w.churn_finished += 1;
        let t = w.pods.entry(name.clone()).or_default();
        t.done = Some(Instant::now());
        t.claim.clone()
    };
    // Clean up the finished pod once the claim controller released its
    // claim (no garbage collector runs here to do it instead).
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let gone = claim
            .as_ref()
            .is_none_or(|c| lock(&world).claim_deleted.contains_key(c));
        if gone {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = pods
        .delete(
            &name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
}

pub(super) async fn watch_claims(client: kube::Client, world: Arc<Mutex<World>>) {
    let claims: Api<ResourceClaim> = Api::namespaced(client, NAMESPACE);
    let stream = watcher::watcher(claims, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        if let Ok(Event::Delete(claim)) = event
            && let Some(name) = claim.metadata.name
        {
            lock(&world)
                .claim_deleted
                .entry(name)
                .or_insert_with(Instant::now);
        }
    }
}

/// Namespace, DeviceClass, template, Nodes (Ready, untainted, room for
/// pods) and one node-local ResourceSlice per node.
pub(super) async fn prepare(client: &kube::Client, s: &ScaleArgs) -> anyhow::Result<()> {
    let pp = PostParams::default();
    create_namespace(client, NAMESPACE).await?;
    dra_e2e::nodes::create_device_class(client, CLASS).await?;
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), NAMESPACE)
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": TEMPLATE}, "spec": {"spec": {
                "devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": CLASS}}]}}}}))?,
        )
        .await?;
    let mut work = futures::stream::iter(0..s.nodes)
        .map(|i| async move {
            let name = format!("node-{i:03}");
            dra_e2e::nodes::create_schedulable_node(client, &name).await?;
            dra_e2e::nodes::create_devices(client, CLASS, &name, s.devices_per_node).await
        })
        .buffer_unordered(16);
    while let Some(r) = work.next().await {
        r?;
    }
    Ok(())
}

pub async fn create_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await?;
    Ok(())
}
