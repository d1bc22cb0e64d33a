//! Our `NodeScalingWatermark` (`dra-claim-controller.io/v1alpha1`): pure
//! decisions, each table-tested. The spec with its defaults
//! ([`watermark`]), what a pod weighs and which pods count as workload
//! ([`usage`], which also says which pods wait for devices, for the
//! yield), which devices an entry counts and who uses them ([`devices`]),
//! how many placeholders that makes ([`sizing`]), the objects that keep
//! them ([`desired`]), the status ([`status`]), and everything a watermark
//! wants from a snapshot of the stores ([`plan`]). The controller writes
//! what they decide (headroom's `execute.rs`).

pub(crate) mod desired;
pub(crate) mod devices;
pub(crate) mod plan;
pub(crate) mod sizing;
pub(crate) mod status;
pub(crate) mod usage;
pub mod watermark;
