//! One eviction, as kube-controller-manager makes it: the pod as the shared
//! watch has it (another UID or a deletion under way: nothing to do), a
//! Normal event "Marking for deletion", the `DisruptionTarget` condition on
//! its status, then a delete with the UID as precondition (not the Eviction
//! API: a PodDisruptionBudget does not hold a device that must go).
//! Unlike kube-controller-manager the pod is not read afresh first: both
//! writes carry its UID, so a pod replaced since the watch saw it is never
//! touched, and the eviction costs one request fewer. Beyond
//! upstream, a pod whose every reason is a rule asking for it
//! (`budgets.rs`) is evicted through the Eviction API instead, which
//! writes `DisruptionTarget` itself and honours PodDisruptionBudgets.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, Preconditions};
use serde_json::json;
use tracing::{debug, info, warn};

use super::budgets::{
    BLOCKED_EVENT_REASON, grace_period, refusing_budget, respects_budgets, retry_after,
    through_eviction_api,
};
use super::tracking::{Blocked, Paced, Pending};
use super::{Controller, Item, RULE_BLOCKED, RULE_EVICTED, RULE_RECHECK};
use crate::model::device_taints::grace_period_of;
use crate::model::views::DisruptionTargetSeen;
use crate::runtime::controller::Action;
use crate::runtime::error::SyncError;

const CONDITION_TYPE: &str = "DisruptionTarget";
const CONDITION_REASON: &str = "DeletionByDeviceTaintManager";
const CONDITION_MESSAGE: &str = "Device Taint manager: deleting due to NoExecute taint";

/// A delete of the pod with `uid` only (a new pod of the name stays),
/// giving it `grace` seconds when a rule asks (its own otherwise).
fn guarded_delete(uid: &str, grace: Option<u32>) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        grace_period_seconds: grace,
        ..Default::default()
    }
}

fn is_not_found_or_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
}

/// The `DisruptionTarget` condition to write on a pod carrying `existing`
/// at `now`, as kube-controller-manager's `UpdatePodCondition` makes it:
/// `None` when the pod carries it already as we would write it; otherwise
/// ours, keeping the existing condition's transition time when its status
/// does not change (`True` with another reason or message).
fn disruption_condition(
    existing: Option<&DisruptionTargetSeen>,
    now: Timestamp,
) -> Option<serde_json::Value> {
    let transition = match existing {
        Some(c)
            if c.status == "True"
                && c.reason.as_deref() == Some(CONDITION_REASON)
                && c.message.as_deref() == Some(CONDITION_MESSAGE) =>
        {
            return None;
        }
        Some(c) if c.status == "True" => c.last_transition_time.as_ref().map(|t| t.0),
        _ => None,
    };
    let at = transition.unwrap_or(now.round(k8s_openapi::jiff::Unit::Second).unwrap_or(now));
    Some(json!({
        "type": CONDITION_TYPE,
        "status": "True",
        "reason": CONDITION_REASON,
        "message": CONDITION_MESSAGE,
        "lastTransitionTime": at,
    }))
}

