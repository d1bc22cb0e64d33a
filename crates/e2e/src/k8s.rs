//! Objects and API calls the scenarios use, doing by hand what a scheduler
//! or kubelet would (there is neither): `spec.nodeName` at creation, pod
//! phase, claim allocation, `reservedFor`, the delete-protection finalizer.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::ctx::TestCtx;

pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";
pub const EXTENDED_RESOURCE_CLAIM_ANNOTATION: &str =
    "resource.kubernetes.io/extended-resource-claim";
pub const DELETE_PROTECTION_FINALIZER: &str = "resource.kubernetes.io/delete-protection";
pub const FIELD_MANAGER: &str = "ResourceClaimController";
pub const FAILED_CREATION_REASON: &str = "FailedResourceClaimCreation";
/// Claims name a device class; the API server checks only the name's format.
pub const DEVICE_CLASS: &str = "gpu.e2e.example.com";
pub const NODE: &str = "e2e-node-1";

/// Default timeout for anything the controller has to do.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Polls `check` every 100 ms until it returns `Ok`, and panics after
/// `timeout` with `what` and the last reason `check` gave for "not yet".
pub async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> anyhow::Result<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last state: {e:#}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Asserts that `check` keeps returning `Ok` for the whole of `period`
/// (for "nothing happens" outcomes).
pub async fn holds_for(
    what: &str,
    period: Duration,
    mut check: impl AsyncFnMut() -> anyhow::Result<()>,
) {
    let deadline = Instant::now() + period;
    while Instant::now() < deadline {
        if let Err(e) = check().await {
            panic!("expected {what} to hold for {period:?}, but: {e:#}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How one `pod.spec.resourceClaims` entry finds its claim.
#[derive(Debug, Clone)]
pub enum Source<'a> {
    Template(&'a str),
    Claim(&'a str),
}

/// The requests of a claim spec; gated fields go in here when a test needs them.
pub fn exactly_spec() -> Value {
    json!({"devices": {"requests": [{
        "name": "req-0",
        "exactly": {"deviceClassName": DEVICE_CLASS},
    }]}})
}

/// The allocation a scheduler would write for [`exactly_spec`] of the
/// claim `namespace/name`: a device of its own, as a scheduler would never
/// hand one device to two claims (every test ends checking that the
/// controller reports no double allocation).
pub fn allocation(namespace: &str, name: &str) -> Value {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (namespace, name).hash(&mut hasher);
    json!({"devices": {"results": [{
        "request": "req-0",
        "driver": "test.example.com",
        "pool": "pool",
        "device": format!("dev-{:016x}", hasher.finish()),
    }]}})
}

pub fn pod_ref(pod: &Pod) -> Value {
    json!({"resource": "pods", "name": pod.metadata.name, "uid": pod.metadata.uid})
}

pub fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// Whether `claim` has a `controller: true` owner reference to the pod `uid`.
pub fn controlled_by(claim: &ResourceClaim, uid: &str) -> bool {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

pub fn has_finalizer(claim: &ResourceClaim) -> bool {
    claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == DELETE_PROTECTION_FINALIZER)
}

pub fn reserved_names(claim: &ResourceClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .map(|r| {
            r.iter()
                .map(|c| format!("{}/{}", c.resource, c.name))
                .collect()
        })
        .unwrap_or_default()
}

pub fn is_allocated(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some())
}

/// `pod.status.resourceClaimStatuses` as entry name → claim name.
pub fn recorded(pod: &Pod) -> BTreeMap<String, Option<String>> {
    pod.status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .map(|list| {
            list.iter()
                .map(|s| (s.name.clone(), s.resource_claim_name.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The `generateName` the contract prescribes for a pod's claim entry.
/// A pod with one container that uses every claim entry; `node` sets
/// `spec.nodeName` (a pod placed without the scheduler).
pub fn pod_manifest(name: &str, entries: &[(&str, Source<'_>)], node: Option<&str>) -> Value {
    let claims: Vec<Value> = entries
        .iter()
        .map(|(entry, source)| match source {
            Source::Template(t) => json!({"name": entry, "resourceClaimTemplateName": t}),
            Source::Claim(c) => json!({"name": entry, "resourceClaimName": c}),
        })
        .collect();
    let mut pod = raw_pod_manifest(name, claims);
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    pod
}

/// A pod with one container using every entry; `entries` are raw
/// `spec.resourceClaims` items, so they can be malformed on purpose.
pub fn raw_pod_manifest(name: &str, entries: Vec<Value>) -> Value {
    let uses: Vec<Value> = entries.iter().map(|e| json!({"name": e["name"]})).collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{
                "name": "main",
                "image": PAUSE_IMAGE,
                "resources": {"claims": uses},
            }],
            "resourceClaims": entries,
            "terminationGracePeriodSeconds": 0,
        },
    })
}

/// A pod bound to [`NODE`] that requests an extended resource and has no
/// claim entry: the scheduler would make a claim for it.
pub fn extended_resource_pod_manifest(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": PAUSE_IMAGE,
                "resources": {
                    "requests": {"example.com/gpu": "1"},
                    "limits": {"example.com/gpu": "1"},
                },
            }],
        },
    })
}

/// Binds a pod through the `pods/binding` subresource, as kube-scheduler
/// does (which also sets the `PodScheduled` condition).
pub async fn bind_pod(pods: &Api<Pod>, name: &str, node: &str) -> kube::Result<()> {
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    pods.create_subresource::<Value, Value>("binding", name, &PostParams::default(), &binding)
        .await
        .map(drop)
}

/// Never pulled: no kubelet runs in these tests.
const PAUSE_IMAGE: &str = "registry.invalid/e2e/pause:1";

/// Deletes a pod with grace period 0, as a kubelet confirming termination
/// would (no kubelet runs here, so a graceful delete would never finish).
pub async fn delete_pod_at_once(pods: &Api<Pod>, name: &str) -> kube::Result<()> {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete(name, &dp).await.map(|_| ())
}

/// The last stored state of a deleted claim whose consumers were all done
/// or gone (`done`, as `resource/name`) shows one of the two orders the
/// controller may take, and nothing in between:
/// - released first (a pod waited for devices, or the claim is not a
///   pod's): no reservation and no allocation left when it went;
/// - deleted first (nobody waited): the reservations exactly as the
///   scheduler left them, only done consumers among them, and the
///   allocation went with the object.
///
/// Reservations removed with the allocation kept, or a consumer that was
/// not done, fail.
pub fn assert_cleanly_deleted(last: &ResourceClaim, done: &[&str]) {
    let name = last.metadata.name.as_deref().unwrap_or("?");
    let reserved = reserved_names(last);
    let released_first = reserved.is_empty() && !is_allocated(last);
    let deleted_first = reserved == done;
    assert!(
        released_first || deleted_first,
        "{name} went in neither order: reservedFor {reserved:?} (done consumers {done:?}), \
         allocated {}",
        is_allocated(last)
    );
}

/// The claim is released: no reservation, no allocation, no finalizer.
pub fn ensure_released(c: &ResourceClaim) -> anyhow::Result<()> {
    ensure!(
        reserved_names(c).is_empty(),
        "reservedFor {:?}",
        reserved_names(c)
    );
    ensure!(!is_allocated(c), "still allocated");
    ensure!(!has_finalizer(c), "finalizers {:?}", c.metadata.finalizers);
    Ok(())
}

/// The claim is held: reserved for exactly `consumers` (`resource/name`),
/// still allocated and protected by the finalizer.
pub fn ensure_held(c: &ResourceClaim, consumers: &[&str]) -> anyhow::Result<()> {
    ensure!(
        reserved_names(c) == consumers,
        "reservedFor {:?}",
        reserved_names(c)
    );
    ensure!(is_allocated(c), "deallocated");
    ensure!(has_finalizer(c), "finalizer removed");
    Ok(())
}

/// A ResourceClaimTemplate whose claims get `labels` and `annotations`.
pub fn template_manifest(name: &str, labels: Value, annotations: Value, spec: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "metadata": {"labels": labels, "annotations": annotations},
            "spec": spec,
        },
    })
}

