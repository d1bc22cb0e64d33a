//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` package does it, in a small loop of our own:
//!
//! - **Acquire / renew**: read the Lease, decide with [`may_take`] (free,
//!   ours, or not changed for a lease duration by *our* clock, so clock
//!   skew between nodes does not matter), write it with `update` guarded by
//!   its `resourceVersion` (or `create` when absent). A conflicting writer
//!   makes the write fail; nobody is overwritten.
//! - **Renew deadline**: the leader renews every retry period; if no
//!   renewal succeeded for the renew deadline, leadership is lost and the
//!   process must stop (never two leaders writing).
//! - **Standbys watch the one Lease object** (a watch with a
//!   `metadata.name` field selector, which RBAC authorizes by resource
//!   name), so a released Lease is taken within a round trip, not at the
//!   next retry period; they also re-read it every retry period, so a
//!   broken watch only costs speed.
//! - **Release**: on a clean stop the leader writes an empty holder (as
//!   client-go's `ReleaseOnCancel`), guarded by its own last write.
//!
//! Losing the lease is final for this elector, as in kube-controller-manager:
//! the process is expected to stop its controllers and exit, so no half-run
//! state carries into a later term.
//!
//! RBAC: `create` on `leases` in the lease namespace; `get`, `list`,
//! `watch` and `update` on the one Lease.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use prometheus::{IntGaugeVec, Opts, Registry};
use rand::Rng;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::runtime::http::Health;

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

impl LeaderElectionOptions {
    /// Checks client-go's constraints: lease duration > renew deadline >
    /// 1.2 × retry period > 0.
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
        Ok(())
    }
}

/// `leaseDurationSeconds` is whole seconds: rounded up, so a standby never
/// takes over before the leader's renew deadline has passed.
fn whole_seconds(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
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

/// Whether we may write ourselves into the Lease: it does not exist, has
/// no holder, is ours, or has not changed for a whole lease duration (the
/// record's, else `lease_duration`) since we first saw it as it is
/// (`unchanged_since`, our own clock). Like client-go, expiry never
/// compares another node's clock with ours.
pub fn may_take(
    spec: Option<&LeaseSpec>,
    unchanged_since: Instant,
    now: Instant,
    identity: &str,
    lease_duration: Duration,
) -> bool {
    let Some(spec) = spec else { return true };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    // The holder's own lease duration, as it wrote it (client-go does the
    // same): replicas with other flags, mid-rollout, must not cut it short.
    let valid_for = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(lease_duration, Duration::from_secs);
    holder.is_empty() || holder == identity || unchanged_since + valid_for <= now
}

/// The Lease record that makes `identity` the holder (acquiring or
/// renewing), from the record as read.
pub fn claimed_spec(
    old: Option<&LeaseSpec>,
    identity: &str,
    lease_duration: Duration,
    now: MicroTime,
) -> LeaseSpec {
    let old = old.cloned().unwrap_or_default();
    let renewing = old.holder_identity.as_deref() == Some(identity);
    let transitions = old.lease_transitions.unwrap_or(0);
    let had_holder = old
        .holder_identity
        .as_deref()
        .is_some_and(|h| !h.is_empty());
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(whole_seconds(lease_duration)),
        acquire_time: if renewing {
            old.acquire_time.clone()
        } else {
            Some(now.clone())
        },
        renew_time: Some(now),
        lease_transitions: Some(if renewing || !had_holder {
            transitions
        } else {
            transitions + 1
        }),
        ..old
    }
}

/// The record a clean stop writes: no holder (as client-go's release).
pub fn released_spec(old: &LeaseSpec, now: MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(now),
        ..old.clone()
    }
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// What identifies a version of the Lease record for expiry: a standby's
/// clock for "unchanged for a lease duration" restarts whenever it changes.
type RecordKey = (Option<String>, Option<MicroTime>, Option<i32>);

