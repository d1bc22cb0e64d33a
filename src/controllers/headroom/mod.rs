//! Headroom (`NodeScalingWatermark`, `dra-claim-controller.io/v1alpha1`):
//! placeholder pods that keep spare devices and CPU/memory on autoscaled
//! node pools, so that a cluster autoscaler adds nodes before real pods
//! wait. The behaviour contract is `docs/headroom.md` of the project.
//!
//! This room holds, so far, the pure decisions the controller is built
//! on: the spec with its defaults ([`watermark`]), what a pod weighs and
//! which pods count as workload ([`usage`]), how many placeholders a
//! watermark asks for ([`sizing`]) and the objects that keep them
//! ([`desired`]), the status they give ([`status`]), and the
//! [`controller`] that applies them (CPU/memory entries so far).

pub mod controller;
pub mod desired;
pub mod sizing;
pub mod status;
pub mod usage;
pub mod watermark;
