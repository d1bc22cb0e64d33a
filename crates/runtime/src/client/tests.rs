use super::*;
use governor::clock::FakeRelativeClock;
use http::{Method, StatusCode};

fn ok_service() -> impl Service<
    Request<()>,
    Response = Response<()>,
    Error = tower::BoxError,
    Future = impl Send + 'static,
> + Clone
+ Send
+ 'static {
    tower::service_fn(|_req: Request<()>| async { Ok::<_, tower::BoxError>(Response::new(())) })
}

#[tokio::test]
async fn drain_refuses_requests_not_yet_sent_but_not_lease_requests() {
    // One token, then one every 100 s: the second request waits.
    let layer = ClientLayer::new(0.01, 1, ClientMetrics::new(), "h").unwrap();
    let drain = Drain::default();
    let svc = layer.with_drain(drain.clone()).layer(ok_service());
    svc.clone().oneshot(Request::new(())).await.unwrap();
    let waiting = tokio::spawn(svc.clone().oneshot(Request::new(())));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "waits for a token");
    drain.start();
    let refused = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("abandoned at once")
        .unwrap();
    let err = refused.expect_err("refused, not sent");
    assert!(err.to_string().contains("not sent"), "{err}");
    assert!(
        svc.clone().oneshot(Request::new(())).await.is_err(),
        "nothing new is sent"
    );
    let lease = Request::put("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l")
        .body(())
        .unwrap();
    assert!(
        svc.clone().oneshot(lease).await.is_ok(),
        "the lease release still goes out"
    );
}

#[test]
fn event_requests_are_recognised() {
    let rows = [
        ("/api/v1/namespaces/ns/events", true),
        ("/api/v1/namespaces/ns/events/p.1", true),
        ("/apis/events.k8s.io/v1/namespaces/ns/events", true),
        ("/api/v1/namespaces/events/pods/p", false),
        ("/api/v1/namespaces/ns/pods/events", false),
        (
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims",
            false,
        ),
    ];
    for (path, want) in rows {
        let uri: http::Uri = format!("https://h{path}").parse().unwrap();
        assert_eq!(is_event_request(&uri), want, "{path}");
    }
}

#[test]
fn user_agent_names_program_version_and_platform() {
    let ua = user_agent();
    let expected_prefix = format!("dra-claim-controller/v{} (", env!("CARGO_PKG_VERSION"));
    assert!(ua.starts_with(&expected_prefix), "{ua}");
    assert!(ua.ends_with(')') && ua.contains('/'), "{ua}");
    assert!(http::HeaderValue::from_str(&ua).is_ok());
}

#[test]
fn unlimited_for_non_positive_or_infinite_qps() {
    assert!(quota(0.0, 10).unwrap().is_none());
    assert!(quota(-1.0, 10).unwrap().is_none());
    assert!(quota(f32::INFINITY, 10).unwrap().is_none());
    assert!(quota(f32::NAN, 10).is_err());
}

#[test]
fn quota_period_and_burst() {
    let q = quota(20.0, 30).unwrap().unwrap();
    assert_eq!(q.replenish_interval(), Duration::from_millis(50));
    assert_eq!(q.burst_size().get(), 30);

    let q = quota(0.5, 0).unwrap().unwrap();
    assert_eq!(q.replenish_interval(), Duration::from_secs(2));
    assert_eq!(q.burst_size().get(), 1, "burst 0 is treated as 1");
}

#[test]
fn bucket_allows_burst_then_paces_at_qps() {
    let clock = FakeRelativeClock::default();
    let limiter = RateLimiter::direct_with_clock(quota(10.0, 3).unwrap().unwrap(), clock.clone());

    for i in 0..3 {
        assert!(limiter.check().is_ok(), "burst token {i}");
    }
    assert!(limiter.check().is_err(), "bucket empty after burst");

    clock.advance(Duration::from_millis(90));
    assert!(limiter.check().is_err(), "no token before 1/qps");
    clock.advance(Duration::from_millis(10));
    assert!(limiter.check().is_ok(), "one token per 1/qps");
    assert!(limiter.check().is_err());

    // Idle time refills up to the burst, not beyond.
    clock.advance(Duration::from_secs(10));
    for _ in 0..3 {
        assert!(limiter.check().is_ok());
    }
    assert!(limiter.check().is_err());
}

