//! The `drain-check` and `audit` commands, shared by `dra-claim-controller`
//! and the kubectl plugin `kubectl-dra`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, Subcommand, ValueEnum};
use k8s_openapi::jiff::Timestamp;

use super::audit::audit;
use super::drain::{DEFAULT_FINISHED_GRACE, DrainScope, check, unknown_target};
use super::read::{ReadError, Reader};
use super::report::{AuditScope, DrainCheckReport, Finding, exit};
use crate::cli::FlagDuration;
use crate::runtime::client::{ClientOptions, DEFAULT_BURST, DEFAULT_QPS, build_client};

/// The read-only commands.
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
}

/// How to reach the API server.
#[derive(Debug, Clone, ClapArgs)]
pub struct Connection {
    /// Kubeconfig file. Default: $KUBECONFIG or ~/.kube/config, else the in-cluster service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use instead of the current one.
    #[arg(long)]
    pub context: Option<String>,
    /// Sustained requests per second to the API server.
    #[arg(long, default_value_t = DEFAULT_QPS)]
    pub kube_api_qps: f32,
    /// Requests that may be sent back to back before the QPS pacing applies.
    #[arg(long, default_value_t = DEFAULT_BURST)]
    pub kube_api_burst: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Clone, ClapArgs)]
pub struct DrainCheckArgs {
    /// The node whose driver is to go.
    #[arg(long)]
    pub node: String,
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
    /// Only this namespace.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(flatten)]
    pub connection: Connection,
}

/// Runs a command; the exit code says what it found.
pub async fn run(tool: Tool) -> ExitCode {
    let code = match tool {
        Tool::DrainCheck(args) => drain_check(args).await,
        Tool::Audit(args) => run_audit(args).await,
    };
    ExitCode::from(code)
}

async fn reader(connection: &Connection) -> Result<Reader, u8> {
    let options = ClientOptions {
        qps: connection.kube_api_qps,
        burst: connection.kube_api_burst,
        kubeconfig: connection.kubeconfig.clone(),
        context: connection.context.clone(),
    };
    match build_client(&options, &prometheus::Registry::new()).await {
        Ok((client, _drain)) => Ok(Reader::new(client)),
        Err(e) => {
            eprintln!("error: {e:#}");
            Err(exit::INCOMPLETE)
        }
    }
}

fn print_json(value: &impl serde::Serialize) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("error: cannot write the report as JSON: {e}"),
    }
}

fn incomplete(err: &ReadError) -> u8 {
    eprintln!("error: the check could not be completed: {err}");
    exit::INCOMPLETE
}

/// With `--wait` and without `--strict`, warnings that stay the same this
/// long are taken as final: stale entries the controller would fix change
/// within seconds; a leaked allocation or a pod-group consumer never does.
const WARNINGS_SETTLE: Duration = Duration::from_secs(30);

/// What identifies a set of warnings (type, namespace, claim), to tell
/// whether they changed.
type WarningKeys = Vec<(String, String, String)>;

fn warning_keys(warnings: &[Finding]) -> WarningKeys {
    let mut keys: Vec<_> = warnings
        .iter()
        .map(|w| {
            (
                w.kind.clone(),
                w.claim.namespace.clone(),
                w.claim.name.clone(),
            )
        })
        .collect();
    keys.sort();
    keys
}

fn print_report(report: &DrainCheckReport, output: Output) {
    match output {
        Output::Table => print!("{}", report.table()),
        Output::Json => print_json(report),
    }
}

async fn drain_check(args: DrainCheckArgs) -> u8 {
    let node = args.node.as_str();
    let driver = args.driver.as_deref();
    let incomplete = |error: String| {
        eprintln!("error: the check could not be completed: {error}");
        if args.output == Output::Json {
            print_json(&DrainCheckReport::incomplete(
                node,
                driver,
                Timestamp::now().to_string(),
                error,
            ));
        }
        exit::INCOMPLETE
    };
    let reader = match reader(&args.connection).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    let scope = DrainScope {
        finished_grace: args.finished_grace.0,
        ..DrainScope::new(node, driver)
    };
    let interval = args.interval.0.max(Duration::from_secs(1));
    let deadline = args.wait.map(|w| Instant::now() + w.0);
    // Warnings seen with nothing blocking, and since when unchanged.
    let mut settled: Option<(WarningKeys, Instant)> = None;
    loop {
        let out_of_time = deadline.is_none_or(|d| Instant::now() >= d);
        let now = Timestamp::now();
        match reader.for_node(scope, now).await {
            Ok(snapshot) => {
                if let Some(unknown) = unknown_target(&snapshot, scope) {
                    return incomplete(unknown);
                }
                let report = check(&snapshot, scope, now);
                let code = report.verdict.exit_code(args.strict);
                let warnings_final = !args.strict && report.blocking.is_empty() && {
                    let keys = warning_keys(&report.warnings);
                    match &settled {
                        Some((seen, since)) if *seen == keys => since.elapsed() >= WARNINGS_SETTLE,
                        _ => {
                            settled = Some((keys, Instant::now()));
                            false
                        }
                    }
                };
                if !report.blocking.is_empty() {
                    settled = None;
                }
                if code == exit::CLEAN || out_of_time || warnings_final {
                    print_report(&report, args.output);
                    return code;
                }
                eprintln!(
                    "waiting for node {node}: {} blocking, {} warning(s)",
                    report.blocking.len(),
                    report.warnings.len()
                );
            }
            Err(e) if e.is_transient() && !out_of_time => {
                eprintln!("waiting for node {node}: {e}");
            }
            Err(e) => return incomplete(e.to_string()),
        }
        let pause = deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::ZERO)
            .min(interval);
        tokio::time::sleep(pause).await;
    }
}

async fn run_audit(args: AuditArgs) -> u8 {
    let reader = match reader(&args.connection).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    let snapshot = match reader
        .for_audit(args.namespace.as_deref(), args.node.as_deref())
        .await
    {
        Ok(s) => s,
        Err(e) => return incomplete(&e),
    };
    let scope = AuditScope {
        node: args.node.clone(),
        namespace: args.namespace.clone(),
    };
    let report = audit(&snapshot, scope, Timestamp::now());
    match args.output {
        Output::Table => print!("{}", report.table()),
        Output::Json => print_json(&report),
    }
    report.exit_code()
}
