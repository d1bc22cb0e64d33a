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
mod solver_thread;

#[cfg(test)]
mod tests;

pub use allocator::{AllocationInput, Outcome, allocate, allocate_until, devices_taken};
pub use inventory::{Inventory, node_inventory};
pub use solver_thread::{SOLVER_STACK_BYTES, on_solver_stack};
