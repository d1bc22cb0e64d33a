//! The sync of a seed operator's watermark: count with the seed's rules
//! (`seed.rs`), apply the Deployment when it changed, write the seed's
//! conditions when the outcome changed.

use std::collections::HashSet;

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tracing::{debug, info};

use super::seed::{self, SeedWatermarkView};
use crate::controllers::headroom::controller::{Controller, DeploymentWritten};
use crate::controllers::headroom::execute::{deployments, write_once};
use crate::runtime::error::{SyncError, kube_err};
use crate::runtime::store::object_key;

impl Controller {
    /// Syncs the seed watermark `key` (`namespace/name`).
    pub(crate) async fn sync_seed(&self, key: &str) -> Result<(), SyncError> {
        let Some(wm) = self.seed_watermarks.get(key) else {
            debug!("seed watermark is gone; its Deployment goes with it (owner reference)");
            return Ok(());
        };
        let before = self
            .seed_written
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .unwrap_or_default();
        let mut written = before.clone();
        let result = self.apply_seed(&wm, &mut written).await;
        let outcome = result.as_ref().map(|_| ()).map_err(ToString::to_string);
        let status = (outcome.clone(), wm.metadata.generation);
        let status_result = write_once(
            &mut written.status,
            status,
            self.write_seed_status(&wm, outcome.as_ref().map(|_| ()).map_err(String::as_str)),
        )
        .await;
        self.seed_written
            .lock()
            .unwrap()
            .insert(key.to_string(), written);
        result?;
        status_result
    }

    /// Counts and applies the Deployment if it changed; returns the count.
    async fn apply_seed(
        &self,
        wm: &SeedWatermarkView,
        written: &mut DeploymentWritten<()>,
    ) -> Result<u32, SyncError> {
        let size = wm.spec.pause_pod_size().map_err(SyncError::Invalid)?;
        let nodes = self.devices.nodes.list();
        let selected: HashSet<String> = seed::selected_nodes(&wm.spec, nodes.iter().map(|n| &**n))
            .into_iter()
            .collect();
        let pods = self.pods.list();
        let used = seed::used(
            pods.iter()
                .map(|p| &**p)
                .filter(|p| seed::counts(p, |n| selected.contains(n))),
        );
        let replicas = seed::placeholders(&used, wm.spec.watermark_percentage, &size);
        let body = seed::deployment(wm, &size, replicas);
        if written.deployment.as_ref() != Some(&body) {
            self.apply(wm.namespace(), &deployments(), &body).await?;
            info!(
                replicas,
                nodes = selected.len(),
                "seed watermark's placeholders applied"
            );
            written.deployment = Some(body);
        }
        Ok(replicas)
    }

    async fn write_seed_status(
        &self,
        wm: &SeedWatermarkView,
        outcome: Result<(), &str>,
    ) -> Result<(), SyncError> {
        let now = Timestamp::now().to_string();
        let conditions =
            seed::conditions(&wm.status.conditions, outcome, wm.metadata.generation, &now);
        Api::<SeedWatermarkView>::namespaced(self.client.clone(), wm.namespace())
            .patch_status(
                wm.name(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": conditions}})),
            )
            .await
            .map_err(kube_err(format!(
                "writing status of NodeScalingWatermark.redhatcop.redhat.io {}/{}",
                wm.namespace(),
                wm.name()
            )))?;
        Ok(())
    }

    /// Everything kept for a seed watermark that is gone.
    pub(crate) fn forget_seed(&self, namespace: &str, name: &str) {
        self.seed_written
            .lock()
            .unwrap()
            .remove(&object_key(namespace, name));
    }
}
