//! The metrics and health-probe HTTP endpoints.
//!
//! Two listeners, as in kube-controller-manager / controller-runtime:
//! `--metrics-bind-address` (default `:8080`) serves `/metrics`, and
//! `--health-probe-bind-address` (default `:8081`) serves `/healthz` and
//! `/readyz`. Either can be disabled with `0`; when both name the same
//! address they share one listener.
//!
//! `/metrics` is served as kube-controller-manager serves it on its secure
//! port ([`MetricsAccess::Secure`], the default): over HTTPS, to bearer
//! tokens the API server authenticates whose user may `get` the URL. The
//! probes stay open (the kubelet sends no token). Every listener bounds
//! its connections and deadlines ([`serve`]).

pub mod serve;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::exposition::Exposition;
use anyhow::{Context as _, bail};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::FutureExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::delegated::{Gate, Verdict, bearer_token};
use super::leader::LeaseHealth;

/// Who may read `/metrics`, and over what.
#[derive(Debug, Clone)]
pub enum MetricsAccess {
    /// Plain HTTP, no authentication (`--metrics-secure=false`: loopback,
    /// or a mesh that authenticates).
    Open,
    /// HTTPS, delegated authentication and authorization.
    Secure {
        tls: Arc<rustls::ServerConfig>,
        gate: Arc<Gate>,
    },
}

impl MetricsAccess {
    fn tls(&self) -> Option<tokio_rustls::TlsAcceptor> {
        match self {
            MetricsAccess::Open => None,
            MetricsAccess::Secure { tls, .. } => Some(tokio_rustls::TlsAcceptor::from(tls.clone())),
        }
    }
}

/// Lets a request through only with the gate's consent.
async fn authorize(
    State(gate): State<Arc<Gate>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let verdict = gate.check(bearer_token(header), req.uri().path()).await;
    match verdict {
        Verdict::Allowed => next.run(req).await,
        Verdict::Unauthenticated(why) => {
            (StatusCode::UNAUTHORIZED, format!("Unauthorized: {why}\n")).into_response()
        }
        Verdict::Forbidden(why) => {
            (StatusCode::FORBIDDEN, format!("Forbidden: {why}\n")).into_response()
        }
        Verdict::Unavailable(why) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response()
        }
    }
}

/// A listener address flag: where to listen, or `None` for no listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindAddress(pub Option<SocketAddr>);

impl BindAddress {
    /// `:port`: all IPv4 interfaces.
    pub const fn all_interfaces(port: u16) -> Self {
        BindAddress(Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port,
        )))
    }
}

impl std::str::FromStr for BindAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_bind_address(s)
            .map(BindAddress)
            .map_err(|e| format!("{e:#}"))
    }
}

impl std::fmt::Display for BindAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(addr) => write!(f, "{addr}"),
            None => f.write_str("0"),
        }
    }
}

/// Parses a bind address flag.
///
/// * `"0"` disables the listener (`Ok(None)`).
/// * `":8080"` listens on all IPv4 interfaces, port 8080.
/// * `"127.0.0.1:8080"`, `"[::1]:8080"`, `"[::]:8080"`, `"localhost:8080"`
///   listen where they say. Other host names are rejected rather than
///   resolved, so startup never depends on DNS.
pub(crate) fn parse_bind_address(s: &str) -> anyhow::Result<Option<SocketAddr>> {
    let s = s.trim();
    if s == "0" {
        return Ok(None);
    }
    if s.is_empty() {
        bail!("empty bind address (use \"0\" to disable the listener)");
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        bail!("bind address {s:?} has no port; expected host:port, :port, or 0");
    };
    let port: u16 = port
        .parse()
        .with_context(|| format!("invalid port in bind address {s:?}"))?;
    let ip = match host {
        "" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        _ => {
            let literal = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            // An unbracketed IPv6 address would have been split at its last
            // colon; insist on brackets so the port is unambiguous.
            if literal.contains(':') && literal == host {
                bail!("IPv6 address in bind address {s:?} must be in brackets, e.g. [::1]:8080");
            }
            literal.parse().with_context(|| {
                format!("host in bind address {s:?} must be an IP address or localhost")
            })?
        }
    };
    Ok(Some(SocketAddr::new(ip, port)))
}

