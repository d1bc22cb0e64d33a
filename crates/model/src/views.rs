//! Slim views of the objects the controller watches.
//!
//! A cluster-wide pod watch dominates the memory of this controller. These
//! types deserialize only the fields the controller reads (serde skips the
//! rest without allocating), so managed fields, container specs, conditions
//! and the like are never held in memory.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Deref;
use std::time::Instant;

use dra_runtime::resource::{view_accessors, view_resource};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{PodResourceClaim, PodResourceClaimStatus};
use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

use super::requests::{self, InitRequests, PodRequests, ResourceList};

/// The metadata fields kept for every watched object.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    /// Only the labels in [`POD_LABELS_READ`] (pods are the only objects
    /// that carry them).
    #[serde(default, deserialize_with = "labels_read")]
    labels: Option<BTreeMap<String, String>>,
    /// Whether a field manager owns `spec.nodeName` (read for pods; see
    /// [`PodView::node_name_written`]); nothing else of the managed fields
    /// is held.
    #[serde(default, rename = "managedFields", deserialize_with = "owns_node_name")]
    node_name_written: bool,
}

/// `metadata.managedFields`: whether an entry of the object itself (not of
/// a subresource) owns `f:spec.f:nodeName`.
fn owns_node_name<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    struct Entry {
        #[serde(default)]
        subresource: Option<String>,
        #[serde(default, rename = "fieldsV1")]
        fields: Option<ManagedFields>,
    }
    let entries = Option::<Vec<Entry>>::deserialize(d)?.unwrap_or_default();
    Ok(entries.iter().any(|e| {
        e.subresource.as_deref().unwrap_or_default().is_empty()
            && e.fields.as_ref().is_some_and(ManagedFields::own_node_name)
    }))
}

/// The part of a managed-fields entry's `fieldsV1` that says whether it
/// owns `spec.nodeName`; everything else is parsed past.
#[derive(Deserialize)]
struct ManagedFields {
    #[serde(default, rename = "f:spec")]
    spec: Option<ManagedSpecFields>,
}

#[derive(Deserialize)]
struct ManagedSpecFields {
    #[serde(default, rename = "f:nodeName")]
    node_name: Option<serde::de::IgnoredAny>,
}

impl ManagedFields {
    fn own_node_name(&self) -> bool {
        self.spec.as_ref().is_some_and(|s| s.node_name.is_some())
    }
}

/// [`ManagedFields::own_node_name`] of a raw `fieldsV1` JSON document (as
/// protobuf carries it); one that does not parse owns nothing.
pub(crate) fn fields_v1_own_node_name(raw: &[u8]) -> bool {
    serde_json::from_slice::<ManagedFields>(raw).is_ok_and(|f| f.own_node_name())
}

/// Metadata of claims: also what ownership, adoption, finalizers and metrics read.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ClaimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    #[serde(default, deserialize_with = "annotations_read")]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "controller_reference")]
    owner_references: Option<Vec<OwnerReference>>,
    finalizers: Option<Vec<String>>,
}

/// The annotation keys of a claim this controller reads. A tenant owns the
/// rest (up to 256 KiB per claim) and none of it is held in memory.
const CLAIM_ANNOTATIONS_READ: [&str; 2] = [
    crate::naming::POD_CLAIM_NAME_ANNOTATION,
    crate::naming::EXTENDED_RESOURCE_CLAIM_ANNOTATION,
];

/// The longest value of a read annotation that can mean anything: a pod
/// claim entry name is a DNS label (63), the other one says "true". A
/// longer value matches nothing, so it is dropped instead of held.
const ANNOTATION_VALUE_MAX: usize = 253;

/// `metadata.annotations`, keeping only [`CLAIM_ANNOTATIONS_READ`]: every
/// other key is parsed past without allocating its value.
fn annotations_read<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(KeepOnly(&CLAIM_ANNOTATIONS_READ))
}

/// The labels read from pods: the headroom placeholder labels (ours, and
/// the seed operator's, whose placeholders never count as workload); a
/// tenant's other labels are not held.
const POD_LABELS_READ: [&str; 3] = [
    crate::naming::WATERMARK_LABEL,
    crate::naming::WATERMARK_ENTRY_LABEL,
    crate::naming::SEED_PLACEHOLDER_LABEL,
];

/// `metadata.labels` of pods, keeping only [`POD_LABELS_READ`].
fn labels_read<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(KeepOnly(&POD_LABELS_READ))
}

