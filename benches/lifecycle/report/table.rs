//! The comparison table of a bench invocation's runs (printed, and in the
//! JSON file with every run) and the files it writes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::json;

use super::{Latency, PerPod, Phase, RunResult};
use crate::Args;
use crate::under_test::{Kind, UnderTest};

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
