//! Kubernetes API client construction: one process-wide token bucket and
//! client-go compatible request metrics.
//!
//! Every request the process sends (lists, watch starts, gets, creates,
//! patches, lease renewals) passes through a single [`ClientLayer`], the
//! equivalent of client-go's QPS/burst limiter plus its `rest_client_*`
//! metrics. The layer sits outside kube's own retry layer, so a request that
//! kube retries internally (429/503/504) takes one token and is counted once.

mod connection;
mod metrics;

pub use connection::ConnectionOverrides;
pub(crate) use metrics::ClientMetrics;

use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::{Request, Response};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use tower::buffer::BufferLayer;
use tower::{Layer, Service, ServiceExt};

use super::priority::{self, Priority, Turns};

/// kube-controller-manager's `--kube-api-qps` default.
pub const DEFAULT_QPS: f32 = 20.0;
/// kube-controller-manager's `--kube-api-burst` default.
pub const DEFAULT_BURST: u32 = 30;

/// Latency buckets client-go uses for `rest_client_request_duration_seconds`
/// and `rest_client_rate_limiter_duration_seconds`.
pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// `code` label value for requests that failed without an HTTP response
/// (connection refused, TLS failure, timeout), as in client-go.
pub(crate) const ERROR_CODE_LABEL: &str = "<error>";

/// Depth of the queue in front of kube's (non-cloneable) HTTP stack; it lets
/// the limiter wait per request instead of blocking the whole client.
const BUFFER_CAPACITY: usize = 1024;

/// How to reach the API server and how fast to talk to it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientOptions {
    /// Sustained requests per second across the whole process. Fractions are
    /// allowed (`0.5` = one request every two seconds). `qps <= 0` (or
    /// infinity) disables client-side rate limiting entirely, as client-go
    /// does for a negative QPS.
    pub qps: f32,
    /// Requests that may be sent back to back before pacing starts. A burst
    /// of 0 with a positive QPS is treated as 1 (client-go would reject every
    /// request instead).
    pub burst: u32,
    /// Explicit kubeconfig file. `None` infers the configuration: `KUBECONFIG`
    /// or `~/.kube/config`, then the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context other than the current one.
    pub context: Option<String>,
    /// kubectl's connection flags (the admin tools take them).
    pub overrides: ConnectionOverrides,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            qps: DEFAULT_QPS,
            burst: DEFAULT_BURST,
            kubeconfig: None,
            context: None,
            overrides: ConnectionOverrides::default(),
        }
    }
}

/// Builds the process-wide client: configuration from `opts`, one token
/// bucket for all requests, and the `rest_client_*` metrics registered in
/// `registry`.
///
/// Clone the returned client rather than calling this twice: each call makes
/// its own bucket, and registering the metrics a second time in the same
/// registry fails.
pub async fn build_client(
    opts: &ClientOptions,
    registry: &Registry,
) -> anyhow::Result<(kube::Client, Drain)> {
    let mut config = load_config(opts).await?;
    // No retries inside the client (the transport adds no retry layer, and
    // this says so to anything else that reads the configuration). kube's
    // default policy re-sends any request, POST included, on 429/503/504: a
    // create that committed before a 504 came back would then make a second
    // claim. Failed syncs are retried by the work queue with backoff, on
    // fresh state, instead.
    config.default_retry = false;
    // kube sends no User-Agent of its own: without one, audit logs, API
    // server metrics and API priority and fairness cannot tell our
    // requests from anyone else's.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&user_agent()).context("User-Agent header")?,
    ));

    let metrics = ClientMetrics::new();
    metrics
        .register(registry)
        .context("registering rest_client metrics (build one client per registry and clone it)")?;

    // client-go's `host` label is the URL's host[:port].
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let drain = Drain::default();
    let layer =
        ClientLayer::new(opts.qps, opts.burst, metrics, host.clone())?.with_drain(drain.clone());

    tracing::info!(
        %host,
        qps = opts.qps,
        burst = opts.burst,
        rate_limited = layer.is_rate_limited(),
        "built Kubernetes client"
    );

    let transport = super::transport::service(&config)
        .context("building the Kubernetes client from its configuration")?;
    let client = ClientBuilder::new(transport, config.default_namespace.clone())
        // kube's stack is a BoxService (not Clone); the buffer gives the
        // limiter a cloneable handle so one slow token does not stall the
        // dispatch of others.
        .with_layer(&BufferLayer::<Request<kube::client::Body>>::new(
            BUFFER_CAPACITY,
        ))
        .with_layer(&layer)
        .build();
    Ok((client, drain))
}