#[test]
fn fractional_qps_paces_slower_than_one_per_second() {
    let clock = FakeRelativeClock::default();
    let limiter = RateLimiter::direct_with_clock(quota(0.5, 1).unwrap().unwrap(), clock.clone());
    assert!(limiter.check().is_ok());
    clock.advance(Duration::from_millis(1900));
    assert!(limiter.check().is_err());
    clock.advance(Duration::from_millis(100));
    assert!(limiter.check().is_ok());
}

/// A request's class is the one set around the code that sends it:
/// each wait is recorded under that class.
#[tokio::test]
async fn waits_are_recorded_by_the_senders_class() {
    let metrics = ClientMetrics::new();
    let layer = ClientLayer::new(1000.0, 10, metrics.clone(), "api").unwrap();
    let svc = layer.layer(ok_service());
    svc.clone().oneshot(Request::new(())).await.unwrap();
    for _ in 0..2 {
        priority::with_priority(Priority::Cleanup, svc.clone().oneshot(Request::new(())))
            .await
            .unwrap();
    }
    assert_eq!(metrics.priority_wait(Priority::StartUp).0, 1);
    assert_eq!(metrics.priority_wait(Priority::Cleanup).0, 2);
}

#[tokio::test]
async fn layer_paces_requests_and_records_wait() {
    // 20 QPS (50ms per token), burst 3: seven requests need four refills,
    // so at least ~200ms. Only generous bounds, the machine may be busy.
    let metrics = ClientMetrics::new();
    let layer = ClientLayer::new(20.0, 3, metrics.clone(), "api:6443").unwrap();
    let svc = layer.layer(ok_service());

    let start = Instant::now();
    for _ in 0..7 {
        svc.clone().oneshot(Request::new(())).await.unwrap();
    }
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(150),
        "too fast: {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(5), "too slow: {elapsed:?}");

    let (count, waited) = metrics.rate_limiter_wait("GET", "api:6443");
    assert_eq!(count, 7);
    assert!(waited >= 0.15, "recorded wait {waited}s");
    assert_eq!(metrics.requests_total("200", "api:6443", "GET"), 7);
}

#[tokio::test]
async fn concurrent_requests_share_one_bucket() {
    let metrics = ClientMetrics::new();
    let layer = ClientLayer::new(20.0, 2, metrics.clone(), "api").unwrap();
    let svc = layer.layer(ok_service());

    let start = Instant::now();
    let calls = (0..6).map(|_| svc.clone().oneshot(Request::new(())));
    futures::future::try_join_all(calls).await.unwrap();
    // Four refills of 50ms regardless of how many callers wait at once.
    assert!(start.elapsed() >= Duration::from_millis(150));
}

/// Under a full bucket, requests get tokens in the order they asked:
/// no request waits much longer than the queue ahead of it is deep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_go_in_arrival_order() {
    let metrics = ClientMetrics::new();
    // 100 QPS, burst 1: one token every 10 ms.
    let layer = ClientLayer::new(100.0, 1, metrics, "api").unwrap();
    let svc = layer.layer(ok_service());
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (svc, order) = (svc.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            svc.oneshot(Request::new(())).await.unwrap();
            order.lock().unwrap().push(i);
        }));
        // Arrivals 1 ms apart, faster than tokens come.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        (0..20).collect::<Vec<_>>(),
        "served out of order: {order:?}"
    );
}

#[tokio::test]
async fn lease_requests_never_queue_behind_the_backlog() {
    // One token every 10 s: any request that waited would take ~10 s.
    let metrics = ClientMetrics::new();
    let layer = ClientLayer::new(0.1, 1, metrics.clone(), "api").unwrap();
    let svc = layer.layer(ok_service());
    svc.clone().oneshot(Request::new(())).await.unwrap();
    let lease = Request::put("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l")
        .body(())
        .unwrap();
    let renewal = tokio::time::timeout(Duration::from_secs(5), svc.clone().oneshot(lease)).await;
    assert!(renewal.is_ok(), "a lease renewal waited for a token");
    let pods = Request::get("/api/v1/pods").body(()).unwrap();
    let queued = tokio::time::timeout(Duration::from_millis(500), svc.clone().oneshot(pods)).await;
    assert!(
        queued.is_err(),
        "other requests must still wait for a token"
    );
    assert!(is_lease_request(
        &"/apis/coordination.k8s.io/v1/leases".parse().unwrap()
    ));
    assert!(!is_lease_request(
        &"/apis/resource.k8s.io/v1/resourceclaims".parse().unwrap()
    ));
}

