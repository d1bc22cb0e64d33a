//! Processes dying under a batch: kube-apiserver and etcd restarted (same
//! ports, same data) while the controller works, and the controller itself
//! SIGKILLed again and again at random points. Claims are neither lost nor
//! doubled, and everything is released once the pods are done.

use std::time::Duration;

use anyhow::ensure;
use futures::TryStreamExt;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use rand::Rng;

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::faults::{Batch, BatchRun, CONVERGE, Tally};
use crate::invariants::Report;
use crate::k8s::wait_for;

const PODS: usize = 120;

#[derive(Debug, Clone, Copy)]
pub enum Victim {
    Apiserver,
    Etcd,
}

/// Waits until `done(recorded entries, claims left)` says the batch is
/// part-way, so the restart lands in the middle of the controller's work;
/// returns where it stood.
async fn wait_part_way(
    t: &TestCtx,
    batch: &Batch,
    what: &str,
    done: impl Fn(usize, usize) -> bool,
) -> String {
    wait_for(what, CONVERGE, async || {
        let recorded = batch.recorded_entries(t).await?;
        let claims = t.all_claims().await?.len();
        ensure!(
            done(recorded, claims),
            "{recorded} recorded, {claims} claims"
        );
        Ok(format!(
            "{recorded} entries recorded, {claims} claims exist"
        ))
    })
    .await
}

pub async fn restart(t: &mut TestCtx, victim: Victim, at: &str) {
    let cluster = &mut t.isolated_env().cluster;
    let downtime = Duration::from_secs(2);
    let took = match victim {
        Victim::Apiserver => cluster.restart_apiserver(downtime).await,
        Victim::Etcd => cluster.restart_etcd(downtime).await,
    }
    .unwrap_or_else(|e| panic!("restart {victim:?}: {e:#}"));
    eprintln!(
        "e2e: {}: {victim:?} restarted with {at}, API unavailable for {:.1}s",
        t.name,
        took.as_secs_f64()
    );
}

