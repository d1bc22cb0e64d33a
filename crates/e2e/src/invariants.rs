//! What must hold once a scenario is over and the system has gone quiet,
//! whatever faults it went through: nothing lost, nothing doubled.
//!
//! 1. Exactly one generated claim per (pod, template entry) of a pod that
//!    still runs; every claim name recorded in its status exists and is
//!    controlled by it.
//! 2. No `reservedFor` entry for a pod that is deleted, replaced or done;
//!    entries of consumer kinds the controller does not know stay.
//! 3. No claim stays allocated without consumers once its last consumer went
//!    away; no generated claim outlives its done pod.
//! 4. The controller processes still run (or were restarted as designed)
//!    and `/healthz` answers 200.
//!
//! [`Ledger`] adds the "ever" part of 1: it watches claims for the whole
//! scenario, so a duplicate that was created and later deleted still counts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};

use crate::ctx::TestCtx;
use crate::k8s::{
    DELETE_PROTECTION_FINALIZER, POD_CLAIM_NAME_ANNOTATION, has_finalizer, is_allocated, recorded,
    uid,
};

/// What the scenario set up that the checker cannot tell from the objects.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// Templates the controller must refuse (gated fields with the gate off):
    /// their entries get no claim.
    pub refused_templates: BTreeSet<String>,
    /// `(claim, "resource/name")` consumers of other kinds the test put in
    /// `reservedFor`: they must still be there.
    pub kept_consumers: Vec<(String, String)>,
    /// Claims the test allocated for consumers: once none is left they must
    /// be deallocated (or gone).
    pub had_consumers: BTreeSet<String>,
}

/// The outcome of one check.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub pods: usize,
    pub done_pods: usize,
    pub claims: usize,
    pub generated_claims: usize,
    pub reservations: usize,
    /// Supervisor restarts of the controllers (unplanned exits) so far.
    pub controller_restarts: usize,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} pods ({} done), {} claims ({} generated), {} reservations, {} controller restart(s): ",
            self.pods,
            self.done_pods,
            self.claims,
            self.generated_claims,
            self.reservations,
            self.controller_restarts
        )?;
        if self.violations.is_empty() {
            return write!(f, "no violations");
        }
        writeln!(f, "{} violation(s):", self.violations.len())?;
        for v in self.violations.iter().take(30) {
            writeln!(f, "  - {v}")?;
        }
        if self.violations.len() > 30 {
            writeln!(f, "  … and {} more", self.violations.len() - 30)?;
        }
        Ok(())
    }
}

