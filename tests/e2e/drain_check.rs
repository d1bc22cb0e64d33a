//! `drain-check` and `audit` against the real API server, run as the
//! binaries an admin runs, with the chart's read-only ClusterRole. The test
//! plays scheduler and kubelet: Node objects, ResourceSlices, allocations,
//! reservations and pod phases are written by hand.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::ensure;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::*;
use crate::rbac::INSPECTOR_ROLE;

const GPU_NODE: &str = "drain-gpu-1";
const OTHER_NODE: &str = "drain-gpu-2";
const GPU_DRIVER: &str = "gpu.example.com";
const NIC_DRIVER: &str = "nic.example.com";

/// What one run of a command printed and how it ended.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", self.stdout, self.stderr))
    }

    /// `type` and claim name of each entry of a report list.
    pub fn entries(&self, list: &str) -> Vec<(String, String)> {
        self.json()[list]
            .as_array()
            .unwrap_or_else(|| panic!("no {list} in {}", self.stdout))
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap_or_default().to_string(),
                    e["claim"]["name"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }
}

fn binary(name: &str) -> PathBuf {
    let controller = PathBuf::from(env!("CARGO_BIN_EXE_dra-claim-controller"));
    match name {
        // A package of its own (it links no controller), built beside the
        // controller by `cargo test` of the workspace.
        "kubectl-dra" => {
            let plugin = controller.with_file_name("kubectl-dra");
            assert!(
                plugin.is_file(),
                "{} not built: run `cargo build -p kubectl-dra` (cargo test of the workspace does)",
                plugin.display()
            );
            plugin
        }
        _ => controller,
    }
}

pub fn command(bin: &str, kubeconfig: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(binary(bin));
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

pub async fn run(bin: &str, kubeconfig: &Path, args: &[&str]) -> Run {
    run_within(bin, kubeconfig, args, Duration::from_secs(60)).await
}

/// [`run`], for a command that may take up to `within`.
pub async fn run_within(bin: &str, kubeconfig: &Path, args: &[&str], within: Duration) -> Run {
    let out = tokio::time::timeout(within, command(bin, kubeconfig, args).output())
        .await
        .unwrap_or_else(|_| panic!("{bin} {args:?} did not finish within {within:?}"))
        .unwrap_or_else(|e| panic!("{bin} {args:?}: {e}"));
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    println!("{bin} {} -> exit {}", args.join(" "), run.code);
    run
}

fn selector_by_name(node: &str) -> Value {
    json!({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]})
}

fn rack_selector(rack: &str) -> Value {
    json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "example.com/rack", "operator": "In", "values": [rack]}]}]})
}

/// What a scheduler writes for one device.
fn allocation_of(driver: &str, pool: &str, device: &str, node_selector: Value) -> Value {
    json!({
        "devices": {"results": [{"request": "req-0", "driver": driver, "pool": pool, "device": device}]},
        "nodeSelector": node_selector,
    })
}

