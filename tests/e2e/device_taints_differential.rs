//! One device-taint story, played against ours and against
//! kube-controller-manager 1.36's `device-taint-eviction-controller`
//! (DeviceTaintRules on, `resource.k8s.io/v1beta2`): the same pods evicted,
//! the same pods kept, the same rule status, word for word. Ours runs as a
//! drop-in here: unpaced and without the guard, as upstream.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::ensure;
use serde_json::json;

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::device_taints::{
    create_rule, ensure_evicted, ensure_untouched, no_execute, pod_on_device, publish,
    rule_condition, rules_apiserver, rules_controller,
};
use crate::k8s::*;

const TIMEOUT: Duration = Duration::from_secs(45);

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    evicted: BTreeSet<&'static str>,
    kept: BTreeSet<&'static str>,
    /// Rule -> (status, reason, message) of `EvictionInProgress`.
    rules: BTreeMap<&'static str, (String, String, String)>,
}

fn expected() -> Outcome {
    Outcome {
        evicted: BTreeSet::from(["untolerated", "ruled"]),
        kept: BTreeSet::from(["forever", "clean", "previewed"]),
        rules: BTreeMap::from([
            (
                "evict-d3",
                (
                    "False".into(),
                    "Completed".into(),
                    "1 pod evicted since starting the controller.".into(),
                ),
            ),
            (
                "preview-d4",
                (
                    "False".into(),
                    "NoEffect".into(),
                    "1 published device selected. 1 allocated device selected. 1 pod would be evicted in 1 \
                     namespace if the effect was NoExecute. This information will not be updated again. \
                     Recreate the DeviceTaintRule to trigger an update."
                        .into(),
                ),
            ),
        ]),
    }
}

/// `evict-pod-resourceclaim`, `no-evict-pod-toleration-forever`,
/// `no-evict-no-taint`, `evict-pod-rule` and `none-pod-rule` in one
/// cluster.
async fn story(t: &TestCtx) -> Outcome {
    let pool = "differential-pool";
    publish(
        t,
        pool,
        &[
            ("d0", no_execute()),
            ("d1", no_execute()),
            ("d2", json!([])),
            ("d3", json!([])),
            ("d4", json!([])),
        ],
    )
    .await;
    let forever = json!([{"key": crate::device_taints::TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}]);
    pod_on_device(t, "untolerated", pool, "d0", json!([])).await;
    pod_on_device(t, "forever", pool, "d1", forever).await;
    pod_on_device(t, "clean", pool, "d2", json!([])).await;
    pod_on_device(t, "ruled", pool, "d3", json!([])).await;
    pod_on_device(t, "previewed", pool, "d4", json!([])).await;
    let one = |d: &str| json!({"driver": crate::device_taints::DRIVER, "pool": pool, "device": d});
    create_rule(t, "preview-d4", "None", one("d4")).await;
    create_rule(t, "evict-d3", "NoExecute", one("d3")).await;

    let evicted = BTreeSet::from(["untolerated", "ruled"]);
    wait_for("the pods on tainted devices evicted", TIMEOUT, async || {
        for pod in &evicted {
            ensure_evicted(t.pods().get_opt(pod).await?.as_ref())?;
        }
        Ok(())
    })
    .await;
    let mut rules = BTreeMap::new();
    for (rule, reason) in [("evict-d3", "Completed"), ("preview-d4", "NoEffect")] {
        let c = wait_for(&format!("{rule} {reason}"), TIMEOUT, async || {
            let c = rule_condition(t, rule).await?;
            ensure!(c.1 == reason, "{c:?}");
            Ok(c)
        })
        .await;
        rules.insert(rule, c);
    }
    let kept = BTreeSet::from(["forever", "clean", "previewed"]);
    holds_for("the other pods kept", Duration::from_secs(3), async || {
        for pod in &kept {
            ensure_untouched(&t.pods().get(pod).await?)?;
        }
        Ok(())
    })
    .await;
    Outcome {
        evicted,
        kept,
        rules,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_taint_eviction_story_ours() {
    let opts = ControllerOpts {
        extra_args: vec![
            "--device-taint-evictions-per-second=0".into(),
            "--device-taint-evictions-per-rule-per-second=0".into(),
            "--device-taint-eviction-max-share=1".into(),
        ],
        ..rules_controller()
    };
    let Some(t) = TestCtx::isolated_with(
        "device_taint_eviction_story_ours",
        opts,
        1,
        &rules_apiserver(),
    )
    .await
    else {
        return;
    };
    let outcome = story(&t).await;
    assert_eq!(outcome, expected());
    t.finish();
}

/// The same story with kube-controller-manager 1.36's controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_device_taint_eviction_story() {
    let Some((t, reference)) = crate::reference::isolated_with_reference(
        "differential_device_taint_eviction_story",
        &rules_apiserver(),
        &["device-taint-eviction-controller"],
        &["--feature-gates=DRADeviceTaintRules=true".into()],
        async |_| {},
    )
    .await
    else {
        return;
    };
    let outcome = story(&t).await;
    drop(reference);
    assert_eq!(outcome, expected(), "the reference ends where ours does");
    t.finish();
}
