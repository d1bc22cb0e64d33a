//! Reads a process needs before it can work (the API server's version,
//! which API versions it serves, a flag's objects), made like every other
//! request: a deadline per try, retried with the shared [`Backoff`], never
//! ending the process. An API server in a brown-out, a lost answer or a
//! permission granted a minute late must not turn into a crash loop with the
//! kubelet's growing back-off, exactly when the controller is needed.
//!
//! Meanwhile `/readyz` says what start-up waits for and why (the process is
//! live, not ready), and every failed try is logged with its attempt number.

use std::future::Future;
use std::time::Duration;

use tracing::{info, warn};

use super::http::Health;
use super::retry::Backoff;

/// How long one try may take: the transport's read deadline, so that a
/// try ends here even on a client without that transport.
pub const PER_TRY_DEADLINE: Duration = Duration::from_secs(15);

/// One read of start-up, named for the log and `/readyz`.
#[derive(Debug, Clone, Copy)]
pub struct StartupRead<'a> {
    /// What is read, e.g. "the API server's version (GET /version)".
    pub what: &'a str,
    /// The permission it takes, named when the API server refuses it, e.g.
    /// "get on the non-resource URL /version".
    pub permission: &'a str,
}

/// Runs `attempt` until it succeeds: each try within `per_try`, failures
/// paused by [`Backoff`]. What counts as an answer is the attempt's to say
/// (a discovery read turns 404 into "not served"); every error it returns
/// is retried, since nothing the API server answers at start says the next
/// try fails too. Returns once answered; the caller stops waiting (a stop
/// signal, a lost lease) by dropping the future.
pub async fn read_until_answered<T, Fut>(
    read: StartupRead<'_>,
    health: &Health,
    per_try: Duration,
    mut attempt: impl FnMut() -> Fut,
) -> T
where
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut backoff = Backoff::default();
    let mut failures = 0u32;
    loop {
        let failure = match tokio::time::timeout(per_try, attempt()).await {
            Ok(Ok(value)) => {
                if failures > 0 {
                    info!(
                        what = read.what,
                        failed_tries = failures,
                        "start-up read answered"
                    );
                }
                health.set_waiting_for(None);
                return value;
            }
            Ok(Err(error)) => describe_failure(read, &error),
            Err(_) => format!("no answer within {} s", per_try.as_secs_f64()),
        };
        failures += 1;
        let pause = backoff.next_pause();
        warn!(
            what = read.what,
            attempt = failures,
            retry_in_ms = pause.as_millis() as u64,
            error = %failure,
            "start-up read failed; retrying (the process waits, not ready, instead of exiting)"
        );
        health.set_waiting_for(Some(format!("{}: {failure}", read.what)));
        tokio::time::sleep(pause).await;
    }
}

