//! The chart's pre-scheduled-pods MutatingAdmissionPolicy, rendered with
//! real Helm and enforced by the real API server: which pods it rewrites and
//! how, and, with a real kube-scheduler, that a pod created with
//! `spec.nodeName` then runs on that node with its claim allocated.

use std::time::Duration;

use anyhow::{bail, ensure};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::admission;
use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::*;
use crate::nodes;

const ANNOTATION: &str = "dra-claim-controller.io/requested-node-name";
const SELECTED_LABEL: &str = "dra-policy";

fn name_term(node: &str) -> Value {
    json!({"key": "metadata.name", "operator": "In", "values": [node]})
}

/// A pod using claim `shared` (which need not exist for admission).
fn pod(name: &str, node: Option<&str>, extra_spec: Value, annotations: Value) -> Value {
    let mut pod = pod_manifest(name, &[("dev", Source::Claim("shared"))], node);
    for (k, v) in extra_spec.as_object().into_iter().flatten() {
        pod["spec"][k] = v.clone();
    }
    if !annotations.is_null() {
        pod["metadata"]["annotations"] = annotations;
    }
    pod
}

async fn create(api: &Api<Pod>, manifest: Value) -> Pod {
    let name = manifest["metadata"]["name"].clone();
    api.create(
        &PostParams::default(),
        &serde_json::from_value(manifest).unwrap(),
    )
    .await
    .unwrap_or_else(|e| panic!("create pod {name}: {e}"))
}

fn value_of(pod: &Pod) -> Value {
    serde_json::to_value(pod).unwrap()
}

fn tolerations(pod: &Value) -> Vec<Value> {
    pod["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Creates pre-scheduled probes until the policy is enforced (the API
/// server loads policies asynchronously).
async fn wait_enforced(t: &TestCtx) {
    let pods = t.pods();
    for i in 0..60 {
        let probe = create(
            &pods,
            pod(
                &format!("probe-{i}"),
                Some("probe-node"),
                json!({}),
                Value::Null,
            ),
        )
        .await;
        let enforced = probe
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none();
        delete_pod_at_once(&pods, &format!("probe-{i}")).await.ok();
        if enforced {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the MutatingAdmissionPolicy was not enforced within 30s");
}

/// Which pods the policy rewrites, and the rewrite: `nodeName` removed, the
/// node required by name in every existing term, the original request in
/// an annotation, a toleration for every taint; pods without claims,
/// without `nodeName` and pods in other namespaces untouched. (Mirror pods
/// are excluded too, but the API server rejects mirror pods with claims
/// anyway, so no such pod can be created here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_rewrites_only_prescheduled_pods_with_claims() {
    const NAME: &str = "policy_rewrites_only_prescheduled_pods_with_claims";
    let selector =
        format!("prescheduledPods.policy.namespaceSelector.matchLabels.{SELECTED_LABEL}");
    let docs = match admission::render_policy(&[
        ("prescheduledPods.policy.enabled", "true"),
        ("prescheduledPods.policy.tolerateAllTaints", "true"),
        (&selector, "on"),
    ]) {
        Ok(Some(docs)) => docs,
        Ok(None) => {
            println!("SKIP: {NAME}: Helm is not available to render the chart");
            return;
        }
        Err(e) => panic!("render: {e:#}"),
    };
    assert_eq!(docs.len(), 2, "policy and binding: {docs:?}");
    let Some(t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let namespaces: Api<Namespace> = Api::all(t.client.clone());
    namespaces
        .patch(
            &t.ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {SELECTED_LABEL: "on"}}})),
        )
        .await
        .unwrap();
    let other_ns = "e2e-policy-unselected";
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": other_ns}})).unwrap(),
        )
        .await
        .unwrap();
    admission::apply(&t.client, &docs)
        .await
        .expect("apply the chart's policy");
    wait_enforced(&t).await;
    let pods = t.pods();

    // Rewritten: no affinity, no annotations, no tolerations before.
    let bare = value_of(&create(&pods, pod("bare", Some("gpu-7"), json!({}), Value::Null)).await);
    assert!(bare["spec"]["nodeName"].is_null(), "{bare}");
    assert_eq!(
        bare["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"],
        json!([{"matchFields": [name_term("gpu-7")]}])
    );
    assert_eq!(bare["metadata"]["annotations"][ANNOTATION], "gpu-7");
    // (DefaultTolerationSeconds admission adds its not-ready/unreachable ones too.)
    assert!(
        tolerations(&bare).contains(&json!({"operator": "Exists"})),
        "{bare}"
    );

    // Rewritten, merged into what the pod had: the node is ANDed into each
    // required term, other annotations and tolerations stay.
    let merged = value_of(
        &create(
            &pods,
            pod(
                "merged",
                Some("gpu-7"),
                json!({
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-8"]}]},
                    ]}}},
                    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                }),
                json!({"team": "ml"}),
            ),
        )
        .await,
    );
    assert!(merged["spec"]["nodeName"].is_null());
    assert_eq!(
        merged["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"],
        json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}], "matchFields": [name_term("gpu-7")]},
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-8"]}, name_term("gpu-7")]},
        ])
    );
    assert_eq!(merged["metadata"]["annotations"]["team"], "ml");
    assert_eq!(merged["metadata"]["annotations"][ANNOTATION], "gpu-7");
    let kept = tolerations(&merged);
    assert!(kept.contains(&json!({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"})));
    assert!(kept.contains(&json!({"operator": "Exists"})), "{merged}");

    // Only preferred node affinity before: the required part is added beside it.
    let preferred = value_of(
        &create(
            &pods,
            pod(
                "preferred",
                Some("gpu-7"),
                json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}}),
                Value::Null,
            ),
        )
        .await,
    );
    let node_affinity = &preferred["spec"]["affinity"]["nodeAffinity"];
    assert_eq!(
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchFields": [name_term("gpu-7")]}])
    );
    assert_eq!(
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"],
        1
    );

    // Untouched.
    let mut no_claims = pod("no-claims", Some("gpu-7"), json!({}), Value::Null);
    no_claims["spec"]["resourceClaims"] = json!([]);
    no_claims["spec"]["containers"][0]["resources"] = json!({});
    let unchanged = [
        ("no-claims", no_claims),
        (
            "not-prescheduled",
            pod("not-prescheduled", None, json!({}), Value::Null),
        ),
    ];
    for (name, manifest) in unchanged {
        let before_node = manifest["spec"]["nodeName"].clone();
        let created = value_of(&create(&pods, manifest).await);
        assert_eq!(created["spec"]["nodeName"], before_node, "{name}");
        assert!(created["spec"]["affinity"].is_null(), "{name}: {created}");
        assert!(
            created["metadata"]["annotations"][ANNOTATION].is_null(),
            "{name}"
        );
    }
    let elsewhere: Api<Pod> = Api::namespaced(t.client.clone(), other_ns);
    let created = value_of(
        &create(
            &elsewhere,
            pod("elsewhere", Some("gpu-7"), json!({}), Value::Null),
        )
        .await,
    );
    assert_eq!(created["spec"]["nodeName"], "gpu-7", "unselected namespace");
    assert!(created["spec"]["affinity"].is_null());
    t.finish();
}

