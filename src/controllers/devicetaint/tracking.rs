//! What the controller keeps between events: the index of every device's
//! taints (held rules left out), the evictions pending by pod, the rules
//! held by the guard, and how many pods each rule evicted. Every change of
//! a store brings the pods it may concern here to be decided again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceTaintRule;
use k8s_openapi::jiff::Timestamp;
use tracing::{info, warn};

use super::decide::{Eviction, pod_eviction};
use super::rule_status::{CONFIRM_ANNOTATION, is_held};
use super::{
    Controller, EVENT_REASON, EVICTION_DUE, Item, RULE_EVICTION_CHANGED, RULE_EVICTION_SCHEDULED,
    RULE_HOLD_CHANGED, RULE_RECHECK,
};
use crate::model::consumers::{is_pod_consumer, is_pod_group_consumer};
use crate::model::device_taints::{DeviceTaints, TaintRule, TaintSource};
use crate::model::indexes::PODS_BY_GROUP;
use crate::model::views::ClaimView;
use crate::runtime::events::Involved;
use crate::runtime::store::object_key;

/// An eviction decided for one pod (by UID: a pod replaced under the same
/// name is another pod).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Pending {
    pub uid: String,
    pub eviction: Eviction,
}

impl Pending {
    /// The names of the rules among its reasons.
    pub(crate) fn rules(&self) -> Vec<String> {
        self.eviction
            .reasons
            .iter()
            .filter_map(|r| match r {
                TaintSource::Rule { name, .. } => Some(name.clone()),
                TaintSource::Slice { .. } => None,
            })
            .collect()
    }

    pub(crate) fn has_rule_uid(&self, uid: &str) -> bool {
        self.eviction
            .reasons
            .iter()
            .any(|r| matches!(r, TaintSource::Rule { uid: u, .. } if u == uid))
    }
}

/// A rule the guard holds: how many allocated devices it selects, of how
/// many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub selected: usize,
    pub allocated: usize,
}

/// A pod whose eviction a PodDisruptionBudget refused: which budget
/// (`namespace/name`), and how many times in a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub uid: String,
    pub budget: String,
    pub refusals: u32,
}

/// An eviction due and its slot under the pacing.
#[derive(Debug, Clone)]
pub(crate) struct Paced {
    /// When it was due and asked for its slot (for the wait metric).
    pub since: std::time::Instant,
    /// When it may go.
    pub slot: std::time::Instant,
    /// The rules it took the slot from.
    pub rules: Vec<String>,
}

#[derive(Default)]
pub(crate) struct Tracking {
    /// Pods a budget holds, by pod key (evictions through the Eviction API).
    pub blocked: HashMap<String, Blocked>,
    pub taints: Arc<DeviceTaints>,
    pub pending: HashMap<String, Pending>,
    pub held: BTreeMap<String, Held>,
    /// Pods evicted since this replica started leading, by rule UID.
    pub evicted_by_rule: HashMap<String, u64>,
    /// The pacing slot of each eviction due, by pod key, until it goes.
    pub paced: HashMap<String, Paced>,
    /// When this process first saw each rule's generation, by rule UID
    /// (a `None` rule's preview waits for the other watches from then).
    pub rule_seen: HashMap<String, (Option<i64>, std::time::Instant)>,
    /// The `None` rules (UID, generation) whose preview this process wrote:
    /// not written again, even before the watch brings the write back.
    pub previewed: std::collections::HashSet<(String, Option<i64>)>,
}

impl Controller {
    pub(crate) fn pod_group_claims(&self) -> bool {
        self.gates.workload_resource_claims
    }

    /// Rebuilds the taint index from the stores (with `rules_changed`,
    /// the guard's holds too), then decides every pod with an allocated
    /// claim again.
    pub(crate) fn refresh_all(&self, rules_changed: bool) {
        self.refresh_taints(rules_changed);
        let keys = self.pods_with_allocated_claims();
        self.decide_pods(keys);
    }

