//! A real kube-scheduler against a test API server, for the tests where
//! placement and allocation must be the scheduler's own (pre-scheduled pods
//! rewritten by the chart's policy, the allocator's differential). Found
//! beside `kube-apiserver`; where it is absent, those tests skip.

use std::path::{Path, PathBuf};

use crate::cluster::{Binaries, Cluster, free_port};
use crate::procs::Proc;
use crate::reference::wait_healthy;

pub const SKIP_REASON: &str = "no kube-scheduler beside kube-apiserver (set KUBEBUILDER_ASSETS)";

/// `kube-scheduler` in the directory of `kube-apiserver`, if executable.
pub fn binary(bins: &Binaries) -> Option<PathBuf> {
    crate::cluster::beside_apiserver(bins, "kube-scheduler")
}

/// The kube-scheduler binary for the test `name`, or one `SKIP:` line
/// saying which binary is missing.
pub fn binary_or_skip(name: &str) -> Option<PathBuf> {
    crate::cluster::beside_apiserver_or_skip(name, "kube-scheduler", SKIP_REASON)
}

/// A running kube-scheduler (admin credentials, no leader election).
#[derive(Debug)]
pub struct Scheduler {
    pub proc: Proc,
    pub port: u16,
}

impl Scheduler {
    pub async fn start(binary: &Path, cluster: &Cluster) -> anyhow::Result<Self> {
        Self::start_with(binary, cluster, &[]).await
    }

    /// [`Scheduler::start`] with `extra` flags (e.g. `--feature-gates`).
    pub async fn start_with(
        binary: &Path,
        cluster: &Cluster,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let mut last_err = anyhow::anyhow!("kube-scheduler never started");
        for attempt in 0..3 {
            let port = free_port();
            let mut args = vec![
                format!("--kubeconfig={}", cluster.admin_kubeconfig.display()),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!(
                    "--cert-dir={}",
                    cluster.dir.join("scheduler-certs").display()
                ),
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into(),
                "--authentication-skip-lookup".into(),
                // Its own budget is not what is measured: large enough
                // never to hold it back.
                "--kube-api-qps=500".into(),
                "--kube-api-burst=1000".into(),
                "--v=2".into(),
            ];
            args.extend(extra.iter().cloned());
            let log = cluster.dir.join(format!("kube-scheduler-{attempt}.log"));
            let proc = Proc::spawn("kube-scheduler", binary, &args, &log)?;
            match wait_healthy(&proc, port).await {
                Ok(()) => return Ok(Self { proc, port }),
                Err(e) if proc.exited().is_some() => last_err = e,
                Err(e) => return Err(e),
            }
        }
        Err(last_err)
    }
}
