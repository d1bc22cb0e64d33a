//! One watch serving several rooms, as kube-controller-manager's shared
//! informers do: a [`Fanout`] hands each event to several handlers that
//! keep stores of their own, a [`Mirror`] keeps one store that several
//! rooms observe, and [`WatchesSynced`] tells the rooms that read stores
//! they do not keep when the first lists are in.

use std::sync::Arc;

use tokio::sync::watch;

use super::informer::{Handler, Observer};
use super::store::Store;

/// One watch shared by several handlers, each seeing every event as though
/// the watch were its own: kube-controller-manager's shared informer, for
/// rooms that keep stores of their own (the claim controller keeps pods
/// with claims, headroom the pods that use nodes or wait for devices).
/// The object is decoded once and cloned for every handler but the last.
pub struct Fanout<'a, K> {
    handlers: Vec<(&'a dyn Handler<K>, std::sync::Mutex<Vec<K>>)>,
}

impl<'a, K> Fanout<'a, K> {
    pub fn new(handlers: Vec<&'a dyn Handler<K>>) -> Self {
        Fanout {
            handlers: handlers
                .into_iter()
                .map(|h| (h, std::sync::Mutex::default()))
                .collect(),
        }
    }

    /// Hands `obj` to each handler with `each` (a clone to all but the
    /// last).
    fn each(&self, obj: K, mut each: impl FnMut(&dyn Handler<K>, K))
    where
        K: Clone,
    {
        if let Some(((last, _), rest)) = self.handlers.split_last() {
            for (handler, _) in rest {
                each(*handler, obj.clone());
            }
            each(*last, obj);
        }
    }
}

impl<K: Clone + Send> Handler<K> for Fanout<'_, K> {
    fn list_started(&self) {
        for (handler, admitted) in &self.handlers {
            admitted.lock().unwrap().clear();
            handler.list_started();
        }
    }
    /// Each handler admits into a list of its own; the watch's list stays
    /// empty.
    fn admit(&self, obj: K) -> Option<K> {
        let mut i = 0;
        self.each(obj, |handler, obj| {
            if let Some(kept) = handler.admit(obj) {
                self.handlers[i].1.lock().unwrap().push(kept);
            }
            i += 1;
        });
        None
    }
    fn relisted(&self, _none: Vec<K>) {
        for (handler, admitted) in &self.handlers {
            let objects = std::mem::take(&mut *admitted.lock().unwrap());
            handler.relisted(objects);
        }
    }
    fn applied(&self, obj: K) {
        self.each(obj, |handler, obj| handler.applied(obj));
    }
    fn deleted(&self, obj: K) {
        self.each(obj, |handler, obj| handler.deleted(obj));
    }
}

/// Keeps a shared store in step with a watch (keyed by `key`) and tells
/// each observer after every change: the one store of a kind that several
/// rooms read (slices, classes, nodes).
pub struct Mirror<K> {
    store: Arc<Store<K>>,
    key: fn(&K) -> String,
    observers: Vec<Arc<dyn Observer<K>>>,
    /// Drops what no room reads from each object as it arrives.
    trim: fn(&mut K),
}

impl<K> Mirror<K> {
    pub fn new(
        store: Arc<Store<K>>,
        key: fn(&K) -> String,
        observers: Vec<Arc<dyn Observer<K>>>,
    ) -> Self {
        Mirror {
            store,
            key,
            observers,
            trim: |_| {},
        }
    }

    /// Each object is trimmed by `trim` before it is held, also while a
    /// list is still coming in (e.g. `metadata.managedFields`, often the
    /// larger part of a small object, which nobody reads).
    pub fn trimmed(mut self, trim: fn(&mut K)) -> Self {
        self.trim = trim;
        self
    }

    fn trim(&self, mut obj: K) -> K {
        (self.trim)(&mut obj);
        obj
    }
}

impl<K: Send + Sync> Handler<K> for Mirror<K> {
    fn admit(&self, obj: K) -> Option<K> {
        Some(self.trim(obj))
    }
    fn relisted(&self, objects: Vec<K>) {
        // Trimmed again for handlers in front of this one that admit
        // objects themselves (a version converter).
        let entries = objects
            .into_iter()
            .map(|o| self.trim(o))
            .map(|o| ((self.key)(&o), Arc::new(o)))
            .collect();
        let gone = self.store.replace(entries);
        for observer in &self.observers {
            for last in &gone {
                observer.deleted(last);
            }
            observer.relisted();
        }
    }
    fn applied(&self, obj: K) {
        let obj = Arc::new(self.trim(obj));
        let old = self.store.apply((self.key)(&obj), obj.clone());
        for observer in &self.observers {
            observer.applied(old.as_deref(), &obj);
        }
    }
    fn deleted(&self, obj: K) {
        let obj = self.trim(obj);
        let last = self.store.delete(&(self.key)(&obj));
        let last = last.as_deref().unwrap_or(&obj);
        for observer in &self.observers {
            observer.deleted(last);
        }
    }
}

/// Whether a set of watches has its first lists in, for the rooms that
/// read stores they do not keep (the process's shared watches).
#[derive(Clone, Debug, Default)]
pub struct WatchesSynced(Arc<watch::Sender<bool>>);

impl WatchesSynced {
    pub fn is_synced(&self) -> bool {
        *self.0.borrow()
    }
    pub fn set(&self) {
        self.0.send_replace(true);
    }
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }
}
