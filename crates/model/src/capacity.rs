//! What every pool offers and what of it is used, from the slices and
//! claims in memory: per pool (driver, pool, the node of its slices),
//! devices published, allocated, held by admin access only, unavailable
//! (a `NoSchedule` or `NoExecute` taint, from the slice or a DeviceTaintRule,
//! on a device nobody holds) and free. One computation for the gauges and
//! `kubectl dra pools`.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::DeviceId;
use crate::device_taints::{TaintRule, current_slices};
use crate::views::ClaimView;

/// One pool's devices by state.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolCapacity {
    pub driver: String,
    pub pool: String,
    /// The node of its slices; empty for a pool not local to one node.
    pub node: String,
    pub total: u64,
    /// Taken by a claim (a device allocated to several claims by sharing
    /// counts once).
    pub allocated: u64,
    /// Allocated with admin access only (monitoring): not taken.
    pub admin_access: u64,
    /// Not taken, but tainted so that new claims do not get it.
    pub unavailable: u64,
    pub free: u64,
}

/// The states, as the gauge's `state` label spells them.
pub const STATES: [&str; 5] = ["total", "allocated", "admin_access", "unavailable", "free"];

impl PoolCapacity {
    /// The values in [`STATES`] order.
    pub fn values(&self) -> [u64; 5] {
        [
            self.total,
            self.allocated,
            self.admin_access,
            self.unavailable,
            self.free,
        ]
    }
}

/// Whether a taint keeps a device from new claims (kube-scheduler's
/// reading: `NoSchedule` and `NoExecute`).
fn keeps_away(effect: &str) -> bool {
    effect == "NoSchedule" || effect == "NoExecute"
}

/// Every pool's capacity, by driver then pool. Only each pool's newest
/// generation counts; a device is counted once however many claims name
/// it.
pub fn pool_capacity<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice> + Clone,
    claims: impl IntoIterator<Item = &'a ClaimView>,
    rules: &[TaintRule],
) -> Vec<PoolCapacity> {
    let mut taken: HashSet<DeviceId> = HashSet::new();
    let mut admin: HashSet<DeviceId> = HashSet::new();
    for claim in claims {
        let Some(allocation) = &claim.status.allocation else {
            continue;
        };
        for r in &allocation.devices.results {
            let id = DeviceId {
                driver: r.driver.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
            };
            if r.admin_access == Some(true) {
                admin.insert(id);
            } else {
                taken.insert(id);
            }
        }
    }
    let mut pools: BTreeMap<(String, String), PoolCapacity> = BTreeMap::new();
    for slice in current_slices(slices) {
        let s = &slice.spec;
        let pool = pools
            .entry((s.driver.clone(), s.pool.name.clone()))
            .or_insert_with(|| PoolCapacity {
                driver: s.driver.clone(),
                pool: s.pool.name.clone(),
                node: s.node_name.clone().unwrap_or_default(),
                ..Default::default()
            });
        if pool.node != s.node_name.clone().unwrap_or_default() {
            pool.node.clear();
        }
        for device in s.devices.iter().flatten() {
            let id = DeviceId {
                driver: s.driver.clone(),
                pool: s.pool.name.clone(),
                device: device.name.clone(),
            };
            pool.total += 1;
            if taken.contains(&id) {
                pool.allocated += 1;
            } else if admin.contains(&id) {
                pool.admin_access += 1;
            } else {
                let tainted = device
                    .taints
                    .iter()
                    .flatten()
                    .any(|t| keeps_away(&t.effect))
                    || rules.iter().any(|r| {
                        keeps_away(&r.taint.effect) && r.selects(&id.driver, &id.pool, &id.device)
                    });
                if tainted {
                    pool.unavailable += 1;
                } else {
                    pool.free += 1;
                }
            }
        }
    }
    pools.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(
        name: &str,
        pool: &str,
        node: &str,
        generation: i64,
        devices: serde_json::Value,
    ) -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"driver": "gpu.example.com", "nodeName": node, "devices": devices,
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1}},
        }))
        .unwrap()
    }

    fn claim(results: serde_json::Value) -> ClaimView {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .unwrap()
    }

    fn result(device: &str, admin: bool) -> serde_json::Value {
        json!({"request": "r", "driver": "gpu.example.com", "pool": "node-1", "device": device,
               "adminAccess": admin})
    }

    #[test]
    fn each_device_in_one_state_counted_once() {
        let devices = json!([
            {"name": "g0"}, {"name": "g1"}, {"name": "g2"},
            {"name": "g3", "taints": [{"key": "k", "effect": "NoSchedule"}]},
            {"name": "g4", "taints": [{"key": "k", "effect": "None"}]},
            {"name": "g5"},
        ]);
        let slices = [
            slice("old", "node-1", "node-1", 1, json!([{"name": "gone"}])),
            slice("new", "node-1", "node-1", 2, devices),
        ];
        let claims = [
            claim(json!([result("g0", false)])),
            // Shared: one device, two claims.
            claim(json!([result("g0", false)])),
            claim(json!([result("g1", true)])),
        ];
        let rule: TaintRule = TaintRule::from_v1(
            &serde_json::from_value(json!({
                "metadata": {"name": "maintenance"},
                "spec": {"deviceSelector": {"device": "g5"},
                         "taint": {"key": "k", "effect": "NoExecute"}},
            }))
            .unwrap(),
        );
        let got = pool_capacity(&slices, &claims, &[rule]);
        assert_eq!(
            got,
            [PoolCapacity {
                driver: "gpu.example.com".into(),
                pool: "node-1".into(),
                node: "node-1".into(),
                total: 6,
                allocated: 1,
                admin_access: 1,
                // g3 (its slice's NoSchedule) and g5 (the rule's NoExecute).
                unavailable: 2,
                // g2, and g4 (a None taint keeps nobody away).
                free: 2,
            }]
        );
        let v = got[0].values();
        assert_eq!(
            v[0],
            v[1] + v[2] + v[3] + v[4],
            "the states add up to the total"
        );
    }
}
