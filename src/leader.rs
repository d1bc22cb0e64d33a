//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! Acquiring, renewing and releasing the Lease is done by kube-lease-manager.
//! Its model differs from client-go's, so the parts it cannot express are
//! implemented here:
//!
//! | client-go option | here |
//! | --- | --- |
//! | lease duration (15s) | kube-lease-manager `duration`, written to `leaseDurationSeconds` (whole seconds, rounded up) |
//! | retry period (2s), leader side | kube-lease-manager `grace = duration - retry period`: it renews `grace` seconds before expiry, i.e. one retry period after each renewal; after a failed renewal we call it again one retry period later |
//! | retry period, standby side | our own poll: one GET of the Lease per retry period (+ up to 20% jitter, as client-go). kube-lease-manager on its own would sleep until the holder's expiry, which after a clean release means up to a lease duration of needless downtime |
//! | renew deadline (10s) | our own watchdog: if no renewal has succeeded for that long, leadership is declared lost and the elector stops (work must stop too) |
//! | release on cancel | [`LeaderHandle::release`] (and, best effort, dropping the handle): clears `holderIdentity`, so a standby takes over at its next poll |
//!
//! Successful renewals are observed by wrapping the client: every successful
//! PATCH of our Lease is a renewal (kube-lease-manager renews with a patch
//! and reports nothing until the lock state changes). The wrapped client
//! still goes through the process-wide rate limiter.
//!
//! Losing the lease is final for this elector, as in kube-controller-manager:
//! the process is expected to stop its controllers and exit, so no half-run
//! state carries into a later term.
//!
//! RBAC: `get`, `create` and `patch` on `leases` in the lease namespace.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail, ensure};
use http::{Method, Request};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::Api;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseParams};
use prometheus::{IntGaugeVec, Opts, Registry};
use rand::Rng;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::http::Health;

/// Name of the Lease object.
pub const DEFAULT_LEASE_NAME: &str = "dra-claim-controller";
/// client-go / kube-controller-manager default.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// client-go / kube-controller-manager default.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// client-go / kube-controller-manager default.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Where an in-cluster pod finds its own namespace.
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// Environment variable consulted when not running with a service account.
pub const POD_NAMESPACE_ENV: &str = "POD_NAMESPACE";
/// Last-resort lease namespace, where kube-controller-manager keeps its own.
pub const FALLBACK_NAMESPACE: &str = "kube-system";

/// Kubernetes caps `fieldManager` at 128 characters.
const MAX_FIELD_MANAGER_LEN: usize = 128;
/// client-go's `JitterFactor` for the retry period.
const RETRY_JITTER: f64 = 0.2;

/// Leader-election settings, mirroring kube-controller-manager's
/// `--leader-elect*` flags.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderElectionOptions {
    /// `false` makes this process the leader unconditionally (single replica,
    /// local development).
    pub enabled: bool,
    /// Lease object name.
    pub lease_name: String,
    /// Lease namespace; `None` resolves it with [`resolve_namespace`].
    pub lease_namespace: Option<String>,
    /// Holder identity; `None` uses [`default_identity`].
    pub identity: Option<String>,
    /// How long a lease is valid after its last renewal; standbys wait this
    /// long before taking over from a silent leader.
    pub lease_duration: Duration,
    /// How long the leader keeps working without a successful renewal.
    pub renew_deadline: Duration,
    /// Pause between attempts (renewals, standby polls, retries).
    pub retry_period: Duration,
}

impl Default for LeaderElectionOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            lease_name: DEFAULT_LEASE_NAME.to_owned(),
            lease_namespace: None,
            identity: None,
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }
}

/// The timing handed to kube-lease-manager (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// `LeaseParams::duration`: `leaseDurationSeconds`.
    pub duration_secs: u64,
    /// `LeaseParams::grace`: renew this long before expiry.
    pub grace_secs: u64,
}

