//! The controller under test as a separate process: this crate's binary
//! (started by the e2e harness) or kube-controller-manager running the
//! controllers of `--reference-controllers` (by default only its
//! resourceclaim-controller), both with the admin kubeconfig, the same QPS,
//! burst and worker count, and no leader election.

// Signals and PR_SET_PDEATHSIG go through libc: the only unsafe code of the
// project, in its test harness; the controller itself has none.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;

use crate::Args;
use crate::cluster::{
    ALL_CONTROLLER_GATES, Cluster, Controller, ControllerOpts, ControllerSpec, controller_binary,
    free_port,
};
use crate::procs::Proc;
use crate::rawhttp::metric_sum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// dra-claim-controller, this crate's binary.
    Ours,
    /// kube-controller-manager with `--controllers` from
    /// `--reference-controllers`.
    Reference,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Ours => "ours",
            Kind::Reference => "reference",
        })
    }
}

/// Says which binaries are compared, and warns when ours is not an
/// optimised build (numbers of a debug build say little).
pub fn describe_binaries(reference: Option<&Path>) {
    let ours = controller_binary().map_or_else(|e| e.to_string(), |p| p.display().to_string());
    println!("ours:      {ours}");
    if !ours.contains("/release/") {
        println!("           (not a release build: run through `cargo bench` for fair numbers)");
    }
    match reference {
        Some(path) => println!("reference: {}", path.display()),
        None => println!("reference: none"),
    }
}

enum Process {
    Ours(Controller),
    Reference {
        proc: Proc,
        /// Talks HTTPS to the self-signed secure port.
        client: kube::Client,
    },
}

/// A running controller under test.
pub struct UnderTest {
    kind: Kind,
    process: Process,
    /// kube-apiserver and etcd, whose CPU the controller's requests cost.
    server_pids: [u32; 2],
}

