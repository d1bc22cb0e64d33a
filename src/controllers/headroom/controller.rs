//! The headroom controller: its watches (watermarks, pods, nodes, and for
//! device entries slices, classes and claims), one queue of watermark keys
//! with one worker, and the sync that applies the placeholders' objects
//! and writes the status. Leader only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use serde_json::{Value, json};
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::desired::{
    CPU_MEMORY_ENTRY, Owner, PLACEHOLDER_GATE, cpu_memory_deployment, device_claim_template,
    device_deployment,
};
use super::devices::{Consumer, DeviceCount, count_devices, device_consumers, entry_devices};
use super::sizing::{Bounds, cpu_memory_placeholders, placeholders};
use super::status::{EntryObserved, Observed, conditions, status_patch};
use super::usage::{HeadroomNode, HeadroomPod, WATERMARK_LABEL, workload_requests};
use super::watermark::{WatermarkView, carry_transitions, selects};
use super::yield_choice::{
    CandidateNode, Gates, Placeholder, WaitingPod, choose_yield, gate_hold, yield_spent_elsewhere,
};
use crate::allocate::inventory::node_inventory;
use crate::allocate::quantity::Quantity;
use crate::allocate::{Inventory, on_solver_stack};
use crate::model::DeviceId;
use crate::model::views::ClaimView;
use crate::runtime::error::{SyncError, kube_err};
use crate::runtime::events::{EventRecorder, Involved};
use crate::runtime::informer::{Handler, Informer};
use crate::runtime::reachability::Reachability;
use crate::runtime::retry::requeue;
use crate::runtime::store::{Store, object_key};
use crate::workqueue::WorkQueue;

/// The queue's name (`workqueue_*{name="dra_headroom"}`).
pub const QUEUE_NAME: &str = "dra_headroom";
/// Field manager of the placeholders' objects and of the status.
pub const FIELD_MANAGER: &str = "dra-claim-controller-headroom";

/// `dra_headroom_placeholders`, `dra_headroom_devices`,
/// `dra_headroom_yields_total`.
struct Metrics {
    placeholders: IntGaugeVec,
    devices: IntGaugeVec,
    yields: IntCounterVec,
    /// The entries each watermark (`namespace/name`) has series for.
    series: Mutex<HashMap<(String, String), Vec<String>>>,
}

impl Metrics {
    fn register(registry: &Registry) -> anyhow::Result<Self> {
        // Per entry and state: the labels both gauges share.
        let entry_gauge = |name: &str, help: &str| {
            IntGaugeVec::new(
                Opts::new(name, help),
                &["namespace", "watermark", "entry", "state"],
            )
        };
        let placeholders = entry_gauge(
            "dra_headroom_placeholders",
            "Placeholders of a NodeScalingWatermark entry: desired, ready (bound) and pending (waiting for a node).",
        )?;
        let devices = entry_gauge(
            "dra_headroom_devices",
            "Devices a NodeScalingWatermark device entry selects on its nodes: total, in_use (by workload pods) and held (by its placeholders).",
        )?;
        let yields = IntCounterVec::new(
            Opts::new(
                "dra_headroom_yields_total",
                "Device placeholders of a NodeScalingWatermark released so that a pod waiting for devices could bind.",
            ),
            &["namespace", "watermark"],
        )?;
        registry.register(Box::new(placeholders.clone()))?;
        registry.register(Box::new(devices.clone()))?;
        registry.register(Box::new(yields.clone()))?;
        Ok(Metrics {
            placeholders,
            devices,
            yields,
            series: Mutex::default(),
        })
    }

    fn set(&self, namespace: &str, name: &str, observed: &Observed) {
        self.forget_entries(namespace, name);
        self.series.lock().unwrap().insert(
            (namespace.to_string(), name.to_string()),
            observed.entries.iter().map(|e| e.name.clone()).collect(),
        );
        for e in &observed.entries {
            let labels = |state| [namespace, name, e.name.as_str(), state];
            for (state, value) in [
                ("desired", e.desired),
                ("ready", e.ready),
                ("pending", e.pending),
            ] {
                self.placeholders
                    .with_label_values(&labels(state))
                    .set(i64::from(value));
            }
            if let Some(d) = e.devices {
                for (state, value) in [("total", d.total), ("in_use", d.in_use), ("held", d.held)] {
                    self.devices
                        .with_label_values(&labels(state))
                        .set(i64::from(value));
                }
            }
        }
    }

    /// Drops every series of a deleted watermark, its yields counter too.
    fn forget(&self, namespace: &str, name: &str) {
        self.forget_entries(namespace, name);
        let _ = self.yields.remove_label_values(&[namespace, name]);
    }

    /// Drops the per-entry series of a watermark (its entries may change).
    fn forget_entries(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let entries = self.series.lock().unwrap().remove(&key).unwrap_or_default();
        for entry in &entries {
            for state in ["desired", "ready", "pending"] {
                let _ = self
                    .placeholders
                    .remove_label_values(&[namespace, name, entry, state]);
            }
            for state in ["total", "in_use", "held"] {
                let _ = self
                    .devices
                    .remove_label_values(&[namespace, name, entry, state]);
            }
        }
    }
}

/// What the last successful sync of a watermark wrote: an unchanged sync
/// writes nothing.
#[derive(Default)]
struct Written {
    /// Object key (`Kind/name`) → the applied body.
    objects: BTreeMap<String, Value>,
    observed: Option<Observed>,
}

