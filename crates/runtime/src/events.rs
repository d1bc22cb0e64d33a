//! Warning events on objects, as core/v1 Events (what `kubectl describe pod`
//! shows), with the same source component as kube-controller-manager's
//! controller. Events are written from within a sync, whose span names
//! the pod.
//!
//! A key retried with backoff repeats the same warning; like client-go's
//! event correlator we then bump `count` and `lastTimestamp` of the event
//! already written instead of creating a new object each time.
//!
//! Events are best effort and must never crowd out claim work: they do not
//! draw on the client's QPS budget (see `runtime::client`) but on their
//! own, and each object has a spam budget as client-go's
//! `EventSourceObjectSpamFilter` gives it (25 events, then one per 5
//! minutes). An event over either budget is dropped and logged at debug.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tracing::{debug, warn};

/// Repeats within this window update the existing event.
const AGGREGATION_WINDOW: Duration = Duration::from_secs(600);
/// Bound on remembered events, so memory stays flat however many pods fail.
const MAX_REMEMBERED: usize = 4096;
/// Events one object may get at once (client-go's spam filter burst).
pub const OBJECT_BURST: f64 = 25.0;
/// Then one more per this interval (client-go: one per 5 minutes).
pub const OBJECT_REFILL: Duration = Duration::from_secs(300);
/// Event writes per second of one recorder, across all objects, and the
/// burst over it: the budget events have instead of the client's.
pub const WRITES_PER_SECOND: u32 = 10;
const WRITES_BURST: u32 = 100;

/// One object's spam budget: a token bucket.
#[derive(Debug, Clone, Copy)]
struct ObjectBudget {
    tokens: f64,
    at: Instant,
}

impl ObjectBudget {
    fn full(now: Instant) -> Self {
        ObjectBudget {
            tokens: OBJECT_BURST,
            at: now,
        }
    }

