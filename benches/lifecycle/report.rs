//! From watch timestamps and process snapshots to the figures of one run,
//! the comparison table and the JSON file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use serde_json::json;

use crate::Args;
use crate::load::Calls;
use crate::tracker::State;
use crate::under_test::{Kind, ProcStats, UnderTest, cpu_seconds, proc_stats};

const REQUESTS_METRIC: &str = "rest_client_requests_total";

/// `rest_client_requests_total` by (method, code), and the process's CPU
/// and peak RSS, at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    requests: BTreeMap<(String, String), f64>,
    stats: ProcStats,
    server_cpu_s: f64,
}

impl Snapshot {
    pub async fn take(controller: &UnderTest) -> anyhow::Result<Self> {
        let text = controller.metrics().await?;
        Ok(Self {
            requests: requests_by_method_code(&text),
            stats: proc_stats(controller.pid())?,
            server_cpu_s: controller
                .server_pids()
                .into_iter()
                .map(cpu_seconds)
                .sum::<anyhow::Result<f64>>()?,
        })
    }

    /// Requests sent between `self` and `later`, by (method, code).
    fn delta(&self, later: &Snapshot) -> BTreeMap<(String, String), f64> {
        counts_delta(&self.requests, &later.requests)
    }
}

/// Requests counted in `later` beyond `earlier`, by (method, code).
fn counts_delta(
    earlier: &BTreeMap<(String, String), f64>,
    later: &BTreeMap<(String, String), f64>,
) -> BTreeMap<(String, String), f64> {
    later
        .iter()
        .map(|(k, v)| (k.clone(), v - earlier.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Requests per pod by HTTP method between two scrapes of a controller's
/// `/metrics`.
pub fn per_pod_between(before: &str, after: &str, pods: usize) -> BTreeMap<String, f64> {
    let delta = counts_delta(
        &requests_by_method_code(before),
        &requests_by_method_code(after),
    );
    per_pod_by_method(&delta, pods)
}

/// Sums the samples of `rest_client_requests_total` by their `method` and
/// `code` labels (the reference also has `host`; it is summed over).
fn requests_by_method_code(exposition: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for line in exposition.lines() {
        let Some(rest) = line
            .strip_prefix(REQUESTS_METRIC)
            .and_then(|r| r.strip_prefix('{'))
        else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let key = (label(labels, "method"), label(labels, "code"));
        *out.entry(key).or_insert(0.0) += value;
    }
    out
}

/// The value of `name="…"` in a label list (values here hold no `",`).
fn label(labels: &str, name: &str) -> String {
    labels
        .split("\",")
        .filter_map(|pair| pair.trim().split_once("=\""))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim_end_matches('"').to_string())
        .unwrap_or_default()
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    fn quantiles(&self) -> [(&'static str, f64); 3] {
        [
            ("p50", self.p50_ms),
            ("p99", self.p99_ms),
            ("max", self.max_ms),
        ]
    }
}

/// One phase of the load, for one controller.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub pods: usize,
    /// Pods that got through the phase before its timeout.
    pub completed: usize,
    pub bench_calls_failed: usize,
    /// From the bench's first call to its last call returning.
    pub bench_calls_s: f64,
    /// From the bench's first call to the last pod through.
    pub elapsed_s: f64,
    pub pods_per_s: f64,
    pub latency: Latency,
}

/// Where the create phase stands against the controller's token bucket.
#[derive(Debug, Clone, Serialize)]
pub struct QpsBound {
    /// K creates and one status write per pod.
    pub writes_per_pod: usize,
    /// (writes per pod × N − burst) / QPS.
    pub limit_s: f64,
    /// (measured − limit) / limit, in percent; none when the burst covers it all.
    pub gap_pct: Option<f64>,
}

/// Requests per pod by HTTP method, for each phase and the whole lifecycle.
#[derive(Debug, Clone, Serialize)]
pub struct PerPod {
    pub create: BTreeMap<String, f64>,
    pub cleanup: BTreeMap<String, f64>,
    pub delete: BTreeMap<String, f64>,
    pub lifecycle: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub controller: Kind,
    /// 1-based; each round runs every controller once.
    pub round: usize,
    /// 1-minute load average of the machine when the run started: other
    /// work on the machine skews a run, this tells which.
    pub loadavg_at_start: f64,
    pub log: String,
    pub create: Phase,
    pub cleanup: Phase,
    pub qps_bound: QpsBound,
    pub requests_per_pod: PerPod,
    /// Responses over the lifecycle by status code (all verbs).
    pub responses_by_code: BTreeMap<String, f64>,
    /// 409 responses over the lifecycle, by method.
    pub conflicts_409: BTreeMap<String, f64>,
    /// 422 responses over the lifecycle, by method.
    pub invalid_422: BTreeMap<String, f64>,
    /// Claims controlled by load pods, duplicates included (N × K expected).
    pub claims_created: usize,
    pub claims_expected: usize,
    /// CPU from the first create to the end of the run.
    pub cpu_lifecycle_s: f64,
    /// CPU since the process started (includes its initial lists).
    pub cpu_process_s: f64,
    /// VmHWM at the end of the run.
    pub peak_rss_mib: f64,
    /// CPU of kube-apiserver + etcd from the first create to the end.
    pub server_cpu_lifecycle_s: f64,
    /// CPU of the controller in the create phase.
    pub cpu_create_s: f64,
    /// CPU of kube-apiserver + etcd in the create phase (bench creates included).
    pub server_cpu_create_s: f64,
    /// Start-up: from the process start until one warm-up pod went through
    /// its whole lifecycle (caches synced and working).
    pub startup: Startup,
}

/// What start-up cost: the time until the warm-up pod was through, the rest
/// once the controller has settled after it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Startup {
    pub ready_s: f64,
    /// Requests sent by then (lists, watches, the warm-up pod's writes).
    pub requests: f64,
    pub cpu_s: f64,
    /// VmHWM by then: the initial lists' peak.
    pub peak_rss_mib: f64,
}

/// The figures of one run. `snapshots`: before the load, after the create
/// phase, after the cleanup phase, at the end.
pub fn summarize(
    controller: &UnderTest,
    args: &Args,
    state: &State,
    names: &[String],
    (created, done): (Calls, Calls),
    [base, after_create, after_cleanup, end]: [&Snapshot; 4],
    ready_s: f64,
) -> RunResult {
    let n = names.len();
    let create = phase(names, created, |p| {
        let t = state.pods.get(p)?;
        Some((t.created?, t.recorded?))
    });
    let cleanup = phase(names, done, |p| {
        Some((state.pods.get(p)?.done?, state.claims_gone(p)?))
    });
    let lifecycle = base.delta(end);
    RunResult {
        controller: controller.kind(),
        round: 1,
        loadavg_at_start: 0.0,
        log: controller.log().display().to_string(),
        qps_bound: qps_bound(args, create.elapsed_s),
        create,
        cleanup,
        requests_per_pod: PerPod {
            create: per_pod_by_method(&base.delta(after_create), n),
            cleanup: per_pod_by_method(&after_create.delta(after_cleanup), n),
            delete: per_pod_by_method(&after_cleanup.delta(end), n),
            lifecycle: per_pod_by_method(&lifecycle, n),
        },
        responses_by_code: sum_by(&lifecycle, |(_, code)| code),
        conflicts_409: by_method_with_code(&lifecycle, "409"),
        invalid_422: by_method_with_code(&lifecycle, "422"),
        claims_created: state.claims_owned_by(names),
        claims_expected: n * args.claims(),
        cpu_lifecycle_s: end.stats.cpu_s - base.stats.cpu_s,
        cpu_process_s: end.stats.cpu_s,
        peak_rss_mib: end.stats.peak_rss_mib,
        server_cpu_lifecycle_s: end.server_cpu_s - base.server_cpu_s,
        cpu_create_s: after_create.stats.cpu_s - base.stats.cpu_s,
        server_cpu_create_s: after_create.server_cpu_s - base.server_cpu_s,
        startup: Startup {
            ready_s,
            requests: base.requests.values().sum(),
            cpu_s: base.stats.cpu_s,
            peak_rss_mib: base.stats.peak_rss_mib,
        },
    }
}

/// Elapsed time from the first bench call to the last pod through, and
/// the per-pod latencies `span` gives (start, end) for.
fn phase(
    names: &[String],
    calls: Calls,
    span: impl Fn(&str) -> Option<(Instant, Instant)>,
) -> Phase {
    let spans: Vec<(Instant, Instant)> = names.iter().filter_map(|p| span(p)).collect();
    let last = spans.iter().map(|s| s.1).max().unwrap_or(calls.started);
    let elapsed_s = last.saturating_duration_since(calls.started).as_secs_f64();
    // An event can beat the bench's own call returning: count that as 0.
    let mut ms: Vec<f64> = spans
        .iter()
        .map(|(a, b)| b.saturating_duration_since(*a).as_secs_f64() * 1e3)
        .collect();
    ms.sort_by(f64::total_cmp);
    Phase {
        pods: names.len(),
        completed: spans.len(),
        bench_calls_failed: calls.failed,
        bench_calls_s: (calls.finished - calls.started).as_secs_f64(),
        elapsed_s,
        pods_per_s: if elapsed_s > 0.0 {
            spans.len() as f64 / elapsed_s
        } else {
            0.0
        },
        latency: Latency {
            p50_ms: percentile(&ms, 50.0),
            p99_ms: percentile(&ms, 99.0),
            max_ms: ms.last().copied().unwrap_or(0.0),
        },
    }
}

/// Nearest-rank percentile of sorted values.
/// The nearest-rank percentile `p` (0-100) of `sorted`.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn qps_bound(args: &Args, measured_s: f64) -> QpsBound {
    let writes_per_pod = args.claims() + 1;
    let tokens = (writes_per_pod * args.pods) as f64 - f64::from(args.kube_api_burst);
    let limit_s = tokens.max(0.0) / f64::from(args.kube_api_qps.max(1));
    QpsBound {
        writes_per_pod,
        limit_s,
        gap_pct: (limit_s > 0.0).then(|| (measured_s - limit_s) / limit_s * 100.0),
    }
}

