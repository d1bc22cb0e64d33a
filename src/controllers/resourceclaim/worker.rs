//! The sync of one key, as the runtime's [`Reconciler`]: the runtime
//! takes keys from the queue, opens the span, and requeues by the outcome.

use tracing::{Span, debug, info_span};

use super::Controller;
use super::enqueue::{Why, WorkKey};
use super::{claim, pod, podgroup};
use crate::runtime::controller::{Action, Reconciler, Sweep, Wake};
use crate::runtime::error::SyncError;
use crate::runtime::store::object_key;

impl Reconciler for Controller {
    type Key = WorkKey;
    type Why = Why;

    fn span(&self, key: &WorkKey, why: &Wake<Why>) -> Span {
        info_span!("sync", key = %key, reason = %why)
    }

    async fn reconcile(&self, key: &WorkKey) -> Result<Action, SyncError> {
        self.sync(key).await
    }

    fn sweep(&self, sweep: Sweep) {
        self.sweep_caches(sweep);
    }

    fn is_synced(&self) -> bool {
        Controller::is_synced(self)
    }
}

impl Controller {
    /// One sync of one key, from the cache's current state.
    pub async fn sync(&self, key: &WorkKey) -> Result<Action, SyncError> {
        let ctx = &self.ctx;
        match key {
            WorkKey::Pod { namespace, name } => {
                let Some(pod) = ctx.caches.pods.get(&object_key(namespace, name)) else {
                    debug!("pod is gone; nothing to do");
                    return Ok(Action::Done);
                };
                let decision = pod::decide(&pod, &ctx.caches, ctx.gates);
                if let Some(reason) = decision.skipped {
                    debug!(%reason, "nothing to do for pod");
                }
                if decision.is_noop() {
                    return Ok(Action::Done);
                }
                pod::execute(ctx, &pod, decision).await
            }
            WorkKey::Claim { namespace, name } => {
                let Some(claim) = ctx.caches.claims.get(&object_key(namespace, name)) else {
                    debug!("claim is gone; nothing to do");
                    return Ok(Action::Done);
                };
                claim::execute(ctx, &claim).await.map(|()| Action::Done)
            }
            WorkKey::PodGroup { namespace, name } => {
                let (Some(api), Some(group)) = (
                    ctx.caches.pod_group_api(),
                    ctx.caches.pod_groups.get(&object_key(namespace, name)),
                ) else {
                    debug!("PodGroup is gone; nothing to do");
                    return Ok(Action::Done);
                };
                let decision = podgroup::decide(&group, &ctx.caches, ctx.gates, api);
                if let Some(reason) = decision.skipped {
                    debug!(reason, "nothing to do");
                    return Ok(Action::Done);
                }
                if decision.entries.is_empty() {
                    return Ok(Action::Done);
                }
                podgroup::execute(ctx, &group, api, decision)
                    .await
                    .map(|()| Action::Done)
            }
        }
    }
}
