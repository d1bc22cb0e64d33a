//! A fault-injecting reverse proxy between the controller and the API server.
//!
//! It listens on 127.0.0.1 in plain HTTP, forwards every request to the API
//! server over HTTPS (trusting the harness CA) with the client's own bearer
//! token, and, according to a [`FaultPlan`], answers a share of the requests
//! itself instead:
//!
//! - ordinary requests: `409 Conflict`, `429 Too Many Requests` (with
//!   `Retry-After: 1`), `500`, `503`, or held without an answer (~30 s) and
//!   then dropped, as a server that stopped answering would, or held a few
//!   seconds and answered `504` (a load balancer giving up);
//! - watch requests never get those. Instead a share is answered the way
//!   kube-apiserver answers a watch from a resourceVersion it no longer has
//!   (HTTP 200 and one `ERROR` event carrying a `410 Expired` Status, which
//!   makes kube-runtime's watcher relist), a share with a bare HTTP 410
//!   (kube-apiserver never answers a watch that way; kube-runtime 5 treats
//!   it as a failed watch start and retries the same resourceVersion, so
//!   this only checks that the watcher recovers), and a share of the
//!   forwarded watch streams is cut mid-stream after a few seconds (the
//!   client sees an unexpected EOF and resumes from its last version);
//! - a share of the forwarded watch streams stalls after a while: the proxy
//!   stops forwarding bytes but keeps the connection open, as an overloaded
//!   proxy, a load balancer or a half-open TCP connection does (the client
//!   sees neither data nor an end); [`FaultProxy::stall_open_watches`]
//!   stalls every stream open at that moment;
//! - optionally, claim creations are forwarded but their answer replaced by
//!   an error: the claim exists, the controller does not know it.
//!
//! Every fault is counted by kind, so a test can say what it survived.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::Rng;
use serde_json::json;
use tokio::net::TcpListener;

mod stream;
use stream::{StreamFaults, watch_body};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;
type Upstream = HttpClient<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Shares are per mille of the requests of their class.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// Ordinary (non-watch) requests answered `409 Conflict`.
    pub conflict: u32,
    /// … answered `429` with `Retry-After: 1`.
    pub too_many: u32,
    /// … answered `500`.
    pub internal: u32,
    /// … answered `503`.
    pub unavailable: u32,
    /// … held for `hold_for`, then the connection is dropped unanswered.
    pub hold: u32,
    pub hold_for: Duration,
    /// … held for `timeout_after`, then answered `504 Gateway Timeout` (a
    /// load balancer giving up on a slow server; nothing was forwarded).
    pub timeout: u32,
    pub timeout_after: Duration,
    /// Watch requests answered with HTTP 200 and a `410 Expired` ERROR event.
    pub gone_event: u32,
    /// Watch requests answered with a bare HTTP 410.
    pub gone_http: u32,
    /// Forwarded watch streams cut after a random time in `cut_after`.
    pub cut: u32,
    pub cut_after: (Duration, Duration),
    /// Forwarded watch streams that, after a random time in `cut_after`,
    /// pass on the first half of the next chunk and then end cleanly: a
    /// body that ends inside a message (a connection closed mid-frame).
    pub truncate: u32,
    /// Forwarded watch streams that go silent (connection kept open) after
    /// a random time in `stall_after`.
    pub stall: u32,
    pub stall_after: (Duration, Duration),
    /// Every watch event reaches the client this much later than the API
    /// server sent it (a lagging watch, as under load).
    pub watch_lag: Duration,
    /// When not empty, only watches whose path contains one of these lag
    /// (one watch behind another, as when one resource's watch cache is
    /// slow).
    pub watch_lag_only: Vec<String>,
    /// Claim creations (POST …/resourceclaims) forwarded, so the claim is
    /// created, but answered with `lost_create_code` instead of the real
    /// answer: a response lost after the write committed.
    pub lost_create: u32,
    pub lost_create_code: u16,
    /// Requests whose path contains one of these are never faulted.
    pub spare: Vec<String>,
    /// When not empty, only requests whose path contains one of these are
    /// faulted (a single kind of write failing, say).
    pub only: Vec<String>,
}