fn sum_by(
    requests: &BTreeMap<(String, String), f64>,
    key: impl Fn(&(String, String)) -> &String,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (k, v) in requests {
        *out.entry(key(k).clone()).or_insert(0.0) += v;
    }
    out
}

fn per_pod_by_method(
    requests: &BTreeMap<(String, String), f64>,
    pods: usize,
) -> BTreeMap<String, f64> {
    let mut out = sum_by(requests, |(method, _)| method);
    let pods = pods.max(1) as f64;
    out.values_mut().for_each(|v| *v /= pods);
    out
}

fn by_method_with_code(
    requests: &BTreeMap<(String, String), f64>,
    code: &str,
) -> BTreeMap<String, f64> {
    let only: BTreeMap<_, _> = requests
        .iter()
        .filter(|((_, c), _)| c == code)
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    sum_by(&only, |(method, _)| method)
}

/// Picks one phase's requests per pod by method.
type Pick = fn(&PerPod) -> &BTreeMap<String, f64>;

/// One line of the comparison: a value per run.
struct Row {
    metric: String,
    values: Vec<Option<f64>>,
    decimals: usize,
    /// Whether ours / reference means anything (not for signed gaps).
    comparable: bool,
}

fn row(
    metric: impl Into<String>,
    decimals: usize,
    runs: &[RunResult],
    f: impl Fn(&RunResult) -> Option<f64>,
) -> Row {
    Row {
        metric: metric.into(),
        values: runs.iter().map(f).collect(),
        decimals,
        comparable: true,
    }
}

