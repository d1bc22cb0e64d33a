//! The admin commands (`drain-check`, `audit`, `pools`, `check-release`,
//! `drain`, `uncordon`), shared by `dra-claim-controller` and the kubectl
//! plugin `kubectl-dra`: their flags, the one way they reach the API server
//! ([`connect`]) and the one way they print a report ([`emit`]); each
//! command's steps in a module of its own.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args as ClapArgs, Subcommand, ValueEnum};

use crate::drain::DEFAULT_FINISHED_GRACE;
use crate::pools::pools_table;
use crate::report::{AuditReport, DrainCheckReport, exit};
use dra_model::capacity::PoolCapacity;
use dra_runtime::client::{
    ClientOptions, ConnectionOverrides, DEFAULT_BURST, DEFAULT_QPS, build_client,
};
use dra_runtime::duration::FlagDuration;

mod audit;
mod check_release;
mod drain;
mod drain_check;
mod pools;
mod uncordon;

/// The admin commands: read-only but for `drain` and `uncordon`.
#[derive(Debug, Clone, Subcommand)]
pub enum Tool {
    /// Tell whether the DRA driver of a node can be removed: lists claims whose devices on the node are
    /// still in use (exit 1), claims that look wrong (exit 2), or none (exit 0); 3 when the check could
    /// not be completed. Read-only.
    DrainCheck(DrainCheckArgs),
    /// Find stale reservations, leaked allocations, orphaned generated claims and claims stuck deleting,
    /// in the whole cluster, a namespace or one node, with counts per node and driver (exit 0 none,
    /// 2 some, 3 incomplete). Read-only.
    Audit(AuditArgs),
    /// Check that an installed controller works: its pods are Ready, its Lease is held and renewed, its /metrics answers (exit 0; 1 when a check fails; 3 when the checks could not be made). The chart's `helm test` runs it.
    CheckRelease(CheckReleaseArgs),
    /// Take a node's devices (of one driver, or all) out of service before driver maintenance, as kubectl drain
    /// does for a node: DeviceTaintRules cordon them (NoSchedule), then taint them NoExecute so that the
    /// device-taint eviction controller evicts the pods using them (PodDisruptionBudgets respected), then wait
    /// until drain-check finds the node clean (its exit code; past --timeout, what still holds it). --dry-run
    /// only previews what would be evicted. Run again, it resumes. `uncordon` undoes it.
    Drain(DrainArgs),
    /// Remove the DeviceTaintRules `drain` made for a node: its devices serve pods again.
    Uncordon(UncordonArgs),
    /// Every DRA pool's devices: total, allocated, held by admin access, unavailable (tainted NoSchedule or
    /// NoExecute by its slice or a DeviceTaintRule), free. Read-only; the controller exports the same numbers
    /// as dra_claim_controller_pool_devices.
    Pools(PoolsArgs),
}

