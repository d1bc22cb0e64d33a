//! How many placeholders a watermark entry asks for: the headroom is a
//! percentage of what workloads use, divided into placeholders of a fixed
//! size, rounded up (so any use gives headroom), then bounded.

use crate::allocate::quantity::Quantity;
use crate::model::requests::ResourceList;

/// `minPlaceholders` / `maxPlaceholders` of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bounds {
    pub min: u32,
    /// `None`: unbounded.
    pub max: Option<u32>,
}

impl Bounds {
    fn clamp(self, n: u64) -> u32 {
        let n = u32::try_from(n).unwrap_or(u32::MAX).max(self.min);
        match self.max {
            // A max below the min: the min wins, as "at least" is what
            // keeps headroom before any workload.
            Some(max) => n.min(max.max(self.min)),
            None => n,
        }
    }
}

/// ceil(`in_use` × `percentage` / 100 / `per_placeholder`), bounded. A
/// placeholder of size zero holds nothing: only the bounds apply.
pub(crate) fn placeholders(
    in_use: Quantity,
    percentage: u32,
    per_placeholder: Quantity,
    bounds: Bounds,
) -> u32 {
    bounds.clamp(raw_placeholders(in_use, percentage, per_placeholder))
}

fn raw_placeholders(in_use: Quantity, percentage: u32, per_placeholder: Quantity) -> u64 {
    let (used, per) = (in_use.nanos(), per_placeholder.nanos());
    if used <= 0 || per <= 0 || percentage == 0 {
        return 0;
    }
    // Exact integer arithmetic: 50 % of 6 devices is 3, never 3.0000001.
    let wanted = used.saturating_mul(i128::from(percentage));
    let unit = per.saturating_mul(100);
    let n = wanted / unit + i128::from(wanted % unit != 0);
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Resource placeholders (CPU, memory, and any other resource the pause
/// pod names: device-plugin GPUs, hugepages, ephemeral storage): the
/// largest count over the resources of `pause` (a resource the pause pod
/// does not request does not size it).
pub(crate) fn resource_placeholders(
    in_use: &ResourceList,
    percentage: u32,
    pause: &ResourceList,
    bounds: Bounds,
) -> u32 {
    let zero = Quantity::from_units(0);
    let most = pause
        .iter()
        .map(|(name, per)| raw_placeholders(*in_use.get(name).unwrap_or(&zero), percentage, *per))
        .max()
        .unwrap_or(0);
    bounds.clamp(most)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap()
    }

    #[test]
    fn device_placeholders_round_up_then_bound() {
        let unbounded = Bounds::default();
        let rows = [
            // (name, in use, %, per placeholder, bounds, want)
            ("contract example: 50 % of 6", "6", 50, "1", unbounded, 3),
            ("nothing in use", "0", 50, "1", unbounded, 0),
            ("any use gives headroom", "1", 10, "1", unbounded, 1),
            (
                "exact fraction is not rounded up",
                "4",
                25,
                "1",
                unbounded,
                1,
            ),
            ("just over rounds up", "5", 20, "1", unbounded, 1),
            ("two devices per placeholder", "6", 50, "2", unbounded, 2),
            ("100 %", "7", 100, "1", unbounded, 7),
            (
                "min before any workload",
                "0",
                50,
                "1",
                Bounds { min: 2, max: None },
                2,
            ),
            (
                "max caps",
                "100",
                100,
                "1",
                Bounds {
                    min: 0,
                    max: Some(4),
                },
                4,
            ),
            (
                "min above max: min",
                "0",
                50,
                "1",
                Bounds {
                    min: 3,
                    max: Some(1),
                },
                3,
            ),
            (
                "placeholder of size 0",
                "8",
                50,
                "0",
                Bounds { min: 1, max: None },
                1,
            ),
        ];
        for (name, used, pct, per, bounds, want) in rows {
            assert_eq!(placeholders(q(used), pct, q(per), bounds), want, "{name}");
        }
    }

    fn list(pairs: &[(&str, &str)]) -> ResourceList {
        crate::model::requests::parse_list(
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    #[test]
    fn resource_placeholders_take_the_largest_resource() {
        let pause = list(&[("cpu", "200m"), ("memory", "200Mi")]);
        let rows = [
            // (name, in use, %, want)
            (
                "cpu decides",
                list(&[("cpu", "4"), ("memory", "200Mi")]),
                10,
                2,
            ),
            (
                "memory decides",
                list(&[("cpu", "100m"), ("memory", "4Gi")]),
                10,
                3,
            ),
            (
                "seed rounds down, we round up",
                list(&[("cpu", "1")]),
                10,
                1,
            ),
            ("idle", list(&[]), 50, 0),
        ];
        for (name, used, pct, want) in rows {
            assert_eq!(
                resource_placeholders(&used, pct, &pause, Bounds::default()),
                want,
                "{name}"
            );
        }
        let used = list(&[("cpu", "2"), ("memory", "64Gi"), ("nvidia.com/gpu", "7")]);
        assert_eq!(
            resource_placeholders(&used, 50, &list(&[("cpu", "1")]), Bounds::default()),
            1,
            "memory does not size a pause pod that requests none"
        );
        assert_eq!(
            resource_placeholders(
                &used,
                50,
                &list(&[("nvidia.com/gpu", "1")]),
                Bounds::default()
            ),
            4,
            "device-plugin GPUs: 50 % of 7, rounded up"
        );
    }
}
