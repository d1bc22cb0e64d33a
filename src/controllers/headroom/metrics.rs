//! The headroom metrics: `dra_headroom_placeholders`, `dra_headroom_devices`
//! and `dra_headroom_yields_total`, whose series go with their watermark.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::watermarks::status::Observed;

/// `dra_headroom_placeholders`, `dra_headroom_devices`,
/// `dra_headroom_yields_total`.
pub(super) struct Metrics {
    placeholders: IntGaugeVec,
    devices: IntGaugeVec,
    pub(super) yields: IntCounterVec,
    /// `dra_headroom_door_served{door}`: 1 while a front door's CRD is
    /// served, 0 while it is not.
    pub(super) door_served: IntGaugeVec,
    /// The entries each watermark (`namespace/name`) has series for.
    series: Mutex<HashMap<(String, String), Vec<String>>>,
}

impl Metrics {
    pub(super) fn register(registry: &Registry) -> anyhow::Result<Self> {
        // Per entry and state: the labels both gauges share.
        let entry_gauge = |name: &str, help: &str| {
            IntGaugeVec::new(
                Opts::new(name, help),
                &["namespace", "watermark", "entry", "state"],
            )
        };
        let placeholders = entry_gauge(
            "dra_headroom_placeholders",
            "Placeholders of a NodeScalingWatermark entry: desired, ready (bound) and pending (waiting for a node).",
        )?;
        let devices = entry_gauge(
            "dra_headroom_devices",
            "Devices a NodeScalingWatermark device entry selects on its nodes: total, in_use (by workload pods) and held (by its placeholders).",
        )?;
        let yields = IntCounterVec::new(
            Opts::new(
                "dra_headroom_yields_total",
                "Device placeholders of a NodeScalingWatermark released so that a pod waiting for devices could bind.",
            ),
            &["namespace", "watermark"],
        )?;
        let door_served = IntGaugeVec::new(
            Opts::new(
                "dra_headroom_door_served",
                "Whether the API server serves a headroom front door's CRD (1) or not (0, the door is closed until it is installed), by CRD name.",
            ),
            &["door"],
        )?;
        registry.register(Box::new(door_served.clone()))?;
        registry.register(Box::new(placeholders.clone()))?;
        registry.register(Box::new(devices.clone()))?;
        registry.register(Box::new(yields.clone()))?;
        Ok(Metrics {
            placeholders,
            devices,
            yields,
            door_served,
            series: Mutex::default(),
        })
    }

    pub(super) fn set(&self, namespace: &str, name: &str, observed: &Observed) {
        self.forget_entries(namespace, name);
        self.series.lock().unwrap().insert(
            (namespace.to_string(), name.to_string()),
            observed.entries.iter().map(|e| e.name.clone()).collect(),
        );
        for e in &observed.entries {
            let labels = |state| [namespace, name, e.name.as_str(), state];
            for (state, value) in [
                ("desired", e.desired),
                ("ready", e.ready),
                ("pending", e.pending),
            ] {
                self.placeholders
                    .with_label_values(&labels(state))
                    .set(i64::from(value));
            }
            if let Some(d) = e.devices {
                for (state, value) in [("total", d.total), ("in_use", d.in_use), ("held", d.held)] {
                    self.devices
                        .with_label_values(&labels(state))
                        .set(i64::from(value));
                }
            }
        }
    }

    /// Drops every series of a deleted watermark, its yields counter too.
    pub(super) fn forget(&self, namespace: &str, name: &str) {
        self.forget_entries(namespace, name);
        let _ = self.yields.remove_label_values(&[namespace, name]);
    }

    /// Drops the per-entry series of a watermark (its entries may change).
    fn forget_entries(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let entries = self.series.lock().unwrap().remove(&key).unwrap_or_default();
        for entry in &entries {
            for state in ["desired", "ready", "pending"] {
                let _ = self
                    .placeholders
                    .remove_label_values(&[namespace, name, entry, state]);
            }
            for state in ["total", "in_use", "held"] {
                let _ = self
                    .devices
                    .remove_label_values(&[namespace, name, entry, state]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::headroom::watermarks::devices::DeviceCount;
    use crate::controllers::headroom::watermarks::status::EntryObserved;

    fn series(registry: &Registry, watermark: &str) -> usize {
        registry
            .gather()
            .iter()
            .flat_map(|family| family.get_metric())
            .filter(|m| m.get_label().iter().any(|l| l.value() == watermark))
            .count()
    }

    #[test]
    fn a_deleted_watermark_leaves_no_metric_series() {
        let registry = Registry::new();
        let metrics = Metrics::register(&registry).unwrap();
        let observed = Observed {
            entries: vec![
                EntryObserved {
                    name: "cpu".into(),
                    desired: 2,
                    ready: 1,
                    pending: 1,
                    ..EntryObserved::default()
                },
                EntryObserved {
                    name: "gpu".into(),
                    devices: Some(DeviceCount::default()),
                    ..EntryObserved::default()
                },
            ],
            ..Observed::default()
        };
        metrics.set("ns", "pool", &observed);
        metrics.set("ns", "other", &observed);
        metrics.yields.with_label_values(&["ns", "pool"]).inc();
        // 3 placeholder states x 2 entries, 3 device states, 1 counter.
        assert_eq!(series(&registry, "pool"), 10);
        // An entry removed from the spec takes its series with it.
        let fewer = Observed {
            entries: observed.entries[..1].to_vec(),
            ..Observed::default()
        };
        metrics.set("ns", "pool", &fewer);
        assert_eq!(series(&registry, "pool"), 4);
        metrics.forget("ns", "pool");
        assert_eq!(series(&registry, "pool"), 0);
        assert_eq!(
            series(&registry, "other"),
            9,
            "another watermark keeps its series"
        );
    }
}
