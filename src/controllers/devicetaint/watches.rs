//! What wakes the eviction controller: a pod's change decides that pod
//! again; a claim's change decides the pods it is (or was) reserved for; a
//! slice change that may move a taint rebuilds the index and decides the
//! pods using its pool; a rule's spec (or confirmation) change rebuilds
//! the index, decides every pod with an allocated claim and writes the
//! rule's status at once. Status-only rule updates do nothing.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::{DeviceTaintRule, ResourceSlice};
use tracing::info;

use super::budgets::respects_budgets;
use super::rule_status::CONFIRM_ANNOTATION;
use super::{Controller, Item, RULE_CHANGED};
use crate::model::device_taints::grace_period_of;
use crate::model::views::{ClaimView, PodView};
use crate::runtime::informer::Observer;
use crate::runtime::store::object_key;

impl Observer<PodView> for Controller {
    fn relisted(&self) {
        self.refresh_all(false);
    }
    fn applied(&self, _old: Option<&PodView>, pod: &PodView) {
        self.decide_pod(&object_key(pod.namespace(), pod.name()));
    }
    fn deleted(&self, pod: &PodView) {
        self.forget_pod(&object_key(pod.namespace(), pod.name()), pod.uid());
    }
}

impl Observer<ClaimView> for Controller {
    fn relisted(&self) {
        // The guard's shares are of the allocated devices: decided again.
        self.refresh_all(true);
    }
    fn applied(&self, old: Option<&ClaimView>, claim: &ClaimView) {
        let mut keys = BTreeSet::new();
        if let Some(old) = old {
            self.pods_of_claim(old, &mut keys);
        }
        self.pods_of_claim(claim, &mut keys);
        self.decide_pods(keys);
    }
    fn deleted(&self, claim: &ClaimView) {
        let mut keys = BTreeSet::new();
        self.pods_of_claim(claim, &mut keys);
        self.decide_pods(keys);
    }
}

/// Whether any device of the slice carries a taint.
fn tainted(slice: &ResourceSlice) -> bool {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
}

impl Controller {
    fn slice_changed(&self, slice: &ResourceSlice) {
        self.refresh_taints(false);
        let keys = self.pods_using_pool(&slice.spec.driver, &slice.spec.pool.name);
        self.decide_pods(keys);
    }
}

impl Observer<ResourceSlice> for Controller {
    fn relisted(&self) {
        self.refresh_all(false);
    }
    fn applied(&self, old: Option<&ResourceSlice>, slice: &ResourceSlice) {
        // Most updates move no taint: a new slice may replace a tainted
        // generation, a tainted one may change, a generation may move on.
        let may_move = match old {
            None => true,
            Some(old) => {
                tainted(old)
                    || tainted(slice)
                    || old.spec.pool.generation != slice.spec.pool.generation
            }
        };
        if may_move {
            self.slice_changed(slice);
        }
    }
    fn deleted(&self, slice: &ResourceSlice) {
        self.slice_changed(slice);
    }
}

/// What of a rule matters to eviction: its spec and whether an admin
/// confirmed it.
fn rule_input(rule: &DeviceTaintRule) -> (serde_json::Value, Option<&String>) {
    (
        serde_json::to_value(&rule.spec).unwrap_or_default(),
        rule.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CONFIRM_ANNOTATION)),
    )
}

/// How a rule asks its pods to be evicted: through the Eviction API or not,
/// with which grace period (as read, so that a respelling changes nothing).
fn eviction_asked(rule: &DeviceTaintRule) -> (bool, Option<i64>) {
    (
        respects_budgets(rule),
        grace_period_of(rule.metadata.annotations.as_ref()),
    )
}

impl Observer<DeviceTaintRule> for Controller {
    fn relisted(&self) {
        info!(
            rules = self.stores.devices.rules.len(),
            "DeviceTaintRules loaded"
        );
        let rules = self.stores.devices.rules.list();
        let uids: BTreeSet<&str> = rules
            .iter()
            .filter_map(|r| r.metadata.uid.as_deref())
            .collect();
        {
            // Rules deleted while the watch was away are forgotten.
            let mut tracking = self.tracking.lock().unwrap();
            tracking
                .rule_seen
                .retain(|uid, _| uids.contains(uid.as_str()));
            tracking
                .previewed
                .retain(|(uid, _)| uids.contains(uid.as_str()));
        }
        // Seen before anything is queued for them (a preview waits from
        // here).
        for rule in &rules {
            self.saw_rule(rule);
        }
        self.refresh_all(true);
        if self.is_leading() {
            for rule in &rules {
                if let Some(name) = &rule.metadata.name {
                    self.queue.add(Item::Rule(name.clone()), RULE_CHANGED);
                }
            }
        }
    }
    fn applied(&self, old: Option<&DeviceTaintRule>, rule: &DeviceTaintRule) {
        self.saw_rule(rule);
        if let Some(old) = old
            && old.metadata.uid == rule.metadata.uid
            && eviction_asked(old) != eviction_asked(rule)
        {
            // Evict or delete, and the grace period: the pods budgets hold
            // are tried again now the way asked (`drain --disable-eviction`
            // deletes at once), not at the end of their pause.
            self.retry_held_by(rule);
        }
        let changed = old.is_none_or(|old| {
            rule_input(old) != rule_input(rule) || old.metadata.uid != rule.metadata.uid
        });
        if !changed {
            return;
        }
        // As upstream: the index and holds first, then the rule's status
        // is queued, then its pods (so that a status written at once says
        // what the rule does, pending pods included).
        self.refresh_taints(true);
        if self.is_leading()
            && let Some(name) = &rule.metadata.name
        {
            self.queue.add(Item::Rule(name.clone()), RULE_CHANGED);
        }
        let keys = self.pods_with_allocated_claims();
        self.decide_pods(keys);
    }
    fn deleted(&self, rule: &DeviceTaintRule) {
        if let Some(uid) = &rule.metadata.uid {
            let mut tracking = self.tracking.lock().unwrap();
            tracking.evicted_by_rule.remove(uid);
            tracking.rule_seen.remove(uid);
            tracking.previewed.retain(|(u, _)| u != uid);
        }
        self.refresh_all(true);
    }
}

impl Controller {
    /// Notes when this process first saw the rule's current generation.
    fn saw_rule(&self, rule: &DeviceTaintRule) {
        let Some(uid) = &rule.metadata.uid else {
            return;
        };
        let generation = rule.metadata.generation;
        let mut tracking = self.tracking.lock().unwrap();
        match tracking.rule_seen.get(uid) {
            Some((seen, _)) if *seen == generation => {}
            _ => {
                tracking
                    .rule_seen
                    .insert(uid.clone(), (generation, std::time::Instant::now()));
            }
        }
    }
}
