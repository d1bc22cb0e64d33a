//! The HTTP transport under the Kubernetes client: how connections are
//! made, checked and given up, and how long any one request may wait.
//!
//! A network can fail without saying so: a NAT or conntrack entry expires,
//! a load balancer drops a flow without a reset, a proxy stops forwarding
//! and keeps both sockets open. A request on such a connection never gets
//! an answer, and a connection pool happily hands the dead connection to
//! the next request. Four things keep that from holding the controller:
//!
//! 1. **HTTP/2 with health checks** where the API server offers it (ALPN
//!    over TLS, as client-go): one connection carries every request and
//!    watch, and after [`H2_READ_IDLE`] without a frame a PING goes out;
//!    no answer within [`H2_PING_TIMEOUT`] closes the connection, every
//!    stream on it fails at once and the next request opens a fresh one.
//!    Leader election rides the same connection, so a leader whose work
//!    cannot get through cannot renew either.
//! 2. **A deadline for every request, by kind** ([`Deadlines::for_kind`]):
//!    response headers of a write, of a read, the first byte of a watch, and
//!    the whole body of anything that is not a watch. A request past its
//!    deadline fails with [`TimedOut`], which the error kinds of
//!    [`super::error`] treat as "no answer" (retried with backoff, the
//!    outage gate of [`super::reachability`]). A watch's silence later on is
//!    bounded by the informer ([`super::informer`]).
//! 3. **The connection of a timed-out request is poisoned**: it is never
//!    handed out again, so a retry goes out on another connection (hyper
//!    also closes an HTTP/1.1 connection whose answer was abandoned).
//! 4. **TCP settings for real networks**: connect timeout, keepalive
//!    probes that keep NAT entries alive and find dead peers on idle
//!    HTTP/1.1 connections, `TCP_USER_TIMEOUT` for data nobody
//!    acknowledges, and a short idle time for pooled connections.
//!
//! The values are constants: they are about networks, not about a cluster's
//! size, and each is argued for where it is defined.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Method, Request, Response};
use hyper_util::client::legacy::connect::{CaptureConnection, HttpConnector, capture_connection};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};

/// TCP connect. A live API server accepts in milliseconds; past this the
/// address is unreachable or blackholed, and the next attempt may pick a
/// healthy endpoint behind the same name.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle time before the first TCP keepalive probe. Shorter than the idle
/// timeouts of common NATs and load balancers (60 s and up), so an idle
/// HTTP/1.1 connection keeps its entry.
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
/// Pause between unanswered keepalive probes.
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the kernel drops the connection: a dead idle
/// peer is found 30 s after the last traffic.
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;
/// How long sent data may stay unacknowledged before the kernel drops the
/// connection (`TCP_USER_TIMEOUT`). Keepalive probes only run on idle
/// connections; this covers one with a request in flight.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// Read silence on an HTTP/2 connection before it is checked with a PING
/// (client-go: 30 s). Short, because a dead connection holds every watch and
/// every write of the process; a busy connection never pings (frames keep
/// arriving), an idle one sends a 17-byte frame this often.
pub const H2_READ_IDLE: Duration = Duration::from_secs(3);
/// How long a PING may go unanswered before the connection is closed
/// (client-go: 15 s). Go's HTTP/2 server answers PINGs from the
/// connection's own reader and writes control frames ahead of data, so a
/// healthy server answers in milliseconds even when loaded; a lost packet
/// is retransmitted several times within this. A dead connection is found
/// at most `H2_READ_IDLE + H2_PING_TIMEOUT` (6 s) after its last frame. A
/// false alarm costs one reconnect: watches resume from their last version.
pub const H2_PING_TIMEOUT: Duration = Duration::from_secs(3);

/// How long an unused HTTP/1.1 connection stays in the pool. The pool cannot
/// tell a live idle connection from one a middlebox dropped; one that idled
/// this long is closed rather than trusted with the next request.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Response headers of a write (create, update, patch, delete). kube-apiserver
/// answers a write in milliseconds to a second; one that has not answered in
/// 10 s is either gone or overloaded past the point where waiting helps, and
/// the work queue retries on fresh state with backoff.
pub const WRITE_HEADERS: Duration = Duration::from_secs(10);
/// Response headers of a read (get, list page). Reads may be queued by the
/// server's priority and fairness a little longer than writes, and a list
/// page is encoded before its first byte.
pub const READ_HEADERS: Duration = Duration::from_secs(15);
/// Response headers of a watch: kube-apiserver sends them before the first
/// event, as soon as the watch is registered.
pub const WATCH_FIRST_BYTE: Duration = Duration::from_secs(10);
/// The whole answer of anything but a watch, from the moment it was sent.
/// kube-apiserver gives up on a request after 60 s itself
/// (`--request-timeout`), so a body still arriving after that comes over a
/// connection that is failing.
pub const WHOLE_ANSWER: Duration = Duration::from_secs(60);

