//! The yield: device placeholders that release their devices for a pod
//! that waits for them (kube-scheduler cannot preempt pods for devices),
//! and the promises that keep the freed devices for that pod for a while.
//! The choice of placeholders is pure and table-tested ([`yield_choice`]);
//! here the pod and its claims are read live, the chosen placeholders
//! deleted and the promise kept.

pub(crate) mod yield_choice;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::Api;
use kube::api::DeleteParams;
use tracing::{debug, info};

use super::controller::{
    BUFFER_KEY_PREFIX, Controller, PLACEHOLDER_PRIORITY, POD_KEY_PREFIX, Promise, RECHECK_WAITING,
    YIELD_EVERY,
};
use super::watermarks::desired::CPU_MEMORY_ENTRY;
use super::watermarks::watermark::selects;
use crate::allocate::Inventory;
use crate::allocate::inventory::node_inventory;
use crate::model::DeviceId;
use crate::model::views::{NodeView, PodView};
use crate::runtime::error::SyncError;
use crate::runtime::events::Involved;
use crate::runtime::store::object_key;
use yield_choice::{
    CandidateNode, Placeholder, WaitingPod, choose_yield, gate_hold, yield_spent_elsewhere,
};

impl Controller {
    /// How much longer new placeholders stay gated (see [`gate_hold`]).
    pub(super) fn yield_hold(&self) -> Option<Duration> {
        let mut promised = self.promised.lock().unwrap();
        promised.retain(|_, p| p.at.elapsed() < YIELD_EVERY);
        let promises = promised
            .iter()
            .map(|(key, p)| (p.at.elapsed(), self.still_waits(key, &p.uid)));
        gate_hold(promises, YIELD_EVERY)
    }

    /// Whether the pod `key` (this UID) still waits: exists, unbound, not
    /// deleting, not finished.
    fn still_waits(&self, key: &str, uid: &str) -> bool {
        self.pods
            .get(key)
            .is_some_and(|pod| pod.uid() == uid && pod.is_unbound())
    }

    /// The devices yields freed for pods other than `key` that still wait
    /// for them: promised, so no other pod's yield may count them as free.
    fn promised_to_others(&self, key: &str) -> HashSet<DeviceId> {
        let promised = self.promised.lock().unwrap();
        promised
            .iter()
            .filter(|(k, p)| {
                k.as_str() != key && p.at.elapsed() < YIELD_EVERY && self.still_waits(k, &p.uid)
            })
            .flat_map(|(_, p)| p.freed.iter().cloned())
            .collect()
    }

