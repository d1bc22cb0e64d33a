//! One watch feeding one handler, the shape every watch of the controller
//! shares: a (re)list is buffered until complete and handed over whole,
//! single events as they come, and a flag says when the first list is in.
//!
//! Liveness is part of the shape (see [`watch_config`] and
//! [`WatchBackoff`]): a silent stream is replaced within a bound, and a
//! failed watch is retried within seconds.

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, utils::Backoff};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::warn;

/// What a watch's events do.
pub trait Handler<K>: Send + Sync {
    /// An object of a (re)list that is not complete yet: what to keep of it
    /// until the list is complete (`None`: nothing).
    fn admit(&self, obj: K) -> Option<K> {
        Some(obj)
    }
    /// A (re)list completed: `objects` are all there are.
    fn relisted(&self, objects: Vec<K>);
    /// An object was added or changed.
    fn applied(&self, obj: K);
    /// An object was deleted (its last state).
    fn deleted(&self, obj: K);
}

/// Another room's interest in a watch whose store one handler keeps. The
/// keeper calls it after each change is in its store, with the object's
/// previous state, so the observer reads current stores and still sees
/// what changed. Wired by whoever builds both rooms; neither imports the
/// other.
pub trait Observer<K>: Send + Sync {
    /// A (re)list is in the store.
    fn relisted(&self);
    /// `new` is in the store; `old` is what the store held before, if any.
    fn applied(&self, old: Option<&K>, new: &K);
    /// `last` (its last known state) is gone from the store.
    fn deleted(&self, last: &K);
}

/// One watch: its name (for logs) and whether its first list is in.
#[derive(Debug)]
pub struct Informer {
    resource: &'static str,
    synced: watch::Sender<bool>,
}

impl Informer {
    pub fn new(resource: &'static str) -> Self {
        Informer {
            resource,
            synced: watch::Sender::new(false),
        }
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Resolves once the first list has been handed over.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Watches `api` and feeds `handler` until the process ends. Watch
    /// errors are retried with [`WatchBackoff`]; a 410 Gone relists.
    pub async fn run<K>(&self, api: Api<K>, handler: &impl Handler<K>)
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
        K::DynamicType: Default,
    {
        self.run_with(api, watch_config(), handler).await
    }

    /// As [`Informer::run`], with `config` (a [`watch_config`] narrowed by
    /// a selector, say).
    pub async fn run_with<K>(&self, api: Api<K>, config: watcher::Config, handler: &impl Handler<K>)
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
        K::DynamicType: Default,
    {
        let events = watcher::watcher(api, config).backoff(WatchBackoff::default());
        let mut events = std::pin::pin!(events);
        // Only this task touches the buffer: no lock.
        let mut listing = Vec::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => listing.clear(),
                Ok(Event::InitApply(obj)) => listing.extend(handler.admit(obj)),
                Ok(Event::InitDone) => {
                    handler.relisted(std::mem::take(&mut listing));
                    self.synced.send_replace(true);
                }
                Ok(Event::Apply(obj)) => handler.applied(obj),
                Ok(Event::Delete(obj)) => handler.deleted(obj),
                Err(e) => {
                    warn!(resource = self.resource, error = %e, "watch failed; retrying with backoff")
                }
            }
        }
    }
}

/// The shortest server-side timeout of a watch request, in seconds.
const WATCH_TIMEOUT_MIN_SECS: u32 = 8;
/// Each watch draws its timeout from `MIN..=MIN + JITTER`, so the watches
/// (and the replicas) do not all re-watch at the same moment.
const WATCH_TIMEOUT_JITTER_SECS: u32 = 2;
/// How long kube-runtime waits past the server-side timeout before it
/// gives a silent stream up (its `WATCH_IDLE_TIMEOUT_MARGIN`).
const WATCH_IDLE_MARGIN_SECS: u32 = 5;
/// The longest a silent stream goes unnoticed: the bound the liveness
/// contract sets (kube-controller-manager 1.36 needs about 14 s).
pub const SILENT_STREAM_BOUND_SECS: u32 =
    WATCH_TIMEOUT_MIN_SECS + WATCH_TIMEOUT_JITTER_SECS + WATCH_IDLE_MARGIN_SECS;
const _: () = assert!(
    SILENT_STREAM_BOUND_SECS <= 15,
    "the liveness contract's bound"
);

/// The configuration of one watch.
///
/// Liveness: kube-runtime abandons a watch that delivers nothing, not even
/// a bookmark, for its server-side timeout plus 5 s, and re-watches from
/// the last resourceVersion it saw. A healthy stream always delivers or
/// ends within the timeout (the API server closes it then), so a stream
/// that stays silent longer is dead: a stalled proxy or load balancer, a
/// half-open connection (no transport signal tells: the connection stays
/// open and answers TCP and HTTP/2 pings, only the stream is silent). With
/// 8–10 s timeouts such a stream is replaced at most 15 s after its last
/// byte ([`SILENT_STREAM_BOUND_SECS`]), at the cost of one watch request
/// per watch every 8–10 s, served from the API server's watch cache
/// (kube-runtime's default, 290 s, trusted a silent stream for five
/// minutes; our earlier 40–50 s for 55 s).
pub fn watch_config() -> watcher::Config {
    use rand::Rng;
    let timeout = WATCH_TIMEOUT_MIN_SECS + rand::rng().random_range(0..=WATCH_TIMEOUT_JITTER_SECS);
    watcher::Config::default()
        // Pages keep the memory of the initial list of a big cluster bounded.
        .page_size(500)
        .timeout(timeout)
}

/// First pause before re-watching after a watch failed.
const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// Longest pause. kube-runtime's default grows to 30 s, so after an API
/// server outage the caches could stay stale for half a minute after it
/// answered again; a few watch attempts every 4 s cost next to nothing.
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(4);

/// Pauses between failed watch attempts: doubling from
/// [`WATCH_BACKOFF_MIN`] to [`WATCH_BACKOFF_MAX`] with ±20 % jitter, back to
/// the start once a watch delivers.
#[derive(Debug)]
pub struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff {
            next: WATCH_BACKOFF_MIN,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        use rand::Rng;
        let pause = self.next.mul_f64(rand::rng().random_range(0.8..1.2));
        self.next = (self.next * 2).min(WATCH_BACKOFF_MAX);
        Some(pause)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_BACKOFF_MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_timeouts_bound_the_silence() {
        for _ in 0..100 {
            let timeout = watch_config()
                .timeout
                .expect("a server-side timeout is set");
            assert!((8..=10).contains(&timeout), "{timeout}");
            assert!(timeout + WATCH_IDLE_MARGIN_SECS <= SILENT_STREAM_BOUND_SECS);
        }
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = WatchBackoff::default();
        let pauses: Vec<Duration> = (&mut b).take(8).collect();
        assert!(pauses[0] >= Duration::from_millis(200) && pauses[0] <= Duration::from_millis(300));
        assert!(pauses.iter().all(|p| *p <= WATCH_BACKOFF_MAX.mul_f64(1.2)));
        assert!(pauses[7] >= WATCH_BACKOFF_MAX.mul_f64(0.8));
        b.reset();
        assert!(b.next().unwrap() <= Duration::from_millis(300));
    }
}
