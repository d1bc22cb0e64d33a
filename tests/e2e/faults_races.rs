//! A second writer racing the controller on `status.reservedFor`: the test
//! plays the scheduler, adding and removing pods with JSON patches guarded
//! by resourceVersion, while it also leaves stale entries behind (pods
//! deleted, done, replaced, or never created) for the controller to clear.
//! The scheduler's live entries must never be lost; the stale ones must go.

use std::collections::BTreeMap;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{DeleteParams, Patch, PatchParams};
use rand::Rng;
use serde_json::{Value, json};

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::faults::{CONVERGE, Tally};
use crate::invariants::{self, Expect};
use crate::k8s::*;

const CLAIM: &str = "shared";
const OPERATIONS: usize = 200;
/// At most this many live reservations (the API allows 256 entries).
const MAX_LIVE: usize = 12;

/// The scheduler's model of the claim, and what it observed.
struct Scheduler<'a> {
    t: &'a TestCtx,
    /// Pods reserved by the scheduler and still running: name → uid.
    live: BTreeMap<String, String>,
    /// Entries the scheduler made stale: uid → why.
    stale: BTreeMap<String, String>,
    next: usize,
    conflicts: u64,
    lost: Vec<String>,
    ops: BTreeMap<&'static str, usize>,
}

fn reserved_uids(claim: &ResourceClaim) -> Vec<String> {
    claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .map(|r| r.uid.clone())
        .collect()
}

fn is_conflict(e: &kube::Error) -> bool {
    // A failed `test` operation is 422 Invalid; a stale resourceVersion 409.
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.code == 422)
}

impl<'a> Scheduler<'a> {
    /// Reads the claim and checks that every live entry is still there.
    async fn read(&mut self) -> anyhow::Result<ResourceClaim> {
        let claim = self.t.claims().get(CLAIM).await?;
        let uids = reserved_uids(&claim);
        let gone: Vec<(String, String)> = self
            .live
            .iter()
            .filter(|(_, uid)| !uids.contains(uid))
            .map(|(n, u)| (n.clone(), u.clone()))
            .collect();
        for (name, uid) in gone {
            self.lost.push(format!(
                "live pod {name} ({uid}) vanished from reservedFor at resourceVersion {:?}",
                claim.metadata.resource_version
            ));
            self.live.remove(&name);
        }
        Ok(claim)
    }

