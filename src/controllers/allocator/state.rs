//! What the allocator for declared nodes (`--allocate-on-nodes`) keeps:
//! the ResourceSlices, DeviceClasses and declared Nodes it reads, the
//! devices of allocations it wrote that no watch has shown yet, and the
//! pods waiting for devices (woken when slices, classes or claims change).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};

use crate::model::DeviceId;
use crate::model::selector::LabelSelector;
use crate::model::views::{ClaimView, DeviceStores, NodeView};
use crate::runtime::store::Store;

/// A pod waiting for devices: on which node, and the last failure told.
#[derive(Clone, Debug)]
struct Waiting {
    node: String,
    told: String,
}

/// The allocator's state. One worker reads and writes it, so what one
/// allocation decides is visible to the next before any watch shows it.
pub struct Allocation {
    /// The label selector of declared nodes.
    pub node_selector: LabelSelector,
    /// ... as given.
    pub selector_text: String,
    /// The process's stores (one watch each).
    pub slices: Arc<Store<ResourceSlice>>,
    pub classes: Arc<Store<DeviceClass>>,
    pub all_nodes: Arc<Store<NodeView>>,
    /// DeviceTaintRules (empty while `DRADeviceTaintRules` is off): their
    /// taints keep devices from claims that do not tolerate them.
    pub rules: Arc<Store<k8s_openapi::api::resource::v1::DeviceTaintRule>>,
    /// The declared nodes among them.
    pub nodes: Arc<Store<NodeView>>,
    /// Claim UID → the resourceVersion guarding an allocation this process
    /// wrote (or tried to: an answer lost after the write committed counts,
    /// and so does a write that may still commit) and its devices, until a
    /// read shows it landed or can no longer land.
    written: Mutex<HashMap<String, (String, Vec<DeviceId>)>>,
    /// Pod key (`namespace/name`) → what it waits for.
    waiting: Mutex<BTreeMap<String, Waiting>>,
}

