//! Differential mode: each scenario runs twice, at the same time, against
//! two API servers: one where kube-controller-manager runs its
//! `resourceclaim-controller` (the reference), one where our controller
//! runs. The normalized outcomes (claims, pods, events) must be equal.
//!
//! The two servers are started once per test binary, when the first
//! scenario needs them; every scenario works in a namespace of its own on
//! both, so scenarios stay independent. Where kube-controller-manager is not
//! beside kube-apiserver, each scenario prints one `SKIP:` line and passes.
//!
//! Normalized away, because they are random or differ by construction: uids
//! (a pod's uid becomes `pod <name>`), resourceVersions, timestamps,
//! managedFields of claims (the managers are the processes' names), the 5
//! random characters of generated names (`<generateName>*****`), event
//! counts, messages (worded differently) and source/reporting fields
//! (each process reports as itself). Pod status managers are
//! kept (both must apply as `ResourceClaimController`). Where ours does
//! better on purpose (the contract's "beyond" points), the scenario says so
//! and normalizes exactly that.
//!
//! `DRA_E2E_DIFF_SHOW=1` prints both normalized outcomes of every scenario.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::cluster::{self, Cluster, ControllerOpts, ControllerSpec};
use crate::k8s::{
    DELETE_PROTECTION_FINALIZER, EXTENDED_RESOURCE_CLAIM_ANNOTATION, FAILED_CREATION_REASON, NODE,
    POD_CLAIM_NAME_ANNOTATION, Source, TIMEOUT, allocation, bind_pod, claim_manifest,
    delete_pod_at_once, exactly_spec, extended_resource_pod_manifest, long_name_cases,
    pod_manifest, pod_ref, template_manifest,
};
use crate::procs;
use crate::reference::{self, Reference};
use crate::replica::Replica;

const REFERENCE: &str = "kube-controller-manager";
const OURS: &str = "dra-claim-controller";
/// Set to `1` to print both normalized outcomes of every scenario.
const SHOW_ENV: &str = "DRA_E2E_DIFF_SHOW";
/// An outcome counts as final once it has not changed for this long.
const STABLE_FOR: Duration = Duration::from_secs(2);
/// How long a side may take to reach the scenario's end state.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(45);
/// Beyond: ours warns about a pod bound with `spec.nodeName` whose claim is
/// not allocated; the reference says nothing.
const NOT_ALLOCATED_REASON: &str = "ResourceClaimNotAllocated";
/// Ours waits this long before warning about a pre-scheduled pod.
const NOT_ALLOCATED_GRACE: Duration = Duration::from_secs(10);
/// Beyond: ours tells the user when a pod on a node lost its recorded claim.
const CLAIM_MISSING_REASON: &str = "ResourceClaimMissing";

/// The two servers, shared by the differential scenarios of this binary.
struct Servers {
    reference: (Cluster, Reference),
    ours: (Cluster, Arc<Replica>),
}

