//! Headroom: placeholder pods that keep spare devices and CPU/memory on
//! autoscaled node pools, so that a cluster autoscaler adds nodes before
//! real pods wait. The behaviour contract is `docs/headroom.md` of the
//! project.
//!
//! A folder per front door, each behind a CRD of its own, and one for the
//! yield:
//!
//! - `watermarks/`: our `NodeScalingWatermark`
//!   (`dra-claim-controller.io/v1alpha1`), pure decisions, each
//!   table-tested: the spec with its defaults ([`watermark`]), what a pod
//!   weighs and which pods count as workload (`usage.rs`), which devices
//!   an entry counts and who uses them (`devices.rs`), how many
//!   placeholders that makes (`sizing.rs`), the objects that keep them
//!   (`desired.rs`), the status (`status.rs`), and everything a watermark
//!   wants from a snapshot of the stores (`plan.rs`);
//! - `operator_compat/`: redhat-cop's proactive-node-scaling-operator's
//!   `NodeScalingWatermark` (`redhatcop.redhat.io/v1alpha1`), its API
//!   served unchanged: the seed's rules ([`seed`]) and their sync
//!   (`seed_sync.rs`);
//! - `capacity_buffers/`: the cluster-autoscaler's CapacityBuffers with our
//!   strategy: the count, Deployment and status ([`buffer`]), where a
//!   buffer's pod shape comes from (`buffer_sources.rs`), the watches that
//!   follow it (`source_watches.rs`), and the sync (`buffer_sync.rs`);
//! - `yielding/`: device placeholders of any door that yield their devices
//!   to a pod waiting for them: which ones (`yield_choice.rs`), and the
//!   release with its promises (`mod.rs`).
//!
//! Here, shared by every door: the [`controller`] (state, queue, worker,
//! sync, and the one rule for "a placeholder of ours"), its front doors,
//! each open once its CRD is served (`doors.rs`), what wakes it
//! (`watches.rs`), its writes (`execute.rs`) and its metrics
//! (`metrics.rs`).

mod capacity_buffers;
pub mod controller;
mod doors;
mod execute;
mod metrics;
mod operator_compat;
mod watches;
mod watermarks;
mod yielding;

use std::sync::Arc;

use crate::runtime::controller::Lead;
use crate::shared::Shared;
use crate::watches::devices::Kinds;
use controller::{Controller, Settings, Stores};

/// Which of headroom's parts the flags turn on.
pub struct Flags {
    /// `--headroom-yield`.
    pub yield_enabled: bool,
    /// `--headroom-seed-watermarks`.
    pub seed_watermarks: bool,
    /// `--headroom-capacity-buffers`.
    pub capacity_buffers: bool,
}

/// Headroom on the process's watches: it reads slices, classes, nodes
/// (and rules' taints), observes claims and the device kinds, keeps the
/// pods it needs from every pod event, and watches its front doors' CRDs
/// itself. The process is ready once those doors have settled.
pub fn build(shared: &Shared, flags: Flags) -> anyhow::Result<Box<dyn Lead>> {
    shared.read_devices(Kinds::for_allocating(&shared.gates));
    let stores = shared.claims.stores();
    let headroom = Controller::new(
        shared.client.clone(),
        &shared.registry,
        Settings {
            yield_enabled: flags.yield_enabled,
            seed_watermarks: flags.seed_watermarks,
            capacity_buffers: flags.capacity_buffers,
            health: shared.health.clone(),
            gates: shared.gates,
        },
        Stores {
            devices: shared.devices.stores().clone(),
            claims: stores.claims.clone(),
            claim_pods: stores.pods.clone(),
            synced: shared.synced.clone(),
        },
        &shared.identity,
        shared.reachability.clone(),
    )?;
    shared.observe_claims(headroom.clone());
    shared.observe_slices(headroom.clone());
    shared.observe_classes(headroom.clone());
    shared.observe_nodes(headroom.clone());
    shared.handle_pods(headroom.clone());
    shared.spawn_with_watches(headroom.clone().run_watch());
    let settled = Arc::clone(&headroom);
    shared.ready_once(async move { settled.wait_synced().await });
    Ok(Box::new(headroom.run()))
}

/// Each front door's API, where it has always been.
pub use capacity_buffers::buffer;
pub use operator_compat::seed;
pub use watermarks::watermark;
