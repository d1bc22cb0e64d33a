//! Decision tables for PodGroup claims (DRAWorkloadResourceClaims). Row
//! names follow kube-controller-manager 1.36's test cases with a PodGroup.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use super::super::cache::Caches;
use super::super::claim::{self, ClaimDecision};
use super::super::pod::{self, EntryAction};
use super::super::podgroup;
use crate::controllers::test_support::merge;
use crate::model::features::{FeatureGates, Release};
use crate::model::views::{ClaimView, PodGroupApi, PodGroupView, PodView, TemplateView};
use crate::naming::POD_CLAIM_NAME_ANNOTATION;
use crate::runtime::store::object_key;

const NS: &str = "my-namespace";
const GROUP: &str = "test-podgroup";
const GROUP_UID: &str = "uidpodgroup1";
const POD: &str = "test-pod";
const POD_UID: &str = "uidpod1";
const ENTRY: &str = "acme-resource";
const TEMPLATE: &str = "my-template";
const GROUP_CLAIM: &str = "test-podgroup-acme-resource-abcde";

fn api() -> PodGroupApi {
    PodGroupApi::default()
}

fn group_with(extra: Value) -> PodGroupView {
    let mut v = json!({
        "metadata": {"name": GROUP, "namespace": NS, "uid": GROUP_UID},
        "spec": {"resourceClaims": [{"name": ENTRY, "resourceClaimTemplateName": TEMPLATE}]},
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn pod_with(extra: Value) -> PodView {
    let mut v = json!({
        "metadata": {"name": POD, "namespace": NS, "uid": POD_UID},
        "spec": {"resourceClaims": [{"name": ENTRY, "resourceClaimTemplateName": TEMPLATE}],
                 "schedulingGroup": {"podGroupName": GROUP}},
    });
    merge(&mut v, extra);
    PodView::at_first_sight(serde_json::from_value(v).unwrap(), Instant::now())
}

fn group_claim(name: &str, extra: Value) -> ClaimView {
    let mut v = json!({"metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
        "annotations": {POD_CLAIM_NAME_ANNOTATION: ENTRY},
        "ownerReferences": [{"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
                             "name": GROUP, "uid": GROUP_UID, "controller": true}]}});
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn template() -> TemplateView {
    serde_json::from_value(json!({"metadata": {"name": TEMPLATE, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "c"}}]}}}}))
    .unwrap()
}

/// Caches with PodGroups served (or not) holding the given objects.
fn caches(
    groups_on: bool,
    groups: Vec<PodGroupView>,
    claims: Vec<ClaimView>,
    with_template: bool,
) -> Caches {
    let caches = if groups_on {
        Caches::with_pod_groups(api())
    } else {
        Caches::new()
    };
    for g in groups {
        caches
            .pod_groups
            .apply(object_key(g.namespace(), g.name()), Arc::new(g));
    }
    for c in claims {
        caches
            .claims
            .apply(object_key(c.namespace(), c.name()), Arc::new(c));
    }
    if with_template {
        caches
            .templates
            .apply(object_key(NS, TEMPLATE), Arc::new(template()));
    }
    caches
}

fn recorded_in_group(name: &str) -> Value {
    json!({"status": {"resourceClaimStatuses": [{"name": ENTRY, "resourceClaimName": name}]}})
}

/// What group work decides, in short: "create", "adopt <name>", "fail <text>".
fn group_actions(group: &PodGroupView, caches: &Caches) -> Vec<String> {
    let gates = FeatureGates {
        workload_resource_claims: true,
        ..FeatureGates::default()
    };
    let d = podgroup::decide(group, caches, gates, &api());
    if let Some(reason) = d.skipped {
        return vec![format!("skip {reason}")];
    }
    d.entries.iter().map(short).collect()
}

fn short(action: &EntryAction) -> String {
    match action {
        EntryAction::Create { claim, .. } => format!(
            "create {} owner {}/{} {}",
            claim["metadata"]["generateName"].as_str().unwrap(),
            claim["metadata"]["ownerReferences"][0]["apiVersion"]
                .as_str()
                .unwrap(),
            claim["metadata"]["ownerReferences"][0]["kind"]
                .as_str()
                .unwrap(),
            claim["metadata"]["annotations"][POD_CLAIM_NAME_ANNOTATION]
                .as_str()
                .unwrap(),
        ),
        EntryAction::Adopt { claim_name, .. } => format!("adopt {claim_name}"),
        EntryAction::Fail { reason, .. } => {
            format!("fail {}", reason.split(':').next().unwrap_or_default())
        }
    }
}