/// A string map (labels, annotations) of which only these keys are kept,
/// with values no longer than [`ANNOTATION_VALUE_MAX`]; the rest is parsed
/// past without allocating, so a tenant's maps cost no memory.
struct KeepOnly(&'static [&'static str]);

impl<'de> serde::de::Visitor<'de> for KeepOnly {
    type Value = Option<BTreeMap<String, String>>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a map of strings")
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            match self.0.iter().find(|k| **k == key) {
                Some(read) => {
                    let value: String = map.next_value()?;
                    if value.len() <= ANNOTATION_VALUE_MAX {
                        kept.insert((*read).to_owned(), value);
                    }
                }
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok((!kept.is_empty()).then_some(kept))
    }
}

/// `metadata.ownerReferences`, keeping only the controller reference (the
/// API server allows one): every decision reads that one, and a tenant may
/// add any number of others.
fn controller_reference<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<OwnerReference>>, D::Error> {
    let all: Option<Vec<OwnerReference>> = Option::deserialize(d)?;
    Ok(all
        .and_then(|refs| refs.into_iter().find(|o| o.controller == Some(true)))
        .map(|controller| vec![controller]))
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    Ok(SlimMeta::deserialize(d)?.into_meta())
}

impl SlimMeta {
    fn into_meta(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            resource_version: self.resource_version,
            deletion_timestamp: self.deletion_timestamp,
            labels: self.labels,
            ..Default::default()
        }
    }
}

fn claim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = ClaimMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        deletion_timestamp: m.deletion_timestamp,
        annotations: m.annotations,
        owner_references: m.owner_references,
        finalizers: m.finalizers,
        ..Default::default()
    })
}

/// `null` and absent both mean "empty" in the Kubernetes API.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

macro_rules! namespaced_resource {
    ($ty:ty, $group:expr, $version:expr, $kind:expr, $plural:expr) => {
        view_resource!(
            $ty,
            NamespaceResourceScope,
            $group,
            $version,
            $kind,
            $plural
        );
        view_accessors!($ty);
    };
}

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
    /// [`super::observe::first_sight`]): nothing else will allocate its
    /// claims.
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

fn scheduling_conditions<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<SchedulingConditions, D::Error> {
    #[derive(Deserialize)]
    struct Condition {
        #[serde(rename = "type", default)]
        type_: String,
        #[serde(default)]
        status: String,
        #[serde(default)]
        reason: String,
    }
    let conditions = Option::<Vec<Condition>>::deserialize(d)?.unwrap_or_default();
    let mut flags = SchedulingConditions::default();
    for c in &conditions {
        flags.note(&c.type_, &c.status, &c.reason);
    }
    Ok(flags)
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodViewStatus {
    pub phase: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_claim_statuses: Vec<PodResourceClaimStatus>,
    pub extended_resource_claim_status: Option<ExtendedClaimRef>,
    /// `conditions`: only `PodScheduled`, as flags.
    #[serde(
        default,
        rename = "conditions",
        deserialize_with = "scheduling_conditions"
    )]
    pub scheduling: SchedulingConditions,
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
    /// Waits for devices as the headroom yield understands it: unbound,
    /// found unschedulable by kube-scheduler, with claims, not a
    /// placeholder, of a priority above `placeholder_priority`.
    pub fn waits_for_devices(&self, placeholder_priority: i32) -> bool {
        self.is_unbound()
            && self.status.scheduling.unschedulable
            && !self.spec.resource_claims.is_empty()
            && !self.is_placeholder()
            && self.spec.priority.unwrap_or(0) > placeholder_priority
    }
}

