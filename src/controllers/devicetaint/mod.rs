//! kube-controller-manager's `device-taint-eviction-controller`: pods whose
//! allocated devices carry an untolerated `NoExecute` taint (from their
//! ResourceSlice or a DeviceTaintRule) are deleted once the taint's time is
//! up, and every DeviceTaintRule's status says how far its evictions got.
//! Beyond upstream: evictions are paced, and a rule that would evict from
//! more than a set share of the allocated devices waits for an admin.
//!
//! - `mod.rs`: the [`Controller`] (its queue of pods and rules, run by the
//!   runtime with `--concurrent-device-taint-eviction-syncs` workers);
//! - `decide.rs`: when a pod must go (pure, table-tested after upstream's
//!   `TestController` cases);
//! - `tracking.rs`: the taint index and the evictions pending, kept in step
//!   with the process's stores;
//! - `watches.rs`: what pod, claim, slice and rule changes do;
//! - `evict.rs`: one eviction (fresh read, condition, guarded delete);
//! - `rule_status.rs`: a rule's `EvictionInProgress` condition (pure) and
//!   the guard's threshold; `rule_sync.rs` writes it;
//! - `metrics.rs`: upstream's two metrics and ours.
//!
//! It watches nothing of its own: it reads and observes the process's
//! stores (`crate::watches`), subscribing in [`build`].

mod budgets;
pub mod decide;
mod evict;
mod metrics;
mod pacing;
mod rule_status;
mod rule_sync;
mod tracking;
mod watches;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::{Span, info, info_span};

use crate::model::device_taints::RulesVersion;
use crate::model::features::FeatureGates;
use crate::model::views::{ClaimView, DeviceStores, PodView};
use crate::runtime::controller::{Action, Controller as Run, Lead, Queue, Reconciler, Sweep, Wake};
use crate::runtime::error::SyncError;
use crate::runtime::events::EventRecorder;
use crate::runtime::reachability::Reachability;
use crate::runtime::shared::WatchesSynced;
use crate::runtime::store::{RecentSet, Store};
use crate::shared::Shared;
use crate::watches::devices::Kinds;
use metrics::EvictionMetrics;
use pacing::Pacing;
use tracking::{Paced, Tracking};

/// kube-controller-manager's name for it: the workqueue's `name`, the
/// event source, the status field manager.
pub const CONTROLLER_NAME: &str = "device-taint-eviction-controller";

/// The reason of its events (Normal).
pub(crate) const EVENT_REASON: &str = "DeviceTaintManagerEviction";

/// How many evicted pod UIDs are remembered, so that an eviction is not
/// attempted twice while the deletion travels back through the watch.
const EVICTED_REMEMBERED: usize = 500;

/// A rule's status is looked at again this long after one of its pods was
/// scheduled for eviction or evicted.
const RULE_RECHECK: Duration = Duration::from_secs(10);

/// Why an item is queued (the `reason` of its span).
const EVICTION_DUE: &str = "eviction due";
const RULE_CHANGED: &str = "rule changed";
const RULE_HOLD_CHANGED: &str = "rule held or released by the guard";
const RULE_EVICTION_SCHEDULED: &str = "an eviction of the rule was scheduled";
const RULE_EVICTED: &str = "the rule evicted a pod";
const RULE_BLOCKED: &str = "a PodDisruptionBudget holds a pod of the rule";
const RULE_EVICTION_CHANGED: &str = "its rule changed how to evict (mode or grace period)";

/// One work item: a pod to evict (`namespace/name`), or a rule whose
/// status to write (its name).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Item {
    Pod(String),
    Rule(String),
}

/// What the admin set.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--concurrent-device-taint-eviction-syncs`.
    pub workers: usize,
    /// `--device-taint-evictions-per-second` (0: unpaced, as upstream).
    pub evictions_per_second: f64,
    /// `--device-taint-evictions-per-rule-per-second` (0: unpaced).
    pub evictions_per_rule_per_second: f64,
    /// `--device-taint-eviction-max-share` (1 or more: no guard).
    pub max_share: f64,
}

/// The eviction controller, with `DRADeviceTaints` on: it reads slices
/// (and rules, with `DRADeviceTaintRules`), and observes pods, claims,
/// slices and rules.
pub fn build(shared: &Shared, settings: Settings) -> anyhow::Result<Box<dyn Lead>> {
    let rules = shared.gates.device_taint_rules_on();
    shared.read_devices(Kinds {
        slices: true,
        rules,
        ..Kinds::default()
    });
    let claim_stores = shared.claims.stores();
    info!(
        workers = settings.workers,
        per_second = settings.evictions_per_second,
        per_rule_per_second = settings.evictions_per_rule_per_second,
        max_share = settings.max_share,
        rules,
        "device-taint eviction on"
    );
    let eviction = Controller::new(
        shared,
        settings,
        Stores {
            pods: claim_stores.pods.clone(),
            claims: claim_stores.claims.clone(),
            devices: shared.devices.stores().clone(),
            synced: shared.synced.clone(),
            rules_version: shared.devices.rules_version(),
        },
    )?;
    shared.observe_pods(eviction.clone());
    shared.observe_claims(eviction.clone());
    shared.observe_slices(eviction.clone());
    shared.observe_rules(eviction.clone());
    Ok(Box::new(eviction.run()))
}

