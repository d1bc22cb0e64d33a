//! Warning events on objects, as core/v1 Events (what `kubectl describe pod`
//! shows), with the same source component as kube-controller-manager's
//! controller. Events are written from within a sync, whose span names
//! the pod.
//!
//! A key retried with backoff repeats the same warning; like client-go's
//! event correlator we then bump `count` and `lastTimestamp` of the event
//! already written instead of creating a new object each time.

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
            component,
            host,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// A recorder that only logs (for tests without an API server).
    pub fn disabled() -> Self {
        EventRecorder {
            client: None,
            component: "",
            host: String::new(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// A Warning event about `involved`.
    pub async fn warn(&self, involved: &Involved<'_>, reason: &str, message: &str) {
        let Some(client) = &self.client else {
            debug!(reason, message, "event (not sent)");
            return;
        };
        let pod = involved;
        let ns = pod.namespace.to_string();
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
                namespace: Some(ns.clone()),
                uid: Some(pod.uid.into()),
                resource_version: pod.resource_version.map(str::to_string),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
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
