//! The state a check judges: claims, the pods they name, slices and nodes,
//! as read at one moment. Plain values, so that the checks are pure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

use super::placement::NodeFacts;
use super::report::{ClaimRef, DeviceRef};
use dra_model::classify::ClaimFacts;
use dra_model::consumers::is_pod_consumer;
use dra_model::naming::controlling_pod;
use dra_model::views::PodView;

#[derive(Debug, Default, Clone)]
pub(crate) struct Snapshot {
    pub claims: Vec<ResourceClaim>,
    /// Pods by namespace and name. A pod a claim names that is missing here
    /// does not exist: the reader looks up every such pod.
    pub pods: HashMap<(String, String), Arc<PodView>>,
    pub slices: Vec<ResourceSlice>,
    /// Nodes by name; a node missing here is judged by its name alone.
    pub nodes: BTreeMap<String, NodeFacts>,
}

impl Snapshot {
    pub(crate) fn add_pod(&mut self, pod: PodView) {
        self.pods.insert(
            (pod.namespace().to_string(), pod.name().to_string()),
            Arc::new(pod),
        );
    }

    pub(crate) fn pod(&self, namespace: &str, name: &str) -> Option<Arc<PodView>> {
        self.pods
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// The claims by namespace and name.
    pub(crate) fn claims_by_key(&self) -> HashMap<(&str, &str), &ResourceClaim> {
        self.claims
            .iter()
            .map(|c| {
                (
                    (
                        c.metadata.namespace.as_deref().unwrap_or_default(),
                        c.metadata.name.as_deref().unwrap_or_default(),
                    ),
                    c,
                )
            })
            .collect()
    }

    /// The facts the selectors of `name` are matched against.
    pub(crate) fn node(&self, name: &str) -> std::borrow::Cow<'_, NodeFacts> {
        match self.nodes.get(name) {
            Some(node) => std::borrow::Cow::Borrowed(node),
            None => std::borrow::Cow::Owned(NodeFacts::named(name)),
        }
    }
}

/// The pods (namespace, name) that `claim` names as consumers or owner.
pub(crate) fn named_pods(claim: &ResourceClaim) -> BTreeSet<(String, String)> {
    let facts = ClaimFacts::from(claim);
    let ns = facts.namespace.to_string();
    let mut names: BTreeSet<(String, String)> = facts
        .reserved_for
        .iter()
        .filter(|r| is_pod_consumer(r))
        .map(|r| (ns.clone(), r.name.clone()))
        .collect();
    if let Some((owner, _)) = controlling_pod(facts.owners) {
        names.insert((ns, owner.to_string()));
    }
    names
}

pub(crate) fn claim_ref(claim: &ResourceClaim) -> ClaimRef {
    ClaimRef {
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
    }
}

/// The devices of the claim's allocation, of `driver` only when given.
pub(crate) fn devices(claim: &ResourceClaim, driver: Option<&str>) -> Vec<DeviceRef> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|r| driver.is_none_or(|d| r.driver == d))
        .map(|r| DeviceRef {
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
        })
        .collect()
}
