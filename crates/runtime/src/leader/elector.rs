//! The election loop: campaign, hold (renew until the deadline), release;
//! the watch of the one Lease; and what it publishes (the handle's phase,
//! the `leader_election_master_status` gauge, [`LeaseHealth`]).

// tokio's clock (real time, unless a test pauses it); the probes read
// std's, hence `into_std` where the lease health is published.
use tokio::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::sync::{oneshot, watch};

use super::rules::{
    claimed_spec, jittered, may_take, now_micro, record_key, released_spec, renew_pause,
};
use super::{LeaderElection, LeadershipLost, LeaseHealth, Phase};

/// The Lease as last read or watched, and since when it has been as it is.
#[derive(Debug, Clone, Default)]
pub(super) struct Observed {
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
pub(super) async fn watch_lease(api: Api<Lease>, name: String, observed: watch::Sender<Observed>) {
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
pub(super) struct StatusSink {
    pub(super) phase: watch::Sender<Phase>,
    pub(super) gauge: prometheus::IntGauge,
    pub(super) lease: watch::Sender<LeaseHealth>,
}

impl StatusSink {
    fn leading(&self) {
        self.lease.send_modify(|h| {
            h.leading = true;
            h.last_renewal = Some(Instant::now().into_std());
        });
        self.gauge.set(1);
        self.phase.send_replace(Phase::Leading);
    }

    fn ended(&self, reason: LeadershipLost) {
        self.gauge.set(0);
        self.lease.send_modify(|h| h.leading = false);
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

pub(super) struct Elector {
    pub(super) cfg: LeaderElection,
    pub(super) api: Api<Lease>,
    pub(super) observed: watch::Sender<Observed>,
    pub(super) status: StatusSink,
}

/// Why a write of the Lease did not go through.
enum WriteFailed {
    /// Someone else changed it first.
    Conflict,
    Other(kube::Error),
}

impl Elector {
    pub(super) async fn run(self, mut stop: oneshot::Receiver<()>) {
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
        let mut last_renewal = Instant::now();
        let mut last_failed = false;
        let mut changes = self.observed.subscribe();
        changes.mark_unchanged();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(renew_pause(cfg.retry_period, last_failed)) => {}
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
                    last_failed = false;
                    self.status
                        .lease
                        .send_modify(|h| h.last_renewal = Some(last_renewal.into_std()));
                    tracing::trace!("renewed the lease");
                }
                Ok(Err(Some(reason))) => return reason,
                Ok(Err(None)) | Err(_) => last_failed = true,
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

#[cfg(test)]
mod tests;