/// Stops new requests at a clean shutdown, so that a replica handing over
/// its lease does not keep writing while its successor starts.
///
/// Once [`start`](Self::start)ed, a request that has not been sent yet
/// (waiting for a token, or not issued) is refused with an error instead
/// of being sent; requests already on the wire are answered as usual.
/// Lease requests are exempt: the release must still go out. A sync cut
/// short this way is redone by the next leader (claims are adopted before
/// any is created, and every status write is guarded).
#[derive(Clone, Debug, Default)]
pub struct Drain(Arc<tokio::sync::watch::Sender<bool>>);

impl Drain {
    pub fn start(&self) {
        self.0.send_replace(true);
    }

    pub(crate) fn is_draining(&self) -> bool {
        *self.0.borrow()
    }

    async fn started(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }
}

/// The error of a request refused by a [`Drain`].
#[derive(Debug)]
pub(crate) struct NotSent;

impl fmt::Display for NotSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request not sent: shutting down")
    }
}

impl std::error::Error for NotSent {}

/// `dra-claim-controller/v<version> (<os>/<arch>)`, spelled as client-go's
/// components spell theirs (Go's names for the architecture).
pub(crate) fn user_agent() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    };
    format!(
        "dra-claim-controller/v{} ({}/{arch})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS
    )
}

/// Loads the client configuration: the explicit kubeconfig if given,
/// otherwise kube's inference (KUBECONFIG / ~/.kube/config, then in-cluster).
async fn load_config(opts: &ClientOptions) -> anyhow::Result<kube::Config> {
    let mut config = load_kubeconfig(opts).await?;
    opts.overrides.apply(&mut config)?;
    Ok(config)
}

async fn load_kubeconfig(opts: &ClientOptions) -> anyhow::Result<kube::Config> {
    let options = KubeConfigOptions {
        context: opts.context.clone(),
        cluster: opts.overrides.cluster.clone(),
        user: opts.overrides.user.clone(),
    };
    if let Some(path) = &opts.kubeconfig {
        let kubeconfig = Kubeconfig::read_from(path)
            .with_context(|| format!("reading kubeconfig {}", path.display()))?;
        return kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .with_context(|| format!("loading kubeconfig {}", path.display()));
    }
    if opts.context.is_some() || opts.overrides.names_kubeconfig_entries() {
        return kube::Config::from_kubeconfig(&options).await.context(
            "loading the context, cluster or user asked for from $KUBECONFIG or ~/.kube/config",
        );
    }
    kube::Config::infer().await.map_err(|err| {
        // kube's error lists both sources that failed; say what to do about it.
        anyhow::anyhow!(
            "no usable Kubernetes client configuration found: set KUBECONFIG, pass --kubeconfig, \
             or run inside a cluster with a service account ({err})"
        )
    })
}

/// Turns QPS/burst into a governor quota; `None` means unlimited.
///
/// The quota replenishes one token every `1/qps` seconds (so fractional QPS
/// works) and holds at most `burst` tokens, like client-go's token bucket.
pub fn quota(qps: f32, burst: u32) -> anyhow::Result<Option<Quota>> {
    if qps.is_nan() {
        bail!("invalid client QPS: NaN");
    }
    if qps <= 0.0 || qps.is_infinite() {
        return Ok(None);
    }
    let Ok(period) = Duration::try_from_secs_f64(1.0 / f64::from(qps)) else {
        bail!("client QPS {qps} is too small to express as a refill period");
    };
    // A period that rounds to zero nanoseconds is indistinguishable from no limit.
    let Some(quota) = Quota::with_period(period) else {
        return Ok(None);
    };
    let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
    Ok(Some(quota.allow_burst(burst)))
}

/// Tower layer: waits for a token from the shared bucket, then sends the
/// request and records the `rest_client_*` metrics.
#[derive(Clone)]
pub(crate) struct ClientLayer {
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
    /// One waiter at a time at the bucket, the others queued by class
    /// (start-up before cleanup), each class in arrival order. governor's
    /// own wait is not fair: under a full bucket, every waiter polls and the
    /// unlucky ones wait far longer than the queue is deep. client-go's
    /// limiter hands out tokens in order.
    turns: Turns,
    metrics: ClientMetrics,
    host: Arc<str>,
    drain: Drain,
}

impl fmt::Debug for ClientLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientLayer")
            .field("rate_limited", &self.limiter.is_some())
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

