//! ResourcePoolStatusRequests (`DRAResourcePoolStatus`, alpha,
//! `resource.k8s.io/v1alpha3`) answered as kube-controller-manager 1.36's
//! `resourcepoolstatusrequest-controller` answers them: the same requests
//! on the same pools get the same status, word for word, from ours and from
//! the reference. Where ours goes further (a request whose pool is still
//! being published is answered, not dropped), the reference is shown
//! leaving it unanswered.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::api::resource::v1alpha3::ResourcePoolStatusRequest;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use crate::cluster::{ALL_CONTROLLER_GATES, ApiserverOptions, ControllerOpts};
use crate::ctx::TestCtx;
use crate::k8s::*;

const DRIVER: &str = "pools.example.com";
const OTHER_NODE: &str = "e2e-node-2";
const TIMEOUT: Duration = Duration::from_secs(45);

fn apiserver() -> ApiserverOptions {
    ApiserverOptions {
        feature_gates: vec!["DRAResourcePoolStatus=true".into()],
        runtime_config: vec!["resource.k8s.io/v1alpha3=true".into()],
        ..Default::default()
    }
}

fn gates() -> String {
    format!("{ALL_CONTROLLER_GATES},DRAResourcePoolStatus=true")
}

/// One slice of `pool` at `generation`, one of `count`, with `devices`
/// devices named after the slice.
async fn publish(
    t: &TestCtx,
    name: &str,
    (driver, pool): (&str, &str),
    (generation, count): (i64, i64),
    node: &str,
    devices: usize,
) {
    let slices: Api<ResourceSlice> = Api::all(t.client.clone());
    let devices: Vec<Value> = (0..devices)
        .map(|i| json!({"name": format!("{name}-{i}")}))
        .collect();
    let slice = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "nodeName": node,
            "devices": devices,
        },
    });
    slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(slice).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("create slice {name}: {e}"));
}

/// A claim allocated one device of `driver`/`pool`, used by nobody.
async fn allocated(t: &TestCtx, name: &str, (driver, pool): (&str, &str), device: &str) {
    t.create_claim(json!({"name": name})).await;
    let allocation = json!({"devices": {"results": [{
        "request": "req-0", "driver": driver, "pool": pool, "device": device,
    }]}});
    t.allocate_devices(name, allocation, json!([])).await;
}

fn requests(t: &TestCtx) -> Api<ResourcePoolStatusRequest> {
    Api::all(t.client.clone())
}

async fn ask(t: &TestCtx, name: &str, spec: Value) {
    let request = json!({
        "apiVersion": "resource.k8s.io/v1alpha3",
        "kind": "ResourcePoolStatusRequest",
        "metadata": {"name": name},
        "spec": spec,
    });
    requests(t)
        .create(
            &PostParams::default(),
            &serde_json::from_value(request).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("create ResourcePoolStatusRequest {name}: {e}"));
}

/// The request's status as `kubectl get -o json` shows it, the condition's
/// time left out (it differs from run to run); `None` while unanswered.
async fn answer_of(t: &TestCtx, name: &str) -> anyhow::Result<Option<Value>> {
    let request = requests(t).get(name).await?;
    let Some(status) = request.status else {
        return Ok(None);
    };
    let mut status = serde_json::to_value(status)?;
    for condition in status["conditions"]
        .as_array_mut()
        .context("an answer without conditions")?
    {
        ensure!(
            condition["lastTransitionTime"].is_string(),
            "no lastTransitionTime: {condition}"
        );
        condition
            .as_object_mut()
            .unwrap()
            .remove("lastTransitionTime");
    }
    Ok(Some(status))
}

async fn wait_answered(t: &TestCtx, name: &str) -> Value {
    wait_for(&format!("request {name} answered"), TIMEOUT, async || {
        answer_of(t, name).await?.context("no status yet")
    })
    .await
}

fn complete(message: &str) -> Value {
    json!([{"type": "Complete", "status": "True", "reason": "CalculationComplete", "message": message}])
}

