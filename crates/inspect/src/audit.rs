//! `audit`: the classifier over every claim of the cluster (or of one
//! namespace, or of those that matter to one node), with counts per node
//! and per driver.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;

use super::drain::{DrainScope, matters_to_node};
use super::placement::{DevicePlacement, device_placement};
use super::report::{AuditFinding, AuditReport, AuditScope, Finding, REPORT_API_VERSION};
use super::snapshot::{Snapshot, claim_ref, devices, named_pods};
use dra_model::classify::{ClaimFacts, problems};

/// Whether the claim is in the audit's scope. The reader has already
/// narrowed claims to the namespace.
fn in_scope(claim: &ResourceClaim, snapshot: &Snapshot, scope: &AuditScope) -> bool {
    let Some(node) = scope.node.as_deref() else {
        return true;
    };
    matters_to_node(claim, snapshot, DrainScope::new(node, None))
        || named_pods(claim).iter().any(|(ns, name)| {
            snapshot
                .pod(ns, name)
                .is_some_and(|p| p.node_name() == Some(node))
        })
}

/// The node a finding is counted under: its pod's node, else the node of
/// a node-local device, else `-`.
fn attributed_node(claim: &ResourceClaim, finding: &Finding, snapshot: &Snapshot) -> String {
    if let Some(subject) = &finding.subject
        && subject.kind == "Pod"
        && let Some(node) = snapshot
            .pod(&finding.claim.namespace, &subject.name)
            .filter(|p| subject.uid.is_empty() || p.uid() == subject.uid)
            .and_then(|p| p.node_name().map(str::to_string))
    {
        return node;
    }
    devices(claim, None)
        .iter()
        .find_map(
            |d| match device_placement(&snapshot.slices, &d.driver, &d.pool, &d.device) {
                DevicePlacement::Node(n) => Some(n),
                _ => None,
            },
        )
        .unwrap_or_else(|| "-".into())
}