/// The headroom controller.
pub struct Controller {
    client: kube::Client,
    queue: WorkQueue<String>,
    leading: AtomicBool,
    watermarks: Store<WatermarkView>,
    pods: Store<HeadroomPod>,
    nodes: Store<HeadroomNode>,
    slices: Store<ResourceSlice>,
    classes: Store<DeviceClass>,
    claims: Store<ClaimView>,
    written: Mutex<HashMap<String, Written>>,
    informers: [Informer; 6],
    metrics: Metrics,
    /// `--headroom-yield`.
    yield_enabled: bool,
    /// Pods placeholders yielded to (by key) in the last [`YIELD_EVERY`]:
    /// at most one yield per pod in that time, and new placeholders stay
    /// gated while such a pod still waits.
    promised: Mutex<HashMap<String, Promise>>,
    /// Placeholders deleted by a yield in the last [`YIELD_EVERY`] (by key):
    /// never chosen twice while the pod cache catches up.
    released: Mutex<HashMap<String, Instant>>,
    /// Placeholders each watermark (by key) released since its status last
    /// said so.
    yields_unwritten: Mutex<HashMap<String, u64>>,
    gates: Gates,
    events: EventRecorder,
    /// The process's view of the API server (shared with the claim
    /// controller, whose probe ends an outage).
    reachability: Arc<Reachability>,
}

/// A pod makes placeholders yield at most once per this, and new
/// placeholders stay gated at most this long for a pod yielded to.
const YIELD_EVERY: Duration = Duration::from_secs(30);
/// How soon a pod that waits for devices is looked at again when no yield
/// was made for it (it seemed to fit, or nothing fits yet): the caches may
/// lag behind the scheduler, and kube-scheduler does not rewrite an
/// unchanged Unschedulable condition, so no event would come.
const RECHECK_WAITING: Duration = Duration::from_secs(5);

/// A yield made for a pod.
#[derive(Debug)]
struct Promise {
    uid: String,
    at: Instant,
    /// The devices the released placeholders held.
    freed: HashSet<DeviceId>,
    /// The released placeholders' UIDs: their claims may still show the
    /// devices until the claim controller releases them.
    placeholders: HashSet<String>,
}
/// Priority below which a pod never makes placeholders yield (the
/// chart's placeholder class is -1; a pod at or below it would not be
/// scheduled ahead of them anyway).
const PLACEHOLDER_PRIORITY: i32 = -1;
/// Queue keys of pods waiting for devices carry this prefix; watermark
/// keys are plain `namespace/name`.
const POD_KEY_PREFIX: &str = "pod:";
/// The source of the yield's events.
pub const EVENT_COMPONENT: &str = "dra-claim-controller-headroom";

fn deployments() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps", "v1", "Deployment"),
        "deployments",
    )
}

fn claim_templates() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceClaimTemplate"),
        "resourceclaimtemplates",
    )
}

