//! A DeviceTaintRule's `EvictionInProgress` condition, as a plain value:
//! kube-controller-manager's reasons and messages word for word, and ours
//! for a rule held for confirmation (the blast-radius guard).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::resource::v1::DeviceTaintRule;
use k8s_openapi::jiff::Timestamp;

use super::budgets::waiting_message;

/// The condition's type.
pub(crate) const CONDITION_TYPE: &str = "EvictionInProgress";

/// The reason of a `None` rule's preview.
const NO_EFFECT: &str = "NoEffect";

/// A status write is made at most this often per rule, unless its spec
/// changed (kube-controller-manager's pace).
pub(crate) const STATUS_PERIOD: Duration = Duration::from_secs(10);

/// A `None` rule's preview is taken this long after the rule is seen, not
/// at once: its status is written once ("will not be updated again"), and
/// the claims and pods an admin wrote just before the rule arrive on other
/// watches, which may be a little behind the rule's.
pub(crate) const SIMULATION_SETTLE: Duration = Duration::from_secs(2);

/// How much longer a rule's preview waits, seen `seen_for` ago: `None`,
/// take it now. Only a `None` rule without a preview for its generation
/// waits; everything else is written at once.
pub(crate) fn preview_wait(rule: &DeviceTaintRule, seen_for: Duration) -> Option<Duration> {
    if rule.spec.taint.effect != "None" || previewed(rule) {
        return None;
    }
    SIMULATION_SETTLE
        .checked_sub(seen_for)
        .filter(|d| !d.is_zero())
}

/// Whether the rule carries its preview for its current generation.
fn previewed(rule: &DeviceTaintRule) -> bool {
    current_condition(rule)
        .is_some_and(|c| c.reason == NO_EFFECT && c.observed_generation == rule.metadata.generation)
}

fn current_condition(
    rule: &DeviceTaintRule,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    rule.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_TYPE))
}

/// The annotation with which an admin confirms a held rule.
pub(crate) const CONFIRM_ANNOTATION: &str = "dra-claim-controller.io/confirm-eviction";

/// What the controller knows about one rule when it writes its status.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RuleState {
    /// `NoExecute`: pods still to evict, in how many namespaces; beyond
    /// upstream, the pods PodDisruptionBudgets hold (by budget,
    /// `namespace/name`) when the rule evicts through the Eviction API.
    NoExecute {
        pending_pods: usize,
        namespaces: usize,
        waiting_for_budgets: BTreeMap<String, BTreeSet<String>>,
    },
    /// `None`: what `NoExecute` would do (a simulation).
    NoEffect {
        published: usize,
        allocated: usize,
        pods: usize,
        namespaces: usize,
    },
    /// `NoSchedule` or an effect this release does not know.
    OtherEffect,
    /// Beyond upstream: `NoExecute`, but it selects more of the allocated
    /// devices than the guard allows and is not confirmed.
    Held {
        selected: usize,
        allocated: usize,
        max_share: f64,
    },
}

/// The condition to write (without times).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuleCondition {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

fn count(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        one.to_string()
    } else {
        many.replace("%d", &n.to_string())
    }
}

/// The condition for `state`, with `evicted` pods evicted for the rule
/// since this process started leading.
pub(crate) fn rule_condition(name: &str, state: &RuleState, evicted: u64) -> RuleCondition {
    let (status, reason, mut message) = match *state {
        RuleState::NoExecute {
            pending_pods,
            namespaces,
            ref waiting_for_budgets,
        } if pending_pods > 0 => (
            "True",
            "PodsPendingEviction",
            count(
                pending_pods,
                "1 pod needs to be evicted in ",
                "%d pods need to be evicted in ",
            ) + &count(namespaces, "1 namespace.", "%d different namespaces.")
                + &match waiting_message(waiting_for_budgets) {
                    waiting if waiting.is_empty() => waiting,
                    waiting => format!(" {waiting}"),
                },
        ),
        RuleState::NoExecute { .. } if evicted > 0 => ("False", "Completed", String::new()),
        RuleState::NoExecute { .. } => ("False", "NotStarted", String::new()),
        RuleState::NoEffect {
            published,
            allocated,
            pods,
            namespaces,
        } => (
            "False",
            NO_EFFECT,
            count(
                published,
                "1 published device selected. ",
                "%d published devices selected. ",
            ) + &count(
                allocated,
                "1 allocated device selected. ",
                "%d allocated devices selected. ",
            ) + &count(
                pods,
                "1 pod would be evicted in ",
                "%d pods would be evicted in ",
            ) + &count(namespaces, "1 namespace ", "%d different namespaces ")
                + "if the effect was NoExecute. This information will not be updated again. \
                   Recreate the DeviceTaintRule to trigger an update.",
        ),
        RuleState::OtherEffect => (
            "False",
            "OtherEffect",
            "Eviction only happens for the NoExecute effect.".to_string(),
        ),
        RuleState::Held {
            selected,
            allocated,
            max_share,
        } => (
            "False",
            "ConfirmationRequired",
            format!(
                "Held: this rule selects {selected} of the {allocated} allocated devices ({:.0}%), \
                 more than the {:.0}% that --device-taint-eviction-max-share allows without \
                 confirmation. No pod is evicted until an admin confirms: kubectl annotate \
                 devicetaintrule {name} {CONFIRM_ANNOTATION}=true",
                share(selected, allocated) * 100.0,
                max_share * 100.0
            ),
        ),
    };
    if evicted > 0 {
        if !message.is_empty() {
            message.push(' ');
        }
        message += &count(
            evicted as usize,
            "1 pod evicted since starting the controller.",
            "%d pods evicted since starting the controller.",
        );
    }
    RuleCondition {
        status,
        reason,
        message,
    }
}

fn share(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Whether a `NoExecute` rule is held: it selects more than `max_share`
/// of the allocated devices (and more than one device), and no admin
/// confirmed it. `max_share` of 1 or more turns the guard off.
pub(crate) fn is_held(selected: usize, allocated: usize, max_share: f64, confirmed: bool) -> bool {
    !confirmed && max_share < 1.0 && selected > 1 && share(selected, allocated) > max_share
}

/// What to do about the rule's status now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StatusWrite {
    /// Nothing changed.
    Unchanged,
    /// Written recently: look again after this long.
    After(Duration),
    /// Write this condition.
    Write(RuleCondition),
}

/// Whether to write `wanted` on `rule` at `now`: not when the condition
/// is the same (type, status, reason, message, observed generation), not
/// twice within [`STATUS_PERIOD`] for one generation, and a `None` rule's
/// preview only once per generation, as its message promises (a takeover
/// or relist does not take it again).
pub(crate) fn status_write(
    rule: &DeviceTaintRule,
    wanted: RuleCondition,
    now: Timestamp,
) -> StatusWrite {
    let generation = rule.metadata.generation;
    if wanted.reason == NO_EFFECT && previewed(rule) {
        return StatusWrite::Unchanged;
    }
    if let Some(c) = current_condition(rule) {
        if c.status == wanted.status
            && c.reason == wanted.reason
            && c.message == wanted.message
            && c.observed_generation == generation
        {
            return StatusWrite::Unchanged;
        }
        if c.observed_generation == generation {
            let since = now.duration_since(c.last_transition_time.0);
            let period =
                k8s_openapi::jiff::SignedDuration::try_from(STATUS_PERIOD).unwrap_or_default();
            if since < period {
                let left = (period - since).unsigned_abs();
                return StatusWrite::After(left);
            }
        }
    }
    StatusWrite::Write(wanted)
}

#[cfg(test)]
mod tests;
