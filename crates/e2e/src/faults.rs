//! Shared pieces of the fault scenarios: the `FAULTS:` summary line, a
//! batch of pods driven through its whole life (claims created, some
//! allocated and reserved, all done, claims released and deleted), and a
//! retry wrapper for the test's own API calls while a server is restarting.

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::ensure;
use futures::StreamExt;
use serde_json::json;

use crate::ctx::TestCtx;
use crate::fault_proxy::Counted;
use crate::invariants::{self, Expect, Ledger, Report};
use crate::k8s::*;

/// Generous bound for a batch to converge under faults; not a speed test.
pub const CONVERGE: Duration = Duration::from_secs(240);

/// Faults a scenario injected, printed as one `FAULTS:` line.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub conflict: u64,
    pub too_many: u64,
    pub internal: u64,
    pub unavailable: u64,
    pub hold: u64,
    pub cut: u64,
    pub gone: u64,
    pub kill: u64,
    pub restart: u64,
    /// TCP connections blackholed (see [`crate::blackhole`]).
    pub blackholed: u64,
    pub violations: usize,
    /// Scenario-specific counts appended to the line.
    pub extra: Vec<(&'static str, String)>,
}

impl Tally {
    pub fn from_proxy(c: &Counted) -> Self {
        Self {
            conflict: c.conflict,
            too_many: c.too_many,
            internal: c.internal,
            unavailable: c.unavailable,
            hold: c.hold,
            cut: c.cut,
            gone: c.gone_event + c.gone_http,
            ..Self::default()
        }
    }

    pub fn with(mut self, key: &'static str, value: impl fmt::Display) -> Self {
        self.extra.push((key, value.to_string()));
        self
    }

    pub fn print(&self, test: &str) {
        let mut line = format!(
            "FAULTS: {test} 409={} 429={} 500={} 503={} hold={} cut={} gone={} kill={} restart={} blackholed={} violations={}",
            self.conflict,
            self.too_many,
            self.internal,
            self.unavailable,
            self.hold,
            self.cut,
            self.gone,
            self.kill,
            self.restart,
            self.blackholed,
            self.violations
        );
        for (k, v) in &self.extra {
            line.push_str(&format!(" {k}={v}"));
        }
        println!("{line}");
    }
}

/// Prints how far into the scenario a phase ended (for the report, not asserted).
pub struct Phases {
    test: &'static str,
    started: Instant,
}

impl Phases {
    pub fn start(test: &'static str) -> Self {
        Self {
            test,
            started: Instant::now(),
        }
    }

