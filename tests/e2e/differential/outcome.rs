//! A side's outcome as compared: the normalized snapshot (names made
//! comparable, events by key), the normalizers of the beyond points, and
//! the line diff shown when the sides differ.

use super::*;

/// Appended to references to a claim seen deleted.
pub(super) const DELETED: &str = " (deleted)";

/// `<generateName>*****` for a generated name, the name itself otherwise.
pub(super) fn normalize_claim_name(name: &str, generate_name: Option<&str>) -> String {
    match generate_name {
        Some(g) if !g.is_empty() && name.starts_with(g) && name.len() == g.len() + 5 => {
            format!("{g}*****")
        }
        _ => name.to_string(),
    }
}

/// Random names and uids → stable ones.
#[derive(Default)]
pub(super) struct Names {
    pub(super) claims: BTreeMap<String, String>,
    pub(super) uids: BTreeMap<String, String>,
}

impl Names {
    /// A reference to a claim (from a pod status or an event).
    pub(super) fn claim(&self, name: &str) -> String {
        match self.claims.get(name) {
            Some(n) => n.clone(),
            // Neither present nor seen deleted: keep what is not random.
            None if name.len() > 5 => format!("{}***** (no such claim)", &name[..name.len() - 5]),
            None => format!("{name} (no such claim)"),
        }
    }

