//! An API the process can do without (PodGroups, DeviceTaintRules, pool
//! status requests, the headroom CRDs), described once and found by one
//! discovery, whoever asks: a controller at start, a controller's watch, a
//! headroom door waiting for its CRD, or `kubectl dra`.
//!
//! Three ways to ask, by what the asker can afford:
//! - [`OptionalApi::probe`]: one try (a command, a door that asks again by
//!   itself);
//! - [`OptionalApi::discover`]: tries bounded in number, so that an API
//!   server that never answers does not keep a room from working;
//! - [`OptionalApi::discover_until_answered`]: retried until answered, for
//!   an API the process cannot start without once a flag asks for it.
//!
//! What was found is said where an admin looks ([`ApiStatus`]): a log line,
//! `dra_claim_controller_optional_api_served{api}` and, while an API is
//! missing, a line in `/readyz` (which stays ready: a missing API closes
//! its own door, never the process).

use std::time::Duration;

use prometheus::{IntGaugeVec, Opts, Registry};
use tracing::warn;

use super::http::Health;
use super::retry::Backoff;
use super::startup::{PER_TRY_DEADLINE, StartupRead, read_until_answered};

/// How many times [`OptionalApi::discover`] is usually tried before an API
/// counts as not served.
pub const DISCOVERY_TRIES: usize = 6;

/// How long one try of [`OptionalApi::discover`] usually may take.
pub const DISCOVERY_PER_TRY: Duration = Duration::from_secs(10);

/// One optional API: a resource of a group, in the versions this process
/// reads (newest first: the first served is used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalApi {
    pub group: &'static str,
    pub versions: &'static [&'static str],
    pub plural: &'static str,
}

/// What a discovery bounded in tries found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovered {
    /// Served in this version (the first of those asked).
    Served(String),
    /// Served in none of the versions asked.
    NotServed,
    /// No try was answered.
    NoAnswer,
}