#[derive(Debug, Clone, ClapArgs)]
pub struct PoolsArgs {
    /// Only pools of this driver.
    #[arg(long)]
    pub driver: Option<String>,
    /// Only the pool on this node.
    #[arg(long)]
    pub node: Option<String>,
    /// table, json or yaml.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, ClapArgs)]
pub struct DrainArgs {
    /// The node whose devices are to be drained.
    #[arg(value_name = "NODE")]
    pub node: String,
    /// Only the devices of this driver (e.g. gpu.example.com).
    #[arg(long)]
    pub driver: Option<String>,
    /// Only say what would be evicted: the rules are made with the None effect (evicting nobody), their previews printed, and the rules this run made removed again.
    #[arg(long, alias = "preview")]
    pub dry_run: bool,
    /// Delete the pods instead of evicting them through the Eviction API, bypassing PodDisruptionBudgets (kubectl drain's flag). By default the rules ask the device-taint eviction controller for evictions that budgets hold.
    #[arg(long)]
    pub disable_eviction: bool,
    /// Seconds each pod is given to terminate (kubectl drain's flag); negative, or not given: the pod's own terminationGracePeriodSeconds.
    #[arg(long, allow_hyphen_values = true)]
    pub grace_period: Option<i64>,
    /// Only evict the pods this label selector selects (kubectl drain's flag): the devices of the others stay cordoned, their pods running; drain ends once no selected pod uses the node's devices. Run again without it to drain the rest.
    #[arg(long)]
    pub pod_selector: Option<String>,
    /// How long to wait for the preview's figures.
    #[arg(long, default_value = "30s")]
    pub preview_timeout: FlagDuration,
    /// How long to wait for the node to be clean; past it, the exit code says what still blocks.
    #[arg(long, default_value = "10m")]
    pub timeout: FlagDuration,
    /// Pause between checks.
    #[arg(long, default_value = "5s")]
    pub interval: FlagDuration,
    /// A pod on the node whose containers finished less than this ago still blocks.
    #[arg(long, default_value_t = FlagDuration(DEFAULT_FINISHED_GRACE))]
    pub finished_grace: FlagDuration,
    /// The final drain-check report's format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, ClapArgs)]
pub struct UncordonArgs {
    /// The node whose drain rules to remove.
    #[arg(value_name = "NODE")]
    pub node: String,
    /// Only the rules of this driver's devices.
    #[arg(long)]
    pub driver: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, ClapArgs)]
pub struct CheckReleaseArgs {
    /// Namespace of the release (default: the kubeconfig context's, in a pod its service account's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Label selector of the controller's pods.
    #[arg(long, default_value = "app.kubernetes.io/name=dra-claim-controller")]
    pub selector: String,
    /// Name of the controller's Lease.
    #[arg(long, default_value = dra_runtime::leader::DEFAULT_LEASE_NAME)]
    pub lease: String,
    /// URL of the controller's /metrics, e.g. https://dra-claim-controller-metrics.dra-system.svc:8080/metrics (empty: not checked). Its certificate is not verified: the check is whether it answers.
    #[arg(long, default_value = "")]
    pub metrics_url: String,
    /// Bearer token for /metrics, from this file when it exists (default: the pod's service account token).
    #[arg(
        long,
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    pub token_file: PathBuf,
    #[command(flatten)]
    pub connection: Connection,
}

/// How to reach the API server: kubectl's connection flags.
#[derive(Debug, Clone, ClapArgs)]
pub struct Connection {
    /// Kubeconfig file. Default: $KUBECONFIG or ~/.kube/config, else the in-cluster service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use instead of the current one.
    #[arg(long)]
    pub context: Option<String>,
    /// Kubeconfig cluster to use.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Kubeconfig user to use.
    #[arg(long)]
    pub user: Option<String>,
    /// Address of the API server, instead of the kubeconfig's.
    #[arg(short = 's', long)]
    pub server: Option<String>,
    /// Bearer token to authenticate with.
    #[arg(long)]
    pub token: Option<String>,
    /// User to impersonate.
    #[arg(long = "as")]
    pub impersonate: Option<String>,
    /// Group to impersonate (repeat for several).
    #[arg(long = "as-group")]
    pub impersonate_groups: Vec<String>,
    /// Do not check the API server's certificate (insecure).
    #[arg(long)]
    pub insecure_skip_tls_verify: bool,
    /// How long the reads of one check may take (Go duration; 0 = no bound).
    #[arg(long, default_value = "0")]
    pub request_timeout: FlagDuration,
    /// Sustained requests per second to the API server.
    #[arg(long, default_value_t = DEFAULT_QPS)]
    pub kube_api_qps: f32,
    /// Requests that may be sent back to back before the QPS pacing applies.
    #[arg(long, default_value_t = DEFAULT_BURST)]
    pub kube_api_burst: u32,
}

/// `-o`, as kubectl takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    /// The table with the consumers' nodes and UIDs.
    Wide,
    Json,
    Yaml,
    /// `resourceclaim.resource.k8s.io/<name>` of each claim found.
    Name,
}

#[derive(Debug, Clone, ClapArgs)]
pub struct DrainCheckArgs {
    /// The node whose driver is to go (as kubectl drain takes it). Every namespace is checked: a node's devices serve pods of any namespace.
    #[arg(value_name = "NODE", required_unless_present = "node")]
    pub node_name: Option<String>,
    /// The node, as a flag (the same as NODE).
    #[arg(long, conflicts_with = "node_name")]
    pub node: Option<String>,
    /// Only claims with devices of this driver (e.g. gpu.example.com).
    #[arg(long)]
    pub driver: Option<String>,
    /// Re-check until the node is clean (without --strict: until nothing blocks and the warnings have not changed for 30s) or this long has passed (e.g. 10m); the exit code is the last check's.
    #[arg(long)]
    pub wait: Option<FlagDuration>,
    /// Pause between checks with --wait (at least 1s).
    #[arg(long, default_value = "5s")]
    pub interval: FlagDuration,
    /// Treat warnings as blocking (exit 1 instead of 2); with --wait, wait for them to clear too.
    #[arg(long)]
    pub strict: bool,
    /// A pod on the node whose containers finished less than this ago still blocks: the kubelet unprepares devices while cleaning the pod up.
    #[arg(long, default_value_t = FlagDuration(DEFAULT_FINISHED_GRACE))]
    pub finished_grace: FlagDuration,
    /// Only pods this label selector selects block (kubectl drain's flag); the others are listed as kept.
    #[arg(long)]
    pub pod_selector: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, ClapArgs)]
