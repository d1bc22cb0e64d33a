//! Decision tables for pod work and claim work. Row names follow the
//! reference controller's test cases so coverage can be compared line by line.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use super::super::cache::Caches;
use super::super::claim::{self, ClaimActions, ClaimDecision, LivePod};
use super::super::enqueue::pod_needs_work;
use super::super::pod::{self, EntryAction};
use crate::controllers::test_support::merge;
use crate::model::consumers::DELETE_PROTECTION_FINALIZER;
use crate::model::consumers::pod_consumer;
use crate::model::features::{FeatureGates, Release};
use crate::model::views::{ClaimView, PodView, TemplateView};
use crate::naming::POD_CLAIM_NAME_ANNOTATION;
use crate::runtime::store::object_key;

const NS: &str = "my-namespace";
const POD: &str = "test-pod";
const POD_UID: &str = "uidpod1";
const ENTRY: &str = "acme-resource";
const TEMPLATE: &str = "my-template";
const GENERATED: &str = "test-pod-acme-resource-abcde";

/// The pod of the reference tests: one template entry.
fn pod_with(extra: Value) -> PodView {
    let mut v = json!({
        "metadata": {"name": POD, "namespace": NS, "uid": POD_UID},
        "spec": {"resourceClaims": [{"name": ENTRY, "resourceClaimTemplateName": TEMPLATE}]},
        "status": {}
    });
    merge(&mut v, extra);
    PodView::at_first_sight(serde_json::from_value(v).unwrap(), Instant::now())
}

fn recorded(name: &str) -> Value {
    json!({"status": {"resourceClaimStatuses": [{"name": ENTRY, "resourceClaimName": name}]}})
}

fn claim_with(name: &str, extra: Value) -> ClaimView {
    let mut v = json!({"metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": "5"}});
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn owned_by(uid: &str) -> Value {
    json!({"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": uid, "controller": true}]}})
}

fn generated_claim(name: &str) -> ClaimView {
    let mut extra = owned_by(POD_UID);
    merge(
        &mut extra,
        json!({"metadata": {"annotations": {POD_CLAIM_NAME_ANNOTATION: ENTRY}}}),
    );
    claim_with(name, extra)
}

fn allocated(mut claim: Value) -> Value {
    merge(
        &mut claim,
        json!({"metadata": {"finalizers": [DELETE_PROTECTION_FINALIZER]}, "status": {"allocation": {"devices": {}}}}),
    );
    claim
}

fn reserved_for(pods: &[(&str, &str)]) -> Value {
    let entries: Vec<Value> = pods
        .iter()
        .map(|(name, uid)| json!({"resource": "pods", "name": name, "uid": uid}))
        .collect();
    json!({"status": {"reservedFor": entries}})
}

fn template(requests: Value) -> TemplateView {
    serde_json::from_value(json!({
        "metadata": {"name": TEMPLATE, "namespace": NS},
        "spec": {"metadata": {"labels": {"team": "ml"}}, "spec": {"devices": {"requests": requests}}}
    }))
    .unwrap()
}

fn plain_template() -> TemplateView {
    template(json!([{"name": "req-0", "exactly": {"deviceClassName": "my-resource-class"}}]))
}

fn caches(pods: &[PodView], claims: &[ClaimView], templates: &[TemplateView]) -> Caches {
    let c = Caches::new();
    for p in pods {
        c.pods
            .apply(object_key(p.namespace(), p.name()), Arc::new(p.clone()));
    }
    for cl in claims {
        c.claims
            .apply(object_key(cl.namespace(), cl.name()), Arc::new(cl.clone()));
    }
    for t in templates {
        c.templates
            .apply(object_key(t.namespace(), t.name()), Arc::new(t.clone()));
    }
    c
}

/// What pod work decided, reduced to comparable values: `Want<&str>` in
/// the table rows, `Want<String>` for what was decided.
#[derive(Debug, PartialEq)]
enum Want<S = &'static str> {
    Nothing,
    Create {
        generate_name: String,
        admin_access: bool,
    },
    Adopt(S),
    Fail(S),
    Reserve(S),
    /// `ResourceClaimNotAllocated` after the grace period.
    WarnUnallocated(S),
    /// A pod on a node lost its recorded claim: told, not replaced.
    Missing(S),
}

