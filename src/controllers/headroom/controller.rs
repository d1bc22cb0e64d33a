//! The headroom controller: its state, its queue of watermark keys (and
//! of pods waiting for devices), run by the runtime with one worker, and
//! the sync: plan from a snapshot of the stores (`watermarks/plan.rs`),
//! then write (`execute.rs`) or yield (`yielding/`). Leader only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus::Registry;
use tracing::{Span, debug, info, info_span};

use super::capacity_buffers::buffer::{self, BufferApi, BufferView};
use super::capacity_buffers::buffer_sources::Sources;
use super::doors::Door;
use super::metrics::Metrics;
use super::operator_compat::seed::{self, SeedWatermarkView};
use super::watermarks::plan::{Plan, Snapshot};
use super::watermarks::status::Observed;
use super::watermarks::watermark::{self, WatermarkView};
use crate::model::DeviceId;
use crate::model::features::FeatureGates as Gates;
use crate::model::views::{ClaimView, DeviceStores, PodView};
use crate::runtime::controller::{Action, Controller as Run, Queue, Reconciler, Sweep, Wake};
use crate::runtime::error::SyncError;
use crate::runtime::events::EventRecorder;
use crate::runtime::http::Health;
use crate::runtime::optional_api::OptionalApi;
use crate::runtime::reachability::Reachability;
use crate::runtime::shared::WatchesSynced;
use crate::runtime::store::{Store, object_key};
use serde_json::Value;

/// The queue's name (`workqueue_*{name="dra_headroom"}`).
pub(crate) const QUEUE_NAME: &str = "dra_headroom";
/// Field manager of the placeholders' objects and of the status.
pub const FIELD_MANAGER: &str = "dra-claim-controller-headroom";

/// What the flags set.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--headroom-yield`.
    pub yield_enabled: bool,
    /// `--headroom-seed-watermarks`: also serve the seed operator's
    /// watermarks.
    pub seed_watermarks: bool,
    /// `--headroom-capacity-buffers`: CapacityBuffers with our strategy get
    /// placeholder pods (in the version the cluster serves, once it does).
    pub capacity_buffers: bool,
    /// Where the front doors say whether they are open (`/readyz`).
    pub health: Health,
    /// The allocation features the yield's allocator may use.
    pub gates: Gates,
}

/// The process's stores headroom reads (it keeps only its pods and
/// watermarks itself).
pub struct Stores {
    pub devices: DeviceStores,
    pub claims: Arc<Store<ClaimView>>,
    /// The process's pods with claims: a pod headroom keeps too is held
    /// once, shared.
    pub claim_pods: Arc<Store<PodView>>,
    pub synced: WatchesSynced,
}

/// What the last successful sync of a watermark wrote: an unchanged sync
/// writes nothing.
#[derive(Default)]
pub(super) struct Written {
    /// Object key (`Kind/name`) → the applied body.
    pub(super) objects: BTreeMap<String, Value>,
    pub(super) observed: Option<Observed>,
}

/// What the last sync of a seed watermark or a CapacityBuffer wrote: its
/// Deployment, and the outcome its status says (`T` on success, or why
/// not) for which generation. An unchanged sync writes nothing.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct DeploymentWritten<T> {
    pub(super) deployment: Option<Value>,
    pub(super) status: Option<(Result<T, String>, Option<i64>)>,
}

// Not derived: a derive would ask `T: Default`.
impl<T> Default for DeploymentWritten<T> {
    fn default() -> Self {
        DeploymentWritten {
            deployment: None,
            status: None,
        }
    }
}

/// The placeholders of one front door's object: a NodeScalingWatermark of
/// ours or a CapacityBuffer with our strategy. The one rule for "a
/// placeholder of ours": the placeholder label ([`crate::naming::WATERMARK_LABEL`])
/// with this value, in this namespace. Every sync of a door ends by lifting
/// the gates of its placeholders ([`Controller::sync`]), so no door can
/// leave them gated. (The seed operator's placeholders carry no claims and
/// no gate.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Placeholders {
    pub(super) namespace: String,
    pub(super) label: String,
    /// A CapacityBuffer's (their entry label says so): a watermark named
    /// like a buffer's label never claims the buffer's placeholders.
    pub(super) of_buffer: bool,
}

