//! kube-controller-manager's `resourcepoolstatusrequest-controller`
//! (`DRAResourcePoolStatus`, `resource.k8s.io/v1alpha3`): a request without
//! status gets its answer once (per-pool device counts, computed by
//! `model::pool_status` from the slices and claims already in memory),
//! written with `UpdateStatus` as there; answered requests are deleted an
//! hour after their condition, forgotten ones a day after their creation,
//! every 10 minutes, each with a UID precondition.
//!
//! The counting is that of the release acted as (1.37 counts each device
//! once, skips admin access, counts tainted devices unavailable, and adds
//! summaries of partitionable and shareable devices).
//!
//! Beyond upstream: a request whose answer holds an incomplete pool waits
//! up to 30 s for the driver to publish the rest, then is answered with the
//! pool's `validationError` (upstream drops such requests unanswered); an
//! answer the API server refuses as invalid is replaced by a `Failed`
//! condition quoting the refusal (upstream drops the request).
//!
//! Its one watch, of the requests, starts only when discovery finds the API
//! served; slices and claims come from the process's shared stores.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1alpha3::{
    PartitionTypeStatus, PoolStatus, ResourcePoolStatusRequest, ResourcePoolStatusRequestStatus,
    ShareableCapacityStatus, ShareableSummaryStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, PostParams, Preconditions};
use tracing::{Span, debug, info, info_span, warn};

use super::request_metrics::RequestMetrics;
use crate::model::device_taints::rules_of;
use crate::model::features::Release;
use crate::model::pool_status::{
    Answer, COMPLETE_REASON, Counting, FAILED_REASON, PoolAnswer, Question, Reply, answer,
    answered_at, refused_message, should_delete, when_to_reply,
};
use crate::model::views::ClaimView;
use crate::runtime::controller::{Action, Controller as Run, Queue, Reconciler, Sweep, Wake};
use crate::runtime::error::{SyncError, kube_err};
use crate::runtime::informer::{Handler, Informer};
use crate::runtime::optional_api::{
    ApiStatus, DISCOVERY_PER_TRY, DISCOVERY_TRIES, Discovered, OptionalApi,
};
use crate::runtime::reachability::Reachability;
use crate::runtime::retry::Backoff;
use crate::runtime::store::Store;

/// kube-controller-manager's name for it; here also the work queue's
/// `name` (upstream's queue has none, so no metrics).
pub(crate) const CONTROLLER_NAME: &str = "resourcepoolstatusrequest-controller";

/// The API the requests are served in (alpha in 1.36 and 1.37).
const REQUESTS_API: OptionalApi = OptionalApi {
    group: "resource.k8s.io",
    versions: &["v1alpha3"],
    plural: "resourcepoolstatusrequests",
};

/// How often expired requests are looked for (upstream's interval).
const CLEANUP_EVERY: Duration = Duration::from_secs(600);
/// Expired requests deleted in one go; more wait [`CLEANUP_NEXT_BATCH`].
const CLEANUP_BATCH: usize = 50;
const CLEANUP_NEXT_BATCH: Duration = Duration::from_secs(1);
/// The first clean-up waits for the requests' first list this often.
const CLEANUP_UNTIL_LISTED: Duration = Duration::from_secs(5);

/// Why an item is queued (the `reason` of its span).
const NEW_REQUEST: &str = "request without status";
const REQUESTS_LISTED: &str = "requests listed";

/// One work item: a request to answer (its name), or the clean-up.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Item {
    Request(String),
    Cleanup,
}

/// The stores it reads (none of them its own but the requests').
pub(crate) struct Stores {
    pub slices: Arc<Store<k8s_openapi::api::resource::v1::ResourceSlice>>,
    pub claims: Arc<Store<ClaimView>>,
    /// DeviceTaintRules (empty while `DRADeviceTaintRules` is off).
    pub rules: Arc<Store<k8s_openapi::api::resource::v1::DeviceTaintRule>>,
}

pub(crate) struct Controller {
    /// Whose counting: 1.37 counts each device once and taints.
    release: Release,
    api: Api<ResourcePoolStatusRequest>,
    requests: Store<ResourcePoolStatusRequest>,
    watch: Informer,
    stores: Stores,
    /// Items are queued only while leading.
    queue: Queue<Item, &'static str>,
    reachability: Arc<Reachability>,
    metrics: RequestMetrics,
}

