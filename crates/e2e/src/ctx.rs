//! Per-test context: the admin client, the test's own namespace and the
//! environment it runs in.
//!
//! Most scenarios share one API server and one controller per test binary
//! (started on first use, restarted like a Deployment's pod if it exits on
//! its own, killed when the binary exits) and isolate themselves by
//! namespace. Scenarios that need a process-wide setting
//! (feature gates) or kill the controller get an isolated server of their own.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::cluster::{self, Cluster, Controller, ControllerOpts, ControllerSpec};
use crate::procs;
use crate::replica::Replica;

/// The server and controller shared by the tests of this binary.
#[derive(Debug)]
pub struct Shared {
    pub cluster: Cluster,
    pub controller: Arc<Replica>,
}

fn shared_env(bins: &cluster::Binaries) -> Result<&'static Shared, String> {
    static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let bins = bins.clone();
            start_detached("shared e2e environment", async move {
                let mut cluster = Cluster::start(&bins).await.map_err(|e| format!("{e:#}"))?;
                cluster.keep_dir();
                // Never reaped before exit, so their pids stay ours. The
                // controller (restarted by its supervisor, so its pid
                // changes) is left to PR_SET_PDEATHSIG.
                let keep = std::env::var(cluster::KEEP_ENV).is_ok_and(|v| v == "1");
                let dirs = if keep {
                    vec![]
                } else {
                    vec![cluster.dir.clone()]
                };
                procs::cleanup_on_exit(&[cluster.apiserver.pid(), cluster.etcd.pid()], &dirs);
                let spec = ControllerSpec::new(&cluster, &ControllerOpts::default(), "shared");
                let controller = Replica::start(spec).await.map_err(|e| format!("{e:#}"))?;
                Ok(Shared {
                    cluster,
                    controller,
                })
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs `start` on a thread with a runtime of its own, for servers shared by
/// the tests of a binary: the runtime of the test that happens to ask first
/// ends with that test, the servers must not.
pub fn start_detached<T: Send + 'static>(
    what: &'static str,
    start: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
) -> Result<T, String> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(start)
    })
    .join()
    .unwrap_or_else(|_| Err(format!("{what} setup panicked")))
}

/// A server and controllers owned by one test. Field order is drop order:
/// controllers stop before the API server.
#[derive(Debug)]
pub struct Isolated {
    pub controllers: Vec<Arc<Replica>>,
    pub cluster: Cluster,
    pub opts: ControllerOpts,
    started: usize,
}

impl Drop for Isolated {
    fn drop(&mut self) {
        // Stop for good first, so no supervisor restarts a replica while
        // the API server goes away.
        for r in &self.controllers {
            r.kill();
        }
    }
}

#[derive(Debug)]
enum Env {
    Shared(&'static Shared),
    Isolated(Box<Isolated>),
}

pub struct TestCtx {
    pub name: &'static str,
    pub client: kube::Client,
    /// The namespace this test owns.
    pub ns: String,
    env: Env,
    finished: bool,
    started: Instant,
    /// Supervisor restarts of the shared controller when the test began.
    restarts_at_start: usize,
}

fn skip(name: &str) {
    cluster::skip_without_apiserver(name);
}

fn namespace_for(name: &str) -> String {
    let mut ns: String = format!("e2e-{}", name.replace('_', "-"))
        .chars()
        .take(63)
        .collect();
    while ns.ends_with('-') {
        ns.pop();
    }
    ns
}

impl TestCtx {
    /// Context on the shared server; `None` (after printing the SKIP line)
    /// when the binaries are absent.
    pub async fn shared(name: &'static str) -> Option<Self> {
        let Some(bins) = cluster::binaries() else {
            skip(name);
            return None;
        };
        let shared = tokio::task::spawn_blocking(move || shared_env(&bins))
            .await
            .expect("join shared setup")
            .unwrap_or_else(|e| panic!("{name}: shared e2e environment failed to start: {e}"));
        let client = shared
            .cluster
            .admin_client()
            .await
            .expect("admin client for the shared server");
        Some(Self::new(name, client, Env::Shared(shared)).await)
    }

