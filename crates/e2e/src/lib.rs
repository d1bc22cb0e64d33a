//! The end-to-end harness of dra-claim-controller, shared by its e2e tests,
//! its benchmark and its development runner:
//!
//! - [`cluster`]: a real etcd and kube-apiserver on loopback ports, found like
//!   controller-runtime's envtest finds them (`KUBEBUILDER_ASSETS`, else
//!   `/usr/local/kubebuilder/bin`), and controller processes with the chart's
//!   RBAC ([`rbac`], [`helm`], [`pki`], [`procs`], [`replica`], [`rawhttp`]);
//! - [`ctx`]: a test's context (shared or isolated server, its namespace);
//! - [`k8s`]: the objects and API calls scenarios use;
//! - [`fault_proxy`], [`blackhole`], [`faults`], [`invariants`]: faults (HTTP
//!   answers and stalls; TCP connections blackholed) and the checks that
//!   nothing was lost or doubled;
//! - [`admission`]: the chart's MutatingAdmissionPolicy on a test server;
//!   [`scheduler`]: a real kube-scheduler;
//! - [`prometheus`]: a real Prometheus for the metrics and the chart's alerts;
//! - [`reference`]: kube-controller-manager as the reference, for the
//!   differential mode and the benchmark.
//!
//! Without the binaries, tests print one `SKIP:` line and pass.

pub mod admission;
pub mod autoscaler;
pub mod blackhole;
pub mod cluster;
pub mod ctx;
pub mod fault_proxy;
pub mod faults;
pub mod forward_proxy;
pub mod helm;
pub mod image;
pub mod invariants;
pub mod k8s;
pub mod leaks;
pub mod nodes;
pub mod pki;
pub mod procs;
pub mod prometheus;
pub mod rawhttp;
pub mod rbac;
pub mod real_node;
pub mod reference;
pub mod replica;
pub mod scheduler;