/// Faults injected so far, by kind.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub requests: AtomicU64,
    pub watches: AtomicU64,
    pub conflict: AtomicU64,
    pub too_many: AtomicU64,
    pub internal: AtomicU64,
    pub unavailable: AtomicU64,
    pub hold: AtomicU64,
    pub timeout: AtomicU64,
    pub gone_event: AtomicU64,
    pub gone_http: AtomicU64,
    pub cut: AtomicU64,
    pub truncated: AtomicU64,
    pub stall: AtomicU64,
    pub lost_create: AtomicU64,
    /// Requests that could not be forwarded (API server down).
    pub upstream_errors: AtomicU64,
}

/// A snapshot of [`FaultCounts`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Counted {
    pub requests: u64,
    pub watches: u64,
    pub conflict: u64,
    pub too_many: u64,
    pub internal: u64,
    pub unavailable: u64,
    pub hold: u64,
    pub timeout: u64,
    pub gone_event: u64,
    pub gone_http: u64,
    pub cut: u64,
    pub truncated: u64,
    pub stall: u64,
    pub lost_create: u64,
    pub upstream_errors: u64,
}

impl Counted {
    /// Faults injected by the proxy, of every kind.
    pub fn faults(&self) -> u64 {
        self.conflict
            + self.too_many
            + self.internal
            + self.unavailable
            + self.hold
            + self.timeout
            + self.cut
            + self.truncated
            + self.stall
            + self.gone_event
            + self.gone_http
            + self.lost_create
    }
}

impl FaultCounts {
    pub fn snapshot(&self) -> Counted {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counted {
            requests: g(&self.requests),
            watches: g(&self.watches),
            conflict: g(&self.conflict),
            too_many: g(&self.too_many),
            internal: g(&self.internal),
            unavailable: g(&self.unavailable),
            hold: g(&self.hold),
            timeout: g(&self.timeout),
            gone_event: g(&self.gone_event),
            gone_http: g(&self.gone_http),
            cut: g(&self.cut),
            truncated: g(&self.truncated),
            stall: g(&self.stall),
            lost_create: g(&self.lost_create),
            upstream_errors: g(&self.upstream_errors),
        }
    }
}

struct State {
    upstream: Upstream,
    upstream_url: String,
    plan: FaultPlan,
    counts: Arc<FaultCounts>,
    enabled: AtomicBool,
    /// Bumped by [`FaultProxy::stall_open_watches`]: every watch stream
    /// started before the bump goes silent.
    stall_epoch: tokio::sync::watch::Sender<u64>,
    /// Every distinct `User-Agent` the client sent.
    user_agents: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Requests (method, path substring) held unanswered and never
    /// forwarded: a write that never reaches the server, so a test can kill
    /// the client between two of its writes.
    blocked: std::sync::Mutex<Option<(http::Method, String)>>,
    blocked_seen: AtomicU64,
    /// Requests (method, path substring) held until the test releases them,
    /// then forwarded: a write that reaches the server late, so a test can
    /// change the object between a client's read and its write.
    delayed: std::sync::Mutex<Option<(http::Method, String)>>,
    delayed_seen: AtomicU64,
    /// Opened by [`FaultProxy::release_delayed`].
    delay_released: tokio::sync::watch::Sender<bool>,
    /// Every list read, in order (a few per watch and relist).
    lists: std::sync::Mutex<Vec<ListRead>>,
    /// Every watch request: its path and the media types it accepts.
    watches: std::sync::Mutex<Vec<(String, String)>>,
    /// `GET /version` answered with this `gitVersion` (e.g. `v1.38.0`)
    /// instead of the API server's: a cluster of a release the test bed
    /// does not have.
    version: std::sync::Mutex<Option<String>>,
}

