//! The admin commands (`drain-check`, `audit`, `check-release`, `drain`,
//! `uncordon`), shared by `dra-claim-controller` and the kubectl plugin
//! `kubectl-dra`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, Subcommand, ValueEnum};
use k8s_openapi::jiff::Timestamp;

use super::audit::audit;
use super::drain::{DEFAULT_FINISHED_GRACE, DrainScope, check, unknown_target};
use super::read::{ReadError, Reader};
use super::release;
use super::report::{AuditScope, DrainCheckReport, Finding, exit};
use dra_runtime::client::{
    ClientOptions, ConnectionOverrides, DEFAULT_BURST, DEFAULT_QPS, build_client,
};
use dra_runtime::duration::FlagDuration;

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
    /// Take a node's devices (of one driver, or all) out of service before driver maintenance: DeviceTaintRules
    /// preview what would be evicted (effect None), then taint them NoExecute so that the device-taint eviction
    /// controller evicts the pods using them, then wait until drain-check finds the node clean (its exit code).
    /// Run again, it resumes. `uncordon` undoes it.
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
    /// Stop after the preview: the rules stay with the None effect (evicting nobody) until `drain` runs again or `uncordon` removes them.
    #[arg(long)]
    pub preview: bool,
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
        Tool::DrainCheck(args) => drain_check(args).await,
        Tool::Audit(args) => run_audit(args).await,
        Tool::CheckRelease(args) => check_release(args).await,
        Tool::Drain(args) => drain(args).await,
        Tool::Uncordon(args) => run_uncordon(args).await,
        Tool::Pools(args) => run_pools(args).await,
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

fn connection_options(connection: &Connection) -> ClientOptions {
    ClientOptions {
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
    }
}

async fn reader(connection: &Connection) -> Result<(Reader, String), u8> {
    let options = connection_options(connection);
    match build_client(&options, &prometheus::Registry::new()).await {
        Ok((client, _drain)) => {
            let namespace = client.default_namespace().to_string();
            Ok((Reader::new(client), namespace))
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            Err(exit::INCOMPLETE)
        }
    }
}

fn print_yaml(value: &impl serde::Serialize) {
    match serde_saphyr::to_string(value) {
        Ok(text) => print!("{text}"),
        Err(e) => eprintln!("error: cannot write the report as YAML: {e}"),
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
        Output::Wide => print!("{}", report.wide_table()),
        Output::Json => print_json(report),
        Output::Yaml => print_yaml(report),
        Output::Name => report.names().iter().for_each(|n| println!("{n}")),
    }
}

