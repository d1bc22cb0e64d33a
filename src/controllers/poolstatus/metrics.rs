//! `dra_claim_controller_pool_devices{driver,pool,node,state}`: devices of
//! each pool by state, from memory at scrape time. Its cardinality is five
//! series per pool (`--pool-metrics=pool`, one pool per node for
//! node-local drivers) or per driver (`--pool-metrics=driver`, `pool` and
//! `node` empty); nothing is exported before the stores are loaded.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceTaintRule;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::model::capacity::{PoolCapacity, STATES, pool_capacity};
use crate::model::device_taints::rules_of;
use crate::model::views::{ClaimView, DeviceStores};
use crate::runtime::shared::WatchesSynced;
use crate::runtime::store::Store;

const NAME: &str = "dra_claim_controller_pool_devices";
const HELP: &str = "Devices of each DRA pool by state: total (published, newest pool generation), allocated (taken by a \
claim), admin_access (allocated with admin access only), unavailable (not taken, tainted NoSchedule or NoExecute by its \
slice or a DeviceTaintRule), free. Computed from memory at scrape time; absent until the stores are loaded.";
const LABELS: [&str; 4] = ["driver", "pool", "node", "state"];

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
pub struct PoolGauge {
    devices: DeviceStores,
    claims: Arc<Store<ClaimView>>,
    synced: WatchesSynced,
    by: PoolMetrics,
    desc: Vec<Desc>,
}

impl PoolGauge {
    pub fn new(
        devices: DeviceStores,
        claims: Arc<Store<ClaimView>>,
        synced: WatchesSynced,
        by: PoolMetrics,
    ) -> prometheus::Result<Self> {
        let desc = Desc::new(
            NAME.into(),
            HELP.into(),
            LABELS.iter().map(|l| l.to_string()).collect(),
            Default::default(),
        )?;
        Ok(PoolGauge {
            devices,
            claims,
            synced,
            by,
            desc: vec![desc],
        })
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

impl Collector for PoolGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.desc.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        if !self.synced.is_synced() || self.by == PoolMetrics::Off {
            return Vec::new();
        }
        let slices = self.devices.slices.list();
        let claims = self.claims.list();
        let rules: Vec<Arc<DeviceTaintRule>> = self.devices.rules.list();
        let pools = pool_capacity(
            slices.iter().map(|s| s.as_ref()),
            claims.iter().map(|c| c.as_ref()),
            &rules_of(&rules),
        );
        // Built as the exposition's own records, one per series: a gauge
        // vector would first hold a child per series (thousands, on a
        // cluster of node-local pools) only to be copied into these.
        let reported = reported(pools, self.by);
        let mut metrics = Vec::with_capacity(reported.len() * STATES.len());
        for pool in &reported {
            for (state, value) in STATES.iter().zip(pool.values()) {
                let labels = [
                    ("driver", pool.driver.as_str()),
                    ("pool", pool.pool.as_str()),
                    ("node", pool.node.as_str()),
                    ("state", state),
                ];
                let mut metric = Metric::default();
                metric.set_label(labels.iter().map(|(n, v)| label(n, v)).collect());
                let mut gauge = Gauge::default();
                gauge.set_value(value as f64);
                metric.set_gauge(gauge);
                metrics.push(metric);
            }
        }
        let mut family = MetricFamily::default();
        family.set_name(NAME.to_string());
        family.set_help(HELP.to_string());
        family.set_field_type(MetricType::GAUGE);
        family.set_metric(metrics);
        vec![family]
    }
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut pair = LabelPair::default();
    pair.set_name(name.to_string());
    pair.set_value(value.to_string());
    pair
}