fn is_done(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// `(pod uid, entry)` of a generated claim: its controlling pod and the
/// `pod-claim-name` annotation.
fn generated_by(claim: &ResourceClaim) -> Option<(String, String, String)> {
    let owner = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Pod")?;
    let entry = claim
        .metadata
        .annotations
        .as_ref()?
        .get(POD_CLAIM_NAME_ANNOTATION)?;
    Some((owner.uid.clone(), owner.name.clone(), entry.clone()))
}

fn name_of(claim: &ResourceClaim) -> String {
    claim.metadata.name.clone().unwrap_or_default()
}

/// Checks invariants 1–4 once, on the test's namespace.
pub async fn check(t: &TestCtx, expect: &Expect) -> anyhow::Result<Report> {
    let pods = t.pods().list(&ListParams::default()).await?.items;
    let claims = t.all_claims().await?;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(t.client.clone(), &t.ns);
    let templates: BTreeSet<String> = templates
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|t| t.metadata.name)
        .collect();
    let mut report = Report {
        pods: pods.len(),
        done_pods: pods.iter().filter(|p| is_done(p)).count(),
        claims: claims.len(),
        controller_restarts: t.restarts(),
        ..Report::default()
    };
    let v = &mut report.violations;

    let pods_by_name: BTreeMap<String, &Pod> = pods
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
        .collect();
    let claims_by_name: BTreeMap<String, &ResourceClaim> =
        claims.iter().map(|c| (name_of(c), c)).collect();
    // (pod uid, entry) → live (not deleting) generated claims.
    let mut generated: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for c in &claims {
        if let Some((owner_uid, _, entry)) = generated_by(c) {
            report.generated_claims += 1;
            if c.metadata.deletion_timestamp.is_none() {
                generated
                    .entry((owner_uid, entry))
                    .or_default()
                    .push(name_of(c));
            }
        }
    }

    // 1. One claim per (running pod, template entry), recorded and owned.
    for pod in &pods {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        if is_done(pod) || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let statuses = recorded(pod);
        let entries = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.clone())
            .unwrap_or_default();
        for entry in &entries {
            let Some(template) = &entry.resource_claim_template_name else {
                continue;
            };
            let owned = generated
                .get(&(uid(pod), entry.name.clone()))
                .cloned()
                .unwrap_or_default();
            if owned.len() > 1 {
                v.push(format!(
                    "pod {pod_name} entry {}: {} claims {owned:?}",
                    entry.name,
                    owned.len()
                ));
            }
            match statuses.get(&entry.name) {
                // Recorded as "not needed": no claim expected.
                Some(None) => continue,
                Some(Some(claim)) => match claims_by_name.get(claim) {
                    None => v.push(format!(
                        "pod {pod_name} entry {} records claim {claim}, which does not exist",
                        entry.name
                    )),
                    Some(c) if !crate::k8s::controlled_by(c, &uid(pod)) => v.push(format!(
                        "pod {pod_name} entry {} records claim {claim}, not controlled by the pod",
                        entry.name
                    )),
                    Some(_) => {}
                },
                None => {
                    let satisfiable = templates.contains(template)
                        && !expect.refused_templates.contains(template);
                    if satisfiable {
                        v.push(format!(
                            "pod {pod_name} entry {}: no claim recorded (template {template} exists; {} owned claim(s))",
                            entry.name,
                            owned.len()
                        ));
                    } else if !owned.is_empty() {
                        v.push(format!(
                            "pod {pod_name} entry {}: claim(s) {owned:?} from template {template}, which must be refused or is missing",
                            entry.name
                        ));
                    }
                }
            }
        }
    }

    for c in &claims {
        let name = name_of(c);
        let reserved = c
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.clone())
            .unwrap_or_default();
        report.reservations += reserved.len();

        // 2. Pod reservations only for pods that exist, are the same pod, and run.
        for r in &reserved {
            if !r.api_group.as_deref().unwrap_or("").is_empty() || r.resource != "pods" {
                continue;
            }
            match pods_by_name.get(&r.name) {
                None => v.push(format!("claim {name} reserved for deleted pod {}", r.name)),
                Some(p) if uid(p) != r.uid => v.push(format!(
                    "claim {name} reserved for replaced pod {} (uid {})",
                    r.name, r.uid
                )),
                Some(p) if is_done(p) => {
                    v.push(format!("claim {name} reserved for done pod {}", r.name))
                }
                Some(_) => {}
            }
        }

        // 3. Released when the last consumer went away; deletions not stuck.
        let protected = has_finalizer(c);
        let deleting = c.metadata.deletion_timestamp.is_some();
        if reserved.is_empty() && protected && is_allocated(c) {
            if deleting {
                v.push(format!(
                    "claim {name} is being deleted, unused, but still allocated with {DELETE_PROTECTION_FINALIZER}"
                ));
            } else if expect.had_consumers.contains(&name) {
                v.push(format!(
                    "claim {name} lost its last consumer but is still allocated"
                ));
            }
        }
        if deleting && protected && reserved.is_empty() && !is_allocated(c) {
            v.push(format!(
                "claim {name} is being deleted and unused, but keeps {DELETE_PROTECTION_FINALIZER}"
            ));
        }
        let foreign_consumers = reserved
            .iter()
            .any(|r| !r.api_group.as_deref().unwrap_or("").is_empty() || r.resource != "pods");
        if let Some((owner_uid, owner_name, _)) = generated_by(c)
            && !foreign_consumers
            && let Some(p) = pods_by_name.get(&owner_name)
        {
            if uid(p) == owner_uid && is_done(p) {
                v.push(format!("claim {name} outlives its done pod {owner_name}"));
            } else if uid(p) != owner_uid && !deleting {
                v.push(format!(
                    "claim {name} of a replaced pod {owner_name} was not deleted"
                ));
            }
        }
    }
    for (claim, consumer) in &expect.kept_consumers {
        let kept = claims_by_name.get(claim).is_some_and(|c| {
            c.status
                .iter()
                .flat_map(|s| s.reserved_for.iter().flatten())
                .any(|r| format!("{}/{}", r.resource, r.name) == *consumer)
        });
        if !kept {
            v.push(format!(
                "consumer {consumer} of claim {claim} was removed (or the claim is gone)"
            ));
        }
    }

    // 4. The controllers run and are healthy.
    for r in t.live_replicas() {
        let c = r.current();
        if let Some(status) = c.proc.exited() {
            v.push(format!("{} exited ({status})", c.proc.name));
            continue;
        }
        match c.healthz().await {
            Ok(200) => {}
            Ok(code) => v.push(format!("{}: /healthz answered {code}", c.proc.name)),
            Err(e) => v.push(format!("{}: /healthz: {e:#}", c.proc.name)),
        }
    }
    Ok(report)
}