fn rows(runs: &[RunResult]) -> Vec<Row> {
    let mut rows = vec![
        row("create: pods completed", 0, runs, |r| {
            Some(r.create.completed as f64)
        }),
        row(
            "create: time s (first create → last recorded)",
            1,
            runs,
            |r| Some(r.create.elapsed_s),
        ),
        row("create: pods/s", 1, runs, |r| Some(r.create.pods_per_s)),
        row("create: bench create calls s", 1, runs, |r| {
            Some(r.create.bench_calls_s)
        }),
        row("create: QPS-bound limit s", 1, runs, |r| {
            Some(r.qps_bound.limit_s)
        }),
        Row {
            comparable: false,
            ..row("create: gap to limit %", 2, runs, |r| r.qps_bound.gap_pct)
        },
        row("cleanup: pods completed", 0, runs, |r| {
            Some(r.cleanup.completed as f64)
        }),
        row("cleanup: pods/s", 1, runs, |r| Some(r.cleanup.pods_per_s)),
    ];
    rows.splice(4..4, latency_rows("create→recorded", runs, |r| &r.create));
    rows.extend(latency_rows("done→claims deleted", runs, |r| &r.cleanup));
    let phases: [(&str, Pick); 4] = [
        ("lifecycle", |p| &p.lifecycle),
        ("create", |p| &p.create),
        ("cleanup", |p| &p.cleanup),
        ("delete", |p| &p.delete),
    ];
    for (name, pick) in phases {
        rows.push(row(format!("requests/pod {name}: all"), 3, runs, |r| {
            Some(pick(&r.requests_per_pod).values().sum())
        }));
        for method in methods(runs, pick) {
            rows.push(row(
                format!("requests/pod {name}: {method}"),
                3,
                runs,
                |r| {
                    Some(
                        pick(&r.requests_per_pod)
                            .get(&method)
                            .copied()
                            .unwrap_or(0.0),
                    )
                },
            ));
        }
    }
    rows.extend([
        row("409 conflicts", 0, runs, |r| {
            Some(r.conflicts_409.values().sum())
        }),
        row("422 invalid", 0, runs, |r| {
            Some(r.invalid_422.values().sum())
        }),
        row("other non-2xx responses", 0, runs, |r| {
            Some(
                non_2xx(r)
                    - r.conflicts_409.values().sum::<f64>()
                    - r.invalid_422.values().sum::<f64>(),
            )
        }),
        row("claims created for load pods (N×K needed)", 0, runs, |r| {
            Some(r.claims_created as f64)
        }),
        row("CPU s (create phase)", 2, runs, |r| Some(r.cpu_create_s)),
        row("CPU s (lifecycle)", 2, runs, |r| Some(r.cpu_lifecycle_s)),
        row("CPU s (process total)", 2, runs, |r| Some(r.cpu_process_s)),
        row("peak RSS MiB", 1, runs, |r| Some(r.peak_rss_mib)),
        row("start-up: s until a first pod went through", 1, runs, |r| {
            Some(r.startup.ready_s)
        }),
        row("start-up: requests", 0, runs, |r| Some(r.startup.requests)),
        row("start-up: CPU s", 2, runs, |r| Some(r.startup.cpu_s)),
        row("start-up: peak RSS MiB", 1, runs, |r| {
            Some(r.startup.peak_rss_mib)
        }),
        Row {
            comparable: false,
            ..row("machine load average at start", 1, runs, |r| {
                Some(r.loadavg_at_start)
            })
        },
        row("API server + etcd CPU s (create phase)", 2, runs, |r| {
            Some(r.server_cpu_create_s)
        }),
        row("API server + etcd CPU s (lifecycle)", 2, runs, |r| {
            Some(r.server_cpu_lifecycle_s)
        }),
    ]);
    rows
}