/// What a failed try says to an admin: a refusal names the permission to
/// grant, anything else the error as the client reported it.
pub fn describe_failure(read: StartupRead<'_>, error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if status.code == 403 => format!(
            "refused (403: {}): the controller's identity needs {} (the chart's ClusterRole \
             grants it; a cluster that removed system:public-info-viewer or system:discovery \
             needs it granted explicitly)",
            status.message, read.permission
        ),
        kube::Error::Api(status) if status.code == 401 => format!(
            "the API server did not accept the controller's credentials (401: {}): check the \
             service account token or the kubeconfig",
            status.message
        ),
        kube::Error::Api(status) => format!("answered {}: {}", status.code, status.message),
        other => format!("no answer: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;
    use tower_test::mock;

    type Handle = mock::Handle<Request<Body>, Response<Body>>;

    const VERSION: StartupRead<'static> = StartupRead {
        what: "the API server's version (GET /version)",
        permission: "get on the non-resource URL /version",
    };

    fn answer(status: u16, body: serde_json::Value) -> Response<Body> {
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    }

    fn status(code: u16, message: &str) -> serde_json::Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "code": code, "message": message})
    }

    fn version_body() -> serde_json::Value {
        json!({"major": "1", "minor": "37", "gitVersion": "v1.37.0", "gitCommit": "",
               "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "",
               "platform": "linux/amd64"})
    }

    /// Starts the read of `/version` against a mock; returns the task and
    /// the mock's handle.
    fn start(
        health: &Health,
    ) -> (
        tokio::task::JoinHandle<k8s_openapi::apimachinery::pkg::version::Info>,
        Handle,
    ) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let health = health.clone();
        let task = tokio::spawn(async move {
            read_until_answered(VERSION, &health, PER_TRY_DEADLINE, || {
                let client = client.clone();
                async move { client.apiserver_version().await }
            })
            .await
        });
        (task, handle)
    }

    async fn next_path(handle: &mut Handle) -> (String, mock::SendResponse<Response<Body>>) {
        let (request, send) = handle.next_request().await.expect("a request");
        (request.uri().path().to_string(), send)
    }

    #[tokio::test(start_paused = true)]
    async fn an_unavailable_answer_is_retried_until_the_version_comes() {
        let health = Health::default();
        let (task, mut handle) = start(&health);
        let (path, send) = next_path(&mut handle).await;
        assert_eq!(path, "/version");
        send.send_response(answer(503, status(503, "the server is currently unable")));
        let (path, send) = next_path(&mut handle).await;
        assert_eq!(path, "/version", "retried after the 503");
        let waiting = health.readiness().unwrap_err();
        assert!(
            waiting.contains("GET /version") && waiting.contains("503"),
            "/readyz says what start-up waits for: {waiting}"
        );
        send.send_response(answer(200, version_body()));
        let info = task.await.unwrap();
        assert_eq!(info.minor, "37");
        assert_eq!(
            health.readiness().unwrap_err(),
            "informer caches not synced yet",
            "no longer waiting for the version"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_try_without_answer_ends_at_its_deadline_and_is_retried() {
        let health = Health::default();
        let (task, mut handle) = start(&health);
        let started = tokio::time::Instant::now();
        // The first try is never answered: the deadline ends it.
        let (_, unanswered) = next_path(&mut handle).await;
        let (path, send) = next_path(&mut handle).await;
        let waited = started.elapsed();
        assert_eq!(path, "/version");
        assert!(
            waited >= PER_TRY_DEADLINE && waited < PER_TRY_DEADLINE + Duration::from_secs(1),
            "the second try follows the first's deadline and one short pause: {waited:?}"
        );
        assert!(
            health
                .readiness()
                .unwrap_err()
                .contains("no answer within 15 s")
        );
        send.send_response(answer(200, version_body()));
        assert_eq!(task.await.unwrap().minor, "37");
        drop(unanswered);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_names_the_permission_and_is_retried() {
        let health = Health::default();
        let (task, mut handle) = start(&health);
        let (_, send) = next_path(&mut handle).await;
        send.send_response(answer(
            403,
            status(
                403,
                "forbidden: User \"system:serviceaccount:dra-system:dra-claim-controller\" cannot get path \"/version\"",
            ),
        ));
        let (path, send) = next_path(&mut handle).await;
        assert_eq!(
            path, "/version",
            "a 403 is retried: the grant may come later"
        );
        let waiting = health.readiness().unwrap_err();
        assert!(
            waiting.contains("needs get on the non-resource URL /version")
                && waiting.contains("cannot get path"),
            "the refusal names the permission to grant: {waiting}"
        );
        send.send_response(answer(200, version_body()));
        assert_eq!(task.await.unwrap().minor, "37");
    }

    #[test]
    fn failures_read_as_advice() {
        let api = |code: u16| {
            kube::Error::Api(Box::new(serde_json::from_value(status(code, "m")).unwrap()))
        };
        let rows = [
            (api(403), "needs get on the non-resource URL /version"),
            (api(401), "credentials"),
            (api(503), "answered 503: m"),
            (kube::Error::Service("refused".into()), "no answer: "),
        ];
        for (error, want) in rows {
            let said = describe_failure(VERSION, &error);
            assert!(said.contains(want), "{error:?}: {said}");
        }
    }
}
