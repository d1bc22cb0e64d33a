//! A device by the names allocation results use, and the one rule for
//! which results take a device away from every other claim.

use std::collections::HashMap;

use super::views::ClaimView;

/// A device by the names an allocation result uses.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl DeviceId {
    /// The device an allocation result entry takes from every other claim:
    /// none for admin access, or for a share of a device that allows
    /// multiple allocations (`shareID`).
    pub fn taken_by(
        driver: &str,
        pool: &str,
        device: &str,
        admin_access: Option<bool>,
        share_id: Option<&str>,
    ) -> Option<DeviceId> {
        (admin_access != Some(true) && share_id.is_none()).then(|| DeviceId {
            driver: driver.to_string(),
            pool: pool.to_string(),
            device: device.to_string(),
        })
    }
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// Devices held by more than one claim (admin access aside): what the
/// safety-net gauge counts. Must be 0.
pub fn double_allocations<'a>(claims: impl IntoIterator<Item = &'a ClaimView>) -> usize {
    let mut holders: HashMap<DeviceId, usize> = HashMap::new();
    for claim in claims {
        let mut mine: Vec<DeviceId> = claim.held_devices().collect();
        // A claim listing a device twice is not two claims holding it.
        mine.sort();
        mine.dedup();
        for device in mine {
            *holders.entry(device).or_default() += 1;
        }
    }
    holders.values().filter(|n| **n > 1).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(uid: &str, devices: &[(&str, bool)]) -> ClaimView {
        let results: Vec<_> = devices
            .iter()
            .map(|(d, admin)| json!({"request": "r", "driver": "gpu", "pool": "node-1", "device": d, "adminAccess": admin}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .unwrap()
    }

    #[test]
    fn double_allocations_count_devices_not_claims() {
        let claims = [
            claim("a", &[("gpu-0", false), ("gpu-1", false)]),
            claim("b", &[("gpu-0", false)]),
            claim("c", &[("gpu-0", false), ("gpu-1", false)]),
            claim("d", &[("gpu-2", true)]),
            claim("e", &[("gpu-2", false)]),
        ];
        assert_eq!(double_allocations(&claims), 2);
        assert_eq!(double_allocations(&claims[3..]), 0);
    }
}