impl Placeholders {
    /// The placeholders of the door object behind a queue key (none for a
    /// seed watermark or a pod).
    pub(super) fn of_key(key: &str) -> Option<Placeholders> {
        if key.starts_with(POD_KEY_PREFIX) || key.starts_with(SEED_KEY_PREFIX) {
            return None;
        }
        let (of_buffer, object) = match key.strip_prefix(BUFFER_KEY_PREFIX) {
            Some(buffer) => (true, buffer),
            None => (false, key),
        };
        let (namespace, name) = object.split_once('/')?;
        Some(Placeholders {
            namespace: namespace.to_string(),
            label: if of_buffer {
                buffer::placeholder_label(name)
            } else {
                name.to_string()
            },
            of_buffer,
        })
    }

    /// Whether `pod` is one of these placeholders.
    pub(super) fn holds(&self, pod: &PodView) -> bool {
        pod.namespace() == self.namespace
            && pod.placeholder_of() == Some(self.label.as_str())
            && (pod.placeholder_entry() == Some(buffer::BUFFER_ENTRY)) == self.of_buffer
    }
}

/// The headroom controller.
pub struct Controller {
    pub(super) client: kube::Client,
    /// Keys are queued only while leading.
    pub(super) queue: Queue<String, &'static str>,
    pub(super) watermarks: Store<WatermarkView>,
    /// The pods headroom reads, of the process's one pod watch: those that
    /// hold a node, wait for devices, or are placeholders (see
    /// `watches::keeps`).
    pub(super) pods: Store<PodView>,
    /// The process's pods with claims, whose copies `pods` shares.
    pub(super) claim_pods: Arc<Store<PodView>>,
    /// The process's slices, classes and nodes.
    pub(super) devices: DeviceStores,
    /// The process's claim store.
    pub(super) claims: Arc<Store<ClaimView>>,
    /// Whether the process's watches have their first lists in.
    pub(super) synced: WatchesSynced,
    pub(super) written: Mutex<HashMap<String, Written>>,
    /// Our watermarks' door, whose watch only headroom runs.
    pub(super) watermark_door: Door,
    /// The seed operator's watermarks, when served (their own door).
    pub(super) seed_watermarks: Store<SeedWatermarkView>,
    pub(super) seed_door: Option<Door>,
    pub(super) seed_written: Mutex<HashMap<String, DeploymentWritten<()>>>,
    /// CapacityBuffers, when served (their own door; the version once the
    /// door opened).
    pub(super) buffers: Store<BufferView>,
    pub(super) buffer_api: OnceLock<BufferApi>,
    pub(super) buffer_door: Option<Door>,
    /// The watches of what buffers read their pod shapes from.
    pub(super) sources: Sources,
    pub(super) health: Health,
    pub(super) buffer_written: Mutex<HashMap<String, DeploymentWritten<u32>>>,
    pub(super) metrics: Metrics,
    /// `--headroom-yield`.
    pub(super) yield_enabled: bool,
    /// Pods placeholders yielded to (by key) in the last [`YIELD_EVERY`]:
    /// at most one yield per pod in that time, and new placeholders stay
    /// gated while such a pod still waits.
    pub(super) promised: Mutex<HashMap<String, Promise>>,
    /// Placeholders deleted by a yield in the last [`YIELD_EVERY`] (by key):
    /// never chosen twice while the pod cache catches up.
    pub(super) released: Mutex<HashMap<String, Instant>>,
    /// Placeholders each watermark (by key) released since its status last
    /// said so.
    pub(super) yields_unwritten: Mutex<HashMap<String, u64>>,
    pub(super) gates: Gates,
    pub(super) events: EventRecorder,
    /// The process's view of the API server (shared with the claim
    /// controller, whose probe ends an outage).
    pub(super) reachability: Arc<Reachability>,
}

/// A pod makes placeholders yield at most once per this, and new
/// placeholders stay gated at most this long for a pod yielded to.
pub(super) const YIELD_EVERY: Duration = Duration::from_secs(30);
/// How soon a pod that waits for devices is looked at again when no yield
/// was made for it (it seemed to fit, or nothing fits yet): the caches may
/// lag behind the scheduler, and kube-scheduler does not rewrite an
/// unchanged Unschedulable condition, so no event would come.
pub(super) const RECHECK_WAITING: Duration = Duration::from_secs(5);

