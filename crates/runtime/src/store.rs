//! The indexed store the watches feed, and a bounded set of recently seen
//! items: generic, keyed by `namespace/name` (or by name for cluster-scoped
//! objects), with secondary indexes computed by plain functions.
//!
//! A small store of our own instead of kube-runtime's reflector store: the
//! controllers need secondary indexes (pods by claim, claims by owner UID),
//! replacement that reports what went away, and control over what is kept.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};

/// `namespace/name`.
pub fn object_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Objects whose name can be reused by a newer object: the UID tells them
/// apart.
pub trait HasUid {
    fn uid(&self) -> &str;
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

    /// How many objects the index files under `value`.
    pub fn index_len(&self, index: &str, value: &str) -> usize {
        let inner = self.inner.read().unwrap();
        inner
            .indexes
            .get(index)
            .and_then(|i| i.get(value))
            .map_or(0, |keys| keys.len())
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

/// A bounded set that forgets the oldest entries first: memory stays flat
/// however many entries arrive, and recent ones are never the ones lost.
pub struct RecentSet<T> {
    map: RecentMap<T, ()>,
}

impl<T: Clone + Eq + std::hash::Hash> RecentSet<T> {
    pub fn new(capacity: usize) -> Self {
        RecentSet {
            map: RecentMap::new(capacity),
        }
    }

    /// Adds the item; one already there keeps its place in line.
    pub fn add(&self, item: T) {
        self.map.insert_with(item, (), false);
    }

    pub fn contains(&self, item: &T) -> bool {
        self.map.get(item).is_some()
    }

    /// Removes the item; returns whether it was there.
    pub fn remove(&self, item: &T) -> bool {
        self.map.remove(item).is_some()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A bounded map that forgets the oldest entries first, as [`RecentSet`].
pub struct RecentMap<K, V> {
    inner: Mutex<RecentInner<K, V>>,
    capacity: usize,
}

struct RecentInner<K, V> {
    /// Key → its value and the generation it was last inserted with.
    members: HashMap<K, (V, u64)>,
    /// Insertion order; a key whose generation no longer matches
    /// `members` was removed or inserted again since, and is skipped.
    order: VecDeque<(K, u64)>,
    next: u64,
}

impl<K: Clone + Eq + std::hash::Hash, V: Clone> RecentMap<K, V> {
    pub fn new(capacity: usize) -> Self {
        RecentMap {
            inner: Mutex::new(RecentInner {
                members: HashMap::new(),
                order: VecDeque::new(),
                next: 0,
            }),
            capacity,
        }
    }

    /// Inserts or replaces the value; the key becomes the newest.
    pub fn insert(&self, key: K, value: V) {
        self.insert_with(key, value, true);
    }

    fn insert_with(&self, key: K, value: V, replace: bool) {
        let mut guard = self.inner.lock().unwrap();
        let inner = &mut *guard;
        if !replace && inner.members.contains_key(&key) {
            return;
        }
        let generation = inner.next;
        inner.next += 1;
        inner.members.insert(key.clone(), (value, generation));
        inner.order.push_back((key, generation));
        while inner.members.len() > self.capacity {
            let Some((oldest, generation)) = inner.order.pop_front() else {
                break;
            };
            if inner.members.get(&oldest).map(|(_, g)| *g) == Some(generation) {
                inner.members.remove(&oldest);
            }
        }
        // Removed or replaced entries leave stale slots behind; drop them
        // before the queue outgrows the map by much.
        if inner.order.len() > 2 * self.capacity.max(1) {
            let RecentInner { members, order, .. } = inner;
            order
                .retain(|(key, generation)| members.get(key).map(|(_, g)| *g) == Some(*generation));
        }
    }

    pub fn get(&self, key: &K) -> Option<V> {
        let inner = self.inner.lock().unwrap();
        inner.members.get(key).map(|(v, _)| v.clone())
    }

    /// Removes the key; returns its value when it was there.
    pub fn remove(&self, key: &K) -> Option<V> {
        let mut inner = self.inner.lock().unwrap();
        inner.members.remove(key).map(|(v, _)| v)
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
        let stale = set.map.inner.lock().unwrap().order.len();
        assert!(stale <= 200, "order queue bounded: {stale}");
    }

    #[test]
    fn recent_map_replaces_values_and_stays_bounded() {
        let map = RecentMap::new(2);
        map.insert("a", 1);
        map.insert("b", 2);
        // Replacing makes "a" the newest: "b" is the one forgotten next.
        map.insert("a", 3);
        map.insert("c", 4);
        assert_eq!(
            (map.get(&"a"), map.get(&"b"), map.get(&"c")),
            (Some(3), None, Some(4))
        );
        for i in 0..1_000 {
            map.insert("a", i);
        }
        assert_eq!(map.len(), 2);
        let stale = map.inner.lock().unwrap().order.len();
        assert!(stale <= 4, "order queue bounded: {stale}");
    }
}
