//! The writes of a watermark's sync: the placeholders' objects applied
//! (only what changed since the last sync), the objects of entries that
//! are gone deleted, the status, and the placeholder gates lifted. The
//! apply, the gates and [`write_once`] serve every door's sync.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use serde_json::{Value, json};
use tracing::{debug, info};

use super::controller::{Controller, FIELD_MANAGER, Placeholders, Written};
use super::watermarks::desired::PLACEHOLDER_GATE;
use super::watermarks::status::{Observed, conditions, status_patch};
use super::watermarks::watermark::{WatermarkView, carry_transitions};
use crate::naming::WATERMARK_LABEL;
use crate::runtime::error::{SyncError, kube_err};

pub(super) fn deployments() -> ApiResource {
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

/// Runs `write` unless `slot` already holds `now` (what the object says
/// since the last write); records `now` once the write went through.
pub(super) async fn write_once<T: PartialEq>(
    slot: &mut Option<T>,
    now: T,
    write: impl std::future::Future<Output = Result<(), SyncError>>,
) -> Result<(), SyncError> {
    if slot.as_ref() == Some(&now) {
        return Ok(());
    }
    write.await?;
    *slot = Some(now);
    Ok(())
}

impl Controller {
    /// Server-side applies `object` (a `resource` in `ns`, named in its
    /// metadata) as headroom's field manager, taking its fields over.
    pub(super) async fn apply(
        &self,
        ns: &str,
        resource: &ApiResource,
        object: &Value,
    ) -> Result<(), SyncError> {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, resource)
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(object),
            )
            .await
            .map_err(kube_err(format!("applying {} {ns}/{name}", resource.kind)))?;
        Ok(())
    }

    /// Lifts the placeholder gate of the unbound placeholders of one front
    /// door's object (`door`: its namespace and placeholder label), unless a
    /// yield is in flight (then looks at `key` again when it can end).
    pub(super) async fn lift_gates(&self, key: &str, door: &Placeholders) -> Result<(), SyncError> {
        let gated: Vec<(String, usize)> = self
            .pods
            .list()
            .iter()
            .filter(|p| door.holds(p) && p.node_name().is_none() && !p.is_deleting())
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
            self.queue.add_after(
                key.to_string(),
                hold + Duration::from_millis(100),
                "a yield's hold is over",
            );
            return Ok(());
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &door.namespace);
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
                            door.namespace
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

    /// Applies what changed since the last sync, deletes the objects of
    /// entries that are gone (or invalid), writes the status if it changed.
    pub(super) async fn write(
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
                self.apply(ns, &resource, &object).await?;
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

#[cfg(test)]
mod tests;
