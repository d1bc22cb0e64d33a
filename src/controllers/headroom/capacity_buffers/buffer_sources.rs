//! Where a CapacityBuffer's pod shape comes from (its PodTemplate, or the
//! Deployment, ReplicaSet, StatefulSet or Job it scales with) and the
//! watches that make a buffer follow a change of that object within
//! seconds. One watch per kind, started when a buffer first names that
//! kind, decoding only metadata and keeping only the objects some buffer
//! names; a change of their generation (of any version, for a PodTemplate,
//! which has none) queues the buffers that name them. The sync still reads
//! the object itself live. (The watches themselves: `source_watches.rs`.)

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, GroupVersionKind};
use serde::Deserialize;
use tokio::sync::watch;

use super::buffer::BufferSpec;

/// A kind a buffer's pod shape is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum SourceKind {
    PodTemplate,
    Deployment,
    ReplicaSet,
    StatefulSet,
    Job,
}

impl SourceKind {
    const ALL: [SourceKind; 5] = [
        SourceKind::PodTemplate,
        SourceKind::Deployment,
        SourceKind::ReplicaSet,
        SourceKind::StatefulSet,
        SourceKind::Job,
    ];

    /// (API group, kind, plural).
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            SourceKind::PodTemplate => ("", "PodTemplate", "podtemplates"),
            SourceKind::Deployment => ("apps", "Deployment", "deployments"),
            SourceKind::ReplicaSet => ("apps", "ReplicaSet", "replicasets"),
            SourceKind::StatefulSet => ("apps", "StatefulSet", "statefulsets"),
            SourceKind::Job => ("batch", "Job", "jobs"),
        }
    }

    pub(crate) fn resource(self) -> ApiResource {
        let (group, kind, plural) = self.names();
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural)
    }

    /// Where the pod template's `spec` is in the object.
    pub(crate) fn template_spec(self, object: &serde_json::Value) -> serde_json::Value {
        match self {
            SourceKind::PodTemplate => object["template"]["spec"].clone(),
            _ => object["spec"]["template"]["spec"].clone(),
        }
    }

    /// The replicas of a scalable object (a Job's parallelism).
    pub(crate) fn replicas(self, object: &serde_json::Value) -> Option<i32> {
        let field = match self {
            SourceKind::PodTemplate => return None,
            SourceKind::Job => "parallelism",
            _ => "replicas",
        };
        object["spec"][field]
            .as_i64()
            .and_then(|r| i32::try_from(r).ok())
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            SourceKind::PodTemplate => "podtemplates (CapacityBuffer shapes)",
            SourceKind::Deployment => "deployments (CapacityBuffer shapes)",
            SourceKind::ReplicaSet => "replicasets (CapacityBuffer shapes)",
            SourceKind::StatefulSet => "statefulsets (CapacityBuffer shapes)",
            SourceKind::Job => "jobs (CapacityBuffer shapes)",
        }
    }
}

/// The object a buffer's pod shape is read from: its kind and name (in the
/// buffer's namespace), or why the spec names none the controller reads.
pub(crate) fn source_of(spec: &BufferSpec) -> Result<(SourceKind, &str), String> {
    if let Some(template) = &spec.pod_template_ref {
        return Ok((SourceKind::PodTemplate, template.name.as_str()));
    }
    let Some(scalable) = &spec.scalable_ref else {
        return Err("spec: neither podTemplateRef nor scalableRef is set".into());
    };
    SourceKind::ALL
        .into_iter()
        .filter(|k| *k != SourceKind::PodTemplate)
        .find(|k| {
            let (group, kind, _) = k.names();
            scalable.api_group == group && scalable.kind == kind
        })
        .map(|k| (k, scalable.name.as_str()))
        .ok_or_else(|| {
            format!(
                "spec.scalableRef: kind {}/{} is not supported (Deployment, ReplicaSet, \
                 StatefulSet of apps; Job of batch)",
                scalable.api_group, scalable.kind
            )
        })
}

/// Any object's metadata: all a source watch reads.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SourceView {
    pub metadata: ObjectMeta,
}