impl Controller {
    pub(crate) fn new(
        client: kube::Client,
        release: Release,
        stores: Stores,
        registry: &prometheus::Registry,
        reachability: Arc<Reachability>,
    ) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Controller {
            release,
            api: Api::all(client),
            requests: Store::new(Vec::new()),
            watch: Informer::new(REQUESTS_API.plural),
            stores,
            queue: Queue::new(CONTROLLER_NAME, Some(registry)),
            reachability,
            metrics: RequestMetrics::register(registry)?,
        }))
    }

    /// This controller as the runtime runs it. One worker, as upstream:
    /// answers are cheap, and one at a time keeps the API server's load
    /// flat whatever the number of requests.
    pub(crate) fn run(self: &Arc<Self>) -> Run<Self> {
        Run::new(self.clone(), self.queue.clone(), self.reachability.clone())
    }

    fn is_leading(&self) -> bool {
        self.queue.is_leading()
    }

    /// Watches the requests once discovery finds their API; when it is not
    /// served, says how to turn it on and does nothing more. Discovery
    /// that gets no answer is asked again, with backoff, for as long as it
    /// takes: nothing else waits for this watch.
    pub(crate) async fn run_watch(self: Arc<Self>, client: kube::Client, apis: ApiStatus) {
        let mut backoff = Backoff::default();
        loop {
            let found = REQUESTS_API
                .discover(&client, DISCOVERY_TRIES, DISCOVERY_PER_TRY)
                .await;
            apis.report(
                &REQUESTS_API,
                &found,
                "enable kube-apiserver's --runtime-config=resource.k8s.io/v1alpha3=true and its \
                 DRAResourcePoolStatus gate, then restart this controller",
            );
            match found {
                Discovered::Served(_) => break,
                Discovered::NotServed => {
                    warn!(
                        "DRAResourcePoolStatus is on, but the API server serves no ResourcePoolStatusRequest \
                         (resource.k8s.io/v1alpha3): requests are not answered. Enable the API server's \
                         --runtime-config=resource.k8s.io/v1alpha3=true and its DRAResourcePoolStatus \
                         gate, then restart this controller"
                    );
                    // Nothing to list: the empty store is the truth.
                    self.watch.mark_synced();
                    return;
                }
                Discovered::NoAnswer => {
                    let pause = backoff.next_pause();
                    warn!(
                        retry_in_ms = pause.as_millis() as u64,
                        "discovering ResourcePoolStatusRequests (GET /apis/resource.k8s.io/v1alpha3) got \
                         no answer; asking again (a 403 means the identity lacks get on that URL)"
                    );
                    tokio::time::sleep(pause).await;
                }
            }
        }
        info!(
            api_version = "resource.k8s.io/v1alpha3",
            "watching ResourcePoolStatusRequests"
        );
        self.watch.run(self.api.clone(), &*self).await;
    }

    fn queue_pending(&self, why: Wake<&'static str>) -> usize {
        let mut pending = 0;
        for request in self.requests.list() {
            if request.status.is_none()
                && let Some(name) = &request.metadata.name
            {
                self.queue.add_for(Item::Request(name.clone()), why.clone());
                pending += 1;
            }
        }
        pending
    }

    /// Answers the request `name` if it has no status yet; `Some(delay)`:
    /// its answer would hold an incomplete pool, look again after it.
    async fn reply(&self, name: &str) -> Result<Action, SyncError> {
        let started = Instant::now();
        let Some(request) = self.requests.get(name) else {
            debug!("request gone");
            return Ok(Action::Done);
        };
        if request.status.is_some() {
            debug!("request already answered");
            return Ok(Action::Done);
        }
        let spec = &request.spec;
        let slices = self.stores.slices.list();
        let claims = self.stores.claims.list();
        let question = Question {
            driver: &spec.driver,
            pool_name: spec.pool_name.as_deref(),
            limit: spec.limit,
            default_partition_type_attribute: spec.default_partition_type_attribute.as_deref(),
        };
        // 1.36 counts no taint: its rules are not even read.
        let rules = if self.release.is_1_37() {
            rules_of(&self.stores.rules.list())
        } else {
            Vec::new()
        };
        let counting = match self.release {
            Release::V1_36 => Counting::V1_36,
            Release::V1_37 => Counting::V1_37 { rules: &rules },
            Release::V1_38 => Counting::V1_38 { rules: &rules },
        };
        let answer = answer(
            question,
            counting,
            slices.iter().map(|s| s.as_ref()),
            claims.iter().map(|c| c.as_ref()),
        );
        let now = Timestamp::now();
        let created = request.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if let Reply::WaitForSlices(delay) = when_to_reply(&answer, created, now) {
            debug!(
                driver = %spec.driver,
                retry_in_ms = delay.as_millis() as u64,
                "a returned pool is incomplete; waiting for its driver to publish the rest"
            );
            return Ok(Action::RecheckAfter(delay));
        }
        let mut answered = (*request).clone();
        answered.status = Some(status_of(&answer, now));
        let mut written = self.write_status(&answered, started).await;
        if let Err(kube::Error::Api(refusal)) = &written
            && refusal.code == 422
        {
            // Refused as invalid: asking again would be refused again.
            warn!(
                driver = %spec.driver,
                refusal = %refusal.message,
                "the API server refused the answer; writing a Failed condition instead"
            );
            answered.status = Some(failed_status(&refused_message(&refusal.message), now));
            written = self.write_status(&answered, started).await;
        }
        written.map_err(kube_err(format_args!(
            "writing the status of ResourcePoolStatusRequest {name}"
        )))?;
        info!(
            driver = %spec.driver,
            pool_count = answer.pool_count,
            pools = answer.pools.len(),
            incomplete = answer.has_incomplete_pool(),
            "answered"
        );
        Ok(Action::Done)
    }

    /// Writes a request's status (counted in the request metrics, as
    /// upstream counts each `UpdateStatus`). No field manager is named, as
    /// upstream: the API server takes the client's user agent (an update
    /// owns no fields against appliers).
    async fn write_status(
        &self,
        request: &ResourcePoolStatusRequest,
        started: Instant,
    ) -> kube::Result<ResourcePoolStatusRequest> {
        let name = request.metadata.name.as_deref().unwrap_or_default();
        let written = self
            .api
            .replace_status(name, &PostParams::default(), request)
            .await;
        self.metrics.processed(
            &request.spec.driver,
            started.elapsed().as_secs_f64(),
            written.is_err(),
        );
        written
    }

    /// Deletes the requests whose time is up, [`CLEANUP_BATCH`] at a time
    /// so that answers are not held up behind a long clean-up; then waits
    /// 10 minutes (a few seconds while the requests are not listed yet).
    async fn clean_up(&self) -> Result<Action, SyncError> {
        if !self.watch.is_synced() {
            return Ok(Action::RecheckAfter(CLEANUP_UNTIL_LISTED));
        }
        let now = Timestamp::now();
        let mut deleted = 0;
        let expired: Vec<_> = self
            .requests
            .list()
            .into_iter()
            .filter(|r| {
                let created = r.metadata.creation_timestamp.as_ref().map(|t| t.0);
                should_delete(created, answered_at(r.status.as_ref()), now)
            })
            .collect();
        let more = expired.len() > CLEANUP_BATCH;
        for request in expired.into_iter().take(CLEANUP_BATCH) {
            let name = request.metadata.name.clone().unwrap_or_default();
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: request.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match self.api.delete(&name, &params).await {
                Ok(_) => {
                    deleted += 1;
                    debug!(request = %name, "deleted an expired request");
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => {
                    let error = SyncError::kube(
                        format_args!("deleting expired ResourcePoolStatusRequest {name}"),
                        error,
                    );
                    // No answer at all: wait for the API server, then
                    // start over; anything else waits for the next round.
                    if matches!(error, SyncError::Unreachable { .. }) {
                        return Err(error);
                    }
                    warn!(request = %name, error = %error, "deleting an expired request failed; the next clean-up tries again");
                }
            }
        }
        if deleted > 0 {
            info!(deleted, more, "expired ResourcePoolStatusRequests deleted");
        }
        Ok(Action::RecheckAfter(if more {
            CLEANUP_NEXT_BATCH
        } else {
            CLEANUP_EVERY
        }))
    }
}

