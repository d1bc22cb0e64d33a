//! `dra_claim_controller_pool_devices{driver,pool,node,state}`: devices of
//! each pool by state, from memory at scrape time. Its cardinality is five
//! series per pool (`--pool-metrics=pool`, one pool per node for
//! node-local drivers) or per driver (`--pool-metrics=driver`, `pool` and
//! `node` empty); nothing is exported before the stores are loaded.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceTaintRule;
use std::fmt::Write as _;

use crate::runtime::exposition::{TextFamily, escape_label_value};

use crate::model::capacity::{PoolCapacity, STATES, pool_capacity};
use crate::model::device_taints::rules_of;
use crate::model::views::{ClaimView, DeviceStores};
use crate::runtime::shared::WatchesSynced;
use crate::runtime::store::Store;

const NAME: &str = "dra_claim_controller_pool_devices";
const HELP: &str = "Devices of each DRA pool by state: total (published, newest pool generation), allocated (taken by a \
claim), admin_access (allocated with admin access only), unavailable (not taken, tainted NoSchedule or NoExecute by its \
slice or a DeviceTaintRule), free. Computed from memory at scrape time; absent until the stores are loaded.";

/// `--pool-metrics`: how finely pools are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PoolMetrics {
    /// One series per pool and state.
    Pool,
    /// Summed per driver (`pool`, `node` empty).
    Driver,
    /// Not exported (and ResourceSlices not watched for it).
    Off,
}

/// The gauge, reading the process's stores.
pub(crate) struct PoolGauge {
    devices: DeviceStores,
    claims: Arc<Store<ClaimView>>,
    synced: WatchesSynced,
    by: PoolMetrics,
}

impl PoolGauge {
    pub(crate) fn new(
        devices: DeviceStores,
        claims: Arc<Store<ClaimView>>,
        synced: WatchesSynced,
        by: PoolMetrics,
    ) -> Self {
        PoolGauge {
            devices,
            claims,
            synced,
            by,
        }
    }
}

/// The pools as reported: each, or summed per driver.
pub(crate) fn reported(pools: Vec<PoolCapacity>, by: PoolMetrics) -> Vec<PoolCapacity> {
    match by {
        PoolMetrics::Pool => pools,
        PoolMetrics::Off => Vec::new(),
        PoolMetrics::Driver => {
            let mut drivers: BTreeMap<String, PoolCapacity> = BTreeMap::new();
            for p in pools {
                let d = drivers
                    .entry(p.driver.clone())
                    .or_insert_with(|| PoolCapacity {
                        driver: p.driver.clone(),
                        ..Default::default()
                    });
                d.total += p.total;
                d.allocated += p.allocated;
                d.admin_access += p.admin_access;
                d.unavailable += p.unavailable;
                d.free += p.free;
            }
            drivers.into_values().collect()
        }
    }
}

impl TextFamily for PoolGauge {
    /// Written as text directly: at one pool per node, a cluster of
    /// thousands of nodes has tens of thousands of series, whose records as
    /// the client library's objects would cost several times the text.
    fn write_text(&self, out: &mut String) {
        if !self.synced.is_synced() || self.by == PoolMetrics::Off {
            return;
        }
        let slices = self.devices.slices.list();
        let claims = self.claims.list();
        let rules: Vec<Arc<DeviceTaintRule>> = self.devices.rules.list();
        let pools = pool_capacity(
            slices.iter().map(|s| s.as_ref()),
            claims.iter().map(|c| c.as_ref()),
            &rules_of(&rules),
        );
        let reported = reported(pools, self.by);
        let _ = writeln!(out, "# HELP {NAME} {HELP}");
        let _ = writeln!(out, "# TYPE {NAME} gauge");
        for pool in &reported {
            for (state, value) in STATES.iter().zip(pool.values()) {
                out.push_str(NAME);
                for (i, (name, value)) in [
                    ("driver", pool.driver.as_str()),
                    ("pool", pool.pool.as_str()),
                    ("node", pool.node.as_str()),
                    ("state", state),
                ]
                .iter()
                .enumerate()
                {
                    out.push_str(if i == 0 { "{" } else { "," });
                    out.push_str(name);
                    out.push_str("=\"");
                    escape_label_value(value, out);
                    out.push('"');
                }
                let _ = writeln!(out, "}} {value}");
            }
        }
    }
}
