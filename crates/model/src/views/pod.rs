//! The pod view: what the controllers read of a Pod, and its rules.

use super::*;

/// The fields of a Pod this controller reads, plus what the controller
/// learned by watching it (see [`super::observe`]).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "PodViewWire")]
pub struct PodView {
    pub metadata: ObjectMeta,
    pub spec: PodViewSpec,
    pub status: PodViewStatus,
    /// A field manager owns `spec.nodeName`: the pod was created (or
    /// written) with its node set, bypassing any scheduler. Schedulers bind
    /// through the `pods/binding` subresource, which records no managed
    /// field. Unlike the `PodScheduled` condition, which the kubelet writes
    /// into every pod it runs, this stays true for the pod's whole life, so
    /// a controller that (re)starts late still reads it right.
    pub node_name_written: bool,
    /// Not from the API: what watching this pod (this UID) has shown.
    pub history: PodHistory,
}

/// [`PodView`] as it comes over the wire (JSON).
#[derive(Deserialize)]
struct PodViewWire {
    metadata: SlimMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    spec: PodViewSpec,
    #[serde(default, deserialize_with = "null_as_default")]
    status: PodViewStatus,
}

impl From<PodViewWire> for PodView {
    fn from(wire: PodViewWire) -> Self {
        PodView {
            node_name_written: wire.metadata.node_name_written,
            metadata: wire.metadata.into_meta(),
            spec: wire.spec,
            status: wire.status,
            history: PodHistory::default(),
        }
    }
}

/// What the controller learned by watching one pod over time. The API
/// object alone cannot say whether the pod bypassed the scheduler or which
/// claims it once named, so this travels from each cached version of the
/// pod to the next one with the same UID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodHistory {
    /// Placed on its node without a scheduler (see
    /// [`PodView::placed_without_scheduler`]): nothing else will allocate
    /// its claims.
    pub pre_scheduled: bool,
    /// When this process first saw the pod (the grace period of the
    /// not-allocated warning counts from here).
    pub first_seen: Option<Instant>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodViewSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_claims: Vec<PodResourceClaim>,
    pub node_name: Option<String>,
    /// `spec.schedulingGroup` (Kubernetes 1.36+, with GenericWorkload): the
    /// PodGroup the pod belongs to.
    pub scheduling_group: Option<SchedulingGroupRef>,
    /// Resolved from the pod's PriorityClass at admission.
    pub priority: Option<i32>,
    /// Where the headroom placeholder gate is in `spec.schedulingGates`, if
    /// there (the index a guarded JSON patch removes); other gates are not
    /// kept.
    #[serde(
        default,
        rename = "schedulingGates",
        deserialize_with = "placeholder_gate_index"
    )]
    pub placeholder_gate: Option<usize>,
    /// `spec.containers`: only their requests, summed.
    #[serde(
        default,
        rename = "containers",
        deserialize_with = "requests::containers_sum"
    )]
    pub container_requests: ResourceList,
    /// `spec.initContainers`: only their requests and sidecar flags.
    #[serde(
        default,
        rename = "initContainers",
        deserialize_with = "requests::init_containers"
    )]
    pub init_requests: Vec<InitRequests>,
    #[serde(default, deserialize_with = "requests::resource_list")]
    pub overhead: ResourceList,
    /// `spec.resources.requests` (pod-level resources).
    #[serde(
        default,
        rename = "resources",
        deserialize_with = "requests::pod_level"
    )]
    pub pod_level_requests: ResourceList,
}

/// The index of the headroom placeholder gate in `spec.schedulingGates`.
fn placeholder_gate_index<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    #[derive(Deserialize)]
    struct Gate {
        #[serde(default)]
        name: String,
    }
    let gates = Option::<Vec<Gate>>::deserialize(d)?.unwrap_or_default();
    Ok(gates
        .iter()
        .position(|g| g.name == crate::naming::PLACEHOLDER_GATE))
}

/// `pod.spec.schedulingGroup`, the PodGroup's name only.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingGroupRef {
    pub pod_group_name: Option<String>,
}

/// Only the `PodScheduled` condition is kept, as two flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulingConditions {
    /// `PodScheduled=True`: the binding subresource sets it when a
    /// scheduler binds the pod (and the kubelet on every pod it runs).
    pub scheduled: bool,
    /// `PodScheduled=False` with reason `Unschedulable`: kube-scheduler
    /// tried and found no node.
    pub unschedulable: bool,
}

impl SchedulingConditions {
    /// Folds one condition in.
    pub(crate) fn note(&mut self, type_: &str, status: &str, reason: &str) {
        if type_ == "PodScheduled" {
            self.scheduled |= status == "True";
            self.unschedulable |= status == "False" && reason == "Unschedulable";
        }
    }
}

