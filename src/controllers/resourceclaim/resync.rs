//! What a takeover and a resync queue: a missed event heals by itself.

use tracing::info;

use super::Controller;
use super::claim;
use super::enqueue::{WorkKey, pod_needs_work};
use super::podgroup;
use crate::runtime::controller::Sweep;

impl Controller {
    /// At takeover: every claim, and every pod and PodGroup that needs
    /// work. At a resync: only the objects whose decision is not a no-op
    /// (the resync reads the caches and sends nothing).
    pub(super) fn sweep_caches(&self, sweep: Sweep) {
        let caches = &self.ctx.caches;
        let claims = caches
            .claims
            .list()
            .iter()
            .filter(|c| sweep == Sweep::Takeover || claim::needs_work(c, caches))
            .map(|c| WorkKey::claim(c.namespace(), c.name()))
            .collect::<Vec<_>>();
        let pods = caches
            .pods
            .list()
            .iter()
            .filter(|pod| pod_needs_work(pod, caches, self.ctx.gates).is_ok())
            .map(|pod| WorkKey::pod(pod.namespace(), pod.name()))
            .collect::<Vec<_>>();
        let groups = if sweep == Sweep::Takeover || caches.group_claims_enabled() {
            caches
                .pod_groups
                .list()
                .iter()
                .filter(|g| podgroup::needs_work(g, caches, self.ctx.gates))
                .map(|g| WorkKey::pod_group(g.namespace(), g.name()))
                .collect::<Vec<_>>()
        } else {
            Vec::new()
        };
        let (claims, pods, groups) = (
            self.queue_swept(claims, sweep),
            self.queue_swept(pods, sweep),
            self.queue_swept(groups, sweep),
        );
        match sweep {
            Sweep::Takeover => info!(
                claims,
                pods,
                groups,
                "leading: queued every claim and every pod and PodGroup that needs work"
            ),
            Sweep::Resync => info!(
                claims,
                pods, groups, "resync: queued the cached objects that need work"
            ),
        }
    }

    fn queue_swept(&self, keys: Vec<WorkKey>, sweep: Sweep) -> usize {
        let queued = keys.len();
        for key in keys {
            self.queue.add_for(key, sweep.wake());
        }
        queued
    }
}
