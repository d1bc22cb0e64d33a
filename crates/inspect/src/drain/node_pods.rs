//! The node's own pods, checked from their side: a pod bound to the node
//! that may run holds every allocated claim it names, and one whose
//! containers finished moments ago may still hold its devices.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::DrainScope;
use crate::snapshot::Snapshot;
use dra_model::views::PodView;

/// What a pod bound to the node means for its devices now.
pub(super) enum NodePod {
    /// May run: its allocated claims are in use.
    Running,
    /// Containers finished this long ago, within the grace period.
    Finishing(Duration),
    /// Done long enough ago, or no sign of its containers: not holding.
    Idle,
}

fn node_pod_state(pod: &PodView, scope: DrainScope<'_>, now: Timestamp) -> NodePod {
    if !pod.is_done() {
        return NodePod::Running;
    }
    let Some(finished) = &pod.status.containers_finished_at else {
        return NodePod::Idle;
    };
    let ago: Duration = now
        .duration_since(finished.0)
        .try_into()
        .unwrap_or_default();
    if ago < scope.finished_grace {
        NodePod::Finishing(ago)
    } else {
        NodePod::Idle
    }
}

/// Pods bound to the node, with what they mean now (idle ones left out).
pub(super) fn node_pods<'s>(
    snapshot: &'s Snapshot,
    scope: DrainScope<'_>,
    now: Timestamp,
) -> Vec<(&'s PodView, NodePod)> {
    let mut pods: Vec<(&PodView, NodePod)> = snapshot
        .pods
        .values()
        .filter(|p| p.node_name() == Some(scope.node))
        .map(|p| (&**p, node_pod_state(p, scope, now)))
        .filter(|(_, state)| !matches!(state, NodePod::Idle))
        .collect();
    pods.sort_by_key(|(p, _)| (p.namespace().to_string(), p.name().to_string()));
    pods
}

/// Claims the node's running or finishing pods name that the snapshot
/// lacks: the reader fetches each (absent afterwards = no such claim).
pub(crate) fn claims_to_look_up(
    snapshot: &Snapshot,
    scope: DrainScope<'_>,
    now: Timestamp,
) -> BTreeSet<(String, String)> {
    let have = snapshot.claims_by_key();
    node_pods(snapshot, scope, now)
        .into_iter()
        .flat_map(|(pod, _)| {
            pod.claim_names()
                .into_iter()
                .map(move |name| (pod.namespace(), name))
        })
        .filter(|key| !have.contains_key(key))
        .map(|(ns, name)| (ns.to_string(), name.to_string()))
        .collect()
}
