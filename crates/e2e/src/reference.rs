//! The reference: kube-controller-manager running only its
//! `resourceclaim-controller`, against a test API server with the admin
//! kubeconfig and no leader election. Found beside `kube-apiserver`; where
//! it is absent, the tests that need it skip.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::cluster::{Binaries, Cluster, free_port};
use crate::procs::Proc;

pub const SKIP_REASON: &str =
    "no kube-controller-manager beside kube-apiserver (set KUBEBUILDER_ASSETS)";

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// `kube-controller-manager` in the directory of `kube-apiserver`, if it is
/// there and executable.
pub fn binary(bins: &Binaries) -> Option<PathBuf> {
    crate::cluster::beside_apiserver(bins, "kube-controller-manager")
}

/// The kube-controller-manager binary for the test `name`, or one `SKIP:`
/// line saying which binary is missing.
pub fn binary_or_skip(name: &str) -> Option<PathBuf> {
    crate::cluster::beside_apiserver_or_skip(name, "kube-controller-manager", SKIP_REASON)
}

/// A running kube-controller-manager.
#[derive(Debug)]
pub struct Reference {
    pub proc: Proc,
    pub port: u16,
}

impl Reference {
    /// Starts it and waits until its secure port answers `/healthz` with `ok`.
    pub async fn start(binary: &Path, cluster: &Cluster) -> anyhow::Result<Self> {
        Self::start_with_gates(binary, cluster, "").await
    }

    /// [`Reference::start`] with these `--feature-gates` besides the DRA ones.
    pub async fn start_with_gates(
        binary: &Path,
        cluster: &Cluster,
        gates: &str,
    ) -> anyhow::Result<Self> {
        Self::start_with_flags(binary, cluster, |port| flags(cluster, port, gates)).await
    }

    /// kube-controller-manager running only `controllers` (its own names,
    /// e.g. `deployment-controller`, `garbage-collector-controller`): the
    /// parts of a real control plane a test needs besides the reference.
    pub async fn start_controllers(
        binary: &Path,
        cluster: &Cluster,
        controllers: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_controllers_with(binary, cluster, controllers, &[]).await
    }

    /// [`Reference::start_controllers`] with `extra` flags (e.g.
    /// `--root-ca-file` for the root CA publisher).
    pub async fn start_controllers_with(
        binary: &Path,
        cluster: &Cluster,
        controllers: &[&str],
        extra: &[String],
    ) -> anyhow::Result<Self> {
        Self::start_with_flags(binary, cluster, |port| {
            let mut flags = base_flags(cluster, port);
            for flag in &mut flags {
                if flag.starts_with("--controllers=") {
                    *flag = format!("--controllers={}", controllers.join(","));
                }
            }
            flags.extend([
                "--kube-api-qps=500".into(),
                "--kube-api-burst=1000".into(),
                "--v=2".into(),
            ]);
            flags.extend(extra.iter().cloned());
            flags
        })
        .await
    }

    async fn start_with_flags(
        binary: &Path,
        cluster: &Cluster,
        flags: impl Fn(u16) -> Vec<String>,
    ) -> anyhow::Result<Self> {
        let mut last_err = anyhow::anyhow!("kube-controller-manager never started");
        // The port is picked before the process binds it: retry if another
        // process took it meanwhile.
        for attempt in 0..3 {
            let port = free_port();
            let log = cluster
                .dir
                .join(format!("kube-controller-manager-{attempt}.log"));
            let proc = Proc::spawn("kube-controller-manager", binary, &flags(port), &log)?;
            match wait_healthy(&proc, port).await {
                Ok(()) => return Ok(Self { proc, port }),
                Err(e) if proc.exited().is_some() => last_err = e,
                Err(e) => return Err(e),
            }
        }
        Err(last_err)
    }

    /// The log lines that contain `needle` (the last `max` of them).
    pub fn grep(&self, needle: &str, max: usize) -> String {
        crate::procs::grep(&self.proc.log, needle, max)
    }
}

/// Only the resourceclaim-controller, as the admin (no per-controller
/// service accounts: no token controller runs here), serving health and
/// metrics on loopback without authentication. Budget and verbosity are
/// the caller's.
pub fn base_flags(cluster: &Cluster, port: u16) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", cluster.admin_kubeconfig.display()),
        "--controllers=resourceclaim-controller".into(),
        "--leader-elect=false".into(),
        "--use-service-account-credentials=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", cluster.dir.join("kcm-certs").display()),
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into(),
        "--authentication-skip-lookup".into(),
    ]
}

fn flags(cluster: &Cluster, port: u16, gates: &str) -> Vec<String> {
    let mut flags = base_flags(cluster, port);
    if !gates.is_empty() {
        flags.push(format!("--feature-gates={gates}"));
    }
    flags.extend([
        // Same budget as ours in the e2e harness, so neither waits on its
        // client rate limiter.
        "--kube-api-qps=500".into(),
        "--kube-api-burst=1000".into(),
        // Decisions of the controller (claim created, reservation removed…).
        "--v=5".into(),
    ]);
    flags
}

/// Waits until a Kubernetes component's secure port answers `/healthz`
/// with `ok` (self-signed certificate, health paths open).
pub async fn wait_healthy(proc: &Proc, port: u16) -> anyhow::Result<()> {
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse()?);
    // The secure port serves a self-signed certificate.
    config.accept_invalid_certs = true;
    let client = kube::Client::try_from(config)?;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = proc.exited() {
            bail!("{} exited ({status}):\n{}", proc.name, proc.log_tail(30));
        }
        let req = http::Request::get("/healthz").body(Vec::new())?;
        if client
            .request_text(req)
            .await
            .is_ok_and(|b| b.trim() == "ok")
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} /healthz not ok after {READY_TIMEOUT:?}:\n{}",
                proc.name,
                proc.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A test with kube-controller-manager running `controllers` (with `extra`
/// flags) on its own API server started with `apiserver`, and none of
/// ours; `prepare` runs before kube-controller-manager starts (objects its
/// first lists must hold). `None` after one `SKIP:` line when a binary is
/// missing.
pub async fn isolated_with_reference(
    name: &'static str,
    apiserver: &crate::cluster::ApiserverOptions,
    controllers: &[&str],
    extra: &[String],
    prepare: impl AsyncFnOnce(&crate::ctx::TestCtx),
) -> Option<(crate::ctx::TestCtx, Reference)> {
    let kcm = binary_or_skip(name)?;
    let mut t = crate::ctx::TestCtx::isolated_with(
        name,
        crate::cluster::ControllerOpts::default(),
        0,
        apiserver,
    )
    .await?;
    prepare(&t).await;
    let reference =
        Reference::start_controllers_with(&kcm, &t.isolated_env().cluster, controllers, extra)
            .await
            .expect("start kube-controller-manager");
    Some((t, reference))
}