/// The fields of a ResourceClaim this controller reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ClaimView {
    #[serde(deserialize_with = "claim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: ClaimViewSpec,
    #[serde(default, deserialize_with = "null_as_default")]
    pub status: ClaimViewStatus,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ClaimViewSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub devices: DevicesView,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct DevicesView {
    #[serde(default, deserialize_with = "null_as_default")]
    pub requests: Vec<RequestView>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestView {
    pub exactly: Option<ExactView>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub first_available: Vec<serde::de::IgnoredAny>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExactView {
    pub admin_access: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimViewStatus {
    /// Which devices it holds (for the allocator and the double
    /// allocation check); the rest stays on the server.
    pub allocation: Option<AllocationView>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub reserved_for: ReservedFor,
}

/// `status.allocation`: the devices only.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct AllocationView {
    #[serde(default, deserialize_with = "null_as_default")]
    pub devices: AllocatedDevicesView,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct AllocatedDevicesView {
    #[serde(default, deserialize_with = "null_as_default")]
    pub results: Vec<AllocatedDevice>,
}

/// One `status.allocation.devices.results[]` entry.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedDevice {
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub admin_access: Option<bool>,
    /// Set for a share of a device that allows multiple allocations
    /// (consumable capacity): such shares are not double allocations.
    #[serde(rename = "shareID")]
    pub share_id: Option<String>,
}

/// `status.reservedFor`, typed for decisions and kept as read for the
/// `test` operations of JSON patches: a field a newer API server adds to an
/// entry must not make every guard fail.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReservedFor {
    entries: Vec<ResourceClaimConsumerReference>,
    raw: Vec<serde_json::Value>,
}

impl ReservedFor {
    /// The entries exactly as the API server sent them.
    pub fn raw(&self) -> &[serde_json::Value] {
        &self.raw
    }

    /// The entries as read of those in `keep`, in their order.
    pub fn raw_of(&self, keep: &[ResourceClaimConsumerReference]) -> Vec<serde_json::Value> {
        self.entries
            .iter()
            .zip(&self.raw)
            .filter(|(typed, _)| keep.contains(typed))
            .map(|(_, raw)| raw.clone())
            .collect()
    }
}

impl Deref for ReservedFor {
    type Target = [ResourceClaimConsumerReference];
    fn deref(&self) -> &Self::Target {
        &self.entries
    }
}

impl<'de> Deserialize<'de> for ReservedFor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Vec::<serde_json::Value>::deserialize(d)?;
        let entries = raw
            .iter()
            .map(|v| serde_json::from_value(v.clone()).map_err(serde::de::Error::custom))
            .collect::<Result<_, _>>()?;
        Ok(ReservedFor { entries, raw })
    }
}

namespaced_resource!(
    ClaimView,
    "resource.k8s.io",
    "v1",
    "ResourceClaim",
    "resourceclaims"
);

impl ClaimView {
    pub fn is_allocated(&self) -> bool {
        self.status.allocation.is_some()
    }

    /// The devices this claim takes from others: every allocated device
    /// except those held with admin access (which share a device).
    pub fn held_devices(&self) -> impl Iterator<Item = crate::DeviceId> + '_ {
        self.status
            .allocation
            .iter()
            .flat_map(|a| &a.devices.results)
            .filter_map(|r| {
                crate::DeviceId::taken_by(
                    &r.driver,
                    &r.pool,
                    &r.device,
                    r.admin_access,
                    r.share_id.as_deref(),
                )
            })
    }
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    pub fn owner_references(&self) -> &[OwnerReference] {
        self.metadata
            .owner_references
            .as_deref()
            .unwrap_or_default()
    }
    pub fn finalizers(&self) -> &[String] {
        self.metadata.finalizers.as_deref().unwrap_or_default()
    }
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
    /// Whether any request asks for admin access (sub-requests of a
    /// prioritized list cannot).
    pub fn admin_access(&self) -> bool {
        self.spec
            .devices
            .requests
            .iter()
            .any(|r| r.exactly.as_ref().and_then(|e| e.admin_access) == Some(true))
    }
    /// Whether the pod with this UID holds a reservation.
    pub fn is_reserved_for(&self, uid: &str) -> bool {
        self.status.reserved_for.iter().any(|r| r.uid == uid)
    }
}

/// The API version PodGroups are served at (`scheduling.k8s.io/v1alpha2`
/// in Kubernetes 1.36, `v1alpha3` in 1.37), found at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodGroupApi {
    pub version: String,
}

impl PodGroupApi {
    pub const GROUP: &'static str = "scheduling.k8s.io";
    pub const PLURAL: &'static str = "podgroups";
    /// Newest first: the one a start-up picks when several are served
    /// (1.36 serves v1alpha2; 1.37 v1beta1 and v1alpha3; the fields read
    /// are the same in all three).
    pub const VERSIONS: [&'static str; 3] = ["v1beta1", "v1alpha3", "v1alpha2"];

    pub fn api_version(&self) -> String {
        format!("{}/{}", Self::GROUP, self.version)
    }
}

impl Default for PodGroupApi {
    fn default() -> Self {
        PodGroupApi {
            version: "v1alpha2".into(),
        }
    }
}

/// The fields of a PodGroup this controller reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodGroupView {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: PodGroupViewSpec,
    #[serde(default, deserialize_with = "null_as_default")]
    pub status: PodGroupViewStatus,
}

