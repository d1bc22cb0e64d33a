//! Which controllers run, decided in one table from the flags and the gates
//! acting, and each built on the process's shared watches.

use tracing::info;

use crate::cli::Args;
use crate::controllers::poolstatus::PoolMetrics;
use crate::controllers::{allocator, devicetaint, headroom, poolstatus, resourceclaim};
use crate::model::features::FeatureGates;
use crate::model::selector::LabelSelector;
use crate::runtime::controller::Lead;
use crate::shared::Shared;

/// Which controllers run. The claim controller always does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Running {
    /// `--allocate-on-nodes` given.
    pub allocator: bool,
    pub headroom: bool,
    /// Asked for, and `DRADeviceTaints` on.
    pub device_taint_eviction: bool,
    /// Asked for, and `DRAResourcePoolStatus` on.
    pub pool_status_requests: bool,
    /// `--pool-metrics` not `off` (a gauge, no workers).
    pub pool_gauge: bool,
}

/// The table: what the flags ask for, as far as the gates allow.
pub(super) fn running(
    asked: &crate::cli::Controllers,
    allocate_on_nodes: bool,
    pool_metrics: PoolMetrics,
    gates: FeatureGates,
) -> Running {
    Running {
        allocator: allocate_on_nodes,
        headroom: asked.headroom,
        device_taint_eviction: asked.device_taint_eviction && gates.device_taints_on(),
        pool_status_requests: asked.resource_pool_status_request && gates.resource_pool_status,
        pool_gauge: pool_metrics != PoolMetrics::Off,
    }
}

/// Builds the controllers that run, in the order their observers are told
/// of each change (the claim controller first), and returns those with
/// workers.
pub(super) fn build(
    shared: &Shared,
    args: &Args,
    allocate_on_nodes: Option<(String, LabelSelector)>,
) -> anyhow::Result<Vec<Box<dyn Lead>>> {
    let run = running(
        &args.controllers,
        allocate_on_nodes.is_some(),
        args.pool_metrics,
        shared.gates,
    );
    if args.controllers.device_taint_eviction && !run.device_taint_eviction {
        info!("DRADeviceTaints is off: the device-taint eviction controller does not run");
    }
    let mut leads = vec![resourceclaim::build(
        shared,
        resourceclaim::Settings {
            workers: args.concurrent_syncs as usize,
            min_resync_period: args.min_resync_period.0,
            metrics_naming: args.metrics_naming,
            allocate_on_nodes: allocate_on_nodes.as_ref().map(|(_, s)| s.clone()),
        },
    )?];
    if run.allocator {
        leads.extend(allocator::build(
            shared,
            allocator::Settings {
                allocate_on_nodes,
                min_resync_period: args.min_resync_period.0,
                event_component: resourceclaim::EVENT_COMPONENT,
            },
        )?);
    }
    if run.headroom {
        leads.push(headroom::build(
            shared,
            headroom::Flags {
                yield_enabled: args.headroom_yield,
                seed_watermarks: args.headroom_seed_watermarks,
                capacity_buffers: args.headroom_capacity_buffers,
            },
        )?);
    }
    if run.device_taint_eviction {
        leads.push(devicetaint::build(
            shared,
            devicetaint::Settings {
                workers: args.concurrent_device_taint_eviction_syncs as usize,
                evictions_per_second: args.device_taint_evictions_per_second,
                evictions_per_rule_per_second: args.device_taint_evictions_per_rule_per_second,
                max_share: args.device_taint_eviction_max_share,
            },
        )?);
    }
    if run.pool_status_requests {
        leads.push(poolstatus::build_requests(shared)?);
    }
    if run.pool_gauge {
        poolstatus::build_gauge(shared, args.pool_metrics);
    }
    Ok(leads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Controllers;

    #[test]
    fn the_flags_ask_and_the_gates_allow() {
        let all = Controllers {
            headroom: true,
            device_taint_eviction: true,
            resource_pool_status_request: true,
        };
        let none = Controllers {
            headroom: false,
            device_taint_eviction: false,
            resource_pool_status_request: false,
        };
        let on = FeatureGates {
            resource_pool_status: true,
            ..FeatureGates::default()
        };
        let taints_off = FeatureGates {
            device_taints: false,
            ..on
        };
        // (case, asked, --allocate-on-nodes, --pool-metrics, gates, running)
        let rows = [
            (
                "everything asked, everything allowed",
                &all,
                true,
                PoolMetrics::Pool,
                on,
                Running {
                    allocator: true,
                    headroom: true,
                    device_taint_eviction: true,
                    pool_status_requests: true,
                    pool_gauge: true,
                },
            ),
            (
                "nothing asked",
                &none,
                false,
                PoolMetrics::Off,
                on,
                Running {
                    allocator: false,
                    headroom: false,
                    device_taint_eviction: false,
                    pool_status_requests: false,
                    pool_gauge: false,
                },
            ),
            (
                "eviction asked, DRADeviceTaints off",
                &all,
                false,
                PoolMetrics::Off,
                taints_off,
                Running {
                    allocator: false,
                    headroom: true,
                    device_taint_eviction: false,
                    pool_status_requests: true,
                    pool_gauge: false,
                },
            ),
            (
                "requests asked, DRAResourcePoolStatus off (1.36's default)",
                &all,
                false,
                PoolMetrics::Pool,
                FeatureGates::default(),
                Running {
                    allocator: false,
                    headroom: true,
                    device_taint_eviction: true,
                    pool_status_requests: false,
                    pool_gauge: true,
                },
            ),
        ];
        for (case, asked, allocate, pool_metrics, gates, want) in rows {
            assert_eq!(
                running(asked, allocate, pool_metrics, gates),
                want,
                "{case}"
            );
        }
    }
}
