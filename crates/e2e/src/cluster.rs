//! A real etcd + kube-apiserver on loopback ports, and controller processes
//! talking to it with a ServiceAccount token of their own.
//!
//! Binaries are found like controller-runtime's envtest finds them: the
//! directory in `KUBEBUILDER_ASSETS`, else `/usr/local/kubebuilder/bin`.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

use crate::procs::Proc;
use crate::{pki, rawhttp, rbac};

pub const DEFAULT_ASSETS: &str = "/usr/local/kubebuilder/bin";
pub const SKIP_REASON: &str = "no kube-apiserver/etcd (set KUBEBUILDER_ASSETS)";

/// `DRA_E2E_REQUIRED=1`: a machine that has the binaries insists on them.
/// A test that would skip for lack of kube-apiserver or etcd fails instead
/// (`.ci/run` sets it where they are installed). Optional pieces
/// (kube-scheduler, kubelet, cluster-autoscaler, Prometheus) still skip.
pub const REQUIRED_ENV: &str = "DRA_E2E_REQUIRED";

/// Prints the SKIP line of test `name` for lack of kube-apiserver/etcd, or
/// fails the test when [`REQUIRED_ENV`] says they must be there.
pub fn skip_without_apiserver(name: &str) {
    let required = std::env::var(REQUIRED_ENV).is_ok_and(|v| v == "1");
    assert!(
        !required,
        "{name}: {SKIP_REASON}, and {REQUIRED_ENV}=1 says the e2e suite must run"
    );
    println!("SKIP: {name}: {SKIP_REASON}");
}
/// Keep the temporary directories (logs, etcd data) of isolated servers.
pub const KEEP_ENV: &str = "DRA_E2E_KEEP";
/// Overrides the API server's `--feature-gates`.
pub const APISERVER_GATES_ENV: &str = "DRA_E2E_APISERVER_FEATURE_GATES";
/// The DRA gates the API server needs so tests can write adminAccess,
/// firstAvailable and extendedResourceClaimStatus.
pub const APISERVER_GATES: &str =
    "DRAAdminAccess=true,DRAPrioritizedList=true,DRAExtendedResource=true";
pub const ALL_CONTROLLER_GATES: &str =
    "DRAAdminAccess=true,DRAPrioritizedList=true,DRAExtendedResource=true";

const READY_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub apiserver: PathBuf,
}

/// `None` when either binary is missing: the tests skip.
pub fn binaries() -> Option<Binaries> {
    let dir = std::env::var_os("KUBEBUILDER_ASSETS")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ASSETS));
    let bins = Binaries {
        etcd: dir.join("etcd"),
        apiserver: dir.join("kube-apiserver"),
    };
    (is_executable(&bins.etcd) && is_executable(&bins.apiserver)).then_some(bins)
}

/// Another Kubernetes binary (kube-controller-manager, kube-scheduler) in
/// the directory of `kube-apiserver`, built from the same tree, if there.
pub fn beside_apiserver(bins: &Binaries, name: &str) -> Option<PathBuf> {
    let path = bins.apiserver.with_file_name(name);
    is_executable(&path).then_some(path)
}

/// The binary `binary` beside `kube-apiserver` for the test `name`, or one
/// `SKIP:` line (no API server, or `skip_reason` for that binary).
pub fn beside_apiserver_or_skip(name: &str, binary: &str, skip_reason: &str) -> Option<PathBuf> {
    let Some(bins) = binaries() else {
        skip_without_apiserver(name);
        return None;
    };
    let found = beside_apiserver(&bins, binary);
    if found.is_none() {
        println!("SKIP: {name}: {skip_reason}");
    }
    found
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A loopback port nobody in this process was handed before. Another
/// process can still take it before we bind; starts retry for that.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind an ephemeral loopback port");
        let mut seen = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if seen.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}

