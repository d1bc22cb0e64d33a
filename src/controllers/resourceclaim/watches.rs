//! What each change of the shared stores queues ("what wakes what" of the
//! contract): the claim controller observes the process's pod, claim,
//! template and PodGroup watches, told after each change is stored.

use super::Controller;
use super::enqueue::{Why, WorkKey, keys_for_pod_event, keys_for_replacement};
use super::podgroup;
use crate::model::indexes::{GROUPS_BY_CLAIM, GROUPS_BY_TEMPLATE, PODS_BY_CLAIM, PODS_BY_TEMPLATE};
use crate::model::views::{ClaimView, PodGroupView, PodView, TemplateView};
use crate::runtime::informer::Observer;
use crate::runtime::store::object_key;

impl Observer<PodView> for Controller {
    fn relisted(&self) {
        let caches = &self.ctx.caches;
        for pod in caches.pods.list() {
            self.enqueue(keys_for_pod_event(&pod, false, caches, self.ctx.gates));
        }
    }

    fn applied(&self, old: Option<&PodView>, pod: &PodView) {
        let caches = &self.ctx.caches;
        if old.is_none_or(|old| old.uid() != pod.uid()) {
            // Only now that the new pod is stored can the sync of the old
            // pod's claims tell they are replaced.
            self.enqueue(keys_for_replacement(pod, caches));
        }
        self.enqueue(keys_for_pod_event(pod, false, caches, self.ctx.gates));
    }

    fn deleted(&self, pod: &PodView) {
        let caches = &self.ctx.caches;
        caches.note_pod_deleted(pod.namespace(), pod.name(), pod.uid());
        self.enqueue(keys_for_pod_event(pod, true, caches, self.ctx.gates));
    }
}

impl Observer<ClaimView> for Controller {
    fn relisted(&self) {
        // Startup (and every relist): check every claim once, for
        // reservations that went stale while nobody watched.
        let caches = &self.ctx.caches;
        for claim in caches.claims.list() {
            caches.forget_created(&object_key(claim.namespace(), claim.name()));
            self.claim_changed(&claim, false);
        }
    }

    fn applied(&self, _old: Option<&ClaimView>, claim: &ClaimView) {
        let caches = &self.ctx.caches;
        caches.forget_created(&object_key(claim.namespace(), claim.name()));
        self.claim_changed(claim, false);
    }

    fn deleted(&self, claim: &ClaimView) {
        let caches = &self.ctx.caches;
        caches.forget_created(&object_key(claim.namespace(), claim.name()));
        self.claim_changed(claim, true);
    }
}

impl Observer<TemplateView> for Controller {
    fn relisted(&self) {
        for template in self.ctx.caches.templates.list() {
            self.template_changed(&object_key(template.namespace(), template.name()));
        }
    }

    fn applied(&self, _old: Option<&TemplateView>, template: &TemplateView) {
        self.template_changed(&object_key(template.namespace(), template.name()));
    }

    fn deleted(&self, _template: &TemplateView) {}
}

impl Observer<PodGroupView> for Controller {
    fn relisted(&self) {
        for group in self.ctx.caches.pod_groups.list() {
            self.pod_group_changed(&group);
        }
    }

    fn applied(&self, old: Option<&PodGroupView>, group: &PodGroupView) {
        if let Some(old) = old
            && old.uid() != group.uid()
        {
            self.pod_group_deleted(old);
        }
        self.pod_group_changed(group);
    }

    fn deleted(&self, group: &PodGroupView) {
        self.pod_group_deleted(group);
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
