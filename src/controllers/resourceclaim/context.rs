//! What every sync shares: the client, the caches, the settings and the
//! recorders, and how a sync that did not fail ended.

use std::sync::Arc;
use std::time::Duration;

use super::cache::Caches;
use super::metrics::ControllerMetrics;
use crate::model::features::FeatureGates;
use crate::runtime::events::EventRecorder;
use crate::runtime::reachability::Reachability;

/// How a sync that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synced {
    Done,
    /// Nothing failed, but the key must be looked at again after this
    /// long (a grace period is running).
    RecheckAfter(Duration),
}

/// Everything a sync needs.
pub struct Context {
    pub client: kube::Client,
    pub caches: Arc<Caches>,
    pub gates: FeatureGates,
    pub events: EventRecorder,
    pub metrics: ControllerMetrics,
    /// Whether the API server answers; workers hold while it does not.
    pub reachability: Arc<Reachability>,
}