/// What a request is, as far as its deadline goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestKind {
    /// `?watch=true` (or the legacy `/watch/` paths): a stream.
    Watch,
    /// GET, HEAD, OPTIONS.
    Read,
    /// Anything that changes state.
    Write,
}

impl RequestKind {
    /// Classifies a request from its method and URI.
    pub(crate) fn of(method: &Method, uri: &http::Uri) -> Self {
        let watch_param = uri.query().is_some_and(|q| {
            q.split('&')
                .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True"))
        });
        let watch_path = uri.path().split('/').any(|segment| segment == "watch");
        if *method == Method::GET && (watch_param || watch_path) {
            RequestKind::Watch
        } else if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            RequestKind::Read
        } else {
            RequestKind::Write
        }
    }

    fn label(self) -> &'static str {
        match self {
            RequestKind::Watch => "watch",
            RequestKind::Read => "read",
            RequestKind::Write => "write",
        }
    }
}

/// How long one request may take: until its response headers, and (for all
/// but watches) until the last byte of its body, both counted from the send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    pub headers: Duration,
    /// `None`: the body is a stream whose silence the informer bounds.
    pub whole: Option<Duration>,
}

/// The deadline of each [`RequestKind`]. The default is the constants above;
/// tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadlines {
    pub write_headers: Duration,
    pub read_headers: Duration,
    pub watch_first_byte: Duration,
    pub whole_answer: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            write_headers: WRITE_HEADERS,
            read_headers: READ_HEADERS,
            watch_first_byte: WATCH_FIRST_BYTE,
            whole_answer: WHOLE_ANSWER,
        }
    }
}

impl Deadlines {
    pub(crate) fn for_kind(&self, kind: RequestKind) -> Deadline {
        match kind {
            RequestKind::Watch => Deadline {
                headers: self.watch_first_byte,
                whole: None,
            },
            RequestKind::Read => Deadline {
                headers: self.read_headers,
                whole: Some(self.whole_answer),
            },
            RequestKind::Write => Deadline {
                headers: self.write_headers,
                whole: Some(self.whole_answer),
            },
        }
    }
}

/// Which part of the answer did not arrive in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missed {
    Headers,
    WholeAnswer,
}

/// A request that ran past its [`Deadline`]. Its connection was poisoned:
/// no later request is sent on it.
#[derive(Debug, Clone)]
pub(crate) struct TimedOut {
    pub kind: RequestKind,
    pub missed: Missed,
    pub after: Duration,
    pub method: Method,
    pub path: String,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.missed {
            Missed::Headers => "no response headers",
            Missed::WholeAnswer => "the answer did not end",
        };
        write!(
            f,
            "{what} within {}s for {} {} ({} deadline); the connection will not be used again",
            self.after.as_secs(),
            self.method,
            self.path,
            self.kind.label()
        )
    }
}

impl std::error::Error for TimedOut {}

/// Puts a [`DeadlineService`] around a transport.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DeadlineLayer {
    deadlines: Deadlines,
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService {
            inner,
            deadlines: self.deadlines,
        }
    }
}

/// Bounds every request by its [`Deadline`] and poisons the connection of
/// one that ran past it.
#[derive(Debug, Clone)]
pub(crate) struct DeadlineService<S> {
    inner: S,
    deadlines: Deadlines,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for DeadlineService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<DeadlineBody<ResBody>>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let kind = RequestKind::of(req.method(), req.uri());
        let deadline = self.deadlines.for_kind(kind);
        let connection = capture_connection(&mut req);
        let timed_out = TimedOutTemplate {
            kind,
            method: req.method().clone(),
            path: req.uri().path().to_owned(),
        };
        let sent = Instant::now();
        let answer = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(deadline.headers, answer).await {
                Ok(Ok(response)) => {
                    let give_up_at = deadline.whole.map(|whole| (sent + whole, whole));
                    Ok(response.map(|body| DeadlineBody {
                        inner: body,
                        give_up: give_up_at.map(|(at, whole)| GiveUp {
                            sleep: Box::pin(tokio::time::sleep_until(at)),
                            after: whole,
                            connection,
                            timed_out,
                        }),
                    }))
                }
                Ok(Err(err)) => Err(err.into()),
                Err(_) => {
                    poison(&connection);
                    Err(Box::new(timed_out.missed(Missed::Headers, deadline.headers)) as BoxError)
                }
            }
        })
    }
}