/// `spec.resourceClaims` has the shape of a pod's entries.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupViewSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_claims: Vec<PodResourceClaim>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupViewStatus {
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_claim_statuses: Vec<PodResourceClaimStatus>,
}

impl kube::Resource for PodGroupView {
    type DynamicType = PodGroupApi;
    // Namespaced, but the version is only known at run time, which kube
    // expresses with the dynamic scope.
    type Scope = kube::core::DynamicResourceScope;

    fn kind(_: &PodGroupApi) -> Cow<'_, str> {
        Cow::Borrowed("PodGroup")
    }
    fn group(_: &PodGroupApi) -> Cow<'_, str> {
        Cow::Borrowed(PodGroupApi::GROUP)
    }
    fn version(api: &PodGroupApi) -> Cow<'_, str> {
        Cow::Owned(api.version.clone())
    }
    fn plural(_: &PodGroupApi) -> Cow<'_, str> {
        Cow::Borrowed(PodGroupApi::PLURAL)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

view_accessors!(PodGroupView);

impl PodGroupView {
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    /// The group's entry the pod's `entry` refers to: same name and same
    /// claim or template name. Only such an exact match binds a pod's entry
    /// to the group's claim.
    pub fn matching_entry(&self, entry: &PodResourceClaim) -> Option<&PodResourceClaim> {
        self.spec.resource_claims.iter().find(|g| {
            g.name == entry.name
                && g.resource_claim_name == entry.resource_claim_name
                && g.resource_claim_template_name == entry.resource_claim_template_name
        })
    }
    /// The claim name recorded in the group's status for `entry`.
    pub fn recorded(&self, entry: &str) -> Option<&str> {
        self.status
            .resource_claim_statuses
            .iter()
            .find(|s| s.name == entry)
            .and_then(|s| s.resource_claim_name.as_deref())
    }
}

/// A ResourceClaimTemplate. Its `spec` is kept as raw JSON and copied into
/// generated claims verbatim, so fields newer than this build's API types
/// are carried over instead of being dropped.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TemplateView {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: serde_json::Value,
}

namespaced_resource!(
    TemplateView,
    "resource.k8s.io",
    "v1",
    "ResourceClaimTemplate",
    "resourceclaimtemplates"
);

impl TemplateView {
    fn requests(&self) -> impl Iterator<Item = &serde_json::Value> {
        self.spec
            .pointer("/spec/devices/requests")
            .and_then(|r| r.as_array())
            .into_iter()
            .flatten()
    }
    /// Any request with `exactly.adminAccess: true` (needs DRAAdminAccess).
    pub fn needs_admin_access(&self) -> bool {
        self.requests()
            .any(|r| r.pointer("/exactly/adminAccess").and_then(|v| v.as_bool()) == Some(true))
    }
    /// Any request with a non-empty `firstAvailable` list (needs DRAPrioritizedList).
    pub fn has_prioritized_list(&self) -> bool {
        self.requests().any(|r| {
            r.get("firstAvailable")
                .and_then(|v| v.as_array())
                .is_some_and(|a| !a.is_empty())
        })
    }
    /// `spec.metadata.labels` / `spec.metadata.annotations` of the template.
    pub fn claim_metadata(&self, field: &str) -> BTreeMap<String, String> {
        self.spec
            .pointer(&format!("/metadata/{field}"))
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }
    /// `spec.spec`: the claim spec to copy.
    pub fn claim_spec(&self) -> serde_json::Value {
        self.spec
            .get("spec")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({}))
    }
}

/// A Node: its name, labels (what node selectors match) and taints (what
/// a pod must tolerate); the rest of its metadata and its status are not
/// held.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeView {
    #[serde(deserialize_with = "node_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: NodeViewSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeViewSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub taints: Vec<k8s_openapi::api::core::v1::Taint>,
}

fn node_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        labels: Option<BTreeMap<String, String>>,
    }
    let m = Meta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels,
        ..Default::default()
    })
}

