//! Development runner: the controller against the cluster of the current
//! kubeconfig, or, when none is configured, against a throwaway local API
//! server started from the end-to-end test binaries (etcd and
//! kube-apiserver in `$KUBEBUILDER_ASSETS` or `/usr/local/kubebuilder/bin`).
//!
//! `cargo run --release --example dra-dev -- [controller flags]`
//!
//! Leader election is off unless a flag says otherwise: one developer, one
//! replica. Ctrl-C stops the controller and the local API server.

use dra_e2e::{cluster, rbac};

use std::process::ExitCode;

use clap::Parser;

use dra_claim_controller::app;
use dra_claim_controller::cli::Args;

fn main() -> ExitCode {
    let mut argv: Vec<String> = std::env::args().collect();
    if !argv.iter().any(|a| a.starts_with("--leader-elect")) {
        argv.push("--leader-elect=false".into());
    }
    let mut args = Args::parse_from(&argv);
    app::init_logging(&args);
    app::block_on_exit("dra-dev", async move {
        // Kept alive while the controller runs; dropping it stops the processes.
        let mut _local = None;
        if args.kubeconfig.is_none() && kube::Config::infer().await.is_err() {
            let Some(bins) = cluster::binaries() else {
                eprintln!(
                    "dra-dev: no cluster configured (set KUBECONFIG or pass --kubeconfig), and no \
                     etcd/kube-apiserver to start a local one: put them in /usr/local/kubebuilder/bin \
                     or set KUBEBUILDER_ASSETS to their directory."
                );
                return Ok(ExitCode::from(2));
            };
            match cluster::Cluster::start(&bins).await {
                Ok(c) => {
                    eprintln!(
                        "dra-dev: local API server running; kubectl access: KUBECONFIG={}",
                        c.admin_kubeconfig.display()
                    );
                    args.kubeconfig = Some(c.controller_kubeconfig.clone());
                    args.leader_elect_resource_namespace
                        .get_or_insert_with(|| rbac::SYSTEM_NAMESPACE.to_string());
                    _local = Some(c);
                }
                Err(e) => return Err(e.context("starting the local API server")),
            }
        }
        app::run(args).await
    })
}
