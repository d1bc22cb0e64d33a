//! One watch feeding one handler, the shape every watch of the controller
//! shares: a (re)list is buffered until complete and handed over whole,
//! single events as they come, and a flag says when the first list is in.
//!
//! The (re)list is a streaming list (`sendInitialEvents`) where the server
//! serves one, so a big cluster costs one request and no whole list held at
//! once on either side, and pages of 500 where it does not.
//!
//! Liveness is part of the shape (see [`watch_config`] and
//! [`Backoff`]): a silent stream is replaced within a bound, and a
//! failed watch is retried within seconds.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::protobuf::{self, EventStream, FromProtobuf};
use super::retry::Backoff;

/// What a watch's events do.
pub trait Handler<K>: Send + Sync {
    /// A (re)list starts: whatever an earlier attempt admitted is void.
    fn list_started(&self) {}
    /// An object of a (re)list that is not complete yet: what to keep of it
    /// until the list is complete (`None`: nothing).
    fn admit(&self, obj: K) -> Option<K> {
        Some(obj)
    }
    /// A (re)list completed: `objects` are all there are.
    fn relisted(&self, objects: Vec<K>);
    /// An object was added or changed.
    fn applied(&self, obj: K);
    /// An object was deleted (its last state).
    fn deleted(&self, obj: K);
}

/// Another room's interest in a watch whose store one handler keeps. The
/// keeper calls it after each change is in its store, with the object's
/// previous state, so the observer reads current stores and still sees
/// what changed. Wired by whoever builds both rooms; neither imports the
/// other.
pub trait Observer<K>: Send + Sync {
    /// A (re)list is in the store.
    fn relisted(&self);
    /// `new` is in the store; `old` is what the store held before, if any.
    fn applied(&self, old: Option<&K>, new: &K);
    /// `last` (its last known state) is gone from the store.
    fn deleted(&self, last: &K);
}

/// One watch: its name (for logs) and whether its first list is in.
#[derive(Debug)]
pub struct Informer {
    resource: &'static str,
    synced: watch::Sender<bool>,
}

impl Informer {
    pub fn new(resource: &'static str) -> Self {
        Informer {
            resource,
            synced: watch::Sender::new(false),
        }
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Marks the first list handed over without a watch (a kind the API
    /// server does not serve: its empty store is the truth).
    pub fn mark_synced(&self) {
        self.synced.send_replace(true);
    }

    /// Resolves once the first list has been handed over.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Watches `api` and feeds `handler` until the process ends. Watch
    /// errors are retried with [`Backoff`]; a 410 Gone relists.
    pub async fn run<K>(&self, api: Api<K>, handler: &impl Handler<K>)
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        self.run_with(api, watch_config(), handler).await
    }

    /// As [`Informer::run`], with `config` (a [`watch_config`] narrowed by
    /// a selector, say).
    pub(crate) async fn run_with<K>(
        &self,
        api: Api<K>,
        config: watcher::Config,
        handler: &impl Handler<K>,
    ) where
        K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        self.run_watch(api, config, handler, None).await
    }

    /// As [`Informer::run`], with the watches in protobuf (see
    /// [`protobuf`]), which the API server encodes several times faster
    /// than JSON. Lists in pages (the fallback where streaming lists are
    /// refused) stay JSON. A stream that does not decode, or a server that
    /// answers in JSON, turns protobuf off for this watch, for good.
    pub async fn run_protobuf<K>(&self, api: Api<K>, handler: &impl Handler<K>)
    where
        K: kube::Resource + Clone + DeserializeOwned + FromProtobuf + Debug + Send + 'static,
    {
        self.run_watch(api, watch_config(), handler, Some(protobuf::events::<K>))
            .await
    }

    async fn run_watch<K>(
        &self,
        api: Api<K>,
        config: watcher::Config,
        handler: &impl Handler<K>,
        protobuf_events: Option<fn(kube::client::Body) -> EventStream<K>>,
    ) where
        K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let watch = Watch {
            resource: self.resource,
            api: &api,
            client: api.clone().into(),
            config: &config,
            handler,
            protobuf_events,
            protobuf_off: Arc::new(AtomicBool::new(false)),
        };
        let mut backoff = Backoff::default();
        let mut streaming = true;
        loop {
            let mut listed = if streaming {
                watch.stream_list().await
            } else {
                watch.page_list().await
            };
            if let Err(ListFailure::Refused(reason)) = &listed {
                // An older server, one with the gate off, or one whose etcd
                // cannot serve progress requests. Pages at once, and from
                // now on: a refusal costs one request, once.
                info!(
                    resource = self.resource,
                    %reason,
                    "the API server does not serve streaming lists here; listing in pages"
                );
                streaming = false;
                listed = watch.page_list().await;
            }
            let resource_version = match listed {
                Ok((objects, resource_version)) => {
                    handler.relisted(objects);
                    self.synced.send_replace(true);
                    backoff.reset();
                    resource_version
                }
                Err(failure) => {
                    warn!(resource = self.resource, error = %failure, "list failed; retrying with backoff");
                    tokio::time::sleep(backoff.next_pause()).await;
                    continue;
                }
            };
            watch.follow(resource_version, &mut backoff).await;
        }
    }
}

