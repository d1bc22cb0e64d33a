//! Claim creation from templates: naming, copying, recording, adoption and
//! replacement. All on the shared server, one namespace per test.

use std::time::Duration;

use anyhow::{bail, ensure};
use serde_json::json;

use crate::ctx::TestCtx;
use crate::k8s::*;

/// Creation copies the template and records the claim in the pod status
/// with the reference controller's field manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_claim_created_and_recorded() {
    let Some(t) = TestCtx::shared("template_claim_created_and_recorded").await else {
        return;
    };
    let template = t
        .create_template_with(
            "gpu-template",
            json!({"team": "e2e", "tier": "gold"}),
            json!({"example.com/note": "copied"}),
            exactly_spec(),
        )
        .await;
    let pod = t
        .create_pod("app", &[("gpu", Source::Template("gpu-template"))], None)
        .await;

    let claims = t.wait_recorded("app", &["gpu"]).await;
    let claim = &claims["gpu"];
    let name = claim.metadata.name.clone().unwrap();
    assert_eq!(claim.metadata.generate_name.as_deref(), Some("app-gpu-"));
    assert!(
        name.starts_with("app-gpu-") && name.len() == "app-gpu-".len() + 5,
        "{name}"
    );

    let annotations = claim.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get(POD_CLAIM_NAME_ANNOTATION)
            .map(String::as_str),
        Some("gpu")
    );
    assert_eq!(
        annotations.get("example.com/note").map(String::as_str),
        Some("copied")
    );
    let labels = claim.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("e2e"));
    assert_eq!(labels.get("tier").map(String::as_str), Some("gold"));

    let owners = claim.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "owner references: {owners:?}");
    let owner = &owners[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str()
        ),
        ("v1", "Pod", "app")
    );
    assert_eq!(owner.uid, uid(&pod));
    assert_eq!(owner.controller, Some(true));

    assert_eq!(
        serde_json::to_value(&claim.spec).unwrap(),
        serde_json::to_value(template.spec.as_ref().and_then(|s| s.spec.as_ref())).unwrap(),
        "claim spec must be the template's spec.spec"
    );

    let pod = t.pod("app").await;
    let managers = pod.metadata.managed_fields.clone().unwrap_or_default();
    let entry = managers
        .iter()
        .find(|m| m.manager.as_deref() == Some(FIELD_MANAGER))
        .unwrap_or_else(|| panic!("no managedFields entry of {FIELD_MANAGER}: {managers:?}"));
    assert_eq!(entry.subresource.as_deref(), Some("status"));
    assert_eq!(
        entry.operation.as_deref(),
        Some("Apply"),
        "status must be server-side applied"
    );
    let fields = serde_json::to_string(&entry.fields_v1).unwrap();
    assert!(fields.contains("resourceClaimStatuses"), "{fields}");

    holds_for(
        "exactly one claim in the namespace",
        Duration::from_secs(2),
        async || {
            let n = t.all_claims().await?.len();
            ensure!(n == 1, "{n} claims");
            Ok(())
        },
    )
    .await;
    t.finish();
}

/// Two template entries get two claims; an entry naming a user's claim is
/// neither recorded nor touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_templates_and_a_shared_claim() {
    let Some(t) = TestCtx::shared("two_templates_and_a_shared_claim").await else {
        return;
    };
    t.create_template("tmpl-a").await;
    t.create_template("tmpl-b").await;
    t.create_claim(json!({"name": "shared"})).await;
    t.create_pod(
        "multi",
        &[
            ("a", Source::Template("tmpl-a")),
            ("b", Source::Template("tmpl-b")),
            ("c", Source::Claim("shared")),
        ],
        None,
    )
    .await;

    let claims = t.wait_recorded("multi", &["a", "b"]).await;
    assert_eq!(
        claims["a"].metadata.generate_name.as_deref(),
        Some("multi-a-")
    );
    assert_eq!(
        claims["b"].metadata.generate_name.as_deref(),
        Some("multi-b-")
    );
    assert_ne!(claims["a"].metadata.name, claims["b"].metadata.name);

    let statuses = recorded(&t.pod("multi").await);
    assert_eq!(
        statuses.keys().collect::<Vec<_>>(),
        ["a", "b"],
        "{statuses:?}"
    );

    let shared = t.claim("shared").await.expect("shared claim");
    assert!(
        shared
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );
    assert!(
        !shared
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(POD_CLAIM_NAME_ANNOTATION)
    );
    holds_for("exactly three claims", Duration::from_secs(2), async || {
        let n = t.all_claims().await?.len();
        ensure!(n == 3, "{n} claims");
        Ok(())
    })
    .await;
    t.finish();
}

