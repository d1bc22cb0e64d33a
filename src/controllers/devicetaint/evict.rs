//! One eviction, as kube-controller-manager makes it: the pod read afresh
//! (another UID or a deletion under way: nothing to do), a Normal event
//! "Marking for deletion", the `DisruptionTarget` condition on its status,
//! then a delete with the UID as precondition (not the Eviction API: a
//! PodDisruptionBudget does not hold a device that must go).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::json;
use tracing::{debug, info};

use super::{Controller, Item, RULE_EVICTED, RULE_RECHECK};
use crate::runtime::controller::Action;
use crate::runtime::error::{SyncError, kube_err};

const CONDITION_TYPE: &str = "DisruptionTarget";
const CONDITION_REASON: &str = "DeletionByDeviceTaintManager";
const CONDITION_MESSAGE: &str = "Device Taint manager: deleting due to NoExecute taint";

fn is_not_found_or_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
}

/// Whether the pod already carries the condition as we would write it.
fn has_condition(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter().any(|c| {
                c.type_ == CONDITION_TYPE
                    && c.status == "True"
                    && c.reason.as_deref() == Some(CONDITION_REASON)
                    && c.message.as_deref() == Some(CONDITION_MESSAGE)
            })
        })
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
        if let Some(wait) = self.paced(&rules) {
            self.tracking
                .lock()
                .unwrap()
                .paced_since
                .entry(key.to_string())
                .or_insert_with(Instant::now);
            return Ok(Action::RecheckAfter(wait.max(Duration::from_millis(10))));
        }
        let waited = self
            .tracking
            .lock()
            .unwrap()
            .paced_since
            .remove(key)
            .map_or(0.0, |since| since.elapsed().as_secs_f64());
        self.metrics.paced(waited);
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = api
            .get_opt(name)
            .await
            .map_err(kube_err(format!("reading pod {key}")))?;
        let Some(pod) = pod.filter(|p| p.metadata.uid.as_deref() == Some(pending.uid.as_str()))
        else {
            debug!("pod gone or replaced; nothing to evict");
            self.forget_pod(key, &pending.uid);
            return Ok(Action::Done);
        };
        if pod.metadata.deletion_timestamp.is_some() {
            debug!("pod already being deleted");
            self.evicted.add(pending.uid.clone());
            self.forget_pod(key, &pending.uid);
            return Ok(Action::Done);
        }
        self.tell_pod(namespace, name, &pending.uid, "Marking for deletion");
        if !has_condition(&pod) {
            let patch = json!({
                "metadata": {"uid": pending.uid},
                "status": {"conditions": [{
                    "type": CONDITION_TYPE,
                    "status": "True",
                    "reason": CONDITION_REASON,
                    "message": CONDITION_MESSAGE,
                    "lastTransitionTime": Timestamp::now().round(k8s_openapi::jiff::Unit::Second).unwrap_or(now),
                }]},
            });
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Ok(_) => {}
                // Gone. (A conflict is retried on fresh state: the next read
                // tells a replaced pod from a busy one.)
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
        let delete = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(pending.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &delete).await {
            Ok(_) => {}
            Err(e) if is_not_found_or_conflict(&e) => {
                self.forget_pod(key, &pending.uid);
                return Ok(Action::Done);
            }
            Err(e) => return Err(SyncError::kube(format!("deleting pod {key}"), e)),
        }
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
        Ok(Action::Done)
    }
}
