//! Scenarios: claims created from templates, named, adopted and recorded.

use super::*;

/// A template's labels, annotations and spec are copied into the claim,
/// which is recorded in the pod status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_template_claim_created_and_recorded() {
    let Some(p) = Pair::new("differential_template_claim_created_and_recorded").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_template_with(
                "gpu-template",
                json!({"team": "e2e", "tier": "gold"}),
                json!({"example.com/note": "copied"}),
            )
            .await;
            s.create_pod("app", &[("gpu", Source::Template("gpu-template"))], None)
                .await;
        },
        |s| s.recorded("app", "gpu").map(drop),
        same,
    )
    .await;
}

/// Two template entries get two claims; an entry naming a user's claim is
/// neither recorded nor touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_two_templates_and_a_shared_claim() {
    let Some(p) = Pair::new("differential_two_templates_and_a_shared_claim").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_template("tmpl-a").await;
            s.create_template("tmpl-b").await;
            s.create_claim(json!({"name": "shared"})).await;
            s.create_pod(
                "multi",
                &[
                    ("a", Source::Template("tmpl-a")),
                    ("b", Source::Template("tmpl-b")),
                    ("c", Source::Claim("shared")),
                ],
                None,
            )
            .await;
        },
        |s| {
            s.recorded("multi", "a")?;
            s.recorded("multi", "b")?;
            Ok(())
        },
        same,
    )
    .await;
}

/// Long pod and entry names: both are truncated proportionally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_long_names_are_truncated() {
    let Some(p) = Pair::new("differential_long_names_are_truncated").await else {
        return;
    };
    let cases = long_name_cases();
    p.run(
        async |s: &Side| {
            s.create_template("tmpl").await;
            for (pod, entry) in &cases {
                s.create_pod(pod, &[(entry, Source::Template("tmpl"))], None)
                    .await;
            }
        },
        |s| {
            for (pod, entry) in &cases {
                s.recorded(pod, entry)?;
            }
            Ok(())
        },
        same,
    )
    .await;
}

/// A missing template is reported on the pod (Warning
/// FailedResourceClaimCreation); once the template exists the claim appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_missing_template_created_later() {
    let Some(p) = Pair::new("differential_missing_template_created_later").await else {
        return;
    };
    p.run(
        async |s: &Side| {
            s.create_pod(
                "waiting",
                &[("accel-entry", Source::Template("late-template"))],
                None,
            )
            .await;
            s.wait_creation_failed().await;
            s.create_template("late-template").await;
        },
        |s| s.recorded("waiting", "accel-entry").map(drop),
        same,
    )
    .await;
}
