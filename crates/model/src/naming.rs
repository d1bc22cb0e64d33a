//! Names and ownership: how a pod's claim entry maps to a ResourceClaim name,
//! how generated claims are named, and who controls a claim.
//!
//! Pure functions over plain slices so that both full API objects and the
//! slim cached views can use them.

use k8s_openapi::api::core::v1::{PodResourceClaim, PodResourceClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// Annotation that marks a claim generated from a template; its value is the
/// pod's claim entry name (`pod.spec.resourceClaims[].name`).
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// Annotation set (to "true") on claims the scheduler creates for extended resources.
pub const EXTENDED_RESOURCE_CLAIM_ANNOTATION: &str =
    "resource.kubernetes.io/extended-resource-claim";

/// Label every headroom placeholder pod carries; its value is the name of
/// the NodeScalingWatermark (in the pod's namespace) that keeps it. The
/// admin tools read it to tell placeholders from workloads.
pub const WATERMARK_LABEL: &str = "dra-claim-controller.io/watermark";

/// Set on a pre-scheduled pod (RFC 3339, microseconds) when the allocator
/// has written its devices: the pod update makes its kubelet prepare them
/// at once. A kubelet whose first prepare failed ("claim not allocated")
/// otherwise waits out its back-off (~10-16 s): it retries early on pod
/// updates (spec, labels, annotations), not on claim changes.
pub const DEVICES_ALLOCATED_ANNOTATION: &str = "dra-claim-controller.io/devices-allocated-at";

/// Label naming the watermark entry a placeholder belongs to (`cpu` or a
/// device entry's name).
pub const WATERMARK_ENTRY_LABEL: &str = "dra-claim-controller.io/watermark-entry";

/// The label the seed operator (redhat-cop's proactive-node-scaling-operator)
/// puts on its placeholder pods, naming their watermark: such pods are
/// headroom, never workload, during a migration too.
pub const SEED_PLACEHOLDER_LABEL: &str = "proactive-node-scaling-operator.redhat-cop.io/watermark";

/// The scheduling gate of headroom placeholders: it holds a new placeholder
/// back while a yield is in flight, so that it does not take the devices
/// just freed for a waiting pod.
pub const PLACEHOLDER_GATE: &str = "dra-claim-controller.io/headroom-yield";

/// Field manager for the server-side apply of `pod.status.resourceClaimStatuses`;
/// the same as kube-controller-manager's, so ownership of the field carries over.
pub const FIELD_MANAGER: &str = "ResourceClaimController";

/// Longest `generateName` prefix we send: 63 minus a hyphen and the five
/// random characters the API server appends.
pub(crate) const MAX_GENERATE_NAME_BASE: usize = 57;

/// What a pod claim entry resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimResolution<'a> {
    /// `resourceClaimName`: a claim the user manages; ownership is not checked.
    Shared(&'a str),
    /// A template entry whose generated claim name is recorded in the pod
    /// status; the claim must be controlled by the pod.
    Generated(&'a str),
    /// A template entry recorded in the status without a name: no claim is
    /// needed for it, deliberately.
    Skipped,
    /// A template entry with no status record yet: the claim must be created.
    NotCreatedYet,
    /// Neither `resourceClaimName` nor `resourceClaimTemplateName` is set: a
    /// field this controller does not know. Never guess.
    Unsupported,
}

impl<'a> ClaimResolution<'a> {
    /// The claim name, when the entry resolves to one.
    pub fn name(self) -> Option<&'a str> {
        match self {
            ClaimResolution::Shared(name) | ClaimResolution::Generated(name) => Some(name),
            _ => None,
        }
    }

    /// Whether the claim must be controlled by the pod to be used.
    pub(crate) fn must_check_owner(self) -> bool {
        matches!(self, ClaimResolution::Generated(_))
    }
}

/// Resolves one `pod.spec.resourceClaims[]` entry against `pod.status.resourceClaimStatuses`.
pub fn resolve_claim<'a>(
    entry: &'a PodResourceClaim,
    statuses: &'a [PodResourceClaimStatus],
) -> ClaimResolution<'a> {
    if let Some(name) = entry.resource_claim_name.as_deref() {
        return ClaimResolution::Shared(name);
    }
    if entry.resource_claim_template_name.is_some() {
        return match statuses.iter().find(|s| s.name == entry.name) {
            Some(PodResourceClaimStatus {
                resource_claim_name: Some(name),
                ..
            }) if !name.is_empty() => ClaimResolution::Generated(name),
            Some(_) => ClaimResolution::Skipped,
            None => ClaimResolution::NotCreatedYet,
        };
    }
    ClaimResolution::Unsupported
}