#[test]
fn group_work_table() {
    let create =
        format!("create {GROUP}-{ENTRY}- owner scheduling.k8s.io/v1alpha2/PodGroup {ENTRY}");
    let rows: Vec<(&str, PodGroupView, Caches, Vec<String>)> = vec![
        (
            "create for PodGroup",
            group_with(json!({})),
            caches(true, vec![], vec![], true),
            vec![create.clone()],
        ),
        (
            "nop for PodGroup",
            group_with(recorded_in_group(GROUP_CLAIM)),
            caches(
                true,
                vec![],
                vec![group_claim(GROUP_CLAIM, json!({}))],
                true,
            ),
            vec![],
        ),
        (
            "recreate for PodGroup",
            group_with(recorded_in_group(GROUP_CLAIM)),
            caches(true, vec![], vec![], true),
            vec![create.clone()],
        ),
        (
            "missing-template-podgroup",
            group_with(json!({})),
            caches(true, vec![], vec![], false),
            vec![format!(
                "fail ResourceClaimTemplate {NS}/{TEMPLATE} not found"
            )],
        ),
        (
            "find-existing-claim-by-label-podgroup",
            group_with(json!({})),
            caches(
                true,
                vec![],
                vec![group_claim(GROUP_CLAIM, json!({}))],
                true,
            ),
            vec![format!("adopt {GROUP_CLAIM}")],
        ),
        (
            "podgroup-deleted",
            group_with(json!({"metadata": {"deletionTimestamp": "2026-11-23T10:00:00Z"}})),
            caches(true, vec![], vec![], true),
            vec!["skip PodGroup is being deleted".into()],
        ),
        (
            "wrong-claim-owner-podgroup",
            group_with(recorded_in_group(GROUP_CLAIM)),
            caches(
                true,
                vec![],
                vec![
                    serde_json::from_value(
                        json!({"metadata": {"name": GROUP_CLAIM, "namespace": NS}}),
                    )
                    .unwrap(),
                ],
                true,
            ),
            vec![create.clone()],
        ),
        (
            "claim named directly: never created",
            group_with(
                json!({"spec": {"resourceClaims": [{"name": ENTRY, "resourceClaimName": "shared"}]}}),
            ),
            caches(true, vec![], vec![], true),
            vec![],
        ),
    ];
    for (case, group, caches, want) in rows {
        assert_eq!(group_actions(&group, &caches), want, "{case}");
        assert_eq!(
            podgroup::needs_work(&group, &caches, FeatureGates::default()),
            !want.is_empty() && !want[0].starts_with("skip"),
            "needs_work: {case}"
        );
    }
}

/// Entry actions, reservation consumers, skip reason.
type PodOutcome = (Vec<String>, Vec<Value>, Option<pod::Skip>);

/// The gates of a cluster of `release` whose API server serves PodGroups
/// exactly when the caches hold them (1.36: DRAWorkloadResourceClaims;
/// 1.37: GenericWorkload and DRAWorkloadResourceClaims).
fn gates_for(release: Release, caches: &Caches) -> FeatureGates {
    FeatureGates {
        release,
        workload_resource_claims: caches.pod_groups_enabled(),
        generic_workload: caches.pod_groups_enabled(),
        ..FeatureGates::default()
    }
}

fn pod_actions(pod: &PodView, caches: &Caches, gates: FeatureGates) -> PodOutcome {
    let d = pod::decide(pod, caches, gates);
    if let Some(why) = d.refused {
        let head = why.split(':').next().unwrap_or_default().to_string();
        return (vec![format!("refuse {head}")], vec![], None);
    }
    (
        d.entries.iter().map(short).collect(),
        d.reservations
            .iter()
            .map(|r| serde_json::to_value(&r.consumer).unwrap())
            .collect(),
        d.skipped,
    )
}

