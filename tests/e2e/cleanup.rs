//! The two-write cleanup of a finished pod's generated claim (delete with
//! preconditions, then the delete-protection finalizer), against a real
//! kube-scheduler: the freed device goes to the next pod, and a controller
//! killed between the two writes leaves nothing behind once it is back.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::fault_proxy::FaultPlan;
use crate::faults_api::controller_behind_proxy;
use crate::headroom::{bound_to, gpu_job, gpu_job_template, priority_classes};
use crate::k8s::wait_for;

const DRIVER: &str = "gpu.example.com";
const WAIT: Duration = Duration::from_secs(60);

/// The name of the claim recorded for the pod's `gpu` entry.
async fn recorded_claim(pods: &Api<Pod>, pod: &str) -> anyhow::Result<String> {
    let pod = pods.get(pod).await?;
    pod.status
        .and_then(|s| s.resource_claim_statuses)
        .into_iter()
        .flatten()
        .find(|s| s.name == "gpu")
        .and_then(|s| s.resource_claim_name)
        .context("no claim recorded yet")
}

/// Waits until `pod` is bound, returning its claim's name.
async fn bound_with_claim(pods: &Api<Pod>, pod: &str) -> String {
    wait_for(&format!("{pod} bound with its claim"), WAIT, async || {
        ensure!(bound_to(pods, pod).await?.is_some(), "{pod} not bound");
        recorded_claim(pods, pod).await
    })
    .await
}

async fn wait_gone(claims: &Api<ResourceClaim>, name: &str) {
    wait_for(&format!("claim {name} deleted"), WAIT, async || {
        ensure!(claims.get_opt(name).await?.is_none(), "{name} still there");
        Ok(())
    })
    .await;
}

/// One node with one device; pods in turn need it. While no pod waits, a
/// finished pod's claim goes in two writes (delete, finalizer) and the next
/// pod binds at once; the controller killed between those two writes (the
/// proxy holds the second) leaves a claim being deleted that its successor
/// removes with the finalizer alone. While a pod waits for the device, the
/// deallocation comes first and the waiting pod binds without sitting out
/// kube-scheduler's 5-minute flush (it is not retried on a claim deletion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_pods_free_their_device_even_when_killed_between_writes() {
    const NAME: &str = "finished_pods_free_their_device_even_when_killed_between_writes";
    let Some(scheduler_bin) = crate::scheduler::binary_or_skip(NAME) else {
        return;
    };
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    priority_classes(&admin).await;
    crate::nodes::create_device_class(&admin, DRIVER)
        .await
        .unwrap();
    crate::nodes::create_schedulable_node(&admin, "gpu-1")
        .await
        .unwrap();
    crate::nodes::create_devices(&admin, DRIVER, "gpu-1", 1)
        .await
        .unwrap();
    let proxy = controller_behind_proxy(&mut t, FaultPlan::default()).await;
    let _scheduler = crate::scheduler::Scheduler::start(&scheduler_bin, &t.isolated_env().cluster)
        .await
        .expect("start kube-scheduler");
    gpu_job_template(&t, DRIVER).await;
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.ns);
    let claims: Api<ResourceClaim> = Api::namespaced(t.client.clone(), &t.ns);

    // Nobody waits: two writes, and the next pod binds.
    gpu_job(&pods, "first").await;
    let first_claim = bound_with_claim(&pods, "first").await;
    t.set_pod_phase("first", "Succeeded").await;
    wait_gone(&claims, &first_claim).await;
    gpu_job(&pods, "second").await;
    let second_claim = bound_with_claim(&pods, "second").await;

    // Killed between the delete and the finalizer removal, which never
    // reaches the server.
    proxy.block(
        http::Method::PATCH,
        &format!("/resourceclaims/{second_claim}"),
    );
    t.set_pod_phase("second", "Succeeded").await;
    let between = wait_for(
        "the delete done, the finalizer write held",
        WAIT,
        async || {
            let claim = claims.get(&second_claim).await?;
            ensure!(
                claim.metadata.deletion_timestamp.is_some(),
                "not deleted yet"
            );
            ensure!(proxy.blocked_requests() > 0, "finalizer write not sent yet");
            Ok(claim)
        },
    )
    .await;
    assert!(
        between
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_some(),
        "no deallocation write before the delete while nobody waits"
    );
    t.replica(0).kill();
    proxy.unblock();
    t.isolated_env()
        .start_controller()
        .await
        .expect("start the successor");
    wait_gone(&claims, &second_claim).await;
    gpu_job(&pods, "third").await;
    let third_claim = bound_with_claim(&pods, "third").await;

    // A pod waits for the device: deallocation first, and it binds.
    gpu_job(&pods, "fourth").await;
    wait_for("fourth to wait for the device", WAIT, async || {
        let pod = pods.get("fourth").await?;
        let unschedulable = pod
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False");
        ensure!(unschedulable, "fourth not found unschedulable yet");
        Ok(())
    })
    .await;
    t.set_pod_phase("third", "Succeeded").await;
    wait_gone(&claims, &third_claim).await;
    bound_with_claim(&pods, "fourth").await;
    t.finish();
}
