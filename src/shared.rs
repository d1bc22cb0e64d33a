//! What the process shares with every controller it builds, as
//! kube-controller-manager's `ControllerContext` does: the client, the
//! registry, the feature gates of the release acting, the probe of the API
//! server, the endpoints' health, and the shared watches ([`crate::watches`]).
//! A controller's `build(&Shared, &Settings)` subscribes to the kinds it
//! observes and says which device kinds it reads; `app` then runs each
//! watch once for all of them.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceSlice};

use crate::model::features::FeatureGates;
use crate::model::views::{ClaimView, NodeView, PodGroupView, PodView, TemplateView};
use crate::runtime::exposition::Exposition;
use crate::runtime::http::Health;
use crate::runtime::informer::{Handler, Observer};
use crate::runtime::optional_api::ApiStatus;
use crate::runtime::reachability::Reachability;
use crate::runtime::shared::WatchesSynced;
use crate::watches::claims::{ClaimObservers, ClaimWatches};
use crate::watches::devices::{DeviceObservers, DeviceWatches, Kinds};

/// A task a controller needs beside its workers (a watch of its own
/// optional API), started with the shared watches.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

pub struct Shared {
    pub client: kube::Client,
    pub registry: prometheus::Registry,
    /// `/metrics`, for families rendered at scrape time.
    pub exposition: Exposition,
    /// This replica's holder identity (events name it).
    pub identity: String,
    /// The gates, with the reference release acting.
    pub gates: FeatureGates,
    pub health: Health,
    pub apis: ApiStatus,
    /// Whether the API server answers; every controller holds its workers
    /// while it does not.
    pub reachability: Arc<Reachability>,
    pub claims: Arc<ClaimWatches>,
    pub devices: Arc<DeviceWatches>,
    /// Set once every shared watch has its first list in.
    pub synced: WatchesSynced,
    subscribed: Mutex<Subscriptions>,
}

/// Where the process shows itself: `/metrics` (the registry, and families
/// rendered at scrape time), `/healthz` and `/readyz`, and which optional
/// APIs are served.
#[derive(Clone)]
pub struct Endpoints {
    pub registry: prometheus::Registry,
    pub exposition: Exposition,
    pub health: Health,
    pub apis: ApiStatus,
}

/// What the controllers asked for: filled by their builds, taken once to
/// run the watches.
#[derive(Default)]
pub struct Subscriptions {
    pub claims: ClaimObservers,
    pub devices: DeviceObservers,
    /// Tasks beside the watches (a controller's watch of its own API).
    pub tasks: Vec<Task>,
    /// Stores of their own a controller fills before it may lead.
    pub synced_too: Vec<Task>,
}

impl Shared {
    pub fn new(
        client: kube::Client,
        identity: String,
        gates: FeatureGates,
        endpoints: Endpoints,
        claims: ClaimWatches,
    ) -> Self {
        Shared {
            client,
            registry: endpoints.registry,
            exposition: endpoints.exposition,
            identity,
            gates,
            health: endpoints.health,
            apis: endpoints.apis,
            reachability: Arc::new(Reachability::new()),
            claims: Arc::new(claims),
            devices: Arc::new(DeviceWatches::new()),
            synced: WatchesSynced::default(),
            subscribed: Mutex::default(),
        }
    }

    /// Whether PodGroups get claims of their own: DRAWorkloadResourceClaims
    /// on and a PodGroup API served.
    pub fn group_claims_served(&self) -> bool {
        self.gates.workload_resource_claims && self.claims.pod_group_api().is_some()
    }

    /// The device kinds a controller reads (watched only when one does).
    pub fn read_devices(&self, kinds: Kinds) {
        self.devices.read(kinds);
    }

    pub fn observe_pods(&self, observer: Arc<dyn Observer<PodView>>) {
        self.subscribed.lock().unwrap().claims.pods.push(observer);
    }

    /// Every pod event, for a controller that keeps pods of its own.
    pub fn handle_pods(&self, handler: Arc<dyn Handler<PodView>>) {
        let mut subscribed = self.subscribed.lock().unwrap();
        subscribed.claims.pod_handlers.push(handler);
    }

    pub fn observe_claims(&self, observer: Arc<dyn Observer<ClaimView>>) {
        self.subscribed.lock().unwrap().claims.claims.push(observer);
    }

    pub fn observe_templates(&self, observer: Arc<dyn Observer<TemplateView>>) {
        self.subscribed
            .lock()
            .unwrap()
            .claims
            .templates
            .push(observer);
    }

    pub fn observe_pod_groups(&self, observer: Arc<dyn Observer<PodGroupView>>) {
        let mut subscribed = self.subscribed.lock().unwrap();
        subscribed.claims.pod_groups.push(observer);
    }

    pub fn observe_slices(&self, observer: Arc<dyn Observer<ResourceSlice>>) {
        self.subscribed
            .lock()
            .unwrap()
            .devices
            .slices
            .push(observer);
    }

    pub fn observe_classes(&self, observer: Arc<dyn Observer<DeviceClass>>) {
        self.subscribed
            .lock()
            .unwrap()
            .devices
            .classes
            .push(observer);
    }

    pub fn observe_nodes(&self, observer: Arc<dyn Observer<NodeView>>) {
        self.subscribed.lock().unwrap().devices.nodes.push(observer);
    }

    pub fn observe_rules(&self, observer: Arc<dyn Observer<DeviceTaintRule>>) {
        self.subscribed.lock().unwrap().devices.rules.push(observer);
    }

    /// A task run beside the shared watches until the process ends.
    pub fn spawn_with_watches(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.subscribed.lock().unwrap().tasks.push(Box::pin(task));
    }

    /// The process is ready (and may lead) only once `synced` resolves too.
    pub fn ready_once(&self, synced: impl Future<Output = ()> + Send + 'static) {
        let mut subscribed = self.subscribed.lock().unwrap();
        subscribed.synced_too.push(Box::pin(synced));
    }

    /// What every controller subscribed to; taken once, after the builds.
    pub fn subscriptions(&self) -> Subscriptions {
        std::mem::take(&mut *self.subscribed.lock().unwrap())
    }
}