/// One list read the proxy forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListRead {
    /// A streaming list; otherwise a page.
    pub streaming: bool,
    pub path: String,
}

/// A running proxy; it stops when dropped.
pub struct FaultProxy {
    pub addr: SocketAddr,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream_url` (an `https://` URL whose
    /// certificate `ca` signed), injecting faults per `plan`.
    pub async fn start(upstream_url: &str, ca: &Path, plan: FaultPlan) -> anyhow::Result<Self> {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca)
            .with_context(|| format!("read CA {}", ca.display()))?
        {
            roots.add(cert?)?;
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        let upstream = HttpClient::builder(TokioExecutor::new()).build(https);

        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            upstream,
            upstream_url: upstream_url.trim_end_matches('/').to_string(),
            plan,
            counts: Arc::default(),
            enabled: AtomicBool::new(true),
            stall_epoch: tokio::sync::watch::Sender::new(0),
            user_agents: Default::default(),
            blocked: Default::default(),
            blocked_seen: AtomicU64::new(0),
            delayed: Default::default(),
            delayed_seen: AtomicU64::new(0),
            delay_released: tokio::sync::watch::Sender::new(false),
            lists: Default::default(),
            watches: Default::default(),
            version: Default::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, state.clone()));
        Ok(Self {
            addr,
            state,
            accept,
        })
    }

    pub fn counts(&self) -> Counted {
        self.state.counts.snapshot()
    }

    /// The distinct `User-Agent` headers of the requests so far (`""` for
    /// a request without one).
    pub fn user_agents(&self) -> Vec<String> {
        self.state
            .user_agents
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .collect()
    }

    /// From now on `GET /version` answers `git_version` (`v1.38.0`, say),
    /// with the major and minor fields taken from it; every other request
    /// goes on to the API server.
    pub fn answer_version(&self, git_version: &str) {
        *self.state.version.lock().unwrap() = Some(git_version.to_string());
    }

    /// Every watch stream open now stops delivering bytes, its connection
    /// kept open; streams started later are forwarded as usual.
    pub fn stall_open_watches(&self) {
        self.state.stall_epoch.send_modify(|e| *e += 1);
    }

    /// From now on, `method` requests whose path contains `path` are held
    /// without an answer and never forwarded (faults on or off).
    pub fn block(&self, method: http::Method, path: &str) {
        *self.state.blocked.lock().unwrap() = Some((method, path.to_string()));
    }

    /// Forwards blocked requests again (those held stay held).
    pub fn unblock(&self) {
        *self.state.blocked.lock().unwrap() = None;
    }

    /// How many requests were held by [`FaultProxy::block`].
    pub fn blocked_requests(&self) -> u64 {
        self.state.blocked_seen.load(Ordering::SeqCst)
    }

    /// From now on, `method` requests whose path ends with `path` are held
    /// until [`FaultProxy::release_delayed`], then forwarded as sent (the
    /// end, so that `/resourceclaims/c` holds the claim's metadata writes
    /// and lets its `/status` writes through).
    pub fn delay(&self, method: http::Method, path: &str) {
        self.state.delay_released.send_replace(false);
        *self.state.delayed.lock().unwrap() = Some((method, path.to_string()));
    }

    /// Forwards the requests held by [`FaultProxy::delay`] and stops holding.
    pub fn release_delayed(&self) {
        *self.state.delayed.lock().unwrap() = None;
        self.state.delay_released.send_replace(true);
    }

    /// How many requests [`FaultProxy::delay`] held.
    pub fn delayed_requests(&self) -> u64 {
        self.state.delayed_seen.load(Ordering::SeqCst)
    }

    /// The list reads forwarded so far, in order.
    pub fn list_reads(&self) -> Vec<ListRead> {
        self.state.lists.lock().unwrap().clone()
    }

    /// The watch requests so far, in order: path and `Accept` header.
    pub fn watch_requests(&self) -> Vec<(String, String)> {
        self.state.watches.lock().unwrap().clone()
    }

    /// Turns fault injection on or off; requests are forwarded either way.
    pub fn set_enabled(&self, on: bool) {
        self.state.enabled.store(on, Ordering::SeqCst);
    }

    /// Writes a kubeconfig that reaches the API server through this proxy,
    /// with the bearer token of the user in `original` (plain HTTP to the
    /// proxy: the token only travels over loopback).
    pub fn write_kubeconfig(&self, original: &Path, out: &Path) -> anyhow::Result<PathBuf> {
        let kc: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(original)?)?;
        let user = &kc["users"][0];
        let name = user["name"].as_str().context("kubeconfig without a user")?;
        let token = user["user"]["token"]
            .as_str()
            .context("kubeconfig user without a token")?;
        let doc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": format!("http://{}", self.addr)}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": name}}],
            "current-context": "proxy",
        });
        std::fs::write(out, serde_yaml::to_string(&doc)?)?;
        Ok(out.to_path_buf())
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of file descriptors or similar: do not spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
            // Errors here are the faults themselves (held requests dropped,
            // watches cut) or the client going away.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// What to do with one request.