/// The process's one store of each kind that devices are read from, kept
/// by one watch each and read by every room that needs them (the
/// allocator and headroom).
#[derive(Clone)]
pub struct DeviceStores {
    pub slices:
        std::sync::Arc<dra_runtime::store::Store<k8s_openapi::api::resource::v1::ResourceSlice>>,
    pub classes:
        std::sync::Arc<dra_runtime::store::Store<k8s_openapi::api::resource::v1::DeviceClass>>,
    pub nodes: std::sync::Arc<dra_runtime::store::Store<NodeView>>,
}

impl Default for DeviceStores {
    fn default() -> Self {
        DeviceStores {
            slices: std::sync::Arc::new(dra_runtime::store::Store::new(Vec::new())),
            classes: std::sync::Arc::new(dra_runtime::store::Store::new(Vec::new())),
            nodes: std::sync::Arc::new(dra_runtime::store::Store::new(Vec::new())),
        }
    }
}

impl NodeView {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    pub fn labels(&self) -> &BTreeMap<String, String> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        self.metadata.labels.as_ref().unwrap_or(&EMPTY)
    }
}

view_resource!(
    NodeView,
    k8s_openapi::ClusterResourceScope,
    "",
    "v1",
    "Node",
    "nodes"
);

impl dra_runtime::store::HasUid for PodView {
    fn uid(&self) -> &str {
        PodView::uid(self)
    }
}

impl dra_runtime::store::HasUid for PodGroupView {
    fn uid(&self) -> &str {
        PodGroupView::uid(self)
    }
}

