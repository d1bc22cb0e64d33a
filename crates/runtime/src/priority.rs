//! Who gets the next token of the shared request budget.
//!
//! Requests on a pod's path to start (claim creation, the pod status write,
//! allocation and reservation writes, the lists and watches that feed the
//! caches) go before cleanup (releasing and deleting claims of pods that are
//! done), so a burst of finished pods never delays pods that wait to start.
//! Cleanup is not starved: a cleanup request that has waited
//! [`CLEANUP_MAX_WAIT`] goes next, whatever waits behind it. A controller
//! marks cleanup whose devices a waiting pod needs as start-up work itself.
//!
//! The class of a request is the task-local set by [`with_priority`] around
//! a sync; requests outside any scope are start-up work.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock (real time, unless a test pauses it).
use tokio::time::Instant;

use tokio::sync::oneshot;

/// A cleanup request waits at most this long behind start-up work.
pub(crate) const CLEANUP_MAX_WAIT: Duration = Duration::from_secs(1);

/// The class of a request at the client's token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    StartUp,
    Cleanup,
}

impl Priority {
    /// The `priority` label value of the wait metric.
    pub fn label(self) -> &'static str {
        match self {
            Priority::StartUp => "startup",
            Priority::Cleanup => "cleanup",
        }
    }
}

tokio::task_local! {
    static PRIORITY: Priority;
}

/// Runs `work` with its requests in class `priority`.
pub async fn with_priority<F: Future>(priority: Priority, work: F) -> F::Output {
    PRIORITY.scope(priority, work).await
}

/// The class of a request sent from the current task.
pub fn current() -> Priority {
    PRIORITY.try_with(|p| *p).unwrap_or(Priority::StartUp)
}

/// Which queue's head takes the next turn, from how long each head has
/// waited (`None`: the queue is empty).
pub(crate) fn next_turn(
    startup_waited: Option<Duration>,
    cleanup_waited: Option<Duration>,
    cleanup_max_wait: Duration,
) -> Option<Priority> {
    match (startup_waited, cleanup_waited) {
        (_, Some(w)) if w >= cleanup_max_wait => Some(Priority::Cleanup),
        (Some(_), _) => Some(Priority::StartUp),
        (None, Some(_)) => Some(Priority::Cleanup),
        (None, None) => None,
    }
}

struct Waiter {
    since: Instant,
    wake: oneshot::Sender<()>,
}

#[derive(Default)]
struct Queues {
    /// Someone holds the turn (waits at the bucket or is about to).
    busy: bool,
    startup: VecDeque<Waiter>,
    cleanup: VecDeque<Waiter>,
}

/// One holder of the turn at a time; the others queued by class, each
/// class in arrival order.
#[derive(Clone)]
pub struct Turns {
    queues: Arc<Mutex<Queues>>,
    cleanup_max_wait: Duration,
}

impl Default for Turns {
    fn default() -> Self {
        Self::new(CLEANUP_MAX_WAIT)
    }
}

impl Turns {
    /// Turns whose cleanup waits at most `cleanup_max_wait`.
    pub fn new(cleanup_max_wait: Duration) -> Self {
        Self {
            queues: Arc::default(),
            cleanup_max_wait,
        }
    }

    /// Waits for the turn of a request of class `priority`; the turn passes
    /// on when the returned guard is dropped. Cancel-safe: a waiter dropped
    /// after it was handed the turn hands it on.
    pub async fn take(&self, priority: Priority) -> Turn {
        let mut waiting = {
            let mut q = self.lock();
            if !q.busy {
                q.busy = true;
                return Turn(self.clone());
            }
            let (wake, woken) = oneshot::channel();
            let waiter = Waiter {
                since: Instant::now(),
                wake,
            };
            match priority {
                Priority::StartUp => q.startup.push_back(waiter),
                Priority::Cleanup => q.cleanup.push_back(waiter),
            }
            Waiting {
                turns: self.clone(),
                woken,
                granted: false,
            }
        };
        // The sender lives in the queue until it is used: an error here
        // cannot happen while `self` lives.
        let _ = (&mut waiting.woken).await;
        waiting.granted = true;
        Turn(self.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        // The critical sections only move queue entries: a panic inside
        // cannot leave them half-done, so a poisoned lock is still sound.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands the turn to the next waiter still there, or frees it.
    fn pass(&self) {
        let max_wait = self.cleanup_max_wait;
        let mut q = self.lock();
        loop {
            let now = Instant::now();
            let waited = |queue: &VecDeque<Waiter>| queue.front().map(|w| now - w.since);
            let next = match next_turn(waited(&q.startup), waited(&q.cleanup), max_wait) {
                Some(Priority::StartUp) => q.startup.pop_front(),
                Some(Priority::Cleanup) => q.cleanup.pop_front(),
                None => None,
            };
            let Some(waiter) = next else {
                q.busy = false;
                return;
            };
            // A waiter that gave up (its request was dropped) is skipped.
            if waiter.wake.send(()).is_ok() {
                return;
            }
        }
    }
}

/// The turn at the bucket; dropping it passes it on.
pub struct Turn(Turns);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.pass();
    }
}

