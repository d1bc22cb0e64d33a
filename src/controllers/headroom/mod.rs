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

/// The room's door: what `app.rs` uses.
pub use controller::{Controller, Settings, Stores};
pub use watches::keeps as keeps_pod;

/// Each front door's API, where it has always been.
pub use capacity_buffers::buffer;
pub use operator_compat::seed;
pub use watermarks::watermark;
