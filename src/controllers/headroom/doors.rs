//! Headroom's front doors (our NodeScalingWatermark, the seed operator's,
//! the autoscaler's CapacityBuffer) each stand behind a CRD that may not be
//! installed yet. A missing CRD never stops the process: the door says so
//! (a Warning log line, `dra_headroom_door_served{door} 0`, a line in
//! `/readyz`) and looks again every [`DOOR_PROBE_PERIOD`], so that it opens
//! within seconds of the CRD's arrival, while the claim controller and the
//! other doors work throughout.

use std::time::Duration;

use prometheus::IntGaugeVec;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::runtime::http::Health;
use crate::runtime::informer::Informer;
use crate::runtime::optional_api::OptionalApi;
use crate::runtime::retry::Backoff;
use crate::runtime::startup::{StartupRead, describe_failure};

/// How often a closed door asks discovery whether its CRD arrived: one
/// small GET per door, and a CRD installed now is served within this.
pub(super) const DOOR_PROBE_PERIOD: Duration = Duration::from_secs(2);
/// Failed discovery tries after which a door counts as closed.
const FAILURES_BEFORE_CLOSED: u32 = 3;

/// Where a door stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DoorState {
    /// Not asked yet (or no answer yet).
    Probing,
    /// The API server serves none of the door's versions.
    Closed,
    /// Served: its watch runs.
    Open,
}

/// One front door: its API, its watch and where it stands.
#[derive(Debug)]
pub(super) struct Door {
    /// The CRD's name (`plural.group`), for logs, `/readyz` and the metric.
    pub(super) crd: &'static str,
    api: OptionalApi,
    /// What an admin does to open it.
    remedy: &'static str,
    pub(super) watch: Informer,
    state: watch::Sender<DoorState>,
}

impl Door {
    pub(super) fn new(api: OptionalApi, crd: &'static str, remedy: &'static str) -> Door {
        Door {
            crd,
            api,
            remedy,
            watch: Informer::new(crd),
            state: watch::Sender::new(DoorState::Probing),
        }
    }

    /// Waits until the API server serves the door's resource; returns the
    /// version served. Says once when it is not, and again when it opens.
    pub(super) async fn opened(
        &self,
        client: &kube::Client,
        health: &Health,
        served: &IntGaugeVec,
    ) -> String {
        let part = format!("headroom door {}", self.crd);
        let gauge = served.with_label_values(&[self.crd]);
        let mut backoff = Backoff::default();
        let mut failures = 0u32;
        loop {
            match self.api.probe(client).await {
                Ok(Some(version)) => {
                    if self.state.send_replace(DoorState::Open) == DoorState::Closed {
                        info!(crd = self.crd, version = %version, "the CRD is installed now: this headroom door is open");
                    }
                    gauge.set(1);
                    health.set_note(&part, None);
                    return version;
                }
                Ok(None) => {
                    failures = 0;
                    if self.state.send_replace(DoorState::Closed) != DoorState::Closed {
                        warn!(
                            crd = self.crd,
                            "the API server does not serve this CRD: {}; this headroom door stays closed \
                             (the claim controller and the other doors work) and opens once it is installed",
                            self.remedy
                        );
                    }
                    gauge.set(0);
                    health.set_note(
                        &part,
                        Some(format!("closed, CRD not installed: {}", self.remedy)),
                    );
                    backoff.reset();
                    tokio::time::sleep(DOOR_PROBE_PERIOD).await;
                }
                // No answer, or a refusal: asked again soon. After a few
                // tries the door counts as closed, so that it never holds
                // the process's start (the claim controller waits for the
                // doors to settle); it still opens once discovery answers.
                Err(error) => {
                    failures += 1;
                    let why = describe_failure(
                        StartupRead {
                            what: self.crd,
                            permission: "get on the non-resource URL /apis/<group>/<version> of the door's API",
                        },
                        &error,
                    );
                    if failures == FAILURES_BEFORE_CLOSED
                        && self.state.send_replace(DoorState::Closed) != DoorState::Closed
                    {
                        warn!(
                            crd = self.crd,
                            error = %why,
                            "cannot tell whether the API server serves this CRD; this headroom door \
                             stays closed until it can (the claim controller and the other doors work)"
                        );
                        gauge.set(0);
                        health.set_note(&part, Some(format!("closed, discovery failed: {why}")));
                    } else {
                        debug!(crd = self.crd, error = %why, failures, "discovery of a headroom door failed");
                    }
                    tokio::time::sleep(backoff.next_pause().min(DOOR_PROBE_PERIOD)).await;
                }
            }
        }
    }

