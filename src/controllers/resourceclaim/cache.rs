//! In-memory caches fed by the watches, with the secondary indexes the
//! controller looks things up by.
//!
//! A small store of our own instead of kube-runtime's reflector store: we
//! need secondary indexes (pods by claim, pods by template, claims by owner
//! UID), the "created a moment ago" overlay for claims, and control over
//! which pods are kept at all.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PodResourceClaim;

use super::views::{ClaimView, PodGroupApi, PodGroupView, PodView, TemplateView};
use crate::naming::{controller_of, controlling_pod, resolve_claim};

/// `namespace/name`.
pub fn object_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Objects whose name can be reused by a newer object: the UID tells them
/// apart.
pub trait HasUid {
    fn uid(&self) -> &str;
}

impl HasUid for PodView {
    fn uid(&self) -> &str {
        PodView::uid(self)
    }
}

impl HasUid for PodGroupView {
    fn uid(&self) -> &str {
        PodGroupView::uid(self)
    }
}

impl<K: HasUid> Store<K> {
    /// [`Store::replace`], also returning the objects a new one of the same
    /// name (another UID) replaced: gone too, as far as their UID goes.
    pub fn replace_by_uid(&self, objects: Vec<(String, Arc<K>)>) -> Vec<Arc<K>> {
        let recreated: Vec<Arc<K>> = objects
            .iter()
            .filter_map(|(key, obj)| self.get(key).filter(|old| old.uid() != obj.uid()))
            .collect();
        let mut gone = self.replace(objects);
        gone.extend(recreated);
        gone
    }

    /// Removes the object at `key` if it has `uid`, and returns it; a cached
    /// object with another UID is a newer one of that name and stays.
    pub fn delete_if_uid(&self, key: &str, uid: &str) -> Option<Arc<K>> {
        match self.get(key) {
            Some(cached) if cached.uid() == uid => self.delete(key),
            _ => None,
        }
    }
}

/// Index functions: an object maps to the index values it is found under.
pub type IndexFn<K> = fn(&K) -> Vec<String>;

/// A map of objects by `namespace/name` with secondary indexes.
pub struct Store<K> {
    inner: RwLock<StoreInner<K>>,
    index_fns: Vec<(&'static str, IndexFn<K>)>,
}

struct StoreInner<K> {
    objects: HashMap<String, Arc<K>>,
    /// index name -> index value -> object keys
    indexes: HashMap<&'static str, HashMap<String, BTreeSet<String>>>,
}

impl<K> Store<K> {
    pub fn new(index_fns: Vec<(&'static str, IndexFn<K>)>) -> Self {
        Store {
            inner: RwLock::new(StoreInner {
                objects: HashMap::new(),
                indexes: HashMap::new(),
            }),
            index_fns,
        }
    }

    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.inner.read().unwrap().objects.get(key).cloned()
    }

    pub fn len(&self) -> usize {
        self.inner.read().unwrap().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn list(&self) -> Vec<Arc<K>> {
        self.inner
            .read()
            .unwrap()
            .objects
            .values()
            .cloned()
            .collect()
    }

    pub fn by_index(&self, index: &str, value: &str) -> Vec<Arc<K>> {
        let inner = self.inner.read().unwrap();
        let Some(keys) = inner.indexes.get(index).and_then(|i| i.get(value)) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|k| inner.objects.get(k).cloned())
            .collect()
    }

    /// Inserts or replaces; returns the previous object.
    pub fn apply(&self, key: String, obj: Arc<K>) -> Option<Arc<K>> {
        let mut inner = self.inner.write().unwrap();
        let old = inner.objects.insert(key.clone(), obj.clone());
        if let Some(old) = &old {
            self.unindex(&mut inner, &key, old);
        }
        self.index(&mut inner, &key, &obj);
        old
    }

    pub fn delete(&self, key: &str) -> Option<Arc<K>> {
        // Most deletes on the pod watch are for pods that were never cached
        // (no claims): answer those under the shared lock.
        if !self.inner.read().unwrap().objects.contains_key(key) {
            return None;
        }
        let mut inner = self.inner.write().unwrap();
        let old = inner.objects.remove(key);
        if let Some(old) = &old {
            self.unindex(&mut inner, key, old);
        }
        old
    }