/// The status written: the answer and its `Complete` condition.
fn status_of(answer: &Answer, now: Timestamp) -> ResourcePoolStatusRequestStatus {
    let pools: Vec<PoolStatus> = answer.pools.iter().map(pool_status).collect();
    ResourcePoolStatusRequestStatus {
        pool_count: answer.pool_count,
        pools: (!pools.is_empty()).then_some(pools),
        conditions: Some(vec![condition(
            "Complete",
            COMPLETE_REASON,
            &answer.message,
            now,
        )]),
    }
}

/// A status saying the answer could not be given, as upstream's `Failed`.
fn failed_status(message: &str, now: Timestamp) -> ResourcePoolStatusRequestStatus {
    ResourcePoolStatusRequestStatus {
        pool_count: 0,
        pools: None,
        conditions: Some(vec![condition("Failed", FAILED_REASON, message, now)]),
    }
}

fn condition(type_: &str, reason: &str, message: &str, now: Timestamp) -> Condition {
    Condition {
        type_: type_.into(),
        status: "True".into(),
        reason: reason.into(),
        message: message.into(),
        // The API keeps whole seconds, cut as Kubernetes cuts them.
        last_transition_time: Time(Timestamp::from_second(now.as_second()).unwrap_or(now)),
        observed_generation: None,
    }
}