/// Long pod and entry names are truncated proportionally so the generated
/// name keeps both parts and fits in 63 characters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_names_are_truncated() {
    let Some(t) = TestCtx::shared("long_names_are_truncated").await else {
        return;
    };
    t.create_template("tmpl").await;
    let cases = long_name_cases();
    let lengths: Vec<(usize, usize)> = cases.iter().map(|(p, e)| (p.len(), e.len())).collect();
    assert_eq!(&lengths[..2], &[(63, 63), (253, 63)]);
    for (pod_name, e) in &cases {
        t.create_pod(pod_name, &[(e, Source::Template("tmpl"))], None)
            .await;
    }
    for (pod_name, e) in &cases {
        let e = e.as_str();
        let claims = t.wait_recorded(pod_name, &[e]).await;
        let claim = &claims[e];
        let expected = expected_generate_name(pod_name, e);
        let name = claim.metadata.name.clone().unwrap();
        assert_eq!(
            claim.metadata.generate_name.as_deref(),
            Some(expected.as_str()),
            "pod {} chars, entry {} chars",
            pod_name.len(),
            e.len()
        );
        assert!(name.starts_with(&expected), "{name} vs {expected}");
        assert!(name.len() <= 63, "{name} has {} characters", name.len());
    }
    t.finish();
}

/// A missing template is reported on the pod and retried; once the
/// template exists the claim appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_template_created_later() {
    let Some(t) = TestCtx::shared("missing_template_created_later").await else {
        return;
    };
    t.create_pod(
        "waiting",
        &[("accel-entry", Source::Template("late-template"))],
        None,
    )
    .await;

    let events = wait_for(
        "a FailedResourceClaimCreation warning on the pod",
        TIMEOUT,
        async || {
            let events = t.warning_events("waiting", FAILED_CREATION_REASON).await?;
            ensure!(!events.is_empty(), "no such event yet");
            Ok(events)
        },
    )
    .await;
    let message = events[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("accel-entry") && message.contains("late-template"),
        "event should name the entry and the template: {message:?}"
    );
    assert!(
        t.all_claims().await.unwrap().is_empty(),
        "no claim without a template"
    );

    t.create_template("late-template").await;
    t.wait_recorded("waiting", &["accel-entry"]).await;
    t.finish();
}

/// A claim the pod already controls, with the entry's annotation, is adopted
/// instead of creating a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_claim_is_adopted() {
    let Some(t) = TestCtx::shared("orphan_claim_is_adopted").await else {
        return;
    };
    // The template does not exist yet, so the controller cannot create a
    // claim before the orphan is in place.
    let pod = t
        .create_pod("adopter", &[("gpu", Source::Template("tmpl-later"))], None)
        .await;
    t.create_claim(json!({
        "name": "adopter-gpu-orphan",
        "annotations": {POD_CLAIM_NAME_ANNOTATION: "gpu"},
        "ownerReferences": [{
            "apiVersion": "v1", "kind": "Pod", "name": "adopter", "uid": uid(&pod),
            "controller": true, "blockOwnerDeletion": true,
        }],
    }))
    .await;
    t.create_template("tmpl-later").await;

    let claims = t.wait_recorded("adopter", &["gpu"]).await;
    assert_eq!(
        claims["gpu"].metadata.name.as_deref(),
        Some("adopter-gpu-orphan")
    );
    holds_for("no second claim", Duration::from_secs(2), async || {
        let n = t.all_claims().await?.len();
        ensure!(n == 1, "{n} claims");
        Ok(())
    })
    .await;
    t.finish();
}

