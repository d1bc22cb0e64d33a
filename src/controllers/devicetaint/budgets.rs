//! Evictions that respect PodDisruptionBudgets, for planned maintenance:
//! a DeviceTaintRule annotated [`EVICTION_API_ANNOTATION`]`=true` has its
//! pods evicted through the Eviction API (`pods/eviction`, policy/v1), as
//! `kubectl drain` evicts a node's pods, instead of deleted. A budget that
//! allows no disruption now answers 429; the pod is tried again with
//! backoff, the refusal is not an error, and the rule's status, a Warning
//! event on the pod and a metric by rule say which budget holds it.
//! kube-controller-manager knows no such annotation: it deletes, as ours
//! does for every other taint (a device that failed must be left now).
//!
//! Such a rule may also set the seconds each pod gets to terminate
//! (`model::device_taints::GRACE_PERIOD_ANNOTATION`, `kubectl dra drain
//! --grace-period`).
//!
//! Pure functions; `evict.rs` acts on them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::resource::v1::DeviceTaintRule;

use crate::model::device_taints::TaintSource;

pub(crate) use crate::model::device_taints::EVICTION_API_ANNOTATION;

/// The reason of the Warning event on a pod a budget holds.
pub(crate) const BLOCKED_EVENT_REASON: &str = "EvictionBlockedByDisruptionBudget";

/// First pause after a refusal (kubectl drain asks again every 5 s).
const RETRY_FIRST: Duration = Duration::from_secs(5);
/// Longest pause between two tries for one pod.
const RETRY_MAX: Duration = Duration::from_secs(60);

/// Whether `rule` asks for evictions through the Eviction API.
pub(crate) fn respects_budgets(rule: &DeviceTaintRule) -> bool {
    rule.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EVICTION_API_ANNOTATION))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// Whether an eviction for `reasons` goes through the Eviction API: only
/// when every reason is a rule that asks for it (`asks`, by rule name). A
/// taint a driver put on its slice (a failed device), or a rule that does
/// not ask, deletes the pod as kube-controller-manager does.
pub(crate) fn through_eviction_api<'a>(
    reasons: impl IntoIterator<Item = &'a TaintSource>,
    asks: impl Fn(&str) -> bool,
) -> bool {
    let mut any = false;
    for reason in reasons {
        match reason {
            TaintSource::Rule { name, .. } if asks(name) => any = true,
            _ => return false,
        }
    }
    any
}

/// The seconds an eviction for `reasons` gives the pod to terminate: the
/// fewest any of its rules asks for (`asked`, by rule name); `None` (the
/// pod's own) when none asks.
pub(crate) fn grace_period<'a>(
    reasons: impl IntoIterator<Item = &'a TaintSource>,
    asked: impl Fn(&str) -> Option<i64>,
) -> Option<u32> {
    reasons
        .into_iter()
        .filter_map(|reason| match reason {
            TaintSource::Rule { name, .. } => asked(name),
            _ => None,
        })
        .min()
        .map(|s| u32::try_from(s).unwrap_or(u32::MAX))
}

/// The budget that refused an eviction (the API server's 429 names it in
/// a `DisruptionBudget` cause: "The disruption budget NAME needs ..." or
/// "... NAME is still being processed by the server."); `None` when the
/// refusal is not a budget's.
pub(crate) fn refusing_budget(status: &kube::core::Status) -> Option<String> {
    if status.code != 429 {
        return None;
    }
    let causes = status.details.as_ref().map(|d| d.causes.as_slice());
    let cause = causes
        .unwrap_or_default()
        .iter()
        .find(|c| c.reason == "DisruptionBudget")?;
    let name = cause
        .message
        .strip_prefix("The disruption budget ")?
        .split_whitespace()
        .next()?;
    Some(name.to_string())
}

/// How long to wait before trying a refused pod again, after `refusals`
/// refusals in a row (doubling from 5 s to 60 s).
pub(crate) fn retry_after(refusals: u32) -> Duration {
    let doublings = refusals.saturating_sub(1).min(8);
    (RETRY_FIRST * 2u32.pow(doublings)).min(RETRY_MAX)
}