fn record_key(spec: Option<&LeaseSpec>) -> Option<RecordKey> {
    spec.map(|s| {
        (
            s.holder_identity.clone(),
            s.renew_time.clone(),
            s.lease_transitions,
        )
    })
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
                "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ),
            &["name"],
        )
        .context("defining leader_election_master_status")?;
        registry
            .register(Box::new(status.clone()))
            .context("registering leader_election_master_status")?;
        let gauge = status.with_label_values(&[self.lease_name.as_str()]);

        if !self.enabled {
            tracing::info!(lease = %self.lease_name, "leader election disabled; acting as leader");
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
        // running alongside a new leader; by then the renew deadline should
        // long have stopped it, so failing liveness means the elector itself
        // is wedged.
        health.set_max_renewal_staleness(self.lease_duration);

        let (phase, state) = watch::channel(Phase::Standby);
        let (stop_tx, stop_rx) = oneshot::channel();
        // One span for the elector: every line it logs names the lease and
        // the identity.
        let span = tracing::info_span!(
            "leader_election",
            lease = %format!("{}/{}", self.namespace, self.lease_name),
            identity = %self.identity
        );
        span.in_scope(|| {
            tracing::info!(
                lease_duration = ?self.lease_duration,
                renew_deadline = ?self.renew_deadline,
                retry_period = ?self.retry_period,
                "starting leader election"
            )
        });
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        let observed = watch::Sender::new(Observed::default());
        let watch_task = tokio::spawn(
            watch_lease(api.clone(), self.lease_name.clone(), observed.clone())
                .instrument(span.clone()),
        );
        let elector = Elector {
            api,
            cfg: self,
            observed,
            status: StatusSink {
                phase,
                gauge,
                health,
            },
        };
        let task = tokio::spawn(
            async move {
                elector.run(stop_rx).await;
                watch_task.abort();
            }
            .instrument(span),
        );
        Ok(LeaderHandle {
            state,
            control: Control::Running {
                stop: stop_tx,
                task,
            },
        })
    }
}

/// The Lease as last read or watched, and since when it has been as it is.
#[derive(Debug, Clone, Default)]
struct Observed {
    lease: Option<Lease>,
    /// `None` until the first read.
    unchanged_since: Option<Instant>,
}

/// Records a read of the Lease (`None`: it does not exist).
fn observe(observed: &watch::Sender<Observed>, lease: Option<Lease>) {
    observed.send_modify(|o| {
        let same = o.unchanged_since.is_some()
            && record_key(o.lease.as_ref().and_then(|l| l.spec.as_ref()))
                == record_key(lease.as_ref().and_then(|l| l.spec.as_ref()));
        if !same {
            o.unchanged_since = Some(Instant::now());
        }
        // The newest resourceVersion, for guarded writes, either way.
        o.lease = lease;
    });
}

/// The holder the observation names (`""` for none).
fn observed_holder(o: &Observed) -> &str {
    o.lease
        .as_ref()
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("")
}

/// Resolves at the next change of the observation (after the caller's
/// `mark_unchanged`) that satisfies `wake`; never for the state already
/// seen, so a loop around it cannot spin.
async fn next_change(changes: &mut watch::Receiver<Observed>, wake: impl Fn(&Observed) -> bool) {
    loop {
        if changes.changed().await.is_err() {
            return std::future::pending().await;
        }
        let o = changes.borrow_and_update();
        if o.unchanged_since.is_some() && wake(&o) {
            return;
        }
    }
}

/// Watches the one Lease object, so changes (above all a release) are seen
/// as they happen. Ends only when aborted.
async fn watch_lease(api: Api<Lease>, name: String, observed: watch::Sender<Observed>) {
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(50);
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                observe(&observed, Some(lease));
            }
            Ok(watcher::Event::Delete(_)) => observe(&observed, None),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(err) => tracing::debug!(error = %err, "watching the lease failed; retrying"),
        }
    }
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
    api: Api<Lease>,
    observed: watch::Sender<Observed>,
    status: StatusSink,
}

/// Why a write of the Lease did not go through.
enum WriteFailed {
    /// Someone else changed it first.
    Conflict,
    Other(kube::Error),
}

impl Elector {
    async fn run(self, mut stop: oneshot::Receiver<()>) {
        let acquired = tokio::select! {
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
            lease = self.campaign() => lease,
        };
        tracing::info!("became leader");
        self.status.leading();

        let lost = tokio::select! {
            biased;
            _ = &mut stop => None,
            reason = self.hold(acquired) => Some(reason),
        };
        match lost {
            Some(reason) => {
                tracing::warn!(%reason, "lost leadership");
                self.status.ended(reason);
            }
            None => {
                // Stop reporting leadership before giving the lease up, so
                // nothing here acts as leader once someone else can.
                self.status.ended(LeadershipLost::Released);
                self.release_if_ours().await;
            }
        }
    }

    /// Reads the Lease and records what it says.
    async fn read(&self) -> kube::Result<Option<Lease>> {
        let lease = self.api.get_opt(&self.cfg.lease_name).await?;
        observe(&self.observed, lease.clone());
        Ok(lease)
    }

    /// Writes `spec` over the Lease as read (create when absent), guarded
    /// by its resourceVersion.
    async fn write(&self, current: Option<&Lease>, spec: LeaseSpec) -> Result<Lease, WriteFailed> {
        let pp = PostParams::default();
        let result = match current {
            Some(lease) => {
                let mut next = lease.clone();
                next.spec = Some(spec);
                self.api.replace(&self.cfg.lease_name, &pp, &next).await
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.lease_name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&pp, &lease).await
            }
        };
        match result {
            Ok(lease) => {
                observe(&self.observed, Some(lease.clone()));
                Ok(lease)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Err(WriteFailed::Conflict),
            Err(err) => Err(WriteFailed::Other(err)),
        }
    }

