//! The worker loop: take a key, sync it from the caches, and requeue it
//! the way its outcome calls for.

use std::sync::Arc;
use std::time::Instant;

use tracing::{Instrument, debug, info_span};

use super::Controller;
use super::context::Synced;
use super::enqueue::{Why, WorkKey};
use super::{claim, pod, podgroup};
use crate::runtime::error::SyncError;
use crate::runtime::retry::requeue;
use crate::runtime::store::object_key;

impl Controller {
    /// Runs `workers` workers until the queue is shut down.
    pub(crate) async fn run_workers(self: Arc<Self>, workers: usize) {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..workers.max(1) {
            let this = self.clone();
            tasks.spawn(async move { this.worker().await });
        }
        while tasks.join_next().await.is_some() {}
    }

    async fn worker(&self) {
        loop {
            // Through an API server outage, keys wait in the queue rather
            // than fail one by one.
            self.ctx.reachability.wait_reachable().await;
            let Some(key) = self.queue.get().await else {
                return;
            };
            let started = Instant::now();
            // One span per sync: every line logged inside carries the key,
            // and the span says why the key was queued.
            let reason = self.take_reason(&key);
            let span = info_span!("sync", key = %key, reason = %reason);
            let result = self.sync(&key).instrument(span.clone()).await;
            let _entered = span.enter();
            let outcome = result.map(|synced| match synced {
                Synced::Done => None,
                Synced::RecheckAfter(delay) => Some(delay),
            });
            match &outcome {
                Ok(None) => debug!(elapsed_ms = started.elapsed().as_millis() as u64, "synced"),
                Ok(Some(delay)) => {
                    debug!(
                        delay_ms = delay.as_millis() as u64,
                        "synced; checking again later"
                    );
                    self.reasons
                        .lock()
                        .unwrap()
                        .entry(key.clone())
                        .or_insert(Why::Recheck);
                }
                Err(_) => {}
            }
            requeue(&self.queue, &self.ctx.reachability, &key, outcome);
            self.queue.done(&key);
        }
    }

    /// One sync of one key, from the cache's current state.
    pub async fn sync(&self, key: &WorkKey) -> Result<Synced, SyncError> {
        let ctx = &self.ctx;
        match key {
            WorkKey::Pod { namespace, name } => {
                let Some(pod) = ctx.caches.pods.get(&object_key(namespace, name)) else {
                    debug!("pod is gone; nothing to do");
                    return Ok(Synced::Done);
                };
                let decision = pod::decide(&pod, &ctx.caches, ctx.gates);
                if let Some(reason) = decision.skipped {
                    debug!(%reason, "nothing to do for pod");
                }
                if decision.is_noop() {
                    return Ok(Synced::Done);
                }
                pod::execute(ctx, &pod, decision).await
            }
            WorkKey::Claim { namespace, name } => {
                let Some(claim) = ctx.caches.claims.get(&object_key(namespace, name)) else {
                    debug!("claim is gone; nothing to do");
                    return Ok(Synced::Done);
                };
                claim::execute(ctx, &claim).await.map(|()| Synced::Done)
            }
            WorkKey::PodGroup { namespace, name } => {
                let (Some(api), Some(group)) = (
                    ctx.caches.pod_group_api(),
                    ctx.caches.pod_groups.get(&object_key(namespace, name)),
                ) else {
                    debug!("PodGroup is gone; nothing to do");
                    return Ok(Synced::Done);
                };
                let decision = podgroup::decide(&group, &ctx.caches, ctx.gates, api);
                if let Some(reason) = decision.skipped {
                    debug!(reason, "nothing to do");
                    return Ok(Synced::Done);
                }
                if decision.entries.is_empty() {
                    return Ok(Synced::Done);
                }
                podgroup::execute(ctx, &group, api, decision)
                    .await
                    .map(|()| Synced::Done)
            }
        }
    }
}
