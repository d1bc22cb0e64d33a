//! The invariant every end-to-end test ends with: once the controller is
//! quiet, no claim generated for a pod remains when that pod is finished
//! or was replaced (same name, another UID), unless something else still
//! uses it. A leaked claim is a device nobody can use. Claims of pods that
//! are gone altogether are the garbage collector's, as with the reference
//! controller; this harness runs none, so those are not counted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams};

/// How long the controller gets to clean up after the test's last step.
/// A liveness bound of the check, not a speed target.
pub const QUIET_WITHIN: Duration = Duration::from_secs(60);

/// What a pod of the cluster is, as far as its claims are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    pub finished: bool,
}

/// Whether `uid` names a pod `name` in `ns` that exists and has not
/// finished.
fn live(pods: &BTreeMap<(String, String), PodFacts>, ns: &str, name: &str, uid: &str) -> bool {
    pods.get(&(ns.to_string(), name.to_string()))
        .is_some_and(|p| p.uid == uid && !p.finished)
}

/// The claims (`namespace/name: why`) generated for a pod that is finished
/// or replaced and used by no live consumer. Reservations for anything but a
/// pod count as in use (the controller keeps them).
pub fn leaked(
    claims: &[ResourceClaim],
    pods: &BTreeMap<(String, String), PodFacts>,
) -> Vec<String> {
    let mut out = Vec::new();
    for claim in claims {
        let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let Some(owner) = claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "Pod" && o.api_version == "v1")
        else {
            continue;
        };
        let Some(pod) = pods.get(&(ns.to_string(), owner.name.clone())) else {
            // Gone: the garbage collector's.
            continue;
        };
        if live(pods, ns, &owner.name, &owner.uid) {
            continue;
        }
        let in_use = claim
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .any(|r| {
                let is_pod =
                    r.api_group.as_deref().unwrap_or_default().is_empty() && r.resource == "pods";
                !is_pod || live(pods, ns, &r.name, &r.uid)
            });
        if in_use {
            continue;
        }
        let why = if pod.uid == owner.uid {
            "its pod finished"
        } else {
            "its pod was replaced"
        };
        out.push(format!("{ns}/{name}: {why}"));
    }
    out
}

/// Waits until no claim in `namespace` (all namespaces: `None`) is leaked;
/// returns what is still leaked after [`QUIET_WITHIN`].
pub async fn wait_none_leaked(client: &kube::Client, namespace: Option<&str>) -> Vec<String> {
    let started = Instant::now();
    loop {
        let found = match read(client, namespace).await {
            Ok((claims, pods)) => leaked(&claims, &pods),
            // The server may be gone already (a test that stopped it).
            Err(_) => return Vec::new(),
        };
        if found.is_empty() || started.elapsed() > QUIET_WITHIN {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn read(
    client: &kube::Client,
    namespace: Option<&str>,
) -> kube::Result<(Vec<ResourceClaim>, BTreeMap<(String, String), PodFacts>)> {
    let (claims, pods): (Api<ResourceClaim>, Api<Pod>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    // Pods first: a pod created after its claim was listed is then seen.
    let pods = pods.list(&ListParams::default()).await?.items;
    let claims = claims.list(&ListParams::default()).await?.items;
    let pods = pods
        .into_iter()
        .map(|p| {
            let key = (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
            );
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            let facts = PodFacts {
                uid: p.metadata.uid.clone().unwrap_or_default(),
                finished: matches!(phase, Some("Succeeded" | "Failed")),
            };
            (key, facts)
        })
        .collect();
    Ok((claims, pods))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(
        name: &str,
        owner: &str,
        owner_uid: &str,
        reserved: serde_json::Value,
    ) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": owner_uid, "controller": true}]},
            "spec": {},
            "status": {"reservedFor": reserved},
        }))
        .unwrap()
    }

    #[test]
    fn leaked_claims_are_those_of_finished_or_gone_pods_nobody_uses() {
        let pods = BTreeMap::from([
            (
                ("ns".into(), "running".into()),
                PodFacts {
                    uid: "r".into(),
                    finished: false,
                },
            ),
            (
                ("ns".into(), "done".into()),
                PodFacts {
                    uid: "d".into(),
                    finished: true,
                },
            ),
            (
                ("ns".into(), "replaced".into()),
                PodFacts {
                    uid: "new".into(),
                    finished: false,
                },
            ),
        ]);
        let claims = [
            claim("a", "running", "r", json!([])),
            claim("b", "done", "d", json!([])),
            claim("c", "replaced", "old", json!([])),
            claim("d", "gone", "g", json!([])),
            claim(
                "e",
                "done",
                "d",
                json!([{"resource": "pods", "name": "running", "uid": "r"}]),
            ),
            claim(
                "f",
                "done",
                "d",
                json!([{"apiGroup": "example.com", "resource": "things", "name": "x", "uid": "x"}]),
            ),
            claim(
                "g",
                "done",
                "d",
                json!([{"resource": "pods", "name": "done", "uid": "d"}]),
            ),
        ];
        assert_eq!(
            leaked(&claims, &pods),
            vec![
                "ns/b: its pod finished",
                "ns/c: its pod was replaced",
                "ns/g: its pod finished",
            ]
        );
    }
}