/// One watch's parts, for the steps of [`Informer::run_with`].
struct Watch<'a, K, H> {
    resource: &'static str,
    api: &'a Api<K>,
    client: kube::Client,
    config: &'a watcher::Config,
    handler: &'a H,
    /// Decodes a protobuf watch answer, for views that read protobuf.
    protobuf_events: Option<fn(kube::client::Body) -> EventStream<K>>,
    /// Set once a protobuf answer did not decode or came back as JSON.
    protobuf_off: Arc<AtomicBool>,
}

impl<K, H> Watch<'_, K, H>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    H: Handler<K>,
{
    /// Starts a watch: in protobuf where this view reads it and it has not
    /// failed, otherwise through kube-rs in JSON.
    async fn open(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> Result<EventStream<K>, kube::Error> {
        let protobuf_events = self
            .protobuf_events
            .filter(|_| !self.protobuf_off.load(Ordering::Relaxed));
        let Some(decode) = protobuf_events else {
            return Ok(self.api.watch(params, resource_version).await?.boxed());
        };
        let request = kube::core::Request::new(self.api.resource_url())
            .watch(params, resource_version)
            .map_err(kube::Error::BuildRequest)?;
        let (mut parts, body) = request.into_parts();
        parts.headers.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(protobuf::ACCEPT),
        );
        let response = self
            .client
            .send(http::Request::from_parts(
                parts,
                kube::client::Body::from(body),
            ))
            .await?;
        if !response.status().is_success() {
            return Err(protobuf::error_answer(response).await);
        }
        if !protobuf::is_protobuf(&response) {
            warn!(
                resource = self.resource,
                "the API server answered a protobuf watch in JSON; watching in JSON"
            );
            self.protobuf_off.store(true, Ordering::Relaxed);
            return Ok(self.api.watch(params, resource_version).await?.boxed());
        }
        let off = self.protobuf_off.clone();
        let resource = self.resource;
        Ok(decode(response.into_body())
            .inspect(move |event| {
                if let Err(kube::Error::ReadEvents(e)) = event
                    && e.kind() == std::io::ErrorKind::InvalidData
                    && !off.swap(true, Ordering::Relaxed)
                {
                    warn!(resource, error = %e, "a protobuf watch did not decode; watching in JSON from now on");
                }
            })
            .boxed())
    }

    /// A streaming list: one watch with `sendInitialEvents`, whose events
    /// up to the bookmark marked as their end are the list.
    async fn stream_list(&self) -> Result<(Vec<K>, String), ListFailure> {
        let Watch {
            config, handler, ..
        } = self;
        // The server's bound on the whole stream; silence is bounded
        // separately below. A stream cut by it counts as a refusal.
        let params = watch_params(config, INITIAL_EVENTS_TIMEOUT_SECS, true);
        handler.list_started();
        // No resourceVersion: the list is as recent as a quorum read.
        let mut stream = self
            .open(&params, "")
            .await
            .map_err(ListFailure::at_start)?;
        let mut objects = Vec::new();
        loop {
            match next_within(&mut stream, SILENT_STREAM_BOUND).await {
                Next::Silent => return Err(ListFailure::Silent),
                Next::Ended => {
                    return Err(ListFailure::Refused(
                        "the stream ended before its initial events did".into(),
                    ));
                }
                Next::Event(WatchEvent::Added(obj) | WatchEvent::Modified(obj)) => {
                    objects.extend(handler.admit(obj));
                }
                // Never sent before the end of the initial events.
                Next::Event(WatchEvent::Deleted(_)) => {}
                Next::Event(WatchEvent::Bookmark(mark)) => {
                    if mark.metadata.annotations.contains_key(INITIAL_EVENTS_END) {
                        return Ok((objects, mark.metadata.resource_version));
                    }
                }
                Next::Event(WatchEvent::Error(status)) => {
                    return Err(ListFailure::in_stream(*status));
                }
                Next::Failed(e) => return Err(ListFailure::Failed(e)),
            }
        }
    }