impl LeaderElectionOptions {
    /// Checks client-go's constraints (lease duration > renew deadline >
    /// 1.2 × retry period > 0) plus whole-second lease timing.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            !self.lease_name.is_empty(),
            "leader election lease name is empty"
        );
        ensure!(
            !self.retry_period.is_zero(),
            "leader election retry period must be positive"
        );
        ensure!(
            self.lease_duration > self.renew_deadline,
            "leader election lease duration ({:?}) must be greater than the renew deadline ({:?})",
            self.lease_duration,
            self.renew_deadline
        );
        ensure!(
            self.renew_deadline.as_secs_f64()
                > self.retry_period.as_secs_f64() * (1.0 + RETRY_JITTER),
            "leader election renew deadline ({:?}) must be greater than 1.2 × the retry period ({:?})",
            self.renew_deadline,
            self.retry_period
        );
        if let Some(identity) = &self.identity {
            ensure!(!identity.is_empty(), "leader election identity is empty");
        }
        self.lease_timing().map(|_| ())
    }

    /// Maps the options onto kube-lease-manager's `duration`/`grace`, which
    /// are whole seconds with `0 < grace < duration`.
    pub fn lease_timing(&self) -> anyhow::Result<LeaseTiming> {
        let duration_secs = ceil_secs(self.lease_duration);
        let retry_secs = ceil_secs(self.retry_period).max(1);
        if duration_secs <= retry_secs {
            bail!(
                "leader election lease duration ({:?}) must exceed the retry period ({:?}) by at least a second",
                self.lease_duration,
                self.retry_period
            );
        }
        Ok(LeaseTiming {
            duration_secs,
            grace_secs: duration_secs - retry_secs,
        })
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Picks the lease namespace: explicit setting, then the pod's service
/// account namespace, then `$POD_NAMESPACE`, then `kube-system`. Blank
/// values are skipped.
pub fn resolve_namespace(
    explicit: Option<&str>,
    service_account_namespace: Option<&str>,
    pod_namespace_env: Option<&str>,
) -> String {
    [explicit, service_account_namespace, pod_namespace_env]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|ns| !ns.is_empty())
        .unwrap_or(FALLBACK_NAMESPACE)
        .to_owned()
}

/// [`resolve_namespace`] with the real file and environment.
fn namespace_from_environment(explicit: Option<&str>) -> String {
    let service_account = std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE).ok();
    let env = std::env::var(POD_NAMESPACE_ENV).ok();
    resolve_namespace(explicit, service_account.as_deref(), env.as_deref())
}

/// `hostname_<uuid>`, like client-go's default identity: the host name says
/// which pod holds the lease, the random part keeps a restarted pod from
/// mistaking its predecessor's lease for its own.
pub fn default_identity() -> String {
    let host = hostname::get()
        .ok()
        .map(|h| h.to_string_lossy().into_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    identity_from(&host, &random_uuid())
}

fn identity_from(hostname: &str, suffix: &str) -> String {
    format!("{hostname}_{suffix}")
}

/// A random (version 4) UUID in its usual text form.
fn random_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Server-side-apply field manager for our lease writes. kube-lease-manager
/// relies on managers being distinct per candidate to detect conflicting
/// acquisitions, so it is derived from the identity; the random tail is kept
/// if the whole would exceed the API's length limit.
fn field_manager_for(identity: &str) -> String {
    let full = format!("leader-election/{identity}");
    if full.len() <= MAX_FIELD_MANAGER_LEN {
        return full;
    }
    let mut start = full.len() - MAX_FIELD_MANAGER_LEN;
    while !full.is_char_boundary(start) {
        start += 1;
    }
    full[start..].to_owned()
}

/// Whether a standby should try to take the lease: it does not exist, has no
/// holder, is already ours, or its holder let it expire. Expiry compares the
/// holder's `renewTime` with our clock, as kube-lease-manager does, so clock
/// skew between nodes shifts takeover by the same amount.
fn lease_available(spec: Option<&LeaseSpec>, identity: &str, now: SystemTime) -> bool {
    let Some(spec) = spec else { return true };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder.is_empty() || holder == identity {
        return true;
    }
    let (Some(renew), Some(secs)) = (&spec.renew_time, spec.lease_duration_seconds) else {
        return true;
    };
    let renewed: SystemTime = renew.0.into();
    let valid_for = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    renewed + valid_for < now
}

/// Why leadership ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeadershipLost {
    /// No renewal succeeded within the renew deadline.
    RenewDeadlineExceeded {
        /// Time since the last successful renewal when we gave up.
        since_last_renewal: Duration,
    },
    /// The lease changed hands (another holder, or the lease was cleared).
    TakenOver,
    /// We gave the lease up via [`LeaderHandle::release`] or by dropping the
    /// handle.
    Released,
    /// The election task stopped unexpectedly (panicked).
    ElectorStopped,
}

