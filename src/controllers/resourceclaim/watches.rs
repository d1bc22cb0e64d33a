//! What each watch event does to the caches and the queue ("what wakes
//! what" of the contract), as the handlers of the informers; the pod and
//! claim changes are then passed on to their observers.

use std::sync::Arc;
use std::time::Instant;

use tracing::info;

use super::Controller;
use super::enqueue::{Why, WorkKey, keys_for_pod_event, keys_for_replacement};
use super::observe::observe;
use super::podgroup;
use crate::model::indexes::{GROUPS_BY_CLAIM, GROUPS_BY_TEMPLATE, PODS_BY_CLAIM, PODS_BY_TEMPLATE};
use crate::model::views::{ClaimView, PodGroupView, PodView, TemplateView};
use crate::runtime::informer::Handler;
use crate::runtime::store::object_key;

impl Handler<PodView> for Controller {
    fn admit(&self, pod: PodView) -> Option<PodView> {
        // The cache still holds the previous list: the history of a pod
        // carries over into the new one.
        let cached = self
            .ctx
            .caches
            .pods
            .get(&object_key(pod.namespace(), pod.name()));
        observe(cached.as_deref(), pod, Instant::now()).keep
    }

    fn relisted(&self, pods: Vec<PodView>) {
        let caches = &self.ctx.caches;
        let pods: Vec<Arc<PodView>> = pods.into_iter().map(Arc::new).collect();
        let entries: Vec<(String, Arc<PodView>)> = pods
            .iter()
            .map(|p| (object_key(p.namespace(), p.name()), p.clone()))
            .collect();
        // Absent from the list, or recreated under the same name: deleted
        // while the watch was down.
        for gone in caches.pods.replace_by_uid(entries) {
            self.pod_deleted(&gone);
        }
        for pod in &pods {
            self.enqueue(keys_for_pod_event(pod, false, caches, self.ctx.gates));
        }
        for observer in self.observers.pods() {
            observer.relisted();
        }
        info!(
            pods = caches.pods.len(),
            "pod cache loaded (pods with claims only)"
        );
    }

    fn applied(&self, pod: PodView) {
        let caches = &self.ctx.caches;
        let key = object_key(pod.namespace(), pod.name());
        let cached = caches.pods.get(&key);
        let seen = observe(cached.as_deref(), pod, Instant::now());
        if seen.replaced
            && let Some(old) = &cached
        {
            self.pod_deleted(old);
        }
        match seen.keep {
            Some(pod) => {
                let pod = Arc::new(pod);
                let old = caches.pods.apply(key, pod.clone());
                if cached.is_none() || seen.replaced {
                    // Only now that the new pod is cached can the sync of
                    // the old pod's claims tell they are replaced.
                    self.enqueue(keys_for_replacement(&pod, caches));
                }
                self.enqueue(keys_for_pod_event(&pod, false, caches, self.ctx.gates));
                for observer in self.observers.pods() {
                    observer.applied(old.as_deref(), &pod);
                }
            }
            // Replaced under the same name by a pod without claims.
            None if seen.replaced => {
                caches.pods.delete(&key);
            }
            None => {}
        }
    }

    fn deleted(&self, pod: PodView) {
        let caches = &self.ctx.caches;
        let key = object_key(pod.namespace(), pod.name());
        // The cached version may name claims the deleted one no longer
        // lists (see `observe`).
        let pod = caches
            .pods
            .delete_if_uid(&key, pod.uid())
            .unwrap_or_else(|| Arc::new(pod));
        if pod.is_relevant() {
            self.pod_deleted(&pod);
        }
    }
}

