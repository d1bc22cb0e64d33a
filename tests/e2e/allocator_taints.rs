//! The allocator for declared nodes honours DeviceTaintRules as
//! kube-scheduler does: a device a rule taints `NoSchedule` is not given to
//! a claim that does not tolerate it, and a pod that needs it is told why.

use serde_json::json;

use crate::allocator::{SELECTOR, count_spec, declare, failure_told, wait_allocated};
use crate::ctx::TestCtx;
use crate::device_taints::{create_rule, rules_apiserver, rules_controller};
use crate::k8s::*;
use crate::nodes;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocator_honours_device_taint_rules() {
    const NAME: &str = "allocator_honours_device_taint_rules";
    let mut opts = rules_controller();
    opts.extra_args
        .push(format!("--allocate-on-nodes={SELECTOR}"));
    let Some(mut t) = TestCtx::isolated_with(NAME, opts, 0, &rules_apiserver()).await else {
        return;
    };
    if !crate::rbac::reapply_controller_rbac_or_skip(
        &t.client,
        NAME,
        &[("allocation.nodeSelector", SELECTOR)],
    )
    .await
    {
        return;
    }
    nodes::create_device_class(&t.client, DEVICE_CLASS)
        .await
        .unwrap();
    nodes::create_schedulable_node(&t.client, "alloc-1")
        .await
        .unwrap();
    nodes::create_devices(&t.client, DEVICE_CLASS, "alloc-1", 2)
        .await
        .unwrap();
    declare(&t.client, "alloc-1").await;
    // Maintenance on dev-0: new claims must not get it.
    create_rule(
        &t,
        "maintenance",
        "NoSchedule",
        json!({"driver": DEVICE_CLASS, "pool": "alloc-1", "device": "dev-0"}),
    )
    .await;
    t.isolated_env()
        .start_controller()
        .await
        .expect("start controller");
    t.create_template_with("one", json!({}), json!({}), count_spec(1))
        .await;

    t.create_pod(
        "first",
        &[("gpu", Source::Template("one"))],
        Some("alloc-1"),
    )
    .await;
    let (_, devices) = wait_allocated(&t, "first", "first pod's claim allocated").await;
    assert_eq!(devices, [("alloc-1".to_string(), "dev-1".to_string())]);

    t.create_pod(
        "second",
        &[("gpu", Source::Template("one"))],
        Some("alloc-1"),
    )
    .await;
    let told = failure_told(&t, "second").await;
    assert!(told.contains("1 tainted"), "{told}");
    t.finish();
}