    /// Resolves once the door is known closed, or open with its first list
    /// in: a closed door does not hold the process's start.
    pub(super) async fn wait_settled(&self) {
        let mut rx = self.state.subscribe();
        let Ok(state) = rx.wait_for(|s| *s != DoorState::Probing).await.map(|s| *s) else {
            return;
        };
        if state == DoorState::Open {
            self.watch.wait_synced().await;
        }
    }

    #[cfg(test)]
    pub(super) fn state(&self) -> DoorState {
        *self.state.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;
    use tower_test::mock;

    fn answer(status: u16, body: serde_json::Value) -> Response<Body> {
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    }

    fn not_found() -> Response<Body> {
        answer(
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                   "reason": "NotFound", "message": "the server could not find the requested resource"}),
        )
    }

    fn served(plural: &str) -> Response<Body> {
        answer(
            200,
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "autoscaling.x-k8s.io/v1beta1",
                   "resources": [{"name": plural, "singularName": "", "namespaced": true,
                                  "kind": "CapacityBuffer", "verbs": ["get", "list", "watch"]}]}),
        )
    }

    /// A CapacityBuffer door of `versions` opening against a mock API
    /// server, with the process ready.
    struct Opening {
        door: std::sync::Arc<Door>,
        handle: mock::Handle<Request<Body>, Response<Body>>,
        health: Health,
        gauge: IntGaugeVec,
        opening: tokio::task::JoinHandle<String>,
    }

    fn opening(versions: &'static [&'static str]) -> Opening {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let door = std::sync::Arc::new(Door::new(
            OptionalApi {
                group: "autoscaling.x-k8s.io",
                versions,
                plural: "capacitybuffers",
            },
            "capacitybuffers.autoscaling.x-k8s.io",
            "install the cluster-autoscaler's CapacityBuffer CRD",
        ));
        let health = Health::default();
        health.set_ready(true);
        let gauge = IntGaugeVec::new(prometheus::Opts::new("served", "h"), &["door"]).unwrap();
        let opening = tokio::spawn({
            let (door, health, gauge) = (door.clone(), health.clone(), gauge.clone());
            async move { door.opened(&client, &health, &gauge).await }
        });
        Opening {
            door,
            handle,
            health,
            gauge,
            opening,
        }
    }

    /// A door whose CRD is missing says so and does not hold the start;
    /// once the CRD is served it opens, within one probe period.
    #[tokio::test(start_paused = true)]
    async fn a_missing_crd_closes_the_door_until_it_arrives() {
        let Opening {
            door,
            mut handle,
            health,
            gauge,
            opening,
        } = opening(&["v1beta1", "v1alpha1"]);
        for path in [
            "/apis/autoscaling.x-k8s.io/v1beta1",
            "/apis/autoscaling.x-k8s.io/v1alpha1",
        ] {
            let (request, send) = handle.next_request().await.unwrap();
            assert_eq!(request.uri().path(), path);
            send.send_response(not_found());
        }
        // Closed: said in /readyz and the metric, start not held.
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(door.state(), DoorState::Closed);
        tokio::time::timeout(Duration::from_millis(1), door.wait_settled())
            .await
            .expect("a closed door does not hold the start");
        let ready = health.readiness().expect("the process stays ready");
        assert!(
            ready.contains("capacitybuffers.autoscaling.x-k8s.io: closed, CRD not installed"),
            "{ready}"
        );
        assert_eq!(
            gauge
                .with_label_values(&["capacitybuffers.autoscaling.x-k8s.io"])
                .get(),
            0
        );
        // The CRD arrives: the next probe opens the door.
        assert_eq!(request.uri().path(), "/apis/autoscaling.x-k8s.io/v1beta1");
        send.send_response(served("capacitybuffers"));
        assert_eq!(opening.await.unwrap(), "v1beta1");
        assert_eq!(door.state(), DoorState::Open);
        assert_eq!(health.readiness().as_deref(), Ok("ok"));
        assert_eq!(
            gauge
                .with_label_values(&["capacitybuffers.autoscaling.x-k8s.io"])
                .get(),
            1
        );
    }

    /// Discovery that keeps failing does not hold the start either: after
    /// a few tries the door counts as closed, and says why.
    #[tokio::test(start_paused = true)]
    async fn a_door_whose_discovery_fails_settles_closed() {
        let Opening {
            door,
            mut handle,
            health,
            ..
        } = opening(&["v1beta1"]);
        for _ in 0..FAILURES_BEFORE_CLOSED {
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(answer(
                403,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                       "message": "forbidden"}),
            ));
        }
        let _ = handle.next_request().await.unwrap();
        assert_eq!(door.state(), DoorState::Closed);
        tokio::time::timeout(Duration::from_millis(1), door.wait_settled())
            .await
            .expect("a door that cannot be discovered does not hold the start");
        let ready = health.readiness().unwrap();
        assert!(
            ready.contains("closed, discovery failed: refused (403"),
            "{ready}"
        );
    }
}
