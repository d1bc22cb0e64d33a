//! [`PodView`] read from a pod's protobuf bytes, keeping what the JSON path
//! keeps and nothing more: the same fields, the same slimming (one label,
//! of the conditions only `PodScheduled` and `DisruptionTarget`, the
//! containers' last finish), and the JSON path's notion of absent (an
//! empty string, which protobuf writes for every unset string, reads as
//! absent, as JSON's omitted field does).
//! Field numbers are those of `k8s.io/api/core/v1/generated.proto` and
//! `k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodResourceClaim, PodResourceClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::{
    ANNOTATION_VALUE_MAX, ExtendedClaimRef, POD_LABELS_READ, PodConditions, PodView, PodViewSpec,
    PodViewStatus, SchedulingGroupRef, fields_v1_own_node_name,
};
use crate::requests::{InitRequests, ResourceList, add_into, parse_list};
use dra_runtime::protobuf::{FromProtobuf, Value, WireError, fields, map_entry, time};

impl FromProtobuf for PodView {
    /// `Pod`: metadata 1, spec 2, status 3.
    fn from_protobuf(raw: &[u8]) -> Result<Self, WireError> {
        let mut pod = PodView::default();
        for field in fields(raw) {
            match field? {
                (1, v) => (pod.metadata, pod.node_name_written) = pod_meta(v.bytes()?)?,
                (2, v) => pod.spec = pod_spec(v.bytes()?)?,
                (3, v) => pod.status = pod_status(v.bytes()?)?,
                _ => {}
            }
        }
        Ok(pod)
    }
}

/// An optional string: empty is absent.
fn non_empty(v: Value<'_>) -> Result<Option<String>, WireError> {
    let s = v.string()?;
    Ok((!s.is_empty()).then_some(s))
}

/// `ObjectMeta`: name 1, namespace 3, uid 5, resourceVersion 6,
/// deletionTimestamp 9, labels 11, managedFields 17 (only whether one owns
/// `spec.nodeName`, as the JSON path).
fn pod_meta(raw: &[u8]) -> Result<(ObjectMeta, bool), WireError> {
    let mut meta = ObjectMeta::default();
    let mut labels = BTreeMap::new();
    let mut node_name_written = false;
    for field in fields(raw) {
        match field? {
            (17, v) if !node_name_written => {
                node_name_written = managed_entry_owns_node_name(v.bytes()?)?;
            }
            (1, v) => meta.name = non_empty(v)?,
            (3, v) => meta.namespace = non_empty(v)?,
            (5, v) => meta.uid = non_empty(v)?,
            (6, v) => meta.resource_version = non_empty(v)?,
            (9, v) => meta.deletion_timestamp = Some(time(v.bytes()?)?),
            (11, v) => {
                let (key, value) = map_entry(v.bytes()?)?;
                let key = key.bytes()?;
                let read = POD_LABELS_READ.iter().find(|k| k.as_bytes() == key);
                if let Some(read) = read
                    && value.bytes()?.len() <= ANNOTATION_VALUE_MAX
                {
                    labels.insert((*read).to_owned(), value.string()?);
                }
            }
            _ => {}
        }
    }
    meta.labels = (!labels.is_empty()).then_some(labels);
    Ok((meta, node_name_written))
}

/// `ManagedFieldsEntry`: fieldsV1 7 (`FieldsV1`: Raw 1), subresource 8.
fn managed_entry_owns_node_name(raw: &[u8]) -> Result<bool, WireError> {
    let (mut subresource, mut owns) = (false, false);
    for field in fields(raw) {
        match field? {
            (7, v) => {
                for field in fields(v.bytes()?) {
                    if let (1, v) = field? {
                        owns = fields_v1_own_node_name(v.bytes()?);
                    }
                }
            }
            (8, v) => subresource = !v.bytes()?.is_empty(),
            _ => {}
        }
    }
    Ok(owns && !subresource)
}