/// The stores it reads (none of them its own).
pub struct Stores {
    pub pods: Arc<Store<PodView>>,
    pub claims: Arc<Store<ClaimView>>,
    /// The process's slices and rules.
    pub devices: DeviceStores,
    /// Whether every watch has its first list in.
    pub synced: WatchesSynced,
    /// The version rules are served in, once discovery found it.
    pub rules_version: Arc<OnceLock<RulesVersion>>,
}

pub struct Controller {
    client: kube::Client,
    events: Arc<EventRecorder>,
    metrics: EvictionMetrics,
    settings: Settings,
    gates: FeatureGates,
    stores: Stores,
    tracking: Mutex<Tracking>,
    /// Held while the taint index is rebuilt: one rebuild at a time.
    refreshing: Mutex<()>,
    evicted: RecentSet<String>,
    /// Items are queued only while leading.
    queue: Queue<Item, &'static str>,
    reachability: Arc<Reachability>,
    pacing: Mutex<Pacing>,
}

impl Controller {
    fn new(shared: &Shared, settings: Settings, stores: Stores) -> anyhow::Result<Arc<Self>> {
        let (client, registry) = (shared.client.clone(), &shared.registry);
        let pacing = Pacing::new(
            settings.evictions_per_second,
            settings.evictions_per_rule_per_second,
        );
        Ok(Arc::new(Controller {
            events: Arc::new(EventRecorder::new(
                client.clone(),
                CONTROLLER_NAME,
                shared.identity.clone(),
            )),
            client,
            metrics: EvictionMetrics::register(registry)?,
            tracking: Mutex::new(Tracking::default()),
            refreshing: Mutex::new(()),
            settings,
            gates: shared.gates,
            stores,
            evicted: RecentSet::new(EVICTED_REMEMBERED),
            queue: Queue::new(CONTROLLER_NAME, Some(registry)),
            reachability: shared.reachability.clone(),
            pacing: Mutex::new(pacing),
        }))
    }

    /// This controller as the runtime runs it, with
    /// `--concurrent-device-taint-eviction-syncs` workers.
    pub fn run(self: &Arc<Self>) -> Run<Self> {
        Run::new(self.clone(), self.queue.clone(), self.reachability.clone())
            .workers(self.settings.workers)
    }

    fn is_leading(&self) -> bool {
        self.queue.is_leading()
    }

    /// The time this eviction of `rules` may go under the pacing flags
    /// (each rule among its reasons, then overall), taken for it.
    fn pace(&self, rules: &[String]) -> Instant {
        self.pacing.lock().unwrap().reserve(rules, Instant::now())
    }

    /// An eviction that will not use the slot [`Controller::pace`] gave
    /// it gives it back.
    fn unpace(&self, paced: Option<Paced>) {
        if let Some(paced) = paced {
            let mut pacing = self.pacing.lock().unwrap();
            pacing.give_back(&paced.rules, paced.slot, Instant::now());
        }
    }
}

impl Reconciler for Controller {
    type Key = Item;
    type Why = &'static str;

    fn span(&self, item: &Item, why: &Wake<&'static str>) -> Span {
        match item {
            Item::Pod(key) => info_span!("device-taint-eviction", pod = %key, reason = %why),
            Item::Rule(name) => info_span!("device-taint-rule-status", rule = %name, reason = %why),
        }
    }

    async fn reconcile(&self, item: &Item) -> Result<Action, SyncError> {
        match item {
            Item::Pod(key) => self.evict(key).await,
            Item::Rule(name) => self.sync_rule(name).await,
        }
    }

    /// At takeover: every pending eviction and every rule's status. It
    /// keeps no resync of its own: its index follows every change.
    fn sweep(&self, _sweep: Sweep) {
        self.refresh_all(true);
        self.tell_all_held();
        let pods = self.schedule_all_pending();
        let rules = self.stores.devices.rules.list();
        for rule in &rules {
            if let Some(name) = &rule.metadata.name {
                self.queue.add_for(Item::Rule(name.clone()), Wake::Takeover);
            }
        }
        info!(
            pending_pods = pods,
            rules = rules.len(),
            "device-taint eviction leading: queued the pods to evict and every rule's status"
        );
    }
}