/// A kube client from a kubeconfig file. Build one per test: a client is
/// tied to the tokio runtime it was made on.
pub async fn client_from(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// Writes a kubeconfig that reaches `url` with a bearer token.
pub fn write_kubeconfig(
    path: &Path,
    url: &str,
    ca: &Path,
    user: &str,
    token: &str,
) -> anyhow::Result<()> {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {
            "server": url,
            "certificate-authority": ca,
        }}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    });
    std::fs::write(path, serde_yaml::to_string(&doc)?)?;
    Ok(())
}

/// etcd + kube-apiserver in one temporary directory. Field order is drop
/// order: the API server dies before etcd, the directory goes last.
#[derive(Debug)]
pub struct Cluster {
    pub apiserver: Proc,
    pub etcd: Proc,
    pub dir: PathBuf,
    pub admin_kubeconfig: PathBuf,
    pub controller_kubeconfig: PathBuf,
    tempdir: Option<tempfile::TempDir>,
}

/// What a test needs of its API server beyond the default: more feature
/// gates, more API versions (alpha APIs).
#[derive(Debug, Clone, Default)]
pub struct ApiserverOptions {
    /// Added to `--feature-gates` (e.g. `WorkloadResourceClaims=true`).
    pub feature_gates: Vec<String>,
    /// Added to `--runtime-config` (e.g. `scheduling.k8s.io/v1alpha2=true`).
    pub runtime_config: Vec<String>,
    /// Serve pods of a real node's pod network, as a cluster's API server
    /// does: listen on every address (reachable at the pod network's
    /// gateway, [`crate::pki::POD_GATEWAY_IP`], which the serving
    /// certificate names) and keep the ServiceAccount admission plugin, so
    /// that pods get their service account's token (kube-controller-manager
    /// must then run the service-account controllers).
    pub serve_pods: bool,
    /// Write an audit log of every list and watch request (at receipt) to
    /// [`Cluster::audit_log`], so that a test can count them.
    pub audit_list_watch: bool,
    /// API Priority and Fairness on (it is off otherwise, so that no test
    /// waits in its queues by chance), with this many seats: (read-only,
    /// mutating) in flight, split among the built-in priority levels.
    pub priority_and_fairness: Option<(u32, u32)>,
}

const AUDIT_LOG: &str = "audit.log";

/// The audit policy of [`ApiserverOptions::audit_list_watch`].
const LIST_WATCH_AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [ResponseStarted, ResponseComplete, Panic]
rules:
- level: Metadata
  verbs: [list, watch]
- level: None
";

impl Cluster {
    /// A kubeconfig for a new ServiceAccount `name` in
    /// [`rbac::SYSTEM_NAMESPACE`], bound to `cluster_role` when given (none:
    /// a user without rights).
    pub async fn service_account_kubeconfig(
        &self,
        name: &str,
        cluster_role: Option<&str>,
    ) -> anyhow::Result<PathBuf> {
        let admin = self.admin_client().await?;
        let token = rbac::service_account_with_role(&admin, name, cluster_role).await?;
        let path = self.dir.join(format!("{name}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.url()?,
            &self.ca_file(),
            &format!("system:serviceaccount:{}:{name}", rbac::SYSTEM_NAMESPACE),
            &token,
        )?;
        Ok(path)
    }

    pub async fn start(bins: &Binaries) -> anyhow::Result<Self> {
        Self::start_with(bins, &ApiserverOptions::default()).await
    }

    /// The audit log of [`ApiserverOptions::audit_list_watch`], one JSON
    /// event per line.
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join(AUDIT_LOG)
    }