    /// Tries to take the Lease until it is ours; returns it as written.
    /// Re-reads every retry period (jittered), and at once when the watch
    /// shows it without a holder (released by its leader).
    async fn campaign(&self) -> Lease {
        let cfg = &self.cfg;
        let mut changes = self.observed.subscribe();
        loop {
            match self.read().await {
                Ok(current) => {
                    let since = changes
                        .borrow()
                        .unchanged_since
                        .unwrap_or_else(Instant::now);
                    let spec = current.as_ref().and_then(|l| l.spec.as_ref());
                    if may_take(
                        spec,
                        since,
                        Instant::now(),
                        &cfg.identity,
                        cfg.lease_duration,
                    ) {
                        let claimed =
                            claimed_spec(spec, &cfg.identity, cfg.lease_duration, now_micro());
                        match self.write(current.as_ref(), claimed).await {
                            Ok(lease) => return lease,
                            Err(WriteFailed::Conflict) => {
                                tracing::debug!("another candidate changed the lease first")
                            }
                            Err(WriteFailed::Other(err)) => {
                                tracing::warn!(error = %err, "acquiring the lease failed; retrying")
                            }
                        }
                    } else {
                        tracing::debug!(
                            holder = spec
                                .and_then(|s| s.holder_identity.as_deref())
                                .unwrap_or(""),
                            "lease held by another candidate"
                        );
                    }
                }
                Err(err) => tracing::warn!(error = %err, "reading the lease failed; retrying"),
            }
            changes.mark_unchanged();
            tokio::select! {
                _ = tokio::time::sleep(jittered(cfg.retry_period)) => {}
                // Only a change seen after this attempt that frees the Lease
                // wakes us early: the state the attempt just failed on must
                // not (a refused create would otherwise loop at once).
                () = next_change(&mut changes, |o| observed_holder(o).is_empty()) => {}
            }
        }
    }

