//! The eviction decision, rows named after kube-controller-manager 1.36's
//! `TestController` cases (`pkg/controller/devicetainteviction`) that a
//! pure decision covers, with the same set-up and outcome; two rows beyond
//! it are marked so.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::{Eviction, pod_eviction};
use crate::controllers::test_support::merge;
use crate::model::device_taints::{DeviceTaints, TaintRule, TaintSource};
use crate::model::views::{ClaimView, PodView};

const NS: &str = "default";
const POD_UID: &str = "pod-uid";
const CLAIM: &str = "my-claim";

fn t0() -> Timestamp {
    "2026-11-27T10:00:00Z".parse().unwrap()
}

fn taint(key: &str, effect: &str) -> Value {
    json!({"key": key, "value": "tainted", "effect": effect, "timeAdded": "2026-11-27T10:00:00Z"})
}

fn pod(extra: Value) -> PodView {
    let mut v = json!({
        "metadata": {"name": "my-pod", "namespace": NS, "uid": POD_UID},
        "spec": {"nodeName": "worker",
                 "resourceClaims": [{"name": "dev", "resourceClaimName": CLAIM}]},
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

/// The claim, allocated device `dev` of pool `pool` of driver `driver`,
/// reserved for the pod; `extra` merged over it.
fn claim(extra: Value) -> ClaimView {
    let mut v = json!({
        "metadata": {"name": CLAIM, "namespace": NS, "uid": "claim-uid"},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "req", "driver": "driver", "pool": "pool", "device": "dev"}]}},
            "reservedFor": [{"resource": "pods", "name": "my-pod", "uid": POD_UID}],
        },
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn tolerations(t: Value) -> Value {
    json!({"status": {"allocation": {"devices": {"results": [
        {"request": "req", "driver": "driver", "pool": "pool", "device": "dev", "tolerations": t}]}}}})
}

fn slice(generation: i64, devices: Value) -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("slice-{generation}")},
        "spec": {"driver": "driver", "nodeName": "worker",
                 "pool": {"name": "pool", "generation": generation, "resourceSliceCount": 1},
                 "devices": devices},
    }))
    .unwrap()
}

fn tainted_slice(taints: Value) -> ResourceSlice {
    slice(1, json!([{"name": "dev", "taints": taints}]))
}

fn rule(name: &str, effect: &str) -> TaintRule {
    TaintRule {
        name: name.into(),
        uid: format!("{name}-uid"),
        has_selector: true,
        driver: Some("driver".into()),
        pool: Some("pool".into()),
        device: Some("dev".into()),
        taint: serde_json::from_value::<DeviceTaint>(taint(&format!("example.com/{name}"), effect))
            .unwrap(),
    }
}

fn from_slice(index: usize) -> TaintSource {
    TaintSource::Slice {
        driver: "driver".into(),
        pool: "pool".into(),
        device: "dev".into(),
        index,
    }
}

fn from_rule(name: &str) -> TaintSource {
    TaintSource::Rule {
        name: name.into(),
        uid: format!("{name}-uid"),
    }
}

struct Row {
    case: &'static str,
    pod: PodView,
    claim: ClaimView,
    slices: Vec<ResourceSlice>,
    rules: Vec<TaintRule>,
    pod_group_claims: bool,
    /// Seconds after the taint was added, and the taints that count.
    want: Option<(i64, Vec<TaintSource>)>,
}

fn row(case: &'static str) -> Row {
    Row {
        case,
        pod: pod(json!({})),
        claim: claim(json!({})),
        slices: vec![tainted_slice(json!([taint(
            "example.com/taint",
            "NoExecute"
        )]))],
        rules: Vec::new(),
        pod_group_claims: false,
        want: Some((0, vec![from_slice(0)])),
    }
}

