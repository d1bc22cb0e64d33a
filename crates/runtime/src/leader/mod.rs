//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` package does it, in a small loop of our own:
//!
//! - **Acquire / renew**: read the Lease, decide with [`rules::may_take`] (free,
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

//! Files: `mod.rs` (settings, the handle, what the probes are told),
//! `rules.rs` (the pure lease rules), `elector.rs` (the loop).
use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use prometheus::{IntGaugeVec, Opts, Registry};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

mod elector;
#[doc(hidden)]
pub mod fake_api;
pub mod rules;

use elector::{Elector, Observed, StatusSink, watch_lease};
use rules::RETRY_JITTER;

/// Name of the Lease object.
pub const DEFAULT_LEASE_NAME: &str = "dra-claim-controller";
/// client-go / kube-controller-manager default.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// client-go / kube-controller-manager default.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// client-go / kube-controller-manager default.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Where an in-cluster pod finds its own namespace.
pub(crate) const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// Environment variable consulted when not running with a service account.
pub(crate) const POD_NAMESPACE_ENV: &str = "POD_NAMESPACE";
/// Last-resort lease namespace, where kube-controller-manager keeps its own.
pub(crate) const FALLBACK_NAMESPACE: &str = "kube-system";

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
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            !self.lease_name.is_empty(),
            "--leader-elect-resource-name is empty"
        );
        ensure!(
            !self.retry_period.is_zero(),
            "--leader-elect-retry-period must be positive"
        );
        ensure!(
            self.lease_duration > self.renew_deadline,
            "--leader-elect-lease-duration ({:?}) must be greater than --leader-elect-renew-deadline ({:?})",
            self.lease_duration,
            self.renew_deadline
        );
        ensure!(
            self.renew_deadline.as_secs_f64()
                > self.retry_period.as_secs_f64() * (1.0 + RETRY_JITTER),
            "--leader-elect-renew-deadline ({:?}) must be greater than 1.2 × --leader-elect-retry-period ({:?})",
            self.renew_deadline,
            self.retry_period
        );
        if let Some(identity) = &self.identity {
            ensure!(!identity.is_empty(), "leader election identity is empty");
        }
        Ok(())
    }
}

/// Picks the lease namespace: explicit setting, then the pod's service
/// account namespace, then `$POD_NAMESPACE`, then `kube-system`. Blank
/// values are skipped.
pub(crate) fn resolve_namespace(
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

/// `<pod>_<uuid>`, like client-go's default identity (`hostname_<uuid>`):
/// the first part says which pod holds the lease, the random part keeps a
/// restarted pod from mistaking its predecessor's lease for its own. The
/// pod's name comes from `POD_NAME` (the chart sets it) where given: with
/// the host network every replica on a node has the node's host name.
pub(crate) fn default_identity() -> String {
    let host = hostname::get()
        .ok()
        .map(|h| h.to_string_lossy().into_owned());
    let pod = std::env::var(POD_NAME_ENV).ok();
    identity_from(
        &holder_name(pod.as_deref(), host.as_deref()),
        &random_uuid(),
    )
}

/// The environment variable naming this process's pod.
pub(crate) const POD_NAME_ENV: &str = "POD_NAME";

/// Who holds the lease, before the random part: the pod's name, else the
/// host name, else "unknown".
fn holder_name(pod: Option<&str>, host: Option<&str>) -> String {
    [pod, host]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|n| !n.is_empty())
        .unwrap_or("unknown")
        .to_owned()
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
pub(super) enum Phase {
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
    pub(super) identity: String,
    pub(super) renew_deadline: Duration,
    pub(super) retry_period: Duration,
    pub(super) lease_duration: Duration,
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
    ) -> anyhow::Result<LeaderHandle> {
        Self::resolve(&opts)?.spawn(client, registry)
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
    pub fn spawn(self, client: kube::Client, registry: &Registry) -> anyhow::Result<LeaderHandle> {
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
            let (_, lease_health) = watch::channel(LeaseHealth::standby(self.lease_duration));
            return Ok(LeaderHandle {
                state,
                lease_health,
                control: Control::Disabled(phase),
            });
        }

        gauge.set(0);
        // A leader that has not renewed for a whole lease duration may be
        // running alongside a new leader; by then the renew deadline should
        // long have stopped it, so failing liveness means the elector itself
        // is wedged.
        let (lease, lease_health) = watch::channel(LeaseHealth::standby(self.lease_duration));

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
                lease,
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
            lease_health,
            control: Control::Running {
                stop: stop_tx,
                task,
            },
        })
    }
}

/// What the liveness probe needs to know of the election, published by the
/// elector on a watch channel (see [`LeaderHandle::lease_health`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseHealth {
    /// Whether this process holds a lease it must keep renewing (false
    /// with leader election off: no lease, nothing to renew).
    pub leading: bool,
    /// The last successful renewal (becoming leader counts as one).
    pub last_renewal: Option<Instant>,
    /// How stale `last_renewal` may get before the process counts as
    /// wedged: a leader that has not renewed for a whole lease duration may
    /// be running alongside a new leader.
    pub max_staleness: Duration,
}

impl LeaseHealth {
    /// Standing by: nothing to renew.
    pub fn standby(max_staleness: Duration) -> Self {
        LeaseHealth {
            leading: false,
            last_renewal: None,
            max_staleness,
        }
    }

    /// `Ok` while renewals are on time at `now` (always, when not leading),
    /// else the reason.
    pub fn check(&self, now: Instant) -> Result<(), String> {
        if !self.leading {
            return Ok(());
        }
        let Some(last) = self.last_renewal else {
            return Err("leading without any recorded lease renewal".into());
        };
        let age = now.saturating_duration_since(last);
        if age > self.max_staleness {
            return Err(format!(
                "leader lease last renewed {:.1}s ago (limit {:.1}s)",
                age.as_secs_f64(),
                self.max_staleness.as_secs_f64()
            ));
        }
        Ok(())
    }
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
    lease_health: watch::Receiver<LeaseHealth>,
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
    /// What the liveness probe reads: whether this process holds the lease
    /// and when it last renewed it.
    pub fn lease_health(&self) -> watch::Receiver<LeaseHealth> {
        self.lease_health.clone()
    }

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
mod tests;