/// The `generateName` for a claim generated for `pod_name`'s entry `entry_name`.
///
/// `<pod>-<entry>-` when that fits in [`MAX_GENERATE_NAME_BASE`] characters.
/// Otherwise both parts are cut in proportion to their length, so that a long
/// pod name does not push the entry name out entirely (the API server would
/// simply cut the end). Kubernetes names are ASCII, so byte indices are
/// character indices; non-ASCII input is cut on a character boundary anyway.
pub fn generate_name(pod_name: &str, entry_name: &str) -> String {
    let full = format!("{pod_name}-{entry_name}-");
    let len = full.len();
    if len <= MAX_GENERATE_NAME_BASE {
        return full;
    }
    let pod_keep = pod_name.len() * MAX_GENERATE_NAME_BASE / len;
    let entry_keep = entry_name.len() * MAX_GENERATE_NAME_BASE / len;
    format!(
        "{}-{}",
        prefix_on_char_boundary(pod_name, pod_keep),
        prefix_on_char_boundary(entry_name, entry_keep)
    )
}

fn prefix_on_char_boundary(s: &str, mut end: usize) -> &str {
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The controller owner reference, if any (the first with `controller: true`,
/// as the API machinery defines it).
pub fn controller_of(owners: &[OwnerReference]) -> Option<&OwnerReference> {
    owners.iter().find(|o| o.controller == Some(true))
}

/// Whether the owner references make the object controlled by the object
/// with `uid` (compared by UID only, like `metav1.IsControlledBy`).
pub fn is_controlled_by(owners: &[OwnerReference], uid: &str) -> bool {
    controller_of(owners).is_some_and(|o| o.uid == uid)
}

/// The pod that controls a claim: an owner reference with `controller: true`,
/// `apiVersion: v1` and `kind: Pod`. Returns (name, uid).
pub fn controlling_pod(owners: &[OwnerReference]) -> Option<(&str, &str)> {
    owners
        .iter()
        .find(|o| o.controller == Some(true) && o.api_version == "v1" && o.kind == "Pod")
        .map(|o| (o.name.as_str(), o.uid.as_str()))
}

/// Whether a PodGroup named `group` (any `scheduling.k8s.io` version)
/// controls the claim: then it is the claim of that group's member pods.
/// By name, as kube-controller-manager matches it.
pub fn is_controlled_by_pod_group(owners: &[OwnerReference], group: &str) -> bool {
    controller_of(owners).is_some_and(|o| {
        o.kind == "PodGroup" && o.api_version.starts_with("scheduling.k8s.io/") && o.name == group
    })
}

/// The owner reference a PodGroup's generated claim gets.
pub fn pod_group_owner_reference(api_version: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: "PodGroup".into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The owner reference a generated claim gets.
pub fn pod_owner_reference(pod_name: &str, pod_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod_name.into(),
        uid: pod_uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template_entry(name: &str, template: &str) -> PodResourceClaim {
        PodResourceClaim {
            name: name.into(),
            resource_claim_template_name: Some(template.into()),
            ..Default::default()
        }
    }

    fn status(name: &str, claim: Option<&str>) -> PodResourceClaimStatus {
        PodResourceClaimStatus {
            name: name.into(),
            resource_claim_name: claim.map(Into::into),
        }
    }

    #[test]
    fn resolve_table() {
        let shared = PodResourceClaim {
            name: "gpu".into(),
            resource_claim_name: Some("shared-gpu".into()),
            ..Default::default()
        };
        let templ = template_entry("gpu", "gpu-template");
        let neither = PodResourceClaim {
            name: "gpu".into(),
            ..Default::default()
        };
        let recorded = [
            status("other", Some("x")),
            status("gpu", Some("pod-gpu-abcde")),
        ];
        let skipped = [status("gpu", None)];
        let other_only = [status("other", Some("x"))];
        let cases: Vec<(
            &str,
            &PodResourceClaim,
            &[PodResourceClaimStatus],
            ClaimResolution,
        )> = vec![
            (
                "shared",
                &shared,
                &[],
                ClaimResolution::Shared("shared-gpu"),
            ),
            (
                "shared-ignores-status",
                &shared,
                &skipped,
                ClaimResolution::Shared("shared-gpu"),
            ),
            (
                "template-recorded",
                &templ,
                &recorded,
                ClaimResolution::Generated("pod-gpu-abcde"),
            ),
            (
                "template-skipped",
                &templ,
                &skipped,
                ClaimResolution::Skipped,
            ),
            (
                "template-not-created",
                &templ,
                &[],
                ClaimResolution::NotCreatedYet,
            ),
            (
                "template-other-entry-recorded",
                &templ,
                &other_only,
                ClaimResolution::NotCreatedYet,
            ),
            (
                "unsupported",
                &neither,
                &recorded,
                ClaimResolution::Unsupported,
            ),
        ];
        for (case, entry, statuses, want) in cases {
            assert_eq!(resolve_claim(entry, statuses), want, "case {case}");
        }
        assert!(ClaimResolution::Generated("a").must_check_owner());
        assert!(!ClaimResolution::Shared("a").must_check_owner());
        assert_eq!(ClaimResolution::Skipped.name(), None);
    }

    /// Reference arithmetic, written out independently: keep
    /// `len(part) * 57 / len(pod-entry-)` characters of each part.
    fn expected(pod: &str, entry: &str) -> String {
        let l = pod.len() + entry.len() + 2;
        if l <= 57 {
            format!("{pod}-{entry}-")
        } else {
            format!(
                "{}-{}",
                &pod[..pod.len() * 57 / l],
                &entry[..entry.len() * 57 / l]
            )
        }
    }

    #[test]
    fn generate_name_edges() {
        let name = |n: usize, c: char| std::iter::repeat_n(c, n).collect::<String>();
        // (pod length, entry length) around the 57-character base.
        let cases = [
            (1, 1),
            (27, 28),  // base exactly 57
            (28, 28),  // base 58: first truncation
            (1, 54),   // 57
            (1, 55),   // 58
            (56, 1),   // 59
            (54, 1),   // 57
            (63, 63),  // both at the label limit
            (253, 1),  // longest pod name
            (253, 63), // longest pod name, longest entry
            (1, 253),
            (57, 1),
            (58, 5),
        ];
        for (pl, el) in cases {
            let pod = name(pl, 'p');
            let entry = name(el, 'e');
            let got = generate_name(&pod, &entry);
            assert_eq!(got, expected(&pod, &entry), "pod {pl}, entry {el}");
            assert!(got.len() <= 58, "pod {pl}, entry {el}: {} chars", got.len());
            // The API server adds 5 characters: the final name fits 63.
            assert!(got.len() + 5 <= 63);
        }
        assert_eq!(generate_name("my-pod", "gpu"), "my-pod-gpu-");
        // 58 characters: both parts shrink, no trailing hyphen.
        let pod = name(40, 'a');
        let entry = name(16, 'b');
        let got = generate_name(&pod, &entry);
        assert_eq!(got, format!("{}-{}", name(39, 'a'), name(15, 'b')));
        assert!(!got.ends_with('-'));
    }

    #[test]
    fn generate_name_never_panics_on_non_ascii() {
        let got = generate_name(&"é".repeat(40), &"ü".repeat(40));
        assert!(got.len() <= 58);
    }

    #[test]
    fn ownership() {
        let mut owner = pod_owner_reference("p", "uid-1");
        assert!(is_controlled_by(std::slice::from_ref(&owner), "uid-1"));
        assert!(!is_controlled_by(std::slice::from_ref(&owner), "uid-2"));
        assert_eq!(
            controlling_pod(std::slice::from_ref(&owner)),
            Some(("p", "uid-1"))
        );
        owner.controller = Some(false);
        assert!(!is_controlled_by(std::slice::from_ref(&owner), "uid-1"));
        assert_eq!(controlling_pod(std::slice::from_ref(&owner)), None);
        let job = OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: "j".into(),
            uid: "uid-1".into(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        // Controlled by UID, but not by a pod.
        assert!(is_controlled_by(std::slice::from_ref(&job), "uid-1"));
        assert_eq!(controlling_pod(&[job]), None);
    }
}