/// `PodSpec`: containers 2, nodeName 10, initContainers 20, priority 25,
/// overhead 32, schedulingGates 38 (`PodSchedulingGate`: name 1),
/// resourceClaims 39, resources 40, schedulingGroup 43.
fn pod_spec(raw: &[u8]) -> Result<PodViewSpec, WireError> {
    let mut spec = PodViewSpec::default();
    let mut gates = 0usize;
    for field in fields(raw) {
        match field? {
            (2, v) => add_into(
                &mut spec.container_requests,
                &container(v.bytes()?)?.requests,
            ),
            (20, v) => spec.init_requests.push(container(v.bytes()?)?),
            (25, v) => spec.priority = Some(v.int()? as i32),
            (32, v) => add_quantity(&mut spec.overhead, v.bytes()?)?,
            (38, v) => {
                for field in fields(v.bytes()?) {
                    if let (1, name) = field?
                        && spec.placeholder_gate.is_none()
                        && name.bytes()? == crate::naming::PLACEHOLDER_GATE.as_bytes()
                    {
                        spec.placeholder_gate = Some(gates);
                    }
                }
                gates += 1;
            }
            (40, v) => spec.pod_level_requests = requirements(v.bytes()?)?,
            (10, v) => spec.node_name = non_empty(v)?,
            (39, v) => spec.resource_claims.push(resource_claim(v.bytes()?)?),
            (43, v) => {
                let mut group = SchedulingGroupRef::default();
                for field in fields(v.bytes()?) {
                    if let (1, v) = field? {
                        group.pod_group_name = non_empty(v)?;
                    }
                }
                spec.scheduling_group = Some(group);
            }
            _ => {}
        }
    }
    Ok(spec)
}

/// `PodResourceClaim`: name 1, resourceClaimName 3,
/// resourceClaimTemplateName 4.
fn resource_claim(raw: &[u8]) -> Result<PodResourceClaim, WireError> {
    let mut claim = PodResourceClaim::default();
    for field in fields(raw) {
        match field? {
            (1, v) => claim.name = v.string()?,
            (3, v) => claim.resource_claim_name = non_empty(v)?,
            (4, v) => claim.resource_claim_template_name = non_empty(v)?,
            _ => {}
        }
    }
    Ok(claim)
}

/// `PodStatus`: phase 1, conditions 2, containerStatuses 8,
/// resourceClaimStatuses 15, extendedResourceClaimStatus 18.
fn pod_status(raw: &[u8]) -> Result<PodViewStatus, WireError> {
    let mut status = PodViewStatus::default();
    // As the JSON path: every container terminated, the latest finish.
    let (mut containers, mut finished, mut latest) = (0usize, 0usize, None::<Time>);
    for field in fields(raw) {
        match field? {
            (1, v) => status.phase = non_empty(v)?,
            (2, v) => note_condition(&mut status.conditions, v.bytes()?)?,
            (8, v) => {
                containers += 1;
                if let Some(at) = container_finished_at(v.bytes()?)? {
                    finished += 1;
                    if latest.as_ref().is_none_or(|l| l.0 < at.0) {
                        latest = Some(at);
                    }
                }
            }
            (15, v) => {
                let mut entry = PodResourceClaimStatus::default();
                for field in fields(v.bytes()?) {
                    match field? {
                        (1, v) => entry.name = v.string()?,
                        (2, v) => entry.resource_claim_name = non_empty(v)?,
                        _ => {}
                    }
                }
                status.resource_claim_statuses.push(entry);
            }
            (18, v) => {
                let mut extended = ExtendedClaimRef::default();
                for field in fields(v.bytes()?) {
                    if let (2, v) = field? {
                        extended.resource_claim_name = v.string()?;
                    }
                }
                status.extended_resource_claim_status = Some(extended);
            }
            _ => {}
        }
    }
    status.containers_finished_at = latest.filter(|_| finished == containers);
    Ok(status)
}

/// `PodCondition`: type 1, status 2, lastTransitionTime 4, reason 5,
/// message 6.
fn note_condition(kept: &mut PodConditions, raw: &[u8]) -> Result<(), WireError> {
    let (mut type_, mut status, mut reason) = (String::new(), String::new(), String::new());
    let (mut message, mut transition) = (String::new(), None);
    for field in fields(raw) {
        match field? {
            (1, v) => type_ = v.string()?,
            (2, v) => status = v.string()?,
            (4, v) => transition = Some(time(v.bytes()?)?),
            (5, v) => reason = v.string()?,
            (6, v) => message = v.string()?,
            _ => {}
        }
    }
    kept.note(type_, status, reason, message, transition);
    Ok(())
}

/// `Container`: resources 8 (`ResourceRequirements`), restartPolicy 24.
fn container(raw: &[u8]) -> Result<InitRequests, WireError> {
    let mut out = InitRequests::default();
    for field in fields(raw) {
        match field? {
            (8, v) => out.requests = requirements(v.bytes()?)?,
            (24, v) => out.sidecar = v.bytes()? == b"Always",
            _ => {}
        }
    }
    Ok(out)
}

/// `ResourceRequirements`: requests 2.
fn requirements(raw: &[u8]) -> Result<ResourceList, WireError> {
    let mut requests = ResourceList::new();
    for field in fields(raw) {
        if let (2, v) = field? {
            add_quantity(&mut requests, v.bytes()?)?;
        }
    }
    Ok(requests)
}