    /// A list in pages of `config.page_size`, each object admitted as its
    /// page arrives.
    async fn page_list(&self) -> Result<(Vec<K>, String), ListFailure> {
        let Watch {
            api,
            config,
            handler,
            ..
        } = self;
        let mut params = ListParams {
            label_selector: config.label_selector.clone(),
            field_selector: config.field_selector.clone(),
            limit: config.page_size,
            ..ListParams::default()
        };
        let mut objects = Vec::new();
        handler.list_started();
        loop {
            let page = api.list(&params).await.map_err(ListFailure::Failed)?;
            objects.extend(page.items.into_iter().filter_map(|obj| handler.admit(obj)));
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params.continue_token = Some(token),
                None => {
                    return page
                        .metadata
                        .resource_version
                        .filter(|version| !version.is_empty())
                        .map(|version| (objects, version))
                        .ok_or(ListFailure::NoVersion);
                }
            }
        }
    }

    /// Watches from `resource_version` on, re-watching from the last version
    /// seen whenever a stream ends, fails or goes silent, until the server
    /// no longer has that version (410 Gone): then the caller relists.
    async fn follow(&self, mut resource_version: String, backoff: &mut Backoff) {
        let Watch {
            config, handler, ..
        } = self;
        let timeout = config.timeout.unwrap_or(WATCH_TIMEOUT_MIN_SECS);
        let params = watch_params(config, timeout, false);
        // A healthy stream ends by the server's timeout; one silent past it
        // by the margin is dead (see `watch_config`).
        let silent_after = Duration::from_secs(u64::from(timeout + WATCH_IDLE_MARGIN_SECS));
        loop {
            let mut stream = match self.open(&params, &resource_version).await {
                Ok(stream) => stream,
                Err(e) if is_gone(&e) => return,
                Err(e) => {
                    warn!(resource = self.resource, error = %e, "watch failed; retrying with backoff");
                    tokio::time::sleep(backoff.next_pause()).await;
                    continue;
                }
            };
            let opened = Instant::now();
            loop {
                match next_within(&mut stream, silent_after).await {
                    Next::Silent => {
                        warn!(
                            resource = self.resource,
                            silent_s = silent_after.as_secs(),
                            "watch stream silent past its timeout; re-watching"
                        );
                        break;
                    }
                    Next::Ended => {
                        // Ended at once: a server or proxy refusing watches
                        // without an error; do not hammer it.
                        if opened.elapsed() < Duration::from_secs(1) {
                            tokio::time::sleep(backoff.next_pause()).await;
                        }
                        break;
                    }
                    Next::Event(WatchEvent::Added(obj) | WatchEvent::Modified(obj)) => {
                        note_version(&mut resource_version, &obj);
                        backoff.reset();
                        handler.applied(obj);
                    }
                    Next::Event(WatchEvent::Deleted(obj)) => {
                        note_version(&mut resource_version, &obj);
                        backoff.reset();
                        handler.deleted(obj);
                    }
                    Next::Event(WatchEvent::Bookmark(mark)) => {
                        resource_version = mark.metadata.resource_version;
                        backoff.reset();
                    }
                    Next::Event(WatchEvent::Error(status)) if status.code == 410 => return,
                    Next::Event(WatchEvent::Error(status)) => {
                        warn!(
                            resource = self.resource,
                            code = status.code,
                            error = %status.message,
                            "watch ended with an error; re-watching with backoff"
                        );
                        tokio::time::sleep(backoff.next_pause()).await;
                        break;
                    }
                    Next::Failed(e) => {
                        warn!(resource = self.resource, error = %e, "watch failed; retrying with backoff");
                        tokio::time::sleep(backoff.next_pause()).await;
                        break;
                    }
                }
            }
        }
    }
}

/// The annotation of the bookmark that ends a streaming list's initial
/// events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// The server's bound on a streaming list. Long enough for the largest
/// cluster's initial events; the silence between events is bounded by
/// [`SILENT_STREAM_BOUND`] instead. (A watch's usual 8–10 s would cut a
/// long list and start it again from nothing, over and over.)
const INITIAL_EVENTS_TIMEOUT_SECS: u32 = 290;

/// Why a (re)list did not complete.
#[derive(Debug, thiserror::Error)]
enum ListFailure {
    /// The server answered a streaming list with an error, or ended it
    /// before its initial events did.
    #[error("streaming list refused: {0}")]
    Refused(String),
    #[error("the stream was silent for {}s", SILENT_STREAM_BOUND.as_secs())]
    Silent,
    #[error("the list carried no resourceVersion")]
    NoVersion,
    #[error(transparent)]
    Failed(kube::Error),
}

