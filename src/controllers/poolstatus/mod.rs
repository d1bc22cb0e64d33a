//! DRA pool capacity without writing to etcd: what every pool offers and
//! what of it is used, computed from the slices, claims and rules already
//! in memory at scrape time (`dra_claim_controller_pool_devices`). No
//! request is made for it.

mod metrics;

pub use metrics::{PoolGauge, PoolMetrics};