/// A ResourceClaim from raw metadata and [`exactly_spec`].
pub fn claim_manifest(metadata: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": exactly_spec(),
    })
}

/// (pod, entry) names around the 63-character limits: a 63-character pod
/// and entry, a 253-character pod, and medium names that fit or just do not.
pub fn long_name_cases() -> Vec<(String, String)> {
    let entry = format!("entry-{}", "e".repeat(57));
    let pod_mid = "medium-pod-name-of-forty-characters-long";
    vec![
        (format!("pod-{}", "p".repeat(59)), entry.clone()),
        (format!("big-{}", "z".repeat(249)), entry),
        (format!("{pod_mid}-2"), "short".into()),
        (format!("{pod_mid}-3"), "gpu-entry-with-some-length".into()),
    ]
}

pub fn expected_generate_name(pod: &str, entry: &str) -> String {
    let full = format!("{pod}-{entry}-");
    let len = full.len();
    if len <= 57 {
        return full;
    }
    format!(
        "{}-{}",
        &pod[..pod.len() * 57 / len],
        &entry[..entry.len() * 57 / len]
    )
}

impl TestCtx {
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn templates(&self) -> Api<ResourceClaimTemplate> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates a template whose claims carry `labels`/`annotations` and `spec`.
    pub async fn create_template_with(
        &self,
        name: &str,
        labels: Value,
        annotations: Value,
        spec: Value,
    ) -> ResourceClaimTemplate {
        let t: ResourceClaimTemplate =
            serde_json::from_value(template_manifest(name, labels, annotations, spec))
                .expect("template");
        self.templates()
            .create(&PostParams::default(), &t)
            .await
            .unwrap_or_else(|e| panic!("create template {name}: {e}"))
    }