/// p50, p99 and max of a phase's latency.
fn latency_rows(what: &str, runs: &[RunResult], phase: fn(&RunResult) -> &Phase) -> Vec<Row> {
    (0..3)
        .map(|i| {
            let name = Latency::default().quantiles()[i].0;
            row(format!("{what} {name} ms"), 0, runs, |r| {
                Some(phase(r).latency.quantiles()[i].1)
            })
        })
        .collect()
}

fn non_2xx(run: &RunResult) -> f64 {
    run.responses_by_code
        .iter()
        .filter(|(code, _)| !code.starts_with('2'))
        .map(|(_, v)| v)
        .sum()
}

fn methods(runs: &[RunResult], pick: Pick) -> Vec<String> {
    let mut all: Vec<String> = runs
        .iter()
        .flat_map(|r| pick(&r.requests_per_pod).keys().cloned())
        .collect();
    all.sort();
    all.dedup();
    all
}

/// The kinds that ran, in the order they first ran: the table's columns.
fn kinds(runs: &[RunResult]) -> Vec<Kind> {
    let mut kinds: Vec<Kind> = Vec::new();
    for r in runs {
        if !kinds.contains(&r.controller) {
            kinds.push(r.controller);
        }
    }
    kinds
}

/// Median over the rounds of `kind` (the mean of the middle two for an
/// even count); machine noise hits single runs, not the median.
fn median(runs: &[RunResult], row: &Row, kind: Kind) -> Option<f64> {
    let mut values: Vec<f64> = runs
        .iter()
        .zip(&row.values)
        .filter(|(r, _)| r.controller == kind)
        .filter_map(|(_, v)| *v)
        .collect();
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[mid]),
        _ => Some((values[mid - 1] + values[mid]) / 2.0),
    }
}

