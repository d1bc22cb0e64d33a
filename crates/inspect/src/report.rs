//! The reports of `drain-check` and `audit`: a stable JSON document for
//! scripts and a table for people, and the exit code each verdict maps to.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use dra_model::classify::{PodRef, PodState, Problem, ProblemKind};

/// `apiVersion` of both documents. Fields are only ever added within it.
pub(crate) const REPORT_API_VERSION: &str = "dra-claim-controller.io/v1alpha1";

/// What an admin is told about a force-deleted pod, in both outputs.
pub(crate) const FORCE_DELETE_CAVEAT: &str = "a pod deleted with --force --grace-period=0 disappears from the API at once, \
while its containers and prepared devices may remain on the node until the kubelet cleans up: \
a clean result cannot see those; wait for the kubelet (or check the node) after force-deleting pods";

/// Exit codes, shared by both commands.
pub(crate) mod exit {
    /// Nothing blocks and nothing looks wrong.
    pub(crate) const CLEAN: u8 = 0;
    /// Devices are still in use (or, with `--strict`, warnings).
    pub(crate) const BLOCKED: u8 = 1;
    /// Warnings only.
    pub(crate) const WARNINGS: u8 = 2;
    /// The check could not be completed.
    pub(crate) const INCOMPLETE: u8 = 3;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ClaimRef {
    pub namespace: String,
    pub name: String,
}

/// A device as reports name it: the allocator's device identity.
pub(crate) use dra_model::DeviceId as DeviceRef;

/// The object a finding is about, besides the claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Subject {
    /// `Pod`, or the resource of a consumer that is not a pod.
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// `consumer` (in `reservedFor`) or `owner` (controls the claim).
    pub role: &'static str,
    /// Running, Pending, Terminating, Succeeded, Failed, Gone, Replaced…
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The NodeScalingWatermark whose headroom placeholder the pod is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placeholder_of: Option<String>,
}

impl Subject {
    pub(crate) fn pod(pod: &PodRef, role: &'static str) -> Self {
        Subject {
            kind: "Pod".into(),
            api_group: String::new(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            role,
            state: pod.state.describe(),
            node: match &pod.state {
                PodState::Active { node, .. } => node.clone(),
                _ => None,
            },
            placeholder_of: pod.placeholder_of.clone(),
        }
    }
}

/// One line of a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Finding {
    /// `InUse` for blocking entries; otherwise the problem
    /// (`StaleReservation`, `LeakedAllocation`, `OrphanedGenerated`,
    /// `StuckDeleting`, `UnverifiableConsumer`).
    #[serde(rename = "type")]
    pub kind: String,
    pub claim: ClaimRef,
    pub devices: Vec<DeviceRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<Subject>,
    /// How long the claim has been deleting, for `StuckDeleting`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleting_for_seconds: Option<u64>,
    /// What to do about it.
    pub action: String,
}

/// The `type` of blocking entries: a consumer that may run.
pub(crate) const IN_USE: &str = "InUse";
/// The `type` of blocking entries: a pod that finished moments ago, whose
/// devices the kubelet may not have unprepared yet.
pub(crate) const FINISHING: &str = "Finishing";
/// The `type` of placeholder entries: a headroom placeholder, safe to evict.
pub(crate) const PLACEHOLDER: &str = "Placeholder";

fn problem_type(kind: ProblemKind) -> &'static str {
    match kind {
        ProblemKind::StaleReservation => "StaleReservation",
        ProblemKind::LeakedAllocation => "LeakedAllocation",
        ProblemKind::OrphanedGenerated => "OrphanedGenerated",
        ProblemKind::StuckDeleting => "StuckDeleting",
        ProblemKind::UnverifiableConsumer => "UnverifiableConsumer",
    }
}

impl Finding {
    /// A consumer that still uses the claim's devices.
    pub(crate) fn in_use(claim: ClaimRef, devices: Vec<DeviceRef>, consumer: &PodRef) -> Self {
        let action = match &consumer.state {
            PodState::Active {
                terminating: true, ..
            } => format!(
                "pod {}/{} is terminating: wait for the kubelet to stop it (its devices are unprepared after that)",
                consumer.namespace, consumer.name
            ),
            PodState::Active { node: None, .. } => format!(
                "pod {}/{} is about to start with these devices: delete it, or wait for it to finish",
                consumer.namespace, consumer.name
            ),
            _ => format!(
                "evict pod {}/{} (kubectl drain, or kubectl delete pod -n {} {}) or wait for it to finish",
                consumer.namespace, consumer.name, consumer.namespace, consumer.name
            ),
        };
        Finding {
            kind: IN_USE.into(),
            claim,
            devices,
            subject: Some(Subject::pod(consumer, "consumer")),
            deleting_for_seconds: None,
            action,
        }
    }