    pub async fn create_template(&self, name: &str) -> ResourceClaimTemplate {
        self.create_template_with(name, json!({}), json!({}), exactly_spec())
            .await
    }

    /// Labels the namespace for `adminAccess` (the API server accepts it
    /// only in namespaces labelled for it) and creates two templates with
    /// gated fields: `admin` uses `adminAccess` (DRAAdminAccess), `prio`
    /// uses `firstAvailable` (DRAPrioritizedList).
    pub async fn create_gated_templates(&self, admin: &str, prio: &str) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        namespaces
            .patch(
                &self.ns,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}}),
                ),
            )
            .await
            .expect("label namespace for admin access");
        self.create_template_with(
            admin,
            json!({}),
            json!({}),
            json!({"devices": {"requests": [{
                "name": "req-0",
                "exactly": {"deviceClassName": DEVICE_CLASS, "adminAccess": true},
            }]}}),
        )
        .await;
        self.create_template_with(
            prio,
            json!({}),
            json!({}),
            json!({"devices": {"requests": [{
                "name": "req-0",
                "firstAvailable": [
                    {"name": "big", "deviceClassName": DEVICE_CLASS},
                    {"name": "small", "deviceClassName": DEVICE_CLASS},
                ],
            }]}}),
        )
        .await;
    }

    /// Creates a pod with one container that uses every claim entry.
    /// `node`: set `spec.nodeName` (a pod placed without the scheduler).
    pub async fn create_pod(
        &self,
        name: &str,
        entries: &[(&str, Source<'_>)],
        node: Option<&str>,
    ) -> Pod {
        self.try_create_pod(name, entries, node)
            .await
            .unwrap_or_else(|e| panic!("create pod {name}: {e:#}"))
    }

    pub async fn try_create_pod(
        &self,
        name: &str,
        entries: &[(&str, Source<'_>)],
        node: Option<&str>,
    ) -> anyhow::Result<Pod> {
        let pod: Pod = serde_json::from_value(pod_manifest(name, entries, node))?;
        Ok(self.pods().create(&PostParams::default(), &pod).await?)
    }

    /// Removes a pod at once, as a kubelet confirming termination would.
    pub async fn delete_pod_now(&self, name: &str) {
        delete_pod_at_once(&self.pods(), name)
            .await
            .unwrap_or_else(|e| panic!("delete pod {name}: {e}"));
        wait_for(
            &format!("pod {name} to be gone"),
            TIMEOUT,
            async || match self.pods().get_opt(name).await? {
                None => Ok(()),
                Some(_) => bail!("still present"),
            },
        )
        .await;
    }

    pub async fn set_pod_phase(&self, name: &str, phase: &str) {
        self.pods()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase}})),
            )
            .await
            .unwrap_or_else(|e| panic!("set phase {phase} on pod {name}: {e}"));
    }

    /// What the scheduler does for a pod (bound to [`NODE`]) that asks for
    /// an extended resource: a claim controlled by the pod, allocated and
    /// reserved for it, named in `status.extendedResourceClaimStatus`.
    /// Returns the pod and the allocated claim.
    pub async fn create_extended_resource_pod(
        &self,
        pod_name: &str,
        claim_name: &str,
    ) -> (Pod, ResourceClaim) {
        let pod: Pod = serde_json::from_value(extended_resource_pod_manifest(pod_name)).unwrap();
        let pod = self
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("create pod {pod_name}: {e}"));
        self.create_claim(json!({
            "name": claim_name,
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": uid(&pod),
                "controller": true, "blockOwnerDeletion": true,
            }],
        }))
        .await;
        let claim = self.allocate(claim_name, json!([pod_ref(&pod)])).await;
        self.patch_pod_status(
            pod_name,
            json!({"extendedResourceClaimStatus": {
                "resourceClaimName": claim_name,
                "requestMappings": [{
                    "containerName": "main",
                    "resourceName": "example.com/gpu",
                    "requestName": "req-0",
                }],
            }}),
        )
        .await;
        let status = self.pod(pod_name).await.status.unwrap_or_default();
        assert!(
            status.extended_resource_claim_status.is_some(),
            "the API server dropped extendedResourceClaimStatus (DRAExtendedResource gate off?)"
        );
        (pod, claim)
    }

    /// Binds the pod to `node` as a scheduler would.
    pub async fn bind_pod(&self, name: &str, node: &str) {
        bind_pod(&self.pods(), name, node)
            .await
            .unwrap_or_else(|e| panic!("bind pod {name} to {node}: {e}"));
    }

    /// Merge-patches the pod's status (as a kubelet or an older client would).
    pub async fn patch_pod_status(&self, name: &str, status: Value) {
        self.pods()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap_or_else(|e| panic!("patch status of pod {name}: {e}"));
    }

    /// Writes `status.resourceClaimStatuses` of a pod as the test's own
    /// field manager (e.g. an entry without a name: "not needed").
    pub async fn set_pod_claim_statuses(&self, name: &str, statuses: Value) {
        self.pods()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"resourceClaimStatuses": statuses}})),
            )
            .await
            .unwrap_or_else(|e| panic!("set resourceClaimStatuses on pod {name}: {e}"));
    }

    /// Creates a claim from raw metadata and [`exactly_spec`].
    pub async fn create_claim(&self, metadata: Value) -> ResourceClaim {
        let claim: ResourceClaim = serde_json::from_value(claim_manifest(metadata)).expect("claim");
        self.claims()
            .create(&PostParams::default(), &claim)
            .await
            .unwrap_or_else(|e| panic!("create claim {}: {e}", metadata_name(&claim)))
    }

    /// Does what the scheduler does when it allocates: finalizer first, then
    /// `status.allocation` and `status.reservedFor`.
    pub async fn allocate(&self, claim: &str, reserved_for: Value) -> ResourceClaim {
        self.try_allocate(claim, reserved_for)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// [`TestCtx::allocate`] returning errors instead of panicking, so it
    /// can be retried.
    pub async fn try_allocate(
        &self,
        claim: &str,
        reserved_for: Value,
    ) -> anyhow::Result<ResourceClaim> {
        self.try_allocate_devices(claim, allocation(&self.ns, claim), reserved_for)
            .await
    }

    /// [`TestCtx::allocate`] with an allocation of the test's choosing
    /// (devices of real slices, a node selector).
    pub async fn allocate_devices(
        &self,
        claim: &str,
        allocation: Value,
        reserved_for: Value,
    ) -> ResourceClaim {
        self.try_allocate_devices(claim, allocation, reserved_for)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    async fn try_allocate_devices(
        &self,
        claim: &str,
        allocation: Value,
        reserved_for: Value,
    ) -> anyhow::Result<ResourceClaim> {
        self.claims()
            .patch(
                claim,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": [DELETE_PROTECTION_FINALIZER]}})),
            )
            .await
            .with_context(|| format!("add finalizer to claim {claim}"))?;
        self.claims()
            .patch_status(
                claim,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"allocation": allocation, "reservedFor": reserved_for}}),
                ),
            )
            .await
            .with_context(|| format!("allocate claim {claim}"))
    }

    pub async fn claim(&self, name: &str) -> Option<ResourceClaim> {
        self.claims()
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("get claim {name}: {e}"))
    }

    pub async fn pod(&self, name: &str) -> Pod {
        self.pods()
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get pod {name}: {e}"))
    }

    pub async fn all_claims(&self) -> anyhow::Result<Vec<ResourceClaim>> {
        Ok(self.claims().list(&ListParams::default()).await?.items)
    }

    /// Waits until every one of `entries` of pod `name` is recorded with a
    /// claim name, the claim exists and is controlled by the pod; returns
    /// entry → claim.
    pub async fn wait_recorded(
        &self,
        name: &str,
        entries: &[&str],
    ) -> BTreeMap<String, ResourceClaim> {
        wait_for(
            &format!("claims {entries:?} of pod {name} to be created and recorded"),
            TIMEOUT,
            async || {
                let pod = self.pods().get(name).await?;
                let statuses = recorded(&pod);
                let mut out = BTreeMap::new();
                for entry in entries {
                    let claim_name = statuses
                        .get(*entry)
                        .with_context(|| format!("entry {entry} not in status: {statuses:?}"))?
                        .clone()
                        .with_context(|| format!("entry {entry} recorded without a name"))?;
                    let claim =
                        self.claims().get_opt(&claim_name).await?.with_context(|| {
                            format!("recorded claim {claim_name} does not exist")
                        })?;
                    ensure!(
                        controlled_by(&claim, &uid(&pod)),
                        "claim {claim_name} not controlled by pod {name}"
                    );
                    out.insert(entry.to_string(), claim);
                }
                Ok(out)
            },
        )
        .await
    }

    pub async fn wait_claim_gone(&self, claim: &str) {
        wait_for(
            &format!("claim {claim} to be gone"),
            TIMEOUT,
            async || match self.claims().get_opt(claim).await? {
                None => Ok(()),
                Some(c) => bail!(
                    "still there: deleting={} finalizers={:?} allocated={} reservedFor={:?}",
                    c.metadata.deletion_timestamp.is_some(),
                    c.metadata.finalizers,
                    is_allocated(&c),
                    reserved_names(&c)
                ),
            },
        )
        .await;
    }

    /// Waits for claim `claim` to be deleted and returns its last state, as
    /// carried by the watch's DELETED event. `from_rv`: a resourceVersion
    /// read before the action, so no event is missed. The last state tells
    /// whether the claim was deallocated and released before it went,
    /// which polling cannot see.
    pub async fn wait_claim_deleted(&self, claim: &str, from_rv: &str) -> ResourceClaim {
        use futures::TryStreamExt;
        use kube::api::{WatchEvent, WatchParams};
        let watch = async {
            let wp = WatchParams::default()
                .fields(&format!("metadata.name={claim}"))
                .timeout(TIMEOUT.as_secs() as u32);
            let mut events = Box::pin(self.claims().watch(&wp, from_rv).await?);
            while let Some(event) = events.try_next().await? {
                match event {
                    WatchEvent::Deleted(c) => return Ok(c),
                    WatchEvent::Error(e) => bail!("watch error: {e:?}"),
                    _ => {}
                }
            }
            bail!("watch ended without a deletion")
        };
        match tokio::time::timeout(TIMEOUT + Duration::from_secs(5), watch).await {
            Ok(Ok(last)) => last,
            Ok(Err(e)) => {
                self.wait_claim_gone(claim).await;
                panic!("claim {claim} is gone, but its deletion was not observed: {e:#}")
            }
            Err(_) => {
                // Gives the usual "still there: …" message.
                self.wait_claim_gone(claim).await;
                panic!("claim {claim} went away without a DELETED event")
            }
        }
    }

    /// Warning events with `reason` about the pod `name`.
    pub async fn warning_events(&self, pod: &str, reason: &str) -> anyhow::Result<Vec<Event>> {
        self.events_of(pod, "Warning", reason).await
    }

    /// Events of `type_` (`Normal`, `Warning`) with `reason` about the pod
    /// `name`.
    pub async fn events_of(
        &self,
        pod: &str,
        type_: &str,
        reason: &str,
    ) -> anyhow::Result<Vec<Event>> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
        Ok(events
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some(type_))
            .collect())
    }
}

fn metadata_name(claim: &ResourceClaim) -> String {
    claim
        .metadata
        .name
        .clone()
        .or_else(|| claim.metadata.generate_name.clone())
        .unwrap_or_default()
}
