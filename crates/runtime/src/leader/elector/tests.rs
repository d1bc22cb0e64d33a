//! The election against an in-memory Lease endpoint
//! ([`super::super::fake_api`]): acquire, renew, a conflicting writer,
//! release, a renew deadline that passes. On tokio's paused clock: the
//! timings are the production ones and a test takes no real time; every
//! wait is for an observed state, bounded.

use std::time::Duration;

use tokio::time::Instant;

use prometheus::Registry;

use super::super::fake_api::FakeLeaseApi;
use super::super::{LeaderElection, LeaderElectionOptions, LeaderHandle, LeadershipLost};

const ME: &str = "replica-a";
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Longer than anything a test waits for when the election works.
const BOUND: Duration = Duration::from_secs(120);

fn start(api: &FakeLeaseApi) -> LeaderHandle {
    let opts = LeaderElectionOptions {
        lease_namespace: Some("dra-system".into()),
        identity: Some(ME.into()),
        lease_duration: LEASE_DURATION,
        renew_deadline: RENEW_DEADLINE,
        retry_period: RETRY_PERIOD,
        ..LeaderElectionOptions::default()
    };
    LeaderElection::resolve(&opts)
        .unwrap()
        .spawn(api.client(), &Registry::new())
        .unwrap()
}

async fn leading(handle: &LeaderHandle) {
    tokio::time::timeout(BOUND, handle.wait_until_leader())
        .await
        .expect("became leader");
}

/// Waits until `done` holds, checking every 20 ms, at most [`BOUND`].
async fn until(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < BOUND, "waited {BOUND:?} for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_absent_lease_is_created_and_held() {
    let api = FakeLeaseApi::new();
    let handle = start(&api);
    leading(&handle).await;
    assert!(handle.is_leader());
    assert_eq!(api.holder().as_deref(), Some(ME));
    assert_eq!(
        api.writes()[0].holder,
        ME,
        "the first write creates it as ours"
    );
}

#[tokio::test(start_paused = true)]
async fn the_leader_renews_every_retry_period() {
    let api = FakeLeaseApi::new();
    let handle = start(&api);
    leading(&handle).await;
    until("five renewals", || api.writes().len() >= 6).await;
    let writes = api.writes();
    let longest = writes.windows(2).map(|w| w[1].at - w[0].at).max().unwrap();
    assert!(
        longest < RENEW_DEADLINE,
        "renewals at most a jittered retry period apart, far inside the renew deadline: {longest:?}"
    );
    assert!(writes.iter().all(|w| w.holder == ME));
    assert!(handle.is_leader());
}

#[tokio::test(start_paused = true)]
async fn a_lease_another_holds_is_not_taken_while_it_is_renewed() {
    let api = FakeLeaseApi::new();
    api.take_over("replica-b", 15);
    let handle = start(&api);
    // The other holder renews; several of our polls go by.
    for _ in 0..8 {
        tokio::time::sleep(RETRY_PERIOD).await;
        api.take_over("replica-b", 15);
    }
    assert!(!handle.is_leader(), "a renewed lease is not ours to take");
    assert_eq!(api.holder().as_deref(), Some("replica-b"));
    assert!(api.writes().is_empty(), "no write was even tried over it");
}

#[tokio::test(start_paused = true)]
async fn a_lease_left_unrenewed_for_its_duration_is_taken_over() {
    let api = FakeLeaseApi::new();
    api.take_over("replica-b", 15);
    let started = Instant::now();
    let handle = start(&api);
    leading(&handle).await;
    assert!(
        started.elapsed() >= LEASE_DURATION,
        "taken only after a whole lease duration without change: {:?}",
        started.elapsed()
    );
    assert_eq!(api.holder().as_deref(), Some(ME));
}

#[tokio::test(start_paused = true)]
async fn a_lease_written_by_another_ends_leadership() {
    let api = FakeLeaseApi::new();
    let handle = start(&api);
    leading(&handle).await;
    let lost = handle.lost();
    api.take_over("replica-b", 15);
    // The next renewal meets a conflict, reads the lease and sees it gone.
    let reason = tokio::time::timeout(BOUND, lost)
        .await
        .expect("leadership ended");
    assert_eq!(reason, LeadershipLost::TakenOver);
    assert!(!handle.is_leader());
    assert_eq!(
        api.holder().as_deref(),
        Some("replica-b"),
        "the new holder's record stands: no write over it"
    );
}

#[tokio::test(start_paused = true)]
async fn release_hands_the_lease_back() {
    let api = FakeLeaseApi::new();
    let handle = start(&api);
    leading(&handle).await;
    tokio::time::timeout(BOUND, handle.release())
        .await
        .expect("released");
    assert_eq!(
        api.holder().as_deref(),
        Some(""),
        "no holder: a standby takes it at once"
    );
}

#[tokio::test(start_paused = true)]
async fn renewals_that_fail_until_the_deadline_end_leadership() {
    let api = FakeLeaseApi::new();
    let handle = start(&api);
    leading(&handle).await;
    let lost = handle.lost();
    let failing_since = Instant::now();
    api.set_failing_writes(true);
    let reason = tokio::time::timeout(BOUND, lost)
        .await
        .expect("leadership ended");
    let after = failing_since.elapsed();
    assert!(
        matches!(reason, LeadershipLost::RenewDeadlineExceeded { .. }),
        "{reason:?}"
    );
    // What matters: it stops before a standby may take over (the lease
    // duration after the last renewal), never later.
    assert!(
        after < LEASE_DURATION,
        "stopped leading before a standby may take over: {after:?}"
    );
}