/// A queued waiter; if it is dropped after it was handed the turn but
/// before it noticed, it passes the turn on.
struct Waiting {
    turns: Turns,
    woken: oneshot::Receiver<()>,
    granted: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.granted && self.woken.try_recv().is_ok() {
            self.turns.pass();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_turn_table() {
        let ms = Duration::from_millis;
        let max = ms(1000);
        let rows = [
            (None, None, None, "nobody waits"),
            (Some(ms(5)), None, Some(Priority::StartUp), "start-up alone"),
            (None, Some(ms(5)), Some(Priority::Cleanup), "cleanup alone"),
            (
                Some(ms(5)),
                Some(ms(900)),
                Some(Priority::StartUp),
                "start-up first",
            ),
            (
                Some(ms(5)),
                Some(ms(1000)),
                Some(Priority::Cleanup),
                "cleanup waited its maximum",
            ),
        ];
        for (startup, cleanup, want, case) in rows {
            assert_eq!(next_turn(startup, cleanup, max), want, "{case}");
        }
    }

    /// With the turn held, a waiter of class `first` queues, `gap` later
    /// one of class `second`; returns the order in which they got the
    /// turn once it was passed on.
    async fn order_after(
        turns: &Turns,
        first: Priority,
        gap: Duration,
        second: Priority,
    ) -> Vec<Priority> {
        let held = turns.take(Priority::StartUp).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let spawn = |p: Priority| {
            let (turns, order) = (turns.clone(), order.clone());
            tokio::spawn(async move {
                let _turn = turns.take(p).await;
                order.lock().unwrap().push(p);
            })
        };
        let a = spawn(first);
        tokio::time::sleep(gap).await;
        let b = spawn(second);
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(held);
        a.await.unwrap();
        b.await.unwrap();
        order.lock().unwrap().clone()
    }

    /// A cleanup waiter queued first, a start-up waiter after it: the
    /// start-up waiter goes first.
    #[tokio::test(start_paused = true)]
    async fn start_up_overtakes_cleanup() {
        let turns = Turns::new(Duration::from_secs(60));
        let order = order_after(
            &turns,
            Priority::Cleanup,
            Duration::from_millis(10),
            Priority::StartUp,
        )
        .await;
        assert_eq!(order, vec![Priority::StartUp, Priority::Cleanup]);
    }

    /// A cleanup waiter that waited its maximum goes before start-up.
    #[tokio::test(start_paused = true)]
    async fn cleanup_is_not_starved() {
        let turns = Turns::new(Duration::from_millis(20));
        let order = order_after(
            &turns,
            Priority::Cleanup,
            Duration::from_millis(30),
            Priority::StartUp,
        )
        .await;
        assert_eq!(order, vec![Priority::Cleanup, Priority::StartUp]);
    }

    /// A waiter dropped before its turn does not keep the turn from the
    /// next one.
    #[tokio::test(start_paused = true)]
    async fn abandoned_waiter_passes_the_turn_on() {
        let turns = Turns::new(CLEANUP_MAX_WAIT);
        let held = turns.take(Priority::StartUp).await;
        let abandoned = {
            let turns = turns.clone();
            tokio::spawn(async move {
                let _turn = turns.take(Priority::StartUp).await;
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        abandoned.abort();
        let _ = abandoned.await;
        let next = {
            let turns = turns.clone();
            tokio::spawn(async move {
                let _turn = turns.take(Priority::Cleanup).await;
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("the turn reached the waiter behind the abandoned one")
            .unwrap();
    }

    #[tokio::test]
    async fn class_comes_from_the_scope() {
        assert_eq!(current(), Priority::StartUp);
        let inside = with_priority(Priority::Cleanup, async { current() }).await;
        assert_eq!(inside, Priority::Cleanup);
    }
}