/// Two GPU nodes in different racks, a node-local GPU pool on each and a
/// network-attached NIC pool serving rack r1.
async fn create_nodes_and_slices(t: &TestCtx) {
    let nodes: Api<Node> = Api::all(t.client.clone());
    for (name, rack) in [(GPU_NODE, "r1"), (OTHER_NODE, "r2")] {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"example.com/rack": rack}},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let slices: Api<ResourceSlice> = Api::all(t.client.clone());
    let devices = |names: &[&str]| names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>();
    let docs = [
        json!({"metadata": {"name": GPU_NODE}, "spec": {
            "driver": GPU_DRIVER, "nodeName": GPU_NODE,
            "pool": {"name": GPU_NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": devices(&["gpu-0", "gpu-1", "gpu-2", "gpu-3"])}}),
        json!({"metadata": {"name": OTHER_NODE}, "spec": {
            "driver": GPU_DRIVER, "nodeName": OTHER_NODE,
            "pool": {"name": OTHER_NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": devices(&["gpu-0"])}}),
        json!({"metadata": {"name": "fabric-r1"}, "spec": {
            "driver": NIC_DRIVER, "nodeSelector": rack_selector("r1"),
            "pool": {"name": "fabric-r1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices(&["port-0", "port-1"])}}),
    ];
    for doc in docs {
        let slice: ResourceSlice = serde_json::from_value(doc).unwrap();
        slices.create(&PostParams::default(), &slice).await.unwrap();
    }
}

async fn wait_for_stderr(child: &mut tokio::process::Child, needle: &str) -> String {
    let stderr = child.stderr.as_mut().expect("piped stderr");
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    // The whole line that names the needle.
    let complete = |seen: &str| seen.find(needle).is_some_and(|i| seen[i..].contains('\n'));
    while !complete(&seen) {
        let n = tokio::time::timeout_at(deadline, stderr.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {needle:?} on stderr within 60s: {seen}"))
            .expect("read stderr");
        assert!(n > 0, "stderr closed before {needle:?}: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    seen
}

/// The issue's cases in one story on one server: a running consumer
/// blocks; `--wait` turns that into clean when the pod finishes and the
/// controller cleans up; a network-attached device is attributed to the
/// nodes its slice selects; a leak warns and shows in the controller's
/// gauge; with the controller stopped, a finished pod's reservation is
/// stale (2, `--strict` 1); a token without rights gets 3; `audit` and the
/// kubectl plugin report the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_check_and_audit() {
    let Some(mut t) =
        TestCtx::isolated("drain_check_and_audit", ControllerOpts::default(), 1).await
    else {
        return;
    };
    let cluster = &t.isolated_env().cluster;
    let inspector = cluster
        .service_account_kubeconfig("drain-checker", Some(INSPECTOR_ROLE))
        .await
        .expect("inspector identity");
    let nobody = cluster
        .service_account_kubeconfig("nobody", None)
        .await
        .expect("identity without rights");
    create_nodes_and_slices(&t).await;
    let check = |node: &'static str, extra: &'static [&'static str]| {
        let inspector = inspector.clone();
        async move {
            let mut args = vec!["drain-check", "--node", node, "-o", "json"];
            args.extend_from_slice(extra);
            run("dra-claim-controller", &inspector, &args).await
        }
    };

    // Nothing yet: clean.
    let r = check(GPU_NODE, &[]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["verdict"], "Clean");

    // A running consumer of a generated claim on the node: blocked.
    t.create_template("tmpl").await;
    let trainer = t
        .create_pod("trainer", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    let claim = t.wait_recorded("trainer", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    t.bind_pod("trainer", GPU_NODE).await;
    t.allocate_devices(
        &claim,
        allocation_of(GPU_DRIVER, GPU_NODE, "gpu-0", selector_by_name(GPU_NODE)),
        json!([pod_ref(&trainer)]),
    )
    .await;
    t.set_pod_phase("trainer", "Running").await;
    let r = check(GPU_NODE, &[]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert_eq!(r.entries("blocking"), vec![("InUse".into(), claim.clone())]);
    let report = r.json();
    assert_eq!(report["kind"], "DrainCheckReport");
    assert_eq!(report["apiVersion"], "dra-claim-controller.io/v1alpha1");
    assert_eq!(report["blocking"][0]["subject"]["name"], "trainer");
    assert_eq!(report["blocking"][0]["subject"]["state"], "Running");
    assert_eq!(report["blocking"][0]["devices"][0]["device"], "gpu-0");
    let r = check(OTHER_NODE, &[]).await;
    assert_eq!(r.code, 0, "another node is not concerned: {r:?}");
    let r = run(
        "dra-claim-controller",
        &inspector,
        &["drain-check", "--node", GPU_NODE, "--driver", NIC_DRIVER],
    )
    .await;
    assert_eq!(r.code, 0, "another driver is not concerned: {r:?}");
    let table = run(
        "dra-claim-controller",
        &inspector,
        &["drain-check", "--node", GPU_NODE],
    )
    .await;
    assert_eq!(table.code, 1);
    println!("{}", table.stdout);
    assert!(
        table.stdout.contains("BLOCKING")
            && table.stdout.contains(&claim)
            && table.stdout.contains("trainer"),
        "{}",
        table.stdout
    );

    // --wait: blocked until the pod finishes and the controller releases
    // and deletes its claim, then clean.
    let mut waiting = command(
        "dra-claim-controller",
        &inspector,
        &[
            "drain-check",
            "--node",
            GPU_NODE,
            "--wait",
            "90s",
            "--interval",
            "1s",
        ],
    )
    .spawn()
    .expect("start drain-check --wait");
    let said = wait_for_stderr(&mut waiting, "waiting for node").await;
    assert!(said.contains("1 blocking"), "{said}");
    t.set_pod_phase("trainer", "Succeeded").await;
    let status = tokio::time::timeout(Duration::from_secs(120), waiting.wait())
        .await
        .expect("drain-check --wait ends within its 90s")
        .unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "--wait ends clean once the claim is released"
    );
    // (--wait may end once the claim is released, before it is deleted.)
    wait_for(
        "the controller deletes the generated claim",
        TIMEOUT,
        async || {
            ensure!(t.claim(&claim).await.is_none(), "claim {claim} still there");
            Ok(())
        },
    )
    .await;
    // A node nobody knows is not "clean": the name is probably a typo.
    let r = check("drain-gpu-l", &[]).await;
    assert_eq!(r.code, 3, "{r:?}");
    assert_eq!(r.json()["verdict"], "Incomplete");
    assert!(
        r.json()["error"].as_str().unwrap().contains("not found"),
        "{r:?}"
    );

    // A network-attached NIC port allocated for nobody: a leak on every
    // node of rack r1, none on rack r2; the controller's gauge shows it.
    t.create_claim(json!({"name": "fabric-port"})).await;
    t.allocate_devices(
        "fabric-port",
        allocation_of(NIC_DRIVER, "fabric-r1", "port-0", rack_selector("r1")),
        json!([]),
    )
    .await;
    let r = check(GPU_NODE, &[]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(
        r.entries("warnings"),
        vec![("LeakedAllocation".into(), "fabric-port".into())]
    );
    assert_eq!(check(OTHER_NODE, &[]).await.code, 0);
    let controller = t.controller();
    wait_for("leak in dra_claim_controller_claims", TIMEOUT, async || {
        let text = controller.metrics_text().await?;
        ensure!(
            text.contains(r#"dra_claim_controller_claims{state="leaked_allocation"} 1"#),
            "gauge lines: {:?}",
            text.lines()
                .filter(|l| l.starts_with("dra_claim_controller_claims"))
                .collect::<Vec<_>>()
        );
        Ok(())
    })
    .await;
    t.claims()
        .delete("fabric-port", &DeleteParams::default())
        .await
        .unwrap();
    // The test holds the delete-protection finalizer as a scheduler would;
    // drop it so the claim goes.
    t.claims()
        .patch(
            "fabric-port",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .ok();
    wait_for("fabric-port gone", TIMEOUT, async || {
        ensure!(t.claim("fabric-port").await.is_none(), "still there");
        Ok(())
    })
    .await;

    // With the controller stopped, a finished pod's reservation stays:
    // warnings only, or blocking with --strict.
    for r in t.live_replicas() {
        r.terminate();
        r.current()
            .proc
            .wait_exit(Duration::from_secs(30))
            .await
            .expect("controller stops on SIGTERM");
    }
    t.create_claim(json!({"name": "shared-gpu"})).await;
    let worker = t
        .create_pod("worker", &[("gpu", Source::Claim("shared-gpu"))], None)
        .await;
    t.bind_pod("worker", GPU_NODE).await;
    t.allocate_devices(
        "shared-gpu",
        allocation_of(GPU_DRIVER, GPU_NODE, "gpu-1", selector_by_name(GPU_NODE)),
        json!([pod_ref(&worker)]),
    )
    .await;
    t.set_pod_phase("worker", "Running").await;
    assert_eq!(check(GPU_NODE, &[]).await.code, 1);
    t.set_pod_phase("worker", "Succeeded").await;
    let r = check(GPU_NODE, &[]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(
        r.entries("warnings"),
        vec![("StaleReservation".into(), "shared-gpu".into())]
    );
    assert_eq!(r.json()["warnings"][0]["subject"]["state"], "Succeeded");
    assert_eq!(check(GPU_NODE, &["--strict"]).await.code, 1);

    // audit, and the same through the kubectl plugin.
    for bin in ["dra-claim-controller", "kubectl-dra"] {
        let r = run(bin, &inspector, &["audit", "-A", "-o", "json"]).await;
        assert_eq!(r.code, 2, "{bin}: {r:?}");
        let report = r.json();
        assert_eq!(report["kind"], "AuditReport");
        assert_eq!(report["counts"]["StaleReservation"], 1, "{report}");
        assert_eq!(
            report["byNode"][GPU_NODE]["StaleReservation"], 1,
            "{report}"
        );
        assert_eq!(
            report["byDriver"][GPU_DRIVER]["StaleReservation"], 1,
            "{report}"
        );
    }
    // kubectl's conventions: the node as an argument, -o yaml|wide|name.
    let r = run("kubectl-dra", &inspector, &["drain-check", GPU_NODE]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stdout.contains("WARNINGS") && r.stdout.contains("StaleReservation"),
        "{}",
        r.stdout
    );
    println!("{}", r.stdout);
    let r = run(
        "kubectl-dra",
        &inspector,
        &["drain-check", GPU_NODE, "-o", "yaml"],
    )
    .await;
    assert_eq!(r.code, 2, "{r:?}");
    let yaml: serde_yaml::Value = serde_yaml::from_str(&r.stdout).expect("-o yaml is YAML");
    assert_eq!(yaml["kind"].as_str(), Some("DrainCheckReport"));
    assert_eq!(
        yaml["warnings"][0]["type"].as_str(),
        Some("StaleReservation")
    );
    let r = run(
        "kubectl-dra",
        &inspector,
        &["drain-check", GPU_NODE, "-o", "name"],
    )
    .await;
    assert_eq!(
        r.stdout.trim(),
        "resourceclaim.resource.k8s.io/shared-gpu",
        "{r:?}"
    );
    let r = run(
        "kubectl-dra",
        &inspector,
        &["drain-check", GPU_NODE, "-o", "wide"],
    )
    .await;
    assert!(r.stdout.contains("POD NODE"), "{}", r.stdout);
    // audit covers the context's namespace unless told otherwise (-n, -A).
    let r = run("kubectl-dra", &inspector, &["audit", "-n", &t.ns]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stdout.contains("BY NODE") && r.stdout.contains(GPU_NODE),
        "{}",
        r.stdout
    );
    println!("{}", r.stdout);
    let r = run("kubectl-dra", &inspector, &["audit"]).await;
    assert_eq!(
        r.code, 0,
        "the context's namespace (default) has none: {r:?}"
    );

    // Without rights: the check cannot be completed, and says why.
    let r = run(
        "dra-claim-controller",
        &nobody,
        &["drain-check", "--node", GPU_NODE],
    )
    .await;
    assert_eq!(r.code, 3, "{r:?}");
    assert!(
        r.stderr.contains("permission denied") && r.stderr.contains("inspector"),
        "{}",
        r.stderr
    );
    let r = run("kubectl-dra", &nobody, &["audit", "-A"]).await;
    assert_eq!(r.code, 3, "{r:?}");
    let r = run(
        "kubectl-dra",
        &nobody,
        &["drain-check", "--node", GPU_NODE, "-o", "json"],
    )
    .await;
    assert_eq!(r.code, 3, "{r:?}");
    assert_eq!(
        r.json()["verdict"],
        "Incomplete",
        "scripts get a document too"
    );
    t.finish();
}

/// The chart's alert on leaked allocations, evaluated by a real Prometheus
/// scraping the controller: the gauge follows a leak made here, the alert
/// fires (its `for` shortened to 2s), and every expression of the chart's
/// dashboard is valid PromQL against the same data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_gauge_and_alert_in_prometheus() {
    const NAME: &str = "claim_gauge_and_alert_in_prometheus";
    let Some(prometheus_bin) = crate::prometheus::binary() else {
        println!("SKIP: {NAME}: no prometheus binary (PROMETHEUS_BIN, or prometheus on PATH)");
        return;
    };
    let rendered = match crate::helm::render_chart(
        "dra-claim-controller",
        "dra-system",
        &[
            ("prometheusRule.enabled", "true"),
            ("grafanaDashboard.enabled", "true"),
            ("serviceMonitor.enabled", "true"),
            // So that promtool and Prometheus load the headroom alert too.
            ("headroom.enabled", "true"),
            ("prometheusRule.alerts.leakedAllocations.for", "2s"),
        ],
    ) {
        Ok(Some(yaml)) => yaml,
        Ok(None) => {
            println!("SKIP: {NAME}: Helm is not available to render the chart's rules");
            return;
        }
        Err(e) => panic!("render chart: {e}"),
    };
    let docs: Vec<Value> = crate::helm::parse_documents(&rendered)
        .unwrap()
        .into_iter()
        .map(|d| serde_json::to_value(d).unwrap())
        .collect();
    let groups = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .map(|d| d["spec"]["groups"].clone())
        .expect("PrometheusRule rendered");
    let dashboard: Value = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .and_then(|d| {
            d["data"]
                .as_object()?
                .values()
                .next()?
                .as_str()
                .map(str::to_string)
        })
        .map(|s| serde_json::from_str(&s).unwrap())
        .expect("dashboard ConfigMap rendered");

    let monitor = docs
        .iter()
        .find(|d| d["kind"] == "ServiceMonitor")
        .expect("ServiceMonitor rendered")
        .clone();

    // The secure port, scraped as the rendered ServiceMonitor says, with
    // the token of a service account bound to the chart's reader role.
    let opts = ControllerOpts {
        metrics_secure: true,
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated(NAME, opts, 1).await else {
        return;
    };
    let dir = t.isolated_env().cluster.dir.clone();
    let admin = t.isolated_env().cluster.admin_client().await.unwrap();
    let token = crate::rbac::service_account_with_role(
        &admin,
        "prometheus",
        Some(crate::rbac::METRICS_READER_ROLE),
    )
    .await
    .unwrap();
    let token_file = dir.join("prometheus-token");
    std::fs::write(&token_file, token).unwrap();
    let scrape = crate::prometheus::Scrape::from_service_monitor(&monitor, &token_file);
    assert_eq!(scrape.scheme, "https", "{monitor:?}");
    let metrics = t.controller().metrics;
    let prom = crate::prometheus::Prometheus::start_scraping(
        &prometheus_bin,
        &dir,
        &[metrics],
        &scrape,
        &groups,
    )
    .await
    .expect("start prometheus");
    if let Some(promtool) = crate::prometheus::promtool(&prometheus_bin) {
        let out = std::process::Command::new(promtool)
            .args(["check", "rules"])
            .arg(dir.join("prometheus").join("rules.yaml"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool check rules: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let leaked = r#"max(dra_claim_controller_claims{state="leaked_allocation"})"#;
    wait_for("gauge scraped, zero", Duration::from_secs(60), async || {
        ensure!(prom.scalar(leaked).await? == Some(0.0), "not yet");
        Ok(())
    })
    .await;

    t.create_claim(json!({"name": "forgotten"})).await;
    t.allocate_devices(
        "forgotten",
        allocation_of(GPU_DRIVER, GPU_NODE, "gpu-0", selector_by_name(GPU_NODE)),
        json!([]),
    )
    .await;
    wait_for(
        "leak seen by Prometheus, alert firing",
        Duration::from_secs(60),
        async || {
            ensure!(prom.scalar(leaked).await? == Some(1.0), "gauge not 1 yet");
            let alerts = prom.alerts().await?;
            ensure!(
                alerts.contains(&("DRAClaimLeakedAllocations".into(), "firing".into())),
                "alerts: {alerts:?}"
            );
            Ok(())
        },
    )
    .await;

    // Pool capacity from the controller's memory: the GPU node's pool of
    // four, one of them taken by the leaked claim.
    create_nodes_and_slices(&t).await;
    let pool = |state: &str| {
        format!(
            r#"sum(dra_claim_controller_pool_devices{{driver="{GPU_DRIVER}",pool="{GPU_NODE}",state="{state}"}})"#
        )
    };
    wait_for("the pool's devices by state in Prometheus", Duration::from_secs(60), async || {
        for (state, want) in [("total", 4.0), ("allocated", 1.0), ("free", 3.0), ("unavailable", 0.0)] {
            let got = prom.scalar(&pool(state)).await?;
            ensure!(got == Some(want), "{state}: {got:?}, want {want}");
        }
        // The admin guide's question, per driver: is anything left?
        let free = format!(
            r#"sum by (driver) (dra_claim_controller_pool_devices{{driver="{GPU_DRIVER}",state="free"}})"#
        );
        ensure!(prom.scalar(&free).await? == Some(4.0), "free per driver (3 + the other node's 1)");
        Ok(())
    })
    .await;

    // `pools` prints the same numbers, read from the API server.
    let admin_kubeconfig = t.isolated_env().cluster.admin_kubeconfig.clone();
    let pools = run(
        "dra-claim-controller",
        &admin_kubeconfig,
        &["pools", "--driver", GPU_DRIVER, "-o", "json"],
    )
    .await;
    assert_eq!(pools.code, 0, "{pools:?}");
    let gpu = pools
        .json()
        .as_array()
        .and_then(|a| a.iter().find(|p| p["pool"] == GPU_NODE).cloned())
        .unwrap_or_else(|| panic!("no {GPU_NODE} pool: {pools:?}"));
    assert_eq!(
        [&gpu["total"], &gpu["allocated"], &gpu["free"], &gpu["node"]],
        [&json!(4), &json!(1), &json!(3), &json!(GPU_NODE)],
        "{gpu}"
    );

    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(!exprs.is_empty());
    for expr in &exprs {
        prom.query(expr)
            .await
            .unwrap_or_else(|e| panic!("dashboard query {expr:?} is not valid PromQL here: {e:#}"));
    }
    let by_state = prom
        .query("max by (state) (dra_claim_controller_claims)")
        .await
        .unwrap();
    assert_eq!(
        by_state.len(),
        4,
        "the dashboard panel shows every state: {by_state:?}"
    );
    println!(
        "prometheus: leak seen, DRAClaimLeakedAllocations firing, {} dashboard queries valid",
        exprs.len()
    );
    t.finish();
}
