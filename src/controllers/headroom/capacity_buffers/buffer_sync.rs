//! The sync of a CapacityBuffer with our strategy: resolve its pod shape
//! (`podTemplateRef`, or the pod template and replicas of `scalableRef`),
//! count as the autoscaler does (`buffer.rs`), apply the placeholders'
//! Deployment when it changed, write the status when it changed. Pod
//! templates and scalable objects are read live, and watched
//! (`buffer_sources.rs`): a change queues the buffers that name them.

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use serde_json::Value;
use tracing::{debug, info};

use super::buffer::{self, BufferApi, BufferView};
use super::buffer_sources::source_of;
use crate::controllers::headroom::controller::{Controller, DeploymentWritten};
use crate::controllers::headroom::execute::{deployments, write_once};
use crate::model::views::PodView;
use crate::runtime::error::{SyncError, kube_err};
use crate::runtime::store::object_key;

/// The pod shape and, for a scalable object, its replicas.
struct Shape {
    template_spec: Value,
    scalable_replicas: Option<i32>,
}

impl Controller {
    /// Syncs the buffer `key` (`namespace/name`).
    pub(crate) async fn sync_buffer(&self, key: &str, api: &BufferApi) -> Result<(), SyncError> {
        let Some(buf) = self.buffers.get(key) else {
            debug!("buffer is gone; its Deployment goes with it (owner reference)");
            return Ok(());
        };
        if !buf.spec.is_ours() {
            return Ok(());
        }
        let before = self
            .buffer_written
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .unwrap_or_default();
        let mut written = before.clone();
        let result = self.apply_buffer(&buf, api, &mut written).await;
        let outcome = match &result {
            Ok(n) => Ok(*n),
            Err(e) => Err(e.to_string()),
        };
        let now = Timestamp::now().to_string();
        let patch = buffer::status_patch(
            &buf.status.conditions,
            outcome.as_ref().map(|n| *n).map_err(String::as_str),
            buf.metadata.generation,
            &now,
        );
        let write = async {
            Api::<BufferView>::namespaced_with(self.client.clone(), buf.namespace(), api)
                .patch_status(buf.name(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(kube_err(format!(
                    "writing status of CapacityBuffer {}/{}",
                    buf.namespace(),
                    buf.name()
                )))
        };
        let status_result = write_once(
            &mut written.status,
            (outcome.clone(), buf.metadata.generation),
            write,
        )
        .await;
        self.buffer_written
            .lock()
            .unwrap()
            .insert(key.to_string(), written);
        result?;
        status_result
    }

    async fn apply_buffer(
        &self,
        buf: &BufferView,
        api: &BufferApi,
        written: &mut DeploymentWritten<u32>,
    ) -> Result<u32, SyncError> {
        let shape = self.shape(buf).await?;
        let requests = requests_of(&shape.template_spec);
        let limits = buf.spec.limits().map_err(SyncError::Invalid)?;
        let replicas = buffer::buffer_replicas(
            buf.spec.replicas,
            buf.spec.percentage,
            shape.scalable_replicas,
            limits.as_ref(),
            &requests,
        )
        .map_err(SyncError::Invalid)?;
        let pod = buffer::placeholder_pod(&shape.template_spec, buf.name());
        let body = buffer::deployment(buf, &api.api_version(), pod, replicas);
        if written.deployment.as_ref() != Some(&body) {
            self.apply(buf.namespace(), &deployments(), &body).await?;
            let name = body["metadata"]["name"].as_str().unwrap_or_default();
            info!(replicas, deployment = %name, "capacity buffer's placeholders applied");
            written.deployment = Some(body);
        }
        Ok(replicas)
    }

    /// The buffer's pod template (`spec` of a PodTemplateSpec) and the
    /// replicas of its scalable object, read live; the source's kind is
    /// watched from now on (`buffer_sources.rs`).
    async fn shape(&self, buf: &BufferView) -> Result<Shape, SyncError> {
        let ns = buf.namespace();
        let (kind, name) = source_of(&buf.spec).map_err(SyncError::Invalid)?;
        self.sources.want(kind);
        let resource = kind.resource();
        let object = Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &resource)
            .get(name)
            .await
            .map_err(kube_err(format!("reading {} {ns}/{name}", resource.kind)))?;
        Ok(Shape {
            template_spec: kind.template_spec(&object.data),
            scalable_replicas: kind.replicas(&object.data),
        })
    }

    /// Everything kept for a buffer that is gone.
    pub(crate) fn forget_buffer(&self, namespace: &str, name: &str) {
        self.buffer_written
            .lock()
            .unwrap()
            .remove(&object_key(namespace, name));
    }
}

/// What a pod of this template requests, as kube-scheduler adds it up.
fn requests_of(template_spec: &Value) -> crate::model::requests::ResourceList {
    let pod = serde_json::json!({"metadata": {"name": "template"}, "spec": template_spec});
    serde_json::from_value::<PodView>(pod)
        .map(|p| p.requests().effective())
        .unwrap_or_default()
}