/// End to end with the real scheduler: a pod created with `spec.nodeName`
/// and a template claim is rewritten by the chart's policy, gets its claim
/// from us, the scheduler allocates it on the requested node, reserves it
/// and binds the pod there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prescheduled_pod_runs_through_the_real_scheduler() {
    const NAME: &str = "prescheduled_pod_runs_through_the_real_scheduler";
    const NODE_NAME: &str = "policy-gpu-1";
    let Some(scheduler_bin) = crate::scheduler::binary_or_skip(NAME) else {
        return;
    };
    let docs = match admission::render_policy(&[("prescheduledPods.policy.enabled", "true")]) {
        Ok(Some(docs)) => docs,
        Ok(None) => {
            println!("SKIP: {NAME}: Helm is not available to render the chart");
            return;
        }
        Err(e) => panic!("render: {e:#}"),
    };
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 1).await else {
        return;
    };
    nodes::create_device_class(&t.client, DEVICE_CLASS)
        .await
        .unwrap();
    // Two nodes with devices, the second with more: only the requested node
    // may be chosen.
    nodes::create_schedulable_node(&t.client, NODE_NAME)
        .await
        .unwrap();
    nodes::create_devices(&t.client, DEVICE_CLASS, NODE_NAME, 2)
        .await
        .unwrap();
    nodes::create_schedulable_node(&t.client, "policy-gpu-2")
        .await
        .unwrap();
    nodes::create_devices(&t.client, DEVICE_CLASS, "policy-gpu-2", 8)
        .await
        .unwrap();
    let _scheduler = crate::scheduler::Scheduler::start(&scheduler_bin, &t.isolated_env().cluster)
        .await
        .expect("start kube-scheduler");
    admission::apply(&t.client, &docs)
        .await
        .expect("apply the chart's policy");
    wait_enforced(&t).await;

    t.create_template("tmpl").await;
    let created = t
        .create_pod(
            "pinned",
            &[("gpu", Source::Template("tmpl"))],
            Some(NODE_NAME),
        )
        .await;
    assert!(
        created.spec.as_ref().unwrap().node_name.is_none(),
        "the policy removed spec.nodeName"
    );
    let pod_uid = uid(&created);
    let outcome = wait_for(
        "pod bound by the scheduler, claim allocated and reserved",
        Duration::from_secs(60),
        async || {
            let pod = t.pod("pinned").await;
            let bound = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            ensure!(
                bound.as_deref() == Some(NODE_NAME),
                "pod bound to {bound:?}"
            );
            let claim_name = recorded(&pod).get("gpu").cloned().flatten();
            let Some(claim_name) = claim_name else {
                bail!("claim not recorded yet")
            };
            let Some(claim) = t.claim(&claim_name).await else {
                bail!("claim {claim_name} missing")
            };
            let c = serde_json::to_value(&claim)?;
            let result = &c["status"]["allocation"]["devices"]["results"][0];
            ensure!(result["pool"] == NODE_NAME, "allocation: {}", c["status"]);
            ensure!(
                reserved_names(&claim) == vec!["pods/pinned".to_string()],
                "reservedFor: {}",
                c["status"]
            );
            ensure!(
                c["status"]["reservedFor"][0]["uid"] == pod_uid.as_str(),
                "reserved for another uid"
            );
            Ok((
                claim_name,
                result["device"].as_str().unwrap_or_default().to_string(),
            ))
        },
    )
    .await;
    let pod = value_of(&t.pod("pinned").await);
    assert_eq!(pod["metadata"]["annotations"][ANNOTATION], NODE_NAME);
    println!(
        "scheduler: pod pinned rewritten, claim {} allocated {} on {NODE_NAME}, reserved, pod bound",
        outcome.0, outcome.1
    );
    t.finish();
}
