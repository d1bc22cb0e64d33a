//! The process's watches, shared by every controller (kube-controller-manager's
//! shared informers): each kind is listed and watched once into one store,
//! and each change is told to the rooms observing that kind, after the
//! store holds it. The rooms keep no watch of their own; `app` decides who
//! observes what.
//!
//! - `claims.rs`: pods (those with claims, with their history), claims,
//!   templates and PodGroups;
//! - `devices.rs`: ResourceSlices, DeviceClasses, Nodes and DeviceTaintRules,
//!   each watched only when a room reads it;
//! - `pod_history.rs`: what a pod event means for the pod store.

pub mod claims;
pub mod devices;
mod pod_history;
