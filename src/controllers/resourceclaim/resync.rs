//! The periodic resync: a missed event heals by itself.

use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use super::Controller;
use super::claim;
use super::enqueue::{Why, WorkKey, pod_needs_work};

impl Controller {
    /// Re-examines every cached pod and claim at a random period between
    /// `min_period` and twice that, forever (kube-controller-manager's
    /// `--min-resync-period`, as each of its informers does). Only objects
    /// whose decision is not a no-op are queued, and only on the leader;
    /// the resync itself reads the caches and sends nothing.
    pub(crate) async fn run_resync(self: Arc<Self>, min_period: Duration) {
        // A zero period would spin; a second is the least that makes sense.
        let min_period = min_period.max(Duration::from_secs(1));
        tokio::join!(
            self.resync_every(min_period, "pods", Self::resync_pods),
            self.resync_every(min_period, "resourceclaims", Self::resync_claims),
            async {
                if self.ctx.caches.group_claims_enabled() {
                    self.resync_every(min_period, "podgroups", Self::resync_pod_groups)
                        .await
                }
            },
        );
    }

    async fn resync_every(
        &self,
        min_period: Duration,
        what: &'static str,
        resync: fn(&Self) -> usize,
    ) {
        use rand::Rng;
        loop {
            let period = min_period.mul_f64(1.0 + rand::rng().random::<f64>());
            tokio::time::sleep(period).await;
            if !self.is_synced() {
                continue;
            }
            let queued = resync(self);
            info!(
                resource = what,
                queued, "resync: queued the cached objects that need work"
            );
        }
    }

    fn resync_pods(&self) -> usize {
        let caches = &self.ctx.caches;
        let keys: Vec<(WorkKey, Why)> = caches
            .pods
            .list()
            .iter()
            .filter(|pod| pod_needs_work(pod, caches, self.ctx.gates).is_ok())
            .map(|pod| (WorkKey::pod(pod.namespace(), pod.name()), Why::Resync))
            .collect();
        let queued = keys.len();
        self.enqueue(keys);
        queued
    }

    fn resync_pod_groups(&self) -> usize {
        let caches = &self.ctx.caches;
        let keys: Vec<(WorkKey, Why)> = caches
            .pod_groups
            .list()
            .iter()
            .filter(|g| super::podgroup::needs_work(g, caches, self.ctx.gates))
            .map(|g| (WorkKey::pod_group(g.namespace(), g.name()), Why::Resync))
            .collect();
        let queued = keys.len();
        self.enqueue(keys);
        queued
    }

    fn resync_claims(&self) -> usize {
        let caches = &self.ctx.caches;
        let keys: Vec<(WorkKey, Why)> = caches
            .claims
            .list()
            .iter()
            .filter(|claim| claim::needs_work(claim, caches))
            .map(|claim| (WorkKey::claim(claim.namespace(), claim.name()), Why::Resync))
            .collect();
        let queued = keys.len();
        self.enqueue(keys);
        queued
    }
}