/// A running pod whose recorded claim was deleted gets a replacement at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_claim_is_recreated() {
    let Some(t) = TestCtx::shared("deleted_claim_is_recreated").await else {
        return;
    };
    t.create_template("tmpl").await;
    t.create_pod("victim", &[("gpu", Source::Template("tmpl"))], None)
        .await;
    let first = t.wait_recorded("victim", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    t.claims()
        .delete(&first, &Default::default())
        .await
        .expect("delete claim");

    // The deleted claim is gone at once (no finalizer), so whatever is
    // recorded and exists from now on is the replacement.
    let second = t.wait_recorded("victim", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();
    assert_ne!(second, first);
    let all = t.all_claims().await.unwrap();
    assert_eq!(all.len(), 1, "only the replacement: {:?}", names(&all));
    assert_eq!(all[0].metadata.name.as_deref(), Some(second.as_str()));
    t.finish();
}

/// A recorded claim controlled by another pod is never used: the pod gets
/// a claim of its own and the other pod's claim is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_owned_by_another_pod_is_replaced() {
    let Some(t) = TestCtx::shared("claim_owned_by_another_pod_is_replaced").await else {
        return;
    };
    t.create_template("tmpl-first").await;
    let first_pod = t
        .create_pod("first", &[("gpu", Source::Template("tmpl-first"))], None)
        .await;
    let foreign = t.wait_recorded("first", &["gpu"]).await["gpu"]
        .metadata
        .name
        .clone()
        .unwrap();

    // The second pod's template is missing until its status points at the
    // first pod's claim, so the controller decides on that status.
    t.create_pod("second", &[("gpu", Source::Template("tmpl-second"))], None)
        .await;
    t.set_pod_claim_statuses(
        "second",
        json!([{"name": "gpu", "resourceClaimName": foreign}]),
    )
    .await;
    t.create_template("tmpl-second").await;

    wait_for(
        "the second pod to record a claim of its own",
        TIMEOUT,
        async || {
            let pod = t.pods().get("second").await?;
            let name = recorded(&pod).get("gpu").cloned().flatten();
            let Some(name) = name else {
                bail!("nothing recorded")
            };
            ensure!(name != foreign, "still records {foreign}");
            let claim = t.claims().get(&name).await?;
            ensure!(
                controlled_by(&claim, &uid(&pod)),
                "{name} not controlled by the pod"
            );
            Ok(())
        },
    )
    .await;
    let kept = t
        .claim(&foreign)
        .await
        .expect("first pod's claim must survive");
    assert!(controlled_by(&kept, &uid(&first_pod)));
    assert_eq!(
        recorded(&t.pod("first").await)
            .get("gpu")
            .cloned()
            .flatten(),
        Some(foreign)
    );
    t.finish();
}

/// An entry recorded without a claim name means "not needed": no claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_entry_gets_no_claim() {
    let Some(t) = TestCtx::shared("skipped_entry_gets_no_claim").await else {
        return;
    };
    // Template missing at first so nothing is created before the status says
    // "skip"; the second entry proves the controller did look at the pod.
    t.create_pod(
        "skipper",
        &[
            ("skip", Source::Template("tmpl-skip")),
            ("use", Source::Template("tmpl-skip")),
        ],
        None,
    )
    .await;
    t.set_pod_claim_statuses("skipper", json!([{"name": "skip"}]))
        .await;
    t.create_template("tmpl-skip").await;

    t.wait_recorded("skipper", &["use"]).await;
    holds_for(
        "one claim, and 'skip' recorded without a name",
        Duration::from_secs(2),
        async || {
            let claims = t.all_claims().await?;
            ensure!(claims.len() == 1, "claims: {:?}", names(&claims));
            let statuses = recorded(&t.pods().get("skipper").await?);
            ensure!(
                statuses.get("skip") == Some(&None),
                "statuses: {statuses:?}"
            );
            Ok(())
        },
    )
    .await;
    t.finish();
}

fn names(claims: &[k8s_openapi::api::resource::v1::ResourceClaim]) -> Vec<String> {
    claims
        .iter()
        .map(|c| c.metadata.name.clone().unwrap_or_default())
        .collect()
}
