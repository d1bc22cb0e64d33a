//! Headroom (`NodeScalingWatermark`, `dra-claim-controller.io/v1alpha1`):
//! placeholder pods that keep spare devices and CPU/memory on autoscaled
//! node pools, so that a cluster autoscaler adds nodes before real pods
//! wait. The behaviour contract is `docs/headroom.md` of the project.
//!
//! Pure decisions, each table-tested: the spec with its defaults
//! ([`watermark`]), what a pod weighs and which pods count as workload
//! ([`usage`]), which devices an entry counts and who uses them
//! ([`devices`]), how many placeholders that makes ([`sizing`]), the
//! objects that keep them ([`desired`]), the status ([`status`]), and which
//! placeholders yield their devices to a pod waiting for them
//! ([`yield_choice`]), and everything a watermark wants from a snapshot of
//! the stores ([`plan`]).
//!
//! Around them: the [`controller`] (state, queue, worker, sync), its front
//! doors, each open once its CRD is served (`doors.rs`), what wakes
//! it (`watches.rs`), its writes (`execute.rs`), the yield (`yielding.rs`)
//! and its metrics (`metrics.rs`).

pub mod buffer;
pub(crate) mod buffer_sources;
mod buffer_sync;
#[cfg(test)]
mod buffer_tests;
pub mod controller;
pub(crate) mod desired;
pub(crate) mod devices;
mod doors;
mod execute;
#[cfg(test)]
mod execute_tests;
mod metrics;
pub(crate) mod plan;
#[cfg(test)]
mod plan_tests;
pub mod seed;
mod seed_sync;
#[cfg(test)]
mod seed_tests;
pub(crate) mod sizing;
mod source_watches;
pub(crate) mod status;
pub(crate) mod usage;
mod watches;
pub mod watermark;
pub(crate) mod yield_choice;
#[cfg(test)]
mod yield_choice_tests;
mod yielding;

/// The room's door: what `app.rs` uses.
pub use controller::{Controller, Settings, Stores};
pub use watches::keeps as keeps_pod;