mod protobuf;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn pod_view_keeps_only_what_is_read() {
        let pod: PodView = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"a": "b"}, "managedFields": [{"manager": "x"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready"}],
                "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}],
                "extendedResourceClaimStatus": {"resourceClaimName": "p-ext", "requestMappings": []}}
        }))
        .unwrap();
        assert_eq!((pod.name(), pod.namespace(), pod.uid()), ("p", "ns", "u1"));
        assert!(pod.metadata.labels.is_none() && pod.metadata.managed_fields.is_none());
        assert_eq!(pod.node_name(), Some("n1"));
        assert_eq!(pod.spec.resource_claims.len(), 1);
        assert_eq!(
            pod.status.resource_claim_statuses[0]
                .resource_claim_name
                .as_deref(),
            Some("p-gpu-x")
        );
        assert_eq!(pod.extended_claim_name(), Some("p-ext"));
        assert!(pod.is_relevant() && !pod.is_done());
        assert_eq!(pod.claim_names(), vec!["p-ext", "p-gpu-x"]);
        assert!(pod.status.containers_finished_at.is_none());
    }

    /// Of a pod's labels only the placeholder label is kept; a tenant's
    /// others (and null) leave nothing behind.
    #[test]
    fn pod_view_keeps_only_the_placeholder_label() {
        let labelled = |labels: Value| -> PodView {
            serde_json::from_value(json!({"metadata": {"name": "p", "labels": labels}})).unwrap()
        };
        let placeholder = labelled(json!({
            crate::naming::WATERMARK_LABEL: "pool", "app": "x", "big": "y".repeat(63)}));
        assert_eq!(placeholder.placeholder_of(), Some("pool"));
        assert_eq!(placeholder.metadata.labels.as_ref().unwrap().len(), 1);
        for none in [
            json!({"app": "x"}),
            json!(null),
            json!({crate::naming::WATERMARK_LABEL: ""}),
        ] {
            let pod = labelled(none.clone());
            assert_eq!(pod.placeholder_of(), None, "{none}");
        }
        assert!(labelled(json!({"app": "x"})).metadata.labels.is_none());
    }

    #[test]
    fn containers_finish_when_all_have() {
        let view = |statuses: serde_json::Value| -> PodView {
            serde_json::from_value(
                json!({"metadata": {"name": "p"}, "status": {"containerStatuses": statuses}}),
            )
            .unwrap()
        };
        let done = view(json!([
            {"name": "a", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-23T12:00:05Z"}}},
            {"name": "b", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-23T12:00:09Z"}}}]));
        assert_eq!(
            done.status.containers_finished_at.unwrap().0.to_string(),
            "2026-11-23T12:00:09Z"
        );
        let running = view(json!([
            {"name": "a", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-23T12:00:05Z"}}},
            {"name": "b", "state": {"running": {"startedAt": "2026-11-23T12:00:00Z"}}}]));
        assert!(running.status.containers_finished_at.is_none());
        assert!(
            view(serde_json::Value::Null)
                .status
                .containers_finished_at
                .is_none()
        );
    }

    #[test]
    fn pod_done_rules() {
        let mut pod = PodView::default();
        assert!(!pod.is_done());
        pod.status.phase = Some("Succeeded".into());
        assert!(pod.is_done());
        pod.status.phase = Some("Failed".into());
        assert!(pod.is_done());
        pod.status.phase = Some("Running".into());
        pod.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert!(pod.is_done(), "deleted before scheduling");
        pod.spec.node_name = Some("n".into());
        assert!(
            !pod.is_done(),
            "deleted while running: containers may still run"
        );
        let nulls: PodView = serde_json::from_value(json!({
            "metadata": {"name": "p"}, "spec": {"resourceClaims": null}, "status": null
        }))
        .unwrap();
        assert!(!nulls.is_relevant());
    }

    /// What a tenant writes on a claim beyond what the controller reads is
    /// not held: other annotations, overlong values, owners that are not
    /// the controller.
    #[test]
    fn claim_view_holds_only_what_is_read() {
        let bloat = "x".repeat(100 * 1024);
        let claim: ClaimView = serde_json::from_slice(
            serde_json::to_vec(&json!({
                "metadata": {"name": "c", "namespace": "ns",
                    "annotations": {
                        "a": bloat,
                        "resource.kubernetes.io/pod-claim-name": "gpu",
                        "resource.kubernetes.io/extended-resource-claim": "y".repeat(300),
                        "z": {"not": "a string"},
                    },
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "x"},
                        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1", "controller": true},
                        {"apiVersion": "v1", "kind": "Secret", "name": "y", "uid": "y", "controller": false},
                    ]}
            }))
            .unwrap()
            .as_slice(),
        )
        .unwrap();
        let kept = claim.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            kept.iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
            [("resource.kubernetes.io/pod-claim-name", "gpu")]
        );
        assert_eq!(claim.owner_references().len(), 1);
        assert_eq!(claim.owner_references()[0].uid, "u1");
        for nothing in [json!(null), json!({}), json!({"other": "1"})] {
            let claim: ClaimView =
                serde_json::from_value(json!({"metadata": {"name": "c", "annotations": nothing}}))
                    .unwrap();
            assert!(claim.metadata.annotations.is_none(), "{nothing}");
        }
    }

    #[test]
    fn claim_view() {
        let claim: ClaimView = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "cu",
                "finalizers": ["resource.kubernetes.io/delete-protection"],
                "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1", "controller": true}]},
            "spec": {"devices": {"requests": [
                {"name": "a", "firstAvailable": [{"name": "s", "deviceClassName": "x"}]},
                {"name": "b", "exactly": {"deviceClassName": "x", "adminAccess": true}}]}},
            "status": {"allocation": {"devices": {"results": []}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}
        }))
        .unwrap();
        assert!(claim.is_allocated() && claim.admin_access() && claim.is_reserved_for("u1"));
        assert!(!claim.is_reserved_for("u2"));
        assert_eq!(
            claim.annotation(crate::naming::POD_CLAIM_NAME_ANNOTATION),
            Some("gpu")
        );
        assert_eq!(claim.finalizers().len(), 1);
        let bare: ClaimView = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
        assert!(!bare.is_allocated() && !bare.admin_access());
    }

    #[test]
    fn template_view_gates_and_copy() {
        let t: TemplateView = serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"metadata": {"labels": {"l": "1"}, "annotations": {"a": "2"}},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "futureField": 1}}]}}}
        }))
        .unwrap();
        assert!(!t.needs_admin_access() && !t.has_prioritized_list());
        assert_eq!(
            t.claim_metadata("labels").get("l").map(String::as_str),
            Some("1")
        );
        assert_eq!(
            t.claim_spec()["devices"]["requests"][0]["exactly"]["futureField"],
            1
        );
        let gated: TemplateView = serde_json::from_value(json!({
            "metadata": {"name": "t"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "r", "exactly": {"deviceClassName": "gpu", "adminAccess": true}},
                {"name": "s", "firstAvailable": [{"name": "x", "deviceClassName": "gpu"}]}]}}}
        }))
        .unwrap();
        assert!(gated.needs_admin_access() && gated.has_prioritized_list());
    }
}
