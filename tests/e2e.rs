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

// Scenario modules are private to this test crate and share helpers among
// themselves with `pub`, which the lint would call unreachable.
#![allow(unreachable_pub)]

use dra_e2e::{
    admission, autoscaler, blackhole, cluster, ctx, fault_proxy, faults, forward_proxy, helm,
    invariants, k8s, nodes, procs, prometheus, rawhttp, rbac, real_node, reference, replica,
    scheduler,
};

#[path = "e2e/allocator.rs"]
mod allocator;
#[path = "e2e/allocator_taints.rs"]
mod allocator_taints;
#[path = "e2e/api_priority.rs"]
mod api_priority;
#[path = "e2e/cleanup.rs"]
mod cleanup;
#[path = "e2e/device_taint_budgets.rs"]
mod device_taint_budgets;
#[path = "e2e/device_taint_cases.rs"]
mod device_taint_cases;
#[path = "e2e/device_taints.rs"]
mod device_taints;
#[path = "e2e/device_taints_differential.rs"]
mod device_taints_differential;
#[path = "e2e/drain_budgets.rs"]
mod drain_budgets;
#[path = "e2e/drain_check.rs"]
mod drain_check;
#[path = "e2e/drain_selector.rs"]
mod drain_selector;
#[path = "e2e/faults_api.rs"]
mod faults_api;
#[path = "e2e/faults_blackhole.rs"]
mod faults_blackhole;
#[path = "e2e/faults_finished.rs"]
mod faults_finished;
#[path = "e2e/faults_input.rs"]
mod faults_input;
#[path = "e2e/faults_races.rs"]
mod faults_races;
#[path = "e2e/faults_restarts.rs"]
mod faults_restarts;
#[path = "e2e/podgroups.rs"]
mod podgroups;
#[path = "e2e/pool_status.rs"]
mod pool_status;
#[path = "e2e/prescheduled_policy.rs"]
mod prescheduled_policy;
#[path = "e2e/real_node_drain.rs"]
mod real_node_drain;
#[path = "e2e/real_node.rs"]
mod real_node_tests;

#[path = "e2e/release_1_38.rs"]
mod release_1_38;
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
#[path = "e2e/start_up.rs"]
mod start_up;

#[path = "e2e/chart_admission.rs"]
mod chart_admission;
#[path = "e2e/differential.rs"]
mod differential;
#[path = "e2e/handover.rs"]
mod handover;
#[path = "e2e/headroom.rs"]
mod headroom;
#[path = "e2e/headroom_autoscaler.rs"]
mod headroom_autoscaler;
#[path = "e2e/headroom_autoscaler_doors.rs"]
mod headroom_autoscaler_doors;
#[path = "e2e/headroom_buffers.rs"]
mod headroom_buffers;
#[path = "e2e/headroom_seed.rs"]
mod headroom_seed;
#[path = "e2e/hostile.rs"]
mod hostile;