impl ClientLayer {
    /// `host` labels requests whose URI carries no authority (kube adds the
    /// cluster URL further down the stack).
    pub(crate) fn new(
        qps: f32,
        burst: u32,
        metrics: ClientMetrics,
        host: impl Into<String>,
    ) -> anyhow::Result<Self> {
        let limiter = quota(qps, burst)?.map(|q| Arc::new(RateLimiter::direct(q)));
        Ok(Self {
            limiter,
            turns: Turns::default(),
            metrics,
            host: host.into().into(),
            drain: Drain::default(),
        })
    }

    /// Requests are refused once `drain` has started (see [`Drain`]).
    pub(crate) fn with_drain(mut self, drain: Drain) -> Self {
        self.drain = drain;
        self
    }

    /// Whether requests wait for tokens at all.
    pub(crate) fn is_rate_limited(&self) -> bool {
        self.limiter.is_some()
    }

    /// Waits for a token: start-up work first, each class in arrival order.
    async fn next_token(&self, limiter: &DefaultDirectRateLimiter, priority: Priority) {
        let _turn = self.turns.take(priority).await;
        limiter.until_ready().await;
    }
}

impl<S> Layer<S> for ClientLayer {
    type Service = ClientService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientService {
            inner,
            layer: self.clone(),
        }
    }
}

/// Service produced by [`ClientLayer`].
#[derive(Clone, Debug)]
pub(crate) struct ClientService<S> {
    inner: S,
    layer: ClientLayer,
}

/// Requests of the leader election (coordination.k8s.io Leases).
pub(crate) fn is_lease_request(uri: &http::Uri) -> bool {
    uri.path().starts_with("/apis/coordination.k8s.io/")
}

/// Event writes: they have a budget of their own (`runtime::events`), so
/// that a burst of warnings never delays a claim write.
pub(crate) fn is_event_request(uri: &http::Uri) -> bool {
    let path = uri.path();
    path.starts_with("/apis/events.k8s.io/")
        || (path.starts_with("/api/v1/namespaces/") && path.split('/').nth(5) == Some("events"))
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, B, RB> Service<Request<B>> for ClientService<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: From<tower::BoxError> + Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Always ready: the token wait and the inner readiness happen inside
        // the response future, per request, so no caller blocks another's
        // dispatch.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let layer = self.layer.clone();
        // Read here, in the caller's task, where its class is set.
        let priority = priority::current();
        Box::pin(async move {
            let method = req.method().as_str().to_owned();
            let host = req
                .uri()
                .authority()
                .map(|a| a.as_str().to_owned())
                .unwrap_or_else(|| layer.host.to_string());
            let labels = [method.as_str(), host.as_str()];

            let exempt = is_lease_request(req.uri());
            let refuse = || S::Error::from(Box::new(NotSent) as tower::BoxError);
            if !exempt && layer.drain.is_draining() {
                return Err(refuse());
            }
            if let Some(limiter) = layer
                .limiter
                .as_ref()
                .filter(|_| !is_event_request(req.uri()))
            {
                let waiting = Instant::now();
                if exempt {
                    // Lease renewals count against the budget but never
                    // queue behind a backlog of claim work: a renewal that
                    // waits past the renew deadline would make the leader
                    // step down (kube-controller-manager gives its election
                    // a client of its own for the same reason).
                    let _ = limiter.check();
                } else {
                    tokio::select! {
                        _ = layer.next_token(limiter, priority) => {}
                        // Not sent yet: abandoned at once on shutdown.
                        _ = layer.drain.started() => return Err(refuse()),
                    }
                }
                let waited = waiting.elapsed().as_secs_f64();
                layer
                    .metrics
                    .rate_limiter_duration
                    .with_label_values(&labels)
                    .observe(waited);
                layer
                    .metrics
                    .priority_wait
                    .with_label_values(&[priority.label()])
                    .observe(waited);
            }

            // Latency is measured from after the token to response headers,
            // matching client-go (throttling is reported separately above).
            let sent = Instant::now();
            let result = inner.oneshot(req).await;
            layer
                .metrics
                .request_duration
                .with_label_values(&labels)
                .observe(sent.elapsed().as_secs_f64());

            let code = match &result {
                Ok(resp) => resp.status().as_u16().to_string(),
                Err(_) => ERROR_CODE_LABEL.to_owned(),
            };
            layer
                .metrics
                .requests
                .with_label_values(&[code.as_str(), host.as_str(), method.as_str()])
                .inc();
            result
        })
    }
}

#[cfg(test)]
mod tests;