    pub(super) fn uid(&self, uid: &str) -> String {
        self.uids
            .get(uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    pub(super) fn claim_value(&self, c: &ResourceClaim) -> Value {
        let m = &c.metadata;
        let owners: Vec<Value> = m
            .owner_references
            .iter()
            .flatten()
            .map(|o| {
                json!({
                    "apiVersion": o.api_version, "kind": o.kind, "name": o.name,
                    "uid": self.uid(&o.uid),
                    "controller": o.controller, "blockOwnerDeletion": o.block_owner_deletion,
                })
            })
            .collect();
        let status = c.status.clone().unwrap_or_default();
        let reserved: Vec<Value> = status
            .reserved_for
            .iter()
            .flatten()
            .map(|r| {
                json!({
                    "apiGroup": r.api_group, "resource": r.resource, "name": r.name,
                    "uid": self.uid(&r.uid),
                })
            })
            .collect();
        json!({
            "name": normalize_claim_name(m.name.as_deref().unwrap_or_default(), m.generate_name.as_deref()),
            "generateName": m.generate_name,
            // An empty map and none are the same object to every client.
            "labels": m.labels.clone().unwrap_or_default(),
            "annotations": m.annotations.clone().unwrap_or_default(),
            "ownerReferences": owners,
            "finalizers": m.finalizers.clone().unwrap_or_default(),
            "deleting": m.deletion_timestamp.is_some(),
            "spec": c.spec,
            "allocated": status.allocation.is_some(),
            "reservedFor": reserved,
        })
    }

    pub(super) fn pod_value(&self, p: &Pod) -> Value {
        let status = p.status.clone().unwrap_or_default();
        let mut claim_statuses: Vec<Value> = status
            .resource_claim_statuses
            .iter()
            .flatten()
            .map(|s| {
                json!({
                    "name": s.name,
                    "resourceClaimName": s.resource_claim_name.as_deref().map(|n| self.claim(n)),
                })
            })
            .collect();
        claim_statuses.sort_by_key(|s| s["name"].to_string());
        let mut status_managers: Vec<String> = p
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| m.subresource.as_deref() == Some("status"))
            .map(|m| {
                format!(
                    "{} {}",
                    m.manager.as_deref().unwrap_or_default(),
                    m.operation.as_deref().unwrap_or_default()
                )
            })
            .collect();
        status_managers.sort();
        json!({
            "name": p.metadata.name,
            "uid": self.uid(p.metadata.uid.as_deref().unwrap_or_default()),
            "deleting": p.metadata.deletion_timestamp.is_some(),
            "nodeName": p.spec.as_ref().and_then(|s| s.node_name.clone()),
            "phase": status.phase,
            "resourceClaimStatuses": claim_statuses,
            "statusManagers": status_managers,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct EventKey {
    pub(super) object: String,
    pub(super) type_: String,
    pub(super) reason: String,
}

/// The normalized outcome of a scenario on one server.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Snapshot {
    pub(super) claims: Vec<Value>,
    /// Last state of each claim deleted during the scenario.
    pub(super) deleted_claims: Vec<Value>,
    pub(super) pods: Vec<Value>,
    /// Event object, type and reason (not count, message or source).
    pub(super) events: BTreeSet<EventKey>,
    /// Not compared: shown when the outcomes differ.
    pub(super) messages: BTreeSet<String>,
}

impl Snapshot {
    /// The compared part, one line per field so a diff reads well.
    pub(super) fn render(&self) -> String {
        let events: Vec<String> = self
            .events
            .iter()
            .map(|e| format!("{} {} {}", e.type_, e.object, e.reason))
            .collect();
        serde_json::to_string_pretty(&json!({
            "claims": self.claims,
            "deletedClaims": self.deleted_claims,
            "pods": self.pods,
            "events": events,
        }))
        .expect("snapshot to JSON")
    }

    pub(super) fn pod(&self, name: &str) -> anyhow::Result<&Value> {
        self.pods
            .iter()
            .find(|p| p["name"] == name)
            .with_context(|| format!("no pod {name}"))
    }

    /// The normalized claim name recorded for `entry` of `pod`.
    /// The (normalized) claim name recorded for `entry` of `pod`, whether
    /// or not that claim exists.
    pub(super) fn recorded_name(&self, pod: &str, entry: &str) -> anyhow::Result<String> {
        let p = self.pod(pod)?;
        Ok(p["resourceClaimStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == entry)
            .with_context(|| format!("pod {pod}: entry {entry} not recorded"))?["resourceClaimName"]
            .as_str()
            .with_context(|| format!("pod {pod}: entry {entry} recorded without a claim"))?
            .to_string())
    }

    /// The claim recorded for `entry` of `pod`, which must exist.
    pub(super) fn recorded(&self, pod: &str, entry: &str) -> anyhow::Result<String> {
        let name = self.recorded_name(pod, entry)?;
        ensure!(
            self.claim(&name).is_ok(),
            "pod {pod}: entry {entry} records {name}, which does not exist"
        );
        Ok(name)
    }

    pub(super) fn claim(&self, normalized: &str) -> anyhow::Result<&Value> {
        self.claims
            .iter()
            .find(|c| c["name"] == normalized)
            .with_context(|| format!("no claim {normalized}"))
    }

    /// The `resource/name` entries of a claim's `reservedFor`.
    pub(super) fn reserved(&self, claim: &str) -> anyhow::Result<Vec<String>> {
        Ok(self.claim(claim)?["reservedFor"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "{}/{}",
                    r["resource"].as_str().unwrap_or(""),
                    r["name"].as_str().unwrap_or("")
                )
            })
            .collect())
    }

    /// Not reserved, not allocated, not protected.
    pub(super) fn released(&self, claim: &str) -> anyhow::Result<()> {
        let c = self.claim(claim)?;
        ensure!(
            self.reserved(claim)?.is_empty(),
            "{claim} reserved for {:?}",
            self.reserved(claim)?
        );
        ensure!(c["allocated"] == false, "{claim} still allocated");
        ensure!(
            c["finalizers"].as_array().is_none_or(Vec::is_empty),
            "{claim} finalizers {}",
            c["finalizers"]
        );
        Ok(())
    }

    pub(super) fn has_event(&self, reason: &str) -> anyhow::Result<()> {
        ensure!(
            self.events.iter().any(|e| e.reason == reason),
            "no {reason} event yet"
        );
        Ok(())
    }
}

/// Nothing ours does here goes beyond the reference, except possibly the
/// pre-scheduled-pod warning: a scenario that binds a pod with
/// `spec.nodeName` and allocates its claim a moment later (the test acting
/// as the driver) may catch ours warning in between. Timing, not behaviour,
/// decides whether it shows, so it is removed here too.
pub(super) fn same(s: &mut Snapshot) -> Vec<String> {
    drop_not_allocated_warnings(s)
}

/// Beyond (contract, "Pre-scheduled pods"): ours tells the user with a
/// Warning event when a pod bound with `spec.nodeName` uses a claim that
/// is not allocated; the reference stays silent. Removed from our outcome.
pub(super) fn drop_not_allocated_warnings(s: &mut Snapshot) -> Vec<String> {
    let ours: Vec<EventKey> = s
        .events
        .iter()
        .filter(|e| e.reason == NOT_ALLOCATED_REASON)
        .cloned()
        .collect();
    ours.into_iter()
        .map(|e| {
            s.events.remove(&e);
            format!(
                "ours also sent {} {} on {} (pre-scheduled pod whose claim is not allocated; the reference sends nothing)",
                e.type_, e.reason, e.object
            )
        })
        .collect()
}

/// [`drop_not_allocated_warnings`], requiring the warning on each of
/// `objects` (`Pod/<name>`): the beyond point must be delivered.
pub(super) fn require_not_allocated_warnings(
    objects: &[&str],
) -> impl Fn(&mut Snapshot) -> Vec<String> {
    let objects: Vec<String> = objects.iter().map(|o| o.to_string()).collect();
    move |s: &mut Snapshot| {
        let missing: Vec<&String> = objects
            .iter()
            .filter(|o| {
                !s.events
                    .iter()
                    .any(|e| e.reason == NOT_ALLOCATED_REASON && &e.object == *o)
            })
            .collect();
        assert!(
            missing.is_empty(),
            "beyond point not delivered: ours sent no Warning {NOT_ALLOCATED_REASON} on {missing:?} \
             (pods bound with spec.nodeName whose claims are not allocated); events: {:?}",
            s.events
        );
        drop_not_allocated_warnings(s)
    }
}

/// A line diff (longest common subsequence) of two renderings: `-` lines
/// only in `want`, `+` lines only in `got`, with two lines of context.
pub(super) fn line_diff(want: &str, got: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    let near_change = |k: usize| {
        ops[k.saturating_sub(2)..(k + 3).min(ops.len())]
            .iter()
            .any(|(op, _)| *op != ' ')
    };
    let mut out = String::new();
    let mut skipped = false;
    for (k, (op, line)) in ops.iter().enumerate() {
        if near_change(k) {
            if skipped {
                out.push_str("  ...\n");
                skipped = false;
            }
            out.push_str(&format!("{op} {line}\n"));
        } else {
            skipped = true;
        }
    }
    out
}

// ---- scenarios -------------------------------------------------------

#[test]
fn line_diff_shows_changes_with_context() {
    let want = "a\nb\nc\nd\ne\nf\ng\nh";
    let got = "a\nb\nc\nX\ne\nf\ng\nh\ni";
    assert_eq!(
        line_diff(want, got),
        "  ...\n  b\n  c\n- d\n+ X\n  e\n  f\n  g\n  h\n+ i\n"
    );
    assert!(!line_diff("same", "same").contains(['+', '-']));
}