pub struct AuditArgs {
    /// Only claims that matter to this node (devices on it, or pods bound to it).
    #[arg(long)]
    pub node: Option<String>,
    /// Only this namespace (default: the kubeconfig context's namespace, as kubectl).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(flatten)]
    pub connection: Connection,
}

/// Runs a command; the exit code says what it found.
pub async fn run(tool: Tool) -> ExitCode {
    let code = match tool {
        Tool::DrainCheck(args) => drain_check::run(args).await,
        Tool::Audit(args) => audit::run(args).await,
        Tool::CheckRelease(args) => check_release::run(args).await,
        Tool::Drain(args) => drain::run(args).await,
        Tool::Uncordon(args) => uncordon::run(args).await,
        Tool::Pools(args) => pools::run(args).await,
    };
    ExitCode::from(code)
}

impl DrainCheckArgs {
    /// The node, given as NODE or with --node.
    pub fn node(&self) -> &str {
        self.node_name
            .as_deref()
            .or(self.node.as_deref())
            .unwrap_or_default()
    }
}

/// The namespace an audit covers: `-n`, every one with `-A`, else the
/// context's (`default` where it names none), as kubectl does.
pub(crate) fn audit_namespace(args: &AuditArgs, context_namespace: &str) -> Option<String> {
    if args.all_namespaces {
        None
    } else {
        Some(
            args.namespace
                .clone()
                .unwrap_or_else(|| context_namespace.to_string()),
        )
    }
}

/// The client of every command, from kubectl's connection flags: the
/// kubeconfig, context and overrides, and `--kube-api-qps` and
/// `--kube-api-burst`, which every command honours alike (the User-Agent
/// and the retry policy are the runtime's, as for the controller). When it
/// cannot be built (no kubeconfig, an unknown context…), says why and gives
/// the exit code of a command that could not be completed.
///
/// `--request-timeout` is not the client's: it bounds the reads of one
/// check ([`within`]), which `drain-check` and `audit` make; the commands
/// that write or only list (`drain`, `uncordon`, `pools`, `check-release`)
/// are not bounded by it.
pub(crate) async fn connect(connection: &Connection) -> Result<kube::Client, u8> {
    let options = ClientOptions {
        qps: connection.kube_api_qps,
        burst: connection.kube_api_burst,
        kubeconfig: connection.kubeconfig.clone(),
        context: connection.context.clone(),
        overrides: ConnectionOverrides {
            cluster: connection.cluster.clone(),
            user: connection.user.clone(),
            server: connection.server.clone(),
            token: connection.token.clone(),
            impersonate: connection.impersonate.clone(),
            impersonate_groups: connection.impersonate_groups.clone(),
            insecure_skip_tls_verify: connection.insecure_skip_tls_verify,
        },
    };
    // A registry of its own: the client registers its request metrics in
    // it, and no command serves them. A command ends with its last request,
    // so the client's drain handle is not needed.
    match build_client(&options, &prometheus::Registry::new()).await {
        Ok((client, _drain)) => Ok(client),
        Err(e) => {
            eprintln!("error: {e:#}");
            Err(exit::INCOMPLETE)
        }
    }
}

/// `read`, bounded by `--request-timeout` (0: unbounded); a read that takes
/// longer is what the error says.
pub(crate) async fn within<T>(
    bound: &FlagDuration,
    read: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    if bound.0.is_zero() {
        return Ok(read.await);
    }
    tokio::time::timeout(bound.0, read)
        .await
        .map_err(|_| format!("the reads took longer than --request-timeout={bound}"))
}

/// A report as `-o` prints it: a document for scripts (`json`, `yaml`), or
/// text for people (`table`, `wide`, `name`).
pub(crate) trait Render: serde::Serialize {
    /// The text of `-o table`, `-o wide` and `-o name` ([`emit`] asks for
    /// no other).
    fn text(&self, output: Output) -> String;
}