impl Handler<ClaimView> for Controller {
    fn relisted(&self, claims: Vec<ClaimView>) {
        let caches = &self.ctx.caches;
        let claims: Vec<Arc<ClaimView>> = claims.into_iter().map(Arc::new).collect();
        let entries = claims
            .iter()
            .map(|c| (object_key(c.namespace(), c.name()), c.clone()))
            .collect();
        for gone in caches.claims.replace(entries) {
            caches.forget_created(&object_key(gone.namespace(), gone.name()));
            self.claim_changed(&gone, true);
        }
        // Startup (and every relist): check every claim once, for
        // reservations that went stale while nobody watched.
        for claim in &claims {
            caches.forget_created(&object_key(claim.namespace(), claim.name()));
            self.claim_changed(claim, false);
        }
        for observer in self.observers.claims() {
            observer.relisted();
        }
        info!(claims = caches.claims.len(), "claim cache loaded");
    }

    fn applied(&self, claim: ClaimView) {
        let caches = &self.ctx.caches;
        let key = object_key(claim.namespace(), claim.name());
        let claim = Arc::new(claim);
        let old = caches.claims.apply(key.clone(), claim.clone());
        caches.forget_created(&key);
        self.claim_changed(&claim, false);
        for observer in self.observers.claims() {
            observer.applied(old.as_deref(), &claim);
        }
    }

    fn deleted(&self, claim: ClaimView) {
        let caches = &self.ctx.caches;
        let key = object_key(claim.namespace(), claim.name());
        caches.claims.delete(&key);
        caches.forget_created(&key);
        self.claim_changed(&claim, true);
        for observer in self.observers.claims() {
            observer.deleted(&claim);
        }
    }
}

impl Handler<TemplateView> for Controller {
    fn relisted(&self, templates: Vec<TemplateView>) {
        let templates: Vec<(String, Arc<TemplateView>)> = templates
            .into_iter()
            .map(|t| (object_key(t.namespace(), t.name()), Arc::new(t)))
            .collect();
        let keys: Vec<String> = templates.iter().map(|(k, _)| k.clone()).collect();
        self.ctx.caches.templates.replace(templates);
        for key in keys {
            self.template_changed(&key);
        }
    }

    fn applied(&self, template: TemplateView) {
        let key = object_key(template.namespace(), template.name());
        self.ctx
            .caches
            .templates
            .apply(key.clone(), Arc::new(template));
        self.template_changed(&key);
    }

    fn deleted(&self, template: TemplateView) {
        self.ctx
            .caches
            .templates
            .delete(&object_key(template.namespace(), template.name()));
    }
}

impl Handler<PodGroupView> for Controller {
    fn relisted(&self, groups: Vec<PodGroupView>) {
        let caches = &self.ctx.caches;
        let groups: Vec<Arc<PodGroupView>> = groups.into_iter().map(Arc::new).collect();
        let entries = groups
            .iter()
            .map(|g| (object_key(g.namespace(), g.name()), g.clone()))
            .collect();
        // Absent from the list, or recreated under the same name: deleted
        // while the watch was down.
        for gone in caches.pod_groups.replace_by_uid(entries) {
            self.pod_group_deleted(&gone);
        }
        for group in &groups {
            self.pod_group_changed(group);
        }
        info!(podgroups = caches.pod_groups.len(), "PodGroup cache loaded");
    }

    fn applied(&self, group: PodGroupView) {
        let caches = &self.ctx.caches;
        let key = object_key(group.namespace(), group.name());
        let group = Arc::new(group);
        if let Some(old) = caches.pod_groups.apply(key, group.clone())
            && old.uid() != group.uid()
        {
            self.pod_group_deleted(&old);
        }
        self.pod_group_changed(&group);
    }

    fn deleted(&self, group: PodGroupView) {
        let caches = &self.ctx.caches;
        let key = object_key(group.namespace(), group.name());
        let group = caches
            .pod_groups
            .delete_if_uid(&key, group.uid())
            .unwrap_or_else(|| Arc::new(group));
        self.pod_group_deleted(&group);
    }
}