/// A yield made for a pod.
#[derive(Debug)]
pub(super) struct Promise {
    pub(super) uid: String,
    pub(super) at: Instant,
    /// The devices the released placeholders held.
    pub(super) freed: HashSet<DeviceId>,
    /// The released placeholders' UIDs: their claims may still show the
    /// devices until the claim controller releases them.
    pub(super) placeholders: HashSet<String>,
}
/// Priority below which a pod never makes placeholders yield (the
/// chart's placeholder class is -1; a pod at or below it would not be
/// scheduled ahead of them anyway).
pub(super) const PLACEHOLDER_PRIORITY: i32 = -1;
/// Queue keys of pods waiting for devices carry this prefix; watermark
/// keys are plain `namespace/name`.
pub(super) const POD_KEY_PREFIX: &str = "pod:";
/// Queue keys of CapacityBuffers carry this prefix.
pub(super) const BUFFER_KEY_PREFIX: &str = "buffer:";
/// Queue keys of the seed operator's watermarks carry this prefix.
pub(super) const SEED_KEY_PREFIX: &str = "seed:";
/// The source of the yield's events.
pub(crate) const EVENT_COMPONENT: &str = "dra-claim-controller-headroom";

impl Controller {
    /// A headroom controller; `yield_enabled` is `--headroom-yield`, `gates`
    /// the allocation features the yield's allocator may use.
    pub fn new(
        client: kube::Client,
        registry: &Registry,
        settings: Settings,
        stores: Stores,
        identity: &str,
        reachability: Arc<Reachability>,
    ) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Controller {
            reachability,
            events: EventRecorder::new(client.clone(), EVENT_COMPONENT, identity.to_string()),
            yield_enabled: settings.yield_enabled,
            promised: Mutex::default(),
            released: Mutex::default(),
            yields_unwritten: Mutex::default(),
            gates: settings.gates,
            client,
            queue: Queue::new(QUEUE_NAME, Some(registry)),
            watermarks: Store::new(Vec::new()),
            pods: Store::new(Vec::new()),
            claim_pods: stores.claim_pods,
            devices: stores.devices,
            claims: stores.claims,
            synced: stores.synced,
            written: Mutex::default(),
            watermark_door: Door::new(
                OptionalApi {
                    group: watermark::GROUP,
                    versions: &[watermark::VERSION],
                    plural: "nodescalingwatermarks",
                },
                "nodescalingwatermarks.dra-claim-controller.io",
                "apply charts/dra-claim-controller/crds/nodescalingwatermarks.yaml (helm install does), \
                 or drop headroom from --controllers",
            ),
            seed_watermarks: Store::new(Vec::new()),
            seed_written: Mutex::default(),
            buffers: Store::new(Vec::new()),
            buffer_door: settings.capacity_buffers.then(|| {
                Door::new(
                    OptionalApi {
                        group: buffer::GROUP,
                        versions: &buffer::VERSIONS,
                        plural: buffer::PLURAL,
                    },
                    "capacitybuffers.autoscaling.x-k8s.io",
                    "install the cluster-autoscaler's CapacityBuffer CRD, or drop --headroom-capacity-buffers",
                )
            }),
            buffer_api: OnceLock::new(),
            sources: Sources::default(),
            health: settings.health.clone(),
            buffer_written: Mutex::default(),
            seed_door: settings.seed_watermarks.then(|| {
                Door::new(
                    OptionalApi {
                        group: seed::GROUP,
                        versions: &[seed::VERSION],
                        plural: "nodescalingwatermarks",
                    },
                    "nodescalingwatermarks.redhatcop.redhat.io",
                    "install the chart with headroom.seedOperator.enabled=true, or drop --headroom-seed-watermarks",
                )
            }),
            metrics: Metrics::register(registry)?,
        }))
    }

    /// This controller as the runtime runs it: one worker, so syncs never
    /// overlap.
    pub fn run(self: &Arc<Self>) -> Run<Self> {
        Run::new(self.clone(), self.queue.clone(), self.reachability.clone())
    }

    /// Every CapacityBuffer with our strategy. Not part of [`Self::enqueue_all`]:
    /// that runs on every claim, slice and node change, and a buffer's
    /// count does not follow those (its sync reads its source live).
    fn queue_buffers(&self, why: Wake<&'static str>) {
        for buffer in self.buffers.list().iter().filter(|b| b.spec.is_ours()) {
            let key = format!(
                "{BUFFER_KEY_PREFIX}{}",
                object_key(buffer.namespace(), buffer.name())
            );
            self.queue.add_for(key, why.clone());
        }
    }

    pub(super) fn enqueue(&self, key: String) {
        let why = reason_of(&key);
        self.queue.add(key, why);
    }

    /// Devices, classes, slices and nodes move every watermark's counts;
    /// there are few watermarks, so all are queued (the queue folds
    /// repeats, and a sync that changes nothing writes nothing).
    pub(super) fn enqueue_all(&self) {
        self.queue_watermarks(Wake::Event(reason_of("")));
    }

    fn queue_watermarks(&self, why: Wake<&'static str>) {
        if !self.queue.is_leading() {
            return;
        }
        for wm in self.watermarks.list() {
            self.queue
                .add_for(object_key(wm.namespace(), wm.name()), why.clone());
        }
        for wm in self.seed_watermarks.list() {
            let key = format!("{SEED_KEY_PREFIX}{}", object_key(wm.namespace(), wm.name()));
            self.queue.add_for(key, why.clone());
        }
    }

    /// Everything kept for a watermark that is gone: what was written for
    /// it, its yields not yet in its status, its metric series.
    pub(super) fn forget_watermark(&self, namespace: &str, name: &str) {
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

    /// The stores as this sync reads them.
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            nodes: self.devices.nodes.list(),
            pods: self.pods.list(),
            classes: self.devices.classes.list(),
            slices: self.devices.slices.list(),
            claims: self.claims.list(),
        }
    }

    /// The queue key of the door object whose placeholder `pod` is: a
    /// watermark of ours (`namespace/name`) or a CapacityBuffer
    /// (`buffer:namespace/name`).
    pub(super) fn door_key_of(&self, pod: &PodView) -> Option<String> {
        let label = pod.placeholder_of()?;
        if pod.placeholder_entry() == Some(buffer::BUFFER_ENTRY) {
            return self
                .buffers
                .list()
                .iter()
                .find(|b| {
                    b.namespace() == pod.namespace() && buffer::placeholder_label(b.name()) == label
                })
                .map(|b| format!("{BUFFER_KEY_PREFIX}{}", object_key(b.namespace(), b.name())));
        }
        Some(object_key(pod.namespace(), label))
    }

    /// One sync of `key`: a pod waiting for devices gets its yield; a door's
    /// object (watermark, seed watermark, buffer) its placeholders, whose
    /// gates are then lifted, the same way for every door.
    pub(super) async fn sync(&self, key: &str) -> Result<(), SyncError> {
        self.prune_yields();
        if let Some(pod) = key.strip_prefix(POD_KEY_PREFIX) {
            return self.yield_for(pod).await;
        }
        let served = self.sync_door(key).await?;
        match Placeholders::of_key(key).filter(|_| served) {
            Some(placeholders) => self.lift_gates(key, &placeholders).await,
            None => Ok(()),
        }
    }

    /// The placeholders' objects and status of a door's object; whether
    /// the object is there and ours to serve (the placeholders of one that
    /// is gone keep their gate until the garbage collector takes them).
    async fn sync_door(&self, key: &str) -> Result<bool, SyncError> {
        if let Some(seed) = key.strip_prefix(SEED_KEY_PREFIX) {
            return self.sync_seed(seed).await.map(|()| true);
        }
        if let Some(buffer) = key.strip_prefix(BUFFER_KEY_PREFIX) {
            let ours = self.buffers.get(buffer).is_some_and(|b| b.spec.is_ours());
            return match self.buffer_api.get() {
                Some(api) => self.sync_buffer(buffer, api).await.map(|()| ours),
                None => Ok(false),
            };
        }
        let Some(wm) = self.watermarks.get(key) else {
            debug!("watermark is gone; its objects go with it (owner references)");
            return Ok(false);
        };
        let Plan {
            mut observed,
            objects,
        } = self.snapshot().plan(key, &wm)?;
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
        Ok(true)
    }
}

/// Why a key is queued, from its kind: a pod waiting for devices, or a
/// door's object whose placeholders may need to change.
fn reason_of(key: &str) -> &'static str {
    if key.starts_with(POD_KEY_PREFIX) {
        "pod waits for devices placeholders hold"
    } else {
        "watermark, its nodes or their usage changed"
    }
}

impl Reconciler for Controller {
    /// A watermark (`namespace/name`), a seed watermark (`seed:…`), a
    /// CapacityBuffer (`buffer:…`) or a pod waiting for devices (`pod:…`).
    type Key = String;
    type Why = &'static str;

    fn span(&self, key: &String, why: &Wake<&'static str>) -> Span {
        info_span!("headroom", key = %key, reason = %why)
    }

    async fn reconcile(&self, key: &String) -> Result<Action, SyncError> {
        self.sync(key).await.map(|()| Action::Done)
    }

    /// At takeover: every watermark and buffer.
    fn sweep(&self, sweep: Sweep) {
        self.queue_watermarks(sweep.wake());
        self.queue_buffers(sweep.wake());
        info!(
            watermarks = self.watermarks.len(),
            buffers = self.buffers.len(),
            "headroom leading: queued every watermark and buffer"
        );
    }
}