    /// A pod on the node that finished `ago` ago: its devices may still be
    /// prepared (the kubelet unprepares them while cleaning the pod up).
    pub(crate) fn finishing(
        claim: ClaimRef,
        devices: Vec<DeviceRef>,
        pod: &PodRef,
        ago: std::time::Duration,
    ) -> Self {
        Finding {
            kind: FINISHING.into(),
            claim,
            devices,
            subject: Some(Subject::pod(pod, "consumer")),
            deleting_for_seconds: None,
            action: format!(
                "pod {}/{} finished {} ago; the kubelet unprepares its devices while cleaning it up: wait a little \
                 (drain-check --wait does)",
                pod.namespace,
                pod.name,
                human_duration(ago.as_secs())
            ),
        }
    }

    /// A headroom placeholder holding devices on the node: it never holds
    /// a drain (its Deployment recreates it elsewhere, and it is marked
    /// safe to evict), but the driver must outlive it like any pod's use.
    pub(crate) fn placeholder(claim: ClaimRef, devices: Vec<DeviceRef>, pod: &PodRef) -> Self {
        let watermark = pod.placeholder_of.as_deref().unwrap_or_default();
        Finding {
            kind: PLACEHOLDER.into(),
            claim,
            devices,
            subject: Some(Subject::pod(pod, "consumer")),
            deleting_for_seconds: None,
            action: format!(
                "headroom placeholder of NodeScalingWatermark {}/{watermark}: safe to evict, never blocks a drain \
                 (kubectl drain evicts it; kubectl delete pod -n {} {} does too); remove the driver once it is gone",
                pod.namespace, pod.namespace, pod.name
            ),
        }
    }

    /// A problem the classifier found.
    pub(crate) fn problem(claim: ClaimRef, devices: Vec<DeviceRef>, problem: &Problem) -> Self {
        let (ns, name) = (claim.namespace.clone(), claim.name.clone());
        let mut deleting_for_seconds = None;
        let (subject, action) = match problem {
            Problem::StaleReservation { consumer } => (
                Some(Subject::pod(consumer, "consumer")),
                format!(
                    "pod {} ({}) still holds the reservation: the claim controller removes it within seconds \
                     when it runs (check that dra-claim-controller has a leader and its workqueue is not backed up); \
                     if the pod was force-deleted, its devices may still be prepared on the node",
                    consumer.name,
                    consumer.state.describe()
                ),
            ),
            Problem::LeakedAllocation { owner } => (
                owner.as_ref().map(|o| Subject::pod(o, "owner")),
                format!(
                    "allocated devices that no pod uses: delete the claim if nobody needs it \
                     (kubectl delete resourceclaim -n {ns} {name}), or check the claim controller"
                ),
            ),
            Problem::OrphanedGenerated { owner } => (
                Some(Subject::pod(owner, "owner")),
                format!(
                    "generated for pod {} ({}): the claim controller (done pods) or the garbage collector \
                     (deleted pods) should delete it; check both are running",
                    owner.name,
                    owner.state.describe()
                ),
            ),
            Problem::StuckDeleting { deleted_for } => {
                deleting_for_seconds = Some(deleted_for.as_secs());
                (
                    None,
                    format!(
                        "deleted {} ago, still held by the finalizer resource.kubernetes.io/delete-protection: \
                         the claim controller removes it once no pod uses the claim; check the controller's logs for {ns}/{name}",
                        human_duration(deleted_for.as_secs())
                    ),
                )
            }
            Problem::UnverifiableConsumer {
                api_group,
                resource,
                name: consumer,
            } => (
                Some(Subject {
                    kind: resource.clone(),
                    api_group: api_group.clone(),
                    name: consumer.clone(),
                    uid: String::new(),
                    role: "consumer",
                    state: "Unknown".into(),
                    node: None,
                    placeholder_of: None,
                }),
                format!(
                    "reserved for {resource}.{api_group} {consumer}, which this tool cannot check: \
                     check that consumer by hand before removing the driver"
                ),
            ),
        };
        Finding {
            kind: problem_type(problem.kind()).into(),
            claim,
            devices,
            subject,
            deleting_for_seconds,
            action,
        }
    }
}

