//! The claim controller's caches: the process's stores it reads (pods,
//! claims, templates, PodGroups, indexed as `model::indexes` says, kept by
//! `watches::claims`), and what it remembers beyond them (claims it created
//! a moment ago, recently deleted pods, creates whose outcome is
//! uncertain).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::model::indexes::{
    CLAIMS_BY_OWNER_UID, PODS_WAITING, WAITING, claim_owner_index, group_owner_key,
};
use crate::model::selector::LabelSelector;
use crate::model::views::{ClaimView, NodeView, PodGroupApi, PodGroupView, PodView, TemplateView};
use crate::runtime::shared::WatchesSynced;
use crate::runtime::store::{RecentMap, RecentSet, Store, object_key};
use crate::watches::claims::{ClaimStores, ClaimWatches};

/// How long a claim created by this process is remembered while the watch
/// has not delivered it. The watch normally catches up within a second.
const CREATED_CLAIM_TTL: Duration = Duration::from_secs(600);

/// The process's stores plus what the controller remembers beyond them.
pub struct Caches {
    pub pods: Arc<Store<PodView>>,
    pub claims: Arc<Store<ClaimView>>,
    pub templates: Arc<Store<TemplateView>>,
    /// PodGroups, with DRAWorkloadResourceClaims on (empty otherwise).
    pub pod_groups: Arc<Store<PodGroupView>>,
    /// UIDs of PodGroups seen deleted recently.
    pub deleted_pod_groups: RecentSet<String>,
    /// The PodGroup API served, when DRAWorkloadResourceClaims is on.
    pod_group_api: Option<PodGroupApi>,
    /// PodGroups get claims of their own (DRAWorkloadResourceClaims); when
    /// off, PodGroups may still be read (1.37, GenericWorkload).
    group_claims: bool,
    /// Claims this process created that the claim watch has not shown yet.
    created: Mutex<HashMap<String, (Arc<ClaimView>, Instant)>>,
    /// UIDs of pods seen deleted recently.
    pub deleted_pods: RecentSet<String>,
    /// The UID of the pod last seen deleted under each name, recently: a
    /// pod created under that name replaces it.
    deleted_pod_uids: RecentMap<String, String>,
    /// (pod UID, entry) whose last create failed in a way that may have
    /// committed it anyway (5xx, timeout, lost connection).
    uncertain_creates: RecentSet<(String, String)>,
    /// (pod UID, entry) of pods on a node whose missing recorded claim the
    /// user was told about (once is enough).
    missing_reported: RecentSet<(String, String)>,
    /// Every watch has loaded its first list: absence from a cache now
    /// means absence from the cluster (what scrape-time gauges rely on).
    synced: WatchesSynced,
    /// The nodes whose pre-scheduled pods' claims another part of the
    /// process allocates (`--allocate-on-nodes`): nobody needs to be told
    /// that nothing will.
    allocator_nodes: Option<DeclaredNodes>,
}

/// The nodes of `--allocate-on-nodes`: those of the process's node store
/// that the selector matches.
pub struct DeclaredNodes {
    pub selector: LabelSelector,
    pub nodes: Arc<Store<NodeView>>,
}

impl DeclaredNodes {
    fn declares(&self, node: &str) -> bool {
        self.nodes
            .get(node)
            .is_some_and(|n| self.selector.matches(n.labels()))
    }
}

impl Default for Caches {
    fn default() -> Self {
        Self::new()
    }
}

impl Caches {
    /// Caches of stores of their own (tests and tools).
    pub fn new() -> Self {
        Self::of(&ClaimStores::default(), WatchesSynced::default())
    }

    /// The claim controller's view of the process's claim watches, serving
    /// PodGroup claims when `group_claims`.
    pub(crate) fn on(watches: &ClaimWatches, group_claims: bool) -> Self {
        Caches {
            pod_group_api: watches.pod_group_api().cloned(),
            group_claims,
            ..Self::of(watches.stores(), watches.synced().clone())
        }
    }