pub(crate) fn audit(snapshot: &Snapshot, scope: AuditScope, now: Timestamp) -> AuditReport {
    let mut report = AuditReport {
        api_version: REPORT_API_VERSION,
        kind: "AuditReport",
        scope,
        checked_at: now.to_string(),
        claims: 0,
        counts: Default::default(),
        by_node: Default::default(),
        by_driver: Default::default(),
        findings: Vec::new(),
    };
    let mut claims: Vec<&ResourceClaim> = snapshot
        .claims
        .iter()
        .filter(|c| in_scope(c, snapshot, &report.scope))
        .collect();
    claims.sort_by_key(|c| (c.metadata.namespace.clone(), c.metadata.name.clone()));
    report.claims = claims.len();
    for claim in claims {
        let facts = ClaimFacts::from(claim);
        let lookup = |name: &str| snapshot.pod(facts.namespace, name);
        let devs = devices(claim, None);
        let drivers: BTreeSet<String> = if devs.is_empty() {
            BTreeSet::from(["-".to_string()])
        } else {
            devs.iter().map(|d| d.driver.clone()).collect()
        };
        for problem in problems(&facts, &lookup, now) {
            let finding = Finding::problem(claim_ref(claim), devs.clone(), &problem);
            let node = attributed_node(claim, &finding, snapshot);
            *report.counts.entry(finding.kind.clone()).or_default() += 1;
            *report
                .by_node
                .entry(node.clone())
                .or_default()
                .entry(finding.kind.clone())
                .or_default() += 1;
            for driver in &drivers {
                *report
                    .by_driver
                    .entry(driver.clone())
                    .or_default()
                    .entry(finding.kind.clone())
                    .or_default() += 1;
            }
            report.findings.push(AuditFinding { finding, node });
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_model::views::PodView;
    use serde_json::json;

    fn snapshot() -> Snapshot {
        let claims: Vec<ResourceClaim> = [
            // Reserved for a pod that finished on gpu-1.
            json!({"metadata": {"name": "stale", "namespace": "a"}, "spec": {},
                   "status": {"allocation": {"devices": {"results": [
                       {"request": "r", "driver": "gpu.example.com", "pool": "gpu-1", "device": "d0"}]}},
                              "reservedFor": [{"resource": "pods", "name": "done", "uid": "u1"}]}}),
            // Allocated on gpu-2 for nobody.
            json!({"metadata": {"name": "leaked", "namespace": "b"}, "spec": {},
                   "status": {"allocation": {"devices": {"results": [
                       {"request": "r", "driver": "gpu.example.com", "pool": "gpu-2", "device": "d0"}]}}}}),
            // Fine.
            json!({"metadata": {"name": "idle", "namespace": "a"}, "spec": {}}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
        let slices = ["gpu-1", "gpu-2"]
            .iter()
            .map(|n| {
                serde_json::from_value(json!({"metadata": {"name": n}, "spec": {
                    "driver": "gpu.example.com", "nodeName": n,
                    "pool": {"name": n, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "d0"}]}}))
                .unwrap()
            })
            .collect();
        let mut s = Snapshot {
            claims,
            slices,
            ..Default::default()
        };
        let done: PodView = serde_json::from_value(json!({
            "metadata": {"name": "done", "namespace": "a", "uid": "u1"},
            "spec": {"nodeName": "gpu-1"}, "status": {"phase": "Succeeded"}}))
        .unwrap();
        s.add_pod(done);
        s
    }

    #[test]
    fn counts_per_node_and_driver() {
        let r = audit(&snapshot(), AuditScope::default(), Timestamp::UNIX_EPOCH);
        assert_eq!(r.claims, 3);
        let kinds: Vec<(&str, &str, &str)> = r
            .findings
            .iter()
            .map(|f| {
                (
                    f.finding.kind.as_str(),
                    f.finding.claim.name.as_str(),
                    f.node.as_str(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("StaleReservation", "stale", "gpu-1"),
                ("LeakedAllocation", "leaked", "gpu-2")
            ]
        );
        assert_eq!(r.by_node["gpu-1"]["StaleReservation"], 1);
        assert_eq!(r.by_driver["gpu.example.com"].values().sum::<usize>(), 2);
        assert_eq!(r.exit_code(), 2);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["kind"], "AuditReport");
        assert_eq!(json["findings"][0]["type"], "StaleReservation");
        assert_eq!(json["findings"][0]["node"], "gpu-1");
    }

    /// A finding about a headroom placeholder names it as one, in JSON and
    /// in the table.
    #[test]
    fn placeholders_are_named() {
        let mut s = snapshot();
        let done: PodView = serde_json::from_value(json!({
            "metadata": {"name": "done", "namespace": "a", "uid": "u1",
                         "labels": {dra_model::naming::WATERMARK_LABEL: "pool"}},
            "spec": {"nodeName": "gpu-1"}, "status": {"phase": "Succeeded"}}))
        .unwrap();
        s.add_pod(done);
        let r = audit(&s, AuditScope::default(), Timestamp::UNIX_EPOCH);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["findings"][0]["subject"]["placeholderOf"], "pool");
        assert!(
            r.table().contains("done (placeholder of pool)"),
            "{}",
            r.table()
        );
        // The workload case says nothing of placeholders.
        let plain = serde_json::to_value(audit(
            &snapshot(),
            AuditScope::default(),
            Timestamp::UNIX_EPOCH,
        ))
        .unwrap();
        assert!(
            plain["findings"][0]["subject"]
                .get("placeholderOf")
                .is_none()
        );
    }

    #[test]
    fn node_scope() {
        let scope = AuditScope {
            node: Some("gpu-2".into()),
            namespace: None,
        };
        let r = audit(&snapshot(), scope, Timestamp::UNIX_EPOCH);
        assert_eq!(r.claims, 1);
        assert_eq!(r.findings[0].finding.claim.name, "leaked");
    }
}