async fn drain_check(args: DrainCheckArgs) -> u8 {
    let node = args.node();
    let driver = args.driver.as_deref();
    let incomplete = |error: String| {
        eprintln!("error: the check could not be completed: {error}");
        if matches!(args.output, Output::Json | Output::Yaml) {
            let report =
                DrainCheckReport::incomplete(node, driver, Timestamp::now().to_string(), error);
            print_report(&report, args.output);
        }
        exit::INCOMPLETE
    };
    let reader = match reader(&args.connection).await {
        Ok((r, _)) => r,
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
        let read = match within(
            &args.connection.request_timeout,
            reader.for_node(scope, now),
        )
        .await
        {
            Ok(read) => read,
            Err(late) => return incomplete(late),
        };
        match read {
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

async fn client_for(connection: &Connection) -> Result<kube::Client, u8> {
    match build_client(
        &connection_options(connection),
        &prometheus::Registry::new(),
    )
    .await
    {
        Ok((client, _)) => Ok(client),
        Err(e) => {
            eprintln!("error: {e:#}");
            Err(exit::INCOMPLETE)
        }
    }
}

async fn drain(args: DrainArgs) -> u8 {
    use super::device_drain::{
        all_slices, ensure_rules, evict, plan_rules, previews, rules_version,
    };
    let node = args.node.as_str();
    let driver = args.driver.as_deref();
    let client = match client_for(&args.connection).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let failed = |e: String| {
        eprintln!("error: {e}");
        exit::INCOMPLETE
    };
    let version = match rules_version(&client).await {
        Ok(v) => v,
        Err(e) => return failed(e),
    };
    let slices = match all_slices(&client).await {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let planned = plan_rules(node, driver, &slices);
    if planned.is_empty() {
        eprintln!(
            "node {node} publishes no devices{}: no rule needed",
            driver
                .map(|d| format!(" of driver {d}"))
                .unwrap_or_default()
        );
    }
    let rules = match ensure_rules(&client, version, node, &planned).await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let previewing: Vec<String> = rules
        .iter()
        .filter(|r| r.data["spec"]["taint"]["effect"] == "None")
        .filter_map(|r| r.metadata.name.clone())
        .collect();
    if !previewing.is_empty() {
        for (name, said) in previews(&client, version, &previewing, args.preview_timeout.0).await {
            match said {
                Some(message) => eprintln!("preview {name}: {message}"),
                None => eprintln!(
                    "preview {name}: no figures yet (is a device-taint eviction controller running, with DRADeviceTaintRules on?)"
                ),
            }
        }
    }
    if args.preview {
        if previewing.len() < rules.len() {
            eprintln!(
                "node {node} is being drained already ({} of {} rules NoExecute); `uncordon {node}` ends it",
                rules.len() - previewing.len(),
                rules.len()
            );
        } else {
            eprintln!(
                "preview only: the rules evict nobody; run `drain {node}` again to evict, `uncordon {node}` to remove them"
            );
        }
        return exit::CLEAN;
    }
    if let Err(e) = evict(&client, version, &rules).await {
        return failed(e);
    }
    eprintln!(
        "{} DeviceTaintRule(s) NoExecute on node {node}; waiting until no pod uses its devices",
        rules.len()
    );
    drain_check(DrainCheckArgs {
        node_name: Some(node.to_string()),
        node: None,
        driver: args.driver.clone(),
        wait: Some(args.timeout),
        interval: args.interval,
        strict: false,
        finished_grace: args.finished_grace,
        output: args.output,
        connection: args.connection,
    })
    .await
}

async fn run_pools(args: PoolsArgs) -> u8 {
    let client = match client_for(&args.connection).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let pools =
        match super::pools::read_pools(&client, args.driver.as_deref(), args.node.as_deref()).await
        {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: {e}");
                return exit::INCOMPLETE;
            }
        };
    match args.output {
        Output::Json => print_json(&pools),
        Output::Yaml => print_yaml(&pools),
        Output::Table | Output::Wide | Output::Name => {
            print!("{}", super::pools::pools_table(&pools))
        }
    }
    exit::CLEAN
}

async fn run_uncordon(args: UncordonArgs) -> u8 {
    let client = match client_for(&args.connection).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let version = match super::device_drain::rules_version(&client).await {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::INCOMPLETE;
        }
    };
    match super::device_drain::uncordon(&client, version, &args.node, args.driver.as_deref()).await
    {
        Ok(deleted) => {
            for name in &deleted {
                println!("devicetaintrule.resource.k8s.io/{name} deleted");
            }
            if deleted.is_empty() {
                eprintln!("node {} has no drain rules", args.node);
            }
            exit::CLEAN
        }
        Err(e) => {
            eprintln!("error: {e}");
            exit::INCOMPLETE
        }
    }
}

async fn check_release(args: CheckReleaseArgs) -> u8 {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, ListParams};
    let options = connection_options(&args.connection);
    let client = match build_client(&options, &prometheus::Registry::new()).await {
        Ok((client, _)) => client,
        Err(e) => {
            eprintln!("error: {e:#}");
            return exit::INCOMPLETE;
        }
    };
    let ns = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let pods = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels(&args.selector))
        .await;
    let lease = Api::<Lease>::namespaced(client.clone(), &ns)
        .get(&args.lease)
        .await;
    let (pods, lease) = match (pods, lease) {
        (Ok(pods), Ok(lease)) => (pods.items, lease),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: the checks could not be made in namespace {ns}: {e}");
            return exit::INCOMPLETE;
        }
    };
    let mut verdicts = vec![
        release::pods_ready(&pods, &args.selector),
        release::lease_held(&lease, Timestamp::now()),
    ];
    if !args.metrics_url.is_empty() {
        let token = std::fs::read_to_string(&args.token_file)
            .ok()
            .map(|t| t.trim().to_string());
        let answer = fetch_metrics(&args.metrics_url, token).await;
        verdicts.push(release::metrics_answer(&args.metrics_url, answer));
    }
    for v in &verdicts {
        println!("{} {}", if v.ok { "ok:  " } else { "FAIL:" }, v.what);
    }
    if verdicts.iter().all(|v| v.ok) {
        exit::CLEAN
    } else {
        exit::BLOCKED
    }
}

/// GET `url` with `token` as bearer, the certificate not verified.
async fn fetch_metrics(url: &str, token: Option<String>) -> Result<String, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    let base = format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("https"),
        uri.authority().map(|a| a.as_str()).unwrap_or_default()
    );
    let mut config = kube::Config::new(base.parse().map_err(|e| format!("not a URL: {e}"))?);
    ConnectionOverrides {
        token,
        insecure_skip_tls_verify: true,
        ..ConnectionOverrides::default()
    }
    .apply(&mut config)
    .map_err(|e| format!("{e:#}"))?;
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    let request = http::Request::get(uri.path())
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| e.to_string())
}

/// `read`, bounded by `--request-timeout` (0: unbounded); a read that takes
/// longer is what the error says.
async fn within<T>(
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

async fn run_audit(args: AuditArgs) -> u8 {
    let (reader, context_namespace) = match reader(&args.connection).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    let namespace = audit_namespace(&args, &context_namespace);
    let read = reader.for_audit(namespace.as_deref(), args.node.as_deref());
    let read = match within(&args.connection.request_timeout, read).await {
        Ok(read) => read,
        Err(late) => {
            eprintln!("error: the check could not be completed: {late}");
            return exit::INCOMPLETE;
        }
    };
    let snapshot = match read {
        Ok(s) => s,
        Err(e) => return incomplete(&e),
    };
    let scope = AuditScope {
        node: args.node.clone(),
        namespace,
    };
    let report = audit(&snapshot, scope, Timestamp::now());
    match args.output {
        Output::Table => print!("{}", report.table()),
        Output::Wide => print!("{}", report.wide_table()),
        Output::Json => print_json(&report),
        Output::Yaml => print_yaml(&report),
        Output::Name => report.names().iter().for_each(|n| println!("{n}")),
    }
    report.exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

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
