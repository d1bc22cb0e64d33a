//! `drain`: plans a node's DeviceTaintRules and writes them with the None
//! effect (a preview of what they would evict), then taints NoExecute and
//! waits, as `drain-check --wait`, until no pod uses the devices.

use super::{DrainArgs, DrainCheckArgs, connect, drain_check};
use crate::device_drain::{all_slices, ensure_rules, evict, plan_rules, previews, rules_version};
use crate::report::exit;

/// Runs `drain`; its exit code (the final drain-check's, past the preview).
pub(super) async fn run(args: DrainArgs) -> u8 {
    let node = args.node.as_str();
    let driver = args.driver.as_deref();
    let client = match connect(&args.connection).await {
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
    if let Err(e) = evict(&client, version, &rules, args.disable_eviction).await {
        return failed(e);
    }
    eprintln!(
        "{} DeviceTaintRule(s) NoExecute on node {node} ({}); waiting until no pod uses its devices",
        rules.len(),
        if args.disable_eviction {
            "pods deleted, --disable-eviction"
        } else {
            "pods evicted, PodDisruptionBudgets respected"
        }
    );
    drain_check::run(DrainCheckArgs {
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