    pub async fn start_with(bins: &Binaries, options: &ApiserverOptions) -> anyhow::Result<Self> {
        let started = Instant::now();
        let tempdir = tempfile::Builder::new().prefix("dra-e2e-").tempdir()?;
        let dir = tempdir.path().to_path_buf();
        let pki = pki::generate(&dir.join("pki"))?;
        let admin_token = format!("admin-{:032x}", rand::random::<u128>());
        let tokens = dir.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{admin_token},admin,admin-uid,\"system:masters\"\n"),
        )?;

        let (etcd, etcd_url) = start_etcd(bins, &dir).await?;
        let (apiserver, url, admin_kubeconfig) =
            start_apiserver(bins, &dir, &pki, &tokens, &etcd_url, &admin_token, options).await?;

        // The controller's own identity: chart RBAC, SA token, kubeconfig.
        let admin = client_from(&admin_kubeconfig).await?;
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": rbac::SYSTEM_NAMESPACE}}))?,
            )
            .await
            .context("create namespace dra-system")?;
        let rbac = tokio::task::spawn_blocking(rbac::controller_rbac).await?;
        rbac::apply(&admin, &rbac).await?;
        let token = rbac::service_account_token(&admin, &rbac.service_account).await?;
        let controller_kubeconfig = dir.join("controller.kubeconfig");
        write_kubeconfig(
            &controller_kubeconfig,
            &url,
            &pki.ca_crt,
            &format!(
                "system:serviceaccount:{}:{}",
                rbac::SYSTEM_NAMESPACE,
                rbac.service_account
            ),
            &token,
        )?;

        let startup = started.elapsed();
        eprintln!(
            "e2e: API server {url} ready in {:.1}s (dir {}, controller RBAC from {})",
            startup.as_secs_f64(),
            dir.display(),
            rbac.origin
        );
        Ok(Self {
            apiserver,
            etcd,
            dir,
            admin_kubeconfig,
            controller_kubeconfig,
            tempdir: Some(tempdir),
        })
    }

    /// Leaves the directory in place (the shared server cleans up at exit,
    /// and `DRA_E2E_KEEP=1` keeps it for inspection).
    pub fn keep_dir(&mut self) {
        if let Some(t) = self.tempdir.take() {
            let _ = t.keep();
        }
    }

    pub async fn admin_client(&self) -> anyhow::Result<kube::Client> {
        client_from(&self.admin_kubeconfig).await
    }

    /// The API server's URL, as the kubeconfigs name it.
    pub fn url(&self) -> anyhow::Result<String> {
        let port = self
            .apiserver
            .flag("--secure-port")
            .context("kube-apiserver started without --secure-port")?;
        Ok(format!("https://127.0.0.1:{port}"))
    }

    /// The CA that signed the API server's serving certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("pki").join("ca.crt")
    }

    /// SIGKILLs kube-apiserver, waits `downtime`, and starts it again with the
    /// same flags (same port, certificates and etcd), until /readyz says ok.
    /// Returns how long it was unavailable.
    pub async fn restart_apiserver(&mut self, downtime: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.apiserver.kill();
        tokio::time::sleep(downtime).await;
        self.apiserver = self.apiserver.spawn_again()?;
        self.wait_apiserver_ready().await?;
        Ok(started.elapsed())
    }

    /// Where etcd serves its clients.
    fn etcd_addr(&self) -> anyhow::Result<SocketAddr> {
        let url = self
            .etcd
            .flag("--listen-client-urls")
            .context("etcd started without --listen-client-urls")?;
        Ok(url.trim_start_matches("http://").parse()?)
    }

    /// The etcd server's version (`3.6.13`, say), from its `/version`.
    pub async fn etcd_version(&self) -> anyhow::Result<String> {
        let (code, body) = rawhttp::get(self.etcd_addr()?, "/version").await?;
        ensure!(code == 200, "etcd /version answered {code}: {body}");
        let version: serde_json::Value = serde_json::from_str(&body)?;
        version["etcdserver"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("no etcdserver in {body}"))
    }

    /// SIGKILLs etcd, waits `downtime`, and starts it again on the same ports
    /// and data directory; returns once the API server is ready again.
    pub async fn restart_etcd(&mut self, downtime: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let addr = self.etcd_addr()?;
        self.etcd.kill();
        tokio::time::sleep(downtime).await;
        self.etcd = self.etcd.spawn_again()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.etcd.exited() {
                bail!(
                    "etcd exited after restart ({status}):\n{}",
                    self.etcd.log_tail(20)
                );
            }
            if let Ok((200, body)) = rawhttp::get(addr, "/health").await
                && body.contains("true")
            {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd not healthy 30s after restart:\n{}",
                    self.etcd.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.wait_apiserver_ready().await?;
        Ok(started.elapsed())
    }

    /// Waits until the API server's /readyz says ok (which includes etcd).
    pub async fn wait_apiserver_ready(&self) -> anyhow::Result<()> {
        let client = self.admin_client().await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.apiserver.exited() {
                bail!(
                    "kube-apiserver exited ({status}):\n{}",
                    self.apiserver.log_tail(30)
                );
            }
            let req = http::Request::get("/readyz").body(Vec::new())?;
            let probe = match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready after {READY_TIMEOUT:?} (last /readyz: {probe}):\n{}",
                    self.apiserver.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::env::var(KEEP_ENV).is_ok_and(|v| v == "1") {
            self.keep_dir();
            eprintln!("e2e: kept {}", self.dir.display());
        }
    }
}

