//! PodGroup claims (DRAWorkloadResourceClaims, alpha) on an API server with
//! the alpha PodGroup API, for ours and, where kube-controller-manager sits
//! beside the API server, for the reference with the same gate: the same
//! story must end in the same objects.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::cluster::{ALL_CONTROLLER_GATES, ApiserverOptions, ControllerOpts};
use crate::ctx::TestCtx;
use crate::k8s::*;

pub const GROUP: &str = "trainers";
pub const ENTRY: &str = "gpu";

pub fn apiserver() -> ApiserverOptions {
    ApiserverOptions {
        feature_gates: vec![
            "GenericWorkload=true".into(),
            "DRAWorkloadResourceClaims=true".into(),
        ],
        runtime_config: vec!["scheduling.k8s.io/v1alpha2=true".into()],
        ..ApiserverOptions::default()
    }
}

pub fn gates() -> String {
    format!("{ALL_CONTROLLER_GATES},DRAWorkloadResourceClaims=true")
}

pub fn pod_groups(t: &TestCtx) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.k8s.io", "v1alpha2", "PodGroup"),
        "podgroups",
    );
    Api::namespaced_with(t.client.clone(), &t.ns, &ar)
}

/// Applies the chart's RBAC rendered with `featureGates` set to `gates`
/// (a gate's rights: PodGroups', pool status requests') and starts the
/// controller; `false`, after one SKIP line, without Helm.
pub async fn start_with_gate_rbac(t: &mut TestCtx, name: &str, gates: &str) -> bool {
    let escaped = gates.replace(',', "\\,");
    if !crate::rbac::reapply_controller_rbac_or_skip(
        &t.client,
        name,
        &[("featureGates", escaped.as_str())],
    )
    .await
    {
        return false;
    }
    t.isolated_env()
        .start_controller()
        .await
        .expect("start controller");
    true
}

pub async fn create_group(t: &TestCtx) -> DynamicObject {
    let group: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
        "metadata": {"name": GROUP},
        "spec": {"schedulingPolicy": {"basic": {}},
                 "resourceClaims": [{"name": ENTRY, "resourceClaimTemplateName": "tmpl"}]},
    }))
    .unwrap();
    pod_groups(t)
        .create(&PostParams::default(), &group)
        .await
        .expect("create PodGroup")
}

pub async fn create_member(t: &TestCtx, name: &str) -> Pod {
    let mut manifest = pod_manifest(name, &[(ENTRY, Source::Template("tmpl"))], None);
    manifest["spec"]["schedulingGroup"] = json!({"podGroupName": GROUP});
    t.pods()
        .create(
            &PostParams::default(),
            &serde_json::from_value(manifest).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("create member pod {name}: {e}"))
}

/// What the story produced, normalized for comparison between controllers.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// The claim recorded in the group's status.
    group_records_one_claim: bool,
    /// Owner of the group's claim: apiVersion, kind, controller.
    owner: (String, String, bool),
    annotation: Option<String>,
    generate_name: String,
    /// Claims in the namespace once both members recorded theirs.
    claims_in_namespace: usize,
    /// Both members' status names the group's claim.
    members_use_group_claim: bool,
    /// `reservedFor` after a member was bound with the claim allocated.
    reserved_for: Vec<(String, String, String)>,
    /// After the group is deleted: reservations, allocation, finalizer.
    released_after_group_deleted: (usize, bool, bool),
}