/// One `map<string, Quantity>` entry into `list` (`Quantity`: string 1);
/// one that does not parse counts as nothing, as on the JSON path.
fn add_quantity(list: &mut ResourceList, entry: &[u8]) -> Result<(), WireError> {
    let (name, quantity) = map_entry(entry)?;
    let mut text = String::new();
    for field in fields(quantity.bytes()?) {
        if let (1, v) = field? {
            text = v.string()?;
        }
    }
    list.extend(parse_list([(name.string()?, text)]));
    Ok(())
}

/// `ContainerStatus.state` 2 → `ContainerState.terminated` 3 →
/// `ContainerStateTerminated.finishedAt` 6.
fn container_finished_at(raw: &[u8]) -> Result<Option<Time>, WireError> {
    let mut finished_at = None;
    for field in fields(raw) {
        if let (2, state) = field? {
            for field in fields(state.bytes()?) {
                if let (3, terminated) = field? {
                    for field in fields(terminated.bytes()?) {
                        if let (6, at) = field? {
                            finished_at = Some(time(at.bytes()?)?);
                        }
                    }
                }
            }
        }
    }
    Ok(finished_at)
}

/// Decoding checked against bytes a real kube-apiserver wrote: a protobuf
/// watch of four pods (`testdata/pods.watch.pb`, the frames of
/// `GET /api/v1/namespaces/NS/pods?watch=true&resourceVersion=0`) and the
/// same pods as JSON (`testdata/pods.json`), captured by the e2e set-up of
/// `pods_read_from_protobuf_equal_pods_read_from_json`: one created with
/// its node and two claims (Succeeded, a placeholder label and one
/// another), one bound through `pods/binding`, one held by a finalizer and
/// deleted, one with requests of every kind and scheduling gates.
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use dra_runtime::protobuf::{Frames, watch_event};
    use kube::api::WatchEvent;

    use super::*;
    use crate::naming::WATERMARK_LABEL;
    use crate::views::DisruptionTargetSeen;

    const WATCH: &[u8] = include_bytes!("testdata/pods.watch.pb");
    const JSON: &str = include_str!("testdata/pods.json");

    fn frames() -> Vec<bytes::Bytes> {
        let mut frames = Frames::default();
        frames.push(WATCH);
        let mut out = Vec::new();
        while let Some(frame) = frames.next_frame().unwrap() {
            out.push(frame);
        }
        assert!(frames.is_empty(), "the capture ends with a whole frame");
        out
    }

    fn from_protobuf() -> BTreeMap<String, PodView> {
        frames()
            .iter()
            .map(|frame| match watch_event::<PodView>(frame).unwrap() {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                    (pod.metadata.name.clone().unwrap(), pod)
                }
                other => panic!("unexpected event {other:?}"),
            })
            .collect()
    }

    fn from_json() -> BTreeMap<String, PodView> {
        let list: serde_json::Value = serde_json::from_str(JSON).unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| {
                let pod: PodView = serde_json::from_value(item.clone()).unwrap();
                (pod.metadata.name.clone().unwrap(), pod)
            })
            .collect()
    }

    #[test]
    fn a_real_api_servers_pods_read_alike_from_protobuf_and_json() {
        let (protobuf, json) = (from_protobuf(), from_json());
        assert_eq!(protobuf.len(), 4);
        assert_eq!(format!("{protobuf:#?}"), format!("{json:#?}"));
        // Real values, not two empty views.
        let finished = &protobuf["finished"];
        assert_eq!(finished.spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(finished.spec.resource_claims.len(), 2);
        assert_eq!(finished.status.phase.as_deref(), Some("Succeeded"));
        assert_eq!(finished.status.resource_claim_statuses.len(), 1);
        assert!(finished.status.conditions.scheduling.scheduled);
        assert!(finished.status.containers_finished_at.is_some());
        assert!(finished.node_name_written, "its creator owns spec.nodeName");
        assert_eq!(
            finished.metadata.labels,
            Some([(WATERMARK_LABEL.to_string(), "wm-1".to_string())].into()),
            "only the labels read are kept"
        );
        let bound = &protobuf["bound"];
        assert_eq!(bound.spec.node_name.as_deref(), Some("node-2"));
        assert!(!bound.node_name_written, "bound through pods/binding");
        let plain = &protobuf["plain"];
        assert!(plain.status.conditions.scheduling.unschedulable);
        assert_eq!(plain.spec.placeholder_gate, Some(1));
        assert!(plain.is_seed_placeholder() && plain.placeholder_entry() == Some("gpu"));
        let held = &protobuf["held"];
        assert!(held.metadata.deletion_timestamp.is_some());
        assert!(!held.metadata.uid.as_deref().unwrap_or_default().is_empty());
    }

    /// Protobuf's base-128 varint.
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// Protobuf's length-delimited field `number` holding `bytes`.
    fn message_field(number: u32, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        varint(u64::from(number << 3 | 2), &mut out);
        varint(bytes.len() as u64, &mut out);
        out.extend_from_slice(bytes);
        out
    }

    /// `DisruptionTarget` is kept as JSON keeps it (status, reason,
    /// message, transition time); other conditions but `PodScheduled` are
    /// not, and a pod without it carries nothing.
    #[test]
    fn the_disruption_target_condition_reads_alike_from_protobuf_and_json() {
        let condition = |type_: &str, reason: &str| {
            let mut c = message_field(1, type_.as_bytes());
            c.extend(message_field(2, b"True"));
            // Time: seconds (field 1, a varint) 1,764,064,800.
            let mut seconds = vec![0x08];
            varint(1_764_064_800, &mut seconds);
            c.extend(message_field(4, &seconds));
            c.extend(message_field(5, reason.as_bytes()));
            c.extend(message_field(6, b"evicting"));
            message_field(2, &c)
        };
        let mut status = condition("Ready", "Whatever");
        status.extend(condition("DisruptionTarget", "EvictionByEvictionAPI"));
        let from_protobuf = PodView::from_protobuf(&message_field(3, &status)).unwrap();
        let from_json: PodView = serde_json::from_value(serde_json::json!({
            "metadata": {},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "Whatever", "message": "evicting",
                 "lastTransitionTime": "2025-11-25T10:00:00Z"},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                 "message": "evicting", "lastTransitionTime": "2025-11-25T10:00:00Z"},
            ]}
        }))
        .unwrap();
        let expected = DisruptionTargetSeen {
            status: "True".into(),
            reason: Some("EvictionByEvictionAPI".into()),
            message: Some("evicting".into()),
            last_transition_time: Some(Time("2025-11-25T10:00:00Z".parse().unwrap())),
        };
        for pod in [&from_protobuf, &from_json] {
            assert_eq!(
                pod.status.conditions.disruption_target.as_deref(),
                Some(&expected)
            );
        }
        let without: PodView = serde_json::from_value(serde_json::json!({
            "metadata": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        assert_eq!(without.status.conditions.disruption_target, None);
    }

    /// A watch body arriving in pieces yields each frame once it is whole,
    /// never a part of one.
    #[test]
    fn frames_come_whole_however_the_bytes_arrive() {
        let whole = frames();
        for chunk in [1, 7, 500] {
            let mut frames = Frames::default();
            let mut got = Vec::new();
            for piece in WATCH.chunks(chunk) {
                frames.push(piece);
                while let Some(frame) = frames.next_frame().unwrap() {
                    got.push(frame);
                }
            }
            assert_eq!(got, whole, "in chunks of {chunk} bytes");
        }
        let mut cut = Frames::default();
        cut.push(&WATCH[..WATCH.len() - 1]);
        let mut seen = 0;
        while cut.next_frame().unwrap().is_some() {
            seen += 1;
        }
        assert_eq!(
            seen,
            whole.len() - 1,
            "the last, cut short, is not given out"
        );
        assert!(!cut.is_empty(), "its bytes wait for the rest");
    }

    /// A frame cut anywhere never panics, and a cut inside a nested message
    /// (the pod, its metadata, its spec) is an error, not a smaller pod.
    #[test]
    fn a_frame_cut_short_is_an_error_never_a_panic() {
        let frame = &frames()[0];
        let mut errors = 0;
        for len in 0..frame.len() {
            if watch_event::<PodView>(&frame[..len]).is_err() {
                errors += 1;
            }
        }
        // The only cuts that still parse end exactly between two fields of
        // the outermost message (the event type, the object).
        assert!(
            errors >= frame.len() - 3,
            "{errors} of {} cuts refused",
            frame.len()
        );
    }

    /// A length prefix that points past the end is refused.
    #[test]
    fn a_length_past_the_end_is_refused() {
        let mut frame = frames()[0].to_vec();
        // Field 1 (the event type), length-delimited: tag 0x0a, then its
        // length; claim far more bytes than there are.
        assert_eq!(frame[0], 0x0a);
        frame[1] = 0x7f;
        assert!(watch_event::<PodView>(&frame).is_err());
    }
}