    pub fn done(&self, phase: &str) {
        eprintln!(
            "e2e: {}: {phase} at {:.1}s",
            self.test,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Retries `op` (an API call of the test itself) until it succeeds or
/// `timeout` passes: while the API server or etcd restarts, the test's own
/// requests fail too.
pub async fn retrying<T, F, Fut>(what: &str, timeout: Duration, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e:#}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// `n` pods with two template entries each (`a` → `tmpl-a`, `b` → `tmpl-b`);
/// every `prescheduled_every`-th pod is created with `spec.nodeName`.
#[derive(Debug, Clone)]
pub struct Batch {
    pub pods: usize,
    pub prescheduled_every: usize,
}

pub const ENTRIES: [&str; 2] = ["a", "b"];

impl Batch {
    pub fn name(&self, i: usize) -> String {
        format!("pod-{i:04}")
    }

    pub fn prescheduled(&self, i: usize) -> bool {
        self.prescheduled_every > 0 && i.is_multiple_of(self.prescheduled_every)
    }

    pub async fn create_templates(&self, t: &TestCtx) {
        t.create_template("tmpl-a").await;
        t.create_template("tmpl-b").await;
    }

    /// Creates the pods (16 at a time), retrying while the server is away.
    pub async fn create_pods(&self, t: &TestCtx) {
        futures::stream::iter(0..self.pods)
            .map(|i| async move {
                let name = self.name(i);
                let node = self.prescheduled(i).then_some(NODE);
                retrying(&format!("create pod {name}"), CONVERGE, || async {
                    match t
                        .try_create_pod(
                            &name,
                            &[
                                ("a", Source::Template("tmpl-a")),
                                ("b", Source::Template("tmpl-b")),
                            ],
                            node,
                        )
                        .await
                    {
                        Ok(_) => Ok(()),
                        // A retry after a create whose answer was lost.
                        Err(e) if is_already_exists(&e) => Ok(()),
                        Err(e) => Err(e),
                    }
                })
                .await
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
    }

    /// How many of the batch's entries have a recorded, existing claim.
    pub async fn recorded_entries(&self, t: &TestCtx) -> anyhow::Result<usize> {
        let claims: BTreeSet<String> = t
            .all_claims()
            .await?
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        let pods = t.pods().list(&Default::default()).await?.items;
        Ok(pods
            .iter()
            .flat_map(|p| recorded(p).into_values().flatten())
            .filter(|c| claims.contains(c))
            .count())
    }

    /// Waits until every entry of every pod is recorded.
    pub async fn wait_all_recorded(&self, t: &TestCtx) {
        let want = self.pods * ENTRIES.len();
        wait_for(&format!("{want} recorded claims"), CONVERGE, async || {
            let n = self.recorded_entries(t).await?;
            ensure!(n >= want, "{n} of {want} recorded");
            Ok(())
        })
        .await;
    }

    /// Plays the scheduler: allocates entry `a` of every pod for that pod,
    /// and both claims of pre-scheduled pods with no consumer (the
    /// controller must reserve them). Returns the claims that got consumers.
    pub async fn allocate(&self, t: &TestCtx) -> BTreeSet<String> {
        let pods = retrying("list pods", CONVERGE, || async {
            Ok(t.pods().list(&Default::default()).await?.items)
        })
        .await;
        let mut jobs = Vec::new();
        for pod in &pods {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let Some(i) = name
                .strip_prefix("pod-")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            let statuses = recorded(pod);
            for entry in ENTRIES {
                let Some(Some(claim)) = statuses.get(entry).cloned() else {
                    continue;
                };
                if self.prescheduled(i) {
                    jobs.push((claim, json!([])));
                } else if entry == "a" {
                    jobs.push((claim, json!([pod_ref(pod)])));
                }
            }
        }
        let had_consumers = jobs.iter().map(|(c, _)| c.clone()).collect();
        futures::stream::iter(jobs)
            .map(|(claim, reserved)| async move {
                retrying(&format!("allocate claim {claim}"), CONVERGE, || {
                    t.try_allocate(&claim, reserved.clone())
                })
                .await
            })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        had_consumers
    }

    /// Waits until every claim of every pre-scheduled pod is reserved for it.
    pub async fn wait_prescheduled_reserved(&self, t: &TestCtx) {
        wait_for(
            "the claims of pre-scheduled pods to be reserved for them",
            CONVERGE,
            async || {
                let claims = t.all_claims().await?;
                let pods = t.pods().list(&Default::default()).await?.items;
                let mut missing = Vec::new();
                for pod in &pods {
                    if pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_ref())
                        .is_none()
                    {
                        continue;
                    }
                    for claim in recorded(pod).into_values().flatten() {
                        let reserved = claims
                            .iter()
                            .find(|c| c.metadata.name.as_deref() == Some(claim.as_str()))
                            .is_some_and(|c| {
                                c.status
                                    .iter()
                                    .flat_map(|s| s.reserved_for.iter().flatten())
                                    .any(|r| r.uid == uid(pod))
                            });
                        if !reserved {
                            missing.push(claim);
                        }
                    }
                }
                ensure!(missing.is_empty(), "not reserved yet: {missing:?}");
                Ok(())
            },
        )
        .await;
    }

    /// Marks every pod done (Succeeded and Failed alternately).
    pub async fn mark_done(&self, t: &TestCtx) {
        let pods = retrying("list pods", CONVERGE, || async {
            Ok(t.pods().list(&Default::default()).await?.items)
        })
        .await;
        futures::stream::iter(pods.into_iter().enumerate())
            .map(|(i, pod)| async move {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let phase = if i % 2 == 0 { "Succeeded" } else { "Failed" };
                retrying(&format!("mark pod {name} {phase}"), CONVERGE, || async {
                    t.pods()
                        .patch_status(
                            &name,
                            &Default::default(),
                            &kube::api::Patch::Merge(json!({"status": {"phase": phase}})),
                        )
                        .await?;
                    Ok(())
                })
                .await
            })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
    }
}

/// A batch scenario under way: its phase clock, its claim ledger and its
/// batch (`pods` pods, every fourth pre-scheduled), taken through the
/// steps the scenarios share; each scenario adds its faults in between.
pub struct BatchRun {
    pub phases: Phases,
    pub ledger: Ledger,
    pub batch: Batch,
}

impl BatchRun {
    /// Starts the phase clock and the ledger and creates the templates.
    pub async fn start(t: &TestCtx, test: &'static str, pods: usize) -> Self {
        let phases = Phases::start(test);
        let ledger = Ledger::start(t).await;
        let batch = Batch {
            pods,
            prescheduled_every: 4,
        };
        batch.create_templates(t).await;
        Self {
            phases,
            ledger,
            batch,
        }
    }

    /// Waits until every entry is recorded, then checks the invariants.
    pub async fn check_created(&self, t: &TestCtx) -> Report {
        self.batch.wait_all_recorded(t).await;
        self.phases.done("all claims recorded");
        check_quiet(t, "after creation", &Expect::default(), &self.ledger).await
    }

    /// Plays the scheduler and waits until the claims of pre-scheduled pods
    /// are reserved for them; returns what to expect once all pods are done
    /// (the claims that had consumers).
    pub async fn allocate(&self, t: &TestCtx) -> Expect {
        let had_consumers = self.batch.allocate(t).await;
        self.batch.wait_prescheduled_reserved(t).await;
        Expect {
            had_consumers,
            ..Expect::default()
        }
    }

    /// Checks the invariants once the pods are done (and their claims
    /// released).
    pub async fn check_released(&self, t: &TestCtx, expect: &Expect) -> Report {
        let done = check_quiet(t, "after all pods are done", expect, &self.ledger).await;
        self.phases.done("all claims released");
        done
    }
}

pub fn is_already_exists(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 409)
}

/// Checks the invariants (with the ledger's duplicates) once the system is
/// quiet and logs the report; the caller asserts on it.
pub async fn check_quiet(t: &TestCtx, what: &str, expect: &Expect, ledger: &Ledger) -> Report {
    let report = invariants::check_when_quiet(t, expect, Some(ledger), CONVERGE).await;
    eprintln!("e2e: {}: invariants {what}: {report}", t.name);
    report
}

/// How many times the controllers relisted pods or claims (a relist after
/// a `410 Gone` rebuilds the cache), from their logs: every cache load
/// beyond the first two of each process start.
pub fn relists(t: &TestCtx) -> usize {
    t.live_replicas()
        .iter()
        .map(|r| {
            let log = std::fs::read_to_string(&r.current().proc.log).unwrap_or_default();
            let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
            let loads = count("pod cache loaded") + count("claim cache loaded");
            loads.saturating_sub(2 * count("starting dra-claim-controller"))
        })
        .sum()
}
