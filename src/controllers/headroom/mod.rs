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
//! ([`yield_choice`]). The [`controller`] reads the caches, applies the
//! objects, writes the status, and performs the yields.

pub mod controller;
pub mod desired;
pub mod devices;
pub mod sizing;
pub mod status;
pub mod usage;
pub mod watermark;
pub mod yield_choice;

/// The room's door: what `app.rs` uses.
pub use controller::Controller;