/// Checks until the invariants hold and still hold `settle` later (the
/// system is quiet), or `timeout` passes; returns the last report.
pub async fn check_when_quiet(
    t: &TestCtx,
    expect: &Expect,
    ledger: Option<&Ledger>,
    timeout: Duration,
) -> Report {
    let settle = Duration::from_secs(3);
    let deadline = Instant::now() + timeout;
    let mut stable_since: Option<Instant> = None;
    loop {
        let mut report = match check(t, expect).await {
            Ok(r) => r,
            Err(e) => Report {
                violations: vec![format!("could not check: {e:#}")],
                ..Report::default()
            },
        };
        let mut permanent = false;
        if let Some(ledger) = ledger {
            let duplicates = ledger.duplicates();
            // A claim that was ever doubled stays a violation: stop waiting.
            permanent = !duplicates.is_empty();
            report.violations.extend(duplicates);
        }
        let now = Instant::now();
        if permanent {
            return report;
        }
        if report.ok() {
            match stable_since {
                Some(since) if now - since >= settle => return report,
                Some(_) => {}
                None => stable_since = Some(now),
            }
        } else {
            stable_since = None;
        }
        if now >= deadline {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// (pod uid, entry) → (pod name, names of the claims seen for it).
type Seen = BTreeMap<(String, String), (String, BTreeSet<String>)>;

/// Every generated claim seen in a namespace while the ledger ran, so a
/// duplicate counts even when it was deleted again before the end.
pub struct Ledger {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Ledger {
    /// Starts watching the claims of the test's namespace (with the test's
    /// own client, straight to the API server) and waits for the first list.
    pub async fn start(t: &TestCtx) -> Self {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let api: Api<ResourceClaim> = Api::namespaced(t.client.clone(), &t.ns);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut ready = Some(ready_tx);
                let mut events =
                    std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
                while let Some(event) = events.next().await {
                    let claim = match event {
                        Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => c,
                        Ok(watcher::Event::InitDone) => {
                            if let Some(tx) = ready.take() {
                                let _ = tx.send(());
                            }
                            continue;
                        }
                        _ => continue,
                    };
                    if let Some((owner_uid, owner_name, entry)) = generated_by(&claim) {
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .entry((owner_uid, entry))
                            .or_insert_with(|| (owner_name, BTreeSet::new()))
                            .1
                            .insert(name_of(&claim));
                    }
                }
            })
        };
        let _ = tokio::time::timeout(Duration::from_secs(30), ready_rx).await;
        Self { seen, task }
    }

    /// Generated claims seen so far.
    pub fn claims_seen(&self) -> usize {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.values().map(|(_, names)| names.len()).sum()
    }

    /// One violation per (pod, entry) that ever had more than one claim.
    pub fn duplicates(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter()
            .filter(|(_, (_, names))| names.len() > 1)
            .map(|((_, entry), (pod, names))| {
                format!(
                    "pod {pod} entry {entry} had {} claims over the scenario: {names:?}",
                    names.len()
                )
            })
            .collect()
    }
}