#[test]
fn member_pod_table() {
    let group = || group_with(recorded_in_group(GROUP_CLAIM));
    let allocated = json!({"status": {"allocation": {}}});
    let rows: Vec<(&str, PodView, Caches, PodOutcome)> = vec![
        (
            "skip create for Pod with PodGroup before template exists",
            pod_with(json!({})),
            caches(true, vec![group_with(json!({}))], vec![], false),
            (vec![], vec![], None),
        ),
        (
            "skip create for Pod with PodGroup after template exists",
            pod_with(json!({})),
            caches(true, vec![group_with(json!({}))], vec![], true),
            (vec![], vec![], None),
        ),
        (
            "update Pod status with PodGroup claim",
            pod_with(json!({})),
            caches(
                true,
                vec![group()],
                vec![group_claim(GROUP_CLAIM, json!({}))],
                true,
            ),
            (vec![format!("adopt {GROUP_CLAIM}")], vec![], None),
        ),
        (
            "recorded already",
            pod_with(
                json!({"status": {"resourceClaimStatuses": [{"name": ENTRY, "resourceClaimName": GROUP_CLAIM}]}}),
            ),
            caches(
                true,
                vec![group()],
                vec![group_claim(GROUP_CLAIM, json!({}))],
                true,
            ),
            (vec![], vec![], None),
        ),
        (
            "create ResourceClaim for Pod with PodGroup claim when feature is disabled",
            pod_with(json!({})),
            caches(
                false,
                vec![],
                vec![group_claim(GROUP_CLAIM, json!({}))],
                true,
            ),
            (
                vec![format!("create {POD}-{ENTRY}- owner v1/Pod {ENTRY}")],
                vec![],
                None,
            ),
        ),
        (
            "no-such-podgroup",
            pod_with(json!({})),
            caches(true, vec![], vec![], true),
            (vec![], vec![], Some(pod::Skip::PodGroupUnknown)),
        ),
        (
            "entry differs from the group's: the pod's own claim",
            pod_with(
                json!({"spec": {"resourceClaims": [{"name": ENTRY, "resourceClaimTemplateName": "other"}]}}),
            ),
            caches(true, vec![group()], vec![], true),
            (
                vec![format!("fail ResourceClaimTemplate {NS}/other not found")],
                vec![],
                None,
            ),
        ),
        (
            "add-reserved-podgroup",
            pod_with(json!({"spec": {"nodeName": "n1"},
             "status": {"resourceClaimStatuses": [{"name": ENTRY, "resourceClaimName": GROUP_CLAIM}]}})),
            caches(
                true,
                vec![group()],
                vec![group_claim(GROUP_CLAIM, allocated.clone())],
                true,
            ),
            (
                vec![],
                vec![
                    json!({"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": GROUP, "uid": GROUP_UID}),
                ],
                None,
            ),
        ),
        (
            "stay-reserved for the group",
            pod_with(json!({"spec": {"nodeName": "n1"},
             "status": {"resourceClaimStatuses": [{"name": ENTRY, "resourceClaimName": GROUP_CLAIM}]}})),
            caches(
                true,
                vec![group()],
                vec![group_claim(
                    GROUP_CLAIM,
                    json!({"status": {"allocation": {},
             "reservedFor": [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": GROUP, "uid": GROUP_UID}]}}),
                )],
                true,
            ),
            (vec![], vec![], None),
        ),
    ];
    // Every row under both releases; where 1.37 decides otherwise, its
    // outcome is here, named after its case.
    let in_1_37: Vec<(&str, PodOutcome)> = vec![(
        "create ResourceClaim for Pod with PodGroup claim when feature is disabled",
        (
            vec![format!(
                "refuse GenericWorkload feature is disabled but Pod is in PodGroup {GROUP}"
            )],
            vec![],
            None,
        ),
    )];
    for (case, pod, caches, want) in rows {
        let got = pod_actions(&pod, &caches, gates_for(Release::V1_36, &caches));
        assert_eq!(got, want, "1.36: {case}");
        let want = in_1_37
            .iter()
            .find(|(c, _)| *c == case)
            .map_or(want, |(_, w)| w.clone());
        let got = pod_actions(&pod, &caches, gates_for(Release::V1_37, &caches));
        assert_eq!(got, want, "1.37: {case}");
    }
}

/// 1.37's cases of pods in PodGroups with one of the two gates off
/// (`controller_test.go` of kube-controller-manager 1.37).
#[test]
fn member_pod_table_1_37() {
    let group = || group_with(recorded_in_group(GROUP_CLAIM));
    let allocated = json!({"status": {"allocation": {}}});
    let pod_claim = || -> ClaimView {
        serde_json::from_value(
            json!({"metadata": {"name": "pod-own-claim", "namespace": NS,
            "uid": "uid-pod-own-claim", "annotations": {POD_CLAIM_NAME_ANNOTATION: ENTRY},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": POD_UID,
                                 "controller": true}]},
            "status": {"allocation": {}}}),
        )
        .unwrap()
    };
    let on_node_with_own_claim = || {
        pod_with(json!({"spec": {"nodeName": "n1"},
            "status": {"resourceClaimStatuses": [{"name": ENTRY, "resourceClaimName": "pod-own-claim"}]}}))
    };
    let gates = |generic_workload: bool| FeatureGates {
        release: Release::V1_37,
        generic_workload,
        workload_resource_claims: false,
        ..FeatureGates::default()
    };
    let rows: Vec<(&str, PodView, Caches, FeatureGates, PodOutcome)> = vec![
        (
            "skip create ResourceClaim for Pod with PodGroup claim when GenericWorkload feature is disabled",
            pod_with(json!({})),
            caches(
                false,
                vec![],
                vec![group_claim(GROUP_CLAIM, json!({}))],
                true,
            ),
            gates(false),
            (
                vec![format!(
                    "refuse GenericWorkload feature is disabled but Pod is in PodGroup {GROUP}"
                )],
                vec![],
                None,
            ),
        ),
        (
            "skip-add-reserved-podgroup-genericworkload-disabled",
            on_node_with_own_claim(),
            caches(false, vec![], vec![pod_claim()], true),
            gates(false),
            (
                vec![format!(
                    "refuse GenericWorkload feature is disabled but Pod is in PodGroup {GROUP}"
                )],
                vec![],
                None,
            ),
        ),
        (
            "skip create ResourceClaim for Pod with PodGroup claim when DRAWorkloadResourceClaims feature is disabled",
            pod_with(json!({})),
            caches(
                true,
                vec![group()],
                vec![group_claim(GROUP_CLAIM, json!({}))],
                true,
            ),
            gates(true),
            (
                vec![format!(
                    "refuse DRAWorkloadResourceClaims feature is disabled but spec.resourceClaims[{ENTRY}] matches a claim of PodGroup {GROUP}"
                )],
                vec![],
                None,
            ),
        ),
        (
            "create ResourceClaim for grouped Pod with claim when DRAWorkloadResourceClaims feature is disabled",
            pod_with(json!({})),
            caches(
                true,
                vec![group_with(json!({"spec": {"resourceClaims": [
                    {"name": "other", "resourceClaimTemplateName": "other-template"}]}}))],
                vec![],
                true,
            ),
            gates(true),
            (
                vec![format!("create {POD}-{ENTRY}- owner v1/Pod {ENTRY}")],
                vec![],
                None,
            ),
        ),
        (
            "skip-add-reserved-podgroup-workloadresourceclaims-disabled",
            on_node_with_own_claim(),
            caches(
                true,
                vec![group()],
                vec![pod_claim(), group_claim(GROUP_CLAIM, allocated)],
                true,
            ),
            gates(true),
            (vec![], vec![], None),
        ),
        (
            "skip-create-for-pod-podgroup-does-not-exist (ours waits for the PodGroup's event instead of erroring)",
            pod_with(json!({})),
            caches(true, vec![], vec![], true),
            gates(true),
            (vec![], vec![], Some(pod::Skip::PodGroupUnknown)),
        ),
    ];
    for (case, pod, caches, gates, want) in rows {
        assert_eq!(pod_actions(&pod, &caches, gates), want, "{case}");
    }
}

fn claim_reserved_for_group(uid: &str) -> ClaimView {
    group_claim(
        GROUP_CLAIM,
        json!({"metadata": {"finalizers": ["resource.kubernetes.io/delete-protection"]},
               "status": {"allocation": {}, "reservedFor": [
                   {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": GROUP, "uid": uid}]}}),
    )
}

#[test]
fn group_reservations_table() {
    let decide =
        |caches: &Caches, claim: &ClaimView| claim::decide(claim, caches, &HashMap::new(), false);
    // clear-reserved-podgroup: the group was deleted.
    let gone = caches(true, vec![], vec![], true);
    gone.deleted_pod_groups.add(GROUP_UID.into());
    let ClaimDecision::Act(actions) = decide(&gone, &claim_reserved_for_group(GROUP_UID)) else {
        panic!("decided without lookups");
    };
    assert_eq!(
        actions.set_reserved_for,
        Some((vec![], true)),
        "deallocated"
    );
    assert!(actions.release_finalizer);
    assert!(!actions.delete, "group claims are the garbage collector's");
    // Replaced by a group of the same name.
    let replaced = caches(
        true,
        vec![group_with(json!({"metadata": {"uid": "other"}}))],
        vec![],
        true,
    );
    let ClaimDecision::Act(actions) = decide(&replaced, &claim_reserved_for_group(GROUP_UID))
    else {
        panic!("decided without lookups");
    };
    assert_eq!(actions.set_reserved_for, Some((vec![], true)));
    // Still there: kept.
    let there = caches(true, vec![group_with(json!({}))], vec![], true);
    assert_eq!(
        decide(&there, &claim_reserved_for_group(GROUP_UID)),
        ClaimDecision::Act(Default::default())
    );
    // Not cached, not seen deleted: ask the API server.
    let unknown = caches(true, vec![], vec![], true);
    assert_eq!(
        decide(&unknown, &claim_reserved_for_group(GROUP_UID)),
        ClaimDecision::NeedGroupLookup(vec![(GROUP.into(), GROUP_UID.into())])
    );
    // dont-clear-reserved-podgroup-feature-disabled: someone else's consumer.
    let off = caches(false, vec![], vec![], true);
    assert_eq!(
        decide(&off, &claim_reserved_for_group(GROUP_UID)),
        ClaimDecision::Act(Default::default())
    );
}

#[test]
fn review_cases() {
    // A group entry that names neither a claim nor a template: told, not skipped.
    let odd = group_with(json!({"spec": {"resourceClaims": [{"name": ENTRY}]}}));
    let actions = group_actions(&odd, &caches(true, vec![], vec![], true));
    assert_eq!(actions.len(), 1);
    assert!(
        actions[0].starts_with("fail spec.resourceClaims[acme-resource] sets neither"),
        "{actions:?}"
    );
    // "No claim needed" recorded for a bound entry: settled, not adopted over.
    let settled = pod_with(json!({"status": {"resourceClaimStatuses": [{"name": ENTRY}]}}));
    let c = caches(
        true,
        vec![group_with(recorded_in_group(GROUP_CLAIM))],
        vec![group_claim(GROUP_CLAIM, json!({}))],
        true,
    );
    assert_eq!(
        pod_actions(&settled, &c, gates_for(Release::V1_36, &c)),
        (vec![], vec![], None)
    );
    // A claim controlled by a PodGroup is never adopted by a pod, even one
    // whose UID the reference carries (gate off: the pod's own index only).
    let forged: ClaimView =
        serde_json::from_value(json!({"metadata": {"name": "forged", "namespace": NS,
        "annotations": {POD_CLAIM_NAME_ANNOTATION: ENTRY},
        "ownerReferences": [{"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
                             "name": GROUP, "uid": POD_UID, "controller": true}]}}))
        .unwrap();
    let plain: PodView = PodView::at_first_sight(
        serde_json::from_value(
            json!({"metadata": {"name": POD, "namespace": NS, "uid": POD_UID},
            "spec": {"resourceClaims": [{"name": ENTRY, "resourceClaimTemplateName": TEMPLATE}]}}),
        )
        .unwrap(),
        Instant::now(),
    );
    let c = caches(false, vec![], vec![forged], true);
    assert_eq!(
        pod_actions(&plain, &c, gates_for(Release::V1_36, &c)).0,
        vec![format!("create {POD}-{ENTRY}- owner v1/Pod {ENTRY}")]
    );
}