/// "3m", "2h", "45s".
pub(crate) fn human_duration(secs: u64) -> String {
    match secs {
        s if s >= 2 * 3600 => format!("{}h", s / 3600),
        s if s >= 120 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// The overall outcome of a drain check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Verdict {
    Clean,
    Warnings,
    Blocked,
    /// The check could not be completed (see `error`).
    Incomplete,
}

impl Verdict {
    pub(crate) fn of(blocking: usize, warnings: usize) -> Self {
        match (blocking, warnings) {
            (0, 0) => Verdict::Clean,
            (0, _) => Verdict::Warnings,
            _ => Verdict::Blocked,
        }
    }

    pub(crate) fn exit_code(self, strict: bool) -> u8 {
        match self {
            Verdict::Clean => exit::CLEAN,
            Verdict::Blocked => exit::BLOCKED,
            Verdict::Warnings if strict => exit::BLOCKED,
            Verdict::Warnings => exit::WARNINGS,
            Verdict::Incomplete => exit::INCOMPLETE,
        }
    }
}

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
        let _ = match self.verdict {
            Verdict::Incomplete => Ok(()),
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

fn counts_table(first: &str, counts: &BTreeMap<String, BTreeMap<String, usize>>) -> String {
    let mut rows = vec![row(&[first, "FINDINGS"])];
    for (key, by_type) in counts {
        let cells: Vec<String> = by_type.iter().map(|(k, v)| format!("{k}={v}")).collect();
        rows.push(vec![key.clone(), cells.join(", ")]);
    }
    align(&rows)
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// The columns `-o wide` adds: where the pod (or other consumer) runs, and
/// its UID (which tells a pod from another of the same name).
const WIDE_COLUMNS: [&str; 2] = ["POD NODE", "POD UID"];

/// `resourceclaim.resource.k8s.io/<name>` of each claim, once, in order.
fn object_names<'a>(findings: impl Iterator<Item = &'a Finding>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for f in findings {
        let name = format!("resourceclaim.resource.k8s.io/{}", f.claim.name);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

fn finding_row(f: &Finding, with_type: bool, node: Option<&str>, wide: bool) -> Vec<String> {
    let mut cells = Vec::new();
    if with_type {
        cells.push(f.kind.clone());
    }
    cells.push(f.claim.namespace.clone());
    cells.push(f.claim.name.clone());
    if let Some(node) = node {
        cells.push(node.to_string());
    }
    cells.push(if f.devices.is_empty() {
        "-".into()
    } else {
        f.devices
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    });
    match &f.subject {
        Some(s) if s.kind == "Pod" => {
            cells.push(match &s.placeholder_of {
                Some(w) => format!("{} (placeholder of {w})", s.name),
                None => s.name.clone(),
            });
            cells.push(s.state.clone());
        }
        Some(s) => {
            cells.push(format!("{}/{}", s.kind, s.name));
            cells.push(s.state.clone());
        }
        None => {
            cells.push("-".into());
            cells.push(
                f.deleting_for_seconds
                    .map(|s| format!("Deleting {}", human_duration(s)))
                    .unwrap_or_else(|| "-".into()),
            );
        }
    }
    cells.push(f.action.clone());
    if wide {
        let subject = f.subject.as_ref();
        cells.push(
            subject
                .and_then(|s| s.node.clone())
                .unwrap_or_else(|| "-".into()),
        );
        cells.push(
            subject
                .map(|s| s.uid.clone())
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| "-".into()),
        );
    }
    cells
}

fn findings_table(findings: &[Finding], with_type: bool, wide: bool) -> String {
    let mut header = Vec::new();
    if with_type {
        header.push("PROBLEM");
    }
    header.extend(["NAMESPACE", "CLAIM", "DEVICES", "POD", "STATE", "ACTION"]);
    if wide {
        header.extend(WIDE_COLUMNS);
    }
    let mut rows = vec![row(&header)];
    rows.extend(
        findings
            .iter()
            .map(|f| finding_row(f, with_type, None, wide)),
    );
    align(&rows)
}

/// Left-aligned columns separated by three spaces, as kubectl prints; the
/// last column is not padded.
fn align(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}   ", width = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_and_exit_codes() {
        assert_eq!(Verdict::of(0, 0).exit_code(false), 0);
        assert_eq!(Verdict::of(0, 0).exit_code(true), 0);
        assert_eq!(Verdict::of(1, 0).exit_code(false), 1);
        assert_eq!(Verdict::of(1, 3).exit_code(false), 1);
        assert_eq!(Verdict::of(0, 2).exit_code(false), 2);
        assert_eq!(Verdict::of(0, 2).exit_code(true), 1);
        assert_eq!(Verdict::Incomplete.exit_code(false), 3);
        let r = DrainCheckReport::incomplete("n", None, "t".into(), "denied".into());
        assert_eq!(serde_json::to_value(&r).unwrap()["verdict"], "Incomplete");
        assert!(r.table().contains("denied"));
    }

    #[test]
    fn columns_line_up() {
        let t = align(&[row(&["A", "BB", "last"]), row(&["CCC", "D", "x y z"])]);
        assert_eq!(t, "A     BB   last\nCCC   D    x y z\n");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_duration(45), "45s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 5), "3h");
    }
}
