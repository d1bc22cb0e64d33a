//! End-to-end tests: a real etcd and kube-apiserver on loopback ports, the
//! controller binary as a separate process with its own RBAC-limited
//! identity, and scenarios driven with plain API calls.
//!
//! Without the binaries (see `cluster::binaries`) every test prints one
//! `SKIP:` line and passes. Run with `--nocapture` to see the `E2E RAN:`
//! lines CI counts.
//!
//! Environment:
//! - `KUBEBUILDER_ASSETS`: directory with `etcd` and `kube-apiserver`
//!   (default `/usr/local/kubebuilder/bin`).
//! - `DRA_E2E_KEEP=1`: keep each server's directory (logs, etcd data).
//! - `DRA_E2E_RBAC=builtin`: use the built-in RBAC rules instead of the chart's.
//! - `DRA_E2E_APISERVER_FEATURE_GATES`: the API server's `--feature-gates`.

// The harness modules are shared by `#[path]` between the test, bench and
// example crates; in each crate they are private, so their `pub` items are
// "unreachable" by design.
#![allow(unreachable_pub)]

#[path = "support/helm.rs"]
mod helm;

#[path = "e2e/cluster.rs"]
mod cluster;
#[path = "e2e/ctx.rs"]
mod ctx;
#[path = "e2e/fault_proxy.rs"]
mod fault_proxy;
#[path = "e2e/faults.rs"]
mod faults;
#[path = "e2e/invariants.rs"]
mod invariants;
#[path = "e2e/k8s.rs"]
mod k8s;
#[path = "e2e/pki.rs"]
mod pki;
#[path = "e2e/procs.rs"]
mod procs;
#[path = "e2e/rawhttp.rs"]
mod rawhttp;
#[path = "e2e/rbac.rs"]
mod rbac;
#[path = "e2e/replica.rs"]
mod replica;

#[path = "e2e/faults_api.rs"]
mod faults_api;
#[path = "e2e/faults_input.rs"]
mod faults_input;
#[path = "e2e/faults_races.rs"]
mod faults_races;
#[path = "e2e/faults_restarts.rs"]
mod faults_restarts;

#[path = "e2e/scenarios_claims.rs"]
mod scenarios_claims;
#[path = "e2e/scenarios_decisions.rs"]
mod scenarios_decisions;
#[path = "e2e/scenarios_gates.rs"]
mod scenarios_gates;
#[path = "e2e/scenarios_reservations.rs"]
mod scenarios_reservations;
#[path = "e2e/scenarios_scale.rs"]
mod scenarios_scale;

#[path = "e2e/reference.rs"]
mod reference;

#[path = "e2e/differential.rs"]
mod differential;
#[path = "e2e/handover.rs"]
mod handover;
