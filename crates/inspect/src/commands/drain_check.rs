//! `drain-check`: reads what matters to the node and checks it, again and
//! again with `--wait` until the node is clean or the time is up, and
//! prints the last check's report.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use super::{DrainCheckArgs, Output, connect, emit, within};
use crate::drain::{DrainScope, check, unknown_target};
use crate::read::Reader;
use crate::report::{DrainCheckReport, Finding, exit};

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

/// Runs `drain-check` (and the end of `drain`); its exit code.
pub(super) async fn run(args: DrainCheckArgs) -> u8 {
    let node = args.node();
    let driver = args.driver.as_deref();
    let incomplete = |error: String| {
        eprintln!("error: the check could not be completed: {error}");
        if matches!(args.output, Output::Json | Output::Yaml) {
            let report =
                DrainCheckReport::incomplete(node, driver, Timestamp::now().to_string(), error);
            emit(&report, args.output);
        }
        exit::INCOMPLETE
    };
    let reader = match connect(&args.connection).await {
        Ok(client) => Reader::new(client),
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
        let read = match within(&args.connection.request_timeout, async {
            match &args.pod_selector {
                Some(selector) => reader
                    .for_node_selected(scope, now, selector)
                    .await
                    .map(|(snapshot, selected)| (snapshot, Some(selected))),
                None => reader.for_node(scope, now).await.map(|s| (s, None)),
            }
        })
        .await
        {
            Ok(read) => read,
            Err(late) => return incomplete(late),
        };
        match read {
            Ok((snapshot, selected)) => {
                if let Some(unknown) = unknown_target(&snapshot, scope) {
                    return incomplete(unknown);
                }
                let mut report = check(&snapshot, scope, now);
                if let Some(selected) = &selected {
                    report = report.keep_unselected(selected);
                }
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
                    emit(&report, args.output);
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