    fn of(stores: &ClaimStores, synced: WatchesSynced) -> Self {
        Caches {
            pods: stores.pods.clone(),
            claims: stores.claims.clone(),
            templates: stores.templates.clone(),
            pod_groups: stores.pod_groups.clone(),
            deleted_pod_groups: RecentSet::new(500),
            pod_group_api: None,
            group_claims: false,
            created: Mutex::new(HashMap::new()),
            deleted_pods: RecentSet::new(500),
            deleted_pod_uids: RecentMap::new(500),
            uncertain_creates: RecentSet::new(10_000),
            missing_reported: RecentSet::new(10_000),
            synced,
            allocator_nodes: None,
        }
    }

    /// Whether a cached pod waits to be scheduled (not done, not being
    /// deleted, on no node yet): then releasing devices is on a pod's path
    /// to start, and claim cleanup is start-up work at the client's budget.
    pub(crate) fn pods_wait_to_start(&self) -> bool {
        self.pods.index_len(PODS_WAITING, WAITING) > 0
    }

    /// Caches that know the nodes whose claims the allocator allocates.
    pub(crate) fn with_allocator_nodes(mut self, nodes: DeclaredNodes) -> Self {
        self.allocator_nodes = Some(nodes);
        self
    }

    /// Whether the allocator for declared nodes will allocate `claim` for a
    /// pod pre-scheduled onto `node` (it takes no claim being deleted).
    pub(crate) fn allocated_elsewhere(&self, node: &str, claim: &ClaimView) -> bool {
        !claim.is_deleting()
            && self
                .allocator_nodes
                .as_ref()
                .is_some_and(|declared| declared.declares(node))
    }

    /// Caches that serve PodGroup claims, PodGroups read at `api`.
    #[cfg(test)]
    pub(crate) fn with_pod_groups(api: PodGroupApi) -> Self {
        Caches {
            pod_group_api: Some(api),
            group_claims: true,
            ..Caches::new()
        }
    }

    /// Whether PodGroups are watched and cached.
    pub(crate) fn pod_groups_enabled(&self) -> bool {
        self.pod_group_api.is_some()
    }

    /// Whether PodGroup claims are served (DRAWorkloadResourceClaims).
    pub(crate) fn group_claims_enabled(&self) -> bool {
        self.group_claims
    }

    pub(crate) fn pod_group_api(&self) -> Option<&PodGroupApi> {
        self.pod_group_api.as_ref()
    }

    /// The cached PodGroup a pod belongs to, when PodGroups are served and
    /// the pod names one: `Some(Err(name))` when it is not cached.
    pub(crate) fn pod_group_of(&self, pod: &PodView) -> Option<Result<Arc<PodGroupView>, String>> {
        if !self.pod_groups_enabled() {
            return None;
        }
        let name = pod.pod_group_name()?;
        Some(
            self.pod_groups
                .get(&object_key(pod.namespace(), name))
                .ok_or_else(|| name.to_string()),
        )
    }

    #[cfg(test)]
    pub(crate) fn mark_synced(&self) {
        self.synced.set();
    }

    pub fn is_synced(&self) -> bool {
        self.synced.is_synced()
    }