impl Want<String> {
    /// Equal to the row, where a `Fail` row names a part of the reason.
    fn matches(&self, want: &Want) -> bool {
        match (self, want) {
            (Want::Nothing, Want::Nothing) => true,
            (
                Want::Create {
                    generate_name: g,
                    admin_access: a,
                },
                Want::Create {
                    generate_name: wg,
                    admin_access: wa,
                },
            ) => g == wg && a == wa,
            (Want::Adopt(g), Want::Adopt(w))
            | (Want::Reserve(g), Want::Reserve(w))
            | (Want::WarnUnallocated(g), Want::WarnUnallocated(w))
            | (Want::Missing(g), Want::Missing(w)) => g == w,
            (Want::Fail(g), Want::Fail(w)) => g.contains(w),
            _ => false,
        }
    }
}

fn summarize(decision: &pod::PodDecision) -> Vec<Want<String>> {
    let mut out: Vec<Want<String>> = decision
        .entries
        .iter()
        .map(|a| match a {
            EntryAction::Create {
                claim,
                admin_access,
                ..
            } => Want::Create {
                generate_name: claim["metadata"]["generateName"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                admin_access: *admin_access,
            },
            EntryAction::Adopt { claim_name, .. } => Want::Adopt(claim_name.clone()),
            EntryAction::Fail { reason, .. } => Want::Fail(reason.clone()),
        })
        .collect();
    for r in &decision.reservations {
        out.push(Want::Reserve(r.claim.name().to_string()));
    }
    for name in &decision.unallocated {
        out.push(Want::WarnUnallocated(name.clone()));
    }
    for (_, name) in &decision.missing {
        out.push(Want::Missing(name.clone()));
    }
    if out.is_empty() {
        out.push(Want::Nothing);
    }
    out
}

#[test]
fn pod_work_table() {
    let all_on = FeatureGates::default();
    let gates_off = FeatureGates {
        admin_access: false,
        prioritized_list: false,
        ..FeatureGates::default()
    };
    let admin_template = template(
        json!([{"name": "req-0", "exactly": {"deviceClassName": "c", "adminAccess": true}}]),
    );
    let list_template = template(
        json!([{"name": "req-0", "firstAvailable": [{"name": "a", "deviceClassName": "c"}]}]),
    );
    let create = || Want::Create {
        generate_name: "test-pod-acme-resource-".into(),
        admin_access: false,
    };
    let scheduled = {
        let mut v = recorded(GENERATED);
        merge(&mut v, json!({"spec": {"nodeName": "worker"}}));
        pod_with(v)
    };
    let other_ns_claim: ClaimView = serde_json::from_value(json!({
        "metadata": {"name": "test-pod-acme-resource", "namespace": "not-my-namespace"}}))
    .unwrap();
    let unowned = claim_with(GENERATED, json!({}));

    let rows: Vec<PodRow> = vec![
        PodRow {
            case: "create",
            pod: pod_with(json!({})),
            claims: vec![],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![create()],
        },
        PodRow {
            case: "create with admin and feature gate off",
            pod: pod_with(json!({})),
            claims: vec![],
            templates: vec![admin_template.clone()],
            gates: gates_off,
            want: vec![Want::Fail("admin")],
        },
        PodRow {
            case: "create with admin and feature gate on",
            pod: pod_with(json!({})),
            claims: vec![],
            templates: vec![admin_template],
            gates: all_on,
            want: vec![Want::Create {
                generate_name: "test-pod-acme-resource-".into(),
                admin_access: true,
            }],
        },
        PodRow {
            case: "prioritized list with feature gate off",
            pod: pod_with(json!({})),
            claims: vec![],
            templates: vec![list_template.clone()],
            gates: gates_off,
            want: vec![Want::Fail("firstAvailable")],
        },
        PodRow {
            case: "prioritized list with feature gate on",
            pod: pod_with(json!({})),
            claims: vec![],
            templates: vec![list_template],
            gates: all_on,
            want: vec![create()],
        },
        PodRow {
            case: "nop",
            pod: pod_with(recorded(GENERATED)),
            claims: vec![generated_claim(GENERATED)],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![Want::Nothing],
        },
        PodRow {
            case: "recreate",
            pod: pod_with(recorded(GENERATED)),
            claims: vec![],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![create()],
        },
        PodRow {
            case: "missing-template",
            pod: pod_with(json!({})),
            claims: vec![],
            templates: vec![],
            gates: all_on,
            want: vec![Want::Fail("not found")],
        },
        PodRow {
            case: "find-existing-claim-by-label",
            pod: pod_with(json!({})),
            claims: vec![generated_claim(GENERATED)],
            templates: vec![],
            gates: all_on,
            want: vec![Want::Adopt(GENERATED)],
        },
        PodRow {
            case: "pod-deleted",
            pod: pod_with(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})),
            claims: vec![],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![Want::Nothing],
        },
        PodRow {
            case: "no-volumes",
            pod: serde_json::from_value(
                json!({"metadata": {"name": POD, "namespace": NS, "uid": POD_UID}}),
            )
            .unwrap(),
            claims: vec![],
            templates: vec![],
            gates: all_on,
            want: vec![Want::Nothing],
        },
        PodRow {
            case: "create-with-other-claim",
            pod: pod_with(json!({})),
            claims: vec![other_ns_claim],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![create()],
        },
        // A claim of that name exists but is not ours and the template is
        // missing: the error names the template, no claim is taken over.
        PodRow {
            case: "wrong-claim-owner",
            pod: pod_with(json!({})),
            claims: vec![unowned.clone()],
            templates: vec![],
            gates: all_on,
            want: vec![Want::Fail("not found")],
        },
        // Beyond: a recorded claim that lost its owner is replaced.
        PodRow {
            case: "recorded-claim-owned-by-other",
            pod: pod_with(recorded(GENERATED)),
            claims: vec![unowned],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![create()],
        },
        PodRow {
            case: "add-reserved",
            pod: scheduled.clone(),
            claims: vec![claim_with(GENERATED, allocated(owned_by(POD_UID)))],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![Want::Reserve(GENERATED)],
        },
        PodRow {
            case: "pre-scheduled pod, claim not allocated: the user is told",
            pod: scheduled.clone(),
            claims: vec![claim_with(GENERATED, owned_by(POD_UID))],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![Want::WarnUnallocated(GENERATED)],
        },
        PodRow {
            case: "bound by a scheduler, claim not allocated in our cache yet: no warning",
            pod: {
                let mut v = recorded(GENERATED);
                merge(
                    &mut v,
                    json!({"spec": {"nodeName": "worker"},
                        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}),
                );
                pod_with(v)
            },
            claims: vec![claim_with(GENERATED, owned_by(POD_UID))],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![Want::Nothing],
        },
        PodRow {
            case: "recorded claim gone, pod on a node: told, not replaced",
            pod: scheduled.clone(),
            claims: vec![],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![Want::Missing(GENERATED)],
        },
        PodRow {
            case: "recorded claim taken over, pod on a node: told, not replaced",
            pod: scheduled.clone(),
            claims: vec![claim_with(GENERATED, owned_by("someone-else"))],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![Want::Missing(GENERATED)],
        },
        PodRow {
            case: "stay-reserved (pre-scheduled, already reserved)",
            pod: scheduled,
            claims: vec![{
                let mut v = allocated(owned_by(POD_UID));
                merge(&mut v, reserved_for(&[(POD, POD_UID)]));
                claim_with(GENERATED, v)
            }],
            templates: vec![],
            gates: all_on,
            want: vec![Want::Nothing],
        },
        // 1.38's TestSyncHandler case (kubernetes #141276): a done pod on a
        // node is never reserved again, so a claim others still use keeps
        // its reservations as they are. Ours never did, whatever the release.
        PodRow {
            case: "do not reserve static claim for terminal pre-scheduled pod",
            pod: pod_with(json!({
                "spec": {"nodeName": "worker",
                         "resourceClaims": [{"name": ENTRY, "resourceClaimName": "static-claim"}]},
                "status": {"phase": "Succeeded"}})),
            claims: vec![claim_with("static-claim", {
                let mut v = allocated(json!({}));
                merge(&mut v, reserved_for(&[("other-pod", "other-uid")]));
                v
            })],
            templates: vec![],
            gates: all_on,
            want: vec![Want::Nothing],
        },
        // Beyond: a done pod never gets a claim again, even when its claim is gone.
        PodRow {
            case: "done-pod-not-recreated",
            pod: pod_with({
                let mut v = recorded(GENERATED);
                merge(&mut v, json!({"status": {"phase": "Succeeded"}}));
                v
            }),
            claims: vec![],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![Want::Nothing],
        },
        PodRow {
            case: "entry-with-neither-field",
            pod: serde_json::from_value(
                json!({"metadata": {"name": POD, "namespace": NS, "uid": POD_UID},
                "spec": {"resourceClaims": [{"name": ENTRY}]}}),
            )
            .unwrap(),
            claims: vec![],
            templates: vec![],
            gates: all_on,
            want: vec![Want::Fail("neither")],
        },
        PodRow {
            case: "skipped-entry",
            pod: pod_with(json!({"status": {"resourceClaimStatuses": [{"name": ENTRY}]}})),
            claims: vec![],
            templates: vec![plain_template()],
            gates: all_on,
            want: vec![Want::Nothing],
        },
    ];
    let mut failures = Vec::new();
    // Every row under every release: none of these cases differs.
    for (row, release) in rows.iter().flat_map(|row| {
        [Release::V1_36, Release::V1_37, Release::V1_38].map(|release| (row, release))
    }) {
        let c = caches(std::slice::from_ref(&row.pod), &row.claims, &row.templates);
        let gates = FeatureGates {
            release,
            ..row.gates
        };
        let decision = pod::decide(&row.pod, &c, gates);
        let got = summarize(&decision);
        let want = &row.want;
        let matches = got.len() == want.len() && got.iter().zip(want).all(|(g, w)| g.matches(w));
        if !matches {
            failures.push(format!(
                "{release}, case {:?}: got {got:?}, want {want:?}",
                row.case
            ));
        }
        // What wakes a pod and what its sync does must agree, or work is
        // either lost or done for nothing.
        if pod_needs_work(&row.pod, &c, gates).is_ok() == decision.is_noop() {
            failures.push(format!(
                "{release}, case {:?}: enqueue predicate and decision disagree",
                row.case
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One row of [`pod_work_table`].
struct PodRow {
    case: &'static str,
    pod: PodView,
    /// Claims in the cache.
    claims: Vec<ClaimView>,
    /// Templates in the cache.
    templates: Vec<TemplateView>,
    gates: FeatureGates,
    /// What pod work decides, in order.
    want: Vec<Want>,
}

#[test]
fn missing_claim_on_node_is_reported_once() {
    let pod = pod_with({
        let mut v = recorded(GENERATED);
        merge(&mut v, json!({"spec": {"nodeName": "worker"}}));
        v
    });
    let c = caches(std::slice::from_ref(&pod), &[], &[plain_template()]);
    c.note_missing_claim_reported(POD_UID, ENTRY);
    let decision = pod::decide(&pod, &c, FeatureGates::default());
    assert!(decision.is_noop(), "{decision:?}");
    assert_eq!(
        decision.recorded.get(ENTRY),
        Some(&Some(GENERATED.to_string())),
        "the recorded name stays"
    );
    assert!(pod_needs_work(&pod, &c, FeatureGates::default()).is_err());
}

/// Every apply carries every recorded entry: here `a` gets a new claim,
/// `b` fails (template gone) and keeps the name it had, `c` stays "no
/// claim needed".
#[test]
fn status_apply_keeps_failing_entries() {
    let pod: PodView = PodView::at_first_sight(
        serde_json::from_value(json!({
            "metadata": {"name": POD, "namespace": NS, "uid": POD_UID},
            "spec": {"resourceClaims": [
                {"name": "a", "resourceClaimTemplateName": "ta"},
                {"name": "b", "resourceClaimTemplateName": "tb"},
                {"name": "c", "resourceClaimTemplateName": "ta"}]},
            "status": {"resourceClaimStatuses": [
                {"name": "a", "resourceClaimName": "old-a"},
                {"name": "b", "resourceClaimName": "old-b"},
                {"name": "c"}]}
        }))
        .unwrap(),
        Instant::now(),
    );
    let ta: TemplateView = serde_json::from_value(json!({
        "metadata": {"name": "ta", "namespace": NS}, "spec": {"spec": {}}}))
    .unwrap();
    let c = caches(std::slice::from_ref(&pod), &[], &[ta]);
    let decision = pod::decide(&pod, &c, FeatureGates::default());
    let got = summarize(&decision);
    assert!(
        got.len() == 2
            && matches!(&got[0], Want::Create { generate_name, .. } if generate_name == "test-pod-a-")
            && matches!(&got[1], Want::Fail(reason) if reason.contains("tb")),
        "{got:?}"
    );
    let mut record = decision.recorded.clone();
    record.insert("a".into(), Some("new-a".into()));
    assert_eq!(
        pod::claim_statuses(&record),
        vec![
            json!({"name": "a", "resourceClaimName": "new-a"}),
            json!({"name": "b", "resourceClaimName": "old-b"}),
            json!({"name": "c"}),
        ]
    );
}

#[test]
fn find_created_claim_in_cache() {
    // The claim exists only in the "created a moment ago" overlay.
    let pod = pod_with(json!({}));
    let c = caches(std::slice::from_ref(&pod), &[], &[plain_template()]);
    c.remember_created(generated_claim(GENERATED));
    assert_eq!(
        summarize(&pod::decide(&pod, &c, FeatureGates::default())),
        vec![Want::Adopt(GENERATED.to_string())]
    );
}

#[test]
fn generated_claim_copies_template() {
    let pod = pod_with(json!({}));
    let (claim, admin) = pod::claim_from_template(&pod, ENTRY, &plain_template());
    assert!(!admin);
    assert_eq!(
        claim,
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": "test-pod-acme-resource-",
                "namespace": NS,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": POD_UID, "controller": true}],
                "annotations": {POD_CLAIM_NAME_ANNOTATION: ENTRY},
                "labels": {"team": "ml"},
            },
            "spec": {"devices": {"requests": [{"name": "req-0", "exactly": {"deviceClassName": "my-resource-class"}}]}},
        })
    );
}

fn decide_claim(
    claim: &ClaimView,
    pods: &[PodView],
    deleted: &[&str],
    live: &[(&str, LivePod)],
) -> ClaimDecision {
    decide_claim_with(claim, pods, deleted, live, false)
}

/// [`decide_claim`] with `pods_wait`: whether a pod waits to be scheduled.
fn decide_claim_with(
    claim: &ClaimView,
    pods: &[PodView],
    deleted: &[&str],
    live: &[(&str, LivePod)],
    pods_wait: bool,
) -> ClaimDecision {
    let c = caches(pods, std::slice::from_ref(claim), &[]);
    for uid in deleted {
        c.deleted_pods.add(uid.to_string());
    }
    let live: HashMap<String, LivePod> = live.iter().map(|(u, s)| (u.to_string(), *s)).collect();
    claim::decide(claim, &c, &live, pods_wait)
}

fn act(
    set: Option<(Vec<(&str, &str)>, bool)>,
    deallocate: bool,
    release: bool,
    delete: bool,
) -> ClaimDecision {
    ClaimDecision::Act(ClaimActions {
        set_reserved_for: set.map(|(pods, dealloc)| {
            (
                pods.iter().map(|(n, u)| pod_consumer(n, u)).collect(),
                dealloc,
            )
        }),
        deallocate,
        release_finalizer: release,
        delete,
    })
}

/// While a pod waits to be scheduled, a claim that goes away is
/// deallocated first: kube-scheduler retries waiting pods on a cleared
/// allocation, not on a deleted claim.
#[test]
fn claim_work_while_a_pod_waits() {
    let done = pod_with(json!({"status": {"phase": "Succeeded"}}));
    let protected = |extra: Value| {
        let mut v = owned_by(POD_UID);
        merge(
            &mut v,
            json!({"metadata": {"finalizers": [DELETE_PROTECTION_FINALIZER]},
                   "status": {"allocation": {"devices": {}}}}),
        );
        merge(&mut v, extra);
        claim_with(GENERATED, v)
    };
    let reserved = reserved_for(&[(POD, POD_UID)]);
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
    let mut deleting_reserved = deleting.clone();
    merge(&mut deleting_reserved, reserved.clone());
    let rows = [
        (
            "delete-claim-when-done: deallocate, delete, release",
            protected(reserved.clone()),
            act(Some((vec![], true)), false, true, true),
        ),
        (
            "done pod's claim already unreserved: deallocate alone first",
            protected(json!({})),
            act(None, true, true, true),
        ),
        (
            "killed between delete and finalizer: deallocate, release",
            protected(deleting_reserved),
            act(Some((vec![], true)), false, true, false),
        ),
        (
            "structured-deleted: deallocate, release",
            protected(deleting),
            act(None, true, true, false),
        ),
    ];
    for (case, claim, want) in rows {
        let got = decide_claim_with(&claim, std::slice::from_ref(&done), &[], &[], true);
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn claim_work_table() {
    let running = pod_with(json!({"status": {"phase": "Running"}}));
    let done = pod_with(json!({"status": {"phase": "Succeeded"}}));
    let reserved_claim = |extra: Value| {
        let mut v = owned_by(POD_UID);
        merge(&mut v, json!({"status": {"allocation": {"devices": {}}}}));
        merge(&mut v, reserved_for(&[(POD, POD_UID)]));
        merge(&mut v, extra);
        claim_with(GENERATED, v)
    };
    let structured = json!({"metadata": {"finalizers": [DELETE_PROTECTION_FINALIZER]}});
    let deleting = json!({"metadata": {"finalizers": [DELETE_PROTECTION_FINALIZER], "deletionTimestamp": "2026-01-01T00:00:00Z"}});
    let nothing = act(None, false, false, false);

    let rows: Vec<ClaimRow> = vec![
        ClaimRow {
            case: "stay-reserved-seen",
            claim: reserved_claim(json!({})),
            pods: vec![running.clone()],
            deleted: vec![],
            live: vec![],
            want: nothing.clone(),
        },
        ClaimRow {
            case: "stay-reserved-not-seen: ask the API server first",
            claim: reserved_claim(json!({})),
            pods: vec![],
            deleted: vec![],
            live: vec![],
            want: ClaimDecision::NeedLiveLookup(vec![(POD.into(), POD_UID.into())]),
        },
        ClaimRow {
            case: "stay-reserved-not-seen: the API server has it",
            claim: reserved_claim(json!({})),
            pods: vec![],
            deleted: vec![],
            live: vec![(POD_UID, LivePod::Active)],
            want: nothing.clone(),
        },
        ClaimRow {
            case: "clear-reserved-structured",
            claim: reserved_claim(structured.clone()),
            pods: vec![],
            deleted: vec![POD_UID],
            live: vec![],
            want: act(Some((vec![], true)), false, true, false),
        },
        ClaimRow {
            case: "clear-reserved-structured (pod never existed)",
            claim: reserved_claim(structured.clone()),
            pods: vec![],
            deleted: vec![],
            live: vec![(POD_UID, LivePod::Gone)],
            want: act(Some((vec![], true)), false, true, false),
        },
        ClaimRow { case: // A pod without claims of its own is not cached; the live
            // lookup tells whether it is done.
            "clear-reserved-when-done (pod without claims, read live)", claim: reserved_claim(structured.clone()), pods: vec![], deleted: vec![], live: vec![(POD_UID, LivePod::Done)], want: act(Some((vec![], true)), false, true, false) },
        ClaimRow {
            case: "dont-clear-reserved-structured",
            claim: {
                let mut v = structured.clone();
                merge(
                    &mut v,
                    reserved_for(&[(POD, POD_UID), ("other", "uid-other")]),
                );
                reserved_claim(v)
            },
            pods: vec![running.clone()],
            deleted: vec!["uid-other"],
            live: vec![],
            want: act(Some((vec![(POD, POD_UID)], false)), false, false, false),
        },
        ClaimRow {
            case: "clear-reserved-structured-deleted",
            claim: reserved_claim(deleting.clone()),
            pods: vec![],
            deleted: vec![POD_UID],
            live: vec![],
            want: act(None, false, true, false),
        },
        ClaimRow {
            case: "structured-deleted",
            claim: claim_with(GENERATED, allocated(deleting.clone())),
            pods: vec![],
            deleted: vec![],
            live: vec![],
            want: act(None, false, true, false),
        },
        ClaimRow {
            case: "clear-reserved-when-done (no owner, no finalizer: allocation stays)",
            claim: {
                let mut v = json!({"status": {"allocation": {"devices": {}}}});
                merge(&mut v, reserved_for(&[(POD, POD_UID)]));
                claim_with(GENERATED, v)
            },
            pods: vec![done.clone()],
            deleted: vec![],
            live: vec![],
            want: act(Some((vec![], false)), false, false, false),
        },
        ClaimRow {
            case: "remove-reserved",
            claim: {
                let mut v = reserved_for(&[(POD, POD_UID), ("test-pod-II", "uidpod1-II")]);
                merge(&mut v, json!({"status": {"allocation": {"devices": {}}}}));
                claim_with(GENERATED, v)
            },
            pods: vec![running.clone()],
            deleted: vec![],
            live: vec![("uidpod1-II", LivePod::Gone)],
            want: act(Some((vec![(POD, POD_UID)], false)), false, false, false),
        },
        ClaimRow {
            case: "delete-claim-when-done",
            claim: reserved_claim(structured.clone()),
            pods: vec![done.clone()],
            deleted: vec![],
            live: vec![],
            want: act(None, false, true, true),
        },
        ClaimRow {
            case: "pod replaced under the same name",
            claim: reserved_claim(structured.clone()),
            pods: vec![pod_with(json!({"metadata": {"uid": "uid-new"}}))],
            deleted: vec![],
            live: vec![],
            want: act(None, false, true, true),
        },
        ClaimRow {
            case: "clean up pod reservation with non-pod reservation present",
            claim: {
                let mut v = structured.clone();
                merge(
                    &mut v,
                    json!({"status": {"reservedFor": [
                        {"resource": "pods", "name": POD, "uid": POD_UID},
                        {"apiGroup": "foo.com", "resource": "foo", "name": "foo", "uid": "123"}]}}),
                );
                reserved_claim(v)
            },
            pods: vec![done.clone()],
            deleted: vec![],
            live: vec![],
            want: ClaimDecision::Act(ClaimActions {
                set_reserved_for: Some((
                    vec![
                        k8s_openapi::api::resource::v1::ResourceClaimConsumerReference {
                            api_group: Some("foo.com".into()),
                            resource: "foo".into(),
                            name: "foo".into(),
                            uid: "123".into(),
                        },
                    ],
                    false,
                )),
                ..Default::default()
            }),
        },
        ClaimRow {
            case: "extended-resource claim of a done pod is cleaned up",
            claim: {
                let mut v = structured.clone();
                merge(
                    &mut v,
                    json!({"metadata": {"annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}}}),
                );
                reserved_claim(v)
            },
            pods: vec![pod_with(json!({"status": {"phase": "Failed",
                "extendedResourceClaimStatus": {"resourceClaimName": GENERATED, "requestMappings": []}}}))],
            deleted: vec![],
            live: vec![],
            want: act(None, false, true, true),
        },
        ClaimRow {
            case: "claim of a done pod that is not generated: reservation and allocation go first",
            claim: {
                let mut v = structured.clone();
                merge(&mut v, json!({"status": {"allocation": {"devices": {}}}}));
                merge(&mut v, reserved_for(&[(POD, POD_UID)]));
                claim_with("shared", v)
            },
            pods: vec![done.clone()],
            deleted: vec![],
            live: vec![],
            want: act(Some((vec![], true)), false, true, false),
        },
        ClaimRow {
            case: "killed between delete and finalizer removal: the finalizer alone",
            claim: reserved_claim(deleting.clone()),
            pods: vec![done.clone()],
            deleted: vec![],
            live: vec![],
            want: act(None, false, true, false),
        },
        ClaimRow {
            case: "generated claim of a done pod without the finalizer: one delete",
            claim: reserved_claim(json!({})),
            pods: vec![done.clone()],
            deleted: vec![],
            live: vec![],
            want: act(None, false, false, true),
        },
        ClaimRow {
            case: "generated claim of a done pod still reserved by another pod stays",
            claim: {
                let mut v = structured.clone();
                merge(
                    &mut v,
                    reserved_for(&[(POD, POD_UID), ("other", "uid-other")]),
                );
                reserved_claim(v)
            },
            pods: vec![done.clone()],
            deleted: vec![],
            live: vec![("uid-other", LivePod::Active)],
            want: act(
                Some((vec![("other", "uid-other")], false)),
                false,
                false,
                false,
            ),
        },
        ClaimRow {
            case: "unused claim of a running pod stays",
            claim: claim_with(GENERATED, owned_by(POD_UID)),
            pods: vec![running],
            deleted: vec![],
            live: vec![],
            want: nothing.clone(),
        },
        ClaimRow {
            case: "owner pod unknown: left to the garbage collector",
            claim: claim_with(GENERATED, owned_by(POD_UID)),
            pods: vec![],
            deleted: vec![],
            live: vec![],
            want: nothing,
        },
    ];
    let failures: Vec<String> = rows
        .into_iter()
        .filter_map(|row| {
            let got = decide_claim(&row.claim, &row.pods, &row.deleted, &row.live);
            (got != row.want)
                .then(|| format!("case {:?}: got {got:?}, want {:?}", row.case, row.want))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One row of [`claim_work_table`].
struct ClaimRow {
    case: &'static str,
    claim: ClaimView,
    /// Pods in the cache.
    pods: Vec<PodView>,
    /// UIDs of pods seen deleted.
    deleted: Vec<&'static str>,
    /// Answers of live lookups, by pod UID.
    live: Vec<(&'static str, LivePod)>,
    want: ClaimDecision,
}

#[test]
fn live_lookup_answers() {
    let pod = |extra: Value| pod_with(extra);
    let rows = [
        ("no such pod", None, LivePod::Gone),
        (
            "another pod of that name",
            Some(pod(json!({"metadata": {"uid": "uid-new"}}))),
            LivePod::Gone,
        ),
        (
            "running",
            Some(pod(json!({"status": {"phase": "Running"}}))),
            LivePod::Active,
        ),
        ("pending", Some(pod(json!({}))), LivePod::Active),
        (
            "succeeded",
            Some(pod(json!({"status": {"phase": "Succeeded"}}))),
            LivePod::Done,
        ),
        (
            "failed",
            Some(pod(json!({"status": {"phase": "Failed"}}))),
            LivePod::Done,
        ),
        (
            "deleted before scheduling",
            Some(pod(
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            )),
            LivePod::Done,
        ),
        (
            "terminating on a node: containers may still run",
            Some(pod(
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"nodeName": "n"}}),
            )),
            LivePod::Active,
        ),
    ];
    for (case, answer, want) in rows {
        assert_eq!(LivePod::of(answer.as_ref(), POD_UID), want, "case {case}");
    }
}

/// What a resync queues: only claims whose work would do something.
#[test]
fn claim_needs_work_for_resync() {
    let running = pod_with(json!({"status": {"phase": "Running"}}));
    let done = pod_with(json!({"status": {"phase": "Succeeded"}}));
    let reserved = || {
        let mut v = allocated(owned_by(POD_UID));
        merge(&mut v, reserved_for(&[(POD, POD_UID)]));
        claim_with(GENERATED, v)
    };
    let rows = [
        ("reserved for a running pod", vec![running], true, false),
        ("reserved for a done pod", vec![done], true, true),
        ("reserved for a pod not in the cache", vec![], true, true),
        ("unreserved, owner unknown", vec![], false, false),
    ];
    for (case, pods, is_reserved, want) in rows {
        let claim = if is_reserved {
            reserved()
        } else {
            claim_with(GENERATED, owned_by(POD_UID))
        };
        let c = caches(&pods, std::slice::from_ref(&claim), &[]);
        assert_eq!(claim::needs_work(&claim, &c), want, "case {case}");
    }
}

/// A pod waits to start while it is on no node and not done; the answer
/// follows every update of the pod in the cache.
#[test]
fn pods_wait_to_start_follows_the_pod_cache() {
    let c = Caches::new();
    let key = object_key(NS, POD);
    assert!(!c.pods_wait_to_start(), "no pods");
    c.pods.apply(key.clone(), Arc::new(pod_with(json!({}))));
    assert!(c.pods_wait_to_start(), "unscheduled");
    c.pods.apply(
        key.clone(),
        Arc::new(pod_with(json!({"spec": {"nodeName": "n"}}))),
    );
    assert!(!c.pods_wait_to_start(), "bound");
    c.pods.apply(
        key.clone(),
        Arc::new(pod_with(json!({"status": {"phase": "Failed"}}))),
    );
    assert!(!c.pods_wait_to_start(), "done before it was scheduled");
    c.pods.apply(key.clone(), Arc::new(pod_with(json!({}))));
    c.pods.delete(&key);
    assert!(!c.pods_wait_to_start(), "gone");
}

/// The order of claim writes is part of the decision: what the executor
/// sends, one write after the other, for each shape of claim work.
#[test]
fn claim_writes_come_in_a_safe_order() {
    use super::super::claim::ClaimWrite::{Deallocate, Delete, ReleaseFinalizer, Reservations};
    let consumer: k8s_openapi::api::resource::v1::ResourceClaimConsumerReference =
        serde_json::from_value(json!({"resource": "pods", "name": "p", "uid": "u"})).unwrap();
    // (case, actions, allocated now, deleting now, writes in order)
    let rows = [
        (
            "done pod's claim, nobody waits: deleted while allocated, then released",
            ClaimActions {
                delete: true,
                release_finalizer: true,
                ..Default::default()
            },
            true,
            false,
            vec![Delete, ReleaseFinalizer],
        ),
        (
            "done pod's claim while a pod waits: deallocated first, then released and deleted",
            ClaimActions {
                set_reserved_for: Some((vec![], true)),
                delete: true,
                release_finalizer: true,
                ..Default::default()
            },
            true,
            false,
            vec![Reservations(vec![], true), ReleaseFinalizer, Delete],
        ),
        (
            "unused unallocated claim: released, then deleted at once",
            ClaimActions {
                delete: true,
                release_finalizer: true,
                ..Default::default()
            },
            false,
            false,
            vec![ReleaseFinalizer, Delete],
        ),
        (
            "a stale reservation dropped, others kept: nothing else",
            ClaimActions {
                set_reserved_for: Some((vec![consumer.clone()], false)),
                ..Default::default()
            },
            true,
            false,
            vec![Reservations(vec![consumer.clone()], false)],
        ),
        (
            "allocated, unused, not deleted: the finalizer stays",
            ClaimActions {
                release_finalizer: true,
                ..Default::default()
            },
            true,
            false,
            vec![],
        ),
        (
            "allocated and being deleted by someone else: released",
            ClaimActions {
                release_finalizer: true,
                ..Default::default()
            },
            true,
            true,
            vec![ReleaseFinalizer],
        ),
        (
            "deallocated for a waiting pod, kept",
            ClaimActions {
                deallocate: true,
                ..Default::default()
            },
            true,
            false,
            vec![Deallocate],
        ),
    ];
    for (case, actions, allocated, deleting, want) in rows {
        assert_eq!(actions.writes(allocated, deleting), want, "{case}");
    }
}