enum Verdict {
    Forward {
        cut_after: Option<Duration>,
        truncate_after: Option<Duration>,
        stall_after: Option<Duration>,
    },
    ForwardThenFail(StatusCode),
    Status(StatusCode, &'static str),
    Hold(Duration),
    /// Held until the test releases it, then forwarded.
    Delay,
    LateStatus(Duration, StatusCode, &'static str),
    GoneEvent,
}

fn has_query_pair(req: &Request<Incoming>, wanted: impl Fn(&str) -> bool) -> bool {
    req.uri().query().is_some_and(|q| q.split('&').any(&wanted))
}

/// A request that reads a list: a streaming list (a watch asking for the
/// initial events) or a page of one (a GET with `limit`).
fn list_read(req: &Request<Incoming>, watch: bool) -> Option<ListRead> {
    let streaming = watch && has_query_pair(req, |kv| kv == "sendInitialEvents=true");
    let page = !watch
        && req.method() == http::Method::GET
        && has_query_pair(req, |kv| kv.starts_with("limit="));
    (streaming || page).then(|| ListRead {
        streaming,
        path: req.uri().path().to_string(),
    })
}

fn is_watch(req: &Request<Incoming>) -> bool {
    has_query_pair(req, |kv| kv == "watch=true" || kv == "watch=1")
}

/// Whether a request (never a watch) falls under a test's hold: same
/// method, and a path `fits` the one the test named.
fn held_by(
    slot: &std::sync::Mutex<Option<(http::Method, String)>>,
    method: &http::Method,
    path: &str,
    fits: fn(&str, &str) -> bool,
) -> bool {
    slot.lock()
        .unwrap()
        .as_ref()
        .is_some_and(|(m, p)| m == method && fits(path, p))
}

fn decide(state: &State, method: &http::Method, path: &str, watch: bool) -> Verdict {
    if !watch && held_by(&state.blocked, method, path, |path, p| path.contains(p)) {
        state.blocked_seen.fetch_add(1, Ordering::SeqCst);
        return Verdict::Hold(Duration::from_secs(3600));
    }
    if !watch && held_by(&state.delayed, method, path, |path, p| path.ends_with(p)) {
        state.delayed_seen.fetch_add(1, Ordering::SeqCst);
        return Verdict::Delay;
    }
    let plan = &state.plan;
    let c = &state.counts;
    let spared = plan.spare.iter().any(|s| path.contains(s))
        || (!plan.only.is_empty() && !plan.only.iter().any(|s| path.contains(s)));
    if !state.enabled.load(Ordering::SeqCst) || spared {
        return Verdict::Forward {
            cut_after: None,
            truncate_after: None,
            stall_after: None,
        };
    }
    let mut rng = rand::rng();
    let roll = rng.random_range(0..1000u32);
    let bump = |a: &AtomicU64| {
        a.fetch_add(1, Ordering::Relaxed);
    };
    if watch {
        let mut edge = plan.gone_event;
        if roll < edge {
            bump(&c.gone_event);
            return Verdict::GoneEvent;
        }
        edge += plan.gone_http;
        if roll < edge {
            bump(&c.gone_http);
            return Verdict::Status(StatusCode::GONE, "Expired");
        }
        let mut after = |share: u32, (lo, hi): (Duration, Duration)| {
            (rng.random_range(0..1000u32) < share).then(|| {
                if hi > lo {
                    rng.random_range(lo..hi)
                } else {
                    lo
                }
            })
        };
        let cut_after = after(plan.cut, plan.cut_after);
        // A stream is either cut, truncated or stalled, not two of them.
        let truncate_after = cut_after
            .is_none()
            .then(|| after(plan.truncate, plan.cut_after))
            .flatten();
        let stall_after = (cut_after.is_none() && truncate_after.is_none())
            .then(|| after(plan.stall, plan.stall_after))
            .flatten();
        return Verdict::Forward {
            cut_after,
            truncate_after,
            stall_after,
        };
    }
    let table = [
        (plan.conflict, &c.conflict, StatusCode::CONFLICT, "Conflict"),
        (
            plan.too_many,
            &c.too_many,
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
        ),
        (
            plan.internal,
            &c.internal,
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
        ),
        (
            plan.unavailable,
            &c.unavailable,
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
        ),
    ];
    let mut edge = 0;
    for (share, counter, code, reason) in table {
        edge += share;
        if roll < edge {
            bump(counter);
            return Verdict::Status(code, reason);
        }
    }
    edge += plan.hold;
    if roll < edge {
        bump(&c.hold);
        return Verdict::Hold(plan.hold_for);
    }
    edge += plan.timeout;
    if roll < edge {
        bump(&c.timeout);
        return Verdict::LateStatus(plan.timeout_after, StatusCode::GATEWAY_TIMEOUT, "Timeout");
    }
    if method == http::Method::POST
        && path.ends_with("/resourceclaims")
        && rng.random_range(0..1000u32) < plan.lost_create
    {
        bump(&c.lost_create);
        let code = StatusCode::from_u16(plan.lost_create_code)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Verdict::ForwardThenFail(code);
    }
    Verdict::Forward {
        cut_after: None,
        truncate_after: None,
        stall_after: None,
    }
}

fn status_json(code: StatusCode, reason: &str) -> serde_json::Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("injected by the e2e fault proxy: {reason}"),
        "reason": reason,
        "code": code.as_u16(),
    })
}