/// ours / reference of the medians, where both ran.
fn ratio(runs: &[RunResult], row: &Row) -> Option<f64> {
    if !row.comparable {
        return None;
    }
    let ours = median(runs, row, Kind::Ours)?;
    let reference = median(runs, row, Kind::Reference)?;
    (reference != 0.0).then(|| ours / reference)
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    // `+ 0.0` turns the -0.0 of an empty sum into 0.
    value.map_or_else(|| "-".into(), |v| format!("{:.decimals$}", v + 0.0))
}

pub fn print_table(args: &Args, runs: &[RunResult]) {
    println!();
    println!(
        "lifecycle: {} pods × {} claim(s), fill {} pods + {} nodes with a slice of {} devices each, QPS {} burst {}, workers {}, rate {}, concurrency {}",
        args.pods,
        args.claims(),
        args.fill_pods,
        args.fill_nodes,
        args.fill_devices_per_node,
        args.kube_api_qps,
        args.kube_api_burst,
        args.concurrent_syncs,
        if args.rate > 0.0 {
            format!("{}/s", args.rate)
        } else {
            "unbounded".into()
        },
        args.concurrency
    );
    let rounds = runs.iter().map(|r| r.round).max().unwrap_or(1);
    if rounds > 1 {
        println!("(median of {rounds} rounds; every run is in the JSON)");
    }
    let columns = kinds(runs);
    let mut header = format!("{:<48}", "metric");
    for kind in &columns {
        header += &format!("{:>12}", kind.to_string());
    }
    header += &format!("{:>12}", "ours/ref");
    println!("{header}");
    println!("{}", "-".repeat(header.len()));
    for row in rows(runs) {
        let mut line = format!("{:<48}", row.metric);
        for kind in &columns {
            line += &format!("{:>12}", cell(median(runs, &row, *kind), row.decimals));
        }
        line += &format!("{:>12}", cell(ratio(runs, &row), 2));
        println!("{line}");
    }
    for r in runs {
        println!("{} round {} log: {}", r.controller, r.round, r.log);
    }
}

/// Where the files of one bench invocation go:
/// `target/bench/lifecycle-<UTC start time>.json` and a copy of each
/// controller's log beside it (the server's directory is removed).
pub struct Output {
    time: k8s_openapi::jiff::Timestamp,
    stem: PathBuf,
}

impl Output {
    pub fn new() -> anyhow::Result<Self> {
        let time = k8s_openapi::jiff::Timestamp::now();
        let dir = crate::helm::target_dir().join("bench");
        std::fs::create_dir_all(&dir)?;
        let stem = dir.join(format!("lifecycle-{}", time.strftime("%Y%m%dT%H%M%SZ")));
        Ok(Self { time, stem })
    }

    fn with_suffix(&self, suffix: &str) -> PathBuf {
        let mut path = self.stem.clone().into_os_string();
        path.push(suffix);
        path.into()
    }

    /// Copies the log of `controller` next to the JSON; the path of the copy.
    pub fn keep_log(&self, controller: &UnderTest, round: usize) -> String {
        let to = self.with_suffix(&format!("-{}-{round}.log", controller.kind()));
        match std::fs::copy(controller.log(), &to) {
            Ok(_) => to.display().to_string(),
            Err(e) => format!("{} (not copied: {e})", controller.log().display()),
        }
    }

    /// Writes args, runs and the table as JSON; the path written.
    pub fn write_json(&self, args: &Args, runs: &[RunResult]) -> anyhow::Result<PathBuf> {
        let table: Vec<_> = rows(runs)
            .iter()
            .map(|row| {
                let mut entry = json!({
                    "metric": row.metric,
                    "ours_over_reference": ratio(runs, row),
                    "runs": row.values,
                });
                for kind in kinds(runs) {
                    entry[kind.to_string()] = json!(median(runs, row, kind));
                }
                entry
            })
            .collect();
        let doc =
            json!({"time": self.time.to_string(), "args": args, "runs": runs, "table": table});
        let path = self.with_suffix(".json");
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
        Ok(path)
    }
}
