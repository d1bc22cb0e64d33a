//! The pure rules of the election: when we may take the Lease, the record
//! we write to take, renew or release it, and the jittered retry period.

use std::time::Duration;

// tokio's clock (real time, unless a test pauses it).
use tokio::time::Instant;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use rand::Rng;

/// client-go's `JitterFactor` for the retry period.
pub(super) const RETRY_JITTER: f64 = 0.2;

/// `leaseDurationSeconds` is whole seconds: rounded up, so a standby never
/// takes over before the leader's renew deadline has passed.
pub(super) fn whole_seconds(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// Whether we may write ourselves into the Lease: it does not exist, has
/// no holder, is ours, or has not changed for a whole lease duration (the
/// record's, else `lease_duration`) since we first saw it as it is
/// (`unchanged_since`, our own clock). Like client-go, expiry never
/// compares another node's clock with ours.
pub(crate) fn may_take(
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
pub(crate) fn claimed_spec(
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
pub(crate) fn released_spec(old: &LeaseSpec, now: MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(now),
        ..old.clone()
    }
}

pub(super) fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// What identifies a version of the Lease record for expiry: a standby's
/// clock for "unchanged for a lease duration" restarts whenever it changes.
pub(super) type RecordKey = (Option<String>, Option<MicroTime>, Option<i32>);

pub(super) fn record_key(spec: Option<&LeaseSpec>) -> Option<RecordKey> {
    spec.map(|s| {
        (
            s.holder_identity.clone(),
            s.renew_time.clone(),
            s.lease_transitions,
        )
    })
}

/// `base` plus up to 20%, so standbys do not poll in lockstep.
pub(super) fn jittered(base: Duration) -> Duration {
    base.mul_f64(1.0 + rand::rng().random_range(0.0..RETRY_JITTER))
}

/// The pause before the next renewal: a retry period after a renewal went
/// through, a short one after one failed. A renewal mostly fails because its
/// connection died (the transport drops a dead one within seconds, see
/// `runtime::transport`); the next one goes out on a fresh connection and
/// must not wait a whole retry period on top, or a leader whose connection
/// died just after a renewal loses a lease it could have kept.
pub(super) fn renew_pause(retry_period: Duration, last_failed: bool) -> Duration {
    if last_failed {
        retry_period.min(RENEW_RETRY_AFTER_FAILURE)
    } else {
        retry_period
    }
}

/// See [`renew_pause`]: long enough that a refused connection is no busy
/// loop, far below any renew deadline.
pub const RENEW_RETRY_AFTER_FAILURE: Duration = Duration::from_millis(250);

#[cfg(test)]
mod tests {
    #[test]
    fn a_failed_renewal_is_retried_soon() {
        let period = Duration::from_secs(2);
        assert_eq!(super::renew_pause(period, false), period);
        assert_eq!(super::renew_pause(period, true), Duration::from_millis(250));
        // Never longer than the retry period itself.
        let short = Duration::from_millis(100);
        assert_eq!(super::renew_pause(short, true), short);
    }

    use super::*;

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
