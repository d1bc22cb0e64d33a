//! The status a watermark gets from one sync: counts and conditions, as a
//! plain value.

use serde_json::{Value, json};

use super::watermark::Condition;

/// What one sync found for a watermark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub generation: Option<i64>,
    pub desired: u32,
    /// Placeholders bound to a node.
    pub ready: u32,
    /// Placeholders not bound: the autoscaler's turn.
    pub pending: u32,
    /// Why the spec cannot be served, naming the field.
    pub invalid: Option<String>,
}

fn condition(
    type_: &str,
    on: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if on { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: String::new(),
        observed_generation: generation,
    }
}

/// `Ready`, `ScaleUpPending` and `Invalid`, without transition times (see
/// `watermark::carry_transitions`).
pub fn conditions(o: &Observed) -> Vec<Condition> {
    let g = o.generation;
    let ready = match &o.invalid {
        Some(_) => condition(
            "Ready",
            false,
            "InvalidSpec",
            "the spec cannot be served; see the Invalid condition".into(),
            g,
        ),
        None if o.ready >= o.desired => condition(
            "Ready",
            true,
            "PlaceholdersBound",
            format!("{} of {} placeholders bound", o.ready, o.desired),
            g,
        ),
        None => condition(
            "Ready",
            false,
            "PlaceholdersNotBound",
            format!("{} of {} placeholders bound", o.ready, o.desired),
            g,
        ),
    };
    let pending = if o.pending > 0 {
        condition(
            "ScaleUpPending",
            true,
            "PlaceholdersPending",
            format!(
                "{} placeholders wait for a node: the cluster autoscaler's turn to add one",
                o.pending
            ),
            g,
        )
    } else {
        condition(
            "ScaleUpPending",
            false,
            "NothingPending",
            "no placeholder waits for a node".into(),
            g,
        )
    };
    let invalid = match &o.invalid {
        Some(why) => condition("Invalid", true, "InvalidSpec", why.clone(), g),
        None => condition("Invalid", false, "Valid", "the spec is valid".into(), g),
    };
    vec![ready, pending, invalid]
}

/// The body of a merge patch of the status subresource.
pub fn status_patch(o: &Observed, conditions: &[Condition]) -> Value {
    json!({"status": {
        "observedGeneration": o.generation,
        "desiredPlaceholders": o.desired,
        "readyPlaceholders": o.ready,
        "pendingPlaceholders": o.pending,
        "conditions": conditions,
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(o: &Observed) -> Vec<(String, String)> {
        conditions(o)
            .into_iter()
            .map(|c| (c.type_, c.status))
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn conditions_follow_the_counts() {
        let rows = [
            (
                "all bound",
                Observed {
                    desired: 2,
                    ready: 2,
                    ..Default::default()
                },
                [
                    ("Ready", "True"),
                    ("ScaleUpPending", "False"),
                    ("Invalid", "False"),
                ],
            ),
            (
                "waiting for the autoscaler",
                Observed {
                    desired: 3,
                    ready: 1,
                    pending: 2,
                    ..Default::default()
                },
                [
                    ("Ready", "False"),
                    ("ScaleUpPending", "True"),
                    ("Invalid", "False"),
                ],
            ),
            (
                "invalid",
                Observed {
                    invalid: Some("spec.pausePodSize.cpu: bad".into()),
                    ..Default::default()
                },
                [
                    ("Ready", "False"),
                    ("ScaleUpPending", "False"),
                    ("Invalid", "True"),
                ],
            ),
        ];
        for (name, observed, want) in rows {
            assert_eq!(states(&observed), pairs(&want), "{name}");
        }
        let invalid = Observed {
            invalid: Some("spec.x is wrong".into()),
            ..Default::default()
        };
        assert!(conditions(&invalid)[2].message.contains("spec.x"));
    }
}
