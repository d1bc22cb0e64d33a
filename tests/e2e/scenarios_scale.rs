//! Batches, crashes, leader hand-over and metrics.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::*;
use crate::rawhttp::{metric_sum, metric_value};
use crate::rbac::{LEASE_NAME, SYSTEM_NAMESPACE};

const BATCH_PODS: usize = 200;
/// Batches take longer than single pods; still only a bound, not a speed test.
const BATCH_TIMEOUT: Duration = Duration::from_secs(240);

async fn create_batch(t: &TestCtx, pods: usize) {
    futures::stream::iter(0..pods)
        .map(|i| async move {
            t.create_pod(
                &format!("batch-{i:03}"),
                &[
                    ("a", Source::Template("tmpl-a")),
                    ("b", Source::Template("tmpl-b")),
                ],
                None,
            )
            .await
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

/// Every pod records two claims it controls, and there are no other claims.
async fn check_batch(t: &TestCtx, pods: usize) -> anyhow::Result<()> {
    let pod_list = t.pods().list(&ListParams::default()).await?.items;
    ensure!(pod_list.len() == pods, "{} pods", pod_list.len());
    let claims = t.all_claims().await?;
    let by_name: std::collections::BTreeMap<_, _> = claims
        .iter()
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
        .collect();
    let mut recorded_names = BTreeSet::new();
    let mut missing = 0;
    for pod in &pod_list {
        let statuses = recorded(pod);
        for entry in ["a", "b"] {
            let Some(Some(name)) = statuses.get(entry) else {
                missing += 1;
                continue;
            };
            let claim = by_name
                .get(name)
                .with_context(|| format!("recorded claim {name} does not exist"))?;
            ensure!(
                controlled_by(claim, &uid(pod)),
                "{name} not controlled by its pod"
            );
            recorded_names.insert(name.clone());
        }
    }
    ensure!(
        missing == 0,
        "{missing} of {} entries not recorded yet ({} claims)",
        pods * 2,
        claims.len()
    );
    ensure!(
        recorded_names.len() == pods * 2,
        "{} distinct recorded claims",
        recorded_names.len()
    );
    ensure!(
        claims.len() == pods * 2,
        "{} claims for {} recorded entries (duplicates)",
        claims.len(),
        pods * 2
    );
    Ok(())
}

/// 200 pods × 2 template entries: exactly 400 claims and 400 recorded statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_of_200_pods_gets_exactly_400_claims() {
    let Some(t) = TestCtx::shared("batch_of_200_pods_gets_exactly_400_claims").await else {
        return;
    };
    t.create_template("tmpl-a").await;
    t.create_template("tmpl-b").await;
    create_batch(&t, BATCH_PODS).await;
    wait_for(
        "400 claims recorded for 200 pods",
        BATCH_TIMEOUT,
        async || check_batch(&t, BATCH_PODS).await,
    )
    .await;
    holds_for("exactly 400 claims", Duration::from_secs(3), async || {
        check_batch(&t, BATCH_PODS).await
    })
    .await;
    t.finish();
}

/// The controller is SIGKILLed in the middle of the batch and restarted:
/// claims created but not yet recorded are adopted, never duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_survives_controller_sigkill() {
    let Some(mut t) = TestCtx::isolated(
        "batch_survives_controller_sigkill",
        ControllerOpts::default(),
        1,
    )
    .await
    else {
        return;
    };
    t.create_template("tmpl-a").await;
    t.create_template("tmpl-b").await;

    let killer = async {
        let claims = wait_for(
            "the controller to be part-way through the batch",
            BATCH_TIMEOUT,
            async || {
                let n = t.all_claims().await?.len();
                ensure!(n >= BATCH_PODS / 2, "{n} claims so far");
                Ok(n)
            },
        )
        .await;
        t.replica(0).kill();
        claims
    };
    let (_, claims_at_kill) = tokio::join!(create_batch(&t, BATCH_PODS), killer);
    eprintln!(
        "e2e: controller SIGKILLed with {claims_at_kill} of {} claims created",
        BATCH_PODS * 2
    );
    t.isolated_env()
        .start_controller()
        .await
        .expect("restart the controller");

    wait_for(
        "400 claims recorded for 200 pods after the restart",
        BATCH_TIMEOUT,
        async || check_batch(&t, BATCH_PODS).await,
    )
    .await;
    holds_for("exactly 400 claims", Duration::from_secs(3), async || {
        check_batch(&t, BATCH_PODS).await
    })
    .await;
    t.finish();
}

async fn lease_holder(t: &TestCtx) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(t.client.clone(), SYSTEM_NAMESPACE);
    Ok(leases
        .get_opt(LEASE_NAME)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// With two replicas, work goes on when either dies: SIGTERM is a clean
/// exit, a SIGKILLed leader is replaced once its lease expires, and a clean
/// shutdown of the leader releases the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover() {
    let Some(mut t) = TestCtx::isolated("leader_failover", ControllerOpts::default(), 2).await
    else {
        return;
    };
    t.create_template("tmpl").await;
    t.create_pod("before", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    t.wait_recorded("before", &["gpu"]).await;
    wait_for("a lease holder", TIMEOUT, async || {
        lease_holder(&t).await?.context("no holder")
    })
    .await;

    let first = t.replica(0);
    first.terminate();
    let status = first
        .current()
        .proc
        .wait_exit(Duration::from_secs(30))
        .await;
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM must lead to a clean exit within the shutdown timeout, got {status:?}"
    );
    t.create_pod("after-term", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    t.wait_recorded("after-term", &["gpu"]).await;

    // Only the second replica is left: it leads. Crash it, start a third.
    let holder = wait_for(
        "the second replica to hold the lease",
        TIMEOUT,
        async || lease_holder(&t).await?.context("no holder"),
    )
    .await;
    t.replica(1).kill();
    t.isolated_env()
        .start_controller()
        .await
        .expect("start a third replica");
    t.create_pod("after-kill", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    t.wait_recorded("after-kill", &["gpu"]).await;
    let new_holder = wait_for("a new lease holder", TIMEOUT, async || {
        let h = lease_holder(&t).await?.context("no holder")?;
        ensure!(h != holder, "still held by the killed replica {holder}");
        Ok(h)
    })
    .await;

    let third = t.replica(2);
    third.terminate();
    let status = third
        .current()
        .proc
        .wait_exit(Duration::from_secs(30))
        .await;
    assert!(
        status.is_some_and(|s| s.success()),
        "clean exit, got {status:?}"
    );
    let after = lease_holder(&t).await.expect("read lease");
    assert!(
        after.is_none(),
        "a leader shutting down cleanly must release the lease; still held by {after:?} (was {new_holder})"
    );
    t.finish();
}

/// /metrics carries the client-go workqueue metrics and the creation counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_exposed() {
    // Isolated: a restart of the shared controller would reset its counters.
    let Some(t) = TestCtx::isolated("metrics_are_exposed", ControllerOpts::default(), 1).await
    else {
        return;
    };
    t.create_template("tmpl").await;
    t.create_pod("measured", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    t.wait_recorded("measured", &["gpu"]).await;

    let text = wait_for("metrics to count the creation", TIMEOUT, async || {
        let text = t.controller().metrics_text().await?;
        let adds = metric_value(&text, "workqueue_adds_total", &["name=\"resource_claim\""])
            .context("no workqueue_adds_total{name=\"resource_claim\"}")?;
        ensure!(adds > 0.0, "workqueue_adds_total = {adds}");
        ensure!(
            metric_sum(&text, "resourceclaim_controller_creates_total") >= 1.0,
            "resourceclaim_controller_creates_total missing or 0"
        );
        Ok(text)
    })
    .await;
    for name in [
        "workqueue_depth",
        "workqueue_queue_duration_seconds_bucket",
        "workqueue_work_duration_seconds_bucket",
    ] {
        assert!(
            metric_value(&text, name, &["name=\"resource_claim\""]).is_some(),
            "{name}{{name=\"resource_claim\"}} missing from /metrics"
        );
    }
    assert_eq!(t.controller().healthz().await.expect("GET /healthz"), 200);
    t.finish();
}