async fn story(t: &TestCtx) -> Outcome {
    t.create_template("tmpl").await;
    let group = create_group(t).await;
    let group_uid = group.metadata.uid.clone().unwrap();
    let claim_name = wait_for("the group's claim recorded", TIMEOUT, async || {
        let g = pod_groups(t).get(GROUP).await?;
        let name = g.data["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            .as_str()
            .map(str::to_string)
            .context("not recorded yet")?;
        ensure!(
            t.claim(&name).await.is_some(),
            "claim {name} not visible yet"
        );
        Ok(name)
    })
    .await;
    let claim = t.claim(&claim_name).await.unwrap();
    let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.uid, group_uid);
    for pod in ["member-1", "member-2"] {
        create_member(t, pod).await;
    }
    wait_for("members record the group's claim", TIMEOUT, async || {
        for pod in ["member-1", "member-2"] {
            let recorded = recorded(&t.pod(pod).await);
            ensure!(
                recorded.get(ENTRY).cloned().flatten().as_deref() == Some(claim_name.as_str()),
                "{pod}: {recorded:?}"
            );
        }
        Ok(())
    })
    .await;
    // Nothing else may appear: a wrong controller would make pod claims
    // within this window.
    holds_for(
        "the group's claim the only claim in the namespace",
        Duration::from_secs(2),
        async || {
            let claims = t.claims().list(&ListParams::default()).await?.items.len();
            ensure!(claims == 1, "{claims} claims");
            Ok(())
        },
    )
    .await;
    let claims_in_namespace = t
        .claims()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();

    // Scheduler's part: allocate, then bind a member.
    t.allocate(&claim_name, json!([])).await;
    t.bind_pod("member-1", NODE).await;
    let reserved_for = wait_for(
        "a reservation for the bound member's group",
        TIMEOUT,
        async || {
            let c = t.claims().get(&claim_name).await?;
            let entries: Vec<(String, String, String)> = c
                .status
                .and_then(|s| s.reserved_for)
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.api_group.unwrap_or_default(), r.resource, r.name))
                .collect();
            ensure!(!entries.is_empty(), "not reserved yet");
            Ok(entries)
        },
    )
    .await;

    // The group goes: its reservation goes, the claim is released. The API
    // server protects a PodGroup with a finalizer while pods use it (its
    // protection controller is not running here): members first, then the
    // test lifts the finalizer as that controller would.
    pod_groups(t)
        .delete(GROUP, &DeleteParams::default())
        .await
        .expect("delete PodGroup");
    let terminating = pod_groups(t)
        .get(GROUP)
        .await
        .expect("terminating PodGroup");
    ensure_still_reserved(t, &claim_name).await;
    for pod in ["member-1", "member-2"] {
        t.delete_pod_now(pod).await;
    }
    if terminating
        .metadata
        .finalizers
        .is_some_and(|f| !f.is_empty())
    {
        pod_groups(t)
            .patch(
                GROUP,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .expect("lift the PodGroup's finalizer");
    }
    let released = wait_for(
        "the claim released after the group is gone",
        TIMEOUT,
        async || {
            let Some(c) = t.claim(&claim_name).await else {
                bail!("claim deleted (no garbage collector runs here)")
            };
            let reserved = reserved_names(&c).len();
            let state = (reserved, is_allocated(&c), has_finalizer(&c));
            ensure!(state == (0, false, false), "{state:?}");
            Ok(state)
        },
    )
    .await;
    Outcome {
        group_records_one_claim: true,
        owner: (
            owner.api_version.clone(),
            owner.kind.clone(),
            owner.controller == Some(true),
        ),
        annotation: claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("resource.kubernetes.io/pod-claim-name").cloned()),
        generate_name: claim.metadata.generate_name.clone().unwrap_or_default(),
        claims_in_namespace,
        members_use_group_claim: true,
        reserved_for,
        released_after_group_deleted: released,
    }
}

/// A group that is only terminating keeps its reservation (members may
/// still run).
async fn ensure_still_reserved(t: &TestCtx, claim: &str) {
    holds_for(
        "a terminating group keeps its reservation",
        Duration::from_secs(2),
        async || {
            let c = t.claims().get(claim).await?;
            ensure!(
                !reserved_names(&c).is_empty(),
                "released while the group terminates"
            );
            Ok(())
        },
    )
    .await;
}

fn expected() -> Outcome {
    Outcome {
        group_records_one_claim: true,
        owner: ("scheduling.k8s.io/v1alpha2".into(), "PodGroup".into(), true),
        annotation: Some(ENTRY.into()),
        generate_name: format!("{GROUP}-{ENTRY}-"),
        claims_in_namespace: 1,
        members_use_group_claim: true,
        reserved_for: vec![("scheduling.k8s.io".into(), "podgroups".into(), GROUP.into())],
        released_after_group_deleted: (0, false, false),
    }
}