async fn start_etcd(bins: &Binaries, dir: &Path) -> anyhow::Result<(Proc, String)> {
    let mut last_err = anyhow!("etcd never started");
    for attempt in 0..3 {
        let (client_port, peer_port) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let data = dir.join(format!("etcd-data-{attempt}"));
        let args: Vec<String> = vec![
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // Test data is thrown away: durability buys nothing here.
            "--unsafe-no-fsync=true".into(),
            "--quota-backend-bytes=4294967296".into(),
            "--log-level=warn".into(),
        ];
        let etcd = Proc::spawn("etcd", &bins.etcd, &args, &dir.join("etcd.log"))?;
        let addr: SocketAddr = format!("127.0.0.1:{client_port}").parse()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = etcd.exited() {
                last_err = anyhow!("etcd exited ({status}):\n{}", etcd.log_tail(20));
                break;
            }
            if let Ok((200, body)) = rawhttp::get(addr, "/health").await
                && body.contains("true")
            {
                return Ok((etcd, client_url));
            }
            if Instant::now() > deadline {
                bail!("etcd not healthy after 30s:\n{}", etcd.log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Err(last_err)
}

async fn start_apiserver(
    bins: &Binaries,
    dir: &Path,
    pki: &pki::Pki,
    tokens: &Path,
    etcd_url: &str,
    admin_token: &str,
    options: &ApiserverOptions,
) -> anyhow::Result<(Proc, String, PathBuf)> {
    let gates = std::env::var(APISERVER_GATES_ENV).unwrap_or_else(|_| APISERVER_GATES.to_string());
    let gates = std::iter::once(gates)
        .chain(options.feature_gates.iter().cloned())
        .filter(|g| !g.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    let runtime_config = std::iter::once("resource.k8s.io/v1=true".to_string())
        .chain(options.runtime_config.iter().cloned())
        .collect::<Vec<_>>()
        .join(",");
    let mut last_err = anyhow!("kube-apiserver never started");
    for _ in 0..3 {
        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let cert_dir = dir.join("apiserver-certs");
        let p = |p: &Path| p.display().to_string();
        let mut args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            if options.serve_pods {
                "--bind-address=0.0.0.0".into()
            } else {
                "--bind-address=127.0.0.1".into()
            },
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", p(&cert_dir)),
            format!("--tls-cert-file={}", p(&pki.server_crt)),
            format!("--tls-private-key-file={}", p(&pki.server_key)),
            format!("--token-auth-file={}", p(tokens)),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p(&pki.sa_pub)),
            format!("--service-account-signing-key-file={}", p(&pki.sa_key)),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            format!("--runtime-config={runtime_config}"),
            // No kube-controller-manager runs, so no namespace ever gets its
            // "default" ServiceAccount; without this every pod is refused.
            if options.serve_pods {
                "--disable-admission-plugins=".into()
            } else {
                "--disable-admission-plugins=ServiceAccount".into()
            },
            // Nothing to reconcile the "kubernetes" Service endpoints for.
            "--endpoint-reconciler-type=none".into(),
            match options.priority_and_fairness {
                Some(_) => "--enable-priority-and-fairness=true".into(),
                None => "--enable-priority-and-fairness=false".into(),
            },
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        if !gates.is_empty() {
            args.push(format!("--feature-gates={gates}"));
        }
        if let Some((reads, writes)) = options.priority_and_fairness {
            args.push(format!("--max-requests-inflight={reads}"));
            args.push(format!("--max-mutating-requests-inflight={writes}"));
        }
        if options.audit_list_watch {
            let policy = dir.join("audit-policy.yaml");
            std::fs::write(&policy, LIST_WATCH_AUDIT_POLICY)?;
            args.push(format!("--audit-policy-file={}", p(&policy)));
            args.push(format!("--audit-log-path={}", p(&dir.join(AUDIT_LOG))));
            args.push("--audit-log-format=json".into());
        }
        let apiserver = Proc::spawn(
            "kube-apiserver",
            &bins.apiserver,
            &args,
            &dir.join("kube-apiserver.log"),
        )?;
        let kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(&kubeconfig, &url, &pki.ca_crt, "admin", admin_token)?;
        let client = client_from(&kubeconfig).await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_probe: String;
        loop {
            if let Some(status) = apiserver.exited() {
                last_err = anyhow!(
                    "kube-apiserver exited ({status}):\n{}",
                    apiserver.log_tail(30)
                );
                break;
            }
            let req = http::Request::get("/readyz").body(Vec::new())?;
            match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok((apiserver, url, kubeconfig)),
                Ok(body) => last_probe = body,
                Err(e) => last_probe = e.to_string(),
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready after {READY_TIMEOUT:?} (last /readyz: {last_probe}):\n{}",
                    apiserver.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Err(last_err)
}

/// The controller binary: the one cargo built for this test, or, for the
/// examples and benches that share this harness, the one beside them.
pub fn controller_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = option_env!("CARGO_BIN_EXE_dra-claim-controller") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .ancestors()
        .find(|d| d.join("dra-claim-controller").is_file())
        .ok_or_else(|| {
            anyhow!(
                "dra-claim-controller binary not found near {}: build it first",
                exe.display()
            )
        })?;
    Ok(profile_dir.join("dra-claim-controller"))
}

/// Flags of one controller process.
#[derive(Debug, Clone)]
pub struct ControllerOpts {
    pub feature_gates: String,
    pub leader_elect: bool,
    pub qps: u32,
    pub burst: u32,
    pub concurrent_syncs: u32,
    /// `--min-resync-period`; `None` leaves the controller's default.
    pub min_resync_period: Option<String>,
    /// Lease duration, renew deadline and retry period. Short by default,
    /// so hand-over tests are quick.
    pub lease_timing: [&'static str; 3],
    /// `--metrics-secure`: off by default, so that tests scrape plain
    /// HTTP; the tests of the secure port turn it on.
    pub metrics_secure: bool,
    /// Further flags, appended as given.
    pub extra_args: Vec<String>,
    /// A command the binary is started under, e.g. `taskset -c 0` to hold
    /// it to one CPU (the chart's limit) in a benchmark; empty: none.
    pub run_under: Vec<String>,
}

impl Default for ControllerOpts {
    fn default() -> Self {
        Self {
            feature_gates: ALL_CONTROLLER_GATES.into(),
            leader_elect: true,
            // Above the production default so that the batch scenarios do
            // not spend most of their time in the client rate limiter.
            qps: 500,
            burst: 1000,
            concurrent_syncs: 50,
            min_resync_period: None,
            lease_timing: ["4s", "3s", "1s"],
            metrics_secure: false,
            run_under: Vec::new(),
            extra_args: Vec::new(),
        }
    }
}

/// Everything needed to (re)start one controller process.
#[derive(Debug, Clone)]
pub struct ControllerSpec {
    pub kubeconfig: PathBuf,
    /// Where the log file goes.
    pub dir: PathBuf,
    pub opts: ControllerOpts,
    /// Names the log file `controller-<label>.log`.
    pub label: String,
}

impl ControllerSpec {
    pub fn new(cluster: &Cluster, opts: &ControllerOpts, label: &str) -> Self {
        Self {
            kubeconfig: cluster.controller_kubeconfig.clone(),
            dir: cluster.dir.clone(),
            opts: opts.clone(),
            label: label.to_string(),
        }
    }
}

/// One controller process: the real binary, run with the SA kubeconfig.
#[derive(Debug)]
pub struct Controller {
    pub proc: Proc,
    pub metrics: SocketAddr,
    pub health: SocketAddr,
}

impl Controller {
    /// Starts the binary and waits until /healthz answers 200.
    pub async fn start(spec: &ControllerSpec) -> anyhow::Result<Self> {
        let (opts, label) = (&spec.opts, spec.label.as_str());
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
        let health: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
        let mut args: Vec<String> = vec![
            "--kubeconfig".into(),
            spec.kubeconfig.display().to_string(),
            "--leader-elect-resource-namespace".into(),
            rbac::SYSTEM_NAMESPACE.into(),
            "--leader-elect-resource-name".into(),
            rbac::LEASE_NAME.into(),
            format!("--leader-elect={}", opts.leader_elect),
            "--leader-elect-lease-duration".into(),
            opts.lease_timing[0].into(),
            "--leader-elect-renew-deadline".into(),
            opts.lease_timing[1].into(),
            "--leader-elect-retry-period".into(),
            opts.lease_timing[2].into(),
            "--metrics-bind-address".into(),
            metrics.to_string(),
            format!("--metrics-secure={}", opts.metrics_secure),
            "--health-probe-bind-address".into(),
            health.to_string(),
            "--kube-api-qps".into(),
            opts.qps.to_string(),
            "--kube-api-burst".into(),
            opts.burst.to_string(),
            "--concurrent-syncs".into(),
            opts.concurrent_syncs.to_string(),
            "--feature-gates".into(),
            opts.feature_gates.clone(),
            "--shutdown-timeout".into(),
            "20s".into(),
            "--log-format".into(),
            "text".into(),
            "--log-level".into(),
            "info".into(),
        ];
        if let Some(period) = &opts.min_resync_period {
            args.extend(["--min-resync-period".into(), period.clone()]);
        }
        args.extend(opts.extra_args.iter().cloned());
        let log = spec.dir.join(format!("controller-{label}.log"));
        let mut binary = controller_binary()?;
        if let Some((wrapper, wrapper_args)) = opts.run_under.split_first() {
            let mut wrapped = wrapper_args.to_vec();
            wrapped.push(binary.display().to_string());
            wrapped.append(&mut args);
            args = wrapped;
            binary = PathBuf::from(wrapper);
        }
        // Plain text in the log file: no terminal colour codes.
        let env = [("NO_COLOR", "1")];
        let proc =
            Proc::spawn_with_env(&format!("controller-{label}"), &binary, &args, &env, &log)?;
        let controller = Self {
            proc,
            metrics,
            health,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = controller.proc.exited() {
                bail!(
                    "controller {label} exited ({status}) before /healthz answered; log {}:\n{}",
                    log.display(),
                    controller.proc.log_tail(40)
                );
            }
            if let Ok((200, _)) = rawhttp::get(health, "/healthz").await {
                return Ok(controller);
            }
            if Instant::now() > deadline {
                bail!(
                    "controller {label}: /healthz on {health} not 200 after 30s; log {}:\n{}",
                    log.display(),
                    controller.proc.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn metrics_text(&self) -> anyhow::Result<String> {
        let (status, body) = rawhttp::get(self.metrics, "/metrics").await?;
        anyhow::ensure!(status == 200, "GET /metrics: HTTP {status}: {body}");
        Ok(body)
    }

    pub async fn healthz(&self) -> anyhow::Result<u16> {
        Ok(rawhttp::get(self.health, "/healthz").await?.0)
    }
}

/// Whether kube-apiserver serves streaming lists on an etcd of this version:
/// it needs etcd's watch progress requests, fixed in 3.4.31 and 3.5.13
/// (the API server's `RequestWatchProgress` storage feature).
pub fn etcd_serves_progress_requests(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m >= 6,
        (m, _) => m > 3,
    }
}
