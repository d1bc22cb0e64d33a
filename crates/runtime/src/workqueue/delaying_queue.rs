//! Adding a key after a delay (client-go's `delaying_queue.go`): one timer
//! task per queue moves keys into the queue when they are due.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::queue::WorkQueue;
use super::shared::{Inner, lock};

impl<K> WorkQueue<K>
where
    K: Clone + Eq + Hash + Send + Sync + Debug + 'static,
{
    /// Adds `key` once `delay` has passed (zero: right away). If the key is
    /// already waiting, the earlier of the two times is kept. Ignored after
    /// shutdown.
    ///
    /// A non-zero delay must be requested from within a Tokio runtime: the
    /// first one starts the queue's timer task.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        // A delay too large for the clock is as good as never.
        let Some(ready_at) = tokio::time::Instant::now().checked_add(delay) else {
            return;
        };
        let mut state = lock(&self.inner.state);
        if state.shutting_down {
            return;
        }
        state.waiting.insert(key, ready_at);
        // (Re)start the timer if it never ran or its runtime went away;
        // under the lock, so concurrent callers start only one.
        if state.timer.as_ref().is_none_or(|task| task.is_finished()) {
            state.timer = Some(tokio::spawn(run_timer(
                Arc::downgrade(&self.inner),
                Arc::clone(&self.inner.timer_wake),
            )));
        } else {
            drop(state);
            // The new key may be due before the timer's current deadline.
            self.inner.timer_wake.notify_one();
        }
    }
}

/// Moves keys whose `add_after` delay has passed into the queue. Holds only a
/// weak reference, so dropping every handle ends it; shutdown ends it too.
async fn run_timer<K>(queue: Weak<Inner<K>>, wake: Arc<Notify>)
where
    K: Clone + Eq + Hash + Send + Sync + Debug + 'static,
{
    loop {
        let next = {
            let Some(inner) = queue.upgrade() else {
                return;
            };
            let (due, next) = {
                let mut state = lock(&inner.state);
                if state.shutting_down {
                    return;
                }
                let due = state.waiting.pop_due(tokio::time::Instant::now());
                (due, state.waiting.next_ready_at())
            };
            let handle = WorkQueue { inner };
            for key in due {
                handle.add(key);
            }
            next
        };
        // `notify_one` stores a permit when nobody waits, so a wake-up sent
        // while the keys above were being added is not lost.
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}
