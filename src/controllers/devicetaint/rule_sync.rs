//! Writes a DeviceTaintRule's `EvictionInProgress` condition: what the
//! rule is doing, read from the controller's state (for `None`, what
//! `NoExecute` would do, simulated on the current stores), server-side
//! applied to the status in the version the API server serves.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::DeviceTaintRule;
use k8s_openapi::jiff::{Timestamp, Unit};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use tracing::{debug, info};

use super::decide::pod_eviction;
use super::rule_status::{
    CONDITION_TYPE, RuleState, SIMULATION_SETTLE, StatusWrite, preview_wait, rule_condition,
    status_write,
};
use super::{CONTROLLER_NAME, Controller};
use crate::model::device_taints::{DeviceTaints, TaintRule, published_devices_selected};
use crate::runtime::controller::Action;
use crate::runtime::error::{SyncError, kube_err};
use crate::runtime::store::object_key;

impl Controller {
    /// Writes the status of the rule `name` if it changed; `Some(delay)`:
    /// written too recently, look again after it.
    pub(crate) async fn sync_rule(&self, name: &str) -> Result<Action, SyncError> {
        let Some(rule) = self.stores.devices.rules.get(name) else {
            debug!("rule gone");
            return Ok(Action::Done);
        };
        let Some(version) = self.stores.rules_version.get().copied() else {
            return Ok(Action::Done);
        };
        let uid = rule.metadata.uid.clone().unwrap_or_default();
        let preview_of = (uid.clone(), rule.metadata.generation);
        let seen_for = {
            let tracking = self.tracking.lock().unwrap();
            if tracking.previewed.contains(&preview_of) {
                // Written by us; the watch may not have brought it back yet.
                return Ok(Action::Done);
            }
            tracking
                .rule_seen
                .get(&uid)
                .map_or(SIMULATION_SETTLE, |(_, at)| at.elapsed())
        };
        if let Some(wait) = preview_wait(&rule, seen_for) {
            return Ok(Action::RecheckAfter(wait));
        }
        let state = self.rule_state(&rule);
        let evicted = self
            .tracking
            .lock()
            .unwrap()
            .evicted_by_rule
            .get(&uid)
            .copied()
            .unwrap_or(0);
        let wanted = rule_condition(name, &state, evicted);
        let now = Timestamp::now();
        let condition = match status_write(&rule, wanted, now) {
            StatusWrite::Unchanged => return Ok(Action::Done),
            StatusWrite::After(delay) => return Ok(Action::RecheckAfter(delay)),
            StatusWrite::Write(condition) => condition,
        };
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &version.api_resource());
        let body = json!({
            "apiVersion": version.api_version(),
            "kind": "DeviceTaintRule",
            "metadata": {"name": name, "uid": uid},
            "status": {"conditions": [{
                "type": CONDITION_TYPE,
                "status": condition.status,
                "reason": condition.reason,
                "message": condition.message,
                "observedGeneration": rule.metadata.generation,
                "lastTransitionTime": now.round(Unit::Second).unwrap_or(now),
            }]},
        });
        let params = PatchParams::apply(CONTROLLER_NAME).force();
        match api.patch_status(name, &params, &Patch::Apply(body)).await {
            Ok(_) => {}
            // Deleted or recreated meanwhile: its own events bring it back.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(Action::Done),
            Err(e) => {
                return Err(kube_err(format!(
                    "writing the status of DeviceTaintRule {name}"
                ))(e));
            }
        }
        if rule.spec.taint.effect == "None" {
            self.tracking.lock().unwrap().previewed.insert(preview_of);
        }
        info!(reason = condition.reason, message = %condition.message, "DeviceTaintRule status written");
        Ok(Action::Done)
    }

    /// What the rule does now.
    fn rule_state(&self, rule: &DeviceTaintRule) -> RuleState {
        let name = rule.metadata.name.as_deref().unwrap_or_default();
        let uid = rule.metadata.uid.as_deref().unwrap_or_default();
        match rule.spec.taint.effect.as_str() {
            "NoExecute" => {
                let tracking = self.tracking.lock().unwrap();
                if let Some(held) = tracking.held.get(name) {
                    return RuleState::Held {
                        selected: held.selected,
                        allocated: held.allocated,
                        max_share: self.settings.max_share,
                    };
                }
                let mut namespaces = BTreeSet::new();
                let mut pending_pods = 0;
                let mut waiting_for_budgets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
                for (key, pending) in &tracking.pending {
                    if !pending.has_rule_uid(uid) {
                        continue;
                    }
                    let deleting = self.stores.pods.get(key).is_none_or(|p| p.is_deleting());
                    if !deleting {
                        pending_pods += 1;
                        namespaces.insert(key.split('/').next().unwrap_or_default().to_string());
                        if let Some(blocked) = tracking.blocked.get(key)
                            && blocked.uid == pending.uid
                        {
                            waiting_for_budgets
                                .entry(blocked.budget.clone())
                                .or_default()
                                .insert(key.clone());
                        }
                    }
                }
                RuleState::NoExecute {
                    pending_pods,
                    namespaces: namespaces.len(),
                    waiting_for_budgets,
                }
            }
            "None" => self.simulate(rule),
            _ => RuleState::OtherEffect,
        }
    }

    /// What the rule would do with the `NoExecute` effect: the devices it
    /// selects (published, allocated), and the pods it would evict.
    fn simulate(&self, rule: &DeviceTaintRule) -> RuleState {
        let mut as_no_execute = TaintRule::from_v1(rule);
        as_no_execute.taint.effect = "NoExecute".into();
        let slices = self.stores.devices.slices.list();
        let published =
            published_devices_selected(slices.iter().map(|s| s.as_ref()), &as_no_execute);
        let only_this = DeviceTaints::new(std::iter::empty(), vec![as_no_execute.clone()]);
        let mut allocated = 0;
        let mut pods = BTreeSet::new();
        for claim in self.stores.claims.list() {
            let Some(allocation) = &claim.status.allocation else {
                continue;
            };
            let selected = allocation
                .devices
                .results
                .iter()
                .filter(|d| as_no_execute.selects(&d.driver, &d.pool, &d.device))
                .count();
            if selected > 0 {
                allocated += selected;
                self.pods_of_claim(&claim, &mut pods);
            }
        }
        let claims = &self.stores.claims;
        let mut evicted = 0;
        let mut namespaces = BTreeSet::new();
        for key in &pods {
            let Some(pod) = self.stores.pods.get(key) else {
                continue;
            };
            let lookup = |ns: &str, name: &str| claims.get(&object_key(ns, name));
            if pod_eviction(&pod, lookup, &only_this, self.pod_group_claims()).is_some() {
                evicted += 1;
                namespaces.insert(pod.namespace().to_string());
            }
        }
        RuleState::NoEffect {
            published,
            allocated,
            pods: evicted,
            namespaces: namespaces.len(),
        }
    }
}