/// Writes `report` on stdout as `-o` asks: every report of every command
/// goes out here. A document that cannot be serialized is said on stderr
/// instead; the exit code stays the command's.
pub(crate) fn emit(report: &impl Render, output: Output) {
    match output {
        Output::Json => match serde_json::to_string_pretty(report) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("error: cannot write the report as JSON: {e}"),
        },
        Output::Yaml => match serde_saphyr::to_string(report) {
            Ok(text) => print!("{text}"),
            Err(e) => eprintln!("error: cannot write the report as YAML: {e}"),
        },
        Output::Table | Output::Wide | Output::Name => print!("{}", report.text(output)),
    }
}

impl Render for DrainCheckReport {
    fn text(&self, output: Output) -> String {
        match output {
            Output::Wide => self.wide_table(),
            Output::Name => one_a_line(&self.names()),
            Output::Table | Output::Json | Output::Yaml => self.table(),
        }
    }
}

impl Render for AuditReport {
    fn text(&self, output: Output) -> String {
        match output {
            Output::Wide => self.wide_table(),
            Output::Name => one_a_line(&self.names()),
            Output::Table | Output::Json | Output::Yaml => self.table(),
        }
    }
}

/// `pools` has no wider table and names no object: every text is the table.
impl Render for Vec<PoolCapacity> {
    fn text(&self, _: Output) -> String {
        pools_table(self)
    }
}

/// Names one a line, as `kubectl get -o name` prints them.
fn one_a_line(names: &[String]) -> String {
    let mut out = String::new();
    for name in names {
        out.push_str(name);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::time::Duration;

    #[derive(Parser)]
    struct Plugin {
        #[command(subcommand)]
        tool: Tool,
    }

    fn parse(argv: &[&str]) -> Result<Tool, clap::Error> {
        Plugin::try_parse_from(std::iter::once("kubectl-dra").chain(argv.iter().copied()))
            .map(|p| p.tool)
    }

    fn drain(argv: &[&str]) -> DrainCheckArgs {
        match parse(argv).unwrap() {
            Tool::DrainCheck(args) => args,
            other => panic!("{other:?}"),
        }
    }

    fn audit(argv: &[&str]) -> AuditArgs {
        match parse(argv).unwrap() {
            Tool::Audit(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_node_is_an_argument_as_for_kubectl_drain() {
        assert_eq!(drain(&["drain-check", "gpu-3"]).node(), "gpu-3");
        assert_eq!(drain(&["drain-check", "--node", "gpu-3"]).node(), "gpu-3");
        assert!(parse(&["drain-check"]).is_err(), "a node is required");
        assert!(parse(&["drain-check", "a", "--node", "b"]).is_err());
    }

    #[test]
    fn namespaces_follow_kubectl() {
        let rows: [(&[&str], Option<&str>); 3] = [
            (&["audit"], Some("team-a")),
            (&["audit", "-n", "other"], Some("other")),
            (&["audit", "-A"], None),
        ];
        for (argv, want) in rows {
            assert_eq!(
                audit_namespace(&audit(argv), "team-a").as_deref(),
                want,
                "{argv:?}"
            );
        }
        assert!(parse(&["audit", "-A", "-n", "x"]).is_err());
    }

    #[test]
    fn outputs_and_connection_flags() {
        for (flag, want) in [
            ("table", Output::Table),
            ("wide", Output::Wide),
            ("json", Output::Json),
            ("yaml", Output::Yaml),
            ("name", Output::Name),
        ] {
            assert_eq!(drain(&["drain-check", "n", "-o", flag]).output, want);
            assert_eq!(audit(&["audit", "-o", flag]).output, want);
        }
        let args = drain(&[
            "drain-check",
            "n",
            "--cluster=c",
            "--user=u",
            "-s",
            "https://api:6443",
            "--token=t",
            "--as=alice",
            "--as-group=ops",
            "--as-group=sre",
            "--insecure-skip-tls-verify",
            "--request-timeout=5s",
        ]);
        let c = &args.connection;
        assert_eq!(
            (c.cluster.as_deref(), c.user.as_deref(), c.server.as_deref()),
            (Some("c"), Some("u"), Some("https://api:6443"))
        );
        assert_eq!(c.impersonate.as_deref(), Some("alice"));
        assert_eq!(c.impersonate_groups, ["ops", "sre"]);
        assert!(c.insecure_skip_tls_verify);
        assert_eq!(c.request_timeout.0, Duration::from_secs(5));
    }
}