/// pool-a: one slice on the node, 4 devices, 2 allocated (and a claim of
/// another driver's pool of the same name, not counted); pool-b: two slices
/// on two nodes at generation 2 (generation 1, 8 devices, left behind);
/// another driver's pool. Four requests, answered alike by both. All exist
/// before the controller starts: an answer is written once, from what the
/// controller has seen, so a request racing its pools' slices could be
/// answered without them (by either controller).
async fn publish_pools_and_ask(t: &TestCtx) {
    publish(t, "pool-a", (DRIVER, "pool-a"), (1, 1), NODE, 4).await;
    publish(t, "pool-b-old", (DRIVER, "pool-b"), (1, 1), NODE, 8).await;
    publish(t, "pool-b-1", (DRIVER, "pool-b"), (2, 2), NODE, 2).await;
    publish(t, "pool-b-2", (DRIVER, "pool-b"), (2, 2), OTHER_NODE, 2).await;
    publish(
        t,
        "other-a",
        ("other.example.com", "pool-a"),
        (1, 1),
        NODE,
        3,
    )
    .await;
    allocated(t, "uses-a0", (DRIVER, "pool-a"), "pool-a-0").await;
    allocated(t, "uses-a1", (DRIVER, "pool-a"), "pool-a-1").await;
    allocated(
        t,
        "uses-other",
        ("other.example.com", "pool-a"),
        "other-a-0",
    )
    .await;
    ask(t, "all", json!({"driver": DRIVER})).await;
    ask(t, "only-b", json!({"driver": DRIVER, "poolName": "pool-b"})).await;
    ask(t, "first", json!({"driver": DRIVER, "limit": 1})).await;
    ask(t, "nothing", json!({"driver": "none.example.com"})).await;
}

async fn published_pools_answered(t: &TestCtx) -> BTreeMap<&'static str, Value> {
    let mut answers = BTreeMap::new();
    for name in ["all", "only-b", "first", "nothing"] {
        answers.insert(name, wait_answered(t, name).await);
    }
    answers
}

fn published_pools_answers() -> BTreeMap<&'static str, Value> {
    let pool_a = json!({"driver": DRIVER, "poolName": "pool-a", "generation": 1, "nodeName": NODE,
        "resourceSliceCount": 1, "totalDevices": 4, "allocatedDevices": 2, "availableDevices": 2,
        "unavailableDevices": 0});
    // Two nodes: no nodeName.
    let pool_b = json!({"driver": DRIVER, "poolName": "pool-b", "generation": 2,
        "resourceSliceCount": 2, "totalDevices": 4, "allocatedDevices": 0, "availableDevices": 4,
        "unavailableDevices": 0});
    BTreeMap::from([
        (
            "all",
            json!({"poolCount": 2, "pools": [pool_a.clone(), pool_b.clone()],
                "conditions": complete("Calculated status for 2 pools")}),
        ),
        (
            "only-b",
            json!({"poolCount": 1, "pools": [pool_b],
                "conditions": complete("Calculated status for 1 pools")}),
        ),
        (
            // poolCount before the limit, the message after it.
            "first",
            json!({"poolCount": 2, "pools": [pool_a],
                "conditions": complete("Calculated status for 1 pools")}),
        ),
        (
            "nothing",
            json!({"poolCount": 0, "conditions": complete("Calculated status for 0 pools")}),
        ),
    ])
}

