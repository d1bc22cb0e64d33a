//! dra-claim-controller: kube-controller-manager's DRA controllers, run
//! outside it, more controllers of our own, and the tools around them.
//! Three layers, arrows pointing down only:
//!
//! - [`runtime`]: what any controller of ours needs, knowing no DRA type:
//!   client and request budget, informers and indexed stores, errors that
//!   decide retries, events, leader election, HTTP endpoints; beside it
//!   [`workqueue`] (client-go's queue with its metrics).
//! - [`model`]: what DRA objects mean, shared by controllers and tools:
//!   slim views, store indexes, consumers, devices, the claim classifier,
//!   feature gates; [`naming`] (claim-entry resolution and generated names)
//!   and [`allocate`] (the pure device allocator) sit with it.
//! - [`controllers`]: rooms with one door each, no controller importing
//!   another:
//!   - `resourceclaim`: the claim lifecycle (kube-controller-manager's
//!     `resourceclaim-controller`);
//!   - `devicetaint`: pods on devices with an untolerated `NoExecute`
//!     taint evicted, DeviceTaintRule status written
//!     (`device-taint-eviction-controller`);
//!   - `poolstatus`: ResourcePoolStatusRequests answered
//!     (`resourcepoolstatusrequest-controller`) and the pool capacity
//!     gauge;
//!   - `allocator`: devices for pre-scheduled pods on the nodes of
//!     `--allocate-on-nodes`;
//!   - `headroom`: placeholder pods for `NodeScalingWatermark`s (also the
//!     redhat-cop operator's API) and CapacityBuffers.
//!
//!   [`inspect`] (the admin commands `drain-check`, `audit`, `drain`,
//!   `uncordon`, `pools`, `check-release`, also the kubectl plugin
//!   `kubectl-dra`) uses the model and the runtime only.
//!
//! Between the model and the controllers: [`watches`], each kind watched
//! once for the process, and [`shared`], what every controller is built
//! with. [`app`] runs the process (start-up, build, lead, shut down) with
//! the flags of [`cli`]. The library surface exists so that
//! integration tests and benchmarks drive the same code the binary runs.

pub use dra_model::allocate;
pub mod app;
pub mod cli;
pub mod controllers;
pub use dra_inspect as inspect;
pub use dra_model as model;
pub mod naming;
pub use dra_runtime as runtime;
pub mod shared;
pub mod watches;
pub mod workqueue;