    /// Renews the Lease every retry period until leadership is lost.
    async fn hold(&self, mut lease: Lease) -> LeadershipLost {
        let cfg = &self.cfg;
        let health = &self.status.health;
        let mut last_renewal = Instant::now();
        let mut changes = self.observed.subscribe();
        changes.mark_unchanged();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(cfg.retry_period) => {}
                // The watch shows the Lease gone or held by another: make
                // sure with a read (a late watch event may show an older
                // state than our own write), then stop at once.
                () = next_change(&mut changes, |o| observed_holder(o) != cfg.identity) => {
                    match self.read().await {
                        Ok(Some(current)) if current
                            .spec
                            .as_ref()
                            .and_then(|s| s.holder_identity.as_deref())
                            == Some(cfg.identity.as_str()) => {
                            lease = current;
                            continue;
                        }
                        Ok(_) => return LeadershipLost::TakenOver,
                        // Cannot tell: the renewal below decides.
                        Err(err) => tracing::warn!(error = %err, "reading the lease failed"),
                    }
                }
            }
            let left = cfg.renew_deadline.saturating_sub(last_renewal.elapsed());
            // A renewal counts from when it was sent: the record says the
            // lease runs from about then, whenever the answer arrives.
            let sent = Instant::now();
            match tokio::time::timeout(left, self.renew(&lease)).await {
                Ok(Ok(renewed)) => {
                    lease = renewed;
                    last_renewal = sent;
                    health.record_renewal(last_renewal);
                    tracing::trace!("renewed the lease");
                }
                Ok(Err(Some(reason))) => return reason,
                Ok(Err(None)) | Err(_) => {}
            }
            let since_last_renewal = last_renewal.elapsed();
            if since_last_renewal >= cfg.renew_deadline {
                return LeadershipLost::RenewDeadlineExceeded { since_last_renewal };
            }
        }
    }

    /// One renewal. `Err(Some(_))`: leadership is gone; `Err(None)`: this
    /// attempt failed, the next may succeed.
    async fn renew(&self, lease: &Lease) -> Result<Lease, Option<LeadershipLost>> {
        let cfg = &self.cfg;
        let renewed = |current: &Lease| {
            claimed_spec(
                current.spec.as_ref(),
                &cfg.identity,
                cfg.lease_duration,
                now_micro(),
            )
        };
        match self.write(Some(lease), renewed(lease)).await {
            Ok(lease) => Ok(lease),
            Err(WriteFailed::Conflict) => {
                // Changed since our last write: still ours (someone touched
                // another field), or someone else's now.
                let current = self.read().await.map_err(|err| {
                    tracing::warn!(error = %err, "reading the lease after a conflict failed");
                    None
                })?;
                let ours = current
                    .as_ref()
                    .and_then(|l| l.spec.as_ref())
                    .and_then(|s| s.holder_identity.as_deref())
                    == Some(cfg.identity.as_str());
                let Some(current) = current.filter(|_| ours) else {
                    return Err(Some(LeadershipLost::TakenOver));
                };
                self.write(Some(&current), renewed(&current))
                    .await
                    .map_err(|_| None)
            }
            // Deleted under us: a standby may create it at once.
            Err(WriteFailed::Other(kube::Error::Api(s))) if s.code == 404 => {
                Err(Some(LeadershipLost::TakenOver))
            }
            Err(WriteFailed::Other(err)) => {
                tracing::warn!(error = %err, "renewing the lease failed; retrying");
                Err(None)
            }
        }
    }

    /// Gives the Lease up if it is ours, bounded by the renew deadline.
    async fn release_if_ours(&self) {
        let cfg = &self.cfg;
        let release = async {
            let Some(lease) = self.read().await? else {
                return Ok(false);
            };
            let Some(spec) = lease.spec.as_ref() else {
                return Ok(false);
            };
            if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
                return Ok(false);
            }
            match self
                .write(Some(&lease), released_spec(spec, now_micro()))
                .await
            {
                Ok(_) => Ok(true),
                Err(WriteFailed::Conflict) => Ok(false),
                Err(WriteFailed::Other(err)) => Err(err),
            }
        };
        match tokio::time::timeout(cfg.renew_deadline, release).await {
            Ok(Ok(true)) => tracing::info!("released the lease"),
            Ok(Ok(false)) => {}
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "releasing the lease failed; it will expire instead")
            }
            Err(_) => tracing::warn!("releasing the lease timed out; it will expire instead"),
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
    use http::Request;

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

    fn spec(holder: Option<&str>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            lease_transitions: Some(transitions),
            acquire_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            renew_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            ..Default::default()
        }
    }

    #[test]
    fn who_may_take_the_lease() {
        let d = Duration::from_secs(15);
        let seen = Instant::now();
        let fresh = seen + Duration::from_secs(5);
        let stale = seen + d;
        let rows = [
            ("no lease", None, fresh, true),
            ("no holder", Some(spec(None, 1)), fresh, true),
            (
                "empty holder (released)",
                Some(spec(Some(""), 1)),
                fresh,
                true,
            ),
            ("ours", Some(spec(Some("me"), 1)), fresh, true),
            (
                "held, changed 5 s ago",
                Some(spec(Some("other"), 1)),
                fresh,
                false,
            ),
            (
                "held, unchanged for a lease duration",
                Some(spec(Some("other"), 1)),
                stale,
                true,
            ),
            (
                "held with a longer lease than ours: not yet",
                Some(LeaseSpec {
                    lease_duration_seconds: Some(60),
                    ..spec(Some("other"), 1)
                }),
                stale,
                false,
            ),
        ];
        for (case, lease, now, want) in rows {
            assert_eq!(
                may_take(lease.as_ref(), seen, now, "me", d),
                want,
                "case {case}"
            );
        }
    }

    #[test]
    fn claimed_records_follow_client_go() {
        let d = Duration::from_millis(14_500);
        let now = MicroTime(Timestamp::from_second(1_000).unwrap());
        let created = claimed_spec(None, "me", d, now.clone());
        assert_eq!(created.holder_identity.as_deref(), Some("me"));
        assert_eq!(created.lease_duration_seconds, Some(15), "rounded up");
        assert_eq!(created.lease_transitions, Some(0));
        assert_eq!(created.acquire_time, Some(now.clone()));

        let taken = claimed_spec(Some(&spec(Some("other"), 3)), "me", d, now.clone());
        assert_eq!(
            taken.lease_transitions,
            Some(4),
            "a new holder is a transition"
        );
        assert_eq!(taken.acquire_time, Some(now.clone()));

        let from_released = claimed_spec(Some(&spec(None, 3)), "me", d, now.clone());
        assert_eq!(from_released.lease_transitions, Some(3));

        let renewed = claimed_spec(Some(&spec(Some("me"), 3)), "me", d, now.clone());
        assert_eq!(renewed.lease_transitions, Some(3));
        assert_eq!(
            renewed.acquire_time,
            Some(MicroTime(Timestamp::UNIX_EPOCH)),
            "kept while renewing"
        );
        assert_eq!(renewed.renew_time, Some(now.clone()));

        let released = released_spec(&renewed, now);
        assert_eq!(released.holder_identity, None);
        assert_eq!(released.lease_duration_seconds, Some(1));
        assert_eq!(released.lease_transitions, Some(3));
    }
}