    /// Context on a server of its own with `controllers` controller processes.
    pub async fn isolated(
        name: &'static str,
        opts: ControllerOpts,
        controllers: usize,
    ) -> Option<Self> {
        Self::isolated_with(
            name,
            opts,
            controllers,
            &cluster::ApiserverOptions::default(),
        )
        .await
    }

    /// [`TestCtx::isolated`] with an API server started with `apiserver`.
    pub async fn isolated_with(
        name: &'static str,
        opts: ControllerOpts,
        controllers: usize,
        apiserver: &cluster::ApiserverOptions,
    ) -> Option<Self> {
        let Some(bins) = cluster::binaries() else {
            skip(name);
            return None;
        };
        let cluster = Cluster::start_with(&bins, apiserver)
            .await
            .unwrap_or_else(|e| panic!("{name}: API server failed to start: {e:#}"));
        let client = cluster.admin_client().await.expect("admin client");
        let mut iso = Box::new(Isolated {
            controllers: Vec::new(),
            cluster,
            opts,
            started: 0,
        });
        for _ in 0..controllers {
            iso.start_controller()
                .await
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        }
        Some(Self::new(name, client, Env::Isolated(iso)).await)
    }

    async fn new(name: &'static str, client: kube::Client, env: Env) -> Self {
        let ns = namespace_for(name);
        let namespaces: Api<Namespace> = Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: create namespace {ns}: {e}"));
        let mut ctx = Self {
            name,
            client,
            ns,
            env,
            finished: false,
            started: Instant::now(),
            restarts_at_start: 0,
        };
        ctx.restarts_at_start = ctx.restarts();
        ctx
    }

