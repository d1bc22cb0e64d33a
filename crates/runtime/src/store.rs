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
}