impl kube::Resource for SourceView {
    type DynamicType = ApiResource;
    type Scope = kube::core::DynamicResourceScope;

    fn kind(api: &ApiResource) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(&api.kind)
    }
    fn group(api: &ApiResource) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(&api.group)
    }
    fn version(api: &ApiResource) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(&api.version)
    }
    fn api_version(api: &ApiResource) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(&api.api_version)
    }
    fn plural(api: &ApiResource) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(&api.plural)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What says a source changed in a way that matters: its generation, or
/// for objects without one (PodTemplates) its version.
pub(super) fn revision(meta: &ObjectMeta) -> String {
    match meta.generation {
        Some(generation) => generation.to_string(),
        None => meta.resource_version.clone().unwrap_or_default(),
    }
}

/// The source watches: which kinds are wanted (buffers name them) and the
/// last revision seen of each named object.
#[derive(Debug)]
pub(crate) struct Sources {
    pub(super) wanted: watch::Sender<BTreeSet<SourceKind>>,
    pub(super) seen: Mutex<HashMap<(SourceKind, String), String>>,
}

impl Default for Sources {
    fn default() -> Self {
        Sources {
            wanted: watch::Sender::new(BTreeSet::new()),
            seen: Mutex::default(),
        }
    }
}

impl Sources {
    /// A buffer names `kind`: its watch starts if it has not.
    pub(super) fn want(&self, kind: SourceKind) {
        self.wanted.send_if_modified(|kinds| kinds.insert(kind));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> BufferSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn each_reference_names_one_source() {
        let rows = [
            (
                json!({"podTemplateRef": {"name": "t"}}),
                Ok((SourceKind::PodTemplate, "t")),
            ),
            (
                json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "d"}}),
                Ok((SourceKind::Deployment, "d")),
            ),
            (
                json!({"scalableRef": {"apiGroup": "apps", "kind": "StatefulSet", "name": "s"}}),
                Ok((SourceKind::StatefulSet, "s")),
            ),
            (
                json!({"scalableRef": {"apiGroup": "batch", "kind": "Job", "name": "j"}}),
                Ok((SourceKind::Job, "j")),
            ),
            (
                json!({"podTemplateRef": {"name": "t"},
                       "scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "d"}}),
                Ok((SourceKind::PodTemplate, "t")),
            ),
        ];
        for (value, want) in rows {
            let spec = spec(value.clone());
            assert_eq!(
                source_of(&spec),
                want.map_err(|e: &str| e.to_string()),
                "{value}"
            );
        }
        let unknown =
            spec(json!({"scalableRef": {"apiGroup": "example.com", "kind": "Thing", "name": "x"}}));
        assert!(
            source_of(&unknown)
                .unwrap_err()
                .contains("example.com/Thing is not supported")
        );
        assert!(
            source_of(&spec(json!({})))
                .unwrap_err()
                .contains("neither podTemplateRef")
        );
    }

    #[test]
    fn shapes_and_replicas_are_read_where_each_kind_keeps_them() {
        let template = json!({"template": {"spec": {"containers": [{"name": "a"}]}}});
        assert_eq!(
            SourceKind::PodTemplate.template_spec(&template)["containers"][0]["name"],
            "a"
        );
        assert_eq!(SourceKind::PodTemplate.replicas(&template), None);
        let deployment = json!({"spec": {"replicas": 3, "template": {"spec": {"containers": []}}}});
        assert_eq!(SourceKind::Deployment.replicas(&deployment), Some(3));
        let job = json!({"spec": {"parallelism": 4, "replicas": 9}});
        assert_eq!(SourceKind::Job.replicas(&job), Some(4));
    }

    #[test]
    fn a_revision_is_the_generation_or_else_the_version() {
        let mut meta = ObjectMeta {
            resource_version: Some("7".into()),
            ..ObjectMeta::default()
        };
        assert_eq!(revision(&meta), "7");
        meta.generation = Some(2);
        assert_eq!(revision(&meta), "2");
    }
}