impl OptionalApi {
    /// `plural.group`, the CRD's name for a custom resource: how logs,
    /// `/readyz` and metrics name the API.
    pub fn name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// One try: asks each group version in turn; `None` when none lists
    /// the resource (a 404 for a group version is that answer).
    pub async fn probe(&self, client: &kube::Client) -> Result<Option<String>, kube::Error> {
        for version in self.versions {
            match client
                .list_api_group_resources(&format!("{}/{version}", self.group))
                .await
            {
                Ok(list) if list.resources.iter().any(|r| r.name == self.plural) => {
                    return Ok(Some(version.to_string()));
                }
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Up to `tries` tries (each within `per_try`, paused by [`Backoff`]),
    /// so that one unanswered request does not leave the API unwatched,
    /// and an API server that never answers does not keep the process
    /// from working.
    pub async fn discover(
        &self,
        client: &kube::Client,
        tries: usize,
        per_try: Duration,
    ) -> Discovered {
        let mut backoff = Backoff::default();
        for attempt in 1..=tries.max(1) {
            let error = match tokio::time::timeout(per_try, self.probe(client)).await {
                Ok(Ok(Some(version))) => return Discovered::Served(version),
                Ok(Ok(None)) => return Discovered::NotServed,
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {} s", per_try.as_secs_f64()),
            };
            warn!(
                group = self.group,
                plural = self.plural,
                attempt,
                error = %error,
                "discovery failed; retrying"
            );
            if attempt < tries {
                tokio::time::sleep(backoff.next_pause()).await;
            }
        }
        Discovered::NoAnswer
    }

    /// Retried until answered, as every start-up read is (meanwhile
    /// `/readyz` says what start-up waits for); `None` when the API server
    /// serves none of the versions.
    pub async fn discover_until_answered(
        &self,
        client: &kube::Client,
        health: &Health,
    ) -> Option<String> {
        let what = format!(
            "whether the API server serves {}.{} (GET /apis/{}/...)",
            self.plural, self.group, self.group
        );
        let read = StartupRead {
            what: &what,
            permission: "get on the non-resource URLs /apis and /apis/* (system:discovery)",
        };
        read_until_answered(read, health, PER_TRY_DEADLINE, || self.probe(client)).await
    }
}

/// Where discovery's findings are shown: one gauge series and, while the
/// API is missing, one `/readyz` note per API (the asker logs what it does
/// about it). Cheap to clone.
#[derive(Clone)]
pub struct ApiStatus {
    served: IntGaugeVec,
    health: Health,
}

impl ApiStatus {
    pub fn register(registry: &Registry, health: Health) -> prometheus::Result<ApiStatus> {
        let served = IntGaugeVec::new(
            Opts::new(
                "dra_claim_controller_optional_api_served",
                "1 while the API server serves an optional API this process reads, 0 when it \
                 serves none of the versions read or discovery got no answer: the rooms that \
                 need it do without it.",
            ),
            &["api"],
        )?;
        registry.register(Box::new(served.clone()))?;
        Ok(ApiStatus { served, health })
    }

    /// Records what discovery found of `api`; `remedy` says what an admin
    /// does to serve it (logged and shown in `/readyz` while missing).
    pub fn report(&self, api: &OptionalApi, found: &Discovered, remedy: &str) {
        let name = api.name();
        let part = format!("optional API {name}");
        match found {
            Discovered::Served(_) => {
                self.served.with_label_values(&[&name]).set(1);
                self.health.set_note(&part, None);
            }
            Discovered::NotServed | Discovered::NoAnswer => {
                let why = if *found == Discovered::NotServed {
                    "not served"
                } else {
                    "discovery got no answer"
                };
                self.served.with_label_values(&[&name]).set(0);
                self.health
                    .set_note(&part, Some(format!("{why}: {remedy}")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;
    use tower_test::mock;

    const RULES: OptionalApi = OptionalApi {
        group: "resource.k8s.io",
        versions: &["v1", "v1beta2"],
        plural: "devicetaintrules",
    };

    fn answer(status: u16, body: serde_json::Value) -> Response<Body> {
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    }

    fn resources(group_version: &str, plurals: &[&str]) -> serde_json::Value {
        let resources: Vec<_> = plurals
            .iter()
            .map(|p| json!({"name": p, "singularName": "", "namespaced": false, "kind": "K", "verbs": ["get"]}))
            .collect();
        json!({"kind": "APIResourceList", "groupVersion": group_version, "resources": resources})
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_version_that_lists_the_resource_is_found() {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let found =
            tokio::spawn(async move { RULES.discover(&client, 3, DISCOVERY_PER_TRY).await });
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(request.uri().path(), "/apis/resource.k8s.io/v1");
        send.send_response(answer(
            200,
            resources("resource.k8s.io/v1", &["resourceslices"]),
        ));
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(request.uri().path(), "/apis/resource.k8s.io/v1beta2");
        send.send_response(answer(
            200,
            resources("resource.k8s.io/v1beta2", &["devicetaintrules"]),
        ));
        assert_eq!(found.await.unwrap(), Discovered::Served("v1beta2".into()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_404_for_every_version_is_not_served_and_silence_is_no_answer() {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let found = tokio::spawn({
            let client = client.clone();
            async move { RULES.discover(&client, 3, DISCOVERY_PER_TRY).await }
        });
        for _ in RULES.versions {
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(answer(404, json!({"kind": "Status", "code": 404})));
        }
        assert_eq!(found.await.unwrap(), Discovered::NotServed);

        // Three tries, none answered: the caller goes on without the API.
        let found =
            tokio::spawn(async move { RULES.discover(&client, 3, DISCOVERY_PER_TRY).await });
        let mut unanswered = Vec::new();
        for _ in 0..3 {
            unanswered.push(handle.next_request().await.unwrap());
        }
        assert_eq!(found.await.unwrap(), Discovered::NoAnswer);
    }
}