impl Controller {
    /// A PodGroup with claims changed: its own work, and its members (a
    /// status update may have recorded a claim they use).
    fn pod_group_changed(&self, group: &PodGroupView) {
        let caches = &self.ctx.caches;
        let mut keys = Vec::new();
        // Members wait for their group to be known, claims or not.
        if podgroup::needs_work(group, caches, self.ctx.gates) {
            keys.push((
                WorkKey::pod_group(group.namespace(), group.name()),
                Why::PodGroupNeedsWork,
            ));
        }
        keys.extend(self.member_work(group));
        self.enqueue(keys);
    }

    /// The work a change of `group` gives its member pods.
    fn member_work(&self, group: &PodGroupView) -> Vec<(WorkKey, Why)> {
        let caches = &self.ctx.caches;
        podgroup::members(group, caches)
            .iter()
            .flat_map(|pod| keys_for_pod_event(pod, false, caches, self.ctx.gates))
            .collect()
    }

    /// A PodGroup is gone: reservations for it go (its claims are then
    /// checked); its generated claims are the garbage collector's.
    fn pod_group_deleted(&self, group: &PodGroupView) {
        let caches = &self.ctx.caches;
        caches.deleted_pod_groups.add(group.uid().to_string());
        let mut keys: Vec<(WorkKey, Why)> = group
            .spec
            .resource_claims
            .iter()
            .filter_map(|e| {
                e.resource_claim_name
                    .as_deref()
                    .or_else(|| group.recorded(&e.name))
            })
            .map(|c| (WorkKey::claim(group.namespace(), c), Why::PodGroupGone))
            .collect();
        for pod in podgroup::members(group, caches) {
            keys.push((WorkKey::pod(pod.namespace(), pod.name()), Why::PodGroupGone));
        }
        self.enqueue(keys);
    }

    fn pod_deleted(&self, pod: &PodView) {
        let caches = &self.ctx.caches;
        caches.note_pod_deleted(pod.namespace(), pod.name(), pod.uid());
        self.enqueue(keys_for_pod_event(pod, true, caches, self.ctx.gates));
        for observer in self.observers.pods() {
            observer.deleted(pod);
        }
    }

    fn claim_changed(&self, claim: &ClaimView, deleted: bool) {
        let caches = &self.ctx.caches;
        let mut keys = Vec::new();
        if !deleted {
            keys.push((
                WorkKey::claim(claim.namespace(), claim.name()),
                Why::ClaimChanged,
            ));
        }
        for pod in caches
            .pods
            .by_index(PODS_BY_CLAIM, &object_key(claim.namespace(), claim.name()))
        {
            keys.extend(keys_for_pod_event(&pod, false, caches, self.ctx.gates));
        }
        for group in caches.pod_groups.by_index(
            GROUPS_BY_CLAIM,
            &object_key(claim.namespace(), claim.name()),
        ) {
            if podgroup::needs_work(&group, caches, self.ctx.gates) {
                keys.push((
                    WorkKey::pod_group(group.namespace(), group.name()),
                    Why::PodGroupNeedsWork,
                ));
            }
        }
        // A group's new claim: its members may record it now.
        if let Some(owner) = crate::naming::controller_of(claim.owner_references())
            && owner.kind == "PodGroup"
            && let Some(group) = caches
                .pod_groups
                .get(&object_key(claim.namespace(), &owner.name))
        {
            keys.extend(self.member_work(&group));
        }
        self.enqueue(keys);
    }

    fn template_changed(&self, key: &str) {
        let caches = &self.ctx.caches;
        let mut keys = Vec::new();
        for pod in caches.pods.by_index(PODS_BY_TEMPLATE, key) {
            keys.extend(keys_for_pod_event(&pod, false, caches, self.ctx.gates));
        }
        for group in caches.pod_groups.by_index(GROUPS_BY_TEMPLATE, key) {
            if podgroup::needs_work(&group, caches, self.ctx.gates) {
                keys.push((
                    WorkKey::pod_group(group.namespace(), group.name()),
                    Why::PodGroupNeedsWork,
                ));
            }
        }
        self.enqueue(keys);
    }
}
