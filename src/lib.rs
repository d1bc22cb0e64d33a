//! dra-claim-controller: the DRA ResourceClaim lifecycle, run outside
//! kube-controller-manager.
//!
//! Two rooms:
//!
//! - **The controller runtime**, generic, in the manner of client-go:
//!   [`workqueue`] (deduplicating rate-limited queue with client-go's
//!   metrics), [`informer`] (one watch feeding a handler, with liveness),
//!   [`client`] (the process-wide QPS/burst budget, `rest_client_*`
//!   metrics, drain on shutdown), [`reachability`] (holding work through an
//!   API server outage), [`leader`] (Lease election), [`http`] and
//!   [`exposition`] (probes and metrics).
//! - **The claim controller**: [`controllers::resourceclaim`] (decisions,
//!   caches, watches' effects, feature gates) and [`naming`] (claim-entry
//!   resolution and generated names), wired together in [`app`] with the
//!   flags of [`cli`].
//! - **The admin's tools**: [`inspect`] (`drain-check` and `audit`, also
//!   as the kubectl plugin `kubectl-dra`), read-only, sharing the claim
//!   classifier with the controller's metrics.
//!
//! The library surface exists so that integration tests and benchmarks can
//! drive the same code the binary runs.

pub mod allocate;
pub mod app;
pub mod cli;
pub mod controllers;
pub mod inspect;
pub mod model;
pub mod naming;
pub mod runtime;
pub mod workqueue;
