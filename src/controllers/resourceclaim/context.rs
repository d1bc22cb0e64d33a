//! What every sync shares: the client, the caches, the settings and the
//! recorders.

use std::sync::Arc;

use super::cache::Caches;
use super::metrics::ControllerMetrics;
use crate::model::features::FeatureGates;
use crate::runtime::events::EventRecorder;
use crate::runtime::reachability::Reachability;

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