impl Controller {
    /// Evicts the pod `key` if its time is up; `Some(delay)`: not yet.
    pub(crate) async fn evict(&self, key: &str) -> Result<Action, SyncError> {
        let Some(pending) = self.tracking.lock().unwrap().pending.get(key).cloned() else {
            debug!("no eviction pending");
            return Ok(Action::Done);
        };
        if self.evicted.contains(&pending.uid) {
            return Ok(Action::Done);
        }
        let now = Timestamp::now();
        if pending.eviction.at > now {
            return Ok(Action::RecheckAfter(
                now.duration_until(pending.eviction.at).unsigned_abs(),
            ));
        }
        // Not the leader any more (shutting down): nothing more is sent.
        if !self.is_leading() {
            return Ok(Action::Done);
        }
        let rules = pending.rules();
        // Its slot under the pacing: taken once, then waited for.
        let (since, slot) = {
            let mut tracking = self.tracking.lock().unwrap();
            // Decided again while unlocked (cancelled, other reasons): that
            // decision has queued what is needed; no slot for this one.
            if tracking.pending.get(key) != Some(&pending) {
                return Ok(Action::Done);
            }
            let paced = tracking
                .paced
                .entry(key.to_string())
                .or_insert_with(|| Paced {
                    since: Instant::now(),
                    slot: self.pace(&rules),
                    rules: rules.clone(),
                });
            (paced.since, paced.slot)
        };
        let until_slot = slot.saturating_duration_since(Instant::now());
        if !until_slot.is_zero() {
            return Ok(Action::RecheckAfter(
                until_slot.max(Duration::from_millis(10)),
            ));
        }
        self.tracking.lock().unwrap().paced.remove(key);
        let waited = since.elapsed().as_secs_f64();
        self.metrics.paced(waited);
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let Some(pod) = self
            .stores
            .pods
            .get(key)
            .filter(|p| p.uid() == pending.uid.as_str())
        else {
            debug!("pod gone or replaced; nothing to evict");
            self.forget_pod(key, &pending.uid);
            return Ok(Action::Done);
        };
        if pod.is_deleting() {
            debug!("pod already being deleted");
            self.evicted.add(pending.uid.clone());
            self.forget_pod(key, &pending.uid);
            return Ok(Action::Done);
        }
        let stored = &self.stores.devices.rules;
        let through_api = through_eviction_api(&pending.eviction.reasons, |rule| {
            stored.get(rule).is_some_and(|r| respects_budgets(&r))
        });
        let grace = grace_period(&pending.eviction.reasons, |rule| {
            stored
                .get(rule)
                .and_then(|r| grace_period_of(r.metadata.annotations.as_ref()))
        });
        let refused_before = self.tracking.lock().unwrap().blocked.contains_key(key);
        if !refused_before {
            self.tell_pod(namespace, name, &pending.uid, "Marking for deletion");
        }
        if through_api {
            return self
                .evict_through_api(
                    &api,
                    (key, namespace, name),
                    &pending,
                    (&rules, grace),
                    waited,
                )
                .await;
        }
        let existing = pod.status.conditions.disruption_target.as_deref();
        if let Some(condition) = disruption_condition(existing, Timestamp::now()) {
            let patch = json!({
                "metadata": {"uid": pending.uid},
                "status": {"conditions": [condition]},
            });
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Ok(_) => {}
                // Gone. (Anything else is retried with backoff, on the
                // watch's newer copy: a replaced pod is then seen as such.)
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.forget_pod(key, &pending.uid);
                    return Ok(Action::Done);
                }
                Err(e) => {
                    return Err(SyncError::kube(
                        format!("marking pod {key} DisruptionTarget"),
                        e,
                    ));
                }
            }
        }
        match api.delete(name, &guarded_delete(&pending.uid, grace)).await {
            Ok(_) => {}
            Err(e) if is_not_found_or_conflict(&e) => {
                self.forget_pod(key, &pending.uid);
                return Ok(Action::Done);
            }
            Err(e) => return Err(SyncError::kube(format!("deleting pod {key}"), e)),
        }
        self.gone_for_its_taints(key, &pending, rules, waited);
        Ok(Action::Done)
    }

    /// Evicts through the Eviction API, guarded by the pod's UID. A budget
    /// that refuses holds the pod: not an error, tried again with growing
    /// pauses, and said in a Warning event on the pod, the rule's status
    /// and the refusals metric.
    async fn evict_through_api(
        &self,
        api: &Api<Pod>,
        (key, namespace, name): (&str, &str, &str),
        pending: &Pending,
        (rules, grace): (&[String], Option<u32>),
        waited: f64,
    ) -> Result<Action, SyncError> {
        let params = EvictParams {
            delete_options: Some(guarded_delete(&pending.uid, grace)),
            ..Default::default()
        };
        let refusal = match api.evict(name, &params).await {
            Ok(_) => None,
            Err(kube::Error::Api(status)) => match refusing_budget(&status) {
                Some(budget) => Some((format!("{namespace}/{budget}"), status.message)),
                None if status.code == 404 || status.code == 409 => {
                    self.forget_pod(key, &pending.uid);
                    return Ok(Action::Done);
                }
                None if status.code == 429 => {
                    // The API server's own flow control: no budget, no error.
                    warn!(message = %status.message, "eviction throttled by the API server; trying again");
                    return Ok(Action::RecheckAfter(retry_after(1)));
                }
                None => {
                    return Err(SyncError::kube(
                        format!("evicting pod {key}"),
                        kube::Error::Api(status),
                    ));
                }
            },
            Err(e) => return Err(SyncError::kube(format!("evicting pod {key}"), e)),
        };
        if let Some((budget, refusal)) = refusal {
            return Ok(self.held_by_budget(
                (key, namespace, name),
                pending,
                rules,
                budget,
                &refusal,
            ));
        }
        self.gone_for_its_taints(key, pending, rules.to_vec(), waited);
        Ok(Action::Done)
    }

    /// A budget (`namespace/name`) refused the eviction: remembered for the
    /// rule's status, said once per budget (a Warning event on the pod, the
    /// rule's status queued), counted, and tried again after a growing
    /// pause.
    fn held_by_budget(
        &self,
        (key, namespace, name): (&str, &str, &str),
        pending: &Pending,
        rules: &[String],
        budget: String,
        refusal: &str,
    ) -> Action {
        let (refusals, first_for_budget) = {
            let mut tracking = self.tracking.lock().unwrap();
            let blocked = tracking
                .blocked
                .entry(key.to_string())
                .or_insert_with(|| Blocked {
                    uid: pending.uid.clone(),
                    budget: budget.clone(),
                    refusals: 0,
                });
            let first_for_budget = blocked.budget != budget || blocked.refusals == 0;
            blocked.budget = budget.clone();
            blocked.refusals += 1;
            (blocked.refusals, first_for_budget)
        };
        self.metrics.refused(rules);
        if first_for_budget {
            self.event_on_pod(
                namespace,
                name,
                &pending.uid,
                BLOCKED_EVENT_REASON,
                format!(
                    "Not evicted yet for DeviceTaintRule {}: PodDisruptionBudget {budget} allows no \
                     disruption now ({refusal}); trying again",
                    rules.join(", "),
                ),
                true,
            );
            for rule in rules {
                self.queue.add(Item::Rule(rule.clone()), RULE_BLOCKED);
            }
        }
        let pause = retry_after(refusals);
        info!(
            budget = %budget,
            refusals,
            retry_in_s = pause.as_secs(),
            "eviction refused by a PodDisruptionBudget; trying again later"
        );
        Action::RecheckAfter(pause)
    }

    /// The bookkeeping once a pod was deleted or evicted for its taints.
    fn gone_for_its_taints(&self, key: &str, pending: &Pending, rules: Vec<String>, waited: f64) {
        let late = pending
            .eviction
            .at
            .duration_until(Timestamp::now())
            .as_secs_f64();
        self.metrics.deleted(late);
        self.evicted.add(pending.uid.clone());
        self.forget_pod(key, &pending.uid);
        {
            let mut tracking = self.tracking.lock().unwrap();
            for reason in &pending.eviction.reasons {
                if let crate::model::device_taints::TaintSource::Rule { uid, .. } = reason {
                    *tracking.evicted_by_rule.entry(uid.clone()).or_default() += 1;
                }
            }
        }
        for rule in rules {
            self.queue
                .add_after(Item::Rule(rule), RULE_RECHECK, RULE_EVICTED);
        }
        info!(
            late_s = late,
            paced_s = waited,
            "pod deleted for its devices' NoExecute taints"
        );
    }
}

#[cfg(test)]
mod tests;
