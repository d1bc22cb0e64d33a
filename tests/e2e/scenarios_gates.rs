//! Feature gates are process-wide, so these scenarios run a controller with
//! the gates off against a server of their own (the API server keeps the
//! gates on so the templates can carry the gated fields).

use std::time::Duration;

use anyhow::ensure;
use serde_json::json;

use crate::cluster::ControllerOpts;
use crate::ctx::TestCtx;
use crate::k8s::*;

/// With DRAAdminAccess and DRAPrioritizedList off, templates using
/// `adminAccess` or `firstAvailable` yield a warning event and no claim;
/// a plain template in the same namespace still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_fields_refused_with_gates_off() {
    let opts = ControllerOpts {
        feature_gates: "DRAAdminAccess=false,DRAPrioritizedList=false,DRAExtendedResource=true"
            .into(),
        ..ControllerOpts::default()
    };
    let Some(t) = TestCtx::isolated("gated_fields_refused_with_gates_off", opts, 1).await else {
        return;
    };
    t.create_gated_templates("admin-template", "prio-template")
        .await;
    let stored = t.templates().get("admin-template").await.unwrap();
    let admin = serde_json::to_value(stored.spec.and_then(|s| s.spec)).unwrap();
    assert_eq!(
        admin["devices"]["requests"][0]["exactly"]["adminAccess"],
        json!(true),
        "the API server dropped adminAccess (its DRAAdminAccess gate is off?)"
    );
    let stored = t.templates().get("prio-template").await.unwrap();
    let prio = serde_json::to_value(stored.spec.and_then(|s| s.spec)).unwrap();
    assert!(
        prio["devices"]["requests"][0]["firstAvailable"].is_array(),
        "the API server dropped firstAvailable (its DRAPrioritizedList gate is off?)"
    );
    t.create_template("plain-template").await;

    t.create_pod(
        "wants-admin",
        &[("gpu", Source::Template("admin-template"))],
        None,
    )
    .await;
    t.create_pod(
        "wants-prio",
        &[("gpu", Source::Template("prio-template"))],
        None,
    )
    .await;
    t.create_pod(
        "plain",
        &[("gpu", Source::Template("plain-template"))],
        None,
    )
    .await;

    t.wait_recorded("plain", &["gpu"]).await;
    for pod in ["wants-admin", "wants-prio"] {
        wait_for(
            &format!("a FailedResourceClaimCreation warning on {pod}"),
            TIMEOUT,
            async || {
                let events = t.warning_events(pod, FAILED_CREATION_REASON).await?;
                ensure!(!events.is_empty(), "no such event yet");
                Ok(())
            },
        )
        .await;
    }
    holds_for(
        "no claims for the gated templates",
        Duration::from_secs(3),
        async || {
            let claims = t.all_claims().await?;
            ensure!(
                claims.len() == 1,
                "{} claims (only the plain pod's expected)",
                claims.len()
            );
            Ok(())
        },
    )
    .await;
    t.finish();
}
