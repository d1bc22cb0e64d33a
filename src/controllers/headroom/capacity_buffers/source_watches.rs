//! The watches of what CapacityBuffers read their pod shapes from
//! (`buffer_sources.rs`): one per kind, started when a buffer first names
//! that kind; only the objects some buffer names are kept, and a change of
//! their generation queues the buffers that name them.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;

use super::buffer_sources::{SourceKind, SourceView, revision, source_of};
use crate::controllers::headroom::controller::{BUFFER_KEY_PREFIX, Controller};
use crate::runtime::informer::{Handler, Informer};
use crate::runtime::store::object_key;

impl Controller {
    /// The buffer keys whose pod shape is read from `kind` `namespace/name`
    /// (`name` `None`: any of that kind).
    fn buffers_reading(
        &self,
        kind: SourceKind,
        namespace: &str,
        name: Option<&str>,
    ) -> Vec<String> {
        self.buffers
            .list()
            .iter()
            .filter(|b| b.spec.is_ours() && (name.is_none() || b.namespace() == namespace))
            .filter(|b| {
                source_of(&b.spec)
                    .is_ok_and(|(k, n)| k == kind && name.is_none_or(|want| want == n))
            })
            .map(|b| format!("{BUFFER_KEY_PREFIX}{}", object_key(b.namespace(), b.name())))
            .collect()
    }

    /// Runs the source watches as buffers come to name their kinds, until
    /// the process ends.
    pub(crate) async fn run_source_watches(self: &Arc<Self>) {
        let mut wanted = self.sources.wanted.subscribe();
        let mut started: BTreeSet<SourceKind> = BTreeSet::new();
        let mut running = futures::stream::FuturesUnordered::new();
        loop {
            let now: Vec<SourceKind> = wanted
                .borrow_and_update()
                .iter()
                .filter(|k| !started.contains(*k))
                .copied()
                .collect();
            for kind in now {
                started.insert(kind);
                let controller = self.clone();
                running.push(async move {
                    let informer = Informer::new(kind.label());
                    let api =
                        Api::<SourceView>::all_with(controller.client.clone(), &kind.resource());
                    let handler = SourceEvents {
                        controller: &controller,
                        kind,
                    };
                    informer.run(api, &handler).await;
                });
            }
            // A watch runs until the process ends; the sender lives as
            // long as the controller, so `changed` only ever wakes us.
            tokio::select! {
                _ = wanted.changed() => {}
                Some(()) = running.next() => {}
            }
        }
    }
}

/// One source kind's watch events.
struct SourceEvents<'a> {
    controller: &'a Controller,
    kind: SourceKind,
}

impl SourceEvents<'_> {
    fn named(&self, meta: &ObjectMeta) -> Vec<String> {
        self.controller.buffers_reading(
            self.kind,
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref(),
        )
    }

    fn key(&self, meta: &ObjectMeta) -> (SourceKind, String) {
        let key = object_key(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        );
        (self.kind, key)
    }
}

impl Handler<SourceView> for SourceEvents<'_> {
    /// Only the objects some buffer names are kept (a cluster's
    /// Deployments are many, its buffers few).
    fn admit(&self, obj: SourceView) -> Option<SourceView> {
        (!self.named(&obj.metadata).is_empty()).then_some(obj)
    }
    fn relisted(&self, objects: Vec<SourceView>) {
        let mut seen = self.controller.sources.seen.lock().unwrap();
        seen.retain(|(kind, _), _| *kind != self.kind);
        for obj in &objects {
            seen.insert(self.key(&obj.metadata), revision(&obj.metadata));
        }
        drop(seen);
        for key in self.controller.buffers_reading(self.kind, "", None) {
            self.controller.enqueue(key);
        }
    }
    fn applied(&self, obj: SourceView) {
        let buffers = self.named(&obj.metadata);
        if buffers.is_empty() {
            return;
        }
        let now = revision(&obj.metadata);
        let before = self
            .controller
            .sources
            .seen
            .lock()
            .unwrap()
            .insert(self.key(&obj.metadata), now.clone());
        // A status update (a rollout's progress) changes no shape.
        if before.as_deref() != Some(now.as_str()) {
            for key in buffers {
                self.controller.enqueue(key);
            }
        }
    }
    fn deleted(&self, obj: SourceView) {
        self.controller
            .sources
            .seen
            .lock()
            .unwrap()
            .remove(&self.key(&obj.metadata));
        for key in self.named(&obj.metadata) {
            self.controller.enqueue(key);
        }
    }
}
