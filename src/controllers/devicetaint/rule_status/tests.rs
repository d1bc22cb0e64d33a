//! The rule status table: rows carry the names of kube-controller-manager's
//! `TestController` cases whose status they check, with the messages it
//! writes word for word.

use std::time::Duration;

use k8s_openapi::api::resource::v1::DeviceTaintRule;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::json;

use super::*;

fn condition(status: &'static str, reason: &'static str, message: &str) -> RuleCondition {
    RuleCondition {
        status,
        reason,
        message: message.to_string(),
    }
}

#[test]
fn conditions_as_upstream_words_them() {
    let none = |published, allocated, pods, namespaces| RuleState::NoEffect {
        published,
        allocated,
        pods,
        namespaces,
    };
    let no_execute = |pending_pods, namespaces| RuleState::NoExecute {
        pending_pods,
        namespaces,
        waiting_for_budgets: BTreeMap::new(),
    };
    // Beyond upstream: a rule evicting through the Eviction API names the
    // budgets that hold its pods.
    let held_by_budgets = RuleState::NoExecute {
        pending_pods: 3,
        namespaces: 1,
        waiting_for_budgets: BTreeMap::from([(
            "web/web-pdb".to_string(),
            BTreeSet::from(["web/web-0".to_string(), "web/web-1".to_string()]),
        )]),
    };
    let rows: Vec<(&str, RuleState, u64, RuleCondition)> = vec![
        (
            "rule-status",
            no_execute(0, 0),
            0,
            condition("False", "NotStarted", ""),
        ),
        (
            "evict-pod-rule (pending)",
            no_execute(1, 1),
            0,
            condition(
                "True",
                "PodsPendingEviction",
                "1 pod needs to be evicted in 1 namespace.",
            ),
        ),
        (
            "beyond: pods waiting for a PodDisruptionBudget",
            held_by_budgets,
            1,
            condition(
                "True",
                "PodsPendingEviction",
                "3 pods need to be evicted in 1 namespace. 2 pods waiting for \
                 PodDisruptionBudget web/web-pdb. 1 pod evicted since starting the controller.",
            ),
        ),
        (
            "evict-pod-rule (done)",
            no_execute(0, 0),
            1,
            condition(
                "False",
                "Completed",
                "1 pod evicted since starting the controller.",
            ),
        ),
        (
            "evict-many-pods-many-namespaces",
            no_execute(2, 2),
            0,
            condition(
                "True",
                "PodsPendingEviction",
                "2 pods need to be evicted in 2 different namespaces.",
            ),
        ),
        (
            "evict-many-pods-same-namespace",
            no_execute(2, 1),
            0,
            condition(
                "True",
                "PodsPendingEviction",
                "2 pods need to be evicted in 1 namespace.",
            ),
        ),
        (
            "evict-pod-rule (one evicted, one pending)",
            no_execute(1, 1),
            1,
            condition(
                "True",
                "PodsPendingEviction",
                "1 pod needs to be evicted in 1 namespace. 1 pod evicted since starting the controller.",
            ),
        ),
        (
            "none-pod-rule",
            none(3, 1, 1, 1),
            0,
            condition(
                "False",
                "NoEffect",
                "3 published devices selected. 1 allocated device selected. 1 pod would be evicted in 1 namespace \
                 if the effect was NoExecute. This information will not be updated again. Recreate the \
                 DeviceTaintRule to trigger an update.",
            ),
        ),
        (
            "none-many-pods-many-namespaces",
            none(0, 3, 3, 2),
            0,
            condition(
                "False",
                "NoEffect",
                "0 published devices selected. 3 allocated devices selected. 3 pods would be evicted in 2 different \
                 namespaces if the effect was NoExecute. This information will not be updated again. Recreate the \
                 DeviceTaintRule to trigger an update.",
            ),
        ),
        (
            "ignore-none-effect (other effect)",
            RuleState::OtherEffect,
            0,
            condition(
                "False",
                "OtherEffect",
                "Eviction only happens for the NoExecute effect.",
            ),
        ),
    ];
    for (name, state, evicted, want) in rows {
        assert_eq!(rule_condition("r", &state, evicted), want, "{name}");
    }
}

/// Beyond upstream: a held rule says why and how to confirm it.
#[test]
fn a_held_rule_names_its_share_and_the_confirmation() {
    let c = rule_condition(
        "all-gpus",
        &RuleState::Held {
            selected: 8,
            allocated: 10,
            max_share: 0.5,
        },
        0,
    );
    assert_eq!((c.status, c.reason), ("False", "ConfirmationRequired"));
    assert!(
        c.message
            .contains("selects 8 of the 10 allocated devices (80%)"),
        "{}",
        c.message
    );
    assert!(
        c.message.contains(
            "kubectl annotate devicetaintrule all-gpus dra-claim-controller.io/confirm-eviction=true"
        ),
        "{}",
        c.message
    );
}

