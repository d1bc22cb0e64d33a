//! How many placeholders a watermark entry asks for: the headroom is a
//! percentage of what workloads use, divided into placeholders of a fixed
//! size, rounded up (so any use gives headroom), then bounded.

use crate::allocate::quantity::Quantity;

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
pub fn placeholders(
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

/// CPU and memory, as a pod requests them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resources {
    pub cpu: Quantity,
    pub memory: Quantity,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpu: Quantity::from_units(0),
            memory: Quantity::from_units(0),
        }
    }
}

/// CPU/memory placeholders: the largest count over the resources of
/// `pause` (a resource the pause pod does not request does not size it).
pub fn cpu_memory_placeholders(
    in_use: Resources,
    percentage: u32,
    pause: Resources,
    bounds: Bounds,
) -> u32 {
    let cpu = raw_placeholders(in_use.cpu, percentage, pause.cpu);
    let memory = raw_placeholders(in_use.memory, percentage, pause.memory);
    bounds.clamp(cpu.max(memory))
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

    #[test]
    fn cpu_memory_placeholders_take_the_larger_resource() {
        let pause = Resources {
            cpu: q("200m"),
            memory: q("200Mi"),
        };
        let rows = [
            // (name, cpu in use, memory in use, %, want)
            ("cpu decides", "4", "200Mi", 10, 2),
            ("memory decides", "100m", "4Gi", 10, 3),
            ("seed rounds down, we round up", "1", "0", 10, 1),
            ("idle", "0", "0", 50, 0),
        ];
        for (name, cpu, memory, pct, want) in rows {
            let used = Resources {
                cpu: q(cpu),
                memory: q(memory),
            };
            assert_eq!(
                cpu_memory_placeholders(used, pct, pause, Bounds::default()),
                want,
                "{name}"
            );
        }
        let cpu_only = Resources {
            cpu: q("1"),
            memory: q("0"),
        };
        let used = Resources {
            cpu: q("2"),
            memory: q("64Gi"),
        };
        assert_eq!(
            cpu_memory_placeholders(used, 50, cpu_only, Bounds::default()),
            1,
            "memory does not size a pause pod that requests none"
        );
    }
}