/// The `DisruptionTarget` condition as last seen: what an eviction needs
/// to write its own without a fresh read (kept only on pods that have one,
/// boxed so that the others pay a pointer).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionTargetSeen {
    #[serde(default)]
    pub status: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub last_transition_time: Option<Time>,
}

/// `status.conditions`, slimmed: `PodScheduled` as two flags and
/// `DisruptionTarget` as seen; the others are not kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodConditions {
    pub scheduling: SchedulingConditions,
    pub disruption_target: Option<Box<DisruptionTargetSeen>>,
}

const DISRUPTION_TARGET: &str = "DisruptionTarget";

impl<'de> Deserialize<'de> for PodConditions {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Condition {
            #[serde(rename = "type", default)]
            type_: String,
            #[serde(default)]
            status: String,
            #[serde(default)]
            reason: String,
            #[serde(default)]
            message: String,
            last_transition_time: Option<Time>,
        }
        let conditions = Option::<Vec<Condition>>::deserialize(d)?.unwrap_or_default();
        let mut kept = PodConditions::default();
        for c in conditions {
            let time = c.last_transition_time;
            kept.note(c.type_, c.status, c.reason, c.message, time);
        }
        Ok(kept)
    }
}

impl PodConditions {
    /// Folds one condition in (JSON and protobuf alike; an empty reason or
    /// message reads as absent).
    pub(crate) fn note(
        &mut self,
        type_: String,
        status: String,
        reason: String,
        message: String,
        last_transition_time: Option<Time>,
    ) {
        self.scheduling.note(&type_, &status, &reason);
        if type_ == DISRUPTION_TARGET {
            self.disruption_target = Some(Box::new(DisruptionTargetSeen {
                status,
                reason: Some(reason).filter(|r| !r.is_empty()),
                message: Some(message).filter(|m| !m.is_empty()),
                last_transition_time,
            }));
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodViewStatus {
    pub phase: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_claim_statuses: Vec<PodResourceClaimStatus>,
    pub extended_resource_claim_status: Option<ExtendedClaimRef>,
    /// `conditions`: only `PodScheduled` (as flags) and `DisruptionTarget`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub conditions: PodConditions,
    /// When the last of its containers finished, if all have (from
    /// `containerStatuses`): a kubelet unprepares devices only after that.
    #[serde(
        default,
        rename = "containerStatuses",
        deserialize_with = "containers_finished_at"
    )]
    pub containers_finished_at: Option<Time>,
}

/// The latest `state.terminated.finishedAt` of the container statuses when
/// every container has terminated; `None` while one still runs (or when
/// the kubelet reported none).
fn containers_finished_at<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Time>, D::Error> {
    #[derive(Deserialize)]
    struct Status {
        #[serde(default)]
        state: Option<State>,
    }
    #[derive(Deserialize)]
    struct State {
        #[serde(default)]
        terminated: Option<Terminated>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Terminated {
        finished_at: Option<Time>,
    }
    let statuses = Option::<Vec<Status>>::deserialize(d)?.unwrap_or_default();
    let mut latest: Option<Time> = None;
    for status in &statuses {
        let finished = status
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.clone());
        let Some(at) = finished else {
            return Ok(None);
        };
        if latest.as_ref().is_none_or(|l| l.0 < at.0) {
            latest = Some(at);
        }
    }
    Ok(latest)
}

/// `pod.status.extendedResourceClaimStatus`, name only.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExtendedClaimRef {
    #[serde(default)]
    pub resource_claim_name: String,
}

namespaced_resource!(PodView, "", "v1", "Pod", "pods");