/// One batch, with `victim` restarted once while claims are being created
/// and once while they are being released.
async fn batch_with_restarts(name: &'static str, victim: Victim) {
    // A lower budget than the other scenarios' so the batch takes long
    // enough for a restart to land in its middle.
    let opts = ControllerOpts {
        qps: 40,
        burst: 40,
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated(name, opts, 1).await else {
        return;
    };
    let run = BatchRun::start(&t, name, PODS).await;
    run.batch.create_pods(&t).await;
    let at = wait_part_way(
        &t,
        &run.batch,
        "a quarter of the claims recorded",
        |recorded, _| recorded >= PODS / 2,
    )
    .await;
    restart(&mut t, victim, &at).await;
    let created = run.check_created(&t).await;

    let expect = run.allocate(&t).await;
    run.batch.mark_done(&t).await;
    let at = wait_part_way(
        &t,
        &run.batch,
        "a quarter of the claims released",
        |_, claims| claims <= PODS * 2 * 3 / 4,
    )
    .await;
    restart(&mut t, victim, &at).await;
    let done = run.check_released(&t, &expect).await;

    let tally = Tally {
        restart: 2,
        ..Tally::default()
    };
    finish(t, name, &run, tally, &created, &done);
}

/// Prints the scenario's `FAULTS:` line (the faults in `tally`, plus the
/// violations and counts) and asserts that both checks passed and that
/// every (pod, entry) got exactly one claim.
fn finish(t: TestCtx, name: &str, run: &BatchRun, tally: Tally, created: &Report, done: &Report) {
    let pods = run.batch.pods;
    Tally {
        violations: created.violations.len() + done.violations.len(),
        ..tally
    }
    .with("ctl_restarts", t.restarts())
    .with("claims_seen", run.ledger.claims_seen())
    .print(name);
    assert_ok(&[
        ("after creation", created),
        ("after all pods are done", done),
    ]);
    assert_eq!(
        run.ledger.claims_seen(),
        pods * 2,
        "one claim per (pod, entry), ever"
    );
    t.finish();
}

fn assert_ok(reports: &[(&str, &Report)]) {
    for (what, r) in reports {
        assert!(r.ok(), "{what}: {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_survives_apiserver_restarts() {
    batch_with_restarts("batch_survives_apiserver_restarts", Victim::Apiserver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_survives_etcd_restarts() {
    batch_with_restarts("batch_survives_etcd_restarts", Victim::Etcd).await;
}

/// Resolves on the next change to any claim of the namespace: a kill
/// point right after a write (e.g. between a claim's creation and the
/// status write that records it).
async fn next_claim_write(t: &TestCtx) -> anyhow::Result<()> {
    let api: Api<ResourceClaim> = Api::namespaced(t.client.clone(), &t.ns);
    let rv = api
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut events = Box::pin(api.watch(&WatchParams::default().timeout(10), &rv).await?);
    while let Some(event) = events.try_next().await? {
        if !matches!(event, WatchEvent::Bookmark(_)) {
            return Ok(());
        }
    }
    Ok(())
}

/// SIGKILLs the controller `kills` times, alternating between a random
/// moment and right after its next claim write, each time waiting for the
/// supervisor to start it again (as a Deployment would).
pub async fn kill_repeatedly(t: &TestCtx, kills: usize) -> usize {
    let replica = t.replica(0);
    for i in 0..kills {
        if i % 2 == 0 {
            let ms = rand::rng().random_range(200..1500);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        } else {
            let _ = tokio::time::timeout(Duration::from_secs(10), next_claim_write(t)).await;
        }
        let before = replica.restarts();
        replica.current().proc.kill();
        wait_for(
            "the supervisor to restart the controller",
            CONVERGE,
            async || {
                ensure!(replica.restarts() > before, "not restarted yet");
                Ok(())
            },
        )
        .await;
    }
    kills
}

/// The controller SIGKILLed six times across a batch: three times while
/// claims are created (adopt before create: no duplicates), three times
/// while they are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_survives_repeated_sigkill() {
    const NAME: &str = "batch_survives_repeated_sigkill";
    // Without leader election a restarted process works at once instead of
    // waiting out its dead predecessor's lease, so the kills hit work, not
    // waiting; the lease hand-over has a test of its own.
    let opts = ControllerOpts {
        leader_elect: false,
        qps: 60,
        burst: 60,
        ..ControllerOpts::default()
    };
    let Some(t) = TestCtx::isolated(NAME, opts, 1).await else {
        return;
    };
    let run = BatchRun::start(&t, NAME, PODS).await;
    let (_, mut kills) = tokio::join!(run.batch.create_pods(&t), kill_repeatedly(&t, 3));
    let created = run.check_created(&t).await;

    let expect = run.allocate(&t).await;
    let (_, more) = tokio::join!(run.batch.mark_done(&t), kill_repeatedly(&t, 3));
    kills += more;
    let done = run.check_released(&t, &expect).await;

    let tally = Tally {
        kill: kills as u64,
        ..Tally::default()
    };
    finish(t, NAME, &run, tally, &created, &done);
}

/// The API server goes away for 5 s while the pods of a batch are being
/// marked done. The controller keeps its lease (production lease timing),
/// holds its queue while nothing answers instead of failing item by item,
/// logs the outage once, and releases the done pods' claims promptly once
/// the API server answers again: per-item backoff did not grow during the
/// outage and the watches come back within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_outage_converges_promptly() {
    const NAME: &str = "apiserver_outage_converges_promptly";
    const PODS: usize = 60;
    /// Liveness bound (not a speed target; the figure is printed).
    const BOUND: Duration = Duration::from_secs(60);
    let opts = ControllerOpts {
        qps: 40,
        burst: 40,
        lease_timing: ["15s", "10s", "2s"],
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated(NAME, opts, 1).await else {
        return;
    };
    let run = BatchRun::start(&t, NAME, PODS).await;
    run.batch.create_pods(&t).await;
    let created = run.check_created(&t).await;
    let expect = run.allocate(&t).await;

    // The controller has about three writes per claim to do at QPS 40:
    // the outage lands in the middle of that work.
    run.batch.mark_done(&t).await;
    let cluster = &mut t.isolated_env().cluster;
    let took = cluster
        .restart_apiserver(Duration::from_secs(5))
        .await
        .expect("restart the API server");
    let answered_at = std::time::Instant::now();
    let left = t.all_claims().await.map(|c| c.len()).unwrap_or_default();
    eprintln!(
        "e2e: {NAME}: API server unavailable for {:.1}s; {left} claims left when it answered",
        took.as_secs_f64()
    );
    wait_for("every claim released", BOUND, async || {
        let left = t.all_claims().await?.len();
        ensure!(left == 0, "{left} claims left");
        Ok(())
    })
    .await;
    let converged = answered_at.elapsed();
    let done = run.check_released(&t, &expect).await;
    let log = t.replica(0).current().proc.log.clone();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let outages = text
        .lines()
        .filter(|l| l.contains("holding work until it answers"))
        .count();
    let failed_syncs = text
        .lines()
        .filter(|l| l.contains("sync failed") && l.contains("unreachable"))
        .count();
    println!(
        "OUTAGE: {NAME}: claims of done pods released {:.1}s after the API server answered again \
         ({outages} outage line(s), {failed_syncs} per-item failure line(s), {} controller restart(s))",
        converged.as_secs_f64(),
        t.restarts()
    );
    assert_eq!(
        failed_syncs, 0,
        "an unreachable API server is not a failure of each item"
    );
    assert!(outages >= 1, "the outage was not logged");
    finish(
        t,
        NAME,
        &run,
        Tally {
            restart: 1,
            ..Tally::default()
        },
        &created,
        &done,
    );
}