fn full(body: impl Into<Bytes>) -> ProxyBody {
    Full::new(body.into()).map_err(|e| match e {}).boxed()
}

/// A `/version` answer for `git_version` (`v1.38.0` → major "1", minor
/// "38"), as kube-apiserver writes it.
fn version_json(git_version: &str) -> serde_json::Value {
    let mut parts = git_version.trim_start_matches('v').split('.');
    let major = parts.next().unwrap_or("1");
    let minor = parts.next().unwrap_or("0");
    json!({"major": major, "minor": minor, "gitVersion": git_version, "gitCommit": "",
           "gitTreeState": "clean", "buildDate": "", "goVersion": "", "compiler": "gc",
           "platform": "linux/amd64"})
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, BoxError> {
    let watch = is_watch(&req);
    let agent = req
        .headers()
        .get(header::USER_AGENT)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    state.user_agents.lock().unwrap().insert(agent);
    let counts = &state.counts;
    counts.requests.fetch_add(1, Ordering::Relaxed);
    if watch {
        counts.watches.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(read) = list_read(&req, watch) {
        state.lists.lock().unwrap().push(read);
    }
    if watch {
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        state
            .watches
            .lock()
            .unwrap()
            .push((req.uri().path().to_string(), accept));
    }
    let lags = state.plan.watch_lag_only.is_empty()
        || state
            .plan
            .watch_lag_only
            .iter()
            .any(|p| req.uri().path().contains(p.as_str()));
    if req.uri().path() == "/version"
        && let Some(git_version) = state.version.lock().unwrap().clone()
    {
        return Ok(Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(full(version_json(&git_version).to_string()))?);
    }
    match decide(&state, req.method(), req.uri().path(), watch) {
        Verdict::Status(code, reason) => {
            let mut resp = Response::builder()
                .status(code)
                .header(header::CONTENT_TYPE, "application/json");
            if code == StatusCode::TOO_MANY_REQUESTS {
                resp = resp.header(header::RETRY_AFTER, "1");
            }
            Ok(resp.body(full(status_json(code, reason).to_string()))?)
        }
        Verdict::GoneEvent => {
            let event = json!({
                "type": "ERROR",
                "object": status_json(StatusCode::GONE, "Expired"),
            });
            Ok(Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(full(format!("{event}\n")))?)
        }
        Verdict::LateStatus(after, code, reason) => {
            tokio::time::sleep(after).await;
            Ok(Response::builder()
                .status(code)
                .header(header::CONTENT_TYPE, "application/json")
                .body(full(status_json(code, reason).to_string()))?)
        }
        Verdict::Hold(d) => {
            tokio::time::sleep(d).await;
            // An error ends the connection without an answer.
            Err("held request dropped by the e2e fault proxy".into())
        }
        Verdict::Delay => {
            let mut released = state.delay_released.subscribe();
            released.wait_for(|open| *open).await?;
            let resp = forward(&state, req).await?;
            Ok(resp.map(|b| b.map_err(BoxError::from).boxed()))
        }
        Verdict::ForwardThenFail(code) => {
            // The write happens; its answer is replaced, as when a response
            // is lost or the server timed out after committing.
            let _ = forward(&state, req).await;
            let reason = if code == StatusCode::GATEWAY_TIMEOUT {
                "Timeout"
            } else {
                "InternalError"
            };
            Ok(Response::builder()
                .status(code)
                .header(header::CONTENT_TYPE, "application/json")
                .body(full(status_json(code, reason).to_string()))?)
        }
        Verdict::Forward {
            cut_after,
            truncate_after,
            stall_after,
        } => match forward(&state, req).await {
            Ok(resp) if watch => {
                let faults = StreamFaults {
                    cut_after,
                    truncate_after,
                    stall_after,
                    stall_epoch: state.stall_epoch.subscribe(),
                    lag: if lags {
                        state.plan.watch_lag
                    } else {
                        Duration::ZERO
                    },
                    counts: state.counts.clone(),
                };
                Ok(resp.map(|body| watch_body(body, faults)))
            }
            Ok(resp) => Ok(resp.map(|b| b.map_err(BoxError::from).boxed())),
            Err(e) => {
                counts.upstream_errors.fetch_add(1, Ordering::Relaxed);
                // What a load balancer in front of a dead server says.
                let body = status_json(StatusCode::BAD_GATEWAY, "BadGateway");
                let _ = e;
                Ok(Response::builder()
                    .status(StatusCode::BAD_GATEWAY)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(full(body.to_string()))?)
            }
        },
    }
}

/// Headers that describe one hop, not the message.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
];

async fn forward(state: &State, req: Request<Incoming>) -> Result<Response<Incoming>, BoxError> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut out = Request::builder()
        .method(parts.method)
        .uri(format!("{}{path}", state.upstream_url));
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            out = out.header(name, value);
        }
    }
    let resp = state.upstream.request(out.body(Full::new(body))?).await?;
    let (mut parts, body) = resp.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(*name);
    }
    Ok(Response::from_parts(parts, body))
}