fn servers(bins: &cluster::Binaries, kcm: PathBuf) -> Result<&'static Servers, String> {
    static SERVERS: OnceLock<Result<Servers, String>> = OnceLock::new();
    SERVERS
        .get_or_init(|| {
            let bins = bins.clone();
            crate::ctx::start_detached("differential servers", async move {
                start_servers(&bins, &kcm)
                    .await
                    .map_err(|e| format!("{e:#}"))
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

async fn start_servers(bins: &cluster::Binaries, kcm: &std::path::Path) -> anyhow::Result<Servers> {
    let (reference_cluster, ours_cluster) =
        tokio::join!(Cluster::start(bins), Cluster::start(bins));
    let (mut reference_cluster, mut ours_cluster) = (
        reference_cluster.context("reference API server")?,
        ours_cluster.context("API server for ours")?,
    );
    reference_cluster.keep_dir();
    ours_cluster.keep_dir();
    let spec = ControllerSpec::new(&ours_cluster, &ControllerOpts::default(), "differential");
    let (kcm, ours) = tokio::join!(
        Reference::start(kcm, &reference_cluster),
        Replica::start(spec)
    );
    let (kcm, ours) = (kcm?, ours?);
    eprintln!(
        "e2e: differential servers: reference in {} (kube-controller-manager on port {}), ours in {}",
        reference_cluster.dir.display(),
        kcm.port,
        ours_cluster.dir.display()
    );
    // Statics are never dropped: kill the processes and remove the
    // directories when the binary exits. Our controller is left to
    // PR_SET_PDEATHSIG (its supervisor may have replaced the process).
    let keep = std::env::var(cluster::KEEP_ENV).is_ok_and(|v| v == "1");
    let dirs = if keep {
        vec![]
    } else {
        vec![reference_cluster.dir.clone(), ours_cluster.dir.clone()]
    };
    procs::cleanup_on_exit(
        &[
            kcm.proc.pid(),
            reference_cluster.apiserver.pid(),
            reference_cluster.etcd.pid(),
            ours_cluster.apiserver.pid(),
            ours_cluster.etcd.pid(),
        ],
        &dirs,
    );
    Ok(Servers {
        reference: (reference_cluster, kcm),
        ours: (ours_cluster, ours),
    })
}

/// One scenario on both servers.
struct Pair {
    name: &'static str,
    started: Instant,
    servers: &'static Servers,
    reference: Side,
    ours: Side,
    finished: bool,
}

impl Pair {
    /// `None` (after one `SKIP:` line) without the binaries.
    async fn new(name: &'static str) -> Option<Self> {
        let Some(bins) = cluster::binaries() else {
            cluster::skip_without_apiserver(name);
            return None;
        };
        let Some(kcm) = reference::binary(&bins) else {
            println!("SKIP: {name}: {}", reference::SKIP_REASON);
            return None;
        };
        let servers = tokio::task::spawn_blocking(move || servers(&bins, kcm))
            .await
            .expect("join differential setup")
            .unwrap_or_else(|e| panic!("{name}: differential servers failed to start: {e}"));
        let ns = namespace_for(name);
        let (reference, ours) = tokio::join!(
            Side::new(REFERENCE, &servers.reference.0, &ns),
            Side::new(OURS, &servers.ours.0, &ns)
        );
        Some(Self {
            name,
            started: Instant::now(),
            servers,
            reference,
            ours,
            finished: false,
        })
    }

    /// For a scenario where the reference's outcome is itself not
    /// deterministic (the defect ours fixes shows in some runs only): runs
    /// `steps` on both sides, waits for ours to reach `done`, checks ours
    /// with `beyond` and prints what the reference ended with, without
    /// comparing the two.
    async fn run_diverging(
        mut self,
        steps: impl AsyncFn(&Side),
        done: impl Fn(&Snapshot) -> anyhow::Result<()>,
        beyond: impl Fn(&Snapshot) -> Vec<String>,
    ) {
        tokio::join!(steps(&self.reference), steps(&self.ours));
        let (reference, ours) = tokio::join!(self.reference.settle(&done), self.ours.settle(&done));
        if let Some(why) = &ours.unsettled {
            panic!("{}: ours never reached the end state: {why}", self.name);
        }
        for note in beyond(&ours.snapshot) {
            println!("BEYOND: {}: {note}", self.name);
        }
        println!(
            "DIFFERENTIAL {}: not compared (the reference's outcome varies between runs); the reference ended with:\n{}",
            self.name,
            reference.snapshot.render()
        );
        self.finished = true;
        println!("E2E RAN: {}", self.name);
    }

    /// Runs `steps` on both sides at once, waits until each side reaches
    /// `done` and stays unchanged, and compares. `beyond` removes from
    /// our outcome what the contract makes us do beyond the reference and
    /// says what it removed.
    async fn run(
        mut self,
        steps: impl AsyncFn(&Side),
        done: impl Fn(&Snapshot) -> anyhow::Result<()>,
        beyond: impl Fn(&mut Snapshot) -> Vec<String>,
    ) {
        tokio::join!(steps(&self.reference), steps(&self.ours));
        let (reference, mut ours) =
            tokio::join!(self.reference.settle(&done), self.ours.settle(&done));
        for note in beyond(&mut ours.snapshot) {
            println!("BEYOND: {}: {note}", self.name);
        }
        let (want, got) = (reference.snapshot.render(), ours.snapshot.render());
        if std::env::var(SHOW_ENV).is_ok_and(|v| v == "1") {
            println!("{}: normalized outcome of {REFERENCE}:\n{want}", self.name);
            println!("{}: normalized outcome of {OURS}:\n{got}", self.name);
            for (who, settled) in [(REFERENCE, &reference), (OURS, &ours)] {
                for m in &settled.snapshot.messages {
                    println!("{}: {who} event: {m}", self.name);
                }
            }
        }
        if want != got {
            let mut report = format!(
                "DIFFERENTIAL MISMATCH: {} ('-' {REFERENCE}, '+' {OURS}, namespace {})\n",
                self.name, self.reference.ns
            );
            for (who, settled) in [(REFERENCE, &reference), (OURS, &ours)] {
                if let Some(why) = &settled.unsettled {
                    report += &format!("  {who} never reached the end state: {why}\n");
                }
            }
            report += &line_diff(&want, &got);
            report += "\nevent messages:\n";
            for (who, settled) in [(REFERENCE, &reference), (OURS, &ours)] {
                for m in &settled.snapshot.messages {
                    report += &format!("  {who}: {m}\n");
                }
            }
            println!("{report}");
            panic!("{}: outcomes differ (diff above)", self.name);
        }
        println!(
            "DIFFERENTIAL {}: same outcome ({} claims, {} deleted claims, {} pods, {} event reasons)",
            self.name,
            ours.snapshot.claims.len(),
            ours.snapshot.deleted_claims.len(),
            ours.snapshot.pods.len(),
            ours.snapshot.events.len()
        );
        self.finished = true;
        eprintln!(
            "e2e: {} took {:.1}s",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
        println!("E2E RAN: {}", self.name);
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        if self.finished || !std::thread::panicking() {
            return;
        }
        let ns = &self.ours.ns;
        eprintln!(
            "---- differential {} failed (namespace {ns}) ----",
            self.name
        );
        eprintln!(
            "-- {REFERENCE} log ({}), lines naming {ns}:\n{}",
            self.servers.reference.1.proc.log.display(),
            self.servers.reference.1.grep(ns, 60)
        );
        let ours = self.servers.ours.1.current();
        eprintln!(
            "-- {OURS} log ({}), lines naming {ns}:\n{}",
            ours.proc.log.display(),
            procs::grep(&ours.proc.log, ns, 60)
        );
    }
}

fn namespace_for(name: &str) -> String {
    let mut ns: String = name.replace('_', "-").chars().take(63).collect();
    while ns.ends_with('-') {
        ns.pop();
    }
    ns
}

/// One server's half of a scenario: the admin client, the namespace, the
/// pods the scenario created (to name uids) and the claims deleted so far
/// (their last state, from a watch).
struct Side {
    who: &'static str,
    client: kube::Client,
    ns: String,
    /// `(uid, "pod <name>")` of every pod the scenario created, in order.
    pods_created: Mutex<Vec<(String, String)>>,
    deleted: Arc<Mutex<Vec<ResourceClaim>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for Side {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

struct Settled {
    snapshot: Snapshot,
    /// Why the end state was not reached, if it was not.
    unsettled: Option<String>,
}

impl Side {
    async fn new(who: &'static str, cluster: &Cluster, ns: &str) -> Self {
        let client = cluster
            .admin_client()
            .await
            .unwrap_or_else(|e| panic!("{who}: admin client: {e:#}"));
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
            )
            .await
            .unwrap_or_else(|e| panic!("{who}: create namespace {ns}: {e}"));
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
        let from = claims
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("{who}: list claims: {e}"))
            .metadata
            .resource_version
            .unwrap_or_default();
        let deleted = Arc::new(Mutex::new(Vec::new()));
        let watch = tokio::spawn(record_deletions(claims, from, deleted.clone()));
        Self {
            who,
            client,
            ns: ns.to_string(),
            pods_created: Mutex::new(Vec::new()),
            deleted,
            watch,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn create_template_with(&self, name: &str, labels: Value, annotations: Value) {
        let t: ResourceClaimTemplate =
            serde_json::from_value(template_manifest(name, labels, annotations, exactly_spec()))
                .expect("template");
        Api::<ResourceClaimTemplate>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &t)
            .await
            .unwrap_or_else(|e| panic!("{}: create template {name}: {e}", self.who));
    }

    async fn create_template(&self, name: &str) {
        self.create_template_with(name, json!({}), json!({})).await;
    }

    /// A pod with one container that uses every claim entry.
    async fn create_pod(
        &self,
        name: &str,
        entries: &[(&str, Source<'_>)],
        node: Option<&str>,
    ) -> Pod {
        self.create_pod_from(pod_manifest(name, entries, node))
            .await
    }

    /// Creates a pod from raw JSON and remembers its uid as `pod <name>`
    /// (`pod <name> #2` for a second pod of the same name).
    async fn create_pod_from(&self, mut pod: Value) -> Pod {
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        let name = pod["metadata"]["name"].as_str().unwrap_or("?").to_string();
        let pod: Pod = serde_json::from_value(pod).expect("pod");
        let pod = self
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("{}: create pod {name}: {e}", self.who));
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut created = self.pods_created.lock().unwrap();
        let first = format!("pod {name}");
        let same_name = created
            .iter()
            .filter(|(_, l)| *l == first || l.starts_with(&format!("{first} #")))
            .count();
        let label = match same_name {
            0 => format!("pod {name}"),
            n => format!("pod {name} #{}", n + 1),
        };
        created.push((uid, label));
        pod
    }

    /// A claim from raw metadata and [`exactly_spec`].
    async fn create_claim(&self, metadata: Value) {
        let claim: ResourceClaim = serde_json::from_value(claim_manifest(metadata)).expect("claim");
        self.claims()
            .create(&PostParams::default(), &claim)
            .await
            .unwrap_or_else(|e| panic!("{}: create claim: {e}", self.who));
    }

    /// What the scheduler does when it allocates: finalizer, then
    /// `status.allocation` and `status.reservedFor`.
    async fn allocate(&self, claim: &str, reserved_for: Value) {
        let pp = PatchParams::default();
        self.claims()
            .patch(
                claim,
                &pp,
                &Patch::Merge(json!({"metadata": {"finalizers": [DELETE_PROTECTION_FINALIZER]}})),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: add finalizer to claim {claim}: {e}", self.who));
        self.claims()
            .patch_status(
                claim,
                &pp,
                &Patch::Merge(
                    json!({"status": {"allocation": allocation(&self.ns, claim), "reservedFor": reserved_for}}),
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: allocate claim {claim}: {e}", self.who));
    }

    async fn patch_pod_status(&self, pod: &str, status: Value) {
        self.pods()
            .patch_status(
                pod,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: patch status of pod {pod}: {e}", self.who));
    }

    async fn set_pod_phase(&self, pod: &str, phase: &str) {
        self.patch_pod_status(pod, json!({"phase": phase})).await;
    }

    /// Binds the pod through `pods/binding`, as kube-scheduler does.
    async fn bind_pod(&self, pod: &str, node: &str) {
        bind_pod(&self.pods(), pod, node)
            .await
            .unwrap_or_else(|e| panic!("{}: bind pod {pod}: {e}", self.who));
    }

    /// Removes a pod at once, as a kubelet confirming termination would.
    async fn delete_pod_now(&self, name: &str) {
        delete_pod_at_once(&self.pods(), name)
            .await
            .unwrap_or_else(|e| panic!("{}: delete pod {name}: {e}", self.who));
        self.wait_until(&format!("pod {name} to be gone"), |s| {
            ensure!(s.pod(name).is_err(), "still there");
            Ok(())
        })
        .await;
    }

    /// The real name of the claim recorded for `entry` of `pod`, once the
    /// claim exists.
    async fn recorded_claim(&self, pod: &str, entry: &str) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let name = self.pods().get(pod).await.ok().and_then(|p| {
                p.status?
                    .resource_claim_statuses?
                    .into_iter()
                    .find(|s| s.name == entry)?
                    .resource_claim_name
            });
            if let Some(name) = name
                && matches!(self.claims().get_opt(&name).await, Ok(Some(_)))
            {
                return name;
            }
            assert!(
                Instant::now() < deadline,
                "{}: no claim recorded for entry {entry} of pod {pod} within {TIMEOUT:?}",
                self.who
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for the Warning a pod gets while its template is missing, so
    /// the event is part of the outcome however fast the controller is.
    async fn wait_creation_failed(&self) {
        self.wait_until("a FailedResourceClaimCreation event", |s| {
            s.has_event(FAILED_CREATION_REASON)
        })
        .await;
    }

    /// Waits (up to [`TIMEOUT`]) until the normalized state satisfies `check`.
    async fn wait_until(&self, what: &str, check: impl Fn(&Snapshot) -> anyhow::Result<()>) {
        self.wait_until_within(what, TIMEOUT, check).await;
    }

    /// [`Side::wait_until`] with a bound of its own.
    async fn wait_until_within(
        &self,
        what: &str,
        bound: Duration,
        check: impl Fn(&Snapshot) -> anyhow::Result<()>,
    ) {
        let deadline = Instant::now() + bound;
        loop {
            let why = match self.snapshot().await {
                Ok(s) => match check(&s) {
                    Ok(()) => return,
                    Err(e) => e,
                },
                Err(e) => e,
            };
            assert!(
                Instant::now() < deadline,
                "{}: timed out after {bound:?} waiting for {what}; last state: {why:#}",
                self.who
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `done` holds and the snapshot stays the same for
    /// [`STABLE_FOR`]; gives up after [`SETTLE_TIMEOUT`] with the reason.
    async fn settle(&self, done: &impl Fn(&Snapshot) -> anyhow::Result<()>) -> Settled {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let mut stable: Option<(Snapshot, Instant)> = None;
        loop {
            let snapshot = match self.snapshot().await {
                Ok(s) => s,
                Err(e) => panic!("{}: reading the outcome: {e:#}", self.who),
            };
            let why = match done(&snapshot) {
                Ok(()) => match &stable {
                    Some((last, since)) if *last == snapshot => {
                        if since.elapsed() >= STABLE_FOR {
                            return Settled {
                                snapshot,
                                unsettled: None,
                            };
                        }
                        "not yet stable".to_string()
                    }
                    _ => {
                        stable = Some((snapshot.clone(), Instant::now()));
                        "changed".to_string()
                    }
                },
                Err(e) => {
                    stable = None;
                    format!("{e:#}")
                }
            };
            if Instant::now() >= deadline {
                return Settled {
                    snapshot,
                    unsettled: Some(why),
                };
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The normalized state of the namespace.
    async fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let lp = ListParams::default();
        let claims = self.claims().list(&lp).await?.items;
        let pods = self.pods().list(&lp).await?.items;
        let events = Api::<Event>::namespaced(self.client.clone(), &self.ns)
            .list(&lp)
            .await?
            .items;
        let deleted = self.deleted.lock().unwrap().clone();

        let mut names = Names::default();
        // References to a deleted claim say so; present claims win.
        for (list, suffix) in [(&deleted, DELETED), (&claims, "")] {
            for c in list {
                let name = c.metadata.name.clone().unwrap_or_default();
                let normalized = normalize_claim_name(&name, c.metadata.generate_name.as_deref());
                names.claims.insert(name, format!("{normalized}{suffix}"));
            }
        }
        names.uids = self.pods_created.lock().unwrap().iter().cloned().collect();

        let mut snapshot = Snapshot {
            claims: claims.iter().map(|c| names.claim_value(c)).collect(),
            // A deleted claim is compared by what it was, not by the order
            // its finalizer and its deletion came in: kube-controller-manager
            // races its pod and claim work there (the unused claim deleted
            // first in some runs, its finalizer removed first in others).
            deleted_claims: deleted
                .iter()
                .map(|c| {
                    let mut claim = names.claim_value(c);
                    if let Some(fields) = claim.as_object_mut() {
                        fields.remove("deleting");
                        fields.remove("finalizers");
                    }
                    claim
                })
                .collect(),
            pods: pods.iter().map(|p| names.pod_value(p)).collect(),
            events: BTreeSet::new(),
            messages: BTreeSet::new(),
        };
        for e in &events {
            let kind = e.involved_object.kind.clone().unwrap_or_default();
            let raw = e.involved_object.name.clone().unwrap_or_default();
            let object = match kind.as_str() {
                "ResourceClaim" => names.claim(&raw),
                _ => raw,
            };
            let (type_, reason) = (
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
            );
            snapshot.messages.insert(format!(
                "{type_} {kind}/{object} {reason}: {}",
                e.message.clone().unwrap_or_default()
            ));
            snapshot.events.insert(EventKey {
                object: format!("{kind}/{object}"),
                type_,
                reason,
            });
        }
        snapshot.claims.sort_by_key(Value::to_string);
        snapshot.deleted_claims.sort_by_key(Value::to_string);
        snapshot.pods.sort_by_key(|p| p["name"].to_string());
        Ok(snapshot)
    }
}

/// Collects the last state of every claim deleted in the namespace.
async fn record_deletions(
    claims: Api<ResourceClaim>,
    mut rv: String,
    out: Arc<Mutex<Vec<ResourceClaim>>>,
) {
    use kube::api::{WatchEvent, WatchParams};
    loop {
        let wp = WatchParams::default().timeout(290);
        let stream = match claims.watch(&wp, &rv).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("e2e: differential: watching claims failed: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(WatchEvent::Added(c) | WatchEvent::Modified(c)) => {
                    rv = c.metadata.resource_version.unwrap_or(rv);
                }
                Ok(WatchEvent::Deleted(c)) => {
                    rv = c.metadata.resource_version.clone().unwrap_or(rv);
                    out.lock().unwrap().push(c);
                }
                Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                Ok(WatchEvent::Error(e)) => {
                    // 410 Gone cannot happen within a scenario's lifetime.
                    eprintln!("e2e: differential: claim watch error: {e:?}");
                    return;
                }
                Err(e) => {
                    eprintln!("e2e: differential: claim watch ended: {e}");
                    break;
                }
            }
        }
    }
}

#[path = "differential/outcome.rs"]
mod outcome;
use outcome::*;

#[path = "differential/claims.rs"]
mod claims;
#[path = "differential/lost_claims.rs"]
mod lost_claims;
#[path = "differential/release.rs"]
mod release;

/// What the scheduler does for a pod asking for an extended resource (see
/// `TestCtx::create_extended_resource_pod`).
async fn create_extended_resource_pod(s: &Side, pod: &str, claim: &str) {
    let created = s.create_pod_from(extended_resource_pod_manifest(pod)).await;
    s.create_claim(json!({
        "name": claim,
        "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
        "ownerReferences": [{
            "apiVersion": "v1", "kind": "Pod", "name": pod, "uid": created.metadata.uid,
            "controller": true, "blockOwnerDeletion": true,
        }],
    }))
    .await;
    s.allocate(claim, json!([pod_ref(&created)])).await;
    s.patch_pod_status(
        pod,
        json!({"extendedResourceClaimStatus": {
            "resourceClaimName": claim,
            "requestMappings": [{
                "containerName": "main",
                "resourceName": "example.com/gpu",
                "requestName": "req-0",
            }],
        }}),
    )
    .await;
}