/// The rule status's words for the pods budgets hold, by budget
/// (`namespace/name`): "1 pod waiting for PodDisruptionBudget ns/a. 2 pods
/// waiting for PodDisruptionBudget ns/b."; empty when none waits.
pub(crate) fn waiting_message(waiting: &BTreeMap<String, BTreeSet<String>>) -> String {
    waiting
        .iter()
        .map(|(budget, pods)| match pods.len() {
            1 => format!("1 pod waiting for PodDisruptionBudget {budget}."),
            n => format!("{n} pods waiting for PodDisruptionBudget {budget}."),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str) -> TaintSource {
        TaintSource::Rule {
            name: name.into(),
            uid: format!("{name}-uid"),
        }
    }

    fn slice() -> TaintSource {
        TaintSource::Slice {
            driver: "d".into(),
            pool: "p".into(),
            device: "x".into(),
            index: 0,
        }
    }

    #[test]
    fn the_shortest_grace_period_asked_for_applies() {
        let asked = |name: &str| match name {
            "quick" => Some(5),
            "slow" => Some(120),
            _ => None,
        };
        assert_eq!(
            grace_period([&rule("slow"), &rule("quick")], asked),
            Some(5)
        );
        assert_eq!(grace_period([&rule("slow"), &slice()], asked), Some(120));
        assert_eq!(
            grace_period([&rule("plain"), &slice()], asked),
            None,
            "the pod's own"
        );
        assert_eq!(grace_period([], asked), None);
    }

    #[test]
    fn only_rules_that_all_ask_go_through_the_eviction_api() {
        let asks = |name: &str| name.starts_with("drain-");
        let rows: [(&str, Vec<TaintSource>, bool); 5] = [
            ("one rule that asks", vec![rule("drain-a")], true),
            (
                "two rules that ask",
                vec![rule("drain-a"), rule("drain-b")],
                true,
            ),
            ("a rule that does not ask", vec![rule("other")], false),
            (
                "asks, beside one that does not",
                vec![rule("drain-a"), rule("other")],
                false,
            ),
            (
                "asks, beside a driver's slice taint",
                vec![rule("drain-a"), slice()],
                false,
            ),
        ];
        for (case, reasons, want) in rows {
            assert_eq!(through_eviction_api(&reasons, asks), want, "{case}");
        }
        assert!(!through_eviction_api(&[], asks), "no reason, no eviction");
    }

    fn refusal(code: u16, causes: serde_json::Value) -> kube::core::Status {
        serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": causes},
        }))
        .unwrap()
    }

    #[test]
    fn the_refusing_budget_is_read_from_the_api_servers_cause() {
        let needs = refusal(
            429,
            serde_json::json!([{"reason": "DisruptionBudget",
                "message": "The disruption budget web-pdb needs 2 healthy pods and has 2 currently"}]),
        );
        assert_eq!(refusing_budget(&needs).as_deref(), Some("web-pdb"));
        let processing = refusal(
            429,
            serde_json::json!([{"reason": "DisruptionBudget",
                "message": "The disruption budget web-pdb is still being processed by the server."}]),
        );
        assert_eq!(refusing_budget(&processing).as_deref(), Some("web-pdb"));
        // A 429 of the API server's own flow control names no budget.
        assert_eq!(refusing_budget(&refusal(429, serde_json::json!([]))), None);
        assert_eq!(refusing_budget(&refusal(500, serde_json::json!([]))), None);
    }

    #[test]
    fn refused_pods_are_tried_again_with_growing_pauses() {
        let pauses: Vec<u64> = (1..=6).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(pauses, [5, 10, 20, 40, 60, 60]);
        assert_eq!(retry_after(u32::MAX), RETRY_MAX);
    }

    #[test]
    fn the_status_names_each_budget_and_its_pods() {
        let mut waiting = BTreeMap::new();
        assert_eq!(waiting_message(&waiting), "");
        waiting.insert("ns/a".to_string(), BTreeSet::from(["ns/p1".to_string()]));
        waiting.insert(
            "ns/b".to_string(),
            BTreeSet::from(["ns/p2".to_string(), "ns/p3".to_string()]),
        );
        assert_eq!(
            waiting_message(&waiting),
            "1 pod waiting for PodDisruptionBudget ns/a. 2 pods waiting for PodDisruptionBudget ns/b."
        );
    }
}