impl fmt::Display for LeadershipLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RenewDeadlineExceeded { since_last_renewal } => write!(
                f,
                "lease not renewed for {:.1}s (renew deadline exceeded)",
                since_last_renewal.as_secs_f64()
            ),
            Self::TakenOver => f.write_str("lease taken over by another holder"),
            Self::Released => f.write_str("lease released"),
            Self::ElectorStopped => f.write_str("leader election stopped unexpectedly"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Standby,
    Leading,
    Ended { led: bool, reason: LeadershipLost },
}

/// Resolved leader-election settings: where the lease lives and who we are.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    enabled: bool,
    lease_name: String,
    namespace: String,
    identity: String,
    timing: LeaseTiming,
    renew_deadline: Duration,
    retry_period: Duration,
    lease_duration: Duration,
}

impl LeaderElection {
    /// Validates `opts` and resolves the namespace and identity.
    pub fn resolve(opts: &LeaderElectionOptions) -> anyhow::Result<Self> {
        opts.validate()?;
        Ok(Self {
            enabled: opts.enabled,
            lease_name: opts.lease_name.clone(),
            namespace: namespace_from_environment(opts.lease_namespace.as_deref()),
            identity: opts.identity.clone().unwrap_or_else(default_identity),
            timing: opts.lease_timing()?,
            renew_deadline: opts.renew_deadline,
            retry_period: opts.retry_period,
            lease_duration: opts.lease_duration,
        })
    }

    /// Resolves `opts` and starts campaigning in a background task (or, if
    /// disabled, returns a handle that is always leader).
    pub async fn start(
        client: kube::Client,
        opts: LeaderElectionOptions,
        registry: &Registry,
        health: Health,
    ) -> anyhow::Result<LeaderHandle> {
        Self::resolve(&opts)?.spawn(client, registry, health)
    }

    /// Lease name.
    pub fn lease_name(&self) -> &str {
        &self.lease_name
    }

    /// Lease namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Holder identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Timing handed to kube-lease-manager.
    pub fn timing(&self) -> LeaseTiming {
        self.timing
    }

