//! The pure device allocator (the solver behind `controllers::allocator`):
//! devices for one claim on one node, as kube-scheduler would pick them.
//!
//! Everything here is pure: `inventory` turns ResourceSlices into a node's
//! devices, `selector` evaluates CEL device selectors, `allocator` picks
//! devices; `quantity` and `semver` are the value types selectors compare.

pub mod allocator;
pub mod inventory;
pub mod quantity;
mod search;
pub mod selector;
pub mod semver;

#[cfg(test)]
mod tests;

pub use allocator::{AllocationInput, Outcome, allocate, devices_taken, on_solver_stack};
pub use inventory::{Inventory, node_inventory};