    /// Rebuilds the index of taints from the slices and the rules not held.
    /// The guard decides its holds again only with `rules_changed` (a rule
    /// came, went or changed, the claims were relisted, this replica took
    /// the lead): a hold does not flip in the middle of a drain as claims
    /// come and go. Refreshes run one at a time, so an older build never
    /// replaces a newer one. The status of each rule whose hold changed is
    /// queued.
    pub(crate) fn refresh_taints(&self, rules_changed: bool) {
        let _one_at_a_time = self.refreshing.lock().unwrap();
        let rules: Vec<Arc<DeviceTaintRule>> = self.stores.devices.rules.list();
        let held = if rules_changed {
            self.decide_holds(&rules)
        } else {
            let names: BTreeSet<&str> = rules
                .iter()
                .filter_map(|r| r.metadata.name.as_deref())
                .collect();
            let mut held = self.tracking.lock().unwrap().held.clone();
            held.retain(|name, _| names.contains(name.as_str()));
            held
        };
        let slices = self.stores.devices.slices.list();
        let rules = rules
            .iter()
            .filter(|r| !held.contains_key(r.metadata.name.as_deref().unwrap_or_default()))
            .map(|r| TaintRule::from_v1(r))
            .collect();
        let taints = Arc::new(DeviceTaints::new(slices.iter().map(|s| s.as_ref()), rules));
        let mut tracking = self.tracking.lock().unwrap();
        tracking.taints = taints;
        let newly_held: Vec<(String, Held)> = held
            .iter()
            .filter(|(name, _)| !tracking.held.contains_key(*name))
            .map(|(n, h)| (n.clone(), *h))
            .collect();
        let released: Vec<String> = tracking
            .held
            .keys()
            .filter(|name| !held.contains_key(*name))
            .cloned()
            .collect();
        tracking.held = held;
        self.metrics.set_held(tracking.held.len());
        drop(tracking);
        for (name, held) in &newly_held {
            self.tell_held(name, *held);
        }
        if self.is_leading() {
            for name in newly_held.into_iter().map(|(n, _)| n).chain(released) {
                self.queue.add(Item::Rule(name), RULE_HOLD_CHANGED);
            }
        }
    }

    /// Tells of every held rule (a replica that just took the lead: the
    /// standby it was told nobody).
    pub(crate) fn tell_all_held(&self) {
        let held: Vec<(String, Held)> = self
            .tracking
            .lock()
            .unwrap()
            .held
            .iter()
            .map(|(n, h)| (n.clone(), *h))
            .collect();
        for (name, held) in held {
            self.tell_held(&name, held);
        }
    }