/// Requests for pools still being published: pool-c gets its second slice
/// two seconds after the request, pool-d never gets its other two.
async fn unfinished_pools(t: &TestCtx) {
    publish(t, "pool-c-1", (DRIVER, "pool-c"), (1, 2), NODE, 2).await;
    publish(t, "pool-d-1", (DRIVER, "pool-d"), (1, 3), NODE, 2).await;
    ask(t, "waits", json!({"driver": DRIVER, "poolName": "pool-c"})).await;
    ask(
        t,
        "incomplete",
        json!({"driver": DRIVER, "poolName": "pool-d"}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    publish(t, "pool-c-2", (DRIVER, "pool-c"), (1, 2), OTHER_NODE, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_status_requests_answered_once_with_the_reference_counts() {
    const NAME: &str = "pool_status_requests_answered_once_with_the_reference_counts";
    let opts = ControllerOpts {
        feature_gates: gates(),
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated_with(NAME, opts, 0, &apiserver()).await else {
        return;
    };
    publish_pools_and_ask(&t).await;
    if !crate::podgroups::start_with_gate_rbac(&mut t, NAME, &gates()).await {
        return;
    }
    assert_eq!(
        published_pools_answered(&t).await,
        published_pools_answers()
    );

    // Answered once: a later allocation changes no answer.
    allocated(&t, "uses-a2", (DRIVER, "pool-a"), "pool-a-2").await;
    holds_for(
        "the answers to stay as written",
        Duration::from_secs(2),
        async || {
            let all = answer_of(&t, "all").await?;
            ensure!(
                all.as_ref() == published_pools_answers().get("all"),
                "{all:?}"
            );
            Ok(())
        },
    )
    .await;

    // Beyond the reference: a pool completed after the request is counted
    // whole, and one never completed is reported, not dropped.
    unfinished_pools(&t).await;
    assert_eq!(
        wait_answered(&t, "waits").await,
        json!({"poolCount": 1, "pools": [{"driver": DRIVER, "poolName": "pool-c", "generation": 1,
            "resourceSliceCount": 2, "totalDevices": 4, "allocatedDevices": 0, "availableDevices": 4,
            "unavailableDevices": 0}],
            "conditions": complete("Calculated status for 1 pools")})
    );
    assert_eq!(
        wait_answered(&t, "incomplete").await,
        json!({"poolCount": 1, "pools": [{"driver": DRIVER, "poolName": "pool-d", "generation": 1,
            "nodeName": NODE,
            "validationError": "pool pools.example.com/pool-d is incomplete: observed 1/3 slices at generation 1"}],
            "conditions": complete("Calculated status for 1 pools (1 incomplete)")})
    );

    // The reference's metrics, counted per driver.
    let metrics = t.controller().metrics_text().await.unwrap();
    for line in [
        "resourcepoolstatusrequest_controller_requests_processed_total{driver_name=\"pools.example.com\"} 5",
        "resourcepoolstatusrequest_controller_requests_processed_total{driver_name=\"none.example.com\"} 1",
        "resourcepoolstatusrequest_controller_request_processing_duration_seconds_count{driver_name=\"pools.example.com\"} 5",
        "dra_claim_controller_optional_api_served{api=\"resourcepoolstatusrequests.resource.k8s.io\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line:?} in the metrics"
        );
    }
    assert!(
        !metrics.contains("resourcepoolstatusrequest_controller_request_processing_errors_total{"),
        "no write failed"
    );
    t.finish();
}

/// An API server that does not serve the requests' API (the gate on here,
/// not there) closes only that door: claims are still made, the process is
/// ready and runs on, and `/readyz` and the metric say what is missing and
/// how to serve it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unserved_request_api_closes_only_its_own_door() {
    const NAME: &str = "an_unserved_request_api_closes_only_its_own_door";
    let opts = ControllerOpts {
        feature_gates: gates(),
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated(NAME, opts, 0).await else {
        return;
    };
    if !crate::podgroups::start_with_gate_rbac(&mut t, NAME, &gates()).await {
        return;
    }
    t.create_template("tmpl").await;
    t.create_pod("pod", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    t.wait_recorded("pod", &["gpu"]).await;
    let health = t.controller().health;
    wait_for("/readyz to name the missing API", TIMEOUT, async || {
        let (code, body) = crate::rawhttp::get(health, "/readyz").await?;
        ensure!(
            code == 200
                && body.contains(
                    "optional API resourcepoolstatusrequests.resource.k8s.io: not served"
                )
                && body.contains("--runtime-config=resource.k8s.io/v1alpha3=true"),
            "{code} {body}"
        );
        Ok(())
    })
    .await;
    let metrics = t.controller().metrics_text().await.unwrap();
    let line = "dra_claim_controller_optional_api_served{api=\"resourcepoolstatusrequests.resource.k8s.io\"} 0";
    assert!(
        metrics.lines().any(|l| l == line),
        "missing {line:?} in the metrics"
    );
    assert_eq!(t.restarts(), 0, "a missing API never stops the process");
    t.finish();
}

/// Acting as 1.37 (`--reference-release=1.37`), the counting is 1.37's:
/// a device two claims share counts once, and devices tainted `NoSchedule`
/// by their slice or `NoExecute` by a DeviceTaintRule are unavailable
/// (a `None` rule changes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_status_requests_counted_as_1_37_when_acting_as_1_37() {
    const NAME: &str = "pool_status_requests_counted_as_1_37_when_acting_as_1_37";
    let opts = ControllerOpts {
        feature_gates: gates(),
        extra_args: vec!["--reference-release=1.37".into()],
        ..ControllerOpts::default()
    };
    let mut apiserver = apiserver();
    let rules = crate::device_taints::rules_apiserver();
    apiserver.feature_gates.extend(rules.feature_gates);
    apiserver.runtime_config.extend(rules.runtime_config);
    let Some(mut t) = TestCtx::isolated_with(NAME, opts, 0, &apiserver).await else {
        return;
    };
    let pool = "pool-137";
    let devices = json!([
        {"name": "d0"}, {"name": "d1"},
        {"name": "d2", "taints": [{"key": "k", "effect": "NoSchedule"}]},
        {"name": "d3"}, {"name": "d4"},
    ]);
    let slice = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": pool},
        "spec": {"driver": crate::device_taints::DRIVER, "nodeName": NODE,
                 "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    });
    Api::<ResourceSlice>::all(t.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(slice).unwrap(),
        )
        .await
        .expect("create slice");
    let driver = crate::device_taints::DRIVER;
    allocated(&t, "shares-d0", (driver, pool), "d0").await;
    allocated(&t, "also-d0", (driver, pool), "d0").await;
    let one = |d: &str| json!({"driver": driver, "pool": pool, "device": d});
    crate::device_taints::create_rule(&t, "drain-d3", "NoExecute", one("d3")).await;
    crate::device_taints::create_rule(&t, "preview-d4", "None", one("d4")).await;
    ask(&t, "as-1-37", json!({"driver": driver})).await;
    // Started after: its first lists hold everything the answer counts.
    if !crate::podgroups::start_with_gate_rbac(&mut t, NAME, &gates()).await {
        return;
    }
    assert_eq!(
        wait_answered(&t, "as-1-37").await,
        json!({"poolCount": 1, "pools": [{"driver": driver, "poolName": pool, "generation": 1,
            "nodeName": NODE, "resourceSliceCount": 1, "totalDevices": 5, "allocatedDevices": 1,
            "availableDevices": 2, "unavailableDevices": 2}],
            "conditions": complete("Calculated status for 1 pools")})
    );
    // Two claims on one device is a double allocation the test's end
    // check rightly refuses: the second goes.
    t.claims()
        .delete("also-d0", &Default::default())
        .await
        .expect("delete claim also-d0");
    t.wait_claim_gone("also-d0").await;
    t.finish();
}

/// The same requests answered by kube-controller-manager 1.36's
/// controller: the same four answers; the two requests whose pool was
/// incomplete when they came stay unanswered (it drops them after six
/// tries within a fraction of a second, and no slice event brings them
/// back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_pool_status_requests() {
    let Some((t, reference)) = crate::reference::isolated_with_reference(
        "differential_pool_status_requests",
        &apiserver(),
        &["resourcepoolstatusrequest-controller"],
        &["--feature-gates=DRAResourcePoolStatus=true".into()],
        publish_pools_and_ask,
    )
    .await
    else {
        return;
    };
    assert_eq!(
        published_pools_answered(&t).await,
        published_pools_answers(),
        "the reference answers as ours does"
    );
    unfinished_pools(&t).await;
    holds_for(
        "the reference to leave both requests unanswered",
        Duration::from_secs(5),
        async || {
            for name in ["waits", "incomplete"] {
                let answer = answer_of(&t, name).await?;
                ensure!(answer.is_none(), "{name} answered: {answer:?}");
            }
            Ok(())
        },
    )
    .await;
    drop(reference);
    t.finish();
}

/// An answer the API server refuses as invalid (here an admission policy
/// allowing one pool per answer) ends the request with a `Failed`
/// condition that quotes the refusal, where its author looks; an answer
/// the policy allows is written as always. kube-controller-manager would
/// retry six times, then leave the request pending until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_api_server_refuses_ends_failed_with_the_reason() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    const NAME: &str = "an_answer_the_api_server_refuses_ends_failed_with_the_reason";
    let opts = ControllerOpts {
        feature_gates: gates(),
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated_with(NAME, opts, 0, &apiserver()).await else {
        return;
    };
    let policy = json!({
        "metadata": {"name": "one-pool-per-answer"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1alpha3"],
                "operations": ["UPDATE"], "resources": ["resourcepoolstatusrequests/status"],
            }]},
            "validations": [{
                "expression": "!has(object.status) || !has(object.status.pools) || size(object.status.pools) <= 1",
                "message": "an answer may report one pool at most",
                "reason": "Invalid",
            }],
        },
    });
    let binding = json!({
        "metadata": {"name": "one-pool-per-answer"},
        "spec": {"policyName": "one-pool-per-answer", "validationActions": ["Deny"]},
    });
    Api::<ValidatingAdmissionPolicy>::all(t.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(policy).unwrap(),
        )
        .await
        .expect("create the admission policy");
    Api::<ValidatingAdmissionPolicyBinding>::all(t.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding).unwrap(),
        )
        .await
        .expect("create its binding");
    publish(&t, "pool-a", (DRIVER, "pool-a"), (1, 1), NODE, 2).await;
    publish(&t, "pool-b", (DRIVER, "pool-b"), (1, 1), NODE, 3).await;

    // The policy is in force once a two-pool status is refused (the API
    // server loads policies a moment after they are created).
    ask(&t, "probe", json!({"driver": DRIVER})).await;
    wait_for(
        "the policy to refuse a two-pool status",
        TIMEOUT,
        async || {
            let mut probe = requests(&t).get("probe").await?;
            probe.status = serde_json::from_value(json!({"poolCount": 2, "pools": [
            {"driver": DRIVER, "poolName": "pool-a", "generation": 1},
            {"driver": DRIVER, "poolName": "pool-b", "generation": 1}]}))?;
            match requests(&t)
                .replace_status("probe", &PostParams::default(), &probe)
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 422 => Ok(()),
                other => anyhow::bail!("not refused yet: {:?}", other.map(|_| ())),
            }
        },
    )
    .await;
    requests(&t)
        .delete("probe", &Default::default())
        .await
        .expect("delete the probe");

    ask(&t, "all", json!({"driver": DRIVER})).await;
    ask(
        &t,
        "only-b",
        json!({"driver": DRIVER, "poolName": "pool-b"}),
    )
    .await;
    if !crate::podgroups::start_with_gate_rbac(&mut t, NAME, &gates()).await {
        return;
    }
    let refused = wait_answered(&t, "all").await;
    assert_eq!(refused["poolCount"], json!(0), "{refused}");
    assert_eq!(refused.get("pools"), None, "{refused}");
    let condition = &refused["conditions"][0];
    assert_eq!(
        (&condition["type"], &condition["reason"]),
        (&json!("Failed"), &json!("CalculationFailed")),
        "{refused}"
    );
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.starts_with("The API server refused the calculated status: ")
            && message.contains("an answer may report one pool at most"),
        "{message}"
    );
    assert_eq!(
        wait_answered(&t, "only-b").await["conditions"],
        complete("Calculated status for 1 pools")
    );
    // Both writes of the refused request count, the refused one as an error.
    let metrics = t.controller().metrics_text().await.unwrap();
    for line in [
        "resourcepoolstatusrequest_controller_requests_processed_total{driver_name=\"pools.example.com\"} 3",
        "resourcepoolstatusrequest_controller_request_processing_errors_total{driver_name=\"pools.example.com\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line:?} in the metrics"
        );
    }
    t.finish();
}