impl PodView {
    /// The pod as first seen (by this process, under this UID): its history
    /// starts now. Every room reads the same answer from the shared store.
    pub fn at_first_sight(mut self, now: Instant) -> PodView {
        self.history = PodHistory {
            pre_scheduled: self.placed_without_scheduler(),
            first_seen: Some(now),
        };
        self
    }
    /// Whether a pod seen for the first time was placed on its node without
    /// a scheduler, so that nothing but this controller will reserve (and,
    /// with `--allocate-on-nodes`, allocate) its claims.
    ///
    /// The API server says so for the pod's whole life: whoever created the
    /// pod with `spec.nodeName` owns that field in `managedFields`, while a
    /// scheduler binds through `pods/binding`, which records no managed
    /// field. The `PodScheduled` condition cannot tell: the binding sets it,
    /// and so does the kubelet on every pod it runs, pre-scheduled or not
    /// (~35 ms after creation), so a controller that first sees the pod
    /// after the kubelet did would take it for scheduled. The condition is
    /// still the fallback for a pod whose managed fields were stripped:
    /// bound, and first seen before anyone reported it scheduled.
    pub(crate) fn placed_without_scheduler(&self) -> bool {
        self.node_name().is_some()
            && (self.node_name_written || !self.status.conditions.scheduling.scheduled)
    }
    /// The pod as the object a Warning event is about.
    pub fn involved(&self) -> dra_runtime::events::Involved<'_> {
        dra_runtime::events::Involved {
            api_version: "v1".into(),
            kind: "Pod",
            name: self.name(),
            namespace: self.namespace(),
            uid: self.uid(),
            resource_version: self.metadata.resource_version.as_deref(),
        }
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    /// The NodeScalingWatermark (same namespace) whose headroom placeholder
    /// this pod is, if it is one.
    pub fn placeholder_of(&self) -> Option<&str> {
        self.label(crate::naming::WATERMARK_LABEL)
    }
    pub fn node_name(&self) -> Option<&str> {
        self.spec.node_name.as_deref().filter(|n| !n.is_empty())
    }
    /// Phase Succeeded or Failed: the pod will never run again.
    pub fn is_terminal(&self) -> bool {
        matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
    /// Certain that no container runs or will run: terminal, or deleted
    /// before it was ever scheduled.
    pub fn is_done(&self) -> bool {
        self.is_terminal() || (self.is_deleting() && self.node_name().is_none())
    }
    /// The claim the scheduler made for extended resources, if any.
    pub fn extended_claim_name(&self) -> Option<&str> {
        self.status
            .extended_resource_claim_status
            .as_ref()
            .map(|s| s.resource_claim_name.as_str())
            .filter(|n| !n.is_empty())
    }
    /// The PodGroup this pod belongs to (`spec.schedulingGroup.podGroupName`).
    pub fn pod_group_name(&self) -> Option<&str> {
        self.spec
            .scheduling_group
            .as_ref()
            .and_then(|g| g.pod_group_name.as_deref())
            .filter(|n| !n.is_empty())
    }
    /// The claims this pod names: its recorded generated claims, the claims
    /// its entries name directly, its extended-resource claim.
    pub fn claim_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .status
            .resource_claim_statuses
            .iter()
            .filter_map(|s| s.resource_claim_name.as_deref())
            .chain(
                self.spec
                    .resource_claims
                    .iter()
                    .filter_map(|c| c.resource_claim_name.as_deref()),
            )
            .chain(self.extended_claim_name())
            .filter(|n| !n.is_empty())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
    /// Bypassed the scheduler: see [`PodHistory::pre_scheduled`].
    pub fn is_pre_scheduled(&self) -> bool {
        self.history.pre_scheduled
    }
    /// Whether the claim controller has anything to do with this pod at
    /// all: it has claim entries or an extended-resource claim.
    pub fn is_relevant(&self) -> bool {
        !self.spec.resource_claims.is_empty()
            || self.status.extended_resource_claim_status.is_some()
    }
    /// Not bound to a node, not being deleted, not finished: a pod the
    /// scheduler still has to place.
    pub fn is_unbound(&self) -> bool {
        self.node_name().is_none() && !self.is_deleting() && !self.is_terminal()
    }
    /// Holds its node's resources: bound there, not finished, not being
    /// deleted.
    pub fn holds_node(&self) -> bool {
        self.node_name().is_some() && !self.is_terminal() && !self.is_deleting()
    }
    /// The entry of the watermark whose placeholder this pod is, if any.
    pub fn placeholder_entry(&self) -> Option<&str> {
        self.label(crate::naming::WATERMARK_ENTRY_LABEL)
    }
    /// A placeholder of the seed operator (proactive-node-scaling-operator):
    /// it sets its label with an empty value, so the key alone counts.
    pub fn is_seed_placeholder(&self) -> bool {
        self.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(crate::naming::SEED_PLACEHOLDER_LABEL))
    }
    /// A headroom placeholder of any kind: ours or the seed operator's.
    pub fn is_placeholder(&self) -> bool {
        self.placeholder_of().is_some() || self.is_seed_placeholder()
    }
    fn label(&self, key: &str) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()?
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
    /// What the pod requests (see [`PodRequests`]).
    pub fn requests(&self) -> PodRequests<'_> {
        PodRequests {
            containers: &self.spec.container_requests,
            init_containers: &self.spec.init_requests,
            overhead: &self.spec.overhead,
            pod_level: &self.spec.pod_level_requests,
        }
    }
}
