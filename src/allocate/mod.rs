//! Device allocation for claims of pods that bypassed kube-scheduler
//! (`spec.nodeName`) on nodes the admin declared with `--allocate-on-nodes`.
//!
//! Everything here is pure: `inventory` turns ResourceSlices into a node's
//! devices, `selector` evaluates CEL device selectors, `allocator` picks
//! devices; `quantity` and `semver` are the value types selectors compare.

pub mod allocator;
pub mod inventory;
pub mod quantity;
pub mod selector;
pub mod semver;

#[cfg(test)]
mod tests;

pub use allocator::{AllocationInput, Outcome, allocate};
pub use inventory::{Inventory, node_inventory};