fn pool_status(pool: &PoolAnswer) -> PoolStatus {
    PoolStatus {
        driver: pool.driver.clone(),
        pool_name: pool.pool_name.clone(),
        generation: pool.generation,
        node_name: pool.node_name.clone(),
        resource_slice_count: pool.resource_slice_count,
        total_devices: pool.total_devices,
        allocated_devices: pool.allocated_devices,
        available_devices: pool.available_devices,
        unavailable_devices: pool.unavailable_devices,
        validation_error: pool.validation_error.clone(),
        partition_summary: pool.partition_summary.as_ref().map(|types| {
            types
                .iter()
                .map(|t| PartitionTypeStatus {
                    attribute: t.attribute.clone(),
                    type_: t.type_.clone(),
                    total: t.total,
                    allocatable: t.allocatable,
                })
                .collect()
        }),
        shareable_summary: pool
            .shareable_summary
            .as_ref()
            .map(|s| ShareableSummaryStatus {
                fully_available_devices: s.fully_available,
                partially_available_devices: s.partially_available,
                // An empty list is left out, as the API writes it.
                capacity: (!s.capacity.is_empty()).then(|| {
                    s.capacity
                        .iter()
                        .map(|c| ShareableCapacityStatus {
                            name: c.name.clone(),
                            total: Quantity(c.total.clone()),
                            consumed: Quantity(c.consumed.clone()),
                            available: Quantity(c.available.clone()),
                        })
                        .collect()
                }),
            }),
    }
}

impl Handler<ResourcePoolStatusRequest> for Controller {
    fn relisted(&self, requests: Vec<ResourcePoolStatusRequest>) {
        let entries = requests
            .into_iter()
            .filter_map(|r| Some((r.metadata.name.clone()?, Arc::new(r))))
            .collect();
        self.requests.replace(entries);
        if self.is_leading() {
            self.queue_pending(Wake::Event(REQUESTS_LISTED));
        }
        self.watch.mark_synced();
    }

    fn applied(&self, request: ResourcePoolStatusRequest) {
        let Some(name) = request.metadata.name.clone() else {
            return;
        };
        let pending = request.status.is_none();
        self.requests.apply(name.clone(), Arc::new(request));
        if pending && self.is_leading() {
            self.queue.add(Item::Request(name), NEW_REQUEST);
        }
    }

    fn deleted(&self, request: ResourcePoolStatusRequest) {
        if let Some(name) = &request.metadata.name {
            self.requests.delete(name);
        }
    }
}

impl Reconciler for Controller {
    type Key = Item;
    type Why = &'static str;

    fn span(&self, item: &Item, why: &Wake<&'static str>) -> Span {
        match item {
            Item::Request(name) => {
                info_span!("pool-status-request", request = %name, reason = %why)
            }
            Item::Cleanup => info_span!("pool-status-request-cleanup", reason = %why),
        }
    }

    async fn reconcile(&self, item: &Item) -> Result<Action, SyncError> {
        match item {
            Item::Request(name) => self.reply(name).await,
            Item::Cleanup => self.clean_up().await,
        }
    }

    /// At takeover: every request without status, and the clean-up at
    /// once (it then comes back every 10 minutes by itself).
    fn sweep(&self, sweep: Sweep) {
        let pending = self.queue_pending(sweep.wake());
        self.queue.add_for(Item::Cleanup, sweep.wake());
        info!(
            pending,
            "pool status requests leading: queued the requests without status"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status as upstream's `TestSyncRequest` expects it written: one
    /// `Complete` condition with the reason and message, the counts, no
    /// pools when none matched.
    #[test]
    fn status_carries_the_answer_and_its_condition() {
        let now: Timestamp = "2026-01-01T12:00:00.700Z".parse().unwrap();
        let answer = Answer {
            pool_count: 2,
            pools: vec![PoolAnswer {
                driver: "d.example.com".into(),
                pool_name: "p".into(),
                total_devices: Some(4),
                ..PoolAnswer::default()
            }],
            message: "Calculated status for 1 pools".into(),
        };
        let status = serde_json::to_value(status_of(&answer, now)).unwrap();
        assert_eq!(
            status,
            serde_json::json!({
                "poolCount": 2,
                "pools": [{"driver": "d.example.com", "poolName": "p", "generation": 0, "totalDevices": 4}],
                "conditions": [{"type": "Complete", "status": "True", "reason": "CalculationComplete",
                    "message": "Calculated status for 1 pools",
                    "lastTransitionTime": "2026-01-01T12:00:00Z"}]
            })
        );
        let empty = serde_json::to_value(status_of(&Answer::default(), now)).unwrap();
        assert!(empty.get("pools").is_none(), "{empty}");
        assert_eq!(empty["poolCount"], 0);
    }
}