/// Shared liveness/readiness state. Cloning shares it.
///
/// * Ready once the informer caches have synced. Standby replicas (not
///   leading) are ready too: they are healthy members of the deployment.
/// * Live while the process runs and, when leading, while lease renewals are
///   on time, as the leader election reports them ([`Health::follow_lease`]).
///   A leader whose last successful renewal is older than the allowed
///   staleness is reported unhealthy, so a wedged leader gets restarted even
///   if it failed to notice it lost the lease.
#[derive(Clone, Debug, Default)]
pub struct Health {
    inner: Arc<Mutex<HealthState>>,
}

#[derive(Debug, Default)]
struct HealthState {
    ready: bool,
    /// What start-up waits for (a read the API server has not answered
    /// yet, with the last failure), shown by `/readyz` while it lasts.
    waiting_for: Option<String>,
    /// Parts of the process that are not working, each with why, that do
    /// not make the process unready (a headroom front door whose CRD is
    /// not installed): listed in `/readyz`'s answer.
    notes: std::collections::BTreeMap<String, String>,
    /// The election's reports; none when there is no election to follow.
    lease: Option<watch::Receiver<LeaseHealth>>,
}

impl Health {
    fn state(&self) -> std::sync::MutexGuard<'_, HealthState> {
        // The state is plain data, always consistent; a panic elsewhere while
        // holding the lock must not take the probes down with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the process ready (caches synced) or not.
    pub fn set_ready(&self, ready: bool) {
        self.state().ready = ready;
    }

    /// Shows what start-up waits for in `/readyz` (`None`: nothing).
    pub fn set_waiting_for(&self, what: Option<String>) {
        self.state().waiting_for = what;
    }

    /// Notes (`Some`) or clears (`None`) why the part `part` of the process
    /// is not working; `/readyz` lists the notes without failing.
    pub fn set_note(&self, part: &str, why: Option<String>) {
        let mut state = self.state();
        match why {
            Some(why) => state.notes.insert(part.to_string(), why),
            None => state.notes.remove(part),
        };
    }

    /// Liveness from now on follows the leader election's reports.
    pub fn follow_lease(&self, lease: watch::Receiver<LeaseHealth>) {
        self.state().lease = Some(lease);
    }

    /// `Ok` if live, else the reason.
    pub fn liveness(&self) -> Result<(), String> {
        self.liveness_at(Instant::now())
    }

    fn liveness_at(&self, now: Instant) -> Result<(), String> {
        let lease = self.state().lease.as_ref().map(|rx| *rx.borrow());
        lease.map_or(Ok(()), |lease| lease.check(now))
    }

    /// `Ok` with the answer's text if ready ("ok", then a line per part
    /// that is not working), else the reason.
    pub fn readiness(&self) -> Result<String, String> {
        let state = self.state();
        match (&state.waiting_for, state.ready) {
            (Some(what), _) => Err(format!("waiting for {what}")),
            (None, true) => Ok(std::iter::once("ok".to_string())
                .chain(
                    state
                        .notes
                        .iter()
                        .map(|(part, why)| format!("{part}: {why}")),
                )
                .collect::<Vec<_>>()
                .join("\n")),
            (None, false) => Err("informer caches not synced yet".into()),
        }
    }
}

fn probe_response(result: Result<String, String>) -> Response {
    match result {
        Ok(text) => (StatusCode::OK, text).into_response(),
        Err(reason) => (StatusCode::INTERNAL_SERVER_ERROR, reason).into_response(),
    }
}

async fn healthz(State(health): State<Health>) -> Response {
    probe_response(health.liveness().map(|()| "ok".to_string()))
}

async fn readyz(State(health): State<Health>) -> Response {
    probe_response(health.readiness())
}

async fn metrics(State(exposition): State<Exposition>) -> Response {
    match exposition.encode() {
        Ok(body) => (
            [(header::CONTENT_TYPE, crate::exposition::content_type())],
            body,
        )
            .into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "encoding metrics failed");
            (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response()
        }
    }
}

/// `/metrics` in the Prometheus text format, behind `access`'s gate.
pub(crate) fn metrics_router(exposition: Exposition, access: &MetricsAccess) -> Router {
    let router = Router::new()
        .route("/metrics", get(metrics))
        .with_state(exposition);
    match access {
        MetricsAccess::Open => router,
        MetricsAccess::Secure { gate, .. } => router.route_layer(
            axum::middleware::from_fn_with_state(gate.clone(), authorize),
        ),
    }
}