impl Controller {
    /// A headroom controller; `yield_enabled` is `--headroom-yield`, `gates`
    /// the allocation features the yield's allocator may use.
    pub fn new(
        client: kube::Client,
        registry: &Registry,
        yield_enabled: bool,
        gates: Gates,
        identity: &str,
        reachability: Arc<Reachability>,
    ) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Controller {
            reachability,
            events: EventRecorder::new(client.clone(), EVENT_COMPONENT, identity.to_string()),
            yield_enabled,
            promised: Mutex::default(),
            released: Mutex::default(),
            yields_unwritten: Mutex::default(),
            gates,
            client,
            queue: WorkQueue::new(QUEUE_NAME, Some(registry)),
            leading: AtomicBool::new(false),
            watermarks: Store::new(Vec::new()),
            pods: Store::new(Vec::new()),
            nodes: Store::new(Vec::new()),
            slices: Store::new(Vec::new()),
            classes: Store::new(Vec::new()),
            claims: Store::new(Vec::new()),
            written: Mutex::default(),
            informers: [
                Informer::new("nodescalingwatermarks"),
                Informer::new("pods (headroom)"),
                Informer::new("nodes (headroom)"),
                Informer::new("resourceslices (headroom)"),
                Informer::new("deviceclasses (headroom)"),
                Informer::new("resourceclaims (headroom)"),
            ],
            metrics: Metrics::register(registry)?,
        }))
    }

    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Runs the watches until the process ends.
    pub async fn run_watches(self: Arc<Self>) {
        self.check_crd().await;
        let client = self.client.clone();
        let this = &*self;
        let [watermarks, pods, nodes, slices, classes, claims] = &this.informers;
        let (wm_events, pod_events) = (WatermarkEvents(this), PodEvents(this));
        let node_events = Mirror(this, &this.nodes, |n: &HeadroomNode| n.name().to_string());
        let slice_events = Mirror(this, &this.slices, |s: &ResourceSlice| {
            s.metadata.name.clone().unwrap_or_default()
        });
        let class_events = Mirror(this, &this.classes, |c: &DeviceClass| {
            c.metadata.name.clone().unwrap_or_default()
        });
        let claim_events = Mirror(this, &this.claims, |c: &ClaimView| {
            object_key(c.namespace(), c.name())
        });
        tokio::join!(
            watermarks.run(Api::<WatermarkView>::all(client.clone()), &wm_events),
            pods.run(Api::<HeadroomPod>::all(client.clone()), &pod_events),
            nodes.run(Api::<HeadroomNode>::all(client.clone()), &node_events),
            slices.run(Api::<ResourceSlice>::all(client.clone()), &slice_events),
            classes.run(Api::<DeviceClass>::all(client.clone()), &class_events),
            claims.run(Api::<ClaimView>::all(client.clone()), &claim_events),
        );
    }

    /// Says once, plainly, when the CRD is not installed: the watch alone
    /// would only retry with "404 page not found".
    async fn check_crd(&self) {
        let api = Api::<WatermarkView>::all(self.client.clone());
        if let Err(kube::Error::Api(status)) = api.list(&ListParams::default().limit(1)).await
            && status.code == 404
        {
            error!(
                "the NodeScalingWatermark CRD (nodescalingwatermarks.dra-claim-controller.io) is not \
                 installed: apply charts/dra-claim-controller/crds/nodescalingwatermarks.yaml (helm \
                 install does), or drop headroom from --controllers; waiting for it"
            );
        }
    }

    pub async fn wait_synced(&self) {
        for informer in &self.informers {
            informer.wait_synced().await;
        }
    }

    /// From now on events enqueue work; every watermark is queued.
    pub fn start_leading(&self) {
        self.leading.store(true, Ordering::Release);
        self.enqueue_all();
        info!(
            watermarks = self.watermarks.len(),
            "headroom leading: queued every watermark"
        );
    }

    pub async fn shut_down(&self) {
        self.leading.store(false, Ordering::Release);
        self.queue.shut_down();
        self.queue.wait_idle().await;
    }

    fn enqueue(&self, key: String) {
        if self.leading.load(Ordering::Acquire) {
            self.queue.add(key);
        }
    }

    /// Usage moves every watermark whose nodes it touches; there are few
    /// watermarks, so all are queued (the queue folds repeats, and a sync
    /// that changes nothing writes nothing).
    fn enqueue_all(&self) {
        for wm in self.watermarks.list() {
            self.enqueue(object_key(wm.namespace(), wm.name()));
        }
    }

    /// The one worker: syncs never overlap. Held while the API server is
    /// unreachable; retries by the kind of failure (`runtime::retry`).
    pub async fn run_worker(self: Arc<Self>) {
        loop {
            self.reachability.wait_reachable().await;
            let Some(key) = self.queue.get().await else {
                return;
            };
            // `key`: a watermark (`namespace/name`) or a pod waiting for
            // devices (`pod:namespace/name`).
            let reason = if key.starts_with(POD_KEY_PREFIX) {
                "pod waits for devices placeholders hold"
            } else {
                "watermark, its nodes or their usage changed"
            };
            let span = info_span!("headroom", key = %key, reason);
            let result = self.sync(&key).instrument(span.clone()).await;
            let _entered = span.enter();
            requeue(&self.queue, &self.reachability, &key, result.map(|()| None));
            self.queue.done(&key);
        }
    }

    /// Everything kept for a watermark that is gone: what was written for
    /// it, its yields not yet in its status, its metric series.
    fn forget_watermark(&self, namespace: &str, name: &str) {
        let key = object_key(namespace, name);
        self.written.lock().unwrap().remove(&key);
        self.yields_unwritten.lock().unwrap().remove(&key);
        self.metrics.forget(namespace, name);
    }

    /// Yields older than [`YIELD_EVERY`] hold nothing any more.
    fn prune_yields(&self) {
        self.promised
            .lock()
            .unwrap()
            .retain(|_, p| p.at.elapsed() < YIELD_EVERY);
        self.released
            .lock()
            .unwrap()
            .retain(|_, at| at.elapsed() < YIELD_EVERY);
    }

    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        self.prune_yields();
        if let Some(pod) = key.strip_prefix(POD_KEY_PREFIX) {
            return self.yield_for(pod).await;
        }
        let Some(wm) = self.watermarks.get(key) else {
            debug!("watermark is gone; its objects go with it (owner references)");
            return Ok(());
        };
        let (mut observed, objects) = self.decide(key, &wm)?;
        let before = self.written.lock().unwrap().remove(key).unwrap_or_default();
        // The count only grows: the cache may not show our last write yet.
        let unwritten = self
            .yields_unwritten
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or(0);
        let last = before.observed.as_ref().map_or(0, |o| o.yields);
        observed.yields = wm.status.yields.max(last) + unwritten;
        self.metrics.set(wm.namespace(), wm.name(), &observed);
        let mut written = Written {
            objects: BTreeMap::new(),
            observed: before.observed.clone(),
        };
        let result = self
            .write(&wm, &before, &mut written, objects, &observed)
            .await;
        self.written
            .lock()
            .unwrap()
            .insert(key.to_string(), written);
        result?;
        self.yields_unwritten.lock().unwrap().remove(key);
        self.lift_gates(key, &wm).await
    }

    /// How much longer new placeholders stay gated (see [`gate_hold`]).
    fn yield_hold(&self) -> Option<Duration> {
        let mut promised = self.promised.lock().unwrap();
        promised.retain(|_, p| p.at.elapsed() < YIELD_EVERY);
        let promises = promised
            .iter()
            .map(|(key, p)| (p.at.elapsed(), self.still_waits(key, &p.uid)));
        gate_hold(promises, YIELD_EVERY)
    }

    /// Whether the pod `key` (this UID) still waits: exists, unbound, not
    /// deleting, not finished.
    fn still_waits(&self, key: &str, uid: &str) -> bool {
        self.pods.get(key).is_some_and(|pod| {
            pod.uid() == uid
                && pod.spec.node_name.is_none()
                && pod.metadata.deletion_timestamp.is_none()
                && !pod.is_terminal()
        })
    }

    /// The devices yields freed for pods other than `key` that still wait
    /// for them: promised, so no other pod's yield may count them as free.
    fn promised_to_others(&self, key: &str) -> HashSet<DeviceId> {
        let promised = self.promised.lock().unwrap();
        promised
            .iter()
            .filter(|(k, p)| {
                k.as_str() != key && p.at.elapsed() < YIELD_EVERY && self.still_waits(k, &p.uid)
            })
            .flat_map(|(_, p)| p.freed.iter().cloned())
            .collect()
    }

    /// Lifts the placeholder gate of this watermark's unbound placeholders,
    /// unless a yield is in flight (then looks again when it can end).
    async fn lift_gates(&self, key: &str, wm: &WatermarkView) -> Result<(), SyncError> {
        let gated: Vec<(String, usize)> = self
            .pods
            .list()
            .iter()
            .filter(|p| {
                p.namespace() == wm.namespace()
                    && p.watermark() == Some(wm.name())
                    && p.spec.node_name.is_none()
                    && p.metadata.deletion_timestamp.is_none()
            })
            .filter_map(|p| Some((p.name().to_string(), p.spec.placeholder_gate?)))
            .collect();
        if gated.is_empty() {
            return Ok(());
        }
        if let Some(hold) = self.yield_hold() {
            debug!(
                gated = gated.len(),
                hold_ms = hold.as_millis() as u64,
                "a yield is in flight: new placeholders stay gated"
            );
            self.queue
                .add_after(key.to_string(), hold + Duration::from_millis(100));
            return Ok(());
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), wm.namespace());
        for (name, index) in &gated {
            // Guarded by the gate's name at that index: a pod whose gates
            // changed meanwhile fails the test and is looked at again.
            let patch: json_patch::Patch = serde_json::from_value(json!([
                {"op": "test", "path": format!("/spec/schedulingGates/{index}/name"), "value": PLACEHOLDER_GATE},
                {"op": "remove", "path": format!("/spec/schedulingGates/{index}")},
            ]))
            .expect("well-formed patch");
            match api
                .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(err) => {
                    return Err(SyncError::kube(
                        format!(
                            "lifting scheduling gate {PLACEHOLDER_GATE} of placeholder pod {}/{name}",
                            wm.namespace()
                        ),
                        err,
                    ));
                }
            }
        }
        info!(
            placeholders = gated.len(),
            "placeholders' scheduling gates lifted"
        );
        Ok(())
    }

    /// What the watermark wants now, from the caches: the status and the
    /// objects (templates before the Deployments that name them).
    fn decide(&self, key: &str, wm: &WatermarkView) -> Result<(Observed, Vec<Value>), SyncError> {
        let settled = wm.spec.settle();
        let mut nodes: Vec<String> = self
            .nodes
            .list()
            .iter()
            .filter(|n| selects(&settled.placement.node_selector, n.labels()))
            .map(|n| n.name().to_string())
            .collect();
        nodes.sort();
        let selected: HashSet<&str> = nodes.iter().map(String::as_str).collect();
        let pods = self.pods.list();
        let usage = workload_requests(pods.iter().map(|p| &**p), |n| selected.contains(n));
        let placeholders_of = |entry: &str| {
            let mine = pods.iter().filter(|p| {
                p.namespace() == wm.namespace()
                    && p.watermark() == Some(wm.name())
                    && p.entry() == Some(entry)
                    && !p.is_terminal()
                    && p.metadata.deletion_timestamp.is_none()
            });
            let (bound, unbound): (Vec<_>, Vec<_>) = mine.partition(|p| p.spec.node_name.is_some());
            (count(bound.len()), count(unbound.len()))
        };
        let owner = Owner {
            namespace: wm.namespace(),
            name: wm.name(),
            uid: wm.uid(),
        };
        let mut observed = Observed {
            generation: wm.metadata.generation,
            entries: Vec::new(),
            // Counted by `sync`, from the status and the yields since.
            yields: 0,
        };
        let mut objects = Vec::new();

        let (ready, pending) = placeholders_of(CPU_MEMORY_ENTRY);
        let mut cpu = EntryObserved {
            name: CPU_MEMORY_ENTRY.into(),
            ready,
            pending,
            ..EntryObserved::default()
        };
        match &settled.cpu_memory {
            Ok(entry) => {
                cpu.desired =
                    cpu_memory_placeholders(usage, entry.percentage, entry.pause, entry.bounds);
                objects.push(cpu_memory_deployment(
                    owner,
                    &settled.placement,
                    entry,
                    cpu.desired,
                ));
                debug!(cpu_in_use = %usage.cpu, memory_in_use = %usage.memory, desired = cpu.desired, "CPU/memory placeholders sized");
            }
            Err(why) => cpu.invalid = Some(why.clone()),
        }
        observed.entries.push(cpu);

        if !wm.spec.devices.is_empty() {
            let counts = self.count_entry_devices(key, wm, &nodes, &pods, &selected)?;
            for (entry, counted) in wm.spec.devices.iter().zip(counts) {
                let (ready, pending) = placeholders_of(&entry.name);
                let mut e = EntryObserved {
                    name: entry.name.clone(),
                    ready,
                    pending,
                    ..EntryObserved::default()
                };
                match counted {
                    Ok(devices) => {
                        let percentage = entry
                            .watermark_percentage
                            .unwrap_or(wm.spec.watermark_percentage);
                        let bounds = Bounds {
                            min: entry.min_placeholders,
                            max: entry.max_placeholders,
                        };
                        let per = i64::from(entry.count.unwrap_or(1));
                        e.desired = placeholders(
                            Quantity::from_units(i64::from(devices.in_use)),
                            percentage,
                            Quantity::from_units(per),
                            bounds,
                        );
                        e.devices = Some(devices);
                        objects.push(device_claim_template(owner, entry));
                        objects.push(device_deployment(
                            owner,
                            &settled.placement,
                            entry,
                            e.desired,
                        ));
                        debug!(entry = %entry.name, total = devices.total, in_use = devices.in_use, held = devices.held, desired = e.desired, "device placeholders sized");
                    }
                    Err(why) => {
                        warn!(entry = %entry.name, reason = %why, "device entry is invalid; no placeholders for it");
                        e.invalid = Some(why);
                    }
                }
                observed.entries.push(e);
            }
        }
        Ok((observed, objects))
    }

    /// Each device entry's count, or why it is invalid. Compiling and
    /// evaluating CEL happens on the solver's stack (tenant expressions).
    fn count_entry_devices(
        &self,
        key: &str,
        wm: &WatermarkView,
        nodes: &[String],
        pods: &[Arc<HeadroomPod>],
        selected: &HashSet<&str>,
    ) -> Result<Vec<Result<DeviceCount, String>>, SyncError> {
        let classes: BTreeMap<String, Arc<DeviceClass>> = self
            .classes
            .list()
            .into_iter()
            .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
            .collect();
        let slices = self.slices.list();
        let claims = self.claims.list();
        let by_uid: HashMap<&str, &HeadroomPod> = pods
            .iter()
            .filter_map(|p| Some((p.metadata.uid.as_deref()?, &**p)))
            .collect();
        let consumers = device_consumers(&claims, |uid| {
            let pod = by_uid.get(uid)?;
            match (pod.watermark(), pod.entry()) {
                (Some(w), Some(e)) => Some(Consumer::Placeholder(
                    object_key(pod.namespace(), w),
                    e.to_string(),
                )),
                _ if pod.is_workload(|n| selected.contains(n)) => Some(Consumer::Workload),
                _ => None,
            }
        });
        on_solver_stack(|| {
            wm.spec
                .devices
                .iter()
                .enumerate()
                .map(|(i, entry)| {
                    let devices = entry_devices(i, entry, &classes)?;
                    let mine = Consumer::Placeholder(key.to_string(), entry.name.clone());
                    Ok(count_devices(&devices, &mine, nodes, &slices, &consumers))
                })
                .collect()
        })
        .map_err(|err| SyncError::Invalid(format!("cannot start the CEL thread: {err}")))
    }

    /// Applies what changed since the last sync, deletes the objects of
    /// entries that are gone (or invalid), writes the status if it changed.
    async fn write(
        &self,
        wm: &WatermarkView,
        before: &Written,
        written: &mut Written,
        objects: Vec<Value>,
        observed: &Observed,
    ) -> Result<(), SyncError> {
        let ns = wm.namespace();
        for object in objects {
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let id = format!("{kind}/{name}");
            if before.objects.get(&id) != Some(&object) {
                let resource = if kind == "Deployment" {
                    deployments()
                } else {
                    claim_templates()
                };
                Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &resource)
                    .patch(
                        &name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&object),
                    )
                    .await
                    .map_err(kube_err(format!("applying {kind} {ns}/{name}")))?;
                match object["spec"]["replicas"].as_u64() {
                    Some(replicas) => info!(object = %id, replicas, "placeholders' object applied"),
                    None => info!(object = %id, "placeholders' object applied"),
                }
            }
            written.objects.insert(id, object);
        }
        let entries_changed = before.objects.keys().ne(written.objects.keys());
        if entries_changed {
            self.prune(wm, &written.objects).await?;
        }
        if written.observed.as_ref() != Some(observed) {
            self.write_status(wm, observed).await?;
            written.observed = Some(observed.clone());
        }
        Ok(())
    }

    /// Deletes this watermark's Deployments and templates that no entry
    /// wants any more (after a restart this lists once per watermark).
    async fn prune(
        &self,
        wm: &WatermarkView,
        keep: &BTreeMap<String, Value>,
    ) -> Result<(), SyncError> {
        let ns = wm.namespace();
        let selector = format!("{WATERMARK_LABEL}={}", wm.name());
        for (kind, resource) in [
            ("Deployment", deployments()),
            ("ResourceClaimTemplate", claim_templates()),
        ] {
            let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &resource);
            let listed = api
                .list_metadata(&ListParams::default().labels(&selector))
                .await
                .map_err(kube_err(format!(
                    "listing the {kind}s of NodeScalingWatermark {ns}/{}",
                    wm.name()
                )))?;
            for object in listed.items {
                let name = object.metadata.name.unwrap_or_default();
                let owned = object
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.controller == Some(true) && o.uid == wm.uid());
                if owned && !keep.contains_key(&format!("{kind}/{name}")) {
                    match api.delete(&name, &DeleteParams::background()).await {
                        Ok(_) => {
                            info!(object = %format!("{kind}/{name}"), "deleted the objects of an entry that is gone")
                        }
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(err) => {
                            return Err(SyncError::kube(
                                format!("deleting {kind} {ns}/{name}"),
                                err,
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn write_status(&self, wm: &WatermarkView, observed: &Observed) -> Result<(), SyncError> {
        let now = Timestamp::now().to_string();
        let conditions = carry_transitions(&wm.status.conditions, conditions(observed), &now);
        let api: Api<WatermarkView> = Api::namespaced(self.client.clone(), wm.namespace());
        api.patch_status(
            wm.name(),
            &PatchParams::default(),
            &Patch::Merge(status_patch(observed, &conditions)),
        )
        .await
        .map_err(kube_err(format!(
            "writing status of NodeScalingWatermark {}/{}",
            wm.namespace(),
            wm.name()
        )))?;
        Ok(())
    }
}

impl Controller {
    /// Makes device placeholders yield for the pod `key` if it still waits
    /// for devices and releasing some on one node lets it bind there.
    async fn yield_for(&self, key: &str) -> Result<(), SyncError> {
        let Some(cached) = self.pods.get(key) else {
            return Ok(());
        };
        if !cached.waits_for_devices(PLACEHOLDER_PRIORITY) {
            return Ok(());
        }
        let uid = cached.uid().to_string();
        if let Some(since) = self.live_promise(key, &uid) {
            debug!(pod = %key, since_ms = since.as_millis() as u64, "placeholders yielded for this pod less than 30 s ago; the devices they freed are not all taken");
            self.recheck(key, RECHECK_WAITING);
            return Ok(());
        }
        // The pod's constraints and claims, fresh: the cache keeps neither.
        let (ns, name) = (cached.namespace(), cached.name());
        let pod = match Api::<Pod>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
        {
            Ok(Some(pod)) => pod,
            Ok(None) => return Ok(()),
            Err(err) => return Err(SyncError::kube(format!("reading pod {key}"), err)),
        };
        let claims = self.unallocated_claims(&pod).await?;
        if claims.is_empty() {
            return Ok(());
        }
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let nodes = self.yield_nodes(priority, key);
        let classes: BTreeMap<String, Arc<DeviceClass>> = self
            .classes
            .list()
            .into_iter()
            .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
            .collect();
        let spec = pod.spec.clone().unwrap_or_default();
        let waiting = WaitingPod {
            claims: claims.iter().collect(),
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            required_affinity: spec
                .affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
            tolerations: spec.tolerations.as_deref().unwrap_or_default(),
        };
        let candidates: Vec<CandidateNode<'_>> = nodes
            .iter()
            .map(|n| CandidateNode {
                name: &n.name,
                labels: &n.labels,
                taints: &n.taints,
                inventory: &n.inventory,
                in_use: &n.in_use,
                placeholders: n.placeholders.clone(),
            })
            .collect();
        let Some(chosen) = choose_yield(&waiting, &candidates, &classes, self.gates) else {
            debug!(pod = %key, "the pod fits without a yield, or no single node would fit it after one; nothing released");
            self.recheck(key, RECHECK_WAITING);
            return Ok(());
        };
        let freed: HashSet<DeviceId> = nodes
            .iter()
            .filter(|n| n.name == chosen.node)
            .flat_map(|n| &n.placeholders)
            .filter(|p| chosen.placeholders.contains(&p.pod))
            .flat_map(|p| p.devices.iter().cloned())
            .collect();
        let placeholders: HashSet<String> = chosen
            .placeholders
            .iter()
            .filter_map(|p| self.pods.get(p).map(|pod| pod.uid().to_string()))
            .collect();
        self.promised.lock().unwrap().insert(
            key.to_string(),
            Promise {
                uid,
                at: Instant::now(),
                freed,
                placeholders,
            },
        );
        self.recheck(key, RECHECK_WAITING);
        {
            let mut released = self.released.lock().unwrap();
            released.retain(|_, at| at.elapsed() < YIELD_EVERY);
            for placeholder in &chosen.placeholders {
                released.insert(placeholder.clone(), Instant::now());
            }
        }
        for placeholder in &chosen.placeholders {
            let (p_ns, p_name) = placeholder.split_once('/').unwrap_or(("", placeholder));
            // Read before the deletion: its watch event empties the cache.
            let watermark = self
                .pods
                .get(placeholder)
                .and_then(|p| p.watermark().map(str::to_string));
            let api: Api<Pod> = Api::namespaced(self.client.clone(), p_ns);
            match api
                .delete(p_name, &DeleteParams::default().grace_period(0))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(err) => {
                    return Err(SyncError::kube(
                        format!("deleting placeholder pod {placeholder}"),
                        err,
                    ));
                }
            }
            if let Some(wm) = watermark {
                self.metrics.yields.with_label_values(&[p_ns, &wm]).inc();
                let wm_key = object_key(p_ns, &wm);
                *self
                    .yields_unwritten
                    .lock()
                    .unwrap()
                    .entry(wm_key.clone())
                    .or_default() += 1;
                self.enqueue(wm_key);
            }
        }
        info!(
            pod = %key,
            node = %chosen.node,
            placeholders = %chosen.placeholders.join(","),
            "placeholders yielded their devices for a pod waiting for devices"
        );
        let involved = Involved {
            api_version: "v1".into(),
            kind: "Pod",
            name,
            namespace: ns,
            uid: pod.metadata.uid.as_deref().unwrap_or_default(),
            resource_version: None,
        };
        self.events
            .warn(
                &involved,
                "PlaceholdersYielded",
                &format!(
                    "released {} headroom placeholder(s) on node {} ({}) so that this pod's claims \
                     can be allocated there: kube-scheduler cannot preempt pods for devices",
                    chosen.placeholders.len(),
                    chosen.node,
                    chosen.placeholders.join(", ")
                ),
            )
            .await;
        Ok(())
    }

    /// How long ago the pod (this UID) was last yielded to, if that yield
    /// still stands: less than [`YIELD_EVERY`] ago, and the devices it freed
    /// not all taken by someone else (another waiting pod may win them: the
    /// scheduler takes whichever pod comes first; then this pod may have a
    /// yield of its own at once).
    fn live_promise(&self, key: &str, uid: &str) -> Option<Duration> {
        let promised = self.promised.lock().unwrap();
        let promise = promised
            .get(key)
            .filter(|p| p.uid == uid && p.at.elapsed() < YIELD_EVERY)?;
        let held_by_others: HashSet<DeviceId> = self
            .claims
            .list()
            .iter()
            .filter(|c| !promise.placeholders.iter().any(|u| c.is_reserved_for(u)))
            .flat_map(|c| c.held_devices())
            .collect();
        (!yield_spent_elsewhere(&promise.freed, &held_by_others)).then(|| promise.at.elapsed())
    }

    /// Looks at a waiting pod again after `after` (a pod that no longer
    /// waits by then is dropped at once).
    fn recheck(&self, pod_key: &str, after: Duration) {
        self.queue
            .add_after(format!("{POD_KEY_PREFIX}{pod_key}"), after);
    }

    /// The pod's claims that are not allocated yet, read live; a claim not
    /// created yet means the yield waits for it.
    async fn unallocated_claims(&self, pod: &Pod) -> Result<Vec<ResourceClaim>, SyncError> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.clone())
            .unwrap_or_default();
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), ns);
        let mut out = Vec::new();
        for entry in pod
            .spec
            .iter()
            .flat_map(|s| s.resource_claims.iter().flatten())
        {
            let name = entry.resource_claim_name.clone().or_else(|| {
                statuses
                    .iter()
                    .find(|s| s.name == entry.name)
                    .and_then(|s| s.resource_claim_name.clone())
            });
            let Some(name) = name else {
                return Ok(Vec::new());
            };
            match api.get_opt(&name).await {
                Ok(Some(claim)) => {
                    if claim
                        .status
                        .as_ref()
                        .and_then(|s| s.allocation.as_ref())
                        .is_none()
                    {
                        out.push(claim);
                    }
                }
                Ok(None) => return Ok(Vec::new()),
                Err(err) => {
                    return Err(SyncError::kube(
                        format!("reading ResourceClaim {ns}/{name}"),
                        err,
                    ));
                }
            }
        }
        Ok(out)
    }

    /// The nodes of watermarks with device entries, with their devices and
    /// the device placeholders (below `priority`) bound there, as the yield
    /// for the pod `for_pod` sees them.
    fn yield_nodes(&self, priority: i32, for_pod: &str) -> Vec<YieldNode> {
        let nodes = self.nodes.list();
        let mut selected: BTreeMap<String, Arc<HeadroomNode>> = BTreeMap::new();
        for wm in self
            .watermarks
            .list()
            .iter()
            .filter(|w| !w.spec.devices.is_empty())
        {
            let selector = wm.spec.settle().placement.node_selector;
            for node in nodes.iter().filter(|n| selects(&selector, n.labels())) {
                selected.insert(node.name().to_string(), node.clone());
            }
        }
        let slices = self.slices.list();
        let claims = self.claims.list();
        // Devices freed for another waiting pod are as good as taken: a
        // second waiting pod must not count on them (it would wait for a
        // yield of its own while a recreated placeholder races for them).
        let mut in_use: HashSet<DeviceId> = claims.iter().flat_map(|c| c.held_devices()).collect();
        in_use.extend(self.promised_to_others(for_pod));
        let pods = self.pods.list();
        let released = self.released.lock().unwrap().clone();
        selected
            .into_iter()
            .map(|(name, node)| {
                let placeholders = pods
                    .iter()
                    .filter(|p| {
                        p.spec.node_name.as_deref() == Some(name.as_str())
                            && p.watermark().is_some()
                            && p.entry().is_some_and(|e| e != CPU_MEMORY_ENTRY)
                            && p.spec.priority.unwrap_or(0) < priority
                            && !p.is_terminal()
                            && p.metadata.deletion_timestamp.is_none()
                            && released
                                .get(&object_key(p.namespace(), p.name()))
                                .is_none_or(|at| at.elapsed() >= YIELD_EVERY)
                    })
                    .map(|p| Placeholder {
                        pod: object_key(p.namespace(), p.name()),
                        devices: claims
                            .iter()
                            .filter(|c| c.is_reserved_for(p.uid()))
                            .flat_map(|c| c.held_devices())
                            .collect(),
                    })
                    .collect();
                YieldNode {
                    inventory: node_inventory(&name, &slices),
                    labels: node.labels().clone(),
                    taints: node.spec.taints.clone(),
                    in_use: in_use.clone(),
                    placeholders,
                    name,
                }
            })
            .collect()
    }
}