    /// Replaces everything (after a relist); returns the objects that are gone.
    pub fn replace(&self, objects: Vec<(String, Arc<K>)>) -> Vec<Arc<K>> {
        let mut inner = self.inner.write().unwrap();
        let mut old = std::mem::take(&mut inner.objects);
        inner.indexes.clear();
        for (key, obj) in objects {
            old.remove(&key);
            self.index(&mut inner, &key, &obj);
            inner.objects.insert(key, obj);
        }
        old.into_values().collect()
    }

    fn index(&self, inner: &mut StoreInner<K>, key: &str, obj: &K) {
        for (name, f) in &self.index_fns {
            for value in f(obj) {
                inner
                    .indexes
                    .entry(name)
                    .or_default()
                    .entry(value)
                    .or_default()
                    .insert(key.to_string());
            }
        }
    }

    fn unindex(&self, inner: &mut StoreInner<K>, key: &str, obj: &K) {
        for (name, f) in &self.index_fns {
            let Some(index) = inner.indexes.get_mut(name) else {
                continue;
            };
            for value in f(obj) {
                if let Some(keys) = index.get_mut(&value) {
                    keys.remove(key);
                    if keys.is_empty() {
                        index.remove(&value);
                    }
                }
            }
        }
    }
}

pub const PODS_BY_CLAIM: &str = "pods-by-claim";
pub const PODS_BY_TEMPLATE: &str = "pods-by-template";
pub const CLAIMS_BY_OWNER_UID: &str = "claims-by-owner-uid";
pub const PODS_BY_GROUP: &str = "pods-by-group";
pub const GROUPS_BY_TEMPLATE: &str = "groups-by-template";
pub const GROUPS_BY_CLAIM: &str = "groups-by-claim";

/// `namespace/claim` for every claim the pod resolves to, the
/// extended-resource claim included.
fn pod_claim_index(pod: &PodView) -> Vec<String> {
    let mut keys: Vec<String> = pod
        .spec
        .resource_claims
        .iter()
        .filter_map(|entry| resolve_claim(entry, &pod.status.resource_claim_statuses).name())
        .map(|name| object_key(pod.namespace(), name))
        .collect();
    if let Some(name) = pod.extended_claim_name() {
        keys.push(object_key(pod.namespace(), name));
    }
    keys.sort();
    keys.dedup();
    keys
}

/// `namespace/template` of every template the entries name, once each.
fn template_keys(namespace: &str, entries: &[PodResourceClaim]) -> Vec<String> {
    let mut keys: Vec<String> = entries
        .iter()
        .filter_map(|e| e.resource_claim_template_name.as_deref())
        .map(|t| object_key(namespace, t))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

fn pod_template_index(pod: &PodView) -> Vec<String> {
    template_keys(pod.namespace(), &pod.spec.resource_claims)
}

/// The claim's controlling pod's UID, or `podgroup:<uid>` for a
/// controlling PodGroup: adoption only ever finds claims of the right kind.
fn claim_owner_index(claim: &ClaimView) -> Vec<String> {
    if let Some((_, uid)) = controlling_pod(claim.owner_references()) {
        return vec![uid.to_string()];
    }
    controller_of(claim.owner_references())
        .filter(|o| o.kind == "PodGroup" && o.api_version.starts_with("scheduling.k8s.io/"))
        .map(|o| vec![group_owner_key(&o.uid)])
        .unwrap_or_default()
}

fn group_owner_key(uid: &str) -> String {
    format!("podgroup:{uid}")
}

/// `namespace/group` of the PodGroup a pod belongs to.
fn pod_group_index(pod: &PodView) -> Vec<String> {
    pod.pod_group_name()
        .map(|g| vec![object_key(pod.namespace(), g)])
        .unwrap_or_default()
}

fn group_template_index(group: &PodGroupView) -> Vec<String> {
    template_keys(group.namespace(), &group.spec.resource_claims)
}

/// Every claim a PodGroup names: directly, or recorded in its status.
fn group_claim_index(group: &PodGroupView) -> Vec<String> {
    let mut keys: Vec<String> = group
        .spec
        .resource_claims
        .iter()
        .filter_map(|e| e.resource_claim_name.as_deref())
        .chain(
            group
                .status
                .resource_claim_statuses
                .iter()
                .filter_map(|s| s.resource_claim_name.as_deref()),
        )
        .map(|c| object_key(group.namespace(), c))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// How long a claim created by this process is remembered while the watch
/// has not delivered it. The watch normally catches up within a second.
const CREATED_CLAIM_TTL: Duration = Duration::from_secs(600);

/// The three caches plus what the controller remembers beyond them.
pub struct Caches {
    pub pods: Store<PodView>,
    pub claims: Store<ClaimView>,
    pub templates: Store<TemplateView>,
    /// PodGroups, with DRAWorkloadResourceClaims on (empty otherwise).
    pub pod_groups: Store<PodGroupView>,
    /// UIDs of PodGroups seen deleted recently.
    pub deleted_pod_groups: RecentSet<String>,
    /// The PodGroup API served, when DRAWorkloadResourceClaims is on.
    pod_group_api: Option<PodGroupApi>,
    /// Claims this process created that the claim watch has not shown yet.
    created: Mutex<HashMap<String, (Arc<ClaimView>, Instant)>>,
    /// UIDs of pods seen deleted recently.
    pub deleted_pods: RecentSet<String>,
    /// (pod UID, entry) whose last create failed in a way that may have
    /// committed it anyway (5xx, timeout, lost connection).
    uncertain_creates: RecentSet<(String, String)>,
    /// (pod UID, entry) of pods on a node whose missing recorded claim the
    /// user was told about (once is enough).
    missing_reported: RecentSet<(String, String)>,
    /// Every watch has loaded its first list: absence from a cache now
    /// means absence from the cluster (what scrape-time gauges rely on).
    synced: AtomicBool,
    /// The allocator for declared nodes, with `--allocate-on-nodes` only.
    pub allocation: Option<Arc<super::allocation::Allocation>>,
}

impl Default for Caches {
    fn default() -> Self {
        Self::new()
    }
}

impl Caches {
    pub fn new() -> Self {
        Caches {
            pods: Store::new(vec![
                (PODS_BY_CLAIM, pod_claim_index as IndexFn<PodView>),
                (PODS_BY_TEMPLATE, pod_template_index),
                (PODS_BY_GROUP, pod_group_index),
            ]),
            claims: Store::new(vec![(
                CLAIMS_BY_OWNER_UID,
                claim_owner_index as IndexFn<ClaimView>,
            )]),
            templates: Store::new(Vec::new()),
            pod_groups: Store::new(vec![
                (
                    GROUPS_BY_TEMPLATE,
                    group_template_index as IndexFn<PodGroupView>,
                ),
                (GROUPS_BY_CLAIM, group_claim_index),
            ]),
            deleted_pod_groups: RecentSet::new(500),
            pod_group_api: None,
            created: Mutex::new(HashMap::new()),
            deleted_pods: RecentSet::new(500),
            uncertain_creates: RecentSet::new(10_000),
            missing_reported: RecentSet::new(10_000),
            synced: AtomicBool::new(false),
            allocation: None,
        }
    }

    /// Caches for a controller that serves PodGroups at `api`.
    /// With the allocator for the nodes `node_selector` selects.
    pub fn allocating_on(mut self, node_selector: String) -> Self {
        self.allocation = Some(Arc::new(super::allocation::Allocation::new(node_selector)));
        self
    }

    pub fn with_pod_groups(api: PodGroupApi) -> Self {
        Caches {
            pod_group_api: Some(api),
            ..Caches::new()
        }
    }

    /// Whether PodGroup claims are served (DRAWorkloadResourceClaims).
    pub fn pod_groups_enabled(&self) -> bool {
        self.pod_group_api.is_some()
    }

    pub fn pod_group_api(&self) -> Option<&PodGroupApi> {
        self.pod_group_api.as_ref()
    }

    /// The cached PodGroup a pod belongs to, when PodGroups are served and
    /// the pod names one: `Some(Err(name))` when it is not cached.
    pub fn pod_group_of(&self, pod: &PodView) -> Option<Result<Arc<PodGroupView>, String>> {
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

    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
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
    pub fn claims_owned_by_group(&self, uid: &str) -> Vec<Arc<ClaimView>> {
        self.claims_owned_by(&group_owner_key(uid))
    }

    /// Notes that a create for this pod entry may have committed although it
    /// failed; the next attempt asks the API server before creating again.
    pub fn mark_uncertain_create(&self, pod_uid: &str, entry: &str) {
        // Bounded: a flood of failures must not grow memory without limit;
        // the oldest marks go first, and forgetting one only costs the
        // extra check it would have caused.
        self.uncertain_creates
            .add((pod_uid.to_string(), entry.to_string()));
    }

    /// Takes the "uncertain" mark of a pod entry, if it has one.
    pub fn take_uncertain_create(&self, pod_uid: &str, entry: &str) -> bool {
        self.uncertain_creates
            .remove(&(pod_uid.to_string(), entry.to_string()))
    }

    /// Whether the user was told that this pod entry's claim is missing.
    pub fn missing_claim_reported(&self, pod_uid: &str, entry: &str) -> bool {
        self.missing_reported
            .contains(&(pod_uid.to_string(), entry.to_string()))
    }

    pub fn note_missing_claim_reported(&self, pod_uid: &str, entry: &str) {
        self.missing_reported
            .add((pod_uid.to_string(), entry.to_string()));
    }

    /// Remembers a claim this process created, until the watch shows it.
    pub fn remember_created(&self, claim: ClaimView) {
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
    pub fn forget_created(&self, key: &str) {
        self.created.lock().unwrap().remove(key);
    }

    pub fn created_len(&self) -> usize {
        self.created.lock().unwrap().len()
    }
}

/// A bounded set that forgets the oldest entries first: memory stays flat
/// however many entries arrive, and recent ones are never the ones lost.
pub struct RecentSet<T> {
    inner: Mutex<RecentInner<T>>,
    capacity: usize,
}

struct RecentInner<T> {
    /// Entry → the generation it was last added with.
    members: HashMap<T, u64>,
    /// Insertion order; an item whose generation no longer matches
    /// `members` was removed or re-added since, and is skipped.
    order: VecDeque<(T, u64)>,
    next: u64,
}

impl<T: Clone + Eq + std::hash::Hash> RecentSet<T> {
    pub fn new(capacity: usize) -> Self {
        RecentSet {
            inner: Mutex::new(RecentInner {
                members: HashMap::new(),
                order: VecDeque::new(),
                next: 0,
            }),
            capacity,
        }
    }

    pub fn add(&self, item: T) {
        let mut guard = self.inner.lock().unwrap();
        let inner = &mut *guard;
        if inner.members.contains_key(&item) {
            return;
        }
        let generation = inner.next;
        inner.next += 1;
        inner.members.insert(item.clone(), generation);
        inner.order.push_back((item, generation));
        while inner.members.len() > self.capacity {
            let Some((oldest, generation)) = inner.order.pop_front() else {
                break;
            };
            if inner.members.get(&oldest) == Some(&generation) {
                inner.members.remove(&oldest);
            }
        }
        // Removed entries leave stale slots behind; drop them before the
        // queue outgrows the set by much.
        if inner.order.len() > 2 * self.capacity.max(1) {
            let RecentInner { members, order, .. } = inner;
            order.retain(|(item, generation)| members.get(item) == Some(generation));
        }
    }

    pub fn contains(&self, item: &T) -> bool {
        self.inner.lock().unwrap().members.contains_key(item)
    }

    /// Removes the item; returns whether it was there.
    pub fn remove(&self, item: &T) -> bool {
        self.inner.lock().unwrap().members.remove(item).is_some()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn recent_set_forgets_oldest() {
        let set = RecentSet::new(2);
        set.add("a");
        set.add("b");
        set.add("a");
        set.add("c");
        assert!(!set.contains(&"a") && set.contains(&"b") && set.contains(&"c"));
    }

    #[test]
    fn recent_set_keeps_recent_entries_under_churn() {
        let set = RecentSet::new(100);
        for i in 0..10_000 {
            set.add(i);
            if i % 3 == 0 {
                assert!(set.remove(&i));
            }
        }
        // The last add (9999) made room by evicting the oldest, then went.
        assert_eq!(set.len(), 99);
        // The newest survivors are all there; the oldest are gone.
        assert!(
            (9_851..10_000)
                .filter(|i| i % 3 != 0)
                .all(|i| set.contains(&i))
        );
        assert!(!set.contains(&9_850) && !set.contains(&1));
        // A removed entry added again counts as new.
        set.add(9_999);
        assert!(set.contains(&9_999) && set.len() == 100);
        let stale = set.inner.lock().unwrap().order.len();
        assert!(stale <= 200, "order queue bounded: {stale}");
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
