//! The controller shape with a fake reconciler: what a controller built on
//! it can count on.

use std::collections::VecDeque;
use std::sync::Mutex;

use tracing::info_span;

use super::*;

/// A reconciler whose outcomes are scripted per key, recording each sync
/// with the reason it was given.
struct Fake {
    queue: Queue<&'static str, &'static str>,
    script: Mutex<HashMap<&'static str, VecDeque<Result<Action, SyncError>>>>,
    synced: Mutex<Vec<(&'static str, String)>>,
    sweeps: Mutex<Vec<Sweep>>,
    /// What each sweep queues.
    sweep_keys: Vec<&'static str>,
    /// How long one reconcile takes.
    takes: Duration,
}

impl Fake {
    fn new(sweep_keys: Vec<&'static str>) -> Arc<Fake> {
        Self::taking(sweep_keys, Duration::ZERO)
    }

    fn taking(sweep_keys: Vec<&'static str>, takes: Duration) -> Arc<Fake> {
        Arc::new(Fake {
            queue: Queue::new("fake", None),
            script: Mutex::new(HashMap::new()),
            synced: Mutex::new(Vec::new()),
            sweeps: Mutex::new(Vec::new()),
            sweep_keys,
            takes,
        })
    }

    fn script(&self, key: &'static str, outcomes: Vec<Result<Action, SyncError>>) {
        self.script.lock().unwrap().insert(key, outcomes.into());
    }

    fn synced(&self) -> Vec<(&'static str, String)> {
        self.synced.lock().unwrap().clone()
    }

    fn controller(self: &Arc<Self>) -> Controller<Fake> {
        Controller::new(
            self.clone(),
            self.queue.clone(),
            Arc::new(Reachability::new()),
        )
    }
}

impl Reconciler for Fake {
    type Key = &'static str;
    type Why = &'static str;

    fn span(&self, key: &Self::Key, why: &Wake<Self::Why>) -> Span {
        self.synced.lock().unwrap().push((key, why.to_string()));
        info_span!("fake", key)
    }

    async fn reconcile(&self, key: &Self::Key) -> Result<Action, SyncError> {
        if !self.takes.is_zero() {
            tokio::time::sleep(self.takes).await;
        }
        let next = self
            .script
            .lock()
            .unwrap()
            .get_mut(key)
            .and_then(VecDeque::pop_front);
        next.unwrap_or(Ok(Action::Done))
    }

    fn sweep(&self, sweep: Sweep) {
        self.sweeps.lock().unwrap().push(sweep);
        for key in &self.sweep_keys {
            self.queue.add_for(key, sweep.wake());
        }
    }
}

/// Lets the spawned workers run until they wait (time is paused: sleeps
/// end only when every task waits).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn nothing_is_queued_while_standing_by() {
    let fake = Fake::new(vec![]);
    let controller = fake.controller();
    fake.queue.add("a", "event before leading");
    assert!(!fake.queue.is_leading());
    assert_eq!(fake.queue.work_queue().len(), 0);
    let work = tokio::spawn(controller.lead());
    settle().await;
    assert!(fake.synced().is_empty(), "{:?}", fake.synced());
    fake.queue.add("b", "event while leading");
    settle().await;
    assert_eq!(fake.synced(), vec![("b", "event while leading".into())]);
    controller.stop_taking_work();
    work.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_takeover_sweeps_once_and_its_keys_say_so() {
    let fake = Fake::new(vec!["a", "b"]);
    let controller = fake.controller().workers(2);
    let work = tokio::spawn(controller.lead());
    settle().await;
    assert_eq!(*fake.sweeps.lock().unwrap(), vec![Sweep::Takeover]);
    let mut synced = fake.synced();
    synced.sort();
    assert_eq!(
        synced,
        vec![("a", "became leader".into()), ("b", "became leader".into())]
    );
    controller.stop_taking_work();
    work.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_recheck_comes_back_after_its_delay() {
    let fake = Fake::new(vec![]);
    fake.script("a", vec![Ok(Action::RecheckAfter(Duration::from_secs(30)))]);
    let controller = fake.controller();
    let work = tokio::spawn(controller.lead());
    fake.queue.add("a", "changed");
    settle().await;
    assert_eq!(fake.synced().len(), 1);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(fake.synced().len(), 1, "not before its delay");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        fake.synced(),
        vec![
            ("a", "changed".into()),
            ("a", "recheck after a wait".into())
        ]
    );
    controller.stop_taking_work();
    work.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failure_is_retried_with_growing_backoff_then_forgotten() {
    let fake = Fake::new(vec![]);
    let failure = || Err(SyncError::Invalid("no template".into()));
    fake.script("a", vec![failure(), failure(), failure(), Ok(Action::Done)]);
    let controller = fake.controller();
    let work = tokio::spawn(controller.lead());
    fake.queue.add("a", "changed");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let synced = fake.synced();
    assert_eq!(synced.len(), 4, "{synced:?}");
    assert!(
        synced[1..]
            .iter()
            .all(|(_, why)| why == "retry after a failure")
    );
    // Done: its failures are forgotten, and nothing comes back by itself.
    assert_eq!(fake.queue.work_queue().len(), 0);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(fake.synced().len(), 4);
    controller.stop_taking_work();
    work.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_non_retryable_failure_is_given_up() {
    let fake = Fake::new(vec![]);
    fake.script("a", vec![Err(SyncError::NonRetryable("gate off".into()))]);
    let controller = fake.controller();
    let work = tokio::spawn(controller.lead());
    fake.queue.add("a", "changed");
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(fake.synced().len(), 1);
    controller.stop_taking_work();
    work.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutting_down_finishes_the_work_in_flight_and_takes_no_more() {
    let fake = Fake::taking(vec![], Duration::from_secs(5));
    let controller = fake.controller();
    let work = tokio::spawn(controller.lead());
    fake.queue.add("a", "changed");
    fake.queue.add("b", "changed");
    settle().await;
    assert_eq!(fake.synced().len(), 1, "one worker: a in flight, b queued");
    controller.stop_taking_work();
    assert!(!fake.queue.is_leading());
    let in_flight = controller.finish_in_flight();
    let started = tokio::time::Instant::now();
    in_flight.await;
    assert!(started.elapsed() >= Duration::from_secs(4), "waited for a");
    work.await.unwrap();
    fake.queue.add("c", "after the stop");
    settle().await;
    assert_eq!(fake.synced(), vec![("a", "changed".into())]);
}

#[tokio::test(start_paused = true)]
async fn the_resync_sweeps_again_while_leading() {
    let fake = Fake::new(vec!["a"]);
    let controller = fake.controller().resync_every(Duration::from_secs(10));
    let work = tokio::spawn(controller.lead());
    // Between one and two periods per resync: at least two in 45 s.
    tokio::time::sleep(Duration::from_secs(45)).await;
    let sweeps = fake.sweeps.lock().unwrap().clone();
    assert_eq!(sweeps[0], Sweep::Takeover);
    assert!(
        (2..=4).contains(&sweeps[1..].len()) && sweeps[1..].iter().all(|s| *s == Sweep::Resync),
        "{sweeps:?}"
    );
    assert!(fake.synced().iter().any(|(_, why)| why == "resync"));
    controller.stop_taking_work();
    work.await.unwrap();
}