/// Marks the connection a request went out on as not to be used again.
/// A request that never got a connection (still connecting) has none.
fn poison(connection: &CaptureConnection) {
    if let Some(connected) = connection.connection_metadata().as_ref() {
        connected.poison();
    }
}

#[derive(Debug, Clone)]
struct TimedOutTemplate {
    kind: RequestKind,
    method: Method,
    path: String,
}

impl TimedOutTemplate {
    fn missed(self, missed: Missed, after: Duration) -> TimedOut {
        TimedOut {
            kind: self.kind,
            missed,
            after,
            method: self.method,
            path: self.path,
        }
    }
}

struct GiveUp {
    sleep: Pin<Box<Sleep>>,
    after: Duration,
    connection: CaptureConnection,
    timed_out: TimedOutTemplate,
}

/// A response body that fails with [`TimedOut`] once its request's whole
/// deadline has passed (no deadline for watch streams).
pub struct DeadlineBody<B> {
    inner: B,
    give_up: Option<GiveUp>,
}

impl<B> fmt::Debug for DeadlineBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineBody")
            .field("bounded", &self.give_up.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> http_body::Body for DeadlineBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if let Some(give_up) = this.give_up.as_mut() {
            ready!(give_up.sleep.as_mut().poll(cx));
            poison(&give_up.connection);
            let err = give_up
                .timed_out
                .clone()
                .missed(Missed::WholeAnswer, give_up.after);
            this.give_up = None;
            return Poll::Ready(Some(Err(Box::new(err))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The connector: TCP with the settings above (through the kubeconfig's
/// `proxy-url`, if any: [`proxy`]), then TLS offering HTTP/2 and HTTP/1.1
/// (the server picks; plain `http://` URLs speak HTTP/1.1).
fn connector(config: &kube::Config) -> anyhow::Result<hyper_rustls::HttpsConnector<proxy::Dial>> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
    tcp.set_keepalive(Some(TCP_KEEPALIVE_IDLE));
    tcp.set_keepalive_interval(Some(TCP_KEEPALIVE_INTERVAL));
    tcp.set_keepalive_retries(Some(TCP_KEEPALIVE_RETRIES));
    tcp.set_tcp_user_timeout(Some(TCP_USER_TIMEOUT));
    let proxy = match &config.proxy_url {
        Some(url) => Some(proxy::parse(&url.to_string())?),
        None => proxy::from_environment(&config.cluster_url, |name| std::env::var(name).ok())?,
    };
    let dial = proxy::Dial::new(tcp, proxy)?;
    let tls = config
        .rustls_client_config()
        .context("TLS settings of the client configuration")?;
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    // The kubeconfig's tls-server-name: the name the certificate is checked
    // against when it differs from the host in the server URL.
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .with_context(|| format!("tls-server-name {name:?} of the kubeconfig"))?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    Ok(builder.enable_http1().enable_http2().wrap_connector(dial))
}

/// The pooled HTTP client over [`connector`], with HTTP/2 health checks.
pub(crate) fn http_client<C>(connector: C) -> hyper_util::client::legacy::Client<C, Body>
where
    C: tower::Service<http::Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper_util::client::legacy::connect::Connection
        + hyper::rt::Read
        + hyper::rt::Write
        + Send
        + Unpin
        + 'static,
    C::Future: Send + Unpin + 'static,
    C::Error: Into<BoxError>,
{
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .http2_keep_alive_interval(H2_READ_IDLE)
        .http2_keep_alive_timeout(H2_PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector)
}

/// The response body type the client stack hands to kube.
pub(crate) type ClientBody = DeadlineBody<hyper::body::Incoming>;

/// The transport [`service`] builds, as the client's bottom layer.
pub(crate) type ClientTransport =
    tower::util::BoxService<Request<Body>, Response<ClientBody>, BoxError>;

/// The whole transport for `config`: connector, pooled client, deadlines,
/// then what kube's own stack adds (base URI, authentication, the
/// configured headers such as User-Agent and impersonation). Unlike kube's
/// default stack, nothing here retries: the work queue retries on fresh
/// state (a create re-sent after a lost 504 would make a second claim).
pub fn service(config: &kube::Config) -> anyhow::Result<ClientTransport> {
    let client = http_client(connector(config)?);
    let auth = config
        .auth_layer()
        .context("authentication settings of the client configuration")?;
    let headers = config
        .extra_headers_layer()
        .context("extra headers of the client configuration")?;
    Ok(ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(auth)
        .layer(headers)
        .layer(DeadlineLayer::default())
        .service(client.map_err(BoxError::from))
        .boxed())
}

pub mod proxy;
#[cfg(test)]
mod tests;
