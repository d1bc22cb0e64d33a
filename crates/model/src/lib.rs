//! What DRA objects mean, shared by the controllers and the admin
//! commands: slim views of pods, claims, templates, PodGroups and nodes
//! ([`views`]), the stores' indexes ([`indexes`]), who consumes a claim
//! ([`consumers`]), devices and double allocations ([`device`]), the claim
//! classifier behind `drain-check`, `audit` and the controller's gauges
//! ([`classify`]), what a pod requests ([`requests`]), and the feature
//! gates ([`features`]); claim names and ownership ([`naming`]); the pure
//! device allocator ([`allocate`]). Uses the runtime's types; knows no
//! controller (a crate of its own, so the compiler keeps it so).

pub mod allocate;
pub mod capacity;
pub mod classify;
pub mod consumers;
pub mod device;
pub mod device_taints;
pub mod features;
pub mod indexes;
pub mod naming;
pub mod pool_status;
pub mod requests;
pub mod selector;
pub mod views;

pub use device::DeviceId;
