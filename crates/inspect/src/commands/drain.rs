//! `drain`: as `kubectl drain` for a node's devices. Plans the node's
//! DeviceTaintRules (removing those the plan no longer has), cordons
//! (`NoSchedule`: nothing new lands on the devices), then taints
//! `NoExecute` and waits, as `drain-check --wait`, until no pod uses the
//! devices; past `--timeout` it says what holds the node, budgets included.
//! `--dry-run` makes `None` rules, prints what they would evict, and
//! removes the rules it made. `--pod-selector` keeps the cordon rules
//! `NoSchedule` and evicts through one rule per device that no unselected
//! pod uses (`device_drain/selected.rs`).

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::Timestamp;

use super::{DrainArgs, DrainCheckArgs, connect, drain_check};
use crate::device_drain::{
    Created, PlannedRule, SelectedEviction, all_slices, budget_holds, cordon, delete_rules,
    ensure_rules, evict, node_devices, plan_rules, previews, prune_rules, rules_of, rules_version,
    selected_eviction,
};
use crate::drain::{DrainScope, check};
use crate::read::Reader;
use crate::report::exit;
use dra_model::device_taints::RulesVersion;

/// Runs `drain`; its exit code (the final drain-check's, past the preview).
pub(super) async fn run(args: DrainArgs) -> u8 {
    let node = args.node.as_str();
    let driver = args.driver.as_deref();
    let client = match connect(&args.connection).await {
        Ok(c) => c,
        Err(code) => return code,
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
    if args.dry_run {
        let previewed = match &args.pod_selector {
            Some(selector) => match select(&client, &args, selector, &slices).await {
                Ok(selected) => {
                    say_kept(&selected);
                    selected.rules
                }
                Err(e) => return failed(e),
            },
            None => planned,
        };
        return dry_run(&client, version, &args, &previewed).await;
    }
    let rules = match ensure_rules(&client, version, node, &planned, Created::Cordoned).await {
        Ok(ensured) => ensured.rules,
        Err(e) => return failed(e),
    };
    let only_cordon = args.pod_selector.is_some();
    if let Err(e) = cordon(&client, version, &rules, only_cordon).await {
        return failed(e);
    }
    // With --pod-selector, what it leaves: read once the devices are
    // cordoned, so that no new pod can change it.
    let selected = match &args.pod_selector {
        Some(selector) => match select(&client, &args, selector, &slices).await {
            Ok(selected) => Some(selected),
            Err(e) => return failed(e),
        },
        None => None,
    };
    let mut wanted = planned.clone();
    wanted.extend(selected.iter().flat_map(|s| s.rules.iter().cloned()));
    // The plan as the node is now, once its rules cordon: a rule it no
    // longer has goes when its device left the node or its pool changed
    // shape (or a device's unselected pod went, with --pod-selector); one
    // whose pool is not published now (a driver stopped for the
    // maintenance) stays.
    match prune_rules(&client, version, node, driver, &wanted, &slices).await {
        Ok(removed) => {
            for name in removed {
                eprintln!("DeviceTaintRule {name} removed: no longer in node {node}'s plan");
            }
        }
        Err(e) => return failed(e),
    }
    eprintln!(
        "node {node} cordoned: {} DeviceTaintRule(s) keep new pods off its devices",
        rules.len()
    );
    let evicting = match &selected {
        Some(selected) => {
            say_kept(selected);
            match ensure_rules(&client, version, node, &selected.rules, Created::Cordoned).await {
                Ok(ensured) => ensured.rules,
                Err(e) => return failed(e),
            }
        }
        None => rules,
    };
    if let Err(e) = evict(
        &client,
        version,
        &evicting,
        args.disable_eviction,
        args.grace_period,
    )
    .await
    {
        return failed(e);
    }
    eprintln!(
        "{} DeviceTaintRule(s) NoExecute on node {node} ({}); waiting until no {}pod uses its devices",
        evicting.len(),
        if args.disable_eviction {
            "pods deleted, --disable-eviction"
        } else {
            "pods evicted, PodDisruptionBudgets respected"
        },
        if selected.is_some() { "selected " } else { "" }
    );
    let code = drain_check::run(DrainCheckArgs {
        node_name: Some(node.to_string()),
        node: None,
        driver: args.driver.clone(),
        wait: Some(args.timeout),
        interval: args.interval,
        strict: false,
        finished_grace: args.finished_grace,
        pod_selector: args.pod_selector.clone(),
        output: args.output,
        connection: args.connection.clone(),
    })
    .await;
    if code != exit::CLEAN {
        // What the report cannot see: the budgets holding the evictions,
        // the selected pods no rule of this drain evicts.
        if let Ok(rules) = rules_of(&client, version, node, driver).await {
            for hold in budget_holds(&rules) {
                eprintln!("held: {hold}");
            }
        }
        if let Some(selected) = &selected {
            say_stuck(selected);
        }
    }
    code
}

/// What `--pod-selector` evicts on the node and what it leaves, from a
/// drain-check of the node whose unselected pods are set apart.
async fn select(
    client: &kube::Client,
    args: &DrainArgs,
    selector: &str,
    slices: &[ResourceSlice],
) -> Result<SelectedEviction, String> {
    let (node, driver) = (args.node.as_str(), args.driver.as_deref());
    let reader = Reader::new(client.clone());
    let scope = DrainScope {
        finished_grace: args.finished_grace.0,
        ..DrainScope::new(node, driver)
    };
    let now = Timestamp::now();
    let (snapshot, selected) = reader
        .for_node_selected(scope, now, selector)
        .await
        .map_err(|e| format!("--pod-selector {selector:?}: {e}"))?;
    let report = check(&snapshot, scope, now).keep_unselected(&selected);
    Ok(selected_eviction(
        node,
        &node_devices(node, driver, slices),
        &report.kept,
        &report.blocking,
    ))
}

/// Says which devices `--pod-selector` leaves in use, and by whom, and
/// which selected pods it cannot evict.
fn say_kept(selected: &SelectedEviction) {
    for (device, pods) in &selected.kept {
        let pods: Vec<&str> = pods.iter().map(String::as_str).collect();
        eprintln!(
            "kept: device {device} stays in use by {} (not selected by --pod-selector); its rule only cordons",
            pods.join(", ")
        );
    }
    say_stuck(selected);
}

/// The selected pods `--pod-selector` cannot evict, one line each.
fn say_stuck(selected: &SelectedEviction) {
    for (pod, devices) in &selected.stuck {
        let devices: Vec<String> = devices.iter().map(ToString::to_string).collect();
        eprintln!(
            "held: pod {pod} is selected but not evicted: its device(s) {} are shared with pods \
             --pod-selector does not select; drain without the selector, or widen it",
            devices.join(", ")
        );
    }
}

fn failed(e: String) -> u8 {
    eprintln!("error: {e}");
    exit::INCOMPLETE
}

/// `--dry-run`: the plan's rules as previews (`None`), what each says it
/// would evict, then the node's preview rules removed again: those this
/// run made and those an interrupted dry run left (a drain's own rules
/// cordon or evict, and stay). Interrupted itself (Ctrl-C, SIGTERM) while
/// it waits, it removes the rules it made before it ends.
async fn dry_run(
    client: &kube::Client,
    version: RulesVersion,
    args: &DrainArgs,
    planned: &[PlannedRule],
) -> u8 {
    let node = args.node.as_str();
    let ensured = match ensure_rules(client, version, node, planned, Created::Preview).await {
        Ok(ensured) => ensured,
        Err(e) => return failed(e),
    };
    let previewing: Vec<String> = ensured
        .rules
        .iter()
        .filter(|r| r.data["spec"]["taint"]["effect"] == "None")
        .filter_map(|r| r.metadata.name.clone())
        .collect();
    let waited = tokio::select! {
        said = previews(client, version, &previewing, args.preview_timeout.0) => Some(said),
        () = interrupted() => None,
    };
    let Some(said) = waited else {
        return match delete_rules(client, version, &ensured.created).await {
            Ok(_) => {
                eprintln!(
                    "dry run interrupted: nothing evicted, the preview rules it made removed"
                );
                exit::INCOMPLETE
            }
            Err(e) => failed(format!(
                "dry run interrupted, and its preview rules (effect None, evicting nobody) not removed: {e}; \
                 `uncordon {node}` removes them"
            )),
        };
    };
    for (name, said) in said {
        match said {
            Some(message) => eprintln!("preview {name}: {message}"),
            None => eprintln!(
                "preview {name}: no figures yet (is a device-taint eviction controller running, with DRADeviceTaintRules on?)"
            ),
        }
    }
    let draining = ensured.rules.len() - previewing.len();
    if draining > 0 {
        eprintln!(
            "node {node} is being drained already ({draining} of {} rules cordon or evict); `uncordon {node}` ends it",
            ensured.rules.len()
        );
    }
    // Every preview rule of the node: this plan's and, left by a dry run
    // killed outright, another's (with or without --pod-selector).
    let removing: Vec<String> = match rules_of(client, version, node, args.driver.as_deref()).await
    {
        Ok(rules) => rules
            .into_iter()
            .filter(|r| r.data["spec"]["taint"]["effect"] == "None")
            .filter_map(|r| r.metadata.name)
            .collect(),
        Err(e) => return failed(e),
    };
    if let Err(e) = delete_rules(client, version, &removing).await {
        return failed(e);
    }
    eprintln!("dry run: nothing evicted, the preview rules removed; run `drain {node}` to drain");
    exit::CLEAN
}

/// Resolves when the process is asked to stop: Ctrl-C (SIGINT) or SIGTERM.
#[cfg(unix)]
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut terminate) = signal(SignalKind::terminate()) else {
        // Without a SIGTERM handler, Ctrl-C still counts.
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

/// Resolves when the process is asked to stop: Ctrl-C.
#[cfg(not(unix))]
async fn interrupted() {
    let _ = tokio::signal::ctrl_c().await;
}