    /// Starts the election with these settings.
    pub fn spawn(
        self,
        client: kube::Client,
        registry: &Registry,
        health: Health,
    ) -> anyhow::Result<LeaderHandle> {
        let status = IntGaugeVec::new(
            Opts::new(
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ),
            &["name"],
        )
        .context("defining leader_election_master_status")?;
        registry
            .register(Box::new(status.clone()))
            .context("registering leader_election_master_status")?;
        let gauge = status.with_label_values(&[self.lease_name.as_str()]);

        if !self.enabled {
            tracing::info!(lease.name = %self.lease_name, "leader election disabled; acting as leader");
            // This replica does the leader's work, so report it as such. No
            // lease is held, so liveness does not track renewals.
            gauge.set(1);
            let (phase, state) = watch::channel(Phase::Leading);
            return Ok(LeaderHandle {
                state,
                control: Control::Disabled(phase),
            });
        }

        gauge.set(0);
        // A leader that has not renewed for a whole lease duration may be
        // running alongside a new leader; by then our own renew-deadline
        // watchdog should long have stepped down, so failing liveness means
        // the elector itself is wedged.
        health.set_max_renewal_staleness(self.lease_duration);

        let (renew_tx, renew_rx) = watch::channel(Instant::now());
        let client = observe_lease_writes(client, &self.namespace, &self.lease_name, renew_tx);
        let (phase, state) = watch::channel(Phase::Standby);
        let (stop_tx, stop_rx) = oneshot::channel();

        tracing::info!(
            lease.namespace = %self.namespace,
            lease.name = %self.lease_name,
            identity = %self.identity,
            lease_duration_secs = self.timing.duration_secs,
            grace_secs = self.timing.grace_secs,
            renew_deadline = ?self.renew_deadline,
            retry_period = ?self.retry_period,
            "starting leader election"
        );
        let elector = Elector {
            api: Api::namespaced(client.clone(), &self.namespace),
            cfg: self,
            client,
            renewals: renew_rx,
            status: StatusSink {
                phase,
                gauge,
                health,
            },
        };
        let task = tokio::spawn(elector.run(stop_rx));
        Ok(LeaderHandle {
            state,
            control: Control::Running {
                stop: stop_tx,
                task,
            },
        })
    }
}

/// Wraps `client` so that every successful PATCH of the lease reports the
/// time it was sent on `renewals`.
fn observe_lease_writes(
    client: kube::Client,
    namespace: &str,
    name: &str,
    renewals: watch::Sender<Instant>,
) -> kube::Client {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}");
    let default_ns = client.default_namespace().to_owned();
    let renewals = Arc::new(renewals);
    let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
        let client = client.clone();
        let renewals = renewals.clone();
        let is_lease_patch = req.method() == Method::PATCH && req.uri().path() == path;
        // The send time is what the patch wrote as renewTime (near enough),
        // so staleness is measured conservatively from it.
        let sent = Instant::now();
        async move {
            let resp = client.send(req).await?;
            if is_lease_patch && resp.status().is_success() {
                renewals.send_if_modified(|last| {
                    let newer = sent > *last;
                    if newer {
                        *last = sent;
                    }
                    newer
                });
            }
            Ok::<_, kube::Error>(resp)
        }
    });
    kube::Client::new(svc, default_ns)
}

/// Publishes the election state to the handle, the gauge and the probes.
struct StatusSink {
    phase: watch::Sender<Phase>,
    gauge: prometheus::IntGauge,
    health: Health,
}

impl StatusSink {
    fn leading(&self) {
        self.health.set_leading(true);
        self.health.record_renewal(Instant::now());
        self.gauge.set(1);
        self.phase.send_replace(Phase::Leading);
    }

    fn ended(&self, reason: LeadershipLost) {
        self.gauge.set(0);
        self.health.set_leading(false);
        self.phase.send_modify(|p| {
            let led = matches!(p, Phase::Leading | Phase::Ended { led: true, .. });
            *p = Phase::Ended { led, reason };
        });
    }
}

impl Drop for StatusSink {
    fn drop(&mut self) {
        // Reached without `ended` only if the task panicked or was aborted:
        // never leave the process believing it still leads.
        if !matches!(*self.phase.borrow(), Phase::Ended { .. }) {
            self.ended(LeadershipLost::ElectorStopped);
        }
    }
}

struct Elector {
    cfg: LeaderElection,
    client: kube::Client,
    api: Api<Lease>,
    renewals: watch::Receiver<Instant>,
    status: StatusSink,
}

