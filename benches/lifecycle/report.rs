//! From watch timestamps and process snapshots to the figures of one run;
//! the comparison table and the JSON file are in `report/table.rs`.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use crate::Args;
use crate::load::Calls;
use crate::tracker::State;
use crate::under_test::{Kind, ProcStats, UnderTest, cpu_seconds, proc_stats};

#[path = "report/table.rs"]
mod table;

pub use table::{Output, print_table};

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