    /// Makes device placeholders yield for the pod `key` if it still waits
    /// for devices and releasing some on one node lets it bind there.
    pub(super) async fn yield_for(&self, key: &str) -> Result<(), SyncError> {
        let Some(cached) = self.pods.get(key) else {
            return Ok(());
        };
        if !super::watermarks::usage::waits_for_devices(&cached, PLACEHOLDER_PRIORITY) {
            return Ok(());
        }
        let uid = cached.uid().to_string();
        if let Some(since) = self.live_promise(key, &uid) {
            debug!(pod = %key, since_ms = since.as_millis() as u64, "placeholders yielded for this pod less than 30 s ago; the devices they freed are not all taken");
            self.recheck(key, RECHECK_WAITING);
            return Ok(());
        }
        // The pod's constraints and claims, fresh: the cache keeps neither.
        let (ns, name) = (cached.namespace(), cached.name());
        let pod = match Api::<Pod>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
        {
            Ok(Some(pod)) => pod,
            Ok(None) => return Ok(()),
            Err(err) => return Err(SyncError::kube(format!("reading pod {key}"), err)),
        };
        let claims = self.unallocated_claims(&pod).await?;
        if claims.is_empty() {
            // Its claims are not created yet, or allocated already (then it
            // binds and no longer waits): looked at again, since no event
            // need come.
            self.recheck(key, RECHECK_WAITING);
            return Ok(());
        }
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let nodes = self.yield_nodes(priority, key);
        let classes: BTreeMap<String, Arc<DeviceClass>> = self
            .devices
            .classes
            .list()
            .into_iter()
            .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
            .collect();
        let spec = pod.spec.clone().unwrap_or_default();
        let waiting = WaitingPod {
            claims: claims.iter().collect(),
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            required_affinity: spec
                .affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
            tolerations: spec.tolerations.as_deref().unwrap_or_default(),
        };
        let candidates: Vec<CandidateNode<'_>> = nodes
            .iter()
            .map(|n| CandidateNode {
                name: &n.name,
                labels: &n.labels,
                taints: &n.taints,
                inventory: &n.inventory,
                in_use: &n.in_use,
                placeholders: n.placeholders.clone(),
            })
            .collect();
        // Every candidate node's trial allocations on one solver thread.
        let chosen = crate::allocate::on_solver_stack(|| {
            choose_yield(&waiting, &candidates, &classes, self.gates)
        })
        .map_err(|err| SyncError::Invalid(format!("cannot start the solver thread: {err}")))?;
        let Some(chosen) = chosen else {
            debug!(pod = %key, "the pod fits without a yield, or no single node would fit it after one; nothing released");
            self.recheck(key, RECHECK_WAITING);
            return Ok(());
        };
        let freed: HashSet<DeviceId> = nodes
            .iter()
            .filter(|n| n.name == chosen.node)
            .flat_map(|n| &n.placeholders)
            .filter(|p| chosen.placeholders.contains(&p.pod))
            .flat_map(|p| p.devices.iter().cloned())
            .collect();
        let placeholders: HashSet<String> = chosen
            .placeholders
            .iter()
            .filter_map(|p| self.pods.get(p).map(|pod| pod.uid().to_string()))
            .collect();
        self.promised.lock().unwrap().insert(
            key.to_string(),
            Promise {
                uid,
                at: Instant::now(),
                freed,
                placeholders,
            },
        );
        self.recheck(key, RECHECK_WAITING);
        {
            let mut released = self.released.lock().unwrap();
            released.retain(|_, at| at.elapsed() < YIELD_EVERY);
            for placeholder in &chosen.placeholders {
                released.insert(placeholder.clone(), Instant::now());
            }
        }
        for placeholder in &chosen.placeholders {
            let (p_ns, p_name) = placeholder.split_once('/').unwrap_or(("", placeholder));
            // Read before the deletion: its watch event empties the cache.
            let placeholder_pod = self.pods.get(placeholder);
            let door = placeholder_pod.as_deref().and_then(|p| self.door_key_of(p));
            let label = placeholder_pod
                .as_deref()
                .and_then(|p| p.placeholder_of().map(str::to_string));
            let api: Api<Pod> = Api::namespaced(self.client.clone(), p_ns);
            match api
                .delete(p_name, &DeleteParams::default().grace_period(0))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(err) => {
                    return Err(SyncError::kube(
                        format!("deleting placeholder pod {placeholder}"),
                        err,
                    ));
                }
            }
            if let Some(label) = &label {
                self.metrics.yields.with_label_values(&[p_ns, label]).inc();
            }
            if let Some(door) = door {
                // A watermark's status counts its yields; a buffer's has no
                // such field. Either way its sync keeps the new placeholder
                // gated while the yield is in flight.
                if !door.starts_with(BUFFER_KEY_PREFIX) {
                    *self
                        .yields_unwritten
                        .lock()
                        .unwrap()
                        .entry(door.clone())
                        .or_default() += 1;
                }
                self.enqueue(door);
            }
        }
        info!(
            pod = %key,
            node = %chosen.node,
            placeholders = %chosen.placeholders.join(","),
            "placeholders yielded their devices for a pod waiting for devices"
        );
        let involved = Involved {
            api_version: "v1".into(),
            kind: "Pod",
            name,
            namespace: ns,
            uid: pod.metadata.uid.as_deref().unwrap_or_default(),
            resource_version: None,
        };
        self.events
            .warn(
                &involved,
                "PlaceholdersYielded",
                &format!(
                    "released {} headroom placeholder(s) on node {} ({}) so that this pod's claims \
                     can be allocated there: kube-scheduler cannot preempt pods for devices",
                    chosen.placeholders.len(),
                    chosen.node,
                    chosen.placeholders.join(", ")
                ),
            )
            .await;
        Ok(())
    }

    /// How long ago the pod (this UID) was last yielded to, if that yield
    /// still stands: less than [`YIELD_EVERY`] ago, and the devices it freed
    /// not all taken by someone else (another waiting pod may win them: the
    /// scheduler takes whichever pod comes first; then this pod may have a
    /// yield of its own at once).
    fn live_promise(&self, key: &str, uid: &str) -> Option<Duration> {
        let promised = self.promised.lock().unwrap();
        let promise = promised
            .get(key)
            .filter(|p| p.uid == uid && p.at.elapsed() < YIELD_EVERY)?;
        let held_by_others: HashSet<DeviceId> = self
            .claims
            .list()
            .iter()
            .filter(|c| !promise.placeholders.iter().any(|u| c.is_reserved_for(u)))
            .flat_map(|c| c.held_devices())
            .collect();
        (!yield_spent_elsewhere(&promise.freed, &held_by_others)).then(|| promise.at.elapsed())
    }

    /// Looks at a waiting pod again after `after` (a pod that no longer
    /// waits by then is dropped at once).
    fn recheck(&self, pod_key: &str, after: Duration) {
        self.queue.add_after(
            format!("{POD_KEY_PREFIX}{pod_key}"),
            after,
            "pod still waits for devices",
        );
    }

    /// The pod's claims that are not allocated yet, read live; a claim not
    /// created yet means the yield waits for it.
    async fn unallocated_claims(&self, pod: &Pod) -> Result<Vec<ResourceClaim>, SyncError> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.clone())
            .unwrap_or_default();
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), ns);
        let mut out = Vec::new();
        for entry in pod
            .spec
            .iter()
            .flat_map(|s| s.resource_claims.iter().flatten())
        {
            let name = entry.resource_claim_name.clone().or_else(|| {
                statuses
                    .iter()
                    .find(|s| s.name == entry.name)
                    .and_then(|s| s.resource_claim_name.clone())
            });
            let Some(name) = name else {
                return Ok(Vec::new());
            };
            match api.get_opt(&name).await {
                Ok(Some(claim)) => {
                    if claim
                        .status
                        .as_ref()
                        .and_then(|s| s.allocation.as_ref())
                        .is_none()
                    {
                        out.push(claim);
                    }
                }
                Ok(None) => return Ok(Vec::new()),
                Err(err) => {
                    return Err(SyncError::kube(
                        format!("reading ResourceClaim {ns}/{name}"),
                        err,
                    ));
                }
            }
        }
        Ok(out)
    }

    /// The nodes of watermarks with device entries, with their devices and
    /// the device placeholders (below `priority`) bound there, as the yield
    /// for the pod `for_pod` sees them.
    fn yield_nodes(&self, priority: i32, for_pod: &str) -> Vec<YieldNode> {
        let nodes = self.devices.nodes.list();
        let mut selected: BTreeMap<String, Arc<NodeView>> = BTreeMap::new();
        for wm in self
            .watermarks
            .list()
            .iter()
            .filter(|w| !w.spec.devices.is_empty())
        {
            let selector = wm.spec.settle().placement.node_selector;
            for node in nodes.iter().filter(|n| selects(&selector, n.labels())) {
                selected.insert(node.name().to_string(), node.clone());
            }
        }
        let pods = self.pods.list();
        // And the nodes of placeholders of every door: a CapacityBuffer's
        // placeholders yield as a watermark's do, wherever they were bound.
        for pod in pods.iter().filter(|p| yields_devices(p)) {
            if let Some(node) = pod.node_name().and_then(|n| self.devices.nodes.get(n)) {
                selected.insert(node.name().to_string(), node);
            }
        }
        let slices = self.devices.slices.list();
        // DeviceTaintRules' taints count as the scheduler counts them.
        let rules = crate::model::device_taints::rules_of(&self.devices.rules.list());
        let claims = self.claims.list();
        // Devices freed for another waiting pod are as good as taken: a
        // second waiting pod must not count on them (it would wait for a
        // yield of its own while a recreated placeholder races for them).
        let mut in_use: HashSet<DeviceId> = claims.iter().flat_map(|c| c.held_devices()).collect();
        in_use.extend(self.promised_to_others(for_pod));
        let released = self.released.lock().unwrap().clone();
        selected
            .into_iter()
            .map(|(name, node)| {
                let placeholders = pods
                    .iter()
                    .filter(|p| {
                        p.node_name() == Some(name.as_str())
                            && yields_devices(p)
                            && p.spec.priority.unwrap_or(0) < priority
                            && released
                                .get(&object_key(p.namespace(), p.name()))
                                .is_none_or(|at| at.elapsed() >= YIELD_EVERY)
                    })
                    .map(|p| Placeholder {
                        pod: object_key(p.namespace(), p.name()),
                        devices: claims
                            .iter()
                            .filter(|c| c.is_reserved_for(p.uid()))
                            .flat_map(|c| c.held_devices())
                            .collect(),
                    })
                    .collect();
                YieldNode {
                    inventory: node_inventory(&name, &slices).with_rules(&rules),
                    labels: node.labels().clone(),
                    taints: node.spec.taints.clone(),
                    in_use: in_use.clone(),
                    placeholders,
                    name,
                }
            })
            .collect()
    }
}

/// A placeholder of ours, of any door, that holds devices on its node and
/// can give them up: bound, not finished, not being deleted, not a CPU and
/// memory placeholder.
fn yields_devices(pod: &PodView) -> bool {
    pod.placeholder_of().is_some()
        && pod
            .placeholder_entry()
            .is_some_and(|e| e != CPU_MEMORY_ENTRY)
        && pod.holds_node()
}

/// A node as the yield needs it, owned.
struct YieldNode {
    name: String,
    labels: BTreeMap<String, String>,
    taints: Vec<k8s_openapi::api::core::v1::Taint>,
    inventory: Inventory,
    in_use: HashSet<DeviceId>,
    placeholders: Vec<Placeholder>,
}