impl Elector {
    async fn run(self, mut stop: oneshot::Receiver<()>) {
        let cfg = &self.cfg;
        let manager = tokio::select! {
            biased;
            // Sent, or the handle was dropped: either way, stop.
            _ = &mut stop => {
                // An acquisition may have been cut off after it already
                // wrote the lease; hand it back rather than make the next
                // leader wait for expiry.
                self.release_if_ours().await;
                self.status.ended(LeadershipLost::Released);
                return;
            }
            manager = self.campaign() => manager,
        };

        tracing::info!(
            lease.namespace = %cfg.namespace,
            lease.name = %cfg.lease_name,
            identity = %cfg.identity,
            "became leader"
        );
        self.status.leading();

        let lost = tokio::select! {
            biased;
            _ = &mut stop => None,
            reason = self.hold(&manager) => Some(reason),
        };
        match lost {
            Some(reason) => {
                tracing::warn!(
                    lease.namespace = %cfg.namespace,
                    lease.name = %cfg.lease_name,
                    identity = %cfg.identity,
                    %reason,
                    "lost leadership"
                );
                self.status.ended(reason);
            }
            None => {
                // Stop reporting leadership before giving the lease up, so
                // nothing here acts as leader once someone else can.
                self.status.ended(LeadershipLost::Released);
                match tokio::time::timeout(cfg.renew_deadline, manager.release()).await {
                    Ok(Ok(())) => tracing::info!(
                        lease.namespace = %cfg.namespace,
                        lease.name = %cfg.lease_name,
                        identity = %cfg.identity,
                        "released leader lease"
                    ),
                    Ok(Err(err)) => tracing::warn!(
                        lease.namespace = %cfg.namespace,
                        lease.name = %cfg.lease_name,
                        error = %err,
                        "releasing leader lease failed; it will expire instead"
                    ),
                    Err(_) => tracing::warn!(
                        lease.namespace = %cfg.namespace,
                        lease.name = %cfg.lease_name,
                        "releasing leader lease timed out; it will expire instead"
                    ),
                }
            }
        }
    }

    fn manager_builder(&self) -> LeaseManagerBuilder {
        let cfg = &self.cfg;
        let params = LeaseParams::new(
            cfg.identity.clone(),
            cfg.timing.duration_secs,
            cfg.timing.grace_secs,
        )
        .with_field_manager(field_manager_for(&cfg.identity));
        LeaseManagerBuilder::new(self.client.clone(), cfg.lease_name.clone())
            .with_namespace(cfg.namespace.clone())
            .with_parameters(params)
    }

    /// Polls the lease every retry period and tries to take it when it is
    /// free; returns the manager that holds it.
    async fn campaign(&self) -> LeaseManager {
        let cfg = &self.cfg;
        loop {
            match self.api.get_opt(&cfg.lease_name).await {
                Ok(lease) => {
                    let spec = lease.as_ref().and_then(|l| l.spec.as_ref());
                    if lease_available(spec, &cfg.identity, SystemTime::now()) {
                        match self.try_acquire().await {
                            Ok(Some(manager)) => return manager,
                            Ok(None) => tracing::debug!(
                                lease.name = %cfg.lease_name,
                                "lease taken by another candidate first"
                            ),
                            Err(err) => tracing::warn!(
                                lease.namespace = %cfg.namespace,
                                lease.name = %cfg.lease_name,
                                error = %format!("{err:#}"),
                                "acquiring leader lease failed; retrying"
                            ),
                        }
                    } else {
                        tracing::debug!(
                            lease.name = %cfg.lease_name,
                            holder = spec.and_then(|s| s.holder_identity.as_deref()).unwrap_or(""),
                            "lease held by another candidate"
                        );
                    }
                }
                Err(err) => tracing::warn!(
                    lease.namespace = %cfg.namespace,
                    lease.name = %cfg.lease_name,
                    error = %err,
                    "reading leader lease failed; retrying"
                ),
            }
            tokio::time::sleep(jittered(cfg.retry_period)).await;
        }
    }

    /// One acquisition attempt. `None` if another candidate won the race
    /// (kube-lease-manager would then wait for that holder's expiry; we go
    /// back to polling instead).
    async fn try_acquire(&self) -> anyhow::Result<Option<LeaseManager>> {
        let manager = self
            .manager_builder()
            .build()
            .await
            .context("preparing the lease")?;
        match tokio::time::timeout(self.cfg.renew_deadline, manager.changed()).await {
            Ok(Ok(true)) => Ok(Some(manager)),
            Ok(Ok(false)) | Err(_) => Ok(None),
            Ok(Err(err)) => Err(err).context("locking the lease"),
        }
    }