#[tokio::test]
async fn unlimited_layer_does_not_wait() {
    let metrics = ClientMetrics::new();
    let layer = ClientLayer::new(0.0, 0, metrics.clone(), "api").unwrap();
    assert!(!layer.is_rate_limited());
    let svc = layer.layer(ok_service());
    for _ in 0..100 {
        svc.clone().oneshot(Request::new(())).await.unwrap();
    }
    assert_eq!(metrics.rate_limiter_wait("GET", "api").0, 0);
    assert_eq!(metrics.requests_total("200", "api", "GET"), 100);
}

#[tokio::test]
async fn metrics_label_code_method_and_host() {
    let metrics = ClientMetrics::new();
    let registry = Registry::new();
    metrics.register(&registry).unwrap();
    let layer = ClientLayer::new(0.0, 0, metrics.clone(), "10.0.0.1:6443").unwrap();

    let svc = layer.layer(tower::service_fn(|req: Request<()>| async move {
        match req.uri().path() {
            "/fail" => Err(tower::BoxError::from("connection refused")),
            "/missing" => Ok(Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(())
                .unwrap()),
            _ => Ok(Response::new(())),
        }
    }));

    let req =
        |method: Method, uri: &str| Request::builder().method(method).uri(uri).body(()).unwrap();
    svc.clone()
        .oneshot(req(Method::GET, "/missing"))
        .await
        .unwrap();
    svc.clone()
        .oneshot(req(Method::PATCH, "/ok"))
        .await
        .unwrap();
    assert!(
        svc.clone()
            .oneshot(req(Method::POST, "/fail"))
            .await
            .is_err()
    );
    // An absolute URI names its own host.
    svc.clone()
        .oneshot(req(Method::DELETE, "https://other:443/ok"))
        .await
        .unwrap();

    assert_eq!(metrics.requests_total("404", "10.0.0.1:6443", "GET"), 1);
    assert_eq!(metrics.requests_total("200", "10.0.0.1:6443", "PATCH"), 1);
    assert_eq!(
        metrics.requests_total("<error>", "10.0.0.1:6443", "POST"),
        1
    );
    assert_eq!(metrics.requests_total("200", "other:443", "DELETE"), 1);
    assert_eq!(metrics.request_duration_count("POST", "10.0.0.1:6443"), 1);

    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        text.contains(
            r#"rest_client_requests_total{code="404",host="10.0.0.1:6443",method="GET"} 1"#
        )
    );
    assert!(text.contains("rest_client_request_duration_seconds_bucket"));
    assert!(text.contains(r#"le="0.005""#) && text.contains(r#"le="60""#));
}

#[test]
fn registering_twice_fails_clearly() {
    let registry = Registry::new();
    ClientMetrics::new().register(&registry).unwrap();
    assert!(ClientMetrics::new().register(&registry).is_err());
}

#[tokio::test]
async fn missing_kubeconfig_file_is_reported() {
    let opts = ClientOptions {
        kubeconfig: Some(PathBuf::from("/nonexistent/kubeconfig")),
        ..ClientOptions::default()
    };
    let Err(err) = build_client(&opts, &Registry::new()).await else {
        panic!("expected an error for a missing kubeconfig");
    };
    assert!(
        format!("{err:#}").contains("/nonexistent/kubeconfig"),
        "{err:#}"
    );
}

#[tokio::test]
async fn builds_client_from_kubeconfig_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        r#"apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: ctx
  context: {cluster: c, user: u, namespace: ns1}
current-context: ctx
"#,
    )
    .unwrap();
    let opts = ClientOptions {
        kubeconfig: Some(path),
        ..ClientOptions::default()
    };
    let registry = Registry::new();
    let (client, _drain) = build_client(&opts, &registry).await.unwrap();
    assert_eq!(client.default_namespace(), "ns1");
    // The collectors are registered (label-less vecs show up once used).
    assert!(build_client(&opts, &registry).await.is_err());
}
