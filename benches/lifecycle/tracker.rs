//! Per-pod timestamps taken from watch events: when a pod's claims are
//! recorded in its status, when each claim is deleted, when the pod is gone.
//! Each time is taken when its event arrives, so how often a waiter polls
//! never skews a latency.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use crate::load::{LOAD_SELECTOR, NAMESPACE};

/// What happened to one pod of the load, and when.
#[derive(Debug, Clone, Default)]
pub struct PodTimes {
    /// The bench's create call returned.
    pub created: Option<Instant>,
    /// Every claim entry of the pod had a claim name in its status.
    pub recorded: Option<Instant>,
    /// The claim names recorded then.
    pub claims: Vec<String>,
    /// The bench's write of phase Succeeded returned.
    pub done: Option<Instant>,
    /// The pod's DELETED event arrived.
    pub gone: Option<Instant>,
}

/// Everything the watches saw.
#[derive(Debug, Clone, Default)]
pub struct State {
    pub pods: HashMap<String, PodTimes>,
    /// Claim name → arrival of its DELETED event.
    pub claims_deleted: HashMap<String, Instant>,
    /// Claim name → name of the pod controlling it, for every claim seen,
    /// so duplicates show up as more claims than entries.
    pub claim_owner: HashMap<String, String>,
    pods_synced: bool,
    claims_synced: bool,
}

impl State {
    /// How many of `names` have all their claims recorded.
    pub fn recorded(&self, names: &[String]) -> usize {
        self.count(names, |t| t.recorded.is_some())
    }

    /// How many of `names` have had every recorded claim deleted.
    pub fn cleaned(&self, names: &[String]) -> usize {
        names
            .iter()
            .filter(|n| self.claims_gone(n).is_some())
            .count()
    }

    /// How many of `names` are deleted.
    pub fn gone(&self, names: &[String]) -> usize {
        self.count(names, |t| t.gone.is_some())
    }

    /// When the last recorded claim of `pod` was deleted, once all are.
    pub fn claims_gone(&self, pod: &str) -> Option<Instant> {
        let times = self.pods.get(pod)?;
        if times.claims.is_empty() {
            return None;
        }
        times
            .claims
            .iter()
            .map(|c| self.claims_deleted.get(c).copied())
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .max()
    }

    /// Claims controlled by any of `names` (duplicates included).
    pub fn claims_owned_by(&self, names: &[String]) -> usize {
        let set: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
        self.claim_owner
            .values()
            .filter(|o| set.contains(o.as_str()))
            .count()
    }

    fn count(&self, names: &[String], what: impl Fn(&PodTimes) -> bool) -> usize {
        names
            .iter()
            .filter(|n| self.pods.get(*n).is_some_and(&what))
            .count()
    }

    fn pod_seen(&mut self, pod: &Pod, now: Instant, claims_per_pod: usize) {
        let Some(name) = pod.metadata.name.clone() else {
            return;
        };
        let times = self.pods.entry(name).or_default();
        if times.recorded.is_some() {
            return;
        }
        let claims: Vec<String> = pod
            .status
            .iter()
            .flat_map(|s| s.resource_claim_statuses.iter().flatten())
            .filter_map(|s| s.resource_claim_name.clone())
            .collect();
        if claims.len() >= claims_per_pod {
            times.recorded = Some(now);
            times.claims = claims;
        }
    }

    fn pod_gone(&mut self, pod: &Pod, now: Instant) {
        if let Some(name) = &pod.metadata.name {
            self.pods
                .entry(name.clone())
                .or_default()
                .gone
                .get_or_insert(now);
        }
    }

    fn claim_seen(&mut self, claim: &ResourceClaim) {
        let owner = claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "Pod");
        if let (Some(name), Some(owner)) = (&claim.metadata.name, owner) {
            self.claim_owner.insert(name.clone(), owner.name.clone());
        }
    }

    fn claim_gone(&mut self, claim: &ResourceClaim, now: Instant) {
        self.claim_seen(claim);
        if let Some(name) = &claim.metadata.name {
            self.claims_deleted.entry(name.clone()).or_insert(now);
        }
    }
}

/// Watches the load pods and the claims of the bench namespace for as long
/// as it lives.
#[derive(Debug)]
pub struct Tracker {
    state: Arc<Mutex<State>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        // The server goes away with the run; its watches must not retry
        // into the next run.
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Tracker {
    pub fn start(client: kube::Client, claims_per_pod: usize) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let claims: Api<ResourceClaim> = Api::namespaced(client, NAMESPACE);
        // Only the load's pods: the pre-fill must not cost the bench anything.
        let pod_config = watcher::Config::default().labels(LOAD_SELECTOR);
        let pod_task = tokio::spawn(watch(
            pods,
            pod_config,
            state.clone(),
            move |s, e, now| match e {
                Event::Apply(p) | Event::InitApply(p) => s.pod_seen(&p, now, claims_per_pod),
                Event::Delete(p) => s.pod_gone(&p, now),
                Event::InitDone => s.pods_synced = true,
                Event::Init => {}
            },
        ));
        let claim_task = tokio::spawn(watch(
            claims,
            watcher::Config::default(),
            state.clone(),
            |s, e, now| match e {
                Event::Apply(c) | Event::InitApply(c) => s.claim_seen(&c),
                Event::Delete(c) => s.claim_gone(&c, now),
                Event::InitDone => s.claims_synced = true,
                Event::Init => {}
            },
        ));
        Self {
            state,
            tasks: vec![pod_task, claim_task],
        }
    }

    /// A copy of everything seen so far.
    pub fn state(&self) -> State {
        lock(&self.state).clone()
    }

    /// Sets the time `field` picks of `pod`: the bench's own calls.
    pub fn mark(&self, pod: &str, at: Instant, field: fn(&mut PodTimes) -> &mut Option<Instant>) {
        *field(lock(&self.state).pods.entry(pod.to_string()).or_default()) = Some(at);
    }

    /// Waits until both watches have listed what exists.
    pub async fn wait_synced(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.state();
            if s.pods_synced && s.claims_synced {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "watches not synced after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `count` reaches `names.len()`, printing progress every
    /// 10 s. `false` when `timeout` passed first (the report then says how
    /// many pods got there).
    pub async fn wait(
        &self,
        what: &str,
        names: &[String],
        timeout: Duration,
        count: fn(&State, &[String]) -> usize,
    ) -> bool {
        let started = Instant::now();
        let mut next_report = started + Duration::from_secs(10);
        loop {
            let n = count(&lock(&self.state), names);
            if n >= names.len() {
                return true;
            }
            let now = Instant::now();
            if now >= started + timeout {
                eprintln!(
                    "  {what}: only {n}/{} after {timeout:?}; going on",
                    names.len()
                );
                return false;
            }
            if now >= next_report {
                eprintln!(
                    "  {what}: {n}/{} after {:.0}s",
                    names.len(),
                    (now - started).as_secs_f64()
                );
                next_report = now + Duration::from_secs(10);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Feeds every event of a watch on `api` to `on`, with the arrival time.
async fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    state: Arc<Mutex<State>>,
    on: impl Fn(&mut State, Event<K>, Instant) + Send + 'static,
) where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        let now = Instant::now();
        match event {
            Ok(e) => on(&mut lock(&state), e, now),
            Err(e) => eprintln!("  watch error (retrying): {e}"),
        }
    }
}