/// `/healthz` (with `/livez` as an alias) and `/readyz`.
pub(crate) fn health_router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health)
}

/// A listener that is bound (so address errors surface at startup) but not
/// yet serving.
pub(crate) struct BoundServer {
    listener: TcpListener,
    router: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for BoundServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundServer")
            .field("listener", &self.listener)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl BoundServer {
    /// Binds `addr` for `router`, served over TLS with `tls`.
    pub(crate) async fn bind(
        addr: SocketAddr,
        router: Router,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        Ok(Self {
            listener,
            router,
            tls,
        })
    }

    /// The bound address (useful with port 0).
    pub(crate) fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `shutdown` resolves, then finishes in-flight requests.
    pub(crate) async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let addr = self.local_addr()?;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        tracing::info!(%addr, scheme, "HTTP server listening");
        serve::accept_loop(self.listener, self.router, self.tls, shutdown).await;
        tracing::info!(%addr, "HTTP server stopped");
        Ok(())
    }
}

/// Binds `addr` (see [`parse_bind_address`]) and serves `router` until
/// `shutdown` resolves. Returns at once if the address is `0` (disabled).
pub async fn serve(
    addr: &str,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    match parse_bind_address(addr)? {
        None => Ok(()),
        Some(addr) => {
            BoundServer::bind(addr, router, None)
                .await?
                .run(shutdown)
                .await
        }
    }
}

/// The running metrics and health listeners.
#[derive(Debug)]
pub struct Servers {
    /// Where `/metrics` is served, if enabled.
    pub metrics_addr: Option<SocketAddr>,
    /// Where `/healthz` and `/readyz` are served, if enabled.
    pub health_addr: Option<SocketAddr>,
    tasks: Vec<JoinHandle<anyhow::Result<()>>>,
}

impl Servers {
    /// Waits for every listener to stop (after shutdown), returning the first
    /// error.
    pub async fn wait(self) -> anyhow::Result<()> {
        let mut first_err = None;
        for task in self.tasks {
            let result = task
                .await
                .context("HTTP server task panicked")
                .and_then(|r| r);
            if let Err(err) = result {
                first_err.get_or_insert(err);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Binds both listeners now (so a taken port fails startup) and serves them
/// in background tasks until `shutdown` resolves.
pub async fn start_servers(
    metrics_bind_address: BindAddress,
    health_probe_bind_address: BindAddress,
    exposition: impl Into<Exposition>,
    health: Health,
    access: MetricsAccess,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Servers> {
    let (metrics_addr, health_addr) = (metrics_bind_address.0, health_probe_bind_address.0);
    let registry: Exposition = exposition.into();

    let mut bound = Vec::new();
    match (metrics_addr, health_addr) {
        // Same explicit port: one listener for both (binding twice would fail).
        (Some(m), Some(h)) if m == h && m.port() != 0 => {
            // Probes on the metrics listener: over its TLS, still open.
            let router = metrics_router(registry, &access).merge(health_router(health));
            bound.push(BoundServer::bind(m, router, access.tls()).await?);
        }
        (m, h) => {
            if let Some(m) = m {
                let router = metrics_router(registry, &access);
                bound.push(BoundServer::bind(m, router, access.tls()).await?);
            }
            if let Some(h) = h {
                bound.push(BoundServer::bind(h, health_router(health), None).await?);
            }
        }
    }

    // Resolve the real addresses (port 0 picks one) in bind order.
    let mut addrs = bound
        .iter()
        .map(BoundServer::local_addr)
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter();
    let (metrics_addr, health_addr) = match (metrics_addr, health_addr) {
        (Some(m), Some(h)) if m == h && m.port() != 0 => {
            let a = addrs.next();
            (a, a)
        }
        (m, h) => (m.and_then(|_| addrs.next()), h.and_then(|_| addrs.next())),
    };

    let shutdown = shutdown.shared();
    let tasks = bound
        .into_iter()
        .map(|server| tokio::spawn(server.run(shutdown.clone())))
        .collect();
    Ok(Servers {
        metrics_addr,
        health_addr,
        tasks,
    })
}

#[cfg(test)]
mod tests;