    /// Keeps the lease renewed until it is lost.
    async fn hold(&self, manager: &LeaseManager) -> LeadershipLost {
        let cfg = &self.cfg;
        let renew_loop = async {
            loop {
                match manager.changed().await {
                    // Already leader; kube-lease-manager only returns on a
                    // change, so this is not expected.
                    Ok(true) => {}
                    Ok(false) => return LeadershipLost::TakenOver,
                    Err(err) => {
                        // Retried until the watchdog below gives up.
                        tracing::warn!(
                            lease.namespace = %cfg.namespace,
                            lease.name = %cfg.lease_name,
                            error = %err,
                            "renewing leader lease failed; retrying"
                        );
                        tokio::time::sleep(cfg.retry_period).await;
                    }
                }
            }
        };

        let mut renewals = self.renewals.clone();
        let health = &self.status.health;
        let watchdog = async {
            // Becoming leader just wrote the lease.
            let mut last = Instant::now();
            renewals.mark_unchanged();
            loop {
                let deadline = tokio::time::Instant::from_std(last + cfg.renew_deadline);
                tokio::select! {
                    biased;
                    // If the sender were gone (it lives as long as the
                    // client), the pattern fails and only the deadline runs.
                    Ok(()) = renewals.changed() => {
                        let at = *renewals.borrow_and_update();
                        if at > last {
                            last = at;
                            health.record_renewal(at);
                            tracing::trace!(lease.name = %cfg.lease_name, "renewed leader lease");
                        }
                    }
                    () = tokio::time::sleep_until(deadline) => {
                        let since_last_renewal = last.elapsed();
                        if since_last_renewal >= cfg.renew_deadline {
                            return LeadershipLost::RenewDeadlineExceeded { since_last_renewal };
                        }
                    }
                }
            }
        };

        tokio::select! {
            reason = renew_loop => reason,
            reason = watchdog => reason,
        }
    }

    /// Best-effort release by a fresh manager; a no-op unless the lease is
    /// ours (or already expired).
    async fn release_if_ours(&self) {
        let cfg = &self.cfg;
        let Ok(Some(lease)) = self.api.get_opt(&cfg.lease_name).await else {
            return;
        };
        let ours = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(cfg.identity.as_str());
        if !ours {
            return;
        }
        let release = async {
            let manager = self.manager_builder().build().await?;
            manager.release().await
        };
        match tokio::time::timeout(cfg.renew_deadline, release).await {
            Ok(Ok(())) => tracing::info!(lease.name = %cfg.lease_name, "released leader lease"),
            Ok(Err(err)) => {
                tracing::warn!(lease.name = %cfg.lease_name, error = %err, "releasing leader lease failed")
            }
            Err(_) => {
                tracing::warn!(lease.name = %cfg.lease_name, "releasing leader lease timed out")
            }
        }
    }
}

/// `base` plus up to 20%, so standbys do not poll in lockstep.
fn jittered(base: Duration) -> Duration {
    base.mul_f64(1.0 + rand::rng().random_range(0.0..RETRY_JITTER))
}

enum Control {
    /// Leader election off; the sender keeps the state channel open.
    Disabled(watch::Sender<Phase>),
    Running {
        stop: oneshot::Sender<()>,
        task: JoinHandle<()>,
    },
}

/// Handle to a running election. Dropping it releases the lease in the
/// background (best effort); call [`release`](Self::release) to wait for it.
pub struct LeaderHandle {
    state: watch::Receiver<Phase>,
    control: Control,
}