/// A node as the yield needs it, owned.
struct YieldNode {
    name: String,
    labels: BTreeMap<String, String>,
    taints: Vec<k8s_openapi::api::core::v1::Taint>,
    inventory: Inventory,
    in_use: HashSet<DeviceId>,
    placeholders: Vec<Placeholder>,
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

struct WatermarkEvents<'a>(&'a Controller);

impl Handler<WatermarkView> for WatermarkEvents<'_> {
    fn relisted(&self, watermarks: Vec<WatermarkView>) {
        let entries = watermarks
            .into_iter()
            .map(|w| (object_key(w.namespace(), w.name()), Arc::new(w)))
            .collect();
        for gone in self.0.watermarks.replace(entries) {
            self.0.forget_watermark(gone.namespace(), gone.name());
        }
        self.0.enqueue_all();
    }
    fn applied(&self, wm: WatermarkView) {
        let key = object_key(wm.namespace(), wm.name());
        self.0.watermarks.apply(key.clone(), Arc::new(wm));
        self.0.enqueue(key);
    }
    fn deleted(&self, wm: WatermarkView) {
        self.0
            .watermarks
            .delete(&object_key(wm.namespace(), wm.name()));
        self.0.forget_watermark(wm.namespace(), wm.name());
    }
}

struct PodEvents<'a>(&'a Controller);