#[test]
fn the_guard_holds_only_large_unconfirmed_rules() {
    // (selected, allocated, max share, confirmed) -> held
    let rows = [
        ((10, 10, 0.5, false), true),
        ((10, 10, 0.5, true), false),
        ((5, 10, 0.5, false), false),
        ((6, 10, 0.5, false), true),
        ((10, 10, 1.0, false), false),
        // One device is never a cluster-wide mistake.
        ((1, 1, 0.5, false), false),
        ((0, 0, 0.5, false), false),
    ];
    for ((selected, allocated, share, confirmed), want) in rows {
        assert_eq!(
            is_held(selected, allocated, share, confirmed),
            want,
            "{selected}/{allocated} at {share}, confirmed {confirmed}"
        );
    }
}

fn rule_with(condition: Option<serde_json::Value>, generation: i64) -> DeviceTaintRule {
    let mut rule = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "r", "uid": "u", "generation": generation},
        "spec": {"taint": {"key": "k", "effect": "NoExecute"}, "deviceSelector": {}},
    });
    if let Some(c) = condition {
        rule["status"] = json!({"conditions": [c]});
    }
    serde_json::from_value(rule).unwrap()
}

#[test]
fn status_writes_are_skipped_when_unchanged_and_paced_within_a_generation() {
    let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let written = |generation: i64, message: &str| {
        json!({"type": CONDITION_TYPE, "status": "True", "reason": "PodsPendingEviction",
               "message": message, "observedGeneration": generation,
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let pending = condition(
        "True",
        "PodsPendingEviction",
        "2 pods need to be evicted in 1 namespace.",
    );
    let at = |secs: i64| t0.checked_add(SignedDuration::from_secs(secs)).unwrap();
    // No condition yet: written.
    assert_eq!(
        status_write(&rule_with(None, 1), pending.clone(), at(0)),
        StatusWrite::Write(pending.clone())
    );
    // The same condition: nothing.
    let same = rule_with(Some(written(1, &pending.message)), 1);
    assert_eq!(
        status_write(&same, pending.clone(), at(1)),
        StatusWrite::Unchanged
    );
    // Changed 3 s after the last write: in 7 s.
    let other = rule_with(
        Some(written(1, "1 pod needs to be evicted in 1 namespace.")),
        1,
    );
    assert_eq!(
        status_write(&other, pending.clone(), at(3)),
        StatusWrite::After(Duration::from_secs(7))
    );
    // ... and written once the period is over.
    assert_eq!(
        status_write(&other, pending.clone(), at(10)),
        StatusWrite::Write(pending.clone())
    );
    // A new generation (the spec changed) is written at once.
    let older = rule_with(Some(written(1, "x")), 2);
    assert_eq!(
        status_write(&older, pending.clone(), at(1)),
        StatusWrite::Write(pending)
    );
}

#[test]
fn a_none_rules_preview_is_taken_once_per_generation() {
    let previewed = |generation: i64, pods: usize| {
        json!({"type": CONDITION_TYPE, "status": "False", "reason": "NoEffect",
               "message": format!("{pods} pods would be evicted"), "observedGeneration": generation,
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let now: Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
    let preview = |pods| RuleState::NoEffect {
        published: 1,
        allocated: pods,
        pods,
        namespaces: 1,
    };
    let fresh = rule_condition("r", &preview(3), 0);
    // Taken again after a takeover or relist, with other pods now: the
    // status written for this generation stays.
    let rule = rule_with(Some(previewed(1, 1)), 1);
    assert_eq!(
        status_write(&rule, fresh.clone(), now),
        StatusWrite::Unchanged
    );
    // The spec changed (a new generation): taken again.
    let changed = rule_with(Some(previewed(1, 1)), 2);
    assert_eq!(
        status_write(&changed, fresh.clone(), now),
        StatusWrite::Write(fresh.clone())
    );
    // The effect changed to NoExecute (a new generation too): written.
    let executing = condition(
        "True",
        "PodsPendingEviction",
        "1 pod needs to be evicted in 1 namespace.",
    );
    assert_eq!(
        status_write(&changed, executing.clone(), now),
        StatusWrite::Write(executing)
    );
}

#[test]
fn only_a_preview_not_yet_taken_waits_for_the_other_watches() {
    let with_effect = |effect: &str, condition: Option<serde_json::Value>| {
        let mut rule = rule_with(condition, 1);
        rule.spec.taint.effect = effect.into();
        rule
    };
    let none = with_effect("None", None);
    assert_eq!(preview_wait(&none, Duration::ZERO), Some(SIMULATION_SETTLE));
    assert_eq!(
        preview_wait(&none, Duration::from_millis(500)),
        Some(SIMULATION_SETTLE - Duration::from_millis(500))
    );
    assert_eq!(preview_wait(&none, SIMULATION_SETTLE), None);
    // Taken for this generation already: nothing to wait for.
    let taken = json!({"type": CONDITION_TYPE, "status": "False", "reason": "NoEffect",
        "message": "m", "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"});
    assert_eq!(
        preview_wait(&with_effect("None", Some(taken)), Duration::ZERO),
        None
    );
    for effect in ["NoExecute", "NoSchedule", "Other"] {
        assert_eq!(
            preview_wait(&with_effect(effect, None), Duration::ZERO),
            None,
            "{effect}"
        );
    }
}
