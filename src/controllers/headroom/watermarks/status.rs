//! The status a watermark gets from one sync: counts per entry, totals and
//! conditions, as a plain value.

use serde_json::{Value, json};

use super::devices::DeviceCount;
use super::watermark::Condition;

/// What one sync found for one entry (`cpu` or a device entry).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EntryObserved {
    pub name: String,
    /// Device entries only.
    pub devices: Option<DeviceCount>,
    pub desired: u32,
    /// Placeholders bound to a node.
    pub ready: u32,
    /// Placeholders not bound: the autoscaler's turn.
    pub pending: u32,
    /// Why the entry cannot be served, naming the field.
    pub invalid: Option<String>,
}

/// What one sync found for a watermark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    pub generation: Option<i64>,
    pub entries: Vec<EntryObserved>,
    /// Placeholders released by yields, ever (kept in the status).
    pub yields: u64,
}

impl Observed {
    fn total(&self, of: impl Fn(&EntryObserved) -> u32) -> u32 {
        self.entries.iter().map(of).sum()
    }
    pub(crate) fn desired(&self) -> u32 {
        self.total(|e| e.desired)
    }
    pub(crate) fn ready(&self) -> u32 {
        self.total(|e| e.ready)
    }
    pub(crate) fn pending(&self) -> u32 {
        self.total(|e| e.pending)
    }
    fn invalid(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter_map(|e| e.invalid.as_deref())
            .collect()
    }
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
/// `watermark::carry_transitions`). An invalid entry makes the watermark
/// `Invalid` and not `Ready`; the other entries are still served.
pub(crate) fn conditions(o: &Observed) -> Vec<Condition> {
    let g = o.generation;
    let invalid = o.invalid();
    let (desired, ready_count, pending) = (o.desired(), o.ready(), o.pending());
    let bound = format!("{ready_count} of {desired} placeholders bound");
    let ready = if !invalid.is_empty() {
        condition(
            "Ready",
            false,
            "InvalidSpec",
            format!("{bound}; an entry cannot be served, see the Invalid condition"),
            g,
        )
    } else if ready_count >= desired {
        condition("Ready", true, "PlaceholdersBound", bound, g)
    } else {
        condition("Ready", false, "PlaceholdersNotBound", bound, g)
    };
    let scale_up = if pending > 0 {
        condition(
            "ScaleUpPending",
            true,
            "PlaceholdersPending",
            format!(
                "{pending} placeholders wait for a node: the cluster autoscaler's turn to add one"
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
    let invalid = if invalid.is_empty() {
        condition("Invalid", false, "Valid", "every entry is served".into(), g)
    } else {
        condition("Invalid", true, "InvalidSpec", invalid.join("; "), g)
    };
    vec![ready, scale_up, invalid]
}

/// The body of a merge patch of the status subresource.
pub(crate) fn status_patch(o: &Observed, conditions: &[Condition]) -> Value {
    let entries: Vec<Value> = o
        .entries
        .iter()
        .map(|e| {
            let mut v = json!({
                "name": e.name,
                "desiredPlaceholders": e.desired,
                "readyPlaceholders": e.ready,
                "pendingPlaceholders": e.pending,
            });
            if let Some(d) = e.devices {
                v["devicesTotal"] = json!(d.total);
                v["devicesInUse"] = json!(d.in_use);
                v["devicesHeld"] = json!(d.held);
            }
            if let Some(why) = &e.invalid {
                v["invalid"] = json!(why);
            }
            v
        })
        .collect();
    json!({"status": {
        "observedGeneration": o.generation,
        "desiredPlaceholders": o.desired(),
        "readyPlaceholders": o.ready(),
        "pendingPlaceholders": o.pending(),
        "entries": entries,
        "yields": o.yields,
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

    fn entry(
        name: &str,
        desired: u32,
        ready: u32,
        pending: u32,
        invalid: Option<&str>,
    ) -> EntryObserved {
        EntryObserved {
            name: name.into(),
            devices: None,
            desired,
            ready,
            pending,
            invalid: invalid.map(Into::into),
        }
    }

    fn observed(entries: Vec<EntryObserved>) -> Observed {
        Observed {
            generation: Some(1),
            entries,
            yields: 0,
        }
    }

    #[test]
    fn conditions_follow_the_entries() {
        let rows = [
            (
                "all bound",
                observed(vec![
                    entry("cpu", 2, 2, 0, None),
                    entry("gpu", 1, 1, 0, None),
                ]),
                [
                    ("Ready", "True"),
                    ("ScaleUpPending", "False"),
                    ("Invalid", "False"),
                ],
            ),
            (
                "waiting for the autoscaler",
                observed(vec![
                    entry("cpu", 0, 0, 0, None),
                    entry("gpu", 3, 1, 2, None),
                ]),
                [
                    ("Ready", "False"),
                    ("ScaleUpPending", "True"),
                    ("Invalid", "False"),
                ],
            ),
            (
                "one entry invalid, the other served",
                observed(vec![
                    entry("cpu", 1, 1, 0, None),
                    entry("gpu", 0, 0, 0, Some("spec.devices[0] (gpu): bad")),
                ]),
                [
                    ("Ready", "False"),
                    ("ScaleUpPending", "False"),
                    ("Invalid", "True"),
                ],
            ),
        ];
        for (name, o, want) in rows {
            assert_eq!(states(&o), pairs(&want), "{name}");
        }
    }

    #[test]
    fn patch_carries_totals_and_entries() {
        let mut gpu = entry("gpu", 3, 1, 2, None);
        gpu.devices = Some(DeviceCount {
            total: 6,
            in_use: 3,
            held: 1,
        });
        let mut o = observed(vec![
            entry("cpu", 2, 2, 0, None),
            gpu,
            entry("bad", 0, 0, 0, Some("spec.devices[1] (bad): no")),
        ]);
        o.yields = 7;
        let patch = status_patch(&o, &conditions(&o));
        assert_eq!(patch["status"]["yields"], 7);
        let s = &patch["status"];
        assert_eq!(
            (
                s["desiredPlaceholders"].clone(),
                s["readyPlaceholders"].clone(),
                s["pendingPlaceholders"].clone()
            ),
            (json!(5), json!(3), json!(2))
        );
        assert_eq!(s["entries"][1]["devicesInUse"], 3);
        assert_eq!(s["entries"][1]["devicesHeld"], 1);
        assert!(s["entries"][0]["devicesTotal"].is_null());
        assert_eq!(s["entries"][2]["invalid"], "spec.devices[1] (bad): no");
        let invalid = &conditions(&o)[2];
        assert!(
            invalid.message.contains("spec.devices[1] (bad)"),
            "{}",
            invalid.message
        );
    }
}