    /// Takes a token if there is one, after refilling for the time since
    /// the last take.
    fn take(&mut self, now: Instant) -> bool {
        let refill =
            now.saturating_duration_since(self.at).as_secs_f64() / OBJECT_REFILL.as_secs_f64();
        self.tokens = (self.tokens + refill).min(OBJECT_BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct Seen {
    event_name: String,
    count: i32,
    last: Instant,
}

/// Writes warning events; failures are logged, never fatal to a sync.
pub struct EventRecorder {
    client: Option<kube::Client>,
    /// The event source (`source.component`, `reportingComponent`).
    component: &'static str,
    host: String,
    seen: Mutex<HashMap<(String, String, String), Seen>>,
    budgets: Mutex<HashMap<String, ObjectBudget>>,
    writes: governor::DefaultDirectRateLimiter,
}

/// The object an event is about.
#[derive(Debug, Clone)]
pub struct Involved<'a> {
    pub api_version: String,
    pub kind: &'static str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub uid: &'a str,
    pub resource_version: Option<&'a str>,
}

impl EventRecorder {
    /// Events from `component` (the source every event names), written by
    /// the replica `host`.
    pub fn new(client: kube::Client, component: &'static str, host: String) -> Self {
        EventRecorder {
            client: Some(client),
            ..Self::disabled_as(component, host)
        }
    }

    /// A recorder that only logs (for tests without an API server).
    pub fn disabled() -> Self {
        Self::disabled_as("", String::new())
    }

    fn disabled_as(component: &'static str, host: String) -> Self {
        let quota = governor::Quota::per_second(
            std::num::NonZeroU32::new(WRITES_PER_SECOND).expect("non-zero"),
        )
        .allow_burst(std::num::NonZeroU32::new(WRITES_BURST).expect("non-zero"));
        EventRecorder {
            client: None,
            component,
            host,
            seen: Mutex::new(HashMap::new()),
            budgets: Mutex::new(HashMap::new()),
            writes: governor::RateLimiter::direct(quota),
        }
    }

    /// Whether an event about the object with `uid` may be written now:
    /// within the object's spam budget and the recorder's write budget.
    fn admit(&self, uid: &str) -> bool {
        let now = Instant::now();
        let mut budgets = self.budgets.lock().unwrap();
        if budgets.len() >= MAX_REMEMBERED && !budgets.contains_key(uid) {
            // Budgets back at full carry no information: forget them.
            budgets.retain(|_, b| {
                let mut probe = *b;
                probe.take(now);
                probe.tokens + 1.0 < OBJECT_BURST
            });
            if budgets.len() >= MAX_REMEMBERED {
                budgets.clear();
            }
        }
        let budget = budgets
            .entry(uid.to_owned())
            .or_insert_with(|| ObjectBudget::full(now));
        budget.take(now) && self.writes.check().is_ok()
    }

    /// A Warning event about `involved`.
    pub async fn warn(&self, involved: &Involved<'_>, reason: &str, message: &str) {
        self.record(involved, "Warning", reason, message).await
    }

    /// A Normal event about `involved` (what a controller did, as
    /// kube-controller-manager reports its evictions).
    pub async fn normal(&self, involved: &Involved<'_>, reason: &str, message: &str) {
        self.record(involved, "Normal", reason, message).await
    }

    async fn record(&self, involved: &Involved<'_>, type_: &str, reason: &str, message: &str) {
        let Some(client) = &self.client else {
            debug!(reason, message, "event (not sent)");
            return;
        };
        let pod = involved;
        if !self.admit(pod.uid) {
            debug!(reason, message, object = %pod.name, "event dropped: over the spam budget of the object or the recorder");
            return;
        }
        // A cluster-scoped object's events go to `default`, its reference
        // without a namespace (where `kubectl describe` looks for them).
        let ns = if pod.namespace.is_empty() {
            "default".to_string()
        } else {
            pod.namespace.to_string()
        };
        let api: Api<Event> = Api::namespaced(client.clone(), &ns);
        let key = (pod.uid.to_string(), reason.to_string(), message.to_string());
        let repeat = {
            let mut seen = self.seen.lock().unwrap();
            if seen.len() >= MAX_REMEMBERED {
                seen.retain(|_, s| s.last.elapsed() < AGGREGATION_WINDOW);
                if seen.len() >= MAX_REMEMBERED {
                    seen.clear();
                }
            }
            match seen.get_mut(&key) {
                Some(s) if s.last.elapsed() < AGGREGATION_WINDOW => {
                    s.count += 1;
                    s.last = Instant::now();
                    Some((s.event_name.clone(), s.count))
                }
                _ => None,
            }
        };
        let now = Time(Timestamp::now());
        if let Some((event_name, count)) = repeat {
            let body = json!({"count": count, "lastTimestamp": now});
            match api
                .patch(&event_name, &PatchParams::default(), &Patch::Merge(body))
                .await
            {
                Ok(_) => return,
                Err(e) => {
                    debug!(reason, error = %e, "updating event failed, creating a new one")
                }
            }
        }
        let event_name = format!("{}.{:x}", pod.name, now.0.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(event_name.clone()),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some(pod.api_version.clone()),
                kind: Some(pod.kind.into()),
                name: Some(pod.name.into()),
                namespace: (!pod.namespace.is_empty()).then(|| ns.clone()),
                uid: Some(pod.uid.into()),
                resource_version: pod.resource_version.map(str::to_string),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(type_.into()),
            source: Some(EventSource {
                component: Some(self.component.into()),
                host: None,
            }),
            reporting_component: Some(self.component.into()),
            reporting_instance: Some(self.host.clone()),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                self.seen.lock().unwrap().insert(
                    key,
                    Seen {
                        event_name,
                        count: 1,
                        last: Instant::now(),
                    },
                );
            }
            Err(e) => {
                warn!(reason, error = %e, "writing event failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_budget_allows_a_burst_then_one_per_refill() {
        let start = Instant::now();
        let mut budget = ObjectBudget::full(start);
        let burst = (0..100).filter(|_| budget.take(start)).count();
        assert_eq!(burst, OBJECT_BURST as usize);
        assert!(!budget.take(start + OBJECT_REFILL / 2));
        assert!(budget.take(start + OBJECT_REFILL));
        assert!(!budget.take(start + OBJECT_REFILL));
        // A long quiet refills to the burst, not beyond.
        let later = start + OBJECT_REFILL * 1000;
        let again = (0..100).filter(|_| budget.take(later)).count();
        assert_eq!(again, OBJECT_BURST as usize);
    }

    #[test]
    fn recorder_spam_filter_is_per_object() {
        let recorder = EventRecorder::disabled();
        let first = (0..40).filter(|_| recorder.admit("a")).count();
        assert_eq!(first, OBJECT_BURST as usize);
        assert!(recorder.admit("b"), "another object has its own budget");
    }
}