fn rows() -> Vec<Row> {
    let untainted = || vec![slice(1, json!([{"name": "dev"}]))];
    let template_pod = |status: Value| {
        pod(json!({"spec": {"resourceClaims": [
            {"name": "dev", "resourceClaimName": null, "resourceClaimTemplateName": "tmpl"}]},
            "status": status}))
    };
    let owned = json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
        "name": "my-pod", "uid": POD_UID, "controller": true}]}});
    vec![
        Row {
            want: None,
            slices: untainted(),
            ..row("untainted-claim")
        },
        row("tainted-claim-through-resourceslice"),
        Row {
            slices: vec![],
            rules: vec![rule("rule", "NoExecute")],
            want: Some((0, vec![from_rule("rule")])),
            ..row("tainted-claim-through-rule")
        },
        row("evict-pod-resourceclaim"),
        Row {
            pod: template_pod(
                json!({"resourceClaimStatuses": [{"name": "dev", "resourceClaimName": CLAIM}]}),
            ),
            claim: claim(owned.clone()),
            ..row("evict-pod-resourceclaimtemplate")
        },
        Row {
            claim: claim(tolerations(
                json!([{"key": "example.com/taint", "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 3600}]),
            )),
            want: Some((3600, vec![from_slice(0)])),
            ..row("evict-pod-later")
        },
        Row {
            claim: claim(tolerations(json!([
                {"key": "example.com/taint", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
                {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]))),
            want: Some((30, vec![from_slice(0)])),
            ..row("evict-pod-later-many")
        },
        Row {
            claim: claim(tolerations(
                json!([{"key": "example.com/other", "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 3600}]),
            )),
            ..row("evict-pod-toleration-mismatch")
        },
        Row {
            claim: claim(tolerations(
                json!([{"operator": "Exists", "effect": "NoExecute"}]),
            )),
            want: None,
            ..row("no-evict-pod-toleration-forever")
        },
        Row {
            claim: claim(tolerations(json!([
                {"operator": "Exists", "effect": "NoExecute"},
                {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]))),
            want: None,
            ..row("no-evict-pod-toleration-forever-many")
        },
        Row {
            slices: vec![tainted_slice(json!([
                taint("example.com/a", "NoExecute"),
                taint("example.com/b", "NoExecute")
            ]))],
            claim: claim(tolerations(
                json!([{"key": "example.com/a", "operator": "Exists", "effect": "NoExecute"}]),
            )),
            want: Some((0, vec![from_slice(1)])),
            ..row("evict-pod-partial-toleration")
        },
        Row {
            slices: vec![tainted_slice(json!([
                taint("example.com/a", "NoExecute"),
                taint("example.com/b", "NoExecute")
            ]))],
            rules: vec![rule("rule-b", "NoExecute"), rule("rule-a", "NoExecute")],
            claim: claim(tolerations(json!([
                {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
                {"key": "example.com/b", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]))),
            want: Some((
                30,
                vec![
                    from_rule("rule-a"),
                    from_rule("rule-b"),
                    from_slice(0),
                    from_slice(1),
                ],
            )),
            ..row("evict-pod-many-taints")
        },
        Row {
            pod: pod(json!({"spec": {"nodeName": null}})),
            want: None,
            ..row("no-evict-pod-not-scheduled")
        },
        Row {
            slices: untainted(),
            want: None,
            ..row("no-evict-no-taint")
        },
        Row {
            pod: template_pod(json!({})),
            claim: claim(owned.clone()),
            want: None,
            ..row("no-evict-pod-resourceclaimtemplate-no-status")
        },
        Row {
            pod: template_pod(
                json!({"resourceClaimStatuses": [{"name": "dev", "resourceClaimName": null}]}),
            ),
            claim: claim(owned.clone()),
            want: None,
            ..row("no-evict-pod-resourceclaimtemplate-no-claim")
        },
        Row {
            slices: vec![slice(
                1,
                json!([{"name": "dev"}, {"name": "other", "taints": [taint("example.com/taint", "NoExecute")]}]),
            )],
            want: None,
            ..row("no-evict-other-device")
        },
        Row {
            claim: claim(
                json!({"status": {"reservedFor": [{"resource": "pods", "name": "my-pod", "uid": "other-uid"}]}}),
            ),
            want: None,
            ..row("no-evict-wrong-pod")
        },
        Row {
            pod: template_pod(
                json!({"resourceClaimStatuses": [{"name": "dev", "resourceClaimName": CLAIM}]}),
            ),
            want: None,
            ..row("no-evict-wrong-resourceclaim")
        },
        Row {
            slices: vec![tainted_slice(json!([taint("example.com/taint", "None")]))],
            want: None,
            ..row("ignore-none-effect")
        },
        Row {
            slices: vec![tainted_slice(json!([taint(
                "example.com/taint",
                "Unknown"
            )]))],
            want: None,
            ..row("ignore-unknown-effect")
        },
        Row {
            slices: vec![
                tainted_slice(json!([taint("example.com/taint", "NoExecute")])),
                slice(2, json!([{"name": "dev"}])),
            ],
            want: None,
            ..row("cancel-eviction-remove-taint-in-new-slice")
        },
        Row {
            pod: pod(json!({"spec": {"schedulingGroup": {"podGroupName": "group"}}})),
            claim: claim(json!({"status": {"reservedFor": [
                {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "group", "uid": "group-uid"}]}})),
            pod_group_claims: true,
            ..row("evict-pod-resourceclaim-podgroup")
        },
        Row {
            pod: pod(
                json!({"spec": {"schedulingGroup": {"podGroupName": "group"}, "resourceClaims": []}}),
            ),
            claim: claim(json!({"status": {"reservedFor": [
                {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "group", "uid": "group-uid"}]}})),
            pod_group_claims: true,
            want: None,
            ..row("no-evict-pod-in-podgroup-without-claim")
        },
        Row {
            pod: pod(json!({"spec": {"schedulingGroup": {"podGroupName": "group"}}})),
            claim: claim(json!({"status": {"reservedFor": [
                {"apiGroup": "example.com", "resource": "podgroups", "name": "group", "uid": "group-uid"}]}})),
            pod_group_claims: true,
            want: None,
            ..row("no-evict-podgroups-of-another-api-group")
        },
        // 1.38's (kubernetes #142289), beyond 1.36 and 1.37: a pod holding
        // the device through its extended resources goes too, when the
        // claim is its own.
        Row {
            pod: pod(json!({"spec": {"resourceClaims": []},
                "status": {"extendedResourceClaimStatus": {"resourceClaimName": CLAIM, "requestMappings": []}}})),
            claim: claim(owned.clone()),
            ..row("evict-pod-extended-resourceclaim")
        },
        Row {
            pod: pod(json!({"spec": {"resourceClaims": []},
                "status": {"extendedResourceClaimStatus": {"resourceClaimName": CLAIM, "requestMappings": []}}})),
            claim: claim(
                json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                "name": "my-pod", "uid": "1234-other", "controller": true}]}}),
            ),
            want: None,
            ..row("no-evict-extended-resourceclaim-wrong-owner")
        },
        // As upstream: a toleration must name the NoExecute effect to count.
        Row {
            claim: claim(tolerations(
                json!([{"operator": "Exists", "tolerationSeconds": 3600}]),
            )),
            ..row("evict-pod-toleration-without-effect")
        },
    ]
}

#[test]
fn evictions_follow_kube_controller_managers_cases() {
    let mut failures = Vec::new();
    for row in rows() {
        let taints = DeviceTaints::new(&row.slices, row.rules.clone());
        let claim = &row.claim;
        let got = pod_eviction(
            &row.pod,
            |ns, name| (ns == NS && name == CLAIM).then_some(claim),
            &taints,
            row.pod_group_claims,
        );
        let want = row.want.map(|(secs, reasons)| Eviction {
            at: t0().checked_add(SignedDuration::from_secs(secs)).unwrap(),
            reasons: reasons.into_iter().collect::<BTreeSet<_>>(),
        });
        if got != want {
            failures.push(format!("{}: got {got:?}, want {want:?}", row.case));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A taint without a time still counts as a reason beside a timed one.
#[test]
fn an_untimed_taint_is_a_reason_beside_a_timed_one() {
    let mut untimed =
        serde_json::from_value::<DeviceTaint>(taint("example.com/r", "NoExecute")).unwrap();
    untimed.time_added = None;
    let rule = TaintRule {
        taint: untimed,
        ..rule("rule", "NoExecute")
    };
    let slices = [tainted_slice(json!([taint(
        "example.com/taint",
        "NoExecute"
    )]))];
    let taints = DeviceTaints::new(&slices, vec![rule]);
    let claim = claim(json!({}));
    let got = pod_eviction(&pod(json!({})), |_, _| Some(&claim), &taints, false).unwrap();
    assert_eq!(got.at, t0());
    assert_eq!(
        got.reasons,
        BTreeSet::from([from_rule("rule"), from_slice(0)])
    );
}

/// A taint without a time (the API server always sets one) evicts nobody.
#[test]
fn a_taint_without_a_time_evicts_nobody() {
    let mut untimed =
        serde_json::from_value::<DeviceTaint>(taint("example.com/taint", "NoExecute")).unwrap();
    untimed.time_added = None;
    let rule = TaintRule {
        taint: untimed,
        ..rule("rule", "NoExecute")
    };
    let taints = DeviceTaints::new(&[] as &[ResourceSlice], vec![rule]);
    let claim = claim(json!({}));
    assert_eq!(
        pod_eviction(&pod(json!({})), |_, _| Some(&claim), &taints, false),
        None
    );
}