impl fmt::Debug for LeaderHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderHandle")
            .field("phase", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl LeaderHandle {
    /// Whether this process currently leads.
    pub fn is_leader(&self) -> bool {
        matches!(*self.state.borrow(), Phase::Leading)
    }

    /// Resolves once this process has become leader (immediately if leader
    /// election is disabled). If leadership was gained and lost already, it
    /// resolves too; [`lost`](Self::lost) then resolves at once. Never
    /// resolves if the election stops before this process ever leads.
    pub async fn wait_until_leader(&self) {
        let mut state = self.state.clone();
        let led = state
            .wait_for(|p| matches!(p, Phase::Leading | Phase::Ended { led: true, .. }))
            .await
            .is_ok();
        if !led {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves when leadership held by this process ends: lost (renew
    /// deadline passed, or another holder took it) or released. Stays
    /// pending while standing by, and forever if this process never leads or
    /// leader election is disabled. Independent of `self`'s lifetime.
    pub fn lost(&self) -> impl Future<Output = LeadershipLost> + Send + 'static {
        let mut state = self.state.clone();
        async move {
            let ended = state
                .wait_for(|p| matches!(p, Phase::Ended { led: true, .. }))
                .await
                .ok()
                .map(|p| p.clone());
            match ended {
                Some(Phase::Ended { reason, .. }) => reason,
                _ => std::future::pending().await,
            }
        }
    }

    /// Stops campaigning and, if leading, gives the lease up so a standby
    /// takes over at its next poll (about one retry period). Returns once
    /// the release finished or timed out (after the renew deadline).
    pub async fn release(self) {
        match self.control {
            Control::Disabled(phase) => {
                phase.send_replace(Phase::Ended {
                    led: true,
                    reason: LeadershipLost::Released,
                });
            }
            Control::Running { stop, task } => {
                let _ = stop.send(());
                if let Err(err) = task.await
                    && err.is_panic()
                {
                    tracing::error!(error = %err, "leader election task panicked");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn namespace_resolution_order() {
        assert_eq!(
            resolve_namespace(Some("explicit"), Some("sa"), Some("env")),
            "explicit"
        );
        assert_eq!(resolve_namespace(None, Some("sa\n"), Some("env")), "sa");
        assert_eq!(resolve_namespace(None, Some("  "), Some("env")), "env");
        assert_eq!(resolve_namespace(None, None, Some("env")), "env");
        assert_eq!(resolve_namespace(Some(""), None, None), "kube-system");
        assert_eq!(resolve_namespace(None, None, None), "kube-system");
    }

    #[test]
    fn identity_is_hostname_underscore_uuid() {
        assert_eq!(identity_from("node-a", "x"), "node-a_x");

        let id = default_identity();
        let (host, uuid) = id.rsplit_once('_').expect("underscore separator");
        assert!(!host.is_empty());
        let groups: Vec<_> = uuid.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{uuid}");
        assert!(uuid.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
        assert_eq!(&uuid[14..15], "4", "version 4");
        assert_ne!(default_identity(), id, "random suffix");
    }

    #[test]
    fn field_manager_fits_the_api_limit_and_keeps_the_unique_tail() {
        assert_eq!(field_manager_for("h_1"), "leader-election/h_1");
        let long = format!("{}_{}", "h".repeat(250), random_uuid());
        let fm = field_manager_for(&long);
        assert_eq!(fm.len(), MAX_FIELD_MANAGER_LEN);
        assert!(long.ends_with(&fm));
    }

    #[test]
    fn default_options_map_to_lease_manager_timing() {
        let opts = LeaderElectionOptions::default();
        opts.validate().unwrap();
        assert_eq!(opts.lease_name, "dra-claim-controller");
        // Renew 13s before a 15s expiry = every 2s (the retry period).
        assert_eq!(
            opts.lease_timing().unwrap(),
            LeaseTiming {
                duration_secs: 15,
                grace_secs: 13
            }
        );
    }

    #[test]
    fn sub_second_values_round_up() {
        let opts = LeaderElectionOptions {
            lease_duration: Duration::from_millis(4500),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_millis(500),
            ..Default::default()
        };
        opts.validate().unwrap();
        assert_eq!(
            opts.lease_timing().unwrap(),
            LeaseTiming {
                duration_secs: 5,
                grace_secs: 4
            }
        );
    }

    #[test]
    fn invalid_options_are_rejected() {
        let base = LeaderElectionOptions::default();
        let bad = [
            LeaderElectionOptions {
                renew_deadline: Duration::from_secs(15),
                ..base.clone()
            },
            LeaderElectionOptions {
                retry_period: Duration::from_secs(9),
                ..base.clone()
            },
            LeaderElectionOptions {
                retry_period: Duration::ZERO,
                ..base.clone()
            },
            LeaderElectionOptions {
                lease_name: String::new(),
                ..base.clone()
            },
            LeaderElectionOptions {
                identity: Some(String::new()),
                ..base.clone()
            },
            // Passes client-go's rules but leaves no whole second of grace.
            LeaderElectionOptions {
                lease_duration: Duration::from_secs(2),
                renew_deadline: Duration::from_millis(1900),
                retry_period: Duration::from_millis(1500),
                ..base.clone()
            },
        ];
        for opts in bad {
            assert!(opts.validate().is_err(), "{opts:?}");
        }
    }

    #[test]
    fn resolve_uses_explicit_namespace_and_identity() {
        let le = LeaderElection::resolve(&LeaderElectionOptions {
            lease_namespace: Some("ns1".into()),
            identity: Some("me".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (le.namespace(), le.identity(), le.lease_name()),
            ("ns1", "me", "dra-claim-controller")
        );
    }

    fn spec(holder: Option<&str>, renewed: Option<SystemTime>, secs: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: renewed.map(|t| MicroTime(Timestamp::try_from(t).unwrap())),
            lease_duration_seconds: secs,
            ..Default::default()
        }
    }

    #[test]
    fn lease_availability() {
        let now = SystemTime::now();
        let ago = |s| now - Duration::from_secs(s);
        assert!(lease_available(None, "me", now), "no lease or empty spec");
        assert!(
            lease_available(Some(&spec(None, None, None)), "me", now),
            "released"
        );
        assert!(lease_available(
            Some(&spec(Some(""), Some(ago(1)), Some(15))),
            "me",
            now
        ));
        assert!(lease_available(
            Some(&spec(Some("me"), Some(ago(1)), Some(15))),
            "me",
            now
        ));
        assert!(!lease_available(
            Some(&spec(Some("other"), Some(ago(1)), Some(15))),
            "me",
            now
        ));
        assert!(lease_available(
            Some(&spec(Some("other"), Some(ago(16)), Some(15))),
            "me",
            now
        ));
        assert!(lease_available(
            Some(&spec(Some("other"), None, Some(15))),
            "me",
            now
        ));
    }

    #[tokio::test]
    async fn disabled_election_is_always_leader() {
        let registry = Registry::new();
        let health = Health::default();
        // Never contacted: no lease is used when disabled.
        let client = kube::Client::new(
            tower::service_fn(|_req: Request<kube::client::Body>| async {
                Err::<http::Response<kube::client::Body>, _>(std::io::Error::other(
                    "unexpected request",
                ))
            }),
            "default",
        );
        let handle = LeaderElection::start(
            client,
            LeaderElectionOptions {
                enabled: false,
                lease_namespace: Some("ns".into()),
                ..Default::default()
            },
            &registry,
            health.clone(),
        )
        .await
        .unwrap();
        assert!(handle.is_leader());
        tokio::time::timeout(Duration::from_secs(1), handle.wait_until_leader())
            .await
            .unwrap();
        assert!(health.liveness().is_ok());

        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(
            text.contains(r#"leader_election_master_status{name="dra-claim-controller"} 1"#),
            "{text}"
        );

        let lost = handle.lost();
        handle.release().await;
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(1), lost)
                .await
                .unwrap(),
            LeadershipLost::Released
        );
    }
}
