//! The watches of pods, ResourceClaims, ResourceClaimTemplates and
//! PodGroups: one each for the process, each keeping one store with the
//! indexes the rooms ask by (`model::indexes`), each change told to the
//! rooms observing the kind once the store holds it.
//!
//! The pod store keeps only pods with claims, each with its history
//! (`pod_history.rs`); rooms that keep other pods (headroom's placeholders
//! and the pods using nodes) see every pod event as handlers of the same
//! watch. A pod is gone on its delete event, on its absence from a relist,
//! or when a pod with another UID takes its name: observers are told of
//! the old pod's deletion then, before the new one is stored.

use std::sync::Arc;
use std::time::Instant;

use kube::Api;
use tracing::info;

use super::pod_history::observe;
use crate::model::indexes::{
    CLAIMS_BY_OWNER_UID, GROUPS_BY_CLAIM, GROUPS_BY_TEMPLATE, PODS_BY_CLAIM, PODS_BY_GROUP,
    PODS_BY_TEMPLATE, PODS_WAITING, claim_owner_index, group_claim_index, group_template_index,
    pod_claim_index, pod_group_index, pod_template_index, pod_waiting_index,
};
use crate::model::views::{ClaimView, PodGroupApi, PodGroupView, PodView, TemplateView};
use crate::runtime::informer::{Handler, Informer, Observer};
use crate::runtime::shared::{Fanout, Mirror, WatchesSynced};
use crate::runtime::store::{HasUid, IndexFn, Store, object_key};

/// The stores of the four kinds, indexed for every room's questions.
#[derive(Clone)]
pub struct ClaimStores {
    /// Pods with claims (or a device request the scheduler turned into
    /// one), with their history.
    pub pods: Arc<Store<PodView>>,
    pub claims: Arc<Store<ClaimView>>,
    pub templates: Arc<Store<TemplateView>>,
    /// Empty unless PodGroups are read.
    pub pod_groups: Arc<Store<PodGroupView>>,
}

impl Default for ClaimStores {
    fn default() -> Self {
        ClaimStores {
            pods: Arc::new(Store::new(vec![
                (PODS_BY_CLAIM, pod_claim_index as IndexFn<PodView>),
                (PODS_BY_TEMPLATE, pod_template_index),
                (PODS_BY_GROUP, pod_group_index),
                (PODS_WAITING, pod_waiting_index),
            ])),
            claims: Arc::new(Store::new(vec![(
                CLAIMS_BY_OWNER_UID,
                claim_owner_index as IndexFn<ClaimView>,
            )])),
            templates: Arc::new(Store::new(Vec::new())),
            pod_groups: Arc::new(Store::new(vec![
                (
                    GROUPS_BY_TEMPLATE,
                    group_template_index as IndexFn<PodGroupView>,
                ),
                (GROUPS_BY_CLAIM, group_claim_index),
            ])),
        }
    }
}

/// Who observes each kind, in the order they are told.
#[derive(Default)]
pub struct ClaimObservers {
    pub pods: Vec<Arc<dyn Observer<PodView>>>,
    pub claims: Vec<Arc<dyn Observer<ClaimView>>>,
    pub templates: Vec<Arc<dyn Observer<TemplateView>>>,
    pub pod_groups: Vec<Arc<dyn Observer<PodGroupView>>>,
    /// Rooms that keep pod stores of their own: every pod event, after the
    /// shared store's keeper.
    pub pod_handlers: Vec<Arc<dyn Handler<PodView>>>,
}

pub struct ClaimWatches {
    stores: ClaimStores,
    /// Where PodGroups are read (`None`: they are not).
    pod_group_api: Option<PodGroupApi>,
    pods: Informer,
    claims: Informer,
    templates: Informer,
    pod_groups: Informer,
    synced: WatchesSynced,
}

impl ClaimWatches {
    pub fn new(pod_group_api: Option<PodGroupApi>) -> Self {
        ClaimWatches {
            stores: ClaimStores::default(),
            pod_group_api,
            pods: Informer::new("pods"),
            claims: Informer::new("resourceclaims"),
            templates: Informer::new("resourceclaimtemplates"),
            pod_groups: Informer::new("podgroups"),
            synced: WatchesSynced::default(),
        }
    }

    pub fn stores(&self) -> &ClaimStores {
        &self.stores
    }

    pub fn pod_group_api(&self) -> Option<&PodGroupApi> {
        self.pod_group_api.as_ref()
    }

    /// Set once the first list of every watch is in: absence from a store
    /// then means absence from the cluster.
    pub fn synced(&self) -> &WatchesSynced {
        &self.synced
    }

    /// Resolves once the first list of every watch is in.
    pub async fn wait_synced(&self) {
        self.pods.wait_synced().await;
        self.claims.wait_synced().await;
        self.templates.wait_synced().await;
        if self.pod_group_api.is_some() {
            self.pod_groups.wait_synced().await;
        }
        self.synced.set();
    }

