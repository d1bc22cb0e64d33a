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

use std::sync::Arc;

use tracing::info;

use crate::runtime::controller::Lead;
use crate::shared::Shared;
use crate::watches::devices::Kinds;
use metrics::PoolGauge;
pub use metrics::PoolMetrics;
use requests::{Controller as PoolStatusRequests, Stores as PoolStatusRequestStores};

/// The request controller, with `DRAResourcePoolStatus` on: it reads
/// slices and claims (and, as 1.37 counts them, rules), and watches the
/// requests itself once their API is found.
pub fn build_requests(shared: &Shared) -> anyhow::Result<Box<dyn Lead>> {
    let release = shared.gates.release;
    // 1.37 counts devices tainted by rules as unavailable.
    shared.read_devices(Kinds {
        slices: true,
        rules: release.is_1_37() && shared.gates.device_taint_rules_on(),
        ..Kinds::default()
    });
    let devices = shared.devices.stores();
    let requests = PoolStatusRequests::new(
        shared.client.clone(),
        release,
        PoolStatusRequestStores {
            slices: devices.slices.clone(),
            claims: shared.claims.stores().claims.clone(),
            rules: devices.rules.clone(),
        },
        &shared.registry,
        shared.reachability.clone(),
    )?;
    shared.spawn_with_watches(
        requests
            .clone()
            .run_watch(shared.client.clone(), shared.apis.clone()),
    );
    info!("ResourcePoolStatusRequests are answered (DRAResourcePoolStatus is on)");
    Ok(Box::new(requests.run()))
}

/// The pool gauge, by `by`: computed at scrape time from the slices,
/// claims and rules in memory; no workers.
pub fn build_gauge(shared: &Shared, by: PoolMetrics) {
    shared.read_devices(Kinds {
        slices: true,
        rules: shared.gates.device_taint_rules_on(),
        ..Kinds::default()
    });
    shared.exposition.add_text(Arc::new(PoolGauge::new(
        shared.devices.stores().clone(),
        shared.claims.stores().claims.clone(),
        shared.synced.clone(),
        by,
    )));
}