    /// A JSON patch of `reservedFor` guarded by the resourceVersion it was
    /// decided on; re-read and re-decided on every conflict.
    async fn guarded(
        &mut self,
        build: impl Fn(&ResourceClaim) -> Option<Vec<Value>>,
    ) -> anyhow::Result<()> {
        for _ in 0..100 {
            let claim = self.read().await?;
            let Some(mut ops) = build(&claim) else {
                return Ok(());
            };
            let rv = claim.metadata.resource_version.clone().unwrap_or_default();
            ops.insert(
                0,
                json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}),
            );
            let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))?;
            match self
                .t
                .claims()
                .patch_status(CLAIM, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if is_conflict(&e) => self.conflicts += 1,
                Err(e) => return Err(e).context("patch reservedFor"),
            }
        }
        anyhow::bail!("patch reservedFor: 100 conflicts in a row")
    }

    fn count(&mut self, op: &'static str) {
        *self.ops.entry(op).or_default() += 1;
    }

    fn pick_live(&self) -> Option<(String, String)> {
        let i = rand::rng().random_range(0..self.live.len().max(1));
        self.live.iter().nth(i).map(|(n, u)| (n.clone(), u.clone()))
    }

    async fn create_pod(&mut self) -> anyhow::Result<(String, String)> {
        self.next += 1;
        let name = format!("sched-{:03}", self.next);
        let pod = self
            .t
            .try_create_pod(&name, &[("dev", Source::Claim(CLAIM))], None)
            .await?;
        Ok((name, uid(&pod)))
    }

    /// Reserves a new pod, as the scheduler does before binding it.
    async fn add_live(&mut self) -> anyhow::Result<()> {
        let (name, uid) = self.create_pod().await?;
        let entry = json!({"resource": "pods", "name": name, "uid": uid});
        self.guarded(|_| {
            Some(vec![
                json!({"op": "add", "path": "/status/reservedFor/-", "value": entry}),
            ])
        })
        .await?;
        self.live.insert(name, uid);
        self.count("add");
        Ok(())
    }

    /// Removes one of its own live entries (a pod it gave up binding).
    async fn remove_live(&mut self) -> anyhow::Result<()> {
        let Some((name, uid)) = self.pick_live() else {
            return Ok(());
        };
        self.guarded(|claim| {
            let i = reserved_uids(claim).iter().position(|u| *u == uid)?;
            Some(vec![
                json!({"op": "test", "path": format!("/status/reservedFor/{i}/uid"), "value": uid}),
                json!({"op": "remove", "path": format!("/status/reservedFor/{i}")}),
            ])
        })
        .await?;
        self.live.remove(&name);
        self.count("remove");
        Ok(())
    }

    /// Leaves a live entry behind and makes it stale in one of three ways.
    async fn make_stale(&mut self, how: &'static str) -> anyhow::Result<()> {
        let Some((name, uid)) = self.pick_live() else {
            return Ok(());
        };
        let t = self.t;
        // Not live from here on: the controller may remove it at once.
        self.live.remove(&name);
        self.stale.insert(uid, format!("{how} pod {name}"));
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        match how {
            "deleted" => {
                t.pods().delete(&name, &now).await?;
            }
            "done" => {
                t.pods()
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
                    )
                    .await?;
            }
            "replaced" => {
                t.pods().delete(&name, &now).await?;
                wait_for("the replaced pod to be gone", TIMEOUT, async || {
                    ensure!(t.pods().get_opt(&name).await?.is_none(), "still there");
                    Ok(())
                })
                .await;
                t.try_create_pod(&name, &[("dev", Source::Claim(CLAIM))], None)
                    .await?;
            }
            other => unreachable!("{other}"),
        }
        self.count(how);
        Ok(())
    }

    /// Reserves a pod that never existed (a scheduler bug, or a pod deleted
    /// before anyone saw it).
    async fn add_ghost(&mut self) -> anyhow::Result<()> {
        self.next += 1;
        let mut rng = rand::rng();
        let uid = format!(
            "{:08x}-0000-4000-8000-{:012x}",
            rng.random::<u32>(),
            rng.random::<u64>() & 0xffff_ffff_ffff
        );
        let entry =
            json!({"resource": "pods", "name": format!("ghost-{:03}", self.next), "uid": uid});
        self.guarded(|_| {
            Some(vec![
                json!({"op": "add", "path": "/status/reservedFor/-", "value": entry}),
            ])
        })
        .await?;
        self.stale.insert(uid, "never-existing pod".into());
        self.count("ghost");
        Ok(())
    }

    async fn step(&mut self) -> anyhow::Result<()> {
        if self.live.len() < 3 {
            return self.add_live().await;
        }
        let roll = rand::rng().random_range(0..100);
        match roll {
            0..30 if self.live.len() < MAX_LIVE => self.add_live().await,
            0..45 => self.remove_live().await,
            45..60 => self.make_stale("deleted").await,
            60..75 => self.make_stale("done").await,
            75..85 => self.make_stale("replaced").await,
            _ => self.add_ghost().await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_races_controller_on_reserved_for() {
    const NAME: &str = "scheduler_races_controller_on_reserved_for";
    let Some(t) = TestCtx::isolated(NAME, ControllerOpts::default(), 1).await else {
        return;
    };
    // A user's claim, allocated, with a consumer of a kind the controller
    // does not know: it must survive every removal around it, and it keeps
    // the claim in use, so the claim is never deallocated under the race.
    t.create_claim(json!({"name": CLAIM})).await;
    t.allocate(
        CLAIM,
        json!([{"apiGroup": "example.com", "resource": "widgets", "name": "w1",
                "uid": "6c1d3a0e-0000-4000-8000-0000000000aa"}]),
    )
    .await;

    let mut s = Scheduler {
        t: &t,
        live: BTreeMap::new(),
        stale: BTreeMap::new(),
        next: 0,
        conflicts: 0,
        lost: Vec::new(),
        ops: BTreeMap::new(),
    };
    for _ in 0..OPERATIONS {
        s.step()
            .await
            .unwrap_or_else(|e| panic!("scheduler step: {e:#}"));
    }

    // Quiet: every stale entry removed, every live one and the widget kept.
    let live: Vec<String> = s.live.values().cloned().collect();
    let stale = s.stale.clone();
    let claim = wait_for(
        "the stale reservations to be removed",
        CONVERGE,
        async || {
            let c = t.claims().get(CLAIM).await?;
            let uids = reserved_uids(&c);
            let left: Vec<&String> = stale
                .iter()
                .filter(|(u, _)| uids.contains(u))
                .map(|(_, why)| why)
                .collect();
            ensure!(left.is_empty(), "stale entries still reserved: {left:?}");
            Ok(c)
        },
    )
    .await;
    s.read().await.expect("read the claim");
    let report = invariants::check_when_quiet(
        &t,
        &Expect {
            kept_consumers: vec![(CLAIM.into(), "widgets/w1".into())],
            ..Expect::default()
        },
        None,
        CONVERGE,
    )
    .await;
    eprintln!("e2e: {NAME}: invariants: {report}");

    // The race goes both ways: the controller's guarded writes fail too.
    let metrics = t.controller().metrics_text().await.unwrap_or_default();
    let controller_conflicts: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("rest_client_requests_total{"))
        .filter(|l| l.contains("code=\"409\"") || l.contains("code=\"422\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let ops: Vec<String> = s.ops.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    Tally {
        violations: report.violations.len() + s.lost.len(),
        ..Tally::default()
    }
    .with("scheduler_conflicts", s.conflicts)
    .with("controller_conflicts", controller_conflicts)
    .with("live_lost", s.lost.len())
    .with("stale_made", stale.len())
    .with("live_at_end", live.len())
    .with("ops", ops.join(","))
    .print(NAME);

    assert!(s.lost.is_empty(), "live reservations lost: {:#?}", s.lost);
    let uids = reserved_uids(&claim);
    for uid in &live {
        assert!(
            uids.contains(uid),
            "live entry {uid} missing at the end: {uids:?}"
        );
    }
    assert!(is_allocated(&claim), "the claim in use must stay allocated");
    assert!(report.ok(), "{report}");
    t.finish();
}

/// Someone writes the claim (an annotation) after the controller cleared
/// its reservations and allocation but before its finalizer write lands:
/// the guarded finalizer removal fails, and the controller must still
/// release the claim. A later decision cannot see that the removal is owed
/// (an unused, unallocated claim with the finalizer is also what the
/// scheduler leaves between its two allocation writes), so the removal is
/// finished on a fresh read within the same sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizer_removal_survives_a_write_between_status_and_metadata() {
    const NAME: &str = "finalizer_removal_survives_a_write_between_status_and_metadata";
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let proxy = crate::faults_api::controller_behind_proxy(
        &mut t,
        crate::fault_proxy::FaultPlan::default(),
    )
    .await;
    let plain = t.create_pod("plain", &[], None).await;
    t.set_pod_phase("plain", "Succeeded").await;
    t.create_claim(json!({"name": CLAIM})).await;
    proxy.delay(http::Method::PATCH, &format!("/resourceclaims/{CLAIM}"));
    t.allocate(CLAIM, json!([pod_ref(&plain)])).await;

    wait_for(
        "the status cleared and the finalizer write held",
        CONVERGE,
        async || {
            let c = t.claims().get(CLAIM).await?;
            ensure!(reserved_names(&c).is_empty(), "still reserved");
            ensure!(!is_allocated(&c), "still allocated");
            ensure!(proxy.delayed_requests() > 0, "finalizer write not sent yet");
            Ok(())
        },
    )
    .await;
    t.claims()
        .patch(
            CLAIM,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await
        .expect("touch the claim");
    proxy.release_delayed();

    let claim = wait_for("the claim released", CONVERGE, async || {
        let c = t.claims().get(CLAIM).await?;
        ensure_released(&c)?;
        Ok(c)
    })
    .await;
    let annotations = claim.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("touched").map(String::as_str),
        Some("yes"),
        "the other writer's annotation is kept"
    );
    t.finish();
}