/// One claim per PodGroup entry, owned by the group and recorded in its
/// status; members use it and get none of their own; a bound member
/// reserves it for the group; the group's deletion releases it; the 1.37
/// creates counter says the owner was a PodGroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podgroup_claims() {
    const NAME: &str = "podgroup_claims";
    let opts = ControllerOpts {
        feature_gates: gates(),
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated_with(NAME, opts, 0, &apiserver()).await else {
        return;
    };
    if !start_with_gate_rbac(&mut t, NAME, &gates()).await {
        return;
    }
    let outcome = story(&t).await;
    assert_eq!(outcome, expected());
    let metrics = t.controller().metrics_text().await.unwrap();
    assert!(
        metrics.contains(
            r#"dynamic_resource_allocation_resourceclaim_creates_total{admin_access="false",owner_api_group="scheduling.k8s.io",owner_api_kind="PodGroup",status="success"} 1"#
        ),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("creates_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!("podgroups: ours {outcome:?}");
    t.finish();
}

/// The same story with kube-controller-manager 1.36 and the gate on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_podgroup_claims() {
    const NAME: &str = "differential_podgroup_claims";
    let Some(kcm) = crate::reference::binary_or_skip(NAME) else {
        return;
    };
    let Some(mut t) =
        TestCtx::isolated_with(NAME, ControllerOpts::default(), 0, &apiserver()).await
    else {
        return;
    };
    let reference = crate::reference::Reference::start_with_gates(
        &kcm,
        &t.isolated_env().cluster,
        "GenericWorkload=true,DRAWorkloadResourceClaims=true",
    )
    .await
    .expect("start kube-controller-manager");
    let outcome = story(&t).await;
    drop(reference);
    println!("podgroups: reference {outcome:?}");
    assert_eq!(outcome, expected(), "the reference ends where ours does");
    t.finish();
}

/// With the gate on and no PodGroup API served, the controller refuses to
/// start and says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_without_podgroup_api_is_a_clear_error() {
    const NAME: &str = "gate_without_podgroup_api_is_a_clear_error";
    let Some(mut t) = TestCtx::isolated(NAME, ControllerOpts::default(), 0).await else {
        return;
    };
    let kubeconfig = t.isolated_env().cluster.controller_kubeconfig.clone();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_dra-claim-controller"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args([
                "--feature-gates=DRAWorkloadResourceClaims=true",
                "--leader-elect=false",
                "--metrics-bind-address=0",
                "--health-probe-bind-address=0",
            ])
            .output(),
    )
    .await
    .expect("the controller exits at once")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("serves none of scheduling.k8s.io/v1beta1, v1alpha3, v1alpha2")
            && stderr.contains("--runtime-config=scheduling.k8s.io/v1alpha2=true"),
        "{stderr}"
    );
    t.finish();
}

/// Acting as kube-controller-manager 1.37 with DRAWorkloadResourceClaims
/// off (GenericWorkload on): a member pod whose entry matches its group's
/// claim gets no claim of its own, and the work item is given up ("will
/// not retry") instead of retried; pinned to 1.36, the same pod gets its own
/// claim, as 1.36 does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_release_decides_for_members_with_the_claims_gate_off() {
    const NAME: &str = "pinned_release_decides_for_members_with_the_claims_gate_off";
    for release in ["1.37", "1.36"] {
        let gates =
            format!("{ALL_CONTROLLER_GATES},GenericWorkload=true,DRAWorkloadResourceClaims=false");
        let opts = ControllerOpts {
            feature_gates: gates.clone(),
            extra_args: vec![format!("--reference-release={release}")],
            ..ControllerOpts::default()
        };
        let Some(mut t) = TestCtx::isolated_with(NAME, opts, 0, &apiserver()).await else {
            return;
        };
        if !start_with_gate_rbac(&mut t, NAME, &gates).await {
            return;
        }
        t.create_template("tmpl").await;
        create_group(&t).await;
        create_member(&t, "member-1").await;
        if release == "1.36" {
            wait_for("the member's own claim (1.36)", TIMEOUT, async || {
                let recorded = recorded(&t.pod("member-1").await);
                ensure!(
                    recorded.get(ENTRY).cloned().flatten().is_some(),
                    "{recorded:?}"
                );
                Ok(())
            })
            .await;
        } else {
            let log = t.replica(0).current().proc.log.clone();
            let given_up = || {
                std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("will not retry") && l.contains("member-1"))
                    .count()
            };
            wait_for("the member given up (1.37)", TIMEOUT, async || {
                ensure!(given_up() >= 1, "not yet");
                Ok(())
            })
            .await;
            // No backoff retries follow (they would come 5 ms, 10 ms,
            // 20 ms ... apart: a dozen within the window), and nothing was
            // made. Each pod event is one decision: the add, and at times
            // an update right behind it, give it up at most twice.
            holds_for(
                "the member given up, not retried",
                Duration::from_secs(3),
                async || {
                    let n = given_up();
                    ensure!(n <= 2, "given up {n} times: retried");
                    Ok(())
                },
            )
            .await;
            let claims = t.claims().list(&ListParams::default()).await.unwrap();
            assert!(
                claims.items.is_empty(),
                "no claim made: {:?}",
                claims.items.len()
            );
            assert!(recorded(&t.pod("member-1").await).is_empty());
        }
        t.finish();
    }
}