impl Allocation {
    pub fn new(
        selector_text: String,
        node_selector: LabelSelector,
        devices: &DeviceStores,
    ) -> Self {
        Allocation {
            node_selector,
            selector_text,
            slices: devices.slices.clone(),
            classes: devices.classes.clone(),
            all_nodes: devices.nodes.clone(),
            rules: devices.rules.clone(),
            nodes: Arc::new(Store::new(Vec::new())),
            written: Mutex::new(HashMap::new()),
            waiting: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether the admin handed `node` to us (it matches the selector).
    pub(crate) fn is_declared(&self, node: &str) -> bool {
        self.nodes.get(node).is_some()
    }

    /// Records devices about to be written to the claim with `uid`, by a
    /// patch guarded by `version`.
    pub(crate) fn note_written(&self, uid: &str, version: &str, devices: Vec<DeviceId>) {
        self.written
            .lock()
            .unwrap()
            .insert(uid.to_string(), (version.to_string(), devices));
    }

    /// The write for `uid` surely did not commit, or its claim is gone, or
    /// the claim as read shows what it holds: forget it.
    pub(crate) fn forget_written(&self, uid: &str) {
        self.written.lock().unwrap().remove(uid);
    }

    /// A relist of the claims: writes whose claim is gone are forgotten, the
    /// others are checked as [`Allocation::claim_seen`] does.
    pub(crate) fn claims_relisted(&self, claims: &[Arc<ClaimView>]) {
        let by_uid: HashMap<&str, &ClaimView> = claims.iter().map(|c| (c.uid(), &**c)).collect();
        let uids: Vec<String> = self.written.lock().unwrap().keys().cloned().collect();
        for uid in uids {
            match by_uid.get(uid.as_str()) {
                Some(claim) => self.claim_seen(claim),
                None => self.forget_written(&uid),
            }
        }
    }

    /// The claim watch showed `claim`: once it shows our devices, it
    /// speaks for itself (an older allocated state, from a lagging watch,
    /// does not).
    pub fn claim_seen(&self, claim: &ClaimView) {
        let mut written = self.written.lock().unwrap();
        if let Some((_, devices)) = written.get(claim.uid()) {
            let held: HashSet<DeviceId> = claim.held_devices().collect();
            if claim.is_allocated() && devices.iter().all(|d| held.contains(d)) {
                written.remove(claim.uid());
            }
        }
    }

    /// The claim as just read from the API server: once its version moved
    /// past the one our write was guarded by, that write either landed
    /// (and the claim shows it) or can never land.
    pub(crate) fn claim_read(&self, claim: &k8s_openapi::api::resource::v1::ResourceClaim) {
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        let mut written = self.written.lock().unwrap();
        if written
            .get(uid)
            .is_some_and(|(version, _)| claim.metadata.resource_version.as_deref() != Some(version))
        {
            written.remove(uid);
        }
    }

    /// Devices no new allocation may take: those held by `claims` (the
    /// cache and a fresh read, possibly overlapping) and those of our own
    /// writes not seen yet, except the claims being allocated.
    pub fn in_use<'a>(
        &self,
        claims: impl IntoIterator<Item = &'a ClaimView>,
        except: &HashSet<&str>,
    ) -> HashSet<DeviceId> {
        let mut used: HashSet<DeviceId> = claims
            .into_iter()
            .filter(|c| !except.contains(c.uid()))
            .flat_map(ClaimView::held_devices)
            .collect();
        for (uid, (_, devices)) in self.written.lock().unwrap().iter() {
            if !except.contains(uid.as_str()) {
                used.extend(devices.iter().cloned());
            }
        }
        used
    }

    /// Notes that the pod `key` waits for devices on `node`; returns
    /// whether `message` is news (the user has not been told this yet).
    pub fn wait(&self, key: &str, node: &str, message: &str) -> bool {
        let mut waiting = self.waiting.lock().unwrap();
        let previous = waiting.insert(
            key.to_string(),
            Waiting {
                node: node.to_string(),
                told: message.to_string(),
            },
        );
        previous.is_none_or(|p| p.told != message)
    }

    pub(crate) fn stop_waiting(&self, key: &str) {
        self.waiting.lock().unwrap().remove(key);
    }

    /// Keys of the pods waiting on `node` (`None`: on any node).
    pub(crate) fn waiting_on(&self, node: Option<&str>) -> Vec<String> {
        self.waiting
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, w)| node.is_none_or(|n| w.node == n))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(uid: &str, devices: &[(&str, bool)]) -> ClaimView {
        let results: Vec<_> = devices
            .iter()
            .map(|(d, admin)| json!({"request": "r", "driver": "gpu", "pool": "node-1", "device": d, "adminAccess": admin}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .unwrap()
    }

    fn id(device: &str) -> DeviceId {
        DeviceId {
            driver: "gpu".into(),
            pool: "node-1".into(),
            device: device.into(),
        }
    }

    #[test]
    fn in_use_counts_claims_and_unseen_writes_but_not_admin_access_or_the_claim_itself() {
        let state = Allocation::new(
            "x=y".into(),
            LabelSelector::parse("x=y").unwrap(),
            &DeviceStores::default(),
        );
        let claims = [
            claim("a", &[("gpu-0", false)]),
            claim("b", &[("gpu-1", true)]),
            claim("self", &[("gpu-2", false)]),
        ];
        state.note_written("c", "7", vec![id("gpu-3")]);
        state.note_written("self", "8", vec![id("gpu-4")]);
        let except = HashSet::from(["self"]);
        let used = state.in_use(&claims, &except);
        assert_eq!(used, HashSet::from([id("gpu-0"), id("gpu-3")]));
        // A lagging watch showing another allocation of that claim: ours
        // may still land.
        state.claim_seen(&claim("c", &[("gpu-9", false)]));
        assert!(state.in_use(&claims, &except).contains(&id("gpu-3")));
        // Seen with our devices: the cache speaks for it from now on.
        state.claim_seen(&claim("c", &[("gpu-3", false)]));
        assert_eq!(state.in_use(&claims, &except), HashSet::from([id("gpu-0")]));
    }

    #[test]
    fn a_write_is_forgotten_only_when_its_guard_can_no_longer_match() {
        let state = Allocation::new(
            "x=y".into(),
            LabelSelector::parse("x=y").unwrap(),
            &DeviceStores::default(),
        );
        state.note_written("c", "7", vec![id("gpu-3")]);
        let read = |version: &str| -> k8s_openapi::api::resource::v1::ResourceClaim {
            serde_json::from_value(
                json!({"metadata": {"name": "c", "uid": "c", "resourceVersion": version}}),
            )
            .unwrap()
        };
        // Unchanged since the guarded write was sent: it may still land.
        state.claim_read(&read("7"));
        assert!(state.in_use(&[], &HashSet::new()).contains(&id("gpu-3")));
        state.claim_read(&read("9"));
        assert!(state.in_use(&[], &HashSet::new()).is_empty());
    }

    #[test]
    fn a_failure_is_told_once_until_it_changes() {
        let state = Allocation::new(
            "x=y".into(),
            LabelSelector::parse("x=y").unwrap(),
            &DeviceStores::default(),
        );
        assert!(state.wait("ns/p", "node-1", "2 needed, 1 free"));
        assert!(!state.wait("ns/p", "node-1", "2 needed, 1 free"));
        assert!(state.wait("ns/p", "node-1", "2 needed, 0 free"));
        assert_eq!(state.waiting_on(Some("node-1")), vec!["ns/p".to_string()]);
        assert!(state.waiting_on(Some("node-2")).is_empty());
        state.stop_waiting("ns/p");
        assert!(state.waiting_on(None).is_empty());
    }
}