impl Handler<HeadroomPod> for PodEvents<'_> {
    fn relisted(&self, pods: Vec<HeadroomPod>) {
        let entries = pods
            .into_iter()
            .map(|p| (object_key(p.namespace(), p.name()), Arc::new(p)))
            .collect();
        self.0.pods.replace(entries);
        self.0.enqueue_all();
    }
    fn applied(&self, pod: HeadroomPod) {
        let key = object_key(pod.namespace(), pod.name());
        if self.0.yield_enabled && pod.waits_for_devices(PLACEHOLDER_PRIORITY) {
            self.0.enqueue(format!("{POD_KEY_PREFIX}{key}"));
        }
        self.0.pods.apply(key, Arc::new(pod));
        self.0.enqueue_all();
    }
    fn deleted(&self, pod: HeadroomPod) {
        self.0.pods.delete(&object_key(pod.namespace(), pod.name()));
        self.0.enqueue_all();
    }
}

/// Keeps a store in step with a watch, keyed by `key`, and queues every
/// watermark on each change (nodes, slices, classes and claims move the
/// counts).
struct Mirror<'a, K, F>(&'a Controller, &'a Store<K>, F);

impl<K, F> Handler<K> for Mirror<'_, K, F>
where
    K: Send + Sync,
    F: Fn(&K) -> String + Send + Sync,
{
    fn relisted(&self, objects: Vec<K>) {
        let entries = objects
            .into_iter()
            .map(|o| ((self.2)(&o), Arc::new(o)))
            .collect();
        self.1.replace(entries);
        self.0.enqueue_all();
    }
    fn applied(&self, object: K) {
        self.1.apply((self.2)(&object), Arc::new(object));
        self.0.enqueue_all();
    }
    fn deleted(&self, object: K) {
        self.1.delete(&(self.2)(&object));
        self.0.enqueue_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(registry: &Registry, watermark: &str) -> usize {
        registry
            .gather()
            .iter()
            .flat_map(|family| family.get_metric())
            .filter(|m| m.get_label().iter().any(|l| l.value() == watermark))
            .count()
    }

    #[test]
    fn a_deleted_watermark_leaves_no_metric_series() {
        let registry = Registry::new();
        let metrics = Metrics::register(&registry).unwrap();
        let observed = Observed {
            entries: vec![
                EntryObserved {
                    name: "cpu".into(),
                    desired: 2,
                    ready: 1,
                    pending: 1,
                    ..EntryObserved::default()
                },
                EntryObserved {
                    name: "gpu".into(),
                    devices: Some(DeviceCount::default()),
                    ..EntryObserved::default()
                },
            ],
            ..Observed::default()
        };
        metrics.set("ns", "pool", &observed);
        metrics.set("ns", "other", &observed);
        metrics.yields.with_label_values(&["ns", "pool"]).inc();
        // 3 placeholder states x 2 entries, 3 device states, 1 counter.
        assert_eq!(series(&registry, "pool"), 10);
        // An entry removed from the spec takes its series with it.
        let fewer = Observed {
            entries: observed.entries[..1].to_vec(),
            ..Observed::default()
        };
        metrics.set("ns", "pool", &fewer);
        assert_eq!(series(&registry, "pool"), 4);
        metrics.forget("ns", "pool");
        assert_eq!(series(&registry, "pool"), 0);
        assert_eq!(
            series(&registry, "other"),
            9,
            "another watermark keeps its series"
        );
    }
}
