//! dra-claim-controller: the DRA ResourceClaim lifecycle, run outside
//! kube-controller-manager.
//!
//! The library surface exists so that integration tests and benchmarks can
//! drive the same code the binary runs.

pub mod app;
pub mod cli;
pub mod client;
pub mod controllers;
pub mod exposition;
pub mod features;
pub mod http;
pub mod leader;
pub mod naming;
pub mod reachability;
pub mod workqueue;
