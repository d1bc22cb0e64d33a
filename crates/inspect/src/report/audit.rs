//! The `audit` document: findings across the cluster, counted by kind.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::table::*;
use super::*;

/// `kind: AuditReport`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AuditReport {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub scope: AuditScope,
    pub checked_at: String,
    /// Claims examined.
    pub claims: usize,
    /// Findings per type.
    pub counts: BTreeMap<String, usize>,
    /// Findings per node (the pod's node, or the node-local device's node;
    /// `-` when neither is known) and type.
    pub by_node: BTreeMap<String, BTreeMap<String, usize>>,
    /// Findings per driver of the claim's devices (`-` when not allocated) and type.
    pub by_driver: BTreeMap<String, BTreeMap<String, usize>>,
    pub findings: Vec<AuditFinding>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct AuditScope {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A finding and where it was attributed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct AuditFinding {
    #[serde(flatten)]
    pub finding: Finding,
    pub node: String,
}

impl AuditReport {
    pub(crate) fn exit_code(&self) -> u8 {
        if self.findings.is_empty() {
            exit::CLEAN
        } else {
            exit::WARNINGS
        }
    }

    pub(crate) fn table(&self) -> String {
        self.render(false)
    }

    /// The table with the consumers' nodes and UIDs (`-o wide`).
    pub(crate) fn wide_table(&self) -> String {
        self.render(true)
    }

    /// The claims the report names, as `kubectl get -o name` prints them.
    pub(crate) fn names(&self) -> Vec<String> {
        object_names(self.findings.iter().map(|f| &f.finding))
    }

    fn render(&self, wide: bool) -> String {
        let mut out = String::new();
        if !self.findings.is_empty() {
            let mut header = vec![
                "PROBLEM",
                "NAMESPACE",
                "CLAIM",
                "NODE",
                "DEVICES",
                "POD",
                "STATE",
                "ACTION",
            ];
            if wide {
                header.extend(WIDE_COLUMNS);
            }
            let mut rows = vec![row(&header)];
            for f in &self.findings {
                rows.push(finding_row(&f.finding, true, Some(&f.node), wide));
            }
            out.push_str(&align(&rows));
            out.push('\n');
            let _ = writeln!(out, "BY NODE");
            out.push_str(&counts_table("NODE", &self.by_node));
            out.push('\n');
            let _ = writeln!(out, "BY DRIVER");
            out.push_str(&counts_table("DRIVER", &self.by_driver));
            out.push('\n');
        }
        let summary: Vec<String> = self
            .counts
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            out,
            "{} claim(s) examined, {} finding(s){}",
            self.claims,
            self.findings.len(),
            if summary.is_empty() {
                String::new()
            } else {
                format!(": {}", summary.join(", "))
            }
        );
        out
    }
}
