//! The reports of `drain-check` and `audit`: a stable JSON document for
//! scripts and a table for people, and the exit code each verdict maps to.

use std::fmt::Write as _;

use serde::Serialize;

use dra_model::classify::{PodRef, PodState, Problem, ProblemKind};

mod audit;
mod drain_check;
pub(crate) mod table;

pub(crate) use audit::{AuditFinding, AuditReport, AuditScope};
pub(crate) use drain_check::DrainCheckReport;

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

#[cfg(test)]
mod tests {
    use super::table::{align, row};
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