    /// A claim by name: the watch's view first, else one we just created.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<Arc<ClaimView>> {
        let key = object_key(namespace, name);
        self.claims.get(&key).or_else(|| {
            let created = self.created.lock().unwrap();
            created
                .get(&key)
                .filter(|(_, at)| at.elapsed() < CREATED_CLAIM_TTL)
                .map(|(c, _)| c.clone())
        })
    }

    /// Remembers a pod seen deleted, by UID and by name.
    pub(crate) fn note_pod_deleted(&self, namespace: &str, name: &str, uid: &str) {
        self.deleted_pods.add(uid.to_string());
        self.deleted_pod_uids
            .insert(object_key(namespace, name), uid.to_string());
    }

    /// The UID of the pod recently seen deleted under this name.
    pub(crate) fn deleted_pod_uid(&self, namespace: &str, name: &str) -> Option<String> {
        self.deleted_pod_uids.get(&object_key(namespace, name))
    }

    /// Claims controlled by the pod with `uid`, including ones just created.
    pub fn claims_owned_by(&self, uid: &str) -> Vec<Arc<ClaimView>> {
        let mut claims = self.claims.by_index(CLAIMS_BY_OWNER_UID, uid);
        let created = self.created.lock().unwrap();
        let fresh = created
            .iter()
            .filter(|(_, (_, at))| at.elapsed() < CREATED_CLAIM_TTL);
        for (key, (claim, _)) in fresh {
            let seen = claims
                .iter()
                .any(|c| object_key(c.namespace(), c.name()) == *key);
            if !seen && claim_owner_index(claim).iter().any(|u| u == uid) {
                claims.push(claim.clone());
            }
        }
        claims
    }

    /// Claims a PodGroup with this UID controls (the cache's and those
    /// created a moment ago).
    pub(crate) fn claims_owned_by_group(&self, namespace: &str, uid: &str) -> Vec<Arc<ClaimView>> {
        self.claims_owned_by(&group_owner_key(namespace, uid))
    }

    /// Notes that a create for this pod entry may have committed although it
    /// failed; the next attempt asks the API server before creating again.
    pub(crate) fn mark_uncertain_create(&self, pod_uid: &str, entry: &str) {
        // Bounded: a flood of failures must not grow memory without limit;
        // the oldest marks go first, and forgetting one only costs the
        // extra check it would have caused.
        self.uncertain_creates
            .add((pod_uid.to_string(), entry.to_string()));
    }

    /// Takes the "uncertain" mark of a pod entry, if it has one.
    pub(crate) fn take_uncertain_create(&self, pod_uid: &str, entry: &str) -> bool {
        self.uncertain_creates
            .remove(&(pod_uid.to_string(), entry.to_string()))
    }

    /// Whether the user was told that this pod entry's claim is missing.
    pub(crate) fn missing_claim_reported(&self, pod_uid: &str, entry: &str) -> bool {
        self.missing_reported
            .contains(&(pod_uid.to_string(), entry.to_string()))
    }

    pub(crate) fn note_missing_claim_reported(&self, pod_uid: &str, entry: &str) {
        self.missing_reported
            .add((pod_uid.to_string(), entry.to_string()));
    }

    /// Remembers a claim this process created, until the watch shows it.
    pub(crate) fn remember_created(&self, claim: ClaimView) {
        let key = object_key(claim.namespace(), claim.name());
        if self.claims.get(&key).is_some() {
            return;
        }
        let now = Instant::now();
        let mut created = self.created.lock().unwrap();
        created.retain(|_, (_, at)| now.duration_since(*at) < CREATED_CLAIM_TTL);
        created.insert(key, (Arc::new(claim), now));
    }

    /// The watch delivered (or deleted) this claim: the overlay is no longer needed.
    pub(crate) fn forget_created(&self, key: &str) {
        self.created.lock().unwrap().remove(key);
    }

    #[cfg(test)]
    pub(crate) fn created_len(&self) -> usize {
        self.created.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::indexes::{PODS_BY_CLAIM, PODS_BY_TEMPLATE, pod_template_index};
    use serde_json::json;

    #[test]
    fn uid_tells_a_recreated_object_from_the_cached_one() {
        let store: Store<PodView> = Store::new(Vec::new());
        store.apply("ns/a".into(), Arc::new(pod("a", "uid-1", None)));
        store.apply("ns/b".into(), Arc::new(pod("b", "uid-2", None)));
        // Relisted: a is back under another UID, b is gone.
        let gone = store.replace_by_uid(vec![("ns/a".into(), Arc::new(pod("a", "uid-3", None)))]);
        let mut uids: Vec<&str> = gone.iter().map(|p| p.uid()).collect();
        uids.sort();
        assert_eq!(uids, ["uid-1", "uid-2"]);
        // A late delete of the old a leaves the new one.
        assert!(store.delete_if_uid("ns/a", "uid-1").is_none());
        assert_eq!(store.get("ns/a").unwrap().uid(), "uid-3");
        assert_eq!(store.delete_if_uid("ns/a", "uid-3").unwrap().uid(), "uid-3");
        assert!(store.is_empty());
    }

    fn pod(name: &str, uid: &str, status_claim: Option<&str>) -> PodView {
        let statuses = match status_claim {
            Some(c) => json!([{"name": "gpu", "resourceClaimName": c}]),
            None => json!([]),
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tmpl"},
                                        {"name": "shared", "resourceClaimName": "shared-claim"}]},
            "status": {"resourceClaimStatuses": statuses}
        }))
        .unwrap()
    }

    fn claim(name: &str, owner_uid: &str) -> ClaimView {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner_uid, "controller": true}]}
        }))
        .unwrap()
    }

    #[test]
    fn pod_indexes_follow_updates_and_deletes() {
        let caches = Caches::new();
        caches
            .pods
            .apply("ns/p".into(), Arc::new(pod("p", "u1", None)));
        assert_eq!(
            caches.pods.by_index(PODS_BY_CLAIM, "ns/shared-claim").len(),
            1
        );
        assert_eq!(caches.pods.by_index(PODS_BY_TEMPLATE, "ns/tmpl").len(), 1);
        assert!(caches.pods.by_index(PODS_BY_CLAIM, "ns/p-gpu-1").is_empty());
        caches
            .pods
            .apply("ns/p".into(), Arc::new(pod("p", "u1", Some("p-gpu-1"))));
        assert_eq!(caches.pods.by_index(PODS_BY_CLAIM, "ns/p-gpu-1").len(), 1);
        caches.pods.delete("ns/p");
        assert!(caches.pods.by_index(PODS_BY_CLAIM, "ns/p-gpu-1").is_empty());
        assert!(caches.pods.by_index(PODS_BY_TEMPLATE, "ns/tmpl").is_empty());
    }

    #[test]
    fn replace_reports_vanished_objects() {
        let store: Store<PodView> = Store::new(vec![(PODS_BY_TEMPLATE, pod_template_index)]);
        store.apply("ns/a".into(), Arc::new(pod("a", "ua", None)));
        store.apply("ns/b".into(), Arc::new(pod("b", "ub", None)));
        let gone = store.replace(vec![("ns/b".into(), Arc::new(pod("b", "ub", None)))]);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].name(), "a");
        assert_eq!(store.by_index(PODS_BY_TEMPLATE, "ns/tmpl").len(), 1);
    }

    #[test]
    fn created_overlay_until_watch_catches_up() {
        let caches = Caches::new();
        caches.remember_created(claim("p-gpu-x", "u1"));
        assert!(caches.claim("ns", "p-gpu-x").is_some());
        assert_eq!(caches.claims_owned_by("u1").len(), 1);
        assert!(caches.claims_owned_by("u2").is_empty());
        // The watch delivers it: found once, not twice.
        caches
            .claims
            .apply("ns/p-gpu-x".into(), Arc::new(claim("p-gpu-x", "u1")));
        assert_eq!(caches.claims_owned_by("u1").len(), 1);
        caches.forget_created("ns/p-gpu-x");
        assert_eq!(caches.created_len(), 0);
        assert_eq!(caches.claims_owned_by("u1").len(), 1);
    }

    #[test]
    fn uncertain_create_marks_are_taken_once() {
        let caches = Caches::new();
        assert!(!caches.take_uncertain_create("u1", "gpu"));
        caches.mark_uncertain_create("u1", "gpu");
        assert!(!caches.take_uncertain_create("u1", "other"));
        assert!(caches.take_uncertain_create("u1", "gpu"));
        assert!(!caches.take_uncertain_create("u1", "gpu"));
    }

    #[test]
    fn created_overlay_expires_on_read() {
        let caches = Caches::new();
        caches.remember_created(claim("p-gpu-x", "u1"));
        // Age the entry past its TTL without a further create.
        for (_, at) in caches.created.lock().unwrap().values_mut() {
            *at = Instant::now() - CREATED_CLAIM_TTL - Duration::from_secs(1);
        }
        assert!(caches.claim("ns", "p-gpu-x").is_none());
        assert!(caches.claims_owned_by("u1").is_empty());
    }
}