impl UnderTest {
    /// Starts the process and waits until its health endpoint answers.
    pub async fn start(
        kind: Kind,
        cluster: &Cluster,
        args: &Args,
        reference: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let process = match kind {
            Kind::Ours => Process::Ours(start_ours(cluster, args).await?),
            Kind::Reference => {
                let binary = reference.context("no kube-controller-manager")?;
                start_reference(&binary, cluster, args).await?
            }
        };
        Ok(Self {
            kind,
            process,
            server_pids: [cluster.apiserver.pid(), cluster.etcd.pid()],
        })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn pid(&self) -> u32 {
        self.proc().pid()
    }

    pub fn server_pids(&self) -> [u32; 2] {
        self.server_pids
    }

    pub fn log(&self) -> &Path {
        &self.proc().log
    }

    fn proc(&self) -> &Proc {
        match &self.process {
            Process::Ours(c) => &c.proc,
            Process::Reference { proc, .. } => proc,
        }
    }

    /// The Prometheus text of the process's /metrics.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        match &self.process {
            Process::Ours(c) => c.metrics_text().await,
            Process::Reference { client, .. } => get_text(client, "/metrics").await,
        }
    }

    /// Waits until the process has sent no request for 3 s (at most 30 s),
    /// so trailing work of a phase is charged to that phase.
    pub async fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = (f64::NAN, Instant::now());
        while Instant::now() < deadline {
            let total = self
                .metrics()
                .await
                .map(|m| metric_sum(&m, "rest_client_requests_total"));
            match total {
                Ok(t) if t == last.0 => {
                    if last.1.elapsed() >= Duration::from_secs(3) {
                        return;
                    }
                }
                Ok(t) => last = (t, Instant::now()),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// SIGKILL: nothing of the shutdown path is measured.
    pub fn stop(&self) {
        self.proc().kill();
    }
}

async fn start_ours(cluster: &Cluster, args: &Args) -> anyhow::Result<Controller> {
    let hostile = &args.scale.hostile;
    let (gates, extra_args) = split_feature_gates(&args.ours_args);
    let opts = ControllerOpts {
        feature_gates: std::iter::once(ALL_CONTROLLER_GATES.to_string())
            .chain(gates)
            .collect::<Vec<_>>()
            .join(","),
        leader_elect: hostile.leader_elect,
        // The production timings, so that renewal gaps read as they would
        // in a cluster.
        lease_timing: ["15s", "10s", "2s"],
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
        concurrent_syncs: args.concurrent_syncs,
        extra_args,
        run_under: hostile.run_under(),
        ..ControllerOpts::default()
    };
    let spec = ControllerSpec {
        // Like the reference: the admin identity, not the chart's RBAC.
        kubeconfig: cluster.admin_kubeconfig.clone(),
        ..ControllerSpec::new(cluster, &opts, "bench")
    };
    Controller::start(&spec).await
}

async fn start_reference(binary: &Path, cluster: &Cluster, args: &Args) -> anyhow::Result<Process> {
    let port = free_port();
    let flags = reference_flags(cluster, args, port);
    let log = cluster.dir.join("kube-controller-manager.log");
    let proc = Proc::spawn("kube-controller-manager", binary, &flags, &log)?;
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse()?);
    // The secure port serves a self-signed certificate.
    config.accept_invalid_certs = true;
    let client = kube::Client::try_from(config)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = proc.exited() {
            bail!(
                "kube-controller-manager exited ({status}):\n{}",
                proc.log_tail(30)
            );
        }
        if get_text(&client, "/healthz")
            .await
            .is_ok_and(|b| b.trim() == "ok")
        {
            return Ok(Process::Reference { proc, client });
        }
        if Instant::now() > deadline {
            bail!(
                "kube-controller-manager /healthz not ok after 60s:\n{}",
                proc.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The controllers of `--reference-controllers` with the same budget as
/// ours; the metrics and health paths need no authentication on loopback.
fn reference_flags(cluster: &Cluster, args: &Args, port: u16) -> Vec<String> {
    let mut flags = crate::reference::base_flags(cluster, port);
    for flag in &mut flags {
        if flag.starts_with("--controllers=") {
            *flag = format!("--controllers={}", args.reference_controllers);
        }
    }
    if !args.reference_feature_gates.is_empty() {
        flags.push(format!("--feature-gates={}", args.reference_feature_gates));
    }
    flags.extend([
        format!("--kube-api-qps={}", args.kube_api_qps),
        format!("--kube-api-burst={}", args.kube_api_burst),
        format!("--concurrent-resourceclaim-syncs={}", args.concurrent_syncs),
        "--v=1".into(),
    ]);
    flags
}

/// Takes the `--feature-gates` values (`--feature-gates=X` or
/// `--feature-gates X`) out of ours' further flags. The binary keeps only
/// the last `--feature-gates`, so passed on as they are they would drop the
/// gates the harness sets; joined after those instead, they add to them, and
/// a gate named in both takes the later value.
fn split_feature_gates(ours_args: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut gates, mut rest) = (Vec::new(), Vec::new());
    let mut iter = ours_args.iter();
    while let Some(arg) = iter.next() {
        if let Some(value) = arg.strip_prefix("--feature-gates=") {
            gates.push(value.to_string());
        } else if arg == "--feature-gates" {
            match iter.next() {
                Some(value) => gates.push(value.clone()),
                // Left for the binary to refuse.
                None => rest.push(arg.clone()),
            }
        } else {
            rest.push(arg.clone());
        }
    }
    (gates, rest)
}

async fn get_text(client: &kube::Client, path: &str) -> anyhow::Result<String> {
    let req = http::Request::get(path).body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

/// CPU seconds (user + system, all threads) and peak RSS of a process.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ProcStats {
    pub cpu_s: f64,
    pub peak_rss_mib: f64,
}

pub fn proc_stats(pid: u32) -> anyhow::Result<ProcStats> {
    Ok(ProcStats {
        cpu_s: cpu_seconds(pid)?,
        peak_rss_mib: peak_rss_kib(pid)? as f64 / 1024.0,
    })
}

/// utime + stime from /proc/<pid>/stat, in clock ticks turned into seconds.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; fields are counted after its ')'.
    let (_, rest) = stat
        .rsplit_once(')')
        .context("malformed /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of proc(5); `rest` starts at field 3.
    let ticks: u64 = fields.get(11).context("no utime")?.parse::<u64>()?
        + fields.get(12).context("no stime")?.parse::<u64>()?;
    Ok(ticks as f64 / clock_ticks())
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// VmHWM ("high water mark" of the resident set) from /proc/<pid>/status.
fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .context("no VmHWM in /proc/<pid>/status")?;
    Ok(line.trim().trim_end_matches("kB").trim().parse()?)
}

/// The machine's 1-minute load average (0 when unreadable).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}