    /// The `NoExecute` rules the guard holds now: unconfirmed, selecting
    /// more than the allowed share of the allocated devices.
    fn decide_holds(&self, rules: &[Arc<DeviceTaintRule>]) -> BTreeMap<String, Held> {
        let max_share = self.settings.max_share;
        let candidates: Vec<(&Arc<DeviceTaintRule>, TaintRule)> = rules
            .iter()
            .filter(|r| r.spec.taint.effect == "NoExecute")
            .filter(|r| {
                r.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(CONFIRM_ANNOTATION))
                    .is_none_or(|v| v != "true")
            })
            .map(|r| (r, TaintRule::from_v1(r)))
            .collect();
        if max_share >= 1.0 || candidates.is_empty() {
            return BTreeMap::new();
        }
        let claims = self.stores.claims.list();
        let allocated: Vec<_> = claims
            .iter()
            .filter_map(|c| c.status.allocation.as_ref())
            .flat_map(|a| a.devices.results.iter())
            .collect();
        let mut held = BTreeMap::new();
        for (rule, taint_rule) in candidates {
            let selected = allocated
                .iter()
                .filter(|d| taint_rule.selects(&d.driver, &d.pool, &d.device))
                .count();
            if is_held(selected, allocated.len(), max_share, false) {
                held.insert(
                    rule.metadata.name.clone().unwrap_or_default(),
                    Held {
                        selected,
                        allocated: allocated.len(),
                    },
                );
            }
        }
        held
    }

    /// Says once, in the log and as a Warning event on the rule, that a
    /// rule is held and how to confirm it.
    fn tell_held(&self, name: &str, held: Held) {
        warn!(
            rule = %name,
            selected = held.selected,
            allocated = held.allocated,
            max_share = self.settings.max_share,
            "DeviceTaintRule held: it selects more of the allocated devices than \
             --device-taint-eviction-max-share allows; annotate it {CONFIRM_ANNOTATION}=true to evict"
        );
        if !self.is_leading() {
            return;
        }
        let Some(rule) = self.stores.devices.rules.get(name) else {
            return;
        };
        let events = self.events.clone();
        let message = format!(
            "Not evicting: this rule selects {} of the {} allocated devices, more than \
             --device-taint-eviction-max-share={} allows. Confirm with: kubectl annotate \
             devicetaintrule {name} {CONFIRM_ANNOTATION}=true",
            held.selected, held.allocated, self.settings.max_share
        );
        let (name, uid) = (
            name.to_string(),
            rule.metadata.uid.clone().unwrap_or_default(),
        );
        let api_version = self
            .stores
            .rules_version
            .get()
            .map_or("resource.k8s.io/v1", |v| v.api_version())
            .to_string();
        tokio::spawn(async move {
            let involved = Involved {
                api_version,
                kind: "DeviceTaintRule",
                name: &name,
                // Cluster-scoped: the event goes to `default`.
                namespace: "",
                uid: &uid,
                resource_version: None,
            };
            events.warn(&involved, "EvictionHeld", &message).await;
        });
    }

    /// Every pod a claim is reserved for (pods by name and UID; with
    /// PodGroup claims, the members of a reserved PodGroup).
    pub(crate) fn pods_of_claim(&self, claim: &ClaimView, into: &mut BTreeSet<String>) {
        for r in claim.status.reserved_for.iter() {
            if is_pod_consumer(r) {
                let key = object_key(claim.namespace(), &r.name);
                if self.stores.pods.get(&key).is_some_and(|p| p.uid() == r.uid) {
                    into.insert(key);
                }
            } else if is_pod_group_consumer(r) && self.pod_group_claims() {
                let group = object_key(claim.namespace(), &r.name);
                for pod in self.stores.pods.by_index(PODS_BY_GROUP, &group) {
                    into.insert(object_key(pod.namespace(), pod.name()));
                }
            }
        }
    }

    /// The pods of every allocated claim.
    pub(crate) fn pods_with_allocated_claims(&self) -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        for claim in self.stores.claims.list() {
            if claim.status.allocation.is_some() {
                self.pods_of_claim(&claim, &mut keys);
            }
        }
        // Pods still pending may have lost their claims meanwhile.
        keys.extend(self.tracking.lock().unwrap().pending.keys().cloned());
        keys
    }

    /// The pods of the allocated claims with a device in `pool`.
    pub(crate) fn pods_using_pool(&self, driver: &str, pool: &str) -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        for claim in self.stores.claims.list() {
            let uses = claim.status.allocation.as_ref().is_some_and(|a| {
                a.devices
                    .results
                    .iter()
                    .any(|d| d.driver == driver && d.pool == pool)
            });
            if uses {
                self.pods_of_claim(&claim, &mut keys);
            }
        }
        keys
    }

    /// Decides each pod again.
    pub(crate) fn decide_pods(&self, keys: impl IntoIterator<Item = String>) {
        for key in keys {
            self.decide_pod(&key);
        }
    }

    /// When the pod `key` must go now, if ever; a new or changed eviction
    /// is scheduled, one no longer due is cancelled (with upstream's
    /// event).
    pub(crate) fn decide_pod(&self, key: &str) {
        let pod = self.stores.pods.get(key);
        let mut tracking = self.tracking.lock().unwrap();
        // A pod being deleted (by us or anyone) has nothing left to evict.
        let live = pod
            .as_ref()
            .filter(|p| !p.is_deleting() && !self.evicted.contains(&p.uid().to_string()));
        let decided = live.and_then(|pod| {
            let claim = |ns: &str, name: &str| self.stores.claims.get(&object_key(ns, name));
            pod_eviction(pod, claim, &tracking.taints, self.pod_group_claims()).map(|eviction| {
                Pending {
                    uid: pod.uid().to_string(),
                    eviction,
                }
            })
        });
        let before = tracking.pending.get(key).cloned();
        match decided {
            Some(pending) if before.as_ref() == Some(&pending) => {}
            Some(pending) => {
                tracking.pending.insert(key.to_string(), pending.clone());
                // Its reasons (or pod) changed: a slot taken under the old
                // ones is given back; the new eviction takes its own.
                let paced = tracking.paced.remove(key);
                drop(tracking);
                self.unpace(paced);
                self.schedule(key, &pending);
            }
            None => {
                let paced = tracking.paced.remove(key);
                let Some(before) = tracking.pending.remove(key) else {
                    return;
                };
                drop(tracking);
                self.unpace(paced);
                // A deleted (or deleting) pod is cancelled without a word,
                // as upstream.
                if let Some(pod) = pod.filter(|p| p.uid() == before.uid && !p.is_deleting()) {
                    info!(pod = %key, "device-taint eviction cancelled");
                    self.tell_pod(
                        pod.namespace(),
                        pod.name(),
                        pod.uid(),
                        "Cancelling deletion",
                    );
                }
            }
        }
    }

    /// Queues now the pods a budget holds for `rule` (leader only).
    pub(crate) fn retry_held_by(&self, rule: &DeviceTaintRule) {
        if !self.queue.is_leading() {
            return;
        }
        let uid = rule.metadata.uid.as_deref().unwrap_or_default();
        let held: Vec<String> = {
            let tracking = self.tracking.lock().unwrap();
            tracking
                .blocked
                .iter()
                .filter(|(key, blocked)| {
                    tracking
                        .pending
                        .get(*key)
                        .is_some_and(|p| p.uid == blocked.uid && p.has_rule_uid(uid))
                })
                .map(|(key, _)| key.clone())
                .collect()
        };
        for key in held {
            self.queue.add(Item::Pod(key), RULE_EVICTION_CHANGED);
        }
    }

    /// A pod deleted, gone or evicted: its eviction goes without a word
    /// (not that of a pod under the same name with another UID).
    pub(crate) fn forget_pod(&self, key: &str, uid: &str) {
        let mut tracking = self.tracking.lock().unwrap();
        let mut paced = None;
        if tracking.pending.get(key).is_some_and(|p| p.uid == uid) {
            tracking.pending.remove(key);
            paced = tracking.paced.remove(key);
        }
        if tracking.blocked.get(key).is_some_and(|b| b.uid == uid) {
            tracking.blocked.remove(key);
        }
        drop(tracking);
        self.unpace(paced);
    }

    /// Queues the eviction for its time (leader only), and the status of
    /// each rule among its reasons for a little later.
    fn schedule(&self, key: &str, pending: &Pending) {
        if !self.is_leading() {
            return;
        }
        let now = Timestamp::now();
        let at = pending.eviction.at;
        if at <= now {
            self.queue.add(Item::Pod(key.to_string()), EVICTION_DUE);
        } else {
            let delay = now.duration_until(at).unsigned_abs();
            self.queue
                .add_after(Item::Pod(key.to_string()), delay, EVICTION_DUE);
        }
        info!(pod = %key, at = %at, reasons = pending.eviction.reasons.len(), "device-taint eviction scheduled");
        for rule in pending.rules() {
            self.queue
                .add_after(Item::Rule(rule), RULE_RECHECK, RULE_EVICTION_SCHEDULED);
        }
    }

    /// Queues every pending eviction; returns how many.
    pub(crate) fn schedule_all_pending(&self) -> usize {
        let pending: Vec<(String, Pending)> = self
            .tracking
            .lock()
            .unwrap()
            .pending
            .iter()
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect();
        for (key, p) in &pending {
            self.schedule(key, p);
        }
        pending.len()
    }

    /// A Normal event about the pod (leader only; written in the
    /// background: watch handlers never wait on the API server).
    pub(crate) fn tell_pod(&self, namespace: &str, name: &str, uid: &str, message: &'static str) {
        self.event_on_pod(
            namespace,
            name,
            uid,
            EVENT_REASON,
            message.to_string(),
            false,
        );
    }

    /// A Normal (or, `warning`, Warning) event on the pod, sent beside the
    /// work (the recorder aggregates repeats).
    pub(crate) fn event_on_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        reason: &'static str,
        message: String,
        warning: bool,
    ) {
        if !self.is_leading() {
            return;
        }
        let events = self.events.clone();
        let (name, namespace, uid) = (name.to_string(), namespace.to_string(), uid.to_string());
        tokio::spawn(async move {
            let involved = Involved {
                api_version: "v1".into(),
                kind: "Pod",
                name: &name,
                namespace: &namespace,
                uid: &uid,
                resource_version: None,
            };
            if warning {
                events.warn(&involved, reason, &message).await;
            } else {
                events.normal(&involved, reason, &message).await;
            }
        });
    }
}
