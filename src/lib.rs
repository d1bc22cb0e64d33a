//! dra-claim-controller: the DRA ResourceClaim lifecycle, run outside
//! kube-controller-manager, and the tools around it. Three layers, arrows
//! pointing down only:
//!
//! - [`runtime`]: what any controller of ours needs, knowing no DRA type:
//!   client and request budget, informers and indexed stores, errors that
//!   decide retries, events, leader election, HTTP endpoints; beside it
//!   [`workqueue`] (client-go's queue with its metrics).
//! - [`model`]: what DRA objects mean, shared by controllers and tools:
//!   slim views, store indexes, consumers, devices, the claim classifier,
//!   feature gates; [`naming`] (claim-entry resolution and generated names)
//!   and [`allocate`] (the pure device allocator) sit with it.
//! - [`controllers`]: rooms with one door each. `resourceclaim` (the claim
//!   lifecycle) and `allocator` (devices for pre-scheduled pods on
//!   declared nodes); no controller imports another. [`inspect`]
//!   (`drain-check`, `audit`, also the kubectl plugin `kubectl-dra`) uses
//!   the model and the runtime only.
//!
//! [`app`] wires them (which controllers run, which watches feed them,
//! shutdown) with the flags of [`cli`]. The library surface exists so that
//! integration tests and benchmarks drive the same code the binary runs.

pub use dra_model::allocate;
pub mod app;
pub mod cli;
pub mod controllers;
pub use dra_inspect as inspect;
pub use dra_model as model;
pub mod naming;
pub use dra_runtime as runtime;
pub mod workqueue;
