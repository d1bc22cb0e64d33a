//! The `DisruptionTarget` condition an eviction writes, against what the
//! pod carries (as the shared watch holds it), as kube-controller-manager's
//! `UpdatePodCondition` decides.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::*;
use crate::model::views::PodView;

/// The pod as the shared watch holds it, carrying `condition` if any.
fn pod_with(condition: Option<Value>) -> PodView {
    let conditions: Vec<Value> = condition.into_iter().collect();
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "status": {"conditions": conditions},
    }))
    .unwrap()
}

fn condition_on(pod: &PodView, now: Timestamp) -> Option<Value> {
    disruption_condition(pod.status.conditions.disruption_target.as_deref(), now)
}

fn target(status: &str, reason: &str, message: &str) -> Value {
    json!({"type": "DisruptionTarget", "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

#[test]
fn the_condition_keeps_its_transition_time_while_its_status_holds() {
    let now: Timestamp = "2026-06-01T12:00:00.400Z".parse().unwrap();
    let written_at = |pod: &PodView| {
        condition_on(pod, now).map(|c| c["lastTransitionTime"].as_str().unwrap().to_string())
    };
    // (case, on the pod, written at: None = nothing written)
    let rows = [
        (
            "no condition yet: written now",
            None,
            Some("2026-06-01T12:00:00Z"),
        ),
        (
            "ours already: nothing written",
            Some(target("True", CONDITION_REASON, CONDITION_MESSAGE)),
            None,
        ),
        (
            "True with another reason (a preemption, an eviction): ours, the time kept",
            Some(target("True", "PreemptionByScheduler", "preempted")),
            Some("2026-01-01T00:00:00Z"),
        ),
        (
            "False before: a transition, written now",
            Some(target("False", "Whatever", "")),
            Some("2026-06-01T12:00:00Z"),
        ),
    ];
    for (case, on_pod, want) in rows {
        assert_eq!(written_at(&pod_with(on_pod)).as_deref(), want, "{case}");
    }
    let written = condition_on(&pod_with(None), now).unwrap();
    assert_eq!(written["reason"], CONDITION_REASON);
    assert_eq!(written["message"], CONDITION_MESSAGE);
    assert_eq!(written["status"], "True");
}