impl ListFailure {
    /// A streaming list's request failed: an answer from the server is a
    /// refusal (any error, as client-go takes it), anything else a failure
    /// to reach it.
    fn at_start(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(status) => ListFailure::in_stream(*status),
            e => ListFailure::Failed(e),
        }
    }

    /// An error event in a streaming list (a server without the storage
    /// support answers this way: 500, "the required storage feature
    /// RequestWatchProgress is disabled").
    fn in_stream(status: kube::core::Status) -> Self {
        ListFailure::Refused(format!("{} ({})", status.message, status.code))
    }
}

/// A watch request of `config` (its selectors), with bookmarks, ended by
/// the server after `timeout` seconds; `initial_events`: a streaming list.
fn watch_params(config: &watcher::Config, timeout: u32, initial_events: bool) -> WatchParams {
    WatchParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        timeout: Some(timeout),
        bookmarks: true,
        send_initial_events: initial_events,
    }
}

fn is_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 410)
}

fn note_version<K: kube::Resource>(resource_version: &mut String, obj: &K) {
    if let Some(version) = obj
        .meta()
        .resource_version
        .as_ref()
        .filter(|v| !v.is_empty())
    {
        resource_version.clone_from(version);
    }
}

/// The next item of a watch stream, or why there is none.
enum Next<K> {
    Event(WatchEvent<K>),
    Failed(kube::Error),
    Ended,
    Silent,
}

async fn next_within<K>(
    stream: &mut (impl Stream<Item = Result<WatchEvent<K>, kube::Error>> + Unpin),
    silence: Duration,
) -> Next<K> {
    match tokio::time::timeout(silence, stream.next()).await {
        Err(_) => Next::Silent,
        Ok(None) => Next::Ended,
        Ok(Some(Ok(event))) => Next::Event(event),
        Ok(Some(Err(e))) => Next::Failed(e),
    }
}

/// The shortest server-side timeout of a watch request, in seconds.
const WATCH_TIMEOUT_MIN_SECS: u32 = 8;
/// Each watch draws its timeout from `MIN..=MIN + JITTER`, so the watches
/// (and the replicas) do not all re-watch at the same moment.
const WATCH_TIMEOUT_JITTER_SECS: u32 = 2;
/// How long past the server-side timeout a stream may stay silent before
/// it is given up as dead (kube-runtime's `WATCH_IDLE_TIMEOUT_MARGIN` too).
const WATCH_IDLE_MARGIN_SECS: u32 = 5;
/// The longest a silent stream goes unnoticed: the bound the liveness
/// contract sets (kube-controller-manager 1.36 needs about 14 s).
pub const SILENT_STREAM_BOUND_SECS: u32 =
    WATCH_TIMEOUT_MIN_SECS + WATCH_TIMEOUT_JITTER_SECS + WATCH_IDLE_MARGIN_SECS;
const _: () = assert!(
    SILENT_STREAM_BOUND_SECS <= 15,
    "the liveness contract's bound"
);
const SILENT_STREAM_BOUND: Duration = Duration::from_secs(SILENT_STREAM_BOUND_SECS as u64);

/// The configuration of one watch.
///
/// Liveness: [`Informer`] abandons a watch that delivers nothing, not even
/// a bookmark, for its server-side timeout plus 5 s, and re-watches from
/// the last resourceVersion it saw. A healthy stream always delivers or
/// ends within the timeout (the API server closes it then), so a stream
/// that stays silent longer is dead: a stalled proxy or load balancer, a
/// half-open connection (no transport signal tells: the connection stays
/// open and answers TCP and HTTP/2 pings, only the stream is silent). With
/// 8–10 s timeouts such a stream is replaced at most 15 s after its last
/// byte ([`SILENT_STREAM_BOUND_SECS`]), at the cost of one watch request
/// per watch every 8–10 s, served from the API server's watch cache
/// (kube-runtime's default, 290 s, trusted a silent stream for five
/// minutes; our earlier 40–50 s for 55 s).
pub(crate) fn watch_config() -> watcher::Config {
    use rand::Rng;
    let timeout = WATCH_TIMEOUT_MIN_SECS + rand::rng().random_range(0..=WATCH_TIMEOUT_JITTER_SECS);
    watcher::Config::default()
        // Pages keep the memory of the initial list of a big cluster bounded.
        .page_size(500)
        .timeout(timeout)
}

#[cfg(test)]
mod tests;
