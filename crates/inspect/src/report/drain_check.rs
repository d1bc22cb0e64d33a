//! The `drain-check` document: one node's findings and their verdict.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;

use super::table::*;
use super::*;

/// `kind: DrainCheckReport`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DrainCheckReport {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    pub verdict: Verdict,
    /// RFC 3339, when the state was read.
    pub checked_at: String,
    pub blocking: Vec<Finding>,
    pub warnings: Vec<Finding>,
    /// Headroom placeholders holding devices on the node: listed, never
    /// blocking (see [`Finding::placeholder`]).
    pub placeholders: Vec<Finding>,
    /// Pods `--pod-selector` leaves on the node, with the devices they keep
    /// in use: listed, never blocking (`kubectl drain --pod-selector`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<Finding>,
    /// Why the check could not be completed (verdict `Incomplete`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub notes: Vec<String>,
}

impl DrainCheckReport {
    pub(crate) fn new(node: &str, driver: Option<&str>, checked_at: String) -> Self {
        DrainCheckReport {
            api_version: REPORT_API_VERSION,
            kind: "DrainCheckReport",
            node: node.to_string(),
            driver: driver.map(str::to_string),
            verdict: Verdict::Clean,
            checked_at,
            blocking: Vec::new(),
            warnings: Vec::new(),
            placeholders: Vec::new(),
            kept: Vec::new(),
            error: None,
            notes: vec![FORCE_DELETE_CAVEAT.to_string()],
        }
    }

    /// A report that says only why the check could not be completed.
    pub(crate) fn incomplete(
        node: &str,
        driver: Option<&str>,
        checked_at: String,
        error: String,
    ) -> Self {
        let mut report = DrainCheckReport::new(node, driver, checked_at);
        report.verdict = Verdict::Incomplete;
        report.error = Some(error);
        report
    }

    /// Sets the verdict from the findings.
    pub(crate) fn conclude(mut self) -> Self {
        self.verdict = Verdict::of(self.blocking.len(), self.warnings.len());
        self
    }

    /// Only the pods `selected` (their UIDs) block or go as placeholders;
    /// the others' findings move to `kept`, and the verdict is taken again.
    pub(crate) fn keep_unselected(mut self, selected: &BTreeSet<String>) -> Self {
        let is_selected = |f: &Finding| {
            f.subject
                .as_ref()
                .is_some_and(|s| selected.contains(&s.uid))
        };
        for list in [&mut self.blocking, &mut self.placeholders] {
            let (stay, kept): (Vec<Finding>, Vec<Finding>) =
                std::mem::take(list).into_iter().partition(is_selected);
            *list = stay;
            self.kept.extend(kept);
        }
        self.conclude()
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
        object_names(
            self.blocking
                .iter()
                .chain(&self.warnings)
                .chain(&self.placeholders),
        )
    }

    fn render(&self, wide: bool) -> String {
        let mut out = String::new();
        if let Some(error) = &self.error {
            let _ = writeln!(out, "Incomplete: {error}");
            return out;
        }
        let scope = match &self.driver {
            Some(d) => format!("node {} (driver {d})", self.node),
            None => format!("node {}", self.node),
        };
        if !self.blocking.is_empty() {
            let _ = writeln!(out, "BLOCKING: devices still in use on {scope}");
            out.push_str(&findings_table(&self.blocking, false, wide));
            out.push('\n');
        }
        if !self.warnings.is_empty() {
            let _ = writeln!(out, "WARNINGS");
            out.push_str(&findings_table(&self.warnings, true, wide));
            out.push('\n');
        }
        if !self.placeholders.is_empty() {
            let _ = writeln!(out, "HEADROOM PLACEHOLDERS: safe to evict, never blocking");
            out.push_str(&findings_table(&self.placeholders, false, wide));
            out.push('\n');
        }
        if !self.kept.is_empty() {
            let _ = writeln!(out, "KEPT: not selected by --pod-selector, never blocking");
            out.push_str(&findings_table(&self.kept, false, wide));
            out.push('\n');
        }
        let _ = match self.verdict {
            Verdict::Incomplete => Ok(()),
            Verdict::Clean if !self.kept.is_empty() => writeln!(
                out,
                "Clean for the selected pods: {} pod(s) not selected by --pod-selector still use \
                 devices on {scope}; the driver must stay for them.",
                self.kept.len()
            ),
            Verdict::Clean if !self.placeholders.is_empty() => writeln!(
                out,
                "Clean: only {} headroom placeholder claim(s) hold devices on {scope}; evict them \
                 (kubectl drain does), then the driver can be removed.",
                self.placeholders.len()
            ),
            Verdict::Clean => writeln!(
                out,
                "Clean: no ResourceClaim holds devices on {scope}; the driver can be removed."
            ),
            Verdict::Warnings => writeln!(
                out,
                "Warnings only on {scope}: nothing is in use, but {} claim(s) look wrong (see ACTION).",
                self.warnings.len()
            ),
            Verdict::Blocked => writeln!(
                out,
                "Blocked: {} claim reservation(s) still use devices on {scope}; do not remove the driver yet.",
                self.blocking.len()
            ),
        };
        let _ = writeln!(out, "Note: {FORCE_DELETE_CAVEAT}.");
        out
    }
}