    /// Runs the watches until the process ends.
    pub async fn run(&self, client: kube::Client, observers: ClaimObservers) {
        let pod_keeper = PodKeeper {
            store: &self.stores.pods,
            observers: &observers.pods,
        };
        let mut pod_handlers: Vec<&dyn Handler<PodView>> = vec![&pod_keeper];
        pod_handlers.extend(observers.pod_handlers.iter().map(|h| &**h));
        let pods = Fanout::new(pod_handlers);
        let claims = Keeper {
            store: &self.stores.claims,
            observers: &observers.claims,
            key: |c: &ClaimView| object_key(c.namespace(), c.name()),
            by_uid: false,
            loaded: |claims| info!(claims, "claim cache loaded"),
        };
        let templates = Mirror::new(
            self.stores.templates.clone(),
            |t: &TemplateView| object_key(t.namespace(), t.name()),
            observers.templates,
        );
        let groups = Keeper {
            store: &self.stores.pod_groups,
            observers: &observers.pod_groups,
            key: |g: &PodGroupView| object_key(g.namespace(), g.name()),
            by_uid: true,
            loaded: |podgroups| info!(podgroups, "PodGroup cache loaded"),
        };
        let run_groups = async {
            if let Some(api) = &self.pod_group_api {
                self.pod_groups
                    .run(Api::<PodGroupView>::all_with(client.clone(), api), &groups)
                    .await
            }
        };
        tokio::join!(
            self.pods
                .run_protobuf(Api::<PodView>::all(client.clone()), &pods),
            self.claims
                .run(Api::<ClaimView>::all(client.clone()), &claims),
            self.templates
                .run(Api::<TemplateView>::all(client.clone()), &templates),
            run_groups,
        );
    }
}

/// Keeps the pod store: admits only pods with claims, carrying each pod's
/// history over from the stored version (`pod_history::observe`).
struct PodKeeper<'a> {
    store: &'a Store<PodView>,
    observers: &'a [Arc<dyn Observer<PodView>>],
}

impl PodKeeper<'_> {
    fn tell_deleted(&self, last: &PodView) {
        for observer in self.observers {
            observer.deleted(last);
        }
    }
}

fn pod_key(pod: &PodView) -> String {
    object_key(pod.namespace(), pod.name())
}

impl Handler<PodView> for PodKeeper<'_> {
    fn admit(&self, pod: PodView) -> Option<PodView> {
        // The store still holds the previous list: the history of a pod
        // carries over into the new one.
        let stored = self.store.get(&pod_key(&pod));
        observe(stored.as_deref(), pod, Instant::now()).keep
    }

    fn relisted(&self, pods: Vec<PodView>) {
        let entries = pods
            .into_iter()
            .map(|p| (pod_key(&p), Arc::new(p)))
            .collect();
        // Absent from the list, or recreated under the same name: deleted
        // while the watch was down.
        let gone = self.store.replace_by_uid(entries);
        for observer in self.observers {
            for last in &gone {
                observer.deleted(last);
            }
            observer.relisted();
        }
        info!(
            pods = self.store.len(),
            "pod cache loaded (pods with claims only)"
        );
    }

    fn applied(&self, pod: PodView) {
        let key = pod_key(&pod);
        let stored = self.store.get(&key);
        let seen = observe(stored.as_deref(), pod, Instant::now());
        if seen.replaced
            && let Some(old) = &stored
        {
            self.tell_deleted(old);
        }
        match seen.keep {
            Some(pod) => {
                let pod = Arc::new(pod);
                let old = self.store.apply(key, pod.clone());
                for observer in self.observers {
                    observer.applied(old.as_deref(), &pod);
                }
            }
            // Replaced under the same name by a pod without claims.
            None if seen.replaced => {
                self.store.delete(&key);
            }
            None => {}
        }
    }

    fn deleted(&self, pod: PodView) {
        // The stored version may name claims the deleted one no longer
        // lists (see `pod_history::observe`).
        let pod = self
            .store
            .delete_if_uid(&pod_key(&pod), pod.uid())
            .unwrap_or_else(|| Arc::new(pod));
        if pod.is_relevant() {
            self.tell_deleted(&pod);
        }
    }
}

/// Keeps the store of claims or PodGroups: every object as it comes. With
/// `by_uid`, an object recreated under the same name while the watch was
/// down is reported deleted at the relist, and a late delete of an older
/// object leaves the newer one.
struct Keeper<'a, K> {
    store: &'a Store<K>,
    observers: &'a [Arc<dyn Observer<K>>],
    key: fn(&K) -> String,
    by_uid: bool,
    loaded: fn(usize),
}

impl<K: HasUid + Send + Sync> Handler<K> for Keeper<'_, K> {
    fn relisted(&self, objects: Vec<K>) {
        let entries = objects
            .into_iter()
            .map(|o| ((self.key)(&o), Arc::new(o)))
            .collect();
        let gone = if self.by_uid {
            self.store.replace_by_uid(entries)
        } else {
            self.store.replace(entries)
        };
        for observer in self.observers {
            for last in &gone {
                observer.deleted(last);
            }
            observer.relisted();
        }
        (self.loaded)(self.store.len());
    }

    fn applied(&self, obj: K) {
        let obj = Arc::new(obj);
        let old = self.store.apply((self.key)(&obj), obj.clone());
        for observer in self.observers {
            observer.applied(old.as_deref(), &obj);
        }
    }

    fn deleted(&self, obj: K) {
        let key = (self.key)(&obj);
        let last = if self.by_uid {
            self.store
                .delete_if_uid(&key, obj.uid())
                .unwrap_or_else(|| Arc::new(obj))
        } else {
            self.store.delete(&key);
            Arc::new(obj)
        };
        for observer in self.observers {
            observer.deleted(&last);
        }
    }
}