    /// Marks the test as run against a real server (CI counts these lines).
    ///
    /// Also checks the safety net of the allocator: no live controller may
    /// report a device allocated to two claims, in any test.
    pub fn finish(mut self) {
        self.finished = true;
        self.assert_no_double_allocation();
        self.assert_no_leaked_claims();
        let restarts = self.restarts() - self.restarts_at_start;
        let note = if restarts > 0 {
            format!(" (controller restarted {restarts} time(s) by its supervisor meanwhile)")
        } else {
            String::new()
        };
        eprintln!(
            "e2e: {} took {:.1}s{note}",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
        println!("E2E RAN: {}", self.name);
    }

    fn assert_no_double_allocation(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for replica in self.live_replicas() {
            let controller = replica.current();
            // A controller that does not answer (stopped by the test a moment
            // ago) has nothing to say here.
            let Ok(text) =
                tokio::task::block_in_place(|| handle.block_on(controller.metrics_text()))
            else {
                continue;
            };
            let doubles = crate::rawhttp::metric_value(
                &text,
                "dra_claim_controller_device_double_allocations",
                &[],
            );
            assert!(
                doubles.is_none_or(|n| n == 0.0),
                "{}: dra_claim_controller_device_double_allocations = {doubles:?}: a device is \
                 allocated to more than one claim",
                self.name
            );
        }
    }

    /// With a controller running: once it is quiet, no claim of a finished
    /// or replaced pod may remain (see `leaks`). Checked in the test's own
    /// namespace on the shared server, everywhere on an isolated one.
    fn assert_no_leaked_claims(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.live_replicas().is_empty() {
            return;
        }
        let scope = match &self.env {
            Env::Shared(_) => Some(self.ns.as_str()),
            Env::Isolated(_) => None,
        };
        let leaked = tokio::task::block_in_place(|| {
            handle.block_on(crate::leaks::wait_none_leaked(&self.client, scope))
        });
        assert!(
            leaked.is_empty(),
            "{}: {} claim(s) of finished or replaced pods still there {}s after the test: {:?}",
            self.name,
            leaked.len(),
            crate::leaks::QUIET_WITHIN.as_secs(),
            &leaked[..leaked.len().min(10)]
        );
    }

    fn replicas(&self) -> Vec<&Arc<Replica>> {
        match &self.env {
            Env::Shared(s) => vec![&s.controller],
            Env::Isolated(iso) => iso.controllers.iter().collect(),
        }
    }

    /// Supervisor restarts (unplanned exits) of this environment's controllers.
    pub fn restarts(&self) -> usize {
        self.replicas().iter().map(|r| r.restarts()).sum()
    }

    /// The replicas the test has not stopped (SIGKILLed or SIGTERMed for good).
    pub fn live_replicas(&self) -> Vec<Arc<Replica>> {
        self.replicas()
            .into_iter()
            .filter(|r| !r.is_stopped())
            .cloned()
            .collect()
    }

    /// The process of the shared controller, or of the first replica of an
    /// isolated server that the test has not stopped.
    pub fn controller(&self) -> Arc<Controller> {
        let replicas = self.replicas();
        replicas
            .iter()
            .find(|r| !r.is_stopped())
            .or(replicas.first())
            .expect("no controller started")
            .current()
    }

    /// Replica `i` of an isolated server (in start order).
    pub fn replica(&self, i: usize) -> Arc<Replica> {
        match &self.env {
            Env::Isolated(iso) => iso.controllers[i].clone(),
            Env::Shared(_) => panic!(
                "{}: stopping the shared controller would break other tests",
                self.name
            ),
        }
    }

    /// The isolated environment; panics on the shared one, whose processes
    /// other tests depend on.
    pub fn isolated_env(&mut self) -> &mut Isolated {
        match &mut self.env {
            Env::Isolated(iso) => iso,
            Env::Shared(_) => panic!("{}: needs an isolated environment", self.name),
        }
    }

    fn dump_logs(&self) {
        eprintln!("---- e2e {} failed (namespace {}) ----", self.name, self.ns);
        match &self.env {
            Env::Shared(s) => {
                let c = s.controller.current();
                let log = &c.proc.log;
                eprintln!(
                    "-- shared controller log ({}), lines naming {}:\n{}",
                    log.display(),
                    self.ns,
                    procs::grep(log, &self.ns, 60)
                );
                eprintln!(
                    "-- shared controller log, last lines:\n{}",
                    c.proc.log_tail(40)
                );
                eprintln!(
                    "-- shared controller restarts by its supervisor: {}",
                    s.controller.restarts()
                );
            }
            Env::Isolated(iso) => {
                for r in &iso.controllers {
                    let c = r.current();
                    eprintln!(
                        "-- {} log ({}){}, {} supervisor restart(s):\n{}",
                        c.proc.name,
                        c.proc.log.display(),
                        c.proc
                            .exited()
                            .map(|s| format!(", exited {s}"))
                            .unwrap_or_default(),
                        r.restarts(),
                        c.proc.log_tail(80)
                    );
                }
                eprintln!(
                    "-- kube-apiserver log, last lines:\n{}",
                    iso.cluster.apiserver.log_tail(15)
                );
            }
        }
    }
}

impl Drop for TestCtx {
    fn drop(&mut self) {
        if !self.finished && std::thread::panicking() {
            self.dump_logs();
        }
    }
}

impl Isolated {
    /// Starts one more controller process with this environment's options.
    pub async fn start_controller(&mut self) -> anyhow::Result<Arc<Replica>> {
        self.started += 1;
        let spec = ControllerSpec::new(&self.cluster, &self.opts, &self.started.to_string());
        let r = Replica::start(spec).await?;
        self.controllers.push(r.clone());
        Ok(r)
    }

    /// Like [`Isolated::start_controller`], but the process talks to the
    /// API server through `kubeconfig` (e.g. one pointing at a proxy).
    pub async fn start_controller_with_kubeconfig(
        &mut self,
        kubeconfig: &std::path::Path,
    ) -> anyhow::Result<Arc<Replica>> {
        self.started += 1;
        let spec = ControllerSpec {
            kubeconfig: kubeconfig.to_path_buf(),
            ..ControllerSpec::new(&self.cluster, &self.opts, &self.started.to_string())
        };
        let r = Replica::start(spec).await?;
        self.controllers.push(r.clone());
        Ok(r)
    }
}
