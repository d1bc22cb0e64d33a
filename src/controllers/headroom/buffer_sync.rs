//! The sync of a CapacityBuffer with our strategy: resolve its pod shape
//! (`podTemplateRef`, or the pod template and replicas of `scalableRef`),
//! count as the autoscaler does (`buffer.rs`), apply the placeholders'
//! Deployment when it changed, write the status when it changed. Pod
//! templates and scalable objects are read live (not watched): the buffer
//! is looked at again every [`BUFFER_RESYNC`].

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::Value;
use tracing::{debug, info};

use super::buffer::{self, BufferApi, BufferView};
use super::controller::{BUFFER_KEY_PREFIX, Controller, DeploymentWritten};
use super::execute::deployments;
use super::seed_sync::write_once;
use crate::model::views::PodView;
use crate::runtime::error::{SyncError, kube_err};
use crate::runtime::store::object_key;

/// How often a buffer is looked at again for changes of its pod template
/// or scalable object.
pub(super) const BUFFER_RESYNC: Duration = Duration::from_secs(60);

/// The pod shape and, for a scalable object, its replicas.
struct Shape {
    template_spec: Value,
    scalable_replicas: Option<i32>,
}

impl Controller {
    /// Syncs the buffer `key` (`namespace/name`).
    pub(super) async fn sync_buffer(&self, key: &str, api: &BufferApi) -> Result<(), SyncError> {
        let Some(buf) = self.buffers.get(key) else {
            debug!("buffer is gone; its Deployment goes with it (owner reference)");
            return Ok(());
        };
        if !buf.spec.is_ours() {
            return Ok(());
        }
        self.queue
            .add_after(format!("{BUFFER_KEY_PREFIX}{key}"), BUFFER_RESYNC);
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

    /// The buffer's pod template (`spec` of a PodTemplateSpec), read live.
    async fn shape(&self, buf: &BufferView) -> Result<Shape, SyncError> {
        let ns = buf.namespace();
        if let Some(template) = &buf.spec.pod_template_ref {
            let resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("", "v1", "PodTemplate"),
                "podtemplates",
            );
            let object = Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &resource)
                .get(&template.name)
                .await
                .map_err(kube_err(format!(
                    "reading PodTemplate {ns}/{}",
                    template.name
                )))?;
            return Ok(Shape {
                template_spec: object.data["template"]["spec"].clone(),
                scalable_replicas: None,
            });
        }
        let Some(scalable) = &buf.spec.scalable_ref else {
            return Err(SyncError::Invalid(
                "spec: neither podTemplateRef nor scalableRef is set".into(),
            ));
        };
        let (group, plural, replicas_field) = match (
            scalable.api_group.as_str(),
            scalable.kind.as_str(),
        ) {
            ("apps", "Deployment") => ("apps", "deployments", "replicas"),
            ("apps", "ReplicaSet") => ("apps", "replicasets", "replicas"),
            ("apps", "StatefulSet") => ("apps", "statefulsets", "replicas"),
            ("batch", "Job") => ("batch", "jobs", "parallelism"),
            (group, kind) => {
                return Err(SyncError::Invalid(format!(
                    "spec.scalableRef: kind {group}/{kind} is not supported (Deployment, ReplicaSet, \
                     StatefulSet of apps; Job of batch)"
                )));
            }
        };
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, "v1", &scalable.kind),
            plural,
        );
        let object = Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &resource)
            .get(&scalable.name)
            .await
            .map_err(kube_err(format!(
                "reading {} {ns}/{}",
                scalable.kind, scalable.name
            )))?;
        Ok(Shape {
            template_spec: object.data["spec"]["template"]["spec"].clone(),
            scalable_replicas: object.data["spec"][replicas_field]
                .as_i64()
                .and_then(|r| i32::try_from(r).ok()),
        })
    }

    /// Everything kept for a buffer that is gone.
    pub(super) fn forget_buffer(&self, namespace: &str, name: &str) {
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
