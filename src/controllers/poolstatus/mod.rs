//! DRA pool capacity: what every pool offers and what of it is used.
//!
//! - `metrics.rs`: without writing to etcd, computed from the slices,
//!   claims and rules already in memory at scrape time
//!   (`dra_claim_controller_pool_devices`); no request is made for it;
//! - `requests.rs`: kube-controller-manager's
//!   `resourcepoolstatusrequest-controller`, answering
//!   ResourcePoolStatusRequests once each (`request_metrics.rs`: its
//!   three metrics).

mod metrics;
mod request_metrics;
mod requests;

pub use metrics::{PoolGauge, PoolMetrics};
pub use requests::{
    CONTROLLER_NAME as REQUESTS_CONTROLLER_NAME, Controller as PoolStatusRequests,
    Stores as PoolStatusRequestStores,
};
